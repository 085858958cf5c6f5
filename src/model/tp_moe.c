// A rank's mixture-of-experts layers (tp.h): its own copy of each layer's description, with
// the expert views cut to its share (tensor parallel: every expert's FFN columns; expert
// parallel: its experts, whole) and the shared expert split like a dense MLP. The router, the
// selection bias and the sources the views point into stay the base model's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tp.h"
#include "util/err.h"

// gate/up: rows [f0, f0 + n) (views); down: columns (copies). lin = {gate, up, down}; each must
// carry nothing that would need splitting too.
static int split_mlp(kaon_linear *const lin[3], int f0, int n, kaon_tp_owned *own, const char *what, int l, int e) {
    char nm[96];
    if (e < 0) snprintf(nm, sizeof nm, "layer %d's %s", l, what);
    else snprintf(nm, sizeof nm, "layer %d's %s %d", l, what, e);
    for (int k = 0; k < 3; k++)
        if (lin[k]->scale.data || lin[k]->zero.data || lin[k]->perm.data || lin[k]->n_parts || lin[k]->bias.data)
            return kaon_set_error("tensor parallel: %s has scale companions, a bias or fused parts, which cannot "
                                  "be split yet (--enable-expert-parallel keeps routed experts whole)", nm);
    for (int k = 0; k < 3; k++) lin[k]->shard = k == 2 ? KAON_SHARD_ROW : KAON_SHARD_COL;
    return kaon_tp_cut_rows(&lin[0]->w, f0, n, nm) || kaon_tp_cut_rows(&lin[1]->w, f0, n, nm) ||
           kaon_tp_cut_cols(own, &lin[2]->w, f0, n, nm);
}

static int shard_layer(kaon_moe_layer *L, const kaon_moe_layer *B, const kaon_model_config *c,
                       const kaon_tp_layout *lay, kaon_tp_owned *own, int l) {
    const int E = B->w.n_experts;
    *L = *B;
    L->views = malloc(sizeof *L->views * (size_t)3 * E);
    if (!L->views) return kaon_set_error("tensor parallel: out of memory");
    memcpy(L->views, B->views, sizeof *L->views * (size_t)3 * E);
    kaon_moe_bind(L, c);  // pointers into L, routing from the config (the same as the base's)
    L->w.act = B->w.act, L->w.act_alpha = B->w.act_alpha, L->w.act_limit = B->w.act_limit;
    if (lay->ep) {
        // Whole experts: the views as they are; the op reads [e0, e1) only.
        L->w.e0 = lay->e0;
        L->w.e1 = lay->e0 + lay->ne;
    } else {
        for (int e = 0; e < E; e++) {
            kaon_linear *const lin[3] = {&L->views[e], &L->views[E + e], &L->views[2 * E + e]};
            if (split_mlp(lin, lay->mf0, lay->nmf, own, "expert", l, e)) return -1;
        }
    }
    if (L->shared[0].w.data) {
        kaon_linear *const lin[3] = {&L->shared[0], &L->shared[1], &L->shared[2]};
        if (split_mlp(lin, lay->sf0, lay->nsf, own, "shared expert", l, -1)) return -1;
    }
    return 0;
}

int kaon_tp_moe_shard(kaon_model *m, const kaon_model *base, const kaon_tp_layout *lay, kaon_tp_owned *own) {
    m->w.moe = NULL;
    if (!base->w.moe) return 0;
    m->cfg.moe_intermediate_size = lay->nmf;
    m->cfg.shared_expert_intermediate_size = lay->nsf;
    m->w.moe = calloc((size_t)m->cfg.n_layers, sizeof *m->w.moe);
    if (!m->w.moe) return kaon_set_error("tensor parallel: out of memory");
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (base->w.moe[l].views && shard_layer(&m->w.moe[l], &base->w.moe[l], &m->cfg, lay, own, l)) return -1;
    return 0;
}

void kaon_tp_moe_free(kaon_model *m) {
    if (!m->w.moe) return;
    for (int l = 0; l < m->cfg.n_layers; l++) free(m->w.moe[l].views);  // the rest is the base's
    free(m->w.moe);
    m->w.moe = NULL;
}
