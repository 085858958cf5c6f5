// The runner (runner.h): model-agnostic buffers, the KV cache from the architecture's spec,
// device copies of the weights, the CUDA-graph ladder, and the hand-off of logits to the host
// or to the backend's sampler. The forward pass itself is the architecture's (model/arch.h).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "model/eagle3.h"
#include "model/model.h"
#include "model/moe.h"
#include "model/tp.h"
#include "util/err.h"
#include "util/log.h"

struct kaon_runner {
    const kaon_model *m;
    kaon_backend *be;
    int max_tokens, max_logits, n_blocks, block_size;
    // The weights the forward pass reads: the model's own (used in place from the mapping)
    // or, on a backend with an upload op, the backend's copies (owned here).
    const kaon_weights *w;
    kaon_weights dev;
    bool dev_weights;
    bool logits_f32;   // logits computed and copied in f32 (linear_f32 + copy_f32_to_host)
    kaon_kv_layer *kv; // [n_layers]
    size_t kv_elem;    // bytes per cache element
    kaon_acts a;       // scratch activations in the backend's memory, sized for max_tokens
    kaon_moe_stats *moe_stats;  // expert load counters; NULL until enabled
    // Graph-friendly copies of a step's index arrays: decode batches padded to a ladder of
    // sizes and block tables to a power-of-two width, so a few graphs serve every step.
    int32_t *pad_i32;     // tokens, positions, seqs, slots, rows: 5 x max_tokens
    int32_t *pad_tables;  // [pad_tables_cap]
    size_t pad_tables_cap;
    void *xbuf;           // kaon_fwd's grow-only buffer (backend memory)
    size_t xbuf_cap;
    // Speculative decoding's draft model (kaon_runner_keep_hidden): every forward's final
    // normed hidden states, the draft step's gathered inputs, and its greedy sampling rows.
    void *hidden;         // [max_tokens, dim] or NULL
    void *hin;            // [max_tokens, dim]
    kaon_sample_row *greedy;  // [max_logits]
    // An EAGLE-3 head (model/eagle3.h): its weights, its KV layer kv[n_layers], the target's
    // embedding it may share, and (kaon_runner_keep_hidden) hidden = the target's aux states
    // [max_tokens, 3 dim], hin [max_tokens, 3 dim], its own outputs dhid and its input dcat.
    const kaon_model *head;
    const kaon_weights *hw;
    kaon_weights hdev;
    bool hdev_weights;
    kaon_linear temb;
    void *dhid, *dcat;
    kaon_tp *tp;              // a tensor-parallel group's runner: the ranks do the work
    struct kaon_tp_rank *tp_rank;  // one rank of such a group: its collectives
};

static void *act(kaon_runner *r, size_t elems, int *fail) {
    void *p = r->be->ops->alloc(r->be, elems * r->be->ops->act_elem_bytes);
    if (!p) *fail = 1;
    return p;
}

// Width of the dense MLP buffers: the config's, or 1 when every layer has experts instead.
static size_t dense_ffn(const kaon_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (!kaon_model_layer_is_moe(m, l)) return (size_t)m->cfg.intermediate_size;
    return 1;
}

// KV elements per token of layer l, for K and for V.
static void kv_elems(const kaon_model *m, int l, size_t *k, size_t *v) {
    if (l == m->cfg.n_layers) {  // an EAGLE-3 head's layer
        *k = *v = (size_t)m->eagle3->head->cfg.n_kv_heads * m->eagle3->head->cfg.head_dim;
        return;
    }
    *k = *v = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    if (m->arch->kv_spec) m->arch->kv_spec(&m->cfg, l, k, v);
}

