// libFuzzer target for the safetensors reader: parse any bytes as one file, walk every tensor
// and check that its data lies in the buffer and matches dtype x shape.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kaon_safetensors *st = kaon_safetensors_open_memory(data, size);
    if (!st) return 0;
    for (int64_t i = 0; i < kaon_safetensors_count(st); i++) {
        const kaon_st_tensor *t = kaon_safetensors_at(st, i);
        if (t->ndim < 0 || t->ndim > KAON_MAX_DIMS) abort();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) abort();
            numel *= (uint64_t)t->shape[d];
        }
        int es = (t->dtype == KAON_F32 || t->dtype == KAON_I32) ? 4
               : (t->dtype == KAON_F16 || t->dtype == KAON_BF16) ? 2
               : (t->dtype == KAON_FP8_E4M3 || t->dtype == KAON_U8) ? 1 : t->dtype == KAON_I64 ? 8 : 0;
        if (!es || numel * (uint64_t)es != t->nbytes) abort();
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > (size_t)(data + size - p)) abort();
        if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
        if (kaon_safetensors_find(st, t->name) != t) abort();
    }
    kaon_safetensors_close(st);
    return 0;
}
