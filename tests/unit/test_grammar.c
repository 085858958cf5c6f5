// The grammar engine: GBNF parse errors, strings accepted and rejected, rollback, and token
// masks checked against brute force (every token tried on the matcher) on a synthetic
// vocabulary and on SmolLM2's (skipped when the model file is absent), plus random walks
// that sample from the masks and must end in text the grammar accepts.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "test.h"

static const char *JSON_GBNF =
    "# JSON values\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,16})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *ARITH_GBNF =
    "root ::= expr\n"
    "expr ::= term ((\"+\" | \"-\") term)*\n"
    "term ::= factor ((\"*\" | \"/\") factor)*\n"
    "factor ::= number | \"(\" expr \")\"\n"
    "number ::= [0-9]+\n";

static kaon_grammar *parse(const char *text) {
    kaon_grammar *g = kaon_grammar_parse(text, strlen(text), NULL);
    if (!g) fprintf(stderr, "parse failed: %s\n", kaon_last_error());
    return g;
}

// Whole string as one step, and again byte by byte: both must agree.
static bool accepts(const kaon_grammar *g, const char *s, size_t n) {
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    bool whole = kaon_grammar_matcher_accept_bytes(m, s, n) && kaon_grammar_matcher_can_end(m);
    kaon_grammar_matcher_reset(m);
    bool bytes = true;
    for (size_t i = 0; i < n && bytes; i++) bytes = kaon_grammar_matcher_accept_bytes(m, s + i, 1);
    bytes = bytes && kaon_grammar_matcher_can_end(m);
    CHECK(whole == bytes);
    kaon_grammar_matcher_free(m);
    return whole;
}

static void check_strings(const char *gbnf, const char *const *good, const char *const *bad) {
    kaon_grammar *g = parse(gbnf);
    CHECK(g != NULL);
    if (!g) return;
    for (int i = 0; good[i]; i++) {
        bool ok = accepts(g, good[i], strlen(good[i]));
        if (!ok) fprintf(stderr, "should accept: %s\n", good[i]);
        CHECK(ok);
    }
    for (int i = 0; bad[i]; i++) {
        bool ok = accepts(g, bad[i], strlen(bad[i]));
        if (ok) fprintf(stderr, "should reject: %s\n", bad[i]);
        CHECK(!ok);
    }
    kaon_grammar_free(g);
}

static void test_parse_errors(void) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"", "empty"},
        {"root ::= \"abc", "line 1 col 14: unterminated string"},
        {"root ::= [a-z", "unterminated character class"},
        {"root ::= foo", "undefined rule 'foo'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2 col 1: rule defined twice"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root ::= \"a\")", "unmatched ')'"},
        {"root ::= \"a\"{3,2}", "n < m"},
        {"root ::= \"a\"{99999}", "too large"},
        {"root ::= [z-a]", "reversed"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root = \"a\"", "expected '::='"},
        {"start ::= \"a\"", "no rule named 'root'"},
        {"root ::= root \"a\" | \"b\"", "left recursion through rule 'root'"},
        {"root ::= (\"\")*", "left recursion"},
        {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left recursion"},
        {"root ::= \"\\xZZ\"", "bad hex digit"},
        {"root ::= \"\\U00110000\"", "above U+10FFFF"},
        {"root ::= | ^", "expected a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kaon_grammar *g = kaon_grammar_parse(cases[i].text, strlen(cases[i].text), NULL);
        CHECK(g == NULL);
        const char *e = kaon_last_error();
        if (!strstr(e, cases[i].want)) fprintf(stderr, "case %zu: error '%s', want '%s'\n", i, e, cases[i].want);
        CHECK(strstr(e, cases[i].want) != NULL);
        kaon_grammar_free(g);
    }
    // nesting limit
    char deep[400];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int i = 0; i < 100; i++) deep[k++] = '(';
    deep[k] = 0;
    CHECK(kaon_grammar_parse(deep, k, NULL) == NULL);
    CHECK(strstr(kaon_last_error(), "nested too deeply") != NULL);
    // a grammar with named root
    kaon_grammar *g = kaon_grammar_parse("start ::= \"a\"", 13, "start");
    CHECK(g != NULL);
    kaon_grammar_free(g);
}

