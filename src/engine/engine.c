// The engine: the public API (include/kaon.h) and the loop of its thread. Each step:
// admit new requests and aborts, schedule (scheduler.c), build one flat batch, run the
// forward pass, sample and postprocess (postprocess.c), and hand outputs to the requests.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dist/cluster.h"
#include "engine/engine_internal.h"
#include "engine/ranks.h"
#include "model/eagle3.h"
#include "model/tp.h"
#include "util/cpus.h"
#include "util/err.h"
#include "util/log.h"
#include "util/pool.h"
#include "util/timer.h"

#define KAON_STR2(x) #x
#define KAON_STR(x) KAON_STR2(x)
const char *kaon_version(void) {
    return KAON_STR(KAON_VERSION_MAJOR) "." KAON_STR(KAON_VERSION_MINOR) "." KAON_STR(KAON_VERSION_PATCH);
}

void kaon_engine_options_default(kaon_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->device = "cpu";
    o->load_tokenizer = true;
}

static void *engine_main(void *arg);

// The KV cache's element type as start-up and kaon_engine_info name it.
static const char *kv_dtype_name(const kaon_engine *e) {
    if (e->kv_dtype == KAON_KV_FP8) return "fp8_e4m3";
    return e->be && e->be->ops->act_elem_bytes == 2 ? "bf16" : "f32";
}

static int alloc_step_buffers(kaon_engine *e) {
    size_t T = (size_t)e->opts.max_num_batched_tokens, S = (size_t)e->opts.max_num_seqs;
    e->b_tokens = malloc(sizeof(int32_t) * T);
    e->b_pos = malloc(sizeof(int32_t) * T);
    e->b_slot = malloc(sizeof(int32_t) * T);
    e->b_seq = malloc(sizeof(int32_t) * T);
    e->b_rows = malloc(sizeof(int32_t) * T);
    e->b_tables = malloc(sizeof(int32_t) * S * (size_t)e->max_blocks);
    e->b_seq_rank = malloc(sizeof(int32_t) * S);
    e->logits = malloc(sizeof(float) * (size_t)e->max_logits * (size_t)e->vocab);
    e->work = malloc(sizeof(float) * (size_t)e->vocab);
    e->allowed = malloc(sizeof(uint32_t) * (((size_t)e->vocab + 31) / 32));
    e->sample_scratch = malloc(kaon_sample_scratch_bytes(e->vocab));
    e->greedy_tok = malloc(sizeof(int32_t) * (size_t)e->max_logits);
    e->row_of_sched = malloc(sizeof(int) * S);
    e->nrows_of_sched = malloc(sizeof(int) * S);
    e->smp_rows = malloc(sizeof(kaon_sample_row) * (size_t)e->max_logits);
    e->smp_of_sched = malloc(sizeof(int) * S);
    e->smp_ids = malloc(sizeof(int32_t) * (size_t)e->max_logits);
    e->smp_lps = malloc(sizeof(float) * (size_t)e->max_logits);
    e->host_rows = malloc(sizeof(int32_t) * T);
    e->cap_waiting = 1024;
    e->waiting = malloc(sizeof(seq *) * (size_t)e->cap_waiting);
    e->running = malloc(sizeof(seq *) * S);
    e->sched = malloc(sizeof(seq *) * S);
    if (!e->b_tokens || !e->b_pos || !e->b_slot || !e->b_seq || !e->b_rows || !e->b_tables || !e->b_seq_rank ||
        !e->logits || !e->work || !e->allowed || !e->sample_scratch || !e->greedy_tok || !e->row_of_sched || !e->nrows_of_sched ||
        !e->waiting || !e->running || !e->sched || !e->smp_rows || !e->smp_of_sched || !e->smp_ids ||
        !e->smp_lps || !e->host_rows)
        return kaon_set_error("engine: out of memory for step buffers");
    // Admission's estimate (scheduler.c): adaptive unless KAON_ADMIT_RATIO fixes a ratio (0: off,
    // admit by the prompt alone).
    const char *ar = getenv("KAON_ADMIT_RATIO");
    e->admit_fixed = ar && *ar && strcmp(ar, "adaptive");
    e->admit_ratio = e->admit_fixed ? atof(ar) : KAON_ADMIT_RATIO_START;
    e->admit_floor = 0.0;
    if (!(e->admit_ratio >= 0.0)) e->admit_ratio = 0.0;
    if (e->admit_ratio > 1.0) e->admit_ratio = 1.0;
    const char *ds = getenv("KAON_DEVICE_SAMPLING");
    e->device_sampling = kaon_runner_can_sample(e->runner) && !(ds && !strcmp(ds, "0"));
    // Touched now, so the footprint does not grow when many sequences first need logits.
    // The host reads its logit rows whole every step (sampling): on huge pages they stream
    // from memory much faster (and the buffer is touched whole right below anyway).
    const uintptr_t lg0 = ((uintptr_t)e->logits + 4095) & ~(uintptr_t)4095;
    const uintptr_t lg1 = ((uintptr_t)e->logits + sizeof(float) * (size_t)e->max_logits * (size_t)e->vocab) & ~(uintptr_t)4095;
    if (lg1 > lg0) madvise((void *)lg0, lg1 - lg0, MADV_HUGEPAGE);
    memset(e->logits, 0, sizeof(float) * (size_t)e->max_logits * (size_t)e->vocab);
    memset(e->greedy_tok, 0xff, sizeof(int32_t) * (size_t)e->max_logits);
    return 0;
}

// Data-parallel attention (model/tp.h): what this build runs, refused with one line otherwise.
// D > 1 needs --enable-expert-parallel (the MoE layers' experts spread over the D ranks; a
// dense model then runs plainly data parallel) and no tensor parallelism inside a rank.
static int check_data_parallel(kaon_engine *e, const kaon_device *dev) {
    const kaon_engine_options *o = &e->opts;
    e->dp_size = o->data_parallel_size > 1 ? o->data_parallel_size : 1;
    if (e->dp_size == 1) return 0;
    const int D = e->dp_size;
    if (!o->enable_expert_parallel)
        return kaon_set_error("engine: data parallel: --data-parallel-size %d needs --enable-expert-parallel (DP "
                              "attention with the experts spread over the ranks; DP replicas are separate servers)", D);
    if (o->tensor_parallel_size > 1)
        return kaon_set_error("engine: data parallel: --data-parallel-size %d with --tensor-parallel-size %d is not "
                              "supported yet (DP attention runs one rank per DP group: use -tp 1)",
                              D, o->tensor_parallel_size);
    if (dev->kind != KAON_DEVICE_CPU)
        return kaon_set_error("engine: data parallel: --data-parallel-size %d runs on the CPU only in this build", D);
    if (e->spec.method != KAON_SPEC_OFF)
        return kaon_set_error("engine: data parallel: --data-parallel-size %d with speculative decoding is not "
                              "supported yet", D);
    return kaon_dp_check(e->model, D);
}

// A multi-node job (dist/cluster.h): its processes hold the ranks of one tensor-parallel group,
// the same number each; process 0 schedules, the others follow (kaon_engine_follow).
static int check_multi_node(const kaon_engine *e) {
    const kaon_cluster *cl = kaon_cluster_get();
    const int tp = e->opts.tensor_parallel_size;
    if (!cl) return 0;
    if (tp < 2 || tp % cl->size)
        return kaon_set_error("engine: a job of %d processes needs --tensor-parallel-size a multiple of %d (each "
                              "process holds the same number of ranks; it is %d)", cl->size, cl->size, tp < 1 ? 1 : tp);
    if (e->dp_size > 1) return kaon_set_error("engine: data parallel across processes is not supported yet");
    if (e->spec.method != KAON_SPEC_OFF)
        return kaon_set_error("engine: speculative decoding in a multi-node job is not supported yet");
    return 0;
}

int kaon_engine_follow(kaon_engine *e) { return kaon_runner_follow(e->runner); }

