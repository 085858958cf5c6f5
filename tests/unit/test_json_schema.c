// JSON Schema -> GBNF: each schema's grammar must parse, accept the listed texts and reject the
// others; malformed or unsupported schemas must fail with an error naming their JSON pointer.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "util/err.h"
#include "test.h"

#define MAXN 16
typedef struct {
    const char *schema;
    bool strict, any_ws;
    const char *good[MAXN];
    const char *bad[MAXN];
} schema_case;

static const schema_case CASES[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
     "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
     false, false,
     {"{\"name\":\"Bo\",\"age\":3}", "{\"name\": \"Bo\", \"age\": -3}", "{\"name\":\"a\\\"b\\\\c\\u00e9\\n\",\"age\":0}",
      "{\"name\":\"\xc3\xa9\",\"age\":10}"},
     {"{\"name\":\"Bo\"}", "{\"age\":3,\"name\":\"Bo\"}", "{\"name\":\"Bo\",\"age\":3,\"x\":1}",
      "{\"name\":\"Bo\",\"age\":03}", "{\"name\":\"Bo\",\"age\":-0}", "{\"name\":\"a\\x\",\"age\":1}",
      "{\"name\":\"a\\u12\",\"age\":1}", "{\"name\":\"\\ud83d\\ude00\",\"age\":1}", "{\"name\":\"a\nb\",\"age\":1}", "{ \"name\":\"Bo\",\"age\":3}",
      "{\"name\":\"Bo\",\"age\":3}\n", "{\"name\":\"Bo\",  \"age\":3}", "{\"name\":\"Bo\",\"age\":1.5}",
      "{\"name\":\"Bo\",\"age\":1234567890123456}"}},
    // optional properties: every subset, commas right
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},"
     "\"c\":{\"type\":\"integer\"}},\"required\":[\"b\"]}",
     true, false,
     {"{\"b\":1}", "{\"a\":1,\"b\":2}", "{\"b\":2,\"c\":3}", "{\"a\":1,\"b\":2,\"c\":3}"},
     {"{}", "{\"a\":1}", "{\"a\":1,\"c\":3}", "{,\"b\":1}", "{\"b\":1,}", "{\"a\":1,,\"b\":2}", "{\"b\":1,\"d\":1}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}", true, false,
     {"{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"},
     {"{\"b\":2,\"a\":1}", "{\"a\":1,}", "{,}", "{\"c\":1}"}},
    // not strict, additionalProperties absent: extra keys after the listed ones
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", false, false,
     {"{}", "{\"a\":1}", "{\"a\":1,\"x\":[1,{\"y\":null}]}", "{\"x\":true}"},
     {"{\"a\":\"s\"}", "{\"a\":1,}"}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}", false, false,
     {"{}", "{\"x\":1.5}", "{\"x\":1,\"y\":-2e10}"},
     {"{\"x\":\"s\"}", "{\"x\":1.1234567}", "{\"x\":01}"}},
    {"{\"type\":\"object\",\"properties\":{\"q\\\"\":{\"type\":\"integer\"},\"ab\":{\"type\":\"integer\"}}}", false, false,
     {"{\"q\\\"\":1}", "{\"ab\":1,\"a\":\"s\"}", "{\"abc\":\"s\"}", "{\"q\":\"s\"}"},
     {"{\"ab\":\"s\"}", "{\"q\"\":1}", "{\"ab\":1,\"ab\":\"s\"}", "{\"a\\u0062\":\"s\"}"}},
    // enums and const: canonical compact JSON text
    {"{\"enum\":[\"red\",\"green\",1,null,{\"a\":[1,2]},true]}", false, false,
     {"\"red\"", "\"green\"", "1", "null", "{\"a\":[1,2]}", "{\"a\": [1, 2]}", "true"},
     {"\"blue\"", "\"Red\"", "2", "false", "{\"a\":[1,  2]}", "{ \"a\":[1,2]}", "1.0"}},
    {"{\"type\":\"string\",\"enum\":[\"x\",1]}", false, false, {"\"x\""}, {"1"}},
    {"{\"const\":\"fixed\"}", false, false, {"\"fixed\""}, {"\"other\""}},
    // type lists, anyOf / oneOf
    {"{\"type\":[\"string\",\"null\"]}", false, false, {"\"s\"", "null"}, {"1", "nul"}},
    {"{\"anyOf\":[{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},{\"type\":\"boolean\"}]}", false, false,
     {"0", "9", "true"}, {"10", "-1", "null"}},
    {"{\"oneOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}]}", false,
     false, {"\"ab\"", "[]", "[1,2]", "[1, 2]"}, {"\"abc\"", "[1,]", "[\"a\"]", "[ 1]"}},
    {"{\"allOf\":[{\"type\":\"boolean\"}],\"description\":\"d\"}", false, false, {"true"}, {"1"}},
    {"{\"$defs\":{\"base\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}},"
     "\"allOf\":[{\"$ref\":\"#/$defs/base\"},{\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"]}]}",
     true, false, {"{\"id\":1,\"name\":\"x\"}"}, {"{\"id\":1}", "{\"name\":\"x\"}", "{\"id\":1,\"name\":\"x\",\"z\":1}"}},
    // integer ranges
    {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}", false, false, {"0", "7", "99", "100", "149", "150"},
     {"151", "-1", "00", "07", "1000", "200", "-0"}},
    {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5}", false, false, {"-5", "-1", "0", "5"},
     {"-6", "6", "-0", "--1", "+1"}},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0}", false, false, {"1", "999999999999999"},
     {"0", "-1", "1000000000000000"}},
    {"{\"type\":\"integer\",\"minimum\":-1234,\"exclusiveMaximum\":-17}", false, false, {"-1234", "-18", "-999", "-100"},
     {"-17", "-1235", "-16", "0", "-9999"}},
    {"{\"type\":\"number\",\"minimum\":0,\"maximum\":10}", false, false, {"0", "10", "9.5", "0.25", "3"},
     {"10.5", "-1", "11", "1e3", "01.5"}},
    {"{\"type\":\"number\",\"minimum\":-2,\"maximum\":-1}", false, false, {"-2", "-1", "-1.5", "-1.999"},
     {"-2.5", "-0.5", "1", "-3", "-2.1"}},
    {"{\"type\":\"number\",\"minimum\":-1,\"maximum\":1}", false, false, {"-1", "-0.5", "0", "0.75", "1"},
     {"-1.5", "1.5", "-01.5"}},
    {"{\"type\":\"number\"}", false, false, {"0", "-0.5", "1e10", "3.25E-2"}, {".5", "1.", "01", "1.1234567", "+1"}},
    // arrays
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", false, false,
     {"[1,2]", "[1, 2, 3]"}, {"[]", "[1]", "[1,2,3,4]", "[1,2,]"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}", false, false,
     {"[]", "[\"a\"]", "[\"a\",1]"}, {"[1]", "[\"a\",1,2]", "[\"a\",\"b\"]"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"minItems\":2,"
     "\"items\":{\"type\":\"boolean\"},\"maxItems\":3}",
     false, false, {"[\"a\",1]", "[\"a\",1,true]"}, {"[\"a\"]", "[\"a\",1,true,false]", "[\"a\",1,2]"}},
    // strings
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", false, false, {"\"ab\"", "\"a\\nb\"", "\"\xc3\xa9\xc3\xa9\""},
     {"\"a\"", "\"abcd\"", "\"\\n\""}},
    {"{\"type\":\"string\",\"format\":\"date\"}", false, false, {"\"2024-02-28\"", "\"1999-12-31\"", "\"2001-04-30\""},
     {"\"2024-13-01\"", "\"2023-02-30\"", "\"2023-04-31\"", "\"0999-01-01\"", "\"2024-1-01\"", "\"x\""}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", false, false, {"\"123e4567-e89b-12d3-a456-426614174000\""},
     {"\"123e4567e89b12d3a456426614174000\""}},
    {"{\"type\":\"string\",\"format\":\"ipv4\"}", false, false, {"\"192.168.0.1\"", "\"0.0.0.0\"", "\"255.255.255.255\""},
     {"\"256.1.1.1\"", "\"01.1.1.1\"", "\"1.1.1\""}},
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]+[0-9]?$\"}", false, false, {"\"abc\"", "\"ab1\""}, {"\"1\"", "\"ab12\"", "\"\""}},
    // $ref and recursion
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":"
     "\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},"
     "\"$ref\":\"#/$defs/node\"}",
     false, false, {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}"},
     {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}"}},
    {"{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", false, false, {"[]", "[[],[[]]]"}, {"[1]", "[[],]"}},
    // recursion that needs more than the nesting limit falls back to the exact grammar; with any
    // whitespace its shared rules must be written once (a fuzzer found them written twice); no
    // finite text matches (every array needs an array inside)
    {"{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"minItems\":1,\"maxItems\":4}", false, true,
     {NULL}, {"[]", "[[]]", "[ [ [ ] ] ]", "[[1]]"}},
    {"{\"definitions\":{\"a~b\":{\"type\":\"boolean\"}},\"properties\":{\"x\":{\"$ref\":\"#/definitions/a~0b\"}},"
     "\"type\":\"object\",\"required\":[\"x\"]}",
     true, false, {"{\"x\":true}"}, {"{\"x\":1}"}},
    // whitespace policy
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}},\"required\":[\"a\"]}", true, true,
     {"{ \"a\" : [ 1 ,\n 2 ] }", "{\"a\":[]}"}, {"{\"a\":[1,2] } x"}},
    // no type: any value, or the keywords' constraints on each kind
    {"{}", false, false, {"1", "\"s\"", "[1,{\"a\":null}]", "{\"k\": [true, false]}"}, {"", "[1,", "{\"a\"}", "tru"}},
    {"{\"minimum\":3,\"maximum\":4}", false, false, {"3", "4", "\"s\"", "null"}, {"5", "2"}},
};

