// Sampling against expectations computed here: chi-square goodness of fit of temperature,
// top-k, top-p and min-p on fixed logits; seeded reproducibility; penalties vs a reference.
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/penalties.h"
#include "engine/sampler.h"
#include "test.h"

#define V 8
static const float logits[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};

// The distribution each parameter set should produce, computed independently in double.
static void expected(const kaon_sampling *p, double *prob) {
    double w[V], sum = 0;
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;  // logits are already sorted descending
    for (int i = 0; i < V; i++) w[i] = exp((logits[i] - logits[0]) / p->temperature);
    int keep = V;
    if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
    if (p->min_p > 0) {
        int k = 0;
        while (k < keep && w[order[k]] >= p->min_p * w[order[0]]) k++;
        keep = k;
    }
    for (int i = 0; i < keep; i++) sum += w[order[i]];
    if (p->top_p < 1) {
        double acc = 0;
        int k = 0;
        while (k < keep) {
            acc += w[order[k++]];
            if (acc >= p->top_p * sum) break;
        }
        keep = k;
        sum = acc;
    }
    for (int i = 0; i < V; i++) prob[i] = 0;
    for (int i = 0; i < keep; i++) prob[order[i]] = w[order[i]] / sum;
}

// Chi-square critical values at p = 0.001 for df = 1..7.
static const double chi2_crit[8] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

static void check_distribution(kaon_sampling p, const char *label) {
    double prob[V];
    expected(&p, prob);
    enum { N = 40000 };
    int count[V] = {0};
    kaon_rng rng;
    kaon_rng_seed(&rng, 12345);
    char scratch[V * 16];
    for (int i = 0; i < N; i++) count[kaon_sample(logits, V, &p, &rng, scratch)]++;
    double chi2 = 0;
    int df = -1;
    for (int i = 0; i < V; i++) {
        if (prob[i] == 0) {
            if (count[i] != 0) fprintf(stderr, "%s: token %d excluded but sampled %d times\n", label, i, count[i]);
            CHECK(count[i] == 0);
            continue;
        }
        double e = prob[i] * N;
        chi2 += (count[i] - e) * (count[i] - e) / e;
        df++;
    }
    if (df < 1) {  // a single survivor: it must always be chosen
        CHECK(df == 0);
        return;
    }
    if (chi2 >= chi2_crit[df]) fprintf(stderr, "%s: chi2 %.2f (df %d) >= %.2f\n", label, chi2, df, chi2_crit[df]);
    CHECK(chi2 < chi2_crit[df]);
}

static void test_distributions(void) {
    kaon_sampling p;
    kaon_sampling_default(&p);
    check_distribution(p, "temperature 1");
    p.temperature = 0.5f;
    check_distribution(p, "temperature 0.5");
    p.temperature = 2.0f;
    check_distribution(p, "temperature 2");
    kaon_sampling_default(&p);
    p.top_k = 3;
    check_distribution(p, "top_k 3");
    kaon_sampling_default(&p);
    p.top_p = 0.7f;
    check_distribution(p, "top_p 0.7");
    kaon_sampling_default(&p);
    p.min_p = 0.2f;
    check_distribution(p, "min_p 0.2");
    p.top_k = 4;
    p.top_p = 0.9f;
    p.temperature = 0.8f;
    check_distribution(p, "combined");
    // A test that can fail: a wrong expectation must be rejected by the same statistic.
    kaon_sampling_default(&p);
    double prob[V];
    expected(&p, prob);
    kaon_sampling q = p;
    q.temperature = 1.3f;
    int count[V] = {0};
    kaon_rng rng;
    kaon_rng_seed(&rng, 1);
    char scratch[V * 16];
    for (int i = 0; i < 40000; i++) count[kaon_sample(logits, V, &q, &rng, scratch)]++;
    double chi2 = 0;
    for (int i = 0; i < V; i++) chi2 += (count[i] - prob[i] * 40000) * (count[i] - prob[i] * 40000) / (prob[i] * 40000);
    CHECK(chi2 > chi2_crit[7]);
}

static void test_greedy_and_seed(void) {
    kaon_sampling p;
    kaon_sampling_default(&p);
    p.temperature = 0;
    char scratch[V * 16];
    kaon_rng rng;
    kaon_rng_seed(&rng, 1);
    CHECK(kaon_sample(logits, V, &p, &rng, scratch) == 0);
    float tie[4] = {1, 3, 3, 0};
    CHECK(kaon_argmax(tie, 4) == 1);  // first of equal maxima, like torch.argmax
    kaon_sampling_default(&p);
    kaon_rng a, b;
    kaon_rng_seed(&a, 99);
    kaon_rng_seed(&b, 99);
    for (int i = 0; i < 1000; i++)
        CHECK(kaon_sample(logits, V, &p, &a, scratch) == kaon_sample(logits, V, &p, &b, scratch));
}

