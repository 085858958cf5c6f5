// The response side of the server: chat/completions objects and stream chunks, logprobs in both
// formats, usage, SSE framing, UTF-8 repair, and the Prometheus metrics text (histogram
// buckets, cumulative counts, label escaping).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/sse.h"
#include "test.h"

static const char *fake_text(void *ctx, int32_t id, size_t *len) {
    (void)ctx;
    static const char *const toks[] = {"Hello", " world", "!", "\xE2\x82", "\xAC", "<|im_end|>"};
    if (id < 0 || id >= 6) return NULL;
    *len = strlen(toks[id]);
    return toks[id];
}

static const char *str_at(const cJSON *o, const char *k) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static void test_sse(void) {
    kaon_sbuf b = {0};
    CHECK(kaon_sse_data(&b, "{\"a\":1}", 7) == 0);
    CHECK(!strcmp(b.data, "data: {\"a\":1}\n\n"));
    kaon_sbuf_free(&b);
    kaon_sse_data(&b, "x\ny\r\nz", 6);
    CHECK(!strcmp(b.data, "data: x\ndata: y\ndata: z\n\n"));
    kaon_sbuf_free(&b);
    kaon_sse_done(&b);
    CHECK(!strcmp(b.data, "data: [DONE]\n\n"));
    kaon_sbuf_consume(&b, 6);
    CHECK(!strcmp(b.data, "[DONE]\n\n") && b.len == 8);
    size_t n;
    char *t = kaon_sbuf_take(&b, &n);
    CHECK(n == 8 && !strcmp(t, "[DONE]\n\n") && b.data == NULL);
    free(t);
    kaon_sbuf_printf(&b, "%d-%s-%0300d", 7, "x", 1);
    CHECK(b.len == 4 + 300 && b.data[0] == '7' && b.data[b.len - 1] == '1');
    kaon_sbuf_free(&b);
}

static void test_utf8(void) {
    struct {
        const char *in;
        size_t n;
        const char *out;
        int repl;
    } cases[] = {
        {"plain", 5, "plain", 0},
        {"\xC3\xA9t\xC3\xA9", 5, "\xC3\xA9t\xC3\xA9", 0},
        {"\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80", 0},
        {"a\xE2\x82", 3, "a\xEF\xBF\xBD\xEF\xBF\xBD", 2},       // truncated sequence
        {"\x80x", 2, "\xEF\xBF\xBDx", 1},                        // stray continuation
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD", 2},          // overlong
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 3},  // surrogate
        {"\xF4\x90\x80\x80", 4, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 4},
        {"a\0b", 3, "a\xEF\xBF\xBD" "b", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kaon_sbuf b = {0};
        int r = kaon_utf8_sanitize(&b, cases[i].in, cases[i].n);
        bool ok = r == cases[i].repl && b.data && !strcmp(b.data, cases[i].out);
        if (!ok) fprintf(stderr, "utf8 case %zu: %d replacements\n", i, r);
        CHECK(ok);
        kaon_sbuf_free(&b);
    }
    CHECK(kaon_utf8_complete_prefix("ab\xE2\x82", 4) == 2);
    CHECK(kaon_utf8_complete_prefix("ab\xE2\x82\xAC", 5) == 5);
    CHECK(kaon_utf8_complete_prefix("\xF0\x9F\x98", 3) == 0);
    CHECK(kaon_utf8_complete_prefix("abc", 3) == 3);
}

