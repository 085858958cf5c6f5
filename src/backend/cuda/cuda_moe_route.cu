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
#include "backend/cuda/cuda_moe_route.cuh"

#define DSR_WARPS 4

__global__ void __launch_bounds__(DSR_WARPS * 32)
k_route_ds(const float *__restrict__ logits, const int32_t *__restrict__ pos, int n, int E, int K, MoeRouteDs p,
           int *__restrict__ topk_id, float *__restrict__ topk_w, int *__restrict__ cnt,
           uint32_t *__restrict__ counts) {
    __shared__ float c_s[DSR_WARPS][DSR_MAX_E];
    const int wib = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x * DSR_WARPS + wib;
    if (t >= n) return;  // whole warps leave; nothing below synchronises the block
    moe_route_ds_token(logits, pos, t, E, K, p, c_s[wib], topk_id, topk_w, cnt, counts, lane);
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
    k_route_ds<<<(n + DSR_WARPS - 1) / DSR_WARPS, DSR_WARPS * 32, 0, b->stream>>>(
        logits, d_pos, n, w->n_experts, w->top_k, kc_moe_route_ds_params(w), topk_id, topk_w, cnt, counts);
    return kc_launched(b, "moe routing (DeepSeek)");
}
