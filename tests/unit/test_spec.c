// Speculative decoding's n-gram proposer and settings (src/engine/spec.c), against a brute
// force written here; speculative sampling (spec_sample.c) by chi-square tests against the
// target distribution.
#include <math.h>
#include <string.h>

#include "engine/spec.h"
#include "test.h"

// The reference: the latest earlier occurrence of the longest suffix in [min_n, max_n]; the
// tokens after it, continued through the drafts themselves.
static int brute(const int32_t *t, int n, int min_n, int max_n, int k, int32_t *out) {
    for (int g = max_n; g >= min_n; g--) {
        if (g > n - 1) continue;
        for (int i = n - g - 1; i >= 0; i--) {
            int eq = 1;
            for (int j = 0; j < g; j++) eq &= t[i + j] == t[n - g + j];
            if (!eq) continue;
            int32_t ext[256];
            memcpy(ext, t, sizeof(int32_t) * (size_t)n);
            for (int j = 0; j < k; j++) ext[n + j] = ext[i + g + j];
            memcpy(out, ext + n, sizeof(int32_t) * (size_t)k);
            return k;
        }
    }
    return 0;
}

// The chi-square statistic's 1 - 1e-5 quantile for df degrees of freedom (Wilson-Hilferty):
// a correct sampler fails a check once in 100,000 runs.
static double chi2_crit(int df) {
    const double z = 4.2649, a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + z * sqrt(a), 3);
}

// Drafts x ~ q (kaon_sample of q's logits under sp), verified against p's logits under the
// same sp: the kept-or-replaced token must be distributed as kaon_sample_probs(p). Also
// checks the keep rate: sum over x of min(p(x), q(x)).
static void check_spec_sampling(const float *lp, const float *lq, int V, const kaon_sampling *sp, unsigned seed) {
    enum { N = 200000 };
    float p[16], q[16];
    static unsigned char scratch[2 * 16 * 8 * 4];
    kaon_sample_probs(lp, V, sp, scratch, p);
    kaon_sample_probs(lq, V, sp, scratch, q);
    kaon_rng rng;
    kaon_rng_seed(&rng, seed);
    long cnt[16] = {0}, kept = 0;
    for (int t = 0; t < N; t++) {
        const int32_t x = kaon_sample(lq, V, sp, &rng, scratch);
        bool acc;
        const int32_t y = kaon_spec_accept(p, q, V, x, &rng, &acc);
        CHECK(y >= 0 && y < V);
        if (y < 0 || y >= V) return;
        CHECK(!acc || y == x);
        cnt[y]++;
        kept += acc;
    }
    double chi = 0, keep = 0;
    int df = -1;
    for (int i = 0; i < V; i++) {
        keep += fmin(p[i], q[i]);
        if (p[i] == 0.0f) {
            CHECK(cnt[i] == 0);  // a token the target's filters removed never comes out
            continue;
        }
        const double e = (double)N * p[i];
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
        df++;
    }
    if (df > 0) {
        CHECK(chi < chi2_crit(df));
        if (!(chi < chi2_crit(df))) fprintf(stderr, "  chi2 %.1f >= %.1f (df %d, T %g)\n", chi, chi2_crit(df), df, sp->temperature);
    }
    // The keep rate is a binomial proportion: within 5 standard deviations.
    const double sd = sqrt(keep * (1 - keep) / N) + 1e-9;
    CHECK(fabs((double)kept / N - keep) < 5 * sd + 1e-6);
}

