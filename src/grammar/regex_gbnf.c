// Regex -> GBNF. The pattern is parsed into a small tree (sets of code points, sequences,
// alternations, repetitions), checked, then printed as one GBNF rule. A tree rather than
// printing while parsing because GBNF refuses a repetition of something that can be empty
// (left recursion): (a?b?)* is printed as its equivalent ((a|b)...)* over non-empty strings,
// which needs to know what an atom can match before printing it.
#include "grammar/regex_gbnf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "util/err.h"

#define UNBOUNDED (-1)

// A set of code points: sorted, disjoint, non-adjacent ranges once normalized.
typedef struct {
    uint32_t (*r)[2];
    int n, cap;
} cset;

enum { N_EMPTY, N_SET, N_SEQ, N_ALT, N_REP };

typedef struct {
    int kind;
    bool nullable;  // matches the empty string
    bool nonempty;  // matches some non-empty string (ignoring empty sets)
    int min, max;   // N_REP (max UNBOUNDED for no limit)
    int child;      // N_REP: the repeated node; N_SEQ / N_ALT: first child (-1 none)
    int next;       // next sibling inside a N_SEQ / N_ALT
    cset set;       // N_SET
} rx_node;

// Anchor flags a sub-pattern reports to its parent.
enum { HAS_START = 1, END_LOCKED = 2 };

typedef struct {
    const char *re;
    size_t len, pos;
    bool json;
    rx_node *nodes;
    int n_nodes, cap_nodes;
    int depth;
    bool failed;
    const char *name;
    gbnf_text *out;         // where printing goes: `main`, or a helper rule's body
    gbnf_text *main;        // the caller's text, from out_start on
    size_t out_start;
    gbnf_text helpers;      // helper rules, appended after the main rule
    int n_helpers, parens;  // parens: group nesting in the rule being printed
} rx;

// Deeper groups go to a helper rule: GBNF caps nesting at KAON_GRAMMAR_MAX_NESTING, and a
// JSON-string set adds two levels of its own.
#define PAREN_SPLIT (KAON_GRAMMAR_MAX_NESTING - 8)

static int rx_fail(rx *p, size_t at, const char *msg) {
    if (p->failed) return -1;
    p->failed = true;
    return kaon_set_error("regex: %s at offset %zu", msg, at);
}

// ---- code point sets ----

static int cset_add(cset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 4;
        void *q = realloc(s->r, (size_t)cap * sizeof *s->r);
        if (!q) return kaon_set_error("regex: out of memory");
        s->r = q;
        s->cap = cap;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = ((const uint32_t *)a)[0], y = ((const uint32_t *)b)[0];
    return x < y ? -1 : x > y;
}

static void cset_normalize(cset *s) {
    if (s->n < 2) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[k][1] + 1) {
            if (s->r[i][1] > s->r[k][1]) s->r[k][1] = s->r[i][1];
        } else {
            s->r[++k][0] = s->r[i][0];
            s->r[k][1] = s->r[i][1];
        }
    }
    s->n = k + 1;
}

// The complement over [0, U+10FFFF] of a normalized set, into *out (empty on entry).
static int cset_complement(const cset *s, cset *out) {
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i][0] > next && cset_add(out, next, s->r[i][0] - 1)) return -1;
        next = s->r[i][1] + 1;
    }
    if (next <= 0x10FFFF && cset_add(out, next, 0x10FFFF)) return -1;
    return 0;
}

static bool cset_has(const cset *s, uint32_t cp) {
    for (int i = 0; i < s->n; i++)
        if (cp >= s->r[i][0] && cp <= s->r[i][1]) return true;
    return false;
}

