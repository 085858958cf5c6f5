// OpenAI request parsing (src/server/openai.c): a table of bad bodies, each with the status and
// `param` vLLM gives it, and good bodies checked field by field against the kaon_sampling and
// prompt they must produce. Also the error JSON shape and generation_config.json defaults.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "server/openai.h"
#include "test.h"

static const char *const names[] = {"smol", "models/smol.gguf"};

static kaon_api_limits limits(void) {
    kaon_api_limits l = {0};
    l.vocab_size = 1000;
    l.model_names = names;
    l.n_model_names = 2;
    return l;
}

typedef struct bad_case {
    kaon_api_kind kind;
    const char *body;
    int status;
    const char *param;  // NULL: param must be null
} bad_case;

#define CHAT KAON_API_CHAT
#define COMP KAON_API_COMPLETION
#define TOK KAON_API_TOKENIZE
#define DETOK KAON_API_DETOKENIZE
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const bad_case bad_cases[] = {
    {CHAT, "", 400, NULL},
    {CHAT, "{", 400, NULL},
    {CHAT, "{\"messages\": [}", 400, NULL},
    {CHAT, "{} trailing", 400, NULL},
    {CHAT, "[1,2]", 400, NULL},
    {CHAT, "\"text\"", 400, NULL},
    {CHAT, "{}", 400, "messages"},
    {CHAT, "{\"messages\": []}", 400, "messages"},
    {CHAT, "{\"messages\": {}}", 400, "messages"},
    {CHAT, "{\"messages\": [1]}", 400, "messages[0]"},
    {CHAT, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages[0].role"},
    {CHAT, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400, "messages[0].role"},
    {CHAT, "{\"messages\": [{\"role\": 7, \"content\": \"x\"}]}", 400, "messages[0].role"},
    {CHAT, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content"},
    {CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0].content"},
    {CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
           "\"image_url\": {\"url\": \"x\"}}]}]}", 400, "messages[0].content"},
    {CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", 400,
     "messages[0].content"},
    {CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"name\": 3}]}", 400,
     "messages[0].name"},
    {CHAT, "{\"model\": \"gpt-4\", " MSG "}", 404, "model"},
    {CHAT, "{\"model\": 3, " MSG "}", 400, "model"},
    {CHAT, "{" MSG ", \"temperature\": -0.5}", 400, "temperature"},
    {CHAT, "{" MSG ", \"temperature\": \"hot\"}", 400, "temperature"},
    {CHAT, "{" MSG ", \"temperature\": 1000}", 400, "temperature"},
    {CHAT, "{" MSG ", \"top_p\": 0}", 400, "top_p"},
    {CHAT, "{" MSG ", \"top_p\": 1.5}", 400, "top_p"},
    {CHAT, "{" MSG ", \"top_k\": -2}", 400, "top_k"},
    {CHAT, "{" MSG ", \"top_k\": 2.5}", 400, "top_k"},
    {CHAT, "{" MSG ", \"min_p\": 1.1}", 400, "min_p"},
    {CHAT, "{" MSG ", \"presence_penalty\": 2.5}", 400, "presence_penalty"},
    {CHAT, "{" MSG ", \"frequency_penalty\": -3}", 400, "frequency_penalty"},
    {CHAT, "{" MSG ", \"repetition_penalty\": 0}", 400, "repetition_penalty"},
    {CHAT, "{" MSG ", \"n\": 0}", 400, "n"},
    {CHAT, "{" MSG ", \"n\": 1000}", 400, "n"},
    {CHAT, "{" MSG ", \"n\": true}", 400, "n"},
    {CHAT, "{" MSG ", \"max_tokens\": 0}", 400, "max_tokens"},
    {CHAT, "{" MSG ", \"max_tokens\": -5}", 400, "max_tokens"},
    {CHAT, "{" MSG ", \"max_completion_tokens\": \"10\"}", 400, "max_completion_tokens"},
    {CHAT, "{" MSG ", \"max_tokens\": 5, \"min_tokens\": 6}", 400, "min_tokens"},
    {CHAT, "{" MSG ", \"stream\": \"yes\"}", 400, "stream"},
    {CHAT, "{" MSG ", \"stream_options\": {\"include_usage\": true}}", 400, "stream_options"},
    {CHAT, "{" MSG ", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400,
     "stream_options"},
    {CHAT, "{" MSG ", \"stop\": 5}", 400, "stop"},
    {CHAT, "{" MSG ", \"stop\": [\"a\", 5]}", 400, "stop"},
    {CHAT, "{" MSG ", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\","
           "\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", 400, "stop"},
    {CHAT, "{" MSG ", \"stop_token_ids\": [1, 5000]}", 400, "stop_token_ids"},
    {CHAT, "{" MSG ", \"stop_token_ids\": 5}", 400, "stop_token_ids"},
    {CHAT, "{" MSG ", \"logit_bias\": {\"abc\": 1}}", 400, "logit_bias"},
    {CHAT, "{" MSG ", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias"},
    {CHAT, "{" MSG ", \"logit_bias\": {\"5000\": 1}}", 400, "logit_bias"},
    {CHAT, "{" MSG ", \"logit_bias\": [1]}", 400, "logit_bias"},
    {CHAT, "{" MSG ", \"seed\": 1.5}", 400, "seed"},
    {CHAT, "{" MSG ", \"seed\": \"42\"}", 400, "seed"},
    {CHAT, "{" MSG ", \"logprobs\": 1}", 400, "logprobs"},
    {CHAT, "{" MSG ", \"top_logprobs\": 3}", 400, "top_logprobs"},
    {CHAT, "{" MSG ", \"logprobs\": true, \"top_logprobs\": 21}", 400, "top_logprobs"},
    {CHAT, "{" MSG ", \"response_format\": {\"type\": \"xml\"}}", 400, "response_format"},
    {CHAT, "{" MSG ", \"response_format\": {\"type\": \"json_schema\"}}", 400, "response_format"},
    {CHAT, "{" MSG ", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
           "{\"schema\": 5}}}", 400, "response_format"},
    {CHAT, "{" MSG ", \"structured_outputs\": {\"choice\": [1]}}", 400, "structured_outputs"},
    {CHAT, "{" MSG ", \"structured_outputs\": {\"regex\": \"\"}}", 400, "structured_outputs"},
    {CHAT, "{" MSG ", \"guided_regex\": \"a\", \"guided_grammar\": \"root ::= \\\"a\\\"\"}", 400,
     "guided_grammar"},
    {CHAT, "{" MSG ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
           "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}", 400,
     "tool_choice"},
    {CHAT, "{" MSG ", \"tools\": [{\"type\": \"function\"}]}", 400, "tools[0]"},
    {CHAT, "{" MSG ", \"tool_choice\": \"required\"}", 400, "tool_choice"},
    {CHAT, "{" MSG ", \"ignore_eos\": \"no\"}", 400, "ignore_eos"},
    {CHAT, "{" MSG ", \"chat_template_kwargs\": [1]}", 400, "chat_template_kwargs"},
    {CHAT, "{" MSG ", \"add_generation_prompt\": true, \"continue_final_message\": true}", 400,
     "continue_final_message"},
    {CHAT, "{" MSG ", \"continue_final_message\": true}", 400, "continue_final_message"},
    {CHAT, "{" MSG ", \"best_of\": 3}", 400, "best_of"},
    {CHAT, "{" MSG ", \"guided_json\": 5}", 400, "guided_json"},
    {CHAT, "{" MSG ", \"guided_json\": \"[1]\"}", 400, "guided_json"},
    {CHAT, "{" MSG ", \"user\": 5}", 400, "user"},
    {CHAT, "{" MSG ", \"priority\": 0.5}", 400, "priority"},
    {COMP, "{}", 400, "prompt"},
    {COMP, "{\"prompt\": \"x\", \"return_token_ids\": 1}", 400, "return_token_ids"},
    {COMP, "{\"prompt\": []}", 400, "prompt"},
    {COMP, "{\"prompt\": 5}", 400, "prompt"},
    {COMP, "{\"prompt\": [1, \"a\"]}", 400, "prompt"},
    {COMP, "{\"prompt\": [\"a\", [1]]}", 400, "prompt"},
    {COMP, "{\"prompt\": [[1, 2], []]}", 400, "prompt"},
    {COMP, "{\"prompt\": [1, 2, 1000]}", 400, "prompt"},
    {COMP, "{\"prompt\": [1, -1]}", 400, "prompt"},
    {COMP, "{\"prompt\": [1.5]}", 400, "prompt"},
    {COMP, "{\"prompt\": [{\"a\": 1}]}", 400, "prompt"},
    {COMP, "{\"prompt\": \"x\", \"logprobs\": true}", 400, "logprobs"},
    {COMP, "{\"prompt\": \"x\", \"logprobs\": 21}", 400, "logprobs"},
    {COMP, "{\"prompt\": \"x\", \"echo\": 1}", 400, "echo"},
    {COMP, "{\"prompt\": \"x\", \"suffix\": \"y\"}", 400, "suffix"},
    {COMP, "{\"prompt\": \"x\", \"min_tokens\": 17}", 400, "min_tokens"},
    {TOK, "{}", 400, "prompt"},
    {TOK, "{\"prompt\": [1, 2]}", 400, "prompt"},
    {TOK, "{\"prompt\": \"x\", \"add_special_tokens\": \"no\"}", 400, "add_special_tokens"},
    {TOK, "{\"messages\": []}", 400, "messages"},
    {DETOK, "{}", 400, "tokens"},
    {DETOK, "{\"tokens\": \"1 2\"}", 400, "tokens"},
    {DETOK, "{\"tokens\": [1, 1e9]}", 400, "tokens"},
};

static void test_bad_requests(void) {
    kaon_api_limits lim = limits();
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *c = &bad_cases[i];
        kaon_api_request r;
        kaon_api_error e;
        int rc = kaon_api_parse(c->kind, c->body, strlen(c->body), &lim, NULL, &r, &e);
        bool ok = rc == -1 && e.status == c->status &&
                  !strcmp(e.param, c->param ? c->param : "") && e.message[0] && e.type;
        if (!ok)
            fprintf(stderr, "bad case %zu: %s -> rc %d status %d param '%s' (%s)\n", i, c->body, rc,
                    e.status, e.param, e.message);
        CHECK(ok);
        // A failed parse leaves nothing to free.
        CHECK(r.model == NULL && r.messages == NULL && r.prompts == NULL && r.stop == NULL);
    }
}

static void test_chat_fields(void) {
    kaon_api_limits lim = limits();
    const char *body =
        "{\"model\": \"smol\", \"messages\": [{\"role\": \"system\", \"content\": \"be brief\"},"
        " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": "
        "\"text\", \"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\":"
        " [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"f\","
        " \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}, {\"id\": \"call_2\", \"type\":"
        " \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"not json\"}}]}, {\"role\": \"user\", \"content\": \"c\", \"name\": \"bob\"}],"
        " \"temperature\": 0.25, \"top_p\": 0.5, \"top_k\": 7, \"min_p\": 0.05, \"n\": 3,"
        " \"max_tokens\": 100, \"max_completion_tokens\": 20, \"min_tokens\": 2, \"seed\": -3,"
        " \"stop\": [\"x\", \"\", \"yz\"], \"stop_token_ids\": [4, 5], \"logit_bias\": "
        "{\"12\": -100, \"7\": 2.5}, \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5,"
        " \"repetition_penalty\": 1.1, \"ignore_eos\": true, \"logprobs\": true, \"top_logprobs\": 4,"
        " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"unknown_field\": 1,"
        " \"chat_template_kwargs\": {\"enable_thinking\": false, \"messages\": 5},"
        " \"skip_special_tokens\": false, \"priority\": -2, \"user\": \"u\"}";
    kaon_api_request r;
    kaon_api_error e;
    CHECK(kaon_api_parse(CHAT, body, strlen(body), &lim, NULL, &r, &e) == 0);
    const kaon_sampling *s = &r.sampling;
    CHECK(r.model && !strcmp(r.model, "smol"));
    CHECK_NEAR(s->temperature, 0.25, 1e-7);
    CHECK_NEAR(s->top_p, 0.5, 1e-7);
    CHECK(s->top_k == 7);
    CHECK_NEAR(s->min_p, 0.05, 1e-7);
    CHECK(s->n == 3);
    CHECK(s->max_tokens == 20 && r.max_tokens_set);  // max_completion_tokens wins
    CHECK(s->min_tokens == 2);
    CHECK(s->has_seed && s->seed == (uint64_t)(int64_t)-3);
    CHECK(s->n_stop == 2 && !strcmp(s->stop[0], "x") && !strcmp(s->stop[1], "yz"));
    CHECK(s->n_stop_token_ids == 2 && s->stop_token_ids[0] == 4 && s->stop_token_ids[1] == 5);
    CHECK(s->n_logit_bias == 2);
    CHECK(s->logit_bias[0].token == 12 && s->logit_bias[0].bias == -100.0f);
    CHECK(s->logit_bias[1].token == 7 && s->logit_bias[1].bias == 2.5f);
    CHECK_NEAR(s->presence_penalty, 0.5, 1e-7);
    CHECK_NEAR(s->frequency_penalty, -0.5, 1e-7);
    CHECK_NEAR(s->repetition_penalty, 1.1, 1e-6);
    CHECK(s->ignore_eos);
    CHECK(!s->skip_special_tokens);
    CHECK(s->priority == -2);
    CHECK(r.logprobs && r.top_logprobs == 4 && s->logprobs == 4);
    CHECK(r.stream && r.include_usage && !r.continuous_usage);
    CHECK(!r.add_special_tokens && r.add_generation_prompt);
    // Messages: content parts joined with '\n', null content kept for the assistant.
    CHECK(cJSON_GetArraySize(r.messages) == 4);
    cJSON *m1 = cJSON_GetArrayItem(r.messages, 1);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(m1, "content")), "a\nb"));
    cJSON *m2 = cJSON_GetArrayItem(r.messages, 2);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(m2, "content")));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(m2, "tool_calls")) == 2);
    cJSON *m3 = cJSON_GetArrayItem(r.messages, 3);
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(m3, "name")), "bob"));
    // The template context: kwargs first, but they cannot replace messages.
    // Tool turns for the template: as vLLM hands them over (content "", arguments objects),
    // or as sent.
    for (int turns = 0; turns < 2; turns++) {
        cJSON *c = kaon_api_chat_context(&r, NULL, NULL, (kaon_api_tool_turns)turns);
        cJSON *a = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "messages"), 2);
        cJSON *calls = cJSON_GetObjectItem(a, "tool_calls");
        cJSON *fn1 = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 0), "function");
        cJSON *fn2 = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, 1), "function");
        cJSON *args1 = cJSON_GetObjectItem(fn1, "arguments");
        if (turns == KAON_API_TOOL_TURNS_DECODED) {
            CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "content")), ""));
            CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(args1, "city")), "Paris"));
        } else {
            CHECK(cJSON_IsNull(cJSON_GetObjectItem(a, "content")));
            CHECK(!strcmp(cJSON_GetStringValue(args1), "{\"city\": \"Paris\"}"));
        }
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(fn2, "arguments")), "not json"));
        cJSON_Delete(c);
    }
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(m2, "content")));  // r itself is unchanged
    cJSON *ctx = kaon_api_chat_context(&r, "<s>", "</s>", KAON_API_TOOL_TURNS_DECODED);
    CHECK(cJSON_IsArray(cJSON_GetObjectItem(ctx, "messages")));
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(ctx, "enable_thinking")));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(ctx, "add_generation_prompt")));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(ctx, "bos_token")), "<s>"));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(ctx, "eos_token")), "</s>"));
    CHECK(cJSON_GetObjectItem(ctx, "tools") == NULL);
    cJSON_Delete(ctx);
    kaon_api_request_free(&r);
    CHECK(r.messages == NULL);
}

