// y = x @ w^T (+ bias) for MXFP4 weights in kaon's layout (backend/mxfp4.h): exactness first.
// Each weight row is dequantized to f32 (exact: e2m1 times a power of two) and dotted in f32
// with the activations, so results equal the dequantized float model's within f32 rounding.
// Fast kernels (repacked for SIMD or the GPU) are still to come.
#include <stdint.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/mxfp4.h"
#include "util/pool.h"

static float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int i = 0; i < 8; i++) acc[i] += a[k + i] * b[k + i];
    float s = 0.0f;
    for (; k < n; k++) s += a[k] * b[k];
    for (int i = 0; i < 8; i++) s += acc[i];
    return s;
}

typedef struct mxfp4_job {
    const uint8_t *w;
    const float *bias, *x;
    float *y, *rows;  // rows: one dequantized weight row per thread
    int64_t M, K;
    size_t rb;
    int n, per;
} mxfp4_job;

static void mxfp4_rows(void *c, int task, int th) {
    const mxfp4_job *j = c;
    float *row = j->rows + (size_t)th * (size_t)j->K;
    const int64_t m0 = (int64_t)task * j->per, m1 = m0 + j->per < j->M ? m0 + j->per : j->M;
    for (int64_t m = m0; m < m1; m++) {
        kaon_mxfp4_dequant_row(j->w + (size_t)m * j->rb, j->K, row);
        const float b = j->bias ? j->bias[m] : 0.0f;
        for (int r = 0; r < j->n; r++)
            j->y[(size_t)r * (size_t)j->M + (size_t)m] = dot_f32(row, j->x + (size_t)r * (size_t)j->K, (int)j->K) + b;
    }
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
    mxfp4_job j = {.w = w->data, .bias = bias ? bias->data : NULL, .x = x, .y = y, .rows = rows, .M = M, .K = K,
                   .rb = rb, .n = n};
    const int tasks = kaon_cpu_tasks((int)M, nt, 1, &j.per);
    kaon_pool_run(be->pool, tasks, nt, mxfp4_rows, &j);
    return 0;
}
