// The CPU communicator (dist/comm.h): every collective at 1..5 and 7 ranks (threads), the
// checks of comm_checks.h many rounds in a row (a lost wake-up hangs, a missing barrier races:
// run it under ThreadSanitizer too).
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "comm_checks.h"
#include "dist/comm.h"
#include "util/err.h"

static void run(int n) {
    kaon_comm_cpu_group *g = kaon_comm_cpu_group_create(n);
    CHECK(g != NULL);
    pthread_t th[MAXN];
    rank_arg args[MAXN];
    for (int r = 0; r < n; r++) {
        args[r].c = kaon_comm_cpu_create(g, r);
        args[r].failures = 0;
        args[r].mismatch_fails_everywhere = 0;
        CHECK(args[r].c && args[r].c->rank == r && args[r].c->size == n);
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (args[r].failures) fprintf(stderr, "size %d rank %d: %d failures\n", n, r, args[r].failures);
        kaon_test_failures += args[r].failures;
        args[r].c->ops->destroy(args[r].c);
    }
    kaon_comm_cpu_group_free(g);
}

// The abort path: rank 0 never comes to the all-reduce (it failed); the driving thread aborts,
// so ranks 1.. leave with -1 instead of waiting; after recover the whole group sums again.
typedef struct abort_arg {
    kaon_comm *c;
    int rc;
    int said_aborted;  // the error (per thread) names the abort and its reason
} abort_arg;

static void *abort_rank(void *p) {
    abort_arg *a = p;
    float x[4] = {1, 2, 3, 4};
    a->rc = a->c->ops->all_reduce(a->c, x, x, 4, KAON_COMM_F32);
    a->said_aborted = strstr(kaon_last_error(), "comm: aborted: rank 0 failed") != NULL;
    return NULL;
}

static void *sum_rank(void *p) {
    abort_arg *a = p;
    float x[3] = {1, 1, (float)a->c->rank};
    a->rc = a->c->ops->all_reduce(a->c, x, x, 3, KAON_COMM_F32);
    if (!a->rc && (x[0] != (float)a->c->size || x[2] != (float)(a->c->size * (a->c->size - 1) / 2))) a->rc = 99;
    return NULL;
}

static void test_abort(int n) {
    kaon_comm_cpu_group *g = kaon_comm_cpu_group_create(n);
    kaon_comm *c[8];
    abort_arg a[8];
    pthread_t th[8];
    for (int r = 0; r < n; r++) c[r] = kaon_comm_cpu_create(g, r), a[r].c = c[r], a[r].rc = 0;
    for (int r = 1; r < n; r++) pthread_create(&th[r], NULL, abort_rank, &a[r]);
    c[0]->ops->abort(c[0], "rank 0 failed");
    for (int r = 1; r < n; r++) {
        pthread_join(th[r], NULL);
        CHECK(a[r].rc == -1);
        CHECK(a[r].said_aborted);
    }
    // Later collectives fail at once until the group is recovered.
    float y = 1;
    CHECK(c[0]->ops->all_reduce(c[0], &y, &y, 1, KAON_COMM_F32) == -1);
    CHECK(c[0]->ops->recover(c[0]) == 0);
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, sum_rank, &a[r]);
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        CHECK(a[r].rc == 0);
    }
    for (int r = 0; r < n; r++) c[r]->ops->destroy(c[r]);
    kaon_comm_cpu_group_free(g);
}

int main(void) {
    static const int sizes[] = {1, 2, 3, 4, 5, 7};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) run(sizes[i]);
    test_abort(2);
    test_abort(5);
    CHECK(kaon_comm_cpu_group_create(0) == NULL);
    kaon_comm_cpu_group *g = kaon_comm_cpu_group_create(2);
    CHECK(kaon_comm_cpu_create(g, 2) == NULL);
    kaon_comm_cpu_group_free(g);
    TEST_MAIN_END();
}
