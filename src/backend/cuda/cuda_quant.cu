// GGUF quantized weights kept quantized on the GPU (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS). The formats' device layouts, loads, unpacking and dot products
// are in cuda_quant_formats.cuh; this file has the kernels that run them and the host side.
//
// Small batches (n <= 64, in passes of at most 8 rows) run llama.cpp-style integer GEMVs: the
// activation rows are quantized to 8-bit blocks of 32 exactly as the CPU backend does
// (d = max|x| / 127, q = round-half-even(x / d), s = d * sum(q); cpu_scalar.c), then each weight
// block's integer dot product with __dp4a is scaled by the weight and activation scales with
// the CPU's formulas. One warp computes R output rows; its lanes stride over the row's units,
// loading each with 16-byte streaming loads, and a shuffle reduction ends the row. Every kernel
// here follows the backend's programmatic-dependent-launch rule (kc_launch, cuda_internal.h):
// the GEMV's blocks request their first weights while the quantization kernel before it is
// still running, and wait before they read its output.
// Larger batches dequantize the weight into a bf16 scratch (in row chunks of at most 128 MB)
// and use cuBLASLt. The embedding of a quantized table dequantizes the gathered rows.
// KAON_CUDA_QUANT=0 keeps the old behaviour (weights expanded to bf16 at upload).
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_quant_formats.cuh"

#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "util/log.h"
}

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

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

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

// GGUF block g to main + g * QB and aux + g * AB (qrepack_block).
template <class F>
__global__ void k_qrepack(const uint8_t *__restrict__ src, size_t n_blocks, uint8_t *__restrict__ mainp,
                          uint8_t *__restrict__ auxp) {
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_blocks;
         g += (size_t)gridDim.x * blockDim.x)
        qrepack_block<F>(src + g * F::GB, mainp + g * F::QB, auxp + g * F::AB);
}

// Q6_K: super-block g into its row's unit-major planes.
__global__ void k_qrepack_q6k(const uint8_t *__restrict__ src, size_t n_blocks, int nsb, uint8_t *__restrict__ mainp,
                              uint8_t *__restrict__ auxp) {
    for (size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x; g < n_blocks;
         g += (size_t)gridDim.x * blockDim.x)
        qrepack_q6k_block(src + g * FQ6_K::GB, g, nsb, mainp, auxp);
}

// ---- activation quantization ------------------------------------------------------------------

// Values part * 8 .. part * 8 + 7 of 32-block b of activation row r (four consecutive lanes
// hold a block's four parts; every lane of the warp calls it) into the unit-major layout for
// units of bpu blocks (XRow), with the CPU's numbers: d = amax / 127 (IEEE division), id = 1 / d
// (0 when d = 0), q = clamp(round-half-even(x * id), -127, 127), s = d * sum(q). ok: whether
// this lane's part exists (lanes past the data pass zeros and store nothing).
static __device__ __forceinline__ void qact_store(const float *v, bool ok, int r, int b, int part, int nb32,
                                                  int bpu, int8_t *__restrict__ xq, float2 *__restrict__ xds,
                                                  int *__restrict__ xsum) {
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
        float q = rintf(__fmul_rn(v[e], id));
        q = fminf(fmaxf(q, -127.f), 127.f);
        const int qi = (int)q;
        ps += qi;
        const unsigned byte = (unsigned)(qi & 0xFF) << (8 * (e & 3));
        if (e < 4) w0 |= byte;
        else w1 |= byte;
    }
    const int s01 = ps + __shfl_xor_sync(0xffffffffu, ps, 1);  // lanes 0-1: values 0..15; 2-3: 16..31
    const int tot = s01 + __shfl_xor_sync(0xffffffffu, s01, 2);
    if (!ok) return;
    // Block b of row r: unit u = b / bpu, k = b % bpu; values 16h .. 16h+15 are chunk 2k + h.
    int8_t *xr = xq + (size_t)r * nb32 * 32;
    *(uint2 *)(xr + xq_off(b, nb32, bpu, part >> 1) + 8 * (part & 1)) = make_uint2(w0, w1);
    if (part == 0) {
        const size_t m = (size_t)r * nb32 + (size_t)xds_idx(b, nb32, bpu);
        xds[m] = make_float2(d, __fmul_rn(d, (float)tot));
        xsum[m] = (int)(((unsigned)s01 & 0xFFFFu) | ((unsigned)(tot - s01) << 16));
    }
}

