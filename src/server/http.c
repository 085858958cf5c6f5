// The HTTP side of kaon serve: routing, auth, body limits, and the generation endpoints that
// tie openai.c (JSON) to the tokenizer, the chat template and the engine. See server.h for the
// threading model.
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
    o->max_connections = 4096;
    o->max_queue = 1024;
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
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <microhttpd.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/sse.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/timer.h"

enum { ST_LOADING, ST_READY, ST_DRAINING, ST_STOPPING };

// Idle or slow connections (keep-alive, half-sent requests) are closed after this long. While a
// request generates, its connection has no timeout: the handler watches the socket itself.
#define IDLE_TIMEOUT_S 60u
// Connections beyond --max-connections are still accepted up to this many more, and answered
// 503 + Retry-After; past that libmicrohttpd closes new ones without a word.
#define CONNECTION_SLACK 64
// After the drain timeout, how long aborted requests get to send their final chunk.
#define ABORT_GRACE_S 5.0

typedef struct kaon_server {
    kaon_server_options o;
    struct MHD_Daemon *d;
    atomic_int state;
    kaon_engine *engine;
    const kaon_tokenizer *tok;
    kaon_chat_template *tmpl;
    kaon_engine_info info;
    kaon_sampling defaults;
    int default_max_tokens;     // generation_config.json's max_new_tokens (0: none)
    char *model_name;
    const char *names[2];       // accepted `model` values: the served name and the path
    int n_names;
    kaon_metrics metrics;
    atomic_int active;          // generation requests in flight (their state is allocated)
    atomic_int busy;            // generation requests whose response is not yet fully sent
    atomic_int conns;           // open connections
    pthread_mutex_t admit_mu;   // the queue check and the submits of one request, together
    int port;
    atomic_ullong seq;
    atomic_ullong finished_since_trim;
    uint64_t salt;
    long long created;
} kaon_server;

// ---- routes ----------------------------------------------------------------------------------

enum route {
    R_NONE, R_PAGE, R_HEALTH, R_VERSION, R_METRICS, R_MODELS, R_MODEL, R_CHAT, R_COMPLETION,
    R_TOKENIZE, R_DETOKENIZE
};

static const struct route_info {
    const char *path;
    enum route route;
    bool post;          // POST (else GET/HEAD)
    bool auth;          // needs the API key when one is set
    bool engine;        // needs the loaded model
} routes[] = {
    {"/", R_PAGE, false, false, false},
    {"/health", R_HEALTH, false, false, false},
    {"/version", R_VERSION, false, false, false},
    {"/metrics", R_METRICS, false, false, false},
    {"/v1/models", R_MODELS, false, true, true},
    {"/v1/chat/completions", R_CHAT, true, true, true},
    {"/v1/completions", R_COMPLETION, true, true, true},
    {"/tokenize", R_TOKENIZE, true, true, true},
    {"/detokenize", R_DETOKENIZE, true, true, true},
};

static const struct route_info model_route = {"/v1/models/", R_MODEL, false, true, true};

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
    kaon_api_error err;
} conn;

// ---- responses -------------------------------------------------------------------------------

static void add_common_headers(struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
}

static enum MHD_Result queue(struct MHD_Connection *c, kaon_server *s, int status,
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
    return queue(c, s, status, r);
}

static enum MHD_Result send_json(struct MHD_Connection *c, kaon_server *s, int status, cJSON *j) {
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    return send_owned(c, s, status, "application/json", text, strlen(text));
}

static enum MHD_Result send_error(struct MHD_Connection *c, kaon_server *s,
                                  const kaon_api_error *e) {
    size_t len = 0;
    char *text = kaon_api_error_json(e, &len);
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
    return queue(c, s, e->status, r);
}

static enum MHD_Result send_errorf(struct MHD_Connection *c, kaon_server *s, int status,
                                   const char *code, const char *param, const char *msg) {
    kaon_api_error e;
    kaon_api_error_set(&e, status, code, param, "%s", msg);
    return send_error(c, s, &e);
}

// ---- helpers ---------------------------------------------------------------------------------

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void make_id(kaon_server *s, const char *prefix, char *out, size_t n) {
    uint64_t k = atomic_fetch_add(&s->seq, 1);
    uint64_t a = splitmix64(s->salt ^ k), b = splitmix64(a ^ k);
    snprintf(out, n, "%s%016llx%016llx", prefix, (unsigned long long)a, (unsigned long long)b);
}

// True when the peer has closed its side of the connection (or the socket failed).
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char b;
        return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

// Constant-time comparison for the API key.
static bool key_ok(const char *got, const char *want) {
    if (!got) return false;
    size_t a = strlen(got), b = strlen(want);
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(got[i < a ? i : 0] ^ want[i]);
    return diff == 0;
}

static bool authorized(struct MHD_Connection *c, const char *key) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    return key_ok(h + 7, key);
}

static const char *token_text_cb(void *ctx, int32_t id, size_t *len) {
    return kaon_tokenizer_token_text((const kaon_tokenizer *)ctx, id, len);
}

