// The weight table: each architecture declares every weight it has once (GGUF and HF names, a
// symbolic shape, when it is present, how it is stored and sharded), and this one loader reads
// the table to load a file, make dummy weights, upload to a device, release, and count
// parameters and bytes. No other list of weights exists.
//
// A weight lives at `offset` inside the architecture's globals struct or inside each element of
// its per-layer struct array (a kaon_tensor, usually the `w` or `bias` of a kaon_linear). A
// weight set is one copy of those structs: the model's own (host, in place from the mapping)
// or a runner's device copies: the same table walks both.
#ifndef KAON_MODEL_WEIGHTS_H
#define KAON_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/linear.h"
#include "model/config.h"

struct kaon_model;
struct kaon_moe_layer;

// Symbolic dimensions of a shape, resolved against the config (kaon_weight_dim).
enum {
    KAON_DIM_NONE = 0,
    KAON_DIM_HIDDEN,     // hidden_size
    KAON_DIM_HIDDEN2,    // 2 * hidden_size (MTP's eh_proj input)
    KAON_DIM_VOCAB,      // vocab_size
    KAON_DIM_Q,          // n_heads * head_dim
    KAON_DIM_KV,         // n_kv_heads * head_dim
    KAON_DIM_HEAD,       // head_dim
    KAON_DIM_FFN,        // intermediate_size
    KAON_DIM_ROPE_HALF,  // rope_dim / 2
    // MLA (DeepSeek)
    KAON_DIM_Q_LORA,     // q_lora_rank
    KAON_DIM_KV_LORA,    // kv_lora_rank
    KAON_DIM_KV_A,       // kv_lora_rank + rope_dim (kv_a_proj_with_mqa's rows)
    KAON_DIM_KV_B,       // n_heads * (qk_nope_head_dim + v_head_dim) (kv_b_proj's rows)
    KAON_DIM_K_B,        // n_heads * kv_lora_rank (the absorbed W_UK^T, head by head)
    KAON_DIM_K_N,        // n_heads * qk_nope_head_dim (W_UK, head by head: expanded prefill)
    KAON_DIM_QK_NOPE,    // qk_nope_head_dim
    KAON_DIM_V_B,        // n_heads * v_head_dim (W_UV head by head; o_proj's input)
    // gpt-oss: per-head sinks, the router and stacked experts read as 2-D (FLAT3)
    KAON_DIM_HEADS,      // n_heads
    KAON_DIM_EXPERTS,    // n_experts
    KAON_DIM_EXP_FFN2,   // 2 * moe_intermediate_size (fused gate_up columns)
    KAON_DIM_EXP_HID,    // n_experts * hidden_size
    KAON_DIM_EXP_FFN,    // n_experts * moe_intermediate_size
    // EAGLE-3 heads
    KAON_DIM_HIDDEN3,    // 3 * hidden_size (fc's input: three of the target's hidden states)
    KAON_DIM_DRAFT_VOCAB,  // draft_vocab_size
};

// When a weight is in the file. REQUIRED-type conditions make it required when they hold and
// optional (used if present) otherwise; DENSE_MLP / MOE_MLP weights are absent from the other
// kind of layer.
typedef enum kaon_when {
    KAON_WHEN_ALWAYS = 0,
    KAON_WHEN_OPTIONAL,
    KAON_WHEN_ATTN_BIAS,   // cfg.attention_bias
    KAON_WHEN_QK_NORM,     // cfg.qk_norm
    KAON_WHEN_UNTIED,      // !cfg.tie_word_embeddings (the LM head)
    KAON_WHEN_DENSE_MLP,   // the layer has a dense MLP
    KAON_WHEN_MOE_MLP,     // the layer has experts
    KAON_WHEN_Q_LORA,      // q_lora_rank > 0 (absent otherwise)
    KAON_WHEN_NO_Q_LORA,   // q_lora_rank == 0 (absent otherwise)
    KAON_WHEN_SOURCE,      // optional in a file, read by the architecture's prepare; absent in dummy models
    KAON_WHEN_DERIVED,     // optional in a file (prepare makes it when absent); created in dummy models
    KAON_WHEN_MTP,         // the MTP layers (l >= n_layers - n_mtp_layers) only
} kaon_when;

