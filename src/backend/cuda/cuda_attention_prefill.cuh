// What the two prefill attention kernels share (cuda_attention_prefill.cu: mma.sync, every head
// dim; cuda_attention_prefill_wgmma.cu: Hopper wgmma, head_dim 128): the CTA's rows and the mark
// that tells them which tokens are theirs, and how a CTA reads its window of tokens.
#pragma once

#include <stdint.h>

#define FA_BM 128         // rows per CTA: (token, query head of the group) pairs
#define FA_MARK (-2)      // position the split-K kernel sees for the prefill kernel's tokens

// A window of FA_BM tokens from t_base (ntok of them real) into shared memory, block-wide (ends
// with __syncthreads; threads 0 .. FA_BM - 1, whole warps, do the work): s_pos[i] and s_seq[i]
// of token t_base + i (seq -1: past ntok, or not marked FA_MARK for the prefill kernels), then
// bit i of s_start[w] / s_end[w] set when token 32 w + i starts / ends a run of one sequence.
static __device__ __forceinline__ void fa_window_tokens(int t_base, int ntok, const int32_t *__restrict__ pos,
                                                        const int32_t *__restrict__ mark,
                                                        const int32_t *__restrict__ seq, int *s_pos, int *s_seq,
                                                        unsigned *s_start, unsigned *s_end) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < FA_BM) {
        int sq = -1, p = -1;
        if (tid < ntok) {
            const int t = t_base + tid;
            p = pos[t];
            if (mark[t] == FA_MARK) sq = seq[t];
        }
        s_seq[tid] = sq;
        s_pos[tid] = p;
    }
    __syncthreads();
    if (tid < FA_BM) {  // warps 0-3, whole
        const int sq = s_seq[tid];
        const bool st = sq >= 0 && (tid == 0 || s_seq[tid - 1] != sq);
        const bool en = sq >= 0 && (tid == FA_BM - 1 || s_seq[tid + 1] != sq);
        const unsigned bst = __ballot_sync(0xffffffffu, st), ben = __ballot_sync(0xffffffffu, en);
        if (lane == 0) {
            s_start[warp] = bst;
            s_end[warp] = ben;
        }
    }
    __syncthreads();
}
