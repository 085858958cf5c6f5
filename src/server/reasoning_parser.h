// Reasoning parsers: a thinking model's output -> reasoning_content + content. DeepSeek-R1 and
// Qwen3 (and their kin) write their reasoning between <think> and </think>; R1's template
// already ends the prompt with "<think>\n", so its output begins inside the reasoning, while
// Qwen3 with enable_thinking false closes an empty block in the prompt, and all its output is
// content. Streams feed byte chunks; a marker may be split anywhere, and text that may still
// grow into one is held back, so the parts reassemble to exactly the whole output's split.
#ifndef KAON_SERVER_REASONING_PARSER_H
#define KAON_SERVER_REASONING_PARSER_H

#include <stdbool.h>
#include <stddef.h>

#include "server/sse.h"

typedef enum kaon_reasoning_family {
    KAON_REASONING_NONE = 0,
    KAON_REASONING_DEEPSEEK_R1,
    KAON_REASONING_QWEN3,
} kaon_reasoning_family;

// deepseek_r1, qwen3, none; -1 when unknown.
int kaon_reasoning_family_from_name(const char *name, kaon_reasoning_family *out);
const char *kaon_reasoning_family_name(kaon_reasoning_family f);
extern const char kaon_reasoning_family_names[];
// From a chat template's source: one that knows </think> (KAON_REASONING_NONE: none).
kaon_reasoning_family kaon_reasoning_family_detect(const char *template_src);

// Where the output starts, from the rendered prompt's tail.
typedef enum kaon_reasoning_start {
    KAON_REASONING_START_OPEN = 0,  // the model may open a <think> block itself
    KAON_REASONING_START_INSIDE,    // the prompt ends with <think>: the output is reasoning first
    KAON_REASONING_START_CLOSED,    // the prompt ends with </think> (thinking off): all content
} kaon_reasoning_start;
kaon_reasoning_start kaon_reasoning_start_from_prompt(const char *prompt, size_t len);

typedef struct kaon_reasoning_parser kaon_reasoning_parser;

// NULL when out of memory or f is KAON_REASONING_NONE.
kaon_reasoning_parser *kaon_reasoning_parser_new(kaon_reasoning_family f, kaon_reasoning_start s);
void kaon_reasoning_parser_free(kaon_reasoning_parser *p);
// Appends what text[0..n) settled to *reasoning and *content. A block that never closes is all
// reasoning; the whitespace after </think> is dropped. Returns 0, or -1 when out of memory.
int kaon_reasoning_parser_feed(kaon_reasoning_parser *p, const char *text, size_t n,
                               kaon_sbuf *reasoning, kaon_sbuf *content);
// The end of the output: what was held back goes out.
int kaon_reasoning_parser_finish(kaon_reasoning_parser *p, kaon_sbuf *reasoning,
                                 kaon_sbuf *content);
// Whether any reasoning was seen (an opened block counts, even an empty one).
bool kaon_reasoning_parser_saw_reasoning(const kaon_reasoning_parser *p);

#endif
