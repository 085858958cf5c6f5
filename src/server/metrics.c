#include "server/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ranks.h"
#include "engine/step_times.h"
#include "server/sse.h"

const double kaon_ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                    0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                    20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const int kaon_n_ttft_buckets = (int)(sizeof kaon_ttft_buckets / sizeof *kaon_ttft_buckets);
const double kaon_itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,
                                   0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,
                                   7.5,  10.0,  20.0, 40.0,  80.0};
const int kaon_n_itl_buckets = (int)(sizeof kaon_itl_buckets / sizeof *kaon_itl_buckets);
const double kaon_latency_buckets[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                       5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                       60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const int kaon_n_latency_buckets =
    (int)(sizeof kaon_latency_buckets / sizeof *kaon_latency_buckets);

static const int status_codes[KAON_METRICS_N_STATUS] = {200, 204, 400, 401, 404, 405,
                                                        413, 422, 429, 499, 500, 503, 504};

void kaon_histogram_init(kaon_histogram *h, const double *bounds, int n_bounds) {
    memset(h, 0, sizeof *h);
    if (n_bounds > KAON_HIST_MAX_BUCKETS) n_bounds = KAON_HIST_MAX_BUCKETS;
    h->bounds = bounds;
    h->n_bounds = n_bounds < 0 ? 0 : n_bounds;
}

void kaon_histogram_observe(kaon_histogram *h, double v) {
    if (isnan(v)) return;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void kaon_metrics_init(kaon_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    kaon_histogram_init(&m->ttft, kaon_ttft_buckets, kaon_n_ttft_buckets);
    kaon_histogram_init(&m->itl, kaon_itl_buckets, kaon_n_itl_buckets);
    kaon_histogram_init(&m->e2e, kaon_latency_buckets, kaon_n_latency_buckets);
    kaon_histogram_init(&m->queue, kaon_latency_buckets, kaon_n_latency_buckets);
}

void kaon_metrics_destroy(kaon_metrics *m) { pthread_mutex_destroy(&m->mu); }

static void observe(kaon_metrics *m, kaon_histogram *h, double v, int count) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < count; i++) kaon_histogram_observe(h, v);
    pthread_mutex_unlock(&m->mu);
}

void kaon_metrics_observe_ttft(kaon_metrics *m, double v) { observe(m, &m->ttft, v, 1); }
void kaon_metrics_observe_itl(kaon_metrics *m, double v, int count) { observe(m, &m->itl, v, count); }
void kaon_metrics_observe_e2e(kaon_metrics *m, double v) { observe(m, &m->e2e, v, 1); }
void kaon_metrics_observe_queue(kaon_metrics *m, double v) { observe(m, &m->queue, v, 1); }

void kaon_metrics_count_status(kaon_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < KAON_METRICS_N_STATUS && status_codes[i] != status) i++;
    if (i < KAON_METRICS_N_STATUS)
        m->http_status[i]++;
    else
        m->http_other++;
    pthread_mutex_unlock(&m->mu);
}

// A label value: backslash, double quote and newline escaped (exposition format rules).
static void put_label(kaon_sbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\')
            kaon_sbuf_append(b, "\\\\", 2);
        else if (*s == '"')
            kaon_sbuf_append(b, "\\\"", 2);
        else if (*s == '\n')
            kaon_sbuf_append(b, "\\n", 2);
        else
            kaon_sbuf_append(b, s, 1);
    }
}

