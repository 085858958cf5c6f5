// The moe op on the GPU: bf16 experts stacked per kind (expert e of a kind at a fixed stride
// from expert 0: model/moe.c uploads them so), f32 accumulation. FP8 experts (e4m3 with block or
// per-row scales, one cuda_fp8.cu layer per kind) take the same routing and plan with the
// expert kernels of cuda_moe_fp8.cu.
//
// One step, all on the stream with no host synchronisation (so whole steps are graphed):
//   1. router logits = x @ router^T                      [n, E] f32 (GEMV / cuBLASLt)
//   2. k_route: per token (one warp) the logits rounded to bf16 (as HF's bf16 Linear gives
//      them), softmax in f32, top-k (ties: the lower expert), renormalised when asked;
//      padding tokens (position < 0) get no experts. Per-expert counts by atomics (and the
//      caller's expert-load counters). DeepSeekMoE routing (sigmoid scores, selection bias,
//      expert groups, routed scaling): k_route_ds in cuda_moe_route.cu.
//   3. k_plan (one block): offsets = exclusive scan of the counts, the list of active
//      experts, and the tiles of the grouped GEMM (expert, first row) in expert order.
//   4. k_permute: slot of each (token, choice): the rows of expert e are the slots
//      [off[e], off[e+1]); slot_tok[slot] = token, inv[token * K + j] = slot.
//   5. experts, reading each active expert's weights once for all of its tokens:
//      n <= 8 (decode; only with KAON_MOE_SMALL=0, see below): GEMV kernels, one warp per
//        weight row, the expert's <= 8 token rows in registers (k_moe_gemv_gu:
//        silu(x gate^T) * (x up^T); k_moe_gemv_down);
//      else (prefill): grouped GEMM on tensor cores (WMMA bf16 16x16x16, f32 accumulators,
//        64x64 tiles, 2-stage cp.async pipeline): the gate/up kernel gathers its A rows
//        through slot_tok and applies SiLU-and-mul in its epilogue; the down kernel reads the
//        hidden rows in slot order. Tiles past the real count (the grid is sized for the
//        worst case) return at once.
//      H [n*K, ffn] and Y [n*K, dim] hold the routed rows in slot order. (This op reads bf16
//      only: model/moe.c uploads quantized GGUF routers and experts through upload_dense,
//      which expands them; the shared expert stays quantized, read by the linear ops.)
//   6. the shared expert through the backend's own linear ops, with Qwen2-MoE's sigmoid gate
//      from an f32 GEMV (DeepSeek's shared experts have no gate: weight 1);
//   7. k_combine: out[t] = sum_j w[t, j] * Y[inv[t*K + j]] (+ sigmoid(g_t) * shared_t): the
//      weighted un-permute and the sum in one pass, f32, one rounding to bf16.
// Intermediate roundings follow HF's bf16 modules: gate and up outputs, silu, their product and
// each expert's output are rounded to bf16.
//
// Small batches (n <= 8, decode) take three launches instead (moe_small): at batch 1 the ten
// launches above cost more in launch gaps and one-block kernels (routing, plan, combine) than
// the expert GEMVs take to stream their weights.
//   k_moe_route_small: router GEMV (k_gemv's arithmetic) with Qwen2-MoE's gate input as one more
//     row; the last block to finish (a ticket counter in the scratch) routes every token with
//     k_route's / k_route_ds's own code, counts in shared memory, and writes offsets, the active
//     experts, slot_tok and inv (slots of an expert in token order: deterministic);
//     k_moe_route_cluster (KAON_MOE_ROUTE_CLUSTER=1, softmax routing): the same with the blocks
//     as one cluster, the logits gathered in block 0's shared memory.
//   k_moe_small_gu: the active experts' gate/up GEMV and, as extra grid rows, the shared expert's
//     (its blocks first: they load weights before the routing is done, under PDL).
//   k_moe_small_down: one output row per DN_WPR warps, which share its dot products (shared
//     expert, active experts) and add them per token in k_combine's order and roundings;
//     k_moe_small_down_b1 (KAON_MOE_B1_DOWN=1, batch 1): one warp per output row, all its tasks'
//     weights requested together.
// A shared expert these kernels cannot read as bare bf16 goes through the linear ops between the
// second and third launch. KAON_MOE_SMALL=0: small batches take the general path.
//
// Expert parallelism (w->e1 > 0, model/tp.h): this rank holds experts [e0, e1) only, their
// views stacked from expert e0 (model/moe.c uploads just those rows). Every token is still
// routed over all E (the router is replicated, so every rank chooses alike; the caller's counters
// count every choice, as the CPU's op does); the plan and the permutation then take only the
// choices of local experts, renumbered e - e0, so everything after them (GEMV / GEMM kernels,
// tiles, active list, MoeW's bases) sees an E of e1 - e0 experts. A choice of another rank's
// expert gets inv = -2: no slot, no contribution (-1 stays padding's mark, which zeroes the row);
// a token none of whose experts is here gets exactly 0 (+ its shared-expert part). The all-reduce
// after the block sums the ranks. With e1 == 0 the kernels are the ones above (the EP branches
// are template arguments).
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_moe_route.cuh"

#include <atomic>
#include <cooperative_groups.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;
namespace cg = cooperative_groups;

typedef struct MoeW {
    const bf16 *gate, *up, *down;    // expert 0 (expert parallel: expert e0, local expert 0)
    long long sgate, sup, sdown;     // expert stride (elements)
} MoeW;

// ---- 2. routing ------------------------------------------------------------------------------

// Token t (the whole warp; lane = its lane). E <= MOE_MAX_E (each lane keeps E/32 logits),
// K <= MOE_MAX_K. The chosen experts are counted in cnt (global or shared memory) and counts
// (NULL: none). logits are read through L2 (ld.cg): the small-batch kernel wrote them itself
// (SMEM: shared memory, plain loads).
template <int PER, bool SMEM = false>
static __device__ __forceinline__ void moe_route_token_n(const float *logits, const int32_t *pos, int t, int E, int K,
                                                       int norm, int *topk_id, float *topk_w, int *cnt,
                                                       uint32_t *counts, int lane) {
    if (pos && pos[t] < 0) {  // padding: no experts
        for (int j = lane; j < K; j += 32) {
            topk_id[(size_t)t * K + j] = -1;
            topk_w[(size_t)t * K + j] = 0.f;
        }
        return;
    }
    float v[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        v[i] = e < E ? bfr(SMEM ? logits[(size_t)t * E + e] : __ldcg(logits + (size_t)t * E + e)) : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < PER; i++)
        if (lane + 32 * i < E) sum += expf(v[i] - mx);
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    // Each choice is one warp max over 32-bit keys (redux.sync): the logit's bf16 bits made
    // order-preserving above, 0xffff - e below, so equal logits go to the lower expert; 0: not
    // an expert (or NaN), or taken.
    unsigned key[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        const unsigned b = __float_as_uint(v[i] == 0.f ? 0.f : v[i]) >> 16;  // a bf16 value (exact); -0 as 0
        const unsigned ord = (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
        key[i] = e < E && v[i] == v[i] ? ord << 16 | (0xffffu - (unsigned)e) : 0u;
    }
    float chosen_p = 0.f, sel = 0.f;
    int chosen_j = -1;
    for (int j = 0; j < K; j++) {
        unsigned best = key[0];
#pragma unroll
        for (int i = 1; i < PER; i++) best = max(best, key[i]);
        best = __reduce_max_sync(0xffffffffu, best);
        if (!best) break;  // fewer than K finite logits (cannot happen with finite inputs)
        const int bi = (int)(0xffffu - (best & 0xffffu));
        const unsigned ord = best >> 16;
        const float bv = __uint_as_float(((ord & 0x8000u) ? (ord & 0x7fffu) : (~ord & 0xffffu)) << 16);
        const float p = expf(bv - mx) / sum;
        sel += p;
#pragma unroll
        for (int i = 0; i < PER; i++)  // taken (a static index keeps the keys in registers)
            if (lane + 32 * i == bi) key[i] = 0u;
        if (lane == j) {
            chosen_p = p;
            chosen_j = bi;
        }
        if (lane == 0) {
            atomicAdd(&cnt[bi], 1);
            if (counts) atomicAdd(&counts[bi], 1u);
        }
    }
    if (lane < K) {
        topk_id[(size_t)t * K + lane] = chosen_j;
        topk_w[(size_t)t * K + lane] = norm && sel > 0.f ? chosen_p / sel : chosen_p;
    }
}

// Lanes keep PER = ceil(E / 32) logits each; the loops are as long as the experts need.
template <bool SMEM = false>
static __device__ __forceinline__ void moe_route_token(const float *logits, const int32_t *pos, int t, int E, int K,
                                                       int norm, int *topk_id, float *topk_w, int *cnt,
                                                       uint32_t *counts, int lane) {
    if (E <= 64) moe_route_token_n<2, SMEM>(logits, pos, t, E, K, norm, topk_id, topk_w, cnt, counts, lane);
    else if (E <= 128) moe_route_token_n<4, SMEM>(logits, pos, t, E, K, norm, topk_id, topk_w, cnt, counts, lane);
    else if (E <= 256) moe_route_token_n<8, SMEM>(logits, pos, t, E, K, norm, topk_id, topk_w, cnt, counts, lane);
    else moe_route_token_n<MOE_MAX_E / 32, SMEM>(logits, pos, t, E, K, norm, topk_id, topk_w, cnt, counts, lane);
}

// One warp per token.
__global__ void k_route(const float *__restrict__ logits, const int32_t *__restrict__ pos, int n, int E, int K,
                        int norm, int *__restrict__ topk_id, float *__restrict__ topk_w, int *__restrict__ cnt,
                        uint32_t *__restrict__ counts) {
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n) return;
    moe_route_token(logits, pos, t, E, K, norm, topk_id, topk_w, cnt, counts, lane);
}

// ---- 3. plan -----------------------------------------------------------------------------------

// One block of MOE_MAX_E threads: thread e owns expert e. Tiles of tm rows (the GEMM's TM).
__global__ void __launch_bounds__(MOE_MAX_E) k_plan(const int *__restrict__ cnt, int E, int tm, int *__restrict__ off,
                                                    int *__restrict__ fill, int *__restrict__ active,
                                                    int2 *__restrict__ tiles, int *__restrict__ n_tiles) {
    __shared__ int s_cnt[MOE_MAX_E], s_tiles[MOE_MAX_E], s_act[MOE_MAX_E];
    const int e = threadIdx.x;
    const int c = e < E ? cnt[e] : 0;
    s_cnt[e] = c;
    s_tiles[e] = (c + tm - 1) / tm;
    s_act[e] = c > 0;
    __syncthreads();
    // Inclusive scans (Hillis-Steele; 1024 elements, once per layer).
    for (int d = 1; d < MOE_MAX_E; d <<= 1) {
        const int a = e >= d ? s_cnt[e - d] : 0, b = e >= d ? s_tiles[e - d] : 0, x = e >= d ? s_act[e - d] : 0;
        __syncthreads();
        s_cnt[e] += a;
        s_tiles[e] += b;
        s_act[e] += x;
        __syncthreads();
    }
    if (e < E) {
        off[e] = s_cnt[e] - c;
        fill[e] = 0;
        if (c > 0) active[s_act[e] - 1] = e;
        const int t0 = s_tiles[e] - (c + tm - 1) / tm;
        for (int r = 0, i = t0; r < c; r += tm, i++) tiles[i] = make_int2(e, r);
    }
    if (e == MOE_MAX_E - 1) {
        off[E] = s_cnt[e];
        *n_tiles = s_tiles[e];
        active[E] = s_act[e];
    }
}

