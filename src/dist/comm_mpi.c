// The MPI communicator (comm.h): one rank per process of an MPI job, host buffers. Every
// collective is MPI's non-blocking one waited for by polling (wait_done): MPI's own blocking
// waits spin a core, which a follower idle between steps (or two processes sharing a small
// machine) cannot afford. Sums are made here in rank order (dist/reduce.h), never by MPI's
// reductions, whose order is the library's: all-reduce is an all-to-all of chunks (rank r gets
// chunk r of every rank), rank-order sums, and an all-gather of the sums.
#include "dist/comm.h"
#include "util/err.h"

#if defined(KAON_HAVE_MPI)
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/reduce.h"

typedef struct mpi_comm {
    kaon_comm base;
    MPI_Comm comm;
    int aborted;              // set by abort from any thread; read by the waits
    char why[256];
    unsigned char *scratch;   // the sums' inputs and results
    size_t scratch_cap;
    int *ic;                  // [4 * size] all_to_allv's counts and displacements as MPI ints
    uint64_t *counts;         // [2 * size] all_to_allv: the counts each rank sends, exchanged
    const void **in;          // [size] the sums' inputs
} mpi_comm;

static MPI_Datatype mpi_type(kaon_comm_dtype t) {
    switch (t) {
    case KAON_COMM_BF16:
    case KAON_COMM_F16: return MPI_UINT16_T;
    case KAON_COMM_I32: return MPI_INT32_T;
    default: return MPI_FLOAT;
    }
}

static int fits_int(size_t n, const char *what) {
    return n <= (size_t)INT_MAX ? 0 : kaon_set_error("comm: %s of %zu elements (MPI counts are ints)", what, n);
}

// Polls the request: spins briefly (a collective inside a step ends in microseconds), then
// yields, then sleeps up to a millisecond at a time (a follower waiting for its next step).
static int wait_done(mpi_comm *c, MPI_Request *rq, const char *what) {
    for (unsigned long i = 0;; i++) {
        int done = 0;
        if (MPI_Test(rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return kaon_set_error("comm: MPI %s failed", what);
        if (done) return 0;
        if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
            return kaon_set_error("comm: aborted: %s", c->why);  // the request stays pending: unusable now
        if (i < 256) continue;
        if (i < 4096) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, i < 8192 ? 50000 : 1000000};
        nanosleep(&ts, NULL);
    }
}

static int usable(mpi_comm *c) {
    return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE) ? kaon_set_error("comm: aborted: %s", c->why) : 0;
}

static unsigned char *scratch(mpi_comm *c, size_t bytes) {
    if (!bytes) bytes = 1;  // a pointer even for nothing
    if (c->scratch_cap >= bytes) return c->scratch;
    unsigned char *s = realloc(c->scratch, bytes);
    if (!s) {
        kaon_set_error("comm: out of memory for %zu bytes of MPI scratch", bytes);
        return NULL;
    }
    c->scratch = s, c->scratch_cap = bytes;
    return s;
}

// Rank q's chunk boundaries as MPI counts and displacements (elements).
static void chunk_ints(const mpi_comm *c, size_t count, int *cnt, int *dis) {
    for (int q = 0; q < c->base.size; q++) {
        size_t lo, hi;
        kaon_comm_chunk(count, c->base.size, q, &lo, &hi);
        cnt[q] = (int)(hi - lo), dis[q] = (int)lo;
    }
}

