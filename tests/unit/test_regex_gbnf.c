// kaon_regex_to_gbnf: patterns turned into grammars, then strings run through a matcher
// (accepted, rejected), JSON-string mode, the grammar text appended after existing rules, and
// patterns refused with an error naming the construct and its offset.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/regex_gbnf.h"
#include "util/err.h"
#include "test.h"

// The grammar for `re`, or NULL (with the error printed when `quiet` is false).
static kaon_grammar *compile(const char *re, bool json, bool quiet) {
    gbnf_text t = {0};
    kaon_grammar *g = NULL;
    if (kaon_regex_to_gbnf(re, strlen(re), "root", json, &t)) {
        if (!quiet) fprintf(stderr, "regex %s: %s\n", re, kaon_last_error());
    } else {
        g = kaon_grammar_parse(t.s, t.len, NULL);
        if (!g) fprintf(stderr, "regex %s: grammar %s fails: %s\n", re, t.s, kaon_last_error());
    }
    gbnf_text_free(&t);
    return g;
}

static bool accepts(const kaon_grammar *g, const char *s) {
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    bool ok = kaon_grammar_matcher_accept_bytes(m, s, strlen(s)) && kaon_grammar_matcher_can_end(m);
    kaon_grammar_matcher_free(m);
    return ok;
}

typedef struct {
    const char *re;
    bool json;
    const char *good[8], *bad[8];  // NULL-terminated
} match_case;

static const match_case CASES[] = {
    {"abc", false, {"abc"}, {"", "ab", "abcd", "xabc"}},
    {"^a(b|c)*d$", false, {"ad", "abd", "acbcd"}, {"a", "abxd", "ad\n"}},
    {"[a-z0-9_]+", false, {"a", "z_9"}, {"", "A", "a-b"}},
    {"[^a-c]", false, {"d", "\xc3\xa9", "\n"}, {"a", "c", "dd"}},
    {"\\d{3}-\\d{2,}", false, {"123-45", "000-123456"}, {"12-345", "123-4", "abc-12"}},
    {"\\w+\\s\\W", false, {"a_1 !", "x\t-", "a  "}, {"ab", "a b"}},
    {"[\\d\\s]+|x", false, {"1 2", "x"}, {"1x", "xx"}},
    {"\\D\\S", false, {"a1", " b"}, {"1a", "a "}},
    {".", false, {"a", "\xe4\xb8\xad", " "}, {"\n", "", "ab"}},
    {"a{2,3}", false, {"aa", "aaa"}, {"a", "aaaa"}},
    {"a{,2}b{2}", false, {"bb", "abb", "aabb"}, {"aaabb", "ab"}},
    {"(ab){2,}", false, {"abab", "ababab"}, {"ab", "aba"}},
    {"(a?b?)*c", false, {"c", "abbac"}, {"", "abx"}},
    {"(a?){3,}", false, {"", "a", "aaaaa"}, {"b"}},
    {"a*?b+?c??", false, {"b", "aabbc"}, {"", "c"}},
    {"(?:x|y)(?P<n>z)(?<m>w)", false, {"xzw", "yzw"}, {"zw", "xz"}},
    {"a{", false, {"a{"}, {"a"}},
    {"\\.\\\\\\/\\-\\n\\t\\x41\\u00e9", false, {".\\/-\n\tA\xc3\xa9"}, {".\\/-\n\tA\xc3\xa9x"}},
    {"caf\xc3\xa9+", false, {"caf\xc3\xa9\xc3\xa9"}, {"cafe"}},
    {"a|b|", false, {"a", "b", ""}, {"ab"}},
    {"[]a]", false, {"]", "a"}, {"[", ""}},
    {"(|a)*", false, {"", "aaa"}, {"b"}},
    {"", false, {""}, {"a"}},
    {"^x{0}$", false, {""}, {"x"}},
    {"[^\\s\\S]?", false, {""}, {"a", " "}},
    // JSON-string mode: the text between the quotes
    {"a\"b", true, {"a\\\"b"}, {"a\"b", "a\\\\\"b"}},
    {"a\\\\b", true, {"a\\\\b"}, {"a\\b"}},
    {"a/b", true, {"a/b", "a\\/b"}, {"a\\\\/b"}},
    {"[^a]+", true, {"\\\"", "\\n", "\\u0001", "\\u001F", "\\u001f", "x\\t\\\\"}, {"\"", "\n", "a", "\\u0020"}},
    {".", true, {"\\t", "\\u0009", "\xc3\xa9"}, {"\\n", "\\u000a", "\\u000A", "\n"}},
    {"\\s+", true, {" \\t\\n\\r", "\\u000b"}, {"\t", "x"}},
    {"[\\x00-\\x1f]", true, {"\\u0000", "\\b", "\\f"}, {"\x01", " "}},
};