int kaon_engine_rank_stats(kaon_engine *e, kaon_rank_stats *out, int cap) {
    return e && e->runner ? kaon_runner_rank_stats(e->runner, out, cap) : 0;
}

kaon_engine *kaon_engine_create(const kaon_engine_options *opts) {
    if (!opts || !opts->model) {
        kaon_set_error("engine: no model given");
        return NULL;
    }
    kaon_device dev;
    if (kaon_device_parse(opts->device, &dev)) {
        kaon_set_error("engine: %s", kaon_last_error());
        return NULL;
    }
    kaon_engine *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->opts = *opts;
    kaon_engine_options *o = &e->opts;
    e->device = dev;
    o->device = kaon_device_name(&dev, e->device_name, sizeof e->device_name);
    const bool on_gpu = dev.kind == KAON_DEVICE_CUDA;
    const bool kv_given = o->kv_cache_memory != 0;
    const char *kvd = o->kv_cache_dtype ? o->kv_cache_dtype : "auto";
    if (!strcmp(kvd, "fp8") || !strcmp(kvd, "fp8_e4m3")) {
        e->kv_dtype = KAON_KV_FP8;
    } else if (strcmp(kvd, "auto") && strcmp(kvd, "bf16")) {
        kaon_set_error("engine: bad KV cache dtype '%s' (auto, bf16, fp8 or fp8_e4m3)", kvd);
        free(e);
        return NULL;
    }
    if (o->n_threads <= 0) o->n_threads = kaon_default_threads();
    if (o->max_num_seqs <= 0) o->max_num_seqs = 256;
    // A GPU needs big steps to fill its tensor cores (prefill GEMMs of M = 8192); the CPU is as
    // fast at 512 and keeps decode latency low while prompts are chunked in.
    if (o->max_num_batched_tokens <= 0) o->max_num_batched_tokens = on_gpu ? 8192 : 512;
    if (o->max_num_batched_tokens < o->max_num_seqs) o->max_num_batched_tokens = o->max_num_seqs;
    if (o->kv_cache_memory == 0) o->kv_cache_memory = (size_t)1 << 30;
    // Rows with logits per step: one per running sequence, more when asked so prompt logprobs
    // and prompt logits come in big chunks (never more than the step's tokens).
    e->max_logits = o->max_num_seqs;
    if (kaon_spec_config_resolve(&o->speculative, &e->spec)) {
        kaon_set_error("engine: %s", kaon_last_error());
        free(e);
        return NULL;
    }
    // A verify step needs a row per draft besides each sequence's own (drafts are proposed
    // only while few sequences run, so the extra rows are sized for that many).
    if (e->spec.method != KAON_SPEC_OFF) {
        const int spec_seqs = e->spec.disable_at > 0 && e->spec.disable_at < o->max_num_seqs ? e->spec.disable_at : o->max_num_seqs;
        e->max_logits += (spec_seqs < 64 ? spec_seqs : 64) * e->spec.k;
    }
    if (o->max_logit_rows > e->max_logits) e->max_logits = o->max_logit_rows;
    if (e->max_logits > o->max_num_batched_tokens) e->max_logits = o->max_num_batched_tokens;
    e->prefix_caching = !o->disable_prefix_caching;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    e->next_id = 1;

    // A draft model inside the checkpoint (MTP) is loaded with it.
    e->model = e->spec.method == KAON_SPEC_MTP ? kaon_model_load_mtp(o->model) : kaon_model_load(o->model);
    if (!e->model) goto fail;
    // An EAGLE-3 head from its own folder, random like the target's weights under dummy.
    if (e->spec.method == KAON_SPEC_EAGLE3 && kaon_eagle3_attach(e->model, o->speculative.model)) goto fail;
    const kaon_model_config *c = &e->model->cfg;
    e->vocab = c->vocab_size;
    e->block_size = o->block_size > 0 ? o->block_size : 16;
    // The backend comes first: the KV plan depends on its element size and, on a GPU, on its
    // free memory.
    e->be = kaon_backend_create(&dev, o->n_threads);
    if (!e->be) goto fail;
    size_t per_token = kaon_model_kv_bytes_per_token(e->model, kaon_kv_elem_bytes(e->be, e->kv_dtype));
    if (check_data_parallel(e, &dev) || check_multi_node(e)) goto fail;
    const int tp_size = o->tensor_parallel_size > 1 ? o->tensor_parallel_size : 1;
    if (tp_size > 1 && dev.kind == KAON_DEVICE_NOOP) {
        kaon_set_error("engine: --tensor-parallel-size %d: not on the noop device", tp_size);
        goto fail;
    }
    if (tp_size > 1 && on_gpu && kaon_tp_cuda_check(e->model, tp_size, e->kv_dtype)) goto fail;
    if (o->tensor_parallel_size > 1) {
        // Every rank caches its KV heads (replicated ones on each rank that reads them; MLA's
        // latent, which every head reads, whole on every rank): the plan counts the bytes of all
        // ranks together.
        kaon_tp_layout tpl;
        if (kaon_tp_plan(e->model, o->tensor_parallel_size, 0, o->enable_expert_parallel, &tpl)) goto fail;
        if (c->kv_lora_rank > 0) per_token *= (size_t)o->tensor_parallel_size;
        else per_token = per_token / (size_t)c->n_kv_heads * (size_t)tpl.nkv * (size_t)o->tensor_parallel_size;
    }
    e->kv_per_token = per_token;
    // GPU memory plan: weights (as the backend stores them), then the activation buffers (plus a
    // reserve for cuBLAS, attention partials and graphs), then KV blocks up to
    // --gpu-memory-utilization of the device.
    size_t plan_weights = 0, plan_act = 0, gpu_total = 0, gpu_free = 0;
    double util = o->gpu_memory_utilization > 0 ? o->gpu_memory_utilization : 0.9;
    if (on_gpu && e->be->ops->mem_info) {
        if (e->be->ops->mem_info(e->be, &gpu_free, &gpu_total)) goto fail;
        plan_weights = tp_size > 1 ? kaon_tp_rank_weight_bytes(e->be, e->model, tp_size)
                                   : kaon_weights_device_bytes(e->be, e->model);
        if (e->model->eagle3) plan_weights += kaon_weights_device_bytes(e->be, e->model->eagle3->head);
        plan_act = kaon_runner_act_bytes(e->model, e->be->ops->act_elem_bytes,
                                         o->max_num_batched_tokens, e->max_logits) +
                   ((size_t)512 << 20);
        // Tensor parallel: one rank's weights and activations per device, or every rank's on
        // one device under KAON_TP_SAME_DEVICE (the test aid: each rank's KV its share).
        if (tp_size > 1 && kaon_tp_same_device()) plan_weights *= (size_t)tp_size, plan_act *= (size_t)tp_size;
        if (kaon_spec_has_draft_model(&e->spec))  // the kept hidden states and the draft's inputs
            plan_act += (e->model->eagle3 ? 9 : 2) * (size_t)o->max_num_batched_tokens * (size_t)c->hidden_size *
                        e->be->ops->act_elem_bytes;
        if (!kv_given) {
            double budget = util * (double)gpu_total - (double)(gpu_total - gpu_free) -
                            (double)plan_weights - (double)plan_act;
            if (budget < (double)per_token * 2 * e->block_size) {
                kaon_set_error("engine: no GPU memory left for the KV cache (%.2f GiB total, %.2f free, "
                               "weights %.2f GiB, activations %.2f GiB, --gpu-memory-utilization %.2f)",
                               gpu_total / 1073741824.0, gpu_free / 1073741824.0,
                               plan_weights / 1073741824.0, plan_act / 1073741824.0, util);
                goto fail;
            }
            // Between devices every rank has budget bytes on its own: the pool, counted over
            // all ranks (per_token), gets tp_size times as much.
            if (tp_size > 1 && !kaon_tp_same_device()) budget *= tp_size;
            o->kv_cache_memory = (size_t)budget;
        }
    }
    // A given max_model_len bounds the default pool: max_num_seqs sequences of that length are
    // all it can ever hold (kaon run: one). On the CPU the pool also grows past the 1 GiB
    // default to hold one whole sequence.
    if (!kv_given && o->max_model_len > 0) {
        const size_t block_bytes = per_token * (size_t)e->block_size;
        const size_t seq_bytes = block_bytes * (size_t)((o->max_model_len + e->block_size - 1) / e->block_size);
        size_t all = seq_bytes * (size_t)o->max_num_seqs;
        if (all < 2 * block_bytes) all = 2 * block_bytes;  // the pool's minimum
        // Data-parallel attention: a sequence lives in one rank's part, so each part holds one.
        if (all < (seq_bytes + block_bytes) * (size_t)e->dp_size) all = (seq_bytes + block_bytes) * (size_t)e->dp_size;
        if (all < o->kv_cache_memory) o->kv_cache_memory = all;
        if (!on_gpu && seq_bytes > o->kv_cache_memory) o->kv_cache_memory = seq_bytes;
    }
    size_t tokens = o->kv_cache_memory / per_token;
    e->n_blocks = (int)(tokens / (size_t)e->block_size);
    // Every process of a multi-node job holds its ranks' part of each block: the fewest that fit.
    if (kaon_cluster_min(&e->n_blocks)) goto fail;
    if (e->n_blocks < 2) {
        kaon_set_error("engine: --kv-cache-memory %zu bytes holds fewer than 2 blocks of %d tokens "
                       "(%zu bytes per token)", o->kv_cache_memory, e->block_size, per_token);
        goto fail;
    }
    if (e->n_blocks < 2 * e->dp_size) {
        kaon_set_error("engine: data parallel: %d KV blocks do not give each of %d ranks 2; raise --kv-cache-memory",
                       e->n_blocks, e->dp_size);
        goto fail;
    }
    // A sequence lives on one rank: its part of the pool (the smallest, when uneven) bounds it.
    int pool_tokens = e->n_blocks / e->dp_size * e->block_size;
    e->max_model_len = o->max_model_len > 0 ? o->max_model_len : c->max_position_embeddings;
    if (e->max_model_len > pool_tokens) {
        if (o->max_model_len > 0) {
            kaon_set_error("engine: max_model_len %d exceeds the KV pool (%d tokens); raise "
                           "--kv-cache-memory", o->max_model_len, pool_tokens);
            goto fail;
        }
        e->max_model_len = pool_tokens;
    }
    e->max_blocks = (e->max_model_len + e->block_size - 1) / e->block_size;
    o->max_model_len = e->max_model_len;
    if (o->load_tokenizer) {
        e->tok = e->model->gguf ? kaon_tokenizer_from_gguf(e->model->gguf)
                                : kaon_tokenizer_from_hf_dir(e->model->path);
        if (!e->tok) goto fail;
    }
    e->runner = e->dp_size > 1
                    ? kaon_runner_create_dp(e->model, e->dp_size, o->n_threads, o->max_num_batched_tokens,
                                            e->max_logits, e->n_blocks, e->block_size, e->kv_dtype)
                : o->tensor_parallel_size > 1
                    ? kaon_runner_create_tp(e->model, o->tensor_parallel_size, o->enable_expert_parallel, o->n_threads,
                                            o->max_num_batched_tokens, e->max_logits, e->n_blocks, e->block_size,
                                            e->kv_dtype, on_gpu ? dev.index : -1)
                    : kaon_runner_create_kv(e->model, e->be, o->max_num_batched_tokens, e->max_logits,
                                            e->n_blocks, e->block_size, e->kv_dtype);
    if (!e->runner || kaon_engine_expert_stats_init(e)) goto fail;
    if (dev.kind == KAON_DEVICE_CPU) kaon_runner_reserve_host_kv(e->runner);  // the pool is reserved now
    e->pool = kaon_kv_pool_create_parts(e->n_blocks, e->block_size, e->dp_size);
    if (!e->pool) {
        kaon_set_error("engine: out of memory for the block pool");
        goto fail;
    }
    if (alloc_step_buffers(e)) goto fail;
    if (kaon_spec_has_draft_model(&e->spec) && kaon_spec_model_init(e)) goto fail;
    if (on_gpu && e->be->ops->mem_info) {
        size_t fr = 0, tot = 0;
        e->be->ops->mem_info(e->be, &fr, &tot);
        const double G = 1073741824.0;
        KAON_INFO("engine: GPU memory plan: %.2f GiB of %.2f (%.0f%%): weights %.2f GiB, activations "
                  "%.2f GiB (with reserve), KV cache %d blocks x %d tokens = %.2f GiB; in use after "
                  "start-up %.2f GiB",
                  util * gpu_total / G, gpu_total / G, util * 100, plan_weights / G, plan_act / G,
                  e->n_blocks, e->block_size, (double)e->n_blocks * e->block_size * per_token / G,
                  (tot - fr) / G);
        if (tp_size > 1)
            KAON_INFO("engine: tensor parallel: %d ranks on %s; weights and activations above are %s, the KV "
                      "cache is all ranks' together", tp_size,
                      kaon_tp_same_device() ? "one device (KAON_TP_SAME_DEVICE=1)" : "one device each",
                      kaon_tp_same_device() ? "every rank's" : "one rank's");
    }
    e->stats.kv_blocks_total = e->n_blocks;
    KAON_INFO("engine: %s, %d KV blocks x %d tokens = %d tokens fit (%.1f MiB, %zu B/token %s), max_model_len %d, "
              "max_num_seqs %d, max_num_batched_tokens %d, prefix caching %s, %d threads",
              e->model->path, e->n_blocks, e->block_size, e->n_blocks * e->block_size,
              (double)e->n_blocks * e->block_size * per_token / 1048576.0, per_token, kv_dtype_name(e),
              e->max_model_len, o->max_num_seqs, o->max_num_batched_tokens,
              e->prefix_caching ? "on" : "off", o->n_threads);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        kaon_set_error("engine: cannot start its thread");
        goto fail;
    }
    e->thread_started = true;
    return e;
