// Logit processing before sampling: logit_bias, min_tokens masking, and the repetition /
// presence / frequency penalties over a sequence's token counts.
#ifndef KAON_ENGINE_PENALTIES_H
#define KAON_ENGINE_PENALTIES_H

#include <stdint.h>

// A small token -> count map (open addressing), per sequence.
typedef struct kaon_token_counts {
    int32_t *keys;   // -1 empty
    int32_t *counts;
    uint32_t mask, size;
} kaon_token_counts;

void kaon_token_counts_free(kaon_token_counts *c);
int kaon_token_counts_add(kaon_token_counts *c, int32_t token, int32_t by);  // -1 on OOM
int32_t kaon_token_counts_get(const kaon_token_counts *c, int32_t token);

// HF repetition penalty over `seen` (prompt and output): positive logits are divided by it,
// negative ones multiplied. OpenAI presence/frequency penalties over `output`.
void kaon_apply_penalties(float *logits, const kaon_token_counts *seen,
                          const kaon_token_counts *output, float repetition, float presence,
                          float frequency);

#endif
