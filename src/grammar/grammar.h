// Grammar-constrained decoding: GBNF grammars (llama.cpp's syntax), a byte-level matcher with
// rollback, and next-token masks over a vocabulary. No server wiring here: the engine asks
// for a mask before sampling and feeds back the sampled token.
#ifndef KAON_GRAMMAR_GRAMMAR_H
#define KAON_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Limits on untrusted grammars: text size, rules, compiled elements, nesting, {m,n} bounds.
#define KAON_GRAMMAR_MAX_TEXT (256 * 1024)
#define KAON_GRAMMAR_MAX_RULES 8192
#define KAON_GRAMMAR_MAX_ELEMS (256 * 1024)
#define KAON_GRAMMAR_MAX_NESTING 64
#define KAON_GRAMMAR_MAX_REPEAT 1024
// Ambiguous grammars multiply parse stacks: past these limits a step fails (an error, not a
// hang): stack nodes one matcher holds, stacks in one state, nodes visited by one byte.
#define KAON_GRAMMAR_MAX_NODES (1 << 20)
#define KAON_GRAMMAR_MAX_TOPS 1024
#define KAON_GRAMMAR_MAX_STEP_WORK 16384
// ... and nodes visited by one mask's walks: 128 per token of the vocabulary + 1M (JSON on
// Llama-3's vocabulary needs under 24 per token).
#define KAON_GRAMMAR_WALK_WORK_PER_TOKEN 128
#define KAON_GRAMMAR_WALK_WORK_BASE (1 << 20)

typedef struct kaon_grammar kaon_grammar;

// Parses GBNF text; root_rule NULL means "root". NULL + kaon_last_error() ("grammar: line L
// col C: ...") for a malformed, left-recursive or oversized grammar.
kaon_grammar *kaon_grammar_parse(const char *text, size_t len, const char *root_rule);
void kaon_grammar_free(kaon_grammar *g);
int kaon_grammar_rule_count(const kaon_grammar *g);

// A matcher: the set of parse stacks after the bytes accepted so far, one history entry per
// accepted token so the last k tokens can be rolled back (speculative decoding).
typedef struct kaon_grammar_matcher kaon_grammar_matcher;
kaon_grammar_matcher *kaon_grammar_matcher_new(const kaon_grammar *g);
void kaon_grammar_matcher_free(kaon_grammar_matcher *m);
// Accepts bytes as one step (one token). False leaves the state as it was.
bool kaon_grammar_matcher_accept_bytes(kaon_grammar_matcher *m, const void *bytes, size_t len);
bool kaon_grammar_matcher_can_end(const kaon_grammar_matcher *m);       // grammar complete here
bool kaon_grammar_matcher_can_continue(const kaon_grammar_matcher *m);  // more bytes possible
int kaon_grammar_matcher_steps(const kaon_grammar_matcher *m);          // accepted steps kept
// Undoes the last k steps; -1 when k exceeds the steps kept.
int kaon_grammar_matcher_rollback(kaon_grammar_matcher *m, int k);
void kaon_grammar_matcher_reset(kaon_grammar_matcher *m);

// A vocabulary as the grammar sees it: every token's bytes, sorted once so tokens that share
// a prefix are matched once. Special tokens are never allowed by a grammar, except the
// end-of-generation ids, allowed exactly when the grammar can end.
typedef struct kaon_grammar_vocab kaon_grammar_vocab;
kaon_grammar_vocab *kaon_grammar_vocab_new(int n_tokens, const char *const *bytes,
                                           const size_t *lens, const bool *is_special,
                                           const int32_t *eog_ids, int n_eog);
struct kaon_tokenizer;
// Every token's decoded bytes; special tokens flagged, end-of-generation ids from the tokenizer.
kaon_grammar_vocab *kaon_grammar_vocab_from_tokenizer(const struct kaon_tokenizer *t);
void kaon_grammar_vocab_free(kaon_grammar_vocab *v);
int kaon_grammar_vocab_size(const kaon_grammar_vocab *v);
static inline size_t kaon_grammar_mask_words(int n_tokens) { return ((size_t)n_tokens + 31) / 32; }

// Grammar x vocabulary: caches, per top-of-stack context, the tokens accepted whatever lies
// below it, so a mask only re-checks the few tokens that reach deeper. Not thread-safe (its
// cache fills lazily): one per engine thread.
typedef struct kaon_grammar_masker kaon_grammar_masker;
kaon_grammar_masker *kaon_grammar_masker_new(const kaon_grammar *g, const kaon_grammar_vocab *v);
void kaon_grammar_masker_free(kaon_grammar_masker *mk);
// Writes kaon_grammar_mask_words(n) words: bit i set = token i allowed next. 0 or -1.
int kaon_grammar_fill_mask(kaon_grammar_masker *mk, kaon_grammar_matcher *m, uint32_t *mask);
// Accepts a sampled token: its bytes, or an end-of-generation id when the grammar can end
// (the matcher then takes nothing more). False (state unchanged) when not allowed.
bool kaon_grammar_matcher_accept_token(kaon_grammar_matcher *m, const kaon_grammar_vocab *v,
                                       int32_t id);

#endif
