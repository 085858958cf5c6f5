// Token masks. A walk over the sorted vocabulary steps each shared prefix once. To avoid a
// whole walk per token, the masker caches, per top of stack (its top MASK_DEPTH frames),
// the tokens accepted whatever lies below those frames and the ones that reached below them
// ("uncertain"); a mask ORs the cached sets of the current tops and walks only the uncertain
// tokens against the real stacks (xgrammar's split into context-independent and dependent).
// A key inside a bounded repetition (x{m,n}: n - m nested copies) is built from the key of
// the outermost copy: only tokens long enough to reach the bound are walked again. A key of
// more than 3 frames is built from the entry of its top 3 frames, walking only the tokens that
// reached below them (a string's body is walked once, not once per property it sits in).
// When the repetition's units are single code points of one class (a JSON string's plain
// characters) and the element after it cannot begin with one, a token made only of such code
// points crosses exactly one unit per code point: near the bound it keeps the outer copy's
// class or is rejected by its count alone (gram_units), and only the other tokens are walked
// (x* and single units too: every pure token accepted, or those of one code point).
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "grammar/grammar_internal.h"
#include "util/err.h"

#define MASK_DEPTH 6  // stack frames in a cache key (measured: 4 -> 6 halves the warm mask time)
#define MASK_MAX_ENTRIES 4096
#define PARENT_FRAMES 3  // a deeper key is built from the entry of its top 3 frames (measured: 2 and 4 slower)

// The ranks of the tokens of at least some length, with their common prefixes.
typedef struct {
    int32_t *ranks;
    uint16_t *lcp;
    int n;  // -1: not built yet
} long_list;

typedef struct {
    int32_t key[MASK_DEPTH + 1];  // frame positions (-1 past the bottom), then "more below"
    uint32_t *accepted;           // [mask words]
    int32_t *uncertain;           // token ranks (indices in vocabulary order), ascending
    uint16_t *uncertain_lcp;
    int n_uncertain;
} mask_entry;

struct kaon_grammar_masker {
    const kaon_grammar *g;
    const kaon_grammar_vocab *v;
    size_t words;
    int depth;  // frames in a key, 1..MASK_DEPTH
    gram_arena work;  // stacks built for cache entries
    gram_state *depth_states;  // [max token length + 1] along the walk
    int32_t *depth_ids;        // their walk cache ids (-1: not interned)
    bool *depth_have;          // depth_states[d] holds state depth_ids[d] (else only the id does)
    gram_walk_cache wc;
    int n_depth;
    mask_entry *entries;
    int n_entries, cap_entries;
    int32_t *table;  // open addressing over entries, -1 empty
    int table_size;
    mask_entry spare;  // used when the cache is full
    int32_t *unc_buf;  // uncertain tokens of the entry being built
    int n_unc, cap_unc;
    // for entries built from another copy of a bounded repetition (copy_key)
    int32_t *len_count;  // [L]: tokens of at least L bytes (L <= max length + 1)
    int max_long;        // at most this many tokens walked again
    long_list *longs;    // [L]: the tokens of at least L bytes, built on first use
    int32_t *merge_buf;  // [n_order]
    long_list walk_list;  // [n_order]: the other tokens a units copy walks
    uint64_t *rank_bits;  // [n_order bits]: long_tokens' sort
};

// How an entry is built from another copy of a bounded repetition (copy_key).
typedef struct {
    int thr;                  // tokens of fewer bytes keep the copy's class
    const gram_units *units;  // else NULL; with it, pure tokens keep the copy's class when
    int max_units;            // they have at most max_units code points, else are rejected
} copy_rule;

// Walk `n` tokens (ascending ranks: ranks[i], or base + i when ranks is NULL; lcp[i] with the
// previous one) from `start`; each token reported by rank as 1 accepted or 2 uncertain
// (rejected ones are not reported).
typedef void (*walk_report)(void *ctx, int32_t rank, int cls);

// The walk holds each depth's state as a walk cache id, and materializes it only to step
// it by a byte the cache has not seen (or when the cache is full: id -1).
static int walk_step(kaon_grammar_masker *mk, gram_arena *a, int d, uint8_t byte) {
    gram_state *st = mk->depth_states;
    int32_t *id = mk->depth_ids;
    if (id[d] >= 0) {
        int32_t to = gram_walk_cache_next(&mk->wc, id[d], byte);
        if (to >= 0) {
            id[d + 1] = to;
            mk->depth_have[d + 1] = false;
            return 0;
        }
        if (!mk->depth_have[d] && gram_walk_cache_load(&mk->wc, id[d], &st[d])) return -1;
        mk->depth_have[d] = true;
    }
    if (gram_step(mk->g, a, &st[d], byte, &st[d + 1])) return -1;
    mk->depth_have[d + 1] = true;
    id[d + 1] = gram_walk_cache_intern(&mk->wc, &st[d + 1]);
    if (id[d] >= 0 && id[d + 1] >= 0) gram_walk_cache_link(&mk->wc, id[d], byte, id[d + 1]);
    return 0;
}

static bool depth_viable(const kaon_grammar_masker *mk, int d) {
    int32_t id = mk->depth_ids[d];
    return id >= 0 ? gram_walk_cache_viable(&mk->wc, id) : gram_state_viable(&mk->depth_states[d]);
}

