// The shared pieces of every forward pass (blocks.h). Fused ops are tried here and nowhere
// else; a fused op returns 1 when it declines a shape, and its errors surface through the
// backend's status().
#include <math.h>

#include "model/blocks.h"
#include "model/tp.h"

void kaon_blk_embed(kaon_fwd *f, const kaon_batch *b, const kaon_linear *embd) {
    f->op->embed(f->be, &embd->w, b->tokens, b->n_tokens, f->a.x);
    f->pending = false;
}

void kaon_blk_scale_x(kaon_fwd *f, const kaon_batch *b, float s) {
    f->op->scale(f->be, f->a.x, (size_t)b->n_tokens * (size_t)f->c->hidden_size, s);
}

// The norm op of this model: Gemma's rounds once where the backend tells the two apart.
static void (*norm_op(const kaon_fwd *f))(kaon_backend *, void *, const void *, const kaon_tensor *, float, int,
                                          int, void *) {
    return f->norm_once && f->op->rmsnorm_once ? f->op->rmsnorm_once : f->op->rmsnorm;
}

void kaon_blk_norm(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *w) {
    norm_op(f)(f->be, f->a.x, f->pending ? f->a.proj : NULL, w, f->c->rms_norm_eps, b->n_tokens,
                   f->c->hidden_size, f->a.xn);
    f->pending = false;
}

void kaon_blk_post_norm(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *w) {
    norm_op(f)(f->be, f->a.proj, NULL, w, f->c->rms_norm_eps, b->n_tokens, f->c->hidden_size, f->a.proj);
}

void kaon_blk_qkv(kaon_fwd *f, const kaon_batch *b, const kaon_linear *wq, const kaon_linear *wk,
                  const kaon_linear *wv) {
    const int T = b->n_tokens;
    const kaon_linear *ws[3] = {wq, wk, wv};
    void *ys[3] = {f->a.q, f->a.k, f->a.v};
    if (f->op->linear_multi && f->op->linear_multi(f->be, f->a.xn, T, 3, ws, ys) != 1) return;
    for (int i = 0; i < 3; i++) f->op->linear(f->be, f->a.xn, T, ws[i], ys[i]);
}

void kaon_blk_qk_norm(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *qn, const kaon_tensor *kn) {
    const kaon_model_config *c = f->c;
    const int T = b->n_tokens;
    norm_op(f)(f->be, f->a.q, NULL, qn, c->rms_norm_eps, T * c->n_heads, c->head_dim, f->a.q);
    norm_op(f)(f->be, f->a.k, NULL, kn, c->rms_norm_eps, T * c->n_kv_heads, c->head_dim, f->a.k);
}

void kaon_blk_attention(kaon_fwd *f, const kaon_batch *b, int l, const kaon_rope *rope, int window,
                        float scale) {
    kaon_blk_attention_sinks(f, b, l, rope, window, scale, NULL);
}

void kaon_blk_attention_sinks(kaon_fwd *f, const kaon_batch *b, int l, const kaon_rope *rope, int window,
                              float scale, const float *sinks) {
    const kaon_backend_ops *op = f->op;
    const int T = b->n_tokens, nh = f->c->n_heads, nkv = f->c->n_kv_heads, hd = f->c->head_dim;
    kaon_kv_layer *kv = &f->kv[l];
    const bool fused = op->rope_kv_write &&
                       op->rope_kv_write(f->be, f->a.q, f->a.k, f->a.v, kv, &b->attn, nh, nkv, hd, rope) != 1;
    if (!fused) {
        op->rope(f->be, f->a.q, T, nh, hd, b->attn.positions, rope);
        op->rope(f->be, f->a.k, T, nkv, hd, b->attn.positions, rope);
        op->kv_write(f->be, kv, f->a.k, f->a.v, &b->attn, nkv, hd);
    }
    if (sinks) op->attention_sinks(f->be, f->a.q, kv, &b->attn, nh, nkv, hd, scale, window, sinks, f->a.att);
    else op->attention(f->be, f->a.q, kv, &b->attn, nh, nkv, hd, scale, window, f->a.att);
}

