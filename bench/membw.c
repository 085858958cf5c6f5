// Read bandwidth of this machine's memory, the ceiling of a decode step that streams weights:
// THREADS threads each sum their slice of a 1 GiB buffer (AVX2 loads, 4 accumulators), best of
// REPS passes; and one memcpy of 256 MiB on one thread.
//   cc -O2 -mavx2 -pthread bench/membw.c -o /tmp/membw && /tmp/membw [THREADS [REPS]]
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES ((size_t)1 << 30)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct { const char *p; size_t n; double sum; } slice;

static void *reader(void *arg) {
    slice *s = arg;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < s->n; i += 128) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps((const float *)(s->p + i)));
        a1 = _mm256_add_ps(a1, _mm256_load_ps((const float *)(s->p + i + 32)));
        a2 = _mm256_add_ps(a2, _mm256_load_ps((const float *)(s->p + i + 64)));
        a3 = _mm256_add_ps(a3, _mm256_load_ps((const float *)(s->p + i + 96)));
    }
    float v[8];
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    s->sum = v[0];
    return NULL;
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    char *buf = aligned_alloc(64, BYTES);
    memset(buf, 1, BYTES);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        pthread_t th[64];
        slice sl[64];
        const double t0 = now();
        for (int i = 0; i < nt; i++) {
            sl[i] = (slice){buf + BYTES / nt * i, BYTES / nt, 0};
            pthread_create(&th[i], NULL, reader, &sl[i]);
        }
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
        const double t = now() - t0;
        best = t < best ? t : best;
        printf("read %d threads: %.1f GB/s\n", nt, BYTES / t * 1e-9);
    }
    printf("best read %d threads: %.1f GB/s\n", nt, BYTES / best * 1e-9);
    const size_t cb = BYTES / 4;
    double t0 = now();
    memcpy(buf + cb * 2, buf, cb);
    double t = now() - t0;
    printf("memcpy 1 thread: %.1f GB/s (read + write)\n", 2.0 * cb / t * 1e-9);
    free(buf);
    return 0;
}
