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

int js_fail(js_conv *c, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kaon_set_error("json schema: at #%s: %s", c->ptr, msg);
}

// Pointer segments pushed while descending; returns the old length to pop back to.
size_t js_push_ptr(js_conv *c, const char *seg) {
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
size_t js_push_index(js_conv *c, const char *key, int i) {
    size_t old = js_push_ptr(c, key);
    char b[16];
    snprintf(b, sizeof b, "%d", i);
    js_push_ptr(c, b);
    return old;
}
void js_pop_ptr(js_conv *c, size_t old) { c->ptr[old] = 0; }

int js_new_name(js_conv *c, char *name) {
    if (++c->n_rules > JS_MAX_RULES) return js_fail(c, "schema needs more than %d rules", JS_MAX_RULES);
    snprintf(name, JS_NAME, "%s-%d", c->root, c->n_rules);
    return 0;
}

static uint32_t text_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

const char *js_same_body(const js_conv *c, const char *text) {
    uint32_t h = text_hash(text);
    for (int i = 0; i < c->n_bodies; i++)
        if (c->bodies[i].hash == h && !strcmp(c->bodies[i].text, text)) return c->bodies[i].name;
    return NULL;
}

void js_bodies_free(js_conv *c) {
    for (int i = 0; i < c->n_bodies; i++) free(c->bodies[i].text);
    free(c->bodies);
    c->bodies = NULL;
    c->n_bodies = c->cap_bodies = 0;
}

int js_emit_rule(js_conv *c, const char *name, const gbnf_text *body) {
    const char *text = body->s ? body->s : "\"\"";
    const char *same = js_same_body(c, text);
    if (same) {
        gbnf_printf(c->out, "%s ::= %s\n", name, same);
    } else {
        gbnf_printf(c->out, "%s ::= %s\n", name, text);
        if (c->n_bodies == c->cap_bodies) {
            int cap = c->cap_bodies ? 2 * c->cap_bodies : 64;
            js_body *b = realloc(c->bodies, (size_t)cap * sizeof *b);
            if (!b) return js_fail(c, "out of memory");
            c->bodies = b;
            c->cap_bodies = cap;
        }
        js_body *b = &c->bodies[c->n_bodies];
        if (!(b->text = strdup(text))) return js_fail(c, "out of memory");
        b->hash = text_hash(text);
        snprintf(b->name, JS_NAME, "%s", name);
        c->n_bodies++;
    }
    if (c->out->oom || body->oom) return js_fail(c, "out of memory");
    if (c->out->len > KAON_GRAMMAR_MAX_TEXT) return js_fail(c, "grammar would exceed %d bytes", KAON_GRAMMAR_MAX_TEXT);
    return 0;
}

// ---- shared rules: JSON strings, numbers, whitespace, free-form values ----

static void emit_any_values(js_conv *c);

const char *js_shared(js_conv *c, unsigned which) {
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
            js_shared(c, SH_CHAR);
            if (c->str_cap)
                gbnf_printf(c->out, "%s-string ::= \"\\\"\" %s-char{0,%d} \"\\\"\"\n", r, r, c->str_cap);
            else
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
static void emit_any_values(js_conv *c) {
    const char *r = c->root;
    char str[JS_NAME], num[JS_NAME];
    snprintf(str, sizeof str, "%s", js_shared(c, SH_STRING));
    snprintf(num, sizeof num, "%s", js_shared(c, SH_NUMBER));
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

static void init_conv(js_conv *c, const char *root, const kaon_json_schema_opts *opts, gbnf_text *out) {
    memset(c, 0, sizeof *c);
    c->out = out;
    snprintf(c->root, sizeof c->root, "%s", root);
    if (opts) c->opts = *opts;
    c->str_cap = c->opts.max_string_length ? c->opts.max_string_length : KAON_JSON_SCHEMA_MAX_STRING;
    if (c->str_cap < 0) c->str_cap = 0;
    if (c->str_cap > JS_MAX_COUNT) c->str_cap = JS_MAX_COUNT;
    if (c->opts.any_whitespace) {
        snprintf(c->sep, sizeof c->sep, "%s", js_shared(c, SH_WS));
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

const char *const js_annotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "$defs", "definitions", "discriminator", "contentMediaType", "contentEncoding", "$anchor", NULL};
static const char *const UNSUPPORTED[] = {
    "not", "if", "then", "else", "multipleOf", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "contains", "minContains", "maxContains", "minProperties",
    "maxProperties", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", NULL};

bool js_in_list(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

const cJSON *js_get(const cJSON *s, const char *key) { return cJSON_GetObjectItemCaseSensitive(s, key); }

// Keywords of s other than annotations and `except`: a combinator must stand alone.
const char *js_other_constraint(const cJSON *s, const char *except) {
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, except) && !js_in_list(js_annotations, k->string)) return k->string;
    return NULL;
}

// A non-negative integer keyword (minItems...): default when absent; -2 when malformed.
long js_count_keyword(const cJSON *s, const char *key, long dflt) {
    const cJSON *v = js_get(s, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) return -2;
    return v->valuedouble > 1e9 ? 1000000000L : (long)v->valuedouble;
}


// A JSON string literal as GBNF: the key's JSON text (with its quotes and escapes) matched exactly.
static int json_text_literal(js_conv *c, const cJSON *v, gbnf_text *body) {
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt) return js_fail(c, "out of memory");
    gbnf_literal(body, txt, strlen(txt));
    cJSON_free(txt);
    return 0;
}

int js_key_literal(js_conv *c, const char *key, gbnf_text *body) {
    cJSON *k = cJSON_CreateString(key);
    if (!k) return js_fail(c, "out of memory");
    int rc = json_text_literal(c, k, body);
    cJSON_Delete(k);
    return rc;
}

// ---- $ref ----

const cJSON *js_resolve_ref(js_conv *c, const char *ref) {
    if (ref[0] != '#') {
        js_fail(c, "only local $ref (#...) is supported, not '%.80s'", ref);
        return NULL;
    }
    const cJSON *node = c->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        js_fail(c, "$ref anchors are not supported: '%.80s'", ref);
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
            node = js_get(node, seg);
        } else {
            node = NULL;
        }
    }
    if (!node) js_fail(c, "unresolvable $ref '%.80s'", ref);
    return node;
}

static int schema_body(js_conv *c, const cJSON *s, gbnf_text *body);

bool js_take_pruned(js_conv *c) {
    if (!c->pruned) return false;
    c->pruned = false;
    return true;
}

// The rule of a $ref target, generated the first time it is referenced. With a nesting limit,
// a reference inside the target's own generation gets a new rule one level deeper (the same
// schema, generated again), and at the limit fails as "pruned".
static int ref_rule(js_conv *c, const cJSON *target, const char *ref, char *name) {
    int open = 0, inner = -1;
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == target && !c->refs[i].done) open++, inner = i;
    // recursion that has not entered an object or array would be left recursion
    if (inner >= 0 && c->refs[inner].struct_depth == c->struct_depth)
        return js_fail(c, "$ref '%.80s' refers back to itself without an object or array in between", ref);
    if (c->ref_cap > 0 && open >= c->ref_cap) {
        c->pruned = true;
        return js_fail(c, "$ref '%.80s' nested deeper than %d", ref, c->ref_cap);
    }
    for (int i = 0; i < c->n_refs; i++) {
        if (c->refs[i].node != target || (c->ref_cap > 0 && (!c->refs[i].done || c->refs[i].level != open))) continue;
        if (c->refs[i].pruned) {
            c->pruned = true;
            return js_fail(c, "$ref '%.80s' nested deeper than %d", ref, c->ref_cap);
        }
        snprintf(name, JS_NAME, "%s", c->refs[i].name);
        return 0;
    }
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 16;
        js_ref *r = realloc(c->refs, (size_t)cap * sizeof *r);
        if (!r) return js_fail(c, "out of memory");
        c->refs = r;
        c->cap_refs = cap;
    }
    if (c->depth + 1 > JS_MAX_DEPTH) return js_fail(c, "$ref chain deeper than %d", JS_MAX_DEPTH);
    int idx = c->n_refs++;
    c->refs[idx] = (js_ref){.node = target, .struct_depth = c->struct_depth, .level = open};
    if (js_new_name(c, c->refs[idx].name)) return -1;
    snprintf(name, JS_NAME, "%s", c->refs[idx].name);
    char saved[sizeof c->ptr];
    memcpy(saved, c->ptr, sizeof saved);
    snprintf(c->ptr, sizeof c->ptr, "%s", ref + 1);
    gbnf_text body = {0};
    c->depth++;
    int rc = schema_body(c, target, &body);
    c->depth--;
    if (!rc) rc = js_emit_rule(c, name, &body);
    gbnf_text_free(&body);
    memcpy(c->ptr, saved, sizeof saved);
    c->refs[idx].done = true;
    c->refs[idx].pruned = rc && c->pruned;
    return rc;
}

