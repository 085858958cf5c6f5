// The bytes a rank's shard holds (tp.h, kaon_tp_shard_bytes): its weights as cut (views count
// their slice, copies theirs), its MoE layers' router and shared expert, and of the routed
// experts only those it runs (expert parallel: [e0, e0 + ne) whole; tensor parallel: every
// expert's cut views). As stored on the host, companions (scales, zeros) included.
#include "model/arch.h"
#include "model/tp.h"

static uint64_t linear_bytes(const kaon_linear *l) {
    return (l->w.data ? l->w.nbytes : 0) + (l->scale.data ? l->scale.nbytes : 0) +
           (l->zero.data ? l->zero.nbytes : 0) + (l->perm.data ? l->perm.nbytes : 0);
}

static uint64_t moe_bytes(const kaon_moe_layer *L, const kaon_tp_layout *lay) {
    uint64_t b = linear_bytes(&L->router) + linear_bytes(&L->shared_gate_inp) +
                 (L->score_bias.data ? L->score_bias.nbytes : 0);
    for (int k = 0; k < 3; k++) b += linear_bytes(&L->shared[k]);
    const int E = L->w.n_experts;
    const int e0 = lay && lay->ep ? lay->e0 : 0, e1 = lay && lay->ep ? lay->e0 + lay->ne : E;
    for (int k = 0; L->views && k < 3; k++)
        for (int e = e0; e < e1; e++) b += linear_bytes(&L->views[k * E + e]);
    return b;
}

uint64_t kaon_tp_shard_bytes(const kaon_model *m, const kaon_tp_layout *lay) {
    const kaon_arch_ops *a = m->arch;
    uint64_t total = 0;
    for (int i = 0; i < (int)a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->flags & KAON_W_EXPERTS) continue;
        for (int l = 0; l < (s->per_layer ? m->cfg.n_layers : 1); l++) {
            const kaon_tensor *t = kaon_weight_slot(m, (kaon_weights *)&m->w, s, l);
            if (!t->data) continue;
            total += s->ndim == 2 ? linear_bytes((const kaon_linear *)t) : t->nbytes;
        }
    }
    for (int l = 0; m->w.moe && l < m->cfg.n_layers; l++)
        if (m->w.moe[l].views) total += moe_bytes(&m->w.moe[l], lay);
    return total;
}

// A linear's bytes when its rows (COL) or columns (ROW) are cut to n.
static uint64_t cut_bytes(const kaon_tensor *t, int shard, int64_t n) {
    if (t->ndim != 2) return kaon_dtype_row_bytes(t->dtype, 1) * (uint64_t)n;
    return shard == KAON_SHARD_COL ? kaon_dtype_row_bytes(t->dtype, t->shape[1]) * (uint64_t)n
                                   : (uint64_t)t->shape[0] * kaon_dtype_row_bytes(t->dtype, n);
}

// gate and up cut to n rows, down to n columns (tp_moe.c's split_mlp).
static uint64_t cut_mlp(const kaon_linear *lin0, const kaon_linear *lin1, const kaon_linear *lin2, int64_t n) {
    return cut_bytes(&lin0->w, KAON_SHARD_COL, n) + cut_bytes(&lin1->w, KAON_SHARD_COL, n) +
           cut_bytes(&lin2->w, KAON_SHARD_ROW, n);
}

uint64_t kaon_tp_plan_bytes(const kaon_model *m, const kaon_tp_layout *lay) {
    const kaon_arch_ops *a = m->arch;
    const kaon_model_config *c = &m->cfg;
    uint64_t total = 0;
    for (int i = 0; i < (int)a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        if (s->flags & KAON_W_EXPERTS) continue;
        const bool split = s->shard == KAON_SHARD_COL || s->shard == KAON_SHARD_ROW;
        int64_t lo = 0, n = 0;
        if (split && kaon_tp_dim_range(lay, c, s->dims[s->shard == KAON_SHARD_COL ? 0 : 1], &lo, &n)) continue;
        for (int l = 0; l < (s->per_layer ? c->n_layers : 1); l++) {
            const kaon_tensor *t = kaon_weight_slot(m, (kaon_weights *)&m->w, s, l);
            if (!t->data) continue;
            if (split) total += cut_bytes(t, s->shard, n);
            else total += s->ndim == 2 ? linear_bytes((const kaon_linear *)t) : t->nbytes;
        }
    }
    for (int l = 0; m->w.moe && l < c->n_layers; l++) {
        const kaon_moe_layer *L = &m->w.moe[l];
        if (!L->views) continue;
        total += linear_bytes(&L->router) + linear_bytes(&L->shared_gate_inp) +
                 (L->score_bias.data ? L->score_bias.nbytes : 0);
        if (L->shared[0].w.data) total += cut_mlp(&L->shared[0], &L->shared[1], &L->shared[2], lay->nsf);
        const int E = L->w.n_experts;
        for (int e = 0; e < E; e++) {
            if (lay->ep) {
                if (e < lay->e0 || e >= lay->e0 + lay->ne) continue;
                for (int k = 0; k < 3; k++) total += linear_bytes(&L->views[k * E + e]);
            } else {
                total += cut_mlp(&L->views[e], &L->views[E + e], &L->views[2 * E + e], lay->nmf);
            }
        }
    }
    return total;
}
