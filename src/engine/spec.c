// Speculative decoding: settings and the n-gram (prompt lookup) proposer.
#include "engine/spec.h"

#include <string.h>

#include "util/err.h"

int kaon_spec_config_resolve(const kaon_speculative_options *o, kaon_spec_config *c) {
    memset(c, 0, sizeof *c);
    if (!o->method || !o->method[0]) return 0;
    if (!strcmp(o->method, "ngram")) c->method = KAON_SPEC_NGRAM;
    else if (!strcmp(o->method, "oracle")) c->method = KAON_SPEC_ORACLE;
    else if (!strcmp(o->method, "mtp") || !strcmp(o->method, "deepseek_mtp")) c->method = KAON_SPEC_MTP;
    else if (!strcmp(o->method, "eagle3")) c->method = KAON_SPEC_EAGLE3;
    else if (!strcmp(o->method, "eagle"))  // EAGLE-1/2 heads regress features, not the same step
        return kaon_set_error("speculative decoding: method 'eagle' (EAGLE-1/2 heads) is not supported; kaon runs "
                              "EAGLE-3 heads (method eagle3)");
    else return kaon_set_error("speculative decoding: unknown method '%s' (kaon has: ngram, mtp, eagle3, oracle)", o->method);
    if (c->method == KAON_SPEC_EAGLE3 && (!o->model || !o->model[0]))
        return kaon_set_error("speculative decoding: method eagle3 needs \"model\", the EAGLE-3 head's folder");
    c->force_accept = o->force_accept;
    if (o->num_speculative_tokens < 1 || o->num_speculative_tokens > KAON_SPEC_MAX_TOKENS)
        return kaon_set_error("speculative decoding: num_speculative_tokens must be in [1, %d], got %d",
                              KAON_SPEC_MAX_TOKENS, o->num_speculative_tokens);
    c->k = o->num_speculative_tokens;
    c->ngram_min = o->prompt_lookup_min ? o->prompt_lookup_min : 2;
    c->ngram_max = o->prompt_lookup_max ? o->prompt_lookup_max : 4;
    if (c->ngram_max < c->ngram_min && !o->prompt_lookup_max) c->ngram_max = c->ngram_min;
    if (c->ngram_min < 1 || c->ngram_max < c->ngram_min || c->ngram_max > 64)
        return kaon_set_error("speculative decoding: need 1 <= prompt_lookup_min (%d) <= prompt_lookup_max (%d) <= 64",
                              c->ngram_min, c->ngram_max);
    if (o->disable_by_batch_size < -1)
        return kaon_set_error("speculative decoding: disable_by_batch_size must be >= 1 (or -1: never), got %d",
                              o->disable_by_batch_size);
    c->disable_at = o->disable_by_batch_size == 0 ? 32 : o->disable_by_batch_size < 0 ? 0 : o->disable_by_batch_size;
    if (c->method == KAON_SPEC_ORACLE) return kaon_spec_oracle_attach(c, o->oracle_file);
    if (o->oracle_file) return kaon_set_error("speculative decoding: oracle_file is for method oracle");
    return 0;
}

int kaon_spec_ngram_propose(const int32_t *toks, int n, int min_n, int max_n, int k, int32_t *out) {
    if (k <= 0) return 0;
    for (int g = max_n < n - 1 ? max_n : n - 1; g >= min_n; g--) {
        const int32_t *suffix = toks + n - g;
        // The latest start i < n - g whose g tokens equal the suffix; what followed it is
        // toks[i + g ..], at least one token since i + g < n. Past the end the copy goes on
        // through its own drafts (a loop of period n - i - g repeats), so a repeating tail
        // yields k drafts however short its period.
        for (int i = n - g - 1; i >= 0; i--) {
            if (toks[i + g - 1] != suffix[g - 1] || memcmp(toks + i, suffix, sizeof(int32_t) * (size_t)g)) continue;
            const int from = i + g;
            for (int j = 0; j < k; j++) out[j] = from + j < n ? toks[from + j] : out[from + j - n];
            return k;
        }
    }
    return 0;
}