// ---- strings ----

static int format_body(js_conv *c, const char *fmt, gbnf_text *b) {
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
    } else if (!strcmp(fmt, "email")) {
        // local@label(.label){1,4} within RFC 5321's limits: local part <= 64, the whole address
        // <= 254, so 5 labels of <= 37 (64 + 1 + 5 * 37 + 4 = 254; a model filling every part to
        // its bound used to write 384 characters, an address no mail system takes). A
        // max_string_length below 254 shrinks the parts to fit it.
        int total = 254, local = 64;
        if (c->str_cap && c->str_cap < total) {
            total = c->str_cap;
            if (local > total / 2) local = total / 2;
        }
        int label = (total - local - 1 - 4) / 5;
        if (label < 1) label = 1;
        if (local > total - 5 - 5 * label) local = total - 5 - 5 * label;
        if (local < 1) local = 1;  // caps below 11 (a@b.c.d.e.f) are exceeded by the longest form
        char lab[96];
        if (label >= 2)
            snprintf(lab, sizeof lab, "[a-zA-Z0-9]([a-zA-Z0-9\\-]{0,%d} [a-zA-Z0-9])?", label - 2);
        else
            snprintf(lab, sizeof lab, "[a-zA-Z0-9]");
        gbnf_printf(b, "\"\\\"\" [a-zA-Z0-9._+\\-]{1,%d} \"@\" %s (\".\" %s){1,4} \"\\\"\"", local, lab, lab);
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

static int string_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    long min = js_count_keyword(s, "minLength", 0), max = js_count_keyword(s, "maxLength", -1);
    if (min == -2 || max == -2) return js_fail(c, "minLength/maxLength must be non-negative integers");
    bool bounded = js_get(s, "minLength") || js_get(s, "maxLength");
    const cJSON *pattern = js_get(s, "pattern"), *format = js_get(s, "format");
    if (pattern) {
        if (!cJSON_IsString(pattern)) return js_fail(c, "pattern must be a string");
        if (bounded) return js_fail(c, "pattern together with minLength/maxLength is not supported");
        char name[JS_NAME];
        if (js_new_name(c, name)) return -1;
        size_t old = js_push_ptr(c, "pattern");
        if (kaon_regex_to_gbnf(pattern->valuestring, strlen(pattern->valuestring), name, true, c->out)) {
            char why[200];
            snprintf(why, sizeof why, "%s", kaon_last_error());
            int rc = js_fail(c, "%s", why);
            js_pop_ptr(c, old);
            return rc;
        }
        js_pop_ptr(c, old);
        gbnf_printf(b, "\"\\\"\" %s \"\\\"\"", name);
        return 0;
    }
    if (cJSON_IsString(format)) {
        gbnf_text f = {0};
        bool known = format_body(c, format->valuestring, &f) == 0;
        if (known && !bounded) gbnf_append(b, f.s, f.len);
        gbnf_text_free(&f);
        if (known && bounded)
            return js_fail(c, "format '%.40s' together with minLength/maxLength is not supported", format->valuestring);
        if (known) return 0;
    }
    if (!bounded) {
        gbnf_puts(b, js_shared(c, SH_STRING));
        return 0;
    }
    if (min > JS_MAX_COUNT || max > JS_MAX_COUNT) return js_fail(c, "string lengths above %d are not supported", JS_MAX_COUNT);
    if (max >= 0 && min > max) return js_fail(c, "minLength exceeds maxLength");
    const char *ch = js_shared(c, SH_CHAR);
    if (max < 0 && c->str_cap) max = min > c->str_cap ? min : c->str_cap;
    if (max < 0)
        gbnf_printf(b, "\"\\\"\" %s{%ld,} \"\\\"\"", ch, min);
    else
        gbnf_printf(b, "\"\\\"\" %s{%ld,%ld} \"\\\"\"", ch, min, max);
    return 0;
}

