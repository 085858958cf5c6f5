// Tensor parallelism inside one process (tp.h): the split of a model into rank shards, the
// worker threads that run a step on every rank, and the forward pass's collectives.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/cluster.h"
#include "model/arch.h"
#include "model/step_msg.h"
#include "model/tp.h"
#include "util/err.h"
#include "util/log.h"
#include "util/timer.h"

extern const kaon_arch_ops kaon_arch_llama, kaon_arch_deepseek2;

// The experts' part of rank r's layout (kaon_tp_plan, dp_plan); what: "tensor parallel" or
// "data parallel", for the errors.
static int plan_experts(const kaon_model_config *c, int size, int rank, kaon_tp_layout *out, const char *what) {
    const int E = c->n_experts, F = c->moe_intermediate_size, SF = c->shared_expert_intermediate_size;
    if (SF > 0 && SF % size)
        return kaon_set_error("%s: shared_expert_intermediate_size %d does not split over %d ranks", what, SF,
                              size);
    out->sf0 = SF > 0 ? rank * (SF / size) : 0;
    out->nsf = SF > 0 ? SF / size : 0;
    if (out->ep) {
        if (E < size)
            return kaon_set_error("%s: expert parallel with %d experts over %d ranks (a rank without experts; "
                                  "use fewer ranks%s)", what, E, size,
                                  strcmp(what, "tensor parallel") ? "" : " or leave --enable-expert-parallel off");
        out->e0 = (int)((int64_t)rank * E / size);  // contiguous, uneven by at most one expert
        out->ne = (int)((int64_t)(rank + 1) * E / size) - out->e0;
        out->mf0 = 0, out->nmf = F;
        return 0;
    }
    if (F % size)
        return kaon_set_error("tensor parallel: moe_intermediate_size %d does not split over %d ranks (try "
                              "--enable-expert-parallel)", F, size);
    out->e0 = 0, out->ne = E;
    out->nmf = F / size;
    out->mf0 = rank * out->nmf;
    return 0;
}

int kaon_tp_plan(const kaon_model *m, int size, int rank, bool ep, kaon_tp_layout *out) {
    const kaon_model_config *c = &m->cfg;
    const int nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->intermediate_size;
    memset(out, 0, sizeof *out);
    out->ep = ep && c->n_experts > 0;  // a dense model has no experts to place: plain TP
    if (size < 1 || rank < 0 || rank >= size) return kaon_set_error("tensor parallel: rank %d of %d", rank, size);
    if (m->arch != &kaon_arch_llama && m->arch != &kaon_arch_deepseek2)
        return kaon_set_error("tensor parallel: the %s architecture cannot be split yet (the Llama and "
                              "DeepSeek families can)", m->arch->label);
    bool dense = c->n_experts <= 0;  // any dense-MLP layer (its width must split too)
    for (int l = 0; l < c->n_layers && !dense; l++) dense = !kaon_model_layer_is_moe(m, l);
    if (nh % size)
        return kaon_set_error("tensor parallel: %d attention heads do not split over %d ranks", nh, size);
    if (nkv >= size ? nkv % size : size % nkv)
        return kaon_set_error("tensor parallel: %d KV heads do not split over %d ranks (the ranks must be a "
                              "multiple of the KV heads, or divide them)", nkv, size);
    if (dense && ffn % size)
        return kaon_set_error("tensor parallel: intermediate_size %d does not split over %d ranks", ffn, size);
    if (c->n_experts > 0 && plan_experts(c, size, rank, out, "tensor parallel")) return -1;
    if (c->vocab_size < size)
        return kaon_set_error("tensor parallel: a vocabulary of %d over %d ranks", c->vocab_size, size);
    out->nq = nh / size;
    out->q0 = rank * out->nq;
    if (nkv >= size) {
        out->nkv = nkv / size;
        out->kv0 = rank * out->nkv;
    } else {
        out->nkv = 1;  // the KV head this rank's Q heads read (replicated on size / nkv ranks)
        out->kv0 = out->q0 / (nh / nkv);
    }
    out->nf = dense ? ffn / size : ffn;  // unused when every layer has experts
    out->f0 = dense ? rank * out->nf : 0;
    return 0;
}

// Data-parallel attention's layout of rank r: attention, dense layers and the LM head whole
// (replicated); the routed experts placed as under expert parallelism, the shared expert's
// columns split (its part rides in the exchange's sum like the routed experts' outputs).
static int dp_plan(const kaon_model *m, int size, int rank, kaon_tp_layout *out) {
    const kaon_model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    out->ep = c->n_experts > 0;
    if (size < 1 || rank < 0 || rank >= size) return kaon_set_error("data parallel: rank %d of %d", rank, size);
    if (m->arch != &kaon_arch_llama && m->arch != &kaon_arch_deepseek2)
        return kaon_set_error("data parallel: the %s architecture cannot run DP attention yet (the Llama and "
                              "DeepSeek families can)", m->arch->label);
    if (c->n_experts > 0 && plan_experts(c, size, rank, out, "data parallel")) return -1;
    out->nq = c->n_heads, out->nkv = c->n_kv_heads, out->nf = c->intermediate_size;
    return 0;
}

int kaon_dp_check(const kaon_model *m, int size) {
    kaon_tp_layout lay;
    for (int r = 0; r < size; r++)
        if (dp_plan(m, size, r, &lay)) return -1;
    return 0;
}

// ---- shards -------------------------------------------------------------------------------

typedef struct tp_worker {
    struct kaon_tp *tp;
    int rank;
    long steps;              // steps run (KAON_TP_FAIL counts them)
    kaon_tp_layout lay;
    kaon_model *m;           // this rank's description and weights (views + owned copies)
    kaon_tp_owned own;       // column slices copied at load
    kaon_backend *be;
    kaon_runner *r;
    kaon_tp_rank ctx;
    pthread_t th;
    bool started;
    int rc;
    char err[1024];
    // Data-parallel attention: its part of the pool and its sub-batch of each step.
    int blk0, n_blk;             // blocks [blk0, blk0 + n_blk) of the engine's pool
    int32_t *sub;                // [6, max_tokens] tokens, positions, seqs, slots, rows, row of each token
    int32_t *sub_tables;         // [its seqs, max_blocks] block tables in its own numbering
    size_t sub_tables_cap;
    int32_t *lseq;               // [n_seqs] its index of each batch sequence, -1: another rank's
    int lseq_cap;
    float *logits;               // [max_logits, vocab] its sequences' rows
    int next_row;                // the scatter's cursor into logits
    kaon_rank_stats stats;       // under tp->mu (its thread adds each step's time there)
} tp_worker;

struct kaon_tp {
    int size;                // ranks in all (every process's)
    int n_local, rank0;      // this process's ranks: rank0 + [0, n_local), its workers w[]
    const kaon_cluster *cl;  // a multi-node job (dist/cluster.h), else NULL
    kaon_step_msg msg;       // steps between its processes
    tp_worker *w;
    kaon_comm_cpu_group *group;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen;       // step generation: a worker runs a step when it changes
    int done;                // workers finished with the current step
    bool quit;
    const kaon_batch *b;
    float *logits;
    bool dp;                 // data-parallel attention (kaon_dp_create)
    int max_tokens;
    // CUDA ranks (kaon_tp_create with a device): the first device, every rank on it (the test
    // aid) with its communicator group, or NCCL's unique id for the ranks' threads to join with.
    int device;              // -1: CPU ranks
    bool same_device;
    kaon_comm_cuda_local_group *local;
    unsigned char nccl_id[KAON_COMM_NCCL_ID_BYTES];
    int ready;               // workers through their thread's set-up (rank_thread_init)
    int first_failed;        // this process's first worker (w[]) whose step failed (-1: none)
    char broken[512];        // set when the ranks cannot run again (an aborted NCCL group)
    int fail_rank, fail_step;  // KAON_TP_FAIL=R[:S], a test aid: rank R fails its step S
};

