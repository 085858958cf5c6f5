// FP8 experts (DeepSeek-V3/R1, Kimi-K2, Qwen3-FP8: e4m3 codes with 128 x 128 block scales; or one
// scale per row) for the moe op. Weight-only: the codes are dequantized in registers (GEMV) or
// on their way into shared memory (grouped GEMM) and multiplied with the bf16 activations in
// f32, so the experts read half the bytes of bf16 ones and the activations keep their precision
// (DeepSeek's reference quantizes them per group of 128; that differs from this by the
// quantization error of the activations, which the tests bound).
// The structure and the roundings are cuda_moe.cu's: the routing kernels and the plan are the
// same launches; gate and up outputs, silu, their product and each expert's output round to bf16.
#include "backend/cuda/cuda_moe.cuh"

#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <mma.h>

#define U8 2  // 16-byte weight loads per lane and matrix in one GEMV step (two steps in flight)

// 16 e4m3 codes (one 16-byte load) as floats, column order kept.
static __device__ __forceinline__ void e4m3x16(const uint4 &v, float (&f)[16]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] & 0xffffu), __NV_E4M3);
        const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> 16), __NV_E4M3);
        const float2 a = __half22float2(*(const __half2 *)&lo), b = __half22float2(*(const __half2 *)&hi);
        f[4 * i] = a.x;
        f[4 * i + 1] = a.y;
        f[4 * i + 2] = b.x;
        f[4 * i + 3] = b.y;
    }
}

// sum_i f[i] * x[i] over 16 bf16 activations (two 16-byte loads).
static __device__ __forceinline__ float dot16(const float (&f)[16], const uint4 *x) {
    const uint4 a = __ldg(x), b = __ldg(x + 1);
    const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&a, *b2 = (const __nv_bfloat162 *)&b;
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 p = __bfloat1622float2(a2[e]), q = __bfloat1622float2(b2[e]);
        s = fmaf(f[2 * e], p.x, s);
        s = fmaf(f[2 * e + 1], p.y, s);
        s = fmaf(f[8 + 2 * e], q.x, s);
        s = fmaf(f[8 + 2 * e + 1], q.y, s);
    }
    return s;
}

// The scale of chunk c (16 columns) of row r: its 128 x 128 block's, or 1 (per-row scales are
// applied to the row's sum).
static __device__ __forceinline__ float chunk_scale(const float *s, int block, int cols, int r, int c) {
    return block ? __ldg(s + (size_t)(r >> 7) * cols + (c >> 3)) : 1.f;
}

// ---- small batches: gate/up, then down + combine ----------------------------------------------
// Each warp walks a list of items (gate/up: RPW rows of one expert; down: every active expert's
// row r) in steps of U8 16-byte chunks per lane and matrix, on a warp-uniform schedule, with the
// next step's weights in flight while the current step computes: one launch wave of blocks whose
// warps keep loads outstanding, instead of short-lived warps that each wait for one round trip
// (the first version, one row per warp: 1.0 / 0.56 TB/s in ncu on Qwen3-30B-A3B's shapes).

#define RPW 2  // gate/up rows per warp

template <int NW>
static __device__ __forceinline__ void load_step(uint4 (&v)[NW][U8], const uint4 *const (&wr)[NW], int cb, int nc,
                                                 int lane) {
#pragma unroll
    for (int q = 0; q < U8; q++) {
        const int c = cb + lane + 32 * q;
#pragma unroll
        for (int i = 0; i < NW; i++)
            if (c < nc) v[i][q] = ld_stream(wr[i] + c);
    }
}

