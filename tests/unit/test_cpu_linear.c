// The CPU backend's linear op for every weight format.
//
//   test_cpu_linear               self-checks (ctest): every kernel set this CPU has (scalar,
//                                 AVX2, AVX-512 VNNI) against a double-precision reference,
//                                 within the bound 8-bit activation quantization allows, and
//                                 the SIMD kernels against the scalar ones
//   test_cpu_linear --ref IN OUT  for tests/ref/test_cpu_quant.py: runs linear and embed on
//                                 the weights of a GGUF file written by the gguf package
//   test_cpu_linear --bench       times linear at SmolLM2-135M's shapes (1 and 2 threads), then
//                                 a model-shaped pp512 / tg128 built from the backend's ops
//   test_cpu_linear --bench model [THREADS [PROMPT [GEN [REPS]]]]
//                                 only the model-shaped run (KAON_BENCH_PROFILE=1: time per op)
//   test_cpu_linear --bench quant [THREADS]
//                                 one 2816x1024 layer in each common format at n = 1, 8, 32,
//                                 128 activation rows: CPU us per call, GB/s of weights, GOP/s
//   test_cpu_linear --bench decode [THREADS [SEQS [CTX [REPS]]]]
//                                 one batched decode step: SEQS sequences at context CTX, the
//                                 LM head on every row, as the engine runs it (default 64 x 100)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "io/gguf.h"
#include "test.h"
#include "util/err.h"
#include "util/half.h"
#include "util/timer.h"

// ---- random data ---------------------------------------------------------------------

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rnd_u(void) { return (double)(rnd64() >> 11) / 9007199254740992.0; }
static double rnd_n(void) {
    double u = rnd_u() + 1e-12, v = rnd_u();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static void rnd_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd64();
}

// A random [M, K] weight in format t: random payload bytes with plausible f16 scales.
static void *make_weight(kaon_dtype t, int M, int K) {
    const size_t rb = kaon_dtype_row_bytes(t, K);
    uint8_t *w = malloc(rb * M);
    for (int m = 0; m < M; m++) {
        uint8_t *r = w + rb * m;
        switch (t) {
        case KAON_F32:
            for (int k = 0; k < K; k++) ((float *)r)[k] = (float)(0.1 * rnd_n());
            break;
        case KAON_F16:
            for (int k = 0; k < K; k++) ((uint16_t *)r)[k] = kaon_f32_to_f16((float)(0.1 * rnd_n()));
            break;
        case KAON_BF16:
            for (int k = 0; k < K; k++) ((uint16_t *)r)[k] = kaon_f32_to_bf16((float)(0.1 * rnd_n()));
            break;
        case KAON_Q4_0:
            for (kaon_block_q4_0 *b = (void *)r; (uint8_t *)b < r + rb; b++) {
                b->d = kaon_f32_to_f16((float)(0.002 + 0.02 * rnd_u()));
                rnd_bytes(b->qs, 16);
            }
            break;
        case KAON_Q4_1:
            for (kaon_block_q4_1 *b = (void *)r; (uint8_t *)b < r + rb; b++) {
                b->d = kaon_f32_to_f16((float)(0.002 + 0.02 * rnd_u()));
                b->m = kaon_f32_to_f16((float)(-0.15 + 0.05 * rnd_n()));
                rnd_bytes(b->qs, 16);
            }
            break;
        case KAON_Q8_0:
            for (kaon_block_q8_0 *b = (void *)r; (uint8_t *)b < r + rb; b++) {
                b->d = kaon_f32_to_f16((float)(0.0005 + 0.002 * rnd_u()));
                rnd_bytes((uint8_t *)b->qs, 32);  // the full int8 range, -128 included
            }
            break;
        case KAON_Q4_K:
            for (kaon_block_q4_k *b = (void *)r; (uint8_t *)b < r + rb; b++) {
                b->d = kaon_f32_to_f16((float)(0.0005 + 0.002 * rnd_u()));
                b->dmin = kaon_f32_to_f16((float)(0.0005 + 0.002 * rnd_u()));
                rnd_bytes(b->scales, 12);
                rnd_bytes(b->qs, 128);
            }
            break;
        case KAON_Q6_K:
            for (kaon_block_q6_k *b = (void *)r; (uint8_t *)b < r + rb; b++) {
                rnd_bytes(b->ql, 128);
                rnd_bytes(b->qh, 64);
                rnd_bytes((uint8_t *)b->scales, 16);
                b->d = kaon_f32_to_f16((float)(0.00005 + 0.0002 * rnd_u()));
            }
            break;
        default:  // the other GGUF formats: random bytes, then sane scales
            rnd_bytes(r, rb);
            for (uint8_t *p = r; p < r + rb; p += kaon_dtype_block_bytes(t)) {
                const uint16_t d = kaon_f32_to_f16((float)(0.002 + 0.02 * rnd_u()));
                const uint16_t m = kaon_f32_to_f16((float)(-0.15 + 0.05 * rnd_n()));
                const uint16_t dk = kaon_f32_to_f16((float)(0.0005 + 0.002 * rnd_u()));
                switch (t) {
                case KAON_Q5_0: ((kaon_block_q5_0 *)p)->d = d; break;
                case KAON_Q5_1: ((kaon_block_q5_1 *)p)->d = d; ((kaon_block_q5_1 *)p)->m = m; break;
                case KAON_IQ4_NL: ((kaon_block_iq4_nl *)p)->d = kaon_f32_to_f16((float)(0.0002 + 0.002 * rnd_u())); break;
                case KAON_Q2_K: ((kaon_block_q2_k *)p)->d = dk; ((kaon_block_q2_k *)p)->dmin = dk; break;
                case KAON_Q3_K: ((kaon_block_q3_k *)p)->d = dk; break;
                case KAON_Q5_K: ((kaon_block_q5_k *)p)->d = dk; ((kaon_block_q5_k *)p)->dmin = dk; break;
                case KAON_IQ4_XS: ((kaon_block_iq4_xs *)p)->d = kaon_f32_to_f16((float)(0.00002 + 0.0002 * rnd_u())); break;
                default: break;
                }
            }
            break;
        }
    }
    return w;
}

// Activations: mostly N(0, 1), with a few large values so block scales vary.
static float *make_x(int n, int K) {
    float *x = malloc(sizeof(float) * (size_t)n * K);
    for (size_t i = 0; i < (size_t)n * K; i++) {
        double v = rnd_n();
        if (rnd_u() < 0.02) v *= 12.0;
        x[i] = (float)v;
    }
    return x;
}

static kaon_tensor tensor2(kaon_dtype t, int M, int K, void *data) {
    kaon_tensor w = {.dtype = t, .ndim = 2, .shape = {M, K}, .data = data,
                     .nbytes = kaon_dtype_row_bytes(t, K) * (size_t)M};
    return w;
}

static int is_quant(kaon_dtype t) { return kaon_dtype_block_elems(t) > 1; }

// ---- self-checks ---------------------------------------------------------------------

typedef struct {
    kaon_backend *be;
    const char *name;
} kset;

static int n_sets;
static kset sets[3];

