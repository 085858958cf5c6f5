// gpt-oss: GptOssForCausalLM / model_type gpt_oss (Hugging Face files, float weights).
// Differences from the Llama family, all from transformers' modeling_gpt_oss.py:
// - q/k/v/o projections with biases; a learned logit per query head ("sinks") joins each
//   attention softmax's denominator (the backend's attention_sinks op);
// - layers alternate sliding-window (layer_types, sliding_window) and full attention, one
//   YaRN RoPE for all (truncate: false; its cos/sin factor folded into the attention scale);
// - every MLP is a mixture of experts: router with a bias, top-k of the logits then softmax
//   over the chosen (= softmax, top-k, renormalise), experts with biases and a clamped
//   SwiGLU ((up + 1) * g * sigmoid(1.702 g), g = min(gate, 7), up clamped to +-7).
// The experts are stored stacked and transposed against nn.Linear: gate_up_proj
// [E, hidden, 2 ffn] with gate and up interleaved in the columns, down_proj [E, ffn, hidden].
// prepare() rewrites them once into per-expert [out, in] matrices (same dtype) for the moe op.
// CPU only: the CUDA backend has neither the sinks nor the activation (supports refuses it).
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "model/hf_json.h"
#include "model/model.h"
#include "model/moe.h"
#include "util/err.h"

typedef struct gptoss_globals {
    kaon_linear tok_embd;   // [vocab, dim]
    kaon_tensor out_norm;   // [dim]
    kaon_linear lm_head;    // [vocab, dim]; w.data NULL when tied
} gptoss_globals;

typedef struct gptoss_layer {
    kaon_tensor attn_norm, ffn_norm;   // [dim]
    kaon_linear wq, wk, wv, wo;        // with biases
    kaon_tensor sinks;                 // [n_heads] f32
    kaon_linear router;                // [E, dim] + bias [E]
    // As stored, each the w of a kaon_linear (2-D rows are read with their format companions):
    kaon_linear gate_up, gate_up_b;    // [E * dim, 2 ffn], [E, 2 ffn]
    kaon_linear down, down_b;          // [E * ffn, dim], [E, dim]
    kaon_moe_layer moe;                // per-expert views, built by prepare
} gptoss_layer;

#define G(f) false, offsetof(gptoss_globals, f)
#define L(f) true, offsetof(gptoss_layer, f)
#define HF "model.layers.%d."
enum { HID = KAON_DIM_HIDDEN, Q = KAON_DIM_Q, KV = KAON_DIM_KV, E = KAON_DIM_EXPERTS, F2 = KAON_DIM_EXP_FFN2 };
#define BIAS KAON_WHEN_ATTN_BIAS, KAON_W_F32