static void test_strings(void) {
    const char *json_good[] = {"{}", "{\"a\":1}", "{ \"a\": [1, 2.5, -3e10, true, null], \"b\": {\"c\": \"x\\ny\\u00e9\"}}",
                               "{\"k\":\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\"}\n  ", "{\"a\":[]}", NULL};
    const char *json_bad[] = {"", "{", "{\"a\"}", "{\"a\":01}", "{\"a\":tru}", "[1]", "{\"a\":\"\x01\"}",
                              "{\"a\":\"\\x\"}", "{\"a\":1,}", "{\"k\":\"\xc3\"}", "{\"k\":\"\xed\xa0\x80\"}", NULL};
    check_strings(JSON_GBNF, json_good, json_bad);
    const char *ar_good[] = {"1", "1+2*3", "(1+2)*3/44-5", "((7))", NULL};
    const char *ar_bad[] = {"", "1+", "(1", "1)", "a", "1 + 2", NULL};
    check_strings(ARITH_GBNF, ar_good, ar_bad);
    const char *rep = "root ::= \"a\"{2,4} \"b\"{3} (\"cd\"){2,} x? y{0,2} \"!\"+\n x ::= \"x\"\n y ::= [0-9]\n";
    const char *rep_good[] = {"aabbbcdcd!", "aaaabbbcdcdcdx12!!", "aaabbbcdcdcdcdcd7!", NULL};
    const char *rep_bad[] = {"abbbcdcd!", "aaaaabbbcdcd!", "aabbcdcd!", "aabbbcd!", "aabbbcdcd123!", "aabbbcdcdc!", "aabbbcdcd", NULL};
    check_strings(rep, rep_good, rep_bad);
    // classes on code points; negation, '.', escapes, UTF-8 in literals
    const char *cls = "root ::= [α-ω]+ \"é\" [^a-z\\u4e00] . [\\x41-\\x43\\n] \"\\U0001F600\"  # comment\n";
    const char *cls_good[] = {"αβωéZ\xe4\xb8\xad" "A\xf0\x9f\x98\x80", "λé中中\n\xf0\x9f\x98\x80", "λé!!C\xf0\x9f\x98\x80", NULL};
    const char *cls_bad[] = {"aé!!A\xf0\x9f\x98\x80", "λéa!A\xf0\x9f\x98\x80", "λé\xe4\xb8\x80!A\xf0\x9f\x98\x80",
                             "λé!!D\xf0\x9f\x98\x80", "λe!!A\xf0\x9f\x98\x80", "λé!\xff" "A\xf0\x9f\x98\x80",
                             "\xce\xbb\xc3\xa9!!A\xf0\x9f\x98", NULL};
    check_strings(cls, cls_good, cls_bad);
    // multi-line alternatives, names with - and _, comments between rules
    const char *ml = "root ::= greet-ing \" \" who_\n  | \"bye\" # after\n# a comment line\ngreet-ing ::= \"hi\"\n  | \"hello\"\nwho_ ::= [a-z]+\n";
    const char *ml_good[] = {"hi bob", "hello x", "bye", NULL};
    const char *ml_bad[] = {"hi", "hey bob", "bye ", NULL};
    check_strings(ml, ml_good, ml_bad);
}

static void test_matcher_state(void) {
    kaon_grammar *g = parse("root ::= \"ab\" \"c\"?");
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    CHECK(!kaon_grammar_matcher_can_end(m) && kaon_grammar_matcher_can_continue(m));
    CHECK(kaon_grammar_matcher_accept_bytes(m, "a", 1));
    CHECK(!kaon_grammar_matcher_accept_bytes(m, "x", 1));  // rejected: state unchanged
    CHECK(kaon_grammar_matcher_steps(m) == 1);
    CHECK(kaon_grammar_matcher_accept_bytes(m, "b", 1));
    CHECK(kaon_grammar_matcher_can_end(m) && kaon_grammar_matcher_can_continue(m));
    CHECK(kaon_grammar_matcher_accept_bytes(m, "c", 1));
    CHECK(kaon_grammar_matcher_can_end(m) && !kaon_grammar_matcher_can_continue(m));
    CHECK(!kaon_grammar_matcher_accept_bytes(m, "c", 1));
    CHECK(kaon_grammar_matcher_rollback(m, 2) == 0);
    CHECK(kaon_grammar_matcher_steps(m) == 1);
    CHECK(!kaon_grammar_matcher_can_end(m));
    CHECK(kaon_grammar_matcher_accept_bytes(m, "bc", 2) && kaon_grammar_matcher_can_end(m));
    CHECK(kaon_grammar_matcher_rollback(m, 3) == -1);
    CHECK(kaon_grammar_matcher_rollback(m, 2) == 0 && kaon_grammar_matcher_steps(m) == 0);
    kaon_grammar_matcher_free(m);
    kaon_grammar_free(g);
}