static void test_chat_response(void) {
    cJSON *r = kaon_api_response_new(KAON_API_CHAT, false, "chatcmpl-1", 1700000000, "smol");
    cJSON *lp = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(lp, "content");
    kaon_top_logprob tops[2] = {{0, -0.1f}, {1, -2.5f}};
    kaon_token_logprob l[2] = {{0, -0.1f, 2, tops}, {4, -INFINITY, 0, NULL}};
    CHECK(kaon_api_chat_logprobs_append(content, l, 2, 1, fake_text, NULL) == 0);
    CHECK(kaon_api_add_choice(r, KAON_API_CHAT, false, 0, NULL, "Hello", 5, lp, "stop",
                              cJSON_CreateString("!")) == 0);
    cJSON_AddItemToObject(r, "usage", kaon_api_usage(10, 2, 8));
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    cJSON *j = cJSON_Parse(s);
    free(s);
    CHECK(!strcmp(str_at(j, "object"), "chat.completion"));
    CHECK(!strcmp(str_at(j, "id"), "chatcmpl-1"));
    CHECK(cJSON_GetObjectItem(j, "created")->valuedouble == 1700000000);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(cJSON_GetObjectItem(c0, "index")->valueint == 0);
    cJSON *msg = cJSON_GetObjectItem(c0, "message");
    CHECK(!strcmp(str_at(msg, "role"), "assistant") && !strcmp(str_at(msg, "content"), "Hello"));
    CHECK(!strcmp(str_at(c0, "finish_reason"), "stop") && !strcmp(str_at(c0, "stop_reason"), "!"));
    cJSON *lc = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
    CHECK(cJSON_GetArraySize(lc) == 2);
    cJSON *e0 = cJSON_GetArrayItem(lc, 0);
    CHECK(!strcmp(str_at(e0, "token"), "Hello"));
    CHECK(cJSON_GetObjectItem(e0, "logprob")->valuedouble == -0.1);  // printed as -0.1
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(e0, "bytes")) == 5);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(e0, "top_logprobs")) == 1);  // capped at 1
    cJSON *e1 = cJSON_GetArrayItem(lc, 1);
    CHECK(!strcmp(str_at(e1, "token"), "\xEF\xBF\xBD"));  // a lone continuation byte
    CHECK(cJSON_GetObjectItem(e1, "logprob")->valuedouble == -9999.0);
    cJSON *bytes = cJSON_GetObjectItem(e1, "bytes");
    CHECK(cJSON_GetArraySize(bytes) == 1 && cJSON_GetArrayItem(bytes, 0)->valueint == 0xAC);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    CHECK(cJSON_GetObjectItem(u, "prompt_tokens")->valueint == 10);
    CHECK(cJSON_GetObjectItem(u, "completion_tokens")->valueint == 2);
    CHECK(cJSON_GetObjectItem(u, "total_tokens")->valueint == 12);
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")
              ->valueint == 8);
    cJSON_Delete(j);

    // Stream chunks: the role chunk, a content chunk, a finish chunk without content.
    cJSON *k = kaon_api_response_new(KAON_API_CHAT, true, "chatcmpl-2", 1, "smol");
    kaon_api_add_choice(k, KAON_API_CHAT, true, 1, "assistant", "", 0, NULL, NULL, NULL);
    kaon_api_add_choice(k, KAON_API_CHAT, true, 0, NULL, "w\xE2\x82", 3, NULL, NULL, NULL);
    kaon_api_add_choice(k, KAON_API_CHAT, true, 0, NULL, NULL, 0, NULL, "length", NULL);
    s = cJSON_PrintUnformatted(k);
    cJSON_Delete(k);
    CHECK(strchr(s, '\n') == NULL);  // one SSE data line
    j = cJSON_Parse(s);
    free(s);
    CHECK(!strcmp(str_at(j, "object"), "chat.completion.chunk"));
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    cJSON *d0 = cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "delta");
    CHECK(!strcmp(str_at(d0, "role"), "assistant") && !strcmp(str_at(d0, "content"), ""));
    CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "index")->valueint == 1);
    cJSON *d1 = cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "delta");
    CHECK(!cJSON_GetObjectItem(d1, "role") && !strcmp(str_at(d1, "content"), "w\xEF\xBF\xBD\xEF\xBF\xBD"));
    cJSON *c2 = cJSON_GetArrayItem(ch, 2);
    cJSON *d2 = cJSON_GetObjectItem(c2, "delta");
    CHECK(cJSON_IsObject(d2) && d2->child == NULL);
    CHECK(!strcmp(str_at(c2, "finish_reason"), "length"));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c2, "stop_reason")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c2, "logprobs")));
    cJSON_Delete(j);
}

