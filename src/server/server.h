// kaon serve: the OpenAI-compatible HTTP server over one engine, or over N data-parallel
// replicas of it that each request is routed to (replicas.h; docs/API.md).
//
// Threading: libmicrohttpd's epoll event loop on a small pool of threads (one per core, 2 to 8)
// serves every connection. JSON parsing, chat templating and tokenizing run there; a request
// then takes its outputs without waiting (kaon_request_next with timeout 0) and, when none is
// ready, suspends its connection and parks (park.c) until the engine's notification
// (kaon_request_set_notify) says one is. So no thread ever waits for the engine, and /health or
// /metrics are answered at once however many streams are open; the engine thread only appends
// to queues and never blocks on a socket. A waker thread resumes the notified connections and,
// every 200 ms, the parked ones whose peer hung up (one poll over all their sockets): a client
// that disconnects has its request aborted (kaon_request_free), which returns its KV blocks.
#ifndef KAON_SERVER_SERVER_H
#define KAON_SERVER_SERVER_H

#include <stdatomic.h>
#include <stddef.h>

#include "kaon.h"

#define KAON_SERVE_MAX_NAMES 8

typedef struct kaon_server_options {
    kaon_engine_options engine;     // engine.model must be set
    int data_parallel_size;         // engine replicas (0 or 1: one; at most 64): each request
                                    // goes to the one caching most of its prompt, else the
                                    // least loaded (replicas.h has the device/thread layout)
    const char *host;               // bind address (default 127.0.0.1)
    int port;                       // default 8000; 0 picks a free port (logged)
    const char *api_key;            // Bearer key for /v1/*, /tokenize, /detokenize (NULL: none)
    // Names the API answers to (vLLM's --served-model-name A B ...): the first is the model's
    // id in /v1/models order and in metrics; none: the model file name without .gguf.
    const char *served_model_names[KAON_SERVE_MAX_NAMES];
    int n_served_model_names;
    // Limits (docs/SECURITY.md). Requests beyond them get an OpenAI error, never a crash.
    size_t max_body_bytes;          // larger bodies get 413 (default 8 MiB)
    int max_connections;            // concurrent connections (default 16384); beyond: 503, and
                                    // past max_connections + 64 MHD closes new ones at once
    int max_queue;                  // sequences waiting for a slot (default 16384); a request
                                    // arriving when this many wait gets 429 + Retry-After
    int max_prompt_tokens;          // longer prompts get 400 (0: the context length)
    int max_tokens;                 // larger max_tokens get 400; the default when absent is
                                    // capped by it (0: no cap beyond the context)
    int max_n;                      // larger n gets 400 (0: 128, the engine's limit)
    double request_timeout_s;       // a generation running longer is aborted: 504, or an error
                                    // event in a stream (0: no timeout, the default)
    double drain_timeout_s;         // on stop: how long running requests may finish (default 30)
    const char *chat_template;      // template source overriding the model's (NULL: the model's)
    // Output parsers by name (tool_parser.h, reasoning_parser.h): NULL or "auto" picks them from
    // the chat template's markers (a request's own chat_template too), "none" turns them off.
    const char *tool_call_parser;
    const char *reasoning_parser;
    const char *ready_file;         // when set, "host port\n" is written here once ready
} kaon_server_options;

void kaon_server_options_default(kaon_server_options *o);

// Listens (/health answers 503 while the model loads), creates the engine, serves until *stop
// becomes non-zero (e.g. set by a SIGINT/SIGTERM handler), then drains: /health and new
// requests get 503, running ones may finish for drain_timeout_s, the rest are aborted (their
// clients get finish_reason "abort" and a complete response). Returns 0, or -1 with
// kaon_last_error() when the server could not start or the model could not be loaded.
int kaon_server_run(const kaon_server_options *o, atomic_int *stop);

// The same server driven by its caller (the HTTP fuzz target, tests): kaon_server_start
// returns once it listens and the model is loaded (NULL + kaon_last_error() on failure);
// kaon_server_stop drains as above and frees it.
typedef struct kaon_server kaon_server;
kaon_server *kaon_server_start(const kaon_server_options *o);
int kaon_server_port(const kaon_server *s);
void kaon_server_stop(kaon_server *s);

// The chat page served at GET / (server/chat_page.c).
extern const char kaon_chat_page_html[];

#endif
