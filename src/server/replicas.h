// The server's engines: one, or N data-parallel replicas (kaon serve --data-parallel-size N),
// each a whole kaon_engine (model, runner, KV cache, engine thread) in this one process. A
// request lives on the replica it was submitted to: its kaon_request handle carries its engine,
// so outputs, abort and free always reach the right one.
//
// Layout: on the CPU each replica gets n_threads / N threads (at least 1); on CUDA, replica i
// runs on cuda:(first + i * tp), where first is 0 for a plain "cuda" and K for "cuda:K", and tp
// the tensor-parallel size (a replica's ranks take the devices after its first). The KV cache
// size (--kv-cache-memory, --gpu-memory-utilization) is per replica.
#ifndef KAON_SERVER_REPLICAS_H
#define KAON_SERVER_REPLICAS_H

#include <stddef.h>
#include <stdint.h>

#include "kaon.h"

#define KAON_SERVE_MAX_REPLICAS 64

typedef struct kaon_replicas {
    int n;
    kaon_engine *e[KAON_SERVE_MAX_REPLICAS];
} kaon_replicas;

// Replica i's device among n: the device itself when n is 1 or it is not CUDA. -1 + error
// when it does not fit out.
int kaon_replica_device(const char *device, int tensor_parallel_size, int i, int n, char *out,
                        size_t cap);
// Each replica's CPU threads: n_threads (0: the default) split n ways, at least 1.
int kaon_replica_threads(int n_threads, int n);

// Creates n replicas from o (each on its device, with its threads) and logs the layout. An
// engine that fails destroys those made: -1 + error naming the replica.
int kaon_replicas_create(kaon_replicas *r, const kaon_engine_options *o, int n);
void kaon_replicas_destroy(kaon_replicas *r);

// The replica a prompt goes to (dp_route.h): by cached prefix, then load. Its stats are read
// at the call: callers serialize routing with their submits so the next choice sees this one.
int kaon_replicas_pick(kaon_replicas *r, const int32_t *ids, size_t n);

// Sums every replica's stats into *total (kv_usage and prefix_hit_rate recomputed from the
// sums); each replica's into per[i] when per is not NULL.
void kaon_replicas_stats(kaon_replicas *r, kaon_engine_stats *total, kaon_engine_stats *per);

#endif
