// y = x @ w^T (+ bias) on the CPU for every weight format.
//
// Quantized weights: x [n, K] is quantized to 8-bit blocks (cpu_internal.h), then the output
// rows are cut into a few tasks per thread (util/pool.h), each starting on a 16-row boundary
// so two threads never write one cache line of y. Inside it, a tile of weight rows small enough to stay in L1 is
// dotted with the activation rows 4 (AVX2) or 8 (AVX-512) at a time: each weight block is
// loaded and unpacked once per 4 or 8 rows. Float weights (F32/F16/BF16) use the same tiling
// with FMA dot products.
//
// The batched path (the formats in blocks of 32 with more activation rows than one kernel call
// takes: a batched decode step, a prefill chunk): the activation rows are regrouped, and each tile of 8
// weight rows is repacked once into an L1 buffer that a register-blocked micro-kernel then
// dots with every activation row, 8 (AVX-512) or 4 (AVX2) rows per call, with no horizontal
// sums (cpu_x86.h). Its numbers are bit for bit those of the row path, so a row's output does
// not depend on what it is batched with (test_cpu_linear checks it). The K-quants (Q2_K..Q6_K)
// have their own pack (each 8-row tile's super-blocks decoded once per step) and tile kernel,
// which read the shared quantized activations directly.
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/err.h"
#include "util/pool.h"

// Below this many int8 multiply-adds (or their equivalent) a pool run (a few us to wake the
// workers, plus moving the activations between cores) costs more than it saves.
#define KAON_PAR_MIN_WORK 150000.0
// Bytes of weight rows that one tile keeps hot while all activation rows stream past.
#define KAON_TILE_BYTES 12288

// Tasks per thread of a parallel op: enough that the others absorb a stalled thread's share,
// few enough that claiming them (one atomic operation each) stays negligible.
#define KAON_TASKS_PER_THREAD 4

int kaon_cpu_threads_for(const kaon_backend *be, double work) {
    int nt = be->n_threads < 1 ? 1 : be->n_threads;
    if (work < KAON_PAR_MIN_WORK) return 1;
    double cap = work / KAON_PAR_MIN_WORK;
    if ((double)nt > cap) nt = (int)cap;
    return nt < 1 ? 1 : nt;
}

// One call: up to 4 weights of the same format and width over the same x. Their output rows
// form one index space [0, total) split between the threads. With silu, there are two weights
// (gate, up) of the same height and the output is silu(x @ gate^T) * (x @ up^T).
#define KAON_LIN_MAX 4
typedef struct lin_job {
    const kaon_cpu_kernels *k;
    int kind, quant, silu;
    int nseg, K, n, total;
    const uint8_t *w[KAON_LIN_MAX];
    const float *bias[KAON_LIN_MAX];
    float *y[KAON_LIN_MAX];
    int M[KAON_LIN_MAX], start[KAON_LIN_MAX + 1];  // rows of each weight; first global row
    size_t rb;                                     // bytes per weight row
    const float *x;
    const kaon_q8_act *a;
    // The batched path (lin_run_packed): regrouped activations, and this thread's packed
    // weight tile(s) (two with silu: gate and up).
    const uint8_t *xg;
    size_t xstride;
    uint8_t *pk;
    size_t pk_bytes;
    int nb, nbp;
    int kp;  // the K-quants' batched path (kpack / ktile_dot on a) instead of pack / tile_dot
} lin_job;

// out[r] = row m of weight s dotted with activation rows r0..r0+nr-1.
static inline void lin_dot(const lin_job *j, int s, int m, int r0, int nr, float *out) {
    const uint8_t *wr = j->w[s] + (size_t)m * j->rb;
    if (j->quant)
        j->k->qdot[j->kind](wr, j->a, r0, nr, out);
    else
        j->k->fdot[j->kind](wr, j->K, j->x + (size_t)r0 * j->K, (size_t)j->K, nr, out);
}

#define KAON_SILU_SUB 64  // gate/up rows computed before one vectorized silu * up pass

