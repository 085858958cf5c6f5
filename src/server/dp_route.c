#include "server/dp_route.h"

// Whether a is a better home than b for a prompt both may take.
static int better(const kaon_dp_replica_state *a, const kaon_dp_replica_state *b) {
    if (a->cached_tokens != b->cached_tokens) return a->cached_tokens > b->cached_tokens;
    if (a->seqs != b->seqs) return a->seqs < b->seqs;
    return a->kv_usage < b->kv_usage;
}

int kaon_dp_route(const kaon_dp_replica_state *r, int n) {
    if (n <= 1) return 0;
    int idlest = r[0].seqs;
    for (int i = 1; i < n; i++)
        if (r[i].seqs < idlest) idlest = r[i].seqs;
    const int slack = idlest > KAON_DP_BALANCE_SLACK ? idlest : KAON_DP_BALANCE_SLACK;
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (r[i].seqs > idlest + slack) continue;
        if (best < 0 || better(&r[i], &r[best])) best = i;  // strict: the lowest index wins ties
    }
    return best;
}