// ---- masks ----

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

typedef struct {
    int n;
    char **bytes;
    size_t *lens;
    bool *special;
    int32_t eog[4];
    int n_eog;
} test_vocab;

// ids 0 (<eos>, end of generation) and 1 (<s>, special); all 256 single bytes; JSON-ish
// pieces; partial UTF-8; random strings over a JSON alphabet.
static void synthetic_vocab(test_vocab *tv) {
    static const char *pieces[] = {"{\"", "\":", "\": ", "\",", "\"}", "\"},", "true", "false", "null", ", \"",
                                   "}\n", "[{", "}]", "\\u", "\\n", "é", "中", "\xc3", "\xa9", "\xe4\xb8", "\xad\"",
                                   "\xf0\x9f", "\x98\x80", "12", "3.5", "e+", "-0", " {", "\n  ", "name", "\"name\"",
                                   "\": \"", "<s>",
                                   // longer than GRAM_UNITS_BITS code points: counted one by one
                                   "abcdefghijklmnopqrstuvwxyz", "aaaaaaaaaaaaaaaaaaaa\"", "0123456789012345678",
                                   // split characters the walk cache may merge (or not: a class holding
                                   // part of the completions, a surrogate, an overlong form)
                                   "\xc3\xa0", "\xc4\xa0", "\xc4\x81", "a\xc4", "\xed\xa0\x80", "\xe0\x80\x80", "\xed\x9f\xbf",
                                   "\xe4\xa0\x80", "\xe4\x80\x80", "\xc3\x80", "\xc4\x80",
                                   "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", NULL};
    int n_pieces = 0;
    while (pieces[n_pieces]) n_pieces++;
    const char alphabet[] = "{}[]\":, \n-+.eE0123456789abtrulfsnx\\/u\xc3\xa9";
    int n_random = 600;
    tv->n = 2 + 256 + n_pieces + n_random;
    tv->bytes = calloc((size_t)tv->n, sizeof *tv->bytes);
    tv->lens = calloc((size_t)tv->n, sizeof *tv->lens);
    tv->special = calloc((size_t)tv->n, sizeof *tv->special);
    int k = 0;
    tv->bytes[k] = strdup("<eos>"), tv->lens[k] = 5, tv->special[k] = true, k++;
    tv->bytes[k] = strdup("<s>"), tv->lens[k] = 3, tv->special[k] = true, k++;
    for (int b = 0; b < 256; b++) {
        tv->bytes[k] = malloc(1);
        tv->bytes[k][0] = (char)b;
        tv->lens[k++] = 1;
    }
    for (int i = 0; i < n_pieces; i++) tv->bytes[k] = strdup(pieces[i]), tv->lens[k] = strlen(pieces[i]), k++;
    for (int i = 0; i < n_random; i++) {
        size_t len = 2 + rnd() % 6;
        tv->bytes[k] = malloc(len);
        for (size_t j = 0; j < len; j++) tv->bytes[k][j] = alphabet[rnd() % (sizeof alphabet - 1)];
        tv->lens[k++] = len;
    }
    tv->eog[0] = 0;
    tv->n_eog = 1;
}

static void test_vocab_free(test_vocab *tv) {
    for (int i = 0; i < tv->n; i++) free(tv->bytes[i]);
    free(tv->bytes);
    free(tv->lens);
    free(tv->special);
}

// The mask every token would get by trying it on the matcher.
static void brute_force_mask(kaon_grammar_matcher *m, const kaon_grammar_vocab *v, int n,
                             const bool *special, const char *const *bytes, const size_t *lens,
                             const bool *is_eog, uint32_t *mask) {
    memset(mask, 0, kaon_grammar_mask_words(n) * sizeof *mask);
    (void)v;
    for (int i = 0; i < n; i++) {
        bool ok;
        if (is_eog[i]) ok = kaon_grammar_matcher_can_end(m);
        else if (special[i] || !lens[i]) ok = false;
        else {
            ok = kaon_grammar_matcher_accept_bytes(m, bytes[i], lens[i]);
            if (ok) kaon_grammar_matcher_rollback(m, 1);
        }
        if (ok) mask[i >> 5] |= 1u << (i & 31);
    }
}

static int mask_diff(const uint32_t *a, const uint32_t *b, int n, int *first) {
    int d = 0;
    *first = -1;
    for (int i = 0; i < n; i++) {
        bool x = a[i >> 5] >> (i & 31) & 1, y = b[i >> 5] >> (i & 31) & 1;
        if (x != y) {
            if (*first < 0) *first = i;
            d++;
        }
    }
    return d;
}

