// One generation request (/v1/chat/completions, /v1/completions, and Anthropic's /v1/messages as
// a chat request answered in its own shapes) in libmicrohttpd's event loop: parse and validate
// (openai.c, anthropic.c), render the chat template and tokenize, check the limits,
// submit every prompt under the admission lock, then take the requests' outputs as they come
// and answer with one JSON object or an SSE stream. Whenever nothing is ready the connection is
// parked (park.c) rather than waited on, so the loop's threads stay free for other clients; a
// request timeout, a server shutdown or a vanished client aborts the engine requests. See
// server.h for the threading model.
#ifdef KAON_HAVE_MHD

#include "server/server_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar_constraint.h"
#include "server/anthropic.h"
#include "server/sse.h"
#include "util/err.h"
#include "util/log.h"
#include "util/timer.h"

// ---- helpers ---------------------------------------------------------------------------------

static void make_id(kaon_server *s, const char *prefix, char *out, size_t n) {
    uint64_t k = atomic_fetch_add(&s->seq, 1);
    uint64_t a = kaon_splitmix64(s->salt ^ k), b = kaon_splitmix64(a ^ k);
    snprintf(out, n, "%s%016llx%016llx", prefix, (unsigned long long)a, (unsigned long long)b);
}

static const char *token_text_cb(void *ctx, int32_t id, size_t *len) {
    return kaon_tokenizer_token_text((const kaon_tokenizer *)ctx, id, len);
}

int kaon_generate_render_chat(kaon_server *s, const kaon_api_request *r, int32_t **ids,
                              int *n_ids, kaon_reasoning_start *start, kaon_api_error *err) {
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
                                       kaon_tokenizer_eos_text(s->tok),
                                       own ? kaon_template_tool_turns(r->chat_template)
                                           : s->tool_turns);
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
    if (start) *start = kaon_reasoning_start_from_prompt(text, len);
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
    // Chat output parsers (NULL: off); the text reaches the tool parser through the reasoning
    // parser. Non-stream: text holds the content, reasoning the reasoning_content.
    kaon_reasoning_parser *rp;
    kaon_tool_parser *tp;
    kaon_sbuf reasoning;
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
    int rr;
    double deadline;         // --request-timeout: abort after this time (0: none)
    bool timed_out;
    bool aborted;            // aborted for the shutdown
    kaon_parked pk;          // its place among the parked while it waits for the engine
    kaon_tool_family tool_family;            // chat: the parsers this request's output goes through
    kaon_reasoning_family reasoning_family;
    kaon_reasoning_start reasoning_start;    // from the rendered prompt's tail
    bool anthropic;                          // /v1/messages: Anthropic's response and events
    kaon_anthropic_stream as;                // its stream's open content block
} gen;