static void test_matching(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const match_case *c = &CASES[i];
        kaon_grammar *g = compile(c->re, c->json, false);
        CHECK(g != NULL);
        if (!g) continue;
        for (int k = 0; c->good[k]; k++) {
            bool ok = accepts(g, c->good[k]);
            if (!ok) fprintf(stderr, "%s (json %d) should accept %s\n", c->re, c->json, c->good[k]);
            CHECK(ok);
        }
        for (int k = 0; c->bad[k]; k++) {
            bool ok = accepts(g, c->bad[k]);
            if (ok) fprintf(stderr, "%s (json %d) should reject %s\n", c->re, c->json, c->bad[k]);
            CHECK(!ok);
        }
        kaon_grammar_free(g);
    }
}

static void test_errors(void) {
    static const struct {
        const char *re, *want;
    } cases[] = {
        {"a\\bc", "word boundaries (\\b) are not supported at offset 1"},
        {"(a)\\1", "backreferences are not supported at offset 3"},
        {"a(?=b)", "lookahead and lookbehind are not supported at offset 1"},
        {"(?<!a)b", "lookahead and lookbehind"},
        {"(?i)a", "not supported at offset 0"},
        {"ab^c", "'^' is only supported at the start of the pattern at offset 2"},
        {"a$b", "'$' is only supported at the end of the pattern at offset 2"},
        {"(a$)+", "quantified group cannot contain"},
        {"+a", "nothing to repeat at offset 0"},
        {"a**", "multiple repeat at offset 2"},
        {"a++", "possessive quantifiers are not supported at offset 2"},
        {"a{5,2}", "min repeat greater than max repeat"},
        {"a{0,1025}", "repetition count above 1024 at offset 1"},
        {"(ab", "missing ')' at offset 0"},
        {"ab)", "unbalanced ')' at offset 2"},
        {"[ab", "unterminated character class at offset 0"},
        {"[b-a]", "character range is reversed at offset 1"},
        {"\\p{L}", "Unicode property escapes"},
        {"\\xG1", "too few hex digits"},
        {"\\y", "unknown escape at offset 0"},
        {"\xff", "invalid UTF-8 at offset 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gbnf_text t = {0};
        gbnf_puts(&t, "x ::= \"x\"\n");
        int rc = kaon_regex_to_gbnf(cases[i].re, strlen(cases[i].re), "root", false, &t);
        CHECK(rc == -1);
        bool found = rc == -1 && strstr(kaon_last_error(), cases[i].want);
        if (!found) fprintf(stderr, "%s: got '%s', want '%s'\n", cases[i].re, kaon_last_error(), cases[i].want);
        CHECK(found);
        CHECK(t.len == 10 && !strcmp(t.s, "x ::= \"x\"\n"));  // the caller's text is untouched
        gbnf_text_free(&t);
    }
    // nesting beyond the limit, a pattern over the length limit, a bad rule name
    char deep[2 * KAON_REGEX_MAX_DEPTH + 8];
    int n = 0;
    for (int i = 0; i <= KAON_REGEX_MAX_DEPTH; i++) deep[n++] = '(';
    for (int i = 0; i <= KAON_REGEX_MAX_DEPTH; i++) deep[n++] = ')';
    gbnf_text t = {0};
    CHECK(kaon_regex_to_gbnf(deep, (size_t)n, "root", false, &t) == -1);
    CHECK(strstr(kaon_last_error(), "nested too deeply") != NULL);
    CHECK(kaon_regex_to_gbnf(deep + 1, (size_t)n - 2, "root", false, &t) == 0);
    gbnf_text_free(&t);
    char *big = malloc(KAON_REGEX_MAX_LEN + 2);
    memset(big, 'a', KAON_REGEX_MAX_LEN + 1);
    CHECK(kaon_regex_to_gbnf(big, KAON_REGEX_MAX_LEN + 1, "root", false, &t) == -1);
    free(big);
    CHECK(kaon_regex_to_gbnf("a", 1, "bad name", false, &t) == -1);
    gbnf_text_free(&t);
}

// A pattern whose grammar text would be huge fails cleanly instead of growing without bound:
// (a?a?...a?)* is printed as the alternatives "first non-empty item, then the rest",
// quadratic in the items.
static void test_output_limit(void) {
    const char *small = "((((a?b?c?d?e?f?g?h?i?j?k?l?m?n?o?p?)*)*)*)*";
    gbnf_text t = {0};
    CHECK(kaon_regex_to_gbnf(small, strlen(small), "root", true, &t) == 0);
    kaon_grammar *g = kaon_grammar_parse(t.s, t.len, NULL);
    CHECK(g != NULL);
    if (g) CHECK(accepts(g, "abcpa") && accepts(g, "") && !accepts(g, "q"));
    kaon_grammar_free(g);
    gbnf_text_free(&t);
    enum { ITEMS = 4000 };
    char *big = malloc(2 * ITEMS + 4);
    size_t n = 0;
    big[n++] = '(';
    for (int i = 0; i < ITEMS; i++) big[n++] = 'a', big[n++] = '?';
    big[n++] = ')';
    big[n++] = '*';
    CHECK(kaon_regex_to_gbnf(big, n, "root", false, &t) == -1);
    CHECK(strstr(kaon_last_error(), "too large") != NULL);
    CHECK(t.len == 0);
    free(big);
    gbnf_text_free(&t);
}

// Deep groups spill into helper rules (root-gN) rather than past GBNF's nesting limit.
static void test_deep_nesting(void) {
    char re[1024] = "a?";
    for (int i = 0; i < KAON_REGEX_MAX_DEPTH - 1; i++) {
        size_t n = strlen(re);  // re = "(b?|" re "|c)+"
        memmove(re + 4, re, n + 1);
        memcpy(re, "(b?|", 4);
        strcat(re, "|c)+");
    }
    for (int json = 0; json < 2; json++) {
        gbnf_text t = {0};
        CHECK(kaon_regex_to_gbnf(re, strlen(re), "root", json, &t) == 0);
        CHECK(t.s && strstr(t.s, "root-g0 ::=") != NULL);
        kaon_grammar *g = t.s ? kaon_grammar_parse(t.s, t.len, NULL) : NULL;
        CHECK(g != NULL);
        // short strings only: this grammar is so ambiguous that longer ones reach the
        // matcher's stack limits (an error, by design)
        if (g) CHECK(accepts(g, "") && accepts(g, "a") && accepts(g, "b") && !accepts(g, "d") && !accepts(g, "ad"));
        kaon_grammar_free(g);
        gbnf_text_free(&t);
    }
}

// Appended after other rules, usable by name from them (how the JSON Schema converter uses it).
static void test_embedded(void) {
    gbnf_text t = {0};
    gbnf_puts(&t, "root ::= \"\\\"\" str \"\\\"\"\n");
    CHECK(kaon_regex_to_gbnf("[a-z]+@[a-z]+", 13, "str", true, &t) == 0);
    kaon_grammar *g = kaon_grammar_parse(t.s, t.len, NULL);
    CHECK(g != NULL);
    if (g) {
        CHECK(accepts(g, "\"ab@cd\""));
        CHECK(!accepts(g, "\"ab@\""));
        CHECK(!accepts(g, "ab@cd"));
    }
    kaon_grammar_free(g);
    gbnf_text_free(&t);
}

int main(void) {
    test_matching();
    test_errors();
    test_output_limit();
    test_deep_nesting();
    test_embedded();
    TEST_MAIN_END();
}
