// libFuzzer target: encode arbitrary bytes with the fixture tokenizers (loaded once), decode
// the ids one-shot and incrementally, and check the two decodes agree and are valid UTF-8.
// The first input byte picks the tokenizer; the rest is the text. Arbitrary ids (the input
// read as int32) are decoded too.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#define N_TOK 5
static kaon_tokenizer *toks[N_TOK];
static kaon_gguf *gg;

static void load_all(void) {
    // The repository root, from this file's path (CMake passes sources by absolute path).
    char root[4096];
    snprintf(root, sizeof root, "%s", __FILE__);
    char *cut = strstr(root, "tests/fuzz/fuzz_encode.c");
    if (cut) *cut = 0;
    else snprintf(root, sizeof root, "./");
    const char *dirs[] = {"llama3", "qwen2", "spm", "spm_metaspace"};
    char path[4200];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%stests/fixtures/tokenizers/%s", root, dirs[i]);
        toks[i] = kaon_tokenizer_from_hf_dir(path);
        if (!toks[i]) { fprintf(stderr, "fuzz_encode: %s: %s\n", path, kaon_last_error()); abort(); }
    }
    snprintf(path, sizeof path, "%stests/fixtures/tokenizers/spm/tokenizer.gguf", root);
    gg = kaon_gguf_open(path);
    toks[4] = gg ? kaon_tokenizer_from_gguf(gg) : NULL;
    if (!toks[4]) { fprintf(stderr, "fuzz_encode: %s: %s\n", path, kaon_last_error()); abort(); }
}

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++) if (((unsigned char)s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

static void check_decode(const kaon_tokenizer *t, const int32_t *ids, size_t n, int skip) {
    char *dec;
    size_t dl;
    if (kaon_detokenize(t, ids, n, skip, &dec, &dl) != 0) abort();
    if (!valid_utf8(dec, dl) || strlen(dec) > dl) abort();
    kaon_detok *d = kaon_detok_new(t, skip);
    if (!d) abort();
    char *acc = malloc(dl + 1);
    size_t al = 0;
    for (size_t i = 0; i <= n; i++) {
        char *p;
        size_t pl;
        int rc = i < n ? kaon_detok_push(d, ids[i], &p, &pl) : kaon_detok_flush(d, &p, &pl);
        if (rc < 0 || !valid_utf8(p, pl) || al + pl > dl) abort();
        memcpy(acc + al, p, pl);
        al += pl;
        free(p);
    }
    if (al != dl || memcmp(acc, dec, dl)) abort();  // streaming must equal one-shot
    free(acc);
    free(dec);
    kaon_detok_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!toks[0]) load_all();
    if (size == 0) return 0;
    const kaon_tokenizer *t = toks[data[0] % N_TOK];
    int32_t *ids;
    size_t n;
    if (kaon_tokenize(t, (const char *)data + 1, size - 1, (data[0] >> 4) & 1, &ids, &n) != 0) abort();
    int nv = kaon_tokenizer_vocab_size(t);
    for (size_t i = 0; i < n; i++) if (ids[i] < 0 || ids[i] >= nv) abort();
    check_decode(t, ids, n, 0);
    check_decode(t, ids, n, 1);
    free(ids);
    // Arbitrary ids, in range or not.
    size_t m = (size - 1) / 4;
    int32_t *raw = malloc((m + 1) * sizeof *raw);
    memcpy(raw, data + 1, m * 4);
    for (size_t i = 0; i < m; i++) if (data[0] & 0x80) raw[i] = (int32_t)((uint32_t)raw[i] % (uint32_t)(nv + 8));
    check_decode(t, raw, m, (data[0] >> 5) & 1);
    free(raw);
    return 0;
}
