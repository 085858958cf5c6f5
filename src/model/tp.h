// Tensor parallelism and DP attention (issue 18): N ranks, each a worker
// thread with its own backend, its own copy of the model description holding its shard of the
// weights, its own runner (activations, its KV heads' cache) and a communicator. A step's batch is handed to
// every worker by pointer (shared memory: no copy, no serialization); each runs the same
// forward, which calls the communicator at the row-parallel linears (all-reduce of partial
// sums, kaon_blk_out) and at the vocab-parallel LM head (all-gather of logit slices,
// kaon_blk_logits); rank 0's logits go back to the engine, which samples.
//
// Shards come from the weight table's shard kinds: COL (q/k/v, gate/up and their biases):
// output rows of this rank's heads / FFN columns, views of the mapping; ROW (o_proj, down):
// input columns, copied (rows of a block format are cut on block boundaries); VOCAB: the
// embedding stays whole (a lookup; on the CPU a view costs nothing), the LM head is cut by
// rows; NONE: shared. Q heads split evenly (refused otherwise); KV heads split evenly when
// there are at least as many as ranks, else each rank holds the one KV head its Q heads read
// (ranks a multiple of the KV heads; refused otherwise). The FFN width must split evenly (no
// padding). Supported on the CPU backend: the Llama family (Llama, Mistral, Qwen2, Qwen3 and
// their MoE variants Mixtral, Qwen2-MoE, Qwen3-MoE) and the DeepSeek family (MLA + DeepSeekMoE),
// weights in f32/f16/bf16 or GGUF block formats.
//
// On CUDA (kaon_tp_create with a device d0 >= 0): rank r runs on its own CUDA backend on device
// d0 + r, its shard (views, or column slices copied on the host first) uploaded there, its KV
// heads' cache and activations in that device's memory, CUDA graphs per rank. The collectives
// work on device memory in the backend's activation dtype (bf16): NCCL between the devices
// (stream-ordered, so graphs record them), the logit slices gathered on the device and put side
// by side there (copy_f32_strided) before rank 0 copies the rows to the host once. Llama-family
// models with f32/f16/bf16 weights only for now (kaon_tp_cuda_check): dense, or mixture of experts
// under expert parallelism (below; kaon_tp_create refuses split experts on CUDA): each rank uploads
// only its experts' rows of the stacked expert tensors (model/moe.c; dummy weights: those rows'
// values in the whole) and the CUDA moe op (cuda_moe.cu) routes every token over all experts but
// plans, runs and combines only the choices of its own, a token with none of them getting 0 (plus
// its shared-expert part). Not yet on CUDA: MLA (DeepSeek), FP8/INT4/GGUF weights, experts split
// over their FFN columns, dummy weights with a shared expert. A test aid,
// KAON_TP_SAME_DEVICE=1, puts every rank on d0 with the same-device communicator
// (comm_cuda_local.cu; host barriers: graphs off) so one GPU can check the sharding.
//
// MLA (DeepSeek) splits by heads like the others: q_proj / q_b_proj rows, each head's rows of
// the absorbed W_UK^T, W_UV and W_UK (KV_B, K_B, V_B, K_N), o_proj's columns of its heads' v;
// q_a / kv_a and their norms are replicated, and so is the latent cache (every head reads the
// whole latent: each rank writes and keeps all of it, N times one rank's KV bytes in all).
//
// Mixture-of-experts layers (tp_moe.c): the router is replicated (every rank routes every token
// the same way) and each rank's moe op leaves its part of the block's output, which one
// all-reduce after the block sums (kaon_blk_moe). The shared expert, if any, is split like a
// dense MLP (gate/up rows, down columns) and its part rides in the same sum. The routed experts:
//   tensor parallel (the default): each expert split the same way, over moe_intermediate_size
//     (which must split evenly); gate/up are views, down's columns copies;
//   expert parallel (enable_expert_parallel): expert e lives whole on one rank, the contiguous
//     ranges [r E / N, (r + 1) E / N) (uneven when N does not divide E: some ranks hold one
//     more; at least one each, so E >= N), views of the mapping, nothing copied; each rank runs
//     only its experts over the tokens routed to them (kaon_moe_weights.e0/e1).
// This is the small-batch form of expert parallelism: every rank sees every token (attention
// is tensor parallel, so the activations are replicated anyway) and the combine is the
// all-reduce the row-parallel path already does. The GPU form for large batches (DeepEP's, vLLM's
// all2all backends) dispatches each token only to the ranks of its experts and combines with a
// second all-to-all; that needs an all_to_all in dist/comm.h and belongs with the NCCL runner.
//
// DP attention (kaon_dp_create; data_parallel_size D with expert parallel): the same worker
// threads, but each rank holds the whole model (attention, dense layers, LM head: replicated)
// except the routed experts, placed as under expert parallelism (the shared expert's columns
// split D ways), and caches only its own sequences' KV, in its part of the engine's block pool
// (kv_cache.h's parts: blocks [r N / D, (r + 1) N / D), numbered from 0 in its runner). A step's
// batch names each sequence's rank (kaon_batch.seq_rank); each rank runs its sub-batch through
// the forward pass with no collective until a MoE layer, where kaon_dp_moe gathers every rank's
// tokens (all_to_allv: counts differ), runs this rank's experts over all of them and sends each
// rank's rows back, summed in rank order by their owner. Dense layers stay data parallel (each
// rank its own tokens): the simplest correct choice, with no exchange at all. A rank with no
// sequence in a step still joins each MoE exchange. The ranks' logit rows are put back in the
// batch's row order for the engine. MLA gains the most: its latent cache, which TP replicates,
// is split D ways here.
#ifndef KAON_MODEL_TP_H
#define KAON_MODEL_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/comm.h"
#include "model/blocks.h"
#include "model/model.h"

