// Internals of the chat-template interpreter (chat_template*.c): values, AST, render state.
// Not a public header: only the chat_template_*.c files include it.
//
// The interpreter mirrors jinja2 3.1 as Hugging Face transformers configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols): Python value
// semantics (str() / repr() / truthiness / == / slicing by code point), the sandbox's rules
// (no list.append, range() capped at 100000) and jinja2's default Undefined.
#ifndef KAON_TEMPLATE_CHAT_TEMPLATE_INTERNAL_H
#define KAON_TEMPLATE_CHAT_TEMPLATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/err.h"

// ---- limits (a template is untrusted input: everything it can grow is capped) ----
#define CT_MAX_ITERS 1000000            // loop iterations per render, all loops together
#define CT_MAX_CALL_DEPTH 64            // nested macro / caller calls
#define CT_MAX_NEST 100                 // syntactic nesting (parentheses, not, blocks) at parse
#define CT_MAX_AST_DEPTH 256            // height of any AST subtree
#define CT_MAX_EVAL_DEPTH 2000          // evaluator recursion, all nested calls together
#define CT_MAX_STACK (512u << 10)       // C stack the evaluator may use below ct_render's frame
#define CT_MAX_OUTPUT (16u << 20)       // rendered bytes
#define CT_MAX_STR (16u << 20)          // bytes in any one string value
#define CT_MAX_LIST 1000000             // elements in any one list / dict
#define CT_MAX_RANGE 100000             // jinja2's sandbox MAX_RANGE
#define CT_MAX_VALUE_DEPTH 1100         // nesting of list/dict values (cJSON allows 1000)
#define CT_MAX_LIVE ((size_t)512 << 20)  // bytes of values alive at once during one render
#define CT_MAX_STEPS 20000000           // AST nodes evaluated (+ builtin work units) per render
#define CT_MAX_SOURCE (4u << 20)        // template source bytes

// ---- values ----
enum ct_type {
    CT_UNDEF,   // jinja2 Undefined; u.cs: the missing name (borrowed from the AST or static)
    CT_NONE,
    CT_BOOL,
    CT_INT,
    CT_FLOAT,
    CT_FUNC,    // a global function (range, namespace, ...): u.i is its id
    // types below carry a refcounted object in u.o
    CT_STR,
    CT_LIST,    // list or tuple (ct_list.tuple)
    CT_DICT,
    CT_NS,      // jinja2 namespace(): a ct_dict whose entries are attributes, mutable
    CT_MACRO,   // macro or call-block caller
    CT_METHOD,  // bound method, e.g. 'abc'.split
    CT_LOOP,    // the `loop` object of a for loop
};

// Undefined flavours (ct_value.sub for CT_UNDEF), for error messages: a missing variable
// (u.cs = name), attribute or key (u.cs = name or NULL), list index (u.i), an attribute the
// sandbox refuses (u.cs), or a free-form hint (u.cs). ct_value.aux is the type of the object
// the lookup failed on.
enum { CT_UNDEF_NAME, CT_UNDEF_ATTR, CT_UNDEF_INDEX, CT_UNDEF_UNSAFE, CT_UNDEF_HINT };

typedef struct ct_obj {
    int32_t rc;  // < 0: immortal (owned by a parsed template; shared between threads)
    uint8_t type;
    uint32_t acct;  // bytes counted against the render's memory budget (0: not counted)
} ct_obj;

typedef struct ct_value {
    uint8_t type;
    uint8_t sub;
    uint8_t aux;
    union {
        bool b;
        int64_t i;
        double f;
        ct_obj *o;
        const char *cs;
    } u;
} ct_value;

typedef struct ct_str {
    ct_obj h;
    uint32_t len;
    uint32_t cap;  // bytes allocated for s (>= len); grows only for in-place appends
    bool ascii;   // all bytes < 0x80: code point offsets are byte offsets
    bool markup;  // a markupsafe.Markup (from |safe / |escape): `+` escapes the other side
    char s[];    // NUL-terminated
} ct_str;

// What Python type a ct_list stands for: filters like map() return generators and
// dict.items() a view; they iterate like lists but print, compare and serialise differently.
enum { CT_LK_LIST, CT_LK_TUPLE, CT_LK_GEN, CT_LK_KEYS, CT_LK_VALUES, CT_LK_ITEMS };