static bool depth_ctx_any(const kaon_grammar_masker *mk, int d) {
    int32_t id = mk->depth_ids[d];
    return id >= 0 ? gram_walk_cache_ctx_any(&mk->wc, id) : mk->depth_states[d].ctx_any;
}

// The first i >= from (or n) with lcp[i] < d: past the tokens that share a dead prefix of d
// bytes (a whole walk skips most of the vocabulary this way: " the" after a space that
// must be followed by a quote). Eight common prefixes at a time where SSE2 is.
static int skip_prefix(const uint16_t *lcp, int from, int n, int d) {
    int i = from;
    if (d > UINT16_MAX) return i;  // no common prefix is that long
#if defined(__SSE2__)
    const __m128i dv = _mm_set1_epi16((short)(uint16_t)d), zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        // d - lcp saturates to 0 exactly where lcp >= d
        __m128i lt = _mm_subs_epu16(dv, _mm_loadu_si128((const __m128i *)(lcp + i)));
        int ge = _mm_movemask_epi8(_mm_cmpeq_epi16(lt, zero));
        if (ge != 0xFFFF) return i + __builtin_ctz((unsigned)~ge & 0xFFFFu) / 2;
    }
#endif
    while (i < n && lcp[i] >= d) i++;
    return i;
}

static int walk_tokens(kaon_grammar_masker *mk, gram_arena *a, const gram_state *start, const int32_t *ranks,
                       int base, const uint16_t *lcp, int n, walk_report report, void *ctx) {
    const kaon_grammar_vocab *v = mk->v;
    if (gram_state_copy(&mk->depth_states[0], start)) return -1;
    if (mk->wc.arena != a) gram_walk_cache_reset(&mk->wc, a);
    mk->depth_have[0] = true;
    mk->depth_ids[0] = gram_walk_cache_intern(&mk->wc, start);
    int valid = 0;  // depths 0..valid hold the states along the previous token's bytes
    for (int i = 0; i < n;) {
        int32_t id = ranks ? ranks[i] : base + i;
        if (ranks && i + 8 < n) {  // a list's tokens lie apart: fetch the bytes ahead
            __builtin_prefetch(v->obytes[ranks[i + 8]]);
            if (i + 16 < n) __builtin_prefetch(&v->obytes[ranks[i + 16]]), __builtin_prefetch(&v->olens[ranks[i + 16]]);
        }
        const uint8_t *b = v->obytes[id];
        int len = (int)v->olens[id];
        int d = i && lcp[i] < valid ? lcp[i] : (i ? valid : 0);
        bool dead = false;
        while (d < len) {
            if (walk_step(mk, a, d, b[d])) return -1;
            d++;
            if (!depth_viable(mk, d)) {
                dead = true;
                break;
            }
        }
        valid = d;
        if (!dead) {
            report(ctx, id, 1);
            i++;
            continue;
        }
        // every following token that shares the dead prefix b[0..d) ends the same way
        int cls = depth_ctx_any(mk, d) ? 2 : 0;
        if (cls) {
            do {
                report(ctx, ranks ? ranks[i] : base + i, cls);
                i++;
            } while (i < n && lcp[i] >= d);
        } else {
            i = skip_prefix(lcp, i + 1, n, d);
        }
        valid = d - 1;
    }
    return 0;
}

static void set_bit(uint32_t *mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }

typedef struct {
    kaon_grammar_masker *mk;
    uint32_t *mask;
    bool failed;
} build_ctx;

static void report_build(void *p, int32_t id, int cls) {
    build_ctx *c = p;
    kaon_grammar_masker *mk = c->mk;
    if (cls == 1) {
        set_bit(c->mask, mk->v->order[id]);
        return;
    }
    if (mk->n_unc == mk->cap_unc) {
        int nc = mk->cap_unc ? mk->cap_unc * 2 : 256;
        int32_t *u = realloc(mk->unc_buf, (size_t)nc * sizeof *u);
        if (!u) {
            c->failed = true;
            return;
        }
        mk->unc_buf = u;
        mk->cap_unc = nc;
    }
    mk->unc_buf[mk->n_unc++] = id;
}

static void entry_free(mask_entry *e) {
    free(e->accepted);
    free(e->uncertain);
    free(e->uncertain_lcp);
    memset(e, 0, sizeof *e);
}

// The work one mask may do (a bound for hostile grammars; JSON needs a fraction of it).
static int64_t walk_work_limit(const kaon_grammar_vocab *v) {
    return KAON_GRAMMAR_WALK_WORK_BASE + (int64_t)KAON_GRAMMAR_WALK_WORK_PER_TOKEN * v->n_order;
}