static void test_completion_logprobs(void) {
    cJSON *o = kaon_api_completion_logprobs_new();
    int32_t ids[3] = {0, 1, 2};
    kaon_top_logprob tops[2] = {{1, -0.5f}, {2, -1.5f}};
    kaon_token_logprob l[3] = {{0, NAN, 0, NULL}, {1, -0.5f, 2, tops}, {2, -1.25f, 0, NULL}};
    size_t off = 0;
    CHECK(kaon_api_completion_logprobs_append(o, ids, l, 3, 2, fake_text, NULL, &off) == 0);
    CHECK(off == 5 + 6 + 1);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON *j = cJSON_Parse(s);
    free(s);
    cJSON *toks = cJSON_GetObjectItem(j, "tokens");
    CHECK(cJSON_GetArraySize(toks) == 3 && !strcmp(cJSON_GetArrayItem(toks, 1)->valuestring, " world"));
    cJSON *tl = cJSON_GetObjectItem(j, "token_logprobs");
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(tl, 0)));
    CHECK(cJSON_GetArrayItem(tl, 1)->valuedouble == -0.5);
    CHECK(cJSON_GetArrayItem(tl, 2)->valuedouble == -1.25);
    cJSON *top = cJSON_GetObjectItem(j, "top_logprobs");
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(top, 0)));
    cJSON *t1 = cJSON_GetArrayItem(top, 1);
    CHECK(cJSON_GetArraySize(t1) == 2);
    CHECK(cJSON_GetObjectItem(t1, " world")->valuedouble == -0.5);
    CHECK(cJSON_GetObjectItem(t1, "!")->valuedouble == -1.5);
    // The sampled token is in its top dict even when it is not among the alternatives.
    cJSON *t2 = cJSON_GetArrayItem(top, 2);
    CHECK(cJSON_GetObjectItem(t2, "!")->valuedouble == -1.25);
    cJSON *offs = cJSON_GetObjectItem(j, "text_offset");
    CHECK(cJSON_GetArrayItem(offs, 0)->valueint == 0 && cJSON_GetArrayItem(offs, 1)->valueint == 5 &&
          cJSON_GetArrayItem(offs, 2)->valueint == 11);
    cJSON_Delete(j);

    cJSON *r = kaon_api_response_new(KAON_API_COMPLETION, true, "cmpl-1", 5, "m");
    kaon_api_add_choice(r, KAON_API_COMPLETION, true, 3, NULL, "abc", 3, NULL, NULL, NULL);
    s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    j = cJSON_Parse(s);
    free(s);
    CHECK(!strcmp(str_at(j, "object"), "text_completion"));
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    CHECK(!strcmp(str_at(c, "text"), "abc") && cJSON_GetObjectItem(c, "index")->valueint == 3);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")));
    cJSON_Delete(j);

    CHECK(kaon_api_logprob_value(-1.0f / 3.0f) == -0.3333333);
    CHECK(kaon_api_logprob_value(NAN) == -9999.0);
    CHECK(kaon_api_logprob_value(0.0f) == 0.0);
    CHECK(!strcmp(kaon_api_finish_reason(KAON_FINISH_LENGTH), "length"));
    CHECK(kaon_api_finish_reason(KAON_FINISH_NONE) == NULL);
}

// Value of the line that starts with `prefix` in the metrics text; NAN when absent.
static double metric_value(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, n)) return strtod(p + n, NULL);
    return NAN;
}

