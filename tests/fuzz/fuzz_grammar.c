// libFuzzer target: kaon_grammar_parse on arbitrary bytes. A grammar that parses is then
// run: the input's bytes fed as tokens, masks over a small byte vocabulary, rollbacks.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static kaon_grammar_vocab *byte_vocab(void) {
    static const char *extra[] = {"<eos>", "{\"", "\":", "true", "ab", "\xc3\xa9", "\xe4\xb8", "\xad"};
    enum { N = 256 + 8 };
    const char *bytes[N];
    size_t lens[N];
    bool special[N] = {0};
    static char singles[256];
    for (int i = 0; i < 256; i++) {
        singles[i] = (char)i;
        bytes[i] = &singles[i];
        lens[i] = 1;
    }
    for (int i = 0; i < 8; i++) {
        bytes[256 + i] = extra[i];
        lens[256 + i] = strlen(extra[i]);
    }
    special[256] = true;
    int32_t eog = 256;
    return kaon_grammar_vocab_new(N, bytes, lens, special, &eog, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kaon_grammar_vocab *vocab;
    if (!vocab) vocab = byte_vocab();
    kaon_grammar *g = kaon_grammar_parse((const char *)data, size, NULL);
    if (!g) return 0;
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    kaon_grammar_masker *mk = vocab ? kaon_grammar_masker_new(g, vocab) : NULL;
    uint32_t mask[(256 + 8 + 31) / 32];
    if (m && mk) {
        for (size_t i = 0; i < size && i < 16; i++) {
            if (kaon_grammar_fill_mask(mk, m, mask)) break;
            // the first allowed token at or after the input byte
            int pick = -1;
            for (int k = 0; k < 256 + 8 && pick < 0; k++) {
                int id = (data[i] + k) % (256 + 8);
                if (mask[id >> 5] >> (id & 31) & 1) pick = id;
            }
            if (pick < 0 || !kaon_grammar_matcher_accept_token(m, vocab, pick)) break;
            if (data[i] % 7 == 0) kaon_grammar_matcher_rollback(m, 1);
        }
        (void)kaon_grammar_matcher_can_end(m);
        kaon_grammar_matcher_reset(m);
        (void)kaon_grammar_matcher_accept_bytes(m, data, size < 256 ? size : 256);
    }
    kaon_grammar_masker_free(mk);
    kaon_grammar_matcher_free(m);
    kaon_grammar_free(g);
    return 0;
}