// The first UTF-8 bytes of the code points in charset cs (the lead byte grows with the
// code point, so a range of code points has a range of lead bytes).
static void lead_bytes(const kaon_grammar *g, int cs, bool *lead) {
    memset(lead, 0, 256);
    const gram_charset *set = &g->charsets[cs];
    for (int i = 0; i < set->n; i++) {
        uint32_t lo = g->ranges[2 * (set->first + i)], hi = g->ranges[2 * (set->first + i) + 1];
        for (uint32_t c = lo; c <= hi && c < 0x80; c++) lead[c] = true;
        if (hi < 0x80) continue;
        if (lo < 0x80) lo = 0x80;
        int first = lo < 0x800 ? 0xC0 | (int)(lo >> 6) : lo < 0x10000 ? 0xE0 | (int)(lo >> 12) : 0xF0 | (int)(lo >> 18);
        int last = hi < 0x800 ? 0xC0 | (int)(hi >> 6) : hi < 0x10000 ? 0xE0 | (int)(hi >> 12) : 0xF0 | (int)(hi >> 18);
        for (int b = first; b <= last && b < 256; b++) lead[b] = true;
    }
}

static int finish_entry(kaon_grammar_masker *mk, mask_entry *e);

// The common prefix of the tokens of ranks p and r.
static uint32_t common_prefix(const kaon_grammar_vocab *v, int32_t p, int32_t r) {
    uint32_t n = v->olens[p] < v->olens[r] ? v->olens[p] : v->olens[r], k = 0;
    while (k < n && k < UINT16_MAX && v->obytes[p][k] == v->obytes[r][k]) k++;
    return k;
}

// The tokens of at least thr bytes, built once per length.
static const long_list *long_tokens(kaon_grammar_masker *mk, int thr) {
    if (thr > mk->n_depth) thr = mk->n_depth;  // [n_depth]: none
    long_list *l = &mk->longs[thr];
    if (l->n >= 0) return l;
    const kaon_grammar_vocab *v = mk->v;
    int n = thr > v->max_len ? 0 : v->len_at_least[thr];
    l->ranks = malloc((size_t)(n + 1) * sizeof *l->ranks);
    l->lcp = malloc((size_t)(n + 1) * sizeof *l->lcp);
    if (!l->ranks || !l->lcp) {
        free(l->ranks);
        free(l->lcp);
        l->ranks = NULL;
        l->lcp = NULL;
        return NULL;
    }
    // the longest n tokens (vocabulary by length) back in vocabulary order through a bitmap
    size_t words = ((size_t)v->n_order + 63) / 64;
    memset(mk->rank_bits, 0, words * sizeof *mk->rank_bits);
    for (int j = 0; j < n; j++) mk->rank_bits[v->by_len[j] >> 6] |= 1ull << (v->by_len[j] & 63);
    int k = 0;
    for (size_t w = 0; w < words; w++)
        for (uint64_t bits = mk->rank_bits[w]; bits; bits &= bits - 1) {
            int32_t r = (int32_t)(w * 64 + (size_t)__builtin_ctzll(bits));
            l->ranks[k] = r;
            l->lcp[k] = (uint16_t)(k ? common_prefix(v, l->ranks[k - 1], r) : 0);
            k++;
        }
    l->n = k;
    return l;
}

// Whether a token the copy left uncertain stays so without a walk (cr: copy_rule).
static bool copy_keeps_uncertain(const kaon_grammar_masker *mk, const copy_rule *cr, int32_t rank) {
    if (!cr->units || cr->units->cps[rank] == GRAM_UNITS_OTHER) return (int)mk->v->olens[rank] < cr->thr;
    return cr->units->cps[rank] <= cr->max_units;
}

// The uncertain tokens of an entry built from copy: the copy's that stay so and the ones the
// walk just reported (mk->unc_buf), in vocabulary order, back into mk->unc_buf.
static int merge_uncertain(kaon_grammar_masker *mk, build_ctx *c, const mask_entry *copy, const copy_rule *cr) {
    int n_walked = mk->n_unc;
    if (n_walked) memcpy(mk->merge_buf, mk->unc_buf, (size_t)n_walked * sizeof *mk->merge_buf);
    mk->n_unc = 0;
    for (int i = 0, j = 0; i < copy->n_uncertain || j < n_walked;) {
        int32_t id;
        if (j == n_walked || (i < copy->n_uncertain && copy->uncertain[i] < mk->merge_buf[j])) {
            id = copy->uncertain[i++];
            if (!copy_keeps_uncertain(mk, cr, id)) continue;
        } else {
            id = mk->merge_buf[j++];
        }
        report_build(c, id, 2);
        if (c->failed) return -1;
    }
    return 0;
}

static void clear_bit(uint32_t *mask, int32_t id) { mask[id >> 5] &= ~(1u << (id & 31)); }

