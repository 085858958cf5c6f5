// The HTTP side of kaon serve: routing, auth, body and connection limits, the small endpoints
// (models, tokenize, metrics, health), start-up and shutdown. The generation endpoints are in
// generate.c. See server.h for the threading model.
#include "server/server.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/err.h"
#include "util/log.h"

void kaon_server_options_default(kaon_server_options *o) {
    memset(o, 0, sizeof *o);
    o->engine.device = "cpu";
    o->engine.load_tokenizer = true;
    o->host = "127.0.0.1";
    o->port = 8000;
    o->max_body_bytes = (size_t)8 << 20;
    o->max_connections = 16384;
    o->max_queue = 16384;
    o->max_n = 128;
    o->drain_timeout_s = 30;
}

#ifndef KAON_HAVE_MHD

int kaon_server_run(const kaon_server_options *o, atomic_int *stop) {
    (void)o;
    (void)stop;
    return kaon_set_error("kaon was built without libmicrohttpd: `kaon serve` is not available");
}

kaon_server *kaon_server_start(const kaon_server_options *o) {
    (void)o;
    kaon_set_error("kaon was built without libmicrohttpd: `kaon serve` is not available");
    return NULL;
}

int kaon_server_port(const kaon_server *s) {
    (void)s;
    return -1;
}

void kaon_server_stop(kaon_server *s) { (void)s; }

#else

#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <microhttpd.h>

#include "server/anthropic.h"
#include "server/server_internal.h"
#include "server/sse.h"
#include "util/timer.h"

// Idle or slow connections (keep-alive, half-sent requests) are closed after this long. While a
// request generates, its connection has no timeout: the handler watches the socket itself.
#define IDLE_TIMEOUT_S 60u
// Connections beyond --max-connections are still accepted up to this many more, and answered
// 503 + Retry-After; past that libmicrohttpd closes new ones without a word.
#define CONNECTION_SLACK 64
// Each connection's memory pool (request line, headers, response headers, send buffer): a
// fixed bound, so 10,000 connections cost at most 320 MiB of address space (far less resident).
#define CONNECTION_MEMORY ((size_t)32 << 10)
// Room for a burst of new connections (the kernel caps it at net.core.somaxconn).
#define LISTEN_BACKLOG 16384u
// After the drain timeout, how long aborted requests get to send their final chunk.
#define ABORT_GRACE_S 5.0

// ---- routes ----------------------------------------------------------------------------------

enum route {
    R_NONE, R_PAGE, R_HEALTH, R_VERSION, R_METRICS, R_MODELS, R_MODEL, R_CHAT, R_COMPLETION,
    R_TOKENIZE, R_DETOKENIZE, R_MESSAGES, R_COUNT_TOKENS
};

static const struct route_info {
    const char *path;
    enum route route;
    bool post;          // POST (else GET/HEAD)
    bool auth;          // needs the API key when one is set
    bool engine;        // needs the loaded model
    bool anthropic;     // errors in Anthropic's shape
} routes[] = {
    {"/", R_PAGE, false, false, false, false},
    {"/health", R_HEALTH, false, false, false, false},
    {"/version", R_VERSION, false, false, false, false},
    {"/metrics", R_METRICS, false, false, false, false},
    {"/v1/models", R_MODELS, false, true, true, false},
    {"/v1/chat/completions", R_CHAT, true, true, true, false},
    {"/v1/completions", R_COMPLETION, true, true, true, false},
    {"/tokenize", R_TOKENIZE, true, true, true, false},
    {"/detokenize", R_DETOKENIZE, true, true, true, false},
    {"/v1/messages", R_MESSAGES, true, true, true, true},
    {"/v1/messages/count_tokens", R_COUNT_TOKENS, true, true, true, true},
};

static const struct route_info model_route = {"/v1/models/", R_MODEL, false, true, true, false};

static const struct route_info *find_route(const char *url) {
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        if (!strcmp(url, routes[i].path)) return &routes[i];
    if (!strncmp(url, model_route.path, strlen(model_route.path)) && url[strlen(model_route.path)])
        return &model_route;
    return NULL;
}

