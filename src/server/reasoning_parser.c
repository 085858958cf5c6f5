#include "server/reasoning_parser.h"

#include <stdlib.h>
#include <string.h>

#include "server/json_scan.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

enum {
    R_START,    // leading whitespace, then maybe <think>
    R_REASON,   // inside the block, up to </think>
    R_AFTER,    // whitespace after </think>
    R_CONTENT,  // everything else
};

struct kaon_reasoning_parser {
    kaon_reasoning_family fam;
    kaon_sbuf buf;      // the bytes not yet settled
    int state;
    bool inside;        // R_START: the prompt opened the block already
    bool saw;
    bool oom;
};

const char kaon_reasoning_family_names[] = "deepseek_r1, qwen3";

int kaon_reasoning_family_from_name(const char *name, kaon_reasoning_family *out) {
    if (!name) return -1;
    if (!strcmp(name, "none")) *out = KAON_REASONING_NONE;
    else if (!strcmp(name, "deepseek_r1")) *out = KAON_REASONING_DEEPSEEK_R1;
    else if (!strcmp(name, "qwen3")) *out = KAON_REASONING_QWEN3;
    else return -1;
    return 0;
}

const char *kaon_reasoning_family_name(kaon_reasoning_family f) {
    switch (f) {
    case KAON_REASONING_DEEPSEEK_R1: return "deepseek_r1";
    case KAON_REASONING_QWEN3: return "qwen3";
    default: return "none";
    }
}

kaon_reasoning_family kaon_reasoning_family_detect(const char *src) {
    if (!src || !strstr(src, THINK_CLOSE)) return KAON_REASONING_NONE;
    // DeepSeek's role markers use fullwidth bars: <｜Assistant｜>.
    return strstr(src, "\xef\xbd\x9c" "Assistant\xef\xbd\x9c") ? KAON_REASONING_DEEPSEEK_R1
                                                               : KAON_REASONING_QWEN3;
}

static bool ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

kaon_reasoning_start kaon_reasoning_start_from_prompt(const char *prompt, size_t len) {
    while (len && kaon_json_is_ws(prompt[len - 1])) len--;
    if (ends_with(prompt, len, THINK_OPEN)) return KAON_REASONING_START_INSIDE;
    if (ends_with(prompt, len, THINK_CLOSE)) return KAON_REASONING_START_CLOSED;
    return KAON_REASONING_START_OPEN;
}

kaon_reasoning_parser *kaon_reasoning_parser_new(kaon_reasoning_family f, kaon_reasoning_start s) {
    if (f == KAON_REASONING_NONE) return NULL;
    kaon_reasoning_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->fam = f;
    p->state = s == KAON_REASONING_START_CLOSED ? R_CONTENT : R_START;
    p->inside = s == KAON_REASONING_START_INSIDE;
    return p;
}

void kaon_reasoning_parser_free(kaon_reasoning_parser *p) {
    if (!p) return;
    kaon_sbuf_free(&p->buf);
    free(p);
}

bool kaon_reasoning_parser_saw_reasoning(const kaon_reasoning_parser *p) { return p && p->saw; }

static void put(kaon_reasoning_parser *p, kaon_sbuf *to, size_t n) {
    if (n && kaon_sbuf_append(to, p->buf.data, n) < 0) p->oom = true;
    kaon_sbuf_consume(&p->buf, n);
}

// One step over the unsettled bytes: 1 when it made progress, 0 when it needs more.
static int step(kaon_reasoning_parser *p, bool final, kaon_sbuf *reasoning, kaon_sbuf *content) {
    const char *s = p->buf.data;
    size_t n = p->buf.len;
    if (!n) return 0;
    switch (p->state) {
    case R_START: {
        size_t i = 0, k = strlen(THINK_OPEN);
        while (i < n && kaon_json_is_ws(s[i])) i++;
        size_t m = n - i < k ? n - i : k;
        bool prefix = !memcmp(s + i, THINK_OPEN, m);
        if (prefix && m < k && !final) return 0;  // may still become <think>
        if (prefix && m == k) {
            kaon_sbuf_consume(&p->buf, i + k);
            p->state = R_REASON;
        } else {
            p->state = p->inside ? R_REASON : R_CONTENT;
        }
        p->saw |= p->state == R_REASON;
        return 1;
    }
    case R_REASON: {
        const char *f = memmem(s, n, THINK_CLOSE, strlen(THINK_CLOSE));
        if (f) {
            put(p, reasoning, (size_t)(f - s));
            kaon_sbuf_consume(&p->buf, strlen(THINK_CLOSE));
            p->state = R_AFTER;
            return 1;
        }
        size_t keep = 0;
        for (size_t t = strlen(THINK_CLOSE) - 1; !final && t > 0; t--)
            if (t <= n && !memcmp(s + n - t, THINK_CLOSE, t)) {
                keep = t;
                break;
            }
        put(p, reasoning, n - keep);
        return 0;
    }
    case R_AFTER: {
        size_t i = 0;
        while (i < n && kaon_json_is_ws(s[i])) i++;
        kaon_sbuf_consume(&p->buf, i);
        if (i == n) return 0;
        p->state = R_CONTENT;
        return 1;
    }
    default:
        put(p, content, n);
        return 0;
    }
}

static int run(kaon_reasoning_parser *p, bool final, kaon_sbuf *reasoning, kaon_sbuf *content) {
    while (step(p, final, reasoning, content)) {}
    return p->oom || reasoning->failed || content->failed ? -1 : 0;
}

int kaon_reasoning_parser_feed(kaon_reasoning_parser *p, const char *text, size_t n,
                               kaon_sbuf *reasoning, kaon_sbuf *content) {
    if (n && kaon_sbuf_append(&p->buf, text, n) < 0) return -1;
    return run(p, false, reasoning, content);
}

int kaon_reasoning_parser_finish(kaon_reasoning_parser *p, kaon_sbuf *reasoning,
                                 kaon_sbuf *content) {
    return run(p, true, reasoning, content);
}
