#include "server/sse.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sbuf_reserve(kaon_sbuf *b, size_t extra) {
    if (b->failed) return -1;
    if (extra > SIZE_MAX - b->len - 1) {
        b->failed = true;
        return kaon_set_error("buffer size overflow");
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return kaon_set_error("out of memory (%zu bytes)", cap);
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

int kaon_sbuf_append(kaon_sbuf *b, const void *p, size_t n) {
    if (sbuf_reserve(b, n)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

int kaon_sbuf_puts(kaon_sbuf *b, const char *s) { return kaon_sbuf_append(b, s, strlen(s)); }

int kaon_sbuf_printf(kaon_sbuf *b, const char *fmt, ...) {
    if (b->failed) return -1;
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return kaon_set_error("format error");
    }
    if ((size_t)n < sizeof small) return kaon_sbuf_append(b, small, (size_t)n);
    if (sbuf_reserve(b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void kaon_sbuf_consume(kaon_sbuf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = 0;
}

char *kaon_sbuf_take(kaon_sbuf *b, size_t *len) {
    char *p = b->data;
    size_t n = b->len;
    if (!p) {
        p = malloc(1);
        if (p) p[0] = 0;
        n = 0;
    }
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
    if (len) *len = n;
    return p;
}

void kaon_sbuf_free(kaon_sbuf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

int kaon_sse_data(kaon_sbuf *b, const char *payload, size_t n) {
    // A payload with line breaks is split into several data: lines (the SSE spec joins them
    // back with '\n'); cJSON's compact output never has any, but this stays correct anyway.
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || payload[i] == '\n' || payload[i] == '\r') {
            kaon_sbuf_append(b, "data: ", 6);
            kaon_sbuf_append(b, payload + start, i - start);
            kaon_sbuf_append(b, "\n", 1);
            if (i < n && payload[i] == '\r' && i + 1 < n && payload[i + 1] == '\n') i++;
            start = i + 1;
        }
    }
    kaon_sbuf_append(b, "\n", 1);
    return b->failed ? -1 : 0;
}

int kaon_sse_event(kaon_sbuf *b, const char *name, const char *payload, size_t n) {
    kaon_sbuf_printf(b, "event: %s\n", name);
    return kaon_sse_data(b, payload, n);
}

int kaon_sse_done(kaon_sbuf *b) { return kaon_sbuf_append(b, "data: [DONE]\n\n", 14); }

// Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid or truncated.
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0;  // overlong
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;                              // surrogate
    if (cp > 0x10FFFF) return 0;
    return len;
}

int kaon_utf8_sanitize(kaon_sbuf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    int replaced = 0;
    size_t run = 0;  // start of the current run of valid bytes
    size_t i = 0;
    while (i < n) {
        size_t l = u[i] ? utf8_seq_len(u + i, n - i) : 0;
        if (l) {
            i += l;
            continue;
        }
        kaon_sbuf_append(out, s + run, i - run);
        kaon_sbuf_append(out, "\xEF\xBF\xBD", 3);
        replaced++;
        i++;
        run = i;
    }
    kaon_sbuf_append(out, s + run, n - run);
    return out->failed ? -1 : replaced;
}

size_t kaon_utf8_complete_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned c = u[n - k];
        if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return want > k ? n - k : n;
    }
    return n;
}