static bool splittable(kaon_dtype t) { return t == KAON_F32 || t == KAON_F16 || t == KAON_BF16 || (t >= KAON_Q4_0 && t <= KAON_IQ4_XS); }

int kaon_tp_cut_rows(kaon_tensor *t, int64_t r0, int64_t n, const char *name) {
    const int64_t in = t->ndim == 2 ? t->shape[1] : 1;
    const size_t rb = kaon_dtype_row_bytes(t->dtype, in);
    if (!rb) return kaon_set_error("tensor parallel: %s (%s) rows cannot be cut", name, kaon_dtype_name(t->dtype));
    if (t->ndim == 1) {
        t->data = (char *)t->data + rb * (size_t)r0;
        t->shape[0] = n;
    } else {
        t->data = (char *)t->data + rb * (size_t)r0;
        t->shape[0] = n;
    }
    t->nbytes = rb * (size_t)n;
    return 0;
}

int kaon_tp_cut_cols(kaon_tp_owned *own, kaon_tensor *t, int64_t c0, int64_t n, const char *name) {
    const int be = kaon_dtype_block_elems(t->dtype);
    if (be < 1 || c0 % be || n % be)
        return kaon_set_error("tensor parallel: columns [%lld, %lld) of %s do not fall on the %d-element blocks "
                              "of its format %s", (long long)c0, (long long)(c0 + n), name, be,
                              kaon_dtype_name(t->dtype));
    const int64_t rows = t->shape[0], in = t->shape[1];
    const size_t rb = kaon_dtype_row_bytes(t->dtype, in), off = kaon_dtype_row_bytes(t->dtype, c0),
                 nb = kaon_dtype_row_bytes(t->dtype, n);
    char *p = malloc(nb * (size_t)rows);
    void **o = realloc(own->p, sizeof *o * (size_t)(own->n + 1));
    if (!p || !o) {
        free(p);
        if (o) own->p = o;
        return kaon_set_error("tensor parallel: out of memory for a shard of %s", name);
    }
    own->p = o;
    own->p[own->n++] = p;
    for (int64_t r = 0; r < rows; r++) memcpy(p + nb * (size_t)r, (const char *)t->data + rb * (size_t)r + off, nb);
    t->data = p;
    t->shape[1] = n;
    t->nbytes = nb * (size_t)rows;
    own->bytes += t->nbytes;
    return 0;
}

int kaon_tp_dim_range(const kaon_tp_layout *lay, const kaon_model_config *c, int dim, int64_t *lo, int64_t *n) {
    const int hd = c->head_dim;
    switch (dim) {
    case KAON_DIM_Q: *lo = (int64_t)lay->q0 * hd, *n = (int64_t)lay->nq * hd; return 0;
    case KAON_DIM_KV: *lo = (int64_t)lay->kv0 * hd, *n = (int64_t)lay->nkv * hd; return 0;
    case KAON_DIM_FFN: *lo = lay->f0, *n = lay->nf; return 0;
    // MLA (DeepSeek): each head's rows of kv_b_proj and of the absorbed W_UK^T, W_UV, W_UK;
    // o_proj's columns of each head's v.
    case KAON_DIM_KV_B:
        *lo = (int64_t)lay->q0 * (c->qk_nope_head_dim + c->v_head_dim);
        *n = (int64_t)lay->nq * (c->qk_nope_head_dim + c->v_head_dim);
        return 0;
    case KAON_DIM_K_B: *lo = (int64_t)lay->q0 * c->kv_lora_rank, *n = (int64_t)lay->nq * c->kv_lora_rank; return 0;
    case KAON_DIM_K_N:
        *lo = (int64_t)lay->q0 * c->qk_nope_head_dim, *n = (int64_t)lay->nq * c->qk_nope_head_dim;
        return 0;
    case KAON_DIM_V_B: *lo = (int64_t)lay->q0 * c->v_head_dim, *n = (int64_t)lay->nq * c->v_head_dim; return 0;
    default: return kaon_set_error("tensor parallel: a weight split along dimension kind %d", dim);
    }
}

// A dummy weight a device backend will create (--load-format dummy, not filled on the host):
// only its shape is cut (its data is a placeholder, never read), and *o records where the cut
// sits in the whole, for the device to create the whole's values there.
static void cut_placeholder(kaon_tensor *t, int dim, int64_t lo, int64_t n, kaon_dummy_origin *o) {
    *o = (kaon_dummy_origin){.dim = dim, .lo = lo, .full = t->shape[dim]};
    t->shape[dim] = n;
    t->nbytes = kaon_dtype_row_bytes(t->dtype, kaon_tensor_numel(t));
}

static int make_shard(tp_worker *w, const kaon_model *base) {
    const kaon_arch_ops *a = base->arch;
    const kaon_model_config *c = &base->cfg;
    const bool placeholders = base->format == KAON_FORMAT_DUMMY && !base->dummy_filled;
    kaon_model *m = calloc(1, sizeof *m);
    if (!m) return kaon_set_error("tensor parallel: out of memory");
    w->m = m;
    memcpy(m, base, sizeof *m);
    m->owned = NULL;
    m->n_owned = 0;
    m->w.moe = NULL;  // its own, from kaon_tp_moe_shard (the base's are never freed here)
    m->w.globals = malloc(a->globals_size);
    m->w.layers = malloc(a->layer_size * (size_t)c->n_layers);
    m->dummy_origin = placeholders ? calloc(a->n_weights * (size_t)c->n_layers, sizeof *m->dummy_origin) : NULL;
    if (!m->w.globals || !m->w.layers || (placeholders && !m->dummy_origin))
        return kaon_set_error("tensor parallel: out of memory");
    memcpy(m->w.globals, base->w.globals, a->globals_size);
    memcpy(m->w.layers, base->w.layers, a->layer_size * (size_t)c->n_layers);
    m->cfg.n_heads = w->lay.nq;
    m->cfg.n_kv_heads = w->lay.nkv;
    m->cfg.intermediate_size = w->lay.nf;
    for (int i = 0; i < (int)a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->shard != KAON_SHARD_COL && s->shard != KAON_SHARD_ROW) continue;
        for (int l = 0; l < (s->per_layer ? c->n_layers : 1); l++) {
            kaon_tensor *t = kaon_weight_slot(m, &m->w, s, l);
            if (!t->data) continue;
            const char *name = s->hf ? s->hf : s->gguf;
            char nm[160];
            snprintf(nm, sizeof nm, name, l);
            if (!splittable(t->dtype))
                return kaon_set_error("tensor parallel: %s is stored as %s, which cannot be split yet (f32, f16, "
                                      "bf16 and GGUF block formats can)", nm, kaon_dtype_name(t->dtype));
            int64_t lo = 0, n = 0;
            if (kaon_tp_dim_range(&w->lay, c, s->dims[s->shard == KAON_SHARD_COL ? 0 : 1], &lo, &n)) return -1;
            if (s->ndim == 2) {
                // The spec names a linear's weight (its first member): the linear says how it
                // was split, and it must carry nothing that would need splitting too.
                kaon_linear *lin = (kaon_linear *)t;
                if (lin->scale.data || lin->zero.data || lin->perm.data || lin->n_parts)
                    return kaon_set_error("tensor parallel: %s has scale companions or fused parts, which cannot "
                                          "be split yet", nm);
                if (s->shard == KAON_SHARD_ROW && lin->bias.data)
                    return kaon_set_error("tensor parallel: %s is row-parallel with a bias", nm);
                lin->shard = (kaon_shard)s->shard;
            }
            if (placeholders)
                cut_placeholder(t, s->shard == KAON_SHARD_COL ? 0 : 1, lo, n, &m->dummy_origin[i * c->n_layers + l]);
            else if (s->shard == KAON_SHARD_COL ? kaon_tp_cut_rows(t, lo, n, nm) : kaon_tp_cut_cols(&w->own, t, lo, n, nm))
                return -1;
        }
    }
    return kaon_tp_moe_shard(m, base, &w->lay, &w->own);
}

