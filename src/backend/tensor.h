// The tensor every room passes around: a dtype, a shape and a pointer. Weights keep the
// format they were stored in (the dtype names it) and are used in place from the mapping.
#ifndef KAON_BACKEND_TENSOR_H
#define KAON_BACKEND_TENSOR_H

#include <stddef.h>
#include <stdint.h>

// kaon's own numbering (dense, so tables can be indexed by it); GGUF's ggml type ids map to it
// through kaon_dtype_from_ggml. The block layouts of the GGUF formats: backend/quant_blocks.h.
typedef enum kaon_dtype {
    KAON_DTYPE_INVALID = -1,
    KAON_F32 = 0,
    KAON_F16,
    KAON_BF16,
    // GGUF blocks of 32 (KAON_Q4_0 .. KAON_IQ4_XS: the GGUF block formats, quant_blocks.h)
    KAON_Q4_0,
    KAON_Q4_1,
    KAON_Q5_0,
    KAON_Q5_1,
    KAON_Q8_0,
    KAON_IQ4_NL,
    // GGUF super-blocks of 256
    KAON_Q2_K,
    KAON_Q3_K,
    KAON_Q4_K,
    KAON_Q5_K,
    KAON_Q6_K,
    KAON_IQ4_XS,
    // Formats of Hugging Face checkpoints (named, sized; no kernels yet). Their scales live in
    // companion tensors.
    KAON_FP8_E4M3,  // one byte per element
    KAON_I8,        // int8, one byte per element
    KAON_I4,        // int4 in groups (GPTQ/AWQ style), two elements per byte
    KAON_MXFP4,     // OCP MX fp4 (e2m1) blocks of 32 with an e8m0 scale, GGUF's layout
    // Plain integers of checkpoints (packed INT4 words, g_idx, weight_shape): read at load only.
    KAON_I32,
    KAON_I64,
    KAON_U8,        // raw bytes (HF MXFP4 *_blocks / *_scales): read at load only
    KAON_DTYPE_COUNT
} kaon_dtype;

// Elements per block (1 for plain floats) and bytes per block. 0 for KAON_DTYPE_INVALID.
int kaon_dtype_block_elems(kaon_dtype t);
int kaon_dtype_block_bytes(kaon_dtype t);
const char *kaon_dtype_name(kaon_dtype t);
// GGUF type id -> kaon dtype; KAON_DTYPE_INVALID when kaon cannot compute with it.
kaon_dtype kaon_dtype_from_ggml(uint32_t ggml_type);
// kaon dtype -> GGUF type id; UINT32_MAX for a dtype GGUF has no id for.
uint32_t kaon_dtype_to_ggml(kaon_dtype t);
// Bytes of one row of n elements; 0 when n is not a multiple of the block size.
size_t kaon_dtype_row_bytes(kaon_dtype t, int64_t n);

#define KAON_MAX_DIMS 4

// Row-major like torch: shape[ndim-1] is contiguous. A linear weight is [out, in]; quantized
// blocks run along `in` (so each output row is a whole number of blocks).
typedef struct kaon_tensor {
    kaon_dtype dtype;
    int ndim;
    int64_t shape[KAON_MAX_DIMS];
    void *data;  // host (mmap or heap) or device memory, as the owner knows
    size_t nbytes;
} kaon_tensor;

int64_t kaon_tensor_numel(const kaon_tensor *t);
// Element i of a host F32, BF16 or F16 tensor as f32, and of an I32 or I64 tensor as int64.
// Tensors mapped in place from a file need not be aligned to their element size (safetensors
// packs tensors of any size back to back): these copy the bytes out.
float kaon_tensor_f32_at(const kaon_tensor *t, int64_t i);
int64_t kaon_tensor_int_at(const kaon_tensor *t, int64_t i);

#endif
