// Shared by the CUDA backend's .cu files (CUDA C++): the backend's state and the launchers
// each file exports to the others. Activations, KV cache and matrices are bf16; vectors
// (norm weights, biases, RoPE frequencies) are f32; every kernel accumulates in f32.
#ifndef KAON_BACKEND_CUDA_INTERNAL_H
#define KAON_BACKEND_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_ld.h"
#include "util/err.h"
}

typedef __nv_bfloat16 bf16;

#define KC_MAX_GRAPHS 64
#define KC_MAX_GEMMS 256
#define KC_ROPE_TABLES 8  // distinct RoPE frequency tables one backend keeps on the device

// One cached cuBLASLt problem: descriptors and the algorithm the heuristic chose.
typedef struct kc_gemm {
    int m, n, k, f32out;
    uint64_t last_use;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int valid;
} kc_gemm;

typedef struct kc_graph {
    uint64_t key;
    int seen;               // times issued eagerly (recorded on the second)
    uint64_t last_use;
    cudaGraphExec_t exec;   // NULL until recorded
} kc_graph;

typedef struct kc_alloc_rec {
    void *p;
    size_t bytes;
} kc_alloc_rec;

typedef struct kc_sampler kc_sampler;  // cuda_sample.cu's buffers
typedef struct kc_mla kc_mla;          // cuda_mla.cu's state
typedef struct kc_fp8 kc_fp8;          // cuda_fp8.cu's state
typedef struct kc_int4 kc_int4;        // cuda_int4.cu's state

typedef struct kc_backend {
    kaon_backend base;
    kc_alloc_rec *allocs;  // what alloc handed out (for the size of a KV cache buffer)
    int n_allocs, cap_allocs;
    int device, n_sm;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    kc_gemm gemms[KC_MAX_GEMMS];
    uint64_t tick;

    // This step's index arrays: the host pointers the ops will be passed, and their device
    // copies (one buffer, one transfer; the layout is fixed by the sizes, which graphs key on).
    const int32_t *h_tokens, *h_pos, *h_seq, *h_slot, *h_tables, *h_rows;
    int32_t *d_tokens, *d_pos, *d_seq, *d_slot, *d_tables, *d_rows;
    int m_tokens, m_seqs, m_max_blocks, m_rows;
    // The step's tokens outside prefill runs (cuda_attention_runs.cuh), when it may have runs:
    // n_rest of them at d_rest (in the same transfer); n_rest -1 when not listed.
    const int32_t *d_rest;
    int n_rest;
    int32_t *meta_dev, *meta_host;  // device buffer and its pinned staging
    size_t meta_cap;                // int32 elements of each
    cudaEvent_t meta_done;          // the staging may be rewritten once this has passed
    // Index arrays an op got without begin_step: copied into a small ring of device memory.
    int32_t *loose_dev;
    size_t loose_cap, loose_used;

    // RoPE inverse frequencies on the device: one table per distinct host array (Gemma 3
    // alternates two, layer by layer), never overwritten, since a recorded graph keeps reading
    // the one it was recorded with. d_inv_freq: the table the next rope launch reads.
    float *d_inv_freq;
    float *rope_dev[KC_ROPE_TABLES];
    float rope_host[KC_ROPE_TABLES][512];
    int rope_half[KC_ROPE_TABLES];
    int n_rope;

    // Attention partial results of split contexts: [tokens, heads, splits, hd + 2] f32, and
    // one arrival counter per (token, kv head) (back to 0 after every launch).
    float *attn_part;
    size_t attn_part_cap;  // floats
    unsigned *attn_count;
    size_t attn_count_cap;
    // Positions for the split-K kernel with the prefill kernel's tokens marked ([tokens]).
    int32_t *fa_mark;
    size_t fa_mark_cap;

    // The batch-1 RMSNorm split around the GEMVs (kc_gemv_fuse): what the last residual GEMV
    // left for the next norm of the residual stream res (weight norm, eps): the row xg and n_parts
    // block sums of squares. Valid for the next launch only (n_launch == launch).
    struct {
        const void *res;
        const float *norm;
        float eps;
        int dim, n_parts;
        uint64_t launch;
    } split;
    bf16 *split_xg;
    size_t split_xg_cap;  // elements
    float *split_parts;
    size_t split_parts_cap;
    uint64_t n_launch;  // kernels launched through kc_launch

    // Scratch for cuBLAS fallbacks of fused ops ([n, ffn] of the up projection).
    bf16 *fuse_tmp;
    size_t fuse_tmp_cap;  // elements

    // Logits on their way to the host: pinned bf16.
    uint16_t *host_out;
    size_t host_out_cap;

    // Graphs of whole steps.
    kc_graph graphs[KC_MAX_GRAPHS];
    int capturing;       // ops are being recorded into a graph
    int in_graph_step;   // between graph_begin and graph_end
    int cur_graph;       // index into graphs, -1 when none
    int graphs_disabled;
    uint64_t graph_steps, graph_replays, graph_recordings;  // graph_begin's calls and outcomes (KAON_GRAPH_STATS=1)
    int pdl;             // programmatic dependent launch for the decode kernels (KAON_PDL=0: off)

    kc_sampler *sampler;  // NULL until the first sample()
    struct kc_quant *quant;  // cuda_quant.cu's state and scratch (NULL until the first quantized weight)
    struct kc_mla *mla;      // cuda_mla.cu's state (cuBLASLt problems of head_linear, scratch)
    kc_fp8 *fp8;             // cuda_fp8.cu's state (NULL until the first FP8 layer)
    kc_int4 *int4;           // cuda_int4.cu's state (NULL until the first INT4 layer)

    // cuda_moe.cu's scratch (from the backend's alloc, so destroy frees it).
    void *moe_buf;
    size_t moe_cap;

    // First asynchronous error (sticky until status() reports it).
    int err;
    char errmsg[512];
    size_t bytes_weights, bytes_alloc;
} kc_backend;

