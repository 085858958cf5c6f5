// kaon's public C API: an engine that serves many requests at once (continuous batching over
// a paged, prefix-cached KV cache) and streams each request's outputs.
//
//   kaon_engine *e = kaon_engine_create(&opts);          // loads the model, starts its thread
//   kaon_request *r = kaon_engine_submit(e, ids, n, &params);
//   kaon_output out;
//   while (kaon_request_next(r, &out, -1) == 1 && !out.finished) { ... out.text ... }
//   kaon_request_free(r);                                 // aborts if still running
//
// All functions are thread-safe. Errors: NULL / negative status and kaon_last_error() (this
// thread's message).
#ifndef KAON_H
#define KAON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The library's version; libkaon.so.MAJOR is its soname, which changes only when the ABI breaks
// (abi/libkaon.abi is the baseline scripts/abi_check.sh holds it to).
#define KAON_VERSION_MAJOR 0
#define KAON_VERSION_MINOR 1
#define KAON_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

const char *kaon_last_error(void);
const char *kaon_version(void);

typedef struct kaon_engine kaon_engine;
typedef struct kaon_request kaon_request;

// Speculative decoding: a proposer drafts up to num_speculative_tokens tokens per sequence and
// one forward pass verifies them all (each position's token is sampled from the target's own
// distribution and a draft is accepted when it is that token, so the output is what the same
// request samples without speculation).
#define KAON_SPEC_MAX_TOKENS 16
typedef struct kaon_speculative_options {
    const char *method;             // NULL or "": off; "ngram": prompt lookup (no weights);
                                    // "mtp" / "deepseek_mtp": DeepSeek-V3/R1's own MTP layer
                                    // (num_nextn_predict_layers) drafts greedily;
                                    // "eagle3": the EAGLE-3 head in `model` drafts greedily;
                                    // "oracle" (benchmarks): replays oracle_file's outputs
    int num_speculative_tokens;     // drafts per step, 1..KAON_SPEC_MAX_TOKENS
    int prompt_lookup_min;          // ngram: the shortest suffix matched (0: 2)
    int prompt_lookup_max;          // ngram: the longest suffix matched, tried first (0: 4)
    int disable_by_batch_size;      // no drafts in a step with at least this many running
                                    // sequences (0: 32; -1: never off)
    const char *oracle_file;        // oracle: JSON lines {"prompt_ids": [...], "token_ids": [...]};
                                    // a sequence whose prompt is listed drafts the recorded
                                    // continuation while its output follows it (no cost: it
                                    // bounds the verify machinery's overhead)
    const char *model;              // a draft model's path (vLLM's key); mtp: not used (the
                                    // draft is the target's own layer num_hidden_layers)
    bool force_accept;              // BENCHMARKS ONLY: every draft is kept as if verified, so
                                    // the output is NOT the model's; measures a proposer's whole
                                    // cost (its forward passes included) at full acceptance
} kaon_speculative_options;

typedef struct kaon_engine_options {
    const char *model;              // GGUF file or HF folder (NULL: error)
    const char *device;             // "cpu" (default), "cuda" (GPU 0), "cuda:N", or "noop" (no
                                    // math: measures the engine itself)
    int n_threads;                  // CPU threads (0: all cores)
    int tensor_parallel_size;       // ranks of tensor parallelism (0 or 1: off); the CPU now:
                                    // one worker thread per rank, n_threads / N threads each
    int max_num_seqs;               // sequences running at once (0: 256)
    int max_num_batched_tokens;     // token budget of one step (0: 512 on the CPU, 8192 on a GPU)
    int max_logit_rows;             // logit rows one step returns (0: max_num_seqs); prompt
                                    // logprobs and prompt logits come in chunks of this many
    int max_model_len;              // context limit (0: the model's, capped by the KV pool)
    size_t kv_cache_memory;         // bytes of KV cache (0: on the CPU 1 GiB, on a GPU what
                                    // fits; with max_model_len given, at most max_num_seqs
                                    // sequences of it and, on the CPU, at least one)
    double gpu_memory_utilization;  // fraction of GPU memory (0: 0.9)
    int block_size;                 // KV block size in tokens (0: chosen by the architecture)
    int data_parallel_size;         // DP attention (0 or 1: off), with enable_expert_parallel and
                                    // tensor_parallel_size 1, the CPU now: D ranks, each running
                                    // attention and dense layers for its own sequences (its 1/D
                                    // of the KV pool), the MoE layers' experts spread over all D
    const char *kv_cache_dtype;     // "auto" (NULL), "bf16": the backend's own (CPU f32, CUDA
                                    // bf16); "fp8" or "fp8_e4m3": 1 byte per element (e4m3 of
                                    // x / the layer's k_scale or v_scale, 1.0 unless the
                                    // checkpoint gives them), so twice bf16's tokens fit
    bool disable_prefix_caching;    // prefix caching is on unless this is set
    bool load_tokenizer;            // true: text deltas and stop strings need the tokenizer
    bool expert_stats;              // MoE models: count the tokens routed to each expert
                                    // (kaon_engine_expert_load; off by default)
    bool enable_expert_parallel;    // MoE models with tensor_parallel_size N > 1: the experts are
                                    // partitioned over the N ranks instead of each expert split
                                    // (vLLM's --enable-expert-parallel); attention stays split
    kaon_speculative_options speculative;  // off unless method is set
} kaon_engine_options;