static void head(kaon_sbuf *b, const char *name, const char *type, const char *help) {
    kaon_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

// name{model_name="..."[,extra]} value
static void sample(kaon_sbuf *b, const char *name, const char *model, const char *extra,
                   double v) {
    kaon_sbuf_printf(b, "%s{model_name=\"", name);
    put_label(b, model);
    kaon_sbuf_puts(b, "\"");
    if (extra) {
        kaon_sbuf_puts(b, ",");
        kaon_sbuf_puts(b, extra);
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        kaon_sbuf_printf(b, "} %.0f\n", v);
        return;
    }
    char num[32];
    for (int prec = 1; prec <= 17; prec++) {  // shortest exact form
        snprintf(num, sizeof num, "%.*g", prec, v);
        if (strtod(num, NULL) == v) break;
    }
    kaon_sbuf_printf(b, "} %s\n", num);
}

static void histogram(kaon_sbuf *b, const char *name, const char *help, const char *model,
                      const kaon_histogram *h) {
    head(b, name, "histogram", help);
    char bucket[128], le[64];
    snprintf(bucket, sizeof bucket, "%s_bucket", name);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n_bounds; i++) {
        cum += h->counts[i];
        if (i < h->n_bounds) {
            // The shortest form that reads back exactly: 0.04, not 0.040000000000000001.
            char num[32];
            for (int prec = 1; prec <= 17; prec++) {
                snprintf(num, sizeof num, "%.*g", prec, h->bounds[i]);
                if (strtod(num, NULL) == h->bounds[i]) break;
            }
            // Prometheus clients print bounds as floats: 1.0, not 1.
            snprintf(le, sizeof le, "le=\"%s%s\"", num, strpbrk(num, ".e") ? "" : ".0");
        } else {
            snprintf(le, sizeof le, "le=\"+Inf\"");
        }
        sample(b, bucket, model, le, (double)cum);
    }
    char n2[128];
    snprintf(n2, sizeof n2, "%s_sum", name);
    sample(b, n2, model, NULL, h->sum);
    snprintf(n2, sizeof n2, "%s_count", name);
    sample(b, n2, model, NULL, (double)h->count);
}

// An engine statistic as a sample value.
typedef double (*stat_fn)(const kaon_engine_stats *s);
#define STAT(f) \
    static double stat_##f(const kaon_engine_stats *s) { return (double)s->f; }
STAT(running)
STAT(waiting)
STAT(kv_usage)
STAT(prefix_queries_tokens)
STAT(prefix_hit_tokens)
STAT(preemptions)
STAT(prompt_tokens)
STAT(generation_tokens)
STAT(finished_stop)
STAT(finished_length)
STAT(finished_abort)
STAT(finished_error)
STAT(kv_blocks_total)
STAT(steps)
STAT(constraint_masks)
STAT(constraint_mask_seconds)
STAT(spec_drafts)
STAT(spec_draft_tokens)
STAT(spec_accepted_tokens)
#undef STAT

// The engines' statistics: the totals, and each replica's when there are several.
typedef struct engine_view {
    const kaon_engine_stats *total, *per;
    int n;
} engine_view;

// One engine series' samples: the total first (the unlabelled sample dashboards and the
// tests read), then, with data-parallel replicas, each one's under engine="i" (vLLM's label).
static void engine_samples(kaon_sbuf *b, const char *name, const char *model, const char *extra,
                           const engine_view *v, stat_fn f) {
    sample(b, name, model, extra, f(v->total));
    for (int i = 0; v->n > 1 && i < v->n; i++) {
        char lab[96];
        snprintf(lab, sizeof lab, "%s%sengine=\"%d\"", extra ? extra : "", extra ? "," : "", i);
        sample(b, name, model, lab, f(&v->per[i]));
    }
}

static void engine_metric(kaon_sbuf *b, const char *name, const char *type, const char *help,
                          const char *model, const engine_view *v, stat_fn f) {
    head(b, name, type, help);
    engine_samples(b, name, model, NULL, v, f);
}

