// Pre-tokenizer regexes: compiling HF's (Oniguruma-flavoured) split patterns for PCRE2, and
// the patterns each GGUF `tokenizer.ggml.pre` family stands for.
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/err.h"

// Unicode White_Space, which is what \s means to Oniguruma (and Rust's regex). PCRE2's \s
// under UCP also matches U+180E (a format char since Unicode 6.3), so spell the set out.
#define WS_SET "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

// The GPT-2 split (also what HF's ByteLevel pre-tokenizer uses with use_regex).
static const char PAT_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char PAT_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PAT_DSV3_DIGITS[] = "\\p{N}{1,3}";
static const char PAT_DSV3_CJK[] = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
static const char PAT_DSV3_MAIN[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Rewrites \s and \S into the White_Space set (inside a class, \s becomes the ranges; a \S
// inside a class is kept, the only difference being U+180E).
static char *adapt_pattern(const char *p, size_t n, size_t *out_len) {
    size_t ws = sizeof(WS_SET) - 1;
    size_t cap = n * (ws + 4) + 1;
    if (n > (SIZE_MAX - 1) / (ws + 4)) return NULL;
    char *o = malloc(cap);
    if (!o) return NULL;
    size_t m = 0;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '\\' && i + 1 < n) {
            char e = p[i + 1];
            if (e == 's' || (e == 'S' && !in_class)) {
                if (!in_class) o[m++] = '[';
                if (e == 'S') o[m++] = '^';
                memcpy(o + m, WS_SET, ws);
                m += ws;
                if (!in_class) o[m++] = ']';
            } else {
                o[m++] = ch;
                o[m++] = e;
            }
            i++;
            continue;
        }
        if (!in_class && ch == '[') {
            in_class = true;
            o[m++] = ch;
            // A ']' right after '[' or '[^' is a literal.
            if (i + 1 < n && p[i + 1] == '^') o[m++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') o[m++] = p[++i];
            continue;
        }
        if (in_class && ch == ']') in_class = false;
        o[m++] = ch;
    }
    o[m] = 0;
    *out_len = m;
    return o;
}

static pcre2_code *compile_raw(const char *pat, size_t len, uint32_t extra) {
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | extra, &err,
                                   &eoff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        kaon_set_error("tokenizer: cannot compile split regex at offset %zu: %s", (size_t)eoff, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
    return re;
}

pcre2_code *tk_regex_compile(const char *pat, size_t len) {
    size_t n;
    char *p = adapt_pattern(pat, len, &n);
    if (!p) { kaon_set_error("tokenizer: out of memory"); return NULL; }
    pcre2_code *re = compile_raw(p, n, 0);
    free(p);
    return re;
}

static int add_step(kaon_tokenizer *t, pcre2_code *re, int behavior, bool invert) {
    if (!re) return -1;
    if (t->n_steps >= TK_MAX_STEPS) {
        pcre2_code_free(re);
        return kaon_set_error("tokenizer: more than %d pre-tokenizer steps", TK_MAX_STEPS);
    }
    tk_step *s = &t->steps[t->n_steps++];
    memset(s, 0, sizeof *s);
    s->kind = STEP_SPLIT;
    s->re = re;
    s->behavior = behavior;
    s->invert = invert;
    return 0;
}

int tk_add_split_step(kaon_tokenizer *t, const char *pat, size_t len, int behavior, bool invert) {
    return add_step(t, tk_regex_compile(pat, len), behavior, invert);
}

// A literal split string (HF Split with {"String": ...}).
int tk_add_literal_split_step(kaon_tokenizer *t, const char *s, size_t len, int behavior, bool invert) {
    if (len == 0) return 0;  // HF: an empty pattern matches nothing
    return add_step(t, compile_raw(s, len, PCRE2_LITERAL), behavior, invert);
}

static int add_pat(kaon_tokenizer *t, const char *pat) {
    return tk_add_split_step(t, pat, strlen(pat), SPLIT_ISOLATED, false);
}

int tk_steps_for_gguf_pre(kaon_tokenizer *t, const char *pre) {
    if (!strcmp(pre, "gpt2") || !strcmp(pre, "default") || !strcmp(pre, "gpt-2"))
        return add_pat(t, PAT_GPT2);
    if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder") || !strcmp(pre, "refact") ||
        !strcmp(pre, "codeshell")) {
        // HF: Digits(individual_digits=True) then ByteLevel's GPT-2 split.
        if (add_pat(t, "\\p{N}")) return -1;
        return add_pat(t, PAT_GPT2);
    }
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3") ||
        !strcmp(pre, "dbrx") || !strcmp(pre, "smaug-bpe"))
        return add_pat(t, PAT_LLAMA3);
    if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen") || !strcmp(pre, "stablelm2"))
        return add_pat(t, PAT_QWEN2);
    if (!strcmp(pre, "deepseek-v3")) {
        if (add_pat(t, PAT_DSV3_DIGITS) || add_pat(t, PAT_DSV3_CJK)) return -1;
        return add_pat(t, PAT_DSV3_MAIN);
    }
    return kaon_set_error("tokenizer: unknown GGUF pre-tokenizer '%s' (tokenizer.ggml.pre)", pre);
}

void tk_steps_free(kaon_tokenizer *t) {
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    t->n_steps = 0;
}
