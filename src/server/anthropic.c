// Anthropic's Messages API mapped onto the OpenAI chat path (see anthropic.h).
#include "server/anthropic.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_util.h"

// ---- errors ------------------------------------------------------------------------------------

static int bad(kaon_api_error *err, const char *param, const char *fmt, ...) KAON_PRINTF(3, 4);
static int bad(kaon_api_error *err, const char *param, const char *fmt, ...) {
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kaon_api_error_set(err, 400, "invalid_value", param, "%s", msg);
    err->anthropic = true;
    return -1;
}

static int oom(kaon_api_error *err) {
    kaon_api_error_set(err, 500, NULL, NULL, "out of memory");
    err->anthropic = true;
    return -1;
}

const char *kaon_anthropic_error_type(int status) {
    switch (status) {
    case 400: case 405: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return "api_error";
    }
}

char *kaon_anthropic_error_json(const kaon_api_error *e, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (err) {
        cJSON_AddStringToObject(err, "type", kaon_anthropic_error_type(e->status));
        char msg[sizeof e->message + sizeof e->param + 16];
        size_t n = strnlen(e->message, sizeof e->message);
        // OpenAI's `param` has no place in Anthropic's shape: it opens the message instead.
        int k = e->param[0] ? snprintf(msg, sizeof msg, "%.*s: %.*s", (int)sizeof e->param,
                                       e->param, (int)n, e->message)
                            : snprintf(msg, sizeof msg, "%.*s", (int)n, e->message);
        if (k < 0) msg[0] = 0;
        cJSON_AddItemToObject(err, "message", kaon_api_string(msg, strlen(msg)));
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (s && len) *len = strlen(s);
    return s;
}

// ---- the request -------------------------------------------------------------------------------

// Copies root[from] into chat[to] when present.
static int pass(const cJSON *root, const char *from, cJSON *chat, const char *to,
                kaon_api_error *err) {
    cJSON *it = kaon_json_field(root, from);
    if (!it) return 0;
    cJSON *d = cJSON_Duplicate(it, 1);
    if (!d || !cJSON_AddItemToObject(chat, to, d)) {
        cJSON_Delete(d);
        return oom(err);
    }
    return 0;
}

static int add_text_part(cJSON *parts, const char *text, kaon_api_error *err) {
    cJSON *p = cJSON_CreateObject();
    if (!p || !cJSON_AddItemToArray(parts, p)) {
        cJSON_Delete(p);
        return oom(err);
    }
    if (!cJSON_AddStringToObject(p, "type", "text") || !cJSON_AddStringToObject(p, "text", text))
        return oom(err);
    return 0;
}

// A block list's `type`, or NULL with err set.
static const char *block_type(const cJSON *b, const char *param, kaon_api_error *err) {
    cJSON *type = cJSON_IsObject(b) ? kaon_json_field(b, "type") : NULL;
    if (!cJSON_IsString(type)) {
        bad(err, param, "each content block must be an object with a string 'type'");
        return NULL;
    }
    return type->valuestring;
}

// Text blocks (system, tool_result content) as OpenAI text parts; a string stays a string.
static cJSON *text_blocks(const cJSON *c, const char *param, kaon_api_error *err) {
    if (cJSON_IsString(c)) {
        cJSON *s = cJSON_CreateString(c->valuestring);
        if (!s) oom(err);
        return s;
    }
    if (!cJSON_IsArray(c)) {
        bad(err, param, "must be a string or a list of text blocks");
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    if (!parts) {
        oom(err);
        return NULL;
    }
    for (cJSON *b = c->child; b; b = b->next) {
        const char *type = block_type(b, param, err);
        cJSON *text = type ? kaon_json_field(b, "text") : NULL;
        if (!type) goto fail;
        if (strcmp(type, "text")) {
            bad(err, param, "content block type '%.40s' is not supported here (only text)", type);
            goto fail;
        }
        if (!cJSON_IsString(text)) {
            bad(err, param, "a text block needs a string 'text'");
            goto fail;
        }
        if (add_text_part(parts, text->valuestring, err) < 0) goto fail;
    }
    return parts;
fail:
    cJSON_Delete(parts);
    return NULL;
}

// Appends {"role": role, "content": content (owned)} to msgs; extra (owned, may be NULL) is
// merged in.
static int add_message(cJSON *msgs, const char *role, cJSON *content, kaon_api_error *err) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(msgs, m)) {
        cJSON_Delete(m);
        cJSON_Delete(content);
        return oom(err);
    }
    if (!cJSON_AddStringToObject(m, "role", role) || !cJSON_AddItemToObject(m, "content", content)) {
        cJSON_Delete(content);
        return oom(err);
    }
    return 0;
}

