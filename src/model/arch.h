// An architecture, as one file in src/model/ declares it: the names it answers to, its config
// keys, its weight table, its KV-cache spec and its forward pass. registry.c lists them.
//
// Adding an architecture: write src/model/<arch>.c with a `const kaon_arch_ops kaon_arch_<x>`
// (see llama.c and gemma3.c), add it to the list in registry.c, and add tests. Nothing else
// changes: loading, dummy weights, upload, counts and `kaon info` all read the weight table.
#ifndef KAON_MODEL_ARCH_H
#define KAON_MODEL_ARCH_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "io/gguf.h"
#include "model/config.h"
#include "model/weights.h"

struct kaon_model;
struct kaon_fwd;
struct kaon_batch;

typedef struct kaon_arch_name {
    const char *name;   // HF `architectures[0]` or `model_type`, or GGUF general.architecture
    kaon_arch variant;  // what the forward pass tells apart within the file
} kaon_arch_name;

typedef struct kaon_arch_ops {
    const char *label;               // "llama"
    const kaon_arch_name *names;     // terminated by {NULL}
    // Keys of this architecture, read after the common ones (model/hf_config.c,
    // model/gguf_config.c) have filled the config. NULL: none.
    int (*hf_config)(const char *file, const cJSON *root, kaon_model_config *c);
    int (*gguf_config)(const kaon_gguf *g, kaon_model_config *c);
    // The weight table and the structs it points into.
    const kaon_weight_spec *weights;
    int n_weights;
    size_t globals_size, layer_size;
    // After the weights are loaded (e.g. RoPE tables from the config and rope_freqs). NULL: none.
    int (*prepare)(struct kaon_model *m);
    // KV cache elements one token needs in layer l, for K and for V. NULL: n_kv_heads * head_dim
    // each (GQA); MLA stores one latent vector.
    void (*kv_spec)(const kaon_model_config *c, int l, size_t *k_elems, size_t *v_elems);
    // Scratch activation elements per token the forward pass needs beyond kaon_acts' buffers
    // (a.scratch). NULL: none.
    size_t (*scratch_elems)(const kaon_model_config *c);
    // Whether backend be has every op the forward pass uses: 0, or -1 + error. NULL: yes.
    int (*supports)(const struct kaon_backend *be);
    // One step: embedding to the final hidden states, then kaon_blk_logits (model/blocks.h).
    void (*forward)(struct kaon_fwd *f, const struct kaon_batch *b);
    // The draft model's step (speculative decoding, MTP): token t_{p+1} at position p with the
    // hidden state f->hin row (the target's final normed hidden at p, or the draft's own from
    // its previous step) through the MTP layer, then logits for b's logit rows. NULL: none.
    void (*draft_forward)(struct kaon_fwd *f, const struct kaon_batch *b);
} kaon_arch_ops;

// The architecture that answers to name (HF class, model_type or GGUF arch); NULL + an error
// listing the supported names when none does. variant may be NULL.
const kaon_arch_ops *kaon_arch_find(const char *name, kaon_arch *variant);
// Every name kaon answers to, comma-separated (for messages and `kaon info`).
const char *kaon_arch_supported(void);
// Plugins (model/plugin.c). Whether a may join the registry: complete, and none of its names
// taken by a registered architecture or one of pending[0..n_pending). 0, or -1 + error.
int kaon_arch_check_new(const kaon_arch_ops *a, const kaon_arch_ops *const *pending, int n_pending);
// Adds ops[0..n) after the same checks: all of them, or none (-1 + error).
int kaon_arch_register(const kaon_arch_ops *const *ops, int n);

#endif
