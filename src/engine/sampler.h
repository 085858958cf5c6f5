// Token sampling on host logits: greedy, temperature, top-k, top-p, min-p, with a seeded
// per-request random stream (so a seeded request samples the same whatever else runs).
#ifndef KAON_ENGINE_SAMPLER_H
#define KAON_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "kaon.h"
#include "model/config.h"

// The model's generation_config.json defaults over s (kaon_engine_sampling_defaults).
void kaon_sampling_apply_generation_config(kaon_sampling *s, const kaon_model_config *c);

typedef struct kaon_rng {
    uint64_t s[2];
} kaon_rng;

void kaon_rng_seed(kaon_rng *r, uint64_t seed);
double kaon_rng_uniform(kaon_rng *r);  // [0, 1)

// Index of the largest logit (the first one on ties, like torch.argmax).
int kaon_argmax(const float *logits, int n);

// Samples one id from logits [n] by p's temperature, top_k, top_p and min_p (the rest of p is
// for the logit processing before). scratch must hold kaon_sample_scratch_bytes(n) bytes (2n
// (float, int32) pairs); logits are not modified.
int kaon_sample(const float *logits, int n, const kaon_sampling *p, kaon_rng *rng, void *scratch);
size_t kaon_sample_scratch_bytes(int n);
// The distribution kaon_sample draws from, whole: probs[i] for every id (0 where a filter
// removed it; one-hot at the argmax when greedy). For rejection sampling, which needs p and q.
void kaon_sample_probs(const float *logits, int n, const kaon_sampling *p, void *scratch, float *probs);

#endif
