// After a step: process logits (bias, min_tokens, penalties), sample, append the token,
// detokenize incrementally, find stop strings across token boundaries, and package outputs.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "engine/engine_internal.h"
#include "util/pool.h"
#include "util/timer.h"

static float log_sum_exp(const float *x, int n, float *max_out) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)(x[i] - mx));
    *max_out = mx;
    return mx + (float)log(s);
}

// The k largest entries of x (ties: lower id first), written in descending order.
static void top_k_of(const float *x, int n, int k, float lse, kaon_top_logprob *out) {
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m == k && x[i] <= out[m - 1].logprob + lse) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && out[j - 1].logprob + lse < x[i]) {
            out[j] = out[j - 1];
            j--;
        }
        out[j].token = i;
        out[j].logprob = x[i] - lse;
    }
}

static void fill_logprob(kaon_token_logprob *lp, const float *raw, int V, int32_t token, int k) {
    float mx;
    float lse = log_sum_exp(raw, V, &mx);
    lp->token = token;
    lp->logprob = raw[token] - lse;
    lp->n_top = k;
    lp->top = NULL;
    if (k > 0) {
        lp->top = malloc(sizeof(kaon_top_logprob) * (size_t)k);
        if (lp->top) top_k_of(raw, V, k, lse, lp->top);
        else lp->n_top = 0;
    }
}

void kaon_post_prompt_logprobs(kaon_engine *e, seq *s, int first_pos, const float *rows, int n) {
    if (!s->prompt_lps) return;  // already delivered (a preempted sequence recomputes its prompt)
    // Row r holds the distribution of the token at position first_pos + r + 1.
    for (int r = 0; r < n; r++) {
        int p = first_pos + r + 1;
        if (p >= s->req->n_prompt) break;
        fill_logprob(&s->prompt_lps[p], rows + (size_t)r * e->vocab, e->vocab, s->tokens[p],
                     s->req->sp.prompt_logprobs);
    }
}

void kaon_post_prompt_logits(kaon_engine *e, seq *s, int first_pos, const float *rows, int n) {
    if (!s->prompt_logits) return;
    const int left = s->req->n_prompt - first_pos;
    if (n > left) n = left;
    if (n > 0)
        memcpy(s->prompt_logits + (size_t)first_pos * e->vocab, rows, sizeof(float) * (size_t)n * e->vocab);
}

static int text_append(seq *s, const char *t, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = (s->text_len + n + 1) * 2;
        char *x = realloc(s->text, cap);
        if (!x) return -1;
        s->text = x;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, t, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return 0;
}

static bool is_eos(kaon_engine *e, int32_t t) {
    const kaon_model_config *c = &e->model->cfg;
    for (int i = 0; i < c->n_eos_token_ids; i++)
        if (c->eos_token_ids[i] == t) return true;
    return e->tok && kaon_tokenizer_is_eog(e->tok, t);
}

static bool is_stop_token(const struct kaon_request *r, int32_t t) {
    for (int i = 0; i < r->sp.n_stop_token_ids; i++)
        if (r->stop_ids[i] == t) return true;
    return false;
}

void kaon_seq_finish(seq *s, kaon_finish why) {
    if (s->finish == KAON_FINISH_NONE) s->finish = why;
}

// Searches the new text (and the tail it may complete) for stop strings.
static void check_stop_strings(seq *s, size_t old_len) {
    const struct kaon_request *r = s->req;
    size_t best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < r->sp.n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        size_t from = old_len >= L - 1 ? old_len - (L - 1) : 0;
        const char *hit = s->text_len >= L ? memmem(s->text + from, s->text_len - from, r->stop[i], L) : NULL;
        if (hit && (size_t)(hit - s->text) < best) {
            best = (size_t)(hit - s->text);
            which = i;
        }
    }
    if (which < 0) return;
    size_t cut = best + (r->sp.include_stop_str_in_output ? strlen(r->stop[which]) : 0);
    if (cut < s->text_len) {
        s->text_len = cut;
        s->text[cut] = 0;
    }
    if (s->emitted > s->text_len) s->emitted = s->text_len;
    s->stop_reason = strdup(r->stop[which]);
    kaon_seq_finish(s, KAON_FINISH_STOP);
}

