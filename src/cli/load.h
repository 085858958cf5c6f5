// Loading what a command needs: the model (default when -m is absent) and its tokenizer.
#ifndef KAON_CLI_LOAD_H
#define KAON_CLI_LOAD_H

#include "model/model.h"
#include "tokenizer/tokenizer.h"

// Loads the model at path (NULL: the default model). Returns NULL after printing the error.
kaon_model *kaon_cli_load_model(const char *path);
// The tokenizer that came with the model (GGUF metadata or the HF folder's tokenizer.json).
kaon_tokenizer *kaon_cli_load_tokenizer(const kaon_model *m);

#endif
