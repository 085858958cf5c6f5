// The Llama family's forward pass (Llama, Mistral, Qwen2 with q/k/v biases, Qwen3 with
// per-head q/k RMSNorm), written only against the backend's op table.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/moe.h"
#include "util/err.h"

struct kaon_runner {
    const kaon_model *m;
    kaon_backend *be;
    int max_tokens, max_logits, n_blocks, block_size;
    // The weights the forward pass reads: the model's own (used in place from the mapping)
    // or, on a backend with an upload op, the backend's copies (owned here).
    const kaon_layer_weights *layers;
    kaon_tensor tok_embd, out_norm, lm_head;
    kaon_layer_weights *dev_layers;   // [n_layers] device copies, NULL when in place
    bool dev_weights, lm_head_tied;
    bool logits_f32;   // logits computed and copied in f32 (linear_f32 + copy_f32_to_host)
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
    struct kaon_moe_layer *dev_moe;  // device copies of the MoE layers (moe.h); NULL in place
    kaon_moe_stats *moe_stats;       // expert load counters; NULL until enabled
    // Graph-friendly copies of a step's index arrays: decode batches padded to a ladder of
    // sizes and block tables to a power-of-two width, so a few graphs serve every step.
    int32_t *pad_i32;     // tokens, positions, seqs, slots, rows: 5 x max_tokens
    int32_t *pad_tables;  // [pad_tables_cap]
    size_t pad_tables_cap;
};

static void *act(kaon_runner *r, size_t elems, int *fail) {
    void *p = r->be->ops->alloc(r->be, elems * r->be->ops->act_elem_bytes);
    if (!p) *fail = 1;
    return p;
}

// Every weight of the model in one list (absent optional tensors have data == NULL);
// norm[i] marks the RMSNorm weights (dummy values near 1 instead of near 0).
static int weight_list(const kaon_model *m, kaon_layer_weights *layers, kaon_tensor *embd,
                       kaon_tensor *onorm, kaon_tensor *head, kaon_tensor **out, bool *norm) {
    int n = 0;
#define ADD(t, is_norm) (out[n] = (t), norm[n] = (is_norm), n++)
    ADD(embd, false);
    ADD(onorm, true);
    if (head) ADD(head, false);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        kaon_layer_weights *w = &layers[l];
        ADD(&w->attn_norm, true);
        ADD(&w->wq, false);
        ADD(&w->wk, false);
        ADD(&w->wv, false);
        ADD(&w->wo, false);
        ADD(&w->bq, false);
        ADD(&w->bk, false);
        ADD(&w->bv, false);
        ADD(&w->q_norm, true);
        ADD(&w->k_norm, true);
        ADD(&w->ffn_norm, true);
        ADD(&w->w_gate, false);
        ADD(&w->w_up, false);
        ADD(&w->w_down, false);
    }
#undef ADD
    return n;
}

static size_t weight_list_cap(const kaon_model *m) { return 3 + (size_t)m->cfg.n_layers * 14; }

static void release_weights(kaon_runner *r) {
    if (!r->dev_weights) return;
    kaon_moe_runner_release(r->be, r->m, r->dev_moe);
    r->dev_moe = NULL;
    size_t cap = weight_list_cap(r->m);
    kaon_tensor **list = malloc(sizeof *list * cap);
    bool *norm = malloc(cap);
    if (list && norm) {
        int n = weight_list(r->m, r->dev_layers, &r->tok_embd, &r->out_norm,
                            r->lm_head_tied ? NULL : &r->lm_head, list, norm);
        for (int i = 0; i < n; i++)
            if (list[i]->data) r->be->ops->release(r->be, list[i]);
    }
    free(list);
    free(norm);
    free(r->dev_layers);
    r->dev_layers = NULL;
    r->dev_weights = false;
}