// ---- numbers ----

// Integer bounds from minimum/maximum/exclusive*, clamped to what the grammar can write.
// *min_real/*max_real: the real bounds (inclusive or not), infinite when absent.
static int int_bounds(js_conv *c, const cJSON *s, int64_t *lo, int64_t *hi, double *min_real, double *max_real) {
    double l = -(double)JS_MAX_INT_VALUE, h = (double)JS_MAX_INT_VALUE;
    *max_real = INFINITY;
    *min_real = -INFINITY;
    const cJSON *mn = js_get(s, "minimum"), *mx = js_get(s, "maximum");
    const cJSON *emn = js_get(s, "exclusiveMinimum"), *emx = js_get(s, "exclusiveMaximum");
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx))) return js_fail(c, "minimum/maximum must be numbers");
    bool old_emn = cJSON_IsTrue(emn), old_emx = cJSON_IsTrue(emx);  // draft-04 booleans
    if (mn) {
        l = fmax(l, old_emn ? floor(mn->valuedouble) + 1 : ceil(mn->valuedouble));
        *min_real = mn->valuedouble;
    }
    if (mx) {
        h = fmin(h, old_emx ? ceil(mx->valuedouble) - 1 : floor(mx->valuedouble));
        *max_real = mx->valuedouble;
    }
    if (cJSON_IsNumber(emn)) {
        l = fmax(l, floor(emn->valuedouble) + 1);
        *min_real = fmax(*min_real, emn->valuedouble);
    }
    if (cJSON_IsNumber(emx)) {
        h = fmin(h, ceil(emx->valuedouble) - 1);
        *max_real = fmin(*max_real, emx->valuedouble);
    }
    if (emn && !cJSON_IsNumber(emn) && !cJSON_IsBool(emn)) return js_fail(c, "exclusiveMinimum must be a number");
    if (emx && !cJSON_IsNumber(emx) && !cJSON_IsBool(emx)) return js_fail(c, "exclusiveMaximum must be a number");
    if (l > h) return js_fail(c, "no integer within the bounds the grammar can write (|x| < 1e15)");
    *lo = (int64_t)l;
    *hi = (int64_t)h;
    return 0;
}

