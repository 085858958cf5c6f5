// Mixture-of-experts layers: configuration from GGUF, weights from every layout (moe.h), and
// device copies. The math is the backends' moe op.
#include "model/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/fp8_weights.h"
#include "model/int4_weights.h"
#include "model/mxfp4_weights.h"
#include "model/model.h"
#include "util/err.h"
#include "util/half.h"

// ---- configuration -------------------------------------------------------------------------

void kaon_moe_config_from_gguf(const kaon_gguf *g, kaon_model_config *c) {
    char key[160];
#define KEY(k) (snprintf(key, sizeof key, "%s.%s", c->arch_name, k), key)
    c->n_experts = (int)kaon_gguf_get_int(g, KEY("expert_count"), 0);
    if (c->n_experts <= 0) {
        c->n_experts = 0;
        return;
    }
    c->n_experts_used = (int)kaon_gguf_get_int(g, KEY("expert_used_count"), 2);
    c->moe_intermediate_size =
        (int)kaon_gguf_get_int(g, KEY("expert_feed_forward_length"), c->intermediate_size);
    c->shared_expert_intermediate_size =
        (int)kaon_gguf_get_int(g, KEY("expert_shared_feed_forward_length"), 0);
    c->shared_expert_gated = !strcmp(c->arch_name, "qwen2moe");
    // llama.cpp renormalises for Mixtral (llama) and qwen3moe, not for qwen2moe.
    c->norm_topk_prob = kaon_gguf_get_bool(g, KEY("expert_weights_norm"),
                                           strcmp(c->arch_name, "qwen2moe") != 0);
    // A file whose every layer has experts may leave the dense width out.
    if (c->intermediate_size <= 0) c->intermediate_size = c->moe_intermediate_size;
#undef KEY
}

// ---- finding tensors -------------------------------------------------------------------------