// A user turn: text blocks become one user message; each tool_result becomes a tool message
// (in order: text before a result is its own user message).
static int user_turn(const cJSON *content, int i, cJSON *msgs, kaon_api_error *err) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (cJSON_IsString(content))
        return add_message(msgs, "user", cJSON_CreateString(content->valuestring), err);
    cJSON *parts = cJSON_CreateArray();
    if (!parts) return oom(err);
    int added = 0;
    for (cJSON *b = content->child; b; b = b->next) {
        const char *type = block_type(b, param, err);
        if (!type) goto fail;
        if (!strcmp(type, "text")) {
            cJSON *text = kaon_json_field(b, "text");
            if (!cJSON_IsString(text)) {
                bad(err, param, "a text block needs a string 'text'");
                goto fail;
            }
            if (add_text_part(parts, text->valuestring, err) < 0) goto fail;
        } else if (!strcmp(type, "tool_result")) {
            cJSON *id = kaon_json_field(b, "tool_use_id"), *c = kaon_json_field(b, "content"), *ie = kaon_json_field(b, "is_error");
            if (!cJSON_IsString(id)) {
                bad(err, param, "a tool_result block needs a string 'tool_use_id'");
                goto fail;
            }
            if (ie && !cJSON_IsBool(ie)) {
                bad(err, param, "'is_error' must be a boolean");
                goto fail;
            }
            if (parts->child) {
                if (add_message(msgs, "user", parts, err) < 0) return -1;
                if (!(parts = cJSON_CreateArray())) return oom(err);
            }
            cJSON *text = c ? text_blocks(c, param, err) : cJSON_CreateString("");
            if (!text) goto fail;
            if (add_message(msgs, "tool", text, err) < 0) goto fail;
            cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
            if (!cJSON_AddStringToObject(m, "tool_call_id", id->valuestring)) {
                oom(err);
                goto fail;
            }
            added++;
        } else if (!strcmp(type, "image") || !strcmp(type, "document")) {
            bad(err, param, "content block type '%s' is not supported by this model", type);
            goto fail;
        } else {
            bad(err, param, "content block type '%.40s' is not supported in a user message", type);
            goto fail;
        }
    }
    if (parts->child || !added) return add_message(msgs, "user", parts, err);
    cJSON_Delete(parts);
    return 0;
fail:
    cJSON_Delete(parts);
    return -1;
}

