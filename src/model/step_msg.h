// A step's batch as one message from process 0 of a multi-node job to its followers
// (dist/cluster.h, model/tp.c): an int32 header [kind, n_tokens, n_seqs, max_blocks,
// block_size, n_logits, has seq_rank, payload words], broadcast on the control channel, then
// the payload: tokens, positions, token_seq, slot_mapping [n_tokens each], block_tables
// [n_seqs * max_blocks], logit_rows [n_logits], seq_rank [n_seqs, when present].
#ifndef KAON_MODEL_STEP_MSG_H
#define KAON_MODEL_STEP_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "dist/comm.h"
#include "model/runner.h"

typedef struct kaon_step_msg {
    int32_t *buf;  // header + payload; a received batch points into it
    size_t cap;    // words
} kaon_step_msg;

// Root (rank 0 of ctl): sends b, or the end of the job when b is NULL.
int kaon_step_send(kaon_comm *ctl, kaon_step_msg *m, const kaon_batch *b);
// The others: 1 with a step in *out (valid until the next call), 0 at the end of the job,
// -1 + error (a message that does not hold together, max_tokens exceeded, the channel failed).
int kaon_step_recv(kaon_comm *ctl, kaon_step_msg *m, int max_tokens, kaon_batch *out);
void kaon_step_msg_free(kaon_step_msg *m);

#endif