static int shape_error(const kaon_model *m, const char *name, const kaon_tensor *t, int nd,
                       const int64_t *want) {
    char got[96] = "", exp[96] = "";
    for (int i = 0, o = 0; i < t->ndim && o < (int)sizeof got - 24; i++)
        o += snprintf(got + o, sizeof got - (size_t)o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    for (int i = 0, o = 0; i < nd && o < (int)sizeof exp - 24; i++)
        o += snprintf(exp + o, sizeof exp - (size_t)o, "%s%lld", i ? ", " : "", (long long)want[i]);
    return kaon_set_error("%s: tensor '%s' has shape [%s], expected [%s]", m->path, name, got, exp);
}

// Finds a matrix (or stacked matrices: nd == 3) of the given shape; required or optional.
static int find_shaped(kaon_model *m, const char *name, bool required, int nd, int64_t d0,
                       int64_t d1, int64_t d2, kaon_tensor *out) {
    if (kaon_model_find_tensor(m, name, out)) return -1;
    if (!out->data && kaon_mxfp4_load(m, name, out)) return -1;  // <name>_blocks + _scales
    if (!out->data) return required ? kaon_set_error("%s: missing tensor '%s'", m->path, name) : 0;
    if (out->dtype == KAON_FP8_E4M3 && nd != 2)  // scales are attached per expert (attach_fp8)
        return kaon_set_error("%s: tensor '%s': stacked FP8 experts are not supported (DeepSeek's "
                              "checkpoints store one tensor per expert)", m->path, name);
    const int64_t want[3] = {d0, d1, d2};
    bool ok = out->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = out->shape[i] == want[i];
    if (!ok) return shape_error(m, name, out, nd, want);
    const int64_t cols = out->shape[nd - 1];
    if (kaon_dtype_row_bytes(out->dtype, cols) == 0)
        return kaon_set_error("%s: tensor '%s': rows of %lld are not a whole number of %s blocks",
                              m->path, name, (long long)cols, kaon_dtype_name(out->dtype));
    return 0;
}

// FP8 and INT8 matrices get their scale companions (fp8_weights.h); other formats have none here.
static int attach_fp8(kaon_model *m, kaon_linear *l, const char *name) {
    if (l->w.dtype == KAON_FP8_E4M3) return kaon_fp8_attach(m, l, name);
    return l->w.dtype == KAON_I8 ? kaon_int8_attach(m, l, name) : 0;
}

// A [rows, cols] matrix <module>.weight, or a 4-bit checkpoint's packed tensors of the module
// unpacked (int4_weights.h: l->w and its companions). The rest of l is kept.
static int find_linear(kaon_model *m, const char *name, bool required, int64_t rows, int64_t cols, kaon_linear *l) {
    const size_t n = strlen(name);
    if (!m->gguf && m->quant.format == KAON_QFMT_INT && n > 7 && !strcmp(name + n - 7, ".weight")) {
        kaon_tensor t;
        if (kaon_model_find_tensor(m, name, &t)) return -1;
        char module[192];
        snprintf(module, sizeof module, "%.*s", (int)(n - 7), name);
        if (!t.data && kaon_int4_load(m, module, rows, cols, l)) return -1;
        if (l->w.data) return 0;
    }
    return find_shaped(m, name, required, 2, rows, cols, 0, &l->w);
}

// [E, rows, cols] (or [rows, cols]) seen as the 2-D [E * rows, cols] it is in memory.
static kaon_tensor as_2d(kaon_tensor t) {
    if (t.ndim == 3) {
        t.shape[0] *= t.shape[1];
        t.shape[1] = t.shape[2];
        t.shape[2] = 0;
        t.ndim = 2;
    }
    return t;
}

// ---- one layer ---------------------------------------------------------------------------------

static void layer_free(kaon_moe_layer *l) {
    free(l->own_bias);
    free(l->views);
    free(l->src);
    free(l->src_of);
    free(l->row0);
    memset(l, 0, sizeof *l);
}

static int layer_alloc(kaon_moe_layer *l, int E, int max_src) {
    memset(l, 0, sizeof *l);
    l->views = calloc((size_t)3 * E, sizeof *l->views);
    l->src = calloc((size_t)max_src, sizeof *l->src);
    l->src_of = calloc((size_t)3 * E, sizeof *l->src_of);
    l->row0 = calloc((size_t)3 * E, sizeof *l->row0);
    if (!l->views || !l->src || !l->src_of || !l->row0) {
        layer_free(l);
        return kaon_set_error("out of memory");
    }
    return 0;
}

// The view of kind k (gate/up/down) of expert e: rows [row0, row0 + rows) of source s.
static void set_view(kaon_moe_layer *l, int E, int k, int e, int s, int64_t row0, int64_t rows) {
    const kaon_tensor *src = &l->src[s];
    const int64_t cols = src->shape[1];
    const size_t rb = kaon_dtype_row_bytes(src->dtype, cols);
    kaon_linear *lin = &l->views[k * E + e];
    memset(lin, 0, sizeof *lin);
    kaon_tensor *v = &lin->w;
    v->dtype = src->dtype;
    v->ndim = 2;
    v->shape[0] = rows;
    v->shape[1] = cols;
    v->data = (char *)src->data + (size_t)row0 * rb;
    v->nbytes = (size_t)rows * rb;
    l->src_of[k * E + e] = s;
    l->row0[k * E + e] = row0;
}

// A per-expert source loaded as a whole kaon_linear (INT4: scales, zeros, permutation): its view.
static void set_whole_view(kaon_moe_layer *l, int E, int k, int e, int s, const kaon_linear *src) {
    set_view(l, E, k, e, s, 0, src->w.shape[0]);
    kaon_linear *v = &l->views[k * E + e];
    v->scale = src->scale;
    v->zero = src->zero;
    v->perm = src->perm;
    memcpy(v->scale_block, src->scale_block, sizeof v->scale_block);
}

// Points the op's view (l->w) at the layer's own tensors (l->w.n_experts set).
static void point_weights(kaon_moe_layer *l) {
    const int E = l->w.n_experts;
    l->w.router = &l->router;
    l->w.gate = l->views;
    l->w.up = l->views + E;
    l->w.down = l->views + 2 * E;
    const bool sh = l->shared[0].w.data != NULL;
    l->w.shared_gate = sh ? &l->shared[0] : NULL;
    l->w.shared_up = sh ? &l->shared[1] : NULL;
    l->w.shared_down = sh ? &l->shared[2] : NULL;
    l->w.shared_gate_inp = sh && l->shared_gate_inp.w.data ? &l->shared_gate_inp : NULL;
    l->w.score_bias = l->score_bias.data ? &l->score_bias : NULL;
}

void kaon_moe_bind(kaon_moe_layer *l, const kaon_model_config *c) {
    l->w.n_experts = c->n_experts;
    l->w.top_k = c->n_experts_used;
    l->w.norm_topk = c->norm_topk_prob;
    l->w.scoring = c->moe_scoring;
    l->w.n_group = c->moe_n_group;
    l->w.topk_group = c->moe_topk_group;
    l->w.group_top2 = c->moe_group_top2;
    l->w.routed_scale = c->moe_routed_scale;
    point_weights(l);
}

bool kaon_moe_layer_wanted(const kaon_model *m, int l) {
    if (m->cfg.n_experts <= 0) return false;
    if (m->gguf) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        return kaon_gguf_find_tensor(m->gguf, name) != NULL;
    }
    return kaon_config_layer_is_moe(&m->cfg, l);
}

static int ensure_layers(kaon_model *m) {
    if (m->w.moe) return 0;
    m->w.moe = calloc((size_t)m->cfg.n_layers, sizeof *m->w.moe);
    return m->w.moe ? 0 : kaon_set_error("out of memory");
}

// Shared expert (Qwen2-MoE): gate/up [sffn, dim], down [dim, sffn], its gate [1, dim] (GGUF
// stores that one as a vector [dim]).
static int load_shared(kaon_model *m, kaon_moe_layer *L, const char *const names[4]) {
    kaon_model_config *c = &m->cfg;
    const int64_t dim = c->hidden_size;
    kaon_tensor probe;
    if (kaon_model_find_tensor(m, names[0], &probe)) return -1;
    if (probe.ndim == 2 && c->shared_expert_intermediate_size <= 0)
        c->shared_expert_intermediate_size = (int)probe.shape[0];
    const int64_t sf = c->shared_expert_intermediate_size;
    if (!probe.data) {  // none, or a 4-bit checkpoint's packed gate (its width from the config)
        if (sf <= 0) return 0;
        if (find_linear(m, names[0], false, sf, dim, &L->shared[0])) return -1;
        if (!L->shared[0].w.data) return 0;
    } else if (find_linear(m, names[0], true, sf, dim, &L->shared[0])) {
        return -1;
    }
    if (find_linear(m, names[1], true, sf, dim, &L->shared[1]) ||
        find_linear(m, names[2], true, dim, sf, &L->shared[2]))
        return -1;
    for (int k = 0; k < 3; k++)
        if (attach_fp8(m, &L->shared[k], names[k])) return -1;
    kaon_tensor g;
    if (kaon_model_find_tensor(m, names[3], &g)) return -1;
    if (g.data) {
        if (kaon_tensor_numel(&g) != dim || g.ndim > 2 || (g.ndim == 2 && g.shape[0] != 1)) {
            const int64_t want[2] = {1, dim};
            return shape_error(m, names[3], &g, 2, want);
        }
        g.ndim = 2;
        g.shape[0] = 1;
        g.shape[1] = dim;
        L->shared_gate_inp.w = g;
    }
    return 0;
}

