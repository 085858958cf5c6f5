// Pieces of the JSON Schema converter shared between its files (not a public interface).
#ifndef KAON_GRAMMAR_JSON_SCHEMA_INTERNAL_H
#define KAON_GRAMMAR_JSON_SCHEMA_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar/gbnf_text.h"

// Integers the grammars write have at most this many digits, so a model cannot loop on digits.
#define JS_MAX_INT_DIGITS 15
#define JS_MAX_INT_VALUE 999999999999999LL  // 10^15 - 1
#define JS_MAX_FRACTION_DIGITS 6

// Appends a GBNF expression (one parenthesized group) matching exactly the decimal texts of the
// integers in [lo, hi] as JSON writes them: no leading zeros, no "-0", no '+'.
// Both bounds must lie within +-JS_MAX_INT_VALUE and lo <= hi.
void js_int_range_expr(gbnf_text *out, int64_t lo, int64_t hi);

// Appends the rule `name` (helpers `name`-...) matching JSON string keys, quotes included, that
// are none of keys[0..n): no escapes, any other character. Returns the trie's node count (the
// number of helper rules) or -1 when out of memory.
int js_key_excluding(gbnf_text *out, const char *name, const char *const *keys, int n_keys);

#endif