static bool has_bounds(const cJSON *s) {
    return js_get(s, "minimum") || js_get(s, "maximum") || js_get(s, "exclusiveMinimum") || js_get(s, "exclusiveMaximum");
}

static int integer_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    if (!has_bounds(s)) {
        gbnf_puts(b, js_shared(c, SH_INTEGER));
        return 0;
    }
    int64_t lo, hi;
    double min_real, max_real;
    if (int_bounds(c, s, &lo, &hi, &min_real, &max_real)) return -1;
    js_int_range_expr(b, lo, hi);
    return 0;
}

// Bounded numbers: the integers in range, fractions I.ddd for I >= 0 with I + 1 <= the
// maximum (I.ddd < I + 1 stays in range), and -K.ddd for minimum <= -(K + 1) and -K <= hi,
// the largest integer in range (-K.ddd lies in (-(K + 1), -K]). No exponents.
static int number_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    if (!has_bounds(s)) {
        gbnf_puts(b, js_shared(c, SH_NUMBER));
        return 0;
    }
    int64_t lo, hi;
    double min_real, max_real;
    if (int_bounds(c, s, &lo, &hi, &min_real, &max_real)) return -1;
    js_int_range_expr(b, lo, hi);
    int64_t flo = lo < 0 ? 0 : lo;
    double fhi_d = isinf(max_real) ? (double)JS_MAX_INT_VALUE : floor(max_real) - 1;
    if (fhi_d > (double)(JS_MAX_INT_VALUE)) fhi_d = (double)JS_MAX_INT_VALUE;
    if (fhi_d >= (double)flo) {
        gbnf_puts(b, " | ");
        js_int_range_expr(b, flo, (int64_t)fhi_d);
        gbnf_printf(b, " \".\" [0-9]{1,%d}", JS_MAX_FRACTION_DIGITS);
    }
    double kmax_d = isinf(min_real) ? (double)JS_MAX_INT_VALUE : floor(-min_real) - 1;
    if (kmax_d > (double)JS_MAX_INT_VALUE) kmax_d = (double)JS_MAX_INT_VALUE;
    int64_t kmin = hi >= 0 ? 0 : -hi, kmax = kmax_d < 0 ? -1 : (int64_t)kmax_d;
    if (kmin <= kmax) {
        gbnf_puts(b, " | \"-\" ");
        js_int_range_expr(b, kmin, kmax);
        gbnf_printf(b, " \".\" [0-9]{1,%d}", JS_MAX_FRACTION_DIGITS);
    }
    return 0;
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
static int const_value(js_conv *c, const cJSON *v, gbnf_text *b) {
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return json_text_literal(c, v, b);
    bool obj = cJSON_IsObject(v);
    gbnf_printf(b, obj ? "\"{\"" : "\"[\"");
    for (const cJSON *e = v->child; e; e = e->next) {
        if (e != v->child) gbnf_printf(b, " %s\",\" %s", c->inner, c->sep);
        gbnf_printf(b, " %s", e == v->child ? c->inner : "");
        if (obj) {
            if (js_key_literal(c, e->string, b)) return -1;
            gbnf_printf(b, " %s\":\" %s ", c->inner, c->sep);
        }
        if (const_value(c, e, b)) return -1;
    }
    gbnf_printf(b, " %s%s", c->inner, obj ? "\"}\"" : "\"]\"");
    return 0;
}