void kaon_engine_options_default(kaon_engine_options *o);

typedef struct kaon_logit_bias {
    int32_t token;
    float bias;
} kaon_logit_bias;

// Sampling parameters of one request; kaon_sampling_default() fills OpenAI's defaults.
// A constraint on the tokens a sequence may sample (structured outputs: a grammar's matcher).
// Before each token it samples, a constrained sequence asks `allowed` for the set it may take
// (EOS among them exactly when the constraint may end there); the engine masks everything else,
// samples on the host, and reports the token to `accept`. Each of a request's n sequences gets
// its own state, cloned at submit from kaon_sampling.constraint_state (the caller keeps that one).
typedef struct kaon_constraint_ops {
    // Sets bit t of mask[t / 32] for each allowed token t < vocab (mask arrives cleared).
    // Returns 0, or -1 when the constraint cannot go on (the sequence then ends with an error).
    int (*allowed)(void *state, uint32_t *mask, int vocab);
    // The token sampled (one `allowed` let through). Returns 0, or -1 (an error ending).
    int (*accept)(void *state, int32_t token);
    void *(*clone)(const void *state);  // NULL when out of memory
    void (*free)(void *state);
} kaon_constraint_ops;

typedef struct kaon_sampling {
    int n;                          // parallel samples (>= 1); prompt blocks are shared
    float temperature;              // 0: greedy
    int top_k;                      // <= 0: off
    float top_p;                    // 1: off
    float min_p;                    // 0: off
    float repetition_penalty;       // 1: off (HF semantics, over prompt and output)
    float presence_penalty;         // 0: off (OpenAI semantics, over output)
    float frequency_penalty;        // 0: off
    const kaon_logit_bias *logit_bias;
    int n_logit_bias;
    bool has_seed;
    uint64_t seed;
    int max_tokens;                 // >= 1; -1 (the default): until the context is full
    int min_tokens;                 // EOS and stop tokens are masked until this many
    bool ignore_eos;
    const char *const *stop;        // stop strings (found across token boundaries)
    int n_stop;
    bool include_stop_str_in_output;
    const int32_t *stop_token_ids;
    int n_stop_token_ids;
    int logprobs;                   // -1: off; k >= 0: the sampled token's logprob + top k
    int prompt_logprobs;            // -1: off; k >= 0: per prompt position
    bool prompt_logits;             // the raw logits of every prompt position, in the first
                                    // output (kaon_output.prompt_logits; for tests and tools)
    bool skip_special_tokens;       // in text (default true)
    int priority;                   // lower runs first (default 0); FCFS within a priority
    const kaon_constraint_ops *constraint;  // NULL: unconstrained (must outlive the request)
    const void *constraint_state;           // cloned for each sequence at submit
} kaon_sampling;

void kaon_sampling_default(kaon_sampling *s);

typedef enum kaon_finish {
    KAON_FINISH_NONE = 0,   // still running
    KAON_FINISH_STOP,       // EOS, a stop string or a stop token
    KAON_FINISH_LENGTH,     // max_tokens or the context limit
    KAON_FINISH_ABORT,      // aborted (client gone, shutdown)
    KAON_FINISH_ERROR,      // failed; message in kaon_output.error
} kaon_finish;

typedef struct kaon_top_logprob {
    int32_t token;
    float logprob;
} kaon_top_logprob;

// One token's logprob and the top alternatives (top[0..n_top)).
typedef struct kaon_token_logprob {
    int32_t token;
    float logprob;
    int n_top;
    kaon_top_logprob *top;
} kaon_token_logprob;

