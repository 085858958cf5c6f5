// Internals of the CPU backend shared by its files: the 8-bit
// activation format that every quantized linear uses, and the kernel table chosen at start-up
// (portable C, AVX2+FMA+F16C, or AVX2 with AVX-512 VNNI dot products).
//
// How a quantized linear runs: the activation rows x [n, K] are quantized once per call to
// 8-bit blocks of 32 (a float scale d, the int8 values, and d * their sum), then each weight
// row is dotted with up to 4 (AVX2) or 8 (AVX-512) activation rows at a time using integer
// multiply-adds per block; the block's weight scale times the activation scale turns the
// integer sum into a float. With more activation rows, the formats in blocks of 32 (Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) take the batched path (pack/tile_dot below) and the K-quants
// (Q2_K..Q6_K) theirs (kpack/ktile_dot), which give the same numbers bit for bit.
#ifndef KAON_BACKEND_CPU_INTERNAL_H
#define KAON_BACKEND_CPU_INTERNAL_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/quant_blocks.h"
#include "util/err.h"

#define KAON_MAX_ROWS 8  // most activation rows one kernel call processes (register blocking)

// Order of the int8 values inside an activation row.
//  NATURAL: block b holds elements 32b..32b+31 in order.
//  Q4PAIRS: blocks (2i, 2i+1) are stored as [2i: 0..15][2i+1: 0..15][2i: 16..31][2i+1: 16..31],
//           which is the order the low/high nibbles of two consecutive Q4_0/Q4_1 blocks come out
//           in when their 16-byte payloads are loaded side by side; and inside each group of 8
//           blocks, d and s are stored in the order 0,2,4,6,1,3,5,7 (the order a horizontal-add
//           tree leaves the 8 block sums in).
enum { KAON_ACT_NATURAL = 0, KAON_ACT_Q4PAIRS = 1 };

// n rows of K = 32 nb elements, quantized. Rows are padded to nbp blocks (a multiple of 8)
// with zero values and zero scales, so SIMD kernels may read whole groups of 8 blocks.
typedef struct kaon_q8_act {
    int n, nb, nbp, layout;
    int8_t *qs;     // [n, nbp * 32]
    float *d;       // [n, nbp]  scale of each block: x ~= d * q
    float *s;       // [n, nbp]  d * sum(q) of each block (for the weight formats' offsets)
    int16_t *s16;   // [n, nbp, 2] sum(q) of each 16-element half (the offsets and mins of the
                    // formats with sub-blocks of 16: Q2_K, Q3_K, Q6_K); may be NULL
} kaon_q8_act;

// The batched path's activation rows: per group of 8 blocks, the 256 quantized bytes (in the
// row's layout), then the group's 8 d, then its 8 s (both in the layout's order).
#define KAON_GRP_BYTES 320
static inline void kaon_cpu_act_regroup(const kaon_q8_act *a, int row, uint8_t *dst) {
    const int8_t *qs = a->qs + (size_t)row * a->nbp * 32;
    const float *d = a->d + (size_t)row * a->nbp, *s = a->s + (size_t)row * a->nbp;
    for (int g = 0; g < a->nbp / 8; g++, dst += KAON_GRP_BYTES) {
        memcpy(dst, qs + (size_t)g * 256, 256);
        memcpy(dst + 256, d + (size_t)g * 8, 32);
        memcpy(dst + 288, s + (size_t)g * 8, 32);
    }
}

// Index of a dtype in the kernel tables; -1 when the CPU backend cannot compute with it.
enum { KAON_KI_F32, KAON_KI_F16, KAON_KI_BF16, KAON_KI_Q4_0, KAON_KI_Q4_1, KAON_KI_Q5_0,
       KAON_KI_Q5_1, KAON_KI_Q8_0, KAON_KI_IQ4_NL, KAON_KI_Q2_K, KAON_KI_Q3_K, KAON_KI_Q4_K,
       KAON_KI_Q5_K, KAON_KI_Q6_K, KAON_KI_IQ4_XS, KAON_KI_COUNT };
int kaon_cpu_kind(kaon_dtype t);

// out[r] = dot(weight row, activation row r0 + r) for r < nr (nr <= the table's max_rows).
typedef void (*kaon_qdot_fn)(const void *wrow, const kaon_q8_act *a, int r0, int nr, float *out);
// out[r] = dot(weight row of K elements, x + r * ldx) for r < nr (float weight formats).
typedef void (*kaon_fdot_fn)(const void *wrow, int K, const float *x, size_t ldx, int nr,
                             float *out);

