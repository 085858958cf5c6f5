#include "cli/seq.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

int kaon_seq_init(kaon_seq *s, const kaon_model *m, kaon_backend *be, int max_ctx, int chunk,
                  bool all_logits) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->block_size = 16;
    s->max_ctx = (max_ctx + s->block_size - 1) / s->block_size * s->block_size;
    s->chunk = chunk;
    int n_blocks = s->max_ctx / s->block_size;
    int max_logits = all_logits ? chunk : 1;
    s->runner = kaon_runner_create(m, be, chunk, max_logits, n_blocks, s->block_size);
    s->block_table = malloc(sizeof(int32_t) * (size_t)n_blocks);
    s->scratch_i32 = malloc(sizeof(int32_t) * 4 * (size_t)chunk);
    s->logits = malloc(sizeof(float) * (size_t)max_logits * (size_t)m->cfg.vocab_size);
    if (!s->runner || !s->block_table || !s->scratch_i32 || !s->logits) {
        kaon_seq_free(s);
        return s->runner ? kaon_set_error("out of memory") : -1;
    }
    for (int i = 0; i < n_blocks; i++) s->block_table[i] = i;
    return 0;
}

void kaon_seq_free(kaon_seq *s) {
    kaon_runner_free(s->runner);
    free(s->block_table);
    free(s->scratch_i32);
    free(s->logits);
    memset(s, 0, sizeof *s);
}

void kaon_seq_truncate(kaon_seq *s, int pos) {
    if (pos >= 0 && pos < s->pos) s->pos = pos;
}

int kaon_seq_feed(kaon_seq *s, const int32_t *ids, int n, float *out) {
    if (s->pos + n > s->max_ctx)
        return kaon_set_error("context full: %d + %d tokens exceed %d", s->pos, n, s->max_ctx);
    const int V = s->m->cfg.vocab_size;
    for (int done = 0; done < n;) {
        int k = n - done < s->chunk ? n - done : s->chunk;
        bool want_all = out != NULL;
        int32_t *pos = s->scratch_i32, *slot = pos + s->chunk, *seq = slot + s->chunk;
        int32_t *rows = seq + s->chunk;
        for (int i = 0; i < k; i++) {
            pos[i] = slot[i] = s->pos + i;  // identity block table: slot == position
            seq[i] = 0;
            rows[i] = i;
        }
        bool last_chunk = done + k == n;
        kaon_batch b = {
            .n_tokens = k,
            .tokens = ids + done,
            .attn = {.n_tokens = k, .n_seqs = 1, .positions = pos, .token_seq = seq,
                     .slot_mapping = slot, .block_tables = s->block_table,
                     .max_blocks = s->max_ctx / s->block_size, .block_size = s->block_size},
            .n_logits = want_all ? k : (last_chunk ? 1 : 0),
            .logit_rows = want_all ? rows : rows + (k - 1),
        };
        if (kaon_runner_forward(s->runner, &b, s->logits)) return -1;
        if (want_all) memcpy(out + (size_t)done * V, s->logits, sizeof(float) * (size_t)k * V);
        s->pos += k;
        done += k;
    }
    return 0;
}
