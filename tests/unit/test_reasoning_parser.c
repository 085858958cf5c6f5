// The reasoning parsers over tests/fixtures/reasoning/*.json: each output (after its prompt's
// tail) splits into its reasoning and content, and streams cut at every byte boundary and in
// one-byte chunks give exactly the same split.
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/reasoning_parser.h"
#include "test.h"

#define FIXTURES "tests/fixtures/reasoning"

static bool eq(const kaon_sbuf *b, const char *s) {
    return b->len == strlen(s) && !memcmp(b->data ? b->data : "", s, b->len);
}

static bool same(const kaon_sbuf *a, const kaon_sbuf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->data, b->data, a->len));
}

// Feeds text in the chunks ending at cuts[0..n_cuts), then the rest.
static void split(kaon_reasoning_family f, kaon_reasoning_start st, const char *text, size_t len,
                  const size_t *cuts, int n_cuts, kaon_sbuf *reasoning, kaon_sbuf *content) {
    kaon_reasoning_parser *p = kaon_reasoning_parser_new(f, st);
    size_t at = 0;
    for (int k = 0; k <= n_cuts; k++) {
        size_t end = k < n_cuts ? cuts[k] : len;
        CHECK(kaon_reasoning_parser_feed(p, text + at, end - at, reasoning, content) == 0);
        at = end;
    }
    CHECK(kaon_reasoning_parser_finish(p, reasoning, content) == 0);
    kaon_reasoning_parser_free(p);
}

static void check_fixture(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", FIXTURES, file);
    size_t flen;
    char *src = kaon_test_read_file(path, &flen);
    cJSON *fx = src ? cJSON_Parse(src) : NULL;
    free(src);
    CHECK(fx != NULL);
    if (!fx) return;
    kaon_reasoning_family f;
    CHECK(kaon_reasoning_family_from_name(cJSON_GetStringValue(cJSON_GetObjectItem(fx, "parser")), &f) == 0);
    const char *tail = cJSON_GetStringValue(cJSON_GetObjectItem(fx, "prompt_tail"));
    const char *out = cJSON_GetStringValue(cJSON_GetObjectItem(fx, "output"));
    const char *want_r = cJSON_GetStringValue(cJSON_GetObjectItem(fx, "reasoning"));
    const char *want_c = cJSON_GetStringValue(cJSON_GetObjectItem(fx, "content"));
    CHECK(tail && out && want_r && want_c);
    if (!tail || !out || !want_r || !want_c) {
        cJSON_Delete(fx);
        return;
    }
    kaon_reasoning_start st = kaon_reasoning_start_from_prompt(tail, strlen(tail));
    size_t len = strlen(out);
    kaon_sbuf r = {0}, c = {0};
    split(f, st, out, len, NULL, 0, &r, &c);
    bool ok = eq(&r, want_r) && eq(&c, want_c);
    if (!ok)
        fprintf(stderr, "%s: reasoning [%s] content [%s]\n", file, r.data ? r.data : "",
                c.data ? c.data : "");
    CHECK(ok);
    for (size_t cut = 0; cut <= len; cut++) {
        kaon_sbuf r2 = {0}, c2 = {0};
        split(f, st, out, len, &cut, 1, &r2, &c2);
        bool s = same(&r, &r2) && same(&c, &c2);
        if (!s) fprintf(stderr, "%s: the stream cut at byte %zu differs\n", file, cut);
        CHECK(s);
        kaon_sbuf_free(&r2);
        kaon_sbuf_free(&c2);
        if (!s) break;
    }
    size_t *cuts = malloc(sizeof *cuts * (len + 1));
    for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
    kaon_sbuf r3 = {0}, c3 = {0};
    split(f, st, out, len, cuts, (int)len, &r3, &c3);
    CHECK(same(&r, &r3) && same(&c, &c3));
    free(cuts);
    kaon_sbuf_free(&r);
    kaon_sbuf_free(&c);
    kaon_sbuf_free(&r3);
    kaon_sbuf_free(&c3);
    cJSON_Delete(fx);
}

static void test_fixtures(void) {
    DIR *d = opendir(FIXTURES);
    CHECK(d != NULL);
    if (!d) return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        check_fixture(e->d_name);
        n++;
    }
    closedir(d);
    CHECK(n >= 6);
}

static void test_detection(void) {
    kaon_reasoning_family f;
    CHECK(kaon_reasoning_family_from_name("qwen3", &f) == 0 && f == KAON_REASONING_QWEN3);
    CHECK(kaon_reasoning_family_from_name("deepseek_r1", &f) == 0 && f == KAON_REASONING_DEEPSEEK_R1);
    CHECK(kaon_reasoning_family_from_name("none", &f) == 0 && f == KAON_REASONING_NONE);
    CHECK(kaon_reasoning_family_from_name("o1", &f) < 0);
    CHECK(kaon_reasoning_family_detect("{{'<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'}}") ==
          KAON_REASONING_QWEN3);
    CHECK(kaon_reasoning_family_detect("{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\\n'}}{% if '</think>' in c %}") ==
          KAON_REASONING_DEEPSEEK_R1);
    CHECK(kaon_reasoning_family_detect("{{ messages }}") == KAON_REASONING_NONE);
    CHECK(kaon_reasoning_start_from_prompt("x<think>\n", 9) == KAON_REASONING_START_INSIDE);
    CHECK(kaon_reasoning_start_from_prompt("<think>\n\n</think>\n\n", 19) == KAON_REASONING_START_CLOSED);
    CHECK(kaon_reasoning_start_from_prompt("assistant\n", 10) == KAON_REASONING_START_OPEN);
    CHECK(kaon_reasoning_parser_new(KAON_REASONING_NONE, KAON_REASONING_START_OPEN) == NULL);
    // An empty output, and saw_reasoning.
    kaon_reasoning_parser *p = kaon_reasoning_parser_new(KAON_REASONING_QWEN3, KAON_REASONING_START_OPEN);
    kaon_sbuf r = {0}, c = {0};
    CHECK(kaon_reasoning_parser_finish(p, &r, &c) == 0 && r.len == 0 && c.len == 0);
    CHECK(!kaon_reasoning_parser_saw_reasoning(p));
    kaon_reasoning_parser_free(p);
    p = kaon_reasoning_parser_new(KAON_REASONING_QWEN3, KAON_REASONING_START_OPEN);
    CHECK(kaon_reasoning_parser_feed(p, "<think></think>hi", 17, &r, &c) == 0);
    CHECK(kaon_reasoning_parser_saw_reasoning(p) && eq(&c, "hi") && r.len == 0);
    kaon_reasoning_parser_free(p);
    kaon_sbuf_free(&r);
    kaon_sbuf_free(&c);
}

int main(void) {
    test_detection();
    test_fixtures();
    TEST_MAIN_END();
}
