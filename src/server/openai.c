#include "server/openai.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json_util.h"
#include "server/sse.h"
#include "util/log.h"

// cJSON's parser writes a global error position on every call (a data race between HTTP
// threads), so parsing is serialised; it is fast next to tokenizing and templating.
static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;

static cJSON *json_parse(const char *body, size_t len, size_t *err_at) {
    const char *end = NULL;
    pthread_mutex_lock(&parse_mu);
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    pthread_mutex_unlock(&parse_mu);
    if (!root) {
        *err_at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return NULL;
    }
    // Only whitespace may follow the value.
    size_t pos = end && end >= body && end <= body + len ? (size_t)(end - body) : len;
    while (pos < len && (body[pos] == ' ' || body[pos] == '\t' || body[pos] == '\n' ||
                         body[pos] == '\r' || body[pos] == 0))
        pos++;
    if (pos < len) {
        cJSON_Delete(root);
        *err_at = pos;
        return NULL;
    }
    return root;
}

// ---- errors ------------------------------------------------------------------------------------

void kaon_api_error_set(kaon_api_error *e, int status, const char *code, const char *param,
                        const char *fmt, ...) {
    e->status = status;
    e->anthropic = false;
    switch (status) {
    case 400: case 404: case 405: case 413: case 422: e->type = "invalid_request_error"; break;
    case 401: e->type = "authentication_error"; break;
    case 429: e->type = "rate_limit_error"; break;
    case 503: e->type = "service_unavailable"; break;
    case 504: e->type = "timeout_error"; break;
    default: e->type = "server_error"; break;
    }
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *kaon_api_error_json(const kaon_api_error *e, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    if (err) {
        cJSON_AddItemToObject(err, "message",
                              kaon_api_string(e->message, strnlen(e->message, sizeof e->message)));
        cJSON_AddStringToObject(err, "type", e->type ? e->type : "server_error");
        if (e->param[0])
            cJSON_AddItemToObject(err, "param",
                                  kaon_api_string(e->param, strnlen(e->param, sizeof e->param)));
        else
            cJSON_AddNullToObject(err, "param");
        if (e->code)
            cJSON_AddStringToObject(err, "code", e->code);
        else
            cJSON_AddNullToObject(err, "code");
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (s && len) *len = strlen(s);
    return s;
}

// ---- field readers -------------------------------------------------------------------------
// Each returns 0 when the field is absent or null (leaving *out), 1 when set, -1 on a type or
// range error (err filled, param = the field name).

static int bad(kaon_api_error *err, const char *param, const char *fmt, ...) KAON_PRINTF(3, 4);
static int bad(kaon_api_error *err, const char *param, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kaon_api_error_set(err, 400, "invalid_value", param, "%s", msg);
    return -1;
}

static int read_bool(const cJSON *obj, const char *key, bool *out, kaon_api_error *err) {
    cJSON *it = kaon_json_field(obj, key);
    if (!it) return 0;
    if (!cJSON_IsBool(it)) return bad(err, key, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(it);
    return 1;
}

// Integers arrive as doubles: accept only integral values within [lo, hi].
static int read_int64(const cJSON *obj, const char *key, long long lo, long long hi,
                      long long *out, kaon_api_error *err) {
    cJSON *it = kaon_json_field(obj, key);
    if (!it) return 0;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v))
        return bad(err, key, "'%s' must be an integer", key);
    if (v < (double)lo || v > (double)hi)
        return bad(err, key, "'%s' must be between %lld and %lld, got %.17g", key, lo, hi, v);
    *out = v >= 9.2233720368547758e18 ? LLONG_MAX : (long long)v;
    return 1;
}

static int read_int(const cJSON *obj, const char *key, int lo, int hi, int *out,
                    kaon_api_error *err) {
    long long v;
    int rc = read_int64(obj, key, lo, hi, &v, err);
    if (rc == 1) *out = (int)v;
    return rc;
}

static int read_float(const cJSON *obj, const char *key, double lo, double hi, bool lo_open,
                      float *out, kaon_api_error *err) {
    cJSON *it = kaon_json_field(obj, key);
    if (!it) return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return bad(err, key, "'%s' must be a number", key);
    double v = it->valuedouble;
    if (v < lo || v > hi || (lo_open && v == lo)) {
        if (isinf(hi))
            return bad(err, key, "'%s' must be %s %g, got %g", key, lo_open ? ">" : ">=", lo, v);
        return bad(err, key, "'%s' must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo,
                   hi, v);
    }
    *out = (float)v;
    return 1;
}

static int oom(kaon_api_error *err) {
    kaon_api_error_set(err, 500, NULL, NULL, "out of memory");
    return -1;
}

// A token id array: non-empty when require_nonempty, every id in [0, vocab).
static int read_ids(const cJSON *arr, const char *param, const kaon_api_limits *lim,
                    bool require_nonempty, int32_t **ids, int *n_ids, kaon_api_error *err) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0 && require_nonempty) return bad(err, param, "'%s' must not be empty", param);
    int32_t *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    if (!v) return oom(err);
    int i = 0;
    for (cJSON *it = arr->child; it; it = it->next, i++) {
        double d = it->valuedouble;
        if (!cJSON_IsNumber(it) || !isfinite(d) || d != floor(d)) {
            free(v);
            return bad(err, param, "'%s' must contain only integer token ids", param);
        }
        if (d < 0 || d > INT32_MAX || (lim->vocab_size > 0 && d >= lim->vocab_size)) {
            free(v);
            return bad(err, param, "token id %.17g in '%s' is out of range [0, %d)", d, param,
                       lim->vocab_size > 0 ? lim->vocab_size : INT32_MAX);
        }
        v[i] = (int32_t)d;
    }
    *ids = v;
    *n_ids = n;
    return 0;
}

