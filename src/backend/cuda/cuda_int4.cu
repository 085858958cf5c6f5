// INT4 weight-only layers (W4A16: AWQ, GPTQ, compressed-tensors pack-quantized) on the GPU.
//
// Default device copy of a layer ("tiled"): one allocation, regions 256-byte aligned:
//   w      u32 [Mt, Kc, 32 lanes, 4]  Mt = ceil(out / 16) tiles of 16 rows, Kc = ceil(in / 64)
//                           chunks of 64 columns; padding rows and columns hold nibble 0.
//                           Lane l = 4 gid + tid of a warp reading chunk c of tile t loads one
//                           16-byte vector, ((t Kc + c) 32 + l) 16 bytes in: 512 contiguous bytes
//                           per warp and chunk. Word j = 2h + t' of it is one mma.m16n8k16 A
//                           fragment of the lane (half h: columns 64c + 32h .. + 31; the lane's
//                           columns of it are 8 tid + 4 t' + 0..3, rows gid and gid + 8):
//                           nibble 0/4 = row gid, columns +0/+1; 1/5 = row gid + 8, +0/+1;
//                           2/6 = row gid, +2/+3; 3/7 = row gid + 8, +2/+3 (cuda_int4_layout.cuh).
//                           The lane's B fragment (x) for the same columns is then 8 contiguous
//                           bf16: one 16-byte shared-memory load per half.
//   sz     float2 [Mt, G, 16]  {scale, bf16x2 -(128 + z)} per row and group (z 8 when the
//                           format has none): a group's pairs of a tile are 128 contiguous bytes.
//                           KAON_T4_SZ16=1: u32 [Mt, G, 16] instead, f16 scale | bf16 -(128 + z)
//                           << 16 (t4_sz16; layers whose scales f16 holds exactly, else float2),
//                           half the bytes: 4 per group of 128 weights (64 bytes) instead of 8.
//   perm   i32 [in]         only for GPTQ act-order (x is gathered by it)
//
// Why the tiled GEMV (k_t4_gemv, n <= 32 in passes of up to 8 rows): decode reads each weight
// byte once, and at 4 bits a byte is 2 weights, so the old one-warp-per-R-rows kernel spent ~3
// instructions per weight (LOP3, FADD, FFMA) and issued its loads two at a time with no overlap:
// it was bound by instruction issue and latency at ~1.2-1.9 TB/s. The tensor cores take the
// multiply-adds: per 8 weights one LOP3 (the nibbles into bf16 128 + q), one HFMA2 subtracting
// 128 + z (exact: integers below 2^8), and a quarter of an mma; products (q - z) * x are exact in
// f32 as before, and each group's 32-column sum is multiplied by its f32 scale once (4 FFMA per
// lane and half). One block serves one 16-row tile; its 4 or 8 warps split K, each keeping 8
// 16-byte loads per lane in flight (a rotating register file: a register's next chunk is
// requested right after it is consumed, in place), the first 8 issued before kc_pdl_wait so they
// overlap the previous kernel; scales (and x, for one activation row) are staged in shared
// memory once per block (x rows padded by 64 bytes so the lanes' 16-byte loads are free of bank
// conflicts; with more rows x is read through L1: t4_x_direct), and the warps' partial
// sums meet in shared memory. 8-warp blocks while the grid fits one wave at 2 blocks per SM,
// else 4-warp blocks (4 per SM) for a shorter tail. Activation rows per pass: as many (<= 8) as
// fit T4_SMEM_MAX of shared memory; a layer where even one does not fit takes the GEMM path.
//
// Larger batches, and shapes the GEMV does not take (in or g not multiples of 32), dequantize
// row chunks to a bf16 scratch ((q - z)*s in f32, rounded once; k_t4_dequant) and call
// kc_gemm_bf16.
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_int4_layout.cuh"

#include <stdlib.h>
#include <string.h>

#define I4_GEMV_MAX_N 32           // above: dequantized weights through cuBLASLt
#define I4_DEQ_CAP ((int64_t)64 << 20)  // elements of the bf16 weight scratch (128 MB)

struct kc_int4 {
    void *xg;  // activations gathered by perm: bf16 [n, in]
    size_t xg_cap;
    void *deq;  // dequantized weight rows: bf16
    size_t deq_cap;
    void *tmp;  // chunk outputs of the GEMM path
    size_t tmp_cap;
};

static kc_int4 *istate(kc_backend *b) {
    if (b->int4) return b->int4;
    b->int4 = (kc_int4 *)calloc(1, sizeof(kc_int4));
    if (!b->int4) kc_fail(b, "cuda: out of host memory");
    return b->int4;
}

void kc_int4_destroy(kc_backend *b) {
    kc_int4 *s = b->int4;
    if (!s) return;
    if (s->xg) cudaFree(s->xg);
    if (s->deq) cudaFree(s->deq);
    if (s->tmp) cudaFree(s->tmp);
    free(s);
    b->int4 = NULL;
}

// ---- device code --------------------------------------------------------------------------------

// xg [n, K] bf16 = x[r, perm[k]] (perm NULL: a copy, for x not 16-byte aligned).
__global__ void k_i4_gather(const bf16 *__restrict__ x, const int32_t *__restrict__ perm, int n, int K,
                            bf16 *__restrict__ xg) {
    kc_pdl_trigger();
    kc_pdl_wait();  // x is the previous kernel's output; xg may still be read by an earlier GEMV
    const int64_t total = (int64_t)n * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int k = (int)(i % K);
        xg[i] = x[(i / K) * K + (perm ? perm[k] : k)];
    }
}

__global__ void k_i4_bias_f32(float *__restrict__ y, const float *__restrict__ bias, int64_t total, int M) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % M];
}

static __device__ __forceinline__ uint64_t i4_mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Dummy weights: random bytes (scales and zeros: k_t4_dummy_sz).
__global__ void k_i4_dummy(uint8_t *__restrict__ w, size_t wbytes, uint64_t seed) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < wbytes / 8; i += stride)
        ((uint64_t *)w)[i] = i4_mix(seed * 0x632BE59BD9B4E019ull + i);
    for (size_t i = wbytes / 8 * 8 + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < wbytes; i += stride)
        w[i] = (uint8_t)i4_mix(seed * 0x632BE59BD9B4E019ull + i);
}

