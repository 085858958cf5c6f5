// Chat templates: an interpreter of the Jinja subset real chat templates use, rendering byte
// for byte as jinja2 does (with HF's settings: trim_blocks and lstrip_blocks on, tojson
// without HTML escaping, raise_exception available).
#ifndef KAON_TEMPLATE_CHAT_TEMPLATE_H
#define KAON_TEMPLATE_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

typedef struct kaon_chat_template kaon_chat_template;

// Parses a template once; NULL + kaon_last_error() naming the construct and line on error.
kaon_chat_template *kaon_chat_template_parse(const char *source, size_t len);
void kaon_chat_template_free(kaon_chat_template *t);

// Renders with `context` as the global variables: messages, tools, add_generation_prompt,
// bos_token, eos_token and any extra keyword arguments (e.g. enable_thinking). *out is
// malloc'd. Bounded: loops and recursion are capped, output size is capped; exceeding a cap,
// raise_exception() and type errors return -1 with a clear message.
int kaon_chat_template_render(const kaon_chat_template *t, const cJSON *context, char **out,
                              size_t *out_len);

// The template used when a model has none (ChatML), documented in docs/API.md.
extern const char kaon_default_chat_template[];
// Gemma's <start_of_turn> format (system text opens the first user turn).
extern const char kaon_gemma_chat_template[];

// The template for a model that ships none, chosen by the turn markers in its vocabulary
// (has_token(text, ctx): whether the vocabulary holds that token): Gemma's when it has
// <start_of_turn> and <end_of_turn> but no <|im_start|>, else ChatML.
const char *kaon_fallback_chat_template(bool (*has_token)(const char *text, void *ctx), void *ctx);

#endif
