// The one-shot all-reduce over peer memory (allreduce_p2p.h says how it works and why).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "dist/allreduce_p2p.h"
#include "util/err.h"
}

// Every call runs the same blocks, so each block's call count (its flag value) stays the same
// on every rank; 64 blocks of 512 threads push a few MB at NVLink speed.
#define P2P_BLOCKS 64
#define P2P_THREADS 512
// A peer that never arrives (its rank failed): stop with an error rather than hang forever.
#define P2P_TIMEOUT_NS 120000000000ull

struct kaon_p2p_ar {
    int rank, size, device;
    size_t slot;          // bytes per (parity, source) slot
    char *stage;          // this rank's staging, written by the peers
    unsigned *flags;      // [size][P2P_BLOCKS], written by the peers
    unsigned *counts;     // [P2P_BLOCKS] this rank's call count per block
    char *peer_stage[KAON_P2P_AR_MAX_RANKS];
    unsigned *peer_flags[KAON_P2P_AR_MAX_RANKS];
};

typedef struct p2p_ptrs {
    char *stage[KAON_P2P_AR_MAX_RANKS];
    unsigned *flags[KAON_P2P_AR_MAX_RANKS];
} p2p_ptrs;

static __device__ __forceinline__ void flag_release(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ unsigned flag_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

template <typename T> struct lanes;
template <> struct lanes<float> {
    static constexpr int n = 4;
    static __device__ float get(const float *p, int i) { return p[i]; }
    static __device__ void put(float *p, int i, float v) { p[i] = v; }
};
template <> struct lanes<__nv_bfloat16> {
    static constexpr int n = 8;
    static __device__ float get(const __nv_bfloat16 *p, int i) { return __bfloat162float(p[i]); }
    static __device__ void put(__nv_bfloat16 *p, int i, float v) { p[i] = __float2bfloat16(v); }
};
template <> struct lanes<__half> {
    static constexpr int n = 8;
    static __device__ float get(const __half *p, int i) { return __half2float(p[i]); }
    static __device__ void put(__half *p, int i, float v) { p[i] = __float2half(v); }
};

// nvec 16-byte vectors; block b owns vectors [b * per, (b + 1) * per).
template <typename T>
__global__ void __launch_bounds__(P2P_THREADS) k_p2p_all_reduce(p2p_ptrs peers, int rank, int size, size_t slot,
                                                                unsigned *counts, const int4 *send, int4 *recv,
                                                                size_t nvec) {
    __shared__ unsigned s_call;
    const int b = blockIdx.x;
    if (threadIdx.x == 0) {
        s_call = counts[b] + 1;
        counts[b] = s_call;
    }
    __syncthreads();
    const unsigned call = s_call;
    const size_t par = call & 1u;
    const size_t per = (nvec + P2P_BLOCKS - 1) / P2P_BLOCKS;
    const size_t v0 = (size_t)b * per, v1 = v0 + per < nvec ? v0 + per : nvec;
    // 1. this rank's slice into every peer's staging slot for this rank
    for (size_t v = v0 + threadIdx.x; v < v1; v += P2P_THREADS) {
        const int4 x = send[v];
        for (int q = 0; q < size; q++)
            if (q != rank) ((int4 *)(peers.stage[q] + (par * size + rank) * slot))[v] = x;
    }
    __syncthreads();
    // 2. raise this block's flag on every peer (release: the stores above are seen first) and
    //    wait for every peer's flag of this call here (acquire)
    const int q = threadIdx.x;
    if (q < size && q != rank) {
        flag_release(peers.flags[q] + rank * P2P_BLOCKS + b, call);
        const unsigned *mine = peers.flags[rank] + q * P2P_BLOCKS + b;
        const uint64_t t0 = now_ns();
        while ((int)(flag_acquire(mine) - call) < 0)
            if (now_ns() - t0 > P2P_TIMEOUT_NS) {
                printf("kaon p2p all-reduce: rank %d waited 120 s for rank %d (block %d, call %u)\n", rank, q, b, call);
                __trap();
            }
    }
    __syncthreads();
    // 3. the slice summed in rank order (the same bits on every rank)
    const char *mine = peers.stage[rank] + par * size * slot;
    for (size_t v = v0 + threadIdx.x; v < v1; v += P2P_THREADS) {
        float acc[lanes<T>::n];
        for (int i = 0; i < lanes<T>::n; i++) acc[i] = 0.f;
        for (int r = 0; r < size; r++) {
            const int4 x = r == rank ? send[v] : __ldcg((const int4 *)(mine + (size_t)r * slot) + v);
            const T *e = (const T *)&x;
            for (int i = 0; i < lanes<T>::n; i++) acc[i] += lanes<T>::get(e, i);
        }
        int4 y;
        T *o = (T *)&y;
        for (int i = 0; i < lanes<T>::n; i++) lanes<T>::put(o, i, acc[i]);
        recv[v] = y;
    }
}

static int cuda_fail(cudaError_t e, const char *what) {
    return kaon_set_error("p2p all-reduce: %s: %s", what, cudaGetErrorString(e));
}

kaon_p2p_ar *kaon_p2p_ar_create(int rank, int size, int device, size_t max_bytes) {
    if (size < 2 || size > KAON_P2P_AR_MAX_RANKS || rank < 0 || rank >= size) {
        kaon_set_error("p2p all-reduce: rank %d of %d (2 to %d ranks)", rank, size, KAON_P2P_AR_MAX_RANKS);
        return NULL;
    }
    kaon_p2p_ar *p = (kaon_p2p_ar *)calloc(1, sizeof *p);
    if (!p) return NULL;
    p->rank = rank, p->size = size, p->device = device;
    p->slot = (max_bytes + 255) & ~(size_t)255;
    const size_t stage = 2 * (size_t)size * p->slot, flags = sizeof(unsigned) * (size_t)size * P2P_BLOCKS;
    cudaError_t e = cudaMalloc((void **)&p->stage, stage + flags + sizeof(unsigned) * P2P_BLOCKS);
    if (e != cudaSuccess) {
        cuda_fail(e, "cudaMalloc");
        free(p);
        return NULL;
    }
    p->flags = (unsigned *)(p->stage + stage);
    p->counts = p->flags + (size_t)size * P2P_BLOCKS;
    // Zero flags and counts before any peer can see the addresses (the caller's exchange).
    if ((e = cudaMemset(p->flags, 0, flags + sizeof(unsigned) * P2P_BLOCKS)) != cudaSuccess ||
        (e = cudaDeviceSynchronize()) != cudaSuccess) {
        cuda_fail(e, "clearing the flags");
        kaon_p2p_ar_free(p);
        return NULL;
    }
    return p;
}

void kaon_p2p_ar_local(const kaon_p2p_ar *p, uint64_t out[3]) {
    out[0] = (uint64_t)(uintptr_t)p->stage;
    out[1] = (uint64_t)(uintptr_t)p->flags;
    out[2] = (uint64_t)p->device;
}

int kaon_p2p_ar_connect(kaon_p2p_ar *p, const uint64_t *all) {
    for (int q = 0; q < p->size; q++) {
        p->peer_stage[q] = (char *)(uintptr_t)all[3 * q];
        p->peer_flags[q] = (unsigned *)(uintptr_t)all[3 * q + 1];
        const int dev = (int)all[3 * q + 2];
        // Ranks on one device (a test of the kernel on one GPU) need no peer access; both
        // kernels must then fit on the GPU at once, which 2 x P2P_BLOCKS blocks do.
        if (q == p->rank || dev == p->device) continue;
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, p->device, dev) != cudaSuccess || !can)
            return kaon_set_error("p2p all-reduce: device %d cannot reach device %d directly", p->device, dev);
        cudaError_t e = cudaDeviceEnablePeerAccess(dev, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();  // NCCL may have done it
        else if (e != cudaSuccess) return cuda_fail(e, "cudaDeviceEnablePeerAccess");
    }
    return 0;
}

