// Anthropic Messages requests and responses (src/server/anthropic.c): a table of bad bodies with
// the status and field each must name; good bodies checked against the chat request they must
// become (system turn, content blocks, tool_use / tool_result turns, tools, tool_choice,
// sampling, thinking); the error shape; the Message object; and a stream's events in order.
#include <stdio.h>
#include <string.h>

#include "server/anthropic.h"
#include "test.h"

static const char *const names[] = {"smol"};

static kaon_api_limits limits(void) {
    kaon_api_limits l = {0};
    l.vocab_size = 1000;
    l.model_names = names;
    l.n_model_names = 1;
    return l;
}

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define MT "\"max_tokens\":8"
#define TOOL "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]"

typedef struct bad_case {
    const char *body;
    int status;
    const char *param;  // "" : none
} bad_case;

static const bad_case bad_cases[] = {
    {"", 400, ""},
    {"{", 400, ""},
    {"[1]", 400, ""},
    {"{} x", 400, ""},
    {"{" MSG "}", 400, "max_tokens"},
    {"{" MT "}", 400, "messages"},
    {"{" MT ",\"messages\":[]}", 400, "messages"},
    {"{" MT ",\"messages\":{}}", 400, "messages"},
    {"{" MT ",\"messages\":[3]}", 400, "messages[0]"},
    {"{" MT ",\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400, "messages[0].role"},
    {"{" MT ",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "messages[0].role"},
    {"{" MT ",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role"},
    {"{" MT ",\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400, "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"user\",\"content\":[7]}]}", 400, "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
     "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
     400, "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}", 400,
     "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
     "\"tool_use_id\":\"t\",\"content\":[{\"type\":\"image\"}]}]}]}", 400, "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\","
     "\"id\":\"t\",\"name\":\"f\",\"input\":3}]}]}", 400, "messages[0].content"},
    {"{" MT ",\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\","
     "\"tool_use_id\":\"t\"}]}]}", 400, "messages[0].content"},
    {"{" MT ",\"system\":5," MSG "}", 400, "system"},
    {"{" MT ",\"system\":[{\"type\":\"image\"}]," MSG "}", 400, "system"},
    {"{\"max_tokens\":0," MSG "}", 400, "max_tokens"},
    {"{\"max_tokens\":\"8\"," MSG "}", 400, "max_tokens"},
    {"{\"max_tokens\":2.5," MSG "}", 400, "max_tokens"},
    {"{" MT ",\"model\":3," MSG "}", 400, "model"},
    {"{" MT ",\"model\":\"claude\"," MSG "}", 404, "model"},
    {"{" MT ",\"temperature\":1.5," MSG "}", 400, "temperature"},
    {"{" MT ",\"temperature\":\"hot\"," MSG "}", 400, "temperature"},
    {"{" MT ",\"top_p\":0," MSG "}", 400, "top_p"},
    {"{" MT ",\"top_k\":-5," MSG "}", 400, "top_k"},
    {"{" MT ",\"stream\":1," MSG "}", 400, "stream"},
    {"{" MT ",\"stop_sequences\":\"x\"," MSG "}", 400, "stop_sequences"},
    {"{" MT ",\"stop_sequences\":[1]," MSG "}", 400, "stop_sequences"},
    {"{" MT ",\"metadata\":3," MSG "}", 400, "metadata"},
    {"{" MT ",\"tools\":{}," MSG "}", 400, "tools"},
    {"{" MT ",\"tools\":[{\"name\":\"f\"}]," MSG "}", 400, "tools[0]"},
    {"{" MT ",\"tools\":[{\"input_schema\":{}}]," MSG "}", 400, "tools[0]"},
    {"{" MT ",\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]," MSG "}", 400, "tools[0]"},
    {"{" MT ",\"tool_choice\":\"auto\"," MSG "}", 400, "tool_choice"},
    {"{" MT ",\"tool_choice\":{\"type\":\"maybe\"}," MSG "}", 400, "tool_choice"},
    {"{" MT "," TOOL ",\"tool_choice\":{\"type\":\"tool\"}," MSG "}", 400, "tool_choice"},
    {"{" MT "," TOOL ",\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}," MSG "}", 400, "tool_choice"},
    {"{" MT ",\"tool_choice\":{\"type\":\"any\"}," MSG "}", 400, "tool_choice"},
    {"{" MT ",\"thinking\":{\"type\":\"sometimes\"}," MSG "}", 400, "thinking"},
    {"{" MT ",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":-1}," MSG "}", 400,
     "thinking.budget_tokens"},
    {"{" MT ",\"output_config\":{\"format\":{\"type\":\"json_schema\"}}," MSG "}", 400,
     "output_config.format"},
};