typedef struct {
    const char *name;
    int n;
    const char *const *bytes;
    const size_t *lens;
    const bool *special;
    bool *is_eog;
    kaon_grammar_vocab *v;
} vocab_view;

// Random walks: sample allowed tokens; masks checked against brute force at every step
// (check_every = 1) or some; the text must be accepted at the end. Also rollback checks.
static void random_walks(const kaon_grammar *g, const vocab_view *vv, int walks, int max_steps, int check_every,
                         int depth) {
    kaon_grammar_masker *mk = gram_masker_new_depth(g, vv->v, depth);
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    CHECK(mk && m);
    if (!mk || !m) return;
    size_t words = kaon_grammar_mask_words(vv->n);
    uint32_t *mask = malloc(words * 4), *ref = malloc(words * 4);
    uint32_t **history = calloc((size_t)max_steps + 1, sizeof *history);
    int32_t *allowed = malloc((size_t)vv->n * sizeof *allowed);
    char *text = malloc((size_t)max_steps * 64 + 1);
    int mismatches = 0, ended_walks = 0;
    for (int w = 0; w < walks; w++) {
        kaon_grammar_matcher_reset(m);
        size_t tl = 0;
        bool ended = false;
        int step;
        for (step = 0; step < max_steps; step++) {
            CHECK(kaon_grammar_fill_mask(mk, m, mask) == 0);
            if (!history[step]) history[step] = malloc(words * 4);
            memcpy(history[step], mask, words * 4);
            if (step % check_every == 0 || step < 3) {
                brute_force_mask(m, vv->v, vv->n, vv->special, vv->bytes, vv->lens, vv->is_eog, ref);
                int first, d = mask_diff(mask, ref, vv->n, &first);
                if (d && mismatches++ < 5)
                    fprintf(stderr, "%s walk %d step %d: %d tokens differ, first %d ('%.*s') mask %d brute %d\n",
                            vv->name, w, step, d, first, (int)vv->lens[first], vv->bytes[first],
                            (int)(mask[first >> 5] >> (first & 31) & 1), (int)(ref[first >> 5] >> (first & 31) & 1));
                CHECK(d == 0);
            }
            int na = 0, n_eog_allowed = 0;
            for (int i = 0; i < vv->n; i++)
                if (mask[i >> 5] >> (i & 31) & 1) {
                    allowed[na++] = i;
                    n_eog_allowed += vv->is_eog[i];
                }
            if (!na) {
                fprintf(stderr, "%s walk %d step %d: empty mask after", vv->name, w, step);
                for (size_t i = 0; i < tl; i++) fprintf(stderr, " %02x", (uint8_t)text[i]);
                fprintf(stderr, "\n");
            }
            CHECK(na > 0);
            if (!na) break;
            int32_t id = allowed[rnd() % (uint32_t)na];
            // end when allowed after a while, so walks finish
            if (n_eog_allowed && step > max_steps / 4)
                for (int i = 0; i < na; i++)
                    if (vv->is_eog[allowed[i]]) id = allowed[i];
            if (vv->is_eog[id]) {
                CHECK(kaon_grammar_matcher_accept_token(m, vv->v, id));
                ended = true;
                break;
            }
            CHECK(kaon_grammar_matcher_accept_token(m, vv->v, id));
            memcpy(text + tl, vv->bytes[id], vv->lens[id]);
            tl += vv->lens[id];
        }
        // the text so far is accepted as a whole (and complete when the walk ended)
        kaon_grammar_matcher *chk = kaon_grammar_matcher_new(g);
        CHECK(kaon_grammar_matcher_accept_bytes(chk, text, tl));
        if (ended) {
            CHECK(kaon_grammar_matcher_can_end(chk));
            ended_walks++;
            // after the end nothing is allowed
            CHECK(kaon_grammar_fill_mask(mk, m, mask) == 0);
            int any = 0;
            for (size_t i = 0; i < words; i++) any |= mask[i] != 0;
            CHECK(!any);
        }
        kaon_grammar_matcher_free(chk);
        // rollback: the masks seen earlier come back
        int steps = kaon_grammar_matcher_steps(m);
        for (int back = 1; back <= steps && back <= 8; back++) {
            CHECK(kaon_grammar_matcher_rollback(m, 1) == 0);
            int at = kaon_grammar_matcher_steps(m);
            CHECK(kaon_grammar_fill_mask(mk, m, mask) == 0);
            CHECK(at <= step && history[at] && !memcmp(mask, history[at], words * 4));
        }
    }
    if (walks >= 4) CHECK(ended_walks > 0);
    for (int i = 0; i <= max_steps; i++) free(history[i]);
    free(history);
    free(mask);
    free(ref);
    free(allowed);
    free(text);
    kaon_grammar_matcher_free(m);
    kaon_grammar_masker_free(mk);
}

