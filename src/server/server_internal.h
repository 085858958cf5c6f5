// What the two halves of the server share: http.c (transport, routes, auth, limits, the small
// endpoints, start-up and shutdown) and generate.c (one chat or completion request, from its
// JSON to the engine and back). Not a public header; only built with libmicrohttpd.
#ifndef KAON_SERVER_SERVER_INTERNAL_H
#define KAON_SERVER_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/park.h"
#include "server/reasoning_parser.h"
#include "server/replicas.h"
#include "server/tool_parser.h"
#include "server/server.h"
#include "server/structured.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

// The server's life, in order (kaon_server_stop: DRAINING, then STOPPING).
enum { ST_LOADING, ST_READY, ST_DRAINING, ST_STOPPING };

struct kaon_server {
    kaon_server_options o;
    struct MHD_Daemon *d;
    atomic_int state;
    kaon_replicas replicas;     // the engines requests are routed to (replicas.h)
    kaon_engine *engine;        // replicas.e[0]: the model's facts, tokenizer and defaults
    const kaon_tokenizer *tok;
    kaon_chat_template *tmpl;
    kaon_tool_family tool_family;            // for the server's template
    kaon_reasoning_family reasoning_family;
    bool tool_auto, reasoning_auto;          // chosen from templates (a request's own too)
    kaon_api_tool_turns tool_turns;          // how the template wants tool turns
    kaon_engine_info info;
    kaon_sampling defaults;
    int default_max_tokens;     // generation_config.json's max_new_tokens (0: none)
    char *model_name;
    char *served[KAON_SERVE_MAX_NAMES];  // the served names (model_name is served[0])
    int n_served;
    const char *names[KAON_SERVE_MAX_NAMES + 1];  // accepted `model` values: served + the path
    int n_names;
    kaon_metrics metrics;
    atomic_int active;          // generation requests in flight (their state is allocated)
    atomic_int busy;            // generation requests whose response is not yet fully sent
    atomic_int conns;           // open connections
    pthread_mutex_t admit_mu;   // the queue check and the submits of one request, together
    kaon_parker parker;         // generation requests waiting for the engine (park.c)
    kaon_structured structured; // output grammars (set up once the model is loaded)
    int port;
    atomic_ullong seq;
    atomic_ullong finished_since_trim;
    uint64_t salt;
    long long created;
};

// DeepSeek's templates test an assistant's `content is none` and add the arguments text to
// strings: they get tool turns as sent; the others as vLLM hands them over.
static inline kaon_api_tool_turns kaon_template_tool_turns(const char *template_src) {
    return kaon_tool_family_detect(template_src) == KAON_TOOL_DEEPSEEK_V3
               ? KAON_API_TOOL_TURNS_AS_SENT
               : KAON_API_TOOL_TURNS_DECODED;
}

// Request ids and the server's salt.
static inline uint64_t kaon_splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// ---- http.c ----

// Queues r (ownership taken; NULL: MHD_NO) with the headers every response gets, and counts
// its status in the metrics.
enum MHD_Result kaon_http_queue(struct MHD_Connection *c, kaon_server *s, int status,
                                struct MHD_Response *r);
// Sends j (ownership taken) as JSON.
enum MHD_Result kaon_http_send_json(struct MHD_Connection *c, kaon_server *s, int status,
                                    cJSON *j);
// Sends an error object (OpenAI's shape, or Anthropic's when e->anthropic), with the headers
// its status calls for.
enum MHD_Result kaon_http_send_error(struct MHD_Connection *c, kaon_server *s,
                                     const kaon_api_error *e);
enum MHD_Result kaon_http_send_errorf(struct MHD_Connection *c, kaon_server *s, int status,
                                      const char *code, const char *param, const char *msg);
// The request limits kaon_api_parse checks, from the server's options and the model.
kaon_api_limits kaon_server_limits(kaon_server *s);

// ---- generate.c ----

// Serves one /v1/chat/completions or /v1/completions request whose body has been read: parses
// and validates it, submits its prompts (429 when the queue is full), then answers with the
// whole JSON or an SSE stream. Sets *busy (counted in s->busy until the connection's
// on_completed) so that a drain waits for the response to be sent. A whole response not yet
// ready leaves its state in *pending and the connection parked: the access handler then
// calls kaon_generate_continue when it is resumed, and on_completed kaon_generate_free.
// anthropic: a /v1/messages body (kind KAON_API_CHAT), answered in Anthropic's shapes.
enum MHD_Result kaon_generate_handle(struct MHD_Connection *c, kaon_server *s, kaon_api_kind kind,
                                     bool anthropic, const char *body, size_t body_len,
                                     bool *busy, void **pending);
enum MHD_Result kaon_generate_continue(struct MHD_Connection *c, void **pending);
void kaon_generate_free(void *pending);
// Renders the chat template for r and tokenizes the result (also for /tokenize). *start (when
// not NULL) says where the rendered prompt leaves a thinking model's output. On error fills err
// (400) and returns -1.
int kaon_generate_render_chat(kaon_server *s, const kaon_api_request *r, int32_t **ids,
                              int *n_ids, kaon_reasoning_start *start, kaon_api_error *err);

#endif