static void free_shard(tp_worker *w) {
    if (w->m) {
        kaon_tp_moe_free(w->m);
        free(w->m->dummy_origin);
        free(w->m->w.globals);
        free(w->m->w.layers);
        free(w->m);
        w->m = NULL;
    }
    for (int i = 0; i < w->own.n; i++) free(w->own.p[i]);
    free(w->own.p);
    memset(&w->own, 0, sizeof w->own);
}

// ---- workers ------------------------------------------------------------------------------

// ---- data-parallel attention: a rank's share of a step -------------------------------------

static int rank_of(const kaon_batch *b, int s) { return b->seq_rank ? b->seq_rank[s] : 0; }

// Grows the sub-batch's per-sequence buffers to the step's sequences.
static int dp_reserve(tp_worker *w, const kaon_batch *b) {
    const size_t tables = (size_t)b->attn.n_seqs * (size_t)b->attn.max_blocks;
    if (tables > w->sub_tables_cap) {
        int32_t *t = realloc(w->sub_tables, sizeof(int32_t) * tables);
        if (!t) return kaon_set_error("data parallel: out of memory");
        w->sub_tables = t, w->sub_tables_cap = tables;
    }
    if (b->attn.n_seqs > w->lseq_cap) {
        int32_t *t = realloc(w->lseq, sizeof(int32_t) * (size_t)b->attn.n_seqs);
        if (!t) return kaon_set_error("data parallel: out of memory");
        w->lseq = t, w->lseq_cap = b->attn.n_seqs;
    }
    return 0;
}

// The block tables of this rank's sequences, in its own numbering (blocks of other parts, which
// only stale table entries can name, become -1). Returns its sequences.
static int dp_tables(tp_worker *w, const kaon_batch *b) {
    const int mb = b->attn.max_blocks;
    int ns = 0;
    for (int s = 0; s < b->attn.n_seqs; s++) {
        w->lseq[s] = rank_of(b, s) == w->rank ? ns++ : -1;
        if (w->lseq[s] < 0) continue;
        const int32_t *src = b->attn.block_tables + (size_t)s * mb;
        int32_t *dst = w->sub_tables + (size_t)w->lseq[s] * mb;
        for (int i = 0; i < mb; i++) dst[i] = src[i] >= w->blk0 && src[i] < w->blk0 + w->n_blk ? src[i] - w->blk0 : -1;
    }
    return ns;
}

// This rank's sub-batch of b: the tokens of its sequences (in batch order), slots and tables
// in its cache's numbering, and its logit rows (in batch order, so the scatter can follow).
static int dp_sub_batch(tp_worker *w, const kaon_batch *b, kaon_batch *out) {
    if (dp_reserve(w, b)) return -1;
    const int T = w->tp->max_tokens, bs = b->attn.block_size;
    int32_t *tok = w->sub, *pos = tok + T, *sq = pos + T, *slot = sq + T, *rows = slot + T, *at = rows + T;
    const int ns = dp_tables(w, b);
    int n = 0, nr = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        const int s = b->attn.token_seq[t];
        at[t] = -1;
        if (s < 0 || w->lseq[s] < 0) continue;
        tok[n] = b->tokens[t];
        pos[n] = b->attn.positions[t];
        sq[n] = w->lseq[s];
        slot[n] = b->attn.slot_mapping[t] - w->blk0 * bs;
        at[t] = n++;
    }
    for (int j = 0; j < b->n_logits; j++)
        if (at[b->logit_rows[j]] >= 0) rows[nr++] = at[b->logit_rows[j]];
    *out = (kaon_batch){
        .n_tokens = n,
        .tokens = tok,
        .attn = {.n_tokens = n, .n_seqs = ns, .positions = pos, .token_seq = sq, .slot_mapping = slot,
                 .block_tables = w->sub_tables, .max_blocks = b->attn.max_blocks, .block_size = bs},
        .n_logits = nr,
        .logit_rows = rows,
    };
    return 0;
}

// A rank with no sequence in this step still serves its experts: it joins every MoE layer's
// exchange with no tokens of its own (the others' forwards wait for it there).
static int dp_idle(tp_worker *w) {
    kaon_fwd f = {.be = w->be, .op = w->be->ops, .m = w->m, .c = &w->m->cfg, .tp = &w->ctx};
    for (int l = 0; l < w->m->cfg.n_layers; l++)
        if (kaon_model_layer_is_moe(w->m, l)) kaon_dp_moe(&f, 0, NULL, NULL, &w->m->w.moe[l], NULL, NULL);
    return w->be->ops->status ? w->be->ops->status(w->be) : 0;
}

static int dp_step(tp_worker *w, const kaon_batch *b, float *logits) {
    kaon_batch sb;
    if (dp_sub_batch(w, b, &sb)) return -1;
    return sb.n_tokens ? kaon_runner_forward(w->r, &sb, logits) : dp_idle(w);
}

// Every rank's logit rows put back at the batch's row order.
static void dp_scatter_logits(kaon_tp *tp, const kaon_batch *b, float *logits) {
    const size_t V = (size_t)tp->w[0].m->cfg.vocab_size;
    for (int r = 0; r < tp->size; r++) tp->w[r].next_row = 0;
    for (int j = 0; j < b->n_logits; j++) {
        tp_worker *w = &tp->w[rank_of(b, b->attn.token_seq[b->logit_rows[j]])];
        memcpy(logits + V * (size_t)j, w->logits + V * (size_t)w->next_row++, sizeof(float) * V);
    }
}

// What a rank's own thread sets up before its first step: on CUDA its current device (per
// thread) and, between devices, its NCCL communicator (every rank joins at once).
static int rank_thread_init(tp_worker *w) {
    kaon_tp *tp = w->tp;
    if (tp->device < 0) return 0;
    if (kaon_backend_cuda_bind(w->be)) return -1;
    if (w->ctx.comm) return 0;  // the same-device one, made with the rank
    void *stream = NULL;
    const int dev = kaon_backend_cuda_device(w->be, &stream);
    w->ctx.comm = kaon_comm_nccl_create(tp->nccl_id, tp->size, w->rank, dev, stream);
    if (!w->ctx.comm) return -1;
    w->ctx.comm->stream_ordered = 1;  // the forward pass runs on the same stream; graphs record it
    return 0;
}

// One step of a rank; a CUDA rank waits for its stream, so the step's host arrays are free
// again when the engine gets control back.
static int rank_step(tp_worker *w, const kaon_batch *b, float *logits) {
    int rc = w->tp->dp ? dp_step(w, b, logits) : kaon_runner_forward(w->r, b, logits);
    if (!rc && w->tp->device >= 0) rc = kaon_backend_cuda_sync(w->be);
    return rc;
}