// Masks along a given text (tokenized by the caller) against brute force.
static void masks_along(const kaon_grammar *g, const vocab_view *vv, const int32_t *ids, size_t n, int depth) {
    kaon_grammar_masker *mk = gram_masker_new_depth(g, vv->v, depth);
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    size_t words = kaon_grammar_mask_words(vv->n);
    uint32_t *mask = malloc(words * 4), *ref = malloc(words * 4);
    for (size_t i = 0; i <= n; i++) {
        CHECK(kaon_grammar_fill_mask(mk, m, mask) == 0);
        brute_force_mask(m, vv->v, vv->n, vv->special, vv->bytes, vv->lens, vv->is_eog, ref);
        int first, d = mask_diff(mask, ref, vv->n, &first);
        if (d) fprintf(stderr, "%s along text, token %zu: %d differ, first %d\n", vv->name, i, d, first);
        CHECK(d == 0);
        if (i == n) break;
        CHECK(mask[ids[i] >> 5] >> (ids[i] & 31) & 1);
        CHECK(kaon_grammar_matcher_accept_token(m, vv->v, ids[i]));
    }
    CHECK(kaon_grammar_matcher_can_end(m));
    free(mask);
    free(ref);
    kaon_grammar_matcher_free(m);
    kaon_grammar_masker_free(mk);
}

static void test_masks_synthetic(void) {
    test_vocab tv;
    synthetic_vocab(&tv);
    kaon_grammar_vocab *v = kaon_grammar_vocab_new(tv.n, (const char *const *)tv.bytes, tv.lens, tv.special, tv.eog, tv.n_eog);
    CHECK(v && kaon_grammar_vocab_size(v) == tv.n);
    bool *is_eog = calloc((size_t)tv.n, 1);
    is_eog[0] = true;
    vocab_view vv = {"synthetic", tv.n, (const char *const *)tv.bytes, tv.lens, tv.special, is_eog, v};
    const char *grammars[] = {JSON_GBNF, ARITH_GBNF,
                              "root ::= \"a\"{2,4} ([0-9] | \"xy\"){1,3} \"!\"+\n",
                              "root ::= [α-ω]+ \"é\" [^a-z] (\"中\" | [\\U0001F600-\\U0001F64F])*\n",
                              // bounded repetitions: copies far from the bound share cache entries
                              "root ::= \"\\\"\" [a-z0-9 .,:{}+\\-]{0,30} \"\\\"\" (\",\" \" \"? [0-9]{1,12}){0,9} | \"[\" (\"a\"? [0-9]?){0,20} \"]\"\n",
                              "root ::= (\"{\" s (\",\" s){0,6} \"}\"){2,3}\n s ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [nu\"]){0,16} \"\\\"\"\n",
                              // one-code-point units (gram_units): mandatory copies, opt chains, x{0,1},
                              // a charset as x, and a continuation that overlaps the class (no units)
                              "root ::= \"\\\"\" c{1,12} \"\\\"\" (\",\" \"\\\"\" c{0,5} \"\\\"\")? (\":\" c c{0,1} \"\\\"\")?\n"
                              " c ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
                              "root ::= [^\"\\\\\\x00-\\x1F]{2,9} \"\\\"\" | \"<\" [^<>]{0,4} \">\" | [a-z0-9 ]{0,6} [a-c]+ \".\"\n",
                              // split characters: [à-ïā] holds part of each lead byte's completions
                              "root ::= [à-ïā]{0,3} \"x\" | \"\\\"\" [^\"\\\\]{0,5} \"\\\"\"\n",
                              // units of x* (every pure token accepted): a JSON string, x+, a charset star
                              "root ::= \"{\" (\"\\\"\" c* \"\\\"\" \":\" \" \"? [a-z0-9]+ \",\"?){1,3} \"}\" | [^\"\\\\]* \"\\\"\"\n"
                              " c ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
                              NULL};
    for (int i = 0; grammars[i]; i++) {
        kaon_grammar *g = parse(grammars[i]);
        CHECK(g != NULL);
        // cache keys of 1, 2 and 6 frames: shallow keys send most tokens to the run-time walk
        for (int depth = 1; g && depth <= 6; depth = depth == 2 ? 6 : depth + 1) random_walks(g, &vv, 12, 60, 1, depth);
        kaon_grammar_free(g);
    }
    // single-byte tokens (id 2 + byte) up to and across a repetition's bound, where gram_units
    // decides pure tokens by their count
    const char *along[][2] = {
        {"root ::= [a-z0-9 ]{0,6} [a-c]+ \".\"\n", "ab ab ab."},
        {"root ::= \"\\\"\" c{1,12} \"\\\"\"\n c ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [nu\"]\n", "\"a\\nbcdefghijk\""},
        {"root ::= \"<\" [^<>]{0,4} \">\" [a-z]{2,5}\n", "<abcd>abcde"},
        // split characters of one walk that the walk cache may merge or must not
        {"root ::= ([à-ïā]{0,3} \"x\" | \"\\\"\" [^\"\\\\]{0,5} \"\\\"\"){2}\n", "\"ab\"\xc3\xa0\xc4\x81x"},
        {"root ::= \"<\" .{0,3} \">\" [À-ÏĐ-ğ]{0,2} \"x\"\n", "<\xe4\xa0\x80>\xc3\x80x"},
        // a string body of x*: every count of pure tokens is accepted, past GRAM_UNITS_BITS too
        {"root ::= \"\\\"\" c* \"\\\"\" [a-z]+ \".\"\n c ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [nu\"]\n",
         "\"abcdefghijklmnopqrstuvwxyz\\n0123456789\"abcdefghijklmnopqrstuvwxyz."},
    };
    for (size_t i = 0; i < sizeof along / sizeof along[0]; i++) {
        kaon_grammar *g = parse(along[i][0]);
        int32_t ids[128];
        size_t n = strlen(along[i][1]);
        CHECK(n <= sizeof ids / sizeof ids[0]);
        for (size_t j = 0; j < n && j < sizeof ids / sizeof ids[0]; j++) ids[j] = 2 + (uint8_t)along[i][1][j];
        if (g) masks_along(g, &vv, ids, n, 6);
        kaon_grammar_free(g);
    }
    free(is_eog);
    kaon_grammar_vocab_free(v);
    test_vocab_free(&tv);
}

