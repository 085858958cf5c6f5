// The MTP draft model's logits, for tests/ref/test_mtp_ref.py: a prompt through the target
// (one batch), then the draft model over it as the engine runs it after a step (row p: token
// p + 1 at position p with the target's hidden state at p), then one chained draft step
// (token `next` at position n - 1 with the draft's own hidden state of row n - 2).
// With EAGLE3_HEAD the draft is that EAGLE-3 head attached to MODEL (tests/ref/test_eagle3_ref.py):
// its rows have draft_vocab_size logits, the chained step reads the head's own output.
//   mtp_logits MODEL IDS(comma-separated) NEXT TARGET_OUT DRAFT_OUT [DEVICE [EAGLE3_HEAD]]
// TARGET_OUT: [n, vocab] f32; DRAFT_OUT: [n, vocab] f32 (n - 1 draft rows, then the chained one).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device.h"
#include "model/eagle3.h"
#include "model/model.h"
#include "util/err.h"

#define MAX_T 256
#define BLOCK 16

static int write_f32(const char *path, const float *x, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), n, f) != n) return -1;
    return fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: mtp_logits MODEL IDS NEXT TARGET_OUT DRAFT_OUT [DEVICE]\n");
        return 2;
    }
    int32_t ids[MAX_T], pos[MAX_T], seq[MAX_T], slot[MAX_T], rows[MAX_T], src[MAX_T], tab[MAX_T / BLOCK];
    int n = 0;
    for (char *s = argv[2]; *s && n < MAX_T;) {
        ids[n++] = (int32_t)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    const int32_t next = (int32_t)atoi(argv[3]);
    kaon_device dev;
    const char *head = argc > 7 ? argv[7] : NULL;
    kaon_model *m = n < 2 ? NULL : head ? kaon_model_load(argv[1]) : kaon_model_load_mtp(argv[1]);
    if (m && head && kaon_eagle3_attach(m, head)) {
        kaon_model_free(m);
        m = NULL;
    }
    kaon_backend *be = m && !kaon_device_parse(argc > 6 ? argv[6] : "cpu", &dev) ? kaon_backend_create(&dev, 2) : NULL;
    kaon_runner *r = be ? kaon_runner_create(m, be, MAX_T, MAX_T, MAX_T / BLOCK, BLOCK) : NULL;
    if (!r || kaon_runner_keep_hidden(r)) {
        fprintf(stderr, "mtp_logits: %s\n", n < 2 ? "need at least 2 ids" : kaon_last_error());
        return 1;
    }
    const int V = m->cfg.vocab_size, DV = head ? m->eagle3->head->cfg.draft_vocab_size : V;
    float *tl = malloc(sizeof(float) * (size_t)n * V), *dl = malloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < MAX_T / BLOCK; i++) tab[i] = i;
    for (int t = 0; t < n; t++) {
        pos[t] = slot[t] = rows[t] = src[t] = t;
        seq[t] = 0;
    }
    kaon_batch b = {.n_tokens = n, .tokens = ids,
                    .attn = {.n_tokens = n, .n_seqs = 1, .positions = pos, .token_seq = seq, .slot_mapping = slot,
                             .block_tables = tab, .max_blocks = (n + BLOCK - 1) / BLOCK, .block_size = BLOCK},
                    .n_logits = n, .logit_rows = rows};
    int rc = kaon_runner_forward(r, &b, tl);
    // The draft over the prompt: token p + 1 at position p (the target's hidden row p).
    b.n_tokens = b.attn.n_tokens = b.n_logits = n - 1;
    b.tokens = ids + 1;
    if (!rc) rc = kaon_runner_draft(r, &b, src, false, NULL, dl);
    // One chained step: `next` at position n - 1 with the draft's hidden of its last row.
    int32_t p1 = n - 1, z = 0, s1 = n - 2;
    kaon_batch c = {.n_tokens = 1, .tokens = &next,
                    .attn = {.n_tokens = 1, .n_seqs = 1, .positions = &p1, .token_seq = &z, .slot_mapping = &p1,
                             .block_tables = tab, .max_blocks = (n + BLOCK - 1) / BLOCK, .block_size = BLOCK},
                    .n_logits = 1, .logit_rows = &z};
    if (!rc) rc = kaon_runner_draft(r, &c, &s1, true, NULL, dl + (size_t)(n - 1) * DV);
    if (rc || write_f32(argv[4], tl, (size_t)n * V) || write_f32(argv[5], dl, (size_t)n * DV)) {
        fprintf(stderr, "mtp_logits: %s\n", rc ? kaon_last_error() : "cannot write the output");
        return 1;
    }
    free(tl);
    free(dl);
    kaon_runner_free(r);
    be->ops->destroy(be);
    kaon_model_free(m);
    return 0;
}