static const struct {
    const char *schema;
    const char *want;  // substring of the error
} ERRORS[] = {
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/missing\"}}}", "#/properties/a"},
    {"{\"$ref\":\"#\"}", "refers back to itself"},
    {"{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", "refers back"},
    {"{\"$ref\":\"http://example.com/s.json\"}", "only local $ref"},
    {"{\"type\":\"integer\",\"multipleOf\":3}", "multipleOf"},
    {"{\"type\":\"object\",\"properties\":{\"p\":{\"not\":{\"type\":\"string\"}}}}", "#/properties/p"},
    {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", "allOf"},
    {"{\"allOf\":[{\"properties\":{\"a\":{}}},{\"properties\":{\"a\":{}}}]}", "two allOf members"},
    {"{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", "next to"},
    {"{\"type\":\"array\",\"maxItems\":5000}", "1024"},
    {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems"},
    {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer"},
    {"{\"type\":\"strin\"}", "unknown type"},
    {"{\"enum\":[1,2],\"type\":\"string\"}", "enum"},
    {"{\"type\":\"object\",\"required\":[\"x\"],\"additionalProperties\":false}", "required property 'x'"},
    {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "#/pattern"},
    {"{\"type\":", "not valid JSON"},
    {"false", "nothing"},
    {"{\"type\":\"object\",\"properties\":{\"\xff\":{}}}", "UTF-8"},
    {"{\"enum\":[\"\xed\xa0\x80\"]}", "UTF-8"},
    {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
    {"{\"type\":\"string\",\"format\":\"date\",\"maxLength\":3}", "format"},
};

static bool accepts(const kaon_grammar *g, const char *s) {
    kaon_grammar_matcher *m = kaon_grammar_matcher_new(g);
    size_t n = strlen(s);
    bool whole = kaon_grammar_matcher_accept_bytes(m, s, n) && kaon_grammar_matcher_can_end(m);
    kaon_grammar_matcher_reset(m);
    bool bytes = true;
    for (size_t i = 0; i < n && bytes; i++) bytes = kaon_grammar_matcher_accept_bytes(m, s + i, 1);
    bytes = bytes && kaon_grammar_matcher_can_end(m);
    CHECK(whole == bytes);
    kaon_grammar_matcher_free(m);
    return whole;
}

static kaon_grammar *convert(const char *schema, bool strict, bool any_ws, gbnf_text *t) {
    kaon_json_schema_opts o = {.strict = strict, .any_whitespace = any_ws};
    if (kaon_json_schema_to_gbnf(schema, strlen(schema), "root", &o, t)) {
        fprintf(stderr, "convert failed: %s\n  schema %s\n", kaon_last_error(), schema);
        return NULL;
    }
    kaon_grammar *g = kaon_grammar_parse(t->s, t->len, "root");
    if (!g) fprintf(stderr, "parse failed: %s\n%s\n", kaon_last_error(), t->s);
    return g;
}

static void test_cases(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const schema_case *c = &CASES[i];
        gbnf_text t = {0};
        kaon_grammar *g = convert(c->schema, c->strict, c->any_ws, &t);
        CHECK(g != NULL);
        if (!g) {
            gbnf_text_free(&t);
            continue;
        }
        for (int k = 0; k < MAXN && c->good[k]; k++) {
            bool ok = accepts(g, c->good[k]);
            if (!ok) fprintf(stderr, "case %zu: should accept %s\n%s", i, c->good[k], t.s);
            CHECK(ok);
        }
        for (int k = 0; k < MAXN && c->bad[k]; k++) {
            bool ok = accepts(g, c->bad[k]);
            if (ok) fprintf(stderr, "case %zu: should reject %s\n%s", i, c->bad[k], t.s);
            CHECK(!ok);
        }
        kaon_grammar_free(g);
        gbnf_text_free(&t);
    }
}

static void test_errors(void) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        gbnf_text t = {0};
        kaon_clear_error();
        int rc = kaon_json_schema_to_gbnf(ERRORS[i].schema, strlen(ERRORS[i].schema), "root", NULL, &t);
        const char *err = kaon_last_error();
        bool named = rc != 0 && err && strstr(err, ERRORS[i].want);
        if (!named) fprintf(stderr, "error case %zu: rc %d, error '%s', want '%s'\n", i, rc, err ? err : "", ERRORS[i].want);
        CHECK(named);
        gbnf_text_free(&t);
    }
}

