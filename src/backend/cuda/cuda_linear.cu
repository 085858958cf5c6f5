// Linear layers on the GPU. y [n, out] = x [n, in] @ w [out, in]^T, bf16 in and out, f32
// accumulation.
//
// Small batches (n <= 8, decode) are bound by reading the weight once: our GEMV gives each
// warp one output row, streams the row with 16-byte loads (four in flight per lane, not kept
// in L1), reads the few x rows through the read-only cache, and reduces with shuffles; a block
// holds 8 rows. One launch can serve several weights that share x (q, k and v), and gate and
// up can be read side by side with SiLU-and-mul applied before the one store. At batch 1 the
// RMSNorm between the sublayers can be split around the GEMVs (kc_gemv_fuse): the output GEMV
// adds its product into the residual stream and leaves the row times the next norm's weight
// and its sums of squares; the next GEMVs read that row and scale their dot products by
// 1 / rms, so no norm kernel runs between them.
// Larger batches go to cuBLASLt (descriptors and the chosen algorithm cached per shape).
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

#define GEMV_WARPS KC_GEMV_ROWS

typedef struct GemvArgs {
    const bf16 *w[4];
    const float *bias[4];
    void *y[4];    // bf16, or f32 when f32out
    int rows[4];
    int begin[4];  // first block of each weight
    int count;
    int f32out;
    kc_gemv_fuse fuse;  // GV_RESIDUAL and GV_NORMED (kc_gemv_fuse)
} GemvArgs;

// What a GEMV does around its dot products (kc_gemv_fuse): nothing; y += product (the residual
// stream), then xg = bf16(y * norm) and the block's sum of y^2 into parts; or x is such an xg
// and the products are scaled by 1 / rms summed from parts.
enum { GV_PLAIN, GV_RESIDUAL, GV_NORMED };

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 1 / rms of the row whose block sums of squares a GV_RESIDUAL GEMV left in f.parts (the
// thread's share requested now, summed by kc_norm_rinv later: see k_gemv).
static __device__ __forceinline__ float parts_share(const kc_gemv_fuse &f) { return kc_parts_share(f.parts, f.n_parts); }

// The weight of row block vb: a's weights take consecutive runs of blocks.
static __device__ __forceinline__ void gemv_pick(const GemvArgs &a, int vb, const bf16 *&w, const float *&bias,
                                                 void *&y, int &rows, int &begin) {
    w = a.w[0];
    bias = a.bias[0];
    y = a.y[0];
    rows = a.rows[0];
    begin = 0;
#pragma unroll
    for (int i = 1; i < 4; i++)
        if (i < a.count && vb >= a.begin[i]) {
            w = a.w[i];
            bias = a.bias[i];
            y = a.y[i];
            rows = a.rows[i];
            begin = a.begin[i];
        }
}

// U loads of a weight row in flight per lane (fewer when many x rows need registers).
template <int NB>
struct GemvU {
    static constexpr int U = NB <= 2 ? 8 : 4;
};

// Whether the lane's first U chunks exist (then they are requested before the loop).
template <int U>
static __device__ __forceinline__ bool gemv_full(int lane, int nc) { return lane + 32 * (U - 1) < nc; }

template <int U>
static __device__ __forceinline__ void gemv_load(const uint4 *wr, int c, uint4 (&wv)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) wv[u] = ld_stream(wr + c + 32 * u);
}

// gemv_load before the PDL wait where ptxas would otherwise sink it below (ld_stream_early).
template <int U>
static __device__ __forceinline__ void gemv_load_early(const uint4 *wr, int c, uint4 (&wv)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) wv[u] = ld_stream_early(wr + c + 32 * u);
}

// One warp's dot products of the weight row wr (nc chunks of 8) with the NB rows of x at xr: the
// lane's chunks lane, lane + 32, ..., U at a time, the first U already in wv when gemv_full;
// acc[b] ends as the warp's total in every lane.
template <int NB, int U>
static __device__ __forceinline__ void gemv_dots(const uint4 *wr, const uint4 *xr, int nc, int lane, uint4 (&wv)[U],
                                                 float (&acc)[NB]) {
    int c = lane;
    for (bool first = true; c + 32 * (U - 1) < nc; c += 32 * U, first = false) {
        if (!first) gemv_load<U>(wr, c, wv);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const uint4 *xb = xr + (size_t)b * nc + c;
            float s = acc[b];
#pragma unroll
            for (int u = 0; u < U; u++) {
                s = dot8(wv[u], __ldg(xb + 32 * u), s);
            }
            acc[b] = s;
        }
    }
    for (; c < nc; c += 32) {
        const uint4 w0 = ld_stream(wr + c);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            acc[b] = dot8(w0, __ldg(xr + (size_t)b * nc + c), acc[b]);
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = warp_sum(acc[b]);
}