// What a rank's forward pass needs for its collectives (kaon_fwd.tp).
typedef struct kaon_tp_rank {
    kaon_comm *comm;
    int rank, size;
    int vocab, vpad;       // LM head rows per rank: ceil(vocab / size); rank r has [r vpad, ...)
    float *part;           // [max_logits, vpad] this rank's logit slice
    float *gather;         // [size, max_logits, vpad] every rank's
    int failed;            // a collective failed in this step (its error is this thread's)
    kaon_comm_dtype act;   // the backend's activation dtype (what the all-reduce sums)
    kaon_backend *be;      // part and gather are this backend's memory (NULL: host memory)
    // Data-parallel attention (kaon_dp_create): this rank's tokens only until a MoE layer, whose
    // experts then run over every rank's tokens (kaon_dp_moe); logits stay local.
    bool dp;
    int max_tokens;        // of the whole step (every rank's tokens together)
    int32_t *dp_counts;    // [size] tokens of each rank this step
    size_t *dp_sz;         // [4, size] the exchanges' counts and offsets
    float *dp_x;           // [max_tokens, dim] every rank's tokens, in rank order
    int32_t *dp_pos;       // [max_tokens] their positions
    float *dp_out;         // [max_tokens, dim] this rank's experts' output for all of them
    float *dp_back;        // [size, max_tokens, dim] each rank's output for this rank's tokens
    double comm_s;         // seconds inside this rank's collectives, all steps (its thread's)
} kaon_tp_rank;

// The layout of rank r: its Q heads [q0, q0 + nq), KV heads [kv0, kv0 + nkv), FFN columns
// [f0, f0 + nf); MoE models: its routed experts [e0, e0 + ne), each expert's FFN columns
// [mf0, mf0 + nmf) and the shared expert's [sf0, sf0 + nsf). ep: expert parallel (ignored by
// dense models). Fails (-1 + an error naming the cause) when the model cannot be split.
typedef struct kaon_tp_layout {
    int q0, nq, kv0, nkv, f0, nf;
    int e0, ne, mf0, nmf, sf0, nsf;
    bool ep;
} kaon_tp_layout;
int kaon_tp_plan(const kaon_model *m, int size, int rank, bool ep, kaon_tp_layout *out);
// The range [*lo, *lo + *n) of a weight dimension kind (KAON_DIM_Q, _KV, _FFN, MLA's) on lay.
int kaon_tp_dim_range(const kaon_tp_layout *lay, const kaon_model_config *c, int dim, int64_t *lo, int64_t *n);
// The bytes rank lay's shard of m (the whole model) will hold, computed from the layout alone
// (kaon info -tp N): what kaon_tp_shard_bytes gives for the shard once it is cut.
uint64_t kaon_tp_plan_bytes(const kaon_model *m, const kaon_tp_layout *lay);

// Data-parallel attention: whether the model runs on D ranks (architecture, experts >= D, the
// shared expert's width splitting over D); -1 + an error naming the cause otherwise.
int kaon_dp_check(const kaon_model *m, int size);

// A multi-node job (dist/cluster.h) spreads one TP group over its processes, N / P ranks in each
// (rank0 + [0, N / P) here); process 0 sends each step to the others (step_msg.h), whose ranks
// then join the step's collectives (MPI on the CPU, NCCL on GPUs) as threads would.
//
// The runner of kaon_runner_create_tp (runner.h): N ranks on their own CPU backends, or with
// cuda_device >= 0 on CUDA devices cuda_device + r (all on cuda_device under KAON_TP_SAME_DEVICE=1).
typedef struct kaon_tp kaon_tp;
kaon_tp *kaon_tp_create(const kaon_model *m, int size, bool ep, int n_threads, int max_batch_tokens,
                        int max_logits, int n_blocks, int block_size, int kv_dtype, int cuda_device);
