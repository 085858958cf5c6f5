// GGUF quantized weights kept quantized on the GPU (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K).
//
// Storage (made once at upload, on the device). Every format is split into a "main" region of
// 16-byte aligned quants, rows contiguous, and an "aux" region of the per-block f16 scales
// (starting at the first 256-byte boundary after main); block g of the flat row-major order
// (row r, block i: g = r * blocks_per_row + i) sits at main + g * QB and aux + g * AB:
//   Q4_0  main 16 B (the GGUF qs[16])             aux 2 B (d)
//   Q4_1  main 16 B (qs[16])                      aux 4 B (d, m)
//   Q8_0  main 32 B (qs[32])                      aux 2 B (d)
//   Q4_K  main 144 B: the GGUF block unchanged (d, dmin, scales[12], qs[128]; 144 = 9 x 16)
//   Q6_K  main 208 B (ql[128], qh[64], scales[16]) aux 2 B (d); inside a row the main bytes
//         are unit-major (below): plane j < 6 holds 16-byte chunk j of every unit (ql[64h ..
//         64h+63] as chunks 0-3, qh[32h .. 32h+31] as 4-5 for half h), then 8 scale bytes a unit.
// The device tensor keeps the GGUF dtype and shape; its data is this layout.
//
// Activation rows are quantized into a unit-major layout too (per row: 16-byte chunk j of unit
// u at (j * units + u) * 16, the (d, s) and sums of block k of unit u at k * units + u), so that
// the 32 lanes of a warp, which take 32 consecutive units, read 512 contiguous bytes per load.
//
// Small batches (n <= 64, in passes of at most 8 rows) run llama.cpp-style integer GEMVs: the
// activation rows are quantized to 8-bit blocks of 32 exactly as the CPU backend does
// (d = max|x| / 127, q = round-half-even(x / d), s = d * sum(q); cpu_scalar.c), then each weight
// block's integer dot product with __dp4a is scaled by the weight and activation scales with
// the CPU's formulas. One warp computes R output rows; its lanes stride over the row's "units"
// (a unit is what one lane takes per step: a Q4_0/Q4_1/Q8_0 block, a Q4_K pair of sub-blocks,
// half a Q6_K super-block), loading each with 16-byte streaming loads, and a shuffle reduction
// ends the row. Every kernel here follows the backend's programmatic-dependent-launch rule
// (kc_launch, cuda_internal.h): the GEMV's blocks request their first weights while the
// quantization kernel before it is still running, and wait before they read its output.
// Larger batches dequantize the weight into a bf16 scratch (in row chunks of at most 128 MB)
// and use cuBLASLt. The embedding of a quantized table dequantizes the gathered rows.
// KAON_CUDA_QUANT=0 keeps the old behaviour (weights expanded to bf16 at upload).
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#define QW_WARPS 4           // warps per block of the GEMV
#define QGEMV_PASS 8         // activation rows per GEMV pass
#define QDEQ_CAP (64 << 20)  // elements of the bf16 scratch of the large-batch path (128 MB)
#define KC_QGEMV_MAX_N 64    // larger batches: dequantized weights through cuBLASLt

struct kc_quant {
    int enabled;
    void *act;  // quantized activations: int8 [n, K] | float2 (d, s) [n, K/32] | int sums [n, K/32]
    size_t act_cap;
    void *deq;  // dequantized weight rows (bf16) of the large-batch path
    size_t deq_cap;
    void *tmp;  // chunk outputs of the large-batch path
    size_t tmp_cap;
    void *up;   // the up projection of an unfused SiLU
    size_t up_cap;
};

static kc_quant *qstate(kc_backend *b) {
    if (b->quant) return b->quant;
    kc_quant *s = (kc_quant *)calloc(1, sizeof *s);
    if (!s) {
        kc_fail(b, "cuda: out of host memory");
        return NULL;
    }
    const char *e = getenv("KAON_CUDA_QUANT");
    s->enabled = !(e && !strcmp(e, "0"));
    b->quant = s;
    return s;
}

void kc_quant_destroy(kc_backend *b) {
    kc_quant *s = b->quant;
    if (!s) return;
    if (s->act) cudaFree(s->act);
    if (s->deq) cudaFree(s->deq);
    if (s->tmp) cudaFree(s->tmp);
    if (s->up) cudaFree(s->up);
    free(s);
    b->quant = NULL;
}

// ---- device helpers ---------------------------------------------------------------------------

static __device__ __forceinline__ int4 ld_w16(const void *p) {
    int4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}
static __device__ __forceinline__ int2 ld_w8(const void *p) {
    int2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.s32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
static __device__ __forceinline__ unsigned ld_w4(const void *p) {
    unsigned r;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}
static __device__ __forceinline__ unsigned short ld_w2(const void *p) {
    unsigned short r;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(r) : "l"(p));
    return r;
}
static __device__ __forceinline__ float h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ int lo4(int v) { return v & 0x0F0F0F0F; }
static __device__ __forceinline__ int hi4(int v) { return (int)(((unsigned)v >> 4) & 0x0F0F0F0Fu); }

// One activation row as the GEMV reads it, unit-major for the weight's format (see the top).
struct XRow {
    const int8_t *q;    // [K]: chunk j of unit u at (j * upr + u) * 16
    const float2 *ds;   // [K/32]: (d, d * sum(q)) of block k of unit u at k * upr + u
    const int *sum;     // [K/32]: sums of q over values 0..15 (low 16 bits) and 16..31 (high)
    int upr;            // units per row
};

static __device__ __forceinline__ int4 xchunk(const XRow &x, int j, int u) {
    return __ldg((const int4 *)(x.q + ((size_t)j * x.upr + u) * 16));
}

// ---- formats ----------------------------------------------------------------------------------
// Each format: BLK elements per stored block, QB/AB bytes of a block in main/aux, UE elements
// per unit, UB units a lane loads per step when it computes one row (fewer for several rows).
// W: a unit's raw loads; P: the unit prepared for the integer dots (once per unit and row);
// X: a unit's activations (once per unit and activation row).

struct FQ4_0 {
    static constexpr int BLK = 32, QB = 16, AB = 2, UE = 32, UB = 4;
    struct W { int4 q; unsigned short d; };
    struct P { int lo[4], hi[4]; float d; };
    struct X { int4 a, b; float2 ds; };
    static __device__ __forceinline__ W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.q = ld_w16(qr + (size_t)u * 16);
        w.d = ld_w2(ar + (size_t)u * 2);
        return w;
    }
    static __device__ __forceinline__ P prep(const W &w, int) {
        P p;
        const int q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] = lo4(q[i]);  // elements 4i..4i+3
            p.hi[i] = hi4(q[i]);  // elements 16+4i..16+4i+3
        }
        p.d = h2f(w.d);
        return p;
    }
    static __device__ __forceinline__ X loadx(const XRow &x, int u) {
        X r;
        r.a = xchunk(x, 0, u);  // values 0..15 of block u
        r.b = xchunk(x, 1, u);  // values 16..31
        r.ds = __ldg(x.ds + u);
        return r;
    }
    static __device__ __forceinline__ int idot(const P &p, const X &x) {
        int s = 0;
        s = __dp4a(p.lo[0], x.a.x, s);
        s = __dp4a(p.lo[1], x.a.y, s);
        s = __dp4a(p.lo[2], x.a.z, s);
        s = __dp4a(p.lo[3], x.a.w, s);
        s = __dp4a(p.hi[0], x.b.x, s);
        s = __dp4a(p.hi[1], x.b.y, s);
        s = __dp4a(p.hi[2], x.b.z, s);
        s = __dp4a(p.hi[3], x.b.w, s);
        return s;
    }
    // CPU: dw * (dx * isum) - 8 dw sx
    static __device__ __forceinline__ float dot(const P &p, const X &x, float acc) {
        return acc + p.d * (x.ds.x * (float)idot(p, x) - 8.f * x.ds.y);
    }
};

