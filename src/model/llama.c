// The Llama family's forward pass (Llama, Mistral, Qwen2 with q/k/v biases, Qwen3 with
// per-head q/k RMSNorm), written only against the backend's op table.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/err.h"

struct kaon_runner {
    const kaon_model *m;
    kaon_backend *be;
    int max_tokens, max_logits, n_blocks, block_size;
    kaon_kv_layer *kv;                       // [n_layers]
    // Scratch activations in the backend's memory, sized for max_tokens.
    void *x;       // [T, dim] residual stream
    void *xn;      // [T, dim] normed input of a sublayer
    void *q;       // [T, nh*hd]
    void *k, *v;   // [T, nkv*hd]
    void *att;     // [T, nh*hd]
    void *proj;    // [T, dim] output of o_proj / down_proj
    void *gate, *up;  // [T, ffn]
    void *rows;    // [max_logits, dim] hidden states of the rows to sample
    void *logits;  // [max_logits, vocab]
};

static void *act(kaon_runner *r, size_t elems, int *fail) {
    void *p = r->be->ops->alloc(r->be, elems * r->be->ops->act_elem_bytes);
    if (!p) *fail = 1;
    return p;
}

kaon_runner *kaon_runner_create(const kaon_model *m, kaon_backend *be, int max_batch_tokens,
                                int max_logits, int n_blocks, int block_size) {
    const kaon_model_config *c = &m->cfg;
    if (max_batch_tokens < 1 || max_logits < 1 || max_logits > max_batch_tokens || n_blocks < 1 ||
        block_size < 1) {
        kaon_set_error("runner: bad sizes (tokens %d, logits %d, blocks %d x %d)", max_batch_tokens,
                       max_logits, n_blocks, block_size);
        return NULL;
    }
    kaon_runner *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->m = m;
    r->be = be;
    r->max_tokens = max_batch_tokens;
    r->max_logits = max_logits;
    r->n_blocks = n_blocks;
    r->block_size = block_size;
    size_t T = (size_t)max_batch_tokens, dim = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ffn = (size_t)c->intermediate_size;
    int fail = 0;
    r->x = act(r, T * dim, &fail);
    r->xn = act(r, T * dim, &fail);
    r->q = act(r, T * qd, &fail);
    r->k = act(r, T * kvd, &fail);
    r->v = act(r, T * kvd, &fail);
    r->att = act(r, T * qd, &fail);
    r->proj = act(r, T * dim, &fail);
    r->gate = act(r, T * ffn, &fail);
    r->up = act(r, T * ffn, &fail);
    r->rows = act(r, (size_t)max_logits * dim, &fail);
    r->logits = act(r, (size_t)max_logits * c->vocab_size, &fail);
    r->kv = calloc((size_t)c->n_layers, sizeof *r->kv);
    if (!r->kv) fail = 1;
    size_t kv_elems = (size_t)n_blocks * block_size * kvd;
    for (int l = 0; !fail && l < c->n_layers; l++) {
        r->kv[l].k = act(r, kv_elems, &fail);
        r->kv[l].v = act(r, kv_elems, &fail);
    }
    if (fail) {
        kaon_set_error("runner: out of memory for activations and a KV cache of %d blocks", n_blocks);
        kaon_runner_free(r);
        return NULL;
    }
    return r;
}