static void *worker_main(void *p) {
    tp_worker *w = p;
    kaon_tp *tp = w->tp;
    unsigned long seen = 0;
    w->rc = rank_thread_init(w);
    if (w->rc) snprintf(w->err, sizeof w->err, "rank %d: %s", w->rank, kaon_last_error());
    pthread_mutex_lock(&tp->mu);
    tp->ready++;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (!tp->quit && tp->gen == seen) pthread_cond_wait(&tp->cv, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->gen;
        const kaon_batch *b = tp->b;
        float *logits = tp->dp ? (tp->logits ? w->logits : NULL) : w->rank == 0 ? tp->logits : NULL;
        pthread_mutex_unlock(&tp->mu);
        w->ctx.failed = 0;
        const double t0 = kaon_now();
        if (w->rank == tp->fail_rank && w->steps == tp->fail_step)  // the test aid: fail before any collective
            w->rc = kaon_set_error("injected failure (KAON_TP_FAIL=%d:%d)", tp->fail_rank, tp->fail_step);
        else
            w->rc = rank_step(w, b, logits);
        const double dt = kaon_now() - t0;
        w->steps++;
        if (!w->rc && w->ctx.failed) w->rc = -1;
        if (w->rc) snprintf(w->err, sizeof w->err, "rank %d: %s", w->rank, kaon_last_error());
        pthread_mutex_lock(&tp->mu);
        w->stats.steps++;
        w->stats.step_seconds += dt;
        w->stats.collective_seconds = w->ctx.comm_s;
        if (w->rc && tp->first_failed < 0) tp->first_failed = w->rank - tp->rank0;
        tp->done++;
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
}

// What every group starts with (kaon_tp_create, kaon_dp_create): its lock, and the test aid
// KAON_TP_FAIL=R[:S] (rank R fails its step S, default 0, before any collective: the abort
// path's tests).
static void tp_init(kaon_tp *tp, int size) {
    tp->size = tp->n_local = size;
    tp->first_failed = -1;
    tp->fail_rank = tp->fail_step = -1;
    const char *f = getenv("KAON_TP_FAIL");
    if (f && *f) {
        char *end;
        tp->fail_rank = (int)strtol(f, &end, 10);
        tp->fail_step = *end == ':' ? (int)strtol(end + 1, NULL, 10) : 0;
    }
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
}

bool kaon_tp_same_device(void) {
    const char *e = getenv("KAON_TP_SAME_DEVICE");
    return e && !strcmp(e, "1");
}

// A weight the CUDA ranks take as it is: f32, f16 or bf16 without scales (NULL), or its format.
static const char *cuda_tp_format(const kaon_linear *l) {
    const kaon_dtype t = l->w.dtype;
    if (t != KAON_F32 && t != KAON_F16 && t != KAON_BF16) return kaon_dtype_name(t);
    return l->scale.data ? "quantized" : NULL;
}

// A MoE model's layers on CUDA ranks (expert parallel, kaon_tp_create): routers, experts and shared
// experts in f32/f16/bf16 (the CUDA upload gives the moe op bf16), no dummy shared expert (its
// split, tp_moe.c, cuts host placeholders that a device never fills: no origin to fill from).
static int cuda_tp_moe_check(const kaon_model *m) {
    const kaon_model_config *c = &m->cfg;
    if (!m->w.moe) return 0;
    if (m->format == KAON_FORMAT_DUMMY && c->shared_expert_intermediate_size > 0)
        return kaon_set_error("tensor parallel on CUDA: --load-format dummy with a shared expert is not supported "
                              "yet (real weights are)");
    for (int l = 0; l < c->n_layers; l++) {
        const kaon_moe_layer *L = &m->w.moe[l];
        if (!L->views) continue;
        const int E = L->w.n_experts;
        for (int i = 0; i < 3 * E + 4; i++) {
            const kaon_linear *v = i < 3 * E ? &L->views[i] : i < 3 * E + 3 ? &L->shared[i - 3 * E] : &L->router;
            if (!v->w.data) continue;
            const char *f = cuda_tp_format(v);
            if (f)
                return kaon_set_error("tensor parallel on CUDA: layer %d's %s stored as %s (f32, f16 and bf16 "
                                      "only for now)", l, i < 3 * E ? "experts are" : i < 3 * E + 3 ?
                                      "shared expert is" : "router is", f);
        }
    }
    return 0;
}

int kaon_tp_cuda_check(const kaon_model *m, int size, int kv_dtype) {
    const kaon_model_config *c = &m->cfg;
    // Mixture-of-experts models pass with expert parallelism only, which kaon_tp_create checks
    // (this one does not know the flag).
    if (m->arch != &kaon_arch_llama || c->kv_lora_rank > 0)
        return kaon_set_error("tensor parallel on CUDA: the Llama family only for now (dense, or mixture of experts "
                              "with --enable-expert-parallel; not %s%s)", m->arch->label,
                              c->kv_lora_rank > 0 ? ", MLA" : "");
    if (m->gguf) return kaon_set_error("tensor parallel on CUDA: GGUF checkpoints are not supported yet");
    if (kv_dtype != KAON_KV_NATIVE) return kaon_set_error("tensor parallel on CUDA: bf16 KV cache only for now");
    if (size > 1 && kaon_tp_same_device() && size > 16)
        return kaon_set_error("tensor parallel: KAON_TP_SAME_DEVICE=1 takes at most 16 ranks");
    const kaon_arch_ops *a = m->arch;
    for (int i = 0; i < (int)a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->flags & KAON_W_EXPERTS) continue;  // the MoE layers: below
        for (int l = 0; l < (s->per_layer ? c->n_layers : 1); l++) {
            const kaon_tensor *t = kaon_weight_slot(m, (kaon_weights *)&m->w, s, l);
            if (!t->data) continue;
            if (t->dtype != KAON_F32 && t->dtype != KAON_F16 && t->dtype != KAON_BF16)
                return kaon_set_error("tensor parallel on CUDA: %s is stored as %s (f32, f16 and bf16 weights only "
                                      "for now)", s->hf ? s->hf : s->gguf, kaon_dtype_name(t->dtype));
            if (s->ndim == 2 && ((const kaon_linear *)t)->scale.data)
                return kaon_set_error("tensor parallel on CUDA: quantized weights are not supported yet");
        }
    }
    return cuda_tp_moe_check(m);
}

// Device bytes of t as the backend stores it (dense: as the moe op reads it).
static size_t dev_bytes(kaon_backend *be, const kaon_tensor *t, bool dense) {
    if (!t->data) return 0;
    return be->ops->weight_bytes ? be->ops->weight_bytes(be, t, dense) : t->nbytes;
}

size_t kaon_tp_rank_weight_bytes(kaon_backend *be, const kaon_model *m, int size) {
    const kaon_arch_ops *a = m->arch;
    size_t total = 0;
    for (int i = 0; i < (int)a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->flags & (KAON_W_HOST | KAON_W_EXPERTS)) continue;
        for (int l = 0; l < (s->per_layer ? m->cfg.n_layers : 1); l++) {
            const kaon_tensor *t = kaon_weight_slot(m, (kaon_weights *)&m->w, s, l);
            if (!t->data) continue;
            const size_t b = be->ops->weight_bytes ? be->ops->weight_bytes(be, t, false) : t->nbytes;
            total += s->shard == KAON_SHARD_COL || s->shard == KAON_SHARD_ROW ? b / (size_t)size : b;
        }
    }
    // MoE layers: the router, the shared expert's gate input and the selection bias whole, the shared
    // expert 1/size, the routed experts' sources ceil(E / size) / E (the most one rank holds under
    // expert parallelism; split experts take 1/size).
    for (int l = 0; m->w.moe && l < m->cfg.n_layers; l++) {
        const kaon_moe_layer *L = &m->w.moe[l];
        if (!m->w.layer_moe[l] || !L->views) continue;
        const int E = L->w.n_experts, most = (E + size - 1) / size;
        total += dev_bytes(be, &L->router.w, true) + dev_bytes(be, &L->shared_gate_inp.w, false) +
                 dev_bytes(be, &L->score_bias, false);
        for (int k = 0; k < 3; k++) total += dev_bytes(be, &L->shared[k].w, false) / (size_t)size;
        size_t experts = 0;
        for (int k = 0; k < L->n_src; k++) experts += dev_bytes(be, &L->src[k], true);
        total += E > 0 ? experts / (size_t)E * (size_t)most : 0;
    }
    return total;
}