struct FQ4_1 {
    static constexpr int BLK = 32, QB = 16, AB = 4, UE = 32, UB = 4;
    struct W { int4 q; unsigned dm; };
    struct P { FQ4_0::P p; float m; };
    typedef FQ4_0::X X;
    static __device__ __forceinline__ W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.q = ld_w16(qr + (size_t)u * 16);
        w.dm = ld_w4(ar + (size_t)u * 4);
        return w;
    }
    static __device__ __forceinline__ P prep(const W &w, int u) {
        FQ4_0::W w0;
        w0.q = w.q;
        w0.d = (unsigned short)(w.dm & 0xFFFF);
        P p;
        p.p = FQ4_0::prep(w0, u);
        p.m = h2f((unsigned short)(w.dm >> 16));
        return p;
    }
    static __device__ __forceinline__ X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    // CPU: dw * (dx * isum) + m sx
    static __device__ __forceinline__ float dot(const P &p, const X &x, float acc) {
        return acc + p.p.d * (x.ds.x * (float)FQ4_0::idot(p.p, x)) + p.m * x.ds.y;
    }
};

struct FQ8_0 {
    static constexpr int BLK = 32, QB = 32, AB = 2, UE = 32, UB = 2;
    struct W { int4 a, b; unsigned short d; };
    struct P { int4 a, b; float d; };
    typedef FQ4_0::X X;
    static __device__ __forceinline__ W load(const uint8_t *qr, const uint8_t *ar, int u, int) {
        W w;
        w.a = ld_w16(qr + (size_t)u * 32);
        w.b = ld_w16(qr + (size_t)u * 32 + 16);
        w.d = ld_w2(ar + (size_t)u * 2);
        return w;
    }
    static __device__ __forceinline__ P prep(const W &w, int) {
        P p;
        p.a = w.a;
        p.b = w.b;
        p.d = h2f(w.d);
        return p;
    }
    static __device__ __forceinline__ X loadx(const XRow &x, int u) { return FQ4_0::loadx(x, u); }
    // CPU: dw * (dx * isum)
    static __device__ __forceinline__ float dot(const P &p, const X &x, float acc) {
        int s = 0;
        s = __dp4a(p.a.x, x.a.x, s);
        s = __dp4a(p.a.y, x.a.y, s);
        s = __dp4a(p.a.z, x.a.z, s);
        s = __dp4a(p.a.w, x.a.w, s);
        s = __dp4a(p.b.x, x.b.x, s);
        s = __dp4a(p.b.y, x.b.y, s);
        s = __dp4a(p.b.z, x.b.z, s);
        s = __dp4a(p.b.w, x.b.w, s);
        return acc + p.d * (x.ds.x * (float)s);
    }
};

// Q4_K: unit u = sub-blocks 2p and 2p+1 (p = u % 4) of super-block u / 4, i.e. activation
// blocks 2u and 2u+1. Their 64 values are the low and the high nibbles of qs[32p .. 32p+31].
struct FQ4_K {
    static constexpr int BLK = 256, QB = 144, AB = 0, UE = 64, UB = 2;
    struct W { int4 h, a, b; };
    struct P { int lo[8], hi[8]; float d0, d1, m0, m1; };
    struct X { int4 a0, a1, b0, b1; float2 ds0, ds1; };
    static __device__ __forceinline__ W load(const uint8_t *qr, const uint8_t *, int u, int) {
        const uint8_t *blk = qr + (size_t)(u >> 2) * 144;
        W w;
        w.h = ld_w16(blk);
        w.a = ld_w16(blk + 16 + 32 * (u & 3));
        w.b = ld_w16(blk + 16 + 32 * (u & 3) + 16);
        return w;
    }
    static __device__ __forceinline__ P prep(const W &w, int u) {
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
    static __device__ __forceinline__ X loadx(const XRow &x, int u) {
        X r;
        r.a0 = xchunk(x, 0, u);  // block 2u, values 0..15
        r.a1 = xchunk(x, 1, u);  // block 2u, values 16..31
        r.b0 = xchunk(x, 2, u);  // block 2u+1
        r.b1 = xchunk(x, 3, u);
        r.ds0 = __ldg(x.ds + u);
        r.ds1 = __ldg(x.ds + x.upr + u);
        return r;
    }
    // CPU, per sub-block: d sc (dx isum) - dmin m sx
    static __device__ __forceinline__ float dot(const P &p, const X &x, float acc) {
        int s0 = 0, s1 = 0;
        s0 = __dp4a(p.lo[0], x.a0.x, s0);
        s0 = __dp4a(p.lo[1], x.a0.y, s0);
        s0 = __dp4a(p.lo[2], x.a0.z, s0);
        s0 = __dp4a(p.lo[3], x.a0.w, s0);
        s0 = __dp4a(p.lo[4], x.a1.x, s0);
        s0 = __dp4a(p.lo[5], x.a1.y, s0);
        s0 = __dp4a(p.lo[6], x.a1.z, s0);
        s0 = __dp4a(p.lo[7], x.a1.w, s0);
        s1 = __dp4a(p.hi[0], x.b0.x, s1);
        s1 = __dp4a(p.hi[1], x.b0.y, s1);
        s1 = __dp4a(p.hi[2], x.b0.z, s1);
        s1 = __dp4a(p.hi[3], x.b0.w, s1);
        s1 = __dp4a(p.hi[4], x.b1.x, s1);
        s1 = __dp4a(p.hi[5], x.b1.y, s1);
        s1 = __dp4a(p.hi[6], x.b1.z, s1);
        s1 = __dp4a(p.hi[7], x.b1.w, s1);
        acc += p.d0 * (x.ds0.x * (float)s0) - p.m0 * x.ds0.y;
        return acc + p.d1 * (x.ds1.x * (float)s1) - p.m1 * x.ds1.y;
    }
};

// Q6_K: unit u = half hh = u % 2 of super-block u / 2: its chunks k = 0..3 of 32 values are
// activation blocks 4u + k. Value l (< 32) of chunk k: low 4 bits from ql[64 hh + l + 32 (k & 1)]
// (low nibble for k < 2, high for k >= 2), high 2 bits from bits 2k, 2k+1 of qh[32 hh + l];
// q - 32, times scales[8 hh + 2k + l / 16]. Stored unit-major (top): a0, a1, b0, b1 = ql[64 hh
// + 0, 16, 32, 48 ..], h0, h1 = qh[32 hh + 0, 16 ..] are planes 0-5, sc = scales[8 hh ..].
struct FQ6_K {
    static constexpr int BLK = 256, QB = 208, AB = 2, UE = 128, UB = 1;
    struct W { int4 a0, a1, b0, b1, h0, h1; int2 sc; unsigned short d; };
    struct P { int q[4][2][4]; int sc[4][2]; float d; };
    struct X { int4 v[4][2]; float d[4]; int sum[4]; };
    static __device__ __forceinline__ W load(const uint8_t *qr, const uint8_t *ar, int u, int upr) {
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
        w.d = ld_w2(ar + (size_t)(u >> 1) * 2);
        return w;
    }
    static __device__ __forceinline__ P prep(const W &w, int) {
        P p;
        const int A[2][4] = {{w.a0.x, w.a0.y, w.a0.z, w.a0.w}, {w.a1.x, w.a1.y, w.a1.z, w.a1.w}};
        const int B[2][4] = {{w.b0.x, w.b0.y, w.b0.z, w.b0.w}, {w.b1.x, w.b1.y, w.b1.z, w.b1.w}};
        const int H[2][4] = {{w.h0.x, w.h0.y, w.h0.z, w.h0.w}, {w.h1.x, w.h1.y, w.h1.z, w.h1.w}};
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const unsigned a = (unsigned)A[c][e], bq = (unsigned)B[c][e], h = (unsigned)H[c][e];
                p.q[0][c][e] = (int)((a & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4));
                p.q[1][c][e] = (int)((bq & 0x0F0F0F0Fu) | (((h >> 2) & 0x03030303u) << 4));
                p.q[2][c][e] = (int)(((a >> 4) & 0x0F0F0F0Fu) | (((h >> 4) & 0x03030303u) << 4));
                p.q[3][c][e] = (int)(((bq >> 4) & 0x0F0F0F0Fu) | (((h >> 6) & 0x03030303u) << 4));
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
    static __device__ __forceinline__ X loadx(const XRow &x, int u) {
        X r;
#pragma unroll
        for (int k = 0; k < 4; k++) {  // block 4u + k
            r.v[k][0] = xchunk(x, 2 * k, u);
            r.v[k][1] = xchunk(x, 2 * k + 1, u);
            r.d[k] = __ldg(&x.ds[k * x.upr + u].x);
            r.sum[k] = __ldg(x.sum + k * x.upr + u);
        }
        return r;
    }
    // CPU, per block: dw * (dx * isum), isum = sum over both halves of sc * (q - 32) * x.
    static __device__ __forceinline__ float dot(const P &p, const X &x, float acc) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int4 v0 = x.v[k][0], v1 = x.v[k][1];
            int t0 = 0, t1 = 0;
            t0 = __dp4a(p.q[k][0][0], v0.x, t0);
            t0 = __dp4a(p.q[k][0][1], v0.y, t0);
            t0 = __dp4a(p.q[k][0][2], v0.z, t0);
            t0 = __dp4a(p.q[k][0][3], v0.w, t0);
            t1 = __dp4a(p.q[k][1][0], v1.x, t1);
            t1 = __dp4a(p.q[k][1][1], v1.y, t1);
            t1 = __dp4a(p.q[k][1][2], v1.z, t1);
            t1 = __dp4a(p.q[k][1][3], v1.w, t1);
            const int slo = (int)(int16_t)(x.sum[k] & 0xFFFF), shi = x.sum[k] >> 16;
            const int isum = p.sc[k][0] * (t0 - 32 * slo) + p.sc[k][1] * (t1 - 32 * shi);
            acc += p.d * (x.d[k] * (float)isum);
        }
        return acc;
    }
};

