// The CPU backend's ops other than linear (see test_cpu_linear.c), each against a plain
// double-precision reference written here, on random inputs, for every kernel set this CPU
// has (scalar, AVX2, AVX-512 VNNI; the first is what KAON_CPU_NO_SIMD=1 gives).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/linear.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "test.h"
#include "util/err.h"
#include "util/fp8.h"
#include "util/half.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
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
static float *rnd_vec(size_t n, double scale) {
    float *v = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = (float)(scale * rnd_n());
    return v;
}

// Max |a - b| / (atol + rtol |b|) over n values: <= 1 passes.
static double err_ratio(const float *a, const double *b, size_t n, double atol, double rtol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (!(e <= worst)) worst = e;  // NaN propagates as a failure
    }
    return worst;
}

#define CHECK_RATIO(r, what, set)                                                       \
    do {                                                                                \
        double _r = (r);                                                                \
        if (!(_r <= 1.0)) fprintf(stderr, "%s [%s]: error ratio %g\n", what, set, _r);  \
        CHECK(_r <= 1.0);                                                               \
    } while (0)

typedef struct {
    kaon_backend *be;
    const char *name;
} kset;

static int n_sets;
static kset sets[3];

static void make_sets(int n_threads) {
    const char *envs[3] = {"KAON_CPU_NO_SIMD", "KAON_CPU_NO_AVX512", NULL};
    n_sets = 0;
    for (int i = 0; i < 3; i++) {
        unsetenv("KAON_CPU_NO_SIMD");
        unsetenv("KAON_CPU_NO_AVX512");
        if (envs[i]) setenv(envs[i], "1", 1);
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
    CHECK(n_sets >= 1 && strcmp(sets[0].name, "scalar") == 0);
}

static void free_sets(void) {
    for (int i = 0; i < n_sets; i++) sets[i].be->ops->destroy(sets[i].be);
    n_sets = 0;
}

// ---- memory, embed, get_rows, to_host ---------------------------------------------------

static void test_alloc(kaon_backend *be) {
    const size_t sizes[] = {1, 63, 64, 1000, 1 << 20, 0};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = be->ops->alloc(be, sizes[i]);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK(((uintptr_t)p & 63) == 0);
        int zero = 1;
        for (size_t j = 0; j < sizes[i]; j++) zero &= p[j] == 0;
        CHECK(zero);
        be->ops->free(be, p);
    }
    CHECK(be->ops->act_elem_bytes == 4);
}

static void test_embed(kaon_backend *be, const char *set) {
    enum { V = 50, D = 64 };
    float *src = rnd_vec((size_t)V * D, 1.0);
    uint16_t *h = malloc(2 * V * D), *bf = malloc(2 * V * D);
    for (int i = 0; i < V * D; i++) {
        h[i] = kaon_f32_to_f16(src[i]);
        bf[i] = kaon_f32_to_bf16(src[i]);
    }
    kaon_tensor tabs[3] = {
        {.dtype = KAON_F32, .ndim = 2, .shape = {V, D}, .data = src, .nbytes = 4u * V * D},
        {.dtype = KAON_F16, .ndim = 2, .shape = {V, D}, .data = h, .nbytes = 2u * V * D},
        {.dtype = KAON_BF16, .ndim = 2, .shape = {V, D}, .data = bf, .nbytes = 2u * V * D},
    };
    const int32_t ids[5] = {3, 0, 49, 3, 17};
    float out[5 * D];
    for (int ti = 0; ti < 3; ti++) {
        be->ops->embed(be, &tabs[ti], ids, 5, out);
        int ok = 1;
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < D; j++) {
                float want = ti == 0 ? src[ids[i] * D + j]
                           : ti == 1 ? kaon_f16_to_f32(h[ids[i] * D + j])
                                     : kaon_bf16_to_f32(bf[ids[i] * D + j]);
                ok &= out[i * D + j] == want;
            }
        if (!ok) fprintf(stderr, "embed %s [%s] wrong\n", kaon_dtype_name(tabs[ti].dtype), set);
        CHECK(ok);
    }
    // A quantized table: each row equals the row's dequantization (the dequantizers themselves
    // are checked against the gguf package by tests/ref/test_cpu_quant.py).
    uint8_t q[V * 34];
    for (int i = 0; i < V * 34; i++) q[i] = (uint8_t)rnd64();
    for (int i = 0; i < V * 34; i += 34) {
        uint16_t d = kaon_f32_to_f16(0.01f);
        memcpy(q + i, &d, 2);
    }
    kaon_tensor qt = {.dtype = KAON_Q8_0, .ndim = 2, .shape = {V, 32}, .data = q, .nbytes = sizeof q};
    float row[32];
    be->ops->embed(be, &qt, ids, 5, out);
    for (int i = 0; i < 5; i++) {
        CHECK(kaon_cpu_dequantize_row(KAON_Q8_0, q, ids[i], 32, row) == 0);
        CHECK(memcmp(row, out + i * 32, sizeof row) == 0);
        const int8_t *qs = (const int8_t *)q + ids[i] * 34 + 2;
        CHECK(out[i * 32 + 5] == 0.01f * 0 + kaon_f16_to_f32(kaon_f32_to_f16(0.01f)) * qs[5]);
    }
    // Out-of-range ids: zero rows and an error, never a read outside the table.
    const int32_t bad[3] = {1, V, -1};
    for (int i = 0; i < 3 * D; i++) out[i] = 7.0f;
    kaon_clear_error();
    be->ops->embed(be, &tabs[0], bad, 3, out);
    CHECK(strstr(kaon_last_error(), "outside the vocabulary") != NULL);
    CHECK(out[0] == src[D] && out[D] == 0.0f && out[2 * D + 5] == 0.0f);
    free(src);
    free(h);
    free(bf);
}

static void test_get_rows_to_host(kaon_backend *be) {
    enum { R = 9, D = 13 };
    float *x = rnd_vec(R * D, 1.0), out[4 * D], host[4 * D];
    const int32_t idx[4] = {8, 0, 8, 4};
    be->ops->get_rows(be, x, idx, 4, D, out);
    int ok = 1;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < D; j++) ok &= out[i * D + j] == x[idx[i] * D + j];
    CHECK(ok);
    be->ops->to_host_f32(be, out, 4 * D, host);
    CHECK(memcmp(out, host, sizeof host) == 0);
    free(x);
}

