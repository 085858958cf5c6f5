// Encoding: added tokens -> normalizer -> pre-tokenizer steps -> BPE, as HF `tokenizers`.
//
// Pieces flow depth-first through the steps (no list of all pieces is built), and every leaf
// piece goes through the word cache, then the BPE. The BPE keeps the symbols of a word in a
// linked list and the candidate merges in a binary heap ordered by (rank, position), which is
// HF's order; stale heap entries are skipped when popped. Words of a few symbols use a
// direct scan instead (same order, less overhead).
//
// Invalid UTF-8: PCRE2 runs with PCRE2_MATCH_INVALID_UTF, so invalid bytes never match a
// split pattern and land in the gaps between matches; the byte-level BPE then starts from
// each byte's own token, and the char-level BPE treats each invalid byte as a unit that is
// not in the vocab (so it takes its <0xXX> byte-fallback token). Nothing is dropped or
// replaced.
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "util/err.h"

#define CACHE_MAX_WORD 256
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_BYTES (8u << 20)
#define SCAN_MAX_SYMBOLS 24

typedef struct heap_ent {
    uint32_t rank;
    int32_t pos;
    int32_t lid, rid, merged;
} heap_ent;

typedef struct enc {
    const kaon_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md[TK_MAX_STEPS];
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    char *lbuf[TK_MAX_STEPS];
    size_t lcap[TK_MAX_STEPS];
    char *nbuf[2];
    size_t ncap[2];
    // BPE scratch: symbols [n_sym] and the heap.
    int32_t *sid, *sprev, *snext;
    size_t scap;
    heap_ent *heap;
    size_t hcap;
    bool fail;
} enc;

static void emit(enc *c, int32_t id) {
    if (c->fail) return;
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 256;
        int32_t *p = realloc(c->ids, nc * sizeof *p);
        if (!p) { c->fail = true; return; }
        c->ids = p;
        c->cap = nc;
    }
    c->ids[c->n++] = id;
}

static bool reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return false;
        nc *= 2;
    }
    char *q = realloc(*p, nc);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

// ---------------------------------------------------------------------------------------
// Word cache

static void cache_clear(tk_cache *k) {
    if (k->hash) memset(k->hash, 0, (size_t)(k->mask + 1) * sizeof *k->hash);
    k->n = 0;
    k->keys_len = 0;
    k->ids_len = 0;
}

static uint64_t word_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h | 1;  // 0 marks an empty slot
}

// Copies the cached ids of s to the output; false on a miss or when the lock is busy.
static bool cache_get(enc *c, const char *s, size_t n, uint64_t h) {
    tk_cache *k = c->t->cache;
    // k->hash is set by cache_put under the lock: read it only while holding the lock.
    if (!k || pthread_mutex_trylock(&k->mu)) return false;
    bool hit = false;
    for (uint32_t i = (uint32_t)h & k->mask; k->hash; i = (i + 1) & k->mask) {
        if (!k->hash[i]) break;
        if (k->hash[i] == h && k->key_len[i] == n && !memcmp(k->keys + k->key_off[i], s, n)) {
            for (uint32_t j = 0; j < k->ids_n[i]; j++) emit(c, k->ids[k->ids_off[i] + j]);
            hit = true;
            break;
        }
    }
    pthread_mutex_unlock(&k->mu);
    return hit;
}

