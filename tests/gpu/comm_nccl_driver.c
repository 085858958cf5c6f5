// comm_nccl_driver: the NCCL communicator (src/dist/comm_nccl.c) through kaon's own API, one
// thread per GPU in this process as the engine will run it (DESIGN.md), every collective in
// f32, bf16 and i32, checked on the host. tests/gpu/test_comm_nccl.py builds and runs it.
//
//   comm_nccl_driver [N]        N ranks on GPUs 0..N-1 (default 1: world size 1, the same code path)
//   comm_nccl_driver N bench    all-reduce time and bandwidth, bf16, 8 KB .. 256 MB, each size as
//                               a CUDA graph of back-to-back all-reduces (what a decode step does)
//   comm_nccl_driver N same [bench]  the one-shot kernel alone with N ranks on GPU 0 (no NCCL): its
//                               sums, parities and graph replays checked on a one-GPU machine
//
// Between GPUs that reach each other, all-reduces up to KAON_P2P_AR_MAX bytes take the one-shot
// peer-memory path (src/dist/allreduce_p2p.cu): the sizes below cover both paths, repeated calls
// (the staging's two parities) and a replayed CUDA graph (the call counts live on the device).
//
// Prints one line per rank ("rank R: ok" or the failures) and exits 0 when every check passed.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/allreduce_p2p.h"
#include "dist/comm.h"
#include "util/err.h"
#include "util/half.h"

#define MAXN 16
static unsigned char g_id[KAON_COMM_NCCL_ID_BYTES];
static int g_n = 1, g_bench = 0, g_same = 0;

typedef struct {
    int rank, failures;
    char msg[256];
} rank_arg;

static float val(int r, size_t i, int k) { return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)k * 3) % 17) - 8) * 0.5f + 0.25f * (float)r; }

static void wr(void *p, size_t i, float v, kaon_comm_dtype t) {
    if (t == KAON_COMM_BF16) ((uint16_t *)p)[i] = kaon_f32_to_bf16(v);
    else if (t == KAON_COMM_I32) ((int32_t *)p)[i] = (int32_t)(v * 4);
    else ((float *)p)[i] = v;
}
static float rd(const void *p, size_t i, kaon_comm_dtype t) {
    if (t == KAON_COMM_BF16) return kaon_bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == KAON_COMM_I32) return (float)((const int32_t *)p)[i];
    return ((const float *)p)[i];
}
static float stored(float v, kaon_comm_dtype t) {
    unsigned char b[4];
    wr(b, 0, v, t);
    return rd(b, 0, t);
}

// Ranks sharing one GPU (`same`) meet here after recording a graph, before replaying it: seen on
// an H100 (CUDA 13), a rank's graph capture / instantiation waited for the device while the
// other rank's replayed all-reduce spun on the device waiting for it, until the 120 s watchdog.
static pthread_barrier_t g_meet;
static void meet_if_same(void) {
    if (g_same) pthread_barrier_wait(&g_meet);
}

#define FAIL(...)                                                                   \
    do {                                                                            \
        if (a->failures++ == 0) snprintf(a->msg, sizeof a->msg, __VA_ARGS__);       \
    } while (0)