// A brute-force count of b's code points when all are whole and in charset cs, else -1.
static int brute_code_points(const kaon_grammar *g, int cs, const uint8_t *b, int len) {
    int n = 0;
    for (int i = 0; i < len; n++) {
        int extra = b[i] < 0x80 ? 0 : b[i] >= 0xC2 && b[i] <= 0xDF ? 1 : (b[i] & 0xF0) == 0xE0 ? 2 : b[i] >= 0xF0 && b[i] <= 0xF4 ? 3 : -1;
        if (extra < 0 || i + extra >= len) return -1;
        uint32_t cp = extra ? b[i] & (0x3Fu >> extra) : b[i];
        for (int k = 1; k <= extra; k++) {
            if ((b[i + k] & 0xC0) != 0x80) return -1;
            cp = cp << 6 | (b[i + k] & 0x3Fu);
        }
        static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || !gram_charset_has(g, cs, cp)) return -1;
        i += extra + 1;
    }
    return n;
}

// gram_vocab_units against a brute-force count of every token, and shared between grammars
// whose classes have the same code points.
static void test_vocab_units(void) {
    test_vocab tv;
    synthetic_vocab(&tv);
    kaon_grammar_vocab *v = kaon_grammar_vocab_new(tv.n, (const char *const *)tv.bytes, tv.lens, tv.special, tv.eog, tv.n_eog);
    const char *classes[] = {"root ::= [^\"\\\\\\x00-\\x1F]\n", "root ::= [a-z0-9é中]\n", "root ::= [\\x00-\\U0010FFFF]\n", NULL};
    for (int k = 0; classes[k]; k++) {
        kaon_grammar *g = parse(classes[k]), *g2 = parse(classes[k]);
        int cs = g->elems[g->rule_alts[g->alt_first[g->root]]].val;
        const gram_units *u = gram_vocab_units(v, g, cs);
        CHECK(u != NULL);
        CHECK(gram_vocab_units(v, g2, g2->elems[g2->rule_alts[g2->alt_first[g2->root]]].val) == u);
        int n_pure = 0, n_other = 0, bad = 0;
        for (int r = 0; u && r < v->n_order; r++) {
            int c = brute_code_points(g, cs, v->obytes[r], (int)v->olens[r]);
            if (c < 0) {
                bad += u->cps[r] != GRAM_UNITS_OTHER || n_other >= u->n_other || u->other[n_other] != r;
                if (n_other && n_other < u->n_other) {  // the common prefix with the previous other token
                    int p = u->other[n_other - 1], l = 0;
                    while (l < (int)v->olens[p] && l < (int)v->olens[r] && v->obytes[p][l] == v->obytes[r][l]) l++;
                    bad += u->other_lcp[n_other] != l;
                }
                n_other++;
                continue;
            }
            bad += u->cps[r] != c;
            n_pure++;
        }
        CHECK(u && n_other == u->n_other && n_pure == u->cps_start[GRAM_UNITS_MAX + 1]);
        CHECK(bad == 0);
        for (int j = 0; u && j < u->n_other; j++) {  // the other tokens longest first, counted by length
            int len = (int)v->olens[u->other_by_len[j]];
            CHECK(u->cps[u->other_by_len[j]] == GRAM_UNITS_OTHER);
            CHECK(j == 0 || (int)v->olens[u->other_by_len[j - 1]] >= len);
            CHECK(u->other_at_least[len] > j && u->other_at_least[len + 1] <= j);
        }
        for (int c = 0; u && c <= GRAM_UNITS_MAX; c++)  // ids grouped by count
            for (int j = u->cps_start[c]; j < u->cps_start[c + 1]; j++) {
                int len = (int)v->lens[u->by_cps[j]];
                CHECK(brute_code_points(g, cs, v->bytes[u->by_cps[j]], len) == c);
            }
        for (int c = 0; u && c <= GRAM_UNITS_BITS; c++)  // the count bitmaps: pure ids of <= c code points
            for (int id = 0; id < v->n; id++) {
                int cp = v->special[id] || !v->lens[id] ? -1 : brute_code_points(g, cs, v->bytes[id], (int)v->lens[id]);
                bool le = u->le_bits[(size_t)c * u->words + (id >> 5)] >> (id & 31) & 1;
                bool pure = u->pure_bits[id >> 5] >> (id & 31) & 1;
                CHECK(le == (cp >= 0 && cp <= c));
                CHECK(pure == (cp >= 0));
            }
        for (int b = 0; u && b < 256; b++)  // the other tokens by first byte
            for (int j = u->other_fb[b]; j < u->other_fb[b + 1]; j++) CHECK(v->obytes[u->other[j]][0] == b);
        CHECK(!u || (u->other_fb[0] == 0 && u->other_fb[256] == u->n_other));
        kaon_grammar_free(g);
        kaon_grammar_free(g2);
    }
    kaon_grammar_vocab_free(v);
    test_vocab_free(&tv);
}

