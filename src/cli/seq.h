// One sequence run through the model, for the single-user commands (run, chat, logits):
// a runner with an identity block table, prefill in chunks, then one token per step.
// The engine (many sequences, paged blocks) replaces this for serving.
#ifndef KAON_CLI_SEQ_H
#define KAON_CLI_SEQ_H

#include "model/model.h"

typedef struct kaon_seq {
    const kaon_model *m;
    kaon_runner *runner;
    int max_ctx, chunk, block_size;
    int32_t *block_table;  // [max_ctx / block_size], block i = i
    int32_t *scratch_i32;  // positions, slots, seq ids, rows: [4, chunk]
    float *logits;         // [chunk, vocab] when all rows are asked, else [1, vocab]
    int pos;               // tokens in the cache
} kaon_seq;

// all_logits: keep logits of every prefill row (for `kaon logits`).
int kaon_seq_init(kaon_seq *s, const kaon_model *m, kaon_backend *be, int max_ctx, int chunk,
                  bool all_logits);
void kaon_seq_free(kaon_seq *s);
// Feeds n tokens; when out != NULL writes the logits of every fed row ([n, vocab]) there,
// else s->logits holds the last row's logits.
int kaon_seq_feed(kaon_seq *s, const int32_t *ids, int n, float *out);
// Drops the cache from position pos on (to re-use a shared prefix, e.g. in chat).
void kaon_seq_truncate(kaon_seq *s, int pos);

#endif
