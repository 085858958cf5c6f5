"""End-to-end: a real `kaon serve` driven by the official `openai` Python client.

References we did not write: the openai package (its SSE decoder parses our streams, its
pydantic types validate our raw JSON), jinja2 + the gguf package (the model's own chat
template rendered independently), prometheus_client's parser for /metrics.
"""
import json
import math
import socket
import time

import pytest

from conftest import API_KEY, MAX_MODEL_LEN, MODEL

MODEL_NAME = "smol"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def metric(text, name, **labels):
    """The value of one sample, via prometheus_client's parser (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


# ---- basics ----------------------------------------------------------------------------------

def test_health_version_models(server, client):
    status, _, body = server.request("GET", "/health")
    assert status == 200 and body == b""
    status, v = server.json("GET", "/version", key=None)
    assert status == 200 and isinstance(v["version"], str) and v["version"]
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    status, raw = server.json("GET", "/v1/models")
    assert raw["object"] == "list"
    assert raw["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_chat_completion(server, client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, temperature=0, max_tokens=24)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == MODEL_NAME and len(r.choices) == 1
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content.strip()
    assert "Paris" in c.message.content  # the model knows this one greedily
    assert c.finish_reason in ("stop", "length")
    # usage agrees with /tokenize on the same conversation.
    status, tok = server.json("POST", "/tokenize", {"messages": CHAT, "add_generation_prompt": True})
    assert status == 200
    assert r.usage.prompt_tokens == tok["count"] == len(tok["tokens"])
    assert 1 <= r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_template_matches_jinja2(server):
    """The server's templated prompt equals the GGUF's template rendered by jinja2."""
    import gguf
    import jinja2
    reader = gguf.GGUFReader(str(MODEL))
    field = reader.fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(Exception(msg))
    text = env.from_string(template).render(messages=CHAT, add_generation_prompt=True,
                                            bos_token="", eos_token="")
    status, a = server.json("POST", "/tokenize", {"messages": CHAT, "add_generation_prompt": True})
    assert status == 200
    status, b = server.json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200
    assert a["tokens"] == b["tokens"]


def test_chat_stream_equals_nonstream(client):
    args = dict(model=MODEL_NAME, messages=CHAT, temperature=0, max_tokens=20)
    full = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    # include_usage: every chunk carries usage null, the last one (no choices) the totals.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completion_stream_equals_nonstream(client):
    args = dict(model=MODEL_NAME, prompt="The three primary colors are", temperature=0, max_tokens=16)
    full = client.completions.create(**args)
    assert full.object == "text_completion" and full.choices[0].text
    chunks = list(client.completions.create(stream=True, **args))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 16


def test_n2(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, n=2, temperature=1.0,
                                       max_tokens=12, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content for c in r.choices)
    # Streamed with n = 2: each index gets its own role chunk and finish.
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT, n=2,
                                                 temperature=1.0, max_tokens=12, seed=7, stream=True))
    texts, finishes = {0: "", 1: ""}, {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert set(finishes) == {0, 1}
    # Same seed, same samples, streamed or not.
    assert texts == {c.index: c.message.content for c in r.choices}


def test_seed_reproducible(client):
    args = dict(model=MODEL_NAME, prompt="Once upon a time", temperature=1.0, max_tokens=24)
    a = client.completions.create(seed=1234, **args).choices[0].text
    b = client.completions.create(seed=1234, **args).choices[0].text
    assert a == b
    others = {client.completions.create(seed=s, **args).choices[0].text for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # different seeds explore different samples


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, temperature=0, max_tokens=10,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert sum(math.exp(t) for t in tops) <= 1.0 + 1e-4
        # Greedy: the sampled token is the most likely one.
        assert e.token == e.top_logprobs[0].token
        assert abs(e.logprob - tops[0]) < 1e-4
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token


def test_completion_logprobs_and_echo(client):
    prompt = "The capital of Italy is"
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and tok in top and abs(top[tok] - max(top.values())) < 1e-4
    e = client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, max_tokens=6, echo=True)
    assert e.choices[0].text == prompt + r.choices[0].text


def test_stop_strings(client):
    args = dict(model=MODEL_NAME, prompt="1, 2, 3, 4, 5,", temperature=0, max_tokens=24)
    full = client.completions.create(**args).choices[0].text
    assert len(full) > 6
    stop = full[3:5]
    want = full[: full.index(stop)]
    r = client.completions.create(stop=[stop, "never-matches"], **args)
    assert r.choices[0].text == want
    assert r.choices[0].finish_reason == "stop"
    raw = r.choices[0].model_extra
    assert raw.get("stop_reason") == stop
    # As a single string, and streamed.
    chunks = list(client.completions.create(stop=stop, stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want


def test_max_tokens_and_ignore_eos(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hi", max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_completion_tokens=2)
    assert r.usage.completion_tokens <= 2


def test_token_id_prompts(server, client):
    text = "The quick brown fox"
    status, tok = server.json("POST", "/tokenize", {"prompt": text})
    assert status == 200
    ids = tok["tokens"]
    a = client.completions.create(model=MODEL_NAME, prompt=text, temperature=0, max_tokens=8)
    b = client.completions.create(model=MODEL_NAME, prompt=ids, temperature=0, max_tokens=8)
    assert a.choices[0].text == b.choices[0].text
    assert b.usage.prompt_tokens == len(ids)
    # A list of prompts (ids) gives one choice per prompt, in order.
    status, tok2 = server.json("POST", "/tokenize", {"prompt": "Paris is"})
    m = client.completions.create(model=MODEL_NAME, prompt=[ids, tok2["tokens"]], temperature=0, max_tokens=8)
    assert [c.index for c in m.choices] == [0, 1]
    assert m.choices[0].text == a.choices[0].text
    single = client.completions.create(model=MODEL_NAME, prompt="Paris is", temperature=0, max_tokens=8)
    assert m.choices[1].text == single.choices[0].text
    assert m.usage.prompt_tokens == len(ids) + len(tok2["tokens"])


def test_list_of_string_prompts_stream(client):
    prompts = ["Roses are red,", "One plus one is"]
    singles = [client.completions.create(model=MODEL_NAME, prompt=p, temperature=0, max_tokens=8).choices[0].text
               for p in prompts]
    texts = {0: "", 1: ""}
    for ch in client.completions.create(model=MODEL_NAME, prompt=prompts, temperature=0, max_tokens=8,
                                        stream=True):
        for c in ch.choices:
            texts[c.index] += c.text
    assert [texts[0], texts[1]] == singles


def test_tokenize_roundtrip(server):
    for text in ["Hello, world!", "naïve café – 東京 🚀", "  spaces\tand\nnewlines  ", "12345 digits"]:
        status, tok = server.json("POST", "/tokenize", {"prompt": text, "add_special_tokens": False,
                                                        "return_token_strs": True})
        assert status == 200 and tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
        assert tok["max_model_len"] == MAX_MODEL_LEN
        status, det = server.json("POST", "/detokenize", {"tokens": tok["tokens"]})
        assert status == 200 and det["prompt"] == text


def test_cached_tokens(client):
    long_prompt = "In a distant galaxy, " * 40
    client.completions.create(model=MODEL_NAME, prompt=long_prompt, max_tokens=1)
    r = client.completions.create(model=MODEL_NAME, prompt=long_prompt, max_tokens=1)
    details = r.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens >= r.usage.prompt_tokens // 2
    assert details.cached_tokens < r.usage.prompt_tokens


def test_raw_json_matches_openai_types(server):
    """Our raw bodies validate against the openai package's own pydantic models."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    status, body = server.json("POST", "/v1/chat/completions",
                               {"model": MODEL_NAME, "messages": CHAT, "max_tokens": 5,
                                "logprobs": True, "top_logprobs": 2})
    assert status == 200
    ChatCompletion.model_validate(body)
    status, body = server.json("POST", "/v1/completions",
                               {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 5, "logprobs": 1})
    assert status == 200
    Completion.model_validate(body)
    status, _, raw = server.request("POST", "/v1/chat/completions",
                                    {"messages": CHAT, "max_tokens": 4, "stream": True},
                                    headers={"Authorization": f"Bearer {API_KEY}"})
    assert status == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    for e in events[:-1]:
        assert e.startswith("data: ")
        ChatCompletionChunk.model_validate(json.loads(e[6:]))


