// JSON Schema -> GBNF. Every schema node becomes one rule (so deep schemas do not nest GBNF
// groups past the parser's limit); each $ref target becomes one rule generated once, which is
// how recursive data schemas turn into recursive rules. Objects list their properties in the
// schema's order. Whitespace is fixed by policy (see kaon_json_schema_opts) so a small model
// has no free-form bytes to loop on. The strings and numbers here are conservative: every text
// the grammar accepts is valid for the schema; some valid texts (other key orders, exponents,
// fractions on bounded numbers below zero) are not generated.
#include "grammar/json_schema.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema_internal.h"
#include "grammar/regex_gbnf.h"
#include "util/err.h"

// Limits on hostile schemas.
#define JS_MAX_SCHEMA_BYTES (256 * 1024)
#define JS_MAX_DEPTH 48        // schema nodes nested inside each other
#define JS_MAX_RULES 4096      // rules this converter writes (repetitions add more at parse)
#define JS_MAX_ENUM 1024       // enum members
#define JS_MAX_COUNT 1024      // minItems/maxItems/minLength/maxLength/properties
#define JS_ANY_DEPTH 8         // nesting of a free-form JSON value
#define JS_NAME 96

enum { SH_CHAR = 1, SH_STRING = 2, SH_INTEGER = 4, SH_NUMBER = 8, SH_VALUE = 16, SH_WS = 32 };

typedef struct {
    const cJSON *node;
    char name[JS_NAME];
    int struct_depth;  // objects/arrays open when its generation began
    bool done;
} js_ref;

typedef struct {
    gbnf_text *out;
    char root[JS_NAME / 2];
    const cJSON *doc;
    kaon_json_schema_opts opts;
    int n_rules, depth, struct_depth;
    js_ref *refs;
    int n_refs, cap_refs;
    unsigned shared;
    char sep[JS_NAME];    // after ':' and ','
    char inner[JS_NAME + 2];  // after '{' '[', before '}' ']' ',' ':' (empty by default)
    char ptr[512];        // JSON pointer of the node being converted
} conv;

static int fail(conv *c, const char *fmt, ...) KAON_PRINTF(2, 3);
static int fail(conv *c, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kaon_set_error("json schema: at #%s: %s", c->ptr, msg);
}

// Pointer segments pushed while descending; returns the old length to pop back to.
static size_t push_ptr(conv *c, const char *seg) {
    size_t old = strlen(c->ptr), n = old;
    if (n + 2 < sizeof c->ptr) c->ptr[n++] = '/';
    for (const char *p = seg; *p && n + 3 < sizeof c->ptr; p++) {
        if (*p == '~' || *p == '/') {
            c->ptr[n++] = '~';
            c->ptr[n++] = *p == '~' ? '0' : '1';
        } else {
            c->ptr[n++] = *p;
        }
    }
    c->ptr[n] = 0;
    return old;
}
static size_t push_index(conv *c, const char *key, int i) {
    size_t old = push_ptr(c, key);
    char b[16];
    snprintf(b, sizeof b, "%d", i);
    push_ptr(c, b);
    return old;
}
static void pop_ptr(conv *c, size_t old) { c->ptr[old] = 0; }

static int new_name(conv *c, char *name) {
    if (++c->n_rules > JS_MAX_RULES) return fail(c, "schema needs more than %d rules", JS_MAX_RULES);
    snprintf(name, JS_NAME, "%s-%d", c->root, c->n_rules);
    return 0;
}

static int emit_rule(conv *c, const char *name, const gbnf_text *body) {
    gbnf_printf(c->out, "%s ::= %s\n", name, body->s ? body->s : "\"\"");
    if (c->out->oom || body->oom) return fail(c, "out of memory");
    if (c->out->len > KAON_GRAMMAR_MAX_TEXT) return fail(c, "grammar would exceed %d bytes", KAON_GRAMMAR_MAX_TEXT);
    return 0;
}

// ---- shared rules: JSON strings, numbers, whitespace, free-form values ----

static void emit_any_values(conv *c);

static const char *shared(conv *c, unsigned which) {
    static _Thread_local char name[JS_NAME];
    const char *r = c->root;
    if (!(c->shared & which)) {
        c->shared |= which;
        switch (which) {
        case SH_CHAR:  // any character but '"', '\' and controls, or an escape
            // \u escapes of surrogates are left out: a pair is one character to JSON Schema's
            // minLength but two here (characters above U+FFFF are written as themselves)
            gbnf_printf(c->out,
                        "%s-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CeEfF] "
                        "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n",
                        r);
            break;
        case SH_STRING:
            shared(c, SH_CHAR);
            gbnf_printf(c->out, "%s-string ::= \"\\\"\" %s-char* \"\\\"\"\n", r, r);
            break;
        case SH_INTEGER:
            gbnf_printf(c->out, "%s-integer ::= \"0\" | \"-\"? [1-9] [0-9]{0,%d}\n", r, JS_MAX_INT_DIGITS - 1);
            break;
        case SH_NUMBER:
            gbnf_printf(c->out, "%s-number ::= \"-\"? (\"0\" | [1-9] [0-9]{0,%d}) (\".\" [0-9]{1,%d})? ([eE] [-+]? [0-9]{1,2})?\n",
                        r, JS_MAX_INT_DIGITS - 1, JS_MAX_FRACTION_DIGITS);
            break;
        case SH_WS:
            gbnf_printf(c->out, "%s-ws ::= [ \\t\\n\\r]{0,16}\n", r);
            break;
        case SH_VALUE:
            emit_any_values(c);
            break;
        }
    }
    static const char *suffix[] = {"char", "string", "integer", "number", "value-0", "ws"};
    int i = 0;
    while ((1u << i) != which) i++;
    snprintf(name, sizeof name, "%s-%s", r, suffix[i]);
    return name;
}

