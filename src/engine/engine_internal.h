// The engine's internal state, shared by engine.c (API + loop), scheduler.c and
// postprocess.c. Everything under "engine thread" is touched only by the engine thread;
// the rest is guarded by kaon_engine.mu.
#ifndef KAON_ENGINE_INTERNAL_H
#define KAON_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/device.h"
#include "engine/kv_cache.h"
#include "engine/penalties.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "kaon.h"
#include "engine/step_times.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

// Admission (scheduler.c; KAON_ADMIT_RATIO=R fixes the ratio, 0 turns it off: a sequence is then
// admitted when its next chunk's blocks are free): a waiting sequence is admitted only while the free KV blocks of its
// pool part cover what it and every running sequence there are estimated to still need: the
// rest of the prompt plus ratio x the tokens left to max_tokens (else to the context; clipped
// at KAON_ADMIT_CLIP). The ratio starts at START, falls by DECAY a step down to a floor, and
// goes back to 1 after a preemption (SGLang's new-token-ratio estimate). The floor is MIN or,
// when higher, the share of that remainder finished sequences really generated (a running
// average, weight 1 / 16): requests that run to max_tokens (ignore_eos) stop the cycle of
// decay and preemption. Admitting by the prompt alone let 3,000 requests of 1,000 + 1,000
// tokens preempt ~1,400 times and recompute 41% more prompt tokens (PERF.md, session 50).
// The estimated growth is counted up to GROWTH_CAP of the part's blocks: the rest stays for
// prompts, so a small pool with long max_tokens still starts every request that fits by its
// prompt (and preempts later, as without the estimate).
#define KAON_ADMIT_RATIO_START 0.7
#define KAON_ADMIT_GROWTH_CAP 0.5
#define KAON_ADMIT_RATIO_MIN 0.1
#define KAON_ADMIT_RATIO_DECAY 0.001
#define KAON_ADMIT_CLIP 4096

