#include "server/replicas.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/dp_route.h"
#include "util/cpus.h"
#include "util/err.h"
#include "util/log.h"

int kaon_replica_device(const char *device, int tp, int i, int n, char *out, size_t cap) {
    if (!device) device = "cpu";
    int first = -1;
    if (n > 1 && !strcmp(device, "cuda")) first = 0;
    else if (n > 1 && !strncmp(device, "cuda:", 5)) first = atoi(device + 5);
    int len = first < 0 ? snprintf(out, cap, "%s", device)
                        : snprintf(out, cap, "cuda:%d", first + i * (tp > 1 ? tp : 1));
    if (len < 0 || (size_t)len >= cap) return kaon_set_error("serve: device name '%s' too long", device);
    return 0;
}

int kaon_replica_threads(int n_threads, int n) {
    if (n_threads <= 0) n_threads = kaon_default_threads();
    int t = n > 1 ? n_threads / n : n_threads;
    return t < 1 ? 1 : t;
}

void kaon_replicas_destroy(kaon_replicas *r) {
    // Each engine stops its own thread; the other replicas' requests are untouched meanwhile.
    for (int i = 0; i < r->n; i++) kaon_engine_destroy(r->e[i]);
    r->n = 0;
}

int kaon_replicas_create(kaon_replicas *r, const kaon_engine_options *o, int n) {
    memset(r, 0, sizeof *r);
    if (n < 1 || n > KAON_SERVE_MAX_REPLICAS)
        return kaon_set_error("serve: data-parallel size %d (1..%d)", n, KAON_SERVE_MAX_REPLICAS);
    const bool cpu = !o->device || !strcmp(o->device, "cpu");
    for (int i = 0; i < n; i++) {
        char dev[32];
        if (kaon_replica_device(o->device, o->tensor_parallel_size, i, n, dev, sizeof dev) < 0) {
            kaon_replicas_destroy(r);
            return -1;
        }
        kaon_engine_options eo = *o;
        eo.device = dev;  // the engine keeps its own copy of the name
        if (cpu && n > 1) eo.n_threads = kaon_replica_threads(o->n_threads, n);
        r->e[i] = kaon_engine_create(&eo);
        if (!r->e[i]) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", kaon_last_error());
            kaon_replicas_destroy(r);
            return n > 1 ? kaon_set_error("replica %d of %d (device %s): %s", i, n, dev, msg)
                         : kaon_set_error("%s", msg);
        }
        r->n = i + 1;
        if (n > 1) {
            kaon_engine_info in;
            kaon_engine_get_info(r->e[i], &in);
            const double kv_tokens = (double)in.kv_blocks * in.block_size;
            char threads[32] = "";
            if (cpu) snprintf(threads, sizeof threads, ", %d thread%s", eo.n_threads, eo.n_threads == 1 ? "" : "s");
            KAON_INFO("serve: replica %d of %d: device %s%s, KV cache %.1f MiB = %.0f tokens "
                      "(%d blocks of %d)", i, n, dev, threads,
                      kv_tokens * (double)in.kv_bytes_per_token / 1048576.0, kv_tokens,
                      in.kv_blocks, in.block_size);
        }
    }
    return 0;
}

int kaon_replicas_pick(kaon_replicas *r, const int32_t *ids, size_t n) {
    if (r->n <= 1) return 0;
    kaon_dp_replica_state st[KAON_SERVE_MAX_REPLICAS];
    for (int i = 0; i < r->n; i++) {
        kaon_engine_stats s;
        kaon_engine_get_stats(r->e[i], &s);
        st[i].seqs = s.running + s.waiting;
        st[i].kv_usage = s.kv_usage;
        st[i].cached_tokens = kaon_engine_cached_prefix(r->e[i], ids, n);
    }
    return kaon_dp_route(st, r->n);
}

void kaon_replicas_stats(kaon_replicas *r, kaon_engine_stats *t, kaon_engine_stats *per) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < r->n; i++) {
        kaon_engine_stats s;
        kaon_engine_get_stats(r->e[i], &s);
        if (per) per[i] = s;
        t->running += s.running;
        t->waiting += s.waiting;
        t->kv_blocks_total += s.kv_blocks_total;
        t->kv_blocks_used += s.kv_blocks_used;
        t->prefix_queries_tokens += s.prefix_queries_tokens;
        t->prefix_hit_tokens += s.prefix_hit_tokens;
        t->preemptions += s.preemptions;
        t->prompt_tokens += s.prompt_tokens;
        t->generation_tokens += s.generation_tokens;
        t->finished_stop += s.finished_stop;
        t->finished_length += s.finished_length;
        t->finished_abort += s.finished_abort;
        t->finished_error += s.finished_error;
        t->steps += s.steps;
        t->constraint_masks += s.constraint_masks;
        t->constraint_mask_seconds += s.constraint_mask_seconds;
        t->spec_drafts += s.spec_drafts;
        t->spec_draft_tokens += s.spec_draft_tokens;
        t->spec_accepted_tokens += s.spec_accepted_tokens;
        for (int p = 0; p < KAON_SPEC_MAX_TOKENS; p++) t->spec_accepted_per_pos[p] += s.spec_accepted_per_pos[p];
    }
    t->kv_usage = t->kv_blocks_total ? (double)t->kv_blocks_used / t->kv_blocks_total : 0;
    t->prefix_hit_rate = t->prefix_queries_tokens ? (double)t->prefix_hit_tokens / t->prefix_queries_tokens : 0;
}
