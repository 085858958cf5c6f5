// MXFP4 weights of Hugging Face checkpoints (OpenAI gpt-oss layout, FORMATS-2.md §7): a tensor
// <name> stored as <name>_blocks uint8 [..., rows, cols / 32, 16] and <name>_scales uint8
// [..., rows, cols / 32], repacked at load into kaon's MXFP4 layout (backend/mxfp4.h).
#ifndef KAON_MODEL_MXFP4_WEIGHTS_H
#define KAON_MODEL_MXFP4_WEIGHTS_H

#include "backend/tensor.h"

struct kaon_model;

// When m is an MXFP4 checkpoint holding <name>_blocks: *out = KAON_MXFP4 [..., rows, cols]
// (memory owned by m; leading dims kept, so stacked experts stay [E, rows, cols]). Else 0 with
// out->data NULL. -1 + an error naming the tensor on a bad dtype or shape, or when the
// quantization_config's modules_to_not_convert leaves the module unquantized.
int kaon_mxfp4_load(struct kaon_model *m, const char *name, kaon_tensor *out);
// Whether m's file holds <name> or <name>_blocks (a probe that repacks nothing).
int kaon_mxfp4_probe(const struct kaon_model *m, const char *name, kaon_tensor *out);

#endif