// An assistant turn: text blocks become its content, tool_use blocks its tool_calls (arguments
// as JSON text, as OpenAI sends them), thinking blocks its reasoning_content.
static int assistant_turn(const cJSON *content, int i, cJSON *msgs, kaon_api_error *err) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (cJSON_IsString(content))
        return add_message(msgs, "assistant", cJSON_CreateString(content->valuestring), err);
    cJSON *parts = cJSON_CreateArray(), *calls = cJSON_CreateArray();
    kaon_sbuf thinking = {0};
    bool saw_thinking = false;
    if (!parts || !calls) {
        oom(err);
        goto fail;
    }
    for (cJSON *b = content->child; b; b = b->next) {
        const char *type = block_type(b, param, err);
        if (!type) goto fail;
        if (!strcmp(type, "text")) {
            cJSON *text = kaon_json_field(b, "text");
            if (!cJSON_IsString(text)) {
                bad(err, param, "a text block needs a string 'text'");
                goto fail;
            }
            if (add_text_part(parts, text->valuestring, err) < 0) goto fail;
        } else if (!strcmp(type, "tool_use")) {
            cJSON *id = kaon_json_field(b, "id"), *name = kaon_json_field(b, "name"), *input = kaon_json_field(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || (input && !cJSON_IsObject(input))) {
                bad(err, param, "a tool_use block needs a string 'id', a string 'name' and an "
                                "object 'input'");
                goto fail;
            }
            char *args = input ? cJSON_PrintUnformatted(input) : strdup("{}");
            cJSON *call = cJSON_CreateObject(), *fn = NULL;
            bool ok = args && call && cJSON_AddItemToArray(calls, call);
            if (!ok) cJSON_Delete(call);
            ok = ok && cJSON_AddStringToObject(call, "id", id->valuestring) &&
                 cJSON_AddStringToObject(call, "type", "function") &&
                 (fn = cJSON_AddObjectToObject(call, "function")) &&
                 cJSON_AddStringToObject(fn, "name", name->valuestring) &&
                 cJSON_AddStringToObject(fn, "arguments", args);
            free(args);
            if (!ok) {
                oom(err);
                goto fail;
            }
        } else if (!strcmp(type, "thinking")) {
            cJSON *t = kaon_json_field(b, "thinking");
            if (!cJSON_IsString(t)) {
                bad(err, param, "a thinking block needs a string 'thinking'");
                goto fail;
            }
            kaon_sbuf_puts(&thinking, t->valuestring);
            saw_thinking = true;
        } else if (!strcmp(type, "redacted_thinking")) {
            continue;  // opaque to this server
        } else {
            bad(err, param, "content block type '%.40s' is not supported in an assistant message",
                type);
            goto fail;
        }
    }
    if (thinking.failed) {
        oom(err);
        goto fail;
    }
    // No text beside tool calls: content null, as OpenAI clients send it.
    cJSON *c = parts->child || !calls->child ? parts : cJSON_CreateNull();
    if (c != parts) cJSON_Delete(parts);
    parts = NULL;
    if (add_message(msgs, "assistant", c, err) < 0) goto fail;
    cJSON *m = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    if (calls->child) {
        cJSON_AddItemToObject(m, "tool_calls", calls);
        calls = NULL;
    }
    if (saw_thinking &&
        !cJSON_AddStringToObject(m, "reasoning_content", thinking.data ? thinking.data : "")) {
        oom(err);
        goto fail;
    }
    cJSON_Delete(calls);
    kaon_sbuf_free(&thinking);
    return 0;
fail:
    cJSON_Delete(parts);
    cJSON_Delete(calls);
    kaon_sbuf_free(&thinking);
    return -1;
}

static int convert_messages(const cJSON *root, cJSON *chat, kaon_api_error *err) {
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    if (!msgs) return oom(err);
    cJSON *sys = kaon_json_field(root, "system");
    if (sys) {
        cJSON *c = text_blocks(sys, "system", err);
        if (!c) return -1;
        if ((cJSON_IsString(c) && !c->valuestring[0]) || (cJSON_IsArray(c) && !c->child))
            cJSON_Delete(c);  // an empty system prompt is no system turn
        else if (add_message(msgs, "system", c, err) < 0)
            return -1;
    }
    cJSON *in = kaon_json_field(root, "messages");
    if (!in) return bad(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(in)) return bad(err, "messages", "'messages' must be a list");
    if (!in->child) return bad(err, "messages", "'messages' must not be empty");
    int i = 0;
    for (cJSON *m = in->child; m; m = m->next, i++) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return bad(err, param, "each message must be an object");
        cJSON *role = kaon_json_field(m, "role"), *content = kaon_json_field(m, "content");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role) ||
            (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
            return bad(err, param, "invalid role '%.40s': messages alternate 'user' and "
                                   "'assistant' (the system prompt is the top-level 'system')",
                       cJSON_IsString(role) ? role->valuestring : "(missing or not a string)");
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (!content) return bad(err, param, "message %d has no 'content'", i);
        if (!cJSON_IsString(content) && !cJSON_IsArray(content))
            return bad(err, param, "'content' must be a string or a list of content blocks");
        int rc = role->valuestring[0] == 'u' ? user_turn(content, i, msgs, err)
                                             : assistant_turn(content, i, msgs, err);
        if (rc < 0) return -1;
    }
    return 0;
}