// All-reduces of bf16 and f32 at sizes on both sides of the one-shot limit, each repeated with
// new values (the staging alternates parities), in place and not; then one all-reduce recorded
// in a CUDA graph and replayed with new inputs. Exact sums (small multiples of 1/4).
static void sizes_and_graph(rank_arg *a, kaon_comm *c, cudaStream_t st) {
    const int r = a->rank, n = g_n;
    const size_t counts[] = {8, 4096, 64 * 4096, 1u << 20, 3u << 20};
    const size_t cap = (3u << 20) * 4;
    unsigned char *h = malloc(cap), *h2 = malloc(cap);
    void *d1 = NULL, *d2 = NULL;
    cudaMalloc(&d1, cap);
    cudaMalloc(&d2, cap);
    const int saved = c->stream_ordered;
    for (int ti = 0; ti < 2; ti++) {
        const kaon_comm_dtype t = ti ? KAON_COMM_F32 : KAON_COMM_BF16;
        const size_t eb = kaon_comm_dtype_bytes(t);
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++)
            for (int k = 0; k < 3; k++) {
                const size_t cnt = counts[ci];
                for (size_t i = 0; i < cnt; i++) wr(h, i, val(r, i, 10 + k), t);
                cudaMemcpyAsync(d1, h, cnt * eb, cudaMemcpyHostToDevice, st);
                void *out = k == 1 ? d1 : d2;
                if (c->ops->all_reduce(c, d1, out, cnt, t)) FAIL("all_reduce %zu: %s", cnt, kaon_last_error());
                cudaMemcpy(h2, out, cnt * eb, cudaMemcpyDeviceToHost);
                for (size_t i = 0; i < cnt; i++) {
                    float s = 0;
                    for (int q = 0; q < n; q++) s += stored(val(q, i, 10 + k), t);
                    if (rd(h2, i, t) != s) {
                        FAIL("all_reduce type %d count %zu call %d: [%zu] %g != %g", (int)t, cnt, k, i, rd(h2, i, t), s);
                        break;
                    }
                }
            }
    }
    // A graph of one bf16 all-reduce of 8 KB, replayed with new inputs.
    const size_t cnt = 4096;
    c->stream_ordered = 1;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    int rc = c->ops->all_reduce(c, d1, d2, cnt, KAON_COMM_BF16);
    if (cudaStreamEndCapture(st, &g) != cudaSuccess || rc || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess)
        FAIL("graph capture of an all-reduce failed: %s", rc ? kaon_last_error() : "cuda");
    meet_if_same();
    for (int k = 0; ge && k < 4; k++) {
        for (size_t i = 0; i < cnt; i++) wr(h, i, val(r, i, 20 + k), KAON_COMM_BF16);
        cudaMemcpyAsync(d1, h, cnt * 2, cudaMemcpyHostToDevice, st);
        cudaGraphLaunch(ge, st);
        cudaMemcpyAsync(h2, d2, cnt * 2, cudaMemcpyDeviceToHost, st);
        if (cudaStreamSynchronize(st) != cudaSuccess) FAIL("graph replay %d failed", k);
        for (size_t i = 0; i < cnt; i++) {
            float s = 0;
            for (int q = 0; q < n; q++) s += stored(val(q, i, 20 + k), KAON_COMM_BF16);
            if (rd(h2, i, KAON_COMM_BF16) != s) {
                FAIL("graph replay %d: [%zu] %g != %g", k, i, rd(h2, i, KAON_COMM_BF16), s);
                break;
            }
        }
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    c->stream_ordered = saved;
    cudaFree(d1);
    cudaFree(d2);
    free(h);
    free(h2);
}