static int cmp_rank(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// The other tokens (gram_units) of at least thr bytes in vocabulary order with their common
// prefixes, in mk->walk_list. Few long ones (a copy far from the bound) are taken from the
// list by length and sorted; else one pass over all the other tokens.
static const long_list *other_tokens_to_walk(kaon_grammar_masker *mk, const gram_units *u, int thr, const bool *lead) {
    const kaon_grammar_vocab *v = mk->v;
    long_list *w = &mk->walk_list;
    w->n = 0;
    int n_long = thr > u->max_len ? 0 : u->other_at_least[thr];
    if (n_long < u->n_other / 8) {
        for (int j = 0; j < n_long; j++)
            if (lead[v->obytes[u->other_by_len[j]][0]]) w->ranks[w->n++] = u->other_by_len[j];
        n_long = w->n;
        qsort(w->ranks, (size_t)n_long, sizeof *w->ranks, cmp_rank);
        for (int j = 0; j < n_long; j++) {
            uint32_t k = 0;
            if (j) {
                int32_t p = w->ranks[j - 1], r = w->ranks[j];
                uint32_t n = v->olens[p] < v->olens[r] ? v->olens[p] : v->olens[r];
                while (k < n && k < UINT16_MAX && v->obytes[p][k] == v->obytes[r][k]) k++;
            }
            w->lcp[j] = (uint16_t)k;
        }
        w->n = n_long;
        return w;
    }
    for (int b = 0; b < 256; b++) {  // the other tokens of each first byte the class begins with
        if (!lead[b]) continue;
        uint32_t run = 0;  // least lcp since the last token kept (0: another first byte)
        for (int j = u->other_fb[b]; j < u->other_fb[b + 1]; j++) {
            int32_t rank = u->other[j];
            if (u->other_lcp[j] < run) run = u->other_lcp[j];
            if ((int)v->olens[rank] < thr) continue;
            w->ranks[w->n] = rank;
            w->lcp[w->n] = (uint16_t)(w->n ? run : 0);
            w->n++;
            run = UINT32_MAX;
        }
    }
    return w;
}

// e through gram_units: a pure token is accepted when it has at most max_units code points
// (its one path stays inside the repetition and can leave it at its end), else rejected. From
// a copy: the copy's classes, less the pure tokens of more code points, and the other tokens
// of at least thr bytes walked again; without one, all the other tokens are walked.
static int build_units_entry(kaon_grammar_masker *mk, mask_entry *e, const gram_state *start, const mask_entry *copy,
                             const copy_rule *cr) {
    const kaon_grammar_vocab *v = mk->v;
    const gram_units *u = cr->units;
    int over = cr->max_units < GRAM_UNITS_MAX ? cr->max_units + 1 : GRAM_UNITS_MAX + 1;
    // the pure tokens by their count: word-wise through the count bitmaps up to
    // GRAM_UNITS_BITS code points, one by one beyond (few tokens are that long)
    if (copy && over <= GRAM_UNITS_BITS) {  // the copy's, less the pure ones of >= over
        const uint32_t *le = u->le_bits + (size_t)(over - 1) * u->words;
        for (size_t i = 0; i < mk->words; i++) e->accepted[i] = copy->accepted[i] & ~(u->pure_bits[i] & ~le[i]);
    } else if (copy) {
        memcpy(e->accepted, copy->accepted, mk->words * sizeof *e->accepted);
        for (int j = u->cps_start[over]; j < u->cps_start[GRAM_UNITS_MAX + 1]; j++) clear_bit(e->accepted, u->by_cps[j]);
    } else {  // the pure ones of < over
        int c = over - 1 < GRAM_UNITS_BITS ? over - 1 : GRAM_UNITS_BITS;
        memcpy(e->accepted, u->le_bits + (size_t)c * u->words, mk->words * sizeof *e->accepted);
        for (int j = u->cps_start[c + 1]; j < u->cps_start[over]; j++) set_bit(e->accepted, u->by_cps[j]);
    }
    bool lead[256];  // a token whose first byte cannot begin the top's class dies at once
    lead_bytes(mk->g, mk->g->elems[e->key[0]].val, lead);
    const long_list *w = other_tokens_to_walk(mk, u, copy ? cr->thr : 0, lead);
    for (int j = 0; j < w->n; j++) clear_bit(e->accepted, v->order[w->ranks[j]]);
    build_ctx c = {mk, e->accepted, false};
    if (walk_tokens(mk, &mk->work, start, w->ranks, 0, w->lcp, w->n, report_build, &c) || c.failed)
        return kaon_set_error("grammar: mask precomputation failed (too many parse stacks or memory)");
    if (copy && merge_uncertain(mk, &c, copy, cr)) return kaon_set_error("grammar: out of memory");
    return finish_entry(mk, e);
}

// Fills e for its key: a walk from the key's frames over an unknown rest of stack. With a
// copy (e's key with one bounded-repetition position moved to the outermost copy, which
// leaves at least as many units), tokens of fewer than thr bytes cannot tell the two apart
// (grammar_internal.h): they keep the copy's classes and only the longer ones are walked.
//
// With a parent (the entry of e's top PARENT_FRAMES frames over an unknown rest), only the
// parent's uncertain tokens are walked: a token the parent accepts is accepted here (a path
// that never left the parent's frames, or left them at its last byte, which any real frame
// below continues), one it rejects without leaving its frames dies alike here, and the rest
// are the ones whose walk reached a frame the parent does not hold.
static int build_entry(kaon_grammar_masker *mk, mask_entry *e, const mask_entry *copy, const copy_rule *cr,
                       const mask_entry *parent) {
    gram_arena *a = &mk->work;
    gram_arena_truncate(a, 0);
    gram_walk_cache_reset(&mk->wc, a);  // its states named the removed nodes
    a->total = walk_work_limit(mk->v);
    int frames = 0;
    while (frames < MASK_DEPTH && e->key[frames] >= 0) frames++;
    int32_t node = e->key[MASK_DEPTH] ? GNODE_CONTEXT : GNODE_BOTTOM;
    for (int i = frames - 1; i >= 0 && node != -3; i--) {
        node = gram_node(a, e->key[i], node);
        if (node < 0) node = -3;
    }
    if (node == -3) return kaon_set_error("grammar: too many parse stacks");
    gram_state start = {.tops = &node, .n = 1, .cap = 1};
    if (!e->accepted && !(e->accepted = malloc(mk->words * sizeof *e->accepted)))
        return kaon_set_error("grammar: out of memory");
    memset(e->accepted, 0, mk->words * sizeof *e->accepted);
    mk->n_unc = 0;
    build_ctx c = {mk, e->accepted, false};
    const kaon_grammar_vocab *v = mk->v;
    if (parent) {
        memcpy(e->accepted, parent->accepted, mk->words * sizeof *e->accepted);
        if (walk_tokens(mk, a, &start, parent->uncertain, 0, parent->uncertain_lcp, parent->n_uncertain, report_build, &c) ||
            c.failed)
            return kaon_set_error("grammar: mask precomputation failed (too many parse stacks or memory)");
        return finish_entry(mk, e);
    }
    if (cr && cr->units) return build_units_entry(mk, e, &start, copy, cr);
    if (copy) {
        int thr = cr->thr;
        memcpy(e->accepted, copy->accepted, mk->words * sizeof *e->accepted);
        const long_list *l = long_tokens(mk, thr);
        if (!l) return kaon_set_error("grammar: out of memory");
        for (int i = 0; i < l->n; i++) {
            int32_t id = v->order[l->ranks[i]];
            e->accepted[id >> 5] &= ~(1u << (id & 31));
        }
        if (walk_tokens(mk, a, &start, l->ranks, 0, l->lcp, l->n, report_build, &c) || c.failed)
            return kaon_set_error("grammar: mask precomputation failed (too many parse stacks or memory)");
        if (merge_uncertain(mk, &c, copy, cr)) return kaon_set_error("grammar: out of memory");
        return finish_entry(mk, e);
    }
    // only runs of tokens whose first byte can begin a code point of the top's class
    bool lead[256];
    lead_bytes(mk->g, mk->g->elems[e->key[0]].val, lead);
    for (int b = 0; b < 256; b++) {
        if (!lead[b]) continue;
        int end = b + 1;
        while (end < 256 && lead[end]) end++;
        int lo = v->first_byte_start[b], hi = v->first_byte_start[end];
        if (walk_tokens(mk, a, &start, NULL, lo, v->lcp + lo, hi - lo, report_build, &c) || c.failed)
            return kaon_set_error("grammar: mask precomputation failed (too many parse stacks or memory)");
        b = end;
    }
    return finish_entry(mk, e);
}

// Moves the uncertain tokens of the walk just done (mk->unc_buf) into e, with their lcp.
static int finish_entry(kaon_grammar_masker *mk, mask_entry *e) {
    const kaon_grammar_vocab *v = mk->v;
    free(e->uncertain);
    free(e->uncertain_lcp);
    e->n_uncertain = mk->n_unc;
    e->uncertain = malloc((size_t)(mk->n_unc + 1) * sizeof *e->uncertain);
    e->uncertain_lcp = malloc((size_t)(mk->n_unc + 1) * sizeof *e->uncertain_lcp);
    if (!e->uncertain || !e->uncertain_lcp) return kaon_set_error("grammar: out of memory");
    for (int i = 0; i < mk->n_unc; i++) {  // the walk reports in vocabulary order
        int32_t id = mk->unc_buf[i];
        e->uncertain[i] = id;
        uint32_t k = 0;
        if (i) {
            int32_t p = mk->unc_buf[i - 1];
            uint32_t n = v->olens[p] < v->olens[id] ? v->olens[p] : v->olens[id];
            while (k < n && k < UINT16_MAX && v->obytes[p][k] == v->obytes[id][k]) k++;
        }
        e->uncertain_lcp[i] = (uint16_t)k;
    }
    return 0;
}

static uint32_t key_hash(const int32_t *k) {
    uint32_t h = 2166136261u;
    for (int i = 0; i <= MASK_DEPTH; i++) h = (h ^ (uint32_t)k[i]) * 16777619u;
    return h;
}

static void make_key(const gram_arena *a, int depth, int32_t top, int32_t *key) {
    int32_t node = top;
    for (int i = 0; i < MASK_DEPTH; i++) {
        key[i] = node >= 0 && i < depth ? a->pos[node] : -1;
        if (node >= 0 && i < depth) node = a->parent[node];
    }
    key[MASK_DEPTH] = node >= 0;
}

static int32_t *table_slot(kaon_grammar_masker *mk, const int32_t *key) {
    uint32_t h = key_hash(key) & (uint32_t)(mk->table_size - 1);
    for (;; h = (h + 1) & (uint32_t)(mk->table_size - 1)) {
        int32_t i = mk->table[h];
        if (i < 0 || !memcmp(mk->entries[i].key, key, sizeof mk->entries[i].key)) return &mk->table[h];
    }
}

static bool charsets_meet(const kaon_grammar *g, int a, int b) {
    const gram_charset *s = &g->charsets[a];
    for (int i = 0; i < s->n; i++)
        if (gram_charset_meets(g, b, g->ranges[2 * (s->first + i)], g->ranges[2 * (s->first + i) + 1])) return true;
    return false;
}

// Whether top is a one-charset alternative of rule r and every other alternative of r begins
// with a charset disjoint from it: a code point of top's class is then always one whole r.
static bool one_unit_alternative(const kaon_grammar *g, int32_t top, int r) {
    bool found = false;
    for (int j = 0; j < g->alt_count[r]; j++) {
        int32_t a = g->rule_alts[g->alt_first[r] + j];
        if (g->elems[a].type != GEL_CHARS) return false;
        if (a == top) {
            int next = g->elems[a + 1].type;
            if (next != GEL_ALT && next != GEL_END) return false;
            found = true;
        } else if (charsets_meet(g, g->elems[top].val, g->elems[a].val)) {
            return false;
        }
    }
    return found;
}

#define UNITS_UNBOUNDED (1 << 24)  // the units of x* (more than any token's code points)

// k when rule r is opt_k of a bounded repetition of x (opt_k ::= x opt_(k-1) | ""),
// UNITS_UNBOUNDED when r is x* (star ::= x star | ""), else 0.
static int chain_units(const kaon_grammar *g, int r, gram_elem x) {
    int32_t a = g->rule_alts[g->alt_first[r]];
    if (g->alt_count[r] != 2 || g->elems[a].type != x.type || g->elems[a].val != x.val) return 0;
    if (g->rep_rem[a] > 0) return g->rep_rem[a] + 1;  // k >= 2, marked by the compiler
    int32_t empty = g->rule_alts[g->alt_first[r] + 1];
    if (g->elems[empty].type != GEL_END) return 0;
    if (g->elems[a + 1].type == GEL_ALT) return 1;  // opt_1 ::= x | ""
    bool star = g->elems[a + 1].type == GEL_REF && g->elems[a + 1].val == r && g->elems[a + 2].type == GEL_ALT;
    return star ? UNITS_UNBOUNDED : 0;
}

// The units of x the elements from p allow (copies of x, then repetitions of x), the position
// after them in *end.
static int units_from(const kaon_grammar *g, int32_t p, gram_elem x, int32_t *end) {
    int n = 0;
    for (;; p++) {
        gram_elem e = g->elems[p];
        if (e.type == x.type && e.val == x.val) {
            n++;
            continue;
        }
        int k = e.type == GEL_REF ? chain_units(g, e.val, x) : 0;
        if (!k) break;
        n = n + k < UNITS_UNBOUNDED ? n + k : UNITS_UNBOUNDED;
    }
    *end = p;
    return n;
}

// The class of the top's units when the top begins a unit x whose units are single code points
// (alone, copies, a bounded repetition or x*): x is the top's charset itself, or a rule the top
// is a one-unit alternative of (the reference before key[1]); and the element after the units
// is a charset disjoint from the class. A pure token (gram_units) then crosses one unit per code
// point and cannot leave the repetition before its end: it is accepted when it has at most
// *max_units code points (this unit and the ones after it), else rejected. -1 when not so.
static int unit_charset(const kaon_grammar *g, const int32_t *key, int *max_units) {
    int32_t top = key[0], end;
    int cs = g->elems[top].val, frame;  // frame: the key frame the units' rule returns to
    int n;
    if (key[1] >= 1 && g->elems[key[1] - 1].type == GEL_REF && one_unit_alternative(g, top, g->elems[key[1] - 1].val)) {
        n = 1 + units_from(g, key[1], g->elems[key[1] - 1], &end);
        frame = 2;
    } else {
        n = 1 + units_from(g, top + 1, g->elems[top], &end);
        frame = 1;
    }
    int32_t after = end;
    if (g->elems[end].type == GEL_ALT || g->elems[end].type == GEL_END) after = frame < MASK_DEPTH ? key[frame] : -1;
    if (after < 0 || g->elems[after].type != GEL_CHARS || charsets_meet(g, cs, g->elems[after].val)) return -1;
    *max_units = n;
    return cs;
}

// Whether a whole walk from a top of class cs visits much of the vocabulary (then gram_units,
// a pass over every token's bytes, costs less than the walks it saves).
static bool broad_class(const kaon_grammar_masker *mk, int cs) {
    bool lead[256];
    lead_bytes(mk->g, cs, lead);
    int n = 0;
    for (int b = 0; b < 256; b++)
        if (lead[b]) n += mk->v->first_byte_start[b + 1] - mk->v->first_byte_start[b];
    return n > mk->v->n_order / 8;
}

// Sets cr->units and cr->max_units when key's top is a unit of a repetition unit_charset
// describes and its class is broad (else leaves cr->units NULL).
static void units_key(kaon_grammar_masker *mk, const int32_t *key, copy_rule *cr) {
    int cs = unit_charset(mk->g, key, &cr->max_units);
    cr->units = cs >= 0 && broad_class(mk, cs) ? gram_vocab_units(mk->v, mk->g, cs) : NULL;
}

// A bounded-repetition frame of key that another copy may stand for: its index (the topmost
// such frame), with the other copy's key in ck and the token length from which the two may
// differ in *thr; -1 when none (or when too many tokens would need walking again).
static int copy_key(kaon_grammar_masker *mk, const int32_t *key, int32_t *ck, copy_rule *cr) {
    const kaon_grammar *g = mk->g;
    units_key(mk, key, cr);  // with units, only the other tokens need the copy's classes
    for (int i = 0; i < MASK_DEPTH && key[i] >= 0; i++) {
        int32_t c = g->rep_canon[key[i]];
        int rem = g->rep_rem[key[i]];
        if (c < 0) continue;
        // a token of n bytes passes at most n + 1 units of x: a copy leaving rem >= n + 2 units
        // after this one walks it as the outermost copy does
        int t = rem > 1 ? rem - 1 : 0;
        if (!cr->units && (rem < 3 || (t < mk->n_depth && mk->len_count[t] > mk->max_long))) continue;
        memcpy(ck, key, (MASK_DEPTH + 1) * sizeof *ck);
        ck[i] = c;
        cr->thr = t;
        return i;
    }
    return -1;
}

// The entry of key, built on first use (what it is built from first, recursively): from the
// outermost copy of a bounded repetition it sits in, else from its top 3 frames' entry, else
// by a whole walk.
static mask_entry *lookup(kaon_grammar_masker *mk, const int32_t *key) {
    int32_t *slot = table_slot(mk, key);
    if (*slot >= 0) return &mk->entries[*slot];
    const mask_entry *copy = NULL;
    int32_t pk[MASK_DEPTH + 1];
    copy_rule cr = {0};
    if (copy_key(mk, key, pk, &cr) >= 0) {
        copy = lookup(mk, pk);
        if (!copy) return NULL;
        if (copy == &mk->spare) copy = NULL;  // cache full: the spare is about to be reused
    }
    const mask_entry *parent = NULL;
    int frames = 0;
    while (frames < MASK_DEPTH && key[frames] >= 0) frames++;
    if (!copy && frames > PARENT_FRAMES) {
        for (int i = 0; i < MASK_DEPTH; i++) pk[i] = i < PARENT_FRAMES ? key[i] : -1;
        pk[MASK_DEPTH] = 1;
        parent = lookup(mk, pk);
        if (!parent) return NULL;
        if (parent == &mk->spare) parent = NULL;  // cache full: the spare is about to be reused
    }
    if (!copy && !parent) {
        cr.thr = 0;
        units_key(mk, key, &cr);  // e.g. the outermost copy of a string body
    }
    if (mk->n_entries >= MASK_MAX_ENTRIES) {  // cache full: computed each time
        memcpy(mk->spare.key, key, sizeof mk->spare.key);
        return build_entry(mk, &mk->spare, copy, &cr, parent) ? NULL : &mk->spare;
    }
    mask_entry *e = &mk->entries[mk->n_entries];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, sizeof e->key);
    if (build_entry(mk, e, copy, &cr, parent)) {
        entry_free(e);
        return NULL;
    }
    *table_slot(mk, key) = mk->n_entries++;  // the copy's build may have taken the first slot
    return e;
}

