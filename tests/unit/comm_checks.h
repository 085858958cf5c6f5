// The collectives' checks shared by the communicators' tests (test_comm_cpu.c: threads,
// mpi/test_comm_mpi.c: processes): every collective in f32, bf16, f16 and i32, out of place and in
// place, against a serial computation of the same sums in rank order (bitwise: the reduction
// order is fixed), many rounds in a row.
#ifndef KAON_TESTS_COMM_CHECKS_H
#define KAON_TESTS_COMM_CHECKS_H

#include <stdint.h>
#include <string.h>

#include "dist/comm.h"
#include "test.h"
#include "util/err.h"
#include "util/half.h"

#define MAXN 7
static const size_t counts[] = {0, 1, 5, 33, 1000};
#define NCOUNTS (sizeof counts / sizeof counts[0])

typedef struct {
    kaon_comm *c;
    int failures;
    int mismatch_fails_everywhere;  // an all_to_allv count mismatch fails every rank, not only the receiver
} rank_arg;

// The value rank r holds at element i in round k (small integers and halves: exact in bf16).
static float val(int r, size_t i, int k) { return (float)(((int)(i * 7 + (size_t)r * 13 + (size_t)k * 3)) % 17 - 8) * 0.5f + 0.25f * (float)r; }

static float rd(const void *p, size_t i, kaon_comm_dtype t) {
    switch (t) {
    case KAON_COMM_BF16: return kaon_bf16_to_f32(((const uint16_t *)p)[i]);
    case KAON_COMM_F16: return kaon_f16_to_f32(((const uint16_t *)p)[i]);
    case KAON_COMM_I32: return (float)((const int32_t *)p)[i];
    default: return ((const float *)p)[i];
    }
}
static void wr(void *p, size_t i, float v, kaon_comm_dtype t) {
    switch (t) {
    case KAON_COMM_BF16: ((uint16_t *)p)[i] = kaon_f32_to_bf16(v); break;
    case KAON_COMM_F16: ((uint16_t *)p)[i] = kaon_f32_to_f16(v); break;
    case KAON_COMM_I32: ((int32_t *)p)[i] = (int32_t)(v * 4); break;
    default: ((float *)p)[i] = v; break;
    }
}
// The serial sum of element i over ranks 0..n-1 in rank order, rounded once as the comm does.
static float serial_sum(int n, size_t i, int k, kaon_comm_dtype t) {
    if (t == KAON_COMM_I32) {
        int64_t s = 0;
        for (int r = 0; r < n; r++) s += (int32_t)(val(r, i, k) * 4);
        return (float)s;
    }
    float s = 0;
    for (int r = 0; r < n; r++) {
        unsigned char tmp[4];
        wr(tmp, 0, val(r, i, k), t);
        s = r ? s + rd(tmp, 0, t) : rd(tmp, 0, t);
    }
    unsigned char tmp[4];
    wr(tmp, 0, s, t);
    return rd(tmp, 0, t);
}
static float as_stored(float v, kaon_comm_dtype t) {
    unsigned char tmp[4];
    wr(tmp, 0, v, t);
    return rd(tmp, 0, t);
}

#define RCHECK(cond)                                                                            \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            if (a->failures++ < 5) fprintf(stderr, "rank %d: %s:%d: %s\n", r, __FILE__, __LINE__, #cond); \
        }                                                                                       \
    } while (0)

