// One loader over an architecture's weight table (weights.h): file, dummy, device copies,
// release and counts all walk the same rows.
#include "model/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/fp8_weights.h"
#include "model/int4_weights.h"
#include "model/mxfp4_weights.h"
#include "model/model.h"
#include "model/moe.h"
#include "util/err.h"
#include "util/half.h"

// Seeds of dummy weights: row i of the table, layer l.
#define DUMMY_SEED 0x6b616f6e00000000ull

kaon_tensor *kaon_weight_slot(const kaon_model *m, const kaon_weights *ws, const kaon_weight_spec *s,
                              int l) {
    char *base = s->per_layer ? (char *)ws->layers + (size_t)l * m->arch->layer_size : (char *)ws->globals;
    return (kaon_tensor *)(base + s->offset);
}

int64_t kaon_weight_dim(const kaon_model_config *c, int dim) {
    switch (dim) {
    case KAON_DIM_HIDDEN: return c->hidden_size;
    case KAON_DIM_VOCAB: return c->vocab_size;
    case KAON_DIM_Q: return (int64_t)c->n_heads * c->head_dim;
    case KAON_DIM_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case KAON_DIM_HEAD: return c->head_dim;
    case KAON_DIM_FFN: return c->intermediate_size;
    case KAON_DIM_ROPE_HALF: return c->rope_dim / 2;
    case KAON_DIM_Q_LORA: return c->q_lora_rank;
    case KAON_DIM_KV_LORA: return c->kv_lora_rank;
    case KAON_DIM_KV_A: return (int64_t)c->kv_lora_rank + c->rope_dim;
    case KAON_DIM_KV_B: return (int64_t)c->n_heads * (c->qk_nope_head_dim + c->v_head_dim);
    case KAON_DIM_K_B: return (int64_t)c->n_heads * c->kv_lora_rank;
    case KAON_DIM_K_N: return (int64_t)c->n_heads * c->qk_nope_head_dim;
    case KAON_DIM_QK_NOPE: return c->qk_nope_head_dim;
    case KAON_DIM_V_B: return (int64_t)c->n_heads * c->v_head_dim;
    case KAON_DIM_HIDDEN2: return 2 * (int64_t)c->hidden_size;
    case KAON_DIM_HIDDEN3: return 3 * (int64_t)c->hidden_size;
    case KAON_DIM_DRAFT_VOCAB: return c->draft_vocab_size;
    case KAON_DIM_HEADS: return c->n_heads;
    case KAON_DIM_EXPERTS: return c->n_experts;
    case KAON_DIM_EXP_FFN2: return 2 * (int64_t)c->moe_intermediate_size;
    case KAON_DIM_EXP_HID: return (int64_t)c->n_experts * c->hidden_size;
    case KAON_DIM_EXP_FFN: return (int64_t)c->n_experts * c->moe_intermediate_size;
    default: return 0;
    }
}

enum { ABSENT = 0, OPTIONAL = 1, REQUIRED = 2 };

// Whether row s is in layer l of this model.
static int need(const kaon_model *m, const kaon_weight_spec *s, int l) {
    const kaon_model_config *c = &m->cfg;
    const bool moe = s->per_layer && m->w.layer_moe && m->w.layer_moe[l];
    switch (s->when) {
    case KAON_WHEN_ALWAYS: return REQUIRED;
    case KAON_WHEN_ATTN_BIAS: return c->attention_bias ? REQUIRED : OPTIONAL;
    case KAON_WHEN_QK_NORM: return c->qk_norm ? REQUIRED : OPTIONAL;
    case KAON_WHEN_UNTIED: return c->tie_word_embeddings ? OPTIONAL : REQUIRED;
    case KAON_WHEN_DENSE_MLP: return moe ? ABSENT : REQUIRED;
    case KAON_WHEN_MOE_MLP: return moe ? REQUIRED : ABSENT;
    case KAON_WHEN_Q_LORA: return c->q_lora_rank > 0 ? REQUIRED : ABSENT;
    case KAON_WHEN_NO_Q_LORA: return c->q_lora_rank > 0 ? ABSENT : REQUIRED;
    case KAON_WHEN_SOURCE: return m->format == KAON_FORMAT_DUMMY ? ABSENT : OPTIONAL;
    case KAON_WHEN_DERIVED: return m->format == KAON_FORMAT_DUMMY ? REQUIRED : OPTIONAL;
    case KAON_WHEN_MTP: return s->per_layer && l >= c->n_layers - c->n_mtp_layers ? REQUIRED : ABSENT;
    default: return OPTIONAL;
    }
}

