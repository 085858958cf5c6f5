"""End-to-end: structured outputs through the official openai client against `kaon serve`.

Every constrained output that finishes must parse and match what was asked, whatever the small
default model would have said on its own: choices, regexes, GBNF grammars, json_object, JSON
Schemas (also through the client's Pydantic `.parse`), and tool_choice "required" / a named
function, whose arguments must validate against the function's parameters. Checked with
outside references: Python's `re`, `json`, `jsonschema` and Pydantic.
"""
import json
import re

import jsonschema
import pydantic
import pytest

MODEL_NAME = "smol"
ASK = [{"role": "user", "content": "Describe a person called Ada who lives in London."}]


def create(client, **kw):
    kw.setdefault("max_tokens", 200)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL_NAME, messages=kw.pop("messages", ASK), **kw)


def finished(choices):
    """The choices that ended on their own (not cut by max_tokens); at least one must."""
    done = [c for c in choices if c.finish_reason in ("stop", "tool_calls")]
    assert done, [c.finish_reason for c in choices]
    return done


def test_choice_at_temperature_one(client):
    options = ["yes", "no", "maybe so"]
    r = create(client, n=6, temperature=1.0, seed=7,
               extra_body={"structured_outputs": {"choice": options}})
    assert len(r.choices) == 6
    for c in r.choices:
        assert c.finish_reason == "stop"
        assert c.message.content in options


def test_guided_choice_completions(client):
    r = client.completions.create(model=MODEL_NAME, prompt="The sky is", max_tokens=20,
                                  temperature=0, extra_body={"guided_choice": ["blue", "green"]})
    assert r.choices[0].text in ("blue", "green")
    assert r.choices[0].finish_reason == "stop"


def test_regex(client):
    pattern = r"[A-Z][a-z]{2,8} (lives|works) in [A-Z][a-z]+\."
    r = create(client, n=3, temperature=1.0, seed=3,
               extra_body={"structured_outputs": {"regex": pattern}})
    for c in finished(r.choices):
        assert re.fullmatch(pattern, c.message.content), c.message.content


def test_grammar_streamed(client):
    gbnf = ('root ::= "Ada is " age " years old and likes " thing "."\n'
            'age ::= [1-9] [0-9]?\n'
            'thing ::= "tea" | "maths" | "engines"\n')
    text, finish = "", None
    for chunk in create(client, stream=True, extra_body={"structured_outputs": {"grammar": gbnf}}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert re.fullmatch(r"Ada is [1-9][0-9]? years old and likes (tea|maths|engines)\.", text), text


def test_json_object(client):
    r = create(client, n=2, temperature=1.0, seed=11, max_tokens=300,
               response_format={"type": "json_object"})
    for c in finished(r.choices):
        assert isinstance(json.loads(c.message.content), dict), c.message.content


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["London", "Paris", "Tokyo"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}


def test_json_schema_strict(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA,
                                                   "strict": True}}
    for kw in ({}, {"temperature": 1.0, "seed": 5, "n": 3}):
        r = create(client, response_format=fmt, max_tokens=256, **kw)
        for c in finished(r.choices):
            jsonschema.validate(json.loads(c.message.content), PERSON_SCHEMA)


class Pet(pydantic.BaseModel):
    kind: str = pydantic.Field(max_length=12)
    legs: int = pydantic.Field(ge=0, le=8)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int = pydantic.Field(ge=0, le=120)
    city: str = pydantic.Field(max_length=20)
    pets: list[Pet] = pydantic.Field(max_length=2)
    nickname: str | None = None


def test_openai_parse_with_pydantic(client):
    for parse in (client.chat.completions.parse, client.beta.chat.completions.parse):
        r = parse(model=MODEL_NAME, messages=ASK, response_format=Person, max_tokens=256,
                  temperature=0)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", msg.content
        assert isinstance(msg.parsed, Person), msg
        assert msg.parsed == Person.model_validate_json(msg.content)


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 30},
                                      "unit": {"type": "string", "enum": ["C", "F"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers",
        "parameters": {"type": "object",
                       "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                      "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                       "required": ["a", "b"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_named_tool_choice(client):
    choice = {"type": "function", "function": {"name": "add"}}
    r = create(client, messages=WEATHER, tools=TOOLS, tool_choice=choice, n=3, temperature=1.0,
               seed=2)
    for c in r.choices:
        assert c.finish_reason == "stop"  # as OpenAI answers a forced function
        assert c.message.content is None
        (call,) = c.message.tool_calls
        assert call.function.name == "add" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), PARAMS["add"])


def test_required_tool_choice_streamed_and_whole(client):
    r = create(client, messages=WEATHER, tools=TOOLS, tool_choice="required")
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message
    assert c.message.tool_calls
    for call in c.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    calls = {}
    for chunk in create(client, messages=WEATHER, tools=TOOLS, tool_choice="required", stream=True):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(tc.index, {"name": tc.function.name, "args": ""})
            entry["args"] += tc.function.arguments or ""
    assert [(v["name"], json.loads(v["args"])) for _, v in sorted(calls.items())] == \
        [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]
    # Sampled: every call of every choice names a tool and validates against its parameters.
    r = create(client, messages=WEATHER, tools=TOOLS, tool_choice="required", n=4,
               temperature=1.0, seed=9, max_tokens=300)
    for c in finished(r.choices):
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, c.message
        for call in c.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= undefined_rule"}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a+"}, "guided_choice": ["x"]}, "guided_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
])
def test_bad_structured_requests(server, body, param):
    status, j = server.json("POST", "/v1/chat/completions",
                            {"model": MODEL_NAME, "messages": ASK, "max_tokens": 5, **body})
    assert status == 400, j
    assert j["error"]["param"] == param, j
    assert j["error"]["type"] == "invalid_request_error"