// ---- the parts of a request ------------------------------------------------------------------

static const char *const common_keys[] = {
    "model", "stream", "stream_options", "n", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "seed",
    "max_tokens", "min_tokens", "ignore_eos", "stop", "stop_token_ids",
    "include_stop_str_in_output", "skip_special_tokens", "logprobs", "prompt_logprobs",
    "priority", "user", "add_special_tokens", "response_format", "best_of", "use_beam_search",
    "return_token_ids",
    "spaces_between_special_tokens", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "structured_outputs", NULL};
static const char *const chat_keys[] = {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "chat_template", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", NULL};
static const char *const completion_keys[] = {"prompt", "echo", "suffix", NULL};

static bool in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return true;
    return false;
}

static void log_unknown_fields(const cJSON *root, kaon_api_kind kind) {
    if (!kaon_log_enabled(KAON_LOG_DEBUG)) return;
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *k = it->string ? it->string : "";
        bool known = in_list(common_keys, k) ||
                     (kind == KAON_API_CHAT && in_list(chat_keys, k)) ||
                     (kind == KAON_API_COMPLETION && in_list(completion_keys, k));
        if (!known) KAON_DEBUG("openai: ignoring unknown field '%.64s'", k);
    }
}

static int parse_model(const cJSON *root, const kaon_api_limits *lim, kaon_api_request *r,
                       kaon_api_error *err) {
    cJSON *m = kaon_json_field(root, "model");
    if (!m) return 0;
    if (!cJSON_IsString(m)) return bad(err, "model", "'model' must be a string");
    if (lim->n_model_names > 0) {
        bool ok = false;
        for (int i = 0; i < lim->n_model_names && !ok; i++)
            ok = lim->model_names[i] && !strcmp(lim->model_names[i], m->valuestring);
        if (!ok) {
            kaon_api_error_set(err, 404, "model_not_found", "model",
                               "The model `%.200s` does not exist.", m->valuestring);
            return -1;
        }
    }
    r->model = strdup(m->valuestring);
    return r->model ? 0 : oom(err);
}

static int parse_stop(const cJSON *root, const kaon_api_limits *lim, kaon_api_request *r,
                      kaon_api_error *err) {
    cJSON *s = kaon_json_field(root, "stop");
    if (!s) return 0;
    int max_stop = lim->max_stop > 0 ? lim->max_stop : 16;
    int n = cJSON_IsString(s) ? 1 : cJSON_IsArray(s) ? cJSON_GetArraySize(s) : -1;
    if (n < 0) return bad(err, "stop", "'stop' must be a string or a list of strings");
    if (n > max_stop) return bad(err, "stop", "'stop' has %d strings; at most %d", n, max_stop);
    r->stop = calloc((size_t)(n ? n : 1), sizeof *r->stop);
    if (!r->stop) return oom(err);
    const cJSON *it = cJSON_IsString(s) ? s : s->child;
    for (int i = 0; i < n && it; i++, it = it->next) {
        if (!cJSON_IsString(it))
            return bad(err, "stop", "'stop' must be a string or a list of strings");
        if (!it->valuestring[0]) continue;  // an empty stop string would match everywhere
        if (strlen(it->valuestring) > 1024)
            return bad(err, "stop", "stop strings must be at most 1024 bytes");
        r->stop[r->n_stop] = strdup(it->valuestring);
        if (!r->stop[r->n_stop]) return oom(err);
        r->n_stop++;
    }
    return 0;
}

static int parse_logit_bias(const cJSON *root, const kaon_api_limits *lim, kaon_api_request *r,
                            kaon_api_error *err) {
    cJSON *b = kaon_json_field(root, "logit_bias");
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return bad(err, "logit_bias", "'logit_bias' must be an object");
    int n = cJSON_GetArraySize(b);
    if (n > 1024) return bad(err, "logit_bias", "'logit_bias' has %d entries; at most 1024", n);
    r->logit_bias = calloc((size_t)(n ? n : 1), sizeof *r->logit_bias);
    if (!r->logit_bias) return oom(err);
    for (cJSON *it = b->child; it; it = it->next) {
        const char *k = it->string ? it->string : "";
        char *end = NULL;
        errno = 0;
        long id = strtol(k, &end, 10);
        if (!k[0] || *end || errno || isspace((unsigned char)k[0]) || id < 0 || id > INT32_MAX ||
            (lim->vocab_size > 0 && id >= lim->vocab_size))
            return bad(err, "logit_bias", "logit_bias key '%.32s' is not a token id in [0, %d)",
                       k, lim->vocab_size > 0 ? lim->vocab_size : INT32_MAX);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 ||
            it->valuedouble > 100)
            return bad(err, "logit_bias", "logit_bias value for token %ld must be in [-100, 100]",
                       id);
        r->logit_bias[r->n_logit_bias].token = (int32_t)id;
        r->logit_bias[r->n_logit_bias].bias = (float)it->valuedouble;
        r->n_logit_bias++;
    }
    return 0;
}

