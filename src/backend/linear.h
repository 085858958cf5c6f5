// A linear layer as the model and the backend see it: the weight in its stored format plus
// what that format needs beside it (scales, zero points), an optional bias, how tensor
// parallelism splits it, and, for weights stored fused, the parts it holds.
#ifndef KAON_BACKEND_LINEAR_H
#define KAON_BACKEND_LINEAR_H

#include <string.h>

#include "backend/tensor.h"

// How tensor parallelism splits a weight across ranks.
typedef enum kaon_shard {
    KAON_SHARD_NONE = 0,  // replicated (norms, routers, small vectors)
    KAON_SHARD_COL,       // output rows split (q/k/v, gate/up): each rank computes a slice
    KAON_SHARD_ROW,       // input columns split (o_proj, down): partial sums, then all-reduce
    KAON_SHARD_VOCAB,     // embedding / LM head rows split by vocabulary
    KAON_SHARD_EXPERT,    // whole experts placed on ranks (expert parallelism)
} kaon_shard;

#define KAON_LINEAR_MAX_PARTS 4

// FP8 W8A8: how activations are quantized to e4m3 before the product (FORMATS-2.md §4-5).
typedef enum kaon_act_quant {
    KAON_ACTQ_NONE = 0,  // weight-only: activations stay float
    KAON_ACTQ_GROUP,     // dynamic, per token and group of scale_block[1] columns (DeepSeek)
    KAON_ACTQ_TOKEN,     // dynamic, one scale per token (compressed-tensors FP8-dynamic)
    KAON_ACTQ_TENSOR,    // dynamic, one scale over the whole input
    KAON_ACTQ_STATIC,    // the checkpoint's input_scale (act_scale)
} kaon_act_quant;

typedef struct kaon_linear {
    kaon_tensor w;       // [out, in], any stored format (w.dtype names it)
    kaon_tensor bias;    // [out] f32; data NULL when absent
    kaon_tensor scale;   // the format's scales (FP8 block/channel/tensor, int groups); data NULL when none
    kaon_tensor zero;    // zero points of asymmetric integer formats; data NULL when none
    kaon_tensor perm;    // I32 [in]: column k of w multiplies x[perm[k]] (GPTQ act-order); NULL: none
    // FP8 block scales: rows and columns of w that one scale covers (scale is
    // [ceil(out / scale_block[0]), ceil(in / scale_block[1])] f32, edge blocks partial).
    // Per-channel scales are blocks of [1, in], a per-tensor scale one block of [out, in].
    int32_t scale_block[2];
    int32_t act_quant;   // kaon_act_quant of an FP8 weight
    float act_scale;     // KAON_ACTQ_STATIC: the input_scale
    kaon_shard shard;
    // A weight stored fused (a qkv or gate_up projection) lists its parts' output rows in order;
    // n_parts == 0: one part.
    int n_parts;
    int64_t part_rows[KAON_LINEAR_MAX_PARTS];
} kaon_linear;

static inline const kaon_tensor *kaon_linear_bias(const kaon_linear *l) {
    return l->bias.data ? &l->bias : 0;
}

// A layer of a bare weight and an optional bias (NULL: none), without companions (tests,
// tools).
static inline kaon_linear kaon_linear_of(const kaon_tensor *w, const kaon_tensor *bias) {
    kaon_linear l;
    memset(&l, 0, sizeof l);
    l.w = *w;
    if (bias) l.bias = *bias;
    return l;
}

// Whether l is FP8 e4m3 with per-block f32 scales, channel and tensor scales included (the
// CPU's dequantizing path reads it).
static inline int kaon_linear_is_fp8_block(const kaon_linear *l) {
    return l && l->w.dtype == KAON_FP8_E4M3 && l->scale.data && l->scale.dtype == KAON_F32 &&
           l->scale_block[0] > 0 && l->scale_block[1] > 0;
}