// tools: [{"name", "description", "input_schema"}] as OpenAI's function tools.
static int convert_tools(const cJSON *root, cJSON *chat, kaon_api_error *err) {
    cJSON *tools = kaon_json_field(root, "tools");
    if (!tools) return 0;
    if (!cJSON_IsArray(tools)) return bad(err, "tools", "'tools' must be a list");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    if (!out) return oom(err);
    int i = 0;
    for (cJSON *t = tools->child; t; t = t->next, i++) {
        char param[48];
        snprintf(param, sizeof param, "tools[%d]", i);
        if (!cJSON_IsObject(t)) return bad(err, param, "each tool must be an object");
        cJSON *type = kaon_json_field(t, "type"), *name = kaon_json_field(t, "name"), *desc = kaon_json_field(t, "description");
        cJSON *schema = kaon_json_field(t, "input_schema");
        if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "custom")))
            return bad(err, param, "tool type '%.60s' is not supported (only client tools "
                                   "with an input_schema)",
                       cJSON_IsString(type) ? type->valuestring : "(not a string)");
        if (!cJSON_IsString(name) || !name->valuestring[0])
            return bad(err, param, "a tool needs a string 'name'");
        if (desc && !cJSON_IsString(desc))
            return bad(err, param, "a tool's 'description' must be a string");
        if (!cJSON_IsObject(schema))
            return bad(err, param, "a tool needs an object 'input_schema'");
        cJSON *o = cJSON_CreateObject(), *fn = NULL, *sc = cJSON_Duplicate(schema, 1);
        bool ok = o && sc && cJSON_AddItemToArray(out, o);
        if (!ok) cJSON_Delete(o);
        ok = ok && cJSON_AddStringToObject(o, "type", "function") &&
             (fn = cJSON_AddObjectToObject(o, "function")) &&
             cJSON_AddStringToObject(fn, "name", name->valuestring) &&
             (!desc || cJSON_AddStringToObject(fn, "description", desc->valuestring)) &&
             cJSON_AddItemToObject(fn, "parameters", sc);
        if (!ok) {
            if (!fn || !cJSON_GetObjectItemCaseSensitive(fn, "parameters")) cJSON_Delete(sc);
            return oom(err);
        }
    }
    return 0;
}

// tool_choice: auto, any ("required"), tool (a named function), none.
static int convert_tool_choice(const cJSON *root, cJSON *chat, kaon_api_error *err) {
    cJSON *tc = kaon_json_field(root, "tool_choice");
    if (!tc) return 0;
    cJSON *type = cJSON_IsObject(tc) ? kaon_json_field(tc, "type") : NULL;
    if (!cJSON_IsString(type))
        return bad(err, "tool_choice", "'tool_choice' must be an object with a string 'type'");
    cJSON *dp = kaon_json_field(tc, "disable_parallel_tool_use");
    if (dp && !cJSON_IsBool(dp))
        return bad(err, "tool_choice", "'disable_parallel_tool_use' must be a boolean");
    const char *t = type->valuestring;
    cJSON *v = NULL;
    if (!strcmp(t, "auto") || !strcmp(t, "none")) {
        v = cJSON_CreateString(t);
    } else if (!strcmp(t, "any")) {
        v = cJSON_CreateString("required");
    } else if (!strcmp(t, "tool")) {
        cJSON *name = kaon_json_field(tc, "name");
        if (!cJSON_IsString(name))
            return bad(err, "tool_choice", "tool_choice {\"type\": \"tool\"} needs a string 'name'");
        cJSON *fn = NULL;
        v = cJSON_CreateObject();
        if (v && !(cJSON_AddStringToObject(v, "type", "function") &&
                   (fn = cJSON_AddObjectToObject(v, "function")) &&
                   cJSON_AddStringToObject(fn, "name", name->valuestring))) {
            cJSON_Delete(v);
            return oom(err);
        }
    } else {
        return bad(err, "tool_choice", "tool_choice type must be 'auto', 'any', 'tool' or 'none', "
                                       "got '%.40s'", t);
    }
    if (!v || !cJSON_AddItemToObject(chat, "tool_choice", v)) {
        cJSON_Delete(v);
        return oom(err);
    }
    return 0;
}