kaon_grammar_masker *kaon_grammar_masker_new(const kaon_grammar *g, const kaon_grammar_vocab *v) {
    return gram_masker_new_depth(g, v, MASK_DEPTH);
}

kaon_grammar_masker *gram_masker_new_depth(const kaon_grammar *g, const kaon_grammar_vocab *v, int depth) {
    if (!g || !v || depth < 1 || depth > MASK_DEPTH) {
        kaon_set_error("grammar masker: no grammar or vocabulary");
        return NULL;
    }
    kaon_grammar_masker *mk = calloc(1, sizeof *mk);
    if (!mk) return NULL;
    mk->g = g;
    mk->v = v;
    mk->words = kaon_grammar_mask_words(v->n);
    mk->depth = depth;
    mk->n_depth = v->max_len + 1;
    // token ranks and how many tokens have at least L bytes, for copy_key
    mk->max_long = v->n_order / 8;  // measured: 1/2 .. 1/16 alike
    mk->len_count = calloc((size_t)mk->n_depth + 1, sizeof *mk->len_count);
    mk->longs = calloc((size_t)mk->n_depth + 1, sizeof *mk->longs);
    mk->merge_buf = malloc((size_t)(v->n_order + 1) * sizeof *mk->merge_buf);
    mk->walk_list.ranks = malloc((size_t)(v->n_order + 1) * sizeof *mk->walk_list.ranks);
    mk->walk_list.lcp = malloc((size_t)(v->n_order + 1) * sizeof *mk->walk_list.lcp);
    mk->rank_bits = malloc(((size_t)v->n_order + 64) / 64 * sizeof *mk->rank_bits);
    if (mk->len_count) memcpy(mk->len_count, v->len_at_least, ((size_t)v->max_len + 2) * sizeof *mk->len_count);
    if (mk->longs)
        for (int l = 0; l <= mk->n_depth; l++) mk->longs[l].n = -1;
    mk->depth_states = calloc((size_t)mk->n_depth, sizeof *mk->depth_states);
    mk->depth_ids = calloc((size_t)mk->n_depth, sizeof *mk->depth_ids);
    mk->depth_have = calloc((size_t)mk->n_depth, sizeof *mk->depth_have);
    mk->entries = calloc(MASK_MAX_ENTRIES, sizeof *mk->entries);
    mk->table_size = 2 * MASK_MAX_ENTRIES;
    mk->table = malloc((size_t)mk->table_size * sizeof *mk->table);
    if (!mk->len_count || !mk->longs || !mk->merge_buf || !mk->walk_list.ranks || !mk->walk_list.lcp || !mk->rank_bits ||
        !mk->depth_states || !mk->depth_ids || !mk->depth_have || !mk->entries || !mk->table ||
        gram_arena_init(&mk->work) || gram_walk_cache_init(&mk->wc, g)) {
        kaon_set_error("grammar masker: out of memory");
        kaon_grammar_masker_free(mk);
        return NULL;
    }
    memset(mk->table, 0xff, (size_t)mk->table_size * sizeof *mk->table);
    return mk;
}