// Renders the chat template for r and tokenizes the result. On error fills err (400).
static int render_chat(kaon_server *s, const kaon_api_request *r, int32_t **ids, int *n_ids,
                       kaon_api_error *err) {
    if (!s->tok) {
        kaon_api_error_set(err, 400, "invalid_value", "messages",
                           "this model has no tokenizer: use /v1/completions with token ids");
        return -1;
    }
    kaon_chat_template *own = NULL;
    const kaon_chat_template *t = s->tmpl;
    if (r->chat_template) {
        own = kaon_chat_template_parse(r->chat_template, strlen(r->chat_template));
        if (!own) {
            kaon_api_error_set(err, 400, "invalid_value", "chat_template",
                               "chat_template does not parse: %s", kaon_last_error());
            return -1;
        }
        t = own;
    }
    if (!t) {
        kaon_api_error_set(err, 400, "invalid_value", "messages", "this model has no chat template");
        return -1;
    }
    cJSON *ctx = kaon_api_chat_context(r, kaon_tokenizer_bos_text(s->tok),
                                       kaon_tokenizer_eos_text(s->tok));
    char *text = NULL;
    size_t len = 0;
    int rc = ctx ? kaon_chat_template_render(t, ctx, &text, &len) : -1;
    cJSON_Delete(ctx);
    kaon_chat_template_free(own);
    if (rc < 0) {
        // raise_exception() in a template is how models reject a conversation: a client error.
        kaon_api_error_set(err, 400, "invalid_value", "messages", "chat template error: %s",
                           kaon_last_error());
        free(text);
        return -1;
    }
    len = kaon_api_continue_final_cut(r, text, len);
    size_t n = 0;
    rc = kaon_tokenize(s->tok, text, len, r->add_special_tokens, ids, &n);
    free(text);
    if (rc < 0 || n > INT_MAX) {
        kaon_api_error_set(err, 400, "invalid_value", "messages", "tokenization failed: %s",
                           kaon_last_error());
        return -1;
    }
    *n_ids = (int)n;
    return 0;
}

static kaon_api_limits server_limits(kaon_server *s) {
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

// ---- generation ------------------------------------------------------------------------------

typedef struct gen_prompt {
    kaon_request *r;
    int32_t *ids;
    int n_ids;
    char *text;              // the prompt's text (echo)
    size_t text_len;
    bool done;
    bool seen_tokens;
    double t_submit;
    int prompt_tokens, completion_tokens, cached_tokens;
    cJSON *echo_lp;          // completions echo + logprobs: the prompt's entries
    kaon_sampling sp;        // the request's parameters with this prompt's max_tokens
} gen_prompt;

typedef struct gen_choice {
    kaon_sbuf text;          // non-stream: the generated text
    cJSON *logprobs;         // non-stream: chat {"content": [...]}, or completions' object
    const char *finish;
    cJSON *stop_reason;
    bool started;
    double last_t;
    size_t text_offset;
    int32_t *ids;            // non-stream with return_token_ids: the generated ids
    int n_ids, cap_ids;
} gen_choice;

typedef struct gen {
    kaon_server *s;
    kaon_api_request rq;
    gen_prompt *p;
    int np;
    gen_choice *ch;
    int nc, n;
    char id[64];
    long long created;
    const char *model;
    kaon_sbuf out;           // stream: SSE bytes not yet handed to MHD
    bool all_done, done_sent, failed;
    char *error;             // an engine failure's message
    int fd;
    int rr;
    double deadline;         // --request-timeout: abort after this time (0: none)
    bool timed_out;
} gen;

static void gen_free(gen *g) {
    if (!g) return;
    for (int i = 0; i < g->np; i++) {
        if (g->p[i].r) kaon_request_free(g->p[i].r);  // aborts a running request
        free(g->p[i].ids);
        free(g->p[i].text);
        cJSON_Delete(g->p[i].echo_lp);
    }
    for (int i = 0; i < g->nc; i++) {
        kaon_sbuf_free(&g->ch[i].text);
        free(g->ch[i].ids);
        cJSON_Delete(g->ch[i].logprobs);
        cJSON_Delete(g->ch[i].stop_reason);
    }
    free(g->p);
    free(g->ch);
    kaon_sbuf_free(&g->out);
    free(g->error);
    kaon_api_request_free(&g->rq);
    kaon_server *s = g->s;
    free(g);
    atomic_fetch_sub(&s->active, 1);
    atomic_fetch_add(&s->finished_since_trim, 1);
}

static cJSON *gen_usage(const gen *g) {
    long long pt = 0, ct = 0, cached = 0;
    for (int i = 0; i < g->np; i++) {
        pt += g->p[i].prompt_tokens > 0 ? g->p[i].prompt_tokens : g->p[i].n_ids;
        ct += g->p[i].completion_tokens;
        cached += g->p[i].cached_tokens;
    }
    return kaon_api_usage(pt, ct, cached);
}

static void emit(gen *g, cJSON *j) {
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) {
        g->failed = true;
        return;
    }
    kaon_sse_data(&g->out, text, strlen(text));
    free(text);
}

