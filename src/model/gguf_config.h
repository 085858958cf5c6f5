// GGUF metadata -> kaon_model_config: the keys every architecture shares here, the rest in the
// architecture's own file (its gguf_config hook), read through these helpers.
#ifndef KAON_MODEL_GGUF_CONFIG_H
#define KAON_MODEL_GGUF_CONFIG_H

#include <stdint.h>

#include "io/gguf.h"
#include "model/config.h"

// Fills c from g's metadata (kaon_model_config_init first) and validates it.
int kaon_gguf_config(const kaon_gguf *g, kaon_model_config *c);
// "<arch>.<key>" of the file's architecture, or dflt.
int64_t kaon_gguf_arch_int(const kaon_gguf *g, const kaon_model_config *c, const char *key, int64_t dflt);
double kaon_gguf_arch_float(const kaon_gguf *g, const kaon_model_config *c, const char *key, double dflt);

#endif