// ---- 4. permute --------------------------------------------------------------------------------

// EP: off / fill are this rank's experts' (local ids e - e0 < El); another rank's choice gets
// inv -2 (no slot).
template <bool EP>
__global__ void k_permute(const int *__restrict__ topk_id, int nk, const int *__restrict__ off,
                          int *__restrict__ fill, int *__restrict__ slot_tok, int *__restrict__ inv, int K, int e0,
                          int El) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nk) return;
    int e = topk_id[i];
    if (e < 0) {
        inv[i] = -1;
        return;
    }
    if (EP) {
        e -= e0;
        if ((unsigned)e >= (unsigned)El) {
            inv[i] = -2;
            return;
        }
    }
    const int s = off[e] + atomicAdd(&fill[e], 1);
    slot_tok[s] = i / K;
    inv[i] = s;
}

// ---- 5a. decode: GEMV over the active experts -----------------------------------------------------

// Block (r-block, i): active expert i, rows r of gate/up (one per warp); its tokens' x rows
// (at most MOE_GEMV_MAX_N) dotted with both. H[slot, r] = bf16(silu(g)) * u.
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_moe_gemv_gu(const bf16 *__restrict__ x, int dim, int F, MoeW w, const int *__restrict__ active, int E,
              const int *__restrict__ off, const int *__restrict__ slot_tok, bf16 *__restrict__ H) {
    if ((int)blockIdx.y >= active[E]) return;
    const int e = active[blockIdx.y];
    const int r = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= F) return;
    const int s0 = off[e], ne = min(off[e + 1] - s0, MOE_GEMV_MAX_N);
    const uint4 *gr = (const uint4 *)(w.gate + (size_t)e * w.sgate + (size_t)r * dim);
    const uint4 *ur = (const uint4 *)(w.up + (size_t)e * w.sup + (size_t)r * dim);
    const uint4 *xr[MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++)
        xr[b] = (const uint4 *)(x + (size_t)slot_tok[s0 + (b < ne ? b : 0)] * dim);
    float ag[MOE_GEMV_MAX_N], au[MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) ag[b] = au[b] = 0.f;
    const int nc = dim >> 3;
    constexpr int U = 2;  // 2U weight loads in flight per lane
    int c = lane;
    for (; c + 32 * (U - 1) < nc; c += 32 * U) {
        uint4 gv[U], uv[U];
#pragma unroll
        for (int q = 0; q < U; q++) {
            gv[q] = ld_stream(gr + c + 32 * q);
            uv[q] = ld_stream(ur + c + 32 * q);
        }
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < ne) {
#pragma unroll
                for (int q = 0; q < U; q++) {
                    const uint4 x0 = __ldg(xr[b] + c + 32 * q);
                    ag[b] = dot8(gv[q], x0, ag[b]);
                    au[b] = dot8(uv[q], x0, au[b]);
                }
            }
    }
    for (; c < nc; c += 32) {
        const uint4 g0 = ld_stream(gr + c), u0 = ld_stream(ur + c);
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < ne) {
                const uint4 x0 = __ldg(xr[b] + c);
                ag[b] = dot8(g0, x0, ag[b]);
                au[b] = dot8(u0, x0, au[b]);
            }
    }
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++)
        if (b < ne) {
            const float g = bfr(warp_sum(ag[b])), u = bfr(warp_sum(au[b]));
            if (lane == 0) H[(size_t)(s0 + b) * F + r] = __float2bfloat16(bfr(g / (1.f + expf(-g))) * u);
        }
}

// Rows r of down_e [dim, F] dotted with the expert's hidden rows: Y[slot, r].
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_moe_gemv_down(const bf16 *__restrict__ H, int dim, int F, MoeW w, const int *__restrict__ active, int E,
                const int *__restrict__ off, bf16 *__restrict__ Y) {
    if ((int)blockIdx.y >= active[E]) return;
    const int e = active[blockIdx.y];
    const int r = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= dim) return;
    const int s0 = off[e], ne = min(off[e + 1] - s0, MOE_GEMV_MAX_N);
    const uint4 *dr = (const uint4 *)(w.down + (size_t)e * w.sdown + (size_t)r * F);
    const uint4 *hr = (const uint4 *)(H + (size_t)s0 * F);
    const int nc = F >> 3;
    float acc[MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[b] = 0.f;
    constexpr int U = 4;  // weight loads in flight per lane
    int c = lane;
    for (; c + 32 * (U - 1) < nc; c += 32 * U) {
        uint4 dv[U];
#pragma unroll
        for (int q = 0; q < U; q++) dv[q] = ld_stream(dr + c + 32 * q);
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < ne) {
#pragma unroll
                for (int q = 0; q < U; q++) acc[b] = dot8(dv[q], __ldg(hr + (size_t)b * nc + c + 32 * q), acc[b]);
            }
    }
    for (; c < nc; c += 32) {
        const uint4 d0 = ld_stream(dr + c);
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < ne) acc[b] = dot8(d0, __ldg(hr + (size_t)b * nc + c), acc[b]);
    }
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++)
        if (b < ne) {
            const float v = warp_sum(acc[b]);
            if (lane == 0) Y[(size_t)(s0 + b) * dim + r] = __float2bfloat16(v);
        }
}

// ---- small batches (n <= MOE_GEMV_MAX_N): three launches ------------------------------------------

#define SR_WARPS 8      // k_moe_route_small: router rows per block; its last block routes token w in warp w
static_assert(SR_WARPS == KC_GEMV_ROWS && GEMV_WARPS == KC_GEMV_ROWS, "kc_norm_block_sum sums 8 warps");
#define SM_U 8          // weight loads in flight per lane and matrix (GEMV of the small path): a
                        // 2048-wide row (or 1408: the tail) in one round trip

// One router row's dot products with the n token rows (xr: [n, nc] chunks), k_gemv's
// arithmetic: lane chunks c = lane + 32 u, SM_U a round; wv holds the first round when the row
// has one (requested before the PDL wait).
static __device__ __forceinline__ void route_row_dots(const uint4 *wr, const uint4 *xr, int n, int nc, int lane,
                                                      uint4 (&wv)[SM_U], float (&acc)[MOE_GEMV_MAX_N]) {
    int c = lane;
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[b] = 0.f;
    for (bool first = true; c + 32 * (SM_U - 1) < nc; c += 32 * SM_U, first = false) {
        if (!first)
#pragma unroll
            for (int u = 0; u < SM_U; u++) wv[u] = ld_stream(wr + c + 32 * u);
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < n) {
                const uint4 *xb = xr + (size_t)b * nc + c;
                float s = acc[b];
#pragma unroll
                for (int u = 0; u < SM_U; u++) s = dot8(wv[u], __ldg(xb + 32 * u), s);
                acc[b] = s;
            }
    }
    if (c < nc) {  // the rest (fewer than SM_U chunks of this lane), requested together
#pragma unroll
        for (int u = 0; u < SM_U - 1; u++)
            if (c + 32 * u < nc) wv[u] = ld_stream(wr + c + 32 * u);
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < n) {
#pragma unroll
                for (int u = 0; u < SM_U - 1; u++)
                    if (c + 32 * u < nc) acc[b] = dot8(wv[u], __ldg(xr + (size_t)b * nc + c + 32 * u), acc[b]);
            }
    }
}

// The last part of routing n tokens (one block; s_id [n * K] the choices, s_cnt [E] their
// counts, both in shared memory): EP's local ids, offsets (s_off and m.off), the active experts
// in expert order, slot_tok and inv (within an expert the slots follow the tokens).
template <bool EP>
static __device__ __forceinline__ void route_plan(int n, int E, int K, int *s_id, const int *s_cnt, int *s_off,
                                                  const MoeBufs &m, int e0, int El) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nk = n * K;
    if (EP)
        for (int i = threadIdx.x; i < nk; i += blockDim.x) {
            const int id = s_id[i];
            if (id >= 0) s_id[i] = (unsigned)(id - e0) < (unsigned)El ? id - e0 : -2;  // local id, or another rank's
        }
    const int *cl = s_cnt + (EP ? e0 : 0);  // the planned experts' counts: this rank's under EP
    const int EE = EP ? El : E;
    if (warp == 0) {
        // Exclusive scans of the counts and of (count > 0): lane owns experts [l0, l1).
        const int per = (EE + 31) / 32, l0 = lane * per, l1 = min(l0 + per, EE);
        int sc = 0, sa = 0;
        for (int e = l0; e < l1; e++) {
            sc += cl[e];
            sa += cl[e] > 0;
        }
        int ic = sc, ia = sa;  // inclusive
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, ic, o), q = __shfl_up_sync(0xffffffffu, ia, o);
            if (lane >= o) {
                ic += a;
                ia += q;
            }
        }
        int oc = ic - sc, oa = ia - sa;
        for (int e = l0; e < l1; e++) {
            const int ce = cl[e];
            s_off[e] = oc;
            m.off[e] = oc;
            if (ce > 0) m.active[oa++] = e;
            oc += ce;
        }
        if (lane == 31) {
            s_off[EE] = ic;
            m.off[EE] = ic;
            m.active[EE] = ia;
        }
    }
    __syncthreads();
    // Choice i = t * K + j of expert e: slot off[e] + (earlier choices of e; a token takes an
    // expert at most once, so these are the earlier tokens').
    for (int i = threadIdx.x; i < nk; i += blockDim.x) {
        const int e = s_id[i];
        if (e < 0) {
            m.inv[i] = EP ? e : -1;  // -1: padding; EP: -2, another rank's expert
            continue;
        }
        int before = 0;
        for (int q = 0; q < i; q++) before += s_id[q] == e;
        const int s = s_off[e] + before;
        m.slot_tok[s] = i / K;
        m.inv[i] = s;
    }
}