static void lin_rows(const lin_job *j, int m0, int m1) {
    const int n = j->n, R = j->k->max_rows;
    int mt = m1 - m0;
    if (n > R) {  // prefill: a tile of weight rows stays in L1 while all activation rows pass
        mt = (int)(KAON_TILE_BYTES / (j->rb * (j->silu ? 2 : 1)));
        // Whole SIMD vectors for silu, whole cache lines of y; at least one group of 16 when a
        // row alone is larger than the tile (wide f32/bf16 rows: 0 here would never advance).
        mt = mt < 1 ? 16 : (mt + 15) & ~15;
    }
    float out[KAON_MAX_ROWS], out2[KAON_MAX_ROWS];
    for (int t0 = m0; t0 < m1; t0 += mt) {
        const int t1 = t0 + mt < m1 ? t0 + mt : m1;
        for (int r0 = 0; r0 < n; r0 += R) {
            const int nr = n - r0 < R ? n - r0 : R;
            if (j->silu) {
                float g[KAON_MAX_ROWS][KAON_SILU_SUB], u[KAON_MAX_ROWS][KAON_SILU_SUB];
                for (int s0 = t0; s0 < t1; s0 += KAON_SILU_SUB) {
                    const int s1 = s0 + KAON_SILU_SUB < t1 ? s0 + KAON_SILU_SUB : t1;
                    for (int m = s0; m < s1; m++) {
                        lin_dot(j, 0, m, r0, nr, out);
                        lin_dot(j, 1, m, r0, nr, out2);
                        for (int r = 0; r < nr; r++) {
                            g[r][m - s0] = out[r];
                            u[r][m - s0] = out2[r];
                        }
                    }
                    for (int r = 0; r < nr; r++)
                        j->k->silu_mul(g[r], u[r], j->y[0] + (size_t)(r0 + r) * j->M[0] + s0, s1 - s0);
                }
                continue;
            }
            int s = 0;
            for (int m = t0; m < t1; m++) {
                while (m >= j->start[s + 1]) s++;
                const int lm = m - j->start[s], M = j->M[s];
                lin_dot(j, s, lm, r0, nr, out);
                const float b = j->bias[s] ? j->bias[s][lm] : 0.0f;
                float *yr = j->y[s] + (size_t)r0 * M + lm;
                for (int r = 0; r < nr; r++) yr[(size_t)r * M] = out[r] + b;
            }
        }
    }
}

static inline void lin_pack(const lin_job *j, int s, int lm, int rows, uint8_t *dst) {
    const uint8_t *w = j->w[s] + (size_t)lm * j->rb;
    if (j->kp)
        j->k->kpack(j->kind, w, j->rb, rows, j->nb / 8, dst);
    else
        j->k->pack(j->kind, w, j->rb, rows, j->nb, j->nbp, dst);
}

static inline void lin_tile(const lin_job *j, const uint8_t *pk, int r0, int nr, float *out, size_t ldo) {
    if (j->kp)
        j->k->ktile_dot(j->kind, pk, j->a, r0, nr, out, ldo);
    else
        j->k->tile_dot(j->kind, pk, j->xg + (size_t)r0 * j->xstride, j->xstride, j->nb, j->nbp, nr, out, ldo);
}

// The batched path: rows m0..m1, a tile of k->pack_rows weight rows at a time. Each tile is
// packed once and then dotted with every activation row, k->tile_rows (K-quants: ktile_rows)
// rows per call.
static void lin_rows_packed(const lin_job *j, int m0, int m1) {
    const kaon_cpu_kernels *k = j->k;
    const int n = j->n, P = k->pack_rows, NR = j->kp ? k->ktile_rows : k->tile_rows;
    float out[KAON_MAX_ROWS * KAON_MAX_ROWS], out2[KAON_MAX_ROWS * KAON_MAX_ROWS];
    int s = 0;
    for (int m = m0; m < m1;) {
        while (s + 1 < j->nseg && m >= j->start[s + 1]) s++;
        const int lm = m - j->start[s], M = j->M[s];
        int rows = j->start[s + 1] - m;
        if (rows > m1 - m) rows = m1 - m;
        if (rows > P) rows = P;
        lin_pack(j, s, lm, rows, j->pk);
        if (j->silu) lin_pack(j, 1, lm, rows, j->pk + j->pk_bytes);
        const float *bias = j->bias[s] ? j->bias[s] + lm : NULL;
        for (int r0 = 0; r0 < n; r0 += NR) {
            const int nr = n - r0 < NR ? n - r0 : NR;
            if (!j->silu && !bias && rows == P) {  // straight into y
                lin_tile(j, j->pk, r0, nr, j->y[s] + (size_t)r0 * M + lm, (size_t)M);
                continue;
            }
            lin_tile(j, j->pk, r0, nr, out, (size_t)P);
            if (j->silu) {
                lin_tile(j, j->pk + j->pk_bytes, r0, nr, out2, (size_t)P);
                for (int r = 0; r < nr; r++)
                    k->silu_mul(out + r * P, out2 + r * P, j->y[0] + (size_t)(r0 + r) * M + lm, rows);
                continue;
            }
            for (int r = 0; r < nr; r++) {
                float *yr = j->y[s] + (size_t)(r0 + r) * M + lm;
                const float *o = out + r * P;
                if (bias)
                    for (int i = 0; i < rows; i++) yr[i] = o[i] + bias[i];
                else
                    memcpy(yr, o, sizeof(float) * (size_t)rows);
            }
        }
        m += rows;
    }
}

