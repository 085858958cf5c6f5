// The CUDA backend's tiled INT4 layout (src/backend/cuda/cuda_int4_layout.cuh) and the lane
// math of k_t4_gemv (cuda_int4.cu), run on the host without a GPU: random layers are repacked
// word by word as k_t4_repack does; t4_word (k_t4_dequant's inverse) must find every nibble;
// then each lane of each warp is emulated as the kernel runs it (nibble pairs into bf16
// 128 + q, minus the pair's 128 + z, x from the padded shared rows, the group counter, the
// split of chunks over 4 or 8 warps) and the products are formed by mma.m16n8k16 written out
// from the PTX ISA's fragment tables (A row-major 16x16, B col 16x8, C 16x8, per lane
// gid = lane / 4, tid = lane % 4), against an f64 reference of (q - z) * s * x.
// The warp-level parts (loads, shared memory, launches) are covered on the GPU by
// tests/gpu/test_gpu_int4.py.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_int4_layout.cuh"
#include "test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float bf2f(uint32_t b) {
    const uint32_t u = (b & 0xFFFFu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2bf_trunc(float f) {  // (only used on values exact in bf16)
    uint32_t u;
    memcpy(&u, &f, 4);
    return u >> 16;
}
static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// One layer: M rows, K columns, group g, nv activation rows, zeros or not, NW warps.
static void check_layer(int M, int K, int g, int nv, bool zero, int NW) {
    const int G = (K + g - 1) / g, Mt = (M + 15) / 16, Kc = (K + 63) / 64;
    std::vector<uint8_t> w((size_t)M * K / 2);
    for (auto &b : w) b = (uint8_t)rnd();
    std::vector<float> s((size_t)M * G), z((size_t)M * G), x((size_t)nv * K);
    for (auto &v : s) v = 0.5f + (float)(rnd() % 1000) / 1000.f;
    for (auto &v : z) v = zero ? (float)(rnd() % 16) : 8.f;
    for (auto &v : x) v = bf2f(f2bf_trunc(((int)(rnd() % 2001) - 1000) / 256.f));  // bf16 values
    const size_t nwords = (size_t)Mt * Kc * 128;
    std::vector<uint32_t> t(nwords);
    for (size_t i = 0; i < nwords; i++) t[i] = t4_repack_word(w.data(), M, K, Kc, (int64_t)i);
    int bad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            int sl;
            const size_t wi = t4_word(m, k, Kc, &sl);
            const unsigned q = (t[wi] >> (4 * sl)) & 15u, q0 = (w[m * (K / 2) + k / 2] >> (4 * (k & 1))) & 15u;
            bad += q != q0;
        }
    CHECK(bad == 0);
    std::vector<float> ps((size_t)Mt * 16 * G), pz((size_t)Mt * 16 * G);  // the pairs, as the upload makes them
    for (int rt = 0; rt < Mt; rt++)
        for (int gi = 0; gi < G; gi++)
            for (int r = 0; r < 16; r++) {
                const int m = rt * 16 + r;
                ps[((size_t)rt * G + gi) * 16 + r] = m < M ? s[(size_t)m * G + gi] : 0.f;
                pz[((size_t)rt * G + gi) * 16 + r] = t4_nz(m < M ? z[(size_t)m * G + gi] : 8.f);
            }
    const int xstride = Kc * 64 + 32;  // shared rows: zeros past K
    std::vector<uint16_t> xs((size_t)nv * xstride, 0);
    for (int r = 0; r < nv; r++)
        for (int k = 0; k < K; k++) xs[(size_t)r * xstride + k] = (uint16_t)f2bf_trunc(x[(size_t)r * K + k]);
    std::vector<double> y((size_t)nv * M, 0.0);
    const int per = (Kc + NW - 1) / NW;
    int inexact = 0;
    for (int rt = 0; rt < Mt; rt++) {
        std::vector<float> sum(32 * 4, 0.f);
        for (int warp = 0; warp < NW; warp++) {
            const int c_lo = warp * per < Kc ? warp * per : Kc, c_hi = c_lo + per < Kc ? c_lo + per : Kc;
            float acc[32][4] = {};
            const int g32 = g >> 5;
            int gc = 2 * c_lo / g32, left = g32 - 2 * c_lo % g32;
            for (int c = c_lo; c < c_hi; c++)
                for (int h = 0; h < 2; h++) {
                    const int gi = gc < G - 1 ? gc : G - 1;
                    CHECK(gi == ((64 * c + 32 * h) / g < G - 1 ? (64 * c + 32 * h) / g : G - 1));
                    if (--left == 0) gc++, left = g32;
                    float d[32][4] = {};
                    for (int tt = 0; tt < 2; tt++) {
                        uint32_t A[32][4], B[32][2];
                        for (int lane = 0; lane < 32; lane++) {
                            const int gid = lane >> 2, tid = lane & 3;
                            const uint32_t wd = t[(((size_t)rt * Kc + c) * 32 + lane) * 4 + 2 * h + tt];
                            const uint32_t z0 = fbits(pz[((size_t)rt * G + gi) * 16 + gid]);
                            const uint32_t z1 = fbits(pz[((size_t)rt * G + gi) * 16 + gid + 8]);
                            for (int r = 0; r < 4; r++) {  // lop3 then fma.rn.bf16x2 (v * 1 + nz)
                                const uint32_t v = ((wd >> (4 * r)) & 0x000F000Fu) | 0x43004300u, nz = r & 1 ? z1 : z0;
                                const float lo = bf2f(v) + bf2f(nz), hi = bf2f(v >> 16) + bf2f(nz >> 16);
                                inexact += bf2f(f2bf_trunc(lo)) != lo || bf2f(f2bf_trunc(hi)) != hi;
                                A[lane][r] = f2bf_trunc(lo) | f2bf_trunc(hi) << 16;
                            }
                            const bool xon = gid < nv;
                            const uint16_t *xr = &xs[(size_t)(xon ? gid : 0) * xstride + 8 * tid + 64 * c + 32 * h];
                            uint32_t xw[4];
                            for (int e = 0; e < 4; e++) xw[e] = xon ? (xr[2 * e] | (uint32_t)xr[2 * e + 1] << 16) : 0;
                            B[lane][0] = xw[2 * tt];
                            B[lane][1] = xw[2 * tt + 1];
                        }
                        // mma.m16n8k16 .row.col: A (row, k) in lane 4 (row % 8) + (k % 8) / 2, register
                        // (row >= 8) + 2 (k >= 8), half k % 2; B (k, n) in lane 4 n + (k % 8) / 2,
                        // register (k >= 8), half k % 2; C (row, n) in lane 4 (row % 8) + n / 2,
                        // element 2 (row >= 8) + n % 2.
                        for (int row = 0; row < 16; row++)
                            for (int n = 0; n < 8; n++) {
                                double acc_mn = 0.0;
                                for (int kk = 0; kk < 16; kk++) {
                                    const uint32_t ra = A[4 * (row % 8) + (kk % 8) / 2][(row >= 8) + 2 * (kk >= 8)];
                                    const uint32_t rb = B[4 * n + (kk % 8) / 2][kk >= 8];
                                    acc_mn += (double)bf2f(kk % 2 ? ra >> 16 : ra) * bf2f(kk % 2 ? rb >> 16 : rb);
                                }
                                d[4 * (row % 8) + n / 2][2 * (row >= 8) + n % 2] += (float)acc_mn;
                            }
                    }
                    for (int lane = 0; lane < 32; lane++) {
                        const int gid = lane >> 2;
                        const float s0 = ps[((size_t)rt * G + gi) * 16 + gid], s1 = ps[((size_t)rt * G + gi) * 16 + gid + 8];
                        acc[lane][0] = fmaf(s0, d[lane][0], acc[lane][0]);
                        acc[lane][1] = fmaf(s0, d[lane][1], acc[lane][1]);
                        acc[lane][2] = fmaf(s1, d[lane][2], acc[lane][2]);
                        acc[lane][3] = fmaf(s1, d[lane][3], acc[lane][3]);
                    }
                }
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) sum[l * 4 + i] += acc[l][i];
        }
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++) {
                const int row = rt * 16 + (lane >> 2) + (i >> 1) * 8, b = 2 * (lane & 3) + (i & 1);
                if (row < M && b < nv) y[(size_t)b * M + row] = sum[lane * 4 + i];
            }
    }
    CHECK(inexact == 0);
    double num = 0.0, den = 0.0;
    for (int b = 0; b < nv; b++)
        for (int m = 0; m < M; m++) {
            double r = 0.0;
            for (int k = 0; k < K; k++) {
                const unsigned q = (w[m * (K / 2) + k / 2] >> (4 * (k & 1))) & 15u;
                r += ((double)q - z[(size_t)m * G + k / g]) * s[(size_t)m * G + k / g] * x[(size_t)b * K + k];
            }
            const double e = y[(size_t)b * M + m] - r;
            num += e * e;
            den += r * r;
        }
    const double rel = sqrt(num / den);
    if (rel >= 1e-6) fprintf(stderr, "M %d K %d g %d nv %d zero %d NW %d: relative error %.3g\n", M, K, g, nv, zero, NW, rel);
    CHECK(rel < 1e-6);
}

