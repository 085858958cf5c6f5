// --load-format dummy on a host backend (kaon_weights_fill_host, weights.h): the placeholders
// of kaon_weights_load_dummy become random values in the model's own memory, as a device
// backend's fill_dummy makes them on the device: offset + uniform(-scale, scale), scale 0.1
// for vectors and 1/sqrt(in) for matrices, norms near 1; FP8 matrices get codes and scales
// (fp8_weights.c), INT4 ones nibbles, scales and zeros (int4_weights.c). Experts get one buffer per view (the host op reads only the views).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/arch.h"
#include "model/fp8_weights.h"
#include "model/int4_weights.h"
#include "model/model.h"
#include "model/moe.h"
#include "util/err.h"
#include "util/half.h"

#define HOST_SEED 0x686f737400000000ull

static uint64_t next(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// t (any shape) gets bf16 values, or f32 ones when t is F32.
static int fill_float(kaon_model *m, kaon_tensor *t, uint64_t seed, float offset) {
    const int64_t n = kaon_tensor_numel(t);
    const float scale = t->ndim <= 1 ? 0.1f : 1.0f / sqrtf((float)t->shape[t->ndim - 1]);
    const bool f32 = t->dtype == KAON_F32;
    const size_t bytes = (size_t)n * (f32 ? 4 : 2);
    void *p = malloc(bytes ? bytes : 1);
    if (!p || kaon_model_own(m, p)) return kaon_set_error("out of memory");
    uint64_t st = seed;
    for (int64_t i = 0; i < n; i++) {
        const float v = offset + scale * (float)((double)(next(&st) >> 11) * 0x1.0p-52 - 1.0);
        if (f32) ((float *)p)[i] = v;
        else ((uint16_t *)p)[i] = kaon_f32_to_bf16(v);
    }
    if (!f32) t->dtype = KAON_BF16;
    t->data = p;
    t->nbytes = bytes;
    return 0;
}

static int fill_linear(kaon_model *m, kaon_linear *l, uint64_t seed) {
    if (!l->w.data) return 0;
    if (l->w.dtype == KAON_FP8_E4M3 || l->w.dtype == KAON_I8) return kaon_fp8_dummy_fill(m, l, seed);
    if (l->w.dtype == KAON_I4) return kaon_int4_dummy_fill(m, l, seed);
    return fill_float(m, &l->w, seed, 0.0f);
}

static int fill_moe(kaon_model *m, kaon_moe_layer *L, uint64_t seed) {
    const int E = L->w.n_experts;
    int rc = fill_linear(m, &L->router, seed) || fill_linear(m, &L->shared_gate_inp, seed + 1);
    for (int k = 0; k < 3 && !rc; k++) rc = fill_linear(m, &L->shared[k], seed + 2 + (uint64_t)k);
    if (!rc && L->score_bias.data) rc = fill_float(m, &L->score_bias, seed + 5, 0.0f);
    for (int v = 0; v < 3 * E && !rc; v++) rc = fill_linear(m, &L->views[v], seed + 8 + (uint64_t)v);
    if (!rc) kaon_moe_bind(L, &m->cfg);
    return rc ? -1 : 0;
}

int kaon_weights_fill_host(kaon_model *m) {
    if (m->dummy_filled) return 0;
    const kaon_arch_ops *a = m->arch;
    for (int i = 0; i < a->n_weights; i++) {
        const kaon_weight_spec *s = &a->weights[i];
        const int rows = s->per_layer ? m->cfg.n_layers : 1;
        for (int l = 0; l < rows; l++) {
            const uint64_t seed = HOST_SEED + ((uint64_t)i << 24) + (uint64_t)l;
            if (s->flags & KAON_W_EXPERTS) {
                if (m->w.moe && m->w.layer_moe[l] && fill_moe(m, &m->w.moe[l], seed << 8)) return -1;
                continue;
            }
            kaon_tensor *t = kaon_weight_slot(m, &m->w, s, l);
            if (!t->data || (s->flags & KAON_W_HOST)) continue;
            if (s->flags & KAON_W_F32) t->dtype = KAON_F32;  // as the file loader widens them
            const int rc = s->ndim == 2 ? fill_linear(m, (kaon_linear *)t, seed)
                                        : fill_float(m, t, seed, (s->flags & KAON_W_NORM) ? 1.0f : 0.0f);
            if (rc) return -1;
        }
    }
    m->dummy_filled = true;
    return 0;
}
