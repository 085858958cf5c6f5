// Gemma 3 (text): Gemma3ForCausalLM / model_type gemma3_text, GGUF gemma3.
// Differences from the Llama family, all from transformers' modeling_gemma3.py:
// - embeddings scaled by sqrt(hidden_size);
// - RMSNorm scales by (1 + w): HF files store w (folded to 1 + w at load), llama.cpp's GGUF
//   converter stores 1 + w already;
// - four norms per layer: input, post-attention (on the attention output, before the
//   residual add), pre-feedforward and post-feedforward; per-head q/k norms;
// - sliding-window attention on most layers (layer_types, or every layer but each
//   sliding_window_pattern-th), whose RoPE base is rope_local_base_freq without scaling; full
//   layers use rope_theta with rope_scaling;
// - attention scale query_pre_attn_scalar^-0.5; GELU-tanh gated MLP; tied LM head by default;
//   final logit soft-capping when the config sets it.
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "model/gguf_config.h"
#include "model/hf_json.h"
#include "model/model.h"
#include "util/err.h"
#include "util/half.h"

typedef struct gemma3_globals {
    kaon_linear tok_embd;   // [vocab, dim]
    kaon_tensor out_norm;   // [dim]
    kaon_linear lm_head;    // [vocab, dim]; w.data NULL when tied
} gemma3_globals;

typedef struct gemma3_layer {
    kaon_tensor attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;  // [dim]
    kaon_linear wq, wk, wv, wo;                                      // as Llama's
    kaon_tensor q_norm, k_norm;                                      // [hd]
    kaon_linear w_gate, w_up, w_down;                                // [ffn, dim] [ffn, dim] [dim, ffn]
} gemma3_layer;

#define G(f) false, offsetof(gemma3_globals, f)
#define L(f) true, offsetof(gemma3_layer, f)
#define HF "model.layers.%d."
enum { HID = KAON_DIM_HIDDEN, Q = KAON_DIM_Q, KV = KAON_DIM_KV, HD = KAON_DIM_HEAD, FFN = KAON_DIM_FFN };
#define NORM (KAON_W_NORM | KAON_W_PLUS_ONE_HF)