static void gen_free(gen *g) {
    if (!g) return;
    // kaon_request_free also ends the engine's notifications to g->pk.
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
        kaon_reasoning_parser_free(g->ch[i].rp);
        kaon_tool_parser_free(g->ch[i].tp);
        kaon_sbuf_free(&g->ch[i].reasoning);
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

static void stream_error(gen *g, kaon_api_error *e);

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

// ids: the chunk's token ids, sent with return_token_ids (NULL: none). reasoning (NULL: none) and
// tool_calls (owned; NULL: none): what the chat output parsers made of the chunk's text.
static void emit_chunk(gen *g, int ci, const char *role, const char *text, size_t len,
                       cJSON *lp, const char *finish, cJSON *stop_reason, const int32_t *ids,
                       int n_ids, const kaon_sbuf *reasoning, cJSON *tool_calls) {
    kaon_api_kind kind = g->rq.kind;
    cJSON *j = kaon_api_response_new(kind, true, g->id, g->created, g->model);
    if (!j) {
        cJSON_Delete(lp);
        cJSON_Delete(stop_reason);
        cJSON_Delete(tool_calls);
        g->failed = true;
        return;
    }
    kaon_api_add_choice(j, kind, true, ci, role, text, len, lp, finish, stop_reason);
    if ((reasoning || tool_calls) &&
        kaon_api_choice_add_parsed(j, ci, true, false, reasoning ? reasoning->data : NULL,
                                   reasoning ? reasoning->len : 0, tool_calls) < 0)
        g->failed = true;
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
    if (g->anthropic) {
        if (kaon_anthropic_stream_start(&g->out, g->id, g->model, p->n_ids) < 0) g->failed = true;
    } else if (chat)
        emit_chunk(g, ci, "assistant", "", 0, NULL, NULL, NULL, NULL, 0, NULL, NULL);
    else if (echo)
        emit_chunk(g, ci, NULL, p->text, p->text_len,
                   p->echo_lp ? cJSON_Duplicate(p->echo_lp, 1) : NULL, NULL, NULL, NULL, 0, NULL,
                   NULL);
}

// A chat choice's new text through its parsers: reasoning, then tool calls. end: the choice
// finished (what was held back is decided). calls: the tool_calls delta (stream), or NULL.
static int parse_output(gen_choice *c, const char *text, size_t len, bool end, kaon_sbuf *content,
                        kaon_sbuf *reasoning, cJSON **calls) {
    kaon_sbuf mid = {0};
    kaon_sbuf *to = c->tp ? &mid : content;
    int rc = 0;
    if (c->rp) {
        rc |= kaon_reasoning_parser_feed(c->rp, text, len, reasoning, to);
        if (end) rc |= kaon_reasoning_parser_finish(c->rp, reasoning, to);
    } else if (len) {
        rc |= kaon_sbuf_append(to, text, len);
    }
    if (c->tp) {
        cJSON *d = NULL, *tail = NULL;
        rc |= kaon_tool_parser_feed(c->tp, mid.data, mid.len, content, calls ? &d : NULL);
        if (end) rc |= kaon_tool_parser_finish(c->tp, content, calls ? &tail : NULL);
        if (tail && !d) {
            d = tail;
        } else if (tail) {
            while (tail->child) cJSON_AddItemToArray(d, cJSON_DetachItemViaPointer(tail, tail->child));
            cJSON_Delete(tail);
        }
        if (calls) *calls = d;
    }
    kaon_sbuf_free(&mid);
    return rc < 0 ? -1 : 0;
}

// OpenAI's finish_reason for a choice that ended with tool calls.
// A function named by tool_choice keeps "stop", as OpenAI answers.
static const char *finish_with_calls(const gen *g, const gen_choice *c, const char *finish) {
    if (finish && !strcmp(finish, "stop") && kaon_tool_parser_n_calls(c->tp) > 0 &&
        !g->rq.tool_choice_name)
        return "tool_calls";
    return finish;
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
            stream_error(g, &e);
            return;
        }
        // With return_token_ids a chunk goes out for tokens whose text is still held back.
        bool ids = g->rq.return_token_ids && out->n_tokens > 0;
        const char *text = out->text;
        size_t text_len = out->text_len;
        kaon_sbuf content = {0}, reasoning = {0};
        cJSON *calls = NULL;
        if (c->rp || c->tp) {
            if (parse_output(c, out->text, out->text_len, finish != NULL, &content, &reasoning,
                             &calls) < 0)
                g->failed = true;
            text = content.data;
            text_len = content.len;
            finish = finish_with_calls(g, c, finish);
        }
        if (g->anthropic) {
            // Anthropic: the deltas now, the stop reason in stream_finish's message_delta.
            if (kaon_anthropic_stream_delta(&g->as, &g->out, reasoning.data, reasoning.len, text,
                                            text_len, calls) < 0)
                g->failed = true;
            cJSON_Delete(calls);
            cJSON_Delete(lp);
            if (finish) {
                c->finish = finish;
                cJSON_Delete(c->stop_reason);
                c->stop_reason = stop_reason;
            } else {
                cJSON_Delete(stop_reason);
            }
        } else if (text_len > 0 || reasoning.len || calls || lp || finish || ids)
            emit_chunk(g, ci, NULL, text_len || !chat ? text : NULL, text_len, lp, finish,
                       stop_reason, out->token_ids, out->n_tokens, reasoning.len ? &reasoning : NULL,
                       calls);
        else
            cJSON_Delete(stop_reason);
        kaon_sbuf_free(&content);
        kaon_sbuf_free(&reasoning);
    } else {
        if (c->rp || c->tp) {
            if (parse_output(c, out->text, out->text_len, finish != NULL, &c->text, &c->reasoning,
                             NULL) < 0)
                g->failed = true;
        } else if (out->text_len) {
            kaon_sbuf_append(&c->text, out->text, out->text_len);
        }
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
    if (got || timeout_ms == 0) return got;  // the server only ever polls (timeout 0)
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

// An error event in the request's API's shape.
static void stream_error(gen *g, kaon_api_error *e) {
    if (g->anthropic) {
        kaon_anthropic_stream_error(&g->out, e);
        return;
    }
    size_t len = 0;
    char *text = kaon_api_error_json(e, &len);
    if (text) kaon_sse_data(&g->out, text, len);
    free(text);
}

// Anthropic's stop_reason and stop_sequence for the (only) choice.
static const char *anthropic_stop(const gen *g, const char **stop_sequence) {
    const gen_choice *c = &g->ch[0];
    *stop_sequence = cJSON_IsString(c->stop_reason) ? c->stop_reason->valuestring : NULL;
    return kaon_anthropic_stop_reason(c->finish, *stop_sequence != NULL,
                                      kaon_tool_parser_n_calls(c->tp));
}

// The timeout's error event (when it fired), the usage chunk (when asked) and [DONE], once.
// Anthropic: message_delta and message_stop (after an error event: nothing more).
static void stream_finish(gen *g) {
    if (g->done_sent) return;
    g->done_sent = true;
    if (g->timed_out) {
        kaon_api_error e;
        timeout_error(g, &e);
        stream_error(g, &e);
    }
    if (g->anthropic) {
        if (g->timed_out || g->error || g->nc < 1) return;
        const char *seq = NULL, *reason = anthropic_stop(g, &seq);
        if (!g->ch[0].started &&
            kaon_anthropic_stream_start(&g->out, g->id, g->model, g->p[0].n_ids) < 0)
            g->failed = true;
        if (kaon_anthropic_stream_stop(&g->as, &g->out, reason, seq, g->p[0].completion_tokens) < 0)
            g->failed = true;
        return;
    }
    if (g->rq.include_usage) {
        cJSON *j = kaon_api_response_new(g->rq.kind, true, g->id, g->created, g->model);
        if (j) cJSON_AddItemToObject(j, "usage", gen_usage(g));
        emit(g, j);
    }
    kaon_sse_done(&g->out);
}

// One step of waiting for the engine, shared by streams and whole responses: takes what is
// ready, aborts for a shutdown or a timeout. 1: output was taken or everything is done (look
// again); 0: parked (return and wait to be called again); -1: give up (client gone, server
// closing).
static int gen_step(gen *g) {
    if (atomic_load(&g->pk.gone)) {
        KAON_DEBUG("http: client of %s went away; aborting", g->id);
        gen_abort(g);
        return -1;
    }
    if (stopping(g->s) && !g->aborted) {
        gen_abort(g);  // the outputs then end with finish_reason "abort"
        g->aborted = true;
    }
    check_deadline(g);
    if (gen_poll(g, 0) > 0 || g->all_done) return 1;
    return kaon_park(&g->pk) > 0 ? 0 : -1;
}

// MHD's content reader for streams: hands over the SSE bytes that are ready, or parks the
// connection (0 bytes) until the engine has more.
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    while (g->out.len == 0) {
        if (g->out.failed || g->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->all_done) {
            if (g->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
            stream_finish(g);
            continue;
        }
        int rc = gen_step(g);
        if (rc == 0) return 0;
        if (rc < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = g->out.len < max ? g->out.len : max;
    memcpy(buf, g->out.data, n);
    kaon_sbuf_consume(&g->out, n);
    return (ssize_t)n;
}

static void stream_free(void *cls) { gen_free(cls); }

// The chat output parsers for this request: the server's, or with auto those of the request's
// own template. Tool calls are only looked for when the request offers tools.
static void choose_parsers(gen *g) {
    const kaon_server *s = g->s;
    const kaon_api_request *r = &g->rq;
    const char *own = r->chat_template;
    g->reasoning_family = s->reasoning_auto && own ? kaon_reasoning_family_detect(own)
                                                   : s->reasoning_family;
    bool tools = r->tools && cJSON_GetArraySize(r->tools) > 0 && !r->tool_choice_none;
    g->tool_family = !tools ? KAON_TOOL_NONE
                     : r->tool_choice_required || r->tool_choice_name ? KAON_TOOL_FORCED
                     : s->tool_auto && own ? kaon_tool_family_detect(own) : s->tool_family;
}

static int start_parsers(gen *g) {
    for (int ci = 0; ci < g->nc; ci++) {
        gen_choice *c = &g->ch[ci];
        if (g->reasoning_family != KAON_REASONING_NONE &&
            !(c->rp = kaon_reasoning_parser_new(g->reasoning_family, g->reasoning_start)))
            return -1;
        if (g->tool_family == KAON_TOOL_NONE) continue;
        char prefix[64];  // call ids unique across requests and choices
        const char *dash = strchr(g->id, g->anthropic ? '_' : '-');
        snprintf(prefix, sizeof prefix, "%s%.16s_%d_", g->anthropic ? "toolu_" : "call_",
                 dash ? dash + 1 : g->id, ci);
        c->tp = g->tool_family == KAON_TOOL_FORCED
                    ? kaon_tool_parser_new_forced(g->rq.tool_choice_name, prefix)
                    : kaon_tool_parser_new(g->tool_family, prefix);
        if (!c->tp) return -1;
    }
    return 0;
}

static int submit_all(gen *g, kaon_api_error *err);

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
    if (chat) choose_parsers(g);
    for (int i = 0; i < g->np; i++) {
        gen_prompt *p = &g->p[i];
        if (chat) {
            if (kaon_generate_render_chat(s, r, &p->ids, &p->n_ids, &g->reasoning_start, err) < 0)
                return -1;
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
        const char *mt_param = chat && !g->anthropic ? "max_completion_tokens" : "max_tokens";
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
        // Tool-call markers are special tokens in many vocabularies (<tool_call> in some,
        // [TOOL_CALLS], <|python_tag|>, Kimi's): they must reach the parser, as vLLM does.
        if (g->tool_family != KAON_TOOL_NONE) sp.skip_special_tokens = false;
        p->sp = sp;
    }
    if (chat && start_parsers(g) < 0) {
        kaon_api_error_set(err, 500, NULL, NULL, "out of memory");
        return -1;
    }
    // Structured outputs: every sequence gets a clone of this state (the engine makes them).
    bool unconstrained = true;
    void *cs = kaon_structured_state(&s->structured, r, &unconstrained, err);
    if (!cs && !unconstrained) return -1;
    for (int i = 0; i < g->np && cs; i++) {
        g->p[i].sp.constraint = &kaon_grammar_constraint_ops;
        g->p[i].sp.constraint_state = cs;
    }
    int rc = submit_all(g, err);
    if (cs) kaon_grammar_constraint_ops.free(cs);
    for (int i = 0; i < g->np; i++) g->p[i].sp.constraint_state = NULL;
    return rc;
}

// The queue check, the routing and the submits under one lock, so concurrent requests cannot
// all slip in under the limit (the engine threads only ever shorten the queues meanwhile) and
// each routing choice sees the requests routed before it. Each prompt goes to one replica
// (its n samples share its prompt blocks there); its handle then addresses that engine alone.
static int submit_all(gen *g, kaon_api_error *err) {
    kaon_server *s = g->s;
    pthread_mutex_lock(&s->admit_mu);
    if (s->o.max_queue > 0) {
        kaon_engine_stats st;
        kaon_replicas_stats(&s->replicas, &st, NULL);
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
        kaon_engine *e = s->replicas.e[kaon_replicas_pick(&s->replicas, p->ids, (size_t)p->n_ids)];
        p->r = kaon_engine_submit(e, p->ids, p->n_ids, &p->sp);
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
    if (g->anthropic) {
        gen_choice *c = &g->ch[0];
        const char *seq = NULL, *reason = anthropic_stop(g, &seq);
        bool saw = kaon_reasoning_parser_saw_reasoning(c->rp);
        cJSON *calls = kaon_tool_parser_n_calls(c->tp) > 0 ? kaon_tool_parser_calls_json(c->tp) : NULL;
        const gen_prompt *p = &g->p[0];
        cJSON *j = kaon_anthropic_message(
            g->id, g->model, saw ? (c->reasoning.data ? c->reasoning.data : "") : NULL,
            c->reasoning.len, c->text.data, c->text.len, calls, reason, seq,
            p->prompt_tokens > 0 ? p->prompt_tokens : p->n_ids, p->completion_tokens);
        cJSON_Delete(calls);
        return j;
    }
    cJSON *j = kaon_api_response_new(g->rq.kind, false, g->id, g->created, g->model);
    if (!j) return NULL;
    bool ok = true;
    for (int ci = 0; ci < g->nc; ci++) {
        gen_choice *c = &g->ch[ci];
        const char *finish = c->finish ? c->finish : "abort";
        if (c->tp) finish = finish_with_calls(g, c, finish);
        kaon_api_add_choice(j, g->rq.kind, false, ci, NULL, c->text.data ? c->text.data : "",
                            c->text.len, c->logprobs, finish, c->stop_reason);
        c->logprobs = NULL;
        c->stop_reason = NULL;
        bool saw = kaon_reasoning_parser_saw_reasoning(c->rp);
        if ((c->rp || kaon_tool_parser_n_calls(c->tp) > 0) &&
            kaon_api_choice_add_parsed(j, ci, false, c->rp != NULL,
                                       saw ? (c->reasoning.data ? c->reasoning.data : "") : NULL,
                                       c->reasoning.len,
                                       kaon_tool_parser_n_calls(c->tp) > 0
                                           ? kaon_tool_parser_calls_json(c->tp)
                                           : NULL) < 0)
            ok = false;
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

// The whole (non-stream) response, once every prompt has finished; frees g.
static enum MHD_Result send_whole(struct MHD_Connection *c, gen *g) {
    kaon_server *s = g->s;
    if (g->error || g->timed_out) {
        kaon_api_error e;
        if (g->error)
            kaon_api_error_set(&e, 500, NULL, NULL, "generation failed: %s", g->error);
        else
            timeout_error(g, &e);
        e.anthropic = g->anthropic;
        gen_free(g);
        return kaon_http_send_error(c, s, &e);
    }
    bool anthropic = g->anthropic;
    cJSON *resp = gen_response(g);
    gen_free(g);
    if (!resp) {
        kaon_api_error e;
        kaon_api_error_set(&e, 500, NULL, NULL, "out of memory");
        e.anthropic = anthropic;
        return kaon_http_send_error(c, s, &e);
    }
    return kaon_http_send_json(c, s, 200, resp);
}

enum MHD_Result kaon_generate_continue(struct MHD_Connection *c, void **pending) {
    gen *g = *pending;
    for (;;) {
        if (g->all_done) {
            *pending = NULL;
            return send_whole(c, g);
        }
        int rc = gen_step(g);
        if (rc == 0) return MHD_YES;  // parked: MHD calls the access handler again
        if (rc < 0) {
            *pending = NULL;
            gen_free(g);
            return MHD_NO;  // closes the connection
        }
    }
}

void kaon_generate_free(void *pending) { gen_free(pending); }

// From here on the engine's outputs wake the connection when it is parked.
static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? (int)ci->connect_fd : -1;
}

static void gen_watch(gen *g, struct MHD_Connection *c) {
    g->pk.parker = &g->s->parker;
    g->pk.c = c;
    g->pk.fd = conn_fd(c);
    g->pk.deadline = g->deadline;
    atomic_init(&g->pk.gone, false);
    for (int i = 0; i < g->np; i++) kaon_request_set_notify(g->p[i].r, kaon_park_notify, &g->pk);
}

enum MHD_Result kaon_generate_handle(struct MHD_Connection *c, kaon_server *s, kaon_api_kind kind,
                                     bool anthropic, const char *body, size_t body_len,
                                     bool *busy, void **pending) {
    kaon_api_error err;
    kaon_api_limits lim = kaon_server_limits(s);
    gen *g = calloc(1, sizeof *g);
    if (!g) return kaon_http_send_errorf(c, s, 500, NULL, NULL, "out of memory");
    g->s = s;
    atomic_fetch_add(&s->active, 1);
    if (!*busy) {  // until on_completed: the drain waits for the response to be sent
        *busy = true;
        atomic_fetch_add(&s->busy, 1);
    }
    if (s->o.request_timeout_s > 0) g->deadline = kaon_now() + s->o.request_timeout_s;
    g->anthropic = anthropic;
    int rc = anthropic ? kaon_anthropic_parse(body, body_len, false, &lim, &s->defaults, &g->rq, &err)
                       : kaon_api_parse(kind, body, body_len, &lim, &s->defaults, &g->rq, &err);
    if (rc < 0) {
        gen_free(g);
        return kaon_http_send_error(c, s, &err);
    }
    g->model = g->rq.model ? g->rq.model : s->model_name;
    g->created = (long long)time(NULL);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    make_id(s, anthropic ? "msg_" : kind == KAON_API_CHAT ? "chatcmpl-" : "cmpl-", g->id,
            sizeof g->id);
    if (gen_prepare(g, &err) < 0) {
        err.anthropic = anthropic;
        gen_free(g);
        return kaon_http_send_error(c, s, &err);
    }
    gen_watch(g, c);
    if (g->rq.stream) {
        // SSE chunks are small: a small buffer keeps 10,000 streams' footprint down.
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, g, stream_free);
        if (!r) {
            gen_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        return kaon_http_queue(c, s, 200, r);
    }
    *pending = g;
    return kaon_generate_continue(c, pending);
}

#endif
