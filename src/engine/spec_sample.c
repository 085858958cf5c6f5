// Speculative sampling for drafts drawn from a distribution (EAGLE, MTP): Leviathan et al.
// 2023 and Chen et al. 2023. A draft x ~ q is kept with probability min(1, p(x) / q(x));
// otherwise the token is drawn from norm(max(0, p - q)). Either way the token is distributed
// as p: P(x kept) = min(q(x), p(x)) and the residual adds exactly the mass p lacks.
#include <stdbool.h>

#include "engine/spec.h"

int32_t kaon_spec_accept(const float *p, const float *q, int n, int32_t x, kaon_rng *rng, bool *accepted) {
    const double px = p[x], qx = q[x];
    const double u = kaon_rng_uniform(rng);
    // q(x) = 0 cannot happen for a draw from q; a ratio of infinity would keep it.
    if (qx <= 0.0 ? px > 0.0 : u * qx < px) {
        *accepted = true;
        return x;
    }
    *accepted = false;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += p[i] > q[i] ? (double)p[i] - q[i] : 0.0;
    const double r = kaon_rng_uniform(rng) * sum;
    double acc = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (p[i] <= q[i]) continue;
        acc += (double)p[i] - q[i];
        last = i;
        if (r < acc) return i;
    }
    if (last >= 0) return last;  // rounding at the top of the sum
    // p = q up to rounding (a rejection then has probability ~0): a draw from p.
    const double r2 = kaon_rng_uniform(rng);
    acc = 0;
    for (int i = 0; i < n; i++) {
        acc += p[i];
        if (r2 < acc) return i;
    }
    return x;
}