static const kaon_weight_spec weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", G(tok_embd.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_VOCAB},
    {"output_norm.weight", "model.norm.weight", G(out_norm), 1, {HID}, KAON_WHEN_ALWAYS, NORM, 0},
    {"output.weight", "lm_head.weight", G(lm_head.w), 2, {KAON_DIM_VOCAB, HID}, KAON_WHEN_UNTIED, 0, KAON_SHARD_VOCAB},
    {"blk.%d.attn_norm.weight", HF "input_layernorm.weight", L(attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, NORM, 0},
    {"blk.%d.attn_q.weight", HF "self_attn.q_proj.weight", L(wq.w), 2, {Q, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.attn_k.weight", HF "self_attn.k_proj.weight", L(wk.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.attn_v.weight", HF "self_attn.v_proj.weight", L(wv.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.attn_output.weight", HF "self_attn.o_proj.weight", L(wo.w), 2, {HID, Q}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
    {"blk.%d.attn_q.bias", HF "self_attn.q_proj.bias", L(wq.bias), 1, {Q}, KAON_WHEN_ATTN_BIAS, KAON_W_F32, KAON_SHARD_COL},
    {"blk.%d.attn_k.bias", HF "self_attn.k_proj.bias", L(wk.bias), 1, {KV}, KAON_WHEN_ATTN_BIAS, KAON_W_F32, KAON_SHARD_COL},
    {"blk.%d.attn_v.bias", HF "self_attn.v_proj.bias", L(wv.bias), 1, {KV}, KAON_WHEN_ATTN_BIAS, KAON_W_F32, KAON_SHARD_COL},
    {"blk.%d.attn_q_norm.weight", HF "self_attn.q_norm.weight", L(q_norm), 1, {HD}, KAON_WHEN_ALWAYS, NORM, 0},
    {"blk.%d.attn_k_norm.weight", HF "self_attn.k_norm.weight", L(k_norm), 1, {HD}, KAON_WHEN_ALWAYS, NORM, 0},
    {"blk.%d.post_attention_norm.weight", HF "post_attention_layernorm.weight", L(post_attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, NORM, 0},
    {"blk.%d.ffn_norm.weight", HF "pre_feedforward_layernorm.weight", L(ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, NORM, 0},
    {"blk.%d.ffn_gate.weight", HF "mlp.gate_proj.weight", L(w_gate.w), 2, {FFN, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.ffn_up.weight", HF "mlp.up_proj.weight", L(w_up.w), 2, {FFN, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {"blk.%d.ffn_down.weight", HF "mlp.down_proj.weight", L(w_down.w), 2, {HID, FFN}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
    {"blk.%d.post_ffw_norm.weight", HF "post_feedforward_layernorm.weight", L(post_ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, NORM, 0},
};

// ---- config ------------------------------------------------------------------------------

// Every pattern-th layer is global, the others slide (the older configs' sliding_window_pattern
// and llama.cpp's fixed period of 6).
static void swa_by_pattern(kaon_model_config *c, int pattern) {
    memset(c->swa_layers, 0, sizeof c->swa_layers);
    for (int l = 0; l < c->n_layers && l < KAON_MAX_MLP_ONLY_LAYERS; l++)
        if (pattern <= 0 || (l + 1) % pattern != 0) c->swa_layers[l / 64] |= (uint64_t)1 << (l % 64);
}

// transformers 5 writes RoPE as rope_parameters, per layer type when they differ:
// {"full_attention": {"rope_type", "rope_theta", "factor"}, "sliding_attention": {...}}.
static int rope_parameters(const char *file, const cJSON *root, kaon_model_config *c) {
    const cJSON *rp = kaon_hf_field(root, "rope_parameters");
    if (!rp) return 0;
    if (!cJSON_IsObject(rp)) return kaon_hf_type_error(file, "", "rope_parameters", "an object", rp);
    const cJSON *full = kaon_hf_field(rp, "full_attention"), *slide = kaon_hf_field(rp, "sliding_attention");
    if (!full && !slide) full = rp;  // one set for every layer
    if (slide && kaon_hf_get_float(file, slide, "rope_parameters.sliding_attention.", "rope_theta",
                                   &c->rope_local_theta, NULL))
        return -1;
    if (!full) return 0;
    if (!cJSON_IsObject(full)) return kaon_hf_type_error(file, "rope_parameters.", "full_attention", "an object", full);
    if (kaon_hf_get_float(file, full, "rope_parameters.", "rope_theta", &c->rope_theta, NULL)) return -1;
    const cJSON *t = kaon_hf_field(full, "rope_type");
    if (!t || (cJSON_IsString(t) && !strcmp(t->valuestring, "default"))) return 0;
    if (cJSON_IsString(t) && !strcmp(t->valuestring, "linear")) {
        c->rope_scaling = KAON_ROPE_SCALING_LINEAR;
        return kaon_hf_get_float(file, full, "rope_parameters.", "factor", &c->rope_factor, NULL);
    }
    return kaon_set_error("%s: Gemma 3 rope_type '%.40s' is not supported (default, linear)", file,
                          cJSON_IsString(t) ? t->valuestring : "?");
}

static int hf_config(const char *file, const cJSON *root, kaon_model_config *c) {
    // Gemma3TextConfig's defaults where a key is absent.
    if (!kaon_hf_field(root, "tie_word_embeddings")) c->tie_word_embeddings = true;
    if (!kaon_hf_field(root, "rope_theta")) c->rope_theta = 1000000.0f;
    c->sliding_window = 4096;
    c->rope_local_theta = 10000.0f;
    c->query_pre_attn_scalar = 256.0f;
    c->qk_norm = true;
    int pattern = 6;
    char act[32] = "gelu_pytorch_tanh";
    if (kaon_hf_get_int(file, root, "", "sliding_window", &c->sliding_window, NULL) ||
        kaon_hf_get_float(file, root, "", "rope_local_base_freq", &c->rope_local_theta, NULL) ||
        kaon_hf_get_float(file, root, "", "query_pre_attn_scalar", &c->query_pre_attn_scalar, NULL) ||
        kaon_hf_get_int(file, root, "", "sliding_window_pattern", &pattern, NULL) ||
        kaon_hf_get_str(file, root, "hidden_activation", act, sizeof act, NULL) ||
        rope_parameters(file, root, c))
        return -1;
    if (strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_tanh"))
        return kaon_set_error("%s: Gemma 3 hidden_activation '%s' is not supported (gelu_pytorch_tanh)", file, act);
    // final_logit_softcapping applies when set (null in the released models);
    // attn_logit_softcapping is in the config but Gemma3Attention never applies it.
    if (kaon_hf_get_float(file, root, "", "final_logit_softcapping", &c->final_logit_softcap, NULL)) return -1;
    if (c->final_logit_softcap < 0) return kaon_set_error("%s: final_logit_softcapping must be positive", file);
    swa_by_pattern(c, pattern);
    const cJSON *types = kaon_hf_field(root, "layer_types");
    if (!types) return 0;
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers)
        return kaon_set_error("%s: \"layer_types\" must list one type per layer (%d)", file, c->n_layers);
    memset(c->swa_layers, 0, sizeof c->swa_layers);
    int l = 0;
    for (const cJSON *e = types->child; e; e = e->next, l++) {
        const bool slide = cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention");
        if (!slide && !(cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")))
            return kaon_set_error("%s: \"layer_types\"[%d] must be sliding_attention or full_attention", file, l);
        if (slide && l < KAON_MAX_MLP_ONLY_LAYERS) c->swa_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    return 0;
}

static int gguf_config(const kaon_gguf *g, kaon_model_config *c) {
    // llama.cpp: NeoX RoPE, local base 10000 and a period of 6 fixed by the architecture; the
    // attention scale is head_dim^-0.5 except for the 27B model (hidden / heads).
    c->rope_interleaved = false;
    c->qk_norm = true;
    c->sliding_window = (int)kaon_gguf_arch_int(g, c, "attention.sliding_window", 4096);
    c->final_logit_softcap = (float)kaon_gguf_arch_float(g, c, "final_logit_softcapping", 0.0);
    c->rope_local_theta = 10000.0f;
    c->query_pre_attn_scalar = c->n_layers == 62 ? (float)c->hidden_size / c->n_heads : (float)c->head_dim;
    swa_by_pattern(c, 6);
    return 0;
}

static int prepare(kaon_model *m) {
    const kaon_model_config *c = &m->cfg;
    if (c->sliding_window <= 0) return kaon_set_error("%s: Gemma 3 needs sliding_window > 0", m->path);
    if (kaon_model_build_rope(m, KAON_ROPE_GLOBAL, c->rope_theta, true, NULL)) return -1;
    return kaon_model_build_rope(m, KAON_ROPE_LOCAL, c->rope_local_theta, false, NULL);
}

// ---- forward -----------------------------------------------------------------------------

static void forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const gemma3_globals *g = f->w->globals;
    const float scale = 1.0f / sqrtf(c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : (float)c->head_dim);
    f->norm_once = true;  // Gemma3RMSNorm: (x / rms(x)) * (1 + w) in f32, one rounding
    kaon_blk_embed(f, b, &g->tok_embd);                                  // x [T, dim]
    // HF casts the scale to the activations' dtype: bf16(sqrt(hidden)) on a bf16 backend.
    float embed_scale = sqrtf((float)c->hidden_size);
    if (f->op->act_elem_bytes == 2) embed_scale = kaon_bf16_to_f32(kaon_f32_to_bf16(embed_scale));
    kaon_blk_scale_x(f, b, embed_scale);
    for (int l = 0; l < c->n_layers; l++) {
        const gemma3_layer *w = (const gemma3_layer *)f->w->layers + l;
        const bool local = kaon_layer_bit(c->swa_layers, l);
        kaon_blk_norm(f, b, &w->attn_norm);
        kaon_blk_qkv(f, b, &w->wq, &w->wk, &w->wv);
        kaon_blk_qk_norm(f, b, &w->q_norm, &w->k_norm);
        kaon_blk_attention(f, b, l, &f->m->rope[local ? KAON_ROPE_LOCAL : KAON_ROPE_GLOBAL],
                           local ? c->sliding_window : 0, scale);
        kaon_blk_out(f, b, &w->wo, f->a.att);
        kaon_blk_post_norm(f, b, &w->post_attn_norm);                    // before joining x
        kaon_blk_norm(f, b, &w->ffn_norm);
        kaon_blk_mlp(f, b, KAON_ACT_GELU_TANH, &w->w_gate, &w->w_up, &w->w_down);
        kaon_blk_post_norm(f, b, &w->post_ffn_norm);
    }
    kaon_blk_logits(f, b, &g->out_norm, g->lm_head.w.data ? &g->lm_head : &g->tok_embd);
}

static const kaon_arch_name names[] = {
    {"Gemma3ForCausalLM", KAON_ARCH_GEMMA3},
    {"gemma3_text", KAON_ARCH_GEMMA3},
    {"gemma3", KAON_ARCH_GEMMA3},
    {NULL, KAON_ARCH_UNKNOWN},
};

const kaon_arch_ops kaon_arch_gemma3 = {
    .label = "gemma3",
    .names = names,
    .hf_config = hf_config,
    .gguf_config = gguf_config,
    .weights = weights,
    .n_weights = sizeof weights / sizeof weights[0],
    .globals_size = sizeof(gemma3_globals),
    .layer_size = sizeof(gemma3_layer),
    .prepare = prepare,
    .forward = forward,
};
