// MXFP4 (OCP microscaling fp4) decoding, shared by the loader, the CPU op and the tests.
// kaon's MXFP4 layout is GGUF's (KAON_MXFP4, backend/linear.h): a row of K columns is K / 32
// blocks of 17 bytes, { e8m0 scale e; qs[16] }, element j < 16 of a block in the low nibble of
// qs[j] and element j + 16 in its high nibble. Element value = e2m1(nibble) * 2^(e - 127).
#ifndef KAON_BACKEND_MXFP4_H
#define KAON_BACKEND_MXFP4_H

#include <math.h>
#include <stdint.h>

#define KAON_MXFP4_BLOCK 32
#define KAON_MXFP4_BLOCK_BYTES 17

// e2m1: sign bit 3, two exponent bits, one mantissa bit (FORMATS-2.md §7's LUT).
static inline float kaon_e2m1_to_f32(uint8_t nibble) {
    static const float lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return lut[nibble & 15];
}

// e8m0: a power of two with bias 127; 255 is NaN (OCP MX spec). 0 gives 2^-127 (subnormal).
static inline float kaon_e8m0_to_f32(uint8_t e) {
    return e == 255 ? NAN : ldexpf(1.0f, (int)e - 127);
}

// One row of K columns (K % 32 == 0) in kaon's layout -> f32. Every value is a product of two
// powers-of-two-scaled numbers, so it is exact in f32.
static inline void kaon_mxfp4_dequant_row(const uint8_t *row, int64_t K, float *out) {
    for (int64_t b = 0; b < K / KAON_MXFP4_BLOCK; b++) {
        const uint8_t *blk = row + b * KAON_MXFP4_BLOCK_BYTES;
        const float s = kaon_e8m0_to_f32(blk[0]);
        float *o = out + b * KAON_MXFP4_BLOCK;
        for (int j = 0; j < 16; j++) {
            o[j] = kaon_e2m1_to_f32(blk[1 + j] & 15) * s;
            o[j + 16] = kaon_e2m1_to_f32(blk[1 + j] >> 4) * s;
        }
    }
}

// HF/OpenAI blocks (16 bytes per 32 values: byte j holds element 2j low, 2j + 1 high) and their
// E8M0 scales, nblocks of them, -> kaon's layout (17 bytes per block) in dst.
static inline void kaon_mxfp4_from_hf(const uint8_t *blocks, const uint8_t *scales, int64_t nblocks, uint8_t *dst) {
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *in = blocks + b * 16;
        uint8_t v[32], *o = dst + b * KAON_MXFP4_BLOCK_BYTES;
        for (int j = 0; j < 16; j++) {
            v[2 * j] = in[j] & 15;
            v[2 * j + 1] = in[j] >> 4;
        }
        o[0] = scales[b];
        for (int j = 0; j < 16; j++) o[1 + j] = (uint8_t)(v[j] | v[j + 16] << 4);
    }
}

#endif