static void make_sets(int n_threads) {
    // Every kernel set this CPU has, chosen through the environment as users would.
    const char *envs[3][2] = {{"KAON_CPU_NO_SIMD", "1"}, {"KAON_CPU_NO_AVX512", "1"}, {NULL, NULL}};
    n_sets = 0;
    for (int i = 0; i < 3; i++) {
        unsetenv("KAON_CPU_NO_SIMD");
        unsetenv("KAON_CPU_NO_AVX512");
        if (envs[i][0]) setenv(envs[i][0], envs[i][1], 1);
        kaon_backend *be = kaon_backend_cpu_create(n_threads);
        CHECK(be != NULL);
        if (!be) continue;
        const char *nm = kaon_cpu_kernel_name(be);
        int dup = 0;
        for (int j = 0; j < n_sets; j++) dup |= strcmp(sets[j].name, nm) == 0;
        if (dup) {
            be->ops->destroy(be);
            continue;
        }
        sets[n_sets++] = (kset){be, nm};
    }
    unsetenv("KAON_CPU_NO_SIMD");
    unsetenv("KAON_CPU_NO_AVX512");
}

static void free_sets(void) {
    for (int i = 0; i < n_sets; i++) sets[i].be->ops->destroy(sets[i].be);
    n_sets = 0;
}

// Checks y [n, M] of every kernel set against the double-precision product with the
// dequantized weight. The bound: quantizing x to 8 bits moves each element by at most half
// a step, amax(block) / 254, so |y - y_ref| <= sum over blocks of amax/254 * sum |w| in the
// block; plus float rounding, 1e-5 * sum |w x|.
static void check_linear(kaon_dtype t, int M, int K, int n, int with_bias) {
    void *wd = make_weight(t, M, K);
    kaon_tensor w = tensor2(t, M, K, wd);
    float *x = make_x(n, K);
    float *bias = NULL;
    kaon_tensor bt = {0};
    if (with_bias) {
        bias = malloc(sizeof(float) * M);
        for (int m = 0; m < M; m++) bias[m] = (float)rnd_n();
        bt = (kaon_tensor){.dtype = KAON_F32, .ndim = 1, .shape = {M}, .data = bias, .nbytes = 4u * M};
    }
    float *wf = malloc(sizeof(float) * (size_t)M * K);
    for (int m = 0; m < M; m++) CHECK(kaon_cpu_dequantize_row(t, wd, m, K, wf + (size_t)m * K) == 0);
    double *ref = malloc(sizeof(double) * (size_t)n * M), *bound = malloc(sizeof(double) * (size_t)n * M);
    // For quantized weights the activations are quantized as documented (per block of 32:
    // d = max|x| / 127, q = round-half-even(x / d)); the product with those exact values,
    // in double, must match the backend up to float rounding.
    double *refq = malloc(sizeof(double) * (size_t)n * M);
    float *xq = malloc(sizeof(float) * (size_t)n * K);
    for (int r = 0; r < n && is_quant(t); r++)
        for (int b = 0; b < K / 32; b++) {
            const float *xb = x + (size_t)r * K + 32 * b;
            float amax = 0.0f;
            for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(xb[e]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            for (int e = 0; e < 32; e++) xq[(size_t)r * K + 32 * b + e] = d * nearbyintf(xb[e] * id);
        }
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * K;
        for (int m = 0; m < M; m++) {
            const float *wr = wf + (size_t)m * K;
            double acc = with_bias ? bias[m] : 0.0, mag = 0.0, qerr = 0.0;
            for (int b = 0; b < K / 32; b++) {
                double amax = 0.0, wabs = 0.0;
                for (int e = 32 * b; e < 32 * b + 32; e++) {
                    acc += (double)wr[e] * xr[e];
                    mag += fabs((double)wr[e] * xr[e]);
                    amax = fmax(amax, fabs(xr[e]));
                    wabs += fabs(wr[e]);
                }
                qerr += amax / 254.0 * wabs;
            }
            for (int e = (K / 32) * 32; e < K; e++) {
                acc += (double)wr[e] * xr[e];
                mag += fabs((double)wr[e] * xr[e]);
            }
            ref[(size_t)r * M + m] = acc;
            double accq = with_bias ? bias[m] : 0.0;
            for (int e = 0; e < K && is_quant(t); e++) accq += (double)wr[e] * xq[(size_t)r * K + e];
            refq[(size_t)r * M + m] = accq;
            bound[(size_t)r * M + m] = (is_quant(t) ? qerr * 1.0001 : 0.0) + 1e-5 * mag + 1e-6;
        }
    }
    float *y0 = NULL;
    const kaon_linear lw = kaon_linear_of(&w, with_bias ? &bt : NULL);
    for (int s = 0; s < n_sets; s++) {
        float *y = malloc(sizeof(float) * (size_t)n * M);
        kaon_clear_error();
        sets[s].be->ops->linear(sets[s].be, x, n, &lw, y);
        int bad = 0;
        double worst = 0.0;
        for (size_t i = 0; i < (size_t)n * M; i++) {
            double e = fabs(y[i] - ref[i]);
            if (!(e <= bound[i])) bad++;
            worst = fmax(worst, e / bound[i]);
        }
        if (is_quant(t)) {  // against the exactly quantized activations: rounding only
            int badq = 0;
            for (size_t i = 0; i < (size_t)n * M; i++) {
                double tol = 2e-5 * (bound[i] + fabs(refq[i])) + 1e-5;
                if (!(fabs(y[i] - refq[i]) <= tol)) badq++;
            }
            if (badq)
                fprintf(stderr, "linear %s %s M=%d K=%d n=%d: %d outputs differ from the exact "
                        "quantized product\n", sets[s].name, kaon_dtype_name(t), M, K, n, badq);
            CHECK(badq == 0);
        }
        if (bad || getenv("KAON_TEST_VERBOSE"))
            fprintf(stderr, "linear %s %s M=%d K=%d n=%d: %d outputs past the bound (worst %.3fx)\n",
                    sets[s].name, kaon_dtype_name(t), M, K, n, bad, worst);
        CHECK(bad == 0);
        // The SIMD sets quantize x to the same bytes as the scalar set, so they may differ
        // from it only by float summation order.
        if (s == 0) {
            y0 = y;
        } else {
            int diff = 0;
            for (size_t i = 0; i < (size_t)n * M; i++) {
                double tol = 2e-5 * (bound[i] + fabs(ref[i])) + 1e-5;
                if (!(fabs(y[i] - y0[i]) <= tol)) diff++;
            }
            if (diff)
                fprintf(stderr, "linear %s vs %s %s M=%d K=%d n=%d: %d outputs differ\n",
                        sets[s].name, sets[0].name, kaon_dtype_name(t), M, K, n, diff);
            CHECK(diff == 0);
            free(y);
        }
    }
    free(y0);
    free(refq);
    free(xq);
    free(ref);
    free(bound);
    free(wf);
    free(bias);
    free(x);
    free(wd);
}

