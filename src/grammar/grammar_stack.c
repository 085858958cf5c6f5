// The stack machinery: hash-consed stack nodes, expansion of a stack to the character
// elements it can match next, and one byte of input (UTF-8 decoded to code points).
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/err.h"

static uint32_t node_hash(int32_t pos, int32_t parent) {
    uint64_t x = (uint64_t)(uint32_t)pos * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)parent * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(x >> 29 ^ x >> 7);
}

int gram_arena_init(gram_arena *a) {
    memset(a, 0, sizeof *a);
    a->n_buckets = 1024;
    a->bucket = malloc((size_t)a->n_buckets * sizeof *a->bucket);
    if (!a->bucket) return kaon_set_error("grammar: out of memory");
    memset(a->bucket, 0xff, (size_t)a->n_buckets * sizeof *a->bucket);
    a->gen = 1;
    a->total = INT64_MAX;
    a->memo_epoch = 1;  // slots start at epoch 0: empty
    a->memo_max_id = -1;
    return 0;
}

void gram_arena_free(gram_arena *a) {
    free(a->pos);
    free(a->parent);
    free(a->next);
    free(a->seen);
    free(a->bucket);
    free(a->work);
    free(a->memo);
    free(a->memo_pool);
    memset(a, 0, sizeof *a);
}

// Transition memo. A step's result for one top depends only on that stack and the code
// point, and hash-consing keeps a stack's id while the nodes up to it live, so walks over
// a vocabulary (which step the same stacks by the same bytes for many tokens) skip most
// expansions.
#define MEMO_MIN_SLOTS 4096
#define MEMO_MAX_SLOTS (1 << 18)
#define MEMO_MAX_POOL (1 << 22)

static void memo_clear(gram_arena *a) {
    if (++a->memo_epoch == 0) {  // wrapped: old stamps could match again
        if (a->memo) memset(a->memo, 0, (size_t)a->memo_cap * sizeof *a->memo);
        a->memo_epoch = 1;
    }
    a->memo_n = a->memo_pool_n = 0;
    a->memo_max_id = -1;
}

static uint32_t memo_hash(int32_t top, uint32_t cp) {
    uint32_t h = (uint32_t)top * 0x9E3779B1u ^ cp * 0x85EBCA77u;
    return h ^ h >> 15;
}

static gram_memo *memo_slot(const gram_arena *a, int32_t top, uint32_t cp, bool *found) {
    uint32_t mask = (uint32_t)a->memo_cap - 1;
    for (uint32_t h = memo_hash(top, cp) & mask;; h = (h + 1) & mask) {
        gram_memo *m = &a->memo[h];
        *found = m->epoch == a->memo_epoch;
        if (!*found || (m->top == top && m->cp == cp)) return m;
    }
}

static const gram_memo *memo_find(const gram_arena *a, int32_t top, uint32_t cp) {
    if (!a->memo_n) return NULL;
    bool found;
    const gram_memo *m = memo_slot(a, top, cp, &found);
    return found ? m : NULL;
}

// A table twice the size with the live entries; false when it cannot grow.
static bool memo_grow(gram_arena *a) {
    int nc = a->memo_cap ? a->memo_cap * 2 : MEMO_MIN_SLOTS;
    if (nc > MEMO_MAX_SLOTS) return false;
    gram_memo *old = a->memo, *m = calloc((size_t)nc, sizeof *m);
    if (!m) return false;
    int old_cap = a->memo_cap;
    uint32_t epoch = a->memo_epoch;
    a->memo = m;
    a->memo_cap = nc;
    a->memo_epoch = 1;
    for (int i = 0; i < old_cap; i++) {
        if (old[i].epoch != epoch) continue;
        bool found;
        gram_memo *s = memo_slot(a, old[i].top, old[i].cp, &found);
        *s = old[i];
        s->epoch = 1;
    }
    free(old);
    return true;
}

