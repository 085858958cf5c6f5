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
} kaon_json_schema_opts;

// Appends rules to `out` with the root rule `root` (helper rules are prefixed with it).
// schema_json[0..len) is the schema text; "{}" or `true` means any JSON value. Returns 0, or
// -1 with kaon_last_error() naming the unsupported or malformed part by its JSON pointer.
int kaon_json_schema_to_gbnf(const char *schema_json, size_t len, const char *root,
                             const kaon_json_schema_opts *opts, gbnf_text *out);
// The grammar of any JSON value (json_object mode: `object_only` forces an object at the top).
int kaon_json_any_to_gbnf(const char *root, bool object_only, const kaon_json_schema_opts *opts,
                          gbnf_text *out);

#endif