// ---- the tiled layout and its tensor-core GEMV ---------------------------------------------------

#define T4_WARPS 8                 // warps of a block, splitting K between them (or 4: see t4_gemv)
#define T4_U 8                     // 16-byte weight vectors in flight per lane (gate + up: 4 each)
#define T4_SMEM_MAX (112 << 10)    // dynamic shared memory of one block (two always fit an SM)
#define T4_PASS 8                  // activation rows per pass: the mma's n

// D += A (16 x 16 bf16, row) * B (16 x 8 bf16, col), f32 accumulators.
static __device__ __forceinline__ void t4_mma(float (&d)[4], const uint32_t (&A)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(b0), "r"(b1));
}

// (w & 0x000F000F) | 0x43004300: two nibbles as bf16 128 + q, in one LOP3 (written as C, ptxas
// emitted an AND and an OR: one immediate per instruction).
static __device__ __forceinline__ uint32_t t4_nibbles(uint32_t w) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "n"(0x000F000F), "r"(0x43004300u));  // (a & b) | c
    return d;
}

// a * 1 + c on two bf16 (exact here: integers below 2^8).
static __device__ __forceinline__ uint32_t t4_add(uint32_t a, uint32_t c) {
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(c));
    return d;
}

// Up to 4 weights of one width sharing x (q, k, v), or SILU: gate (0) and up (1).
struct T4Args {
    const uint4 *w[4];        // tiled nibbles (see the top comment)
    const void *sz[4];        // [Mt][G][16] float2 {scale, bf16x2 -(128 + z)}, or u32 t4_sz16 (SZ16)
    const float *bias[4];     // [M] or NULL
    void *y[4];               // this pass's rows of y [nv, M], bf16 or f32
    int M[4], begin[4];       // rows of each weight; its first block (one block per 16-row tile)
    int count;
    const bf16 *x;            // this pass's activation rows [nv, K] (gathered by perm), 16-byte aligned
    int K, Kc, G, g, nv, f32out, xstride;  // Kc: 64-column chunks; xstride: bf16 per row in shared memory
    kc_gemv_fuse fuse;  // MODE T4_RESIDUAL / T4_NORMED: the batch-1 split norm (kc_gemv_fuse)
};

// What k_t4_gemv does around its products at batch 1 (kc_gemv_fuse): nothing; y += product (the
// residual stream, one weight), then xg = bf16(y * norm) and the tile's sum of y^2 into parts; or x
// is such an xg and the products are scaled by 1 / rms summed from parts.
enum { T4_PLAIN, T4_RESIDUAL, T4_NORMED };

// One block: one 16-row tile of one weight (both weights for SILU), its NW warps splitting the
// chunks of K; warp results meet in shared memory. y [nv, M] bf16 or f32 (+ bias); SILU: y[0] = bf16(silu(bf16 g))
// * bf16 u, rounded as silu_and_mul after two linears. 128 registers at most: 2
// blocks of 8 warps or 4 of 4 per SM. MODE: see T4_PLAIN (not T4_RESIDUAL with SILU). SZ16: the
// compact scale + zero words (4 bytes a row-group; an f16 -> f32 conversion and a PRMT each).
template <int NW, bool SILU, int MODE = T4_PLAIN, bool XG = false, bool SZ16 = false>
__global__ void __launch_bounds__(NW * 32, 8 / NW * 2) k_t4_gemv(const T4Args a) {
    constexpr int NM = SILU ? 2 : 1, U = T4_U / NM, SZB = SZ16 ? 4 : 8;  // SZB: bytes of a row-group
    extern __shared__ __align__(16) uint8_t t4_smem[];
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
    int seg = 0;
    if (!SILU) {
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (i < a.count && (int)blockIdx.x >= a.begin[i]) seg = i;
    }
    const int rt = (int)blockIdx.x - a.begin[seg], M = a.M[seg], G = a.G;
    const int per = (a.Kc + NW - 1) / NW;
    const int c_lo = min(warp * per, a.Kc), c_hi = min(c_lo + per, a.Kc);
    const uint4 *wp[NM];
#pragma unroll
    for (int m = 0; m < NM; m++) wp[m] = a.w[SILU ? m : seg] + ((size_t)rt * a.Kc + c_lo) * 32 + lane;  // chunk cb
    // The weights are constant: the first U chunks are requested before waiting for x.
    uint4 q[U][NM];
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int m = 0; m < NM; m++)
            q[u][m] = c_lo + u < c_hi ? ld_stream(wp[m] + u * 32) : make_uint4(0, 0, 0, 0);
    uint8_t *szs = t4_smem;  // [NM][G][16] row-groups of SZB bytes
    // Staging loops issue 4 loads per thread before storing any (one latency per 4, not per 1).