static bool memo_reserve_pool(gram_arena *a, int n) {
    if (a->memo_pool_n + n <= a->memo_pool_cap) return true;
    if (a->memo_pool_n + n > MEMO_MAX_POOL) return false;
    int nc = a->memo_pool_cap ? a->memo_pool_cap : 4096;
    while (nc < a->memo_pool_n + n) nc *= 2;
    int32_t *p = realloc(a->memo_pool, (size_t)nc * sizeof *p);
    if (!p) return false;
    a->memo_pool = p;
    a->memo_pool_cap = nc;
    return true;
}

// Records a top's step. Best effort: when full the memo starts over, and a failed
// allocation only means the step is not remembered.
static void memo_store(gram_arena *a, int32_t top, uint32_t cp, const int32_t *tops, int n, bool accept, bool ctx_now) {
    if ((a->memo_n + 1) * 2 > a->memo_cap && !memo_grow(a)) {
        if (!a->memo_cap) return;
        memo_clear(a);
    }
    if (!memo_reserve_pool(a, n)) {
        memo_clear(a);
        if (!memo_reserve_pool(a, n)) return;
    }
    bool found;
    gram_memo *m = memo_slot(a, top, cp, &found);
    *m = (gram_memo){top, cp, a->memo_pool_n, n, a->memo_epoch, accept, ctx_now};
    if (!found) a->memo_n++;
    int32_t hi = top;
    for (int i = 0; i < n; i++) {
        a->memo_pool[a->memo_pool_n++] = tops[i];
        if (tops[i] > hi) hi = tops[i];
    }
    if (hi > a->memo_max_id) a->memo_max_id = hi;
}

// Nodes are removed newest first, so each is the head of its bucket chain.
void gram_arena_truncate(gram_arena *a, int n) {
    uint32_t mask = (uint32_t)a->n_buckets - 1;
    for (int i = a->n - 1; i >= n; i--) a->bucket[node_hash(a->pos[i], a->parent[i]) & mask] = a->next[i];
    if (n < a->n) a->n = n;
    a->overflow = false;
    if (a->memo_max_id >= n) memo_clear(a);  // entries may name removed ids
}

static int rehash(gram_arena *a) {
    int nb = a->n_buckets * 2;
    int32_t *b = malloc((size_t)nb * sizeof *b);
    if (!b) return -1;
    memset(b, 0xff, (size_t)nb * sizeof *b);
    for (int i = 0; i < a->n; i++) {  // in id order: the newest node ends up at each head
        uint32_t h = node_hash(a->pos[i], a->parent[i]) & (uint32_t)(nb - 1);
        a->next[i] = b[h];
        b[h] = i;
    }
    free(a->bucket);
    a->bucket = b;
    a->n_buckets = nb;
    return 0;
}

int32_t gram_node(gram_arena *a, int32_t pos, int32_t parent) {
    uint32_t h = node_hash(pos, parent) & (uint32_t)(a->n_buckets - 1);
    for (int32_t i = a->bucket[h]; i >= 0; i = a->next[i])
        if (a->pos[i] == pos && a->parent[i] == parent) return i;
    if (a->n == a->cap) {
        if (a->cap >= KAON_GRAMMAR_MAX_NODES) {
            a->overflow = true;
            return -1;
        }
        int nc = a->cap ? a->cap * 2 : 1024;
        int32_t *p = realloc(a->pos, (size_t)nc * sizeof *p);
        if (p) a->pos = p;
        int32_t *q = realloc(a->parent, (size_t)nc * sizeof *q);
        if (q) a->parent = q;
        int32_t *r = realloc(a->next, (size_t)nc * sizeof *r);
        if (r) a->next = r;
        uint32_t *s = realloc(a->seen, (size_t)nc * sizeof *s);
        if (s) a->seen = s;
        if (!p || !q || !r || !s) {
            a->overflow = true;
            return -1;
        }
        a->cap = nc;
    }
    int32_t i = a->n++;
    a->pos[i] = pos;
    a->parent[i] = parent;
    a->seen[i] = 0;
    a->next[i] = a->bucket[h];
    a->bucket[h] = i;
    if (a->n > a->n_buckets && rehash(a)) {
        a->overflow = true;
        return -1;
    }
    return i;
}

