// The GGUF block formats, declared once for every backend: C (tensor.c, the CPU kernels) and
// CUDA C++ (the device layouts and kernels) include this header.
//
// A block holds BLK consecutive elements of one row (rows are whole blocks): its f16 scales
// (stored as uint16_t, little-endian) and its packed quants, with the byte layout of ggml's
// files. The structs have only fixed-width fields of alignment <= 2, so sizeof is the file's
// block size (asserted below) and a block may start at any even offset.
//
// Beside the structs: the small integer helpers that say which bits hold element e of a block
// (the "which nibble, which bit" facts that every kernel needs), and kaon_qb_dequant32, the one
// dequantizer, bit for bit the `gguf` package's gguf.quants.dequantize (tests/ref/test_cpu_quant.py
// checks it). Element e of a block, value x:
//   Q4_0    x = d (q - 8)          q: low nibble of qs[e] (e < 16), high nibble of qs[e - 16]
//   Q4_1    x = d q + m            q: as Q4_0
//   Q5_0    x = d (q - 16)         q: as Q4_0, plus bit e of qh as bit 4
//   Q5_1    x = d q + m            q: as Q5_0
//   Q8_0    x = d q                q = qs[e] (signed)
//   IQ4_NL  x = d v[q]             q: as Q4_0; v = the 16 non-linear levels (KAON_IQ4NL_W*)
//   Q2_K    x = (d sc) q - dmin m  16 sub-blocks of 16 (scales[s]: low nibble sc, high m);
//                                  q: 2 bits of qs[32 (e / 128) + e % 32] at 2 ((e / 32) % 4)
//   Q3_K    x = (d sc) q           16 sub-blocks of 16 (6-bit signed sc, kaon_q3k_scale);
//                                  q = (2 bits as Q2_K) - 4 (bit e / 32 of hmask[e % 32] clear)
//   Q4_K    x = (d sc) q - dmin m  8 sub-blocks of 32 (6-bit sc, m: kaon_q4k_scale_min);
//                                  q: nibble (e / 32) % 2 of qs[32 (e / 64) + e % 32]
//   Q5_K    x = (d sc) q - dmin m  as Q4_K, plus bit e / 32 of qh[e % 32] as bit 4
//   Q6_K    x = (d sc) (q - 32)    16 sub-blocks of 16 (int8 sc); q: 4 bits of ql, 2 of qh
//   IQ4_XS  x = (d (ls - 32)) v[q] 8 sub-blocks of 32 (6-bit ls, kaon_iq4xs_scale);
//                                  q: as IQ4_NL within the sub-block's 16 bytes of qs
#ifndef KAON_BACKEND_QUANT_BLOCKS_H
#define KAON_BACKEND_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/tensor.h"
#include "util/half.h"
#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define KAON_STATIC_ASSERT(c, msg) static_assert(c, msg)
#define KAON_QB_FN static __host__ __device__ __forceinline__
#else
#define KAON_STATIC_ASSERT(c, msg) _Static_assert(c, msg)
#define KAON_QB_FN static inline
#endif

#define KAON_QK 32    // elements per block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (and activations)
#define KAON_QK_K 256 // elements per super-block of the K-quants and IQ4_XS
#define KAON_K_SCALE_SIZE 12  // bytes of Q4_K's / Q5_K's packed 6-bit scales and mins

typedef struct { uint16_t d; uint8_t qs[16]; } kaon_block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } kaon_block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } kaon_block_q5_0;  // qh: 32 bits, LE
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } kaon_block_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } kaon_block_q8_0;
typedef struct { uint16_t d; uint8_t qs[16]; } kaon_block_iq4_nl;
typedef struct {
    uint8_t scales[16];  // sub-block s of 16: scale (low nibble) and min (high nibble)
    uint8_t qs[64];      // 2-bit quants, 4 per byte
    uint16_t d, dmin;
} kaon_block_q2_k;
typedef struct {
    uint8_t hmask[32];   // bit 2 of each quant (set: no -4 offset)
    uint8_t qs[64];      // low 2 bits, 4 per byte
    uint8_t scales[12];  // 16 6-bit scales
    uint16_t d;
} kaon_block_q3_k;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[KAON_K_SCALE_SIZE];  // 6-bit scale and min per sub-block of 32
    uint8_t qs[128];     // 64 elements per 32 bytes: low nibbles, then high nibbles
} kaon_block_q4_k;
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[KAON_K_SCALE_SIZE];
    uint8_t qh[32];      // bit 4 of each quant: bit j of qh[l] for element 32 j + l
    uint8_t qs[128];     // low 4 bits, as Q4_K
} kaon_block_q5_k;
typedef struct {
    uint8_t ql[128];     // low 4 bits
    uint8_t qh[64];      // high 2 bits
    int8_t scales[16];
    uint16_t d;
} kaon_block_q6_k;
typedef struct {
    uint16_t d;
    uint16_t scales_h;   // bits 4-5 of the 8 sub-block scales, 2 bits each
    uint8_t scales_l[4]; // bits 0-3, a nibble each
    uint8_t qs[128];     // sub-block j: 16 bytes, low nibbles = elements 0..15
} kaon_block_iq4_xs;

