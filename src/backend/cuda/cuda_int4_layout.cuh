// The tiled INT4 layout of cuda_int4.cu (its top comment explains it), as host-and-device
// functions: the upload kernels call them, and tests/unit/test_cuda_int4_host.cu runs them on
// the CPU against an emulation of k_t4_gemv's lanes.
#ifndef KAON_CUDA_INT4_LAYOUT_CUH
#define KAON_CUDA_INT4_LAYOUT_CUH

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

#endif