fail:
    kaon_engine_destroy(e);
    return NULL;
}

// ---- requests ------------------------------------------------------------------------------

static void seq_free(seq *s) {
    free(s->tokens);
    free(s->blocks);
    free(s->hashes);
    kaon_token_counts_free(&s->seen);
    kaon_token_counts_free(&s->output);
    if (s->detok) kaon_detok_free(s->detok);
    free(s->text);
    free(s->stop_reason);
    for (int i = 0; i < s->n_pend; i++) free(s->pend_lps[i].top);
    free(s->pend_ids);
    free(s->pend_lps);
    if (s->prompt_lps) {
        for (int i = 0; i < s->req->n_prompt; i++) free(s->prompt_lps[i].top);
        free(s->prompt_lps);
    }
    free(s->prompt_logits);
    if (s->constraint) s->req->sp.constraint->free(s->constraint);
}

static void request_destroy(struct kaon_request *r) {
    for (int i = 0; r->seqs && i < r->n_seqs; i++) seq_free(&r->seqs[i]);
    free(r->seqs);
    for (out_item *it = r->head; it;) {
        out_item *n = it->next;
        kaon_out_item_free(it);
        it = n;
    }
    kaon_out_item_free(r->current);
    for (int i = 0; r->stop && i < r->sp.n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->bias);
    free(r->prompt);
    pthread_cond_destroy(&r->cv);
    free(r);
}

// Drops one reference (under e->mu); the last one unlinks and frees the request.
static void request_unref(kaon_engine *e, struct kaon_request *r) {
    if (--r->refs > 0) return;
    for (struct kaon_request **p = &e->live; *p; p = &(*p)->next_live)
        if (*p == r) {
            *p = r->next_live;
            break;
        }
    request_destroy(r);
}

