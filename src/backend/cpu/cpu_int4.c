// y = x @ w^T (+ bias) for INT4 weights in kaon's layout (backend/linear.h): exactness first.
// Each weight row is dequantized to f32 ((q - zero) * scale, the product a reference forms)
// and dotted in f32 with the activations, gathered first by perm when the checkpoint was
// act-ordered. Fast kernels (repacked for SIMD or the GPU) are still to come.
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"

typedef struct int4_w {
    const uint8_t *w;
    const float *s, *z;
    int64_t K, g, G;
} int4_w;

// Row m: (q - zero) * scale per group of g columns (zero 8 when the layout has none).
static void int4_row(const void *c, int64_t m, float *row) {
    const int4_w *j = c;
    const uint8_t *q = j->w + (size_t)m * (size_t)(j->K / 2);
    for (int64_t gi = 0; gi < j->G; gi++) {
        const float s = j->s[m * j->G + gi], z = j->z ? j->z[m * j->G + gi] : 8.0f;
        const int64_t k1 = (gi + 1) * j->g < j->K ? (gi + 1) * j->g : j->K;
        for (int64_t k = gi * j->g; k < k1; k++) row[k] = ((float)(k & 1 ? q[k / 2] >> 4 : q[k / 2] & 15) - z) * s;
    }
}

int kaon_cpu_linear_int4(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y) {
    const kaon_tensor *w = &l->w, *sc = &l->scale, *zt = &l->zero, *pt = &l->perm, *bias = kaon_linear_bias(l);
    if (!x || !y || !w->data || w->ndim != 2 || !kaon_linear_is_int4(l))
        return kaon_cpu_fail(be, "cpu linear: bad INT4 weight");
    const int64_t M = w->shape[0], K = w->shape[1], g = l->scale_block[1], G = (K + g - 1) / g;
    if (M <= 0 || K <= 0 || K % 2 || M > INT32_MAX || K > INT32_MAX / 4 || w->nbytes < (size_t)(M * K / 2))
        return kaon_cpu_fail(be, "cpu linear: INT4 weight [%lld, %lld] is not whole", (long long)M, (long long)K);
    const size_t sbytes = sizeof(float) * (size_t)(M * G);
    if (sc->ndim != 2 || sc->shape[0] != M || sc->shape[1] != G || sc->nbytes < sbytes ||
        (zt->data && (zt->dtype != KAON_F32 || zt->nbytes < sbytes)))
        return kaon_cpu_fail(be, "cpu linear: INT4 scales and zeros must be F32 [%lld, %lld]", (long long)M, (long long)G);
    if (pt->data && (pt->dtype != KAON_I32 || kaon_tensor_numel(pt) != K))
        return kaon_cpu_fail(be, "cpu linear: INT4 permutation must be I32 [%lld]", (long long)K);
    if (bias && (bias->dtype != KAON_F32 || kaon_tensor_numel(bias) != M))
        return kaon_cpu_fail(be, "cpu linear: bias must be F32 [%lld]", (long long)M);
    const int nt = kaon_cpu_threads_for(&be->base, 4.0 * (double)M * (double)K * n);
    const size_t xp_elems = pt->data ? (size_t)n * (size_t)K : 0;
    float *rows = kaon_cpu_scratch(be, sizeof(float) * ((size_t)K * (size_t)nt + xp_elems));
    if (!rows) return -1;
    if (pt->data) {  // column k of w multiplies x[perm[k]]
        const int32_t *perm = pt->data;
        float *xp = rows + (size_t)K * (size_t)nt;
        for (int r = 0; r < n; r++)
            for (int64_t k = 0; k < K; k++) xp[(size_t)r * (size_t)K + (size_t)k] = x[(size_t)r * (size_t)K + (size_t)perm[k]];
        x = xp;
    }
    const int4_w j = {.w = w->data, .s = sc->data, .z = zt->data, .K = K, .g = g, .G = G};
    kaon_cpu_rows_linear(be, x, n, M, K, bias ? bias->data : NULL, y, rows, nt, int4_row, &j);
    return 0;
}
