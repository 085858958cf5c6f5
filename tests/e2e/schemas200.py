"""200 JSON Schemas written for the structured-output tests (issue 21): nested objects, enums,
arrays with bounds, string patterns and formats, optional and nullable fields, anyOf, $defs with
$ref (recursive too), integer ranges. Built from a fixed seed, so every run asks the same 200;
each comes with a prompt that tells the model what to describe.
"""
import random

TOPICS = ["a person", "a city", "a book", "a recipe", "a car", "a planet", "a song", "a company",
          "a football match", "a hotel", "a laptop", "a museum", "a flight", "a dog", "a movie",
          "a tree", "a bank account", "a weather report", "a train", "a restaurant"]
WORDS = ["name", "title", "kind", "label", "colour", "owner", "city", "country", "brand", "genre",
         "status", "level", "mood", "size", "tag", "code", "author", "style", "model", "origin"]
ENUMS = [["red", "green", "blue"], ["small", "medium", "large"], ["low", "high"],
         ["draft", "published", "archived"], ["cat", "dog", "bird", "fish"], ["yes", "no"],
         ["north", "south", "east", "west"], ["A", "B", "C", "D", "E"]]
PATTERNS = [r"^[A-Z]{2}-[0-9]{3}$", r"^[a-z]{3,8}$", r"^\+?[0-9]{6,10}$", r"^[A-Z][a-z]{1,10}$",
            r"^(alpha|beta|gamma)-[0-9]{1,2}$", r"^[0-9]{4}-[0-9]{2}$", r"^#[0-9a-f]{6}$"]
FORMATS = ["date", "date-time", "email", "uuid", "time"]


def _string(rng):
    r = rng.random()
    if r < 0.30:
        return {"type": "string", "maxLength": rng.choice([8, 16, 24, 40])}
    if r < 0.45:
        return {"type": "string", "minLength": 1, "maxLength": rng.choice([12, 30])}
    if r < 0.65:
        return {"type": "string", "enum": rng.choice(ENUMS)}
    if r < 0.82:
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if r < 0.92:
        return {"type": "string", "format": rng.choice(FORMATS)}
    return {"type": "string"}  # unbounded: the model must close it on its own


def _number(rng):
    r = rng.random()
    if r < 0.4:
        lo = rng.choice([0, 1, -10, 1900])
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([9, 100, 150, 5000])}
    if r < 0.6:
        return {"type": "integer"}
    if r < 0.8:
        return {"type": "number"}
    return {"type": "number", "minimum": 0, "maximum": 1}


def _leaf(rng):
    r = rng.random()
    if r < 0.45:
        return _string(rng)
    if r < 0.75:
        return _number(rng)
    if r < 0.87:
        return {"type": "boolean"}
    if r < 0.94:
        return {"anyOf": [_string(rng), {"type": "null"}]}
    return {"const": rng.choice(["v1", "fixed", 42, True])}


def _value(rng, depth):
    r = rng.random()
    if depth > 0 and r < 0.22:
        return _object(rng, depth - 1)
    if r < 0.40:
        items = _object(rng, depth - 1) if depth > 0 and rng.random() < 0.3 else _leaf(rng)
        arr = {"type": "array", "items": items}
        lo = rng.choice([0, 1, 2])
        arr["minItems"] = lo
        arr["maxItems"] = lo + rng.choice([1, 2, 3])
        return arr
    if r < 0.46:
        return {"anyOf": [_leaf(rng), _leaf(rng)]}
    return _leaf(rng)


def _object(rng, depth):
    n = rng.randint(1, 5)
    keys = rng.sample(WORDS, n)
    props = {k: _value(rng, depth) for k in keys}
    required = [k for k in keys if rng.random() < 0.7] or keys[:1]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def _with_defs(rng):
    item = _object(rng, 0)
    root = _object(rng, 1)
    root["properties"]["items"] = {"type": "array", "items": {"$ref": "#/$defs/item"},
                                   "minItems": 1, "maxItems": 3}
    root["required"] = sorted(set(root["required"]) | {"items"}, key=list(root["properties"]).index)
    root["$defs"] = {"item": item}
    return root


def _recursive(rng):
    return {"$defs": {"node": {"type": "object",
                               "properties": {"label": {"type": "string", "maxLength": 12},
                                              "children": {"type": "array", "maxItems": 2,
                                                           "items": {"$ref": "#/$defs/node"}}},
                               "required": ["label"], "additionalProperties": False}},
            "$ref": "#/$defs/node"}


def make_schemas(n=200, seed=2026):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.12:
            s = _with_defs(rng)
        elif r < 0.16:
            s = _recursive(rng)
        else:
            s = _object(rng, rng.choice([0, 1, 1, 2]))
        topic = TOPICS[i % len(TOPICS)]
        out.append({"name": f"schema_{i:03d}", "schema": s,
                    "prompt": f"Describe {topic} as JSON with the fields asked for."})
    return out
