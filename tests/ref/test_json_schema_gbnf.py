"""JSON Schema -> GBNF against the `jsonschema` package (Draft 2020-12, formats checked).

For each schema, through tests/json_schema_check (built with the unit tests):
  (a) texts sampled at random from the grammar must all be valid JSON that validates;
  (b) valid instances written canonically (schema key order, with ',' ':' or ', ' ': ') must be
      accepted, and mutations of them (text edits, dropped/added keys, wrong values) must get
      the grammar's "accept" only where jsonschema agrees.
Fixed seeds.
"""
import enum
import json
import random
import subprocess
import uuid
from datetime import date
from typing import Literal, Optional, Union

import jsonschema
import pytest
from pydantic import BaseModel, Field

from conftest import build_dir


def checker_exe():
    exe = build_dir() / "tests" / "json_schema_check"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build the tests first (or set KAON_BUILD)")
    return exe


# ---- Pydantic-generated schemas ----

class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    street: str
    city: str = Field(max_length=12)
    zip: Optional[str] = None


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)
    email: Optional[str] = None
    tags: list[str] = Field(default_factory=list, max_length=3)
    address: Address
    color: Color = Color.red
    kind: Literal["a", "b"] = "a"


class TreeNode(BaseModel):
    value: int
    children: list["TreeNode"] = []


class Item(BaseModel):
    id: uuid.UUID
    created: date
    price: float = Field(gt=0, lt=1000)
    qty: int = Field(ge=1)


class Cat(BaseModel):
    meow: bool


class Dog(BaseModel):
    bark: int = Field(ge=0, le=3)


class Pets(BaseModel):
    pet: Union[Cat, Dog]
    pair: tuple[int, str]
    scores: dict[str, int] = {}


PYDANTIC = [
    (Person, [Person(name="Ann", age=30, address=Address(street="Main", city="Oslo")),
              Person(name="Bo", age=0, email="b@x.io", tags=["x", "y"], color=Color.blue, kind="b",
                     address=Address(street="S", city="C", zip="123"))]),
    (TreeNode, [TreeNode(value=1), TreeNode(value=2, children=[TreeNode(value=3, children=[TreeNode(value=-4)])])]),
    (Item, [Item(id=uuid.UUID(int=12345), created=date(2024, 5, 17), price=9.5, qty=2)]),
    (Pets, [Pets(pet=Cat(meow=True), pair=(1, "a")), Pets(pet=Dog(bark=3), pair=(-2, ""), scores={"x": 1})]),
]

# ---- hand-written schemas: (schema, valid instances) ----

