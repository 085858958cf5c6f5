// INT4 checkpoints -> kaon's layout (model/int4_unpack.c): hand-packed words of each producer
// (AWQ's nibble order, GPTQ's packing along K with v1's zero - 1, compressed-tensors' offset
// binary with zero points packed along N), act-order permutations, and the CPU linear op over
// the layout against a plain f64 product.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/int4_unpack.h"
#include "test.h"

enum { N = 16, K = 16, GS = 8, G = K / GS };

// A value per (row, column) that differs in every nibble position: 0..15.
static int qv(int n, int k) { return (n * 7 + k * 3 + (n * k) % 5) & 15; }
static int zv(int n, int g) { return 1 + (n + 3 * g) % 15; }
static float sv(int n, int g) { return 0.01f * (float)(1 + n) + 0.5f * (float)g; }

// Nibble i of the word holds v[i].
static int32_t pack8(const int v[8]) {
    uint32_t w = 0;
    for (int i = 0; i < 8; i++) w |= (uint32_t)(v[i] & 15) << (4 * i);
    return (int32_t)w;
}

static void check_layout(const uint8_t *w, const float *s, const float *z) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            const int k = j, g = j / GS;
            const float want = ((float)qv(n, k) - (float)zv(n, g)) * sv(n, g);
            CHECK(kaon_int4_value(w, s, z, K, GS, n, j) == want);
        }
}

static void test_awq(void) {
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    int32_t qw[K * N / 8], qz[G * N / 8];
    float sc[G * N];
    for (int k = 0; k < K; k++)
        for (int c = 0; c < N / 8; c++) {
            int v[8];
            for (int i = 0; i < 8; i++) v[i] = qv(8 * c + order[i], k);
            qw[k * (N / 8) + c] = pack8(v);
        }
    for (int g = 0; g < G; g++) {
        for (int c = 0; c < N / 8; c++) {
            int v[8];
            for (int i = 0; i < 8; i++) v[i] = zv(8 * c + order[i], g);
            qz[g * (N / 8) + c] = pack8(v);
        }
        for (int n = 0; n < N; n++) sc[g * N + n] = sv(n, g);
    }
    uint8_t w[N * K / 2];
    float s[N * G], z[N * G];
    kaon_int4_from_awq(qw, qz, sc, N, K, GS, w, s, z);
    check_layout(w, s, z);
    CHECK(!kaon_int4_zero_is_default(z, N * G));
}

// GPTQ with g_idx: group of file column k is gidx[k]; v1 stores zero - 1.
static void test_gptq(const int32_t *gidx, int v1, int want_rc) {
    int32_t qw[K / 8 * N], qz[G * N / 8];
    float sc[G * N];
    for (int r = 0; r < K / 8; r++)
        for (int n = 0; n < N; n++) {
            int v[8];
            for (int i = 0; i < 8; i++) v[i] = qv(n, 8 * r + i);
            qw[r * N + n] = pack8(v);
        }
    for (int g = 0; g < G; g++) {
        for (int c = 0; c < N / 8; c++) {
            int v[8];
            for (int i = 0; i < 8; i++) v[i] = zv(8 * c + i, g) - v1;
            qz[g * (N / 8) + c] = pack8(v);
        }
        for (int n = 0; n < N; n++) sc[g * N + n] = sv(n, g);
    }
    uint8_t w[N * K / 2];
    float s[N * G], z[N * G];
    int32_t perm[K];
    const int rc = kaon_int4_from_gptq(qw, qz, sc, gidx, N, K, GS, v1, w, s, z, perm);
    CHECK(rc == want_rc);
    if (rc < 0) return;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            const int k = rc ? perm[j] : j, g = gidx ? gidx[k] : k / GS;
            CHECK(!rc || g == j / GS);  // groups made contiguous
            const float want = ((float)qv(n, k) - (float)zv(n, g)) * sv(n, g);
            CHECK(kaon_int4_value(w, s, z, K, GS, n, j) == want);
        }
}