// A rank's CUDA device: the first device plus the rank's index in this process; in a multi-node
// job a process's ranks come after those of the job's processes before it on the same machine.
static int rank_device(const kaon_tp *tp, const tp_worker *w) {
    if (tp->same_device) return tp->device;
    return tp->device + (tp->cl ? tp->cl->local_rank * tp->n_local : 0) + (w->rank - tp->rank0);
}

// Rank r's backend: the CPU with its share of the threads, or its CUDA device.
static int rank_backend(kaon_tp *tp, tp_worker *w, int per) {
    if (tp->device < 0) return (w->be = kaon_backend_cpu_create(per)) ? 0 : -1;
    const int dev = rank_device(tp, w);
    if (!(w->be = kaon_backend_cuda_create(dev))) return -1;
    if (tp->same_device) kaon_backend_cuda_no_graphs(w->be);  // host barriers cannot be recorded
    return 0;
}

// The logit slice and gather buffers: host memory on the CPU, the rank's device memory on CUDA.
static int rank_logit_buffers(kaon_tp *tp, tp_worker *w, int max_logits) {
    const size_t part = sizeof(float) * (size_t)max_logits * (size_t)w->ctx.vpad;
    if (tp->device < 0) {
        w->ctx.part = malloc(part);
        w->ctx.gather = malloc(part * (size_t)tp->size);
    } else {
        w->ctx.be = w->be;
        w->ctx.part = w->be->ops->alloc(w->be, part);
        w->ctx.gather = w->be->ops->alloc(w->be, part * (size_t)tp->size);
    }
    if (!w->ctx.part || !w->ctx.gather) return kaon_set_error("tensor parallel: out of memory for the logit slices");
    return 0;
}

// Rank r's communicator, where it is made by the creating thread: the CPU group's or the
// same-device one. NCCL's is made by the rank's own thread (rank_thread_init).
static int rank_comm(kaon_tp *tp, tp_worker *w) {
    if (tp->device < 0) {
        // Across processes: this process's one rank over MPI.
        w->ctx.comm = tp->cl ? kaon_comm_mpi_create() : kaon_comm_cpu_create(tp->group, w->rank);
    } else if (tp->same_device) {
        void *stream = NULL;
        const int dev = kaon_backend_cuda_device(w->be, &stream);
        w->ctx.comm = kaon_comm_cuda_local_create(tp->local, w->rank, dev, stream);
    } else {
        return 0;
    }
    return w->ctx.comm ? 0 : kaon_set_error("tensor parallel: %s", kaon_last_error());
}

// A rank's share as /metrics reports it (kaon_tp_rank_stats).
static void rank_share(tp_worker *w, int n_blocks, int block_size, int kv_dtype) {
    w->stats.rank = w->rank;
    w->stats.weight_bytes = kaon_tp_shard_bytes(w->m, &w->lay);
    w->stats.kv_bytes = (uint64_t)n_blocks * (uint64_t)block_size *
                        kaon_model_kv_bytes_per_token(w->m, kaon_kv_elem_bytes(w->be, kv_dtype));
}

static void log_rank(const kaon_tp *tp, const tp_worker *w, const kaon_model *m, int per) {
    const int r = w->rank, size = tp->size, vpad = w->ctx.vpad, V = m->cfg.vocab_size;
    const size_t kv = w->stats.kv_bytes;
    char where[64];
    if (tp->device < 0) snprintf(where, sizeof where, "%d thread%s", per, per == 1 ? "" : "s");
    else snprintf(where, sizeof where, "cuda:%d%s", rank_device(tp, w),
                  tp->same_device ? " (shared: KAON_TP_SAME_DEVICE)" : "");
    if (tp->cl) {
        const size_t n = strlen(where);
        snprintf(where + n, sizeof where - n, ", process %d", tp->cl->rank);
    }
    KAON_INFO("tensor parallel: rank %d of %d: Q heads [%d, %d), KV heads [%d, %d)%s, FFN [%d, %d), vocab "
              "[%d, %d), %s, KV cache %.1f MiB, weights %.1f MiB (%llu B; slices copied %.1f MiB)",
              r, size, w->lay.q0, w->lay.q0 + w->lay.nq, w->lay.kv0, w->lay.kv0 + w->lay.nkv,
              m->cfg.n_kv_heads < size ? " (replicated)" : "", w->lay.f0, w->lay.f0 + w->lay.nf,
              r * vpad < V ? r * vpad : V, (r + 1) * vpad < V ? (r + 1) * vpad : V, where,
              kv / 1048576.0, w->stats.weight_bytes / 1048576.0, (unsigned long long)w->stats.weight_bytes,
              w->own.bytes / 1048576.0);
    if (m->cfg.n_experts > 0)
        KAON_INFO("tensor parallel: rank %d: %s: experts [%d, %d), expert FFN [%d, %d), shared expert FFN "
                  "[%d, %d)", r, w->lay.ep ? "expert parallel" : "experts split", w->lay.e0,
                  w->lay.e0 + w->lay.ne, w->lay.mf0, w->lay.mf0 + w->lay.nmf, w->lay.sf0, w->lay.sf0 + w->lay.nsf);
    if (tp->device >= 0 && w->be->ops->mem_info) {
        size_t fr = 0, tot = 0;
        w->be->ops->mem_info(w->be, &fr, &tot);
        KAON_INFO("tensor parallel: rank %d: device memory in use after its set-up %.2f GiB of %.2f", r,
                  (tot - fr) / 1073741824.0, tot / 1073741824.0);
    }
}

// Rank r: its layout, shard, backend, runner (weights uploaded, KV cache), collectives' context.
// (i: its worker in this process; its rank is tp->rank0 + i.)
static int make_tp_rank(kaon_tp *tp, int i, const kaon_model *m, bool ep, int per, int max_batch_tokens,
                        int max_logits, int n_blocks, int block_size, int kv_dtype) {
    tp_worker *w = &tp->w[i];
    const int r = tp->rank0 + i;
    w->tp = tp;
    w->rank = r;
    kaon_tp_plan(m, tp->size, r, ep, &w->lay);
    if (make_shard(w, m) || rank_backend(tp, w, per)) return -1;
    w->r = kaon_runner_create_kv(w->m, w->be, max_batch_tokens, max_logits, n_blocks, block_size, kv_dtype);
    if (!w->r) return -1;
    w->ctx.rank = r;
    w->ctx.size = tp->size;
    w->ctx.vocab = m->cfg.vocab_size;
    w->ctx.vpad = (m->cfg.vocab_size + tp->size - 1) / tp->size;
    w->ctx.act = w->be->ops->act_elem_bytes == 2 ? KAON_COMM_BF16 : KAON_COMM_F32;
    if (rank_logit_buffers(tp, w, max_logits) || rank_comm(tp, w)) return -1;
    kaon_runner_set_tp_rank(w->r, &w->ctx);
    rank_share(w, n_blocks, block_size, kv_dtype);
    log_rank(tp, w, m, per);
    return 0;
}

// The communicators' shared part: the CPU group, the same-device group, or NCCL's unique id
// (made by process 0 of a multi-node job and sent to the others). Across processes the CPU
// ranks need none (MPI's world is theirs).
static int make_comm_group(kaon_tp *tp) {
    if (tp->cl && tp->device >= 0) {
        kaon_comm *ctl = tp->cl->ctl;
        if (tp->cl->rank == 0 && kaon_comm_nccl_unique_id(tp->nccl_id)) return -1;
        return ctl->ops->broadcast(ctl, tp->nccl_id, KAON_COMM_NCCL_ID_BYTES / 4, KAON_COMM_I32, 0);
    }
    if (tp->cl) return 0;
    if (tp->device < 0) tp->group = kaon_comm_cpu_group_create(tp->size);
    else if (tp->same_device) tp->local = kaon_comm_cuda_local_group_create(tp->size);
    else return kaon_comm_nccl_unique_id(tp->nccl_id);
    if (!tp->group && !tp->local) return kaon_set_error("tensor parallel: %s", kaon_last_error());
    return 0;
}

