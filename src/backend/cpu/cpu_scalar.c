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
    case KAON_Q8_0: return KAON_KI_Q8_0;
    case KAON_Q4_K: return KAON_KI_Q4_K;
    case KAON_Q6_K: return KAON_KI_Q6_K;
    default: return -1;
    }
}

// ---- dequantization --------------------------------------------------------------------

static void deq_q4_0(const kaon_block_q4_0 *b, int nb, float *y) {
    for (int i = 0; i < nb; i++, y += 32) {
        float d = kaon_f16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const kaon_block_q4_1 *b, int nb, float *y) {
    for (int i = 0; i < nb; i++, y += 32) {
        float d = kaon_f16_to_f32(b[i].d), m = kaon_f16_to_f32(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void deq_q8_0(const kaon_block_q8_0 *b, int nb, float *y) {
    for (int i = 0; i < nb; i++, y += 32) {
        float d = kaon_f16_to_f32(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void deq_q4_k(const kaon_block_q4_k *b, int nb, float *y) {
    for (int i = 0; i < nb; i++) {
        float d = kaon_f16_to_f32(b[i].d), dmin = kaon_f16_to_f32(b[i].dmin);
        for (int j = 0; j < 8; j++, y += 32) {
            uint8_t sc, m;
            kaon_q4k_scale_min(b[i].scales, j, &sc, &m);
            const uint8_t *q = b[i].qs + (j >> 1) * 32;
            float ds = d * sc, dm = dmin * m;
            for (int l = 0; l < 32; l++) {
                int v = (j & 1) ? (q[l] >> 4) : (q[l] & 0xF);
                y[l] = ds * (float)v - dm;
            }
        }
    }
}

// Q6_K value l (< 32) of the 32-element chunk j (< 8) of a super-block, in 0..63.
static inline int q6k_raw(const kaon_block_q6_k *b, int j, int l) {
    const uint8_t *ql = b->ql + 64 * (j >> 2), *qh = b->qh + 32 * (j >> 2);
    switch (j & 3) {
    case 0: return (ql[l] & 0xF) | ((qh[l] & 3) << 4);
    case 1: return (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
    case 2: return (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
    default: return (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
    }
}

static void deq_q6_k(const kaon_block_q6_k *b, int nb, float *y) {
    for (int i = 0; i < nb; i++) {
        float d = kaon_f16_to_f32(b[i].d);
        for (int j = 0; j < 8; j++, y += 32)
            for (int l = 0; l < 32; l++)
                y[l] = d * (float)b[i].scales[2 * j + (l >> 4)] * (float)(q6k_raw(&b[i], j, l) - 32);
    }
}

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
    case KAON_Q4_0: deq_q4_0((const kaon_block_q4_0 *)p, n / 32, out); break;
    case KAON_Q4_1: deq_q4_1((const kaon_block_q4_1 *)p, n / 32, out); break;
    case KAON_Q8_0: deq_q8_0((const kaon_block_q8_0 *)p, n / 32, out); break;
    case KAON_Q4_K: deq_q4_k((const kaon_block_q4_k *)p, n / 256, out); break;
    case KAON_Q6_K: deq_q6_k((const kaon_block_q6_k *)p, n / 256, out); break;
    default: return -1;
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

static inline const int8_t *act_row(const kaon_q8_act *a, int r) {
    return a->qs + (size_t)r * a->nbp * 32;
}

static void qdot_q4_0(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) {
    const kaon_block_q4_0 *b = w;
    for (int r = 0; r < nr; r++) {
        const int8_t *x = act_row(a, r0 + r);
        const float *d = a->d + (size_t)(r0 + r) * a->nbp, *s = a->s + (size_t)(r0 + r) * a->nbp;
        float acc = 0.0f;
        for (int i = 0; i < a->nb; i++, x += 32) {
            int isum = 0;
            for (int j = 0; j < 16; j++) isum += (b[i].qs[j] & 0xF) * x[j] + (b[i].qs[j] >> 4) * x[j + 16];
            float dw = kaon_f16_to_f32(b[i].d);
            acc += dw * (d[i] * (float)isum) - 8.0f * dw * s[i];
        }
        out[r] = acc;
    }
}

static void qdot_q4_1(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) {
    const kaon_block_q4_1 *b = w;
    for (int r = 0; r < nr; r++) {
        const int8_t *x = act_row(a, r0 + r);
        const float *d = a->d + (size_t)(r0 + r) * a->nbp, *s = a->s + (size_t)(r0 + r) * a->nbp;
        float acc = 0.0f;
        for (int i = 0; i < a->nb; i++, x += 32) {
            int isum = 0;
            for (int j = 0; j < 16; j++) isum += (b[i].qs[j] & 0xF) * x[j] + (b[i].qs[j] >> 4) * x[j + 16];
            acc += kaon_f16_to_f32(b[i].d) * (d[i] * (float)isum) + kaon_f16_to_f32(b[i].m) * s[i];
        }
        out[r] = acc;
    }
}

static void qdot_q8_0(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) {
    const kaon_block_q8_0 *b = w;
    for (int r = 0; r < nr; r++) {
        const int8_t *x = act_row(a, r0 + r);
        const float *d = a->d + (size_t)(r0 + r) * a->nbp;
        float acc = 0.0f;
        for (int i = 0; i < a->nb; i++, x += 32) {
            int isum = 0;
            for (int j = 0; j < 32; j++) isum += b[i].qs[j] * x[j];
            acc += kaon_f16_to_f32(b[i].d) * (d[i] * (float)isum);
        }
        out[r] = acc;
    }
}

static void qdot_q4_k(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) {
    const kaon_block_q4_k *b = w;
    const int nsb = a->nb / 8;
    for (int r = 0; r < nr; r++) {
        const int8_t *x = act_row(a, r0 + r);
        const float *d = a->d + (size_t)(r0 + r) * a->nbp, *s = a->s + (size_t)(r0 + r) * a->nbp;
        float acc = 0.0f;
        for (int i = 0; i < nsb; i++) {
            float dw = kaon_f16_to_f32(b[i].d), dmin = kaon_f16_to_f32(b[i].dmin);
            for (int j = 0; j < 8; j++, x += 32) {
                uint8_t sc, m;
                kaon_q4k_scale_min(b[i].scales, j, &sc, &m);
                const uint8_t *q = b[i].qs + (j >> 1) * 32;
                int isum = 0;
                if (j & 1)
                    for (int l = 0; l < 32; l++) isum += (q[l] >> 4) * x[l];
                else
                    for (int l = 0; l < 32; l++) isum += (q[l] & 0xF) * x[l];
                acc += dw * (float)sc * (d[8 * i + j] * (float)isum) - dmin * (float)m * s[8 * i + j];
            }
        }
        out[r] = acc;
    }
}

static void qdot_q6_k(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) {
    const kaon_block_q6_k *b = w;
    const int nsb = a->nb / 8;
    for (int r = 0; r < nr; r++) {
        const int8_t *x = act_row(a, r0 + r);
        const float *d = a->d + (size_t)(r0 + r) * a->nbp;
        float acc = 0.0f;
        for (int i = 0; i < nsb; i++) {
            float dw = kaon_f16_to_f32(b[i].d);
            for (int j = 0; j < 8; j++, x += 32) {
                int isum = 0;
                for (int l = 0; l < 32; l++)
                    isum += b[i].scales[2 * j + (l >> 4)] * (q6k_raw(&b[i], j, l) - 32) * x[l];
                acc += dw * (d[8 * i + j] * (float)isum);
            }
        }
        out[r] = acc;
    }
}

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
    .qdot = {[KAON_KI_Q4_0] = qdot_q4_0, [KAON_KI_Q4_1] = qdot_q4_1, [KAON_KI_Q8_0] = qdot_q8_0,
             [KAON_KI_Q4_K] = qdot_q4_k, [KAON_KI_Q6_K] = qdot_q6_k},
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