// The class escapes, ASCII \d \w as ECMAScript (and Python with re.ASCII) define them; \s is
// ECMAScript's white space and line terminators.
static int cset_add_class(cset *s, char c) {
    static const uint32_t digit[][2] = {{'0', '9'}};
    static const uint32_t word[][2] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const uint32_t space[][2] = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680},
                                        {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                        {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    const uint32_t(*t)[2];
    int n;
    switch (c | 0x20) {
    case 'd': t = digit, n = 1; break;
    case 'w': t = word, n = 4; break;
    default: t = space, n = (int)(sizeof space / sizeof *space); break;
    }
    if (c >= 'a') {
        for (int i = 0; i < n; i++)
            if (cset_add(s, t[i][0], t[i][1])) return -1;
        return 0;
    }
    cset pos = {0}, neg = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = cset_add(&pos, t[i][0], t[i][1]);
    if (!rc) rc = cset_complement(&pos, &neg);
    for (int i = 0; i < neg.n && !rc; i++) rc = cset_add(s, neg.r[i][0], neg.r[i][1]);
    free(pos.r);
    free(neg.r);
    return rc;
}

// ---- tree ----

static int new_node(rx *p, int kind) {
    if (p->n_nodes == p->cap_nodes) {
        int cap = p->cap_nodes ? p->cap_nodes * 2 : 64;
        void *q = realloc(p->nodes, (size_t)cap * sizeof *p->nodes);
        if (!q) {
            p->failed = true;
            return kaon_set_error("regex: out of memory");
        }
        p->nodes = q;
        p->cap_nodes = cap;
    }
    rx_node *n = &p->nodes[p->n_nodes];
    *n = (rx_node){.kind = kind, .child = -1, .next = -1, .min = 1, .max = 1};
    n->nullable = kind == N_EMPTY || kind == N_SEQ;  // an empty sequence matches ""
    return p->n_nodes++;
}

// A set node taking ownership of *s.
static int set_node(rx *p, cset *s) {
    int id = new_node(p, N_SET);
    if (id < 0) {
        free(s->r);
        return -1;
    }
    cset_normalize(s);
    p->nodes[id].set = *s;
    p->nodes[id].nonempty = true;
    *s = (cset){0};
    return id;
}

static int char_node(rx *p, uint32_t cp) {
    cset s = {0};
    if (cset_add(&s, cp, cp)) return -1;
    return set_node(p, &s);
}

// Appends `child` to the N_SEQ / N_ALT `parent`; *last tracks the tail.
static void add_child(rx *p, int parent, int child, int *last) {
    rx_node *par = &p->nodes[parent], *c = &p->nodes[child];
    if (*last < 0) {
        par->child = child;
        par->nullable = c->nullable;
        par->nonempty = c->nonempty;
    } else {
        p->nodes[*last].next = child;
        if (par->kind == N_SEQ) {
            par->nullable = par->nullable && c->nullable;
        } else {
            par->nullable = par->nullable || c->nullable;
        }
        par->nonempty = par->nonempty || c->nonempty;
    }
    *last = child;
}

// ---- pattern parsing ----

static bool at_end(const rx *p) { return p->pos >= p->len; }
static char peek(const rx *p) { return at_end(p) ? 0 : p->re[p->pos]; }

// One UTF-8 code point of the pattern.
static int read_utf8(rx *p, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)p->re + p->pos;
    size_t left = p->len - p->pos;
    int n = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || left < (size_t)n) return rx_fail(p, p->pos, "invalid UTF-8");
    uint32_t v = n == 1 ? u[0] : n == 2 ? (u[0] & 0x1Fu) : n == 3 ? (u[0] & 0x0Fu) : (u[0] & 0x07u);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return rx_fail(p, p->pos, "invalid UTF-8");
        v = v << 6 | (u[i] & 0x3Fu);
    }
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < least[n] || v > 0x10FFFF) return rx_fail(p, p->pos, "invalid UTF-8");
    p->pos += (size_t)n;
    *cp = v;
    return 0;
}

