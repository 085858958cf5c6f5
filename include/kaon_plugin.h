// kaon's plugin ABI: a shared library that adds architectures at run time.
//
// A plugin exports one symbol, KAON_PLUGIN_ENTRY_SYMBOL, a function returning its descriptor.
// kaon (model/plugin.c) dlopens the library and refuses it, with one error line, unless the
// descriptor's magic, API version and layout fingerprint all match this build; then it calls
// the descriptor's register function once with the host table. The plugin reaches kaon only
// through that table's pointers (it links against nothing of kaon), and describes its
// architecture with the model layer's own structs (model/arch.h, model/blocks.h): a plugin is
// built against the headers of the kaon it will run in, and the fingerprint (the sizes of
// those structs) refuses one built against other headers even when the version agrees.
//
//   static int reg(const kaon_plugin_host *h) { return h->register_arch(&my_arch); }
//   KAON_PLUGIN_DEFINE("my-plugin", reg)
//
// examples/plugin/ is a complete one; docs/API.md ("Plugins") says how to load them.
#ifndef KAON_PLUGIN_H
#define KAON_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/arch.h"
#include "model/blocks.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Bump when the descriptor after its first two fields, the host table, or the meaning of any
// struct a plugin sees changes. A plugin built for another version is refused.
#define KAON_PLUGIN_API_VERSION 1
#define KAON_PLUGIN_MAGIC 0x4b504c47u  // "KPLG"
#define KAON_PLUGIN_ENTRY_SYMBOL "kaon_plugin_entry"

// The structs whose layout a plugin compiles in. X(name) once each; the fingerprint is their
// sizes in this order, so a mismatch can be named (the list is expanded only after all of them,
// kaon_plugin_host included, are defined).
#define KAON_PLUGIN_LAYOUT(X)                                                                    \
    X(kaon_arch_ops) X(kaon_arch_name) X(kaon_model_config) X(kaon_weight_spec) X(kaon_weights)  \
    X(kaon_tensor) X(kaon_linear) X(kaon_model) X(kaon_fwd) X(kaon_acts) X(kaon_batch)           \
    X(kaon_backend_ops) X(kaon_llama_block) X(kaon_rope) X(kaon_plugin_host)
#define KAON_PLUGIN_COUNT_(t) +1
enum { KAON_PLUGIN_N_LAYOUT = 0 KAON_PLUGIN_LAYOUT(KAON_PLUGIN_COUNT_) };
#define KAON_PLUGIN_SIZE_(t) (uint32_t) sizeof(t),
#define KAON_PLUGIN_LAYOUT_SIZES {KAON_PLUGIN_LAYOUT(KAON_PLUGIN_SIZE_)}

// What kaon gives a plugin's register function. Valid for the life of the process.
typedef struct kaon_plugin_host {
    uint32_t api_version;  // KAON_PLUGIN_API_VERSION of the host
    uint32_t size;         // sizeof(kaon_plugin_host)
    // Adds an architecture: every name in ops->names must be new (built-in and plugin names
    // alike). ops must outlive the process (a static const in the plugin). 0, or -1 + error.
    // Only valid during the register call; the plugin's archs join at once when it returns 0.
    int (*register_arch)(const kaon_arch_ops *ops);
    // Messages: a log line at level (util/log.h's levels: 0 debug .. 3 error), and the error a
    // failing callback leaves for its caller (always returns -1).
    void (*log)(int level, const char *fmt, ...) KAON_PRINTF(2, 3);
    int (*set_error)(const char *fmt, ...) KAON_PRINTF(1, 2);
    // config.json keys (model/hf_json.h): absent or null leaves *out; a wrong type is an error.
    int (*hf_get_int)(const char *file, const cJSON *obj, const char *prefix, const char *key, int *out,
                      bool *set);
    int (*hf_get_float)(const char *file, const cJSON *obj, const char *prefix, const char *key,
                        float *out, bool *set);
    int (*hf_get_bool)(const char *file, const cJSON *obj, const char *key, bool *out);
    // A model's RoPE table (model/model.h kaon_model_build_rope), for an arch's prepare.
    int (*build_rope)(kaon_model *m, int which, float theta, bool scaled, const kaon_tensor *freq_divisors);
    // The forward pass's building blocks (model/blocks.h).
    void (*blk_embed)(kaon_fwd *f, const kaon_batch *b, const kaon_linear *embd);
    void (*blk_scale_x)(kaon_fwd *f, const kaon_batch *b, float s);
    void (*blk_norm)(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *w);
    void (*blk_qkv)(kaon_fwd *f, const kaon_batch *b, const kaon_linear *wq, const kaon_linear *wk,
                    const kaon_linear *wv);
    void (*blk_attention)(kaon_fwd *f, const kaon_batch *b, int l, const kaon_rope *rope, int window, float scale);
    void (*blk_out)(kaon_fwd *f, const kaon_batch *b, const kaon_linear *w, const void *in);
    void (*blk_mlp)(kaon_fwd *f, const kaon_batch *b, kaon_act_fn act, const kaon_linear *gate,
                    const kaon_linear *up, const kaon_linear *down);
    // One whole Llama-style decoder layer (pre-norm attention + SwiGLU MLP, its options).
    void (*blk_llama_layer)(kaon_fwd *f, const kaon_batch *b, int l, const kaon_llama_block *w);
    void (*blk_logits)(kaon_fwd *f, const kaon_batch *b, const kaon_tensor *norm, const kaon_linear *head);
} kaon_plugin_host;

// The descriptor. magic and api_version come first in every version, so any kaon can read
// them; the rest is read only once they match.
typedef struct kaon_plugin_desc {
    uint32_t magic;        // KAON_PLUGIN_MAGIC
    uint32_t api_version;  // KAON_PLUGIN_API_VERSION the plugin was built against
    uint32_t n_layout;     // KAON_PLUGIN_N_LAYOUT
    uint32_t layout[KAON_PLUGIN_N_LAYOUT];  // KAON_PLUGIN_LAYOUT_SIZES
    const char *name;      // for messages and `kaon info`
    // Called once; registers the plugin's architectures. 0, or -1 + host->set_error.
    int (*register_fn)(const kaon_plugin_host *host);
} kaon_plugin_desc;

typedef const kaon_plugin_desc *(*kaon_plugin_entry_fn)(void);

// Defines the entry symbol with a descriptor built against these headers.
#define KAON_PLUGIN_DEFINE(name_, register_)                                                     \
    __attribute__((visibility("default"))) const kaon_plugin_desc *kaon_plugin_entry(void);    \
    const kaon_plugin_desc *kaon_plugin_entry(void) {                                          \
        static const kaon_plugin_desc d = {KAON_PLUGIN_MAGIC, KAON_PLUGIN_API_VERSION,          \
                                           KAON_PLUGIN_N_LAYOUT, KAON_PLUGIN_LAYOUT_SIZES,      \
                                           name_, register_};                                   \
        return &d;                                                                              \
    }

#ifdef __cplusplus
}
#endif

#endif