static void test_metrics(void) {
    kaon_histogram h;
    static const double b[] = {0.1, 1.0, 10.0};
    kaon_histogram_init(&h, b, 3);
    kaon_histogram_observe(&h, 0.1);   // le is inclusive
    kaon_histogram_observe(&h, 0.5);
    kaon_histogram_observe(&h, 50);
    kaon_histogram_observe(&h, NAN);   // ignored
    CHECK(h.counts[0] == 1 && h.counts[1] == 1 && h.counts[2] == 0 && h.counts[3] == 1);
    CHECK(h.count == 3);
    CHECK_NEAR(h.sum, 50.6, 1e-12);

    kaon_metrics m;
    kaon_metrics_init(&m);
    kaon_metrics_observe_ttft(&m, 0.03);
    kaon_metrics_observe_ttft(&m, 3.0);
    kaon_metrics_observe_itl(&m, 0.02, 5);
    kaon_metrics_observe_e2e(&m, 1.2);
    kaon_metrics_observe_queue(&m, 0.0);
    kaon_metrics_count_status(&m, 200);
    kaon_metrics_count_status(&m, 400);
    kaon_metrics_count_status(&m, 400);
    kaon_metrics_count_status(&m, 418);
    kaon_engine_stats st;
    memset(&st, 0, sizeof st);
    st.running = 3;
    st.waiting = 2;
    st.kv_usage = 0.25;
    st.prefix_queries_tokens = 100;
    st.prefix_hit_tokens = 40;
    st.prompt_tokens = 1234;
    st.generation_tokens = 567;
    st.finished_stop = 7;
    st.finished_length = 1;
    st.preemptions = 2;
    size_t len = 0;
    char *t = kaon_metrics_render(&m, &st, NULL, 1, "sm\"ol\\\n", &len);
    CHECK(t && len == strlen(t));
    const char *lbl = "{model_name=\"sm\\\"ol\\\\\\n\"";
    char key[256];
#define VAL(name, extra) \
    (snprintf(key, sizeof key, "%s%s%s} ", name, lbl, extra), metric_value(t, key))
    CHECK(VAL("kaon:num_requests_running", "") == 3);
    CHECK(VAL("kaon:num_requests_waiting", "") == 2);
    CHECK(VAL("kaon:kv_cache_usage_perc", "") == 0.25);
    CHECK(VAL("kaon:prefix_cache_queries_total", "") == 100);
    CHECK(VAL("kaon:prefix_cache_hits_total", "") == 40);
    CHECK(VAL("kaon:prompt_tokens_total", "") == 1234);
    CHECK(VAL("kaon:generation_tokens_total", "") == 567);
    CHECK(VAL("kaon:num_preemptions_total", "") == 2);
    CHECK(VAL("kaon:request_success_total", ",finished_reason=\"stop\"") == 7);
    CHECK(VAL("kaon:request_success_total", ",finished_reason=\"length\"") == 1);
    CHECK(VAL("kaon:time_to_first_token_seconds_bucket", ",le=\"0.02\"") == 0);
    CHECK(VAL("kaon:time_to_first_token_seconds_bucket", ",le=\"0.04\"") == 1);
    CHECK(VAL("kaon:time_to_first_token_seconds_bucket", ",le=\"2.5\"") == 1);
    CHECK(VAL("kaon:time_to_first_token_seconds_bucket", ",le=\"5.0\"") == 2);
    CHECK(VAL("kaon:time_to_first_token_seconds_bucket", ",le=\"+Inf\"") == 2);
    CHECK(VAL("kaon:time_to_first_token_seconds_count", "") == 2);
    CHECK_NEAR(VAL("kaon:time_to_first_token_seconds_sum", ""), 3.03, 1e-12);
    CHECK(VAL("kaon:inter_token_latency_seconds_bucket", ",le=\"0.025\"") == 5);
    CHECK(VAL("kaon:inter_token_latency_seconds_count", "") == 5);
    CHECK(VAL("kaon:e2e_request_latency_seconds_bucket", ",le=\"1.0\"") == 0);
    CHECK(VAL("kaon:e2e_request_latency_seconds_bucket", ",le=\"1.5\"") == 1);
    CHECK(VAL("kaon:request_queue_time_seconds_bucket", ",le=\"0.3\"") == 1);
    CHECK(VAL("kaon:http_requests_total", ",code=\"400\"") == 2);
    CHECK(VAL("kaon:http_requests_total", ",code=\"other\"") == 1);
    CHECK(strstr(t, "# TYPE kaon:time_to_first_token_seconds histogram\n") != NULL);
    CHECK(strstr(t, "# TYPE kaon:prompt_tokens_total counter\n") != NULL);
    free(t);
    // Data-parallel replicas: the totals first, unlabelled as before, then each replica's
    // under engine="i"; one engine has no engine label at all.
    kaon_engine_stats per[2];
    memset(per, 0, sizeof per);
    per[0].running = 1;
    per[1].running = 2;
    per[0].prefix_hit_tokens = 0;
    per[1].prefix_hit_tokens = 40;
    per[1].finished_stop = 7;
    t = kaon_metrics_render(&m, &st, per, 2, "m", &len);
    CHECK(t && strstr(t, "kaon:num_requests_running{model_name=\"m\"} 3\n"
                         "kaon:num_requests_running{model_name=\"m\",engine=\"0\"} 1\n"
                         "kaon:num_requests_running{model_name=\"m\",engine=\"1\"} 2\n"));
    CHECK(strstr(t, "kaon:prefix_cache_hits_total{model_name=\"m\",engine=\"1\"} 40\n") != NULL);
    CHECK(strstr(t, "kaon:request_success_total{model_name=\"m\",finished_reason=\"stop\",engine=\"1\"} 7\n") != NULL);
    CHECK(strstr(t, "engine=\"2\"") == NULL);
    free(t);
    t = kaon_metrics_render(&m, &st, per, 1, "m", &len);
    CHECK(t && !strstr(t, "engine="));
    free(t);
    // While loading there are no engine series, but the histograms are there.
    t = kaon_metrics_render(&m, NULL, NULL, 0, "m", &len);
    CHECK(t && !strstr(t, "kaon:num_requests_running") && strstr(t, "kaon:e2e_request_latency_seconds_count"));
    free(t);
    kaon_metrics_destroy(&m);
}

