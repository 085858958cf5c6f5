// Speculative decoding's proposers: draft tokens for a sequence from what it has so far.
// The engine verifies the drafts in its next forward pass (engine.c, scheduler.c).
#ifndef KAON_ENGINE_SPEC_H
#define KAON_ENGINE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "kaon.h"

enum kaon_spec_method { KAON_SPEC_OFF = 0, KAON_SPEC_NGRAM, KAON_SPEC_ORACLE, KAON_SPEC_MTP, KAON_SPEC_EAGLE3 };

typedef struct kaon_spec_oracle kaon_spec_oracle;

// The engine's resolved speculation settings.
typedef struct kaon_spec_config {
    enum kaon_spec_method method;
    int k;                     // drafts per step at most
    int ngram_min, ngram_max;  // prompt lookup: suffix lengths, longest tried first
    int disable_at;            // no drafts with this many sequences running (0: never off)
    kaon_spec_oracle *oracle;  // KAON_SPEC_ORACLE: the recorded outputs
    bool force_accept;         // benchmarks: drafts kept unverified (kaon.h)
} kaon_spec_config;

// Whether the method drafts with a model run by the engine after each step (spec_model.c):
// DeepSeek's MTP layer or an EAGLE-3 head.
static inline bool kaon_spec_has_draft_model(const kaon_spec_config *c) {
    return c->method == KAON_SPEC_MTP || c->method == KAON_SPEC_EAGLE3;
}

// Checks o and fills c with its defaults (the oracle's file is read: kaon_spec_config_free).
// 0, or -1 with kaon_last_error().
int kaon_spec_config_resolve(const kaon_speculative_options *o, kaon_spec_config *c);
void kaon_spec_config_free(kaon_spec_config *c);
int kaon_spec_oracle_attach(kaon_spec_config *c, const char *path);  // spec_oracle.c

// Oracle: drafts the recorded continuation of the prompt toks[0..n_prompt) when the output so
// far (toks[n_prompt..n)) follows it; at most k. Returns how many (0: none).
int kaon_spec_oracle_propose(const kaon_spec_oracle *o, const int32_t *toks, int n_prompt, int n, int k,
                             int32_t *out);

// Prompt lookup: finds the latest earlier occurrence of the longest suffix of toks[0..n)
// (lengths max_n down to min_n) and drafts the k tokens that followed it (continuing through
// the drafts themselves past the end) into out. Returns k, or 0 when nothing matches.
int kaon_spec_ngram_propose(const int32_t *toks, int n, int min_n, int max_n, int k, int32_t *out);

// Speculative sampling of a draft x drawn from q (spec_sample.c): returns x with probability
// min(1, p(x) / q(x)) (*accepted), else a draw from norm(max(0, p - q)); the result is
// distributed as p. p and q are whole distributions over n ids (kaon_sample_probs of the
// target's and the drafter's logits under the same sampling parameters). A one-hot q (a
// deterministic proposer) keeps x with probability p(x) and otherwise draws from p without x.
int32_t kaon_spec_accept(const float *p, const float *q, int n, int32_t x, kaon_rng *rng, bool *accepted);

#endif