static void cache_put(enc *c, const char *s, size_t n, uint64_t h, const int32_t *ids, size_t m) {
    tk_cache *k = c->t->cache;
    if (!k || pthread_mutex_trylock(&k->mu)) return;
    if (!k->hash) {
        k->hash = calloc(CACHE_SLOTS, sizeof *k->hash);
        k->key_off = malloc(CACHE_SLOTS * sizeof *k->key_off);
        k->key_len = malloc(CACHE_SLOTS * sizeof *k->key_len);
        k->ids_off = malloc(CACHE_SLOTS * sizeof *k->ids_off);
        k->ids_n = malloc(CACHE_SLOTS * sizeof *k->ids_n);
        k->mask = CACHE_SLOTS - 1;
        if (!k->hash || !k->key_off || !k->key_len || !k->ids_off || !k->ids_n) {
            free(k->hash); free(k->key_off); free(k->key_len); free(k->ids_off); free(k->ids_n);
            k->hash = NULL; k->key_off = k->key_len = k->ids_off = k->ids_n = NULL;
            goto out;
        }
    }
    if (k->n >= CACHE_SLOTS / 2 || k->keys_len + n > CACHE_MAX_BYTES || k->ids_len + m > CACHE_MAX_BYTES)
        cache_clear(k);
    if (k->keys_len + n > k->keys_cap) {
        size_t nc = k->keys_cap ? k->keys_cap : 65536;
        while (nc < k->keys_len + n) nc *= 2;
        char *p = realloc(k->keys, nc);
        if (!p) goto out;
        k->keys = p;
        k->keys_cap = nc;
    }
    if (k->ids_len + m > k->ids_cap) {
        size_t nc = k->ids_cap ? k->ids_cap : 16384;
        while (nc < k->ids_len + m) nc *= 2;
        int32_t *p = realloc(k->ids, nc * sizeof *p);
        if (!p) goto out;
        k->ids = p;
        k->ids_cap = nc;
    }
    uint32_t i = (uint32_t)h & k->mask;
    while (k->hash[i]) {
        if (k->hash[i] == h && k->key_len[i] == n && !memcmp(k->keys + k->key_off[i], s, n)) goto out;
        i = (i + 1) & k->mask;
    }
    memcpy(k->keys + k->keys_len, s, n);
    if (m) memcpy(k->ids + k->ids_len, ids, m * sizeof *ids);
    k->hash[i] = h;
    k->key_off[i] = (uint32_t)k->keys_len;
    k->key_len[i] = (uint32_t)n;
    k->ids_off[i] = (uint32_t)k->ids_len;
    k->ids_n[i] = (uint32_t)m;
    k->keys_len += n;
    k->ids_len += m;
    k->n++;
out:
    pthread_mutex_unlock(&k->mu);
}

// ---------------------------------------------------------------------------------------
// BPE

static bool pair_get(const kaon_tokenizer *t, int32_t l, int32_t r, uint32_t *rank, int32_t *merged) {
    const tk_pairmap *p = &t->pairs;
    if (!p->mask) return false;
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint32_t j = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & p->mask;
    for (;;) {
        if (p->keys[j] == key) { *rank = p->rank[j]; *merged = p->merged[j]; return true; }
        if (p->keys[j] == UINT64_MAX) return false;
        j = (j + 1) & p->mask;
    }
}

static bool heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static bool heap_push(enc *c, size_t *hn, heap_ent e) {
    if (*hn == c->hcap) {
        size_t nc = c->hcap ? c->hcap * 2 : 256;
        heap_ent *p = realloc(c->heap, nc * sizeof *p);
        if (!p) return false;
        c->heap = p;
        c->hcap = nc;
    }
    size_t i = (*hn)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&e, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = e;
    return true;
}