enum seq_status { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

// One output record in a request's queue; owns what its kaon_output points to.
typedef struct out_item {
    struct out_item *next;
    kaon_output o;
    int32_t *ids;
    char *text;
    kaon_token_logprob *lps;
    kaon_top_logprob *tops;
    kaon_token_logprob *plps;
    kaon_top_logprob *ptops;
    float *plogits;
    char *error;
    char *stop_reason;
} out_item;

typedef struct seq {
    struct kaon_request *req;
    int index;
    enum seq_status status;
    uint64_t order;              // admission order: FCFS and preemption (newest first)
    int32_t *tokens;             // prompt then output [cap]
    int n_tokens, cap;
    int n_computed;              // tokens whose K/V are in the cache
    int32_t *blocks;             // block table [max_blocks]
    int n_blocks;
    uint64_t *hashes;            // chain hash of each full block in the table [max_blocks]
    int n_hashed;                // leading full blocks named in the prefix cache
    int dp_rank;                 // data-parallel attention: the rank that owns its KV (its pool part)
    int n_out;                   // generated tokens
    kaon_finish finish;
    int32_t stop_token;
    char *stop_reason;
    kaon_rng rng;
    kaon_token_counts seen, output;  // for penalties (only when enabled)
    kaon_detok *detok;
    char *text;                  // all output text so far (for stop strings)
    size_t text_len, text_cap, emitted;
    int32_t *pend_ids;           // tokens not yet emitted
    kaon_token_logprob *pend_lps;
    int n_pend, pend_cap;
    int cached_tokens;
    bool want_prompt_lp;         // a logit row for every prompt position (logprobs or logits)
    kaon_token_logprob *prompt_lps;  // [n_prompt] until handed to the first output
    float *prompt_logits;        // [n_prompt, vocab] until handed to the first output
    int scheduled_tokens;        // this step
    // Speculation: drafts verified this step, at positions n_tokens.. (also in tokens[] past
    // n_tokens, so the batch reads them like any token), and the random stream before the
    // step drew a key per device-sampled row (the keys of rows not used are given back).
    int n_draft;
    int32_t draft[KAON_SPEC_MAX_TOKENS];
    kaon_rng rng_before;
    // A draft model's proposal (spec_model.c), made after the last step: it continues
    // tokens[0 .. proposal_at); draft() takes it while n_tokens is still proposal_at.
    int32_t proposal[KAON_SPEC_MAX_TOKENS];
    int n_proposal, proposal_at;
    void *constraint;            // the sequence's own constraint state (req->sp.constraint), or NULL
    const char *fail_msg;        // why it ended with KAON_FINISH_ERROR (a static string), or NULL
} seq;

struct kaon_request {
    kaon_engine *e;
    uint64_t id;
    int refs;                    // the handle + the engine (until every seq is done)
    kaon_sampling sp;            // arrays below are owned copies
    char **stop;
    int32_t *stop_ids;
    kaon_logit_bias *bias;
    int max_stop_len;
    int32_t *prompt;
    int n_prompt;
    int n_seqs, n_done;
    seq *seqs;
    bool abort_requested, admitted, finished;
    out_item *head, *tail, *current;
    pthread_cond_t cv;
    void (*notify)(void *);     // kaon_request_set_notify: called by deliver (under e->mu)
    void *notify_ctx;
    double t_submit, t_first_sched, t_first_token;
    int completion_tokens;
    struct kaon_request *next_live, *next_inbox;
};

struct kaon_engine {
    kaon_engine_options opts;
    kaon_device device;
    char device_name[16];        // opts.device points here
    kaon_model *model;
    kaon_backend *be;
    kaon_runner *runner;
    kaon_tokenizer *tok;
    kaon_kv_pool *pool;
    int block_size, n_blocks, max_blocks, max_model_len, max_logits, vocab;
    int kv_dtype;         // KAON_KV_NATIVE or KAON_KV_FP8
    size_t kv_per_token;  // KV cache bytes per token (all layers)
    bool prefix_caching;
    int dp_size;          // data-parallel attention ranks (1: off); the pool has one part per rank
    // Admission's estimate of the share of a running sequence's remaining max_tokens it will
    // still generate (scheduler.c): adapts between steps; fixed by KAON_ADMIT_RATIO (0: off).
    double admit_ratio;
    double admit_floor;  // the finished sequences' share (see KAON_ADMIT_RATIO_START)
    bool admit_fixed;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_t thread;
    bool thread_started, stop;
    uint64_t next_id, next_order;
    struct kaon_request *inbox_head, *inbox_tail;  // submitted, not yet admitted
    struct kaon_request *live;                     // every request not yet freed
    kaon_engine_stats stats;
    kaon_step_times step_times;  // engine/step_times.h
    uint64_t constraint_masks;       // engine thread only; published into stats each step
    double constraint_mask_seconds;
    kaon_spec_config spec;           // speculative decoding (method KAON_SPEC_OFF: none)
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted;  // engine thread; published as the above
    uint64_t spec_accepted_pos[KAON_SPEC_MAX_TOKENS];
    // The draft model's batches (spec_model.c; allocated when the method has one)
    int32_t *d_tokens, *d_pos, *d_slot, *d_seq, *d_rows, *d_src, *d_tables, *d_ids;
    int *d_prop;                     // [max_num_seqs] scheduled index of each logit row's sequence