static const kaon_weight_spec weights[] = {
    {NULL, "model.embed_tokens.weight", G(tok_embd.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_VOCAB},
    {NULL, "model.norm.weight", G(out_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {NULL, "lm_head.weight", G(lm_head.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_UNTIED, 0, KAON_SHARD_VOCAB},
    {NULL, HF "input_layernorm.weight", L(attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {NULL, HF "self_attn.q_proj.weight", L(wq.w), 2, {Q, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "self_attn.k_proj.weight", L(wk.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "self_attn.v_proj.weight", L(wv.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "self_attn.o_proj.weight", L(wo.w), 2, {HID, Q}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
    {NULL, HF "self_attn.q_proj.bias", L(wq.bias), 1, {Q}, BIAS, KAON_SHARD_COL},
    {NULL, HF "self_attn.k_proj.bias", L(wk.bias), 1, {KV}, BIAS, KAON_SHARD_COL},
    {NULL, HF "self_attn.v_proj.bias", L(wv.bias), 1, {KV}, BIAS, KAON_SHARD_COL},
    {NULL, HF "self_attn.o_proj.bias", L(wo.bias), 1, {HID}, BIAS, 0},
    {NULL, HF "self_attn.sinks", L(sinks), 1, {KAON_DIM_HEADS}, KAON_WHEN_ALWAYS, KAON_W_F32, 0},
    {NULL, HF "post_attention_layernorm.weight", L(ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {NULL, HF "mlp.router.weight", L(router.w), 2, {E, HID}, KAON_WHEN_ALWAYS, 0, 0},
    {NULL, HF "mlp.router.bias", L(router.bias), 1, {E}, KAON_WHEN_ALWAYS, KAON_W_F32, 0},
    {NULL, HF "mlp.experts.gate_up_proj", L(gate_up.w), 2, {KAON_DIM_EXP_HID, F2}, KAON_WHEN_ALWAYS, KAON_W_FLAT3, KAON_SHARD_EXPERT},
    {NULL, HF "mlp.experts.gate_up_proj_bias", L(gate_up_b.w), 2, {E, F2}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_EXPERT},
    {NULL, HF "mlp.experts.down_proj", L(down.w), 2, {KAON_DIM_EXP_FFN, HID}, KAON_WHEN_ALWAYS, KAON_W_FLAT3, KAON_SHARD_EXPERT},
    {NULL, HF "mlp.experts.down_proj_bias", L(down_b.w), 2, {E, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_EXPERT},
};

// ---- config ------------------------------------------------------------------------------

static int hf_config(const char *file, const cJSON *root, kaon_model_config *c) {
    // GptOssConfig's defaults where a key is absent.
    if (!kaon_hf_field(root, "attention_bias")) c->attention_bias = true;
    if (!kaon_hf_field(root, "rope_theta") && !kaon_hf_field(root, "rope_parameters")) c->rope_theta = 150000.0f;
    c->n_experts = 128;
    c->n_experts_used = 4;
    c->sliding_window = 128;
    c->rope_interleaved = false;
    // swiglu_limit: HF's GptOssExperts hard-codes 7.0, the value of the released configs.
    float limit = 7.0f;
    if (kaon_hf_get_int(file, root, "", "num_local_experts", &c->n_experts, NULL) ||
        kaon_hf_get_int(file, root, "", "experts_per_token", &c->n_experts_used, NULL) ||
        kaon_hf_get_int(file, root, "", "num_experts_per_tok", &c->n_experts_used, NULL) ||
        kaon_hf_get_int(file, root, "", "sliding_window", &c->sliding_window, NULL) ||
        kaon_hf_get_float(file, root, "", "swiglu_limit", &limit, NULL))
        return -1;
    if (c->n_experts < 1 || c->n_experts_used < 1 || c->n_experts_used > c->n_experts)
        return kaon_set_error("%s: gpt-oss needs 1 <= num_experts_per_tok <= num_local_experts", file);
    if (!(limit > 0)) return kaon_set_error("%s: swiglu_limit must be positive", file);
    c->moe_swiglu_limit = limit;
    c->moe_intermediate_size = c->intermediate_size;
    c->norm_topk_prob = true;  // softmax over the chosen logits
    c->moe_scoring = KAON_MOE_SOFTMAX;
    c->decoder_sparse_step = 1;
    // layer_types; HF's default: even layers slide, odd ones are full.
    memset(c->swa_layers, 0, sizeof c->swa_layers);
    const cJSON *types = kaon_hf_field(root, "layer_types");
    if (types && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers))
        return kaon_set_error("%s: \"layer_types\" must list one type per layer (%d)", file, c->n_layers);
    for (int l = 0; l < c->n_layers && l < KAON_MAX_MLP_ONLY_LAYERS; l++) {
        bool slide = l % 2 == 0;
        if (types) {
            const cJSON *e = cJSON_GetArrayItem(types, l);
            slide = cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention");
            if (!slide && !(cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")))
                return kaon_set_error("%s: \"layer_types\"[%d] must be sliding_attention or full_attention", file, l);
        }
        if (slide) c->swa_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    return 0;
}

// ---- the experts, rewritten for the moe op ------------------------------------------------


static void *owned(kaon_model *m, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        kaon_set_error("out of memory (%zu bytes for gpt-oss experts)", bytes);
        return NULL;
    }
    return kaon_model_own(m, p) ? NULL : p;
}

static kaon_tensor mat(kaon_dtype dt, int64_t rows, int64_t cols, void *data, size_t es) {
    kaon_tensor t = {.dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = data,
                     .nbytes = (size_t)rows * (size_t)cols * es};
    return t;
}

static kaon_tensor vec(int64_t n, float *data) {
    kaon_tensor t = {.dtype = KAON_F32, .ndim = 1, .shape = {n}, .data = data, .nbytes = (size_t)n * sizeof(float)};
    return t;
}

// Layer l: gate[e] [F, D] = gate_up[e][:, 0::2]^T, up[e] = gate_up[e][:, 1::2]^T,
// down[e] [D, F] = down_proj[e]^T; biases split and widened to f32.
static int build_experts(kaon_model *m, gptoss_layer *w) {
    const kaon_model_config *c = &m->cfg;
    const int nE = c->n_experts;
    const int64_t D = c->hidden_size, F = c->moe_intermediate_size;
    const kaon_dtype dt = w->gate_up.w.dtype;
    if ((dt != KAON_F32 && dt != KAON_BF16 && dt != KAON_F16) || w->down.w.dtype != dt)
        return kaon_set_error("%s: gpt-oss experts stored as %s / %s: kaon reads F32, BF16 or F16 here",
                              m->path, kaon_dtype_name(dt), kaon_dtype_name(w->down.w.dtype));
    const size_t es = dt == KAON_F32 ? 4 : 2, nEF = (size_t)nE * F, nED = (size_t)nE * D;
    char *g = owned(m, nEF * D * es), *u = owned(m, nEF * D * es), *dn = owned(m, nED * F * es);
    float *gb = owned(m, nEF * 4), *ub = owned(m, nEF * 4), *db = owned(m, nED * 4);
    kaon_linear *views = owned(m, (size_t)3 * nE * sizeof *views);
    if (!g || !u || !dn || !gb || !ub || !db || !views) return -1;
    const char *gu = w->gate_up.w.data, *dp = w->down.w.data;
    for (int64_t e = 0; e < nE; e++) {
        for (int64_t d = 0; d < D; d++) {
            const char *row = gu + ((size_t)(e * D + d) * 2 * F) * es;
            for (int64_t f = 0; f < F; f++) {
                memcpy(g + ((size_t)(e * F + f) * D + d) * es, row + (size_t)(2 * f) * es, es);
                memcpy(u + ((size_t)(e * F + f) * D + d) * es, row + (size_t)(2 * f + 1) * es, es);
            }
        }
        for (int64_t f = 0; f < F; f++)
            for (int64_t d = 0; d < D; d++)
                memcpy(dn + ((size_t)(e * D + d) * F + f) * es, dp + ((size_t)(e * F + f) * D + d) * es, es);
        for (int64_t f = 0; f < F; f++) {
            gb[e * F + f] = kaon_tensor_f32_at(&w->gate_up_b.w, (size_t)(e * 2 * F + 2 * f));
            ub[e * F + f] = kaon_tensor_f32_at(&w->gate_up_b.w, (size_t)(e * 2 * F + 2 * f + 1));
        }
        for (int64_t d = 0; d < D; d++) db[e * D + d] = kaon_tensor_f32_at(&w->down_b.w, (size_t)(e * D + d));
    }
    memset(views, 0, (size_t)3 * nE * sizeof *views);
    for (int e = 0; e < nE; e++) {
        views[e].w = mat(dt, F, D, g + (size_t)e * F * D * es, es);
        views[e].bias = vec(F, gb + (size_t)e * F);
        views[nE + e].w = mat(dt, F, D, u + (size_t)e * F * D * es, es);
        views[nE + e].bias = vec(F, ub + (size_t)e * F);
        views[2 * nE + e].w = mat(dt, D, F, dn + (size_t)e * D * F * es, es);
        views[2 * nE + e].bias = vec(D, db + (size_t)e * D);
    }
    kaon_moe_weights *mw = &w->moe.w;
    memset(&w->moe, 0, sizeof w->moe);
    w->moe.views = views;
    mw->n_experts = nE;
    mw->top_k = c->n_experts_used;
    mw->norm_topk = true;
    mw->scoring = KAON_MOE_SOFTMAX;
    mw->router = &w->router;
    mw->gate = views;
    mw->up = views + nE;
    mw->down = views + 2 * nE;
    mw->act = KAON_MOE_ACT_SWIGLU_OAI;
    mw->act_alpha = 1.702f;
    mw->act_limit = c->moe_swiglu_limit;
    return 0;
}

static int prepare(kaon_model *m) {
    const kaon_model_config *c = &m->cfg;
    if (m->format == KAON_FORMAT_DUMMY)
        return kaon_set_error("%s: gpt-oss has no dummy weights yet (its experts are rewritten at load)", m->path);
    if (c->sliding_window <= 0) return kaon_set_error("%s: gpt-oss needs sliding_window > 0", m->path);
    if (c->rope_dim != c->head_dim) return kaon_set_error("%s: gpt-oss rotates whole heads", m->path);
    if (kaon_model_build_rope(m, KAON_ROPE_GLOBAL, c->rope_theta, true, NULL)) return -1;
    for (int l = 0; l < c->n_layers; l++)
        if (build_experts(m, (gptoss_layer *)m->w.layers + l)) return -1;
    return 0;
}

static int supports(const kaon_backend *be) {
    if (be->ops->attention_sinks && !be->ops->upload) return 0;
    return kaon_set_error("gpt-oss needs attention sinks and the clamped SwiGLU experts, which only the "
                          "CPU backend has so far (this backend: %s)", be->ops->name);
}

// ---- forward -----------------------------------------------------------------------------

static void forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const gptoss_globals *g = f->w->globals;
    // HF multiplies cos and sin by YaRN's attention factor: q . k scales by its square.
    const float af = c->rope_attn_factor > 0 ? c->rope_attn_factor : 1.0f;
    const float scale = af * af / sqrtf((float)c->head_dim);
    kaon_blk_embed(f, b, &g->tok_embd);
    for (int l = 0; l < c->n_layers; l++) {
        const gptoss_layer *w = (const gptoss_layer *)f->w->layers + l;
        const bool local = kaon_layer_bit(c->swa_layers, l);
        kaon_blk_norm(f, b, &w->attn_norm);
        kaon_blk_qkv(f, b, &w->wq, &w->wk, &w->wv);
        kaon_blk_attention_sinks(f, b, l, &f->m->rope[KAON_ROPE_GLOBAL], local ? c->sliding_window : 0, scale,
                                 w->sinks.data);
        kaon_blk_out(f, b, &w->wo, f->a.att);
        kaon_blk_norm(f, b, &w->ffn_norm);
        kaon_blk_moe(f, b, l, &w->moe);
    }
    kaon_blk_logits(f, b, &g->out_norm, g->lm_head.w.data ? &g->lm_head : &g->tok_embd);
}

static const kaon_arch_name names[] = {
    {"GptOssForCausalLM", KAON_ARCH_GPTOSS},
    {"gpt_oss", KAON_ARCH_GPTOSS},
    {NULL, KAON_ARCH_UNKNOWN},
};

const kaon_arch_ops kaon_arch_gptoss = {
    .label = "gpt-oss",
    .names = names,
    .hf_config = hf_config,
    .weights = weights,
    .n_weights = sizeof weights / sizeof weights[0],
    .globals_size = sizeof(gptoss_globals),
    .layer_size = sizeof(gptoss_layer),
    .prepare = prepare,
    .supports = supports,
    .forward = forward,
};
