#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

void kaon_sampling_params_default(kaon_sampling_params *p) {
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->seed = 0;
}

// splitmix64 to spread the seed, then xoroshiro128+.
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kaon_rng_seed(kaon_rng *r, uint64_t seed) {
    r->s[0] = splitmix64(&seed);
    r->s[1] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double kaon_rng_uniform(kaon_rng *r) {
    uint64_t s0 = r->s[0], s1 = r->s[1], out = s0 + s1;
    s1 ^= s0;
    r->s[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    r->s[1] = rotl(s1, 37);
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);
}

int kaon_argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

typedef struct cand {
    float p;
    int32_t id;
} cand;

static int by_prob_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

// (logit desc, id asc): the order of the full sort below.
static bool ranks_before(float la, int32_t ia, float lb, int32_t ib) {
    return la > lb || (la == lb && ia < ib);
}

// Sifts entry i of a min-heap of the k best (heap[0] is the worst kept).
static void sift_down(cand *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && ranks_before(h[w].p, h[w].id, h[l].p, h[l].id)) w = l;
        if (r < k && ranks_before(h[w].p, h[w].id, h[r].p, h[r].id)) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static int finish_sorted(cand *c, int m, const kaon_sampling_params *p, kaon_rng *rng);

// top_k first, by a heap over the raw logits: O(V) compares and only k exponentials.
static int sample_top_k(const float *logits, int n, const kaon_sampling_params *p, kaon_rng *rng,
                        cand *h) {
    int k = p->top_k;
    for (int i = 0; i < k; i++) h[i] = (cand){logits[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int i = k; i < n; i++) {
        if (!ranks_before(logits[i], i, h[0].p, h[0].id)) continue;
        h[0] = (cand){logits[i], i};
        sift_down(h, k, 0);
    }
    float mx = h[0].p;
    for (int i = 1; i < k; i++) mx = h[i].p > mx ? h[i].p : mx;
    for (int i = 0; i < k; i++) h[i].p = expf((h[i].p - mx) / p->temperature);
    qsort(h, (size_t)k, sizeof *h, by_prob_desc);
    return finish_sorted(h, k, p, rng);
}

size_t kaon_sample_scratch_bytes(int n) { return sizeof(cand) * (size_t)n; }

int kaon_sample(const float *logits, int n, const kaon_sampling_params *p, kaon_rng *rng,
                void *scratch) {
    if (p->temperature <= 0.0f || p->top_k == 1) return kaon_argmax(logits, n);
    cand *c = scratch;
    if (p->top_k > 0 && p->top_k <= 4096 && p->top_k < n) return sample_top_k(logits, n, p, rng, c);
    float mx = logits[kaon_argmax(logits, n)];
    // Candidates below 1e-12 of the best carry no probability mass worth sorting.
    const float cutoff = mx + p->temperature * logf(1e-12f);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (logits[i] < cutoff) continue;
        c[m].id = i;
        c[m].p = expf((logits[i] - mx) / p->temperature);
        m++;
    }
    qsort(c, (size_t)m, sizeof *c, by_prob_desc);
    return finish_sorted(c, m, p, rng);
}

// Applies top_k, min_p and top_p to candidates sorted by probability, then draws one.
static int finish_sorted(cand *c, int m, const kaon_sampling_params *p, kaon_rng *rng) {
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    if (p->min_p > 0.0f) {
        float floor_p = c[0].p * p->min_p;
        int k = 1;
        while (k < m && c[k].p >= floor_p) k++;
        m = k;
    }
    double sum = 0;
    for (int i = 0; i < m; i++) sum += c[i].p;
    if (p->top_p < 1.0f) {
        double acc = 0;
        int k = 0;
        while (k < m) {
            acc += c[k].p;
            k++;
            if (acc >= p->top_p * sum) break;
        }
        m = k;
        sum = acc;
    }
    double r = kaon_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[m - 1].id;
}