typedef struct kaon_cpu_kernels {
    const char *name;
    int max_rows;                       // activation rows per kernel call (<= KAON_MAX_ROWS)
    kaon_qdot_fn qdot[KAON_KI_COUNT];   // quantized formats (NULL for float ones)
    kaon_fdot_fn fdot[KAON_KI_COUNT];   // float formats (NULL for quantized ones)
    int layout[KAON_KI_COUNT];          // activation layout each quantized kernel reads
    // Quantizes one row of K = 32 nb elements into row `row` of a (layout a->layout).
    void (*quantize_row)(const float *x, kaon_q8_act *a, int row);
    // The batched path (all NULL/0 in a table without it), for the kinds whose layout is
    // Q4PAIRS: pack() unpacks `rows` (<= pack_rows) weight rows of rb bytes into
    // pack_bytes(nbp) bytes at dst (1: kind not supported); tile_dot() then gives
    // out[r * ldo + i] = weight row i . activation row r for r < nr (<= tile_rows) and every
    // i < pack_rows, with exactly qdot's numbers. Its activation rows are regrouped
    // (kaon_cpu_act_regroup), xstride bytes apart.
    int pack_rows, tile_rows;
    size_t (*pack_bytes)(int nbp);
    int (*pack)(int kind, const void *w, size_t rb, int rows, int nb, int nbp, void *dst);
    void (*tile_dot)(int kind, const void *pk, const void *xg, size_t xstride, int nb, int nbp,
                     int nr, float *out, size_t ldo);
    // The batched path of the K-quants (Q2_K..Q6_K; NATURAL activations with s16): kpack()
    // decodes `rows` (<= pack_rows) weight rows of nsb super-blocks into kpack_bytes(nsb) bytes
    // (1: kind not supported); ktile_dot() gives out[r * ldo + i] = weight row i . activation
    // row r0 + r of a for r < nr (<= ktile_rows), i < pack_rows, with exactly qdot's numbers.
    int ktile_rows;
    size_t (*kpack_bytes)(int nsb);
    int (*kpack)(int kind, const void *w, size_t rb, int rows, int nsb, void *dst);
    void (*ktile_dot)(int kind, const void *pk, const kaon_q8_act *a, int r0, int nr, float *out, size_t ldo);
    float (*dot_f32)(const float *a, const float *b, int n);
    // scores[j] = scale * dot(q, k + j * kstride) for j < n                 k [n, kstride]
    void (*attn_scores)(const float *q, const float *k, size_t kstride, int n, int hd,
                        float scale, float *scores);
    // acc[0..hd) += sum_j p[j] * v[j * vstride + 0..hd)
    void (*attn_accum)(float *acc, const float *v, size_t vstride, const float *p, int n, int hd);
    // s[j] = exp(s[j] - mx); returns the sum.
    float (*exp_sum)(float *s, int n, float mx);
    // out = silu(g) * u
    void (*silu_mul)(const float *g, const float *u, float *out, int n);
    // out = gelu_tanh(g) * u
    void (*gelu_tanh_mul)(const float *g, const float *u, float *out, int n);
} kaon_cpu_kernels;

const kaon_cpu_kernels *kaon_cpu_kernels_scalar(void);
// NULL when not compiled for x86.
const kaon_cpu_kernels *kaon_cpu_kernels_avx2(void);
const kaon_cpu_kernels *kaon_cpu_kernels_vnni(void);

// The scalar quantizer handles both layouts; the SIMD tables may use it as their reference.
void kaon_cpu_quantize_row_ref(const float *x, kaon_q8_act *a, int row);
// Position of block b's d/s inside its row for a layout.
static inline int kaon_act_dpos(int layout, int b) {
    if (layout != KAON_ACT_Q4PAIRS) return b;
    int i = b & 7;
    return (b & ~7) + ((i & 1) ? 4 + (i >> 1) : (i >> 1));
}
// Byte position of element e (< 32) of block b inside its row's qs for a layout.
static inline int kaon_act_qpos(int layout, int b, int e) {
    if (layout != KAON_ACT_Q4PAIRS) return b * 32 + e;
    return (b & ~1) * 32 + (e >= 16 ? 32 : 0) + (b & 1) * 16 + (e & 15);
}

// Dequantizes row `row` of a [rows, K] tensor of any supported dtype into out [K].
// Returns -1 (error set) for an unsupported dtype or a K that is not a whole number of blocks.
int kaon_cpu_dequantize_row(kaon_dtype t, const void *data, int64_t row, int64_t K, float *out);

// The backend object: the public part first so the pointers convert.
typedef struct kaon_cpu_backend {
    kaon_backend base;
    const kaon_cpu_kernels *k;
    // Scratch for quantized activations; grows on demand and is then reused (one engine
    // thread drives a backend, so it is not shared between concurrent calls).
    void *scratch;
    size_t scratch_cap;
    // RoPE cos/sin of the last call, reused while positions and frequencies repeat (every
    // layer of one step rotates the same positions).
    float *rope_cs;          // [n, rot_dim/2, 2]
    int32_t *rope_pos;       // [n]
    float *rope_freq;        // [rot_dim/2]
    size_t rope_cap_tok, rope_cap_cs, rope_cap_half;
    int rope_n, rope_half;
    int rope_valid;
    // The moe op's own scratch (routing, gathered rows, expert outputs): apart from `scratch`,
    // which the linear calls it makes reuse.
    void *moe_scratch;
    size_t moe_scratch_cap;
    // head_linear's gathered rows and outputs (it calls the linear kernels, which use `scratch`).
    void *head_scratch;
    size_t head_scratch_cap;
    // The threads of the parallel ops: n_threads counting the engine thread (util/pool.h).
    struct kaon_pool *pool;
    // The first error of the linear and moe ops since the status op last ran.
    int err;
    char errmsg[256];
} kaon_cpu_backend;