// Whether tensor parallelism on CUDA runs m: -1 + a one-line error naming what is missing. (A
// mixture-of-experts model passes here; it runs with expert parallelism only, which kaon_tp_create
// checks.)
int kaon_tp_cuda_check(const kaon_model *m, int size, int kv_dtype);
// Device bytes of one rank's weights (the backend's format): split weights 1/size, the others whole;
// routed experts ceil(E / size) of E (expert parallel), the shared expert 1/size.
size_t kaon_tp_rank_weight_bytes(kaon_backend *be, const kaon_model *m, int size);
// KAON_TP_SAME_DEVICE=1: every CUDA rank on the first device (a test aid).
bool kaon_tp_same_device(void);
void kaon_tp_free(kaon_tp *tp);
int kaon_tp_forward(kaon_tp *tp, const kaon_batch *b, float *logits);
// One rank's share and time, for /metrics and the start-up log: this process's ranks only.
typedef struct kaon_rank_stats {
    int rank;
    uint64_t weight_bytes;      // its shard (kaon_tp_shard_bytes)
    uint64_t kv_bytes;          // its KV cache
    uint64_t steps;
    double step_seconds;        // wall time of its steps, collectives included
    double collective_seconds;  // of which inside collectives (host time: on GPUs, where they are
                                // only enqueued, the time to enqueue them)
} kaon_rank_stats;
// Fills out[0 .. min(cap, ranks here)) and returns this process's rank count.
int kaon_tp_rank_stats(kaon_tp *tp, kaon_rank_stats *out, int cap);
// The bytes rank lay's shard of m holds as stored on the host (m: the rank's model, its
// weights cut; lay: its layout, for the experts it runs; NULL: one rank, all of them).
uint64_t kaon_tp_shard_bytes(const kaon_model *m, const kaon_tp_layout *lay);
// A follower process of a multi-node job (dist/cluster.h): runs the steps process 0 sends on
// this process's ranks until process 0 ends the job (0); a step that fails ends every process.
int kaon_tp_follow(kaon_tp *tp);
void kaon_tp_reserve_host_kv(kaon_tp *tp);
// The runner of kaon_runner_create_dp: D ranks, each a whole model but its MoE experts
// [r E / D, (r + 1) E / D) and its pool part's KV cache; kaon_tp_forward runs a step on them.
kaon_tp *kaon_dp_create(const kaon_model *m, int size, int n_threads, int max_batch_tokens, int max_logits,
                        int n_blocks, int block_size, int kv_dtype);

// The forward pass's collectives (blocks.c): x = the sum of every rank's x  [n] activations.
void kaon_tp_all_reduce(kaon_fwd *f, void *x, size_t n);
// The LM head over this rank's vocabulary rows, then every rank's slices gathered into
// a.logits [n_logits, vocab] (f32).
void kaon_tp_logits(kaon_fwd *f, const kaon_batch *b, const kaon_linear *head);
// A MoE block under data-parallel attention: this rank's n tokens x [n, dim] (positions pos)
// join every rank's, this rank's experts run over all of them, and each rank's outputs for
// this rank's tokens are summed in rank order into out [n, dim].
void kaon_dp_moe(kaon_fwd *f, int n, const void *x, const int32_t *pos, const kaon_moe_layer *moe, uint32_t *cnt,
                 void *out);

// ---- shards (tp.c, tp_moe.c) ----
// Buffers a rank's shard owns (column slices copied at load).
typedef struct kaon_tp_owned {
    void **p;
    int n;
    size_t bytes;
} kaon_tp_owned;
// Rows [r0, r0 + n) of a [rows, in] weight or elements of a vector: a view.
int kaon_tp_cut_rows(kaon_tensor *t, int64_t r0, int64_t n, const char *name);
// Columns [c0, c0 + n) of a [rows, in] weight: a copy into own (block formats on block boundaries).
int kaon_tp_cut_cols(kaon_tp_owned *own, kaon_tensor *t, int64_t c0, int64_t n, const char *name);
// m (a struct copy of base) gets its own MoE layers: rank lay's experts and expert columns,
// views of base's tensors or copies into own. kaon_tp_moe_free releases what this allocated.
int kaon_tp_moe_shard(kaon_model *m, const kaon_model *base, const kaon_tp_layout *lay, kaon_tp_owned *own);
void kaon_tp_moe_free(kaon_model *m);

#endif
