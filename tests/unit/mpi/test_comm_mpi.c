// The MPI communicator (dist/comm.h, comm_mpi.c), run as an MPI job (ctest starts it with
// mpirun -np 3): the collectives' checks of comm_checks.h on every process, the same bits as
// the threads' communicator; a mismatched all_to_allv fails every rank at once (none hangs in
// the exchange); abort ends a rank's wait for a peer that never comes.
#include <mpi.h>
#include <pthread.h>
#include <time.h>

#include "../comm_checks.h"

typedef struct {
    kaon_comm *c;
    int rc;
    int said_aborted;
} waiter;

static void *wait_for_rank0(void *p) {
    waiter *w = p;
    w->rc = w->c->ops->barrier(w->c);
    w->said_aborted = strstr(kaon_last_error(), "comm: aborted: rank 0 failed") != NULL;
    return NULL;
}

// Rank 0 stays away from a barrier until the others have aborted their waits (their threads
// return -1 instead of hanging), then joins it so that MPI's pending request completes.
static void test_abort(void) {
    kaon_comm *c = kaon_comm_mpi_create();
    CHECK(c != NULL);
    if (!c) return;
    kaon_comm *side = kaon_comm_mpi_create();  // carries "the others are done" to rank 0
    if (c->rank == 0) {
        CHECK(side->ops->barrier(side) == 0);
        CHECK(c->ops->barrier(c) == 0);
    } else {
        waiter w = {.c = c};
        pthread_t th;
        pthread_create(&th, NULL, wait_for_rank0, &w);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        c->ops->abort(c, "rank 0 failed");
        pthread_join(th, NULL);
        CHECK(w.rc == -1);
        CHECK(w.said_aborted);
        float y = 1;
        CHECK(c->ops->all_reduce(c, &y, &y, 1, KAON_COMM_F32) == -1);  // at once, no wait
        CHECK(c->ops->recover(c) == -1);  // MPI cannot call the pending collective off
        CHECK(side->ops->barrier(side) == 0);
    }
    side->ops->destroy(side);
    c->ops->destroy(c);
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided >= MPI_THREAD_MULTIPLE);
    kaon_comm *c = kaon_comm_mpi_create();
    CHECK(c != NULL);
    if (c) {
        int size = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        CHECK(c->size == size && size <= MAXN);
        rank_arg a = {.c = c, .mismatch_fails_everywhere = 1};
        rank_main(&a);
        if (a.failures) fprintf(stderr, "rank %d: %d failures\n", c->rank, a.failures);
        kaon_test_failures += a.failures;
        c->ops->destroy(c);
    }
    test_abort();
    int mine = kaon_test_failures, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    kaon_test_failures = all;
    TEST_MAIN_END();
}
