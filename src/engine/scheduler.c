// Continuous batching: each step takes the running sequences' next tokens (decodes and
// unfinished prefill chunks) and then new sequences, under one token budget. When KV blocks
// run out, the newest running sequence is preempted (its blocks freed, recomputed later).
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/timer.h"

static bool before(const seq *a, const seq *b) {
    if (a->req->sp.priority != b->req->sp.priority) return a->req->sp.priority < b->req->sp.priority;
    return a->order < b->order;
}

// (The queue has room: admit_inbox keeps it as large as the live sequences.)
void kaon_sched_waiting_insert(kaon_engine *e, seq *s) {
    int lo = 0, hi = e->n_waiting;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (before(e->waiting[mid], s)) lo = mid + 1;
        else hi = mid;
    }
    memmove(e->waiting + lo + 1, e->waiting + lo, sizeof(seq *) * (size_t)(e->n_waiting - lo));
    e->waiting[lo] = s;
    e->n_waiting++;
    s->status = SEQ_WAITING;
}

static void remove_at(seq **arr, int *n, int i) {
    memmove(arr + i, arr + i + 1, sizeof(seq *) * (size_t)(*n - i - 1));
    (*n)--;
}

void kaon_sched_remove(kaon_engine *e, seq *s) {
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == s) { remove_at(e->running, &e->n_running, i); return; }
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i] == s) { remove_at(e->waiting, &e->n_waiting, i); return; }
}

// Frees a sequence's blocks, last block first, so the LRU hands out tails before heads.
void kaon_sched_release(kaon_engine *e, seq *s) {
    for (int i = s->n_blocks - 1; i >= 0; i--) kaon_kv_release(e->pool, s->blocks[i]);
    s->n_blocks = 0;
    s->n_hashed = 0;
    s->n_computed = 0;
}

// The newest running sequence whose blocks come from the same pool part as s's (preempting
// one of another DP rank would free nothing s can use).
static seq *newest_victim(kaon_engine *e, const seq *s) {
    for (int i = e->n_running - 1; i >= 0; i--)
        if (e->running[i]->dp_rank == s->dp_rank) return e->running[i];
    return e->running[e->n_running - 1];
}

static void preempt(kaon_engine *e, seq *s) {
    kaon_sched_release(e, s);
    kaon_sched_remove(e, s);
    kaon_sched_waiting_insert(e, s);
    e->stats.preemptions++;
}

// Allocates blocks so positions [0, upto) have a slot. false when the pool is dry.
static bool grow_blocks(kaon_engine *e, seq *s, int upto) {
    int need = (upto + e->block_size - 1) / e->block_size;
    while (s->n_blocks < need) {
        int b = kaon_kv_alloc_in(e->pool, s->dp_rank);
        if (b < 0) return false;
        s->blocks[s->n_blocks++] = b;
    }
    return true;
}

bool kaon_sched_grow_for_drafts(kaon_engine *e, seq *s, int upto) {
    // New blocks only while a block per running sequence stays free, so the sequences after
    // this one can still grow without a preemption.
    const int more = (upto + e->block_size - 1) / e->block_size - s->n_blocks;
    if (more <= 0) return true;
    return more <= kaon_kv_part_n_free(e->pool, s->dp_rank) - e->n_running && grow_blocks(e, s, upto);
}

// Reuses cached blocks for the longest matching prefix of full blocks (at least one token is
// left to compute, so the step still yields logits).
static void match_prefix(kaon_engine *e, seq *s) {
    if (!e->prefix_caching || s->want_prompt_lp || s->n_computed > 0) return;
    int full = (s->n_tokens - 1) / e->block_size;
    uint64_t parent = kaon_kv_part_root(s->dp_rank);
    int hits = 0;
    for (int i = 0; i < full; i++) {
        const int32_t *toks = s->tokens + (size_t)i * e->block_size;
        uint64_t h = kaon_kv_block_hash(parent, toks, e->block_size);
        int b = kaon_kv_lookup(e->pool, h, parent, toks);
        if (b < 0) break;
        s->blocks[s->n_blocks++] = b;
        s->hashes[i] = h;
        parent = h;
        hits++;
    }
    s->n_hashed = hits;
    s->n_computed = hits * e->block_size;
    e->stats.prefix_queries_tokens += (uint64_t)s->n_tokens;
    e->stats.prefix_hit_tokens += (uint64_t)s->n_computed;
    if (s->req->n_prompt <= s->n_tokens && s->cached_tokens == 0)
        s->cached_tokens = s->n_computed < s->req->n_prompt ? s->n_computed : s->req->n_prompt;
}