// ---- rmsnorm, silu_and_mul ----------------------------------------------------------

static void test_rmsnorm(kaon_backend *be, const char *set) {
    const int dims[] = {576, 100, 7};
    for (int di = 0; di < 3; di++)
        for (int wt = 0; wt < 3; wt++)
            for (int with_add = 0; with_add < 2; with_add++) {
                const int n = 5, D = dims[di];
                float *x = rnd_vec((size_t)n * D, 2.0), *add = rnd_vec((size_t)n * D, 1.0);
                float *w = rnd_vec(D, 1.0), *out = malloc(sizeof(float) * n * D);
                uint16_t *wh = malloc(2 * D);
                for (int i = 0; i < D; i++) {
                    wh[i] = wt == 1 ? kaon_f32_to_f16(w[i]) : kaon_f32_to_bf16(w[i]);
                    if (wt) w[i] = wt == 1 ? kaon_f16_to_f32(wh[i]) : kaon_bf16_to_f32(wh[i]);
                }
                kaon_tensor wtn = {.dtype = wt == 0 ? KAON_F32 : wt == 1 ? KAON_F16 : KAON_BF16,
                                   .ndim = 1, .shape = {D}, .data = wt ? (void *)wh : (void *)w,
                                   .nbytes = (size_t)D * (wt ? 2 : 4)};
                double *rx = malloc(sizeof(double) * n * D), *ro = malloc(sizeof(double) * n * D);
                const float eps = 1e-5f;
                for (int t = 0; t < n; t++) {
                    double ss = 0.0;
                    for (int i = 0; i < D; i++) {
                        double v = (double)x[t * D + i] + (with_add ? (double)add[t * D + i] : 0.0);
                        rx[t * D + i] = v;
                        ss += v * v;
                    }
                    double r = 1.0 / sqrt(ss / D + eps);
                    for (int i = 0; i < D; i++) ro[t * D + i] = rx[t * D + i] * r * w[i];
                }
                be->ops->rmsnorm(be, x, with_add ? add : NULL, &wtn, eps, n, D, out);
                CHECK_RATIO(err_ratio(x, rx, (size_t)n * D, 1e-6, 1e-6), "rmsnorm residual", set);
                CHECK_RATIO(err_ratio(out, ro, (size_t)n * D, 1e-6, 2e-6), "rmsnorm", set);
                // In place (out == x) gives the same numbers.
                float *x2 = malloc(sizeof(float) * n * D);
                memcpy(x2, x, sizeof(float) * n * D);
                be->ops->rmsnorm(be, x2, NULL, &wtn, eps, n, D, x2);
                be->ops->rmsnorm(be, x, NULL, &wtn, eps, n, D, out);
                CHECK(memcmp(x2, out, sizeof(float) * n * D) == 0);
                free(x); free(add); free(w); free(out); free(wh); free(rx); free(ro); free(x2);
            }
}

static void test_silu(kaon_backend *be, const char *set) {
    const int n = 3, D = 1003;  // a tail past the SIMD width
    float *g = rnd_vec((size_t)n * D, 4.0), *u = rnd_vec((size_t)n * D, 1.0);
    float *out = malloc(sizeof(float) * n * D);
    g[0] = -100.0f;  // exp overflow territory
    g[1] = 100.0f;
    g[2] = 0.0f;
    double *ref = malloc(sizeof(double) * n * D);
    for (int i = 0; i < n * D; i++) ref[i] = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    be->ops->silu_and_mul(be, g, u, n, D, out);
    CHECK_RATIO(err_ratio(out, ref, (size_t)n * D, 1e-7, 1e-6), "silu_and_mul", set);
    be->ops->silu_and_mul(be, g, u, n, D, g);  // in place over gate
    CHECK(memcmp(g, out, sizeof(float) * n * D) == 0);
    free(g); free(u); free(out); free(ref);
}

static void test_gelu_tanh(kaon_backend *be, const char *set) {
    const int n = 3, D = 1003;  // a tail past the SIMD width
    float *g = rnd_vec((size_t)n * D, 4.0), *u = rnd_vec((size_t)n * D, 1.0);
    float *out = malloc(sizeof(float) * n * D);
    const float edge[] = {-100.0f, 100.0f, 0.0f, -9.0f, -20.0f, 1e-3f, -1e-3f, 5.5f};
    memcpy(g, edge, sizeof edge);  // exp's range ends, both signs near 0
    memcpy(g + 2 * D + 8, edge, sizeof edge);  // and again in the scalar tail of a SIMD row
    double *ref = malloc(sizeof(double) * n * D);
    const double c = sqrt(2.0 / 3.14159265358979323846);
    for (int i = 0; i < n * D; i++) {
        const double x = g[i];
        ref[i] = 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x))) * u[i];
    }
    be->ops->gelu_tanh_and_mul(be, g, u, n, D, out);
    CHECK_RATIO(err_ratio(out, ref, (size_t)n * D, 1e-7, 2e-6), "gelu_tanh_and_mul", set);
    be->ops->gelu_tanh_and_mul(be, g, u, n, D, g);  // in place over gate
    CHECK(memcmp(g, out, sizeof(float) * n * D) == 0);
    free(g); free(u); free(out); free(ref);
}

static void test_scale(kaon_backend *be) {
    const size_t sizes[] = {1, 640 * 3, 1 << 20};  // the last one spread over the threads
    for (int k = 0; k < 3; k++) {
        const size_t n = sizes[k];
        float *x = rnd_vec(n, 2.0), *x0 = malloc(sizeof(float) * n);
        memcpy(x0, x, sizeof(float) * n);
        const float s = sqrtf(640.0f);
        be->ops->scale(be, x, n, s);
        int ok = 1;
        for (size_t i = 0; i < n; i++) ok &= x[i] == x0[i] * s;  // one float multiply each
        CHECK(ok);
        free(x);
        free(x0);
    }
}

