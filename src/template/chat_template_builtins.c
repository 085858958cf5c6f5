// Built-ins of the chat-template interpreter: jinja2's filters and tests, Python's str /
// dict / list methods, the globals HF provides (range, namespace, dict, raise_exception,
// strftime_now), and attribute / item / slice access with the sandbox's rules.
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/chat_template_internal.h"

// ---- name tables ----
enum {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E,
    F_ESCAPE, F_FIRST, F_FLOAT, F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN,
    F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE,
    F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE,
    F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_COUNT_
};
static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "first", "float", "forceescape", "format", "indent", "int", "items", "join",
    "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount",
};
_Static_assert(sizeof filter_names / sizeof filter_names[0] == F_COUNT_, "filter table");

enum {
    T_DEFINED, T_UNDEFINED, T_NONE, T_BOOLEAN, T_FALSE, T_TRUE, T_INTEGER, T_FLOAT, T_NUMBER,
    T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_CALLABLE, T_SAMEAS, T_ESCAPED, T_ODD, T_EVEN,
    T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_EQ_, T_NE, T_NE_, T_LT, T_LESSTHAN, T_LT_, T_LE, T_LE_,
    T_GT, T_GREATERTHAN, T_GT_, T_GE, T_GE_, T_IN, T_LOWER, T_UPPER, T_FILTER, T_TEST, T_COUNT_
};
static const char *const test_names[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
    "string", "mapping", "iterable", "sequence", "callable", "sameas", "escaped", "odd", "even",
    "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=",
    "gt", "greaterthan", ">", "ge", ">=", "in", "lower", "upper", "filter", "test",
};
_Static_assert(sizeof test_names / sizeof test_names[0] == T_COUNT_, "test table");

enum {
    // str
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_CASEFOLD, M_REPLACE, M_FIND, M_RFIND, M_INDEX,
    M_RINDEX, M_COUNT, M_JOIN, M_FORMAT, M_ISDIGIT, M_ISDECIMAL, M_ISNUMERIC, M_ISALPHA,
    M_ISALNUM, M_ISSPACE, M_ISLOWER, M_ISUPPER, M_ISTITLE, M_SPLITLINES, M_ZFILL, M_CENTER,
    M_LJUST, M_RJUST, M_PARTITION, M_RPARTITION, M_REMOVEPREFIX, M_REMOVESUFFIX, M_STR_END_,
    // dict
    M_GET = M_STR_END_, M_KEYS, M_VALUES, M_ITEMS, M_DICT_COPY, M_DICT_END_,
    // list
    M_LIST_INDEX = M_DICT_END_, M_LIST_COUNT, M_LIST_COPY, M_LIST_END_,
    // loop
    M_CYCLE = M_LIST_END_, M_CHANGED, M_COUNT_
};
static const char *const method_names[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index",
    "rindex", "count", "join", "format", "isdigit", "isdecimal", "isnumeric", "isalpha",
    "isalnum", "isspace", "islower", "isupper", "istitle", "splitlines", "zfill", "center",
    "ljust", "rjust", "partition", "rpartition", "removeprefix", "removesuffix",
    "get", "keys", "values", "items", "copy",
    "index", "count", "copy",
    "cycle", "changed",
};
_Static_assert(sizeof method_names / sizeof method_names[0] == M_COUNT_, "method table");

// methods that mutate, refused by ImmutableSandboxedEnvironment
static const char *const list_unsafe[] = {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove", NULL};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };
static const char *const global_names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

static int find_name(const char *const *tab, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(tab[i], name)) return i;
    return -1;
}

int ct_filter_id(const char *name) { return find_name(filter_names, F_COUNT_, name); }
int ct_test_id(const char *name) { return find_name(test_names, T_COUNT_, name); }
const char *ct_filter_name(int id) { return id >= 0 && id < F_COUNT_ ? filter_names[id] : "?"; }
const char *ct_test_name(int id) { return id >= 0 && id < T_COUNT_ ? test_names[id] : "?"; }
const char *ct_method_name(int id) { return id >= 0 && id < M_COUNT_ ? method_names[id] : "?"; }

ct_value ct_global(const char *name) {
    for (int i = 0; global_names[i]; i++)
        if (!strcmp(global_names[i], name)) {
            ct_value v = {.type = CT_FUNC};
            v.u.i = i;
            return v;
        }
    return ct_undef();
}

// ---- helpers ----
static bool is_intlike(ct_value v) { return v.type == CT_INT || v.type == CT_BOOL; }
static int64_t ival(ct_value v) { return v.type == CT_BOOL ? (int64_t)v.u.b : v.u.i; }
static bool is_num(ct_value v) { return is_intlike(v) || v.type == CT_FLOAT; }
static double fval(ct_value v) { return v.type == CT_FLOAT ? v.u.f : (double)ival(v); }

static int bind(ct_rs *rs, const char *what, const ct_args *a, const char *const *params, int np,
                ct_value *vals, bool *given) {
    for (int i = 0; i < np; i++) {
        vals[i] = ct_none();
        given[i] = false;
    }
    if (a->npos > np) return ct_fail(rs, "%s takes at most %d argument(s) (%d given)", what, np, a->npos);
    for (int i = 0; i < a->npos; i++) {
        vals[i] = a->pos[i];
        given[i] = true;
    }
    for (int k = 0; k < a->nkw; k++) {
        int j = find_name(params, np, a->kwn[k]);
        if (j < 0) return ct_fail(rs, "%s got an unexpected keyword argument '%s'", what, a->kwn[k]);
        if (given[j]) return ct_fail(rs, "%s got multiple values for argument '%s'", what, a->kwn[k]);
        vals[j] = a->kwv[k];
        given[j] = true;
    }
    return 0;
}

static int no_args(ct_rs *rs, const char *what, const ct_args *a) {
    if (a->npos || a->nkw) return ct_fail(rs, "%s takes no arguments", what);
    return 0;
}

static int str_arg(ct_rs *rs, const char *what, ct_value v) {
    if (v.type != CT_STR) return ct_fail(rs, "%s: expected a string argument, not %s", what, ct_type_name(v));
    return 0;
}

static int out_str(ct_rs *rs, ct_buf *b, ct_value *out) {
    *out = ct_buf_take(rs, b);
    return out->type == CT_STR ? 0 : -1;
}

static int new_str(ct_rs *rs, const char *s, size_t n, ct_value *out) {
    *out = ct_str_new(rs, s, n);
    return out->type == CT_STR ? 0 : -1;
}

// byte offsets of each code point of s, plus the end: offs[0..ncp]
static size_t *cp_offsets(ct_rs *rs, const ct_str *s, size_t *ncp) {
    size_t n = ct_str_cplen(s);
    if (!ct_budget(rs, (n + 1) * sizeof(size_t))) return NULL;
    size_t *o = malloc((n + 1) * sizeof(size_t));
    if (!o) {
        ct_release((n + 1) * sizeof(size_t));
        ct_fail(rs, "out of memory");
        return NULL;
    }
    size_t i = 0, k = 0, adv;
    for (; i < s->len && k < n; i += adv) {
        o[k++] = i;
        ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
    }
    o[k] = s->len;
    *ncp = n;
    return o;
}

static size_t cp_count_bytes(const char *s, size_t n) {
    size_t c = 0, adv;
    for (size_t i = 0; i < n; i += adv, c++) ct_u8_decode((const unsigned char *)s + i, n - i, &adv);
    return c;
}

// ---- Unicode case mapping: ASCII, Latin-1, Latin Extended-A/Additional, Greek, Cyrillic,
// Armenian, fullwidth (an approximation of Python's full tables) ----
static uint32_t cp_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c == 0xb5) return 0x39c;
    if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 32;
    if (c == 0xff) return 0x178;
    if (c == 0x131) return 'I';
    if (c == 0x17f) return 'S';
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return c & ~1u;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c : c - 1;
    if (c >= 0x1c4 && c <= 0x1cc) return c - (c - 0x1c4) % 3;  // DŽ Dž dž, LJ Lj lj, NJ Nj nj
    if (c >= 0x1f1 && c <= 0x1f3) return 0x1f1;
    if (c >= 0x1cd && c <= 0x1dc) return (c & 1) ? c : c - 1;
    if ((c >= 0x1de && c <= 0x1ef) || (c >= 0x1f8 && c <= 0x21f) || (c >= 0x222 && c <= 0x233)) return c & ~1u;
    if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
    if (c == 0x3ac) return 0x386;
    if (c >= 0x3ad && c <= 0x3af) return c - 37;
    if (c == 0x3cc) return 0x38c;
    if (c == 0x3cd || c == 0x3ce) return c - 63;
    if (c >= 0x430 && c <= 0x44f) return c - 32;
    if (c >= 0x450 && c <= 0x45f) return c - 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf) || (c >= 0x4d0 && c <= 0x52f)) return c & ~1u;
    if (c >= 0x4c1 && c <= 0x4ce) return (c & 1) ? c : c - 1;
    if (c == 0x4cf) return 0x4c0;
    if (c >= 0x561 && c <= 0x586) return c - 48;
    if ((c >= 0x1e00 && c <= 0x1e95) || (c >= 0x1ea0 && c <= 0x1eff)) return c & ~1u;
    if (c >= 0xff41 && c <= 0xff5a) return c - 32;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
    if (c == 0x178) return 0xff;
    if (c == 0x130) return 'i';
    if ((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) return (c & 1) ? c : c + 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c + 1 : c;
    if (c >= 0x1c4 && c <= 0x1cc) return c + 2 - (c - 0x1c4) % 3;
    if (c >= 0x1f1 && c <= 0x1f3) return 0x1f3;
    if (c >= 0x1cd && c <= 0x1dc) return (c & 1) ? c + 1 : c;
    if ((c >= 0x1de && c <= 0x1ef) || (c >= 0x1f8 && c <= 0x21f) || (c >= 0x222 && c <= 0x233)) return (c & 1) ? c : c + 1;
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
    if (c == 0x386) return 0x3ac;
    if (c >= 0x388 && c <= 0x38a) return c + 37;
    if (c == 0x38c) return 0x3cc;
    if (c == 0x38e || c == 0x38f) return c + 63;
    if (c >= 0x410 && c <= 0x42f) return c + 32;
    if (c >= 0x400 && c <= 0x40f) return c + 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf) || (c >= 0x4d0 && c <= 0x52f)) return (c & 1) ? c : c + 1;
    if (c >= 0x4c1 && c <= 0x4ce) return (c & 1) ? c + 1 : c;
    if (c == 0x4c0) return 0x4cf;
    if (c >= 0x531 && c <= 0x556) return c + 48;
    if ((c >= 0x1e00 && c <= 0x1e95) || (c >= 0x1ea0 && c <= 0x1eff)) return (c & 1) ? c : c + 1;
    if (c >= 0xff21 && c <= 0xff3a) return c + 32;
    return c;
}

// titlecase (str.title / capitalize): the Latin digraphs have their own forms
static uint32_t cp_title(uint32_t c) {
    if (c >= 0x1c4 && c <= 0x1cc) return 0x1c5 + 3 * ((c - 0x1c4) / 3);
    if (c >= 0x1f1 && c <= 0x1f3) return 0x1f2;
    return cp_upper(c);
}