// Router logits (and Qwen2-MoE's shared-expert gate logit) for the n tokens, one warp per row
// (the arithmetic of cuda_linear.cu's k_gemv, so the logits are the same bits), then the last
// block to finish (a ticket in the scratch, back to 0 after each launch) routes the tokens and
// plans the experts: counts in shared memory, offsets, the active experts in expert order,
// slot_tok and inv (within an expert the slots follow the tokens). EP: the plan of experts
// [e0, e0 + El) only, numbered from 0; another rank's choice gets inv -2.
template <bool DS, bool EP>
__global__ void __launch_bounds__(SR_WARPS * 32)
k_moe_route_small(const bf16 *__restrict__ x, int n, int dim, const bf16 *__restrict__ router, int E,
                  const bf16 *__restrict__ sg_w, const int32_t *__restrict__ pos, int K, int norm, MoeRouteDs p,
                  MoeBufs m, uint32_t *__restrict__ counts, int e0, int El, MoeNorm nz) {
    __shared__ float c_s[DS ? SR_WARPS * MOE_MAX_E : 1];  // k_route_ds's choice values, per warp
    __shared__ int s_cnt[MOE_MAX_E];
    __shared__ int s_off[MOE_MAX_E + 1];
    __shared__ int s_id[MOE_GEMV_MAX_N * MOE_MAX_K];
    __shared__ int s_last;
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nc = dim >> 3;
    const int row = blockIdx.x * SR_WARPS + warp, rows = E + (sg_w ? 1 : 0);
    const bool active = row < rows;
    const uint4 *wr = (const uint4 *)(!active ? router : row < E ? router + (size_t)row * dim : sg_w);
    const uint4 *xr = (const uint4 *)x;
    int c = lane;
    // The first weights are requested before waiting for the kernel that writes x.
    uint4 wv[SM_U];
    if (active && c + 32 * (SM_U - 1) < nc)
#pragma unroll
        for (int u = 0; u < SM_U; u++) wv[u] = ld_stream_early(wr + c + 32 * u);
    kc_pdl_wait();
    const float ss = nz.in_parts ? kc_parts_share(nz.in_parts, nz.in_n) : 0.f;
    float acc[MOE_GEMV_MAX_N];
    if (active) route_row_dots(wr, xr, n, nc, lane, wv, acc);
    // x a split norm's xg: 1 / rms as the dense GEMVs compute it (every thread of the block).
    const float scale = nz.in_parts ? kc_norm_rinv(ss, dim, nz.eps) : 1.f;
    if (active) {
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < n) {
                const float v = warp_sum(acc[b]) * scale;
                if (lane == 0) {
                    if (row < E) m.logits[(size_t)b * E + row] = v;
                    else m.SG[b] = v;
                }
            }
    }
    // The last block to get here sees every block's logits.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(m.ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (threadIdx.x == 0) *m.ticket = 0;  // for the next launch (and graph replay)
    for (int e = threadIdx.x; e < E; e += blockDim.x) s_cnt[e] = 0;
    __syncthreads();
    // The choices' ids go to shared memory only (s_id; nothing after this kernel reads them).
    if (warp < n) {
        if (DS)
            moe_route_ds_token(m.logits, pos, warp, E, K, p, c_s + (DS ? warp * MOE_MAX_E : 0), s_id, m.topk_w,
                               s_cnt, counts, lane);
        else
            moe_route_token(m.logits, pos, warp, E, K, norm, s_id, m.topk_w, s_cnt, counts, lane);
    }
    __syncthreads();
    route_plan<EP>(n, E, K, s_id, s_cnt, s_off, m, e0, El);
}

#define RC_MAX_BLOCKS 16  // k_moe_route_cluster: blocks (= its one cluster; 16 is non-portable)
#define RC_MAX_E (RC_MAX_BLOCKS * SR_WARPS)

// k_moe_route_small's work (softmax routing) with the grid as one thread-block cluster: each
// block's warps put their rows' logits straight into block 0's shared memory (DSMEM), and one
// cluster barrier replaces the fence, the ticket's atomic round trip, the second fence and the
// last block's read of the logits back from L2; block 0 then routes and plans as the last block
// does there (the same code, so the same plan). Rows (E + the shared gate's) <= RC_MAX_E.
template <bool EP>
__global__ void __launch_bounds__(SR_WARPS * 32, 2)
k_moe_route_cluster(const bf16 *__restrict__ x, int n, int dim, const bf16 *__restrict__ router, int E,
                    const bf16 *__restrict__ sg_w, const int32_t *__restrict__ pos, int K, int norm, MoeBufs m,
                    uint32_t *__restrict__ counts, int e0, int El, MoeNorm nz) {
    __shared__ float s_lg[MOE_GEMV_MAX_N * RC_MAX_E];  // block 0's: every row's logits
    __shared__ int s_cnt[RC_MAX_E];
    __shared__ int s_off[RC_MAX_E + 1];
    __shared__ int s_id[MOE_GEMV_MAX_N * MOE_MAX_K];
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nc = dim >> 3;
    const int row = blockIdx.x * SR_WARPS + warp, rows = E + (sg_w ? 1 : 0);
    const bool active = row < rows;
    const uint4 *wr = (const uint4 *)(!active ? router : row < E ? router + (size_t)row * dim : sg_w);
    uint4 wv[SM_U];
    if (active && lane + 32 * (SM_U - 1) < nc)
#pragma unroll
        for (int u = 0; u < SM_U; u++) wv[u] = ld_stream_early(wr + lane + 32 * u);
    kc_pdl_wait();
    const float ss = nz.in_parts ? kc_parts_share(nz.in_parts, nz.in_n) : 0.f;
    float acc[MOE_GEMV_MAX_N];
    if (active) route_row_dots(wr, (const uint4 *)x, n, nc, lane, wv, acc);
    const float scale = nz.in_parts ? kc_norm_rinv(ss, dim, nz.eps) : 1.f;
    cg::cluster_group cl = cg::this_cluster();
    float *lg0 = cl.map_shared_rank(s_lg, 0);
    if (active) {
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < n) {
                const float v = warp_sum(acc[b]) * scale;
                if (lane == 0) {
                    if (row < E) lg0[b * E + row] = v;
                    else m.SG[b] = v;
                }
            }
    }
    cl.sync();  // release / acquire: block 0 sees every block's logits
    if (cl.block_rank() != 0) return;
    for (int e = threadIdx.x; e < E; e += blockDim.x) s_cnt[e] = 0;
    __syncthreads();
    if (warp < n) moe_route_token<true>(s_lg, pos, warp, E, K, norm, s_id, m.topk_w, s_cnt, counts, lane);
    __syncthreads();
    route_plan<EP>(n, E, K, s_id, s_cnt, s_off, m, e0, El);
}

// A row's first round of gate and up weights, as k_moe_small_gu's loops request them: SM_U
// chunks a lane and matrix when a full round fits in the row, else the rest's (fewer).
static __device__ __forceinline__ void gu_first_round(uint4 (&gv)[SM_U], uint4 (&uv)[SM_U], const uint4 *gr,
                                                      const uint4 *ur, int c, int nc) {
    if (c + 32 * (SM_U - 1) < nc) {
#pragma unroll
        for (int q = 0; q < SM_U; q++) {
            gv[q] = ld_stream(gr + c + 32 * q);
            uv[q] = ld_stream(ur + c + 32 * q);
        }
    } else {
#pragma unroll
        for (int q = 0; q < SM_U - 1; q++)
            if (c + 32 * q < nc) {
                gv[q] = ld_stream(gr + c + 32 * q);
                uv[q] = ld_stream(ur + c + 32 * q);
            }
    }
}

// Gate/up of the routed experts and of the shared expert in one launch. blockIdx.y < ys: the
// shared expert's rows ((y * gridDim.x + x) * GEMV_WARPS + warp, all n tokens, into HS [n, SF]),
// first so that their blocks start streaming weights before the routing is done; else active
// expert y - ys, rows x * GEMV_WARPS + warp (k_moe_gemv_gu). Roundings as k_gemv_silu's.
// Batch 1: the one token's slot of active expert i is i and its row is x, so no offsets or token
// ids are read (two round trips after the weights' request at every block's start).
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_moe_small_gu(const bf16 *__restrict__ x, int n, int dim, int F, MoeW w, const bf16 *__restrict__ sgate,
               const bf16 *__restrict__ sup, int SF, int ys, const int *__restrict__ active, int E,
               const int *__restrict__ off, const int *__restrict__ slot_tok, bf16 *__restrict__ H,
               bf16 *__restrict__ HS, MoeNorm nz, int early) {
    if (!early) kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nc = dim >> 3;
    const bool sh = (int)blockIdx.y < ys;
    const int r = sh ? ((int)(blockIdx.y * gridDim.x + blockIdx.x)) * GEMV_WARPS + warp
                     : (int)blockIdx.x * GEMV_WARPS + warp;
    const uint4 *gr = NULL, *ur = NULL;
    uint4 gv[SM_U], uv[SM_U];
    int c = lane;
    // The shared expert's first weights are requested before waiting for the routing.
    bool pre = false;
    if (sh && r < SF) {
        gr = (const uint4 *)(sgate + (size_t)r * dim);
        ur = (const uint4 *)(sup + (size_t)r * dim);
        gu_first_round(gv, uv, gr, ur, c, nc);
        pre = true;
    }
    kc_pdl_wait();
    // early: the down kernel launches only once every block got here (the routing done), so that
    // it may read the plan before its own wait.
    if (early) kc_pdl_trigger();
    int s0 = 0, ne = 0;
    bool live;
    if (sh) {
        live = r < SF;
        ne = n;
    } else {
        // The count and this block's expert in one round trip (i < max_active <= E: in bounds),
        // then the expert's first weights before its offsets and tokens (each one more trip).
        const int i = (int)blockIdx.y - ys, cnt = ld_plan(active + E), e = ld_plan(active + i);
        live = i < cnt && r < F;
        if (live) {
            gr = (const uint4 *)(w.gate + (size_t)e * w.sgate + (size_t)r * dim);
            ur = (const uint4 *)(w.up + (size_t)e * w.sup + (size_t)r * dim);
            gu_first_round(gv, uv, gr, ur, c, nc);
            pre = true;
            if (n == 1) {
                s0 = i;
                ne = 1;
            } else {
                s0 = off[e];
                ne = min(off[e + 1] - s0, MOE_GEMV_MAX_N);
            }
        }
    }
    // x a split norm's xg: 1 / rms as the dense GEMVs compute it (every thread of the block, so
    // before the warps without a row leave; its parts requested after the weights).
    const float ss = nz.in_parts ? kc_parts_share(nz.in_parts, nz.in_n) : 0.f;
    const float scale = nz.in_parts ? kc_norm_rinv(ss, dim, nz.eps) : 1.f;
    if (!live) return;
    const uint4 *xr[MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) {
        const int bb = b < ne ? b : 0;
        xr[b] = (const uint4 *)(x + (size_t)(sh || n == 1 ? bb : slot_tok[s0 + bb]) * dim);
    }
    float ag[MOE_GEMV_MAX_N], au[MOE_GEMV_MAX_N];
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++) ag[b] = au[b] = 0.f;
    for (bool first = true; c + 32 * (SM_U - 1) < nc; c += 32 * SM_U, first = false) {
        if (!(first && pre))
#pragma unroll
            for (int q = 0; q < SM_U; q++) {
                gv[q] = ld_stream(gr + c + 32 * q);
                uv[q] = ld_stream(ur + c + 32 * q);
            }
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < ne) {
#pragma unroll
                for (int q = 0; q < SM_U; q++) {
                    const uint4 x0 = __ldg(xr[b] + c + 32 * q);
                    ag[b] = dot8(gv[q], x0, ag[b]);
                    au[b] = dot8(uv[q], x0, au[b]);
                }
            }
    }
    if (c < nc) {  // the rest (fewer than SM_U chunks of this lane), requested together
        if (!(pre && c == lane))  // else requested above (a row shorter than a round)
#pragma unroll
            for (int q = 0; q < SM_U - 1; q++)
                if (c + 32 * q < nc) {
                    gv[q] = ld_stream(gr + c + 32 * q);
                    uv[q] = ld_stream(ur + c + 32 * q);
                }
#pragma unroll
        for (int b = 0; b < MOE_GEMV_MAX_N; b++)
            if (b < ne) {
#pragma unroll
                for (int q = 0; q < SM_U - 1; q++)
                    if (c + 32 * q < nc) {
                        const uint4 x0 = __ldg(xr[b] + c + 32 * q);
                        ag[b] = dot8(gv[q], x0, ag[b]);
                        au[b] = dot8(uv[q], x0, au[b]);
                    }
            }
    }
