// The DeepSeek family: DeepSeek-V2 / V2-Lite (DeepseekV2ForCausalLM), DeepSeek-V3 / R1, Kimi-K2,
// Moonlight (DeepseekV3ForCausalLM, model_type kimi_k2), Kimi-K2.5's text model, and GGUF
// deepseek2 (llama.cpp's name for all of them). From transformers' modeling_deepseek_v2/v3.py
// and DeepSeek's inference/model.py:
// - MLA: q through q_a_proj -> RMSNorm -> q_b_proj (or q_proj when q_lora_rank is null), each
//   head [qk_nope | qk_rope]; kv_a_proj_with_mqa gives the latent c (kv_lora_rank, RMSNorm'd)
//   and ONE rotated key k_pe shared by all heads; kv_b_proj expands c into each head's k_nope
//   and v. RoPE rotates the qk_rope dims only, in adjacent pairs (V2's complex form, V3's
//   rope_interleave).
// - The cache keeps [c | k_pe] per token (model/arch.h kv_spec). Attention runs absorbed:
//   q_lat = q_nope W_UK (per head), scores q_lat.c + q_pe.k_pe, out = (sum p c) W_UV^T, so it is
//   MQA over one 576-wide key (mla_attention). W_UK^T and W_UV come from kv_b_proj at load, or
//   from GGUF's attn_k_b / attn_v_b.
// - softmax scale = qk_head_dim^-0.5 * yarn_mscale(factor, mscale_all_dim)^2 under YaRN, as
//   DeepSeek, vLLM and llama.cpp apply it (transformers' DeepseekV2 class leaves the mscale
//   out; its V3 class applies it). HF's cos/sin multiplier (attention_factor) multiplies q_pe.
// - DeepSeekMoE: first_k_dense_replace dense layers, then routed experts plus shared experts;
//   V2: softmax scores, greedy or group-limited greedy (a group's best score); V3/Kimi: sigmoid
//   scores, e_score_correction_bias for selection, noaux_tc groups (sum of the best two);
//   norm_topk_prob (V3 only, as HF), routed_scaling_factor. The router runs in f32.
// - MTP (num_nextn_predict_layers): the main forward never runs it. Loaded for speculative
//   decoding (kaon_model_load_mtp) as the last layer, with its enorm / hnorm / eh_proj /
//   shared_head; draft_forward is its step: x = eh_proj([enorm(embed(t_{p+1})) | hnorm(h_p)])
//   (the embedding zeroed at position 0, as vLLM), one decoder layer, then shared_head.norm and
//   shared_head.head. Its embed_tokens copy holds the main embedding's values: the main one is used.
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/quant_blocks.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/gguf_config.h"
#include "model/hf_json.h"
#include "model/model.h"
#include "model/moe.h"
#include "util/err.h"
#include "util/fp8.h"
#include "util/half.h"

typedef struct ds_globals {
    kaon_linear tok_embd;   // [vocab, dim]
    kaon_tensor out_norm;   // [dim]
    kaon_linear lm_head;    // [vocab, dim]; w.data NULL when tied
} ds_globals;

typedef struct ds_layer {
    kaon_tensor attn_norm;             // [dim]
    kaon_linear wq;                    // [nh*hd, dim] (q_lora_rank 0)
    kaon_linear wq_a;                  // [q_lora, dim]
    kaon_tensor q_a_norm;              // [q_lora]
    kaon_linear wq_b;                  // [nh*hd, q_lora]
    kaon_linear wkv_a;                 // [kv_lora + rope, dim]
    kaon_tensor kv_a_norm;             // [kv_lora]
    kaon_linear wkv_b;                 // [nh*(nope+v), kv_lora]: read by prepare only
    kaon_linear wk_b;                  // [nh*kv_lora, nope]: W_UK^T of each head
    kaon_linear wv_b;                  // [nh*v, kv_lora]: W_UV of each head
    kaon_linear wk_n;                  // [nh*nope, kv_lora]: W_UK of each head (expanded prefill)
    kaon_linear wo;                    // [dim, nh*v]
    kaon_tensor ffn_norm;              // [dim]
    kaon_linear w_gate, w_up, w_down;  // dense layers: [ffn, dim] [ffn, dim] [dim, ffn]
    kaon_tensor enorm, hnorm;          // MTP layer: [dim] each
    kaon_linear eh_proj;               // MTP layer: [dim, 2 dim] over [enorm(e) | hnorm(h)]
    kaon_tensor head_norm;             // MTP layer: shared_head.norm [dim]
    kaon_linear head;                  // MTP layer: shared_head.head [vocab, dim]
} ds_layer;

