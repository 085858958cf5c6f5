// y = x @ w^T (+ bias) on the CPU for every weight format.
//
// Quantized weights: x [n, K] is quantized to 8-bit blocks (cpu_internal.h), then each thread
// takes a contiguous range of output rows (starting on a 16-row boundary, so two threads never
// write one cache line of y). Inside it, a tile of weight rows small enough to stay in L1 is
// dotted with the activation rows 4 (AVX2) or 8 (AVX-512) at a time: each weight block is
// loaded and unpacked once per 4 or 8 rows, which is what makes prefill fast. Float weights
// (F32/F16/BF16) use the same tiling with FMA dot products.
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/err.h"

// Below this many int8 multiply-adds (or their equivalent) a fork/join of the thread team
// (about 1 us, plus moving the activations between cores) costs more than it saves.
#define KAON_PAR_MIN_WORK 150000.0
// Bytes of weight rows that one tile keeps hot while all activation rows stream past.
#define KAON_TILE_BYTES 12288

int kaon_cpu_threads_for(const kaon_backend *be, double work) {
    int nt = be->n_threads < 1 ? 1 : be->n_threads;
    if (work < KAON_PAR_MIN_WORK) return 1;
    double cap = work / KAON_PAR_MIN_WORK;
    if ((double)nt > cap) nt = (int)cap;
    return nt < 1 ? 1 : nt;
}

typedef struct lin_job {
    const kaon_cpu_kernels *k;
    int kind, quant;
    const uint8_t *w;
    size_t rb;  // bytes per weight row
    int M, K, n;
    const float *x, *bias;
    float *y;
    const kaon_q8_act *a;
} lin_job;

static void lin_rows(const lin_job *j, int m0, int m1) {
    const int n = j->n, M = j->M, R = j->k->max_rows;
    int mt = m1 - m0;
    if (n > R) {
        mt = (int)(KAON_TILE_BYTES / j->rb);
        if (mt < 4) mt = 4;
    }
    float out[KAON_MAX_ROWS];
    for (int t0 = m0; t0 < m1; t0 += mt) {
        const int t1 = t0 + mt < m1 ? t0 + mt : m1;
        for (int r0 = 0; r0 < n; r0 += R) {
            const int nr = n - r0 < R ? n - r0 : R;
            float *yr = j->y + (size_t)r0 * M;
            for (int m = t0; m < t1; m++) {
                const uint8_t *wr = j->w + (size_t)m * j->rb;
                if (j->quant)
                    j->k->qdot[j->kind](wr, j->a, r0, nr, out);
                else
                    j->k->fdot[j->kind](wr, j->K, j->x + (size_t)r0 * j->K, (size_t)j->K, nr, out);
                const float b = j->bias ? j->bias[m] : 0.0f;
                for (int r = 0; r < nr; r++) yr[(size_t)r * M + m] = out[r] + b;
            }
        }
    }
}

// Thread ith's share of M rows: contiguous, starting on a multiple of 16 rows (64 bytes of y).
static void split_rows(int M, int ith, int nth, int *m0, int *m1) {
    int chunk = (M + nth - 1) / nth;
    chunk = (chunk + 15) & ~15;
    long long a = (long long)ith * chunk, b = a + chunk;
    *m0 = a > M ? M : (int)a;
    *m1 = b > M ? M : (int)b;
}