// Per-connection state for one HTTP request.
typedef struct conn {
    kaon_server *s;
    const struct route_info *route;
    char *url;
    kaon_sbuf body;
    bool too_large;
    bool preflight;        // CORS OPTIONS
    bool has_error;        // respond with err once the body has been read
    bool busy;             // counted in s->busy until on_completed
    void *gen;             // a whole (non-stream) response still generating (generate.c)
    kaon_api_error err;
} conn;

// ---- responses -------------------------------------------------------------------------------

static void add_common_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
}

enum MHD_Result kaon_http_queue(struct MHD_Connection *c, kaon_server *s, int status,
                                struct MHD_Response *r) {
    if (!r) return MHD_NO;
    add_common_headers(r);
    // Shutting down: no keep-alive, so clients' pools reconnect elsewhere.
    if (atomic_load(&s->state) >= ST_DRAINING) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    kaon_metrics_count_status(&s->metrics, status);
    return ret;
}

// Sends data (malloc'd, ownership taken) with a content type.
static enum MHD_Result send_owned(struct MHD_Connection *c, kaon_server *s, int status,
                                  const char *ctype, char *data, size_t len) {
    if (!data) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    if (ctype) MHD_add_response_header(r, "Content-Type", ctype);
    return kaon_http_queue(c, s, status, r);
}

enum MHD_Result kaon_http_send_json(struct MHD_Connection *c, kaon_server *s, int status,
                                    cJSON *j) {
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    return send_owned(c, s, status, "application/json", text, strlen(text));
}

enum MHD_Result kaon_http_send_error(struct MHD_Connection *c, kaon_server *s,
                                     const kaon_api_error *e) {
    size_t len = 0;
    char *text = e->anthropic ? kaon_anthropic_error_json(e, &len) : kaon_api_error_json(e, &len);
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (e->status == 503 || e->status == 429) MHD_add_response_header(r, "Retry-After", "1");
    if (e->status == 503) MHD_add_response_header(r, "Connection", "close");
    KAON_DEBUG("http: %d %s", e->status, e->message);
    return kaon_http_queue(c, s, e->status, r);
}

enum MHD_Result kaon_http_send_errorf(struct MHD_Connection *c, kaon_server *s, int status,
                                      const char *code, const char *param, const char *msg) {
    kaon_api_error e;
    kaon_api_error_set(&e, status, code, param, "%s", msg);
    return kaon_http_send_error(c, s, &e);
}

// ---- helpers ---------------------------------------------------------------------------------

// Constant-time comparison for the API key.
static bool key_ok(const char *got, const char *want) {
    if (!got) return false;
    size_t a = strlen(got), b = strlen(want);
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(got[i < a ? i : 0] ^ want[i]);
    return diff == 0;
}

// `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY` (on every route).
static bool authorized(struct MHD_Connection *c, const char *key) {
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (x && key_ok(x, key)) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    return key_ok(h + 7, key);
}

kaon_api_limits kaon_server_limits(kaon_server *s) {
    kaon_api_limits lim = {0};
    lim.vocab_size = s->info.vocab_size;
    lim.max_n = s->o.max_n;
    lim.max_logprobs = 20;
    lim.max_prompts = 256;
    lim.max_stop = 16;
    lim.model_names = s->names;
    lim.n_model_names = s->n_names;
    lim.default_max_tokens = s->default_max_tokens;
    return lim;
}

// ---- the other endpoints (generate.c serves the generation ones) -----------------------------

static cJSON *model_card(kaon_server *s, const char *name) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToObject(m, "id", kaon_api_string(name, strlen(name)));
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "kaon");
    const char *root = s->info.model_path ? s->info.model_path : s->o.engine.model;
    cJSON_AddItemToObject(m, "root", kaon_api_string(root, strlen(root)));
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", s->info.max_model_len);
    cJSON_AddArrayToObject(m, "permission");
    return m;
}

static enum MHD_Result handle_models(struct MHD_Connection *c, kaon_server *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(j, "data");
    for (int i = 0; data && i < s->n_served; i++) cJSON_AddItemToArray(data, model_card(s, s->served[i]));
    return kaon_http_send_json(c, s, 200, j);
}

