// The engine in a follower process of a multi-node job (dist/cluster.h). Not in the public API:
// multi-node jobs are the kaon binary's (mpirun / srun kaon serve ...).
#ifndef KAON_ENGINE_MULTINODE_H
#define KAON_ENGINE_MULTINODE_H

#include "kaon.h"

// Runs the steps process 0 sends on this process's ranks until process 0 ends the job (0);
// a failed step ends every process (kaon_cluster_abort).
int kaon_engine_follow(kaon_engine *e);

#endif
