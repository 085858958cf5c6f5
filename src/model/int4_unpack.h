// 4-bit checkpoints (AWQ gemm, GPTQ, compressed-tensors pack-quantized) unpacked into kaon's one
// INT4 layout (backend/linear.h: nibbles [N, K] row-major, f32 scales and zeros [N, groups],
// an optional input permutation). Pure functions over arrays so unit tests can call them;
// model/int4_weights.c finds the tensors. Layouts and sources: shared/notes/FORMATS-2.md §5-6.
// N = output features, K = input features, gs = input columns per group, G = ceil(K / gs).
#ifndef KAON_MODEL_INT4_UNPACK_H
#define KAON_MODEL_INT4_UNPACK_H

#include <stdbool.h>
#include <stdint.h>

// AWQ gemm: qweight [K, N/8], qzeros [K/gs, N/8] (nibble i of a word holds column
// AWQ_ORDER[i] of its 8), scales [K/gs, N]. Needs K % gs == 0, N % 8 == 0.
void kaon_int4_from_awq(const int32_t *qweight, const int32_t *qzeros, const float *scales, int64_t N,
                        int64_t K, int64_t gs, uint8_t *w, float *scale, float *zero);

// GPTQ: qweight [K/8, N] (nibble i of qweight[r, n] is input row 8r + i), qzeros [G, N/8]
// (packed along N), scales [G, N], g_idx [K] (NULL: k / gs). zero_plus_one: v1 checkpoints
// store zero - 1. When g_idx is not k / gs, the columns are sorted by group (stable) and perm
// receives the order; every group must then hold gs columns (the last one the rest). Returns
// 0, 1 when perm was needed (filled), -1 when g_idx cannot be laid out so (bad group counts).
int kaon_int4_from_gptq(const int32_t *qweight, const int32_t *qzeros, const float *scales,
                        const int32_t *g_idx, int64_t N, int64_t K, int64_t gs, bool zero_plus_one,
                        uint8_t *w, float *scale, float *zero, int32_t *perm);

// compressed-tensors pack-quantized: packed [N, ceil(K/8)] (nibble i of packed[n, c] is column
// 8c + i, stored q + 8), scales [N, G], zero_point [ceil(N/8), G] packed along N (stored zp + 8)
// or NULL (symmetric: zero 8), g_idx [K] as GPTQ's (actorder; NULL: k / gs). Returns as
// kaon_int4_from_gptq.
int kaon_int4_from_ct(const int32_t *packed, const float *scales, const int32_t *zero_point, const int32_t *g_idx,
                      int64_t N, int64_t K, int64_t gs, uint8_t *w, float *scale, float *zero, int32_t *perm);

// Whether every zero point is 8 (the layout's default: the zero tensor can be dropped).
bool kaon_int4_zero_is_default(const float *zero, int64_t n);

// w[n, k] of the layout, dequantized: (q - zero) * scale in f32 (tests, kv_b style users).
float kaon_int4_value(const uint8_t *w, const float *scale, const float *zero, int64_t K, int64_t gs,
                      int64_t n, int64_t k);

#endif
