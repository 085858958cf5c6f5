// The grammar constraint (grammar_constraint.h). The masker's cache fills lazily and is not
// thread-safe: the engine calls `allowed` and `accept` from its own thread only, so sharing it
// between a request's sequences is safe; clone and free may come from other threads (submit,
// request free), hence the atomic count on the shared part.
#include "grammar/grammar_constraint.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "util/err.h"

typedef struct shared_grammar {
    atomic_int refs;
    kaon_grammar *g;
    const kaon_grammar_vocab *v;
    kaon_grammar_masker *mk;
} shared_grammar;

typedef struct grammar_state {
    shared_grammar *sh;
    kaon_grammar_matcher *m;
    int32_t *toks;  // accepted so far: a clone replays them
    int n, cap;
} grammar_state;

static void shared_release(shared_grammar *sh) {
    if (!sh || atomic_fetch_sub(&sh->refs, 1) != 1) return;
    kaon_grammar_masker_free(sh->mk);
    kaon_grammar_free(sh->g);
    free(sh);
}

static void state_free(void *p) {
    grammar_state *st = p;
    if (!st) return;
    kaon_grammar_matcher_free(st->m);
    free(st->toks);
    shared_release(st->sh);
    free(st);
}

static grammar_state *state_new(shared_grammar *sh) {
    grammar_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    atomic_fetch_add(&sh->refs, 1);
    st->sh = sh;
    st->m = kaon_grammar_matcher_new(sh->g);
    if (!st->m) {
        state_free(st);
        return NULL;
    }
    return st;
}

static int state_accept(void *p, int32_t tok) {
    grammar_state *st = p;
    if (!kaon_grammar_matcher_accept_token(st->m, st->sh->v, tok)) return -1;
    if (st->n == st->cap) {
        int cap = st->cap ? st->cap * 2 : 64;
        int32_t *t = realloc(st->toks, sizeof *t * (size_t)cap);
        if (!t) return -1;
        st->toks = t;
        st->cap = cap;
    }
    st->toks[st->n++] = tok;
    return 0;
}

static void *state_clone(const void *p) {
    const grammar_state *src = p;
    grammar_state *st = state_new(src->sh);
    if (!st) return NULL;
    for (int i = 0; i < src->n; i++)
        if (state_accept(st, src->toks[i])) {
            state_free(st);
            return NULL;
        }
    return st;
}

static int state_allowed(void *p, uint32_t *mask, int vocab) {
    grammar_state *st = p;
    shared_grammar *sh = st->sh;
    if (kaon_grammar_vocab_size(sh->v) > vocab) return -1;  // cannot happen: checked at new
    return kaon_grammar_fill_mask(sh->mk, st->m, mask);
}

const kaon_constraint_ops kaon_grammar_constraint_ops = {
    .allowed = state_allowed,
    .accept = state_accept,
    .clone = state_clone,
    .free = state_free,
};

void *kaon_grammar_constraint_new(kaon_grammar *g, const kaon_grammar_vocab *v) {
    shared_grammar *sh = calloc(1, sizeof *sh);
    if (!sh) {
        kaon_grammar_free(g);
        kaon_set_error("grammar: out of memory");
        return NULL;
    }
    sh->g = g;
    sh->v = v;
    sh->mk = kaon_grammar_masker_new(g, v);
    if (!sh->mk) {
        kaon_grammar_free(g);
        free(sh);
        return NULL;
    }
    if (kaon_grammar_vocab_size(v) <= 0) {
        kaon_set_error("grammar: empty vocabulary");
        kaon_grammar_masker_free(sh->mk);
        kaon_grammar_free(g);
        free(sh);
        return NULL;
    }
    atomic_init(&sh->refs, 1);  // this function's, dropped below: the state keeps its own
    grammar_state *st = state_new(sh);
    shared_release(sh);
    return st;
}