static int hex_value(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// `count` hex digits (count 0: \u{...}, one to six digits in braces).
static int read_hex(rx *p, int count, size_t esc_at, uint32_t *cp) {
    bool braces = count == 0;
    if (braces) {
        if (peek(p) != '{') return rx_fail(p, esc_at, "bad \\u escape");
        p->pos++;
        count = 6;
    }
    uint32_t v = 0;
    int digits = 0;
    while (digits < count && !at_end(p) && hex_value(peek(p)) >= 0) {
        v = v << 4 | (uint32_t)hex_value(p->re[p->pos++]);
        digits++;
    }
    if (braces) {
        if (!digits || peek(p) != '}') return rx_fail(p, esc_at, "bad \\u{...} escape");
        p->pos++;
    } else if (digits < count) {
        return rx_fail(p, esc_at, "too few hex digits in escape");
    }
    if (v > 0x10FFFF) return rx_fail(p, esc_at, "escape above U+10FFFF");
    *cp = v;
    return 0;
}

// After a backslash (p->pos at the escaped character): a code point in *cp, or a class
// escape added to *set (return 1). in_class: \b is a backspace there, not a word boundary.
static int read_escape(rx *p, bool in_class, uint32_t *cp, cset *set) {
    size_t at = p->pos - 1;
    if (at_end(p)) return rx_fail(p, at, "pattern ends with a backslash");
    char c = p->re[p->pos];
    if ((unsigned char)c >= 0x80) return read_utf8(p, cp);
    p->pos++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return cset_add_class(set, c) ? rx_fail(p, at, "out of memory") : 1;
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'a': *cp = 0x07; return 0;
    case '0':
        if (peek(p) >= '0' && peek(p) <= '9') return rx_fail(p, at, "octal escapes are not supported");
        *cp = 0;
        return 0;
    case 'x': return read_hex(p, 2, at, cp);
    case 'u': return read_hex(p, peek(p) == '{' ? 0 : 4, at, cp);
    case 'U': return read_hex(p, 8, at, cp);
    case 'b':
        if (in_class) {
            *cp = 0x08;
            return 0;
        }
        return rx_fail(p, at, "word boundaries (\\b) are not supported");
    case 'B': return rx_fail(p, at, "word boundaries (\\B) are not supported");
    case 'A': case 'Z': case 'z': case 'G':
        return rx_fail(p, at, "anchor escapes (\\A \\Z \\z \\G) are not supported");
    case 'k': return rx_fail(p, at, "backreferences are not supported");
    case 'p': case 'P': return rx_fail(p, at, "Unicode property escapes are not supported");
    default: break;
    }
    if (c >= '1' && c <= '9') return rx_fail(p, at, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (unsigned char)c < 0x20)
        return rx_fail(p, at, "unknown escape");
    *cp = (unsigned char)c;  // escaped punctuation stands for itself
    return 0;
}

// One class member: a code point (0) or a class escape added to *set (1).
static int class_item(rx *p, uint32_t *cp, cset *set) {
    if (peek(p) == '\\') {
        p->pos++;
        return read_escape(p, true, cp, set);
    }
    return read_utf8(p, cp);
}

// [...] with p->pos just after '['.
static int parse_class(rx *p) {
    size_t open = p->pos - 1;
    bool neg = peek(p) == '^';
    if (neg) p->pos++;
    cset s = {0};
    bool first = true;
    for (;;) {
        if (at_end(p)) {
            free(s.r);
            return rx_fail(p, open, "unterminated character class");
        }
        if (peek(p) == ']' && !first) break;  // a ']' first is literal, as in Python
        first = false;
        size_t item_at = p->pos;
        uint32_t lo, hi;
        int k = class_item(p, &lo, &s);
        if (k < 0) goto fail;
        if (peek(p) == '-' && p->pos + 1 < p->len && p->re[p->pos + 1] != ']') {
            if (k == 1) {
                rx_fail(p, item_at, "a class escape cannot start a range");
                goto fail;
            }
            p->pos++;
            int k2 = class_item(p, &hi, &s);
            if (k2 < 0) goto fail;
            if (k2 == 1) {
                rx_fail(p, item_at, "a class escape cannot end a range");
                goto fail;
            }
            if (lo > hi) {
                rx_fail(p, item_at, "character range is reversed");
                goto fail;
            }
            if (cset_add(&s, lo, hi)) goto fail;
        } else if (k == 0 && cset_add(&s, lo, lo)) {
            goto fail;
        }
    }
    p->pos++;  // ']'
    if (neg) {
        cset c = {0};
        cset_normalize(&s);
        int rc = cset_complement(&s, &c);
        free(s.r);
        if (rc) {
            free(c.r);
            p->failed = true;
            return -1;
        }
        s = c;
    }
    return set_node(p, &s);
fail:
    free(s.r);
    p->failed = true;
    return -1;
}