void kaon_runner_free(kaon_runner *r) {
    if (!r) return;
    kaon_backend *be = r->be;
    void *bufs[] = {r->x, r->xn, r->q, r->k, r->v, r->att, r->proj, r->gate, r->up, r->rows, r->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
    if (r->kv) {
        for (int l = 0; l < r->m->cfg.n_layers; l++) {
            if (r->kv[l].k) be->ops->free(be, r->kv[l].k);
            if (r->kv[l].v) be->ops->free(be, r->kv[l].v);
        }
        free(r->kv);
    }
    free(r);
}

int kaon_runner_block_size(const kaon_runner *r) { return r->block_size; }
int kaon_runner_n_blocks(const kaon_runner *r) { return r->n_blocks; }

static int check_batch(const kaon_runner *r, const kaon_batch *b) {
    const kaon_attn_meta *a = &b->attn;
    if (b->n_tokens < 1 || b->n_tokens > r->max_tokens)
        return kaon_set_error("batch of %d tokens (limit %d)", b->n_tokens, r->max_tokens);
    if (b->n_logits < 0 || b->n_logits > r->max_logits)
        return kaon_set_error("batch asks %d logit rows (limit %d)", b->n_logits, r->max_logits);
    if (a->n_tokens != b->n_tokens || a->block_size != r->block_size)
        return kaon_set_error("batch attention metadata does not match the batch");
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= r->m->cfg.vocab_size)
            return kaon_set_error("token id %d out of range [0, %d)", b->tokens[t], r->m->cfg.vocab_size);
        if (a->slot_mapping[t] < 0 || a->slot_mapping[t] >= r->n_blocks * r->block_size)
            return kaon_set_error("KV slot %d out of range", a->slot_mapping[t]);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return kaon_set_error("logit row %d out of range", b->logit_rows[i]);
    return 0;
}

int kaon_runner_forward(kaon_runner *r, const kaon_batch *b, float *logits) {
    if (check_batch(r, b)) return -1;
    const kaon_model *m = r->m;
    const kaon_model_config *c = &m->cfg;
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    const int T = b->n_tokens, dim = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads;
    const int hd = c->head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    const int32_t *pos = b->attn.positions;

    op->embed(be, &m->tok_embd, b->tokens, T, r->x);  // x [T, dim]
    for (int l = 0; l < c->n_layers; l++) {
        const kaon_layer_weights *w = &m->layers[l];
        // Attention block. The previous block's output (proj) joins the residual here.
        op->rmsnorm(be, r->x, l ? r->proj : NULL, &w->attn_norm, c->rms_norm_eps, T, dim, r->xn);
        op->linear(be, r->xn, T, &w->wq, w->bq.data ? &w->bq : NULL, r->q);  // [T, nh*hd]
        op->linear(be, r->xn, T, &w->wk, w->bk.data ? &w->bk : NULL, r->k);  // [T, nkv*hd]
        op->linear(be, r->xn, T, &w->wv, w->bv.data ? &w->bv : NULL, r->v);  // [T, nkv*hd]
        if (c->qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
            op->rmsnorm(be, r->q, NULL, &w->q_norm, c->rms_norm_eps, T * nh, hd, r->q);
            op->rmsnorm(be, r->k, NULL, &w->k_norm, c->rms_norm_eps, T * nkv, hd, r->k);
        }
        op->rope(be, r->q, T, nh, hd, pos, &m->rope);
        op->rope(be, r->k, T, nkv, hd, pos, &m->rope);
        op->kv_write(be, &r->kv[l], r->k, r->v, &b->attn, nkv, hd);
        op->attention(be, r->q, &r->kv[l], &b->attn, nh, nkv, hd, scale, r->att);
        op->linear(be, r->att, T, &w->wo, NULL, r->proj);  // [T, dim]
        // MLP block.
        op->rmsnorm(be, r->x, r->proj, &w->ffn_norm, c->rms_norm_eps, T, dim, r->xn);
        op->linear(be, r->xn, T, &w->w_gate, NULL, r->gate);  // [T, ffn]
        op->linear(be, r->xn, T, &w->w_up, NULL, r->up);      // [T, ffn]
        op->silu_and_mul(be, r->gate, r->up, T, c->intermediate_size, r->gate);
        op->linear(be, r->gate, T, &w->w_down, NULL, r->proj);  // [T, dim]
    }
    if (b->n_logits == 0) return 0;
    // Only the rows that will be sampled go through the final norm and the LM head.
    op->rmsnorm(be, r->x, r->proj, &m->out_norm, c->rms_norm_eps, T, dim, r->xn);
    op->get_rows(be, r->xn, b->logit_rows, b->n_logits, dim, r->rows);
    op->linear(be, r->rows, b->n_logits, &m->lm_head, NULL, r->logits);
    op->to_host_f32(be, r->logits, (size_t)b->n_logits * c->vocab_size, logits);
    return 0;
}
