// The API bindings use (include/kaon.h, "For bindings"): tokenize/detokenize round trips and
// refuses bad ids, special tokens, chat template rendering and its errors, the waitset (ready
// tags from two requests, timeout, wake), struct sizes. On the default model.
#include <string.h>
#include <time.h>

#include "kaon.h"
#include "test.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void test_text(kaon_engine *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    const char *s = "Hello, world! héllo";
    CHECK(kaon_engine_tokenize(e, s, strlen(s), false, &ids, &n) == 0);
    CHECK(n > 3);
    char *text = NULL;
    size_t len = 0;
    CHECK(kaon_engine_detokenize(e, ids, n, true, &text, &len) == 0);
    CHECK(text && len == strlen(s) && !strcmp(text, s));
    kaon_free(text);
    kaon_free(ids);
    int32_t bad[] = {1, 99999999};
    text = NULL;
    CHECK(kaon_engine_detokenize(e, bad, 2, true, &text, &len) == -1);
    CHECK(strstr(kaon_last_error(), "outside the vocabulary") != NULL);
    CHECK(kaon_engine_tokenize(e, NULL, 3, false, &ids, &n) == -1);
}

static void test_special(kaon_engine *e) {
    kaon_special_tokens st;
    int32_t stop[16];
    CHECK(kaon_engine_special_tokens(e, &st, stop, 16) == 0);
    CHECK(st.bos == 1 && st.eos == 2);  // SmolLM2: <|im_start|>, <|im_end|>
    CHECK(st.n_stop >= 1 && st.n_stop <= 16);
    bool has_eos = false;
    for (int i = 0; i < st.n_stop && i < 16; i++) has_eos |= stop[i] == st.eos;
    CHECK(has_eos);
    CHECK(kaon_engine_special_tokens(e, &st, NULL, 0) == 0 && st.n_stop >= 1);  // counting only
}

static void test_chat(kaon_engine *e) {
    char *text = NULL;
    size_t len = 0;
    const char *msgs = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}]";
    CHECK(kaon_engine_apply_chat_template(e, msgs, NULL, NULL, true, &text, &len) == 0);
    CHECK(text && !strcmp(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                "<|im_start|>assistant\n"));
    kaon_free(text);
    CHECK(kaon_engine_apply_chat_template(e, msgs, NULL, NULL, false, &text, &len) == 0);
    CHECK(text && strstr(text, "assistant") == NULL);
    kaon_free(text);
    // A template of the caller's, with an extra variable.
    CHECK(kaon_engine_apply_chat_template(e, msgs, "{\"who\": \"x\"}", "{{ who }}{{ messages|length }}", true,
                                          &text, &len) == 0);
    CHECK(text && !strcmp(text, "x2"));
    kaon_free(text);
    CHECK(kaon_engine_apply_chat_template(e, "{\"role\": \"user\"}", NULL, NULL, true, &text, &len) == -1);
    CHECK(strstr(kaon_last_error(), "JSON array") != NULL);
    CHECK(kaon_engine_apply_chat_template(e, "[{\"content\": \"x\"}]", NULL, NULL, true, &text, &len) == -1);
    CHECK(kaon_engine_apply_chat_template(e, msgs, "[1]", NULL, true, &text, &len) == -1);
    CHECK(kaon_engine_apply_chat_template(e, msgs, NULL, "{% for %}", true, &text, &len) == -1);
    CHECK(strstr(kaon_last_error(), "does not parse") != NULL);
    text = (char *)"stale";
    CHECK(kaon_engine_apply_chat_template(e, msgs, NULL, "x{{ raise_exception('refused') }}", true, &text, &len) == -1);
    CHECK(text == NULL && strstr(kaon_last_error(), "refused") != NULL);  // nothing to free, nothing leaked
}

static void test_waitset(kaon_engine *e) {
    kaon_waitset *w = kaon_waitset_create();
    uint64_t tags[8];
    double t0 = now();
    CHECK(kaon_waitset_wait(w, tags, 8, 50) == 0);  // nothing watched: a timeout
    CHECK(now() - t0 >= 0.045);
    kaon_waitset_wake(w);
    CHECK(kaon_waitset_wait(w, tags, 8, -1) == 0);  // woken at once
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 6;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(kaon_engine_tokenize(e, "The capital of France is", 24, true, &ids, &n) == 0);
    kaon_request *r[2];
    for (int i = 0; i < 2; i++) {
        r[i] = kaon_engine_submit(e, ids, (int)n, &sp);
        CHECK(r[i] && kaon_waitset_add(w, r[i], 100 + (uint64_t)i) == 0);
    }
    int tokens[2] = {0, 0}, done = 0, wakes = 0;
    while (done < 2 && wakes < 1000) {
        int k = kaon_waitset_wait(w, tags, 8, 120000);  // generous: valgrind and sanitizers are slow
        CHECK(k > 0);
        if (k <= 0) break;
        wakes++;
        for (int j = 0; j < k; j++) {
            CHECK(tags[j] == 100 || tags[j] == 101);
            int i = (int)(tags[j] - 100);
            kaon_output o;
            while (kaon_request_next(r[i], &o, 0) == 1) {
                tokens[i] += o.n_tokens;
                if (o.finished) done++;
            }
        }
    }
    CHECK(done == 2 && tokens[0] == 6 && tokens[1] == 6);
    kaon_waitset_remove(w, r[0]);
    kaon_waitset_remove(w, r[1]);
    kaon_waitset_remove(w, r[1]);  // no longer watched: no effect
    kaon_request_free(r[0]);
    kaon_request_free(r[1]);
    // A request still watched: destroy removes it (it must still be live).
    kaon_request *r3 = kaon_engine_submit(e, ids, (int)n, &sp);
    CHECK(r3 && kaon_waitset_add(w, r3, 7) == 0);
    kaon_waitset_destroy(w);
    kaon_request_free(r3);
    kaon_free(ids);
    CHECK(kaon_waitset_add(NULL, NULL, 0) == -1);
}

int main(void) {
    CHECK(kaon_struct_size("kaon_sampling") == sizeof(kaon_sampling));
    CHECK(kaon_struct_size("kaon_output") == sizeof(kaon_output));
    CHECK(kaon_struct_size("nope") == 0 && kaon_struct_size(NULL) == 0);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", KAON_VERSION_MAJOR, KAON_VERSION_MINOR, KAON_VERSION_PATCH);
    CHECK(!strcmp(kaon_version(), v));
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.model = MODEL;
    eo.n_threads = 2;
    eo.max_model_len = 512;
    eo.kv_cache_memory = (size_t)32 << 20;
    kaon_engine *e = kaon_engine_create(&eo);
    CHECK(e != NULL);
    if (!e) return 1;
    test_text(e);
    test_special(e);
    test_chat(e);
    test_waitset(e);
    kaon_engine_destroy(e);
    // Without a tokenizer the text functions say so.
    eo.load_tokenizer = false;
    e = kaon_engine_create(&eo);
    CHECK(e != NULL);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(e && kaon_engine_tokenize(e, "x", 1, false, &ids, &n) == -1);
    CHECK(strstr(kaon_last_error(), "no tokenizer") != NULL);
    kaon_engine_destroy(e);
    return kaon_test_failures ? 1 : 0;
}
