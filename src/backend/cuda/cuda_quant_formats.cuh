// The quantized weight formats of cuda_quant.cu: how each GGUF format is laid out on the device,
// loaded, unpacked for __dp4a and dotted with the 8-bit activations, and dequantized. Every
// function here is __host__ __device__ (the loads and __dp4a have host versions), so
// tests/unit/test_cuda_quant_host.cu runs this very code on the CPU against kaon's CPU
// dequantizer and quantized dot products.
//
// Storage (made once at upload). Every format is split into a "main" region of 16-byte aligned
// quants, rows contiguous, and an "aux" region of the per-block scales (starting at the first
// 256-byte boundary after main); block g of the flat row-major order (row r, block i: g = r *
// blocks_per_row + i) sits at main + g * QB and aux + g * AB. Bytes [QOFF, QOFF + QLEN) of the
// GGUF block go to the start of its main slot, [AOFF, AOFF + ALEN) to its aux slot (the rest of
// a slot is zero padding):
//   Q4_0, IQ4_NL  main 16 B (qs[16])               aux 2 B (d)
//   Q4_1          main 16 B (qs[16])               aux 4 B (d, m)
//   Q5_0          main 16 B (qs[16])               aux 8 B (d, qh[4], 2 B padding)
//   Q5_1          main 16 B (qs[16])               aux 8 B (d, m, qh[4])
//   Q8_0          main 32 B (qs[32])               aux 2 B (d)
//   Q2_K          main 80 B (scales[16], qs[64])   aux 4 B (d, dmin)
//   Q3_K          main 112 B: the GGUF block and 2 B of padding
//   Q4_K, Q5_K    main 144 / 176 B: the GGUF block unchanged (16 B header: d, dmin, scales)
//   IQ4_XS        main 128 B (qs[128])             aux 8 B (d, scales_h, scales_l[4])
//   Q6_K          main 208 B (ql[128], qh[64], scales[16]) aux 2 B (d); inside a row the main
//                 bytes are unit-major (FQ6_K): plane j < 6 holds 16-byte chunk j of every unit
//                 (ql[64h .. 64h+63] as chunks 0-3, qh[32h .. 32h+31] as 4-5 for half h), then 8
//                 scale bytes a unit.
// The device tensor keeps the dtype and shape; its data is this layout.
//
// The GEMV's lanes stride over a row's "units" (what one lane takes per step: a block of 32 for
// Q4_0 .. IQ4_NL and IQ4_XS's sub-blocks, a Q4_K / Q5_K pair of sub-blocks, half a Q2_K / Q3_K /
// Q6_K super-block). Activation rows are quantized into a unit-major layout (XRow) so that the
// 32 lanes of a warp, which take 32 consecutive units, read 512 contiguous bytes per load.
#ifndef KAON_BACKEND_CUDA_QUANT_FORMATS_CUH
#define KAON_BACKEND_CUDA_QUANT_FORMATS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/quant_blocks.h"

#define QF static __host__ __device__ __forceinline__
#define QM __host__ __device__ __forceinline__  // (member functions)

// ---- loads and integer dot products (device instructions, host equivalents) ------------------