// Fields shared by chat and completions.
static int parse_sampling(const cJSON *root, const kaon_api_limits *lim, kaon_api_request *r,
                          kaon_api_error *err) {
    kaon_sampling *s = &r->sampling;
    int max_n = lim->max_n > 0 ? lim->max_n : 128;
    if (read_bool(root, "stream", &r->stream, err) < 0) return -1;
    cJSON *so = kaon_json_field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return bad(err, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return bad(err, "stream_options",
                       "Stream options can only be defined when `stream=True`.");
        if (read_bool(so, "include_usage", &r->include_usage, err) < 0 ||
            read_bool(so, "continuous_usage_stats", &r->continuous_usage, err) < 0) {
            snprintf(err->param, sizeof err->param, "stream_options");
            return -1;
        }
    }
    if (read_int(root, "n", 1, max_n, &s->n, err) < 0) return -1;
    int best_of = 0;
    if (read_int(root, "best_of", 1, max_n, &best_of, err) < 0) return -1;
    if (best_of > 0 && best_of != s->n)
        return bad(err, "best_of", "best_of != n is not supported");
    bool beam = false;
    if (read_bool(root, "use_beam_search", &beam, err) < 0) return -1;
    if (beam) return bad(err, "use_beam_search", "beam search is not supported");
    if (read_float(root, "temperature", 0, 100, false, &s->temperature, err) < 0 ||
        read_float(root, "top_p", 0, 1, true, &s->top_p, err) < 0 ||
        read_float(root, "min_p", 0, 1, false, &s->min_p, err) < 0 ||
        read_float(root, "repetition_penalty", 0, 10, true, &s->repetition_penalty,
                   err) < 0 ||
        read_float(root, "presence_penalty", -2, 2, false, &s->presence_penalty, err) < 0 ||
        read_float(root, "frequency_penalty", -2, 2, false, &s->frequency_penalty, err) < 0)
        return -1;
    int top_k = 0;
    int rc = read_int(root, "top_k", -1, INT_MAX, &top_k, err);
    if (rc < 0) return -1;
    if (rc == 1) s->top_k = top_k;  // -1 and 0 both mean off
    long long seed;
    rc = read_int64(root, "seed", LLONG_MIN, LLONG_MAX, &seed, err);
    if (rc < 0) return -1;
    if (rc == 1) {
        s->has_seed = true;
        s->seed = (uint64_t)seed;
    }
    int max_tokens = 0;
    rc = read_int(root, "max_tokens", 1, INT_MAX, &max_tokens, err);
    if (rc < 0) return -1;
    if (rc == 1) r->max_tokens_set = true;
    if (r->kind == KAON_API_CHAT) {
        int mct = 0;
        rc = read_int(root, "max_completion_tokens", 1, INT_MAX, &mct, err);
        if (rc < 0) return -1;
        if (rc == 1) {
            max_tokens = mct;  // the newer name wins
            r->max_tokens_set = true;
        }
    } else if (!r->max_tokens_set) {
        max_tokens = lim->default_max_tokens > 0 ? lim->default_max_tokens : 16;
    }
    s->max_tokens = max_tokens;
    if (read_int(root, "min_tokens", 0, INT_MAX, &s->min_tokens, err) < 0) return -1;
    if (s->max_tokens > 0 && s->min_tokens > s->max_tokens)
        return bad(err, "min_tokens",
                   "min_tokens (%d) must be less than or equal to max_tokens (%d)", s->min_tokens,
                   s->max_tokens);
    if (read_bool(root, "ignore_eos", &s->ignore_eos, err) < 0 ||
        read_bool(root, "include_stop_str_in_output", &s->include_stop_str_in_output, err) < 0 ||
        read_bool(root, "skip_special_tokens", &s->skip_special_tokens, err) < 0)
        return -1;
    if (kaon_json_field(root, "spaces_between_special_tokens") &&
        !cJSON_IsBool(kaon_json_field(root, "spaces_between_special_tokens")))
        return bad(err, "spaces_between_special_tokens",
                   "'spaces_between_special_tokens' must be a boolean");
    if (read_int(root, "priority", INT_MIN, INT_MAX, &s->priority, err) < 0) return -1;
    cJSON *user = kaon_json_field(root, "user");
    if (user && !cJSON_IsString(user)) return bad(err, "user", "'user' must be a string");
    if (parse_stop(root, lim, r, err) < 0) return -1;
    s->stop = (const char *const *)r->stop;
    s->n_stop = r->n_stop;
    cJSON *sti = kaon_json_field(root, "stop_token_ids");
    if (sti) {
        if (!cJSON_IsArray(sti))
            return bad(err, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
        if (read_ids(sti, "stop_token_ids", lim, false, &r->stop_token_ids,
                     &r->n_stop_token_ids, err) < 0)
            return -1;
        s->stop_token_ids = r->stop_token_ids;
        s->n_stop_token_ids = r->n_stop_token_ids;
    }
    if (parse_logit_bias(root, lim, r, err) < 0) return -1;
    s->logit_bias = r->logit_bias;
    s->n_logit_bias = r->n_logit_bias;
    int max_lp = lim->max_logprobs > 0 ? lim->max_logprobs : 20;
    int plp = -1;
    if (read_int(root, "prompt_logprobs", 0, max_lp, &plp, err) < 0) return -1;
    s->prompt_logprobs = plp;
    if (kaon_api_parse_format(root, r, err) < 0) return -1;
    return 0;
}

// Message content: a string, or a list of text parts joined with '\n' (as vLLM does for
// text-only models). Returns a new string item, a null item, or NULL with err set.
static cJSON *message_content(const cJSON *msg, int i, const char *role, kaon_api_error *err) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    cJSON *c = kaon_json_field(msg, "content");
    if (!c) {
        if (!strcmp(role, "assistant")) return cJSON_CreateNull();
        bad(err, param, "message %d (%s) has no content", i, role);
        return NULL;
    }
    if (cJSON_IsString(c)) return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c)) {
        bad(err, param, "'content' must be a string or a list of content parts");
        return NULL;
    }
    kaon_sbuf text = {0};
    int n = 0;
    for (cJSON *p = c->child; p; p = p->next) {
        cJSON *type = cJSON_IsObject(p) ? kaon_json_field(p, "type") : NULL;
        if (!cJSON_IsString(type)) {
            kaon_sbuf_free(&text);
            bad(err, param, "each content part must be an object with a string 'type'");
            return NULL;
        }
        if (!strcmp(type->valuestring, "text") || !strcmp(type->valuestring, "refusal")) {
            cJSON *t = kaon_json_field(p, type->valuestring[0] == 't' ? "text" : "refusal");
            if (!cJSON_IsString(t)) {
                kaon_sbuf_free(&text);
                bad(err, param, "a '%s' content part needs a string '%s'", type->valuestring,
                    type->valuestring);
                return NULL;
            }
            if (n++) kaon_sbuf_append(&text, "\n", 1);
            kaon_sbuf_puts(&text, t->valuestring);
        } else {
            kaon_sbuf_free(&text);
            bad(err, param, "content part type '%.40s' is not supported by this model",
                type->valuestring);
            return NULL;
        }
    }
    if (text.failed) {
        kaon_sbuf_free(&text);
        oom(err);
        return NULL;
    }
    cJSON *s = cJSON_CreateString(text.data ? text.data : "");
    kaon_sbuf_free(&text);
    return s;
}

