"""The server's limits, each through the official openai client (or raw sockets where a client
library cannot express the case): body size, prompt length, n, max_tokens, concurrent
connections, queued requests (429 + Retry-After) and the per-request timeout (504, or an error
event in a stream). Every refusal is an OpenAI-shaped error and the server keeps serving."""
import json
import socket
import threading
import time

import openai
import pytest

from conftest import Server

MAX_BODY = 4096
MAX_PROMPT = 64
MAX_TOKENS = 32
MAX_N = 2
MAX_CONNS = 4


def metric(server, name):
    for line in server.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(pred, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def make_client(server, **kw):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120, **kw)


def check_normal(client):
    r = client.completions.create(model="smol", prompt="Hello", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


# ---- body, prompt, n, max_tokens, connections: one server --------------------------------------

@pytest.fixture(scope="module")
def limited():
    s = Server(["--served-model-name", "smol", "--max-model-len", "512", "--kv-cache-memory", "64M",
                "--max-body-size", str(MAX_BODY), "--max-prompt-tokens", str(MAX_PROMPT),
                "--max-tokens", str(MAX_TOKENS), "--max-n", str(MAX_N),
                "--max-connections", str(MAX_CONNS)])
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.output()


@pytest.fixture(scope="module")
def lclient(limited):
    return make_client(limited)


def test_body_size(limited, lclient):
    with pytest.raises(openai.APIStatusError) as ei:
        lclient.chat.completions.create(model="smol", max_tokens=1,
                                        messages=[{"role": "user", "content": "x" * (MAX_BODY + 100)}])
    assert ei.value.status_code == 413
    assert ei.value.body["type"] == "invalid_request_error" and ei.value.body["code"] == "body_too_large"
    # Chunked uploads (no Content-Length) are held to the same limit.
    body = json.dumps({"prompt": "y" * (2 * MAX_BODY), "max_tokens": 1}).encode()
    s = socket.create_connection((limited.host, limited.port), timeout=30)
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000]) for i in range(0, len(body), 1000))
    s.sendall(head + chunks + b"0\r\n\r\n")
    reply = b""
    while True:
        got = s.recv(65536)
        if not got:
            break
        reply += got
    s.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    check_normal(lclient)


def test_prompt_length(lclient):
    with pytest.raises(openai.BadRequestError) as ei:
        lclient.completions.create(model="smol", prompt="hello " * (MAX_PROMPT + 20), max_tokens=1)
    assert ei.value.body["param"] == "prompt" and ei.value.body["code"] == "prompt_too_long"
    with pytest.raises(openai.BadRequestError) as ei:
        lclient.chat.completions.create(model="smol", max_tokens=1,
                                        messages=[{"role": "user", "content": "hello " * (MAX_PROMPT + 20)}])
    assert ei.value.body["param"] == "messages" and ei.value.body["code"] == "prompt_too_long"
    # Token-id prompts count the same way; at the limit is fine.
    with pytest.raises(openai.BadRequestError):
        lclient.completions.create(model="smol", prompt=[1] * (MAX_PROMPT + 1), max_tokens=1)
    r = lclient.completions.create(model="smol", prompt=[1] * MAX_PROMPT, max_tokens=1)
    assert r.usage.prompt_tokens == MAX_PROMPT


def test_n(lclient):
    with pytest.raises(openai.BadRequestError) as ei:
        lclient.completions.create(model="smol", prompt="Hi", max_tokens=1, n=MAX_N + 1)
    assert ei.value.body["param"] == "n"
    r = lclient.completions.create(model="smol", prompt="Hi", max_tokens=1, n=MAX_N)
    assert len(r.choices) == MAX_N