static void test_masks_smollm2(void) {
    const char *path = getenv("KAON_TEST_MODEL");
    if (!path) path = "/work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    kaon_gguf *gf = kaon_gguf_open_metadata(path);
    if (!gf) {
        printf("SKIP smollm2 masks: %s not found\n", path);
        return;
    }
    kaon_tokenizer *t = kaon_tokenizer_from_gguf(gf);
    CHECK(t != NULL);
    if (!t) {
        kaon_gguf_close(gf);
        return;
    }
    kaon_grammar_vocab *v = kaon_grammar_vocab_from_tokenizer(t);
    CHECK(v != NULL);
    int n = kaon_tokenizer_vocab_size(t);
    const char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    bool *special = calloc((size_t)n, 1), *is_eog = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        bytes[i] = kaon_tokenizer_token_text(t, i, &lens[i]);
        if (!bytes[i]) bytes[i] = "", lens[i] = 0;
        special[i] = kaon_tokenizer_is_special(t, i);
        is_eog[i] = kaon_tokenizer_is_eog(t, i);
    }
    vocab_view vv = {"smollm2", n, bytes, lens, special, is_eog, v};
    kaon_grammar *g = parse(JSON_GBNF);
    static const char text[] = "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"tags\": [\"math\", \"é中\"],\n"
                               "  \"alive\": false, \"ratio\": -0.25e3, \"x\": {\"y\": null}}";
    int32_t *ids;
    size_t n_ids;
    CHECK(kaon_tokenize(t, text, sizeof text - 1, false, &ids, &n_ids) == 0);
    masks_along(g, &vv, ids, n_ids, 6);
    masks_along(g, &vv, ids, n_ids, 1);
    free(ids);
    random_walks(g, &vv, 3, 40, 5, 6);
    random_walks(g, &vv, 2, 40, 5, 2);
    kaon_grammar *ga = parse(ARITH_GBNF);
    random_walks(ga, &vv, 3, 30, 5, 6);
    kaon_grammar_free(ga);
    // bounded repetitions as the JSON Schema converter writes them (maxLength, maxItems), with
    // strings longer than the bound's reach of the longest tokens
    kaon_grammar *gr = parse("root ::= \"{\\\"a\\\": \" str \", \\\"b\\\": [\" str (\",\" \" \"? str){0,3} \"], \\\"n\\\": \" num \"}\"\n"
                             "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
                             "str ::= \"\\\"\" char{0,90} \"\\\"\"\n"
                             "num ::= \"-\"? [0-9]{1,15}\n");
    CHECK(gr != NULL);
    static const char rtext[] = "{\"a\": \"################################ a long title -------- with dashes\", \"b\": "
                                "[\"x\", \"================================================================\", \"\\u00e9t\\u00e9\"], "
                                "\"n\": -123456789012}";
    CHECK(kaon_tokenize(t, rtext, sizeof rtext - 1, false, &ids, &n_ids) == 0);
    if (gr) {
        masks_along(gr, &vv, ids, n_ids, 6);
        masks_along(gr, &vv, ids, n_ids, 2);
        random_walks(gr, &vv, 2, 40, 4, 6);
    }
    free(ids);
    kaon_grammar_free(gr);
    kaon_grammar_free(g);
    free(bytes);
    free(lens);
    free(special);
    free(is_eog);
    kaon_grammar_vocab_free(v);
    kaon_tokenizer_free(t);
    kaon_gguf_close(gf);
}

