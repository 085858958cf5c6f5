// Object and array schemas. Objects: properties in the schema's order, with a chain of rules
// so that commas are right whatever subset of optional members is written (after_i: members
// i.. once one is written, each with its comma; first_i: the first member written is i or
// later). Arrays: prefix positions as a chain of rules, then a bounded repetition.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_schema_internal.h"

// ---- objects ----

typedef enum { EXTRA_NONE, EXTRA_ANY, EXTRA_SCHEMA } extra_kind;

int js_object_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    const cJSON *props = js_get(s, "properties"), *req = js_get(s, "required"), *addl = js_get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return js_fail(c, "properties must be an object");
    if (req && !cJSON_IsArray(req)) return js_fail(c, "required must be an array");
    int n = cJSON_GetArraySize(props);
    if (n > JS_MAX_COUNT) return js_fail(c, "more than %d properties", JS_MAX_COUNT);
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return js_fail(c, "required must list strings");
        if (!js_get(props, r->valuestring))
            return js_fail(c, "required property '%.60s' is not listed in properties", r->valuestring);
    }
    extra_kind extra = addl ? (cJSON_IsFalse(addl) ? EXTRA_NONE : cJSON_IsTrue(addl) ? EXTRA_ANY : EXTRA_SCHEMA)
                            : (c->opts.strict ? EXTRA_NONE : EXTRA_ANY);
    if (extra == EXTRA_SCHEMA && !cJSON_IsObject(addl)) return js_fail(c, "additionalProperties must be a boolean or a schema");
    const char *in = c->inner, *sep = c->sep;
    c->struct_depth++;
    int rc = -1;
    char(*kv)[JS_NAME] = calloc((size_t)n + 1, JS_NAME);
    bool *required = calloc((size_t)n + 1, 1), *skip = calloc((size_t)n + 1, 1);
    char extra_kv[JS_NAME] = "", value[JS_NAME];
    if (!kv || !required || !skip) {
        js_fail(c, "out of memory");
        goto done;
    }
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) required[i] = true;
        size_t old = js_push_ptr(c, "properties");
        js_push_ptr(c, p->string);
        int e = js_schema_rule(c, p, value);
        js_pop_ptr(c, old);
        if (e && !required[i] && js_take_pruned(c)) {  // past the recursion limit: left out
            skip[i] = true;
            continue;
        }
        if (e) goto done;
        gbnf_text t = {0};
        if (js_key_literal(c, p->string, &t) || js_new_name(c, kv[i])) {
            gbnf_text_free(&t);
            goto done;
        }
        gbnf_printf(&t, " %s\":\" %s %s", in, sep, value);
        e = js_emit_rule(c, kv[i], &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    if (extra != EXTRA_NONE) {
        if (extra == EXTRA_ANY) {
            snprintf(value, sizeof value, "%s", js_shared(c, SH_VALUE));
        } else {
            size_t old = js_push_ptr(c, "additionalProperties");
            int e = js_schema_rule(c, addl, value);
            js_pop_ptr(c, old);
            if (e) goto done;
        }
        // extra keys cannot be listed ones: their values would have the listed schemas
        char key_rule[JS_NAME];
        const char **names = calloc((size_t)n + 1, sizeof *names);
        if (!names || js_new_name(c, key_rule)) {
            free(names);
            if (!names) js_fail(c, "out of memory");
            goto done;
        }
        int j = 0;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next) names[j++] = p->string;
        int nodes = js_key_excluding(c->out, key_rule, names, n);
        free(names);
        if (nodes < 0) {
            js_fail(c, "out of memory");
            goto done;
        }
        c->n_rules += nodes;
        gbnf_text t = {0};
        gbnf_printf(&t, "%s %s\":\" %s %s", key_rule, in, sep, value);
        if (js_new_name(c, extra_kv) || js_emit_rule(c, extra_kv, &t)) {
            gbnf_text_free(&t);
            goto done;
        }
        gbnf_text_free(&t);
    }
    // after[i]: members i.. once something is written (each with its comma); first[i]: the
    // first member written is i or later. Names are <base>-a<i> and <base>-f<i>.
    char base[JS_NAME];
    if (js_new_name(c, base)) goto done;
    for (int k = n; k >= 0; k--) {
        gbnf_text t = {0};
        if (k == n) {
            if (*extra_kv) gbnf_printf(&t, "(%s\",\" %s %s)*", in, sep, extra_kv);
        } else if (skip[k]) {
            gbnf_printf(&t, "%s-a%d", base, k + 1);
        } else {
            gbnf_printf(&t, required[k] ? "%s\",\" %s %s %s-a%d" : "(%s\",\" %s %s)? %s-a%d", in, sep, kv[k], base,
                        k + 1);
        }
        char an[JS_NAME + 16];
        snprintf(an, sizeof an, "%s-a%d", base, k);
        int e = js_emit_rule(c, an, &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    for (int k = n; k >= 0; k--) {
        gbnf_text t = {0};
        if (k == n) {
            if (*extra_kv) gbnf_printf(&t, "(%s %s-a%d)?", extra_kv, base, n);
        } else if (skip[k]) {
            gbnf_printf(&t, "%s-f%d", base, k + 1);
        } else if (required[k]) {
            gbnf_printf(&t, "%s %s-a%d", kv[k], base, k + 1);
        } else {
            gbnf_printf(&t, "%s %s-a%d | %s-f%d", kv[k], base, k + 1, base, k + 1);
        }
        char fn[JS_NAME + 16];
        snprintf(fn, sizeof fn, "%s-f%d", base, k);
        int e = js_emit_rule(c, fn, &t);
        gbnf_text_free(&t);
        if (e) goto done;
    }
    gbnf_printf(b, "\"{\" %s%s-f0 %s\"}\"", in, base, in);
    rc = 0;
done:
    free(kv);
    free(required);
    free(skip);
    c->struct_depth--;
    return rc;
}

// ---- arrays ----

int js_array_body(js_conv *c, const cJSON *s, gbnf_text *b) {
    const cJSON *prefix = js_get(s, "prefixItems"), *items = js_get(s, "items");
    const char *rest_key = "items";
    if (cJSON_IsArray(items)) {  // draft-07 tuples: items[] + additionalItems
        prefix = items;
        items = js_get(s, "additionalItems");
        rest_key = "additionalItems";
    }
    if (prefix && !cJSON_IsArray(prefix)) return js_fail(c, "prefixItems must be an array");
    if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items)) return js_fail(c, "items must be a schema");
    const cJSON *unique = js_get(s, "uniqueItems");
    if (cJSON_IsTrue(unique)) return js_fail(c, "uniqueItems is not supported");
    long k = cJSON_GetArraySize(prefix);
    long min = js_count_keyword(s, "minItems", 0), max = js_count_keyword(s, "maxItems", -1);
    if (min == -2 || max == -2) return js_fail(c, "minItems/maxItems must be non-negative integers");
    if (cJSON_IsFalse(items) && (max < 0 || max > k)) max = k;
    if (min > JS_MAX_COUNT || max > JS_MAX_COUNT || k > JS_MAX_COUNT)
        return js_fail(c, "array lengths above %d are not supported", JS_MAX_COUNT);
    if (max >= 0 && min > max) return js_fail(c, "minItems exceeds the items the array can hold");
    const char *in = c->inner, *sep = c->sep;
    if (max == 0) {
        gbnf_printf(b, "\"[\" %s\"]\"", in);
        return 0;
    }
    c->struct_depth++;
    int rc = -1;
    char(*elem)[JS_NAME] = calloc((size_t)k + 1, JS_NAME);  // prefix rules, then the rest's
    if (!elem) {
        js_fail(c, "out of memory");
        goto done;
    }
    int i = 0;
    for (const cJSON *p = prefix ? prefix->child : NULL; p; p = p->next, i++) {
        size_t old = js_push_index(c, prefix == js_get(s, "items") ? "items" : "prefixItems", i);
        int e = js_schema_rule(c, p, elem[i]);
        js_pop_ptr(c, old);
        if (e) goto done;
    }
    bool rest = max < 0 || max > k;
    if (rest) {
        if (!items || cJSON_IsTrue(items)) {
            snprintf(elem[k], JS_NAME, "%s", js_shared(c, SH_VALUE));
        } else {
            size_t old = js_push_ptr(c, rest_key);
            int e = js_schema_rule(c, items, elem[k]);
            js_pop_ptr(c, old);
            if (e && min <= k && js_take_pruned(c)) {  // past the recursion limit: no rest items
                rest = false;
                max = k;
            } else if (e) {
                goto done;
            }
        }
    }
    if (max == 0) {  // only the rest was allowed, and it is left out
        gbnf_printf(b, "\"[\" %s\"]\"", in);
        rc = 0;
        goto done;
    }
    // tail j (j items written): the prefix positions as a chain of rules, then a repetition
    char base[JS_NAME];
    if (js_new_name(c, base)) goto done;
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
        int e = js_emit_rule(c, tn, &t);
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