// Whether l is INT8 with f32 scales per row or per tensor (blocks of [1, in] or [out, in]; the
// CPU's scaled 8-bit path, cpu_fp8.c, reads it): w[i, j] = int8[i, j] * scale.
static inline int kaon_linear_is_int8(const kaon_linear *l) {
    return l && l->w.dtype == KAON_I8 && l->scale.data && l->scale.dtype == KAON_F32 && l->scale_block[0] > 0 &&
           l->scale_block[1] > 0;
}

// INT4 weight-only layout, the one every 4-bit checkpoint (AWQ, GPTQ, compressed-tensors
// pack-quantized) is unpacked into at load (model/int4_weights.c), so kernels repack from one:
//   w     KAON_I4 [out, in]: row-major, byte b of a row holds column 2b in its low nibble and
//         2b + 1 in its high nibble; values q are unsigned 0..15.
//   scale F32 [out, ceil(in / g)]; scale_block = {1, g}: columns [j g, (j + 1) g) share
//         scale[:, j] (the last group may be partial).
//   zero  F32 [out, ceil(in / g)], whole numbers (0..16: GPTQ v1 reads stored + 1); NULL means 8.
//   perm  I32 [in] when the checkpoint's groups were not contiguous (act-order): w's columns
//         were reordered so they are, and x is gathered by perm before the product.
// w[m, k] = (q[m, k] - zero[m, k / g]) * scale[m, k / g], formed in f32.
// allow_f16: a CUDA device copy in the compact form (KAON_T4_SZ16) marks its row-groups with an
// F16 scale dtype; host layouts (every CPU path) hold F32 scales only.
static inline int kaon_linear_is_int4_scaled(const kaon_linear *l, int allow_f16) {
    return l && l->w.dtype == KAON_I4 && l->scale.data &&
           (l->scale.dtype == KAON_F32 || (allow_f16 && l->scale.dtype == KAON_F16)) && l->scale_block[0] == 1 &&
           l->scale_block[1] > 0;
}
static inline int kaon_linear_is_int4(const kaon_linear *l) { return kaon_linear_is_int4_scaled(l, 0); }

// MXFP4 layout, the one HF/OpenAI MXFP4 checkpoints (gpt-oss: *_blocks + *_scales) are
// repacked into at load (model/mxfp4_weights.c), GGUF's MXFP4 blocks, so kernels repack from one:
//   w KAON_MXFP4 [out, in], in % 32 == 0: each row is in / 32 blocks of 17 bytes { uint8 e;
//     uint8 qs[16] }, element j < 16 of a block in qs[j]'s low nibble, j + 16 in its high one.
// w[m, k] = e2m1(nibble) * 2^(e - 127) (backend/mxfp4.h); no companions: the scale is inline.
static inline int kaon_linear_is_mxfp4(const kaon_linear *l) {
    return l && l->w.dtype == KAON_MXFP4;
}

// What kernels that read only w and bias cannot compute in l: NULL when they can compute it
// all, else a phrase for the backend's error ("scale companions", ...). Parts need no kernel of
// their own (the output holds them in order), but they must add up to w's rows.
static inline const char *kaon_linear_unsupported(const kaon_linear *l) {
    if (l->scale.data && l->w.dtype == KAON_FP8_E4M3) return "FP8 scales (weight_scale_inv / weight_scale)";
    if (l->w.dtype == KAON_I8) return "INT8 scales";
    if (l->w.dtype == KAON_I4) return "INT4 group scales";
    if (l->w.dtype == KAON_MXFP4) return "MXFP4 blocks";
    if (l->scale.data) return "scale companions";
    if (l->perm.data) return "an input permutation";
    if (l->zero.data) return "zero points";
    if (l->n_parts < 0 || l->n_parts > KAON_LINEAR_MAX_PARTS) return "a bad list of parts";
    if (l->n_parts > 0) {
        int64_t rows = 1, sum = 0;
        for (int i = 0; i + 1 < l->w.ndim; i++) rows *= l->w.shape[i];
        for (int i = 0; i < l->n_parts; i++) sum += l->part_rows[i];
        if (sum != rows) return "parts that do not add up to its rows";
    }
    return 0;
}

#endif
