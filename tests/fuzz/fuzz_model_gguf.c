// libFuzzer target for model files past the GGUF parser: any bytes as a .gguf model (the
// metadata's shapes, architectures, expert layouts and tensor types checked by model/*.c), and
// when one loads, a short prefill and two decode steps through the engine on the CPU backend,
// so a file whose tensors disagree with its metadata in a way the loader misses shows up as an
// out-of-bounds access here. Seeds: tests/fuzz/make_model_seeds.py (small models of every family).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kaon.h"
#include "model/model.h"

// Files that would run for long are loaded but not run (a fuzzer must stay fast; the shapes are
// already checked by then). The seeds are far below these.
#define MAX_RUN_PARAMS (1u << 20)
#define MAX_RUN_VOCAB 4096

// The prompt's prefill in chunks of 8, then two decode steps: three tokens, greedy.
static void run(const char *path, int vocab) {
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.model = path;
    eo.n_threads = 1;
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = 8;
    eo.max_model_len = 32;
    eo.load_tokenizer = false;
    kaon_engine *e = kaon_engine_create(&eo);
    if (!e) return;
    int32_t ids[5];
    for (int i = 0; i < 5; i++) ids[i] = (int32_t)((i * 7 + 1) % vocab);
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 3;
    sp.ignore_eos = true;
    kaon_request *r = kaon_engine_submit(e, ids, 5, &sp);
    kaon_output out;
    while (r && kaon_request_next(r, &out, -1) == 1 && !out.finished) {
    }
    kaon_request_free(r);
    kaon_engine_destroy(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("model.gguf", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    kaon_model *m = kaon_model_load(path);
    if (!m) return 0;
    const bool small = m->n_params <= MAX_RUN_PARAMS && m->cfg.vocab_size <= MAX_RUN_VOCAB;
    const int vocab = m->cfg.vocab_size;
    kaon_model_free(m);
    if (small) run(path, vocab);
    return 0;
}