// ids: the chunk's token ids, sent with return_token_ids (NULL: none).
static void emit_chunk(gen *g, int ci, const char *role, const char *text, size_t len,
                       cJSON *lp, const char *finish, cJSON *stop_reason, const int32_t *ids,
                       int n_ids) {
    kaon_api_kind kind = g->rq.kind;
    cJSON *j = kaon_api_response_new(kind, true, g->id, g->created, g->model);
    if (!j) {
        cJSON_Delete(lp);
        cJSON_Delete(stop_reason);
        g->failed = true;
        return;
    }
    kaon_api_add_choice(j, kind, true, ci, role, text, len, lp, finish, stop_reason);
    cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    if (g->rq.return_token_ids && ids && choice && kaon_api_add_ids(choice, "token_ids", ids, n_ids) < 0)
        g->failed = true;
    if (g->rq.include_usage) {
        if (g->rq.continuous_usage)
            cJSON_AddItemToObject(j, "usage", gen_usage(g));
        else
            cJSON_AddNullToObject(j, "usage");
    }
    emit(g, j);
}

// The first output of a choice: the role chunk (chat) or the echoed prompt (completions).
static void start_choice(gen *g, gen_prompt *p, gen_choice *c, int ci) {
    c->started = true;
    bool chat = g->rq.kind == KAON_API_CHAT;
    bool echo = !chat && g->rq.echo;
    if (g->rq.logprobs && !g->rq.stream)
        c->logprobs = chat ? cJSON_CreateObject() : kaon_api_completion_logprobs_new();
    if (chat && c->logprobs) cJSON_AddArrayToObject(c->logprobs, "content");
    if (echo) {
        c->text_offset = p->text_len;
        if (!g->rq.stream) {
            kaon_sbuf_append(&c->text, p->text, p->text_len);
            if (c->logprobs && p->echo_lp) {
                cJSON_Delete(c->logprobs);
                c->logprobs = cJSON_Duplicate(p->echo_lp, 1);
            }
        }
    }
    if (!g->rq.stream) return;
    if (chat)
        emit_chunk(g, ci, "assistant", "", 0, NULL, NULL, NULL, NULL, 0);
    else if (echo)
        emit_chunk(g, ci, NULL, p->text, p->text_len,
                   p->echo_lp ? cJSON_Duplicate(p->echo_lp, 1) : NULL, NULL, NULL, NULL, 0);
}

static bool is_requested_stop_token(const kaon_api_request *r, int32_t id) {
    for (int i = 0; i < r->n_stop_token_ids; i++)
        if (r->stop_token_ids[i] == id) return true;
    return false;
}