static inline kc_backend *kc(kaon_backend *be) { return (kc_backend *)be; }

// Whether the environment sets name to "0": the A/B switches that turn a kernel off (callers
// keep the answer in a static, read once).
static inline bool kc_env_off(const char *name) {
    const char *e = getenv(name);
    return e && !strcmp(e, "0");
}
// Whether the environment sets name to "1": the switches that turn on a kernel still off by default.
static inline bool kc_env_on(const char *name) {
    const char *e = getenv(name);
    return e && !strcmp(e, "1");
}

// Programmatic dependent launch (Hopper): a kernel launched with kc_launch may start while
// the kernel before it is finishing, so it must call kc_pdl_wait() before it reads anything
// an earlier kernel wrote or writes anything an earlier kernel reads (every block, also
// those that return early); what it does before (address math, loading weights) overlaps
// the previous kernel's tail. kc_pdl_trigger() lets the next kernel start launching.
static __device__ __forceinline__ void kc_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
static __device__ __forceinline__ void kc_pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// Step metadata (positions, sequences, block tables): only the host's copy before the step's
// first kernel writes it, so a kernel may read it before kc_pdl_wait. (Loaded like weights, so
// tests/gpu/pdl_check.py counts it among the loads allowed before the wait.)
static __device__ __forceinline__ int ld_meta(const int32_t *p) {
    int r;
    asm volatile("ld.global.nc.L1::no_allocate.s32 %0, [%1];" : "=r"(r) : "l"(p));
    return r;
}

// The sum of v over the block (red: 33 floats of shared memory), every thread gets it. Its order
// is part of RMSNorm's result: cuda_kernels.cu's k_rmsnorm and cuda_quant.cu's k_qact_norm sum
// with it so that the two round alike.
static __device__ __forceinline__ float kc_block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();  // red may still be read from an earlier call
    if (l == 0) red[w] = v;
    __syncthreads();
    v = l < nw ? red[l] : 0.f;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) red[32] = v;
    __syncthreads();
    return red[32];
}