static heap_ent heap_pop(enc *c, size_t *hn) {
    heap_ent top = c->heap[0];
    heap_ent last = c->heap[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        size_t m = (l + 1 < n && heap_less(&c->heap[l + 1], &c->heap[l])) ? l + 1 : l;
        if (!heap_less(&c->heap[m], &last)) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

static void try_pair(enc *c, size_t *hn, int32_t pos) {
    int32_t nx = c->snext[pos];
    if (nx < 0) return;
    uint32_t rank;
    int32_t merged;
    if (!pair_get(c->t, c->sid[pos], c->sid[nx], &rank, &merged)) return;
    heap_ent e = {rank, pos, c->sid[pos], c->sid[nx], merged};
    if (!heap_push(c, hn, e)) c->fail = true;
}

// Merges the symbols sid[0..n) (linked through sprev/snext) in place.
static void bpe_merge(enc *c, int32_t n) {
    const kaon_tokenizer *t = c->t;
    if (n <= SCAN_MAX_SYMBOLS) {
        // Few symbols: repeatedly merge the best pair (lowest rank, then leftmost).
        int32_t m = n;
        while (m > 1) {
            uint32_t best = UINT32_MAX;
            int32_t bpos = -1, bmerged = -1;
            for (int32_t i = 0; i + 1 < m; i++) {
                uint32_t rank;
                int32_t merged;
                if (pair_get(t, c->sid[i], c->sid[i + 1], &rank, &merged) && rank < best) {
                    best = rank;
                    bpos = i;
                    bmerged = merged;
                }
            }
            if (bpos < 0) break;
            c->sid[bpos] = bmerged;
            memmove(c->sid + bpos + 1, c->sid + bpos + 2, (size_t)(m - bpos - 2) * sizeof *c->sid);
            m--;
        }
        for (int32_t i = 0; i < m; i++) emit(c, c->sid[i]);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        c->sprev[i] = i - 1;
        c->snext[i] = i + 1 < n ? i + 1 : -1;
    }
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++) try_pair(c, &hn, i);
    while (hn && !c->fail) {
        heap_ent e = heap_pop(c, &hn);
        int32_t nx = c->snext[e.pos];
        // Stale: the left symbol was merged away (id -1) or either side changed.
        if (c->sid[e.pos] != e.lid || nx < 0 || c->sid[nx] != e.rid) continue;
        c->sid[e.pos] = e.merged;
        c->sid[nx] = -1;
        int32_t nn = c->snext[nx];
        c->snext[e.pos] = nn;
        if (nn >= 0) c->sprev[nn] = e.pos;
        if (c->sprev[e.pos] >= 0) try_pair(c, &hn, c->sprev[e.pos]);
        try_pair(c, &hn, e.pos);
    }
    for (int32_t i = 0; i >= 0; i = c->snext[i]) emit(c, c->sid[i]);
}

static bool sym_reserve(enc *c, size_t n) {
    if (n <= c->scap) return true;
    size_t nc = c->scap ? c->scap : 64;
    while (nc < n) nc *= 2;
    if (nc > INT32_MAX) return false;
    int32_t *a = realloc(c->sid, nc * sizeof *a);
    if (a) c->sid = a;
    int32_t *b = realloc(c->sprev, nc * sizeof *b);
    if (b) c->sprev = b;
    int32_t *d = realloc(c->snext, nc * sizeof *d);
    if (d) c->snext = d;
    if (!a || !b || !d) return false;
    c->scap = nc;
    return true;
}

// One pre-token through the model (HF BPE::tokenize_with_cache + merge_word).
static void model_word(enc *c, const char *s, size_t n) {
    const kaon_tokenizer *t = c->t;
    if (n == 0 || c->fail) return;
    if (t->ignore_merges) {
        int id = tk_strmap_get(&t->model_map, s, n);
        if (id >= 0) { emit(c, id); return; }
    }
    uint64_t h = 0;
    if (n <= CACHE_MAX_WORD) {
        h = word_hash(s, n);
        if (cache_get(c, s, n, h)) return;
    }
    if (!sym_reserve(c, n + 1)) { c->fail = true; return; }
    int32_t m = 0;
    int32_t unk_pending = 0;  // fused unknowns waiting to be added
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t ul = 1;
        int32_t id;
        if (t->kind == TK_BYTE_LEVEL) {
            id = t->unit_tok[u[i]];
        } else if (u[i] < 0x80) {
            id = t->unit_tok[u[i]];
        } else {
            uint32_t cp;
            int k = tk_utf8_decode(u + i, n - i, &cp);
            ul = k ? (size_t)k : 1;
            id = tk_strmap_get(&t->model_map, s + i, ul);
        }
        if (id < 0 && t->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < ul; j++) all = all && t->byte_fb[u[i + j]] >= 0;
            if (all) {
                if (unk_pending) { c->sid[m++] = t->unk_id; unk_pending = 0; }
                for (size_t j = 0; j < ul; j++) c->sid[m++] = t->byte_fb[u[i + j]];
                i += ul;
                continue;
            }
        }
        if (id >= 0) {
            if (unk_pending) { c->sid[m++] = t->unk_id; unk_pending = 0; }
            c->sid[m++] = id;
        } else if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) c->sid[m++] = t->unk_id;
            unk_pending = 1;
        }  // else: HF drops the unit
        i += ul;
    }
    if (unk_pending) c->sid[m++] = t->unk_id;
    size_t first = c->n;
    if (m > 0) bpe_merge(c, m);
    if (h && !c->fail) cache_put(c, s, n, h, c->n > first ? c->ids + first : NULL, c->n - first);
}

