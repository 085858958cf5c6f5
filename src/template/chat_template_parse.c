// Lexer and parser of the chat-template interpreter. Both follow jinja2 3.1's lexer.py and
// parser.py rule by rule (operator precedence, whitespace control, trim_blocks and
// lstrip_blocks, newline normalisation, string-literal escapes), since a template renders
// byte-identically only if it is cut into the same tokens.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/chat_template_internal.h"
#include "util/err.h"

// ---- arena for the AST and token text ----
typedef struct ct_blk {
    struct ct_blk *next;
    size_t used, cap;
    _Alignas(16) char data[];
} ct_blk;

struct ct_arena {
    ct_blk *head;
};

static void *ar_alloc(ct_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        ct_blk *b = malloc(sizeof(ct_blk) + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

static void ar_free(ct_arena *a) {
    if (!a) return;
    for (ct_blk *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(a);
}

// ---- tokens ----
enum {
    T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING,
    T_INT, T_FLOAT, T_OP,
};

typedef struct tok {
    uint8_t type, op;
    int line;
    const char *s;  // NAME, STRING (decoded), DATA: NUL-terminated, arena-owned
    size_t len;
    int64_t i;
    double f;
} tok;

typedef struct P {
    ct_arena *ar;
    ct_template_ast *ast;
    tok *t;
    size_t n, cap, i;
    bool failed;
    int err_line;
    char err[400];
    int nest;        // current syntactic nesting
    int loop_depth;  // enclosing for-loops (for break / continue)
} P;

static int perr(P *p, int line, const char *fmt, ...) KAON_PRINTF(3, 4);
static int perr(P *p, int line, const char *fmt, ...) {
    if (!p->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, sizeof p->err, fmt, ap);
        va_end(ap);
        p->failed = true;
        p->err_line = line;
    }
    return -1;
}

static char *ar_strdup(P *p, const char *s, size_t n) {
    char *d = ar_alloc(p->ar, n + 1);
    if (!d) {
        perr(p, 0, "out of memory");
        return NULL;
    }
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static tok *push_tok(P *p, int type, int line) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        tok *t = realloc(p->t, cap * sizeof(tok));
        if (!t) {
            perr(p, line, "out of memory");
            return NULL;
        }
        p->t = t;
        p->cap = cap;
    }
    tok *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line;
    return t;
}

// ---- lexer ----
typedef struct L {
    P *p;
    const char *s;
    size_t n, pos;
    int line;
} L;

static size_t space_at(const char *s, size_t n, size_t i) {  // length of one \s char at i, 0 if none
    if (i >= n) return 0;
    size_t adv;
    uint32_t c = ct_u8_decode((const unsigned char *)s + i, n - i, &adv);
    return ct_is_space(c) ? adv : 0;
}

static void advance(L *l, size_t to) {
    for (size_t i = l->pos; i < to; i++)
        if (l->s[i] == '\n') l->line++;
    l->pos = to;
}

static bool emit_data(L *l, size_t from, size_t to, char sign, bool lstrip_ok) {
    size_t end = to;
    if (sign == '-') {  // text.rstrip()
        while (end > from) {
            size_t k = end - 1;
            while (k > from && ((unsigned char)l->s[k] & 0xc0) == 0x80) k--;
            if (space_at(l->s, end, k) == end - k) end = k;
            else break;
        }
    } else if (sign != '+' && lstrip_ok) {  // lstrip_blocks
        size_t lp = from;
        for (size_t k = to; k > from; k--)
            if (l->s[k - 1] == '\n') {
                lp = k;
                break;
            }
        bool line_starting = from == 0 || l->s[from - 1] == '\n';
        if (lp > from || line_starting) {
            bool only_blank = true;
            for (size_t k = lp; k < to; k++)
                if (l->s[k] != ' ' && l->s[k] != '\t') only_blank = false;
            if (only_blank) end = lp;
        }
    }
    if (end > from) {
        tok *t = push_tok(l->p, T_DATA, l->line);
        if (!t) return false;
        t->s = ar_strdup(l->p, l->s + from, end - from);
        t->len = end - from;
        if (!t->s) return false;
    }
    advance(l, to);
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha_(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

// (\d+_)*\d+ at i; returns end or i when absent
static size_t digits_us(const char *s, size_t n, size_t i) {
    if (i >= n || !is_digit(s[i])) return i;
    size_t j = i;
    for (;;) {
        while (j < n && is_digit(s[j])) j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) {
            j++;
            continue;
        }
        return j;
    }
}

static size_t match_float(const char *s, size_t n, size_t i) {
    if (i > 0 && s[i - 1] == '.') return 0;
    size_t j = digits_us(s, n, i);
    if (j == i) return 0;
    // alternative 1: (\.digits)? e[+-]?digits
    size_t k = j;
    if (k < n && s[k] == '.') {
        size_t m = digits_us(s, n, k + 1);
        if (m > k + 1) k = m;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t e = pass == 0 ? k : j;
        if (e < n && (s[e] == 'e' || s[e] == 'E')) {
            size_t m = e + 1;
            if (m < n && (s[m] == '+' || s[m] == '-')) m++;
            size_t q = digits_us(s, n, m);
            if (q > m) return q - i;
        }
        if (k == j) break;
    }
    // alternative 2: \.digits
    if (j < n && s[j] == '.') {
        size_t m = digits_us(s, n, j + 1);
        if (m > j + 1) return m - i;
    }
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t match_int(const char *s, size_t n, size_t i, int *base) {
    if (i >= n || !is_digit(s[i])) return 0;
    if (s[i] == '0' && i + 1 < n) {
        char x = s[i + 1] | 0x20;
        int b = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 0;
        if (b) {
            size_t j = i + 2;
            for (;;) {
                size_t k = j;
                if (k < n && s[k] == '_') k++;
                int hv = k < n ? hexval(s[k]) : -1;
                if (hv < 0 || hv >= b) break;
                j = k + 1;
            }
            if (j > i + 2) {
                *base = b;
                return j - i;
            }
        }
    }
    *base = 10;
    size_t j = i + 1;
    if (s[i] == '0') {
        while (j < n && (s[j] == '0' || (s[j] == '_' && j + 1 < n && s[j + 1] == '0')))
            j += s[j] == '_' ? 2 : 1;
        return j - i;
    }
    while (j < n && (is_digit(s[j]) || (s[j] == '_' && j + 1 < n && is_digit(s[j + 1]))))
        j += s[j] == '_' ? 2 : 1;
    return j - i;
}

static const struct {
    const char *s;
    uint8_t op;
} ops_tab[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GTEQ},
    {"<=", OP_LTEQ}, {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL},
    {"%", OP_MOD}, {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN}, {"{", OP_LBRACE}, {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT},
    {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON}, {"|", OP_PIPE}, {",", OP_COMMA},
    {";", OP_SEMICOLON},
};

static const char *op_str(int op) {
    for (size_t k = 0; k < sizeof ops_tab / sizeof ops_tab[0]; k++)
        if (ops_tab[k].op == op) return ops_tab[k].s;
    return "?";
}

// Python's unicode-escape decoding of a string literal's body (jinja2 does
// .encode("ascii", "backslashreplace").decode("unicode-escape")).
static bool decode_string(L *l, const char *s, size_t n, tok *t) {
    char *out = ar_alloc(l->p->ar, n * 4 + 1);
    if (!out) return perr(l->p, l->line, "out of memory") == 0;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            out[o++] = s[i++];
            continue;
        }
        if (i + 1 >= n) {  // cannot happen: the literal regex puts a char after each backslash
            out[o++] = '\\';
            break;
        }
        char c = s[i + 1];
        i += 2;
        uint32_t cp = 0;
        int nhex = 0;
        switch (c) {
        case '\n': continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = 7; continue;
        case 'b': out[o++] = 8; continue;
        case 'f': out[o++] = 12; continue;
        case 'n': out[o++] = '\n'; continue;
        case 'r': out[o++] = '\r'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'v': out[o++] = 11; continue;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        case 'N':
            return perr(l->p, l->line, "\\N{...} escapes in string literals are not supported") == 0;
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                o += (size_t)ct_u8_encode(cp, out + o);
                continue;
            }
            if ((unsigned char)c >= 0x80) {
                // backslashreplace turned the character into \xHH / \uHHHH / \UHHHHHHHH, and
                // the literal backslash escapes that escape's backslash
                size_t adv;
                uint32_t u = ct_u8_decode((const unsigned char *)s + i - 1, n - (i - 1), &adv);
                i = i - 1 + adv;
                if (u >= 0xdc80 && u <= 0xdcff) u -= 0xdc00;
                o += (size_t)sprintf(out + o, u <= 0xff ? "\\x%02x" : u <= 0xffff ? "\\u%04x" : "\\U%08x", u);
                continue;
            }
            out[o++] = '\\';
            out[o++] = c;
            continue;
        }
        for (int k = 0; k < nhex; k++) {
            int hv = i < n ? hexval(s[i]) : -1;
            if (hv < 0)
                return perr(l->p, l->line, "truncated \\%c escape in string literal", c) == 0;
            cp = cp * 16 + (uint32_t)hv;
            i++;
        }
        if (cp > 0x10ffff) return perr(l->p, l->line, "illegal Unicode character in string literal") == 0;
        o += (size_t)ct_u8_encode(cp, out + o);
    }
    out[o] = 0;
    t->s = out;
    t->len = o;
    return true;
}

