// Requests that arrive in waves and are then preempted en masse (the engine alone: dummy weights
// of a tiny Llama on the noop backend, admission by the prompt alone): a preemption puts a
// running sequence back in the waiting queue, which once grew only with arrivals, so when more
// sequences lived than it had room for, the preemption wrote past it (heap corruption seen at
// exit after 3,000 requests; AddressSanitizer, which runs this test in CI, reports such a
// write). Every request must finish with all its tokens and every block come back.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kaon.h"
#include "test.h"

#define N_FIRST 300   // the first wave: about 214 of them fit the pool by their prompts
#define N_REQ 1100    // then the rest: ~890 waiting, under the queue's first size (1,024)
#define PROMPT 100
#define NEW 400       // 500 tokens each at the end: ~48 fit, ~1,050 wait
#define POOL_TOKENS 24000

static const char CONFIG[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
    " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 32, \"vocab_size\": 512, \"max_position_embeddings\": 512,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"float32\"}";

static kaon_request *submit(kaon_engine *e, int i) {
    int32_t ids[PROMPT];
    for (int k = 0; k < PROMPT; k++) ids[k] = 3 + (i * 131 + k * 17) % 500;
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = NEW;
    sp.ignore_eos = true;
    return kaon_engine_submit(e, ids, PROMPT, &sp);
}

int main(void) {
    char dir[] = "/tmp/kaon_waves_XXXXXX", path[64], model[80];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) TEST_MAIN_END();
    fputs(CONFIG, f);
    fclose(f);
    snprintf(model, sizeof model, "dummy:%s", path);
    setenv("KAON_ADMIT_RATIO", "0", 1);  // admit by the prompt alone: the pool runs dry

    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.model = model;
    eo.device = "noop";
    eo.load_tokenizer = false;  // ids in, ids out
    eo.n_threads = 1;
    eo.max_num_seqs = N_REQ;
    eo.max_num_batched_tokens = 8192;
    eo.max_model_len = 512;
    eo.kv_cache_memory = (size_t)POOL_TOKENS * 2 * 32 * 2 * 4;  // 2 layers, K and V of 32 f32
    kaon_engine *e = kaon_engine_create(&eo);
    CHECK(e != NULL);
    if (!e) {
        fprintf(stderr, "%s\n", kaon_last_error());
        TEST_MAIN_END();
    }
    kaon_request **r = calloc(N_REQ, sizeof *r);
    for (int i = 0; i < N_FIRST; i++) r[i] = submit(e, i);
    kaon_output o;  // the first wave is running once the first request has its first token
    CHECK(kaon_request_next(r[0], &o, 60000) == 1);
    int got0 = o.n_tokens;
    for (int i = N_FIRST; i < N_REQ; i++) r[i] = submit(e, i);
    int whole = 0;
    for (int i = 0; i < N_REQ; i++) {
        CHECK(r[i] != NULL);
        if (!r[i]) continue;
        int n = i == 0 ? got0 : 0;
        bool done = i == 0 && o.finished;
        while (!done && kaon_request_next(r[i], &o, 60000) == 1) {
            n += o.n_tokens;
            done = o.finished;
        }
        whole += done && n == NEW && o.finish == KAON_FINISH_LENGTH;
        kaon_request_free(r[i]);
    }
    CHECK(whole == N_REQ);
    kaon_engine_stats st;
    kaon_engine_get_stats(e, &st);
    fprintf(stderr, "waves: %d of %d requests whole, %llu preemptions\n", whole, N_REQ,
            (unsigned long long)st.preemptions);
    CHECK(st.preemptions > 100);  // the running set shrank from ~214 to ~48
    CHECK(st.kv_blocks_used == 0);
    kaon_engine_destroy(e);
    free(r);
    unlink(path);
    rmdir(dir);
    TEST_MAIN_END();
}