KAON_STATIC_ASSERT(sizeof(kaon_block_q4_0) == 2 + KAON_QK / 2, "Q4_0 block is 18 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q4_1) == 4 + KAON_QK / 2, "Q4_1 block is 20 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q5_0) == 6 + KAON_QK / 2, "Q5_0 block is 22 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q5_1) == 8 + KAON_QK / 2, "Q5_1 block is 24 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q8_0) == 2 + KAON_QK, "Q8_0 block is 34 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_iq4_nl) == 2 + KAON_QK / 2, "IQ4_NL block is 18 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q2_k) == KAON_QK_K / 16 + KAON_QK_K / 4 + 4, "Q2_K block is 84 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q3_k) == KAON_QK_K / 8 + KAON_QK_K / 4 + 12 + 2, "Q3_K block is 110 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q4_k) == 4 + KAON_K_SCALE_SIZE + KAON_QK_K / 2, "Q4_K block is 144 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q5_k) == 4 + KAON_K_SCALE_SIZE + KAON_QK_K / 8 + KAON_QK_K / 2,
                   "Q5_K block is 176 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_q6_k) == KAON_QK_K / 2 + KAON_QK_K / 4 + KAON_QK_K / 16 + 2,
                   "Q6_K block is 210 bytes");
KAON_STATIC_ASSERT(sizeof(kaon_block_iq4_xs) == 8 + KAON_QK_K / 2, "IQ4_XS block is 136 bytes");

// IQ4_NL's 16 levels {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
// as int8 bytes, four to a little-endian word (the form byte-shuffle instructions take).
#define KAON_IQ4NL_W0 0xBFAD9881u
#define KAON_IQ4NL_W1 0xF6EADDCFu
#define KAON_IQ4NL_W2 0x26190D01u
#define KAON_IQ4NL_W3 0x71594535u

// ---- element helpers (host and device) ---------------------------------------------------------

KAON_QB_FN float kaon_qb_f16(uint16_t h) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return kaon_f16_to_f32(h);
#endif
}

// a * b and a * b - c, each product rounded on its own (no fused multiply-add: the reference
// dequantizers round every step).
KAON_QB_FN float kaon_qb_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
KAON_QB_FN float kaon_qb_mul_sub(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(__fmul_rn(a, b), c);
#else
    return a * b - c;
#endif
}
KAON_QB_FN float kaon_qb_mul_add(float a, float b, float c) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(a, b), c);
#else
    return a * b + c;
#endif
}

KAON_QB_FN uint32_t kaon_qb_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// IQ4_NL level of a nibble.
KAON_QB_FN int kaon_iq4nl_value(int q) {
    const uint32_t w = q < 8 ? (q < 4 ? KAON_IQ4NL_W0 : KAON_IQ4NL_W1) : (q < 12 ? KAON_IQ4NL_W2 : KAON_IQ4NL_W3);
    return (int)(int8_t)(uint8_t)(w >> (8 * (q & 3)));
}

// Nibble e (< 32) of a 16-byte payload: low nibbles are elements 0..15, high ones 16..31.
KAON_QB_FN int kaon_qb_nibble(const uint8_t *qs, int e) {
    return e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4);
}