// Tokens inside {{ }} / {% %} up to and including the closing delimiter.
static bool lex_tag(L *l, bool block) {
    char stack[CT_MAX_NEST + 1];
    int sp = 0;
    const char *s = l->s;
    size_t n = l->n;
    for (;;) {
        size_t i = l->pos;
        if (i >= n) return perr(l->p, l->line, "unexpected end of template inside a %s tag",
                                block ? "{% %}" : "{{ }}") == 0;
        if (sp == 0) {
            if (block) {
                if (i + 2 < n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}') {
                    if (!push_tok(l->p, T_BLOCK_END, l->line)) return false;
                    advance(l, i + 3);
                    return true;
                }
                if (i + 2 < n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') {
                    if (!push_tok(l->p, T_BLOCK_END, l->line)) return false;
                    size_t j = i + 3, w;
                    while ((w = space_at(s, n, j))) j += w;
                    advance(l, j);
                    return true;
                }
                if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') {
                    if (!push_tok(l->p, T_BLOCK_END, l->line)) return false;
                    size_t j = i + 2;
                    if (j < n && s[j] == '\n') j++;  // trim_blocks
                    advance(l, j);
                    return true;
                }
            } else {
                if (i + 2 < n && s[i] == '-' && s[i + 1] == '}' && s[i + 2] == '}') {
                    if (!push_tok(l->p, T_VAR_END, l->line)) return false;
                    size_t j = i + 3, w;
                    while ((w = space_at(s, n, j))) j += w;
                    advance(l, j);
                    return true;
                }
                if (i + 1 < n && s[i] == '}' && s[i + 1] == '}') {
                    if (!push_tok(l->p, T_VAR_END, l->line)) return false;
                    advance(l, i + 2);
                    return true;
                }
            }
        }
        size_t w = space_at(s, n, i);
        if (w) {
            while ((w = space_at(s, n, i))) i += w;
            advance(l, i);
            continue;
        }
        size_t m;
        int base;
        if ((m = match_float(s, n, i))) {
            char buf[64];
            size_t k = 0;
            for (size_t j = i; j < i + m && k < sizeof buf - 1; j++)
                if (s[j] != '_') buf[k++] = s[j];
            buf[k] = 0;
            tok *t = push_tok(l->p, T_FLOAT, l->line);
            if (!t) return false;
            t->f = strtod(buf, NULL);
            advance(l, i + m);
            continue;
        }
        if ((m = match_int(s, n, i, &base))) {
            uint64_t v = 0;
            size_t j = i + (base != 10 ? 2 : 0);
            for (; j < i + m; j++) {
                if (s[j] == '_') continue;
                int hv = hexval(s[j]);
                if (v > (UINT64_MAX - (uint64_t)hv) / (uint64_t)base || v * (uint64_t)base + (uint64_t)hv > (uint64_t)INT64_MAX)
                    return perr(l->p, l->line, "integer literal too large") == 0;
                v = v * (uint64_t)base + (uint64_t)hv;
            }
            tok *t = push_tok(l->p, T_INT, l->line);
            if (!t) return false;
            t->i = (int64_t)v;
            advance(l, i + m);
            continue;
        }
        if (is_alpha_(s[i])) {
            size_t j = i + 1;
            while (j < n && (is_alpha_(s[j]) || is_digit(s[j]))) j++;
            tok *t = push_tok(l->p, T_NAME, l->line);
            if (!t) return false;
            t->s = ar_strdup(l->p, s + i, j - i);
            t->len = j - i;
            if (!t->s) return false;
            advance(l, j);
            continue;
        }
        if (s[i] == '\'' || s[i] == '"') {
            char q = s[i];
            size_t j = i + 1;
            while (j < n && s[j] != q) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
            if (j < n && s[j] == q) {
                tok *t = push_tok(l->p, T_STRING, l->line);
                if (!t || !decode_string(l, s + i + 1, j - i - 1, t)) return false;
                advance(l, j + 1);
                continue;
            }
            // an unterminated quote matches no rule
        }
        int op = 0;
        size_t oplen = 0;
        for (size_t k = 0; k < sizeof ops_tab / sizeof ops_tab[0]; k++) {
            size_t ln = strlen(ops_tab[k].s);
            if (i + ln <= n && !memcmp(s + i, ops_tab[k].s, ln)) {
                op = ops_tab[k].op;
                oplen = ln;
                break;
            }
        }
        if (!op) {
            size_t adv;
            uint32_t c = ct_u8_decode((const unsigned char *)s + i, n - i, &adv);
            if (c >= 0x20 && c < 0x7f) return perr(l->p, l->line, "unexpected char '%c'", (char)c) == 0;
            return perr(l->p, l->line, "unexpected char U+%04X", c) == 0;
        }
        if (op == OP_LPAREN || op == OP_LBRACKET || op == OP_LBRACE) {
            if (sp >= CT_MAX_NEST) return perr(l->p, l->line, "brackets nested too deeply") == 0;
            stack[sp++] = op == OP_LPAREN ? ')' : op == OP_LBRACKET ? ']' : '}';
        } else if (op == OP_RPAREN || op == OP_RBRACKET || op == OP_RBRACE) {
            char c = s[i];
            if (sp == 0) return perr(l->p, l->line, "unexpected '%c'", c) == 0;
            if (stack[sp - 1] != c)
                return perr(l->p, l->line, "unexpected '%c', expected '%c'", c, stack[sp - 1]) == 0;
            sp--;
        }
        tok *t = push_tok(l->p, T_OP, l->line);
        if (!t) return false;
        t->op = (uint8_t)op;
        advance(l, i + oplen);
    }
}