#pragma unroll
    for (int m = 0; m < NM; m++) {
        // Scales are weights: loaded before the wait, as ld_stream (the loads pdl_check allows there).
        const uint4 *src = (const uint4 *)((const uint8_t *)a.sz[SILU ? m : seg] + (size_t)rt * G * 16 * SZB);
        uint4 *dst = (uint4 *)(szs + (size_t)m * G * 16 * SZB);
        const int nvec = G * SZB;  // 16-byte vectors of the tile's row-groups
        for (int i0 = threadIdx.x; i0 < nvec; i0 += 4 * NW * 32) {
            uint4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[j] = i0 + j * NW * 32 < nvec ? ld_stream(src + i0 + j * NW * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (i0 + j * NW * 32 < nvec) dst[i0 + j * NW * 32] = v[j];
        }
    }
    if (XG) __syncthreads();  // the scales; x needs no staging (read below through L1)
    kc_pdl_wait();  // x is the previous kernel's output; y may still be read by an earlier kernel
    float ss = 0.f;  // T4_NORMED: warp 0's share of the sum of squares, requested beside x
    if (MODE == T4_NORMED && warp == 0)
        for (int i = lane; i < a.fuse.n_parts; i += 32) ss += __ldcg(a.fuse.parts + i);
    bf16 *xs = (bf16 *)(t4_smem + (size_t)NM * G * 16 * SZB);  // [nv][xstride], zeros past K
    const int v8 = a.Kc * 8, nx = XG ? 0 : a.nv * v8;  // 8-column vectors per row, in all
    for (int i0 = threadIdx.x; i0 < nx; i0 += 4 * NW * 32) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = i0 + j * NW * 32, r = i / v8, c8 = (i - r * v8) * 8;
            v[j] = i < nx && c8 < a.K ? *(const uint4 *)(a.x + (size_t)r * a.K + c8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = i0 + j * NW * 32, r = i / v8, c8 = (i - r * v8) * 8;
            if (i < nx) *(uint4 *)(xs + r * a.xstride + c8) = v[j];
        }
    }
    if (!XG) __syncthreads();
    const bool xon = gid < a.nv;  // lane's column of B: activation row gid
    const uint4 *xrow = XG ? (const uint4 *)(a.x + (size_t)(xon ? gid : 0) * a.K + 8 * tid)
                           : (const uint4 *)(xs + (xon ? gid : 0) * a.xstride + 8 * tid);
    float acc[NM][4];
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[m][i] = 0.f;
    // Group of the current half (32 columns) and halves left in it: no division in the loop.
    const int g32 = a.g >> 5;
    int gi = 2 * c_lo / g32, left = g32 - 2 * c_lo % g32;
    for (int cb = c_lo; cb < c_hi; cb += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = cb + u;
            if (c >= c_hi) break;
            // q[u] is consumed in place and then refilled (below), not copied out first: with a
            // copy ptxas moved the refill's registers back into q[u] within the same step, which
            // waited for the load just issued, leaving one load in flight per warp (SASS, sm_90a).
            uint4 xh[2];  // columns 64c + 32h + 8tid .. of both halves, requested together
#pragma unroll
            for (int h = 0; h < 2; h++)  // (from global memory (XG): 0 past K, as in shared memory)
                xh[h] = !xon ? make_uint4(0, 0, 0, 0)
                        : !XG ? xrow[8 * c + 4 * h]
                        : 64 * c + 32 * h < a.K ? __ldg(xrow + 8 * c + 4 * h) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int h = 0; h < 2; h++) {  // 32 columns: one group
                const uint4 xv = xh[h];
                // row-group gid of this group (padding columns past K: x is 0)
                const uint8_t *sgb = szs + (size_t)(min(gi, G - 1) * 16 + gid) * SZB;
                if (--left == 0) gi++, left = g32;
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    float s0, s1;  // rows gid and gid + 8: scale, and bf16x2 -(128 + z)
                    uint32_t z0, z1;
                    if constexpr (SZ16) {
                        const uint32_t *sg = (const uint32_t *)sgb + m * G * 16;
                        const uint32_t w0 = sg[0], w1 = sg[8];
                        s0 = t4_sz16_scale(w0), s1 = t4_sz16_scale(w1);
                        z0 = t4_sz16_nz(w0), z1 = t4_sz16_nz(w1);
                    } else {
                        const float2 *sg = (const float2 *)sgb + m * G * 16;
                        const float2 p0 = sg[0], p1 = sg[8];
                        s0 = p0.x, s1 = p1.x;
                        z0 = __float_as_uint(p0.y), z1 = __float_as_uint(p1.y);
                    }
                    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int t = 0; t < 2; t++) {
                        const uint32_t w = (&q[u][m].x)[2 * h + t];
                        uint32_t A[4];
#pragma unroll
                        for (int r = 0; r < 4; r++)  // bf16 128 + q (two nibbles), minus 128 + z: q - z exactly
                            A[r] = t4_add(t4_nibbles(w >> (4 * r)), r & 1 ? z1 : z0);
                        t4_mma(d, A, (&xv.x)[2 * t], (&xv.x)[2 * t + 1]);
                    }
                    acc[m][0] = fmaf(s0, d[0], acc[m][0]);
                    acc[m][1] = fmaf(s0, d[1], acc[m][1]);
                    acc[m][2] = fmaf(s1, d[2], acc[m][2]);
                    acc[m][3] = fmaf(s1, d[3], acc[m][3]);
                }
            }
            if (c + U < c_hi)  // this register's next chunk, in flight while the others are consumed
#pragma unroll
                for (int m = 0; m < NM; m++) q[u][m] = ld_stream(wp[m] + (u + U) * 32);
        }
#pragma unroll
        for (int m = 0; m < NM; m++) wp[m] += U * 32;
    }
    float *red = (float *)(t4_smem + (size_t)NM * G * 16 * SZB + (XG ? 0 : ((size_t)a.nv * a.xstride * 2 + 15) & ~(size_t)15));
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[((warp * NM + m) * 4 + i) * 32 + lane] = acc[m][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int m = 0; m < NM; m++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < NW; w++) v += red[((w * NM + m) * 4 + i) * 32 + lane];
            acc[m][i] = v;
        }
    float scale = 1.f;
    if (MODE == T4_NORMED) {
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        scale = rsqrtf(ss / (float)a.K + a.fuse.eps);
    }
    float sq = 0.f;  // T4_RESIDUAL: the lane's y^2
    // C fragment: element i of the lane is row gid (+ 8 for i >= 2), activation row 2 tid + (i & 1).
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = rt * 16 + gid + (i >> 1) * 8, b = 2 * tid + (i & 1);
        if (row >= M || b >= a.nv) continue;
        if (SILU) {
            const float g = __bfloat162float(__float2bfloat16(acc[0][i] * scale));
            const float u = __bfloat162float(__float2bfloat16(acc[NM - 1][i] * scale));
            const float sl = __bfloat162float(__float2bfloat16(g / (1.f + expf(-g))));
            ((bf16 *)a.y[0])[(size_t)b * M + row] = __float2bfloat16(sl * u);
        } else {
            const float v = acc[0][i] * scale + (a.bias[seg] ? a.bias[seg][row] : 0.f);
            if (MODE == T4_RESIDUAL) {  // linear, then rmsnorm's add: each rounded to bf16
                bf16 *yr = (bf16 *)a.y[0] + row;
                const float y =
                    __bfloat162float(__float2bfloat16(__bfloat162float(*yr) + __bfloat162float(__float2bfloat16(v))));
                *yr = __float2bfloat16(y);
                a.fuse.xg[row] = __float2bfloat16(y * a.fuse.norm[row]);
                sq += y * y;
            } else if (a.f32out) ((float *)a.y[seg])[(size_t)b * M + row] = v;
            else ((bf16 *)a.y[seg])[(size_t)b * M + row] = __float2bfloat16(v);
        }
    }
    if (MODE == T4_RESIDUAL) {  // the tile's sum of squares (warp 0 holds the tile), a fixed order
#pragma unroll
        for (int o = 16; o; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (lane == 0) a.fuse.parts[blockIdx.x] = sq;
    }
}