// A decimal number of at most 9 digits (larger ones fail later as over the limit).
static bool read_number(rx *p, size_t *q, long *out) {
    long v = 0;
    size_t start = *q;
    while (*q < p->len && p->re[*q] >= '0' && p->re[*q] <= '9' && *q - start < 9) v = v * 10 + (p->re[(*q)++] - '0');
    *out = v;
    return *q > start && !(*q < p->len && p->re[*q] >= '0' && p->re[*q] <= '9');
}

// {m} {m,} {m,n} {,n} {,} at p->pos: true (and p->pos past it) when it is one; anything
// else is a literal '{', as in Python.
static bool read_braces(rx *p, long *min, long *max) {
    size_t q = p->pos + 1;
    long m = 0, n = UNBOUNDED;
    bool has_m = q < p->len && p->re[q] >= '0' && p->re[q] <= '9';
    if (has_m && !read_number(p, &q, &m)) return false;
    if (q < p->len && p->re[q] == ',') {
        q++;
        if (q < p->len && p->re[q] >= '0' && p->re[q] <= '9' && !read_number(p, &q, &n)) return false;
    } else if (has_m) {
        n = m;
    } else {
        return false;
    }
    if (q >= p->len || p->re[q] != '}') return false;
    p->pos = q + 1;
    *min = m;
    *max = n;
    return true;
}

// A quantifier at p->pos? (min/max filled, p->pos moved past it)
static bool read_quantifier(rx *p, long *min, long *max) {
    switch (peek(p)) {
    case '*': *min = 0, *max = UNBOUNDED; p->pos++; return true;
    case '+': *min = 1, *max = UNBOUNDED; p->pos++; return true;
    case '?': *min = 0, *max = 1; p->pos++; return true;
    case '{': return read_braces(p, min, max);
    default: return false;
    }
}

static int parse_alt(rx *p, bool at_start, int *flags);

// (?P<name> or (?<name> with p->pos at the name: the name and the '>'.
static int read_group_name(rx *p, size_t open) {
    size_t start = p->pos;
    while (!at_end(p) && (peek(p) == '_' || (peek(p) >= '0' && peek(p) <= '9') ||
                          ((peek(p) | 0x20) >= 'a' && (peek(p) | 0x20) <= 'z')))
        p->pos++;
    if (p->pos == start || peek(p) != '>' || (p->re[start] >= '0' && p->re[start] <= '9'))
        return rx_fail(p, open, "bad group name");
    p->pos++;
    return 0;
}

// After "(?": the kind of group; plain, named and (?:) groups are all the same here.
static int read_group_prefix(rx *p, size_t open) {
    char c = peek(p), d = p->pos + 1 < p->len ? p->re[p->pos + 1] : 0;
    if (c == ':') {
        p->pos++;
        return 0;
    }
    if (c == 'P' && d == '<') {
        p->pos += 2;
        return read_group_name(p, open);
    }
    if (c == '<' && d != '=' && d != '!') {
        p->pos++;
        return read_group_name(p, open);
    }
    if (c == '=' || c == '!' || c == '<') return rx_fail(p, open, "lookahead and lookbehind are not supported");
    if (c == 'P' && d == '=') return rx_fail(p, open, "backreferences are not supported");
    return rx_fail(p, open, "this group syntax (inline flags, comments, ...) is not supported");
}

// ( ... ) with p->pos just after '('.
static int parse_group(rx *p, bool at_start, int *flags) {
    size_t open = p->pos - 1;
    if (peek(p) == '?') {
        p->pos++;
        if (read_group_prefix(p, open)) return -1;
    }
    if (++p->depth > KAON_REGEX_MAX_DEPTH) return rx_fail(p, open, "groups nested too deeply");
    int id = parse_alt(p, at_start, flags);
    if (id < 0) return -1;
    if (peek(p) != ')') return rx_fail(p, open, "missing ')'");
    p->pos++;
    p->depth--;
    return id;
}

