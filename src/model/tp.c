// Tensor parallelism inside one process (tp.h): the split of a model into rank shards, the
// worker threads that run a step on every rank, and the forward pass's collectives.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/tp.h"
#include "util/err.h"
#include "util/log.h"

extern const kaon_arch_ops kaon_arch_llama, kaon_arch_deepseek2;

// The experts' part of rank r's layout (kaon_tp_plan).
static int plan_experts(const kaon_model_config *c, int size, int rank, kaon_tp_layout *out) {
    const int E = c->n_experts, F = c->moe_intermediate_size, SF = c->shared_expert_intermediate_size;
    if (SF > 0 && SF % size)
        return kaon_set_error("tensor parallel: shared_expert_intermediate_size %d does not split over %d ranks",
                              SF, size);
    out->sf0 = SF > 0 ? rank * (SF / size) : 0;
    out->nsf = SF > 0 ? SF / size : 0;
    if (out->ep) {
        if (E < size)
            return kaon_set_error("tensor parallel: expert parallel with %d experts over %d ranks (a rank "
                                  "without experts; use fewer ranks or leave --enable-expert-parallel off)",
                                  E, size);
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
    if (c->n_experts > 0 && plan_experts(c, size, rank, out)) return -1;
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

// ---- shards -------------------------------------------------------------------------------

typedef struct tp_worker {
    struct kaon_tp *tp;
    int rank;
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
} tp_worker;

struct kaon_tp {
    int size;
    tp_worker *w;
    kaon_comm_cpu_group *group;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen;       // step generation: a worker runs a step when it changes
    int done;                // workers finished with the current step
    bool quit;
    const kaon_batch *b;
    float *logits;
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

// The range of a symbolic dimension on this rank: [*lo, *lo + *n).
static int range(const tp_worker *w, const kaon_model_config *c, int dim, int64_t *lo, int64_t *n) {
    const int hd = c->head_dim;
    switch (dim) {
    case KAON_DIM_Q: *lo = (int64_t)w->lay.q0 * hd, *n = (int64_t)w->lay.nq * hd; return 0;
    case KAON_DIM_KV: *lo = (int64_t)w->lay.kv0 * hd, *n = (int64_t)w->lay.nkv * hd; return 0;
    case KAON_DIM_FFN: *lo = w->lay.f0, *n = w->lay.nf; return 0;
    // MLA (DeepSeek): each head's rows of kv_b_proj and of the absorbed W_UK^T, W_UV, W_UK;
    // o_proj's columns of each head's v.
    case KAON_DIM_KV_B:
        *lo = (int64_t)w->lay.q0 * (c->qk_nope_head_dim + c->v_head_dim);
        *n = (int64_t)w->lay.nq * (c->qk_nope_head_dim + c->v_head_dim);
        return 0;
    case KAON_DIM_K_B: *lo = (int64_t)w->lay.q0 * c->kv_lora_rank, *n = (int64_t)w->lay.nq * c->kv_lora_rank; return 0;
    case KAON_DIM_K_N:
        *lo = (int64_t)w->lay.q0 * c->qk_nope_head_dim, *n = (int64_t)w->lay.nq * c->qk_nope_head_dim;
        return 0;
    case KAON_DIM_V_B: *lo = (int64_t)w->lay.q0 * c->v_head_dim, *n = (int64_t)w->lay.nq * c->v_head_dim; return 0;
    default: return kaon_set_error("tensor parallel: a weight split along dimension kind %d", dim);
    }
}

static int make_shard(tp_worker *w, const kaon_model *base) {
    const kaon_arch_ops *a = base->arch;
    const kaon_model_config *c = &base->cfg;
    kaon_model *m = calloc(1, sizeof *m);
    if (!m) return kaon_set_error("tensor parallel: out of memory");
    w->m = m;
    memcpy(m, base, sizeof *m);
    m->owned = NULL;
    m->n_owned = 0;
    m->w.moe = NULL;  // its own, from kaon_tp_moe_shard (the base's are never freed here)
    m->w.globals = malloc(a->globals_size);
    m->w.layers = malloc(a->layer_size * (size_t)c->n_layers);
    if (!m->w.globals || !m->w.layers) return kaon_set_error("tensor parallel: out of memory");
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
            if (range(w, c, s->dims[s->shard == KAON_SHARD_COL ? 0 : 1], &lo, &n)) return -1;
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
            if (s->shard == KAON_SHARD_COL ? kaon_tp_cut_rows(t, lo, n, nm) : kaon_tp_cut_cols(&w->own, t, lo, n, nm))
                return -1;
        }
    }
    return kaon_tp_moe_shard(m, base, &w->lay, &w->own);
}

static void free_shard(tp_worker *w) {
    if (w->m) {
        kaon_tp_moe_free(w->m);
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

static void *worker_main(void *p) {
    tp_worker *w = p;
    kaon_tp *tp = w->tp;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (!tp->quit && tp->gen == seen) pthread_cond_wait(&tp->cv, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->gen;
        const kaon_batch *b = tp->b;
        float *logits = w->rank == 0 ? tp->logits : NULL;
        pthread_mutex_unlock(&tp->mu);
        w->ctx.failed = 0;
        w->rc = kaon_runner_forward(w->r, b, logits);
        if (!w->rc && w->ctx.failed) w->rc = -1;
        if (w->rc) snprintf(w->err, sizeof w->err, "rank %d: %s", w->rank, kaon_last_error());
        pthread_mutex_lock(&tp->mu);
        tp->done++;
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
}

kaon_tp *kaon_tp_create(const kaon_model *m, int size, bool ep, int n_threads, int max_batch_tokens,
                        int max_logits, int n_blocks, int block_size, int kv_dtype) {
    kaon_tp_layout lay;
    for (int r = 0; r < size; r++)
        if (kaon_tp_plan(m, size, r, ep, &lay)) return NULL;
    if (m->format == KAON_FORMAT_DUMMY && kaon_weights_fill_host((kaon_model *)m)) return NULL;
    kaon_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->size = size;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->w = calloc((size_t)size, sizeof *tp->w);
    tp->group = kaon_comm_cpu_group_create(size);
    if (!tp->w || !tp->group) goto fail;
    const int per = n_threads / size > 0 ? n_threads / size : 1;
    const int vpad = (m->cfg.vocab_size + size - 1) / size;
    for (int r = 0; r < size; r++) {
        tp_worker *w = &tp->w[r];
        w->tp = tp;
        w->rank = r;
        kaon_tp_plan(m, size, r, ep, &w->lay);
        if (make_shard(w, m)) goto fail;
        w->be = kaon_backend_cpu_create(per);
        if (!w->be) goto fail;
        w->r = kaon_runner_create_kv(w->m, w->be, max_batch_tokens, max_logits, n_blocks, block_size, kv_dtype);
        if (!w->r) goto fail;
        w->ctx.comm = kaon_comm_cpu_create(tp->group, r);
        w->ctx.rank = r;
        w->ctx.size = size;
        w->ctx.vocab = m->cfg.vocab_size;
        w->ctx.vpad = vpad;
        w->ctx.part = malloc(sizeof(float) * (size_t)max_logits * (size_t)vpad);
        w->ctx.gather = malloc(sizeof(float) * (size_t)size * (size_t)max_logits * (size_t)vpad);
        if (!w->ctx.comm || !w->ctx.part || !w->ctx.gather) {
            kaon_set_error("tensor parallel: out of memory");
            goto fail;
        }
        kaon_runner_set_tp_rank(w->r, &w->ctx);
        const size_t kv = (size_t)n_blocks * block_size *
                          kaon_model_kv_bytes_per_token(w->m, kaon_kv_elem_bytes(w->be, kv_dtype));
        KAON_INFO("tensor parallel: rank %d of %d: Q heads [%d, %d), KV heads [%d, %d)%s, FFN [%d, %d), vocab "
                  "[%d, %d), %d thread%s, KV cache %.1f MiB, weight slices copied %.1f MiB",
                  r, size, w->lay.q0, w->lay.q0 + w->lay.nq, w->lay.kv0, w->lay.kv0 + w->lay.nkv,
                  m->cfg.n_kv_heads < size ? " (replicated)" : "", w->lay.f0, w->lay.f0 + w->lay.nf,
                  r * vpad < m->cfg.vocab_size ? r * vpad : m->cfg.vocab_size,
                  (r + 1) * vpad < m->cfg.vocab_size ? (r + 1) * vpad : m->cfg.vocab_size, per, per == 1 ? "" : "s",
                  kv / 1048576.0, w->own.bytes / 1048576.0);
        if (m->cfg.n_experts > 0)
            KAON_INFO("tensor parallel: rank %d: %s: experts [%d, %d), expert FFN [%d, %d), shared expert FFN "
                      "[%d, %d)", r, w->lay.ep ? "expert parallel" : "experts split", w->lay.e0,
                      w->lay.e0 + w->lay.ne, w->lay.mf0, w->lay.mf0 + w->lay.nmf, w->lay.sf0, w->lay.sf0 + w->lay.nsf);
    }
    for (int r = 0; r < size; r++) {
        if (pthread_create(&tp->w[r].th, NULL, worker_main, &tp->w[r])) {
            kaon_set_error("tensor parallel: cannot start a worker thread");
            goto fail;
        }
        tp->w[r].started = true;
    }
    return tp;
fail:
    kaon_tp_free(tp);
    return NULL;
}

void kaon_tp_free(kaon_tp *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = true;
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int r = 0; tp->w && r < tp->size; r++) {
        tp_worker *w = &tp->w[r];
        if (w->started) pthread_join(w->th, NULL);
        kaon_runner_free(w->r);
        if (w->be) w->be->ops->destroy(w->be);
        if (w->ctx.comm) w->ctx.comm->ops->destroy(w->ctx.comm);
        free(w->ctx.part);
        free(w->ctx.gather);
        free_shard(w);
    }
    free(tp->w);
    kaon_comm_cpu_group_free(tp->group);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp);
}

int kaon_tp_forward(kaon_tp *tp, const kaon_batch *b, float *logits) {
    pthread_mutex_lock(&tp->mu);
    tp->b = b;
    tp->logits = logits;
    tp->done = 0;
    tp->gen++;
    pthread_cond_broadcast(&tp->cv);
    while (tp->done < tp->size) pthread_cond_wait(&tp->cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    for (int r = 0; r < tp->size; r++)
        if (tp->w[r].rc) return kaon_set_error("tensor parallel: %s", tp->w[r].err);
    return 0;
}

void kaon_tp_reserve_host_kv(kaon_tp *tp) {
    for (int r = 0; r < tp->size; r++) kaon_runner_reserve_host_kv(tp->w[r].r);
}

// ---- collectives of the forward pass ------------------------------------------------------

void kaon_tp_all_reduce(kaon_fwd *f, void *x, size_t n) {
    kaon_tp_rank *t = (kaon_tp_rank *)f->tp;
    if (t->comm->ops->all_reduce(t->comm, x, x, n, KAON_COMM_F32)) t->failed = 1;
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
    if (t->comm->ops->all_gather(t->comm, t->part, t->gather, chunk, KAON_COMM_F32)) {
        t->failed = 1;
        return;
    }
    float *out = f->a.logits;
    for (int q = 0; q < t->size; q++) {
        const int q0 = q * t->vpad < V ? q * t->vpad : V, q1 = q0 + t->vpad < V ? q0 + t->vpad : V;
        const float *src = t->gather + chunk * (size_t)q;
        for (int i = 0; i < n; i++)
            memcpy(out + (size_t)i * V + q0, src + (size_t)i * (q1 - q0), sizeof(float) * (size_t)(q1 - q0));
    }
}