static enum MHD_Result handle_model(struct MHD_Connection *c, kaon_server *s, const char *url) {
    const char *name = url + strlen(model_route.path);
    for (int i = 0; i < s->n_names; i++)
        if (!strcmp(name, s->names[i]))  // the path answers with the first served name's card
            return kaon_http_send_json(c, s, 200, model_card(s, i < s->n_served ? s->served[i] : s->model_name));
    kaon_api_error e;
    kaon_api_error_set(&e, 404, "model_not_found", "model", "The model `%.200s` does not exist.", name);
    return kaon_http_send_error(c, s, &e);
}

static enum MHD_Result handle_tokenize(struct MHD_Connection *c, kaon_server *s, conn *k) {
    kaon_api_error err;
    kaon_api_limits lim = kaon_server_limits(s);
    kaon_api_request r;
    if (kaon_api_parse(KAON_API_TOKENIZE, k->body.data, k->body.len, &lim, &s->defaults, &r, &err) < 0)
        return kaon_http_send_error(c, s, &err);
    int32_t *ids = NULL;
    int n = 0;
    int rc = 0;
    if (r.messages) {
        rc = kaon_generate_render_chat(s, &r, &ids, &n, NULL, &err);
    } else if (!s->tok) {
        kaon_api_error_set(&err, 400, "invalid_value", "prompt", "this model has no tokenizer");
        rc = -1;
    } else {
        size_t nn = 0;
        rc = kaon_tokenize(s->tok, r.prompts[0].text, strlen(r.prompts[0].text), r.add_special_tokens,
                           &ids, &nn);
        if (rc < 0 || nn > INT_MAX) {
            kaon_api_error_set(&err, 400, "invalid_value", "prompt", "tokenization failed: %s",
                               kaon_last_error());
            rc = -1;
        }
        n = (int)nn;
    }
    if (rc < 0) {
        free(ids);
        kaon_api_request_free(&r);
        return kaon_http_send_error(c, s, &err);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "count", n);
    cJSON_AddNumberToObject(j, "max_model_len", s->info.max_model_len);
    cJSON *toks = cJSON_AddArrayToObject(j, "tokens");
    for (int i = 0; toks && i < n; i++) cJSON_AddItemToArray(toks, cJSON_CreateNumber(ids[i]));
    if (r.return_token_strs) {
        cJSON *strs = cJSON_AddArrayToObject(j, "token_strs");
        for (int i = 0; strs && i < n; i++) {
            size_t len = 0;
            const char *t = kaon_tokenizer_token_text(s->tok, ids[i], &len);
            cJSON_AddItemToArray(strs, kaon_api_string(t, t ? len : 0));
        }
    } else {
        cJSON_AddNullToObject(j, "token_strs");
    }
    free(ids);
    kaon_api_request_free(&r);
    return kaon_http_send_json(c, s, 200, j);
}

static enum MHD_Result handle_detokenize(struct MHD_Connection *c, kaon_server *s, conn *k) {
    kaon_api_error err;
    kaon_api_limits lim = kaon_server_limits(s);
    kaon_api_request r;
    if (kaon_api_parse(KAON_API_DETOKENIZE, k->body.data, k->body.len, &lim, &s->defaults, &r, &err) < 0)
        return kaon_http_send_error(c, s, &err);
    if (!s->tok) {
        kaon_api_request_free(&r);
        return kaon_http_send_errorf(c, s, 400, "invalid_value", "tokens",
                                     "this model has no tokenizer");
    }
    char *text = NULL;
    size_t len = 0;
    int rc = kaon_detokenize(s->tok, r.prompts[0].ids, (size_t)r.prompts[0].n_ids, false, &text, &len);
    kaon_api_request_free(&r);
    if (rc < 0) {
        free(text);
        return kaon_http_send_errorf(c, s, 400, "invalid_value", "tokens", kaon_last_error());
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "prompt", kaon_api_string(text, len));
    free(text);
    return kaon_http_send_json(c, s, 200, j);
}