static void test_any(void) {
    for (int obj = 0; obj < 2; obj++) {
        gbnf_text t = {0};
        CHECK(kaon_json_any_to_gbnf("root", obj, NULL, &t) == 0);
        kaon_grammar *g = kaon_grammar_parse(t.s, t.len, "root");
        CHECK(g != NULL);
        if (g) {
            CHECK(accepts(g, "{\"a\": [1, {\"b\":null}], \"c\":\"d\"}"));
            CHECK(accepts(g, "[1,2]") == !obj);
            CHECK(accepts(g, "\"s\"") == !obj);
            CHECK(!accepts(g, "{\"a\":1,}"));
            CHECK(!accepts(g, "{\n\"a\":1}"));
            CHECK(!accepts(g, "[[[[[[[[[[[[1]]]]]]]]]]]]"));  // nesting is bounded
            kaon_grammar_free(g);
        }
        gbnf_text_free(&t);
    }
}

// Recursive $refs nest at most max_ref_depth deep where the schema lets the member be left
// out; a schema that requires deeper nesting keeps its exact grammar.
static kaon_grammar *convert_depth(const char *schema, int depth, gbnf_text *t) {
    kaon_json_schema_opts o = {.strict = true, .max_ref_depth = depth};
    if (kaon_json_schema_to_gbnf(schema, strlen(schema), "root", &o, t)) {
        fprintf(stderr, "convert failed: %s\n", kaon_last_error());
        return NULL;
    }
    return kaon_grammar_parse(t->s, t->len, "root");
}

