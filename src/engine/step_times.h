// Wall time of the engine's steps, outside the public API (kaon_engine_stats is allocated by
// callers, so its layout is fixed by the ABI): the steps that computed prompt tokens (prefill
// alone or mixed with decodes) and the decode-only ones. Where a run's time goes: kaon generate's
// progress line and kaon-stats, and the server's /metrics.
#ifndef KAON_ENGINE_STEP_TIMES_H
#define KAON_ENGINE_STEP_TIMES_H

#include <stdint.h>

#include "kaon.h"

typedef struct kaon_step_times {
    uint64_t prefill_steps, decode_steps;
    double prefill_seconds, decode_seconds;  // plan, forward, sampling and outputs of each step
    // The engine thread's own work in those steps (schedule, batch, sampling plan, outputs,
    // publishing: everything but the forward pass and device sampling), which the device waits
    // for today: what overlapping step N + 1's CPU work with step N's forward would win.
    double prefill_host_seconds, decode_host_seconds;
} kaon_step_times;

void kaon_engine_step_times(kaon_engine *e, kaon_step_times *t);

#endif