#pragma unroll
    for (int b = 0; b < MOE_GEMV_MAX_N; b++)
        if (b < ne) {
            const float g = bfr(warp_sum(ag[b]) * scale), u = bfr(warp_sum(au[b]) * scale);
            if (lane == 0) {
                const bf16 h = __float2bfloat16(bfr(g / (1.f + expf(-g))) * u);
                if (sh) HS[(size_t)b * SF + r] = h;
                else H[(size_t)(s0 + b) * F + r] = h;
            }
        }
}

// A task's first round of weights, as the loops below request them: SM_U chunks a lane when a
// full round fits in the row, else the rest's (fewer than SM_U).
static __device__ __forceinline__ void dn_first_round(uint4 (&dv)[SM_U], const uint4 *wr, int c, int ncs) {
    if (c + 32 * (SM_U - 1) < ncs) {
#pragma unroll
        for (int q = 0; q < SM_U; q++) dv[q] = ld_stream(wr + c + 32 * q);
    } else {
#pragma unroll
        for (int q = 0; q < SM_U - 1; q++)
            if (c + 32 * q < ncs) dv[q] = ld_stream(wr + c + 32 * q);
    }
}

// Down projections fused with the combine. Block: output rows blockIdx.x * DN_ROWS + (warp /
// DN_WPR); the DN_WPR warps of a row share its dot products (tasks: the shared expert's row
// when sdown is given, then each active expert's), each dot by one warp as k_moe_gemv_down /
// k_gemv compute it, rounded to bf16 into shared memory; then one warp adds them per token in
// k_combine's order: sg_t * shared (sg: sigmoid(bf16(SG[t])), 1 without SG), then the choices
// j = 0..K-1, bf16(w) * Y, one rounding. ys: the shared expert's output when another kernel
// computed it ([n, dim]; NULL: from sdown, or none when both are NULL). Padding: zeros.
// RES (nz.res, batch 1): out is the residual stream, and the next norm is prepared (MoeNorm).
// Each warp requests its first task's first round of weights before waiting for gate/up: the
// shared expert's always, a routed expert's when early (the gate/up kernel let this one launch
// only after the routing finished, so the plan is final; read through L2). That rests on the
// launch chain alone: a kernel between gate/up and this one (the shared expert's linear ops)
// itself launched after gate/up's trigger, so this one can only launch later still.
template <int MINB, bool RES>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
k_moe_small_down(const bf16 *__restrict__ H, int n, int dim, int F, MoeW w, const bf16 *__restrict__ sdown, int SF,
                 const bf16 *__restrict__ HS, const bf16 *__restrict__ YS, const float *__restrict__ SG, int K,
                 const int *__restrict__ active, int E, const int *__restrict__ off, const int *__restrict__ inv,
                 const float *__restrict__ topk_w, bf16 *__restrict__ out, MoeNorm nz, int early) {
    __shared__ float s_y[DN_ROWS][MOE_GEMV_MAX_N * MOE_MAX_K];  // routed outputs by slot
    __shared__ float s_ys[DN_ROWS][MOE_GEMV_MAX_N];             // the shared expert's, by token
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, lr = warp / DN_WPR, sub = warp % DN_WPR;
    const int r = (int)blockIdx.x * DN_ROWS + lr;
    const bool has_sd = sdown != NULL;
    uint4 dv[SM_U];
    bool pre = false;
    if (r < dim) {
        if (has_sd && sub == 0) {
            dn_first_round(dv, (const uint4 *)(sdown + (size_t)r * SF), lane, SF >> 3);
            pre = true;
        } else if (early) {
            const int i = sub - (has_sd ? 1 : 0);
            if (i < __ldcg(active + E)) {
                const int e = __ldcg(active + i);
                dn_first_round(dv, (const uint4 *)(w.down + (size_t)e * w.sdown + (size_t)r * F), lane, F >> 3);
                pre = true;
            }
        }
    }
    kc_pdl_wait();
    if (r < dim) {
        // The count and the first task's expert in one round trip (clamped into active[0..E]),
        // then, where not requested before the wait, its first weights before its offsets.
        const int hs = has_sd ? 1 : 0, cnt = ld_plan(active + E), e0 = ld_plan(active + min(max(sub - hs, 0), E));
        const int nt = cnt + hs;
        if (!pre && sub < nt && sub >= hs) {
            dn_first_round(dv, (const uint4 *)(w.down + (size_t)e0 * w.sdown + (size_t)r * F), lane, F >> 3);
            pre = true;
        }
        for (int task = sub; task < nt; task += DN_WPR) {
            const bool shared = has_sd && task == 0;
            const uint4 *wr, *hr;
            int ncs, ne, s0 = 0;
            if (shared) {
                wr = (const uint4 *)(sdown + (size_t)r * SF);
                hr = (const uint4 *)HS;
                ncs = SF >> 3;
                ne = n;
            } else {
                const int e = active[task - (has_sd ? 1 : 0)];
                s0 = off[e];
                ne = min(off[e + 1] - s0, MOE_GEMV_MAX_N);
                wr = (const uint4 *)(w.down + (size_t)e * w.sdown + (size_t)r * F);
                hr = (const uint4 *)(H + (size_t)s0 * F);
                ncs = F >> 3;
            }
            float acc[MOE_GEMV_MAX_N];
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++) acc[b] = 0.f;
            int c = lane;
            for (bool first = true; c + 32 * (SM_U - 1) < ncs; c += 32 * SM_U, first = false) {
                if (!(first && pre))
#pragma unroll
                    for (int q = 0; q < SM_U; q++) dv[q] = ld_stream(wr + c + 32 * q);
#pragma unroll
                for (int b = 0; b < MOE_GEMV_MAX_N; b++)
                    if (b < ne) {
#pragma unroll
                        for (int q = 0; q < SM_U; q++)
                            acc[b] = dot8(dv[q], __ldg(hr + (size_t)b * ncs + c + 32 * q), acc[b]);
                    }
            }
            if (c < ncs) {  // the rest (fewer than SM_U chunks of this lane), requested together
                if (!(pre && c == lane))  // else requested before the wait (a row shorter than a round)
#pragma unroll
                    for (int q = 0; q < SM_U - 1; q++)
                        if (c + 32 * q < ncs) dv[q] = ld_stream(wr + c + 32 * q);
#pragma unroll
                for (int b = 0; b < MOE_GEMV_MAX_N; b++)
                    if (b < ne) {
#pragma unroll
                        for (int q = 0; q < SM_U - 1; q++)
                            if (c + 32 * q < ncs) acc[b] = dot8(dv[q], __ldg(hr + (size_t)b * ncs + c + 32 * q), acc[b]);
                    }
            }
            pre = false;
#pragma unroll
            for (int b = 0; b < MOE_GEMV_MAX_N; b++)
                if (b < ne) {
                    const float v = bfr(warp_sum(acc[b]));
                    if (lane == 0) {
                        if (shared) s_ys[lr][b] = v;
                        else s_y[lr][s0 + b] = v;
                    }
                }
        }
    }
    __syncthreads();
    const bool writer = r < dim && sub == 0 && lane < n;
    float acc = 0.f;  // the block's output for (token lane, row r); padding: 0
    if (writer) {
        const int t = lane;
        const int *iv = inv + (size_t)t * K;
        const float *wt = topk_w + (size_t)t * K;
        if (iv[0] != -1) {  // not padding (-2: another rank's expert, skipped below)
            if (has_sd || YS) {
                const float sg = SG ? 1.f / (1.f + expf(-bfr(SG[t]))) : 1.f;
                acc = sg * (has_sd ? s_ys[lr][t] : __bfloat162float(YS[(size_t)t * dim + r]));
            }
            for (int j = 0; j < K; j++) {
                const int s = iv[j];
                if (s < 0) continue;
                acc = fmaf(bfr(wt[j]), s_y[lr][s], acc);  // HF: weights cast to bf16
            }
        }
    }
    if (!RES) {
        if (writer) out[(size_t)lane * dim + r] = __float2bfloat16(acc);
        return;
    }
    // The residual add (the block's output rounded first, then the sum: rmsnorm's add), then
    // the next norm's xg and this block's sum of squares (batch 1: lane 0 of a row's first warp).
    float v = 0.f;
    if (writer) {
        bf16 *y = out + (size_t)lane * dim + r;
        const bf16 sum = __float2bfloat16(__bfloat162float(*y) + bfr(acc));
        *y = sum;
        v = __bfloat162float(sum);
        if (nz.norm) nz.xg[r] = __float2bfloat16(v * nz.norm[r]);
    }
    if (!nz.norm) return;
    v = kc_norm_block_sum(v * v);
    if (threadIdx.x == 0) nz.parts[blockIdx.x] = v;
}

