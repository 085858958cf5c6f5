// The engine through its public API on the default model: bad requests are refused with a
// clear message while a good one keeps running; abort frees blocks; n = 2 shares the prompt's
// blocks; stop strings are found across token boundaries; prompt logits come once, chunked or not.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kaon.h"
#include "test.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct result {
    char text[4096];
    int32_t ids[512];
    int n_ids;
    kaon_finish finish[4];
    char stop_reason[64];
    int cached_tokens;
} result;

static int drain(kaon_request *r, result *res) {
    memset(res, 0, sizeof *res);
    kaon_output o;
    int outputs = 0;
    while (kaon_request_next(r, &o, 60000) == 1) {
        outputs++;
        if (o.index == 0) {
            strncat(res->text, o.text, sizeof res->text - strlen(res->text) - 1);
            for (int i = 0; i < o.n_tokens && res->n_ids < 512; i++) res->ids[res->n_ids++] = o.token_ids[i];
        }
        if (o.finish != KAON_FINISH_NONE) res->finish[o.index] = o.finish;
        if (o.stop_reason) snprintf(res->stop_reason, sizeof res->stop_reason, "%s", o.stop_reason);
        res->cached_tokens = o.cached_tokens;
        if (o.finished) break;
    }
    return outputs;
}

static kaon_engine *make_engine(void) {
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.model = MODEL;
    eo.n_threads = 2;
    eo.max_model_len = 1024;
    eo.kv_cache_memory = (size_t)64 << 20;
    return kaon_engine_create(&eo);
}

static const int32_t prompt[] = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
                                 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575,
                                 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
#define N_PROMPT (int)(sizeof prompt / sizeof prompt[0])

static void test_bad_requests_and_good_one(kaon_engine *e) {
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 12;
    sp.ignore_eos = true;
    kaon_request *good = kaon_engine_submit(e, prompt, N_PROMPT, &sp);
    CHECK(good != NULL);

    int32_t big[1100];
    for (int i = 0; i < 1100; i++) big[i] = 5;
    int32_t oov[] = {1, 49152};
    struct { const int32_t *p; int n; int field; float value; const char *words; } bad[] = {
        {prompt, 0, 0, 0, "empty"},
        {big, 1100, 0, 0, "maximum context length"},
        {oov, 2, 0, 0, "vocabulary"},
        {prompt, N_PROMPT, 1, 0, "max_tokens"},
        {prompt, N_PROMPT, 2, -0.5f, "temperature"},
        {prompt, N_PROMPT, 3, 1.5f, "top_p"},
        {prompt, N_PROMPT, 4, 3.0f, "presence_penalty"},
        {prompt, N_PROMPT, 5, 0, "n must be"},
        {prompt, N_PROMPT, 6, 0, "min_tokens"},
        {prompt, N_PROMPT, 7, 0, "maximum context length"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kaon_sampling b = sp;
        switch (bad[i].field) {
        case 1: b.max_tokens = 0; break;
        case 2: b.temperature = bad[i].value; break;
        case 3: b.top_p = bad[i].value; break;
        case 4: b.presence_penalty = bad[i].value; break;
        case 5: b.n = 0; break;
        case 6: b.min_tokens = 20; b.max_tokens = 5; break;
        case 7: b.max_tokens = 1000; break;
        }
        kaon_request *r = kaon_engine_submit(e, bad[i].p, bad[i].n, &b);
        CHECK(r == NULL);
        if (!strstr(kaon_last_error(), bad[i].words)) {
            fprintf(stderr, "case %zu: message '%s' lacks '%s'\n", i, kaon_last_error(), bad[i].words);
            CHECK(0);
        }
    }
    CHECK(kaon_engine_abort(e, 987654) == -1);
    result res;
    drain(good, &res);
    CHECK(res.n_ids == 12);
    CHECK(res.finish[0] == KAON_FINISH_LENGTH);
    CHECK(strlen(res.text) > 0);
    kaon_request_free(good);
}

static void test_abort_frees_blocks(kaon_engine *e) {
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.max_tokens = 400;
    sp.ignore_eos = true;
    kaon_request *r = kaon_engine_submit(e, prompt, N_PROMPT, &sp);
    CHECK(r != NULL);
    kaon_output o;
    CHECK(kaon_request_next(r, &o, 60000) == 1);  // running
    kaon_engine_stats st;
    kaon_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used > 0);
    kaon_request_abort(r);
    kaon_finish last = KAON_FINISH_NONE;
    while (kaon_request_next(r, &o, 60000) == 1) {
        last = o.finish;
        if (o.finished) break;
    }
    CHECK(last == KAON_FINISH_ABORT);
    kaon_request_free(r);
    for (int i = 0; i < 100; i++) {  // the engine thread updates its counters after the step
        kaon_engine_get_stats(e, &st);
        if (st.kv_blocks_used == 0 && st.running == 0) break;
        usleep(10000);
    }
    CHECK(st.kv_blocks_used == 0);
    CHECK(st.running == 0);
}