typedef struct ct_list {
    ct_obj h;
    bool tuple;      // kind == CT_LK_TUPLE
    uint8_t kind;
    uint16_t depth;  // 1 + deepest contained list/dict
    size_t n, cap;
    ct_value *v;
} ct_list;

typedef struct ct_dict {  // insertion-ordered, like a Python dict
    ct_obj h;
    uint16_t depth;
    size_t n, cap;
    ct_value *k, *v;
    int32_t *idx;  // open-addressing hash index over k (NULL while small)
    size_t idxcap;
} ct_dict;

struct ct_node;

typedef struct ct_macro {
    ct_obj h;
    const struct ct_node *def;  // S_MACRO or S_CALLBLOCK
    uint64_t frame_serial;      // frame it was defined in (looked up among live frames)
    bool is_caller;
} ct_macro;

typedef struct ct_method {
    ct_obj h;
    uint16_t depth;  // 1 + depth of self: values that hold values count towards the nesting cap
    ct_value self;
    int id;  // CT_M_*
} ct_method;

typedef struct ct_loop {
    ct_obj h;
    uint16_t depth_cap;  // 1 + depth of items (nesting cap, see ct_method)
    ct_list *items;      // the (filtered) sequence being iterated
    int64_t idx;     // index0 of the current item
    int depth;
    ct_value changed_last;
    bool has_changed;
} ct_loop;

// ---- AST ----
enum ct_nkind {
    // expressions
    N_CONST, N_NAME, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_LIST,
    N_TUPLE, N_DICT, N_BINOP, N_UNARY, N_NOT, N_AND, N_OR, N_COMPARE, N_CONCAT, N_CONDEXPR,
    N_NSREF,
    // statements
    S_OUTPUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK, S_WITH,
    S_BREAK, S_CONTINUE, S_BLOCK,
};

enum ct_op {
    OP_NONE, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_POW, OP_MOD, OP_TILDE,
    OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE, OP_RBRACE, OP_EQ, OP_NE,
    OP_GT, OP_GTEQ, OP_LT, OP_LTEQ, OP_ASSIGN, OP_DOT, OP_COLON, OP_PIPE, OP_COMMA,
    OP_SEMICOLON,
    OP_IN, OP_NOTIN,  // comparison-only operators
};

typedef struct ct_node {
    uint8_t kind;
    uint8_t op;
    uint8_t flags;  // S_MACRO: CT_MF_*; S_FOR: recursive
    int line;
    struct ct_node *a, *b, *c;
    struct ct_node **kids;   // args / items / keys / body / compare operands
    int nkids;
    struct ct_node **kids2;  // kwarg values / dict values / else-body / macro defaults
    int nkids2;
    const char **names;      // kwarg names / macro params / with-targets
    int nnames;
    uint8_t *ops;            // N_COMPARE: one OP_* per operand
    const char *name;        // N_NAME, N_GETATTR, N_FILTER, N_TEST, S_MACRO, N_NSREF var
    const char *name2;       // N_NSREF attribute
    int fid;                 // N_FILTER / N_TEST: builtin id, -1 when unknown
    int depth;               // height of the subtree (bounded at parse: evaluation recurses)
    ct_value val;            // N_CONST (immortal)
} ct_node;

enum { CT_MF_CALLER = 1, CT_MF_VARARGS = 2, CT_MF_KWARGS = 4 };

// ---- render state ----
typedef struct ct_buf {
    char *p;
    size_t n, cap;
    size_t acct;  // bytes counted against the memory budget
} ct_buf;

typedef struct ct_frame {
    struct ct_frame *parent;     // lexical parent (NULL for the root frame)
    struct ct_frame *live_prev;  // stack of live frames (for macro closures)
    uint64_t serial;
    int n, cap;
    const char **names;
    ct_value *vals;
} ct_frame;

typedef struct ct_rs {
    ct_buf *out;         // current output (swapped while capturing set blocks / macros)
    ct_frame *root;
    ct_frame *live;      // innermost live frame
    uint64_t next_serial;
    ct_value ctx;        // CT_DICT of the render's context variables
    int64_t iters, steps;
    int call_depth;
    int eval_depth;
    uintptr_t stack_base;  // address of a local in ct_render: the stack guard's origin
    int line;            // line of the node being evaluated
    bool failed;
    char err[512];
    ct_value *nss;       // every namespace created, freed (cycles broken) at the end
    size_t nns, nscap;
} ct_rs;