// {%[-+]?\s*raw\s*(-%}\s*|%}) at i: returns the end, 0 when absent
static size_t match_raw_begin(const char *s, size_t n, size_t i, char *sign) {
    size_t j = i + 2, w;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    while ((w = space_at(s, n, j))) j += w;
    if (j + 3 > n || memcmp(s + j, "raw", 3)) return 0;
    j += 3;
    while ((w = space_at(s, n, j))) j += w;
    if (j + 2 < n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') {
        j += 3;
        while ((w = space_at(s, n, j))) j += w;
        return j;
    }
    if (j + 1 < n && s[j] == '%' && s[j + 1] == '}') return j + 2;
    return 0;
}

// {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?) at i
static size_t match_raw_end(const char *s, size_t n, size_t i, char *sign) {
    if (i + 1 >= n || s[i] != '{' || s[i + 1] != '%') return 0;
    size_t j = i + 2, w;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    while ((w = space_at(s, n, j))) j += w;
    if (j + 6 > n || memcmp(s + j, "endraw", 6)) return 0;
    j += 6;
    while ((w = space_at(s, n, j))) j += w;
    if (j + 2 < n && s[j] == '+' && s[j + 1] == '%' && s[j + 2] == '}') return j + 3;
    if (j + 2 < n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') {
        j += 3;
        while ((w = space_at(s, n, j))) j += w;
        return j;
    }
    if (j + 1 < n && s[j] == '%' && s[j + 1] == '}') {
        j += 2;
        if (j < n && s[j] == '\n') j++;
        return j;
    }
    return 0;
}

static bool lex(P *p, const char *s, size_t n) {
    L l = {.p = p, .s = s, .n = n, .pos = 0, .line = 1};
    while (l.pos < n) {
        size_t q = l.pos;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= n) {
            if (!emit_data(&l, l.pos, n, 0, false)) return false;
            break;
        }
        char kind = s[q + 1];
        char sign = (q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+')) ? s[q + 2] : 0;
        if (kind == '%') {
            char rsign;
            size_t rend = match_raw_begin(s, n, q, &rsign);
            if (rend) {
                if (!emit_data(&l, l.pos, q, rsign, true)) return false;
                advance(&l, rend);
                size_t k = l.pos, e = 0;
                char esign = 0;
                for (; k < n; k++)
                    if ((e = match_raw_end(s, n, k, &esign))) break;
                if (!e) return perr(p, l.line, "missing end of raw directive") == 0;
                if (!emit_data(&l, l.pos, k, esign, true)) return false;
                advance(&l, e);
                continue;
            }
        }
        if (!emit_data(&l, l.pos, q, sign, kind != '{')) return false;
        size_t body = q + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t k = body, e = 0;
            for (; k < n; k++) {
                if (k + 2 < n && s[k] == '+' && s[k + 1] == '#' && s[k + 2] == '}') {
                    e = k + 3;
                    break;
                }
                if (k + 2 < n && s[k] == '-' && s[k + 1] == '#' && s[k + 2] == '}') {
                    size_t w;
                    e = k + 3;
                    while ((w = space_at(s, n, e))) e += w;
                    break;
                }
                if (k + 1 < n && s[k] == '#' && s[k + 1] == '}') {
                    e = k + 2;
                    if (e < n && s[e] == '\n') e++;
                    break;
                }
            }
            if (!e) return perr(p, l.line, "missing end of comment tag") == 0;
            advance(&l, e);
            continue;
        }
        if (!push_tok(p, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, l.line)) return false;
        advance(&l, body);
        if (!lex_tag(&l, kind == '%')) return false;
    }
    return push_tok(p, T_EOF, l.line) != NULL;
}

// ---- parser ----
static tok *cur(P *p) { return &p->t[p->i]; }
static tok *look(P *p) { return &p->t[p->i + 1 < p->n ? p->i + 1 : p->i]; }
static void nxt(P *p) {
    if (p->i + 1 < p->n) p->i++;
}
static bool is_name(const tok *t, const char *s) { return t->type == T_NAME && !strcmp(t->s, s); }
static bool is_op(const tok *t, int op) { return t->type == T_OP && t->op == op; }

static const char *describe(const tok *t, char *buf, size_t n) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "begin of print statement";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_BEGIN: return "begin of statement block";
    case T_BLOCK_END: return "end of statement block";
    case T_NAME: snprintf(buf, n, "'%s'", t->s); return buf;
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    case T_OP: snprintf(buf, n, "'%s'", op_str(t->op)); return buf;
    }
    return "token";
}

static bool expect_op(P *p, int op) {
    if (!is_op(cur(p), op)) {
        char b[80];
        return perr(p, cur(p)->line, "expected '%s', got %s", op_str(op),
                    describe(cur(p), b, sizeof b)) == 0;
    }
    nxt(p);
    return true;
}

static bool expect_type(P *p, int type, const char *what) {
    if (cur(p)->type != type) {
        char b[80];
        return perr(p, cur(p)->line, "expected %s, got %s", what, describe(cur(p), b, sizeof b)) == 0;
    }
    nxt(p);
    return true;
}

static bool expect_name(P *p, const char *name) {
    if (!is_name(cur(p), name)) {
        char b[80];
        return perr(p, cur(p)->line, "expected '%s', got %s", name, describe(cur(p), b, sizeof b)) == 0;
    }
    nxt(p);
    return true;
}

static ct_node *mk(P *p, int kind, int line) {
    ct_node *nd = ar_alloc(p->ar, sizeof *nd);
    if (!nd) {
        perr(p, line, "out of memory");
        return NULL;
    }
    nd->kind = (uint8_t)kind;
    nd->line = line;
    nd->fid = -1;
    return nd;
}

static int hgt(const ct_node *n) { return n ? n->depth : 0; }

// Computes the subtree height; fails when it exceeds what the evaluator may recurse.
static ct_node *seal(P *p, ct_node *nd) {
    if (!nd) return NULL;
    int d = hgt(nd->a);
    if (hgt(nd->b) > d) d = hgt(nd->b);
    if (hgt(nd->c) > d) d = hgt(nd->c);
    for (int i = 0; i < nd->nkids; i++)
        if (hgt(nd->kids[i]) > d) d = hgt(nd->kids[i]);
    for (int i = 0; i < nd->nkids2; i++)
        if (hgt(nd->kids2[i]) > d) d = hgt(nd->kids2[i]);
    nd->depth = d + 1;
    if (nd->depth > CT_MAX_AST_DEPTH) {
        perr(p, nd->line, "template nested too deeply (more than %d levels)", CT_MAX_AST_DEPTH);
        return NULL;
    }
    return nd;
}

// growable node-pointer vectors, arena-backed
typedef struct nvec {
    ct_node **v;
    int n, cap;
} nvec;

