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

// --load-format dummy: when m's config is a 4-bit weight-only one (awq, gptq, compressed-tensors
// pack-quantized) that quantizes module, l (a placeholder [out, in]) becomes an INT4
// placeholder: scales [out, ceil(in/g)], zeros when the format is asymmetric, no perm; the
// embedding and the head stay bf16. Device backends create the values (upload_linear);
// host backends call kaon_int4_dummy_fill (nibbles, scales ~ 1/sqrt(in)/8, zeros 0..15).
void kaon_int4_dummy_mark(const struct kaon_model *m, kaon_linear *l, const char *module);
int kaon_int4_dummy_fill(struct kaon_model *m, kaon_linear *l, uint64_t seed);

#endif
