// Evaluator of the chat-template AST: scopes (jinja2's: a for-loop iteration, a macro call
// and a captured block each get their own frame; `set` writes the innermost one), Python
// operators, loops with the `loop` object, macros with caller, and the render entry point.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/chat_template_internal.h"
#include "util/err.h"

enum { R_OK = 0, R_BREAK = 1, R_CONTINUE = 2, R_ERR = -1 };

#define FAIL_AT(rs, n, ...) ((rs)->line = (n)->line, ct_fail((rs), __VA_ARGS__))

// ---- frames ----
static void frame_init(ct_rs *rs, ct_frame *f, ct_frame *parent) {
    memset(f, 0, sizeof *f);
    f->parent = parent;
    f->serial = ++rs->next_serial;
    f->live_prev = rs->live;
    rs->live = f;
}

static void frame_done(ct_rs *rs, ct_frame *f) {
    for (int i = 0; i < f->n; i++) ct_decref(f->vals[i]);
    free(f->names);
    free(f->vals);
    f->names = NULL;
    f->vals = NULL;
    f->n = f->cap = 0;
    rs->live = f->live_prev;
}

static ct_value *frame_find(ct_frame *f, const char *name) {
    for (; f; f = f->parent)
        for (int i = 0; i < f->n; i++)
            if (!strcmp(f->names[i], name)) return &f->vals[i];
    return NULL;
}

// `name` must outlive the render (AST string or literal); steals v
static bool frame_set(ct_rs *rs, ct_frame *f, const char *name, ct_value v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            ct_decref(f->vals[i]);
            f->vals[i] = v;
            return true;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        const char **nn = realloc(f->names, (size_t)cap * sizeof(char *));
        if (nn) f->names = nn;
        ct_value *nv = nn ? realloc(f->vals, (size_t)cap * sizeof(ct_value)) : NULL;
        if (nv) f->vals = nv;
        if (!nn || !nv) {
            ct_decref(v);
            ct_fail(rs, "out of memory");
            return false;
        }
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
    return true;
}

static ct_value lookup(ct_rs *rs, ct_frame *f, const char *name) {
    ct_value *v = frame_find(f, name);
    if (v) return ct_ref(*v);
    if (rs->ctx.type == CT_DICT) {
        v = ct_dict_get_str(ct_d(rs->ctx), name, strlen(name));
        if (v) return ct_ref(*v);
    }
    ct_value g = ct_global(name);
    if (g.type != CT_UNDEF) return g;
    return ct_undef_named(CT_UNDEF_NAME, name);
}

static const char *obj_type_name(int t) {
    switch (t) {
    case CT_NONE: return "NoneType";
    case CT_BOOL: return "bool";
    case CT_INT: return "int";
    case CT_FLOAT: return "float";
    case CT_STR: return "str";
    case CT_LIST: return "list";
    case CT_DICT: return "dict";
    case CT_NS: return "Namespace";
    case CT_LOOP: return "LoopContext";
    case CT_MACRO: return "Macro";
    default: return "object";
    }
}

int ct_undef_error(ct_rs *rs, ct_value u) {
    const char *tn = obj_type_name(u.aux);
    switch (u.sub) {
    case CT_UNDEF_UNSAFE:
        return ct_fail(rs, "access to attribute '%s' of '%s' object is unsafe (the sandbox forbids modifying values)",
                       u.u.cs ? u.u.cs : "?", tn);
    case CT_UNDEF_HINT: return ct_fail(rs, "%s", u.u.cs ? u.u.cs : "undefined value");
    case CT_UNDEF_INDEX: return ct_fail(rs, "'%s' object has no element %lld", tn, (long long)u.u.i);
    case CT_UNDEF_ATTR:
        if (u.u.cs) return ct_fail(rs, "'%s' object has no attribute '%s'", tn, u.u.cs);
        return ct_fail(rs, "'%s' object has no such key or attribute", tn);
    default:
        if (u.u.cs) return ct_fail(rs, "'%s' is undefined", u.u.cs);
        return ct_fail(rs, "undefined value used");
    }
}

bool ct_register_ns(ct_rs *rs, ct_value ns) {
    if (rs->nns == rs->nscap) {
        size_t cap = rs->nscap ? rs->nscap * 2 : 8;
        ct_value *nv = realloc(rs->nss, cap * sizeof(ct_value));
        if (!nv) {
            ct_fail(rs, "out of memory");
            return false;
        }
        rs->nss = nv;
        rs->nscap = cap;
    }
    rs->nss[rs->nns++] = ct_ref(ns);
    return true;
}

// ---- expressions ----
static int eval(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value *out);
static int exec_body(ct_rs *rs, ct_frame *f, ct_node *const *kids, int nkids);

static bool num(ct_value v) { return v.type == CT_BOOL || v.type == CT_INT || v.type == CT_FLOAT; }
static bool intlike(ct_value v) { return v.type == CT_BOOL || v.type == CT_INT; }
static int64_t ival(ct_value v) { return v.type == CT_BOOL ? (int64_t)v.u.b : v.u.i; }
static double fval(ct_value v) { return v.type == CT_FLOAT ? v.u.f : (double)ival(v); }

static const char *op_sym(int op) {
    switch (op) {
    case OP_ADD: return "+";
    case OP_SUB: return "-";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_FLOORDIV: return "//";
    case OP_MOD: return "%";
    case OP_POW: return "** or pow()";
    default: return "?";
    }
}

static int repeat_seq(ct_rs *rs, ct_value seq, int64_t times, ct_value *out) {
    if (times < 0) times = 0;
    if ((seq.type == CT_STR && ct_s(seq)->len == 0) || (seq.type == CT_LIST && ct_l(seq)->n == 0))
        times = 0;  // '' * 10**18 is '' (and must not loop 10**18 times)
    if (seq.type == CT_STR) {
        size_t len = ct_s(seq)->len;
        if (len && (uint64_t)times > CT_MAX_STR / len)
            return ct_fail(rs, "string repetition exceeds the %u MiB limit", CT_MAX_STR >> 20);
        ct_buf b = {0};
        for (int64_t i = 0; i < times; i++)
            if (!ct_buf_put(rs, &b, ct_s(seq)->s, len)) {
                ct_buf_free(&b);
                return -1;
            }
        *out = ct_buf_take(rs, &b);
        return out->type == CT_STR ? 0 : -1;
    }
    ct_list *l = ct_l(seq);
    if (l->n && (uint64_t)times > CT_MAX_LIST / l->n) return ct_fail(rs, "list repetition exceeds %d elements", CT_MAX_LIST);
    ct_value r = ct_list_new(rs, l->n * (size_t)times, l->tuple);
    if (r.type != CT_LIST) return -1;
    for (int64_t i = 0; i < times; i++)
        for (size_t j = 0; j < l->n; j++)
            if (!ct_list_push(rs, r, ct_ref(l->v[j]))) {
                ct_decref(r);
                return -1;
            }
    *out = r;
    return 0;
}

