// Unit tests of the chat-template interpreter (whitespace control, scoping, loop variables,
// filters, Python value printing, errors, limits), plus a driver mode used by
// tests/ref/test_chat_templates.py to compare renderings with jinja2:
//   test_chat_template --render TEMPLATE_FILE CONTEXT_JSON_FILE
// prints the rendering to stdout, or the error to stderr with exit status 3.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "test.h"
#include "template/chat_template.h"
#include "util/err.h"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

static int render_mode(const char *tpath, const char *cpath) {
    size_t tl, cl;
    char *tsrc = read_file(tpath, &tl), *csrc = read_file(cpath, &cl);
    if (!tsrc || !csrc) {
        fprintf(stderr, "cannot read %s or %s\n", tpath, cpath);
        return 2;
    }
    cJSON *ctx = cJSON_ParseWithLength(csrc, cl);
    if (!ctx) {
        fprintf(stderr, "bad context JSON in %s\n", cpath);
        return 2;
    }
    int rc = 0;
    kaon_chat_template *t = kaon_chat_template_parse(tsrc, tl);
    if (!t) {
        fprintf(stderr, "%s\n", kaon_last_error());
        rc = 3;
    } else {
        char *out;
        size_t n;
        if (kaon_chat_template_render(t, ctx, &out, &n) < 0) {
            fprintf(stderr, "%s\n", kaon_last_error());
            rc = 3;
        } else {
            fwrite(out, 1, n, stdout);
            free(out);
        }
        kaon_chat_template_free(t);
    }
    cJSON_Delete(ctx);
    free(tsrc);
    free(csrc);
    return rc;
}

// Renders `tmpl` with the JSON context `ctx` (NULL: empty); returns malloc'd output or NULL.
static char *render(const char *tmpl, const char *ctx) {
    kaon_chat_template *t = kaon_chat_template_parse(tmpl, strlen(tmpl));
    if (!t) return NULL;
    cJSON *c = ctx ? cJSON_Parse(ctx) : NULL;
    if (ctx && !c) {
        fprintf(stderr, "bad test JSON: %s\n", ctx);
        kaon_chat_template_free(t);
        return NULL;
    }
    char *out = NULL;
    size_t n;
    if (kaon_chat_template_render(t, c, &out, &n) < 0) out = NULL;
    cJSON_Delete(c);
    kaon_chat_template_free(t);
    return out;
}

static int expect(const char *tmpl, const char *ctx, const char *want, int line) {
    char *got = render(tmpl, ctx);
    int ok = got && !strcmp(got, want);
    if (!ok) {
        fprintf(stderr, "test_chat_template.c:%d: template %.300s\n  want [%s]\n  got  [%s]%s%s\n", line, tmpl, want,
                got ? got : "(error)", got ? "" : " ", got ? "" : kaon_last_error());
        kaon_test_failures++;
    }
    free(got);
    return ok;
}
#define EXPECT(t, c, w) expect((t), (c), (w), __LINE__)

// Expects parse or render to fail with an error message containing `frag`.
static void expect_error(const char *tmpl, const char *ctx, const char *frag, int line) {
    char *got = render(tmpl, ctx);
    const char *err = kaon_last_error();
    if (got || !strstr(err, frag)) {
        fprintf(stderr, "test_chat_template.c:%d: template %.200s\n  want an error containing [%s]\n  got  [%.200s] / error [%s]\n",
                line, tmpl, frag, got ? got : "(error)", err);
        kaon_test_failures++;
    }
    free(got);
}
#define EXPECT_ERROR(t, c, f) expect_error((t), (c), (f), __LINE__)

