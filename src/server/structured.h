// Structured outputs for the server: a request's format (response_format, structured_outputs,
// guided_*) or forced tool choice turned into a grammar over the model's vocabulary, handed to
// the engine as its output constraint. Compiled grammars are kept by their text (with the
// masks they have cached), so a schema sent again starts warm.
#ifndef KAON_SERVER_STRUCTURED_H
#define KAON_SERVER_STRUCTURED_H

#include <pthread.h>

#include "grammar/grammar.h"
#include "server/openai.h"

#define KAON_STRUCTURED_CACHE 32

typedef struct kaon_structured {
    pthread_mutex_t mu;
    kaon_grammar_vocab *vocab;  // made on first use
    const struct kaon_tokenizer *tok;
    int model_vocab;            // the engine's logit rows
    struct {
        char *key;              // the GBNF text
        void *state;            // a template constraint state (its clones share the masks)
        unsigned long long used;
    } cache[KAON_STRUCTURED_CACHE];
    unsigned long long clock;
} kaon_structured;

void kaon_structured_init(kaon_structured *st, const struct kaon_tokenizer *tok, int model_vocab);
void kaon_structured_destroy(kaon_structured *st);

// The GBNF text of r's constraint (malloc'd), or NULL with *none set when it has none; NULL
// with err (400: the schema, regex or grammar cannot be turned into one) otherwise.
char *kaon_structured_gbnf(const kaon_api_request *r, bool *none, kaon_api_error *err);

// The constraint state for r (free with kaon_grammar_constraint_ops.free after submitting), or
// NULL: with *none set when r has no constraint, else with err filled.
void *kaon_structured_state(kaon_structured *st, const kaon_api_request *r, bool *none,
                            kaon_api_error *err);

#endif