void kaon_blk_out(kaon_fwd *f, const kaon_batch *b, const kaon_linear *w, const void *in) {
    f->op->linear(f->be, in, b->n_tokens, w, f->a.proj);
    // A row-parallel layer left this rank's partial sums: every rank gets their total.
    if (f->tp && w->shard == KAON_SHARD_ROW) kaon_tp_all_reduce(f, f->a.proj, (size_t)b->n_tokens * f->c->hidden_size);
    f->pending = true;
}

// gate = act(xn @ gate^T) * (xn @ up^T)     [T, ffn]
static void gated_ffn(kaon_fwd *f, const kaon_batch *b, kaon_act_fn act, const kaon_linear *gate,
                      const kaon_linear *up) {
    const kaon_backend_ops *op = f->op;
    const int T = b->n_tokens, ffn = (int)gate->w.shape[0];
    const bool fused = act == KAON_ACT_SILU && op->linear_silu_mul &&
                       op->linear_silu_mul(f->be, f->a.xn, T, gate, up, f->a.gate) != 1;
    if (!fused) {
        op->linear(f->be, f->a.xn, T, gate, f->a.gate);  // [T, ffn]
        op->linear(f->be, f->a.xn, T, up, f->a.up);      // [T, ffn]
        if (act == KAON_ACT_SILU) op->silu_and_mul(f->be, f->a.gate, f->a.up, T, ffn, f->a.gate);
        else op->gelu_tanh_and_mul(f->be, f->a.gate, f->a.up, T, ffn, f->a.gate);
    }
}

void kaon_blk_mlp(kaon_fwd *f, const kaon_batch *b, kaon_act_fn act, const kaon_linear *gate,
                  const kaon_linear *up, const kaon_linear *down) {
    gated_ffn(f, b, act, gate, up);
    kaon_blk_out(f, b, down, f->a.gate);
}

void kaon_blk_moe(kaon_fwd *f, const kaon_batch *b, int l, const kaon_moe_layer *moe) {
    uint32_t *cnt = f->expert_counts ? f->expert_counts + (size_t)l * f->c->n_experts : NULL;
    if (f->tp && f->tp->dp) {  // data-parallel attention: the experts see every rank's tokens
        kaon_dp_moe(f, b->n_tokens, f->a.xn, b->attn.positions, moe, cnt, f->a.proj);
        f->pending = true;
        return;
    }
    f->op->moe(f->be, f->a.xn, b->n_tokens, b->attn.positions, &moe->w, cnt, f->a.proj);  // [T, dim]
    // Under tensor parallelism every rank left its part (its experts or expert columns, its
    // shared-expert columns): one sum gives every rank the block's output (model/tp.h).
    if (f->tp) kaon_tp_all_reduce(f, f->a.proj, (size_t)b->n_tokens * f->c->hidden_size);
    f->pending = true;
}

void kaon_blk_logits(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *norm, const kaon_linear *head) {
    if (b->n_logits == 0 && !f->hidden_out) return;
    const int dim = f->c->hidden_size;
    kaon_blk_norm(f, b, norm);
    if (f->hidden_out) f->op->copy_strided(f->be, f->a.xn, (size_t)dim, f->hidden_out, (size_t)dim, b->n_tokens, dim, 1.0f);
    if (b->n_logits == 0) return;
    f->op->get_rows(f->be, f->a.xn, b->logit_rows, b->n_logits, dim, f->a.rows);
    if (f->tp && !f->tp->dp) kaon_tp_logits(f, b, head);  // this rank's vocabulary rows, gathered
    else if (f->logits_f32) f->op->linear_f32(f->be, f->a.rows, b->n_logits, head, f->a.logits);
    else f->op->linear(f->be, f->a.rows, b->n_logits, head, f->a.logits);
    const float cap = f->c->final_logit_softcap;
    if (cap > 0) f->op->logit_softcap(f->be, f->a.logits, (size_t)b->n_logits * (size_t)f->c->vocab_size, cap);
}