// An assistant message's tool_calls carry their arguments as a JSON text; most templates index
// and tojson them as objects (as vLLM hands them over), so a text that parses to an object
// becomes one. Anything else stays as sent.
static int decode_tool_call_arguments(cJSON *calls) {
    if (!cJSON_IsArray(calls)) return 0;
    for (cJSON *c = calls->child; c; c = c->next) {
        cJSON *fn = cJSON_IsObject(c) ? cJSON_GetObjectItemCaseSensitive(c, "function") : NULL;
        cJSON *args = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
        if (!cJSON_IsString(args)) continue;
        size_t at;
        cJSON *obj = json_parse(args->valuestring, strlen(args->valuestring), &at);
        if (!obj) continue;
        if (!cJSON_IsObject(obj)) {
            cJSON_Delete(obj);
            continue;
        }
        if (!cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj)) {
            cJSON_Delete(obj);
            return -1;
        }
    }
    return 0;
}

static int parse_messages(const cJSON *root, kaon_api_request *r, kaon_api_error *err) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool",
                                        "function", NULL};
    cJSON *msgs = kaon_json_field(root, "messages");
    if (!msgs) return bad(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return bad(err, "messages", "'messages' must be a list");
    if (!msgs->child) return bad(err, "messages", "'messages' must not be empty");
    r->messages = cJSON_CreateArray();
    if (!r->messages) return oom(err);
    int i = 0;
    for (cJSON *m = msgs->child; m; m = m->next, i++) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m)) return bad(err, param, "each message must be an object");
        cJSON *role = kaon_json_field(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!role) return bad(err, param, "message %d has no 'role'", i);
        if (!cJSON_IsString(role) || !in_list(roles, role->valuestring))
            return bad(err, param,
                       "invalid role '%.40s'; expected system, developer, user, assistant or "
                       "tool",
                       cJSON_IsString(role) ? role->valuestring : "(not a string)");
        cJSON *name = kaon_json_field(m, "name");
        snprintf(param, sizeof param, "messages[%d].name", i);
        if (name && !cJSON_IsString(name)) return bad(err, param, "'name' must be a string");
        cJSON *tc = kaon_json_field(m, "tool_calls");
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        if (tc && !cJSON_IsArray(tc)) return bad(err, param, "'tool_calls' must be a list");
        cJSON *content = message_content(m, i, role->valuestring, err);
        if (!content) return -1;
        cJSON *copy = cJSON_CreateObject();
        if (!copy) {
            cJSON_Delete(content);
            return oom(err);
        }
        cJSON_AddItemToArray(r->messages, copy);
        cJSON_AddStringToObject(copy, "role", role->valuestring);
        cJSON_AddItemToObject(copy, "content", content);
        // Everything else (name, tool_calls, tool_call_id, reasoning_content...) goes to the
        // template as sent.
        for (cJSON *f = m->child; f; f = f->next) {
            if (!f->string || !strcmp(f->string, "role") || !strcmp(f->string, "content"))
                continue;
            if (cJSON_GetObjectItemCaseSensitive(copy, f->string)) continue;  // duplicate key
            cJSON *d = cJSON_Duplicate(f, 1);
            if (!d) return oom(err);
            cJSON_AddItemToObject(copy, f->string, d);
        }
    }
    return 0;
}