// ---- dequantization of one block of 32 values (embedding rows, the large-batch path) -----------
// Values as the bf16 expansion (kc_convert) computes them; row pointers into main and aux.

template <class F> struct Deq;

template <> struct Deq<FQ4_0> {
    static __device__ void run(const uint8_t *qr, const uint8_t *ar, int j, int, float *v) {
        const uint8_t *q = qr + (size_t)j * 16;
        const float d = h2f(*(const unsigned short *)(ar + (size_t)j * 2));
        for (int l = 0; l < 16; l++) {
            v[l] = (float)((q[l] & 0xF) - 8) * d;
            v[l + 16] = (float)((q[l] >> 4) - 8) * d;
        }
    }
};
template <> struct Deq<FQ4_1> {
    static __device__ void run(const uint8_t *qr, const uint8_t *ar, int j, int, float *v) {
        const uint8_t *q = qr + (size_t)j * 16;
        const float d = h2f(*(const unsigned short *)(ar + (size_t)j * 4));
        const float m = h2f(*(const unsigned short *)(ar + (size_t)j * 4 + 2));
        for (int l = 0; l < 16; l++) {
            v[l] = (float)(q[l] & 0xF) * d + m;
            v[l + 16] = (float)(q[l] >> 4) * d + m;
        }
    }
};
template <> struct Deq<FQ8_0> {
    static __device__ void run(const uint8_t *qr, const uint8_t *ar, int j, int, float *v) {
        const int8_t *q = (const int8_t *)(qr + (size_t)j * 32);
        const float d = h2f(*(const unsigned short *)(ar + (size_t)j * 2));
        for (int l = 0; l < 32; l++) v[l] = (float)q[l] * d;
    }
};
template <> struct Deq<FQ4_K> {
    static __device__ void run(const uint8_t *qr, const uint8_t *, int j, int, float *v) {
        const uint8_t *p = qr + (size_t)(j >> 3) * 144;
        const int sb = j & 7;
        const float d = h2f(*(const unsigned short *)p), dmin = h2f(*(const unsigned short *)(p + 2));
        const uint8_t *sc = p + 4, *q = p + 16 + (sb >> 1) * 32;
        int s, m;
        if (sb < 4) {
            s = sc[sb] & 63;
            m = sc[sb + 4] & 63;
        } else {
            s = (sc[sb + 4] & 0xF) | ((sc[sb - 4] >> 6) << 4);
            m = (sc[sb + 4] >> 4) | ((sc[sb] >> 6) << 4);
        }
        const float ds = d * (float)s, dm = dmin * (float)m;
        for (int l = 0; l < 32; l++) v[l] = ds * (float)((sb & 1) ? (q[l] >> 4) : (q[l] & 0xF)) - dm;
    }
};
template <> struct Deq<FQ6_K> {
    // Block j = chunk c = j % 8 of super-block j / 8: unit u = 2 (j / 8) + c / 4, k = c % 4.
    static __device__ void run(const uint8_t *qr, const uint8_t *ar, int j, int K, float *v) {
        const int upr = K / 128, c = j & 7, u = 2 * (j >> 3) + (c >> 2), k = c & 3;
        const size_t plane = (size_t)upr * 16;
        const int8_t *sc = (const int8_t *)(qr + 6 * plane + (size_t)u * 8);
        const float d = h2f(*(const unsigned short *)(ar + (size_t)(j >> 3) * 2));
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
            v[l] = d * (float)sc[2 * k + (l >> 4)] * (float)(q - 32);
        }
    }
};