// Weights: streamed loads, not kept in L1 (on the host: copies).
#ifdef __CUDA_ARCH__
QF int4 ld_w16(const void *p) {
    int4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
QF int2 ld_w8(const void *p) {
    int2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.s32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
QF unsigned ld_w4(const void *p) {
    unsigned r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
QF unsigned short ld_w2(const void *p) {
    unsigned short r;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}
#else
template <class T> QF T ld_copy(const void *p) {
    T r;
    memcpy(&r, p, sizeof r);
    return r;
}
QF int4 ld_w16(const void *p) { return ld_copy<int4>(p); }
QF int2 ld_w8(const void *p) { return ld_copy<int2>(p); }
QF unsigned ld_w4(const void *p) { return ld_copy<unsigned>(p); }
QF unsigned short ld_w2(const void *p) { return ld_copy<unsigned short>(p); }
#endif
// Activations: read-only cache.
template <class T> QF T ldg(const T *p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}
// Sum of the 4 signed byte products of a and b, plus c.
QF int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(uint8_t)((unsigned)a >> (8 * i)) * (int)(int8_t)(uint8_t)((unsigned)b >> (8 * i));
    return c;
#endif
}
// Byte i of the result: byte (s >> 4i) & 7 of the 8 bytes (y:x) (selectors below 8 only).
QF unsigned byte_perm(unsigned x, unsigned y, unsigned s) {
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
#endif
}
// Per-byte a - b (modulo 256).
QF unsigned vsub4(unsigned a, unsigned b) {
#ifdef __CUDA_ARCH__
    return __vsub4(a, b);
#else
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= ((((a >> (8 * i)) & 0xFF) - ((b >> (8 * i)) & 0xFF)) & 0xFF) << (8 * i);
    return r;
#endif
}

QF float h2f(unsigned short h) { return kaon_qb_f16(h); }
// Two 16-byte loads as 8 little-endian words.
QF void words8(int4 a, int4 b, unsigned *w) {
    w[0] = (unsigned)a.x, w[1] = (unsigned)a.y, w[2] = (unsigned)a.z, w[3] = (unsigned)a.w;
    w[4] = (unsigned)b.x, w[5] = (unsigned)b.y, w[6] = (unsigned)b.z, w[7] = (unsigned)b.w;
}
QF int lo4(int v) { return v & 0x0F0F0F0F; }
QF int hi4(int v) { return (int)(((unsigned)v >> 4) & 0x0F0F0F0Fu); }

// Bit k of b (k < 4) as bit 4 of byte k: 4 elements' fifth bits (Q5_0 / Q5_1).
QF int spread4(unsigned b) {
    return (int)(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

// IQ4_NL's levels of the 4 nibbles (one a byte, 0..15) of v, as 4 int8 bytes: two byte
// permutations of the level table (indices 0..7 and 8..15), then per byte the one bit 3 picks.
QF int iq4_levels(int v) {
    const unsigned x = (unsigned)v & 0x07070707u;
    const unsigned sel = (x & 0xFu) | ((x >> 4) & 0xF0u) | ((x >> 8) & 0xF00u) | ((x >> 12) & 0xF000u);
    const unsigned lo = byte_perm(KAON_IQ4NL_W0, KAON_IQ4NL_W1, sel);
    const unsigned hi = byte_perm(KAON_IQ4NL_W2, KAON_IQ4NL_W3, sel);
    const unsigned m = (((unsigned)v >> 3) & 0x01010101u) * 0xFFu;
    return (int)((lo & ~m) | (hi & m));
}

// ---- the activations, unit-major ----------------------------------------------------------------

// Block b (< nb32) of a row, units of bpu blocks: byte offset of its values 16h .. 16h + 15 in
// the row's quants, and the index of its (d, s) and sums.
QF size_t xq_off(int b, int nb32, int bpu, int h) {
    return ((size_t)(2 * (b % bpu) + h) * (size_t)(nb32 / bpu) + (size_t)(b / bpu)) * 16;
}
QF int xds_idx(int b, int nb32, int bpu) { return (b % bpu) * (nb32 / bpu) + b / bpu; }

// One activation row as the GEMV reads it.
struct XRow {
    const int8_t *q;    // [K]: chunk j of unit u at (j * upr + u) * 16
    const float2 *ds;   // [K/32]: (d, d * sum(q)) of block k of unit u at k * upr + u
    const int *sum;     // [K/32]: sums of q over values 0..15 (low 16 bits) and 16..31 (high)
    int upr;            // units per row
};

QF int4 xchunk(const XRow &x, int j, int u) { return ldg((const int4 *)(x.q + ((size_t)j * x.upr + u) * 16)); }

// ---- formats ----------------------------------------------------------------------------------
// Each format: T its dtype, BLK elements per GGUF block of GB bytes, the device slots (above),
// UE elements per unit, UB units a lane loads per step when it computes one row (fewer for
// several rows). W: a unit's raw loads; P: the unit prepared for the integer dots (once per
// unit and row); X: a unit's activations (once per unit and activation row). dot adds the
// unit's share of the row's dot product with the CPU backend's formulas.

// Blocks of 32 whose 16 payload bytes hold elements 0..15 in the low nibbles, 16..31 in the
// high ones. P: elements 4i..4i+3 in lo[i], 16+4i.. in hi[i], as int8 bytes.
struct FQ4_0 {
    static constexpr kaon_dtype T = KAON_Q4_0;
    static constexpr int BLK = KAON_QK, GB = sizeof(kaon_block_q4_0);
    static constexpr int QOFF = offsetof(kaon_block_q4_0, qs), QLEN = 16, QB = 16, AOFF = 0, ALEN = 2, AB = 2;
    static constexpr int UE = 32, UB = 4;
    struct W { int4 q; unsigned short d; };
    struct P { int lo[4], hi[4]; float d; };
    struct X { int4 a, b; float2 ds; };
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.q = ld_w16(qr + (size_t)u * QB);
        w.d = ld_w2(ar + (size_t)u * AB);
        return w;
    }
    QF void nibbles(int4 q, P &p) {
        const int v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] = lo4(v[i]);
            p.hi[i] = hi4(v[i]);
        }
    }
    QF P prep(const W &w, int) {
        P p;
        nibbles(w.q, p);
        p.d = h2f(w.d);
        return p;
    }
    QF X loadx(const XRow &x, int u) {
        X r;
        r.a = xchunk(x, 0, u);  // values 0..15 of block u
        r.b = xchunk(x, 1, u);  // values 16..31
        r.ds = ldg(x.ds + u);
        return r;
    }
    QF int idot(const P &p, const X &x) {
        int s = 0;
        s = dp4a(p.lo[0], x.a.x, s);
        s = dp4a(p.lo[1], x.a.y, s);
        s = dp4a(p.lo[2], x.a.z, s);
        s = dp4a(p.lo[3], x.a.w, s);
        s = dp4a(p.hi[0], x.b.x, s);
        s = dp4a(p.hi[1], x.b.y, s);
        s = dp4a(p.hi[2], x.b.z, s);
        s = dp4a(p.hi[3], x.b.w, s);
        return s;
    }
    // CPU: dw * (dx * isum) - 8 dw sx
    QF float dot(const P &p, const X &x, float acc) { return acc + p.d * (x.ds.x * (float)idot(p, x) - 8.f * x.ds.y); }
};

struct FQ4_1 {
    static constexpr kaon_dtype T = KAON_Q4_1;
    static constexpr int BLK = KAON_QK, GB = sizeof(kaon_block_q4_1);
    static constexpr int QOFF = offsetof(kaon_block_q4_1, qs), QLEN = 16, QB = 16, AOFF = 0, ALEN = 4, AB = 4;
    static constexpr int UE = 32, UB = 4;
    struct W { int4 q; unsigned dm; };
    struct P { FQ4_0::P p; float m; };
    typedef FQ4_0::X X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.q = ld_w16(qr + (size_t)u * QB);
        w.dm = ld_w4(ar + (size_t)u * AB);
        return w;
    }
    QF P prep(const W &w, int) {
        P p;
        FQ4_0::nibbles(w.q, p.p);
        p.p.d = h2f((unsigned short)(w.dm & 0xFFFF));
        p.m = h2f((unsigned short)(w.dm >> 16));
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    // CPU: dw * (dx * isum) + m sx
    QF float dot(const P &p, const X &x, float acc) {
        return acc + p.p.d * (x.ds.x * (float)FQ4_0::idot(p.p, x)) + p.m * x.ds.y;
    }
};

// Q5_0 / Q5_1: Q4_0 / Q4_1 with a fifth bit per element from qh (bit e for element e). aux is
// [d, qh] + padding or [d, m, qh]: one 8-byte load.
struct FQ5_0 {
    static constexpr kaon_dtype T = KAON_Q5_0;
    static constexpr int BLK = KAON_QK, GB = sizeof(kaon_block_q5_0);
    static constexpr int QOFF = offsetof(kaon_block_q5_0, qs), QLEN = 16, QB = 16, AOFF = 0, ALEN = 6, AB = 8;
    static constexpr int UE = 32, UB = 4;
    struct W { int4 q; int2 a; };
    typedef FQ4_0::P P;
    typedef FQ4_0::X X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.q = ld_w16(qr + (size_t)u * QB);
        w.a = ld_w8(ar + (size_t)u * AB);
        return w;
    }
    // The fifth bits of qh onto the nibbles of p.
    QF void top_bits(unsigned qh, P &p) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] |= spread4(qh >> (4 * i));
            p.hi[i] |= spread4(qh >> (16 + 4 * i));
        }
    }
    QF P prep(const W &w, int) {
        P p;
        FQ4_0::nibbles(w.q, p);
        top_bits(((unsigned)w.a.x >> 16) | ((unsigned)w.a.y << 16), p);  // qh at aux bytes 2..5
        p.d = h2f((unsigned short)((unsigned)w.a.x & 0xFFFF));
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    // CPU: dw * (dx * isum) - 16 dw sx
    QF float dot(const P &p, const X &x, float acc) { return acc + p.d * (x.ds.x * (float)FQ4_0::idot(p, x) - 16.f * x.ds.y); }
};