// What the output parsers made of a choice: tool_calls, content null, reasoning_content.
static void test_parsed_choice(void) {
    cJSON *r = kaon_api_response_new(KAON_API_CHAT, false, "chatcmpl-1", 1, "smol");
    kaon_api_add_choice(r, KAON_API_CHAT, false, 0, NULL, "", 0, NULL, "tool_calls", NULL);
    kaon_api_add_choice(r, KAON_API_CHAT, false, 1, NULL, "hi", 2, NULL, "stop", NULL);
    cJSON *calls = cJSON_Parse("[{\"id\": \"call_0\", \"type\": \"function\", \"function\": "
                               "{\"name\": \"f\", \"arguments\": \"{}\"}}]");
    CHECK(kaon_api_choice_add_parsed(r, 0, false, true, "why", 3, calls) == 0);
    CHECK(kaon_api_choice_add_parsed(r, 1, false, true, NULL, 0, NULL) == 0);
    CHECK(kaon_api_choice_add_parsed(r, 7, false, true, NULL, 0, NULL) < 0);
    cJSON *choices = cJSON_GetObjectItem(r, "choices");
    cJSON *m0 = cJSON_GetObjectItem(cJSON_GetArrayItem(choices, 0), "message");
    cJSON *m1 = cJSON_GetObjectItem(cJSON_GetArrayItem(choices, 1), "message");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(m0, "content")));
    CHECK(!strcmp(str_at(m0, "reasoning_content"), "why"));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(m0, "tool_calls")) == 1);
    CHECK(!strcmp(str_at(m1, "content"), "hi"));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(m1, "reasoning_content")));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(m1, "tool_calls")) == 0);
    cJSON_Delete(r);
    // A stream chunk: only what there is.
    r = kaon_api_response_new(KAON_API_CHAT, true, "chatcmpl-1", 1, "smol");
    kaon_api_add_choice(r, KAON_API_CHAT, true, 0, NULL, NULL, 0, NULL, NULL, NULL);
    CHECK(kaon_api_choice_add_parsed(r, 0, true, true, "a", 1, NULL) == 0);
    cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "delta");
    CHECK(!strcmp(str_at(d, "reasoning_content"), "a"));
    CHECK(!cJSON_GetObjectItem(d, "content") && !cJSON_GetObjectItem(d, "tool_calls"));
    cJSON_Delete(r);
}

int main(void) {
    test_sse();
    test_parsed_choice();
    test_utf8();
    test_chat_response();
    test_completion_logprobs();
    test_metrics();
    TEST_MAIN_END();
}
