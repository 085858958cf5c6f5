// Prometheus metrics, named like vLLM's (prefix kaon: instead of vllm:) so existing dashboards
// work: engine gauges and counters come from kaon_engine_stats at scrape time; the latency
// histograms are observed by the HTTP threads as outputs arrive.
#ifndef KAON_SERVER_METRICS_H
#define KAON_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kaon.h"

#define KAON_HIST_MAX_BUCKETS 32

typedef struct kaon_histogram {
    const double *bounds;  // upper bounds, ascending; +Inf is implicit
    int n_bounds;
    uint64_t counts[KAON_HIST_MAX_BUCKETS + 1];  // per bucket (not cumulative); last: +Inf
    double sum;
    uint64_t count;
} kaon_histogram;

// vLLM's bucket ladders.
extern const double kaon_ttft_buckets[];
extern const int kaon_n_ttft_buckets;
extern const double kaon_itl_buckets[];
extern const int kaon_n_itl_buckets;
extern const double kaon_latency_buckets[];  // e2e latency and queue time
extern const int kaon_n_latency_buckets;

void kaon_histogram_init(kaon_histogram *h, const double *bounds, int n_bounds);
// Counts v in the first bucket whose bound is >= v (Prometheus `le`); NaN is ignored.
void kaon_histogram_observe(kaon_histogram *h, double v);

// HTTP statuses counted in kaon:http_requests_total.
#define KAON_METRICS_N_STATUS 13

typedef struct kaon_metrics {
    pthread_mutex_t mu;
    kaon_histogram ttft, itl, e2e, queue;
    uint64_t http_status[KAON_METRICS_N_STATUS];
    uint64_t http_other;
} kaon_metrics;

void kaon_metrics_init(kaon_metrics *m);
void kaon_metrics_destroy(kaon_metrics *m);
// Thread-safe observations (seconds). itl observes v `count` times.
void kaon_metrics_observe_ttft(kaon_metrics *m, double v);
void kaon_metrics_observe_itl(kaon_metrics *m, double v, int count);
void kaon_metrics_observe_e2e(kaon_metrics *m, double v);
void kaon_metrics_observe_queue(kaon_metrics *m, double v);
void kaon_metrics_count_status(kaon_metrics *m, int status);

// Prometheus text exposition (format 0.0.4). stats NULL: engine still loading (its series are
// left out). stats are the engines' totals; with n_engines > 1 data-parallel replicas, every
// engine series also has each replica's sample (per[i]) under the label engine="i". model_name
// is escaped as a label value. Returns malloc'd text or NULL.
char *kaon_metrics_render(kaon_metrics *m, const kaon_engine_stats *stats,
                          const kaon_engine_stats *per, int n_engines, const char *model_name,
                          size_t *len);
// Appends kaon:engine_steps_by_kind_total and kaon:engine_step_seconds_total{kind="prefill|decode"}
// (engine/step_times.h), summed over the n_engines replicas and then each one's (engine="i" when
// there are several), to text (malloc'd); returns the new text (text itself when out of memory).
char *kaon_metrics_append_step_times(char *text, size_t *len, kaon_engine *const *engines, int n_engines,
                                     const char *model_name);
// Appends kaon:moe_expert_tokens_total{layer, expert} (engines created with expert_stats),
// summed over the n_engines replicas, to text (malloc'd, from kaon_metrics_render); returns the
// new text (text itself when there is nothing to add or memory runs out).
char *kaon_metrics_append_expert_load(char *text, size_t *len, kaon_engine *const *engines,
                                      int n_engines, const char *model_name);
// Appends each parallel rank's share and time (engines with -tp or DP attention; engine="i"
// too with several replicas): kaon:rank_weight_bytes, kaon:rank_kv_cache_bytes,
// kaon:rank_steps_total, kaon:rank_step_seconds_total, kaon:rank_collective_seconds_total, each
// {rank="r"}. In a multi-node job only process 0's ranks (its followers' are in their logs).
char *kaon_metrics_append_ranks(char *text, size_t *len, kaon_engine *const *engines, int n_engines,
                                const char *model_name);

#endif