// dst [Mt * Kc * 128] u32 from kaon's layout src [M, K/2] (rows and columns past the ends: 0).
__global__ void k_t4_repack(const uint8_t *__restrict__ src, int64_t M, int K, int Kc, uint32_t *__restrict__ dst,
                            int64_t nwords) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nwords; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = t4_repack_word(src, M, K, Kc, i);
}

// out [cnt, K] bf16 = (q - z) * s of rows row0 .. row0 + cnt - 1 of the tiled layout (sz16: the
// compact row-groups).
__global__ void k_t4_dequant(const uint32_t *__restrict__ w, const void *__restrict__ szv, bool sz16, int K, int Kc,
                             int G, int g, int64_t row0, int64_t cnt, bf16 *__restrict__ out) {
    kc_pdl_trigger();
    kc_pdl_wait();  // out may still be read by the GEMM before
    const int64_t total = cnt * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = row0 + i / K;
        const int k = (int)(i % K);
        int slot;
        const uint32_t q = (w[t4_word(m, k, Kc, &slot)] >> (4 * slot)) & 15u;
        const size_t at = ((m >> 4) * G + k / g) * 16 + (m & 15);
        float sc, nzf;  // the scale, and -(128 + z) as the float2 form's bits
        if (sz16) {
            const uint32_t e = ((const uint32_t *)szv)[at];
            sc = t4_sz16_scale(e), nzf = __uint_as_float(t4_sz16_nz(e));
        } else {
            const float2 e = ((const float2 *)szv)[at];
            sc = e.x, nzf = e.y;
        }
        const float z = -__uint_as_float(__float_as_uint(nzf) << 16) - 128.f;
        out[i] = __float2bfloat16(((float)q - z) * sc);
    }
}

// Dummy scales and zeros of the tiled layout: scales base * (0.5 + u), zeros random 0..15 (8 when
// the format has none).
__global__ void k_t4_dummy_sz(float2 *__restrict__ sz, size_t n, uint64_t seed, float base, int zero) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t r = i4_mix((seed ^ 0x5CA1Eull) * 0x632BE59BD9B4E019ull + i);
        const float s = base * (0.5f + (float)(r >> 40) * (1.0f / 16777216.0f));
        sz[i] = make_float2(s, t4_nz(zero ? (float)(r & 15u) : 8.f));
    }
}

// The same dummy values in the compact form: each scale rounded to f16 first (so f16 holds it).
__global__ void k_t4_dummy_sz16(uint32_t *__restrict__ sz, size_t n, uint64_t seed, float base, int zero) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t r = i4_mix((seed ^ 0x5CA1Eull) * 0x632BE59BD9B4E019ull + i);
        const float s = __half2float(__float2half_rn(base * (0.5f + (float)(r >> 40) * (1.0f / 16777216.0f))));
        sz[i] = t4_sz16(s, zero ? (float)(r & 15u) : 8.f);
    }
}

// ---- host side ----------------------------------------------------------------------------------

// KAON_T4_SZ16=1: upload INT4 layers' scales and zeros in the compact form where f16 holds every
// scale exactly (t4_sz16). Off by default until measured.
static bool t4_sz16_on(void) {
    static const bool on = kc_env_on("KAON_T4_SZ16");
    return on;
}

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

static unsigned grid_for(int64_t work, int threads, int64_t cap) {
    int64_t blocks = (work + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > cap) blocks = cap;
    return (unsigned)blocks;
}

typedef struct T4Layout {
    int64_t M, K, g, G, Mt, Kc;
    size_t w_bytes, sz_off, sz_bytes, p_off, total;  // p_off 0: absent
} T4Layout;

// szb: bytes of a row-group's scale and zero (8, or 4 in the compact form).
static void t4_layout(int64_t M, int64_t K, int64_t g, bool perm, int szb, T4Layout *L) {
    L->M = M, L->K = K, L->g = g, L->G = (K + g - 1) / g, L->Mt = (M + 15) / 16, L->Kc = (K + 63) / 64;
    L->w_bytes = (size_t)L->Mt * (size_t)L->Kc * 512;
    L->sz_off = al256(L->w_bytes);
    L->sz_bytes = (size_t)L->Mt * 16 * (size_t)L->G * (size_t)szb;
    size_t end = L->sz_off + al256(L->sz_bytes);
    L->p_off = perm ? end : 0;
    if (perm) end += al256(sizeof(int32_t) * (size_t)K);
    L->total = end;
}

// Shared memory of a k_t4_gemv block: scales and zeros (szb bytes a row-group), nv rows of x, the
// warps' partial sums (counted for 8 warps).
static size_t t4_smem_bytes(int nm, int G, int nv, int Kc, int szb = 8) {
    return (size_t)nm * G * 16 * szb + (((size_t)nv * (Kc * 64 + 32) * 2 + 15) & ~(size_t)15) +
           (size_t)T4_WARPS * nm * 4 * 32 * sizeof(float);
}

