"""Fixtures for the end-to-end tests: a real `kaon serve` process on the default model.

The kaon binary is found through $KAON_BUILD (default <repo>/build). A missing binary or model
fails the tests with a clear message; nothing is skipped silently.
"""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("KAON_BUILD", REPO / "build"))
MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
API_KEY = "test-key-123"
MAX_MODEL_LEN = 1024
MAX_BODY = 1 << 20
# Time bounds of generation-heavy tests scale with the build: a ThreadSanitizer build (one
# thread, every access instrumented) ran ~2.7 s per 5-sequence decode step of the default model
# on a 2-core AVX2 machine; ASan roughly halves Release's speed.
SLOW = 6 if "tsan" in BUILD.name else 2 if "asan" in BUILD.name else 1


# What the sanitizers print when they find something (UBSan: "runtime error:").
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                     "runtime error:")


def kaon_binary():
    exe = BUILD / "kaon"
    if not exe.exists():
        pytest.fail(f"kaon binary not found at {exe}: build it (ninja -C {BUILD} kaon) or set KAON_BUILD")
    if not MODEL.exists():
        pytest.fail(f"default model missing at {MODEL}: run scripts/setup.sh")
    return exe


class Server:
    """A running `kaon serve` (of model: the default one unless given); base is http://host:port."""

    def __init__(self, args, env=None, preexec_fn=None, model=MODEL, launcher=()):
        exe = kaon_binary()
        self.tmp = tempfile.TemporaryDirectory(prefix="kaon-e2e-")
        port_file = pathlib.Path(self.tmp.name) / "port"
        self.log_path = pathlib.Path(self.tmp.name) / "server.log"
        self.log = open(self.log_path, "wb")
        # launcher: a prefix such as mpirun's (a multi-node job: tests/e2e/test_multinode.py)
        cmd = list(launcher) + [str(exe), "serve", str(model), "--port", "0", "--port-file", str(port_file)] + args
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)
        deadline = time.time() + 120
        while not port_file.exists() or not port_file.read_text().strip():
            self._check_alive()
            if time.time() > deadline:
                self.stop()
                pytest.fail("kaon serve did not start listening within 120 s:\n" + self.output())
            time.sleep(0.05)
        host, port = port_file.read_text().split()
        self.host, self.port = host, int(port)
        self.base = f"http://{host}:{port}"
        self.saw_loading = False
        while True:
            self._check_alive()
            status, _, _ = self.request("GET", "/health")
            if status == 200:
                break
            if status == 503:
                self.saw_loading = True
            if time.time() > deadline:
                self.stop()
                pytest.fail("kaon serve did not become healthy within 120 s:\n" + self.output())
            time.sleep(0.05)

    def _check_alive(self):
        if self.proc.poll() is not None:
            pytest.fail(f"kaon serve exited with status {self.proc.returncode}:\n" + self.output())

    def output(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def request(self, method, path, body=None, headers=None, timeout=120):
        """Returns (status, headers, body bytes); never raises for HTTP errors."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=headers or {})
        if data is not None and "Content-Type" not in (headers or {}):
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()
        except (ConnectionError, urllib.error.URLError) as e:
            return 0, {}, str(e).encode()

    def json(self, method, path, body=None, key=API_KEY, **kw):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, _, data = self.request(method, path, body, headers=headers, **kw)
        return status, (json.loads(data) if data else None)

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        assert status == 200, data
        return data.decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        self.check_sanitizers()

    def check_sanitizers(self):
        """Under an ASan/UBSan/TSan build (KAON_BUILD=build-asan, build-tsan) any report in the
        server's output fails the test, even one that did not change its exit status."""
        text = self.log_path.read_text(errors="replace")
        for marker in SANITIZER_MARKERS:
            at = text.find(marker)
            if at >= 0:
                pytest.fail(f"kaon serve reported '{marker}':\n" + text[max(0, at - 200):at + 6000])


@pytest.fixture(scope="session")
def server():
    s = Server(["--api-key", API_KEY, "--max-model-len", str(MAX_MODEL_LEN),
                "--kv-cache-memory", "256M", "--max-body-size", str(MAX_BODY),
                "--served-model-name", "smol"])
    yield s
    s.stop()
    assert s.proc.returncode == 0, "kaon serve did not exit cleanly on SIGTERM:\n" + s.output()


@pytest.fixture(scope="session")
def client(server):
    try:
        import openai
    except ImportError:
        pytest.fail("the openai package is missing: pip install -r scripts/requirements-test.txt")
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
