// The CUDA backend's quantized formats (src/backend/cuda/cuda_quant_formats.cuh) run on the
// host, without a GPU: for every format, random GGUF blocks are repacked as the upload kernels
// do it, then
//   - Deq<F> (embedding rows, the large-batch path) must equal kaon's CPU dequantizer bit for
//     bit (which tests/ref/test_cpu_quant.py holds to the gguf package's);
//   - the GEMV's per-unit math (F::load, prep, loadx, dot over every unit of a row, on the
//     activations quantized by the CPU's reference quantizer and laid out unit-major with the
//     offsets k_qact uses) must equal the exact product of the dequantized weights and the
//     quantized activations up to float rounding.
// The warp-level parts (lanes, shuffles, launches) are the same for every format and are
// covered on the GPU by tests/gpu (tests/gpu/run_all.sh quant).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_quant_formats.cuh"
extern "C" {
#include "backend/cpu/cpu_internal.h"
}
#include "test.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint64_t rnd64() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rnd_u() { return (double)(rnd64() >> 11) / 9007199254740992.0; }

// Random GGUF blocks: random bytes, then f16 scales (at these byte offsets of a block) that
// keep the weights near +-0.1.
struct ScaleSpot { int off; double lo, hi; };
static std::vector<uint8_t> random_weight(kaon_dtype t, int rows, int K) {
    const size_t bb = (size_t)kaon_dtype_block_bytes(t), n = (size_t)rows * kaon_dtype_row_bytes(t, K) / bb;
    std::vector<uint8_t> w(n * bb);
    for (auto &b : w) b = (uint8_t)rnd64();
    ScaleSpot s[2] = {{0, 0.002, 0.02}, {-1, 0, 0}};
    switch (t) {
    case KAON_Q4_1: case KAON_Q5_1: s[1] = {2, -0.2, -0.1}; break;
    case KAON_Q8_0: s[0] = {0, 0.0005, 0.002}; break;
    case KAON_IQ4_NL: s[0] = {0, 0.0002, 0.002}; break;
    case KAON_Q2_K: s[0] = {(int)offsetof(kaon_block_q2_k, d), 0.0005, 0.003}; s[1] = {s[0].off + 2, 0.0005, 0.003}; break;
    case KAON_Q3_K: s[0] = {(int)offsetof(kaon_block_q3_k, d), 0.0005, 0.003}; break;
    case KAON_Q4_K: case KAON_Q5_K: s[0] = {0, 0.0005, 0.003}; s[1] = {2, 0.0005, 0.003}; break;
    case KAON_Q6_K: s[0] = {(int)offsetof(kaon_block_q6_k, d), 0.00005, 0.0003}; break;
    case KAON_IQ4_XS: s[0] = {0, 0.00002, 0.0002}; break;
    default: break;
    }
    for (size_t g = 0; g < n; g++)
        for (int i = 0; i < 2; i++) {
            if (s[i].off < 0) continue;
            const uint16_t h = kaon_f32_to_f16((float)(s[i].lo + (s[i].hi - s[i].lo) * rnd_u()));
            memcpy(&w[g * bb + (size_t)s[i].off], &h, 2);
        }
    return w;
}

