// Tokens counted in code points of one class (gram_units, grammar_internal.h): a bounded
// repetition whose units are single code points of that class decides such a token near its
// bound by the count alone, without walking it.
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

// The decoding of a token's first d bytes: code points read, whether all are in the class
// so far, and a code point in progress (the matcher's rules: no overlong forms, surrogates or
// values past U+10FFFF). Kept per depth so the next token in vocabulary order resumes at the
// prefix it shares with this one.
typedef struct {
    int32_t n;
    uint32_t cp;
    uint8_t rem, len;
    bool ok;
} decode_state;

static decode_state decode_byte(const kaon_grammar *g, int cs, decode_state s, uint8_t c) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (!s.rem) {
        if (c < 0x80) {
            s.ok = g->charsets[cs].ascii[c >> 5] >> (c & 31) & 1;
            s.n++;
            return s;
        }
        if (c >= 0xC2 && c <= 0xDF) s.cp = c & 0x1Fu, s.rem = 1, s.len = 2;
        else if ((c & 0xF0) == 0xE0) s.cp = c & 0x0Fu, s.rem = 2, s.len = 3;
        else if (c >= 0xF0 && c <= 0xF4) s.cp = c & 0x07u, s.rem = 3, s.len = 4;
        else s.ok = false;
        return s;
    }
    if ((c & 0xC0) != 0x80) {
        s.ok = false;
        return s;
    }
    s.cp = s.cp << 6 | (c & 0x3Fu);
    if (--s.rem) return s;
    s.ok = s.cp >= min_cp[s.len] && s.cp <= 0x10FFFF && !(s.cp >= 0xD800 && s.cp <= 0xDFFF) && gram_charset_has(g, cs, s.cp);
    s.n++;
    return s;
}

static void units_free(gram_units *u) {
    free(u->cps);
    free(u->by_cps);
    free(u->cps_start);
    free(u->other);
    free(u->other_lcp);
    free(u->other_by_len);
    free(u->other_at_least);
    free(u->le_bits);
    free(u->pure_bits);
}

// The other tokens longest first (a counting sort by length), for copies that walk only the
// long ones.
static int other_by_length(gram_units *u, const kaon_grammar_vocab *v, int max_len) {
    u->max_len = max_len;
    u->other_by_len = malloc((size_t)(u->n_other + 1) * sizeof *u->other_by_len);
    u->other_at_least = calloc((size_t)max_len + 2, sizeof *u->other_at_least);
    int32_t *fill = malloc(((size_t)max_len + 2) * sizeof *fill);
    if (!u->other_by_len || !u->other_at_least || !fill) {
        free(fill);
        return -1;
    }
    for (int j = 0; j < u->n_other; j++) u->other_at_least[v->olens[u->other[j]]]++;
    for (int l = max_len - 1; l >= 0; l--) u->other_at_least[l] += u->other_at_least[l + 1];
    // tokens of length l fill other_by_len[other_at_least[l + 1] .. other_at_least[l])
    for (int l = 0; l <= max_len; l++) fill[l] = u->other_at_least[l + 1];
    for (int j = 0; j < u->n_other; j++) u->other_by_len[fill[v->olens[u->other[j]]]++] = u->other[j];
    free(fill);
    return 0;
}

