// The NCCL communicator (comm.h): one GPU per rank, one thread per GPU in one process
// (DESIGN.md), each thread making its rank's communicator from one shared unique id
// (ncclCommInitRank). Buffers are device memory; each collective is enqueued on the rank's
// stream and waited for, so it returns with recv complete as the CPU one does. bf16 and f16
// are reduced by NCCL in its own order (not the CPU's rank order).
#include <string.h>

#include "dist/comm.h"
#include "util/err.h"

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
} nccl_comm;

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
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (nccl_check(ncclAllReduce(send, recv, count, nccl_type(t), ncclSum, c->comm, c->stream), "ncclAllReduce"))
        return -1;
    return nccl_wait(c, "all_reduce");
}

static int n_all_gather(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    nccl_comm *c = (nccl_comm *)b;
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (nccl_check(ncclAllGather(send, recv, count, nccl_type(t), c->comm, c->stream), "ncclAllGather")) return -1;
    return nccl_wait(c, "all_gather");
}

static int n_reduce_scatter(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    nccl_comm *c = (nccl_comm *)b;
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
    if (cudaSetDevice(c->device) != cudaSuccess) return kaon_set_error("comm: cudaSetDevice(%d) failed", c->device);
    if (nccl_check(ncclBroadcast(buf, buf, count, nccl_type(t), root, c->comm, c->stream), "ncclBroadcast"))
        return -1;
    return nccl_wait(c, "broadcast");
}

// NCCL has no barrier: an all-reduce of one int on the rank's stream serves.
static int n_barrier(kaon_comm *b) {
    nccl_comm *c = (nccl_comm *)b;
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
    if (c->comm) ncclCommDestroy(c->comm);
    if (c->stream && c->own_stream) cudaStreamDestroy(c->stream);
    free(c);
}

static const kaon_comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce = n_all_reduce,
    .all_gather = n_all_gather,
    .reduce_scatter = n_reduce_scatter,
    .all_to_allv = n_all_to_allv,
    .broadcast = n_broadcast,
    .barrier = n_barrier,
    .destroy = n_destroy,
};

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
