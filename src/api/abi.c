// The small helpers bindings need to use the C API safely from another language: the sizes of
// the public structs (a ctypes mirror checks its layout against them) and a matching free().
#include <stdlib.h>
#include <string.h>

#include "kaon.h"

size_t kaon_struct_size(const char *name) {
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        {"kaon_engine_options", sizeof(kaon_engine_options)},
        {"kaon_speculative_options", sizeof(kaon_speculative_options)},
        {"kaon_sampling", sizeof(kaon_sampling)},
        {"kaon_logit_bias", sizeof(kaon_logit_bias)},
        {"kaon_output", sizeof(kaon_output)},
        {"kaon_token_logprob", sizeof(kaon_token_logprob)},
        {"kaon_top_logprob", sizeof(kaon_top_logprob)},
        {"kaon_engine_info", sizeof(kaon_engine_info)},
        {"kaon_engine_stats", sizeof(kaon_engine_stats)},
        {"kaon_special_tokens", sizeof(kaon_special_tokens)},
        {"kaon_constraint_ops", sizeof(kaon_constraint_ops)},
    };
    if (!name) return 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(sizes[i].name, name)) return sizes[i].size;
    return 0;
}

// The library's own free(): a caller linked against another C runtime must not free() ours.
void kaon_free(void *p) { free(p); }
