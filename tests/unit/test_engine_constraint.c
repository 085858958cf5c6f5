// Output constraints (kaon_sampling.constraint) through the engine's public API on the default
// model: a sampled sequence only ever takes tokens the constraint allows, at any temperature and
// for each of n sequences (each with its own state); every token is reported to `accept` in
// order; a constraint that allows nothing, or rejects a token, ends the sequence with an error
// and a message; incomplete ops are refused at submit.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kaon.h"
#include "test.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const int32_t prompt[] = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
                                 7018, 411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575};
#define N_PROMPT (int)(sizeof prompt / sizeof prompt[0])

// A test constraint: either a script (exactly these tokens, in order) or a set (any of these,
// forever). Accepted tokens are logged per clone, so the test sees what each sequence reported.
typedef struct log_t {
    int32_t ids[4][64];
    int n[4];
    int clones;
} log_t;

typedef struct tc_state {
    const int32_t *tokens;
    int n_tokens;
    bool script;      // the next token is tokens[pos]; else any of tokens
    int pos;
    bool allow_none;  // allowed() returns an empty set
    int reject_at;    // accept() fails at this position (-1: never)
    log_t *log;
    int slot;         // this clone's row in log
} tc_state;

static int tc_allowed(void *st, uint32_t *mask, int vocab) {
    tc_state *s = st;
    if (s->allow_none) return 0;
    for (int i = 0; i < s->n_tokens; i++) {
        if (s->script && i != s->pos) continue;
        const int32_t t = s->tokens[i];
        if (t >= 0 && t < vocab) mask[t / 32] |= 1u << (t % 32);
    }
    return 0;
}

static int tc_accept(void *st, int32_t token) {
    tc_state *s = st;
    if (s->slot >= 0 && s->log->n[s->slot] < 64) s->log->ids[s->slot][s->log->n[s->slot]++] = token;
    if (s->pos == s->reject_at) return -1;
    s->pos++;
    return 0;
}

static void *tc_clone(const void *st) {
    tc_state *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *(const tc_state *)st;
    c->slot = c->log->clones < 4 ? c->log->clones++ : -1;
    return c;
}

static void tc_free(void *st) { free(st); }

static const kaon_constraint_ops tc_ops = {tc_allowed, tc_accept, tc_clone, tc_free};

typedef struct outcome {
    int32_t ids[4][64];
    int n[4];
    kaon_finish finish[4];
    char error[4][128];
} outcome;

static void run(kaon_engine *e, const kaon_sampling *sp, outcome *o) {
    memset(o, 0, sizeof *o);
    kaon_request *r = kaon_engine_submit(e, prompt, N_PROMPT, sp);
    CHECK(r != NULL);
    if (!r) return;
    kaon_output out;
    while (kaon_request_next(r, &out, 60000) == 1) {
        const int k = out.index;
        if (k >= 0 && k < 4) {
            for (int i = 0; i < out.n_tokens && o->n[k] < 64; i++) o->ids[k][o->n[k]++] = out.token_ids[i];
            if (out.finish != KAON_FINISH_NONE) o->finish[k] = out.finish;
            if (out.error) snprintf(o->error[k], sizeof o->error[k], "%s", out.error);
        }
        if (out.finished) break;
    }
    kaon_request_free(r);
}

// A script of 5 tokens ending in a stop token, sampled at temperature 1.5 with n = 2: both
// sequences produce exactly the script and stop on its last token; accept saw each in order.
static void test_script(kaon_engine *e) {
    static const int32_t script[] = {4093, 198, 1780, 314, 2683};
    log_t log = {0};
    tc_state st = {.tokens = script, .n_tokens = 5, .script = true, .reject_at = -1, .log = &log, .slot = -1};
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.n = 2;
    sp.temperature = 1.5f;
    sp.max_tokens = 20;
    sp.seed = 7;
    sp.has_seed = true;
    const int32_t stop_ids[] = {2683};
    sp.stop_token_ids = stop_ids;
    sp.n_stop_token_ids = 1;
    sp.constraint = &tc_ops;
    sp.constraint_state = &st;
    outcome o;
    run(e, &sp, &o);
    CHECK(log.clones == 2);
    for (int k = 0; k < 2; k++) {
        CHECK(o.finish[k] == KAON_FINISH_STOP);
        CHECK(o.n[k] >= 4);
        for (int i = 0; i < 4 && i < o.n[k]; i++) CHECK(o.ids[k][i] == script[i]);
        CHECK(log.n[k] == 5);
        for (int i = 0; i < 5; i++) CHECK(log.ids[k][i] == script[i]);
    }
}