static void test_ref_depth(void) {
    static const char *list = "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                              "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":\"null\"}]}},"
                              "\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/n\"}";
    static const char *three = "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}";
    static const char *four = "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":{\"v\":4,\"next\":null}}}}";
    static const char *tree = "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"l\":{\"type\":\"string\"},"
                              "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}},"
                              "\"up\":{\"$ref\":\"#/$defs/t\"}},\"required\":[\"l\"]}},\"$ref\":\"#/$defs/t\"}";
    // the recursion is required (a type list is no place to leave it out): exact grammar
    static const char *forced = "{\"$defs\":{\"n\":{\"type\":[\"object\",\"null\"],\"properties\":{\"c\":{\"$ref\":"
                                "\"#/$defs/n\"}},\"required\":[\"c\"]}},\"$ref\":\"#/$defs/n\"}";
    static const char *deep = "{\"c\":{\"c\":{\"c\":{\"c\":{\"c\":null}}}}}";
    struct {
        const char *schema;
        int depth;
        const char *text;
        bool ok;
    } cases[] = {
        {list, 3, three, true},   {list, 3, four, false},  {list, -1, four, true},  {list, 0, four, true},
        {list, 1, "{\"v\":1,\"next\":null}", true},    {list, 1, "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", false},
        {tree, 2, "{\"l\":\"a\",\"kids\":[{\"l\":\"b\",\"kids\":[]}],\"up\":{\"l\":\"c\"}}", true},
        {tree, 2, "{\"l\":\"a\",\"kids\":[{\"l\":\"b\",\"kids\":[{\"l\":\"c\"}]}]}", false},
        {tree, 2, "{\"l\":\"a\",\"up\":{\"l\":\"b\",\"up\":{\"l\":\"c\"}}}", false},
        {tree, 3, "{\"l\":\"a\",\"up\":{\"l\":\"b\",\"up\":{\"l\":\"c\"}}}", true},
        {forced, 2, deep, true},  {forced, 2, "null", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gbnf_text t = {0};
        kaon_grammar *g = convert_depth(cases[i].schema, cases[i].depth, &t);
        CHECK(g != NULL);
        if (g) {
            bool ok = accepts(g, cases[i].text);
            if (ok != cases[i].ok) fprintf(stderr, "ref depth case %zu: %s %s\n%s", i, cases[i].text, ok ? "accepted" : "rejected", t.s);
            CHECK(ok == cases[i].ok);
        }
        kaon_grammar_free(g);
        gbnf_text_free(&t);
    }
}

// Strings without maxLength hold at most max_string_length characters (default: no limit).
static void test_string_cap(void) {
    struct {
        const char *schema;
        int cap, len;
        bool ok;
    } cases[] = {
        {"{\"type\":\"string\"}", 5, 5, true},          {"{\"type\":\"string\"}", 5, 6, false},
        {"{\"type\":\"string\"}", -1, 300, true},       {"{\"type\":\"string\"}", 0, 300, true},
        {"{\"type\":\"string\"}", 128, 129, false},       {"{\"type\":\"string\",\"minLength\":8}", 5, 8, true},
        {"{\"type\":\"string\",\"minLength\":8}", 5, 9, false}, {"{\"type\":\"string\",\"maxLength\":300}", 5, 300, true},
        {"{\"type\":\"object\",\"additionalProperties\":true}", 5, 5, true},
    };
    char text[400];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kaon_json_schema_opts o = {.max_string_length = cases[i].cap};
        gbnf_text t = {0};
        CHECK(kaon_json_schema_to_gbnf(cases[i].schema, strlen(cases[i].schema), "root", &o, &t) == 0);
        kaon_grammar *g = kaon_grammar_parse(t.s, t.len, "root");
        CHECK(g != NULL);
        bool obj = strstr(cases[i].schema, "object") != NULL;
        int n = 0;
        n += snprintf(text + n, sizeof text - n, obj ? "{\"k\": \"" : "\"");
        for (int k = 0; k < cases[i].len; k++) text[n++] = 'a' + k % 26;
        snprintf(text + n, sizeof text - n, obj ? "\"}" : "\"");
        if (g) {
            bool ok = accepts(g, text);
            if (ok != cases[i].ok) fprintf(stderr, "string cap case %zu: %s\n", i, ok ? "accepted" : "rejected");
            CHECK(ok == cases[i].ok);
        }
        kaon_grammar_free(g);
        gbnf_text_free(&t);
    }
}

// Email addresses stay within RFC 5321: local part <= 64, the whole address <= 254 (5 labels of
// <= 37); a max_string_length below that shrinks them to it.
static void test_email_bounds(void) {
    char local64[65], label37[38], label38[39], text[600];
    memset(local64, 'a', 64), local64[64] = 0;
    memset(label37, 'b', 37), label37[37] = 0;
    memset(label38, 'b', 38), label38[38] = 0;
    struct {
        int cap;
        const char *local, *label;
        int labels;
        bool ok;
    } cases[] = {
        {0, local64, label37, 5, true},  {0, local64, label38, 2, false}, {0, "x", "b", 6, false},
        {0, "x", "b", 1, false},         {0, "a.b+c", "ex-1", 3, true},   {40, local64, "b", 2, false},
        {40, "aaaa", "bbb", 5, true},    {40, "a", "bbbb", 2, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kaon_json_schema_opts o = {.max_string_length = cases[i].cap};
        const char *schema = "{\"type\":\"string\",\"format\":\"email\"}";
        gbnf_text t = {0};
        CHECK(kaon_json_schema_to_gbnf(schema, strlen(schema), "root", &o, &t) == 0);
        kaon_grammar *g = kaon_grammar_parse(t.s, t.len, "root");
        CHECK(g != NULL);
        int n = snprintf(text, sizeof text, "\"%s@", cases[i].local);
        for (int k = 0; k < cases[i].labels; k++) n += snprintf(text + n, sizeof text - n, "%s%s", k ? "." : "", cases[i].label);
        snprintf(text + n, sizeof text - n, "\"");
        if (g) {
            bool ok = accepts(g, text);
            if (ok != cases[i].ok) fprintf(stderr, "email case %zu (%d chars): %s\n", i, n - 1, ok ? "accepted" : "rejected");
            CHECK(ok == cases[i].ok);
        }
        kaon_grammar_free(g);
        gbnf_text_free(&t);
    }
}

int main(void) {
    test_cases();
    test_ref_depth();
    test_string_cap();
    test_email_bounds();
    test_errors();
    test_any();
    if (kaon_test_failures) fprintf(stderr, "%d failures\n", kaon_test_failures);
    return kaon_test_failures ? 1 : 0;
}
