// Unpacking of AWQ, GPTQ and compressed-tensors INT4 words into kaon's INT4 layout
// (int4_unpack.h). Sources: AutoAWQ packing_utils.py (AWQ_ORDER), vLLM gptq.py (zeros + 1),
// compressed-tensors pack_to_int32 (offset 1 << (bits - 1), packed_dim 0 for zero points).
#include "model/int4_unpack.h"

#include <stdlib.h>
#include <string.h>

// Nibble i (bits 4i..4i+3) of a packed word.
static inline int nib(int32_t word, int i) { return (int)(((uint32_t)word >> (4 * i)) & 15u); }

static inline void put(uint8_t *w, int64_t K, int64_t n, int64_t k, int q) {
    uint8_t *b = w + n * (K / 2) + k / 2;
    *b = (uint8_t)(k & 1 ? (*b & 0x0F) | (q << 4) : (*b & 0xF0) | q);
}

static inline int get(const uint8_t *w, int64_t K, int64_t n, int64_t k) {
    const uint8_t b = w[n * (K / 2) + k / 2];
    return k & 1 ? b >> 4 : b & 15;
}

// Column c of a group of 8 sits at nibble AWQ_REVERSE[c] (AWQ_ORDER = 0,2,4,6,1,3,5,7).
static const int awq_reverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};

void kaon_int4_from_awq(const int32_t *qweight, const int32_t *qzeros, const float *scales, int64_t N,
                        int64_t K, int64_t gs, uint8_t *w, float *scale, float *zero) {
    const int64_t G = K / gs, W = N / 8;
    for (int64_t n = 0; n < N; n++) {
        const int i = awq_reverse[n % 8];
        for (int64_t k = 0; k < K; k++) put(w, K, n, k, nib(qweight[k * W + n / 8], i));
        for (int64_t g = 0; g < G; g++) {
            scale[n * G + g] = scales[g * N + n];
            zero[n * G + g] = (float)nib(qzeros[g * W + n / 8], i);
        }
    }
}

// perm[j] = the j-th column in a stable sort by group; -1 when a group's count is not gs
// (the last: the rest), 0 when the order is already k / gs, 1 otherwise.
static int group_order(const int32_t *g_idx, int64_t K, int64_t gs, int32_t *perm) {
    const int64_t G = (K + gs - 1) / gs;
    bool trivial = true;
    for (int64_t k = 0; k < K; k++) {
        if (g_idx[k] < 0 || g_idx[k] >= G) return -1;
        trivial &= g_idx[k] == k / gs;
    }
    if (trivial) return 0;
    int64_t *start = calloc((size_t)G + 1, sizeof *start);
    if (!start) return -1;
    for (int64_t k = 0; k < K; k++) start[g_idx[k] + 1]++;
    int rc = 1;
    for (int64_t g = 0; g < G; g++) {
        const int64_t want = g + 1 < G ? gs : K - g * gs;
        if (start[g + 1] != want) rc = -1;
        start[g + 1] += start[g];
    }
    for (int64_t k = 0; rc == 1 && k < K; k++) perm[start[g_idx[k]]++] = (int32_t)k;
    free(start);
    return rc;
}

int kaon_int4_from_gptq(const int32_t *qweight, const int32_t *qzeros, const float *scales,
                        const int32_t *g_idx, int64_t N, int64_t K, int64_t gs, bool zero_plus_one,
                        uint8_t *w, float *scale, float *zero, int32_t *perm) {
    const int64_t G = (K + gs - 1) / gs, W = N / 8;
    const int rc = g_idx ? group_order(g_idx, K, gs, perm) : 0;
    if (rc < 0) return -1;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < K; j++) {  // column j of the layout is column k of the file
            const int64_t k = rc ? perm[j] : j;
            put(w, K, n, j, nib(qweight[(k / 8) * N + n], (int)(k % 8)));
        }
        for (int64_t g = 0; g < G; g++) {
            scale[n * G + g] = scales[g * N + n];
            zero[n * G + g] = (float)(nib(qzeros[g * W + n / 8], (int)(n % 8)) + (zero_plus_one ? 1 : 0));
        }
    }
    return rc;
}

int kaon_int4_from_ct(const int32_t *packed, const float *scales, const int32_t *zero_point, const int32_t *g_idx,
                      int64_t N, int64_t K, int64_t gs, uint8_t *w, float *scale, float *zero, int32_t *perm) {
    const int64_t G = (K + gs - 1) / gs, W = (K + 7) / 8;
    const int rc = g_idx ? group_order(g_idx, K, gs, perm) : 0;
    if (rc < 0) return -1;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < K; j++) {
            const int64_t k = rc ? perm[j] : j;
            put(w, K, n, j, nib(packed[n * W + k / 8], (int)(k % 8)));
        }
        for (int64_t g = 0; g < G; g++) {
            scale[n * G + g] = scales[n * G + g];
            // Both q and zp are stored + 8, so q - zp is the stored difference.
            zero[n * G + g] = zero_point ? (float)nib(zero_point[(n / 8) * G + g], (int)(n % 8)) : 8.0f;
        }
    }
    return rc;
}

bool kaon_int4_zero_is_default(const float *zero, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (zero[i] != 8.0f) return false;
    return true;
}

float kaon_int4_value(const uint8_t *w, const float *scale, const float *zero, int64_t K, int64_t gs,
                      int64_t n, int64_t k) {
    const int64_t G = (K + gs - 1) / gs, j = n * G + k / gs;
    return ((float)get(w, K, n, k) - (zero ? zero[j] : 8.0f)) * scale[j];
}
