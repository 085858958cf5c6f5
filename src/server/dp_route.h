// Routing a request to one of the server's data-parallel replicas (kaon serve
// --data-parallel-size N): a pure choice over what each replica reports, so it can be tested
// without engines (tests/unit/test_dp_route.c).
#ifndef KAON_SERVER_DP_ROUTE_H
#define KAON_SERVER_DP_ROUTE_H

#include <stddef.h>

// What a replica reports when a prompt is routed.
typedef struct kaon_dp_replica_state {
    size_t cached_tokens;  // the prompt's leading tokens its prefix cache holds
    int seqs;              // sequences running + waiting
    double kv_usage;       // KV blocks in use / total
} kaon_dp_replica_state;

// A replica this many sequences busier than the idlest one (or twice as busy, when that is
// more) is passed over even when it has the prompt cached: one popular system prompt must not
// pile every request onto one replica while the others idle.
#define KAON_DP_BALANCE_SLACK 8

// The replica for a prompt (0..n-1; n >= 1): among those within the balance slack of the
// idlest, the one caching the longest prefix; ties (and no hit at all) go to the least loaded
// (fewest sequences, then the least KV in use), then the lowest index.
int kaon_dp_route(const kaon_dp_replica_state *r, int n);

#endif