// Rank 0 prints: bytes, microseconds per all-reduce, algorithm bandwidth (bytes / time) and bus
// bandwidth (x 2 (N - 1) / N, nccl-tests' convention), each size a graph of `it` all-reduces.
static void bench(rank_arg *a, kaon_comm *c, cudaStream_t st, size_t top) {
    void *d1 = NULL, *d2 = NULL;
    if (cudaMalloc(&d1, top) != cudaSuccess || cudaMalloc(&d2, top) != cudaSuccess) {
        FAIL("bench: cudaMalloc");
        return;
    }
    cudaMemset(d1, 0, top);
    c->stream_ordered = 1;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    if (a->rank == 0) printf("%12s %10s %10s %10s\n", "bytes", "us", "algbw GB/s", "busbw GB/s");
    for (size_t bytes = 8192; bytes <= top; bytes *= 4) {
        const int it = bytes <= ((size_t)1 << 20) ? 64 : bytes <= ((size_t)16 << 20) ? 16 : 4;
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        int rc = 0;
        for (int i = 0; i < it; i++) rc |= c->ops->all_reduce(c, d1, d2, bytes / 2, KAON_COMM_BF16);
        const int ok = cudaStreamEndCapture(st, &g) == cudaSuccess && !rc && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
        meet_if_same();
        if (!ok) {
            FAIL("bench: capture at %zu bytes", bytes);
            break;
        }
        for (int w = 0; w < 3; w++) cudaGraphLaunch(ge, st);
        const int reps = 5;
        cudaEventRecord(e0, st);
        for (int w = 0; w < reps; w++) cudaGraphLaunch(ge, st);
        cudaEventRecord(e1, st);
        if (cudaStreamSynchronize(st) != cudaSuccess) FAIL("bench: replay at %zu bytes", bytes);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1e3 / (reps * it), alg = (double)bytes / (us * 1e3);
        if (a->rank == 0)
            printf("%12zu %10.2f %10.2f %10.2f\n", bytes, us, alg, alg * 2.0 * (g_n - 1) / g_n);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(d1);
    cudaFree(d2);
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    const int r = a->rank, n = g_n;
    cudaSetDevice(r);
    cudaStream_t st = NULL;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    kaon_comm *c = kaon_comm_nccl_create(g_id, n, r, r, st);
    if (!c) {
        FAIL("create: %s", kaon_last_error());
        return NULL;
    }
    if (g_bench) {
        bench(a, c, st, (size_t)256 << 20);
        c->ops->destroy(c);
        return NULL;
    }
    sizes_and_graph(a, c, st);
    const size_t cnt = 4099;  // odd, not a multiple of anything
    const size_t cap = cnt * (size_t)n * 4;
    unsigned char *h = malloc(cap), *h2 = malloc(cap);
    void *d1 = NULL, *d2 = NULL;
    cudaMalloc(&d1, cap);
    cudaMalloc(&d2, cap);
    const kaon_comm_dtype types[] = {KAON_COMM_F32, KAON_COMM_BF16, KAON_COMM_I32};
    for (int ti = 0; ti < 3; ti++) {
        const kaon_comm_dtype t = types[ti];
        const size_t eb = kaon_comm_dtype_bytes(t);
        // all_reduce (in place)
        for (size_t i = 0; i < cnt; i++) wr(h, i, val(r, i, 0), t);
        cudaMemcpy(d1, h, cnt * eb, cudaMemcpyHostToDevice);
        if (c->ops->all_reduce(c, d1, d1, cnt, t)) FAIL("all_reduce: %s", kaon_last_error());
        cudaMemcpy(h2, d1, cnt * eb, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < cnt; i++) {
            float s = 0;  // exact: small multiples of 1/4
            for (int q = 0; q < n; q++) s += stored(val(q, i, 0), t);
            if (rd(h2, i, t) != s) {
                FAIL("all_reduce %d: [%zu] %g != %g", (int)t, i, rd(h2, i, t), s);
                break;
            }
        }
        // all_gather
        for (size_t i = 0; i < cnt; i++) wr(h, i, val(r, i, 1), t);
        cudaMemcpy(d1, h, cnt * eb, cudaMemcpyHostToDevice);
        if (c->ops->all_gather(c, d1, d2, cnt, t)) FAIL("all_gather: %s", kaon_last_error());
        cudaMemcpy(h2, d2, cnt * eb * (size_t)n, cudaMemcpyDeviceToHost);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < cnt; i++)
                if (rd(h2, (size_t)q * cnt + i, t) != stored(val(q, i, 1), t)) {
                    FAIL("all_gather %d: rank %d [%zu]", (int)t, q, i);
                    q = n;
                    break;
                }
        // reduce_scatter
        for (size_t i = 0; i < cnt * (size_t)n; i++) wr(h, i, val(r, i, 2), t);
        cudaMemcpy(d1, h, cnt * eb * (size_t)n, cudaMemcpyHostToDevice);
        if (c->ops->reduce_scatter(c, d1, d2, cnt, t)) FAIL("reduce_scatter: %s", kaon_last_error());
        cudaMemcpy(h2, d2, cnt * eb, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < cnt; i++) {
            float s = 0;
            for (int q = 0; q < n; q++) s += stored(val(q, (size_t)r * cnt + i, 2), t);
            if (rd(h2, i, t) != s) {
                FAIL("reduce_scatter %d: [%zu] %g != %g", (int)t, i, rd(h2, i, t), s);
                break;
            }
        }
        // broadcast from the last rank
        const int root = n - 1;
        for (size_t i = 0; i < cnt; i++) wr(h, i, val(r, i, 3), t);
        cudaMemcpy(d1, h, cnt * eb, cudaMemcpyHostToDevice);
        if (c->ops->broadcast(c, d1, cnt, t, root)) FAIL("broadcast: %s", kaon_last_error());
        cudaMemcpy(h2, d1, cnt * eb, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < cnt; i++)
            if (rd(h2, i, t) != stored(val(root, i, 3), t)) {
                FAIL("broadcast %d: [%zu]", (int)t, i);
                break;
            }
        // all_to_allv: rank r sends (r + q) % 5 + 1 elements to q, valued 1000 r + 10 q + i
        size_t sc[MAXN], so[MAXN], rc[MAXN], ro[MAXN], off = 0, roff = 0;
        for (int q = 0; q < n; q++) {
            sc[q] = (size_t)((r + q) % 5 + 1);
            so[q] = off;
            for (size_t i = 0; i < sc[q]; i++) wr(h, off + i, (float)(1000 * r + 10 * q) + (float)i, KAON_COMM_F32);
            off += sc[q];
            rc[q] = (size_t)((q + r) % 5 + 1);
            ro[q] = roff;
            roff += rc[q];
        }
        cudaMemcpy(d1, h, off * 4, cudaMemcpyHostToDevice);
        if (c->ops->all_to_allv(c, d1, sc, so, d2, rc, ro, KAON_COMM_F32)) FAIL("all_to_allv: %s", kaon_last_error());
        cudaMemcpy(h2, d2, roff * 4, cudaMemcpyDeviceToHost);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < rc[q]; i++)
                if (rd(h2, ro[q] + i, KAON_COMM_F32) != (float)(1000 * q + 10 * r) + (float)i) {
                    FAIL("all_to_allv: from %d [%zu]", q, i);
                    q = n;
                    break;
                }
        if (c->ops->barrier(c)) FAIL("barrier: %s", kaon_last_error());
    }
    cudaFree(d1);
    cudaFree(d2);
    free(h);
    free(h2);
    c->ops->destroy(c);
    cudaStreamDestroy(st);
    return NULL;
}

