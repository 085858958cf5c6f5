"""Many clients at once against one `kaon serve`: streams, non-streams, n > 1, prompt lists,
shared prefixes, clients that abort mid-stream or vanish mid-request, /tokenize and /metrics
scrapes, all in parallel on a small KV pool (so the scheduler preempts). Afterwards nothing
is left running, every KV block is free, and a seeded probe gives the same text as before.

scripts/test.sh also runs this file against the ThreadSanitizer build (KAON_BUILD=build-tsan)."""
import json
import random
import socket
import threading
import time

import openai
import pytest

from conftest import Server

WORKERS = 12
OPS_PER_WORKER = 3
PROBE = dict(model="smol", prompt="The best thing about the ocean is", max_tokens=12,
             temperature=0.9, seed=1234)
PREFIX = "You are a careful assistant. Answer briefly and precisely. " * 3


def metric(server, name):
    for line in server.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture(scope="module")
def busy_server():
    # 32 MiB of KV = 45 blocks of 16 tokens for SmolLM2: less than the clients want at once.
    s = Server(["--served-model-name", "smol", "--max-model-len", "512", "--kv-cache-memory", "32M",
                "--max-num-seqs", "12", "--max-num-batched-tokens", "256"])
    yield s
    s.stop()
    assert s.proc.returncode == 0, s.output()


def one_op(server, client, rng, errors):
    op = rng.choice(["stream", "stream_abort", "disconnect", "nonstream_n2", "prompt_list",
                     "chat_prefix", "tokenize", "metrics"])
    max_tokens = rng.randint(1, 16)
    sampling = dict(temperature=rng.choice([0, 0.7, 1.0]), top_p=rng.choice([1.0, 0.9]),
                    seed=rng.randint(0, 1000))
    if op == "stream":
        finish = []
        for ch in client.completions.create(model="smol", prompt=PREFIX + f"Item {rng.randint(0, 99)}.",
                                            max_tokens=max_tokens, stream=True, **sampling):
            finish += [c.finish_reason for c in ch.choices if c.finish_reason]
        if finish not in (["stop"], ["length"]):
            errors.append(f"stream finish {finish}")
    elif op == "stream_abort":
        st = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Tell me a long story."}],
            max_tokens=200, stream=True, extra_body={"ignore_eos": True}, **sampling)
        for i, _ in enumerate(st):
            if i >= rng.randint(1, 4):
                break
        st.response.close()
    elif op == "disconnect":
        body = json.dumps({"model": "smol", "prompt": PREFIX + "Go on.", "max_tokens": 100,
                           "ignore_eos": True, "stream": rng.random() < 0.5}).encode()
        s = socket.create_connection((server.host, server.port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(rng.random() * 0.3)
        s.close()
    elif op == "nonstream_n2":
        r = client.completions.create(model="smol", prompt=PREFIX + "Name a color.", n=2,
                                      max_tokens=max_tokens, **sampling)
        if sorted(c.index for c in r.choices) != [0, 1]:
            errors.append(f"n=2 choices {r.choices}")
    elif op == "prompt_list":
        r = client.completions.create(model="smol", prompt=[PREFIX + "One.", PREFIX + "Two.", "Three."],
                                      max_tokens=max_tokens, stream=rng.random() < 0.5, **sampling)
        if not isinstance(r, openai.types.Completion):
            r = list(r)  # the stream, drained
    elif op == "chat_prefix":
        r = client.chat.completions.create(
            model="smol", messages=[{"role": "system", "content": PREFIX},
                                    {"role": "user", "content": f"Say {rng.randint(0, 9)}."}],
            max_tokens=max_tokens, **sampling)
        if r.choices[0].finish_reason not in ("stop", "length"):
            errors.append(f"chat finish {r.choices[0].finish_reason}")
    elif op == "tokenize":
        status, body = server.json("POST", "/tokenize", {"prompt": PREFIX}, key=None)
        if status != 200 or body["count"] <= 0:
            errors.append(f"tokenize {status}")
    else:
        server.metrics()


def test_parallel_mix(busy_server):
    s = busy_server
    client = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=600)
    before = client.completions.create(**PROBE).choices[0].text
    errors = []

    def worker(k):
        rng = random.Random(k)
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=600)
        for _ in range(OPS_PER_WORKER):
            try:
                one_op(s, c, rng, errors)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
        assert not t.is_alive(), "a client hung"
    assert not errors, errors
    deadline = time.time() + 60
    while time.time() < deadline:
        if (metric(s, "kaon:num_requests_running") == 0 and metric(s, "kaon:num_requests_waiting") == 0
                and metric(s, "kaon:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.1)
    else:
        pytest.fail("requests or KV blocks left over:\n" + s.metrics())
    assert 'code="500"} 0' in s.metrics()
    after = client.completions.create(**PROBE).choices[0].text
    assert after == before
