// The same-device CUDA communicator (comm.h): ranks are threads whose buffers all live on one
// GPU, so a rank reads the others' buffers directly once they are published and complete.
// Correct and deterministic, not fast: a test aid for tensor parallelism on one GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dist/comm.h"
#include "util/err.h"
}
#include "dist/rank_barrier.h"

#define LOCAL_MAX_RANKS 16

struct kaon_comm_cuda_local_group {
    int size;
    kaon_rank_barrier barrier;
    const void *send[LOCAL_MAX_RANKS];  // each rank's input of the current collective
};

typedef struct local_comm {
    kaon_comm base;
    kaon_comm_cuda_local_group *g;
    int device;
    cudaStream_t stream;
    void *scratch;  // this rank's sum before it is copied out (grow-only)
    size_t scratch_bytes;
} local_comm;

typedef struct rank_ptrs {
    const void *p[LOCAL_MAX_RANKS];
} rank_ptrs;

static __device__ float load(const float *p, size_t i) { return p[i]; }
static __device__ float load(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
static __device__ float load(const __half *p, size_t i) { return __half2float(p[i]); }
static __device__ void store(float *p, size_t i, float v) { p[i] = v; }
static __device__ void store(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16(v); }
static __device__ void store(__half *p, size_t i, float v) { p[i] = __float2half(v); }

// out[i] = src[0][i] + src[1][i] + ... in rank order, f32 accumulation, one rounding.
template <typename T>
__global__ void sum_in_rank_order(rank_ptrs src, int n_ranks, size_t count, T *out) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float s = load((const T *)src.p[0], i);
        for (int r = 1; r < n_ranks; r++) s += load((const T *)src.p[r], i);
        store(out, i, s);
    }
}

static __global__ void sum_i32_in_rank_order(rank_ptrs src, int n_ranks, size_t count, int32_t *out) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        int32_t s = 0;
        for (int r = 0; r < n_ranks; r++) s += ((const int32_t *)src.p[r])[i];
        out[i] = s;
    }
}

static int cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    cudaGetLastError();
    return kaon_set_error("comm (same device): %s: %s", what, cudaGetErrorString(e));
}

// 0, or -1 once the group is aborted (comm.h: a rank that will not come).
static int meet(local_comm *c) { return kaon_rank_barrier_wait(&c->g->barrier); }

// Publishes send and waits until every rank's input is complete and published.
static int publish(local_comm *c, const void *send) {
    if (cuda_ok(cudaSetDevice(c->device), "cudaSetDevice") || cuda_ok(cudaStreamSynchronize(c->stream), "sync")) {
        meet(c);  // the others still meet us (their results are then wrong, and our error says why)
        meet(c);
        return -1;
    }
    c->g->send[c->base.rank] = send;
    return meet(c);
}

static int grow_scratch(local_comm *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return 0;
    if (c->scratch) cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_bytes = 0;
    if (cuda_ok(cudaMalloc(&c->scratch, bytes), "scratch")) return -1;
    c->scratch_bytes = bytes;
    return 0;
}

static int launch_sum(local_comm *c, size_t count, kaon_comm_dtype t) {
    rank_ptrs src;
    memset(&src, 0, sizeof src);
    for (int r = 0; r < c->base.size; r++) src.p[r] = c->g->send[r];
    const int threads = 256;
    const size_t want = (count + threads - 1) / threads;
    const int blocks = want < 4096 ? (int)(want ? want : 1) : 4096;
    const int n = c->base.size;
    switch (t) {
    case KAON_COMM_F32: sum_in_rank_order<<<blocks, threads, 0, c->stream>>>(src, n, count, (float *)c->scratch); break;
    case KAON_COMM_BF16:
        sum_in_rank_order<<<blocks, threads, 0, c->stream>>>(src, n, count, (__nv_bfloat16 *)c->scratch);
        break;
    case KAON_COMM_F16: sum_in_rank_order<<<blocks, threads, 0, c->stream>>>(src, n, count, (__half *)c->scratch); break;
    default: sum_i32_in_rank_order<<<blocks, threads, 0, c->stream>>>(src, n, count, (int32_t *)c->scratch); break;
    }
    return cuda_ok(cudaGetLastError(), "sum kernel");
}

static int l_all_reduce(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    local_comm *c = (local_comm *)b;
    const size_t bytes = count * kaon_comm_dtype_bytes(t);
    int rc = grow_scratch(c, bytes ? bytes : 1);
    if (publish(c, send)) return -1;
    if (!rc) rc = launch_sum(c, count, t);
    if (!rc) rc = cuda_ok(cudaStreamSynchronize(c->stream), "sum");
    if (meet(c)) return -1;  // every rank has read every input: recv (maybe an input) may be written now
    if (!rc) rc = cuda_ok(cudaMemcpyAsync(recv, c->scratch, bytes, cudaMemcpyDeviceToDevice, c->stream), "copy out");
    if (!rc) rc = cuda_ok(cudaStreamSynchronize(c->stream), "copy out");
    return rc;
}

