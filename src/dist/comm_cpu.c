// The CPU communicator (comm.h): the ranks are threads of one process and every buffer is host
// memory, so a collective is: each rank publishes its buffers' addresses, a barrier, each rank
// reads the others' buffers directly, a barrier (no one reuses a buffer another still reads).
// All-reduce is a reduce-scatter into the group's scratch (rank r sums chunk r over the ranks,
// in rank order) and an all-gather from it, so its work is spread over the ranks and it is
// safe in place; the sums are the same bits on every rank and in every run.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "dist/rank_barrier.h"
#include "dist/reduce.h"
#include "util/err.h"

struct kaon_comm_cpu_group {
    int size;
    pthread_mutex_t mu;        // the scratch's growth
    kaon_rank_barrier bar;
    const void **send;         // [size] published by each rank for the current collective
    void **recv;               // [size]
    const size_t **counts;     // [size] all_to_allv: each rank's send_counts
    const size_t **offs;       // [size] all_to_allv: each rank's send_offs
    unsigned char *scratch;    // all_reduce's reduced values, grown under mu
    size_t scratch_cap;
};

typedef struct cpu_comm {
    kaon_comm base;
    kaon_comm_cpu_group *g;
} cpu_comm;

static int barrier_wait(kaon_comm_cpu_group *g) { return kaon_rank_barrier_wait(&g->bar); }

static kaon_comm_cpu_group *grp(kaon_comm *c) { return ((cpu_comm *)c)->g; }