static void test_ct(int asym) {
    int32_t packed[N * K / 8], zp[N / 8 * G];
    float sc[N * G];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < K / 8; c++) {
            int v[8];
            for (int i = 0; i < 8; i++) v[i] = qv(n, 8 * c + i);
            packed[n * (K / 8) + c] = pack8(v);
        }
    for (int r = 0; r < N / 8; r++)
        for (int g = 0; g < G; g++) {
            int v[8];
            for (int i = 0; i < 8; i++) v[i] = zv(8 * r + i, g);
            zp[r * G + g] = pack8(v);
        }
    for (int n = 0; n < N; n++)
        for (int g = 0; g < G; g++) sc[n * G + g] = sv(n, g);
    uint8_t w[N * K / 2];
    float s[N * G], z[N * G];
    int32_t perm[K];
    CHECK(kaon_int4_from_ct(packed, sc, asym ? zp : NULL, NULL, N, K, GS, w, s, z, perm) == 0);
    if (asym) {
        check_layout(w, s, z);
        return;
    }
    CHECK(kaon_int4_zero_is_default(z, N * G));
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            CHECK(kaon_int4_value(w, s, NULL, K, GS, n, k) == ((float)qv(n, k) - 8.0f) * sv(n, k / GS));
}

// The CPU op over the layout (zeros, a permutation, a bias, two threads) against f64.
static void test_cpu_linear(void) {
    enum { M = 40, KK = 48, g = 16, GG = KK / g, R = 3 };
    uint8_t w[M * KK / 2];
    float s[M * GG], z[M * GG], bias[M], x[R * KK], y[R * M];
    int32_t perm[KK];
    for (int i = 0; i < M * KK / 2; i++) w[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < M * GG; i++) {
        s[i] = 0.01f + 0.003f * (float)(i % 7);
        z[i] = (float)(i % 16);
    }
    for (int i = 0; i < M; i++) bias[i] = 0.1f * (float)(i % 3);
    for (int i = 0; i < R * KK; i++) x[i] = sinf((float)i);
    for (int k = 0; k < KK; k++) perm[k] = (k * 5) % KK;  // 5 is prime to 48
    kaon_linear l;
    memset(&l, 0, sizeof l);
    l.w = (kaon_tensor){.dtype = KAON_I4, .ndim = 2, .shape = {M, KK}, .data = w, .nbytes = sizeof w};
    l.scale = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {M, GG}, .data = s, .nbytes = sizeof s};
    l.zero = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {M, GG}, .data = z, .nbytes = sizeof z};
    l.perm = (kaon_tensor){.dtype = KAON_I32, .ndim = 1, .shape = {KK}, .data = perm, .nbytes = sizeof perm};
    l.bias = (kaon_tensor){.dtype = KAON_F32, .ndim = 1, .shape = {M}, .data = bias, .nbytes = sizeof bias};
    l.scale_block[0] = 1;
    l.scale_block[1] = g;
    CHECK(kaon_linear_is_int4(&l) && kaon_linear_unsupported(&l) != NULL);  // device kernels: none yet
    kaon_backend *be = kaon_backend_cpu_create(2);
    CHECK(be != NULL);
    if (!be) return;
    be->ops->linear(be, x, R, &l, y);
    for (int r = 0; r < R; r++)
        for (int m = 0; m < M; m++) {
            double want = bias[m];
            for (int k = 0; k < KK; k++)
                want += (double)kaon_int4_value(w, s, z, KK, g, m, k) * (double)x[r * KK + perm[k]];
            CHECK_NEAR(y[r * M + m], want, 1e-5);
        }
    be->ops->destroy(be);
}

int main(void) {
    test_awq();
    test_gptq(NULL, 1, 0);
    test_gptq(NULL, 0, 0);
    int32_t gidx[K], shuffled[K], uneven[K];
    for (int k = 0; k < K; k++) {
        gidx[k] = k / GS;
        shuffled[k] = (k * 3) % 2;  // 8 columns in each group, interleaved
        uneven[k] = k < 5 ? 0 : 1;  // 5 and 11: not groups of 8
    }
    test_gptq(gidx, 1, 0);       // trivial g_idx: no permutation
    test_gptq(shuffled, 1, 1);   // act-order: sorted by group
    test_gptq(uneven, 1, -1);
    test_ct(0);
    test_ct(1);
    test_cpu_linear();
    TEST_MAIN_END();
}