static bool nvec_push(P *p, nvec *v, ct_node *x) {
    if (!x) return false;
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        ct_node **nv = ar_alloc(p->ar, (size_t)cap * sizeof(ct_node *));
        if (!nv) return perr(p, 0, "out of memory") == 0;
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof(ct_node *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

typedef struct svec {
    const char **v;
    int n, cap;
} svec;

static bool svec_push(P *p, svec *v, const char *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        const char **nv = ar_alloc(p->ar, (size_t)cap * sizeof(char *));
        if (!nv) return perr(p, 0, "out of memory") == 0;
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof(char *));
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return true;
}

static bool add_const(P *p, ct_value v) {
    ct_template_ast *a = p->ast;
    if (a->nconsts == a->constcap) {
        size_t cap = a->constcap ? a->constcap * 2 : 16;
        ct_value *nv = realloc(a->consts, cap * sizeof(ct_value));
        if (!nv) return perr(p, 0, "out of memory") == 0;
        a->consts = nv;
        a->constcap = cap;
    }
    ct_make_immortal(v);
    a->consts[a->nconsts++] = v;
    return true;
}

static ct_node *mk_const_str(P *p, const char *s, size_t n, int line) {
    ct_node *nd = mk(p, N_CONST, line);
    if (!nd) return NULL;
    nd->val = ct_str_new(NULL, s, n);
    if (nd->val.type != CT_STR) {
        perr(p, line, "string literal too large or out of memory");
        return NULL;
    }
    if (!add_const(p, nd->val)) return NULL;
    return seal(p, nd);
}

static bool enter(P *p, int line) {
    if (++p->nest > CT_MAX_NEST) {
        perr(p, line, "template nested too deeply (more than %d levels)", CT_MAX_NEST);
        return false;
    }
    return true;
}
static void leave(P *p) { p->nest--; }

static ct_node *parse_expression(P *p, bool with_condexpr);
static ct_node *parse_tuple(P *p, bool simplified, bool with_condexpr, const char *const *end_rules, bool explicit_parens);
static ct_node *parse_primary(P *p);
static ct_node *parse_postfix(P *p, ct_node *node);
static ct_node *parse_filter(P *p, ct_node *node, bool start_inline);
static ct_node *parse_unary(P *p, bool with_filter);

// (args, kwargs, *dyn_args, **dyn_kwargs) with jinja2's ordering rules
static bool parse_call_args(P *p, nvec *args, nvec *kwv, svec *kwn, ct_node **dyn_args, ct_node **dyn_kwargs) {
    int line = cur(p)->line;
    if (!expect_op(p, OP_LPAREN)) return false;
    bool require_comma = false;
    *dyn_args = *dyn_kwargs = NULL;
    while (!is_op(cur(p), OP_RPAREN)) {
        if (p->failed) return false;
        if (require_comma) {
            if (!expect_op(p, OP_COMMA)) return false;
            if (is_op(cur(p), OP_RPAREN)) break;
        }
        if (is_op(cur(p), OP_MUL)) {
            if (*dyn_args || *dyn_kwargs) return perr(p, line, "invalid syntax for function call expression") == 0;
            nxt(p);
            if (!(*dyn_args = parse_expression(p, true))) return false;
        } else if (is_op(cur(p), OP_POW)) {
            if (*dyn_kwargs) return perr(p, line, "invalid syntax for function call expression") == 0;
            nxt(p);
            if (!(*dyn_kwargs = parse_expression(p, true))) return false;
        } else if (cur(p)->type == T_NAME && is_op(look(p), OP_ASSIGN)) {
            if (*dyn_kwargs) return perr(p, line, "invalid syntax for function call expression") == 0;
            const char *key = cur(p)->s;
            nxt(p);
            nxt(p);
            if (!svec_push(p, kwn, key) || !nvec_push(p, kwv, parse_expression(p, true))) return false;
        } else {
            if (kwv->n || *dyn_args || *dyn_kwargs)
                return perr(p, line, "invalid syntax for function call expression") == 0;
            if (!nvec_push(p, args, parse_expression(p, true))) return false;
        }
        require_comma = true;
    }
    return expect_op(p, OP_RPAREN);
}

static void set_args(ct_node *nd, nvec *args, nvec *kwv, svec *kwn) {
    nd->kids = args->v;
    nd->nkids = args->n;
    nd->kids2 = kwv->v;
    nd->nkids2 = kwv->n;
    nd->names = kwn->v;
    nd->nnames = kwn->n;
}

static const char *dotted_name(P *p) {
    if (cur(p)->type != T_NAME) {
        char b[80];
        perr(p, cur(p)->line, "expected name, got %s", describe(cur(p), b, sizeof b));
        return NULL;
    }
    const char *name = cur(p)->s;
    nxt(p);
    while (is_op(cur(p), OP_DOT)) {
        nxt(p);
        if (cur(p)->type != T_NAME) {
            perr(p, cur(p)->line, "expected name after '.'");
            return NULL;
        }
        size_t a = strlen(name), b = strlen(cur(p)->s);
        char *nn = ar_alloc(p->ar, a + b + 2);
        if (!nn) {
            perr(p, 0, "out of memory");
            return NULL;
        }
        memcpy(nn, name, a);
        nn[a] = '.';
        memcpy(nn + a + 1, cur(p)->s, b + 1);
        name = nn;
        nxt(p);
    }
    return name;
}

static ct_node *parse_filter(P *p, ct_node *node, bool start_inline) {
    while (is_op(cur(p), OP_PIPE) || start_inline) {
        if (p->failed) return NULL;
        if (!start_inline) nxt(p);
        int line = cur(p)->line;
        const char *name = dotted_name(p);
        if (!name) return NULL;
        ct_node *f = mk(p, N_FILTER, line);
        if (!f) return NULL;
        f->a = node;
        f->name = name;
        f->fid = ct_filter_id(name);
        nvec args = {0}, kwv = {0};
        svec kwn = {0};
        if (is_op(cur(p), OP_LPAREN) && !parse_call_args(p, &args, &kwv, &kwn, &f->b, &f->c)) return NULL;
        set_args(f, &args, &kwv, &kwn);
        node = seal(p, f);
        if (!node) return NULL;
        start_inline = false;
    }
    return node;
}

static ct_node *parse_test(P *p, ct_node *node) {
    int line = cur(p)->line;
    nxt(p);  // 'is'
    bool negated = false;
    if (is_name(cur(p), "not")) {
        nxt(p);
        negated = true;
    }
    const char *name = dotted_name(p);
    if (!name) return NULL;
    ct_node *t = mk(p, N_TEST, line);
    if (!t) return NULL;
    t->a = node;
    t->name = name;
    t->fid = ct_test_id(name);
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    tok *c = cur(p);
    if (is_op(c, OP_LPAREN)) {
        if (!parse_call_args(p, &args, &kwv, &kwn, &t->b, &t->c)) return NULL;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                is_op(c, OP_LBRACKET) || is_op(c, OP_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) {
            perr(p, c->line, "You cannot chain multiple tests with is");
            return NULL;
        }
        ct_node *arg = parse_postfix(p, parse_primary(p));
        if (!nvec_push(p, &args, arg)) return NULL;
    }
    set_args(t, &args, &kwv, &kwn);
    if (!seal(p, t)) return NULL;
    if (negated) {
        ct_node *nt = mk(p, N_NOT, line);
        if (!nt) return NULL;
        nt->a = t;
        return seal(p, nt);
    }
    return t;
}

static ct_node *parse_subscribed(P *p) {
    int line = cur(p)->line;
    ct_node *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), OP_COLON)) {
        nxt(p);
    } else {
        ct_node *node = parse_expression(p, true);
        if (!node) return NULL;
        if (!is_op(cur(p), OP_COLON)) return node;
        nxt(p);
        args[0] = node;
    }
    if (is_op(cur(p), OP_COLON)) {
        // stop omitted
    } else if (!is_op(cur(p), OP_RBRACKET) && !is_op(cur(p), OP_COMMA)) {
        args[1] = parse_expression(p, true);
        if (!args[1]) return NULL;
    }
    if (is_op(cur(p), OP_COLON)) {
        nxt(p);
        if (!is_op(cur(p), OP_RBRACKET) && !is_op(cur(p), OP_COMMA)) {
            args[2] = parse_expression(p, true);
            if (!args[2]) return NULL;
        }
    }
    ct_node *s = mk(p, N_SLICE, line);
    if (!s) return NULL;
    s->a = args[0], s->b = args[1], s->c = args[2];
    return seal(p, s);
}