static void test_chat_defaults(void) {
    kaon_api_limits lim = limits();
    kaon_sampling d;
    kaon_sampling_default(&d);
    d.temperature = 0.6f;  // as if from generation_config.json
    d.top_p = 0.9f;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_p\": null,"
                       " \"model\": \"models/smol.gguf\"}";
    kaon_api_request r;
    kaon_api_error e;
    CHECK(kaon_api_parse(CHAT, body, strlen(body), &lim, &d, &r, &e) == 0);
    CHECK_NEAR(r.sampling.temperature, 0.6, 1e-7);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-7);  // null = absent
    CHECK(r.sampling.n == 1 && r.sampling.max_tokens == 0 && !r.max_tokens_set);
    CHECK(r.sampling.logprobs == -1 && r.sampling.prompt_logprobs == -1);
    CHECK(!r.stream && !r.logprobs && !r.sampling.has_seed);
    CHECK(r.sampling.skip_special_tokens);
    kaon_api_request_free(&r);

    // continue_final_message: add_generation_prompt's default gives way; the cut keeps the
    // rendered text up to the end of the final message.
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\","
           " \"content\": \"Once upon\"}], \"continue_final_message\": true}";
    CHECK(kaon_api_parse(CHAT, body, strlen(body), &lim, NULL, &r, &e) == 0);
    CHECK(r.continue_final_message && !r.add_generation_prompt);
    const char *rendered = "<u>hi</u><a>Once upon</a>\n";
    CHECK(kaon_api_continue_final_cut(&r, rendered, strlen(rendered)) ==
          strlen("<u>hi</u><a>Once upon"));
    kaon_api_request_free(&r);
}

