"""Plugins from Python: an installed package registers the example plugin (examples/plugin/)
under the entry point group `kaon.plugins`; LLM then loads the plugin's architecture and its
greedy ids equal `kaon generate --plugin`. Without the entry point the model does not load, and a
plugin built for another plugin API is refused with kaon's one-line reason."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, KAON, ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
PLUGIN = os.path.join(BUILD, "plugins", "kaon_example.so")
PROMPT = [5, 17, 42, 9, 100, 3]
DEVICE = os.environ.get("KAON_TEST_DEVICE", "cpu")  # cuda on the GPU machine (tests/gpu/NOTES.md)

SCRIPT = """
import json, sys
from kaon import LLM, SamplingParams
llm = LLM(sys.argv[1], max_model_len=256, kv_cache_memory_bytes=16 << 20, device=sys.argv[2])
out = llm.generate([{"prompt_token_ids": %r}], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
print(json.dumps(out[0].outputs[0].token_ids))
""" % PROMPT


@pytest.fixture(scope="module")
def plugin_model(tmp_path_factory):
    import plugin_model as pm
    cfg = pm.make_config()
    folder = tmp_path_factory.mktemp("plugin") / "model"
    pm.save(folder, cfg, pm.make_weights(cfg, seed=3), tokenizer=True)
    return str(folder)


def installed_package(tmp_path):
    """A site folder holding a package that registers the example plugin's path."""
    site = tmp_path / "site"
    (site / "kaon_demo_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "kaon_demo_plugin.py").write_text(f"PATH = {PLUGIN!r}\n")
    (site / "kaon_demo_plugin-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kaon-demo-plugin\nVersion: 0.1\n")
    (site / "kaon_demo_plugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[kaon.plugins]\nexample = kaon_demo_plugin:PATH\n")
    return str(site)


def run_python(model, site=None):
    import kaon
    paths = [os.path.dirname(os.path.dirname(kaon.__file__))] + ([site] if site else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.pop("KAON_PLUGINS", None)
    return subprocess.run([sys.executable, "-c", SCRIPT, model, DEVICE], capture_output=True, text=True,
                          timeout=300, env=env)


def test_entry_point_plugin_serves_like_the_cli(plugin_model, tmp_path):
    assert os.path.exists(PLUGIN), f"{PLUGIN} missing: build kaon first"
    r = run_python(plugin_model, installed_package(tmp_path))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"prompt_ids": PROMPT}) + "\n")
    subprocess.run([KAON, "generate", "-m", plugin_model, "--plugin", PLUGIN, "--input", str(inp),
                    "--output", str(out), "--device", DEVICE, "--temp", "0", "--max-tokens", "12", "--ignore-eos",
                    "--quiet"], check=True, capture_output=True, timeout=300)
    want = json.loads(out.read_text().splitlines()[0])["token_ids"]
    assert len(got) == 12 and got == want


def test_without_the_plugin_the_model_does_not_load(plugin_model):
    r = run_python(plugin_model)
    assert r.returncode != 0 and "KaonExampleForCausalLM" in r.stderr, r.stderr[-2000:]


def test_mismatched_plugin_refused():
    from kaon import load_plugin
    with pytest.raises(RuntimeError, match="built for plugin API 2, this kaon has 1"):
        load_plugin(os.path.join(BUILD, "plugins", "broken_version.so"))
