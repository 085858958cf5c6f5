// Extras of the CPU backend beyond backend.h, for tests, benchmarks and `kaon info`.
#ifndef KAON_BACKEND_CPU_CPU_H
#define KAON_BACKEND_CPU_CPU_H

#include "backend/backend.h"

// kaon_backend_cpu_create(n) uses n threads (its own pool, util/pool.h), at most the CPUs the
// process may run on (n <= 0: all of them); be->n_threads says how many it took.
//
// Which kernels kaon_backend_cpu_create chose: "scalar", "avx2" or "avx512vnni". The choice
// follows the CPU, lowered by the environment: KAON_CPU_NO_SIMD=1 forces "scalar",
// KAON_CPU_NO_AVX512=1 stops at "avx2". NULL when be is not a CPU backend.
const char *kaon_cpu_kernel_name(const kaon_backend *be);

// The backend's thread pool, for host work between steps; NULL when be is not a CPU backend.
struct kaon_pool *kaon_cpu_pool(const kaon_backend *be);

#endif
