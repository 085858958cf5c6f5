// Tokens counted in code points of one class (gram_units, grammar_internal.h): a bounded
// repetition whose units are single code points of that class decides such a token near its
// bound by the count alone, without walking it.
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

// The code points of b[0..len) when all are whole, valid UTF-8 in charset cs (the matcher's
// decoding: no overlong forms, surrogates or values past U+10FFFF), else -1.
static int count_code_points(const kaon_grammar *g, int cs, const uint8_t *b, int len) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    int n = 0;
    for (int i = 0; i < len; n++) {
        uint8_t c = b[i];
        uint32_t cp;
        int extra;
        if (c < 0x80) cp = c, extra = 0;
        else if (c >= 0xC2 && c <= 0xDF) cp = c & 0x1Fu, extra = 1;
        else if ((c & 0xF0) == 0xE0) cp = c & 0x0Fu, extra = 2;
        else if (c >= 0xF0 && c <= 0xF4) cp = c & 0x07u, extra = 3;
        else return -1;
        if (i + extra >= len) return -1;  // cut inside the code point
        for (int k = 1; k <= extra; k++) {
            if ((b[i + k] & 0xC0) != 0x80) return -1;
            cp = cp << 6 | (b[i + k] & 0x3Fu);
        }
        if (cp < min_cp[extra + 1] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
        if (!gram_charset_has(g, cs, cp)) return -1;
        i += extra + 1;
    }
    return n;
}

int gram_units_build(gram_units *u, const kaon_grammar *g, const kaon_grammar_vocab *v, int cs) {
    memset(u, 0, sizeof *u);
    u->cs = cs;
    int n = v->n_order;
    int16_t *count = malloc((size_t)(n ? n : 1) * sizeof *count);
    u->cps_start = calloc(GRAM_UNITS_MAX + 2, sizeof *u->cps_start);
    u->by_cps = malloc((size_t)(n ? n : 1) * sizeof *u->by_cps);
    u->cps = malloc((size_t)(n ? n : 1) * sizeof *u->cps);
    u->other = malloc((size_t)(n + 1) * sizeof *u->other);
    u->other_lcp = malloc((size_t)(n + 1) * sizeof *u->other_lcp);
    if (!count || !u->cps_start || !u->by_cps || !u->cps || !u->other || !u->other_lcp) {
        free(count);
        gram_units_free(u);
        return -1;
    }
    uint32_t run = 0;  // least lcp since the last other token (their common prefix)
    for (int r = 0; r < n; r++) {
        int c = count_code_points(g, cs, v->obytes[r], (int)v->olens[r]);
        if (c > GRAM_UNITS_MAX) c = -1;
        count[r] = (int16_t)c;
        u->cps[r] = (uint8_t)(c < 0 ? GRAM_UNITS_OTHER : c);
        if (v->lcp[r] < run) run = v->lcp[r];
        if (c >= 0) {
            u->cps_start[c + 1]++;
            continue;
        }
        u->other[u->n_other] = r;
        u->other_lcp[u->n_other] = (uint16_t)(u->n_other ? run : 0);
        u->n_other++;
        run = UINT32_MAX;
    }
    for (int c = 0; c <= GRAM_UNITS_MAX; c++) u->cps_start[c + 1] += u->cps_start[c];
    // ids by count, a counting sort (cps_start[c] is the next free slot of count c meanwhile)
    int32_t *next = malloc((GRAM_UNITS_MAX + 1) * sizeof *next);
    if (!next) {
        free(count);
        gram_units_free(u);
        return -1;
    }
    memcpy(next, u->cps_start, (GRAM_UNITS_MAX + 1) * sizeof *next);
    for (int r = 0; r < n; r++)
        if (count[r] >= 0) u->by_cps[next[count[r]]++] = v->order[r];
    free(next);
    free(count);
    return 0;
}

void gram_units_free(gram_units *u) {
    free(u->cps);
    free(u->by_cps);
    free(u->cps_start);
    free(u->other);
    free(u->other_lcp);
    memset(u, 0, sizeof *u);
    u->cs = -1;
}