size_t kaon_runner_act_bytes(const kaon_model *m, size_t elem_bytes, int max_batch_tokens,
                             int max_logits) {
    const kaon_model_config *c = &m->cfg;
    size_t T = (size_t)max_batch_tokens, dim = (size_t)c->hidden_size;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ffn = dense_ffn(m);
    size_t extra = m->arch && m->arch->scratch_elems ? m->arch->scratch_elems(c) : 0;
    size_t elems = T * (3 * dim + 2 * qd + 2 * kvd + 2 * ffn + extra) + (size_t)max_logits * dim;
    return elems * elem_bytes + (size_t)max_logits * (size_t)c->vocab_size * sizeof(float) +
           kaon_moe_act_bytes(m, elem_bytes, max_batch_tokens);
}

size_t kaon_kv_elem_bytes(const kaon_backend *be, int kv_dtype) {
    return kv_dtype == KAON_KV_FP8 ? 1 : be->ops->act_elem_bytes;
}

// A per-layer KV scale from the checkpoint under any of the names vLLM accepts (compressed-
// tensors: self_attn.k_scale; ModelOpt: self_attn.k_proj.k_scale; some: self_attn.attn.k_scale).
// 1.0 when absent; -1 + error when present but unusable.
static int kv_scale(const kaon_model *m, int l, char kv, float *out) {
    static const char *const fmt[] = {"model.layers.%d.self_attn.%c_scale",
                                      "model.layers.%d.self_attn.%c_proj.%c_scale",
                                      "model.layers.%d.self_attn.attn.%c_scale"};
    *out = 1.0f;
    if (m->format == KAON_FORMAT_DUMMY) return 0;
    for (size_t i = 0; i < sizeof fmt / sizeof fmt[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, fmt[i], l, kv, kv);
        kaon_tensor t = {0};
        if (kaon_model_find_tensor(m, name, &t)) return -1;
        if (!t.data) continue;
        const float s = kaon_tensor_f32_at(&t, 0);
        if (!(s > 0.0f) || !isfinite(s))
            return kaon_set_error("runner: %s = %g is not a usable FP8 KV cache scale", name, (double)s);
        *out = s;
        return 0;
    }
    return 0;
}

// The number of KV layers: the model's, and an EAGLE-3 head's one.
static int kv_layers(const kaon_runner *r) { return r->m->cfg.n_layers + (r->head ? 1 : 0); }

// An EAGLE-3 head's weights where the target's are (device copies or, dummy on the host, random
// values in place), and the target's embedding for a head without one.
static int attach_head(kaon_runner *r, const kaon_model *m) {
    kaon_backend *be = r->be;
    r->head = m->eagle3->head;
    r->hw = &r->head->w;
    if (be->ops->upload) {
        r->hdev_weights = true;
        if (kaon_weights_upload(be, r->head, &r->hdev)) return -1;
        r->hw = &r->hdev;
    } else if (r->head->format == KAON_FORMAT_DUMMY && kaon_weights_fill_host((kaon_model *)r->head)) {
        return -1;
    }
    for (int i = 0; i < m->arch->n_weights; i++) {
        const kaon_weight_spec *s = &m->arch->weights[i];
        if (s->hf && !strcmp(s->hf, "model.embed_tokens.weight")) r->temb.w = *kaon_weight_slot(m, r->w, s, 0);
    }
    if (!r->temb.w.data) return kaon_set_error("runner: %s has no embedding for the EAGLE-3 head to share", m->path);
    return 0;
}

kaon_runner *kaon_runner_create(const kaon_model *m, kaon_backend *be, int max_batch_tokens,
                                int max_logits, int n_blocks, int block_size) {
    return kaon_runner_create_kv(m, be, max_batch_tokens, max_logits, n_blocks, block_size, KAON_KV_NATIVE);
}

