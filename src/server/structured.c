// Structured outputs for the server (structured.h).
#include "server/structured.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/gbnf_text.h"
#include "grammar/grammar_constraint.h"
#include "grammar/json_schema.h"
#include "grammar/regex_gbnf.h"
#include "io/json_util.h"
#include "util/err.h"
#include "util/log.h"

void kaon_structured_init(kaon_structured *st, const struct kaon_tokenizer *tok, int model_vocab) {
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->tok = tok;
    st->model_vocab = model_vocab;
}

void kaon_structured_destroy(kaon_structured *st) {
    for (int i = 0; i < KAON_STRUCTURED_CACHE; i++) {
        free(st->cache[i].key);
        if (st->cache[i].state) kaon_grammar_constraint_ops.free(st->cache[i].state);
    }
    kaon_grammar_vocab_free(st->vocab);
    pthread_mutex_destroy(&st->mu);
    memset(st, 0, sizeof *st);
}

// A function's parameters schema ({"type": "object"} when it declares none).
static cJSON *tool_parameters(const cJSON *tools, const char *name) {
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        cJSON *fn = kaon_json_field(t, "function"), *n = kaon_json_field(fn, "name");
        if (!cJSON_IsString(n) || (name && strcmp(n->valuestring, name))) continue;
        cJSON *p = kaon_json_field(fn, "parameters");
        if (p) return cJSON_Duplicate(p, 1);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "object");
        return o;
    }
    return NULL;
}

// tool_choice "required": a non-empty list of calls, each {"name": one of the tools,
// "parameters": that tool's schema} (the shape vLLM uses for it).
static cJSON *required_calls_schema(const cJSON *tools) {
    cJSON *root = cJSON_CreateObject(), *items = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "array");
    cJSON_AddNumberToObject(root, "minItems", 1);
    cJSON_AddItemToObject(root, "items", items);
    cJSON *any = cJSON_AddArrayToObject(items, "anyOf");
    for (const cJSON *t = tools ? tools->child : NULL; t && any; t = t->next) {
        cJSON *n = kaon_json_field(kaon_json_field(t, "function"), "name");
        if (!cJSON_IsString(n)) continue;
        cJSON *call = cJSON_CreateObject();
        cJSON_AddItemToArray(any, call);
        cJSON_AddStringToObject(call, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(call, "properties");
        cJSON *nm = cJSON_AddObjectToObject(props, "name");
        cJSON_AddStringToObject(nm, "const", n->valuestring);
        cJSON *params = tool_parameters(tools, n->valuestring);
        if (params) cJSON_AddItemToObject(props, "parameters", params);
        cJSON *req = cJSON_AddArrayToObject(call, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString("parameters"));
        cJSON_AddFalseToObject(call, "additionalProperties");
    }
    return root;
}

static int choice_gbnf(const char *spec, gbnf_text *t) {
    cJSON *arr = cJSON_Parse(spec);
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(arr);
        return kaon_set_error("choices: not a list");
    }
    gbnf_puts(t, "root ::= ");
    for (const cJSON *c = arr->child; c; c = c->next) {
        if (c != arr->child) gbnf_puts(t, " | ");
        gbnf_literal(t, c->valuestring, strlen(c->valuestring));
    }
    gbnf_puts(t, "\n");
    cJSON_Delete(arr);
    return 0;
}