// Q4_K's / Q5_K's 6-bit scale and min of sub-block j (< 8).
KAON_QB_FN void kaon_q4k_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Q3_K's scale of sub-block s (< 16), in -32..31, from scales[12] as three little-endian
// words w0, w1, w2: low 4 bits from nibble s / 8 of scales[s % 8], high 2 bits from
// scales[8 + s % 4] at bit 2 (s / 4).
KAON_QB_FN int kaon_q3k_scale(uint32_t w0, uint32_t w1, uint32_t w2, int s) {
    const int lo = (int)((((s & 4) ? w1 : w0) >> (8 * (s & 3) + 4 * (s >> 3))) & 0xF);
    const int hi = (int)((w2 >> (8 * (s & 3) + 2 * (s >> 2))) & 3);
    return (lo | (hi << 4)) - 32;
}

// The 2-bit field of Q2_K / Q3_K element e (< 256).
KAON_QB_FN int kaon_q2k_bits(const uint8_t *qs, int e) {
    return (qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3;
}

// Q3_K element e: the 2 bits, minus 4 unless bit e / 32 of hmask[e % 32] is set (-4..3).
KAON_QB_FN int kaon_q3k_value(const uint8_t *hmask, const uint8_t *qs, int e) {
    return kaon_q2k_bits(qs, e) - (((hmask[e & 31] >> (e >> 5)) & 1) ? 0 : 4);
}

// Q4_K's 4 bits of element e (< 256); Q5_K adds bit e / 32 of qh[e % 32].
KAON_QB_FN int kaon_q4k_value(const uint8_t *qs, int e) {
    return (qs[32 * (e >> 6) + (e & 31)] >> (4 * ((e >> 5) & 1))) & 0xF;
}
KAON_QB_FN int kaon_q5k_value(const uint8_t *qh, const uint8_t *qs, int e) {
    return kaon_q4k_value(qs, e) | (((qh[e & 31] >> (e >> 5)) & 1) << 4);
}

// Q6_K element e (< 256), 0..63 (the weight is this minus 32).
KAON_QB_FN int kaon_q6k_value(const uint8_t *ql, const uint8_t *qh, int e) {
    const int h = e >> 7, j = (e >> 5) & 3, l = e & 31;  // half, chunk of 32, position
    const uint8_t lo = ql[64 * h + l + 32 * (j & 1)];
    return ((j & 2) ? (lo >> 4) : (lo & 0xF)) | (((qh[32 * h + l] >> (2 * j)) & 3) << 4);
}

// IQ4_XS's scale of sub-block j (< 8), in -32..31: nibble j of scales_l (its 4 bytes as one
// little-endian word), bits 2j, 2j + 1 of scales_h above it.
KAON_QB_FN int kaon_iq4xs_scale(uint32_t scales_h, uint32_t scales_l, int j) {
    return (int)(((scales_l >> (4 * j)) & 0xF) | (((scales_h >> (2 * j)) & 3) << 4)) - 32;
}

// Whether t is one of the GGUF block formats above (Q4_0 .. IQ4_XS, contiguous in kaon_dtype).
KAON_QB_FN int kaon_qb_known(kaon_dtype t) { return t >= KAON_Q4_0 && t <= KAON_IQ4_XS; }

// Elements 32 c .. 32 c + 31 of the GGUF block at blk (format t, c < block elements / 32) as
// floats, exactly as gguf.quants.dequantize computes them. 0, or -1 for a format without blocks.
KAON_QB_FN int kaon_qb_dequant32(kaon_dtype t, const void *blk, int c, float *y) {
    const uint8_t *p = (const uint8_t *)blk;
    uint16_t h0, h1;
    memcpy(&h0, p, 2);
    memcpy(&h1, p + 2, 2);
    switch (t) {
    case KAON_Q4_0: {
        const float d = kaon_qb_f16(h0);
        for (int e = 0; e < 32; e++) y[e] = kaon_qb_mul(d, (float)(kaon_qb_nibble(p + 2, e) - 8));
        return 0;
    }
    case KAON_Q4_1: {
        const float d = kaon_qb_f16(h0), m = kaon_qb_f16(h1);
        for (int e = 0; e < 32; e++) y[e] = kaon_qb_mul_add(d, (float)kaon_qb_nibble(p + 4, e), m);
        return 0;
    }
    case KAON_Q5_0: {
        const float d = kaon_qb_f16(h0);
        const uint32_t qh = kaon_qb_u32(p + 2);
        for (int e = 0; e < 32; e++)
            y[e] = kaon_qb_mul(d, (float)((kaon_qb_nibble(p + 6, e) | (int)(((qh >> e) & 1) << 4)) - 16));
        return 0;
    }
    case KAON_Q5_1: {
        const float d = kaon_qb_f16(h0), m = kaon_qb_f16(h1);
        const uint32_t qh = kaon_qb_u32(p + 4);
        for (int e = 0; e < 32; e++)
            y[e] = kaon_qb_mul_add(d, (float)(kaon_qb_nibble(p + 8, e) | (int)(((qh >> e) & 1) << 4)), m);
        return 0;
    }
    case KAON_Q8_0: {
        const float d = kaon_qb_f16(h0);
        for (int e = 0; e < 32; e++) y[e] = kaon_qb_mul(d, (float)(int8_t)p[2 + e]);
        return 0;
    }
    case KAON_IQ4_NL: {
        const float d = kaon_qb_f16(h0);
        for (int e = 0; e < 32; e++) y[e] = kaon_qb_mul(d, (float)kaon_iq4nl_value(kaon_qb_nibble(p + 2, e)));
        return 0;
    }
    case KAON_Q2_K: {
        const kaon_block_q2_k *b = (const kaon_block_q2_k *)blk;
        const float d = kaon_qb_f16(b->d), dmin = kaon_qb_f16(b->dmin);
        for (int e = 32 * c; e < 32 * c + 32; e++) {
            const int s = b->scales[e >> 4];
            y[e - 32 * c] = kaon_qb_mul_sub(kaon_qb_mul(d, (float)(s & 0xF)), (float)kaon_q2k_bits(b->qs, e),
                                            kaon_qb_mul(dmin, (float)(s >> 4)));
        }
        return 0;
    }
    case KAON_Q3_K: {
        const kaon_block_q3_k *b = (const kaon_block_q3_k *)blk;
        const float d = kaon_qb_f16(b->d);
        for (int e = 32 * c; e < 32 * c + 32; e++)
            y[e - 32 * c] = kaon_qb_mul(kaon_qb_mul(d, (float)kaon_q3k_scale(kaon_qb_u32(b->scales), kaon_qb_u32(b->scales + 4),
                                                                         kaon_qb_u32(b->scales + 8), e >> 4)),
                                        (float)kaon_q3k_value(b->hmask, b->qs, e));
        return 0;
    }
    case KAON_Q4_K:
    case KAON_Q5_K: {
        // Both start with d, dmin, scales[12]; Q5_K's qh comes before its qs.
        const uint8_t *sc = p + 4, *qh = p + 16, *qs = t == KAON_Q4_K ? p + 16 : p + 48;
        uint8_t s, m;
        kaon_q4k_scale_min(sc, c, &s, &m);
        const float ds = kaon_qb_mul(kaon_qb_f16(h0), (float)s), dm = kaon_qb_mul(kaon_qb_f16(h1), (float)m);
        for (int e = 32 * c; e < 32 * c + 32; e++) {
            const int q = t == KAON_Q4_K ? kaon_q4k_value(qs, e) : kaon_q5k_value(qh, qs, e);
            y[e - 32 * c] = kaon_qb_mul_sub(ds, (float)q, dm);
        }
        return 0;
    }
    case KAON_Q6_K: {
        const kaon_block_q6_k *b = (const kaon_block_q6_k *)blk;
        const float d = kaon_qb_f16(b->d);
        for (int e = 32 * c; e < 32 * c + 32; e++)
            y[e - 32 * c] = kaon_qb_mul(kaon_qb_mul(d, (float)b->scales[e >> 4]),
                                        (float)(kaon_q6k_value(b->ql, b->qh, e) - 32));
        return 0;
    }
    case KAON_IQ4_XS: {
        const kaon_block_iq4_xs *b = (const kaon_block_iq4_xs *)blk;
        const float dl = kaon_qb_mul(kaon_qb_f16(b->d), (float)kaon_iq4xs_scale(b->scales_h, kaon_qb_u32(b->scales_l), c));
        for (int e = 0; e < 32; e++) y[e] = kaon_qb_mul(dl, (float)kaon_iq4nl_value(kaon_qb_nibble(b->qs + 16 * c, e)));
        return 0;
    }
    default: return -1;
    }
}

#endif