// Batch 1 (n == 1), ffn = 256 * CPL (1, 2, 3, 4, 6, 8): k_moe_small_down's work with one warp
// per output row, which requests the row's chunks of several tasks at once (TPR tasks x CPL
// chunks a lane, <= 24 loads in flight): Qwen3-30B-A3B's 8 experts x 768 in one round trip and one wave of blocks,
// where k_moe_small_down's warps take two tasks one after the other in two waves (ncu: 1.1 of
// 3.35 TB/s). Tasks: the shared expert's row when sdown is given (SF == F), then the active
// experts in plan order (slot i of the one token is active expert i). The first round's weights
// are requested before the wait: the shared expert's always (no earlier kernel writes them), the
// routed experts' when early (KAON_MOE_DOWN_EARLY: gate/up let this kernel launch only after the
// routing finished, so the plan is final; read through L2), which lets the whole round stream
// under gate/up's tail. Each task's dot product, its bf16 rounding and the combine in choice
// order are k_moe_small_down's, so the output is the same bits. RES as there, with GEMV_WARPS
// rows per block (kc_moe_norm_residual's parts).
template <int CPL, bool RES>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 2)
k_moe_small_down_b1(const bf16 *__restrict__ H, int dim, int F, MoeW w, const bf16 *__restrict__ sdown,
                    const bf16 *__restrict__ HS, const bf16 *__restrict__ YS, const float *__restrict__ SG, int K,
                    const int *__restrict__ active, int E, const int *__restrict__ inv,
                    const float *__restrict__ topk_w, bf16 *__restrict__ out, MoeNorm nz, int early) {
    constexpr int TPR = 24 / CPL > MOE_MAX_K ? MOE_MAX_K : 24 / CPL;  // tasks a round
    __shared__ float s_y[GEMV_WARPS][MOE_MAX_K + 1];                   // task outputs, by task
    kc_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = (int)blockIdx.x * GEMV_WARPS + warp;
    const int hs = sdown ? 1 : 0;
    uint4 wv[TPR][CPL];
    int cnt = 0, a = 0;
    bool pre = false;  // the first round requested (plan read) before the wait
    if (early && r < dim) {
        cnt = __ldcg(active + E);
        a = __ldcg(active + min(lane, E));
        pre = true;
    }
    // The weights of round t0's tasks t < nt. Before the wait: the first round (the shared row
    // always, the routed ones when the plan is final); after it the rest, so a first round after
    // the wait skips the shared row.
    auto request = [&](int t0, int nt, bool before) {
#pragma unroll
        for (int i = 0; i < TPR; i++) {
            const int t = t0 + i;
            const int e = __shfl_sync(0xffffffffu, a, (t - hs) & 31);
            if (t < nt && (before || !(t == 0 && hs))) {
                const uint4 *wr = hs && t == 0 ? (const uint4 *)(sdown + (size_t)r * F)
                                               : (const uint4 *)(w.down + (size_t)e * w.sdown + (size_t)r * F);
#pragma unroll
                for (int q = 0; q < CPL; q++)
                    wv[i][q] = before ? ld_stream_early(wr + lane + 32 * q) : ld_stream(wr + lane + 32 * q);
            }
        }
    };
    if (r < dim) {
        if (pre) request(0, cnt + hs, true);
        else if (hs) request(0, 1, true);  // the shared expert's row alone
    }
    kc_pdl_wait();
    float acc = 0.f;  // the row's output (lane 0)
    if (r < dim) {
        // The count, lane i's active expert and choice i's slot and weight in one round trip.
        if (!pre) {
            cnt = ld_plan(active + E);
            a = ld_plan(active + min(lane, E));
        }
        const int iv = lane < K ? __ldcg(inv + lane) : -1;
        const float wt = lane < K ? __ldcg(topk_w + lane) : 0.f;
        const int nt = cnt + hs;
        for (int t0 = 0; t0 < nt; t0 += TPR) {
            if (t0 > 0 || !pre) request(t0, nt, false);
#pragma unroll
            for (int i = 0; i < TPR; i++) {
                const int t = t0 + i;
                if (t < nt) {
                    const uint4 *hr = hs && t == 0 ? (const uint4 *)HS : (const uint4 *)(H + (size_t)(t - hs) * F);
                    float s = 0.f;
#pragma unroll
                    for (int q = 0; q < CPL; q++) s = dot8(wv[i][q], __ldg(hr + lane + 32 * q), s);
                    s = bfr(warp_sum(s));
                    if (lane == 0) s_y[warp][t] = s;
                }
            }
        }
        __syncwarp();
        // k_moe_small_down's combine: the shared part, then choices j = 0..K-1 in order.
        const int iv0 = __shfl_sync(0xffffffffu, iv, 0);
        if (lane == 0 && iv0 != -1) {
            if (hs || YS) {
                const float sg = SG ? 1.f / (1.f + expf(-bfr(SG[0]))) : 1.f;
                acc = sg * (hs ? s_y[warp][0] : __bfloat162float(YS[r]));
            }
        }
        for (int j = 0; j < K; j++) {
            const int s = __shfl_sync(0xffffffffu, iv, j);
            const float wj = __shfl_sync(0xffffffffu, wt, j);
            if (lane == 0 && iv0 != -1 && s >= 0) acc = fmaf(bfr(wj), s_y[warp][s + hs], acc);
        }
    }
    const bool writer = r < dim && lane == 0;
    if (!RES) {
        if (writer) out[r] = __float2bfloat16(acc);
        return;
    }
    float v = 0.f;
    if (writer) {
        const bf16 sum = __float2bfloat16(__bfloat162float(out[r]) + bfr(acc));
        out[r] = sum;
        v = __bfloat162float(sum);
        if (nz.norm) nz.xg[r] = __float2bfloat16(v * nz.norm[r]);
    }
    if (!nz.norm) return;
    v = kc_norm_block_sum(v * v);
    if (threadIdx.x == 0) nz.parts[blockIdx.x] = v;
}

// k_moe_small_down_b1's chunks a lane and task (ffn / 256) where it takes the step (0: not):
// batch 1, widths it is built for, a fused shared expert only as wide as a routed one.
// KAON_MOE_B1_DOWN=1 switches it on (not yet the default).
static int b1_down_cpl(int n, int F, int SF, bool fuse_shared) {
    static const bool on = kc_env_on("KAON_MOE_B1_DOWN");
    if (!on || n != 1 || F % 256 || (fuse_shared && SF != F)) return 0;
    const int cpl = F / 256;
    return (cpl >= 1 && cpl <= 4) || cpl == 6 || cpl == 8 ? cpl : 0;
}

// Output rows per block of the small path's down kernel (the split norm's parts are per block).
static int small_down_rows(int n, int F, int SF, bool fuse_shared) {
    return b1_down_cpl(n, F, SF, fuse_shared) ? GEMV_WARPS : DN_ROWS;
}

typedef void (*DownB1)(const bf16 *, int, int, MoeW, const bf16 *, const bf16 *, const bf16 *, const float *, int,
                       const int *, int, const int *, const float *, bf16 *, MoeNorm, int);

// k_moe_small_down_b1 for cpl (b1_down_cpl's answer) on the small path's buffers.
static cudaError_t launch_down_b1(kc_backend *b, int cpl, int dim, int F, const MoeW &mw, const bf16 *sdown,
                                  const bf16 *YS, const float *SG, int K, const MoeBufs &m, int E, bf16 *out,
                                  const MoeNorm &nz, int early) {
    static const DownB1 kern[2][6] = {
        {k_moe_small_down_b1<1, false>, k_moe_small_down_b1<2, false>, k_moe_small_down_b1<3, false>,
         k_moe_small_down_b1<4, false>, k_moe_small_down_b1<6, false>, k_moe_small_down_b1<8, false>},
        {k_moe_small_down_b1<1, true>, k_moe_small_down_b1<2, true>, k_moe_small_down_b1<3, true>,
         k_moe_small_down_b1<4, true>, k_moe_small_down_b1<6, true>, k_moe_small_down_b1<8, true>}};
    const int i = cpl <= 4 ? cpl - 1 : cpl == 6 ? 4 : 5;
    const dim3 grid((unsigned)((dim + GEMV_WARPS - 1) / GEMV_WARPS)), blk(GEMV_WARPS * 32);
    return kc_launch(b, kern[nz.res ? 1 : 0][i], grid, blk, 0, m.H, dim, F, mw, sdown, m.HS, YS, SG, K, m.active, E,
                     m.inv, m.topk_w, out, nz, early);
}

// ---- 5b. prefill: grouped GEMM on tensor cores ------------------------------------------------------

// C tile [TM, BN] of rows (slots [s_begin, s_end)) of A times B^T, B = W [N, Kd] rows n0...
// A row i is a_row(slot) (gathered x rows, or H rows in slot order). GU: two B matrices (gate,
// up) and the SiLU-and-mul epilogue; else one (down). TM (64, 32 or 16 rows) follows the tokens
// per expert: with a few per expert (a decode step of 64 sequences over 64 experts: ~6) a 64-row
// tile is mostly padding, and its MMAs, not the weights' bytes, set the time (ncu on V2-Lite's
// 64-token step: 243 TFLOP/s of which ~90% on padding, 2.3 TB/s).
// KB: the K tile (32, or 64 for 128 contiguous bytes per weight row and stage); NS: pipeline
// stages (NS - 1 tiles in flight while one is multiplied), in dynamic shared memory.
template <bool GU, int TM, int KB, int NS>
__global__ void __launch_bounds__(128)
k_moe_gemm(const bf16 *__restrict__ A, int Kd, int N, MoeW w, const int2 *__restrict__ tiles,
           const int *__restrict__ n_tiles, const int *__restrict__ off, const int *__restrict__ slot_tok,
           bf16 *__restrict__ C) {
    if ((int)blockIdx.y >= *n_tiles) return;
    const int2 tile = tiles[blockIdx.y];
    const int e = tile.x, s_begin = off[e] + tile.y, s_end = min(off[e + 1], s_begin + TM);
    const int n0 = blockIdx.x * BN;
    const bf16 *B0 = GU ? w.gate + (size_t)e * w.sgate : w.down + (size_t)e * w.sdown;
    const bf16 *B1 = GU ? w.up + (size_t)e * w.sup : nullptr;

    constexpr int NB = GU ? 2 : 1;
    constexpr int MW = TM >= 32 ? 2 : 1, NW = 4 / MW;            // warps along M and N
    constexpr int FI = TM / MW / 16, FJ = BN / NW / 16;            // 16x16 fragments per warp
    constexpr int AH = (TM + 31) / 32;                             // A chunks per thread and stage
    constexpr int KL = KB + 8;                                     // shared-memory row stride (bf16)
    extern __shared__ __align__(128) bf16 smem[];  // NS x (A tile, B tiles): moe_gemm_smem()
    bf16(*sA)[TM * KL] = (bf16(*)[TM * KL])smem;
    bf16(*sB)[NB][BN * KL] = (bf16(*)[NB][BN * KL])(smem + NS * TM * KL);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = (warp / NW) * (TM / MW), wn = (warp % NW) * (BN / NW);  // this warp's part of the tile

    // Per thread and stage: A rows lr + 32 h (< TM), B rows lr and lr + 32; 8 columns each at
    // lc + 32 u.
    const int lr = tid >> 2, lc = (tid & 3) * 8;
    const bf16 *arow[AH];
    bool aval[AH];
#pragma unroll
    for (int h = 0; h < AH; h++) {
        const int s = s_begin + lr + 32 * h;
        aval[h] = lr + 32 * h < TM && s < s_end;
        const int row = aval[h] ? (GU ? slot_tok[s] : s) : 0;
        arow[h] = A + (size_t)row * Kd;
    }
    auto load = [&](int stage, int k0) {
#pragma unroll
        for (int u = 0; u < KB / 32; u++) {
            const int c = lc + 32 * u, k = k0 + c;
            const bool kin = k < Kd;
#pragma unroll
            for (int h = 0; h < AH; h++)
                if (lr + 32 * h < TM) cp16(&sA[stage][(lr + 32 * h) * KL + c], arow[h] + (kin ? k : 0), aval[h] && kin);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = lr + 32 * h, nrow = n0 + r;
                const bool bin = kin && nrow < N;
                cp16(&sB[stage][0][r * KL + c], B0 + (size_t)(bin ? nrow : 0) * Kd + (kin ? k : 0), bin);
                if (GU) cp16(&sB[stage][NB - 1][r * KL + c], B1 + (size_t)(bin ? nrow : 0) * Kd + (kin ? k : 0), bin);
            }
        }
        cp_commit();
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][FI][FJ];
#pragma unroll
    for (int q = 0; q < NB; q++)
#pragma unroll
        for (int i = 0; i < FI; i++)
#pragma unroll
            for (int j = 0; j < FJ; j++) wmma::fill_fragment(acc[q][i][j], 0.f);

    const int nk = (Kd + KB - 1) / KB;
    // Prologue: tiles 0 .. NS - 2 in flight (an empty group where K ends, so that the count of
    // groups, and wait_group's meaning, stays the same on every path).
#pragma unroll
    for (int st = 0; st < NS - 1; st++) {
        if (st < nk) load(st, st * KB);
        else cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        const int cur = kt % NS;
        cp_wait<NS - 2>();  // tile kt has landed
        __syncthreads();    // ... for every thread; and stage (kt - 1) % NS is free again
        const int nxt = kt + NS - 1;
        if (nxt < nk) load(nxt % NS, nxt * KB);
        else cp_commit();
#pragma unroll
        for (int kk = 0; kk < KB; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[FI];
#pragma unroll
            for (int i = 0; i < FI; i++) wmma::load_matrix_sync(fa[i], &sA[cur][(wm + 16 * i) * KL + kk], KL);
#pragma unroll
            for (int q = 0; q < NB; q++) {
#pragma unroll
                for (int j = 0; j < FJ; j++) {
                    // B^T: element (k, n) = W[n][k]: column-major with stride KL.
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
                    wmma::load_matrix_sync(fb, &sB[cur][q][(wn + 16 * j) * KL + kk], KL);
#pragma unroll
                    for (int i = 0; i < FI; i++) wmma::mma_sync(acc[q][i][j], fa[i], fb, acc[q][i][j]);
                }
            }
        }
    }
    cp_wait<0>();
    __syncthreads();  // the epilogue reuses the stages' memory

    // Epilogue: each warp stages its 16x16 fragments in shared memory (free now: 4 warps x NB x
    // 256 floats fit in the smallest tile's buffers), applies SiLU-and-mul (GU), rounds to bf16 and
    // stores 8 columns per lane.
    static_assert(NS * (TM + NB * BN) * KL * sizeof(bf16) >= 4 * NB * 256 * sizeof(float), "epilogue staging");
    float *stage = (float *)smem + warp * (NB * 256);