static int parse_chat_extras(const cJSON *root, kaon_api_request *r, kaon_api_error *err) {
    cJSON *tools = kaon_json_field(root, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return bad(err, "tools", "'tools' must be a list");
        int i = 0;
        for (cJSON *t = tools->child; t; t = t->next, i++) {
            char param[48];
            snprintf(param, sizeof param, "tools[%d]", i);
            cJSON *type = cJSON_IsObject(t) ? kaon_json_field(t, "type") : NULL;
            cJSON *fn = cJSON_IsObject(t) ? kaon_json_field(t, "function") : NULL;
            cJSON *name = cJSON_IsObject(fn) ? kaon_json_field(fn, "name") : NULL;
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
                !cJSON_IsString(name))
                return bad(err, param,
                           "each tool must be {\"type\": \"function\", \"function\": {\"name\": "
                           "...}}");
        }
        r->tools = cJSON_Duplicate(tools, 1);
        if (!r->tools) return oom(err);
    }
    cJSON *tc = kaon_json_field(root, "tool_choice");
    if (tc) {
        if (!cJSON_IsString(tc) && !cJSON_IsObject(tc))
            return bad(err, "tool_choice", "'tool_choice' must be a string or an object");
        if (kaon_api_parse_tool_choice(tc, r, err) < 0) return -1;
    }
    if (kaon_json_field(root, "parallel_tool_calls") && !cJSON_IsBool(kaon_json_field(root, "parallel_tool_calls")))
        return bad(err, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    cJSON *ct = kaon_json_field(root, "chat_template");
    if (ct) {
        if (!cJSON_IsString(ct)) return bad(err, "chat_template", "'chat_template' must be a string");
        r->chat_template = strdup(ct->valuestring);
        if (!r->chat_template) return oom(err);
    }
    cJSON *kw = kaon_json_field(root, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw))
            return bad(err, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        r->template_kwargs = cJSON_Duplicate(kw, 1);
        if (!r->template_kwargs) return oom(err);
    }
    if (read_bool(root, "add_generation_prompt", &r->add_generation_prompt, err) < 0 ||
        read_bool(root, "continue_final_message", &r->continue_final_message, err) < 0)
        return -1;
    if (r->add_generation_prompt && r->continue_final_message) {
        if (kaon_json_field(root, "add_generation_prompt"))
            return bad(err, "continue_final_message",
                       "Cannot set both `continue_final_message` and `add_generation_prompt` to "
                       "True.");
        r->add_generation_prompt = false;  // only the default was on
    }
    if (r->continue_final_message) {
        cJSON *last = cJSON_GetArrayItem(r->messages, cJSON_GetArraySize(r->messages) - 1);
        cJSON *role = last ? kaon_json_field(last, "role") : NULL;
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant"))
            return bad(err, "continue_final_message",
                       "continue_final_message needs an assistant message last");
    }
    return 0;
}

// prompt: a string, a list of strings, a list of ids, or a list of lists of ids.
static int parse_prompts(const cJSON *root, const kaon_api_limits *lim, kaon_api_request *r,
                         bool strings_only_single, kaon_api_error *err) {
    cJSON *p = kaon_json_field(root, "prompt");
    if (!p) return bad(err, "prompt", "'prompt' is required");
    int max_prompts = lim->max_prompts > 0 ? lim->max_prompts : 256;
    if (cJSON_IsString(p)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts || !(r->prompts[0].text = strdup(p->valuestring))) return oom(err);
        r->n_prompts = 1;
        return 0;
    }
    if (strings_only_single) return bad(err, "prompt", "'prompt' must be a string");
    if (!cJSON_IsArray(p))
        return bad(err, "prompt",
                   "'prompt' must be a string, a list of strings, a list of token ids or a list "
                   "of lists of token ids");
    int n = cJSON_GetArraySize(p);
    if (n == 0) return bad(err, "prompt", "'prompt' must not be empty");
    cJSON *first = p->child;
    if (cJSON_IsNumber(first)) {  // one prompt of token ids
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return oom(err);
        r->n_prompts = 1;
        return read_ids(p, "prompt", lim, true, &r->prompts[0].ids, &r->prompts[0].n_ids, err);
    }
    if (n > max_prompts)
        return bad(err, "prompt", "%d prompts in one request; at most %d", n, max_prompts);
    r->prompts = calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return oom(err);
    bool strings = cJSON_IsString(first);
    for (cJSON *it = p->child; it; it = it->next) {
        kaon_api_prompt *pr = &r->prompts[r->n_prompts++];
        if (strings && cJSON_IsString(it)) {
            if (!(pr->text = strdup(it->valuestring))) return oom(err);
        } else if (!strings && cJSON_IsArray(it)) {
            if (read_ids(it, "prompt", lim, true, &pr->ids, &pr->n_ids, err) < 0) return -1;
        } else {
            return bad(err, "prompt",
                       "'prompt' lists must hold only strings or only lists of token ids");
        }
    }
    return 0;
}

cJSON *kaon_api_json_parse(const char *body, size_t len, kaon_api_error *err) {
    if (!body || len == 0) {
        kaon_api_error_set(err, 400, "invalid_json", NULL, "the request body is empty");
        return NULL;
    }
    size_t err_at = 0;
    cJSON *root = json_parse(body, len, &err_at);
    if (!root)
        kaon_api_error_set(err, 400, "invalid_json", NULL,
                           "the request body is not valid JSON (error at byte %zu)", err_at);
    return root;
}

int kaon_api_parse(kaon_api_kind kind, const char *body, size_t len, const kaon_api_limits *lim,
                   const kaon_sampling *defaults, kaon_api_request *out, kaon_api_error *err) {
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    cJSON *root = kaon_api_json_parse(body, len, err);
    if (!root) return -1;
    int rc = kaon_api_parse_json(kind, root, lim, defaults, out, err);
    cJSON_Delete(root);
    return rc;
}