// One atom (a node), or -2 for an anchor (nothing to match).
static int parse_atom(rx *p, bool at_start, bool locked, int *flags) {
    size_t at = p->pos;
    char c = peek(p);
    if (c == '^') {
        if (!at_start) return rx_fail(p, at, "'^' is only supported at the start of the pattern");
        p->pos++;
        *flags |= HAS_START;
        return -2;
    }
    if (c == '$') {
        p->pos++;
        *flags |= END_LOCKED;
        return -2;
    }
    if (locked) return rx_fail(p, at, "'$' is only supported at the end of the pattern");
    if (c == '*' || c == '+' || c == '?') return rx_fail(p, at, "nothing to repeat");
    if (c == '{') {
        long m, n;
        size_t save = p->pos;
        if (read_braces(p, &m, &n)) return rx_fail(p, at, "nothing to repeat");
        p->pos = save + 1;
        return char_node(p, '{');
    }
    p->pos++;
    if (c == '(') return parse_group(p, at_start, flags);
    if (c == '[') return parse_class(p);
    if (c == '.') {  // anything but a newline
        cset s = {0};
        if (cset_add(&s, 0, '\n' - 1) || cset_add(&s, '\n' + 1, 0x10FFFF)) {
            free(s.r);
            return -1;
        }
        return set_node(p, &s);
    }
    uint32_t cp;
    cset s = {0};
    int k;
    if (c == '\\') {
        k = read_escape(p, false, &cp, &s);
    } else {
        p->pos--;
        k = read_utf8(p, &cp);
    }
    if (k < 0) {
        free(s.r);
        return -1;
    }
    if (k == 1) return set_node(p, &s);
    return char_node(p, cp);
}

// Quantifiers after the atom `id` (a repetition node, or `id` itself when there is none).
static int parse_quantifiers(rx *p, int id, int atom_flags) {
    size_t at = p->pos;
    long min, max;
    if (!read_quantifier(p, &min, &max)) return id;
    if (atom_flags) return rx_fail(p, at, "a quantified group cannot contain '^' or '$'");
    if (max != UNBOUNDED && min > max) return rx_fail(p, at, "min repeat greater than max repeat");
    if (min > KAON_GRAMMAR_MAX_REPEAT || max > KAON_GRAMMAR_MAX_REPEAT)
        return rx_fail(p, at, "repetition count above 1024");
    if (peek(p) == '?') p->pos++;  // lazy: the same strings
    else if (peek(p) == '+') return rx_fail(p, p->pos, "possessive quantifiers are not supported");
    size_t again = p->pos;
    long m2, n2;
    if (read_quantifier(p, &m2, &n2)) return rx_fail(p, again, "multiple repeat");
    int rep = new_node(p, N_REP);
    if (rep < 0) return -1;
    rx_node *r = &p->nodes[rep], *c = &p->nodes[id];
    r->child = id;
    r->min = (int)min;
    r->max = (int)max;
    r->nullable = min == 0 || c->nullable;
    r->nonempty = max != 0 && c->nonempty;
    return rep;
}

// A sequence up to '|', ')' or the end.
static int parse_seq(rx *p, bool at_start, int *flags) {
    int seq = new_node(p, N_SEQ), last = -1;
    if (seq < 0) return -1;
    bool locked = false;
    while (!at_end(p) && peek(p) != '|' && peek(p) != ')') {
        int af = 0;
        int id = parse_atom(p, at_start, locked, &af);
        if (id == -1) return -1;
        *flags |= af & HAS_START;
        if (af & END_LOCKED) locked = true;
        if (id == -2) {  // an anchor: nothing may repeat it
            long m, n;
            size_t at = p->pos;
            if (read_quantifier(p, &m, &n)) return rx_fail(p, at, "nothing to repeat");
            continue;
        }
        at_start = false;
        id = parse_quantifiers(p, id, af);
        if (id < 0) return -1;
        add_child(p, seq, id, &last);
    }
    if (locked) *flags |= END_LOCKED;
    return seq;
}

static int parse_alt(rx *p, bool at_start, int *flags) {
    int first = parse_seq(p, at_start, flags);
    if (first < 0 || peek(p) != '|') return first;
    int alt = new_node(p, N_ALT), last = -1;
    if (alt < 0) return -1;
    add_child(p, alt, first, &last);
    while (peek(p) == '|') {
        p->pos++;
        int id = parse_seq(p, at_start, flags);
        if (id < 0) return -1;
        add_child(p, alt, id, &last);
    }
    return alt;
}

// ---- printing ----

