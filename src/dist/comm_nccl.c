// The NCCL communicator (comm.h): one GPU per rank, one thread per GPU in one process
// (DESIGN.md), each thread making its rank's communicator from one shared unique id
// (ncclCommInitRank). Buffers are device memory; each collective is enqueued on the rank's
// stream and waited for, so it returns with recv complete as the CPU one does. bf16 and f16
// are reduced by NCCL in its own order (not the CPU's rank order), except small all-reduces
// between GPUs that reach each other directly: those go one-shot over peer memory
// (allreduce_p2p.h: one kernel, rank-order sums), up to KAON_P2P_AR_MAX bytes (default 4 MiB
// for two ranks, 1 MiB for more; KAON_P2P_AR=0 turns it off).
#include <stdint.h>
#include <string.h>

#include "dist/allreduce_p2p.h"
#include "dist/comm.h"
#include "util/err.h"
#include "util/log.h"

#if defined(KAON_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

_Static_assert(sizeof(ncclUniqueId) <= KAON_COMM_NCCL_ID_BYTES, "ncclUniqueId must fit the id buffer");

typedef struct nccl_comm {
    kaon_comm base;
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    int own_stream;  // the stream was made here (none was given)
    kaon_p2p_ar *p2p;  // the one-shot all-reduce; NULL: NCCL for every size
    int aborted;       // ncclCommAbort was called (from any thread): comm is gone
} nccl_comm;

// After an abort every collective fails at once (the communicator must not be used again).
static int gone(nccl_comm *c) {
    if (!__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return 0;
    return kaon_set_error("comm: aborted (rank %d's NCCL communicator)", c->base.rank);
}

static ncclDataType_t nccl_type(kaon_comm_dtype t) {
    switch (t) {
    case KAON_COMM_BF16: return ncclBfloat16;
    case KAON_COMM_F16: return ncclFloat16;
    case KAON_COMM_I32: return ncclInt32;
    default: return ncclFloat32;
    }
}

static int nccl_check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return 0;
    return kaon_set_error("comm: %s: %s", what, ncclGetErrorString(r));
}

// Waits for this rank's stream (the collective's result is then in recv), unless the caller
// orders its work on that stream (kaon_comm.stream_ordered).
static int nccl_wait(nccl_comm *c, const char *what) {
    if (c->base.stream_ordered) return 0;
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess) return 0;
    return kaon_set_error("comm: %s: %s", what, cudaGetErrorString(e));
}

static int n_all_reduce(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    nccl_comm *c = (nccl_comm *)b;
    if (gone(c)) return -1;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (t != KAON_COMM_I32 && kaon_p2p_ar_fits(c->p2p, send, recv, count * kaon_comm_dtype_bytes(t))) {
        if (kaon_p2p_ar_run(c->p2p, send, recv, count, (int)t, c->stream)) return -1;
    } else if (nccl_check(ncclAllReduce(send, recv, count, nccl_type(t), ncclSum, c->comm, c->stream),
                          "ncclAllReduce")) {
        return -1;
    }
    return nccl_wait(c, "all_reduce");
}

static int n_all_gather(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    nccl_comm *c = (nccl_comm *)b;
    if (gone(c)) return -1;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (nccl_check(ncclAllGather(send, recv, count, nccl_type(t), c->comm, c->stream), "ncclAllGather")) return -1;
    return nccl_wait(c, "all_gather");
}

static int n_reduce_scatter(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    nccl_comm *c = (nccl_comm *)b;
    if (gone(c)) return -1;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (nccl_check(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, c->comm, c->stream),
                   "ncclReduceScatter"))
        return -1;
    return nccl_wait(c, "reduce_scatter");
}

// All-to-all(v) as grouped point-to-point sends and receives (NCCL has no all-to-allv).
static int n_all_to_allv(kaon_comm *b, const void *send, const size_t *send_counts, const size_t *send_offs,
                         void *recv, const size_t *recv_counts, const size_t *recv_offs, kaon_comm_dtype t) {
    nccl_comm *c = (nccl_comm *)b;
    if (gone(c)) return -1;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    const size_t eb = kaon_comm_dtype_bytes(t);
    const ncclDataType_t nt = nccl_type(t);
    if (nccl_check(ncclGroupStart(), "ncclGroupStart")) return -1;
    int fail = 0;
    for (int q = 0; q < b->size && !fail; q++) {
        if (send_counts[q])
            fail |= nccl_check(ncclSend((const char *)send + send_offs[q] * eb, send_counts[q], nt, q, c->comm,
                                        c->stream), "ncclSend");
        if (recv_counts[q] && !fail)
            fail |= nccl_check(ncclRecv((char *)recv + recv_offs[q] * eb, recv_counts[q], nt, q, c->comm, c->stream),
                               "ncclRecv");
    }
    if (nccl_check(ncclGroupEnd(), "ncclGroupEnd") || fail) return -1;
    return nccl_wait(c, "all_to_allv");
}