// MINB: blocks per SM the register budget must allow. 1 lets ptxas keep all U loads of a lane
// in flight with room to spare; 4 (64 registers, checked free of spills for NB <= 2) doubles the
// warps resident per SM, so one wave covers a 4,096-row matrix (KAON_GEMV_OCC picks).
// MODE (batch 1; GV_RESIDUAL with one weight): see GemvArgs' modes. GV_RESIDUAL loads y's old
// value as soon as the kernel before has finished, not after the row's last weights; the other
// two end at a block barrier, so all of their warps stay to the end.
template <int NB, int MINB = 1, int MODE = GV_PLAIN>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
k_gemv(const bf16 *__restrict__ x, int in, GemvArgs a) {
    const bf16 *w;
    const float *bias;
    void *y;
    int rows, begin;
    gemv_pick(a, blockIdx.x, w, bias, y, rows, begin);
    kc_pdl_trigger();
    const int row = ((int)blockIdx.x - begin) * GEMV_WARPS + (threadIdx.x >> 5);
    const bool active = row < rows;
    const int lane = threadIdx.x & 31, nc = in >> 3;
    const uint4 *wr = (const uint4 *)(w + (size_t)(active ? row : 0) * in);
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = 0.f;
    constexpr int U = GemvU<NB>::U;
    // The first weights are requested before waiting for the kernel that writes x.
    uint4 wv[U];
    if (active && gemv_full<U>(lane, nc)) gemv_load_early<U>(wr, lane, wv);
    kc_pdl_wait();
    if (MODE == GV_PLAIN && !active) return;
    float old = 0.f, ss = 0.f;
    if (MODE == GV_RESIDUAL && active && lane == 0) old = __bfloat162float(((const bf16 *)y)[row]);
    if (MODE == GV_NORMED) ss = parts_share(a.fuse);
    if (active) gemv_dots<NB, U>(wr, (const uint4 *)x, nc, lane, wv, acc);
    const float bb = active && bias ? bias[row] : 0.f;
    if (MODE == GV_RESIDUAL) {  // linear, then rmsnorm's add: each rounded to bf16
        float v = 0.f;
        if (active && lane == 0) {
            const bf16 s = __float2bfloat16(old + __bfloat162float(__float2bfloat16(acc[0] + bb)));
            ((bf16 *)y)[row] = s;
            v = __bfloat162float(s);
            a.fuse.xg[row] = __float2bfloat16(v * a.fuse.norm[row]);
        }
        v = kc_norm_block_sum(v * v);
        if (threadIdx.x == 0) a.fuse.parts[blockIdx.x] = v;
        return;
    }
    float scale = 1.f;
    if (MODE == GV_NORMED) scale = kc_norm_rinv(ss, in, a.fuse.eps);
    if (active && lane == 0) {
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const float v = acc[b] * scale + bb;
            if (a.f32out) ((float *)y)[(size_t)b * rows + row] = v;
            else ((bf16 *)y)[(size_t)b * rows + row] = __float2bfloat16(v);
        }
    }
}

// Gate and up rows side by side: ag[b], au[b] as gemv_dots' acc, 2U loads in flight per lane.
template <int NB, int U>
static __device__ __forceinline__ void gemv_dots2(const uint4 *gr, const uint4 *ur, const uint4 *xr, int nc, int lane,
                                                  uint4 (&gv)[U], uint4 (&uv)[U], float (&ag)[NB], float (&au)[NB]) {
    int c = lane;
    for (bool first = true; c + 32 * (U - 1) < nc; c += 32 * U, first = false) {
        if (!first) {
            gemv_load<U>(gr, c, gv);
            gemv_load<U>(ur, c, uv);
        }
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const uint4 *xb = xr + (size_t)b * nc + c;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const uint4 xv = __ldg(xb + 32 * u);
                ag[b] = dot8(gv[u], xv, ag[b]);
                au[b] = dot8(uv[u], xv, au[b]);
            }
        }
    }
    for (; c < nc; c += 32) {
        const uint4 g0 = ld_stream(gr + c), u0 = ld_stream(ur + c);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            const uint4 x0 = __ldg(xr + (size_t)b * nc + c);
            ag[b] = dot8(g0, x0, ag[b]);
            au[b] = dot8(u0, x0, au[b]);
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        ag[b] = warp_sum(ag[b]);
        au[b] = warp_sum(au[b]);
    }
}