// thinking: {"type": "enabled", "budget_tokens"} or {"type": "disabled"}: the templates' own
// switch (enable_thinking; a template without one ignores it). "adaptive" and "between_tools"
// leave the template's default.
static int convert_thinking(const cJSON *root, cJSON *chat, kaon_api_error *err) {
    cJSON *th = kaon_json_field(root, "thinking");
    if (!th) return 0;
    cJSON *type = cJSON_IsObject(th) ? kaon_json_field(th, "type") : NULL;
    if (!cJSON_IsString(type) ||
        (strcmp(type->valuestring, "enabled") && strcmp(type->valuestring, "disabled") &&
         strcmp(type->valuestring, "adaptive") && strcmp(type->valuestring, "between_tools")))
        return bad(err, "thinking", "'thinking' type must be 'enabled', 'disabled', 'adaptive' or "
                                    "'between_tools'");
    cJSON *budget = kaon_json_field(th, "budget_tokens");
    if (budget && (!cJSON_IsNumber(budget) || budget->valuedouble < 1 ||
                   budget->valuedouble != floor(budget->valuedouble)))
        return bad(err, "thinking.budget_tokens", "'budget_tokens' must be a positive integer");
    if (type->valuestring[0] == 'a' || type->valuestring[0] == 'b') return 0;
    cJSON *kw = cJSON_AddObjectToObject(chat, "chat_template_kwargs");
    if (!kw || !cJSON_AddBoolToObject(kw, "enable_thinking", type->valuestring[0] == 'e'))
        return oom(err);
    return 0;
}

// output_config.format (or the older top-level output_format): {"type": "json_schema",
// "schema"} as OpenAI's response_format, so the output is constrained by the schema's grammar.
// output_config.effort is ignored.
static int convert_output_format(const cJSON *root, cJSON *chat, kaon_api_error *err) {
    cJSON *oc = kaon_json_field(root, "output_config"), *f = kaon_json_field(root, "output_format");
    const char *param = "output_format";
    if (oc) {
        if (!cJSON_IsObject(oc)) return bad(err, "output_config", "'output_config' must be an object");
        if (kaon_json_field(oc, "format")) {
            f = kaon_json_field(oc, "format");
            param = "output_config.format";
        }
    }
    if (!f) return 0;
    cJSON *type = cJSON_IsObject(f) ? kaon_json_field(f, "type") : NULL, *schema = kaon_json_field(f, "schema");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "json_schema") || !cJSON_IsObject(schema))
        return bad(err, param, "the output format must be {\"type\": \"json_schema\", \"schema\": {...}}");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format"), *js = NULL;
    cJSON *sc = cJSON_Duplicate(schema, 1);
    if (!sc || !rf || !cJSON_AddStringToObject(rf, "type", "json_schema") ||
        !(js = cJSON_AddObjectToObject(rf, "json_schema")) ||
        !cJSON_AddStringToObject(js, "name", "output") || !cJSON_AddItemToObject(js, "schema", sc)) {
        if (!js || !cJSON_GetObjectItemCaseSensitive(js, "schema")) cJSON_Delete(sc);
        return oom(err);
    }
    return 0;
}