static bool too_big(rx *p) {
    if (p->failed) return true;
    if (p->out->oom || p->main->oom || p->helpers.oom) {
        p->failed = true;
        kaon_set_error("regex: out of memory");
        return true;
    }
    size_t total = p->main->len - p->out_start + p->helpers.len + (p->out != p->main ? p->out->len : 0);
    if (total > KAON_GRAMMAR_MAX_TEXT) {
        p->failed = true;
        kaon_set_error("regex: the grammar for this pattern is too large (over %d bytes)", KAON_GRAMMAR_MAX_TEXT);
        return true;
    }
    return false;
}

static void put_class(gbnf_text *o, const cset *s, bool neg) {
    gbnf_puts(o, neg ? "[^" : "[");
    for (int i = 0; i < s->n; i++) {
        gbnf_class_char(o, s->r[i][0]);
        if (s->r[i][1] != s->r[i][0]) {
            if (s->r[i][1] > s->r[i][0] + 1) gbnf_puts(o, "-");
            gbnf_class_char(o, s->r[i][1]);
        }
    }
    gbnf_puts(o, "]");
}

// A set as raw characters: a literal for one code point, else the shorter of the class and
// its negation.
static void put_raw_set(rx *p, const cset *s) {
    if (s->n == 1 && s->r[0][0] == s->r[0][1]) {
        uint32_t cp = s->r[0][0];
        char b[4];
        int n;
        if (cp < 0x80) {
            b[0] = (char)cp, n = 1;
        } else if (cp < 0x800) {
            b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
        } else if (cp < 0x10000) {
            b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 0x3F));
            b[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
        } else {
            b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 0x3F));
            b[2] = (char)(0x80 | (cp >> 6 & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) {  // not encodable as UTF-8 text: use the class form
            put_class(p->out, s, false);
            return;
        }
        gbnf_literal(p->out, b, (size_t)n);
        return;
    }
    if (s->n == 0) {
        gbnf_puts(p->out, "[^\\x00-\\U0010FFFF]");  // matches nothing
        return;
    }
    cset c = {0};
    if (s->n > 1 && !cset_complement(s, &c) && c.n < s->n) {
        put_class(p->out, &c, true);
    } else {
        put_class(p->out, s, false);
    }
    free(c.r);
}

// Hex digits for the nibbles set in `mask`, both cases.
static void put_nibbles(gbnf_text *o, unsigned mask) {
    if (mask == 0xFFFF) {
        gbnf_puts(o, "[0-9a-fA-F]");
        return;
    }
    gbnf_puts(o, "[");
    for (int v = 0; v < 16; v++) {
        if (!(mask >> v & 1)) continue;
        if (v < 10) {
            gbnf_printf(o, "%c", '0' + v);
        } else {
            gbnf_printf(o, "%c%c", 'a' + v - 10, 'A' + v - 10);
        }
    }
    gbnf_puts(o, "]");
}

