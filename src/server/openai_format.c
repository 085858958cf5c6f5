// Structured outputs in a request (openai.h): OpenAI's response_format, vLLM's
// structured_outputs and its older guided_* fields, and tool_choice. Only the request's shape is
// checked here; the grammar itself is built (and its errors reported) by server/structured.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_util.h"
#include "server/openai.h"

static int bad(kaon_api_error *err, const char *param, const char *msg) {
    kaon_api_error_set(err, 400, "invalid_value", param, "%s", msg);
    return -1;
}

static int oom(kaon_api_error *err) {
    kaon_api_error_set(err, 500, NULL, NULL, "out of memory");
    return -1;
}

static int set_format(kaon_api_request *r, kaon_api_format f, const char *param, char *spec,
                      kaon_api_error *err) {
    if (f != KAON_API_FORMAT_JSON_OBJECT && !spec) return oom(err);
    if (r->format != KAON_API_FORMAT_TEXT) {
        free(spec);
        kaon_api_error_set(err, 400, "invalid_value", param,
                           "'%s' and '%s' both constrain the output: send one", r->format_param,
                           param);
        return -1;
    }
    r->format = f;
    r->format_spec = spec;
    r->format_param = param;
    return 0;
}

// A schema given as an object (or true), or as JSON text (vLLM accepts both for guided_json).
static int set_schema(kaon_api_request *r, const cJSON *v, const char *param,
                      kaon_api_error *err) {
    if (cJSON_IsString(v)) {
        cJSON *j = cJSON_Parse(v->valuestring);
        bool ok = cJSON_IsObject(j) || cJSON_IsBool(j);
        cJSON_Delete(j);
        if (!ok) return bad(err, param, "the JSON schema is not a JSON object");
        return set_format(r, KAON_API_FORMAT_JSON_SCHEMA, param, strdup(v->valuestring), err);
    }
    if (!cJSON_IsObject(v) && !cJSON_IsBool(v))
        return bad(err, param, "the JSON schema must be an object");
    return set_format(r, KAON_API_FORMAT_JSON_SCHEMA, param, cJSON_PrintUnformatted(v), err);
}

static int set_string(kaon_api_request *r, kaon_api_format f, const cJSON *v, const char *param,
                      const char *what, kaon_api_error *err) {
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        char msg[128];
        snprintf(msg, sizeof msg, "'%s' must be a non-empty string (%s)", param, what);
        return bad(err, param, msg);
    }
    return set_format(r, f, param, strdup(v->valuestring), err);
}

static int set_choice(kaon_api_request *r, const cJSON *v, const char *param,
                      kaon_api_error *err) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return bad(err, param, "the choices must be a non-empty list of strings");
    for (const cJSON *c = v->child; c; c = c->next)
        if (!cJSON_IsString(c) || !c->valuestring[0])
            return bad(err, param, "each choice must be a non-empty string");
    return set_format(r, KAON_API_FORMAT_CHOICE, param, cJSON_PrintUnformatted(v), err);
}

static int parse_response_format(const cJSON *rf, kaon_api_request *r, kaon_api_error *err) {
    const char *P = "response_format";
    cJSON *t = cJSON_IsObject(rf) ? kaon_json_field(rf, "type") : NULL;
    if (!cJSON_IsString(t)) return bad(err, P, "'response_format' must be an object with a type");
    const char *type = t->valuestring;
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object"))
        return set_format(r, KAON_API_FORMAT_JSON_OBJECT, P, NULL, err);
    if (!strcmp(type, "json_schema")) {
        cJSON *js = kaon_json_field(rf, "json_schema");
        if (!cJSON_IsObject(js))
            return bad(err, P, "response_format json_schema needs a 'json_schema' object");
        cJSON *name = kaon_json_field(js, "name");
        if (name && !cJSON_IsString(name))
            return bad(err, P, "response_format json_schema's 'name' must be a string");
        cJSON *strict = kaon_json_field(js, "strict");
        if (strict && !cJSON_IsBool(strict))
            return bad(err, P, "response_format json_schema's 'strict' must be a boolean");
        cJSON *schema = kaon_json_field(js, "schema");
        if (!schema) return bad(err, P, "response_format json_schema needs a 'schema'");
        return set_schema(r, schema, P, err);
    }
    char msg[160];
    snprintf(msg, sizeof msg,
             "response_format type '%.40s' is not supported (text, json_object, json_schema)", type);
    return bad(err, P, msg);
}