void kaon_grammar_masker_free(kaon_grammar_masker *mk) {
    if (!mk) return;
    for (int i = 0; i < mk->n_entries; i++) entry_free(&mk->entries[i]);
    entry_free(&mk->spare);
    free(mk->entries);
    free(mk->table);
    if (mk->depth_states)
        for (int i = 0; i < mk->n_depth; i++) gram_state_free(&mk->depth_states[i]);
    free(mk->depth_states);
    free(mk->depth_ids);
    free(mk->depth_have);
    gram_walk_cache_free(&mk->wc);
    gram_arena_free(&mk->work);
    free(mk->unc_buf);
    free(mk->len_count);
    if (mk->longs)
        for (int l = 0; l <= mk->n_depth; l++) {
            free(mk->longs[l].ranks);
            free(mk->longs[l].lcp);
        }
    free(mk->longs);
    free(mk->merge_buf);
    free(mk->walk_list.ranks);
    free(mk->walk_list.lcp);
    free(mk->rank_bits);
    free(mk);
}

typedef struct {
    const int32_t *order;
    uint32_t *mask;
} mask_ctx;

static void report_mask(void *p, int32_t rank, int cls) {
    mask_ctx *c = p;
    if (cls == 1) set_bit(c->mask, c->order[rank]);
}

