// DeepSeekMoE routing for the moe op (cuda_moe.cu's step 2 when the layer asks for more than
// Mixtral / Qwen's softmax top-k): the semantics of backend.h's kaon_moe_weights, as the CPU's
// route_token (cpu_moe.c) computes them.
//
// One warp per token, E <= 1024 experts (each lane owns experts lane + 32 i):
//   scores s = sigmoid(logits) (DeepSeek-V3 / Kimi: the logits in f32, as HF's f32 router), or
//     softmax(logits rounded to bf16) in f32 (V2: HF's bf16 gate Linear, softmax in f32);
//   choice values c = s + score_bias (selection only), kept in shared memory;
//   n_group > 1 (at most 64) with topk_group < n_group: a group's score is its best c, or with
//     group_top2 the sum of its best two; the topk_group best groups (ties: the lower group)
//     stay, the other groups' c become -inf (HF 5.17's V3 router; for softmax scores the same choice
//     as V2's masked_fill(0.0));
//   top_k of c (ties: the lower expert), weights s of the chosen, / (sum + 1e-20) when norm,
//     times routed_scale (0: 1).
// Padding tokens (position < 0) get no experts. The per-expert counts (and the caller's
// expert-load counters) are incremented as k_route does.
#include "backend/cuda/cuda_internal.h"

#include <math.h>

#define DSR_MAX_E 1024
#define DSR_WARPS 4
#define DSR_MAX_GROUPS 64
#define DSR_MAX_K 32

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

__global__ void __launch_bounds__(DSR_WARPS * 32)
k_route_ds(const float *__restrict__ logits, const int32_t *__restrict__ pos, int n, int E, int K, int sigmoid,
           const float *__restrict__ bias, int n_group, int topk_group, int group_top2, int norm, float scale,
           int *__restrict__ topk_id, float *__restrict__ topk_w, int *__restrict__ cnt,
           uint32_t *__restrict__ counts) {
    __shared__ float c_s[DSR_WARPS][DSR_MAX_E];
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * DSR_WARPS + wib;
    if (t >= n) return;  // whole warps leave; nothing below synchronises the block
    if (pos && pos[t] < 0) {
        for (int j = lane; j < K; j += 32) {
            topk_id[(size_t)t * K + j] = -1;
            topk_w[(size_t)t * K + j] = 0.f;
        }
        return;
    }
    constexpr int PER = DSR_MAX_E / 32;
    const float *lt = logits + (size_t)t * E;
    float s[PER];
    if (sigmoid) {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int e = lane + 32 * i;
            s[i] = e < E ? 1.f / (1.f + expf(-lt[e])) : 0.f;
        }
    } else {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int e = lane + 32 * i;
            s[i] = e < E ? __bfloat162float(__float2bfloat16(lt[e])) : -INFINITY;
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
    float *c = c_s[wib];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        if (e < E) c[e] = bias ? s[i] + bias[e] : s[i];
    }
    __syncwarp();
    if (n_group > 1 && topk_group < n_group) {
        const int per = E / n_group;
        float gs[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int g = lane + 32 * k;
            gs[k] = -INFINITY;
            if (g < n_group) {
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
                gs[k] = group_top2 ? a + (per > 1 ? b : 0.f) : a;
            }
        }
        uint64_t kept = 0;  // the same in every lane
        for (int j = 0; j < topk_group; j++) {
            float bv = -INFINITY;
            int bi = 0x7fffffff;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const int g = lane + 32 * k;
                if (g < n_group && !(kept >> g & 1) && (gs[k] > bv || (gs[k] == bv && g < bi))) {
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
        const float f = scale > 0.f ? scale : 1.f;
        topk_id[(size_t)t * K + lane] = chosen;
        topk_w[(size_t)t * K + lane] = (norm ? chosen_s / (sel + 1e-20f) : chosen_s) * f;
    }
}

bool kc_moe_route_is_ds(const kaon_moe_weights *w) {
    return w->scoring != KAON_MOE_SOFTMAX || w->score_bias || (w->n_group > 1 && w->topk_group < w->n_group) ||
           (w->routed_scale > 0.0f && w->routed_scale != 1.0f);
}

int kc_moe_route_ds_check(kc_backend *b, const kaon_moe_weights *w) {
    const int E = w->n_experts, K = w->top_k;
    if (w->scoring != KAON_MOE_SOFTMAX && w->scoring != KAON_MOE_SIGMOID)
        return kc_fail(b, "cuda moe: unknown scoring %d", w->scoring);
    if (E < 1 || E > DSR_MAX_E || K < 1 || K > E || K > DSR_MAX_K)
        return kc_fail(b, "cuda moe: %d experts, top %d (DeepSeek routing: at most %d experts, top %d)", E, K,
                       DSR_MAX_E, DSR_MAX_K);
    if (w->n_group > 1 && w->topk_group < w->n_group &&
        (w->n_group > DSR_MAX_GROUPS || E % w->n_group || w->topk_group < 1 ||
         (int64_t)w->topk_group * (E / w->n_group) < K))
        return kc_fail(b, "cuda moe: %d expert groups (top %d) of %d experts, top %d: unsupported (at most %d "
                          "groups that divide the experts and hold top_k)", w->n_group, w->topk_group, E, K,
                       DSR_MAX_GROUPS);
    const kaon_tensor *sb = w->score_bias;
    if (sb && (!sb->data || sb->dtype != KAON_F32 || kaon_tensor_numel(sb) != E))
        return kc_fail(b, "cuda moe: the selection bias must be an uploaded f32 vector of %d", E);
    return 0;
}

int kc_moe_route_ds(kc_backend *b, const float *logits, const int32_t *d_pos, int n, const kaon_moe_weights *w,
                    int *topk_id, float *topk_w, int *cnt, uint32_t *counts) {
    if (n <= 0) return 0;
    if (kc_moe_route_ds_check(b, w)) return -1;
    const bool groups = w->n_group > 1 && w->topk_group < w->n_group;
    k_route_ds<<<(n + DSR_WARPS - 1) / DSR_WARPS, DSR_WARPS * 32, 0, b->stream>>>(
        logits, d_pos, n, w->n_experts, w->top_k, w->scoring == KAON_MOE_SIGMOID ? 1 : 0,
        w->score_bias ? (const float *)w->score_bias->data : NULL, groups ? w->n_group : 1,
        groups ? w->topk_group : 1, w->group_top2 ? 1 : 0, w->norm_topk ? 1 : 0, w->routed_scale, topk_id, topk_w,
        cnt, counts);
    return kc_launched(b, "moe routing (DeepSeek)");
}