static int binop(ct_rs *rs, int op, ct_value a, ct_value b, ct_value *out) {
    if (a.type == CT_UNDEF) return ct_undef_error(rs, a);
    if (b.type == CT_UNDEF) return ct_undef_error(rs, b);
    if (num(a) && num(b)) {
        bool ints = intlike(a) && intlike(b);
        int64_t x = ints ? ival(a) : 0, y = ints ? ival(b) : 0, r;
        double fx = fval(a), fy = fval(b);
        switch (op) {
        case OP_ADD:
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &r)) return ct_fail(rs, "integer overflow (64-bit)");
            *out = ct_int(r);
            return 0;
        case OP_SUB:
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &r)) return ct_fail(rs, "integer overflow (64-bit)");
            *out = ct_int(r);
            return 0;
        case OP_MUL:
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &r)) return ct_fail(rs, "integer overflow (64-bit)");
            *out = ct_int(r);
            return 0;
        case OP_DIV:
            if (fy == 0) return ct_fail(rs, "division by zero");
            *out = ct_float(fx / fy);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints) {
                if (y == 0) return ct_fail(rs, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return ct_fail(rs, "integer overflow (64-bit)");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    m += y;
                    q -= 1;
                }
                *out = ct_int(op == OP_MOD ? m : q);
                return 0;
            } else {
                if (fy == 0) return ct_fail(rs, "float division by zero");
                double m = fmod(fx, fy), d = (fx - m) / fy;  // CPython's float divmod
                if (m != 0) {
                    if ((fy < 0) != (m < 0)) {
                        m += fy;
                        d -= 1.0;
                    }
                } else {
                    m = copysign(0.0, fy);
                }
                double fd;
                if (d != 0) {
                    fd = floor(d);
                    if (d - fd > 0.5) fd += 1.0;
                } else {
                    fd = copysign(0.0, fx / fy);
                }
                *out = ct_float(op == OP_MOD ? m : fd);
                return 0;
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e) {
                    if (e & 1 && __builtin_mul_overflow(acc, base, &acc)) return ct_fail(rs, "integer overflow (64-bit)");
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) return ct_fail(rs, "integer overflow (64-bit)");
                }
                *out = ct_int(acc);
                return 0;
            }
            if (fx == 0 && fy < 0) return ct_fail(rs, "zero to a negative power");
            if (fx < 0 && fy != floor(fy)) return ct_fail(rs, "complex results are not supported");
            *out = ct_float(pow(fx, fy));
            return 0;
        }
        switch (op) {  // float arithmetic
        case OP_ADD: *out = ct_float(fx + fy); return 0;
        case OP_SUB: *out = ct_float(fx - fy); return 0;
        case OP_MUL: *out = ct_float(fx * fy); return 0;
        }
    }
    if (op == OP_ADD && a.type == CT_STR && b.type == CT_STR) {
        if (ct_s(a)->markup != ct_s(b)->markup) {
            // Markup + str escapes the plain side and stays Markup (markupsafe semantics)
            ct_value ea, eb;
            if (ct_html_escape(rs, a, &ea) < 0) return -1;
            if (ct_html_escape(rs, b, &eb) < 0) {
                ct_decref(ea);
                return -1;
            }
            *out = ct_str_cat(rs, ct_s(ea)->s, ct_s(ea)->len, ct_s(eb)->s, ct_s(eb)->len);
            ct_decref(ea);
            ct_decref(eb);
            if (out->type != CT_STR) return -1;
            ct_s(*out)->markup = true;
            return 0;
        }
        ct_value parts[2] = {a, b};
        *out = ct_str_join(rs, parts, 2);
        if (out->type != CT_STR) return -1;
        ct_s(*out)->markup = ct_s(a)->markup;
        return 0;
    }
    if (op == OP_ADD && a.type == CT_LIST && b.type == CT_LIST && ct_l(a)->kind == ct_l(b)->kind &&
        ct_l(a)->kind <= CT_LK_TUPLE) {
        ct_list *x = ct_l(a), *y = ct_l(b);
        if (x->n + y->n > CT_MAX_LIST) return ct_fail(rs, "list exceeds %d elements", CT_MAX_LIST);
        ct_value r = ct_list_new(rs, x->n + y->n, x->tuple);
        if (r.type != CT_LIST) return -1;
        for (size_t i = 0; i < x->n; i++)
            if (!ct_list_push(rs, r, ct_ref(x->v[i]))) goto fail_r;
        for (size_t i = 0; i < y->n; i++)
            if (!ct_list_push(rs, r, ct_ref(y->v[i]))) goto fail_r;
        *out = r;
        return 0;
    fail_r:
        ct_decref(r);
        return -1;
    }
    bool seq_a = a.type == CT_STR || (a.type == CT_LIST && ct_l(a)->kind <= CT_LK_TUPLE);
    bool seq_b = b.type == CT_STR || (b.type == CT_LIST && ct_l(b)->kind <= CT_LK_TUPLE);
    if (op == OP_MUL && seq_a && intlike(b)) return repeat_seq(rs, a, ival(b), out);
    if (op == OP_MUL && seq_b && intlike(a)) return repeat_seq(rs, b, ival(a), out);
    if (op == OP_MOD && a.type == CT_STR) return ct_py_format(rs, a, b, out);
    return ct_fail(rs, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), ct_type_name(a),
                   ct_type_name(b));
}

static int contains(ct_rs *rs, ct_value item, ct_value seq, bool *res) {
    switch (seq.type) {
    case CT_STR:
        if (item.type != CT_STR)
            return ct_fail(rs, "'in <string>' requires string as left operand, not %s", ct_type_name(item));
        ct_add_work((ct_s(seq)->len >> 4) + 1);
        *res = ct_s(item)->len == 0 ||
               memmem(ct_s(seq)->s, ct_s(seq)->len, ct_s(item)->s, ct_s(item)->len) != NULL;
        return 0;
    case CT_LIST:
        *res = false;
        for (size_t i = 0; i < ct_l(seq)->n && !*res; i++) *res = ct_eq(ct_l(seq)->v[i], item);
        return 0;
    case CT_DICT:
        if (!ct_hashable(item)) return ct_fail(rs, "unhashable type: '%s'", ct_type_name(item));
        *res = ct_dict_get(ct_d(seq), item) != NULL;
        return 0;
    case CT_UNDEF:  // Undefined iterates as empty
        *res = false;
        return 0;
    default:
        return ct_fail(rs, "argument of type '%s' is not iterable", ct_type_name(seq));
    }
}

