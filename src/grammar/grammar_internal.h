// The compiled grammar and the matcher's stack machinery, shared by the grammar files.
#ifndef KAON_GRAMMAR_INTERNAL_H
#define KAON_GRAMMAR_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "grammar/grammar.h"

// Rules are flattened into one element array: rule r starts at rule_start[r], its
// alternatives follow each other separated by ALT, and END closes the rule.
enum { GEL_END, GEL_ALT, GEL_REF, GEL_CHARS };
typedef struct {
    int32_t type;
    int32_t val;  // REF: rule id; CHARS: charset id
} gram_elem;

// A charset is a sorted list of disjoint code point ranges (negations are complemented).
typedef struct {
    int32_t first, n;    // into ranges[]
    uint32_t ascii[4];   // code points 0..127 as bits: the common case skips the range search
} gram_charset;

struct kaon_grammar {
    gram_elem *elems;
    int n_elems;
    int32_t *rule_alts;  // rule r's alternative starts: rule_alts[alt_first[r] .. + alt_count[r]]
    int32_t *alt_first, *alt_count;
    int n_rules;
    uint32_t *ranges;  // lo, hi pairs
    gram_charset *charsets;
    int n_charsets;
    int root;
    // Bounded repetitions (x{m,n}: opt_k ::= x opt_(k-1) | ""): for the positions of x and of
    // the reference after it in opt_k (k >= 2), the same position in the outermost opt_K
    // (rep_canon, -1 elsewhere and in opt_K itself) and the units left after this one
    // (rep_rem = k - 1, 0 elsewhere). Two
    // copies walk a token alike when both leave more units than the token has bytes.
    int32_t *rep_canon, *rep_rem;
};

bool gram_charset_has(const kaon_grammar *g, int cs, uint32_t cp);
bool gram_charset_meets(const kaon_grammar *g, int cs, uint32_t lo, uint32_t hi);

// Stacks are hash-consed linked nodes: (pos = element to match next, parent = the node to
// continue with when this rule ends). Equal stacks share one id, so a state is a set of ids.
#define GNODE_BOTTOM (-1)   // the stack ends here: the grammar is complete
#define GNODE_CONTEXT (-2)  // an unknown rest of stack (mask precomputation)
// A memoized step of one top over one code point: the tops its expansion reaches (pool[off ..
// off + n)) and whether it reached the bottom / the context. Valid while the epoch matches.
typedef struct {
    int32_t top;
    uint32_t cp;
    int32_t off, n;
    uint32_t epoch;
    uint8_t accept, ctx_now;
} gram_memo;

typedef struct {
    int32_t *pos, *parent, *next;
    uint32_t *seen;  // generation stamps for dedup within one step (one generation per top)
    uint32_t step_gen;  // the first generation of the current step
    int32_t *bucket;
    int n, cap, n_buckets;
    uint32_t gen;
    int32_t *work;  // expansion worklist
    int n_work, cap_work;
    int budget;        // work items left in this byte's step
    int64_t total;     // work items left in this walk or token (set by the caller)
    bool overflow;
    bool partial;      // this top's expansion met nodes an earlier top of the step expanded
    gram_memo *memo;   // open addressing by (top, cp)
    int memo_cap, memo_n;
    uint32_t memo_epoch;
    int32_t *memo_pool;
    int memo_pool_n, memo_pool_cap;
    int32_t memo_max_id;  // the highest node id a live memo entry names (-1: none)
} gram_arena;

// One matcher state: the stack tops (each at a CHARS element), whether the grammar may end
// here, and a partially read UTF-8 code point.
typedef struct {
    int32_t *tops;
    int n, cap;
    bool accept;
    bool ctx_now, ctx_any;  // popped into GNODE_CONTEXT at this byte / at any byte so far
    uint32_t cp;
    uint8_t rem, len;  // continuation bytes still expected, total bytes of the code point
} gram_state;

int gram_arena_init(gram_arena *a);
void gram_arena_free(gram_arena *a);
void gram_arena_truncate(gram_arena *a, int n);
int32_t gram_node(gram_arena *a, int32_t pos, int32_t parent);
void gram_state_free(gram_state *s);
// The state of the given stack (expanded to its tops). Returns -1 on overflow.
int gram_state_from_node(const kaon_grammar *g, gram_arena *a, int32_t node, gram_state *out);
// out = in after one byte. Returns 0; -1 on arena overflow. Dead when !gram_state_viable.
int gram_step(const kaon_grammar *g, gram_arena *a, const gram_state *in, uint8_t byte,
              gram_state *out);
static inline bool gram_state_viable(const gram_state *s) {
    return s->n > 0 || s->accept || s->ctx_now;
}
int gram_state_copy(gram_state *dst, const gram_state *src);

// Interned walk states and their byte transitions (grammar_walk_cache.c).
typedef struct {
    uint32_t hash, cp;
    int32_t off, n;  // tops: pool[off .. off + n)
    uint8_t flags, rem, len;  // flags: accept, ctx_now, ctx_any, then WC_ANY_CP
} gram_wc_state;
typedef struct {
    int32_t id;
    uint32_t epoch;
} gram_wc_slot;
typedef struct {
    gram_wc_state *states;
    int n_states, cap_states;
    gram_wc_slot *state_slot;  // open addressing by state hash
    int32_t *rows;             // [state * 256 + byte]: the successor, -1 unknown
    int32_t *pool;
    int pool_n, pool_cap;
    uint32_t epoch;  // slots of other epochs are empty
    const gram_arena *arena;  // whose node ids the states hold
    const kaon_grammar *g;    // whose charsets the tops are at
} gram_walk_cache;