void kaon_cpu_linear(kaon_backend *be_, const void *x_, int n, const kaon_tensor *w,
                     const kaon_tensor *bias, void *y_) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (n <= 0) return;
    if (!w || !w->data || !x_ || !y_ || w->ndim < 1 || w->ndim > KAON_MAX_DIMS) {
        kaon_set_error("cpu linear: missing weight, input or output");
        return;
    }
    const int kind = kaon_cpu_kind(w->dtype);
    if (kind < 0) {
        kaon_set_error("cpu linear: weight dtype %s not supported", kaon_dtype_name(w->dtype));
        return;
    }
    // w [out, in]: in is the last dim, out the product of the others.
    int64_t K = w->shape[w->ndim - 1], M = 1;
    for (int i = 0; i < w->ndim - 1; i++) {
        if (w->shape[i] <= 0 || M > INT32_MAX / w->shape[i]) {
            kaon_set_error("cpu linear: bad weight shape");
            return;
        }
        M *= w->shape[i];
    }
    const size_t rb = kaon_dtype_row_bytes(w->dtype, K);
    if (K <= 0 || K > INT32_MAX / 4 || rb == 0) {
        kaon_set_error("cpu linear: %s rows of %lld elements are not whole blocks",
                       kaon_dtype_name(w->dtype), (long long)K);
        return;
    }
    if (w->nbytes && w->nbytes / rb < (size_t)M) {
        kaon_set_error("cpu linear: weight holds %zu bytes, needs %zu", w->nbytes, rb * (size_t)M);
        return;
    }
    const float *bp = NULL;
    if (bias && bias->data) {
        if (bias->dtype != KAON_F32 || kaon_tensor_numel(bias) != M) {
            kaon_set_error("cpu linear: bias must be F32 [%lld]", (long long)M);
            return;
        }
        bp = bias->data;
    }

    const kaon_cpu_kernels *k = be->k;
    lin_job job = {.k = k, .kind = kind, .quant = k->qdot[kind] != NULL, .w = w->data, .rb = rb,
                   .M = (int)M, .K = (int)K, .n = n, .x = x_, .bias = bp, .y = y_};
    const float *x = x_;
    const int nt = kaon_cpu_threads_for(be_, (double)M * (double)K * (double)n * (job.quant ? 1 : 4));
    // Few rows (decode): every thread quantizes x into its own copy, which costs less than
    // a barrier and keeps the copy in the cache of the core that reads it.
    const int copies = job.quant && nt > 1 && n <= k->max_rows ? nt : 1;
    kaon_q8_act act = {0};
    size_t act_bytes = 0;
    if (job.quant) {
        const int nb = (int)(K / KAON_QK), nbp = (nb + 7) & ~7;
        const int need16 = w->dtype == KAON_Q6_K;
        const size_t nq = (size_t)n * nbp * 32, nd = (size_t)n * nbp * sizeof(float);
        const size_t n16 = need16 ? (size_t)n * nbp * 2 * sizeof(int16_t) : 0;
        const size_t od = (nq + 63) & ~(size_t)63, os = (od + nd + 63) & ~(size_t)63;
        const size_t o16 = (os + nd + 63) & ~(size_t)63;
        act_bytes = (o16 + n16 + 63) & ~(size_t)63;
        uint8_t *sp = kaon_cpu_scratch(be, act_bytes * (size_t)copies);
        if (!sp) return;
        // Copy c lives at sp + c * act_bytes; the offsets inside it are the same for all.
        act = (kaon_q8_act){.n = n, .nb = nb, .nbp = nbp, .layout = k->layout[kind],
                            .qs = (int8_t *)sp, .d = (float *)(sp + od), .s = (float *)(sp + os),
                            .s16 = need16 ? (int16_t *)(sp + o16) : NULL};
        job.a = &act;
    }
    if (job.quant && nt == 1)
        for (int r = 0; r < n; r++) k->quantize_row(x + (size_t)r * K, &act, r);
    if (nt == 1) {
        lin_rows(&job, 0, (int)M);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
        lin_job mine = job;
        kaon_q8_act own;
        if (job.quant && copies > 1) {
            const size_t off = act_bytes * (size_t)(ith < copies ? ith : 0);
            own = act;
            own.qs = (int8_t *)((uint8_t *)act.qs + off);
            own.d = (float *)((uint8_t *)act.d + off);
            own.s = (float *)((uint8_t *)act.s + off);
            if (own.s16) own.s16 = (int16_t *)((uint8_t *)act.s16 + off);
            mine.a = &own;
            for (int r = 0; r < n; r++) k->quantize_row(x + (size_t)r * K, &own, r);
        } else if (job.quant) {
#pragma omp for schedule(static)
            for (int r = 0; r < n; r++) k->quantize_row(x + (size_t)r * K, &act, r);
        }
        int m0, m1;
        split_rows((int)M, ith, nth, &m0, &m1);
        if (m0 < m1) lin_rows(&mine, m0, m1);
    }
}