static int m_all_reduce(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    mpi_comm *c = (mpi_comm *)b;
    const int S = b->size, r = b->rank;
    const size_t eb = kaon_comm_dtype_bytes(t);
    if (usable(c) || fits_int(count, "an all-reduce")) return -1;
    size_t lo, hi;
    kaon_comm_chunk(count, S, r, &lo, &hi);
    const size_t mine = hi - lo, per = (count + (size_t)S - 1) / (size_t)S;
    // [S, per] every rank's copy of this rank's chunk, then [per] their sum.
    unsigned char *s = scratch(c, (size_t)(S + 1) * per * eb);
    if (!s) return -1;
    int *cnt = c->ic, *dis = cnt + S, *rcnt = dis + S, *rdis = rcnt + S;
    chunk_ints(c, count, cnt, dis);
    for (int q = 0; q < S; q++) rcnt[q] = (int)mine, rdis[q] = (int)(per * (size_t)q);
    MPI_Request rq;
    const MPI_Datatype dt = mpi_type(t);
    if (MPI_Ialltoallv(send, cnt, dis, dt, s, rcnt, rdis, dt, c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI all_reduce (all-to-all) failed");
    if (wait_done(c, &rq, "all_reduce (all-to-all)")) return -1;
    const void **in = c->in;
    for (int q = 0; q < S; q++) in[q] = s + (size_t)q * per * eb;
    unsigned char *sum = s + (size_t)S * per * eb;
    kaon_comm_reduce(in, S, 0, sum, 0, 0, mine, t);
    if (MPI_Iallgatherv(sum, (int)mine, dt, recv, cnt, dis, dt, c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI all_reduce (all-gather) failed");
    return wait_done(c, &rq, "all_reduce (all-gather)");
}

static int m_all_gather(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    mpi_comm *c = (mpi_comm *)b;
    if (usable(c) || fits_int(count, "an all-gather")) return -1;
    const size_t bytes = count * kaon_comm_dtype_bytes(t);
    const void *src = send == (const unsigned char *)recv + (size_t)b->rank * bytes ? MPI_IN_PLACE : send;
    MPI_Request rq;
    if (MPI_Iallgather(src, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI all_gather failed");
    return wait_done(c, &rq, "all_gather");
}

static int m_reduce_scatter(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    mpi_comm *c = (mpi_comm *)b;
    const int S = b->size;
    const size_t eb = kaon_comm_dtype_bytes(t);
    if (usable(c) || fits_int(count, "a reduce-scatter")) return -1;
    unsigned char *s = scratch(c, (size_t)S * count * eb);
    if (!s) return -1;
    MPI_Request rq;
    if (MPI_Ialltoall(send, (int)count, mpi_type(t), s, (int)count, mpi_type(t), c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI reduce_scatter failed");
    if (wait_done(c, &rq, "reduce_scatter")) return -1;
    const void **in = c->in;
    for (int q = 0; q < S; q++) in[q] = s + (size_t)q * count * eb;
    kaon_comm_reduce(in, S, 0, recv, 0, 0, count, t);
    return 0;
}

// The counts are checked first (MPI's behaviour on a mismatch is undefined): every rank learns
// what each other sends it, and all of them fail together when any pair disagrees.
static int m_all_to_allv(kaon_comm *b, const void *send, const size_t *send_counts, const size_t *send_offs,
                         void *recv, const size_t *recv_counts, const size_t *recv_offs, kaon_comm_dtype t) {
    mpi_comm *c = (mpi_comm *)b;
    const int S = b->size, r = b->rank;
    if (usable(c)) return -1;
    uint64_t *mine = c->counts, *theirs = mine + S;
    int bad = 0, any_bad = 0;
    for (int q = 0; q < S; q++) {
        mine[q] = send_counts[q];
        if (send_counts[q] > (size_t)INT_MAX || send_offs[q] > (size_t)INT_MAX || recv_counts[q] > (size_t)INT_MAX ||
            recv_offs[q] > (size_t)INT_MAX)
            bad = 1;
    }
    MPI_Request rq;
    if (MPI_Ialltoall(mine, 1, MPI_UINT64_T, theirs, 1, MPI_UINT64_T, c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI all_to_allv (counts) failed");
    if (wait_done(c, &rq, "all_to_allv (counts)")) return -1;
    int from = -1;
    for (int q = 0; q < S && from < 0; q++)
        if (theirs[q] != recv_counts[q]) from = q;
    bad |= from >= 0;
    if (MPI_Iallreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI all_to_allv (check) failed");
    if (wait_done(c, &rq, "all_to_allv (check)")) return -1;
    if (from >= 0)
        return kaon_set_error("comm: all_to_allv: rank %d sends %llu elements to rank %d, which expects %zu", from,
                              (unsigned long long)theirs[from], r, recv_counts[from]);
    if (any_bad) return kaon_set_error("comm: all_to_allv: another rank's counts disagree or exceed MPI's ints");
    int *sc = c->ic, *so = sc + S, *rc = so + S, *ro = rc + S;
    for (int q = 0; q < S; q++)
        sc[q] = (int)send_counts[q], so[q] = (int)send_offs[q], rc[q] = (int)recv_counts[q], ro[q] = (int)recv_offs[q];
    const MPI_Datatype dt = mpi_type(t);
    if (MPI_Ialltoallv(send, sc, so, dt, recv, rc, ro, dt, c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI all_to_allv failed");
    return wait_done(c, &rq, "all_to_allv");
}

static int m_broadcast(kaon_comm *b, void *buf, size_t count, kaon_comm_dtype t, int root) {
    mpi_comm *c = (mpi_comm *)b;
    if (root < 0 || root >= b->size) return kaon_set_error("comm: broadcast from rank %d of %d", root, b->size);
    if (usable(c) || fits_int(count, "a broadcast")) return -1;
    MPI_Request rq;
    if (MPI_Ibcast(buf, (int)count, mpi_type(t), root, c->comm, &rq) != MPI_SUCCESS)
        return kaon_set_error("comm: MPI broadcast failed");
    return wait_done(c, &rq, "broadcast");
}

static int m_barrier(kaon_comm *b) {
    mpi_comm *c = (mpi_comm *)b;
    if (usable(c)) return -1;
    MPI_Request rq;
    if (MPI_Ibarrier(c->comm, &rq) != MPI_SUCCESS) return kaon_set_error("comm: MPI barrier failed");
    return wait_done(c, &rq, "barrier");
}

static void m_abort(kaon_comm *b, const char *why) {
    mpi_comm *c = (mpi_comm *)b;
    if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return;
    snprintf(c->why, sizeof c->why, "%s", why ? why : "");
    __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
}

static int m_recover(kaon_comm *b) {
    mpi_comm *c = (mpi_comm *)b;
    if (!__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return 0;
    return kaon_set_error("comm: an aborted MPI communicator cannot be used again (%s)", c->why);
}

static void m_destroy(kaon_comm *b) {
    mpi_comm *c = (mpi_comm *)b;
    // An aborted one may still have a collective pending: freeing it would be undefined.
    if (!c->aborted) MPI_Comm_free(&c->comm);
    free(c->scratch);
    free(c->ic);
    free(c->counts);
    free(c->in);
    free(c);
}

static const kaon_comm_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = m_all_reduce,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .all_to_allv = m_all_to_allv,
    .broadcast = m_broadcast,
    .barrier = m_barrier,
    .abort = m_abort,
    .recover = m_recover,
    .destroy = m_destroy,
};

kaon_comm *kaon_comm_mpi_create(void) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        kaon_set_error("comm: MPI is not started (this process was not launched by mpirun or srun)");
        return NULL;
    }
    mpi_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    c->ic = malloc(sizeof(int) * 4 * (size_t)size);
    c->counts = malloc(sizeof(uint64_t) * 2 * (size_t)size);
    c->in = malloc(sizeof(void *) * (size_t)size);
    if (!c->ic || !c->counts || !c->in || MPI_Comm_dup(MPI_COMM_WORLD, &c->comm) != MPI_SUCCESS) {
        free(c->ic), free(c->counts), free(c->in), free(c);
        kaon_set_error("comm: cannot make an MPI communicator");
        return NULL;
    }
    c->base.ops = &mpi_ops;
    c->base.rank = rank;
    c->base.size = size;
    return &c->base;
}
#else
kaon_comm *kaon_comm_mpi_create(void) {
    kaon_set_error("comm: this kaon was built without MPI (install libopenmpi-dev and rebuild)");
    return NULL;
}
#endif