static void test_penalties(void) {
    float x[V], ref[V];
    memcpy(x, logits, sizeof x);
    kaon_token_counts seen = {0}, out = {0};
    int prompt[] = {0, 3, 3, 6};
    int gen[] = {3, 1, 1, 1, 7};
    for (size_t i = 0; i < sizeof prompt / sizeof *prompt; i++) kaon_token_counts_add(&seen, prompt[i], 1);
    for (size_t i = 0; i < sizeof gen / sizeof *gen; i++) {
        kaon_token_counts_add(&seen, gen[i], 1);
        kaon_token_counts_add(&out, gen[i], 1);
    }
    CHECK(kaon_token_counts_get(&out, 1) == 3);
    CHECK(kaon_token_counts_get(&out, 5) == 0);
    const float rep = 1.3f, pres = 0.4f, freq = 0.25f;
    // Reference: HF repetition penalty over prompt+output, then OpenAI penalties over output.
    for (int t = 0; t < V; t++) {
        double v = logits[t];
        bool in_seen = false;
        int n_out = 0;
        for (size_t i = 0; i < 4; i++) in_seen |= prompt[i] == t;
        for (size_t i = 0; i < 5; i++) { in_seen |= gen[i] == t; n_out += gen[i] == t; }
        if (in_seen) v = v > 0 ? v / rep : v * rep;
        if (n_out) v -= pres + freq * n_out;
        ref[t] = (float)v;
    }
    kaon_apply_penalties(x, &seen, &out, rep, pres, freq);
    for (int t = 0; t < V; t++) CHECK_NEAR(x[t], ref[t], 1e-6);
    kaon_token_counts_free(&seen);
    kaon_token_counts_free(&out);
}

// kaon_argmax (vectorized where the CPU can) against the plain loop: first index of the
// largest value, NaN never chosen unless it is first, -0 and +0 equal.
static int argmax_ref(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static uint64_t tstate = 12345;
static uint64_t trand(void) {
    tstate ^= tstate << 13;
    tstate ^= tstate >> 7;
    tstate ^= tstate << 17;
    return tstate;
}

static void test_argmax_large(void) {
    static float x[49153];
    const int ns[] = {1, 2, 7, 31, 32, 63, 64, 65, 95, 96, 100, 1000, 4097, 49152, 49153};
    int bad = 0;
    for (int kind = 0; kind < 7; kind++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int rep = 0; rep < 4; rep++) {
                const int n = ns[ni];
                for (int i = 0; i < n; i++) {
                    const uint64_t r = trand();
                    switch (kind) {
                    case 0: x[i] = (float)((int64_t)(r >> 11) % 2000001 - 1000000) * 1e-4f; break;
                    case 1: x[i] = (float)(r % 5); break;                       // many ties
                    case 2: x[i] = 1.0f; break;                                 // all equal
                    case 3: x[i] = (r % 7 == 0) ? NAN : (float)(r % 9); break;  // NaN inside
                    case 4: x[i] = (r % 3 == 0) ? -INFINITY : (r % 3 == 1 ? 0.0f : -0.0f); break;
                    case 5: x[i] = (r % 1000 == 0) ? INFINITY : -(float)(r % 100); break;
                    default: x[i] = i == 0 ? NAN : (float)(r % 50); break;      // NaN first
                    }
                }
                if (kind == 1 && rep == 1) x[n - 1] = 10.0f;  // the maximum last
                if (kaon_argmax(x, n) != argmax_ref(x, n)) bad++;
            }
    CHECK(bad == 0);
}

// The sampler as it was before its fast paths (full qsort of every candidate, scalar scans):
// kaon_sample must draw exactly the same ids from the same generator state.
typedef struct { float p; int32_t id; } rcand;
static int rcmp(const void *a, const void *b) {
    const rcand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}
static bool rbefore(float la, int32_t ia, float lb, int32_t ib) { return la > lb || (la == lb && ia < ib); }
static void rsift(rcand *h, int k, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && rbefore(h[w].p, h[w].id, h[l].p, h[l].id)) w = l;
        if (r < k && rbefore(h[w].p, h[w].id, h[r].p, h[r].id)) w = r;
        if (w == i) return;
        rcand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}