// The fused forms must give exactly what the separate ops give: the same quantized
// activations and the same kernels, only fewer passes over x and fewer thread wake-ups.
static void check_fused(kaon_backend *be, const char *set, kaon_dtype t, int n) {
    const int K = kaon_dtype_block_elems(t) == 256 ? 512 : 576, Mq = 576, Mk = 192, F = 1536;
    void *wq = make_weight(t, Mq, K), *wk = make_weight(t, Mk, K), *wv = make_weight(t, Mk, K);
    void *wg = make_weight(t, F, K), *wu = make_weight(t, F, K);
    kaon_tensor tq = tensor2(t, Mq, K, wq), tk = tensor2(t, Mk, K, wk), tv = tensor2(t, Mk, K, wv);
    kaon_tensor tg = tensor2(t, F, K, wg), tu = tensor2(t, F, K, wu);
    float *bk = malloc(sizeof(float) * Mk);
    for (int i = 0; i < Mk; i++) bk[i] = (float)rnd_n();
    kaon_tensor tb = {.dtype = KAON_F32, .ndim = 1, .shape = {Mk}, .data = bk, .nbytes = 4u * Mk};
    float *x = make_x(n, K);
    float *y1[3], *y2[3];
    const int Ms[3] = {Mq, Mk, Mk};
    for (int i = 0; i < 3; i++) {
        y1[i] = malloc(sizeof(float) * n * Ms[i]);
        y2[i] = malloc(sizeof(float) * n * Ms[i]);
    }
    const kaon_linear lq = kaon_linear_of(&tq, NULL), lk = kaon_linear_of(&tk, &tb);
    const kaon_linear lv = kaon_linear_of(&tv, NULL);
    const kaon_linear lg = kaon_linear_of(&tg, NULL), lu = kaon_linear_of(&tu, NULL);
    const kaon_linear *ws[3] = {&lq, &lk, &lv};
    be->ops->linear(be, x, n, &lq, y1[0]);
    be->ops->linear(be, x, n, &lk, y1[1]);
    be->ops->linear(be, x, n, &lv, y1[2]);
    CHECK(be->ops->linear_multi(be, x, n, 3, ws, (void *const *)y2) == 0);
    int same = 1;
    for (int i = 0; i < 3; i++) same &= memcmp(y1[i], y2[i], sizeof(float) * n * Ms[i]) == 0;
    if (!same) fprintf(stderr, "linear_multi %s %s n=%d differs\n", set, kaon_dtype_name(t), n);
    CHECK(same);
    float *g = malloc(sizeof(float) * n * F), *u = malloc(sizeof(float) * n * F);
    float *o1 = malloc(sizeof(float) * n * F), *o2 = malloc(sizeof(float) * n * F);
    be->ops->linear(be, x, n, &lg, g);
    be->ops->linear(be, x, n, &lu, u);
    be->ops->silu_and_mul(be, g, u, n, F, o1);
    CHECK(be->ops->linear_silu_mul(be, x, n, &lg, &lu, o2) == 0);
    same = memcmp(o1, o2, sizeof(float) * n * F) == 0;
    if (!same) fprintf(stderr, "linear_silu_mul %s %s n=%d differs\n", set, kaon_dtype_name(t), n);
    CHECK(same);
    // Weights that cannot share one pass are declined (the caller runs the plain ops), as are
    // gate and up with a bias (the fused kernel adds none); gate and up of different heights
    // are an error.
    kaon_tensor other = tensor2(t == KAON_Q8_0 ? KAON_Q4_1 : KAON_Q8_0, Mk, K, NULL);
    other.data = make_weight(other.dtype, Mk, K);
    const kaon_linear lo = kaon_linear_of(&other, NULL);
    const kaon_linear *mixed[2] = {&lq, &lo};
    CHECK(be->ops->linear_multi(be, x, n, 2, mixed, (void *const *)y2) == 1);
    CHECK(be->ops->linear_silu_mul(be, x, n, &lg, &lk, o2) == 1);
    CHECK(be->ops->linear_silu_mul(be, x, n, &lg, &lq, o2) == -1);
    CHECK(be->ops->status(be) == -1 && strstr(kaon_last_error(), "heights differ") != NULL);
    CHECK(be->ops->status(be) == 0);
    free(other.data);
    for (int i = 0; i < 3; i++) {
        free(y1[i]);
        free(y2[i]);
    }
    free(g); free(u); free(o1); free(o2); free(x); free(bk);
    free(wq); free(wk); free(wv); free(wg); free(wu);
}

// Batch invariance: a row's output is bitwise the same whatever other rows share the call
// (one row, a few rows, or enough rows for the batched path), through linear, linear_multi
// (with a bias) and linear_silu_mul. The engine relies on it: a sequence's greedy output does
// not depend on what it is batched with, and a preempted sequence recomputes its KV exactly.
static void check_batch_invariance(kaon_backend *be, const char *set, kaon_dtype t, int K) {
    const int M = 27, M2 = 40, n = 21;  // partial tiles of 8 weight rows; many activation rows
    void *wd = make_weight(t, M, K), *wd2 = make_weight(t, M2, K), *wd3 = make_weight(t, M2, K);
    kaon_tensor w = tensor2(t, M, K, wd), w2 = tensor2(t, M2, K, wd2), w3 = tensor2(t, M2, K, wd3);
    float *bias = malloc(sizeof(float) * M2);
    for (int m = 0; m < M2; m++) bias[m] = (float)rnd_n();
    kaon_tensor bt = {.dtype = KAON_F32, .ndim = 1, .shape = {M2}, .data = bias, .nbytes = 4u * M2};
    const kaon_linear lw = kaon_linear_of(&w, NULL), lw2 = kaon_linear_of(&w2, NULL);
    const kaon_linear lw2b = kaon_linear_of(&w2, &bt), lw3 = kaon_linear_of(&w3, NULL);
    float *x = make_x(n, K);
    float *ya = malloc(sizeof(float) * n * M2 * 3), *yb = malloc(sizeof(float) * n * M2 * 3);
    int bad = 0;
    for (int op = 0; op < 3; op++) {
        const int Mo = op == 0 ? M : op == 1 ? M + M2 : M2;
        // All n rows at once, then rows alone and in small groups.
        for (int pass = 0; pass < 2; pass++) {
            float *y = pass ? yb : ya;
            for (int r0 = 0; r0 < n;) {
                const int cnt = pass == 0 ? n : 1 + r0 % 3;
                const int c = r0 + cnt > n ? n - r0 : cnt;
                const float *xr = x + (size_t)r0 * K;
                if (op == 0) {
                    be->ops->linear(be, xr, c, &lw, y + (size_t)r0 * M);
                } else if (op == 1) {
                    const kaon_linear *ws[2] = {&lw, &lw2b};
                    float *tmp = malloc(sizeof(float) * c * (M + M2));
                    void *ys[2] = {tmp, tmp + (size_t)c * M};
                    CHECK(be->ops->linear_multi(be, xr, c, 2, ws, ys) == 0);
                    for (int r = 0; r < c; r++) {
                        memcpy(y + (size_t)(r0 + r) * Mo, tmp + (size_t)r * M, sizeof(float) * M);
                        memcpy(y + (size_t)(r0 + r) * Mo + M, tmp + (size_t)c * M + (size_t)r * M2,
                               sizeof(float) * M2);
                    }
                    free(tmp);
                } else {
                    CHECK(be->ops->linear_silu_mul(be, xr, c, &lw2, &lw3, y + (size_t)r0 * M2) == 0);
                }
                r0 += c;
            }
        }
        if (memcmp(ya, yb, sizeof(float) * n * Mo) != 0) bad++;
    }
    if (bad)
        fprintf(stderr, "batch invariance %s %s K=%d: %d of 3 ops differ\n", set, kaon_dtype_name(t), K, bad);
    CHECK(bad == 0);
    free(ya); free(yb); free(x); free(bias); free(wd); free(wd2); free(wd3);
}