int kaon_cpu_tasks(int n, int nt, int align, int *per) {
    if (n <= 0) {
        *per = 1;
        return 0;
    }
    const int want = nt <= 1 ? 1 : KAON_TASKS_PER_THREAD * nt;
    int c = n / want + (n % want != 0);
    c = (c + align - 1) / align * align;
    *per = c;
    return n / c + (n % c != 0);
}

// Checks one layer (weight, bias, no companions): its rows M, width K, bytes per row and
// kernel kind.
static int check_weight(kaon_cpu_backend *be, const kaon_linear *l, int64_t *Mo, int64_t *Ko,
                        size_t *rbo, int *kindo) {
    const kaon_tensor *w = l ? &l->w : NULL, *bias = l ? kaon_linear_bias(l) : NULL;
    if (!w || !w->data || w->ndim < 1 || w->ndim > KAON_MAX_DIMS)
        return kaon_cpu_fail(be, "cpu linear: missing weight");
    const char *unsupported = kaon_linear_unsupported(l);
    if (unsupported)
        return kaon_cpu_fail(be, "cpu linear: weight format %s with %s is not supported",
                             kaon_dtype_name(w->dtype), unsupported);
    const int kind = kaon_cpu_kind(w->dtype);
    if (kind < 0)
        return kaon_cpu_fail(be, "cpu linear: weight dtype %s not supported", kaon_dtype_name(w->dtype));
    // w [out, in]: in is the last dim, out the product of the others.
    int64_t K = w->shape[w->ndim - 1], M = 1;
    for (int i = 0; i < w->ndim - 1; i++) {
        if (w->shape[i] <= 0 || M > INT32_MAX / w->shape[i])
            return kaon_cpu_fail(be, "cpu linear: bad weight shape");
        M *= w->shape[i];
    }
    const size_t rb = kaon_dtype_row_bytes(w->dtype, K);
    if (K <= 0 || K > INT32_MAX / 4 || rb == 0)
        return kaon_cpu_fail(be, "cpu linear: %s rows of %lld elements are not whole blocks",
                             kaon_dtype_name(w->dtype), (long long)K);
    if (w->nbytes && w->nbytes / rb < (size_t)M)
        return kaon_cpu_fail(be, "cpu linear: weight holds %zu bytes, needs %zu", w->nbytes,
                             rb * (size_t)M);
    if (bias && (bias->dtype != KAON_F32 || kaon_tensor_numel(bias) != M))
        return kaon_cpu_fail(be, "cpu linear: bias must be F32 [%lld]", (long long)M);
    *Mo = M;
    *Ko = K;
    *rbo = rb;
    *kindo = kind;
    return 0;
}

#define KAON_RUP64(v) (((v) + 63) & ~(size_t)63)

// A linear op's parallel state: the job, the scratch layout, and which threads have
// quantized their own copy of the activations.
typedef struct lin_par {
    const lin_job *job;
    uint8_t *sp;
    size_t xg_bytes, per_thread, rq, rd;  // the batched path's scratch
    kaon_q8_act act;                      // the activations (copy 0)
    size_t act_bytes;                     // bytes of one copy
    int copies;                           // one per thread, or one shared
    int per;                              // items per task
    uint8_t *kpk;                         // the K-quants' batched path: 2 pack buffers a thread
    unsigned char ready[KAON_POOL_MAX_THREADS];
} lin_par;