static bool cp_isupper(uint32_t c) { return cp_lower(c) != c; }
static bool cp_islower(uint32_t c) { return cp_upper(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }
static bool cp_cased(uint32_t c) { return cp_isupper(c) || cp_islower(c); }
static bool cp_isdigit(uint32_t c) {
    return (c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0x6f0 && c <= 0x6f9) ||
           (c >= 0x966 && c <= 0x96f) || (c >= 0xff10 && c <= 0xff19);
}
static bool cp_isalpha(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (cp_cased(c) || c == 0xaa || c == 0xba) return true;
    return (c >= 0x5d0 && c <= 0x5ea) || (c >= 0x620 && c <= 0x64a) || (c >= 0x904 && c <= 0x939) ||
           (c >= 0xe01 && c <= 0xe30) || (c >= 0x3041 && c <= 0x30ff && c != 0x30a0 && c != 0x30fb) ||
           (c >= 0x3400 && c <= 0x4dbf) || (c >= 0x4e00 && c <= 0x9fff) || (c >= 0xac00 && c <= 0xd7a3) ||
           (c >= 0x20000 && c <= 0x2fa1f);
}

static bool put_cp(ct_rs *rs, ct_buf *b, uint32_t c) {
    char t[4];
    return ct_buf_put(rs, b, t, (size_t)ct_u8_encode(c, t));
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_SWAP, CASE_FOLD, CASE_JTITLE };

static int case_map(ct_rs *rs, const ct_str *s, int mode, ct_value *out) {
    ct_buf b = {0};
    bool prev_cased = false, first = true, word_start = true;
    size_t adv;
    for (size_t i = 0; i < s->len; i += adv) {
        uint32_t c = ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
        bool up;
        switch (mode) {
        case CASE_UPPER: up = true; break;
        case CASE_LOWER:
        case CASE_FOLD: up = false; break;
        case CASE_TITLE: up = !prev_cased; break;
        case CASE_CAPITALIZE: up = first; break;
        case CASE_JTITLE:  // jinja2's title filter: words split on [-\s({\[<]
            if (ct_is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
                word_start = true;
                up = false;
                if (!put_cp(rs, &b, c)) goto fail;
                prev_cased = false;
                first = false;
                continue;
            }
            up = word_start;
            word_start = false;
            break;
        default: up = cp_islower(c); break;  // swapcase
        }
        bool ok;
        if (c == 0xdf && (up || mode == CASE_FOLD)) {  // ß
            const char *rep = mode == CASE_FOLD ? "ss" : (mode == CASE_UPPER || mode == CASE_SWAP) ? "SS" : "Ss";
            ok = ct_buf_puts(rs, &b, rep);
        } else if (mode == CASE_SWAP && !cp_isupper(c) && !cp_islower(c)) {
            ok = put_cp(rs, &b, c);
        } else {
            uint32_t m = !up ? cp_lower(c) : (mode == CASE_TITLE || mode == CASE_CAPITALIZE) ? cp_title(c) : cp_upper(c);
            ok = put_cp(rs, &b, m);
        }
        if (!ok) goto fail;
        prev_cased = cp_cased(c);
        first = false;
    }
    return out_str(rs, &b, out);
fail:
    ct_buf_free(&b);
    return -1;
}

// ---- strip / split ----
// The characters of strip(chars): a sorted code point set (a long `chars` must not make
// stripping quadratic).
typedef struct cpset {
    uint32_t *v;
    size_t n;
} cpset;

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cpset_init(ct_rs *rs, cpset *set, const ct_str *chars) {
    set->v = NULL;
    set->n = 0;
    if (!chars) return 0;
    if (!ct_budget(rs, (chars->len + 1) * sizeof(uint32_t))) return -1;
    set->v = malloc((chars->len + 1) * sizeof(uint32_t));
    if (!set->v) {
        ct_release((chars->len + 1) * sizeof(uint32_t));
        return ct_fail(rs, "out of memory");
    }
    size_t adv;
    for (size_t i = 0; i < chars->len; i += adv)
        set->v[set->n++] = ct_u8_decode((const unsigned char *)chars->s + i, chars->len - i, &adv);
    qsort(set->v, set->n, sizeof(uint32_t), cmp_u32);
    return 0;
}

static bool in_chars(uint32_t c, const ct_str *chars, const cpset *set) {
    if (!chars) return ct_is_space(c);
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (set->v[mid] == c) return true;
        if (set->v[mid] < c) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

static int strip(ct_rs *rs, const ct_str *s, const ct_str *chars, bool left, bool right, ct_value *out) {
    size_t a = 0, e = s->len, adv;
    cpset set;
    if (cpset_init(rs, &set, chars) < 0) return -1;
    if (left)
        while (a < e) {
            uint32_t c = ct_u8_decode((const unsigned char *)s->s + a, e - a, &adv);
            if (!in_chars(c, chars, &set)) break;
            a += adv;
        }
    if (right)
        while (e > a) {
            size_t k = e - 1;
            while (k > a && ((unsigned char)s->s[k] & 0xc0) == 0x80) k--;
            uint32_t c = ct_u8_decode((const unsigned char *)s->s + k, e - k, &adv);
            if (adv != e - k || !in_chars(c, chars, &set)) break;
            e = k;
        }
    if (chars) {
        free(set.v);
        ct_release((chars->len + 1) * sizeof(uint32_t));
    }
    ct_add_work(((a + s->len - e) >> 4) + 1);
    return new_str(rs, s->s + a, e - a, out);
}

// Last occurrence of needle in hay[0..n) in linear time: memmem over reversed copies
// (a backwards memcmp scan would be O(n*m)). Returns the offset or SIZE_MAX.
typedef struct rsearch {
    char *rh, *rn;
    size_t n, m;
} rsearch;

static int rsearch_init(ct_rs *rs, rsearch *r, const char *hay, size_t n, const char *needle, size_t m) {
    r->n = n;
    r->m = m;
    if (!ct_budget(rs, n + m + 2)) return -1;
    r->rh = malloc(n + 1);
    r->rn = malloc(m + 1);
    if (!r->rh || !r->rn) {
        free(r->rh);
        free(r->rn);
        r->rh = r->rn = NULL;
        ct_release(n + m + 2);
        return ct_fail(rs, "out of memory");
    }
    for (size_t i = 0; i < n; i++) r->rh[i] = hay[n - 1 - i];
    for (size_t i = 0; i < m; i++) r->rn[i] = needle[m - 1 - i];
    ct_add_work((n >> 4) + 1);
    return 0;
}

// last occurrence ending at or before `end` (an offset in the original)
static size_t rsearch_find(const rsearch *r, size_t end) {
    if (r->m > end) return SIZE_MAX;
    size_t from = r->n - end;  // reversed offset where the search starts
    const char *h = memmem(r->rh + from, r->n - from, r->rn, r->m);
    if (!h) return SIZE_MAX;
    size_t rpos = (size_t)(h - r->rh);
    return r->n - rpos - r->m;
}

static void rsearch_free(rsearch *r) {
    free(r->rh);
    free(r->rn);
    ct_release(r->n + r->m + 2);
}

static size_t space_len(const char *s, size_t n, size_t i) {
    size_t adv;
    uint32_t c = ct_u8_decode((const unsigned char *)s + i, n - i, &adv);
    return ct_is_space(c) ? adv : 0;
}

static bool push_str(ct_rs *rs, ct_value list, const char *s, size_t n) {
    ct_value v = ct_str_new(rs, s, n);
    if (v.type != CT_STR) return false;
    return ct_list_push(rs, list, v);
}

static int split(ct_rs *rs, const ct_str *s, const ct_str *sep, int64_t maxsplit, bool from_right, ct_value *out) {
    ct_value l = ct_list_new(rs, 0, false);
    if (l.type != CT_LIST) return -1;
    const char *p = s->s;
    size_t n = s->len;
    if (sep && sep->len == 0) {
        ct_decref(l);
        return ct_fail(rs, "empty separator");
    }
    if (!from_right) {
        if (!sep) {
            size_t i = 0, w;
            for (;;) {
                while (i < n && (w = space_len(p, n, i))) i += w;
                if (i >= n) break;
                if (maxsplit == 0) {  // the rest, trailing whitespace kept (as CPython)
                    if (!push_str(rs, l, p + i, n - i)) goto fail;
                    break;
                }
                size_t j = i;
                while (j < n && !space_len(p, n, j)) {
                    size_t adv;
                    ct_u8_decode((const unsigned char *)p + j, n - j, &adv);
                    j += adv;
                }
                if (!push_str(rs, l, p + i, j - i)) goto fail;
                if (maxsplit > 0) maxsplit--;
                i = j;
            }
        } else {
            size_t i = 0;
            for (;;) {
                const char *hit = maxsplit == 0 ? NULL : memmem(p + i, n - i, sep->s, sep->len);
                if (!hit) {
                    if (!push_str(rs, l, p + i, n - i)) goto fail;
                    break;
                }
                size_t h = (size_t)(hit - p);
                if (!push_str(rs, l, p + i, h - i)) goto fail;
                i = h + sep->len;
                if (maxsplit > 0) maxsplit--;
            }
        }
        *out = l;
        return 0;
    }
    // rsplit: collect from the right, then reverse
    if (!sep) {
        size_t e = n, w;
        for (;;) {
            while (e > 0) {  // skip trailing whitespace
                size_t k = e - 1;
                while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
                if ((w = space_len(p, e, k)) && w == e - k) e = k;
                else break;
            }
            if (e == 0) break;
            if (maxsplit == 0) {  // the rest, leading whitespace kept
                if (!push_str(rs, l, p, e)) goto fail;
                break;
            }
            size_t j = e;
            while (j > 0) {
                size_t k = j - 1;
                while (k > 0 && ((unsigned char)p[k] & 0xc0) == 0x80) k--;
                if ((w = space_len(p, j, k)) && w == j - k) break;
                j = k;
            }
            if (!push_str(rs, l, p + j, e - j)) goto fail;
            if (maxsplit > 0) maxsplit--;
            e = j;
        }
    } else {
        rsearch rsr;
        if (rsearch_init(rs, &rsr, p, n, sep->s, sep->len) < 0) goto fail;
        size_t e = n;
        for (;;) {
            size_t h = maxsplit != 0 ? rsearch_find(&rsr, e) : SIZE_MAX;
            if (h == SIZE_MAX) {
                if (!push_str(rs, l, p, e)) {
                    rsearch_free(&rsr);
                    goto fail;
                }
                break;
            }
            if (!push_str(rs, l, p + h + sep->len, e - h - sep->len)) {
                rsearch_free(&rsr);
                goto fail;
            }
            e = h;
            if (maxsplit > 0) maxsplit--;
        }
        rsearch_free(&rsr);
    }
    {
        ct_list *L = ct_l(l);
        for (size_t i = 0; i < L->n / 2; i++) {
            ct_value t = L->v[i];
            L->v[i] = L->v[L->n - 1 - i];
            L->v[L->n - 1 - i] = t;
        }
    }
    *out = l;
    return 0;
fail:
    ct_decref(l);
    return -1;
}

static bool is_line_break(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
}

static int splitlines(ct_rs *rs, const ct_str *s, bool keepends, ct_value *out) {
    ct_value l = ct_list_new(rs, 0, false);
    if (l.type != CT_LIST) return -1;
    size_t i = 0, start = 0, adv;
    while (i < s->len) {
        uint32_t c = ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
        if (!is_line_break(c)) {
            i += adv;
            continue;
        }
        size_t eol = i;
        i += adv;
        if (c == '\r' && i < s->len && s->s[i] == '\n') i++;
        if (!push_str(rs, l, s->s + start, (keepends ? i : eol) - start)) {
            ct_decref(l);
            return -1;
        }
        start = i;
    }
    if (start < s->len && !push_str(rs, l, s->s + start, s->len - start)) {
        ct_decref(l);
        return -1;
    }
    *out = l;
    return 0;
}

static int replace(ct_rs *rs, const ct_str *s, const ct_str *old, const ct_str *rep, int64_t count, ct_value *out) {
    ct_buf b = {0};
    size_t i = 0;
    if (old->len == 0) {  // inserts `rep` before every code point and at the end
        size_t adv;
        while (count != 0) {
            if (!ct_buf_put(rs, &b, rep->s, rep->len)) goto fail;
            if (count > 0) count--;
            if (i >= s->len) break;
            ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
            if (!ct_buf_put(rs, &b, s->s + i, adv)) goto fail;
            i += adv;
        }
        if (!ct_buf_put(rs, &b, s->s + i, s->len - i)) goto fail;
        if (!b.p && new_str(rs, "", 0, out) == 0) return 0;
        return out_str(rs, &b, out);
    }
    while (count != 0) {
        const char *hit = memmem(s->s + i, s->len - i, old->s, old->len);
        if (!hit) break;
        size_t h = (size_t)(hit - s->s);
        if (!ct_buf_put(rs, &b, s->s + i, h - i) || !ct_buf_put(rs, &b, rep->s, rep->len)) goto fail;
        i = h + old->len;
        if (count > 0) count--;
    }
    if (!ct_buf_put(rs, &b, s->s + i, s->len - i)) goto fail;
    return out_str(rs, &b, out);
fail:
    ct_buf_free(&b);
    return -1;
}

// Python slice index normalisation
static void adjust_slice(int64_t len, const ct_value *st, const ct_value *sp, int64_t step, int64_t *start, int64_t *stop, int64_t *cnt) {
    bool hs = st->type != CT_NONE, he = sp->type != CT_NONE;
    int64_t a = hs ? ival(*st) : 0, e = he ? ival(*sp) : 0;
    if (!hs) a = step < 0 ? len - 1 : 0;
    else {
        if (a < 0) {
            a += len;
            if (a < 0) a = step < 0 ? -1 : 0;
        } else if (a >= len) {
            a = step < 0 ? len - 1 : len;
        }
    }
    if (!he) e = step < 0 ? -1 : len;
    else {
        if (e < 0) {
            e += len;
            if (e < 0) e = step < 0 ? -1 : 0;
        } else if (e >= len) {
            e = step < 0 ? len - 1 : len;
        }
    }
    if (step < 0) *cnt = e < a ? (a - e - 1) / (-step) + 1 : 0;
    else *cnt = a < e ? (e - a - 1) / step + 1 : 0;
    *start = a;
    *stop = e;
}

int ct_slice(ct_rs *rs, ct_value obj, ct_value st, ct_value sp, ct_value stp, ct_value *out) {
    if (obj.type == CT_UNDEF) return ct_undef_error(rs, obj);
    bool list_ok = obj.type == CT_LIST && ct_l(obj)->kind <= CT_LK_TUPLE;
    if ((obj.type != CT_STR && !list_ok) || (st.type != CT_NONE && !is_intlike(st)) ||
        (sp.type != CT_NONE && !is_intlike(sp)) || (stp.type != CT_NONE && !is_intlike(stp))) {
        *out = ct_undef();  // jinja2 turns the TypeError into an Undefined
        return 0;
    }
    int64_t step = stp.type == CT_NONE ? 1 : ival(stp);
    if (step == 0) return ct_fail(rs, "slice step cannot be zero");
    if (step == INT64_MIN) step = -INT64_MAX;
    int64_t a, e, cnt;
    if (list_ok) {
        ct_list *l = ct_l(obj);
        adjust_slice((int64_t)l->n, &st, &sp, step, &a, &e, &cnt);
        ct_value r = ct_list_new(rs, (size_t)cnt, l->tuple);
        if (r.type != CT_LIST) return -1;
        for (int64_t k = 0, i = a; k < cnt; k++, i += step)
            if (!ct_list_push(rs, r, ct_ref(l->v[i]))) {
                ct_decref(r);
                return -1;
            }
        *out = r;
        return 0;
    }
    const ct_str *s = ct_s(obj);
    if (s->ascii) {
        adjust_slice((int64_t)s->len, &st, &sp, step, &a, &e, &cnt);
        if (step == 1) return new_str(rs, s->s + a, (size_t)cnt, out);
        ct_buf b = {0};
        for (int64_t k = 0, i = a; k < cnt; k++, i += step)
            if (!ct_buf_put(rs, &b, s->s + i, 1)) {
                ct_buf_free(&b);
                return -1;
            }
        if (!b.p) return new_str(rs, "", 0, out);
        return out_str(rs, &b, out);
    }
    size_t ncp;
    size_t *offs = cp_offsets(rs, s, &ncp);
    if (!offs) return -1;
    adjust_slice((int64_t)ncp, &st, &sp, step, &a, &e, &cnt);
    int r;
    if (step == 1) {
        r = cnt ? new_str(rs, s->s + offs[a], offs[a + cnt] - offs[a], out) : new_str(rs, "", 0, out);
    } else {
        ct_buf b = {0};
        bool ok = true;
        for (int64_t k = 0, i = a; ok && k < cnt; k++, i += step)
            ok = ct_buf_put(rs, &b, s->s + offs[i], offs[i + 1] - offs[i]);
        if (!ok) {
            ct_buf_free(&b);
            r = -1;
        } else if (!b.p) {
            r = new_str(rs, "", 0, out);
        } else {
            r = out_str(rs, &b, out);
        }
    }
    free(offs);
    ct_release((ncp + 1) * sizeof(size_t));
    return r;
}

int ct_iterate(ct_rs *rs, ct_value v, ct_value *out) {
    switch (v.type) {
    case CT_LIST:
        *out = ct_ref(v);
        return 0;
    case CT_UNDEF:
        *out = ct_list_new(rs, 0, false);
        return out->type == CT_LIST ? 0 : -1;
    case CT_DICT: {
        ct_dict *d = ct_d(v);
        ct_value l = ct_list_new(rs, d->n, false);
        if (l.type != CT_LIST) return -1;
        for (size_t i = 0; i < d->n; i++)
            if (!ct_list_push(rs, l, ct_ref(d->k[i]))) {
                ct_decref(l);
                return -1;
            }
        *out = l;
        return 0;
    }
    case CT_STR: {
        const ct_str *s = ct_s(v);
        ct_value l = ct_list_new(rs, s->len, false);
        if (l.type != CT_LIST) return -1;
        size_t adv;
        for (size_t i = 0; i < s->len; i += adv) {
            ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
            if (!push_str(rs, l, s->s + i, adv)) {
                ct_decref(l);
                return -1;
            }
        }
        *out = l;
        return 0;
    }
    default:
        return ct_fail(rs, "'%s' object is not iterable", ct_type_name(v));
    }
}

// ---- attribute / item access ----
static int method_value(ct_rs *rs, ct_value self, int id, ct_value *out) {
    if (ct_val_depth(self) + 1 > CT_MAX_VALUE_DEPTH)
        return ct_fail(rs, "values nested deeper than %d levels", CT_MAX_VALUE_DEPTH);
    if (!ct_budget(rs, sizeof(ct_method))) return -1;
    ct_method *m = calloc(1, sizeof *m);
    if (!m) return ct_fail(rs, "out of memory");
    m->h.rc = 1;
    m->h.type = CT_METHOD;
    m->h.acct = sizeof(ct_method);
    m->self = ct_ref(self);
    m->depth = (uint16_t)(ct_val_depth(self) + 1);
    m->id = id;
    out->type = CT_METHOD;
    out->sub = 0;
    out->u.o = &m->h;
    return 0;
}

static int find_method(ct_value obj, const char *name) {
    int lo, hi;
    switch (obj.type) {
    case CT_STR: lo = 0, hi = M_STR_END_; break;
    case CT_DICT: lo = M_GET, hi = M_DICT_END_; break;
    case CT_LIST:
        if (ct_l(obj)->kind > CT_LK_TUPLE) return -1;
        lo = M_LIST_INDEX, hi = ct_l(obj)->tuple ? M_LIST_COPY : M_LIST_END_;
        break;
    case CT_LOOP: lo = M_CYCLE, hi = M_COUNT_; break;
    default: return -1;
    }
    for (int i = lo; i < hi; i++)
        if (!strcmp(method_names[i], name)) return i;
    return -1;
}

// Python methods kaon does not implement: calling one fails with a message that says so
static const char *const str_unsupported[] = {"encode", "expandtabs", "format_map", "isascii", "isidentifier",
                                              "isprintable", "maketrans", "translate", NULL};

static const char *unsafe_name(ct_value obj, const char *name) {
    const char *const *tab = NULL;
    if (obj.type == CT_LIST && ct_l(obj)->kind == CT_LK_LIST) tab = list_unsafe;
    if (obj.type == CT_DICT) tab = dict_unsafe;
    for (int i = 0; tab && tab[i]; i++)
        if (!strcmp(tab[i], name)) return tab[i];
    return NULL;
}

static int loop_attr(ct_rs *rs, ct_loop *lp, const char *name, ct_value *out) {
    int64_t n = (int64_t)lp->items->n, i = lp->idx;
    if (!strcmp(name, "index")) *out = ct_int(i + 1);
    else if (!strcmp(name, "index0")) *out = ct_int(i);
    else if (!strcmp(name, "revindex")) *out = ct_int(n - i);
    else if (!strcmp(name, "revindex0")) *out = ct_int(n - i - 1);
    else if (!strcmp(name, "first")) *out = ct_bool(i == 0);
    else if (!strcmp(name, "last")) *out = ct_bool(i == n - 1);
    else if (!strcmp(name, "length")) *out = ct_int(n);
    else if (!strcmp(name, "depth")) *out = ct_int(lp->depth);
    else if (!strcmp(name, "depth0")) *out = ct_int(lp->depth - 1);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? ct_ref(lp->items->v[i - 1]) : ct_undef_named(CT_UNDEF_HINT, "there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? ct_ref(lp->items->v[i + 1]) : ct_undef_named(CT_UNDEF_HINT, "there is no next item");
    else {
        (void)rs;
        return 1;
    }
    return 0;
}

static int getattr_impl(ct_rs *rs, ct_value obj, const char *name, const char *hint, ct_value *out) {
    *out = ct_undef_named(CT_UNDEF_ATTR, hint);
    out->aux = obj.type;
    if (obj.type == CT_UNDEF) return ct_undef_error(rs, obj);
    if (name[0] == '_' && name[1] == '_') return 0;  // dunder attributes are unsafe: Undefined
    int m = find_method(obj, name);
    if (m >= 0) return method_value(rs, obj, m, out);
    if (obj.type == CT_STR)
        for (int i = 0; str_unsupported[i]; i++)
            if (!strcmp(str_unsupported[i], name)) {
                *out = ct_undef_named(CT_UNDEF_HINT, "this str method is not supported by kaon's chat templates");
                return 0;
            }
    const char *u = unsafe_name(obj, name);
    if (u) {
        *out = ct_undef_named(CT_UNDEF_UNSAFE, u);
        out->aux = obj.type;
        return 0;
    }
    switch (obj.type) {
    case CT_DICT:
    case CT_NS: {
        ct_value *v = ct_dict_get_str(ct_d(obj), name, strlen(name));
        if (v) *out = ct_ref(*v);
        return 0;
    }
    case CT_LOOP:
        if (loop_attr(rs, (ct_loop *)obj.u.o, name, out) == 0) return 0;
        *out = ct_undef_named(CT_UNDEF_ATTR, hint);
        out->aux = obj.type;
        return 0;
    default:
        return 0;
    }
}

int ct_getattr(ct_rs *rs, ct_value obj, const char *name, ct_value *out) {
    return getattr_impl(rs, obj, name, name, out);
}

int ct_getitem(ct_rs *rs, ct_value obj, ct_value key, ct_value *out) {
    bool idx = is_intlike(key);
    *out = ct_undef_named(idx ? CT_UNDEF_INDEX : CT_UNDEF_ATTR, NULL);
    if (idx) out->u.i = ival(key);
    out->aux = obj.type;
    if (obj.type == CT_UNDEF) return ct_undef_error(rs, obj);
    switch (obj.type) {
    case CT_LIST:
        if (idx && ct_l(obj)->kind <= CT_LK_TUPLE) {
            int64_t n = (int64_t)ct_l(obj)->n, i = ival(key);
            if (i < 0) i += n;
            if (i >= 0 && i < n) *out = ct_ref(ct_l(obj)->v[i]);
            return 0;
        }
        break;
    case CT_STR:
        if (idx) {
            const ct_str *s = ct_s(obj);
            int64_t n = (int64_t)(s->ascii ? s->len : ct_str_cplen(s)), i = ival(key);
            if (i < 0) i += n;
            if (i < 0 || i >= n) return 0;
            if (s->ascii) return new_str(rs, s->s + i, 1, out);
            size_t off = 0, adv = 1;
            for (int64_t k = 0; k <= i && off < s->len; k++) {
                ct_u8_decode((const unsigned char *)s->s + off, s->len - off, &adv);
                if (k < i) off += adv;
            }
            return new_str(rs, s->s + off, adv, out);
        }
        break;
    case CT_DICT:
        if (ct_hashable(key)) {
            ct_value *v = ct_dict_get(ct_d(obj), key);
            if (v) {
                *out = ct_ref(*v);
                return 0;
            }
        }
        break;
    default:
        break;
    }
    // the item lookup failed: a string key falls back to the attribute (no Undefined hint:
    // the key string may not outlive the render)
    if (key.type == CT_STR) return getattr_impl(rs, obj, ct_s(key)->s, NULL, out);
    return 0;
}

// attribute path "a.b.0" as jinja2's make_attrgetter walks it (items first)
static int attr_path(ct_rs *rs, ct_value item, ct_value attr, ct_value *out) {
    if (attr.type != CT_STR) {
        if (attr.type == CT_NONE) {
            *out = ct_ref(item);
            return 0;
        }
        return ct_getitem(rs, item, attr, out);
    }
    ct_value cur = ct_ref(item);
    const char *s = ct_s(attr)->s;
    size_t n = ct_s(attr)->len, i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && s[j] != '.') j++;
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (s[k] < '0' || s[k] > '9') digits = false;
        ct_value key, nx;
        if (digits && j - i < 18) {
            int64_t v = 0;
            for (size_t k = i; k < j; k++) v = v * 10 + (s[k] - '0');
            key = ct_int(v);
        } else {
            key = ct_str_new(rs, s + i, j - i);
            if (key.type != CT_STR) {
                ct_decref(cur);
                return -1;
            }
        }
        int r = ct_getitem(rs, cur, key, &nx);
        ct_decref(key);
        ct_decref(cur);
        if (r < 0) return -1;
        cur = nx;
        if (j >= n) break;
        i = j + 1;
    }
    *out = cur;
    return 0;
}

// ---- Python str.format (positional / keyword fields, !r / !s, no format specs) ----
static int str_format(ct_rs *rs, const ct_str *fmt, const ct_args *a, ct_value *out) {
    ct_buf b = {0};
    int autoidx = 0;
    const char *s = fmt->s;
    size_t n = fmt->len;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                i++;
                if (!ct_buf_put(rs, &b, "}", 1)) goto fail;
                continue;
            }
            ct_fail(rs, "Single '}' encountered in format string");
            goto fail;
        }
        if (c != '{') {
            if (!ct_buf_put(rs, &b, s + i, 1)) goto fail;
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            i++;
            if (!ct_buf_put(rs, &b, "{", 1)) goto fail;
            continue;
        }
        size_t j = i + 1;
        while (j < n && s[j] != '}' && s[j] != '{') j++;
        if (j >= n || s[j] != '}') {
            ct_fail(rs, "unsupported or malformed format string field");
            goto fail;
        }
        // field: name[.attr|[key]]*[!conv][:spec]
        size_t fe = i + 1;
        while (fe < j && s[fe] != '!' && s[fe] != ':' && s[fe] != '.' && s[fe] != '[') fe++;
        ct_value v;
        if (fe == i + 1) {
            if (autoidx >= a->npos) {
                ct_fail(rs, "Replacement index %d out of range for positional args tuple", autoidx);
                goto fail;
            }
            v = ct_ref(a->pos[autoidx++]);
        } else if (s[i + 1] >= '0' && s[i + 1] <= '9') {
            int idx = 0;
            for (size_t k = i + 1; k < fe; k++) {
                if (s[k] < '0' || s[k] > '9' || idx > 100000) {
                    ct_fail(rs, "malformed format field");
                    goto fail;
                }
                idx = idx * 10 + (s[k] - '0');
            }
            if (idx >= a->npos) {
                ct_fail(rs, "Replacement index %d out of range for positional args tuple", idx);
                goto fail;
            }
            v = ct_ref(a->pos[idx]);
        } else {
            int k = 0;
            for (; k < a->nkw; k++)
                if (strlen(a->kwn[k]) == fe - i - 1 && !memcmp(a->kwn[k], s + i + 1, fe - i - 1)) break;
            if (k == a->nkw) {
                ct_fail(rs, "format string refers to a missing keyword argument");
                goto fail;
            }
            v = ct_ref(a->kwv[k]);
        }
        while (fe < j && (s[fe] == '.' || s[fe] == '[')) {
            bool dot = s[fe] == '.';
            size_t ks = fe + 1, ke = ks;
            while (ke < j && (dot ? (s[ke] != '.' && s[ke] != '[' && s[ke] != '!' && s[ke] != ':') : s[ke] != ']')) ke++;
            if (!dot && ke >= j) {
                ct_decref(v);
                ct_fail(rs, "Missing ']' in format string");
                goto fail;
            }
            ct_value key = ct_str_new(rs, s + ks, ke - ks), nv;
            if (key.type != CT_STR) {
                ct_decref(v);
                goto fail;
            }
            int r = ct_getitem(rs, v, key, &nv);
            ct_decref(key);
            ct_decref(v);
            if (r < 0) goto fail;
            v = nv;
            fe = dot ? ke : ke + 1;
        }
        bool repr = false;
        if (fe < j && s[fe] == '!') {
            if (fe + 1 < j && (s[fe + 1] == 'r' || s[fe + 1] == 's' || s[fe + 1] == 'a')) repr = s[fe + 1] != 's';
            fe += 2;
        }
        if (fe < j) {
            ct_decref(v);
            ct_fail(rs, "format specs in str.format are not supported");
            goto fail;
        }
        bool ok = repr ? ct_to_repr(rs, &b, v) : ct_to_str(rs, &b, v);
        ct_decref(v);
        if (!ok) goto fail;
        i = j;
    }
    if (!b.p) return new_str(rs, "", 0, out);
    return out_str(rs, &b, out);
