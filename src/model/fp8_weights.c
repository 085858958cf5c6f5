// FP8 and INT8 weights' scale companions from a checkpoint or for dummy models (fp8_weights.h).
#include "model/fp8_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/quant_config.h"
#include "util/err.h"
#include "util/fp8.h"
#include "util/half.h"

static bool is_fp8_format(kaon_quant_format f) {
    return f == KAON_QFMT_FP8_BLOCK || f == KAON_QFMT_FP8_CHANNEL || f == KAON_QFMT_FP8_TENSOR;
}

// Per-channel scales: FP8 channel, or INT8 with the channel strategy.
static bool per_channel(const kaon_quant_config *q) {
    return q->format == KAON_QFMT_FP8_CHANNEL || (q->format == KAON_QFMT_INT && strcmp(q->w_strategy, "tensor"));
}

// The scale grid of an [M, K] weight: block rows and columns, and the grid's shape.
static void grid(const kaon_quant_config *q, int64_t M, int64_t K, int64_t b[2], int64_t g[2]) {
    b[0] = q->format == KAON_QFMT_FP8_BLOCK ? q->block[0] : per_channel(q) ? 1 : M;
    b[1] = q->format == KAON_QFMT_FP8_BLOCK ? q->block[1] : K;
    g[0] = (M + b[0] - 1) / b[0];
    g[1] = (K + b[1] - 1) / b[1];
}

// The activation quantization the format's reference applies (the CPU kernel may leave the
// block kind off: KAON_FP8_ACT, cpu_fp8.c).
static kaon_act_quant act_of(const kaon_quant_config *q) {
    if (q->format == KAON_QFMT_FP8_BLOCK) return KAON_ACTQ_GROUP;
    if (q->act == KAON_QACT_STATIC) return KAON_ACTQ_STATIC;
    if (q->act == KAON_QACT_DYNAMIC) return !strcmp(q->act_strategy, "tensor") ? KAON_ACTQ_TENSOR : KAON_ACTQ_TOKEN;
    return KAON_ACTQ_NONE;
}

static const char *shape_str(const kaon_tensor *t, char *buf, size_t cap) {
    int o = snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < (int)cap - 24; i++)
        o += snprintf(buf + o, cap - (size_t)o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    snprintf(buf + o, cap - (size_t)o, "]");
    return buf;
}

// The stored scales as kaon's f32 grid g (copied: bf16 and the [out] / [] shapes of
// compressed-tensors and ModelOpt become [g0, g1] f32).
static int read_scales(kaon_model *m, const char *sname, const kaon_tensor *sc, const int64_t g[2],
                       const char *wname, const int64_t wshape[2], const int64_t b[2], kaon_tensor *out) {
    const int64_t n = kaon_tensor_numel(sc);
    const bool block = m->quant.format == KAON_QFMT_FP8_BLOCK;
    const bool ok = block ? sc->ndim == 2 && sc->shape[0] == g[0] && sc->shape[1] == g[1]
                          : n == g[0] * g[1] && sc->ndim <= 2 && (sc->ndim < 2 || sc->shape[1] == 1);
    char got[64];
    if (!ok)
        return kaon_set_error("%s: scale '%s' has shape %s (rank %d), expected [%lld, %lld] for a [%lld, %lld] "
                              "weight in %lldx%lld blocks", m->path, sname, shape_str(sc, got, sizeof got), sc->ndim,
                              (long long)g[0], (long long)g[1], (long long)wshape[0], (long long)wshape[1],
                              (long long)b[0], (long long)b[1]);
    if (sc->dtype != KAON_F32 && sc->dtype != KAON_BF16 && sc->dtype != KAON_F16)
        return kaon_set_error("%s: scale '%s' is %s; expected F32 (or BF16/F16)", m->path, sname,
                              kaon_dtype_name(sc->dtype));
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v || kaon_model_own(m, v)) return kaon_set_error("out of memory");
    for (int64_t i = 0; i < n; i++) v[i] = kaon_tensor_f32_at(sc, i);
    for (int64_t i = 0; i < n; i++)
        if (!(v[i] > 0.0f) || !isfinite(v[i]))
            return kaon_set_error("%s: scale '%s'[%lld] = %g is not a positive number (FP8 weight '%s')", m->path,
                                  sname, (long long)i, (double)v[i], wname);
    memset(out, 0, sizeof *out);
    out->dtype = KAON_F32;
    out->ndim = 2;
    out->shape[0] = g[0];
    out->shape[1] = g[1];
    out->data = v;
    out->nbytes = sizeof(float) * (size_t)n;
    return 0;
}

static int read_input_scale(kaon_model *m, const char *module, kaon_linear *l) {
    char name[300];
    snprintf(name, sizeof name, "%s.input_scale", module);
    kaon_tensor t;
    if (kaon_model_find_tensor(m, name, &t)) return -1;
    if (!t.data)
        return kaon_set_error("%s: static activations need '%s' (the quantization config says static)", m->path, name);
    char got[64];
    if (kaon_tensor_numel(&t) != 1 || (t.dtype != KAON_F32 && t.dtype != KAON_BF16 && t.dtype != KAON_F16))
        return kaon_set_error("%s: '%s' is %s %s; expected one F32 value", m->path, name, kaon_dtype_name(t.dtype),
                              shape_str(&t, got, sizeof got));
    l->act_scale = kaon_tensor_f32_at(&t, 0);
    if (!(l->act_scale > 0.0f) || !isfinite(l->act_scale))
        return kaon_set_error("%s: '%s' = %g is not a positive number", m->path, name, (double)l->act_scale);
    return 0;
}

