// Sampling against expectations computed here: chi-square goodness of fit of temperature,
// top-k, top-p and min-p on fixed logits; seeded reproducibility; penalties vs a reference.
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "engine/penalties.h"
#include "engine/sampler.h"
#include "test.h"

#define V 8
static const float logits[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};

// The distribution each parameter set should produce, computed independently in double.
static void expected(const kaon_sampling_params *p, double *prob) {
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

static void check_distribution(kaon_sampling_params p, const char *label) {
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
    kaon_sampling_params p;
    kaon_sampling_params_default(&p);
    check_distribution(p, "temperature 1");
    p.temperature = 0.5f;
    check_distribution(p, "temperature 0.5");
    p.temperature = 2.0f;
    check_distribution(p, "temperature 2");
    kaon_sampling_params_default(&p);
    p.top_k = 3;
    check_distribution(p, "top_k 3");
    kaon_sampling_params_default(&p);
    p.top_p = 0.7f;
    check_distribution(p, "top_p 0.7");
    kaon_sampling_params_default(&p);
    p.min_p = 0.2f;
    check_distribution(p, "min_p 0.2");
    p.top_k = 4;
    p.top_p = 0.9f;
    p.temperature = 0.8f;
    check_distribution(p, "combined");
    // A test that can fail: a wrong expectation must be rejected by the same statistic.
    kaon_sampling_params_default(&p);
    double prob[V];
    expected(&p, prob);
    kaon_sampling_params q = p;
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
    kaon_sampling_params p;
    kaon_sampling_params_default(&p);
    p.temperature = 0;
    char scratch[V * 16];
    kaon_rng rng;
    kaon_rng_seed(&rng, 1);
    CHECK(kaon_sample(logits, V, &p, &rng, scratch) == 0);
    float tie[4] = {1, 3, 3, 0};
    CHECK(kaon_argmax(tie, 4) == 1);  // first of equal maxima, like torch.argmax
    kaon_sampling_params_default(&p);
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

int main(void) {
    test_distributions();
    test_greedy_and_seed();
    test_penalties();
    TEST_MAIN_END();
}