// kaon_cpu_linear_grouped (the MoE op's experts at decode): segments of 1..4 rows as one run
// give each segment's kaon_cpu_linear / linear_silu_mul numbers bit for bit; mixed formats
// are declined.
static void check_grouped(kaon_backend *be, const char *set, kaon_dtype t, int K) {
    enum { NS = 5 };
    const int ns[NS] = {1, 3, 4, 2, 1}, M = 40;
    void *wg[NS], *wu[NS];
    kaon_tensor tg[NS], tu[NS];
    kaon_linear lg[NS], lu[NS];
    float *x[NS], *ya[NS], *yb[NS];
    kaon_cpu_seg seg[NS];
    int bad = 0;
    for (int silu = 0; silu < 2; silu++) {
        for (int s = 0; s < NS; s++) {
            wg[s] = make_weight(t, M, K);
            wu[s] = make_weight(t, M, K);
            tg[s] = tensor2(t, M, K, wg[s]);
            tu[s] = tensor2(t, M, K, wu[s]);
            lg[s] = kaon_linear_of(&tg[s], NULL);
            lu[s] = kaon_linear_of(&tu[s], NULL);
            x[s] = make_x(ns[s], K);
            ya[s] = malloc(sizeof(float) * (size_t)ns[s] * M);
            yb[s] = malloc(sizeof(float) * (size_t)ns[s] * M);
            seg[s] = (kaon_cpu_seg){.w = &lg[s], .w2 = silu ? &lu[s] : NULL, .x = x[s], .n = ns[s], .y = ya[s]};
            if (silu)
                CHECK(be->ops->linear_silu_mul(be, x[s], ns[s], &lg[s], &lu[s], yb[s]) == 0);
            else
                be->ops->linear(be, x[s], ns[s], &lg[s], yb[s]);
        }
        CHECK(kaon_cpu_linear_grouped((kaon_cpu_backend *)be, NS, seg) == 0);
        for (int s = 0; s < NS; s++) bad += memcmp(ya[s], yb[s], sizeof(float) * (size_t)ns[s] * M) != 0;
        if (!silu) {  // a segment of another format: declined
            void *wq = make_weight(KAON_Q8_0, M, K);
            kaon_tensor tq = tensor2(KAON_Q8_0, M, K, wq);
            const kaon_linear lq = kaon_linear_of(&tq, NULL);
            seg[2].w = t == KAON_Q8_0 ? seg[2].w : &lq;
            if (t != KAON_Q8_0) CHECK(kaon_cpu_linear_grouped((kaon_cpu_backend *)be, NS, seg) == 1);
            free(wq);
        }
        for (int s = 0; s < NS; s++) {
            free(wg[s]); free(wu[s]); free(x[s]); free(ya[s]); free(yb[s]);
        }
    }
    if (bad) fprintf(stderr, "grouped %s %s K=%d: %d segments differ\n", set, kaon_dtype_name(t), K, bad);
    CHECK(bad == 0);
}

static void self_checks(void) {
    const kaon_dtype types[] = {KAON_F32,  KAON_F16,  KAON_BF16,   KAON_Q4_0, KAON_Q4_1,
                                KAON_Q5_0, KAON_Q5_1, KAON_Q8_0,   KAON_IQ4_NL, KAON_Q2_K,
                                KAON_Q3_K, KAON_Q4_K, KAON_Q5_K,   KAON_Q6_K, KAON_IQ4_XS};
    const int ns[] = {1, 2, 3, 4, 5, 8, 13};
    make_sets(1);
    fprintf(stderr, "kernel sets:");
    for (int s = 0; s < n_sets; s++) fprintf(stderr, " %s", sets[s].name);
    fprintf(stderr, "\n");
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        kaon_dtype t = types[ti];
        const int kq = kaon_dtype_block_elems(t) == 256;
        // K values: whole groups of 8 blocks, a tail of 2 blocks, an odd block count, one block.
        const int ks32[] = {32, 96, 256, 320, 576};
        const int ksk[] = {256, 512, 1536};
        const int ksf[] = {7, 40, 576};
        const int *ks = kq ? ksk : (is_quant(t) ? ks32 : ksf);
        const int nk = kq ? 3 : (is_quant(t) ? 5 : 3);
        for (int ki = 0; ki < nk; ki++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
                check_linear(t, 19, ks[ki], ns[ni], ni == 2);
    }
    free_sets();

    const kaon_dtype ft[] = {KAON_Q4_1, KAON_Q5_0, KAON_Q8_0, KAON_IQ4_NL, KAON_Q2_K,
                             KAON_Q3_K, KAON_Q5_K, KAON_Q6_K, KAON_IQ4_XS, KAON_F16};
    for (int th = 1; th <= 2; th++) {
        make_sets(th);
        for (int si = 0; si < n_sets; si++)
            for (size_t ti = 0; ti < sizeof ft / sizeof *ft; ti++) {
                check_fused(sets[si].be, sets[si].name, ft[ti], 1);
                check_fused(sets[si].be, sets[si].name, ft[ti], 11);
            }
        free_sets();
    }

    for (int th = 1; th <= 2; th++) {
        make_sets(th);
        const kaon_dtype bt[] = {KAON_Q4_0, KAON_Q4_1, KAON_Q5_0, KAON_Q5_1, KAON_Q8_0, KAON_IQ4_NL,
                                 KAON_Q2_K, KAON_Q3_K, KAON_Q4_K, KAON_Q5_K, KAON_Q6_K, KAON_IQ4_XS,
                                 KAON_F16};
        for (int si = 0; si < n_sets; si++)
            for (size_t ti = 0; ti < sizeof bt / sizeof *bt; ti++) {
                const int ks32[] = {32, 96, 256, 320, 576, 1536}, ksk[] = {256, 1536};
                const int kq = kaon_dtype_block_elems(bt[ti]) == 256;
                for (int ki = 0; ki < (kq ? 2 : 6); ki++)
                    check_batch_invariance(sets[si].be, sets[si].name, bt[ti], kq ? ksk[ki] : ks32[ki]);
            }
        free_sets();
    }

    for (int th = 1; th <= 2; th++) {
        make_sets(th);
        const kaon_dtype gt[] = {KAON_Q4_0, KAON_Q8_0, KAON_Q4_K, KAON_Q5_K, KAON_Q6_K, KAON_Q2_K, KAON_Q3_K,
                                 KAON_F16};
        for (int si = 0; si < n_sets; si++)
            for (size_t ti = 0; ti < sizeof gt / sizeof *gt; ti++)
                check_grouped(sets[si].be, sets[si].name, gt[ti], kaon_dtype_block_elems(gt[ti]) == 256 ? 512 : 320);
        free_sets();
    }

    // Two threads: each output row is computed by the same kernel, so the result must be
    // bitwise the same as with one thread.
    kaon_backend *b1 = kaon_backend_cpu_create(1), *b2 = kaon_backend_cpu_create(2);
    const kaon_dtype tt[] = {KAON_Q4_1, KAON_Q5_1, KAON_Q8_0, KAON_Q3_K, KAON_Q6_K, KAON_F16};
    for (size_t ti = 0; ti < sizeof tt / sizeof *tt; ti++) {
        const int M = 1000, K = 512, n = 6;
        void *wd = make_weight(tt[ti], M, K);
        kaon_tensor w = tensor2(tt[ti], M, K, wd);
        const kaon_linear lw = kaon_linear_of(&w, NULL);
        float *x = make_x(n, K);
        float *y1 = malloc(sizeof(float) * n * M), *y2 = malloc(sizeof(float) * n * M);
        b1->ops->linear(b1, x, n, &lw, y1);
        b2->ops->linear(b2, x, n, &lw, y2);
        CHECK(memcmp(y1, y2, sizeof(float) * n * M) == 0);
        b2->ops->linear(b2, x, 1, &lw, y2);
        CHECK(memcmp(y1, y2, sizeof(float) * M) == 0);
        free(y1);
        free(y2);
        free(x);
        free(wd);
    }

    // Bad inputs set an error (kept for the status op) and do not crash.
    float x[64] = {0}, y[64];
    uint8_t raw[64] = {0};
    kaon_tensor bad = {.dtype = KAON_FP8_E4M3, .ndim = 2, .shape = {1, 32}, .data = raw, .nbytes = 64};
    const kaon_linear lbad = kaon_linear_of(&bad, NULL);
    kaon_clear_error();
    b1->ops->linear(b1, x, 1, &lbad, y);
    CHECK(strstr(kaon_last_error(), "not supported") != NULL);
    kaon_tensor odd = {.dtype = KAON_Q4_0, .ndim = 2, .shape = {1, 33}, .data = raw, .nbytes = 64};
    const kaon_linear lodd = kaon_linear_of(&odd, NULL);
    kaon_clear_error();
    b1->ops->linear(b1, x, 1, &lodd, y);
    CHECK(strstr(kaon_last_error(), "whole blocks") != NULL);
    kaon_tensor small = {.dtype = KAON_Q8_0, .ndim = 2, .shape = {2, 32}, .data = raw, .nbytes = 34};
    const kaon_linear lsmall = kaon_linear_of(&small, NULL);
    kaon_clear_error();
    b1->ops->linear(b1, x, 1, &lsmall, y);
    CHECK(strstr(kaon_last_error(), "needs") != NULL);
    // The status op gives the first of them, once.
    kaon_clear_error();
    CHECK(b1->ops->status(b1) == -1 && strstr(kaon_last_error(), "FP8") != NULL);
    CHECK(b1->ops->status(b1) == 0);

    // A layer with what the kernels cannot read (format companions, parts that do not add up
    // to its rows) is an error through every linear op, never a result without them.
    {
        const int M = 16, K = 64;
        void *wd = make_weight(KAON_Q8_0, M, K);
        kaon_tensor w = tensor2(KAON_Q8_0, M, K, wd);
        float sc[16] = {0}, xx[64] = {0}, yy[2 * 16];
        kaon_tensor st = {.dtype = KAON_F32, .ndim = 1, .shape = {M}, .data = sc, .nbytes = sizeof sc};
        kaon_linear l = kaon_linear_of(&w, NULL);
        l.n_parts = 2;  // fused parts that add up: computed as one weight
        l.part_rows[0] = 12;
        l.part_rows[1] = 4;
        b1->ops->linear(b1, xx, 1, &l, yy);
        CHECK(b1->ops->status(b1) == 0);
        const char *want[3] = {"with scale companions is not supported", "with zero points is not supported",
                               "with parts that do not add up to its rows is not supported"};
        for (int c = 0; c < 3; c++) {
            kaon_linear lc = l;
            if (c == 0) lc.scale = st;
            if (c == 1) lc.zero = st;
            if (c == 2) lc.part_rows[1] = 5;
            const kaon_linear *pair[2] = {&lc, &lc};
            void *ys[2] = {yy, yy + M};
            kaon_clear_error();
            b1->ops->linear(b1, xx, 1, &lc, yy);
            CHECK(strstr(kaon_last_error(), want[c]) != NULL && strstr(kaon_last_error(), "Q8_0") != NULL);
            CHECK(b1->ops->status(b1) == -1 && strstr(kaon_last_error(), want[c]) != NULL);
            CHECK(b1->ops->linear_multi(b1, xx, 1, 2, pair, ys) == -1);
            CHECK(b1->ops->linear_silu_mul(b1, xx, 1, &lc, &lc, yy) == -1);
            CHECK(b1->ops->status(b1) == -1 && strstr(kaon_last_error(), want[c]) != NULL);
        }
        free(wd);
    }
    b1->ops->destroy(b1);
    b2->ops->destroy(b2);
}