// A set as the JSON-escaped text of one of its characters: raw where JSON allows it, else
// (and for '/') the escapes \" \\ \/ \b \f \n \r \t, and \u00XX for every control character.
static void put_json_set(rx *p, const cset *s) {
    gbnf_text *o = p->out;
    cset raw = {0};
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0] < 0x20 ? 0x20 : s->r[i][0], hi = s->r[i][1];
        for (uint32_t cut = '"';; cut = '\\') {  // split around '"' and '\'
            if (lo <= hi && lo <= cut && cut <= hi) {
                if (lo < cut && cset_add(&raw, lo, cut - 1)) p->failed = true;
                lo = cut + 1;
            }
            if (cut == '\\') break;
        }
        if (lo <= hi && cset_add(&raw, lo, hi)) p->failed = true;
    }
    static const char short_esc[][2] = {{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {0x08, 'b'},
                                        {0x0C, 'f'}, {0x0A, 'n'}, {0x0D, 'r'}, {0x09, 't'}};
    char esc[9];
    int n_esc = 0;
    for (size_t i = 0; i < sizeof short_esc / sizeof *short_esc; i++)
        if (cset_has(s, (unsigned char)short_esc[i][0])) esc[n_esc++] = short_esc[i][1];
    unsigned ctl[2] = {0, 0};  // control characters by high nibble
    for (uint32_t c = 0; c < 0x20; c++)
        if (cset_has(s, c)) ctl[c >> 4] |= 1u << (c & 15);
    int alts = (raw.n > 0) + (n_esc > 0) + (ctl[0] || ctl[1]);
    if (alts == 0) {
        gbnf_puts(o, "[^\\x00-\\U0010FFFF]");  // matches nothing
        free(raw.r);
        return;
    }
    if (alts > 1) gbnf_puts(o, "(");
    const char *sep = "";
    if (raw.n) {
        put_raw_set(p, &raw);
        sep = " | ";
    }
    if (n_esc) {
        gbnf_printf(o, "%s\"\\\\\" [", sep);
        for (int i = 0; i < n_esc; i++) gbnf_class_char(o, (unsigned char)esc[i]);
        gbnf_puts(o, "]");
        sep = " | ";
    }
    if (ctl[0] || ctl[1]) {
        gbnf_printf(o, "%s\"\\\\u00\" ", sep);
        if (ctl[0] && ctl[1]) gbnf_puts(o, "(");
        for (int h = 0; h < 2; h++) {
            if (!ctl[h]) continue;
            if (h == 1 && ctl[0]) gbnf_puts(o, " | ");
            gbnf_printf(o, "\"%d\" ", h);
            put_nibbles(o, ctl[h]);
        }
        if (ctl[0] && ctl[1]) gbnf_puts(o, ")");
    }
    if (alts > 1) gbnf_puts(o, ")");
    free(raw.r);
}

static void put_quant(gbnf_text *o, int min, int max) {
    if (min == 1 && max == 1) return;
    if (min == 0 && max == 1) gbnf_puts(o, "?");
    else if (min == 0 && max == UNBOUNDED) gbnf_puts(o, "*");
    else if (min == 1 && max == UNBOUNDED) gbnf_puts(o, "+");
    else if (max == UNBOUNDED) gbnf_printf(o, "{%d,}", min);
    else if (min == max) gbnf_printf(o, "{%d}", min);
    else gbnf_printf(o, "{%d,%d}", min, max);
}

static void put_node(rx *p, int id);
static void put_nonempty(rx *p, int id);

// `id` as one GBNF symbol, so a quantifier or a neighbour binds to all of it.
// `id` as the helper rule name-gK, printed in a buffer of its own, then kept for the end.
static void put_helper(rx *p, int id, bool nonempty) {
    int k = p->n_helpers++;
    gbnf_printf(p->out, "%s-g%d", p->name, k);
    gbnf_text body = {0}, *saved = p->out;
    int saved_parens = p->parens;
    p->out = &body;
    p->parens = 0;
    gbnf_printf(&body, "%s-g%d ::= ", p->name, k);
    if (nonempty) put_nonempty(p, id);
    else put_node(p, id);
    gbnf_puts(&body, "\n");
    (void)too_big(p);
    p->out = saved;
    p->parens = saved_parens;
    if (!p->failed) gbnf_append(&p->helpers, body.s, body.len);
    gbnf_text_free(&body);
}

static void put_symbol(rx *p, int id, bool nonempty) {
    if (p->nodes[id].kind == N_SET) {
        put_node(p, id);
        return;
    }
    if (p->parens >= PAREN_SPLIT) {
        put_helper(p, id, nonempty);
        return;
    }
    p->parens++;
    gbnf_puts(p->out, "(");
    if (nonempty) put_nonempty(p, id);
    else put_node(p, id);
    gbnf_puts(p->out, ")");
    p->parens--;
}

// An item of a sequence: only an alternation needs parentheses there.
static void put_seq_item(rx *p, int id) {
    if (p->nodes[id].kind == N_ALT) put_symbol(p, id, false);
    else put_node(p, id);
}

static void put_rep(rx *p, const rx_node *n) {
    const rx_node *c = &p->nodes[n->child];
    if (n->max == 0 || !c->nonempty) {
        gbnf_puts(p->out, "\"\"");
    } else if (n->max == UNBOUNDED && c->nullable) {
        // x{m,} with x nullable is (x without "")*: GBNF refuses to repeat what can be empty
        put_symbol(p, n->child, true);
        gbnf_puts(p->out, "*");
    } else {
        put_symbol(p, n->child, false);
        put_quant(p->out, n->min, n->max);
    }
}