int main(void) {
    int32_t out[16];
    // "a b c d a b" -> the suffix "a b" occurred at 0; after it "c d", then "a b" again.
    const int32_t t1[] = {1, 2, 3, 4, 1, 2};
    CHECK(kaon_spec_ngram_propose(t1, 6, 2, 4, 4, out) == 4);
    CHECK(out[0] == 3 && out[1] == 4 && out[2] == 1 && out[3] == 2);
    // The longest suffix wins over a later shorter match: "9 5 6" at 0, "5 6" also at 4.
    const int32_t t2[] = {9, 5, 6, 7, 5, 6, 8, 9, 5, 6};
    CHECK(kaon_spec_ngram_propose(t2, 10, 2, 3, 2, out) == 2 && out[0] == 7 && out[1] == 5);
    CHECK(kaon_spec_ngram_propose(t2, 10, 2, 2, 2, out) == 2 && out[0] == 8 && out[1] == 9);
    // No match; too short; min above what exists; k = 0.
    const int32_t t3[] = {1, 2, 3, 4, 5};
    CHECK(kaon_spec_ngram_propose(t3, 5, 1, 4, 4, out) == 0);
    CHECK(kaon_spec_ngram_propose(t3, 1, 1, 4, 4, out) == 0);
    CHECK(kaon_spec_ngram_propose(t1, 6, 3, 4, 4, out) == 0);
    CHECK(kaon_spec_ngram_propose(t1, 6, 1, 4, 0, out) == 0);
    // A run of one token: period 1, k copies.
    const int32_t t4[] = {7, 7, 7};
    CHECK(kaon_spec_ngram_propose(t4, 3, 1, 4, 5, out) == 5);
    for (int j = 0; j < 5; j++) CHECK(out[j] == 7);

    // Random short alphabets (many repeats) against the brute force.
    unsigned x = 12345;
    int proposed = 0;
    for (int it = 0; it < 20000; it++) {
        int32_t t[64], a[16], b[16];
        const int n = 1 + (int)((x = x * 1103515245u + 12345u) >> 16) % 60;
        const int alpha = 2 + (int)((x = x * 1103515245u + 12345u) >> 16) % 5;
        for (int i = 0; i < n; i++) t[i] = (int32_t)(((x = x * 1103515245u + 12345u) >> 16) % (unsigned)alpha);
        const int lo = 1 + it % 3, hi = lo + it % 4, k = 1 + it % 16;
        const int ra = kaon_spec_ngram_propose(t, n, lo, hi, k, a), rb = brute(t, n, lo, hi, k, b);
        CHECK(ra == rb);
        if (ra == rb && ra > 0) CHECK(!memcmp(a, b, sizeof(int32_t) * (size_t)ra));
        proposed += ra > 0;
    }
    CHECK(proposed > 10000);

    // Settings: defaults, and each refusal.
    kaon_spec_config c;
    kaon_speculative_options o = {0};
    CHECK(kaon_spec_config_resolve(&o, &c) == 0 && c.method == KAON_SPEC_OFF);
    o = (kaon_speculative_options){.method = "ngram", .num_speculative_tokens = 3};
    CHECK(kaon_spec_config_resolve(&o, &c) == 0 && c.method == KAON_SPEC_NGRAM && c.k == 3 && c.ngram_min == 2 &&
          c.ngram_max == 4 && c.disable_at == 32);
    o.disable_by_batch_size = -1;
    CHECK(kaon_spec_config_resolve(&o, &c) == 0 && c.disable_at == 0);
    o.prompt_lookup_min = 6;  // above the default max: max follows
    CHECK(kaon_spec_config_resolve(&o, &c) == 0 && c.ngram_max == 6);
    o.prompt_lookup_max = 5;
    CHECK(kaon_spec_config_resolve(&o, &c) != 0);
    o = (kaon_speculative_options){.method = "ngram", .num_speculative_tokens = KAON_SPEC_MAX_TOKENS + 1};
    CHECK(kaon_spec_config_resolve(&o, &c) != 0);
    o = (kaon_speculative_options){.method = "medusa", .num_speculative_tokens = 2};
    CHECK(kaon_spec_config_resolve(&o, &c) != 0);

    // Speculative sampling: random target and draft logits over 8 tokens, under temperature,
    // top-k, top-p and min-p applied to both; and the two one-hot cases (a deterministic
    // proposer: q one-hot; greedy: p one-hot).
    const float lp[8] = {1.2f, -0.3f, 0.4f, 2.0f, -1.5f, 0.9f, 0.0f, -0.7f};
    const float lq[8] = {0.1f, 0.8f, 0.4f, 1.1f, -0.5f, 1.9f, -1.0f, 0.3f};
    const struct { float t; int k; float top_p, min_p; } cases[] = {
        {1.0f, 0, 1.0f, 0.0f}, {0.6f, 0, 1.0f, 0.0f}, {1.5f, 4, 1.0f, 0.0f},
        {1.0f, 0, 0.8f, 0.0f}, {0.9f, 5, 0.9f, 0.0f}, {1.2f, 0, 1.0f, 0.15f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kaon_sampling sp;
        kaon_sampling_default(&sp);
        sp.temperature = cases[i].t;
        sp.top_k = cases[i].k;
        sp.top_p = cases[i].top_p;
        sp.min_p = cases[i].min_p;
        check_spec_sampling(lp, lq, 8, &sp, 1000u + (unsigned)i);
    }
    {
        kaon_sampling sp;
        kaon_sampling_default(&sp);
        float onehot[8];  // q one-hot on token 6 (the deterministic proposer's draft)
        for (int i = 0; i < 8; i++) onehot[i] = i == 6 ? 0.0f : -1e30f;
        sp.temperature = 1.0f;
        check_spec_sampling(lp, onehot, 8, &sp, 77u);
        sp.temperature = 0.0f;  // greedy: p and q one-hot, kept iff x is p's argmax
        check_spec_sampling(lp, lq, 8, &sp, 78u);
        check_spec_sampling(lp, lp, 8, &sp, 79u);
    }
    TEST_MAIN_END();
}