static int pend_push(seq *s, int32_t id, const kaon_token_logprob *lp) {
    if (s->n_pend == s->pend_cap) {
        int cap = s->pend_cap ? s->pend_cap * 2 : 8;
        int32_t *ids = realloc(s->pend_ids, sizeof(int32_t) * (size_t)cap);
        if (!ids) return -1;
        s->pend_ids = ids;
        kaon_token_logprob *l = realloc(s->pend_lps, sizeof(kaon_token_logprob) * (size_t)cap);
        if (!l) return -1;
        s->pend_lps = l;
        s->pend_cap = cap;
    }
    s->pend_ids[s->n_pend] = id;
    if (lp) s->pend_lps[s->n_pend] = *lp;
    else memset(&s->pend_lps[s->n_pend], 0, sizeof *lp);
    s->n_pend++;
    return 0;
}

// Whether kaon_post_sample takes s's token as the plain argmax of its raw logit row: greedy,
// and nothing edits the row.
static bool plain_greedy(const seq *s) {
    const kaon_sampling *sp = &s->req->sp;
    return !kaon_seq_edits_logits(s) && (sp->temperature <= 0.0f || sp->top_k == 1);
}

// Below this many logits a step's greedy rows are not worth a pool run.
#define KAON_GREEDY_PAR_MIN (1 << 20)

// The CPU backend's threads, or (another device) the engine's own, started on first use.
static kaon_pool *host_threads(kaon_engine *e) {
    kaon_pool *p = kaon_cpu_pool(e->be);
    if (p) return p;
    if (!e->host_threads_tried) {
        e->host_threads_tried = true;
        e->host_threads = kaon_pool_create(e->opts.n_threads);  // NULL: the argmaxes run here
    }
    return e->host_threads;
}

// The argmaxes of scheduled sequence i's sampling rows that kaon_post_greedy_rows marked.
static void greedy_task(void *ctx, int i, int thread) {
    kaon_engine *e = ctx;
    (void)thread;
    const int row = e->row_of_sched[i], V = e->vocab;
    if (row < 0) return;
    const int last = row + e->nrows_of_sched[i] - 1;
    for (int r = last - e->sched[i]->n_draft; r <= last; r++)
        if (e->greedy_tok[r] == -2) e->greedy_tok[r] = kaon_argmax(e->logits + (size_t)r * V, V);
}

void kaon_post_greedy_rows(kaon_engine *e) {
    const int V = e->vocab;
    int n = 0;
    // The rows kaon_post_sample will take a plain argmax of (as engine_main picks them): the
    // sampling rows (the last, and one per draft before it) of each sequence that samples
    // this step on the host. A row found ahead is used only while the sequence is still plain
    // greedy when its turn comes (min_tokens can end between a sequence's rows).
    for (int i = 0; i < e->n_sched; i++) {
        const seq *s = e->sched[i];
        const int row = e->row_of_sched[i];
        if (row < 0) continue;
        const int last = row + e->nrows_of_sched[i] - 1, first = last - s->n_draft;
        for (int r = first; r <= last; r++) e->greedy_tok[r] = -1;
        if (!kaon_seq_samples(s) || e->smp_of_sched[i] >= 0 || !plain_greedy(s)) continue;
        for (int r = first; r <= last; r++) e->greedy_tok[r] = -2;  // to find
        n += 1 + s->n_draft;
    }
    if (n == 0) return;
    const int nt = (double)n * V >= KAON_GREEDY_PAR_MIN && e->opts.n_threads > 1 ? e->opts.n_threads : 1;
    kaon_pool_run(nt > 1 ? host_threads(e) : NULL, e->n_sched, nt, greedy_task, e);
}

// Masks what the sequence's constraint does not allow (-inf). Nonzero when the constraint has
// failed or allows nothing: the sequence then ends with an error and samples nothing.
static int apply_constraint(kaon_engine *e, seq *s, float *w) {
    const int V = e->vocab, nw = (V + 31) / 32;
    memset(e->allowed, 0, sizeof(uint32_t) * (size_t)nw);
    int any = 0;
    const double t0 = kaon_now();
    const int rc = s->req->sp.constraint->allowed(s->constraint, e->allowed, V);
    e->constraint_mask_seconds += kaon_now() - t0;
    e->constraint_masks++;
    if (rc == 0)
        for (int i = 0; i < nw; i++) {
            const uint32_t m = e->allowed[i];
            any |= m != 0;
            if (m == 0xffffffffu) continue;
            for (int b = 0; b < 32 && i * 32 + b < V; b++)
                if (!(m >> b & 1u)) w[i * 32 + b] = -INFINITY;
        }
    if (!any) {
        s->fail_msg = "the output constraint allows no next token";
        kaon_seq_finish(s, KAON_FINISH_ERROR);
        return -1;
    }
    return 0;
}

