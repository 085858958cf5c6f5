// Values of the chat-template interpreter with Python semantics: refcounted strings, lists,
// dicts (insertion-ordered, hashed), str()/repr()/json.dumps() text exactly as CPython
// writes it, == and < as Python compares.
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/chat_template_internal.h"

int ct_fail(ct_rs *rs, const char *fmt, ...) {
    if (rs && !rs->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rs->err, sizeof rs->err, fmt, ap);
        va_end(ap);
        rs->failed = true;
    }
    return -1;
}

_Thread_local uint64_t ct_work;
static _Thread_local size_t ct_live;

bool ct_budget(ct_rs *rs, size_t bytes) {
    if (!rs) return true;
    ct_work += bytes >> 10;
    if (bytes > CT_MAX_LIVE || ct_live > CT_MAX_LIVE - bytes) {
        ct_fail(rs, "template exceeded its memory budget (%zu MiB in use)", CT_MAX_LIVE >> 20);
        return false;
    }
    ct_live += bytes;
    return true;
}

void ct_release(size_t bytes) { ct_live = bytes < ct_live ? ct_live - bytes : 0; }

static bool oom(ct_rs *rs) {
    ct_fail(rs, "out of memory");
    return false;
}

// ---- refcounting ----
static void obj_free(ct_obj *o);

void ct_incref(ct_value v) {
    if (ct_isobj(v) && v.u.o->rc >= 0) v.u.o->rc++;
}

void ct_decref(ct_value v) {
    if (!ct_isobj(v) || v.u.o->rc < 0) return;
    if (--v.u.o->rc == 0) obj_free(v.u.o);
}

static void obj_free(ct_obj *o) {
    ct_release(o->acct);
    switch (o->type) {
    case CT_STR:
        break;
    case CT_LIST: {
        ct_list *l = (ct_list *)o;
        for (size_t i = 0; i < l->n; i++) ct_decref(l->v[i]);
        free(l->v);
        break;
    }
    case CT_DICT:
    case CT_NS: {
        ct_dict *d = (ct_dict *)o;
        for (size_t i = 0; i < d->n; i++) {
            ct_decref(d->k[i]);
            ct_decref(d->v[i]);
        }
        free(d->k);
        free(d->v);
        free(d->idx);
        break;
    }
    case CT_METHOD:
        ct_decref(((ct_method *)o)->self);
        break;
    case CT_LOOP: {
        ct_loop *lp = (ct_loop *)o;
        ct_value items = {.type = CT_LIST};
        items.u.o = &lp->items->h;
        ct_decref(items);
        ct_decref(lp->changed_last);
        break;
    }
    default:
        break;
    }
    free(o);
}

void ct_make_immortal(ct_value v) {
    if (!ct_isobj(v)) return;
    v.u.o->rc = -1;
    if (v.type == CT_LIST)
        for (size_t i = 0; i < ct_l(v)->n; i++) ct_make_immortal(ct_l(v)->v[i]);
    else if (v.type == CT_DICT)
        for (size_t i = 0; i < ct_d(v)->n; i++) {
            ct_make_immortal(ct_d(v)->k[i]);
            ct_make_immortal(ct_d(v)->v[i]);
        }
}

void ct_free_immortal(ct_value v) {
    if (!ct_isobj(v)) return;
    v.u.o->rc = 1;
    if (v.type == CT_LIST)
        for (size_t i = 0; i < ct_l(v)->n; i++) ct_free_immortal(ct_l(v)->v[i]);
    else if (v.type == CT_DICT)
        for (size_t i = 0; i < ct_d(v)->n; i++) {
            ct_free_immortal(ct_d(v)->k[i]);
            ct_free_immortal(ct_d(v)->v[i]);
        }
    ct_decref(v);  // children now have rc 1 and are released by the container's free
}

// ---- UTF-8 ----
uint32_t ct_u8_decode(const unsigned char *s, size_t n, size_t *adv) {
    unsigned c = s[0];
    if (c < 0x80) {
        *adv = 1;
        return c;
    }
    int need;
    uint32_t cp, min;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1, cp = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 2, cp = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3, cp = c & 0x07, min = 0x10000;
    } else {
        *adv = 1;
        return 0xdc00 + c;
    }
    if ((size_t)need >= n) {
        *adv = 1;
        return 0xdc00 + c;
    }
    for (int i = 1; i <= need; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *adv = 1;
            return 0xdc00 + c;
        }
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        *adv = 1;
        return 0xdc00 + c;
    }
    *adv = (size_t)need + 1;
    return cp;
}