// POST /v1/messages/count_tokens: {"input_tokens": N}, the rendered prompt's length.
static enum MHD_Result handle_count_tokens(struct MHD_Connection *c, kaon_server *s, conn *k) {
    kaon_api_error err;
    kaon_api_limits lim = kaon_server_limits(s);
    kaon_api_request r;
    if (kaon_anthropic_parse(k->body.data, k->body.len, true, &lim, &s->defaults, &r, &err) < 0)
        return kaon_http_send_error(c, s, &err);
    int32_t *ids = NULL;
    int n = 0;
    int rc = kaon_generate_render_chat(s, &r, &ids, &n, NULL, &err);
    free(ids);
    kaon_api_request_free(&r);
    if (rc < 0) {
        err.anthropic = true;
        return kaon_http_send_error(c, s, &err);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "input_tokens", n);
    return kaon_http_send_json(c, s, 200, j);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c, kaon_server *s) {
    kaon_engine_stats st, per[KAON_SERVE_MAX_REPLICAS];
    int state = atomic_load(&s->state);
    // The state first: its store of READY publishes s->replicas (set by the loading thread).
    bool have = state != ST_LOADING && s->engine;
    if (have) kaon_replicas_stats(&s->replicas, &st, per);
    size_t len = 0;
    char *text = kaon_metrics_render(&s->metrics, have ? &st : NULL, have ? per : NULL,
                                     have ? s->replicas.n : 0, s->model_name, &len);
    if (have) {
        text = kaon_metrics_append_step_times(text, &len, s->replicas.e, s->replicas.n, s->model_name);
        text = kaon_metrics_append_expert_load(text, &len, s->replicas.e, s->replicas.n, s->model_name);
        text = kaon_metrics_append_ranks(text, &len, s->replicas.e, s->replicas.n, s->model_name);
    }
    return send_owned(c, s, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

static enum MHD_Result dispatch(struct MHD_Connection *c, kaon_server *s, conn *k) {
    switch (k->route->route) {
    case R_PAGE: {
        struct MHD_Response *r = MHD_create_response_from_buffer(
            strlen(kaon_chat_page_html), (void *)kaon_chat_page_html, MHD_RESPMEM_PERSISTENT);
        if (r) MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
        return kaon_http_queue(c, s, 200, r);
    }
    case R_HEALTH: {
        int st = atomic_load(&s->state);
        if (st == ST_READY) {
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            return kaon_http_queue(c, s, 200, r);
        }
        return kaon_http_send_errorf(c, s, 503, "unavailable", NULL,
                           st == ST_LOADING ? "the model is loading" : "the server is shutting down");
    }
    case R_VERSION: {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "version", kaon_version());
        return kaon_http_send_json(c, s, 200, j);
    }
    case R_METRICS: return handle_metrics(c, s);
    case R_MODELS: return handle_models(c, s);
    case R_MODEL: return handle_model(c, s, k->url);
    case R_CHAT:
        return kaon_generate_handle(c, s, KAON_API_CHAT, false, k->body.data, k->body.len,
                                    &k->busy, &k->gen);
    case R_COMPLETION:
        return kaon_generate_handle(c, s, KAON_API_COMPLETION, false, k->body.data, k->body.len,
                                    &k->busy, &k->gen);
    case R_MESSAGES:
        return kaon_generate_handle(c, s, KAON_API_CHAT, true, k->body.data, k->body.len,
                                    &k->busy, &k->gen);
    case R_COUNT_TOKENS: return handle_count_tokens(c, s, k);
    case R_TOKENIZE: return handle_tokenize(c, s, k);
    case R_DETOKENIZE: return handle_detokenize(c, s, k);
    default: return kaon_http_send_errorf(c, s, 404, "not_found", NULL, "Not Found");
    }
}

// Decides, from the request line and headers, whether the request is refused; the answer is
// sent only after the body has been read, so the client is never cut off mid-upload.
static void classify_route(conn *k, struct MHD_Connection *c, const char *url, const char *method);

static void classify(conn *k, struct MHD_Connection *c, const char *url, const char *method) {
    classify_route(k, c, url, method);
    // Unknown paths under /v1/messages too: Anthropic's clients read those errors.
    k->err.anthropic = k->route ? k->route->anthropic : !strncmp(url, "/v1/messages", 12);
}

static void classify_route(conn *k, struct MHD_Connection *c, const char *url, const char *method) {
    kaon_server *s = k->s;
    k->route = find_route(url);
    k->url = strdup(url);
    if (!k->route) {
        k->has_error = true;
        kaon_api_error_set(&k->err, 404, "not_found", NULL, "Not Found: %.200s", url);
        return;
    }
    if (!strcmp(method, "OPTIONS")) {
        k->preflight = true;
        return;
    }
    bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool is_post = !strcmp(method, "POST");
    if ((k->route->post && !is_post) || (!k->route->post && !is_get)) {
        k->has_error = true;
        kaon_api_error_set(&k->err, 405, "method_not_allowed", NULL,
                           "Method %.16s is not allowed on %.200s; use %s", method, url,
                           k->route->post ? "POST" : "GET");
        return;
    }
    if (s->o.api_key && k->route->auth && !authorized(c, s->o.api_key)) {
        k->has_error = true;
        kaon_api_error_set(&k->err, 401, "invalid_api_key", NULL,
                           "Unauthorized: a valid API key is required (Authorization: Bearer ... or x-api-key)");
        return;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        char *end = NULL;
        unsigned long long v = strtoull(cl, &end, 10);
        if (end && !*end && v > s->o.max_body_bytes) k->too_large = true;
    }
    if (k->route->engine && atomic_load(&s->conns) > s->o.max_connections) {
        k->has_error = true;
        kaon_api_error_set(&k->err, 503, "too_many_connections", NULL,
                           "the server has more than %d open connections (--max-connections); "
                           "retry later", s->o.max_connections);
        return;
    }
    int st = atomic_load(&s->state);
    if (k->route->engine && st != ST_READY) {
        k->has_error = true;
        kaon_api_error_set(&k->err, 503, "unavailable", NULL, "%s",
                           st == ST_LOADING ? "the model is loading; retry shortly"
                                            : "the server is shutting down");
    }
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *data,
                                 size_t *data_size, void **con_cls) {
    (void)version;
    kaon_server *s = cls;
    conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        k->s = s;
        *con_cls = k;
        classify(k, c, url, method);
        return MHD_YES;
    }
    if (*data_size) {
        // Bodies over the limit are read and dropped, then answered with 413.
        if (!k->too_large && !k->has_error) {
            if (*data_size > s->o.max_body_bytes - k->body.len) {
                k->too_large = true;
                kaon_sbuf_free(&k->body);
            } else {
                kaon_sbuf_append(&k->body, data, *data_size);
            }
        }
        *data_size = 0;
        return MHD_YES;
    }
    if (k->gen) return kaon_generate_continue(c, &k->gen);  // resumed from the parker
    if (k->preflight) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (r) {
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                    "Authorization, Content-Type, x-api-key, anthropic-version, "
                                    "anthropic-beta");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
        return kaon_http_queue(c, s, 204, r);
    }
    if (k->has_error && k->err.status == 405) {
        size_t len = 0;
        char *text = k->err.anthropic ? kaon_anthropic_error_json(&k->err, &len)
                                      : kaon_api_error_json(&k->err, &len);
        struct MHD_Response *r = text ? MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE) : NULL;
        if (!r) {
            free(text);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Allow", k->route->post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
        return kaon_http_queue(c, s, 405, r);
    }
    if (k->has_error && k->err.status != 503) return kaon_http_send_error(c, s, &k->err);
    if (k->too_large) {
        kaon_api_error e;
        kaon_api_error_set(&e, 413, "body_too_large", NULL,
                           "the request body is larger than the limit of %zu bytes",
                           s->o.max_body_bytes);
        e.anthropic = k->route->anthropic;
        return kaon_http_send_error(c, s, &e);
    }
    if (k->has_error) return kaon_http_send_error(c, s, &k->err);
    kaon_api_error e;
    if (k->body.failed) kaon_api_error_set(&e, 500, NULL, NULL, "out of memory");
    // The state may have moved on while the body arrived.
    else if (k->route->engine && atomic_load(&s->state) != ST_READY)
        kaon_api_error_set(&e, 503, "unavailable", NULL, "the server is not ready");
    else
        return dispatch(c, s, k);
    e.anthropic = k->route->anthropic;
    return kaon_http_send_error(c, s, &e);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)toe;
    conn *k = *con_cls;
    if (!k) return;
    if (k->gen) kaon_generate_free(k->gen);
    if (k->busy) atomic_fetch_sub(&k->s->busy, 1);
    // Back to the idle timeout for the next request on this connection (this also restarts
    // MHD's timer, which stood still while the timeout was 0).
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, IDLE_TIMEOUT_S);
    kaon_sbuf_free(&k->body);
    free(k->url);
    free(k);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    (void)c;
    (void)socket_context;
    kaon_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&s->conns, 1);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        atomic_fetch_sub(&s->conns, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (!kaon_log_enabled(KAON_LOG_DEBUG)) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    KAON_DEBUG("mhd: %s", line);
}