static ct_node *parse_subscript(P *p, ct_node *node) {
    tok *t = cur(p);
    int line = t->line;
    nxt(p);
    if (t->type == T_OP && t->op == OP_DOT) {
        tok *a = cur(p);
        nxt(p);
        if (a->type == T_NAME) {
            ct_node *g = mk(p, N_GETATTR, line);
            if (!g) return NULL;
            g->a = node;
            g->name = a->s;
            return seal(p, g);
        }
        if (a->type != T_INT) {
            perr(p, a->line, "expected name or number");
            return NULL;
        }
        ct_node *k = mk(p, N_CONST, a->line);
        if (!k) return NULL;
        k->val = ct_int(a->i);
        ct_node *g = mk(p, N_GETITEM, line);
        if (!g) return NULL;
        g->a = node;
        g->b = seal(p, k);
        return seal(p, g);
    }
    // '['
    nvec args = {0};
    while (!is_op(cur(p), OP_RBRACKET)) {
        if (p->failed) return NULL;
        if (args.n && !expect_op(p, OP_COMMA)) return NULL;
        if (!nvec_push(p, &args, parse_subscribed(p))) return NULL;
    }
    if (!expect_op(p, OP_RBRACKET)) return NULL;
    ct_node *arg;
    if (args.n == 1) {
        arg = args.v[0];
    } else {
        arg = mk(p, N_TUPLE, line);
        if (!arg) return NULL;
        arg->kids = args.v;
        arg->nkids = args.n;
        if (!seal(p, arg)) return NULL;
    }
    ct_node *g = mk(p, N_GETITEM, line);
    if (!g) return NULL;
    g->a = node;
    g->b = arg;
    return seal(p, g);
}

static ct_node *parse_call(P *p, ct_node *node) {
    ct_node *c = mk(p, N_CALL, cur(p)->line);
    if (!c) return NULL;
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    if (!parse_call_args(p, &args, &kwv, &kwn, &c->b, &c->c)) return NULL;
    c->a = node;
    set_args(c, &args, &kwv, &kwn);
    return seal(p, c);
}

static ct_node *parse_postfix(P *p, ct_node *node) {
    while (node && !p->failed) {
        if (is_op(cur(p), OP_DOT) || is_op(cur(p), OP_LBRACKET)) node = parse_subscript(p, node);
        else if (is_op(cur(p), OP_LPAREN)) node = parse_call(p, node);
        else break;
    }
    return p->failed ? NULL : node;
}

static ct_node *parse_filter_expr(P *p, ct_node *node) {
    while (node && !p->failed) {
        if (is_op(cur(p), OP_PIPE)) node = parse_filter(p, node, false);
        else if (is_name(cur(p), "is")) node = parse_test(p, node);
        else if (is_op(cur(p), OP_LPAREN)) node = parse_call(p, node);
        else break;
    }
    return p->failed ? NULL : node;
}

static ct_node *parse_list(P *p) {
    int line = cur(p)->line;
    if (!expect_op(p, OP_LBRACKET)) return NULL;
    nvec items = {0};
    while (!is_op(cur(p), OP_RBRACKET)) {
        if (p->failed) return NULL;
        if (items.n) {
            if (!expect_op(p, OP_COMMA)) return NULL;
            if (is_op(cur(p), OP_RBRACKET)) break;
        }
        if (!nvec_push(p, &items, parse_expression(p, true))) return NULL;
    }
    if (!expect_op(p, OP_RBRACKET)) return NULL;
    ct_node *l = mk(p, N_LIST, line);
    if (!l) return NULL;
    l->kids = items.v;
    l->nkids = items.n;
    return seal(p, l);
}

static ct_node *parse_dict(P *p) {
    int line = cur(p)->line;
    if (!expect_op(p, OP_LBRACE)) return NULL;
    nvec keys = {0}, vals = {0};
    while (!is_op(cur(p), OP_RBRACE)) {
        if (p->failed) return NULL;
        if (keys.n) {
            if (!expect_op(p, OP_COMMA)) return NULL;
            if (is_op(cur(p), OP_RBRACE)) break;
        }
        if (!nvec_push(p, &keys, parse_expression(p, true))) return NULL;
        if (!expect_op(p, OP_COLON)) return NULL;
        if (!nvec_push(p, &vals, parse_expression(p, true))) return NULL;
    }
    if (!expect_op(p, OP_RBRACE)) return NULL;
    ct_node *d = mk(p, N_DICT, line);
    if (!d) return NULL;
    d->kids = keys.v;
    d->nkids = keys.n;
    d->kids2 = vals.v;
    d->nkids2 = vals.n;
    return seal(p, d);
}

static ct_node *parse_primary(P *p) {
    tok *t = cur(p);
    ct_node *nd;
    switch (t->type) {
    case T_NAME:
        nd = mk(p, N_CONST, t->line);
        if (!nd) break;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) nd->val = ct_bool(true);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) nd->val = ct_bool(false);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) nd->val = ct_none();
        else {
            nd->kind = N_NAME;
            nd->name = t->s;
        }
        nxt(p);
        nd = seal(p, nd);
        break;
    case T_STRING: {
        // adjacent literals concatenate
        size_t total = 0, k = p->i;
        while (p->t[k].type == T_STRING) total += p->t[k++].len;
        char *buf = malloc(total + 1);
        if (!buf) {
            perr(p, t->line, "out of memory");
            nd = NULL;
            break;
        }
        size_t o = 0;
        while (cur(p)->type == T_STRING) {
            memcpy(buf + o, cur(p)->s, cur(p)->len);
            o += cur(p)->len;
            nxt(p);
        }
        nd = mk_const_str(p, buf, o, t->line);
        free(buf);
        break;
    }
    case T_INT:
    case T_FLOAT:
        nd = mk(p, N_CONST, t->line);
        if (nd) {
            nd->val = t->type == T_INT ? ct_int(t->i) : ct_float(t->f);
            nxt(p);
            nd = seal(p, nd);
        }
        break;
    case T_OP:
        if (t->op == OP_LPAREN) {
            nxt(p);
            nd = parse_tuple(p, false, true, NULL, true);
            if (nd && !expect_op(p, OP_RPAREN)) nd = NULL;
            break;
        }
        if (t->op == OP_LBRACKET) {
            nd = parse_list(p);
            break;
        }
        if (t->op == OP_LBRACE) {
            nd = parse_dict(p);
            break;
        }
        /* fall through */
    default: {
        char b[80];
        perr(p, t->line, "unexpected %s", describe(t, b, sizeof b));
        nd = NULL;
    }
    }
    return p->failed ? NULL : nd;
}

static ct_node *parse_unary(P *p, bool with_filter) {
    tok *t = cur(p);
    ct_node *node;
    if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
        if (!enter(p, t->line)) return NULL;
        nxt(p);
        node = mk(p, N_UNARY, t->line);
        if (node) {
            node->op = t->op;
            node->a = parse_unary(p, false);
            node = node->a ? seal(p, node) : NULL;
        }
        leave(p);
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    return node;
}

static ct_node *binop(P *p, int kind, int op, ct_node *a, ct_node *b, int line) {
    if (!a || !b) return NULL;
    ct_node *n = mk(p, kind, line);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return seal(p, n);
}

static ct_node *parse_pow(P *p) {
    ct_node *left = parse_unary(p, true);
    while (left && is_op(cur(p), OP_POW)) {
        int line = cur(p)->line;
        nxt(p);
        left = binop(p, N_BINOP, OP_POW, left, parse_unary(p, true), line);
    }
    return left;
}

static ct_node *parse_math2(P *p) {
    ct_node *left = parse_pow(p);
    while (left && cur(p)->type == T_OP &&
           (cur(p)->op == OP_MUL || cur(p)->op == OP_DIV || cur(p)->op == OP_FLOORDIV || cur(p)->op == OP_MOD)) {
        int op = cur(p)->op, line = cur(p)->line;
        nxt(p);
        left = binop(p, N_BINOP, op, left, parse_pow(p), line);
    }
    return left;
}

