// The processes of one kaon job across machines (multi-node): started by mpirun, or by srun
// with PMIx, one process per machine (or per group of GPUs), the same command line in each.
// Process 0 is the engine (scheduler, server, sampling); every other one is a follower that
// holds its ranks' shards and runs each step that process 0 sends it (model/tp.c). Collectives
// between ranks go over the ranks' communicator (NCCL on GPUs, MPI on the CPU); this file's
// control channel carries only process 0's steps and the start-up agreements, one thread per
// process at a time.
#ifndef KAON_DIST_CLUSTER_H
#define KAON_DIST_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "dist/comm.h"

typedef struct kaon_cluster {
    int rank, size;     // this process among the job's
    int local_rank;     // among the job's processes on this machine (its GPUs follow theirs)
    kaon_comm *ctl;     // the control channel (an MPI communicator)
} kaon_cluster;

// From main(): starts MPI when this process is one of an MPI job (mpirun's or srun's
// variables are set). 0: fine (a lone process has no cluster); -1 + error.
int kaon_cluster_init(void);
// NULL for a lone process.
const kaon_cluster *kaon_cluster_get(void);
bool kaon_cluster_follower(void);
// Every process gets the smallest of their *v (e.g. the KV blocks that fit everywhere).
int kaon_cluster_min(int *v);
// Refuses (-1 + error naming the first difference) unless every process has the same v[n]:
// the start-up values the ranks must share (sizes, the model's shape).
int kaon_cluster_same(const int64_t *v, int n, const char *const *names);
// A failure the job cannot recover from (a step failed on some rank: its peers in other
// processes wait in a collective that never completes): logs why and ends every process.
_Noreturn void kaon_cluster_abort(const char *why);
// At exit: rc 0 ends MPI in order; any other rc aborts the job (the other processes may wait
// for this one in a collective).
void kaon_cluster_finalize(int rc);

#endif
