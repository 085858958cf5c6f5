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