int ct_u8_encode(uint32_t cp, char out[4]) {
    if (cp >= 0xdc80 && cp <= 0xdcff) {  // an undecodable byte travels through unchanged
        out[0] = (char)(cp - 0xdc00);
        return 1;
    }
    if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd;  // lone surrogates cannot be UTF-8
    if (cp > 0x10ffff) cp = 0xfffd;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

bool ct_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

// ---- strings ----
static ct_str *str_alloc(ct_rs *rs, size_t len) {
    if (len > CT_MAX_STR) {
        ct_fail(rs, "string of %zu bytes exceeds the %u MiB limit", len, CT_MAX_STR >> 20);
        return NULL;
    }
    if (!ct_budget(rs, len + sizeof(ct_str))) return NULL;
    ct_str *o = malloc(sizeof(ct_str) + len + 1);
    if (!o) {
        oom(rs);
        return NULL;
    }
    o->h.rc = 1;
    o->h.type = CT_STR;
    o->h.acct = rs ? (uint32_t)(len + sizeof(ct_str)) : 0;
    o->len = (uint32_t)len;
    o->cap = (uint32_t)len;
    o->s[len] = 0;
    return o;
}

// ascii: 1 / 0 when the caller knows (joining ASCII strings), -1 to scan
static ct_value str_done_k(ct_str *o, int ascii) {
    o->markup = false;
    o->ascii = ascii != 0;
    if (ascii < 0)
        for (size_t i = 0; i < o->len; i++)
            if ((unsigned char)o->s[i] >= 0x80) {
                o->ascii = false;
                break;
            }
    ct_value v = {.type = CT_STR};
    v.u.o = &o->h;
    return v;
}

static ct_value str_done(ct_str *o) { return str_done_k(o, -1); }

ct_value ct_str_new(ct_rs *rs, const char *s, size_t len) {
    ct_str *o = str_alloc(rs, len);
    if (!o) return ct_none();
    if (len) memcpy(o->s, s, len);
    return str_done(o);
}

ct_value ct_str_cat(ct_rs *rs, const char *a, size_t an, const char *b, size_t bn) {
    if (an > CT_MAX_STR || bn > CT_MAX_STR - an) {
        ct_fail(rs, "string exceeds the %u MiB limit", CT_MAX_STR >> 20);
        return ct_none();
    }
    ct_str *o = str_alloc(rs, an + bn);
    if (!o) return ct_none();
    if (an) memcpy(o->s, a, an);
    if (bn) memcpy(o->s + an, b, bn);
    return str_done(o);
}

ct_value ct_str_join(ct_rs *rs, const ct_value *parts, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += ct_s(parts[i])->len;
        if (total > CT_MAX_STR) {
            ct_fail(rs, "string exceeds the %u MiB limit", CT_MAX_STR >> 20);
            return ct_none();
        }
    }
    ct_str *o = str_alloc(rs, total);
    if (!o) return ct_none();
    size_t off = 0;
    bool ascii = true;
    for (int i = 0; i < n; i++) {
        if (ct_s(parts[i])->len) memcpy(o->s + off, ct_s(parts[i])->s, ct_s(parts[i])->len);
        off += ct_s(parts[i])->len;
        ascii = ascii && ct_s(parts[i])->ascii;
    }
    return str_done_k(o, ascii);
}

bool ct_str_append(ct_rs *rs, ct_value *sv, const ct_value *parts, int n) {
    ct_str *o = ct_s(*sv);
    size_t len = o->len, add = 0;
    bool ascii = o->ascii;
    for (int i = 0; i < n; i++) {
        add += ct_s(parts[i])->len;
        ascii = ascii && ct_s(parts[i])->ascii;
    }
    if (add > CT_MAX_STR || len > CT_MAX_STR - add) {
        ct_fail(rs, "string exceeds the %u MiB limit", CT_MAX_STR >> 20);
        return false;
    }
    size_t need = len + add;
    if (need > o->cap) {  // geometric growth: repeated appends copy O(total), not O(n^2)
        size_t cap = (size_t)o->cap * 2;
        if (cap < need) cap = need;
        if (cap > CT_MAX_STR) cap = CT_MAX_STR;
        size_t grow = cap - o->cap;
        if (!ct_budget(rs, grow)) return false;
        ct_str *no = realloc(o, sizeof(ct_str) + cap + 1);
        if (!no) {
            ct_release(grow);
            return oom(rs);
        }
        o = no;
        o->h.acct += (uint32_t)grow;
        o->cap = (uint32_t)cap;
        sv->u.o = &o->h;
    }
    ct_work += add >> 10;
    for (int i = 0; i < n; i++) {
        const ct_str *p = ct_s(parts[i]);
        if (p->len) memcpy(o->s + len, p->s, p->len);
        len += p->len;
    }
    o->len = (uint32_t)len;
    o->s[len] = 0;
    o->ascii = ascii;
    o->markup = false;
    return true;
}

size_t ct_str_cplen(const ct_str *s) {
    if (s->ascii) return s->len;
    ct_work += s->len >> 4;
    size_t n = 0, adv;
    for (size_t i = 0; i < s->len; i += adv, n++)
        ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
    return n;
}

