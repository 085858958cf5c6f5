// 4-bit checkpoints' tensors -> kaon's INT4 layout (backend/linear.h), one Linear at a time.
// The names and shapes each producer writes: shared/notes/FORMATS-2.md §5-6.
#include "model/int4_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/int4_unpack.h"
#include "model/model.h"
#include "util/err.h"

typedef struct int4_src {
    kaon_model *m;
    const char *module;
    kaon_tensor qw, qz, sc, gidx, shape;  // packed weight, packed zeros, scales, g_idx, weight_shape
} int4_src;

static int find(int4_src *s, const char *suffix, kaon_tensor *t) {
    char name[320];
    snprintf(name, sizeof name, "%s.%s", s->module, suffix);
    return kaon_model_find_tensor(s->m, name, t);
}

// A tensor present with this dtype set and 2-D shape [r, c] (c < 0: any rank-1 [r]).
static int expect(const int4_src *s, const char *suffix, const kaon_tensor *t, bool floats, int64_t r, int64_t c) {
    const bool dt_ok = floats ? t->dtype == KAON_F32 || t->dtype == KAON_F16 || t->dtype == KAON_BF16
                              : t->dtype == KAON_I32;
    if (!t->data) return kaon_set_error("%s: INT4 weight '%s' has no tensor '%s.%s'", s->m->path, s->module,
                                        s->module, suffix);
    if (!dt_ok)
        return kaon_set_error("%s: tensor '%s.%s' is %s; expected %s", s->m->path, s->module, suffix,
                              kaon_dtype_name(t->dtype), floats ? "F16, BF16 or F32" : "I32");
    const bool shape_ok = c < 0 ? t->ndim == 1 && t->shape[0] == r : t->ndim == 2 && t->shape[0] == r && t->shape[1] == c;
    if (!shape_ok)
        return kaon_set_error("%s: tensor '%s.%s' has shape [%lld, %lld] (rank %d), expected [%lld, %lld]", s->m->path,
                              s->module, suffix, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                              t->ndim, (long long)r, (long long)(c < 0 ? 0 : c));
    return 0;
}

static void *owned(kaon_model *m, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        kaon_set_error("out of memory");
        return NULL;
    }
    return kaon_model_own(m, p) ? NULL : p;
}

// Scales of any float dtype as f32 (a temporary the caller frees).
static float *scales_f32(const kaon_tensor *t) {
    const int64_t n = kaon_tensor_numel(t);
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!f) return NULL;
    for (int64_t i = 0; i < n; i++) f[i] = kaon_tensor_f32_at(t, i);
    return f;
}

static kaon_tensor tensor2(kaon_dtype dt, int64_t r, int64_t c, void *data, size_t bytes) {
    kaon_tensor t = {.dtype = dt, .ndim = 2, .shape = {r, c}, .data = data, .nbytes = bytes};
    return t;
}