// Activation rows per k_t4_gemv pass (0: even one does not fit; those layers take the GEMM path).
static int t4_pass(int nm, int64_t G, int64_t K) {
    if (G > 65536 || K > (1 << 24)) return 0;
    const int Kc = (int)((K + 63) / 64);
    for (int nv = T4_PASS; nv >= 1; nv--)
        if (t4_smem_bytes(nm, (int)G, nv, Kc) <= T4_SMEM_MAX) return nv;
    return 0;
}

// An INT4 layer, host or device copy (F16 scale dtype: the compact form's device copy).
static bool i4_layer(const kaon_linear *l) { return kaon_linear_is_int4_scaled(l, 1); }

// The layer's own checks (host or device copy): 0, or -1 + recorded error.
static int i4_check(kc_backend *b, const kaon_linear *l, const char *what, bool check_bias) {
    const kaon_tensor *w = &l->w, *sc = &l->scale, *zt = &l->zero, *pt = &l->perm;
    const kaon_tensor *bias = check_bias ? kaon_linear_bias(l) : NULL;  // (upload: the bias is its own weight)
    if (!i4_layer(l) || w->ndim != 2) return kc_fail(b, "cuda %s: bad INT4 layer", what);
    const int64_t M = w->shape[0], K = w->shape[1], g = l->scale_block[1], G = (K + g - 1) / g;
    if (M <= 0 || K <= 0 || K % 2 || M > INT32_MAX || K > INT32_MAX / 4)
        return kc_fail(b, "cuda %s: INT4 weight [%lld, %lld] is not whole", what, (long long)M, (long long)K);
    if (sc->ndim != 2 || sc->shape[0] != M || sc->shape[1] != G || (zt->data && zt->dtype != KAON_F32))
        return kc_fail(b, "cuda %s: INT4 scales and zeros must be F32 [%lld, %lld]", what, (long long)M, (long long)G);
    if (pt->data && (pt->dtype != KAON_I32 || kaon_tensor_numel(pt) != K))
        return kc_fail(b, "cuda %s: INT4 permutation must be I32 [%lld]", what, (long long)K);
    if (bias && (bias->dtype != KAON_F32 || kaon_tensor_numel(bias) != M))
        return kc_fail(b, "cuda %s: bias must be F32 [%lld]", what, (long long)M);
    return 0;
}

size_t kc_int4_bytes(const kaon_tensor *host) {
    // The weight's region and the alignment of the others; weights.c counts scale, zero and perm.
    if (host->ndim != 2) return host->nbytes;
    // Tiled: rows padded to 16 and columns to 64; scale + zero pairs of every group (zeros also
    // for symmetric formats) and of the padding rows: counted here at the smallest group (32).
    const size_t Mt = (size_t)(host->shape[0] + 15) / 16, Kc = (size_t)(host->shape[1] + 63) / 64;
    const size_t G32 = (size_t)(host->shape[1] + 31) / 32;
    return al256(Mt * Kc * 512) + 3 * 256 + Mt * 16 * G32 * 4 + 16 * G32 * 8;
}

// Every k_t4_gemv instance of NW warps may use T4_SMEM_MAX of shared memory: 0, or -1 + recorded error.
template <int NW, bool XG, bool SZ16>
static int t4_allow_smem(kc_backend *b) {
    const void *f[5] = {(const void *)k_t4_gemv<NW, false, T4_PLAIN, XG, SZ16>,
                        (const void *)k_t4_gemv<NW, true, T4_PLAIN, XG, SZ16>,
                        (const void *)k_t4_gemv<NW, false, T4_RESIDUAL, XG, SZ16>,
                        (const void *)k_t4_gemv<NW, false, T4_NORMED, XG, SZ16>,
                        (const void *)k_t4_gemv<NW, true, T4_NORMED, XG, SZ16>};
    for (const void *k : f)
        if (kc_check(b, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, T4_SMEM_MAX),
                     "INT4 GEMV shared memory"))
            return -1;
    return 0;
}