static int n_broadcast(kaon_comm *b, void *buf, size_t count, kaon_comm_dtype t, int root) {
    nccl_comm *c = (nccl_comm *)b;
    if (root < 0 || root >= b->size) return kaon_set_error("comm: broadcast from rank %d of %d", root, b->size);
    if (gone(c)) return -1;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (nccl_check(ncclBroadcast(buf, buf, count, nccl_type(t), root, c->comm, c->stream), "ncclBroadcast"))
        return -1;
    return nccl_wait(c, "broadcast");
}

// NCCL has no barrier: an all-reduce of one int on the rank's stream serves.
static int n_barrier(kaon_comm *b) {
    nccl_comm *c = (nccl_comm *)b;
    if (gone(c)) return -1;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    int32_t *d = NULL;
    if (cudaMalloc((void **)&d, sizeof *d) != cudaSuccess) return kaon_set_error("comm: barrier: cudaMalloc failed");
    int rc = nccl_check(ncclAllReduce(d, d, 1, ncclInt32, ncclSum, c->comm, c->stream), "barrier");
    if (!rc) rc = nccl_wait(c, "barrier");
    cudaFree(d);
    return rc;
}

static void n_destroy(kaon_comm *b) {
    nccl_comm *c = (nccl_comm *)b;
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->comm && !c->aborted) ncclCommDestroy(c->comm);  // (an abort freed it)
    kaon_p2p_ar_free(c->p2p);
    if (c->stream && c->own_stream) cudaStreamDestroy(c->stream);
    free(c);
}

// From the thread that drives the ranks while this rank's may be waiting on its stream: NCCL's
// abort ends its pending operations. (A rank inside the one-shot p2p kernel waits for its
// peers' flags until the kernel's watchdog: that path has no abort yet.)
static void n_abort(kaon_comm *b, const char *why) {
    nccl_comm *c = (nccl_comm *)b;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&c->aborted, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
    kaon_log(KAON_LOG_WARN, "comm: rank %d: aborting its NCCL communicator: %s", c->base.rank, why ? why : "");
    cudaSetDevice(c->device);
    ncclCommAbort(c->comm);
}

static int n_recover(kaon_comm *b) {
    nccl_comm *c = (nccl_comm *)b;
    if (!__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) return 0;
    return kaon_set_error("comm: rank %d's NCCL communicator was aborted and cannot be used again", c->base.rank);
}

static const kaon_comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = n_all_reduce,
    .all_gather = n_all_gather,
    .reduce_scatter = n_reduce_scatter,
    .all_to_allv = n_all_to_allv,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .abort = n_abort,
    .recover = n_recover,
    .destroy = n_destroy,
};