// Reads the tensors of m->quant's method and checks their shapes for [N, K] in groups of gs.
// 0 with s->qw.data NULL when the module has none.
static int read_src(int4_src *s, int64_t N, int64_t K, int64_t gs) {
    const kaon_quant_method meth = s->m->quant.method;
    const int64_t G = (K + gs - 1) / gs;
    kaon_tensor probe;
    if (find(s, meth == KAON_QUANT_COMPRESSED_TENSORS ? "weight_packed" : "qweight", &probe)) return -1;
    if (!probe.data) return 0;
    // AWQ/GPTQ words hold 8 columns or rows; compressed-tensors pads, but the layout's bytes
    // hold two columns.
    if ((meth != KAON_QUANT_COMPRESSED_TENSORS && (N % 8 || K % 8)) || K % 2 || (meth == KAON_QUANT_AWQ && K % gs))
        return kaon_set_error("%s: INT4 weight '%s' [%lld, %lld] is not whole groups of 8 (group %lld)", s->m->path,
                              s->module, (long long)N, (long long)K, (long long)gs);
    if (meth == KAON_QUANT_COMPRESSED_TENSORS) {
        if (find(s, "weight_packed", &s->qw)) return -1;
        if (!s->qw.data) return 0;
        if (find(s, "weight_scale", &s->sc) || find(s, "weight_zero_point", &s->qz) || find(s, "weight_shape", &s->shape) ||
            find(s, "weight_g_idx", &s->gidx))  // actorder
            return -1;
        if (s->gidx.data && expect(s, "weight_g_idx", &s->gidx, false, K, -1)) return -1;
        if (expect(s, "weight_packed", &s->qw, false, N, (K + 7) / 8) || expect(s, "weight_scale", &s->sc, true, N, G))
            return -1;
        if (!s->m->quant.symmetric && expect(s, "weight_zero_point", &s->qz, false, (N + 7) / 8, G)) return -1;
        if (s->m->quant.symmetric) s->qz.data = NULL;
        if (s->shape.data) {  // the original [N, K] (int64 from torch.tensor(shape), or int32)
            const bool i64 = s->shape.dtype == KAON_I64;
            const bool ok = (i64 || s->shape.dtype == KAON_I32) && kaon_tensor_numel(&s->shape) == 2;
            if (!ok || kaon_tensor_int_at(&s->shape, 0) != N || kaon_tensor_int_at(&s->shape, 1) != K)
                return kaon_set_error("%s: tensor '%s.weight_shape' must be I32/I64 [%lld, %lld]", s->m->path,
                                      s->module, (long long)N, (long long)K);
        }
        return 0;
    }
    if (find(s, "qweight", &s->qw)) return -1;
    if (!s->qw.data) return 0;
    if (find(s, "qzeros", &s->qz) || find(s, "scales", &s->sc) || find(s, "g_idx", &s->gidx)) return -1;
    if (meth == KAON_QUANT_AWQ)
        return expect(s, "qweight", &s->qw, false, K, N / 8) || expect(s, "qzeros", &s->qz, false, K / gs, N / 8) ||
                       expect(s, "scales", &s->sc, true, K / gs, N)
                   ? -1
                   : 0;
    if (expect(s, "qweight", &s->qw, false, K / 8, N) || expect(s, "qzeros", &s->qz, false, G, N / 8) ||
        expect(s, "scales", &s->sc, true, G, N) || (s->gidx.data && expect(s, "g_idx", &s->gidx, false, K, -1)))
        return -1;
    return 0;
}

// An I32 tensor's words, aligned: the mapping itself when it is, else a copy in *copy (freed
// by the caller; NULL data stays NULL).
static const int32_t *words(const kaon_tensor *t, int32_t **copy) {
    *copy = NULL;
    if (!t->data || ((uintptr_t)t->data & 3) == 0) return t->data;
    *copy = malloc(t->nbytes ? t->nbytes : 1);
    if (*copy) memcpy(*copy, t->data, t->nbytes);
    return *copy;
}

int kaon_int4_load(kaon_model *m, const char *module, int64_t N, int64_t K, kaon_linear *l) {
    const kaon_quant_config *q = &m->quant;
    const int64_t gs = q->group_size > 0 ? q->group_size : K, G = (K + gs - 1) / gs;
    int4_src s = {.m = m, .module = module};
    if (read_src(&s, N, K, gs)) return -1;
    if (!s.qw.data) return 0;
    if (!kaon_quant_module_quantized(q, module))
        return kaon_set_error("%s: '%s' is stored as INT4, but the quantization_config's ignore list leaves it "
                              "unquantized", m->path, module);
    uint8_t *w = owned(m, (size_t)(N * K / 2));
    float *scale = owned(m, sizeof(float) * (size_t)(N * G)), *zero = malloc(sizeof(float) * (size_t)(N * G));
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)K);
    float *sc = scales_f32(&s.sc);
    int32_t *cqw, *cqz, *cgi;
    const int32_t *qw = words(&s.qw, &cqw), *qz = words(&s.qz, &cqz), *gidx = words(&s.gidx, &cgi);
    const bool have = w && scale && zero && perm && sc && qw && (qz || !s.qz.data) && (gidx || !s.gidx.data);
    if (!have && w && scale) kaon_set_error("out of memory");  // (owned() reports its own)
    int rc = -1;
    if (have && q->method == KAON_QUANT_AWQ) {
        kaon_int4_from_awq(qw, qz, sc, N, K, gs, w, scale, zero);
        rc = 0;
    } else if (have && q->method == KAON_QUANT_GPTQ) {
        rc = kaon_int4_from_gptq(qw, qz, sc, gidx, N, K, gs, strcmp(q->int_format, "gptq_v2") != 0,
                                 w, scale, zero, perm);
    } else if (have) {
        rc = kaon_int4_from_ct(qw, sc, qz, gidx, N, K, gs, w, scale, zero, perm);
    }
    if (have && rc < 0)
        kaon_set_error("%s: tensor '%s.%s' does not give every group %lld columns", m->path, module,
                       q->method == KAON_QUANT_GPTQ ? "g_idx" : "weight_g_idx", (long long)gs);
    free(sc);
    free(cqw);
    free(cqz);
    free(cgi);
    if (rc < 0) {
        free(zero);
        free(perm);
        return -1;
    }
    l->w = (kaon_tensor){.dtype = KAON_I4, .ndim = 2, .shape = {N, K}, .data = w, .nbytes = (size_t)(N * K / 2)};
    l->scale = tensor2(KAON_F32, N, G, scale, sizeof(float) * (size_t)(N * G));
    l->scale_block[0] = 1;
    l->scale_block[1] = (int32_t)gs;
    if (!kaon_int4_zero_is_default(zero, N * G)) {
        if (kaon_model_own(m, zero)) return -1;
        l->zero = tensor2(KAON_F32, N, G, zero, sizeof(float) * (size_t)(N * G));
    } else {
        free(zero);
    }
    if (rc == 1) {
        if (kaon_model_own(m, perm)) return -1;
        l->perm = (kaon_tensor){.dtype = KAON_I32, .ndim = 1, .shape = {K}, .data = perm, .nbytes = sizeof(int32_t) * (size_t)K};
    } else {
        free(perm);
    }
    return 0;
}