// ---- start-up and shutdown -------------------------------------------------------------------

static char *default_model_name(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    // A folder given with a trailing slash: use the folder's name.
    if (n == 0) {
        size_t len = strlen(path);
        while (len > 1 && path[len - 1] == '/') len--;
        const char *b = path;
        for (size_t i = 0; i < len; i++)
            if (path[i] == '/' && i + 1 < len) b = path + i + 1;
        return strndup(b, (size_t)(path + len - b));
    }
    if (n > 5 && !strcmp(base + n - 5, ".gguf")) n -= 5;
    return strndup(base, n);
}

// Requests start from the engine's defaults: OpenAI's, then the model's generation_config.json
// (the same ones `kaon run` uses). Its max_new_tokens is the completions' default max_tokens.
static void load_sampling_defaults(kaon_server *s) {
    kaon_engine_sampling_defaults(s->engine, &s->defaults);
    s->default_max_tokens = s->defaults.max_tokens > 0 ? s->defaults.max_tokens : 0;
    s->defaults.max_tokens = -1;
    KAON_INFO("serve: sampling defaults: temperature %g, top_p %g, top_k %d, min_p %g, "
              "repetition_penalty %g", (double)s->defaults.temperature, (double)s->defaults.top_p,
              s->defaults.top_k, (double)s->defaults.min_p, (double)s->defaults.repetition_penalty);
}