struct FQ5_1 {
    static constexpr kaon_dtype T = KAON_Q5_1;
    static constexpr int BLK = KAON_QK, GB = sizeof(kaon_block_q5_1);
    static constexpr int QOFF = offsetof(kaon_block_q5_1, qs), QLEN = 16, QB = 16, AOFF = 0, ALEN = 8, AB = 8;
    static constexpr int UE = 32, UB = 4;
    typedef FQ5_0::W W;
    typedef FQ4_1::P P;
    typedef FQ4_0::X X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int upr) { return FQ5_0::load(qr, ar, u, upr); }
    QF P prep(const W &w, int) {
        P p;
        FQ4_0::nibbles(w.q, p.p);
        FQ5_0::top_bits((unsigned)w.a.y, p.p);  // qh at aux bytes 4..7
        p.p.d = h2f((unsigned short)((unsigned)w.a.x & 0xFFFF));
        p.m = h2f((unsigned short)((unsigned)w.a.x >> 16));
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    QF float dot(const P &p, const X &x, float acc) { return FQ4_1::dot(p, x, acc); }
};

struct FQ8_0 {
    static constexpr kaon_dtype T = KAON_Q8_0;
    static constexpr int BLK = KAON_QK, GB = sizeof(kaon_block_q8_0);
    static constexpr int QOFF = offsetof(kaon_block_q8_0, qs), QLEN = 32, QB = 32, AOFF = 0, ALEN = 2, AB = 2;
    static constexpr int UE = 32, UB = 2;
    struct W { int4 a, b; unsigned short d; };
    struct P { int4 a, b; float d; };
    typedef FQ4_0::X X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.a = ld_w16(qr + (size_t)u * QB);
        w.b = ld_w16(qr + (size_t)u * QB + 16);
        w.d = ld_w2(ar + (size_t)u * AB);
        return w;
    }
    QF P prep(const W &w, int) {
        P p;
        p.a = w.a;
        p.b = w.b;
        p.d = h2f(w.d);
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    // CPU: dw * (dx * isum)
    QF float dot(const P &p, const X &x, float acc) {
        int s = 0;
        s = dp4a(p.a.x, x.a.x, s);
        s = dp4a(p.a.y, x.a.y, s);
        s = dp4a(p.a.z, x.a.z, s);
        s = dp4a(p.a.w, x.a.w, s);
        s = dp4a(p.b.x, x.b.x, s);
        s = dp4a(p.b.y, x.b.y, s);
        s = dp4a(p.b.z, x.b.z, s);
        s = dp4a(p.b.w, x.b.w, s);
        return acc + p.d * (x.ds.x * (float)s);
    }
};

