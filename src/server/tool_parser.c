// The tool-call parsers (tool_parser.h): names and detection, life, feeding and the JSON of the
// calls. The state machine over each family's format is in tool_parser_steps.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"
#include "server/tool_parser_internal.h"

// ---- families --------------------------------------------------------------------------------

static const struct {
    const char *name;
    kaon_tool_family f;
} family_names[] = {
    {"none", KAON_TOOL_NONE},          {"hermes", KAON_TOOL_HERMES},
    {"qwen", KAON_TOOL_HERMES},        {"qwen3", KAON_TOOL_HERMES},
    {"llama3_json", KAON_TOOL_LLAMA3_JSON}, {"llama", KAON_TOOL_LLAMA3_JSON},
    {"mistral", KAON_TOOL_MISTRAL},    {"deepseek_v3", KAON_TOOL_DEEPSEEK_V3},
    {"deepseek_r1", KAON_TOOL_DEEPSEEK_V3}, {"deepseek_v31", KAON_TOOL_DEEPSEEK_V3},
    {"kimi_k2", KAON_TOOL_KIMI_K2},
};

const char kaon_tool_family_names[] = "hermes (qwen, qwen3), llama3_json, mistral, deepseek_v3 "
                                      "(deepseek_r1, deepseek_v31), kimi_k2";

int kaon_tool_family_from_name(const char *name, kaon_tool_family *out) {
    for (size_t i = 0; name && i < sizeof family_names / sizeof *family_names; i++)
        if (!strcmp(name, family_names[i].name)) {
            *out = family_names[i].f;
            return 0;
        }
    return -1;
}

const char *kaon_tool_family_name(kaon_tool_family f) {
    switch (f) {
    case KAON_TOOL_HERMES: return "hermes";
    case KAON_TOOL_LLAMA3_JSON: return "llama3_json";
    case KAON_TOOL_MISTRAL: return "mistral";
    case KAON_TOOL_DEEPSEEK_V3: return "deepseek_v3";
    case KAON_TOOL_KIMI_K2: return "kimi_k2";
    default: return "none";
    }
}