// Every rank joins (the exchanges are collectives). The ranks agree on the outcome: either
// all use the one-shot path or none does. A failure to set it up is logged, not fatal.
static void p2p_setup(nccl_comm *c) {
    const int n = c->base.size;
    const char *off = getenv("KAON_P2P_AR"), *mx = getenv("KAON_P2P_AR_MAX");
    size_t max_bytes = n == 2 ? (size_t)4 << 20 : (size_t)1 << 20;
    if (mx && *mx) max_bytes = (size_t)strtoull(mx, NULL, 10);
    if (n < 2 || n > KAON_P2P_AR_MAX_RANKS || (off && !strcmp(off, "0")) || !max_bytes) return;
    kaon_p2p_ar *p = kaon_p2p_ar_create(c->base.rank, n, c->device, max_bytes);
    uint64_t *d = NULL, h[3 * KAON_P2P_AR_MAX_RANKS + 1] = {0};
    int32_t ok = p != NULL;
    if (cudaMalloc((void **)&d, sizeof(uint64_t) * (3 * (size_t)n + 1)) != cudaSuccess) {
        // Cannot even exchange: every rank must still join the collectives below, so fail loudly.
        kaon_log(KAON_LOG_ERROR, "comm: rank %d: no memory for the p2p all-reduce setup", c->base.rank);
        abort();
    }
    if (p) kaon_p2p_ar_local(p, h + 3 * c->base.rank);
    // Copies on the rank's stream: the collectives after them run there.
    int fail = cudaMemcpyAsync(d + 3 * c->base.rank, h + 3 * c->base.rank, 3 * sizeof *h, cudaMemcpyHostToDevice,
                               c->stream) != cudaSuccess;
    fail |= ncclAllGather(d + 3 * c->base.rank, d, 3, ncclUint64, c->comm, c->stream) != ncclSuccess;
    fail |= cudaStreamSynchronize(c->stream) != cudaSuccess;
    fail |= cudaMemcpy(h, d, 3 * (size_t)n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess;
    for (int q = 0; q < n && !fail; q++) ok &= h[3 * q] != 0;
    if (ok && !fail && kaon_p2p_ar_connect(p, h)) {
        kaon_log(KAON_LOG_INFO, "comm: rank %d: %s", c->base.rank, kaon_last_error());
        ok = 0;
    }
    int32_t *agree = (int32_t *)(d + 3 * (size_t)n);
    ok &= !fail;
    fail |= cudaMemcpyAsync(agree, &ok, sizeof ok, cudaMemcpyHostToDevice, c->stream) != cudaSuccess;
    fail |= ncclAllReduce(agree, agree, 1, ncclInt32, ncclMin, c->comm, c->stream) != ncclSuccess;
    fail |= cudaStreamSynchronize(c->stream) != cudaSuccess;
    fail |= cudaMemcpy(&ok, agree, sizeof ok, cudaMemcpyDeviceToHost) != cudaSuccess;
    cudaFree(d);
    if (ok && !fail) {
        c->p2p = p;
        if (c->base.rank == 0)
            kaon_log(KAON_LOG_INFO, "comm: one-shot p2p all-reduce between %d GPUs up to %zu bytes", n, max_bytes);
    } else {
        kaon_p2p_ar_free(p);
    }
}

int kaon_comm_nccl_unique_id(unsigned char id[KAON_COMM_NCCL_ID_BYTES]) {
    ncclUniqueId u;
    if (nccl_check(ncclGetUniqueId(&u), "ncclGetUniqueId")) return -1;
    memset(id, 0, KAON_COMM_NCCL_ID_BYTES);
    memcpy(id, &u, sizeof u);
    return 0;
}

kaon_comm *kaon_comm_nccl_create(const unsigned char id[KAON_COMM_NCCL_ID_BYTES], int size, int rank, int device,
                                 void *stream) {
    if (size < 1 || rank < 0 || rank >= size) {
        kaon_set_error("comm: rank %d outside a group of %d", rank, size);
        return NULL;
    }
    if (cudaSetDevice(device) != cudaSuccess) {
        kaon_set_error("comm: cudaSetDevice(%d) failed", device);
        return NULL;
    }
    nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.ops = &nccl_ops;
    c->base.rank = rank;
    c->base.size = size;
    c->device = device;
    if (stream) {
        c->stream = (cudaStream_t)stream;
    } else if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
        kaon_set_error("comm: cannot create a CUDA stream on device %d", device);
        free(c);
        return NULL;
    } else {
        c->own_stream = 1;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    if (nccl_check(ncclCommInitRank(&c->comm, size, u, rank), "ncclCommInitRank")) {
        c->comm = NULL;
        if (c->own_stream) cudaStreamDestroy(c->stream);
        free(c);
        return NULL;
    }
    p2p_setup(c);
    return &c->base;
}

#else  // no NCCL in this build

int kaon_comm_nccl_unique_id(unsigned char id[KAON_COMM_NCCL_ID_BYTES]) {
    memset(id, 0, KAON_COMM_NCCL_ID_BYTES);
    return kaon_set_error("comm: built without NCCL (configure on a machine with CUDA and NCCL)");
}

kaon_comm *kaon_comm_nccl_create(const unsigned char id[KAON_COMM_NCCL_ID_BYTES], int size, int rank, int device,
                                 void *stream) {
    (void)id, (void)size, (void)rank, (void)device, (void)stream;
    kaon_set_error("comm: built without NCCL (configure on a machine with CUDA and NCCL)");
    return NULL;
}

#endif