// ---- dummy INT4 layers (--load-format dummy) ------------------------------------------------------

// Placeholder data of dummy scales and zeros: marks them present; never read before the fill.
static const float dummy_companion[4];

void kaon_int4_dummy_mark(const kaon_model *m, kaon_linear *l, const char *module) {
    const kaon_quant_config *q = &m->quant;
    // 4-bit checkpoints keep the embedding and the head in bf16 (AutoAWQ, GPTQ, llm-compressor).
    if (q->format != KAON_QFMT_INT || q->bits != 4 || l->w.ndim != 2 || l->w.shape[1] % 2 ||
        strstr(module, "embed_tokens") || strstr(module, "lm_head") || !kaon_quant_module_quantized(q, module))
        return;
    const int64_t M = l->w.shape[0], K = l->w.shape[1], g = q->group_size > 0 ? q->group_size : K;
    const int64_t G = (K + g - 1) / g;
    l->w.dtype = KAON_I4;
    l->w.nbytes = (size_t)M * (size_t)K / 2;
    kaon_tensor s = {0};
    s.dtype = KAON_F32;
    s.ndim = 2;
    s.shape[0] = M;
    s.shape[1] = G;
    s.data = (void *)dummy_companion;
    s.nbytes = sizeof(float) * (size_t)(M * G);
    l->scale = s;
    memset(&l->zero, 0, sizeof l->zero);
    if (!q->symmetric) l->zero = s;
    memset(&l->perm, 0, sizeof l->perm);
    l->scale_block[0] = 1;
    l->scale_block[1] = (int32_t)g;
}

static uint64_t dummy_next(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int kaon_int4_dummy_fill(kaon_model *m, kaon_linear *l, uint64_t seed) {
    const int64_t M = l->w.shape[0], K = l->w.shape[1], ns = kaon_tensor_numel(&l->scale);
    const size_t wb = (size_t)M * (size_t)K / 2;
    uint8_t *w = malloc(wb ? wb : 1);
    if (!w || kaon_model_own(m, w)) return kaon_set_error("out of memory");  // own frees on failure
    float *s = malloc(sizeof(float) * (size_t)ns * 2);
    if (!s || kaon_model_own(m, s)) return kaon_set_error("out of memory");
    uint64_t st = seed;
    for (size_t i = 0; i < wb; i++) w[i] = (uint8_t)(dummy_next(&st) >> 56);
    const float a = 1.0f / sqrtf((float)K) / 8.0f;
    for (int64_t i = 0; i < ns; i++) {
        const uint64_t r = dummy_next(&st);
        s[i] = a * (0.5f + (float)((double)(r >> 11) * 0x1.0p-53));
        s[ns + i] = (float)(r & 15);
    }
    l->w.data = w;
    l->scale.data = s;
    if (l->zero.data) l->zero.data = s + ns;
    return 0;
}