// Drafts for a decoding sequence (speculative decoding), at most room of them, written past
// its last token. They stay within its max_tokens and the context (a verify step appends up
// to one token more than it drafts), and take KV blocks only from the free pool: a draft
// never preempts anyone.
static int draft(kaon_engine *e, seq *s, int room) {
    const kaon_spec_config *c = &e->spec;
    if (c->method == KAON_SPEC_OFF || (c->disable_at > 0 && e->n_running >= c->disable_at)) return 0;
    if (s->n_tokens - s->n_computed != 1 || s->n_tokens <= s->req->n_prompt) return 0;
    int k = c->k < room ? c->k : room;
    const int max_tokens = s->req->sp.max_tokens;
    if (max_tokens > 0 && k > max_tokens - s->n_out - 1) k = max_tokens - s->n_out - 1;
    if (k > e->max_model_len - s->n_tokens - 1) k = e->max_model_len - s->n_tokens - 1;
    if (k <= 0) return 0;
    if (c->method == KAON_SPEC_ORACLE) {
        k = kaon_spec_oracle_propose(c->oracle, s->tokens, s->req->n_prompt, s->n_tokens, k, s->draft);
    } else if (kaon_spec_has_draft_model(c)) {  // made after the last step (spec_model.c)
        if (s->proposal_at != s->n_tokens) return 0;
        if (k > s->n_proposal) k = s->n_proposal;
        memcpy(s->draft, s->proposal, sizeof(int32_t) * (size_t)k);
    } else {
        k = kaon_spec_ngram_propose(s->tokens, s->n_tokens, c->ngram_min, c->ngram_max, k, s->draft);
    }
    if (k > 0) kaon_sched_grow_for_drafts(e, s, s->n_tokens + k);
    const int fit = s->n_blocks * e->block_size - s->n_tokens;
    if (k > fit) k = fit;
    if (k <= 0) return 0;
    memcpy(s->tokens + s->n_tokens, s->draft, sizeof(int32_t) * (size_t)k);
    return k;
}

// A request's later samples wait for the first one's prefill so they share its blocks.
static bool gated(const seq *s) {
    const seq *first = &s->req->seqs[0];
    return s->index > 0 && first->status != SEQ_DONE && first->n_computed < s->req->n_prompt;
}

// Prompt-logprob rows come out of the step's logits buffer, so such chunks are capped.
static int logit_room(kaon_engine *e, int rows_used) { return e->max_logits - rows_used; }

// Leading full prompt blocks cached in rank r's part of the pool.
static int cached_blocks_on(kaon_engine *e, const seq *s, int r) {
    const int full = (s->n_tokens - 1) / e->block_size;
    uint64_t parent = kaon_kv_part_root(r);
    int hits = 0;
    for (; hits < full; hits++) {
        const int32_t *toks = s->tokens + (size_t)hits * e->block_size;
        const uint64_t h = kaon_kv_block_hash(parent, toks, e->block_size);
        if (!kaon_kv_cached(e->pool, h, parent, toks)) break;
        parent = h;
    }
    return hits;
}

// Data-parallel attention: the rank a sequence's KV lives on, chosen at admission (again after
// a preemption): the one caching most of its prompt, then the one with the most free blocks,
// then the fewest running sequences, then the lowest rank (so the choice is reproducible).
static int pick_dp_rank(kaon_engine *e, const seq *s) {
    int best = 0, best_hits = -1, best_free = -1, best_running = 0;
    for (int r = 0; r < e->dp_size; r++) {
        const int hits = e->prefix_caching && !s->want_prompt_lp ? cached_blocks_on(e, s, r) : 0;
        const int free_blocks = kaon_kv_part_n_free(e->pool, r);
        int running = 0;
        for (int i = 0; i < e->n_running; i++) running += e->running[i]->dp_rank == r;
        const bool better = hits != best_hits ? hits > best_hits
                            : free_blocks != best_free ? free_blocks > best_free
                                                       : running < best_running;
        if (better) best = r, best_hits = hits, best_free = free_blocks, best_running = running;
    }
    return best;
}

// Tokens s may still add past its first `from`: to its max_tokens, else to the context; clipped.
static int tokens_left(const kaon_engine *e, const seq *s, int from) {
    int cap = e->max_model_len;
    const int max_tokens = s->req->sp.max_tokens;
    if (max_tokens > 0 && s->req->n_prompt + max_tokens < cap) cap = s->req->n_prompt + max_tokens;
    const int left = cap - from;
    return left < 0 ? 0 : left > KAON_ADMIT_CLIP ? KAON_ADMIT_CLIP : left;
}

void kaon_sched_finished(kaon_engine *e, const seq *s) {
    const int left = tokens_left(e, s, s->req->n_prompt);
    if (left <= 0) return;
    const double share = s->n_out >= left ? 1.0 : (double)s->n_out / left;
    e->admit_floor += (share - e->admit_floor) / 16.0;
}

// What admission counts for one pool part: the blocks the known tokens still need (the rest of the
// prompts) and the estimated growth (see KAON_ADMIT_RATIO_START).
typedef struct {
    int rank;  // the part summed (-1: none yet this step)
    int64_t known, growth;
} admit_need;

