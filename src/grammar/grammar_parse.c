// GBNF text -> gram_build. Syntax: `name ::= alternatives`, `|`, sequences, ( groups ),
// "literals" with escapes, [classes] and [^negated], `.`, rule names, * + ? {m} {m,} {m,n},
// `#` comments. Newlines are plain whitespace: a rule ends where the next `name ::=` begins.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_build.h"
#include "util/err.h"

typedef struct {
    const char *s, *end, *p;
    gram_build *b;
    int depth;
    bool failed;
} parser;

static void where(const parser *ps, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *q = ps->s; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int fail(parser *ps, const char *at, const char *msg) {
    if (ps->failed) return -1;
    int line, col;
    where(ps, at, &line, &col);
    ps->failed = true;
    return kaon_set_error("grammar: line %d col %d: %s", line, col, msg);
}

static void skip_space(parser *ps) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else {
            break;
        }
    }
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static size_t name_len(const parser *ps, const char *q) {
    size_t n = 0;
    while (q + n < ps->end && is_name_char(q[n])) n++;
    return n;
}

// Is there `name ::=` at q? (the start of the next rule)
static bool rule_start_at(const parser *ps, const char *q) {
    size_t n = name_len(ps, q);
    if (!n) return false;
    q += n;
    while (q < ps->end && (*q == ' ' || *q == '\t')) q++;
    return ps->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return kaon_set_error("grammar: out of memory");
    *p = q;
    *cap = nc;
    return 0;
}

static int new_rule(parser *ps, const char *name, size_t len) {
    gram_build *b = ps->b;
    if (b->n_rules >= KAON_GRAMMAR_MAX_RULES) return fail(ps, ps->p, "too many rules");
    if (grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules)) return -1;
    gram_build_rule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = malloc(len + 1);
        if (!r->name) return kaon_set_error("grammar: out of memory");
        memcpy(r->name, name, len);
        r->name[len] = 0;
    }
    return b->n_rules++;
}

static int find_rule(parser *ps, const char *name, size_t len) {
    for (int i = 0; i < ps->b->n_rules; i++) {
        const char *n = ps->b->rules[i].name;
        if (n && strlen(n) == len && !memcmp(n, name, len)) return i;
    }
    int r = new_rule(ps, name, len);
    if (r >= 0) where(ps, name, &ps->b->rules[r].line, &ps->b->rules[r].col);
    return r;
}

static int emit(parser *ps, int rule, int32_t type, int32_t val) {
    gram_build *b = ps->b;
    if (++b->n_elems_total > KAON_GRAMMAR_MAX_ELEMS) return fail(ps, ps->p, "grammar too large");
    gram_build_rule *r = &b->rules[rule];
    if (grow((void **)&r->e, &r->cap, r->n + 1, sizeof *r->e)) return -1;
    r->e[r->n++] = (gram_elem){type, val};
    return 0;
}

static int new_set(parser *ps, bool negated) {
    gram_build *b = ps->b;
    if (grow((void **)&b->sets, &b->cap_sets, b->n_sets + 1, sizeof *b->sets)) return -1;
    int cap = b->cap_sets;
    bool *nq = realloc(b->negated, (size_t)cap * sizeof *nq);
    if (!nq) return kaon_set_error("grammar: out of memory");
    b->negated = nq;
    b->sets[b->n_sets] = (gram_charset){b->n_ranges / 2, 0, {0}};
    b->negated[b->n_sets] = negated;
    return b->n_sets++;
}

static int add_range(parser *ps, int set, uint32_t lo, uint32_t hi) {
    gram_build *b = ps->b;
    if (lo > hi) return fail(ps, ps->p, "character range is reversed");
    if (b->n_ranges / 2 >= KAON_GRAMMAR_MAX_ELEMS) return fail(ps, ps->p, "grammar too large");
    if (grow((void **)&b->ranges, &b->cap_ranges, b->n_ranges + 2, sizeof *b->ranges)) return -1;
    b->ranges[b->n_ranges++] = lo;
    b->ranges[b->n_ranges++] = hi;
    b->sets[set].n++;
    return 0;
}

static int hex_digits(parser *ps, int count, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < count; i++) {
        if (ps->p >= ps->end) return fail(ps, ps->p, "unfinished escape");
        char c = *ps->p++;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(ps, ps->p - 1, "bad hex digit in escape");
        v = v << 4 | (uint32_t)d;
    }
    if (v > 0x10FFFF) return fail(ps, ps->p, "code point above U+10FFFF");
    *out = v;
    return 0;
}

