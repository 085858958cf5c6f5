"""End-to-end: Anthropic's Messages API (/v1/messages) on a real `kaon serve`, driven by the
official `anthropic` Python client, unchanged.

References we did not write: the anthropic package (its SSE decoder and stream accumulator
parse our events, its pydantic types read our JSON, its exceptions classify our errors) and the
openai package (the same conversation on /v1/chat/completions must give the same text).
"""
import json
import socket
import time

import pytest

from conftest import API_KEY, MAX_MODEL_LEN

MODEL_NAME = "smol"
SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France? Answer in one sentence."
MULTI = [{"role": "user", "content": "Hi! My name is Ada."},
         {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
         {"role": "user", "content": "What is the capital of France?"}]
# This client (2.16) has no temperature argument: the field goes in the body, as the API takes it.
T0 = {"temperature": 0}
WEATHER_TOOL = {"name": "get_weather", "description": "The current weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}


@pytest.fixture(scope="module")
def ac(server):
    try:
        import anthropic
    except ImportError:
        pytest.fail("the anthropic package is missing: pip install -r scripts/requirements-test.txt")
    return anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=300)


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def raw_post(server, path, body, key=API_KEY, headers=None):
    h = {"x-api-key": key, "anthropic-version": "2023-06-01"} if key else {}
    h.update(headers or {})
    status, hdrs, data = server.request("POST", path, body, headers=h)
    return status, hdrs, data


# ---- messages --------------------------------------------------------------------------------

def test_message_with_system_prompt(ac):
    m = ac.messages.create(model=MODEL_NAME, max_tokens=24, extra_body=T0, system=SYSTEM,
                           messages=[{"role": "user", "content": QUESTION}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == MODEL_NAME
    assert [b.type for b in m.content] == ["text"]
    assert "Paris" in text_of(m)
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.stop_sequence is None
    assert m.usage.input_tokens > 10 and 1 <= m.usage.output_tokens <= 24


def test_system_prompt_changes_the_prompt(ac):
    base = [{"role": "user", "content": QUESTION}]
    a = ac.messages.count_tokens(model=MODEL_NAME, messages=base)
    b = ac.messages.count_tokens(model=MODEL_NAME, messages=base, system=SYSTEM)
    # A list of text blocks is the same system prompt as the string.
    c = ac.messages.count_tokens(model=MODEL_NAME, messages=base,
                                 system=[{"type": "text", "text": SYSTEM}])
    # (SmolLM2's template writes a default system prompt of its own when there is none.)
    assert b.input_tokens != a.input_tokens
    assert c.input_tokens == b.input_tokens


def test_multi_turn_and_content_blocks(ac):
    m = ac.messages.create(model=MODEL_NAME, max_tokens=24, extra_body=T0, messages=MULTI)
    assert "Paris" in text_of(m)
    # The same conversation with content as a list of text blocks renders the same prompt.
    blocks = [{"role": x["role"], "content": [{"type": "text", "text": x["content"]}]} for x in MULTI]
    m2 = ac.messages.create(model=MODEL_NAME, max_tokens=24, extra_body=T0, messages=blocks)
    assert text_of(m2) == text_of(m)
    assert m2.usage.input_tokens == m.usage.input_tokens


def test_same_output_as_openai_chat(ac, client):
    msgs = [{"role": "system", "content": SYSTEM}] + MULTI
    o = client.chat.completions.create(model=MODEL_NAME, messages=msgs, temperature=0, max_tokens=32)
    m = ac.messages.create(model=MODEL_NAME, max_tokens=32, extra_body=T0, system=SYSTEM,
                           messages=MULTI)
    assert text_of(m) == o.choices[0].message.content
    assert m.usage.input_tokens == o.usage.prompt_tokens
    assert m.usage.output_tokens == o.usage.completion_tokens


def test_assistant_prefill_is_continued(ac, client):
    conv = [{"role": "user", "content": "Name three colours."},
            {"role": "assistant", "content": "The three colours are"}]
    m = ac.messages.create(model=MODEL_NAME, max_tokens=16, extra_body=T0, messages=conv)
    o = client.chat.completions.create(model=MODEL_NAME, messages=conv, temperature=0, max_tokens=16,
                                       extra_body={"continue_final_message": True,
                                                   "add_generation_prompt": False})
    assert text_of(m) == o.choices[0].message.content
    # Not a new assistant turn: differs from the reply to the user turn alone.
    n_prefill = ac.messages.count_tokens(model=MODEL_NAME, messages=conv).input_tokens
    assert m.usage.input_tokens == n_prefill == o.usage.prompt_tokens


# ---- streaming -------------------------------------------------------------------------------

def test_stream_helper_matches_non_stream(ac):
    kw = dict(model=MODEL_NAME, max_tokens=32, extra_body=T0, system=SYSTEM,
              messages=[{"role": "user", "content": QUESTION}])
    whole = ac.messages.create(**kw)
    with ac.messages.stream(**kw) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert len(pieces) > 1
    assert "".join(pieces) == text_of(whole)
    assert text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_stream_raw_event_order(ac):
    kw = dict(model=MODEL_NAME, max_tokens=16, extra_body=T0,
              messages=[{"role": "user", "content": QUESTION}])
    whole = ac.messages.create(**kw)
    events = list(ac.messages.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[0] == "message_start"
    assert types[-2:] == ["message_delta", "message_stop"]
    body = [t for t in types[1:-2] if t != "ping"]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}
    assert events[0].message.content == [] and events[0].message.usage.input_tokens == whole.usage.input_tokens
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert all(d.type == "text_delta" for d in deltas)
    assert "".join(d.text for d in deltas) == text_of(whole)
    md = events[-2]
    assert md.delta.stop_reason == whole.stop_reason
    assert md.usage.output_tokens == whole.usage.output_tokens


def test_stream_wire_format(server):
    """Each event is `event: NAME` + `data: {json}` whose type is NAME; no OpenAI [DONE]."""
    body = {"model": MODEL_NAME, "max_tokens": 4, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}
    status, hdrs, data = raw_post(server, "/v1/messages", body)
    assert status == 200 and hdrs["Content-Type"].startswith("text/event-stream")
    frames = [f for f in data.decode().split("\n\n") if f.strip()]
    assert frames
    for f in frames:
        lines = f.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: ")
        assert json.loads(lines[1][6:])["type"] == lines[0][7:]
    assert "[DONE]" not in data.decode()


# ---- stop conditions -------------------------------------------------------------------------

def test_max_tokens(ac):
    m = ac.messages.create(model=MODEL_NAME, max_tokens=5, extra_body=T0,
                           messages=[{"role": "user", "content": "Write a long story about a dragon."}])
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 5


def test_stop_sequences(ac):
    kw = dict(model=MODEL_NAME, max_tokens=32, extra_body=T0, system=SYSTEM,
              messages=[{"role": "user", "content": QUESTION}])
    free = text_of(ac.messages.create(**kw))
    assert "Paris" in free
    cut = free.index("Paris")
    m = ac.messages.create(stop_sequences=["Paris", "never-appears"], **kw)
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == "Paris"
    assert text_of(m) == free[:cut]
    with ac.messages.stream(stop_sequences=["Paris"], **kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == free[:cut]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "Paris"


# ---- count_tokens ----------------------------------------------------------------------------

def test_count_tokens_equals_usage(ac):
    for kw in (dict(system=SYSTEM, messages=[{"role": "user", "content": QUESTION}]),
               dict(messages=MULTI)):
        n = ac.messages.count_tokens(model=MODEL_NAME, **kw).input_tokens
        m = ac.messages.create(model=MODEL_NAME, max_tokens=2, extra_body=T0, **kw)
        assert n == m.usage.input_tokens > 0


def test_count_tokens_matches_tokenize(server, ac):
    n = ac.messages.count_tokens(model=MODEL_NAME, system=SYSTEM,
                                 messages=[{"role": "user", "content": QUESTION}]).input_tokens
    status, tok = server.json("POST", "/tokenize", {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "add_generation_prompt": True})
    assert status == 200 and n == tok["count"]


# ---- tools -----------------------------------------------------------------------------------

def test_forced_tool_use(ac):
    m = ac.messages.create(model=MODEL_NAME, max_tokens=48, extra_body=T0, tools=[WEATHER_TOOL],
                           tool_choice={"type": "tool", "name": "get_weather"},
                           messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    assert isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str)
    # Streamed, the input arrives as input_json_delta fragments that add up to the same object.
    with ac.messages.stream(model=MODEL_NAME, max_tokens=48, extra_body=T0, tools=[WEATHER_TOOL],
                            tool_choice={"type": "tool", "name": "get_weather"},
                            messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "input_json" in kinds
    fu = [b for b in final.content if b.type == "tool_use"]
    assert len(fu) == 1 and fu[0].input == uses[0].input and final.stop_reason == "tool_use"


def test_tool_choice_any_and_tool_result_turn(ac):
    m = ac.messages.create(model=MODEL_NAME, max_tokens=64, extra_body=T0, tools=[WEATHER_TOOL],
                           tool_choice={"type": "any"},
                           messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    assert m.stop_reason == "tool_use"
    use = next(b for b in m.content if b.type == "tool_use")
    # The call and its result go back as the next turns (tool_use / tool_result blocks).
    conv = [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                               "input": use.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "18 degrees and sunny"}]}]
    n_conv = ac.messages.count_tokens(model=MODEL_NAME, tools=[WEATHER_TOOL], messages=conv)
    n_first = ac.messages.count_tokens(model=MODEL_NAME, tools=[WEATHER_TOOL], messages=conv[:1])
    assert n_conv.input_tokens > n_first.input_tokens
    r = ac.messages.create(model=MODEL_NAME, max_tokens=16, extra_body=T0, tools=[WEATHER_TOOL],
                           tool_choice={"type": "none"}, messages=conv)
    assert r.stop_reason in ("end_turn", "max_tokens")
    assert all(b.type == "text" for b in r.content)


# ---- auth and errors -------------------------------------------------------------------------

def test_x_api_key(server):
    import anthropic
    good = anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0)
    assert good.messages.count_tokens(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}]).input_tokens > 0
    bad = anthropic.Anthropic(base_url=server.base, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as ei:
        bad.messages.create(model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert ei.value.status_code == 401
    assert ei.value.body["type"] == "error" and ei.value.body["error"]["type"] == "authentication_error"
    # x-api-key works on the OpenAI routes too; without any key: 401.
    status, _, _ = server.request("GET", "/v1/models", headers={"x-api-key": API_KEY})
    assert status == 200
    status, _, data = raw_post(server, "/v1/messages", {"max_tokens": 1, "messages": []}, key=None)
    assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error"


BAD = [
    ("missing max_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
    ("max_tokens not an int", {"max_tokens": "ten", "messages": [{"role": "user", "content": "hi"}]}),
    ("max_tokens zero", {"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}),
    ("missing messages", {"max_tokens": 4}),
    ("empty messages", {"max_tokens": 4, "messages": []}),
    ("messages not a list", {"max_tokens": 4, "messages": "hi"}),
    ("system role", {"max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]}),
    ("bad role", {"max_tokens": 4, "messages": [{"role": "wizard", "content": "hi"}]}),
    ("content a number", {"max_tokens": 4, "messages": [{"role": "user", "content": 5}]}),
    ("image block", {"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}),
    ("text block without text", {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    ("temperature above 1", {"max_tokens": 4, "temperature": 1.5, "messages": [{"role": "user", "content": "hi"}]}),
    ("stop_sequences not strings", {"max_tokens": 4, "stop_sequences": [1], "messages": [{"role": "user", "content": "hi"}]}),
    ("system a number", {"max_tokens": 4, "system": 3, "messages": [{"role": "user", "content": "hi"}]}),
    ("tool without schema", {"max_tokens": 4, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "hi"}]}),
    ("bad tool_choice", {"max_tokens": 4, "tool_choice": {"type": "sometimes"}, "messages": [{"role": "user", "content": "hi"}]}),
    ("tool_choice names no tool", {"max_tokens": 4, "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"},
                                   "messages": [{"role": "user", "content": "hi"}]}),
    ("max_tokens past the context", {"max_tokens": MAX_MODEL_LEN * 4, "messages": [{"role": "user", "content": "hi"}]}),
    ("prompt past the context", {"max_tokens": 4, "messages": [{"role": "user", "content": "word " * (MAX_MODEL_LEN * 2)}]}),
]


@pytest.mark.parametrize("name,body", BAD, ids=[b[0] for b in BAD])
def test_bad_requests(ac, name, body):
    import anthropic
    with pytest.raises(anthropic.BadRequestError) as ei:
        ac.post("/v1/messages", cast_to=object, body={"model": MODEL_NAME, **body})
    e = ei.value
    assert e.status_code == 400
    assert e.body["type"] == "error"
    assert e.body["error"]["type"] == "invalid_request_error"
    assert isinstance(e.body["error"]["message"], str) and e.body["error"]["message"]


def test_malformed_json_and_unknown_model(server, ac):
    import anthropic
    for body in (b"{", b"[1, 2]", b"", b"{} trailing"):
        status, hdrs, data = raw_post(server, "/v1/messages", body)
        j = json.loads(data)
        assert status == 400 and j["type"] == "error" and j["error"]["type"] == "invalid_request_error", (body, j)
    with pytest.raises(anthropic.NotFoundError) as ei:
        ac.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert ei.value.body["error"]["type"] == "not_found_error"
    status, _, data = server.request("GET", "/v1/messages", headers={"x-api-key": API_KEY})
    assert status == 405 and json.loads(data)["type"] == "error"
    status, _, data = raw_post(server, "/v1/messages/batches", {})
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found_error"


def test_body_too_large(server):
    from conftest import MAX_BODY
    body = {"model": MODEL_NAME, "max_tokens": 4,
            "messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
    status, _, data = raw_post(server, "/v1/messages", body)
    j = json.loads(data)
    assert status == 413 and j["type"] == "error" and j["error"]["type"] == "request_too_large"


def test_client_disconnect_mid_stream_aborts(server, ac):
    """A client that hangs up mid-stream has its request aborted (blocks freed), as on the
    OpenAI routes, and the server keeps serving."""
    from test_openai_api import metric
    before = metric(server.metrics(), "kaon:request_success_total", finished_reason="abort") or 0
    body = json.dumps({"model": MODEL_NAME, "max_tokens": 500, "stream": True,
                       "messages": [{"role": "user", "content": "Tell me a very long story."}]}).encode()
    sock = socket.create_connection((server.host, server.port))
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"x-api-key: " + API_KEY.encode() + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"content_block_delta") < 6:
        chunk = sock.recv(65536)
        assert chunk, "server closed the stream early"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200") and b"event: message_start" in got
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
    m = ac.messages.create(model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert m.usage.output_tokens >= 1


# ---- thinking ----------------------------------------------------------------------------------

# ChatML whose generation prompt opens a <think> block (as DeepSeek-R1's does): with the R1
# reasoning parser the output starts inside it, so (the model never closing it) all of it is
# reasoning, which must come back as a thinking block.
THINK_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                  "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    from conftest import Server
    path = tmp_path_factory.mktemp("tmpl") / "think.jinja"
    path.write_text(THINK_TEMPLATE)
    s = Server(["--api-key", API_KEY, "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory", "128M",
                "--served-model-name", MODEL_NAME, "--chat-template", str(path),
                "--reasoning-parser", "deepseek_r1"])
    yield s
    s.stop()


def test_thinking_blocks(think_server):
    import anthropic
    c = anthropic.Anthropic(base_url=think_server.base, api_key=API_KEY, max_retries=0, timeout=300)
    kw = dict(model=MODEL_NAME, max_tokens=12, extra_body=T0,
              messages=[{"role": "user", "content": "Why is the sky blue?"}])
    m = c.messages.create(**kw)
    assert m.content[0].type == "thinking" and m.content[0].thinking.strip()
    assert m.content[0].signature == ""
    events = list(c.messages.create(stream=True, **kw))
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts[0] == "thinking"
    thinking = "".join(e.delta.thinking for e in events
                       if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert thinking == m.content[0].thinking
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == m.content[0].thinking
