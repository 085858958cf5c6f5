// A loaded model: its description (config), its weights used in place from the file mapping,
// and the forward pass of its architecture written against the backend's op table.
#ifndef KAON_MODEL_MODEL_H
#define KAON_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/config.h"

typedef struct kaon_layer_weights {
    kaon_tensor attn_norm;            // [dim]
    kaon_tensor wq, wk, wv, wo;       // [nh*hd, dim] [nkv*hd, dim] [nkv*hd, dim] [dim, nh*hd]
    kaon_tensor bq, bk, bv;           // biases (Qwen2); data == NULL when absent
    kaon_tensor q_norm, k_norm;       // [hd] (Qwen3); data == NULL when absent
    kaon_tensor ffn_norm;             // [dim]
    kaon_tensor w_gate, w_up, w_down; // [ffn, dim] [ffn, dim] [dim, ffn]; absent in MoE layers
    // (Keep the tensors above first and together: kaon info counts them as an array.)
    const struct kaon_moe_layer *moe; // the layer's experts (model/moe.h); NULL: dense MLP
} kaon_layer_weights;

// DUMMY: shapes from config.json alone; the weights' data pointers are placeholders that only a
// backend with fill_dummy turns into real (random) weights.
typedef enum kaon_model_format {
    KAON_FORMAT_GGUF,
    KAON_FORMAT_SAFETENSORS,
    KAON_FORMAT_DUMMY,
} kaon_model_format;

typedef struct kaon_model {
    kaon_model_config cfg;
    kaon_model_format format;
    char path[4096];
    kaon_gguf *gguf;               // owns the mapping (GGUF files)
    kaon_safetensors *st;          // owns the mapping (HF folders)
    kaon_tensor tok_embd;          // [vocab, dim]
    kaon_tensor out_norm;          // [dim]
    kaon_tensor lm_head;           // [vocab, dim]; the embedding when tied
    kaon_layer_weights *layers;    // [n_layers]
    float *rope_inv_freq;          // [rope_dim/2], scaling applied
    float *bias_f32;               // biases widened to F32 (the backend takes F32 biases)
    struct kaon_moe_layer *moe;    // [n_layers] experts of MoE layers (model/moe.h); NULL if dense
    kaon_rope rope;
    uint64_t n_params;
    uint64_t weight_bytes;
} kaon_model;

// path: a .gguf file or a Hugging Face folder. NULL + kaon_last_error() on failure.
// "dummy:<config>" is kaon_model_load_dummy(<config>).
kaon_model *kaon_model_load(const char *path);
// --load-format dummy: a model described by a config.json (the file, or a folder holding
// one) whose weights (bf16) are created by the backend when a runner is made.
kaon_model *kaon_model_load_dummy(const char *path);
void kaon_model_free(kaon_model *m);
// A tensor by name in the model's file (GGUF or safetensors); out->data stays NULL when absent.
// -1 + error on a tensor of a type kaon cannot use.
int kaon_model_find_tensor(const kaon_model *m, const char *name, kaon_tensor *out);

// Bytes of KV cache one token needs across all layers (f32 K and V on the CPU).
size_t kaon_model_kv_bytes_per_token(const kaon_model *m, size_t elem_bytes);

// One flat batch: every scheduled token of every sequence.
typedef struct kaon_batch {
    int n_tokens;
    const int32_t *tokens;         // [n_tokens]
    kaon_attn_meta attn;           // positions, sequences, slots, block tables
    int n_logits;
    const int32_t *logit_rows;     // [n_logits] rows of the batch that need logits
} kaon_batch;

// Scratch activations and the KV cache for one model on one backend, sized at creation:
// no allocation happens per step.
typedef struct kaon_runner kaon_runner;

kaon_runner *kaon_runner_create(const kaon_model *m, kaon_backend *be, int max_batch_tokens,
                                int max_logits, int n_blocks, int block_size);
void kaon_runner_free(kaon_runner *r);
int kaon_runner_block_size(const kaon_runner *r);
// Writes the whole KV pool once so its memory is resident from the start (host backends only):
// a server's footprint then stays flat under load instead of growing as blocks are first used.
void kaon_runner_reserve_host_kv(kaon_runner *r);
int kaon_runner_n_blocks(const kaon_runner *r);
// Runs the forward pass; logits [n_logits, vocab] in host floats.
int kaon_runner_forward(kaon_runner *r, const kaon_batch *b, float *logits);
// Backends that sample on the device: the rows of sb are sampled there (ids, logprobs: host
// arrays of sb->n_rows) and only the logit rows host_rows are copied, each to
// logits + row * vocab.
bool kaon_runner_can_sample(const kaon_runner *r);
int kaon_runner_forward_sample(kaon_runner *r, const kaon_batch *b, const kaon_sample_batch *sb,
                               int32_t *ids, float *logprobs, const int32_t *host_rows,
                               int n_host_rows, float *logits);
// Bytes of the activation buffers a runner of these sizes allocates (for memory plans).
size_t kaon_runner_act_bytes(const kaon_model *m, size_t elem_bytes, int max_batch_tokens,
                             int max_logits);

// Expert load of MoE models (off until enabled; it then costs one small copy per read).
// Enabling allocates [n_layers, n_experts] counters that every later forward pass adds to.
int kaon_runner_enable_expert_stats(kaon_runner *r);
// Tokens routed to each expert since enabling, [n_layers, n_experts] (dense layers: zeros).
// Returns n_experts (0 for a dense model or when not enabled), -1 on error. Run it on the
// thread that runs the forward passes.
int kaon_runner_expert_load(kaon_runner *r, uint64_t *out);

#endif
