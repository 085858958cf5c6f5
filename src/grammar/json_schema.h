// JSON Schema (OpenAI's strict subset and what Pydantic emits) turned into a GBNF grammar that
// generates exactly the JSON texts the schema accepts.
#ifndef KAON_GRAMMAR_JSON_SCHEMA_H
#define KAON_GRAMMAR_JSON_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>

#include "grammar/gbnf_text.h"

typedef struct kaon_json_schema_opts {
    // Whitespace the grammar lets the model write between tokens: false (the default) allows
    // exactly one optional space after ':' and ',' and none elsewhere, so a small model cannot
    // loop on newlines; true allows JSON's whitespace, bounded.
    bool any_whitespace;
    // Objects without "additionalProperties": false accept no other keys (OpenAI strict).
    bool strict;
    // Recursive $refs: how deep a target may nest inside itself (0: the default,
    // KAON_JSON_SCHEMA_REF_DEPTH; < 0: no limit). At the limit the recursive member is left
    // out where the schema allows it (an optional property, the rest of an array with no
    // minimum beyond its prefix, an anyOf member), so a model at temperature 0 cannot nest
    // forever; a schema that requires deeper nesting keeps its exact recursive grammar.
    int max_ref_depth;
    // n > 0: strings without maxLength (and free-form keys and values) hold at most n
    // characters, as integers hold at most 15 digits, so a model at temperature 0 cannot loop
    // inside one forever; email addresses (<= 254 characters, RFC 5321) shrink to it (local
    // part <= min(64, n / 2), the 5 labels share the rest). 0 (the default,
    // KAON_JSON_SCHEMA_MAX_STRING) or < 0: no limit: a cap would refuse valid long fields (a
    // summary, an answer), which users of vLLM or llama.cpp do not expect; it is an opt-in.
    int max_string_length;
} kaon_json_schema_opts;

#define KAON_JSON_SCHEMA_REF_DEPTH 6
#define KAON_JSON_SCHEMA_MAX_STRING (-1)

// Supported: type (and type lists; no type = any value, each kind constrained by its own
// keywords), properties in the schema's order with required/optional members,
// additionalProperties (false, true, a schema; absent = any further keys unless strict; extra
// keys are escape-free strings other than the listed ones), enum/const (any JSON values),
// anyOf, oneOf (as anyOf: overlapping branches are not excluded), allOf of one schema or of
// plain object schemas (merged), local $ref (#, #/$defs/..., #/definitions/..., recursion
// through an object or array), items/prefixItems/minItems/maxItems (<= 1024),
// minLength/maxLength (<= 1024), pattern (kaon_regex_to_gbnf), format date, time, date-time,
// uuid, email, ipv4 (others ignored), integer bounds exactly (|x| < 1e15). Conservative
// choices: integers have at most 15 digits, fractions at most 6; bounded numbers are the
// integers in range plus fractions whose integer part and its successor are in range (no
// exponents).
// Errors: not, if/then/else, multipleOf, patternProperties, min/maxProperties, contains,
// uniqueItems: true, other allOfs, combinators beside other constraints.
// Appends rules to `out` with the root rule `root` (helper rules are prefixed with it).
// schema_json[0..len) is the schema text; "{}" or `true` means any JSON value. Returns 0, or
// -1 with kaon_last_error() naming the unsupported or malformed part by its JSON pointer.
int kaon_json_schema_to_gbnf(const char *schema_json, size_t len, const char *root,
                             const kaon_json_schema_opts *opts, gbnf_text *out);
// The grammar of any JSON value (json_object mode: `object_only` forces an object at the top).
int kaon_json_any_to_gbnf(const char *root, bool object_only, const kaon_json_schema_opts *opts,
                          gbnf_text *out);

#endif