// IQ4_NL: Q4_0's layout, each nibble standing for a signed level (iq4_levels).
struct FIQ4_NL {
    static constexpr kaon_dtype T = KAON_IQ4_NL;
    static constexpr int BLK = KAON_QK, GB = sizeof(kaon_block_iq4_nl);
    static constexpr int QOFF = offsetof(kaon_block_iq4_nl, qs), QLEN = 16, QB = 16, AOFF = 0, ALEN = 2, AB = 2;
    static constexpr int UE = 32, UB = 4;
    typedef FQ4_0::W W;
    typedef FQ4_0::P P;
    typedef FQ4_0::X X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int upr) { return FQ4_0::load(qr, ar, u, upr); }
    QF void levels(int4 q, P &p) {
        FQ4_0::nibbles(q, p);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] = iq4_levels(p.lo[i]);
            p.hi[i] = iq4_levels(p.hi[i]);
        }
    }
    QF P prep(const W &w, int) {
        P p;
        levels(w.q, p);
        p.d = h2f(w.d);
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    // CPU: dw * (dx * isum)
    QF float dot(const P &p, const X &x, float acc) { return acc + p.d * (x.ds.x * (float)FQ4_0::idot(p, x)); }
};

// IQ4_XS: unit u = sub-block u % 8 of super-block u / 8 (its 16 bytes of qs hold the block's
// nibbles as IQ4_NL's do), with the scale d (ls - 32) from the super-block's 8 aux bytes.
struct FIQ4_XS {
    static constexpr kaon_dtype T = KAON_IQ4_XS;
    static constexpr int BLK = KAON_QK_K, GB = sizeof(kaon_block_iq4_xs);
    static constexpr int QOFF = offsetof(kaon_block_iq4_xs, qs), QLEN = 128, QB = 128, AOFF = 0,
                         ALEN = offsetof(kaon_block_iq4_xs, qs), AB = 8;
    static constexpr int UE = 32, UB = 4;
    struct W { int4 q; int2 a; };
    typedef FQ4_0::P P;
    typedef FQ4_0::X X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.q = ld_w16(qr + (size_t)u * 16);
        w.a = ld_w8(ar + (size_t)(u >> 3) * AB);
        return w;
    }
    QF P prep(const W &w, int u) {
        P p;
        FIQ4_NL::levels(w.q, p);
        const unsigned a = (unsigned)w.a.x;  // d, scales_h; then scales_l in w.a.y
        p.d = h2f((unsigned short)(a & 0xFFFF)) * (float)kaon_iq4xs_scale(a >> 16, (unsigned)w.a.y, u & 7);
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    QF float dot(const P &p, const X &x, float acc) { return FIQ4_NL::dot(p, x, acc); }
};

// Q4_K / Q5_K: unit u = sub-blocks 2p and 2p+1 (p = u % 4) of super-block u / 4, i.e. activation
// blocks 2u and 2u+1. Their 64 values are the low and the high nibbles of qs[32p .. 32p+31]
// (Q5_K: plus bits 2p and 2p+1 of qh[0..31] as bit 4).
struct FQ4_K {
    static constexpr kaon_dtype T = KAON_Q4_K;
    static constexpr int BLK = KAON_QK_K, GB = sizeof(kaon_block_q4_k);
    static constexpr int QOFF = 0, QLEN = GB, QB = GB, AOFF = 0, ALEN = 0, AB = 0;
    static constexpr int UE = 64, UB = 2;
    static constexpr int QS = offsetof(kaon_block_q4_k, qs);
    struct W { int4 h, a, b; };
    struct P { int lo[8], hi[8]; float d0, d1, m0, m1; };
    struct X { int4 a0, a1, b0, b1; float2 ds0, ds1; };
    // The 16-byte header (d, dmin, scales[12]) and qs[32p .. 32p+31] of a block of GB bytes.
    QF W load_at(const uint8_t *blk, int qs, int u) {
        W w;
        w.h = ld_w16(blk);
        w.a = ld_w16(blk + qs + 32 * (u & 3));
        w.b = ld_w16(blk + qs + 32 * (u & 3) + 16);
        return w;
    }
    QF W load(const uint8_t *qr, const uint8_t *, int u, int) { return load_at(qr + (size_t)(u >> 2) * QB, QS, u); }
    QF P prep(const W &w, int u) {
        P p;
        const int q[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            p.lo[i] = lo4(q[i]);
            p.hi[i] = hi4(q[i]);
        }
        // 6-bit scales and mins of sub-blocks j = 2p, 2p+1 (scales[12] = bytes 4..15 = h.y, h.z,
        // h.w): j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
        // m = (s[j+4] >> 4) | (s[j] >> 6) << 4. Byte j & 3 of each word: j & 3 = 2 (p & 1).
        const int p4 = u & 3, sh = 16 * (p4 & 1);
        const unsigned Y = (unsigned)w.h.y >> sh, Z = (unsigned)w.h.z >> sh, V = (unsigned)w.h.w >> sh;
        unsigned sc0, sc1, m0, m1;
        if (p4 < 2) {
            sc0 = Y & 63;
            sc1 = (Y >> 8) & 63;
            m0 = Z & 63;
            m1 = (Z >> 8) & 63;
        } else {
            sc0 = (V & 0xF) | (((Y >> 6) & 3) << 4);
            sc1 = ((V >> 8) & 0xF) | (((Y >> 14) & 3) << 4);
            m0 = ((V >> 4) & 0xF) | (((Z >> 6) & 3) << 4);
            m1 = ((V >> 12) & 0xF) | (((Z >> 14) & 3) << 4);
        }
        const float d = h2f((unsigned short)((unsigned)w.h.x & 0xFFFF));
        const float dmin = h2f((unsigned short)((unsigned)w.h.x >> 16));
        p.d0 = d * (float)sc0;
        p.d1 = d * (float)sc1;
        p.m0 = dmin * (float)m0;
        p.m1 = dmin * (float)m1;
        return p;
    }
    QF X loadx(const XRow &x, int u) {
        X r;
        r.a0 = xchunk(x, 0, u);  // block 2u, values 0..15
        r.a1 = xchunk(x, 1, u);  // block 2u, values 16..31
        r.b0 = xchunk(x, 2, u);  // block 2u+1
        r.b1 = xchunk(x, 3, u);
        r.ds0 = ldg(x.ds + u);
        r.ds1 = ldg(x.ds + x.upr + u);
        return r;
    }
    // CPU, per sub-block: d sc (dx isum) - dmin m sx
    QF float dot(const P &p, const X &x, float acc) {
        int s0 = 0, s1 = 0;
        s0 = dp4a(p.lo[0], x.a0.x, s0);
        s0 = dp4a(p.lo[1], x.a0.y, s0);
        s0 = dp4a(p.lo[2], x.a0.z, s0);
        s0 = dp4a(p.lo[3], x.a0.w, s0);
        s0 = dp4a(p.lo[4], x.a1.x, s0);
        s0 = dp4a(p.lo[5], x.a1.y, s0);
        s0 = dp4a(p.lo[6], x.a1.z, s0);
        s0 = dp4a(p.lo[7], x.a1.w, s0);
        s1 = dp4a(p.hi[0], x.b0.x, s1);
        s1 = dp4a(p.hi[1], x.b0.y, s1);
        s1 = dp4a(p.hi[2], x.b0.z, s1);
        s1 = dp4a(p.hi[3], x.b0.w, s1);
        s1 = dp4a(p.hi[4], x.b1.x, s1);
        s1 = dp4a(p.hi[5], x.b1.y, s1);
        s1 = dp4a(p.hi[6], x.b1.z, s1);
        s1 = dp4a(p.hi[7], x.b1.w, s1);
        acc += p.d0 * (x.ds0.x * (float)s0) - p.m0 * x.ds0.y;
        return acc + p.d1 * (x.ds1.x * (float)s1) - p.m1 * x.ds1.y;
    }
};

