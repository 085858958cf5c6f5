// vLLM's spelling of `vllm serve`'s command line, read by `kaon serve` (docs/API.md, "vLLM
// compatibility"): a table maps each vLLM flag to kaon's flag, or drops it (accepted: it asks for
// what kaon does anyway; ignored: with a warning), or refuses it with the reason. The rewritten
// argv then goes through cmd_serve.c's own parser, which sees only kaon's flags.
#ifndef KAON_CLI_VLLM_FLAGS_H
#define KAON_CLI_VLLM_FLAGS_H

#include <stdbool.h>
#include <stdio.h>

typedef struct kaon_vllm_args {
    int argc;
    char **argv;         // kaon's flags only; argv[0] as given; every string owned
    bool enforce_eager;  // --enforce-eager: no CUDA graphs
    char *quantization;  // --quantization/-q, checked against the checkpoint by kaon_vllm_check_quant
    char *tokenizer;     // --tokenizer, checked by kaon_vllm_check_tokenizer
    char *dtype;         // --dtype float32/float: allowed on the CPU only (kaon_vllm_check_dtype)
} kaon_vllm_args;

// Rewrites argv (argv[0] is the command's name): "--flag=value" becomes "--flag" "value",
// "--max_model_len" becomes "--max-model-len", vLLM's flags become kaon's. Warnings (once per
// flag) and errors go to err, one line each. 0, or 2 (the exit status for bad input) after an
// error line: a refused flag, a bad value of a flag handled here, a missing value, an unknown
// flag. out is valid (free it) either way.
int kaon_vllm_translate(int argc, char **argv, kaon_vllm_args *out, FILE *err);
void kaon_vllm_args_free(kaon_vllm_args *a);

// vLLM's integers with units: "32768", "32k" (x1000), "32K" (x1024), "1m", "1M", "25.6k".
// false when s is not one, or is out of [lo, hi].
bool kaon_vllm_parse_human_int(const char *s, long long lo, long long hi, long long *out);

// The checks that need the model (a GGUF file, a Hugging Face folder, or "dummy:<config>"):
// 0, or 2 after an error line on err.
// --quantization: the method the checkpoint declares ("gguf" for a GGUF file, "none" for float
// weights, else config.json's quant_method); vLLM's kernel variants (awq_marlin, gptq_marlin,
// ...) count as their method.
int kaon_vllm_check_quant(const char *want, const char *model, FILE *err);
// --tokenizer: only the model's own (the model path, or the folder holding it).
int kaon_vllm_check_tokenizer(const char *tok, const char *model, FILE *err);
// --dtype float32/float: the CPU computes in f32 anyway (accepted); CUDA does not (refused).
int kaon_vllm_check_dtype(const char *dtype, const char *device, FILE *err);

#endif