// ---------------------------------------------------------------------------------------
// Pre-tokenizer steps

static void pretok(enc *c, int step, const char *s, size_t n, bool at_start);

// Matches of step k's regex over s, combined per the split behavior; each resulting piece
// goes to the next step.
typedef struct seg_state {
    enc *c;
    int step;
    const char *s;
    bool at_start;
    int behavior;
    bool have;         // a pending segment
    size_t ps, pe;     // pending segment
    bool pmatch;       // pending segment is a match
    bool prev_match;   // last segment seen was a match
} seg_state;

static void seg_emit(seg_state *g, size_t a, size_t b) {
    if (b > a) pretok(g->c, g->step + 1, g->s + a, b - a, g->at_start && a == 0);
}

static void seg_add(seg_state *g, size_t a, size_t b, bool is_match) {
    switch (g->behavior) {
    case SPLIT_ISOLATED:
        seg_emit(g, a, b);
        break;
    case SPLIT_REMOVED:
        if (!is_match) seg_emit(g, a, b);
        break;
    case SPLIT_CONTIGUOUS:
        if (g->have && is_match == g->prev_match) { g->pe = b; }
        else {
            if (g->have) seg_emit(g, g->ps, g->pe);
            g->have = true; g->ps = a; g->pe = b;
        }
        break;
    case SPLIT_MERGED_PREV:
        if (is_match && !g->prev_match && g->have) { g->pe = b; }
        else {
            if (g->have) seg_emit(g, g->ps, g->pe);
            g->have = true; g->ps = a; g->pe = b;
        }
        break;
    case SPLIT_MERGED_NEXT:
        if (is_match) {
            if (g->have) seg_emit(g, g->ps, g->pe);
            g->have = true; g->ps = a; g->pe = b; g->pmatch = true;
        } else if (g->have && g->pmatch) {
            seg_emit(g, g->ps, b);
            g->have = false;
        } else {
            seg_emit(g, a, b);
        }
        break;
    }
    g->prev_match = is_match;
}

static void seg_end(seg_state *g) {
    if (g->have) seg_emit(g, g->ps, g->pe);
    g->have = false;
}

static int re_match(enc *c, const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, size_t off) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, 0, md, c->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !c->jstack) {
        // Very long matches: give the JIT a larger stack and retry once.
        c->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        if (!c->mctx) c->mctx = pcre2_match_context_create(NULL);
        if (c->jstack && c->mctx) {
            pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, off, 0, md, c->mctx);
        }
    }
    return rc;
}