int gram_walk_cache_init(gram_walk_cache *c, const kaon_grammar *g);
void gram_walk_cache_free(gram_walk_cache *c);
void gram_walk_cache_reset(gram_walk_cache *c, const gram_arena *a);
int32_t gram_walk_cache_intern(gram_walk_cache *c, const gram_state *s);
int gram_walk_cache_load(const gram_walk_cache *c, int32_t id, gram_state *out);
// The state `from` steps to on `byte`, or -1 when not known yet.
static inline int32_t gram_walk_cache_next(const gram_walk_cache *c, int32_t from, uint8_t byte) {
    return c->rows[(size_t)from * 256 + byte];
}
static inline void gram_walk_cache_link(gram_walk_cache *c, int32_t from, uint8_t byte, int32_t to) {
    c->rows[(size_t)from * 256 + byte] = to;
}
static inline bool gram_walk_cache_viable(const gram_walk_cache *c, int32_t id) {
    return c->states[id].n > 0 || (c->states[id].flags & 3);  // tops, accept or ctx_now
}
static inline bool gram_walk_cache_ctx_any(const gram_walk_cache *c, int32_t id) {
    return c->states[id].flags >> 2 & 1;
}

// The matcher's current state (for the masker).
const gram_state *gram_matcher_state(const kaon_grammar_matcher *m);
gram_arena *gram_matcher_arena(kaon_grammar_matcher *m);
const kaon_grammar *gram_matcher_grammar(const kaon_grammar_matcher *m);
bool gram_matcher_ended(const kaon_grammar_matcher *m);
void gram_matcher_set_ended(kaon_grammar_matcher *m);

// Vocabulary internals: tokens in byte order with the common prefix of each with the last.
struct kaon_grammar_vocab {
    int n;
    uint8_t **bytes;    // token id -> its bytes (into `packed` when that is set)
    uint8_t *packed;
    uint32_t *lens;
    int32_t *order;     // non-special, non-empty token ids sorted by bytes
    // by rank (index in order): the walks read these sequentially, not lens[]/bytes[] by id
    const uint8_t **obytes;
    uint32_t *olens;
    uint16_t *lcp;      // lcp[i] = common prefix of order[i] and order[i-1] (0 for i = 0)
    int32_t first_byte_start[257];  // order[first_byte_start[b] ..] begin with byte b
    int n_order;
    int max_len;             // the longest token's bytes
    int32_t *by_len;         // ranks, longest first
    int32_t *len_at_least;   // [max_len + 2]: by_len[0 .. len_at_least[L]) have at least L bytes
    bool *eog;      // end-of-generation ids
    bool *special;  // never matched as text
    int32_t *eog_ids;
    int n_eog;
    // gram_units by class, shared by every masker of this vocabulary: built on first use and
    // kept until the vocabulary is freed (the lock guards the list, not the entries)
    pthread_mutex_t units_lock;
    struct gram_units_node *units;
    int n_units;
};

// The vocabulary counted in code points of one class, for bounded repetitions whose units are
// single code points of it (grammar_mask.c): a token made only of whole code points of the
// class is "pure" and crosses exactly that many units; the walk decides the others.
#define GRAM_UNITS_MAX 254    // pure tokens of more code points count as other
#define GRAM_UNITS_OTHER 255
#define GRAM_UNITS_CLASSES 8  // classes kept per vocabulary (JSON strings share one)
typedef struct {
    uint8_t *cps;         // [n_order] by rank: a pure token's code points, else GRAM_UNITS_OTHER
    int32_t *by_cps;      // pure token ids, fewest code points first
    int32_t *cps_start;   // [GRAM_UNITS_MAX + 2]: by_cps[cps_start[c] .. cps_start[c + 1]) have c
    int32_t *other;       // ranks of the other tokens, ascending, with their common prefixes
    uint16_t *other_lcp;
    int n_other;
    int32_t *other_by_len;    // the other ranks, longest first
    int32_t *other_at_least;  // [max_len + 2]: how many other tokens have at least L bytes
    int32_t other_fb[257];    // other[other_fb[b] .. other_fb[b + 1]) begin with byte b
    int max_len;
    // the pure ids as bitmaps (mask words each): le_bits + c * words holds those of at most c
    // code points (c <= GRAM_UNITS_BITS; the few longer ones come from by_cps), pure_bits all
    size_t words;
    uint32_t *le_bits, *pure_bits;
} gram_units;
#define GRAM_UNITS_BITS 16  // bitmaps of pure tokens by count up to this many code points
// The units of charset cs of g (found by its code points: maskers of other grammars share
// them), built on first use; NULL when GRAM_UNITS_CLASSES are kept already or out of memory.
// Thread-safe.
const gram_units *gram_vocab_units(const kaon_grammar_vocab *v, const kaon_grammar *g, int cs);
void gram_vocab_units_free(kaon_grammar_vocab *v);

// A masker whose cache keys hold `depth` frames (1..6; the default is 6): shallow keys leave
// more tokens to the run-time walk, which the tests use to exercise it.
kaon_grammar_masker *gram_masker_new_depth(const kaon_grammar *g, const kaon_grammar_vocab *v, int depth);

#endif
