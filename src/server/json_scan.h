// Small JSON pieces the output parsers (tool_parser.c) read as text arrives: where a value ends
// when its bytes come in chunks, where a string literal ends, and a string literal's decoded
// bytes. No allocation but the decoded string; no global state (unlike cJSON's parser, whose
// error position is shared between threads).
#ifndef KAON_SERVER_JSON_SCAN_H
#define KAON_SERVER_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>

// The scan of one JSON value, resumable: zero it before the value's first byte.
typedef struct kaon_json_scan {
    char kind;        // 0 before the first byte; '{' (object or array), '"' (string), 'a' (other)
    int depth;
    bool in_str, esc;
} kaon_json_scan;

static inline bool kaon_json_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Scans s[*pos..len), advancing *pos over the value's bytes. 1: the value ended at *pos; 0: it
// goes on past len (final: the text ends there; numbers and literals then end at len); -1: no
// JSON value starts at *pos. Only brackets and strings are tracked, not full validity.
int kaon_json_scan_step(kaon_json_scan *v, const char *s, size_t len, size_t *pos, bool final);

// s[0] is '"': 1 with *end just past the closing quote; 0 when the string goes on past n; -1
// when a control character makes it invalid.
int kaon_json_string_end(const char *s, size_t n, size_t *end);
// The decoded bytes of the string literal s[0..n) (quotes included), malloc'd; NULL when it is
// invalid (a bad escape, a lone surrogate, an embedded NUL) or out of memory.
char *kaon_json_unescape(const char *s, size_t n);

#endif