struct FQ5_K {
    static constexpr kaon_dtype T = KAON_Q5_K;
    static constexpr int BLK = KAON_QK_K, GB = sizeof(kaon_block_q5_k);
    static constexpr int QOFF = 0, QLEN = GB, QB = GB, AOFF = 0, ALEN = 0, AB = 0;
    static constexpr int UE = 64, UB = 2;
    struct W { FQ4_K::W w; int4 h0, h1; };
    typedef FQ4_K::P P;
    typedef FQ4_K::X X;
    QF W load(const uint8_t *qr, const uint8_t *, int u, int) {
        const uint8_t *blk = qr + (size_t)(u >> 2) * QB;
        W w;
        w.w = FQ4_K::load_at(blk, offsetof(kaon_block_q5_k, qs), u);
        w.h0 = ld_w16(blk + offsetof(kaon_block_q5_k, qh));
        w.h1 = ld_w16(blk + offsetof(kaon_block_q5_k, qh) + 16);
        return w;
    }
    QF P prep(const W &w, int u) {
        P p = FQ4_K::prep(w.w, u);
        const int qh[8] = {w.h0.x, w.h0.y, w.h0.z, w.h0.w, w.h1.x, w.h1.y, w.h1.z, w.h1.w};
        const int s = 2 * (u & 3);  // sub-block 2p's bit; 2p+1's is the next
#pragma unroll
        for (int i = 0; i < 8; i++) {
            p.lo[i] |= (int)((((unsigned)qh[i] >> s) & 0x01010101u) << 4);
            p.hi[i] |= (int)((((unsigned)qh[i] >> (s + 1)) & 0x01010101u) << 4);
        }
        return p;
    }
    QF X loadx(const XRow &x, int u) { return FQ4_K::loadx(x, u); }
    QF float dot(const P &p, const X &x, float acc) { return FQ4_K::dot(p, x, acc); }
};

