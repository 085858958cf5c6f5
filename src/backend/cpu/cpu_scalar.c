// Portable C kernels of the CPU backend: dequantization of every weight format, the 8-bit
// activation quantizer, and the dot products the SIMD tables must agree with. Used on CPUs
// without AVX2 and when KAON_CPU_NO_SIMD=1.
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/err.h"
#include "util/half.h"

int kaon_cpu_kind(kaon_dtype t) {
    switch (t) {
    case KAON_F32: return KAON_KI_F32;
    case KAON_F16: return KAON_KI_F16;
    case KAON_BF16: return KAON_KI_BF16;
    case KAON_Q4_0: return KAON_KI_Q4_0;
    case KAON_Q4_1: return KAON_KI_Q4_1;
    case KAON_Q5_0: return KAON_KI_Q5_0;
    case KAON_Q5_1: return KAON_KI_Q5_1;
    case KAON_Q8_0: return KAON_KI_Q8_0;
    case KAON_IQ4_NL: return KAON_KI_IQ4_NL;
    case KAON_Q2_K: return KAON_KI_Q2_K;
    case KAON_Q3_K: return KAON_KI_Q3_K;
    case KAON_Q4_K: return KAON_KI_Q4_K;
    case KAON_Q5_K: return KAON_KI_Q5_K;
    case KAON_Q6_K: return KAON_KI_Q6_K;
    case KAON_IQ4_XS: return KAON_KI_IQ4_XS;
    default: return -1;
    }
}

// ---- dequantization --------------------------------------------------------------------

int kaon_cpu_dequantize_row(kaon_dtype t, const void *data, int64_t row, int64_t K, float *out) {
    size_t rb = kaon_dtype_row_bytes(t, K);
    if (kaon_cpu_kind(t) < 0 || rb == 0 || K > INT32_MAX)
        return kaon_set_error("cpu: cannot dequantize %s rows of %lld", kaon_dtype_name(t),
                              (long long)K);
    const uint8_t *p = (const uint8_t *)data + (size_t)row * rb;
    int n = (int)K;
    switch (t) {
    case KAON_F32: memcpy(out, p, (size_t)n * 4); break;
    case KAON_F16: {
        const uint16_t *h = (const uint16_t *)p;
        for (int i = 0; i < n; i++) out[i] = kaon_f16_to_f32(h[i]);
        break;
    }
    case KAON_BF16: {
        const uint16_t *h = (const uint16_t *)p;
        for (int i = 0; i < n; i++) out[i] = kaon_bf16_to_f32(h[i]);
        break;
    }
    default: {  // GGUF blocks: 32 values at a time (quant_blocks.h)
        const int be = kaon_dtype_block_elems(t), bb = kaon_dtype_block_bytes(t);
        for (int c = 0; c < n / 32; c++)
            kaon_qb_dequant32(t, p + (size_t)(c * 32 / be) * bb, (c * 32) % be / 32, out + 32 * c);
    }
    }
    return 0;
}

// ---- activation quantization -----------------------------------------------------------

// Per block of 32: d = max|x| / 127, q = round-to-nearest-even(x / d) in [-127, 127]. The SIMD
// quantizers compute exactly the same numbers (same operations in the same precision).
void kaon_cpu_quantize_row_ref(const float *x, kaon_q8_act *a, int row) {
    const int nbp = a->nbp, layout = a->layout;
    int8_t *qs = a->qs + (size_t)row * nbp * 32;
    float *d = a->d + (size_t)row * nbp, *s = a->s + (size_t)row * nbp;
    int16_t *s16 = a->s16 ? a->s16 + (size_t)row * nbp * 2 : NULL;
    for (int b = 0; b < nbp; b++) {
        int8_t q[32] = {0};
        float db = 0.0f;
        if (b < a->nb) {
            const float *xb = x + (size_t)b * 32;
            float amax = 0.0f;
            for (int e = 0; e < 32; e++) {
                float v = fabsf(xb[e]);
                amax = v > amax ? v : amax;
            }
            db = amax / 127.0f;
            float id = db != 0.0f ? 1.0f / db : 0.0f;
            for (int e = 0; e < 32; e++) {
                float v = nearbyintf(xb[e] * id);
                v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
                q[e] = (int8_t)v;
            }
        }
        int sum_lo = 0, sum_hi = 0;
        for (int e = 0; e < 16; e++) {
            sum_lo += q[e];
            sum_hi += q[e + 16];
        }
        for (int e = 0; e < 32; e++) qs[kaon_act_qpos(layout, b, e)] = q[e];
        int dp = kaon_act_dpos(layout, b);
        d[dp] = db;
        s[dp] = db * (float)(sum_lo + sum_hi);
        if (s16) {
            s16[2 * b] = (int16_t)sum_lo;
            s16[2 * b + 1] = (int16_t)sum_hi;
        }
    }
}