#pragma unroll
    for (int i = 0; i < FI; i++)
#pragma unroll
        for (int j = 0; j < FJ; j++) {
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

// Both GEMMs of the general path with tiles of TM rows.
// The 16- and 32-row tiles (decode steps of tens to hundreds of tokens: bandwidth-bound) take
// 64-wide K tiles: 128 contiguous bytes per weight row and stage instead of 64. H200, V2-Lite
// decode steps: 64 tokens 18.9 -> 16.2-16.7 ms, 256 tokens 19.9-21.4 -> 18.9-19.3 ms; Qwen3-30B-A3B
// 64 tokens 34.7 -> 31.4 ms (PERF.md, session 36). KAON_MOE_BK=32: the old tiles (A/B).
// Shared memory of one k_moe_gemm block: NS stages of the A tile and the B tile(s).
static constexpr size_t moe_gemm_smem(bool gu, int tm, int kb, int ns) {
    return (size_t)ns * (tm + (gu ? 2 : 1) * BN) * (kb + 8) * sizeof(bf16);
}

// One instance's launch. Above 48 KB of shared memory the kernel must opt in, and the opt-in
// holds for the current device only: once per device (a bit each), so every GPU of the process
// has it and later launches pay nothing.
template <bool GU, int TM, int KB, int NS>
static void launch_moe_gemm(kc_backend *b, dim3 grid, const bf16 *A, int Kd, int N, const MoeW &mw, const MoeBufs &m,
                            bf16 *C) {
    constexpr size_t smem = moe_gemm_smem(GU, TM, KB, NS);
    static unsigned opted;  // devices (bit b->device % 32) that have the opt-in
    const unsigned bit = 1u << (b->device & 31);
    if (smem > 48 * 1024 && !(__atomic_load_n(&opted, __ATOMIC_RELAXED) & bit)) {
        if (kc_check(b, cudaFuncSetAttribute(k_moe_gemm<GU, TM, KB, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                     "moe gemm: shared memory"))
            return;
        __atomic_fetch_or(&opted, bit, __ATOMIC_RELAXED);
    }
    k_moe_gemm<GU, TM, KB, NS><<<grid, 128, smem, b->stream>>>(A, Kd, N, mw, m.tiles, m.n_tiles, m.off, m.slot_tok, C);
}

template <int TM, int KB, int NS>
static void moe_gemms_kb(kc_backend *b, const bf16 *x, int dim, int F, const MoeW &mw, int max_tiles,
                         const MoeBufs &m) {
    launch_moe_gemm<true, TM, KB, NS>(b, dim3((F + BN - 1) / BN, max_tiles), x, dim, F, mw, m, m.H);
    launch_moe_gemm<false, TM, KB, NS>(b, dim3((dim + BN - 1) / BN, max_tiles), m.H, F, dim, mw, m, m.Y);
}

// The 16/32-row tiles with 64-wide K tiles run 4 cp.async stages: H200, decode steps 1-3%
// faster than 2 stages (V2-Lite shape 64 tokens 14.46 -> 14.28 ms, Qwen3-30B-A3B 64 tokens
// 29.89 -> 29.03 ms, 256 tokens 44.05 -> 42.92 ms; PERF.md, session 37). KAON_MOE_STAGES=2|3 A/B.
template <int TM>
static void moe_gemms(kc_backend *b, const bf16 *x, int dim, int F, const MoeW &mw, int max_tiles, const MoeBufs &m) {
    static const char *bk = getenv("KAON_MOE_BK");
    static const char *st = getenv("KAON_MOE_STAGES");
    constexpr int T = TM <= 32 ? TM : 32;
    if (TM <= 32 && !(bk && !strcmp(bk, "32"))) {
        if (st && !strcmp(st, "2")) moe_gemms_kb<T, 64, 2>(b, x, dim, F, mw, max_tiles, m);
        else if (st && !strcmp(st, "3")) moe_gemms_kb<T, 64, 3>(b, x, dim, F, mw, max_tiles, m);
        else moe_gemms_kb<T, 64, 4>(b, x, dim, F, mw, max_tiles, m);
    } else {
        moe_gemms_kb<TM, BK, 2>(b, x, dim, F, mw, max_tiles, m);
    }
}

// ---- 7. combine ----------------------------------------------------------------------------------

// One block per token: out[t] = sum_j w_j Y[inv_j] (+ sigmoid(SG[t]) * YS[t]); padding (inv -1):
// zeros; choices without a slot (inv -2: another rank's expert) add nothing.
__global__ void k_combine(const bf16 *__restrict__ Y, const int *__restrict__ inv, const float *__restrict__ topk_w,
                          int K, int dim, const bf16 *__restrict__ YS, const float *__restrict__ SG,
                          bf16 *__restrict__ out) {
    const int t = blockIdx.x;
    __shared__ int s_slot[MOE_MAX_K];
    __shared__ float s_w[MOE_MAX_K];
    if (threadIdx.x < K) {
        s_slot[threadIdx.x] = inv[(size_t)t * K + threadIdx.x];
        s_w[threadIdx.x] = bfr(topk_w[(size_t)t * K + threadIdx.x]);  // HF: weights cast to bf16
    }
    __syncthreads();
    const bool pad = s_slot[0] == -1;
    const float sg = (YS && !pad) ? (SG ? 1.f / (1.f + expf(-bfr(SG[t]))) : 1.f) : 0.f;
    for (int c = threadIdx.x * 8; c < dim; c += blockDim.x * 8) {
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
        if (YS && !pad) {
            const uint4 v = *(const uint4 *)(YS + (size_t)t * dim + c);
            const bf16 *h = (const bf16 *)&v;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] = sg * __bfloat162float(h[i]);
        }
        for (int j = 0; j < K; j++) {
            const int s = s_slot[j];
            if (s < 0) continue;
            const uint4 v = *(const uint4 *)(Y + (size_t)s * dim + c);
            const bf16 *h = (const bf16 *)&v;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] = fmaf(s_w[j], __bfloat162float(h[i]), acc[i]);
        }
        __align__(16) bf16 o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = __float2bfloat16(acc[i]);
        *(uint4 *)(out + (size_t)t * dim + c) = *(const uint4 *)o;
    }
}

// ---- host side -------------------------------------------------------------------------------------

// Expert 0 of a kind and the stride to expert e (elements); -1 unless uniformly strided bf16
// matrices of rows x cols. l: the E experts this call reads (expert parallel: from e0, which
// names them in the errors).
static int stacked(kc_backend *b, const kaon_linear *l, int E, int e0, int64_t rows, int64_t cols,
                   const bf16 **base, long long *stride, const char *what) {
    for (int e = 0; e < E; e++) {
        const kaon_tensor *v = &l[e].w;
        if (!v->data || v->dtype != KAON_BF16 || v->ndim != 2 || v->shape[0] != rows || v->shape[1] != cols)
            return kc_fail(b, "cuda moe: expert %d's %s is %s [%lld, %lld], expected bf16 [%lld, %lld] "
                           "(the GPU moe op reads bf16 experts: upload them with upload_dense)", e0 + e, what,
                           kaon_dtype_name(v->dtype), (long long)v->shape[0], (long long)v->shape[1],
                           (long long)rows, (long long)cols);
        const char *extra = kaon_linear_bias(&l[e]) ? "a bias" : kaon_linear_unsupported(&l[e]);
        if (extra)
            return kc_fail(b, "cuda moe: expert %d's %s: weight format %s with %s is not supported", e0 + e, what,
                           kaon_dtype_name(v->dtype), extra);
    }
    const bf16 *p0 = (const bf16 *)l[0].w.data;
    const long long st = E > 1 ? (long long)((const bf16 *)l[1].w.data - p0) : 0;
    for (int e = 1; e < E; e++)
        if ((const bf16 *)l[e].w.data - p0 != st * e)
            return kc_fail(b, "cuda moe: the experts' %s matrices are not stacked at one stride", what);
    if (((uintptr_t)p0 & 15) || (st * 2) % 16) return kc_fail(b, "cuda moe: misaligned expert weights");
    *base = p0;
    *stride = st;
    return 0;
}

// FP8 experts (model/moe.c uploads each kind as one cuda_fp8.cu layer): expert 0's codes and
// scales and the strides to expert e, checked.
static int stacked_fp8(kc_backend *b, const kaon_linear *l, int E, int64_t rows, int64_t cols, const uint8_t **base,
                       long long *stride, const float **sbase, long long *sstride, int *block, int *scols,
                       const char *what) {
    const bool blk = l[0].scale_block[0] == 128 && l[0].scale_block[1] == 128;
    const int64_t er = blk ? (rows + 127) / 128 : rows, ec = blk ? (cols + 127) / 128 : 1;
    for (int e = 0; e < E; e++) {
        const kaon_linear *v = &l[e];
        const bool same = blk ? (v->scale_block[0] == 128 && v->scale_block[1] == 128)
                              : (v->scale_block[0] == 1 && v->scale_block[1] == cols);
        if (!v->w.data || v->w.dtype != KAON_FP8_E4M3 || v->w.ndim != 2 || v->w.shape[0] != rows ||
            v->w.shape[1] != cols || !v->scale.data || !same || v->scale.shape[0] != er || v->scale.shape[1] != ec ||
            kaon_linear_bias(v))
            return kc_fail(b, "cuda moe: expert %d's %s is not an FP8 [%lld, %lld] layer as the CUDA upload makes it", e,
                           what, (long long)rows, (long long)cols);
    }
    const uint8_t *p0 = (const uint8_t *)l[0].w.data;
    const float *s0 = (const float *)l[0].scale.data;
    const long long st = E > 1 ? (long long)((const uint8_t *)l[1].w.data - p0) : 0;
    const long long ss = E > 1 ? (long long)((const float *)l[1].scale.data - s0) : 0;
    for (int e = 1; e < E; e++)
        if ((const uint8_t *)l[e].w.data - p0 != st * e || (const float *)l[e].scale.data - s0 != ss * e)
            return kc_fail(b, "cuda moe: the experts' FP8 %s matrices are not stacked at one stride", what);
    if (((uintptr_t)p0 & 15) || st % 16 || cols % 16) return kc_fail(b, "cuda moe: misaligned FP8 expert weights");
    *base = p0;
    *stride = st;
    *sbase = s0;
    *sstride = ss;
    *block = blk ? 1 : 0;
    *scols = (int)ec;
    return 0;
}

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