// The fuzzer's seeds stay valid grammars (all but the left-recursive one).
static void test_fuzz_seeds(void) {
    static const char *seeds[] = {"json", "arith", "utf8", "repeat", "left_recursion"};
    for (int i = 0; i < 5; i++) {
        char path[128];
        snprintf(path, sizeof path, "tests/fuzz/seeds/grammar/%s.gbnf", seeds[i]);
        size_t len;
        char *text = kaon_test_read_file(path, &len);
        CHECK(text != NULL);
        if (!text) continue;
        kaon_grammar *g = kaon_grammar_parse(text, len, NULL);
        if ((g != NULL) != (i < 4)) fprintf(stderr, "%s: %s\n", path, g ? "parsed" : kaon_last_error());
        CHECK((g != NULL) == (i < 4));
        kaon_grammar_free(g);
        free(text);
    }
}

// A long repetition keeps one stack depth (tail calls): the state stays small.
static void test_long_repetition(void) {
    kaon_grammar *g = parse("root ::= \"\\\"\" [a-z ]* \"\\\"\"");
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    CHECK(kaon_grammar_matcher_accept_bytes(m, "\"", 1));
    for (int i = 0; i < 20000; i++) CHECK(kaon_grammar_matcher_accept_bytes(m, "ab c", 4) || i > 20000);
    CHECK(kaon_grammar_matcher_accept_bytes(m, "\"", 1) && kaon_grammar_matcher_can_end(m));
    CHECK(kaon_grammar_matcher_steps(m) == 20002);
    kaon_grammar_matcher_free(m);
    kaon_grammar_free(g);
}

// An ambiguous grammar (nested repetitions: exponentially many parses) fails with an error
// instead of taking exponential time or memory.
static void test_ambiguous_grammar(void) {
    char text[128] = "root ::= [a-z]";
    for (int i = 0; i < 80; i++) strcat(text, "+");
    kaon_grammar *g = parse(text);
    CHECK(g != NULL);
    kaon_grammar_matcher *m = g ? kaon_grammar_matcher_new(g) : NULL;
    bool failed = !m;
    for (int i = 0; i < 200 && !failed; i++) failed = !kaon_grammar_matcher_accept_bytes(m, "a", 1);
    CHECK(failed);
    CHECK(strstr(kaon_last_error(), "too ambiguous") != NULL);
    kaon_grammar_matcher_free(m);
    kaon_grammar_free(g);
}

int main(void) {
    test_ambiguous_grammar();
    test_fuzz_seeds();
    test_long_repetition();
    test_parse_errors();
    test_strings();
    test_matcher_state();
    test_vocab_units();
    test_masks_synthetic();
    test_masks_smollm2();
    TEST_MAIN_END();
}