// vLLM's structured_outputs object: exactly one of json, regex, choice, grammar, json_object.
static int parse_structured_outputs(const cJSON *so, kaon_api_request *r, kaon_api_error *err) {
    const char *P = "structured_outputs";
    if (!cJSON_IsObject(so)) return bad(err, P, "'structured_outputs' must be an object");
    int n = 0;
    cJSON *v;
    if ((v = kaon_json_field(so, "json")) && ++n && set_schema(r, v, P, err) < 0) return -1;
    if ((v = kaon_json_field(so, "regex")) && ++n &&
        set_string(r, KAON_API_FORMAT_REGEX, v, P, "a regular expression", err) < 0)
        return -1;
    if ((v = kaon_json_field(so, "choice")) && ++n && set_choice(r, v, P, err) < 0) return -1;
    if ((v = kaon_json_field(so, "grammar")) && ++n &&
        set_string(r, KAON_API_FORMAT_GRAMMAR, v, P, "a GBNF grammar", err) < 0)
        return -1;
    if ((v = kaon_json_field(so, "json_object"))) {
        if (!cJSON_IsBool(v)) return bad(err, P, "structured_outputs.json_object must be a boolean");
        if (cJSON_IsTrue(v) && ++n && set_format(r, KAON_API_FORMAT_JSON_OBJECT, P, NULL, err) < 0)
            return -1;
    }
    if ((v = kaon_json_field(so, "structural_tag")))
        return bad(err, P, "structured_outputs.structural_tag is not supported");
    if (n == 0)
        return bad(err, P, "'structured_outputs' needs one of json, regex, choice, grammar, "
                           "json_object");
    return 0;
}

int kaon_api_parse_format(const cJSON *root, kaon_api_request *r, kaon_api_error *err) {
    cJSON *v;
    if ((v = kaon_json_field(root, "response_format")) && parse_response_format(v, r, err) < 0) return -1;
    if ((v = kaon_json_field(root, "structured_outputs")) && parse_structured_outputs(v, r, err) < 0)
        return -1;
    if ((v = kaon_json_field(root, "guided_json")) && set_schema(r, v, "guided_json", err) < 0) return -1;
    if ((v = kaon_json_field(root, "guided_regex")) &&
        set_string(r, KAON_API_FORMAT_REGEX, v, "guided_regex", "a regular expression", err) < 0)
        return -1;
    if ((v = kaon_json_field(root, "guided_choice")) && set_choice(r, v, "guided_choice", err) < 0)
        return -1;
    if ((v = kaon_json_field(root, "guided_grammar")) &&
        set_string(r, KAON_API_FORMAT_GRAMMAR, v, "guided_grammar", "a GBNF grammar", err) < 0)
        return -1;
    return 0;
}

static bool has_tool(const cJSON *tools, const char *name) {
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        cJSON *n = kaon_json_field(kaon_json_field(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return true;
    }
    return false;
}

int kaon_api_parse_tool_choice(const cJSON *tc, kaon_api_request *r, kaon_api_error *err) {
    const char *P = "tool_choice";
    bool any_tools = r->tools && cJSON_GetArraySize(r->tools) > 0;
    if (cJSON_IsString(tc)) {
        const char *v = tc->valuestring;
        if (!strcmp(v, "none") || !strcmp(v, "auto")) {
            r->tool_choice_none = !strcmp(v, "none");
            return 0;
        }
        if (strcmp(v, "required"))
            return bad(err, P, "'tool_choice' must be 'none', 'auto', 'required' or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (!any_tools) return bad(err, P, "tool_choice 'required' needs 'tools'");
        r->tool_choice_required = true;
    } else {
        cJSON *type = kaon_json_field(tc, "type"), *fn = kaon_json_field(tc, "function");
        cJSON *name = cJSON_IsObject(fn) ? kaon_json_field(fn, "name") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
            !cJSON_IsString(name))
            return bad(err, P, "a named tool_choice is {\"type\": \"function\", \"function\": "
                               "{\"name\": ...}}");
        if (!has_tool(r->tools, name->valuestring)) {
            char msg[200];
            snprintf(msg, sizeof msg, "tool_choice names '%.100s', which is not in 'tools'",
                     name->valuestring);
            return bad(err, P, msg);
        }
        if (!(r->tool_choice_name = strdup(name->valuestring))) return oom(err);
    }
    if (r->format != KAON_API_FORMAT_TEXT) {
        char msg[160];
        snprintf(msg, sizeof msg, "a forced tool_choice and '%s' both constrain the output",
                 r->format_param);
        return bad(err, P, msg);
    }
    return 0;
}