#define G(f) false, offsetof(ds_globals, f)
#define L(f) true, offsetof(ds_layer, f)
#define HF "model.layers.%d."
enum {
    HID = KAON_DIM_HIDDEN, Q = KAON_DIM_Q, QL = KAON_DIM_Q_LORA, KVL = KAON_DIM_KV_LORA,
    FFN = KAON_DIM_FFN, VB = KAON_DIM_V_B,
};

static const kaon_weight_spec weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", G(tok_embd.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_VOCAB},
    {"output_norm.weight", "model.norm.weight", G(out_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"output.weight", "lm_head.weight", G(lm_head.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_UNTIED, 0, KAON_SHARD_VOCAB},
    {"blk.%d.attn_norm.weight", HF "input_layernorm.weight", L(attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"blk.%d.attn_q.weight", HF "self_attn.q_proj.weight", L(wq.w), 2, {Q, HID}, KAON_WHEN_NO_Q_LORA, 0, KAON_SHARD_COL},
    {"blk.%d.attn_q_a.weight", HF "self_attn.q_a_proj.weight", L(wq_a.w), 2, {QL, HID}, KAON_WHEN_Q_LORA, 0, 0},
    {"blk.%d.attn_q_a_norm.weight", HF "self_attn.q_a_layernorm.weight", L(q_a_norm), 1, {QL}, KAON_WHEN_Q_LORA, KAON_W_NORM, 0},
    {"blk.%d.attn_q_b.weight", HF "self_attn.q_b_proj.weight", L(wq_b.w), 2, {Q, QL}, KAON_WHEN_Q_LORA, 0, KAON_SHARD_COL},
    {"blk.%d.attn_kv_a_mqa.weight", HF "self_attn.kv_a_proj_with_mqa.weight", L(wkv_a.w), 2, {KAON_DIM_KV_A, HID}, KAON_WHEN_ALWAYS, 0, 0},
    {"blk.%d.attn_kv_a_norm.weight", HF "self_attn.kv_a_layernorm.weight", L(kv_a_norm), 1, {KVL}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"blk.%d.attn_kv_b.weight", HF "self_attn.kv_b_proj.weight", L(wkv_b.w), 2, {KAON_DIM_KV_B, KVL}, KAON_WHEN_SOURCE, 0, KAON_SHARD_COL},
    {"blk.%d.attn_k_b.weight", NULL, L(wk_b.w), 2, {KAON_DIM_K_B, KAON_DIM_QK_NOPE}, KAON_WHEN_DERIVED, KAON_W_FLAT3, KAON_SHARD_COL},
    {"blk.%d.attn_v_b.weight", NULL, L(wv_b.w), 2, {VB, KVL}, KAON_WHEN_DERIVED, KAON_W_FLAT3, KAON_SHARD_COL},
    {"blk.%d.attn_k_n.weight", NULL, L(wk_n.w), 2, {KAON_DIM_K_N, KVL}, KAON_WHEN_DERIVED, 0, KAON_SHARD_COL},
    {"blk.%d.attn_output.weight", HF "self_attn.o_proj.weight", L(wo.w), 2, {HID, VB}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
    {"blk.%d.ffn_norm.weight", HF "post_attention_layernorm.weight", L(ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {"blk.%d.ffn_gate.weight", HF "mlp.gate_proj.weight", L(w_gate.w), 2, {FFN, HID}, KAON_WHEN_DENSE_MLP, 0, KAON_SHARD_COL},
    {"blk.%d.ffn_up.weight", HF "mlp.up_proj.weight", L(w_up.w), 2, {FFN, HID}, KAON_WHEN_DENSE_MLP, 0, KAON_SHARD_COL},
    {"blk.%d.ffn_down.weight", HF "mlp.down_proj.weight", L(w_down.w), 2, {HID, FFN}, KAON_WHEN_DENSE_MLP, 0, KAON_SHARD_ROW},
    // Router (+ selection bias), routed and shared experts (model/moe.c).
    {"blk.%d.ffn_*_exps", HF "mlp.experts", true, 0, 0, {0}, KAON_WHEN_MOE_MLP, KAON_W_EXPERTS, KAON_SHARD_EXPERT},
    // The MTP layer's own tensors (loaded only as speculative decoding's draft model).
    {NULL, HF "enorm.weight", L(enorm), 1, {HID}, KAON_WHEN_MTP, KAON_W_NORM, 0},
    {NULL, HF "hnorm.weight", L(hnorm), 1, {HID}, KAON_WHEN_MTP, KAON_W_NORM, 0},
    {NULL, HF "eh_proj.weight", L(eh_proj.w), 2, {HID, KAON_DIM_HIDDEN2}, KAON_WHEN_MTP, 0, 0},
    {NULL, HF "shared_head.norm.weight", L(head_norm), 1, {HID}, KAON_WHEN_MTP, KAON_W_NORM, 0},
    {NULL, HF "shared_head.head.weight", L(head.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_MTP, 0, KAON_SHARD_VOCAB},
};

// ---- config ------------------------------------------------------------------------------

// The MLA widths; head_dim is the query/key width per head (nope + rope), and every query head
// has its own K/V before absorption (n_kv_heads = n_heads).
static int mla_dims(kaon_model_config *c, int qk_head, int rope) {
    c->head_dim = qk_head;
    c->rope_dim = rope;
    c->qk_nope_head_dim = qk_head - rope;
    c->n_kv_heads = c->n_heads;
    if (c->kv_lora_rank <= 0 || rope <= 0 || rope % 2 || c->qk_nope_head_dim <= 0 || c->v_head_dim <= 0 ||
        c->q_lora_rank < 0)
        return kaon_set_error("DeepSeek MLA: bad widths (kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head %d, "
                              "q_lora_rank %d)", c->kv_lora_rank, c->qk_nope_head_dim, rope, c->v_head_dim,
                              c->q_lora_rank);
    return 0;
}

// Layers [0, k) keep a dense MLP.
static void dense_first(kaon_model_config *c, int k) {
    for (int l = 0; l < k && l < KAON_MAX_MLP_ONLY_LAYERS; l++) c->mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
}

static int hf_config(const char *file, const cJSON *root, kaon_model_config *c) {
    const bool v3 = c->arch == KAON_ARCH_DEEPSEEK3;
    // DeepseekV2Config / DeepseekV3Config defaults where a key is absent.
    int nope = 128, rope = 64, n_shared = v3 ? 1 : 2, first_dense = v3 ? 3 : 0, freq = 1;
    char act[32] = "silu", scoring[16] = "", method[32] = "";
    c->kv_lora_rank = 512;
    c->v_head_dim = 128;
    c->q_lora_rank = 1536;
    c->n_experts = v3 ? 256 : 64;
    c->n_experts_used = v3 ? 8 : 6;
    c->moe_intermediate_size = v3 ? 2048 : 1407;
    c->moe_n_group = v3 ? 8 : 1;
    c->moe_topk_group = v3 ? 4 : 1;
    c->norm_topk_prob = v3;
    c->rope_interleaved = true;
    if (kaon_hf_field(root, "q_lora_rank") == NULL && cJSON_GetObjectItemCaseSensitive(root, "q_lora_rank"))
        c->q_lora_rank = 0;  // null: q_proj
    bool set;
    if (kaon_hf_get_int(file, root, "", "q_lora_rank", &c->q_lora_rank, NULL) ||
        kaon_hf_get_int(file, root, "", "kv_lora_rank", &c->kv_lora_rank, NULL) ||
        kaon_hf_get_int(file, root, "", "qk_nope_head_dim", &nope, NULL) ||
        kaon_hf_get_int(file, root, "", "qk_rope_head_dim", &rope, NULL) ||
        kaon_hf_get_int(file, root, "", "v_head_dim", &c->v_head_dim, NULL) ||
        kaon_hf_get_int(file, root, "", "n_routed_experts", &c->n_experts, &set) ||
        kaon_hf_get_int(file, root, "", "num_experts_per_tok", &c->n_experts_used, NULL) ||
        kaon_hf_get_int(file, root, "", "moe_intermediate_size", &c->moe_intermediate_size, NULL) ||
        kaon_hf_get_int(file, root, "", "n_shared_experts", &n_shared, NULL) ||
        kaon_hf_get_int(file, root, "", "first_k_dense_replace", &first_dense, NULL) ||
        kaon_hf_get_int(file, root, "", "moe_layer_freq", &freq, NULL) ||
        kaon_hf_get_int(file, root, "", "n_group", &c->moe_n_group, NULL) ||
        kaon_hf_get_int(file, root, "", "topk_group", &c->moe_topk_group, NULL) ||
        kaon_hf_get_float(file, root, "", "routed_scaling_factor", &c->moe_routed_scale, NULL) ||
        kaon_hf_get_bool(file, root, "norm_topk_prob", &c->norm_topk_prob) ||
        kaon_hf_get_bool(file, root, "rope_interleave", &c->rope_interleaved) ||
        kaon_hf_get_int(file, root, "", "num_nextn_predict_layers", &c->n_nextn_layers, NULL) ||
        kaon_hf_get_str(file, root, "hidden_act", act, sizeof act, NULL) ||
        kaon_hf_get_str(file, root, "scoring_func", scoring, sizeof scoring, NULL) ||
        kaon_hf_get_str(file, root, "topk_method", method, sizeof method, NULL))
        return -1;
    if (strcmp(act, "silu")) return kaon_set_error("%s: DeepSeek hidden_act '%s' is not supported (silu)", file, act);
    if (c->attention_bias) return kaon_set_error("%s: DeepSeek attention_bias is not supported", file);
    if (freq != 1) return kaon_set_error("%s: DeepSeek moe_layer_freq %d is not supported (1)", file, freq);
    if (!v3) c->rope_interleaved = true;  // V2 rotates complex pairs whatever the config says
    if (mla_dims(c, nope + rope, rope)) return -1;
    if (!kaon_hf_field(root, "n_routed_experts") && cJSON_GetObjectItemCaseSensitive(root, "n_routed_experts"))
        c->n_experts = 0;  // null: a dense model
    if (c->n_experts <= 0) {
        c->n_experts = 0;
        return 0;
    }
    c->shared_expert_intermediate_size = c->moe_intermediate_size * (n_shared > 0 ? n_shared : 0);
    dense_first(c, first_dense);
    if (v3) {
        // DeepseekV3MoE: sigmoid scores, the selection bias, noaux_tc groups, whatever
        // scoring_func and topk_method say.
        c->moe_scoring = KAON_MOE_SIGMOID;
        c->moe_score_bias = true;
        c->moe_group_top2 = true;
        return 0;
    }
    // DeepseekV2Moe: softmax; greedy or group_limited_greedy; weights times the scaling factor
    // (norm_topk_prob is not applied).
    if (scoring[0] && strcmp(scoring, "softmax"))
        return kaon_set_error("%s: DeepSeek-V2 scoring_func '%s' is not supported (softmax)", file, scoring);
    c->moe_scoring = KAON_MOE_SOFTMAX;
    c->norm_topk_prob = false;
    if (!method[0] || !strcmp(method, "greedy")) c->moe_n_group = 1;
    else if (strcmp(method, "group_limited_greedy"))
        return kaon_set_error("%s: DeepSeek-V2 topk_method '%s' is not supported (greedy, group_limited_greedy)",
                              file, method);
    return 0;
}

static int gguf_config(const kaon_gguf *g, kaon_model_config *c) {
    // llama.cpp's deepseek2: no permutation of the rope dims (they rotate in adjacent pairs).
    c->rope_interleaved = true;
    c->q_lora_rank = (int)kaon_gguf_arch_int(g, c, "attention.q_lora_rank", 0);
    c->kv_lora_rank = (int)kaon_gguf_arch_int(g, c, "attention.kv_lora_rank", 0);
    // Files written for MLA-as-MQA give key_length 576 / value_length 512 and the per-head
    // widths as *_mla; older ones give the per-head widths directly.
    const int qk_head = (int)kaon_gguf_arch_int(g, c, "attention.key_length_mla",
                                                kaon_gguf_arch_int(g, c, "attention.key_length", 0));
    c->v_head_dim = (int)kaon_gguf_arch_int(g, c, "attention.value_length_mla",
                                            kaon_gguf_arch_int(g, c, "attention.value_length", 0));
    const int rope = (int)kaon_gguf_arch_int(g, c, "rope.dimension_count", 64);
    if (mla_dims(c, qk_head, rope)) return -1;
    kaon_moe_config_from_gguf(g, c);
    if (c->n_experts <= 0) return 0;
    const int n_shared = (int)kaon_gguf_arch_int(g, c, "expert_shared_count", 0);
    c->shared_expert_intermediate_size = c->moe_intermediate_size * n_shared;
    c->norm_topk_prob = kaon_gguf_get_bool(g, "deepseek2.expert_weights_norm", false);
    c->moe_routed_scale = (float)kaon_gguf_arch_float(g, c, "expert_weights_scale", 1.0);
    if (!(c->moe_routed_scale > 0.0f)) c->moe_routed_scale = 1.0f;
    // llama.cpp's gating function: 1 softmax (V2), 2 sigmoid (V3).
    const int64_t gating = kaon_gguf_arch_int(g, c, "expert_gating_func", 1);
    if (gating != 1 && gating != 2)
        return kaon_set_error("deepseek2: expert_gating_func %lld is not supported (1 softmax, 2 sigmoid)",
                              (long long)gating);
    c->moe_scoring = gating == 2 ? KAON_MOE_SIGMOID : KAON_MOE_SOFTMAX;
    c->moe_group_top2 = gating == 2;
    c->moe_n_group = (int)kaon_gguf_arch_int(g, c, "expert_group_count", 1);
    c->moe_topk_group = (int)kaon_gguf_arch_int(g, c, "expert_group_used_count", c->moe_n_group);
    const int first_moe = (int)kaon_gguf_arch_int(g, c, "leading_dense_block_count", 0);
    char name[96];
    snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", first_moe);
    c->moe_score_bias = kaon_gguf_find_tensor(g, name) != NULL;
    return 0;
}

// ---- prepare: the absorbed per-head matrices from kv_b_proj --------------------------------

// Row r of a [rows, cols] matrix of any float or GGUF block format, or FP8 with block scales,
// as floats.
static int row_f32(const kaon_linear *l, int64_t r, float *out) {
    const kaon_tensor *t = &l->w;
    const int64_t cols = t->shape[1];
    const size_t rb = kaon_dtype_row_bytes(t->dtype, cols);
    const char *row = (const char *)t->data + (size_t)r * rb;
    switch (t->dtype) {
    case KAON_F32: memcpy(out, row, sizeof(float) * (size_t)cols); return 0;
    case KAON_BF16:
        for (int64_t i = 0; i < cols; i++) out[i] = kaon_bf16_to_f32(((const uint16_t *)row)[i]);
        return 0;
    case KAON_F16:
        for (int64_t i = 0; i < cols; i++) out[i] = kaon_f16_to_f32(((const uint16_t *)row)[i]);
        return 0;
    case KAON_FP8_E4M3: {  // the same f32 product the CPU linear forms (cpu_fp8.c)
        if (!kaon_linear_is_fp8_block(l)) return kaon_set_error("kv_b_proj: FP8 without block scales");
        const int64_t b0 = l->scale_block[0], b1 = l->scale_block[1], sc = (cols + b1 - 1) / b1;
        const float *s = (const float *)l->scale.data + (size_t)(r / b0) * (size_t)sc;
        for (int64_t i = 0; i < cols; i++) out[i] = kaon_e4m3_to_f32((uint8_t)row[i]) * s[i / b1];
        return 0;
    }
    default: break;
    }
    const int be = kaon_dtype_block_elems(t->dtype), bb = kaon_dtype_block_bytes(t->dtype);
    if (!kaon_qb_known(t->dtype) || be <= 0) return kaon_set_error("kv_b_proj: format %s", kaon_dtype_name(t->dtype));
    for (int64_t b = 0; b < cols / be; b++)
        for (int c32 = 0; c32 < be / 32; c32++)
            if (kaon_qb_dequant32(t->dtype, row + (size_t)b * bb, c32, out + b * be + c32 * 32)) return -1;
    return 0;
}

static kaon_tensor f32_matrix(float *data, int64_t rows, int64_t cols) {
    kaon_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = KAON_F32;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = data;
    t.nbytes = sizeof(float) * (size_t)(rows * cols);
    return t;
}

// W = kv_b_proj [nh * (nope + v), kv_lora]: head h's rows are [k_nope (nope) | v (v)].
// W_UK^T[h] [kv_lora, nope] = (its k_nope rows)^T; W_UV[h] [v, kv_lora] = its v rows.
static int absorb(kaon_model *m, ds_layer *w) {
    const kaon_model_config *c = &m->cfg;
    const int64_t nh = c->n_heads, nope = c->qk_nope_head_dim, vh = c->v_head_dim, kvl = c->kv_lora_rank;
    float *kb = malloc(sizeof(float) * (size_t)(nh * kvl * nope));
    float *vb = malloc(sizeof(float) * (size_t)(nh * vh * kvl));
    float *row = malloc(sizeof(float) * (size_t)kvl);
    int rc = kb && vb && row ? 0 : kaon_set_error("out of memory");
    for (int64_t h = 0; !rc && h < nh; h++)
        for (int64_t i = 0; !rc && i < nope + vh; i++) {
            rc = row_f32(&w->wkv_b, h * (nope + vh) + i, row);
            for (int64_t j = 0; !rc && j < kvl; j++) {
                if (i < nope) kb[(h * kvl + j) * nope + i] = row[j];
                else vb[(h * vh + i - nope) * kvl + j] = row[j];
            }
        }
    free(row);
    if (rc) {
        free(kb);
        free(vb);
        return -1;
    }
    // kaon_model_own frees its buffer when it fails; the other one is then freed here.
    if (kaon_model_own(m, kb)) {
        free(vb);
        return -1;
    }
    if (kaon_model_own(m, vb)) return -1;
    w->wk_b.w = f32_matrix(kb, nh * kvl, nope);
    w->wv_b.w = f32_matrix(vb, nh * vh, kvl);
    memset(&w->wkv_b.w, 0, sizeof w->wkv_b.w);  // used up: never uploaded, counted once
    memset(&w->wkv_b.scale, 0, sizeof w->wkv_b.scale);
    return 0;
}

// wk_n [nh * nope, kv_lora] from wk_b [nh * kv_lora, nope] (any stored format): per head, the
// transpose.
static int expand_weights(kaon_model *m, ds_layer *w) {
    const kaon_model_config *c = &m->cfg;
    const int64_t nh = c->n_heads, nope = c->qk_nope_head_dim, kvl = c->kv_lora_rank;
    float *kn = malloc(sizeof(float) * (size_t)(nh * nope * kvl));
    float *row = malloc(sizeof(float) * (size_t)nope);
    int rc = kn && row ? 0 : kaon_set_error("out of memory");
    for (int64_t h = 0; !rc && h < nh; h++)
        for (int64_t j = 0; !rc && j < kvl; j++) {
            rc = row_f32(&w->wk_b, h * kvl + j, row);
            for (int64_t i = 0; !rc && i < nope; i++) kn[(h * nope + i) * kvl + j] = row[i];
        }
    free(row);
    if (rc) {
        free(kn);
        return -1;
    }
    if (kaon_model_own(m, kn)) return -1;
    w->wk_n.w = f32_matrix(kn, nh * nope, kvl);
    return 0;
}

static int prepare(kaon_model *m) {
    const kaon_model_config *c = &m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        ds_layer *w = (ds_layer *)m->w.layers + l;
        if (!w->wk_b.w.data || !w->wv_b.w.data) {
            if (!w->wkv_b.w.data)
                return kaon_set_error("%s: layer %d has neither kv_b_proj nor attn_k_b/attn_v_b", m->path, l);
            if (absorb(m, w)) return -1;
        }
        if (!w->wk_n.w.data && expand_weights(m, w)) return -1;
    }
    return kaon_model_build_rope(m, KAON_ROPE_GLOBAL, c->rope_theta, true, NULL);
}

static void kv_spec(const kaon_model_config *c, int l, size_t *k, size_t *v) {
    (void)l;
    *k = (size_t)c->kv_lora_rank + (size_t)c->rope_dim;  // [c | k_pe]: K, and V is its first part
    *v = 0;
}

// MLA's scratch, and MTP's [enorm(e) | hnorm(h)] rows after it.
static size_t scratch_elems(const kaon_model_config *c) {
    // + 128 elements: room to start the MTP rows on a 256-byte boundary (draft_forward)
    return kaon_blk_mla_scratch(c) + (c->n_mtp_layers > 0 ? 2 * (size_t)c->hidden_size + 128 : 0);
}

static int supports(const kaon_backend *be) {
    const kaon_backend_ops *o = be->ops;
    if (!o->mla_attention || !o->head_linear || !o->copy_strided)
        return kaon_set_error("the %s backend cannot run MLA (DeepSeek) models yet", o->name);
    return 0;
}

// ---- forward -----------------------------------------------------------------------------

// One decoder layer on the residual stream x: MLA attention, then the dense MLP or the experts.
static void decoder_layer(kaon_fwd *f, const kaon_batch *b, int l) {
    const kaon_model_config *c = f->c;
    // DeepSeek's softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN.
    double scale = 1.0 / sqrt((double)c->head_dim);
    if (c->rope_scaling == KAON_ROPE_SCALING_YARN && c->rope_mscale_all_dim != 0.0f) {
        const double ms = kaon_yarn_mscale(c->rope_factor, c->rope_mscale_all_dim);
        scale *= ms * ms;
    }
    const float pe_scale = c->rope_attn_factor * c->rope_attn_factor;  // HF's cos/sin factor, on q and k
    const ds_layer *w = (const ds_layer *)f->w->layers + l;
    const bool split = f->op->norm_moe_residual != NULL && !f->tp;
    const kaon_mla_weights mla = {
        .wq = c->q_lora_rank > 0 ? NULL : &w->wq, .wq_a = &w->wq_a, .q_a_norm = &w->q_a_norm,
        .wq_b = &w->wq_b, .wkv_a = &w->wkv_a, .kv_a_norm = &w->kv_a_norm, .wk_b = &w->wk_b,
        .wv_b = &w->wv_b, .wo = &w->wo, .wk_n = w->wk_n.w.data ? &w->wk_n : NULL,
        // The split norms around MLA and the experts ride with the fused MoE op (KAON_MOE_NORM_FUSE=1
        // on CUDA; opt-in, slower on Qwen3-30B-A3B); without it the layer runs its norm ops as before.
        .norm = split ? &w->attn_norm : NULL, .next_norm = split ? &w->ffn_norm : NULL};
    if (!split) kaon_blk_norm(f, b, &w->attn_norm);
    kaon_blk_mla(f, b, l, &mla, &f->m->rope[KAON_ROPE_GLOBAL], (float)scale, pe_scale);
    // The norm that reads x after this layer: the next decoder layer's (not the MTP layer's).
    const kaon_tensor *next = split && l + 1 < c->n_layers - c->n_mtp_layers ? &w[1].attn_norm : NULL;
    if (kaon_model_layer_is_moe(f->m, l)) {
        if (!kaon_blk_norm_moe(f, b, l, &w->ffn_norm, 1.0f, next)) {
            kaon_blk_norm(f, b, &w->ffn_norm);
            kaon_blk_moe(f, b, l, &f->w->moe[l]);
        }
    } else if (split) {
        kaon_blk_norm_mlp(f, b, &w->ffn_norm, &w->w_gate, &w->w_up, &w->w_down, 1.0f, next);
    } else {
        kaon_blk_norm(f, b, &w->ffn_norm);
        kaon_blk_mlp(f, b, KAON_ACT_SILU, &w->w_gate, &w->w_up, &w->w_down);
    }
}

static void forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const ds_globals *g = f->w->globals;
    kaon_blk_embed(f, b, &g->tok_embd);
    for (int l = 0; l < c->n_layers - c->n_mtp_layers; l++) decoder_layer(f, b, l);
    kaon_blk_logits(f, b, &g->out_norm, g->lm_head.w.data ? &g->lm_head : &g->tok_embd);
}

// The MTP layer's step (arch.h draft_forward): row t is token t_{p+1} at position p with the
// hidden input f->hin[t] (h_p).
static void draft_forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const kaon_backend_ops *op = f->op;
    const ds_globals *g = f->w->globals;
    const int l = c->n_layers - c->n_mtp_layers, T = b->n_tokens, dim = c->hidden_size;
    const ds_layer *w = (const ds_layer *)f->w->layers + l;
    const size_t eb = op->act_elem_bytes;
    // [T, 2 dim] after MLA's scratch, 256-byte aligned: cuBLASLt refuses a misaligned operand
    // (CUBLAS_STATUS_NOT_SUPPORTED on the tiny test model, whose MLA scratch is not a multiple of 8)
    const size_t cat_off = (eb * (size_t)T * kaon_blk_mla_scratch(c) + 255) & ~(size_t)255;
    char *cat = (char *)f->a.scratch + cat_off;
    kaon_blk_embed(f, b, &g->tok_embd);                                            // x = e [T, dim]
    for (int t = 0; t < T; t++)  // position 0 has no previous token: its embedding is zeroed (vLLM)
        if (b->attn.positions[t] == 0) op->scale(f->be, (char *)f->a.x + eb * (size_t)t * dim, (size_t)dim, 0.0f);
    op->rmsnorm(f->be, f->a.x, NULL, &w->enorm, c->rms_norm_eps, T, dim, f->a.xn);
    op->copy_strided(f->be, f->a.xn, (size_t)dim, cat, 2 * (size_t)dim, T, dim, 1.0f);
    op->rmsnorm(f->be, (void *)f->hin, NULL, &w->hnorm, c->rms_norm_eps, T, dim, f->a.xn);
    op->copy_strided(f->be, f->a.xn, (size_t)dim, cat + eb * (size_t)dim, 2 * (size_t)dim, T, dim, 1.0f);
    op->linear(f->be, cat, T, &w->eh_proj, f->a.x);                                // x [T, dim]
    f->pending = false;
    decoder_layer(f, b, l);
    kaon_blk_logits(f, b, &w->head_norm, &w->head);
}

static const kaon_arch_name names[] = {
    {"DeepseekV2ForCausalLM", KAON_ARCH_DEEPSEEK2},
    {"deepseek_v2", KAON_ARCH_DEEPSEEK2},
    {"deepseek2", KAON_ARCH_DEEPSEEK2},
    {"DeepseekV3ForCausalLM", KAON_ARCH_DEEPSEEK3},
    {"deepseek_v3", KAON_ARCH_DEEPSEEK3},
    {"kimi_k2", KAON_ARCH_DEEPSEEK3},
    {NULL, KAON_ARCH_UNKNOWN},
};

const kaon_arch_ops kaon_arch_deepseek2 = {
    .label = "deepseek2",
    .names = names,
    .hf_config = hf_config,
    .gguf_config = gguf_config,
    .weights = weights,
    .n_weights = sizeof weights / sizeof weights[0],
    .globals_size = sizeof(ds_globals),
    .layer_size = sizeof(ds_layer),
    .prepare = prepare,
    .kv_spec = kv_spec,
    .scratch_elems = scratch_elems,
    .supports = supports,
    .forward = forward,
    .draft_forward = draft_forward,
};
