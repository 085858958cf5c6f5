// comm_nccl_driver: the NCCL communicator (src/dist/comm_nccl.c) through kaon's own API, one
// thread per GPU in this process as the engine will run it (DESIGN.md), every collective in
// f32, bf16 and i32, checked on the host. tests/gpu/test_comm_nccl.py builds and runs it.
//
//   comm_nccl_driver [N]     N ranks on GPUs 0..N-1 (default 1: world size 1, the same code path)
//
// Prints one line per rank ("rank R: ok" or the failures) and exits 0 when every check passed.
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "util/err.h"
#include "util/half.h"

#define MAXN 16
static unsigned char g_id[KAON_COMM_NCCL_ID_BYTES];
static int g_n = 1;

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

#define FAIL(...)                                                                   \
    do {                                                                            \
        if (a->failures++ == 0) snprintf(a->msg, sizeof a->msg, __VA_ARGS__);       \
    } while (0)

static void *rank_main(void *p) {
    rank_arg *a = p;
    const int r = a->rank, n = g_n;
    kaon_comm *c = kaon_comm_nccl_create(g_id, n, r, r, NULL);
    if (!c) {
        FAIL("create: %s", kaon_last_error());
        return NULL;
    }
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
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) g_n = atoi(argv[1]);
    int dev = 0;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || g_n < 1 || g_n > MAXN || g_n > dev) {
        fprintf(stderr, "comm_nccl_driver: %d ranks asked, %d GPUs\n", g_n, dev);
        return 2;
    }
    if (kaon_comm_nccl_unique_id(g_id)) {
        fprintf(stderr, "comm_nccl_driver: %s\n", kaon_last_error());
        return 1;
    }
    pthread_t th[MAXN];
    rank_arg args[MAXN];
    for (int r = 0; r < g_n; r++) {
        memset(&args[r], 0, sizeof args[r]);
        args[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &args[r]);
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