// The tiled layout's upload: nibbles reordered on the device, scale + zero pairs on the host.
static int t4_upload(kc_backend *b, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev) {
    const int64_t M = host->w.shape[0], K = host->w.shape[1];
    const bool zero = host->zero.data != NULL, perm = !dummy && host->perm.data != NULL;
    const int64_t G = (K + host->scale_block[1] - 1) / host->scale_block[1];
    const size_t MG = (size_t)M * (size_t)G, raw = (size_t)M * (size_t)K / 2;
    if (!dummy && (host->w.nbytes < raw || host->scale.nbytes < MG * 4 || (zero && host->zero.nbytes < MG * 4)))
        return kc_fail(b, "cuda upload: INT4 layer data is short");
    const float *sc = dummy ? NULL : (const float *)host->scale.data, *z = zero && !dummy ? (const float *)host->zero.data : NULL;
    // The compact form where asked for and f16 holds every scale (dummy scales are made so).
    bool c16 = t4_sz16_on();
    for (size_t i = 0; c16 && sc && i < MG; i++) c16 = t4_sz16_exact(sc[i]);
    T4Layout L;
    t4_layout(M, K, host->scale_block[1], perm, c16 ? 4 : 8, &L);
    void *hsz = NULL;
    if (!dummy) {  // {scale, bf16x2 -(128 + z)} (or t4_sz16); padding rows: scale 0
        if (z)  // the GEMV's exact bf16 subtraction needs integer zeros (every format packs them)
            for (size_t i = 0; i < MG; i++)
                if (!(z[i] >= -127.f && z[i] <= 127.f) || z[i] != (float)(int)z[i])
                    return kc_fail(b, "cuda upload: INT4 zero point %g is not an integer in [-127, 127]", (double)z[i]);
        hsz = malloc(L.sz_bytes);
        if (!hsz) return kc_fail(b, "cuda upload: out of host memory");
        for (int64_t rt = 0; rt < L.Mt; rt++)
            for (int64_t gi = 0; gi < L.G; gi++)
                for (int r = 0; r < 16; r++) {
                    const int64_t m = rt * 16 + r;
                    const float s = m < M ? sc[m * L.G + gi] : 0.f, zz = m < M && z ? z[m * L.G + gi] : 8.f;
                    const size_t at = (size_t)(rt * L.G + gi) * 16 + r;
                    if (c16) ((uint32_t *)hsz)[at] = t4_sz16(s, zz);
                    else ((float2 *)hsz)[at] = make_float2(s, t4_nz(zz));
                }
    }
    uint8_t *dst = NULL, *tmp = NULL;
    if (kc_check(b, cudaMalloc((void **)&dst, L.total), "INT4 weight")) {
        free(hsz);
        return -1;
    }
    int rc = 0;
    if (dummy) {
        const float base = 1.0f / sqrtf((float)K) / 8.0f;
        k_i4_dummy<<<grid_for((int64_t)(L.w_bytes / 8), 256, 4096), 256, 0, b->stream>>>(dst, L.w_bytes, seed);
        if (c16)
            k_t4_dummy_sz16<<<grid_for(L.Mt * 16 * L.G, 256, 4096), 256, 0, b->stream>>>(
                (uint32_t *)(dst + L.sz_off), (size_t)L.Mt * 16 * (size_t)L.G, seed, base, zero);
        else
            k_t4_dummy_sz<<<grid_for(L.Mt * 16 * L.G, 256, 4096), 256, 0, b->stream>>>(
                (float2 *)(dst + L.sz_off), (size_t)L.Mt * 16 * (size_t)L.G, seed, base, zero);
        rc = kc_launched(b, "INT4 dummy weights");
    } else {
        rc = kc_check(b, cudaMalloc((void **)&tmp, raw), "INT4 upload");
        if (!rc) rc = kc_check(b, cudaMemcpy(tmp, host->w.data, raw, cudaMemcpyHostToDevice), "INT4 upload");
        if (!rc) {
            const int64_t nwords = (int64_t)(L.w_bytes / 4);
            k_t4_repack<<<grid_for(nwords, 256, 65535), 256, 0, b->stream>>>(tmp, M, (int)K, (int)L.Kc, (uint32_t *)dst,
                                                                            nwords);
            rc = kc_launched(b, "INT4 repack");
        }
        if (!rc) rc = kc_check(b, cudaMemcpy(dst + L.sz_off, hsz, L.sz_bytes, cudaMemcpyHostToDevice), "INT4 upload");
        if (!rc && perm)
            rc = kc_check(b, cudaMemcpy(dst + L.p_off, host->perm.data, sizeof(int32_t) * (size_t)K,
                                        cudaMemcpyHostToDevice), "INT4 upload");
    }
    if (kc_check(b, cudaStreamSynchronize(b->stream), "INT4 upload")) rc = -1;
    if (tmp) cudaFree(tmp);
    free(hsz);
    if (!rc)  // (per device: each upload sets it)
        rc = c16 ? t4_allow_smem<8, false, true>(b) || t4_allow_smem<4, false, true>(b) ||
                       t4_allow_smem<8, true, true>(b) || t4_allow_smem<4, true, true>(b)
                 : t4_allow_smem<8, false, false>(b) || t4_allow_smem<4, false, false>(b) ||
                       t4_allow_smem<8, true, false>(b) || t4_allow_smem<4, true, false>(b);
    if (rc) {
        cudaFree(dst);
        return -1;
    }
    // w, scale, perm: host's dtypes and shapes, data inside dst (scale: the pairs; zero: in them).
    dev->w = host->w;
    dev->w.data = dst;
    dev->w.nbytes = L.total;
    dev->scale = host->scale;
    dev->scale.dtype = c16 ? KAON_F16 : KAON_F32;  // which form the row-groups are in (t4_gemv, i4_gemm)
    dev->scale.data = dst + L.sz_off;
    dev->scale.nbytes = L.sz_bytes;
    memset(&dev->zero, 0, sizeof dev->zero);
    if (perm) {
        dev->perm = host->perm;
        dev->perm.data = dst + L.p_off;
        dev->perm.nbytes = sizeof(int32_t) * (size_t)K;
    } else {
        memset(&dev->perm, 0, sizeof dev->perm);
    }
    memcpy(dev->scale_block, host->scale_block, sizeof dev->scale_block);
    b->bytes_weights += L.total;
    return 0;
}

int kc_int4_upload(kc_backend *b, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev) {
    if (i4_check(b, host, "upload", false)) return -1;
    if (b->capturing) return kc_fail(b, "cuda upload: while recording a graph");
    return t4_upload(b, host, dummy, seed, dev);
}

// x gathered by perm (or copied when not 16-byte aligned) into the scratch; else x itself.
static const bf16 *i4_x(kc_backend *b, kc_int4 *s, const void *x, int n, int K, const int32_t *perm, bool aligned) {
    if (!perm && aligned) return (const bf16 *)x;
    if (kc_grow(b, &s->xg, &s->xg_cap, sizeof(bf16) * (size_t)n * (size_t)K, 1, "INT4 gathered activations"))
        return NULL;
    cudaError_t e = kc_launch(b, k_i4_gather, dim3(grid_for((int64_t)n * K, 256, 4096)), dim3(256), 0, (const bf16 *)x,
                              perm, n, K, (bf16 *)s->xg);
    return kc_check(b, e, "INT4 gather") ? NULL : (const bf16 *)s->xg;
}

// Whether k_t4_gemv reads x through L1 as it goes rather than staging it in shared memory first:
// for passes of several rows (staging nv rows costs every block L2 round trips and a barrier
// after the PDL wait: 16.1 vs 27.7 us at 8 rows of 14336 x 4096 on the H100), not for one (in
// batch-1 decode staging was 1.7% faster there). KAON_T4_X=smem or global forces one (A/B).
static bool t4_x_direct(int nv) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KAON_T4_X");
        v = e && !strcmp(e, "smem") ? 0 : e && !strcmp(e, "global") ? 1 : 2;
    }
    return v == 2 ? nv > 1 : v == 1;
}

