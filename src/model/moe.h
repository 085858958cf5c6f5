// Mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3): their configuration from GGUF
// metadata, their weights found in whichever layout the file has, and their copies on a
// device backend. The forward pass (llama.c) hands a layer's kaon_moe_weights to the backend's
// moe op.
//
// Layouts of the experts' matrices, all turned into per-expert 2-D views [rows, cols]:
//   GGUF stacked   blk.N.ffn_{gate,up,down}_exps.weight          [E, ffn, dim] / [E, dim, ffn]
//   GGUF legacy    blk.N.ffn_{gate,up,down}.E.weight             [ffn, dim] / [dim, ffn]
//   HF per expert  ...experts.E.{w1,w3,w2 | gate_proj,up_proj,down_proj}.weight
// Shared experts: GGUF ffn_{gate,up,down}_shexp, HF shared_expert (Qwen2-MoE, gated by
// shared_expert_gate) or shared_experts (DeepSeek). DeepSeek-V3's selection bias: HF
// mlp.gate.e_score_correction_bias, GGUF exp_probs_b.bias.
//   HF fused (transformers 5)  ...experts.gate_up_proj [E, 2 ffn, dim], ...experts.down_proj
// A view is rows [row0, row0 + rows) of one source tensor, held as the weight of a kaon_linear
// (no bias; FP8 and INT4 views carry their scales); a device copy uploads each source once (one
// allocation per stacked tensor; FP8 experts as one FP8 layer per kind with its scales) and
// rebuilds the views on top of it.
#ifndef KAON_MODEL_MOE_H
#define KAON_MODEL_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/gguf.h"
#include "model/config.h"

struct kaon_model;

enum { KAON_MOE_GATE = 0, KAON_MOE_UP = 1, KAON_MOE_DOWN = 2 };

typedef struct kaon_moe_layer {
    kaon_moe_weights w;            // what the moe op gets; points into this struct
    kaon_linear router;            // [E, dim]
    kaon_linear *views;            // [3, E]: gate, up, down of each expert
    kaon_linear shared[3];         // shared expert gate, up, down (w.data NULL when absent)
    kaon_linear shared_gate_inp;   // [1, dim] (w.data NULL when absent)
    kaon_tensor score_bias;        // [E] f32 selection bias (DeepSeek-V3), data NULL when absent
    float *own_bias;               // score_bias widened to f32 at load (freed with the layer)
    kaon_tensor *src;              // [n_src] whole tensors the views are cut from (2-D)
    int n_src;
    int32_t *src_of;               // [3E] source of each view
    int64_t *row0;                 // [3E] first row of each view in its source
} kaon_moe_layer;

// GGUF metadata: <arch>.expert_count, expert_used_count, expert_feed_forward_length,
// expert_shared_feed_forward_length, expert_weights_norm (default: renormalise except qwen2moe).
void kaon_moe_config_from_gguf(const kaon_gguf *g, kaon_model_config *c);
// Whether layer l of a loaded model has experts (GGUF: by its tensors; HF: by the config).
bool kaon_moe_layer_wanted(const struct kaon_model *m, int l);
// Finds and checks layer l's MoE tensors; fills m->moe[l] (allocating m->moe when needed).
int kaon_moe_load_layer(struct kaon_model *m, int l);
// --load-format dummy: stacked placeholder sources of the config's shapes.
int kaon_moe_dummy_layer(struct kaon_model *m, int l);
void kaon_moe_free_model(struct kaon_model *m);

// Device copies: every source uploaded (or created: dummy) once, views rebuilt over them; a rank
// of expert parallelism ([e0, e1) set in host) uploads only its experts' rows.
int kaon_moe_upload(kaon_backend *be, const kaon_moe_layer *host, bool dummy, uint64_t seed,
                    kaon_moe_layer *dev);
void kaon_moe_release(kaon_backend *be, kaon_moe_layer *dev);
// Points dev->w at dev's own tensors (after a struct copy or a rebuild).
void kaon_moe_bind(kaon_moe_layer *l, const kaon_model_config *c);


// ---- for the runner ----
// Activation bytes the moe op of a device backend may add for a step of T tokens (an estimate
// for memory plans: routed rows and their expert outputs in the activation dtype).
size_t kaon_moe_act_bytes(const struct kaon_model *m, size_t elem_bytes, int T);

// Expert load counters: [n_layers, E] uint32 in backend memory, read back into 64-bit totals.
typedef struct kaon_moe_stats {
    int n_layers, n_experts;
    uint32_t *dev;      // backend memory (the op's counts)
    uint32_t *prev;     // host: the counters as last read
    uint64_t *total;    // host: totals since enabling
} kaon_moe_stats;

kaon_moe_stats *kaon_moe_stats_create(kaon_backend *be, const struct kaon_model *m);
void kaon_moe_stats_free(kaon_backend *be, kaon_moe_stats *s);
// Reads the counters (on the thread that runs the ops) into s->total. 0 or -1.
int kaon_moe_stats_read(kaon_backend *be, kaon_moe_stats *s);

#endif
