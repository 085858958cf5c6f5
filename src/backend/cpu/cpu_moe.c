// The moe op on the CPU: route, group the tokens by expert, run each chosen expert once over
// all of its tokens, add the weighted outputs back per token.
//
//   logits = x @ router^T                          [n, E]   (the linear kernels, any format)
//   top-k per token of softmax or sigmoid scores (+ selection bias, group limits; ties: the lower
//   expert id), weights renormalised and scaled if asked
//   tokens grouped by expert: counts, offsets, the token of each slot (ascending per expert)
//   for each expert e with tokens: xe = x[tokens of e]                  [n_e, dim]
//       h = silu(xe @ gate_e^T) * (xe @ up_e^T)                         [n_e, ffn]
//       out[token] += p * (h @ down_e^T)[row]                            [n_e, dim]
// Each expert's weights are read once per step for all the tokens routed to it, through the
// same quantized (8-bit activation) or float kernels as the dense layers, so a quantized file
// costs per expert what a dense MLP of that width costs.
//
// Expert-parallel threads: the experts with few tokens (at most the kernels' max_rows: every
// expert of a decode step) run together, all their gate/up rows as one work list over the
// threads and then all their down rows as another (kaon_cpu_linear_grouped), instead of two
// pool runs per expert. The experts with more tokens run one at a time, each already a large
// product. The weighted outputs are added per token in ascending expert order either way, and
// each row comes from the same kernel, so the result does not depend on the split.
//
// Expert parallelism across ranks (w->e1 > 0, model/tp.h): every token is routed over all
// experts as above, then only the experts [e0, e1) run here; out holds this rank's part (plus
// its part of the shared expert), which the ranks' all-reduce sums.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/err.h"

#define MOE_MAX_TOPK 64

static void *moe_scratch(kaon_cpu_backend *be, size_t bytes) {
    if (bytes <= be->moe_scratch_cap) return be->moe_scratch;
    size_t cap = (bytes + bytes / 4 + 4096 + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap) != 0) {
        kaon_cpu_fail(be, "cpu moe: out of memory for %zu bytes of scratch", bytes);
        return NULL;
    }
    free(be->moe_scratch);
    be->moe_scratch = p;
    be->moe_scratch_cap = cap;
    return p;
}

static bool is_matrix(const kaon_linear *l, int64_t rows, int64_t cols) {
    const kaon_tensor *t = l ? &l->w : NULL;
    return t && t->data && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols;
}

// Bump allocator over one scratch block (64-byte aligned pieces).
typedef struct bump {
    char *p;
    size_t used;
} bump;

static void *take(bump *b, size_t bytes) {
    void *r = b->p ? b->p + b->used : NULL;
    b->used += (bytes + 63) & ~(size_t)63;
    return r;
}

// The k best of c [E] not yet taken (ties: the lower id) into ids, in descending order.
static void top_k(const float *c, int E, int k, int32_t *ids) {
    uint64_t taken[4096 / 64] = {0};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!(taken[e / 64] >> (e % 64) & 1) && (best < 0 || c[e] > c[best])) best = e;
        taken[best / 64] |= (uint64_t)1 << (best % 64);
        ids[j] = best;
    }
}

// One token's routing (backend.h, kaon_moe_weights): logits l [E] -> the top_k experts ids (in
// descending choice value) and their weights p. s, c: [E] scratch (scores, choice values).
static void route_token(const float *l, const kaon_moe_weights *w, float *s, float *c, int32_t *ids,
                        float *p) {
    const int E = w->n_experts, k = w->top_k;
    if (w->scoring == KAON_MOE_SIGMOID) {
        for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float mx = l[0];
        for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) s[e] = (float)(exp((double)l[e] - mx) / sum);
    }
    const float *bias = w->score_bias ? w->score_bias->data : NULL;
    for (int e = 0; e < E; e++) c[e] = bias ? s[e] + bias[e] : s[e];
    if (w->n_group > 1 && w->topk_group < w->n_group) {
        // Group-limited: only the topk_group best groups compete (the others' values become
        // -inf: HF's V3 router; its V2 router masks with 0, the same choice for softmax scores).
        const int G = w->n_group, per = E / G;
        float gs[256];
        int32_t keep[256];
        for (int g = 0; g < G; g++) {
            const float *cg = c + (size_t)g * per;
            float a = cg[0], b = -INFINITY;  // best and second best
            for (int i = 1; i < per; i++) {
                if (cg[i] > a) {
                    b = a;
                    a = cg[i];
                } else if (cg[i] > b) {
                    b = cg[i];
                }
            }
            gs[g] = w->group_top2 ? a + (per > 1 ? b : 0.0f) : a;
        }
        top_k(gs, G, w->topk_group, keep);
        bool kept[256] = {false};
        for (int j = 0; j < w->topk_group; j++) kept[keep[j]] = true;
        for (int g = 0; g < G; g++)
            if (!kept[g])
                for (int i = 0; i < per; i++) c[(size_t)g * per + i] = -INFINITY;
    }
    top_k(c, E, k, ids);
    double sel = 0;
    for (int j = 0; j < k; j++) {
        p[j] = s[ids[j]];
        sel += p[j];
    }
    const float f = w->routed_scale > 0.0f ? w->routed_scale : 1.0f;
    for (int j = 0; j < k; j++) p[j] = (float)(w->norm_topk ? p[j] / (sel + 1e-20) : p[j]) * f;
}

