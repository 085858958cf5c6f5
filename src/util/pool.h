// A persistent thread pool for the CPU kernels: n - 1 worker threads plus the calling thread.
// kaon_pool_run splits one parallel step into tasks that the threads claim one at a time from
// a shared counter, so a worker that loses its core (a busy machine) delays only the task it
// holds: the others take the rest. Idle workers spin briefly, then sleep in the kernel.
#ifndef KAON_UTIL_POOL_H
#define KAON_UTIL_POOL_H

// Most threads one pool has (callers clamp their thread counts to this).
#define KAON_POOL_MAX_THREADS 256

typedef struct kaon_pool kaon_pool;

// fn(ctx, task, thread): task in [0, n_tasks); thread in [0, threads of the run) names the
// executing thread (0: the caller), for per-thread scratch. One thread runs a task at a time.
typedef void (*kaon_pool_fn)(void *ctx, int task, int thread);

// A pool of n_threads (clamped to [1, KAON_POOL_MAX_THREADS]) counting the caller.
// NULL + kaon_last_error() when a thread cannot be started.
kaon_pool *kaon_pool_create(int n_threads);
void kaon_pool_destroy(kaon_pool *p);
int kaon_pool_size(const kaon_pool *p);

// Runs every task once on at most n_threads threads (<= 1 or p NULL: all on the caller, in
// order) and returns when all are done. Called from one thread at a time per pool.
void kaon_pool_run(kaon_pool *p, int n_tasks, int n_threads, kaon_pool_fn fn, void *ctx);

#endif
