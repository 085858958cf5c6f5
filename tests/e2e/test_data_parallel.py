"""Data-parallel replicas behind one server (kaon serve --data-parallel-size N): each request
goes to one replica, the one caching the longest prefix of its prompt, else the least loaded.
The routing is read back from the per-replica metrics (label engine="i")."""
import json
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

from conftest import Server, kaon_binary

MODEL_NAME = "smol"
COMMON = ["--served-model-name", MODEL_NAME, "--max-model-len", "1024", "--kv-cache-memory", "64M"]
# Two long system prompts that differ from their first token (no shared full KV block).
SYSTEM_A = "Alpha rules: you are a terse assistant for a shipping company. " * 12
SYSTEM_B = "Bravo policy: reply as a cheerful librarian who loves old maps. " * 12


def samples(text, name, **labels):
    """{engine label (None: the total): value} of one metric's samples with these labels."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                out[s.labels.get("engine")] = s.value
    return out


def per_replica(server, name, **labels):
    m = samples(server.metrics(), name, **labels)
    return [m.get("0", 0.0), m.get("1", 0.0)]


def finished(server):
    """Requests finished on each replica, whatever their reason."""
    m = server.metrics()
    return [sum(samples(m, "kaon:request_success_total", finished_reason=r).get(str(i), 0.0)
                for r in ("stop", "length", "abort", "error")) for i in range(2)]


def delta(after, before):
    return [a - b for a, b in zip(after, before)]


def wait_idle(server):
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if samples(m, "kaon:num_requests_running").get(None) == 0 and \
                samples(m, "kaon:num_requests_waiting").get(None) == 0:
            return
        time.sleep(0.05)
    pytest.fail("requests left running:\n" + server.metrics())


@pytest.fixture(scope="module")
def dp_server():
    s = Server(COMMON + ["--data-parallel-size", "2", "--threads", "2"])
    yield s
    s.stop()
    assert s.proc.returncode == 0, "kaon serve -dp 2 did not exit cleanly on SIGTERM:\n" + s.output()


@pytest.fixture(scope="module")
def dp_client(dp_server):
    return openai.OpenAI(base_url=dp_server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def test_layout_and_metrics(dp_server):
    log = dp_server.output()
    assert "replica 0 of 2: device cpu, 1 thread, KV cache 64.0 MiB" in log
    assert "replica 1 of 2: device cpu, 1 thread, KV cache 64.0 MiB" in log
    blocks = samples(dp_server.metrics(), "kaon:num_kv_blocks_total")
    assert blocks["0"] == blocks["1"] > 0 and blocks[None] == 2 * blocks["0"]
    status, _, body = dp_server.request("GET", "/health")
    assert status == 200 and body == b""


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]


def test_greedy_matches_one_replica(dp_server, dp_client):
    """Greedy outputs on 2 replicas (4 requests at once: both replicas busy) equal one engine's."""
    one = Server(COMMON + ["--threads", "1"])
    try:
        c1 = openai.OpenAI(base_url=one.base + "/v1", api_key="none", max_retries=0, timeout=120)
        want = [c1.completions.create(model=MODEL_NAME, prompt=p, max_tokens=12, temperature=0).choices[0].text
                for p in PROMPTS]
        want_chat = c1.chat.completions.create(
            model=MODEL_NAME, max_tokens=12, temperature=0,
            messages=[{"role": "user", "content": "Name a fruit."}]).choices[0].message.content
    finally:
        one.stop()
    before = finished(dp_server)
    got = [None] * len(PROMPTS)

    def run(i):
        got[i] = dp_client.completions.create(model=MODEL_NAME, prompt=PROMPTS[i], max_tokens=12,
                                              temperature=0).choices[0].text

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want
    d = delta(finished(dp_server), before)
    assert sum(d) == len(PROMPTS) and min(d) >= 1, d
    # Streaming, on whichever replica: the same text in chunks.
    stream = dp_client.chat.completions.create(
        model=MODEL_NAME, max_tokens=12, temperature=0, stream=True,
        messages=[{"role": "user", "content": "Name a fruit."}])
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == want_chat


