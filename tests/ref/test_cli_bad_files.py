"""`kaon info` and `kaon run` on each class of bad model file: exit status 2 and one clear
error line naming the file, never a crash or a hang."""
import subprocess

import pytest

from make_bad_files import make_bad_files, write_tiny_llama_gguf


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    return make_bad_files(tmp_path_factory.mktemp("bad"))


EXPECTED_WORDS = {
    "truncated_gguf": "",
    "wrong_magic": "magic",
    "absurd_tensor_count": "",
    "tensor_outside_file": "outside",
    "wrong_dtype": "type",
    "missing_tensor": "missing tensor",
    "hf_no_config": "config.json",
    "hf_bad_safetensors": "",
}


@pytest.mark.parametrize("cmd", [["info"], ["run", "--prompt-ids", "1,2", "-n", "1"]])
def test_bad_files_exit_2_with_one_line(kaon_bin, bad_files, cmd):
    assert set(bad_files) == set(EXPECTED_WORDS)
    for name, path in bad_files.items():
        args = [str(kaon_bin), *cmd[:1], "-m", str(path), *cmd[1:]] if cmd[0] == "run" else [str(kaon_bin), "info", str(path)]
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("kaon: error: "), (name, r.stderr)
        assert str(path) in lines[0] or path.name in lines[0], (name, lines[0])
        assert EXPECTED_WORDS[name] in lines[0].lower(), (name, lines[0])
        # (kaon info still lists the tensor types of a GGUF file whose metadata it can read)
        assert r.stdout == "" or (cmd[0] == "info" and "\ntensor types:" in r.stdout), (name, r.stdout)


def test_unknown_architecture_is_named(kaon_bin, tmp_path):
    import json
    from tiny_models import make_config, make_weights, save_hf
    cfg = make_config("llama")
    d = save_hf(tmp_path / "m", cfg, make_weights(cfg))
    cfg["architectures"] = ["FancyNewForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([str(kaon_bin), "info", str(d)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "FancyNewForCausalLM" in r.stderr


def test_good_tiny_gguf_loads(kaon_bin, tmp_path):
    p = write_tiny_llama_gguf(tmp_path / "ok.gguf")
    r = subprocess.run([str(kaon_bin), "info", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "llama" in r.stdout
