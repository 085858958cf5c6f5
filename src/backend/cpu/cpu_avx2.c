// The AVX2+FMA+F16C instantiation of the x86 kernels (see cpu_x86.h). Only called after
// __builtin_cpu_supports said yes, so the rest of the library stays baseline x86-64.
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "util/half.h"

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define KX(name) kx_avx2_##name
#define KX_ROWS 4
#define KX_VNNI 0
#define KX_NAME "avx2"
#include "backend/cpu/cpu_x86.h"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const kaon_cpu_kernels *kaon_cpu_kernels_avx2(void) { return &kx_avx2_kernels; }
#else
const kaon_cpu_kernels *kaon_cpu_kernels_avx2(void) { return NULL; }
#endif