// Device copies of every weight, uploaded once; for --load-format dummy, created on the
// device instead: matrices uniform in +-1/sqrt(in), norm weights 1 +- 0.1, biases +- 0.1.
static int upload_weights(kaon_runner *r) {
    const kaon_model *m = r->m;
    const kaon_backend_ops *op = r->be->ops;
    const bool dummy = m->format == KAON_FORMAT_DUMMY;
    if (dummy && !op->fill_dummy)
        return kaon_set_error("--load-format dummy needs a backend that creates weights (cuda)");
    const size_t cap = weight_list_cap(m);
    r->dev_layers = calloc((size_t)m->cfg.n_layers, sizeof *r->dev_layers);
    kaon_tensor **src = malloc(sizeof *src * cap), **dst = malloc(sizeof *dst * cap);
    bool *norm = malloc(cap);
    int rc = 0;
    if (!r->dev_layers || !src || !dst || !norm) {
        rc = kaon_set_error("out of memory");
        goto out;
    }
    r->dev_weights = true;
    // (Dummy weights all share one placeholder pointer: their config says whether tied.)
    r->lm_head_tied = dummy ? m->cfg.tie_word_embeddings : m->lm_head.data == m->tok_embd.data;
    memset(&r->tok_embd, 0, sizeof r->tok_embd);  // nothing to release until uploaded
    memset(&r->out_norm, 0, sizeof r->out_norm);
    memset(&r->lm_head, 0, sizeof r->lm_head);
    kaon_tensor embd = m->tok_embd, onorm = m->out_norm, head = m->lm_head;
    const int n = weight_list(m, m->layers, &embd, &onorm, r->lm_head_tied ? NULL : &head, src, norm);
    weight_list(m, r->dev_layers, &r->tok_embd, &r->out_norm, r->lm_head_tied ? NULL : &r->lm_head,
                dst, norm);
    for (int i = 0; i < n && !rc; i++) {
        const kaon_tensor *t = src[i];
        if (!t->data) continue;
        if (dummy) {
            const float scale = t->ndim == 1 ? 0.1f : 1.0f / sqrtf((float)t->shape[t->ndim - 1]);
            rc = op->fill_dummy(r->be, t, 0x6b616f6e00000000ull + (uint64_t)i, scale,
                                norm[i] ? 1.0f : 0.0f, dst[i]);
        } else {
            rc = op->upload(r->be, t, dst[i]);
        }
    }
    if (!rc) rc = kaon_moe_runner_upload(r->be, m, dummy, 0x6b616f6e00000000ull + (1ull << 40),
                                         r->dev_layers, &r->dev_moe);
    if (!rc) {
        if (r->lm_head_tied) r->lm_head = r->tok_embd;
        r->layers = r->dev_layers;
    }
out:
    free(src);
    free(dst);
    free(norm);
    return rc ? -1 : 0;
}

// Width of the dense MLP buffers: the config's, or 1 when every layer has experts instead.
static size_t dense_ffn(const kaon_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (!m->layers[l].moe) return (size_t)m->cfg.intermediate_size;
    return 1;
}

size_t kaon_runner_act_bytes(const kaon_model *m, size_t elem_bytes, int max_batch_tokens,
                             int max_logits) {
    const kaon_model_config *c = &m->cfg;
    size_t T = (size_t)max_batch_tokens, dim = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ffn = dense_ffn(m);
    size_t elems = T * (3 * dim + 2 * qd + 2 * kvd + 2 * ffn) + (size_t)max_logits * dim;
    return elems * elem_bytes + (size_t)max_logits * (size_t)c->vocab_size * sizeof(float) +
           kaon_moe_act_bytes(m, elem_bytes, max_batch_tokens);
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
    if (c->n_experts > 0 && !be->ops->moe) {
        kaon_set_error("runner: the %s backend has no mixture-of-experts op", be->ops->name);
        return NULL;
    }
    kaon_runner *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->m = m;
    r->be = be;
    r->layers = m->layers;
    r->tok_embd = m->tok_embd;
    r->out_norm = m->out_norm;
    r->lm_head = m->lm_head;
    if (be->ops->upload) {
        if (upload_weights(r)) {
            kaon_runner_free(r);
            return NULL;
        }
    } else if (m->format == KAON_FORMAT_DUMMY) {
        kaon_set_error("--load-format dummy needs a backend that creates weights (cuda)");
        kaon_runner_free(r);
        return NULL;
    }
    r->max_tokens = max_batch_tokens;
    r->max_logits = max_logits;
    r->n_blocks = n_blocks;
    r->block_size = block_size;
    size_t T = (size_t)max_batch_tokens, dim = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ffn = dense_ffn(m);
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
    r->logits_f32 = be->ops->linear_f32 && be->ops->copy_f32_to_host;
    if (r->logits_f32) {
        r->logits = be->ops->alloc(be, (size_t)max_logits * c->vocab_size * sizeof(float));
        if (!r->logits) fail = 1;
    } else {
        r->logits = act(r, (size_t)max_logits * c->vocab_size, &fail);
    }
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
    if (be->ops->status && be->ops->status(be)) {
        kaon_runner_free(r);
        return NULL;
    }
    return r;
}