// ---- --ref mode ----------------------------------------------------------------------

static int write_record(FILE *f, const char *tag, const char *name, size_t name_len, int rows,
                        int cols, const float *data) {
    uint32_t nl = (uint32_t)name_len;
    int32_t rc[2] = {rows, cols};
    if (fwrite(tag, 1, 4, f) != 4 || fwrite(&nl, 4, 1, f) != 1 || fwrite(name, 1, nl, f) != nl ||
        fwrite(rc, 4, 2, f) != 2 ||
        fwrite(data, sizeof(float), (size_t)rows * cols, f) != (size_t)rows * cols)
        return -1;
    return 0;
}

// For every tensor "w.NAME" [M, K] with an F32 "x.NAME" [N, K]: records "LIN " (linear of the
// first n rows of x, n in 1, 3, 8, 33) and one "EMB " (embed of every row of w).
static int ref_mode(const char *in, const char *outp) {
    kaon_gguf *g = kaon_gguf_open(in);
    if (!g) {
        fprintf(stderr, "cannot open %s: %s\n", in, kaon_last_error());
        return 1;
    }
    FILE *f = fopen(outp, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", outp);
        kaon_gguf_close(g);
        return 1;
    }
    kaon_backend *be = kaon_backend_cpu_create(2);
    fprintf(stderr, "kernels: %s\n", kaon_cpu_kernel_name(be));
    int rc = 0;
    for (int64_t i = 0; i < kaon_gguf_tensor_count(g) && rc == 0; i++) {
        const kaon_gguf_tensor *wt = kaon_gguf_tensor_at(g, i);
        if (wt->name.len < 3 || memcmp(wt->name.ptr, "w.", 2) != 0) continue;
        char xname[256];
        snprintf(xname, sizeof xname, "x.%.*s", (int)(wt->name.len - 2), wt->name.ptr + 2);
        const kaon_gguf_tensor *xt = kaon_gguf_find_tensor(g, xname);
        kaon_dtype dt = kaon_dtype_from_ggml(wt->ggml_type);
        if (!xt || xt->ggml_type != 0 || wt->n_dims != 2 || xt->n_dims != 2 ||
            xt->dims[0] != wt->dims[0] || dt == KAON_DTYPE_INVALID) {
            fprintf(stderr, "bad pair for %.*s\n", (int)wt->name.len, wt->name.ptr);
            rc = 1;
            break;
        }
        const int K = (int)wt->dims[0], M = (int)wt->dims[1], N = (int)xt->dims[1];
        kaon_tensor w = {.dtype = dt, .ndim = 2, .shape = {M, K}, .data = (void *)wt->data,
                         .nbytes = wt->nbytes};
        const kaon_linear lw = kaon_linear_of(&w, NULL);
        const int ns[] = {1, 3, 8, 33};
        float *y = malloc(sizeof(float) * (size_t)(M > 33 ? M : 33) * (M > K ? M : K) + 64);
        for (int j = 0; j < 4 && rc == 0; j++) {
            if (ns[j] > N) continue;
            kaon_clear_error();
            be->ops->linear(be, xt->data, ns[j], &lw, y);
            if (strcmp(kaon_last_error(), "unknown error") != 0) {
                fprintf(stderr, "linear failed: %s\n", kaon_last_error());
                rc = 1;
            }
            if (write_record(f, "LIN ", wt->name.ptr, wt->name.len, ns[j], M, y)) rc = 1;
        }
        int32_t *ids = malloc(sizeof(int32_t) * M);
        for (int m = 0; m < M; m++) ids[m] = m;
        be->ops->embed(be, &w, ids, M, y);
        if (rc == 0 && write_record(f, "EMB ", wt->name.ptr, wt->name.len, M, K, y)) rc = 1;
        free(ids);
        free(y);
    }
    be->ops->destroy(be);
    if (fclose(f) != 0) rc = 1;
    kaon_gguf_close(g);
    return rc;
}

