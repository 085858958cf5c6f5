// libFuzzer target for config.json / generation_config.json parsing: the same bytes go through
// both parsers, then through validation when they parsed.
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kaon_model_config c;
    kaon_model_config_init(&c);
    if (kaon_hf_config_parse((const char *)data, size, &c) == 0) {
        if (c.n_eos_token_ids < 0 || c.n_eos_token_ids > 8) __builtin_trap();
        kaon_model_config_validate(&c);
    }
    kaon_model_config_init(&c);
    if (kaon_hf_generation_config_parse((const char *)data, size, &c) == 0) {
        if (c.n_eos_token_ids < 0 || c.n_eos_token_ids > 8) __builtin_trap();
    }
    return 0;
}