// ---- quantized dot products (natural layout) -------------------------------------------
//
// Every format, one way: activation block b (elements 32 b .. 32 b + 31) of a weight row is
// unpacked to its integer levels q (the value a weight has before its float scales), an
// integer scale sc and min m per half of 16, and float factors a, b, so that the block's
// weights are a sc_h q - b m_h, and its share of the dot product with the activations dx x is
//   a (dx sum_h sc_h (q_h . x_h)) - b (dx sum_h m_h sum(x_h)).
// The SIMD kernels compute the same integers with other groupings (offsets folded into sums),
// so they differ from these only by float rounding.
typedef struct wblock {
    int q[32];
    int sc[2], m[2];
    float a, b;
} wblock;

static void unpack(kaon_dtype t, const uint8_t *row, int blk, wblock *w) {
    const int be = kaon_dtype_block_elems(t), bb = kaon_dtype_block_bytes(t);
    const uint8_t *p = row + (size_t)(blk * 32 / be) * bb;  // the (super-)block
    const int c = blk % (be / 32), e0 = 32 * c;              // chunk of 32 inside it
    uint16_t h0, h1;
    memcpy(&h0, p, 2);
    memcpy(&h1, p + 2, 2);
    w->sc[0] = w->sc[1] = 1;
    w->m[0] = w->m[1] = 0;
    w->a = kaon_f16_to_f32(h0);
    w->b = 0.0f;
    switch (t) {
    case KAON_Q4_0:
        for (int e = 0; e < 32; e++) w->q[e] = kaon_qb_nibble(p + 2, e) - 8;
        break;
    case KAON_Q4_1:
    case KAON_Q5_1: {  // d q + m: the min as b = -m with m_h = 1
        const uint32_t qh = t == KAON_Q5_1 ? kaon_qb_u32(p + 4) : 0;
        const uint8_t *qs = p + (t == KAON_Q5_1 ? 8 : 4);
        for (int e = 0; e < 32; e++) w->q[e] = kaon_qb_nibble(qs, e) | (int)(((qh >> e) & 1) << 4);
        w->m[0] = w->m[1] = 1;
        w->b = -kaon_f16_to_f32(h1);
        break;
    }
    case KAON_Q5_0: {
        const uint32_t qh = kaon_qb_u32(p + 2);
        for (int e = 0; e < 32; e++) w->q[e] = (kaon_qb_nibble(p + 6, e) | (int)(((qh >> e) & 1) << 4)) - 16;
        break;
    }
    case KAON_Q8_0:
        for (int e = 0; e < 32; e++) w->q[e] = (int8_t)p[2 + e];
        break;
    case KAON_IQ4_NL:
        for (int e = 0; e < 32; e++) w->q[e] = kaon_iq4nl_value(kaon_qb_nibble(p + 2, e));
        break;
    case KAON_Q2_K: {
        const kaon_block_q2_k *k = (const kaon_block_q2_k *)p;
        for (int e = 0; e < 32; e++) w->q[e] = kaon_q2k_bits(k->qs, e0 + e);
        for (int h = 0; h < 2; h++) {
            w->sc[h] = k->scales[2 * c + h] & 0xF;
            w->m[h] = k->scales[2 * c + h] >> 4;
        }
        w->a = kaon_f16_to_f32(k->d);
        w->b = kaon_f16_to_f32(k->dmin);
        break;
    }
    case KAON_Q3_K: {
        const kaon_block_q3_k *k = (const kaon_block_q3_k *)p;
        for (int e = 0; e < 32; e++) w->q[e] = kaon_q3k_value(k->hmask, k->qs, e0 + e);
        for (int h = 0; h < 2; h++)
            w->sc[h] = kaon_q3k_scale(kaon_qb_u32(k->scales), kaon_qb_u32(k->scales + 4), kaon_qb_u32(k->scales + 8),
                                      2 * c + h);
        w->a = kaon_f16_to_f32(k->d);
        break;
    }
    case KAON_Q4_K:
    case KAON_Q5_K: {
        const uint8_t *qh = p + 16, *qs = t == KAON_Q4_K ? p + 16 : p + 48;
        for (int e = 0; e < 32; e++)
            w->q[e] = t == KAON_Q4_K ? kaon_q4k_value(qs, e0 + e) : kaon_q5k_value(qh, qs, e0 + e);
        uint8_t sc, m;
        kaon_q4k_scale_min(p + 4, c, &sc, &m);
        w->sc[0] = w->sc[1] = sc;
        w->m[0] = w->m[1] = m;
        w->b = kaon_f16_to_f32(h1);
        break;
    }
    case KAON_Q6_K: {
        const kaon_block_q6_k *k = (const kaon_block_q6_k *)p;
        for (int e = 0; e < 32; e++) w->q[e] = kaon_q6k_value(k->ql, k->qh, e0 + e) - 32;
        for (int h = 0; h < 2; h++) w->sc[h] = k->scales[2 * c + h];
        w->a = kaon_f16_to_f32(k->d);
        break;
    }
    case KAON_IQ4_XS: {
        const kaon_block_iq4_xs *k = (const kaon_block_iq4_xs *)p;
        for (int e = 0; e < 32; e++) w->q[e] = kaon_iq4nl_value(kaon_qb_nibble(k->qs + 16 * c, e));
        w->sc[0] = w->sc[1] = kaon_iq4xs_scale(k->scales_h, kaon_qb_u32(k->scales_l), c);
        break;
    }
    default: memset(w, 0, sizeof *w); break;
    }
}

