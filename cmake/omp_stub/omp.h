// Stand-in for <omp.h> when kaon is built with -DKAON_OPENMP=OFF (the ThreadSanitizer build:
// libgomp is not TSan-instrumented, so its barriers look like races). The `#pragma omp` lines
// are then ignored and every parallel loop runs on the calling thread.
#ifndef KAON_OMP_STUB_H
#define KAON_OMP_STUB_H

#include <unistd.h>

static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_num_procs(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

#endif