// bf16(bf16(silu(g)) * u) of the two dot products, each rounded to bf16 first (as the separate
// ops would).
static __device__ __forceinline__ bf16 silu_mul_out(float ag, float au) {
    const float g = __bfloat162float(__float2bfloat16(ag));
    const float u = __bfloat162float(__float2bfloat16(au));
    const float s = __bfloat162float(__float2bfloat16(g / (1.f + expf(-g))));
    return __float2bfloat16(s * u);
}

// out[b, r] = silu(x[b] . wg[r]) * (x[b] . wu[r]), rounded as silu_mul_out. NORMED (batch 1):
// x is a GV_RESIDUAL GEMV's xg, both products scaled by 1 / rms from f.parts (as GV_NORMED).
template <int NB, int MINB = 1, bool NORMED = false>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
k_gemv_silu(const bf16 *__restrict__ x, int in, const bf16 *__restrict__ wg,
            const bf16 *__restrict__ wu, int rows, bf16 *__restrict__ out, kc_gemv_fuse f) {
    kc_pdl_trigger();
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const bool active = row < rows;
    const int lane = threadIdx.x & 31, nc = in >> 3;
    const uint4 *gr = (const uint4 *)(wg + (size_t)(active ? row : 0) * in);
    const uint4 *ur = (const uint4 *)(wu + (size_t)(active ? row : 0) * in);
    float ag[NB], au[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) ag[b] = au[b] = 0.f;
    constexpr int U = NB <= 2 ? 4 : 2;  // 2U weight loads in flight per lane
    // The first weights are requested before waiting for the kernel that writes x.
    uint4 gv[U], uv[U];
    if (active && gemv_full<U>(lane, nc)) {
        gemv_load_early<U>(gr, lane, gv);
        gemv_load_early<U>(ur, lane, uv);
    }
    kc_pdl_wait();
    if (!NORMED && !active) return;
    const float ss = NORMED ? parts_share(f) : 0.f;
    if (active) gemv_dots2<NB, U>(gr, ur, (const uint4 *)x, nc, lane, gv, uv, ag, au);
    const float scale = NORMED ? kc_norm_rinv(ss, in, f.eps) : 1.f;
    if (active && lane == 0) {
#pragma unroll
        for (int b = 0; b < NB; b++) out[(size_t)b * rows + row] = silu_mul_out(ag[b] * scale, au[b] * scale);
    }
}