// The first token in vocabulary order whose first byte is >= b.
static int first_with_byte_at_least(const kaon_grammar_vocab *v, uint8_t b) {
    int lo = 0, hi = v->n_order;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v->bytes[v->order[mid]][0] < b) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int kaon_grammar_fill_mask(kaon_grammar_masker *mk, kaon_grammar_matcher *m, uint32_t *mask) {
    if (gram_matcher_grammar(m) != mk->g) return kaon_set_error("grammar: matcher and masker differ");
    memset(mask, 0, mk->words * sizeof *mask);
    if (gram_matcher_ended(m)) return 0;
    const gram_state *st = gram_matcher_state(m);
    gram_arena *a = gram_matcher_arena(m);
    int mark = a->n;
    int rc = 0;
    gram_walk_cache_reset(&mk->wc, a);  // the matcher's arena changed since the last mask
    a->total = walk_work_limit(mk->v);
    const kaon_grammar_vocab *v = mk->v;
    mask_ctx mc = {v->order, mask};
    if (st->rem) {
        // mid code point (a token ended inside one): only tokens that begin with a
        // continuation byte can follow, one contiguous run of the sorted vocabulary
        int lo = first_with_byte_at_least(v, 0x80), hi = first_with_byte_at_least(v, 0xC0);
        rc = walk_tokens(mk, a, st, NULL, lo, v->lcp + lo, hi - lo, report_mask, &mc);
    } else {
        const mask_entry *done[64];
        int n_done = 0;
        for (int t = 0; t < st->n && !rc; t++) {
            int32_t key[MASK_DEPTH + 1];
            make_key(a, mk->depth, st->tops[t], key);
            mask_entry *e = lookup(mk, key);
            if (!e) {
                rc = -1;
                break;
            }
            bool seen = false;
            for (int j = 0; j < n_done && !seen; j++) seen = done[j] == e;
            if (!seen) {
                for (size_t w = 0; w < mk->words; w++) mask[w] |= e->accepted[w];
                if (n_done < 64 && e != &mk->spare) done[n_done++] = e;
            }
            if (e->n_uncertain) {
                int32_t top = st->tops[t];
                gram_state one = {.tops = &top, .n = 1, .cap = 1};
                rc = walk_tokens(mk, a, &one, e->uncertain, 0, e->uncertain_lcp, e->n_uncertain, report_mask, &mc);
            }
        }
    }
    gram_arena_truncate(a, mark);  // the stacks the walks built are not part of the state
    gram_walk_cache_reset(&mk->wc, NULL);  // its states may name the removed nodes
    if (rc) return kaon_set_error("grammar: mask failed (too many parse stacks or memory)");
    if (st->accept)
        for (int i = 0; i < v->n_eog; i++) set_bit(mask, v->eog_ids[i]);
    return 0;
}

bool kaon_grammar_matcher_accept_token(kaon_grammar_matcher *m, const kaon_grammar_vocab *v, int32_t id) {
    if (id < 0 || id >= v->n || gram_matcher_ended(m)) return false;
    if (v->eog[id]) {
        if (!kaon_grammar_matcher_can_end(m)) return false;
        gram_matcher_set_ended(m);
        return true;
    }
    if (v->special[id] || !v->lens[id]) return false;
    return kaon_grammar_matcher_accept_bytes(m, v->bytes[id], v->lens[id]);
}
