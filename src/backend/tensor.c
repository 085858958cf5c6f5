#include "backend/tensor.h"

#include <string.h>

#include "backend/quant_blocks.h"
#include "util/half.h"

#define NO_GGML UINT32_MAX

// One row per dtype: name, elements and bytes per block, GGUF type id, and whether kaon has
// kernels for it (only those are accepted from GGUF files).
static const struct dtype_info {
    const char *name;
    int elems, bytes;
    uint32_t ggml;
    int computes;
} info[KAON_DTYPE_COUNT] = {
    [KAON_F32] = {"F32", 1, 4, 0, 1},
    [KAON_F16] = {"F16", 1, 2, 1, 1},
    [KAON_BF16] = {"BF16", 1, 2, 30, 1},
    [KAON_Q4_0] = {"Q4_0", KAON_QK, sizeof(kaon_block_q4_0), 2, 1},
    [KAON_Q4_1] = {"Q4_1", KAON_QK, sizeof(kaon_block_q4_1), 3, 1},
    [KAON_Q5_0] = {"Q5_0", KAON_QK, sizeof(kaon_block_q5_0), 6, 1},
    [KAON_Q5_1] = {"Q5_1", KAON_QK, sizeof(kaon_block_q5_1), 7, 1},
    [KAON_Q8_0] = {"Q8_0", KAON_QK, sizeof(kaon_block_q8_0), 8, 1},
    [KAON_IQ4_NL] = {"IQ4_NL", KAON_QK, sizeof(kaon_block_iq4_nl), 20, 1},
    [KAON_Q2_K] = {"Q2_K", KAON_QK_K, sizeof(kaon_block_q2_k), 10, 1},
    [KAON_Q3_K] = {"Q3_K", KAON_QK_K, sizeof(kaon_block_q3_k), 11, 1},
    [KAON_Q4_K] = {"Q4_K", KAON_QK_K, sizeof(kaon_block_q4_k), 12, 1},
    [KAON_Q5_K] = {"Q5_K", KAON_QK_K, sizeof(kaon_block_q5_k), 13, 1},
    [KAON_Q6_K] = {"Q6_K", KAON_QK_K, sizeof(kaon_block_q6_k), 14, 1},
    [KAON_IQ4_XS] = {"IQ4_XS", KAON_QK_K, sizeof(kaon_block_iq4_xs), 23, 1},
    [KAON_FP8_E4M3] = {"FP8_E4M3", 1, 1, NO_GGML, 0},
    [KAON_I8] = {"I8", 1, 1, NO_GGML, 0},  // (GGUF's I8 is a plain integer tensor, not a weight)
    [KAON_I4] = {"I4", 2, 1, NO_GGML, 0},
    [KAON_MXFP4] = {"MXFP4", 32, 17, 39, 0},
    [KAON_I32] = {"I32", 1, 4, NO_GGML, 0},
    [KAON_I64] = {"I64", 1, 8, NO_GGML, 0},
    [KAON_U8] = {"U8", 1, 1, NO_GGML, 0},
};

static const struct dtype_info *find(kaon_dtype t) {
    return t >= 0 && t < KAON_DTYPE_COUNT ? &info[t] : NULL;
}

int kaon_dtype_block_elems(kaon_dtype t) {
    const struct dtype_info *i = find(t);
    return i ? i->elems : 0;
}

int kaon_dtype_block_bytes(kaon_dtype t) {
    const struct dtype_info *i = find(t);
    return i ? i->bytes : 0;
}

const char *kaon_dtype_name(kaon_dtype t) {
    const struct dtype_info *i = find(t);
    return i ? i->name : "invalid";
}

kaon_dtype kaon_dtype_from_ggml(uint32_t ggml_type) {
    for (int t = 0; t < KAON_DTYPE_COUNT; t++)
        if (info[t].ggml == ggml_type && info[t].computes) return (kaon_dtype)t;
    return KAON_DTYPE_INVALID;
}

uint32_t kaon_dtype_to_ggml(kaon_dtype t) {
    const struct dtype_info *i = find(t);
    return i ? i->ggml : NO_GGML;
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

float kaon_tensor_f32_at(const kaon_tensor *t, int64_t i) {
    const char *p = (const char *)t->data;
    if (t->dtype == KAON_F32) {
        float f;
        memcpy(&f, p + (size_t)i * sizeof f, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + (size_t)i * sizeof h, sizeof h);
    return t->dtype == KAON_BF16 ? kaon_bf16_to_f32(h) : kaon_f16_to_f32(h);
}

int64_t kaon_tensor_int_at(const kaon_tensor *t, int64_t i) {
    const char *p = (const char *)t->data;
    if (t->dtype == KAON_I64) {
        int64_t v;
        memcpy(&v, p + (size_t)i * sizeof v, sizeof v);
        return v;
    }
    int32_t v;
    memcpy(&v, p + (size_t)i * sizeof v, sizeof v);
    return v;
}