// One character of a literal or class: an escape or a UTF-8 sequence -> code point.
static int read_char(parser *ps, uint32_t *cp) {
    if (ps->p >= ps->end) return fail(ps, ps->p, "unexpected end of grammar");
    const uint8_t *u = (const uint8_t *)ps->p;
    if (*u == '\\') {
        ps->p++;
        if (ps->p >= ps->end) return fail(ps, ps->p, "unfinished escape");
        char c = *ps->p++;
        switch (c) {
        case 'n': *cp = '\n'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 't': *cp = '\t'; return 0;
        case '0': *cp = 0; return 0;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
            *cp = (uint8_t)c;
            return 0;
        case 'x': return hex_digits(ps, 2, cp);
        case 'u': return hex_digits(ps, 4, cp);
        case 'U': return hex_digits(ps, 8, cp);
        default: return fail(ps, ps->p - 1, "unknown escape");
        }
    }
    int n = *u < 0x80 ? 1 : (*u & 0xE0) == 0xC0 ? 2 : (*u & 0xF0) == 0xE0 ? 3 : (*u & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || ps->end - ps->p < n) return fail(ps, ps->p, "invalid UTF-8 in grammar");
    uint32_t v = n == 1 ? *u : n == 2 ? (*u & 0x1Fu) : n == 3 ? (*u & 0x0Fu) : (*u & 0x07u);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return fail(ps, ps->p, "invalid UTF-8 in grammar");
        v = v << 6 | (u[i] & 0x3Fu);
    }
    ps->p += n;
    *cp = v;
    return 0;
}

static int parse_alternates(parser *ps, int rule);

// One symbol appended to `rule`; *first = its first element index (a literal may add many).
static int parse_symbol(parser *ps, int rule) {
    char c = *ps->p;
    if (c == '"') {
        ps->p++;
        while (ps->p < ps->end && *ps->p != '"') {
            if (*ps->p == '\n') return fail(ps, ps->p, "newline inside a string literal");
            uint32_t cp;
            if (read_char(ps, &cp)) return -1;
            int s = new_set(ps, false);
            if (s < 0 || add_range(ps, s, cp, cp) || emit(ps, rule, GEL_CHARS, s)) return -1;
        }
        if (ps->p >= ps->end) return fail(ps, ps->p, "unterminated string literal");
        ps->p++;
        return 0;
    }
    if (c == '[') {
        const char *open = ps->p++;
        bool neg = ps->p < ps->end && *ps->p == '^';
        if (neg) ps->p++;
        int s = new_set(ps, neg);
        if (s < 0) return -1;
        while (ps->p < ps->end && *ps->p != ']') {
            uint32_t lo, hi;
            if (read_char(ps, &lo)) return -1;
            hi = lo;
            if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
                ps->p++;
                if (read_char(ps, &hi)) return -1;
            }
            if (add_range(ps, s, lo, hi)) return -1;
        }
        if (ps->p >= ps->end) return fail(ps, open, "unterminated character class");
        ps->p++;
        return emit(ps, rule, GEL_CHARS, s);
    }
    if (c == '.') {
        ps->p++;
        int s = new_set(ps, false);
        return s < 0 || add_range(ps, s, 0, 0x10FFFF) ? -1 : emit(ps, rule, GEL_CHARS, s);
    }
    if (c == '(') {
        const char *open = ps->p++;
        if (++ps->depth > KAON_GRAMMAR_MAX_NESTING) return fail(ps, open, "groups nested too deeply");
        int sub = new_rule(ps, NULL, 0);
        if (sub < 0 || parse_alternates(ps, sub)) return -1;
        skip_space(ps);
        if (ps->p >= ps->end || *ps->p != ')') return fail(ps, ps->p, "expected ')'");
        ps->p++;
        ps->depth--;
        return emit(ps, rule, GEL_REF, sub);
    }
    if (is_name_char(c)) {
        size_t n = name_len(ps, ps->p);
        int r = find_rule(ps, ps->p, n);
        if (r < 0) return -1;
        ps->p += n;
        return emit(ps, rule, GEL_REF, r);
    }
    return fail(ps, ps->p, "expected a string, a character class, '.', '(' or a rule name");
}

static int parse_uint(parser *ps, int *out) {
    const char *at = ps->p;
    long v = 0;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, at, "expected a number");
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > KAON_GRAMMAR_MAX_REPEAT) return fail(ps, at, "repetition count too large");
    }
    *out = (int)v;
    return 0;
}

// Elements [first, n) of `rule` as one element: moved into a new rule when there are several.
static int single_element(parser *ps, int rule, int first, gram_elem *out) {
    gram_build_rule *r = &ps->b->rules[rule];
    if (r->n - first == 1) {
        *out = r->e[first];
        r->n--;
        return 0;
    }
    int sub = new_rule(ps, NULL, 0);
    if (sub < 0) return -1;
    r = &ps->b->rules[rule];
    for (int i = first; i < r->n; i++) {
        gram_build_rule *s = &ps->b->rules[sub];
        if (grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e)) return -1;
        s->e[s->n++] = r->e[i];
    }
    r->n = first;
    *out = (gram_elem){GEL_REF, sub};
    return 0;
}

