"""End-to-end: tool calls and reasoning content through the official openai client.

The default model (SmolLM2-135M) has no tool template, so the requests bring their own
(`chat_template`): a Hermes-style one, whose <tool_call> marker makes the server pick the hermes
parser, and a thinking one ending the prompt with <think>. A few examples in the conversation
make the small model copy a call greedily.
"""
import json

import pytest

MODEL_NAME = "smol"
HERMES = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'tool' %}<tool_response>\n{{ m.content }}\n</tool_response>"
          "{% elif m.content %}{{ m.content }}{% endif %}"
          "{%- for tc in m.tool_calls or [] %}<tool_call>\n"
          "{{ {'name': tc.function.name, 'arguments': tc.function.arguments} | tojson }}\n"
          "</tool_call>{% endfor %}<|im_end|>\n{%- endfor %}"
          "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
THINKING = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
            "{# a thinking template: it knows </think> #}")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
COPY = ([{"role": "system", "content": "Copy the user's message exactly."}]
        + [{"role": r, "content": CALL} for _ in range(3) for r in ("user", "assistant")]
        + [{"role": "user", "content": CALL}])


def create(client, **kw):
    kw.setdefault("max_tokens", 40)
    return client.chat.completions.create(model=MODEL_NAME, temperature=0, **kw)


def test_tool_call_whole_and_streamed(client):
    r = create(client, messages=COPY, tools=TOOLS, extra_body={"chat_template": HERMES})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    assert c.message.content is None
    assert len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    # The stream: the same call, its name in the first delta, the arguments in fragments, and
    # no marker text leaking into content.
    content, calls, finish = "", {}, None
    for chunk in create(client, messages=COPY, tools=TOOLS, stream=True,
                        extra_body={"chat_template": HERMES}):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name
                calls[tc.index] = {"name": tc.function.name, "args": ""}
            else:
                assert tc.id is None and tc.function.name is None
            calls[tc.index]["args"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert calls == {0: {"name": "get_weather", "args": call.function.arguments}}


def test_tool_choice_none_leaves_text(client):
    r = create(client, messages=COPY, tools=TOOLS, tool_choice="none",
               extra_body={"chat_template": HERMES})
    c = r.choices[0]
    assert not c.message.tool_calls and c.finish_reason != "tool_calls"
    assert '"get_weather"' in c.message.content


def test_tool_conversation_renders(server, client):
    """An assistant turn with content null + tool_calls and a tool result go through the
    template: the model's own one and a Hermes one (arguments reach it as an object)."""
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = create(client, messages=msgs, tools=TOOLS, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    status, tok = server.json("POST", "/tokenize", {"messages": msgs, "tools": TOOLS,
                                                    "chat_template": HERMES,
                                                    "return_token_strs": True})
    assert status == 200, tok
    text = "".join(tok["token_strs"])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in text


def test_reasoning_content(client):
    """A prompt that ends inside <think>: the output is reasoning until </think>."""
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    r = create(client, messages=msgs, max_tokens=16, extra_body={"chat_template": THINKING})
    m = r.choices[0].message
    reasoning = m.model_extra.get("reasoning_content")
    assert isinstance(reasoning, str) and reasoning
    text = ""
    for chunk in create(client, messages=msgs, max_tokens=16, stream=True,
                        extra_body={"chat_template": THINKING}):
        if chunk.choices:
            text += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
    assert text == reasoning
    # Without a thinking template there is no reasoning_content.
    r = create(client, messages=msgs, max_tokens=4)
    assert r.choices[0].message.model_extra.get("reasoning_content") is None
