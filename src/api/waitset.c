// A waitset: many requests, one waiting thread. Each watched request's notify hook (it runs in
// the engine thread under the engine's lock) marks its entry ready and signals; the waiter takes
// the ready tags in arrival order. Lock order: engine lock, then the waitset's; nothing here
// calls into the engine while holding the waitset's lock.
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "kaon.h"
#include "util/err.h"

typedef struct entry {
    kaon_waitset *w;
    kaon_request *r;
    uint64_t tag;
    bool queued;           // in the ready list (each tag is handed out once per readiness)
    struct entry *next;    // all entries
    struct entry *rnext;   // ready list
} entry;

struct kaon_waitset {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    entry *all;
    entry *rhead, *rtail;
    bool woken;
};

kaon_waitset *kaon_waitset_create(void) {
    kaon_waitset *w = calloc(1, sizeof *w);
    if (!w) {
        kaon_set_error("out of memory");
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    // Timed waits on the monotonic clock: a wall-clock jump must not stretch a timeout.
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &a);
    pthread_condattr_destroy(&a);
    return w;
}

static void on_output(void *ctx) {
    entry *en = ctx;
    kaon_waitset *w = en->w;
    pthread_mutex_lock(&w->mu);
    if (!en->queued) {
        en->queued = true;
        en->rnext = NULL;
        if (w->rtail) w->rtail->rnext = en;
        else w->rhead = en;
        w->rtail = en;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

int kaon_waitset_add(kaon_waitset *w, kaon_request *r, uint64_t tag) {
    if (!w || !r) return kaon_set_error("kaon_waitset_add: NULL argument");
    entry *en = calloc(1, sizeof *en);
    if (!en) return kaon_set_error("out of memory");
    en->w = w;
    en->r = r;
    en->tag = tag;
    pthread_mutex_lock(&w->mu);
    en->next = w->all;
    w->all = en;
    pthread_mutex_unlock(&w->mu);
    kaon_request_set_notify(r, on_output, en);  // fires at once when outputs already wait
    return 0;
}

// Unlinks en from the ready list; w->mu held.
static void unready(kaon_waitset *w, entry *en) {
    if (!en->queued) return;
    entry **pp = &w->rhead, *prev = NULL;
    while (*pp && *pp != en) { prev = *pp; pp = &(*pp)->rnext; }
    if (*pp) {
        *pp = en->rnext;
        if (w->rtail == en) w->rtail = prev;
    }
    en->queued = false;
}

void kaon_waitset_remove(kaon_waitset *w, kaon_request *r) {
    if (!w || !r) return;
    // After this returns the engine calls no hook of r, so its entry may go.
    kaon_request_set_notify(r, NULL, NULL);
    pthread_mutex_lock(&w->mu);
    for (entry **pp = &w->all; *pp; pp = &(*pp)->next) {
        if ((*pp)->r != r) continue;
        entry *en = *pp;
        *pp = en->next;
        unready(w, en);
        free(en);
        break;
    }
    pthread_mutex_unlock(&w->mu);
}

int kaon_waitset_wait(kaon_waitset *w, uint64_t *tags, int cap, int timeout_ms) {
    if (!w || (cap > 0 && !tags)) return kaon_set_error("kaon_waitset_wait: NULL argument");
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    if (timeout_ms > 0) {
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
    }
    pthread_mutex_lock(&w->mu);
    while (!w->rhead && !w->woken && timeout_ms != 0) {
        int rc = timeout_ms < 0 ? pthread_cond_wait(&w->cv, &w->mu) : pthread_cond_timedwait(&w->cv, &w->mu, &until);
        if (rc == ETIMEDOUT) break;
    }
    w->woken = false;
    int n = 0;
    while (n < cap && w->rhead) {
        entry *en = w->rhead;
        w->rhead = en->rnext;
        if (!w->rhead) w->rtail = NULL;
        en->queued = false;
        tags[n++] = en->tag;
    }
    pthread_mutex_unlock(&w->mu);
    return n;
}

void kaon_waitset_wake(kaon_waitset *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->woken = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void kaon_waitset_destroy(kaon_waitset *w) {
    if (!w) return;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        kaon_request *r = w->all ? w->all->r : NULL;
        pthread_mutex_unlock(&w->mu);
        if (!r) break;
        kaon_waitset_remove(w, r);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