static void absorb(gen *g, int pi, const kaon_output *out) {
    kaon_server *s = g->s;
    gen_prompt *p = &g->p[pi];
    double now = kaon_now();
    bool chat = g->rq.kind == KAON_API_CHAT;
    p->prompt_tokens = out->prompt_tokens;
    p->completion_tokens = out->completion_tokens;
    p->cached_tokens = out->cached_tokens;
    if (out->finished) {
        p->done = true;
        kaon_metrics_observe_e2e(&s->metrics, now - p->t_submit);
    }
    if (out->index < 0 || out->index >= g->n) return;
    int ci = pi * g->n + out->index;
    gen_choice *c = &g->ch[ci];

    if (out->n_tokens > 0) {
        if (!p->seen_tokens) {
            p->seen_tokens = true;
            kaon_metrics_observe_ttft(&s->metrics, out->first_token_time);
            kaon_metrics_observe_queue(&s->metrics, out->queue_time);
        }
        if (c->last_t > 0) kaon_metrics_observe_itl(&s->metrics, (now - c->last_t) / out->n_tokens, out->n_tokens);
        c->last_t = now;
    }
    // Completions echo with logprobs: the prompt's logprobs come once, with the first output.
    if (!chat && g->rq.echo && g->rq.logprobs && !p->echo_lp) {
        p->echo_lp = kaon_api_completion_logprobs_new();
        size_t off = 0;
        const kaon_token_logprob *plp =
            out->prompt_logprobs && out->n_prompt_logprobs == p->n_ids ? out->prompt_logprobs : NULL;
        if (p->echo_lp) {
            // Position 0 has no distribution: null.
            kaon_api_completion_logprobs_append(p->echo_lp, p->ids, NULL, 1, g->rq.top_logprobs,
                                                token_text_cb, (void *)s->tok, &off);
            if (p->n_ids > 1)
                kaon_api_completion_logprobs_append(p->echo_lp, p->ids + 1, plp ? plp + 1 : NULL,
                                                    p->n_ids - 1, g->rq.top_logprobs,
                                                    token_text_cb, (void *)s->tok, &off);
        }
    }
    if (!c->started) start_choice(g, p, c, ci);

    cJSON *lp = NULL;  // stream: this chunk's logprobs
    if (g->rq.logprobs && out->logprobs && out->n_tokens > 0) {
        if (chat) {
            cJSON *holder = g->rq.stream ? cJSON_CreateObject() : c->logprobs;
            cJSON *content = holder ? cJSON_GetObjectItemCaseSensitive(holder, "content") : NULL;
            if (holder && !content) content = cJSON_AddArrayToObject(holder, "content");
            if (content)
                kaon_api_chat_logprobs_append(content, out->logprobs, out->n_tokens,
                                              g->rq.top_logprobs, token_text_cb, (void *)s->tok);
            if (g->rq.stream) lp = holder;
        } else {
            cJSON *obj = g->rq.stream ? kaon_api_completion_logprobs_new() : c->logprobs;
            if (obj)
                kaon_api_completion_logprobs_append(obj, out->token_ids, out->logprobs,
                                                    out->n_tokens, g->rq.top_logprobs,
                                                    token_text_cb, (void *)s->tok, &c->text_offset);
            if (g->rq.stream) lp = obj;
        }
    }
    const char *finish = kaon_api_finish_reason(out->finish);
    cJSON *stop_reason = NULL;
    if (finish) {
        if (out->stop_reason)
            stop_reason = kaon_api_string(out->stop_reason, strlen(out->stop_reason));
        else if (out->stop_token >= 0 && is_requested_stop_token(&g->rq, out->stop_token))
            stop_reason = cJSON_CreateNumber(out->stop_token);  // EOS gives null, as vLLM
    }
    if (out->finish == KAON_FINISH_ERROR && !g->error)
        g->error = strdup(out->error ? out->error : "the engine failed");

    if (g->rq.stream) {
        if (out->finish == KAON_FINISH_ERROR) {
            cJSON_Delete(lp);
            cJSON_Delete(stop_reason);
            kaon_api_error e;
            kaon_api_error_set(&e, 500, NULL, NULL, "%s", g->error ? g->error : "engine error");
            size_t len = 0;
            char *text = kaon_api_error_json(&e, &len);
            if (text) kaon_sse_data(&g->out, text, len);
            free(text);
            return;
        }
        // With return_token_ids a chunk goes out for tokens whose text is still held back.
        bool ids = g->rq.return_token_ids && out->n_tokens > 0;
        if (out->text_len > 0 || lp || finish || ids)
            emit_chunk(g, ci, NULL, out->text_len || !chat ? out->text : NULL, out->text_len, lp,
                       finish, stop_reason, out->token_ids, out->n_tokens);
        else
            cJSON_Delete(stop_reason);
    } else {
        if (out->text_len) kaon_sbuf_append(&c->text, out->text, out->text_len);
        if (g->rq.return_token_ids && out->n_tokens > 0) {
            if (c->n_ids + out->n_tokens > c->cap_ids) {
                int cap = (c->n_ids + out->n_tokens) * 2;
                int32_t *x = realloc(c->ids, sizeof *x * (size_t)cap);
                if (!x) {
                    g->failed = true;
                    return;
                }
                c->ids = x;
                c->cap_ids = cap;
            }
            memcpy(c->ids + c->n_ids, out->token_ids, sizeof *c->ids * (size_t)out->n_tokens);
            c->n_ids += out->n_tokens;
        }
        if (finish) {
            c->finish = finish;
            cJSON_Delete(c->stop_reason);
            c->stop_reason = stop_reason;
        }
    }
}

// Takes every output that is ready; when none is, waits up to timeout_ms for one. Returns the
// number absorbed. Sets all_done when every prompt has finished.
static int gen_poll(gen *g, int timeout_ms) {
    int got = 0, live = 0;
    for (int k = 0; k < g->np; k++) {
        int i = (g->rr + k) % g->np;
        gen_prompt *p = &g->p[i];
        // Bounded per pass so one fast prompt cannot starve the check of the others.
        for (int m = 0; m < 64 && !p->done; m++) {
            kaon_output out;
            int rc = kaon_request_next(p->r, &out, 0);
            if (rc == 0) break;
            if (rc < 0) {
                p->done = true;
                if (!g->error) g->error = strdup(kaon_last_error());
                break;
            }
            absorb(g, i, &out);
            got++;
        }
        live += !p->done;
    }
    if (!live) {
        g->all_done = true;
        return got;
    }
    if (got || timeout_ms == 0) return got;
    // Nothing ready: wait on one live prompt (briefly when several share this thread).
    for (int k = 0; k < g->np; k++) {
        int i = (g->rr + k) % g->np;
        if (g->p[i].done) continue;
        g->rr = (i + 1) % g->np;
        kaon_output out;
        int rc = kaon_request_next(g->p[i].r, &out, live > 1 && timeout_ms > 10 ? 10 : timeout_ms);
        if (rc == 1) {
            absorb(g, i, &out);
            got++;
        } else if (rc < 0) {
            g->p[i].done = true;
            if (!g->error) g->error = strdup(kaon_last_error());
        }
        break;
    }
    return got;
}

static bool stopping(const kaon_server *s) { return atomic_load(&s->state) == ST_STOPPING; }

static void gen_abort(gen *g) {
    for (int i = 0; i < g->np; i++)
        if (g->p[i].r && !g->p[i].done) kaon_request_abort(g->p[i].r);
}