static void engine_series(kaon_sbuf *b, const char *model, const engine_view *v) {
    engine_metric(b, "kaon:num_requests_running", "gauge",
                  "Number of requests in model execution batches.", model, v, stat_running);
    engine_metric(b, "kaon:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                  model, v, stat_waiting);
    engine_metric(b, "kaon:kv_cache_usage_perc", "gauge",
                  "KV-cache usage. 1 means 100 percent usage.", model, v, stat_kv_usage);
    engine_metric(b, "kaon:prefix_cache_queries_total", "counter",
                  "Prefix cache queries, in terms of number of queried tokens.", model, v,
                  stat_prefix_queries_tokens);
    engine_metric(b, "kaon:prefix_cache_hits_total", "counter",
                  "Prefix cache hits, in terms of number of cached tokens.", model, v,
                  stat_prefix_hit_tokens);
    engine_metric(b, "kaon:num_preemptions_total", "counter", "Cumulative number of preemptions.",
                  model, v, stat_preemptions);
    engine_metric(b, "kaon:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                  model, v, stat_prompt_tokens);
    engine_metric(b, "kaon:generation_tokens_total", "counter",
                  "Number of generation tokens processed.", model, v, stat_generation_tokens);
    head(b, "kaon:request_success_total", "counter", "Count of successfully processed requests.");
    engine_samples(b, "kaon:request_success_total", model, "finished_reason=\"stop\"", v,
                   stat_finished_stop);
    engine_samples(b, "kaon:request_success_total", model, "finished_reason=\"length\"", v,
                   stat_finished_length);
    engine_samples(b, "kaon:request_success_total", model, "finished_reason=\"abort\"", v,
                   stat_finished_abort);
    engine_samples(b, "kaon:request_success_total", model, "finished_reason=\"error\"", v,
                   stat_finished_error);
    engine_metric(b, "kaon:num_kv_blocks_total", "gauge", "Number of KV-cache blocks.", model, v,
                  stat_kv_blocks_total);
    engine_metric(b, "kaon:engine_steps_total", "counter", "Number of engine steps run.", model, v,
                  stat_steps);
    engine_metric(b, "kaon:structured_output_masks_total", "counter",
                  "Token masks computed for structured outputs (one per constrained token).", model,
                  v, stat_constraint_masks);
    engine_metric(b, "kaon:structured_output_mask_seconds_total", "counter",
                  "Time spent computing structured-output token masks.", model, v,
                  stat_constraint_mask_seconds);
    engine_metric(b, "kaon:spec_decode_num_drafts_total", "counter",
                  "Verify steps of a sequence with draft tokens (speculative decoding).", model, v,
                  stat_spec_drafts);
    engine_metric(b, "kaon:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.",
                  model, v, stat_spec_draft_tokens);
    engine_metric(b, "kaon:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
                  model, v, stat_spec_accepted_tokens);
    head(b, "kaon:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Draft tokens accepted, by their position among a step's drafts.");
    for (int p = 0; p < KAON_SPEC_MAX_TOKENS; p++) {
        char lab[32];
        snprintf(lab, sizeof lab, "position=\"%d\"", p);
        sample(b, "kaon:spec_decode_num_accepted_tokens_per_pos_total", model, lab,
               (double)v->total->spec_accepted_per_pos[p]);
        for (int i = 0; v->n > 1 && i < v->n; i++) {
            char lab2[64];
            snprintf(lab2, sizeof lab2, "position=\"%d\",engine=\"%d\"", p, i);
            sample(b, "kaon:spec_decode_num_accepted_tokens_per_pos_total", model, lab2,
                   (double)v->per[i].spec_accepted_per_pos[p]);
        }
    }
}

char *kaon_metrics_render(kaon_metrics *m, const kaon_engine_stats *s,
                          const kaon_engine_stats *per, int n_engines, const char *model,
                          size_t *len) {
    kaon_sbuf b = {0};
    if (!model) model = "";
    if (s) {
        const engine_view v = {s, per, per ? n_engines : 0};
        engine_series(&b, model, &v);
    }
    pthread_mutex_lock(&m->mu);
    kaon_histogram ttft = m->ttft, itl = m->itl, e2e = m->e2e, queue = m->queue;
    uint64_t st[KAON_METRICS_N_STATUS], other = m->http_other;
    memcpy(st, m->http_status, sizeof st);
    pthread_mutex_unlock(&m->mu);
    histogram(&b, "kaon:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              model, &ttft);
    histogram(&b, "kaon:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              model, &itl);
    histogram(&b, "kaon:e2e_request_latency_seconds",
              "Histogram of end to end request latency in seconds.", model, &e2e);
    histogram(&b, "kaon:request_queue_time_seconds",
              "Histogram of time spent in WAITING phase for request.", model, &queue);
    head(&b, "kaon:http_requests_total", "counter", "HTTP responses by status code.");
    for (int i = 0; i < KAON_METRICS_N_STATUS; i++) {
        char extra[32];
        snprintf(extra, sizeof extra, "code=\"%d\"", status_codes[i]);
        sample(&b, "kaon:http_requests_total", model, extra, (double)st[i]);
    }
    sample(&b, "kaon:http_requests_total", model, "code=\"other\"", (double)other);
    if (b.failed) {
        kaon_sbuf_free(&b);
        return NULL;
    }
    return kaon_sbuf_take(&b, len);
}

// The appenders' end: b (text with samples added) replaces text, which is kept as it was when
// memory ran out.
static char *take_appended(kaon_sbuf *b, char *text, size_t *len) {
    if (b->failed) {
        kaon_sbuf_free(b);
        return text;
    }
    free(text);
    return kaon_sbuf_take(b, len);
}

char *kaon_metrics_append_expert_load(char *text, size_t *len, kaon_engine *const *engines,
                                      int n_engines, const char *model) {
    int L = 0, E = 0;
    if (!text || n_engines < 1 || !engines[0] ||
        kaon_engine_expert_load(engines[0], NULL, 0, &L, &E) || L <= 0 || E <= 0)
        return text;
    const size_t n = (size_t)L * (size_t)E;
    // Summed over the replicas: the experts are the model's, whichever replica routed to them.
    uint64_t *c = calloc(n, sizeof *c), *one = n_engines > 1 ? malloc(sizeof *one * n) : NULL;
    if (!c || (n_engines > 1 && !one) || kaon_engine_expert_load(engines[0], c, n, NULL, NULL)) {
        free(c);
        free(one);
        return text;
    }
    for (int r = 1; r < n_engines; r++)
        if (!kaon_engine_expert_load(engines[r], one, n, NULL, NULL))
            for (size_t k = 0; k < n; k++) c[k] += one[k];
    free(one);
    kaon_sbuf b = {0};
    kaon_sbuf_append(&b, text, *len);
    if (!model) model = "";
    head(&b, "kaon:moe_expert_tokens_total", "counter",
         "Tokens routed to each expert of each mixture-of-experts layer.");
    for (int l = 0; l < L; l++) {
        bool any = false;  // dense layers of a MoE model route nothing: left out
        for (int x = 0; x < E && !any; x++) any = c[(size_t)l * E + x] != 0;
        for (int x = 0; any && x < E; x++) {
            char extra[64];
            snprintf(extra, sizeof extra, "layer=\"%d\",expert=\"%d\"", l, x);
            sample(&b, "kaon:moe_expert_tokens_total", model, extra, (double)c[(size_t)l * E + x]);
        }
    }
    free(c);
    return take_appended(&b, text, len);
}

char *kaon_metrics_append_step_times(char *text, size_t *len, kaon_engine *const *engines, int n_engines,
                                     const char *model) {
    if (!text || n_engines < 1) return text;
    enum { CAP = 64 };
    kaon_step_times per[CAP], sum = {0};
    if (n_engines > CAP) n_engines = CAP;
    for (int i = 0; i < n_engines; i++) {
        kaon_engine_step_times(engines[i], &per[i]);
        sum.prefill_steps += per[i].prefill_steps;
        sum.decode_steps += per[i].decode_steps;
        sum.prefill_seconds += per[i].prefill_seconds;
        sum.decode_seconds += per[i].decode_seconds;
    }
    kaon_sbuf b = {0};
    kaon_sbuf_append(&b, text, *len);
    if (!model) model = "";
    static const char *const names[2] = {"kaon:engine_steps_by_kind_total", "kaon:engine_step_seconds_total"};
    static const char *const helps[2] = {
        "Engine steps, by whether they computed prompt tokens (prefill, alone or mixed with decodes) or only decoded.",
        "Wall time of engine steps (plan, forward, sampling, outputs), by kind."};
    for (int k = 0; k < 2; k++) {
        head(&b, names[k], "counter", helps[k]);
        // The total first, then each data-parallel replica's under engine="i".
        for (int i = -1; i < (n_engines > 1 ? n_engines : 0); i++) {
            const kaon_step_times *t = i < 0 ? &sum : &per[i];
            for (int pre = 1; pre >= 0; pre--) {
                char lab[64];
                if (i < 0) snprintf(lab, sizeof lab, "kind=\"%s\"", pre ? "prefill" : "decode");
                else snprintf(lab, sizeof lab, "kind=\"%s\",engine=\"%d\"", pre ? "prefill" : "decode", i);
                const double v = k == 0 ? (double)(pre ? t->prefill_steps : t->decode_steps)
                                        : (pre ? t->prefill_seconds : t->decode_seconds);
                sample(&b, names[k], model, lab, v);
            }
        }
    }
    return take_appended(&b, text, len);
}

char *kaon_metrics_append_ranks(char *text, size_t *len, kaon_engine *const *engines, int n_engines,
                                const char *model) {
    enum { CAP = 64 };  // ranks of one process: GPUs of a machine, or CPU ranks
    static const struct {
        const char *name, *type, *help;
    } series[] = {
        {"kaon:rank_weight_bytes", "gauge", "Bytes of the weights each parallel rank holds (its shard, as stored)."},
        {"kaon:rank_kv_cache_bytes", "gauge", "Bytes of each parallel rank's KV cache."},
        {"kaon:rank_steps_total", "counter", "Forward steps each parallel rank ran."},
        {"kaon:rank_step_seconds_total", "counter", "Wall time of each parallel rank's steps, collectives included."},
        {"kaon:rank_collective_seconds_total", "counter",
         "Time each parallel rank spent in collectives (host time; on GPUs the time to enqueue them)."},
    };
    if (!text || n_engines < 1) return text;
    kaon_rank_stats *st = calloc((size_t)n_engines * CAP, sizeof *st);
    int *n = calloc((size_t)n_engines, sizeof *n), any = 0;
    for (int i = 0; st && n && i < n_engines; i++) {
        n[i] = kaon_engine_rank_stats(engines[i], st + (size_t)i * CAP, CAP);
        if (n[i] > CAP) n[i] = CAP;
        any |= n[i] > 0;
    }
    if (!any) {
        free(st);
        free(n);
        return text;
    }
    kaon_sbuf b = {0};
    kaon_sbuf_append(&b, text, *len);
    if (!model) model = "";
    for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
        head(&b, series[k].name, series[k].type, series[k].help);
        for (int i = 0; i < n_engines; i++)
            for (int r = 0; r < n[i]; r++) {
                const kaon_rank_stats *x = st + (size_t)i * CAP + r;
                const double v[] = {(double)x->weight_bytes, (double)x->kv_bytes, (double)x->steps, x->step_seconds,
                                    x->collective_seconds};
                char extra[64];
                if (n_engines > 1) snprintf(extra, sizeof extra, "engine=\"%d\",rank=\"%d\"", i, x->rank);
                else snprintf(extra, sizeof extra, "rank=\"%d\"", x->rank);
                sample(&b, series[k].name, model, extra, v[k]);
            }
    }
    free(st);
    free(n);
    return take_appended(&b, text, len);
}
