// Fuzzes the output parsers (tool_parser*.c, reasoning_parser.c, json_scan.c): the first byte
// picks a tool-call family and where the stream is cut, the rest is a model's output. The whole
// parse and the cut stream must agree exactly (content, reasoning, every call's id, name and
// arguments), and nothing may read past the text.
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/reasoning_parser.h"
#include "server/sse.h"
#include "server/tool_parser.h"

typedef struct result {
    kaon_sbuf content, reasoning;
    kaon_tool_parser *tp;
} result;

static void parse(kaon_tool_family f, const char *text, size_t len, size_t cut, result *r) {
    kaon_reasoning_parser *rp = kaon_reasoning_parser_new(KAON_REASONING_QWEN3, KAON_REASONING_START_OPEN);
    r->tp = kaon_tool_parser_new(f, "call_");
    if (!rp || !r->tp) abort();
    size_t parts[2][2] = {{0, cut}, {cut, len}};
    for (int i = 0; i < 2; i++) {
        kaon_sbuf mid = {0};
        cJSON *d = NULL;
        kaon_reasoning_parser_feed(rp, text + parts[i][0], parts[i][1] - parts[i][0], &r->reasoning, &mid);
        if (i == 1) kaon_reasoning_parser_finish(rp, &r->reasoning, &mid);
        kaon_tool_parser_feed(r->tp, mid.data, mid.len, &r->content, &d);
        cJSON_Delete(d);
        kaon_sbuf_free(&mid);
    }
    cJSON *d = NULL;
    kaon_tool_parser_finish(r->tp, &r->content, &d);
    cJSON_Delete(d);
    kaon_reasoning_parser_free(rp);
}

static bool same_buf(const kaon_sbuf *a, const kaon_sbuf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->data, b->data, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    kaon_tool_family f = (kaon_tool_family)(1 + data[0] % 5);
    size_t len = size - 1;
    char *text = malloc(len ? len : 1);  // exact size: an over-read is caught
    if (!text) return 0;
    if (len) memcpy(text, data + 1, len);
    size_t cut = len ? (size_t)(data[0] >> 3) * len / 31 : 0;
    if (cut > len) cut = len;
    result a = {0}, b = {0};
    parse(f, text, len, len, &a);
    parse(f, text, len, cut, &b);
    if (!same_buf(&a.content, &b.content) || !same_buf(&a.reasoning, &b.reasoning)) abort();
    int n = kaon_tool_parser_n_calls(a.tp);
    if (n != kaon_tool_parser_n_calls(b.tp)) abort();
    for (int i = 0; i < n; i++) {
        size_t la, lb;
        const char *x = kaon_tool_parser_call_args(a.tp, i, &la), *y = kaon_tool_parser_call_args(b.tp, i, &lb);
        if (la != lb || memcmp(x, y, la) || strcmp(kaon_tool_parser_call_name(a.tp, i), kaon_tool_parser_call_name(b.tp, i)) ||
            strcmp(kaon_tool_parser_call_id(a.tp, i), kaon_tool_parser_call_id(b.tp, i)))
            abort();
    }
    cJSON_Delete(kaon_tool_parser_calls_json(a.tp));
    kaon_tool_parser_free(a.tp);
    kaon_tool_parser_free(b.tp);
    kaon_sbuf_free(&a.content);
    kaon_sbuf_free(&a.reasoning);
    kaon_sbuf_free(&b.content);
    kaon_sbuf_free(&b.reasoning);
    free(text);
    return 0;
}