// A set of three tokens at temperature 2 with top-k off: 16 tokens, every one in the set,
// ending on length; without the constraint the same request leaves the set.
static void test_set(kaon_engine *e) {
    static const int32_t set[] = {314, 1780, 9531};
    log_t log = {0};
    tc_state st = {.tokens = set, .n_tokens = 3, .script = false, .reject_at = -1, .log = &log, .slot = -1};
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 2.0f;
    sp.max_tokens = 16;
    sp.ignore_eos = true;
    sp.seed = 11;
    sp.has_seed = true;
    sp.constraint = &tc_ops;
    sp.constraint_state = &st;
    outcome o;
    run(e, &sp, &o);
    CHECK(o.finish[0] == KAON_FINISH_LENGTH);
    CHECK(o.n[0] == 16);
    for (int i = 0; i < o.n[0]; i++) CHECK(o.ids[0][i] == 314 || o.ids[0][i] == 1780 || o.ids[0][i] == 9531);
    CHECK(log.n[0] == 16);
    sp.constraint = NULL;
    sp.constraint_state = NULL;
    run(e, &sp, &o);
    int outside = 0;
    for (int i = 0; i < o.n[0]; i++) outside += !(o.ids[0][i] == 314 || o.ids[0][i] == 1780 || o.ids[0][i] == 9531);
    CHECK(outside > 0);
}

// Nothing allowed: an error ending with a message, no token. A rejected token: an error ending
// after it. Incomplete ops: refused at submit.
static void test_failures(kaon_engine *e) {
    static const int32_t set[] = {314};
    log_t log = {0};
    tc_state st = {.tokens = set, .n_tokens = 1, .allow_none = true, .reject_at = -1, .log = &log, .slot = -1};
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 8;
    sp.constraint = &tc_ops;
    sp.constraint_state = &st;
    outcome o;
    run(e, &sp, &o);
    CHECK(o.finish[0] == KAON_FINISH_ERROR);
    CHECK(o.n[0] == 0);
    CHECK(strstr(o.error[0], "allows no next token") != NULL);

    st.allow_none = false;
    st.reject_at = 2;
    run(e, &sp, &o);
    CHECK(o.finish[0] == KAON_FINISH_ERROR);
    CHECK(o.n[0] == 3);
    CHECK(strstr(o.error[0], "rejected") != NULL);

    const kaon_constraint_ops half = {tc_allowed, NULL, tc_clone, tc_free};
    sp.constraint = &half;
    CHECK(kaon_engine_submit(e, prompt, N_PROMPT, &sp) == NULL);
    CHECK(strstr(kaon_last_error(), "constraint") != NULL);
}

int main(void) {
    if (access(MODEL, R_OK) != 0) {
        fprintf(stderr, "%s missing: run scripts/setup.sh first\n", MODEL);
        return 1;
    }
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.model = MODEL;
    eo.n_threads = 2;
    eo.max_model_len = 512;
    eo.kv_cache_memory = (size_t)32 << 20;
    kaon_engine *e = kaon_engine_create(&eo);
    CHECK(e != NULL);
    if (!e) {
        fprintf(stderr, "%s\n", kaon_last_error());
        TEST_MAIN_END();
    }
    test_script(e);
    test_set(e);
    test_failures(e);
    kaon_engine_destroy(e);
    TEST_MAIN_END();
}