fail:
    ct_buf_free(&b);
    return -1;
}

int ct_py_format(ct_rs *rs, ct_value fmt, ct_value args, ct_value *out) {
    const ct_value *av = &args;
    size_t an = 1, ai = 0;
    if (args.type == CT_LIST && ct_l(args)->tuple) {
        av = ct_l(args)->v;
        an = ct_l(args)->n;
    }
    const char *s = ct_s(fmt)->s;
    size_t n = ct_s(fmt)->len;
    ct_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            if (!ct_buf_put(rs, &b, s + i, 1)) goto fail;
            continue;
        }
        if (++i >= n) {
            ct_fail(rs, "incomplete format");
            goto fail;
        }
        int prec = -1;
        if (s[i] == '.') {
            prec = 0;
            while (++i < n && s[i] >= '0' && s[i] <= '9')
                if (prec < 100) prec = prec * 10 + (s[i] - '0');
            if (i >= n) {
                ct_fail(rs, "incomplete format");
                goto fail;
            }
        }
        char c = s[i];
        if (c == '%') {
            if (!ct_buf_put(rs, &b, "%", 1)) goto fail;
            continue;
        }
        if (ai >= an) {
            ct_fail(rs, "not enough arguments for format string");
            goto fail;
        }
        ct_value v = av[ai++];
        char tmp[80];
        bool ok;
        switch (c) {
        case 's': ok = ct_to_str(rs, &b, v); break;
        case 'r': ok = ct_to_repr(rs, &b, v); break;
        case 'd':
        case 'i':
        case 'x':
            if (!is_num(v)) {
                ct_fail(rs, "%%%c format: a real number is required, not %s", c, ct_type_name(v));
                goto fail;
            }
            if (v.type == CT_FLOAT && !(fabs(v.u.f) < 9.2e18)) {
                ct_fail(rs, "cannot convert float to integer");
                goto fail;
            }
            snprintf(tmp, sizeof tmp, c == 'x' ? "%" PRIx64 : "%" PRId64, v.type == CT_FLOAT ? (int64_t)v.u.f : ival(v));
            ok = ct_buf_puts(rs, &b, tmp);
            break;
        case 'f':
            if (!is_num(v)) {
                ct_fail(rs, "must be real number, not %s", ct_type_name(v));
                goto fail;
            }
            if (!isfinite(fval(v))) snprintf(tmp, sizeof tmp, "%s", isnan(fval(v)) ? "nan" : fval(v) < 0 ? "-inf" : "inf");
            else if (fabs(fval(v)) >= 1e50) {
                ct_fail(rs, "%%f of a huge number is not supported");
                goto fail;
            } else snprintf(tmp, sizeof tmp, "%.*f", prec < 0 ? 6 : prec > 20 ? 20 : prec, fval(v));
            ok = ct_buf_puts(rs, &b, tmp);
            break;
        default:
            ct_fail(rs, "unsupported format character '%c' in %% formatting", c);
            goto fail;
        }
        if (!ok) goto fail;
    }
    if (ai < an) {
        ct_fail(rs, "not all arguments converted during string formatting");
        goto fail;
    }
    if (!b.p) return new_str(rs, "", 0, out);
    return out_str(rs, &b, out);
