// The pieces a forward pass is built from (attention, MLP, experts, norms, logits), over the
// backend's op table. This is the only place fused ops are tried: a backend that has a fused op
// gets it, and the helpers fall back to the plain ops when it declines a shape.
//
// The residual stream x is updated lazily: a sublayer leaves its output in proj ("pending")
// and the next norm adds it to x as it normalises (rmsnorm's fused add).
#ifndef KAON_MODEL_BLOCKS_H
#define KAON_MODEL_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/linear.h"
#include "model/model.h"
#include "model/moe.h"

// Scratch activations of a step, in the backend's activation dtype, sized for its tokens T.
typedef struct kaon_acts {
    void *x;          // [T, dim] residual stream
    void *xn;         // [T, dim] normed input of a sublayer
    void *q;          // [T, nh*hd]
    void *k, *v;      // [T, nkv*hd]
    void *att;        // [T, nh*hd]
    void *proj;       // [T, dim] output of a sublayer (o_proj, down_proj, experts)
    void *gate, *up;  // [T, ffn]
    void *rows;       // [max_logits, dim] hidden states of the rows to sample
    void *logits;     // [max_logits, vocab] (f32 when logits_f32)
    void *scratch;    // [T, the architecture's scratch_elems] (model/arch.h), or NULL
} kaon_acts;

// What a forward pass works with.
typedef struct kaon_fwd {
    kaon_backend *be;
    const kaon_backend_ops *op;
    const kaon_model *m;
    const kaon_model_config *c;
    const kaon_weights *w;     // the weights the ops read: the model's own or device copies
    kaon_kv_layer *kv;         // [n_layers]
    kaon_acts a;
    bool logits_f32;           // LM head in f32 (linear_f32)
    uint32_t *expert_counts;   // [n_layers, n_experts] backend counters, or NULL
    bool pending;              // a.proj holds a sublayer's output not yet added to x
    bool norm_once;            // norms round once (Gemma's RMSNorm: the op's rmsnorm_once)
    bool graphed;              // a step of a graph's shape (recorded now or on a later run):
                               // no host-side choices that depend on the step's positions
    void **xbuf;               // a grow-only backend buffer of the runner (MLA's expanded
    size_t *xbuf_cap;          // prefill), bytes; freed with the runner
    // Speculative decoding's draft model (runner.h kaon_runner_keep_hidden):
    void *hidden_out;          // [T, dim] or NULL: kaon_blk_logits leaves every token's final
                               // normed hidden state here (what MTP drafts from)
    const void *hin;           // [T, dim] the draft step's hidden input rows (draft_forward)
    // EAGLE-3 (model/eagle3.h): the target's forward copies the hidden states entering layers
    // aux_layers[i] to aux_out[:, i dim] ([T, 3 dim]); the head's step reads f->hin as [T, 3 dim]
    // through fc when draft_fc, and builds its [T, 2 dim] input in dcat.
    void *aux_out;
    int aux_layers[3];
    bool draft_fc;
    void *dcat;
    const kaon_linear *draft_embed;  // the target's embedding (a head without its own)
    struct kaon_tp_rank *tp;   // tensor parallelism (model/tp.h): this rank; NULL: one rank
} kaon_fwd;

typedef enum kaon_act_fn { KAON_ACT_SILU, KAON_ACT_GELU_TANH } kaon_act_fn;

// x = embd[tokens]                                   x [T, dim]
void kaon_blk_embed(kaon_fwd *f, const kaon_batch *b, const kaon_linear *embd);
// EAGLE-3: the hidden state entering layer l into f->aux_out's columns when l is one of
// f->aux_layers (norm: the layer's first norm, which folds a pending sublayer output into x).
void kaon_blk_aux(kaon_fwd *f, const kaon_batch *b, int l, const kaon_tensor *norm);
// x *= s (Gemma's sqrt(hidden) embedding scale)
void kaon_blk_scale_x(kaon_fwd *f, const kaon_batch *b, float s);
// xn = rmsnorm(x) * w, after adding the pending sublayer output to x.
void kaon_blk_norm(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *w);
// proj = rmsnorm(proj) * w: a sublayer's output normed before it joins x (Gemma's post-norms).
void kaon_blk_post_norm(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *w);
// q, k, v = xn @ wq^T, xn @ wk^T, xn @ wv^T (+ biases)  q [T, nh*hd]; k, v [T, nkv*hd]
void kaon_blk_qkv(kaon_fwd *f, const kaon_batch *b, const kaon_linear *wq, const kaon_linear *wk,
                  const kaon_linear *wv);
// Per-head RMSNorm of q and k (Qwen3, Gemma 3).
void kaon_blk_qk_norm(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *qn, const kaon_tensor *kn);
// RoPE on q and k, k and v into layer l's cache, then paged causal attention:
// att = softmax(q k^T * scale) v over the sequence's positions (the last `window` only when
// window > 0).
void kaon_blk_attention(kaon_fwd *f, const kaon_batch *b, int l, const kaon_rope *rope, int window,
                        float scale);
// As kaon_blk_attention, with a learned logit per query head in each softmax's denominator
// (sinks [n_heads] f32: gpt-oss; the backend's attention_sinks op).
void kaon_blk_attention_sinks(kaon_fwd *f, const kaon_batch *b, int l, const kaon_rope *rope, int window,
                              float scale, const float *sinks);