static int validate(const kaon_engine *e, const int32_t *prompt, int n, const kaon_sampling *sp) {
    if (!prompt || n <= 0) return kaon_set_error("the prompt is empty");
    if (n >= e->max_model_len)
        return kaon_set_error("the prompt has %d tokens; this model's maximum context length is "
                              "%d tokens (the prompt must leave room for at least one more)",
                              n, e->max_model_len);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->vocab)
            return kaon_set_error("prompt token %d at position %d is outside the vocabulary (0..%d)",
                                  prompt[i], i, e->vocab - 1);
    if (sp->n < 1 || sp->n > 128) return kaon_set_error("n must be in [1, 128], got %d", sp->n);
    if (!(sp->temperature >= 0 && sp->temperature <= 100))
        return kaon_set_error("temperature must be in [0, 100], got %g", sp->temperature);
    if (!(sp->top_p > 0 && sp->top_p <= 1)) return kaon_set_error("top_p must be in (0, 1], got %g", sp->top_p);
    if (sp->top_k < -1) return kaon_set_error("top_k must be -1 (off), 0 (off) or positive, got %d", sp->top_k);
    if (!(sp->min_p >= 0 && sp->min_p <= 1)) return kaon_set_error("min_p must be in [0, 1], got %g", sp->min_p);
    if (!(sp->repetition_penalty > 0 && sp->repetition_penalty <= 10))
        return kaon_set_error("repetition_penalty must be in (0, 10], got %g", sp->repetition_penalty);
    if (!(sp->presence_penalty >= -2 && sp->presence_penalty <= 2))
        return kaon_set_error("presence_penalty must be in [-2, 2], got %g", sp->presence_penalty);
    if (!(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2))
        return kaon_set_error("frequency_penalty must be in [-2, 2], got %g", sp->frequency_penalty);
    if (sp->max_tokens == 0 || sp->max_tokens < -1)
        return kaon_set_error("max_tokens must be at least 1, got %d", sp->max_tokens);
    if (sp->max_tokens > 0 && (int64_t)n + sp->max_tokens > e->max_model_len)
        return kaon_set_error("this model's maximum context length is %d tokens; the request has %d "
                              "prompt tokens and asks for %d more", e->max_model_len, n, sp->max_tokens);
    if (sp->min_tokens < 0) return kaon_set_error("min_tokens must be >= 0, got %d", sp->min_tokens);
    if (sp->max_tokens > 0 && sp->min_tokens > sp->max_tokens)
        return kaon_set_error("min_tokens (%d) exceeds max_tokens (%d)", sp->min_tokens, sp->max_tokens);
    if (sp->logprobs < -1 || sp->logprobs > 20) return kaon_set_error("logprobs must be in [0, 20], got %d", sp->logprobs);
    if (sp->prompt_logprobs < -1 || sp->prompt_logprobs > 20)
        return kaon_set_error("prompt_logprobs must be in [0, 20], got %d", sp->prompt_logprobs);
    if (sp->n_stop < 0 || sp->n_stop > 16 || (sp->n_stop && !sp->stop))
        return kaon_set_error("at most 16 stop strings");
    for (int i = 0; i < sp->n_stop; i++)
        if (!sp->stop[i] || !sp->stop[i][0] || strlen(sp->stop[i]) > 1024)
            return kaon_set_error("stop strings must be non-empty and at most 1024 bytes");
    if (sp->n_stop && !e->tok) return kaon_set_error("stop strings need the tokenizer");
    if (sp->n_stop_token_ids < 0 || (sp->n_stop_token_ids && !sp->stop_token_ids))
        return kaon_set_error("bad stop_token_ids");
    for (int i = 0; i < sp->n_stop_token_ids; i++)
        if (sp->stop_token_ids[i] < 0 || sp->stop_token_ids[i] >= e->vocab)
            return kaon_set_error("stop token id %d is outside the vocabulary", sp->stop_token_ids[i]);
    if (sp->constraint && (!sp->constraint->allowed || !sp->constraint->accept || !sp->constraint->clone ||
                           !sp->constraint->free))
        return kaon_set_error("a constraint needs all four of allowed, accept, clone and free");
    if (sp->n_logit_bias < 0 || sp->n_logit_bias > 1024 || (sp->n_logit_bias && !sp->logit_bias))
        return kaon_set_error("at most 1024 logit_bias entries");
    for (int i = 0; i < sp->n_logit_bias; i++) {
        if (sp->logit_bias[i].token < 0 || sp->logit_bias[i].token >= e->vocab)
            return kaon_set_error("logit_bias token %d is outside the vocabulary", sp->logit_bias[i].token);
        if (!(sp->logit_bias[i].bias >= -100 && sp->logit_bias[i].bias <= 100))
            return kaon_set_error("logit_bias values must be in [-100, 100]");
    }
    return 0;
}

static int seq_init(kaon_engine *e, struct kaon_request *r, seq *s, int index) {
    s->req = r;
    s->index = index;
    s->status = SEQ_WAITING;
    s->stop_token = -1;
    s->cap = e->max_model_len;
    s->tokens = malloc(sizeof(int32_t) * (size_t)s->cap);
    s->blocks = malloc(sizeof(int32_t) * (size_t)e->max_blocks);
    s->hashes = malloc(sizeof(uint64_t) * (size_t)e->max_blocks);
    if (!s->tokens || !s->blocks || !s->hashes) return -1;
    memcpy(s->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    s->n_tokens = r->n_prompt;
    uint64_t seed = r->sp.has_seed ? r->sp.seed + (uint64_t)index : (r->id * 0x9e3779b97f4a7c15ull) ^ (uint64_t)time(NULL);
    kaon_rng_seed(&s->rng, seed);
    if (r->sp.repetition_penalty != 1.0f)
        for (int i = 0; i < r->n_prompt; i++)
            if (kaon_token_counts_add(&s->seen, r->prompt[i], 1)) return -1;
    if (e->tok) {
        s->detok = kaon_detok_new(e->tok, r->sp.skip_special_tokens);
        if (!s->detok) return -1;
    }
    if (r->sp.prompt_logprobs >= 0 && index == 0) {
        s->want_prompt_lp = true;
        s->prompt_lps = calloc((size_t)r->n_prompt, sizeof(kaon_token_logprob));
        if (!s->prompt_lps) return -1;
        s->prompt_lps[0].token = r->prompt[0];
        s->prompt_lps[0].logprob = NAN;  // the first position has no distribution
    }
    if (r->sp.constraint) {
        s->constraint = r->sp.constraint->clone(r->sp.constraint_state);
        if (!s->constraint) return -1;
    }
    if (r->sp.prompt_logits && index == 0) {
        s->want_prompt_lp = true;
        s->prompt_logits = calloc((size_t)r->n_prompt * (size_t)e->vocab, sizeof(float));
        if (!s->prompt_logits) return -1;
    }
    return 0;
}

kaon_request *kaon_engine_submit(kaon_engine *e, const int32_t *prompt, int n_prompt,
                                 const kaon_sampling *params) {
    kaon_sampling dflt;
    if (!params) {
        kaon_sampling_default(&dflt);
        params = &dflt;
    }
    if (validate(e, prompt, n_prompt, params)) return NULL;
    struct kaon_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_cond_init(&r->cv, NULL);
    r->e = e;
    r->sp = *params;
    r->refs = 2;
    r->n_prompt = n_prompt;
    r->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    r->n_seqs = params->n;
    r->seqs = calloc((size_t)r->n_seqs, sizeof(seq));
    bool ok = r->prompt && r->seqs;
    if (ok) memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    if (ok && params->n_stop) {
        r->stop = calloc((size_t)params->n_stop, sizeof(char *));
        ok = r->stop != NULL;
        for (int i = 0; ok && i < params->n_stop; i++) {
            r->stop[i] = strdup(params->stop[i]);
            ok = r->stop[i] != NULL;
            int L = (int)strlen(params->stop[i]);
            if (L > r->max_stop_len) r->max_stop_len = L;
        }
    }
    if (ok && params->n_stop_token_ids) {
        r->stop_ids = malloc(sizeof(int32_t) * (size_t)params->n_stop_token_ids);
        ok = r->stop_ids != NULL;
        if (ok) memcpy(r->stop_ids, params->stop_token_ids, sizeof(int32_t) * (size_t)params->n_stop_token_ids);
    }
    if (ok && params->n_logit_bias) {
        r->bias = malloc(sizeof(kaon_logit_bias) * (size_t)params->n_logit_bias);
        ok = r->bias != NULL;
        if (ok) memcpy(r->bias, params->logit_bias, sizeof(kaon_logit_bias) * (size_t)params->n_logit_bias);
    }
    r->sp.stop = NULL;
    r->sp.stop_token_ids = NULL;
    r->sp.logit_bias = NULL;
    pthread_mutex_lock(&e->mu);
    r->id = e->next_id++;
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; ok && i < r->n_seqs; i++) ok = seq_init(e, r, &r->seqs[i], i) == 0;
    r->sp.constraint_state = NULL;  // the caller's: each sequence has its clone
    if (!ok) {
        kaon_set_error("out of memory for a request");
        request_destroy(r);
        return NULL;
    }
    r->t_submit = kaon_now();
    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        kaon_set_error("the engine is shutting down");
        request_destroy(r);
        return NULL;
    }
    r->next_live = e->live;
    e->live = r;
    if (e->inbox_tail) e->inbox_tail->next_inbox = r;
    else e->inbox_head = r;
    e->inbox_tail = r;
    e->stats.waiting += r->n_seqs;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
    return r;
}