fail:
    ct_buf_free(&b);
    return -1;
}

// ---- methods ----
static int opt_int(ct_rs *rs, const char *what, ct_value v, int64_t dflt, int64_t *out) {
    if (v.type == CT_NONE) {
        *out = dflt;
        return 0;
    }
    if (!is_intlike(v)) return ct_fail(rs, "%s: an integer is required, not %s", what, ct_type_name(v));
    *out = ival(v);
    return 0;
}

// code-point index of byte offset b in s
static int64_t cp_index(const ct_str *s, size_t b) {
    return s->ascii ? (int64_t)b : (int64_t)cp_count_bytes(s->s, b);
}

// byte range of the slice s[start:end] (code points), for find/count/startswith
static void sub_range(const ct_str *s, ct_value st, ct_value en, size_t *bs, size_t *be, bool *empty) {
    int64_t len = s->ascii ? (int64_t)s->len : (int64_t)ct_str_cplen(s);
    int64_t a = st.type == CT_NONE ? 0 : ival(st), e = en.type == CT_NONE ? len : ival(en);
    if (a < 0) a = a + len < 0 ? 0 : a + len;
    if (e < 0) e = e + len < 0 ? 0 : e + len;
    if (e > len) e = len;
    *empty = a > len || a > e;
    if (a > len) a = len;
    if (e < a) e = a;
    if (s->ascii) {
        *bs = (size_t)a;
        *be = (size_t)e;
        return;
    }
    size_t off = 0, adv;
    int64_t k = 0;
    ct_add_work((s->len >> 4) + 1);
    *bs = *be = s->len;
    for (; off < s->len; off += adv, k++) {
        if (k == a) *bs = off;
        if (k == e) {
            *be = off;
            break;
        }
        ct_u8_decode((const unsigned char *)s->s + off, s->len - off, &adv);
    }
    if (k == a && off >= s->len) *bs = s->len;
}

static int affix(ct_rs *rs, const ct_str *s, const ct_args *a, bool ends, ct_value *out) {
    static const char *const p[] = {"prefix", "start", "end"};
    ct_value v[3];
    bool g[3];
    if (bind(rs, ends ? "endswith" : "startswith", a, p, 3, v, g) < 0) return -1;
    if (!g[0]) return ct_fail(rs, "%s() takes at least 1 argument", ends ? "endswith" : "startswith");
    for (int i = 1; i < 3; i++)
        if (v[i].type != CT_NONE && !is_intlike(v[i])) return ct_fail(rs, "slice indices must be integers or None");
    size_t bs, be;
    bool empty;
    sub_range(s, v[1], v[2], &bs, &be, &empty);
    const ct_value *cands = &v[0];
    size_t nc = 1;
    if (v[0].type == CT_LIST && ct_l(v[0])->tuple) {
        cands = ct_l(v[0])->v;
        nc = ct_l(v[0])->n;
    }
    bool res = false;
    for (size_t i = 0; i < nc && !res; i++) {
        if (cands[i].type != CT_STR)
            return ct_fail(rs, "%s first arg must be str or a tuple of str, not %s", ends ? "endswith" : "startswith", ct_type_name(cands[i]));
        const ct_str *x = ct_s(cands[i]);
        if (empty) continue;
        if (x->len > be - bs) continue;
        res = ends ? !memcmp(s->s + be - x->len, x->s, x->len) : !memcmp(s->s + bs, x->s, x->len);
    }
    *out = ct_bool(res);
    return 0;
}

static int pad(ct_rs *rs, const ct_str *s, int64_t width, uint32_t fill, int mode, ct_value *out) {
    int64_t len = s->ascii ? (int64_t)s->len : (int64_t)ct_str_cplen(s);
    if (width <= len) return new_str(rs, s->s, s->len, out);
    if (width - len > (int64_t)CT_MAX_STR) return ct_fail(rs, "string exceeds the %u MiB limit", CT_MAX_STR >> 20);
    int64_t marg = width - len, left;
    if (mode == 0) left = marg / 2 + (marg & width & 1);  // center, as CPython
    else if (mode == 1) left = 0;                           // ljust
    else left = marg;                                      // rjust
    ct_buf b = {0};
    bool ok = true;
    for (int64_t i = 0; ok && i < left; i++) ok = put_cp(rs, &b, fill);
    ok = ok && ct_buf_put(rs, &b, s->s, s->len);
    for (int64_t i = 0; ok && i < marg - left; i++) ok = put_cp(rs, &b, fill);
    if (!ok) {
        ct_buf_free(&b);
        return -1;
    }
    return out_str(rs, &b, out);
}

static bool str_all(const ct_str *s, bool (*pred)(uint32_t)) {
    if (!s->len) return false;
    size_t adv;
    for (size_t i = 0; i < s->len; i += adv)
        if (!pred(ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv))) return false;
    return true;
}
static bool p_space(uint32_t c) { return ct_is_space(c); }
static bool p_alnum(uint32_t c) { return cp_isalpha(c) || cp_isdigit(c); }