static void test_completion_prompts(void) {
    kaon_api_limits lim = limits();
    kaon_api_request r;
    kaon_api_error e;
    const char *b1 = "{\"prompt\": \"Once upon a time\", \"echo\": true, \"logprobs\": 2}";
    CHECK(kaon_api_parse(COMP, b1, strlen(b1), &lim, NULL, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && r.prompts[0].text && !strcmp(r.prompts[0].text, "Once upon a time"));
    CHECK(r.echo && r.logprobs && r.top_logprobs == 2 && r.sampling.logprobs == 2);
    CHECK(r.sampling.prompt_logprobs == 2);  // echo + logprobs wants the prompt's
    CHECK(r.sampling.max_tokens == 16 && !r.max_tokens_set);  // OpenAI's completions default
    CHECK(r.add_special_tokens);
    kaon_api_request_free(&r);

    const char *b2 = "{\"prompt\": [\"a\", \"b\", \"c\"], \"max_tokens\": 3, \"logprobs\": 0}";
    CHECK(kaon_api_parse(COMP, b2, strlen(b2), &lim, NULL, &r, &e) == 0);
    CHECK(r.n_prompts == 3 && !strcmp(r.prompts[2].text, "c"));
    CHECK(r.sampling.max_tokens == 3 && r.max_tokens_set);
    CHECK(r.logprobs && r.top_logprobs == 0 && r.sampling.logprobs == 0);
    kaon_api_request_free(&r);

    const char *b3 = "{\"prompt\": [1, 2, 999]}";
    CHECK(kaon_api_parse(COMP, b3, strlen(b3), &lim, NULL, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && !r.prompts[0].text && r.prompts[0].n_ids == 3 &&
          r.prompts[0].ids[2] == 999);
    kaon_api_request_free(&r);

    const char *b4 = "{\"prompt\": [[1], [2, 3]], \"stop\": \"end\"}";
    CHECK(kaon_api_parse(COMP, b4, strlen(b4), &lim, NULL, &r, &e) == 0);
    CHECK(r.n_prompts == 2 && r.prompts[1].n_ids == 2 && r.prompts[1].ids[1] == 3);
    CHECK(r.sampling.n_stop == 1 && !strcmp(r.sampling.stop[0], "end"));
    kaon_api_request_free(&r);

    // Trailing whitespace after the object is fine; a body of whitespace is not.
    const char *b5 = "{\"prompt\": \"x\"} \r\n";
    CHECK(kaon_api_parse(COMP, b5, strlen(b5), &lim, NULL, &r, &e) == 0);
    kaon_api_request_free(&r);
    CHECK(kaon_api_parse(COMP, "  ", 2, &lim, NULL, &r, &e) == -1 && e.status == 400);

    // Not NUL-terminated: the parser must stop at len.
    char buf[64];
    memcpy(buf, "{\"prompt\": \"abc\"}XXXXXXXX", 26);
    CHECK(kaon_api_parse(COMP, buf, 17, &lim, NULL, &r, &e) == 0);
    CHECK(!strcmp(r.prompts[0].text, "abc"));
    kaon_api_request_free(&r);
}

static void test_tokenize_requests(void) {
    kaon_api_limits lim = limits();
    kaon_api_request r;
    kaon_api_error e;
    const char *b1 = "{\"prompt\": \"hello\", \"return_token_strs\": true}";
    CHECK(kaon_api_parse(TOK, b1, strlen(b1), &lim, NULL, &r, &e) == 0);
    CHECK(r.add_special_tokens && r.return_token_strs && !strcmp(r.prompts[0].text, "hello"));
    kaon_api_request_free(&r);
    const char *b2 = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                     "\"add_generation_prompt\": false}";
    CHECK(kaon_api_parse(TOK, b2, strlen(b2), &lim, NULL, &r, &e) == 0);
    CHECK(!r.add_special_tokens && !r.add_generation_prompt && r.messages);
    kaon_api_request_free(&r);
    const char *b3 = "{\"tokens\": []}";
    CHECK(kaon_api_parse(DETOK, b3, strlen(b3), &lim, NULL, &r, &e) == 0);
    CHECK(r.n_prompts == 1 && r.prompts[0].n_ids == 0);
    kaon_api_request_free(&r);
}

static void test_error_json(void) {
    kaon_api_error e;
    kaon_api_error_set(&e, 404, "model_not_found", "model", "The model `%s` does not exist.", "x\"y");
    size_t len = 0;
    char *s = kaon_api_error_json(&e, &len);
    CHECK(s && len == strlen(s));
    cJSON *j = cJSON_Parse(s);
    cJSON *err = cJSON_GetObjectItem(j, "error");
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(err, "message")),
                  "The model `x\"y` does not exist."));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(err, "type")), "invalid_request_error"));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(err, "param")), "model"));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(err, "code")), "model_not_found"));
    cJSON_Delete(j);
    free(s);
    kaon_api_error_set(&e, 401, NULL, NULL, "no key");
    s = kaon_api_error_json(&e, NULL);
    j = cJSON_Parse(s);
    err = cJSON_GetObjectItem(j, "error");
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(err, "param")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(err, "code")));
    CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(err, "type")), "authentication_error"));
    cJSON_Delete(j);
    free(s);
}

