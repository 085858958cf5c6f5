// libFuzzer target for config.json / generation_config.json parsing: the same bytes go through
// both parsers and the quantization parsers, then through validation when they parsed.
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/quant_config.h"

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
    // quantization_config (config.json) and ModelOpt's hf_quant_config.json.
    kaon_quant_config q;
    if (kaon_quant_config_parse((const char *)data, size, &q) == 0) {
        char buf[160];
        kaon_quant_describe(&q, buf, sizeof buf);
        kaon_quant_config_check(&q, "config.json");
        kaon_quant_module_quantized(&q, "model.layers.0.self_attn.q_proj");
    }
    kaon_quant_config_free(&q);
    if (kaon_quant_config_parse_modelopt((const char *)data, size, &q) == 0) kaon_quant_module_quantized(&q, "lm_head");
    kaon_quant_config_free(&q);
    return 0;
}