// ---- rope -------------------------------------------------------------------------

static void test_rope(kaon_backend *be, const char *set) {
    const int hd = 64, H = 3, n = 6;
    for (int inter = 0; inter < 2; inter++)
        for (int partial = 0; partial < 2; partial++) {
            const int rot = partial ? 32 : hd, half = rot / 2;
            float inv[32];
            for (int j = 0; j < half; j++) inv[j] = (float)pow(10000.0, -2.0 * j / rot);
            kaon_rope rp = {.rot_dim = rot, .interleaved = inter, .inv_freq = inv};
            for (int round = 0; round < 2; round++) {  // two position sets: the cache must follow
                int32_t pos[6];
                for (int t = 0; t < n; t++) pos[t] = round == 0 ? (int32_t)(rnd64() % 5000) : t;
                float *x = rnd_vec((size_t)n * H * hd, 1.0);
                double *ref = malloc(sizeof(double) * n * H * hd);
                for (int t = 0; t < n; t++)
                    for (int h = 0; h < H; h++) {
                        const float *v = x + (t * H + h) * hd;
                        double *o = ref + (t * H + h) * hd;
                        for (int i = 0; i < hd; i++) o[i] = v[i];
                        for (int j = 0; j < half; j++) {
                            // The angle as the float product pos * inv_freq (HF computes it in
                            // float32 too); its cos/sin in double.
                            double th = (double)((float)pos[t] * inv[j]);
                            int a = inter ? 2 * j : j, b = inter ? 2 * j + 1 : j + half;
                            o[a] = v[a] * cos(th) - (double)v[b] * sin(th);
                            o[b] = v[a] * sin(th) + (double)v[b] * cos(th);
                        }
                    }
                be->ops->rope(be, x, n, H, hd, pos, &rp);
                CHECK_RATIO(err_ratio(x, ref, (size_t)n * H * hd, 1e-6, 1e-6), "rope", set);
                free(x);
                free(ref);
            }
        }
    // Same positions, new frequencies: the cached table must not be reused.
    float inv1[32], inv2[32];
    for (int j = 0; j < 32; j++) {
        inv1[j] = 0.1f * (float)(j + 1);
        inv2[j] = 0.05f * (float)(j + 1);
    }
    int32_t pos[2] = {5, 9};
    float x1[2 * 64], x2[2 * 64];
    for (int i = 0; i < 128; i++) x1[i] = x2[i] = (float)rnd_n();
    kaon_rope r1 = {.rot_dim = 64, .inv_freq = inv1}, r2 = {.rot_dim = 64, .inv_freq = inv2};
    be->ops->rope(be, x1, 2, 1, 64, pos, &r1);
    be->ops->rope(be, x2, 2, 1, 64, pos, &r2);
    CHECK(memcmp(x1, x2, sizeof x1) != 0);
    kaon_clear_error();
    kaon_rope bad = {.rot_dim = 66, .inv_freq = inv1};
    be->ops->rope(be, x1, 2, 1, 64, pos, &bad);
    CHECK(strstr(kaon_last_error(), "rope") != NULL);
}

// ---- kv_write + attention -----------------------------------------------------------

typedef struct {
    int n_seqs, max_blocks, bs, n_blocks;
    int32_t *btab;  // [n_seqs, max_blocks], a shuffled permutation of the pool
} kv_layout;

// Dense reference: token t of sequence s at position p attends to the positions k <= p of s
// (window 0) that are also inside the sliding window, HF's kv_idx > q_idx - window; their
// K/V rows are kall/vall [seq][pos][n_kv][hd].
static int ref_in_window(int k, int p, int window) { return k <= p && (window == 0 || k > p - window); }

static void ref_attention(const float *q, const float *kall, const float *vall, int max_pos,
                          const int32_t *seqs, const int32_t *pos, int T, int H, int KVH, int hd,
                          float scale, int window, double *out) {
    double *sc = malloc(sizeof(double) * (max_pos + 1));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const int g = h / (H / KVH);
            const float *qv = q + ((size_t)t * H + h) * hd;
            double mx = -INFINITY, sum = 0.0;
            for (int p = 0; p <= pos[t]; p++) {
                if (!ref_in_window(p, pos[t], window)) continue;
                const float *kv = kall + (((size_t)seqs[t] * max_pos + p) * KVH + g) * hd;
                double d = 0.0;
                for (int i = 0; i < hd; i++) d += (double)qv[i] * kv[i];
                sc[p] = d * scale;
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p <= pos[t]; p++)
                if (ref_in_window(p, pos[t], window)) sum += sc[p] = exp(sc[p] - mx);
            double *o = out + ((size_t)t * H + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0.0;
            for (int p = 0; p <= pos[t]; p++) {
                if (!ref_in_window(p, pos[t], window)) continue;
                const float *vv = vall + (((size_t)seqs[t] * max_pos + p) * KVH + g) * hd;
                for (int i = 0; i < hd; i++) o[i] += sc[p] / sum * vv[i];
            }
        }
    free(sc);
}

// Writes the K/V of (seqs, pos) from kall/vall into the cache through kv_write.
static void write_tokens(kaon_backend *be, kaon_kv_layer *kv, const kv_layout *L, const float *kall,
                         const float *vall, int max_pos, const int32_t *seqs, const int32_t *pos,
                         int T, int KVH, int hd) {
    float *k = malloc(sizeof(float) * T * KVH * hd), *v = malloc(sizeof(float) * T * KVH * hd);
    int32_t *slot = malloc(sizeof(int32_t) * T);
    for (int t = 0; t < T; t++) {
        memcpy(k + (size_t)t * KVH * hd, kall + ((size_t)seqs[t] * max_pos + pos[t]) * KVH * hd,
               sizeof(float) * KVH * hd);
        memcpy(v + (size_t)t * KVH * hd, vall + ((size_t)seqs[t] * max_pos + pos[t]) * KVH * hd,
               sizeof(float) * KVH * hd);
        slot[t] = L->btab[seqs[t] * L->max_blocks + pos[t] / L->bs] * L->bs + pos[t] % L->bs;
    }
    kaon_attn_meta m = {.n_tokens = T, .n_seqs = L->n_seqs, .positions = pos, .token_seq = seqs,
                        .slot_mapping = slot, .block_tables = L->btab, .max_blocks = L->max_blocks,
                        .block_size = L->bs};
    be->ops->kv_write(be, kv, k, v, &m, KVH, hd);
    free(k);
    free(v);
    free(slot);
}