static int units_build(gram_units *u, const kaon_grammar *g, const kaon_grammar_vocab *v, int cs) {
    memset(u, 0, sizeof *u);
    int n = v->n_order, max_len = 0;
    for (int r = 0; r < n; r++)
        if ((int)v->olens[r] > max_len) max_len = (int)v->olens[r];
    decode_state *at = malloc((size_t)(max_len + 1) * sizeof *at);
    u->cps_start = calloc(GRAM_UNITS_MAX + 2, sizeof *u->cps_start);
    u->by_cps = malloc((size_t)(n + 1) * sizeof *u->by_cps);
    u->cps = malloc((size_t)(n + 1) * sizeof *u->cps);
    u->other = malloc((size_t)(n + 1) * sizeof *u->other);
    u->other_lcp = malloc((size_t)(n + 1) * sizeof *u->other_lcp);
    if (!at || !u->cps_start || !u->by_cps || !u->cps || !u->other || !u->other_lcp) {
        free(at);
        units_free(u);
        return -1;
    }
    at[0] = (decode_state){.ok = true};
    uint32_t run = 0;  // least lcp since the last other token (their common prefix)
    int valid = 0;     // at[0 .. valid] decode the previous token's bytes (it stopped there)
    for (int r = 0; r < n; r++) {
        int len = (int)v->olens[r], d = v->lcp[r] < valid ? v->lcp[r] : valid;
        decode_state s = at[d];
        for (; d < len && s.ok; d++) at[d + 1] = s = decode_byte(g, cs, s, v->obytes[r][d]);
        valid = d;
        bool pure = s.ok && !s.rem && s.n <= GRAM_UNITS_MAX;
        u->cps[r] = (uint8_t)(pure ? s.n : GRAM_UNITS_OTHER);
        if (v->lcp[r] < run) run = v->lcp[r];
        if (pure) {
            u->cps_start[s.n + 1]++;
            continue;
        }
        u->other[u->n_other] = r;
        u->other_lcp[u->n_other] = (uint16_t)(u->n_other ? run : 0);
        u->n_other++;
        run = UINT32_MAX;
    }
    free(at);
    if (other_by_length(u, v, max_len)) {
        units_free(u);
        return -1;
    }
    for (int c = 0; c <= GRAM_UNITS_MAX; c++) u->cps_start[c + 1] += u->cps_start[c];
    // ids by count, a counting sort: next[c] is the next free slot of count c
    int32_t next[GRAM_UNITS_MAX + 1];
    memcpy(next, u->cps_start, sizeof next);
    for (int r = 0; r < n; r++)
        if (u->cps[r] != GRAM_UNITS_OTHER) u->by_cps[next[u->cps[r]]++] = v->order[r];
    // the other tokens by first byte (ranks ascend, so do their first bytes)
    for (int b = 0, j = 0; b <= 256; b++) {
        while (j < u->n_other && u->other[j] < v->first_byte_start[b]) j++;
        u->other_fb[b] = j;
    }
    // bitmaps of the pure ids by count: le_bits[c] = le_bits[c - 1] + the ids of count c
    u->words = kaon_grammar_mask_words(v->n);
    u->le_bits = calloc((GRAM_UNITS_BITS + 1) * u->words, sizeof *u->le_bits);
    u->pure_bits = calloc(u->words, sizeof *u->pure_bits);
    if (!u->le_bits || !u->pure_bits) {
        units_free(u);
        return -1;
    }
    for (int c = 0; c <= GRAM_UNITS_MAX; c++) {
        uint32_t *bits = c <= GRAM_UNITS_BITS ? u->le_bits + (size_t)c * u->words : NULL;
        if (bits && c) memcpy(bits, bits - u->words, u->words * sizeof *bits);
        for (int j = u->cps_start[c]; j < u->cps_start[c + 1]; j++) {
            int32_t id = u->by_cps[j];
            if (bits) bits[id >> 5] |= 1u << (id & 31);
            u->pure_bits[id >> 5] |= 1u << (id & 31);
        }
    }
    return 0;
}

typedef struct gram_units_node {
    struct gram_units_node *next;
    uint32_t *ranges;  // the class's code point ranges (lo, hi pairs)
    int n_ranges;
    gram_units u;
} gram_units_node;

static bool same_class(const gram_units_node *nd, const kaon_grammar *g, int cs) {
    const gram_charset *c = &g->charsets[cs];
    return nd->n_ranges == c->n && !memcmp(nd->ranges, g->ranges + 2 * c->first, (size_t)c->n * 2 * sizeof *nd->ranges);
}

const gram_units *gram_vocab_units(const kaon_grammar_vocab *cv, const kaon_grammar *g, int cs) {
    kaon_grammar_vocab *v = (kaon_grammar_vocab *)cv;  // the cache is internal state, behind its lock
    const gram_units *found = NULL;
    pthread_mutex_lock(&v->units_lock);
    for (gram_units_node *nd = v->units; nd && !found; nd = nd->next)
        if (same_class(nd, g, cs)) found = &nd->u;
    if (!found && v->n_units < GRAM_UNITS_CLASSES) {
        const gram_charset *c = &g->charsets[cs];
        gram_units_node *nd = calloc(1, sizeof *nd);
        uint32_t *ranges = malloc((size_t)(c->n ? c->n : 1) * 2 * sizeof *ranges);
        if (nd && ranges && !units_build(&nd->u, g, v, cs)) {
            memcpy(ranges, g->ranges + 2 * c->first, (size_t)c->n * 2 * sizeof *ranges);
            nd->ranges = ranges;
            nd->n_ranges = c->n;
            nd->next = v->units;
            v->units = nd;
            v->n_units++;
            found = &nd->u;
        } else {
            free(nd);
            free(ranges);
        }
    }
    pthread_mutex_unlock(&v->units_lock);
    return found;
}

void gram_vocab_units_free(kaon_grammar_vocab *v) {
    for (gram_units_node *nd = v->units, *next; nd; nd = next) {
        next = nd->next;
        units_free(&nd->u);
        free(nd->ranges);
        free(nd);
    }
    v->units = NULL;
    v->n_units = 0;
}