static int start_workers(kaon_tp *tp);

// Starts the workers and waits for their threads' set-up (NCCL's communicators join there).
static int start_and_wait_ready(kaon_tp *tp) {
    if (start_workers(tp)) return -1;
    pthread_mutex_lock(&tp->mu);
    while (tp->ready < tp->n_local) pthread_cond_wait(&tp->cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    for (int r = 0; r < tp->n_local; r++)
        if (tp->w[r].rc) return kaon_set_error("tensor parallel: %s", tp->w[r].err);
    return 0;
}

// A multi-node job's split: size / processes ranks in each (the CPU: one), the same start-up
// values everywhere (a process with other sizes would read past its buffers).
static int split_over_processes(kaon_tp *tp, const kaon_model *m, bool ep, int max_batch_tokens, int max_logits,
                                int n_blocks, int block_size, int kv_dtype) {
    const kaon_cluster *cl = tp->cl;
    if (tp->size % cl->size)
        return kaon_set_error("tensor parallel: %d ranks do not split over the job's %d processes (give each process "
                              "the same number of ranks)", tp->size, cl->size);
    tp->n_local = tp->size / cl->size;
    tp->rank0 = cl->rank * tp->n_local;
    if (tp->device < 0 && tp->n_local > 1)
        return kaon_set_error("tensor parallel: on the CPU a multi-process job runs one rank per process (%d ranks "
                              "need %d processes, not %d)", tp->size, tp->size, cl->size);
    if (tp->same_device) return kaon_set_error("tensor parallel: KAON_TP_SAME_DEVICE=1 is for one process only");
    const kaon_model_config *c = &m->cfg;
    const int64_t v[] = {tp->size, ep, max_batch_tokens, max_logits, n_blocks, block_size, kv_dtype,
                         tp->device >= 0, c->vocab_size, c->n_layers, c->hidden_size, c->n_heads, c->n_experts};
    static const char *const names[] = {"--tensor-parallel-size", "--enable-expert-parallel",
                                        "--max-num-batched-tokens", "the logit rows per step", "KV blocks",
                                        "--block-size", "--kv-cache-dtype", "the device kind (CUDA)", "vocab_size",
                                        "num_hidden_layers", "hidden_size", "num_attention_heads", "experts"};
    return kaon_cluster_same(v, (int)(sizeof v / sizeof v[0]), names);
}

kaon_tp *kaon_tp_create(const kaon_model *m, int size, bool ep, int n_threads, int max_batch_tokens,
                        int max_logits, int n_blocks, int block_size, int kv_dtype, int cuda_device) {
    kaon_tp_layout lay;
    for (int r = 0; r < size; r++)
        if (kaon_tp_plan(m, size, r, ep, &lay)) return NULL;
    if (cuda_device >= 0 && kaon_tp_cuda_check(m, size, kv_dtype)) return NULL;
    // CUDA ranks run whole experts (expert parallel): each expert's FFN columns split over the ranks
    // would give the device views that are neither stacked nor strided (model/moe.c's upload).
    if (cuda_device >= 0 && m->cfg.n_experts > 0 && !ep) {
        kaon_set_error("tensor parallel on CUDA: mixture-of-experts models need --enable-expert-parallel for now "
                       "(experts split over their FFN columns run on the CPU)");
        return NULL;
    }
    // On the CPU dummy weights get host values (the ranks' shards are views of them); a device
    // backend creates each rank's from its shard's shapes.
    if (cuda_device < 0 && m->format == KAON_FORMAT_DUMMY && kaon_weights_fill_host((kaon_model *)m)) return NULL;
    kaon_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp_init(tp, size);
    tp->device = cuda_device;
    tp->same_device = cuda_device >= 0 && kaon_tp_same_device();
    tp->max_tokens = max_batch_tokens;
    tp->cl = kaon_cluster_get();
    if (tp->cl && split_over_processes(tp, m, ep, max_batch_tokens, max_logits, n_blocks, block_size, kv_dtype))
        goto fail;
    tp->w = calloc((size_t)tp->n_local, sizeof *tp->w);
    if (!tp->w || make_comm_group(tp)) goto fail;
    const int per = n_threads / tp->n_local > 0 ? n_threads / tp->n_local : 1;
    for (int i = 0; i < tp->n_local; i++)
        if (make_tp_rank(tp, i, m, ep, per, max_batch_tokens, max_logits, n_blocks, block_size, kv_dtype)) goto fail;
    if (start_and_wait_ready(tp)) goto fail;
    return tp;
fail:
    kaon_tp_free(tp);
    return NULL;
}

// A rank's model under DP attention: the base's description and weights (views), with its own
// MoE layers (its experts, its shared-expert columns).
static int make_dp_model(tp_worker *w, const kaon_model *base) {
    const kaon_arch_ops *a = base->arch;
    kaon_model *m = calloc(1, sizeof *m);
    if (!m) return kaon_set_error("data parallel: out of memory");
    w->m = m;
    memcpy(m, base, sizeof *m);
    m->owned = NULL;
    m->n_owned = 0;
    m->w.moe = NULL;
    m->w.globals = malloc(a->globals_size);
    m->w.layers = malloc(a->layer_size * (size_t)base->cfg.n_layers);
    if (!m->w.globals || !m->w.layers) return kaon_set_error("data parallel: out of memory");
    memcpy(m->w.globals, base->w.globals, a->globals_size);
    memcpy(m->w.layers, base->w.layers, a->layer_size * (size_t)base->cfg.n_layers);
    return kaon_tp_moe_shard(m, base, &w->lay, &w->own);
}

// The exchange buffers of kaon_dp_moe and the sub-batch's, sized for a whole step.
static int alloc_dp_buffers(tp_worker *w, int size, int max_tokens, int max_logits) {
    const size_t T = (size_t)max_tokens, dim = (size_t)w->m->cfg.hidden_size;
    kaon_tp_rank *t = &w->ctx;
    t->dp = true;
    t->max_tokens = max_tokens;
    t->dp_counts = malloc(sizeof(int32_t) * (size_t)size);
    t->dp_sz = malloc(sizeof(size_t) * 4 * (size_t)size);
    t->dp_x = malloc(sizeof(float) * T * dim);
    t->dp_pos = malloc(sizeof(int32_t) * T);
    t->dp_out = malloc(sizeof(float) * T * dim);
    t->dp_back = malloc(sizeof(float) * (size_t)size * T * dim);
    w->sub = malloc(sizeof(int32_t) * 6 * T);
    w->logits = malloc(sizeof(float) * (size_t)max_logits * (size_t)w->m->cfg.vocab_size);
    if (!t->dp_counts || !t->dp_sz || !t->dp_x || !t->dp_pos || !t->dp_out || !t->dp_back || !w->sub || !w->logits)
        return kaon_set_error("data parallel: out of memory for the exchange buffers");
    return 0;
}

static int start_workers(kaon_tp *tp) {
    for (int r = 0; r < tp->n_local; r++) {
        if (pthread_create(&tp->w[r].th, NULL, worker_main, &tp->w[r]))
            return kaon_set_error("%s: cannot start a worker thread", tp->dp ? "data parallel" : "tensor parallel");
        tp->w[r].started = true;
    }
    return 0;
}

// One DP rank: its layout, model, backend, runner over its pool part, communicator, buffers.
static int make_dp_rank(kaon_tp *tp, int r, const kaon_model *m, int per, int max_batch_tokens, int max_logits,
                        int n_blocks, int block_size, int kv_dtype) {
    tp_worker *w = &tp->w[r];
    const int size = tp->size;
    w->tp = tp;
    w->rank = r;
    w->blk0 = (int)((int64_t)r * n_blocks / size);  // kv_cache.c's parts
    w->n_blk = (int)((int64_t)(r + 1) * n_blocks / size) - w->blk0;
    if (dp_plan(m, size, r, &w->lay) || make_dp_model(w, m)) return -1;
    if (!(w->be = kaon_backend_cpu_create(per))) return -1;
    if (w->be->ops->act_elem_bytes != sizeof(float))
        return kaon_set_error("data parallel: the exchange needs f32 activations");
    w->r = kaon_runner_create_kv(w->m, w->be, max_batch_tokens, max_logits, w->n_blk, block_size, kv_dtype);
    if (!w->r) return -1;
    w->ctx.comm = kaon_comm_cpu_create(tp->group, r);
    w->ctx.rank = r;
    w->ctx.size = size;
    w->ctx.vocab = w->ctx.vpad = m->cfg.vocab_size;
    if (!w->ctx.comm) return kaon_set_error("data parallel: out of memory");
    if (alloc_dp_buffers(w, size, max_batch_tokens, max_logits)) return -1;
    kaon_runner_set_tp_rank(w->r, &w->ctx);
    rank_share(w, w->n_blk, block_size, kv_dtype);
    const size_t kv = w->stats.kv_bytes;
    KAON_INFO("data parallel: rank %d of %d: attention and dense layers whole, KV blocks [%d, %d) of %d, KV cache "
              "%.1f MiB (%zu bytes), %d thread%s", r, size, w->blk0, w->blk0 + w->n_blk, n_blocks, kv / 1048576.0,
              kv, per, per == 1 ? "" : "s");
    if (m->cfg.n_experts > 0)
        KAON_INFO("data parallel: rank %d: expert parallel: experts [%d, %d), shared expert FFN [%d, %d)", r,
                  w->lay.e0, w->lay.e0 + w->lay.ne, w->lay.sf0, w->lay.sf0 + w->lay.nsf);
    return 0;
}

kaon_tp *kaon_dp_create(const kaon_model *m, int size, int n_threads, int max_batch_tokens, int max_logits,
                        int n_blocks, int block_size, int kv_dtype) {
    if (kaon_cluster_get()) {
        kaon_set_error("data parallel: not across processes yet (a multi-node job runs tensor and expert parallel)");
        return NULL;
    }
    if (kaon_dp_check(m, size)) return NULL;
    if (n_blocks < size) {
        kaon_set_error("data parallel: %d KV blocks over %d ranks", n_blocks, size);
        return NULL;
    }
    if (m->format == KAON_FORMAT_DUMMY && kaon_weights_fill_host((kaon_model *)m)) return NULL;
    kaon_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp_init(tp, size);
    tp->dp = true;
    tp->device = -1;
    tp->max_tokens = max_batch_tokens;
    tp->w = calloc((size_t)size, sizeof *tp->w);
    tp->group = kaon_comm_cpu_group_create(size);
    if (!tp->w || !tp->group) goto fail;
    const int per = n_threads / size > 0 ? n_threads / size : 1;
    for (int r = 0; r < size; r++)
        if (make_dp_rank(tp, r, m, per, max_batch_tokens, max_logits, n_blocks, block_size, kv_dtype)) goto fail;
    if (start_and_wait_ready(tp)) goto fail;
    return tp;
fail:
    kaon_tp_free(tp);
    return NULL;
}

void kaon_tp_free(kaon_tp *tp) {
    if (!tp) return;
    // Process 0 ends the followers' loops (kaon_tp_follow), once they run one (all ranks ready).
    if (tp->cl && tp->cl->rank == 0 && tp->ready == tp->n_local && kaon_step_send(tp->cl->ctl, &tp->msg, NULL))
        KAON_WARN("tensor parallel: cannot tell the other processes to stop: %s", kaon_last_error());
    kaon_step_msg_free(&tp->msg);
    pthread_mutex_lock(&tp->mu);
    tp->quit = true;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int r = 0; tp->w && r < tp->n_local; r++) {
        tp_worker *w = &tp->w[r];
        if (w->started) pthread_join(w->th, NULL);
        if (tp->device >= 0 && w->be) kaon_backend_cuda_bind(w->be);  // this thread frees its memory
        if (w->ctx.comm) w->ctx.comm->ops->destroy(w->ctx.comm);
        if (w->ctx.be) {
            if (w->ctx.part) w->ctx.be->ops->free(w->ctx.be, w->ctx.part);
            if (w->ctx.gather) w->ctx.be->ops->free(w->ctx.be, w->ctx.gather);
        } else {
            free(w->ctx.part);
            free(w->ctx.gather);
        }
        kaon_runner_free(w->r);
        if (w->be) w->be->ops->destroy(w->be);
        free(w->ctx.dp_counts);
        free(w->ctx.dp_sz);
        free(w->ctx.dp_x);
        free(w->ctx.dp_pos);
        free(w->ctx.dp_out);
        free(w->ctx.dp_back);
        free(w->sub);
        free(w->sub_tables);
        free(w->lseq);
        free(w->logits);
        free_shard(w);
    }
    free(tp->w);
    kaon_comm_cpu_group_free(tp->group);
    kaon_comm_cuda_local_group_free(tp->local);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp);
}

