// kaon tokenize / kaon detokenize: the model's tokenizer from the command line.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

// Loads only the tokenizer: a GGUF file's metadata (its tensors are not read, so a file with
// tensors of a type kaon cannot compute with still tokenizes) or a HF folder's tokenizer.json.
static kaon_tokenizer *load(const char *path, kaon_gguf **g) {
    *g = NULL;
    if (!path) path = kaon_cli_default_model();
    if (!path) {
        kaon_cli_fail("no model given (-m) and the default model is missing");
        return NULL;
    }
    kaon_tokenizer *t;
    if (kaon_cli_is_gguf(path)) {
        *g = kaon_gguf_open_metadata(path);
        t = *g ? kaon_tokenizer_from_gguf(*g) : NULL;
    } else {
        t = kaon_tokenizer_from_hf_dir(path);
    }
    if (!t) kaon_cli_fail("%s", kaon_last_error());
    return t;
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            cap *= 2;
            char *b = realloc(buf, cap);
            if (!b) { free(buf); return NULL; }
            buf = b;
        }
    }
    *len = n;
    return buf;
}

int kaon_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool special = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kaon tokenize [-m MODEL] [--text TEXT] [--no-special]   (text from stdin without --text)\n"
                   "prints the ids as one JSON list; --no-special: no BOS/EOS added\n");
            return 0;
        }
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(argv[i], "--no-special")) special = false;
        else return kaon_cli_fail("unknown option '%s'", argv[i]);
    }
    kaon_gguf *g;
    kaon_tokenizer *t = load(model, &g);
    if (!t) return 2;
    size_t len = 0;
    char *owned = NULL;
    if (text) len = strlen(text);
    else text = owned = read_all(stdin, &len);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (!text || kaon_tokenize(t, text, len, special, &ids, &n)) rc = kaon_cli_fail("%s", kaon_last_error());
    else {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
    }
    free(ids);
    free(owned);
    kaon_tokenizer_free(t);
    if (g) kaon_gguf_close(g);
    return rc;
}

int kaon_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL;
    bool skip = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kaon detokenize [-m MODEL] [--ids 1,2,3] [--skip-special]   (ids from stdin, JSON list or commas)\n");
            return 0;
        }
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_arg = argv[++i];
        else if (!strcmp(argv[i], "--skip-special")) skip = true;
        else return kaon_cli_fail("unknown option '%s'", argv[i]);
    }
    size_t len;
    char *owned = NULL;
    if (!ids_arg) {
        ids_arg = owned = read_all(stdin, &len);
        if (owned) owned[len < 1 ? 0 : len - (owned[len - 1] == '\n')] = 0;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (!ids_arg || kaon_cli_parse_ids(ids_arg, &ids, &n)) {
        free(owned);
        return kaon_cli_fail("ids must be a list of non-negative integers");
    }
    kaon_gguf *g;
    kaon_tokenizer *t = load(model, &g);
    int rc = 0;
    if (!t) rc = 2;
    else {
        for (int i = 0; i < n && !rc; i++)
            if (ids[i] >= kaon_tokenizer_vocab_size(t)) rc = kaon_cli_fail("id %d is outside the vocabulary", ids[i]);
        char *text = NULL;
        size_t tl = 0;
        if (!rc && kaon_detokenize(t, ids, (size_t)n, skip, &text, &tl)) rc = kaon_cli_fail("%s", kaon_last_error());
        else if (!rc) { fwrite(text, 1, tl, stdout); putchar('\n'); }
        free(text);
        kaon_tokenizer_free(t);
    }
    if (g) kaon_gguf_close(g);
    free(ids);
    free(owned);
    return rc;
}