static int compare(ct_rs *rs, int op, ct_value a, ct_value b, bool *res) {
    switch (op) {
    case OP_EQ: *res = ct_eq(a, b); return 0;
    case OP_NE: *res = !ct_eq(a, b); return 0;
    case OP_IN: return contains(rs, a, b, res);
    case OP_NOTIN:
        if (contains(rs, a, b, res) < 0) return -1;
        *res = !*res;
        return 0;
    }
    if (a.type == CT_UNDEF) return ct_undef_error(rs, a);
    if (b.type == CT_UNDEF) return ct_undef_error(rs, b);
    if ((a.type == CT_FLOAT && isnan(a.u.f)) || (b.type == CT_FLOAT && isnan(b.u.f))) {
        if (!num(a) || !num(b)) return ct_fail(rs, "'<' not supported between instances of '%s' and '%s'", ct_type_name(a), ct_type_name(b));
        *res = false;
        return 0;
    }
    int c;
    if (ct_cmp(rs, a, b, &c) < 0) return -1;
    switch (op) {
    case OP_LT: *res = c < 0; break;
    case OP_LTEQ: *res = c <= 0; break;
    case OP_GT: *res = c > 0; break;
    default: *res = c >= 0; break;
    }
    return 0;
}

// Evaluated positional and keyword arguments (all owned here; kwarg names borrowed from the
// AST or from the **kwargs dict, which is kept alive in `dyn`)
#define ARGV_INLINE 4
typedef struct argv_t {
    ct_args a;
    ct_value pos[ARGV_INLINE], kwv[ARGV_INLINE];
    const char *kwn[ARGV_INLINE + 1];
    ct_value dyn[2];
} argv_t;

static void args_free(argv_t *av) {
    for (int i = 0; i < av->a.npos; i++) ct_decref(av->a.pos[i]);
    for (int i = 0; i < av->a.nkw; i++) ct_decref(av->a.kwv[i]);
    if (av->a.pos != av->pos) free(av->a.pos);
    if (av->a.kwv != av->kwv) free(av->a.kwv);
    if (av->a.kwn != av->kwn) free((void *)av->a.kwn);
    av->a.npos = av->a.nkw = 0;
    ct_decref(av->dyn[0]);
    ct_decref(av->dyn[1]);
    av->dyn[0] = av->dyn[1] = ct_none();
}

// extra: one more keyword argument (the caller of a call block), stolen
static int eval_args(ct_rs *rs, ct_frame *f, const ct_node *n, argv_t *av, const char *extra_name, ct_value *extra) {
    memset(&av->a, 0, sizeof av->a);
    av->a.pos = av->pos, av->a.kwv = av->kwv, av->a.kwn = av->kwn;
    av->dyn[0] = av->dyn[1] = ct_none();
    ct_value ex = extra ? *extra : ct_none();
    // *args and **kwargs (N_CALL / N_FILTER / N_TEST keep them in b and c)
    if (n->b) {
        ct_value v;
        if (eval(rs, f, n->b, &v) < 0) goto fail;
        int r = ct_iterate(rs, v, &av->dyn[0]);
        ct_decref(v);
        if (r < 0) goto fail;
    }
    if (n->c) {
        if (eval(rs, f, n->c, &av->dyn[1]) < 0) goto fail;
        if (av->dyn[1].type != CT_DICT) {
            ct_fail(rs, "argument after ** must be a mapping, not %s", ct_type_name(av->dyn[1]));
            goto fail;
        }
        for (size_t i = 0; i < ct_d(av->dyn[1])->n; i++)
            if (ct_d(av->dyn[1])->k[i].type != CT_STR) {
                ct_fail(rs, "keywords must be strings");
                goto fail;
            }
    }
    size_t npos = (size_t)n->nkids + (av->dyn[0].type == CT_LIST ? ct_l(av->dyn[0])->n : 0);
    size_t nkw = (size_t)n->nkids2 + (extra_name ? 1 : 0) + (av->dyn[1].type == CT_DICT ? ct_d(av->dyn[1])->n : 0);
    if (npos > CT_MAX_LIST || nkw > CT_MAX_LIST) {
        ct_fail(rs, "too many call arguments");
        goto fail;
    }
    if (npos > ARGV_INLINE && !(av->a.pos = malloc(npos * sizeof(ct_value)))) goto oom;
    if (nkw > ARGV_INLINE && !(av->a.kwv = malloc(nkw * sizeof(ct_value)))) goto oom;
    if (nkw > ARGV_INLINE && !(av->a.kwn = malloc((nkw + 1) * sizeof(char *)))) goto oom;
    for (int i = 0; i < n->nkids; i++) {
        if (eval(rs, f, n->kids[i], &av->a.pos[av->a.npos]) < 0) goto fail;
        av->a.npos++;
    }
    if (av->dyn[0].type == CT_LIST)
        for (size_t i = 0; i < ct_l(av->dyn[0])->n; i++) av->a.pos[av->a.npos++] = ct_ref(ct_l(av->dyn[0])->v[i]);
    for (int i = 0; i < n->nkids2; i++) {
        if (eval(rs, f, n->kids2[i], &av->a.kwv[av->a.nkw]) < 0) goto fail;
        av->a.kwn[av->a.nkw++] = n->names[i];
    }
    if (av->dyn[1].type == CT_DICT)
        for (size_t i = 0; i < ct_d(av->dyn[1])->n; i++) {
            const char *key = ct_s(ct_d(av->dyn[1])->k[i])->s;
            for (int k = 0; k < av->a.nkw; k++)
                if (!strcmp(av->a.kwn[k], key)) {
                    ct_fail(rs, "got multiple values for keyword argument '%s'", key);
                    goto fail;
                }
            av->a.kwn[av->a.nkw] = key;
            av->a.kwv[av->a.nkw++] = ct_ref(ct_d(av->dyn[1])->v[i]);
        }
    if (extra_name) {
        av->a.kwn[av->a.nkw] = extra_name;
        av->a.kwv[av->a.nkw++] = ex;
        ex = ct_none();
    }
    return 0;
oom:
    ct_fail(rs, "out of memory");
fail:
    ct_decref(ex);
    args_free(av);
    return -1;
}

