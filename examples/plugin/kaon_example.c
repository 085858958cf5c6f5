// An example plugin: architecture KaonExampleForCausalLM, Llama with three knobs from
// config.json, as Granite and Gemma 2 have them:
//   embedding_multiplier      x = embed(tokens) * m                      (default 1)
//   residual_multiplier       x += sublayer(norm(x)) * r, every sublayer  (default 1)
//   final_logit_softcapping   logits = c * tanh(logits / c)              (default: none)
// Everything else is Llama's (HF names and layout, NeoX RoPE, GQA, SwiGLU). It links against
// nothing of kaon: every call goes through the host table it is given at registration.
#include <stddef.h>

#include "kaon_plugin.h"

static const kaon_plugin_host *host;  // set once by register_example

enum { P_EMBED_MUL = 0, P_RESID_MUL = 1 };  // our slots of kaon_model_config.arch_params

typedef struct ex_globals {
    kaon_linear tok_embd;  // [vocab, dim]
    kaon_tensor out_norm;  // [dim]
    kaon_linear lm_head;   // [vocab, dim]; w.data NULL when tied to the embedding
} ex_globals;

typedef struct ex_layer {
    kaon_tensor attn_norm, ffn_norm;   // [dim]
    kaon_linear wq, wk, wv, wo;        // [nh*hd, dim] [nkv*hd, dim] x2 [dim, nh*hd]
    kaon_linear w_gate, w_up, w_down;  // [ffn, dim] x2 [dim, ffn]
} ex_layer;

#define G(f) false, offsetof(ex_globals, f)
#define L(f) true, offsetof(ex_layer, f)
#define HF "model.layers.%d."
enum { HID = KAON_DIM_HIDDEN, Q = KAON_DIM_Q, KV = KAON_DIM_KV, FFN = KAON_DIM_FFN, VOC = KAON_DIM_VOCAB };

// Hugging Face checkpoints only (no GGUF names).
static const kaon_weight_spec weights[] = {
    {NULL, "model.embed_tokens.weight", G(tok_embd.w), 2, {VOC, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_VOCAB},
    {NULL, "model.norm.weight", G(out_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {NULL, "lm_head.weight", G(lm_head.w), 2, {VOC, HID}, KAON_WHEN_UNTIED, 0, KAON_SHARD_VOCAB},
    {NULL, HF "input_layernorm.weight", L(attn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {NULL, HF "self_attn.q_proj.weight", L(wq.w), 2, {Q, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "self_attn.k_proj.weight", L(wk.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "self_attn.v_proj.weight", L(wv.w), 2, {KV, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "self_attn.o_proj.weight", L(wo.w), 2, {HID, Q}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
    {NULL, HF "post_attention_layernorm.weight", L(ffn_norm), 1, {HID}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
    {NULL, HF "mlp.gate_proj.weight", L(w_gate.w), 2, {FFN, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "mlp.up_proj.weight", L(w_up.w), 2, {FFN, HID}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_COL},
    {NULL, HF "mlp.down_proj.weight", L(w_down.w), 2, {HID, FFN}, KAON_WHEN_ALWAYS, 0, KAON_SHARD_ROW},
};

// A positive multiplier under key (default 1) into arch_params[slot].
static int get_multiplier(const char *file, const cJSON *root, const char *key, kaon_model_config *c, int slot) {
    float v = 1.0f;
    if (host->hf_get_float(file, root, "", key, &v, NULL)) return -1;
    if (!(v > 0.0f)) return host->set_error("%s: \"%s\" = %g must be positive", file, key, (double)v);
    c->arch_params[slot] = v;
    return 0;
}

static int hf_config(const char *file, const cJSON *root, kaon_model_config *c) {
    if (get_multiplier(file, root, "embedding_multiplier", c, P_EMBED_MUL) ||
        get_multiplier(file, root, "residual_multiplier", c, P_RESID_MUL) ||
        host->hf_get_float(file, root, "", "final_logit_softcapping", &c->final_logit_softcap, NULL))
        return -1;
    if (c->final_logit_softcap < 0)
        return host->set_error("%s: \"final_logit_softcapping\" must be positive", file);
    return 0;
}

static int prepare(kaon_model *m) {
    return host->build_rope(m, KAON_ROPE_GLOBAL, m->cfg.rope_theta, true, NULL);
}

static void forward(kaon_fwd *f, const kaon_batch *b) {
    const kaon_model_config *c = f->c;
    const ex_globals *g = f->w->globals;
    host->blk_embed(f, b, &g->tok_embd);  // x [T, dim]
    if (c->arch_params[P_EMBED_MUL] != 1.0f) host->blk_scale_x(f, b, c->arch_params[P_EMBED_MUL]);
    for (int l = 0; l < c->n_layers; l++) {
        const ex_layer *w = (const ex_layer *)f->w->layers + l;
        const kaon_llama_block blk = {
            .attn_norm = &w->attn_norm, .ffn_norm = &w->ffn_norm,
            .wq = &w->wq, .wk = &w->wk, .wv = &w->wv, .wo = &w->wo,
            .w_gate = &w->w_gate, .w_up = &w->w_up, .w_down = &w->w_down,
            .residual_scale = c->arch_params[P_RESID_MUL],
        };
        host->blk_llama_layer(f, b, l, &blk);
    }
    // The final norm, the LM head and the config's softcap (kaon_blk_logits applies it).
    host->blk_logits(f, b, &g->out_norm, g->lm_head.w.data ? &g->lm_head : &g->tok_embd);
}

static const kaon_arch_name names[] = {
    {"KaonExampleForCausalLM", KAON_ARCH_PLUGIN},
    {"kaon_example", KAON_ARCH_PLUGIN},  // model_type
    {NULL, KAON_ARCH_UNKNOWN},
};

static const kaon_arch_ops example_arch = {
    .label = "kaon-example",
    .names = names,
    .hf_config = hf_config,
    .weights = weights,
    .n_weights = sizeof weights / sizeof weights[0],
    .globals_size = sizeof(ex_globals),
    .layer_size = sizeof(ex_layer),
    .prepare = prepare,
    .forward = forward,
};

static int register_example(const kaon_plugin_host *h) {
    host = h;
    return h->register_arch(&example_arch);
}

KAON_PLUGIN_DEFINE("kaon-example", register_example)
