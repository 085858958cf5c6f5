// The architectures kaon runs: one entry per architecture file.
#include <stdio.h>
#include <string.h>

#include "model/arch.h"
#include "util/err.h"

extern const kaon_arch_ops kaon_arch_llama;
extern const kaon_arch_ops kaon_arch_gemma3;
extern const kaon_arch_ops kaon_arch_deepseek2;
extern const kaon_arch_ops kaon_arch_gptoss;

static const kaon_arch_ops *const archs[] = {&kaon_arch_llama, &kaon_arch_gemma3, &kaon_arch_deepseek2,
                                             &kaon_arch_gptoss};
#define N_ARCHS (sizeof archs / sizeof archs[0])

const char *kaon_arch_supported(void) {
    static char list[1024];
    if (list[0]) return list;
    size_t at = 0;
    for (size_t i = 0; i < N_ARCHS; i++)
        for (const kaon_arch_name *n = archs[i]->names; n->name; n++)
            at += (size_t)snprintf(list + at, at < sizeof list ? sizeof list - at : 0, "%s%s",
                                   at ? ", " : "", n->name);
    return list;
}

const kaon_arch_ops *kaon_arch_find(const char *name, kaon_arch *variant) {
    for (size_t i = 0; name && i < N_ARCHS; i++)
        for (const kaon_arch_name *n = archs[i]->names; n->name; n++)
            if (!strcmp(n->name, name)) {
                if (variant) *variant = n->variant;
                return archs[i];
            }
    if (variant) *variant = KAON_ARCH_UNKNOWN;
    kaon_set_error("unsupported architecture '%s' (kaon knows: %s)", name && *name ? name : "(none given)",
                   kaon_arch_supported());
    return NULL;
}

kaon_arch kaon_arch_from_name(const char *name) {
    kaon_arch v = KAON_ARCH_UNKNOWN;
    kaon_arch_find(name, &v);
    return v;
}

const char *kaon_arch_label(kaon_arch a) {
    switch (a) {
    case KAON_ARCH_LLAMA: return "llama";
    case KAON_ARCH_QWEN2: return "qwen2";
    case KAON_ARCH_QWEN3: return "qwen3";
    case KAON_ARCH_GEMMA3: return "gemma3";
    case KAON_ARCH_DEEPSEEK2: return "deepseek2";
    case KAON_ARCH_DEEPSEEK3: return "deepseek3";
    case KAON_ARCH_GPTOSS: return "gpt-oss";
    default: return "unknown";
    }
}