// acc[i][b] += the step's chunks of matrix i dotted with token row xr[b] (16-byte chunks).
template <int NW>
static __device__ __forceinline__ void compute_step(const uint4 (&v)[NW][U8], const float *const (&s)[NW], int block,
                                                    int scols, int r, int cb, int nc,
                                                    const uint4 *const (&xr)[MOE_GEMV_MAX_N], int ne, int lane,
                                                    float (&acc)[NW][MOE_GEMV_MAX_N]) {
#pragma unroll
    for (int q = 0; q < U8; q++) {
        const int c = cb + lane + 32 * q;
        if (c >= nc) break;
#pragma unroll
        for (int i = 0; i < NW; i++) {
            float f[16];
            e4m3x16(v[i][q], f);
            const float sc = chunk_scale(s[i], block, scols, r, c);
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++)
                if (b < ne) acc[i][b] = fmaf(sc, dot16(f, xr[b] + 2 * c), acc[i][b]);
        }
    }
}

template <int NW>
static __device__ __forceinline__ void copy_step(uint4 (&d)[NW][U8], const uint4 (&v)[NW][U8]) {
#pragma unroll
    for (int i = 0; i < NW; i++)
#pragma unroll
        for (int q = 0; q < U8; q++) d[i][q] = v[i][q];
}

// Block (row block, i): active expert i; warp w's rows r = (blockIdx.x * RPW + j) * GEMV_WARPS + w,
// j < RPW, of gate and up with the expert's tokens: H[slot, r] = bf16(silu(bf16(g))) * bf16(u).
__global__ void __launch_bounds__(GEMV_WARPS * 32, 3)  // 3 blocks per SM: warps to hide the conversions' latency
k_moe8_small_gu(const bf16 *__restrict__ x, int dim, int F, MoeW8 w, const int *__restrict__ active, int E,
                const int *__restrict__ off, const int *__restrict__ slot_tok, bf16 *__restrict__ H) {
    kc_pdl_trigger();
    kc_pdl_wait();
    // The count and this block's expert in one round trip (blockIdx.y < max_active <= E: in
    // bounds), then the expert's first weights before its offsets and tokens.
    const int cnt = ld_plan(active + E), e = ld_plan(active + blockIdx.y);
    if ((int)blockIdx.y >= cnt) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = (int)blockIdx.x * RPW * GEMV_WARPS + warp;
    const int items = min(RPW, (F - r0 + GEMV_WARPS - 1) / GEMV_WARPS);  // rows r0 + j * GEMV_WARPS < F
    if (items <= 0) return;
    const int nc = dim >> 4;
    const uint8_t *g0 = w.gate + (size_t)e * w.sgate, *u0 = w.up + (size_t)e * w.sup;
    const float *const sc[2] = {w.gs + (size_t)e * w.sgs, w.us + (size_t)e * w.sus};
    auto rows_of = [&](int j, const uint4 *(&wr)[2]) {
        const int r = r0 + j * GEMV_WARPS;
        wr[0] = (const uint4 *)(g0 + (size_t)r * dim);
        wr[1] = (const uint4 *)(u0 + (size_t)r * dim);
    };
    uint4 cur[2][U8], nxt[2][U8];
    const uint4 *wr[2], *wn[2];
    rows_of(0, wr);
    load_step<2>(cur, wr, 0, nc, lane);
    const int s0 = off[e], ne = min(off[e + 1] - s0, MOE_GEMV_MAX_N);
    const uint4 *xr[MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) xr[b] = (const uint4 *)(x + (size_t)slot_tok[s0 + (b < ne ? b : 0)] * dim);
    float acc[2][MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[0][b] = acc[1][b] = 0.f;
    for (int j = 0, cb = 0; j < items;) {
        int nj = j, ncb = cb + 32 * U8;
        if (ncb >= nc) {
            nj = j + 1;
            ncb = 0;
        }
        if (nj < items) {
            rows_of(nj, wn);
            load_step<2>(nxt, wn, ncb, nc, lane);
        }
        const int r = r0 + j * GEMV_WARPS;
        compute_step<2>(cur, sc, w.block, w.gcols, r, cb, nc, xr, ne, lane, acc);
        if (nj != j) {  // row r done
            const float rg = w.block ? 1.f : sc[0][r], ru = w.block ? 1.f : sc[1][r];
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++)
                if (b < ne) {
                    const float g = bfr(rg * warp_sum(acc[0][b])), u = bfr(ru * warp_sum(acc[1][b]));
                    if (lane == 0) H[(size_t)(s0 + b) * F + r] = __float2bfloat16(bfr(g / (1.f + expf(-g))) * u);
                }
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[0][b] = acc[1][b] = 0.f;
        }
        copy_step<2>(cur, nxt);
        j = nj;
        cb = ncb;
    }
}