def test_max_tokens(lclient):
    with pytest.raises(openai.BadRequestError) as ei:
        lclient.completions.create(model="smol", prompt="Hi", max_tokens=MAX_TOKENS + 1)
    assert ei.value.body["param"] == "max_tokens" and "--max-tokens" in ei.value.body["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        lclient.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                        max_completion_tokens=MAX_TOKENS + 1)
    assert ei.value.body["param"] == "max_completion_tokens"
    # Absent, chat's max_tokens is the room left in the context, capped by --max-tokens.
    r = lclient.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Count to 1000."}],
                                        extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == MAX_TOKENS and r.choices[0].finish_reason == "length"


def test_connections(limited, lclient):
    idle = [socket.create_connection((limited.host, limited.port)) for _ in range(MAX_CONNS)]
    try:
        # One more connection: a 503 with Retry-After, then closed.
        fresh = make_client(limited)  # a new client: a new connection
        with pytest.raises(openai.APIStatusError) as ei:
            fresh.completions.create(model="smol", prompt="Hi", max_tokens=1)
        assert ei.value.status_code == 503
        assert ei.value.response.headers.get("retry-after") == "1"
        assert ei.value.body["code"] == "too_many_connections"
        # /health is not refused: load balancers still see the server.
        status, _, _ = limited.request("GET", "/health")
        assert status == 200
    finally:
        for s in idle:
            s.close()

    def ok():
        try:
            make_client(limited).completions.create(model="smol", prompt="Hi", max_tokens=1)
            return True
        except openai.APIStatusError as e:
            assert e.status_code == 503
            return False
    wait_for(ok, "the idle connections to be counted as closed", timeout=30)


# ---- the queue: its own server, one running slot ----------------------------------------------

def test_queue_full_gets_429():
    s = Server(["--served-model-name", "smol", "--max-model-len", "2048", "--kv-cache-memory", "128M",
                "--max-num-seqs", "1", "--max-queue", "2"])
    try:
        client = make_client(s)
        streams = []

        def start():
            st = client.completions.create(model="smol", prompt="Tell me a story.", max_tokens=2000,
                                           stream=True, extra_body={"ignore_eos": True})
            streams.append(st)
            return st

        next(iter(start()))  # running
        wait_for(lambda: metric(s, "kaon:num_requests_running") == 1, "one running request")
        for _ in range(2):  # both wait: one running slot
            threading.Thread(target=start, daemon=True).start()
        wait_for(lambda: metric(s, "kaon:num_requests_waiting") == 2, "two waiting requests")
        with pytest.raises(openai.RateLimitError) as ei:
            client.completions.create(model="smol", prompt="Hi", max_tokens=1)
        assert ei.value.status_code == 429
        assert ei.value.response.headers.get("retry-after") == "1"
        assert ei.value.body["code"] == "queue_full" and ei.value.body["type"] == "rate_limit_error"
        assert 'kaon:http_requests_total{model_name="smol",code="429"} 1' in s.metrics()
        wait_for(lambda: len(streams) == 3, "the two queued streams to start")
        for st in streams:
            st.response.close()  # the clients go away: aborted, the queue empties
        wait_for(lambda: metric(s, "kaon:num_requests_running") == 0
                 and metric(s, "kaon:num_requests_waiting") == 0
                 and metric(s, "kaon:kv_cache_usage_perc") == 0, "the queue to empty")
        check_normal(client)
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.output()


# ---- the request timeout ----------------------------------------------------------------------

# Long enough for a one-token request even on a slow sanitizer build; far too short for 2000
# tokens on any CPU.
TIMEOUT = 4.0


@pytest.fixture(scope="module")
def timed():
    s = Server(["--served-model-name", "smol", "--max-model-len", "2048", "--kv-cache-memory", "128M",
                "--request-timeout", str(TIMEOUT)])
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.output()


LONG = dict(model="smol", prompt="Write a very long essay about the sea.", max_tokens=2000,
            extra_body={"ignore_eos": True})


def test_timeout_nonstream(timed):
    client = make_client(timed)
    t0 = time.time()
    with pytest.raises(openai.APIStatusError) as ei:
        client.completions.create(**LONG)
    dt = time.time() - t0
    assert ei.value.status_code == 504
    assert ei.value.body["code"] == "request_timeout" and ei.value.body["type"] == "timeout_error"
    assert TIMEOUT <= dt < TIMEOUT + 20, dt
    wait_for(lambda: metric(timed, "kaon:num_requests_running") == 0
             and metric(timed, "kaon:kv_cache_usage_perc") == 0, "the blocks to be freed")
    r = client.completions.create(model="smol", prompt="Hello", max_tokens=1)  # short: unaffected
    assert r.choices[0].finish_reason in ("stop", "length")


def test_timeout_stream(timed):
    client = make_client(timed)
    t0 = time.time()
    text, finish = "", None
    with pytest.raises(openai.APIError) as ei:
        for ch in client.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": "Write a very long essay."}],
                max_tokens=2000, stream=True, extra_body={"ignore_eos": True}):
            for c in ch.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
    dt = time.time() - t0
    assert ei.value.body["code"] == "request_timeout", ei.value.body
    assert text and finish == "abort"  # what was generated came first, then the abort
    assert TIMEOUT <= dt < TIMEOUT + 20, dt
    wait_for(lambda: metric(timed, "kaon:kv_cache_usage_perc") == 0, "the blocks to be freed")
