// libFuzzer target: JSON Schema text -> GBNF -> kaon_grammar_parse -> a few matcher steps. The
// converter must never crash on hostile schemas, and whatever it emits must parse (a grammar it
// writes that the engine refuses is a converter bug, except for the engine's own size limits).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "util/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    kaon_json_schema_opts opts = {.strict = data[0] & 1, .any_whitespace = (data[0] >> 1) & 1};
    const char *schema = (const char *)data + 1;
    gbnf_text t = {0};
    if (kaon_json_schema_to_gbnf(schema, size - 1, "root", &opts, &t) == 0) {
        kaon_grammar *g = kaon_grammar_parse(t.s, t.len, "root");
        if (!g) {
            const char *e = kaon_last_error();
            // the engine's size limits may refuse a big grammar; anything else is a converter bug
            if (!strstr(e, "too many rules") && !strstr(e, "grammar too large")) {
                fprintf(stderr, "converter output does not parse: %s\n%s\n", e, t.s);
                abort();
            }
        } else {
            kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
            static const char *steps[] = {"{", "\"", "a", "\"", ":", " ", "1", ",", "[", "]", "}", "null"};
            for (size_t i = 0; m && i < sizeof steps / sizeof steps[0]; i++) {
                if (!kaon_grammar_matcher_accept_bytes(m, steps[i], strlen(steps[i]))) continue;
                (void)kaon_grammar_matcher_can_end(m);
            }
            kaon_grammar_matcher_free(m);
            kaon_grammar_free(g);
        }
    }
    gbnf_text_free(&t);
    return 0;
}