// Carves the scratch of one call out of b->moe_buf (grown through the backend's alloc, outside
// graph recording; destroy frees it with every other allocation).
static int moe_bufs(kc_backend *b, int n, int E, int K, int F, int dim, int SF, int max_tiles, MoeBufs *m) {
    const size_t nk = (size_t)n * K;
    const size_t sizes[] = {
        4,  // the ticket: first, so that it stays at one place whatever the call's sizes
        (size_t)n * E * 4, nk * 4, nk * 4, (size_t)E * 4, (size_t)(E + 1) * 4, (size_t)E * 4,
        (size_t)(E + 1) * 4, (size_t)max_tiles * 8, 4, nk * 4, nk * 4, nk * F * 2, nk * dim * 2,
        (size_t)n * SF * 2, SF ? (size_t)n * dim * 2 : 0, (size_t)n * 4,
    };
    const int count = (int)(sizeof sizes / sizeof sizes[0]);
    size_t total = 0;
    for (int i = 0; i < count; i++) total += al256(sizes[i]);
    if (total > b->moe_cap) {
        if (b->capturing) return kc_fail(b, "cuda moe: scratch must grow while recording a graph");
        if (b->moe_buf) b->base.ops->free(&b->base, b->moe_buf);
        b->moe_buf = NULL;
        b->moe_cap = 0;
        const size_t cap = total + total / 4;
        b->moe_buf = b->base.ops->alloc(&b->base, cap);
        if (!b->moe_buf) return kc_fail(b, "cuda moe: out of device memory for %zu bytes of scratch", cap);
        b->moe_cap = cap;
        if (kc_check(b, cudaMemsetAsync(b->moe_buf, 0, sizeof(unsigned), b->stream), "moe scratch")) return -1;
    }
    char *p = (char *)b->moe_buf;
    void **dst[] = {(void **)&m->ticket, (void **)&m->logits, (void **)&m->topk_id, (void **)&m->topk_w, (void **)&m->cnt,
                    (void **)&m->off, (void **)&m->fill, (void **)&m->active, (void **)&m->tiles,
                    (void **)&m->n_tiles, (void **)&m->slot_tok, (void **)&m->inv, (void **)&m->H,
                    (void **)&m->Y, (void **)&m->HS, (void **)&m->YS, (void **)&m->SG};
    static_assert(sizeof sizes / sizeof sizes[0] == sizeof dst / sizeof dst[0], "one size per buffer");
    for (int i = 0; i < count; i++) {
        *dst[i] = sizes[i] ? p : NULL;
        p += al256(sizes[i]);
    }
    return 0;
}

// The shared expert through the backend's own linear ops: HS and YS (not its gate input).
static int shared_by_ops(kc_backend *b, const bf16 *x, int n, const kaon_moe_weights *w, int SF, const MoeBufs &m) {
    kaon_backend *be = &b->base;
    const kaon_backend_ops *op = be->ops;
    int rc = op->linear_silu_mul(be, x, n, w->shared_gate, w->shared_up, m.HS);
    if (rc == 1) {
        if (kc_grow(b, (void **)&b->fuse_tmp, &b->fuse_tmp_cap, (size_t)n * SF, sizeof(bf16), "moe shared expert"))
            return -1;
        op->linear(be, x, n, w->shared_gate, m.HS);
        op->linear(be, x, n, w->shared_up, b->fuse_tmp);
        op->silu_and_mul(be, m.HS, b->fuse_tmp, n, SF, m.HS);
    } else if (rc < 0) {
        return -1;
    }
    op->linear(be, m.HS, n, w->shared_down, m.YS);
    return b->err ? -1 : 0;
}

// A bare bf16 [rows, cols] matrix (no bias, scales or zero points), 16-byte aligned: what the
// small path's kernels read directly.
static bool plain_bf16(const kaon_linear *l, int64_t rows, int64_t cols) {
    return l && l->w.data && l->w.dtype == KAON_BF16 && l->w.ndim == 2 && l->w.shape[0] == rows &&
           l->w.shape[1] == cols && !kaon_linear_bias(l) && !kaon_linear_unsupported(l) &&
           !((uintptr_t)l->w.data & 15);
}

// Whether the routing takes k_moe_route_cluster (KAON_MOE_ROUTE_CLUSTER=1; not yet the default):
// its blocks fit one cluster and this device can run such a cluster (checked once per device and
// kernel: sizes over 8 need the non-portable attribute, set per device).
#define RC_MAX_DEVICES 16
static bool route_cluster_ok(kc_backend *b, int blocks, bool ep) {
    static const bool on = kc_env_on("KAON_MOE_ROUTE_CLUSTER");
    int dev = 0;
    if (!on || blocks > RC_MAX_BLOCKS || cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= RC_MAX_DEVICES)
        return false;
    static std::atomic<int> fits[RC_MAX_DEVICES][2][RC_MAX_BLOCKS + 1];  // 0 unknown, 1 yes, -1 no
    std::atomic<int> &f = fits[dev][ep ? 1 : 0][blocks];
    if (!f.load()) {
        auto kern = ep ? k_moe_route_cluster<true> : k_moe_route_cluster<false>;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)blocks);
        cfg.blockDim = dim3(SR_WARPS * 32);
        cfg.stream = b->stream;
        cudaLaunchAttribute attr;
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = (unsigned)blocks;
        attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        const bool yes = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
                         cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg) == cudaSuccess && clusters > 0;
        if (!yes) (void)cudaGetLastError();  // a refusal is an answer, not the step's error
        f.store(yes ? 1 : -1);
    }
    return f.load() > 0;
}

// n <= MOE_GEMV_MAX_N (decode): three launches where the general path takes ten.
//   k_moe_route_small: router (+ shared gate input) GEMV, routing and plan in its last block;
//   k_moe_small_gu: gate/up of the active experts and of the shared expert;
//   k_moe_small_down: down projections of both and the combine.
// A shared expert the kernels cannot read directly (quantized, a bias, ...) goes through the
// linear ops between the second and third launch (and a gate input through linear_f32).
// Expert parallel (El < E): the experts [e0, e0 + El) only (bf16).
static int moe_small(kc_backend *b, const bf16 *x, int n, const int32_t *dpos, const kaon_moe_weights *w,
                     uint32_t *counts, bf16 *out, bool ds_route, int dim, int F, int SF, const MoeW &mw,
                     const MoeW8 *w8, const MoeBufs &m, int max_active, int e0, int El, const MoeNorm &nz) {
    const int E = w->n_experts, K = w->top_k;
    const bool ep = El < E;
    if (((uintptr_t)x & 15) || ((uintptr_t)w->router->w.data & 15))
        return kc_fail(b, "cuda moe: misaligned activations or router");
    const bool fuse_shared = !w8 && SF > 0 && SF % 8 == 0 && plain_bf16(w->shared_gate, SF, dim) &&
                             plain_bf16(w->shared_up, SF, dim) && plain_bf16(w->shared_down, dim, SF);
    const bool fuse_sg = SF > 0 && w->shared_gate_inp && plain_bf16(w->shared_gate_inp, 1, dim);
    const bf16 *router = (const bf16 *)w->router->w.data;
    const bf16 *sg_w = fuse_sg ? (const bf16 *)w->shared_gate_inp->w.data : NULL;
    // The split norm (norm_moe_residual) where every kernel of the path reads x and writes out
    // itself; else declined before anything runs.
    // (Expert parallel too: a rank's partial sum must be all-reduced before the residual add.)
    if ((nz.in_parts || nz.res) && (w8 || n != 1 || ep || (SF && !fuse_shared) || (SF && w->shared_gate_inp && !fuse_sg)))
        return 1;
    const MoeRouteDs p = kc_moe_route_ds_params(w);
    const int norm = w->norm_topk ? 1 : 0;
    const dim3 blk(GEMV_WARPS * 32);
    const int rows = E + (fuse_sg ? 1 : 0);
    const dim3 rgrid((unsigned)((rows + SR_WARPS - 1) / SR_WARPS));
    cudaError_t st;
    const dim3 rblk(SR_WARPS * 32);
    if (!ds_route && route_cluster_ok(b, (int)rgrid.x, ep))
        st = ep ? kc_launch_cluster(b, k_moe_route_cluster<true>, rgrid, rblk, rgrid.x, 0, x, n, dim, router, E, sg_w,
                                    dpos, K, norm, m, counts, e0, El, nz)
                : kc_launch_cluster(b, k_moe_route_cluster<false>, rgrid, rblk, rgrid.x, 0, x, n, dim, router, E, sg_w,
                                    dpos, K, norm, m, counts, 0, E, nz);
    else if (ds_route)
        st = ep ? kc_launch(b, k_moe_route_small<true, true>, rgrid, rblk, 0, x, n, dim, router, E, sg_w, dpos, K, norm,
                            p, m, counts, e0, El, nz)
                : kc_launch(b, k_moe_route_small<true, false>, rgrid, rblk, 0, x, n, dim, router, E, sg_w, dpos, K,
                            norm, p, m, counts, 0, E, nz);
    else
        st = ep ? kc_launch(b, k_moe_route_small<false, true>, rgrid, rblk, 0, x, n, dim, router, E, sg_w, dpos, K,
                            norm, p, m, counts, e0, El, nz)
                : kc_launch(b, k_moe_route_small<false, false>, rgrid, rblk, 0, x, n, dim, router, E, sg_w, dpos, K,
                            norm, p, m, counts, 0, E, nz);
    if (kc_check(b, st, "moe routing")) return -1;
    if (w8) {  // FP8 experts (cuda_moe_fp8.cu; never expert parallel); the shared expert through the linear ops
        if (kc_moe8_small_gu(b, x, dim, F, *w8, max_active, m, E)) return -1;
        if (SF && shared_by_ops(b, x, n, w, SF, m)) return -1;
        if (SF && w->shared_gate_inp) {
            b->base.ops->linear_f32(&b->base, x, n, w->shared_gate_inp, m.SG);
            if (b->err) return -1;
        }
        return kc_moe8_small_down(b, n, dim, F, *w8, SF ? m.YS : NULL, SF && w->shared_gate_inp ? m.SG : NULL, K, m,
                                  E, out);
    }
    const int gx = (F + GEMV_WARPS - 1) / GEMV_WARPS;
    const int ys = fuse_shared ? (SF + gx * GEMV_WARPS - 1) / (gx * GEMV_WARPS) : 0;
    // KAON_MOE_DOWN_EARLY=1: the down kernel requests its experts' first weights before waiting
    // for gate/up (gate/up lets it launch only after the routing; see k_moe_small_down).
    static const bool early_on = kc_env_on("KAON_MOE_DOWN_EARLY");
    const int early = early_on ? 1 : 0;
    if (kc_check(b, kc_launch(b, k_moe_small_gu, dim3((unsigned)gx, (unsigned)(ys + max_active)), blk, 0, x, n, dim, F,
                              mw, fuse_shared ? (const bf16 *)w->shared_gate->w.data : NULL,
                              fuse_shared ? (const bf16 *)w->shared_up->w.data : NULL, fuse_shared ? SF : 0, ys,
                              m.active, El, m.off, m.slot_tok, m.H, m.HS, nz, early),
                 "moe experts"))
        return -1;
    if (SF && !fuse_shared && shared_by_ops(b, x, n, w, SF, m)) return -1;
    if (SF && w->shared_gate_inp && !fuse_sg) {
        b->base.ops->linear_f32(&b->base, x, n, w->shared_gate_inp, m.SG);
        if (b->err) return -1;
    }
    const int cpl = b1_down_cpl(n, F, SF, fuse_shared);
    if (cpl)
        return kc_check(b, launch_down_b1(b, cpl, dim, F, mw, fuse_shared ? (const bf16 *)w->shared_down->w.data : NULL,
                                          SF && !fuse_shared ? m.YS : NULL, SF && w->shared_gate_inp ? m.SG : NULL, K,
                                          m, El, out, nz, early),
                        "moe down and combine");
    const dim3 dgrid((unsigned)((dim + DN_ROWS - 1) / DN_ROWS));
    // KAON_GEMV_OCC & 4: the 4-blocks-per-SM instance (64 registers, 8 bytes spilled).
    const bool hi = kc_gemv_occ_hi(KC_OCC_MOE_DOWN);
    auto kern = nz.res ? (hi ? k_moe_small_down<4, true> : k_moe_small_down<1, true>)
                       : (hi ? k_moe_small_down<4, false> : k_moe_small_down<1, false>);
    return kc_check(b, kc_launch(b, kern, dgrid, blk, 0, m.H, n, dim, F, mw,
                                 fuse_shared ? (const bf16 *)w->shared_down->w.data : NULL, fuse_shared ? SF : 0,
                                 m.HS, SF && !fuse_shared ? m.YS : NULL, SF && w->shared_gate_inp ? m.SG : NULL, K,
                                 m.active, El, m.off, m.inv, m.topk_w, out, nz, early),
                    "moe down and combine");
}