static void test_bad_requests(void) {
    kaon_api_limits lim = limits();
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *c = &bad_cases[i];
        kaon_api_request r;
        kaon_api_error e;
        int rc = kaon_anthropic_parse(c->body, strlen(c->body), false, &lim, NULL, &r, &e);
        if (rc == 0 || e.status != c->status || strcmp(e.param, c->param) || !e.anthropic) {
            fprintf(stderr, "bad case %zu (%s): rc %d status %d param '%s' message '%s'\n", i,
                    c->body, rc, e.status, e.param, e.message);
            kaon_test_failures++;
        }
        if (rc == 0) kaon_api_request_free(&r);
    }
}

static const char *msg_str(const cJSON *m, const char *key) {
    cJSON *it = cJSON_GetObjectItemCaseSensitive(m, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static void test_conversation(void) {
    kaon_api_limits lim = limits();
    const char *body =
        "{\"model\":\"smol\",\"max_tokens\":50,\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\"},"
        "{\"type\":\"text\",\"text\":\"Be kind.\"}],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,"
        "\"stop_sequences\":[\"END\",\"STOP\"],\"stream\":true,\"metadata\":{\"user_id\":\"u\"},"
        "\"thinking\":{\"type\":\"disabled\"}," TOOL ",\"tool_choice\":{\"type\":\"auto\"},"
        "\"messages\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"calling\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"x\":1}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
        "\"content\":[{\"type\":\"text\",\"text\":\"42\"}]},{\"type\":\"text\",\"text\":\"thanks\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"f\","
        "\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\"}]}]}";
    kaon_api_request r;
    kaon_api_error e;
    int rc = kaon_anthropic_parse(body, strlen(body), false, &lim, NULL, &r, &e);
    CHECK(rc == 0);
    if (rc) {
        fprintf(stderr, "%s: %s\n", e.param, e.message);
        return;
    }
    CHECK(r.kind == KAON_API_CHAT && r.stream && r.max_tokens_set);
    CHECK(r.sampling.max_tokens == 50);
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-6);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-6);
    CHECK(r.sampling.top_k == 40);
    CHECK(r.n_stop == 2 && !strcmp(r.stop[0], "END") && !strcmp(r.stop[1], "STOP"));
    CHECK(r.model && !strcmp(r.model, "smol"));
    CHECK(cJSON_GetArraySize(r.tools) == 1 && !r.tool_choice_none && !r.tool_choice_required);
    cJSON *kw = cJSON_GetObjectItemCaseSensitive(r.template_kwargs, "enable_thinking");
    CHECK(cJSON_IsFalse(kw));
    // system, user, assistant (+tool_calls), tool, user, assistant (tool_calls only), tool
    cJSON *m = r.messages;
    CHECK(cJSON_GetArraySize(m) == 7);
    const char *roles[] = {"system", "user", "assistant", "tool", "user", "assistant", "tool"};
    for (int i = 0; i < 7; i++) {
        const char *role = msg_str(cJSON_GetArrayItem(m, i), "role");
        CHECK(role && !strcmp(role, roles[i]));
    }
    const char *sys = msg_str(cJSON_GetArrayItem(m, 0), "content");
    CHECK(sys && !strcmp(sys, "Be brief.\nBe kind."));  // text parts joined as the OpenAI path does
    const char *u = msg_str(cJSON_GetArrayItem(m, 1), "content");
    CHECK(u && !strcmp(u, "a\nb"));
    cJSON *a = cJSON_GetArrayItem(m, 2);
    CHECK(msg_str(a, "content") && !strcmp(msg_str(a, "content"), "calling"));
    CHECK(msg_str(a, "reasoning_content") && !strcmp(msg_str(a, "reasoning_content"), "hm"));
    cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "tool_calls"), 0);
    CHECK(msg_str(call, "id") && !strcmp(msg_str(call, "id"), "toolu_1"));
    cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    CHECK(msg_str(fn, "name") && !strcmp(msg_str(fn, "name"), "f"));
    CHECK(msg_str(fn, "arguments") && !strcmp(msg_str(fn, "arguments"), "{\"x\":1}"));
    cJSON *t = cJSON_GetArrayItem(m, 3);
    CHECK(msg_str(t, "tool_call_id") && !strcmp(msg_str(t, "tool_call_id"), "toolu_1"));
    CHECK(msg_str(t, "content") && !strcmp(msg_str(t, "content"), "42"));
    CHECK(msg_str(cJSON_GetArrayItem(m, 4), "content") &&
          !strcmp(msg_str(cJSON_GetArrayItem(m, 4), "content"), "thanks"));
    // An assistant turn of only tool calls has content null.
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(m, 5), "content")));
    CHECK(msg_str(cJSON_GetArrayItem(m, 6), "content") &&
          !strcmp(msg_str(cJSON_GetArrayItem(m, 6), "content"), ""));
    kaon_api_request_free(&r);
}

