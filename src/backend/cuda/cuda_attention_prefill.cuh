// What the two prefill attention kernels share (cuda_attention_prefill.cu: mma.sync, every head
// dim; cuda_attention_prefill_wgmma.cu: Hopper wgmma, head_dim 128): the CTA's rows and the mark
// that tells them which tokens are theirs.
#pragma once

#define FA_BM 128         // rows per CTA: (token, query head of the group) pairs
#define FA_MARK (-2)      // position the split-K kernel sees for the prefill kernel's tokens