static int enum_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    const cJSON *en = js_get(s, "enum"), *cn = js_get(s, "const"), *type = js_get(s, "type");
    if (en && !cJSON_IsArray(en)) return js_fail(c, "enum must be an array");
    if (cJSON_GetArraySize(en) > JS_MAX_ENUM) return js_fail(c, "enum has more than %d members", JS_MAX_ENUM);
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
    if (!written) return js_fail(c, "no value satisfies enum/const together with type");
    return 0;
}

static int typed_body(js_conv *c, const cJSON *s, const char *type, gbnf_text *b) {
    if (!strcmp(type, "string")) return string_body(c, s, b);
    if (!strcmp(type, "integer")) return integer_body(c, s, b);
    if (!strcmp(type, "number")) return number_body(c, s, b);
    if (!strcmp(type, "boolean")) return gbnf_puts(b, "\"true\" | \"false\""), 0;
    if (!strcmp(type, "null")) return gbnf_puts(b, "\"null\""), 0;
    if (!strcmp(type, "object")) return js_object_body(c, s, b);
    if (!strcmp(type, "array")) return js_array_body(c, s, b);
    return js_fail(c, "unknown type '%.40s'", type);
}

static int alternatives(js_conv *c, const cJSON *s, const char *key, gbnf_text *b) {
    const cJSON *list = js_get(s, key);
    if (!cJSON_IsArray(list) || !list->child) return js_fail(c, "%s must be a non-empty array", key);
    int i = 0, n_kept = 0;
    for (const cJSON *m = list->child; m; m = m->next, i++) {
        if (i > JS_MAX_ENUM) return js_fail(c, "%s has too many members", key);
        char name[JS_NAME];
        size_t old = js_push_index(c, key, i);
        int e = js_schema_rule(c, m, name);
        js_pop_ptr(c, old);
        if (e && js_take_pruned(c)) continue;  // a member past the recursion limit: left out
        if (e) return -1;
        gbnf_printf(b, "%s%s", n_kept++ ? " | " : "", name);
    }
    if (!n_kept) {  // every member past the recursion limit: the caller may leave this out
        c->pruned = true;
        return js_fail(c, "every %s member nests deeper than %d", key, c->ref_cap);
    }
    return 0;
}