// value-d: any JSON value with at most JS_ANY_DEPTH - d more levels of nesting.
static void emit_any_values(conv *c) {
    const char *r = c->root;
    char str[JS_NAME], num[JS_NAME];
    snprintf(str, sizeof str, "%s", shared(c, SH_STRING));
    snprintf(num, sizeof num, "%s", shared(c, SH_NUMBER));
    const char *in = c->inner, *sep = c->sep;
    for (int d = 0; d <= JS_ANY_DEPTH; d++) {
        gbnf_printf(c->out, "%s-value-%d ::= %s | %s | \"true\" | \"false\" | \"null\" | %s-object-%d | %s-array-%d\n",
                    r, d, str, num, r, d, r, d);
        if (d == JS_ANY_DEPTH) {  // the innermost level: only empty containers
            gbnf_printf(c->out, "%s-object-%d ::= \"{\" %s\"}\"\n%s-array-%d ::= \"[\" %s\"]\"\n", r, d, in, r, d, in);
            continue;
        }
        gbnf_printf(c->out,
                    "%s-object-%d ::= \"{\" %s(%s %s\":\" %s %s-value-%d (%s\",\" %s %s %s\":\" %s %s-value-%d)* %s)? \"}\"\n",
                    r, d, in, str, in, sep, r, d + 1, in, sep, str, in, sep, r, d + 1, in);
        gbnf_printf(c->out, "%s-array-%d ::= \"[\" %s(%s-value-%d (%s\",\" %s %s-value-%d)* %s)? \"]\"\n", r, d, in, r,
                    d + 1, in, sep, r, d + 1, in);
    }
}

static void init_conv(conv *c, const char *root, const kaon_json_schema_opts *opts, gbnf_text *out) {
    memset(c, 0, sizeof *c);
    c->out = out;
    snprintf(c->root, sizeof c->root, "%s", root);
    if (opts) c->opts = *opts;
    if (c->opts.any_whitespace) {
        snprintf(c->sep, sizeof c->sep, "%s", shared(c, SH_WS));
        snprintf(c->inner, sizeof c->inner, "%s ", c->sep);
    } else {
        snprintf(c->sep, sizeof c->sep, "\" \"?");
    }
}

static bool valid_root_name(const char *root) {
    size_t n = strlen(root);
    if (!n || n >= JS_NAME / 2) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = root[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_'))
            return false;
    }
    return true;
}

// ---- keywords ----

static const char *const ANNOTATIONS[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "discriminator", "contentMediaType", "contentEncoding", "$anchor", NULL};
static const char *const UNSUPPORTED[] = {
    "not", "if", "then", "else", "multipleOf", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "contains", "minContains", "maxContains", "minProperties",
    "maxProperties", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", NULL};

static bool in_list(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

static const cJSON *get(const cJSON *s, const char *key) { return cJSON_GetObjectItemCaseSensitive(s, key); }

// Keywords of s other than annotations and `except`: a combinator must stand alone.
static const char *other_constraint(const cJSON *s, const char *except) {
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, except) && !in_list(ANNOTATIONS, k->string)) return k->string;
    return NULL;
}

// A non-negative integer keyword (minItems...): default when absent; -2 when malformed.
static long count_keyword(const cJSON *s, const char *key, long dflt) {
    const cJSON *v = get(s, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) return -2;
    return v->valuedouble > 1e9 ? 1000000000L : (long)v->valuedouble;
}

static int schema_rule(conv *c, const cJSON *s, char *name);

// A JSON string literal as GBNF: the key's JSON text (with its quotes and escapes) matched exactly.
static int json_text_literal(conv *c, const cJSON *v, gbnf_text *body) {
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt) return fail(c, "out of memory");
    gbnf_literal(body, txt, strlen(txt));
    cJSON_free(txt);
    return 0;
}

static int key_literal(conv *c, const char *key, gbnf_text *body) {
    cJSON *k = cJSON_CreateString(key);
    if (!k) return fail(c, "out of memory");
    int rc = json_text_literal(c, k, body);
    cJSON_Delete(k);
    return rc;
}

// ---- $ref ----

static const cJSON *resolve_ref(conv *c, const char *ref) {
    if (ref[0] != '#') {
        fail(c, "only local $ref (#...) is supported, not '%.80s'", ref);
        return NULL;
    }
    const cJSON *node = c->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        fail(c, "$ref anchors are not supported: '%.80s'", ref);
        return NULL;
    }
    while (*p == '/' && node) {
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof seg) seg[n++] = ch;
        }
        seg[n] = 0;
        if (cJSON_IsArray(node)) {
            char *end;
            long i = strtol(seg, &end, 10);
            node = *seg && !*end && i >= 0 ? cJSON_GetArrayItem(node, (int)i) : NULL;
        } else if (cJSON_IsObject(node)) {
            node = get(node, seg);
        } else {
            node = NULL;
        }
    }
    if (!node) fail(c, "unresolvable $ref '%.80s'", ref);
    return node;
}