static inline const int8_t *act_row(const kaon_q8_act *a, int r) {
    return a->qs + (size_t)r * a->nbp * 32;
}

static void qdot_any(kaon_dtype t, const void *w, const kaon_q8_act *a, int r0, int nr, float *out) {
    for (int r = 0; r < nr; r++) out[r] = 0.0f;
    wblock wb;
    for (int i = 0; i < a->nb; i++) {
        unpack(t, w, i, &wb);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = act_row(a, r0 + r) + (size_t)i * 32;
            const float dx = a->d[(size_t)(r0 + r) * a->nbp + i];
            int isum = 0, msum = 0;
            for (int h = 0; h < 2; h++) {
                int dot = 0, sum = 0;
                for (int e = 16 * h; e < 16 * h + 16; e++) {
                    dot += wb.q[e] * x[e];
                    sum += x[e];
                }
                isum += wb.sc[h] * dot;
                msum += wb.m[h] * sum;
            }
            out[r] += wb.a * (dx * (float)isum) - wb.b * (dx * (float)msum);
        }
    }
}

#define QDOT(T) \
    static void qdot_##T(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) { \
        qdot_any(KAON_##T, w, a, r0, nr, out); \
    }
QDOT(Q4_0)
QDOT(Q4_1)
QDOT(Q5_0)
QDOT(Q5_1)
QDOT(Q8_0)
QDOT(IQ4_NL)
QDOT(Q2_K)
QDOT(Q3_K)
QDOT(Q4_K)
QDOT(Q5_K)
QDOT(Q6_K)
QDOT(IQ4_XS)
#undef QDOT

