// Parking generation requests while they wait for the engine, so libmicrohttpd's few event-loop
// threads never block: a request with nothing to send suspends its connection and is parked
// here; the engine's per-request notification (kaon_request_set_notify) or a periodic check
// (client gone, shutdown, --request-timeout) resumes it. One thread does the resuming.
#ifdef KAON_HAVE_MHD

#include "server/park.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "util/err.h"
#include "util/timer.h"

// How often parked requests are checked for a vanished client, shutdown or timeout.
#define CHECK_MS 200

static void list_remove(kaon_parker *p, kaon_parked *k) {
    if (k->prev) k->prev->next = k->next;
    else p->parked = k->next;
    if (k->next) k->next->prev = k->prev;
    k->prev = k->next = NULL;
    p->n_parked--;
}

static void list_push(kaon_parker *p, kaon_parked *k) {
    k->prev = NULL;
    k->next = p->parked;
    if (p->parked) p->parked->prev = k;
    p->parked = k;
    p->n_parked++;
}

// Under p->mu: no longer parked (the caller resumes its connection after unlocking).
static void unpark(kaon_parker *p, kaon_parked *k) {
    list_remove(p, k);
    k->is_parked = false;
    k->pending = false;
}

void kaon_park_notify(void *ctx) {
    kaon_parked *k = ctx;
    kaon_parker *p = k->parker;
    pthread_mutex_lock(&p->mu);
    k->pending = true;
    if (k->is_parked && !k->in_ready) {
        k->in_ready = true;
        k->next_ready = p->ready;
        p->ready = k;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

int kaon_park(kaon_parked *k) {
    kaon_parker *p = k->parker;
    if (atomic_load(&p->closed)) return -1;
    // Suspend before publishing, so the resume can never come first.
    MHD_suspend_connection(k->c);
    pthread_mutex_lock(&p->mu);
    if (k->pending || atomic_load(&p->closed)) {
        // An output came meanwhile: straight back (MHD calls again once resumed).
        k->pending = false;
        pthread_mutex_unlock(&p->mu);
        MHD_resume_connection(k->c);
        return 1;
    }
    k->is_parked = true;
    list_push(p, k);
    pthread_mutex_unlock(&p->mu);
    return 1;
}

// True when the peer has closed its side (or the socket failed), given poll's revents.
static bool peer_gone(int fd, short revents) {
    if (revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (revents & POLLIN) {
        char b;
        return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

// Finds the parked requests to wake besides the notified ones: all of them while stopping,
// those past their deadline, and those whose client has gone (one poll over every socket).
// Their connections are appended to *wake. Runs unlocked on a snapshot: only this thread
// unparks, so the snapshot's entries stay parked until it does.
static void check_parked(kaon_parker *p, struct MHD_Connection ***wake, size_t *n_wake,
                         size_t *cap_wake) {
    pthread_mutex_lock(&p->mu);
    size_t n = p->n_parked;
    if (n > p->cap_snap) {
        size_t cap = n + n / 2 + 16;
        kaon_parked **s = realloc(p->snap, cap * sizeof *s);
        struct pollfd *f = realloc(p->fds, cap * sizeof *f);
        if (s) p->snap = s;
        if (f) p->fds = f;
        if (!s || !f) {
            pthread_mutex_unlock(&p->mu);
            return;
        }
        p->cap_snap = cap;
    }
    size_t i = 0;
    for (kaon_parked *k = p->parked; k; k = k->next, i++) {
        p->snap[i] = k;
        p->fds[i] = (struct pollfd){.fd = k->fd, .events = POLLIN | POLLRDHUP};
    }
    pthread_mutex_unlock(&p->mu);
    if (!n) return;
    bool all = p->should_wake_all && p->should_wake_all(p->ctx);
    if (!all && poll(p->fds, n, 0) < 0) return;
    double now = kaon_now();
    pthread_mutex_lock(&p->mu);
    for (i = 0; i < n; i++) {
        kaon_parked *k = p->snap[i];
        bool gone = !all && peer_gone(k->fd, p->fds[i].revents);
        if (gone) atomic_store(&k->gone, true);
        if (!all && !gone && !(k->deadline > 0 && now > k->deadline)) continue;
        if (!k->is_parked || k->in_ready) continue;  // a notification already has it
        unpark(p, k);
        if (*n_wake == *cap_wake) {
            size_t cap = *cap_wake ? *cap_wake * 2 : 64;
            struct MHD_Connection **w = realloc(*wake, cap * sizeof *w);
            if (!w) {  // keep it parked; the next check retries
                k->is_parked = true;
                list_push(p, k);
                continue;
            }
            *wake = w;
            *cap_wake = cap;
        }
        (*wake)[(*n_wake)++] = k->c;
    }
    pthread_mutex_unlock(&p->mu);
}

static void wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

static void *waker_main(void *arg) {
    kaon_parker *p = arg;
    struct MHD_Connection **wake = NULL;
    size_t n_wake = 0, cap_wake = 0;
    double next_check = kaon_now() + CHECK_MS / 1000.0;
    pthread_mutex_lock(&p->mu);
    while (!p->quit) {
        if (!p->ready) {
            int ms = (int)((next_check - kaon_now()) * 1000.0);
            if (ms > 0) wait_ms(&p->cv, &p->mu, ms);
        }
        n_wake = 0;
        for (kaon_parked *k = p->ready; k; k = k->next_ready) {
            if (n_wake == cap_wake) {
                size_t cap = cap_wake ? cap_wake * 2 : 64;
                struct MHD_Connection **w = realloc(wake, cap * sizeof *w);
                if (!w) break;  // the rest stay in the list for the next round
                wake = w;
                cap_wake = cap;
            }
            p->ready = k->next_ready;
            k->in_ready = false;
            unpark(p, k);
            wake[n_wake++] = k->c;
        }
        pthread_mutex_unlock(&p->mu);
        // Resumed outside the lock: MHD takes its own, which its threads may hold while
        // they free a request (and so take the engine's lock, under which notify takes ours).
        for (size_t i = 0; i < n_wake; i++) MHD_resume_connection(wake[i]);
        if (kaon_now() >= next_check) {
            n_wake = 0;
            check_parked(p, &wake, &n_wake, &cap_wake);
            for (size_t i = 0; i < n_wake; i++) MHD_resume_connection(wake[i]);
            next_check = kaon_now() + CHECK_MS / 1000.0;
        }
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    free(wake);
    return NULL;
}

int kaon_parker_start(kaon_parker *p, bool (*should_wake_all)(void *), void *ctx) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->closed, false);
    p->should_wake_all = should_wake_all;
    p->ctx = ctx;
    int rc = pthread_create(&p->thread, NULL, waker_main, p);
    if (rc) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        return kaon_set_error("serve: cannot start the waker thread: %s", strerror(rc));
    }
    p->started = true;
    return 0;
}

void kaon_parker_close(kaon_parker *p) {
    if (!p->started) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->closed, true);
    p->quit = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    // Whatever is still parked is resumed (its handler sees the parker closed and gives up):
    // libmicrohttpd must not be stopped with suspended connections.
    pthread_mutex_lock(&p->mu);
    size_t n = p->n_parked, i = 0;
    struct MHD_Connection **wake = n ? malloc(n * sizeof *wake) : NULL;
    while (p->parked) {
        kaon_parked *k = p->parked;
        k->in_ready = false;
        unpark(p, k);
        if (wake) wake[i++] = k->c;
    }
    p->ready = NULL;
    pthread_mutex_unlock(&p->mu);
    for (size_t j = 0; j < i; j++) MHD_resume_connection(wake[j]);
    free(wake);
}

void kaon_parker_destroy(kaon_parker *p) {
    if (!p->started) return;
    free(p->snap);
    free(p->fds);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    p->started = false;
}

#endif