void kaon_blk_aux(kaon_fwd *f, const kaon_batch *b, int l, const kaon_tensor *norm) {
    for (int i = 0; f->aux_out && i < 3; i++) {
        if (f->aux_layers[i] != l) continue;
        // x + proj is the state entering layer l: the layer's own first norm adds them now (it
        // then norms x again, a pending-free repeat).
        if (f->pending) kaon_blk_norm(f, b, norm);
        const size_t dim = (size_t)f->c->hidden_size;
        f->op->copy_strided(f->be, f->a.x, dim, (char *)f->aux_out + f->op->act_elem_bytes * dim * (size_t)i, 3 * dim,
                            b->n_tokens, (int)dim, 1.0f);
    }
}

// proj *= s: a sublayer's output scaled before the next norm adds it to x.
static void scale_proj(kaon_fwd *f, const kaon_batch *b, float s) {
    if (s != 0.0f && s != 1.0f) f->op->scale(f->be, f->a.proj, (size_t)b->n_tokens * (size_t)f->c->hidden_size, s);
}

// The fused forms of GEMV-then-add and norm-then-GEMV (backend.h's linear_residual,
// norm_linear_multi, norm_linear_silu_mul; batch 1 on the GPU: the output GEMV adds into x and
// prepares the next norm, which the next GEMVs apply, so no norm op runs between them). Each
// falls back to the separate ops where the backend declines.
static bool fusable_norm(const kaon_fwd *f) { return !f->pending && !f->norm_once; }

static void norm_qkv(kaon_fwd *f, const kaon_batch *b, const kaon_llama_block *w) {
    const kaon_linear *ws[3] = {w->wq, w->wk, w->wv};
    void *ys[3] = {f->a.q, f->a.k, f->a.v};
    if (fusable_norm(f) && f->op->norm_linear_multi &&
        f->op->norm_linear_multi(f->be, f->a.x, w->attn_norm, f->c->rms_norm_eps, b->n_tokens, 3, ws, ys) != 1)
        return;
    kaon_blk_norm(f, b, w->attn_norm);        // xn = norm(x)
    kaon_blk_qkv(f, b, w->wq, w->wk, w->wv);  // q, k, v
}

// proj = in @ w^T, or x += it at once where no scale or tensor-parallel sum comes between
// (next_norm: the norm that reads x next, NULL if no fused GEMV follows).
void kaon_blk_out_residual(kaon_fwd *f, const kaon_batch *b, const kaon_linear *w, const void *in, float scale,
                           const kaon_tensor *next_norm) {
    if (!f->pending && !f->tp && !f->norm_once && (scale == 0.0f || scale == 1.0f) && f->op->linear_residual &&
        f->op->linear_residual(f->be, in, b->n_tokens, w, f->a.x, next_norm, f->c->rms_norm_eps) != 1)
        return;
    kaon_blk_out(f, b, w, in);
    scale_proj(f, b, scale);
}

void kaon_blk_norm_mlp(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *norm, const kaon_linear *gate,
                       const kaon_linear *up, const kaon_linear *down, float scale, const kaon_tensor *next_norm) {
    const bool fused = fusable_norm(f) && f->op->norm_linear_silu_mul &&
                       f->op->norm_linear_silu_mul(f->be, f->a.x, norm, f->c->rms_norm_eps, b->n_tokens, gate, up,
                                                   f->a.gate) != 1;
    if (!fused) {
        kaon_blk_norm(f, b, norm);  // x += proj; xn
        gated_ffn(f, b, KAON_ACT_SILU, gate, up);
    }
    kaon_blk_out_residual(f, b, down, f->a.gate, scale, next_norm);
}

// norm, q / k / v, RoPE and the KV write as one backend op (norm_qkv_rope_kv_write, batch 1 on
// the GPU after a prepared norm), then the attention: false where the op declines, nothing run.
static bool fused_qkv_attention(kaon_fwd *f, const kaon_batch *b, int l, const kaon_llama_block *w,
                                const kaon_rope *rope, float scale) {
    const kaon_backend_ops *op = f->op;
    if (!fusable_norm(f) || w->q_norm || !op->norm_qkv_rope_kv_write) return false;
    const int nh = f->c->n_heads, nkv = f->c->n_kv_heads, hd = f->c->head_dim;
    const kaon_linear *ws[3] = {w->wq, w->wk, w->wv};
    if (op->norm_qkv_rope_kv_write(f->be, f->a.x, w->attn_norm, f->c->rms_norm_eps, b->n_tokens, ws, f->a.q, f->a.k,
                                   f->a.v, &f->kv[l], &b->attn, nh, nkv, hd, rope) == 1)
        return false;
    op->attention(f->be, f->a.q, &f->kv[l], &b->attn, nh, nkv, hd, scale, 0, f->a.att);
    return true;
}