static void test_n2_shares_prompt(kaon_engine *e) {
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.n = 2;
    sp.temperature = 0;
    sp.max_tokens = 6;
    sp.ignore_eos = true;
    kaon_engine_stats before, after;
    kaon_engine_get_stats(e, &before);
    kaon_request *r = kaon_engine_submit(e, prompt, N_PROMPT, &sp);
    result res;
    drain(r, &res);
    CHECK(res.finish[0] == KAON_FINISH_LENGTH && res.finish[1] == KAON_FINISH_LENGTH);
    kaon_engine_get_stats(e, &after);
    // The second sample took the first one's full prompt blocks: 2 blocks of 16 tokens.
    CHECK(after.prefix_hit_tokens - before.prefix_hit_tokens >= 32);
    kaon_request_free(r);
}

// kaon_engine_cached_prefix: what a request submitted now would find cached, read without
// changing the cache (asking twice gives the same, and the hit counters do not move).
static void test_cached_prefix(kaon_engine *e) {
    // The prompt ran already (test_n2_shares_prompt): its 2 full blocks are cached.
    kaon_engine_stats before, after;
    kaon_engine_get_stats(e, &before);
    CHECK(kaon_engine_cached_prefix(e, prompt, N_PROMPT) == 32);
    CHECK(kaon_engine_cached_prefix(e, prompt, N_PROMPT) == 32);
    CHECK(kaon_engine_cached_prefix(e, prompt, 33) == 32);
    CHECK(kaon_engine_cached_prefix(e, prompt, 32) == 16);  // one token is always computed
    CHECK(kaon_engine_cached_prefix(e, prompt, 16) == 0);
    CHECK(kaon_engine_cached_prefix(e, prompt, 0) == 0);
    CHECK(kaon_engine_cached_prefix(e, NULL, 5) == 0);
    int32_t other[N_PROMPT];
    memcpy(other, prompt, sizeof other);
    other[20] = 42;  // the second block differs: only the first is cached
    CHECK(kaon_engine_cached_prefix(e, other, N_PROMPT) == 16);
    other[0] = 2;    // the first differs: the chain breaks there
    CHECK(kaon_engine_cached_prefix(e, other, N_PROMPT) == 0);
    kaon_engine_get_stats(e, &after);
    CHECK(after.prefix_queries_tokens == before.prefix_queries_tokens);
    CHECK(after.kv_blocks_used == before.kv_blocks_used);
}

