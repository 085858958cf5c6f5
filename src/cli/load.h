// Loading what a command needs: the model (default when -m is absent), its tokenizer, or an
// engine for it.
#ifndef KAON_CLI_LOAD_H
#define KAON_CLI_LOAD_H

#include "kaon.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

// Loads the model at path (NULL: the default model). Returns NULL after printing the error.
kaon_model *kaon_cli_load_model(const char *path);
// The tokenizer that came with the model (GGUF metadata or the HF folder's tokenizer.json).
kaon_tokenizer *kaon_cli_load_tokenizer(const kaon_model *m);
// The engine of a single-user command (run, chat, logits, info --expert-load) with the
// caller's options eo and the model at path (NULL: the default model; dummy: random weights
// from a config.json). Returns NULL after printing the error.
// A follower process of a multi-node job goes no further than its engine.
kaon_engine *kaon_cli_engine(kaon_engine_options *eo, const char *path, bool dummy);
// In a follower process of a multi-node job (dist/cluster.h): runs process 0's steps on e until
// the job ends, then exits with its status; elsewhere returns at once. Every command calls it
// right after making its engine, so a follower never serves, reads prompts or writes output.
void kaon_cli_follow_if_follower(kaon_engine *e);

#endif