// ---- value API (chat_template_value.c) ----
// Every ct_value returned by a function is owned by the caller (one reference).
int ct_fail(ct_rs *rs, const char *fmt, ...) KAON_PRINTF(2, 3);
// Memory accounting: ct_budget() counts `bytes` as live (false + error over CT_MAX_LIVE; a
// NULL rs counts nothing) and charges the copy as work (1 unit per KiB); ct_release()
// returns them. Objects remember what they were charged (ct_obj.acct) and release it when
// freed. The counter is per thread: a render runs on one thread.
bool ct_budget(ct_rs *rs, size_t bytes);
void ct_release(size_t bytes);
// Work done inside builtins (element comparisons, bytes scanned): folded into the step
// count by the evaluator, so a loop of cheap-looking expressions over big values cannot hang.
extern _Thread_local uint64_t ct_work;
static inline void ct_add_work(uint64_t units) { ct_work += units; }

static inline ct_value ct_undef(void) { ct_value v = {.type = CT_UNDEF}; return v; }
static inline ct_value ct_undef_named(int kind, const char *name) {
    ct_value v = {.type = CT_UNDEF, .sub = (uint8_t)kind};
    v.u.cs = name;
    return v;
}
static inline ct_value ct_none(void) { ct_value v = {.type = CT_NONE}; return v; }
static inline ct_value ct_bool(bool b) { ct_value v = {.type = CT_BOOL}; v.u.b = b; return v; }
static inline ct_value ct_int(int64_t i) { ct_value v = {.type = CT_INT}; v.u.i = i; return v; }
static inline ct_value ct_float(double f) { ct_value v = {.type = CT_FLOAT}; v.u.f = f; return v; }
static inline bool ct_isobj(ct_value v) { return v.type >= CT_STR; }
static inline ct_str *ct_s(ct_value v) { return (ct_str *)v.u.o; }
static inline ct_list *ct_l(ct_value v) { return (ct_list *)v.u.o; }
static inline ct_dict *ct_d(ct_value v) { return (ct_dict *)v.u.o; }

void ct_incref(ct_value v);
void ct_decref(ct_value v);
static inline ct_value ct_ref(ct_value v) { ct_incref(v); return v; }
void ct_make_immortal(ct_value v);  // for AST constants; recursive
void ct_free_immortal(ct_value v);

// strings (NULL rs: no budget accounting, used by the parser)
ct_value ct_str_new(ct_rs *rs, const char *s, size_t len);  // type CT_NONE on failure
ct_value ct_str_cat(ct_rs *rs, const char *a, size_t an, const char *b, size_t bn);
ct_value ct_str_join(ct_rs *rs, const ct_value *parts, int n);  // all CT_STR
// Appends parts to *s in place (s must be exclusively owned: rc == 1); may move it.
bool ct_str_append(ct_rs *rs, ct_value *s, const ct_value *parts, int n);
size_t ct_str_cplen(const ct_str *s);
// UTF-8: lenient decode (invalid bytes come back as U+DC80+byte, like surrogateescape).
uint32_t ct_u8_decode(const unsigned char *s, size_t n, size_t *adv);
int ct_u8_encode(uint32_t cp, char out[4]);
bool ct_is_space(uint32_t cp);  // Python str.isspace()

// buffers
bool ct_buf_put(ct_rs *rs, ct_buf *b, const char *s, size_t n);
static inline bool ct_buf_puts(ct_rs *rs, ct_buf *b, const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return ct_buf_put(rs, b, s, n);
}
void ct_buf_free(ct_buf *b);
ct_value ct_buf_take(ct_rs *rs, ct_buf *b);  // string value, frees the buffer

// lists / dicts
ct_value ct_list_new(ct_rs *rs, size_t cap, bool tuple);
ct_value ct_list_new_kind(ct_rs *rs, size_t cap, int kind);
bool ct_list_push(ct_rs *rs, ct_value list, ct_value v);  // steals v
ct_value ct_dict_new(ct_rs *rs, size_t cap, uint8_t type);
bool ct_dict_set(ct_rs *rs, ct_value dict, ct_value k, ct_value v);  // steals k and v
ct_value *ct_dict_get(const ct_dict *d, ct_value k);  // borrowed; NULL when absent
ct_value *ct_dict_get_str(const ct_dict *d, const char *k, size_t klen);
bool ct_hashable(ct_value v);
uint16_t ct_val_depth(ct_value v);  // nesting depth of a value (0 for scalars)