OBJ_AB = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a"], "additionalProperties": False}
SCHEMAS = [
    ({"type": "string"}, ["", "x", "é中\n\"\\"]),
    ({"type": "integer"}, [0, -7, 123456789]),
    ({"type": "number"}, [0, -1.5, 3.25, 1e10]),
    ({"type": "boolean"}, [True, False]),
    ({"type": "null"}, [None]),
    ({}, [1, "s", [1, {"a": None}], {"k": [True]}]),
    ({"type": ["string", "null"]}, ["x", None]),
    ({"type": ["integer", "boolean"], "minimum": 1, "maximum": 3}, [1, 3, True]),
    (OBJ_AB, [{"a": 1}, {"a": 2, "b": "x"}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                       "c": {"type": "integer"}}, "required": ["b"],
      "additionalProperties": False}, [{"b": 1}, {"a": 1, "b": 2}, {"b": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
     [{}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"a": 1, "zz": [1]}]),
    ({"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"],
      "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}}, [{"x": True}, {"x": False, "y": 3}]),
    ({"type": "object"}, [{}, {"a": 1}]),
    ({"type": "object", "additionalProperties": False}, [{}]),
    ({"type": "object", "additionalProperties": {"type": "string", "maxLength": 2}}, [{}, {"k": "ab", "j": ""}]),
    ({"enum": ["red", "green", 1, None, {"a": [1, 2]}, True]}, ["red", 1, None, {"a": [1, 2]}, True]),
    ({"type": "string", "enum": ["a", "b", 3]}, ["a", "b"]),
    ({"const": "fixed"}, ["fixed"]),
    ({"const": {"k": [1, "x"]}}, [{"k": [1, "x"]}]),
    ({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]}, [0, 9, False]),
    ({"oneOf": [{"type": "string", "maxLength": 2}, {"type": "array", "items": {"type": "integer"}}]},
     ["ab", [], [1, 2]]),
    ({"allOf": [{"type": "string", "minLength": 1}]}, ["a"]),
    ({"type": "integer", "minimum": 0, "maximum": 150}, [0, 9, 10, 99, 100, 150]),
    ({"type": "integer", "minimum": -5, "maximum": 5}, [-5, 0, 5]),
    ({"type": "integer", "minimum": 1}, [1, 10, 999999]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000}, [1, 999]),
    ({"type": "integer", "minimum": -1234, "maximum": -17}, [-1234, -17, -100]),
    ({"type": "integer", "minimum": 7, "maximum": 7}, [7]),
    ({"type": "integer", "minimum": 99, "maximum": 1001}, [99, 100, 1000, 1001]),
    ({"type": "integer", "maximum": -3}, [-3, -1000]),
    ({"type": "integer", "minimum": 2.5, "maximum": 4.5}, [3, 4]),
    ({"type": "number", "minimum": 0, "maximum": 10}, [0, 10, 9.5, 0.25]),
    ({"type": "number", "exclusiveMinimum": 0}, [1, 2.5]),
    ({"type": "number", "minimum": -10, "maximum": -1}, [-10, -1, -9.5, -1.25]),
    ({"type": "number", "minimum": -1, "maximum": 1}, [-1, -0.5, 0, 0.75, 1]),
    ({"type": "number", "exclusiveMinimum": -3, "exclusiveMaximum": 0}, [-2, -2.5, -1.5]),
    ({"type": "array"}, [[], [1, "a"]]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [[1, 2], [1, 2, 3]]),
    ({"type": "array", "items": {"type": "string"}, "minItems": 1}, [["a"], ["a", "b", "c"]]),
    ({"type": "array", "items": {"type": "boolean"}, "maxItems": 0}, [[]]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
     [[], ["a"], ["a", 1]]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2,
      "items": {"type": "boolean"}, "maxItems": 4}, [["a", 1], ["a", 1, True], ["a", 1, True, False]]),
    ({"type": "array", "prefixItems": [{"type": "null"}, {"type": "null"}, {"type": "null"}], "maxItems": 2},
     [[], [None], [None, None]]),
    ({"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3},
                                 "maxItems": 2}, "maxItems": 3}, [[], [[0, 3], [], [1]]]),
    ({"type": "string", "minLength": 2, "maxLength": 3}, ["ab", "a\nb", "éé"]),
    ({"type": "string", "maxLength": 0}, [""]),
    ({"type": "string", "format": "date"}, ["2024-02-28", "1999-12-31"]),
    ({"type": "string", "format": "date-time"}, ["2024-02-28T10:20:30Z", "2024-02-28T10:20:30.5+01:00"]),
    ({"type": "string", "format": "time"}, ["10:20:30Z"]),
    ({"type": "string", "format": "uuid"}, ["123e4567-e89b-12d3-a456-426614174000"]),
    ({"type": "string", "format": "email"}, ["a.b@example.com"]),
    ({"type": "string", "format": "ipv4"}, ["192.168.0.1", "0.0.0.0"]),
    ({"type": "string", "format": "unknown-format"}, ["anything"]),
    ({"type": "string", "pattern": "^[a-z]+[0-9]?$"}, ["abc", "ab1"]),
    ({"type": "string", "pattern": "^\\d{3}-\\d{4}$"}, ["555-1234"]),
    ({"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["v", "next"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
     [{"v": 1, "next": None}, {"v": 1, "next": {"v": 2, "next": None}}]),
    ({"type": "array", "items": {"$ref": "#"}, "maxItems": 3}, [[], [[], [[]]]]),
    ({"definitions": {"pos": {"type": "integer", "minimum": 1}}, "type": "object",
      "properties": {"x": {"$ref": "#/definitions/pos"}, "y": {"$ref": "#/definitions/pos"}},
      "required": ["x", "y"], "additionalProperties": False}, [{"x": 1, "y": 20}]),
    ({"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1}, "roles": {"type": "array", "items": {
                "enum": ["admin", "dev"]}, "maxItems": 2}}, "required": ["id", "roles"],
            "additionalProperties": False},
        "active": {"type": "boolean"}}, "required": ["user"], "additionalProperties": False},
     [{"user": {"id": 5, "roles": []}}, {"user": {"id": 1, "roles": ["dev", "admin"]}, "active": False}]),
    ({"minimum": 3, "maximum": 4}, [3, 4, "s", None, [1]]),
    ({"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
      "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"name": {"type": "string"}}}]},
     [{"id": 1}, {"id": 1, "name": "x"}]),
    ({"type": "object", "properties": {"a~/\"b": {"type": "integer"}}, "required": ["a~/\"b"],
      "additionalProperties": False}, [{"a~/\"b": 1}]),
    ({"type": "object", "properties": {"é": {"type": "null"}}}, [{"é": None}, {}, {"e": 1}]),
]


