// The parser's growing form of a grammar, compiled into kaon_grammar by grammar_compile.c.
#ifndef KAON_GRAMMAR_BUILD_H
#define KAON_GRAMMAR_BUILD_H

#include "grammar/grammar_internal.h"

typedef struct {
    char *name;  // NULL for rules made from groups and repetitions
    gram_elem *e;  // alternatives separated by GEL_ALT (no final END)
    int n, cap;
    bool defined;
    int line, col;  // first reference, for "undefined rule" errors
    int32_t rep_k, rep_head;  // opt_k of a bounded repetition (k >= 1) and its opt_K rule
} gram_build_rule;

typedef struct {
    gram_build_rule *rules;
    int n_rules, cap_rules;
    uint32_t *ranges;  // lo, hi pairs
    int n_ranges, cap_ranges;
    gram_charset *sets;
    bool *negated;
    int n_sets, cap_sets;
    int n_elems_total;
} gram_build;

void gram_build_free(gram_build *b);
// Turns the parsed rules into the compiled grammar: checks references, left recursion.
kaon_grammar *gram_build_compile(gram_build *b, const char *root_rule);

#endif