static ct_node *parse_concat(P *p) {
    int line = cur(p)->line;
    ct_node *first = parse_math2(p);
    if (!first || !is_op(cur(p), OP_TILDE)) return first;
    nvec args = {0};
    if (!nvec_push(p, &args, first)) return NULL;
    while (is_op(cur(p), OP_TILDE)) {
        nxt(p);
        if (!nvec_push(p, &args, parse_math2(p))) return NULL;
    }
    ct_node *c = mk(p, N_CONCAT, line);
    if (!c) return NULL;
    c->kids = args.v;
    c->nkids = args.n;
    return seal(p, c);
}

static ct_node *parse_math1(P *p) {
    ct_node *left = parse_concat(p);
    while (left && cur(p)->type == T_OP && (cur(p)->op == OP_ADD || cur(p)->op == OP_SUB)) {
        int op = cur(p)->op, line = cur(p)->line;
        nxt(p);
        left = binop(p, N_BINOP, op, left, parse_concat(p), line);
    }
    return left;
}

static ct_node *parse_compare(P *p) {
    int line = cur(p)->line;
    ct_node *expr = parse_math1(p);
    if (!expr) return NULL;
    nvec operands = {0};
    uint8_t ops[256];
    for (;;) {
        tok *t = cur(p);
        int op;
        if (t->type == T_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
                                t->op == OP_LTEQ || t->op == OP_GT || t->op == OP_GTEQ)) {
            op = t->op;
            nxt(p);
        } else if (is_name(t, "in")) {
            op = OP_IN;
            nxt(p);
        } else if (is_name(t, "not") && is_name(look(p), "in")) {
            op = OP_NOTIN;
            nxt(p);
            nxt(p);
        } else {
            break;
        }
        if (operands.n >= 255) {
            perr(p, line, "too many chained comparisons");
            return NULL;
        }
        ops[operands.n] = (uint8_t)op;
        if (!nvec_push(p, &operands, parse_math1(p))) return NULL;
    }
    if (!operands.n) return expr;
    ct_node *c = mk(p, N_COMPARE, line);
    if (!c) return NULL;
    c->a = expr;
    c->kids = operands.v;
    c->nkids = operands.n;
    c->ops = ar_alloc(p->ar, (size_t)operands.n);
    if (!c->ops) {
        perr(p, line, "out of memory");
        return NULL;
    }
    memcpy(c->ops, ops, (size_t)operands.n);
    return seal(p, c);
}

static ct_node *parse_not(P *p) {
    if (is_name(cur(p), "not")) {
        int line = cur(p)->line;
        if (!enter(p, line)) return NULL;
        nxt(p);
        ct_node *n = mk(p, N_NOT, line);
        if (n) {
            n->a = parse_not(p);
            n = n->a ? seal(p, n) : NULL;
        }
        leave(p);
        return n;
    }
    return parse_compare(p);
}

static ct_node *parse_and(P *p) {
    ct_node *left = parse_not(p);
    while (left && is_name(cur(p), "and")) {
        int line = cur(p)->line;
        nxt(p);
        left = binop(p, N_AND, 0, left, parse_not(p), line);
    }
    return left;
}

static ct_node *parse_or(P *p) {
    ct_node *left = parse_and(p);
    while (left && is_name(cur(p), "or")) {
        int line = cur(p)->line;
        nxt(p);
        left = binop(p, N_OR, 0, left, parse_and(p), line);
    }
    return left;
}

static ct_node *parse_condexpr(P *p) {
    ct_node *expr1 = parse_or(p);
    while (expr1 && is_name(cur(p), "if")) {
        int line = cur(p)->line;
        nxt(p);
        ct_node *test = parse_or(p);
        if (!test) return NULL;
        ct_node *expr3 = NULL;
        if (is_name(cur(p), "else")) {
            nxt(p);
            if (!enter(p, line)) return NULL;
            expr3 = parse_condexpr(p);
            leave(p);
            if (!expr3) return NULL;
        }
        ct_node *c = mk(p, N_CONDEXPR, line);
        if (!c) return NULL;
        c->a = test;
        c->b = expr1;
        c->c = expr3;
        expr1 = seal(p, c);
    }
    return expr1;
}

// Every nested expression (parentheses, subscripts, call arguments, list items) passes here,
// so the recursion depth of the parser is bounded by CT_MAX_NEST.
static ct_node *parse_expression(P *p, bool with_condexpr) {
    if (!enter(p, cur(p)->line)) return NULL;
    ct_node *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    leave(p);
    return n;
}

static bool match_end_rule(P *p, const char *const *rules) {
    if (!rules) return false;
    for (int i = 0; rules[i]; i++)
        if (is_name(cur(p), rules[i])) return true;
    return false;
}

static bool is_tuple_end(P *p, const char *const *rules) {
    tok *t = cur(p);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || is_op(t, OP_RPAREN)) return true;
    return match_end_rule(p, rules);
}

static ct_node *parse_tuple(P *p, bool simplified, bool with_condexpr, const char *const *end_rules,
                            bool explicit_parens) {
    int line = cur(p)->line;
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (p->failed) return NULL;
        if (args.n && !expect_op(p, OP_COMMA)) return NULL;
        if (is_tuple_end(p, end_rules)) break;
        ct_node *e = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!nvec_push(p, &args, e)) return NULL;
        if (is_op(cur(p), OP_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char b[80];
            perr(p, cur(p)->line, "expected an expression, got %s", describe(cur(p), b, sizeof b));
            return NULL;
        }
    }
    ct_node *t = mk(p, N_TUPLE, line);
    if (!t) return NULL;
    t->kids = args.v;
    t->nkids = args.n;
    return seal(p, t);
}

// ---- statements ----
static bool subparse(P *p, const char *const *end_tokens, nvec *body);
static ct_node *parse_statement(P *p);

static bool can_assign(const ct_node *t) {
    if (t->kind == N_NAME) return true;
    if (t->kind == N_TUPLE) {
        for (int i = 0; i < t->nkids; i++)
            if (!can_assign(t->kids[i])) return false;
        return true;
    }
    return false;
}

static ct_node *parse_assign_target(P *p, bool with_tuple, bool name_only, const char *const *end_rules,
                                    bool with_namespace) {
    int line = cur(p)->line;
    ct_node *target;
    if (with_namespace && cur(p)->type == T_NAME && is_op(look(p), OP_DOT)) {
        const char *var = cur(p)->s;
        nxt(p);
        nxt(p);
        if (cur(p)->type != T_NAME) {
            perr(p, line, "expected attribute name after '.'");
            return NULL;
        }
        target = mk(p, N_NSREF, line);
        if (!target) return NULL;
        target->name = var;
        target->name2 = cur(p)->s;
        nxt(p);
        return seal(p, target);
    }
    if (name_only) {
        if (cur(p)->type != T_NAME) {
            char b[80];
            perr(p, line, "expected name, got %s", describe(cur(p), b, sizeof b));
            return NULL;
        }
        target = parse_primary(p);
    } else if (with_tuple) {
        target = parse_tuple(p, true, true, end_rules, false);
    } else {
        target = parse_primary(p);
    }
    if (!target) return NULL;
    if (!can_assign(target)) {
        perr(p, line, "can't assign to this expression");
        return NULL;
    }
    return target;
}

