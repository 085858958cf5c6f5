// Regular expressions (the subset structured outputs use: JSON Schema `pattern`, vLLM's
// `regex`) turned into GBNF rules.
#ifndef KAON_GRAMMAR_REGEX_GBNF_H
#define KAON_GRAMMAR_REGEX_GBNF_H

#include <stdbool.h>
#include <stddef.h>

#include "grammar/gbnf_text.h"

// Appends to `out` the rule `name` (and helper rules named `name`-...) matching exactly the
// strings the regex re[0..len) fully matches (a leading ^ and trailing $ are accepted and
// change nothing; a pattern is anchored at both ends as vLLM's `regex` is). With json_string
// the rule matches the JSON-escaped form of those strings instead (what appears between the
// quotes of a JSON string: '"', '\' and control characters escaped). Returns 0, or -1 with
// kaon_last_error() naming the unsupported construct and its offset (backreferences,
// lookaround, ...).
int kaon_regex_to_gbnf(const char *re, size_t len, const char *name, bool json_string,
                       gbnf_text *out);

#endif
