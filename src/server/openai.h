// The OpenAI API's JSON, both ways: request bodies parsed and validated (as strictly as vLLM:
// every known field's type and range, 400 with `param` set) into kaon_sampling plus a prompt
// or chat messages, and the response / stream-chunk / error objects built from engine
// outputs. Pure functions over cJSON: no engine or tokenizer calls, so all of it is unit
// tested and fuzzed on its own; server/generate.c does the tokenizing and the engine work.
#ifndef KAON_SERVER_OPENAI_H
#define KAON_SERVER_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kaon.h"
#include "util/err.h"

typedef enum kaon_api_kind {
    KAON_API_CHAT = 0,     // POST /v1/chat/completions
    KAON_API_COMPLETION,   // POST /v1/completions
    KAON_API_TOKENIZE,     // POST /tokenize (a prompt or chat messages)
    KAON_API_DETOKENIZE,   // POST /detokenize
} kaon_api_kind;

// An error as OpenAI shapes it: {"error": {"message", "type", "param", "code"}}.
typedef struct kaon_api_error {
    int status;            // HTTP status
    const char *type;      // "invalid_request_error", "authentication_error", ...
    const char *code;      // short machine code or NULL (null)
    char param[96];        // the offending field ("" = null), e.g. "messages[1].role"
    char message[512];
    bool anthropic;        // sent in Anthropic's shape (anthropic.h); kaon_api_error_set clears it
} kaon_api_error;

// Sets *e; type and code follow from the status (400/404/405/413: invalid_request_error,
// 401: authentication_error, 429: rate_limit_error, 503: service_unavailable, 504:
// timeout_error, else server_error).
void kaon_api_error_set(kaon_api_error *e, int status, const char *code, const char *param,
                        const char *fmt, ...) KAON_PRINTF(5, 6);
// The error body (malloc'd, NUL-terminated); NULL only when out of memory.
char *kaon_api_error_json(const kaon_api_error *e, size_t *len);

// What the parser checks against; zero fields take the documented defaults.
typedef struct kaon_api_limits {
    int vocab_size;                   // token ids must be in [0, vocab_size) (0: unchecked)
    int max_n;                        // n <= max_n (0: 128)
    int max_logprobs;                 // logprobs / top_logprobs <= this (0: 20)
    int max_prompts;                  // prompts in one completions request (0: 256)
    int max_stop;                     // stop strings (0: 16), each at most 1024 bytes
    const char *const *model_names;   // accepted `model` values; none: any is accepted
    int n_model_names;
    int default_max_tokens;           // completions' max_tokens when absent (0: 16)
} kaon_api_limits;

// One prompt of a completions request: text, or token ids (already range checked).
typedef struct kaon_api_prompt {
    char *text;
    int32_t *ids;
    int n_ids;
} kaon_api_prompt;

// What the output must match (structured outputs): OpenAI's response_format, vLLM's
// structured_outputs and its older guided_* fields.
typedef enum kaon_api_format {
    KAON_API_FORMAT_TEXT = 0,      // unconstrained
    KAON_API_FORMAT_JSON_SCHEMA,   // spec: the schema's JSON text
    KAON_API_FORMAT_JSON_OBJECT,   // any JSON object
    KAON_API_FORMAT_REGEX,         // spec: the pattern
    KAON_API_FORMAT_CHOICE,        // spec: a JSON array of the allowed strings
    KAON_API_FORMAT_GRAMMAR,       // spec: GBNF text
} kaon_api_format;

typedef struct kaon_api_request {
    kaon_api_kind kind;
    char *model;                       // as sent, or NULL
    bool stream, include_usage, continuous_usage;
    // The defaults passed to kaon_api_parse, overridden by the request. Its pointers (stop,
    // stop_token_ids, logit_bias) point into the arrays below. max_tokens: the request's value
    // (max_tokens_set), else the completions default, else 0 (chat: the server fills it from
    // the room left in the context).
    kaon_sampling sampling;
    bool max_tokens_set;
    char **stop;
    int n_stop;
    int32_t *stop_token_ids;
    int n_stop_token_ids;
    kaon_logit_bias *logit_bias;
    int n_logit_bias;
    // Completions, /tokenize with a prompt, /detokenize (ids in prompts[0]).
    kaon_api_prompt *prompts;
    int n_prompts;
    bool echo;
    // Chat and /tokenize with messages.
    cJSON *messages;                   // normalised: each content is a string, or null (assistant)
    cJSON *tools;                      // NULL when absent
    bool tool_choice_none;             // tool_choice "none": the output is never parsed for calls
    bool tool_choice_required;         // "required": the output is a JSON list of calls
    char *tool_choice_name;            // a named function: the output is its arguments
    kaon_api_format format;            // structured outputs (TEXT: none)
    char *format_spec;
    const char *format_param;          // the field it came from, for errors
    cJSON *template_kwargs;            // chat_template_kwargs object, or NULL
    char *chat_template;               // a per-request template, or NULL
    bool add_generation_prompt;        // default true
    bool continue_final_message;       // default false
    bool add_special_tokens;           // default: true for prompts, false for chat
    bool logprobs;                     // logprobs wanted (chat: the flag; completions: int >= 0)
    int top_logprobs;                  // alternatives per token
    bool return_token_strs;            // /tokenize
    bool return_token_ids;             // vLLM's extension: choices carry their token ids
} kaon_api_request;

