// How a Hugging Face checkpoint is quantized, from config.json's "quantization_config" (or
// NVIDIA ModelOpt's hf_quant_config.json beside it): the method, the weights' format, how
// activations are quantized, and which modules stay unquantized. The loader asks
// kaon_quant_config_check whether it can run the checkpoint, and kaon_quant_module_quantized
// per module; weights.c attaches the format's scale companions.
#ifndef KAON_MODEL_QUANT_CONFIG_H
#define KAON_MODEL_QUANT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum kaon_quant_method {
    KAON_QUANT_NONE = 0,           // no quantization_config: float weights
    KAON_QUANT_FP8,                // "fp8" (DeepSeek-V3, Kimi-K2, Qwen3-*-FP8)
    KAON_QUANT_COMPRESSED_TENSORS, // "compressed-tensors" (RedHat, Kimi-K2.5)
    KAON_QUANT_AWQ,
    KAON_QUANT_GPTQ,
    KAON_QUANT_MXFP4,              // gpt-oss
    KAON_QUANT_BITSANDBYTES,
    KAON_QUANT_MODELOPT,           // NVIDIA ModelOpt (hf_quant_config.json)
    KAON_QUANT_UNKNOWN,
} kaon_quant_method;

typedef enum kaon_quant_format {
    KAON_QFMT_NONE = 0,
    KAON_QFMT_FP8_BLOCK,    // one scale per block[0] x block[1] weights
    KAON_QFMT_FP8_CHANNEL,  // one scale per output row
    KAON_QFMT_FP8_TENSOR,   // one scale per tensor
    KAON_QFMT_INT,          // bits-wide integers, group_size columns per scale (-1: per channel)
    KAON_QFMT_MXFP4,        // e2m1 in blocks of 32 with an e8m0 scale
    KAON_QFMT_UNKNOWN,
} kaon_quant_format;

typedef enum kaon_quant_act {
    KAON_QACT_NONE = 0,     // weight-only: activations stay float
    KAON_QACT_DYNAMIC,      // scales computed per token (group) at run time
    KAON_QACT_STATIC,       // scales stored in the checkpoint
} kaon_quant_act;

typedef struct kaon_quant_config {
    kaon_quant_method method;
    char method_name[32];   // as the file writes it (quant_method / quant_algo)
    char source[24];        // "config.json" or "hf_quant_config.json"
    kaon_quant_format format;
    char fp8_fmt[8];        // "e4m3" / "e5m2" (FP8 formats)
    int block[2];           // FP8_BLOCK: rows and columns of weights one scale covers
    int bits;               // INT / MXFP4 / bitsandbytes: bits per weight (FP8: 8)
    int group_size;         // INT: input columns per scale (-1: one per output row); MXFP4: 32
    bool symmetric;         // INT: no zero points
    bool desc_act;          // GPTQ act-order (g_idx is not i / group_size)
    char ct_format[32];     // compressed-tensors "format" (pack-quantized, float-quantized, ...)
    char int_format[16];    // AWQ "version" (gemm); GPTQ "checkpoint_format" (gptq, gptq_v2)
    int n_groups;           // compressed-tensors config_groups (only the first one is read)
    kaon_quant_act act;
    char act_strategy[16];  // compressed-tensors input_activations strategy (token, tensor, group)
    char w_strategy[16];    // compressed-tensors weights strategy (channel, tensor, group, block)
    char kv_cache[16];      // ModelOpt kv_cache_quant_algo ("FP8"), "" when none
    int n_ignore;
    char **ignore;          // module names or patterns left unquantized (owned)
} kaon_quant_config;

// Whether q is 8-bit integer weights kaon reads (model/fp8_weights.c: kaon_int8_attach).
bool kaon_quant_is_int8(const kaon_quant_config *q);
// Parses config.json text: its "quantization_config" (or text_config's). Absent: method NONE.
// A key of the wrong type is an error naming it. Free q afterwards even on error.
int kaon_quant_config_parse(const char *json, size_t len, kaon_quant_config *q);
// Parses hf_quant_config.json text (ModelOpt).
int kaon_quant_config_parse_modelopt(const char *json, size_t len, kaon_quant_config *q);
// <dir>/hf_quant_config.json when present, else <dir>/config.json.
int kaon_quant_config_load(const char *dir, kaon_quant_config *q);
void kaon_quant_config_free(kaon_quant_config *q);

// 0 when kaon can load this quantization; else -1 + an error naming the method and what is
// supported. file names the config in the message.
int kaon_quant_config_check(const kaon_quant_config *q, const char *file);
// "fp8 e4m3, blocks of 128x128, dynamic activations", "4-bit int, group 128", ...
const char *kaon_quant_describe(const kaon_quant_config *q, char *buf, size_t cap);
// Whether module (an HF module name: a weight's name without ".weight") is quantized: false
// when no quantization or when an ignore entry matches it. Entries match the name, a dotted
// prefix of it or a dotted suffix (a wrapper's prefix), with * matching within the name;
// "re:" entries are regular expressions matched from the start (compressed-tensors).
bool kaon_quant_module_quantized(const kaon_quant_config *q, const char *module);

#endif
