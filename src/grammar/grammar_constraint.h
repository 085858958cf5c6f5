// A grammar as the engine's output constraint (kaon_constraint_ops): one compiled grammar and
// one mask cache shared by a request's sequences, a matcher per sequence.
#ifndef KAON_GRAMMAR_CONSTRAINT_H
#define KAON_GRAMMAR_CONSTRAINT_H

#include "grammar/grammar.h"
#include "kaon.h"

extern const kaon_constraint_ops kaon_grammar_constraint_ops;

// Takes ownership of g; v must outlive every state made from it. Returns the request's
// template state (pass it as kaon_sampling.constraint_state, free it with
// kaon_grammar_constraint_ops.free once submitted), or NULL with kaon_last_error().
void *kaon_grammar_constraint_new(kaon_grammar *g, const kaon_grammar_vocab *v);

#endif