// Qwen3's q / k head norms, RoPE and the KV write as one backend op (qk_norm_rope_kv_write), then
// the attention: false where the op declines, nothing run.
static bool fused_qk_norm_attention(kaon_fwd *f, const kaon_batch *b, int l, const kaon_llama_block *w,
                                    const kaon_rope *rope, float scale) {
    const kaon_backend_ops *op = f->op;
    if (!w->q_norm || !op->qk_norm_rope_kv_write || f->norm_once) return false;
    const int nh = f->c->n_heads, nkv = f->c->n_kv_heads, hd = f->c->head_dim;
    if (op->qk_norm_rope_kv_write(f->be, f->a.q, f->a.k, f->a.v, w->q_norm, w->k_norm, f->c->rms_norm_eps, &f->kv[l],
                                  &b->attn, nh, nkv, hd, rope) == 1)
        return false;
    op->attention(f->be, f->a.q, &f->kv[l], &b->attn, nh, nkv, hd, scale, 0, f->a.att);
    return true;
}

// (norm_moe_residual: batch 1 on the GPU after a prepared norm.)
bool kaon_blk_norm_moe(kaon_fwd *f, const kaon_batch *b, int l, const kaon_tensor *norm, float scale,
                       const kaon_tensor *next_norm) {
    if (!fusable_norm(f) || f->tp || !f->op->norm_moe_residual || (scale != 0.0f && scale != 1.0f)) return false;
    uint32_t *cnt = f->expert_counts ? f->expert_counts + (size_t)l * f->c->n_experts : NULL;
    return f->op->norm_moe_residual(f->be, f->a.x, norm, f->c->rms_norm_eps, b->n_tokens, b->attn.positions,
                                    &f->w->moe[l].w, cnt, next_norm) != 1;
}

void kaon_blk_llama_layer(kaon_fwd *f, const kaon_batch *b, int l, const kaon_llama_block *w) {
    const kaon_model_config *c = f->c;
    const float scale = w->attn_scale > 0 ? w->attn_scale : 1.0f / sqrtf((float)c->head_dim);
    const kaon_rope *rope = &f->m->rope[KAON_ROPE_GLOBAL];
    if (!fused_qkv_attention(f, b, l, w, rope, scale)) {
        norm_qkv(f, b, w);  // q, k, v of norm(x)
        if (!fused_qk_norm_attention(f, b, l, w, rope, scale)) {
            if (w->q_norm) kaon_blk_qk_norm(f, b, w->q_norm, w->k_norm);  // before RoPE
            kaon_blk_attention(f, b, l, rope, 0, scale);                  // att
        }
    }
    const bool moe = kaon_model_layer_is_moe(f->m, l);
    // x += att @ wo^T (preparing ffn_norm for a fused GEMV or MoE op after it)
    kaon_blk_out_residual(f, b, w->wo, f->a.att, w->residual_scale, !moe || f->op->norm_moe_residual ? w->ffn_norm : NULL);
    if (moe) {
        if (!kaon_blk_norm_moe(f, b, l, w->ffn_norm, w->residual_scale, w->next_norm)) {
            kaon_blk_norm(f, b, w->ffn_norm);  // x += proj; xn
            kaon_blk_moe(f, b, l, &f->w->moe[l]);
            scale_proj(f, b, w->residual_scale);
        }
    } else {
        kaon_blk_norm_mlp(f, b, w->ffn_norm, w->w_gate, w->w_up, w->w_down, w->residual_scale,
                          w->next_norm);  // x += mlp(norm(x))
    }
}
