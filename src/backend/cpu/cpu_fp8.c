// y = x @ w^T (+ bias) for FP8 e4m3 (and INT8) weights with f32 scales in blocks (DeepSeek's layout:
// w[i, j] = e4m3(wq[i, j]) * scale[i / b0, j / b1]; per-channel scales are blocks of [1, K],
// a per-tensor scale one block of [M, K]). Exactness first: each weight row is dequantized to
// f32 (the same product a reference forms) and dotted in f32 with the activations.
// Activations (FORMATS-2.md §4-5; l->act_quant) are quantized to e4m3 and back first, as the
// format's reference does, then the f32 dot equals the reference's scaled integer-grid sum:
//   GROUP   DeepSeek: per token, per group of b1 columns, s = max(amax, 1e-4) / 448, x / s
//   TOKEN   vLLM dynamic_per_token_scaled_fp8_quant: s = max(amax / 448, 1 / (448 * 512)), x / s
//   TENSOR  vLLM dynamic_scaled_fp8_quant: one s over the whole input, same formula
//   STATIC  vLLM static_scaled_fp8_quant: x * (1 / input_scale), saturated at +-448
// KAON_FP8_ACT=0 turns all of it off (weight-only), =1 turns GROUP on: block weights stay
// weight-only by default (exact against a dequantized float model); the W8A8 formats
// (channel / tensor with input activations) quantize by default. Fast kernels are still to come.
// INT8 weights (compressed-tensors int-quantized: w = int8 * scale per row or tensor) take the
// same path with int8 activations as vLLM's scaled_int8_quant forms them:
//   TOKEN / TENSOR  q = rn(x * (127 / amax)) clamped to [-128, 127], x ~ q * (amax / 127)
//   STATIC          q = rn(x / input_scale), clamped, x ~ q * input_scale
// (rn: to nearest, ties to even); the f32 dot of the two grids equals the int32 GEMM's sum
// times the scales within f32 rounding.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/fp8.h"