// {% ... %} body up to one of end_tokens; leaves the parser on the end tag's name
static bool parse_statements(P *p, const char *const *end_tokens, bool drop_needle, nvec *body, const char *block) {
    if (is_op(cur(p), OP_COLON)) nxt(p);
    if (!expect_type(p, T_BLOCK_END, "end of statement block")) return false;
    if (!subparse(p, end_tokens, body)) return false;
    if (cur(p)->type == T_EOF) {
        char want[160] = "";
        for (int i = 0; end_tokens[i]; i++) {
            size_t k = strlen(want);
            snprintf(want + k, sizeof want - k, "%s'%s'", i ? " or " : "", end_tokens[i]);
        }
        return perr(p, cur(p)->line, "unexpected end of template: the '%s' block needs %s", block, want) == 0;
    }
    if (drop_needle) nxt(p);
    return true;
}

static ct_node *stmt_node(P *p, int kind, int line, nvec *body) {
    ct_node *n = mk(p, kind, line);
    if (!n) return NULL;
    if (body) {
        n->kids = body->v;
        n->nkids = body->n;
    }
    return n;
}

static ct_node *parse_for(P *p) {
    int line = cur(p)->line;
    nxt(p);
    static const char *const in_rule[] = {"in", NULL};
    static const char *const rec_rule[] = {"recursive", NULL};
    ct_node *target = parse_assign_target(p, true, false, in_rule, false);
    if (!target || !expect_name(p, "in")) return NULL;
    ct_node *iter = parse_tuple(p, false, false, rec_rule, false);
    if (!iter) return NULL;
    ct_node *test = NULL;
    if (is_name(cur(p), "if")) {
        nxt(p);
        test = parse_expression(p, true);
        if (!test) return NULL;
    }
    bool recursive = false;
    if (is_name(cur(p), "recursive")) {
        nxt(p);
        recursive = true;
    }
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    nvec body = {0}, els = {0};
    p->loop_depth++;
    bool ok = parse_statements(p, ends, false, &body, "for");
    p->loop_depth--;
    if (!ok) return NULL;
    bool has_else = is_name(cur(p), "else");
    nxt(p);
    if (has_else && !parse_statements(p, end_only, true, &els, "for")) return NULL;
    ct_node *n = stmt_node(p, S_FOR, line, &body);
    if (!n) return NULL;
    n->a = target;
    n->b = iter;
    n->c = test;
    n->kids2 = els.v;
    n->nkids2 = els.n;
    n->flags = recursive;
    return seal(p, n);
}

