// Byte buffers for HTTP bodies, Server-Sent Events framing, and UTF-8 repair for JSON output.
#ifndef KAON_SERVER_SSE_H
#define KAON_SERVER_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"

// A growable byte buffer, always NUL-terminated when data != NULL. After a failed append
// (out of memory or size overflow) `failed` stays set and further appends are no-ops.
typedef struct kaon_sbuf {
    char *data;
    size_t len, cap;
    bool failed;
} kaon_sbuf;

int kaon_sbuf_append(kaon_sbuf *b, const void *p, size_t n);
int kaon_sbuf_puts(kaon_sbuf *b, const char *s);
int kaon_sbuf_printf(kaon_sbuf *b, const char *fmt, ...) KAON_PRINTF(2, 3);
// Drops the first n bytes (n <= len).
void kaon_sbuf_consume(kaon_sbuf *b, size_t n);
// Hands the data to the caller (malloc'd, NUL-terminated; "" when empty) and resets b.
char *kaon_sbuf_take(kaon_sbuf *b, size_t *len);
void kaon_sbuf_free(kaon_sbuf *b);

// One SSE event: every line of payload becomes a `data: ` line, then a blank line.
int kaon_sse_data(kaon_sbuf *b, const char *payload, size_t n);
// A named event (Anthropic's streams): `event: name`, then the payload as kaon_sse_data.
int kaon_sse_event(kaon_sbuf *b, const char *name, const char *payload, size_t n);
// The OpenAI end-of-stream marker `data: [DONE]`.
int kaon_sse_done(kaon_sbuf *b);

// Appends s[0..n) as valid UTF-8 for cJSON: each invalid sequence (stray continuation,
// overlong form, surrogate, > U+10FFFF, truncated) becomes U+FFFD, as does NUL (cJSON strings
// are C strings). Returns the number of replacements, or -1 when the append failed.
int kaon_utf8_sanitize(kaon_sbuf *out, const char *s, size_t n);
// Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence.
size_t kaon_utf8_complete_prefix(const char *s, size_t n);

#endif