// A rank that fails before a collective leaves the others waiting in it: the thread that
// drives the step aborts every rank's communicator, lets the step end with an error (its
// sequences fail, the engine goes on) and makes the communicators usable again; where they
// cannot be (NCCL), every later step fails at once with the reason.
static void abort_ranks(kaon_tp *tp, const char *why) {
    for (int r = 0; r < tp->n_local; r++) {
        kaon_comm *c = tp->w[r].ctx.comm;
        if (c && c->ops->abort) c->ops->abort(c, why);
    }
}

static void recover_ranks(kaon_tp *tp) {
    for (int r = 0; r < tp->n_local && !tp->broken[0]; r++) {
        kaon_comm *c = tp->w[r].ctx.comm;
        if (c && (!c->ops->recover || c->ops->recover(c)))
            snprintf(tp->broken, sizeof tp->broken, "the ranks stopped after a failed step (%s); restart kaon",
                     c->ops->recover ? kaon_last_error() : "no recovery");
    }
}

static int run_step(kaon_tp *tp, const kaon_batch *b, float *logits) {
    const char *what = tp->dp ? "data parallel" : "tensor parallel";
    if (tp->broken[0]) return kaon_set_error("%s: %s", what, tp->broken);
    pthread_mutex_lock(&tp->mu);
    tp->b = b;
    tp->logits = logits;
    tp->done = 0;
    tp->first_failed = -1;
    tp->gen++;
    pthread_cond_broadcast(&tp->cv);
    bool aborted = false;
    while (tp->done < tp->n_local) {
        if (tp->first_failed >= 0 && !aborted) {
            aborted = true;
            char why[sizeof tp->w[0].err];
            snprintf(why, sizeof why, "%s", tp->w[tp->first_failed].err);
            pthread_mutex_unlock(&tp->mu);
            abort_ranks(tp, why);
            pthread_mutex_lock(&tp->mu);
            continue;
        }
        pthread_cond_wait(&tp->cv, &tp->mu);
    }
    const int first = tp->first_failed;
    pthread_mutex_unlock(&tp->mu);
    if (aborted) recover_ranks(tp);
    if (first >= 0) return kaon_set_error("%s: %s", what, tp->w[first].err);
    if (tp->dp && logits) dp_scatter_logits(tp, b, logits);
    return 0;
}

// Across processes a failed step cannot be taken back: the other processes' ranks wait in a
// collective that this one's will never join, and MPI/NCCL cannot call that off from here.
static _Noreturn void fail_job(const char *what) {
    char why[1200];
    snprintf(why, sizeof why, "%s: %s", what, kaon_last_error());
    kaon_cluster_abort(why);
}