// Parses and validates body[0..len) (not necessarily NUL-terminated). On success fills *out
// (free with kaon_api_request_free) and returns 0; otherwise fills *err (status 400, or 404
// for an unknown model) and returns -1 with *out zeroed. Unknown fields are logged at debug
// level and ignored. `defaults` may be NULL (then kaon_sampling_default(): OpenAI's).
int kaon_api_parse(kaon_api_kind kind, const char *body, size_t len, const kaon_api_limits *lim,
                   const kaon_sampling *defaults, kaon_api_request *out, kaon_api_error *err);
void kaon_api_request_free(kaon_api_request *r);
// The two halves of kaon_api_parse, for callers that build or inspect the JSON themselves
// (anthropic.c): the body as JSON (NULL with err filled: 400 invalid_json), and a parsed body
// validated into *out (root is not modified or kept).
cJSON *kaon_api_json_parse(const char *body, size_t len, kaon_api_error *err);
int kaon_api_parse_json(kaon_api_kind kind, const cJSON *root, const kaon_api_limits *lim,
                        const kaon_sampling *defaults, kaon_api_request *out,
                        kaon_api_error *err);
// Parts of kaon_api_parse (openai_format.c): response_format / structured_outputs / guided_*,
// and tool_choice (after tools). 0, or -1 with err filled.
int kaon_api_parse_format(const cJSON *root, kaon_api_request *r, kaon_api_error *err);
int kaon_api_parse_tool_choice(const cJSON *tc, kaon_api_request *r, kaon_api_error *err);

// How an assistant's tool turns reach the template. DECODED, as vLLM hands them over: content
// null becomes "", and a tool call's arguments text that is a JSON object becomes that object
// (most templates tojson it). AS_SENT: unchanged, for templates that test `content is none` and
// add the arguments text to strings (DeepSeek V3 / R1).
typedef enum kaon_api_tool_turns {
    KAON_API_TOOL_TURNS_DECODED = 0,
    KAON_API_TOOL_TURNS_AS_SENT,
} kaon_api_tool_turns;

// The chat template's variables: chat_template_kwargs first, then messages, tools (when
// given), add_generation_prompt, bos_token, eos_token (a kwarg cannot replace those).
cJSON *kaon_api_chat_context(const kaon_api_request *r, const char *bos, const char *eos,
                             kaon_api_tool_turns turns);
// With continue_final_message: the length of the rendered text up to the end of the final
// message's content (its closing tokens cut), or len when the content is not found.
size_t kaon_api_continue_final_cut(const kaon_api_request *r, const char *text, size_t len);

// ---- responses -------------------------------------------------------------------------------

// A token's text for logprobs; NULL when the id is unknown.
typedef const char *(*kaon_api_token_text_fn)(void *ctx, int32_t id, size_t *len);

// A JSON string from bytes, made valid UTF-8 first.
cJSON *kaon_api_string(const char *s, size_t n);
// A logprob as JSON: -inf and NaN become -9999.0 (as vLLM), 7 significant digits.
double kaon_api_logprob_value(float lp);
const char *kaon_api_finish_reason(kaon_finish f);
// obj[key] = [ids...] (return_token_ids: "token_ids", "prompt_token_ids"). -1 when out of memory.
int kaon_api_add_ids(cJSON *obj, const char *key, const int32_t *ids, int n);  // "stop", "length", "abort", "error"; NULL
cJSON *kaon_api_usage(long long prompt, long long completion, long long cached);

// Chat logprobs: appends {token, logprob, bytes, top_logprobs} for lp[0..n) to `content`.
int kaon_api_chat_logprobs_append(cJSON *content, const kaon_token_logprob *lp, int n,
                                  int top_logprobs, kaon_api_token_text_fn fn, void *ctx);
// Completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}.
cJSON *kaon_api_completion_logprobs_new(void);
// Appends ids[0..n) with their logprobs lp (NULL, or entries whose n_top < 0 or logprob is
// NaN: null entries, as for the first prompt token). *text_offset advances by each token's text length.
int kaon_api_completion_logprobs_append(cJSON *obj, const int32_t *ids,
                                        const kaon_token_logprob *lp, int n, int top_logprobs,
                                        kaon_api_token_text_fn fn, void *ctx,
                                        size_t *text_offset);

// {"id", "object", "created", "model", "choices": []} for a response (stream = false) or a
// stream chunk: object is chat.completion(.chunk) or text_completion.
cJSON *kaon_api_response_new(kaon_api_kind kind, bool stream, const char *id, long long created,
                             const char *model);
// Appends one choice. Chat: stream chunks carry "delta" (with role when role != NULL; content
// only when text != NULL), responses carry "message". logprobs and stop_reason are owned
// (NULL: null). finish_reason NULL: null.
int kaon_api_add_choice(cJSON *resp, kaon_api_kind kind, bool stream, int index, const char *role,
                        const char *text, size_t text_len, cJSON *logprobs,
                        const char *finish_reason, cJSON *stop_reason);
// What the output parsers (tool_parser.h, reasoning_parser.h) made of a chat choice, added to
// its message (stream: its delta). reasoning: reasoning_content (NULL: a response gets null when
// with_reasoning, a delta nothing). tool_calls (owned; NULL: none): message.tool_calls, and a
// message whose content is "" then gets content null, as OpenAI sends.
int kaon_api_choice_add_parsed(cJSON *resp, int index, bool stream, bool with_reasoning,
                               const char *reasoning, size_t reasoning_len, cJSON *tool_calls);

#endif