// Warms L2 with the 128-byte line at p (no register result; L2 stays coherent with later writes).
static __device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// A routing-plan value (written by an earlier kernel) loaded here, through L2. Volatile so that
// ptxas keeps it where it is written: it sank a plain (even .cg) load under the branch on the
// value loaded before it, making two round trips of what two adjacent loads do in one.
static __device__ __forceinline__ int ld_plan(const int *p) {
    int v;
    asm volatile("ld.volatile.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// A weight load that streams past L1 (each weight is read once per step).
static __device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// The same load for requests made before kc_pdl_wait() (why not .nc: cuda_ld.h).
static __device__ __forceinline__ uint4 ld_stream_early(const uint4 *p) {
    uint4 r;
    asm volatile(KC_LD_EARLY ".v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

static __device__ __forceinline__ float dot8(const uint4 &a, const uint4 &b, float s) {
    const __nv_bfloat162 *a2 = (const __nv_bfloat162 *)&a, *b2 = (const __nv_bfloat162 *)&b;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 fa = __bfloat1622float2(a2[e]), fb = __bfloat1622float2(b2[e]);
        s = fmaf(fa.x, fb.x, s);
        s = fmaf(fa.y, fb.y, s);
    }
    return s;
}

// kc_launch for a grid of thread-block clusters of cluster_x blocks along x (0: no clusters).
template <typename... KArgs, typename... Args>
static inline cudaError_t kc_launch_cluster(kc_backend *b, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                            unsigned cluster_x, size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = b->stream;
    cudaLaunchAttribute attr[2];
    unsigned na = 0;
    if (b->pdl) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x) {
        attr[na].id = cudaLaunchAttributeClusterDimension;
        attr[na].val.clusterDim.x = cluster_x;
        attr[na].val.clusterDim.y = 1;
        attr[na++].val.clusterDim.z = 1;
    }
    cfg.attrs = attr;
    cfg.numAttrs = na;
    b->n_launch++;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t kc_launch(kc_backend *b, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                    size_t smem, Args... args) {
    return kc_launch_cluster(b, kernel, grid, block, 0, smem, args...);
}

// Records the first error (later ones are dropped) and returns -1.
int kc_fail(kc_backend *b, const char *fmt, ...) KAON_PRINTF(2, 3);
// Checks a CUDA runtime call; on failure records "what: <cuda message>".
int kc_check(kc_backend *b, cudaError_t e, const char *what);
// Checks the launch that just happened.
int kc_launched(kc_backend *b, const char *what);
// Device copy of a host index array the ops got (this step's, else a loose copy); NULL +
// recorded error when it cannot be had (e.g. an unregistered array while recording a graph).
const int32_t *kc_dev_i32(kc_backend *b, const int32_t *host, size_t n);
// Grows a device scratch buffer outside graph recording; 0 or -1.
int kc_grow(kc_backend *b, void **p, size_t *cap, size_t need, size_t elem, const char *what);

// ---- launchers (cuda_kernels.cu) ----
void kc_embed(kc_backend *b, const bf16 *table, int64_t vocab, int dim, const int32_t *d_ids,
              int n, bf16 *out);
void kc_get_rows(kc_backend *b, const bf16 *x, const int32_t *d_idx, int n, int dim, bf16 *out);
// once: x / rms(x) * w rounded to bf16 once (Gemma's RMSNorm, all in f32); else x / rms(x) is
// rounded before the weight multiplies it (Llama's: weight * hidden.to(bf16)).
void kc_rmsnorm(kc_backend *b, bf16 *x, const bf16 *add, const float *w, float eps, int n,
                int dim, bf16 *out, bool once);
void kc_rope(kc_backend *b, bf16 *x, int n, int n_heads, int hd, const int32_t *d_pos,
             int rot_dim, int interleaved);
// Slots outside [0, n_slots) are skipped (negative: padding tokens).
void kc_kv_write(kc_backend *b, bf16 *kc_, bf16 *vc, const bf16 *k, const bf16 *v,
                 const int32_t *d_slot, int64_t n_slots, int n, int row);
// Into an FP8 cache (e4m3 of x / scale; vc NULL: no V); row even.
void kc_kv_write_fp8(kc_backend *b, uint8_t *kc_, uint8_t *vc, const bf16 *k, const bf16 *v,
                     const int32_t *d_slot, int64_t n_slots, int n, int row, float k_scale, float v_scale);
// qn, kn (both or neither; 128-wide heads, full NeoX rotary): each q / k head RMSNormed first (eps).
void kc_rope_kv_write(kc_backend *b, bf16 *q, const bf16 *k, const bf16 *v, bf16 *kcache,
                      bf16 *vcache, const int32_t *d_pos, const int32_t *d_slot, int64_t n_slots,
                      int n, int nh, int nkv, int hd, int rot_dim, int interleaved, const float *qn,
                      const float *kn, float eps);
void kc_mla_prep(kc_backend *b, const bf16 *kva, const float *w, float eps, const bf16 *q, int nh, int hd,
                 float pe_scale, bf16 *qm, bf16 *cache, const int32_t *d_pos, const int32_t *d_slot, int64_t n_slots,
                 int n, int kvl, int rd, int interleaved);
void kc_silu_mul(kc_backend *b, const bf16 *g, const bf16 *u, size_t n, bf16 *out);
void kc_gelu_tanh_mul(kc_backend *b, const bf16 *g, const bf16 *u, size_t n, bf16 *out);
void kc_scale(kc_backend *b, bf16 *x, size_t n, float s);
void kc_softcap(kc_backend *b, float *x, size_t n, float cap);
void kc_add_bias(kc_backend *b, bf16 *y, const float *bias, int n, int out);
// Where a dummy weight's elements take their values from (fill_dummy's origin): element
// (r, c) of a fill of cols columns is element (r + r0, c + c0) of a whole tensor of full_cols
// columns, whose flat index seeds its value, so a shard holds exactly the whole's values.
typedef struct kc_fill_at {
    int64_t cols, r0, c0, full_cols;
} kc_fill_at;

// A weight of ndim dimensions and cols (last-dimension) elements per row, placed by origin
// (NULL: whole). A vector is one row: its one dimension is the columns.
static inline kc_fill_at kc_fill_place(int ndim, int64_t cols, const kaon_dummy_origin *o) {
    kc_fill_at a = {cols, 0, 0, cols};
    if (!o) return a;
    if (ndim == 2 && o->dim == 0) a.r0 = o->lo;  // rows cut: the columns are whole
    else a.c0 = o->lo, a.full_cols = o->full;
    return a;
}

// The flat index in the whole tensor of element i of the fill.
static __host__ __device__ inline uint64_t kc_fill_index(kc_fill_at a, uint64_t i) {
    const uint64_t r = i / (uint64_t)a.cols, c = i % (uint64_t)a.cols;
    return (r + (uint64_t)a.r0) * (uint64_t)a.full_cols + c + (uint64_t)a.c0;
}

void kc_fill_uniform(kc_backend *b, void *dst, int is_f32, size_t n, kc_fill_at at, uint64_t seed, float scale,
                     float offset);
// Converts n elements of a host-format buffer already on the device to bf16 or f32.
int kc_convert(kc_backend *b, kaon_dtype src_t, const void *src, int64_t rows, int64_t cols,
               void *dst, int dst_f32);

// ---- attention (cuda_attention.cu) ----
// n_slots: token slots the cache holds (keys whose slot falls outside are skipped). window: as
// the attention op's (0: full causal; else the keys p - window < k <= p).
int kc_attention(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache,
                 const kaon_attn_meta *m, int64_t n_slots, int nh, int nkv, int hd, float scale,
                 int window, bf16 *out);
// An FP8 cache (KAON_KV_FP8: e4m3 codes, values code * k_scale / v_scale): as kc_attention, with
// the FP8 plan and prefill kernel (hd 64 / 128; others: every token on the streaming or split-K one).
int kc_attention_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                     const kaon_attn_meta *m, int64_t n_slots, int nh, int nkv, int hd, float scale, float k_scale,
                     float v_scale, int window, bf16 *out);
int kc_attention_init(kc_backend *b);
// The streaming kernel for tokens attending to their context one by one (decode): 0 launched,
// 1 no instance for these shapes, -1 error. Tokens with a negative position get zeros.
int kc_attention_decode(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache,
                        const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                        const int32_t *d_tab, int nh, int nkv, int hd, float scale, int window, bf16 *out);

// The tensor-core decode kernel (cuda_attention_decode_tc.cu) on kc_attention_decode's grid
// (tokens, KV heads, ranges; attn_part / attn_count sized for it), over a bf16 cache or an FP8 one
// (scale with k_scale folded in, vs = v_scale); tmap: the tokens of the grid's rows (NULL: row t
// is token t). 1 when it leaves the launch to the CUDA-core kernel (KAON_DEC_TC=0, a group
// outside 2-16, head_dim, a step that may hold prefill runs without tmap), else 0 launched / -1 error.
bool kc_attention_decode_tc_takes(int nh, int nkv, int hd);
// Its blocks resident per SM for a launch of this many tokens (0: unknown).
int kc_attention_decode_tc_per_sm(const kc_backend *b, int tokens, int hd);
int kc_attention_decode_tc(kc_backend *b, dim3 grid, const bf16 *q, const void *kcache, const void *vcache,
                           bool fp8, const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos,
                           const int32_t *d_seq, const int32_t *d_tab, const int32_t *tmap, int nh, int nkv, int hd,
                           float scale, float vs, int window, bf16 *out);

// The same kernel over an FP8 cache (e4m3 codes; values code * k_scale, code * v_scale).
int kc_attention_decode_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                            const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                            const int32_t *d_tab, int nh, int nkv, int hd, float scale, float k_scale, float v_scale,
                            int window, bf16 *out);

// ---- prefill attention on the tensor cores (cuda_attention_prefill.cu) ----
// Called by kc_attention before its split-K kernel: 1 when the step's shape allows runs of
// prefill tokens (then *d_pos_rest = positions with those tokens marked, for the split-K kernel,
// and kc_attention_prefill must run after it), 0 when not (*d_pos_rest = d_pos), -1 on error.
int kc_attention_prefill_plan(kc_backend *b, const kaon_attn_meta *m, int nh, int nkv, int hd, float scale,
                              const int32_t *d_pos, const int32_t *d_seq, const int32_t **d_pos_rest);
// Overwrites the output rows of the marked tokens.
int kc_attention_prefill(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache,
                         const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                         const int32_t *d_tab, int nh, int nkv, int hd, float scale, int window, bf16 *out);
// The same over an FP8 cache (tiles widened to f16 in shared memory): the plan takes head_dim 64
// and 128 only, and nothing with KAON_FA_FP8=0 (or KAON_FA=0).
int kc_attention_prefill_plan_fp8(kc_backend *b, const kaon_attn_meta *m, int nh, int nkv, int hd, float scale,
                                  const int32_t *d_pos, const int32_t *d_seq, const int32_t **d_pos_rest);
int kc_attention_prefill_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                             const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                             const int32_t *d_tab, int nh, int nkv, int hd, float scale, float k_scale, float v_scale,
                             int window, bf16 *out);