// proj = in @ w^T: a sublayer's output, pending for the residual stream.
void kaon_blk_out(kaon_fwd *f, const kaon_batch *b, const kaon_linear *w, const void *in);
// proj = down(act(xn @ gate^T) * (xn @ up^T)), pending.
void kaon_blk_mlp(kaon_fwd *f, const kaon_batch *b, kaon_act_fn act, const kaon_linear *gate,
                  const kaon_linear *up, const kaon_linear *down);
// proj = the experts of layer l on xn, pending.
void kaon_blk_moe(kaon_fwd *f, const kaon_batch *b, int l, const kaon_moe_layer *moe);
// The fused forms around the split norm (backend.h's linear_residual, norm_linear_silu_mul,
// norm_moe_residual), each falling back to the separate ops where the backend declines; next_norm:
// the norm that reads x next (NULL: none to prepare).
// x += (in @ w^T) * scale, or proj = in @ w^T pending where the backend declines.
void kaon_blk_out_residual(kaon_fwd *f, const kaon_batch *b, const kaon_linear *w, const void *in, float scale,
                           const kaon_tensor *next_norm);
// x += down(silu(norm(x) @ gate^T) * (norm(x) @ up^T)) * scale.
void kaon_blk_norm_mlp(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *norm, const kaon_linear *gate,
                       const kaon_linear *up, const kaon_linear *down, float scale, const kaon_tensor *next_norm);
// x += moe_l(norm(x)) as one backend op: false where it declines (nothing ran).
bool kaon_blk_norm_moe(kaon_fwd *f, const kaon_batch *b, int l, const kaon_tensor *norm, float scale,
                       const kaon_tensor *next_norm);
// One MLA layer's attention weights (DeepSeek): q through wq, or wq_a -> q_a_norm -> wq_b;
// the latent and rope key through wkv_a (then kv_a_norm on the latent); the absorbed per-head
// W_UK^T (wk_b) and W_UV (wv_b); the output projection wo.
typedef struct kaon_mla_weights {
    const kaon_linear *wq, *wq_a, *wq_b;  // wq NULL: the q_lora pair
    const kaon_tensor *q_a_norm;
    const kaon_linear *wkv_a;
    const kaon_tensor *kv_a_norm;
    const kaon_linear *wk_b, *wv_b, *wo;
    const kaon_linear *wk_n;  // [nh * qk_nope, kv_lora]: W_UK of each head (expanded prefill); NULL: none
    // The split norms (backend.h's norm_linear_multi / linear_residual): norm, the attention's
    // norm of x, which kaon_blk_mla then applies itself (NULL: xn is ready); next_norm, the
    // norm after it, which wo's residual GEMV prepares (NULL: proj is left pending).
    const kaon_tensor *norm, *next_norm;
} kaon_mla_weights;
// Activation elements per token kaon_blk_mla needs in a.scratch.
size_t kaon_blk_mla_scratch(const kaon_model_config *c);
// Multi-head latent attention on xn, absorbed: the latent and rotated key of each token into
// layer l's cache, then every head attends over the cached rows (mla_attention) and proj =
// its output through W_UV and wo, pending. pe_scale multiplies q's rope part (HF's YaRN
// attention_factor, squared). Prefill chunks of at least KAON_MLA_EXPAND_MIN tokens (256;
// the environment variable sets it) at the end of the batch run expanded where the backend
// and weights allow: each head's keys [c W_UK^T | k_pe] and values c W_UV^T from the cached
// latents, then ordinary attention with head_dim qk_nope + qk_rope (a third of the absorbed
// form's work per query and key, once a chunk is long enough to pay for the expansion).
void kaon_blk_mla(kaon_fwd *f, const kaon_batch *b, int l, const kaon_mla_weights *w,
                  const kaon_rope *rope, float scale, float pe_scale);
// One Llama-style decoder layer: x += attn(norm(x)), then x += mlp(norm(x)) (the layer's
// experts instead when it has them), each sublayer's output times residual_scale before it joins
// x. The Llama family's forward and plugins' variants of it are built from this.
typedef struct kaon_llama_block {
    const kaon_tensor *attn_norm, *ffn_norm;    // [dim]
    const kaon_tensor *q_norm, *k_norm;         // [hd] per-head q/k RMSNorm; NULL: none
    const kaon_linear *wq, *wk, *wv, *wo;       // [nh*hd, dim] [nkv*hd, dim] x2 [dim, nh*hd]
    const kaon_linear *w_gate, *w_up, *w_down;  // [ffn, dim] x2 [dim, ffn]; dense layers
    float attn_scale;      // softmax scale; 0: 1/sqrt(head_dim)
    float residual_scale;  // 0 or 1: none (Granite's residual_multiplier otherwise)
    const kaon_tensor *next_norm;  // the norm the layer's output meets next (the next layer's
                                   // attn_norm); NULL: none or not known
} kaon_llama_block;
void kaon_blk_llama_layer(kaon_fwd *f, const kaon_batch *b, int l, const kaon_llama_block *w);
// The final norm and the LM head, on the rows that need logits only (into a.logits); with
// f->hidden_out, every token's normed hidden state is copied there too.
void kaon_blk_logits(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *norm, const kaon_linear *head);

#endif