static int push_top(gram_state *s, int32_t id) {
    if (s->n >= KAON_GRAMMAR_MAX_TOPS) return -1;
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 16;
        int32_t *t = realloc(s->tops, (size_t)nc * sizeof *t);
        if (!t) return -1;
        s->tops = t;
        s->cap = nc;
    }
    s->tops[s->n++] = id;
    return 0;
}

static int push_work(gram_arena *a, int32_t id) {
    if (a->n_work == a->cap_work) {
        int nc = a->cap_work ? a->cap_work * 2 : 64;
        int32_t *w = realloc(a->work, (size_t)nc * sizeof *w);
        if (!w) return -1;
        a->work = w;
        a->cap_work = nc;
    }
    a->work[a->n_work++] = id;
    return 0;
}

static void next_generation(gram_arena *a) {
    if (++a->gen == 0) {  // wrapped: old stamps could collide
        memset(a->seen, 0, (size_t)a->cap * sizeof *a->seen);
        a->gen = 1;
    }
}

// Adds to `out` the tops reachable from stack `node`: references open their rule's
// alternatives, finished rules continue with their parent. Nodes seen this generation are
// skipped, so shared stacks expand once.
static int expand(const kaon_grammar *g, gram_arena *a, int32_t node, gram_state *out) {
    if (node < 0 || push_work(a, node)) return -1;
    while (a->n_work) {
        int32_t id = a->work[--a->n_work];
        if (a->seen[id] >= a->step_gen) {
            if (a->seen[id] != a->gen) a->partial = true;  // an earlier top's: not memoizable
            continue;
        }
        if (--a->budget < 0 || --a->total < 0) {
            a->overflow = true;
            return -1;
        }
        a->seen[id] = a->gen;
        int32_t pos = a->pos[id];
        const gram_elem *e = &g->elems[pos];
        if (e->type == GEL_CHARS) {
            if (push_top(out, id)) return -1;
        } else if (e->type == GEL_REF) {
            // a reference that ends its alternative continues with the parent itself (a tail
            // call): repetitions (star ::= x star | ) then keep a constant stack depth
            int32_t next_type = g->elems[pos + 1].type, cont = a->parent[id];
            if (next_type != GEL_END && next_type != GEL_ALT && (cont = gram_node(a, pos + 1, cont)) < 0) return -1;
            for (int k = 0; k < g->alt_count[e->val]; k++) {
                int32_t child = gram_node(a, g->rule_alts[g->alt_first[e->val] + k], cont);
                if (child < 0 || push_work(a, child)) return -1;
            }
        } else {  // the rule is done
            int32_t parent = a->parent[id];
            if (parent == GNODE_BOTTOM) out->accept = true;
            else if (parent == GNODE_CONTEXT) out->ctx_now = true;
            else if (push_work(a, parent)) return -1;
        }
    }
    return 0;
}

static void state_clear(gram_state *s) {
    s->n = 0;
    s->accept = s->ctx_now = s->ctx_any = false;
    s->cp = 0;
    s->rem = s->len = 0;
}

void gram_state_free(gram_state *s) {
    free(s->tops);
    memset(s, 0, sizeof *s);
}

int gram_state_copy(gram_state *dst, const gram_state *src) {
    state_clear(dst);
    for (int i = 0; i < src->n; i++)
        if (push_top(dst, src->tops[i])) return -1;
    dst->accept = src->accept;
    dst->ctx_now = src->ctx_now;
    dst->ctx_any = src->ctx_any;
    dst->cp = src->cp;
    dst->rem = src->rem;
    dst->len = src->len;
    return 0;
}

int gram_state_from_node(const kaon_grammar *g, gram_arena *a, int32_t node, gram_state *out) {
    state_clear(out);
    next_generation(a);
    a->step_gen = a->gen;
    a->n_work = 0;
    a->budget = KAON_GRAMMAR_MAX_STEP_WORK;
    return expand(g, a, node, out);
}