// The Hopper (sm_90a) wgmma kernel of head_dim 128 over a bf16 cache, full attention
// (cuda_attention_prefill_wgmma.cu): the rows and results of the mma.sync instance it stands in
// for, called by kc_attention_prefill when kc_fa_wgmma_on(). sl2 = scale * log2 e; mark: the plan's
// positions (FA_MARK on the tokens to write).
int kc_fa_prefill_wgmma(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache, const int32_t *d_pos,
                        const int32_t *d_mark, const int32_t *d_seq, const int32_t *d_tab, int T, int max_blocks,
                        int bs, int64_t n_slots, int nh, int nkv, float sl2, bf16 *out);
// On a compute capability 9.0 device unless KAON_FA_WGMMA=0 (read once).
bool kc_fa_wgmma_on(void);

// ---- matrices (cuda_linear.cu) ----
// y [n, out] = x [n, in] @ w [out, in]^T (+ bias f32); y bf16, or f32 when f32out.
int kc_gemm_bf16(kc_backend *b, const bf16 *x, int n, const bf16 *w, int out, int in,
                 const float *bias, void *y, int f32out);
// KAON_GEMV_OCC (a bit mask, read once; default KC_OCC_MOE_DOWN): which GEMV kernels take
// their instances built for 4 blocks per SM. More resident warps speed a kernel up but leave no
// room for the next kernel's early (PDL) blocks: a win for the MoE down kernel on every model
// measured, model-dependent for the others (tests/gpu/NOTES.md, 2026-12-03).
enum { KC_OCC_GEMV = 1, KC_OCC_SILU = 2, KC_OCC_MOE_DOWN = 4 };
bool kc_gemv_occ_hi(int which);
// Up to 4 weights sharing x, through the small-batch kernel; returns 1 when n or the shapes
// do not suit it.
#define KC_GEMV_MAX_N 8
// What a GEMV may fuse (NULL: nothing), at batch 1 only: an RMSNorm split around the GEMVs.
// residual (one weight, bf16 y the residual stream): y += bf16(x @ w^T), then xg = bf16(y * norm)
// (the next norm's weight, [out] f32) and each block's sum of y^2 into parts [out / KC_GEMV_ROWS]. normed: x
// is such an xg, and every product is scaled by 1 / rms(y) = rsqrt(sum(parts[:n_parts]) / in +
// eps) before its bias. The same as norm-then-GEMV up to rounding (the norm's scale applied after
// the dot product instead of before it).
#define KC_GEMV_NORM_MAX_IN 16384
#define KC_GEMV_ROWS 8  // output rows per block of the small-batch GEMV (one per warp)
// The split norm's device side, shared by the GEMVs (cuda_linear.cu) and the MoE small path
// (cuda_moe.cu) so that both get the same 1 / rms from the same parts. kc_norm_block_sum: the
// sum of v over a block of KC_GEMV_ROWS warps in a fixed order (the same bits every run), in
// every thread; every thread of the block must call it. kc_parts_share: the thread's share of
// the parts a residual kernel left (requested early, summed by kc_norm_rinv later).
static __device__ __forceinline__ float kc_norm_block_sum(float v) {
    __shared__ float red[KC_GEMV_ROWS];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < KC_GEMV_ROWS; i++) s += red[i];
    return s;
}
static __device__ __forceinline__ float kc_parts_share(const float *parts, int n_parts) {
    float s = 0.f;
    for (int i = threadIdx.x; i < n_parts; i += blockDim.x) s += __ldcg(parts + i);
    return s;
}
// 1 / rms of a row of `in` values from the block's shares of its parts (every thread calls it).
static __device__ __forceinline__ float kc_norm_rinv(float share, int in, float eps) {
    return rsqrtf(kc_norm_block_sum(share) / (float)in + eps);
}