// The formats of half super-blocks (Q2_K, Q3_K, Q6_K): unit u = half hh = u % 2 of super-block
// u / 2, its chunks k = 0..3 of 32 values are activation blocks 4u + k, and each chunk's two
// halves of 16 have their own scales.
struct XHalf {
    int4 v[4][2];  // chunk k: values 0..15, 16..31
    float d[4];
    int sum[4];    // the sums of the two halves (16 bits each)
    QF XHalf load(const XRow &x, int u) {
        XHalf r;
#pragma unroll
        for (int k = 0; k < 4; k++) {  // block 4u + k
            r.v[k][0] = xchunk(x, 2 * k, u);
            r.v[k][1] = xchunk(x, 2 * k + 1, u);
            r.d[k] = ldg(&x.ds[k * x.upr + u].x);
            r.sum[k] = ldg(x.sum + k * x.upr + u);
        }
        return r;
    }
    QM int lo_sum(int k) const { return (int)(int16_t)(sum[k] & 0xFFFF); }
    QM int hi_sum(int k) const { return sum[k] >> 16; }
    // The integer dots of chunk k's halves with 8 words of weight bytes.
    QM void dots(const int *q, int k, int &t0, int &t1) const {
        t0 = t1 = 0;
        t0 = dp4a(q[0], v[k][0].x, t0);
        t0 = dp4a(q[1], v[k][0].y, t0);
        t0 = dp4a(q[2], v[k][0].z, t0);
        t0 = dp4a(q[3], v[k][0].w, t0);
        t1 = dp4a(q[4], v[k][1].x, t1);
        t1 = dp4a(q[5], v[k][1].y, t1);
        t1 = dp4a(q[6], v[k][1].z, t1);
        t1 = dp4a(q[7], v[k][1].w, t1);
    }
    // sc[2k] (q . values 0..15) + sc[2k+1] (q . values 16..31) of chunk k.
    QM int scaled(const int *q, const int *sc, int k) const {
        int t0, t1;
        dots(q, k, t0, t1);
        return sc[2 * k] * t0 + sc[2 * k + 1] * t1;
    }
};

// Q2_K: chunk k of half hh: bits 2k, 2k+1 of qs[32 hh + l]; halves' scale and min nibbles in
// scales[8 hh + 2k + c].
struct FQ2_K {
    static constexpr kaon_dtype T = KAON_Q2_K;
    static constexpr int BLK = KAON_QK_K, GB = sizeof(kaon_block_q2_k);
    static constexpr int QOFF = 0, QLEN = offsetof(kaon_block_q2_k, d), QB = QLEN, AOFF = QLEN, ALEN = 4, AB = 4;
    static constexpr int UE = 128, UB = 2;
    static constexpr int QS = offsetof(kaon_block_q2_k, qs);
    struct W { int4 a, b; int2 sc; unsigned dd; };
    struct P { int q[4][8]; int sc[8], m[8]; float d, dmin; };
    typedef XHalf X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        const uint8_t *blk = qr + (size_t)(u >> 1) * QB;
        const int hh = u & 1;
        W w;
        w.a = ld_w16(blk + QS + 32 * hh);
        w.b = ld_w16(blk + QS + 32 * hh + 16);
        w.sc = ld_w8(blk + 8 * hh);
        w.dd = ld_w4(ar + (size_t)(u >> 1) * AB);
        return w;
    }
    QF P prep(const W &w, int) {
        P p;
        unsigned A[8];
        words8(w.a, w.b, A);
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) p.q[k][e] = (int)((A[e] >> (2 * k)) & 0x03030303u);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned s = ((unsigned)(i < 4 ? w.sc.x : w.sc.y) >> (8 * (i & 3))) & 0xFF;
            p.sc[i] = (int)(s & 0xF);
            p.m[i] = (int)(s >> 4);
        }
        p.d = h2f((unsigned short)(w.dd & 0xFFFF));
        p.dmin = h2f((unsigned short)(w.dd >> 16));
        return p;
    }
    QF X loadx(const XRow &x, int u) { return XHalf::load(x, u); }
    // CPU, per block: d (dx isum) - dmin (dx msum), isum = sc . (q . x) and msum = m . sums over
    // the two halves.
    QF float dot(const P &p, const X &x, float acc) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int isum = x.scaled(p.q[k], p.sc, k);
            const int msum = p.m[2 * k] * x.lo_sum(k) + p.m[2 * k + 1] * x.hi_sum(k);
            acc += p.d * (x.d[k] * (float)isum) - p.dmin * (x.d[k] * (float)msum);
        }
        return acc;
    }
};

// Q3_K: chunk k of half hh: bits 2k, 2k+1 of qs[32 hh + l], minus 4 unless bit 4 hh + k of
// hmask[l] is set; the halves' 6-bit scales s = 8 hh + 2k + c (kaon_q3k_scale).
struct FQ3_K {
    static constexpr kaon_dtype T = KAON_Q3_K;
    static constexpr int BLK = KAON_QK_K, GB = sizeof(kaon_block_q3_k);
    static constexpr int QOFF = 0, QLEN = GB, QB = 112, AOFF = 0, ALEN = 0, AB = 0;
    static constexpr int UE = 128, UB = 2;
    static constexpr int QS = offsetof(kaon_block_q3_k, qs), SC = offsetof(kaon_block_q3_k, scales);
    struct W { int4 h0, h1, a, b, t; };
    struct P { int q[4][8]; int sc[8]; float d; };
    typedef XHalf X;
    QF W load(const uint8_t *qr, const uint8_t *, int u, int) {
        const uint8_t *blk = qr + (size_t)(u >> 1) * QB;
        const int hh = u & 1;
        W w;
        w.h0 = ld_w16(blk);
        w.h1 = ld_w16(blk + 16);
        w.a = ld_w16(blk + QS + 32 * hh);
        w.b = ld_w16(blk + QS + 32 * hh + 16);
        w.t = ld_w16(blk + SC);  // scales[12], d, padding
        return w;
    }
    QF P prep(const W &w, int u) {
        P p;
        const int hh = u & 1;
        unsigned A[8], H[8];
        words8(w.a, w.b, A);
        words8(w.h0, w.h1, H);
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const unsigned v = ((A[e] >> (2 * k)) & 0x03030303u) | (((H[e] >> (4 * hh + k)) & 0x01010101u) << 2);
                p.q[k][e] = (int)vsub4(v, 0x04040404u);  // -4 .. 3 as int8 bytes
            }
#pragma unroll
        for (int i = 0; i < 8; i++) p.sc[i] = kaon_q3k_scale((unsigned)w.t.x, (unsigned)w.t.y, (unsigned)w.t.z, 8 * hh + i);
        p.d = h2f((unsigned short)((unsigned)w.t.w & 0xFFFF));
        return p;
    }
    QF X loadx(const XRow &x, int u) { return XHalf::load(x, u); }
    // CPU, per block: d (dx isum), isum = sc . (q . x) over the two halves.
    QF float dot(const P &p, const X &x, float acc) {
#pragma unroll
        for (int k = 0; k < 4; k++) acc += p.d * (x.d[k] * (float)x.scaled(p.q[k], p.sc, k));
        return acc;
    }
};