// ---- --bench mode --------------------------------------------------------------------

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Wall seconds per call; *cpu gets the process CPU seconds per call (all threads), which
// stays meaningful when other processes share the machine.
static double bench_linear(kaon_backend *be, const kaon_linear *w, int n, double min_time,
                           double *cpu) {
    const int K = (int)w->w.shape[1], M = (int)w->w.shape[0];
    float *x = make_x(n, K), *y = malloc(sizeof(float) * (size_t)n * M);
    be->ops->linear(be, x, n, w, y);  // warm up
    int iters = 0;
    double t0 = kaon_now(), c0 = cpu_seconds(), t;
    do {
        be->ops->linear(be, x, n, w, y);
        iters++;
        t = kaon_now() - t0;
    } while (t < min_time);
    *cpu = (cpu_seconds() - c0) / iters;
    free(x);
    free(y);
    return t / iters;
}

typedef struct {
    kaon_linear wq, wk, wv, wo, wg, wu, wd;
    kaon_tensor norm1, norm2;
} bench_layer;

// A layer of random weights [M, K] of format t.
static kaon_linear bench_weight(kaon_dtype t, int M, int K) {
    const kaon_tensor w = tensor2(t, M, K, make_weight(t, M, K));
    return kaon_linear_of(&w, NULL);
}

enum { BM_L = 30, BM_D = 576, BM_H = 9, BM_KVH = 3, BM_HD = 64, BM_F = 1536, BM_V = 49152,
       BM_BS = 16 };

typedef struct {
    kaon_backend *be;
    bench_layer ly[BM_L];
    kaon_tensor emb, norm;
    kaon_linear head;  // the tied embedding as the LM head
    float *normw, inv_freq[BM_HD / 2];
    kaon_rope rope;
    kaon_kv_layer kv[BM_L];
    int nblk, T;
    float *x, *xn, *q, *k, *v, *att, *proj, *g, *u, *logits;
    int32_t *tok, *pos, *seq, *slot, *btab;
    double prof[8];  // seconds per op kind when profiling
} bench_net;

static const char *prof_names[8] = {"embed+head", "rmsnorm", "linear", "rope", "kv_write",
                                    "attention", "silu_mul", ""};

// SmolLM2-135M's shape (30 layers, dim 576, 9 heads of 64, 3 KV heads, ffn 1536, vocab
// 49152; Q4_1 matrices, tied Q8_0 embedding) on random weights.
static void net_init(bench_net *N, int n_threads, int max_tokens, int ctx) {
    memset(N, 0, sizeof *N);
    N->be = kaon_backend_cpu_create(n_threads);
    const kaon_backend_ops *o = N->be->ops;
    N->normw = malloc(sizeof(float) * BM_D);
    for (int i = 0; i < BM_D; i++) N->normw[i] = 1.0f + 0.1f * (float)rnd_n();
    N->norm = (kaon_tensor){.dtype = KAON_F32, .ndim = 1, .shape = {BM_D}, .data = N->normw,
                            .nbytes = 4 * BM_D};
    for (int l = 0; l < BM_L; l++) {
        bench_layer *y = &N->ly[l];
        y->wq = bench_weight(KAON_Q4_1, BM_H * BM_HD, BM_D);
        y->wk = bench_weight(KAON_Q4_1, BM_KVH * BM_HD, BM_D);
        y->wv = bench_weight(KAON_Q4_1, BM_KVH * BM_HD, BM_D);
        y->wo = bench_weight(KAON_Q4_1, BM_D, BM_H * BM_HD);
        y->wg = bench_weight(KAON_Q4_1, BM_F, BM_D);
        y->wu = bench_weight(KAON_Q4_1, BM_F, BM_D);
        y->wd = bench_weight(KAON_Q4_1, BM_D, BM_F);
        y->norm1 = y->norm2 = N->norm;
    }
    N->head = bench_weight(KAON_Q8_0, BM_V, BM_D);
    N->emb = N->head.w;
    for (int j = 0; j < BM_HD / 2; j++) N->inv_freq[j] = (float)pow(100000.0, -2.0 * j / BM_HD);
    N->rope = (kaon_rope){.rot_dim = BM_HD, .interleaved = false, .inv_freq = N->inv_freq};
    N->nblk = (ctx + BM_BS - 1) / BM_BS;
    const size_t kvb = sizeof(float) * (size_t)N->nblk * BM_BS * BM_KVH * BM_HD;
    for (int l = 0; l < BM_L; l++) {
        N->kv[l].k = o->alloc(N->be, kvb);
        N->kv[l].v = o->alloc(N->be, kvb);
    }
    const size_t T = (size_t)max_tokens;
    N->T = max_tokens;
    N->x = o->alloc(N->be, 4 * T * BM_D);
    N->xn = o->alloc(N->be, 4 * T * BM_D);
    N->q = o->alloc(N->be, 4 * T * BM_H * BM_HD);
    N->k = o->alloc(N->be, 4 * T * BM_KVH * BM_HD);
    N->v = o->alloc(N->be, 4 * T * BM_KVH * BM_HD);
    N->att = o->alloc(N->be, 4 * T * BM_H * BM_HD);
    N->proj = o->alloc(N->be, 4 * T * BM_D);
    N->g = o->alloc(N->be, 4 * T * BM_F);
    N->u = o->alloc(N->be, 4 * T * BM_F);
    N->logits = o->alloc(N->be, 4 * BM_V);
    N->tok = malloc(4 * T);
    N->pos = malloc(4 * T);
    N->seq = calloc(T, 4);
    N->slot = malloc(4 * T);
    N->btab = malloc(4 * (size_t)N->nblk);
    for (int i = 0; i < N->nblk; i++) N->btab[i] = N->nblk - 1 - i;  // non-contiguous blocks
}

static void net_free(bench_net *N) {
    const kaon_backend_ops *o = N->be->ops;
    for (int l = 0; l < BM_L; l++) {
        bench_layer *y = &N->ly[l];
        free(y->wq.w.data); free(y->wk.w.data); free(y->wv.w.data); free(y->wo.w.data);
        free(y->wg.w.data); free(y->wu.w.data); free(y->wd.w.data);
        o->free(N->be, N->kv[l].k);
        o->free(N->be, N->kv[l].v);
    }
    free(N->emb.data);
    free(N->normw);
    void *acts[] = {N->x, N->xn, N->q, N->k, N->v, N->att, N->proj, N->g, N->u, N->logits};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) o->free(N->be, acts[i]);
    free(N->tok); free(N->pos); free(N->seq); free(N->slot); free(N->btab);
    o->destroy(N->be);
}

#define NET_OP(N, kind, call)                          \
    do {                                               \
        double _t = prof ? kaon_now() : 0.0;           \
        call;                                          \
        if (prof) (N)->prof[kind] += kaon_now() - _t;  \
    } while (0)

