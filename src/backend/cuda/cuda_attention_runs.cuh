// Which tokens of a step are prefill runs (FA_MIN_RUN tokens of one sequence in a row): the
// rule k_fa_mark applies on the device (cuda_attention_prefill.cu) and begin_step on the host
// (the list of the other tokens, for the decode kernel of a step that is not graphed). One
// definition, so both sides always agree on every token.
#pragma once

#include <stdint.h>

#define FA_MIN_RUN 16  // tokens of one sequence in a row that go to the prefill kernel

// The validity test of the decode kernels (dec_range) and the split-K kernel.
__host__ __device__ __forceinline__ bool fa_tok_ok(const int32_t *pos, const int32_t *seq, int u, int n_seqs,
                                                   int max_blocks, int bs) {
    const int p = pos[u], s = seq[u];
    return p >= 0 && s >= 0 && s < n_seqs && p / bs < max_blocks;
}

// Whether valid token t belongs to a run: FA_MIN_RUN valid tokens of its sequence in a row
// around it in the flat batch.
__host__ __device__ __forceinline__ bool fa_in_run(const int32_t *pos, const int32_t *seq, int T, int t,
                                                   int n_seqs, int max_blocks, int bs) {
    const int s = seq[t];
    int n = 1;
    for (int u = t - 1; u >= 0 && n < FA_MIN_RUN; u--) {
        if (seq[u] != s || !fa_tok_ok(pos, seq, u, n_seqs, max_blocks, bs)) break;
        n++;
    }
    for (int u = t + 1; u < T && n < FA_MIN_RUN; u++) {
        if (seq[u] != s || !fa_tok_ok(pos, seq, u, n_seqs, max_blocks, bs)) break;
        n++;
    }
    return n >= FA_MIN_RUN;
}