typedef struct kc_gemv_fuse {
    int residual, normed;
    const float *norm;  // residual
    bf16 *xg;           // residual
    float *parts;       // written by residual, read by normed
    int n_parts;        // normed
    float eps;          // normed
} kc_gemv_fuse;
// RoPE and the KV write of kc_gemv_qkv_rope (128-wide heads, full NeoX rotary, a bf16 cache) and
// kc_quant_norm_qkv_rope (full rotary, head_dim hd).
typedef struct QkvRope {
    bf16 *kcache, *vcache;     // [slots, nkv, hd]
    const int32_t *pos, *slot;  // the token's position and cache slot (device, one each)
    int64_t n_slots;
    const float *inv_freq;     // [hd / 2]
    int nh, nkv;
} QkvRope;
// q, k, v GEMVs of a split norm's xg (fuse: normed) with the rotation and the KV write in their
// epilogue: q rotated into q, k and v into their cache rows; 1 where the shapes do not suit.
int kc_gemv_qkv_rope(kc_backend *b, const bf16 *x, int in, const bf16 *const *w, const float *const *bias, bf16 *q,
                     const kc_gemv_fuse *fuse, const QkvRope *r);
int kc_gemv_multi(kc_backend *b, const bf16 *x, int n, int in, int count, const bf16 *const *w,
                  const int *rows, const float *const *bias, void *const *y, int f32out, const kc_gemv_fuse *fuse);