def test_metrics_move(server, client):
    before = server.metrics()
    n_before = metric(before, "kaon:request_success_total", finished_reason="length") or 0
    gen_before = metric(before, "kaon:generation_tokens_total") or 0
    prompt_before = metric(before, "kaon:prompt_tokens_total") or 0
    e2e_before = metric(before, "kaon:e2e_request_latency_seconds_count") or 0
    ttft_before = metric(before, "kaon:time_to_first_token_seconds_count") or 0
    psteps_before = metric(before, "kaon:engine_steps_by_kind_total", kind="prefill") or 0
    dsteps_before = metric(before, "kaon:engine_steps_by_kind_total", kind="decode") or 0
    psec_before = metric(before, "kaon:engine_step_seconds_total", kind="prefill") or 0
    dsec_before = metric(before, "kaon:engine_step_seconds_total", kind="decode") or 0
    used = 0
    prompt_used = 0
    for i in range(3):
        r = client.completions.create(model=MODEL_NAME, prompt=f"Count to {i + 3}:", max_tokens=5,
                                      temperature=0, extra_body={"ignore_eos": True})
        used += r.usage.completion_tokens
        prompt_used += r.usage.prompt_tokens
    after = server.metrics()
    assert metric(after, "kaon:request_success_total", finished_reason="length") == n_before + 3
    assert metric(after, "kaon:generation_tokens_total") == gen_before + used
    assert metric(after, "kaon:prompt_tokens_total") >= prompt_before + 1  # prefix hits skip some
    assert metric(after, "kaon:e2e_request_latency_seconds_count") == e2e_before + 3
    assert metric(after, "kaon:time_to_first_token_seconds_count") == ttft_before + 3
    assert metric(after, "kaon:num_requests_running") == 0
    assert metric(after, "kaon:num_requests_waiting") == 0
    assert 0 <= metric(after, "kaon:kv_cache_usage_perc") <= 1
    q = metric(after, "kaon:prefix_cache_queries_total")
    h = metric(after, "kaon:prefix_cache_hits_total")
    assert q is not None and h is not None and 0 <= h <= q
    assert metric(after, "kaon:num_preemptions_total") is not None
    assert metric(after, "kaon:inter_token_latency_seconds_count") > 0
    assert metric(after, "kaon:request_queue_time_seconds_count") > 0
    # One prefill step per request at least (each prompt is new text), and the 4 further tokens of
    # each come from steps that compute no prompt token; both kinds took time.
    psteps = metric(after, "kaon:engine_steps_by_kind_total", kind="prefill") - psteps_before
    dsteps = metric(after, "kaon:engine_steps_by_kind_total", kind="decode") - dsteps_before
    assert psteps >= 3 and dsteps >= 4
    assert psteps + dsteps == metric(after, "kaon:engine_steps_total") - metric(before, "kaon:engine_steps_total")
    assert metric(after, "kaon:engine_step_seconds_total", kind="prefill") > psec_before
    assert metric(after, "kaon:engine_step_seconds_total", kind="decode") > dsec_before