static void test_whitespace(void) {
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before it
    EXPECT("{% if true %}\nA\n{% endif %}\nB", NULL, "A\nB");
    EXPECT("  {% if true %}\n  x\n  {% endif %}\n", NULL, "  x\n");
    EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    EXPECT("a {{- 'x' -}} b", NULL, "axb");
    EXPECT("a\n  {{ 'x' }}\n", NULL, "a\n  x");            // lstrip does not apply to {{ }}
    EXPECT("  {%+ if true %}x{% endif %}", NULL, "  x");    // + disables lstrip_blocks
    EXPECT("{% if true +%}\nx{% endif %}", NULL, "\nx");    // + disables trim_blocks
    EXPECT("a{# comment #}\nb", NULL, "ab");
    EXPECT("a {#- c -#} b", NULL, "ab");
    EXPECT("{% raw %}{{ not evaluated }}{% endraw %}", NULL, "{{ not evaluated }}");
    EXPECT("x\r\ny\r\n", NULL, "x\ny");  // newlines normalised, one trailing newline dropped
    EXPECT("x\n\n", NULL, "x\n");
}

static void test_expressions(void) {
    EXPECT("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 3 ** 2 }}", NULL,
           "7 3 -4 2 3.5 64");
    EXPECT("{{ 'a' ~ 1 ~ none ~ true }}", NULL, "a1NoneTrue");
    EXPECT("{{ 'ab' * 3 }}|{{ [1] + [2] }}|{{ (1, 'a') }}|{{ (1,) }}", NULL, "ababab|[1, 2]|(1, 'a')|(1,)");
    EXPECT("{{ {'a': 1, 'b': [true, none, 1.5, \"it's\"]} }}", NULL, "{'a': 1, 'b': [True, None, 1.5, \"it's\"]}");
    EXPECT("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 2.0 }} {{ 1.5e16 }}", NULL,
           "1e+20 0.30000000000000004 1e-05 2.0 1.5e+16");
    EXPECT("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}", NULL, "True True True True");
    EXPECT("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' == 'a' }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }}", NULL,
           "True False True True True");
    EXPECT("{{ 0 or 'x' }} {{ 'y' and 0 }} {{ not none }}", NULL, "x 0 True");
    EXPECT("{{ 'yes' if 1 else 'no' }}{{ 'hidden' if 0 }}", NULL, "yes");
    EXPECT("{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1, 2, 3][-1] }} {{ 'héllo'[1] }}", NULL, "el olleh 3 é");
    EXPECT("{{ 'a\\tb\\n' | tojson }} {{ '\\u00e9' }}", NULL, "\"a\\tb\\n\" é");
    EXPECT("{{ \"x\" 'y' }}", NULL, "xy");  // adjacent literals concatenate
}