// Adds a remembered step's tops not yet in out (stamped with this step's generations).
static int merge_memo(gram_arena *a, const gram_memo *m, gram_state *out) {
    for (int k = 0; k < m->n; k++) {
        int32_t id = a->memo_pool[m->off + k];
        if (a->seen[id] >= a->step_gen) continue;
        a->seen[id] = a->gen;
        if (--a->total < 0) {
            a->overflow = true;
            return -1;
        }
        if (push_top(out, id)) return -1;
    }
    out->accept |= m->accept;
    out->ctx_now |= m->ctx_now;
    return 0;
}

// One top that matches cp: its successor stack expanded into out, from the memo or
// expanded (and remembered when no earlier top of this step cut the expansion short).
static int step_top(const kaon_grammar *g, gram_arena *a, int32_t t, uint32_t cp, gram_state *out) {
    const gram_memo *m = memo_find(a, t, cp);
    if (m) return merge_memo(a, m, out);
    bool accept = out->accept, ctx_now = out->ctx_now;
    out->accept = out->ctx_now = false;
    int first = out->n;
    a->partial = false;
    if (expand(g, a, gram_node(a, a->pos[t] + 1, a->parent[t]), out)) return -1;
    const int32_t *found = out->n > first ? out->tops + first : NULL;  // tops may be NULL
    if (!a->partial) memo_store(a, t, cp, found, out->n - first, out->accept, out->ctx_now);
    out->accept |= accept;
    out->ctx_now |= ctx_now;
    return 0;
}

int gram_step(const kaon_grammar *g, gram_arena *a, const gram_state *in, uint8_t byte, gram_state *out) {
    state_clear(out);
    out->ctx_any = in->ctx_any;
    uint32_t cp;
    uint8_t rem, len;
    if (!in->rem) {
        if (byte < 0x80) cp = byte, rem = 0, len = 1;
        else if (byte >= 0xC2 && byte <= 0xDF) cp = byte & 0x1Fu, rem = 1, len = 2;
        else if ((byte & 0xF0) == 0xE0) cp = byte & 0x0Fu, rem = 2, len = 3;
        else if (byte >= 0xF0 && byte <= 0xF4) cp = byte & 0x07u, rem = 3, len = 4;
        else return 0;  // not a lead byte: dead
    } else {
        if ((byte & 0xC0) != 0x80) return 0;
        cp = in->cp << 6 | (byte & 0x3Fu);
        rem = (uint8_t)(in->rem - 1);
        len = in->len;
        if (!rem && ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
                     (cp >= 0xD800 && cp <= 0xDFFF)))
            return 0;  // overlong, out of range or a surrogate
    }
    if (rem) {  // mid code point: keep the tops whose class has a code point with this prefix
        uint32_t lo = cp << (6 * rem), hi = lo | ((1u << (6 * rem)) - 1);
        // only code points this length may encode: no overlong forms, no surrogates
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}, max_cp[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
        if (lo < min_cp[len]) lo = min_cp[len];
        if (hi > max_cp[len]) hi = max_cp[len];
        if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return 0;
        for (int i = 0; i < in->n; i++)
            if (gram_charset_meets(g, g->elems[a->pos[in->tops[i]]].val, lo, hi) && push_top(out, in->tops[i]))
                return -1;
        out->cp = cp;
        out->rem = rem;
        out->len = len;
        return 0;
    }
    if (a->gen > UINT32_MAX - (uint32_t)in->n - 2) {  // room for a generation per top
        memset(a->seen, 0, (size_t)a->cap * sizeof *a->seen);
        a->gen = 0;
    }
    a->step_gen = a->gen + 1;
    a->n_work = 0;
    a->budget = KAON_GRAMMAR_MAX_STEP_WORK;
    for (int i = 0; i < in->n; i++) {
        int32_t t = in->tops[i];
        if (!gram_charset_has(g, g->elems[a->pos[t]].val, cp)) continue;
        a->gen++;
        if (step_top(g, a, t, cp, out)) return -1;
    }
    if (out->ctx_now) out->ctx_any = true;
    return 0;
}