// The moe op; nz (MoeNorm): plain (all zero), or the split norm's batch-1 form, declined (1)
// where the small path cannot take it.
static int moe_op(kc_backend *b, const void *x_, int n, const int32_t *positions, const kaon_moe_weights *w,
                  uint32_t *counts, void *out_, const MoeNorm &nz) {
    if (n <= 0) return 0;
    const bf16 *x = (const bf16 *)x_;
    bf16 *out = (bf16 *)out_;
    if (!x || !out || x == out || !w || !w->router || !w->gate || !w->up || !w->down)
        return kc_fail(b, "cuda moe: bad arguments");
    const bool ds_route = kc_moe_route_is_ds(w);  // DeepSeekMoE routing: cuda_moe_route.cu
    if (ds_route && kc_moe_route_ds_check(b, w)) return -1;
    const int E = w->n_experts, K = w->top_k;
    if (E < 1 || E > MOE_MAX_E || K < 1 || K > E || K > MOE_MAX_K)
        return kc_fail(b, "cuda moe: %d experts, top %d (at most %d experts, top %d)", E, K, MOE_MAX_E, MOE_MAX_K);
    // Expert parallelism: this rank's experts [e0, e0 + El) (all of them when e1 == 0).
    const int e0 = w->e1 > 0 ? w->e0 : 0, El = w->e1 > 0 ? w->e1 - w->e0 : E;
    if (e0 < 0 || El < 1 || e0 + El > E) return kc_fail(b, "cuda moe: experts [%d, %d) of %d", w->e0, w->e1, E);
    const bool ep = El < E;
    const kaon_tensor *R = &w->router->w;
    if (R->ndim != 2 || R->shape[0] != E || R->dtype != KAON_BF16)
        return kc_fail(b, "cuda moe: the router must be a bf16 [%d, dim] matrix", E);
    const char *router_extra = kaon_linear_bias(w->router) ? "a bias" : kaon_linear_unsupported(w->router);
    if (router_extra) return kc_fail(b, "cuda moe: a router with %s is not supported", router_extra);
    const int dim = (int)R->shape[1], F = (int)w->gate[e0].w.shape[0];
    const int SF = w->shared_gate ? (int)w->shared_gate->w.shape[0] : 0;
    if (dim % 8 || F % 8 || dim <= 0 || F <= 0) return kc_fail(b, "cuda moe: dim %d and ffn %d must be multiples of 8", dim, F);
    MoeW mw;
    MoeW8 w8;
    memset(&mw, 0, sizeof mw);
    const bool fp8 = w->gate[e0].w.dtype == KAON_FP8_E4M3;
    // (The FP8 kernels' combine (cuda_moe_fp8.cu) takes any slot-less choice for padding.)
    if (fp8 && ep) return kc_fail(b, "cuda moe: expert parallelism with FP8 experts is not supported yet (bf16 experts only)");
    if (fp8) {
        int bg, bu, bd, gc, uc;
        if (stacked_fp8(b, w->gate, E, F, dim, &w8.gate, &w8.sgate, &w8.gs, &w8.sgs, &bg, &gc, "gate") ||
            stacked_fp8(b, w->up, E, F, dim, &w8.up, &w8.sup, &w8.us, &w8.sus, &bu, &uc, "up") ||
            stacked_fp8(b, w->down, E, dim, F, &w8.down, &w8.sdown, &w8.ds, &w8.sds, &bd, &w8.dcols, "down"))
            return -1;
        if (bg != bu || bg != bd) return kc_fail(b, "cuda moe: FP8 experts with different scale layouts per kind");
        if (F % 16 || dim % 16) return kc_fail(b, "cuda moe: FP8 experts need dim %d and ffn %d multiples of 16", dim, F);
        w8.block = bg;
        w8.gcols = gc;
    } else if (stacked(b, w->gate + e0, El, e0, F, dim, &mw.gate, &mw.sgate, "gate") ||
               stacked(b, w->up + e0, El, e0, F, dim, &mw.up, &mw.sup, "up") ||
               stacked(b, w->down + e0, El, e0, dim, F, &mw.down, &mw.sdown, "down")) {
        return -1;
    }
    const int32_t *dpos = positions ? kc_dev_i32(b, positions, (size_t)n) : NULL;
    if (positions && !dpos) return -1;
    const int nk = n * K;
    const int max_active = nk < El ? nk : El;
    // Tile rows of the grouped GEMM from the rows per active expert (FP8 experts: 64); under EP
    // from this rank's expected share of the choices (the real one is known on the device only).
    const int nkl = ep ? (int)(((long long)nk * El + E - 1) / E) : nk;
    const int avg_rows = (nkl + max_active - 1) / max_active;
    const int tm = fp8 ? BM : avg_rows <= 16 ? 16 : avg_rows <= 32 ? 32 : BM;
    const int max_tiles = (nk + tm - 1) / tm + max_active;
    MoeBufs m;
    if (moe_bufs(b, n, E, K, F, dim, SF, max_tiles, &m)) return -1;
    // KAON_MOE_SMALL=0: small batches take the general path too (its GEMV kernels).
    static const char *small_env = getenv("KAON_MOE_SMALL");
    // (FP8 experts always: the general path's GEMV kernels read bf16.)
    if (n <= MOE_GEMV_MAX_N && (fp8 || !(small_env && !strcmp(small_env, "0"))))
        return moe_small(b, x, n, dpos, w, counts, out, ds_route, dim, F, SF, mw, fp8 ? &w8 : NULL, m, max_active, e0,
                         El, nz);
    if (nz.in_parts || nz.res) return 1;

    // 1. router logits (f32)
    if (kc_gemm_bf16(b, x, n, (const bf16 *)R->data, E, dim, NULL, m.logits, 1)) return -1;
    // 2. route
    if (kc_check(b, cudaMemsetAsync(m.cnt, 0, sizeof(int) * (size_t)E, b->stream), "moe")) return -1;
    if (ds_route) {
        if (kc_moe_route_ds(b, m.logits, dpos, n, w, m.topk_id, m.topk_w, m.cnt, counts)) return -1;
    } else {
        k_route<<<(n + 3) / 4, 128, 0, b->stream>>>(m.logits, dpos, n, E, K, w->norm_topk ? 1 : 0, m.topk_id,
                                                     m.topk_w, m.cnt, counts);
    }
    // 3. plan (expert parallel: of this rank's experts, from their counts), 4. permute
    k_plan<<<1, MOE_MAX_E, 0, b->stream>>>(m.cnt + e0, El, tm, m.off, m.fill, m.active, m.tiles, m.n_tiles);
    if (ep)
        k_permute<true><<<(nk + 255) / 256, 256, 0, b->stream>>>(m.topk_id, nk, m.off, m.fill, m.slot_tok, m.inv, K,
                                                                  e0, El);
    else
        k_permute<false><<<(nk + 255) / 256, 256, 0, b->stream>>>(m.topk_id, nk, m.off, m.fill, m.slot_tok, m.inv, K,
                                                                   0, E);
    if (kc_launched(b, "moe routing")) return -1;
    // 5. experts
    if (fp8) {
        if (kc_moe8_gemm(b, x, dim, F, w8, max_tiles, m)) return -1;
    } else if (n <= MOE_GEMV_MAX_N) {
        const dim3 blk(GEMV_WARPS * 32);
        k_moe_gemv_gu<<<dim3((F + GEMV_WARPS - 1) / GEMV_WARPS, max_active), blk, 0, b->stream>>>(
            x, dim, F, mw, m.active, El, m.off, m.slot_tok, m.H);
        k_moe_gemv_down<<<dim3((dim + GEMV_WARPS - 1) / GEMV_WARPS, max_active), blk, 0, b->stream>>>(
            m.H, dim, F, mw, m.active, El, m.off, m.Y);
    } else {
        if (tm == 16) moe_gemms<16>(b, x, dim, F, mw, max_tiles, m);
        else if (tm == 32) moe_gemms<32>(b, x, dim, F, mw, max_tiles, m);
        else moe_gemms<BM>(b, x, dim, F, mw, max_tiles, m);
    }
    if (kc_launched(b, "moe experts")) return -1;
    // 6. shared expert
    if (SF && shared_by_ops(b, x, n, w, SF, m)) return -1;
    if (SF && w->shared_gate_inp) {
        b->base.ops->linear_f32(&b->base, x, n, w->shared_gate_inp, m.SG);
        if (b->err) return -1;
    }
    // 7. combine
    k_combine<<<n, 128, 0, b->stream>>>(m.Y, m.inv, m.topk_w, K, dim, SF ? m.YS : NULL,
                                        SF && w->shared_gate_inp ? m.SG : NULL, out);
    return kc_launched(b, "moe combine");
}

extern "C" int kc_moe_op(kaon_backend *be, const void *x, int n, const int32_t *positions, const kaon_moe_weights *w,
                         uint32_t *counts, void *out) {
    MoeNorm nz;
    memset(&nz, 0, sizeof nz);
    return moe_op(kc(be), x, n, positions, w, counts, out, nz);
}

int kc_moe_norm_residual(kc_backend *b, const kaon_moe_weights *w, const int32_t *positions, uint32_t *counts,
                         void *res, const kc_gemv_fuse *in, kc_gemv_fuse *out) {
    MoeNorm nz;
    memset(&nz, 0, sizeof nz);
    nz.in_parts = in->parts;
    nz.in_n = in->n_parts;
    nz.eps = in->eps;
    nz.res = 1;
    if (out) {
        nz.norm = out->norm;
        nz.xg = out->xg;
        nz.parts = out->parts;
        // The down kernel's blocks (under the split norm a shared expert is always fused).
        const int e0 = w->e1 > 0 ? w->e0 : 0, F = (int)w->gate[e0].w.shape[0];
        const int SF = w->shared_gate ? (int)w->shared_gate->w.shape[0] : 0;
        const int rows = small_down_rows(1, F, SF, SF > 0);
        out->n_parts = (int)((w->router->w.shape[1] + rows - 1) / rows);
    }
    return moe_op(b, b->split_xg, 1, positions, w, counts, res, nz);
}