// out [n_out, K] bf16: row o is source row (ids ? ids[o] : row0 + o); ids outside [0, rows)
// give a zero row. One thread per block of 32 values.
template <class F>
__global__ void k_qdequant(const uint8_t *__restrict__ q, const uint8_t *__restrict__ aux, int64_t rows,
                           int K, const int32_t *__restrict__ ids, int64_t row0, int64_t n_out,
                           bf16 *__restrict__ out) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const int nb32 = K / 32;
    const size_t qrb = (size_t)(K / F::BLK) * F::QB, arb = (size_t)(K / F::BLK) * F::AB;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n_out * nb32;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = t / nb32;
        const int j = (int)(t % nb32);
        const int64_t r = ids ? (int64_t)ids[o] : row0 + o;
        float v[32];
        if (r < 0 || r >= rows) {
            for (int l = 0; l < 32; l++) v[l] = 0.f;
        } else {
            Deq<F>::run(q + (size_t)r * qrb, aux + (size_t)r * arb, j, K, v);
        }
        bf16 *dst = out + (size_t)o * K + (size_t)j * 32;
        if (((uintptr_t)dst & 15) == 0) {
#pragma unroll
            for (int c = 0; c < 4; c++) {
                uint4 pk;
                __nv_bfloat162 *h = (__nv_bfloat162 *)&pk;
#pragma unroll
                for (int e = 0; e < 4; e++) h[e] = __floats2bfloat162_rn(v[8 * c + 2 * e], v[8 * c + 2 * e + 1]);
                ((uint4 *)dst)[c] = pk;
            }
        } else {
            for (int l = 0; l < 32; l++) dst[l] = __float2bfloat16(v[l]);
        }
    }
}

// ---- upload: GGUF blocks -> the layout above ------------------------------------------------------

// Block g: bytes [qoff, qoff + qlen) to main + g * qlen, [aoff, aoff + alen) to aux + g * alen.
__global__ void k_qrepack(const uint8_t *__restrict__ src, size_t n_blocks, int bsz, int qoff, int qlen,
                          int aoff, int alen, uint8_t *__restrict__ mainp, uint8_t *__restrict__ auxp) {
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_blocks;
         g += (size_t)gridDim.x * blockDim.x) {
        const uint8_t *s = src + g * bsz;
        uint8_t *m = mainp + g * qlen, *a = auxp + g * alen;
        for (int i = 0; i < qlen; i++) m[i] = s[qoff + i];
        for (int i = 0; i < alen; i++) a[i] = s[aoff + i];
    }
}

// Q6_K: super-block g (row g / nsb, i = g % nsb) into its row's unit-major planes (FQ6_K).
__global__ void k_qrepack_q6k(const uint8_t *__restrict__ src, size_t n_blocks, int nsb, uint8_t *__restrict__ mainp,
                              uint8_t *__restrict__ auxp) {
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_blocks;
         g += (size_t)gridDim.x * blockDim.x) {
        const uint8_t *s = src + g * 210;
        const size_t row = g / (size_t)nsb, i = g % (size_t)nsb, upr = 2 * (size_t)nsb, plane = upr * 16;
        uint8_t *rb = mainp + row * (size_t)nsb * 208;
        for (int hh = 0; hh < 2; hh++) {
            const size_t u = 2 * i + (size_t)hh;
            for (int j = 0; j < 6; j++) {
                const uint8_t *from = j < 4 ? s + 64 * hh + 16 * j : s + 128 + 32 * hh + 16 * (j - 4);
                uint8_t *to = rb + (size_t)j * plane + u * 16;
                for (int e = 0; e < 16; e++) to[e] = from[e];
            }
            for (int e = 0; e < 8; e++) rb[6 * plane + u * 8 + e] = s[192 + 8 * hh + e];
        }
        auxp[g * 2] = s[208];
        auxp[g * 2 + 1] = s[209];
    }
}

// ---- activation quantization ------------------------------------------------------------------

// x [n, K] bf16 -> 8-bit blocks of 32 (total = n * K / 32 blocks, flat), unit-major for units
// of bpu blocks (XRow). Four lanes per block, 8 values each. The CPU's numbers: d = amax / 127
// (IEEE division), id = 1 / d (0 when d = 0), q = clamp(round-half-even(x * id), -127, 127),
// s = d * sum(q).
template <bool VEC>
__global__ void __launch_bounds__(256) k_qact(const bf16 *__restrict__ x, int total, int nb32, int bpu,
                                              int8_t *__restrict__ xq, float2 *__restrict__ xds,
                                              int *__restrict__ xsum) {
    kc_pdl_trigger();  // the GEMV may start loading weights now; it waits before reading xq
    kc_pdl_wait();     // x is the previous kernel's output; xq may still be read by the one before
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int g = t >> 2, part = t & 3;
    const bool ok = g < total;
    float v[8];
    if (ok && VEC) {
        const uint4 raw = *(const uint4 *)(x + (size_t)g * 32 + part * 8);
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 f = __bfloat1622float2(h[e]);
            v[2 * e] = f.x;
            v[2 * e + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = ok ? __bfloat162float(x[(size_t)g * 32 + part * 8 + e]) : 0.f;
    }
    float amax = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __frcp_rn(d) : 0.f;
    int ps = 0;
    unsigned w0 = 0, w1 = 0;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        float r = rintf(__fmul_rn(v[e], id));
        r = fminf(fmaxf(r, -127.f), 127.f);
        const int q = (int)r;
        ps += q;
        const unsigned byte = (unsigned)(q & 0xFF) << (8 * (e & 3));
        if (e < 4) w0 |= byte;
        else w1 |= byte;
    }
    const int s01 = ps + __shfl_xor_sync(0xffffffffu, ps, 1);  // lanes 0-1: values 0..15; 2-3: 16..31
    const int tot = s01 + __shfl_xor_sync(0xffffffffu, s01, 2);
    if (!ok) return;
    // Block b of row r: unit u = b / bpu, k = b % bpu; values 16h .. 16h+15 are chunk 2k + h.
    const int r = g / nb32, b = g % nb32, upr = nb32 / bpu, u = b / bpu, k = b % bpu;
    int8_t *xr = xq + (size_t)r * nb32 * 32;
    *(uint2 *)(xr + ((size_t)(2 * k + (part >> 1)) * upr + u) * 16 + 8 * (part & 1)) = make_uint2(w0, w1);
    if (part == 0) {
        const size_t m = (size_t)r * nb32 + (size_t)k * upr + u;
        xds[m] = make_float2(d, __fmul_rn(d, (float)tot));
        xsum[m] = (int)(((unsigned)s01 & 0xFFFFu) | ((unsigned)(tot - s01) << 16));
    }
}

// ---- GEMV ---------------------------------------------------------------------------------------

struct QArgs {
    const uint8_t *q[4], *a[4];  // main and aux of each weight
    const float *bias[4];
    void *y[4];                  // [nvalid, rows] bf16, or f32 when f32out
    int rows[4], begin[4];       // rows of each weight; its first block
    int count, K, nvalid, f32out;
    const int8_t *xq;            // this pass's activation rows
    const float2 *xds;
    const int *xsum;
};

