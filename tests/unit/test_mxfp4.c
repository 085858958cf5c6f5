// MXFP4 decoding (backend/mxfp4.h): every e2m1 nibble, E8M0 scales at the edges, the repack of
// HF/OpenAI blocks (byte j: element 2j low, 2j + 1 high) into kaon's layout (GGUF's: element
// j low, j + 16 high), and the CPU linear op over it against an f64 product.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/mxfp4.h"
#include "test.h"

static void test_decode(void) {
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int i = 0; i < 16; i++) CHECK(kaon_e2m1_to_f32((uint8_t)i) == want[i]);
    CHECK(signbit(kaon_e2m1_to_f32(8)) && !signbit(kaon_e2m1_to_f32(0)));
    CHECK(kaon_e8m0_to_f32(127) == 1.0f);
    CHECK(kaon_e8m0_to_f32(128) == 2.0f);
    CHECK(kaon_e8m0_to_f32(120) == 1.0f / 128.0f);
    CHECK(kaon_e8m0_to_f32(254) == ldexpf(1.0f, 127));
    CHECK(kaon_e8m0_to_f32(0) == ldexpf(1.0f, -127) && kaon_e8m0_to_f32(0) > 0.0f);
    CHECK(isnan(kaon_e8m0_to_f32(255)));
}

enum { M = 5, K = 64, NB = K / 32, R = 3 };

// Nibble of row m, column k (all 16 codes appear).
static uint8_t code(int m, int k) { return (uint8_t)((m * 5 + k * 7 + (m * k) % 3) & 15); }
static uint8_t scale(int m, int b) { return (uint8_t)(120 + m + 3 * b); }

static void test_repack_and_linear(void) {
    uint8_t hf[M * NB * 16], sc[M * NB], w[M * NB * KAON_MXFP4_BLOCK_BYTES];
    for (int m = 0; m < M; m++)
        for (int b = 0; b < NB; b++) {
            sc[m * NB + b] = scale(m, b);
            for (int j = 0; j < 16; j++) {
                const int k = b * 32 + 2 * j;
                hf[(m * NB + b) * 16 + j] = (uint8_t)(code(m, k) | code(m, k + 1) << 4);
            }
        }
    kaon_mxfp4_from_hf(hf, sc, M * NB, w);
    CHECK(kaon_dtype_row_bytes(KAON_MXFP4, K) == (size_t)NB * KAON_MXFP4_BLOCK_BYTES);
    float row[K];
    for (int m = 0; m < M; m++) {
        const uint8_t *blk = w + (size_t)m * NB * KAON_MXFP4_BLOCK_BYTES;
        CHECK(blk[0] == scale(m, 0) && (blk[1] & 15) == code(m, 0) && (blk[1] >> 4) == code(m, 16));
        kaon_mxfp4_dequant_row(blk, K, row);
        for (int k = 0; k < K; k++) CHECK(row[k] == kaon_e2m1_to_f32(code(m, k)) * ldexpf(1.0f, scale(m, k / 32) - 127));
    }
    float x[R * K], y[R * M], bias[M];
    for (int i = 0; i < R * K; i++) x[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    for (int m = 0; m < M; m++) bias[m] = 0.25f * (float)m;
    kaon_linear l;
    memset(&l, 0, sizeof l);
    l.w = (kaon_tensor){.dtype = KAON_MXFP4, .ndim = 2, .shape = {M, K}, .data = w, .nbytes = sizeof w};
    l.bias = (kaon_tensor){.dtype = KAON_F32, .ndim = 1, .shape = {M}, .data = bias, .nbytes = sizeof bias};
    CHECK(kaon_linear_is_mxfp4(&l) && kaon_linear_unsupported(&l) != NULL);  // device kernels: none yet
    kaon_backend *be = kaon_backend_cpu_create(2);
    CHECK(be != NULL);
    if (!be) return;
    be->ops->linear(be, x, R, &l, y);
    for (int r = 0; r < R; r++)
        for (int m = 0; m < M; m++) {
            double want = bias[m];
            for (int k = 0; k < K; k++)
                want += (double)kaon_e2m1_to_f32(code(m, k)) * ldexp(1.0, scale(m, k / 32) - 127) * (double)x[r * K + k];
            CHECK_NEAR(y[r * M + m], want, 1e-5 * (1.0 + fabs(want)));
        }
    be->ops->destroy(be);
}

int main(void) {
    test_decode();
    test_repack_and_linear();
    TEST_MAIN_END();
}