static void put_node(rx *p, int id) {
    if (too_big(p)) return;
    const rx_node *n = &p->nodes[id];
    switch (n->kind) {
    case N_EMPTY: gbnf_puts(p->out, "\"\""); return;
    case N_SET:
        if (p->json) put_json_set(p, &n->set);
        else put_raw_set(p, &n->set);
        return;
    case N_SEQ:
        if (n->child < 0) gbnf_puts(p->out, "\"\"");
        for (int c = n->child; c >= 0 && !p->failed; c = p->nodes[c].next) {
            if (c != n->child) gbnf_puts(p->out, " ");
            put_seq_item(p, c);
        }
        return;
    case N_ALT:
        for (int c = n->child; c >= 0 && !p->failed; c = p->nodes[c].next) {
            if (c != n->child) gbnf_puts(p->out, " | ");
            put_node(p, c);
        }
        return;
    case N_REP: put_rep(p, n); return;
    }
}

// The non-empty strings of `id` (which has some), as alternatives.
static void put_nonempty(rx *p, int id) {
    if (too_big(p)) return;
    const rx_node *n = &p->nodes[id];
    if (!n->nullable) {
        put_node(p, id);
        return;
    }
    const char *sep = "";
    switch (n->kind) {
    case N_SEQ:  // the first non-empty item, what follows it as is
        for (int c = n->child; c >= 0 && !p->failed; c = p->nodes[c].next) {
            if (!p->nodes[c].nonempty) continue;
            gbnf_puts(p->out, sep);
            sep = " | ";
            put_symbol(p, c, true);
            for (int d = p->nodes[c].next; d >= 0 && !p->failed; d = p->nodes[d].next) {
                gbnf_puts(p->out, " ");
                put_seq_item(p, d);
            }
        }
        return;
    case N_ALT:
        for (int c = n->child; c >= 0 && !p->failed; c = p->nodes[c].next) {
            if (!p->nodes[c].nonempty) continue;
            gbnf_puts(p->out, sep);
            sep = " | ";
            put_symbol(p, c, true);
        }
        return;
    case N_REP: {  // x{m,n} nullable: (x without "") repeated 1..n times
        const rx_node *c = &p->nodes[n->child];
        put_symbol(p, n->child, c->nullable);
        put_quant(p->out, 1, n->max);
        return;
    }
    default: return;
    }
}

static bool valid_name(const char *name) {
    if (!name || !*name) return false;
    for (const char *q = name; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
              *q == '-' || *q == '_'))
            return false;
    return true;
}

int kaon_regex_to_gbnf(const char *re, size_t len, const char *name, bool json_string,
                       gbnf_text *out) {
    if (!valid_name(name)) return kaon_set_error("regex: bad rule name");
    if (!re && len) return kaon_set_error("regex: no pattern");
    if (len > KAON_REGEX_MAX_LEN) return kaon_set_error("regex: pattern longer than %d bytes", KAON_REGEX_MAX_LEN);
    rx p = {.re = re ? re : "", .len = len, .json = json_string, .name = name, .out = out, .main = out,
            .out_start = out->len};
    int flags = 0;
    int root = parse_alt(&p, true, &flags);
    if (root >= 0 && !at_end(&p)) root = rx_fail(&p, p.pos, "unbalanced ')'");
    int rc = -1;
    if (root >= 0) {
        size_t before = out->len;
        gbnf_printf(out, "%s ::= ", name);
        put_node(&p, root);
        gbnf_puts(out, "\n");
        if (!p.failed && p.helpers.len) {
            gbnf_append(out, p.helpers.s, p.helpers.len);
            p.helpers.len = 0;  // now counted in `out`
        }
        rc = too_big(&p) ? -1 : 0;
        if (rc) {  // leave the caller's text as it was
            out->len = before;
            if (out->s) out->s[before] = 0;
        }
    }
    gbnf_text_free(&p.helpers);
    for (int i = 0; i < p.n_nodes; i++)
        if (p.nodes[i].kind == N_SET) free(p.nodes[i].set.r);
    free(p.nodes);
    return rc;
}