static void shuffled_tables(kv_layout *L) {
    int32_t *perm = malloc(sizeof(int32_t) * L->n_blocks);
    for (int i = 0; i < L->n_blocks; i++) perm[i] = i;
    for (int i = L->n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd64() % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    L->btab = malloc(sizeof(int32_t) * L->n_seqs * L->max_blocks);
    for (int i = 0; i < L->n_seqs * L->max_blocks; i++) L->btab[i] = perm[i];
    free(perm);
}

// Mixed batch: sequence 0 prefills positions 0..6, sequence 1 decodes position 9 (0..8
// cached by an earlier step), sequence 2 prefills a chunk 3..7 after a cached prefix 0..2,
// sequence 3 decodes position 0. GQA with 6 query heads over 2 KV heads; blocks of 4 slots.
static void test_attention_mixed(kaon_backend *be, const char *set, int hd) {
    const int H = 6, KVH = 2, MAXP = 16;
    kv_layout L = {.n_seqs = 4, .max_blocks = 4, .bs = 4, .n_blocks = 16};
    shuffled_tables(&L);
    float *kall = rnd_vec((size_t)L.n_seqs * MAXP * KVH * hd, 1.0);
    float *vall = rnd_vec((size_t)L.n_seqs * MAXP * KVH * hd, 1.0);
    kaon_kv_layer kv = {be->ops->alloc(be, sizeof(float) * L.n_blocks * L.bs * KVH * hd),
                        be->ops->alloc(be, sizeof(float) * L.n_blocks * L.bs * KVH * hd), KAON_KV_NATIVE, 1.0f, 1.0f};
    // Step 1: the earlier tokens.
    int32_t s1[12], p1[12];
    int T1 = 0;
    for (int p = 0; p < 9; p++) s1[T1] = 1, p1[T1++] = p;
    for (int p = 0; p < 3; p++) s1[T1] = 2, p1[T1++] = p;
    write_tokens(be, &kv, &L, kall, vall, MAXP, s1, p1, T1, KVH, hd);
    // Step 2: the mixed batch, tokens of different sequences interleaved.
    int32_t s2[14], p2[14];
    int T2 = 0;
    for (int p = 0; p < 7; p++) {
        s2[T2] = 0, p2[T2++] = p;
        if (p < 5) s2[T2] = 2, p2[T2++] = 3 + p;
    }
    s2[T2] = 1, p2[T2++] = 9;
    s2[T2] = 3, p2[T2++] = 0;
    write_tokens(be, &kv, &L, kall, vall, MAXP, s2, p2, T2, KVH, hd);
    float *q = rnd_vec((size_t)T2 * H * hd, 1.0), *out = malloc(sizeof(float) * T2 * H * hd);
    double *ref = malloc(sizeof(double) * T2 * H * hd);
    int32_t slot[14];
    for (int t = 0; t < T2; t++) slot[t] = -1;
    kaon_attn_meta m = {.n_tokens = T2, .n_seqs = L.n_seqs, .positions = p2, .token_seq = s2,
                        .slot_mapping = slot, .block_tables = L.btab, .max_blocks = L.max_blocks,
                        .block_size = L.bs};
    const float scale = 1.0f / sqrtf((float)hd);
    kaon_clear_error();
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, scale, 0, out);
    CHECK(strcmp(kaon_last_error(), "unknown error") == 0);
    ref_attention(q, kall, vall, MAXP, s2, p2, T2, H, KVH, hd, scale, 0, ref);
    CHECK_RATIO(err_ratio(out, ref, (size_t)T2 * H * hd, 2e-6, 2e-5), "attention mixed batch", set);

    // A token of an unknown sequence and one whose block is missing: zero rows and an error.
    s2[0] = 7;
    L.btab[3 * L.max_blocks + 0] = -1;  // sequence 3's only block
    kaon_clear_error();
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, scale, 0, out);
    CHECK(strstr(kaon_last_error(), "out of range") != NULL);
    int zero = 1;
    for (int i = 0; i < H * hd; i++) zero &= out[i] == 0.0f && out[(size_t)(T2 - 1) * H * hd + i] == 0.0f;
    CHECK(zero);
    CHECK_RATIO(err_ratio(out + H * hd, ref + H * hd, (size_t)(T2 - 2) * H * hd, 2e-6, 2e-5),
                "attention next to bad tokens", set);
    be->ops->free(be, kv.k);
    be->ops->free(be, kv.v);
    free(L.btab); free(kall); free(vall); free(q); free(out); free(ref);
}