static void step_split(enc *c, int k, const char *s, size_t n, bool at_start) {
    const tk_step *st = &c->t->steps[k];
    if (!c->md[k]) {
        c->md[k] = pcre2_match_data_create_from_pattern(st->re, NULL);
        if (!c->md[k]) { c->fail = true; return; }
    }
    pcre2_match_data *md = c->md[k];
    seg_state g = {.c = c, .step = k, .s = s, .at_start = at_start, .behavior = st->behavior};
    size_t prev = 0, off = 0;
    while (off <= n && !c->fail) {
        int rc = re_match(c, st->re, md, s, n, off);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            // Matching failed (resource limits): treat the rest as one unmatched piece.
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms < prev || me < ms || me > n) break;  // cannot happen; be safe
        if (ms > prev) seg_add(&g, prev, ms, st->invert);
        if (me > ms) {
            seg_add(&g, ms, me, !st->invert);
            off = me;
        } else {
            // Empty match: a split point; move on by one char.
            seg_add(&g, ms, ms, !st->invert);
            if (ms >= n) { prev = ms; break; }
            uint32_t cp;
            int l = tk_utf8_decode((const unsigned char *)s + ms, n - ms, &cp);
            off = ms + (l ? (size_t)l : 1);
        }
        prev = me;
    }
    if (prev < n) seg_add(&g, prev, n, st->invert);
    seg_end(&g);
}

static void step_metaspace(enc *c, int k, const char *s, size_t n, bool at_start) {
    const tk_step *st = &c->t->steps[k];
    size_t rl = (size_t)st->repl_len;
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    if (spaces > (SIZE_MAX - n - rl) / (rl ? rl : 1)) { c->fail = true; return; }
    size_t need = n + spaces * (rl ? rl - 1 : 0) + rl + 1;
    if (!reserve(&c->lbuf[k], &c->lcap[k], need)) { c->fail = true; return; }
    char *o = c->lbuf[k];
    size_t m = 0;
    bool starts = (n > 0 && s[0] == ' ') || (n >= rl && rl && !memcmp(s, st->repl, rl));
    if (!starts && (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && at_start))) {
        memcpy(o, st->repl, rl);
        m = rl;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') { memcpy(o + m, st->repl, rl); m += rl; }
        else o[m++] = s[i];
    }
    if (!st->split || rl == 0) { pretok(c, k + 1, o, m, at_start); return; }
    // Split on the replacement, each match merged with the piece after it.
    seg_state g = {.c = c, .step = k, .s = o, .at_start = at_start, .behavior = SPLIT_MERGED_NEXT};
    size_t prev = 0;
    for (size_t i = 0; i + rl <= m;) {
        if (!memcmp(o + i, st->repl, rl)) {
            if (i > prev) seg_add(&g, prev, i, false);
            seg_add(&g, i, i + rl, true);
            i += rl;
            prev = i;
        } else {
            i++;
        }
    }
    if (prev < m) seg_add(&g, prev, m, false);
    seg_end(&g);
}

static void pretok(enc *c, int k, const char *s, size_t n, bool at_start) {
    if (c->fail || n == 0) return;
    const kaon_tokenizer *t = c->t;
    if (k >= t->n_steps) { model_word(c, s, n); return; }
    const tk_step *st = &t->steps[k];
    switch (st->kind) {
    case STEP_SPLIT:
        step_split(c, k, s, n, at_start);
        break;
    case STEP_PREFIX_SPACE:
        if (s[0] == ' ') { pretok(c, k + 1, s, n, at_start); break; }
        if (!reserve(&c->lbuf[k], &c->lcap[k], n + 2)) { c->fail = true; return; }
        c->lbuf[k][0] = ' ';
        memcpy(c->lbuf[k] + 1, s, n);
        pretok(c, k + 1, c->lbuf[k], n + 1, at_start);
        break;
    case STEP_METASPACE:
        step_metaspace(c, k, s, n, at_start);
        break;
    }
}

// ---------------------------------------------------------------------------------------
// Normalizer and added tokens