static int n_rows_of(const kaon_model *m, const kaon_weight_spec *s) {
    return s->per_layer ? m->cfg.n_layers : 1;
}

static void *own(kaon_model *m, size_t bytes) {
    void **list = realloc(m->owned, sizeof *list * (size_t)(m->n_owned + 1));
    if (!list) return NULL;
    m->owned = list;
    void *p = malloc(bytes ? bytes : 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

int kaon_model_own(kaon_model *m, void *p) {
    void **list = realloc(m->owned, sizeof *list * (size_t)(m->n_owned + 1));
    if (!list) {
        free(p);
        return kaon_set_error("out of memory");
    }
    m->owned = list;
    m->owned[m->n_owned++] = p;
    return 0;
}

// Vectors widened to f32 at load, plus 1 where the file stores w of a (1 + w) norm.
static int widen(kaon_model *m, kaon_tensor *t, float add) {
    const int64_t n = kaon_tensor_numel(t);
    float *dst = own(m, sizeof(float) * (size_t)n);
    if (!dst) return kaon_set_error("out of memory");
    for (int64_t k = 0; k < n; k++) {
        float v = t->dtype == KAON_F32    ? ((const float *)t->data)[k]
                  : t->dtype == KAON_BF16 ? kaon_bf16_to_f32(((const uint16_t *)t->data)[k])
                                          : kaon_f16_to_f32(((const uint16_t *)t->data)[k]);
        dst[k] = v + add;
    }
    t->data = dst;
    t->dtype = KAON_F32;
    t->nbytes = sizeof(float) * (size_t)n;
    return 0;
}

static bool is_float_dtype(kaon_dtype d) { return d == KAON_F32 || d == KAON_F16 || d == KAON_BF16; }

// Every 2-D row of a table is the w of a kaon_linear (the scale companions live beside it).
_Static_assert(offsetof(kaon_linear, w) == 0, "a linear row's slot is its kaon_linear");

static kaon_linear *linear_of(kaon_tensor *w) { return (kaon_linear *)w; }

// A Linear a 4-bit checkpoint stores as packed words (<module>.qweight, .weight_packed) instead
// of <module>.weight: unpacked into the INT4 layout (int4_weights.h); t->data stays NULL when
// the module has none of them.
static int load_int4(kaon_model *m, const kaon_weight_spec *s, const char *name, kaon_tensor *t) {
    const kaon_quant_method q = m->quant.method;
    const size_t n = strlen(name);
    if (m->quant.format != KAON_QFMT_INT || n < 7 || strcmp(name + n - 7, ".weight") ||
        (q != KAON_QUANT_AWQ && q != KAON_QUANT_GPTQ && q != KAON_QUANT_COMPRESSED_TENSORS))
        return 0;
    char module[256];
    snprintf(module, sizeof module, "%.*s", (int)(n - 7), name);
    return kaon_int4_load(m, module, kaon_weight_dim(&m->cfg, s->dims[0]), kaon_weight_dim(&m->cfg, s->dims[1]),
                          linear_of(t));
}

// One row of the table for layer l (or the globals) from the file.
static int load_one(kaon_model *m, const kaon_weight_spec *s, int l) {
    const int nd = need(m, s, l);
    if (nd == ABSENT) return 0;
    if (s->flags & KAON_W_EXPERTS) return kaon_moe_load_layer(m, l);
    const char *fmt = m->gguf ? s->gguf : s->hf;
    kaon_tensor *t = kaon_weight_slot(m, &m->w, s, l);
    memset(t, 0, sizeof *t);
    if (!fmt) {
        if (nd == REQUIRED)
            return kaon_set_error("%s: %s files have no '%s' (needed by %s)", m->path,
                                  m->gguf ? "GGUF" : "Hugging Face", m->gguf ? s->hf : s->gguf, m->arch->label);
        return 0;
    }
    char name[256];
    snprintf(name, sizeof name, fmt, l);
    if (kaon_model_find_tensor(m, name, t)) return -1;
    if (!t->data && s->ndim == 2 && !m->gguf) {
        if (load_int4(m, s, name, t)) return -1;
        if (t->data) return 0;
        if (kaon_mxfp4_load(m, name, t)) return -1;  // <name>_blocks: checked below as any matrix
    }
    if (!t->data) {
        if (nd == REQUIRED) return kaon_set_error("%s: missing tensor '%s'", m->path, name);
        return 0;
    }
    const kaon_model_config *c = &m->cfg;
    const int64_t d0 = kaon_weight_dim(c, s->dims[0]), d1 = s->ndim > 1 ? kaon_weight_dim(c, s->dims[1]) : 0;
    if ((s->flags & KAON_W_FLAT3) && t->ndim == 3) {  // [a, b, c] stored contiguously = [a * b, c]
        t->shape[0] *= t->shape[1];
        t->shape[1] = t->shape[2];
        t->shape[2] = 0;
        t->ndim = 2;
    }
    const bool ok = t->ndim == s->ndim && t->shape[0] == d0 && (s->ndim < 2 || t->shape[1] == d1);
    if (!ok) {
        if (s->ndim == 1)
            return kaon_set_error("%s: tensor '%s' has shape %s, expected [%lld]", m->path, name,
                                  t->ndim == 1 ? "[...]" : "of wrong rank", (long long)d0);
        return kaon_set_error("%s: tensor '%s' has shape [%lld, %lld] (rank %d), expected [%lld, %lld]",
                              m->path, name, (long long)t->shape[0],
                              (long long)(t->ndim > 1 ? t->shape[1] : 0), t->ndim, (long long)d0,
                              (long long)d1);
    }
    if (s->ndim == 1 && !is_float_dtype(t->dtype))
        return kaon_set_error("%s: tensor '%s' is %s; norms and biases must be F32/F16/BF16", m->path,
                              name, kaon_dtype_name(t->dtype));
    if (s->ndim == 2 && kaon_dtype_row_bytes(t->dtype, d1) == 0)
        return kaon_set_error("%s: tensor '%s': row of %lld is not a whole number of %s blocks", m->path,
                              name, (long long)d1, kaon_dtype_name(t->dtype));
    if ((s->flags & KAON_W_HOST) && t->dtype != KAON_F32)
        return kaon_set_error("%s: %s must be F32", m->path, name);
    if (s->ndim == 2 && t->dtype == KAON_FP8_E4M3) return kaon_fp8_attach(m, linear_of(t), name);
    if (s->ndim == 2 && t->dtype == KAON_I8) return kaon_int8_attach(m, linear_of(t), name);
    const bool plus_one = (s->flags & KAON_W_PLUS_ONE_HF) && !m->gguf;
    if (plus_one || ((s->flags & KAON_W_F32) && t->dtype != KAON_F32)) return widen(m, t, plus_one ? 1.0f : 0.0f);
    return 0;
}

static int alloc_set(const kaon_model *m, kaon_weights *ws) {
    const int L = m->cfg.n_layers;
    ws->globals = calloc(1, m->arch->globals_size);
    ws->layers = calloc((size_t)L, m->arch->layer_size);
    return ws->globals && ws->layers ? 0 : kaon_set_error("out of memory");
}

static int mark_moe_layers(kaon_model *m) {
    const int L = m->cfg.n_layers;
    m->w.layer_moe = calloc((size_t)L, sizeof(bool));
    if (!m->w.layer_moe) return kaon_set_error("out of memory");
    for (int l = 0; l < L; l++)
        m->w.layer_moe[l] = m->format == KAON_FORMAT_DUMMY ? kaon_config_layer_is_moe(&m->cfg, l)
                                                           : kaon_moe_layer_wanted(m, l);
    return 0;
}

static void count_into_model(kaon_model *m) {
    kaon_weight_count wc;
    kaon_weights_count(m, &wc, NULL);
    m->n_params = wc.params;
    m->weight_bytes = wc.bytes;
}

int kaon_weights_load(kaon_model *m) {
    if (alloc_set(m, &m->w) || mark_moe_layers(m)) return -1;
    const kaon_arch_ops *a = m->arch;
    for (int i = 0; i < a->n_weights; i++)
        for (int l = 0; l < n_rows_of(m, &a->weights[i]); l++)
            if (load_one(m, &a->weights[i], l)) return -1;
    count_into_model(m);
    return 0;
}

// Placeholder data of dummy weights: marks a weight as present; never read (the runner asks
// the backend to create the values).
static const uint16_t dummy_data[8];

int kaon_weights_load_dummy(kaon_model *m) {
    if (alloc_set(m, &m->w) || mark_moe_layers(m)) return -1;
    const kaon_arch_ops *a = m->arch;
    const kaon_model_config *c = &m->cfg;
    for (int i = 0; i < a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        for (int l = 0; l < n_rows_of(m, s); l++) {
            if (need(m, s, l) != REQUIRED || (s->flags & KAON_W_HOST)) continue;
            if (s->flags & KAON_W_EXPERTS) {
                if (kaon_moe_dummy_layer(m, l)) return -1;
                continue;
            }
            kaon_tensor *t = kaon_weight_slot(m, &m->w, s, l);
            memset(t, 0, sizeof *t);
            t->dtype = KAON_BF16;
            t->ndim = s->ndim;
            t->shape[0] = kaon_weight_dim(c, s->dims[0]);
            t->shape[1] = s->ndim > 1 ? kaon_weight_dim(c, s->dims[1]) : 0;
            t->data = (void *)dummy_data;
            t->nbytes = (size_t)kaon_tensor_numel(t) * 2;
            if (s->ndim == 2 && s->hf && s->when != KAON_WHEN_DERIVED) {  // FP8 / INT4 configs: their placeholders
                char module[256];
                snprintf(module, sizeof module, s->hf, l);
                char *dot = strrchr(module, '.');
                if (dot && !strcmp(dot, ".weight")) *dot = 0;
                kaon_fp8_dummy_mark(m, linear_of(t), module);
                kaon_int4_dummy_mark(m, linear_of(t), module);
            }
        }
    }
    count_into_model(m);
    return 0;
}

void kaon_weights_free_host(kaon_model *m) {
    kaon_moe_free_model(m);
    free(m->w.globals);
    free(m->w.layers);
    free(m->w.layer_moe);
    memset(&m->w, 0, sizeof m->w);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    m->owned = NULL;
    m->n_owned = 0;
}

// Where a shard's dummy weight i of layer l sits in the whole one (model.h); NULL: it is whole.
static const kaon_dummy_origin *origin_of(const kaon_model *m, int i, int l) {
    const kaon_dummy_origin *o = m->dummy_origin ? &m->dummy_origin[(size_t)i * m->cfg.n_layers + l] : NULL;
    return o && o->full ? o : NULL;
}

int kaon_weights_upload(kaon_backend *be, const kaon_model *m, kaon_weights *dev) {
    const kaon_backend_ops *op = be->ops;
    const kaon_arch_ops *a = m->arch;
    const bool dummy = m->format == KAON_FORMAT_DUMMY;
    const int L = m->cfg.n_layers;
    memset(dev, 0, sizeof *dev);
    if (dummy && !op->fill_dummy)
        return kaon_set_error("--load-format dummy needs a backend that creates weights (cuda)");
    if (alloc_set(m, dev)) return -1;
    // The structs' other fields (shard kinds, parts) as the host's; every tensor is replaced.
    memcpy(dev->globals, m->w.globals, a->globals_size);
    memcpy(dev->layers, m->w.layers, (size_t)L * a->layer_size);
    dev->layer_moe = m->w.layer_moe;
    for (int i = 0; i < a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->flags & KAON_W_EXPERTS) continue;
        for (int l = 0; l < n_rows_of(m, s); l++) {
            kaon_tensor *src = kaon_weight_slot(m, &m->w, s, l), *dst = kaon_weight_slot(m, dev, s, l);
            memset(dst, 0, sizeof *dst);
            if (!src->data || (s->flags & KAON_W_HOST)) continue;
            const char *why = s->ndim == 2 ? kaon_linear_unsupported(linear_of(src)) : NULL;
            const bool companions = why && (linear_of(src)->scale.data || src->dtype == KAON_MXFP4);
            if (companions && (!op->upload_linear || src->dtype == KAON_MXFP4))  // no device kernels read them yet
                return kaon_set_error("%s: weights with %s run on the CPU backend only for now", m->path, why);
            const uint64_t seed = DUMMY_SEED + ((uint64_t)i << 24) + (uint64_t)l;
            int rc;
            if (companions) {
                rc = op->upload_linear(be, linear_of(src), dummy, seed, linear_of(dst));
            } else if (dummy) {
                // A shard's scale is the whole tensor's, from the whole's last dimension.
                const kaon_dummy_origin *o = origin_of(m, i, l);
                const int64_t in = o && o->dim == src->ndim - 1 ? o->full : src->shape[src->ndim - 1];
                const float scale = src->ndim == 1 ? 0.1f : 1.0f / sqrtf((float)in);
                rc = op->fill_dummy(be, src, o, seed, scale, (s->flags & KAON_W_NORM) ? 1.0f : 0.0f, dst);
            } else {
                rc = op->upload(be, src, dst);
            }
            if (rc) return -1;
        }
    }
    if (!m->w.moe) return 0;
    dev->moe = calloc((size_t)L, sizeof *dev->moe);
    if (!dev->moe) return kaon_set_error("out of memory");
    for (int l = 0; l < L; l++)
        if (m->w.layer_moe[l] &&
            kaon_moe_upload(be, &m->w.moe[l], dummy, DUMMY_SEED + (1ull << 40) + ((uint64_t)l << 20), &dev->moe[l]))
            return -1;
    return 0;
}

void kaon_weights_release(kaon_backend *be, const kaon_model *m, kaon_weights *dev) {
    const kaon_arch_ops *a = m->arch;
    if (dev->globals && dev->layers)
        for (int i = 0; i < a->n_weights; i++) {
            const kaon_weight_spec *s = &a->weights[i];
            if (s->flags & (KAON_W_EXPERTS | KAON_W_HOST)) continue;
            for (int l = 0; l < n_rows_of(m, s); l++) {
                kaon_tensor *t = kaon_weight_slot(m, dev, s, l);
                if (t->data) be->ops->release(be, t);
            }
        }
    if (dev->moe)
        for (int l = 0; l < m->cfg.n_layers; l++) kaon_moe_release(be, &dev->moe[l]);
    free(dev->moe);
    free(dev->globals);
    free(dev->layers);
    memset(dev, 0, sizeof *dev);
}

static void add(kaon_weight_count *wc, kaon_spec_count *sc, const kaon_tensor *t) {
    if (!t->data) return;
    const uint64_t n = (uint64_t)kaon_tensor_numel(t);
    const unsigned d = (unsigned)t->dtype < KAON_MAX_DTYPE_IDS ? (unsigned)t->dtype : KAON_MAX_DTYPE_IDS - 1;
    wc->params += n;
    wc->bytes += t->nbytes;
    wc->params_by_dtype[d] += n;
    wc->bytes_by_dtype[d] += t->nbytes;
    wc->tensors_by_dtype[d]++;
    if (sc) {
        sc->params += n;
        sc->bytes += t->nbytes;
        sc->tensors++;
        sc->dtype_mask |= 1ull << d;
    }
}

// A format's companion (scales): bytes and tensors, not parameters.
static void add_companion(kaon_weight_count *wc, kaon_spec_count *sc, const kaon_tensor *t) {
    if (!t->data) return;
    const unsigned d = (unsigned)t->dtype < KAON_MAX_DTYPE_IDS ? (unsigned)t->dtype : KAON_MAX_DTYPE_IDS - 1;
    wc->bytes += t->nbytes;
    wc->bytes_by_dtype[d] += t->nbytes;
    wc->tensors_by_dtype[d]++;
    if (sc) {  // the row's tensor count stays its weights'
        sc->bytes += t->nbytes;
        sc->dtype_mask |= 1ull << d;
    }
}

static void add_linear_companions(kaon_weight_count *wc, kaon_spec_count *sc, const kaon_linear *l) {
    add_companion(wc, sc, &l->scale);
    add_companion(wc, sc, &l->zero);
    add_companion(wc, sc, &l->perm);
}

void kaon_weights_count(const kaon_model *m, kaon_weight_count *wc, kaon_spec_count *by_spec) {
    const kaon_arch_ops *a = m->arch;
    memset(wc, 0, sizeof *wc);
    if (by_spec) memset(by_spec, 0, sizeof *by_spec * (size_t)a->n_weights);
    for (int i = 0; i < a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        kaon_spec_count *sc = by_spec ? &by_spec[i] : NULL;
        for (int l = 0; l < n_rows_of(m, s); l++) {
            if (!(s->flags & KAON_W_EXPERTS)) {
                kaon_tensor *t = kaon_weight_slot(m, &m->w, s, l);
                add(wc, sc, t);
                if (s->ndim == 2) add_linear_companions(wc, sc, linear_of(t));
                continue;
            }
            if (!m->w.moe || !m->w.layer_moe[l]) continue;
            const kaon_moe_layer *ml = &m->w.moe[l];
            add(wc, sc, &ml->router.w);
            add(wc, sc, &ml->shared_gate_inp.w);
            add(wc, sc, &ml->score_bias);
            for (int k = 0; k < 3; k++) {
                add(wc, sc, &ml->shared[k].w);
                add_linear_companions(wc, sc, &ml->shared[k]);
            }
            for (int v = 0; ml->views && v < 3 * ml->w.n_experts; v++) add_linear_companions(wc, sc, &ml->views[v]);
            for (int k = 0; k < ml->n_src; k++) {
                add(wc, sc, &ml->src[k]);
                wc->expert_params += (uint64_t)kaon_tensor_numel(&ml->src[k]);
            }
            for (int k = 0; k < 3; k++) add_companion(wc, sc, &ml->shared[k].scale);
            for (int k = 0; k < 3 * ml->w.n_experts; k++) add_companion(wc, sc, &ml->views[k].scale);
        }
    }
}

size_t kaon_weights_device_bytes(kaon_backend *be, const kaon_model *m) {
    const kaon_arch_ops *a = m->arch;
    size_t total = 0;
#define DEV_BYTES(t, dense) \
    ((t)->data ? (be->ops->weight_bytes ? be->ops->weight_bytes(be, (t), (dense)) : (t)->nbytes) : 0)
    for (int i = 0; i < a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->flags & KAON_W_HOST) continue;
        for (int l = 0; l < n_rows_of(m, s); l++) {
            if (!(s->flags & KAON_W_EXPERTS)) {
                kaon_tensor *t = kaon_weight_slot(m, &m->w, s, l);
                if (s->ndim == 2) {  // companions: scales, INT4 zeros and permutation
                    const kaon_linear *lt = linear_of(t);
                    total += DEV_BYTES(&lt->scale, false) + DEV_BYTES(&lt->zero, false) + DEV_BYTES(&lt->perm, false);
                }
                total += DEV_BYTES(t, false);
                continue;
            }
            if (!m->w.moe || !m->w.layer_moe[l]) continue;
            const kaon_moe_layer *ml = &m->w.moe[l];
            total += DEV_BYTES(&ml->router.w, true) + DEV_BYTES(&ml->shared_gate_inp.w, false) +
                     DEV_BYTES(&ml->score_bias, false);
            for (int k = 0; k < 3; k++) total += DEV_BYTES(&ml->shared[k].w, false) + DEV_BYTES(&ml->shared[k].scale, false);
            for (int k = 0; k < ml->n_src; k++) total += DEV_BYTES(&ml->src[k], true);
            for (int k = 0; ml->views && k < 3 * ml->w.n_experts; k++) total += DEV_BYTES(&ml->views[k].scale, false);
        }
    }
#undef DEV_BYTES
    return total;
}