// A long sequence (several score chunks per block, several blocks) and a decode at its end,
// with a scale that makes the softmax peaky (online max updates matter).
static void test_attention_long(kaon_backend *be, const char *set) {
    const int H = 9, KVH = 3, hd = 64, MAXP = 300;
    kv_layout L = {.n_seqs = 1, .max_blocks = 3, .bs = 128, .n_blocks = 3};
    shuffled_tables(&L);
    float *kall = rnd_vec((size_t)MAXP * KVH * hd, 1.0), *vall = rnd_vec((size_t)MAXP * KVH * hd, 1.0);
    kaon_kv_layer kv = {be->ops->alloc(be, sizeof(float) * L.n_blocks * L.bs * KVH * hd),
                        be->ops->alloc(be, sizeof(float) * L.n_blocks * L.bs * KVH * hd), KAON_KV_NATIVE, 1.0f, 1.0f};
    int32_t seqs[MAXP], pos[MAXP];
    for (int p = 0; p < MAXP; p++) seqs[p] = 0, pos[p] = p;
    write_tokens(be, &kv, &L, kall, vall, MAXP, seqs, pos, MAXP, KVH, hd);
    const int T = 40;  // the last 40 positions as queries
    float *q = rnd_vec((size_t)T * H * hd, 1.0), *out = malloc(sizeof(float) * T * H * hd);
    double *ref = malloc(sizeof(double) * T * H * hd);
    kaon_attn_meta m = {.n_tokens = T, .n_seqs = 1, .positions = pos + MAXP - T,
                        .token_seq = seqs, .slot_mapping = NULL, .block_tables = L.btab,
                        .max_blocks = L.max_blocks, .block_size = L.bs};
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, 0.5f, 0, out);
    ref_attention(q, kall, vall, MAXP, seqs, pos + MAXP - T, T, H, KVH, hd, 0.5f, 0, ref);
    // float32 scores over head_dim 64 with |q.k| up to ~30 carry ~1e-5 absolute error.
    CHECK_RATIO(err_ratio(out, ref, (size_t)T * H * hd, 1e-5, 5e-5), "attention long", set);
    // Two threads: every (token, head) is computed the same way, so the result is identical.
    kaon_backend *b1 = kaon_backend_cpu_create(1), *b2 = kaon_backend_cpu_create(2);
    float *o1 = malloc(sizeof(float) * T * H * hd), *o2 = malloc(sizeof(float) * T * H * hd);
    b1->ops->attention(b1, q, &kv, &m, H, KVH, hd, 0.5f, 0, o1);
    b2->ops->attention(b2, q, &kv, &m, H, KVH, hd, 0.5f, 0, o2);
    CHECK(memcmp(o1, o2, sizeof(float) * T * H * hd) == 0);
    // One decode token on two threads (work items of one head each) and on one thread
    // (items of a whole KV group).
    m.n_tokens = 1;
    m.positions = pos + MAXP - 1;
    b1->ops->attention(b1, q, &kv, &m, H, KVH, hd, 0.5f, 0, o1);
    b2->ops->attention(b2, q, &kv, &m, H, KVH, hd, 0.5f, 0, o2);
    ref_attention(q, kall, vall, MAXP, seqs, pos + MAXP - 1, 1, H, KVH, hd, 0.5f, 0, ref);
    CHECK_RATIO(err_ratio(o1, ref, (size_t)H * hd, 1e-5, 5e-5), "attention decode 1 thread", set);
    CHECK_RATIO(err_ratio(o2, ref, (size_t)H * hd, 1e-5, 5e-5), "attention decode 2 threads", set);
    b1->ops->destroy(b1);
    b2->ops->destroy(b2);
    be->ops->free(be, kv.k);
    be->ops->free(be, kv.v);
    free(o1); free(o2); free(L.btab); free(kall); free(vall); free(q); free(out); free(ref);
}

// Multi-query attention with more query heads per KV head than one work item takes (10 > 8).
static void test_attention_mqa(kaon_backend *be, const char *set) {
    const int H = 10, KVH = 1, hd = 16, MAXP = 24;
    kv_layout L = {.n_seqs = 2, .max_blocks = 3, .bs = 8, .n_blocks = 6};
    shuffled_tables(&L);
    float *kall = rnd_vec((size_t)L.n_seqs * MAXP * KVH * hd, 1.0);
    float *vall = rnd_vec((size_t)L.n_seqs * MAXP * KVH * hd, 1.0);
    kaon_kv_layer kv = {be->ops->alloc(be, sizeof(float) * L.n_blocks * L.bs * KVH * hd),
                        be->ops->alloc(be, sizeof(float) * L.n_blocks * L.bs * KVH * hd), KAON_KV_NATIVE, 1.0f, 1.0f};
    int32_t seqs[2 * MAXP], pos[2 * MAXP];
    for (int t = 0; t < 2 * MAXP; t++) seqs[t] = t % 2, pos[t] = t / 2;
    write_tokens(be, &kv, &L, kall, vall, MAXP, seqs, pos, 2 * MAXP, KVH, hd);
    const int T = 2 * MAXP;
    float *q = rnd_vec((size_t)T * H * hd, 1.0), *out = malloc(sizeof(float) * T * H * hd);
    double *ref = malloc(sizeof(double) * T * H * hd);
    kaon_attn_meta m = {.n_tokens = T, .n_seqs = L.n_seqs, .positions = pos, .token_seq = seqs,
                        .block_tables = L.btab, .max_blocks = L.max_blocks, .block_size = L.bs};
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, 0.25f, 0, out);
    ref_attention(q, kall, vall, MAXP, seqs, pos, T, H, KVH, hd, 0.25f, 0, ref);
    CHECK_RATIO(err_ratio(out, ref, (size_t)T * H * hd, 2e-6, 2e-5), "attention MQA", set);
    be->ops->free(be, kv.k);
    be->ops->free(be, kv.v);
    free(L.btab); free(kall); free(vall); free(q); free(out); free(ref);
}

