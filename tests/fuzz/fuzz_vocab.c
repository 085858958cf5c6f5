// libFuzzer target: kaon_tokenizer_from_hf_json on arbitrary bytes. Input layout: the
// tokenizer.json text, optionally followed by a NUL byte and a tokenizer_config.json text.
// Inputs that start with "GGUF" go through kaon_gguf_open_memory + kaon_tokenizer_from_gguf
// instead. When a tokenizer loads, it must also encode and decode without crashing.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    const char *nul = memchr(s, 0, size);
    size_t tl = nul ? (size_t)(nul - s) : size;
    const char *cfg = nul ? nul + 1 : NULL;
    size_t cl = nul ? size - tl - 1 : 0;
    kaon_gguf *g = NULL;
    kaon_tokenizer *t;
    if (size >= 4 && !memcmp(data, "GGUF", 4)) {
        g = kaon_gguf_open_memory(data, size);
        t = g ? kaon_tokenizer_from_gguf(g) : NULL;
    } else {
        t = kaon_tokenizer_from_hf_json(s, tl, cfg, cl);
    }
    if (!t) {
        kaon_gguf_close(g);
        return 0;
    }
    static const char text[] = "Hello <s> world 123  \xE4\xB8\xAD\xF0\x9F\x98\x80\n\xFF";
    int32_t *ids;
    size_t n;
    if (kaon_tokenize(t, text, sizeof text - 1, true, &ids, &n) == 0) {
        char *dec;
        size_t dl;
        if (kaon_detokenize(t, ids, n, false, &dec, &dl) == 0) free(dec);
        free(ids);
    }
    // Decode every id once (covers the decoded forms of all tokens).
    int nv = kaon_tokenizer_vocab_size(t);
    kaon_detok *d = kaon_detok_new(t, true);
    for (int i = 0; i < nv && i < 4096 && d; i++) {
        char *p;
        size_t pl;
        if (kaon_detok_push(d, i, &p, &pl) >= 0) free(p);
    }
    if (d) {
        char *p;
        size_t pl;
        if (kaon_detok_flush(d, &p, &pl) >= 0) free(p);
    }
    kaon_detok_free(d);
    (void)kaon_tokenizer_bos_text(t);
    (void)kaon_tokenizer_eos_text(t);
    kaon_tokenizer_free(t);
    kaon_gguf_close(g);
    return 0;
}