static int str_method(ct_rs *rs, const ct_str *s, ct_value self, int id, const ct_args *a, ct_value *out) {
    const char *mn = method_names[id];
    ct_value v[4];
    bool g[4];
    switch (id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP: {
        static const char *const p[] = {"chars"};
        if (bind(rs, mn, a, p, 1, v, g) < 0) return -1;
        if (v[0].type != CT_NONE && v[0].type != CT_STR)
            return ct_fail(rs, "%s arg must be None or str", mn);
        return strip(rs, s, v[0].type == CT_STR ? ct_s(v[0]) : NULL, id != M_RSTRIP, id != M_LSTRIP, out);
    }
    case M_SPLIT:
    case M_RSPLIT: {
        static const char *const p[] = {"sep", "maxsplit"};
        if (bind(rs, mn, a, p, 2, v, g) < 0) return -1;
        if (v[0].type != CT_NONE && v[0].type != CT_STR) return ct_fail(rs, "must be str or None, not %s", ct_type_name(v[0]));
        int64_t maxsplit = -1;
        if (opt_int(rs, mn, v[1], -1, &maxsplit) < 0) return -1;
        if (maxsplit < 0) maxsplit = -1;
        return split(rs, s, v[0].type == CT_STR ? ct_s(v[0]) : NULL, maxsplit, id == M_RSPLIT, out);
    }
    case M_STARTSWITH: return affix(rs, s, a, false, out);
    case M_ENDSWITH: return affix(rs, s, a, true, out);
    case M_UPPER: return no_args(rs, mn, a) < 0 ? -1 : case_map(rs, s, CASE_UPPER, out);
    case M_LOWER: return no_args(rs, mn, a) < 0 ? -1 : case_map(rs, s, CASE_LOWER, out);
    case M_TITLE: return no_args(rs, mn, a) < 0 ? -1 : case_map(rs, s, CASE_TITLE, out);
    case M_CAPITALIZE: return no_args(rs, mn, a) < 0 ? -1 : case_map(rs, s, CASE_CAPITALIZE, out);
    case M_SWAPCASE: return no_args(rs, mn, a) < 0 ? -1 : case_map(rs, s, CASE_SWAP, out);
    case M_CASEFOLD: return no_args(rs, mn, a) < 0 ? -1 : case_map(rs, s, CASE_FOLD, out);
    case M_REPLACE: {
        static const char *const p[] = {"old", "new", "count"};
        if (bind(rs, mn, a, p, 3, v, g) < 0) return -1;
        if (str_arg(rs, mn, v[0]) < 0 || str_arg(rs, mn, v[1]) < 0) return -1;
        int64_t count = -1;
        if (opt_int(rs, mn, v[2], -1, &count) < 0) return -1;
        return replace(rs, s, ct_s(v[0]), ct_s(v[1]), count < 0 ? -1 : count, out);
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_RINDEX:
    case M_COUNT: {
        static const char *const p[] = {"sub", "start", "end"};
        if (bind(rs, mn, a, p, 3, v, g) < 0) return -1;
        if (!g[0]) return ct_fail(rs, "%s() takes at least 1 argument", mn);
        if (str_arg(rs, mn, v[0]) < 0) return -1;
        for (int i = 1; i < 3; i++)
            if (v[i].type != CT_NONE && !is_intlike(v[i])) return ct_fail(rs, "slice indices must be integers or None");
        const ct_str *sub = ct_s(v[0]);
        size_t bs, be;
        bool empty;
        sub_range(s, v[1], v[2], &bs, &be, &empty);
        if (id == M_COUNT) {
            int64_t c = 0;
            ct_add_work(((be - bs) >> 4) + 1);
            if (!empty) {
                if (sub->len == 0) c = (int64_t)cp_count_bytes(s->s + bs, be - bs) + 1;
                else
                    for (size_t i = bs; i + sub->len <= be;) {
                        const char *h = memmem(s->s + i, be - i, sub->s, sub->len);
                        if (!h) break;
                        c++;
                        i = (size_t)(h - s->s) + sub->len;
                    }
            }
            *out = ct_int(c);
            return 0;
        }
        int64_t pos = -1;
        ct_add_work(((be - bs) >> 4) + 1);
        if (!empty && sub->len <= be - bs) {
            if (id == M_FIND || id == M_INDEX) {
                const char *h = memmem(s->s + bs, be - bs, sub->s, sub->len);
                if (h) pos = cp_index(s, (size_t)(h - s->s));
            } else {
                rsearch rsr;
                if (rsearch_init(rs, &rsr, s->s + bs, be - bs, sub->s, sub->len) < 0) return -1;
                size_t h = rsearch_find(&rsr, be - bs);
                rsearch_free(&rsr);
                if (h != SIZE_MAX) pos = cp_index(s, bs + h);
            }
        }
        if (pos < 0 && (id == M_INDEX || id == M_RINDEX)) return ct_fail(rs, "substring not found");
        *out = ct_int(pos);
        return 0;
    }
    case M_JOIN: {
        static const char *const p[] = {"iterable"};
        if (bind(rs, mn, a, p, 1, v, g) < 0) return -1;
        if (!g[0]) return ct_fail(rs, "join() takes exactly one argument");
        ct_value items;
        if (ct_iterate(rs, v[0], &items) < 0) return -1;
        ct_buf b = {0};
        int r = 0;
        for (size_t i = 0; r == 0 && i < ct_l(items)->n; i++) {
            ct_value it = ct_l(items)->v[i];
            if (it.type != CT_STR) {
                r = ct_fail(rs, "sequence item %zu: expected str instance, %s found", i, ct_type_name(it));
                break;
            }
            if ((i && !ct_buf_put(rs, &b, s->s, s->len)) || !ct_buf_put(rs, &b, ct_s(it)->s, ct_s(it)->len)) r = -1;
        }
        ct_decref(items);
        if (r < 0) {
            ct_buf_free(&b);
            return -1;
        }
        if (!b.p) return new_str(rs, "", 0, out);
        return out_str(rs, &b, out);
    }
    case M_FORMAT: return str_format(rs, s, a, out);
    case M_ISDIGIT:
    case M_ISDECIMAL:
    case M_ISNUMERIC:
        if (no_args(rs, mn, a) < 0) return -1;
        *out = ct_bool(str_all(s, cp_isdigit));
        return 0;
    case M_ISALPHA:
        if (no_args(rs, mn, a) < 0) return -1;
        *out = ct_bool(str_all(s, cp_isalpha));
        return 0;
    case M_ISALNUM:
        if (no_args(rs, mn, a) < 0) return -1;
        *out = ct_bool(str_all(s, p_alnum));
        return 0;
    case M_ISSPACE:
        if (no_args(rs, mn, a) < 0) return -1;
        *out = ct_bool(str_all(s, p_space));
        return 0;
    case M_ISLOWER:
    case M_ISUPPER:
    case M_ISTITLE: {
        if (no_args(rs, mn, a) < 0) return -1;
        bool any_cased = false, ok = true, prev_cased = false;
        size_t adv;
        for (size_t i = 0; i < s->len && ok; i += adv) {
            uint32_t c = ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
            bool up = cp_isupper(c), lo = cp_islower(c);
            if (id == M_ISLOWER) {
                if (up) ok = false;
                if (lo) any_cased = true;
            } else if (id == M_ISUPPER) {
                if (lo) ok = false;
                if (up) any_cased = true;
            } else {
                if (up) {
                    if (prev_cased) ok = false;
                    any_cased = true;
                } else if (lo && !prev_cased) {
                    ok = false;
                }
                prev_cased = up || lo;
            }
        }
        *out = ct_bool(ok && any_cased);
        return 0;
    }
    case M_SPLITLINES: {
        static const char *const p[] = {"keepends"};
        if (bind(rs, mn, a, p, 1, v, g) < 0) return -1;
        return splitlines(rs, s, ct_truthy(v[0]), out);
    }
    case M_ZFILL: {
        static const char *const p[] = {"width"};
        if (bind(rs, mn, a, p, 1, v, g) < 0) return -1;
        if (!is_intlike(v[0])) return ct_fail(rs, "zfill: an integer is required");
        int64_t len = s->ascii ? (int64_t)s->len : (int64_t)ct_str_cplen(s), w = ival(v[0]);
        if (w <= len) return new_str(rs, s->s, s->len, out);
        if (w - len > (int64_t)CT_MAX_STR) return ct_fail(rs, "string exceeds the %u MiB limit", CT_MAX_STR >> 20);
        ct_buf b = {0};
        bool sign = s->len && (s->s[0] == '+' || s->s[0] == '-');
        bool ok = !sign || ct_buf_put(rs, &b, s->s, 1);
        for (int64_t i = 0; ok && i < w - len; i++) ok = ct_buf_put(rs, &b, "0", 1);
        ok = ok && ct_buf_put(rs, &b, s->s + sign, s->len - sign);
        if (!ok) {
            ct_buf_free(&b);
            return -1;
        }
        return out_str(rs, &b, out);
    }
    case M_CENTER:
    case M_LJUST:
    case M_RJUST: {
        static const char *const p[] = {"width", "fillchar"};
        if (bind(rs, mn, a, p, 2, v, g) < 0) return -1;
        if (!is_intlike(v[0])) return ct_fail(rs, "%s: an integer is required", mn);
        uint32_t fill = ' ';
        if (g[1]) {
            size_t adv;
            if (v[1].type != CT_STR || ct_str_cplen(ct_s(v[1])) != 1)
                return ct_fail(rs, "The fill character must be exactly one character long");
            fill = ct_u8_decode((const unsigned char *)ct_s(v[1])->s, ct_s(v[1])->len, &adv);
        }
        return pad(rs, s, ival(v[0]), fill, id == M_CENTER ? 0 : id == M_LJUST ? 1 : 2, out);
    }
    case M_PARTITION:
    case M_RPARTITION: {
        static const char *const p[] = {"sep"};
        if (bind(rs, mn, a, p, 1, v, g) < 0) return -1;
        if (str_arg(rs, mn, v[0]) < 0) return -1;
        const ct_str *sep = ct_s(v[0]);
        if (!sep->len) return ct_fail(rs, "empty separator");
        size_t h = SIZE_MAX;
        if (id == M_PARTITION) {
            const char *hit = memmem(s->s, s->len, sep->s, sep->len);
            if (hit) h = (size_t)(hit - s->s);
        } else if (sep->len <= s->len) {
            rsearch rsr;
            if (rsearch_init(rs, &rsr, s->s, s->len, sep->s, sep->len) < 0) return -1;
            h = rsearch_find(&rsr, s->len);
            rsearch_free(&rsr);
        }
        ct_value t = ct_list_new(rs, 3, true);
        if (t.type != CT_LIST) return -1;
        bool ok;
        if (h == SIZE_MAX) {
            ok = id == M_PARTITION
                     ? push_str(rs, t, s->s, s->len) && push_str(rs, t, "", 0) && push_str(rs, t, "", 0)
                     : push_str(rs, t, "", 0) && push_str(rs, t, "", 0) && push_str(rs, t, s->s, s->len);
        } else {
            ok = push_str(rs, t, s->s, h) && push_str(rs, t, sep->s, sep->len) &&
                 push_str(rs, t, s->s + h + sep->len, s->len - h - sep->len);
        }
        if (!ok) {
            ct_decref(t);
            return -1;
        }
        *out = t;
        return 0;
    }
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX: {
        static const char *const p[] = {"fix"};
        if (bind(rs, mn, a, p, 1, v, g) < 0) return -1;
        if (str_arg(rs, mn, v[0]) < 0) return -1;
        const ct_str *x = ct_s(v[0]);
        if (x->len <= s->len) {
            if (id == M_REMOVEPREFIX && !memcmp(s->s, x->s, x->len)) return new_str(rs, s->s + x->len, s->len - x->len, out);
            if (id == M_REMOVESUFFIX && x->len && !memcmp(s->s + s->len - x->len, x->s, x->len))
                return new_str(rs, s->s, s->len - x->len, out);
        }
        *out = ct_ref(self);
        return 0;
    }
    }
    return ct_fail(rs, "unsupported str method '%s'", mn);
}

static int make_items(ct_rs *rs, const ct_dict *d, int kind, ct_value *out) {
    ct_value l = ct_list_new_kind(rs, d->n, kind);
    if (l.type != CT_LIST) return -1;
    for (size_t i = 0; i < d->n; i++) {
        ct_value e;
        if (kind == CT_LK_KEYS) e = ct_ref(d->k[i]);
        else if (kind == CT_LK_VALUES) e = ct_ref(d->v[i]);
        else {
            e = ct_list_new(rs, 2, true);
            if (e.type != CT_LIST || !ct_list_push(rs, e, ct_ref(d->k[i])) || !ct_list_push(rs, e, ct_ref(d->v[i]))) {
                ct_decref(e);
                ct_decref(l);
                return -1;
            }
        }
        if (!ct_list_push(rs, l, e)) {
            ct_decref(l);
            return -1;
        }
    }
    *out = l;
    return 0;
}

static int copy_value(ct_rs *rs, ct_value v, ct_value *out) {
    if (v.type == CT_DICT) {
        ct_dict *d = ct_d(v);
        ct_value c = ct_dict_new(rs, d->n, CT_DICT);
        if (c.type != CT_DICT) return -1;
        for (size_t i = 0; i < d->n; i++)
            if (!ct_dict_set(rs, c, ct_ref(d->k[i]), ct_ref(d->v[i]))) {
                ct_decref(c);
                return -1;
            }
        *out = c;
        return 0;
    }
    ct_list *l = ct_l(v);
    ct_value c = ct_list_new(rs, l->n, false);
    if (c.type != CT_LIST) return -1;
    for (size_t i = 0; i < l->n; i++)
        if (!ct_list_push(rs, c, ct_ref(l->v[i]))) {
            ct_decref(c);
            return -1;
        }
    *out = c;
    return 0;
}

int ct_call_method(ct_rs *rs, ct_method *m, ct_args *a, ct_value *out) {
    *out = ct_none();
    ct_value self = m->self;
    const char *mn = method_names[m->id];
    ct_value v[3];
    bool g[3];
    if (m->id < M_STR_END_) return str_method(rs, ct_s(self), self, m->id, a, out);
    switch (m->id) {
    case M_GET: {
        static const char *const p[] = {"key", "default"};
        if (bind(rs, mn, a, p, 2, v, g) < 0) return -1;
        if (!g[0]) return ct_fail(rs, "get expected at least 1 argument, got 0");
        if (!ct_hashable(v[0])) return ct_fail(rs, "unhashable type: '%s'", ct_type_name(v[0]));
        ct_value *r = ct_dict_get(ct_d(self), v[0]);
        *out = ct_ref(r ? *r : v[1]);
        return 0;
    }
    case M_KEYS:
    case M_VALUES:
    case M_ITEMS:
        if (no_args(rs, mn, a) < 0) return -1;
        return make_items(rs, ct_d(self), m->id == M_KEYS ? CT_LK_KEYS : m->id == M_VALUES ? CT_LK_VALUES : CT_LK_ITEMS, out);
    case M_DICT_COPY:
    case M_LIST_COPY:
        if (no_args(rs, mn, a) < 0) return -1;
        return copy_value(rs, self, out);
    case M_LIST_INDEX:
    case M_LIST_COUNT: {
        static const char *const p[] = {"value", "start", "stop"};
        if (bind(rs, mn, a, p, 3, v, g) < 0) return -1;
        if (!g[0]) return ct_fail(rs, "%s() takes at least 1 argument", mn);
        ct_list *l = ct_l(self);
        ct_add_work(l->n);
        if (m->id == M_LIST_COUNT) {
            int64_t c = 0;
            for (size_t i = 0; i < l->n; i++) c += ct_eq(l->v[i], v[0]);
            *out = ct_int(c);
            return 0;
        }
        int64_t n = (int64_t)l->n, st = 0, en = n;
        if (g[1] && opt_int(rs, mn, v[1], 0, &st) < 0) return -1;
        if (g[2] && opt_int(rs, mn, v[2], n, &en) < 0) return -1;
        if (st < 0) st = st + n < 0 ? 0 : st + n;
        if (en < 0) en = en + n < 0 ? 0 : en + n;
        for (int64_t i = st; i < en && i < n; i++)
            if (ct_eq(l->v[i], v[0])) {
                *out = ct_int(i);
                return 0;
            }
        return ct_fail(rs, "value is not in list");
    }
    case M_CYCLE: {
        ct_loop *lp = (ct_loop *)self.u.o;
        if (a->nkw) return ct_fail(rs, "cycle() takes no keyword arguments");
        if (!a->npos) return ct_fail(rs, "no items for cycling given");
        *out = ct_ref(a->pos[lp->idx % a->npos]);
        return 0;
    }
    case M_CHANGED: {
        ct_loop *lp = (ct_loop *)self.u.o;
        ct_value t = ct_list_new(rs, (size_t)a->npos, true);
        if (t.type != CT_LIST) return -1;
        for (int i = 0; i < a->npos; i++)
            if (!ct_list_push(rs, t, ct_ref(a->pos[i]))) {
                ct_decref(t);
                return -1;
            }
        bool changed = !lp->has_changed || !ct_eq(lp->changed_last, t);
        ct_decref(lp->changed_last);
        lp->changed_last = t;
        lp->has_changed = true;
        *out = ct_bool(changed);
        return 0;
    }
    }
    return ct_fail(rs, "unsupported method '%s'", mn);
}

// ---- globals ----
static int fn_range(ct_rs *rs, ct_args *a, ct_value *out) {
    if (a->nkw) return ct_fail(rs, "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3) return ct_fail(rs, "range expected 1 to 3 arguments, got %d", a->npos);
    for (int i = 0; i < a->npos; i++)
        if (!is_intlike(a->pos[i]))
            return ct_fail(rs, "'%s' object cannot be interpreted as an integer", ct_type_name(a->pos[i]));
    int64_t start = 0, stop, step = 1;
    if (a->npos == 1) stop = ival(a->pos[0]);
    else {
        start = ival(a->pos[0]);
        stop = ival(a->pos[1]);
        if (a->npos == 3) step = ival(a->pos[2]);
    }
    if (step == 0) return ct_fail(rs, "range() arg 3 must not be zero");
    double cnt = step > 0 ? (stop > start ? ceil(((double)stop - (double)start) / (double)step) : 0)
                          : (start > stop ? ceil(((double)start - (double)stop) / -(double)step) : 0);
    if (cnt > CT_MAX_RANGE)
        return ct_fail(rs, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", CT_MAX_RANGE);
    ct_value l = ct_list_new(rs, (size_t)cnt, false);
    if (l.type != CT_LIST) return -1;
    for (int64_t i = 0, x = start; i < (int64_t)cnt; i++, x += step)
        if (!ct_list_push(rs, l, ct_int(x))) {
            ct_decref(l);
            return -1;
        }
    *out = l;
    return 0;
}

// dict(*args, **kwargs) into d (a dict or namespace)
static int fill_dict(ct_rs *rs, ct_value d, ct_args *a, const char *what) {
    if (a->npos > 1) return ct_fail(rs, "%s expected at most 1 positional argument, got %d", what, a->npos);
    if (a->npos == 1) {
        ct_value src = a->pos[0];
        if (src.type == CT_DICT || src.type == CT_NS) {
            for (size_t i = 0; i < ct_d(src)->n; i++)
                if (!ct_dict_set(rs, d, ct_ref(ct_d(src)->k[i]), ct_ref(ct_d(src)->v[i]))) return -1;
        } else {
            ct_value items;
            if (ct_iterate(rs, src, &items) < 0) return -1;
            for (size_t i = 0; i < ct_l(items)->n; i++) {
                ct_value pair;
                if (ct_iterate(rs, ct_l(items)->v[i], &pair) < 0) {
                    ct_decref(items);
                    return -1;
                }
                if (ct_l(pair)->n != 2) {
                    ct_fail(rs, "%s: sequence element #%zu has length %zu; 2 is required", what, i, ct_l(pair)->n);
                    ct_decref(pair);
                    ct_decref(items);
                    return -1;
                }
                bool ok = ct_dict_set(rs, d, ct_ref(ct_l(pair)->v[0]), ct_ref(ct_l(pair)->v[1]));
                ct_decref(pair);
                if (!ok) {
                    ct_decref(items);
                    return -1;
                }
            }
            ct_decref(items);
        }
    }
    for (int k = 0; k < a->nkw; k++) {
        ct_value key = ct_str_new(rs, a->kwn[k], strlen(a->kwn[k]));
        if (key.type != CT_STR || !ct_dict_set(rs, d, key, ct_ref(a->kwv[k]))) return -1;
    }
    return 0;
}

int ct_call_func(ct_rs *rs, int id, ct_args *a, ct_value *out) {
    *out = ct_none();
    switch (id) {
    case G_RANGE: return fn_range(rs, a, out);
    case G_NAMESPACE:
    case G_DICT: {
        ct_value d = ct_dict_new(rs, 0, id == G_NAMESPACE ? CT_NS : CT_DICT);
        if (d.type == CT_NONE) return -1;
        if (id == G_NAMESPACE && !ct_register_ns(rs, d)) {
            ct_decref(d);
            return -1;
        }
        if (fill_dict(rs, d, a, id == G_NAMESPACE ? "namespace" : "dict") < 0) {
            ct_decref(d);
            return -1;
        }
        *out = d;
        return 0;
    }
    case G_RAISE: {
        ct_value msg = a->npos ? a->pos[0] : (a->nkw ? a->kwv[0] : ct_none());
        ct_buf b = {0};
        if (!ct_to_str(rs, &b, msg)) {
            ct_buf_free(&b);
            return -1;
        }
        ct_fail(rs, "template raised an exception: %s", b.p ? b.p : "");
        ct_buf_free(&b);
        return -1;
    }
    case G_STRFTIME: {
        static const char *const p[] = {"format"};
        ct_value v[1];
        bool g[1];
        if (bind(rs, "strftime_now", a, p, 1, v, g) < 0) return -1;
        if (!g[0] || v[0].type != CT_STR) return ct_fail(rs, "strftime_now() needs a format string");
        time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm)) return ct_fail(rs, "strftime_now: no local time");
        char buf[512];
        size_t n = ct_s(v[0])->len < 200 ? strftime(buf, sizeof buf, ct_s(v[0])->s, &tm) : 0;
        if (n == 0 && ct_s(v[0])->len) return ct_fail(rs, "strftime_now: format too long or unsupported");
        return new_str(rs, buf, n, out);
    }
    }
    return ct_fail(rs, "unknown function");
}

// ---- sorting (stable merge sort, Python's sorted) ----
typedef struct sort_ctx {
    ct_rs *rs;
    bool reverse, failed;
} sort_ctx;

static int key_cmp(sort_ctx *sc, ct_value a, ct_value b) {
    int c = 0;
    if (sc->failed) return 0;
    if (ct_cmp(sc->rs, a, b, &c) < 0) {
        sc->failed = true;
        return 0;
    }
    return sc->reverse ? -c : c;
}

static void msort(sort_ctx *sc, size_t *idx, size_t *tmp, const ct_value *keys, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(sc, idx, tmp, keys, h);
    msort(sc, idx + h, tmp, keys, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        if (key_cmp(sc, keys[idx[j]], keys[idx[i]]) < 0) tmp[k++] = idx[j++];
        else tmp[k++] = idx[i++];
    }
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof(size_t));
}

