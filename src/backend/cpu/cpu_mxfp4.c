// y = x @ w^T (+ bias) for MXFP4 weights in kaon's layout (backend/mxfp4.h): exactness first.
// Each weight row is dequantized to f32 (exact: e2m1 times a power of two) and dotted in f32
// with the activations, so results equal the dequantized float model's within f32 rounding.
// Fast kernels (repacked for SIMD or the GPU) are still to come.
#include <stdint.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/mxfp4.h"

typedef struct mxfp4_w {
    const uint8_t *w;
    int64_t K;
    size_t rb;
} mxfp4_w;

static void mxfp4_row(const void *c, int64_t m, float *row) {
    const mxfp4_w *j = c;
    kaon_mxfp4_dequant_row(j->w + (size_t)m * j->rb, j->K, row);
}

int kaon_cpu_linear_mxfp4(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y) {
    const kaon_tensor *w = &l->w, *bias = kaon_linear_bias(l);
    if (!x || !y || !w->data || w->ndim != 2 || !kaon_linear_is_mxfp4(l))
        return kaon_cpu_fail(be, "cpu linear: bad MXFP4 weight");
    const int64_t M = w->shape[0], K = w->shape[1];
    const size_t rb = kaon_dtype_row_bytes(KAON_MXFP4, K);
    if (M <= 0 || K <= 0 || rb == 0 || M > INT32_MAX || K > INT32_MAX / 4 || w->nbytes < rb * (size_t)M)
        return kaon_cpu_fail(be, "cpu linear: MXFP4 weight [%lld, %lld] is not whole blocks of 32", (long long)M,
                             (long long)K);
    if (bias && (bias->dtype != KAON_F32 || kaon_tensor_numel(bias) != M))
        return kaon_cpu_fail(be, "cpu linear: bias must be F32 [%lld]", (long long)M);
    const int nt = kaon_cpu_threads_for(&be->base, 4.0 * (double)M * (double)K * n);
    float *rows = kaon_cpu_scratch(be, sizeof(float) * (size_t)K * (size_t)nt);
    if (!rows) return -1;
    const mxfp4_w j = {.w = w->data, .K = K, .rb = rb};
    kaon_cpu_rows_linear(be, x, n, M, K, bias ? bias->data : NULL, y, rows, nt, mxfp4_row, &j);
    return 0;
}
