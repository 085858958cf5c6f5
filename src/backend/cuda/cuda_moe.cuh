// What the moe op's kernel files share (cuda_moe.cu: routing, bf16 experts, the host side;
// cuda_moe_fp8.cu: FP8 experts): sizes, the scratch of one call, small device helpers.
#ifndef KAON_BACKEND_CUDA_MOE_CUH
#define KAON_BACKEND_CUDA_MOE_CUH

#include "backend/cuda/cuda_internal.h"

#define MOE_MAX_E 1024     // experts the routing kernels handle (k_plan: one thread each)
#define MOE_MAX_K 32       // top-k
#define MOE_GEMV_MAX_N 8   // tokens per step that take the GEMV path
#define GEMV_WARPS 8
#define BM 64              // grouped GEMM tile: slots x output columns x K
#define BN 64
#define BK 32
#define LDS (BK + 8)       // shared-memory row stride of a tile (bf16), a multiple of 8
#define DN_ROWS 2          // k_moe_small_down and its FP8 twin: output rows per block
#define DN_WPR (GEMV_WARPS / DN_ROWS)  // warps per output row

// Device scratch of one call, carved from b->moe_buf.
typedef struct MoeBufs {
    unsigned *ticket;  // [1] k_moe_route_small's count of finished blocks (0 between launches)
    float *logits;     // [n, E]
    int *topk_id;      // [n*K] (-1: none); the general path only (the small one keeps its ids in shared memory)
    float *topk_w;     // [n*K]
    int *cnt;          // [E]
    int *off;          // [E+1]
    int *fill;         // [E]
    int *active;       // [E] active experts, then their count at active[E]
    int2 *tiles;       // [max_tiles] (expert, first row within the expert)
    int *n_tiles;      // [1]
    int *slot_tok;     // [n*K]
    int *inv;          // [n*K]
    bf16 *H;           // [n*K, F]
    bf16 *Y;           // [n*K, dim]
    bf16 *HS;          // [n, SF]
    bf16 *YS;          // [n, dim]
    float *SG;         // [n]
} MoeBufs;

// The batch-1 RMSNorm split around the small path (norm_moe_residual; cuda_internal.h's
// kc_gemv_fuse for the dense GEMVs). in_parts: x is a residual kernel's xg and the router's and
// gate/up's products are scaled by 1 / rms from in_parts[:in_n] (NULL: x is the normed row).
// res: the combine adds into out, the residual stream (each rounded to bf16, as rmsnorm's add),
// then leaves xg = bf16(out * norm) and each block's sum of out^2 in parts (norm NULL: no next
// norm to prepare).
typedef struct MoeNorm {
    const float *in_parts;
    int in_n;
    float eps;
    int res;
    const float *norm;
    bf16 *xg;
    float *parts;
} MoeNorm;

// FP8 experts as cuda_fp8.cu uploads a layer (model/moe.c stacks each kind into one): e4m3
// codes [E * rows, cols] and f32 scales, per 128 x 128 block or one per row.
typedef struct MoeW8 {
    const uint8_t *gate, *up, *down;  // expert 0's codes
    long long sgate, sup, sdown;      // expert stride (bytes)
    const float *gs, *us, *ds;        // expert 0's scales
    long long sgs, sus, sds;          // expert stride (floats)
    int block;                        // 1: 128 x 128 blocks, 0: one scale per row
    int gcols, dcols;                 // block scale columns of gate/up (dim / 128) and down (F / 128)
} MoeW8;

static __device__ __forceinline__ float bfr(float v) { return __bfloat162float(__float2bfloat16(v)); }

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ void cp16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;  // 0: zero-fill
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n));
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
static __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// ---- cuda_moe_fp8.cu: the FP8 experts' kernels, launched on b's stream ----
// The small path's gate/up (grid: F / GEMV_WARPS x max_active) and down + combine (dim / DN_ROWS),
// as k_moe_small_gu / k_moe_small_down without a fused shared expert (an FP8 one runs through the
// linear ops: YS).
int kc_moe8_small_gu(kc_backend *b, const bf16 *x, int dim, int F, const MoeW8 &w, int max_active, const MoeBufs &m,
                     int E);
int kc_moe8_small_down(kc_backend *b, int n, int dim, int F, const MoeW8 &w, const bf16 *YS, const float *SG, int K,
                       const MoeBufs &m, int E, bf16 *out);
// The grouped GEMMs of the general path (tiles from k_plan): gate/up with SiLU into H, down into Y.
int kc_moe8_gemm(kc_backend *b, const bf16 *x, int dim, int F, const MoeW8 &w, int max_tiles, const MoeBufs &m);

#endif