// Down projections fused with the combine (k_moe_small_down's sums and roundings, cuda_moe.cu):
// warp w of a block owns output row r = blockIdx.x * GEMV_WARPS + w and walks the active experts
// (its items); then its lanes < n add them per token, with the shared expert's output YS from the
// linear ops (or none).
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_moe8_small_down(const bf16 *__restrict__ H, int n, int dim, int F, MoeW8 w, const bf16 *__restrict__ YS,
                  const float *__restrict__ SG, int K, const int *__restrict__ active, int E,
                  const int *__restrict__ off, const int *__restrict__ inv, const float *__restrict__ topk_w,
                  bf16 *__restrict__ out) {
    __shared__ float s_y[GEMV_WARPS][MOE_GEMV_MAX_N * MOE_MAX_K];  // routed outputs by slot, per row
    kc_pdl_trigger();
    kc_pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = (int)blockIdx.x * GEMV_WARPS + warp, nc = F >> 4, items = active[E];
    if (r >= dim) return;
    int e = active[0];
    auto expert = [&](int t, const uint4 *(&wr)[1], const float *(&ds)[1]) {
        const int et = active[t];
        wr[0] = (const uint4 *)(w.down + (size_t)et * w.sdown + (size_t)r * F);
        ds[0] = w.ds + (size_t)et * w.sds;
        return et;
    };
    uint4 cur[1][U8], nxt[1][U8];
    const uint4 *wr[1], *wn[1];
    const float *ds[1], *dn[1];
    if (items > 0) {
        expert(0, wr, ds);
        load_step<1>(cur, wr, 0, nc, lane);
    }
    float acc[1][MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[0][b] = 0.f;
    for (int t = 0, cb = 0; t < items;) {
        int nt = t, ncb = cb + 32 * U8, en = e;
        if (ncb >= nc) {
            nt = t + 1;
            ncb = 0;
        }
        if (nt < items) {
            if (nt != t) en = expert(nt, wn, dn);
            else {
                wn[0] = wr[0];
                dn[0] = ds[0];
            }
            load_step<1>(nxt, wn, ncb, nc, lane);
        }
        const int s0 = off[e], ne = min(off[e + 1] - s0, MOE_GEMV_MAX_N);
        const uint4 *xr[MOE_GEMV_MAX_N];
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++) xr[b] = (const uint4 *)(H + (size_t)(s0 + (b < ne ? b : 0)) * F);
        compute_step<1>(cur, ds, w.block, w.dcols, r, cb, nc, xr, ne, lane, acc);
        if (nt != t) {  // expert e done
            const float rs = w.block ? 1.f : ds[0][r];
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++)
                if (b < ne) {
                    const float v = bfr(rs * warp_sum(acc[0][b]));
                    if (lane == 0) s_y[warp][s0 + b] = v;
                }
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[0][b] = 0.f;
        }
        copy_step<1>(cur, nxt);
        if (nt != t && nt < items) {
            wr[0] = wn[0];
            ds[0] = dn[0];
        }
        t = nt;
        cb = ncb;
        e = en;
    }
    __syncwarp();
    if (lane >= n) return;
    const int tk = lane;
    const int *iv = inv + (size_t)tk * K;
    const float *wt = topk_w + (size_t)tk * K;
    if (iv[0] < 0) {  // padding
        out[(size_t)tk * dim + r] = __float2bfloat16(0.f);
        return;
    }
    float a = 0.f;
    if (YS) a = (SG ? 1.f / (1.f + expf(-bfr(SG[tk]))) : 1.f) * __bfloat162float(YS[(size_t)tk * dim + r]);
    for (int j = 0; j < K; j++) {
        const int sl = iv[j];
        if (sl < 0) continue;
        a = fmaf(bfr(wt[j]), s_y[warp][sl], a);  // HF: weights cast to bf16
    }
    out[(size_t)tk * dim + r] = __float2bfloat16(a);
}