static int schema_body(conv *c, const cJSON *s, gbnf_text *body);

// The rule of a $ref target, generated the first time it is referenced.
static int ref_rule(conv *c, const cJSON *target, const char *ref, char *name) {
    for (int i = 0; i < c->n_refs; i++) {
        if (c->refs[i].node != target) continue;
        // recursion that has not entered an object or array would be left recursion
        if (!c->refs[i].done && c->refs[i].struct_depth == c->struct_depth)
            return fail(c, "$ref '%.80s' refers back to itself without an object or array in between", ref);
        snprintf(name, JS_NAME, "%s", c->refs[i].name);
        return 0;
    }
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 16;
        js_ref *r = realloc(c->refs, (size_t)cap * sizeof *r);
        if (!r) return fail(c, "out of memory");
        c->refs = r;
        c->cap_refs = cap;
    }
    if (c->depth + 1 > JS_MAX_DEPTH) return fail(c, "$ref chain deeper than %d", JS_MAX_DEPTH);
    int idx = c->n_refs++;
    c->refs[idx] = (js_ref){.node = target, .struct_depth = c->struct_depth};
    if (new_name(c, c->refs[idx].name)) return -1;
    snprintf(name, JS_NAME, "%s", c->refs[idx].name);
    char saved[sizeof c->ptr];
    memcpy(saved, c->ptr, sizeof saved);
    snprintf(c->ptr, sizeof c->ptr, "%s", ref + 1);
    gbnf_text body = {0};
    c->depth++;
    int rc = schema_body(c, target, &body);
    c->depth--;
    if (!rc) rc = emit_rule(c, name, &body);
    gbnf_text_free(&body);
    memcpy(c->ptr, saved, sizeof saved);
    c->refs[idx].done = true;
    return rc;
}

// ---- strings ----

static int format_body(conv *c, const char *fmt, gbnf_text *b) {
    (void)c;
    // day ranges per month (February to 28: leap years are not worth a grammar); years 1000-9999
    static const char *DATE = "[1-9] [0-9]{3} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | "
                              "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
                              "\"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))";
    static const char *TIME = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                              "(\"Z\" | [+\\-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
    if (!strcmp(fmt, "date")) {
        gbnf_printf(b, "\"\\\"\" %s \"\\\"\"", DATE);
    } else if (!strcmp(fmt, "time")) {
        gbnf_printf(b, "\"\\\"\" %s \"\\\"\"", TIME);
    } else if (!strcmp(fmt, "date-time")) {
        gbnf_printf(b, "\"\\\"\" %s \"T\" %s \"\\\"\"", DATE, TIME);
    } else if (!strcmp(fmt, "uuid")) {
        gbnf_puts(b, "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                     "[0-9a-fA-F]{12} \"\\\"\"");
    } else if (!strcmp(fmt, "email")) {  // a simple address: local@label(.label)+
        gbnf_puts(b, "\"\\\"\" [a-zA-Z0-9._+\\-]{1,64} \"@\" [a-zA-Z0-9]([a-zA-Z0-9\\-]{0,61} [a-zA-Z0-9])? "
                     "(\".\" [a-zA-Z0-9]([a-zA-Z0-9\\-]{0,61} [a-zA-Z0-9])?){1,4} \"\\\"\"");
    } else if (!strcmp(fmt, "ipv4")) {
        gbnf_puts(b, "\"\\\"\" ");
        for (int i = 0; i < 4; i++) {
            if (i) gbnf_puts(b, " \".\" ");
            js_int_range_expr(b, 0, 255);
        }
        gbnf_puts(b, " \"\\\"\"");
    } else {
        return 1;  // unknown formats are annotations
    }
    return 0;
}

static int string_body(conv *c, const cJSON *s, gbnf_text *b) {
    long min = count_keyword(s, "minLength", 0), max = count_keyword(s, "maxLength", -1);
    if (min == -2 || max == -2) return fail(c, "minLength/maxLength must be non-negative integers");
    bool bounded = get(s, "minLength") || get(s, "maxLength");
    const cJSON *pattern = get(s, "pattern"), *format = get(s, "format");
    if (pattern) {
        if (!cJSON_IsString(pattern)) return fail(c, "pattern must be a string");
        if (bounded) return fail(c, "pattern together with minLength/maxLength is not supported");
        char name[JS_NAME];
        if (new_name(c, name)) return -1;
        size_t old = push_ptr(c, "pattern");
        if (kaon_regex_to_gbnf(pattern->valuestring, strlen(pattern->valuestring), name, true, c->out)) {
            char why[200];
            snprintf(why, sizeof why, "%s", kaon_last_error());
            int rc = fail(c, "%s", why);
            pop_ptr(c, old);
            return rc;
        }
        pop_ptr(c, old);
        gbnf_printf(b, "\"\\\"\" %s \"\\\"\"", name);
        return 0;
    }
    if (cJSON_IsString(format)) {
        gbnf_text f = {0};
        bool known = format_body(c, format->valuestring, &f) == 0;
        if (known && !bounded) gbnf_append(b, f.s, f.len);
        gbnf_text_free(&f);
        if (known && bounded)
            return fail(c, "format '%.40s' together with minLength/maxLength is not supported", format->valuestring);
        if (known) return 0;
    }
    if (!bounded) {
        gbnf_puts(b, shared(c, SH_STRING));
        return 0;
    }
    if (min > JS_MAX_COUNT || max > JS_MAX_COUNT) return fail(c, "string lengths above %d are not supported", JS_MAX_COUNT);
    if (max >= 0 && min > max) return fail(c, "minLength exceeds maxLength");
    const char *ch = shared(c, SH_CHAR);
    if (max < 0)
        gbnf_printf(b, "\"\\\"\" %s{%ld,} \"\\\"\"", ch, min);
    else
        gbnf_printf(b, "\"\\\"\" %s{%ld,%ld} \"\\\"\"", ch, min, max);
    return 0;
}