// DeepSeek-V3's selection bias [E], kept in f32 (HF keeps it in fp32 whatever the model's dtype).
static int load_score_bias(kaon_model *m, kaon_moe_layer *L, const char *name) {
    const int E = m->cfg.n_experts;
    kaon_tensor t;
    if (kaon_model_find_tensor(m, name, &t)) return -1;
    if (!t.data) return kaon_set_error("%s: missing tensor '%s'", m->path, name);
    if (kaon_tensor_numel(&t) != E || t.ndim != 1) {
        const int64_t want[1] = {E};
        return shape_error(m, name, &t, 1, want);
    }
    if (t.dtype != KAON_F32 && t.dtype != KAON_BF16 && t.dtype != KAON_F16)
        return kaon_set_error("%s: tensor '%s' is %s (F32/BF16/F16 expected)", m->path, name, kaon_dtype_name(t.dtype));
    if (t.dtype != KAON_F32) {
        L->own_bias = malloc(sizeof(float) * (size_t)E);
        if (!L->own_bias) return kaon_set_error("out of memory");
        for (int e = 0; e < E; e++) {
            const uint16_t h = ((const uint16_t *)t.data)[e];
            L->own_bias[e] = t.dtype == KAON_BF16 ? kaon_bf16_to_f32(h) : kaon_f16_to_f32(h);
        }
        t.data = L->own_bias;
        t.dtype = KAON_F32;
        t.nbytes = sizeof(float) * (size_t)E;
    }
    L->score_bias = t;
    return 0;
}

