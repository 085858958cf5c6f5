// y = x @ w^T (+ bias) for FP8 e4m3 weights with per-block f32 scales (DeepSeek's layout:
// w[i, j] = e4m3(wq[i, j]) * scale[i / b0, j / b1]). Exactness first: each weight row is
// dequantized to f32 (the same product a reference forms) and dotted in f32 with the
// activations, which stay float by default. KAON_FP8_ACT=1 quantizes them as DeepSeek's
// reference does (FORMATS-2.md §4: per token, per group of the block's columns, s = max(|x|,
// 1e-4) / 448, x ~ e4m3(x / s) s), to check against it; fast kernels are still to come.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/fp8.h"
#include "util/pool.h"

static float e4m3_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static int act_quant;  // KAON_FP8_ACT=1

static void e4m3_build(void) {
    for (int b = 0; b < 256; b++) e4m3_lut[b] = kaon_e4m3_to_f32((uint8_t)b);
    const char *e = getenv("KAON_FP8_ACT");
    act_quant = e && !strcmp(e, "1");
}

// x [n, K] -> xq: each token's groups of g columns quantized to e4m3 and back.
static void quantize_act(const float *x, int n, int64_t K, int64_t g, float *xq) {
    for (int r = 0; r < n; r++)
        for (int64_t k0 = 0; k0 < K; k0 += g) {
            const float *xr = x + (size_t)r * (size_t)K;
            float *qr = xq + (size_t)r * (size_t)K;
            const int64_t k1 = k0 + g < K ? k0 + g : K;
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(xr[k]));
            const float s = fmaxf(amax, 1e-4f) / 448.0f;
            for (int64_t k = k0; k < k1; k++) qr[k] = e4m3_lut[kaon_f32_to_e4m3(xr[k] / s)] * s;
        }
}

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

typedef struct fp8_job {
    const uint8_t *wq;
    const float *s, *bias, *x;
    float *y, *rows;  // rows: one dequantized weight row per thread
    int64_t M, K, b0, b1, scols;
    int n, per;
} fp8_job;

// Weight rows [task * per, ...): dequantized into the executing thread's row, dotted with x.
static void fp8_rows(void *c, int task, int th) {
    const fp8_job *j = c;
    float *row = j->rows + (size_t)th * (size_t)j->K;
    const int64_t m0 = (int64_t)task * j->per, m1 = m0 + j->per < j->M ? m0 + j->per : j->M;
    for (int64_t m = m0; m < m1; m++) {
        const uint8_t *q = j->wq + (size_t)m * (size_t)j->K;
        const float *srow = j->s + (size_t)(m / j->b0) * (size_t)j->scols;
        for (int64_t k = 0; k < j->K; k++) row[k] = e4m3_lut[q[k]] * srow[k / j->b1];
        const float b = j->bias ? j->bias[m] : 0.0f;
        for (int r = 0; r < j->n; r++)
            j->y[(size_t)r * (size_t)j->M + (size_t)m] = dot_f32(row, j->x + (size_t)r * (size_t)j->K, (int)j->K) + b;
    }
}

int kaon_cpu_linear_fp8(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y) {
    const kaon_tensor *w = &l->w, *sc = &l->scale, *bias = kaon_linear_bias(l);
    if (!x || !y || !w->data || w->ndim != 2 || !kaon_linear_is_fp8_block(l))
        return kaon_cpu_fail(be, "cpu linear: bad FP8 block weight");
    const int64_t M = w->shape[0], K = w->shape[1], b0 = l->scale_block[0], b1 = l->scale_block[1];
    const int64_t sr = (M + b0 - 1) / b0, scols = (K + b1 - 1) / b1;
    if (M <= 0 || K <= 0 || M > INT32_MAX || K > INT32_MAX / 4 || w->nbytes < (size_t)(M * K))
        return kaon_cpu_fail(be, "cpu linear: FP8 weight [%lld, %lld] is not whole", (long long)M, (long long)K);
    if (sc->ndim != 2 || sc->shape[0] != sr || sc->shape[1] != scols || sc->nbytes < sizeof(float) * (size_t)(sr * scols))
        return kaon_cpu_fail(be, "cpu linear: FP8 scales must be F32 [%lld, %lld]", (long long)sr, (long long)scols);
    if (bias && (bias->dtype != KAON_F32 || kaon_tensor_numel(bias) != M))
        return kaon_cpu_fail(be, "cpu linear: bias must be F32 [%lld]", (long long)M);
    pthread_once(&e4m3_once, e4m3_build);
    const int nt = kaon_cpu_threads_for(&be->base, 4.0 * (double)M * (double)K * n);
    const size_t xq_elems = act_quant ? (size_t)n * (size_t)K : 0;
    float *rows = kaon_cpu_scratch(be, sizeof(float) * ((size_t)K * (size_t)nt + xq_elems));
    if (!rows) return -1;
    if (act_quant) {
        float *xq = rows + (size_t)K * (size_t)nt;
        quantize_act(x, n, K, b1, xq);
        x = xq;
    }
    fp8_job j = {.wq = w->data, .s = sc->data, .bias = bias ? bias->data : NULL, .x = x, .y = y, .rows = rows,
                 .M = M, .K = K, .b0 = b0, .b1 = b1, .scols = scols, .n = n};
    const int tasks = kaon_cpu_tasks((int)M, nt, 1, &j.per);
    kaon_pool_run(be->pool, tasks, nt, fp8_rows, &j);
    return 0;
}
