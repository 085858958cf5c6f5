// Speculative decoding's n-gram proposer and settings (src/engine/spec.c), against a brute
// force written here.
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
    TEST_MAIN_END();
}