// x{min,max} (max < 0: unbounded) in place of the symbol starting at `first`.
static int repeat(parser *ps, int rule, int first, int min, int max) {
    gram_elem x;
    if (single_element(ps, rule, first, &x)) return -1;
    for (int i = 0; i < min; i++)
        if (emit(ps, rule, x.type, x.val)) return -1;
    if (max < 0) {  // star ::= x star | (empty)
        int star = new_rule(ps, NULL, 0);
        if (star < 0 || emit(ps, star, x.type, x.val) || emit(ps, star, GEL_REF, star) ||
            emit(ps, star, GEL_ALT, 0))
            return -1;
        return emit(ps, rule, GEL_REF, star);
    }
    // opt_k ::= x opt_(k-1) | (empty), nested so x{0,k} takes k rules, not k alternatives.
    int inner = -1;
    for (int k = 0; k < max - min; k++) {
        int opt = new_rule(ps, NULL, 0);
        if (opt < 0 || emit(ps, opt, x.type, x.val)) return -1;
        if (inner >= 0 && emit(ps, opt, GEL_REF, inner)) return -1;
        if (emit(ps, opt, GEL_ALT, 0)) return -1;
        ps->b->rules[opt].rep_k = k + 1;
        inner = opt;
    }
    for (int k = 0; k < max - min; k++) ps->b->rules[inner - k].rep_head = inner;  // consecutive ids
    return inner >= 0 ? emit(ps, rule, GEL_REF, inner) : 0;
}

static int parse_sequence(parser *ps, int rule) {
    for (;;) {
        skip_space(ps);
        if (ps->p >= ps->end) return 0;
        char c = *ps->p;
        if (c == '|' || c == ')' || rule_start_at(ps, ps->p)) return 0;
        int first = ps->b->rules[rule].n;
        if (parse_symbol(ps, rule)) return -1;
        for (;;) {  // postfix operators (x** and x{2}? are allowed, as llama.cpp does)
            if (ps->p >= ps->end) break;
            c = *ps->p;
            int min, max;
            if (c == '*') {
                min = 0, max = -1;
            } else if (c == '+') {
                min = 1, max = -1;
            } else if (c == '?') {
                min = 0, max = 1;
            } else if (c == '{') {
                ps->p++;
                skip_space(ps);
                if (parse_uint(ps, &min)) return -1;
                skip_space(ps);
                max = min;
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    skip_space(ps);
                    max = -1;
                    if (ps->p < ps->end && *ps->p != '}' && parse_uint(ps, &max)) return -1;
                    skip_space(ps);
                }
                if (ps->p >= ps->end || *ps->p != '}') return fail(ps, ps->p, "expected '}'");
                if (max >= 0 && max < min) return fail(ps, ps->p, "repetition {m,n} with n < m");
            } else {
                break;
            }
            ps->p++;
            if (repeat(ps, rule, first, min, max)) return -1;
        }
    }
}

static int parse_alternates(parser *ps, int rule) {
    for (;;) {
        if (parse_sequence(ps, rule)) return -1;
        skip_space(ps);
        if (ps->p >= ps->end || *ps->p != '|') return 0;
        ps->p++;
        if (emit(ps, rule, GEL_ALT, 0)) return -1;
    }
}

kaon_grammar *kaon_grammar_parse(const char *text, size_t len, const char *root_rule) {
    if (!text) {
        kaon_set_error("grammar: no text");
        return NULL;
    }
    if (len > KAON_GRAMMAR_MAX_TEXT) {
        kaon_set_error("grammar: %zu bytes (at most %d)", len, KAON_GRAMMAR_MAX_TEXT);
        return NULL;
    }
    gram_build b = {0};
    parser ps = {text, text + len, text, &b, 0, false};
    skip_space(&ps);
    if (ps.p >= ps.end) {
        kaon_set_error("grammar: empty grammar");
        return NULL;
    }
    while (ps.p < ps.end) {
        const char *at = ps.p;
        size_t n = name_len(&ps, ps.p);
        if (!n) {
            fail(&ps, at, "expected a rule name");
            goto bad;
        }
        int r = find_rule(&ps, ps.p, n);
        if (r < 0) goto bad;
        if (b.rules[r].defined) {
            fail(&ps, at, "rule defined twice");
            goto bad;
        }
        b.rules[r].defined = true;
        ps.p += n;
        skip_space(&ps);
        if (ps.end - ps.p < 3 || memcmp(ps.p, "::=", 3)) {
            fail(&ps, ps.p, "expected '::='");
            goto bad;
        }
        ps.p += 3;
        if (parse_alternates(&ps, r)) goto bad;
        skip_space(&ps);
        if (ps.p < ps.end && *ps.p == ')') {
            fail(&ps, ps.p, "unmatched ')'");
            goto bad;
        }
    }
    for (int i = 0; i < b.n_rules; i++) {
        if (b.rules[i].name && !b.rules[i].defined) {
            char msg[160];
            snprintf(msg, sizeof msg, "grammar: line %d col %d: undefined rule '%.64s'", b.rules[i].line,
                     b.rules[i].col, b.rules[i].name);
            kaon_set_error("%s", msg);
            goto bad;
        }
    }
    kaon_grammar *g = gram_build_compile(&b, root_rule ? root_rule : "root");
    gram_build_free(&b);
    return g;
bad:
    gram_build_free(&b);
    return NULL;
}