int kc_gemv_silu(kc_backend *b, const bf16 *x, int n, int in, const bf16 *wg, const bf16 *wu,
                 int rows, bf16 *out, const kc_gemv_fuse *fuse);
void kc_gemm_cache_free(kc_backend *b);

// ---- mixture of experts (cuda_moe.cu): the moe op of backend.h ----
extern "C" int kc_moe_op(kaon_backend *be, const void *x, int n, const int32_t *positions,
                         const kaon_moe_weights *w, uint32_t *counts, void *out);
// The moe op at batch 1 around the split norm (backend.h's norm_moe_residual): x is
// b->split_xg, scaled by 1 / rms from in (normed); res += the output, then the next norm's xg and
// parts from out (residual; NULL: none), whose n_parts it sets. 1: declined before anything
// ran, 0, -1.
int kc_moe_norm_residual(kc_backend *b, const kaon_moe_weights *w, const int32_t *positions, uint32_t *counts,
                         void *res, const kc_gemv_fuse *in, kc_gemv_fuse *out);
// DeepSeekMoE routing (cuda_moe_route.cu): whether w asks for it (sigmoid scores, a selection
// bias, expert groups, a routed scaling factor), its argument checks (0 or -1), and the
// routing kernel writing what k_route writes (ids, weights, per-expert counts).
bool kc_moe_route_is_ds(const kaon_moe_weights *w);
int kc_moe_route_ds_check(kc_backend *b, const kaon_moe_weights *w);
int kc_moe_route_ds(kc_backend *b, const float *logits, const int32_t *d_pos, int n, const kaon_moe_weights *w,
                    int *topk_id, float *topk_w, int *cnt, uint32_t *counts);