static void packed_quant_task(void *c, int t, int th) {
    const lin_par *lp = c;
    const lin_job *job = lp->job;
    const kaon_cpu_kernels *k = job->k;
    uint8_t *own = lp->sp + lp->xg_bytes + lp->per_thread * (size_t)th;
    kaon_q8_act tmp = {.n = 1, .nb = job->nb, .nbp = job->nbp, .layout = k->layout[job->kind],
                       .qs = (int8_t *)own, .d = (float *)(own + lp->rq),
                       .s = (float *)(own + lp->rq + lp->rd)};
    const int r0 = t * lp->per, r1 = r0 + lp->per < job->n ? r0 + lp->per : job->n;
    for (int r = r0; r < r1; r++) {
        k->quantize_row(job->x + (size_t)r * job->K, &tmp, 0);
        kaon_cpu_act_regroup(&tmp, 0, lp->sp + (size_t)r * job->xstride);
    }
}

static void packed_rows_task(void *c, int t, int th) {
    const lin_par *lp = c;
    lin_job mine = *lp->job;
    mine.pk = lp->sp + lp->xg_bytes + lp->per_thread * (size_t)th + lp->rq + 2 * lp->rd;
    const int m0 = t * lp->per, m1 = m0 + lp->per < mine.total ? m0 + lp->per : mine.total;
    lin_rows_packed(&mine, m0, m1);
}

// The batched path: each row of x is quantized (through a one-row buffer per thread) and
// regrouped for tile_dot; then, in a second run, the threads pack and compute the weight rows
// a task at a time.
static void lin_run_packed(kaon_cpu_backend *be, lin_job *job, int nt) {
    const kaon_cpu_kernels *k = be->k;
    const int n = job->n, K = job->K;
    job->nb = K / KAON_QK;
    job->nbp = (job->nb + 7) & ~7;
    job->xstride = (size_t)(job->nbp / 8) * KAON_GRP_BYTES;
    job->pk_bytes = KAON_RUP64(k->pack_bytes(job->nbp));
    lin_par lp = {.job = job, .rq = KAON_RUP64((size_t)job->nbp * 32),
                  .rd = KAON_RUP64((size_t)job->nbp * sizeof(float))};
    lp.per_thread = lp.rq + 2 * lp.rd + 2 * job->pk_bytes;
    lp.xg_bytes = KAON_RUP64((size_t)n * job->xstride);
    lp.sp = kaon_cpu_scratch(be, lp.xg_bytes + lp.per_thread * (size_t)nt);
    if (!lp.sp) return;
    job->xg = lp.sp;
    int tasks = kaon_cpu_tasks(n, nt, 1, &lp.per);
    kaon_pool_run(be->pool, tasks, nt, packed_quant_task, &lp);
    // Rows in multiples of 16: whole cache lines of y, and the same tiles (so the same
    // vector/scalar split of silu_mul) as on one thread.
    tasks = kaon_cpu_tasks(job->total, nt, 16, &lp.per);
    kaon_pool_run(be->pool, tasks, nt, packed_rows_task, &lp);
}

// The quantized activations of n rows of K for kind: bytes of one copy; with sp, *a describes
// the copy at sp (qs, then d, s and the Q2_K/Q3_K/Q6_K half-sums, each 64-byte aligned).
static size_t act_layout(const kaon_cpu_kernels *k, int kind, int n, int K, uint8_t *sp, kaon_q8_act *a) {
    const int nb = K / KAON_QK, nbp = (nb + 7) & ~7;
    const int need16 = kind == KAON_KI_Q6_K || kind == KAON_KI_Q2_K || kind == KAON_KI_Q3_K;
    const size_t nq = (size_t)n * nbp * 32, nd = (size_t)n * nbp * sizeof(float);
    const size_t n16 = need16 ? (size_t)n * nbp * 2 * sizeof(int16_t) : 0;
    const size_t od = KAON_RUP64(nq), os = KAON_RUP64(od + nd), o16 = KAON_RUP64(os + nd);
    if (sp)
        *a = (kaon_q8_act){.n = n, .nb = nb, .nbp = nbp, .layout = k->layout[kind], .qs = (int8_t *)sp,
                           .d = (float *)(sp + od), .s = (float *)(sp + os),
                           .s16 = need16 ? (int16_t *)(sp + o16) : NULL};
    return KAON_RUP64(o16 + n16);
}