// Applies the normalizer ops; the result is in c->nbuf[*which] (or s itself when no op).
static const char *normalize(enc *c, const char *s, size_t n, size_t *out_len) {
    const kaon_tokenizer *t = c->t;
    const char *cur = s;
    size_t cl = n;
    int w = 0;
    for (int i = 0; i < t->n_norm; i++) {
        const tk_normop *op = &t->norm[i];
        if (op->kind == NORM_PREPEND) {
            if (cl == 0) continue;  // HF prepends only to non-empty text
            if (!reserve(&c->nbuf[w], &c->ncap[w], cl + op->a_len + 1)) { c->fail = true; return NULL; }
            memcpy(c->nbuf[w], op->a, op->a_len);
            memmove(c->nbuf[w] + op->a_len, cur, cl);
            cl += op->a_len;
        } else {
            if (op->a_len == 0) continue;
            size_t cnt = 0;
            for (size_t j = 0; j + op->a_len <= cl;) {
                if (!memcmp(cur + j, op->a, op->a_len)) { cnt++; j += op->a_len; } else j++;
            }
            if (cnt == 0) continue;
            size_t grow = op->b_len > op->a_len ? op->b_len - op->a_len : 0;
            if (grow && cnt > (SIZE_MAX / 2) / grow) { c->fail = true; return NULL; }
            if (!reserve(&c->nbuf[w], &c->ncap[w], cl + cnt * grow + 1)) { c->fail = true; return NULL; }
            char *o = c->nbuf[w];
            size_t m = 0;
            for (size_t j = 0; j < cl;) {
                if (j + op->a_len <= cl && !memcmp(cur + j, op->a, op->a_len)) {
                    memcpy(o + m, op->b, op->b_len);
                    m += op->b_len;
                    j += op->a_len;
                } else {
                    o[m++] = cur[j++];
                }
            }
            cl = m;
        }
        cur = c->nbuf[w];
        w ^= 1;
    }
    *out_len = cl;
    return cur;
}

char *tk_normalize_alloc(const kaon_tokenizer *t, const char *s, size_t n, size_t *out_len) {
    enc c;
    memset(&c, 0, sizeof c);
    c.t = t;
    size_t m = 0;
    const char *r = normalize(&c, s, n, &m);
    char *out = NULL;
    if (r && !c.fail) {
        out = malloc(m + 1);
        if (out) { memcpy(out, r, m); out[m] = 0; *out_len = m; }
    }
    free(c.nbuf[0]);
    free(c.nbuf[1]);
    return out;
}

