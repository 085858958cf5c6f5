#include "engine/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void kaon_sampling_default(kaon_sampling *s) {
    memset(s, 0, sizeof *s);
    s->n = 1;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
    s->max_tokens = -1;
    s->logprobs = -1;
    s->prompt_logprobs = -1;
    s->skip_special_tokens = true;
}

void kaon_sampling_apply_generation_config(kaon_sampling *s, const kaon_model_config *c) {
    // Only values a request could carry: a bad file must not make every request fail.
    if (c->gen_temperature >= 0 && c->gen_temperature <= 100) s->temperature = c->gen_temperature;
    if (c->gen_top_p > 0 && c->gen_top_p <= 1) s->top_p = c->gen_top_p;
    if (c->gen_top_k >= 0) s->top_k = c->gen_top_k;
    if (c->gen_min_p >= 0 && c->gen_min_p <= 1) s->min_p = c->gen_min_p;
    if (c->gen_repetition_penalty > 0 && c->gen_repetition_penalty <= 10)
        s->repetition_penalty = c->gen_repetition_penalty;
    if (c->gen_max_new_tokens >= 1) s->max_tokens = c->gen_max_new_tokens;
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

static int argmax_scalar(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// The same answer as argmax_scalar, in two passes: the largest value (vmaxps, 32 values per
// iteration; with the new value as its first operand a NaN never replaces the running
// maximum), then the first index holding a value equal to it (the row is in the cache by
// then). The maximum starts at logits[0] (when that is NaN the scalar loop never moves
// either), so the answer is the first index of the largest non-NaN value, -0 and +0 equal.
__attribute__((target("avx2"))) static int argmax_avx2(const float *logits, int n) {
    const float x0 = logits[0];
    if (n < 64 || x0 != x0) return argmax_scalar(logits, n);
    __m256 m0 = _mm256_set1_ps(x0), m1 = m0, m2 = m0, m3 = m0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(logits + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(logits + i + 24), m3);
    }
    float t[8], mx;
    _mm256_storeu_ps(t, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    mx = t[0];
    for (int l = 1; l < 8; l++) mx = t[l] > mx ? t[l] : mx;
    for (; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    const __m256 vm = _mm256_set1_ps(mx);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(logits + j), vm, _CMP_EQ_OQ));
        if (hit) return j + __builtin_ctz((unsigned)hit);
    }
    for (; j < n; j++)
        if (logits[j] == mx) return j;
    return 0;  // not reached: mx is one of the values
}
#endif

