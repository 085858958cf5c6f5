// The Llama family: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm) and
// their mixture-of-experts variants (Mixtral, Qwen2-MoE, Qwen3-MoE): config keys, the weight
// table and the forward pass.
#include <stddef.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "model/gguf_config.h"
#include "model/hf_json.h"
#include "model/model.h"
#include "model/moe.h"
#include "util/err.h"

typedef struct llama_globals {
    kaon_linear tok_embd;     // [vocab, dim]
    kaon_tensor out_norm;     // [dim]
    kaon_linear lm_head;      // [vocab, dim]; w.data NULL when tied to the embedding
    kaon_tensor rope_freqs;   // [rope_dim/2] GGUF llama3 divisors (host only), or absent
} llama_globals;

typedef struct llama_layer {
    kaon_tensor attn_norm;         // [dim]
    kaon_linear wq, wk, wv, wo;    // [nh*hd, dim] [nkv*hd, dim] [nkv*hd, dim] [dim, nh*hd]
    kaon_tensor q_norm, k_norm;    // [hd] (Qwen3)
    kaon_tensor ffn_norm;          // [dim]
    kaon_linear w_gate, w_up, w_down;  // [ffn, dim] [ffn, dim] [dim, ffn]; dense-MLP layers
} llama_layer;

#define G(f) false, offsetof(llama_globals, f)
#define L(f) true, offsetof(llama_layer, f)
#define HF "model.layers.%d."
enum { HID = KAON_DIM_HIDDEN, Q = KAON_DIM_Q, KV = KAON_DIM_KV, HD = KAON_DIM_HEAD, FFN = KAON_DIM_FFN };

