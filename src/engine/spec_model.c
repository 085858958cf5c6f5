// Speculative decoding with a draft model (DeepSeek's MTP layer, or an EAGLE-3 head:
// model/eagle3.h): after each step, the draft model runs on the engine thread, on the target's
// backend, through the target's runner.
//
// Draft row p is token t_{p+1} at position p with the target's final normed hidden state h_p
// and predicts t_{p+2}; its K/V goes to the MTP layer's cache at p's slot (the same block pool
// and block tables as the target's layers). So after a step whose sequence now has N tokens
// (the target computed positions < N - 1 and kept their hidden states):
//  1. one draft pass over every position the step computed and kept (prompt chunks included,
//     rejected drafts not): the MTP layer's cache then holds every computed position, and the
//     prefix cache's blocks carry it too (a reused block's last row was made with the token that
//     followed it in its first owner: a guess, which only changes acceptance). Its row N - 2
//     (token t_{N-1}, h_{N-2}) gives the first draft t_N.
//  2. k - 1 chained passes, one row per drafting sequence: the previous draft at position
//     N - 2 + j with the draft's own normed output as h (kaon's choice, the same kind of vector
//     as the target's h). These rows' K/V sit at positions >= N - 1, which the next step's pass 1
//     overwrites with the real ones.
// An EAGLE-3 head runs the same passes: h_p is then fc of the three target states it reads
// (pass 1) or its own output before the final norm (the chain), and its K/V has its own layer.
// Drafts are greedy (argmax of the draft logits): a deterministic proposer, which the verify
// keeps exactly (engine.c sample_seq). Preemption recomputes the target and so pass 1 again.
// Pass 1 runs in every step (the cache must stay complete); the chain only while fewer than
// disable_by_batch_size sequences run.
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/err.h"

int kaon_spec_model_init(kaon_engine *e) {
    const size_t T = (size_t)e->opts.max_num_batched_tokens, S = (size_t)e->opts.max_num_seqs;
    e->d_tokens = malloc(sizeof(int32_t) * T);
    e->d_pos = malloc(sizeof(int32_t) * T);
    e->d_slot = malloc(sizeof(int32_t) * T);
    e->d_seq = malloc(sizeof(int32_t) * T);
    e->d_rows = malloc(sizeof(int32_t) * T);
    e->d_src = malloc(sizeof(int32_t) * T);
    e->d_ids = malloc(sizeof(int32_t) * T);
    e->d_tables = malloc(sizeof(int32_t) * S * (size_t)e->max_blocks);
    e->d_prop = malloc(sizeof(int) * S);
    if (!e->d_tokens || !e->d_pos || !e->d_slot || !e->d_seq || !e->d_rows || !e->d_src || !e->d_ids ||
        !e->d_tables || !e->d_prop)
        return kaon_set_error("engine: out of memory for the draft model's batches");
    return kaon_runner_keep_hidden(e->runner);
}

void kaon_spec_model_free(kaon_engine *e) {
    free(e->d_tokens); free(e->d_pos); free(e->d_slot); free(e->d_seq); free(e->d_rows);
    free(e->d_src); free(e->d_ids); free(e->d_tables); free(e->d_prop);
}

// Whether s drafts in its next step: decoding, everything but its last token computed.
static bool drafts_next(const kaon_engine *e, const seq *s) {
    const kaon_spec_config *c = &e->spec;
    return s->finish == KAON_FINISH_NONE && s->n_computed == s->n_tokens - 1 && s->n_tokens > s->req->n_prompt &&
           !(c->disable_at > 0 && e->n_running >= c->disable_at);
}