// One forward of n tokens at positions p0..p0+n-1 of one sequence: the op sequence of a
// llama forward pass, with the final norm and LM head for the last token only.
static void net_forward(bench_net *N, int n, int p0, int prof) {
    const kaon_backend_ops *o = N->be->ops;
    kaon_backend *be = N->be;
    for (int i = 0; i < n; i++) {
        N->tok[i] = (int32_t)(rnd64() % BM_V);
        N->pos[i] = p0 + i;
        N->slot[i] = N->btab[(p0 + i) / BM_BS] * BM_BS + (p0 + i) % BM_BS;
    }
    kaon_attn_meta m = {.n_tokens = n, .n_seqs = 1, .positions = N->pos, .token_seq = N->seq,
                        .slot_mapping = N->slot, .block_tables = N->btab, .max_blocks = N->nblk,
                        .block_size = BM_BS};
    NET_OP(N, 0, o->embed(be, &N->emb, N->tok, n, N->x));
    for (int l = 0; l < BM_L; l++) {
        bench_layer *y = &N->ly[l];
        NET_OP(N, 1, o->rmsnorm(be, N->x, l ? N->proj : NULL, &y->norm1, 1e-5f, n, BM_D, N->xn));
        // The fused forms when the backend has them, as the llama forward pass does.
        const kaon_linear *qkv[3] = {&y->wq, &y->wk, &y->wv};
        void *const outs[3] = {N->q, N->k, N->v};
        int rc = 1;
        if (o->linear_multi) NET_OP(N, 2, rc = o->linear_multi(be, N->xn, n, 3, qkv, outs));
        if (rc) {
            NET_OP(N, 2, o->linear(be, N->xn, n, &y->wq, N->q));
            NET_OP(N, 2, o->linear(be, N->xn, n, &y->wk, N->k));
            NET_OP(N, 2, o->linear(be, N->xn, n, &y->wv, N->v));
        }
        NET_OP(N, 3, o->rope(be, N->q, n, BM_H, BM_HD, N->pos, &N->rope));
        NET_OP(N, 3, o->rope(be, N->k, n, BM_KVH, BM_HD, N->pos, &N->rope));
        NET_OP(N, 4, o->kv_write(be, &N->kv[l], N->k, N->v, &m, BM_KVH, BM_HD));
        NET_OP(N, 5, o->attention(be, N->q, &N->kv[l], &m, BM_H, BM_KVH, BM_HD, 0.125f, 0, N->att));
        NET_OP(N, 2, o->linear(be, N->att, n, &y->wo, N->proj));
        NET_OP(N, 1, o->rmsnorm(be, N->x, N->proj, &y->norm2, 1e-5f, n, BM_D, N->xn));
        rc = 1;
        if (o->linear_silu_mul) NET_OP(N, 2, rc = o->linear_silu_mul(be, N->xn, n, &y->wg, &y->wu, N->g));
        if (rc) {
            NET_OP(N, 2, o->linear(be, N->xn, n, &y->wg, N->g));
            NET_OP(N, 2, o->linear(be, N->xn, n, &y->wu, N->u));
            NET_OP(N, 6, o->silu_and_mul(be, N->g, N->u, n, BM_F, N->g));
        }
        NET_OP(N, 2, o->linear(be, N->g, n, &y->wd, N->proj));
    }
    const size_t last = (size_t)(n - 1) * BM_D;
    NET_OP(N, 1, o->rmsnorm(be, N->x + last, N->proj + last, &N->norm, 1e-5f, 1, BM_D, N->xn));
    NET_OP(N, 0, o->linear(be, N->xn, 1, &N->head, N->logits));
}

static void mean_sd(const double *v, int n, double *mean, double *sd) {
    double s = 0.0, s2 = 0.0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0.0;
}

// Like llama-bench: ppP = one forward of P prompt tokens, tgG = G single-token forwards from
// an empty context; each repeated `reps` times, reported as mean +- sd tokens per second.
static void bench_model(int n_threads, int prompt, int gen, int reps) {
    bench_net N;
    const int maxt = prompt > 1 ? prompt : 1;
    net_init(&N, n_threads, maxt, (prompt > gen ? prompt : gen) + BM_BS);
    const int prof = getenv("KAON_BENCH_PROFILE") != NULL;
    double pp[16] = {0}, tg[16] = {0}, tgc[16] = {0}, m, sd;
    if (reps > 16) reps = 16;
    net_forward(&N, 1, 0, 0);  // warm up (pages, caches)
    memset(N.prof, 0, sizeof N.prof);
    for (int r = 0; r < reps; r++) {
        double t0 = kaon_now();
        if (prompt > 0) net_forward(&N, prompt, 0, prof);
        pp[r] = prompt / (kaon_now() - t0);
    }
    printf("model-shaped SmolLM2-135M (Q4_1, Q8_0 head), %d thread(s), kernels %s:\n", n_threads,
           kaon_cpu_kernel_name(N.be));
    if (prompt > 0) {
        mean_sd(pp, reps, &m, &sd);
        printf("  pp%-4d %8.1f +- %.1f tok/s\n", prompt, m, sd);
        if (prof)
            for (int i = 0; i < 7; i++)
                printf("      %-10s %7.2f ms/forward\n", prof_names[i], N.prof[i] * 1e3 / reps);
    }
    memset(N.prof, 0, sizeof N.prof);
    for (int r = 0; r < reps && gen > 0; r++) {
        double t0 = kaon_now(), c0 = cpu_seconds();
        for (int i = 0; i < gen; i++) net_forward(&N, 1, i, prof);
        tg[r] = gen / (kaon_now() - t0);
        tgc[r] = gen / (cpu_seconds() - c0) * n_threads;
    }
    if (gen > 0) {
        mean_sd(tg, reps, &m, &sd);
        printf("  tg%-4d %8.1f +- %.1f tok/s", gen, m, sd);
        mean_sd(tgc, reps, &m, &sd);
        printf("   (by CPU time / threads: %.1f +- %.1f)\n", m, sd);
        if (prof)
            for (int i = 0; i < 7; i++)
                printf("      %-10s %7.3f ms/token\n", prof_names[i], N.prof[i] * 1e3 / reps / gen);
    }
    net_free(&N);
}