char *kaon_structured_gbnf(const kaon_api_request *r, bool *none, kaon_api_error *err) {
    *none = false;
    gbnf_text t = {0};
    kaon_json_schema_opts opts = {.any_whitespace = false, .strict = true};
    const char *param = r->format_param ? r->format_param : "tool_choice";
    int rc = 0;
    if (r->tool_choice_name || r->tool_choice_required) {
        cJSON *schema = r->tool_choice_name ? tool_parameters(r->tools, r->tool_choice_name)
                                            : required_calls_schema(r->tools);
        char *text = schema ? cJSON_PrintUnformatted(schema) : NULL;
        cJSON_Delete(schema);
        rc = text ? kaon_json_schema_to_gbnf(text, strlen(text), "root", &opts, &t)
                  : kaon_set_error("out of memory");
        free(text);
        param = "tools";
    } else {
        const char *spec = r->format_spec;
        switch (r->format) {
        case KAON_API_FORMAT_TEXT: *none = true; return NULL;
        case KAON_API_FORMAT_JSON_SCHEMA:
            rc = kaon_json_schema_to_gbnf(spec, strlen(spec), "root", &opts, &t);
            break;
        case KAON_API_FORMAT_JSON_OBJECT: rc = kaon_json_any_to_gbnf("root", true, &opts, &t); break;
        case KAON_API_FORMAT_REGEX: rc = kaon_regex_to_gbnf(spec, strlen(spec), "root", false, &t); break;
        case KAON_API_FORMAT_CHOICE: rc = choice_gbnf(spec, &t); break;
        case KAON_API_FORMAT_GRAMMAR: gbnf_puts(&t, spec); break;
        }
    }
    if (rc == 0 && t.oom) rc = kaon_set_error("out of memory");
    if (rc < 0) {
        kaon_api_error_set(err, 400, "invalid_value", param, "cannot build the output grammar: %s",
                           kaon_last_error());
        gbnf_text_free(&t);
        return NULL;
    }
    return t.s;
}

// The cached template state for text, or a new one (cached). Called with st->mu held.
static void *cached_template(kaon_structured *st, const char *text) {
    int slot = 0;
    for (int i = 0; i < KAON_STRUCTURED_CACHE; i++) {
        if (st->cache[i].key && !strcmp(st->cache[i].key, text)) {
            st->cache[i].used = ++st->clock;
            return st->cache[i].state;
        }
        if (st->cache[i].used < st->cache[slot].used) slot = i;
    }
    kaon_grammar *g = kaon_grammar_parse(text, strlen(text), NULL);
    if (!g) return NULL;
    void *state = kaon_grammar_constraint_new(g, st->vocab);
    char *key = state ? strdup(text) : NULL;
    if (!key) {
        if (state) kaon_grammar_constraint_ops.free(state);
        kaon_set_error("out of memory");
        return NULL;
    }
    free(st->cache[slot].key);
    if (st->cache[slot].state) kaon_grammar_constraint_ops.free(st->cache[slot].state);
    st->cache[slot].key = key;
    st->cache[slot].state = state;
    st->cache[slot].used = ++st->clock;
    return state;
}

void *kaon_structured_state(kaon_structured *st, const kaon_api_request *r, bool *none,
                            kaon_api_error *err) {
    char *text = kaon_structured_gbnf(r, none, err);
    if (!text) return NULL;
    const char *param = r->format_param ? r->format_param : "tool_choice";
    void *state = NULL;
    pthread_mutex_lock(&st->mu);
    if (!st->tok) {
        kaon_set_error("this model has no tokenizer");
    } else if (!st->vocab && !(st->vocab = kaon_grammar_vocab_from_tokenizer(st->tok))) {
        // kaon_last_error says why
    } else if (kaon_grammar_vocab_size(st->vocab) > st->model_vocab) {
        kaon_set_error("the tokenizer has more tokens (%d) than the model's logits (%d)",
                       kaon_grammar_vocab_size(st->vocab), st->model_vocab);
    } else {
        void *tmpl = cached_template(st, text);
        state = tmpl ? kaon_grammar_constraint_ops.clone(tmpl) : NULL;
        if (tmpl && !state) kaon_set_error("out of memory");
    }
    pthread_mutex_unlock(&st->mu);
    if (!state) {
        kaon_api_error_set(err, 400, "invalid_value", param, "cannot use the output grammar: %s",
                           kaon_last_error());
        KAON_DEBUG("structured: grammar was:\n%s", text);
    }
    free(text);
    return state;
}
