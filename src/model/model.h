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
#include "model/quant_config.h"
#include "model/weights.h"

// DUMMY: shapes from config.json alone; the weights' data pointers are placeholders that only a
// backend with fill_dummy turns into real (random) weights.
typedef enum kaon_model_format {
    KAON_FORMAT_GGUF,
    KAON_FORMAT_SAFETENSORS,
    KAON_FORMAT_DUMMY,
} kaon_model_format;

// The two RoPE tables a model may use: every layer's, and sliding-window layers' own (Gemma 3).
enum { KAON_ROPE_GLOBAL = 0, KAON_ROPE_LOCAL = 1 };

typedef struct kaon_model {
    kaon_model_config cfg;
    const struct kaon_arch_ops *arch;  // = cfg.impl (model/arch.h)
    kaon_model_format format;
    char path[4096];
    kaon_gguf *gguf;               // owns the mapping (GGUF files)
    kaon_safetensors *st;          // owns the mapping (HF folders)
    kaon_quant_config quant;       // how the checkpoint is quantized (HF folders; NONE otherwise)
    kaon_weights w;                // the weights, in place from the mapping (model/weights.h)
    void **owned;                  // [n_owned] host buffers of weights converted at load
    int n_owned;
    kaon_rope rope[2];             // KAON_ROPE_GLOBAL / KAON_ROPE_LOCAL
    float *rope_inv_freq[2];       // [rope_dim/2] each, scaling applied
    uint64_t n_params, weight_bytes;  // as stored (kaon_weights_count at load)
    bool dummy_filled;             // dummy placeholders given host values (kaon_weights_fill_host)
    // A tensor-parallel shard of dummy placeholders (tp.c): where weight spec i's tensor of
    // layer l sits in the whole one, at [i * n_layers + l] (full 0: whole), so the device
    // creates the whole model's values. NULL: every weight is whole.
    kaon_dummy_origin *dummy_origin;
    struct kaon_eagle3 *eagle3;    // speculative decoding's EAGLE-3 head (model/eagle3.h), or NULL
} kaon_model;

// path: a .gguf file or a Hugging Face folder. NULL + kaon_last_error() on failure.
// "dummy:<config>" is kaon_model_load_dummy(<config>).
kaon_model *kaon_model_load(const char *path);
// --load-format dummy: a model described by a config.json (the file, or a folder holding
// one) whose weights (bf16) are created by the backend when a runner is made.
kaon_model *kaon_model_load_dummy(const char *path);
// As kaon_model_load, with the checkpoint's first MTP layer (DeepSeek num_nextn_predict_layers)
// loaded as layer cfg.n_layers - 1 (cfg.n_mtp_layers = 1): its weights, its KV cache layer (in
// the same block pool, so the prefix cache covers it) and its experts; the main forward runs
// the layers before it. Speculative decoding's "mtp" draft model.
kaon_model *kaon_model_load_mtp(const char *path);
void kaon_model_free(kaon_model *m);
// A tensor by name in the model's file (GGUF or safetensors); out->data stays NULL when absent.
// -1 + error on a tensor of a type kaon cannot use.
int kaon_model_find_tensor(const kaon_model *m, const char *name, kaon_tensor *out);

// Hands a malloc'd buffer to the model (freed with it; on failure freed at once). 0 or -1.
int kaon_model_own(kaon_model *m, void *p);
// Whether layer l has experts instead of a dense MLP.
bool kaon_model_layer_is_moe(const kaon_model *m, int l);
// Bytes of KV cache one token needs across all layers (elements of elem_bytes).
size_t kaon_model_kv_bytes_per_token(const kaon_model *m, size_t elem_bytes);
// Builds m->rope[which] for base theta, with the config's scaling when scaled, and GGUF
// rope_freqs divisors when given.
int kaon_model_build_rope(kaon_model *m, int which, float theta, bool scaled,
                          const kaon_tensor *freq_divisors);

#include "model/runner.h"

#endif