// Q6_K: value l (< 32) of chunk k: low 4 bits from ql[64 hh + l + 32 (k & 1)] (low nibble for
// k < 2, high for k >= 2), high 2 bits from bits 2k, 2k+1 of qh[32 hh + l]; q - 32, times
// scales[8 hh + 2k + l / 16]. Stored unit-major (top): a0, a1, b0, b1 = ql[64 hh + 0, 16, 32,
// 48 ..], h0, h1 = qh[32 hh + 0, 16 ..] are planes 0-5, sc = scales[8 hh ..].
struct FQ6_K {
    static constexpr kaon_dtype T = KAON_Q6_K;
    static constexpr int BLK = KAON_QK_K, GB = sizeof(kaon_block_q6_k);
    static constexpr int QOFF = 0, QLEN = offsetof(kaon_block_q6_k, d), QB = QLEN, AOFF = QLEN, ALEN = 2, AB = 2;
    static constexpr int UE = 128, UB = 1;
    struct W { int4 a0, a1, b0, b1, h0, h1; int2 sc; unsigned short d; };
    struct P { int q[4][8]; int sc[4][2]; float d; };
    typedef XHalf X;
    QF W load(const uint8_t *qr, const uint8_t *ar, int u, int upr) {
        const uint8_t *c = qr + (size_t)u * 16;
        const size_t plane = (size_t)upr * 16;
        W w;
        w.a0 = ld_w16(c);
        w.a1 = ld_w16(c + plane);
        w.b0 = ld_w16(c + 2 * plane);
        w.b1 = ld_w16(c + 3 * plane);
        w.h0 = ld_w16(c + 4 * plane);
        w.h1 = ld_w16(c + 5 * plane);
        w.sc = ld_w8(qr + 6 * plane + (size_t)u * 8);
        w.d = ld_w2(ar + (size_t)(u >> 1) * AB);
        return w;
    }
    QF P prep(const W &w, int) {
        P p;
        const int A[2][4] = {{w.a0.x, w.a0.y, w.a0.z, w.a0.w}, {w.a1.x, w.a1.y, w.a1.z, w.a1.w}};
        const int B[2][4] = {{w.b0.x, w.b0.y, w.b0.z, w.b0.w}, {w.b1.x, w.b1.y, w.b1.z, w.b1.w}};
        const int H[2][4] = {{w.h0.x, w.h0.y, w.h0.z, w.h0.w}, {w.h1.x, w.h1.y, w.h1.z, w.h1.w}};
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned a = (unsigned)A[c][e], bq = (unsigned)B[c][e], h = (unsigned)H[c][e];
                p.q[0][4 * c + e] = (int)((a & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4));
                p.q[1][4 * c + e] = (int)((bq & 0x0F0F0F0Fu) | (((h >> 2) & 0x03030303u) << 4));
                p.q[2][4 * c + e] = (int)(((a >> 4) & 0x0F0F0F0Fu) | (((h >> 4) & 0x03030303u) << 4));
                p.q[3][4 * c + e] = (int)(((bq >> 4) & 0x0F0F0F0Fu) | (((h >> 6) & 0x03030303u) << 4));
            }
        // scales[8 hh + 2k + c]: byte 2k + c of the 8 loaded.
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int byte = 2 * k + c;
                const unsigned word = (unsigned)(byte < 4 ? w.sc.x : w.sc.y);
                p.sc[k][c] = (int)(int8_t)((word >> (8 * (byte & 3))) & 0xFF);
            }
        p.d = h2f(w.d);
        return p;
    }
    QF X loadx(const XRow &x, int u) { return XHalf::load(x, u); }
    // CPU, per block: dw * (dx * isum), isum = sum over both halves of sc * (q - 32) * x.
    QF float dot(const P &p, const X &x, float acc) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int t0, t1;
            x.dots(p.q[k], k, t0, t1);
            const int isum = p.sc[k][0] * (t0 - 32 * x.lo_sum(k)) + p.sc[k][1] * (t1 - 32 * x.hi_sum(k));
            acc += p.d * (x.d[k] * (float)isum);
        }
        return acc;
    }
};

// ---- upload: GGUF blocks -> the device layout ---------------------------------------------------

// GGUF block src (GB bytes) into its main and aux slots.
template <class F> QF void qrepack_block(const uint8_t *src, uint8_t *m, uint8_t *a) {
    for (int i = 0; i < F::QB; i++) m[i] = i < F::QLEN ? src[F::QOFF + i] : 0;
    for (int i = 0; i < F::AB; i++) a[i] = i < F::ALEN ? src[F::AOFF + i] : 0;
}