int kaon_p2p_ar_fits(const kaon_p2p_ar *p, const void *send, const void *recv, size_t bytes) {
    return p && bytes && bytes <= p->slot && bytes % 16 == 0 && (uintptr_t)send % 16 == 0 && (uintptr_t)recv % 16 == 0;
}

int kaon_p2p_ar_run(kaon_p2p_ar *p, const void *send, void *recv, size_t count, int dtype, void *stream) {
    const size_t eb = dtype == 0 ? 4 : 2;
    if (!kaon_p2p_ar_fits(p, send, recv, count * eb) || dtype < 0 || dtype > 2)
        return kaon_set_error("p2p all-reduce: %zu elements of type %d do not fit", count, dtype);
    p2p_ptrs peers;
    memcpy(peers.stage, p->peer_stage, sizeof peers.stage);
    memcpy(peers.flags, p->peer_flags, sizeof peers.flags);
    const size_t nvec = count * eb / 16;
    cudaStream_t s = (cudaStream_t)stream;
    const int4 *x = (const int4 *)send;
    int4 *y = (int4 *)recv;
    if (dtype == 0)
        k_p2p_all_reduce<float><<<P2P_BLOCKS, P2P_THREADS, 0, s>>>(peers, p->rank, p->size, p->slot, p->counts, x, y, nvec);
    else if (dtype == 1)
        k_p2p_all_reduce<__nv_bfloat16><<<P2P_BLOCKS, P2P_THREADS, 0, s>>>(peers, p->rank, p->size, p->slot, p->counts, x, y,
                                                                           nvec);
    else
        k_p2p_all_reduce<__half><<<P2P_BLOCKS, P2P_THREADS, 0, s>>>(peers, p->rank, p->size, p->slot, p->counts, x, y, nvec);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(e, "launch");
}

void kaon_p2p_ar_free(kaon_p2p_ar *p) {
    if (!p) return;
    if (p->stage) {
        cudaSetDevice(p->device);
        cudaFree(p->stage);
    }
    free(p);
}
