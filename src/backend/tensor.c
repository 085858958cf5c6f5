#include "backend/tensor.h"

int kaon_dtype_block_elems(kaon_dtype t) {
    switch (t) {
    case KAON_F32: case KAON_F16: case KAON_BF16: return 1;
    case KAON_Q4_0: case KAON_Q4_1: case KAON_Q8_0: return 32;
    case KAON_Q4_K: case KAON_Q6_K: return 256;
    default: return 0;
    }
}

int kaon_dtype_block_bytes(kaon_dtype t) {
    switch (t) {
    case KAON_F32: return 4;
    case KAON_F16: case KAON_BF16: return 2;
    case KAON_Q4_0: return 18;
    case KAON_Q4_1: return 20;
    case KAON_Q8_0: return 34;
    case KAON_Q4_K: return 144;
    case KAON_Q6_K: return 210;
    default: return 0;
    }
}

const char *kaon_dtype_name(kaon_dtype t) {
    switch (t) {
    case KAON_F32: return "F32";
    case KAON_F16: return "F16";
    case KAON_BF16: return "BF16";
    case KAON_Q4_0: return "Q4_0";
    case KAON_Q4_1: return "Q4_1";
    case KAON_Q8_0: return "Q8_0";
    case KAON_Q4_K: return "Q4_K";
    case KAON_Q6_K: return "Q6_K";
    default: return "invalid";
    }
}

kaon_dtype kaon_dtype_from_ggml(uint32_t ggml_type) {
    kaon_dtype t = (kaon_dtype)ggml_type;
    return kaon_dtype_block_elems(t) ? t : KAON_DTYPE_INVALID;
}

size_t kaon_dtype_row_bytes(kaon_dtype t, int64_t n) {
    int be = kaon_dtype_block_elems(t);
    if (be == 0 || n < 0 || n % be) return 0;
    return (size_t)(n / be) * (size_t)kaon_dtype_block_bytes(t);
}

int64_t kaon_tensor_numel(const kaon_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