// Thread th's copy of the activations (decode: each thread quantizes x for itself).
static kaon_q8_act own_copy(const lin_par *lp, int th) {
    const size_t off = lp->act_bytes * (size_t)th;
    kaon_q8_act own = lp->act;
    own.qs = (int8_t *)((uint8_t *)own.qs + off);
    own.d = (float *)((uint8_t *)own.d + off);
    own.s = (float *)((uint8_t *)own.s + off);
    if (own.s16) own.s16 = (int16_t *)((uint8_t *)own.s16 + off);
    return own;
}

static void quant_task(void *c, int t, int th) {
    lin_par *lp = c;
    const lin_job *job = lp->job;
    (void)th;
    const int r0 = t * lp->per, r1 = r0 + lp->per < job->n ? r0 + lp->per : job->n;
    for (int r = r0; r < r1; r++) job->k->quantize_row(job->x + (size_t)r * job->K, &lp->act, r);
}

static void kpacked_rows_task(void *c, int t, int th) {
    const lin_par *lp = c;
    lin_job mine = *lp->job;
    mine.pk = lp->kpk + 2 * mine.pk_bytes * (size_t)th;
    const int m0 = t * lp->per, m1 = m0 + lp->per < mine.total ? m0 + lp->per : mine.total;
    lin_rows_packed(&mine, m0, m1);
}

// Whether a kind has the K-quants' batched path in table k.
static int has_kpack(const kaon_cpu_kernels *k, int kind) {
    return k->kpack && (kind == KAON_KI_Q2_K || kind == KAON_KI_Q3_K || kind == KAON_KI_Q4_K ||
                        kind == KAON_KI_Q5_K || kind == KAON_KI_Q6_K);
}

static void rows_task(void *c, int t, int th) {
    lin_par *lp = c;
    lin_job mine = *lp->job;
    kaon_q8_act own;
    if (lp->copies > 1) {
        own = own_copy(lp, th);
        if (!lp->ready[th]) {  // this thread's first task: its own copy of x
            for (int r = 0; r < mine.n; r++) mine.k->quantize_row(mine.x + (size_t)r * mine.K, &own, r);
            lp->ready[th] = 1;
        }
        mine.a = &own;
    }
    const int m0 = t * lp->per, m1 = m0 + lp->per < mine.total ? m0 + lp->per : mine.total;
    lin_rows(&mine, m0, m1);
}

// Runs a checked job: quantizes x once, then all rows of all weights, a task at a time.
static void lin_run(kaon_cpu_backend *be, lin_job *job) {
    const kaon_cpu_kernels *k = be->k;
    const int n = job->n, K = job->K;
    const float *x = job->x;
    const double work = (double)job->total * (job->silu ? 2.0 : 1.0) * K * n * (job->quant ? 1 : 4);
    int nt = kaon_cpu_threads_for(&be->base, work);
    if (nt > kaon_pool_size(be->pool)) nt = kaon_pool_size(be->pool);
    // Many activation rows of a format the packed kernels handle: the batched path.
    if (job->quant && n > k->max_rows && k->pack && k->layout[job->kind] == KAON_ACT_Q4PAIRS) {
        lin_run_packed(be, job, nt);
        return;
    }
    // Many activation rows of a K-quant: one shared copy of x, then the batched path.
    job->kp = job->quant && n > k->max_rows && has_kpack(k, job->kind);
    // Few rows (decode): every thread quantizes x into its own copy, which costs less than
    // a second run and keeps the copy in the cache of the core that reads it.
    lin_par lp = {.job = job};
    lp.copies = job->quant && nt > 1 && n <= k->max_rows ? nt : 1;
    if (job->quant) {
        const int nb = K / KAON_QK;
        lp.act_bytes = act_layout(k, job->kind, n, K, NULL, NULL);
        if (job->kp) {
            job->nb = nb;
            job->pk_bytes = KAON_RUP64(k->kpack_bytes(nb / 8));
        }
        const size_t kpk_bytes = job->kp ? 2 * job->pk_bytes * (size_t)nt : 0;
        uint8_t *sp = kaon_cpu_scratch(be, lp.act_bytes * (size_t)lp.copies + kpk_bytes);
        if (!sp) return;
        lp.kpk = sp + lp.act_bytes * (size_t)lp.copies;
        // Copy c lives at sp + c * act_bytes; the offsets inside it are the same for all.
        act_layout(k, job->kind, n, K, sp, &lp.act);
        job->a = &lp.act;
    }
    if (nt == 1) {
        if (job->quant)
            for (int r = 0; r < n; r++) k->quantize_row(x + (size_t)r * K, &lp.act, r);
        if (job->kp) {
            job->pk = lp.kpk;
            lin_rows_packed(job, 0, job->total);
        } else {
            lin_rows(job, 0, job->total);
        }
        return;
    }
    if (job->quant && lp.copies == 1) {  // one shared copy, quantized first
        const int tasks = kaon_cpu_tasks(n, nt, 1, &lp.per);
        kaon_pool_run(be->pool, tasks, nt, quant_task, &lp);
    }
    // Rows in multiples of 16: whole cache lines of y, and silu_mul's vector/scalar split
    // as on one thread.
    const int tasks = kaon_cpu_tasks(job->total, nt, 16, &lp.per);
    kaon_pool_run(be->pool, tasks, nt, job->kp ? kpacked_rows_task : rows_task, &lp);
}

