// The tiled INT4 layout of cuda_int4.cu (its top comment explains it), as host-and-device
// functions: the upload kernels call them, and tests/unit/test_cuda_int4_host.cu runs them on
// the CPU against an emulation of k_t4_gemv's lanes.
#ifndef KAON_CUDA_INT4_LAYOUT_CUH
#define KAON_CUDA_INT4_LAYOUT_CUH

#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Where column k of row m lives: the u32 word (index into the layer's words, Kc = 64-column
// chunks per row) and its nibble.
static __host__ __device__ __forceinline__ size_t t4_word(int64_t m, int k, int Kc, int *slot) {
    const int r = (int)(m & 15), o = k & 63, gid = r & 7, e = o & 3;
    const int lane = 4 * gid + ((o >> 3) & 3), j = 2 * (o >> 5) + ((o >> 2) & 1);
    *slot = (r >> 3) + 2 * (e >> 1) + 4 * (e & 1);
    return (((size_t)(m >> 4) * Kc + (k >> 6)) * 32 + lane) * 4 + j;
}

// Word i of the tiled layout from kaon's layout src [M, K/2] (low nibble first); rows and
// columns past the ends are 0. Word i is lane (i / 4) % 32, fragment j = i % 4 (half j / 2,
// sub-tile j % 2) of chunk (i / 128) % Kc of tile i / (128 Kc); its nibble s is row
// gid + 8 (s & 1), column 64 c + 32 h + 8 tid + 4 t + 2 ((s >> 1) & 1) + (s >> 2).
static __host__ __device__ __forceinline__ uint32_t t4_repack_word(const uint8_t *src, int64_t M, int K, int Kc,
                                                                   int64_t i) {
    const int j = (int)(i & 3), lane = (int)((i >> 2) & 31);
    const int64_t rc = i >> 7, rt = rc / Kc;
    const int c = (int)(rc - rt * Kc);
    const int col = 64 * c + 32 * (j >> 1) + 8 * (lane & 3) + 4 * (j & 1);
    uint32_t w = 0;
    for (int s = 0; s < 8; s++) {
        const int64_t m = rt * 16 + (lane >> 2) + 8 * (s & 1);
        const int k = col + 2 * ((s >> 1) & 1) + (s >> 2);
        if (m < M && k < K) w |= (uint32_t)((src[m * (K / 2) + k / 2] >> (4 * (k & 1))) & 15u) << (4 * s);
    }
    return w;
}

// The second member of a row-group's pair: bf16x2 -(128 + z), as float bits (z an integer in
// [-127, 127]: exact in bf16).
static __host__ __device__ __forceinline__ float t4_nz(float z) {
    const float v = -(128.f + z);
    uint32_t u;
    memcpy(&u, &v, 4);
    u >>= 16;
    u |= u << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

// The compact form of a row-group's pair (KAON_T4_SZ16): one u32, the scale as f16 in the low
// half (only for scales f16 holds exactly: t4_sz16_exact) and bf16 -(128 + z) in the high half.
static __host__ __device__ __forceinline__ bool t4_sz16_exact(float s) {
    return __half2float(__float2half_rn(s)) == s;
}
static __host__ __device__ __forceinline__ uint32_t t4_sz16(float s, float z) {
    const __half h = __float2half_rn(s);
    unsigned short hb;
    memcpy(&hb, &h, 2);
    const float nz = t4_nz(z);
    uint32_t u;
    memcpy(&u, &nz, 4);
    return (uint32_t)hb | (u & 0xFFFF0000u);
}
// Its scale, and its bf16x2 -(128 + z) (the high half in both halves): what the float2 form holds.
static __host__ __device__ __forceinline__ float t4_sz16_scale(uint32_t w) {
    const unsigned short hb = (unsigned short)(w & 0xFFFFu);
    __half h;
    memcpy(&h, &hb, 2);
    return __half2float(h);
}
static __host__ __device__ __forceinline__ uint32_t t4_sz16_nz(uint32_t w) {
#ifdef __CUDA_ARCH__
    return __byte_perm(w, 0u, 0x3232);  // one PRMT
#else
    return (w & 0xFFFF0000u) | (w >> 16);
#endif
}

#endif