uint64_t kaon_request_id(const kaon_request *r) { return r->id; }

static int wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int timeout_ms) {
    if (timeout_ms < 0) return pthread_cond_wait(cv, mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(cv, mu, &ts);
}

int kaon_request_next(kaon_request *r, kaon_output *out, int timeout_ms) {
    kaon_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    kaon_out_item_free(r->current);
    r->current = NULL;
    while (!r->head) {
        if (r->finished) {
            pthread_mutex_unlock(&e->mu);
            kaon_set_error("request %llu has finished", (unsigned long long)r->id);
            return -1;
        }
        if (timeout_ms == 0) {
            pthread_mutex_unlock(&e->mu);
            return 0;
        }
        if (wait_until(&r->cv, &e->mu, timeout_ms) == ETIMEDOUT && !r->head) {
            pthread_mutex_unlock(&e->mu);
            return 0;
        }
    }
    out_item *it = r->head;
    r->head = it->next;
    if (!r->head) r->tail = NULL;
    r->current = it;
    *out = it->o;
    if (out->finished) r->finished = true;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

void kaon_request_set_notify(kaon_request *r, void (*fn)(void *ctx), void *ctx) {
    kaon_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    r->notify = fn;
    r->notify_ctx = ctx;
    // Outputs may have arrived before the hook was set: they count as new.
    if (fn && r->head) fn(ctx);
    pthread_mutex_unlock(&e->mu);
}

void kaon_request_abort(kaon_request *r) {
    kaon_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    r->abort_requested = true;
    pthread_cond_signal(&e->work_cv);
    pthread_mutex_unlock(&e->mu);
}

void kaon_request_free(kaon_request *r) {
    if (!r) return;
    kaon_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    r->abort_requested = true;
    r->notify = NULL;  // the caller's context may be gone once this returns
    pthread_cond_signal(&e->work_cv);
    request_unref(e, r);
    pthread_mutex_unlock(&e->mu);
}

int kaon_engine_abort(kaon_engine *e, uint64_t id) {
    pthread_mutex_lock(&e->mu);
    for (struct kaon_request *r = e->live; r; r = r->next_live)
        if (r->id == id && r->n_done < r->n_seqs) {
            r->abort_requested = true;
            pthread_cond_signal(&e->work_cv);
            pthread_mutex_unlock(&e->mu);
            return 0;
        }
    pthread_mutex_unlock(&e->mu);
    return kaon_set_error("no running request with id %llu", (unsigned long long)id);
}

void kaon_engine_get_stats(kaon_engine *e, kaon_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    pthread_mutex_unlock(&e->mu);
    s->kv_usage = s->kv_blocks_total ? (double)s->kv_blocks_used / s->kv_blocks_total : 0;
    s->prefix_hit_rate = s->prefix_queries_tokens ? (double)s->prefix_hit_tokens / s->prefix_queries_tokens : 0;
}

void kaon_engine_step_times(kaon_engine *e, kaon_step_times *t) {
    pthread_mutex_lock(&e->mu);
    *t = e->step_times;
    pthread_mutex_unlock(&e->mu);
}

size_t kaon_engine_cached_prefix(kaon_engine *e, const int32_t *ids, size_t n) {
    // As match_prefix sees it: full blocks only, and one token is always left to compute.
    if (!e || !ids || n < 2 || !e->prefix_caching || !e->pool) return 0;
    const size_t full = (n - 1) / (size_t)e->block_size;
    const int n_blocks = full > (size_t)e->max_blocks ? e->max_blocks : (int)full;
    return (size_t)kaon_kv_count_cached(e->pool, ids, n_blocks) * (size_t)e->block_size;
}

void kaon_engine_get_info(kaon_engine *e, kaon_engine_info *info) {
    info->kv_cache_dtype = kv_dtype_name(e);
    info->kv_bytes_per_token = e->kv_per_token;
    info->model_path = e->model->path;
    info->arch = e->model->cfg.arch_name;
    info->vocab_size = e->vocab;
    info->max_model_len = e->max_model_len;
    info->block_size = e->block_size;
    info->kv_blocks = e->n_blocks;
}

const void *kaon_engine_tokenizer(kaon_engine *e) { return e->tok; }

void kaon_engine_sampling_defaults(kaon_engine *e, kaon_sampling *s) {
    kaon_sampling_default(s);
    kaon_sampling_apply_generation_config(s, &e->model->cfg);
}

// ---- the loop ------------------------------------------------------------------------------

// Queues an output on its request (under e->mu) and wakes its reader.
static void deliver(struct kaon_request *r, out_item *it) {
    if (r->tail) r->tail->next = it;
    else r->head = it;
    r->tail = it;
    pthread_cond_broadcast(&r->cv);
    if (r->notify) r->notify(r->notify_ctx);
}

static void fill_usage(struct kaon_request *r, out_item *it) {
    int cached = r->seqs[0].cached_tokens;
    it->o.prompt_tokens = r->n_prompt;
    it->o.completion_tokens = r->completion_tokens;
    it->o.cached_tokens = cached;
    it->o.queue_time = r->t_first_sched ? r->t_first_sched - r->t_submit : 0;
    it->o.first_token_time = r->t_first_token ? r->t_first_token - r->t_submit : 0;
}

// A seq has finished (under e->mu): free its blocks, count it, close the request when last.
static void retire(kaon_engine *e, seq *s, out_item *it) {
    struct kaon_request *r = s->req;
    kaon_sched_release(e, s);
    kaon_sched_remove(e, s);
    s->status = SEQ_DONE;
    r->n_done++;
    if (s->finish == KAON_FINISH_STOP || s->finish == KAON_FINISH_LENGTH) kaon_sched_finished(e, s);
    switch (s->finish) {
    case KAON_FINISH_STOP: e->stats.finished_stop++; break;
    case KAON_FINISH_LENGTH: e->stats.finished_length++; break;
    case KAON_FINISH_ABORT: e->stats.finished_abort++; break;
    default: e->stats.finished_error++; break;
    }
    if (it) {
        fill_usage(r, it);
        it->o.finished = r->n_done == r->n_seqs;
        deliver(r, it);
    }
    if (r->n_done == r->n_seqs) request_unref(e, r);  // the engine's reference
}

static void admit_inbox(kaon_engine *e) {
    for (struct kaon_request *r = e->inbox_head; r; r = r->next_inbox) {
        for (int i = 0; i < r->n_seqs; i++) {
            seq *s = &r->seqs[i];
            s->order = e->next_order++;
            // Room in the waiting queue for every live sequence, running ones included: a
            // preemption moves a running sequence back there and must not fail (nor write past
            // the queue, as it did when arrivals had spread over steps and 2,000+ sequences lived).
            if (e->n_waiting + e->n_running >= e->cap_waiting) {
                int cap = e->cap_waiting * 2;
                seq **w = realloc(e->waiting, sizeof(seq *) * (size_t)cap);
                if (!w) {  // cannot queue: fail this seq
                    kaon_seq_finish(s, KAON_FINISH_ERROR);
                    out_item *it = calloc(1, sizeof *it);
                    if (it) { it->o.finish = KAON_FINISH_ERROR; it->o.index = i; it->o.stop_token = -1;
                              it->error = strdup("engine out of memory"); it->o.error = it->error; }
                    retire(e, s, it);
                    continue;
                }
                e->waiting = w;
                e->cap_waiting = cap;
            }
            kaon_sched_waiting_insert(e, s);
        }
        r->admitted = true;
    }
    e->inbox_head = e->inbox_tail = NULL;
}

static void process_aborts(kaon_engine *e) {
    for (struct kaon_request *r = e->live, *next; r; r = next) {
        next = r->next_live;  // retire() may free r
        if (!r->abort_requested || !r->admitted || r->n_done == r->n_seqs) continue;
        // retire() frees r with its last sequence, so r is not read after that call.
        int left = r->n_seqs - r->n_done;
        for (int i = 0; left > 0; i++) {
            seq *s = &r->seqs[i];
            if (s->status == SEQ_DONE) continue;
            left--;
            kaon_seq_finish(s, KAON_FINISH_ABORT);
            out_item *it = kaon_post_make_output(e, s);
            retire(e, s, it);
        }
    }
}

static void update_counts(kaon_engine *e) {
    e->stats.running = e->n_running;
    int waiting = e->n_waiting;
    for (struct kaon_request *r = e->inbox_head; r; r = r->next_inbox) waiting += r->n_seqs;
    e->stats.waiting = waiting;
    e->stats.kv_blocks_used = e->n_blocks - kaon_kv_pool_n_free(e->pool);
}

// Builds the flat batch of the scheduled sequences.
static void build_batch(kaon_engine *e, kaon_batch *b) {
    int t = 0, rows = 0, maxb = 1;
    for (int i = 0; i < e->n_sched; i++) {
        int need = (e->sched[i]->n_computed + e->sched[i]->scheduled_tokens + e->block_size - 1) / e->block_size;
        if (need > maxb) maxb = need;
    }
    for (int i = 0; i < e->n_sched; i++) {
        seq *s = e->sched[i];
        int n = s->scheduled_tokens;
        memcpy(e->b_tables + (size_t)i * maxb, s->blocks, sizeof(int32_t) * (size_t)s->n_blocks);
        e->b_seq_rank[i] = s->dp_rank;
        bool prompt_rows = s->want_prompt_lp && s->n_computed < s->req->n_prompt;
        e->row_of_sched[i] = -1;
        e->nrows_of_sched[i] = 0;
        for (int k = 0; k < n; k++) {
            int p = s->n_computed + k;
            e->b_tokens[t] = s->tokens[p];
            e->b_pos[t] = p;
            e->b_slot[t] = s->blocks[p / e->block_size] * e->block_size + p % e->block_size;
            e->b_seq[t] = i;
            // Rows: every prompt position when asked, else the last token's and each draft's.
            if (prompt_rows || p + 1 >= s->n_tokens) {
                if (e->row_of_sched[i] < 0) e->row_of_sched[i] = rows;
                e->nrows_of_sched[i]++;
                e->b_rows[rows++] = t;
            }
            t++;
        }
    }
    *b = (kaon_batch){
        .n_tokens = t,
        .tokens = e->b_tokens,
        .attn = {.n_tokens = t, .n_seqs = e->n_sched, .positions = e->b_pos, .token_seq = e->b_seq,
                 .slot_mapping = e->b_slot, .block_tables = e->b_tables, .max_blocks = maxb,
                 .block_size = e->block_size},
        .n_logits = rows,
        .logit_rows = e->b_rows,
        .seq_rank = e->dp_size > 1 ? e->b_seq_rank : NULL,
    };
}

static int push_entry(kaon_engine *e, int *n, int32_t tok, float val) {
    if (*n == e->ent_cap) {
        int cap = e->ent_cap ? e->ent_cap * 2 : 4096;
        int32_t *t = realloc(e->ent_tok, sizeof(int32_t) * (size_t)cap);
        if (!t) return -1;
        e->ent_tok = t;
        float *v = realloc(e->ent_val, sizeof(float) * (size_t)cap);
        if (!v) return -1;
        e->ent_val = v;
        e->ent_cap = cap;
    }
    e->ent_tok[*n] = tok;
    e->ent_val[*n] = val;
    (*n)++;
    return 0;
}

static int push_counts(kaon_engine *e, int *n, const kaon_token_counts *c, bool with_count) {
    for (uint32_t i = 0; c->keys && i <= c->mask; i++)
        if (c->keys[i] >= 0 && push_entry(e, n, c->keys[i], with_count ? (float)c->counts[i] : 0.f))
            return -1;
    return 0;
}

// Whether a device-sampled row takes a key from the sequence's random stream.
static bool draws_key(const kaon_sampling *sp) { return sp->temperature > 0.0f && sp->top_k != 1; }

// The sequence's own stream keys its device rows, so a seeded request samples the same
// whatever else runs in its steps.
static uint64_t next_key(seq *s) {
    return (uint64_t)(kaon_rng_uniform(&s->rng) * 9007199254740992.0) * 0x9e3779b97f4a7c15ull;
}

// Adds the tokens before[0..n) to the entries from `from` on (distinct tokens, as the
// device's penalty lists want): a token already listed gets its value raised by `step`.
static int push_more(kaon_engine *e, int *n_ent, int from, const int32_t *before, int n, float step) {
    for (int j = 0; j < n; j++) {
        int at = -1;
        for (int i = from; i < *n_ent && at < 0; i++)
            if (e->ent_tok[i] == before[j]) at = i;
        if (at >= 0) e->ent_val[at] += step;
        else if (push_entry(e, n_ent, before[j], step)) return -1;
    }
    return 0;
}

// Describes a sampling row for the device, or returns 1 when this row must be sampled on the
// host (top logprobs, prompt logprobs, or a logprob wanted after edits). A draft's row
// (n_before drafts ahead of it, `before`) gets the edits as they stand once those are in.
static int device_row(kaon_engine *e, seq *s, int logit_row, const int32_t *before, int n_before,
                      kaon_sample_row *row, int *n_ent) {
    const kaon_sampling *sp = &s->req->sp;
    const bool edits = kaon_seq_edits_logits(s), mask = s->n_out + n_before < sp->min_tokens;
    if (sp->logprobs > 0 || (sp->logprobs == 0 && edits) || s->constraint) return 1;  // host sampling
    if (s->want_prompt_lp && s->n_computed < s->req->n_prompt) return 1;
    *row = (kaon_sample_row){.logit_row = logit_row, .temperature = sp->temperature, .top_k = sp->top_k,
                             .top_p = sp->top_p, .min_p = sp->min_p, .repetition = sp->repetition_penalty,
                             .presence = sp->presence_penalty, .frequency = sp->frequency_penalty,
                             .want_logprob = sp->logprobs == 0};
    if (draws_key(sp)) row->rng_key = next_key(s);
    const int start = *n_ent;
    row->bias_off = *n_ent;
    for (int i = 0; i < sp->n_logit_bias; i++)
        if (push_entry(e, n_ent, s->req->bias[i].token, s->req->bias[i].bias)) return -1;
    if (mask) {
        const kaon_model_config *c = &e->model->cfg;
        for (int i = 0; i < c->n_eos_token_ids; i++)
            if (push_entry(e, n_ent, c->eos_token_ids[i], -INFINITY)) return -1;
        for (int i = 0; i < sp->n_stop_token_ids; i++)
            if (push_entry(e, n_ent, s->req->stop_ids[i], -INFINITY)) return -1;
        if (e->tok)
            for (int t = 0; t < e->vocab; t++)
                if (kaon_tokenizer_is_eog(e->tok, t) && push_entry(e, n_ent, t, -INFINITY)) return -1;
    }
    row->n_bias = *n_ent - start;
    row->seen_off = *n_ent;
    if (sp->repetition_penalty != 1.0f &&
        (push_counts(e, n_ent, &s->seen, false) || push_more(e, n_ent, row->seen_off, before, n_before, 0.f)))
        return -1;
    row->n_seen = *n_ent - row->seen_off;
    row->out_off = *n_ent;
    if ((sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f) &&
        (push_counts(e, n_ent, &s->output, true) || push_more(e, n_ent, row->out_off, before, n_before, 1.f)))
        return -1;
    row->n_out = *n_ent - row->out_off;
    return 0;
}

// Splits this step's logit rows between the device's sampler and the host.
static int plan_sampling(kaon_engine *e, kaon_sample_batch *sb, int *n_host) {
    int n_rows = 0, n_ent = 0, nh = 0;
    for (int i = 0; i < e->n_sched; i++) {
        seq *s = e->sched[i];
        int row = e->row_of_sched[i], nrows = e->nrows_of_sched[i];
        e->smp_of_sched[i] = -1;
        if (row < 0) continue;
        int rc = 1;
        const int nd = s->n_draft, first = row + nrows - 1 - nd;  // the sampling positions' rows
        if (kaon_seq_samples(s)) {
            s->rng_before = s->rng;
            for (int j = 0; j <= nd; j++)  // one row per position, in order (all or none)
                if ((rc = device_row(e, s, first + j, s->draft, j, &e->smp_rows[n_rows + j], &n_ent))) break;
        }
        if (rc < 0) return kaon_set_error("engine: out of memory for sampling");
        if (rc == 0) {
            e->smp_of_sched[i] = n_rows;
            n_rows += 1 + nd;
            nrows -= 1 + nd;  // those rows stay on the device
        }
        for (int k = 0; k < nrows; k++) e->host_rows[nh++] = row + k;
    }
    *sb = (kaon_sample_batch){.n_rows = n_rows, .rows = e->smp_rows, .n_entries = n_ent,
                              .entry_token = e->ent_tok, .entry_value = e->ent_val};
    *n_host = nh;
    return 0;
}

// Names the newly completed full blocks in the prefix cache.
static void commit_blocks(kaon_engine *e, seq *s) {
    if (!e->prefix_caching) return;
    int full = s->n_computed / e->block_size;
    for (int i = s->n_hashed; i < full; i++) {
        uint64_t parent = i ? s->hashes[i - 1] : kaon_kv_part_root(s->dp_rank);
        const int32_t *toks = s->tokens + (size_t)i * e->block_size;
        s->hashes[i] = kaon_kv_block_hash(parent, toks, e->block_size);
        kaon_kv_commit(e->pool, s->blocks[i], s->hashes[i], parent, toks);
    }
    if (full > s->n_hashed) s->n_hashed = full;
}

static void fail_all(kaon_engine *e, const char *msg) {
    for (int i = e->n_sched - 1; i >= 0; i--) {
        seq *s = e->sched[i];
        kaon_seq_finish(s, KAON_FINISH_ERROR);
        out_item *it = kaon_post_make_output(e, s);
        if (it) {
            it->error = strdup(msg);
            it->o.error = it->error;
        }
        retire(e, s, it);
    }
}

// ---- one step as values: schedule -> execute -> process -> publish ---------------------------
// Each phase hands the next a value (the plan, the model's result, the outputs), so that the
// CPU work of step N+1 (schedule, batch building) can later overlap step N's GPU work with two
// plan slots. The plan and the result point into the engine's step buffers.

typedef struct step_plan {
    int n_seqs;                // e->sched[0 .. n_seqs)
    int n_tokens;
    kaon_batch batch;          // the flat batch of every scheduled token
    bool device_sampling;      // the rows of sb are sampled by the backend
    kaon_sample_batch sb;
    int n_host_rows;           // logit rows copied to the host besides (e->host_rows)
} step_plan;

typedef struct step_result {
    int rc;                    // 0, or -1 with err
    double forward_seconds;    // inside step_execute
    char err[512];
} step_result;

typedef struct step_outputs {
    out_item **items;          // [n_seqs] what each scheduled sequence has to say (or NULL)
    uint64_t prompt_tokens, generation_tokens;
} step_outputs;

// Under e->mu: takes in new requests and aborts, then picks this step's sequences.
// Returns the scheduled token count (0: nothing to run now).
static int step_schedule(kaon_engine *e, step_plan *p) {
    admit_inbox(e);
    process_aborts(e);
    update_counts(e);
    if (e->n_running == 0 && e->n_waiting == 0) return 0;
    p->n_tokens = kaon_sched_step(e);
    p->n_seqs = e->n_sched;
    update_counts(e);
    return p->n_tokens;
}

// Without the lock: the batch and the sampling plan (engine thread only).
static int step_prepare(kaon_engine *e, step_plan *p) {
    build_batch(e, &p->batch);
    p->device_sampling = e->device_sampling;
    p->n_host_rows = 0;
    if (p->device_sampling) return plan_sampling(e, &p->sb, &p->n_host_rows);
    for (int i = 0; i < p->n_seqs; i++) e->smp_of_sched[i] = -1;
    return 0;
}

// The forward pass (and device sampling): logits into e->logits, ids into e->smp_ids.
static void step_execute(kaon_engine *e, const step_plan *p, step_result *res) {
    const double t0 = kaon_now();
    res->rc = p->device_sampling
                  ? kaon_runner_forward_sample(e->runner, &p->batch, &p->sb, e->smp_ids, e->smp_lps,
                                               e->host_rows, p->n_host_rows, e->logits)
                  : kaon_runner_forward(e->runner, &p->batch, e->logits);
    res->err[0] = 0;
    if (res->rc) snprintf(res->err, sizeof res->err, "forward pass failed: %s", kaon_last_error());
    res->forward_seconds = kaon_now() - t0;
}

// Samples scheduled sequence i's next token from rows[0], or verifies its drafts: position j's
// token is sampled from rows[j] as it would be without drafts (same edits, same random
// stream), draft j stands when it is that token, and the first draft that is not ends the
// step with the token sampled in its place; when every draft stands, rows[n_draft] adds one
// more. So a draft x is kept with probability p(x) and otherwise replaced by a draw from p
// without x: the rejection sampling of a one-hot proposal, and the output is token for token
// what the request produces without speculation. Returns the tokens appended.
static int sample_seq(kaon_engine *e, seq *s, int i, const float *rows) {
    const int nd = s->n_draft, dev = e->smp_of_sched[i], out0 = s->n_out;
    int accepted = 0, j0 = 0;
    // Benchmarks only (force_accept): the drafts are kept unverified, then the last row samples.
    for (; e->spec.force_accept && j0 < nd && s->finish == KAON_FINISH_NONE; j0++) {
        kaon_post_accept(e, s, s->draft[j0], NULL);
        accepted++;
        e->spec_accepted_pos[j0]++;
    }
    for (int j = j0; j <= nd; j++) {
        if (j == j0 && j0 > 0 && s->finish != KAON_FINISH_NONE) break;  // a forced draft ended it
        if (dev >= 0) {
            kaon_token_logprob lp = {.token = e->smp_ids[dev + j], .logprob = e->smp_lps[dev + j]};
            kaon_post_accept(e, s, e->smp_ids[dev + j], s->req->sp.logprobs == 0 ? &lp : NULL);
        } else {
            kaon_post_sample(e, s, rows + (size_t)j * e->vocab);
        }
        if (j == nd || s->n_out == out0 + j || s->tokens[s->n_tokens - 1] != s->draft[j]) break;
        accepted++;
        e->spec_accepted_pos[j]++;
        if (s->finish != KAON_FINISH_NONE) break;
    }
    if (nd > 0) {
        e->spec_drafts++;
        e->spec_draft_tokens += (uint64_t)nd;
        e->spec_accepted += (uint64_t)accepted;
        // Device rows drew a key each; the stream keeps only the keys of the rows used.
        if (dev >= 0 && draws_key(&s->req->sp)) {
            s->rng = s->rng_before;
            for (int j = s->n_out - out0; j > 0; j--) kaon_rng_uniform(&s->rng);
        }
    }
    return s->n_out - out0;
}

// Without the lock: advances each sequence, samples, detokenizes, checks stops.
static void step_process(kaon_engine *e, const step_plan *p, const step_result *res, step_outputs *o) {
    o->prompt_tokens = o->generation_tokens = 0;
    if (res->rc) return;
    kaon_post_greedy_rows(e);
    for (int i = 0; i < p->n_seqs; i++) {
        seq *s = e->sched[i];
        const int first = s->n_computed;
        const bool samples = kaon_seq_samples(s);
        if (first < s->req->n_prompt) {
            int end = first + s->scheduled_tokens;
            o->prompt_tokens += (uint64_t)((end < s->req->n_prompt ? end : s->req->n_prompt) - first);
        }
        o->items[i] = NULL;
        const int row = e->row_of_sched[i], nrows = e->nrows_of_sched[i];
        if (row >= 0) {
            const float *rows = e->logits + (size_t)row * e->vocab;
            if (s->want_prompt_lp && first < s->req->n_prompt) {
                kaon_post_prompt_logprobs(e, s, first, rows, nrows);
                kaon_post_prompt_logits(e, s, first, rows, nrows);
            }
            if (samples) {
                o->generation_tokens += (uint64_t)sample_seq(e, s, i, rows + (size_t)(nrows - 1 - s->n_draft) * e->vocab);
                o->items[i] = kaon_post_make_output(e, s);
            }
        }
        // The cache holds every scheduled position, but positions past the last accepted draft
        // hold rejected tokens: they are not computed (the next step overwrites them).
        s->n_computed = first + s->scheduled_tokens;
        if (samples && s->n_computed > s->n_tokens - 1) s->n_computed = s->n_tokens - 1;
        s->n_draft = 0;
        commit_blocks(e, s);
    }
    kaon_engine_expert_stats_step(e);
}

// Under e->mu: counts, then each sequence's output to its request (or its retirement).
static void step_publish(kaon_engine *e, const step_plan *p, const step_result *res, step_outputs *o,
                         double seconds) {
    e->stats.steps++;
    if (o->prompt_tokens) {
        e->step_times.prefill_steps++;
        e->step_times.prefill_seconds += seconds;
    } else {
        e->step_times.decode_steps++;
        e->step_times.decode_seconds += seconds;
    }
    e->stats.constraint_masks = e->constraint_masks;
    e->stats.constraint_mask_seconds = e->constraint_mask_seconds;
    e->stats.spec_drafts = e->spec_drafts;
    e->stats.spec_draft_tokens = e->spec_draft_tokens;
    e->stats.spec_accepted_tokens = e->spec_accepted;
    memcpy(e->stats.spec_accepted_per_pos, e->spec_accepted_pos, sizeof e->spec_accepted_pos);
    if (res->rc) {
        KAON_WARN("engine: %s", res->err);
        fail_all(e, res->err);
        return;
    }
    e->stats.prompt_tokens += o->prompt_tokens;
    e->stats.generation_tokens += o->generation_tokens;
    for (int i = 0; i < p->n_seqs; i++) {
        seq *s = e->sched[i];
        if (s->finish != KAON_FINISH_NONE) {
            retire(e, s, o->items[i]);
        } else if (o->items[i]) {
            fill_usage(s->req, o->items[i]);
            deliver(s->req, o->items[i]);
        }
    }
}

static void *engine_main(void *arg) {
    kaon_engine *e = arg;
    step_outputs out = {.items = calloc((size_t)e->opts.max_num_seqs, sizeof(out_item *))};
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        step_plan plan;
        const double t_sched = kaon_now();
        if (step_schedule(e, &plan) == 0) {
            // Idle, or nothing fits now (e.g. a gated sibling): wait for a change.
            if (e->n_running == 0 && e->n_waiting == 0) pthread_cond_wait(&e->work_cv, &e->mu);
            else wait_until(&e->work_cv, &e->mu, 5);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        const double t_step = kaon_now();
        step_result res = {.rc = step_prepare(e, &plan)};
        if (res.rc) snprintf(res.err, sizeof res.err, "step planning failed: %s", kaon_last_error());
        else step_execute(e, &plan, &res);
        step_process(e, &plan, &res, &out);
        // A draft model proposes for the next step (its failure only leaves no drafts).
        if (!res.rc && kaon_spec_has_draft_model(&e->spec)) {
            const double t_draft = kaon_now();
            if (kaon_spec_model_propose(e, &plan.batch))
                KAON_WARN("engine: the draft model failed: %s", kaon_last_error());
            res.forward_seconds += kaon_now() - t_draft;  // the draft's forward, not the host's work
        }
        const double step_seconds = kaon_now() - t_step;
        pthread_mutex_lock(&e->mu);
        step_publish(e, &plan, &res, &out, step_seconds);
        // The host's share of the step: from its scheduling to its outputs published, less the
        // forward pass.
        const double host = kaon_now() - t_sched - res.forward_seconds;
        if (out.prompt_tokens) e->step_times.prefill_host_seconds += host;
        else e->step_times.decode_host_seconds += host;
    }
    // Shutdown: everything still here ends as aborted.
    admit_inbox(e);
    for (struct kaon_request *r = e->live; r; r = r->next_live) r->abort_requested = true;
    process_aborts(e);
    pthread_mutex_unlock(&e->mu);
    free(out.items);
    return NULL;
}

void kaon_engine_destroy(kaon_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        pthread_cond_signal(&e->work_cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    // Requests whose handles are still held keep pointing at e: callers free them first.
    while (e->live) {
        struct kaon_request *r = e->live;
        e->live = r->next_live;
        request_destroy(r);
    }
    free(e->b_tokens); free(e->b_pos); free(e->b_slot); free(e->b_seq); free(e->b_rows);
    free(e->b_tables); free(e->b_seq_rank); free(e->logits); free(e->work); free(e->allowed); free(e->sample_scratch); free(e->greedy_tok);
    free(e->row_of_sched); free(e->nrows_of_sched);
    free(e->smp_rows); free(e->smp_of_sched); free(e->smp_ids); free(e->smp_lps); free(e->host_rows);
    free(e->ent_tok); free(e->ent_val); free(e->waiting); free(e->running); free(e->sched);
    kaon_spec_model_free(e);
    kaon_kv_pool_free(e->pool);
    kaon_spec_config_free(&e->spec);
    kaon_pool_destroy(e->host_threads);
    kaon_engine_expert_stats_free(e);
    kaon_runner_free(e->runner);
    if (e->be) e->be->ops->destroy(e->be);
    if (e->tok) kaon_tokenizer_free(e->tok);
    kaon_model_free(e->model);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work_cv);
    free(e);
}
