// Steps from process 0 to the followers (step_msg.h).
#include "model/step_msg.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

enum { STEP_RUN = 1, STEP_QUIT = 2, HEADER = 8 };

static int reserve(kaon_step_msg *m, size_t words) {
    if (words <= m->cap) return 0;
    int32_t *p = realloc(m->buf, sizeof *p * words);
    if (!p) return kaon_set_error("step message: out of memory for %zu words", words);
    m->buf = p, m->cap = words;
    return 0;
}

static size_t payload_words(const int32_t *h) {
    return 4 * (size_t)h[1] + (size_t)h[2] * (size_t)h[3] + (size_t)h[5] + (h[6] ? (size_t)h[2] : 0);
}

static int32_t *put(int32_t *p, const int32_t *src, size_t n) {
    if (n) memcpy(p, src, sizeof *p * n);
    return p + n;
}

int kaon_step_send(kaon_comm *ctl, kaon_step_msg *m, const kaon_batch *b) {
    int32_t h[HEADER] = {STEP_QUIT};
    if (b) {
        const kaon_attn_meta *a = &b->attn;
        h[0] = STEP_RUN, h[1] = b->n_tokens, h[2] = a->n_seqs, h[3] = a->max_blocks, h[4] = a->block_size;
        h[5] = b->n_logits, h[6] = b->seq_rank != NULL;
    }
    const size_t words = b ? payload_words(h) : 0;
    if (words > (size_t)INT32_MAX) return kaon_set_error("step message: a step of %zu words", words);
    h[7] = (int32_t)words;
    if (reserve(m, HEADER + words)) return -1;
    memcpy(m->buf, h, sizeof h);
    if (b) {
        const kaon_attn_meta *a = &b->attn;
        const size_t T = (size_t)b->n_tokens;
        int32_t *p = m->buf + HEADER;
        p = put(p, b->tokens, T);
        p = put(p, a->positions, T);
        p = put(p, a->token_seq, T);
        p = put(p, a->slot_mapping, T);
        p = put(p, a->block_tables, (size_t)a->n_seqs * (size_t)a->max_blocks);
        p = put(p, b->logit_rows, (size_t)b->n_logits);
        if (b->seq_rank) put(p, b->seq_rank, (size_t)a->n_seqs);
    }
    if (ctl->ops->broadcast(ctl, m->buf, HEADER, KAON_COMM_I32, 0)) return -1;
    return words ? ctl->ops->broadcast(ctl, m->buf + HEADER, words, KAON_COMM_I32, 0) : 0;
}

int kaon_step_recv(kaon_comm *ctl, kaon_step_msg *m, int max_tokens, kaon_batch *out) {
    if (reserve(m, HEADER) || ctl->ops->broadcast(ctl, m->buf, HEADER, KAON_COMM_I32, 0)) return -1;
    const int32_t *h = m->buf;
    if (h[0] == STEP_QUIT) return 0;
    if (h[0] != STEP_RUN || h[1] < 0 || h[2] < 0 || h[3] < 0 || h[4] < 1 || h[5] < 0 || h[5] > h[1] ||
        h[7] < 0 || payload_words(h) != (size_t)h[7])
        return kaon_set_error("step message: a header that does not hold together (kind %d, %d tokens)", h[0], h[1]);
    if (h[1] > max_tokens)
        return kaon_set_error("step message: a step of %d tokens (this process's limit %d)", h[1], max_tokens);
    const size_t words = (size_t)h[7];
    if (reserve(m, HEADER + words)) return -1;
    if (words && ctl->ops->broadcast(ctl, m->buf + HEADER, words, KAON_COMM_I32, 0)) return -1;
    h = m->buf;  // reserve may have moved it
    const size_t T = (size_t)h[1];
    const int32_t *p = m->buf + HEADER;
    *out = (kaon_batch){
        .n_tokens = h[1],
        .tokens = p,
        .attn = {.n_tokens = h[1], .n_seqs = h[2], .positions = p + T, .token_seq = p + 2 * T,
                 .slot_mapping = p + 3 * T, .block_tables = p + 4 * T, .max_blocks = h[3], .block_size = h[4]},
        .n_logits = h[5],
        .logit_rows = p + 4 * T + (size_t)h[2] * (size_t)h[3],
        .seq_rank = h[6] ? p + 4 * T + (size_t)h[2] * (size_t)h[3] + (size_t)h[5] : NULL,
    };
    return 1;
}

void kaon_step_msg_free(kaon_step_msg *m) {
    free(m->buf);
    m->buf = NULL;
    m->cap = 0;
}