cJSON *kaon_anthropic_to_chat(const cJSON *root, bool count_only, kaon_api_error *err) {
    if (!cJSON_IsObject(root)) {
        bad(err, NULL, "the request body must be a JSON object");
        return NULL;
    }
    cJSON *chat = cJSON_CreateObject();
    if (!chat) {
        oom(err);
        return NULL;
    }
    cJSON *model = kaon_json_field(root, "model");
    if (model && !cJSON_IsString(model)) {
        bad(err, "model", "'model' must be a string");
        goto fail;
    }
    if (pass(root, "model", chat, "model", err) < 0 || convert_messages(root, chat, err) < 0 ||
        convert_tools(root, chat, err) < 0 || convert_tool_choice(root, chat, err) < 0 ||
        convert_thinking(root, chat, err) < 0)
        goto fail;
    cJSON *md = kaon_json_field(root, "metadata");
    if (md && !cJSON_IsObject(md)) {
        bad(err, "metadata", "'metadata' must be an object");
        goto fail;
    }
    // A final assistant turn (without tool calls) is a prefill: the reply continues it.
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages");
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *last_role =
        last ? cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(last, "role")) : NULL;
    if (last_role && !strcmp(last_role, "assistant") &&
        !cJSON_GetObjectItemCaseSensitive(last, "tool_calls") &&
        (!cJSON_AddBoolToObject(chat, "add_generation_prompt", false) ||
         !cJSON_AddBoolToObject(chat, "continue_final_message", true))) {
        oom(err);
        goto fail;
    }
    if (count_only) return chat;
    if (convert_output_format(root, chat, err) < 0) goto fail;
    cJSON *mt = kaon_json_field(root, "max_tokens");
    if (!mt) {
        bad(err, "max_tokens", "'max_tokens' is required");
        goto fail;
    }
    cJSON *temp = kaon_json_field(root, "temperature");
    if (temp && cJSON_IsNumber(temp) && !(temp->valuedouble >= 0 && temp->valuedouble <= 1)) {
        bad(err, "temperature", "'temperature' must be in [0, 1], got %g", temp->valuedouble);
        goto fail;
    }
    cJSON *ss = kaon_json_field(root, "stop_sequences");
    if (ss && !cJSON_IsArray(ss)) {
        bad(err, "stop_sequences", "'stop_sequences' must be a list of strings");
        goto fail;
    }
    for (cJSON *s = ss ? ss->child : NULL; s; s = s->next)
        if (!cJSON_IsString(s)) {
            bad(err, "stop_sequences", "'stop_sequences' must be a list of strings");
            goto fail;
        }
    if (pass(root, "max_tokens", chat, "max_tokens", err) < 0 ||
        pass(root, "stop_sequences", chat, "stop", err) < 0 ||
        pass(root, "temperature", chat, "temperature", err) < 0 ||
        pass(root, "top_p", chat, "top_p", err) < 0 || pass(root, "top_k", chat, "top_k", err) < 0 ||
        pass(root, "stream", chat, "stream", err) < 0)
        goto fail;
    return chat;
fail:
    cJSON_Delete(chat);
    return NULL;
}

int kaon_anthropic_parse(const char *body, size_t len, bool count_only, const kaon_api_limits *lim,
                         const kaon_sampling *defaults, kaon_api_request *out,
                         kaon_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    cJSON *root = kaon_api_json_parse(body, len, err);
    cJSON *chat = root ? kaon_anthropic_to_chat(root, count_only, err) : NULL;
    cJSON_Delete(root);
    int rc = chat ? kaon_api_parse_json(KAON_API_CHAT, chat, lim, defaults, out, err) : -1;
    cJSON_Delete(chat);
    if (rc < 0 && !strcmp(err->param, "stop"))
        snprintf(err->param, sizeof err->param, "stop_sequences");
    if (rc < 0) err->anthropic = true;
    return rc;
}

// ---- responses ---------------------------------------------------------------------------------

const char *kaon_anthropic_stop_reason(const char *finish, bool stop_sequence, int n_calls) {
    if (finish && !strcmp(finish, "length")) return "max_tokens";
    if (n_calls > 0) return "tool_use";
    if (stop_sequence) return "stop_sequence";
    return "end_turn";
}