static void test_tool_choice_and_counts(void) {
    kaon_api_limits lim = limits();
    kaon_api_request r;
    kaon_api_error e;
    const char *any = "{" MT "," TOOL ",\"tool_choice\":{\"type\":\"any\"}," MSG "}";
    CHECK(kaon_anthropic_parse(any, strlen(any), false, &lim, NULL, &r, &e) == 0);
    CHECK(r.tool_choice_required && !r.tool_choice_name);
    kaon_api_request_free(&r);
    const char *tool = "{" MT "," TOOL ",\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}," MSG "}";
    CHECK(kaon_anthropic_parse(tool, strlen(tool), false, &lim, NULL, &r, &e) == 0);
    CHECK(r.tool_choice_name && !strcmp(r.tool_choice_name, "f"));
    kaon_api_request_free(&r);
    const char *none = "{" MT "," TOOL ",\"tool_choice\":{\"type\":\"none\"}," MSG "}";
    CHECK(kaon_anthropic_parse(none, strlen(none), false, &lim, NULL, &r, &e) == 0);
    CHECK(r.tool_choice_none);
    kaon_api_request_free(&r);
    // count_tokens: no max_tokens needed, sampling fields not read.
    const char *count = "{\"temperature\":7," MSG "}";
    CHECK(kaon_anthropic_parse(count, strlen(count), true, &lim, NULL, &r, &e) == 0);
    CHECK(cJSON_GetArraySize(r.messages) == 1);
    kaon_api_request_free(&r);
    CHECK(kaon_anthropic_parse(count, strlen(count), false, &lim, NULL, &r, &e) == -1);
    // A final assistant turn is continued (prefill); one ending in tool calls is not.
    const char *pre = "{" MT ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                      "{\"role\":\"assistant\",\"content\":\"The\"}]}";
    CHECK(kaon_anthropic_parse(pre, strlen(pre), false, &lim, NULL, &r, &e) == 0);
    CHECK(r.continue_final_message && !r.add_generation_prompt);
    kaon_api_request_free(&r);
    const char *call = "{" MT "," TOOL ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                       "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\","
                       "\"name\":\"f\",\"input\":{}}]}]}";
    CHECK(kaon_anthropic_parse(call, strlen(call), false, &lim, NULL, &r, &e) == 0);
    CHECK(!r.continue_final_message && r.add_generation_prompt);
    kaon_api_request_free(&r);
    // output_config.format: a JSON schema constraint.
    const char *fmt = "{" MT ",\"output_config\":{\"effort\":\"low\",\"format\":{\"type\":\"json_schema\","
                      "\"schema\":{\"type\":\"object\"}}}," MSG "}";
    CHECK(kaon_anthropic_parse(fmt, strlen(fmt), false, &lim, NULL, &r, &e) == 0);
    CHECK(r.format == KAON_API_FORMAT_JSON_SCHEMA && r.format_spec && strstr(r.format_spec, "object"));
    kaon_api_request_free(&r);
}

static void test_error_json(void) {
    kaon_api_error e;
    kaon_api_error_set(&e, 400, "invalid_value", "max_tokens", "'max_tokens' is required");
    CHECK(!e.anthropic);
    char *s = kaon_anthropic_error_json(&e, NULL);
    cJSON *j = cJSON_Parse(s);
    CHECK(!strcmp(msg_str(j, "type"), "error"));
    cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    CHECK(!strcmp(msg_str(err, "type"), "invalid_request_error"));
    CHECK(strstr(msg_str(err, "message"), "max_tokens") != NULL);
    cJSON_Delete(j);
    free(s);
    CHECK(!strcmp(kaon_anthropic_error_type(401), "authentication_error"));
    CHECK(!strcmp(kaon_anthropic_error_type(404), "not_found_error"));
    CHECK(!strcmp(kaon_anthropic_error_type(500), "api_error"));
    CHECK(!strcmp(kaon_anthropic_error_type(503), "overloaded_error"));
    CHECK(!strcmp(kaon_anthropic_stop_reason("length", true, 1), "max_tokens"));
    CHECK(!strcmp(kaon_anthropic_stop_reason("stop", true, 0), "stop_sequence"));
    CHECK(!strcmp(kaon_anthropic_stop_reason("tool_calls", false, 2), "tool_use"));
    CHECK(!strcmp(kaon_anthropic_stop_reason("stop", false, 0), "end_turn"));
}