static void *rank_main(void *p) {
    rank_arg *a = p;
    kaon_comm *c = a->c;
    const int r = c->rank, n = c->size;
    const size_t big = 1000 * MAXN;
    unsigned char *snd = malloc(big * 4), *rcv = malloc(big * 4);
    for (int k = 0; k < 6; k++) {
        for (kaon_comm_dtype t = KAON_COMM_F32; t <= KAON_COMM_I32; t++) {
            for (size_t ci = 0; ci < NCOUNTS; ci++) {
                const size_t cnt = counts[ci];
                const int inplace = (k + (int)ci) % 2;
                // all_reduce
                for (size_t i = 0; i < cnt; i++) wr(snd, i, val(r, i, k), t);
                void *out = inplace ? snd : rcv;
                RCHECK(c->ops->all_reduce(c, snd, out, cnt, t) == 0);
                for (size_t i = 0; i < cnt; i++) RCHECK(rd(out, i, t) == serial_sum(n, i, k, t));
                // all_gather: recv [n * cnt]; in place: send is this rank's chunk of recv
                unsigned char *src = inplace ? rcv + (size_t)r * cnt * kaon_comm_dtype_bytes(t) : snd;
                for (size_t i = 0; i < cnt; i++) wr(src, i, val(r, i, k + 1), t);
                RCHECK(c->ops->all_gather(c, src, rcv, cnt, t) == 0);
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < cnt; i++)
                        RCHECK(rd(rcv, (size_t)q * cnt + i, t) == as_stored(val(q, i, k + 1), t));
                // reduce_scatter: send [n * cnt], element j of rank q = val(q, j, k + 2)
                for (size_t i = 0; i < (size_t)n * cnt; i++) wr(snd, i, val(r, i, k + 2), t);
                void *rs = inplace ? snd + (size_t)r * cnt * kaon_comm_dtype_bytes(t) : rcv;
                RCHECK(c->ops->reduce_scatter(c, snd, rs, cnt, t) == 0);
                for (size_t i = 0; i < cnt; i++) RCHECK(rd(rs, i, t) == serial_sum(n, (size_t)r * cnt + i, k + 2, t));
                // broadcast from a rank that moves with the round
                const int root = (k + (int)ci) % n;
                for (size_t i = 0; i < cnt; i++) wr(snd, i, val(r, i, k + 3), t);
                RCHECK(c->ops->broadcast(c, snd, cnt, t, root) == 0);
                for (size_t i = 0; i < cnt; i++) RCHECK(rd(snd, i, t) == as_stored(val(root, i, k + 3), t));
            }
            // all_to_allv: rank r sends (r + q + k) % 4 elements to rank q, valued 1000 r + 10 q + i
            size_t sc[MAXN], so[MAXN], rc[MAXN], ro[MAXN], off = 0, roff = 0;
            for (int q = 0; q < n; q++) {
                sc[q] = (size_t)((r + q + k) % 4);
                so[q] = off;
                for (size_t i = 0; i < sc[q]; i++) wr(snd, off + i, (float)(1000 * r + 10 * q) + (float)i, KAON_COMM_F32);
                off += sc[q];
                rc[q] = (size_t)((q + r + k) % 4);
                ro[q] = roff + 1;  // a gap of one element between sources
                roff += rc[q] + 1;
            }
            RCHECK(c->ops->all_to_allv(c, snd, sc, so, rcv, rc, ro, KAON_COMM_F32) == 0);
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < rc[q]; i++)
                    RCHECK(rd(rcv, ro[q] + i, KAON_COMM_F32) == (float)(1000 * q + 10 * r) + (float)i);
            RCHECK(c->ops->barrier(c) == 0);
        }
    }
    // A mismatched all_to_allv is an error on the receiving rank (on every rank where a rank
    // cannot see the others' counts: MPI), not a hang or an overrun.
    if (n > 1) {
        size_t sc[MAXN] = {0}, so[MAXN] = {0}, rc[MAXN] = {0}, ro[MAXN] = {0};
        if (r == 0) sc[1] = 2;
        int rc1 = c->ops->all_to_allv(c, snd, sc, so, rcv, rc, ro, KAON_COMM_F32);
        RCHECK(r == 1 || a->mismatch_fails_everywhere ? rc1 != 0 : rc1 == 0);
        RCHECK(r != 1 || strstr(kaon_last_error(), "rank 0 sends 2 elements to rank 1") != NULL);
    }
    free(snd);
    free(rcv);
    return NULL;
}

#endif
