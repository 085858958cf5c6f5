// The matcher: the current set of stacks plus one saved state per accepted step, so
// rollback is a truncation. States live in one pool of top ids.
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "util/err.h"

typedef struct {
    size_t off;  // into pool
    int n;
    bool accept, ended;
    uint32_t cp;
    uint8_t rem, len;
} saved_state;

struct kaon_grammar_matcher {
    const kaon_grammar *g;
    gram_arena arena;
    int32_t *pool;
    size_t pool_n, pool_cap;
    saved_state *hist;  // hist[0]: the start; hist[n_hist - 1]: the current state
    int n_hist, cap_hist;
    gram_state cur;  // a view of the last saved state (tops point into pool)
    gram_state tmp[2];
};

static void refresh_view(kaon_grammar_matcher *m) {
    const saved_state *s = &m->hist[m->n_hist - 1];
    // a grammar matching only "" has no stacks: the pool is never allocated (NULL + 0 is UB)
    m->cur.tops = m->pool ? m->pool + s->off : NULL;
    m->cur.n = m->cur.cap = s->n;
    m->cur.accept = s->accept;
    m->cur.ctx_now = m->cur.ctx_any = false;
    m->cur.cp = s->cp;
    m->cur.rem = s->rem;
    m->cur.len = s->len;
}

static int save_state(kaon_grammar_matcher *m, const gram_state *s, bool ended) {
    if (m->n_hist == m->cap_hist) {
        int nc = m->cap_hist ? m->cap_hist * 2 : 64;
        saved_state *h = realloc(m->hist, (size_t)nc * sizeof *h);
        if (!h) return kaon_set_error("grammar: out of memory");
        m->hist = h;
        m->cap_hist = nc;
    }
    if (m->pool_n + (size_t)s->n > m->pool_cap) {
        size_t nc = m->pool_cap ? m->pool_cap * 2 : 256;
        while (nc < m->pool_n + (size_t)s->n) nc *= 2;
        int32_t *p = realloc(m->pool, nc * sizeof *p);
        if (!p) return kaon_set_error("grammar: out of memory");
        m->pool = p;
        m->pool_cap = nc;
    }
    if (s->n) memcpy(m->pool + m->pool_n, s->tops, (size_t)s->n * sizeof *s->tops);
    m->hist[m->n_hist++] = (saved_state){m->pool_n, s->n, s->accept, ended, s->cp, s->rem, s->len};
    m->pool_n += (size_t)s->n;
    refresh_view(m);
    return 0;
}

static int start_state(kaon_grammar_matcher *m) {
    const kaon_grammar *g = m->g;
    gram_state *s = &m->tmp[0];
    s->n = 0;
    s->accept = s->ctx_now = s->ctx_any = false;
    s->rem = s->len = 0;
    s->cp = 0;
    // the root's alternatives, each a stack over the bottom
    for (int k = 0; k < g->alt_count[g->root]; k++) {
        int32_t node = gram_node(&m->arena, g->rule_alts[g->alt_first[g->root] + k], GNODE_BOTTOM);
        gram_state one = {0};
        if (node < 0 || gram_state_from_node(g, &m->arena, node, &one)) {
            gram_state_free(&one);
            return kaon_set_error("grammar: too ambiguous (parse stacks over the limit)");
        }
        for (int i = 0; i < one.n; i++) {
            bool dup = false;
            for (int j = 0; j < s->n && !dup; j++) dup = s->tops[j] == one.tops[i];
            if (dup) continue;
            if (s->n >= KAON_GRAMMAR_MAX_TOPS) {
                gram_state_free(&one);
                return kaon_set_error("grammar: too ambiguous (parse stacks over the limit)");
            }
            if (s->n == s->cap) {
                int nc = s->cap ? s->cap * 2 : 16;
                int32_t *t = realloc(s->tops, (size_t)nc * sizeof *t);
                if (!t) {
                    gram_state_free(&one);
                    return kaon_set_error("grammar: out of memory");
                }
                s->tops = t;
                s->cap = nc;
            }
            s->tops[s->n++] = one.tops[i];
        }
        s->accept |= one.accept;
        gram_state_free(&one);
    }
    m->n_hist = 0;
    m->pool_n = 0;
    return save_state(m, s, false);
}