// Sliding-window attention (the keys p - W < k <= p) in one mixed batch, interleaved: decodes
// whose context is shorter than, as long as and longer than the window, a prefill chunk
// after a cached prefix spanning more than a window, a fresh prefill. Blocks before every
// window of their sequence are then taken out of the table (-1), as an engine that frees them
// would leave it: the op must not look them up.
static void test_attention_window(kaon_backend *be, const char *set, int hd, int L, int W) {
    const int H = 4, KVH = 2, MAXP = 2 * L + 8, S = 5;
    kv_layout L_ = {.n_seqs = S, .max_blocks = (MAXP + 5) / 6, .bs = 6};
    L_.n_blocks = S * L_.max_blocks;
    shuffled_tables(&L_);
    // Per sequence: cached positions 0..ctx-1, then new tokens ctx..ctx+nnew-1.
    const int ctx[5] = {L - 1, 2 * L + 5, L / 2 + 1, 0, 3};
    const int nnew[5] = {1, 1, L + 5, 6, 1};
    float *kall = rnd_vec((size_t)S * MAXP * KVH * hd, 1.0), *vall = rnd_vec((size_t)S * MAXP * KVH * hd, 1.0);
    kaon_kv_layer kv = {be->ops->alloc(be, sizeof(float) * L_.n_blocks * L_.bs * KVH * hd),
                        be->ops->alloc(be, sizeof(float) * L_.n_blocks * L_.bs * KVH * hd), KAON_KV_NATIVE, 1.0f, 1.0f};
    int32_t *s1 = malloc(sizeof(int32_t) * S * MAXP * 4), *p1 = s1 + S * MAXP, *s2 = p1 + S * MAXP,
            *p2 = s2 + S * MAXP;
    int T1 = 0, T2 = 0;
    for (int s = 0; s < S; s++)
        for (int p = 0; p < ctx[s]; p++) s1[T1] = s, p1[T1++] = p;
    write_tokens(be, &kv, &L_, kall, vall, MAXP, s1, p1, T1, KVH, hd);
    for (int j = 0; j < L + 5; j++)  // round-robin over the sequences: a mixed batch
        for (int s = 0; s < S; s++)
            if (j < nnew[s]) s2[T2] = s, p2[T2++] = ctx[s] + j;
    write_tokens(be, &kv, &L_, kall, vall, MAXP, s2, p2, T2, KVH, hd);
    int holes = 0;
    for (int s = 0; s < S; s++) {
        const int first = ctx[s] - W + 1;  // the lowest window start of s's tokens
        for (int b = 0; (b + 1) * L_.bs <= first; b++, holes++) L_.btab[s * L_.max_blocks + b] = -1;
    }
    float *q = rnd_vec((size_t)T2 * H * hd, 1.0), *out = malloc(sizeof(float) * T2 * H * hd);
    double *ref = malloc(sizeof(double) * T2 * H * hd);
    kaon_attn_meta m = {.n_tokens = T2, .n_seqs = S, .positions = p2, .token_seq = s2,
                        .block_tables = L_.btab, .max_blocks = L_.max_blocks, .block_size = L_.bs};
    const float scale = 1.0f / sqrtf((float)hd);
    kaon_clear_error();
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, scale, W, out);
    CHECK(strcmp(kaon_last_error(), "unknown error") == 0);
    ref_attention(q, kall, vall, MAXP, s2, p2, T2, H, KVH, hd, scale, W, ref);
    char what[96];
    snprintf(what, sizeof what, "attention window %d (hd %d, context %d, %d blocks out)", W, hd, L, holes);
    CHECK_RATIO(err_ratio(out, ref, (size_t)T2 * H * hd, 2e-6, 2e-5), what, set);
    // One token on two threads (one head per work item) gives the same numbers.
    kaon_backend *b2 = kaon_backend_cpu_create(2);
    float *o2 = malloc(sizeof(float) * H * hd);
    m.n_tokens = 1;
    m.positions = p2 + 1;  // sequence 1's decode
    m.token_seq = s2 + 1;
    b2->ops->attention(b2, q + H * hd, &kv, &m, H, KVH, hd, scale, W, o2);
    CHECK_RATIO(err_ratio(o2, ref + H * hd, (size_t)H * hd, 2e-6, 2e-5), "attention window, 1 token", set);
    b2->ops->destroy(b2);
    free(o2);
    // A window past every context is full causal attention, to the bit.
    if (W >= MAXP) {
        for (int i = 0; i < S * L_.max_blocks; i++) CHECK(L_.btab[i] >= 0);
        float *full = malloc(sizeof(float) * T2 * H * hd);
        m.n_tokens = T2;
        m.positions = p2;
        m.token_seq = s2;
        be->ops->attention(be, q, &kv, &m, H, KVH, hd, scale, 0, full);
        CHECK(memcmp(full, out, sizeof(float) * T2 * H * hd) == 0);
        free(full);
    }
    kaon_clear_error();
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, scale, -1, out);
    CHECK(strstr(kaon_last_error(), "window -1") != NULL);
    be->ops->free(be, kv.k);
    be->ops->free(be, kv.v);
    free(L_.btab); free(kall); free(vall); free(s1); free(q); free(out); free(ref);
}


// ---- MLA (DeepSeek): latent rows, per-head matrices, strided copies -----------------------

// MLA's absorbed attention: one cached row [kvl + rd] per token (kv_write with no V) is every
// head's key, and its first kvl values the value. Two sequences interleaved, a decode after a
// cached prefix, a padding token (position -1) that must come out as zeros.
static float *fp8_decoded(const float *x, size_t n, float s);

