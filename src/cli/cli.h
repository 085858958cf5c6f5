// Shared pieces of the kaon command line.
#ifndef KAON_CLI_CLI_H
#define KAON_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#define KAON_DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

// The model to use when -m is not given: $KAON_MODEL, else the default model next to the
// binary (../models/) or in ./models/. NULL (and a message) when none is found.
const char *kaon_cli_default_model(void);
// Whether path is a file that starts with GGUF's magic bytes.
bool kaon_cli_is_gguf(const char *path);
// Prints "kaon: error: <msg>" to stderr and returns 2 (the exit status for bad input).
int kaon_cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Parses "1,2,3" into a malloc'd array.
int kaon_cli_parse_ids(const char *s, int32_t **ids, int *n);
bool kaon_cli_parse_int(const char *s, long lo, long hi, long *out);
bool kaon_cli_parse_float(const char *s, double lo, double hi, double *out);
int kaon_cli_default_threads(void);
// A --device value (backend/device.h's forms; noop only where allow_noop). 0, or prints the
// error and returns 2.
int kaon_cli_check_device(const char *v, bool allow_noop);
// 0 when v is a --kv-cache-dtype value (auto, bf16, fp8, fp8_e4m3); else prints the error, 2.
int kaon_cli_check_kv_dtype(const char *v);
#define KAON_CLI_KV_DTYPE_HELP "auto (the backend's: CPU f32, CUDA bf16), bf16 (the same), fp8 or fp8_e4m3 (1 byte per value)"
// Parses --speculative-config's JSON (vLLM's keys: method, num_speculative_tokens,
// prompt_lookup_min, prompt_lookup_max, disable_by_batch_size) into o, checked as the engine
// will. 0, or prints the error and returns 2.
struct kaon_speculative_options;
int kaon_cli_parse_spec_config(const char *json, struct kaon_speculative_options *o);
#define KAON_CLI_SPEC_HELP "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'"
// The single-user commands (run, chat, logits, info) print only what they produce: the
// engine's info lines appear with KAON_LOG=info.
void kaon_cli_quiet_logs(void);

// Loads $KAON_PLUGINS (colon-separated) and every --plugin PATH / --plugin=PATH of argv[1..),
// removing the flags from argv (argc updated). 0, or prints the one error line and returns 2.
int kaon_cli_take_plugins(int *argc, char **argv);

int kaon_cmd_run(int argc, char **argv);
int kaon_cmd_info(int argc, char **argv);
int kaon_cmd_logits(int argc, char **argv);
int kaon_cmd_generate(int argc, char **argv);
int kaon_cmd_tokenize(int argc, char **argv);
int kaon_cmd_detokenize(int argc, char **argv);
int kaon_cmd_chat(int argc, char **argv);
int kaon_cmd_serve(int argc, char **argv);
int kaon_cmd_bench(int argc, char **argv);

#endif