static void test_message(void) {
    cJSON *calls = cJSON_Parse("[{\"id\":\"toolu_a\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                               "\"arguments\":\"{\\\"x\\\": 2}\"}}]");
    cJSON *m = kaon_anthropic_message("msg_1", "smol", "think", 5, "hi", 2, calls, "tool_use", NULL, 10, 3);
    char *s = cJSON_PrintUnformatted(m);
    CHECK(s && !strcmp(s,
        "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"smol\",\"content\":["
        "{\"type\":\"thinking\",\"thinking\":\"think\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"hi\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"f\",\"input\":{\"x\":2}}],"
        "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":3}}"));
    free(s);
    cJSON_Delete(m);
    cJSON_Delete(calls);
    // No output at all: one empty text block.
    m = kaon_anthropic_message("msg_2", "smol", NULL, 0, NULL, 0, NULL, "max_tokens", "END", 1, 0);
    s = cJSON_PrintUnformatted(m);
    CHECK(s && strstr(s, "\"content\":[{\"type\":\"text\",\"text\":\"\"}]") &&
          strstr(s, "\"stop_sequence\":\"END\""));
    free(s);
    cJSON_Delete(m);
}

// The event names of an SSE buffer, in order, joined with ','.
static void event_names(const char *sse, char *out, size_t n) {
    out[0] = 0;
    for (const char *p = strstr(sse, "event: "); p; p = strstr(p + 1, "event: ")) {
        const char *e = strchr(p, '\n');
        if (out[0]) strncat(out, ",", n - strlen(out) - 1);
        strncat(out, p + 7, e ? (size_t)(e - p - 7) < n - strlen(out) - 1 ? (size_t)(e - p - 7) : n - strlen(out) - 1 : 0);
    }
}

static void test_stream(void) {
    kaon_sbuf b = {0};
    kaon_anthropic_stream st = {0};
    CHECK(kaon_anthropic_stream_start(&b, "msg_1", "smol", 12) == 0);
    CHECK(kaon_anthropic_stream_delta(&st, &b, "a", 1, NULL, 0, NULL) == 0);
    CHECK(kaon_anthropic_stream_delta(&st, &b, "b", 1, "x", 1, NULL) == 0);
    CHECK(kaon_anthropic_stream_delta(&st, &b, NULL, 0, "y", 1, NULL) == 0);
    cJSON *d1 = cJSON_Parse("[{\"index\":0,\"id\":\"toolu_a\",\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
    cJSON *d2 = cJSON_Parse("[{\"index\":0,\"function\":{\"arguments\":\"{\\\"x\\\"\"}},"
                            "{\"index\":0,\"function\":{\"arguments\":\": 1}\"}}]");
    CHECK(kaon_anthropic_stream_delta(&st, &b, NULL, 0, NULL, 0, d1) == 0);
    CHECK(kaon_anthropic_stream_delta(&st, &b, NULL, 0, NULL, 0, d2) == 0);
    CHECK(kaon_anthropic_stream_stop(&st, &b, "tool_use", NULL, 7) == 0);
    char names[1024];
    event_names(b.data, names, sizeof names);
    CHECK(!strcmp(names,
        "message_start,ping,"
        "content_block_start,content_block_delta,content_block_delta,content_block_stop,"
        "content_block_start,content_block_delta,content_block_delta,content_block_stop,"
        "content_block_start,content_block_delta,content_block_delta,content_block_stop,"
        "message_delta,message_stop"));
    CHECK(st.blocks == 3 && st.open == 0);
    CHECK(strstr(b.data, "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\""));
    CHECK(strstr(b.data, "\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"y\"}"));
    CHECK(strstr(b.data, "\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"f\",\"input\":{}}"));
    CHECK(strstr(b.data, "\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\": 1}\"}"));
    CHECK(strstr(b.data, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
                         "\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":7}}\n\n"));
    CHECK(strstr(b.data, "\"usage\":{\"input_tokens\":12,\"output_tokens\":0}"));
    cJSON_Delete(d1);
    cJSON_Delete(d2);
    kaon_sbuf_free(&b);
    kaon_api_error e;
    kaon_api_error_set(&e, 504, "request_timeout", NULL, "too slow");
    CHECK(kaon_anthropic_stream_error(&b, &e) == 0);
    CHECK(b.data && !strncmp(b.data, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"", 60));
    kaon_sbuf_free(&b);
}

int main(void) {
    test_bad_requests();
    test_conversation();
    test_tool_choice_and_counts();
    test_error_json();
    test_message();
    test_stream();
    printf("test_anthropic: %zu bad-request cases\n", sizeof bad_cases / sizeof *bad_cases);
    TEST_MAIN_END();
}