// Adds the blocks s needs beyond those it holds: its known tokens', and ratio x the tokens left.
static void add_need(const kaon_engine *e, const seq *s, admit_need *a) {
    const int bs = e->block_size;
    const int left = tokens_left(e, s, s->n_tokens);
    const int64_t known = ((int64_t)s->n_tokens + bs - 1) / bs - s->n_blocks;
    const int64_t upto = (int64_t)s->n_tokens + (int64_t)(e->admit_ratio * left + 0.999);
    const int64_t total = (upto + bs - 1) / bs - s->n_blocks;
    const int64_t k = known > 0 ? known : 0;
    a->known += k;
    a->growth += total > k ? total - k : 0;
}

// Whether the free blocks of s's pool part cover the known needs of s and of the running
// sequences there plus their estimated growth, the growth counted up to KAON_ADMIT_GROWTH_CAP of
// the part (summed once per part and step). Nothing running: yes.
static bool admission_fits(kaon_engine *e, const seq *s, admit_need *a) {
    if (e->admit_ratio <= 0.0) return true;
    if (a->rank != s->dp_rank) {
        admit_need r = {s->dp_rank, 0, 0};
        int n = 0;
        for (int i = 0; i < e->n_running; i++)
            if (e->running[i]->dp_rank == s->dp_rank) add_need(e, e->running[i], &r), n++;
        if (n == 0) return true;
        *a = r;
    }
    admit_need with = *a;
    add_need(e, s, &with);
    const int64_t cap = (int64_t)(KAON_ADMIT_GROWTH_CAP * kaon_kv_part_n_blocks(e->pool, s->dp_rank));
    if (with.known + (with.growth < cap ? with.growth : cap) > kaon_kv_part_n_free(e->pool, s->dp_rank)) return false;
    *a = with;
    return true;
}

int kaon_sched_step(kaon_engine *e) {
    int budget = e->opts.max_num_batched_tokens, total = 0, rows = 0;
    bool preempted = false;
    e->n_sched = 0;
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq *s = e->running[i];
        s->n_draft = 0;
        int n = s->n_tokens - s->n_computed;
        if (n > budget) n = budget;
        if (s->want_prompt_lp && s->n_computed < s->req->n_prompt) {
            int room = logit_room(e, rows);
            if (room < 1) continue;
            if (n > room) n = room;
        }
        if (n <= 0) continue;
        while (!grow_blocks(e, s, s->n_computed + n)) {
            seq *victim = newest_victim(e, s);
            preempted = true;
            preempt(e, victim);
            if (victim == s) { n = 0; break; }
        }
        if (n == 0) break;  // s itself was the newest and got preempted
        s->n_draft = draft(e, s, (budget - n < logit_room(e, rows) - 1 ? budget - n : logit_room(e, rows) - 1));
        n += s->n_draft;
        s->scheduled_tokens = n;
        e->sched[e->n_sched++] = s;
        budget -= n;
        total += n;
        rows += s->want_prompt_lp && s->n_computed < s->req->n_prompt ? n : 1 + s->n_draft;
    }
    double now = kaon_now();
    admit_need need = {-1, 0, 0};
    for (int i = 0; !preempted && i < e->n_waiting && budget > 0 &&
                    e->n_running < e->opts.max_num_seqs && rows < e->max_logits;) {
        seq *s = e->waiting[i];
        if (gated(s)) { i++; continue; }
        if (e->dp_size > 1 && s->n_blocks == 0) s->dp_rank = pick_dp_rank(e, s);
        match_prefix(e, s);
        if (!admission_fits(e, s, &need)) {
            kaon_sched_release(e, s);  // give back the prefix hits
            break;
        }
        int n = s->n_tokens - s->n_computed;
        if (n > budget) n = budget;
        if (s->want_prompt_lp) {
            int room = logit_room(e, rows);
            if (n > room) n = room;
        }
        if (n <= 0 || !grow_blocks(e, s, s->n_computed + n)) {
            kaon_sched_release(e, s);  // give back the prefix hits and any partial allocation
            break;
        }
        remove_at(e->waiting, &e->n_waiting, i);
        s->n_draft = 0;
        e->running[e->n_running++] = s;
        s->status = SEQ_RUNNING;
        if (s->req->t_first_sched == 0) s->req->t_first_sched = now;
        s->scheduled_tokens = n;
        e->sched[e->n_sched++] = s;
        budget -= n;
        total += n;
        rows += s->want_prompt_lp ? n : 1;
    }
    if (!e->admit_fixed) {
        const double floor = e->admit_floor > KAON_ADMIT_RATIO_MIN ? e->admit_floor : KAON_ADMIT_RATIO_MIN;
        const double next = e->admit_ratio - KAON_ADMIT_RATIO_DECAY;
        e->admit_ratio = preempted ? 1.0 : next > floor ? next : floor;
    }
    return total;
}