// ---- MLA (cuda_mla.cu): the ops mla_attention, head_linear, copy_strided of backend.h, and
// kv_write for a cache without V ----
void kc_op_mla_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv, const kaon_attn_meta *m, int nh,
                         int kv_lora, int rope_dim, float scale, void *out);
void kc_op_head_linear(kaon_backend *be, const void *x, int n, int nh, size_t x_tok, size_t x_head,
                       const kaon_linear *w, void *y, size_t y_tok, size_t y_head);
void kc_op_copy_strided(kaon_backend *be, const void *src, size_t src_stride, void *dst, size_t dst_stride, int rows,
                        int width, float s);
void kc_kv_write_k_only(kaon_backend *be, kaon_kv_layer *kv, const void *k, const kaon_attn_meta *m, int nkv,
                        int hd);
void kc_mla_destroy(kc_backend *b);

// ---- sampling (cuda_sample.cu) ----
// Samples sb's rows of logits [*, vocab] (edited in place) into host ids / logprobs; waits.
int kc_sample(kc_backend *b, float *logits, int vocab, const kaon_sample_batch *sb, int32_t *ids,
              float *logprobs);
void kc_sampler_free(kc_backend *b);

// ---- quantized GGUF weights (cuda_quant.cu) ----
// Matrices of Q4_0/Q4_1/Q8_0/Q4_K/Q6_K stay quantized on the device (their own layout; the
// tensor keeps the GGUF dtype). Each hook returns 1 when no weight it gets is quantized (the
// caller goes on with its bf16 path), else 0 when done or -1 on error (recorded). The linear
// hooks get a layer's weight and bias once the op (cuda_backend.cu) has checked the layer.
// KAON_CUDA_QUANT=0: upload declines, so weights are expanded to bf16 as before.
int kc_quant_upload(kc_backend *b, const kaon_tensor *host, kaon_tensor *dev);
// Bytes of kc_quant_upload's copy of host; 0 when it would expand host to bf16 instead.
size_t kc_quant_bytes(kc_backend *b, const kaon_tensor *host);
int kc_quant_embed(kc_backend *b, const kaon_tensor *table, const int32_t *ids, int n, void *out);
int kc_quant_linear(kc_backend *b, const void *x, int n, const kaon_tensor *w, const kaon_tensor *bias, void *y,
                    int f32out);
// The fused ops: done here as soon as one of the weights is quantized (never declined).
int kc_quant_linear_multi(kc_backend *b, const void *x, int n, int count, const kaon_tensor *const *w,
                          const kaon_tensor *const *bias, void *const *y);
int kc_quant_linear_silu_mul(kc_backend *b, const void *x, int n, const kaon_tensor *wg, const kaon_tensor *wu,
                             void *out);
// Small batches (n <= 64) of a decode step, where the residual stream needs no separate op:
// res += x @ w^T (+ bias) with the add in the GEMV's epilogue, rounded as the next RMSNorm's add
// would round it; and RMSNorm fused into the activation quantization of the linears that read
// its output (k_rmsnorm's arithmetic, so the products are those of the separate ops, bit for bit).
// 1 where they do not apply (not every weight quantized, a larger batch, KAON_QUANT_FUSE=0).
int kc_quant_linear_residual(kc_backend *b, const void *x, int n, const kaon_tensor *w, const kaon_tensor *bias,
                             void *res);