// Records an error of an op for the status op (the first one is kept) and sets it as the
// last error; returns -1.
int kaon_cpu_fail(kaon_cpu_backend *be, const char *fmt, ...) KAON_PRINTF(2, 3);

// Returns at least `bytes` of 64-byte aligned scratch, or NULL (error recorded).
void *kaon_cpu_scratch(kaon_cpu_backend *be, size_t bytes);

void kaon_cpu_linear(kaon_backend *be, const void *x, int n, const kaon_linear *w, void *y);
// FP8 e4m3 weights with block scales (kaon_linear_is_fp8_block), dequantized row by row
// (cpu_fp8.c). 0 or -1 (error recorded).
int kaon_cpu_linear_fp8(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y);
// INT4 weights in kaon's layout (kaon_linear_is_int4), dequantized row by row (cpu_int4.c).
int kaon_cpu_linear_int4(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y);
// MXFP4 weights in kaon's layout (kaon_linear_is_mxfp4), dequantized row by row (cpu_mxfp4.c).
int kaon_cpu_linear_mxfp4(kaon_cpu_backend *be, const float *x, int n, const kaon_linear *l, float *y);
// y [n, M] = x [n, K] @ w^T (+ bias [M]) for a weight read one dequantized row at a time:
// row(ctx, m, out) writes row m as K floats (cpu_rows.c). rows: K floats of scratch for each of
// nt threads.
typedef void (*kaon_cpu_row_fn)(const void *ctx, int64_t m, float *out);
void kaon_cpu_rows_linear(kaon_cpu_backend *be, const float *x, int n, int64_t M, int64_t K, const float *bias,
                          float *y, float *rows, int nt, kaon_cpu_row_fn row, const void *ctx);
// The fused forms (backend.h): several layers over one x, and silu(x gate^T) * (x up^T).
// 0 when done, 1 when declined (weights of different formats or widths; silu: a bias), -1 on
// error.
int kaon_cpu_linear_multi(kaon_backend *be, const void *x, int n, int count,
                          const kaon_linear *const *w, void *const *y);
int kaon_cpu_linear_silu_mul(kaon_backend *be, const void *x, int n, const kaon_linear *gate,
                             const kaon_linear *up, void *out);
void kaon_cpu_kv_write(kaon_backend *be, kaon_kv_layer *kv, const void *k, const void *v,
                       const kaon_attn_meta *m, int n_kv_heads, int head_dim);
void kaon_cpu_attention_sinks(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                              const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                              float scale, int window, const float *sinks, void *out);
void kaon_cpu_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                        const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                        float scale, int window, void *out);

void kaon_cpu_mla_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                            const kaon_attn_meta *m, int n_heads, int kv_lora, int rope_dim,
                            float scale, void *out);
// Per-head matrices and strided copies (cpu_heads.c).
void kaon_cpu_head_linear(kaon_backend *be, const void *x, int n, int n_heads, size_t x_tok,
                          size_t x_head, const kaon_linear *w, void *y, size_t y_tok, size_t y_head);
void kaon_cpu_copy_strided(kaon_backend *be, const void *src, size_t src_stride, void *dst,
                           size_t dst_stride, int rows, int width, float s);

// Several small linears of one weight format and width as one parallel run (the MoE op's
// experts at decode): y [n, M] = x [n, K] @ w^T, or with w2, silu(x @ w^T) * (x @ w2^T). All
// rows of all segments are one work list; each row gets kaon_cpu_linear's numbers bit for bit.
// Each segment has 1..max_rows activation rows; no bias with w2. 0 when done, 1 when declined
// (formats or widths differ, FP8/INT4/MXFP4 weights, more rows than max_rows), -1 on error.
typedef struct kaon_cpu_seg {
    const kaon_linear *w, *w2;
    const float *x;  // [n, K]
    int n;
    float *y;        // [n, M]
} kaon_cpu_seg;
int kaon_cpu_linear_grouped(kaon_cpu_backend *be, int nseg, const kaon_cpu_seg *seg);

// The moe op (cpu_moe.c).
int kaon_cpu_moe(kaon_backend *be, const void *x, int n, const int32_t *positions,
                 const kaon_moe_weights *w, uint32_t *counts, void *out);

// Threads worth using for `work` multiply-adds (1 below a size where a pool run costs more).
int kaon_cpu_threads_for(const kaon_backend *be, double work);

// Tasks for n items (rows, tokens) on nt threads: a few per thread, so that a thread that
// loses its core leaves its share to the others; items per task a multiple of `align`.
// Returns the number of tasks and sets *per (items per task).
int kaon_cpu_tasks(int n, int nt, int align, int *per);

#endif