def test_concurrent_requests_spread(dp_server):
    """8 requests at once (prompts too short to share a KV block): the least loaded replica
    takes each, so both get about half."""
    wait_idle(dp_server)
    before = finished(dp_server)
    errors = []
    clients = [openai.OpenAI(base_url=dp_server.base + "/v1", api_key="none", max_retries=0, timeout=120)
               for _ in range(8)]

    def run(k):
        try:
            r = clients[k].completions.create(model=MODEL_NAME, prompt=f"Item {k}:", max_tokens=16,
                                     temperature=0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 16
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    d = delta(finished(dp_server), before)
    assert sum(d) == 8 and min(d) >= 3, f"requests per replica: {d}"
    # Both replicas ran prefill and decode steps; the unlabelled sample is their sum.
    m = dp_server.metrics()
    for name in ("kaon:engine_steps_by_kind_total", "kaon:engine_step_seconds_total"):
        for kind in ("prefill", "decode"):
            v = samples(m, name, kind=kind)
            assert v["0"] > 0 and v["1"] > 0, (name, kind, v)
            assert v[None] == pytest.approx(v["0"] + v["1"]), (name, kind, v)


def chat_body(system, question, **kw):
    return dict(model=MODEL_NAME, temperature=0,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": question}], **kw)


def test_shared_prefix_goes_to_its_replica(dp_server, dp_client):
    """A long system prompt sent again goes to the replica that has it cached: two prompts
    first land on different replicas (the second while the first runs), then each comes back
    to its own, where its prefix-cache hits rise."""
    wait_idle(dp_server)
    stream = dp_client.chat.completions.create(**chat_body(SYSTEM_A, "Hi.", max_tokens=48, stream=True,
                                                          extra_body={"ignore_eos": True}))
    it = iter(stream)
    next(it)  # A is running on its replica
    dp_client.chat.completions.create(**chat_body(SYSTEM_B, "Hi.", max_tokens=4))
    for _ in it:
        pass
    wait_idle(dp_server)
    homes = []
    for system in (SYSTEM_A, SYSTEM_B):
        hits = per_replica(dp_server, "kaon:prefix_cache_hits_total")
        r = dp_client.chat.completions.create(**chat_body(system, "What do you do?", max_tokens=4))
        d = delta(per_replica(dp_server, "kaon:prefix_cache_hits_total"), hits)
        assert r.usage.prompt_tokens_details.cached_tokens >= 128
        assert sorted(d) == [0, r.usage.prompt_tokens_details.cached_tokens], d
        homes.append(d.index(max(d)))
    assert homes[0] != homes[1], f"both prompts went to replica {homes[0]}"


def test_disconnect_leaves_other_replica(dp_server):
    """A streaming client that hangs up aborts its request on its replica; a request running on
    the other replica meanwhile finishes whole."""
    wait_idle(dp_server)
    before_abort = per_replica(dp_server, "kaon:request_success_total", finished_reason="abort")
    before_len = per_replica(dp_server, "kaon:request_success_total", finished_reason="length")
    body = json.dumps({"model": MODEL_NAME, "prompt": "Tell me a long story.", "max_tokens": 400,
                       "stream": True, "ignore_eos": True}).encode()
    sock = socket.create_connection((dp_server.host, dp_server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 2:
        chunk = sock.recv(65536)
        assert chunk, "server closed the stream early"
        got += chunk
    result = {}

    def other():
        c = openai.OpenAI(base_url=dp_server.base + "/v1", api_key="none", max_retries=0, timeout=120)
        result["r"] = c.completions.create(model=MODEL_NAME, prompt="List some animals:", max_tokens=40,
                                           temperature=0, extra_body={"ignore_eos": True})

    t = threading.Thread(target=other)
    t.start()
    time.sleep(0.3)  # the second request is running on the other replica
    sock.close()
    t.join(120)
    r = result["r"]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
    wait_idle(dp_server)
    aborted = delta(per_replica(dp_server, "kaon:request_success_total", finished_reason="abort"), before_abort)
    lengths = delta(per_replica(dp_server, "kaon:request_success_total", finished_reason="length"), before_len)
    assert sorted(aborted) == [0, 1] and sorted(lengths) == [0, 1], (aborted, lengths)
    assert aborted.index(1) != lengths.index(1), "the abort and the finished request shared a replica"
    usage = samples(dp_server.metrics(), "kaon:kv_cache_usage_perc")
    assert usage["0"] == usage["1"] == 0


@pytest.mark.parametrize("args", [["--data-parallel-size", "0"], ["--data-parallel-size", "-1"],
                                  ["--data-parallel-size", "1.5"], ["--data-parallel-size", "two"],
                                  ["--data-parallel-size", "65"], ["-dp", "0"], ["--data_parallel_size=1000"]])
def test_bad_size_refused(args):
    r = subprocess.run([str(kaon_binary()), "serve", "--port", "0"] + args, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kaon: error:"), r.stderr
    assert "data-parallel-size" in lines[0] or "data_parallel_size" in lines[0]


def test_replica_failing_fails_start(tmp_path):
    """An engine that cannot start fails the whole server, naming the replica."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    r = subprocess.run([str(kaon_binary()), "serve", str(bad), "--port", "0", "-dp", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "replica 0 of 2" in r.stderr.strip().splitlines()[-1]


def test_info_plan_per_replica():
    r = subprocess.run([str(kaon_binary()), "info", "--data-parallel-size", "2", "--threads", "4"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "data parallel:  2 replicas" in r.stdout
    assert "replica 0:    device cpu, 2 threads" in r.stdout and "replica 1:    device cpu, 2 threads" in r.stdout


def test_shutdown_drains_every_replica():
    """SIGTERM with streams running on both replicas: each finishes whole, the process exits 0."""
    from test_shutdown import Streams, wait_health
    s = Server(COMMON + ["--data-parallel-size", "2", "--threads", "2", "--drain-timeout", "60"])
    try:
        streams = Streams(s, 4, max_tokens=80)
        deadline = time.time() + 30
        # Every stream admitted (a request still on its way in when SIGTERM lands gets a 503,
        # as it should) and both replicas busy.
        while min(r := per_replica(s, "kaon:num_requests_running")) < 1 or sum(r) < 4:
            assert time.time() < deadline, "streams did not start on both replicas:\n" + s.metrics()
            time.sleep(0.02)
        s.proc.send_signal(signal.SIGTERM)
        wait_health(s, 503)
        for res in streams.join(60):
            assert res["error"] is None and res["finish"] == ["length"], res
        assert s.proc.wait(timeout=60) == 0
        assert "drain timeout" not in s.output()
    finally:
        s.stop()


def test_anthropic_messages_routed(dp_server):
    """/v1/messages submits through the same routing: it runs on one replica."""
    wait_idle(dp_server)
    before = finished(dp_server)
    status, body = dp_server.json("POST", "/v1/messages", {
        "model": MODEL_NAME, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Name a colour."}]}, key=None)
    assert status == 200 and body["type"] == "message" and body["content"][0]["text"], body
    assert sorted(delta(finished(dp_server), before)) == [0, 1]


def test_dp_attention_with_expert_parallel():
    """-dp 2 with --enable-expert-parallel is DP attention inside one engine, not replicas (a
    dense model runs plainly data parallel: each rank its own sequences and half the KV pool):
    greedy outputs of requests in flight together equal one engine's."""
    one = Server(COMMON + ["--threads", "1"])
    try:
        c1 = openai.OpenAI(base_url=one.base + "/v1", api_key="none", max_retries=0, timeout=120)
        want = [c1.completions.create(model=MODEL_NAME, prompt=p, max_tokens=12, temperature=0).choices[0].text
                for p in PROMPTS]
    finally:
        one.stop()
    # Each rank holds half the KV pool: twice the memory for the same max_model_len.
    s = Server(["--served-model-name", MODEL_NAME, "--max-model-len", "1024", "--kv-cache-memory", "160M",
                "-dp", "2", "--enable-expert-parallel", "--threads", "2"])
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
        got = [None] * len(PROMPTS)

        def run(i):
            got[i] = c.completions.create(model=MODEL_NAME, prompt=PROMPTS[i], max_tokens=12,
                                          temperature=0).choices[0].text

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log = s.output()
        assert "data parallel: rank 0 of 2" in log and "data parallel: rank 1 of 2" in log, log
        assert "replica 1 of 2" not in log
        assert got == want
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.output()
