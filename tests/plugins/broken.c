// Plugins that kaon must refuse (tests/unit/test_plugin.c, tests/e2e/test_plugin.py): one
// source, one library per BROKEN_* definition (CMakeLists.txt).
//   BROKEN_VERSION      built for the next plugin API version
//   BROKEN_MAGIC        a descriptor without kaon's magic
//   BROKEN_LAYOUT       built against headers where one struct had another size
//   BROKEN_NO_ENTRY     exports no entry symbol
//   BROKEN_DUP_BUILTIN  registers a name a built-in architecture has (LlamaForCausalLM)
//   BROKEN_DUP_EXAMPLE  registers the example plugin's name (KaonExampleForCausalLM)
#include <stddef.h>

#include "kaon_plugin.h"

typedef struct one_tensor {
    kaon_tensor w;
} one_tensor;

static const kaon_weight_spec weights[] = {
    {NULL, "model.norm.weight", false, offsetof(one_tensor, w), 1, {KAON_DIM_HIDDEN}, KAON_WHEN_ALWAYS, KAON_W_NORM, 0},
};

static void forward(kaon_fwd *f, const kaon_batch *b) {
    (void)f;
    (void)b;
}

static const kaon_arch_name names[] = {
#ifdef BROKEN_DUP_BUILTIN
    {"BrokenFreshName", KAON_ARCH_PLUGIN},  // a new name first: the clash must refuse all of them
    {"LlamaForCausalLM", KAON_ARCH_PLUGIN},
#else
    {"KaonExampleForCausalLM", KAON_ARCH_PLUGIN},
#endif
    {NULL, KAON_ARCH_UNKNOWN},
};

static const kaon_arch_ops arch = {
    .label = "broken",
    .names = names,
    .weights = weights,
    .n_weights = 1,
    .globals_size = sizeof(one_tensor),
    .layer_size = sizeof(one_tensor),
    .forward = forward,
};

static int register_broken(const kaon_plugin_host *h) { return h->register_arch(&arch); }

#if defined(BROKEN_NO_ENTRY)
__attribute__((visibility("default"))) int not_the_entry(void);
int not_the_entry(void) { return register_broken(NULL); }
#elif defined(BROKEN_DUP_BUILTIN) || defined(BROKEN_DUP_EXAMPLE)
KAON_PLUGIN_DEFINE("broken-dup", register_broken)
#else
__attribute__((visibility("default"))) const kaon_plugin_desc *kaon_plugin_entry(void);
const kaon_plugin_desc *kaon_plugin_entry(void) {
    static kaon_plugin_desc d = {KAON_PLUGIN_MAGIC, KAON_PLUGIN_API_VERSION, KAON_PLUGIN_N_LAYOUT,
                                 KAON_PLUGIN_LAYOUT_SIZES, "broken", register_broken};
#if defined(BROKEN_VERSION)
    d.api_version = KAON_PLUGIN_API_VERSION + 1;
#elif defined(BROKEN_MAGIC)
    d.magic = 0xdeadbeefu;
#elif defined(BROKEN_LAYOUT)
    d.layout[KAON_PLUGIN_N_LAYOUT - 1] += 8;
#endif
    return &d;
}
#endif
