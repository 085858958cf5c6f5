// A grammar vocabulary from a loaded tokenizer: the bytes each token decodes to.
#include <stdlib.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

kaon_grammar_vocab *kaon_grammar_vocab_from_tokenizer(const kaon_tokenizer *t) {
    int n = kaon_tokenizer_vocab_size(t);
    if (n <= 0) {
        kaon_set_error("grammar vocab: empty tokenizer");
        return NULL;
    }
    const char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    bool *special = calloc((size_t)n, sizeof *special);
    int32_t *eog = malloc((size_t)n * sizeof *eog);
    kaon_grammar_vocab *v = NULL;
    if (!bytes || !lens || !special || !eog) {
        kaon_set_error("grammar vocab: out of memory");
        goto out;
    }
    int n_eog = 0;
    for (int i = 0; i < n; i++) {
        bytes[i] = kaon_tokenizer_token_text(t, i, &lens[i]);
        if (!bytes[i]) lens[i] = 0;
        special[i] = kaon_tokenizer_is_special(t, i);
        if (kaon_tokenizer_is_eog(t, i)) eog[n_eog++] = i;
    }
    v = kaon_grammar_vocab_new(n, bytes, lens, special, eog, n_eog);
out:
    free(bytes);
    free(lens);
    free(special);
    free(eog);
    return v;
}