// Rows per warp: enough that the activations read per weight byte stay within L1's bandwidth.
template <class F, int NB, bool SILU>
struct QCfg {
    static constexpr int base = F::UB >= 4 ? (NB >= 2 ? NB / 2 : 1)
                              : F::UB == 2 ? (NB >= 4 ? NB / 4 : 1)
                                           : (NB >= 8 ? 2 : 1);
    static constexpr int R = SILU ? (base >= 2 ? base / 2 : 1) : base;
    static constexpr int NR = SILU ? 2 * R : R;  // weight rows a warp reads (gate and up rows)
    static constexpr int U = F::UB / NR >= 1 ? F::UB / NR : 1;
};

// y[b, row] = x[b] . w[row] (+ bias) for the rows of up to 4 weights of one format (count > 1:
// linear_multi), or with SILU: out[b, row] = bf16(bf16(silu(bf16 g)) * bf16 u), g from weight 0
// (gate) and u from weight 1 (up). Block b of the grid: weight seg with begin[seg] <= b.
template <class F, int NB, bool SILU>
__global__ void __launch_bounds__(QW_WARPS * 32) k_qgemv(const QArgs a) {
    typedef QCfg<F, NB, SILU> C;
    constexpr int R = C::R, NR = C::NR, U = C::U;
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int seg = 0;
    if (!SILU) {
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (i < a.count && (int)blockIdx.x >= a.begin[i]) seg = i;
    }
    const int rows = a.rows[seg];
    const int row0 = (((int)blockIdx.x - a.begin[seg]) * QW_WARPS + warp) * R;
    if (row0 >= rows) {
        kc_pdl_wait();
        return;
    }
    const int K = a.K, nb32 = K / 32, upr = K / F::UE;
    const size_t qrb = (size_t)(K / F::BLK) * F::QB, arb = (size_t)(K / F::BLK) * F::AB;
    const uint8_t *qr[NR], *ar[NR];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = min(row0 + r, rows - 1);
        qr[r] = a.q[seg] + (size_t)row * qrb;
        ar[r] = a.a[seg] + (size_t)row * arb;
        if (SILU) {
            qr[R + r] = a.q[1] + (size_t)row * qrb;
            ar[R + r] = a.a[1] + (size_t)row * arb;
        }
    }
    XRow xr[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        const int bb = min(b, a.nvalid - 1);  // rows past nvalid repeat the last (never stored)
        xr[b].q = a.xq + (size_t)bb * K;
        xr[b].ds = a.xds + (size_t)bb * nb32;
        xr[b].sum = a.xsum + (size_t)bb * nb32;
        xr[b].upr = upr;
    }
    float acc[NR][NB];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0.f;
    bool waited = false;
    for (int u0 = lane; u0 < upr; u0 += 32 * U) {
        typename F::W w[U][NR];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int u = u0 + 32 * k;
#pragma unroll
            for (int r = 0; r < NR; r++) {
                w[k][r] = u < upr ? F::load(qr[r], ar[r], u, upr) : typename F::W();
            }
        }
        if (!waited) {  // the activations are the previous kernel's output
            kc_pdl_wait();
            waited = true;
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int u = u0 + 32 * k;
            if (u < upr) {
                typename F::P p[NR];
#pragma unroll
                for (int r = 0; r < NR; r++) p[r] = F::prep(w[k][r], u);
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    const typename F::X xv = F::loadx(xr[b], u);
#pragma unroll
                    for (int r = 0; r < NR; r++) acc[r][b] = F::dot(p[r], xv, acc[r][b]);
                }
            }
        }
    }
    if (!waited) kc_pdl_wait();  // (lanes without a unit)
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = warp_sum(acc[r][b]);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = row0 + r;
        if (row >= rows) break;
        if (SILU) {
            bf16 *out = (bf16 *)a.y[0];
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b >= a.nvalid) break;
                const float g = __bfloat162float(__float2bfloat16(acc[r][b]));
                const float uu = __bfloat162float(__float2bfloat16(acc[R + r][b]));
                const float s = __bfloat162float(__float2bfloat16(g / (1.f + expf(-g))));
                out[(size_t)b * rows + row] = __float2bfloat16(s * uu);
            }
        } else {
            const float bb = a.bias[seg] ? a.bias[seg][row] : 0.f;
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b >= a.nvalid) break;
                if (a.f32out) ((float *)a.y[seg])[(size_t)b * rows + row] = acc[r][b] + bb;
                else ((bf16 *)a.y[seg])[(size_t)b * rows + row] = __float2bfloat16(acc[r][b] + bb);
            }
        }
    }
}

// ---- host side ----------------------------------------------------------------------------------

static bool is_q(kaon_dtype t) {
    return t == KAON_Q4_0 || t == KAON_Q4_1 || t == KAON_Q8_0 || t == KAON_Q4_K || t == KAON_Q6_K;
}

static bool is_qt(const kaon_tensor *w) { return w && is_q(w->dtype); }

// Where a quantized matrix's regions lie in its device buffer.
typedef struct QLayout {
    int blk, qb, ab;        // elements per block; main and aux bytes per block
    size_t main_bytes, aux_off, total;
} QLayout;

static int q_layout(kaon_dtype t, int64_t rows, int64_t cols, QLayout *L) {
    memset(L, 0, sizeof *L);
    switch (t) {
    case KAON_Q4_0: L->blk = 32; L->qb = 16; L->ab = 2; break;
    case KAON_Q4_1: L->blk = 32; L->qb = 16; L->ab = 4; break;
    case KAON_Q8_0: L->blk = 32; L->qb = 32; L->ab = 2; break;
    case KAON_Q4_K: L->blk = 256; L->qb = 144; L->ab = 0; break;
    case KAON_Q6_K: L->blk = 256; L->qb = 208; L->ab = 2; break;
    default: return -1;
    }
    if (rows <= 0 || cols <= 0 || cols % L->blk) return -1;
    const size_t nblocks = (size_t)rows * (size_t)(cols / L->blk);
    L->main_bytes = nblocks * (size_t)L->qb;
    L->aux_off = (L->main_bytes + 255) & ~(size_t)255;
    L->total = L->aux_off + nblocks * (size_t)L->ab;
    if (L->total == L->aux_off) L->total += 256;  // (Q4_K: no aux; keep the pointer inside)
    return 0;
}

// An uploaded quantized matrix: checks and its main/aux pointers.
static bool qmat(kc_backend *b, const kaon_tensor *w, const char *what, const uint8_t **qp,
                 const uint8_t **ap) {
    QLayout L;
    if (!w || !w->data || w->ndim != 2 || w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX ||
        q_layout(w->dtype, w->shape[0], w->shape[1], &L) || w->nbytes < L.total) {
        kc_fail(b, "cuda %s: not an uploaded quantized matrix", what);
        return false;
    }
    *qp = (const uint8_t *)w->data;
    *ap = (const uint8_t *)w->data + L.aux_off;
    return true;
}

static bool bf16mat(const kaon_tensor *w) {
    return w && w->data && w->ndim == 2 && w->dtype == KAON_BF16 && w->shape[0] > 0 &&
           w->shape[1] > 0 && w->shape[0] <= INT32_MAX && w->shape[1] <= INT32_MAX;
}