void kaon_post_sample(kaon_engine *e, seq *s, const float *raw) {
    struct kaon_request *r = s->req;
    const kaon_sampling *sp = &r->sp;
    const int V = e->vocab;
    // A token kaon_post_greedy_rows found ahead for this row.
    if (raw >= e->logits && raw < e->logits + (size_t)e->max_logits * V) {
        const size_t row = (size_t)(raw - e->logits) / (size_t)V;
        const int32_t tok = e->greedy_tok[row];
        e->greedy_tok[row] = -1;
        if (tok >= 0 && plain_greedy(s)) {
            kaon_token_logprob lp;
            if (sp->logprobs >= 0) fill_logprob(&lp, raw, V, tok, sp->logprobs);
            kaon_post_accept(e, s, tok, sp->logprobs >= 0 ? &lp : NULL);
            return;
        }
    }
    const bool penalties = kaon_sampling_has_penalties(sp);
    const bool edits = kaon_seq_edits_logits(s);
    // The raw row is kept intact for logprobs; a copy is made only when something edits it.
    float *w = edits ? e->work : (float *)raw;
    if (edits) memcpy(w, raw, sizeof(float) * (size_t)V);
    for (int i = 0; i < sp->n_logit_bias; i++) w[r->bias[i].token] += r->bias[i].bias;
    if (s->n_out < sp->min_tokens) {  // no ending before min_tokens
        const kaon_model_config *c = &e->model->cfg;
        for (int i = 0; i < c->n_eos_token_ids; i++)
            if (c->eos_token_ids[i] < V) w[c->eos_token_ids[i]] = -INFINITY;
        for (int i = 0; i < sp->n_stop_token_ids; i++) w[r->stop_ids[i]] = -INFINITY;
        if (e->tok)
            for (int t = 0; t < V; t++)
                if (kaon_tokenizer_is_eog(e->tok, t)) w[t] = -INFINITY;
    }
    if (penalties) kaon_apply_penalties(w, &s->seen, &s->output, sp->repetition_penalty, sp->presence_penalty,
                         sp->frequency_penalty);
    if (s->constraint && apply_constraint(e, s, w)) return;
    int32_t tok = kaon_sample(w, V, sp, &s->rng, e->sample_scratch);
    kaon_token_logprob lp;
    if (sp->logprobs >= 0) fill_logprob(&lp, raw, V, tok, sp->logprobs);  // raw model logprobs
    kaon_post_accept(e, s, tok, sp->logprobs >= 0 ? &lp : NULL);
}

void kaon_post_accept(kaon_engine *e, seq *s, int32_t tok, const kaon_token_logprob *lpp) {
    struct kaon_request *r = s->req;
    const kaon_sampling *sp = &r->sp;
    s->tokens[s->n_tokens++] = tok;
    s->n_out++;
    r->completion_tokens++;
    if (r->t_first_token == 0) r->t_first_token = kaon_now();
    if (sp->repetition_penalty != 1.0f) kaon_token_counts_add(&s->seen, tok, 1);
    if (sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f) kaon_token_counts_add(&s->output, tok, 1);
    pend_push(s, tok, lpp);

    bool ends = false;
    if (s->constraint && r->sp.constraint->accept(s->constraint, tok)) {
        s->fail_msg = "the output constraint rejected the sampled token";
        kaon_seq_finish(s, KAON_FINISH_ERROR);
        ends = true;
    } else if (is_stop_token(r, tok)) {
        s->stop_token = tok;
        kaon_seq_finish(s, KAON_FINISH_STOP);
        ends = true;
    } else if (!sp->ignore_eos && is_eos(e, tok)) {
        s->stop_token = tok;
        kaon_seq_finish(s, KAON_FINISH_STOP);
        ends = true;
    }
    if (!ends && s->detok) {
        char *piece = NULL;
        size_t len = 0;
        if (kaon_detok_push(s->detok, tok, &piece, &len) >= 0 && len) {
            size_t old = s->text_len;
            text_append(s, piece, len);
            if (r->sp.n_stop && s->n_out >= sp->min_tokens) check_stop_strings(s, old);
        }
        free(piece);
    }
    if (s->finish == KAON_FINISH_NONE) {
        if (sp->max_tokens > 0 && s->n_out >= sp->max_tokens) kaon_seq_finish(s, KAON_FINISH_LENGTH);
        else if (s->n_tokens >= e->max_model_len) kaon_seq_finish(s, KAON_FINISH_LENGTH);
    }
    if (s->finish != KAON_FINISH_NONE && s->detok && s->finish != KAON_FINISH_STOP) {
        char *piece = NULL;
        size_t len = 0;
        if (kaon_detok_flush(s->detok, &piece, &len) >= 0 && len) text_append(s, piece, len);
        free(piece);
    }
}