// ---- numbers ----

// Integer bounds from minimum/maximum/exclusive*, clamped to what the grammar can write.
static int int_bounds(conv *c, const cJSON *s, int64_t *lo, int64_t *hi, double *max_real) {
    double l = -(double)JS_MAX_INT_VALUE, h = (double)JS_MAX_INT_VALUE;
    *max_real = INFINITY;
    const cJSON *mn = get(s, "minimum"), *mx = get(s, "maximum");
    const cJSON *emn = get(s, "exclusiveMinimum"), *emx = get(s, "exclusiveMaximum");
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx))) return fail(c, "minimum/maximum must be numbers");
    bool old_emn = cJSON_IsTrue(emn), old_emx = cJSON_IsTrue(emx);  // draft-04 booleans
    if (mn) l = fmax(l, old_emn ? floor(mn->valuedouble) + 1 : ceil(mn->valuedouble));
    if (mx) {
        h = fmin(h, old_emx ? ceil(mx->valuedouble) - 1 : floor(mx->valuedouble));
        *max_real = mx->valuedouble;
    }
    if (cJSON_IsNumber(emn)) l = fmax(l, floor(emn->valuedouble) + 1);
    if (cJSON_IsNumber(emx)) {
        h = fmin(h, ceil(emx->valuedouble) - 1);
        *max_real = fmin(*max_real, emx->valuedouble);
    }
    if (emn && !cJSON_IsNumber(emn) && !cJSON_IsBool(emn)) return fail(c, "exclusiveMinimum must be a number");
    if (emx && !cJSON_IsNumber(emx) && !cJSON_IsBool(emx)) return fail(c, "exclusiveMaximum must be a number");
    if (l > h) return fail(c, "no integer within the bounds the grammar can write (|x| < 1e15)");
    *lo = (int64_t)l;
    *hi = (int64_t)h;
    return 0;
}

static bool has_bounds(const cJSON *s) {
    return get(s, "minimum") || get(s, "maximum") || get(s, "exclusiveMinimum") || get(s, "exclusiveMaximum");
}

static int integer_body(conv *c, const cJSON *s, gbnf_text *b) {
    if (!has_bounds(s)) {
        gbnf_puts(b, shared(c, SH_INTEGER));
        return 0;
    }
    int64_t lo, hi;
    double mr;
    if (int_bounds(c, s, &lo, &hi, &mr)) return -1;
    js_int_range_expr(b, lo, hi);
    return 0;
}

// Bounded numbers: the integers in range, and fractions I.ddd for I >= 0 with I + 1 <= the
// maximum (so I.ddd < I + 1 stays in range). Negative fractions are not generated.
static int number_body(conv *c, const cJSON *s, gbnf_text *b) {
    if (!has_bounds(s)) {
        gbnf_puts(b, shared(c, SH_NUMBER));
        return 0;
    }
    int64_t lo, hi;
    double max_real;
    if (int_bounds(c, s, &lo, &hi, &max_real)) return -1;
    js_int_range_expr(b, lo, hi);
    int64_t flo = lo < 0 ? 0 : lo;
    double fhi_d = isinf(max_real) ? (double)JS_MAX_INT_VALUE : floor(max_real) - 1;
    if (fhi_d > (double)(JS_MAX_INT_VALUE)) fhi_d = (double)JS_MAX_INT_VALUE;
    if (fhi_d >= (double)flo) {
        gbnf_puts(b, " | ");
        js_int_range_expr(b, flo, (int64_t)fhi_d);
        gbnf_printf(b, " \".\" [0-9]{1,%d}", JS_MAX_FRACTION_DIGITS);
    }
    return 0;
}

// ---- objects ----

typedef enum { EXTRA_NONE, EXTRA_ANY, EXTRA_SCHEMA } extra_kind;