static bool fvec(kc_backend *b, const kaon_tensor *v, int64_t n, const char *what) {
    if (!v) return true;
    if (!v->data || v->dtype != KAON_F32 || kaon_tensor_numel(v) != n) {
        kc_fail(b, "cuda %s: expected an uploaded f32 vector of %lld", what, (long long)n);
        return false;
    }
    return true;
}

int kc_quant_upload(kc_backend *b, const kaon_tensor *host, kaon_tensor *dev) {
    if (!host || host->ndim != 2 || !is_q(host->dtype)) return 1;
    kc_quant *s = qstate(b);
    if (!s) return -1;
    if (!s->enabled) return 1;
    const kaon_dtype t = host->dtype;
    const int64_t rows = host->shape[0], cols = host->shape[1];
    QLayout L;
    if (rows <= 0 || cols <= 0 || rows > INT32_MAX || cols > INT32_MAX || q_layout(t, rows, cols, &L))
        return kc_fail(b, "cuda upload: %s matrix of %lld x %lld is not whole blocks", kaon_dtype_name(t),
                       (long long)rows, (long long)cols);
    if (!host->data) return kc_fail(b, "cuda upload: no data");
    const size_t rb = kaon_dtype_row_bytes(t, cols), src_bytes = rb * (size_t)rows;
    if (rb == 0 || (host->nbytes && host->nbytes < src_bytes))
        return kc_fail(b, "cuda upload: tensor data is short");
    if (b->capturing) return kc_fail(b, "cuda upload: while recording a graph");
    void *dst = NULL, *tmp = NULL;
    if (kc_check(b, cudaMalloc(&dst, L.total), "quantized weight")) return -1;
    int rc = 0;
    if (t == KAON_Q4_K) {  // stored as it comes
        rc = kc_check(b, cudaMemcpyAsync(dst, host->data, src_bytes, cudaMemcpyHostToDevice, b->stream), "upload");
    } else {
        int qoff = 0, qlen = 0, aoff = 0, alen = 0;
        const int bsz = kaon_dtype_block_bytes(t);
        switch (t) {
        case KAON_Q4_0: qoff = 2; qlen = 16; aoff = 0; alen = 2; break;
        case KAON_Q4_1: qoff = 4; qlen = 16; aoff = 0; alen = 4; break;
        case KAON_Q8_0: qoff = 2; qlen = 32; aoff = 0; alen = 2; break;
        default: qoff = 0; qlen = 208; aoff = 208; alen = 2; break;  // Q6_K (its own kernel)
        }
        const size_t nblk = src_bytes / (size_t)bsz;
        rc = kc_check(b, cudaMalloc(&tmp, src_bytes), "upload staging");
        if (!rc)
            rc = kc_check(b, cudaMemcpyAsync(tmp, host->data, src_bytes, cudaMemcpyHostToDevice, b->stream), "upload");
        if (!rc) {
            size_t blocks = (nblk + 255) / 256;
            if (blocks > 65535 * 8) blocks = 65535 * 8;
            if (t == KAON_Q6_K)
                k_qrepack_q6k<<<(unsigned)blocks, 256, 0, b->stream>>>((const uint8_t *)tmp, nblk, (int)(cols / 256),
                                                                       (uint8_t *)dst, (uint8_t *)dst + L.aux_off);
            else
                k_qrepack<<<(unsigned)blocks, 256, 0, b->stream>>>((const uint8_t *)tmp, nblk, bsz, qoff, qlen, aoff,
                                                                   alen, (uint8_t *)dst, (uint8_t *)dst + L.aux_off);
            rc = kc_launched(b, "repack");
        }
    }
    if (kc_check(b, cudaStreamSynchronize(b->stream), "upload")) rc = -1;
    if (tmp) cudaFree(tmp);
    if (rc) {
        cudaFree(dst);
        return -1;
    }
    memset(dev, 0, sizeof *dev);
    dev->dtype = t;
    dev->ndim = 2;
    dev->shape[0] = rows;
    dev->shape[1] = cols;
    dev->data = dst;
    dev->nbytes = L.total;
    b->bytes_weights += L.total;
    return 0;
}

// Dequantizes rows into bf16: ids (device) picks n_out rows, else rows row0 .. row0 + n_out - 1.
static int q_dequant(kc_backend *b, const kaon_tensor *w, const int32_t *d_ids, int64_t row0,
                     int64_t n_out, bf16 *out) {
    const uint8_t *qp, *ap;
    if (!qmat(b, w, "dequantize", &qp, &ap)) return -1;
    const int K = (int)w->shape[1];
    const int64_t rows = w->shape[0], work = n_out * (K / 32);
    if (work <= 0) return 0;
    int64_t blocks = (work + 127) / 128;
    if (blocks > 65535 * 16) blocks = 65535 * 16;
    const dim3 g((unsigned)blocks), t(128);
    cudaError_t e;
    switch (w->dtype) {
    case KAON_Q4_0: e = kc_launch(b, k_qdequant<FQ4_0>, g, t, 0, qp, ap, rows, K, d_ids, row0, n_out, out); break;
    case KAON_Q4_1: e = kc_launch(b, k_qdequant<FQ4_1>, g, t, 0, qp, ap, rows, K, d_ids, row0, n_out, out); break;
    case KAON_Q8_0: e = kc_launch(b, k_qdequant<FQ8_0>, g, t, 0, qp, ap, rows, K, d_ids, row0, n_out, out); break;
    case KAON_Q4_K: e = kc_launch(b, k_qdequant<FQ4_K>, g, t, 0, qp, ap, rows, K, d_ids, row0, n_out, out); break;
    default: e = kc_launch(b, k_qdequant<FQ6_K>, g, t, 0, qp, ap, rows, K, d_ids, row0, n_out, out); break;
    }
    return kc_check(b, e, "dequantize");
}

int kc_quant_embed(kc_backend *b, const kaon_tensor *table, const int32_t *ids, int n, void *out) {
    if (!is_qt(table)) return 1;
    if (n <= 0) return 0;
    const int32_t *d = kc_dev_i32(b, ids, (size_t)n);
    if (!d) return -1;
    return q_dequant(b, table, d, 0, n, (bf16 *)out);
}

// The activation rows x [n, K] quantized into the scratch; pointers to its three parts.
static int q_bpu(kaon_dtype t) { return t == KAON_Q4_K ? 2 : t == KAON_Q6_K ? 4 : 1; }

// (bpu: activation blocks per unit of the weight format, q_bpu.)
static int q_act(kc_backend *b, const void *x, int n, int K, int bpu, const int8_t **xq, const float2 **xds,
                 const int **xsum) {
    kc_quant *s = qstate(b);
    if (!s) return -1;
    const size_t nblk = (size_t)n * (size_t)(K / 32);
    const size_t o_ds = ((size_t)n * K + 255) & ~(size_t)255;
    const size_t o_sum = (o_ds + nblk * sizeof(float2) + 255) & ~(size_t)255;
    const size_t need = o_sum + nblk * sizeof(int);
    if (kc_grow(b, &s->act, &s->act_cap, need, 1, "quantized activations")) return -1;
    uint8_t *base = (uint8_t *)s->act;
    *xq = (const int8_t *)base;
    *xds = (const float2 *)(base + o_ds);
    *xsum = (const int *)(base + o_sum);
    const int total = (int)nblk, threads = 256;
    const unsigned grid = (unsigned)((total * 4 + threads - 1) / threads);
    cudaError_t e = ((uintptr_t)x & 15) == 0
                        ? kc_launch(b, k_qact<true>, dim3(grid), dim3(threads), 0, (const bf16 *)x, total, K / 32,
                                    bpu, (int8_t *)base, (float2 *)(base + o_ds), (int *)(base + o_sum))
                        : kc_launch(b, k_qact<false>, dim3(grid), dim3(threads), 0, (const bf16 *)x, total, K / 32,
                                    bpu, (int8_t *)base, (float2 *)(base + o_ds), (int *)(base + o_sum));
    return kc_check(b, e, "quantize activations");
}