// x [n, K] bf16 -> 8-bit blocks of 32 (total = n * K / 32 blocks, flat; qact_store). Four lanes
// per block, 8 values each.
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
    qact_store(v, ok, g / nb32, g % nb32, part, nb32, bpu, xq, xds, xsum);
}

// RMSNorm, then the quantization above, in one launch: one block per row of x [n, dim], thread j
// of the row's dim / 8 groups of 8 values (dim a multiple of 32: four threads per block of 32).
// The norm's numbers are k_rmsnorm<true, false>'s (the same per-thread sums in the same order, the
// same block sum): out = bf16(w * bf16(x / rms(x))), which is then quantized as k_qact would. With
// one group a thread (dim <= 8 x threads: the host's launches up to 8,192; w 16-byte aligned), the group's x stays in
// registers between the two passes and its 8 norm weights (the model's, not the kernel before's)
// are read before the wait: no global read after the block sum.
__global__ void k_qact_norm(const bf16 *__restrict__ x, const float *__restrict__ w, float eps, int dim, int bpu,
                            int8_t *__restrict__ xq, float2 *__restrict__ xds, int *__restrict__ xsum) {
    __shared__ float red[33];
    kc_pdl_trigger();
    const int row = blockIdx.x, groups = dim / 8, nb32 = dim / 32;
    const bool one = groups <= (int)blockDim.x && ((uintptr_t)w & 15) == 0;
    float wk[8];  // one: this thread's norm weights
    if (one && (int)threadIdx.x < groups) {
        // Weight loads (ld_stream), the only loads allowed before the wait (tests/gpu/pdl_check.py).
        const uint4 *w4 = (const uint4 *)(w + 8 * threadIdx.x);
        const uint4 a = ld_stream(w4), b = ld_stream(w4 + 1);
        const unsigned u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; e++) wk[e] = __uint_as_float(u[e]);
    }
    kc_pdl_wait();
    const uint4 *xr = (const uint4 *)(x + (size_t)row * dim);
    float ss = 0.f;
    uint4 xk = make_uint4(0u, 0u, 0u, 0u);  // one: this thread's group of x
    for (int j = threadIdx.x; j < groups; j += blockDim.x) {
        const uint4 xv = xr[j];
        if (one) xk = xv;
        const bf16 *xe = (const bf16 *)&xv;
#pragma unroll
        for (int e = 0; e < 8; e++) ss += __bfloat162float(xe[e]) * __bfloat162float(xe[e]);
    }
    const float r = rsqrtf(kc_block_sum(ss, red) / (float)dim + eps);
    for (int j0 = 0; j0 < groups; j0 += blockDim.x) {  // every lane takes part (qact_store shuffles)
        const int j = j0 + (int)threadIdx.x;
        const bool ok = j < groups;
        float v[8];
        if (ok) {
            const uint4 xv = one ? xk : xr[j];
            const bf16 *xe = (const bf16 *)&xv;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float nx = __bfloat162float(__float2bfloat16(__bfloat162float(xe[e]) * r));
                v[e] = __bfloat162float(__float2bfloat16((one ? wk[e] : w[8 * j + e]) * nx));
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = 0.f;
        }
        qact_store(v, ok, row, j >> 2, j & 3, nb32, bpu, xq, xds, xsum);
    }
}

// ---- GEMV ---------------------------------------------------------------------------------------

struct QArgs {
    const uint8_t *q[4], *a[4];  // main and aux of each weight
    const float *bias[4];
    void *y[4];                  // [nvalid, rows] bf16, or f32 when f32out
    int rows[4], begin[4];       // rows of each weight; its first block
    int count, K, nvalid, f32out;
    int residual;                // y[0] is the residual stream (bf16): y += the product
    const int8_t *xq;            // this pass's activation rows
    const float2 *xds;
    const int *xsum;
};