// Past its --request-timeout: abort once (the outputs then end with finish_reason "abort").
static void check_deadline(gen *g) {
    if (g->deadline > 0 && !g->timed_out && kaon_now() > g->deadline) {
        KAON_DEBUG("http: %s ran past --request-timeout; aborting", g->id);
        g->timed_out = true;
        gen_abort(g);
    }
}

static void timeout_error(const gen *g, kaon_api_error *e) {
    kaon_api_error_set(e, 504, "request_timeout", NULL,
                       "the request ran longer than the server's limit of %g s (--request-timeout)",
                       g->s->o.request_timeout_s);
}

// The timeout's error event (when it fired), the usage chunk (when asked) and [DONE], once.
static void stream_finish(gen *g) {
    if (g->done_sent) return;
    g->done_sent = true;
    if (g->timed_out) {
        kaon_api_error e;
        timeout_error(g, &e);
        size_t len = 0;
        char *text = kaon_api_error_json(&e, &len);
        if (text) kaon_sse_data(&g->out, text, len);
        free(text);
    }
    if (g->rq.include_usage) {
        cJSON *j = kaon_api_response_new(g->rq.kind, true, g->id, g->created, g->model);
        if (j) cJSON_AddItemToObject(j, "usage", gen_usage(g));
        emit(g, j);
    }
    kaon_sse_done(&g->out);
}