// Bytes at the end of the text that could still become a stop string: held back.
static size_t held_back(const seq *s) {
    size_t hold = 0;
    const struct kaon_request *r = s->req;
    for (int i = 0; i < r->sp.n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        for (size_t k = L - 1; k > hold; k--)
            if (k <= s->text_len && !memcmp(s->text + s->text_len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

void kaon_out_item_free(out_item *it) {
    if (!it) return;
    if (it->lps)
        for (int i = 0; i < it->o.n_tokens; i++) free(it->lps[i].top);
    if (it->plps)
        for (int i = 0; i < it->o.n_prompt_logprobs; i++) free(it->plps[i].top);
    free(it->ids);
    free(it->text);
    free(it->lps);
    free(it->plps);
    free(it->plogits);
    free(it->error);
    free(it->stop_reason);
    free(it);
}

out_item *kaon_post_make_output(kaon_engine *e, seq *s) {
    (void)e;
    struct kaon_request *r = s->req;
    bool done = s->finish != KAON_FINISH_NONE;
    size_t end = done ? s->text_len : s->text_len - held_back(s);
    if (end < s->emitted) end = s->emitted;
    bool first_prompt_lp = s->prompt_lps != NULL || s->prompt_logits != NULL;
    if (!done && s->n_pend == 0 && end == s->emitted && !first_prompt_lp) return NULL;
    out_item *it = calloc(1, sizeof *it);
    if (!it) return NULL;
    kaon_output *o = &it->o;
    o->index = s->index;
    o->stop_token = -1;
    if (s->n_pend) {
        it->ids = malloc(sizeof(int32_t) * (size_t)s->n_pend);
        if (it->ids) memcpy(it->ids, s->pend_ids, sizeof(int32_t) * (size_t)s->n_pend);
        if (r->sp.logprobs >= 0) {
            it->lps = malloc(sizeof(kaon_token_logprob) * (size_t)s->n_pend);
            if (it->lps) memcpy(it->lps, s->pend_lps, sizeof(kaon_token_logprob) * (size_t)s->n_pend);
            else for (int i = 0; i < s->n_pend; i++) free(s->pend_lps[i].top);
        }
    }
    o->token_ids = it->ids;
    o->n_tokens = it->ids ? s->n_pend : 0;
    o->logprobs = it->lps;
    s->n_pend = 0;
    it->text = malloc(end - s->emitted + 1);
    if (it->text) {
        memcpy(it->text, s->text ? s->text + s->emitted : "", end - s->emitted);
        it->text[end - s->emitted] = 0;
        o->text_len = end - s->emitted;
        s->emitted = end;
    }
    o->text = it->text ? it->text : "";
    if (s->prompt_lps) {
        it->plps = s->prompt_lps;
        o->prompt_logprobs = it->plps;
        o->n_prompt_logprobs = r->n_prompt;
        s->prompt_lps = NULL;
    }
    if (s->prompt_logits) {
        it->plogits = s->prompt_logits;
        o->prompt_logits = it->plogits;
        o->n_prompt_logits = r->n_prompt;
        s->prompt_logits = NULL;
    }
    if (done) {
        o->finish = s->finish;
        o->stop_token = s->stop_token;
        if (s->stop_reason) it->stop_reason = strdup(s->stop_reason);
        o->stop_reason = it->stop_reason;
        if (s->finish == KAON_FINISH_ERROR && s->fail_msg) {
            it->error = strdup(s->fail_msg);
            o->error = it->error;
        }
    }
    return it;
}