__attribute__((noinline)) static int eval_filter(ct_rs *rs, ct_frame *f, const ct_node *n, const ct_value *base, ct_value *out) {
    ct_value in;
    int r;
    if (!n->a) r = (in = ct_ref(*base), 0);
    else if (base && n->a->kind == N_FILTER) r = eval_filter(rs, f, n->a, base, &in);
    else r = eval(rs, f, n->a, &in);
    if (r < 0) return -1;
    argv_t av;
    if (eval_args(rs, f, n, &av, NULL, NULL) < 0) {
        ct_decref(in);
        return -1;
    }
    rs->line = n->line;
    r = ct_apply_filter(rs, n->fid, n->name, in, &av.a, out);
    args_free(&av);
    ct_decref(in);
    return r;
}

// Calls and tests carry an argument vector: kept out of eval_inner so that the frames of
// plain expression nesting stay small (the evaluator recurses).
__attribute__((noinline)) static int eval_call(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value *out) {
    ct_value callee;
    if (eval(rs, f, n->a, &callee) < 0) return -1;
    argv_t av;
    if (eval_args(rs, f, n, &av, NULL, NULL) < 0) {
        ct_decref(callee);
        return -1;
    }
    rs->line = n->line;
    int r = ct_call_value(rs, callee, &av.a, out);
    args_free(&av);
    ct_decref(callee);
    return r;
}

__attribute__((noinline)) static int eval_test(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value *out) {
    ct_value a;
    if (eval(rs, f, n->a, &a) < 0) return -1;
    argv_t av;
    if (eval_args(rs, f, n, &av, NULL, NULL) < 0) {
        ct_decref(a);
        return -1;
    }
    bool t = false;
    rs->line = n->line;
    int r = ct_apply_test(rs, n->fid, n->name, a, &av.a, &t);
    args_free(&av);
    ct_decref(a);
    *out = ct_bool(t);
    return r;
}

// a ~ b ~ c: str() of each part, joined with one exact-size copy (templates that grow a
// namespace string this way then copy it once per step, as CPython does)
__attribute__((noinline)) static int eval_concat(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value *out) {
    ct_value parts[8], *pv = parts;
    if (n->nkids > 8) {
        pv = calloc((size_t)n->nkids, sizeof(ct_value));
        if (!pv) return ct_fail(rs, "out of memory");
    }
    int got = 0, r = -1;
    for (; got < n->nkids; got++) {
        ct_value v;
        if (eval(rs, f, n->kids[got], &v) < 0) break;
        pv[got] = ct_str_of(rs, v);
        ct_decref(v);
        if (pv[got].type != CT_STR) break;
    }
    if (got == n->nkids) {
        *out = ct_str_join(rs, pv, got);
        r = out->type == CT_STR ? 0 : -1;
    }
    for (int i = 0; i < got; i++) ct_decref(pv[i]);
    if (pv != parts) free(pv);
    return r;
}