static bool vocab_has(const char *text, void *tok) {
    return kaon_tokenizer_find_token(tok, text) >= 0;
}

// The output parsers: named by the options, else those whose markers the template has. The
// names were checked when the options were read; an unknown one here means none.
static void choose_parsers(kaon_server *s, const char *src) {
    const char *t = s->o.tool_call_parser, *r = s->o.reasoning_parser;
    s->tool_turns = kaon_template_tool_turns(src);
    s->tool_auto = !t || !strcmp(t, "auto");
    s->reasoning_auto = !r || !strcmp(r, "auto");
    if (s->tool_auto)
        s->tool_family = kaon_tool_family_detect(src);
    else if (kaon_tool_family_from_name(t, &s->tool_family) < 0)
        s->tool_family = KAON_TOOL_NONE;
    if (s->reasoning_auto)
        s->reasoning_family = kaon_reasoning_family_detect(src);
    else if (kaon_reasoning_family_from_name(r, &s->reasoning_family) < 0)
        s->reasoning_family = KAON_REASONING_NONE;
    KAON_INFO("serve: tool-call parser %s%s, reasoning parser %s%s",
              kaon_tool_family_name(s->tool_family), s->tool_auto ? " (auto)" : "",
              kaon_reasoning_family_name(s->reasoning_family), s->reasoning_auto ? " (auto)" : "");
}

static int load_model(kaon_server *s) {
    double t0 = kaon_now();
    const int n = s->o.data_parallel_size > 1 ? s->o.data_parallel_size : 1;
    if (kaon_replicas_create(&s->replicas, &s->o.engine, n) < 0) return -1;
    s->engine = s->replicas.e[0];
    kaon_engine_get_info(s->engine, &s->info);
    s->tok = kaon_engine_tokenizer(s->engine);
    kaon_structured_init(&s->structured, s->tok, s->info.vocab_size);
    if (s->tok) {
        const char *src = s->o.chat_template ? s->o.chat_template : kaon_tokenizer_chat_template(s->tok);
        if (!src) {
            src = kaon_fallback_chat_template(vocab_has, (void *)s->tok);
            KAON_INFO("serve: the model has no chat template; using kaon's %s format",
                      src == kaon_default_chat_template ? "ChatML" : "Gemma turn");
        }
        s->tmpl = kaon_chat_template_parse(src, strlen(src));
        if (!s->tmpl && src != kaon_default_chat_template) {
            KAON_WARN("serve: the chat template does not parse (%s); using the default (ChatML)",
                      kaon_last_error());
            s->tmpl = kaon_chat_template_parse(kaon_default_chat_template,
                                               strlen(kaon_default_chat_template));
        }
        if (!s->tmpl) KAON_WARN("serve: no usable chat template: %s", kaon_last_error());
        choose_parsers(s, src);
    }
    load_sampling_defaults(s);
    KAON_INFO("serve: model %s (%s) loaded in %.2f s: vocab %d, max_model_len %d, %d KV blocks of %d%s",
              s->model_name, s->info.arch ? s->info.arch : "?", kaon_now() - t0, s->info.vocab_size,
              s->info.max_model_len, s->info.kv_blocks, s->info.block_size,
              n > 1 ? " per replica" : "");
    return 0;
}