// RoPE and the KV write in the epilogue of the batch-1 q / k / v GEMV (k_qgemv's ROPE form):
// weights 0, 1, 2 are q, k, v; q's rows are rotated in place, k's rotated into their cache row,
// v's copied to theirs. A rotary pair is the rows of warps 2i and 2i + 1 of a block: adjacent rows
// (interleaved pairs), or rows j and j + hd / 2 of a head (NeoX: the block's rows are remapped).
struct QRope {
    QkvRope r;  // kcache, vcache [slots, nkv, hd]; pos, slot; n_slots; inv_freq [hd / 2]
    int hd, interleaved;
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

// The ROPE form's end: v (the row's product, rounded to bf16 as the GEMV's output) of row `row` of
// weight seg, in lane 0 of every warp: q and k rows meet their pair's in shared memory and are
// rotated with rope_kv_write's arithmetic (rope_pair); every warp of the block must call it.
static __device__ __forceinline__ void qrope_epilogue(const QRope &rp, int seg, int row, int warp, int lane,
                                                      float pos, int64_t slot, float v, bf16 *q) {
    __shared__ float vals[QW_WARPS];
    const bool cached = slot >= 0 && slot < rp.r.n_slots;
    const size_t crow = (size_t)slot * rp.r.nkv * rp.hd;
    if (seg == 2) {
        if (lane == 0 && cached) rp.r.vcache[crow + row] = __float2bfloat16(v);
        return;  // (a block holds one weight's rows: no barrier below for v blocks)
    }
    if (lane == 0) vals[warp] = v;
    __syncthreads();
    if (lane != 0 || (warp & 1)) return;
    const int half = rp.hd / 2, in_head = row % rp.hd;
    const int j = rp.interleaved ? in_head / 2 : in_head;              // the pair
    const int r1 = rp.interleaved ? row + 1 : row + half;              // its second row
    const float lo = vals[warp], hi = vals[warp + 1];
    float sn, cs;
    sincosf(pos * rp.r.inv_freq[j], &sn, &cs);
    const bf16 rlo = __float2bfloat16(lo * cs - hi * sn), rhi = __float2bfloat16(lo * sn + hi * cs);
    if (seg == 0) {
        q[row] = rlo;
        q[r1] = rhi;
    } else if (cached) {
        rp.r.kcache[crow + row] = rlo;
        rp.r.kcache[crow + r1] = rhi;
    }
}

// y[b, row] = x[b] . w[row] (+ bias) for the rows of up to 4 weights of one format (count > 1:
// linear_multi), or with SILU: out[b, row] = bf16(bf16(silu(bf16 g)) * bf16 u), g from weight 0
// (gate) and u from weight 1 (up). Block b of the grid: weight seg with begin[seg] <= b.
// ROPE (NB 1, one row a warp, every weight's rows a multiple of the block's): see QRope.
template <class F, int NB, bool SILU, bool ROPE = false>
__global__ void __launch_bounds__(QW_WARPS * 32) k_qgemv(const QArgs a, const QRope rp) {
    typedef QCfg<F, NB, SILU> C;
    constexpr int R = C::R, NR = C::NR, U = C::U;
    static_assert(!ROPE || (NB == 1 && !SILU && R == 1 && QW_WARPS % 2 == 0), "k_qgemv: the ROPE form");
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int seg = 0;
    if (!SILU) {
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (i < a.count && (int)blockIdx.x >= a.begin[i]) seg = i;
    }
    const int rows = a.rows[seg];
    int row0 = (((int)blockIdx.x - a.begin[seg]) * QW_WARPS + warp) * R;
    float pos = 0.f;
    int64_t slot = -1;
    if (ROPE) {
        if (seg < 2 && !rp.interleaved) {  // pair P of the weight: rows j and j + hd / 2 of its head
            const int half = rp.hd / 2, P = row0 / 2;
            row0 = P / half * rp.hd + P % half + (warp & 1) * half;
        }
        pos = (float)ld_meta(rp.r.pos);  // the step's metadata: readable before the wait
        slot = ld_meta(rp.r.slot);
    }
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
    if (ROPE) {
        qrope_epilogue(rp, seg, row0, warp, lane, pos, slot,
                       __bfloat162float(__float2bfloat16(acc[0][0] + (a.bias[seg] ? a.bias[seg][row0] : 0.f))),
                       (bf16 *)a.y[0]);
        return;
    }
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
                if (a.f32out) {
                    ((float *)a.y[seg])[(size_t)b * rows + row] = acc[r][b] + bb;
                } else if (a.residual) {  // as the next RMSNorm would add the product: bf16 + bf16
                    bf16 *res = (bf16 *)a.y[seg] + (size_t)b * rows + row;
                    const float p = __bfloat162float(__float2bfloat16(acc[r][b] + bb));
                    *res = __float2bfloat16(__bfloat162float(*res) + p);
                } else {
                    ((bf16 *)a.y[seg])[(size_t)b * rows + row] = __float2bfloat16(acc[r][b] + bb);
                }
            }
        }
    }
}