static int eval_inner(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value *out) {
    ct_value a, b;
    int r;
    switch (n->kind) {
    case N_CONST:
        *out = n->val;  // immortal
        return 0;
    case N_NAME:
        *out = lookup(rs, f, n->name);
        return 0;
    case N_GETATTR:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        rs->line = n->line;
        r = ct_getattr(rs, a, n->name, out);
        ct_decref(a);
        return r;
    case N_GETITEM:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        if (n->b->kind == N_SLICE) {
            ct_value s[3] = {ct_none(), ct_none(), ct_none()};
            const ct_node *sn[3] = {n->b->a, n->b->b, n->b->c};
            for (int i = 0; i < 3; i++)
                if (sn[i] && eval(rs, f, sn[i], &s[i]) < 0) {
                    for (int j = 0; j < i; j++) ct_decref(s[j]);
                    ct_decref(a);
                    return -1;
                }
            rs->line = n->line;
            r = ct_slice(rs, a, s[0], s[1], s[2], out);
            for (int i = 0; i < 3; i++) ct_decref(s[i]);
            ct_decref(a);
            return r;
        }
        if (eval(rs, f, n->b, &b) < 0) {
            ct_decref(a);
            return -1;
        }
        rs->line = n->line;
        r = ct_getitem(rs, a, b, out);
        // name the missing key in error messages when it is a literal (immortal, stable)
        if (r == 0 && out->type == CT_UNDEF && out->sub == CT_UNDEF_ATTR && !out->u.cs &&
            n->b->kind == N_CONST && n->b->val.type == CT_STR)
            out->u.cs = ct_s(n->b->val)->s;
        ct_decref(a);
        ct_decref(b);
        return r;
    case N_SLICE:
        return FAIL_AT(rs, n, "slice outside a subscript");
    case N_CALL:
        return eval_call(rs, f, n, out);
    case N_FILTER:
        return eval_filter(rs, f, n, NULL, out);
    case N_TEST:
        return eval_test(rs, f, n, out);
    case N_LIST:
    case N_TUPLE: {
        ct_value l = ct_list_new(rs, (size_t)n->nkids, n->kind == N_TUPLE);
        if (l.type != CT_LIST) return -1;
        for (int i = 0; i < n->nkids; i++) {
            if (eval(rs, f, n->kids[i], &a) < 0 || !ct_list_push(rs, l, a)) {
                ct_decref(l);
                return -1;
            }
        }
        *out = l;
        return 0;
    }
    case N_DICT: {
        ct_value d = ct_dict_new(rs, (size_t)n->nkids, CT_DICT);
        if (d.type != CT_DICT) return -1;
        for (int i = 0; i < n->nkids; i++) {
            if (eval(rs, f, n->kids[i], &a) < 0) {
                ct_decref(d);
                return -1;
            }
            if (eval(rs, f, n->kids2[i], &b) < 0) {
                ct_decref(a);
                ct_decref(d);
                return -1;
            }
            rs->line = n->line;
            if (!ct_dict_set(rs, d, a, b)) {
                ct_decref(d);
                return -1;
            }
        }
        *out = d;
        return 0;
    }
    case N_BINOP:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        if (eval(rs, f, n->b, &b) < 0) {
            ct_decref(a);
            return -1;
        }
        rs->line = n->line;
        r = binop(rs, n->op, a, b, out);
        ct_decref(a);
        ct_decref(b);
        return r;
    case N_UNARY:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        rs->line = n->line;
        if (a.type == CT_UNDEF) return ct_undef_error(rs, a);
        if (!num(a)) {
            ct_fail(rs, "bad operand type for unary %s: '%s'", n->op == OP_SUB ? "-" : "+", ct_type_name(a));
            ct_decref(a);
            return -1;
        }
        if (n->op == OP_ADD) *out = a.type == CT_BOOL ? ct_int(a.u.b) : a;
        else if (a.type == CT_FLOAT) *out = ct_float(-a.u.f);
        else if (ival(a) == INT64_MIN) return ct_fail(rs, "integer overflow (64-bit)");
        else *out = ct_int(-ival(a));
        return 0;
    case N_NOT:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        *out = ct_bool(!ct_truthy(a));
        ct_decref(a);
        return 0;
    case N_AND:
    case N_OR:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        if (ct_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        ct_decref(a);
        return eval(rs, f, n->b, out);
    case N_COMPARE: {
        if (eval(rs, f, n->a, &a) < 0) return -1;
        bool res = true;
        for (int i = 0; i < n->nkids && res; i++) {
            if (eval(rs, f, n->kids[i], &b) < 0) {
                ct_decref(a);
                return -1;
            }
            rs->line = n->line;
            if (compare(rs, n->ops[i], a, b, &res) < 0) {
                ct_decref(a);
                ct_decref(b);
                return -1;
            }
            ct_decref(a);
            a = b;
        }
        ct_decref(a);
        *out = ct_bool(res);
        return 0;
    }
    case N_CONCAT:
        return eval_concat(rs, f, n, out);
    case N_CONDEXPR:
        if (eval(rs, f, n->a, &a) < 0) return -1;
        r = ct_truthy(a);
        ct_decref(a);
        if (r) return eval(rs, f, n->b, out);
        if (n->c) return eval(rs, f, n->c, out);
        *out = ct_undef_named(CT_UNDEF_HINT, "the inline if-expression evaluated to false and no else section was defined");
        return 0;
    default:
        return FAIL_AT(rs, n, "cannot evaluate this node as an expression");
    }
}

// true when the evaluator has used more C stack than CT_MAX_STACK (it recurses over the AST
// and through macro calls; the frame sizes differ between builds, the budget does not)
static bool stack_exhausted(const ct_rs *rs) {
    char here;
    uintptr_t p = (uintptr_t)&here;
    uintptr_t used = p < rs->stack_base ? rs->stack_base - p : p - rs->stack_base;
    return used > CT_MAX_STACK;
}

static int eval(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value *out) {
    *out = ct_none();
    rs->steps += 1 + (int64_t)ct_work;
    ct_work = 0;
    if (rs->steps > CT_MAX_STEPS) return FAIL_AT(rs, n, "template exceeded %d evaluation steps", CT_MAX_STEPS);
    if (++rs->eval_depth > CT_MAX_EVAL_DEPTH || stack_exhausted(rs)) {
        rs->eval_depth--;
        return FAIL_AT(rs, n, "template evaluation nested too deeply");
    }
    rs->line = n->line;
    int r = eval_inner(rs, f, n, out);
    rs->eval_depth--;
    if (r < 0) *out = ct_none();
    return r;
}

// ---- macros ----
static ct_frame *live_frame(ct_rs *rs, uint64_t serial) {
    for (ct_frame *f = rs->live; f; f = f->live_prev)
        if (f->serial == serial) return f;
    return rs->root;
}

static int call_macro(ct_rs *rs, ct_macro *m, ct_args *a, ct_value *out) {
    const ct_node *def = m->def;
    const char *mname = m->is_caller ? "caller" : def->name;
    if (rs->call_depth >= CT_MAX_CALL_DEPTH)
        return ct_fail(rs, "macro calls nested too deeply (more than %d levels; recursion?)", CT_MAX_CALL_DEPTH);
    int np = def->nnames, ndef = def->nkids2;
    bool want_caller = (def->flags & CT_MF_CALLER) != 0;
    if (a->npos > np && !(def->flags & CT_MF_VARARGS))
        return ct_fail(rs, "macro '%s' takes not more than %d argument(s)", mname, np);
    ct_frame fr;
    frame_init(rs, &fr, live_frame(rs, m->frame_serial));
    int r = -1;
    uint64_t bound_bits[4] = {0, 0, 0, 0};  // parameters given so far (at most 255)
#define BOUND(i) ((bound_bits[(i) >> 6] >> ((i) & 63)) & 1)
#define SET_BOUND(i) (bound_bits[(i) >> 6] |= (uint64_t)1 << ((i) & 63))
    if (np > 255) {
        ct_fail(rs, "macro '%s' has too many parameters", mname);
        goto done;
    }
    for (int i = 0; i < a->npos && i < np; i++) {
        if (!frame_set(rs, &fr, def->names[i], ct_ref(a->pos[i]))) goto done;
        SET_BOUND(i);
    }
    ct_value kwargs = ct_none(), caller = ct_undef_named(CT_UNDEF_HINT, "No caller defined");
    if (def->flags & CT_MF_KWARGS) {
        kwargs = ct_dict_new(rs, 0, CT_DICT);
        if (kwargs.type != CT_DICT) goto done;
    }
    for (int k = 0; k < a->nkw; k++) {
        int idx = -1;
        for (int i = 0; i < np; i++)
            if (!strcmp(def->names[i], a->kwn[k])) idx = i;
        if (idx >= 0 && !BOUND(idx)) {
            if (!frame_set(rs, &fr, def->names[idx], ct_ref(a->kwv[k]))) goto done_kw;
            SET_BOUND(idx);
        } else if (want_caller && !strcmp(a->kwn[k], "caller")) {
            ct_decref(caller);
            caller = ct_ref(a->kwv[k]);
        } else if (def->flags & CT_MF_KWARGS) {
            ct_value key = ct_str_new(rs, a->kwn[k], strlen(a->kwn[k]));
            if (key.type != CT_STR || !ct_dict_set(rs, kwargs, key, ct_ref(a->kwv[k]))) goto done_kw;
        } else {
            ct_fail(rs, "macro '%s' takes no keyword argument '%s'", mname, a->kwn[k]);
            goto done_kw;
        }
    }
    for (int i = 0; i < np; i++) {
        if (BOUND(i)) continue;
        int di = i - (np - ndef);
        ct_value v;
        if (di >= 0) {
            if (eval(rs, &fr, def->kids2[di], &v) < 0) goto done_kw;
        } else {
            v = ct_undef_named(CT_UNDEF_NAME, def->names[i]);
        }
        if (!frame_set(rs, &fr, def->names[i], v)) goto done_kw;
    }
    if (def->flags & CT_MF_VARARGS) {
        ct_value va = ct_list_new(rs, 0, true);
        if (va.type != CT_LIST) goto done_kw;
        for (int i = np; i < a->npos; i++)
            if (!ct_list_push(rs, va, ct_ref(a->pos[i]))) {
                ct_decref(va);
                goto done_kw;
            }
        if (!frame_set(rs, &fr, "varargs", va)) goto done_kw;
    }
    if (def->flags & CT_MF_KWARGS) {
        if (!frame_set(rs, &fr, "kwargs", kwargs)) {
            kwargs = ct_none();
            goto done_kw;
        }
        kwargs = ct_none();
    }
    if (want_caller) {
        if (!frame_set(rs, &fr, "caller", caller)) {
            caller = ct_none();
            goto done_kw;
        }
        caller = ct_none();
    }
    {
        ct_buf buf = {0}, *saved = rs->out;
        rs->out = &buf;
        rs->call_depth++;
        int er = exec_body(rs, &fr, def->kids, def->nkids);
        rs->call_depth--;
        rs->out = saved;
        if (er < 0) {
            ct_buf_free(&buf);
            goto done_kw;
        }
        *out = ct_buf_take(rs, &buf);
        r = out->type == CT_STR ? 0 : -1;
    }
done_kw:
    ct_decref(kwargs);
    ct_decref(caller);
done:
    frame_done(rs, &fr);
    return r;
#undef BOUND
#undef SET_BOUND
}

int ct_call_value(ct_rs *rs, ct_value callee, ct_args *a, ct_value *out) {
    *out = ct_none();
    switch (callee.type) {
    case CT_MACRO: return call_macro(rs, (ct_macro *)callee.u.o, a, out);
    case CT_METHOD: return ct_call_method(rs, (ct_method *)callee.u.o, a, out);
    case CT_FUNC: return ct_call_func(rs, (int)callee.u.i, a, out);
    case CT_UNDEF: return ct_undef_error(rs, callee);
    default: return ct_fail(rs, "'%s' object is not callable", ct_type_name(callee));
    }
}

// ---- statements ----
static int assign(ct_rs *rs, ct_frame *f, const ct_node *target, ct_value v);

static int unpack(ct_rs *rs, ct_frame *f, const ct_node *target, ct_value v) {
    ct_value items;
    if (v.type == CT_UNDEF) {
        ct_undef_error(rs, v);
        ct_decref(v);
        return -1;
    }
    if (ct_iterate(rs, v, &items) < 0) {
        ct_decref(v);
        return -1;
    }
    ct_decref(v);
    ct_list *l = ct_l(items);
    int r = 0;
    if (l->n != (size_t)target->nkids) {
        if (l->n > (size_t)target->nkids) r = ct_fail(rs, "too many values to unpack (expected %d)", target->nkids);
        else r = ct_fail(rs, "not enough values to unpack (expected %d, got %zu)", target->nkids, l->n);
    }
    for (int i = 0; r == 0 && i < target->nkids; i++) r = assign(rs, f, target->kids[i], ct_ref(l->v[i]));
    ct_decref(items);
    return r;
}

// steals v
static int assign(ct_rs *rs, ct_frame *f, const ct_node *target, ct_value v) {
    if (target->kind == N_NAME) return frame_set(rs, f, target->name, v) ? 0 : -1;
    if (target->kind == N_TUPLE) return unpack(rs, f, target, v);
    if (target->kind == N_NSREF) {
        ct_value ns = lookup(rs, f, target->name);
        if (ns.type != CT_NS) {
            ct_decref(ns);
            ct_decref(v);
            return FAIL_AT(rs, target, "cannot assign attribute on non-namespace object '%s'", target->name);
        }
        ct_value key = ct_str_new(rs, target->name2, strlen(target->name2));
        bool ok = key.type == CT_STR && ct_dict_set(rs, ns, key, v);
        if (key.type != CT_STR) ct_decref(v);
        ct_decref(ns);
        return ok ? 0 : -1;
    }
    ct_decref(v);
    return FAIL_AT(rs, target, "cannot assign to this expression");
}

static int capture(ct_rs *rs, ct_frame *parent, ct_node *const *kids, int nkids, ct_value *out) {
    ct_frame fr;
    frame_init(rs, &fr, parent);
    ct_buf buf = {0}, *saved = rs->out;
    rs->out = &buf;
    int r = exec_body(rs, &fr, kids, nkids);
    rs->out = saved;
    frame_done(rs, &fr);
    if (r < 0) {
        ct_buf_free(&buf);
        return -1;
    }
    *out = ct_buf_take(rs, &buf);
    return out->type == CT_STR ? 0 : -1;
}

static int output(ct_rs *rs, ct_value v) {
    bool ok = ct_to_str(rs, rs->out, v);
    if (ok && rs->out->n > CT_MAX_OUTPUT) ok = ct_fail(rs, "output exceeds %u MiB", CT_MAX_OUTPUT >> 20) == 0;
    return ok ? 0 : -1;
}

static int exec_for(ct_rs *rs, ct_frame *f, const ct_node *n) {
    if (n->flags) return FAIL_AT(rs, n, "recursive for-loops are not supported");
    ct_value it, items;
    if (eval(rs, f, n->b, &it) < 0) return -1;
    rs->line = n->line;
    int r = ct_iterate(rs, it, &items);
    ct_decref(it);
    if (r < 0) return -1;
    if (n->c) {  // {% for x in xs if cond %}: filter first, loop.* counts the kept items
        ct_value kept = ct_list_new(rs, 0, false);
        if (kept.type != CT_LIST) {
            ct_decref(items);
            return -1;
        }
        for (size_t i = 0; i < ct_l(items)->n; i++) {
            if (++rs->iters > CT_MAX_ITERS) {
                FAIL_AT(rs, n, "template exceeded %d loop iterations", CT_MAX_ITERS);
                goto fail_kept;
            }
            ct_frame fr;
            frame_init(rs, &fr, f);
            ct_value t;
            int ar = assign(rs, &fr, n->a, ct_ref(ct_l(items)->v[i]));
            if (ar == 0) ar = eval(rs, &fr, n->c, &t);
            frame_done(rs, &fr);
            if (ar < 0) goto fail_kept;
            bool keep = ct_truthy(t);
            ct_decref(t);
            if (keep && !ct_list_push(rs, kept, ct_ref(ct_l(items)->v[i]))) goto fail_kept;
        }
        ct_decref(items);
        items = kept;
        goto filtered;
    fail_kept:
        ct_decref(kept);
        ct_decref(items);
        return -1;
    }
filtered:;
    ct_list *l = ct_l(items);
    if (l->n == 0) {
        ct_decref(items);
        if (!n->nkids2) return 0;
        ct_frame fr;
        frame_init(rs, &fr, f);
        r = exec_body(rs, &fr, n->kids2, n->nkids2);
        frame_done(rs, &fr);
        return r < 0 ? -1 : r;
    }
    if (ct_val_depth(items) + 1 > CT_MAX_VALUE_DEPTH) {
        ct_decref(items);
        return FAIL_AT(rs, n, "values nested deeper than %d levels", CT_MAX_VALUE_DEPTH);
    }
    if (!ct_budget(rs, sizeof(ct_loop))) {
        ct_decref(items);
        return -1;
    }
    ct_loop *lp = calloc(1, sizeof *lp);
    if (!lp) {
        ct_release(sizeof(ct_loop));
        ct_decref(items);
        return FAIL_AT(rs, n, "out of memory");
    }
    lp->h.rc = 1;
    lp->h.type = CT_LOOP;
    lp->h.acct = sizeof(ct_loop);
    lp->items = l;  // takes the reference of `items`
    lp->depth_cap = (uint16_t)(ct_val_depth(items) + 1);
    lp->depth = 1;
    lp->changed_last = ct_none();
    ct_value loopv = {.type = CT_LOOP};
    loopv.u.o = &lp->h;
    r = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (++rs->iters > CT_MAX_ITERS) {
            r = FAIL_AT(rs, n, "template exceeded %d loop iterations", CT_MAX_ITERS);
            break;
        }
        lp->idx = (int64_t)i;
        ct_frame fr;
        frame_init(rs, &fr, f);
        r = assign(rs, &fr, n->a, ct_ref(l->v[i]));
        if (r == 0) r = frame_set(rs, &fr, "loop", ct_ref(loopv)) ? 0 : -1;
        if (r == 0) r = exec_body(rs, &fr, n->kids, n->nkids);
        frame_done(rs, &fr);
        if (r < 0) break;
        if (r == R_BREAK) {
            r = 0;
            break;
        }
        r = 0;
    }
    ct_decref(loopv);
    return r;
}