// Q6_K: super-block g (row g / nsb, i = g % nsb) into its row's unit-major planes (FQ6_K).
QF void qrepack_q6k_block(const uint8_t *s, size_t g, int nsb, uint8_t *mainp, uint8_t *auxp) {
    const size_t row = g / (size_t)nsb, i = g % (size_t)nsb, upr = 2 * (size_t)nsb, plane = upr * 16;
    uint8_t *rb = mainp + row * (size_t)nsb * FQ6_K::QB;
    for (int hh = 0; hh < 2; hh++) {
        const size_t u = 2 * i + (size_t)hh;
        for (int j = 0; j < 6; j++) {
            const uint8_t *from = j < 4 ? s + offsetof(kaon_block_q6_k, ql) + 64 * hh + 16 * j
                                        : s + offsetof(kaon_block_q6_k, qh) + 32 * hh + 16 * (j - 4);
            uint8_t *to = rb + (size_t)j * plane + u * 16;
            for (int e = 0; e < 16; e++) to[e] = from[e];
        }
        for (int e = 0; e < 8; e++) rb[6 * plane + u * 8 + e] = s[offsetof(kaon_block_q6_k, scales) + 8 * hh + e];
    }
    auxp[g * FQ6_K::AB] = s[offsetof(kaon_block_q6_k, d)];
    auxp[g * FQ6_K::AB + 1] = s[offsetof(kaon_block_q6_k, d) + 1];
}

// ---- dequantization of one block of 32 values (embedding rows, the large-batch path) -----------
// Block j of a row (row pointers into main and aux), exactly gguf's values (kaon_qb_dequant32):
// the GGUF block is read in place where main holds it whole, else put back together first.

template <class F> struct Deq {
    QF void run(const uint8_t *qr, const uint8_t *ar, int j, int, float *v) {
        const int bi = j / (F::BLK / 32), c = j % (F::BLK / 32);
        if constexpr (F::QOFF == 0 && F::QLEN == F::GB) {
            kaon_qb_dequant32(F::T, qr + (size_t)bi * F::QB, c, v);
        } else {
            uint8_t blk[F::GB];
            for (int i = 0; i < F::QLEN; i++) blk[F::QOFF + i] = qr[(size_t)bi * F::QB + i];
            for (int i = 0; i < F::ALEN; i++) blk[F::AOFF + i] = ar[(size_t)bi * F::AB + i];
            kaon_qb_dequant32(F::T, blk, c, v);
        }
    }
};
template <> struct Deq<FQ6_K> {
    // Block j = chunk c = j % 8 of super-block j / 8: unit u = 2 (j / 8) + c / 4, k = c % 4.
    QF void run(const uint8_t *qr, const uint8_t *ar, int j, int K, float *v) {
        const int upr = K / FQ6_K::UE, c = j & 7, u = 2 * (j >> 3) + (c >> 2), k = c & 3;
        const size_t plane = (size_t)upr * 16;
        const int8_t *sc = (const int8_t *)(qr + 6 * plane + (size_t)u * 8);
        const float d = h2f((unsigned short)(ar[(size_t)(j >> 3) * 2] | (ar[(size_t)(j >> 3) * 2 + 1] << 8)));
        for (int l = 0; l < 32; l++) {
            const size_t o = (size_t)u * 16 + (l & 15), half = (size_t)(l >> 4);
            const int qla = qr[half * plane + o];        // ql[64 hh + l]
            const int qlb = qr[(2 + half) * plane + o];  // ql[64 hh + 32 + l]
            const int qh = qr[(4 + half) * plane + o];   // qh[32 hh + l]
            int q;
            switch (k) {
            case 0: q = (qla & 0xF) | ((qh & 3) << 4); break;
            case 1: q = (qlb & 0xF) | (((qh >> 2) & 3) << 4); break;
            case 2: q = (qla >> 4) | (((qh >> 4) & 3) << 4); break;
            default: q = (qlb >> 4) | (((qh >> 6) & 3) << 4); break;
            }
            v[l] = kaon_qb_mul(kaon_qb_mul(d, (float)sc[2 * k + (l >> 4)]), (float)(q - 32));
        }
    }
};

// Calls fn(F()) for the format of dtype t; 1 when t is not kept quantized.
template <class Fn> static inline int q_visit(kaon_dtype t, Fn fn) {
    switch (t) {
    case KAON_Q4_0: fn(FQ4_0()); return 0;
    case KAON_Q4_1: fn(FQ4_1()); return 0;
    case KAON_Q5_0: fn(FQ5_0()); return 0;
    case KAON_Q5_1: fn(FQ5_1()); return 0;
    case KAON_Q8_0: fn(FQ8_0()); return 0;
    case KAON_IQ4_NL: fn(FIQ4_NL()); return 0;
    case KAON_Q2_K: fn(FQ2_K()); return 0;
    case KAON_Q3_K: fn(FQ3_K()); return 0;
    case KAON_Q4_K: fn(FQ4_K()); return 0;
    case KAON_Q5_K: fn(FQ5_K()); return 0;
    case KAON_Q6_K: fn(FQ6_K()); return 0;
    case KAON_IQ4_XS: fn(FIQ4_XS()); return 0;
    default: return 1;
    }
}

#endif