int kaon_api_parse_json(kaon_api_kind kind, const cJSON *root, const kaon_api_limits *lim,
                        const kaon_sampling *defaults, kaon_api_request *out,
                        kaon_api_error *err) {
    static const kaon_api_limits no_limits = {0};
    if (!lim) lim = &no_limits;
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    if (defaults)
        out->sampling = *defaults;
    else
        kaon_sampling_default(&out->sampling);
    kaon_sampling *s = &out->sampling;
    // The defaults' arrays never leak into a request; n and logprobs are per request.
    s->stop = NULL, s->n_stop = 0, s->stop_token_ids = NULL, s->n_stop_token_ids = 0;
    s->logit_bias = NULL, s->n_logit_bias = 0;
    s->n = 1, s->logprobs = -1, s->prompt_logprobs = -1, s->max_tokens = 0;
    s->has_seed = false;
    out->add_generation_prompt = true;
    out->add_special_tokens = kind != KAON_API_CHAT;

    int rc = -1;
    if (!cJSON_IsObject(root)) {
        bad(err, NULL, "the request body must be a JSON object");
        goto done;
    }
    log_unknown_fields(root, kind);
    if (parse_model(root, lim, out, err) < 0) goto done;

    if (kind == KAON_API_DETOKENIZE) {
        cJSON *t = kaon_json_field(root, "tokens");
        if (!t) {
            bad(err, "tokens", "'tokens' is required");
            goto done;
        }
        if (!cJSON_IsArray(t)) {
            bad(err, "tokens", "'tokens' must be a list of token ids");
            goto done;
        }
        out->prompts = calloc(1, sizeof *out->prompts);
        if (!out->prompts) {
            oom(err);
            goto done;
        }
        out->n_prompts = 1;
        if (read_ids(t, "tokens", lim, false, &out->prompts[0].ids, &out->prompts[0].n_ids,
                     err) < 0)
            goto done;
        rc = 0;
        goto done;
    }
    if (kind == KAON_API_TOKENIZE) {
        bool has_msgs = kaon_json_field(root, "messages") != NULL;
        if (!has_msgs && !kaon_json_field(root, "prompt")) {
            bad(err, "prompt", "either 'prompt' or 'messages' is required");
            goto done;
        }
        out->add_special_tokens = !has_msgs;
        if (read_bool(root, "add_special_tokens", &out->add_special_tokens, err) < 0 ||
            read_bool(root, "return_token_strs", &out->return_token_strs, err) < 0)
            goto done;
        if (has_msgs) {
            if (parse_messages(root, out, err) < 0 || parse_chat_extras(root, out, err) < 0)
                goto done;
        } else if (parse_prompts(root, lim, out, true, err) < 0) {
            goto done;
        }
        rc = 0;
        goto done;
    }

    if (parse_sampling(root, lim, out, err) < 0) goto done;
    if (read_bool(root, "add_special_tokens", &out->add_special_tokens, err) < 0 ||
        read_bool(root, "return_token_ids", &out->return_token_ids, err) < 0)
        goto done;
    int max_lp = lim->max_logprobs > 0 ? lim->max_logprobs : 20;
    if (kind == KAON_API_CHAT) {
        if (parse_messages(root, out, err) < 0 || parse_chat_extras(root, out, err) < 0)
            goto done;
        if (read_bool(root, "logprobs", &out->logprobs, err) < 0) goto done;
        int tlp = 0;
        int got = read_int(root, "top_logprobs", 0, max_lp, &tlp, err);
        if (got < 0) goto done;
        if (got == 1 && tlp > 0 && !out->logprobs) {
            bad(err, "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true");
            goto done;
        }
        out->top_logprobs = out->logprobs ? tlp : 0;
        s->logprobs = out->logprobs ? tlp : -1;
    } else {
        if (parse_prompts(root, lim, out, false, err) < 0) goto done;
        if (read_bool(root, "echo", &out->echo, err) < 0) goto done;
        cJSON *suffix = kaon_json_field(root, "suffix");
        if (suffix && !(cJSON_IsString(suffix) && !suffix->valuestring[0])) {
            bad(err, "suffix", "'suffix' is not supported");
            goto done;
        }
        int lp = -1;
        if (read_int(root, "logprobs", 0, max_lp, &lp, err) < 0) goto done;
        out->logprobs = lp >= 0;
        out->top_logprobs = lp >= 0 ? lp : 0;
        s->logprobs = lp;
        // echo with logprobs returns the prompt's logprobs too, as OpenAI does.
        if (out->echo && lp >= 0 && s->prompt_logprobs < lp) s->prompt_logprobs = lp;
    }
    rc = 0;
done:
    if (rc < 0) {
        kaon_api_request_free(out);
        memset(out, 0, sizeof *out);
    }
    return rc;
}

void kaon_api_request_free(kaon_api_request *r) {
    if (!r) return;
    free(r->model);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->logit_bias);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->tools);
    cJSON_Delete(r->template_kwargs);
    free(r->chat_template);
    free(r->tool_choice_name);
    free(r->format_spec);
    memset(r, 0, sizeof *r);
}

// ---- chat templates --------------------------------------------------------------------------

