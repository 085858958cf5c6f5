// The tensor every room passes around: a dtype, a shape and a pointer. Weights keep the
// format they were stored in (the dtype names it) and are used in place from the mapping.
#ifndef KAON_BACKEND_TENSOR_H
#define KAON_BACKEND_TENSOR_H

#include <stddef.h>
#include <stdint.h>

// Values are GGUF's ggml type ids so a GGUF tensor's type maps 1:1.
typedef enum kaon_dtype {
    KAON_F32 = 0,
    KAON_F16 = 1,
    KAON_Q4_0 = 2,
    KAON_Q4_1 = 3,
    KAON_Q8_0 = 8,
    KAON_Q4_K = 12,
    KAON_Q6_K = 14,
    KAON_BF16 = 30,
    KAON_DTYPE_INVALID = -1,
} kaon_dtype;

// Elements per block (1 for plain floats) and bytes per block. 0 for unsupported ids.
int kaon_dtype_block_elems(kaon_dtype t);
int kaon_dtype_block_bytes(kaon_dtype t);
const char *kaon_dtype_name(kaon_dtype t);
// GGUF type id -> kaon dtype; KAON_DTYPE_INVALID when kaon cannot compute with it.
kaon_dtype kaon_dtype_from_ggml(uint32_t ggml_type);
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

#endif
