// The job's processes and their control channel (cluster.h).
#include "dist/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/log.h"

#if defined(KAON_HAVE_MPI)
#include <mpi.h>
#endif

static kaon_cluster cl;
static bool active;

// mpirun (Open MPI), a PMI/PMIx launcher (MPICH's hydra, srun --mpi=pmix) set one of these.
static bool launched_by_mpi(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    return false;
}

int kaon_cluster_init(void) {
    if (!launched_by_mpi()) return 0;
#if defined(KAON_HAVE_MPI)
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return kaon_set_error("cluster: MPI_Init_thread failed");
    // The ranks' worker threads and the engine's thread call MPI at the same time.
    if (provided < MPI_THREAD_MULTIPLE) {
        MPI_Finalize();
        return kaon_set_error("cluster: this MPI library does not support MPI_THREAD_MULTIPLE");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &cl.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &cl.size);
    if (cl.size == 1) {  // mpirun -np 1: nothing to coordinate
        MPI_Finalize();
        return 0;
    }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, cl.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &cl.local_rank);
    MPI_Comm_free(&node);
    if (!(cl.ctl = kaon_comm_mpi_create())) return -1;
    active = true;
    if (cl.rank > 0) kaon_log_set_process(cl.rank);
    KAON_INFO("cluster: process %d of %d (%d on this machine)", cl.rank, cl.size, cl.local_rank);
    return 0;
#else
    return kaon_set_error("cluster: started by an MPI launcher, but this kaon was built without MPI (install "
                          "libopenmpi-dev and rebuild)");
#endif
}

const kaon_cluster *kaon_cluster_get(void) { return active ? &cl : NULL; }

bool kaon_cluster_follower(void) { return active && cl.rank > 0; }

int kaon_cluster_min(int *v) {
    if (!active) return 0;
    int32_t all[cl.size];
    const int32_t mine = *v;
    if (cl.ctl->ops->all_gather(cl.ctl, &mine, all, 1, KAON_COMM_I32)) return -1;
    for (int q = 0; q < cl.size; q++)
        if (all[q] < *v) *v = all[q];
    return 0;
}

int kaon_cluster_same(const int64_t *v, int n, const char *const *names) {
    if (!active) return 0;
    int64_t *root = malloc(sizeof *root * (size_t)n);
    if (!root) return kaon_set_error("cluster: out of memory");
    memcpy(root, v, sizeof *root * (size_t)n);
    // int64 values travel as pairs of i32 (the communicator's copy type).
    int rc = cl.ctl->ops->broadcast(cl.ctl, root, 2 * (size_t)n, KAON_COMM_I32, 0);
    int bad = -1;
    for (int i = 0; !rc && i < n && bad < 0; i++)
        if (root[i] != v[i]) bad = i;
    int32_t mine = bad, all[cl.size];
    if (!rc) rc = cl.ctl->ops->all_gather(cl.ctl, &mine, all, 1, KAON_COMM_I32);
    for (int q = 0; !rc && q < cl.size; q++) {
        if (all[q] < 0) continue;
        if (q == cl.rank)
            rc = kaon_set_error("cluster: process %d has %s %lld, process 0 %lld: run the same command line and "
                                "model on every process", q, names[all[q]], (long long)v[all[q]],
                                (long long)root[all[q]]);
        else
            rc = kaon_set_error("cluster: process %d's %s differs from process 0's: run the same command line and "
                                "model on every process", q, names[all[q]]);
    }
    free(root);
    return rc;
}

void kaon_cluster_abort(const char *why) {
    fprintf(stderr, "kaon: process %d of %d: %s; ending every process of the job\n", cl.rank, cl.size, why);
    fflush(stderr);
#if defined(KAON_HAVE_MPI)
    if (active) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    exit(1);
}

void kaon_cluster_finalize(int rc) {
    if (!active) return;
#if defined(KAON_HAVE_MPI)
    if (rc) {
        fprintf(stderr, "kaon: process %d of %d exits with status %d; ending every process of the job\n", cl.rank,
                cl.size, rc);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    cl.ctl->ops->destroy(cl.ctl);
    cl.ctl = NULL;
    active = false;
    MPI_Finalize();
#else
    (void)rc;
#endif
}
