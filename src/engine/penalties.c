#include "engine/penalties.h"

#include <stdlib.h>
#include <string.h>

void kaon_token_counts_free(kaon_token_counts *c) {
    free(c->keys);
    free(c->counts);
    memset(c, 0, sizeof *c);
}

static uint32_t hash_token(int32_t t) { return (uint32_t)t * 2654435761u; }

static int grow(kaon_token_counts *c) {
    uint32_t cap = c->keys ? (c->mask + 1) * 2 : 64;
    int32_t *keys = malloc(sizeof(int32_t) * cap), *counts = malloc(sizeof(int32_t) * cap);
    if (!keys || !counts) {
        free(keys);
        free(counts);
        return -1;
    }
    memset(keys, 0xff, sizeof(int32_t) * cap);
    for (uint32_t i = 0; c->keys && i <= c->mask; i++) {
        if (c->keys[i] < 0) continue;
        uint32_t k = hash_token(c->keys[i]) & (cap - 1);
        while (keys[k] >= 0) k = (k + 1) & (cap - 1);
        keys[k] = c->keys[i];
        counts[k] = c->counts[i];
    }
    free(c->keys);
    free(c->counts);
    c->keys = keys;
    c->counts = counts;
    c->mask = cap - 1;
    return 0;
}

int kaon_token_counts_add(kaon_token_counts *c, int32_t token, int32_t by) {
    if (!c->keys || (c->size + 1) * 2 > c->mask + 1)
        if (grow(c)) return -1;
    uint32_t k = hash_token(token) & c->mask;
    while (c->keys[k] >= 0 && c->keys[k] != token) k = (k + 1) & c->mask;
    if (c->keys[k] < 0) {
        c->keys[k] = token;
        c->counts[k] = 0;
        c->size++;
    }
    c->counts[k] += by;
    return 0;
}

int32_t kaon_token_counts_get(const kaon_token_counts *c, int32_t token) {
    if (!c->keys) return 0;
    uint32_t k = hash_token(token) & c->mask;
    while (c->keys[k] >= 0) {
        if (c->keys[k] == token) return c->counts[k];
        k = (k + 1) & c->mask;
    }
    return 0;
}

void kaon_apply_penalties(float *logits, const kaon_token_counts *seen,
                          const kaon_token_counts *output, float repetition, float presence,
                          float frequency) {
    if (repetition != 1.0f && seen->keys) {
        for (uint32_t i = 0; i <= seen->mask; i++) {
            int32_t t = seen->keys[i];
            if (t < 0) continue;
            logits[t] = logits[t] > 0 ? logits[t] / repetition : logits[t] * repetition;
        }
    }
    if ((presence != 0.0f || frequency != 0.0f) && output->keys) {
        for (uint32_t i = 0; i <= output->mask; i++) {
            int32_t t = output->keys[i];
            if (t < 0) continue;
            logits[t] -= presence + frequency * (float)output->counts[i];
        }
    }
}