template <class F, int NB, bool SILU>
static cudaError_t launch_nb(kc_backend *b, unsigned blocks, const QArgs &a) {
    return kc_launch(b, k_qgemv<F, NB, SILU>, dim3(blocks), dim3(QW_WARPS * 32), 0, a);
}

template <class F, bool SILU>
static cudaError_t launch_f(kc_backend *b, int nb, unsigned blocks, const QArgs &a) {
    switch (nb) {
    case 1: return launch_nb<F, 1, SILU>(b, blocks, a);
    case 2: return launch_nb<F, 2, SILU>(b, blocks, a);
    case 4: return launch_nb<F, 4, SILU>(b, blocks, a);
    default: return launch_nb<F, 8, SILU>(b, blocks, a);
    }
}

template <class F>
static int rows_per_warp(int nb, bool silu) {
    if (silu)
        return nb == 1 ? QCfg<F, 1, true>::R : nb == 2 ? QCfg<F, 2, true>::R : nb == 4 ? QCfg<F, 4, true>::R
                                                                                        : QCfg<F, 8, true>::R;
    return nb == 1 ? QCfg<F, 1, false>::R : nb == 2 ? QCfg<F, 2, false>::R : nb == 4 ? QCfg<F, 4, false>::R
                                                                                     : QCfg<F, 8, false>::R;
}

static int q_rpw(kaon_dtype t, int nb, bool silu) {
    switch (t) {
    case KAON_Q4_0: return rows_per_warp<FQ4_0>(nb, silu);
    case KAON_Q4_1: return rows_per_warp<FQ4_1>(nb, silu);
    case KAON_Q8_0: return rows_per_warp<FQ8_0>(nb, silu);
    case KAON_Q4_K: return rows_per_warp<FQ4_K>(nb, silu);
    default: return rows_per_warp<FQ6_K>(nb, silu);
    }
}

static cudaError_t q_launch(kc_backend *b, kaon_dtype t, int nb, bool silu, unsigned blocks,
                            const QArgs &a) {
    switch (t) {
    case KAON_Q4_0: return silu ? launch_f<FQ4_0, true>(b, nb, blocks, a) : launch_f<FQ4_0, false>(b, nb, blocks, a);
    case KAON_Q4_1: return silu ? launch_f<FQ4_1, true>(b, nb, blocks, a) : launch_f<FQ4_1, false>(b, nb, blocks, a);
    case KAON_Q8_0: return silu ? launch_f<FQ8_0, true>(b, nb, blocks, a) : launch_f<FQ8_0, false>(b, nb, blocks, a);
    case KAON_Q4_K: return silu ? launch_f<FQ4_K, true>(b, nb, blocks, a) : launch_f<FQ4_K, false>(b, nb, blocks, a);
    default: return silu ? launch_f<FQ6_K, true>(b, nb, blocks, a) : launch_f<FQ6_K, false>(b, nb, blocks, a);
    }
}

// The GEMV passes over quantized activations (quantized already): count weights of format t
// (silu: count = 2, gate and up), activation rows [0, n) in passes of at most 8.
static int q_gemv_passes(kc_backend *b, kaon_dtype t, int n, int K, int count,
                         const uint8_t *const *qp, const uint8_t *const *ap, const int *rows,
                         const float *const *bias, void *const *y, int f32out, bool silu,
                         const int8_t *xq, const float2 *xds, const int *xsum) {
    const int nb32 = K / 32;
    const size_t es = f32out ? 4 : 2;
    for (int b0 = 0; b0 < n; b0 += QGEMV_PASS) {
        const int nv = n - b0 < QGEMV_PASS ? n - b0 : QGEMV_PASS;
        const int nb = nv == 1 ? 1 : nv == 2 ? 2 : nv <= 4 ? 4 : 8;
        const int R = q_rpw(t, nb, silu);
        QArgs a;
        memset(&a, 0, sizeof a);
        a.count = count;
        a.K = K;
        a.nvalid = nv;
        a.f32out = f32out;
        a.xq = xq + (size_t)b0 * K;
        a.xds = xds + (size_t)b0 * nb32;
        a.xsum = xsum + (size_t)b0 * nb32;
        int blocks = 0;
        for (int i = 0; i < count; i++) {
            a.q[i] = qp[i];
            a.a[i] = ap[i];
            a.bias[i] = bias ? bias[i] : NULL;
            a.rows[i] = rows[i];
            a.y[i] = y[i] ? (uint8_t *)y[i] + (size_t)b0 * rows[i] * es : NULL;
            a.begin[i] = blocks;
            if (!silu || i == 0) blocks += (rows[i] + QW_WARPS * R - 1) / (QW_WARPS * R);
        }
        if (kc_check(b, q_launch(b, t, nb, silu, (unsigned)blocks, a), "quantized gemv")) return -1;
    }
    return 0;
}

static int q_tmp(kc_backend *b, size_t bytes) {
    kc_quant *s = qstate(b);
    return s ? kc_grow(b, &s->tmp, &s->tmp_cap, bytes, 1, "quantized scratch") : -1;
}

// Large batches: bf16 rows of w (in chunks of at most QDEQ_CAP elements) through cuBLASLt.
static int q_gemm_deq(kc_backend *b, const void *x, int n, const kaon_tensor *w, const float *bias,
                      void *y, int f32out) {
    kc_quant *s = qstate(b);
    if (!s) return -1;
    const int rows = (int)w->shape[0], K = (int)w->shape[1];
    int chunk = rows;
    if ((int64_t)rows * K > QDEQ_CAP) {
        chunk = (int)(QDEQ_CAP / K) & ~63;
        if (chunk < 64) chunk = 64;
        if (chunk > rows) chunk = rows;
    }
    if (kc_grow(b, &s->deq, &s->deq_cap, (size_t)chunk * K * sizeof(bf16), 1, "dequantized weights")) return -1;
    const size_t es = f32out ? 4 : 2;
    if (chunk < rows && q_tmp(b, (size_t)n * chunk * es)) return -1;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int cnt = rows - r0 < chunk ? rows - r0 : chunk;
        if (q_dequant(b, w, NULL, r0, cnt, (bf16 *)s->deq)) return -1;
        if (chunk == rows) return kc_gemm_bf16(b, (const bf16 *)x, n, (const bf16 *)s->deq, rows, K, bias, y, f32out);
        if (kc_gemm_bf16(b, (const bf16 *)x, n, (const bf16 *)s->deq, cnt, K, bias ? bias + r0 : NULL, s->tmp, f32out))
            return -1;
        if (kc_check(b, cudaMemcpy2DAsync((uint8_t *)y + (size_t)r0 * es, (size_t)rows * es, s->tmp, (size_t)cnt * es,
                                          (size_t)cnt * es, (size_t)n, cudaMemcpyDeviceToDevice, b->stream),
                     "quantized gemm output"))
            return -1;
    }
    return 0;
}