int kc_moe8_small_gu(kc_backend *b, const bf16 *x, int dim, int F, const MoeW8 &w, int max_active, const MoeBufs &m,
                     int E) {
    const dim3 grid((unsigned)((F + RPW * GEMV_WARPS - 1) / (RPW * GEMV_WARPS)), (unsigned)max_active);
    return kc_check(b, kc_launch(b, k_moe8_small_gu, grid, dim3(GEMV_WARPS * 32), 0, x, dim, F, w, m.active, E, m.off,
                                 m.slot_tok, m.H),
                    "moe fp8 experts");
}

int kc_moe8_small_down(kc_backend *b, int n, int dim, int F, const MoeW8 &w, const bf16 *YS, const float *SG, int K,
                       const MoeBufs &m, int E, bf16 *out) {
    const dim3 grid((unsigned)((dim + GEMV_WARPS - 1) / GEMV_WARPS));
    return kc_check(b, kc_launch(b, k_moe8_small_down, grid, dim3(GEMV_WARPS * 32), 0, m.H, n, dim, F, w, YS, SG, K,
                                 m.active, E, m.off, m.inv, m.topk_w, out),
                    "moe fp8 down and combine");
}

// ---- larger batches: grouped GEMM, codes dequantized into shared memory ----------------------------

// As k_moe_gemm (cuda_moe.cu): C tile [BM, BN] of the rows of expert tile.x times B^T, WMMA bf16
// 16x16x16 with f32 accumulators. B's codes travel by cp.async into a raw double buffer (one
// 16-byte chunk of a 64 x 32 tile per thread and matrix); each thread then dequantizes its own
// chunk (code x its block's or row's scale, rounded to bf16) into the tile the MMAs read.
template <bool GU>
__global__ void __launch_bounds__(128)
k_moe8_gemm(const bf16 *__restrict__ A, int Kd, int N, MoeW8 w, const int2 *__restrict__ tiles,
            const int *__restrict__ n_tiles, const int *__restrict__ off, const int *__restrict__ slot_tok,
            bf16 *__restrict__ C) {
    using namespace nvcuda;
    if ((int)blockIdx.y >= *n_tiles) return;
    const int2 tile = tiles[blockIdx.y];
    const int e = tile.x, s_begin = off[e] + tile.y, s_end = min(off[e + 1], s_begin + BM);
    const int n0 = blockIdx.x * BN;
    constexpr int NB = GU ? 2 : 1;
    const uint8_t *B[2] = {GU ? w.gate + (size_t)e * w.sgate : w.down + (size_t)e * w.sdown,
                           GU ? w.up + (size_t)e * w.sup : nullptr};
    const float *S[2] = {GU ? w.gs + (size_t)e * w.sgs : w.ds + (size_t)e * w.sds,
                         GU ? w.us + (size_t)e * w.sus : nullptr};
    const int scols = GU ? w.gcols : w.dcols;

    __shared__ __align__(128) bf16 sA[2][BM * LDS];
    __shared__ __align__(128) bf16 sB[NB][BN * LDS];
    __shared__ __align__(16) uint8_t raw[2][NB][BN * BK];

    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int lr = tid >> 2, lc = (tid & 3) * 8;          // A: rows lr, lr + 32; 8 columns
    const int br = tid >> 1, bc = (tid & 1) * 16;         // B: row br, 16 codes
    const bf16 *arow[2];
    bool aval[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int s = s_begin + lr + 32 * h;
        aval[h] = s < s_end;
        arow[h] = A + (size_t)(aval[h] ? (GU ? slot_tok[s] : s) : 0) * Kd;
    }
    const int nrow = n0 + br;
    const bool brow = nrow < N;
    auto load = [&](int stage, int k0) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int k = k0 + lc;
            const bool kin = k < Kd;
            cp16(&sA[stage][(lr + 32 * h) * LDS + lc], arow[h] + (kin ? k : 0), aval[h] && kin);
        }
        const int k = k0 + bc;
        const bool bin = brow && k < Kd;