def test_client_disconnect_aborts(server):
    """A streaming client that hangs up mid-stream has its request aborted; KV blocks return."""
    before = metric(server.metrics(), "kaon:request_success_total", finished_reason="abort") or 0
    body = json.dumps({"model": MODEL_NAME, "prompt": "Tell me a long story.", "max_tokens": 500,
                       "stream": True, "extra": 1, "ignore_eos": True}).encode()
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        chunk = sock.recv(65536)
        assert chunk, "server closed the stream early"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200")
    sock.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        m = server.metrics()
        if (metric(m, "kaon:request_success_total", finished_reason="abort") == before + 1
                and metric(m, "kaon:num_requests_running") == 0
                and metric(m, "kaon:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the aborted request did not release its blocks:\n" + m)


# ---- start-up and shutdown -------------------------------------------------------------------

def test_bad_model_fails_cleanly(tmp_path):
    """A model that cannot be loaded: the process exits 1 with the reason, no crash."""
    import subprocess
    from conftest import kaon_binary
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    p = subprocess.run([str(kaon_binary()), "serve", str(bad), "--port", "0"], capture_output=True,
                       timeout=120)
    assert p.returncode == 1, p
    assert b"cannot load the model" in p.stderr


# Graceful shutdown (SIGTERM / SIGINT, drain, drain timeout): test_shutdown.py.