static int cpu_all_reduce(kaon_comm *c, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    kaon_comm_cpu_group *g = grp(c);
    const size_t eb = kaon_comm_dtype_bytes(t);
    int fail = 0;
    g->send[c->rank] = send;
    pthread_mutex_lock(&g->mu);
    if (g->scratch_cap < count * eb) {
        unsigned char *s = realloc(g->scratch, count * eb);
        if (s) {
            g->scratch = s;
            g->scratch_cap = count * eb;
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (barrier_wait(g)) return -1;
    if (g->scratch_cap < count * eb) {
        fail = 1;  // every rank sees the same capacity, so all of them fail alike
    } else {
        size_t lo, hi;
        kaon_comm_chunk(count, g->size, c->rank, &lo, &hi);
        kaon_comm_reduce(g->send, g->size, 0, g->scratch, 0, lo, hi, t);
    }
    if (barrier_wait(g)) return -1;
    if (!fail && count) memcpy(recv, g->scratch, count * eb);
    if (barrier_wait(g)) return -1;
    return fail ? kaon_set_error("comm: out of memory for an all-reduce of %zu elements", count) : 0;
}

static int cpu_all_gather(kaon_comm *c, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    kaon_comm_cpu_group *g = grp(c);
    const size_t bytes = count * kaon_comm_dtype_bytes(t);
    g->send[c->rank] = send;
    if (barrier_wait(g)) return -1;
    for (int q = 0; q < g->size; q++) {
        unsigned char *dst = (unsigned char *)recv + (size_t)q * bytes;
        if (bytes && dst != g->send[q]) memcpy(dst, g->send[q], bytes);
    }
    if (barrier_wait(g)) return -1;
    return 0;
}

static int cpu_reduce_scatter(kaon_comm *c, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    kaon_comm_cpu_group *g = grp(c);
    g->send[c->rank] = send;
    if (barrier_wait(g)) return -1;
    // Element i is read from every rank before recv[i] is written, and only this rank reads
    // its own chunk of the inputs, so recv may be that chunk.
    kaon_comm_reduce(g->send, g->size, (size_t)c->rank * count, recv, 0, 0, count, t);
    if (barrier_wait(g)) return -1;
    return 0;
}

static int cpu_all_to_allv(kaon_comm *c, const void *send, const size_t *send_counts, const size_t *send_offs,
                           void *recv, const size_t *recv_counts, const size_t *recv_offs, kaon_comm_dtype t) {
    kaon_comm_cpu_group *g = grp(c);
    const size_t eb = kaon_comm_dtype_bytes(t);
    const int r = c->rank;
    g->send[r] = send;
    g->counts[r] = send_counts;
    g->offs[r] = send_offs;
    if (barrier_wait(g)) return -1;
    int bad = -1;
    size_t bad_n = 0;  // read now: after the barrier below the sender may have left (its counts gone)
    for (int q = 0; q < g->size; q++) {
        const size_t n = g->counts[q][r];
        if (n != recv_counts[q]) {
            bad = q;
            bad_n = n;
            continue;
        }
        if (n) memcpy((unsigned char *)recv + recv_offs[q] * eb, (const unsigned char *)g->send[q] + g->offs[q][r] * eb,
               n * eb);
    }
    if (barrier_wait(g)) return -1;
    if (bad >= 0)
        return kaon_set_error("comm: all_to_allv: rank %d sends %zu elements to rank %d, which expects %zu", bad, bad_n, r,
                              recv_counts[bad]);
    return 0;
}

static int cpu_broadcast(kaon_comm *c, void *buf, size_t count, kaon_comm_dtype t, int root) {
    kaon_comm_cpu_group *g = grp(c);
    if (root < 0 || root >= g->size) return kaon_set_error("comm: broadcast from rank %d of %d", root, g->size);
    if (c->rank == root) g->send[root] = buf;
    if (barrier_wait(g)) return -1;
    if (c->rank != root && count) memcpy(buf, g->send[root], count * kaon_comm_dtype_bytes(t));
    if (barrier_wait(g)) return -1;
    return 0;
}

static int cpu_barrier(kaon_comm *c) { return barrier_wait(grp(c)); }

static void cpu_abort(kaon_comm *c, const char *why) { kaon_rank_barrier_abort(&grp(c)->bar, why); }

static int cpu_recover(kaon_comm *c) {
    kaon_rank_barrier_reset(&grp(c)->bar);
    return 0;
}

static void cpu_destroy(kaon_comm *c) { free(c); }

static const kaon_comm_ops cpu_ops = {
    .name = "cpu",
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
    .reduce_scatter = cpu_reduce_scatter,
    .all_to_allv = cpu_all_to_allv,
    .broadcast = cpu_broadcast,
    .barrier = cpu_barrier,
    .abort = cpu_abort,
    .recover = cpu_recover,
    .destroy = cpu_destroy,
};

kaon_comm_cpu_group *kaon_comm_cpu_group_create(int size) {
    if (size < 1) {
        kaon_set_error("comm: a group of %d ranks", size);
        return NULL;
    }
    kaon_comm_cpu_group *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->size = size;
    g->send = calloc((size_t)size, sizeof *g->send);
    g->recv = calloc((size_t)size, sizeof *g->recv);
    g->counts = calloc((size_t)size, sizeof *g->counts);
    g->offs = calloc((size_t)size, sizeof *g->offs);
    pthread_mutex_init(&g->mu, NULL);
    if (kaon_rank_barrier_init(&g->bar, size)) {
        pthread_mutex_destroy(&g->mu);
        free(g->send), free(g->recv), free(g->counts), free(g->offs), free(g);
        return NULL;
    }
    if (!g->send || !g->recv || !g->counts || !g->offs) {
        kaon_comm_cpu_group_free(g);
        kaon_set_error("comm: out of memory");
        return NULL;
    }
    return g;
}

void kaon_comm_cpu_group_free(kaon_comm_cpu_group *g) {
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    kaon_rank_barrier_destroy(&g->bar);
    free(g->send);
    free(g->recv);
    free(g->counts);
    free(g->offs);
    free(g->scratch);
    free(g);
}

kaon_comm *kaon_comm_cpu_create(kaon_comm_cpu_group *g, int rank) {
    if (!g || rank < 0 || rank >= g->size) {
        kaon_set_error("comm: rank %d outside a group of %d", rank, g ? g->size : 0);
        return NULL;
    }
    cpu_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.ops = &cpu_ops;
    c->base.rank = rank;
    c->base.size = g->size;
    c->g = g;
    return &c->base;
}
