"""End-to-end: `kaon serve` started with a `vllm serve` command line (docs/API.md, "vLLM
compatibility"): vLLM's spellings are accepted, ignored flags warn once, refused flags exit 2
with one error line, and $VLLM_API_KEY works like $KAON_API_KEY."""
import os
import pathlib
import subprocess
import tempfile
import time

import pytest

from conftest import MODEL, SLOW, Server, kaon_binary


class VllmServer(Server):
    """A `kaon serve` whose whole command line is given (no positional MODEL added)."""

    def __init__(self, args, env=None):
        exe = kaon_binary()
        self.tmp = tempfile.TemporaryDirectory(prefix="kaon-e2e-vllm-")
        port_file = pathlib.Path(self.tmp.name) / "port"
        self.log_path = pathlib.Path(self.tmp.name) / "server.log"
        self.log = open(self.log_path, "wb")
        full_env = {k: v for k, v in os.environ.items() if k not in ("KAON_API_KEY", "VLLM_API_KEY")}
        full_env.update(env or {})
        cmd = [str(exe), "serve"] + args + ["--port-file", str(port_file)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, env=full_env)
        deadline = time.time() + 120 * SLOW
        while True:
            self._check_alive()
            if port_file.exists() and port_file.read_text().strip():
                host, port = port_file.read_text().split()
                self.host, self.port = host, int(port)
                self.base = f"http://{host}:{port}"
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    break
            if time.time() > deadline:
                self.stop()
                pytest.fail("kaon serve did not become healthy within 120 s:\n" + self.output())
            time.sleep(0.05)

    def full_output(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")


VLLM_ARGS = [
    "--model", str(MODEL), "--served-model-name", "smol", "smol-2",
    "--max-model-len", "1k",                 # vLLM's units: 1k = 1000
    "--max_num_seqs", "8", "--max_num_batched_tokens=256",
    "--enable-prefix-caching", "--trust-remote-code", "--disable-log-requests",
    "--disable-log-stats", "--api-key", "k", "--port=0", "--host", "127.0.0.1",
    "--dtype", "auto", "-tp", "1", "--pipeline-parallel-size=1", "--swap-space", "4",
    "--seed", "0", "--enforce-eager", "--gpu_memory_utilization=0.5",
    "--kv-cache-memory-bytes", "256M", "--quantization", "gguf",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--uvicorn-log-level", "warning", "--trust_remote_code",
]


@pytest.fixture(scope="module")
def vllm_server():
    s = VllmServer(VLLM_ARGS)
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.output()


def test_vllm_command_line_serves(vllm_server):
    import openai
    client = openai.OpenAI(base_url=vllm_server.base + "/v1", api_key="k", max_retries=0, timeout=300)
    models = client.models.list().data
    assert [m.id for m in models] == ["smol", "smol-2"]  # --served-model-name smol smol-2: both served
    assert models[0].model_extra["max_model_len"] == 1000
    assert client.models.retrieve("smol-2").id == "smol-2"
    for name in ("smol", "smol-2"):
        r = client.chat.completions.create(model=name, max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Say hi"}])
        assert r.choices[0].message.content
        assert r.usage.completion_tokens <= 8
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="smol-3", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    bad = openai.OpenAI(base_url=vllm_server.base + "/v1", api_key="not-k", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_vllm_command_line_warnings(vllm_server):
    out = vllm_server.full_output()
    # Ignored flags warn once each, even when given twice (--trust-remote-code, --trust_remote_code).
    assert out.count("kaon: warning: --trust-remote-code ignored: kaon runs no model code") == 1, out
    for flag in ("--swap-space", "--seed", "--uvicorn-log-level"):
        assert out.count(f"kaon: warning: {flag} ignored") == 1, out
    assert "kaon: warning: --served-model-name" not in out, out
    # Accepted flags say nothing.
    for flag in ("--enable-auto-tool-choice", "--disable-log-requests", "--enforce-eager", "-tp",
                 "--dtype", "--quantization", "--enable-prefix-caching"):
        assert f"kaon: warning: {flag} " not in out, out
    assert "kaon: error" not in out, out


def test_vllm_env_vars(monkeypatch):
    """$VLLM_API_KEY is the key; $VLLM_LOGGING_LEVEL=WARNING quiets kaon's info lines."""
    monkeypatch.delenv("KAON_LOG", raising=False)
    s = VllmServer(["--model", str(MODEL), "--port", "0", "--max-model-len", "512",
                    "--kv-cache-memory-bytes", "64M"],
                   env={"VLLM_API_KEY": "vk", "VLLM_LOGGING_LEVEL": "WARNING"})
    try:
        assert "kaon info:" not in s.full_output()
        st, _ = s.json("GET", "/v1/models", key="wrong")
        assert st == 401
        st, body = s.json("GET", "/v1/models", key="vk")
        assert st == 200 and body["data"][0]["max_model_len"] == 512
    finally:
        s.stop()


REFUSED = [
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size", "issue 18"),
    (["-dcp", "2"], "-dcp", "issue 18"),
    (["--dtype", "float16"], "--dtype", "--dtype auto"),
    (["--quantization", "awq"], "--quantization", "gguf"),
    (["--tokenizer", "/"], "--tokenizer", "own tokenizer"),
    (["--load-format", "safetensors"], "--load-format", "auto or dummy"),
    (["--ssl-keyfile", "key.pem"], "--ssl-keyfile", "TLS"),
    (["--no-such-flag"], "--no-such-flag", "unknown option"),
    (["--max_bogus_len=3"], "--max_bogus_len=3", "unknown option"),
]


@pytest.mark.parametrize("args,flag,why", REFUSED, ids=[" ".join(a) for a, _, _ in REFUSED])
def test_refused_flags_exit_2(args, flag, why):
    exe = kaon_binary()
    env = {k: v for k, v in os.environ.items() if k != "KAON_LOG"}
    p = subprocess.run([str(exe), "serve", "--model", str(MODEL), "--port", "0"] + args,
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("kaon: error: ") and flag in lines[0] and why in lines[0], lines[0]
    assert p.stdout == ""


@pytest.mark.parametrize("args", [["-tp", "2"], ["--tensor_parallel_size=2"]])
def test_tensor_parallel_flag_reaches_the_engine(args):
    """-tp is kaon's own flag now: SmolLM2's 9 attention heads do not split over 2 ranks, which
    the model load reports (serve has started listening by then: exit 1, the reason on stderr)."""
    exe = kaon_binary()
    env = {k: v for k, v in os.environ.items() if k != "KAON_LOG"}
    p = subprocess.run([str(exe), "serve", "--model", str(MODEL), "--port", "0"] + args,
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0, p.stderr
    assert "9 attention heads do not split over 2 ranks" in p.stderr, p.stderr