int kaon_moe_load_layer(kaon_model *m, int l) {
    const kaon_model_config *c = &m->cfg;
    const int E = c->n_experts;
    const int64_t dim = c->hidden_size, F = c->moe_intermediate_size;
    if (ensure_layers(m)) return -1;
    kaon_moe_layer *L = &m->w.moe[l];
    if (layer_alloc(L, E, 3 * E)) return -1;
    char n0[192], n1[192], n2[192], n3[192];
    kaon_tensor st[3];
    if (m->gguf) {
        snprintf(n0, sizeof n0, "blk.%d.ffn_gate_inp.weight", l);
        if (find_shaped(m, n0, true, 2, E, dim, 0, &L->router.w)) goto fail;
        static const char *const stacked[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
        static const char *const single[3] = {"ffn_gate", "ffn_up", "ffn_down"};
        snprintf(n0, sizeof n0, "blk.%d.%s.weight", l, stacked[0]);
        if (kaon_model_find_tensor(m, n0, &st[0])) goto fail;
        if (st[0].data) {  // [E, rows, cols] each
            for (int k = 0; k < 3; k++) {
                snprintf(n0, sizeof n0, "blk.%d.%s.weight", l, stacked[k]);
                const int64_t rows = k == 2 ? dim : F, cols = k == 2 ? F : dim;
                if (find_shaped(m, n0, true, 3, E, rows, cols, &st[k])) goto fail;
                L->src[k] = as_2d(st[k]);
                for (int e = 0; e < E; e++) set_view(L, E, k, e, k, (int64_t)e * rows, rows);
            }
            L->n_src = 3;
        } else {  // older files: one tensor per expert
            for (int k = 0; k < 3; k++)
                for (int e = 0; e < E; e++) {
                    snprintf(n0, sizeof n0, "blk.%d.%s.%d.weight", l, single[k], e);
                    const int64_t rows = k == 2 ? dim : F, cols = k == 2 ? F : dim;
                    if (find_shaped(m, n0, true, 2, rows, cols, 0, &L->src[L->n_src])) goto fail;
                    set_view(L, E, k, e, L->n_src++, 0, rows);
                }
        }
        snprintf(n0, sizeof n0, "blk.%d.exp_probs_b.bias", l);
        if (c->moe_score_bias && load_score_bias(m, L, n0)) goto fail;
        snprintf(n0, sizeof n0, "blk.%d.ffn_gate_shexp.weight", l);
        snprintf(n1, sizeof n1, "blk.%d.ffn_up_shexp.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.ffn_down_shexp.weight", l);
        snprintf(n3, sizeof n3, "blk.%d.ffn_gate_inp_shexp.weight", l);
    } else {
        // Mixtral checkpoints name the block block_sparse_moe; Qwen's and transformers 5's, mlp.
        char p[96];
        snprintf(p, sizeof p, "model.layers.%d.block_sparse_moe", l);
        snprintf(n0, sizeof n0, "%s.gate.weight", p);
        if (kaon_model_find_tensor(m, n0, &L->router.w)) goto fail;
        if (!L->router.w.data) snprintf(p, sizeof p, "model.layers.%d.mlp", l);
        snprintf(n0, sizeof n0, "%s.gate.weight", p);
        if (find_shaped(m, n0, true, 2, E, dim, 0, &L->router.w) || attach_fp8(m, &L->router, n0)) goto fail;
        snprintf(n0, sizeof n0, "%s.experts.gate_up_proj", p);
        if (kaon_mxfp4_probe(m, n0, &st[0])) goto fail;
        if (st[0].data) {  // fused: gate rows [0, F) then up rows [F, 2F) of each expert
            snprintf(n1, sizeof n1, "%s.experts.down_proj", p);
            if (find_shaped(m, n0, true, 3, E, 2 * F, dim, &st[0]) ||
                find_shaped(m, n1, true, 3, E, dim, F, &st[1]))
                goto fail;
            L->src[0] = as_2d(st[0]);
            L->src[1] = as_2d(st[1]);
            L->n_src = 2;
            for (int e = 0; e < E; e++) {
                set_view(L, E, KAON_MOE_GATE, e, 0, (int64_t)e * 2 * F, F);
                set_view(L, E, KAON_MOE_UP, e, 0, (int64_t)e * 2 * F + F, F);
                set_view(L, E, KAON_MOE_DOWN, e, 1, (int64_t)e * dim, dim);
            }
        } else {
            static const char *const mixtral[3] = {"w1", "w3", "w2"};
            static const char *const qwen[3] = {"gate_proj", "up_proj", "down_proj"};
            // Mixtral's names, as a float, AWQ/GPTQ or compressed-tensors Linear stores them.
            static const char *const w1[3] = {"weight", "qweight", "weight_packed"};
            st[0].data = NULL;
            for (int i = 0; i < 3 && !st[0].data; i++) {
                snprintf(n0, sizeof n0, "%s.experts.0.w1.%s", p, w1[i]);
                if (kaon_model_find_tensor(m, n0, &st[0])) goto fail;
            }
            const char *const *nm = st[0].data ? mixtral : qwen;
            for (int k = 0; k < 3; k++)
                for (int e = 0; e < E; e++) {
                    snprintf(n0, sizeof n0, "%s.experts.%d.%s.weight", p, e, nm[k]);
                    const int64_t rows = k == 2 ? dim : F, cols = k == 2 ? F : dim;
                    kaon_linear one;
                    memset(&one, 0, sizeof one);
                    if (find_linear(m, n0, true, rows, cols, &one)) goto fail;
                    L->src[L->n_src] = one.w;
                    set_whole_view(L, E, k, e, L->n_src++, &one);
                    if (attach_fp8(m, &L->views[k * E + e], n0)) goto fail;
                }
        }
        snprintf(n0, sizeof n0, "%s.gate.e_score_correction_bias", p);
        if (c->moe_score_bias && load_score_bias(m, L, n0)) goto fail;
        const char *sh = c->shared_expert_gated ? "shared_expert" : "shared_experts";
        snprintf(n0, sizeof n0, "%s.%s.gate_proj.weight", p, sh);
        snprintf(n1, sizeof n1, "%s.%s.up_proj.weight", p, sh);
        snprintf(n2, sizeof n2, "%s.%s.down_proj.weight", p, sh);
        snprintf(n3, sizeof n3, "%s.shared_expert_gate.weight", p);
    }
    const char *const sh[4] = {n0, n1, n2, n3};
    if (load_shared(m, L, sh)) goto fail;
    kaon_moe_bind(L, c);
    return 0;
fail:
    layer_free(L);
    return -1;
}

// Placeholder data of dummy weights (never read: the backend creates the values).
static const uint16_t dummy_data[8];

static kaon_tensor dummy_2d(int64_t rows, int64_t cols) {
    kaon_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = KAON_BF16;
    t.ndim = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.data = (void *)dummy_data;
    t.nbytes = (size_t)rows * (size_t)cols * 2;
    return t;
}

int kaon_moe_dummy_layer(kaon_model *m, int l) {
    const kaon_model_config *c = &m->cfg;
    const int E = c->n_experts;
    const int64_t dim = c->hidden_size, F = c->moe_intermediate_size;
    const int64_t sf = c->shared_expert_intermediate_size;
    if (ensure_layers(m)) return -1;
    kaon_moe_layer *L = &m->w.moe[l];
    if (layer_alloc(L, E, 3)) return -1;
    L->router.w = dummy_2d(E, dim);
    L->src[0] = dummy_2d((int64_t)E * F, dim);
    L->src[1] = dummy_2d((int64_t)E * F, dim);
    L->src[2] = dummy_2d((int64_t)E * dim, F);
    L->n_src = 3;
    // FP8 configs: experts and shared experts as DeepSeek's checkpoints store them (the router
    // stays bf16 there, FORMATS-2.md §4).
    static const char *const kind[3] = {"gate_proj", "up_proj", "down_proj"};
    char mod[160];
    for (int e = 0; e < E; e++) {
        set_view(L, E, KAON_MOE_GATE, e, 0, (int64_t)e * F, F);
        set_view(L, E, KAON_MOE_UP, e, 1, (int64_t)e * F, F);
        set_view(L, E, KAON_MOE_DOWN, e, 2, (int64_t)e * dim, dim);
        for (int k = 0; k < 3; k++) {
            snprintf(mod, sizeof mod, "model.layers.%d.mlp.experts.%d.%s", l, e, kind[k]);
            kaon_fp8_dummy_mark(m, &L->views[k * E + e], mod);
        }
    }
    for (int k = 0; k < 3; k++)
        if (L->views[k * E].w.dtype == KAON_FP8_E4M3) {
            L->src[k].dtype = KAON_FP8_E4M3;
            L->src[k].nbytes /= 2;
        }
    if (sf > 0) {
        L->shared[0].w = dummy_2d(sf, dim);
        L->shared[1].w = dummy_2d(sf, dim);
        L->shared[2].w = dummy_2d(dim, sf);
        if (c->shared_expert_gated) L->shared_gate_inp.w = dummy_2d(1, dim);
        for (int k = 0; k < 3; k++) {
            snprintf(mod, sizeof mod, "model.layers.%d.mlp.%s.%s", l, c->shared_expert_gated ? "shared_expert" :
                     "shared_experts", kind[k]);
            kaon_fp8_dummy_mark(m, &L->shared[k], mod);
        }
    }
    if (c->moe_score_bias) {
        L->score_bias = dummy_2d(1, E);
        L->score_bias.ndim = 1;
        L->score_bias.shape[0] = E;
        L->score_bias.shape[1] = 0;
        L->score_bias.dtype = KAON_F32;
        L->score_bias.nbytes = sizeof(float) * (size_t)E;
    }
    kaon_moe_bind(L, c);
    return 0;
}

void kaon_moe_free_model(kaon_model *m) {
    if (!m->w.moe) return;
    for (int l = 0; l < m->cfg.n_layers; l++) layer_free(&m->w.moe[l]);
    free(m->w.moe);
    m->w.moe = NULL;
}

// ---- device copies -----------------------------------------------------------------------------

// dense: the backend's moe op reads only its dense format (the router and the experts on
// CUDA), so quantized GGUF blocks are expanded there; the shared expert goes through the
// linear ops, which read them quantized. o: where t sits in the whole tensor (dummy values of
// an expert-parallel rank's rows: the whole's); NULL: t is whole (CUDA refuses tensor parallel
// dummy weights with a shared expert, whose split has no origin).
static int copy_one(kaon_backend *be, const kaon_tensor *t, bool dummy, uint64_t seed, bool dense,
                    const kaon_dummy_origin *o, kaon_tensor *dst) {
    memset(dst, 0, sizeof *dst);
    if (!t->data) return 0;
    if (!dummy) return (dense && be->ops->upload_dense ? be->ops->upload_dense : be->ops->upload)(be, t, dst);
    const float scale = 1.0f / sqrtf((float)t->shape[t->ndim - 1]);
    return be->ops->fill_dummy(be, t, o, seed, scale, 0.0f, dst);
}

// The experts a layer's device copy holds: [e0, e1) under expert parallelism (model/tp.h:
// kaon_moe_weights.e0/e1), else all of them. A view of another rank's expert is left empty.
static void held_experts(const kaon_moe_layer *l, int *e0, int *e1) {
    *e0 = l->w.e1 > 0 ? l->w.e0 : 0;
    *e1 = l->w.e1 > 0 ? l->w.e1 : l->w.n_experts;
}

// One tensor per expert (HF per-expert names, older GGUF files): a host copy that stacks
// them, [E * rows, cols] per kind, so the device holds each kind in one allocation and a
// kernel finds expert e at a fixed stride. NULL + error on failure (or mixed formats).
// Expert parallel: only the rank's experts [e0, e1), expert e0 first ([(e1 - e0) * rows, cols]).
static kaon_moe_layer *stack_experts(const kaon_moe_layer *host, void **blobs) {
    const int E = host->w.n_experts;
    int e0, e1;
    held_experts(host, &e0, &e1);
    const int ne = e1 - e0;
    kaon_moe_layer *st = calloc(1, sizeof *st);
    if (!st || layer_alloc(st, E, 3)) {
        free(st);
        kaon_set_error("out of memory");
        return NULL;
    }
    st->router = host->router;
    memcpy(st->shared, host->shared, sizeof st->shared);
    st->shared_gate_inp = host->shared_gate_inp;
    st->score_bias = host->score_bias;
    st->w = host->w;
    for (int k = 0; k < 3; k++) {
        const kaon_tensor *v0 = &host->views[k * E + e0].w;
        const size_t bytes = v0->nbytes;
        for (int e = e0 + 1; e < e1; e++) {
            const kaon_tensor *v = &host->views[k * E + e].w;
            if (v->dtype != v0->dtype || v->nbytes != bytes || v->shape[0] != v0->shape[0]) {
                kaon_set_error("experts of one layer have different formats (%s, %s)",
                               kaon_dtype_name(v0->dtype), kaon_dtype_name(v->dtype));
                goto fail;
            }
        }
        char *blob = malloc(bytes * (size_t)ne);
        if (!blob) {
            kaon_set_error("out of memory stacking experts (%zu MiB)", (bytes * (size_t)ne) >> 20);
            goto fail;
        }
        blobs[k] = blob;
        for (int e = e0; e < e1; e++) memcpy(blob + bytes * (size_t)(e - e0), host->views[k * E + e].w.data, bytes);
        kaon_tensor *t = &st->src[k];
        *t = *v0;
        t->shape[0] = v0->shape[0] * ne;
        t->data = blob;
        t->nbytes = bytes * (size_t)ne;
        for (int e = e0; e < e1; e++) set_view(st, E, k, e, k, (int64_t)(e - e0) * v0->shape[0], v0->shape[0]);
    }
    st->n_src = 3;
    return st;
fail:
    layer_free(st);
    free(st);
    return NULL;
}

static int upload_layer(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                        kaon_moe_layer *dev);
static int upload_fp8_layer(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                            kaon_moe_layer *dev);
static int upload_common(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                         kaon_moe_layer *dev);

// What a device backend can take of layer l: bare matrices, or FP8 with scales where the backend
// has upload_linear (its FP8 layout); NULL, or why not.
static const char *device_unsupported(const kaon_backend *be, const kaon_linear *l) {
    if (!l->w.data) return NULL;
    if (l->w.dtype == KAON_MXFP4 || l->w.dtype == KAON_I4) return kaon_linear_unsupported(l);
    if (l->scale.data && !(kaon_linear_is_fp8_block(l) && be->ops->upload_linear)) return kaon_linear_unsupported(l);
    return NULL;
}

int kaon_moe_upload(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                    kaon_moe_layer *dev) {
    const int E = host->w.n_experts;
    // The router is read by the moe op's own kernels, in bf16.
    if (host->router.scale.data) return kaon_set_error("an FP8 router runs on the CPU backend only for now");
    if (host->router.w.dtype == KAON_MXFP4) return kaon_set_error("an MXFP4 router runs on the CPU backend only for now");
    for (int i = 0; i < 3 * E + 3; i++) {
        const kaon_linear *v = i < 3 * E ? &host->views[i] : &host->shared[i - 3 * E];
        const char *why = device_unsupported(be, v);
        if (why) return kaon_set_error("experts with %s run on the CPU backend only for now", why);
    }
    if (kaon_linear_is_fp8_block(&host->views[0])) {
        if (host->w.e1 > 0)  // (cuda_moe.cu refuses it too: its FP8 combine has no slot-less choices)
            return kaon_set_error("expert parallel on a device: FP8 experts are not supported yet (bf16 experts only)");
        return upload_fp8_layer(be, host, dummy, seed, dev);
    }
    if (E < 2 || host->n_src != 3 * E) return upload_layer(be, host, dummy, seed, dev);
    void *blobs[3] = {NULL, NULL, NULL};
    kaon_moe_layer *st = stack_experts(host, blobs);
    const int rc = st ? upload_layer(be, st, dummy, seed, dev) : -1;
    for (int k = 0; k < 3; k++) free(blobs[k]);
    if (st) {
        layer_free(st);
        free(st);
    }
    return rc;
}

// A shared expert's matrix: FP8 with its scales through upload_linear, else as copy_one.
static int copy_shared(kaon_backend *be, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dst) {
    memset(dst, 0, sizeof *dst);
    if (host->w.data && host->scale.data) return be->ops->upload_linear(be, host, dummy, seed, dst);
    return copy_one(be, &host->w, dummy, seed, false, NULL, &dst->w);
}

// The layer's router, shared expert, its gate input and the selection bias (the parts every
// upload path copies the same way).
static int upload_common(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                         kaon_moe_layer *dev) {
    int rc = copy_one(be, &host->router.w, dummy, seed, true, NULL, &dev->router.w);
    for (int i = 0; i < 3 && !rc; i++) rc = copy_shared(be, &host->shared[i], dummy, seed + 1 + i, &dev->shared[i]);
    if (!rc) rc = copy_one(be, &host->shared_gate_inp.w, dummy, seed + 4, true, NULL, &dev->shared_gate_inp.w);
    if (!rc) rc = copy_one(be, &host->score_bias, dummy, seed + 5, false, NULL, &dev->score_bias);
    return rc;
}

// ---- FP8 experts on a device ---------------------------------------------------------------------
// Kind k's experts become one FP8 layer [E * rows, cols] whose scale grid the backend's FP8 upload
// takes: 128-row blocks stack when rows is a multiple of the block (DeepSeek, Qwen3-FP8), channel
// scales stack as they are, a tensor's scale is repeated per row. The views then point into the
// one device copy: expert e's codes at e * rows * cols, its scales at e * (scale rows) * (scale cols).

static float *fp8_scales_stacked(const kaon_moe_layer *host, int k, bool per_row, int64_t *srows, int64_t *scols) {
    const int E = host->w.n_experts;
    const kaon_linear *v0 = &host->views[k * E];
    const int64_t rows = v0->w.shape[0];
    const int64_t er = per_row ? rows : v0->scale.shape[0], ec = per_row ? 1 : v0->scale.shape[1];
    float *s = malloc(sizeof(float) * (size_t)(E * er * ec));
    if (!s) {
        kaon_set_error("out of memory stacking expert scales");
        return NULL;
    }
    for (int e = 0; e < E; e++)
        for (int64_t i = 0; i < er * ec; i++)
            s[(size_t)(e * er * ec + i)] = kaon_tensor_f32_at(&host->views[k * E + e].scale, per_row ? 0 : i);
    *srows = E * er;
    *scols = ec;
    return s;
}

static int stack_fp8(const kaon_moe_layer *host, int k, bool dummy, kaon_linear *out, void **blobs) {
    const int E = host->w.n_experts;
    const kaon_linear *v0 = &host->views[k * E];
    const int64_t rows = v0->w.shape[0], cols = v0->w.shape[1];
    const int32_t b0 = v0->scale_block[0], b1 = v0->scale_block[1];
    for (int e = 0; e < E; e++) {
        const kaon_linear *v = &host->views[k * E + e];
        if (!kaon_linear_is_fp8_block(v) || v->w.shape[0] != rows || v->w.shape[1] != cols || v->scale_block[0] != b0 ||
            v->scale_block[1] != b1 || v->scale.shape[0] != v0->scale.shape[0] ||
            v->scale.shape[1] != v0->scale.shape[1] || v->act_quant != v0->act_quant || kaon_linear_bias(v))
            return kaon_set_error("FP8 experts of one layer with different formats, shapes or scale blocks");
    }
    const bool tensor = b0 >= rows && b1 >= cols;
    if (!tensor && b0 != 1 && rows % b0)
        return kaon_set_error("FP8 experts of %lld rows with scale blocks of %d rows: not supported on the device",
                              (long long)rows, b0);
    memset(out, 0, sizeof *out);
    out->w = v0->w;
    out->w.shape[0] = E * rows;
    out->w.nbytes = (size_t)(E * rows * cols);
    out->scale_block[0] = tensor ? 1 : b0;
    out->scale_block[1] = tensor ? (int32_t)cols : b1;
    out->act_quant = v0->act_quant;
    out->act_scale = v0->act_scale;
    out->scale = v0->scale;
    out->scale.shape[0] = tensor ? E * rows : E * v0->scale.shape[0];
    out->scale.shape[1] = tensor ? 1 : v0->scale.shape[1];
    out->scale.nbytes = sizeof(float) * (size_t)(out->scale.shape[0] * out->scale.shape[1]);
    if (dummy) return 0;  // shapes only: the backend makes the values
    // Codes: the views in place when they are one run of rows already, else a stacked copy.
    bool run = true;
    for (int e = 1; e < E && run; e++) run = (const char *)host->views[k * E + e].w.data == (const char *)v0->w.data + (size_t)(e * rows * cols);
    if (!run) {
        char *blob = malloc((size_t)(E * rows * cols));
        if (!blob) return kaon_set_error("out of memory stacking experts (%lld MiB)", (long long)((E * rows * cols) >> 20));
        blobs[0] = blob;
        for (int e = 0; e < E; e++) memcpy(blob + (size_t)(e * rows * cols), host->views[k * E + e].w.data, (size_t)(rows * cols));
        out->w.data = blob;
    }
    int64_t sr, sc;
    float *s = fp8_scales_stacked(host, k, tensor, &sr, &sc);
    if (!s) return -1;
    blobs[1] = s;
    out->scale.data = s;
    out->scale.dtype = KAON_F32;
    out->scale.ndim = 2;
    out->scale.shape[0] = sr;
    out->scale.shape[1] = sc;
    return 0;
}

static int upload_fp8_layer(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                            kaon_moe_layer *dev) {
    const int E = host->w.n_experts;
    if (layer_alloc(dev, E, 3)) return -1;
    int rc = upload_common(be, host, dummy, seed, dev);
    for (int k = 0; k < 3 && !rc; k++) {
        void *blobs[2] = {NULL, NULL};
        kaon_linear sl, dl;
        rc = stack_fp8(host, k, dummy, &sl, blobs);
        if (!rc) rc = be->ops->upload_linear(be, &sl, dummy, seed + 8 + (uint64_t)k, &dl);
        free(blobs[0]);
        free(blobs[1]);
        if (rc) break;
        dev->src[k] = dl.w;
        dev->n_src++;
        const int64_t rows = host->views[k * E].w.shape[0];
        // The device's scale rows per expert (its layout may differ from the checkpoint's).
        const int64_t er = dl.scale.shape[0] / E, ec = dl.scale.shape[1];
        for (int e = 0; e < E; e++) {
            set_view(dev, E, k, e, k, (int64_t)e * rows, rows);
            kaon_linear *v = &dev->views[k * E + e];
            v->scale = dl.scale;
            v->scale.shape[0] = er;
            v->scale.data = (float *)dl.scale.data + (size_t)(e * er * ec);
            v->scale.nbytes = sizeof(float) * (size_t)(er * ec);
            memcpy(v->scale_block, dl.scale_block, sizeof v->scale_block);
            v->act_quant = dl.act_quant;
            v->act_scale = dl.act_scale;
        }
    }
    if (rc) {
        kaon_moe_release(be, dev);
        return -1;
    }
    dev->w = host->w;
    point_weights(dev);
    return 0;
}

// Expert parallel (host->w.e1 > 0): of each source only the rows that the rank's experts
// [e0, e1) view (none: the source is not copied), so a kind's device copy starts at expert e0's
// first row and the views of [e0, e1) are rebuilt at their rows less that start (dummy weights:
// those rows' values in the whole source); the other experts' views stay empty.
static int upload_layer(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                        kaon_moe_layer *dev) {
    const int E = host->w.n_experts;
    const bool ep = host->w.e1 > 0;
    int e0, e1;
    held_experts(host, &e0, &e1);
    if (layer_alloc(dev, E, host->n_src > 0 ? host->n_src : 1)) return -1;
    int64_t *first = calloc((size_t)(host->n_src > 0 ? host->n_src : 1), sizeof *first);  // source row 0 on the device
    if (!first) {
        layer_free(dev);
        return kaon_set_error("out of memory");
    }
    dev->n_src = 0;
    int rc = upload_common(be, host, dummy, seed, dev);
    for (int i = 0; i < host->n_src && !rc; i++, dev->n_src++) {
        const kaon_tensor *src = &host->src[i];
        if (!ep) {
            rc = copy_one(be, src, dummy, seed + 8 + (uint64_t)i, true, NULL, &dev->src[i]);
            continue;
        }
        int64_t lo = src->shape[0], hi = 0;  // rows [lo, hi) of this source that [e0, e1) view
        for (int k = 0; k < 3; k++)
            for (int e = e0; e < e1; e++)
                if (host->src_of[k * E + e] == i) {
                    const int64_t r0 = host->row0[k * E + e], r1 = r0 + host->views[k * E + e].w.shape[0];
                    lo = r0 < lo ? r0 : lo;
                    hi = r1 > hi ? r1 : hi;
                }
        if (hi <= lo) continue;  // another rank's experts only (per-expert sources): not copied
        kaon_tensor part = *src;
        const size_t rb = kaon_dtype_row_bytes(src->dtype, src->shape[1]);
        part.data = (char *)src->data + (size_t)lo * rb;
        part.shape[0] = hi - lo;
        part.nbytes = (size_t)(hi - lo) * rb;
        const kaon_dummy_origin o = {.dim = 0, .lo = lo, .full = src->shape[0]};
        first[i] = lo;
        rc = copy_one(be, &part, dummy, seed + 8 + (uint64_t)i, true, lo > 0 || hi < src->shape[0] ? &o : NULL,
                      &dev->src[i]);
    }
    if (rc) {
        free(first);
        kaon_moe_release(be, dev);
        return -1;
    }
    for (int k = 0; k < 3; k++)
        for (int e = e0; e < e1; e++) {
            const kaon_tensor *hv = &host->views[k * E + e].w;
            const int s = host->src_of[k * E + e];
            set_view(dev, E, k, e, s, host->row0[k * E + e] - first[s], hv->shape[0]);
        }
    free(first);
    dev->w = host->w;
    point_weights(dev);
    return 0;
}

void kaon_moe_release(kaon_backend *be, kaon_moe_layer *dev) {
    if (be->ops->release) {
        if (dev->router.w.data) be->ops->release(be, &dev->router.w);
        for (int i = 0; i < 3; i++)
            if (dev->shared[i].w.data) be->ops->release(be, &dev->shared[i].w);
        if (dev->shared_gate_inp.w.data) be->ops->release(be, &dev->shared_gate_inp.w);
        if (dev->score_bias.data) be->ops->release(be, &dev->score_bias);
        for (int i = 0; i < dev->n_src; i++)
            if (dev->src[i].data) be->ops->release(be, &dev->src[i]);
    }
    layer_free(dev);
}

size_t kaon_moe_act_bytes(const kaon_model *m, size_t elem_bytes, int T) {
    const kaon_model_config *c = &m->cfg;
    if (c->n_experts <= 0 || T <= 0) return 0;
    const size_t rows = (size_t)T * (size_t)c->n_experts_used;
    const size_t sf = (size_t)c->shared_expert_intermediate_size;
    // Router logits (f32), routing tables, routed rows' hidden and output activations, and
    // the shared expert's hidden and output.
    return (size_t)T * (size_t)c->n_experts * 4 + rows * 16 + (size_t)c->n_experts * 64 +
           rows * ((size_t)c->moe_intermediate_size + (size_t)c->hidden_size) * elem_bytes +
           (size_t)T * (sf + (size_t)c->hidden_size + 2) * elem_bytes;
}

kaon_moe_stats *kaon_moe_stats_create(kaon_backend *be, const kaon_model *m) {
    const int L = m->cfg.n_layers, E = m->cfg.n_experts;
    if (E <= 0) {
        kaon_set_error("expert statistics: %s is not a mixture-of-experts model", m->path);
        return NULL;
    }
    kaon_moe_stats *s = calloc(1, sizeof *s);
    const size_t n = (size_t)L * (size_t)E;
    if (s) {
        s->n_layers = L;
        s->n_experts = E;
        s->prev = calloc(n, sizeof *s->prev);
        s->total = calloc(n, sizeof *s->total);
        s->dev = be->ops->alloc(be, n * sizeof(uint32_t));  // zero-filled
    }
    if (!s || !s->prev || !s->total || !s->dev) {
        kaon_moe_stats_free(be, s);
        kaon_set_error("expert statistics: out of memory");
        return NULL;
    }
    return s;
}

void kaon_moe_stats_free(kaon_backend *be, kaon_moe_stats *s) {
    if (!s) return;
    if (s->dev) be->ops->free(be, s->dev);
    free(s->prev);
    free(s->total);
    free(s);
}

int kaon_moe_stats_read(kaon_backend *be, kaon_moe_stats *s) {
    const size_t n = (size_t)s->n_layers * (size_t)s->n_experts;
    uint32_t *now = malloc(n * sizeof *now);
    if (!now) return kaon_set_error("out of memory");
    // Device backends: copy_f32_to_host moves 4-byte words unchanged. Host backends (no such
    // op) hand out host memory.
    if (be->ops->copy_f32_to_host) be->ops->copy_f32_to_host(be, (const float *)(void *)s->dev, n, (float *)(void *)now);
    else memcpy(now, s->dev, n * sizeof *now);
    if (be->ops->status && be->ops->status(be)) {
        free(now);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        s->total[i] += (uint32_t)(now[i] - s->prev[i]);  // wraps at 2^32 between reads are fine
        s->prev[i] = now[i];
    }
    free(now);
    return 0;
}