// Builds a job over count layers; 1 when they cannot share one (formats or widths differ).
static int lin_setup(kaon_cpu_backend *be, lin_job *j, const void *x, int n, int count,
                     const kaon_linear *const *w, void *const *y) {
    memset(j, 0, sizeof *j);
    if (!x || count < 1 || count > KAON_LIN_MAX || !w || !y)
        return kaon_cpu_fail(be, "cpu linear: missing input or output");
    j->k = be->k;
    j->n = n;
    j->x = x;
    j->nseg = count;
    int64_t total = 0;
    for (int i = 0; i < count; i++) {
        int64_t M = 0, K = 0;
        size_t rb = 0;
        int kind = 0;
        if (!y[i]) return kaon_cpu_fail(be, "cpu linear: missing output");
        if (check_weight(be, w[i], &M, &K, &rb, &kind)) return -1;
        if (i > 0 && (kind != j->kind || K != j->K)) return 1;
        const kaon_tensor *b = kaon_linear_bias(w[i]);
        j->kind = kind;
        j->K = (int)K;
        j->rb = rb;
        j->w[i] = w[i]->w.data;
        j->bias[i] = b ? (const float *)b->data : NULL;
        j->y[i] = y[i];
        j->M[i] = (int)M;
        j->start[i] = (int)total;
        total += M;
        if (total > INT32_MAX) return kaon_cpu_fail(be, "cpu linear: too many rows");
    }
    j->start[count] = (int)total;
    j->total = (int)total;
    j->quant = j->k->qdot[j->kind] != NULL;
    return 0;
}

void kaon_cpu_linear(kaon_backend *be_, const void *x, int n, const kaon_linear *w, void *y) {
    if (n <= 0) return;
    if (kaon_linear_is_fp8_block(w) || kaon_linear_is_int8(w)) {
        kaon_cpu_linear_fp8((kaon_cpu_backend *)be_, x, n, w, y);
        return;
    }
    if (kaon_linear_is_int4(w)) {
        kaon_cpu_linear_int4((kaon_cpu_backend *)be_, x, n, w, y);
        return;
    }
    if (kaon_linear_is_mxfp4(w)) {
        kaon_cpu_linear_mxfp4((kaon_cpu_backend *)be_, x, n, w, y);
        return;
    }
    lin_job j;
    void *yl[1] = {y};
    if (lin_setup((kaon_cpu_backend *)be_, &j, x, n, 1, &w, yl) == 0) lin_run((kaon_cpu_backend *)be_, &j);
}

int kaon_cpu_linear_multi(kaon_backend *be_, const void *x, int n, int count,
                          const kaon_linear *const *w, void *const *y) {
    if (n <= 0) return 0;
    for (int i = 0; w && i < count; i++)
        if (kaon_linear_is_fp8_block(w[i]) || kaon_linear_is_int8(w[i]) || kaon_linear_is_int4(w[i]) ||
            kaon_linear_is_mxfp4(w[i]))
            return 1;  // one at a time
    lin_job j;
    const int rc = lin_setup((kaon_cpu_backend *)be_, &j, x, n, count, w, y);
    if (rc) return rc;
    lin_run((kaon_cpu_backend *)be_, &j);
    return 0;
}