template <class F> static void check_format(int rows, int K, int n) {
    const char *name = kaon_dtype_name(F::T);
    const std::vector<uint8_t> raw = random_weight(F::T, rows, K);
    // Repack as k_qrepack / k_qrepack_q6k do.
    const size_t nblk = (size_t)rows * (size_t)(K / F::BLK);
    std::vector<uint8_t> mainv(nblk * F::QB + 16), auxv(nblk * F::AB + 16);
    for (size_t g = 0; g < nblk; g++) {
        if (F::T == KAON_Q6_K) qrepack_q6k_block(&raw[g * F::GB], g, K / F::BLK, mainv.data(), auxv.data());
        else qrepack_block<F>(&raw[g * F::GB], &mainv[g * F::QB], &auxv[g * F::AB]);
    }
    const size_t qrb = (size_t)(K / F::BLK) * F::QB, arb = (size_t)(K / F::BLK) * F::AB;

    // Deq<F> against the CPU's dequantizer.
    std::vector<float> wf((size_t)rows * K);
    int deq_bad = 0;
    for (int r = 0; r < rows; r++) {
        float *ref = &wf[(size_t)r * K];
        CHECK(kaon_cpu_dequantize_row(F::T, raw.data(), r, K, ref) == 0);
        for (int j = 0; j < K / 32; j++) {
            float v[32];
            Deq<F>::run(&mainv[r * qrb], &auxv[r * arb], j, K, v);
            deq_bad += memcmp(v, ref + 32 * j, sizeof v) != 0;
        }
    }
    if (deq_bad) fprintf(stderr, "%s %dx%d: %d blocks of Deq differ from the CPU's dequantizer\n", name, rows, K, deq_bad);
    CHECK(deq_bad == 0);

    // The activations: the CPU's reference quantizer, then k_qact's unit-major layout.
    const int nb32 = K / 32, nbp = (nb32 + 7) & ~7, bpu = F::UE / 32;
    std::vector<int8_t> qs((size_t)n * nbp * 32);
    std::vector<float> d((size_t)n * nbp), s((size_t)n * nbp);
    std::vector<int16_t> s16((size_t)n * nbp * 2);
    kaon_q8_act act = {n, nb32, nbp, KAON_ACT_NATURAL, qs.data(), d.data(), s.data(), s16.data()};
    std::vector<float> x((size_t)n * K);
    for (auto &v : x) v = (float)(2.0 * rnd_u() - 1.0) * (rnd_u() < 0.02 ? 12.0f : 1.0f);
    for (int b = 0; b < n; b++) kaon_cpu_quantize_row_ref(&x[(size_t)b * K], &act, b);
    std::vector<int4> xq_um((size_t)n * K / 16);
    std::vector<float2> xds_um((size_t)n * nb32);
    std::vector<int> xsum_um((size_t)n * nb32);
    for (int b = 0; b < n; b++)
        for (int k = 0; k < nb32; k++) {
            const int8_t *src = &qs[((size_t)b * nbp + k) * 32];
            for (int h = 0; h < 2; h++)
                memcpy((int8_t *)xq_um.data() + (size_t)b * K + xq_off(k, nb32, bpu, h), src + 16 * h, 16);
            const size_t m = (size_t)b * nb32 + (size_t)xds_idx(k, nb32, bpu);
            xds_um[m] = make_float2(d[(size_t)b * nbp + k], s[(size_t)b * nbp + k]);
            const int lo = s16[((size_t)b * nbp + k) * 2], hi = s16[((size_t)b * nbp + k) * 2 + 1];
            xsum_um[m] = (int)(((unsigned)lo & 0xFFFFu) | ((unsigned)hi << 16));
        }

    // Each row's GEMV sum over all its units against the exact product in double.
    const int upr = K / F::UE;
    int gemv_bad = 0;
    double worst = 0;
    for (int b = 0; b < n; b++) {
        XRow xr;
        xr.q = (const int8_t *)xq_um.data() + (size_t)b * K;
        xr.ds = &xds_um[(size_t)b * nb32];
        xr.sum = &xsum_um[(size_t)b * nb32];
        xr.upr = upr;
        for (int r = 0; r < rows; r++) {
            float acc = 0.f;
            for (int u = 0; u < upr; u++)
                acc = F::dot(F::prep(F::load(&mainv[r * qrb], &auxv[r * arb], u, upr), u), F::loadx(xr, u), acc);
            double ref = 0, mag = 0;
            for (int e = 0; e < K; e++) {
                const double xe = (double)d[(size_t)b * nbp + e / 32] * qs[((size_t)b * nbp + e / 32) * 32 + e % 32];
                ref += (double)wf[(size_t)r * K + e] * xe;
                mag += fabs((double)wf[(size_t)r * K + e] * xe);
            }
            const double err = fabs(acc - ref), tol = 2e-5 * mag + 1e-6;
            worst = fmax(worst, err / tol);
            gemv_bad += !(err <= tol);
        }
    }
    if (gemv_bad || getenv("KAON_TEST_VERBOSE"))
        fprintf(stderr, "%s %dx%d n=%d: %d GEMV outputs off (worst %.3f of the tolerance)\n", name, rows, K, n,
                gemv_bad, worst);
    CHECK(gemv_bad == 0);
}

int main() {
    // IQ4_NL's level lookup by byte permutation, for every nibble in every byte position.
    int bad = 0;
    for (int v = 0; v < 16; v++)
        for (int pos = 0; pos < 4; pos++) {
            const unsigned in = (0x0B050A03u & ~(0xFFu << (8 * pos))) | ((unsigned)v << (8 * pos));
            const unsigned w = (unsigned)iq4_levels((int)in);
            for (int i = 0; i < 4; i++)
                bad += (int)(int8_t)(uint8_t)(w >> (8 * i)) != kaon_iq4nl_value((int)((in >> (8 * i)) & 0xF));
        }
    CHECK(bad == 0);
    const kaon_dtype types[] = {KAON_Q4_0, KAON_Q4_1, KAON_Q5_0, KAON_Q5_1, KAON_Q8_0, KAON_IQ4_NL,
                                KAON_Q2_K, KAON_Q3_K, KAON_Q4_K, KAON_Q5_K, KAON_Q6_K, KAON_IQ4_XS};
    for (kaon_dtype t : types) {
        const int big = kaon_dtype_block_elems(t) == KAON_QK_K;
        const int ks[3] = {big ? 256 : 96, big ? 512 : 320, big ? 2304 : 1024};
        for (int ki = 0; ki < 3; ki++)
            CHECK(q_visit(t, [&](auto f) { check_format<decltype(f)>(ki == 1 ? 5 : 37, ks[ki], 3); }) == 0);
    }
    fprintf(stderr, "%zu formats x 3 shapes: %s\n", sizeof types / sizeof types[0],
            kaon_test_failures ? "FAILED" : "Deq bit-exact, GEMV units within rounding");
    TEST_MAIN_END();
}