// allOf of plain object schemas (properties/required, through $refs) merged into one object:
// their properties in order, required joined. Extra keys then follow the usual policy, which
// is sound: every listed key still meets its own schema.
int js_allof_objects(js_conv *c, const cJSON *list, gbnf_text *b) {
    cJSON *merged = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    int rc = -1;
    if (!merged || !props || !req) {
        cJSON_Delete(props);
        cJSON_Delete(req);
        cJSON_Delete(merged);
        return js_fail(c, "out of memory");
    }
    cJSON_AddItemToObject(merged, "properties", props);
    cJSON_AddItemToObject(merged, "required", req);
    int i = 0;
    for (const cJSON *member = list->child; member; member = member->next, i++) {
        size_t old = js_push_index(c, "allOf", i);
        const cJSON *ref, *m = member;
        for (int hops = 0; cJSON_IsObject(m) && (ref = js_get(m, "$ref")) && hops < 16; hops++) {
            if (!cJSON_IsString(ref) || js_other_constraint(m, "$ref")) break;
            m = js_resolve_ref(c, ref->valuestring);
            if (!m) goto done;
        }
        const cJSON *type = js_get(m, "type");
        if (!cJSON_IsObject(m) || (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "object")))) {
            js_fail(c, "allOf with several members is supported for object schemas only");
            goto done;
        }
        for (const cJSON *k = m->child; k; k = k->next) {
            if (strcmp(k->string, "type") && strcmp(k->string, "properties") && strcmp(k->string, "required") &&
                !js_in_list(js_annotations, k->string)) {
                js_fail(c, "'%s' in a member of a merged allOf is not supported", k->string);
                goto done;
            }
        }
        const cJSON *mp = js_get(m, "properties"), *mr = js_get(m, "required");
        for (const cJSON *p = cJSON_IsObject(mp) ? mp->child : NULL; p; p = p->next) {
            if (js_get(props, p->string)) {
                js_fail(c, "property '%.60s' appears in two allOf members", p->string);
                goto done;
            }
            cJSON_AddItemReferenceToObject(props, p->string, (cJSON *)p);
        }
        for (const cJSON *r = cJSON_IsArray(mr) ? mr->child : NULL; r; r = r->next)
            if (cJSON_IsString(r)) cJSON_AddItemToArray(req, cJSON_CreateString(r->valuestring));
        js_pop_ptr(c, old);
    }
    rc = js_object_body(c, merged, b);
done:
    cJSON_Delete(merged);
    return rc;
}

