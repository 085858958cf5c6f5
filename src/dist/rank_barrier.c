// The abortable barrier of the rank threads (rank_barrier.h).
#include "dist/rank_barrier.h"

#include <stdio.h>

#include "util/err.h"

int kaon_rank_barrier_init(kaon_rank_barrier *b, int size) {
    b->size = size;
    b->arrived = 0;
    b->gen = 0;
    b->aborted = 0;
    b->why[0] = 0;
    if (pthread_mutex_init(&b->mu, NULL)) return kaon_set_error("comm: cannot make a barrier");
    if (pthread_cond_init(&b->cv, NULL)) {
        pthread_mutex_destroy(&b->mu);
        return kaon_set_error("comm: cannot make a barrier");
    }
    return 0;
}

void kaon_rank_barrier_destroy(kaon_rank_barrier *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

int kaon_rank_barrier_wait(kaon_rank_barrier *b) {
    pthread_mutex_lock(&b->mu);
    const unsigned long gen = b->gen;
    if (!b->aborted && ++b->arrived == b->size) {
        b->arrived = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
    } else {
        while (!b->aborted && gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
    }
    // A rank released by the last arrival leaves with 0 even if an abort came after.
    const int rc = gen == b->gen ? -1 : 0;
    char why[sizeof b->why];
    snprintf(why, sizeof why, "%s", b->why);
    pthread_mutex_unlock(&b->mu);
    return rc ? kaon_set_error("comm: aborted: %s", why) : 0;
}

void kaon_rank_barrier_abort(kaon_rank_barrier *b, const char *why) {
    pthread_mutex_lock(&b->mu);
    if (!b->aborted) snprintf(b->why, sizeof b->why, "%s", why ? why : "a rank failed");
    b->aborted = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void kaon_rank_barrier_reset(kaon_rank_barrier *b) {
    pthread_mutex_lock(&b->mu);
    b->aborted = 0;
    b->arrived = 0;
    b->gen++;
    b->why[0] = 0;
    pthread_mutex_unlock(&b->mu);
}