// libmicrohttpd's event-loop threads: one per core, 2 to 8.
static unsigned event_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 2 ? 2u : n > 8 ? 8u : (unsigned)n;
}

static struct MHD_Daemon *start_daemon(kaon_server *s, int *port_out) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    int rc = getaddrinfo(s->o.host, port, &hints, &ai);
    if (rc || !ai) {
        kaon_set_error("serve: cannot resolve host '%s': %s", s->o.host, gai_strerror(rc));
        return NULL;
    }
    // A few event-loop threads serve every connection; nothing in them waits for the engine
    // (generation requests are parked: park.c), so /health and /metrics stay quick however many
    // streams are open. poll() by default: Debian 12's libmicrohttpd (0.9.75) in its epoll mode
    // leaves some malformed requests ("\0\1\2 /x HTTP", then the client's half-close) open
    // until the idle timeout, which fuzz_http caught; KAON_HTTP_EPOLL=1 takes epoll anyway.
    const char *ep = getenv("KAON_HTTP_EPOLL");
    unsigned flags = MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME |
                     (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES && ep && !strcmp(ep, "1")
                          ? MHD_USE_EPOLL_INTERNAL_THREAD : MHD_USE_POLL_INTERNAL_THREAD);
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_THREAD_POOL_SIZE, event_threads(),
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections + CONNECTION_SLACK,
        MHD_OPTION_CONNECTION_TIMEOUT, IDLE_TIMEOUT_S,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, LISTEN_BACKLOG,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)1 << 20,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        kaon_set_error("serve: cannot listen on %s:%d (in use, or not allowed)", s->o.host, s->o.port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = di ? (int)di->port : s->o.port;
    return d;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void server_free(kaon_server *s);

static kaon_server *server_new(const kaon_server_options *o) {
    if (!o || !o->engine.model) {
        kaon_set_error("serve: no model given");
        return NULL;
    }
    kaon_server *s = calloc(1, sizeof *s);
    if (!s) {
        kaon_set_error("serve: out of memory");
        return NULL;
    }
    s->o = *o;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (!s->o.max_body_bytes) s->o.max_body_bytes = (size_t)8 << 20;
    if (s->o.max_connections <= 0) s->o.max_connections = 16384;
    if (s->o.max_n <= 0 || s->o.max_n > 128) s->o.max_n = 128;
    if (s->o.api_key && !s->o.api_key[0]) s->o.api_key = NULL;
    atomic_init(&s->state, ST_LOADING);
    atomic_init(&s->active, 0);
    atomic_init(&s->busy, 0);
    atomic_init(&s->conns, 0);
    atomic_init(&s->seq, 0);
    atomic_init(&s->finished_since_trim, 0);
    pthread_mutex_init(&s->admit_mu, NULL);
    s->created = (long long)time(NULL);
    s->salt = kaon_splitmix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^
                              (uint64_t)(uintptr_t)s);
    kaon_sampling_default(&s->defaults);  // the model's own come once it is loaded
    kaon_metrics_init(&s->metrics);
    for (int i = 0; i < o->n_served_model_names; i++)
        if (o->served_model_names[i] && o->served_model_names[i][0])
            s->served[s->n_served++] = strdup(o->served_model_names[i]);
    if (s->n_served == 0) s->served[s->n_served++] = default_model_name(o->engine.model);
    s->model_name = s->served[0];
    bool path_named = false;
    for (int i = 0; i < s->n_served; i++) {
        if (!s->served[i]) {
            server_free(s);
            kaon_set_error("serve: out of memory");
            return NULL;
        }
        s->names[s->n_names++] = s->served[i];
        path_named |= !strcmp(s->served[i], o->engine.model);
    }
    if (!path_named) s->names[s->n_names++] = o->engine.model;
    return s;
}