#pragma unroll
        for (int q = 0; q < NB; q++)
            cp16(&raw[stage][q][br * BK + bc], B[q] + (size_t)(bin ? nrow : 0) * Kd + (bin ? k : 0), bin);
        cp_commit();
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][2][2];
#pragma unroll
    for (int q = 0; q < NB; q++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[q][i][j], 0.f);

    const int nk = (Kd + BK - 1) / BK;
    load(0, 0);
    for (int kt = 0; kt < nk; kt++) {
        const int cur = kt & 1;
        if (kt + 1 < nk) {
            load(cur ^ 1, (kt + 1) * BK);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        // This thread's chunk of each B tile: codes x scale -> bf16.
        const int k = kt * BK + bc;
#pragma unroll
        for (int q = 0; q < NB; q++) {
            float f[16];
            e4m3x16(*(const uint4 *)&raw[cur][q][br * BK + bc], f);
            const float sc = !brow ? 0.f : w.block ? __ldg(S[q] + (size_t)(nrow >> 7) * scols + (k >> 7)) : __ldg(S[q] + nrow);
            __align__(16) bf16 o[16];
#pragma unroll
            for (int i = 0; i < 16; i++) o[i] = __float2bfloat16(f[i] * sc);
            *(uint4 *)&sB[q][br * LDS + bc] = *(const uint4 *)&o[0];
            *(uint4 *)&sB[q][br * LDS + bc + 8] = *(const uint4 *)&o[8];
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sA[cur][(wm + 16 * i) * LDS + kk], LDS);
#pragma unroll
            for (int q = 0; q < NB; q++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
                    wmma::load_matrix_sync(fb, &sB[q][(wn + 16 * j) * LDS + kk], LDS);
#pragma unroll
                    for (int i = 0; i < 2; i++) wmma::mma_sync(acc[q][i][j], fa[i], fb, acc[q][i][j]);
                }
        }
        __syncthreads();
    }

    // Epilogue as k_moe_gemm's: stage the fragments in shared memory (sA, free now), SiLU-and-mul
    // for gate/up, one rounding to bf16, 8 columns per lane.
    const int lane = tid & 31;
    float *stage = (float *)&sA[0][0] + warp * (NB * 256);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
#pragma unroll
            for (int q = 0; q < NB; q++) wmma::store_matrix_sync(stage + q * 256, acc[q][i][j], 16, wmma::mem_row_major);
            __syncwarp();
            const int rr = lane >> 1, cc = (lane & 1) * 8;
            const int s = s_begin + wm + 16 * i + rr, col = n0 + wn + 16 * j + cc;
            if (s < s_end && col < N) {
                __align__(16) bf16 o[8];
#pragma unroll
                for (int c = 0; c < 8; c++) {
                    const float g = bfr(stage[rr * 16 + cc + c]);
                    if (GU) {
                        const float u = bfr(stage[256 + rr * 16 + cc + c]);
                        o[c] = __float2bfloat16(bfr(g / (1.f + expf(-g))) * u);
                    } else {
                        o[c] = __float2bfloat16(g);
                    }
                }
                *(uint4 *)(C + (size_t)s * N + col) = *(const uint4 *)o;
            }
            __syncwarp();
        }
}

int kc_moe8_gemm(kc_backend *b, const bf16 *x, int dim, int F, const MoeW8 &w, int max_tiles, const MoeBufs &m) {
    k_moe8_gemm<true><<<dim3((F + BN - 1) / BN, max_tiles), 128, 0, b->stream>>>(x, dim, F, w, m.tiles, m.n_tiles,
                                                                                  m.off, m.slot_tok, m.H);
    k_moe8_gemm<false><<<dim3((dim + BN - 1) / BN, max_tiles), 128, 0, b->stream>>>(m.H, F, dim, w, m.tiles, m.n_tiles,
                                                                                   m.off, m.slot_tok, m.Y);
    return kc_launched(b, "moe fp8 experts");
}
