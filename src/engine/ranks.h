// The engine's parallel ranks, outside the public API: a follower process's loop (multi-node
// jobs are the kaon binary's: mpirun / srun kaon serve ...) and each rank's share and time
// (the server's /metrics).
#ifndef KAON_ENGINE_RANKS_H
#define KAON_ENGINE_RANKS_H

#include "kaon.h"
#include "model/tp.h"

// Runs the steps process 0 sends on this process's ranks until process 0 ends the job (0);
// a failed step ends every process (kaon_cluster_abort).
int kaon_engine_follow(kaon_engine *e);
// This process's ranks (tensor parallel, DP attention): fills out[0 .. min(cap, n)) and returns
// n; 0 for an engine of one rank.
int kaon_engine_rank_stats(kaon_engine *e, kaon_rank_stats *out, int cap);

#endif
