// One row's RMSNorm into shared memory, bit for bit what kc_rmsnorm writes: for the GEMVs that
// fold a layer's norm into their prologue (cuda_linear.cu's k_gemv_norm / k_gemv_silu_norm and
// cuda_fp8.cu's k_fp8_gemv at batch 1).
#pragma once

#include "backend/cuda/cuda_internal.h"

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// xs = bf16(w * bf16(x / rms(x))) for one row of dim elements (dim % 8 == 0), bit for bit what
// kc_rmsnorm writes: its T threads (dim / 8 rounded up to a warp, at most 1024) each sum the
// squares of chunks t, t + T, ... of 8 elements, then a shuffle tree per warp and one over the
// warps' sums; here each of the block's threads plays the threads t = threadIdx.x + k blockDim.x.
// All of the block's threads must call it (it ends with __syncthreads).
static __device__ void norm_row_to_smem(const bf16 *x, int dim, const float *__restrict__ w, float eps,
                                        uint4 *xs) {
    __shared__ float red[33];
    const int nc = dim >> 3, lane = threadIdx.x & 31;
    int T = (nc + 31) / 32 * 32;
    T = T > 1024 ? 1024 : T;
    const uint4 *xr = (const uint4 *)x;
    for (int t0 = 0; t0 < T; t0 += blockDim.x) {  // T and blockDim.x are multiples of 32: warp-uniform
        const int t = t0 + (int)threadIdx.x;
        if (t >= T) break;
        float ss = 0.f;
        for (int j = t; j < nc; j += T) {
            uint4 v = __ldcg(xr + j);
            const bf16 *e = (const bf16 *)&v;
#pragma unroll
            for (int i = 0; i < 8; i++) ss += __bfloat162float(e[i]) * __bfloat162float(e[i]);
        }
        ss = warp_sum(ss);
        if (lane == 0) red[t >> 5] = ss;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = lane < T / 32 ? red[lane] : 0.f;
        v = warp_sum(v);
        if (lane == 0) red[32] = v;
    }
    __syncthreads();
    const float r = rsqrtf(red[32] / (float)dim + eps);
    for (int j = threadIdx.x; j < nc; j += blockDim.x) {
        uint4 v = __ldcg(xr + j);
        bf16 *e = (bf16 *)&v;
#pragma unroll
        for (int i = 0; i < 8; i++)
            e[i] = __float2bfloat16(w[8 * j + i] * __bfloat162float(__float2bfloat16(__bfloat162float(e[i]) * r)));
        xs[j] = v;
    }
    __syncthreads();
}

