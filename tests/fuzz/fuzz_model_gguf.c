// libFuzzer target for model files past the GGUF parser: any bytes as a .gguf model (the
// metadata's shapes, architectures, expert layouts and tensor types checked by model/*.c), and
// when one loads, a short prefill and two decode steps on the CPU backend, so a file whose
// tensors disagree with its metadata in a way the loader misses shows up as an out-of-bounds
// access here. Seeds: tests/fuzz/make_model_seeds.py (small models of every family).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/seq.h"
#include "model/model.h"

// Files that would run for long are loaded but not run (a fuzzer must stay fast; the shapes are
// already checked by then). The seeds are far below these.
#define MAX_RUN_PARAMS (1u << 20)
#define MAX_RUN_VOCAB 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static kaon_backend *cpu;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("model.gguf", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        cpu = kaon_backend_cpu_create(1);
        if (!cpu) abort();
    }
    if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    kaon_model *m = kaon_model_load(path);
    if (!m) return 0;
    const kaon_model_config *c = &m->cfg;
    if (m->n_params <= MAX_RUN_PARAMS && c->vocab_size <= MAX_RUN_VOCAB) {
        kaon_seq s;
        if (kaon_seq_init(&s, m, cpu, 32, 8, false) == 0) {
            int32_t ids[5];
            for (int i = 0; i < 5; i++) ids[i] = (int32_t)((i * 7 + 1) % c->vocab_size);
            if (kaon_seq_feed(&s, ids, 5, NULL) == 0 && kaon_seq_feed(&s, ids, 1, NULL) == 0)
                kaon_seq_feed(&s, ids + 1, 1, NULL);
        }
        kaon_seq_free(&s);
    }
    kaon_model_free(m);
    return 0;
}