// Finds, checks and attaches the scales (and a static input scale) of 8-bit weight name, whose
// module the quantization config covers; dt / fmt: "F8_E4M3" / "FP8" or "I8" / "INT8" for messages.
static int attach_scales(kaon_model *m, kaon_linear *l, const char *name, const char *dt, const char *fmt) {
    const kaon_quant_config *q = &m->quant;
    const kaon_tensor *t = &l->w;
    char module[256], sname[300];
    const size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") || t->ndim != 2)
        return kaon_set_error("%s: %s tensor '%s' is not a module's 2-D .weight", m->path, dt, name);
    snprintf(module, sizeof module, "%.*s", (int)(n - 7), name);
    // The embedding op reads rows of the table alone, without its scales (no checkpoint kaon
    // knows quantizes it).
    if (strstr(module, "embed_tokens"))
        return kaon_set_error("%s: tensor '%s': %s token embeddings are not supported", m->path, name, fmt);
    if (!kaon_quant_module_quantized(q, module))
        return kaon_set_error("%s: tensor '%s' is %s, but the quantization_config's ignore list "
                              "leaves '%s' unquantized", m->path, name, dt, module);
    const bool deepseek = q->method == KAON_QUANT_FP8;
    snprintf(sname, sizeof sname, "%s.%s", module, deepseek ? "weight_scale_inv" : "weight_scale");
    kaon_tensor sc;
    if (kaon_model_find_tensor(m, sname, &sc)) return -1;
    if (!sc.data) return kaon_set_error("%s: %s weight '%s' has no scale tensor '%s'", m->path, fmt, name, sname);
    int64_t b[2], g[2];
    grid(q, t->shape[0], t->shape[1], b, g);
    if (read_scales(m, sname, &sc, g, name, t->shape, b, &l->scale)) return -1;
    l->scale_block[0] = (int32_t)b[0];
    l->scale_block[1] = (int32_t)b[1];
    l->act_quant = act_of(q);
    return l->act_quant == KAON_ACTQ_STATIC ? read_input_scale(m, module, l) : 0;
}

int kaon_fp8_attach(kaon_model *m, kaon_linear *l, const char *name) {
    if (!is_fp8_format(m->quant.format))
        return kaon_set_error("%s: tensor '%s' is F8_E4M3, but config.json has no fp8 block quantization_config "
                              "(weight_block_size) nor an fp8 per-channel/per-tensor one", m->path, name);
    return attach_scales(m, l, name, "F8_E4M3", "FP8");
}

int kaon_int8_attach(kaon_model *m, kaon_linear *l, const char *name) {
    if (!kaon_quant_is_int8(&m->quant))
        return kaon_set_error("%s: tensor '%s' is I8, but config.json has no 8-bit int-quantized "
                              "quantization_config (compressed-tensors, per channel or tensor)", m->path, name);
    return attach_scales(m, l, name, "I8", "INT8");
}

// Placeholder data of dummy scales: marks them present; never read before kaon_fp8_dummy_fill.
static const float dummy_scale[4];

void kaon_fp8_dummy_mark(const kaon_model *m, kaon_linear *l, const char *module) {
    const kaon_quant_config *q = &m->quant;
    // DeepSeek's checkpoints keep the embedding and the head in bf16 (FORMATS-2.md §4).
    const bool int8 = kaon_quant_is_int8(q);
    if ((!is_fp8_format(q->format) && !int8) || l->w.ndim != 2 || strstr(module, "embed_tokens") ||
        strstr(module, "lm_head") || !kaon_quant_module_quantized(q, module))
        return;
    int64_t b[2], g[2];
    grid(q, l->w.shape[0], l->w.shape[1], b, g);
    l->w.dtype = int8 ? KAON_I8 : KAON_FP8_E4M3;
    l->w.nbytes = (size_t)l->w.shape[0] * (size_t)l->w.shape[1];
    memset(&l->scale, 0, sizeof l->scale);
    l->scale.dtype = KAON_F32;
    l->scale.ndim = 2;
    l->scale.shape[0] = g[0];
    l->scale.shape[1] = g[1];
    l->scale.data = (void *)dummy_scale;
    l->scale.nbytes = sizeof(float) * (size_t)(g[0] * g[1]);
    l->scale_block[0] = (int32_t)b[0];
    l->scale_block[1] = (int32_t)b[1];
    l->act_quant = act_of(q);
    l->act_scale = q->act == KAON_QACT_STATIC ? 0.02f : 0.0f;  // |x| up to ~9 after a norm
}

static uint64_t next(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s) { return (float)((double)(next(s) >> 11) * 0x1.0p-53); }  // [0, 1)

int kaon_fp8_dummy_fill(kaon_model *m, kaon_linear *l, uint64_t seed) {
    const int64_t M = l->w.shape[0], K = l->w.shape[1], ns = kaon_tensor_numel(&l->scale);
    uint8_t *codes = malloc((size_t)(M * K));
    if (!codes || kaon_model_own(m, codes)) return kaon_set_error("out of memory");  // own frees on failure
    float *s = malloc(sizeof(float) * (size_t)ns);
    if (!s || kaon_model_own(m, s)) return kaon_set_error("out of memory");
    uint64_t st = seed;
    const bool int8 = l->w.dtype == KAON_I8;
    const float qmax = int8 ? 127.0f : 448.0f;
    for (int64_t i = 0; i < M * K; i++) {
        const float v = (2.0f * uniform(&st) - 1.0f) * qmax;
        codes[i] = int8 ? (uint8_t)(int8_t)lrintf(v) : kaon_f32_to_e4m3(v);
    }
    const float a = 1.0f / sqrtf((float)K) / qmax;
    for (int64_t i = 0; i < ns; i++) s[i] = a * (0.5f + uniform(&st));
    l->w.data = codes;
    l->scale.data = s;
    return 0;
}