int kaon_argmax(const float *logits, int n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx2")) return argmax_avx2(logits, n);
#endif
    return argmax_scalar(logits, n);
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

static int trim_sorted(cand *c, int m, const kaon_sampling *p, double *sum);

// The first index i >= from with x[i] > thr (n when none). A NaN is never above.
static int next_above_scalar(const float *x, int from, int n, float thr) {
    for (int i = from; i < n; i++)
        if (x[i] > thr) return i;
    return n;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static int next_above_avx2(const float *x, int from, int n, float thr) {
    const __m256 t = _mm256_set1_ps(thr);
    int i = from;
    for (; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GT_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    return next_above_scalar(x, i, n, thr);
}
#endif

static int next_above(const float *x, int from, int n, float thr) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (__builtin_cpu_supports("avx2")) return next_above_avx2(x, from, n, thr);
#endif
    return next_above_scalar(x, from, n, thr);
}

// top_k first, by a heap over the raw logits: O(V) compares and only k exponentials. A later
// logit enters the heap only when it is strictly above the worst one kept (on a tie the
// earlier id ranks first, and every id in the heap is earlier), so the scan only looks for
// values above that threshold, 8 at a time.
static int top_k_candidates(const float *logits, int n, const kaon_sampling *p, cand *h) {
    int k = p->top_k;
    for (int i = 0; i < k; i++) h[i] = (cand){logits[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int i = next_above(logits, k, n, h[0].p); i < n; i = next_above(logits, i + 1, n, h[0].p)) {
        h[0] = (cand){logits[i], i};
        sift_down(h, k, 0);
    }
    float mx = h[0].p;
    for (int i = 1; i < k; i++) mx = h[i].p > mx ? h[i].p : mx;
    for (int i = 0; i < k; i++) h[i].p = expf((h[i].p - mx) / p->temperature);
    qsort(h, (size_t)k, sizeof *h, by_prob_desc);
    return k;
}

// Sorts c[0..m) (collected in id order) into by_prob_desc order; tmp holds m more entries.
// Returns c or tmp, whichever holds the result. Many candidates: a stable LSD radix sort on
// the bits of p (positive floats order like their bit patterns; descending p is ascending
// complement), which keeps equal p in id order, as by_prob_desc does.
static cand *sort_by_prob(cand *c, int m, cand *tmp) {
    if (m < 512) {
        qsort(c, (size_t)m, sizeof *c, by_prob_desc);
        return c;
    }
    enum { BITS = 11, NB = 1 << BITS };
    uint32_t cnt[3][NB];
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < m; i++) {
        uint32_t key;
        memcpy(&key, &c[i].p, 4);
        key = ~key;
        cnt[0][key & (NB - 1)]++;
        cnt[1][(key >> BITS) & (NB - 1)]++;
        cnt[2][key >> (2 * BITS)]++;
    }
    cand *src = c, *dst = tmp;
    for (int pass = 0; pass < 3; pass++) {
        uint32_t *h = cnt[pass], sum = 0;
        int single = 0;  // every key has the same digit: nothing moves
        for (int d = 0; d < NB; d++)
            if (h[d] == (uint32_t)m) single = 1;
        if (single) continue;
        for (int d = 0; d < NB; d++) {
            const uint32_t t = h[d];
            h[d] = sum;
            sum += t;
        }
        for (int i = 0; i < m; i++) {
            uint32_t key;
            memcpy(&key, &src[i].p, 4);
            key = ~key;
            dst[h[(key >> (pass * BITS)) & (NB - 1)]++] = src[i];
        }
        cand *t = src;
        src = dst;
        dst = t;
    }
    return src;
}

size_t kaon_sample_scratch_bytes(int n) { return 2 * sizeof(cand) * (size_t)n; }

// The candidates a (non-greedy) draw chooses from, by descending probability (unnormalized:
// the best is 1), top_k / min_p / top_p applied: *m of them, weights summing to *sum.
static cand *candidates(const float *logits, int n, const kaon_sampling *p, void *scratch, int *m_out,
                        double *sum) {
    cand *c = scratch;
    if (p->top_k > 0 && p->top_k <= 4096 && p->top_k < n) {
        *m_out = trim_sorted(c, top_k_candidates(logits, n, p, c), p, sum);
        return c;
    }
    float mx = logits[kaon_argmax(logits, n)];
    // Candidates below 1e-12 of the best carry no probability mass worth sorting.
    const float cutoff = mx + p->temperature * logf(1e-12f);
    // With min_p, finish_sorted keeps exactly the candidates with p >= min_p * (the best p,
    // which is expf(0) = 1), whatever their order: the others are left out before sorting.
    const float floor_p = p->min_p > 0.0f ? 1.0f * p->min_p : 0.0f;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (logits[i] < cutoff) continue;
        const float pi = expf((logits[i] - mx) / p->temperature);
        if (pi < floor_p) continue;
        c[m].id = i;
        c[m].p = pi;
        m++;
    }
    cand *sorted = sort_by_prob(c, m, c + n);
    *m_out = trim_sorted(sorted, m, p, sum);
    return sorted;
}

int kaon_sample(const float *logits, int n, const kaon_sampling *p, kaon_rng *rng,
                void *scratch) {
    if (p->temperature <= 0.0f || p->top_k == 1) return kaon_argmax(logits, n);
    int m;
    double sum;
    const cand *c = candidates(logits, n, p, scratch, &m, &sum);
    double r = kaon_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[m - 1].id;
}

void kaon_sample_probs(const float *logits, int n, const kaon_sampling *p, void *scratch, float *probs) {
    memset(probs, 0, sizeof(float) * (size_t)n);
    if (p->temperature <= 0.0f || p->top_k == 1) {
        probs[kaon_argmax(logits, n)] = 1.0f;
        return;
    }
    int m;
    double sum;
    const cand *c = candidates(logits, n, p, scratch, &m, &sum);
    for (int i = 0; i < m; i++) probs[c[i].id] = (float)(c[i].p / sum);
}

// Applies top_k, min_p and top_p to candidates sorted by probability: how many stay, and the
// sum of their weights in *sum_out.
static int trim_sorted(cand *c, int m, const kaon_sampling *p, double *sum_out) {
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
    *sum_out = sum;
    return m;
}