// keys: lowercased strings unless case_sensitive; attribute paths applied first
static int sort_keys_of(ct_rs *rs, const ct_list *items, ct_value attribute, bool case_sensitive, ct_value **keys_out) {
    ct_add_work(items->n);
    if (!ct_budget(rs, (items->n + 1) * sizeof(ct_value))) return -1;
    ct_value *keys = calloc(items->n ? items->n : 1, sizeof(ct_value));
    if (!keys) {
        ct_release((items->n + 1) * sizeof(ct_value));
        return ct_fail(rs, "out of memory");
    }
    for (size_t i = 0; i < items->n; i++) {
        ct_value k;
        if (attribute.type != CT_NONE) {
            if (attr_path(rs, items->v[i], attribute, &k) < 0) goto fail;
        } else {
            k = ct_ref(items->v[i]);
        }
        if (!case_sensitive && k.type == CT_STR) {
            ct_value lk;
            int r = case_map(rs, ct_s(k), CASE_LOWER, &lk);
            ct_decref(k);
            if (r < 0) goto fail;
            k = lk;
        }
        keys[i] = k;
    }
    *keys_out = keys;
    return 0;
fail:
    for (size_t i = 0; i < items->n; i++) ct_decref(keys[i]);
    free(keys);
    ct_release((items->n + 1) * sizeof(ct_value));
    return -1;
}

static int sorted_list(ct_rs *rs, const ct_list *items, const ct_value *keys, bool reverse, int kind, ct_value *out) {
    size_t n = items->n;
    size_t *idx = malloc((n ? n : 1) * sizeof(size_t)), *tmp = malloc((n ? n : 1) * sizeof(size_t));
    if (!idx || !tmp) {
        free(idx);
        free(tmp);
        return ct_fail(rs, "out of memory");
    }
    for (size_t i = 0; i < n; i++) idx[i] = i;
    {
        uint64_t lg = 1;
        while (((size_t)1 << lg) < n && lg < 63) lg++;
        ct_add_work((uint64_t)n * lg);
    }
    sort_ctx sc = {rs, reverse, false};
    msort(&sc, idx, tmp, keys, n);
    free(tmp);
    if (sc.failed) {
        free(idx);
        return -1;
    }
    ct_value l = ct_list_new_kind(rs, n, kind);
    if (l.type != CT_LIST) {
        free(idx);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!ct_list_push(rs, l, ct_ref(items->v[idx[i]]))) {
            free(idx);
            ct_decref(l);
            return -1;
        }
    free(idx);
    *out = l;
    return 0;
}

static void free_keys(ct_value *keys, size_t n) {
    for (size_t i = 0; i < n; i++) ct_decref(keys[i]);
    free(keys);
    ct_release((n + 1) * sizeof(ct_value));
}

// ---- filters ----
int ct_html_escape(ct_rs *rs, ct_value v, ct_value *out) {
    if (v.type == CT_STR && ct_s(v)->markup) {  // already safe
        *out = ct_ref(v);
        return 0;
    }
    ct_value s = ct_str_of(rs, v);
    if (s.type != CT_STR) return -1;
    ct_buf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < ct_s(s)->len; i++) {
        char c = ct_s(s)->s[i];
        switch (c) {
        case '&': ok = ct_buf_puts(rs, &b, "&amp;"); break;
        case '<': ok = ct_buf_puts(rs, &b, "&lt;"); break;
        case '>': ok = ct_buf_puts(rs, &b, "&gt;"); break;
        case '"': ok = ct_buf_puts(rs, &b, "&#34;"); break;
        case '\'': ok = ct_buf_puts(rs, &b, "&#39;"); break;
        default: ok = ct_buf_put(rs, &b, &c, 1);
        }
    }
    ct_decref(s);
    if (!ok) {
        ct_buf_free(&b);
        return -1;
    }
    int r = b.p ? out_str(rs, &b, out) : new_str(rs, "", 0, out);
    if (r == 0) ct_s(*out)->markup = true;
    return r;
}

static int seq_len(ct_rs *rs, ct_value v, int64_t *n) {
    switch (v.type) {
    case CT_UNDEF: *n = 0; return 0;
    case CT_STR: *n = (int64_t)ct_str_cplen(ct_s(v)); return 0;
    case CT_LIST: *n = (int64_t)ct_l(v)->n; return 0;
    case CT_DICT: *n = (int64_t)ct_d(v)->n; return 0;
    case CT_LOOP: *n = (int64_t)((ct_loop *)v.u.o)->items->n; return 0;
    default: return ct_fail(rs, "object of type '%s' has no len()", ct_type_name(v));
    }
}

// select / reject / selectattr / rejectattr / map: `args` after the input
static int select_like(ct_rs *rs, int id, ct_value in, ct_args *a, ct_value *out) {
    *out = ct_list_new_kind(rs, 0, CT_LK_GEN);
    if (out->type != CT_LIST) return -1;
    if (!ct_truthy(in)) return 0;  // jinja2: `if value:` before anything else
    ct_value items;
    if (ct_iterate(rs, in, &items) < 0) {
        ct_decref(*out);
        *out = ct_none();
        return -1;
    }
    bool attr = id == F_SELECTATTR || id == F_REJECTATTR;
    bool reject = id == F_REJECT || id == F_REJECTATTR;
    int off = attr ? 1 : 0, r = 0;
    ct_value attr_name = ct_none(), map_default = ct_none();
    bool map_attr = false;
    ct_args targs = {0};
    const char *tname = NULL;
    if (id == F_MAP) {
        if (a->npos == 0) {
            int ai = -1;
            for (int k = 0; k < a->nkw; k++) {
                if (!strcmp(a->kwn[k], "attribute")) ai = k;
                else if (!strcmp(a->kwn[k], "default")) map_default = a->kwv[k];
                else {
                    r = ct_fail(rs, "Unexpected keyword argument '%s'", a->kwn[k]);
                    goto done;
                }
            }
            if (ai < 0) {
                r = ct_fail(rs, "map requires a filter argument");
                goto done;
            }
            attr_name = a->kwv[ai];
            map_attr = true;
        } else {
            if (a->pos[0].type != CT_STR) {
                r = ct_fail(rs, "map: the filter name must be a string");
                goto done;
            }
            tname = ct_s(a->pos[0])->s;
            targs.pos = a->pos + 1;
            targs.npos = a->npos - 1;
            targs.kwn = a->kwn;
            targs.kwv = a->kwv;
            targs.nkw = a->nkw;
        }
    } else {
        if (attr) {
            if (a->npos < 1) {
                r = ct_fail(rs, "Missing parameter for attribute name");
                goto done;
            }
            attr_name = a->pos[0];
        }
        if (a->npos > off) {
            if (a->pos[off].type != CT_STR) {
                r = ct_fail(rs, "the test name must be a string");
                goto done;
            }
            tname = ct_s(a->pos[off])->s;
            targs.pos = a->pos + off + 1;
            targs.npos = a->npos - off - 1;
            targs.kwn = a->kwn;
            targs.kwv = a->kwv;
            targs.nkw = a->nkw;
        }
    }
    ct_add_work(ct_l(items)->n);
    for (size_t i = 0; r == 0 && i < ct_l(items)->n; i++) {
        ct_value item = ct_l(items)->v[i], x;
        if (id == F_MAP) {
            if (map_attr) {
                r = attr_path(rs, item, attr_name, &x);
                if (r == 0 && x.type == CT_UNDEF && map_default.type != CT_NONE) {
                    x = ct_ref(map_default);
                }
            } else {
                r = ct_apply_filter(rs, ct_filter_id(tname), tname, item, &targs, &x);
            }
            if (r == 0 && !ct_list_push(rs, *out, x)) r = -1;
            continue;
        }
        if (attr) {
            if (attr_path(rs, item, attr_name, &x) < 0) {
                r = -1;
                break;
            }
        } else {
            x = ct_ref(item);
        }
        bool keep;
        if (tname) r = ct_apply_test(rs, ct_test_id(tname), tname, x, &targs, &keep);
        else keep = ct_truthy(x);
        ct_decref(x);
        if (r == 0 && keep != reject && !ct_list_push(rs, *out, ct_ref(item))) r = -1;
    }
done:
    ct_decref(items);
    if (r < 0) {
        ct_decref(*out);
        *out = ct_none();
    }
    return r;
}

static int minmax(ct_rs *rs, ct_value in, ct_args *a, bool is_max, ct_value *out) {
    static const char *const p[] = {"case_sensitive", "attribute"};
    ct_value v[2];
    bool g[2];
    if (bind(rs, is_max ? "max" : "min", a, p, 2, v, g) < 0) return -1;
    ct_value items, *keys;
    if (ct_iterate(rs, in, &items) < 0) return -1;
    const ct_list *l = ct_l(items);
    if (l->n == 0) {
        ct_decref(items);
        *out = ct_undef_named(CT_UNDEF_HINT, "No aggregated item, sequence was empty.");
        return 0;
    }
    if (sort_keys_of(rs, l, v[1], ct_truthy(v[0]), &keys) < 0) {
        ct_decref(items);
        return -1;
    }
    size_t best = 0;
    int r = 0;
    for (size_t i = 1; i < l->n; i++) {
        int c;
        if (ct_cmp(rs, keys[i], keys[best], &c) < 0) {
            r = -1;
            break;
        }
        if (is_max ? c > 0 : c < 0) best = i;
    }
    if (r == 0) *out = ct_ref(l->v[best]);
    free_keys(keys, l->n);
    ct_decref(items);
    return r;
}

static int tojson(ct_rs *rs, ct_value in, ct_args *a, ct_value *out) {
    // transformers' override: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    static const char *const p[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    ct_value v[4];
    bool g[4];
    if (bind(rs, "tojson", a, p, 4, v, g) < 0) return -1;
    char indent_buf[64];
    ct_json_opts o = {.ensure_ascii = ct_truthy(v[0]), .sort_keys = ct_truthy(v[3])};
    if (v[1].type == CT_NONE) {
        o.indent = NULL;
    } else if (is_intlike(v[1])) {
        int64_t n = ival(v[1]);
        if (n < 0) n = 0;
        if (n >= (int64_t)sizeof indent_buf) return ct_fail(rs, "tojson: indent too large");
        memset(indent_buf, ' ', (size_t)n);
        indent_buf[n] = 0;
        o.indent = indent_buf;
    } else if (v[1].type == CT_STR) {
        o.indent = ct_s(v[1])->s;
    } else {
        return ct_fail(rs, "tojson: indent must be an integer or a string");
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (v[2].type != CT_NONE) {
        if (v[2].type != CT_LIST || ct_l(v[2])->n != 2 || ct_l(v[2])->v[0].type != CT_STR || ct_l(v[2])->v[1].type != CT_STR)
            return ct_fail(rs, "tojson: separators must be a pair of strings");
        o.item_sep = ct_s(ct_l(v[2])->v[0])->s;
        o.key_sep = ct_s(ct_l(v[2])->v[1])->s;
    }
    ct_buf b = {0};
    if (!ct_to_json(rs, &b, in, &o)) {
        ct_buf_free(&b);
        return -1;
    }
    return out_str(rs, &b, out);
}

static int to_int(ct_rs *rs, ct_value in, ct_args *a, ct_value *out) {
    static const char *const p[] = {"default", "base"};
    ct_value v[2];
    bool g[2];
    if (bind(rs, "int", a, p, 2, v, g) < 0) return -1;
    ct_value dflt = g[0] ? v[0] : ct_int(0);
    int64_t base = g[1] && is_intlike(v[1]) ? ival(v[1]) : 10;
    if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
    if (is_intlike(in)) {
        *out = ct_int(ival(in));
        return 0;
    }
    if (in.type == CT_FLOAT) {
        if (isnan(in.u.f)) {
            *out = ct_ref(dflt);
            return 0;
        }
        if (!(fabs(in.u.f) < 9.2e18)) return ct_fail(rs, "cannot convert float infinity (or a huge float) to integer");
        *out = ct_int((int64_t)in.u.f);
        return 0;
    }
    if (in.type == CT_STR) {
        // int(s, base): whitespace, sign, digits with single underscores
        const char *s = ct_s(in)->s;
        size_t n = ct_s(in)->len, i = 0, e = n, w;
        while (i < n && (w = space_len(s, n, i))) i += w;
        while (e > i && ((unsigned char)s[e - 1] < 0x80) && ct_is_space((unsigned char)s[e - 1])) e--;
        bool neg = false;
        if (i < e && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
        if (base == 16 && i + 1 < e && s[i] == '0' && (s[i + 1] | 0x20) == 'x') i += 2;
        else if (base == 8 && i + 1 < e && s[i] == '0' && (s[i + 1] | 0x20) == 'o') i += 2;
        else if (base == 2 && i + 1 < e && s[i] == '0' && (s[i + 1] | 0x20) == 'b') i += 2;
        uint64_t acc = 0;
        bool ok = i < e && base >= 2 && base <= 36, prev_us = true;
        for (size_t k = i; ok && k < e; k++) {
            char c = s[k];
            if (c == '_') {
                ok = !prev_us && k + 1 < e;
                prev_us = true;
                continue;
            }
            int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') ? (c | 0x20) - 'a' + 10 : 99;
            if (d >= base) ok = false;
            else if (acc > (UINT64_MAX - (uint64_t)d) / (uint64_t)base || acc * (uint64_t)base + (uint64_t)d > (uint64_t)INT64_MAX)
                return ct_fail(rs, "integer overflow (64-bit)");
            else acc = acc * (uint64_t)base + (uint64_t)d;
            prev_us = false;
        }
        if (ok) {
            *out = ct_int(neg ? -(int64_t)acc : (int64_t)acc);
            return 0;
        }
        // "42.23"|int gives 42: int(float(value))
        char buf[128];
        size_t len = e - i + (neg ? 1 : 0);
        if (e > i && len < sizeof buf) {
            size_t o = 0;
            if (neg) buf[o++] = '-';
            for (size_t k = i; k < e; k++)
                if (s[k] != '_') buf[o++] = s[k];
            buf[o] = 0;
            char *end;
            double d = strtod(buf, &end);
            bool hex = strchr(buf, 'x') || strchr(buf, 'X');
            if (*end == 0 && o > 0 && !hex && !isnan(d)) {
                if (!(fabs(d) < 9.2e18)) return ct_fail(rs, "cannot convert float infinity to integer");
                *out = ct_int((int64_t)d);
                return 0;
            }
        }
    }
    *out = ct_ref(dflt);
    return 0;
}

static int to_float(ct_rs *rs, ct_value in, ct_args *a, ct_value *out) {
    static const char *const p[] = {"default"};
    ct_value v[1];
    bool g[1];
    if (bind(rs, "float", a, p, 1, v, g) < 0) return -1;
    ct_value dflt = g[0] ? v[0] : ct_float(0.0);
    if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
    if (is_num(in)) {
        *out = ct_float(fval(in));
        return 0;
    }
    if (in.type == CT_STR && ct_s(in)->len < 128) {
        const char *s = ct_s(in)->s;
        size_t n = ct_s(in)->len, i = 0, e = n;
        while (i < n && ct_is_space((unsigned char)s[i])) i++;
        while (e > i && ct_is_space((unsigned char)s[e - 1])) e--;
        char buf[128];
        size_t o = 0;
        for (size_t k = i; k < e; k++)
            if (s[k] != '_') buf[o++] = s[k];
        buf[o] = 0;
        char *end;
        double d = strtod(buf, &end);
        if (o && *end == 0 && !strchr(buf, 'x') && !strchr(buf, 'X')) {
            *out = ct_float(d);
            return 0;
        }
    }
    *out = ct_ref(dflt);
    return 0;
}

static int do_round(ct_rs *rs, ct_value in, ct_args *a, ct_value *out) {
    static const char *const p[] = {"precision", "method"};
    ct_value v[2];
    bool g[2];
    if (bind(rs, "round", a, p, 2, v, g) < 0) return -1;
    int64_t prec = g[0] && is_intlike(v[0]) ? ival(v[0]) : 0;
    const char *method = g[1] && v[1].type == CT_STR ? ct_s(v[1])->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return ct_fail(rs, "method must be common, ceil or floor");
    if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
    if (!is_num(in)) return ct_fail(rs, "type %s doesn't define __round__ method", ct_type_name(in));
    if (prec < -300) prec = -300;
    if (prec > 300) prec = 300;
    if (!strcmp(method, "common")) {
        if (is_intlike(in) && prec >= 0) {
            *out = ct_int(ival(in));
            return 0;
        }
        double x = fval(in), r;
        if (!isfinite(x)) r = x;
        else if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)(prec > 60 ? 60 : prec), x);  // exact, half-even
            r = prec > 60 ? x : strtod(buf, NULL);
        } else {
            double m = pow(10.0, (double)-prec);
            r = nearbyint(x / m) * m;
        }
        *out = is_intlike(in) ? ct_int((int64_t)r) : ct_float(r);
        return 0;
    }
    double m = pow(10.0, (double)prec), x = fval(in) * m;
    *out = ct_float((method[0] == 'c' ? ceil(x) : floor(x)) / m);
    return 0;
}