// The qkv GEMV of a split norm (GV_NORMED; a.w = q, k, v) with RoPE and the KV write in its
// epilogue, at batch 1 for 128-wide heads with full NeoX rotary (Llama, Mistral, Qwen2): q is
// rotated in place, k rotated into its cache row, v copied to its own. A q or k block's 8 warps
// take 4 rotary pairs (rows j and j + 64 of one head), so a pair meets in shared memory; v blocks
// take 8 consecutive rows. Values are rounded to bf16 as the GEMV's output before the rotation,
// whose arithmetic is rope_kv_write's (rope128_pairs).
__global__ void __launch_bounds__(GEMV_WARPS * 32, 1)
k_gemv_qkv_rope(const bf16 *__restrict__ x, int in, GemvArgs a, QkvRope r) {
    __shared__ float vals[GEMV_WARPS];
    const bf16 *w;
    const float *bias;
    void *y;
    int rows, begin;
    gemv_pick(a, blockIdx.x, w, bias, y, rows, begin);
    kc_pdl_trigger();
    const int seg = (int)blockIdx.x >= a.begin[2] ? 2 : (int)blockIdx.x >= a.begin[1] ? 1 : 0;
    const int lb = (int)blockIdx.x - begin, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = (lb & 15) * 4 + (warp >> 1);  // q, k: the warp's rotary pair in its head
    const int row = seg == 2 ? lb * GEMV_WARPS + warp : (lb >> 4) * 128 + j + (warp & 1) * 64;
    const int nc = in >> 3;
    const uint4 *wr = (const uint4 *)(w + (size_t)row * in);
    constexpr int U = GemvU<1>::U;
    uint4 wv[U];
    if (gemv_full<U>(lane, nc)) gemv_load_early<U>(wr, lane, wv);
    const float pos = (float)ld_meta(r.pos);
    const int64_t slot = ld_meta(r.slot);
    kc_pdl_wait();
    const float ss = parts_share(a.fuse);
    float acc[1] = {0.f};
    gemv_dots<1, U>(wr, (const uint4 *)x, nc, lane, wv, acc);
    const float scale = kc_norm_rinv(ss, in, a.fuse.eps);
    const float v = __bfloat162float(__float2bfloat16(acc[0] * scale + (bias ? bias[row] : 0.f)));
    const bool cached = slot >= 0 && slot < r.n_slots;
    const size_t crow = (size_t)slot * r.nkv * 128;
    if (seg == 2) {
        if (lane == 0 && cached) r.vcache[crow + row] = __float2bfloat16(v);
        return;
    }
    if (lane == 0) vals[warp] = v;
    __syncthreads();
    if (lane != 0 || (warp & 1)) return;
    const float lo = vals[warp], hi = vals[warp + 1];
    float sn, cs;
    sincosf(pos * r.inv_freq[j], &sn, &cs);
    const bf16 rlo = __float2bfloat16(lo * cs - hi * sn), rhi = __float2bfloat16(lo * sn + hi * cs);
    if (seg == 0) {
        ((bf16 *)y)[row] = rlo;
        ((bf16 *)y)[row + 64] = rhi;
    } else if (cached) {
        r.kcache[crow + row] = rlo;
        r.kcache[crow + row + 64] = rhi;
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

bool kc_gemv_occ_hi(int which) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KAON_GEMV_OCC");
        v = e ? atoi(e) : KC_OCC_MOE_DOWN;  // measured: docs/PERF.md (2026-12-03)
    }
    return (v & which) != 0;
}

// The fused modes serve batch 1 (bf16 out; the residual mode one weight).
static bool fuse_ok(const kc_gemv_fuse *f, int n, int count, int in, int f32out) {
    if (!f) return true;
    if (n != 1 || f32out || in > KC_GEMV_NORM_MAX_IN || (f->residual && count != 1) || f->residual == f->normed)
        return false;
    return f->residual ? f->norm && f->xg && f->parts : f->parts && f->n_parts > 0;
}

int kc_gemv_multi(kc_backend *b, const bf16 *x, int n, int in, int count, const bf16 *const *w,
                  const int *rows, const float *const *bias, void *const *y, int f32out, const kc_gemv_fuse *fuse) {
    if (n < 1 || n > KC_GEMV_MAX_N || count < 1 || count > 4 || in % 8 || in <= 0 || !aligned16(x) ||
        !fuse_ok(fuse, n, count, in, f32out))
        return 1;
    GemvArgs a;
    memset(&a, 0, sizeof a);
    a.count = count;
    a.f32out = f32out;
    int64_t blocks = 0;
    for (int i = 0; i < count; i++) {
        if (!aligned16(w[i]) || rows[i] <= 0) return 1;
        a.w[i] = w[i];
        a.bias[i] = bias ? bias[i] : NULL;
        a.y[i] = y[i];
        a.rows[i] = rows[i];
        a.begin[i] = (int)blocks;
        blocks += (rows[i] + GEMV_WARPS - 1) / GEMV_WARPS;
    }
    if (blocks > INT32_MAX / 2 || (fuse && fuse->residual && blocks > KC_GEMV_NORM_MAX_IN / GEMV_WARPS)) return 1;
    const dim3 grid((unsigned)blocks), block(GEMV_WARPS * 32);
    if (fuse) {
        a.fuse = *fuse;
        if (fuse->residual) kc_launch(b, k_gemv<1, 1, GV_RESIDUAL>, grid, block, 0, x, in, a);
        else kc_launch(b, k_gemv<1, 1, GV_NORMED>, grid, block, 0, x, in, a);
        return kc_launched(b, fuse->residual ? "gemv (residual)" : "gemv (normed)");
    }
    if (n <= 2 && kc_gemv_occ_hi(KC_OCC_GEMV)) {
        if (n == 1) kc_launch(b, k_gemv<1, 4>, grid, block, 0, x, in, a);
        else kc_launch(b, k_gemv<2, 4>, grid, block, 0, x, in, a);
        return kc_launched(b, "gemv");
    }
    switch (n) {
    case 1: kc_launch(b, k_gemv<1>, grid, block, 0, x, in, a); break;
    case 2: kc_launch(b, k_gemv<2>, grid, block, 0, x, in, a); break;
    case 3: kc_launch(b, k_gemv<3>, grid, block, 0, x, in, a); break;
    case 4: kc_launch(b, k_gemv<4>, grid, block, 0, x, in, a); break;
    case 5: kc_launch(b, k_gemv<5>, grid, block, 0, x, in, a); break;
    case 6: kc_launch(b, k_gemv<6>, grid, block, 0, x, in, a); break;
    case 7: kc_launch(b, k_gemv<7>, grid, block, 0, x, in, a); break;
    default: kc_launch(b, k_gemv<8>, grid, block, 0, x, in, a); break;
    }
    return kc_launched(b, "gemv");
}