// fp8 > 0: an FP8 latent cache with that k_scale (the reference reads the decoded rows).
static void test_mla_attention(kaon_backend *be, const char *set, int H, int kvl, int rd, float fp8) {
    const int R = kvl + rd, MAXP = 21;
    kv_layout L = {.n_seqs = 2, .max_blocks = 6, .bs = 4, .n_blocks = 12};
    shuffled_tables(&L);
    float *rows = rnd_vec((size_t)L.n_seqs * MAXP * R, 1.0);
    kaon_kv_layer kv = {be->ops->alloc(be, (fp8 > 0 ? 1 : sizeof(float)) * L.n_blocks * L.bs * R), NULL,
                        fp8 > 0 ? KAON_KV_FP8 : KAON_KV_NATIVE, fp8 > 0 ? fp8 : 1.0f, 1.0f};
    int32_t seqs[2 * MAXP + 1], pos[2 * MAXP + 1], slot[2 * MAXP + 1];
    int T = 0;
    for (int p = 0; p < MAXP; p++) {
        for (int sq = 0; sq < 2; sq++) {
            if (sq == 1 && p == MAXP - 1) continue;  // sequence 1 stops one short
            seqs[T] = sq, pos[T] = p;
            slot[T] = L.btab[sq * L.max_blocks + p / L.bs] * L.bs + p % L.bs;
            T++;
        }
    }
    seqs[T] = -1, pos[T] = -1, slot[T] = -1;  // padding
    T++;
    float *k = malloc(sizeof(float) * T * R);
    for (int t = 0; t < T; t++)
        memcpy(k + (size_t)t * R, seqs[t] < 0 ? rows : rows + ((size_t)seqs[t] * MAXP + pos[t]) * R, sizeof(float) * R);
    kaon_attn_meta m = {.n_tokens = T, .n_seqs = L.n_seqs, .positions = pos, .token_seq = seqs,
                        .slot_mapping = slot, .block_tables = L.btab, .max_blocks = L.max_blocks,
                        .block_size = L.bs};
    kaon_clear_error();
    be->ops->kv_write(be, &kv, k, NULL, &m, 1, R);
    float *q = rnd_vec((size_t)T * H * R, 0.3), *out = malloc(sizeof(float) * T * H * kvl);
    double *ref = calloc((size_t)T * H * kvl, sizeof(double)), sc[MAXP];
    const float scale = 0.11f;
    be->ops->mla_attention(be, q, &kv, &m, H, kvl, rd, scale, out);
    if (fp8 > 0) {  // the reference reads what the cache holds
        float *d = fp8_decoded(rows, (size_t)L.n_seqs * MAXP * R, fp8);
        free(rows);
        rows = d;
    }
    for (int t = 0; t < T - 1; t++)
        for (int h = 0; h < H; h++) {
            const float *qv = q + ((size_t)t * H + h) * R;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p <= pos[t]; p++) {
                const float *r = rows + ((size_t)seqs[t] * MAXP + p) * R;
                double d = 0;
                for (int i = 0; i < R; i++) d += (double)qv[i] * r[i];
                sc[p] = d * scale;
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p <= pos[t]; p++) sum += sc[p] = exp(sc[p] - mx);
            double *o = ref + ((size_t)t * H + h) * kvl;
            for (int p = 0; p <= pos[t]; p++)
                for (int i = 0; i < kvl; i++) o[i] += sc[p] / sum * rows[((size_t)seqs[t] * MAXP + p) * R + i];
        }
    CHECK(strstr(kaon_last_error(), "out of range") != NULL);  // the padding token's sequence
    CHECK_RATIO(err_ratio(out, ref, (size_t)T * H * kvl, 2e-6, 2e-5), fp8 > 0 ? "mla_attention fp8" : "mla_attention",
                set);
    be->ops->free(be, kv.k);
    free(L.btab); free(rows); free(k); free(q); free(out); free(ref);
}

// y[t, h, :out] = x[t, h, :in] @ w_h^T with x and y rows wider than the heads' slices.
static void test_head_linear(kaon_backend *be, const char *set, kaon_dtype dt) {
    const int T = 5, H = 3, in = 64, out = 24, xh = in + 8, yh = out + 5;
    const size_t xt = (size_t)H * xh + 3, yt = (size_t)H * yh + 2;
    float *x = rnd_vec((size_t)T * xt, 1.0), *wf = rnd_vec((size_t)H * out * in, 0.2);
    float *y = malloc(sizeof(float) * T * yt);
    uint16_t *wb = malloc(sizeof(uint16_t) * H * out * in);
    for (int i = 0; i < H * out * in; i++) {
        wb[i] = kaon_f32_to_bf16(wf[i]);
        if (dt == KAON_BF16) wf[i] = kaon_bf16_to_f32(wb[i]);
    }
    for (size_t i = 0; i < (size_t)T * yt; i++) y[i] = -7.0f;  // untouched outside the slices
    kaon_tensor w = {.dtype = dt, .ndim = 2, .shape = {H * out, in},
                     .data = dt == KAON_BF16 ? (void *)wb : (void *)wf,
                     .nbytes = (size_t)H * out * in * (dt == KAON_BF16 ? 2 : 4)};
    const kaon_linear wl = kaon_linear_of(&w, NULL);
    be->ops->head_linear(be, x, T, H, xt, xh, &wl, y, yt, yh);
    double worst = 0;
    int kept = 1;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            for (int o = 0; o < out; o++) {
                double d = 0;
                for (int i = 0; i < in; i++) d += (double)x[t * xt + h * xh + i] * wf[((size_t)h * out + o) * in + i];
                const double e = fabs(y[t * yt + h * yh + o] - d) / (1e-5 + 1e-4 * fabs(d));
                worst = e > worst || e != e ? e : worst;
            }
            for (int o = out; o < yh; o++) kept &= y[t * yt + h * yh + o] == -7.0f;
        }
    CHECK_RATIO(worst, "head_linear", set);
    CHECK(kept);
    float src[6 * 5], dst[6 * 7];
    for (int i = 0; i < 30; i++) src[i] = (float)i;
    for (int i = 0; i < 42; i++) dst[i] = -1.0f;
    be->ops->copy_strided(be, src, 5, dst, 7, 6, 3, 0.5f);
    int ok = 1;
    for (int r = 0; r < 6; r++)
        for (int i = 0; i < 7; i++) ok &= dst[r * 7 + i] == (i < 3 ? 0.5f * src[r * 5 + i] : -1.0f);
    CHECK(ok);
    free(x); free(wf); free(y); free(wb);
}

// An FP8 KV cache: kv_write stores e4m3(x / scale) (checked code by code, saturation included),
// attention equals the reference over the decoded values code * scale, and differs from the
// unquantized one (the codes are really read). A long sequence, a prefill chunk and a decode,
// GQA group `group`, with one and two threads.
static uint8_t *fp8_codes(const float *x, size_t n, float s) {
    uint8_t *c = malloc(n);
    for (size_t i = 0; i < n; i++) c[i] = kaon_f32_to_e4m3(x[i] / s);
    return c;
}

static float *fp8_decoded(const float *x, size_t n, float s) {
    float *d = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) d[i] = kaon_e4m3_to_f32(kaon_f32_to_e4m3(x[i] / s)) * s;
    return d;
}

