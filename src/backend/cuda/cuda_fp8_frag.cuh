// mma fragments straight from e4m3 codes in shared memory (cuda_attention_decode_tc.cu's FP8
// path): shared loads, byte permutes, and the widening to f16 pairs in registers (one
// cvt.rn.f16x2.e4m3x2 per two codes; every e4m3 value is exact in f16).
#pragma once

#include <stdint.h>

namespace {

// volatile: the copies that fill the stage are asm too (cp.async), ordered by its wait.
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
    uint2 v;
    asm volatile("ld.shared.v2.b32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
    return v;
}

// Codes c0 c1 c2 c3 (byte 0 first) -> lo = f16x2 (c0, c1), hi = f16x2 (c2, c3) (the lower code in
// the lower half, as an mma fragment register wants its lower k).
__device__ __forceinline__ void e4m3x4_f16(uint32_t w, uint32_t &lo, uint32_t &hi) {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
}

// Interleaves the bytes of two words: (a0 b0 a1 b1) with lo, (a2 b2 a3 b3) with !lo; rows a and b
// of 4 columns become 2 column pairs, each a pair of rows.
__device__ __forceinline__ uint32_t zip_lo(uint32_t a, uint32_t b) { return __byte_perm(a, b, 0x5140); }
__device__ __forceinline__ uint32_t zip_hi(uint32_t a, uint32_t b) { return __byte_perm(a, b, 0x7362); }

}  // namespace