// {% call m(args) %}body{% endcall %}: m(args, caller=<body>); steals `caller`
__attribute__((noinline)) static int exec_callblock(ct_rs *rs, ct_frame *f, const ct_node *n, ct_value caller) {
    const ct_node *call = n->a;
    ct_value callee, res;
    if (eval(rs, f, call->a, &callee) < 0) {
        ct_decref(caller);
        return -1;
    }
    argv_t av;
    if (eval_args(rs, f, call, &av, "caller", &caller) < 0) {
        ct_decref(callee);
        return -1;
    }
    rs->line = n->line;
    int r = ct_call_value(rs, callee, &av.a, &res);
    args_free(&av);
    ct_decref(callee);
    if (r < 0) return -1;
    r = output(rs, res);
    ct_decref(res);
    return r;
}

// {% set ns.x = ns.x ~ a ~ b %} / {% set ns.x = ns.x + a %}: templates that build their
// output in a namespace string do this once per message. Evaluated in the same order as the
// generic path, but when the namespace holds the only other reference to the old string it
// is extended in place (amortised O(total) instead of a fresh copy per step). Returns 1 when
// the statement does not have this shape (nothing evaluated).
__attribute__((noinline)) static int set_ns_append(ct_rs *rs, ct_frame *f, const ct_node *n) {
    const ct_node *t = n->a, *e = n->b, *first;
    ct_node *const *rest;
    int nrest;
    bool concat = e->kind == N_CONCAT;
    if (concat && e->nkids >= 2 && e->nkids <= 9) {
        first = e->kids[0];
        rest = e->kids + 1;
        nrest = e->nkids - 1;
    } else if (e->kind == N_BINOP && e->op == OP_ADD) {
        first = e->a;
        rest = (ct_node *const *)&e->b;
        nrest = 1;
    } else {
        return 1;
    }
    if (first->kind != N_GETATTR || first->a->kind != N_NAME || strcmp(first->a->name, t->name) ||
        strcmp(first->name, t->name2))
        return 1;
    ct_value old, parts[8], res = ct_none(), ns = ct_none();
    int got = 0, r = -1;
    if (eval(rs, f, first, &old) < 0) return -1;
    for (; got < nrest; got++) {
        ct_value v;
        if (eval(rs, f, rest[got], &v) < 0) goto done;
        parts[got] = concat ? ct_str_of(rs, v) : v;
        if (concat) ct_decref(v);
        if (parts[got].type == CT_NONE && concat) goto done;
    }
    ns = lookup(rs, f, t->name);
    ct_value *slot = ns.type == CT_NS ? ct_dict_get_str(ct_d(ns), t->name2, strlen(t->name2)) : NULL;
    bool fast = slot && old.type == CT_STR && slot->type == CT_STR && slot->u.o == old.u.o && old.u.o->rc == 2;
    for (int i = 0; fast && i < nrest; i++)
        fast = parts[i].type == CT_STR && (concat || (!ct_s(parts[i])->markup && !ct_s(old)->markup));
    if (fast) {
        *slot = ct_none();  // the slot's reference is ours now: the string is exclusively held
        ct_decref(old);
        rs->line = n->line;
        if (!ct_str_append(rs, &old, parts, nrest)) {
            ct_decref(old);
            old = ct_none();
            goto done;
        }
        *slot = old;
        old = ct_none();
        r = 0;
        goto done;
    }
    rs->line = n->line;
    if (concat) {
        ct_value all[9];
        all[0] = ct_str_of(rs, old);
        if (all[0].type != CT_STR) goto done;
        for (int i = 0; i < nrest; i++) all[i + 1] = parts[i];
        res = ct_str_join(rs, all, nrest + 1);
        ct_decref(all[0]);
        if (res.type != CT_STR) goto done;
    } else if (binop(rs, OP_ADD, old, parts[0], &res) < 0) {
        goto done;
    }
    r = assign(rs, f, t, res);
    res = ct_none();
done:
    ct_decref(old);
    ct_decref(ns);
    ct_decref(res);
    for (int i = 0; i < got; i++) ct_decref(parts[i]);
    return r;
}

