// Building GBNF text: a growing buffer and quoting. The converters (regex, JSON Schema,
// choices) write grammars as text and hand them to kaon_grammar_parse, so every grammar the
// server makes goes through the same parser and limits as one a user sends.
#ifndef KAON_GRAMMAR_GBNF_TEXT_H
#define KAON_GRAMMAR_GBNF_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct gbnf_text {
    char *s;      // NUL-terminated (NULL while empty)
    size_t len, cap;
    bool oom;     // an allocation failed: the text is incomplete
} gbnf_text;

void gbnf_text_free(gbnf_text *t);
void gbnf_append(gbnf_text *t, const char *s, size_t n);
void gbnf_puts(gbnf_text *t, const char *s);
void gbnf_printf(gbnf_text *t, const char *fmt, ...) KAON_PRINTF(2, 3);
// A GBNF string literal matching exactly bytes s[0..n): "..." with \" \\ \n \r \t and \xHH
// escapes for other control bytes (UTF-8 passes through).
void gbnf_literal(gbnf_text *t, const char *s, size_t n);
// One code point inside a character class [...]: escapes ] [ \ ^ - and control characters.
void gbnf_class_char(gbnf_text *t, uint32_t cp);

#endif