static void test_stop_string_across_tokens(kaon_engine *e) {
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 24;
    sp.ignore_eos = true;
    result full;
    kaon_request *r = kaon_engine_submit(e, prompt, N_PROMPT, &sp);
    drain(r, &full);
    kaon_request_free(r);
    // Pick a stop string that straddles the boundary between two generated tokens.
    size_t len = strlen(full.text), cut = 0;
    char stop[8] = "";
    const char *t = kaon_engine_tokenizer(e) ? full.text : NULL;
    CHECK(t != NULL);
    for (size_t i = 8; i + 3 < len; i++)
        if (full.text[i] != ' ' && full.text[i + 1] != ' ' && full.text[i - 1] != ' ' && full.text[i + 2] != ' ') {
            memcpy(stop, full.text + i - 1, 4);
            stop[4] = 0;
            cut = i - 1;
            break;
        }
    CHECK(cut > 0);
    const char *stops[] = {stop};
    sp.stop = stops;
    sp.n_stop = 1;
    result res;
    r = kaon_engine_submit(e, prompt, N_PROMPT, &sp);
    drain(r, &res);
    kaon_request_free(r);
    char *first = strstr(full.text, stop);
    CHECK(first != NULL);
    size_t expect = first ? (size_t)(first - full.text) : 0;
    CHECK(strlen(res.text) == expect);
    CHECK(!strncmp(res.text, full.text, expect));
    CHECK(res.finish[0] == KAON_FINISH_STOP);
    CHECK(!strcmp(res.stop_reason, stop));
}

// prompt_logits: every prompt row comes once, with the first output, and its last row is the
// one the first (greedy) token was taken from; a prompt chunked into steps of 8 rows
// (max_logit_rows) gives the same rows as one step.
static void test_prompt_logits(kaon_engine *e) {
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 2;
    sp.ignore_eos = true;
    sp.prompt_logits = true;
    kaon_engine_info info;
    kaon_engine_get_info(e, &info);
    const size_t V = (size_t)info.vocab_size, bytes = sizeof(float) * N_PROMPT * V;
    float *rows[2] = {malloc(bytes), malloc(bytes)};
    int32_t first_tok[2] = {-1, -1};
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.model = MODEL;
    eo.n_threads = 2;
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = 8;
    eo.max_logit_rows = 8;
    eo.max_model_len = 64;
    eo.load_tokenizer = false;
    kaon_engine *small = kaon_engine_create(&eo);
    CHECK(small != NULL && rows[0] && rows[1]);
    for (int k = 0; k < 2 && small && rows[0] && rows[1]; k++) {
        kaon_request *r = kaon_engine_submit(k ? small : e, prompt, N_PROMPT, &sp);
        CHECK(r != NULL);
        kaon_output o;
        int with_logits = 0;
        while (r && kaon_request_next(r, &o, 60000) == 1) {
            if (o.prompt_logits) {
                with_logits++;
                CHECK(o.n_prompt_logits == N_PROMPT);
                memcpy(rows[k], o.prompt_logits, bytes);
            }
            if (o.n_tokens && first_tok[k] < 0) first_tok[k] = o.token_ids[0];
            if (o.finished) break;
        }
        kaon_request_free(r);
        CHECK(with_logits == 1);
        const float *last = rows[k] + (N_PROMPT - 1) * V;
        int best = 0;
        for (size_t t = 1; t < V; t++)
            if (last[t] > last[best]) best = (int)t;
        CHECK(first_tok[k] == best);
    }
    CHECK(first_tok[0] == first_tok[1]);
    double worst = 0;
    for (size_t i = 0; i < N_PROMPT * V && rows[0] && rows[1]; i++) {
        const double d = fabs((double)rows[0][i] - rows[1][i]);
        worst = d > worst ? d : worst;
    }
    CHECK(worst < 1e-3);
    kaon_engine_destroy(small);
    free(rows[0]);
    free(rows[1]);
}

int main(void) {
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "%s missing: run scripts/setup.sh first\n", MODEL);
        return 1;
    }
    kaon_engine *e = make_engine();
    CHECK(e != NULL);
    if (!e) {
        fprintf(stderr, "%s\n", kaon_last_error());
        TEST_MAIN_END();
    }
    test_bad_requests_and_good_one(e);
    test_abort_frees_blocks(e);
    test_n2_shares_prompt(e);
    test_cached_prefix(e);
    test_stop_string_across_tokens(e);
    test_prompt_logits(e);
    kaon_engine_destroy(e);
    TEST_MAIN_END();
}
