// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the OpenAI path:
// a Messages body is checked and rewritten into the equivalent chat-completions body (system
// prompt first, tool_use blocks as an assistant's tool_calls, tool_result blocks as tool
// turns, tools and tool_choice as OpenAI's), which openai.c then validates into the same
// kaon_api_request the chat endpoint serves; the engine's outputs come back as a Message
// object or Anthropic's SSE events. Pure functions over cJSON, no engine calls: unit tested
// and fuzzed on their own; server/generate.c does the engine work for both APIs.
#ifndef KAON_SERVER_ANTHROPIC_H
#define KAON_SERVER_ANTHROPIC_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/openai.h"
#include "server/sse.h"

// The OpenAI chat body equivalent to an Anthropic Messages body (root), or NULL with err
// filled (400, err->anthropic set). count_only (/v1/messages/count_tokens): max_tokens is not
// required and only what shapes the prompt (model, system, messages, tools, tool_choice,
// thinking) is kept.
cJSON *kaon_anthropic_to_chat(const cJSON *root, bool count_only, kaon_api_error *err);

// Parses and validates body[0..len) into *out (kind KAON_API_CHAT; free with
// kaon_api_request_free). 0, or -1 with *err filled (err->anthropic set) and *out zeroed.
int kaon_anthropic_parse(const char *body, size_t len, bool count_only, const kaon_api_limits *lim,
                         const kaon_sampling *defaults, kaon_api_request *out,
                         kaon_api_error *err);

// Anthropic's error type for an HTTP status: invalid_request_error (400, 405, 422),
// authentication_error (401), permission_error (403), not_found_error (404),
// request_too_large (413), rate_limit_error (429), overloaded_error (503, 529), else api_error.
const char *kaon_anthropic_error_type(int status);
// {"type": "error", "error": {"type", "message"}} (malloc'd); NULL only when out of memory.
char *kaon_anthropic_error_json(const kaon_api_error *e, size_t *len);

// stop_reason from the OpenAI path's finish_reason ("stop", "length", "abort", ...): tool_use
// when the output ended in calls, stop_sequence when a stop string matched, max_tokens for
// "length", else end_turn.
const char *kaon_anthropic_stop_reason(const char *finish, bool stop_sequence, int n_calls);

// A Message object. thinking (NULL: no thinking block), text, and tool_calls (OpenAI's
// [{"id", "function": {"name", "arguments"}}]; NULL: none) become its content blocks in that
// order; stop_sequence NULL: null.
cJSON *kaon_anthropic_message(const char *id, const char *model, const char *thinking,
                              size_t thinking_len, const char *text, size_t text_len,
                              const cJSON *tool_calls, const char *stop_reason,
                              const char *stop_sequence, long long input_tokens,
                              long long output_tokens);

// A streamed Message: which content block is open.
typedef struct kaon_anthropic_stream {
    int open;      // 0: none, 1: text, 2: thinking, 3: tool_use
    int blocks;    // content blocks started so far (the next block's index)
} kaon_anthropic_stream;

// message_start (the message with empty content and usage.input_tokens) and a ping.
int kaon_anthropic_stream_start(kaon_sbuf *out, const char *id, const char *model,
                                long long input_tokens);
// New output: thinking text, then text, then an OpenAI tool_calls delta (a call's first entry
// carries id and function.name, later ones function.arguments fragments). Each kind opens its
// own content block (closing the one before): content_block_start, then thinking_delta,
// text_delta or input_json_delta events. Any argument may be empty / NULL.
int kaon_anthropic_stream_delta(kaon_anthropic_stream *st, kaon_sbuf *out, const char *thinking,
                                size_t thinking_len, const char *text, size_t text_len,
                                const cJSON *tool_calls);
// Closes the open block, then message_delta (stop_reason, stop_sequence, usage.output_tokens)
// and message_stop.
int kaon_anthropic_stream_stop(kaon_anthropic_stream *st, kaon_sbuf *out, const char *stop_reason,
                               const char *stop_sequence, long long output_tokens);
// An `error` event (a failure mid-stream).
int kaon_anthropic_stream_error(kaon_sbuf *out, const kaon_api_error *e);

#endif