// q, k and v of RMSNorm(x) for one token (GGUF-quantized, one format), with RoPE (full rotary;
// interleaved or NeoX pairs) and the write of k and v to a bf16 cache in the GEMV's epilogue: q
// rotated into q; 1 where the shapes or formats do not suit (nothing run).
int kc_quant_norm_qkv_rope(kc_backend *b, const void *x, const kaon_tensor *norm, float eps,
                           const kaon_tensor *const *w, const kaon_tensor *const *bias, bf16 *q, const QkvRope *r,
                           int hd, int interleaved);
int kc_quant_norm_linear_multi(kc_backend *b, const void *x, const kaon_tensor *norm, float eps, int n, int count,
                               const kaon_tensor *const *w, const kaon_tensor *const *bias, void *const *y);
int kc_quant_norm_linear_silu_mul(kc_backend *b, const void *x, const kaon_tensor *norm, float eps, int n,
                                  const kaon_tensor *wg, const kaon_tensor *wu, void *out);
// Every row of a quantized matrix into out (bf16 [rows, cols], device): 0, -1, or 1 when w is
// not a quantized matrix.
int kc_quant_dequant(kc_backend *b, const kaon_tensor *w, bf16 *out);
void kc_quant_destroy(kc_backend *b);

// ---- linear layers with scale companions: FP8 (cuda_fp8.cu) and INT4 (cuda_int4.cu) ----
// upload: the upload_linear op of backend.h for host's format (w and companions in one
// allocation; dev's bias, shard and parts untouched). linear: y [n, out] (bf16, or f32 when
// f32out) = x [n, in] bf16 @ l^T (+ l's bias); 0, or -1 + recorded error. bytes: what upload
// allocates for host.
int kc_fp8_upload(kc_backend *b, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev);
int kc_fp8_linear(kc_backend *b, const void *x, int n, const kaon_linear *l, void *y, int f32out);
// The fused ops over FP8 layers (x quantized once, one GEMV launch): 0, -1, or 1 to decline.
// split (NULL: none): x is a batch-1 split norm's xg (kc_gemv_fuse), quantized with its 1 / rms.
int kc_fp8_linear_multi(kc_backend *b, const void *x, int n, int count, const kaon_linear *const *l, void *const *y,
                        const kc_gemv_fuse *split);
int kc_fp8_silu_mul(kc_backend *b, const void *x, int n, const kaon_linear *gate, const kaon_linear *up, void *out,
                    const kc_gemv_fuse *split);
int kc_fp8_linear_residual(kc_backend *b, const void *x, int n, const kaon_linear *l, void *res, kc_gemv_fuse *f);
size_t kc_fp8_bytes(const kaon_tensor *host);
void kc_fp8_destroy(kc_backend *b);
int kc_int4_upload(kc_backend *b, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev);
int kc_int4_linear(kc_backend *b, const void *x, int n, const kaon_linear *l, void *y, int f32out);
size_t kc_int4_bytes(const kaon_tensor *host);
// The fused ops for INT4 layers (n <= 32, same width and group, no act-order, no bias for
// silu): one GEMV launch; 1 when declined (the caller runs the layers one at a time).
// split (NULL: none): x is a batch-1 split norm's xg (kc_gemv_fuse), the products scaled by its 1 / rms.
int kc_int4_linear_multi(kc_backend *b, const void *x, int n, int count, const kaon_linear *const *l, void *const *y,
                         const kc_gemv_fuse *split);
int kc_int4_linear_silu_mul(kc_backend *b, const void *x, int n, const kaon_linear *gate, const kaon_linear *up,
                            void *out, const kc_gemv_fuse *split);
int kc_int4_linear_residual(kc_backend *b, const void *x, int n, const kaon_linear *l, void *res, kc_gemv_fuse *f);
void kc_int4_destroy(kc_backend *b);
// Whether l is a layer of those two formats (the ops send it to their linear).
static inline bool kc_is_scaled_linear(const kaon_linear *l) {
    return l && (l->w.dtype == KAON_FP8_E4M3 || l->w.dtype == KAON_I4) && l->scale.data;
}

#endif