// A batched decode step as the engine runs it: S sequences, each at context C (its own
// scattered KV blocks), one new token each, the LM head on all S rows; reps steps timed.
static void bench_decode(int n_threads, int S, int C, int reps) {
    bench_net N;
    const int per = (C + 1 + BM_BS - 1) / BM_BS;
    net_init(&N, n_threads, S, per * S * BM_BS);
    const kaon_backend_ops *o = N.be->ops;
    kaon_backend *be = N.be;
    // Every sequence owns `per` blocks taken from a shuffled pool.
    int32_t *btab = malloc(sizeof(int32_t) * (size_t)S * per), *perm = malloc(sizeof(int32_t) * (size_t)S * per);
    for (int i = 0; i < S * per; i++) perm[i] = i;
    for (int i = S * per - 1; i > 0; i--) {
        int j = (int)(rnd64() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(btab, perm, sizeof(int32_t) * (size_t)S * per);
    const size_t kvb = sizeof(float) * (size_t)S * per * BM_BS * BM_KVH * BM_HD;
    for (int l = 0; l < BM_L; l++) {  // random K/V so the softmax is not flat
        float *k = N.kv[l].k, *v = N.kv[l].v;
        for (size_t i = 0; i < kvb / 4; i++) {
            k[i] = (float)(2.0 * rnd_u() - 1.0);
            v[i] = (float)(2.0 * rnd_u() - 1.0);
        }
    }
    float *logits = o->alloc(be, sizeof(float) * (size_t)S * BM_V), *rows = o->alloc(be, 4 * (size_t)S * BM_D);
    int32_t *lrows = malloc(sizeof(int32_t) * (size_t)S), *seqs = malloc(sizeof(int32_t) * (size_t)S);
    for (int i = 0; i < S; i++) {
        N.tok[i] = (int32_t)(rnd64() % BM_V);
        N.pos[i] = C;
        seqs[i] = i;
        lrows[i] = i;
        N.slot[i] = btab[(size_t)i * per + C / BM_BS] * BM_BS + C % BM_BS;
    }
    kaon_attn_meta m = {.n_tokens = S, .n_seqs = S, .positions = N.pos, .token_seq = seqs,
                        .slot_mapping = N.slot, .block_tables = btab, .max_blocks = per,
                        .block_size = BM_BS};
    const int prof = getenv("KAON_BENCH_PROFILE") != NULL;
    double best = 1e9, tot = 0;
    memset(N.prof, 0, sizeof N.prof);
    for (int r = -1; r < reps; r++) {
        double t0 = kaon_now();
        const int n = S, pr = prof && r >= 0;
        bench_net *P = &N;
        NET_OP(P, 0, o->embed(be, &N.emb, N.tok, n, N.x));
        for (int l = 0; l < BM_L; l++) {
            bench_layer *y = &N.ly[l];
            const int prof = pr;
            NET_OP(P, 1, o->rmsnorm(be, N.x, l ? N.proj : NULL, &y->norm1, 1e-5f, n, BM_D, N.xn));
            const kaon_linear *qkv[3] = {&y->wq, &y->wk, &y->wv};
            void *const outs[3] = {N.q, N.k, N.v};
            NET_OP(P, 2, o->linear_multi(be, N.xn, n, 3, qkv, outs));
            NET_OP(P, 3, o->rope(be, N.q, n, BM_H, BM_HD, N.pos, &N.rope));
            NET_OP(P, 3, o->rope(be, N.k, n, BM_KVH, BM_HD, N.pos, &N.rope));
            NET_OP(P, 4, o->kv_write(be, &N.kv[l], N.k, N.v, &m, BM_KVH, BM_HD));
            NET_OP(P, 5, o->attention(be, N.q, &N.kv[l], &m, BM_H, BM_KVH, BM_HD, 0.125f, 0, N.att));
            NET_OP(P, 2, o->linear(be, N.att, n, &y->wo, N.proj));
            NET_OP(P, 1, o->rmsnorm(be, N.x, N.proj, &y->norm2, 1e-5f, n, BM_D, N.xn));
            NET_OP(P, 2, o->linear_silu_mul(be, N.xn, n, &y->wg, &y->wu, N.g));
            NET_OP(P, 2, o->linear(be, N.g, n, &y->wd, N.proj));
        }
        {
            const int prof = pr;
            NET_OP(P, 1, o->rmsnorm(be, N.x, N.proj, &N.norm, 1e-5f, n, BM_D, N.xn));
            NET_OP(P, 0, o->get_rows(be, N.xn, lrows, n, BM_D, rows));
            NET_OP(P, 6, o->linear(be, rows, n, &N.head, logits));
        }
        const double t = kaon_now() - t0;
        if (r >= 0) {
            tot += t;
            if (t < best) best = t;
        }
    }
    printf("batched decode, %d seqs at context %d, %d thread(s), kernels %s: best %.2f ms/step "
           "(%.1f tok/s), mean %.2f ms\n", S, C, n_threads, kaon_cpu_kernel_name(be), best * 1e3,
           S / best, tot / reps * 1e3);
    static const char *names[7] = {"embed", "rmsnorm", "linear", "rope", "kv_write", "attention", "lm_head"};
    if (prof)
        for (int i = 0; i < 7; i++) printf("      %-10s %7.2f ms/step\n", names[i], N.prof[i] * 1e3 / reps);
    o->free(be, logits);
    o->free(be, rows);
    free(lrows);
    free(seqs);
    free(perm);
    free(btab);
    net_free(&N);
}

static void bench(void) {
    struct { const char *name; kaon_dtype t; int M, K; } shapes[] = {
        {"q 576x576", KAON_Q4_1, 576, 576},     {"k/v 192x576", KAON_Q4_1, 192, 576},
        {"gate/up 1536x576", KAON_Q4_1, 1536, 576}, {"down 576x1536", KAON_Q4_1, 576, 1536},
        {"lm_head 49152x576", KAON_Q8_0, 49152, 576},
    };
    const int ns[] = {1, 64, 128};
    for (int nth = 1; nth <= 2; nth++) {
        kaon_backend *be = kaon_backend_cpu_create(nth);
        printf("linear, %d thread(s), kernels %s\n", nth, kaon_cpu_kernel_name(be));
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            void *wd = make_weight(shapes[s].t, shapes[s].M, shapes[s].K);
            kaon_tensor w = tensor2(shapes[s].t, shapes[s].M, shapes[s].K, wd);
            const kaon_linear lw = kaon_linear_of(&w, NULL);
            for (int ni = 0; ni < 3; ni++) {
                double cpu, t = bench_linear(be, &lw, ns[ni], 0.3, &cpu);
                printf("  %-18s %-4s n=%-3d %9.1f us (cpu %9.1f us)  %6.1f GB/s  %7.1f GFLOP/s\n",
                       shapes[s].name, kaon_dtype_name(shapes[s].t), ns[ni], t * 1e6, cpu * 1e6,
                       w.nbytes / t * 1e-9, 2.0 * shapes[s].M * shapes[s].K * ns[ni] / t * 1e-9);
            }
            free(wd);
        }
        be->ops->destroy(be);
    }
    for (int nth = 1; nth <= 2; nth++) bench_model(nth, 512, 128, 3);
}

// The same layer in each format, so the formats compare per byte and per multiply-add. CPU
// time per call (all threads) is the figure to read on a shared machine.
static void bench_quant(int nth) {
    const kaon_dtype ts[] = {KAON_Q4_0, KAON_Q8_0, KAON_Q2_K, KAON_Q3_K, KAON_Q4_K, KAON_Q5_K, KAON_Q6_K};
    const int ns[] = {1, 8, 32, 128}, M = 2816, K = 1024;
    kaon_backend *be = kaon_backend_cpu_create(nth);
    printf("linear %dx%d, %d thread(s), kernels %s\n", M, K, nth, kaon_cpu_kernel_name(be));
    for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++) {
        void *wd = make_weight(ts[ti], M, K);
        kaon_tensor w = tensor2(ts[ti], M, K, wd);
        const kaon_linear lw = kaon_linear_of(&w, NULL);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            double cpu, t = bench_linear(be, &lw, ns[ni], 0.4, &cpu);
            printf("  %-5s n=%-3d wall %9.1f us  cpu %9.1f us  %6.2f GB/s(cpu)  %6.1f GOP/s(cpu)\n",
                   kaon_dtype_name(ts[ti]), ns[ni], t * 1e6, cpu * 1e6, w.nbytes / cpu * 1e-9,
                   2.0 * M * K * ns[ni] / cpu * 1e-9);
        }
        free(wd);
    }
    be->ops->destroy(be);
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--ref") == 0) return ref_mode(argv[2], argv[3]);
    if (argc >= 2 && strcmp(argv[1], "--bench") == 0) {
        if (argc >= 3 && strcmp(argv[2], "decode") == 0) {
            int th = argc >= 4 ? atoi(argv[3]) : 2;
            bench_decode(th > 0 ? th : 2, argc >= 5 ? atoi(argv[4]) : 64, argc >= 6 ? atoi(argv[5]) : 100,
                         argc >= 7 ? atoi(argv[6]) : 5);
        } else if (argc >= 3 && strcmp(argv[2], "quant") == 0) {
            bench_quant(argc >= 4 && atoi(argv[3]) > 0 ? atoi(argv[3]) : 1);
        } else if (argc >= 3 && strcmp(argv[2], "model") == 0) {
            int th = argc >= 4 ? atoi(argv[3]) : 2;
            bench_model(th > 0 ? th : 2, argc >= 5 ? atoi(argv[4]) : 512,
                        argc >= 6 ? atoi(argv[5]) : 128, argc >= 7 ? atoi(argv[6]) : 3);
        } else {
            bench();
        }
        return 0;
    }
    self_checks();
    TEST_MAIN_END();
}