    // engine thread
    seq **waiting;               // sorted by (priority, order)
    int n_waiting, cap_waiting;
    seq **running;               // admission order
    int n_running, cap_running;
    seq **sched;                 // scheduled this step
    int n_sched;
    // step buffers, sized at creation
    int32_t *b_tokens, *b_pos, *b_slot, *b_seq, *b_rows, *b_tables;
    int32_t *b_seq_rank;         // [max_num_seqs] each scheduled sequence's DP rank (dp_size > 1)
    float *logits;               // [max_logits, vocab]
    float *work;                 // [vocab] processed logits
    uint32_t *allowed;           // [(vocab + 31) / 32] a constrained sequence's allowed tokens
    void *sample_scratch;
    int32_t *greedy_tok;         // [max_logits] greedy tokens found ahead (-1: none), postprocess.c
    struct kaon_pool *host_threads;  // postprocess.c's threads when the backend has none (GPU)
    bool host_threads_tried;
    int *row_of_sched;           // first logit row of each scheduled seq (-1: none)
    int *nrows_of_sched;
    // Sampling on the device (when the backend can): the rows sampled there this step and
    // the logit rows that still come to the host (prompt logprobs, top logprobs, ...).
    bool device_sampling;
    kaon_sample_row *smp_rows;   // [max_logits]
    int *smp_of_sched;           // index into smp_rows of each scheduled seq (-1: none)
    int32_t *smp_ids;            // [max_logits]
    float *smp_lps;              // [max_logits]
    int32_t *host_rows;          // [max_logits]
    int32_t *ent_tok;            // edit entries of the sampled rows
    float *ent_val;
    int ent_cap;
    // Expert load (opts.expert_stats, MoE models; expert_stats.c): totals copied from the
    // runner after every step, read under mu.
    uint64_t *expert_load;       // [expert_layers, expert_n]; NULL when not counting
    uint64_t *expert_tmp;        // engine thread's copy before it is published
    int expert_layers, expert_n;
};

// expert_stats.c
int kaon_engine_expert_stats_init(kaon_engine *e);
void kaon_engine_expert_stats_step(kaon_engine *e);
void kaon_engine_expert_stats_free(kaon_engine *e);

// scheduler.c
int kaon_sched_step(kaon_engine *e);      // fills e->sched; returns scheduled token count
void kaon_sched_release(kaon_engine *e, seq *s);
void kaon_sched_finished(kaon_engine *e, const seq *s);  // a sequence ended (stop or length): admission learns its share
void kaon_sched_waiting_insert(kaon_engine *e, seq *s);
void kaon_sched_remove(kaon_engine *e, seq *s);
// Grows s's blocks to hold positions [0, upto) for drafts: only from the free pool while a block
// per running sequence stays free (a draft never causes a preemption). Whether they fit.
bool kaon_sched_grow_for_drafts(kaon_engine *e, seq *s, int upto);

// spec_model.c: speculative decoding with a draft model (MTP)
int kaon_spec_model_init(kaon_engine *e);
void kaon_spec_model_free(kaon_engine *e);
// After a step whose batch was b: the draft model runs over every position the step computed
// and kept (its KV layer stays complete), then chains k - 1 more steps for each sequence that
// will verify drafts next, leaving them in seq.proposal. 0, or -1 + error.
int kaon_spec_model_propose(kaon_engine *e, const kaon_batch *b);

// postprocess.c
// Finds the greedy token of every sampled row of this step that needs no edits, rows in
// parallel (reading the logits is most of a greedy step's host cost); kaon_post_sample then
// takes it from there. Optional: without it kaon_post_sample finds the same token itself.
void kaon_post_greedy_rows(kaon_engine *e);
// Samples and appends a token for s from logits row; builds the seq's pending output.
void kaon_post_sample(kaon_engine *e, seq *s, const float *logits);
// Appends a token chosen elsewhere (on the device) with its logprob record (or NULL).
void kaon_post_accept(kaon_engine *e, seq *s, int32_t tok, const kaon_token_logprob *lp);
void kaon_post_prompt_logprobs(kaon_engine *e, seq *s, int first_pos, const float *rows, int n);
// Copies the logit rows of prompt positions first_pos.. into s->prompt_logits.
void kaon_post_prompt_logits(kaon_engine *e, seq *s, int first_pos, const float *rows, int n);
// Turns the seq's pending tokens/text into an out_item (NULL when there is nothing new).
out_item *kaon_post_make_output(kaon_engine *e, seq *s);
void kaon_out_item_free(out_item *it);
void kaon_seq_finish(seq *s, kaon_finish why);

// Whether this step ends with s sampling (its last prompt chunk, a decode, or a verify of
// drafts), judged before the step advances n_computed.
static inline bool kaon_seq_samples(const seq *s) {
    return s->n_computed + s->scheduled_tokens == s->n_tokens + s->n_draft;
}

static inline bool kaon_sampling_has_penalties(const kaon_sampling *sp) {
    return sp->repetition_penalty != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
}

// Whether the sequence's next logits are edited before sampling (bias, the EOS mask before
// min_tokens, penalties, a constraint's mask): one predicate for the device/host split, the
// greedy shortcut and the host sampler.
static inline bool kaon_seq_edits_logits(const seq *s) {
    const kaon_sampling *sp = &s->req->sp;
    return sp->n_logit_bias > 0 || s->n_out < sp->min_tokens || kaon_sampling_has_penalties(sp) ||
           s->constraint != NULL;
}

#endif