// The messages as the template gets them (a copy).
static cJSON *template_messages(const kaon_api_request *r, kaon_api_tool_turns turns) {
    cJSON *msgs = r->messages ? cJSON_Duplicate(r->messages, 1) : cJSON_CreateArray();
    if (!msgs || turns == KAON_API_TOOL_TURNS_AS_SENT) return msgs;
    for (cJSON *m = msgs->child; m; m = m->next) {
        cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) continue;
        // Content null (a turn that only called tools): "", as vLLM gives it; many templates
        // add strings to it.
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "content")))
            cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(""));
        if (decode_tool_call_arguments(cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) < 0) {
            cJSON_Delete(msgs);
            return NULL;
        }
    }
    return msgs;
}

cJSON *kaon_api_chat_context(const kaon_api_request *r, const char *bos, const char *eos,
                             kaon_api_tool_turns turns) {
    cJSON *ctx = r->template_kwargs ? cJSON_Duplicate(r->template_kwargs, 1) : cJSON_CreateObject();
    if (!ctx) return NULL;
    static const char *const reserved[] = {"messages", "tools", "add_generation_prompt",
                                           "bos_token", "eos_token"};
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(ctx, reserved[i]);
    cJSON *msgs = template_messages(r, turns);
    if (!msgs) {
        cJSON_Delete(ctx);
        return NULL;
    }
    cJSON_AddItemToObject(ctx, "messages", msgs);
    if (r->tools) cJSON_AddItemToObject(ctx, "tools", cJSON_Duplicate(r->tools, 1));
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", r->add_generation_prompt);
    cJSON_AddStringToObject(ctx, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(ctx, "eos_token", eos ? eos : "");
    return ctx;
}

size_t kaon_api_continue_final_cut(const kaon_api_request *r, const char *text, size_t len) {
    if (!r->continue_final_message || !r->messages) return len;
    cJSON *last = cJSON_GetArrayItem(r->messages, cJSON_GetArraySize(r->messages) - 1);
    cJSON *c = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    if (!cJSON_IsString(c) || !c->valuestring[0]) return len;
    size_t n = strlen(c->valuestring);
    // The last occurrence: templates put the final message at the end.
    for (size_t i = len >= n ? len - n + 1 : 0; i-- > 0;)
        if (!memcmp(text + i, c->valuestring, n)) return i + n;
    return len;
}

// ---- responses -------------------------------------------------------------------------------

cJSON *kaon_api_string(const char *s, size_t n) {
    kaon_sbuf b = {0};
    if (kaon_utf8_sanitize(&b, s ? s : "", s ? n : 0) < 0) {
        kaon_sbuf_free(&b);
        return cJSON_CreateString("");
    }
    cJSON *j = cJSON_CreateString(b.data ? b.data : "");
    kaon_sbuf_free(&b);
    return j;
}

double kaon_api_logprob_value(float lp) {
    if (!(lp > -9999.0f)) return -9999.0;  // -inf, NaN and anything below
    if (lp > 0) lp = 0;
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%.7g", (double)lp);
    return strtod(tmp, NULL);
}

const char *kaon_api_finish_reason(kaon_finish f) {
    switch (f) {
    case KAON_FINISH_STOP: return "stop";
    case KAON_FINISH_LENGTH: return "length";
    case KAON_FINISH_ABORT: return "abort";
    case KAON_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

int kaon_api_add_ids(cJSON *obj, const char *key, const int32_t *ids, int n) {
    cJSON *a = cJSON_AddArrayToObject(obj, key);
    if (!a) return -1;
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_CreateNumber(ids[i]);
        if (!x) return -1;
        cJSON_AddItemToArray(a, x);
    }
    return 0;
}

cJSON *kaon_api_usage(long long prompt, long long completion, long long cached) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", (double)cached);
    return u;
}

static cJSON *token_string(kaon_api_token_text_fn fn, void *ctx, int32_t id, size_t *len_out) {
    size_t len = 0;
    const char *t = fn ? fn(ctx, id, &len) : NULL;
    if (!t) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "token_id:%d", (int)id);
        if (len_out) *len_out = strlen(tmp);
        return cJSON_CreateString(tmp);
    }
    if (len_out) *len_out = len;
    return kaon_api_string(t, len);
}

static cJSON *token_bytes(kaon_api_token_text_fn fn, void *ctx, int32_t id) {
    size_t len = 0;
    const char *t = fn ? fn(ctx, id, &len) : NULL;
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; t && arr && i < len; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)t[i]));
    return arr;
}

static cJSON *chat_logprob_entry(int32_t id, float lp, kaon_api_token_text_fn fn, void *ctx) {
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddItemToObject(e, "token", token_string(fn, ctx, id, NULL));
    cJSON_AddNumberToObject(e, "logprob", kaon_api_logprob_value(lp));
    cJSON_AddItemToObject(e, "bytes", token_bytes(fn, ctx, id));
    return e;
}

int kaon_api_chat_logprobs_append(cJSON *content, const kaon_token_logprob *lp, int n,
                                  int top_logprobs, kaon_api_token_text_fn fn, void *ctx) {
    for (int i = 0; i < n; i++) {
        cJSON *e = chat_logprob_entry(lp[i].token, lp[i].logprob, fn, ctx);
        if (!e) return -1;
        cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
        int nt = lp[i].top ? lp[i].n_top : 0;
        if (nt > top_logprobs) nt = top_logprobs;
        for (int k = 0; tops && k < nt; k++)
            cJSON_AddItemToArray(tops, chat_logprob_entry(lp[i].top[k].token, lp[i].top[k].logprob,
                                                          fn, ctx));
        cJSON_AddItemToArray(content, e);
    }
    return 0;
}