static void test_statements(void) {
    EXPECT("{% set x = 1 %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %}", NULL, "one");
    EXPECT("{% for i in range(3) %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
           "{{ loop.length }}{{ loop.revindex }},{% endfor %}",
           NULL, "10TrueFalse33,21FalseFalse32,32FalseTrue31,");
    EXPECT("{% for i in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", NULL, "-2;1-3;2-;");
    EXPECT("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}", NULL, "2242");
    EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    EXPECT("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL, "a=1;b=2;");
    EXPECT("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}"
           "{{ i }}{% endfor %}",
           NULL, "02");
    // for-loop scope: a set inside the body does not leak; a namespace does
    EXPECT("{% set x = 0 %}{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set x = i %}{% set ns.x = ns.x + i %}"
           "{% endfor %}{{ x }} {{ ns.x }}",
           NULL, "0 3");
    EXPECT("{% set s %}a{{ 1 + 1 }}{% endset %}[{{ s }}]", NULL, "[a2]");
    EXPECT("{% set a, b = 1, 2 %}{{ b }}{{ a }}", NULL, "21");
    EXPECT("{% macro m(a, b='d') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}{{ m(b=3, a=4) }}", NULL,
           "<1d><12><43>");
    EXPECT("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}", NULL, "[in]");
    EXPECT("{% macro v() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, k=3) }}", NULL, "(1, 2){'k': 3}");
    EXPECT("{% filter upper %}ab{% endfilter %}", NULL, "AB");
    EXPECT("{% with a = 5 %}{{ a }}{% endwith %}{{ a }}", NULL, "5");
    EXPECT("{% if x is defined %}d{% else %}u{% endif %}{{ x }}", NULL, "u");
    // transformers' {% generation %} marker renders its body in place
    EXPECT("a{% generation %}b{% endgeneration %}c", NULL, "abc");
}

static void test_filters(void) {
    EXPECT("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ [1, 'a'] | length }}|{{ 'héllo' | length }}", NULL,
           "a b|a|2|5");
    EXPECT("{{ x | default('d') }} {{ '' | default('e', true) }} {{ 0 | d(1) }}", NULL, "d e 0");
    EXPECT("{{ [3, 1, 2] | sort | join(',') }} {{ ['b', 'A', 'a'] | unique | list }} {{ [1, 2] | reverse | list }}", NULL,
           "1,2,3 ['b', 'A'] [2, 1]");
    EXPECT("{{ {'b': 1, 'a': 2} | dictsort }} {{ {'a': 1} | items | list }}", NULL,
           "[('a', 2), ('b', 1)] [('a', 1)]");
    EXPECT("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('+') }}",
           "{\"msgs\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"bot\", \"content\": \"b\"},"
           " {\"role\": \"user\", \"content\": \"c\"}]}",
           "a+c");
    EXPECT("{{ msgs | rejectattr('role', 'equalto', 'user') | list | length }}",
           "{\"msgs\": [{\"role\": \"user\"}, {\"role\": \"bot\"}]}", "1");
    EXPECT("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | map('string') | join }}", NULL, "[1, 3] 123");
    EXPECT("{{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ 'a-b c' | title }} {{ 'Ab' | upper }}{{ 'Ab' | lower }}",
           NULL, "Hello World Hello A-B C ABab");
    EXPECT("{{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int(7) }} {{ '2.5' | float }} {{ 3.7 | round }} "
           "{{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ -3 | abs }}",
           NULL, "43 4 7 2.5 4.0 2.0 3.14 3");
    EXPECT("{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}", NULL, "a\n  b|  a\n  b");
    EXPECT("{{ '<a href=\"x\">&' | e }}", NULL, "&lt;a href=&#34;x&#34;&gt;&amp;");
    EXPECT("{{ 'a.b.c' | replace('.', '/') }} {{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }} {{ [4, 1] | max }}{{ [4, 1] | min }} "
           "{{ [1, 2.5] | sum }}",
           NULL, "a/b/c 13 41 3.5");
    EXPECT("{{ '%s-%d' | format('a', 3) }} {{ 'x=%s' % 5 }}", NULL, "a-3 x=5");
}

static void test_json(void) {
    const char *ctx = "{\"t\": {\"name\": \"f\", \"params\": {\"a\": [1, 2.5, null, true], \"s\": \"é\\\"\"}}}";
    EXPECT("{{ t | tojson }}", ctx, "{\"name\": \"f\", \"params\": {\"a\": [1, 2.5, null, true], \"s\": \"é\\\"\"}}");
    EXPECT("{{ t | tojson(indent=2) }}", ctx,
           "{\n  \"name\": \"f\",\n  \"params\": {\n    \"a\": [\n      1,\n      2.5,\n      null,\n      true\n"
           "    ],\n    \"s\": \"é\\\"\"\n  }\n}");
    EXPECT("{{ t.params.s | tojson(ensure_ascii=true) }}", ctx, "\"\\u00e9\\\"\"");
    EXPECT("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} {{ [] | tojson(indent=4) }}", NULL, "{\"a\": 2, \"b\": 1} []");
}

static void test_methods(void) {
    EXPECT("{{ ' a '.strip() }}|{{ 'xay'.strip('xy') }}|{{ '\\n\\na'.lstrip('\\n') }}|{{ 'a\\n'.rstrip() }}", NULL, "a|a|a|a");
    EXPECT("{{ 'a</think>b</think>c'.split('</think>') }} {{ ' a  b '.split() }} {{ 'a,b,c'.rsplit(',', 1) }}", NULL,
           "['a', 'b', 'c'] ['a', 'b'] ['a,b', 'c']");
    EXPECT("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }} {{ 'abcabc'.find('c') }}{{ 'abc'.count('b') }}",
           NULL, "TrueTrue 21");
    EXPECT("{{ 'a b'.upper() }} {{ 'they\\'re'.title() }} {{ '-'.join(['a', 'b']) }} {{ '{}+{x}'.format(1, x=2) }}",
           NULL, "A B They'Re a-b 1+2");
    EXPECT("{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 9) }}{{ {'a': 1}.get('b') }} {{ {'a': 1}.keys() | list }}", NULL,
           "19None ['a']");
}

static void test_undefined(void) {
    EXPECT("[{{ missing }}]{{ missing | length }}{{ missing is defined }}{% for x in missing %}x{% endfor %}", NULL,
           "[]0False");
    EXPECT("{{ d.nokey }}|{{ d['nokey'] }}|{{ l[5] }}|{{ none.attr }}", "{\"d\": {}, \"l\": []}", "|||");
    EXPECT_ERROR("{{ missing.attr }}", NULL, "'missing' is undefined");
    EXPECT_ERROR("{{ missing + 1 }}", NULL, "'missing' is undefined");
    EXPECT_ERROR("{{ missing() }}", NULL, "'missing' is undefined");
}

static void test_errors(void) {
    EXPECT_ERROR("{% whlie x %}", NULL, "line 1: unknown tag 'whlie'");
    EXPECT_ERROR("a\nb\n{% whlie x %}", NULL, "chat template line 3: unknown tag 'whlie'");
    EXPECT_ERROR("{% for x in y %}", NULL, "'endfor'");
    EXPECT_ERROR("{% endif %}", NULL, "unexpected tag 'endif'");
    EXPECT_ERROR("{{ 1 + }}", NULL, "unexpected");
    EXPECT_ERROR("{{ 'unterminated }}", NULL, "unexpected char");
    EXPECT_ERROR("{{ (1 }}", NULL, "line 1");
    EXPECT_ERROR("{% break %}", NULL, "'break' outside loop");
    EXPECT_ERROR("{{ x | nosuchfilter }}", NULL, "unsupported filter 'nosuchfilter'");
    EXPECT_ERROR("{{ x is nosuchtest }}", NULL, "unsupported test 'nosuchtest'");
    EXPECT_ERROR("{{ 'a'.nosuchmethod() }}", NULL, "'str' object has no attribute 'nosuchmethod'");
    EXPECT_ERROR("{{ 'a'.encode() }}", NULL, "not supported");
    EXPECT_ERROR("{{ x is defined 1 }}", NULL, "takes no arguments");
    EXPECT_ERROR("{{ messages[0].role }}", "{\"messages\": []}", "'list' object has no element 0");
    EXPECT_ERROR("{% include 'x' %}", NULL, "unsupported tag 'include'");
    EXPECT_ERROR("{{ raise_exception('Only user and assistant roles are supported!') }}", NULL,
                 "Only user and assistant roles are supported!");
    EXPECT_ERROR("{{ 'a' + 1 }}", NULL, "unsupported operand type(s) for +: 'str' and 'int'");
    EXPECT_ERROR("{{ 1 / 0 }}", NULL, "division by zero");
    EXPECT_ERROR("{% set x = 1 %}{% set x.a = 2 %}", NULL, "non-namespace");
    // the immutable sandbox refuses list.append, like transformers' environment
    EXPECT_ERROR("{% set l = [] %}{% set _ = l.append(1) %}", NULL, "unsafe");
    EXPECT_ERROR("{{ none | tojson }}{{ x | tojson }}", NULL, "not JSON serializable");
    EXPECT_ERROR("{{ [1, 2] < 'a' }}", NULL, "not supported between");
    EXPECT_ERROR("{{ -'a' }}", NULL, "bad operand type for unary -: 'str'");
    EXPECT_ERROR("{{ {[1]: 2} }}", NULL, "unhashable type: 'list'");
    EXPECT_ERROR("{{ dict([[1, 2, 3]]) }}", NULL, "has length 3; 2 is required");
    EXPECT_ERROR("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, "too many values to unpack");
    EXPECT_ERROR("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, "takes not more than 1 argument");
}

static void test_limits(void) {
    clock_t t0 = clock();
    // range() is capped like jinja2's sandbox (MAX_RANGE = 100000)
    EXPECT_ERROR("{% for i in range(100000000) %}x{% endfor %}", NULL, "Range too big");
    // nested loops: the iteration budget stops them
    EXPECT_ERROR("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL,
                 "loop iterations");
    // unbounded macro recursion
    EXPECT_ERROR("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, "nested too deep");
    // deep expressions inside recursion stop at the stack budget, not at a crash
    {
        static char t[200000];
        size_t k = (size_t)snprintf(t, sizeof t, "{%% macro r(n) %%}{{ (r(n + 1) ~ '')");
        for (int i = 0; i < 250; i++) k += (size_t)snprintf(t + k, sizeof t - k, "|trim");
        snprintf(t + k, sizeof t - k, " }}{%% endmacro %%}{{ r(0) }}");
        EXPECT_ERROR(t, NULL, "nested too deep");
        k = (size_t)snprintf(t, sizeof t, "{{ ");
        for (int i = 0; i < 5000; i++) k += (size_t)snprintf(t + k, sizeof t - k, "x[");
        EXPECT_ERROR(t, NULL, "nested too deep");  // the parser recursion is bounded too
        k = (size_t)snprintf(t, sizeof t, "{{ ");
        for (int i = 0; i < 5000; i++) k += (size_t)snprintf(t + k, sizeof t - k, "f(");
        EXPECT_ERROR(t, NULL, "nested too deep");
    }
    // output and string size caps
    EXPECT_ERROR("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", NULL, "exceeds");
    EXPECT_ERROR("{{ 'x' * 100000000 }}", NULL, "limit");
    EXPECT("[{{ '' * 1000000000000000000 }}{{ [] * 1000000000000000000 }}]", NULL, "[[]]");
    EXPECT_ERROR("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL,
                 "limit");
    // deep nesting is refused at parse time instead of overflowing the C stack
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    EXPECT_ERROR(deep, NULL, "nested too deep");
    k = 0;
    for (int i = 0; i < 300 && k + 40 < sizeof deep; i++) k += (size_t)snprintf(deep + k, sizeof deep - k, "{%% if 1 %%}");
    EXPECT_ERROR(deep, NULL, "nested too deep");
    char chain[8192];
    k = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 1000; i++) k += (size_t)snprintf(chain + k, sizeof chain - k, "+1");
    snprintf(chain + k, sizeof chain - k, " }}");
    EXPECT_ERROR(chain, NULL, "nested too deep");
    // a namespace that holds itself prints like CPython's recursion guard and is freed
    // (no leak under ASan)
    EXPECT("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", NULL, "<Namespace {'me': <Namespace {...}>}>");
    // chains through bound methods and loop objects count as nesting too (their release
    // recurses)
    EXPECT_ERROR("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v.copy] %}{% endfor %}", NULL,
                 "nested deeper");
    EXPECT_ERROR("{% set ns = namespace(v=[]) %}{% for i in range(3000) %}{% for x in [ns.v] %}{% set ns.v = [loop] %}"
                 "{% endfor %}{% endfor %}",
                 NULL, "nested deeper");
    // values nested deeper than the cap are refused
    EXPECT_ERROR("{% set ns = namespace(v=1) %}{% for i in range(2000) %}{% set ns.v = [ns.v] %}{% endfor %}", NULL,
                 "nested deeper");
    // work inside builtins counts against the step budget: no quadratic hangs
    EXPECT_ERROR("{% set big = range(100000) | list %}{% for i in range(100000) %}{% if -1 in big %}{% endif %}{% endfor %}",
                 NULL, "evaluation steps");
    EXPECT_ERROR("{% set s = 'ab' * 4000000 %}{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}{% endfor %}", NULL,
                 "evaluation steps");
    // ... and the string searches are linear even with long needles
    EXPECT("{% set s = 'a' * 4000000 %}{{ s.rsplit('a' * 2000000) | length }} {{ s.rfind('a' * 3000000) }} "
           "{{ s.rpartition('a' * 3999999)[2] }} {{ (s ~ 'b').strip('ab' * 100000) | length }} "
           "{{ range(100000) | unique | list | length }}",
           NULL, "3 1000000  0 100000");
    // a namespace string grown step by step is extended in place: linear, not quadratic
    EXPECT("{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxxxxxx' %}"
           "{% endfor %}{{ ns.s | length }}",
           NULL, "2000000");
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(secs < 20.0);
    printf("limit tests: %.2f s\n", secs);
}

static void test_default_template(void) {
    const char *ctx = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"hi\"}],"
                      " \"add_generation_prompt\": true}";
    EXPECT(kaon_default_chat_template, ctx,
           "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

static bool has_gemma_turns(const char *text, void *ctx) {
    (void)ctx;
    return !strcmp(text, "<start_of_turn>") || !strcmp(text, "<end_of_turn>");
}

static bool has_chatml(const char *text, void *ctx) {
    (void)ctx;
    return !strcmp(text, "<|im_start|>");
}

static bool has_both(const char *text, void *ctx) {
    return has_gemma_turns(text, ctx) || has_chatml(text, ctx);
}

// A model without a template gets Gemma's turn format when its vocabulary has Gemma's turn
// markers (and not ChatML's), else ChatML; the Gemma format folds a system message into the
// first user turn, names assistant turns "model" and trims contents.
static void test_fallback_template(void) {
    CHECK(kaon_fallback_chat_template(has_gemma_turns, NULL) == kaon_gemma_chat_template);
    CHECK(kaon_fallback_chat_template(has_chatml, NULL) == kaon_default_chat_template);
    CHECK(kaon_fallback_chat_template(has_both, NULL) == kaon_default_chat_template);
    CHECK(kaon_fallback_chat_template(NULL, NULL) == kaon_default_chat_template);
    const char *ctx = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                      " {\"role\": \"user\", \"content\": \" hi \"}, {\"role\": \"assistant\", \"content\": \"Hello\"},"
                      " {\"role\": \"user\", \"content\": \"2+2?\"}],"
                      " \"add_generation_prompt\": true, \"bos_token\": \"<bos>\"}";
    EXPECT(kaon_gemma_chat_template, ctx,
           "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
           "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
    EXPECT(kaon_gemma_chat_template, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"bos_token\": \"<bos>\"}",
           "<bos><start_of_turn>user\nx<end_of_turn>\n");
}

static void test_reuse_and_api(void) {
    // one parsed template renders many contexts; NULL context works; errors are reported
    kaon_chat_template *t = kaon_chat_template_parse("{{ x }}", 7);
    CHECK(t != NULL);
    char *out;
    size_t n;
    for (int i = 0; i < 3; i++) {
        char js[32];
        snprintf(js, sizeof js, "{\"x\": %d}", i);
        cJSON *c = cJSON_Parse(js);
        CHECK(kaon_chat_template_render(t, c, &out, &n) == 0);
        CHECK(n == 1 && out[0] == '0' + i);
        free(out);
        cJSON_Delete(c);
    }
    CHECK(kaon_chat_template_render(t, NULL, &out, &n) == 0 && n == 0 && out[0] == 0);
    free(out);
    cJSON *arr = cJSON_CreateArray();
    CHECK(kaon_chat_template_render(t, arr, &out, &n) == -1 && out == NULL);
    cJSON_Delete(arr);
    kaon_chat_template_free(t);
    kaon_chat_template_free(NULL);
    CHECK(kaon_chat_template_parse(NULL, 5) == NULL);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--render")) return render_mode(argv[2], argv[3]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--render TEMPLATE_FILE CONTEXT_JSON_FILE]\n", argv[0]);
        return 2;
    }
    test_whitespace();
    test_expressions();
    test_statements();
    test_filters();
    test_json();
    test_methods();
    test_undefined();
    test_errors();
    test_limits();
    test_default_template();
    test_fallback_template();
    test_reuse_and_api();
    TEST_MAIN_END();
}