// Up to 4 quantized weights of width K sharing x: x quantized once, one GEMV launch per format.
static int q_linear_set(kc_backend *b, const void *x, int n, int count, const kaon_tensor *const *w,
                        const float *const *bias, void *const *y, int f32out) {
    const int K = (int)w[0]->shape[1];
    if (n > KC_QGEMV_MAX_N) {
        for (int i = 0; i < count; i++)
            if (q_gemm_deq(b, x, n, w[i], bias ? bias[i] : NULL, y[i], f32out)) return -1;
        return 0;
    }
    const int8_t *xq = NULL;
    const float2 *xds = NULL;
    const int *xsum = NULL;
    int bpu = 0;  // the layout x is quantized in (formats of several layouts: quantized again)
    bool done[4] = {false, false, false, false};
    for (int i = 0; i < count; i++) {
        if (done[i]) continue;
        if (q_bpu(w[i]->dtype) != bpu) {
            bpu = q_bpu(w[i]->dtype);
            if (q_act(b, x, n, K, bpu, &xq, &xds, &xsum)) return -1;
        }
        const uint8_t *qp[4], *ap[4];
        const float *bs[4];
        void *ys[4];
        int rows[4], c = 0;
        for (int j = i; j < count; j++) {
            if (done[j] || w[j]->dtype != w[i]->dtype) continue;
            if (!qmat(b, w[j], "linear", &qp[c], &ap[c])) return -1;
            rows[c] = (int)w[j]->shape[0];
            bs[c] = bias ? bias[j] : NULL;
            ys[c] = y[j];
            done[j] = true;
            c++;
        }
        if (q_gemv_passes(b, w[i]->dtype, n, K, c, qp, ap, rows, bs, ys, f32out, false, xq, xds, xsum))
            return -1;
    }
    return 0;
}

// One weight of any kind the backend holds (quantized, or a bf16 matrix).
static int any_linear(kc_backend *b, const void *x, int n, const kaon_tensor *w, const float *bias, void *y,
                      int f32out) {
    if (is_qt(w)) return q_linear_set(b, x, n, 1, &w, &bias, &y, f32out);
    if (!bf16mat(w)) return kc_fail(b, "cuda linear: the weight must be an uploaded matrix");
    return kc_gemm_bf16(b, (const bf16 *)x, n, (const bf16 *)w->data, (int)w->shape[0], (int)w->shape[1], bias,
                        y, f32out);
}

int kc_quant_linear(kc_backend *b, const void *x, int n, const kaon_tensor *w, const kaon_tensor *bias, void *y,
                    int f32out) {
    if (!is_qt(w)) return 1;
    const uint8_t *qp, *ap;
    if (!qmat(b, w, "linear", &qp, &ap) || !fvec(b, bias, w->shape[0], "linear bias")) return -1;
    if (bias && f32out) return kc_fail(b, "cuda: bias with f32 output is not supported");
    if (n <= 0) return 0;
    const float *bs = bias ? (const float *)bias->data : NULL;
    return q_linear_set(b, x, n, 1, &w, &bs, &y, f32out) ? -1 : 0;
}

int kc_quant_linear_multi(kc_backend *b, const void *x, int n, int count, const kaon_tensor *const *w,
                          const kaon_tensor *const *bias, void *const *y) {
    if (count < 1 || count > 4) return 1;
    bool any = false, all = true;
    for (int i = 0; i < count; i++) {
        any = any || is_qt(w[i]);
        all = all && is_qt(w[i]);
    }
    if (!any) return 1;
    const float *bs[4];
    for (int i = 0; i < count; i++) {
        if (!w[i] || w[i]->ndim != 2) return kc_fail(b, "cuda linear_multi: missing weight");
        if (w[i]->shape[1] != w[0]->shape[1]) all = false;  // widths differ: one by one
        if (!fvec(b, bias ? bias[i] : NULL, w[i]->shape[0], "linear bias")) return -1;
        bs[i] = bias && bias[i] ? (const float *)bias[i]->data : NULL;
    }
    if (n <= 0) return 0;
    if (all) return q_linear_set(b, x, n, count, w, bs, y, 0) ? -1 : 0;
    for (int i = 0; i < count; i++)
        if (any_linear(b, x, n, w[i], bs[i], y[i], 0)) return -1;
    return 0;
}

int kc_quant_linear_silu_mul(kc_backend *b, const void *x, int n, const kaon_tensor *wg, const kaon_tensor *wu,
                             void *out) {
    if (!is_qt(wg) && !is_qt(wu)) return 1;
    if (!wg || !wu || wg->ndim != 2 || wu->ndim != 2) return kc_fail(b, "cuda linear_silu_mul: missing weight");
    if (wg->shape[0] != wu->shape[0] || wg->shape[1] != wu->shape[1])
        return kc_fail(b, "cuda linear_silu_mul: gate and up shapes differ");
    if (n <= 0) return 0;
    const int rows = (int)wg->shape[0], K = (int)wg->shape[1];
    if (n <= KC_QGEMV_MAX_N && wg->dtype == wu->dtype) {
        const uint8_t *qp[2], *ap[2];
        if (!qmat(b, wg, "gate", &qp[0], &ap[0]) || !qmat(b, wu, "up", &qp[1], &ap[1])) return -1;
        const int8_t *xq;
        const float2 *xds;
        const int *xsum;
        if (q_act(b, x, n, K, q_bpu(wg->dtype), &xq, &xds, &xsum)) return -1;
        const int rr[2] = {rows, rows};
        void *ys[2] = {out, NULL};
        return q_gemv_passes(b, wg->dtype, n, K, 2, qp, ap, rr, NULL, ys, 0, true, xq, xds, xsum) ? -1 : 0;
    }
    // Formats differ (or a large batch): gate into out, up into scratch, then silu(out) * up.
    kc_quant *s = qstate(b);
    if (!s || kc_grow(b, &s->up, &s->up_cap, (size_t)n * rows * sizeof(bf16), 1, "quantized scratch")) return -1;
    if (any_linear(b, x, n, wg, NULL, out, 0) || any_linear(b, x, n, wu, NULL, s->up, 0)) return -1;
    kc_silu_mul(b, (const bf16 *)out, (const bf16 *)s->up, (size_t)n * rows, (bf16 *)out);
    return b->err ? -1 : 0;
}

// Bytes kc_quant_upload's copy of host takes; 0 when it would not keep host quantized.
size_t kc_quant_bytes(kc_backend *b, const kaon_tensor *host) {
    kc_quant *s = qstate(b);
    QLayout L;
    if (!s || !s->enabled || !host || host->ndim != 2 || !is_q(host->dtype) ||
        q_layout(host->dtype, host->shape[0], host->shape[1], &L))
        return 0;
    return L.total;
}