static const kaon_weight_spec weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", G(tok_embd.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_VOCAB},
    {"output_norm.weight", "model.norm.weight", G(out_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"output.weight", "lm_head.weight", G(lm_head.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_UNTIED, 0, KAON_SHARD_VOCAB},
    {"rope_freqs.weight", NULL, G(rope_freqs), 1, {KAON_DIM_ROPE_HALF}, KAON_WHEN_OPTIONAL, KAON_W_HOST, 0},
    {"blk.%d.attn_norm.weight", HF "input_layernorm.weight", L(attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"blk.%d.attn_q.weight", HF "self_attn.q_proj.weight", L(wq.w), 2, {Q, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.attn_k.weight", HF "self_attn.k_proj.weight", L(wk.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.attn_v.weight", HF "self_attn.v_proj.weight", L(wv.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.attn_output.weight", HF "self_attn.o_proj.weight", L(wo.w), 2, {HID, Q}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
    {"blk.%d.attn_q.bias", HF "self_attn.q_proj.bias", L(wq.bias), 1, {Q}, KAON_WHEN_ATTN_BIAS, KAON_W_F32, KAON_SHARD_COL},
    {"blk.%d.attn_k.bias", HF "self_attn.k_proj.bias", L(wk.bias), 1, {KV}, KAON_WHEN_ATTN_BIAS, KAON_W_F32, KAON_SHARD_COL},
    {"blk.%d.attn_v.bias", HF "self_attn.v_proj.bias", L(wv.bias), 1, {KV}, KAON_WHEN_ATTN_BIAS, KAON_W_F32, KAON_SHARD_COL},
    {"blk.%d.attn_q_norm.weight", HF "self_attn.q_norm.weight", L(q_norm), 1, {HD}, KAON_WHEN_QK_NORM, KAON_W_NORM, 0},
    {"blk.%d.attn_k_norm.weight", HF "self_attn.k_norm.weight", L(k_norm), 1, {HD}, KAON_WHEN_QK_NORM, KAON_W_NORM, 0},
    {"blk.%d.ffn_norm.weight", HF "post_attention_layernorm.weight", L(ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"blk.%d.ffn_gate.weight", HF "mlp.gate_proj.weight", L(w_gate.w), 2, {FFN, HID}, KAON_WHEN_DENSE_MLP, 0, KAON_SHARD_COL},
    {"blk.%d.ffn_up.weight", HF "mlp.up_proj.weight", L(w_up.w), 2, {FFN, HID}, KAON_WHEN_DENSE_MLP, 0, KAON_SHARD_COL},
    {"blk.%d.ffn_down.weight", HF "mlp.down_proj.weight", L(w_down.w), 2, {HID, FFN}, KAON_WHEN_DENSE_MLP, 0, KAON_SHARD_ROW},
    // Routers, experts and shared experts, in whichever layout the file has (model/moe.c).
    {"blk.%d.ffn_*_exps", HF "mlp.experts", true, 0, 0, {0}, KAON_WHEN_MOE_MLP, KAON_W_EXPERTS, KAON_SHARD_EXPERT},
};

// ---- config ------------------------------------------------------------------------------

// Mixture of experts: Mixtral (num_local_experts, every layer, always renormalised) and
// Qwen2-MoE / Qwen3-MoE (num_experts, moe_intermediate_size, norm_topk_prob,
// decoder_sparse_step, mlp_only_layers; Qwen2-MoE's shared expert). HF's defaults apply when a
// key is absent.
static int moe_fields(const char *file, const cJSON *root, kaon_model_config *c) {
    const bool mixtral = !strcmp(c->arch_name, "MixtralForCausalLM") || !strcmp(c->arch_name, "mixtral");
    const bool qwen_moe = !strcmp(c->arch_name, "Qwen2MoeForCausalLM") ||
                          !strcmp(c->arch_name, "Qwen3MoeForCausalLM") ||
                          !strcmp(c->arch_name, "qwen2_moe") || !strcmp(c->arch_name, "qwen3_moe");
    if (!mixtral && !qwen_moe) return 0;
    bool set;
    c->n_experts_used = 2;
    if (kaon_hf_get_int(file, root, "", "num_experts_per_tok", &c->n_experts_used, NULL)) return -1;
    if (mixtral) {
        c->n_experts = 8;
        if (kaon_hf_get_int(file, root, "", "num_local_experts", &c->n_experts, NULL)) return -1;
        c->moe_intermediate_size = c->intermediate_size;
        c->norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises over the top-k
        return 0;
    }
    c->n_experts = 60;
    c->moe_intermediate_size = 1408;
    c->norm_topk_prob = false;
    if (kaon_hf_get_int(file, root, "", "num_experts", &c->n_experts, NULL) ||
        kaon_hf_get_int(file, root, "", "moe_intermediate_size", &c->moe_intermediate_size, NULL) ||
        kaon_hf_get_int(file, root, "", "decoder_sparse_step", &c->decoder_sparse_step, NULL) ||
        kaon_hf_get_bool(file, root, "norm_topk_prob", &c->norm_topk_prob))
        return -1;
    if (!strncmp(c->arch_name, "Qwen2", 5) || !strcmp(c->arch_name, "qwen2_moe")) {
        c->shared_expert_intermediate_size = 5632;
        c->shared_expert_gated = true;
        if (kaon_hf_get_int(file, root, "", "shared_expert_intermediate_size",
                            &c->shared_expert_intermediate_size, &set) ||
            kaon_hf_get_bool(file, root, "qkv_bias", &c->attention_bias))
            return -1;
    }
    const cJSON *only = kaon_hf_field(root, "mlp_only_layers");
    if (only) {
        if (!cJSON_IsArray(only))
            return kaon_hf_type_error(file, "", "mlp_only_layers", "a list of layer indices", only);
        int i = 0;
        for (const cJSON *e = only->child; e; e = e->next, i++) {
            double d = cJSON_IsNumber(e) ? e->valuedouble : -1.0;
            if (!(d >= 0 && d < KAON_MAX_MLP_ONLY_LAYERS) || d != (double)(int)d)
                return kaon_set_error("%s: \"mlp_only_layers\"[%d] must be a layer index below %d",
                                      file, i, KAON_MAX_MLP_ONLY_LAYERS);
            c->mlp_only_layers[(int)d / 64] |= (uint64_t)1 << ((int)d % 64);
        }
    }
    return 0;
}

static int hf_config(const char *file, const cJSON *root, kaon_model_config *c) {
    // Qwen2 always has q/k/v biases (its config has no attention_bias key); Qwen3 normalises
    // q and k per head.
    if (c->arch == KAON_ARCH_QWEN2) c->attention_bias = true;
    c->qk_norm = c->arch == KAON_ARCH_QWEN3;
    return moe_fields(file, root, c);
}

static int gguf_config(const kaon_gguf *g, kaon_model_config *c) {
    // llama.cpp's converter permutes Q/K rows of `llama` files so that RoPE rotates adjacent
    // pairs; qwen2/qwen3 files are not permuted and keep NeoX pairs.
    c->rope_interleaved = c->arch == KAON_ARCH_LLAMA;
    c->attention_bias = c->arch == KAON_ARCH_QWEN2;
    c->qk_norm = c->arch == KAON_ARCH_QWEN3;
    kaon_moe_config_from_gguf(g, c);
    return 0;
}

static int prepare(kaon_model *m) {
    const llama_globals *g = m->w.globals;
    return kaon_model_build_rope(m, KAON_ROPE_GLOBAL, m->cfg.rope_theta, true, &g->rope_freqs);
}

// ---- forward -----------------------------------------------------------------------------

static void forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const llama_globals *g = f->w->globals;
    kaon_blk_embed(f, b, &g->tok_embd);  // x [T, dim]
    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *w = (const llama_layer *)f->w->layers + l;
        const kaon_llama_block blk = {
            .attn_norm = &w->attn_norm, .ffn_norm = &w->ffn_norm,
            .q_norm = c->qk_norm ? &w->q_norm : NULL, .k_norm = c->qk_norm ? &w->k_norm : NULL,  // Qwen3
            .wq = &w->wq, .wk = &w->wk, .wv = &w->wv, .wo = &w->wo,
            .w_gate = &w->w_gate, .w_up = &w->w_up, .w_down = &w->w_down,
            .next_norm = l + 1 < c->n_layers ? &w[1].attn_norm : NULL,
        };
        kaon_blk_aux(f, b, l, &w->attn_norm);  // an EAGLE-3 head's inputs
        kaon_blk_llama_layer(f, b, l, &blk);
    }
    kaon_blk_logits(f, b, &g->out_norm, g->lm_head.w.data ? &g->lm_head : &g->tok_embd);
}

static const kaon_arch_name names[] = {
    {"LlamaForCausalLM", KAON_ARCH_LLAMA},     {"MistralForCausalLM", KAON_ARCH_LLAMA},
    {"MixtralForCausalLM", KAON_ARCH_LLAMA},   {"Qwen2ForCausalLM", KAON_ARCH_QWEN2},
    {"Qwen2MoeForCausalLM", KAON_ARCH_QWEN2},  {"Qwen3ForCausalLM", KAON_ARCH_QWEN3},
    {"Qwen3MoeForCausalLM", KAON_ARCH_QWEN3},  {"llama", KAON_ARCH_LLAMA},
    {"qwen2", KAON_ARCH_QWEN2},                {"qwen2moe", KAON_ARCH_QWEN2},
    {"qwen3", KAON_ARCH_QWEN3},                {"qwen3moe", KAON_ARCH_QWEN3},
    {NULL, KAON_ARCH_UNKNOWN},
};

const kaon_arch_ops kaon_arch_llama = {
    .label = "llama",
    .names = names,
    .hf_config = hf_config,
    .gguf_config = gguf_config,
    .weights = weights,
    .n_weights = sizeof weights / sizeof weights[0],
    .globals_size = sizeof(llama_globals),
    .layer_size = sizeof(llama_layer),
    .prepare = prepare,
    .forward = forward,
};