static ct_node *parse_if(P *p) {
    int line = cur(p)->line;
    nxt(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const end_only[] = {"endif", NULL};
    ct_node *test = parse_tuple(p, false, false, NULL, false);
    if (!test) return NULL;
    nvec body = {0}, els = {0};
    if (!parse_statements(p, ends, false, &body, "if")) return NULL;
    ct_node *n = stmt_node(p, S_IF, line, &body);
    if (!n) return NULL;
    n->a = test;
    if (is_name(cur(p), "elif")) {
        if (!enter(p, line)) return NULL;
        ct_node *sub = parse_if(p);  // consumes the rest of the chain, endif included
        leave(p);
        if (!nvec_push(p, &els, sub)) return NULL;
    } else if (is_name(cur(p), "else")) {
        nxt(p);
        if (!parse_statements(p, end_only, true, &els, "if")) return NULL;
    } else {
        nxt(p);  // endif
    }
    n->kids2 = els.v;
    n->nkids2 = els.n;
    return seal(p, n);
}

static ct_node *parse_set(P *p) {
    int line = cur(p)->line;
    nxt(p);
    ct_node *target = parse_assign_target(p, true, false, NULL, true);
    if (!target) return NULL;
    if (is_op(cur(p), OP_ASSIGN)) {
        nxt(p);
        ct_node *expr = parse_tuple(p, false, true, NULL, false);
        if (!expr) return NULL;
        ct_node *n = stmt_node(p, S_SET, line, NULL);
        if (!n) return NULL;
        n->a = target;
        n->b = expr;
        return seal(p, n);
    }
    ct_node *filter = parse_filter(p, NULL, false);
    if (p->failed) return NULL;
    static const char *const ends[] = {"endset", NULL};
    nvec body = {0};
    if (!parse_statements(p, ends, true, &body, "set")) return NULL;
    ct_node *n = stmt_node(p, S_SETBLOCK, line, &body);
    if (!n) return NULL;
    n->a = target;
    n->b = filter;
    return seal(p, n);
}

static bool parse_signature(P *p, ct_node *n) {
    svec names = {0};
    nvec defaults = {0};
    if (!expect_op(p, OP_LPAREN)) return false;
    while (!is_op(cur(p), OP_RPAREN)) {
        if (p->failed) return false;
        if (names.n && !expect_op(p, OP_COMMA)) return false;
        ct_node *arg = parse_assign_target(p, false, true, NULL, false);
        if (!arg) return false;
        if (!svec_push(p, &names, arg->name)) return false;
        if (is_op(cur(p), OP_ASSIGN)) {
            nxt(p);
            if (!nvec_push(p, &defaults, parse_expression(p, true))) return false;
        } else if (defaults.n) {
            return perr(p, cur(p)->line, "non-default argument follows default argument") == 0;
        }
    }
    nxt(p);
    n->names = names.v;
    n->nnames = names.n;
    n->kids2 = defaults.v;
    n->nkids2 = defaults.n;
    return true;
}

// Which of caller / varargs / kwargs a macro body refers to (jinja2 only accepts extra
// arguments when the body uses them).
static void scan_names(const ct_node *n, uint8_t *flags) {
    if (!n) return;
    if (n->kind == N_NAME) {
        if (!strcmp(n->name, "caller")) *flags |= CT_MF_CALLER;
        else if (!strcmp(n->name, "varargs")) *flags |= CT_MF_VARARGS;
        else if (!strcmp(n->name, "kwargs")) *flags |= CT_MF_KWARGS;
        return;
    }
    scan_names(n->a, flags);
    scan_names(n->b, flags);
    scan_names(n->c, flags);
    for (int i = 0; i < n->nkids; i++) scan_names(n->kids[i], flags);
    for (int i = 0; i < n->nkids2; i++) scan_names(n->kids2[i], flags);
}

static ct_node *parse_macro_like(P *p, int kind) {
    int line = cur(p)->line;
    nxt(p);
    ct_node *n = stmt_node(p, kind, line, NULL);
    if (!n) return NULL;
    if (kind == S_MACRO) {
        ct_node *name = parse_assign_target(p, false, true, NULL, false);
        if (!name) return NULL;
        n->name = name->name;
        if (!parse_signature(p, n)) return NULL;
    } else {
        if (is_op(cur(p), OP_LPAREN) && !parse_signature(p, n)) return NULL;
        ct_node *call = parse_expression(p, true);
        if (!call) return NULL;
        if (call->kind != N_CALL) {
            perr(p, line, "expected call");
            return NULL;
        }
        n->a = call;
    }
    static const char *const mends[] = {"endmacro", NULL};
    static const char *const cends[] = {"endcall", NULL};
    nvec body = {0};
    int saved = p->loop_depth;
    p->loop_depth = 0;
    bool ok = parse_statements(p, kind == S_MACRO ? mends : cends, true, &body, kind == S_MACRO ? "macro" : "call");
    p->loop_depth = saved;
    if (!ok) return NULL;
    n->kids = body.v;
    n->nkids = body.n;
    for (int i = 0; i < n->nkids; i++) scan_names(n->kids[i], &n->flags);
    return seal(p, n);
}

static ct_node *parse_filter_block(P *p) {
    int line = cur(p)->line;
    nxt(p);
    ct_node *filter = parse_filter(p, NULL, true);
    if (!filter) return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    nvec body = {0};
    if (!parse_statements(p, ends, true, &body, "filter")) return NULL;
    ct_node *n = stmt_node(p, S_FILTERBLOCK, line, &body);
    if (!n) return NULL;
    n->b = filter;
    return seal(p, n);
}

static ct_node *parse_with(P *p) {
    int line = cur(p)->line;
    nxt(p);
    svec names = {0};
    nvec vals = {0};
    while (cur(p)->type != T_BLOCK_END) {
        if (p->failed) return NULL;
        if (names.n && !expect_op(p, OP_COMMA)) return NULL;
        ct_node *t = parse_assign_target(p, false, true, NULL, false);
        if (!t || !svec_push(p, &names, t->name) || !expect_op(p, OP_ASSIGN)) return NULL;
        if (!nvec_push(p, &vals, parse_expression(p, true))) return NULL;
    }
    static const char *const ends[] = {"endwith", NULL};
    nvec body = {0};
    if (!parse_statements(p, ends, true, &body, "with")) return NULL;
    ct_node *n = stmt_node(p, S_WITH, line, &body);
    if (!n) return NULL;
    n->names = names.v;
    n->nnames = names.n;
    n->kids2 = vals.v;
    n->nkids2 = vals.n;
    return seal(p, n);
}

// {% block name %} / {% generation %}: rendered in place
static ct_node *parse_inline_block(P *p, const char *end) {
    int line = cur(p)->line;
    bool named = is_name(cur(p), "block");
    nxt(p);
    if (named) {
        if (!expect_type(p, T_NAME, "block name")) return NULL;
        while (is_name(cur(p), "scoped") || is_name(cur(p), "required")) nxt(p);
    }
    const char *ends[] = {end, NULL};
    nvec body = {0};
    if (!parse_statements(p, ends, true, &body, named ? "block" : "generation")) return NULL;
    if (named && cur(p)->type == T_NAME) nxt(p);  // {% endblock name %}
    ct_node *n = stmt_node(p, S_BLOCK, line, &body);
    return n ? seal(p, n) : NULL;
}

static ct_node *parse_statement(P *p) {
    tok *t = cur(p);
    if (t->type != T_NAME) {
        perr(p, t->line, "tag name expected");
        return NULL;
    }
    if (!enter(p, t->line)) return NULL;
    ct_node *r = NULL;
    const char *k = t->s;
    if (!strcmp(k, "for")) r = parse_for(p);
    else if (!strcmp(k, "if")) r = parse_if(p);
    else if (!strcmp(k, "set")) r = parse_set(p);
    else if (!strcmp(k, "macro")) r = parse_macro_like(p, S_MACRO);
    else if (!strcmp(k, "call")) r = parse_macro_like(p, S_CALLBLOCK);
    else if (!strcmp(k, "filter")) r = parse_filter_block(p);
    else if (!strcmp(k, "with")) r = parse_with(p);
    else if (!strcmp(k, "block")) r = parse_inline_block(p, "endblock");
    else if (!strcmp(k, "generation")) r = parse_inline_block(p, "endgeneration");
    else if (!strcmp(k, "print")) {
        nxt(p);
        nvec exprs = {0};
        while (cur(p)->type != T_BLOCK_END) {
            if (p->failed) break;
            if (exprs.n && !expect_op(p, OP_COMMA)) break;
            if (!nvec_push(p, &exprs, parse_expression(p, true))) break;
        }
        if (!p->failed) {
            r = stmt_node(p, S_OUTPUT, t->line, &exprs);
            r = seal(p, r);
        }
    } else if (!strcmp(k, "break") || !strcmp(k, "continue")) {
        if (p->loop_depth == 0) perr(p, t->line, "'%s' outside loop", k);
        else {
            r = stmt_node(p, k[0] == 'b' ? S_BREAK : S_CONTINUE, t->line, NULL);
            r = seal(p, r);
            nxt(p);
        }
    } else if (!strcmp(k, "extends") || !strcmp(k, "include") || !strcmp(k, "import") ||
               !strcmp(k, "from") || !strcmp(k, "autoescape") || !strcmp(k, "do")) {
        perr(p, t->line, "unsupported tag '%s'", k);
    } else if (!strncmp(k, "end", 3) || !strcmp(k, "elif") || !strcmp(k, "else")) {
        perr(p, t->line, "unexpected tag '%s' (no open block it can close)", k);
    } else {
        perr(p, t->line, "unknown tag '%s'", k);
    }
    leave(p);
    return p->failed ? NULL : r;
}

static bool subparse(P *p, const char *const *end_tokens, nvec *body) {
    nvec data = {0};
    int data_line = 0;
#define FLUSH()                                                   \
    do {                                                          \
        if (data.n) {                                             \
            ct_node *o = stmt_node(p, S_OUTPUT, data_line, &data); \
            if (!nvec_push(p, body, seal(p, o))) return false;    \
            data = (nvec){0};                                     \
        }                                                         \
    } while (0)
    while (cur(p)->type != T_EOF) {
        if (p->failed) return false;
        tok *t = cur(p);
        if (t->type == T_DATA) {
            if (!data.n) data_line = t->line;
            if (!nvec_push(p, &data, mk_const_str(p, t->s, t->len, t->line))) return false;
            nxt(p);
        } else if (t->type == T_VAR_BEGIN) {
            if (!data.n) data_line = t->line;
            nxt(p);
            if (!nvec_push(p, &data, parse_tuple(p, false, true, NULL, false))) return false;
            if (!expect_type(p, T_VAR_END, "end of print statement '}}'")) return false;
        } else if (t->type == T_BLOCK_BEGIN) {
            FLUSH();
            nxt(p);
            if (match_end_rule(p, end_tokens)) return true;
            if (!nvec_push(p, body, parse_statement(p))) return false;
            if (!expect_type(p, T_BLOCK_END, "end of statement block '%}'")) return false;
        } else {
            char b[80];
            return perr(p, t->line, "unexpected %s", describe(t, b, sizeof b)) == 0;
        }
    }
    FLUSH();
#undef FLUSH
    return !p->failed;
}

void ct_ast_free(ct_template_ast *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nconsts; i++) ct_free_immortal(t->consts[i]);
    free(t->consts);
    ar_free(t->arena);
    memset(t, 0, sizeof *t);
}

int ct_parse(const char *src, size_t len, ct_template_ast *out) {
    memset(out, 0, sizeof *out);
    if (!src && len) return kaon_set_error("chat template: NULL source");
    if (len > CT_MAX_SOURCE)
        return kaon_set_error("chat template: %zu bytes exceeds the %u MiB limit", len, CT_MAX_SOURCE >> 20);
    // jinja2 splits the source on \r\n, \r and \n, rejoins with \n and drops one trailing
    // newline (keep_trailing_newline=False)
    char *s = malloc(len + 1);
    if (!s) return kaon_set_error("chat template: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;

    P p = {0};
    p.ast = out;
    p.ar = calloc(1, sizeof(ct_arena));
    if (!p.ar) {
        free(s);
        return kaon_set_error("chat template: out of memory");
    }
    out->arena = p.ar;
    nvec body = {0};
    bool ok = lex(&p, s, n);
    free(s);
    if (ok) ok = subparse(&p, NULL, &body);
    free(p.t);
    if (!ok || p.failed) {
        int line = p.err_line;
        char msg[sizeof p.err];
        memcpy(msg, p.err, sizeof msg);
        ct_ast_free(out);
        if (line > 0) return kaon_set_error("chat template line %d: %s", line, msg);
        return kaon_set_error("chat template: %s", msg);
    }
    out->body = body.v;
    out->nbody = body.n;
    return 0;
}
