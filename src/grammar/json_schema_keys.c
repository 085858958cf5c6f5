// Object keys other than a given set: a trie of the listed keys' code points, where each node
// may end (if it is not a listed key), continue along a trie edge, or leave the trie with any
// other character (then anything may follow). Escapes are not allowed in such keys, so a key
// cannot spell a listed one in another way ("\u0061" for "a").
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema_internal.h"

typedef struct {
    uint32_t cp;
    int child, sibling;
    bool listed;
} trie_node;

// Next code point of UTF-8 text (invalid bytes pass through as themselves).
static uint32_t next_cp(const unsigned char **p) {
    const unsigned char *u = *p;
    int n = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 1;
    uint32_t v = n == 1 ? u[0] : n == 2 ? (u[0] & 0x1Fu) : n == 3 ? (u[0] & 0x0Fu) : (u[0] & 0x07u);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *p = u + 1;
            return u[0];
        }
        v = v << 6 | (u[i] & 0x3Fu);
    }
    *p = u + n;
    return v;
}

static const char *FREE_CLASS_BODY = "\"\\\\\\x00-\\x1F";  // '"', '\' and controls

int js_key_excluding(gbnf_text *out, const char *name, const char *const *keys, int n_keys) {
    int cap = 1, n = 1;
    for (int i = 0; i < n_keys; i++) cap += (int)strlen(keys[i]);
    trie_node *t = calloc((size_t)cap, sizeof *t);
    if (!t) return -1;
    t[0] = (trie_node){.child = -1, .sibling = -1};
    for (int i = 0; i < n_keys; i++) {
        // a key needing an escape cannot be spelled by an escape-free key: leave it out
        bool plain = true;
        for (const unsigned char *p = (const unsigned char *)keys[i]; *p; p++)
            if (*p == '"' || *p == '\\' || *p < 0x20) plain = false;
        if (!plain) continue;
        int at = 0;
        for (const unsigned char *p = (const unsigned char *)keys[i]; *p;) {
            uint32_t cp = next_cp(&p);
            int c = t[at].child;
            while (c >= 0 && t[c].cp != cp) c = t[c].sibling;
            if (c < 0) {
                c = n++;
                t[c] = (trie_node){.cp = cp, .child = -1, .sibling = t[at].child};
                t[at].child = c;
            }
            at = c;
        }
        t[at].listed = true;
    }
    gbnf_printf(out, "%s-free ::= [^%s]\n", name, FREE_CLASS_BODY);
    gbnf_printf(out, "%s ::= \"\\\"\" %s-k0\n", name, name);
    for (int i = 0; i < n; i++) {
        gbnf_printf(out, "%s-k%d ::= ", name, i);
        bool first = true;
        if (!t[i].listed) {
            gbnf_puts(out, "\"\\\"\"");
            first = false;
        }
        for (int c = t[i].child; c >= 0; c = t[c].sibling) {
            gbnf_printf(out, "%s[", first ? "" : " | ");
            gbnf_class_char(out, t[c].cp);
            gbnf_printf(out, "] %s-k%d", name, c);
            first = false;
        }
        gbnf_printf(out, "%s[^%s", first ? "" : " | ", FREE_CLASS_BODY);
        for (int c = t[i].child; c >= 0; c = t[c].sibling) gbnf_class_char(out, t[c].cp);
        gbnf_printf(out, "] %s-free* \"\\\"\"\n", name);
    }
    free(t);
    return n;
}
