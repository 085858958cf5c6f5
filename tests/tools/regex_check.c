// regex_check PATTERN (raw|json) [--gbnf]: converts PATTERN with kaon_regex_to_gbnf, then reads
// candidates from stdin, one per line as hex bytes (so any byte can be sent), and prints 1 or
// 0 per line: does the grammar accept the whole candidate? Exit 2 with the error when the
// pattern is refused. Driven by tests/ref/test_regex_gbnf.py against Python's re.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex_gbnf.h"
#include "util/err.h"

static int hex(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "raw") && strcmp(argv[2], "json"))) {
        fprintf(stderr, "usage: %s PATTERN (raw|json) [--gbnf]\n", argv[0]);
        return 1;
    }
    gbnf_text t = {0};
    if (kaon_regex_to_gbnf(argv[1], strlen(argv[1]), "root", !strcmp(argv[2], "json"), &t)) {
        printf("error: %s\n", kaon_last_error());
        gbnf_text_free(&t);
        return 2;
    }
    if (argc > 3 && !strcmp(argv[3], "--gbnf")) fputs(t.s, stderr);
    kaon_grammar *g = kaon_grammar_parse(t.s, t.len, NULL);
    if (!g) {
        printf("grammar error: %s\n%s", kaon_last_error(), t.s);
        gbnf_text_free(&t);
        return 3;
    }
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    char line[65536];
    unsigned char buf[sizeof line / 2];
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        for (char *q = line; hex(q[0]) >= 0 && hex(q[1]) >= 0; q += 2) buf[n++] = (unsigned char)(hex(q[0]) << 4 | hex(q[1]));
        kaon_grammar_matcher_reset(m);
        bool ok = kaon_grammar_matcher_accept_bytes(m, buf, n) && kaon_grammar_matcher_can_end(m);
        printf("%d\n", ok);
    }
    kaon_grammar_matcher_free(m);
    kaon_grammar_free(g);
    gbnf_text_free(&t);
    return 0;
}