int kaon_cpu_linear_silu_mul(kaon_backend *be_, const void *x, int n, const kaon_linear *gate,
                             const kaon_linear *up, void *out) {
    if (n <= 0) return 0;
    // The fused kernel adds no bias: the caller's unfused ops do.
    if (gate && up && (kaon_linear_bias(gate) || kaon_linear_bias(up))) return 1;
    if (kaon_linear_is_fp8_block(gate) || kaon_linear_is_fp8_block(up)) return 1;
    if (kaon_linear_is_int8(gate) || kaon_linear_is_int8(up)) return 1;
    if (kaon_linear_is_int4(gate) || kaon_linear_is_int4(up)) return 1;
    if (kaon_linear_is_mxfp4(gate) || kaon_linear_is_mxfp4(up)) return 1;
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    lin_job j;
    const kaon_linear *w[2] = {gate, up};
    void *y[2] = {out, out};
    const int rc = lin_setup(be, &j, x, n, 2, w, y);
    if (rc) return rc;
    if (j.M[0] != j.M[1]) return kaon_cpu_fail(be, "cpu linear_silu_mul: gate and up heights differ");
    j.silu = 1;
    j.total = j.M[0];  // row m gives out[:, m] from gate row m and up row m
    lin_run(be, &j);
    return 0;
}

// ---- grouped linears: several small products of one format as one parallel run ----------
//
// The MoE op's decode step multiplies each token by 8 (or so) experts' matrices, each with one
// or a few activation rows. Run one at a time, each product is a pool run of its own (a wake-up
// and a barrier per expert and matrix) over a few hundred rows. Here all rows of all segments
// form one work list: the activations of every segment are quantized first (one run), then the
// threads claim tasks of rows of any segment (a second run). Each row is computed by the same
// row kernel as in kaon_cpu_linear, so the results are the same bit for bit.

typedef struct grp_task {
    int seg, m0, m1;
} grp_task;

typedef struct grp_par {
    const lin_job *jobs;  // one per segment (a: its rows of the shared activations)
    const grp_task *tasks;
    const float *const *xrow;  // [rows] each activation row's floats
    kaon_q8_act act;           // all segments' rows
    int per;                   // activation rows per quantization task
} grp_par;

static void grp_quant_task(void *c, int t, int th) {
    grp_par *gp = c;
    (void)th;
    const int r0 = t * gp->per, r1 = r0 + gp->per < gp->act.n ? r0 + gp->per : gp->act.n;
    for (int r = r0; r < r1; r++) gp->jobs[0].k->quantize_row(gp->xrow[r], &gp->act, r);
}

static void grp_rows_task(void *c, int t, int th) {
    const grp_par *gp = c;
    (void)th;
    const grp_task *tk = &gp->tasks[t];
    lin_rows(&gp->jobs[tk->seg], tk->m0, tk->m1);
}

// Rows of a weight (the product of all dims but the last); 0 when it has none.
static int64_t weight_rows(const kaon_linear *l) {
    const kaon_tensor *w = &l->w;
    if (w->ndim < 1) return 0;
    int64_t M = 1;
    for (int i = 0; i < w->ndim - 1; i++) M *= w->shape[i] > 0 ? w->shape[i] : 0;
    return M;
}

