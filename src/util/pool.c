// The pool's protocol: one 64-bit word holds the run's generation (high half) and its next
// unclaimed task (low half). A thread claims task i of generation g with a compare-and-swap
// of (g, i) -> (g, i + 1), so a claim can never land in a later run, and a thread that has
// claimed a task may read the run's fn and ctx: the caller does not start another run before
// every task's completion has been counted in `done`. Workers wait for a new generation on the
// futex word `wake`, the caller for the last task on `done`; both spin a little first.
#include "util/pool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util/err.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ volatile("yield")
#else
#define cpu_relax() ((void)0)
#endif

// How long an idle thread spins before it sleeps. Long enough to bridge the gap between two
// kernels of one forward pass (the caller's bookkeeping between ops), short enough that a
// machine busy with other processes loses little to it. KAON_POOL_SPIN_US overrides it.
#define KAON_POOL_SPIN_NS 50000

typedef struct worker {
    struct kaon_pool *p;
    int index;
} worker;

struct kaon_pool {
    int n;                    // threads, counting the caller
    int n_started;            // workers started (n - 1 unless creation failed)
    uint32_t gen;             // the caller's last generation
    long spin_ns;
    pthread_t *tid;
    worker *w;
    kaon_pool_fn fn;          // the current run's, read only by a thread holding one of its tasks
    void *ctx;
    _Atomic uint64_t state;   // generation << 32 | next unclaimed task
    _Atomic uint32_t wake;    // the latest generation (futex word the workers sleep on)
    _Atomic uint32_t done;    // tasks of the current run finished (futex word of the caller)
    _Atomic int n_tasks, use; // the current run's tasks and threads
    _Atomic int sleepers;     // workers inside (or about to enter) futex_wait on `wake`
    _Atomic int caller_sleeps;
    _Atomic int quit;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

// Spins until (*word == val) == equal or spin_ns pass; returns whether that came.
static int spin_for(_Atomic uint32_t *word, uint32_t val, int equal, long spin_ns) {
    const long end = now_ns() + spin_ns;
    for (unsigned k = 1;; k++) {
        if ((atomic_load_explicit(word, memory_order_acquire) == val) == equal) return 1;
        cpu_relax();
        if ((k & 63) == 0 && now_ns() >= end) return 0;
    }
}

// Claims and runs tasks of generation g until none is left.
static void work(kaon_pool *p, uint32_t g, int me) {
    for (;;) {
        uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        if ((uint32_t)(s >> 32) != g) return;
        const uint32_t i = (uint32_t)s;
        const int n = atomic_load_explicit(&p->n_tasks, memory_order_acquire);
        if (i >= (uint32_t)n) return;
        if (!atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        p->fn(p->ctx, (int)i, me);
        // Sequentially consistent, as the caller's store to caller_sleeps before its last look.
        const uint32_t d = atomic_fetch_add(&p->done, 1) + 1;
        if (d == (uint32_t)n && me != 0 && atomic_load(&p->caller_sleeps)) futex_wake(&p->done, 1);
    }
}

// Waits (spin, then sleep) for a generation other than seen; returns it.
static uint32_t wait_new_run(kaon_pool *p, uint32_t seen) {
    if (spin_for(&p->wake, seen, 0, p->spin_ns))
        return atomic_load_explicit(&p->wake, memory_order_acquire);
    for (;;) {
        // Announce the sleep before the last look: the caller stores `wake` and then reads
        // `sleepers` (both sequentially consistent), so one of the two sees the other.
        atomic_fetch_add(&p->sleepers, 1);
        if (atomic_load(&p->wake) == seen) futex_wait(&p->wake, seen);
        atomic_fetch_sub(&p->sleepers, 1);
        const uint32_t g = atomic_load_explicit(&p->wake, memory_order_acquire);
        if (g != seen) return g;
    }
}

static void *worker_main(void *arg) {
    const worker *w = arg;
    kaon_pool *p = w->p;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_new_run(p, seen);
        if (atomic_load(&p->quit)) return NULL;
        if (w->index < atomic_load_explicit(&p->use, memory_order_relaxed)) work(p, seen, w->index);
    }
}

kaon_pool *kaon_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > KAON_POOL_MAX_THREADS) n_threads = KAON_POOL_MAX_THREADS;
    kaon_pool *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    p->n = n_threads;
    p->spin_ns = KAON_POOL_SPIN_NS;
    const char *env = getenv("KAON_POOL_SPIN_US");
    if (env && *env) p->spin_ns = atol(env) * 1000L;
    if (p->spin_ns < 0) p->spin_ns = 0;
    if (n_threads == 1) return p;
    p->tid = calloc((size_t)n_threads, sizeof *p->tid);
    p->w = calloc((size_t)n_threads, sizeof *p->w);
    if (!p->tid || !p->w) goto oom;
    // Workers take no signals: those belong to the threads that handle them (the server's).
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 1; i < n_threads; i++) {
        p->w[i] = (worker){.p = p, .index = i};
        if (pthread_create(&p->tid[i], NULL, worker_main, &p->w[i]) != 0) break;
        p->n_started = i;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (p->n_started != n_threads - 1) {
        kaon_pool_destroy(p);
        kaon_set_error("thread pool: cannot start %d threads", n_threads - 1);
        return NULL;
    }
    return p;
oom:
    if (p) {
        free(p->tid);
        free(p->w);
        free(p);
    }
    kaon_set_error("thread pool: out of memory");
    return NULL;
}

void kaon_pool_destroy(kaon_pool *p) {
    if (!p) return;
    if (p->n_started > 0) {
        atomic_store(&p->quit, 1);
        atomic_store(&p->wake, ++p->gen);
        futex_wake(&p->wake, INT_MAX);
        for (int i = 1; i <= p->n_started; i++) pthread_join(p->tid[i], NULL);
    }
    free(p->tid);
    free(p->w);
    free(p);
}

int kaon_pool_size(const kaon_pool *p) { return p ? p->n : 1; }

void kaon_pool_run(kaon_pool *p, int n_tasks, int n_threads, kaon_pool_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!p || p->n <= 1 || n_threads <= 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    if (n_threads > p->n) n_threads = p->n;
    const uint32_t g = ++p->gen;
    // Close the previous run before n_tasks changes: a worker that read its state (g - 1, n_old)
    // and then this run's larger n_tasks would otherwise claim task n_old of g - 1 by CAS, run
    // it with this run's fn and count it in this run's `done` (one task twice, and a `done` past
    // n_tasks that the caller waits for forever). The worker reads n_tasks with acquire: seeing
    // the new count, its CAS must see this store and fail.
    atomic_store(&p->state, (uint64_t)g << 32 | UINT32_MAX);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&p->use, n_threads, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->state, (uint64_t)g << 32, memory_order_release);
    atomic_store(&p->wake, g);
    if (atomic_load(&p->sleepers) > 0) futex_wake(&p->wake, INT_MAX);
    work(p, g, 0);
    // The caller has run out of tasks to claim; wait for the ones still running elsewhere.
    const uint32_t n = (uint32_t)n_tasks;
    uint32_t d = atomic_load_explicit(&p->done, memory_order_acquire);
    if (d == n) return;
    if (spin_for(&p->done, n, 1, p->spin_ns)) return;
    atomic_store(&p->caller_sleeps, 1);
    while ((d = atomic_load(&p->done)) != n) futex_wait(&p->done, d);
    atomic_store(&p->caller_sleeps, 0);
}
