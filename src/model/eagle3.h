// EAGLE-3 draft heads (speculative decoding's "eagle3"): one Llama layer trained to predict the
// target's next tokens from three of the target's hidden states. The head is a model of its
// own (architecture kaon_arch_eagle3, its folder's config and weights) attached to the target
// (kaon_model.eagle3); the target's runner gives it one more KV layer in the same block pool.
//
// The step (eagle3.c draft_forward), row t = token t_{p+1} at position p:
//   g   = fc([a_0 | a_1 | a_2])  the target's hidden states entering aux_layers[] at p (pass 1)
//       or the head's own output h' at p - 1 (chained passes)
//   x   = [input_layernorm(embed(t_{p+1})) | hidden_norm(g)]      (2 hidden)
//   h   = g + o_proj(attention(q/k/v_proj(x)))                     (RoPE at p, the head's cache)
//         (hidden_norm(g) + ... when the config sets norm_before_residual, as vLLM reads it)
//   h'  = h + mlp(post_attention_layernorm(h))                      (fed back, before the norm)
//   logits = lm_head(norm(h')) over the draft vocabulary; draft id d is target id d + d2t[d].
#ifndef KAON_MODEL_EAGLE3_H
#define KAON_MODEL_EAGLE3_H

#include <stdint.h>

struct kaon_model;

typedef struct kaon_eagle3 {
    struct kaon_model *head;  // owned
    int32_t *d2t;             // [draft_vocab_size]: target id = d + d2t[d]
    int aux_layers[3];        // the target layers whose input hidden states fc reads
} kaon_eagle3;

// Loads the head folder path (its config.json and weights; random weights when the target is
// a dummy model) and attaches it to target, a Llama-family model with dense layers.
// 0, or -1 + error (no folder, a head that does not fit the target).
int kaon_eagle3_attach(struct kaon_model *target, const char *path);
void kaon_eagle3_free(kaon_eagle3 *e);

// The target id of draft id d (d in [0, draft_vocab_size)).
static inline int32_t kaon_eagle3_target_id(const kaon_eagle3 *e, int32_t d) { return d + e->d2t[d]; }

#endif