kaon_tool_family kaon_tool_family_detect(const char *src) {
    if (!src) return KAON_TOOL_NONE;
    // The most specific markers first: several templates mention more than one.
    if (strstr(src, "<|tool_calls_section_begin|>") || strstr(src, "<|tool_call_begin|>"))
        return KAON_TOOL_KIMI_K2;
    if (strstr(src, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")) return KAON_TOOL_DEEPSEEK_V3;
    if (strstr(src, "[TOOL_CALLS]")) return KAON_TOOL_MISTRAL;
    if (strstr(src, "<tool_call>")) return KAON_TOOL_HERMES;
    if (strstr(src, "<|python_tag|>") || strstr(src, "ipython")) return KAON_TOOL_LLAMA3_JSON;
    return KAON_TOOL_NONE;
}

// ---- life --------------------------------------------------------------------------------------

kaon_tool_parser *kaon_tool_parser_new(kaon_tool_family f, const char *id_prefix) {
    if (f == KAON_TOOL_NONE) return NULL;
    kaon_tool_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->fam = f;
    p->id_prefix = strdup(id_prefix ? id_prefix : "call_");
    // The buffer exists from the start: the steps point into it even when it is empty.
    if (!p->id_prefix || kaon_sbuf_append(&p->buf, "", 0) < 0) {
        kaon_tool_parser_free(p);
        return NULL;
    }
    p->at_start = f == KAON_TOOL_LLAMA3_JSON;
    p->after_obj = f == KAON_TOOL_HERMES ? S_HERMES_END
                   : f == KAON_TOOL_LLAMA3_JSON ? S_LLAMA_NEXT : S_MISTRAL_NEXT;
    return p;
}

kaon_tool_parser *kaon_tool_parser_new_forced(const char *name, const char *id_prefix) {
    kaon_tool_parser *p = kaon_tool_parser_new(KAON_TOOL_FORCED, id_prefix);
    if (!p) return NULL;
    p->after_obj = S_MISTRAL_NEXT;  // list entries: ',' and another, or ']'
    p->state = name ? S_ARGS_START : S_MISTRAL_OPEN;
    p->after = S_CALL_DONE;
    if (name && !(p->pending_name = strdup(name))) {
        kaon_tool_parser_free(p);
        return NULL;
    }
    return p;
}

void kaon_tool_parser_free(kaon_tool_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        kaon_sbuf_free(&p->calls[i].args);
    }
    free(p->calls);
    free(p->id_prefix);
    free(p->key);
    free(p->pending_name);
    free(p->pending_id);
    kaon_sbuf_free(&p->buf);
    free(p);
}

// ---- feeding ---------------------------------------------------------------------------------

static cJSON *build_delta(kaon_tool_parser *p) {
    cJSON *arr = NULL;
    for (int i = 0; i < p->n; i++) {
        tool_call *c = &p->calls[i];
        // A fragment never ends inside a UTF-8 sequence (JSON strings must be whole characters).
        size_t upto = p->final || !c->args.data
                          ? c->args.len
                          : c->sent + kaon_utf8_complete_prefix(c->args.data + c->sent,
                                                                c->args.len - c->sent);
        if (c->announced && c->sent == upto) continue;
        if (!arr && !(arr = cJSON_CreateArray())) break;
        cJSON *e = cJSON_CreateObject(), *fn = NULL;
        if (!e) break;
        cJSON_AddItemToArray(arr, e);
        cJSON_AddNumberToObject(e, "index", i);
        if (!c->announced) {
            cJSON_AddStringToObject(e, "id", c->id);
            cJSON_AddStringToObject(e, "type", "function");
        }
        fn = cJSON_AddObjectToObject(e, "function");
        if (!fn) break;
        if (!c->announced) cJSON_AddStringToObject(fn, "name", c->name);
        cJSON_AddItemToObject(fn, "arguments",
                              kaon_api_string(c->args.data ? c->args.data + c->sent : "",
                                              upto - c->sent));
        c->announced = true;
        c->sent = upto;
    }
    return arr;
}

static int run(kaon_tool_parser *p, kaon_sbuf *content, cJSON **delta) {
    if (delta) *delta = NULL;
    kaon_sbuf sink = {0};
    p->out = content ? content : &sink;
    // Each step consumes bytes or changes state; a bound guards against a loop that does neither.
    for (size_t guard = 0; kaon_tool_parser_step(p) && guard < 64 + 64 * p->buf.len; guard++) {}
    p->out = NULL;
    kaon_sbuf_free(&sink);
    if (delta) {
        *delta = build_delta(p);
    } else {
        for (int i = 0; i < p->n; i++) p->calls[i].announced = true, p->calls[i].sent = p->calls[i].args.len;
    }
    return p->oom || (content && content->failed) ? -1 : 0;
}

int kaon_tool_parser_feed(kaon_tool_parser *p, const char *text, size_t n, kaon_sbuf *content,
                          cJSON **delta) {
    if (delta) *delta = NULL;
    if (p->final) return 0;
    if (n && kaon_sbuf_append(&p->buf, text, n) < 0) return -1;
    return run(p, content, delta);
}

int kaon_tool_parser_finish(kaon_tool_parser *p, kaon_sbuf *content, cJSON **delta) {
    if (delta) *delta = NULL;
    if (p->final) return 0;
    p->final = true;
    return run(p, content, delta);
}

int kaon_tool_parser_n_calls(const kaon_tool_parser *p) { return p ? p->n : 0; }

const char *kaon_tool_parser_call_id(const kaon_tool_parser *p, int i) { return p->calls[i].id; }

const char *kaon_tool_parser_call_name(const kaon_tool_parser *p, int i) {
    return p->calls[i].name;
}

const char *kaon_tool_parser_call_args(const kaon_tool_parser *p, int i, size_t *len) {
    if (len) *len = p->calls[i].args.len;
    return p->calls[i].args.data ? p->calls[i].args.data : "";
}

cJSON *kaon_tool_parser_calls_json(const kaon_tool_parser *p) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && p && i < p->n; i++) {
        const tool_call *c = &p->calls[i];
        cJSON *e = cJSON_CreateObject();
        if (!e) break;
        cJSON_AddItemToArray(arr, e);
        cJSON_AddStringToObject(e, "id", c->id);
        cJSON_AddStringToObject(e, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(e, "function");
        if (!fn) break;
        cJSON_AddStringToObject(fn, "name", c->name);
        cJSON_AddItemToObject(fn, "arguments",
                              kaon_api_string(c->args.data ? c->args.data : "", c->args.len));
    }
    return arr;
}