static void test_attention_fp8(kaon_backend *be, const char *set, int hd, int group, int window) {
    const int KVH = 2, H = KVH * group, MAXP = 200;
    const float ks = 1.0f / 64, vs = 0.01f;
    kv_layout L = {.n_seqs = 1, .max_blocks = 13, .bs = 16, .n_blocks = 13};
    shuffled_tables(&L);
    const size_t n = (size_t)MAXP * KVH * hd;
    float *kall = rnd_vec(n, 1.0), *vall = rnd_vec(n, 1.0);
    for (size_t i = 0; i < n; i += 97) kall[i] *= 4.0f;  // past 448 * ks: saturated codes
    kaon_kv_layer kv = {be->ops->alloc(be, (size_t)L.n_blocks * L.bs * KVH * hd),
                        be->ops->alloc(be, (size_t)L.n_blocks * L.bs * KVH * hd), KAON_KV_FP8, ks, vs};
    int32_t seqs[MAXP], pos[MAXP];
    for (int p = 0; p < MAXP; p++) seqs[p] = 0, pos[p] = p;
    write_tokens(be, &kv, &L, kall, vall, MAXP, seqs, pos, MAXP, KVH, hd);
    uint8_t *kc = fp8_codes(kall, n, ks), *vc = fp8_codes(vall, n, vs);
    int same = 1;
    for (int p = 0; p < MAXP; p++) {
        const size_t slot = (size_t)L.btab[p / L.bs] * L.bs + p % L.bs, row = (size_t)KVH * hd;
        same &= !memcmp((uint8_t *)kv.k + slot * row, kc + p * row, row);
        same &= !memcmp((uint8_t *)kv.v + slot * row, vc + p * row, row);
    }
    CHECK(same);
    float *kq = fp8_decoded(kall, n, ks), *vq = fp8_decoded(vall, n, vs);
    const int T = 40;  // a prefill chunk: the last 40 positions
    float *q = rnd_vec((size_t)T * H * hd, 1.0), *out = malloc(sizeof(float) * T * H * hd);
    double *ref = malloc(sizeof(double) * T * H * hd), *ref32 = malloc(sizeof(double) * T * H * hd);
    kaon_attn_meta m = {.n_tokens = T, .n_seqs = 1, .positions = pos + MAXP - T, .token_seq = seqs,
                        .block_tables = L.btab, .max_blocks = L.max_blocks, .block_size = L.bs};
    const float scale = 1.0f / sqrtf((float)hd);
    kaon_clear_error();
    be->ops->attention(be, q, &kv, &m, H, KVH, hd, scale, window, out);
    CHECK(strcmp(kaon_last_error(), "unknown error") == 0);
    ref_attention(q, kq, vq, MAXP, seqs, pos + MAXP - T, T, H, KVH, hd, scale, window, ref);
    CHECK_RATIO(err_ratio(out, ref, (size_t)T * H * hd, 1e-5, 5e-5), "attention fp8 cache", set);
    ref_attention(q, kall, vall, MAXP, seqs, pos + MAXP - T, T, H, KVH, hd, scale, window, ref32);
    double diff = 0.0;
    for (size_t i = 0; i < (size_t)T * H * hd; i++) diff = fmax(diff, fabs(ref[i] - ref32[i]));
    CHECK(diff > 1e-4);  // e4m3 keeps 3 mantissa bits: the decoded values are not the inputs
    // One decode token on one and two threads: the same values.
    kaon_backend *b1 = kaon_backend_cpu_create(1), *b2 = kaon_backend_cpu_create(2);
    float *o1 = malloc(sizeof(float) * H * hd), *o2 = malloc(sizeof(float) * H * hd);
    m.n_tokens = 1;
    m.positions = pos + MAXP - 1;
    b1->ops->attention(b1, q, &kv, &m, H, KVH, hd, scale, window, o1);
    b2->ops->attention(b2, q, &kv, &m, H, KVH, hd, scale, window, o2);
    ref_attention(q, kq, vq, MAXP, seqs, pos + MAXP - 1, 1, H, KVH, hd, scale, window, ref);
    CHECK_RATIO(err_ratio(o1, ref, (size_t)H * hd, 1e-5, 5e-5), "attention fp8 decode 1 thread", set);
    CHECK_RATIO(err_ratio(o2, ref, (size_t)H * hd, 1e-5, 5e-5), "attention fp8 decode 2 threads", set);
    b1->ops->destroy(b1);
    b2->ops->destroy(b2);
    be->ops->free(be, kv.k);
    be->ops->free(be, kv.v);
    free(L.btab); free(kall); free(vall); free(kc); free(vc); free(kq); free(vq);
    free(q); free(out); free(ref); free(ref32); free(o1); free(o2);
}

int main(void) {
    make_sets(2);
    for (int s = 0; s < n_sets; s++) {
        kaon_backend *be = sets[s].be;
        const char *nm = sets[s].name;
        fprintf(stderr, "kernel set %s\n", nm);
        test_alloc(be);
        test_embed(be, nm);
        test_get_rows_to_host(be);
        test_rmsnorm(be, nm);
        test_silu(be, nm);
        test_gelu_tanh(be, nm);
        test_scale(be);
        test_rope(be, nm);
        test_attention_mixed(be, nm, 16);
        test_attention_mixed(be, nm, 40);  // head_dim not a multiple of 32
        test_attention_mixed(be, nm, 7);   // nor of 8
        test_attention_long(be, nm);
        test_attention_mqa(be, nm);
        // Windows smaller than, equal to and larger than the contexts (40 and 85 at context 40),
        // and past them all; head dims below, at and off the SIMD widths.
        const int windows[] = {1, 7, 39, 40, 41, 85, 1000};
        for (int w = 0; w < 7; w++) test_attention_window(be, nm, 16, 40, windows[w]);
        test_attention_window(be, nm, 40, 40, 7);
        test_attention_window(be, nm, 7, 40, 41);
        test_attention_window(be, nm, 64, 100, 64);  // several 64-key chunks per window
        test_attention_fp8(be, nm, 64, 4, 0);
        test_attention_fp8(be, nm, 128, 1, 0);
        test_attention_fp8(be, nm, 40, 3, 33);  // a sliding window, head_dim off the SIMD widths
        test_mla_attention(be, nm, 4, 32, 8, 0);
        test_mla_attention(be, nm, 16, 512, 64, 0);  // DeepSeek's widths
        test_mla_attention(be, nm, 4, 32, 8, 0.02f);
        test_mla_attention(be, nm, 16, 512, 64, 0.5f);
        test_head_linear(be, nm, KAON_F32);
        test_head_linear(be, nm, KAON_BF16);
    }
    free_sets();
    TEST_MAIN_END();
}