enum {
    KAON_W_NORM = 1 << 0,         // a norm's scale vector (dummy values near 1)
    KAON_W_F32 = 1 << 1,          // a vector widened to f32 at load (biases)
    KAON_W_PLUS_ONE_HF = 1 << 2,  // HF files store w and compute with 1 + w (Gemma): folded at load
    KAON_W_HOST = 1 << 3,         // read on the host at load only (e.g. rope_freqs); never uploaded
    KAON_W_EXPERTS = 1 << 4,      // the layer's experts, found by model/moe.c in any layout
    KAON_W_FLAT3 = 1 << 5,        // a file may store the matrix [a, b, c]: read as [a * b, c]
};

typedef struct kaon_weight_spec {
    const char *gguf;   // GGUF name, %d = the layer; NULL when GGUF files do not have it
    const char *hf;     // Hugging Face name, %d = the layer; NULL when HF files do not have it
    bool per_layer;
    size_t offset;      // of the kaon_tensor in the globals struct or in a layer struct
    uint8_t ndim;
    uint8_t dims[2];    // KAON_DIM_*
    uint8_t when;       // kaon_when
    uint8_t flags;      // KAON_W_*
    uint8_t shard;      // kaon_shard
} kaon_weight_spec;

// One copy of an architecture's weights.
typedef struct kaon_weights {
    void *globals;                // the architecture's globals struct
    void *layers;                 // [n_layers] of its layer struct
    struct kaon_moe_layer *moe;   // [n_layers]; entry l is used when the layer has experts
    bool *layer_moe;              // [n_layers] whether layer l has experts (shared, not owned by copies)
} kaon_weights;

// The kaon_tensor of spec s (layer l when per layer) in weight set ws.
kaon_tensor *kaon_weight_slot(const struct kaon_model *m, const kaon_weights *ws,
                              const kaon_weight_spec *s, int l);
int64_t kaon_weight_dim(const kaon_model_config *c, int dim);

// Reads every weight of the table from the model's file (shapes and formats checked).
int kaon_weights_load(struct kaon_model *m);
// --load-format dummy: placeholders of the table's shapes (bf16) that a device backend fills.
int kaon_weights_load_dummy(struct kaon_model *m);
// Dummy weights for a backend that computes on host memory (the CPU: no upload op): every
// placeholder gets random values in m's own memory, FP8 ones codes and scales (dummy_host.c).
// Once per model; 0 or -1.
int kaon_weights_fill_host(struct kaon_model *m);
void kaon_weights_free_host(struct kaon_model *m);

// Device copies of every weight (created in place for dummy models). dev is filled; on error it
// may be half made: release it.
int kaon_weights_upload(kaon_backend *be, const struct kaon_model *m, kaon_weights *dev);
void kaon_weights_release(kaon_backend *be, const struct kaon_model *m, kaon_weights *dev);

// Parameters and bytes, by stored format and by table row. by_spec may be NULL.
#define KAON_MAX_DTYPE_IDS 64
typedef struct kaon_weight_count {
    uint64_t params, bytes;
    uint64_t params_by_dtype[KAON_MAX_DTYPE_IDS], bytes_by_dtype[KAON_MAX_DTYPE_IDS];
    uint64_t tensors_by_dtype[KAON_MAX_DTYPE_IDS];
    uint64_t expert_params;   // routed experts' parameters (all of them)
} kaon_weight_count;
typedef struct kaon_spec_count {
    uint64_t params, bytes, tensors;
    uint64_t dtype_mask;      // bit d: some tensor of this row is stored as dtype d
} kaon_spec_count;
void kaon_weights_count(const struct kaon_model *m, kaon_weight_count *total, kaon_spec_count *by_spec);
// Bytes the weights take on backend be (its own storage format), for memory plans.
size_t kaon_weights_device_bytes(kaon_backend *be, const struct kaon_model *m);

#endif
