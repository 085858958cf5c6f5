// libFuzzer target: kaon_regex_to_gbnf on arbitrary bytes. The first byte picks the mode
// (raw or JSON string) and how the rest splits into a pattern and a text; a pattern that
// converts must give a grammar that parses (the converter only writes GBNF the parser
// takes, within its limits), and the text is then fed to a matcher, whole and byte by byte,
// which must agree.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex_gbnf.h"
#include "util/err.h"

static bool run(const kaon_grammar *g, const uint8_t *s, size_t n, bool bytewise) {
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    if (!m) return false;
    bool ok = true;
    if (bytewise) {
        for (size_t i = 0; i < n && ok; i++) ok = kaon_grammar_matcher_accept_bytes(m, s + i, 1);
    } else {
        ok = kaon_grammar_matcher_accept_bytes(m, s, n);
    }
    ok = ok && kaon_grammar_matcher_can_end(m);
    kaon_grammar_matcher_free(m);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool json = data[0] & 1;
    size_t text_len = (data[0] >> 1) % 16;  // the last bytes are the text to match
    data++, size--;
    if (text_len > size) text_len = size;
    size_t re_len = size - text_len;
    gbnf_text t = {0};
    if (kaon_regex_to_gbnf((const char *)data, re_len, "root", json, &t) == 0) {
        kaon_grammar *g = kaon_grammar_parse(t.s, t.len, NULL);
        if (!g) {
            // a work or size limit of the grammar engine is fine; a syntax error is a bug
            const char *e = kaon_last_error();
            if (!strstr(e, "too large") && !strstr(e, "too many") &&
                !strstr(e, "out of memory")) {
                fprintf(stderr, "converted grammar fails to parse: %s\n%s\n", e, t.s);
                abort();
            }
        } else {
            const uint8_t *text = data + re_len;
            bool whole = run(g, text, text_len, false), bytes = run(g, text, text_len, true);
            if (whole != bytes) {
                fprintf(stderr, "matcher disagrees whole/bytewise on %s\n", t.s);
                abort();
            }
            kaon_grammar_free(g);
        }
    }
    gbnf_text_free(&t);
    return 0;
}