// ---- host side ----------------------------------------------------------------------------------

static bool is_q(kaon_dtype t) { return q_visit(t, [](auto) {}) == 0; }

static bool is_qt(const kaon_tensor *w) { return w && is_q(w->dtype); }

// Where a quantized matrix's regions lie in its device buffer.
typedef struct QLayout {
    int blk, qb, ab;        // elements per block; main and aux bytes per block
    size_t main_bytes, aux_off, total;
} QLayout;

static int q_layout(kaon_dtype t, int64_t rows, int64_t cols, QLayout *L) {
    memset(L, 0, sizeof *L);
    if (q_visit(t, [&](auto f) {
            typedef decltype(f) F;
            L->blk = F::BLK;
            L->qb = F::QB;
            L->ab = F::AB;
        }))
        return -1;
    if (rows <= 0 || cols <= 0 || cols % L->blk) return -1;
    const size_t nblocks = (size_t)rows * (size_t)(cols / L->blk);
    L->main_bytes = nblocks * (size_t)L->qb;
    L->aux_off = (L->main_bytes + 255) & ~(size_t)255;
    L->total = L->aux_off + nblocks * (size_t)L->ab;
    if (L->total == L->aux_off) L->total += 256;  // (no aux: keep the pointer inside)
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
    const size_t nblk = src_bytes / (size_t)kaon_dtype_block_bytes(t);
    int rc = kc_check(b, cudaMalloc(&tmp, src_bytes), "upload staging");
    if (!rc) rc = kc_check(b, cudaMemcpyAsync(tmp, host->data, src_bytes, cudaMemcpyHostToDevice, b->stream), "upload");
    if (!rc) {
        size_t blocks = (nblk + 255) / 256;
        if (blocks > 65535 * 8) blocks = 65535 * 8;
        const uint8_t *src = (const uint8_t *)tmp;
        uint8_t *mainp = (uint8_t *)dst, *auxp = (uint8_t *)dst + L.aux_off;
        q_visit(t, [&](auto f) {
            typedef decltype(f) F;
            if constexpr (F::T == KAON_Q6_K)  // its unit-major planes
                k_qrepack_q6k<<<(unsigned)blocks, 256, 0, b->stream>>>(src, nblk, (int)(cols / F::BLK), mainp, auxp);
            else
                k_qrepack<F><<<(unsigned)blocks, 256, 0, b->stream>>>(src, nblk, mainp, auxp);
        });
        rc = kc_launched(b, "repack");
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
    cudaError_t e = cudaSuccess;
    q_visit(w->dtype, [&](auto f) {
        e = kc_launch(b, k_qdequant<decltype(f)>, g, t, 0, qp, ap, rows, K, d_ids, row0, n_out, out);
    });
    return kc_check(b, e, "dequantize");
}

int kc_quant_dequant(kc_backend *b, const kaon_tensor *w, bf16 *out) {
    if (!is_qt(w)) return 1;
    return q_dequant(b, w, NULL, 0, w->shape[0], out) ? -1 : 0;
}

int kc_quant_embed(kc_backend *b, const kaon_tensor *table, const int32_t *ids, int n, void *out) {
    if (!is_qt(table)) return 1;
    if (n <= 0) return 0;
    const int32_t *d = kc_dev_i32(b, ids, (size_t)n);
    if (!d) return -1;
    return q_dequant(b, table, d, 0, n, (bf16 *)out);
}

// The activation rows x [n, K] quantized into the scratch; pointers to its three parts.
static int q_bpu(kaon_dtype t) {
    int bpu = 1;
    q_visit(t, [&](auto f) { bpu = decltype(f)::UE / 32; });
    return bpu;
}

// An RMSNorm the activation quantization applies first (k_qact_norm): weight and eps.
typedef struct QNorm {
    const float *w;
    float eps;
} QNorm;

// (bpu: activation blocks per unit of the weight format, q_bpu; nrm: x is normed first, or NULL.)
static int q_act(kc_backend *b, const void *x, int n, int K, int bpu, const int8_t **xq, const float2 **xds,
                 const int **xsum, const QNorm *nrm = NULL) {
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
    if (nrm) {  // k_rmsnorm's block size (kc_rmsnorm), so that the block sum is the same
        int threads = ((K / 8 + 31) / 32) * 32;
        if (threads > 1024) threads = 1024;
        return kc_check(b,
                        kc_launch(b, k_qact_norm, dim3((unsigned)n), dim3((unsigned)threads), 0, (const bf16 *)x,
                                  nrm->w, nrm->eps, K, bpu, (int8_t *)base, (float2 *)(base + o_ds),
                                  (int *)(base + o_sum)),
                        "norm and quantize activations");
    }
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
    const QRope none = {};
    return kc_launch(b, k_qgemv<F, NB, SILU>, dim3(blocks), dim3(QW_WARPS * 32), 0, a, none);
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
    int r = 1;
    q_visit(t, [&](auto f) { r = rows_per_warp<decltype(f)>(nb, silu); });
    return r;
}

// (rope: k_qgemv's ROPE form, one token.)
static cudaError_t q_launch(kc_backend *b, kaon_dtype t, int nb, bool silu, unsigned blocks,
                            const QArgs &a, const QRope *rope) {
    cudaError_t e = cudaErrorInvalidValue;
    q_visit(t, [&](auto f) {
        typedef decltype(f) F;
        if (rope) e = kc_launch(b, k_qgemv<F, 1, false, true>, dim3(blocks), dim3(QW_WARPS * 32), 0, a, *rope);
        else e = silu ? launch_f<F, true>(b, nb, blocks, a) : launch_f<F, false>(b, nb, blocks, a);
    });
    return e;
}

// The GEMV passes over quantized activations (quantized already): count weights of format t
// (silu: count = 2, gate and up), activation rows [0, n) in passes of at most 8; residual: y[0]
// (one weight, bf16) is added to, not written; rope (n 1; q, k, v): RoPE and the KV write in the
// epilogue, y[0] being q (QRope).
static int q_gemv_passes(kc_backend *b, kaon_dtype t, int n, int K, int count,
                         const uint8_t *const *qp, const uint8_t *const *ap, const int *rows,
                         const float *const *bias, void *const *y, int f32out, bool silu,
                         const int8_t *xq, const float2 *xds, const int *xsum, int residual = 0,
                         const QRope *rope = NULL) {
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
        a.residual = residual;
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
        if (kc_check(b, q_launch(b, t, nb, silu, (unsigned)blocks, a, rope), "quantized gemv")) return -1;
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
                        const float *const *bias, void *const *y, int f32out, const QNorm *nrm = NULL) {
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
            if (q_act(b, x, n, K, bpu, &xq, &xds, &xsum, nrm)) return -1;
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

// out = silu(x @ wg^T) * (x @ wu^T) on the GEMV (wg, wu quantized, one format; n <= 64), x normed
// first where nrm is given.
static int q_silu_gemv(kc_backend *b, const void *x, int n, const kaon_tensor *wg, const kaon_tensor *wu, void *out,
                       const QNorm *nrm) {
    const uint8_t *qp[2], *ap[2];
    if (!qmat(b, wg, "gate", &qp[0], &ap[0]) || !qmat(b, wu, "up", &qp[1], &ap[1])) return -1;
    const int rows = (int)wg->shape[0], K = (int)wg->shape[1];
    const int8_t *xq;
    const float2 *xds;
    const int *xsum;
    if (q_act(b, x, n, K, q_bpu(wg->dtype), &xq, &xds, &xsum, nrm)) return -1;
    const int rr[2] = {rows, rows};
    void *ys[2] = {out, NULL};
    return q_gemv_passes(b, wg->dtype, n, K, 2, qp, ap, rr, NULL, ys, 0, true, xq, xds, xsum) ? -1 : 0;
}

int kc_quant_linear_silu_mul(kc_backend *b, const void *x, int n, const kaon_tensor *wg, const kaon_tensor *wu,
                             void *out) {
    if (!is_qt(wg) && !is_qt(wu)) return 1;
    if (!wg || !wu || wg->ndim != 2 || wu->ndim != 2) return kc_fail(b, "cuda linear_silu_mul: missing weight");
    if (wg->shape[0] != wu->shape[0] || wg->shape[1] != wu->shape[1])
        return kc_fail(b, "cuda linear_silu_mul: gate and up shapes differ");
    if (n <= 0) return 0;
    const int rows = (int)wg->shape[0];
    if (n <= KC_QGEMV_MAX_N && wg->dtype == wu->dtype) return q_silu_gemv(b, x, n, wg, wu, out, NULL);
    // Formats differ (or a large batch): gate into out, up into scratch, then silu(out) * up.
    kc_quant *s = qstate(b);
    if (!s || kc_grow(b, &s->up, &s->up_cap, (size_t)n * rows * sizeof(bf16), 1, "quantized scratch")) return -1;
    if (any_linear(b, x, n, wg, NULL, out, 0) || any_linear(b, x, n, wu, NULL, s->up, 0)) return -1;
    kc_silu_mul(b, (const bf16 *)out, (const bf16 *)s->up, (size_t)n * rows, (bf16 *)out);
    return b->err ? -1 : 0;
}

// ---- the residual stream's ops, fused (small batches) ---------------------------------------------

static bool fuse_on(void) {
    static const bool on = !kc_env_off("KAON_QUANT_FUSE");  // 0: the separate ops (A/B, bit-equal)
    return on;
}

// Whether the fused forms take these: every weight a quantized matrix of width K, a GEMV batch,
// a row of x that the 16-byte loads of k_qact_norm may read.
static bool fusable(const void *x, int n, int count, const kaon_tensor *const *w) {
    if (!fuse_on() || n < 1 || n > KC_QGEMV_MAX_N || ((uintptr_t)x & 15)) return false;
    for (int i = 0; i < count; i++)
        if (!is_qt(w[i]) || w[i]->ndim != 2 || w[i]->shape[1] != w[0]->shape[1] || w[i]->shape[1] % 32) return false;
    static bool said;  // (tests/gpu/test_gpu.py looks for this line to know the fused forms ran)
    if (!said) KAON_DEBUG("cuda quant: residual add and RMSNorm fused into the quantized GEMVs");
    said = true;
    return true;
}

int kc_quant_linear_residual(kc_backend *b, const void *x, int n, const kaon_tensor *w, const kaon_tensor *bias,
                             void *res) {
    if (!fusable(x, n, 1, &w)) return 1;
    const uint8_t *qp, *ap;
    if (!qmat(b, w, "linear_residual", &qp, &ap) || !fvec(b, bias, w->shape[0], "linear bias")) return -1;
    const int K = (int)w->shape[1], rows = (int)w->shape[0];
    const int8_t *xq;
    const float2 *xds;
    const int *xsum;
    if (q_act(b, x, n, K, q_bpu(w->dtype), &xq, &xds, &xsum)) return -1;
    const float *bs = bias ? (const float *)bias->data : NULL;
    return q_gemv_passes(b, w->dtype, n, K, 1, &qp, &ap, &rows, &bs, &res, 0, false, xq, xds, xsum, 1) ? -1 : 0;
}

int kc_quant_norm_linear_multi(kc_backend *b, const void *x, const kaon_tensor *norm, float eps, int n, int count,
                               const kaon_tensor *const *w, const kaon_tensor *const *bias, void *const *y) {
    if (count < 1 || count > 4 || !fusable(x, n, count, w)) return 1;
    if (!fvec(b, norm, w[0]->shape[1], "rmsnorm")) return -1;
    const float *bs[4];
    for (int i = 0; i < count; i++) {
        if (!fvec(b, bias ? bias[i] : NULL, w[i]->shape[0], "linear bias")) return -1;
        bs[i] = bias && bias[i] ? (const float *)bias[i]->data : NULL;
    }
    const QNorm nrm = {(const float *)norm->data, eps};
    return q_linear_set(b, x, n, count, w, bs, y, 0, &nrm) ? -1 : 0;
}

int kc_quant_norm_linear_silu_mul(kc_backend *b, const void *x, const kaon_tensor *norm, float eps, int n,
                                  const kaon_tensor *wg, const kaon_tensor *wu, void *out) {
    const kaon_tensor *w[2] = {wg, wu};
    if (!fusable(x, n, 2, w) || wg->dtype != wu->dtype || wg->shape[0] != wu->shape[0]) return 1;
    if (!fvec(b, norm, wg->shape[1], "rmsnorm")) return -1;
    const QNorm nrm = {(const float *)norm->data, eps};
    return q_silu_gemv(b, x, n, wg, wu, out, &nrm);
}

int kc_quant_norm_qkv_rope(kc_backend *b, const void *x, const kaon_tensor *norm, float eps,
                           const kaon_tensor *const *w, const kaon_tensor *const *bias, bf16 *q, const QkvRope *r,
                           int hd, int interleaved) {
    const int64_t rows[3] = {(int64_t)r->nh * hd, (int64_t)r->nkv * hd, (int64_t)r->nkv * hd};
    if (!fusable(x, 1, 3, w) || hd <= 0 || hd % QW_WARPS || hd % 2) return 1;
    for (int i = 0; i < 3; i++)
        if (w[i]->dtype != w[0]->dtype || w[i]->shape[0] != rows[i]) return 1;
    if (!fvec(b, norm, w[0]->shape[1], "rmsnorm")) return -1;
    static bool said;  // (tests/gpu/test_gpu.py looks for this line)
    if (!said) KAON_DEBUG("cuda quant: RoPE and the KV write fused into the quantized q / k / v GEMV");
    said = true;
    const int K = (int)w[0]->shape[1];
    const QNorm nrm = {(const float *)norm->data, eps};
    const int8_t *xq;
    const float2 *xds;
    const int *xsum;
    if (q_act(b, x, 1, K, q_bpu(w[0]->dtype), &xq, &xds, &xsum, &nrm)) return -1;
    const uint8_t *qp[3], *ap[3];
    const float *bs[3];
    int rr[3];
    for (int i = 0; i < 3; i++) {
        if (!qmat(b, w[i], "linear", &qp[i], &ap[i]) || !fvec(b, bias ? bias[i] : NULL, rows[i], "linear bias"))
            return -1;
        bs[i] = bias && bias[i] ? (const float *)bias[i]->data : NULL;
        rr[i] = (int)rows[i];
    }
    void *ys[3] = {q, NULL, NULL};
    const QRope rp = {*r, hd, interleaved};
    return q_gemv_passes(b, w[0]->dtype, 1, K, 3, qp, ap, rr, bs, ys, 0, false, xq, xds, xsum, 0, &rp) ? -1 : 0;
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