// y = silu(x @ g^T) * (x @ u^T), through the fused kernel when g and u share a format.
static void silu_mlp(kaon_backend *be, const float *x, int n, const kaon_linear *g,
                     const kaon_linear *u, float *h, float *tmp) {
    if (kaon_cpu_linear_silu_mul(be, x, n, g, u, h) != 1) return;
    const kaon_cpu_kernels *k = ((kaon_cpu_backend *)be)->k;
    const int64_t F = g->w.shape[0];
    kaon_cpu_linear(be, x, n, g, h);
    kaon_cpu_linear(be, x, n, u, tmp);
    for (int r = 0; r < n; r++) k->silu_mul(h + (size_t)r * F, tmp + (size_t)r * F, h + (size_t)r * F, (int)F);
}

// gpt-oss's clamped SwiGLU on expert e (biases included by the linears):
// h = (clamp(u, -lim, lim) + 1) * g' * sigmoid(alpha * g'), g' = min(g, lim).
static void oai_mlp(kaon_backend *be, const float *x, int n, const kaon_moe_weights *w, int e, float *h,
                    float *tmp) {
    const int64_t F = w->gate[e].w.shape[0];
    const float lim = w->act_limit, alpha = w->act_alpha;
    kaon_cpu_linear(be, x, n, &w->gate[e], h);
    kaon_cpu_linear(be, x, n, &w->up[e], tmp);
    for (size_t i = 0; i < (size_t)n * (size_t)F; i++) {
        const float g = h[i] < lim ? h[i] : lim;
        const float u = tmp[i] < -lim ? -lim : tmp[i] > lim ? lim : tmp[i];
        h[i] = (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
    }
}

int kaon_cpu_moe(kaon_backend *be_, const void *x_, int n, const int32_t *positions,
                 const kaon_moe_weights *w, uint32_t *counts, void *out_) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    const float *x = x_;
    float *out = out_;
    if (n <= 0) return 0;
    if (!x || !out || x == out || !w || !w->router || !w->gate || !w->up || !w->down)
        return kaon_cpu_fail(be, "cpu moe: bad arguments");
    const int E = w->n_experts, K = w->top_k;
    const kaon_tensor *R = &w->router->w;
    if (E < 1 || E > 4096 || K < 1 || K > E || K > MOE_MAX_TOPK || R->ndim != 2 || R->shape[0] != E ||
        (w->n_group > 1 && (w->n_group > 256 || E % w->n_group || w->topk_group < 1 ||
                            w->topk_group > w->n_group || (int64_t)w->topk_group * (E / w->n_group) < K)) ||
        (w->score_bias && (w->score_bias->dtype != KAON_F32 || kaon_tensor_numel(w->score_bias) != E)))
        return kaon_cpu_fail(be, "cpu moe: %d experts, top %d, router of %lld rows, %d groups (top %d), "
                             "selection bias %s", E, K, (long long)R->shape[0], w->n_group, w->topk_group,
                             w->score_bias ? "given" : "none");
    const int lo = w->e1 > 0 ? w->e0 : 0, hi = w->e1 > 0 ? w->e1 : E;  // this rank's experts
    if (lo < 0 || lo >= hi || hi > E) return kaon_cpu_fail(be, "cpu moe: experts [%d, %d) of %d", lo, hi, E);
    const int64_t dim = R->shape[1], F = w->gate[lo].w.shape[0];
    const int64_t SF = w->shared_gate ? w->shared_gate->w.shape[0] : 0;
    for (int e = lo; e < hi; e++)
        if (!is_matrix(&w->gate[e], F, dim) || !is_matrix(&w->up[e], F, dim) || !is_matrix(&w->down[e], dim, F))
            return kaon_cpu_fail(be, "cpu moe: expert %d's weights are not [%lld, %lld] / [%lld, %lld]", e,
                                 (long long)F, (long long)dim, (long long)dim, (long long)F);
    if (SF && (!is_matrix(w->shared_gate, SF, dim) || !is_matrix(w->shared_up, SF, dim) ||
               !is_matrix(w->shared_down, dim, SF) ||
               (w->shared_gate_inp && !is_matrix(w->shared_gate_inp, 1, dim))))
        return kaon_cpu_fail(be, "cpu moe: shared expert shapes");

    // Scratch: sizes first (b.p == NULL), then the pointers.
    const size_t NK = (size_t)n * K, wide = (size_t)(F > SF ? F : SF);
    float *logits = NULL, *pw = NULL, *slot_w = NULL, *xe = NULL, *he = NULL, *tmp = NULL, *ye0 = NULL, *sg = NULL;
    const float *ye = NULL;
    float *rs = NULL;  // route_token's scores and choice values
    int32_t *ids = NULL, *cnt = NULL, *off = NULL, *slot_tok = NULL, *fill = NULL;
    // The grouped experts' rows: gathered inputs, gate/up outputs, down outputs, one per slot
    // (at most n K, and at most max_rows per expert); their segments.
    const int G = be->k->max_rows;
    const size_t gslots = NK < (size_t)E * G ? NK : (size_t)E * G;
    float *gx = NULL, *gh = NULL, *gy = NULL;
    int32_t *gbase = NULL;  // [E] first grouped slot of expert e, -1: not grouped
    kaon_cpu_seg *gseg = NULL;
    for (int pass = 0; pass < 2; pass++) {
        bump b = {NULL, 0};
        if (pass) {
            b.p = moe_scratch(be, 0);
        }
        logits = take(&b, (size_t)n * E * sizeof(float));
        ids = take(&b, NK * sizeof(int32_t));
        pw = take(&b, NK * sizeof(float));
        cnt = take(&b, (size_t)E * sizeof(int32_t));
        off = take(&b, (size_t)(E + 1) * sizeof(int32_t));
        fill = take(&b, (size_t)E * sizeof(int32_t));
        slot_tok = take(&b, NK * sizeof(int32_t));
        slot_w = take(&b, NK * sizeof(float));
        // Gathered rows and outputs of one expert (at most n tokens; the shared expert: n).
        xe = take(&b, (size_t)n * dim * sizeof(float));
        he = take(&b, (size_t)n * wide * sizeof(float));
        tmp = take(&b, (size_t)n * wide * sizeof(float));
        ye0 = take(&b, (size_t)n * dim * sizeof(float));
        sg = take(&b, (size_t)n * sizeof(float));
        rs = take(&b, (size_t)2 * E * sizeof(float));
        gx = take(&b, gslots * dim * sizeof(float));
        gh = take(&b, gslots * F * sizeof(float));
        gy = take(&b, gslots * dim * sizeof(float));
        gbase = take(&b, (size_t)E * sizeof(int32_t));
        gseg = take(&b, (size_t)E * sizeof(kaon_cpu_seg));
        if (!pass && !moe_scratch(be, b.used)) return -1;
    }

    // 1. Route.
    kaon_cpu_linear(be_, x, n, w->router, logits);  // [n, E]
    for (int t = 0; t < n; t++)
        route_token(logits + (size_t)t * E, w, rs, rs + E, ids + (size_t)t * K, pw + (size_t)t * K);

    // 2. Group by expert: slots [off[e], off[e+1]) hold e's tokens in ascending order.
    // Padding tokens (negative position) go nowhere.
    for (int t = 0; t < n; t++)
        if (positions && positions[t] < 0)
            for (int j = 0; j < K; j++) ids[(size_t)t * K + j] = -1;
    memset(cnt, 0, (size_t)E * sizeof *cnt);
    for (size_t i = 0; i < NK; i++)
        if (ids[i] >= 0) cnt[ids[i]]++;
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
    memcpy(fill, off, (size_t)E * sizeof *fill);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[(size_t)t * K + j];
            if (e < 0) continue;
            const int s = fill[e]++;
            slot_tok[s] = t;
            slot_w[s] = pw[(size_t)t * K + j];
        }
    if (counts)
        for (int e = 0; e < E; e++) counts[e] += (uint32_t)cnt[e];
    for (int e = 0; e < E; e++)  // other ranks' experts: their tokens are theirs to run
        if (e < lo || e >= hi) cnt[e] = 0;

    // 3. The shared expert (every token), scaled by its sigmoid gate; else zeros.
    if (SF) {
        silu_mlp(be_, x, n, w->shared_gate, w->shared_up, he, tmp);  // [n, SF]
        kaon_cpu_linear(be_, he, n, w->shared_down, out);     // [n, dim]
        if (w->shared_gate_inp) kaon_cpu_linear(be_, x, n, w->shared_gate_inp, sg);  // [n, 1]
        for (int t = 0; t < n; t++) {
            const bool pad = positions && positions[t] < 0;
            if (w->shared_gate_inp || pad) {
                const float s = pad ? 0.0f : 1.0f / (1.0f + expf(-sg[t]));
                float *o = out + (size_t)t * dim;
                for (int64_t i = 0; i < dim; i++) o[i] *= s;
            }
        }
    } else {
        memset(out, 0, (size_t)n * dim * sizeof(float));
    }

    // 4a. The experts with few tokens together: gate/up of all as one run, then down.
    for (int e = 0; e < E; e++) gbase[e] = -1;
    if (w->act != KAON_MOE_ACT_SWIGLU_OAI) {
        int ns = 0;
        size_t used = 0;
        for (int e = 0; e < E; e++) {
            const int ne = cnt[e];
            if (!ne || ne > G) continue;
            const int32_t *tok = slot_tok + off[e];
            for (int i = 0; i < ne; i++)
                memcpy(gx + (used + i) * dim, x + (size_t)tok[i] * dim, (size_t)dim * sizeof(float));
            gseg[ns++] = (kaon_cpu_seg){.w = &w->gate[e], .w2 = &w->up[e], .x = gx + used * dim, .n = ne,
                                        .y = gh + used * F};
            gbase[e] = (int32_t)used;
            used += (size_t)ne;
        }
        int rc = ns ? kaon_cpu_linear_grouped(be, ns, gseg) : 0;
        if (rc == 0 && ns) {
            for (int e = 0, i = 0; e < E; e++)
                if (gbase[e] >= 0)
                    gseg[i++] = (kaon_cpu_seg){.w = &w->down[e], .x = gh + (size_t)gbase[e] * F, .n = cnt[e],
                                               .y = gy + (size_t)gbase[e] * dim};
            rc = kaon_cpu_linear_grouped(be, ns, gseg);
        }
        if (rc < 0) return -1;
        if (rc == 1)  // declined (formats differ): every expert one at a time below
            for (int e = 0; e < E; e++) gbase[e] = -1;
    }

    // 4b. Each chosen expert once, over all of its tokens, adding the weighted outputs.
    for (int e = 0; e < E; e++) {
        const int ne = cnt[e];
        if (!ne) continue;
        const int32_t *tok = slot_tok + off[e];
        const float *sw = slot_w + off[e];
        if (gbase[e] >= 0) {
            ye = gy + (size_t)gbase[e] * dim;
        } else {
            for (int i = 0; i < ne; i++)
                memcpy(xe + (size_t)i * dim, x + (size_t)tok[i] * dim, (size_t)dim * sizeof(float));
            if (w->act == KAON_MOE_ACT_SWIGLU_OAI) oai_mlp(be_, xe, ne, w, e, he, tmp);
            else silu_mlp(be_, xe, ne, &w->gate[e], &w->up[e], he, tmp);  // [ne, F]
            kaon_cpu_linear(be_, he, ne, &w->down[e], ye0);     // [ne, dim]
            ye = ye0;
        }
        for (int i = 0; i < ne; i++) {
            float *o = out + (size_t)tok[i] * dim;
            const float *y = ye + (size_t)i * dim, p = sw[i];
            for (int64_t c = 0; c < dim; c++) o[c] += p * y[c];
        }
    }
    return be->err ? -1 : 0;  // an error since the last status (here: a linear that failed)
}