// Python semantics
bool ct_truthy(ct_value v);
bool ct_eq(ct_value a, ct_value b);
int ct_cmp(ct_rs *rs, ct_value a, ct_value b, int *res);  // -1 + error when unorderable
const char *ct_type_name(ct_value v);
bool ct_to_str(ct_rs *rs, ct_buf *b, ct_value v);   // str(v)
bool ct_to_repr(ct_rs *rs, ct_buf *b, ct_value v);  // repr(v)
ct_value ct_str_of(ct_rs *rs, ct_value v);          // str(v) as a value (NONE on error)
void ct_float_repr(double x, char out[40]);
typedef struct ct_json_opts {
    bool ensure_ascii, sort_keys;
    const char *indent;  // NULL: compact; else the indent unit
    const char *item_sep, *key_sep;
} ct_json_opts;
bool ct_to_json(ct_rs *rs, ct_buf *b, ct_value v, const ct_json_opts *o);
ct_value ct_from_cjson(ct_rs *rs, const cJSON *j, int depth);

// ---- parser (chat_template_parse.c) ----
typedef struct ct_arena ct_arena;
typedef struct ct_template_ast {
    ct_arena *arena;
    ct_node **body;
    int nbody;
    ct_value *consts;  // immortal constants the AST points at, freed with it
    size_t nconsts, constcap;
} ct_template_ast;
int ct_parse(const char *src, size_t len, ct_template_ast *out);  // -1 + kaon_set_error
void ct_ast_free(ct_template_ast *t);

// ---- evaluator (chat_template_eval.c) ----
// Renders a parsed template with `context` (a JSON object, or NULL) as the variables.
int ct_render(const ct_template_ast *ast, const cJSON *context, char **out, size_t *out_len);

// ---- builtins (chat_template_builtins.c) ----
int ct_filter_id(const char *name);  // -1 when unknown
int ct_test_id(const char *name);
const char *ct_filter_name(int id);
const char *ct_test_name(int id);

// Positional + keyword arguments of a call, already evaluated (borrowed).
typedef struct ct_args {
    ct_value *pos;
    int npos;
    const char **kwn;
    ct_value *kwv;
    int nkw;
} ct_args;

int ct_apply_filter(ct_rs *rs, int id, const char *name, ct_value in, ct_args *a, ct_value *out);
int ct_apply_test(ct_rs *rs, int id, const char *name, ct_value in, ct_args *a, bool *out);
// Attribute lookup with jinja2 sandbox semantics (attribute first, then item). `name` must
// outlive the render (it may become the hint of an Undefined).
int ct_getattr(ct_rs *rs, ct_value obj, const char *name, ct_value *out);
const char *ct_method_name(int id);
// Item lookup (item first, then attribute); `key` is borrowed.
int ct_getitem(ct_rs *rs, ct_value obj, ct_value key, ct_value *out);
int ct_call_method(ct_rs *rs, ct_method *m, ct_args *a, ct_value *out);
int ct_call_func(ct_rs *rs, int id, ct_args *a, ct_value *out);
ct_value ct_global(const char *name);  // CT_UNDEF when not a global
int ct_iterate(ct_rs *rs, ct_value v, ct_value *list_out);  // materialise for iteration
int ct_slice(ct_rs *rs, ct_value obj, ct_value start, ct_value stop, ct_value step, ct_value *out);

// ---- evaluator hooks used by builtins (chat_template_eval.c) ----
int ct_call_value(ct_rs *rs, ct_value callee, ct_args *a, ct_value *out);
int ct_py_format(ct_rs *rs, ct_value fmt, ct_value args, ct_value *out);  // str % args
int ct_html_escape(ct_rs *rs, ct_value v, ct_value *out);  // markupsafe.escape
int ct_undef_error(ct_rs *rs, ct_value u);  // jinja2's UndefinedError for using `u`
bool ct_register_ns(ct_rs *rs, ct_value ns);

#endif