static int l_all_gather(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    local_comm *c = (local_comm *)b;
    const size_t bytes = count * kaon_comm_dtype_bytes(t);
    if (publish(c, send)) return -1;
    int rc = 0;
    for (int q = 0; q < b->size && !rc; q++) {
        char *dst = (char *)recv + bytes * (size_t)q;
        if (dst != c->g->send[q])
            rc = cuda_ok(cudaMemcpyAsync(dst, c->g->send[q], bytes, cudaMemcpyDeviceToDevice, c->stream), "gather");
    }
    if (!rc) rc = cuda_ok(cudaStreamSynchronize(c->stream), "gather");
    if (meet(c)) return -1;  // nobody reads this rank's send any more
    return rc;
}

static int l_broadcast(kaon_comm *b, void *buf, size_t count, kaon_comm_dtype t, int root) {
    local_comm *c = (local_comm *)b;
    if (root < 0 || root >= b->size) return kaon_set_error("comm: broadcast from rank %d of %d", root, b->size);
    if (publish(c, buf)) return -1;
    int rc = 0;
    if (b->rank != root)
        rc = cuda_ok(cudaMemcpyAsync(buf, c->g->send[root], count * kaon_comm_dtype_bytes(t), cudaMemcpyDeviceToDevice,
                                     c->stream), "broadcast");
    if (!rc) rc = cuda_ok(cudaStreamSynchronize(c->stream), "broadcast");
    if (meet(c)) return -1;
    return rc;
}

static int l_barrier(kaon_comm *b) {
    local_comm *c = (local_comm *)b;
    if (publish(c, NULL)) return -1;
    return meet(c);
}

static void l_abort(kaon_comm *b, const char *why) { kaon_rank_barrier_abort(&((local_comm *)b)->g->barrier, why); }

static int l_recover(kaon_comm *b) {
    kaon_rank_barrier_reset(&((local_comm *)b)->g->barrier);
    return 0;
}

static int l_reduce_scatter(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    (void)b, (void)send, (void)recv, (void)count, (void)t;
    return kaon_set_error("comm (same device): reduce_scatter is not implemented (a test aid: all_reduce, "
                          "all_gather, broadcast, barrier)");
}

static int l_all_to_allv(kaon_comm *b, const void *send, const size_t *sc, const size_t *so, void *recv,
                         const size_t *rc, const size_t *ro, kaon_comm_dtype t) {
    (void)b, (void)send, (void)sc, (void)so, (void)recv, (void)rc, (void)ro, (void)t;
    return kaon_set_error("comm (same device): all_to_allv is not implemented (a test aid: all_reduce, "
                          "all_gather, broadcast, barrier)");
}

static void l_destroy(kaon_comm *b) {
    local_comm *c = (local_comm *)b;
    if (!c) return;
    if (c->scratch) {
        cudaSetDevice(c->device);
        cudaFree(c->scratch);
    }
    free(c);
}

static const kaon_comm_ops local_ops = {
    "cuda-same-device", l_all_reduce,     l_all_gather, l_reduce_scatter, l_all_to_allv, l_broadcast, l_barrier,
    l_abort,            l_recover,        l_destroy,
};

extern "C" kaon_comm_cuda_local_group *kaon_comm_cuda_local_group_create(int size) {
    if (size < 1 || size > LOCAL_MAX_RANKS) {
        kaon_set_error("comm (same device): %d ranks (1 to %d)", size, LOCAL_MAX_RANKS);
        return NULL;
    }
    kaon_comm_cuda_local_group *g = (kaon_comm_cuda_local_group *)calloc(1, sizeof *g);
    if (!g) return NULL;
    g->size = size;
    if (kaon_rank_barrier_init(&g->barrier, size)) {
        free(g);
        return NULL;
    }
    return g;
}

extern "C" void kaon_comm_cuda_local_group_free(kaon_comm_cuda_local_group *g) {
    if (!g) return;
    kaon_rank_barrier_destroy(&g->barrier);
    free(g);
}

extern "C" kaon_comm *kaon_comm_cuda_local_create(kaon_comm_cuda_local_group *g, int rank, int device, void *stream) {
    if (!g || rank < 0 || rank >= g->size) {
        kaon_set_error("comm (same device): rank %d outside the group", rank);
        return NULL;
    }
    local_comm *c = (local_comm *)calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.ops = &local_ops;
    c->base.rank = rank;
    c->base.size = g->size;
    c->g = g;
    c->device = device;
    c->stream = (cudaStream_t)stream;
    return &c->base;
}