// Pass 1: the rows of this step's batch b that the step kept. Returns the logit rows (one per
// drafting sequence: its row N - 2), e->d_prop naming their sequences.
static int pass_kept(kaon_engine *e, const kaon_batch *b, kaon_batch *db) {
    int T = 0, n_rows = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        const int i = b->attn.token_seq[t], p = b->attn.positions[t];
        const seq *s = e->sched[i];
        if (s->finish != KAON_FINISH_NONE || p >= s->n_computed) continue;  // done, or a rejected draft
        e->d_tokens[T] = s->tokens[p + 1];
        e->d_pos[T] = p;
        e->d_slot[T] = b->attn.slot_mapping[t];
        e->d_seq[T] = i;
        e->d_src[T] = t;
        if (p == s->n_tokens - 2 && drafts_next(e, s)) {
            e->d_prop[n_rows] = i;
            e->d_rows[n_rows++] = T;
        }
        T++;
    }
    *db = (kaon_batch){
        .n_tokens = T,
        .tokens = e->d_tokens,
        .attn = {.n_tokens = T, .n_seqs = b->attn.n_seqs, .positions = e->d_pos, .token_seq = e->d_seq,
                 .slot_mapping = e->d_slot, .block_tables = b->attn.block_tables, .max_blocks = b->attn.max_blocks,
                 .block_size = b->attn.block_size},
        .n_logits = n_rows,
        .logit_rows = e->d_rows,
    };
    return n_rows;
}

// Chained pass j (1..k-1) over the sequences of e->d_prop[0 .. n) that still draft: row c is
// proposal[j - 1] at position N - 2 + j, its hidden state the draft's row src[c] of the
// previous pass. Sequences whose position has no KV slot free leave the chain. Returns the rows.
static int pass_chain(kaon_engine *e, int j, int n, kaon_batch *db) {
    const int bs = e->block_size;
    int m = 0, maxb = 1;
    for (int c = 0; c < n; c++) {
        seq *s = e->sched[e->d_prop[c]];
        const int q = s->n_tokens - 2 + j;
        if (!kaon_sched_grow_for_drafts(e, s, q + 1)) continue;
        if (s->n_blocks > maxb) maxb = s->n_blocks;
        e->d_prop[m] = e->d_prop[c];
        e->d_src[m] = e->d_rows[c];
        m++;
    }
    for (int c = 0; c < m; c++) {
        seq *s = e->sched[e->d_prop[c]];
        const int q = s->n_tokens - 2 + j;
        memcpy(e->d_tables + (size_t)c * maxb, s->blocks, sizeof(int32_t) * (size_t)s->n_blocks);
        e->d_tokens[c] = s->proposal[j - 1];
        e->d_pos[c] = q;
        e->d_slot[c] = s->blocks[q / bs] * bs + q % bs;
        e->d_seq[c] = c;
        e->d_rows[c] = c;
    }
    *db = (kaon_batch){
        .n_tokens = m,
        .tokens = e->d_tokens,
        .attn = {.n_tokens = m, .n_seqs = m, .positions = e->d_pos, .token_seq = e->d_seq, .slot_mapping = e->d_slot,
                 .block_tables = e->d_tables, .max_blocks = maxb, .block_size = bs},
        .n_logits = m,
        .logit_rows = e->d_rows,
    };
    return m;
}

int kaon_spec_model_propose(kaon_engine *e, const kaon_batch *b) {
    kaon_batch db;
    int n = pass_kept(e, b, &db);
    if (db.n_tokens == 0) return 0;
    // d_src is read by the runner before the pass; the chain's sources are the logit rows.
    if (kaon_runner_draft(e->runner, &db, e->d_src, false, e->d_ids, e->logits)) return -1;
    for (int c = 0; c < n; c++) {
        seq *s = e->sched[e->d_prop[c]];
        s->proposal[0] = e->d_ids[c];
        s->n_proposal = 1;
        s->proposal_at = s->n_tokens;
    }
    for (int j = 1; j < e->spec.k && n > 0; j++) {
        n = pass_chain(e, j, n, &db);
        if (n == 0) break;
        if (kaon_runner_draft(e->runner, &db, e->d_src, true, e->d_ids, e->logits)) return -1;
        for (int c = 0; c < n; c++) {
            seq *s = e->sched[e->d_prop[c]];
            s->proposal[j] = e->d_ids[c];
            s->n_proposal = j + 1;
        }
    }
    return 0;
}