static float e4m3_lut[256], int8_lut[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static int act_env = -1;  // KAON_FP8_ACT: -1 unset, 0, 1

static void e4m3_build(void) {
    for (int b = 0; b < 256; b++) {
        e4m3_lut[b] = kaon_e4m3_to_f32((uint8_t)b);
        int8_lut[b] = (float)(int8_t)b;
    }
    const char *e = getenv("KAON_FP8_ACT");
    act_env = !e || !e[0] ? -1 : !strcmp(e, "1");
}

// The activation quantization this call applies (the header's rules).
static int act_mode(const kaon_linear *l) {
    if (act_env == 0) return KAON_ACTQ_NONE;
    if (l->act_quant == KAON_ACTQ_GROUP && act_env != 1) return KAON_ACTQ_NONE;
    return l->act_quant;
}

static float e4m3_round(float v) { return e4m3_lut[kaon_f32_to_e4m3(v)]; }

static float int8_round(float v) { return fminf(fmaxf(nearbyintf(v), -128.0f), 127.0f); }

// The amax a dynamic scale of row r comes from: the row's (TOKEN) or the whole input's (TENSOR,
// amax_all from tensor_amax).
static float tensor_amax(const float *x, size_t N, int mode) {
    float a = 0.0f;
    if (mode == KAON_ACTQ_TENSOR)
        for (size_t i = 0; i < N; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

static float row_amax(const float *xr, int64_t K, int mode, float amax_all) {
    float a = amax_all;
    if (mode == KAON_ACTQ_TOKEN)
        for (int64_t k = 0; k < K; k++) a = fmaxf(a, fabsf(xr[k]));
    return a;
}

// INT8 activations (the header's rules) of x [n, K] into xq.
static void quantize_int8(const float *x, int n, int64_t K, int mode, float input_scale, float *xq) {
    const size_t N = (size_t)n * (size_t)K;
    if (mode == KAON_ACTQ_STATIC) {
        for (size_t i = 0; i < N; i++) xq[i] = int8_round(x[i] / input_scale) * input_scale;
        return;
    }
    const float amax_all = tensor_amax(x, N, mode);
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        float *qr = xq + (size_t)r * (size_t)K;
        const float amax = row_amax(xr, K, mode, amax_all);
        if (!(amax > 0.0f)) {  // all zeros
            memset(qr, 0, sizeof(float) * (size_t)K);
            continue;
        }
        const float inv = 127.0f / amax, s = amax / 127.0f;
        for (int64_t k = 0; k < K; k++) qr[k] = int8_round(xr[k] * inv) * s;
    }
}

// Per-token, per-tensor and static quantization of x [n, K] into xq.
static void quantize_scaled(const float *x, int n, int64_t K, int mode, float input_scale, float *xq) {
    const size_t N = (size_t)n * (size_t)K;
    const float min_s = 1.0f / (448.0f * 512.0f);
    if (mode == KAON_ACTQ_STATIC) {
        const float inv = 1.0f / input_scale;
        for (size_t i = 0; i < N; i++) xq[i] = e4m3_round(x[i] * inv) * input_scale;
        return;
    }
    const float amax_all = tensor_amax(x, N, mode);
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * (size_t)K;
        float *qr = xq + (size_t)r * (size_t)K;
        const float amax = row_amax(xr, K, mode, amax_all);
        const float s = fmaxf(amax / 448.0f, min_s);
        for (int64_t k = 0; k < K; k++) qr[k] = e4m3_round(xr[k] / s) * s;
    }
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

typedef struct fp8_w {
    const uint8_t *wq;
    const float *s, *lut;  // lut: the value of each code (e4m3 or int8)
    int64_t K, b0, b1, scols;
} fp8_w;

// Row m: each code's value times its block's scale.
static void fp8_row(const void *c, int64_t m, float *row) {
    const fp8_w *j = c;
    const uint8_t *q = j->wq + (size_t)m * (size_t)j->K;
    const float *srow = j->s + (size_t)(m / j->b0) * (size_t)j->scols;
    for (int64_t k = 0; k < j->K; k++) row[k] = j->lut[q[k]] * srow[k / j->b1];
}

int kaon_cpu_linear_fp8(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y) {
    const kaon_tensor *w = &l->w, *sc = &l->scale, *bias = kaon_linear_bias(l);
    const bool int8 = kaon_linear_is_int8(l);
    if (!x || !y || !w->data || w->ndim != 2 || (!kaon_linear_is_fp8_block(l) && !int8))
        return kaon_cpu_fail(be, "cpu linear: bad FP8 / INT8 weight");
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
    const int mode = act_mode(l);
    if (mode == KAON_ACTQ_STATIC && !(l->act_scale > 0.0f))
        return kaon_cpu_fail(be, "cpu linear: FP8 static activations without an input_scale");
    const size_t xq_elems = mode != KAON_ACTQ_NONE ? (size_t)n * (size_t)K : 0;
    float *rows = kaon_cpu_scratch(be, sizeof(float) * ((size_t)K * (size_t)nt + xq_elems));
    if (!rows) return -1;
    if (mode != KAON_ACTQ_NONE) {
        float *xq = rows + (size_t)K * (size_t)nt;
        if (int8 && mode == KAON_ACTQ_GROUP) return kaon_cpu_fail(be, "cpu linear: INT8 with activation groups");
        if (int8) quantize_int8(x, n, K, mode, l->act_scale, xq);
        else if (mode == KAON_ACTQ_GROUP) quantize_act(x, n, K, b1, xq);
        else quantize_scaled(x, n, K, mode, l->act_scale, xq);
        x = xq;
    }
    const fp8_w j = {.wq = w->data, .s = sc->data, .lut = int8 ? int8_lut : e4m3_lut, .K = K, .b0 = b0, .b1 = b1,
                     .scols = scols};
    kaon_cpu_rows_linear(be, x, n, M, K, bias ? bias->data : NULL, y, rows, nt, fp8_row, &j);
    return 0;
}
