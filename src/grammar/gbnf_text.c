#include "grammar/gbnf_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gbnf_text_free(gbnf_text *t) {
    free(t->s);
    *t = (gbnf_text){0};
}

void gbnf_append(gbnf_text *t, const char *s, size_t n) {
    if (t->oom) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *p = realloc(t->s, cap);
        if (!p) {
            t->oom = true;
            return;
        }
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
}

void gbnf_puts(gbnf_text *t, const char *s) { gbnf_append(t, s, strlen(s)); }

void gbnf_printf(gbnf_text *t, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        gbnf_append(t, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        t->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    gbnf_append(t, big, (size_t)n);
    free(big);
}

// Escapes for bytes that cannot appear as themselves inside a literal or a class.
static bool escape_control(gbnf_text *t, unsigned char c) {
    switch (c) {
    case '\n': gbnf_puts(t, "\\n"); return true;
    case '\r': gbnf_puts(t, "\\r"); return true;
    case '\t': gbnf_puts(t, "\\t"); return true;
    default:
        if (c < 0x20 || c == 0x7f) {
            gbnf_printf(t, "\\x%02X", c);
            return true;
        }
        return false;
    }
}

void gbnf_literal(gbnf_text *t, const char *s, size_t n) {
    gbnf_puts(t, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            gbnf_append(t, e, 2);
        } else if (!escape_control(t, c)) {
            gbnf_append(t, (const char *)&c, 1);
        }
    }
    gbnf_puts(t, "\"");
}

void gbnf_class_char(gbnf_text *t, uint32_t cp) {
    if (cp < 0x80) {
        unsigned char c = (unsigned char)cp;
        if (c == ']' || c == '[' || c == '\\' || c == '^' || c == '-') {
            char e[2] = {'\\', (char)c};
            gbnf_append(t, e, 2);
        } else if (!escape_control(t, c)) {
            gbnf_append(t, (const char *)&c, 1);
        }
    } else if (cp <= 0xFFFF) {
        gbnf_printf(t, "\\u%04X", cp);
    } else {
        gbnf_printf(t, "\\U%08X", cp);
    }
}
