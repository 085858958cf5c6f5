// Tool-call parsers: a model's generated text -> content + OpenAI tool calls, for the formats of
// each model family's chat template. One incremental parser serves both uses: a stream feeds it
// byte chunks as they come and gets content deltas and `tool_calls` deltas back; a whole response
// feeds everything at once. The parse depends only on the bytes, never on where the chunks were
// cut, so a stream reassembles to exactly the whole response's parse. Text that may still turn
// out to begin a tool-call marker is held back until it is known not to.
//
// The formats (one call shown; several may follow one another):
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (Hermes, Qwen2.5/3)
//   llama3_json  {"name": "f", "parameters": {...}}, at the start of the output or after
//                <|python_tag|>; several separated by ';'                       (Llama 3.x)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]  or  [TOOL_CALLS]f[ARGS]{...}
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```
//                <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>  (V3/R1), and V3.1's
//                <｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//   kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
//                <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>
//
// A call becomes a call once its name and the start of its arguments have been read; before
// that, text that does not fit the format falls back to content, markers included. Arguments are
// passed on as the model wrote them (a JSON text); one cut short by the end of the output stays
// cut short, as a stream would have sent it.
#ifndef KAON_SERVER_TOOL_PARSER_H
#define KAON_SERVER_TOOL_PARSER_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/sse.h"

typedef enum kaon_tool_family {
    KAON_TOOL_NONE = 0,
    KAON_TOOL_HERMES,
    KAON_TOOL_LLAMA3_JSON,
    KAON_TOOL_MISTRAL,
    KAON_TOOL_DEEPSEEK_V3,
    KAON_TOOL_KIMI_K2,
    KAON_TOOL_FORCED,  // tool_choice required / named: made by kaon_tool_parser_new_forced only
} kaon_tool_family;

// The family for a name (hermes, qwen, llama3_json, mistral, deepseek_v3, deepseek_v31,
// kimi_k2, none); -1 when unknown.
int kaon_tool_family_from_name(const char *name, kaon_tool_family *out);
const char *kaon_tool_family_name(kaon_tool_family f);
// The names accepted, for help and error messages.
extern const char kaon_tool_family_names[];
// The family whose markers a chat template's source contains (KAON_TOOL_NONE: none).
kaon_tool_family kaon_tool_family_detect(const char *template_src);

typedef struct kaon_tool_parser kaon_tool_parser;

// Call ids are id_prefix followed by the call's index (Kimi-K2 keeps the model's own id, which
// its template renders back). NULL when out of memory or f is KAON_TOOL_NONE.
kaon_tool_parser *kaon_tool_parser_new(kaon_tool_family f, const char *id_prefix);
// For an output a grammar forced into calls: with a name, the whole output is that function's
// arguments (tool_choice naming a function); without, it is a JSON list of
// {"name": ..., "parameters": {...}} objects (tool_choice "required").
kaon_tool_parser *kaon_tool_parser_new_forced(const char *name, const char *id_prefix);
void kaon_tool_parser_free(kaon_tool_parser *p);

// Feeds text[0..n). Appends the content that became certain to *content, and sets *delta to
// the OpenAI `tool_calls` delta array of what the calls gained (NULL when nothing): a call's
// first entry carries index, id, type "function" and function.name, later ones only
// function.arguments fragments. delta may be NULL (then nothing is built; the whole-response
// case). Returns 0, or -1 when out of memory.
int kaon_tool_parser_feed(kaon_tool_parser *p, const char *text, size_t n, kaon_sbuf *content,
                          cJSON **delta);
// The end of the output: whatever was held back is decided (as content or as the call it
// began). Further feeds are ignored.
int kaon_tool_parser_finish(kaon_tool_parser *p, kaon_sbuf *content, cJSON **delta);

int kaon_tool_parser_n_calls(const kaon_tool_parser *p);
const char *kaon_tool_parser_call_id(const kaon_tool_parser *p, int i);
const char *kaon_tool_parser_call_name(const kaon_tool_parser *p, int i);
// The arguments read so far ("" before any).
const char *kaon_tool_parser_call_args(const kaon_tool_parser *p, int i, size_t *len);
// message.tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}, ...].
cJSON *kaon_tool_parser_calls_json(const kaon_tool_parser *p);

#endif
