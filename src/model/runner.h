// The runner: one model on one backend, with its scratch activations, its KV cache and its
// device copies of the weights, sized at creation (no allocation per step). It runs a step's
// forward pass (the architecture's, model/arch.h), pads decode steps for CUDA graphs, and hands
// logits to the host or to the backend's sampler.
#ifndef KAON_MODEL_RUNNER_H
#define KAON_MODEL_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct kaon_model kaon_model;

// One flat batch: every scheduled token of every sequence.
typedef struct kaon_batch {
    int n_tokens;
    const int32_t *tokens;         // [n_tokens]
    kaon_attn_meta attn;           // positions, sequences, slots, block tables
    int n_logits;
    const int32_t *logit_rows;     // [n_logits] rows of the batch that need logits
    const int32_t *seq_rank;       // [attn.n_seqs] data-parallel attention: the rank owning each
                                   // sequence's KV (NULL: one rank); blocks are the pool's numbers
} kaon_batch;

// Scratch activations and the KV cache for one model on one backend, sized at creation:
// no allocation happens per step.
typedef struct kaon_runner kaon_runner;

kaon_runner *kaon_runner_create(const kaon_model *m, kaon_backend *be, int max_batch_tokens,
                                int max_logits, int n_blocks, int block_size);
// As kaon_runner_create with a KV cache of kv_dtype (KAON_KV_NATIVE or KAON_KV_FP8: one byte
// per element, each layer's k_scale / v_scale from the checkpoint, 1.0 when it has none).
// An FP8 cache on a backend whose ops cannot read it is refused with an error.
kaon_runner *kaon_runner_create_kv(const kaon_model *m, kaon_backend *be, int max_batch_tokens,
                                   int max_logits, int n_blocks, int block_size, int kv_dtype);
// Bytes one cache element takes: 1 for FP8, else the backend's activation element.
size_t kaon_kv_elem_bytes(const kaon_backend *be, int kv_dtype);
// Tensor parallelism (model/tp.h): size ranks, each a worker thread with its own CPU backend
// of n_threads / size threads (at least 1), its shard of m's weights and its KV heads' cache;
// the forward calls below run every rank and return rank 0's logits; ep: MoE experts placed
// whole on ranks instead of split. cuda_device >= 0: rank r on its own CUDA backend on device
// cuda_device + r (dense Llama-family models only; KAON_TP_SAME_DEVICE=1 puts every rank on
// cuda_device, a test aid). The Llama and DeepSeek families only, for now; refused with an
// error naming the cause otherwise.
kaon_runner *kaon_runner_create_tp(const kaon_model *m, int size, bool ep, int n_threads, int max_batch_tokens,
                                   int max_logits, int n_blocks, int block_size, int kv_dtype, int cuda_device);
// Data-parallel attention (model/tp.h): size ranks with the whole model but the MoE layers'
// experts spread over them (expert parallel), each caching the KV of its own sequences in its
// part of the n_blocks pool (kv_cache.h's parts). Batches carry seq_rank.
kaon_runner *kaon_runner_create_dp(const kaon_model *m, int size, int n_threads, int max_batch_tokens,
                                   int max_logits, int n_blocks, int block_size, int kv_dtype);
// Makes r one rank of a tensor-parallel group: its forward calls the rank's collectives.
struct kaon_tp_rank;
void kaon_runner_set_tp_rank(kaon_runner *r, struct kaon_tp_rank *t);
// A follower process of a multi-node job (dist/cluster.h): runs process 0's steps on this
// process's ranks until process 0 ends the job (kaon_tp_follow).
int kaon_runner_follow(kaon_runner *r);
// Its ranks' shares and times (tp.h's kaon_tp_rank_stats); 0 for a runner of one rank.
struct kaon_rank_stats;
int kaon_runner_rank_stats(kaon_runner *r, struct kaon_rank_stats *out, int cap);
void kaon_runner_free(kaon_runner *r);
int kaon_runner_block_size(const kaon_runner *r);
// Writes the whole KV pool once so its memory is resident from the start (host backends only):
// a server's footprint then stays flat under load instead of growing as blocks are first used.
void kaon_runner_reserve_host_kv(kaon_runner *r);
int kaon_runner_n_blocks(const kaon_runner *r);
// Runs the forward pass; logits [n_logits, vocab] in host floats (NULL: not copied out).
int kaon_runner_forward(kaon_runner *r, const kaon_batch *b, float *logits);
// Backends that sample on the device: the rows of sb are sampled there (ids, logprobs: host
// arrays of sb->n_rows) and only the logit rows host_rows are copied, each to
// logits + row * vocab.
bool kaon_runner_can_sample(const kaon_runner *r);
int kaon_runner_forward_sample(kaon_runner *r, const kaon_batch *b, const kaon_sample_batch *sb,
                               int32_t *ids, float *logprobs, const int32_t *host_rows,
                               int n_host_rows, float *logits);
// Speculative decoding's draft model (a model loaded with kaon_model_load_mtp, or one with an
// EAGLE-3 head attached): from now on every forward pass leaves each token's final normed
// hidden state (MTP) or the three hidden states the head reads (EAGLE-3, [T, 3 dim]) in the
// runner, which kaon_runner_draft reads. 0, or -1 + error (no draft model, no memory).
int kaon_runner_keep_hidden(kaon_runner *r);
// One step of the draft model over batch b (its own tokens, positions and KV slots; the MTP
// layer's cache lives in the same pool): row t's hidden input is row src[t] of the previous
// forward's hidden states: the target's step, or (chained) the draft's own previous step (MTP
// reads both from one buffer; an EAGLE-3 head reads the target's three states through fc, or its
// own outputs before their norm). The greedy id of each logit row goes to ids (sampled on the
// device where the backend can; an EAGLE-3 head's draft ids mapped to target ids); logits is
// host scratch of [n_logits, vocab] floats. ids NULL: the logits themselves are copied there
// (tests; an EAGLE-3 head's rows have draft_vocab_size entries).
int kaon_runner_draft(kaon_runner *r, const kaon_batch *b, const int32_t *src, bool chained, int32_t *ids,
                      float *logits);

// Bytes of the activation buffers a runner of these sizes allocates (for memory plans).
size_t kaon_runner_act_bytes(const kaon_model *m, size_t elem_bytes, int max_batch_tokens,
                             int max_logits);

// Expert load of MoE models (off until enabled; it then costs one small copy per read).
// Enabling allocates [n_layers, n_experts] counters that every later forward pass adds to.
int kaon_runner_enable_expert_stats(kaon_runner *r);
// Tokens routed to each expert since enabling, [n_layers, n_experts] (dense layers: zeros).
// Returns n_experts (0 for a dense model or when not enabled), -1 on error. Run it on the
// thread that runs the forward passes.
int kaon_runner_expert_load(kaon_runner *r, uint64_t *out);

#endif
