"""Graceful shutdown of `kaon serve` on SIGTERM / SIGINT: it stops taking work (/health and new
requests answer 503), lets running requests finish within --drain-timeout, then aborts the rest
so that each client still gets a complete response (finish_reason "abort", then [DONE]), and
exits 0 promptly."""
import json
import signal
import socket
import threading
import time

import openai
import pytest

from conftest import SLOW, Server


def metric(server, name):
    for line in server.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_running(server, n, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (metric(server, "kaon:num_requests_running") or 0) >= n:
            return
        time.sleep(0.05)
    pytest.fail(f"{n} requests did not start running:\n" + server.output())


def wait_health(server, want, timeout=30):
    deadline = time.time() + timeout
    status = None
    while time.time() < deadline:
        status, headers, _ = server.request("GET", "/health", timeout=5)
        if status == want:
            return headers
        time.sleep(0.02)
    pytest.fail(f"/health answered {status}, not {want}")


class Streams:
    """n streaming completions in threads, with the official client; each records its text,
    finish reasons, whether the stream ended properly ([DONE]) and any exception."""

    def __init__(self, server, n, max_tokens, chat=False):
        self.results = [None] * n
        self.threads = []
        for i in range(n):
            t = threading.Thread(target=self._run, args=(server, i, max_tokens, chat), daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, server, i, max_tokens, chat):
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
        res = {"text": "", "finish": [], "error": None}
        try:
            if chat:
                it = client.chat.completions.create(
                    model="smol", messages=[{"role": "user", "content": f"Story number {i}, please."}],
                    max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True})
                for ch in it:
                    for c in ch.choices:
                        res["text"] += c.delta.content or ""
                        if c.finish_reason:
                            res["finish"].append(c.finish_reason)
            else:
                it = client.completions.create(model="smol", prompt=f"Story number {i}:",
                                               max_tokens=max_tokens, stream=True,
                                               extra_body={"ignore_eos": True})
                for ch in it:
                    for c in ch.choices:
                        res["text"] += c.text
                        if c.finish_reason:
                            res["finish"].append(c.finish_reason)
        except Exception as e:  # noqa: BLE001 - recorded and asserted on by the test
            res["error"] = repr(e)
        self.results[i] = res

    def join(self, timeout):
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "a stream did not end"
        return self.results


def raw_stream(server, max_tokens):
    """A streaming request over a raw socket: returns the socket (the caller reads it)."""
    body = json.dumps({"model": "smol", "prompt": "Once upon a time", "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection((server.host, server.port), timeout=120)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def read_to_close(s):
    data = b""
    while True:
        got = s.recv(65536)
        if not got:
            return data
        data += got


def test_drain_completes_running_streams():
    """SIGTERM: /health and new requests get 503, running streams and a running non-streaming
    request still finish normally, and the process exits 0."""
    s = Server(["--served-model-name", "smol", "--max-model-len", "512", "--kv-cache-memory", "64M",
                "--drain-timeout", str(120 * SLOW)])
    # Sanitizer builds take seconds per step: fewer tokens there, still running at the SIGTERM.
    n_tok = 40 if SLOW == 1 else 12
    try:
        streams = Streams(s, 3, max_tokens=n_tok)
        chat_streams = Streams(s, 1, max_tokens=n_tok * 3 // 4, chat=True)
        nonstream = {}

        def run_nonstream():
            c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=300)
            r = c.completions.create(model="smol", prompt="Hello", max_tokens=n_tok,
                                     extra_body={"ignore_eos": True})
            nonstream["finish"] = r.choices[0].finish_reason
            nonstream["tokens"] = r.usage.completion_tokens

        t = threading.Thread(target=run_nonstream, daemon=True)
        t.start()
        wait_running(s, 5)
        s.proc.send_signal(signal.SIGTERM)
        headers = wait_health(s, 503)
        assert headers.get("Retry-After") == "1"
        status, hdrs, data = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 503 and json.loads(data)["error"]["type"] == "service_unavailable"
        assert hdrs.get("Connection", "").lower() == "close"
        for res in streams.join(120 * SLOW) + chat_streams.join(120 * SLOW):
            assert res["error"] is None, res
            assert res["finish"] == ["length"] and res["text"], res
        t.join(120 * SLOW)
        assert nonstream == {"finish": "length", "tokens": n_tok}
        assert s.proc.wait(timeout=60) == 0
        log = s.output()
        assert "shutting down" in log and "drain timeout" not in log
    finally:
        s.stop()


def test_drain_timeout_aborts_cleanly():
    """Requests longer than --drain-timeout are aborted: each client still gets a whole response
    (a final chunk with finish_reason "abort" and [DONE]; 200 with "abort" when not streaming),
    and the process exits 0 soon after the timeout."""
    drain = 1.0
    s = Server(["--served-model-name", "smol", "--max-model-len", "2048", "--kv-cache-memory", "128M",
                "--drain-timeout", str(drain)])
    try:
        streams = Streams(s, 3, max_tokens=2000)
        raw = raw_stream(s, 2000)
        nonstream = {}

        def run_nonstream():
            c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=300)
            try:
                r = c.completions.create(model="smol", prompt="Hello", max_tokens=2000,
                                         extra_body={"ignore_eos": True})
                nonstream["finish"] = r.choices[0].finish_reason
                nonstream["tokens"] = r.usage.completion_tokens
            except Exception as e:  # noqa: BLE001
                nonstream["error"] = repr(e)

        t = threading.Thread(target=run_nonstream, daemon=True)
        t.start()
        wait_running(s, 5)
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        rc = s.proc.wait(timeout=60)
        dt = time.time() - t0
        assert rc == 0, s.output()
        assert dt < drain + 8, f"took {dt:.1f} s to exit"
        for res in streams.join(30):
            assert res["error"] is None, res
            assert res["finish"] == ["abort"], res
        t.join(30)
        assert nonstream.get("finish") == "abort" and 0 < nonstream["tokens"] < 2000, nonstream
        # On the wire: a complete chunked response, ending with the abort chunk and [DONE].
        data = read_to_close(raw)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"0\r\n\r\n"), data[-200:]
        assert b"data: [DONE]" in data and b'"finish_reason":"abort"' in data
        assert "drain timeout; aborting" in s.output()
    finally:
        s.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_idle_exit(sig):
    """An idle server, even with an idle keep-alive connection open, exits 0 at once."""
    s = Server(["--max-model-len", "256", "--kv-cache-memory", "32M"])
    try:
        idle = socket.create_connection((s.host, s.port))
        status, _, _ = s.request("GET", "/health")
        assert status == 200
        t0 = time.time()
        s.proc.send_signal(sig)
        assert s.proc.wait(timeout=30) == 0
        assert time.time() - t0 < 5
        idle.close()
    finally:
        s.stop()