void kaon_runner_free(kaon_runner *r) {
    if (!r) return;
    kaon_backend *be = r->be;
    kaon_moe_stats_free(be, r->moe_stats);
    free(r->pad_i32);
    free(r->pad_tables);
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
    release_weights(r);
    free(r);
}

void kaon_runner_reserve_host_kv(kaon_runner *r) {
    size_t bytes = (size_t)r->n_blocks * r->block_size * r->m->cfg.n_kv_heads * r->m->cfg.head_dim *
                   r->be->ops->act_elem_bytes;
    for (int l = 0; l < r->m->cfg.n_layers; l++) {
        memset(r->kv[l].k, 0, bytes);
        memset(r->kv[l].v, 0, bytes);
    }
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

// The layers of one step, from the embedding to the logits (left in r->logits).
static void run_layers(kaon_runner *r, const kaon_batch *b) {
    const kaon_model *m = r->m;
    const kaon_model_config *c = &m->cfg;
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    const int T = b->n_tokens, dim = c->hidden_size, nh = c->n_heads, nkv = c->n_kv_heads;
    const int hd = c->head_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    const int32_t *pos = b->attn.positions;

    op->embed(be, &r->tok_embd, b->tokens, T, r->x);  // x [T, dim]
    // A sublayer's output joins the residual stream x either inside its last projection
    // (linear_residual) or, pending in proj, in the next norm (rmsnorm's add).
    bool pending = false;
    for (int l = 0; l < c->n_layers; l++) {
        const kaon_layer_weights *w = &r->layers[l];
        // Attention block. A fused op returns 1 when it declines; its errors (-1) surface
        // through status().
        const kaon_tensor *ws[3] = {&w->wq, &w->wk, &w->wv};
        const kaon_tensor *bs[3] = {w->bq.data ? &w->bq : NULL, w->bk.data ? &w->bk : NULL,
                                    w->bv.data ? &w->bv : NULL};
        void *ys[3] = {r->q, r->k, r->v};
        int rc = 1;
        if (!pending && op->rmsnorm_linear_multi)
            rc = op->rmsnorm_linear_multi(be, r->x, &w->attn_norm, c->rms_norm_eps, T, 3, ws, bs, ys);
        if (rc == 1) {
            op->rmsnorm(be, r->x, pending ? r->proj : NULL, &w->attn_norm, c->rms_norm_eps, T, dim, r->xn);
            pending = false;
            if (op->linear_multi) rc = op->linear_multi(be, r->xn, T, 3, ws, bs, ys);
        }
        if (rc == 1) {
            op->linear(be, r->xn, T, &w->wq, w->bq.data ? &w->bq : NULL, r->q);  // [T, nh*hd]
            op->linear(be, r->xn, T, &w->wk, w->bk.data ? &w->bk : NULL, r->k);  // [T, nkv*hd]
            op->linear(be, r->xn, T, &w->wv, w->bv.data ? &w->bv : NULL, r->v);  // [T, nkv*hd]
        }
        if (c->qk_norm) {  // Qwen3: RMSNorm over each head's vector, before RoPE
            op->rmsnorm(be, r->q, NULL, &w->q_norm, c->rms_norm_eps, T * nh, hd, r->q);
            op->rmsnorm(be, r->k, NULL, &w->k_norm, c->rms_norm_eps, T * nkv, hd, r->k);
        }
        rc = op->rope_kv_write ? op->rope_kv_write(be, r->q, r->k, r->v, &r->kv[l], &b->attn, nh,
                                                   nkv, hd, &m->rope)
                               : 1;
        if (rc == 1) {
            op->rope(be, r->q, T, nh, hd, pos, &m->rope);
            op->rope(be, r->k, T, nkv, hd, pos, &m->rope);
            op->kv_write(be, &r->kv[l], r->k, r->v, &b->attn, nkv, hd);
        }
        op->attention(be, r->q, &r->kv[l], &b->attn, nh, nkv, hd, scale, 0, r->att);
        rc = op->linear_residual ? op->linear_residual(be, r->att, T, &w->wo, r->x) : 1;
        if (rc == 1) {
            op->linear(be, r->att, T, &w->wo, NULL, r->proj);  // [T, dim]
            pending = true;
        }
        // MLP block.
        if (w->moe) {  // experts: routed, grouped and summed by the backend (errors: status())
            op->rmsnorm(be, r->x, pending ? r->proj : NULL, &w->ffn_norm, c->rms_norm_eps, T, dim, r->xn);
            uint32_t *cnt = r->moe_stats ? r->moe_stats->dev + (size_t)l * c->n_experts : NULL;
            op->moe(be, r->xn, T, pos, &w->moe->w, cnt, r->proj);  // [T, dim]
            pending = true;
            continue;
        }
        rc = 1;
        if (!pending && op->rmsnorm_linear_silu_mul)
            rc = op->rmsnorm_linear_silu_mul(be, r->x, &w->ffn_norm, c->rms_norm_eps, T, &w->w_gate, &w->w_up,
                                             r->gate);
        if (rc == 1) {
            op->rmsnorm(be, r->x, pending ? r->proj : NULL, &w->ffn_norm, c->rms_norm_eps, T, dim, r->xn);
            pending = false;
            rc = op->linear_silu_mul ? op->linear_silu_mul(be, r->xn, T, &w->w_gate, &w->w_up, r->gate) : 1;
        }
        if (rc == 1) {
            op->linear(be, r->xn, T, &w->w_gate, NULL, r->gate);  // [T, ffn]
            op->linear(be, r->xn, T, &w->w_up, NULL, r->up);      // [T, ffn]
            op->silu_and_mul(be, r->gate, r->up, T, c->intermediate_size, r->gate);
        }
        rc = op->linear_residual ? op->linear_residual(be, r->gate, T, &w->w_down, r->x) : 1;
        if (rc == 1) {
            op->linear(be, r->gate, T, &w->w_down, NULL, r->proj);  // [T, dim]
            pending = true;
        }
    }
    if (b->n_logits == 0) return;
    // Only the rows that will be sampled go through the final norm and the LM head.
    op->rmsnorm(be, r->x, pending ? r->proj : NULL, &r->out_norm, c->rms_norm_eps, T, dim, r->xn);
    op->get_rows(be, r->xn, b->logit_rows, b->n_logits, dim, r->rows);
    if (r->logits_f32) op->linear_f32(be, r->rows, b->n_logits, &r->lm_head, r->logits);
    else op->linear(be, r->rows, b->n_logits, &r->lm_head, NULL, r->logits);
}

// Steps of at most this many tokens are recorded as graphs by backends that have them.
#define KAON_GRAPH_MAX_TOKENS 256

// The batch size a decode step is padded to: 1, 2, 4, 8, then multiples of 8 up to 64, then
// of 32 (a graph per size).
static int ladder(int n) {
    if (n <= 8) {
        int p = 1;
        while (p < n) p *= 2;
        return p;
    }
    return n <= 64 ? (n + 7) / 8 * 8 : (n + 31) / 32 * 32;
}

// A copy of b shaped for graph replay: decode-only batches padded with inert tokens (no
// sequence, no slot, position -1: attention gives them zeros, their KV is not written) and
// block tables widened to a power of two. Returns b itself when that does not apply.
static const kaon_batch *graph_shape(kaon_runner *r, const kaon_batch *b, kaon_batch *out) {
    const kaon_attn_meta *a = &b->attn;
    const int n = b->n_tokens;
    const bool decode = n == a->n_seqs && b->n_logits == n;
    for (int i = 0; decode && i < n; i++)
        if (b->logit_rows[i] != i || a->token_seq[i] != i) return b;
    const int np = decode ? ladder(n) : n;
    if (np > r->max_tokens || np > r->max_logits) return b;
    int mb = 1;
    while (mb < a->max_blocks) mb *= 2;
    const int ns = decode ? np : a->n_seqs;
    const size_t need = (size_t)ns * mb;
    if (!r->pad_i32 && !(r->pad_i32 = malloc(sizeof(int32_t) * 5 * (size_t)r->max_tokens))) return b;
    if (need > r->pad_tables_cap) {
        int32_t *t = realloc(r->pad_tables, sizeof(int32_t) * need * 2);
        if (!t) return b;
        r->pad_tables = t;
        r->pad_tables_cap = need * 2;
    }
    int32_t *tok = r->pad_i32, *pos = tok + r->max_tokens, *sq = pos + r->max_tokens;
    int32_t *slot = sq + r->max_tokens, *rows = slot + r->max_tokens;
    memcpy(tok, b->tokens, sizeof(int32_t) * n);
    memcpy(pos, a->positions, sizeof(int32_t) * n);
    memcpy(sq, a->token_seq, sizeof(int32_t) * n);
    memcpy(slot, a->slot_mapping, sizeof(int32_t) * n);
    memcpy(rows, b->logit_rows, sizeof(int32_t) * b->n_logits);
    for (int i = n; i < np; i++) {
        tok[i] = 0;
        pos[i] = -1;
        sq[i] = -1;
        slot[i] = -1;
        rows[i] = i;
    }
    for (int s = 0; s < a->n_seqs; s++)
        memcpy(r->pad_tables + (size_t)s * mb, a->block_tables + (size_t)s * a->max_blocks,
               sizeof(int32_t) * a->max_blocks);
    *out = (kaon_batch){
        .n_tokens = np,
        .tokens = tok,
        .attn = {.n_tokens = np, .n_seqs = ns, .positions = pos, .token_seq = sq, .slot_mapping = slot,
                 .block_tables = r->pad_tables, .max_blocks = mb, .block_size = a->block_size},
        .n_logits = decode ? np : b->n_logits,
        .logit_rows = rows,
    };
    return out;
}

// Runs the layers of one step (replaying or recording a graph where the backend has them).
static int forward_layers(kaon_runner *r, const kaon_batch *b) {
    if (check_batch(r, b)) return -1;
    kaon_batch padded;
    if (r->be->ops->graph_begin && b->n_tokens <= KAON_GRAPH_MAX_TOKENS) b = graph_shape(r, b, &padded);
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    if (op->begin_step && op->begin_step(be, b->tokens, &b->attn, b->logit_rows, b->n_logits))
        return -1;
    // A step's shapes and buffers are fixed by these sizes (and by this runner).
    const bool graph = op->graph_begin && b->n_tokens <= KAON_GRAPH_MAX_TOKENS;
    int replayed = 0;
    if (graph) {
        uint64_t key = (uint64_t)(uintptr_t)r;
        const int64_t parts[5] = {b->n_tokens, b->attn.n_seqs, b->n_logits, b->attn.max_blocks,
                                  b->attn.block_size};
        for (int i = 0; i < 5; i++) key = (key ^ (uint64_t)parts[i]) * 0x100000001b3ull;
        replayed = op->graph_begin(be, key);
        if (replayed < 0) return -1;
    }
    if (!replayed) run_layers(r, b);
    if (graph && op->graph_end(be)) return -1;
    return 0;
}

int kaon_runner_forward(kaon_runner *r, const kaon_batch *b, float *logits) {
    if (forward_layers(r, b)) return -1;
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    const size_t n_out = (size_t)b->n_logits * r->m->cfg.vocab_size;
    if (b->n_logits && r->logits_f32) op->copy_f32_to_host(be, r->logits, n_out, logits);
    else if (b->n_logits) op->to_host_f32(be, r->logits, n_out, logits);
    if (op->status && op->status(be)) return -1;
    return 0;
}

bool kaon_runner_can_sample(const kaon_runner *r) {
    return r->logits_f32 && r->be->ops->sample && r->be->ops->copy_rows_f32_to_host;
}

int kaon_runner_forward_sample(kaon_runner *r, const kaon_batch *b, const kaon_sample_batch *sb,
                               int32_t *ids, float *logprobs, const int32_t *host_rows,
                               int n_host_rows, float *logits) {
    if (!kaon_runner_can_sample(r)) return kaon_set_error("runner: this backend does not sample");
    if (forward_layers(r, b)) return -1;
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    const int V = r->m->cfg.vocab_size;
    // The host's rows first: sampling edits its rows in place.
    if (n_host_rows && op->copy_rows_f32_to_host(be, r->logits, V, host_rows, n_host_rows, logits))
        return op->status(be), -1;
    if (sb && sb->n_rows && op->sample(be, r->logits, V, sb, ids, logprobs)) return op->status(be), -1;
    if (op->status && op->status(be)) return -1;
    return 0;
}

int kaon_runner_enable_expert_stats(kaon_runner *r) {
    if (r->moe_stats) return 0;
    r->moe_stats = kaon_moe_stats_create(r->be, r->m);
    return r->moe_stats ? 0 : -1;
}

int kaon_runner_expert_load(kaon_runner *r, uint64_t *out) {
    if (!r->moe_stats) return 0;
    if (kaon_moe_stats_read(r->be, r->moe_stats)) return -1;
    const kaon_moe_stats *s = r->moe_stats;
    memcpy(out, s->total, sizeof *out * (size_t)s->n_layers * (size_t)s->n_experts);
    return s->n_experts;
}