static int do_indent(ct_rs *rs, ct_value in, ct_args *a, ct_value *out) {
    static const char *const p[] = {"width", "first", "blank"};
    ct_value v[3];
    bool g[3];
    if (bind(rs, "indent", a, p, 3, v, g) < 0) return -1;
    ct_buf ind = {0}, b = {0};
    ct_value s = ct_none(), lines = ct_none();
    int r = -1;
    if (!g[0] || is_intlike(v[0])) {
        int64_t w = g[0] ? ival(v[0]) : 4;
        if (w > 1000) w = 1000;
        for (int64_t i = 0; i < w; i++)
            if (!ct_buf_put(rs, &ind, " ", 1)) goto done;
    } else if (v[0].type == CT_STR) {
        if (!ct_buf_put(rs, &ind, ct_s(v[0])->s, ct_s(v[0])->len)) goto done;
    } else {
        ct_fail(rs, "indent: width must be an integer or a string");
        goto done;
    }
    s = ct_str_of(rs, in);
    if (s.type != CT_STR) goto done;
    {
        ct_value s2 = ct_str_cat(rs, ct_s(s)->s, ct_s(s)->len, "\n", 1);  // the splitlines quirk
        ct_decref(s);
        s = s2;
        if (s.type != CT_STR || splitlines(rs, ct_s(s), false, &lines) < 0) goto done;
    }
    {
        const ct_list *l = ct_l(lines);
        const char *istr = ind.p ? ind.p : "";
        bool blank = ct_truthy(v[2]);
        for (size_t i = 0; i < l->n; i++) {
            const ct_str *ln = ct_s(l->v[i]);
            if (i) {
                if (!ct_buf_put(rs, &b, "\n", 1)) goto done;
                if ((blank || ln->len) && !ct_buf_puts(rs, &b, istr)) goto done;
            }
            if (!ct_buf_put(rs, &b, ln->s, ln->len)) goto done;
        }
        if (ct_truthy(v[1])) {
            ct_buf f = {0};
            if (!ct_buf_puts(rs, &f, istr) || (b.p && !ct_buf_put(rs, &f, b.p, b.n))) {
                ct_buf_free(&f);
                goto done;
            }
            ct_buf_free(&b);
            b = f;
        }
    }
    r = b.p ? out_str(rs, &b, out) : new_str(rs, "", 0, out);
done:
    ct_buf_free(&ind);
    ct_buf_free(&b);
    ct_decref(s);
    ct_decref(lines);
    return r;
}

static int str_filter(ct_rs *rs, ct_value in, int mode, ct_value *out) {
    ct_value s = ct_str_of(rs, in);
    if (s.type != CT_STR) return -1;
    int r = case_map(rs, ct_s(s), mode, out);
    ct_decref(s);
    return r;
}

