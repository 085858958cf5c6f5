"""End-to-end: `kaon serve --plugin build/plugins/kaon_example.so` serves a model of the plugin's
architecture (a tiny random KaonExampleForCausalLM checkpoint with the tiny tokenizer) through
the official openai client; plugins built for another API version, or not plugins at all, stop
kaon at start with exit status 2 and one error line."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BUILD, Server, kaon_binary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ref"))
from plugin_model import make_config, make_weights, plugin_path, save  # noqa: E402

KEY = "plugin-key"


@pytest.fixture(scope="module")
def example_model(tmp_path_factory):
    cfg = make_config()
    return save(tmp_path_factory.mktemp("plugin") / "example", cfg, make_weights(cfg, seed=3), tokenizer=True)


@pytest.fixture(scope="module")
def example_server(example_model):
    s = Server(["--plugin", str(plugin_path(BUILD)), "--api-key", KEY, "--served-model-name", "example",
                "--max-model-len", "256", "--kv-cache-memory", "32M"], model=example_model)
    yield s
    s.stop()
    assert s.proc.returncode == 0, "kaon serve did not exit cleanly on SIGTERM:\n" + s.output()


def test_serves_chat_completions_with_the_openai_client(example_server):
    import openai
    client = openai.OpenAI(base_url=example_server.base + "/v1", api_key=KEY, max_retries=0, timeout=300)
    r = client.chat.completions.create(model="example", messages=[{"role": "user", "content": "the cat"}],
                                       max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert r.model == "example"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert isinstance(r.choices[0].message.content, str)
    # Greedy is deterministic: the same request gives the same text.
    again = client.chat.completions.create(model="example", messages=[{"role": "user", "content": "the cat"}],
                                           max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert again.choices[0].message.content == r.choices[0].message.content
    names = [m.id for m in client.models.list().data]
    assert "example" in names


def start_and_fail(args, env=None):
    """Runs kaon with args (the serve command line) and returns the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if k != "KAON_PLUGINS"}
    full_env.update(env or {})
    return subprocess.run([str(kaon_binary())] + args, capture_output=True, text=True, timeout=120, env=full_env)


def test_mismatched_plugin_refused_with_one_line(example_model):
    bad = plugin_path(BUILD, "broken_version")
    r = start_and_fail(["serve", str(example_model), "--port", "0", "--plugin", str(bad)])
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"kaon: error: plugin {bad}: built for plugin API 2, this kaon has 1 (rebuild the plugin against this kaon)"]
    # The same through $KAON_PLUGINS, for another command.
    r = start_and_fail(["run", "-m", str(example_model), "-p", "hi"], env={"KAON_PLUGINS": str(bad)})
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "built for plugin API 2, this kaon has 1" in r.stderr


@pytest.mark.parametrize("name,why", [("broken_magic", "bad magic"), ("broken_no_entry", "no kaon_plugin_entry symbol"),
                                      ("missing", "no such file"),
                                      ("broken_dup_builtin", "'LlamaForCausalLM' is already registered (by 'llama')")])
def test_other_refusals_one_line(example_model, name, why):
    r = start_and_fail(["serve", str(example_model), "--port", "0", f"--plugin={plugin_path(BUILD, name)}"])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kaon: error: plugin ") and why in lines[0], r.stderr


def test_plugin_flag_needs_a_value():
    r = start_and_fail(["info", "--plugin"])
    assert r.returncode == 2 and r.stderr.splitlines() == ["kaon: error: --plugin needs a path to a plugin (.so)"]
