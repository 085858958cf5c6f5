#ifndef KAON_UTIL_TIMER_H
#define KAON_UTIL_TIMER_H

#include <time.h>

// Monotonic seconds, for speed reports.
static inline double kaon_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