static int exec_stmt(ct_rs *rs, ct_frame *f, const ct_node *n) {
    ct_value v;
    int r;
    rs->steps += 1 + (int64_t)ct_work;
    ct_work = 0;
    if (rs->steps > CT_MAX_STEPS) return FAIL_AT(rs, n, "template exceeded %d evaluation steps", CT_MAX_STEPS);
    if (stack_exhausted(rs)) return FAIL_AT(rs, n, "template evaluation nested too deeply");
    rs->line = n->line;
    switch (n->kind) {
    case S_OUTPUT:
        for (int i = 0; i < n->nkids; i++) {
            const ct_node *k = n->kids[i];
            if (k->kind == N_CONST && k->val.type == CT_STR) {
                if (!ct_buf_put(rs, rs->out, ct_s(k->val)->s, ct_s(k->val)->len)) return -1;
                if (rs->out->n > CT_MAX_OUTPUT) return FAIL_AT(rs, k, "output exceeds %u MiB", CT_MAX_OUTPUT >> 20);
                continue;
            }
            if (eval(rs, f, k, &v) < 0) return -1;
            rs->line = k->line;
            r = output(rs, v);
            ct_decref(v);
            if (r < 0) return -1;
        }
        return 0;
    case S_IF:
        if (eval(rs, f, n->a, &v) < 0) return -1;
        r = ct_truthy(v);
        ct_decref(v);
        return r ? exec_body(rs, f, n->kids, n->nkids) : exec_body(rs, f, n->kids2, n->nkids2);
    case S_FOR:
        if (++rs->eval_depth > CT_MAX_EVAL_DEPTH) {
            rs->eval_depth--;
            return FAIL_AT(rs, n, "template evaluation nested too deeply");
        }
        r = exec_for(rs, f, n);
        rs->eval_depth--;
        return r;
    case S_SET:
        if (n->a->kind == N_NSREF && (r = set_ns_append(rs, f, n)) != 1) return r;
        if (eval(rs, f, n->b, &v) < 0) return -1;
        return assign(rs, f, n->a, v);
    case S_SETBLOCK:
        if (capture(rs, f, n->kids, n->nkids, &v) < 0) return -1;
        if (n->b) {
            ct_value fv;
            r = eval_filter(rs, f, n->b, &v, &fv);
            ct_decref(v);
            if (r < 0) return -1;
            v = fv;
        }
        return assign(rs, f, n->a, v);
    case S_MACRO:
    case S_CALLBLOCK: {
        if (!ct_budget(rs, sizeof(ct_macro))) return -1;
        ct_macro *m = calloc(1, sizeof *m);
        if (!m) {
            ct_release(sizeof(ct_macro));
            return FAIL_AT(rs, n, "out of memory");
        }
        m->h.rc = 1;
        m->h.type = CT_MACRO;
        m->h.acct = sizeof(ct_macro);
        m->def = n;
        m->frame_serial = f->serial;
        m->is_caller = n->kind == S_CALLBLOCK;
        v = (ct_value){.type = CT_MACRO};
        v.u.o = &m->h;
        if (n->kind == S_MACRO) return frame_set(rs, f, n->name, v) ? 0 : -1;
        return exec_callblock(rs, f, n, v);
    }
    case S_FILTERBLOCK: {
        if (capture(rs, f, n->kids, n->nkids, &v) < 0) return -1;
        ct_value fv;
        r = eval_filter(rs, f, n->b, &v, &fv);
        ct_decref(v);
        if (r < 0) return -1;
        r = output(rs, fv);
        ct_decref(fv);
        return r;
    }
    case S_WITH: {
        ct_frame fr;
        frame_init(rs, &fr, f);
        r = 0;
        for (int i = 0; i < n->nnames && r == 0; i++) {
            r = eval(rs, f, n->kids2[i], &v);
            if (r == 0) r = frame_set(rs, &fr, n->names[i], v) ? 0 : -1;
        }
        if (r == 0) r = exec_body(rs, &fr, n->kids, n->nkids);
        frame_done(rs, &fr);
        return r;
    }
    case S_BLOCK: {
        ct_frame fr;
        frame_init(rs, &fr, f);
        r = exec_body(rs, &fr, n->kids, n->nkids);
        frame_done(rs, &fr);
        return r;
    }
    case S_BREAK: return R_BREAK;
    case S_CONTINUE: return R_CONTINUE;
    default: return FAIL_AT(rs, n, "cannot execute this node as a statement");
    }
}