// ---- buffers ----
bool ct_buf_put(ct_rs *rs, ct_buf *b, const char *s, size_t n) {
    if (n == 0) return true;
    if (n > CT_MAX_STR || b->n > CT_MAX_STR - n) {
        ct_fail(rs, "text exceeds the %u MiB limit", CT_MAX_STR >> 20);
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        if (!ct_budget(rs, cap - b->cap)) return false;
        char *p = realloc(b->p, cap);
        if (!p) {
            ct_release(cap - b->cap);
            return oom(rs);
        }
        if (rs) b->acct += cap - b->cap;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

void ct_buf_free(ct_buf *b) {
    free(b->p);
    ct_release(b->acct);
    b->p = NULL;
    b->n = b->cap = b->acct = 0;
}

ct_value ct_buf_take(ct_rs *rs, ct_buf *b) {
    ct_value v = ct_str_new(rs, b->p ? b->p : "", b->n);
    ct_buf_free(b);
    return v;
}

// ---- lists / dicts ----
static uint16_t val_depth(ct_value v) {
    if (v.type == CT_LIST) return ct_l(v)->depth;
    if (v.type == CT_DICT) return ct_d(v)->depth;
    if (v.type == CT_METHOD) return ((const ct_method *)v.u.o)->depth;
    if (v.type == CT_LOOP) return ((const ct_loop *)v.u.o)->depth_cap;
    return 0;
}

uint16_t ct_val_depth(ct_value v) { return val_depth(v); }

ct_value ct_list_new(ct_rs *rs, size_t cap, bool tuple) {
    return ct_list_new_kind(rs, cap, tuple ? CT_LK_TUPLE : CT_LK_LIST);
}

ct_value ct_list_new_kind(ct_rs *rs, size_t cap, int kind) {
    bool tuple = kind == CT_LK_TUPLE;
    if (cap > CT_MAX_LIST) cap = CT_MAX_LIST;
    size_t bytes = sizeof(ct_list) + cap * sizeof(ct_value);
    if (!ct_budget(rs, bytes)) return ct_none();
    ct_list *l = calloc(1, sizeof *l);
    if (!l) {
        ct_release(rs ? bytes : 0);
        oom(rs);
        return ct_none();
    }
    l->h.rc = 1;
    l->h.type = CT_LIST;
    l->h.acct = rs ? (uint32_t)bytes : 0;
    l->tuple = tuple;
    l->kind = (uint8_t)kind;
    l->depth = 1;
    if (cap) {
        l->v = malloc(cap * sizeof(ct_value));
        if (!l->v) {
            ct_release(l->h.acct);
            free(l);
            oom(rs);
            return ct_none();
        }
        l->cap = cap;
    }
    ct_value v = {.type = CT_LIST};
    v.u.o = &l->h;
    return v;
}

bool ct_list_push(ct_rs *rs, ct_value lv, ct_value v) {
    ct_list *l = ct_l(lv);
    if (l->n >= CT_MAX_LIST) {
        ct_decref(v);
        ct_fail(rs, "list exceeds %d elements", CT_MAX_LIST);
        return false;
    }
    uint16_t d = val_depth(v);
    if (d + 1 > CT_MAX_VALUE_DEPTH) {
        ct_decref(v);
        ct_fail(rs, "values nested deeper than %d levels", CT_MAX_VALUE_DEPTH);
        return false;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        size_t grow = (cap - l->cap) * sizeof(ct_value);
        if (!ct_budget(rs, grow)) {
            ct_decref(v);
            return false;
        }
        ct_value *p = realloc(l->v, cap * sizeof(ct_value));
        if (!p) {
            ct_release(rs ? grow : 0);
            ct_decref(v);
            return oom(rs);
        }
        if (rs) l->h.acct += (uint32_t)grow;
        l->v = p;
        l->cap = cap;
    }
    if (d + 1 > l->depth) l->depth = (uint16_t)(d + 1);
    l->v[l->n++] = v;
    return true;
}

ct_value ct_dict_new(ct_rs *rs, size_t cap, uint8_t type) {
    if (cap > CT_MAX_LIST) cap = CT_MAX_LIST;
    size_t bytes = sizeof(ct_dict) + cap * 2 * sizeof(ct_value);
    if (!ct_budget(rs, bytes)) return ct_none();
    ct_dict *d = calloc(1, sizeof *d);
    if (!d) {
        ct_release(rs ? bytes : 0);
        oom(rs);
        return ct_none();
    }
    d->h.rc = 1;
    d->h.type = type;
    d->h.acct = rs ? (uint32_t)bytes : 0;
    d->depth = 1;
    if (cap) {
        d->k = malloc(cap * sizeof(ct_value));
        d->v = malloc(cap * sizeof(ct_value));
        if (!d->k || !d->v) {
            ct_release(d->h.acct);
            free(d->k);
            free(d->v);
            free(d);
            oom(rs);
            return ct_none();
        }
        d->cap = cap;
    }
    ct_value v = {.type = type};
    v.u.o = &d->h;
    return v;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

// Equal values hash equally (1 == 1.0 == True, as in Python).
static uint64_t val_hash(ct_value v) {
    switch (v.type) {
    case CT_NONE: return 0x9e3779b97f4a7c15ull;
    case CT_BOOL: return mix64((uint64_t)v.u.b);
    case CT_INT: return mix64((uint64_t)v.u.i);
    case CT_FLOAT:
        if (v.u.f == floor(v.u.f) && fabs(v.u.f) < 9.2e18) return mix64((uint64_t)(int64_t)v.u.f);
        {
            uint64_t bits;
            double f = v.u.f;
            memcpy(&bits, &f, sizeof bits);
            return mix64(bits);
        }
    case CT_STR: return hash_bytes(ct_s(v)->s, ct_s(v)->len);
    case CT_LIST: {
        uint64_t h = 0x345678;
        for (size_t i = 0; i < ct_l(v)->n; i++) h = mix64(h * 1000003u ^ val_hash(ct_l(v)->v[i]));
        return h;
    }
    default: return mix64((uint64_t)(uintptr_t)v.u.o);
    }
}

bool ct_hashable(ct_value v) {
    switch (v.type) {
    case CT_NONE: case CT_BOOL: case CT_INT: case CT_FLOAT: case CT_STR: case CT_FUNC:
    case CT_MACRO: case CT_NS: case CT_LOOP: case CT_METHOD:
        return true;
    case CT_LIST:
        if (!ct_l(v)->tuple) return false;
        for (size_t i = 0; i < ct_l(v)->n; i++)
            if (!ct_hashable(ct_l(v)->v[i])) return false;
        return true;
    default:
        return false;
    }
}

static bool dict_reindex(ct_rs *rs, ct_dict *d, size_t want) {
    size_t cap = 16;
    while (cap < want * 2) cap *= 2;
    if (!ct_budget(rs, cap * sizeof(int32_t))) return false;
    int32_t *idx = malloc(cap * sizeof(int32_t));
    if (!idx) {
        ct_release(rs ? cap * sizeof(int32_t) : 0);
        return false;
    }
    if (d->idx && d->h.acct) {  // the old index leaves
        ct_release(d->idxcap * sizeof(int32_t));
        d->h.acct -= (uint32_t)(d->idxcap * sizeof(int32_t));
    }
    if (rs) d->h.acct += (uint32_t)(cap * sizeof(int32_t));
    for (size_t i = 0; i < cap; i++) idx[i] = -1;
    for (size_t i = 0; i < d->n; i++) {
        size_t j = val_hash(d->k[i]) & (cap - 1);
        while (idx[j] >= 0) j = (j + 1) & (cap - 1);
        idx[j] = (int32_t)i;
    }
    free(d->idx);
    d->idx = idx;
    d->idxcap = cap;
    return true;
}

ct_value *ct_dict_get(const ct_dict *d, ct_value k) {
    if (d->idx) {
        size_t j = val_hash(k) & (d->idxcap - 1);
        while (d->idx[j] >= 0) {
            if (ct_eq(d->k[d->idx[j]], k)) return &d->v[d->idx[j]];
            j = (j + 1) & (d->idxcap - 1);
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (ct_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

ct_value *ct_dict_get_str(const ct_dict *d, const char *k, size_t klen) {
    if (d->idx) {
        size_t j = hash_bytes(k, klen) & (d->idxcap - 1);
        while (d->idx[j] >= 0) {
            ct_value kk = d->k[d->idx[j]];
            if (kk.type == CT_STR && ct_s(kk)->len == klen && !memcmp(ct_s(kk)->s, k, klen))
                return &d->v[d->idx[j]];
            j = (j + 1) & (d->idxcap - 1);
        }
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++) {
        ct_value kk = d->k[i];
        if (kk.type == CT_STR && ct_s(kk)->len == klen && !memcmp(ct_s(kk)->s, k, klen))
            return &d->v[i];
    }
    return NULL;
}

bool ct_dict_set(ct_rs *rs, ct_value dv, ct_value k, ct_value v) {
    ct_dict *d = ct_d(dv);
    if (!ct_hashable(k)) {
        ct_fail(rs, "unhashable type: '%s'", ct_type_name(k));
        ct_decref(k);
        ct_decref(v);
        return false;
    }
    uint16_t dep = val_depth(v) > val_depth(k) ? val_depth(v) : val_depth(k);
    if (dep + 1 > CT_MAX_VALUE_DEPTH) {
        ct_decref(k);
        ct_decref(v);
        ct_fail(rs, "values nested deeper than %d levels", CT_MAX_VALUE_DEPTH);
        return false;
    }
    ct_value *slot = ct_dict_get(d, k);
    if (slot) {
        ct_decref(*slot);
        *slot = v;
        ct_decref(k);
        if (d->h.type == CT_DICT && dep + 1 > d->depth) d->depth = (uint16_t)(dep + 1);
        return true;
    }
    if (d->n >= CT_MAX_LIST) {
        ct_decref(k);
        ct_decref(v);
        ct_fail(rs, "dict exceeds %d entries", CT_MAX_LIST);
        return false;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4, grow = (cap - d->cap) * 2 * sizeof(ct_value);
        if (!ct_budget(rs, grow)) {
            ct_decref(k);
            ct_decref(v);
            return false;
        }
        if (rs) d->h.acct += (uint32_t)grow;  // released with the object even if a realloc fails
        ct_value *nk = realloc(d->k, cap * sizeof(ct_value));
        if (nk) d->k = nk;
        ct_value *nv = nk ? realloc(d->v, cap * sizeof(ct_value)) : NULL;
        if (nv) d->v = nv;
        if (!nk || !nv) {
            ct_decref(k);
            ct_decref(v);
            return oom(rs);
        }
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->h.type == CT_DICT && dep + 1 > d->depth) d->depth = (uint16_t)(dep + 1);
    if (d->n > 8 && (!d->idx || d->n * 2 > d->idxcap)) {
        if (!dict_reindex(rs, d, d->n)) return rs && rs->failed ? false : oom(rs);
    } else if (d->idx) {
        size_t j = val_hash(k) & (d->idxcap - 1);
        while (d->idx[j] >= 0) j = (j + 1) & (d->idxcap - 1);
        d->idx[j] = (int32_t)(d->n - 1);
    }
    return true;
}

// ---- Python semantics ----
bool ct_truthy(ct_value v) {
    switch (v.type) {
    case CT_UNDEF: case CT_NONE: return false;
    case CT_BOOL: return v.u.b;
    case CT_INT: return v.u.i != 0;
    case CT_FLOAT: return v.u.f != 0.0;
    case CT_STR: return ct_s(v)->len != 0;
    case CT_LIST: return ct_l(v)->kind == CT_LK_GEN || ct_l(v)->n != 0;
    case CT_DICT: return ct_d(v)->n != 0;
    default: return true;
    }
}

static bool is_num(ct_value v) { return v.type == CT_BOOL || v.type == CT_INT || v.type == CT_FLOAT; }
static int64_t as_i(ct_value v) { return v.type == CT_BOOL ? (int64_t)v.u.b : v.u.i; }

bool ct_eq(ct_value a, ct_value b) {
    ct_work++;
    if (is_num(a) && is_num(b)) {
        if (a.type != CT_FLOAT && b.type != CT_FLOAT) return as_i(a) == as_i(b);
        if (a.type == CT_FLOAT && b.type == CT_FLOAT) return a.u.f == b.u.f;
        double f = a.type == CT_FLOAT ? a.u.f : b.u.f;
        int64_t i = a.type == CT_FLOAT ? as_i(b) : as_i(a);
        if (f != floor(f) || f < -9.2233720368547758e18 || f >= 9.2233720368547758e18) return false;
        return (int64_t)f == i;
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case CT_UNDEF: case CT_NONE: return true;
    case CT_FUNC: return a.u.i == b.u.i;
    case CT_STR:
        ct_work += ct_s(a)->len >> 6;
        return ct_s(a)->len == ct_s(b)->len && !memcmp(ct_s(a)->s, ct_s(b)->s, ct_s(a)->len);
    case CT_LIST: {
        ct_list *x = ct_l(a), *y = ct_l(b);
        if (x->kind > CT_LK_TUPLE || y->kind > CT_LK_TUPLE) return x == y;
        if (x->tuple != y->tuple || x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++)
            if (!ct_eq(x->v[i], y->v[i])) return false;
        return true;
    }
    case CT_DICT: {
        ct_dict *x = ct_d(a), *y = ct_d(b);
        if (x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++) {
            ct_value *o = ct_dict_get(y, x->k[i]);
            if (!o || !ct_eq(x->v[i], *o)) return false;
        }
        return true;
    }
    default: return a.u.o == b.u.o;
    }
}

const char *ct_type_name(ct_value v) {
    switch (v.type) {
    case CT_UNDEF: return "Undefined";
    case CT_NONE: return "NoneType";
    case CT_BOOL: return "bool";
    case CT_INT: return "int";
    case CT_FLOAT: return "float";
    case CT_FUNC: return "function";
    case CT_STR: return "str";
    case CT_LIST:
        switch (ct_l(v)->kind) {
        case CT_LK_TUPLE: return "tuple";
        case CT_LK_GEN: return "generator";
        case CT_LK_KEYS: return "dict_keys";
        case CT_LK_VALUES: return "dict_values";
        case CT_LK_ITEMS: return "dict_items";
        default: return "list";
        }
    case CT_DICT: return "dict";
    case CT_NS: return "Namespace";
    case CT_MACRO: return "Macro";
    case CT_METHOD: return "builtin_function_or_method";
    case CT_LOOP: return "LoopContext";
    }
    return "object";
}

int ct_cmp(ct_rs *rs, ct_value a, ct_value b, int *res) {
    if (is_num(a) && is_num(b)) {
        if (a.type != CT_FLOAT && b.type != CT_FLOAT) {
            int64_t x = as_i(a), y = as_i(b);
            *res = x < y ? -1 : x > y;
        } else {
            double x = a.type == CT_FLOAT ? a.u.f : (double)as_i(a);
            double y = b.type == CT_FLOAT ? b.u.f : (double)as_i(b);
            *res = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a.type == CT_STR && b.type == CT_STR) {
        // UTF-8 byte order is code point order
        size_t n = ct_s(a)->len < ct_s(b)->len ? ct_s(a)->len : ct_s(b)->len;
        int c = memcmp(ct_s(a)->s, ct_s(b)->s, n);
        if (c == 0) c = ct_s(a)->len < ct_s(b)->len ? -1 : ct_s(a)->len > ct_s(b)->len;
        *res = c < 0 ? -1 : c > 0;
        return 0;
    }
    if (a.type == CT_LIST && b.type == CT_LIST && ct_l(a)->kind == ct_l(b)->kind &&
        ct_l(a)->kind <= CT_LK_TUPLE) {
        ct_list *x = ct_l(a), *y = ct_l(b);
        size_t n = x->n < y->n ? x->n : y->n;
        for (size_t i = 0; i < n; i++) {
            if (ct_eq(x->v[i], y->v[i])) continue;
            return ct_cmp(rs, x->v[i], y->v[i], res);
        }
        *res = x->n < y->n ? -1 : x->n > y->n;
        return 0;
    }
    if (a.type == CT_UNDEF || b.type == CT_UNDEF)
        return ct_fail(rs, "cannot compare an undefined value");
    return ct_fail(rs, "'<' not supported between instances of '%s' and '%s'", ct_type_name(a),
                   ct_type_name(b));
}

// ---- float repr (CPython's repr: shortest round-trip digits, 'r' formatting rules) ----
void ct_float_repr(double x, char out[40]) {
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0) {
        strcpy(out, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    // tmp: [-]d[.ddd]e[+-]XX
    char digits[24];
    int nd = 0, exp10 = 0;
    bool neg = false;
    const char *p = tmp;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 20) digits[nd++] = *p;
    if (*p == 'e') exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt <= -4 || decpt > 16) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (decpt <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
        *o = 0;
    } else if (decpt >= nd) {
        memcpy(o, digits, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        strcpy(o, ".0");
    } else {
        memcpy(o, digits, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, digits + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
        *o = 0;
    }
}

// Approximation of Python's str.isprintable() for non-ASCII code points: the general
// categories Cc, Cf, Cs, Co, Zl, Zp and Zs (other than space) plus common unassigned ranges.
static bool py_printable(uint32_t c) {
    if (c < 0x20 || c == 0x7f) return false;
    if (c < 0x7f) return true;
    if (c <= 0xa0 || c == 0xad) return false;
    if (c >= 0x600 && c <= 0x605) return false;
    if (c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e || c == 0x1680) return false;
    if (c >= 0x2000 && c <= 0x200f) return false;
    if (c >= 0x2028 && c <= 0x202f) return false;
    if (c >= 0x205f && c <= 0x206f && c != 0x2065) return false;
    if (c == 0x2065 || c == 0x3000) return false;
    if (c >= 0xd800 && c <= 0xf8ff) return false;
    if (c >= 0xfdd0 && c <= 0xfdef) return false;
    if (c == 0xfeff || (c >= 0xfff0 && c <= 0xfffb) || c == 0xfffe || c == 0xffff) return false;
    if (c == 0x110bd || c == 0x110cd || (c >= 0x1bca0 && c <= 0x1bca3)) return false;
    if (c >= 0x1d173 && c <= 0x1d17a) return false;
    if (c >= 0xe0000 && c <= 0xe0fff) return c >= 0xe0100 && c <= 0xe01ef;
    if (c >= 0xf0000) return false;
    if ((c & 0xfffe) == 0xfffe) return false;
    return true;
}

static bool repr_str(ct_rs *rs, ct_buf *b, const ct_str *s) {
    bool sq = false, dq = false;
    for (size_t i = 0; i < s->len; i++) {
        if (s->s[i] == '\'') sq = true;
        if (s->s[i] == '"') dq = true;
    }
    char q = (sq && !dq) ? '"' : '\'';
    if (!ct_buf_put(rs, b, &q, 1)) return false;
    size_t adv;
    for (size_t i = 0; i < s->len; i += adv) {
        uint32_t c = ct_u8_decode((const unsigned char *)s->s + i, s->len - i, &adv);
        char tmp[16];
        const char *w = tmp;
        size_t wn;
        if (c == (uint32_t)q || c == '\\') {
            tmp[0] = '\\', tmp[1] = (char)c, wn = 2;
        } else if (c == '\t') {
            w = "\\t", wn = 2;
        } else if (c == '\n') {
            w = "\\n", wn = 2;
        } else if (c == '\r') {
            w = "\\r", wn = 2;
        } else if (c < 0x80 && py_printable(c)) {
            tmp[0] = (char)c, wn = 1;
        } else if (py_printable(c)) {
            w = s->s + i, wn = adv;
        } else if (c <= 0xff) {
            wn = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        } else if (c <= 0xffff) {
            wn = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", c);
        } else {
            wn = (size_t)snprintf(tmp, sizeof tmp, "\\U%08x", c);
        }
        if (!ct_buf_put(rs, b, w, wn)) return false;
    }
    return ct_buf_put(rs, b, &q, 1);
}

static const char *method_name(int id);

// namespaces being printed, innermost first: a namespace that contains itself prints as
// `<Namespace {...}>` there, as CPython's recursion guard in dict.__repr__ does
typedef struct visiting {
    const ct_obj *o;
    const struct visiting *up;
} visiting;

static bool to_text_v(ct_rs *rs, ct_buf *b, ct_value v, bool repr, int depth, const visiting *vis);

static bool to_text(ct_rs *rs, ct_buf *b, ct_value v, bool repr, int depth) {
    return to_text_v(rs, b, v, repr, depth, NULL);
}

static bool to_text_v(ct_rs *rs, ct_buf *b, ct_value v, bool repr, int depth, const visiting *vis) {
    if (depth > CT_MAX_VALUE_DEPTH) {
        ct_fail(rs, "values nested deeper than %d levels", CT_MAX_VALUE_DEPTH);
        return false;
    }
    char tmp[64];
    switch (v.type) {
    case CT_UNDEF: return repr ? ct_buf_puts(rs, b, "Undefined") : true;
    case CT_NONE: return ct_buf_puts(rs, b, "None");
    case CT_BOOL: return ct_buf_puts(rs, b, v.u.b ? "True" : "False");
    case CT_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        return ct_buf_puts(rs, b, tmp);
    case CT_FLOAT:
        ct_float_repr(v.u.f, tmp);
        return ct_buf_puts(rs, b, tmp);
    case CT_FUNC: return ct_buf_puts(rs, b, "<function>");
    case CT_STR:
        if (repr) return repr_str(rs, b, ct_s(v));
        return ct_buf_put(rs, b, ct_s(v)->s, ct_s(v)->len);
    case CT_LIST: {
        ct_list *l = ct_l(v);
        if (l->kind == CT_LK_GEN) return ct_buf_puts(rs, b, "<generator object>");
        if (l->kind >= CT_LK_KEYS) {
            static const char *const vn[] = {"dict_keys([", "dict_values([", "dict_items(["};
            if (!ct_buf_puts(rs, b, vn[l->kind - CT_LK_KEYS])) return false;
            for (size_t i = 0; i < l->n; i++) {
                if (i && !ct_buf_puts(rs, b, ", ")) return false;
                if (!to_text_v(rs, b, l->v[i], true, depth + 1, vis)) return false;
            }
            return ct_buf_puts(rs, b, "])");
        }
        if (!ct_buf_puts(rs, b, l->tuple ? "(" : "[")) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (i && !ct_buf_puts(rs, b, ", ")) return false;
            if (!to_text_v(rs, b, l->v[i], true, depth + 1, vis)) return false;
        }
        if (l->tuple && l->n == 1 && !ct_buf_puts(rs, b, ",")) return false;
        return ct_buf_puts(rs, b, l->tuple ? ")" : "]");
    }
    case CT_DICT:
    case CT_NS: {
        ct_dict *d = ct_d(v);
        visiting me = {v.u.o, vis};
        if (v.type == CT_NS) {
            if (!ct_buf_puts(rs, b, "<Namespace ")) return false;
            for (const visiting *w = vis; w; w = w->up)
                if (w->o == v.u.o) return ct_buf_puts(rs, b, "{...}>");
        }
        if (!ct_buf_puts(rs, b, "{")) return false;
        for (size_t i = 0; i < d->n; i++) {
            if (i && !ct_buf_puts(rs, b, ", ")) return false;
            if (!to_text_v(rs, b, d->k[i], true, depth + 1, &me)) return false;
            if (!ct_buf_puts(rs, b, ": ")) return false;
            if (!to_text_v(rs, b, d->v[i], true, depth + 1, &me)) return false;
        }
        if (!ct_buf_puts(rs, b, "}")) return false;
        return v.type == CT_NS ? ct_buf_puts(rs, b, ">") : true;
    }
    case CT_MACRO: {
        const ct_macro *m = (const ct_macro *)v.u.o;
        const char *name = m->is_caller ? "caller" : (m->def->name ? m->def->name : "?");
        return ct_buf_puts(rs, b, "<Macro '") && ct_buf_puts(rs, b, name) &&
               ct_buf_puts(rs, b, "'>");
    }
    case CT_METHOD: {
        const ct_method *m = (const ct_method *)v.u.o;
        return ct_buf_puts(rs, b, "<built-in method ") &&
               ct_buf_puts(rs, b, method_name(m->id)) && ct_buf_puts(rs, b, ">");
    }
    case CT_LOOP: {
        const ct_loop *lp = (const ct_loop *)v.u.o;
        snprintf(tmp, sizeof tmp, "<LoopContext %" PRId64 "/%zu>", lp->idx + 1, lp->items->n);
        return ct_buf_puts(rs, b, tmp);
    }
    }
    return false;
}

static const char *method_name(int id) { return ct_method_name(id); }

bool ct_to_str(ct_rs *rs, ct_buf *b, ct_value v) { return to_text(rs, b, v, false, 0); }
bool ct_to_repr(ct_rs *rs, ct_buf *b, ct_value v) { return to_text(rs, b, v, true, 0); }

ct_value ct_str_of(ct_rs *rs, ct_value v) {
    if (v.type == CT_STR) return ct_ref(v);
    ct_buf b = {0};
    if (!ct_to_str(rs, &b, v)) {
        ct_buf_free(&b);
        return ct_none();
    }
    return ct_buf_take(rs, &b);
}

// ---- JSON, as Python's json.dumps writes it ----
static bool json_str(ct_rs *rs, ct_buf *b, const char *s, size_t n, bool ascii) {
    if (!ct_buf_put(rs, b, "\"", 1)) return false;
    size_t adv;
    for (size_t i = 0; i < n; i += adv) {
        uint32_t c = ct_u8_decode((const unsigned char *)s + i, n - i, &adv);
        char tmp[16];
        const char *w = tmp;
        size_t wn;
        switch (c) {
        case '"': w = "\\\"", wn = 2; break;
        case '\\': w = "\\\\", wn = 2; break;
        case '\n': w = "\\n", wn = 2; break;
        case '\r': w = "\\r", wn = 2; break;
        case '\t': w = "\\t", wn = 2; break;
        case '\b': w = "\\b", wn = 2; break;
        case '\f': w = "\\f", wn = 2; break;
        default:
            if (c < 0x20 || (ascii && c > 0x7e)) {
                if (c > 0xffff) {
                    uint32_t v = c - 0x10000;
                    wn = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (v >> 10),
                                          0xdc00 + (v & 0x3ff));
                } else {
                    wn = (size_t)snprintf(tmp, sizeof tmp, "\\u%04x", c);
                }
            } else {
                w = s + i, wn = adv;
            }
        }
        if (!ct_buf_put(rs, b, w, wn)) return false;
    }
    return ct_buf_put(rs, b, "\"", 1);
}

static bool json_float(ct_rs *rs, ct_buf *b, double f) {
    char tmp[40];
    if (isnan(f)) return ct_buf_puts(rs, b, "NaN");
    if (isinf(f)) return ct_buf_puts(rs, b, f < 0 ? "-Infinity" : "Infinity");
    ct_float_repr(f, tmp);
    return ct_buf_puts(rs, b, tmp);
}

static bool json_newline(ct_rs *rs, ct_buf *b, const ct_json_opts *o, int level) {
    if (!ct_buf_put(rs, b, "\n", 1)) return false;
    for (int i = 0; i < level; i++)
        if (!ct_buf_puts(rs, b, o->indent)) return false;
    return true;
}

static bool json_val(ct_rs *rs, ct_buf *b, ct_value v, const ct_json_opts *o, int level);

static bool json_key(ct_rs *rs, ct_buf *b, ct_value k, const ct_json_opts *o) {
    char tmp[40];
    switch (k.type) {
    case CT_STR: return json_str(rs, b, ct_s(k)->s, ct_s(k)->len, o->ensure_ascii);
    case CT_BOOL: return ct_buf_puts(rs, b, k.u.b ? "\"true\"" : "\"false\"");
    case CT_NONE: return ct_buf_puts(rs, b, "\"null\"");
    case CT_INT:
        snprintf(tmp, sizeof tmp, "\"%" PRId64 "\"", k.u.i);
        return ct_buf_puts(rs, b, tmp);
    case CT_FLOAT:
        return ct_buf_puts(rs, b, "\"") && json_float(rs, b, k.u.f) && ct_buf_puts(rs, b, "\"");
    default:
        ct_fail(rs, "keys must be str, int, float, bool or None, not %s", ct_type_name(k));
        return false;
    }
}

static bool json_val(ct_rs *rs, ct_buf *b, ct_value v, const ct_json_opts *o, int level) {
    char tmp[40];
    if (level > CT_MAX_VALUE_DEPTH) {
        ct_fail(rs, "values nested deeper than %d levels", CT_MAX_VALUE_DEPTH);
        return false;
    }
    switch (v.type) {
    case CT_NONE: return ct_buf_puts(rs, b, "null");
    case CT_BOOL: return ct_buf_puts(rs, b, v.u.b ? "true" : "false");
    case CT_INT:
        snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i);
        return ct_buf_puts(rs, b, tmp);
    case CT_FLOAT: return json_float(rs, b, v.u.f);
    case CT_STR: return json_str(rs, b, ct_s(v)->s, ct_s(v)->len, o->ensure_ascii);
    case CT_LIST: {
        ct_list *l = ct_l(v);
        if (l->kind > CT_LK_TUPLE) {
            ct_fail(rs, "Object of type %s is not JSON serializable", ct_type_name(v));
            return false;
        }
        if (l->n == 0) return ct_buf_puts(rs, b, "[]");
        if (!ct_buf_puts(rs, b, "[")) return false;
        if (o->indent && !json_newline(rs, b, o, level + 1)) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (i) {
                if (!ct_buf_puts(rs, b, o->item_sep)) return false;
                if (o->indent && !json_newline(rs, b, o, level + 1)) return false;
            }
            if (!json_val(rs, b, l->v[i], o, level + 1)) return false;
        }
        if (o->indent && !json_newline(rs, b, o, level)) return false;
        return ct_buf_puts(rs, b, "]");
    }
    case CT_DICT: {
        ct_dict *d = ct_d(v);
        if (d->n == 0) return ct_buf_puts(rs, b, "{}");
        size_t *order = malloc(d->n * sizeof(size_t));
        if (!order) return oom(rs);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) {  // insertion sort keeps it stable; key counts are small
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0) {
                    int c;
                    if (ct_cmp(rs, d->k[order[j - 1]], d->k[x], &c) < 0) {
                        free(order);
                        return false;
                    }
                    if (c <= 0) break;
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        bool ok = ct_buf_puts(rs, b, "{");
        if (ok && o->indent) ok = json_newline(rs, b, o, level + 1);
        for (size_t i = 0; ok && i < d->n; i++) {
            if (i) {
                ok = ct_buf_puts(rs, b, o->item_sep);
                if (ok && o->indent) ok = json_newline(rs, b, o, level + 1);
            }
            ok = ok && json_key(rs, b, d->k[order[i]], o) && ct_buf_puts(rs, b, o->key_sep) &&
                 json_val(rs, b, d->v[order[i]], o, level + 1);
        }
        free(order);
        if (ok && o->indent) ok = json_newline(rs, b, o, level);
        return ok && ct_buf_puts(rs, b, "}");
    }
    default:
        ct_fail(rs, "Object of type %s is not JSON serializable", ct_type_name(v));
        return false;
    }
}

bool ct_to_json(ct_rs *rs, ct_buf *b, ct_value v, const ct_json_opts *o) {
    return json_val(rs, b, v, o, 0);
}

// ---- cJSON -> values (json.loads semantics: integral numbers become ints) ----
ct_value ct_from_cjson(ct_rs *rs, const cJSON *j, int depth) {
    if (depth > 1000) {
        ct_fail(rs, "context JSON nested deeper than 1000 levels");
        return ct_none();
    }
    if (cJSON_IsNull(j)) return ct_none();
    if (cJSON_IsFalse(j)) return ct_bool(false);
    if (cJSON_IsTrue(j)) return ct_bool(true);
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        // cJSON keeps no int/float distinction; integral values within 2^53 are taken as ints
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) return ct_int((int64_t)d);
        return ct_float(d);
    }
    if (cJSON_IsString(j)) {
        const char *s = j->valuestring ? j->valuestring : "";
        return ct_str_new(rs, s, strlen(s));
    }
    if (cJSON_IsArray(j)) {
        ct_value l = ct_list_new(rs, 0, false);
        if (l.type != CT_LIST) return l;
        for (const cJSON *c = j->child; c; c = c->next) {
            ct_value e = ct_from_cjson(rs, c, depth + 1);
            if (rs->failed || !ct_list_push(rs, l, e)) {
                if (!rs->failed) ct_decref(e);
                ct_decref(l);
                return ct_none();
            }
        }
        return l;
    }
    if (cJSON_IsObject(j)) {
        ct_value d = ct_dict_new(rs, 0, CT_DICT);
        if (d.type != CT_DICT) return d;
        for (const cJSON *c = j->child; c; c = c->next) {
            const char *ks = c->string ? c->string : "";
            ct_value k = ct_str_new(rs, ks, strlen(ks));
            if (k.type != CT_STR) {
                ct_decref(d);
                return ct_none();
            }
            ct_value e = ct_from_cjson(rs, c, depth + 1);
            if (rs->failed) {
                ct_decref(k);
                ct_decref(e);
                ct_decref(d);
                return ct_none();
            }
            if (!ct_dict_set(rs, d, k, e)) {
                ct_decref(d);
                return ct_none();
            }
        }
        return d;
    }
    ct_fail(rs, "unsupported JSON value in the context");
    return ct_none();
}
