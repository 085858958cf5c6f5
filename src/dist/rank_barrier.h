// A barrier for the rank threads of one process that can be called off (comm_cpu.c,
// comm_cuda_local.cu): when a rank fails before a collective it never arrives, so an abort
// wakes every waiter and fails every later wait until the group is reset (by the thread that
// drives the ranks, once none of them is inside a collective).
#ifndef KAON_DIST_RANK_BARRIER_H
#define KAON_DIST_RANK_BARRIER_H

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kaon_rank_barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, arrived;
    unsigned long gen;  // a waiter leaves when it changes
    int aborted;
    char why[256];
} kaon_rank_barrier;

int kaon_rank_barrier_init(kaon_rank_barrier *b, int size);
void kaon_rank_barrier_destroy(kaon_rank_barrier *b);
// 0 when every rank arrived; -1 + error ("comm: aborted: why") once the barrier is aborted.
int kaon_rank_barrier_wait(kaon_rank_barrier *b);
void kaon_rank_barrier_abort(kaon_rank_barrier *b, const char *why);
void kaon_rank_barrier_reset(kaon_rank_barrier *b);

#ifdef __cplusplus
}
#endif

#endif
