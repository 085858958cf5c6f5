// The thread pool: every task runs exactly once, per-thread indices stay in range and are
// never shared by two threads at once, many tiny runs in a row (lost wake-ups would hang),
// a worker that stalls mid-run (the others must finish its share), and the one-thread pool.
// Sized to finish in well under 5 s under ThreadSanitizer on two cores.
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "util/cpus.h"
#include "util/pool.h"

typedef struct {
    _Atomic int *hits;            // per task
    _Atomic int busy[KAON_POOL_MAX_THREADS];  // a thread index in use (must never be 2)
    long long sum[KAON_POOL_MAX_THREADS];     // per-thread partial sums (plain: owner only)
    int n_threads;
    _Atomic int bad;
    int stall;                    // the first task a worker (not the caller) gets sleeps 200 ms
    _Atomic int stalled;          // the worker that stalled, + 1
    _Atomic int ran_by_staller;
    _Atomic int finished;
} job;

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void task(void *ctx, int t, int thread) {
    job *j = ctx;
    if (thread < 0 || thread >= j->n_threads) {
        atomic_store(&j->bad, 1);
        return;
    }
    if (atomic_fetch_add(&j->busy[thread], 1) != 0) atomic_store(&j->bad, 1);
    atomic_fetch_add(&j->hits[t], 1);
    j->sum[thread] += t;
    if (j->stall) sleep_ms(1);
    if (j->stall && thread != 0) {
        int none = 0;
        if (atomic_compare_exchange_strong(&j->stalled, &none, thread + 1)) sleep_ms(200);
        if (atomic_load(&j->stalled) == thread + 1) atomic_fetch_add(&j->ran_by_staller, 1);
    }
    atomic_fetch_sub(&j->busy[thread], 1);
    atomic_fetch_add(&j->finished, 1);
}

// One run of n tasks on `threads` threads of p; checks each ran once and the sums.
static void run_once(kaon_pool *p, int n, int threads, int stall) {
    job *j = calloc(1, sizeof *j);
    j->hits = calloc((size_t)n, sizeof *j->hits);
    j->n_threads = threads < 1 ? 1 : threads;
    if (j->n_threads > kaon_pool_size(p)) j->n_threads = kaon_pool_size(p);
    j->stall = stall;
    kaon_pool_run(p, n, threads, task, j);
    int once = 1;
    for (int i = 0; i < n; i++) once &= atomic_load(&j->hits[i]) == 1;
    CHECK(once);
    long long s = 0;
    for (int i = 0; i < j->n_threads; i++) s += j->sum[i];
    CHECK(s == (long long)n * (n - 1) / 2);
    CHECK(!atomic_load(&j->bad));
    CHECK(atomic_load(&j->finished) == n);  // the run waited for the stalled task too
    if (stall) CHECK(atomic_load(&j->stalled) > 0 && atomic_load(&j->ran_by_staller) < n / 2);
    free(j->hits);
    free(j);
}

static void add_one(void *ctx, int t, int thread) {
    (void)thread;
    atomic_fetch_add((_Atomic int *)ctx, t + 1);
}

int main(void) {
    const clock_t t0 = clock();
    CHECK(kaon_usable_cpus() >= 1);
    CHECK(kaon_default_threads() >= 1 && kaon_default_threads() <= kaon_usable_cpus());

    // No pool and a pool of one: everything on the caller, in order.
    run_once(NULL, 100, 4, 0);
    kaon_pool *one = kaon_pool_create(1);
    CHECK(one && kaon_pool_size(one) == 1);
    run_once(one, 100, 4, 0);
    kaon_pool_destroy(one);

    kaon_pool *p = kaon_pool_create(4);
    CHECK(p && kaon_pool_size(p) == 4);
    if (!p) TEST_MAIN_END();
    // Tasks much more numerous than threads; fewer tasks than threads; a run on fewer threads.
    run_once(p, 10000, 4, 0);
    run_once(p, 3, 4, 0);
    run_once(p, 1000, 2, 0);
    run_once(p, 1000, 99, 0);

    // Many tiny runs back to back, and some after the workers have gone to sleep.
    _Atomic int total = 0;
    for (int r = 0; r < 10000; r++) kaon_pool_run(p, 3, 4, add_one, &total);
    CHECK(atomic_load(&total) == 10000 * 6);
    // Runs whose task count grows from one to the next: a worker still looking at the short run
    // must not claim past its end once the long run's count is in (it did: a task ran twice and
    // the caller waited forever for a count it had passed).
    atomic_store(&total, 0);
    long want = 0;
    for (int r = 0; r < 20000; r++) {
        const int n = r % 2 ? 64 : 2;
        kaon_pool_run(p, n, 4, add_one, &total);
        want += (long)n * (n + 1) / 2;
        if (atomic_load(&total) != want) {
            CHECK(atomic_load(&total) == want);
            break;
        }
    }
    for (int r = 0; r < 5; r++) {
        sleep_ms(2);
        run_once(p, 64, 4, 0);
    }

    // A worker stalls inside a task: the caller and the other workers do the rest, and the
    // run still returns only after the stalled task has finished. Slow tasks, so that a
    // worker surely gets one before the caller has run them all.
    run_once(p, 400, 4, 1);
    kaon_pool_destroy(p);

    // Create and destroy with no run (workers asleep or spinning at exit).
    kaon_pool_destroy(kaon_pool_create(3));
    CHECK((double)(clock() - t0) / CLOCKS_PER_SEC < 30.0);
    TEST_MAIN_END();
}