// ---- the one-shot kernel alone, every rank on GPU 0 ------------------------------------------
#define SAME_SLOT ((size_t)16 << 20)
static uint64_t g_local[3 * MAXN];

typedef struct same_comm {
    kaon_comm base;
    kaon_p2p_ar *ar;
    cudaStream_t st;
} same_comm;

static int same_all_reduce(kaon_comm *b, const void *send, void *recv, size_t count, kaon_comm_dtype t) {
    same_comm *c = (same_comm *)b;
    if (kaon_p2p_ar_run(c->ar, send, recv, count, (int)t, c->st)) return -1;
    if (c->base.stream_ordered || cudaStreamSynchronize(c->st) == cudaSuccess) return 0;
    return kaon_set_error("p2p all-reduce failed on the device");
}

static const kaon_comm_ops same_ops = {.name = "p2p-same-device", .all_reduce = same_all_reduce};

static void *same_main(void *p) {
    rank_arg *a = p;
    cudaSetDevice(0);
    same_comm c = {.base = {.ops = &same_ops, .rank = a->rank, .size = g_n}};
    cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking);
    c.ar = kaon_p2p_ar_create(a->rank, g_n, 0, SAME_SLOT);
    if (c.ar) kaon_p2p_ar_local(c.ar, g_local + 3 * a->rank);
    pthread_barrier_wait(&g_meet);
    if (!c.ar || kaon_p2p_ar_connect(c.ar, g_local)) {
        FAIL("set-up: %s", kaon_last_error());
        abort();  // the other ranks would wait for this one forever
    }
    if (g_bench) bench(a, &c.base, c.st, SAME_SLOT);
    else sizes_and_graph(a, &c.base, c.st);
    cudaStreamSynchronize(c.st);
    pthread_barrier_wait(&g_meet);  // nobody frees staging a peer may still write
    kaon_p2p_ar_free(c.ar);
    cudaStreamDestroy(c.st);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) g_n = atoi(argv[1]);
    for (int i = 2; i < argc; i++) {
        g_bench |= !strcmp(argv[i], "bench");
        g_same |= !strcmp(argv[i], "same");
    }
    int dev = 0;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || g_n < 1 || g_n > MAXN || (g_n > dev && !g_same)) {
        fprintf(stderr, "comm_nccl_driver: %d ranks asked, %d GPUs\n", g_n, dev);
        return 2;
    }
    if (g_same) pthread_barrier_init(&g_meet, NULL, (unsigned)g_n);
    if (!g_same && kaon_comm_nccl_unique_id(g_id)) {
        fprintf(stderr, "comm_nccl_driver: %s\n", kaon_last_error());
        return 1;
    }
    pthread_t th[MAXN];
    rank_arg args[MAXN];
    for (int r = 0; r < g_n; r++) {
        memset(&args[r], 0, sizeof args[r]);
        args[r].rank = r;
        pthread_create(&th[r], NULL, g_same ? same_main : rank_main, &args[r]);
    }
    int bad = 0;
    for (int r = 0; r < g_n; r++) {
        pthread_join(th[r], NULL);
        if (args[r].failures) printf("rank %d: %d failures, first: %s\n", r, args[r].failures, args[r].msg);
        else printf("rank %d: ok\n", r);
        bad += args[r].failures;
    }
    return bad ? 1 : 0;
}