static bool is_ws(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

// Start of the UTF-8 char that ends at s[end) (end > 0).
static size_t char_before(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && end - i < 4 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

// Approximates Rust's \w (alphanumeric, marks, connector punctuation) for single_word.
static bool is_word_cp(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == '_';
    return !is_ws(cp) && !(cp >= 0x2000 && cp <= 0x206F) && !(cp >= 0x3000 && cp <= 0x303F) &&
           !(cp >= 0xFF00 && cp <= 0xFF0F) && cp != 0xA0 && !(cp >= 0x80 && cp <= 0xBF);
}

static void stage_norm(enc *c, const char *s, size_t n, bool at_start);

// Splits s on the trie's tokens (leftmost-longest, HF's find_matches); gaps go to next().
static void split_added(enc *c, const tk_trie *tr, const char *s, size_t n, bool at_start,
                        void (*next)(enc *, const char *, size_t, bool)) {
    const tk_added *added = c->t->added;
    size_t start_off = 0;
    size_t i = 0;
    while (i < n && !c->fail) {
        int32_t node = tr->root[(unsigned char)s[i]];
        if (node < 0) { i++; continue; }
        int32_t best = -1;
        size_t best_end = 0;
        size_t j = i;
        while (node >= 0) {
            j++;
            if (tr->nodes[node].added >= 0) { best = tr->nodes[node].added; best_end = j; }
            if (j >= n) break;
            int32_t ch = tr->nodes[node].child;
            while (ch >= 0 && tr->nodes[ch].byte != (unsigned char)s[j]) ch = tr->nodes[ch].sibling;
            node = ch;
        }
        if (best < 0) { i++; continue; }
        const tk_added *a = &added[best];
        size_t ms = i, me = best_end;
        if (a->single_word) {
            bool ok = true;
            uint32_t cp;
            if (ms > 0) {
                size_t b = char_before(s, ms);
                if (tk_utf8_decode((const unsigned char *)s + b, ms - b, &cp) && is_word_cp(cp)) ok = false;
            }
            if (me < n && tk_utf8_decode((const unsigned char *)s + me, n - me, &cp) && is_word_cp(cp)) ok = false;
            if (!ok) { i = me; continue; }  // HF's iterator resumes after the discarded match
        }
        if (a->lstrip) {
            size_t b = ms;
            while (b > start_off) {
                size_t p = char_before(s, b);
                uint32_t cp;
                if (!tk_utf8_decode((const unsigned char *)s + p, b - p, &cp) || !is_ws(cp)) break;
                b = p;
            }
            ms = b;
        }
        if (a->rstrip) {
            while (me < n) {
                uint32_t cp;
                int l = tk_utf8_decode((const unsigned char *)s + me, n - me, &cp);
                if (!l || !is_ws(cp)) break;
                me += (size_t)l;
            }
        }
        if (ms > start_off) next(c, s + start_off, ms - start_off, at_start && start_off == 0);
        emit(c, a->id);
        start_off = me;
        i = me;
    }
    if (start_off < n) next(c, s + start_off, n - start_off, at_start && start_off == 0);
}

static void stage_pretok(enc *c, const char *s, size_t n, bool at_start) { pretok(c, 0, s, n, at_start); }

static void stage_norm(enc *c, const char *s, size_t n, bool at_start) {
    const kaon_tokenizer *t = c->t;
    size_t m = n;
    const char *ns = s;
    if (t->n_norm) {
        ns = normalize(c, s, n, &m);
        if (!ns) return;
        // The normalized text lives in a scratch buffer that the next gap reuses: copy it
        // when the added-token split below might call back into normalize() (it does not).
    }
    if (t->have_norm) split_added(c, &t->trie_norm, ns, m, at_start, stage_pretok);
    else pretok(c, 0, ns, m, at_start);
}

int kaon_tokenize(const kaon_tokenizer *t, const char *text, size_t len, bool add_special,
                  int32_t **ids, size_t *n_ids) {
    if (!t || !ids || !n_ids || (!text && len)) return kaon_set_error("kaon_tokenize: bad arguments");
    enc c;
    memset(&c, 0, sizeof c);
    c.t = t;
    if (add_special)
        for (int i = 0; i < t->n_post_pre; i++) emit(&c, t->post_pre[i]);
    if (len) {
        if (t->have_raw) split_added(&c, &t->trie_raw, text, len, true, stage_norm);
        else stage_norm(&c, text, len, true);
    }
    if (add_special)
        for (int i = 0; i < t->n_post_suf; i++) emit(&c, t->post_suf[i]);
    for (int k = 0; k < TK_MAX_STEPS; k++) {
        pcre2_match_data_free(c.md[k]);
        free(c.lbuf[k]);
    }
    if (c.jstack) pcre2_jit_stack_free(c.jstack);
    if (c.mctx) pcre2_match_context_free(c.mctx);
    free(c.nbuf[0]);
    free(c.nbuf[1]);
    free(c.sid); free(c.sprev); free(c.snext); free(c.heap);
    if (c.fail) {
        free(c.ids);
        return kaon_set_error("kaon_tokenize: out of memory");
    }
    if (!c.ids) {
        c.ids = malloc(sizeof *c.ids);  // callers may free an empty result
        if (!c.ids) return kaon_set_error("kaon_tokenize: out of memory");
    }
    *ids = c.ids;
    *n_ids = c.n;
    return 0;
}
