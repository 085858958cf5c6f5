// Test driver for the JSON Schema converter (used by tests/ref/test_json_schema_gbnf.py):
//   json_schema_check gbnf  SCHEMA_FILE [--strict] [--any-ws]      the grammar
//   json_schema_check gen   SCHEMA_FILE N SEED [--strict] [--any-ws]  N random texts the grammar
//                                                                   accepts, one per line
//   json_schema_check check SCHEMA_FILE [--strict] [--any-ws]      stdin lines -> 1/0 each
// Exit status 2 (message on stderr) when the schema does not convert or the grammar does not parse.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "util/err.h"

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *p = malloc(cap);
    for (;;) {
        if (n + 4096 > cap) p = realloc(p, cap *= 2);
        size_t got = fread(p + n, 1, 4096, f);
        n += got;
        if (got == 0) break;
    }
    p[n] = 0;
    *len = n;
    return p;
}

static uint64_t rng_state;
static uint32_t rnd(void) {  // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}

enum { MAX_TEXT = 4000, N_CAND = 95 + 2 };

// One random text: at each step candidate pieces in random order (closing bytes first once the
// text is long), stopping with probability 1/2 wherever the grammar can end.
static bool walk(kaon_grammar_matcher *m, char *text, size_t *len) {
    static const char *cand[N_CAND];
    static char ascii[95][2];
    for (int i = 0; i < 95; i++) {
        ascii[i][0] = (char)(0x20 + i);
        cand[i] = ascii[i];
    }
    cand[95] = "\xc3\xa9";      // é
    cand[96] = "\xe4\xb8\xad";  // 中
    kaon_grammar_matcher_reset(m);
    size_t n = 0;
    for (;;) {
        if (kaon_grammar_matcher_can_end(m) && (rnd() & 1 || !kaon_grammar_matcher_can_continue(m))) break;
        if (n + 8 > MAX_TEXT) return false;
        int order[N_CAND];
        for (int i = 0; i < N_CAND; i++) order[i] = i;
        for (int i = N_CAND - 1; i > 0; i--) {
            int j = (int)(rnd() % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        if (n > 200) {  // steer long texts towards their end: closing bytes first
            static const char closers[] = "0]}\"";
            for (int k = 0; k < 4; k++) {
                int id = closers[k] - 0x20;
                for (int i = 0; i < N_CAND; i++)
                    if (order[i] == id) order[i] = order[0];
                order[0] = id;
            }
        }
        bool moved = false;
        for (int i = 0; i < N_CAND && !moved; i++) {
            const char *c = cand[order[i]];
            size_t cl = strlen(c);
            if (kaon_grammar_matcher_accept_bytes(m, c, cl)) {
                memcpy(text + n, c, cl);
                n += cl;
                moved = true;
            }
        }
        if (!moved) {
            if (kaon_grammar_matcher_can_end(m)) break;
            return false;  // a dead end for these candidates (e.g. a pattern needing other bytes)
        }
    }
    text[n] = 0;
    *len = n;
    return true;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s gbnf|gen|check SCHEMA_FILE [N SEED] [--strict] [--any-ws]\n", argv[0]);
        return 2;
    }
    kaon_json_schema_opts opts = {0};
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--strict")) opts.strict = true;
        if (!strcmp(argv[i], "--any-ws")) opts.any_whitespace = true;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", argv[2]);
        return 2;
    }
    size_t slen;
    char *schema = read_all(f, &slen);
    fclose(f);
    gbnf_text g = {0};
    int conv_rc = kaon_json_schema_to_gbnf(schema, slen, "root", &opts, &g);
    free(schema);
    if (conv_rc) {
        fprintf(stderr, "convert: %s\n", kaon_last_error());
        gbnf_text_free(&g);
        return 2;
    }
    if (!strcmp(argv[1], "gbnf")) {
        fputs(g.s, stdout);
        gbnf_text_free(&g);
        return 0;
    }
    kaon_grammar *gr = kaon_grammar_parse(g.s, g.len, "root");
    if (!gr) {
        fprintf(stderr, "parse: %s\n%s", kaon_last_error(), g.s);
        gbnf_text_free(&g);
        return 2;
    }
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(gr);
    int rc = 0;
    if (!strcmp(argv[1], "gen") && argc >= 5) {
        int n = atoi(argv[3]);
        rng_state = strtoull(argv[4], NULL, 10) * 0x9E3779B97F4A7C15ULL + 1;
        static char text[MAX_TEXT + 8];
        int made = 0;
        for (int tries = 0; made < n && tries < n * 20; tries++) {
            size_t len;
            if (!walk(m, text, &len)) continue;
            puts(text);
            made++;
        }
        if (made < n) {
            fprintf(stderr, "gen: only %d of %d walks finished\n", made, n);
            rc = 1;
        }
    } else if (!strcmp(argv[1], "check")) {
        size_t len;
        char *in = read_all(stdin, &len);
        for (char *line = in, *next; line < in + len; line = next) {
            char *nl = memchr(line, '\n', (size_t)(in + len - line));
            next = nl ? nl + 1 : in + len;
            size_t ll = (size_t)((nl ? nl : in + len) - line);
            kaon_grammar_matcher_reset(m);
            bool ok = kaon_grammar_matcher_accept_bytes(m, line, ll) && kaon_grammar_matcher_can_end(m);
            puts(ok ? "1" : "0");
        }
        free(in);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        rc = 2;
    }
    kaon_grammar_matcher_free(m);
    kaon_grammar_free(gr);
    gbnf_text_free(&g);
    return rc;
}