int kc_gemv_silu(kc_backend *b, const bf16 *x, int n, int in, const bf16 *wg, const bf16 *wu,
                 int rows, bf16 *out, const kc_gemv_fuse *fuse) {
    if (n < 1 || n > KC_GEMV_MAX_N || in % 8 || in <= 0 || rows <= 0 || !aligned16(x) ||
        !aligned16(wg) || !aligned16(wu) || !fuse_ok(fuse, n, 1, in, 0) || (fuse && fuse->residual))
        return 1;
    const int blocks = (rows + GEMV_WARPS - 1) / GEMV_WARPS;
    const dim3 grid((unsigned)blocks), block(GEMV_WARPS * 32);
    kc_gemv_fuse f;
    memset(&f, 0, sizeof f);
    if (fuse) {
        kc_launch(b, k_gemv_silu<1, 1, true>, grid, block, 0, x, in, wg, wu, rows, out, *fuse);
        return kc_launched(b, "gemv_silu (normed)");
    }
    if (n <= 2 && kc_gemv_occ_hi(KC_OCC_SILU)) {
        if (n == 1) kc_launch(b, k_gemv_silu<1, 4>, grid, block, 0, x, in, wg, wu, rows, out, f);
        else kc_launch(b, k_gemv_silu<2, 4>, grid, block, 0, x, in, wg, wu, rows, out, f);
        return kc_launched(b, "gemv_silu");
    }
    switch (n) {
    case 1: kc_launch(b, k_gemv_silu<1>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    case 2: kc_launch(b, k_gemv_silu<2>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    case 3: kc_launch(b, k_gemv_silu<3>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    case 4: kc_launch(b, k_gemv_silu<4>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    case 5: kc_launch(b, k_gemv_silu<5>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    case 6: kc_launch(b, k_gemv_silu<6>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    case 7: kc_launch(b, k_gemv_silu<7>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    default: kc_launch(b, k_gemv_silu<8>, grid, block, 0, x, in, wg, wu, rows, out, f); break;
    }
    return kc_launched(b, "gemv_silu");
}

int kc_gemv_qkv_rope(kc_backend *b, const bf16 *x, int in, const bf16 *const *w, const float *const *bias, bf16 *q,
                     const kc_gemv_fuse *fuse, const QkvRope *r) {
    if (!fuse || !fuse->normed || in % 8 || in > KC_GEMV_NORM_MAX_IN || !aligned16(x) || r->nh <= 0 || r->nkv <= 0)
        return 1;
    GemvArgs a;
    memset(&a, 0, sizeof a);
    a.count = 3;
    a.fuse = *fuse;
    const int rows[3] = {r->nh * 128, r->nkv * 128, r->nkv * 128};
    int blocks = 0;
    for (int i = 0; i < 3; i++) {
        if (!aligned16(w[i])) return 1;
        a.w[i] = w[i];
        a.bias[i] = bias[i];
        a.y[i] = i == 0 ? (void *)q : NULL;
        a.rows[i] = rows[i];
        a.begin[i] = blocks;
        blocks += rows[i] / GEMV_WARPS;
    }
    kc_launch(b, k_gemv_qkv_rope, dim3((unsigned)blocks), dim3(GEMV_WARPS * 32), 0, x, in, a, *r);
    return kc_launched(b, "gemv (qkv, rope, kv write)");
}

// ---- cuBLASLt ------------------------------------------------------------------------------

static void gemm_destroy(kc_gemm *g) {
    if (!g->valid) return;
    cublasLtMatrixLayoutDestroy(g->a);
    cublasLtMatrixLayoutDestroy(g->b);
    cublasLtMatrixLayoutDestroy(g->c);
    cublasLtMatmulDescDestroy(g->op);
    g->valid = 0;
}

void kc_gemm_cache_free(kc_backend *b) {
    for (int i = 0; i < KC_MAX_GEMMS; i++) gemm_destroy(&b->gemms[i]);
}

// Column-major view of the row-major problem: C [out x n] = W^T' [out x in] * X [in x n],
// where W is stored as a column-major [in x out] matrix (transposed) and X as [in x n].
static kc_gemm *gemm_get(kc_backend *b, int m, int n, int k, int f32out) {
    for (int i = 0; i < KC_MAX_GEMMS; i++) {
        kc_gemm *g = &b->gemms[i];
        if (g->valid && g->m == m && g->n == n && g->k == k && g->f32out == f32out) {
            g->last_use = ++b->tick;
            return g;
        }
    }
    kc_gemm *slot = NULL;  // a free entry, else the least recently used
    for (int i = 0; i < KC_MAX_GEMMS && !slot; i++)
        if (!b->gemms[i].valid) slot = &b->gemms[i];
    if (!slot) {
        slot = &b->gemms[0];
        for (int i = 1; i < KC_MAX_GEMMS; i++)
            if (b->gemms[i].last_use < slot->last_use) slot = &b->gemms[i];
    }
    if (b->capturing) {
        kc_fail(b, "cuda: new matrix shape %dx%dx%d while recording a graph", m, n, k);
        return NULL;
    }
    gemm_destroy(slot);
    kc_gemm *g = slot;
    memset(g, 0, sizeof *g);
    cublasStatus_t st;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    st = cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS) goto fail;
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (cublasLtMatrixLayoutCreate(&g->a, CUDA_R_16BF, k, m, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&g->b, CUDA_R_16BF, k, n, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&g->c, f32out ? CUDA_R_32F : CUDA_R_16BF, m, n, m) != CUBLAS_STATUS_SUCCESS) {
        st = CUBLAS_STATUS_ALLOC_FAILED;
        goto fail;
    }
    {
        cublasLtMatmulPreference_t pref;
        if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) goto fail;
        size_t ws = b->lt_ws_bytes;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        st = cublasLtMatmulAlgoGetHeuristic(b->lt, g->op, g->a, g->b, g->c, g->c, pref, 1, &res, &nres);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || nres < 1) {
            if (st == CUBLAS_STATUS_SUCCESS) st = CUBLAS_STATUS_NOT_SUPPORTED;
            goto fail;
        }
        g->algo = res.algo;
    }
    g->m = m;
    g->n = n;
    g->k = k;
    g->f32out = f32out;
    g->valid = 1;
    g->last_use = ++b->tick;
    return g;
fail:
    if (g->a) cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) cublasLtMatrixLayoutDestroy(g->b);
    if (g->c) cublasLtMatrixLayoutDestroy(g->c);
    if (g->op) cublasLtMatmulDescDestroy(g->op);
    memset(g, 0, sizeof *g);
    kc_fail(b, "cuBLASLt: no bf16 algorithm for %d x %d x %d (status %d)", m, n, k, (int)st);
    return NULL;
}

int kc_gemm_bf16(kc_backend *b, const bf16 *x, int n, const bf16 *w, int out, int in,
                 const float *bias, void *y, int f32out) {
    if (n <= 0 || out <= 0 || in <= 0) return 0;
    if (n <= KC_GEMV_MAX_N) {
        int rc = kc_gemv_multi(b, x, n, in, 1, &w, &out, &bias, &y, f32out, NULL);
        if (rc <= 0) return rc;
    }
    if (bias && f32out) return kc_fail(b, "cuda: bias with f32 output is not supported");
    kc_gemm *g = gemm_get(b, out, n, in, f32out);
    if (!g) return -1;
    const float alpha = 1.f, beta = 0.f;
    cublasStatus_t st = cublasLtMatmul(b->lt, g->op, &alpha, w, g->a, x, g->b, &beta, y, g->c, y, g->c,
                                       &g->algo, b->lt_ws, b->lt_ws_bytes, b->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        return kc_fail(b, "cuBLASLt matmul %d x %d x %d failed (status %d)", out, n, in, (int)st);
    if (bias) kc_add_bias(b, (bf16 *)y, bias, n, out);
    return 0;
}