int kaon_cpu_linear_grouped(kaon_cpu_backend *be, int nseg, const kaon_cpu_seg *seg) {
    if (nseg <= 0) return 0;
    const kaon_cpu_kernels *k = be->k;
    const int silu = seg[0].w2 != NULL;
    int rows = 0;
    int64_t total = 0;
    for (int s = 0; s < nseg; s++) {
        const kaon_linear *l[2] = {seg[s].w, seg[s].w2};
        if ((seg[s].w2 != NULL) != silu || seg[s].n <= 0 || seg[s].n > k->max_rows) return 1;
        for (int i = 0; i < 1 + silu; i++)
            if (!l[i] || kaon_linear_is_fp8_block(l[i]) || kaon_linear_is_int4(l[i]) || kaon_linear_is_mxfp4(l[i]) ||
                (silu && kaon_linear_bias(l[i])))
                return 1;
        rows += seg[s].n;
        total += weight_rows(seg[s].w);
    }
    if (total > INT32_MAX) return kaon_cpu_fail(be, "cpu linear_grouped: too many rows");
    // Scratch: the jobs, their activation views, the row pointers, the tasks (at most one per
    // 16 rows of each segment plus one per segment), the activations.
    const kaon_tensor *w0 = &seg[0].w->w;
    const int kind0 = kaon_cpu_kind(w0->dtype), quant = kind0 >= 0 && k->qdot[kind0] != NULL;
    const int64_t K0 = w0->ndim >= 1 ? w0->shape[w0->ndim - 1] : 0;
    if (kind0 < 0 || K0 <= 0 || K0 > INT32_MAX / 4) return 1;  // kaon_cpu_linear reports it
    const size_t jobs_b = KAON_RUP64(sizeof(lin_job) * (size_t)nseg);
    const size_t views_b = KAON_RUP64(sizeof(kaon_q8_act) * (size_t)nseg);
    const size_t xrow_b = KAON_RUP64(sizeof(float *) * (size_t)rows);
    const size_t max_tasks = (size_t)(total / 16) + (size_t)nseg;
    const size_t tasks_b = KAON_RUP64(sizeof(grp_task) * max_tasks);
    const size_t act_b = quant ? act_layout(k, kind0, rows, (int)K0, NULL, NULL) : 0;
    uint8_t *sp = kaon_cpu_scratch(be, jobs_b + views_b + xrow_b + tasks_b + act_b);
    if (!sp) return -1;
    lin_job *jobs = (lin_job *)sp;
    kaon_q8_act *views = (kaon_q8_act *)(sp + jobs_b);
    const float **xrow = (const float **)(sp + jobs_b + views_b);
    grp_task *tasks = (grp_task *)(sp + jobs_b + views_b + xrow_b);
    grp_par gp = {.jobs = jobs, .tasks = tasks, .xrow = xrow};
    if (quant) act_layout(k, kind0, rows, (int)K0, sp + jobs_b + views_b + xrow_b + tasks_b, &gp.act);

    double work = 0;
    int r = 0;
    for (int s = 0; s < nseg; s++) {
        lin_job *j = &jobs[s];
        const kaon_linear *l[2] = {seg[s].w, seg[s].w2};
        void *y[2] = {seg[s].y, seg[s].y};
        const int rc = lin_setup(be, j, seg[s].x, seg[s].n, 1 + silu, l, y);
        if (rc) return rc;
        if (j->kind != kind0 || j->K != K0) return 1;
        if (silu) {
            if (j->M[0] != j->M[1]) return kaon_cpu_fail(be, "cpu linear_grouped: gate and up heights differ");
            j->silu = 1;
            j->total = j->M[0];
        }
        work += (double)j->total * (silu ? 2.0 : 1.0) * j->K * j->n * (quant ? 1 : 4);
        if (quant) {  // segment s reads rows [r, r + n) of the shared activations
            kaon_q8_act v = gp.act;
            const size_t xs = (size_t)v.nbp * 32, ds = (size_t)v.nbp;
            v.n = j->n;
            v.qs += (size_t)r * xs;
            v.d += (size_t)r * ds;
            v.s += (size_t)r * ds;
            if (v.s16) v.s16 += (size_t)r * ds * 2;
            views[s] = v;
            j->a = &views[s];
            for (int i = 0; i < j->n; i++) xrow[r + i] = j->x + (size_t)i * j->K;
        }
        r += j->n;
    }
    int nt = kaon_cpu_threads_for(&be->base, work);
    if (nt > kaon_pool_size(be->pool)) nt = kaon_pool_size(be->pool);
    // Rows per task: about 4 tasks a thread over all rows, whole groups of 16 (cache lines of
    // y, and silu_mul's vector/scalar split as in kaon_cpu_linear's tasks).
    int per = (int)((total + 4 * nt - 1) / (4 * nt));
    per = per < 16 ? 16 : (per + 15) & ~15;
    int n_tasks = 0;
    for (int s = 0; s < nseg; s++)
        for (int m = 0; m < jobs[s].total; m += per)
            tasks[n_tasks++] = (grp_task){s, m, m + per < jobs[s].total ? m + per : jobs[s].total};
    if (quant) {
        if (nt == 1) {
            for (int i = 0; i < rows; i++) k->quantize_row(xrow[i], &gp.act, i);
        } else {
            const int qt = kaon_cpu_tasks(rows, nt, 1, &gp.per);
            kaon_pool_run(be->pool, qt, nt, grp_quant_task, &gp);
        }
    }
    kaon_pool_run(be->pool, n_tasks, nt, grp_rows_task, &gp);
    return 0;
}