// Warps per block: 8 while the blocks fit one wave at 2 per SM (more loads in flight per row),
// else 4, 4 blocks per SM (a shorter tail); KAON_T4_NW=4 or 8 forces one (A/B).
static bool t4_wide(unsigned blocks, int n_sm) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KAON_T4_NW");
        v = e ? atoi(e) : 0;
    }
    return v == 8 || (v != 4 && blocks <= 2u * (unsigned)n_sm);
}

template <int NW, bool XG, bool SZ16>
static cudaError_t t4_launch_nw(kc_backend *b, bool silu, int mode, unsigned blocks, size_t smem, const T4Args &a) {
    const dim3 grid(blocks), block(NW * 32);
    if (mode == T4_RESIDUAL) return kc_launch(b, k_t4_gemv<NW, false, T4_RESIDUAL, XG, SZ16>, grid, block, smem, a);
    if (mode == T4_NORMED)
        return silu ? kc_launch(b, k_t4_gemv<NW, true, T4_NORMED, XG, SZ16>, grid, block, smem, a)
                    : kc_launch(b, k_t4_gemv<NW, false, T4_NORMED, XG, SZ16>, grid, block, smem, a);
    return silu ? kc_launch(b, k_t4_gemv<NW, true, T4_PLAIN, XG, SZ16>, grid, block, smem, a)
                : kc_launch(b, k_t4_gemv<NW, false, T4_PLAIN, XG, SZ16>, grid, block, smem, a);
}

template <bool XG, bool SZ16>
static cudaError_t t4_launch(kc_backend *b, bool wide, bool silu, int mode, unsigned blocks, size_t smem,
                             const T4Args &a) {
    return wide ? t4_launch_nw<8, XG, SZ16>(b, silu, mode, blocks, smem, a)
                : t4_launch_nw<4, XG, SZ16>(b, silu, mode, blocks, smem, a);
}

// k_t4_gemv over count layers of one width, group and perm (silu: gate l[0], up l[1], y[0] out).
// fuse (n 1; NULL: none): the split norm's residual (one weight, y[0] the residual stream) or normed mode.
static int t4_gemv(kc_backend *b, kc_int4 *s, const void *x, int n, int count, const kaon_linear *const *l,
                   void *const *y, int f32out, bool silu, const kc_gemv_fuse *fuse = NULL) {
    const int K = (int)l[0]->w.shape[1], G = (int)l[0]->scale.shape[1], Kc = (K + 63) / 64, nm = silu ? 2 : 1;
    const int pass = t4_pass(nm, G, K);
    if (pass < 1) return kc_fail(b, "cuda INT4 GEMV: in %d, %d groups do not fit shared memory", K, G);
    const bf16 *xg = i4_x(b, s, x, n, K, (const int32_t *)l[0]->perm.data, ((uintptr_t)x & 15) == 0);
    if (!xg) return -1;
    const size_t es = f32out ? 4 : 2;
    for (int p0 = 0; p0 < n; p0 += pass) {
        const int nv = n - p0 < pass ? n - p0 : pass;
        T4Args a;
        memset(&a, 0, sizeof a);
        unsigned blocks = 0;
        for (int i = 0; i < count; i++) {
            const kaon_tensor *bias = kaon_linear_bias(l[i]);
            a.w[i] = (const uint4 *)l[i]->w.data;
            a.sz[i] = l[i]->scale.data;
            a.bias[i] = bias ? (const float *)bias->data : NULL;
            a.M[i] = (int)l[i]->w.shape[0];
            a.y[i] = silu ? (i == 0 ? (void *)((uint8_t *)y[0] + (size_t)p0 * a.M[0] * 2) : NULL)
                          : (void *)((uint8_t *)y[i] + (size_t)p0 * a.M[i] * es);
            a.begin[i] = (int)blocks;
            if (!silu || i == 0) blocks += (unsigned)((a.M[i] + 15) / 16);
        }
        a.count = count;
        a.x = xg + (size_t)p0 * K;
        a.K = K, a.Kc = Kc, a.G = G, a.g = (int)l[0]->scale_block[1];
        a.nv = nv, a.f32out = f32out, a.xstride = Kc * 64 + 32;
        const bool xg_direct = t4_x_direct(nv), wide = t4_wide(blocks, b->n_sm);
        const bool c16 = l[0]->scale.dtype == KAON_F16;  // (every layer of a launch: i4_gemv_pair)
        const size_t smem = t4_smem_bytes(nm, G, xg_direct ? 0 : nv, Kc, c16 ? 4 : 8);
        const int mode = !fuse ? T4_PLAIN : fuse->residual ? T4_RESIDUAL : T4_NORMED;
        if (fuse) a.fuse = *fuse;
        const cudaError_t e =
            c16 ? (xg_direct ? t4_launch<true, true>(b, wide, silu, mode, blocks, smem, a)
                             : t4_launch<false, true>(b, wide, silu, mode, blocks, smem, a))
                : (xg_direct ? t4_launch<true, false>(b, wide, silu, mode, blocks, smem, a)
                             : t4_launch<false, false>(b, wide, silu, mode, blocks, smem, a));
        if (kc_check(b, e, "INT4 GEMV")) return -1;
    }
    return 0;
}