// One step's output for one of a request's n sequences. Everything it points to stays valid
// until the next kaon_request_next() on the same request or kaon_request_free().
typedef struct kaon_output {
    int index;                       // which of the n sequences
    const int32_t *token_ids;        // the tokens new since the last output of this index
    int n_tokens;
    const char *text;                // their text (complete UTF-8; stop strings applied)
    size_t text_len;
    const kaon_token_logprob *logprobs;  // [n_tokens] when asked, else NULL
    const kaon_token_logprob *prompt_logprobs;  // [n_prompt] once (first output), position 0 has none
    int n_prompt_logprobs;
    // With prompt_logits, once (first output): [n_prompt_logits, vocab] f32, row p the logits
    // after prompt position p (the last row: what the first token was sampled from).
    const float *prompt_logits;
    int n_prompt_logits;
    kaon_finish finish;              // this index finished with this output (NONE: not yet)
    const char *stop_reason;         // the stop string, or NULL
    int32_t stop_token;              // the stop token id, or -1
    bool finished;                   // every index of the request has finished
    const char *error;               // KAON_FINISH_ERROR's message
    // Usage, cumulative for the whole request.
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;               // prompt tokens served from the prefix cache
    // Timing (seconds since the request was submitted).
    double queue_time;               // until first scheduled
    double first_token_time;         // until its first token (0: none yet)
} kaon_output;

// Starts an engine; NULL + kaon_last_error() on failure.
kaon_engine *kaon_engine_create(const kaon_engine_options *opts);
// Stops the engine thread (aborting what runs) and frees everything.
void kaon_engine_destroy(kaon_engine *e);

// Submits a request. The prompt and parameters are copied. NULL + kaon_last_error() when the
// request is invalid (empty prompt, too long, bad parameters): the engine is unaffected.
kaon_request *kaon_engine_submit(kaon_engine *e, const int32_t *prompt, int n_prompt,
                                 const kaon_sampling *params);
uint64_t kaon_request_id(const kaon_request *r);
// Waits up to timeout_ms (-1: forever, 0: poll) for the next output. 1: *out filled; 0:
// timeout; -1: error. After an output with finished == true, returns -1.
int kaon_request_next(kaon_request *r, kaon_output *out, int timeout_ms);
// Calls fn(ctx) whenever an output is queued on r (and at once when one already is), so a
// caller with many requests need not wait on each. fn runs in the engine thread under its
// lock: it must only note the event (no engine calls, no blocking). kaon_request_free ends it;
// fn NULL ends it too.
void kaon_request_set_notify(kaon_request *r, void (*fn)(void *ctx), void *ctx);
// Aborts (its KV blocks return to the pool at once); outputs end with KAON_FINISH_ABORT.
void kaon_request_abort(kaon_request *r);
// Aborts if running, then frees the handle.
void kaon_request_free(kaon_request *r);
// Abort by id; -1 when no such request is live.
int kaon_engine_abort(kaon_engine *e, uint64_t request_id);

typedef struct kaon_engine_stats {
    int running, waiting;
    int kv_blocks_total, kv_blocks_used;
    double kv_usage;                 // used / total
    uint64_t prefix_queries_tokens, prefix_hit_tokens;
    double prefix_hit_rate;
    uint64_t preemptions;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t finished_stop, finished_length, finished_abort, finished_error;
    uint64_t steps;
    // Output constraints (structured outputs): masks computed and the time they took.
    uint64_t constraint_masks;
    double constraint_mask_seconds;
    // Speculative decoding (vLLM's spec_decode counters): verify steps of a sequence with
    // drafts, the drafts proposed, those accepted, and accepted drafts by position.
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    uint64_t spec_accepted_per_pos[KAON_SPEC_MAX_TOKENS];
} kaon_engine_stats;

void kaon_engine_get_stats(kaon_engine *e, kaon_engine_stats *s);

// How many leading tokens of the prompt ids[0..n) the engine's prefix cache holds now (whole
// KV blocks; 0 when prefix caching is off), as a request submitted now would find them. Reads
// the cache without changing it (no references, no LRU order): a front end with several
// engines asks each to route a prompt to the one that computes the least of it.
size_t kaon_engine_cached_prefix(kaon_engine *e, const int32_t *ids, size_t n);

// Expert load of a MoE model created with expert_stats: tokens routed to each expert of each
// layer since the start, counts[l * n_experts + e] for l < n_layers (dense layers: zeros),
// as of the last finished step. counts may be NULL to ask the sizes; cap is its length.
// 0, or -1 (+ error) when the engine does not count (not asked, or a dense model) or cap is
// too small.
int kaon_engine_expert_load(kaon_engine *e, uint64_t *counts, size_t cap, int *n_layers,
                            int *n_experts);