kaon_grammar_matcher *kaon_grammar_matcher_new(const kaon_grammar *g) {
    if (!g) {
        kaon_set_error("grammar: no grammar");
        return NULL;
    }
    kaon_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->g = g;
    if (gram_arena_init(&m->arena) || start_state(m)) {
        kaon_grammar_matcher_free(m);
        return NULL;
    }
    return m;
}

void kaon_grammar_matcher_free(kaon_grammar_matcher *m) {
    if (!m) return;
    gram_arena_free(&m->arena);
    free(m->pool);
    free(m->hist);
    gram_state_free(&m->tmp[0]);
    gram_state_free(&m->tmp[1]);
    free(m);
}

void kaon_grammar_matcher_reset(kaon_grammar_matcher *m) {
    m->n_hist = 1;
    m->pool_n = m->hist[0].off + (size_t)m->hist[0].n;
    refresh_view(m);
}

bool kaon_grammar_matcher_accept_bytes(kaon_grammar_matcher *m, const void *bytes, size_t len) {
    if (gram_matcher_ended(m)) return false;
    const uint8_t *b = bytes;
    const gram_state *in = &m->cur;
    m->arena.total = KAON_GRAMMAR_WALK_WORK_BASE + (int64_t)KAON_GRAMMAR_MAX_STEP_WORK * (int64_t)len;
    int k = 0;
    for (size_t i = 0; i < len; i++) {
        gram_state *out = &m->tmp[k];
        if (gram_step(m->g, &m->arena, in, b[i], out)) {
            kaon_set_error("grammar: too ambiguous (parse stacks over the limit)");
            return false;
        }
        if (!gram_state_viable(out)) return false;
        in = out;
        k ^= 1;
    }
    if (!len) {  // an empty token: the state is saved again so rollback counts it
        if (gram_state_copy(&m->tmp[0], &m->cur)) return false;
        in = &m->tmp[0];
    }
    return save_state(m, in, false) == 0;
}

bool kaon_grammar_matcher_can_end(const kaon_grammar_matcher *m) {
    return !gram_matcher_ended(m) && m->cur.accept;
}

bool kaon_grammar_matcher_can_continue(const kaon_grammar_matcher *m) {
    return !gram_matcher_ended(m) && m->cur.n > 0;
}

int kaon_grammar_matcher_steps(const kaon_grammar_matcher *m) { return m->n_hist - 1; }

int kaon_grammar_matcher_rollback(kaon_grammar_matcher *m, int k) {
    if (k < 0 || k > m->n_hist - 1) return kaon_set_error("grammar: cannot roll back %d of %d steps", k, m->n_hist - 1);
    m->n_hist -= k;
    m->pool_n = m->hist[m->n_hist - 1].off + (size_t)m->hist[m->n_hist - 1].n;
    refresh_view(m);
    return 0;
}

const gram_state *gram_matcher_state(const kaon_grammar_matcher *m) { return &m->cur; }
gram_arena *gram_matcher_arena(kaon_grammar_matcher *m) { return &m->arena; }
const kaon_grammar *gram_matcher_grammar(const kaon_grammar_matcher *m) { return m->g; }
bool gram_matcher_ended(const kaon_grammar_matcher *m) { return m->hist[m->n_hist - 1].ended; }

// End of generation: the same stacks, marked ended, as one more step (so it rolls back too).
void gram_matcher_set_ended(kaon_grammar_matcher *m) {
    if (gram_state_copy(&m->tmp[0], &m->cur) == 0) save_state(m, &m->tmp[0], true);
}
