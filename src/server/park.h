// Parked generation requests: connections suspended in libmicrohttpd until their engine
// request has output (or their client left, the server stops, or --request-timeout passes).
// See park.c. Only built with libmicrohttpd.
#ifndef KAON_SERVER_PARK_H
#define KAON_SERVER_PARK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

typedef struct kaon_parker kaon_parker;

// One request's place; embedded in its state, which must outlive any parking of it (a
// suspended connection is never freed by libmicrohttpd, so this holds by construction).
typedef struct kaon_parked {
    kaon_parker *parker;
    struct MHD_Connection *c;
    int fd;                      // the client's socket, watched while parked
    double deadline;             // wake when past it (0: none)
    atomic_bool gone;            // set when the client was seen to have left
    // Under parker->mu:
    bool pending;                // an output arrived since the handler last looked
    bool is_parked, in_ready;
    struct kaon_parked *prev, *next, *next_ready;
} kaon_parked;

struct kaon_parker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, quit;
    atomic_bool closed;
    kaon_parked *parked, *ready;
    size_t n_parked;
    kaon_parked **snap;          // the waker's snapshot for its periodic check
    struct pollfd *fds;
    size_t cap_snap;
    bool (*should_wake_all)(void *ctx);  // e.g. the server is stopping
    void *ctx;
};

int kaon_parker_start(kaon_parker *p, bool (*should_wake_all)(void *ctx), void *ctx);
// Stops the waker and resumes everything still parked; later kaon_park calls return -1.
void kaon_parker_close(kaon_parker *p);
void kaon_parker_destroy(kaon_parker *p);

// The engine's notification (kaon_request_set_notify) with ctx = the kaon_parked.
void kaon_park_notify(void *ctx);
// From the connection's access handler or content reader, when there is nothing to send:
// suspends the connection until woken. 1: suspended (return 0 bytes / MHD_YES; MHD calls
// again once resumed); -1: the parker is closed (give up on the request).
int kaon_park(kaon_parked *k);

#endif
