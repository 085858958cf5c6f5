// Rank-order sums of the host communicators (reduce.h).
#include "dist/reduce.h"

#include <stdint.h>

#include "util/half.h"

size_t kaon_comm_dtype_bytes(kaon_comm_dtype t) {
    return t == KAON_COMM_BF16 || t == KAON_COMM_F16 ? 2 : 4;
}

static float load(const void *p, size_t i, kaon_comm_dtype t) {
    switch (t) {
    case KAON_COMM_BF16: return kaon_bf16_to_f32(((const uint16_t *)p)[i]);
    case KAON_COMM_F16: return kaon_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store(void *p, size_t i, float v, kaon_comm_dtype t) {
    switch (t) {
    case KAON_COMM_BF16: ((uint16_t *)p)[i] = kaon_f32_to_bf16(v); break;
    case KAON_COMM_F16: ((uint16_t *)p)[i] = kaon_f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

void kaon_comm_reduce(const void *const *in, int n, size_t off, void *out, size_t out_off, size_t lo, size_t hi,
                      kaon_comm_dtype t) {
    if (t == KAON_COMM_I32) {
        for (size_t i = lo; i < hi; i++) {
            int64_t s = 0;
            for (int q = 0; q < n; q++) s += ((const int32_t *)in[q])[off + i];
            ((int32_t *)out)[out_off + i] = (int32_t)s;
        }
        return;
    }
    for (size_t i = lo; i < hi; i++) {
        float s = load(in[0], off + i, t);
        for (int q = 1; q < n; q++) s += load(in[q], off + i, t);
        store(out, out_off + i, s, t);
    }
}

void kaon_comm_chunk(size_t count, int size, int r, size_t *lo, size_t *hi) {
    const size_t per = (count + (size_t)size - 1) / (size_t)size;
    *lo = per * (size_t)r < count ? per * (size_t)r : count;
    *hi = *lo + per < count ? *lo + per : count;
}
