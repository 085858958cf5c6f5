// Expert load of MoE models for the engine's users (server metrics, kaon generate): the
// runner's counters are read after each step on the engine thread (one small copy; on a GPU
// after the step's own synchronisation) and published under the engine's mutex.
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "util/err.h"

int kaon_engine_expert_stats_init(kaon_engine *e) {
    if (!e->opts.expert_stats || e->model->cfg.n_experts <= 0) return 0;
    if (kaon_runner_enable_expert_stats(e->runner)) return -1;
    e->expert_layers = e->model->cfg.n_layers;
    e->expert_n = e->model->cfg.n_experts;
    const size_t n = (size_t)e->expert_layers * (size_t)e->expert_n;
    e->expert_load = calloc(n, sizeof *e->expert_load);
    e->expert_tmp = calloc(n, sizeof *e->expert_tmp);
    if (!e->expert_load || !e->expert_tmp) return kaon_set_error("engine: out of memory");
    return 0;
}

void kaon_engine_expert_stats_step(kaon_engine *e) {
    if (!e->expert_load) return;
    if (kaon_runner_expert_load(e->runner, e->expert_tmp) <= 0) return;
    pthread_mutex_lock(&e->mu);
    memcpy(e->expert_load, e->expert_tmp,
           sizeof *e->expert_load * (size_t)e->expert_layers * (size_t)e->expert_n);
    pthread_mutex_unlock(&e->mu);
}

void kaon_engine_expert_stats_free(kaon_engine *e) {
    free(e->expert_load);
    free(e->expert_tmp);
    e->expert_load = e->expert_tmp = NULL;
}

int kaon_engine_expert_load(kaon_engine *e, uint64_t *counts, size_t cap, int *n_layers,
                            int *n_experts) {
    if (!e->expert_load)
        return kaon_set_error("engine: expert load is not counted (a dense model, or expert_stats off)");
    const size_t n = (size_t)e->expert_layers * (size_t)e->expert_n;
    if (n_layers) *n_layers = e->expert_layers;
    if (n_experts) *n_experts = e->expert_n;
    if (!counts) return 0;
    if (cap < n) return kaon_set_error("engine: expert load needs %zu counters, got %zu", n, cap);
    pthread_mutex_lock(&e->mu);
    memcpy(counts, e->expert_load, sizeof *counts * n);
    pthread_mutex_unlock(&e->mu);
    return 0;
}