// vLLM's return_token_ids: off unless asked, for both generation endpoints.
static void test_return_token_ids(void) {
    kaon_api_limits lim = limits();
    kaon_api_request r;
    kaon_api_error e;
    const char *body = "{\"prompt\": [1, 2], \"return_token_ids\": true}";
    CHECK(kaon_api_parse(COMP, body, strlen(body), &lim, NULL, &r, &e) == 0);
    CHECK(r.return_token_ids);
    kaon_api_request_free(&r);
    body = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    CHECK(kaon_api_parse(CHAT, body, strlen(body), &lim, NULL, &r, &e) == 0);
    CHECK(!r.return_token_ids);
    kaon_api_request_free(&r);
}

// Structured outputs: each field lands as its format and spec; tool_choice forms.
static void test_structured_fields(void) {
    kaon_api_limits lim = limits();
    kaon_api_request r;
    kaon_api_error e;
    static const struct {
        const char *extra;
        kaon_api_format f;
        const char *spec;
    } cases[] = {
        {"\"response_format\": {\"type\": \"text\"}", KAON_API_FORMAT_TEXT, NULL},
        {"\"response_format\": {\"type\": \"json_object\"}", KAON_API_FORMAT_JSON_OBJECT, NULL},
        {"\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", "
         "\"strict\": true, \"schema\": {\"type\": \"object\"}}}",
         KAON_API_FORMAT_JSON_SCHEMA, "{\"type\":\"object\"}"},
        {"\"guided_json\": \"{\\\"type\\\": \\\"integer\\\"}\"", KAON_API_FORMAT_JSON_SCHEMA,
         "{\"type\": \"integer\"}"},
        {"\"structured_outputs\": {\"regex\": \"[0-9]+\"}", KAON_API_FORMAT_REGEX, "[0-9]+"},
        {"\"structured_outputs\": {\"choice\": [\"a\", \"b c\"]}", KAON_API_FORMAT_CHOICE,
         "[\"a\",\"b c\"]"},
        {"\"guided_grammar\": \"root ::= [a-z]+\"", KAON_API_FORMAT_GRAMMAR, "root ::= [a-z]+"},
        {"\"structured_outputs\": {\"json_object\": true}", KAON_API_FORMAT_JSON_OBJECT, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" MSG ", %s}", cases[i].extra);
        int rc = kaon_api_parse(CHAT, body, strlen(body), &lim, NULL, &r, &e);
        CHECK(rc == 0);
        if (rc) {
            fprintf(stderr, "case %zu: %s\n", i, e.message);
            continue;
        }
        CHECK(r.format == cases[i].f);
        CHECK(cases[i].spec ? r.format_spec && !strcmp(r.format_spec, cases[i].spec) : !r.format_spec);
        kaon_api_request_free(&r);
    }
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
    char body[512];
    snprintf(body, sizeof body, "{" MSG ", %s, \"tool_choice\": \"required\"}", tools);
    CHECK(kaon_api_parse(CHAT, body, strlen(body), &lim, NULL, &r, &e) == 0);
    CHECK(r.tool_choice_required && !r.tool_choice_name && !r.tool_choice_none);
    kaon_api_request_free(&r);
    snprintf(body, sizeof body,
             "{" MSG ", %s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}}",
             tools);
    CHECK(kaon_api_parse(CHAT, body, strlen(body), &lim, NULL, &r, &e) == 0);
    CHECK(r.tool_choice_name && !strcmp(r.tool_choice_name, "f") && !r.tool_choice_required);
    kaon_api_request_free(&r);
}

int main(void) {
    test_bad_requests();
    test_structured_fields();
    test_chat_fields();
    test_chat_defaults();
    test_completion_prompts();
    test_tokenize_requests();
    test_error_json();
    test_return_token_ids();
    printf("test_openai_request: %zu bad-request cases\n", sizeof bad_cases / sizeof *bad_cases);
    TEST_MAIN_END();
}