static int exec_body(ct_rs *rs, ct_frame *f, ct_node *const *kids, int nkids) {
    for (int i = 0; i < nkids; i++) {
        int r = exec_stmt(rs, f, kids[i]);
        if (r != R_OK) return r;
    }
    return R_OK;
}

// ---- render entry point ----
int ct_render(const ct_template_ast *ast, const cJSON *context, char **out, size_t *out_len) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!ast || !out) return kaon_set_error("chat template: NULL argument");
    if (context && !cJSON_IsObject(context)) return kaon_set_error("chat template: the context must be a JSON object");
    ct_rs rs;
    memset(&rs, 0, sizeof rs);
    rs.stack_base = (uintptr_t)&rs;
    ct_work = 0;
    ct_release((size_t)-1);  // the per-thread live-bytes counter starts from zero
    ct_buf buf = {0};
    rs.out = &buf;
    rs.ctx = context ? ct_from_cjson(&rs, context, 0) : ct_dict_new(&rs, 0, CT_DICT);
    int r = -1;
    if (!rs.failed && rs.ctx.type == CT_DICT) {
        ct_frame root;
        frame_init(&rs, &root, NULL);
        rs.root = &root;
        r = exec_body(&rs, &root, ast->body, ast->nbody);
        frame_done(&rs, &root);
        rs.root = NULL;
    }
    ct_decref(rs.ctx);
    // namespaces may reference each other (or themselves): empty them all, then release
    for (size_t i = 0; i < rs.nns; i++) {
        ct_dict *d = ct_d(rs.nss[i]);
        for (size_t k = 0; k < d->n; k++) {
            ct_value kk = d->k[k], vv = d->v[k];
            d->k[k] = ct_none();
            d->v[k] = ct_none();
            ct_decref(kk);
            ct_decref(vv);
        }
        d->n = 0;
    }
    for (size_t i = 0; i < rs.nns; i++) ct_decref(rs.nss[i]);
    free(rs.nss);
    if (r < 0 || rs.failed) {
        ct_buf_free(&buf);
        if (!rs.failed) return kaon_set_error("chat template: render failed");
        if (rs.line > 0) return kaon_set_error("chat template line %d: %s", rs.line, rs.err);
        return kaon_set_error("chat template: %s", rs.err);
    }
    if (!buf.p) {
        buf.p = malloc(1);
        if (!buf.p) return kaon_set_error("chat template: out of memory");
        buf.p[0] = 0;
    }
    *out = buf.p;
    if (out_len) *out_len = buf.n;
    return 0;
}