// The compact row-group (t4_sz16): f16-exact scales and every zero come back as the float2
// form holds them (the same scale, the same bf16x2 -(128 + z) bits); t4_sz16_exact refuses the
// scales f16 would round.
static void check_sz16() {
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        const float s = __half2float(__float2half_rn((float)(rnd() % 100000 + 1) * 1e-6f));  // f16 values
        const float z = (float)((int)(rnd() % 255) - 127);
        const uint32_t w = t4_sz16(s, z);
        bad += !t4_sz16_exact(s) || t4_sz16_scale(w) != s || t4_sz16_nz(w) != fbits(t4_nz(z));
    }
    CHECK(bad == 0);
    CHECK(!t4_sz16_exact(0.1f));      // 0.1 is not an f16 value
    CHECK(!t4_sz16_exact(1e-9f));     // below f16's subnormals
    CHECK(!t4_sz16_exact(70000.f));   // past f16's range
    CHECK(t4_sz16_exact(0.0f) && t4_sz16_exact(0.5f) && t4_sz16_exact(0.00390625f));
    // bf16 checkpoint scales: f16 holds those from 2^-14 up (8 of f16's 11 significant bits)
    CHECK(t4_sz16_exact(bf2f(f2bf_trunc(0.0123f))));
}

int main() {
    check_sz16();
    // (M, K, g, nv, zero): the GPU tests' shapes (partial last group, K % 64 == 32, rows not a
    // multiple of 16), groups 32..256, up to 8 activation rows, and one long row (14336).
    const int cases[][5] = {{200, 512, 128, 1, 1}, {136, 256, 32, 3, 0}, {96, 352, 128, 8, 1}, {48, 96, 32, 5, 1},
                            {72, 384, 128, 2, 0},  {32, 1408, 64, 2, 1}, {40, 4096, 256, 3, 0}, {16, 14336, 128, 1, 1}};
    for (const auto &c : cases)
        for (int nw = 4; nw <= 8; nw += 4) check_layer(c[0], c[1], c[2], c[3], c[4] != 0, nw);
    TEST_MAIN_END();
}