// kaon_sampling_default(), then the model's generation_config.json where it gives a valid
// value (temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens as max_tokens):
// the defaults every front end starts a request from.
void kaon_engine_sampling_defaults(kaon_engine *e, kaon_sampling *s);

// The model's facts a front end needs.
typedef struct kaon_engine_info {
    const char *model_path;
    const char *arch;
    int vocab_size;
    int max_model_len;
    int block_size;
    int kv_blocks;
    const char *kv_cache_dtype;     // "fp8_e4m3", "bf16" or "f32"
    size_t kv_bytes_per_token;      // all layers, K and V
} kaon_engine_info;

void kaon_engine_get_info(kaon_engine *e, kaon_engine_info *info);
// The engine's tokenizer (NULL when created without one); a `kaon_tokenizer *`.
const void *kaon_engine_tokenizer(kaon_engine *e);

// ---- For bindings (the Python package) and other front ends ----

// sizeof a public struct as this library was built ("kaon_engine_options", "kaon_sampling",
// "kaon_output", ...; 0 for a name it does not know): a binding that mirrors the structs
// (Python's ctypes) checks its layout against it before the first call.
size_t kaon_struct_size(const char *name);
// Frees what the functions below return.
void kaon_free(void *p);

// Text <-> ids with the engine's tokenizer; -1 + kaon_last_error() when the engine has none.
// add_special: BOS/EOS as the tokenizer's own settings say (as a text prompt gets them).
// *ids / *text are malloc'd (kaon_free); *text is NUL-terminated.
int kaon_engine_tokenize(kaon_engine *e, const char *text, size_t len, bool add_special,
                         int32_t **ids, size_t *n_ids);
int kaon_engine_detokenize(kaon_engine *e, const int32_t *ids, size_t n, bool skip_special,
                           char **text, size_t *len);

typedef struct kaon_special_tokens {
    int32_t bos;                    // -1 when none
    int32_t eos;                    // -1 when none
    int n_stop;                     // end-of-generation tokens (eos, <|im_end|>, <|eot_id|>, ...):
                                    // a sequence stops at any of them unless ignore_eos
} kaon_special_tokens;
// Fills *st and the first min(st->n_stop, cap) stop ids into stop (may be NULL when cap is 0).
int kaon_engine_special_tokens(kaon_engine *e, kaon_special_tokens *st, int32_t *stop, int cap);

// Renders a conversation into prompt text with a chat template, exactly as kaon serve and kaon
// chat do. messages_json: a JSON array of {"role": ..., "content": ...}; kwargs_json: NULL or a
// JSON object of extra template variables (tools, enable_thinking, ...); chat_template: NULL
// for the model's own (kaon's fallback when it has none). The text carries its special tokens:
// tokenize it with add_special false. *text is malloc'd (kaon_free).
int kaon_engine_apply_chat_template(kaon_engine *e, const char *messages_json,
                                    const char *kwargs_json, const char *chat_template,
                                    bool add_generation_prompt, char **text, size_t *len);

// A waitset: one thread waits for outputs of many requests without polling each. A request
// added with a tag becomes ready when an output is queued on it; kaon_waitset_wait hands each
// ready tag out once (the caller then drains it with kaon_request_next(r, &out, 0)).
typedef struct kaon_waitset kaon_waitset;
kaon_waitset *kaon_waitset_create(void);
// Watches r under tag (a request belongs to one waitset at a time). 0, or -1 + error.
int kaon_waitset_add(kaon_waitset *w, kaon_request *r, uint64_t tag);
// Stops watching r; call it before kaon_request_free(r).
void kaon_waitset_remove(kaon_waitset *w, kaon_request *r);
// Waits up to timeout_ms (-1: forever) for ready tags; writes up to cap of them to tags and
// returns how many (0: timeout, or kaon_waitset_wake).
int kaon_waitset_wait(kaon_waitset *w, uint64_t *tags, int cap, int timeout_ms);
// Ends a wait at once (another thread's shutdown or new work).
void kaon_waitset_wake(kaon_waitset *w);
// Removes every request still watched (they must still be live) and frees the waitset.
void kaon_waitset_destroy(kaon_waitset *w);

// Plugins (include/kaon_plugin.h, docs/API.md "Plugins"): loads the shared library at path and
// registers its architectures, before any engine that needs them is created. Loading the same
// library again does nothing. 0, or -1 + kaon_last_error() ("plugin PATH: ..."): no such file,
// not a kaon plugin, built for another plugin API or other kaon headers, or a name taken.
int kaon_plugin_load(const char *path);

#ifdef __cplusplus
}
#endif

#endif
