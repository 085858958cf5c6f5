// DeepSeekMoE routing of one token by one warp: the body of cuda_moe_route.cu's k_route_ds,
// shared with cuda_moe.cu's small-batch routing kernel (which routes in its last block) so
// both compute the very same choices. Semantics: cuda_moe_route.cu's header.
#ifndef KAON_BACKEND_CUDA_MOE_ROUTE_CUH
#define KAON_BACKEND_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/cuda_internal.h"

#include <math.h>

#define DSR_MAX_E 1024
#define DSR_MAX_GROUPS 64
#define DSR_MAX_K 32

// The routing parameters of kaon_moe_weights as the kernels take them.
typedef struct MoeRouteDs {
    int sigmoid;          // sigmoid scores, else softmax of the bf16-rounded logits
    const float *bias;    // [E] selection bias (device), or NULL
    int n_group, topk_group, group_top2;  // n_group 1: no groups
    int norm;
    float scale;          // routed scaling factor (<= 0: 1)
} MoeRouteDs;

static inline MoeRouteDs kc_moe_route_ds_params(const kaon_moe_weights *w) {
    const bool groups = w->n_group > 1 && w->topk_group < w->n_group;
    MoeRouteDs p;
    p.sigmoid = w->scoring == KAON_MOE_SIGMOID ? 1 : 0;
    p.bias = w->score_bias ? (const float *)w->score_bias->data : NULL;
    p.n_group = groups ? w->n_group : 1;
    p.topk_group = groups ? w->topk_group : 1;
    p.group_top2 = w->group_top2 ? 1 : 0;
    p.norm = w->norm_topk ? 1 : 0;
    p.scale = w->routed_scale;
    return p;
}

// Warp arg-max of (v, i): the largest v, the lowest i among equals.
static __device__ __forceinline__ void warp_argmax(float &v, int &i) {
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (ov > v || (ov == v && oi < i)) {
            v = ov;
            i = oi;
        }
    }
}

// Token t (the whole warp; lane = its lane): ids and weights into topk_id / topk_w [t*K, +K),
// the chosen experts counted in cnt (global or shared memory) and counts (NULL: none). c: this
// warp's E floats of shared memory. logits are read through L2 (ld.cg): the caller may have
// written them in the same kernel. Padding tokens (pos[t] < 0) get ids -1, weights 0.
template <int PER>
static __device__ __forceinline__ void moe_route_ds_token_n(const float *logits, const int32_t *pos, int t, int E,
                                                          int K, const MoeRouteDs &p, float *c, int *topk_id,
                                                          float *topk_w, int *cnt, uint32_t *counts, int lane) {
    if (pos && pos[t] < 0) {
        for (int j = lane; j < K; j += 32) {
            topk_id[(size_t)t * K + j] = -1;
            topk_w[(size_t)t * K + j] = 0.f;
        }
        return;
    }
    const float *lt = logits + (size_t)t * E;
    float s[PER];
    if (p.sigmoid) {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int e = lane + 32 * i;
            s[i] = e < E ? 1.f / (1.f + expf(-__ldcg(lt + e))) : 0.f;
        }
    } else {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int e = lane + 32 * i;
            s[i] = e < E ? __bfloat162float(__float2bfloat16(__ldcg(lt + e))) : -INFINITY;
            mx = fmaxf(mx, s[i]);
        }
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            s[i] = lane + 32 * i < E ? expf(s[i] - mx) : 0.f;
            sum += s[i];
        }
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int i = 0; i < PER; i++) s[i] /= sum;
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        if (e < E) c[e] = p.bias ? s[i] + p.bias[e] : s[i];
    }
    __syncwarp();
    if (p.n_group > 1 && p.topk_group < p.n_group) {
        const int per = E / p.n_group;
        float gs[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int g = lane + 32 * k;
            gs[k] = -INFINITY;
            if (g < p.n_group) {
                const float *cg = c + g * per;
                float a = cg[0], b = -INFINITY;  // best and second best
                for (int i = 1; i < per; i++) {
                    const float v = cg[i];
                    if (v > a) {
                        b = a;
                        a = v;
                    } else if (v > b) {
                        b = v;
                    }
                }
                gs[k] = p.group_top2 ? a + (per > 1 ? b : 0.f) : a;
            }
        }
        uint64_t kept = 0;  // the same in every lane
        for (int j = 0; j < p.topk_group; j++) {
            float bv = -INFINITY;
            int bi = 0x7fffffff;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int g = lane + 32 * k;
                if (g < p.n_group && !(kept >> g & 1) && (gs[k] > bv || (gs[k] == bv && g < bi))) {
                    bv = gs[k];
                    bi = g;
                }
            }
            warp_argmax(bv, bi);
            kept |= 1ull << bi;
        }
        __syncwarp();  // every lane has read the groups before any is masked
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int e = lane + 32 * i;
            if (e < E && !(kept >> (e / per) & 1)) c[e] = -INFINITY;
        }
        __syncwarp();
    }
    float cv[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        cv[i] = e < E ? c[e] : -INFINITY;
    }
    float chosen_s = 0.f, sel = 0.f;
    int chosen = -1;
    for (int j = 0; j < K; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int e = lane + 32 * i;
            if (e < E && (cv[i] > bv || (cv[i] == bv && e < bi))) {
                bv = cv[i];
                bi = e;
            }
        }
        warp_argmax(bv, bi);
        // The chosen expert's score, from the lane that owns it (a static index keeps s in
        // registers).
        float mine = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (lane + 32 * i == bi) {
                mine = s[i];
                cv[i] = -INFINITY;  // taken
            }
        const float sj = __shfl_sync(0xffffffffu, mine, bi & 31);
        sel += sj;
        if (lane == j) {
            chosen = bi;
            chosen_s = sj;
        }
        if (lane == 0) {
            atomicAdd(&cnt[bi], 1);
            if (counts) atomicAdd(&counts[bi], 1u);
        }
    }
    if (lane < K) {
        const float f = p.scale > 0.f ? p.scale : 1.f;
        topk_id[(size_t)t * K + lane] = chosen;
        topk_w[(size_t)t * K + lane] = (p.norm ? chosen_s / (sel + 1e-20f) : chosen_s) * f;
    }
}

// Lanes keep PER = ceil(E / 32) scores each; the loops are as long as the experts need.
static __device__ __forceinline__ void moe_route_ds_token(const float *logits, const int32_t *pos, int t, int E,
                                                          int K, const MoeRouteDs &p, float *c, int *topk_id,
                                                          float *topk_w, int *cnt, uint32_t *counts, int lane) {
    if (E <= 64) moe_route_ds_token_n<2>(logits, pos, t, E, K, p, c, topk_id, topk_w, cnt, counts, lane);
    else if (E <= 128) moe_route_ds_token_n<4>(logits, pos, t, E, K, p, c, topk_id, topk_w, cnt, counts, lane);
    else if (E <= 256) moe_route_ds_token_n<8>(logits, pos, t, E, K, p, c, topk_id, topk_w, cnt, counts, lane);
    else moe_route_ds_token_n<DSR_MAX_E / 32>(logits, pos, t, E, K, p, c, topk_id, topk_w, cnt, counts, lane);
}

#endif