// Dequantized row chunks through cuBLASLt (bias added here: kc_gemm_bf16 has none for f32 output).
static int i4_gemm(kc_backend *b, kc_int4 *s, const void *x, int n, const kaon_linear *l, void *y, int f32out) {
    const int M = (int)l->w.shape[0], K = (int)l->w.shape[1], G = (int)l->scale.shape[1], g = (int)l->scale_block[1];
    const kaon_tensor *bt = kaon_linear_bias(l);
    const float *bias = bt ? (const float *)bt->data : NULL;
    x = i4_x(b, s, x, n, K, (const int32_t *)l->perm.data, true);
    if (!x) return -1;
    int chunk = M;
    if ((int64_t)M * K > I4_DEQ_CAP) {
        chunk = (int)(I4_DEQ_CAP / K) & ~63;
        if (chunk < 64) chunk = 64;
        if (chunk > M) chunk = M;
    }
    if (kc_grow(b, &s->deq, &s->deq_cap, sizeof(bf16) * (size_t)chunk * (size_t)K, 1, "INT4 dequantized weights"))
        return -1;
    const size_t es = f32out ? 4 : 2;
    if (chunk < M && kc_grow(b, &s->tmp, &s->tmp_cap, (size_t)n * (size_t)chunk * es, 1, "INT4 GEMM output")) return -1;
    for (int r0 = 0; r0 < M; r0 += chunk) {
        const int cnt = M - r0 < chunk ? M - r0 : chunk;
        cudaError_t e = kc_launch(b, k_t4_dequant, dim3(grid_for((int64_t)cnt * K, 256, 65535)), dim3(256), 0,
                        (const uint32_t *)l->w.data, (const void *)l->scale.data, l->scale.dtype == KAON_F16, K,
                        (K + 63) / 64, G, g,
                        (int64_t)r0, (int64_t)cnt, (bf16 *)s->deq);
        if (kc_check(b, e, "INT4 dequantize")) return -1;
        const float *bc = bias && !f32out ? bias + r0 : NULL;
        void *out = chunk == M ? y : s->tmp;
        if (kc_gemm_bf16(b, (const bf16 *)x, n, (const bf16 *)s->deq, cnt, K, bc, out, f32out)) return -1;
        if (chunk < M &&
            kc_check(b, cudaMemcpy2DAsync((uint8_t *)y + (size_t)r0 * es, (size_t)M * es, s->tmp, (size_t)cnt * es,
                                          (size_t)cnt * es, (size_t)n, cudaMemcpyDeviceToDevice, b->stream),
                     "INT4 GEMM output"))
            return -1;
    }
    if (bias && f32out) {
        const int64_t total = (int64_t)n * M;
        k_i4_bias_f32<<<grid_for(total, 256, 4096), 256, 0, b->stream>>>((float *)y, bias, total, M);
        if (kc_launched(b, "INT4 bias")) return -1;
    }
    return 0;
}

int kc_int4_linear(kc_backend *b, const void *x, int n, const kaon_linear *l, void *y, int f32out) {
    if (n <= 0) return 0;
    if (!l || !l->w.data || i4_check(b, l, "linear", true)) return -1;
    kc_int4 *s = istate(b);
    if (!s) return -1;
    const int64_t K = l->w.shape[1], g = l->scale_block[1];
    const bool gemv_ok = K % 32 == 0 && g % 32 == 0 && ((uintptr_t)l->w.data & 15) == 0;
    if (gemv_ok && n <= I4_GEMV_MAX_N && t4_pass(1, l->scale.shape[1], K) > 0)
        return t4_gemv(b, s, x, n, 1, &l, &y, f32out, false);
    return i4_gemm(b, s, x, n, l, y, f32out);
}

// Whether layers a and b can share one GEMV launch: both INT4 of the GEMV's shapes, one width,
// one group size, zeros alike, no act-order (each layer would gather x its own way).
static bool i4_gemv_pair(const kaon_linear *a, const kaon_linear *b) {
    for (const kaon_linear *l : {a, b})
        if (!i4_layer(l) || !l->w.data || l->w.ndim != 2 || l->perm.data || l->w.shape[1] % 32 ||
            l->scale_block[1] % 32 || ((uintptr_t)l->w.data & 15) || l->w.shape[0] > INT32_MAX)
            return false;
    return a->w.shape[1] == b->w.shape[1] && a->scale_block[1] == b->scale_block[1] &&
           a->scale.shape[1] == b->scale.shape[1] && a->scale.dtype == b->scale.dtype;
}

int kc_int4_linear_multi(kc_backend *b, const void *x, int n, int count, const kaon_linear *const *l, void *const *y,
                         const kc_gemv_fuse *split) {
    if (count < 1 || count > 4 || n <= 0 || n > I4_GEMV_MAX_N || (split && n != 1)) return 1;
    for (int i = 0; i < count; i++)
        if (!i4_gemv_pair(l[0], l[i])) return 1;
    if (t4_pass(1, l[0]->scale.shape[1], l[0]->w.shape[1]) < 1) return 1;
    for (int i = 0; i < count; i++)
        if (i4_check(b, l[i], "linear_multi", true)) return -1;
    kc_int4 *s = istate(b);
    if (!s) return -1;
    return t4_gemv(b, s, x, n, count, l, y, 0, false, split);
}

int kc_int4_linear_silu_mul(kc_backend *b, const void *x, int n, const kaon_linear *gate, const kaon_linear *up,
                            void *out, const kc_gemv_fuse *split) {
    if (n <= 0 || n > I4_GEMV_MAX_N || (split && n != 1) || !i4_gemv_pair(gate, up) || gate->w.shape[0] != up->w.shape[0] ||
        kaon_linear_bias(gate) || kaon_linear_bias(up) ||
        t4_pass(2, gate->scale.shape[1], gate->w.shape[1]) < 1)
        return 1;
    if (i4_check(b, gate, "linear_silu_mul", true) || i4_check(b, up, "linear_silu_mul", true)) return -1;
    kc_int4 *s = istate(b);
    if (!s) return -1;
    const kaon_linear *l[2] = {gate, up};
    void *y[2] = {out, NULL};
    return t4_gemv(b, s, x, n, 2, l, y, 0, true, split);
}

// res += x @ l^T on the GEMV, also leaving the split norm's xg and parts (f: norm, xg, parts in;
// n_parts out), at batch 1; else 1.
int kc_int4_linear_residual(kc_backend *b, const void *x, int n, const kaon_linear *l, void *res, kc_gemv_fuse *f) {
    if (n != 1 || !i4_gemv_pair(l, l) || t4_pass(1, l->scale.shape[1], l->w.shape[1]) < 1 ||
        l->w.shape[1] > KC_GEMV_NORM_MAX_IN)
        return 1;
    if (i4_check(b, l, "linear_residual", true)) return -1;
    kc_int4 *s = istate(b);
    if (!s) return -1;
    if (t4_gemv(b, s, x, n, 1, &l, &res, 0, false, f)) return -1;
    f->n_parts = (int)((l->w.shape[0] + 15) / 16);
    return 0;
}