int kaon_tp_forward(kaon_tp *tp, const kaon_batch *b, float *logits) {
    if (!tp->cl) return run_step(tp, b, logits);
    if (tp->cl->rank != 0) return kaon_set_error("tensor parallel: a follower process runs only process 0's steps");
    if (kaon_step_send(tp->cl->ctl, &tp->msg, b)) fail_job("tensor parallel: sending a step to the other processes");
    if (run_step(tp, b, logits)) fail_job("tensor parallel: a step failed");
    return 0;
}

int kaon_tp_follow(kaon_tp *tp) {
    if (!tp->cl || tp->cl->rank == 0) return kaon_set_error("tensor parallel: only a follower process follows");
    for (long steps = 0;; steps++) {
        kaon_batch b;
        const int rc = kaon_step_recv(tp->cl->ctl, &tp->msg, tp->max_tokens, &b);
        if (rc == 0) {
            KAON_INFO("tensor parallel: process %d ran %ld steps; process 0 ended the job", tp->cl->rank, steps);
            for (int i = 0; i < tp->n_local; i++)  // what /metrics shows of process 0's ranks
                KAON_INFO("tensor parallel: rank %d: %.3f s in steps, %.3f s of them in collectives", tp->w[i].rank,
                          tp->w[i].stats.step_seconds, tp->w[i].stats.collective_seconds);
            return 0;
        }
        if (rc < 0) fail_job("tensor parallel: receiving a step from process 0");
        if (run_step(tp, &b, NULL)) fail_job("tensor parallel: a step failed");
    }
}

int kaon_tp_rank_stats(kaon_tp *tp, kaon_rank_stats *out, int cap) {
    pthread_mutex_lock(&tp->mu);
    for (int i = 0; i < tp->n_local && i < cap; i++) out[i] = tp->w[i].stats;
    pthread_mutex_unlock(&tp->mu);
    return tp->n_local;
}

void kaon_tp_reserve_host_kv(kaon_tp *tp) {
    for (int r = 0; r < tp->n_local; r++) kaon_runner_reserve_host_kv(tp->w[r].r);
}

// ---- collectives of the forward pass ------------------------------------------------------

void kaon_tp_all_reduce(kaon_fwd *f, void *x, size_t n) {
    kaon_tp_rank *t = (kaon_tp_rank *)f->tp;
    const double t0 = kaon_now();
    if (t->comm->ops->all_reduce(t->comm, x, x, n, t->act)) t->failed = 1;
    t->comm_s += kaon_now() - t0;
}

void kaon_tp_logits(kaon_fwd *f, const kaon_batch *b, const kaon_linear *head) {
    kaon_tp_rank *t = (kaon_tp_rank *)f->tp;
    const int V = t->vocab, n = b->n_logits;
    const int v0 = t->rank * t->vpad < V ? t->rank * t->vpad : V;
    const int v1 = v0 + t->vpad < V ? v0 + t->vpad : V;
    // This rank's rows of the head: a view (rows are whole in every format).
    kaon_linear h = *head;
    const size_t rb = kaon_dtype_row_bytes(h.w.dtype, h.w.shape[1]);
    h.w.data = (char *)h.w.data + rb * (size_t)v0;
    h.w.shape[0] = v1 - v0;
    h.w.nbytes = rb * (size_t)(v1 - v0);
    h.shard = KAON_SHARD_VOCAB;
    if (v1 > v0) {
        if (f->logits_f32) f->op->linear_f32(f->be, f->a.rows, n, &h, t->part);  // [n, v1 - v0]
        else f->op->linear(f->be, f->a.rows, n, &h, t->part);
    }
    // Every rank's [n, v_r] slice (in a chunk of n * vpad), then rows put together.
    const size_t chunk = (size_t)n * (size_t)t->vpad;
    const double t0 = kaon_now();
    const int rc = t->comm->ops->all_gather(t->comm, t->part, t->gather, chunk, KAON_COMM_F32);
    t->comm_s += kaon_now() - t0;
    if (rc) {
        t->failed = 1;
        return;
    }
    float *out = f->a.logits;
    for (int q = 0; q < t->size; q++) {
        const int q0 = q * t->vpad < V ? q * t->vpad : V, q1 = q0 + t->vpad < V ? q0 + t->vpad : V;
        const float *src = t->gather + chunk * (size_t)q;
        if (t->be) {  // device memory: the backend puts the slice's rows in place
            f->op->copy_f32_strided(f->be, src, (size_t)(q1 - q0), out + q0, (size_t)V, n, q1 - q0);
            continue;
        }
        for (int i = 0; i < n; i++)
            memcpy(out + (size_t)i * V + q0, src + (size_t)i * (q1 - q0), sizeof(float) * (size_t)(q1 - q0));
    }
}

// The exchange of a MoE block under data-parallel attention (model/tp.h). Token counts differ
// per rank, so both directions are all_to_allv: first every rank's rows to every rank (an
// all-gather of unequal parts, in rank order), then rank q's rows of each rank's output back to
// q, which sums them in rank order: the same bits whatever the threads' timing.
void kaon_dp_moe(kaon_fwd *f, int n, const void *x, const int32_t *pos, const kaon_moe_layer *moe, uint32_t *cnt,
                 void *out) {
    kaon_tp_rank *t = f->tp;
    kaon_comm *c = t->comm;
    const int D = t->size;
    const size_t dim = (size_t)f->c->hidden_size, mine = (size_t)n * dim;
    size_t *sc = t->dp_sz, *so = sc + D, *rc = so + D, *ro = rc + D;
    const int32_t me = n;
    const double t0 = kaon_now();
    double op_s = 0;  // the experts' own time, not the exchange's
    if (n == 0) x = t->dp_back, pos = t->dp_counts;  // nothing is read from them (counts 0)
    if (c->ops->all_gather(c, &me, t->dp_counts, 1, KAON_COMM_I32)) goto fail;
    int total = 0;
    for (int q = 0; q < D; q++) {
        sc[q] = (size_t)n, so[q] = 0, rc[q] = (size_t)t->dp_counts[q], ro[q] = (size_t)total;
        total += t->dp_counts[q];
    }
    if (total > t->max_tokens) {
        kaon_set_error("data parallel: a step of %d tokens (limit %d)", total, t->max_tokens);
        goto fail;
    }
    if (c->ops->all_to_allv(c, pos, sc, so, t->dp_pos, rc, ro, KAON_COMM_I32)) goto fail;
    for (int q = 0; q < D; q++) sc[q] *= dim, rc[q] *= dim, ro[q] *= dim;
    if (c->ops->all_to_allv(c, x, sc, so, t->dp_x, rc, ro, KAON_COMM_F32)) goto fail;
    const double t1 = kaon_now();
    f->op->moe(f->be, t->dp_x, total, t->dp_pos, &moe->w, cnt, t->dp_out);  // [total, dim]
    op_s = kaon_now() - t1;
    // Back: rank q's rows [ro[q], + rc[q]) of this rank's output go to q, into its slot of rank
    // order; this rank gets each rank's output for its own n rows.
    for (int q = 0; q < D; q++) {
        sc[q] = rc[q], so[q] = ro[q];
        rc[q] = mine, ro[q] = (size_t)q * mine;
    }
    if (c->ops->all_to_allv(c, t->dp_out, sc, so, t->dp_back, rc, ro, KAON_COMM_F32)) goto fail;
    float *y = out;
    for (size_t i = 0; i < mine; i++) {
        float sum = t->dp_back[i];
        for (int q = 1; q < D; q++) sum += t->dp_back[(size_t)q * mine + i];
        y[i] = sum;
    }
    t->comm_s += kaon_now() - t0 - op_s;
    return;
fail:
    t->comm_s += kaon_now() - t0 - op_s;
    t->failed = 1;
}
