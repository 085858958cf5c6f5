// A 4-bit weight-only Linear (AWQ gemm, GPTQ, compressed-tensors pack-quantized) read from its
// checkpoint tensors and unpacked at load into the INT4 layout of backend/linear.h.
#ifndef KAON_MODEL_INT4_WEIGHTS_H
#define KAON_MODEL_INT4_WEIGHTS_H

#include <stdint.h>

#include "backend/linear.h"

struct kaon_model;

// Sets l's w, scale, zero, perm and scale_block (memory owned by m; the rest is kept) for module (a weight's name
// without ".weight"), an [N, K] Linear, from the tensors m->quant's method writes. When the
// checkpoint holds none of them, returns 0 with l->w.data NULL (the caller reports a missing
// weight). -1 + an error naming the tensor on a bad shape, dtype or ignore-list conflict.
int kaon_int4_load(struct kaon_model *m, const char *module, int64_t N, int64_t K, kaon_linear *l);

#endif
