// The AVX-512 VNNI instantiation of the x86 kernels (see cpu_x86.h): 256-bit registers,
// vpdpbusd for the u8 x s8 dot products. Only called after __builtin_cpu_supports said yes.
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "util/half.h"

#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#endif

#define KX(name) kx_vnni_##name
#define KX_ROWS 8
#define KX_VNNI 1
#define KX_NAME "avx512vnni"
#include "backend/cpu/cpu_x86.h"

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const kaon_cpu_kernels *kaon_cpu_kernels_vnni(void) { return &kx_vnni_kernels; }
#else
const kaon_cpu_kernels *kaon_cpu_kernels_vnni(void) { return NULL; }
#endif
