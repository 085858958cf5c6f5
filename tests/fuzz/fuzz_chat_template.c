// libFuzzer target: arbitrary bytes as a chat template, parsed and rendered with a small fixed
// context (messages with tool calls, tools, special tokens). Any crash, hang, leak or
// sanitizer report is a bug; parse and render errors are expected outcomes.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "template/chat_template.h"

static const char k_context[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"Hi \\u00e9 \\ud83d\\ude00 {{ x }}\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true, null]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"42\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>r</think>done\", \"reasoning_content\": \"r\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

static cJSON *g_ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ctx) g_ctx = cJSON_Parse(k_context);
    kaon_chat_template *t = kaon_chat_template_parse((const char *)data, size);
    if (!t) return 0;
    char *out = NULL;
    size_t n = 0;
    if (kaon_chat_template_render(t, g_ctx, &out, &n) == 0) free(out);
    kaon_chat_template_free(t);
    return 0;
}
