// The end of a decode-attention block (cuda_attention_decode.cu, cuda_attention_decode_tc.cu).
#pragma once

#include "backend/cuda/cuda_internal.h"

#include <math.h>

#define DEC_MAX_SPLITS 64
// Launches of at most this many tokens (batch-1 decode, a few drafts) are shaped for latency:
// more warps a block, the tensor-core grid in one wave, deeper FP8 pipelines.
#define DEC_FEW_TOKENS 4

// The keys [k0, k1) of range z (of S) that a decode block of token t serves: the token's context
// (its window's last keys) cut into n_act ranges of at least min_keys; bt is the sequence's block
// table. Read from the step's metadata only, so a block may take it before kc_pdl_wait.
struct DecRange {
    int k0, k1, n_act;
    const int32_t *bt;
};
__device__ __forceinline__ DecRange dec_range(const int32_t *pos, const int32_t *seq, const int32_t *tables, int t,
                                              int z, int S, int n_seqs, int max_blocks, int bs, int window,
                                              int min_keys) {
    const int p = ld_meta(pos + t), sq = ld_meta(seq + t);
    const bool ok = p >= 0 && sq >= 0 && sq < n_seqs && p / bs < max_blocks;
    const int lo = ok && window > 0 && p >= window ? p - window + 1 : 0;  // the first key
    const int len = ok ? p + 1 - lo : 0;
    int n_act = (len + min_keys - 1) / min_keys;
    n_act = n_act < 1 ? 1 : (n_act > S ? S : n_act);
    const int chunk = (len + n_act - 1) / n_act;
    const int r0 = min(len, z * chunk);
    return DecRange{lo + r0, lo + min(len, r0 + chunk), n_act, tables + (size_t)(ok ? sq : 0) * max_blocks};
}

// The block's end, shared by the decode kernels: the W warps' (max, sum, output) of each of the
// g heads, in shared memory as wm/wl [W][G] and wacc [W][G][HD] (log2 units), are merged; one
// range writes out, a split context leaves its partial and the last range to finish merges them.
// t: the token (its output rows); pt: its index among the launch's tokens (partials, counters).
template <int HD, int G, int W>
__device__ __forceinline__ void dec_finish(const float *wm, const float *wl, const float *wacc, float *w_s,
                                           int *last_flag, int t, int pt, int kvh, int z, int S, int n_act, int nh,
                                           int nkv, int g, float vs, bf16 *__restrict__ out,
                                           float *__restrict__ part, unsigned *__restrict__ count) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t stride = (size_t)HD + 2;
    for (int i = tid; i < g * HD; i += W * 32) {
        const int h = i / HD, d = i % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) M = fmaxf(M, wm[w * G + h]);
        float L = 0.f, O = 0.f;
#pragma unroll
        for (int w = 0; w < W; w++) {
            if (wm[w * G + h] == -INFINITY) continue;
            const float f = exp2f(wm[w * G + h] - M);
            L += f * wl[w * G + h];
            O += f * wacc[(w * G + h) * HD + d];
        }
        const size_t hk = (size_t)kvh * g + h;  // the head among the token's
        if (n_act == 1) {
            out[((size_t)t * nh + hk) * HD + d] = __float2bfloat16(L > 0.f ? O / L * vs : 0.f);
        } else {
            float *pp = part + (((size_t)pt * nh + hk) * S + z) * stride;
            pp[d] = O * vs;
            if (d == 0) {
                pp[HD] = M;
                pp[HD + 1] = L;
            }
        }
    }
    if (n_act == 1) return;

    // Split context: the last range to finish merges the partials.
    __threadfence();
    __syncthreads();
    unsigned *cnt = count + (size_t)pt * nkv + kvh;
    if (tid == 0) *last_flag = atomicAdd(cnt, 1u) == (unsigned)(n_act - 1);
    __syncthreads();
    if (!*last_flag) return;
    __threadfence();
    for (int h = warp; h < g; h += W) {
        const float *pb = part + ((size_t)pt * nh + (size_t)kvh * g + h) * S * stride;
        const float m0 = lane < n_act ? __ldcg(pb + lane * stride + HD) : -INFINITY;
        const float m1 = lane + 32 < n_act ? __ldcg(pb + (lane + 32) * stride + HD) : -INFINITY;
        float M = fmaxf(m0, m1);
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float e0 = m0 == -INFINITY ? 0.f : exp2f(m0 - M);
        const float e1 = m1 == -INFINITY ? 0.f : exp2f(m1 - M);
        const float l0 = lane < n_act ? __ldcg(pb + lane * stride + HD + 1) : 0.f;
        const float l1 = lane + 32 < n_act ? __ldcg(pb + (lane + 32) * stride + HD + 1) : 0.f;
        float L = e0 * l0 + e1 * l1;
        for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        const float inv = L > 0.f ? 1.f / L : 0.f;
        if (lane < n_act) w_s[h * DEC_MAX_SPLITS + lane] = e0 * inv;
        if (lane + 32 < n_act) w_s[h * DEC_MAX_SPLITS + lane + 32] = e1 * inv;
    }
    __syncthreads();
    for (int i = tid; i < g * HD; i += W * 32) {
        const int h = i / HD, d = i % HD;
        const size_t head = (size_t)t * nh + (size_t)kvh * g + h;
        const float *pb = part + ((size_t)pt * nh + (size_t)kvh * g + h) * S * stride;
        float o = 0.f;
#pragma unroll 8
        for (int zz = 0; zz < n_act; zz++) o = fmaf(w_s[h * DEC_MAX_SPLITS + zz], __ldcg(pb + zz * stride + d), o);
        out[head * HD + d] = __float2bfloat16(o);
    }
    if (tid == 0) *cnt = 0u;
}