kaon_runner *kaon_runner_create_kv(const kaon_model *m, kaon_backend *be, int max_batch_tokens,
                                   int max_logits, int n_blocks, int block_size, int kv_dtype) {
    const kaon_model_config *c = &m->cfg;
    if (kv_dtype == KAON_KV_FP8) {
        const bool mla = c->kv_lora_rank > 0;
        if (mla ? !be->ops->kv_fp8_mla : !be->ops->kv_fp8) {
            kaon_set_error("runner: the %s backend cannot read an FP8 KV cache%s yet; use "
                           "--kv-cache-dtype auto", be->ops->name, mla ? " for MLA (latent) attention" : "");
            return NULL;
        }
    } else if (kv_dtype != KAON_KV_NATIVE) {
        kaon_set_error("runner: unknown KV cache dtype %d", kv_dtype);
        return NULL;
    }
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
    if (m->arch->supports && m->arch->supports(be)) return NULL;
    kaon_runner *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->m = m;
    r->be = be;
    r->w = &m->w;
    if (be->ops->upload) {
        r->dev_weights = true;
        if (kaon_weights_upload(be, m, &r->dev)) {
            kaon_runner_free(r);
            return NULL;
        }
        r->w = &r->dev;
    } else if (m->format == KAON_FORMAT_DUMMY && kaon_weights_fill_host((kaon_model *)m)) {
        // The host backend computes on the model's memory: the placeholders get values there.
        kaon_runner_free(r);
        return NULL;
    }
    if (m->eagle3 && attach_head(r, m)) {
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
    kaon_acts *a = &r->a;
    a->x = act(r, T * dim, &fail);
    a->xn = act(r, T * dim, &fail);
    a->q = act(r, T * qd, &fail);
    a->k = act(r, T * kvd, &fail);
    a->v = act(r, T * kvd, &fail);
    a->att = act(r, T * qd, &fail);
    a->proj = act(r, T * dim, &fail);
    a->gate = act(r, T * ffn, &fail);
    a->up = act(r, T * ffn, &fail);
    a->rows = act(r, (size_t)max_logits * dim, &fail);
    if (m->arch->scratch_elems) a->scratch = act(r, T * m->arch->scratch_elems(c), &fail);
    r->logits_f32 = be->ops->linear_f32 && be->ops->copy_f32_to_host;
    if (r->logits_f32) {
        a->logits = be->ops->alloc(be, (size_t)max_logits * c->vocab_size * sizeof(float));
        if (!a->logits) fail = 1;
    } else {
        a->logits = act(r, (size_t)max_logits * c->vocab_size, &fail);
    }
    r->kv = calloc((size_t)kv_layers(r), sizeof *r->kv);
    if (!r->kv) fail = 1;
    r->kv_elem = kaon_kv_elem_bytes(be, kv_dtype);
    for (int l = 0; !fail && l < kv_layers(r); l++) {
        size_t ke, ve;
        kv_elems(m, l, &ke, &ve);
        kaon_kv_layer *kv = &r->kv[l];
        kv->dtype = kv_dtype;
        if (l == c->n_layers) {  // the EAGLE-3 head's
            kv->k_scale = kv->v_scale = 1.0f;
        } else if (kv_dtype == KAON_KV_FP8 && (kv_scale(m, l, 'k', &kv->k_scale) || kv_scale(m, l, 'v', &kv->v_scale))) {
            kaon_runner_free(r);
            return NULL;
        }
        kv->k = be->ops->alloc(be, (size_t)n_blocks * block_size * ke * r->kv_elem);
        kv->v = ve ? be->ops->alloc(be, (size_t)n_blocks * block_size * ve * r->kv_elem) : NULL;
        if (!kv->k || (ve && !kv->v)) fail = 1;
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

// A runner whose forward is done by a group of rank threads (tp.h): tensor parallel or DP attention.
static kaon_runner *runner_over_ranks(const kaon_model *m, int n_blocks, int block_size, kaon_tp *tp) {
    if (!tp) return NULL;
    kaon_runner *r = calloc(1, sizeof *r);
    if (!r) {
        kaon_tp_free(tp);
        return NULL;
    }
    r->m = m;
    r->n_blocks = n_blocks;
    r->block_size = block_size;
    r->tp = tp;
    return r;
}

kaon_runner *kaon_runner_create_tp(const kaon_model *m, int size, bool ep, int n_threads, int max_batch_tokens,
                                   int max_logits, int n_blocks, int block_size, int kv_dtype, int cuda_device) {
    return runner_over_ranks(m, n_blocks, block_size,
                             kaon_tp_create(m, size, ep, n_threads, max_batch_tokens, max_logits, n_blocks,
                                            block_size, kv_dtype, cuda_device));
}

kaon_runner *kaon_runner_create_dp(const kaon_model *m, int size, int n_threads, int max_batch_tokens,
                                   int max_logits, int n_blocks, int block_size, int kv_dtype) {
    return runner_over_ranks(m, n_blocks, block_size,
                             kaon_dp_create(m, size, n_threads, max_batch_tokens, max_logits, n_blocks, block_size,
                                            kv_dtype));
}

void kaon_runner_set_tp_rank(kaon_runner *r, struct kaon_tp_rank *t) { r->tp_rank = t; }

int kaon_runner_rank_stats(kaon_runner *r, struct kaon_rank_stats *out, int cap) {
    return r->tp ? kaon_tp_rank_stats(r->tp, out, cap) : 0;
}

int kaon_runner_follow(kaon_runner *r) {
    if (!r->tp) return kaon_set_error("multi-node: a follower process needs --tensor-parallel-size > 1");
    return kaon_tp_follow(r->tp);
}

void kaon_runner_free(kaon_runner *r) {
    if (!r) return;
    if (r->tp) {
        kaon_tp_free(r->tp);
        free(r);
        return;
    }
    kaon_backend *be = r->be;
    kaon_moe_stats_free(be, r->moe_stats);
    free(r->pad_i32);
    free(r->pad_tables);
    if (r->xbuf) be->ops->free(be, r->xbuf);
    const kaon_acts *a = &r->a;
    free(r->greedy);
    void *bufs[] = {a->x, a->xn, a->q, a->k, a->v, a->att, a->proj, a->gate, a->up, a->rows, a->logits, a->scratch,
                    r->hidden, r->hin, r->dhid, r->dcat};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
    if (r->kv) {
        for (int l = 0; l < kv_layers(r); l++) {
            if (r->kv[l].k) be->ops->free(be, r->kv[l].k);
            if (r->kv[l].v) be->ops->free(be, r->kv[l].v);
        }
        free(r->kv);
    }
    if (r->dev_weights) kaon_weights_release(be, r->m, &r->dev);
    if (r->hdev_weights) kaon_weights_release(be, r->head, &r->hdev);
    free(r);
}

void kaon_runner_reserve_host_kv(kaon_runner *r) {
    if (r->tp) {
        kaon_tp_reserve_host_kv(r->tp);
        return;
    }
    for (int l = 0; l < kv_layers(r); l++) {
        size_t ke, ve;
        kv_elems(r->m, l, &ke, &ve);
        const size_t per = (size_t)r->n_blocks * r->block_size * r->kv_elem;
        memset(r->kv[l].k, 0, per * ke);
        if (r->kv[l].v) memset(r->kv[l].v, 0, per * ve);
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

// The layers of one step, from the embedding to the logits (left in a.logits); the draft
// model's step when draft.
static void run_layers_of(kaon_runner *r, const kaon_batch *b, bool graphed, bool draft, bool draft_fc) {
    kaon_fwd f = {
        .be = r->be,
        .op = r->be->ops,
        .m = r->m,
        .c = &r->m->cfg,
        .w = r->w,
        .kv = r->kv,
        .a = r->a,
        .logits_f32 = r->logits_f32,
        .expert_counts = r->moe_stats ? r->moe_stats->dev : NULL,
        .graphed = graphed,
        .xbuf = &r->xbuf,
        .xbuf_cap = &r->xbuf_cap,
        .hidden_out = r->head ? NULL : r->hidden,
        .hin = r->hin,
        .tp = r->tp_rank,
    };
    if (r->head && r->hidden) {
        f.aux_out = r->hidden;
        memcpy(f.aux_layers, r->m->eagle3->aux_layers, sizeof f.aux_layers);
    }
    if (draft && r->head) {  // the head in the target's buffers, on its own KV layer
        f.m = r->head;
        f.c = &r->head->cfg;
        f.w = r->hw;
        f.kv = r->kv + r->m->cfg.n_layers;
        f.expert_counts = NULL;
        f.aux_out = NULL;
        f.hidden_out = r->dhid;
        f.dcat = r->dcat;
        f.draft_embed = &r->temb;
        f.draft_fc = draft_fc;
        r->head->arch->draft_forward(&f, b);
    } else if (draft) {
        r->m->arch->draft_forward(&f, b);
    } else {
        r->m->arch->forward(&f, b);
    }
}

static void run_layers(kaon_runner *r, const kaon_batch *b, bool graphed) { run_layers_of(r, b, graphed, false, false); }

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
    int replayed = 0, recording = 0;
    uint64_t key = (uint64_t)(uintptr_t)r;
    if (graph) {
        const int64_t parts[5] = {b->n_tokens, b->attn.n_seqs, b->n_logits, b->attn.max_blocks,
                                  b->attn.block_size};
        for (int i = 0; i < 5; i++) key = (key ^ (uint64_t)parts[i]) * 0x100000001b3ull;
        const int g = op->graph_begin(be, key);
        if (g < 0) return -1;
        replayed = g == 1;
        recording = g == 2;
    }
    // Host-side choices that depend on the step's positions are off in every step of a graph's
    // shape, recorded or not: the eager first run of a shape must allocate what its recording
    // (the next run) will use.
    if (!replayed) run_layers(r, b, graph);
    if (graph && op->graph_end(be)) {
        // A recording that failed (a step needing something its eager run did not leave, e.g. a
        // matrix plan evicted meanwhile) ran nothing; its shape stays eager from now on, and
        // this step runs eagerly now instead of failing its sequences.
        if (!recording || !op->status) return -1;
        KAON_WARN("runner: %s; the step runs without a graph", kaon_last_error());
        op->status(be);
        if (op->graph_begin(be, key) < 0) return -1;
        run_layers(r, b, graph);
        return op->graph_end(be);
    }
    return 0;
}

int kaon_runner_forward(kaon_runner *r, const kaon_batch *b, float *logits) {
    if (r->tp) return kaon_tp_forward(r->tp, b, logits);
    if (forward_layers(r, b)) return -1;
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    const size_t n_out = (size_t)b->n_logits * r->m->cfg.vocab_size;
    if (logits && b->n_logits && r->logits_f32) op->copy_f32_to_host(be, r->a.logits, n_out, logits);
    else if (logits && b->n_logits) op->to_host_f32(be, r->a.logits, n_out, logits);
    if (op->status && op->status(be)) return -1;
    return 0;
}

bool kaon_runner_can_sample(const kaon_runner *r) {
    return !r->tp && r->logits_f32 && r->be->ops->sample && r->be->ops->copy_rows_f32_to_host;
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
    if (n_host_rows && op->copy_rows_f32_to_host(be, r->a.logits, V, host_rows, n_host_rows, logits))
        return op->status(be), -1;
    if (sb && sb->n_rows && op->sample(be, r->a.logits, V, sb, ids, logprobs)) return op->status(be), -1;
    if (op->status && op->status(be)) return -1;
    return 0;
}

int kaon_runner_enable_expert_stats(kaon_runner *r) {
    if (r->tp) return kaon_set_error("expert statistics: not with tensor parallelism yet");
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

// ---- speculative decoding's draft model ----------------------------------------------------

int kaon_runner_keep_hidden(kaon_runner *r) {
    if (r->hidden) return 0;
    if (r->tp) return kaon_set_error("speculative decoding with a draft model: not with tensor parallelism yet");
    const size_t n = (size_t)r->max_tokens * (size_t)r->m->cfg.hidden_size;
    int fail = 0;
    if (r->head) {  // three target states per token; the head's outputs and input rows
        r->hidden = act(r, 3 * n, &fail);
        r->hin = act(r, 3 * n, &fail);
        r->dhid = act(r, n, &fail);
        r->dcat = act(r, 2 * n, &fail);
    } else {
        if (!r->m->arch->draft_forward || r->m->cfg.n_mtp_layers < 1)
            return kaon_set_error("runner: %s has no draft model loaded", r->m->path);
        r->hidden = act(r, n, &fail);
        r->hin = act(r, n, &fail);
    }
    r->greedy = calloc((size_t)r->max_logits, sizeof *r->greedy);
    if (fail || !r->greedy) return kaon_set_error("runner: out of memory for the draft model's hidden states");
    return 0;
}

int kaon_runner_draft(kaon_runner *r, const kaon_batch *b, const int32_t *src, bool chained, int32_t *ids,
                      float *logits) {
    if (!r->hidden) return kaon_set_error("runner: kaon_runner_keep_hidden was not called");
    if (check_batch(r, b)) return -1;
    for (int t = 0; t < b->n_tokens; t++)
        if (src[t] < 0 || src[t] >= r->max_tokens) return kaon_set_error("runner: hidden row %d out of range", src[t]);
    const kaon_backend_ops *op = r->be->ops;
    kaon_backend *be = r->be;
    const int V = r->head ? r->head->cfg.draft_vocab_size : r->m->cfg.vocab_size, dim = r->m->cfg.hidden_size;
    // Eager (no graph): the gather's indices are a host array begin_step does not know.
    if (op->begin_step && op->begin_step(be, b->tokens, &b->attn, b->logit_rows, b->n_logits)) return -1;
    // Before the step overwrites them: MTP's h rows; EAGLE-3's target states (pass 1) or its
    // own previous outputs (chained).
    if (!r->head) op->get_rows(be, r->hidden, src, b->n_tokens, dim, r->hin);
    else if (!chained) op->get_rows(be, r->hidden, src, b->n_tokens, 3 * dim, r->hin);
    else op->get_rows(be, r->dhid, src, b->n_tokens, dim, r->hin);
    run_layers_of(r, b, false, true, r->head && !chained);
    if (b->n_logits == 0) return op->status ? op->status(be) : 0;
    if (ids && kaon_runner_can_sample(r)) {  // greedy on the device: only the ids come back
        for (int i = 0; i < b->n_logits; i++)
            r->greedy[i] = (kaon_sample_row){.logit_row = i, .temperature = 0.0f, .top_p = 1.0f, .repetition = 1.0f};
        const kaon_sample_batch sb = {.n_rows = b->n_logits, .rows = r->greedy};
        float *lps = logits;  // unused (no logprob wanted), but the op writes n_rows floats
        if (op->sample(be, r->a.logits, V, &sb, ids, lps)) return op->status(be), -1;
    } else {
        const size_t n_out = (size_t)b->n_logits * V;
        if (r->logits_f32) op->copy_f32_to_host(be, r->a.logits, n_out, logits);
        else op->to_host_f32(be, r->a.logits, n_out, logits);
        for (int i = 0; ids && i < b->n_logits; i++) {  // the first maximum, as greedy sampling takes it
            const float *row = logits + (size_t)i * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            ids[i] = best;
        }
    }
    if (op->status && op->status(be)) return -1;
    for (int i = 0; ids && r->head && i < b->n_logits; i++) ids[i] = kaon_eagle3_target_id(r->m->eagle3, ids[i]);
    return 0;
}