static void server_free(kaon_server *s) {
    kaon_parker_destroy(&s->parker);
    kaon_chat_template_free(s->tmpl);
    kaon_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->admit_mu);
    if (s->engine) kaon_structured_destroy(&s->structured);
    for (int i = 0; i < s->n_served; i++) free(s->served[i]);
    free(s);
}

// Parked requests are all woken while stopping, so that they abort.
static bool server_stopping(void *ctx) {
    kaon_server *s = ctx;
    return atomic_load(&s->state) == ST_STOPPING;
}

// Listens, then loads the model (so /health answers 503 meanwhile). NULL + kaon_last_error().
static kaon_server *server_start(const kaon_server_options *o) {
    kaon_server *s = server_new(o);
    if (!s) return NULL;
    if (kaon_parker_start(&s->parker, server_stopping, s) < 0) {
        server_free(s);
        return NULL;
    }
    s->d = start_daemon(s, &s->port);
    if (!s->d) {
        server_free(s);
        return NULL;
    }
    KAON_INFO("serve: listening on http://%s:%d (model %s loading)", s->o.host, s->port, s->model_name);
    if (o->ready_file) {
        FILE *f = fopen(o->ready_file, "w");
        if (f) {
            fprintf(f, "%s %d\n", s->o.host, s->port);
            fclose(f);
        }
    }
    if (load_model(s) < 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kaon_last_error());
        kaon_parker_close(&s->parker);
        MHD_stop_daemon(s->d);
        server_free(s);
        kaon_set_error("serve: cannot load the model: %s", msg);
        return NULL;
    }
    atomic_store(&s->state, ST_READY);
    KAON_INFO("serve: ready on http://%s:%d  (OpenAI API under /v1, chat page at /)", s->o.host, s->port);
    return s;
}

kaon_server *kaon_server_start(const kaon_server_options *o) { return server_start(o); }

int kaon_server_port(const kaon_server *s) { return s ? s->port : -1; }

// Graceful shutdown: /health and new requests get 503 (Connection: close), running requests
// may finish for drain_timeout_s; then the rest are aborted: parked ones are woken within
// 200 ms, see ST_STOPPING and end each response properly (finish_reason "abort", [DONE]), which they get
// ABORT_GRACE_S to send. Only then are the connections closed and the engine stopped.
void kaon_server_stop(kaon_server *s) {
    if (!s) return;
    atomic_store(&s->state, ST_DRAINING);
    KAON_INFO("serve: shutting down; %d request(s) in flight", atomic_load(&s->busy));
    double t_end = kaon_now() + (s->o.drain_timeout_s > 0 ? s->o.drain_timeout_s : 0);
    while (atomic_load(&s->busy) > 0 && kaon_now() < t_end) sleep_ms(20);
    int left = atomic_load(&s->busy);
    atomic_store(&s->state, ST_STOPPING);
    if (left > 0) {
        KAON_INFO("serve: drain timeout; aborting %d request(s)", left);
        double t_grace = kaon_now() + ABORT_GRACE_S;
        while (atomic_load(&s->busy) > 0 && kaon_now() < t_grace) sleep_ms(20);
    }
    // Whatever is still parked gives up, then MHD closes the rest and joins its threads.
    kaon_parker_close(&s->parker);
    sleep_ms(50);
    MHD_stop_daemon(s->d);
    kaon_replicas_destroy(&s->replicas);
    KAON_INFO("serve: stopped");
    server_free(s);
}

int kaon_server_run(const kaon_server_options *o, atomic_int *stop) {
    kaon_server *s = server_start(o);
    if (!s) return -1;
    int ticks = 0;
    while (!atomic_load(stop)) {
        sleep_ms(100);
        // Give freed request memory back to the system once things are quiet.
        if (++ticks % 10 == 0 && atomic_load(&s->active) == 0 &&
            atomic_exchange(&s->finished_since_trim, 0) > 0) {
#if defined(__GLIBC__)
            malloc_trim(0);
#endif
        }
    }
    kaon_server_stop(s);
    return 0;
}

#endif