// A tool call's arguments text as the tool_use block's input object ({} when it is not one:
// a call cut short by max_tokens).
static cJSON *call_input(const cJSON *call) {
    cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    kaon_api_error e;  // (cJSON_Parse alone races on its global error position)
    cJSON *o = cJSON_IsString(args)
                   ? kaon_api_json_parse(args->valuestring, strlen(args->valuestring), &e)
                   : NULL;
    if (cJSON_IsObject(o)) return o;
    cJSON_Delete(o);
    return cJSON_CreateObject();
}

static const char *call_str(const cJSON *call, const char *key) {
    cJSON *it = cJSON_GetObjectItemCaseSensitive(call, key);
    if (!it) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        it = cJSON_GetObjectItemCaseSensitive(fn, key);
    }
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

// A JSON string from a C string (NULL: "").
static cJSON *jstr(const char *s) { return kaon_api_string(s ? s : "", s ? strlen(s) : 0); }

static cJSON *usage(long long in, long long out) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", (double)in);
    cJSON_AddNumberToObject(u, "output_tokens", (double)out);
    return u;
}

cJSON *kaon_anthropic_message(const char *id, const char *model, const char *thinking,
                              size_t thinking_len, const char *text, size_t text_len,
                              const cJSON *tool_calls, const char *stop_reason,
                              const char *stop_sequence, long long input_tokens,
                              long long output_tokens) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddItemToObject(m, "model", jstr(model));
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    if (thinking) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(content, b);
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddItemToObject(b, "thinking", kaon_api_string(thinking, thinking_len));
        cJSON_AddStringToObject(b, "signature", "");
    }
    bool calls = cJSON_GetArraySize(tool_calls) > 0;
    if (text_len > 0 || (!thinking && !calls)) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddItemToArray(content, b);
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddItemToObject(b, "text", kaon_api_string(text ? text : "", text ? text_len : 0));
    }
    for (cJSON *c = calls ? tool_calls->child : NULL; c; c = c->next) {
        cJSON *b = cJSON_CreateObject();
        const char *cid = call_str(c, "id"), *name = call_str(c, "name");
        cJSON_AddItemToArray(content, b);
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddItemToObject(b, "id", jstr(cid));
        cJSON_AddItemToObject(b, "name", jstr(name));
        cJSON_AddItemToObject(b, "input", call_input(c));
    }
    cJSON_AddStringToObject(m, "stop_reason", stop_reason ? stop_reason : "end_turn");
    if (stop_sequence)
        cJSON_AddItemToObject(m, "stop_sequence", jstr(stop_sequence));
    else
        cJSON_AddNullToObject(m, "stop_sequence");
    cJSON_AddItemToObject(m, "usage", usage(input_tokens, output_tokens));
    return m;
}

// ---- streams -----------------------------------------------------------------------------------

// `event: name` + `data: json` (j is freed).
static int event(kaon_sbuf *out, const char *name, cJSON *j) {
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return -1;
    int rc = kaon_sse_event(out, name, text, strlen(text));
    free(text);
    return rc;
}

static cJSON *typed(const char *type) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    return j;
}

int kaon_anthropic_stream_start(kaon_sbuf *out, const char *id, const char *model,
                                long long input_tokens) {
    cJSON *m = kaon_anthropic_message(id, model, NULL, 0, NULL, 0, NULL, NULL, NULL, input_tokens, 0);
    if (!m) return -1;
    // The message as it starts: no content, stop_reason null.
    cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateArray());
    cJSON_ReplaceItemInObjectCaseSensitive(m, "stop_reason", cJSON_CreateNull());
    cJSON *j = typed("message_start");
    cJSON_AddItemToObject(j, "message", m);
    int rc = event(out, "message_start", j);
    return rc | event(out, "ping", typed("ping"));
}

static int close_block(kaon_anthropic_stream *st, kaon_sbuf *out) {
    if (!st->open) return 0;
    st->open = 0;
    cJSON *j = typed("content_block_stop");
    cJSON_AddNumberToObject(j, "index", st->blocks - 1);
    return event(out, "content_block_stop", j);
}

