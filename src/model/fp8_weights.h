// FP8 e4m3 (and INT8) weights' companions, per format (FORMATS-2.md §4-5), attached to their kaon_linear:
//   fp8 (DeepSeek, Kimi-K2, Qwen3-FP8)  <m>.weight_scale_inv f32 [ceil(out/b0), ceil(in/b1)]
//   compressed-tensors float-quantized  <m>.weight_scale f32/bf16 [out, 1] (channel) or [1] / []
//                                       (tensor); <m>.input_scale [1] / [] when activations are static
//   ModelOpt FP8                        <m>.weight_scale f32 [], <m>.input_scale f32 []
// Every layout becomes block scales (channel: blocks of [1, in]; tensor: one block of [out, in])
// plus the activation quantization the format's reference applies (kaon_act_quant).
#ifndef KAON_MODEL_FP8_WEIGHTS_H
#define KAON_MODEL_FP8_WEIGHTS_H

#include <stdint.h>

#include "backend/linear.h"

struct kaon_model;

// l->w is the F8_E4M3 tensor name (<module>.weight) of m's file: finds, checks and attaches its
// scales. 0, or -1 + an error naming the tensor.
int kaon_fp8_attach(struct kaon_model *m, kaon_linear *l, const char *name);
// The same for an I8 tensor of a compressed-tensors int-quantized checkpoint (weight_scale per
// channel [out, 1] or per tensor [1]; input_scale when activations are static).
int kaon_int8_attach(struct kaon_model *m, kaon_linear *l, const char *name);
// --load-format dummy: when m's config quantizes module, l (a placeholder [out, in]) becomes
// F8_E4M3 (I8 for int-quantized configs) with placeholder scales of the format's shape (counted by kaon info, refused by
// device uploads, filled on the host by kaon_fp8_dummy_fill).
void kaon_fp8_dummy_mark(const struct kaon_model *m, kaon_linear *l, const char *module);
// Random codes and scales for a marked l (memory owned by m): weights ~ uniform(-a, a) with
// a = 1 / sqrt(in), scales varied per block so a wrong layout shows.
int kaon_fp8_dummy_fill(struct kaon_model *m, kaon_linear *l, uint64_t seed);

#endif