int ct_apply_filter(ct_rs *rs, int id, const char *name, ct_value in, ct_args *a, ct_value *out) {
    *out = ct_none();
    ct_value v[4];
    bool g[4];
    char what[64];
    snprintf(what, sizeof what, "filter '%s'", name);
    switch (id) {
    case F_ABS:
        if (no_args(rs, what, a) < 0) return -1;
        if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
        if (in.type == CT_FLOAT) *out = ct_float(fabs(in.u.f));
        else if (is_intlike(in)) {
            if (ival(in) == INT64_MIN) return ct_fail(rs, "integer overflow (64-bit)");
            *out = ct_int(ival(in) < 0 ? -ival(in) : ival(in));
        } else return ct_fail(rs, "bad operand type for abs(): '%s'", ct_type_name(in));
        return 0;
    case F_ATTR: {
        static const char *const p[] = {"name"};
        if (bind(rs, what, a, p, 1, v, g) < 0) return -1;
        if (v[0].type != CT_STR) {
            *out = ct_undef();
            return 0;
        }
        if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
        int m = find_method(in, ct_s(v[0])->s);
        if (m >= 0) return method_value(rs, in, m, out);
        *out = ct_undef();
        if (in.type == CT_NS) {
            ct_value *x = ct_dict_get_str(ct_d(in), ct_s(v[0])->s, ct_s(v[0])->len);
            if (x) *out = ct_ref(*x);
        } else if (in.type == CT_LOOP) {
            ct_value x;
            if (loop_attr(rs, (ct_loop *)in.u.o, ct_s(v[0])->s, &x) == 0) *out = x;
        }
        return 0;
    }
    case F_BATCH: {
        static const char *const p[] = {"linecount", "fill_with"};
        if (bind(rs, what, a, p, 2, v, g) < 0) return -1;
        if (!is_intlike(v[0]) || ival(v[0]) <= 0) return ct_fail(rs, "batch: linecount must be a positive integer");
        int64_t cnt = ival(v[0]);
        ct_value items;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        ct_value res = ct_list_new_kind(rs, 0, CT_LK_GEN), cur = ct_none();
        int r = res.type == CT_LIST ? 0 : -1;
        for (size_t i = 0; r == 0 && i < ct_l(items)->n; i++) {
            if (cur.type == CT_NONE && (cur = ct_list_new(rs, 0, false)).type != CT_LIST) r = -1;
            if (r == 0 && !ct_list_push(rs, cur, ct_ref(ct_l(items)->v[i]))) r = -1;
            if (r == 0 && (int64_t)ct_l(cur)->n == cnt) {
                if (!ct_list_push(rs, res, cur)) r = -1;
                cur = ct_none();
            }
        }
        if (r == 0 && cur.type == CT_LIST) {
            while (g[1] && (int64_t)ct_l(cur)->n < cnt && r == 0)
                if (!ct_list_push(rs, cur, ct_ref(v[1]))) r = -1;
            if (r == 0 && !ct_list_push(rs, res, cur)) r = -1;
            cur = ct_none();
        }
        ct_decref(cur);
        ct_decref(items);
        if (r < 0) {
            ct_decref(res);
            return -1;
        }
        *out = res;
        return 0;
    }
    case F_CAPITALIZE:
        if (no_args(rs, what, a) < 0) return -1;
        return str_filter(rs, in, CASE_CAPITALIZE, out);
    case F_UPPER:
        if (no_args(rs, what, a) < 0) return -1;
        return str_filter(rs, in, CASE_UPPER, out);
    case F_LOWER:
        if (no_args(rs, what, a) < 0) return -1;
        return str_filter(rs, in, CASE_LOWER, out);
    case F_TITLE:
        if (no_args(rs, what, a) < 0) return -1;
        return str_filter(rs, in, CASE_JTITLE, out);
    case F_CENTER: {
        static const char *const p[] = {"width"};
        if (bind(rs, what, a, p, 1, v, g) < 0) return -1;
        if (g[0] && !is_intlike(v[0])) return ct_fail(rs, "center: width must be an integer");
        ct_value s = ct_str_of(rs, in);
        if (s.type != CT_STR) return -1;
        int r = pad(rs, ct_s(s), g[0] ? ival(v[0]) : 80, ' ', 0, out);
        ct_decref(s);
        return r;
    }
    case F_COUNT:
    case F_LENGTH: {
        if (no_args(rs, what, a) < 0) return -1;
        int64_t n = 0;
        if (seq_len(rs, in, &n) < 0) return -1;
        *out = ct_int(n);
        return 0;
    }
    case F_D:
    case F_DEFAULT: {
        static const char *const p[] = {"default_value", "boolean"};
        if (bind(rs, what, a, p, 2, v, g) < 0) return -1;
        if (in.type == CT_UNDEF || (ct_truthy(v[1]) && !ct_truthy(in))) {
            if (!g[0]) return new_str(rs, "", 0, out);
            *out = ct_ref(v[0]);
        } else {
            *out = ct_ref(in);
        }
        return 0;
    }
    case F_DICTSORT: {
        static const char *const p[] = {"case_sensitive", "by", "reverse"};
        if (bind(rs, what, a, p, 3, v, g) < 0) return -1;
        if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
        if (in.type != CT_DICT) return ct_fail(rs, "dictsort: '%s' object has no attribute 'items'", ct_type_name(in));
        int pos = 0;
        if (g[1]) {
            if (v[1].type == CT_STR && !strcmp(ct_s(v[1])->s, "value")) pos = 1;
            else if (!(v[1].type == CT_STR && !strcmp(ct_s(v[1])->s, "key")))
                return ct_fail(rs, "You can only sort by either \"key\" or \"value\"");
        }
        ct_value items, *keys;
        if (make_items(rs, ct_d(in), CT_LK_LIST, &items) < 0) return -1;
        ct_value idx = ct_int(pos);
        if (sort_keys_of(rs, ct_l(items), idx, ct_truthy(v[0]), &keys) < 0) {
            ct_decref(items);
            return -1;
        }
        int r = sorted_list(rs, ct_l(items), keys, ct_truthy(v[2]), CT_LK_LIST, out);
        free_keys(keys, ct_l(items)->n);
        ct_decref(items);
        return r;
    }
    case F_E:
    case F_ESCAPE:
        if (no_args(rs, what, a) < 0) return -1;
        return ct_html_escape(rs, in, out);
    case F_FORCEESCAPE: {
        if (no_args(rs, what, a) < 0) return -1;
        ct_value s = ct_str_of(rs, in);
        if (s.type != CT_STR) return -1;
        ct_value plain = ct_str_new(rs, ct_s(s)->s, ct_s(s)->len);
        ct_decref(s);
        if (plain.type != CT_STR) return -1;
        int r = ct_html_escape(rs, plain, out);
        ct_decref(plain);
        return r;
    }
    case F_FIRST:
    case F_LAST: {
        if (no_args(rs, what, a) < 0) return -1;
        if (id == F_LAST && in.type == CT_LIST && ct_l(in)->kind == CT_LK_GEN)
            return ct_fail(rs, "'generator' object is not reversible");
        ct_value items;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        size_t n = ct_l(items)->n;
        if (n == 0) *out = ct_undef_named(CT_UNDEF_HINT, id == F_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.");
        else *out = ct_ref(ct_l(items)->v[id == F_FIRST ? 0 : n - 1]);
        ct_decref(items);
        return 0;
    }
    case F_FLOAT: return to_float(rs, in, a, out);
    case F_INT: return to_int(rs, in, a, out);
    case F_FORMAT: {
        ct_value s = ct_str_of(rs, in);
        if (s.type != CT_STR) return -1;
        if (a->npos && a->nkw) {
            ct_decref(s);
            return ct_fail(rs, "can't handle positional and keyword arguments at the same time");
        }
        ct_value t = ct_list_new(rs, (size_t)a->npos, true);
        int r = t.type == CT_LIST ? 0 : -1;
        for (int i = 0; r == 0 && i < a->npos; i++)
            if (!ct_list_push(rs, t, ct_ref(a->pos[i]))) r = -1;
        if (r == 0 && a->nkw) r = ct_fail(rs, "format with keyword arguments is not supported");
        if (r == 0) r = ct_py_format(rs, s, t, out);
        ct_decref(t);
        ct_decref(s);
        return r;
    }
    case F_INDENT: return do_indent(rs, in, a, out);
    case F_ITEMS:
        if (no_args(rs, what, a) < 0) return -1;
        if (in.type == CT_UNDEF) {
            *out = ct_list_new_kind(rs, 0, CT_LK_GEN);
            return out->type == CT_LIST ? 0 : -1;
        }
        if (in.type != CT_DICT) return ct_fail(rs, "Can only get item pairs from a mapping.");
        return make_items(rs, ct_d(in), CT_LK_GEN, out);
    case F_JOIN: {
        static const char *const p[] = {"d", "attribute"};
        if (bind(rs, what, a, p, 2, v, g) < 0) return -1;
        ct_value items;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        ct_add_work(ct_l(items)->n);
        ct_buf b = {0};
        int r = 0;
        for (size_t i = 0; r == 0 && i < ct_l(items)->n; i++) {
            if (i && g[0] && !ct_to_str(rs, &b, v[0])) r = -1;
            ct_value x = ct_ref(ct_l(items)->v[i]);
            if (r == 0 && g[1] && v[1].type != CT_NONE) {
                ct_value y;
                r = attr_path(rs, x, v[1], &y);
                ct_decref(x);
                x = r == 0 ? y : ct_none();
            }
            if (r == 0 && !ct_to_str(rs, &b, x)) r = -1;
            ct_decref(x);
        }
        ct_decref(items);
        if (r < 0) {
            ct_buf_free(&b);
            return -1;
        }
        if (!b.p) return new_str(rs, "", 0, out);
        return out_str(rs, &b, out);
    }
    case F_LIST: {
        if (no_args(rs, what, a) < 0) return -1;
        ct_value items;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        int r = copy_value(rs, items, out);
        ct_decref(items);
        return r;
    }
    case F_MAP:
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR:
        return select_like(rs, id, in, a, out);
    case F_MAX:
    case F_MIN: return minmax(rs, in, a, id == F_MAX, out);
    case F_REPLACE: {
        static const char *const p[] = {"old", "new", "count"};
        if (bind(rs, what, a, p, 3, v, g) < 0) return -1;
        if (!g[0] || !g[1]) return ct_fail(rs, "replace() needs old and new");
        ct_value s = ct_str_of(rs, in), o = ct_str_of(rs, v[0]), n = ct_str_of(rs, v[1]);
        int r = -1;
        int64_t count = -1;
        if (g[2] && v[2].type != CT_NONE) {
            if (!is_intlike(v[2])) ct_fail(rs, "replace: count must be an integer");
            else count = ival(v[2]) ? ival(v[2]) : -1;  // `count or -1`
        }
        if (s.type == CT_STR && o.type == CT_STR && n.type == CT_STR && !rs->failed)
            r = replace(rs, ct_s(s), ct_s(o), ct_s(n), count < 0 ? -1 : count, out);
        ct_decref(s);
        ct_decref(o);
        ct_decref(n);
        return r;
    }
    case F_REVERSE: {
        if (no_args(rs, what, a) < 0) return -1;
        if (in.type == CT_STR) {
            ct_value st = ct_int(-1), none = ct_none();
            return ct_slice(rs, in, none, none, st, out);
        }
        ct_value items;
        if (ct_iterate(rs, in, &items) < 0) return ct_fail(rs, "argument must be iterable");
        bool was_gen = in.type == CT_LIST && ct_l(in)->kind == CT_LK_GEN;
        ct_list *l = ct_l(items);
        ct_value r = ct_list_new_kind(rs, l->n, was_gen ? CT_LK_LIST : CT_LK_GEN);
        if (r.type != CT_LIST) {
            ct_decref(items);
            return -1;
        }
        for (size_t i = l->n; i-- > 0;)
            if (!ct_list_push(rs, r, ct_ref(l->v[i]))) {
                ct_decref(r);
                ct_decref(items);
                return -1;
            }
        ct_decref(items);
        *out = r;
        return 0;
    }
    case F_ROUND: return do_round(rs, in, a, out);
    case F_SAFE:
        if (no_args(rs, what, a) < 0) return -1;
        if (in.type == CT_STR && ct_s(in)->markup) {
            *out = ct_ref(in);
            return 0;
        } else {
            ct_value s = ct_str_of(rs, in);
            if (s.type != CT_STR) return -1;
            *out = ct_str_new(rs, ct_s(s)->s, ct_s(s)->len);  // a fresh object: constants are shared
            ct_decref(s);
            if (out->type != CT_STR) return -1;
            ct_s(*out)->markup = true;
            return 0;
        }
    case F_STRING:
        if (no_args(rs, what, a) < 0) return -1;
        *out = ct_str_of(rs, in);
        return out->type == CT_STR ? 0 : -1;
    case F_SORT: {
        static const char *const p[] = {"reverse", "case_sensitive", "attribute"};
        if (bind(rs, what, a, p, 3, v, g) < 0) return -1;
        ct_value items, *keys;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        if (sort_keys_of(rs, ct_l(items), v[2], ct_truthy(v[1]), &keys) < 0) {
            ct_decref(items);
            return -1;
        }
        int r = sorted_list(rs, ct_l(items), keys, ct_truthy(v[0]), CT_LK_LIST, out);
        free_keys(keys, ct_l(items)->n);
        ct_decref(items);
        return r;
    }
    case F_SUM: {
        static const char *const p[] = {"attribute", "start"};
        if (bind(rs, what, a, p, 2, v, g) < 0) return -1;
        ct_value items;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        ct_value acc = g[1] ? v[1] : ct_int(0);
        int r = 0;
        ct_add_work(ct_l(items)->n);
        if (!is_num(acc)) r = ct_fail(rs, "sum: only numbers can be summed");
        bool isf = acc.type == CT_FLOAT;
        int64_t ia = isf ? 0 : ival(acc);
        double fa = fval(acc);
        for (size_t i = 0; r == 0 && i < ct_l(items)->n; i++) {
            ct_value x = ct_ref(ct_l(items)->v[i]);
            if (g[0] && v[0].type != CT_NONE) {
                ct_value y;
                r = attr_path(rs, x, v[0], &y);
                ct_decref(x);
                if (r < 0) break;
                x = y;
            }
            if (!is_num(x)) r = ct_fail(rs, "unsupported operand type(s) for +: 'int' and '%s'", ct_type_name(x));
            else if (x.type == CT_FLOAT || isf) {
                if (!isf) fa = (double)ia;
                isf = true;
                fa += fval(x);
            } else if (__builtin_add_overflow(ia, ival(x), &ia)) {
                r = ct_fail(rs, "integer overflow (64-bit)");
            }
            ct_decref(x);
        }
        ct_decref(items);
        if (r == 0) *out = isf ? ct_float(fa) : ct_int(ia);
        return r;
    }
    case F_TOJSON: return tojson(rs, in, a, out);
    case F_TRIM: {
        static const char *const p[] = {"chars"};
        if (bind(rs, what, a, p, 1, v, g) < 0) return -1;
        if (v[0].type != CT_NONE && v[0].type != CT_STR) return ct_fail(rs, "strip arg must be None or str");
        ct_value s = ct_str_of(rs, in);
        if (s.type != CT_STR) return -1;
        int r = strip(rs, ct_s(s), v[0].type == CT_STR ? ct_s(v[0]) : NULL, true, true, out);
        ct_decref(s);
        return r;
    }
    case F_UNIQUE: {
        static const char *const p[] = {"case_sensitive", "attribute"};
        if (bind(rs, what, a, p, 2, v, g) < 0) return -1;
        ct_value items, *keys;
        if (ct_iterate(rs, in, &items) < 0) return -1;
        const ct_list *l = ct_l(items);
        if (sort_keys_of(rs, l, v[1], ct_truthy(v[0]), &keys) < 0) {
            ct_decref(items);
            return -1;
        }
        ct_value res = ct_list_new_kind(rs, 0, CT_LK_GEN), seen = ct_dict_new(rs, 0, CT_DICT);
        int r = res.type == CT_LIST && seen.type == CT_DICT ? 0 : -1;
        for (size_t i = 0; r == 0 && i < l->n; i++) {
            if (!ct_hashable(keys[i])) {
                r = ct_fail(rs, "unhashable type: '%s'", ct_type_name(keys[i]));
                break;
            }
            if (ct_dict_get(ct_d(seen), keys[i])) continue;
            if (!ct_dict_set(rs, seen, ct_ref(keys[i]), ct_none()) || !ct_list_push(rs, res, ct_ref(l->v[i]))) r = -1;
        }
        ct_decref(seen);
        free_keys(keys, l->n);
        ct_decref(items);
        if (r < 0) {
            ct_decref(res);
            return -1;
        }
        *out = res;
        return 0;
    }
    case F_WORDCOUNT: {
        if (no_args(rs, what, a) < 0) return -1;
        ct_value s = ct_str_of(rs, in);
        if (s.type != CT_STR) return -1;
        int64_t n = 0;
        bool inword = false;
        size_t adv;
        for (size_t i = 0; i < ct_s(s)->len; i += adv) {
            uint32_t c = ct_u8_decode((const unsigned char *)ct_s(s)->s + i, ct_s(s)->len - i, &adv);
            bool w = c == '_' || cp_isalpha(c) || cp_isdigit(c);
            if (w && !inword) n++;
            inword = w;
        }
        ct_decref(s);
        *out = ct_int(n);
        return 0;
    }
    }
    return ct_fail(rs, "unknown or unsupported filter '%s'", name);
}

// ---- tests ----
static int arg1(ct_rs *rs, const char *name, ct_args *a, ct_value *v) {
    if (a->npos + a->nkw != 1) return ct_fail(rs, "test '%s' takes exactly one argument", name);
    *v = a->npos ? a->pos[0] : a->kwv[0];
    return 0;
}

static int py_mod_eq(ct_rs *rs, ct_value x, ct_value m, int64_t want, bool *res) {
    if (x.type == CT_UNDEF) return ct_undef_error(rs, x);
    if (!is_num(x) || !is_num(m)) return ct_fail(rs, "unsupported operand type(s) for %%: '%s' and '%s'", ct_type_name(x), ct_type_name(m));
    if (is_intlike(x) && is_intlike(m)) {
        int64_t a = ival(x), b = ival(m);
        if (b == 0) return ct_fail(rs, "integer division or modulo by zero");
        if (b == -1) {
            *res = want == 0;
            return 0;
        }
        int64_t r = a % b;
        if (r != 0 && ((r < 0) != (b < 0))) r += b;
        *res = r == want;
        return 0;
    }
    double a = fval(x), b = fval(m);
    if (b == 0) return ct_fail(rs, "float modulo");
    double r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    *res = r == (double)want;
    return 0;
}

int ct_apply_test(ct_rs *rs, int id, const char *name, ct_value in, ct_args *a, bool *out) {
    *out = false;
    ct_value x;
    if (id >= 0 && id <= T_ESCAPED && id != T_SAMEAS && (a->npos || a->nkw))
        return ct_fail(rs, "test '%s' takes no arguments", name);
    switch (id) {
    case T_DEFINED: *out = in.type != CT_UNDEF; return 0;
    case T_UNDEFINED: *out = in.type == CT_UNDEF; return 0;
    case T_NONE: *out = in.type == CT_NONE; return 0;
    case T_BOOLEAN: *out = in.type == CT_BOOL; return 0;
    case T_FALSE: *out = in.type == CT_BOOL && !in.u.b; return 0;
    case T_TRUE: *out = in.type == CT_BOOL && in.u.b; return 0;
    case T_INTEGER: *out = in.type == CT_INT; return 0;
    case T_FLOAT: *out = in.type == CT_FLOAT; return 0;
    case T_NUMBER: *out = is_num(in); return 0;
    case T_STRING: *out = in.type == CT_STR; return 0;
    case T_MAPPING: *out = in.type == CT_DICT; return 0;
    case T_ITERABLE: *out = in.type == CT_STR || in.type == CT_LIST || in.type == CT_DICT || in.type == CT_UNDEF || in.type == CT_LOOP; return 0;
    case T_SEQUENCE:
        *out = in.type == CT_STR || (in.type == CT_LIST && ct_l(in)->kind <= CT_LK_TUPLE) || in.type == CT_DICT || in.type == CT_UNDEF;
        return 0;
    case T_CALLABLE: *out = in.type == CT_MACRO || in.type == CT_METHOD || in.type == CT_FUNC || in.type == CT_UNDEF; return 0;
    case T_ESCAPED: *out = false; return 0;
    case T_SAMEAS:
        if (arg1(rs, name, a, &x) < 0) return -1;
        if (in.type != x.type) *out = false;
        else if (in.type == CT_NONE || in.type == CT_UNDEF) *out = in.type == CT_NONE;
        else if (in.type == CT_BOOL) *out = in.u.b == x.u.b;
        else if (in.type == CT_INT) *out = in.u.i == x.u.i && in.u.i >= -5 && in.u.i <= 256;  // CPython's small ints
        else if (in.type == CT_FUNC) *out = in.u.i == x.u.i;
        else if (in.type == CT_FLOAT) *out = false;
        else *out = in.u.o == x.u.o;
        return 0;
    case T_ODD:
    case T_EVEN:
        if (a->npos || a->nkw) return ct_fail(rs, "test '%s' takes no arguments", name);
        return py_mod_eq(rs, in, ct_int(2), id == T_ODD ? 1 : 0, out);
    case T_DIVISIBLEBY:
        if (arg1(rs, name, a, &x) < 0) return -1;
        return py_mod_eq(rs, in, x, 0, out);
    case T_EQ:
    case T_EQUALTO:
    case T_EQ_:
        if (arg1(rs, name, a, &x) < 0) return -1;
        *out = ct_eq(in, x);
        return 0;
    case T_NE:
    case T_NE_:
        if (arg1(rs, name, a, &x) < 0) return -1;
        *out = !ct_eq(in, x);
        return 0;
    case T_LT: case T_LESSTHAN: case T_LT_: case T_LE: case T_LE_:
    case T_GT: case T_GREATERTHAN: case T_GT_: case T_GE: case T_GE_: {
        if (arg1(rs, name, a, &x) < 0) return -1;
        if (in.type == CT_UNDEF) return ct_undef_error(rs, in);
        if (x.type == CT_UNDEF) return ct_undef_error(rs, x);
        if ((in.type == CT_FLOAT && isnan(in.u.f)) || (x.type == CT_FLOAT && isnan(x.u.f))) {
            *out = false;
            return 0;
        }
        int c;
        if (ct_cmp(rs, in, x, &c) < 0) return -1;
        if (id == T_LT || id == T_LESSTHAN || id == T_LT_) *out = c < 0;
        else if (id == T_LE || id == T_LE_) *out = c <= 0;
        else if (id == T_GT || id == T_GREATERTHAN || id == T_GT_) *out = c > 0;
        else *out = c >= 0;
        return 0;
    }
    case T_IN: {
        if (arg1(rs, name, a, &x) < 0) return -1;
        if (x.type == CT_STR) {
            if (in.type != CT_STR)
                return ct_fail(rs, "'in <string>' requires string as left operand, not %s", ct_type_name(in));
            ct_add_work((ct_s(x)->len >> 4) + 1);
            *out = ct_s(in)->len == 0 || memmem(ct_s(x)->s, ct_s(x)->len, ct_s(in)->s, ct_s(in)->len);
        } else if (x.type == CT_LIST) {
            for (size_t i = 0; i < ct_l(x)->n && !*out; i++) *out = ct_eq(ct_l(x)->v[i], in);
        } else if (x.type == CT_DICT) {
            if (!ct_hashable(in)) return ct_fail(rs, "unhashable type: '%s'", ct_type_name(in));
            *out = ct_dict_get(ct_d(x), in) != NULL;
        } else if (x.type != CT_UNDEF) {
            return ct_fail(rs, "argument of type '%s' is not iterable", ct_type_name(x));
        }
        return 0;
    }
    case T_LOWER:
    case T_UPPER: {
        ct_value s = ct_str_of(rs, in);
        if (s.type != CT_STR) return -1;
        bool any = false, ok = true;
        size_t adv;
        for (size_t i = 0; i < ct_s(s)->len; i += adv) {
            uint32_t c = ct_u8_decode((const unsigned char *)ct_s(s)->s + i, ct_s(s)->len - i, &adv);
            if (id == T_LOWER ? cp_isupper(c) : cp_islower(c)) ok = false;
            if (id == T_LOWER ? cp_islower(c) : cp_isupper(c)) any = true;
        }
        ct_decref(s);
        *out = ok && any;
        return 0;
    }
    case T_FILTER: *out = in.type == CT_STR && ct_filter_id(ct_s(in)->s) >= 0; return 0;
    case T_TEST: *out = in.type == CT_STR && ct_test_id(ct_s(in)->s) >= 0; return 0;
    }
    return ct_fail(rs, "unknown or unsupported test '%s'", name);
}