// Opens a block of kind k (closing the one before) with its content_block (owned).
static int open_block(kaon_anthropic_stream *st, kaon_sbuf *out, int k, cJSON *block) {
    int rc = close_block(st, out);
    cJSON *j = typed("content_block_start");
    cJSON_AddNumberToObject(j, "index", st->blocks);
    cJSON_AddItemToObject(j, "content_block", block);
    st->blocks++;
    st->open = k;
    return rc | event(out, "content_block_start", j);
}

static int delta(kaon_anthropic_stream *st, kaon_sbuf *out, const char *type, const char *key,
                 const char *s, size_t n) {
    cJSON *j = typed("content_block_delta");
    cJSON_AddNumberToObject(j, "index", st->blocks - 1);
    cJSON *d = typed(type);
    cJSON_AddItemToObject(d, key, kaon_api_string(s, n));
    cJSON_AddItemToObject(j, "delta", d);
    return event(out, "content_block_delta", j);
}

int kaon_anthropic_stream_delta(kaon_anthropic_stream *st, kaon_sbuf *out, const char *thinking,
                                size_t thinking_len, const char *text, size_t text_len,
                                const cJSON *tool_calls) {
    int rc = 0;
    if (thinking && thinking_len) {
        if (st->open != 2) {
            cJSON *b = typed("thinking");
            cJSON_AddStringToObject(b, "thinking", "");
            cJSON_AddStringToObject(b, "signature", "");
            rc |= open_block(st, out, 2, b);
        }
        rc |= delta(st, out, "thinking_delta", "thinking", thinking, thinking_len);
    }
    if (text && text_len) {
        if (st->open != 1) {
            cJSON *b = typed("text");
            cJSON_AddStringToObject(b, "text", "");
            rc |= open_block(st, out, 1, b);
        }
        rc |= delta(st, out, "text_delta", "text", text, text_len);
    }
    for (cJSON *c = cJSON_IsArray(tool_calls) ? tool_calls->child : NULL; c; c = c->next) {
        const char *id = call_str(c, "id"), *name = call_str(c, "name");
        if (id || st->open != 3) {  // a new call
            cJSON *b = typed("tool_use");
            cJSON_AddItemToObject(b, "id", jstr(id));
            cJSON_AddItemToObject(b, "name", jstr(name));
            cJSON_AddItemToObject(b, "input", cJSON_CreateObject());
            rc |= open_block(st, out, 3, b);
        }
        const char *args = call_str(c, "arguments");
        if (args && args[0])
            rc |= delta(st, out, "input_json_delta", "partial_json", args, strlen(args));
    }
    return rc < 0 ? -1 : 0;
}

int kaon_anthropic_stream_stop(kaon_anthropic_stream *st, kaon_sbuf *out, const char *stop_reason,
                               const char *stop_sequence, long long output_tokens) {
    int rc = close_block(st, out);
    cJSON *j = typed("message_delta");
    cJSON *d = cJSON_AddObjectToObject(j, "delta");
    cJSON_AddStringToObject(d, "stop_reason", stop_reason ? stop_reason : "end_turn");
    if (stop_sequence)
        cJSON_AddItemToObject(d, "stop_sequence", jstr(stop_sequence));
    else
        cJSON_AddNullToObject(d, "stop_sequence");
    cJSON *u = cJSON_AddObjectToObject(j, "usage");
    cJSON_AddNumberToObject(u, "output_tokens", (double)output_tokens);
    rc |= event(out, "message_delta", j);
    rc |= event(out, "message_stop", typed("message_stop"));
    return rc < 0 ? -1 : 0;
}

int kaon_anthropic_stream_error(kaon_sbuf *out, const kaon_api_error *e) {
    size_t len = 0;
    char *text = kaon_anthropic_error_json(e, &len);
    if (!text) return -1;
    int rc = kaon_sse_event(out, "error", text, len);
    free(text);
    return rc;
}
