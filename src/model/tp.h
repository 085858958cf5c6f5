// Tensor parallelism inside one process (issue 18): N ranks, each a worker thread with its own
// backend, its own copy of the model description holding its shard of the weights, its own
// runner (activations, its KV heads' cache) and a communicator. A step's batch is handed to
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
// padding). Supported now: the CPU backend, the Llama family's dense models (Llama, Mistral,
// Qwen2, Qwen3), weights in f32/f16/bf16 or GGUF block formats.
#ifndef KAON_MODEL_TP_H
#define KAON_MODEL_TP_H

#include <stddef.h>

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
} kaon_tp_rank;

// The layout of rank r: its Q heads [q0, q0 + nq), KV heads [kv0, kv0 + nkv), FFN columns
// [f0, f0 + nf). Fails (-1 + an error naming the cause) when the model cannot be split.
typedef struct kaon_tp_layout {
    int q0, nq, kv0, nkv, f0, nf;
} kaon_tp_layout;
int kaon_tp_plan(const kaon_model *m, int size, int rank, kaon_tp_layout *out);

// The runner of kaon_runner_create_tp (runner.h): N ranks on their own CPU backends.
typedef struct kaon_tp kaon_tp;
kaon_tp *kaon_tp_create(const kaon_model *m, int size, int n_threads, int max_batch_tokens, int max_logits,
                        int n_blocks, int block_size, int kv_dtype);
void kaon_tp_free(kaon_tp *tp);
int kaon_tp_forward(kaon_tp *tp, const kaon_batch *b, float *logits);
void kaon_tp_reserve_host_kv(kaon_tp *tp);

// The forward pass's collectives (blocks.c): x = the sum of every rank's x  [n] activations.
void kaon_tp_all_reduce(kaon_fwd *f, void *x, size_t n);
// The LM head over this rank's vocabulary rows, then every rank's slices gathered into
// a.logits [n_logits, vocab] (f32).
void kaon_tp_logits(kaon_fwd *f, const kaon_batch *b, const kaon_linear *head);

#endif