static int rfinish(rcand *c, int m, const kaon_sampling *p, kaon_rng *rng) {
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
static int sample_ref(const float *x, int n, const kaon_sampling *p, kaon_rng *rng, rcand *c) {
    if (p->temperature <= 0.0f || p->top_k == 1) return argmax_ref(x, n);
    if (p->top_k > 0 && p->top_k <= 4096 && p->top_k < n) {
        int k = p->top_k;
        for (int i = 0; i < k; i++) c[i] = (rcand){x[i], i};
        for (int i = k / 2 - 1; i >= 0; i--) rsift(c, k, i);
        for (int i = k; i < n; i++) {
            if (!rbefore(x[i], i, c[0].p, c[0].id)) continue;
            c[0] = (rcand){x[i], i};
            rsift(c, k, 0);
        }
        float mx = c[0].p;
        for (int i = 1; i < k; i++) mx = c[i].p > mx ? c[i].p : mx;
        for (int i = 0; i < k; i++) c[i].p = expf((c[i].p - mx) / p->temperature);
        qsort(c, (size_t)k, sizeof *c, rcmp);
        return rfinish(c, k, p, rng);
    }
    float mx = x[argmax_ref(x, n)];
    const float cutoff = mx + p->temperature * logf(1e-12f);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] < cutoff) continue;
        c[m].id = i;
        c[m].p = expf((x[i] - mx) / p->temperature);
        m++;
    }
    qsort(c, (size_t)m, sizeof *c, rcmp);
    return rfinish(c, m, p, rng);
}

static double tgauss(void) {
    double u = ((double)(trand() >> 11) + 1.0) / 9007199254740993.0, v = (double)(trand() >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void test_matches_reference(void) {
    const int Vs[] = {8, 100, 1000, 5000, 49152};
    const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    const int topks[] = {0, 1, 5, 50, 600, 4096, 5000};
    const float topps[] = {1.0f, 0.9f, 0.5f, 0.95f};
    const float minps[] = {0.0f, 0.05f, 0.2f};
    static float x[49152];
    static rcand rc[49152];
    static char scratch[49152 * 16];
    int bad = 0, cases = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof *Vs; vi++)
        for (int dist = 0; dist < 3; dist++) {
            const int n = Vs[vi];
            for (int i = 0; i < n; i++) {
                const double g = tgauss();
                x[i] = dist == 0 ? (float)(3.0 * g) : dist == 1 ? roundf((float)(2.0 * g)) : (float)(8.0 * g);
                if (dist == 2 && trand() % 50 == 0) x[i] = -INFINITY;
            }
            for (size_t ti = 0; ti < sizeof temps / sizeof *temps; ti++)
                for (size_t ki = 0; ki < sizeof topks / sizeof *topks; ki++)
                    for (size_t pi = 0; pi < sizeof topps / sizeof *topps; pi++)
                        for (size_t mi = 0; mi < sizeof minps / sizeof *minps; mi++) {
                            if (n == 49152 && (ti % 2 || mi == 1)) continue;  // keep the test short
                            kaon_sampling p;
                            kaon_sampling_default(&p);
                            p.temperature = temps[ti], p.top_k = topks[ki], p.top_p = topps[pi], p.min_p = minps[mi];
                            kaon_rng a, b;
                            kaon_rng_seed(&a, 1000 + cases);
                            kaon_rng_seed(&b, 1000 + cases);
                            for (int d = 0; d < 6; d++)
                                if (kaon_sample(x, n, &p, &a, scratch) != sample_ref(x, n, &p, &b, rc)) bad++;
                            cases++;
                        }
        }
    if (bad) fprintf(stderr, "sampler: %d of %d draws differ from the reference\n", bad, cases * 6);
    CHECK(bad == 0);
}

// generation_config.json's defaults: valid values replace OpenAI's, unset and invalid ones
// (a request could not carry them) leave them.
static void test_generation_config_defaults(void) {
    kaon_model_config c;
    kaon_model_config_init(&c);
    kaon_sampling s, d;
    kaon_sampling_default(&d);
    kaon_sampling_default(&s);
    kaon_sampling_apply_generation_config(&s, &c);
    CHECK(!memcmp(&s, &d, sizeof s));
    c.gen_temperature = 0.6f, c.gen_top_p = 0.9f, c.gen_top_k = 20, c.gen_min_p = 0.05f;
    c.gen_repetition_penalty = 1.1f, c.gen_max_new_tokens = 300;
    kaon_sampling_apply_generation_config(&s, &c);
    CHECK(s.temperature == 0.6f && s.top_p == 0.9f && s.top_k == 20 && s.min_p == 0.05f);
    CHECK(s.repetition_penalty == 1.1f && s.max_tokens == 300 && s.n == 1 && !s.has_seed);
    c.gen_temperature = 200, c.gen_top_p = 1.5f, c.gen_min_p = 2, c.gen_repetition_penalty = 0;
    c.gen_max_new_tokens = 0;
    kaon_sampling_default(&s);
    kaon_sampling_apply_generation_config(&s, &c);
    CHECK(s.temperature == d.temperature && s.top_p == d.top_p && s.min_p == d.min_p);
    CHECK(s.repetition_penalty == d.repetition_penalty && s.max_tokens == d.max_tokens && s.top_k == 20);
}

int main(void) {
    test_generation_config_defaults();
    test_argmax_large();
    test_matches_reference();
    test_distributions();
    test_greedy_and_seed();
    test_penalties();
    TEST_MAIN_END();
}