static int schema_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        gbnf_puts(b, js_shared(c, SH_VALUE));
        return 0;
    }
    if (cJSON_IsFalse(s)) return js_fail(c, "schema false accepts nothing");
    if (!cJSON_IsObject(s)) return js_fail(c, "a schema must be an object or a boolean");
    for (const cJSON *k = s->child; k; k = k->next) {
        if (js_in_list(UNSUPPORTED, k->string)) return js_fail(c, "keyword '%s' is not supported", k->string);
    }
    static const char *const COMBINATORS[] = {"$ref", "anyOf", "oneOf", "allOf"};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = js_get(s, COMBINATORS[i]);
        if (!v) continue;
        const char *other = js_other_constraint(s, COMBINATORS[i]);
        if (other) return js_fail(c, "'%s' next to '%s' is not supported", other, COMBINATORS[i]);
        if (i == 0) {
            if (!cJSON_IsString(v)) return js_fail(c, "$ref must be a string");
            const cJSON *target = js_resolve_ref(c, v->valuestring);
            char name[JS_NAME];
            if (!target || ref_rule(c, target, v->valuestring, name)) return -1;
            gbnf_puts(b, name);
            return 0;
        }
        if (i == 3) {  // allOf of one schema is that schema
            if (!cJSON_IsArray(v) || !v->child) return js_fail(c, "allOf must be a non-empty array");
            if (v->child->next) return js_allof_objects(c, v, b);
            char name[JS_NAME];
            size_t old = js_push_index(c, "allOf", 0);
            int e = js_schema_rule(c, v->child, name);
            js_pop_ptr(c, old);
            if (!e) gbnf_puts(b, name);
            return e;
        }
        return alternatives(c, s, COMBINATORS[i], b);  // oneOf is generated as anyOf
    }
    if (js_get(s, "enum") || js_get(s, "const")) return enum_body(c, s, b);
    const cJSON *type = js_get(s, "type");
    static const char *const ALL_TYPES[] = {"object", "array", "string", "number", "boolean", "null", NULL};
    if (!type) {  // no type: every kind of value, each constrained by its own keywords
        bool constrained = false;
        for (const cJSON *k = s->child; k; k = k->next) constrained |= !js_in_list(js_annotations, k->string);
        if (!constrained) {
            gbnf_puts(b, js_shared(c, SH_VALUE));
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
    if (!cJSON_IsArray(type) || !type->child) return js_fail(c, "type must be a string or a non-empty array");
    int i = 0;
    for (const cJSON *t = type->child; t; t = t->next, i++) {
        if (!cJSON_IsString(t)) return js_fail(c, "type lists must hold strings");
        gbnf_puts(b, i ? " | (" : "(");
        if (typed_body(c, s, t->valuestring, b)) return -1;
        gbnf_puts(b, ")");
    }
    return 0;
}

// A rule for schema s: a shared one when s is a plain string/number/any, else a new one.
int js_schema_rule(js_conv *c, const cJSON *s, char *name) {
    if (++c->depth > JS_MAX_DEPTH) {
        c->depth--;
        return js_fail(c, "schema nested deeper than %d", JS_MAX_DEPTH);
    }
    gbnf_text body = {0};
    int rc = schema_body(c, s, &body);
    const char *same = !rc && body.s ? js_same_body(c, body.s) : NULL;
    if (!rc && body.s && !strchr(body.s, ' ') && !strchr(body.s, '"')) {
        snprintf(name, JS_NAME, "%s", body.s);  // a single rule name: use it directly
    } else if (same) {
        snprintf(name, JS_NAME, "%s", same);  // the same rule written before
    } else if (!rc) {
        rc = js_new_name(c, name);
        if (!rc) rc = js_emit_rule(c, name, &body);
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
    js_conv c;
    size_t out_len = out->len;  // before init_conv: it may write shared rules (whitespace)
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
        int cap = c.opts.max_ref_depth ? c.opts.max_ref_depth : KAON_JSON_SCHEMA_REF_DEPTH;
        // with the nesting limit first; a schema that requires deeper nesting gets its exact
        // recursive grammar instead
        for (int pass = cap > 0 ? 0 : 1; pass < 2; pass++) {
            if (pass) {
                js_ref *refs = c.refs;
                int cap_refs = c.cap_refs;
                if (out->s) out->s[out->len = out_len] = 0;  // before init_conv writes shared rules
                js_bodies_free(&c);
                init_conv(&c, root, opts, out);
                c.doc = doc;
                c.refs = refs;
                c.cap_refs = cap_refs;
            }
            c.ref_cap = pass ? 0 : cap;
            c.n_refs = 1;
            c.refs[0] = (js_ref){.node = doc, .struct_depth = 0};
            snprintf(c.refs[0].name, JS_NAME, "%s", root);
            gbnf_text body = {0};
            rc = schema_body(&c, doc, &body);
            if (!rc) rc = js_emit_rule(&c, root, &body);
            gbnf_text_free(&body);
            if (!rc || !c.pruned) break;
        }
    }
    free(c.refs);
    js_bodies_free(&c);
    cJSON_Delete(doc);
    return rc;
}

int kaon_json_any_to_gbnf(const char *root, bool object_only, const kaon_json_schema_opts *opts, gbnf_text *out) {
    if (!root || !valid_root_name(root)) return kaon_set_error("json schema: bad root rule name");
    js_conv c;
    init_conv(&c, root, opts, out);
    const char *value = js_shared(&c, SH_VALUE);
    gbnf_printf(out, "%s ::= %s-%s-0\n", root, root, object_only ? "object" : "value");
    (void)value;
    js_bodies_free(&c);
    return out->oom ? kaon_set_error("json schema: out of memory") : 0;
}