// ---- float weights ---------------------------------------------------------------------

static void fdot_f32(const void *w, int K, const float *x, size_t ldx, int nr, float *out) {
    const float *wf = w;
    for (int r = 0; r < nr; r++) {
        const float *xr = x + (size_t)r * ldx;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc += wf[k] * xr[k];
        out[r] = acc;
    }
}

static void fdot_f16(const void *w, int K, const float *x, size_t ldx, int nr, float *out) {
    const uint16_t *wh = w;
    for (int r = 0; r < nr; r++) {
        const float *xr = x + (size_t)r * ldx;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc += kaon_f16_to_f32(wh[k]) * xr[k];
        out[r] = acc;
    }
}

static void fdot_bf16(const void *w, int K, const float *x, size_t ldx, int nr, float *out) {
    const uint16_t *wh = w;
    for (int r = 0; r < nr; r++) {
        const float *xr = x + (size_t)r * ldx;
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc += kaon_bf16_to_f32(wh[k]) * xr[k];
        out[r] = acc;
    }
}

// ---- attention and element-wise helpers ------------------------------------------------

static float dot_f32(const float *a, const float *b, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void attn_scores(const float *q, const float *k, size_t kstride, int n, int hd, float scale,
                        float *scores) {
    for (int j = 0; j < n; j++) scores[j] = scale * dot_f32(q, k + (size_t)j * kstride, hd);
}

static void attn_accum(float *acc, const float *v, size_t vstride, const float *p, int n, int hd) {
    for (int j = 0; j < n; j++) {
        const float *vj = v + (size_t)j * vstride;
        for (int i = 0; i < hd; i++) acc[i] += p[j] * vj[i];
    }
}

static float exp_sum(float *s, int n, float mx) {
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

static void silu_mul(const float *g, const float *u, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// 0.5 x (1 + tanh(y)) = x sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3): no cancellation
// where tanh(y) is near -1, and exp's overflow to inf gives the right limit 0.
static void gelu_tanh_mul(const float *g, const float *u, float *out, int n) {
    for (int i = 0; i < n; i++) {
        const float x = g[i], y2 = 1.5957691216057308f * (x + 0.044715f * x * x * x);  // 2y
        out[i] = x / (1.0f + expf(-y2)) * u[i];
    }
}

static const kaon_cpu_kernels scalar_kernels = {
    .name = "scalar",
    .max_rows = 4,
    .qdot = {[KAON_KI_Q4_0] = qdot_Q4_0, [KAON_KI_Q4_1] = qdot_Q4_1, [KAON_KI_Q5_0] = qdot_Q5_0,
             [KAON_KI_Q5_1] = qdot_Q5_1, [KAON_KI_Q8_0] = qdot_Q8_0, [KAON_KI_IQ4_NL] = qdot_IQ4_NL,
             [KAON_KI_Q2_K] = qdot_Q2_K, [KAON_KI_Q3_K] = qdot_Q3_K, [KAON_KI_Q4_K] = qdot_Q4_K,
             [KAON_KI_Q5_K] = qdot_Q5_K, [KAON_KI_Q6_K] = qdot_Q6_K, [KAON_KI_IQ4_XS] = qdot_IQ4_XS},
    .fdot = {[KAON_KI_F32] = fdot_f32, [KAON_KI_F16] = fdot_f16, [KAON_KI_BF16] = fdot_bf16},
    .layout = {0},
    .quantize_row = kaon_cpu_quantize_row_ref,
    .dot_f32 = dot_f32,
    .attn_scores = attn_scores,
    .attn_accum = attn_accum,
    .exp_sum = exp_sum,
    .silu_mul = silu_mul,
    .gelu_tanh_mul = gelu_tanh_mul,
};

const kaon_cpu_kernels *kaon_cpu_kernels_scalar(void) { return &scalar_kernels; }