// MHD's content reader for streams: blocks (in this connection's own thread) until SSE bytes
// are ready; watches the socket so a vanished client aborts its request promptly.
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    bool aborted = false;
    while (g->out.len == 0) {
        if (g->out.failed || g->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->all_done) {
            if (g->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
            stream_finish(g);
            continue;
        }
        if (stopping(g->s) && !aborted) {
            gen_abort(g);  // the outputs then end with finish_reason "abort"
            aborted = true;
        }
        check_deadline(g);
        int got = gen_poll(g, 200);
        if (got == 0 && !g->all_done && peer_gone(g->fd)) {
            KAON_DEBUG("http: client of %s went away; aborting", g->id);
            gen_abort(g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = g->out.len < max ? g->out.len : max;
    memcpy(buf, g->out.data, n);
    kaon_sbuf_consume(&g->out, n);
    return (ssize_t)n;
}

static void stream_free(void *cls) { gen_free(cls); }

// Tokenizes the prompts, checks them against the context and the server's limits, and submits
// them (all or none: a full queue refuses the whole request with 429).
static int gen_prepare(gen *g, kaon_api_error *err) {
    kaon_server *s = g->s;
    kaon_api_request *r = &g->rq;
    bool chat = r->kind == KAON_API_CHAT;
    g->np = chat ? 1 : r->n_prompts;
    g->n = r->sampling.n;
    g->nc = g->np * g->n;
    g->p = calloc((size_t)g->np, sizeof *g->p);
    g->ch = calloc((size_t)g->nc, sizeof *g->ch);
    if (!g->p || !g->ch) {
        kaon_api_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    const char *param = chat ? "messages" : "prompt";
    for (int i = 0; i < g->np; i++) {
        gen_prompt *p = &g->p[i];
        if (chat) {
            if (render_chat(s, r, &p->ids, &p->n_ids, err) < 0) return -1;
        } else if (r->prompts[i].text) {
            if (!s->tok) {
                kaon_api_error_set(err, 400, "invalid_value", "prompt",
                                   "this model has no tokenizer: send token ids");
                return -1;
            }
            size_t n = 0;
            p->text_len = strlen(r->prompts[i].text);
            if (kaon_tokenize(s->tok, r->prompts[i].text, p->text_len, r->add_special_tokens,
                              &p->ids, &n) < 0 || n > INT_MAX) {
                kaon_api_error_set(err, 400, "invalid_value", "prompt", "tokenization failed: %s",
                                   kaon_last_error());
                return -1;
            }
            p->n_ids = (int)n;
            if (r->echo) {
                p->text = r->prompts[i].text;
                r->prompts[i].text = NULL;
            }
        } else {
            p->n_ids = r->prompts[i].n_ids;
            p->ids = r->prompts[i].ids;
            r->prompts[i].ids = NULL;
            if (r->echo && s->tok &&
                kaon_detokenize(s->tok, p->ids, (size_t)p->n_ids, false, &p->text, &p->text_len) < 0) {
                kaon_api_error_set(err, 400, "invalid_value", "prompt", "cannot decode the prompt: %s",
                                   kaon_last_error());
                return -1;
            }
        }
        int mml = s->info.max_model_len;
        if (p->n_ids <= 0) {
            kaon_api_error_set(err, 400, "invalid_value", param, "the prompt is empty");
            return -1;
        }
        if (p->n_ids >= mml) {
            kaon_api_error_set(err, 400, "context_length_exceeded", param,
                               "This model's maximum context length is %d tokens. However, your "
                               "request has %d input tokens. Please reduce the length of the "
                               "input.", mml, p->n_ids);
            return -1;
        }
        if (s->o.max_prompt_tokens > 0 && p->n_ids > s->o.max_prompt_tokens) {
            kaon_api_error_set(err, 400, "prompt_too_long", param,
                               "the prompt has %d tokens; this server accepts at most %d "
                               "(--max-prompt-tokens)", p->n_ids, s->o.max_prompt_tokens);
            return -1;
        }
        kaon_sampling sp = r->sampling;
        int room = mml - p->n_ids, cap = s->o.max_tokens;
        const char *mt_param = chat ? "max_completion_tokens" : "max_tokens";
        if (r->max_tokens_set) {
            if (cap > 0 && sp.max_tokens > cap) {
                kaon_api_error_set(err, 400, "invalid_value", mt_param,
                                   "'max_tokens' or 'max_completion_tokens' is too large: %d. This "
                                   "server allows at most %d (--max-tokens).", sp.max_tokens, cap);
                return -1;
            }
            if (sp.max_tokens > room) {
                kaon_api_error_set(err, 400, "context_length_exceeded", mt_param,
                                   "'max_tokens' or 'max_completion_tokens' is too large: %d. "
                                   "This model's maximum context length is %d tokens and your "
                                   "request has %d input tokens (%d > %d - %d).",
                                   sp.max_tokens, mml, p->n_ids, sp.max_tokens, mml, p->n_ids);
                return -1;
            }
        } else {
            int m = sp.max_tokens > 0 ? sp.max_tokens
                    : s->default_max_tokens > 0 ? s->default_max_tokens : room;
            if (cap > 0 && m > cap) m = cap;
            sp.max_tokens = m < room ? m : room;
        }
        if (sp.min_tokens > sp.max_tokens) sp.min_tokens = sp.max_tokens;
        p->sp = sp;
    }
    // The queue check and the submits under one lock, so concurrent requests cannot all slip
    // in under the limit (the engine thread only ever shortens the queue meanwhile).
    pthread_mutex_lock(&s->admit_mu);
    if (s->o.max_queue > 0) {
        kaon_engine_stats st;
        kaon_engine_get_stats(s->engine, &st);
        if (st.waiting >= s->o.max_queue) {
            pthread_mutex_unlock(&s->admit_mu);
            kaon_api_error_set(err, 429, "queue_full", NULL,
                               "the server is busy: %d sequences are waiting for a slot "
                               "(--max-queue %d); retry later", st.waiting, s->o.max_queue);
            return -1;
        }
    }
    for (int i = 0; i < g->np; i++) {
        gen_prompt *p = &g->p[i];
        p->t_submit = kaon_now();
        p->r = kaon_engine_submit(s->engine, p->ids, p->n_ids, &p->sp);
        if (!p->r) {
            pthread_mutex_unlock(&s->admit_mu);
            kaon_api_error_set(err, 400, "invalid_value", NULL, "%s", kaon_last_error());
            return -1;
        }
    }
    pthread_mutex_unlock(&s->admit_mu);
    return 0;
}

// The whole response of a non-streaming request.
static cJSON *gen_response(gen *g) {
    if (g->failed) return NULL;  // out of memory while collecting token ids
    cJSON *j = kaon_api_response_new(g->rq.kind, false, g->id, g->created, g->model);
    if (!j) return NULL;
    bool ok = true;
    for (int ci = 0; ci < g->nc; ci++) {
        gen_choice *c = &g->ch[ci];
        kaon_api_add_choice(j, g->rq.kind, false, ci, NULL, c->text.data ? c->text.data : "",
                            c->text.len, c->logprobs, c->finish ? c->finish : "abort",
                            c->stop_reason);
        c->logprobs = NULL;
        c->stop_reason = NULL;
        // vLLM's places: each completions choice has its prompt's ids, a chat response has one.
        cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), ci);
        const gen_prompt *p = &g->p[ci / g->n];
        if (g->rq.return_token_ids && choice &&
            (kaon_api_add_ids(choice, "token_ids", c->ids, c->n_ids) < 0 ||
             (g->rq.kind != KAON_API_CHAT && kaon_api_add_ids(choice, "prompt_token_ids", p->ids, p->n_ids) < 0)))
            ok = false;
    }
    if (g->rq.return_token_ids && g->rq.kind == KAON_API_CHAT && g->np > 0 &&
        kaon_api_add_ids(j, "prompt_token_ids", g->p[0].ids, g->p[0].n_ids) < 0)
        ok = false;
    cJSON_AddItemToObject(j, "usage", gen_usage(g));
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static enum MHD_Result handle_generate(struct MHD_Connection *c, kaon_server *s, conn *k,
                                       kaon_api_kind kind) {
    kaon_api_error err;
    kaon_api_limits lim = server_limits(s);
    gen *g = calloc(1, sizeof *g);
    if (!g) return send_errorf(c, s, 500, NULL, NULL, "out of memory");
    g->s = s;
    atomic_fetch_add(&s->active, 1);
    if (!k->busy) {  // until on_completed: the drain waits for the response to be sent
        k->busy = true;
        atomic_fetch_add(&s->busy, 1);
    }
    if (s->o.request_timeout_s > 0) g->deadline = kaon_now() + s->o.request_timeout_s;
    if (kaon_api_parse(kind, k->body.data, k->body.len, &lim, &s->defaults, &g->rq, &err) < 0) {
        gen_free(g);
        return send_error(c, s, &err);
    }
    g->model = g->rq.model ? g->rq.model : s->model_name;
    g->created = (long long)time(NULL);
    g->fd = conn_fd(c);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    make_id(s, kind == KAON_API_CHAT ? "chatcmpl-" : "cmpl-", g->id, sizeof g->id);
    if (gen_prepare(g, &err) < 0) {
        gen_free(g);
        return send_error(c, s, &err);
    }
    if (g->rq.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g, stream_free);
        if (!r) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        return queue(c, s, 200, r);
    }
    bool aborted = false;
    while (!g->all_done) {
        if (stopping(s) && !aborted) {
            gen_abort(g);
            aborted = true;
        }
        check_deadline(g);
        if (gen_poll(g, 200) == 0 && !g->all_done && peer_gone(g->fd)) {
            KAON_DEBUG("http: client of %s went away; aborting", g->id);
            gen_free(g);
            return MHD_NO;  // closes the connection
        }
    }
    if (g->error || g->timed_out) {
        kaon_api_error e;
        if (g->error)
            kaon_api_error_set(&e, 500, NULL, NULL, "generation failed: %s", g->error);
        else
            timeout_error(g, &e);
        gen_free(g);
        return send_error(c, s, &e);
    }
    cJSON *resp = gen_response(g);
    gen_free(g);
    if (!resp) return send_errorf(c, s, 500, NULL, NULL, "out of memory");
    return send_json(c, s, 200, resp);
}

// ---- the other endpoints ---------------------------------------------------------------------

static cJSON *model_card(kaon_server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToObject(m, "id", kaon_api_string(s->model_name, strlen(s->model_name)));
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
    if (data) cJSON_AddItemToArray(data, model_card(s));
    return send_json(c, s, 200, j);
}

static enum MHD_Result handle_model(struct MHD_Connection *c, kaon_server *s, const char *url) {
    const char *name = url + strlen(model_route.path);
    for (int i = 0; i < s->n_names; i++)
        if (!strcmp(name, s->names[i])) return send_json(c, s, 200, model_card(s));
    kaon_api_error e;
    kaon_api_error_set(&e, 404, "model_not_found", "model", "The model `%.200s` does not exist.", name);
    return send_error(c, s, &e);
}

static enum MHD_Result handle_tokenize(struct MHD_Connection *c, kaon_server *s, conn *k) {
    kaon_api_error err;
    kaon_api_limits lim = server_limits(s);
    kaon_api_request r;
    if (kaon_api_parse(KAON_API_TOKENIZE, k->body.data, k->body.len, &lim, &s->defaults, &r, &err) < 0)
        return send_error(c, s, &err);
    int32_t *ids = NULL;
    int n = 0;
    int rc = 0;
    if (r.messages) {
        rc = render_chat(s, &r, &ids, &n, &err);
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
        return send_error(c, s, &err);
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
    return send_json(c, s, 200, j);
}

static enum MHD_Result handle_detokenize(struct MHD_Connection *c, kaon_server *s, conn *k) {
    kaon_api_error err;
    kaon_api_limits lim = server_limits(s);
    kaon_api_request r;
    if (kaon_api_parse(KAON_API_DETOKENIZE, k->body.data, k->body.len, &lim, &s->defaults, &r, &err) < 0)
        return send_error(c, s, &err);
    if (!s->tok) {
        kaon_api_request_free(&r);
        return send_errorf(c, s, 400, "invalid_value", "tokens", "this model has no tokenizer");
    }
    char *text = NULL;
    size_t len = 0;
    int rc = kaon_detokenize(s->tok, r.prompts[0].ids, (size_t)r.prompts[0].n_ids, false, &text, &len);
    kaon_api_request_free(&r);
    if (rc < 0) {
        free(text);
        return send_errorf(c, s, 400, "invalid_value", "tokens", kaon_last_error());
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "prompt", kaon_api_string(text, len));
    free(text);
    return send_json(c, s, 200, j);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *c, kaon_server *s) {
    kaon_engine_stats st;
    int state = atomic_load(&s->state);
    // The state first: its store of READY publishes s->engine (set by the loading thread).
    bool have = state != ST_LOADING && s->engine;
    if (have) kaon_engine_get_stats(s->engine, &st);
    size_t len = 0;
    char *text = kaon_metrics_render(&s->metrics, have ? &st : NULL, s->model_name, &len);
    if (have) text = kaon_metrics_append_expert_load(text, &len, s->engine, s->model_name);
    return send_owned(c, s, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

static enum MHD_Result dispatch(struct MHD_Connection *c, kaon_server *s, conn *k) {
    switch (k->route->route) {
    case R_PAGE: {
        struct MHD_Response *r = MHD_create_response_from_buffer(
            strlen(kaon_chat_page_html), (void *)kaon_chat_page_html, MHD_RESPMEM_PERSISTENT);
        if (r) MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
        return queue(c, s, 200, r);
    }
    case R_HEALTH: {
        int st = atomic_load(&s->state);
        if (st == ST_READY) {
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            return queue(c, s, 200, r);
        }
        return send_errorf(c, s, 503, "unavailable", NULL,
                           st == ST_LOADING ? "the model is loading" : "the server is shutting down");
    }
    case R_VERSION: {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "version", kaon_version());
        return send_json(c, s, 200, j);
    }
    case R_METRICS: return handle_metrics(c, s);
    case R_MODELS: return handle_models(c, s);
    case R_MODEL: return handle_model(c, s, k->url);
    case R_CHAT: return handle_generate(c, s, k, KAON_API_CHAT);
    case R_COMPLETION: return handle_generate(c, s, k, KAON_API_COMPLETION);
    case R_TOKENIZE: return handle_tokenize(c, s, k);
    case R_DETOKENIZE: return handle_detokenize(c, s, k);
    default: return send_errorf(c, s, 404, "not_found", NULL, "Not Found");
    }
}

// Decides, from the request line and headers, whether the request is refused; the answer is
// sent only after the body has been read, so the client is never cut off mid-upload.
static void classify(conn *k, struct MHD_Connection *c, const char *url, const char *method) {
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
                           "Unauthorized: a valid API key is required (Authorization: Bearer ...)");
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
    if (k->preflight) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (r) {
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
        return queue(c, s, 204, r);
    }
    if (k->has_error && k->err.status == 405) {
        size_t len = 0;
        char *text = kaon_api_error_json(&k->err, &len);
        struct MHD_Response *r = text ? MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE) : NULL;
        if (!r) {
            free(text);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Allow", k->route->post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
        return queue(c, s, 405, r);
    }
    if (k->has_error && k->err.status != 503) return send_error(c, s, &k->err);
    if (k->too_large) {
        kaon_api_error e;
        kaon_api_error_set(&e, 413, "body_too_large", NULL,
                           "the request body is larger than the limit of %zu bytes",
                           s->o.max_body_bytes);
        return send_error(c, s, &e);
    }
    if (k->has_error) return send_error(c, s, &k->err);
    if (k->body.failed) return send_errorf(c, s, 500, NULL, NULL, "out of memory");
    // The state may have moved on while the body arrived.
    if (k->route->engine && atomic_load(&s->state) != ST_READY)
        return send_errorf(c, s, 503, "unavailable", NULL, "the server is not ready");
    return dispatch(c, s, k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)toe;
    conn *k = *con_cls;
    if (!k) return;
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

static int load_model(kaon_server *s) {
    double t0 = kaon_now();
    s->engine = kaon_engine_create(&s->o.engine);
    if (!s->engine) return -1;
    kaon_engine_get_info(s->engine, &s->info);
    s->tok = kaon_engine_tokenizer(s->engine);
    if (s->tok) {
        const char *src = s->o.chat_template ? s->o.chat_template : kaon_tokenizer_chat_template(s->tok);
        if (!src) src = kaon_default_chat_template;
        s->tmpl = kaon_chat_template_parse(src, strlen(src));
        if (!s->tmpl && src != kaon_default_chat_template) {
            KAON_WARN("serve: the chat template does not parse (%s); using the default (ChatML)",
                      kaon_last_error());
            s->tmpl = kaon_chat_template_parse(kaon_default_chat_template,
                                               strlen(kaon_default_chat_template));
        }
        if (!s->tmpl) KAON_WARN("serve: no usable chat template: %s", kaon_last_error());
    }
    load_sampling_defaults(s);
    KAON_INFO("serve: model %s (%s) loaded in %.2f s: vocab %d, max_model_len %d, %d KV blocks of %d",
              s->model_name, s->info.arch ? s->info.arch : "?", kaon_now() - t0, s->info.vocab_size,
              s->info.max_model_len, s->info.kv_blocks, s->info.block_size);
    return 0;
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
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections + CONNECTION_SLACK,
        MHD_OPTION_CONNECTION_TIMEOUT, IDLE_TIMEOUT_S,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)1 << 20,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 << 10,
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
    if (s->o.max_connections <= 0) s->o.max_connections = 4096;
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
    s->salt = splitmix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s);
    kaon_sampling_default(&s->defaults);  // the model's own come once it is loaded
    kaon_metrics_init(&s->metrics);
    s->model_name = o->served_model_name && o->served_model_name[0] ? strdup(o->served_model_name)
                                                                    : default_model_name(o->engine.model);
    s->names[s->n_names++] = s->model_name;
    if (strcmp(o->engine.model, s->model_name)) s->names[s->n_names++] = o->engine.model;
    return s;
}

static void server_free(kaon_server *s) {
    kaon_chat_template_free(s->tmpl);
    kaon_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->admit_mu);
    free(s->model_name);
    free(s);
}

// Listens, then loads the model (so /health answers 503 meanwhile). NULL + kaon_last_error().
static kaon_server *server_start(const kaon_server_options *o) {
    kaon_server *s = server_new(o);
    if (!s) return NULL;
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
// may finish for drain_timeout_s; then the rest are aborted: their threads see ST_STOPPING
// within 200 ms and end each response properly (finish_reason "abort", [DONE]), which they get
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
    MHD_stop_daemon(s->d);  // closes the idle connections and joins every connection thread
    kaon_engine_destroy(s->engine);
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