static int object_body(conv *c, const cJSON *s, gbnf_text *b) {
    const cJSON *props = get(s, "properties"), *req = get(s, "required"), *addl = get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "properties must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, "required must be an array");
    int n = cJSON_GetArraySize(props);
    if (n > JS_MAX_COUNT) return fail(c, "more than %d properties", JS_MAX_COUNT);
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return fail(c, "required must list strings");
        if (!get(props, r->valuestring))
            return fail(c, "required property '%.60s' is not listed in properties", r->valuestring);
    }
    extra_kind extra = addl ? (cJSON_IsFalse(addl) ? EXTRA_NONE : cJSON_IsTrue(addl) ? EXTRA_ANY : EXTRA_SCHEMA)
                            : (c->opts.strict ? EXTRA_NONE : EXTRA_ANY);
    if (extra == EXTRA_SCHEMA && !cJSON_IsObject(addl)) return fail(c, "additionalProperties must be a boolean or a schema");
    const char *in = c->inner, *sep = c->sep;
    c->struct_depth++;
    int rc = -1;
    char(*kv)[JS_NAME] = calloc((size_t)n + 1, JS_NAME);
    bool *required = calloc((size_t)n + 1, 1);
    char extra_kv[JS_NAME] = "", value[JS_NAME];
    if (!kv || !required) {
        fail(c, "out of memory");
        goto done;
    }
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) required[i] = true;
        size_t old = push_ptr(c, "properties");
        push_ptr(c, p->string);
        int e = schema_rule(c, p, value);
        pop_ptr(c, old);
        if (e) goto done;
        gbnf_text t = {0};
        if (key_literal(c, p->string, &t) || new_name(c, kv[i])) {
            gbnf_text_free(&t);
            goto done;
        }
        gbnf_printf(&t, " %s\":\" %s %s", in, sep, value);
        e = emit_rule(c, kv[i], &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    if (extra != EXTRA_NONE) {
        if (extra == EXTRA_ANY) {
            snprintf(value, sizeof value, "%s", shared(c, SH_VALUE));
        } else {
            size_t old = push_ptr(c, "additionalProperties");
            int e = schema_rule(c, addl, value);
            pop_ptr(c, old);
            if (e) goto done;
        }
        // extra keys cannot be listed ones: their values would have the listed schemas
        char key_rule[JS_NAME];
        const char **names = calloc((size_t)n + 1, sizeof *names);
        if (!names || new_name(c, key_rule)) {
            free(names);
            if (!names) fail(c, "out of memory");
            goto done;
        }
        int j = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next) names[j++] = p->string;
        int nodes = js_key_excluding(c->out, key_rule, names, n);
        free(names);
        if (nodes < 0) {
            fail(c, "out of memory");
            goto done;
        }
        c->n_rules += nodes;
        gbnf_text t = {0};
        gbnf_printf(&t, "%s %s\":\" %s %s", key_rule, in, sep, value);
        if (new_name(c, extra_kv) || emit_rule(c, extra_kv, &t)) {
            gbnf_text_free(&t);
            goto done;
        }
        gbnf_text_free(&t);
    }
    // after[i]: members i.. once something is written (each with its comma); first[i]: the
    // first member written is i or later. Names are <base>-a<i> and <base>-f<i>.
    char base[JS_NAME];
    if (new_name(c, base)) goto done;
    for (int k = n; k >= 0; k--) {
        gbnf_text t = {0};
        if (k == n) {
            if (*extra_kv) gbnf_printf(&t, "(%s\",\" %s %s)*", in, sep, extra_kv);
        } else {
            gbnf_printf(&t, required[k] ? "%s\",\" %s %s %s-a%d" : "(%s\",\" %s %s)? %s-a%d", in, sep, kv[k], base,
                        k + 1);
        }
        char an[JS_NAME + 16];
        snprintf(an, sizeof an, "%s-a%d", base, k);
        int e = emit_rule(c, an, &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    for (int k = n; k >= 0; k--) {
        gbnf_text t = {0};
        if (k == n) {
            if (*extra_kv) gbnf_printf(&t, "(%s %s-a%d)?", extra_kv, base, n);
        } else if (required[k]) {
            gbnf_printf(&t, "%s %s-a%d", kv[k], base, k + 1);
        } else {
            gbnf_printf(&t, "%s %s-a%d | %s-f%d", kv[k], base, k + 1, base, k + 1);
        }
        char fn[JS_NAME + 16];
        snprintf(fn, sizeof fn, "%s-f%d", base, k);
        int e = emit_rule(c, fn, &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    gbnf_printf(b, "\"{\" %s%s-f0 %s\"}\"", in, base, in);
    rc = 0;
done:
    free(kv);
    free(required);
    c->struct_depth--;
    return rc;
}

// ---- arrays ----

static int array_body(conv *c, const cJSON *s, gbnf_text *b) {
    const cJSON *prefix = get(s, "prefixItems"), *items = get(s, "items");
    const char *rest_key = "items";
    if (cJSON_IsArray(items)) {  // draft-07 tuples: items[] + additionalItems
        prefix = items;
        items = get(s, "additionalItems");
        rest_key = "additionalItems";
    }
    if (prefix && !cJSON_IsArray(prefix)) return fail(c, "prefixItems must be an array");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items)) return fail(c, "items must be a schema");
    const cJSON *unique = get(s, "uniqueItems");
    if (cJSON_IsTrue(unique)) return fail(c, "uniqueItems is not supported");
    long k = cJSON_GetArraySize(prefix);
    long min = count_keyword(s, "minItems", 0), max = count_keyword(s, "maxItems", -1);
    if (min == -2 || max == -2) return fail(c, "minItems/maxItems must be non-negative integers");
    if (cJSON_IsFalse(items) && (max < 0 || max > k)) max = k;
    if (min > JS_MAX_COUNT || max > JS_MAX_COUNT || k > JS_MAX_COUNT)
        return fail(c, "array lengths above %d are not supported", JS_MAX_COUNT);
    if (max >= 0 && min > max) return fail(c, "minItems exceeds the items the array can hold");
    const char *in = c->inner, *sep = c->sep;
    if (max == 0) {
        gbnf_printf(b, "\"[\" %s\"]\"", in);
        return 0;
    }
    c->struct_depth++;
    int rc = -1;
    char(*elem)[JS_NAME] = calloc((size_t)k + 1, JS_NAME);  // prefix rules, then the rest's
    if (!elem) {
        fail(c, "out of memory");
        goto done;
    }
    int i = 0;
    for (const cJSON *p = prefix ? prefix->child : NULL; p; p = p->next, i++) {
        size_t old = push_index(c, prefix == get(s, "items") ? "items" : "prefixItems", i);
        int e = schema_rule(c, p, elem[i]);
        pop_ptr(c, old);
        if (e) goto done;
    }
    bool rest = max < 0 || max > k;
    if (rest) {
        if (!items || cJSON_IsTrue(items)) {
            snprintf(elem[k], JS_NAME, "%s", shared(c, SH_VALUE));
        } else {
            size_t old = push_ptr(c, rest_key);
            int e = schema_rule(c, items, elem[k]);
            pop_ptr(c, old);
            if (e) goto done;
        }
    }
    // tail j (j items written): the prefix positions as a chain of rules, then a repetition
    char base[JS_NAME];
    if (new_name(c, base)) goto done;
    long first_rest = k > 1 ? k : 1;
    for (long j = (k > 1 ? k : 1); j >= 1; j--) {
        gbnf_text t = {0};
        if (max >= 0 && j >= max) {
            // full: nothing more
        } else if (j >= first_rest) {  // repeated rest items
            if (rest) {
                long lo = min - j > 0 ? min - j : 0, hi = max < 0 ? -1 : max - j;
                if (hi < 0)
                    gbnf_printf(&t, "(%s\",\" %s %s){%ld,}", in, sep, elem[k], lo);
                else if (hi > 0)
                    gbnf_printf(&t, "(%s\",\" %s %s){%ld,%ld}", in, sep, elem[k], lo, hi);
            }
        } else {
            gbnf_printf(&t, j < min ? "%s\",\" %s %s %s-t%ld" : "(%s\",\" %s %s %s-t%ld)?", in, sep, elem[j], base, j + 1);
        }
        char tn[JS_NAME + 24];
        snprintf(tn, sizeof tn, "%s-t%ld", base, j);
        int e = emit_rule(c, tn, &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    gbnf_printf(b, min > 0 ? "\"[\" %s%s %s-t1 %s\"]\"" : "\"[\" %s(%s %s-t1)? %s\"]\"", in, elem[0], base, in);
    rc = 0;
done:
    free(elem);
    c->struct_depth--;
    return rc;
}

// ---- dispatch ----

static bool value_has_type(const cJSON *v, const char *type) {
    if (!strcmp(type, "string")) return cJSON_IsString(v);
    if (!strcmp(type, "number")) return cJSON_IsNumber(v);
    if (!strcmp(type, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(type, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(type, "null")) return cJSON_IsNull(v);
    if (!strcmp(type, "object")) return cJSON_IsObject(v);
    if (!strcmp(type, "array")) return cJSON_IsArray(v);
    return false;
}

static bool type_allows(const cJSON *type, const cJSON *v) {
    if (!type) return true;
    if (cJSON_IsString(type)) return value_has_type(v, type->valuestring);
    for (const cJSON *t = type->child; t; t = t->next)
        if (cJSON_IsString(t) && value_has_type(v, t->valuestring)) return true;
    return false;
}

// A constant value: scalars as their compact JSON text, containers token by token so the
// whitespace policy holds inside them too (a flat sequence, no groups).
static int const_value(conv *c, const cJSON *v, gbnf_text *b) {
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return json_text_literal(c, v, b);
    bool obj = cJSON_IsObject(v);
    gbnf_printf(b, obj ? "\"{\"" : "\"[\"");
    for (const cJSON *e = v->child; e; e = e->next) {
        if (e != v->child) gbnf_printf(b, " %s\",\" %s", c->inner, c->sep);
        gbnf_printf(b, " %s", e == v->child ? c->inner : "");
        if (obj) {
            if (key_literal(c, e->string, b)) return -1;
            gbnf_printf(b, " %s\":\" %s ", c->inner, c->sep);
        }
        if (const_value(c, e, b)) return -1;
    }
    gbnf_printf(b, " %s%s", c->inner, obj ? "\"}\"" : "\"]\"");
    return 0;
}

static int enum_body(conv *c, const cJSON *s, gbnf_text *b) {
    const cJSON *en = get(s, "enum"), *cn = get(s, "const"), *type = get(s, "type");
    if (en && !cJSON_IsArray(en)) return fail(c, "enum must be an array");
    if (cJSON_GetArraySize(en) > JS_MAX_ENUM) return fail(c, "enum has more than %d members", JS_MAX_ENUM);
    int written = 0;
    const cJSON *one = cn ? cn : en ? en->child : NULL;
    for (; one; one = cn ? NULL : one->next) {
        if (!type_allows(type, one)) continue;
        if (cn && en) {  // both: the const must be among the enum's members
            bool found = false;
            for (const cJSON *e = en->child; e && !found; e = e->next) found = cJSON_Compare(e, cn, true);
            if (!found) continue;
        }
        if (written++) gbnf_puts(b, " | ");
        if (const_value(c, one, b)) return -1;
    }
    if (!written) return fail(c, "no value satisfies enum/const together with type");
    return 0;
}

static int typed_body(conv *c, const cJSON *s, const char *type, gbnf_text *b) {
    if (!strcmp(type, "string")) return string_body(c, s, b);
    if (!strcmp(type, "integer")) return integer_body(c, s, b);
    if (!strcmp(type, "number")) return number_body(c, s, b);
    if (!strcmp(type, "boolean")) return gbnf_puts(b, "\"true\" | \"false\""), 0;
    if (!strcmp(type, "null")) return gbnf_puts(b, "\"null\""), 0;
    if (!strcmp(type, "object")) return object_body(c, s, b);
    if (!strcmp(type, "array")) return array_body(c, s, b);
    return fail(c, "unknown type '%.40s'", type);
}

static int alternatives(conv *c, const cJSON *s, const char *key, gbnf_text *b) {
    const cJSON *list = get(s, key);
    if (!cJSON_IsArray(list) || !list->child) return fail(c, "%s must be a non-empty array", key);
    int i = 0;
    for (const cJSON *m = list->child; m; m = m->next, i++) {
        if (i > JS_MAX_ENUM) return fail(c, "%s has too many members", key);
        char name[JS_NAME];
        size_t old = push_index(c, key, i);
        int e = schema_rule(c, m, name);
        pop_ptr(c, old);
        if (e) return -1;
        gbnf_printf(b, "%s%s", i ? " | " : "", name);
    }
    return 0;
}

// allOf of plain object schemas (properties/required, through $refs) merged into one object:
// their properties in order, required joined. Extra keys then follow the usual policy, which
// is sound: every listed key still meets its own schema.
static int allof_objects(conv *c, const cJSON *list, gbnf_text *b) {
    cJSON *merged = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    int rc = -1;
    if (!merged || !props || !req) {
        cJSON_Delete(props);
        cJSON_Delete(req);
        cJSON_Delete(merged);
        return fail(c, "out of memory");
    }
    cJSON_AddItemToObject(merged, "properties", props);
    cJSON_AddItemToObject(merged, "required", req);
    int i = 0;
    for (const cJSON *member = list->child; member; member = member->next, i++) {
        size_t old = push_index(c, "allOf", i);
        const cJSON *ref, *m = member;
        for (int hops = 0; cJSON_IsObject(m) && (ref = get(m, "$ref")) && hops < 16; hops++) {
            if (!cJSON_IsString(ref) || other_constraint(m, "$ref")) break;
            m = resolve_ref(c, ref->valuestring);
            if (!m) goto done;
        }
        const cJSON *type = get(m, "type");
        if (!cJSON_IsObject(m) || (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "object")))) {
            fail(c, "allOf with several members is supported for object schemas only");
            goto done;
        }
        for (const cJSON *k = m->child; k; k = k->next) {
            if (strcmp(k->string, "type") && strcmp(k->string, "properties") && strcmp(k->string, "required") &&
                !in_list(ANNOTATIONS, k->string)) {
                fail(c, "'%s' in a member of a merged allOf is not supported", k->string);
                goto done;
            }
        }
        const cJSON *mp = get(m, "properties"), *mr = get(m, "required");
        for (const cJSON *p = cJSON_IsObject(mp) ? mp->child : NULL; p; p = p->next) {
            if (get(props, p->string)) {
                fail(c, "property '%.60s' appears in two allOf members", p->string);
                goto done;
            }
            cJSON_AddItemReferenceToObject(props, p->string, (cJSON *)p);
        }
        for (const cJSON *r = cJSON_IsArray(mr) ? mr->child : NULL; r; r = r->next)
            if (cJSON_IsString(r)) cJSON_AddItemToArray(req, cJSON_CreateString(r->valuestring));
        pop_ptr(c, old);
    }
    rc = object_body(c, merged, b);
done:
    cJSON_Delete(merged);
    return rc;
}

static int schema_body(conv *c, const cJSON *s, gbnf_text *b) {
    if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        gbnf_puts(b, shared(c, SH_VALUE));
        return 0;
    }
    if (cJSON_IsFalse(s)) return fail(c, "schema false accepts nothing");
    if (!cJSON_IsObject(s)) return fail(c, "a schema must be an object or a boolean");
    for (const cJSON *k = s->child; k; k = k->next) {
        if (in_list(UNSUPPORTED, k->string)) return fail(c, "keyword '%s' is not supported", k->string);
    }
    static const char *const COMBINATORS[] = {"$ref", "anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = get(s, COMBINATORS[i]);
        if (!v) continue;
        const char *other = other_constraint(s, COMBINATORS[i]);
        if (other) return fail(c, "'%s' next to '%s' is not supported", other, COMBINATORS[i]);
        if (i == 0) {
            if (!cJSON_IsString(v)) return fail(c, "$ref must be a string");
            const cJSON *target = resolve_ref(c, v->valuestring);
            char name[JS_NAME];
            if (!target || ref_rule(c, target, v->valuestring, name)) return -1;
            gbnf_puts(b, name);
            return 0;
        }
        if (i == 3) {  // allOf of one schema is that schema
            if (!cJSON_IsArray(v) || !v->child) return fail(c, "allOf must be a non-empty array");
            if (v->child->next) return allof_objects(c, v, b);
            char name[JS_NAME];
            size_t old = push_index(c, "allOf", 0);
            int e = schema_rule(c, v->child, name);
            pop_ptr(c, old);
            if (!e) gbnf_puts(b, name);
            return e;
        }
        return alternatives(c, s, COMBINATORS[i], b);  // oneOf is generated as anyOf
    }
    if (get(s, "enum") || get(s, "const")) return enum_body(c, s, b);
    const cJSON *type = get(s, "type");
    static const char *const ALL_TYPES[] = {"object", "array", "string", "number", "boolean", "null", NULL};
    if (!type) {  // no type: every kind of value, each constrained by its own keywords
        bool constrained = false;
        for (const cJSON *k = s->child; k; k = k->next) constrained |= !in_list(ANNOTATIONS, k->string);
        if (!constrained) {
            gbnf_puts(b, shared(c, SH_VALUE));
            return 0;
        }
        for (int i = 0; ALL_TYPES[i]; i++) {
            gbnf_puts(b, i ? " | (" : "(");
            if (typed_body(c, s, ALL_TYPES[i], b)) return -1;
            gbnf_puts(b, ")");
        }
        return 0;
    }
    if (cJSON_IsString(type)) return typed_body(c, s, type->valuestring, b);
    if (!cJSON_IsArray(type) || !type->child) return fail(c, "type must be a string or a non-empty array");
    int i = 0;
    for (const cJSON *t = type->child; t; t = t->next, i++) {
        if (!cJSON_IsString(t)) return fail(c, "type lists must hold strings");
        gbnf_puts(b, i ? " | (" : "(");
        if (typed_body(c, s, t->valuestring, b)) return -1;
        gbnf_puts(b, ")");
    }
    return 0;
}

// A rule for schema s: a shared one when s is a plain string/number/any, else a new one.
static int schema_rule(conv *c, const cJSON *s, char *name) {
    if (++c->depth > JS_MAX_DEPTH) {
        c->depth--;
        return fail(c, "schema nested deeper than %d", JS_MAX_DEPTH);
    }
    gbnf_text body = {0};
    int rc = schema_body(c, s, &body);
    if (!rc && body.s && !strchr(body.s, ' ') && !strchr(body.s, '"')) {
        snprintf(name, JS_NAME, "%s", body.s);  // a single rule name: use it directly
    } else if (!rc) {
        rc = new_name(c, name);
        if (!rc) rc = emit_rule(c, name, &body);
    }
    gbnf_text_free(&body);
    c->depth--;
    return rc;
}

static bool valid_utf8(const char *s) {
    for (const unsigned char *u = (const unsigned char *)s; *u;) {
        int n = *u < 0x80 ? 1 : (*u & 0xE0) == 0xC0 ? 2 : (*u & 0xF0) == 0xE0 ? 3 : (*u >= 0xF0 && *u <= 0xF4) ? 4 : 0;
        if (!n || (n == 2 && *u < 0xC2)) return false;
        uint32_t v = n == 1 ? *u : n == 2 ? (*u & 0x1Fu) : n == 3 ? (*u & 0x0Fu) : (*u & 0x07u);
        for (int i = 1; i < n; i++) {
            if ((u[i] & 0xC0) != 0x80) return false;
            v = v << 6 | (u[i] & 0x3Fu);
        }
        if ((n == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) || (n == 4 && (v < 0x10000 || v > 0x10FFFF))) return false;
        u += n;
    }
    return true;
}

// cJSON passes invalid UTF-8 through; the grammar parser refuses it, so refuse it here.
static bool all_utf8(const cJSON *v) {
    for (; v; v = v->next) {
        if (v->string && !valid_utf8(v->string)) return false;
        if (cJSON_IsString(v) && !valid_utf8(v->valuestring)) return false;
        if (v->child && !all_utf8(v->child)) return false;
    }
    return true;
}

int kaon_json_schema_to_gbnf(const char *schema_json, size_t len, const char *root,
                             const kaon_json_schema_opts *opts, gbnf_text *out) {
    if (!root || !valid_root_name(root)) return kaon_set_error("json schema: bad root rule name");
    if (len > JS_MAX_SCHEMA_BYTES) return kaon_set_error("json schema: schema larger than %d bytes", JS_MAX_SCHEMA_BYTES);
    cJSON *doc = cJSON_ParseWithLength(schema_json, len);
    if (!doc) return kaon_set_error("json schema: not valid JSON");
    if (!all_utf8(doc)) {
        cJSON_Delete(doc);
        return kaon_set_error("json schema: invalid UTF-8 in a string");
    }
    conv c;
    init_conv(&c, root, opts, out);
    c.doc = doc;
    // the root is a $ref target too ("#"): register it under the root rule's name
    c.refs = calloc(16, sizeof *c.refs);
    int rc = -1;
    if (!c.refs) {
        kaon_set_error("json schema: out of memory");
    } else {
        c.cap_refs = 16;
        c.n_refs = 1;
        c.refs[0] = (js_ref){.node = doc, .struct_depth = 0};
        snprintf(c.refs[0].name, JS_NAME, "%s", root);
        gbnf_text body = {0};
        rc = schema_body(&c, doc, &body);
        if (!rc) rc = emit_rule(&c, root, &body);
        gbnf_text_free(&body);
    }
    free(c.refs);
    cJSON_Delete(doc);
    return rc;
}

int kaon_json_any_to_gbnf(const char *root, bool object_only, const kaon_json_schema_opts *opts, gbnf_text *out) {
    if (!root || !valid_root_name(root)) return kaon_set_error("json schema: bad root rule name");
    conv c;
    init_conv(&c, root, opts, out);
    const char *value = shared(&c, SH_VALUE);
    gbnf_printf(out, "%s ::= %s-%s-0\n", root, root, object_only ? "object" : "value");
    (void)value;
    return out->oom ? kaon_set_error("json schema: out of memory") : 0;
}
