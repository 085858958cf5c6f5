"""The example plugin (examples/plugin/) against a numpy reference of its architecture:
`kaon logits --plugin build/plugins/kaon_example.so` on a tiny random KaonExampleForCausalLM
checkpoint; and without the plugin, kaon does not know the architecture."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plugin_model import make_config, make_weights, plugin_path, reference_logits, save

IDS = [2, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13]


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def logits_with_plugin(kaon_bin, model, tmp_path, decode=False, how="flag"):
    """kaon logits of IDS with the plugin loaded by --plugin (flag) or $KAON_PLUGINS (env)."""
    so = plugin_path(kaon_bin.parent)
    out = tmp_path / f"logits-{int(decode)}.f32"
    cmd = [str(kaon_bin), "logits", "-m", str(model), "--prompt-ids", ",".join(map(str, IDS)),
           "-o", str(out), "--threads", "2"] + (["--decode"] if decode else [])
    env = dict(os.environ)
    if how == "flag":
        cmd[2:2] = ["--plugin", str(so)]
    else:
        env["KAON_PLUGINS"] = f":{so}:"  # empty entries are skipped
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    a = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return a.reshape(len(IDS), -1)


@pytest.mark.parametrize("knobs", [dict(), dict(embedding_multiplier=1.0, residual_multiplier=1.0, softcap=None)],
                         ids=["variant", "plain-llama"])
def test_example_plugin_matches_reference(kaon_bin, tmp_path, knobs):
    cfg = make_config(**knobs)
    w = make_weights(cfg, seed=7)
    model = save(tmp_path / "example", cfg, w)
    ref = reference_logits(cfg, w, IDS)
    ours = logits_with_plugin(kaon_bin, model, tmp_path)
    err = rel_err(ours, ref)
    print(f"KaonExampleForCausalLM {knobs or 'variant'}: relative logit error {err:.2e}")
    assert err < 1e-4
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    dec = logits_with_plugin(kaon_bin, model, tmp_path, decode=True, how="env")
    assert rel_err(dec, ref) < 1e-4


def test_the_knobs_matter(kaon_bin, tmp_path):
    """The reference tells the variant from plain Llama: the bound above could fail."""
    cfg = make_config()
    w = make_weights(cfg, seed=7)
    plain = reference_logits(make_config(1.0, 1.0, None), w, IDS)
    assert rel_err(reference_logits(cfg, w, IDS), plain) > 0.1
    if cfg.get("final_logit_softcapping"):
        ours = logits_with_plugin(kaon_bin, save(tmp_path / "example", cfg, w), tmp_path)
        assert np.abs(ours).max() <= cfg["final_logit_softcapping"] + 1e-5


def test_without_the_plugin_the_architecture_is_unknown(kaon_bin, tmp_path):
    cfg = make_config()
    model = save(tmp_path / "example", cfg, make_weights(cfg))
    r = subprocess.run([str(kaon_bin), "logits", "-m", str(model), "--prompt-ids", "1,2", "-o", str(tmp_path / "x.f32")],
                       capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "KAON_PLUGINS"})
    assert r.returncode != 0
    assert "unsupported architecture 'KaonExampleForCausalLM'" in r.stderr


def test_info_names_the_plugin_architecture(kaon_bin, tmp_path):
    cfg = make_config()
    model = save(tmp_path / "example", cfg, make_weights(cfg))
    r = subprocess.run([str(kaon_bin), "info", str(model), f"--plugin={plugin_path(kaon_bin.parent)}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "KaonExampleForCausalLM (kaon-example, a plugin)" in r.stdout


def test_example_plugin_links_against_nothing_of_kaon(kaon_bin):
    """The plugin reaches kaon only through the host table: no undefined kaon_ symbols."""
    r = subprocess.run(["nm", "-D", "--undefined-only", str(plugin_path(kaon_bin.parent))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not [line for line in r.stdout.splitlines() if "kaon" in line], r.stdout
    r = subprocess.run(["nm", "-D", "--defined-only", str(plugin_path(kaon_bin.parent))],
                       capture_output=True, text=True, timeout=60)
    exported = [line.split()[-1] for line in r.stdout.splitlines() if " T " in line]
    assert exported == ["kaon_plugin_entry"], r.stdout


def test_python_entry_point_names_the_plugin(kaon_bin, tmp_path):
    """A Python package registers the plugin under the entry point group kaon.plugins;
    scripts/kaon_plugins.py turns the installed ones into $KAON_PLUGINS, which kaon loads."""
    site = tmp_path / "site"
    (site / "example_kaon_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "example_kaon_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: example-kaon-plugin\nVersion: 0.1\n")
    (site / "example_kaon_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[kaon.plugins]\nkaon_example = example_kaon_plugin:so_path\n")
    (site / "example_kaon_plugin.py").write_text(
        f"def so_path():\n    return {str(plugin_path(kaon_bin.parent))!r}\n")
    script = Path(__file__).resolve().parents[2] / "scripts" / "kaon_plugins.py"
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(plugin_path(kaon_bin.parent))
    cfg = make_config()
    model = save(tmp_path / "example", cfg, make_weights(cfg))
    env["KAON_PLUGINS"] = r.stdout.strip()
    r = subprocess.run([str(kaon_bin), "info", str(model)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "KaonExampleForCausalLM (kaon-example, a plugin)" in r.stdout, r.stderr