def run(mode, schema_path, *args, stdin=None):
    r = subprocess.run([str(checker_exe()), mode, str(schema_path), *map(str, args)], input=stdin,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"json_schema_check {mode} failed: {r.stderr[:2000]}"
    return r.stdout


def validator(schema):
    cls = jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def dumps_canon(v, sep):
    return json.dumps(v, separators=sep, ensure_ascii=False)


def mutations(text, value, rng):
    out = []
    alphabet = ' ,:{}[]"0123a-.e\\'
    for _ in range(12):
        if not text:
            break
        i = rng.randrange(len(text))
        out.append(text[:i] + text[i + 1:])
        out.append(text[:i] + rng.choice(alphabet) + text[i:])
        out.append(text[:i] + rng.choice(alphabet) + text[i + 1:])
    for other in (None, True, "x", 1.5, -1, 10**6, [], {}, "2024-13-01", 0):
        if other != value:
            out.append(json.dumps(other))
    if isinstance(value, dict):
        for k in list(value):
            d = dict(value)
            del d[k]
            out.append(json.dumps(d, separators=(",", ":"), ensure_ascii=False))
            d = dict(value)
            d[k] = "wrong" if not isinstance(value[k], str) else 12
            out.append(json.dumps(d, separators=(",", ":"), ensure_ascii=False))
        d = dict(value)
        d["zz_extra"] = 1
        out.append(json.dumps(d, separators=(",", ":")))
        out.append(json.dumps(dict(reversed(list(value.items()))), separators=(",", ":")))
    if isinstance(value, list):
        out.append(json.dumps(value + [value[-1] if value else 1], separators=(",", ":")))
        if value:
            out.append(json.dumps(value[:-1], separators=(",", ":")))
    return [m for m in out if "\n" not in m]


def all_cases():
    cases = [(f"s{i}", s, v) for i, (s, v) in enumerate(SCHEMAS)]
    for model, insts in PYDANTIC:
        cases.append((model.__name__, model.model_json_schema(), [m.model_dump(mode="json") for m in insts]))
    return cases


CASES = all_cases()


def test_case_count():
    assert len(CASES) >= 60


@pytest.mark.parametrize("name,schema,valid", CASES, ids=[c[0] for c in CASES])
def test_schema_against_jsonschema(name, schema, valid, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    v = validator(schema)
    # (a) samples from the grammar are valid
    samples = run("gen", path, 40, 1234).splitlines()
    assert len(samples) == 40
    for text in samples:
        inst = json.loads(text)
        errs = list(v.iter_errors(inst))
        assert not errs, f"{name}: grammar produced invalid {text!r}: {errs[0].message}"
    # (b) canonical valid instances accepted; mutations accepted only when valid
    texts, must_accept = [], []
    for inst in valid:
        v.validate(inst)
        for sep in ((",", ":"), (", ", ": ")):
            texts.append(dumps_canon(inst, sep))
            must_accept.append(True)
    rng = random.Random(sum(map(ord, name)) * 7919 + len(texts))
    for inst, text in list(zip(valid, texts[::2])) + [(json.loads(s), s) for s in samples[:5]]:
        for m in mutations(text, inst, rng):
            texts.append(m)
            must_accept.append(False)
    verdicts = run("check", path, stdin="\n".join(texts) + "\n").split()
    assert len(verdicts) == len(texts)
    rejected = 0
    for text, must, verdict in zip(texts, must_accept, verdicts):
        if must:
            assert verdict == "1", f"{name}: grammar rejects valid {text!r}"
            continue
        if verdict == "1":
            try:
                inst = json.loads(text)
            except ValueError:
                pytest.fail(f"{name}: grammar accepts non-JSON {text!r}")
            errs = list(v.iter_errors(inst))
            assert not errs, f"{name}: grammar accepts invalid {text!r}: {errs[0].message}"
        else:
            rejected += 1
    assert rejected > 0


def test_unsupported_schema_fails(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}))
    r = subprocess.run([str(checker_exe()), "gbnf", str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and "#/properties/n" in r.stderr