cJSON *kaon_api_completion_logprobs_new(void) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

int kaon_api_completion_logprobs_append(cJSON *obj, const int32_t *ids,
                                        const kaon_token_logprob *lp, int n, int top_logprobs,
                                        kaon_api_token_text_fn fn, void *ctx,
                                        size_t *text_offset) {
    cJSON *tokens = cJSON_GetObjectItemCaseSensitive(obj, "tokens");
    cJSON *tlp = cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs");
    cJSON *top = cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs");
    cJSON *off = cJSON_GetObjectItemCaseSensitive(obj, "text_offset");
    if (!tokens || !tlp || !top || !off) return -1;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        cJSON_AddItemToArray(tokens, token_string(fn, ctx, ids[i], &len));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)*text_offset));
        *text_offset += len;
        if (!lp || lp[i].n_top < 0 || isnan(lp[i].logprob)) {
            cJSON_AddItemToArray(tlp, cJSON_CreateNull());
            cJSON_AddItemToArray(top, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(tlp, cJSON_CreateNumber(kaon_api_logprob_value(lp[i].logprob)));
        // {token text: logprob}; the sampled token is included, as OpenAI does.
        cJSON *d = cJSON_CreateObject();
        int nt = lp[i].top ? lp[i].n_top : 0;
        if (nt > top_logprobs) nt = top_logprobs;
        for (int k = 0; d && k < nt; k++) {
            cJSON *key = token_string(fn, ctx, lp[i].top[k].token, NULL);
            const char *ks = cJSON_GetStringValue(key);
            if (ks && !cJSON_GetObjectItemCaseSensitive(d, ks))
                cJSON_AddNumberToObject(d, ks, kaon_api_logprob_value(lp[i].top[k].logprob));
            cJSON_Delete(key);
        }
        if (d && top_logprobs > 0) {
            cJSON *key = token_string(fn, ctx, ids[i], NULL);
            const char *ks = cJSON_GetStringValue(key);
            if (ks && !cJSON_GetObjectItemCaseSensitive(d, ks))
                cJSON_AddNumberToObject(d, ks, kaon_api_logprob_value(lp[i].logprob));
            cJSON_Delete(key);
        }
        cJSON_AddItemToArray(top, d ? d : cJSON_CreateNull());
    }
    return 0;
}

cJSON *kaon_api_response_new(kaon_api_kind kind, bool stream, const char *id, long long created,
                             const char *model) {
    cJSON *r = cJSON_CreateObject();
    if (!r) return NULL;
    cJSON_AddStringToObject(r, "id", id);
    const char *object = kind == KAON_API_CHAT ? (stream ? "chat.completion.chunk" : "chat.completion")
                                               : "text_completion";
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)created);
    cJSON_AddItemToObject(r, "model", kaon_api_string(model, strlen(model)));
    cJSON_AddArrayToObject(r, "choices");
    return r;
}

int kaon_api_add_choice(cJSON *resp, kaon_api_kind kind, bool stream, int index, const char *role,
                        const char *text, size_t text_len, cJSON *logprobs,
                        const char *finish_reason, cJSON *stop_reason) {
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    cJSON *c = cJSON_CreateObject();
    if (!choices || !c) {
        cJSON_Delete(c);
        cJSON_Delete(logprobs);
        cJSON_Delete(stop_reason);
        return -1;
    }
    cJSON_AddNumberToObject(c, "index", index);
    if (kind == KAON_API_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, stream ? "delta" : "message");
        if (m) {
            if (!stream || role) cJSON_AddStringToObject(m, "role", role ? role : "assistant");
            if (text || !stream) cJSON_AddItemToObject(m, "content", kaon_api_string(text, text_len));
            if (!stream) cJSON_AddArrayToObject(m, "tool_calls");
        }
    } else {
        cJSON_AddItemToObject(c, "text", kaon_api_string(text, text_len));
    }
    cJSON_AddItemToObject(c, "logprobs", logprobs ? logprobs : cJSON_CreateNull());
    if (finish_reason)
        cJSON_AddStringToObject(c, "finish_reason", finish_reason);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToObject(c, "stop_reason", stop_reason ? stop_reason : cJSON_CreateNull());
    cJSON_AddItemToArray(choices, c);
    return 0;
}

int kaon_api_choice_add_parsed(cJSON *resp, int index, bool stream, bool with_reasoning,
                               const char *reasoning, size_t reasoning_len, cJSON *tool_calls) {
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    cJSON *c = NULL;
    for (cJSON *it = choices ? choices->child : NULL; it; it = it->next)
        if (cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(it, "index")) == index) c = it;
    cJSON *m = c ? cJSON_GetObjectItemCaseSensitive(c, stream ? "delta" : "message") : NULL;
    if (!m) {
        cJSON_Delete(tool_calls);
        return -1;
    }
    if (reasoning)
        cJSON_AddItemToObject(m, "reasoning_content", kaon_api_string(reasoning, reasoning_len));
    else if (with_reasoning && !stream)
        cJSON_AddNullToObject(m, "reasoning_content");
    if (tool_calls) {
        cJSON_DeleteItemFromObjectCaseSensitive(m, "tool_calls");
        cJSON_AddItemToObject(m, "tool_calls", tool_calls);
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!stream && cJSON_IsString(content) && !content->valuestring[0])
            cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateNull());
    }
    return 0;
}
