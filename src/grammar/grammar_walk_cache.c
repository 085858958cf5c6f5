// States met by a vocabulary walk, interned, with the byte transitions between them. Tokens
// share suffixes as well as prefixes (every token continuing a string body steps the same
// states by the same bytes), so a walk meets a few hundred states and, after the first
// tokens, most steps are one load from a state's row of 256 successors. Valid only while
// the arena's nodes stay put: the masker resets it whenever it truncates or switches arenas.
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

#define WC_STATE_SLOTS (1 << 15)  // at most half used
#define WC_MAX_STATES (WC_STATE_SLOTS / 2)
#define WC_MAX_POOL (1 << 22)     // tops of all interned states

int gram_walk_cache_init(gram_walk_cache *c, const kaon_grammar *g) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->state_slot = calloc(WC_STATE_SLOTS, sizeof *c->state_slot);
    c->epoch = 1;  // slots start at epoch 0: empty
    return c->state_slot ? 0 : -1;
}

void gram_walk_cache_free(gram_walk_cache *c) {
    free(c->states);
    free(c->state_slot);
    free(c->rows);
    free(c->pool);
    memset(c, 0, sizeof *c);
}

void gram_walk_cache_reset(gram_walk_cache *c, const gram_arena *a) {
    if (++c->epoch == 0) {  // wrapped: old stamps could match again
        memset(c->state_slot, 0, WC_STATE_SLOTS * sizeof *c->state_slot);
        c->epoch = 1;
    }
    c->n_states = c->pool_n = 0;
    c->arena = a;
}

// A state inside a code point whose every completion is a valid code point of every top's
// class: the rest of the code point then steps each top alike whatever the bytes read so far
// (a completion keeps every top and a top's successor does not depend on the code point), so
// such states are one state whatever their partial code point (WC_ANY_CP; the first one met
// is kept, to be stepped further). Inside a string body this merges the states of the split
// UTF-8 characters (a few per unit instead of one per prefix of a character).
#define WC_ANY_CP 8

// Whether charset cs holds every code point of [lo, hi].
static bool charset_holds(const kaon_grammar *g, int cs, uint32_t lo, uint32_t hi) {
    const gram_charset *set = &g->charsets[cs];
    const uint32_t *r = g->ranges + 2 * set->first;
    for (int i = 0; i < set->n; i++)
        if (r[2 * i] <= lo) {
            if (r[2 * i + 1] >= hi) return true;
        } else {
            return false;  // ranges are sorted and disjoint: lo lies in none
        }
    return false;
}

static bool any_cp(const gram_walk_cache *c, const gram_state *s) {
    if (!s->rem || !c->g || !c->arena) return false;
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    uint32_t lo = s->cp << (6 * s->rem), hi = lo | ((1u << (6 * s->rem)) - 1);
    if (s->len > 4 || lo < min_cp[s->len] || hi > max_cp[s->len] || (lo <= 0xDFFF && hi >= 0xD800)) return false;
    for (int i = 0; i < s->n; i++)
        if (!charset_holds(c->g, c->g->elems[c->arena->pos[s->tops[i]]].val, lo, hi)) return false;
    return true;
}

static uint8_t state_flags(const gram_state *s) {
    return (uint8_t)(s->accept | s->ctx_now << 1 | s->ctx_any << 2);
}

static uint32_t state_hash(const gram_state *s, uint8_t flags) {
    uint32_t cp = flags & WC_ANY_CP ? 0 : s->cp;
    uint32_t h = 2166136261u ^ flags ^ (uint32_t)s->rem << 8 ^ (uint32_t)s->len << 12 ^ cp << 16;
    for (int i = 0; i < s->n; i++) h = (h ^ (uint32_t)s->tops[i]) * 16777619u;
    return h ^ h >> 16;
}

static bool state_equal(const gram_walk_cache *c, const gram_wc_state *w, const gram_state *s, uint8_t flags) {
    return w->n == s->n && w->flags == flags && (w->cp == s->cp || (flags & WC_ANY_CP)) && w->rem == s->rem &&
           w->len == s->len && (!s->n || !memcmp(c->pool + w->off, s->tops, (size_t)s->n * sizeof *s->tops));
}

// Room for one more state and its row; false at the limit or out of memory.
static bool states_reserve(gram_walk_cache *c) {
    if (c->n_states >= WC_MAX_STATES) return false;  // keeps the slot table half empty
    if (c->n_states < c->cap_states) return true;
    int nc = c->cap_states ? c->cap_states * 2 : 256;
    gram_wc_state *s = realloc(c->states, (size_t)nc * sizeof *s);
    if (s) c->states = s;
    int32_t *r = realloc(c->rows, (size_t)nc * 256 * sizeof *r);
    if (r) c->rows = r;
    if (!s || !r) return false;
    c->cap_states = nc;
    return true;
}

static bool pool_reserve(gram_walk_cache *c, int n) {
    if (c->pool_n + n <= c->pool_cap) return true;
    if (c->pool_n + n > WC_MAX_POOL) return false;
    int nc = c->pool_cap ? c->pool_cap : 65536;
    while (nc < c->pool_n + n) nc *= 2;
    int32_t *p = realloc(c->pool, (size_t)nc * sizeof *p);
    if (!p) return false;
    c->pool = p;
    c->pool_cap = nc;
    return true;
}

// The id of state s, added if new; -1 when the cache is full (the walk then just steps).
int32_t gram_walk_cache_intern(gram_walk_cache *c, const gram_state *s) {
    uint8_t flags = (uint8_t)(state_flags(s) | (any_cp(c, s) ? WC_ANY_CP : 0));
    uint32_t h = state_hash(s, flags), mask = WC_STATE_SLOTS - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        gram_wc_slot *slot = &c->state_slot[i];
        if (slot->epoch != c->epoch) {
            if (!states_reserve(c) || !pool_reserve(c, s->n)) return -1;
            gram_wc_state *w = &c->states[c->n_states];
            *w = (gram_wc_state){h, s->cp, c->pool_n, s->n, flags, s->rem, s->len};
            if (s->n) memcpy(c->pool + c->pool_n, s->tops, (size_t)s->n * sizeof *s->tops);
            c->pool_n += s->n;
            *slot = (gram_wc_slot){c->n_states, c->epoch};
            memset(c->rows + (size_t)c->n_states * 256, 0xff, 256 * sizeof *c->rows);  // all unknown
            return c->n_states++;
        }
        const gram_wc_state *w = &c->states[slot->id];
        if (w->hash == h && state_equal(c, w, s, flags)) return slot->id;
    }
}

// Copies interned state id into out.
int gram_walk_cache_load(const gram_walk_cache *c, int32_t id, gram_state *out) {
    const gram_wc_state *w = &c->states[id];
    gram_state view = {
        .tops = w->n ? c->pool + w->off : NULL,  // no offset on a NULL pool
        .n = w->n,
        .cap = w->n,
        .accept = w->flags & 1,
        .ctx_now = w->flags >> 1 & 1,
        .ctx_any = w->flags >> 2 & 1,
        .cp = w->cp,
        .rem = w->rem,
        .len = w->len,
    };
    return gram_state_copy(out, &view);
}

