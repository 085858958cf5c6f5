// Multi-head latent attention (DeepSeek's MLA, absorbed form) on the GPU, and the small ops
// around it: copy_strided, kv_write of a cache without V, head_linear (per-head matrices).
//
// mla_attention. The cache holds one row per token, [kv_lora + rope] bf16 = [c | k_pe]; every
// query head attends with K = the whole row and V = its first kv_lora values. So all heads of a
// token share one key/value stream, and the kernels read each row once per CTA for a whole
// block of heads:
//  - k_mla_tc (kv_lora 512, rope 64, heads a multiple of 16: every real model): a CTA of 8
//    warps takes one token, HB = 16, 32 or 64 of its heads (nh = 128: two head blocks) and one
//    range of its keys. Q [HB, 576] sits in shared memory; K tiles of KT rows come in by
//    cp.async through the block table, double-buffered. Scores S = Q K^T and the update
//    O += P V run on the tensor cores (mma.sync m16n8k16 bf16, f32 accumulators; ldmatrix,
//    .trans for V = the first 512 columns of the same K tile). Warps are (m-tile of 16 heads)
//    x (DS = 8 / m-tiles): for S each warp takes KT / DS keys of its m-tile, for P V each warp
//    512 / DS output dims, so O stays in registers (<= 128 f32 per thread). The online softmax
//    (log2 units) combines the row maxima of an m-tile's warps through shared memory; P goes
//    to shared memory as bf16 for the second product.
//  - k_mla_generic (any kv_lora multiple of 8, rope even, any head count; KAON_MLA_GENERIC=1
//    forces it): CUDA cores, up to 16 heads per CTA, K tiles of 32 rows in shared memory, one
//    (head, key) score per thread, then one (head, dim) accumulator per thread.
//  Short batches split each token's keys over gridDim.z ranges (the count in use follows the
//  token's own length, so one launch shape, one CUDA graph, serves every context); each range
//  writes (O unnormalised, max, sum) and k_mla_merge, one CTA per (token, head), combines them.
//  Tokens with a negative position or sequence (padding) get zeros.
//
// head_linear: y[t,h,:] = x[t,h,:] @ W_h^T. Decode batches (n <= 8) and shapes cuBLASLt cannot
// take: our kernel, a group of lanes per weight row (16-byte loads), up to 8 tokens per pass.
// Larger batches: cuBLASLt strided-batched GEMM (batch = heads), descriptors cached per shape
// (created outside graph recording; a shape first seen while recording takes the kernel).
// Quantized GGUF head matrices are dequantized into a scratch first (slow, but correct).
#include "backend/cuda/cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MLA_D 576          // the fast kernel's row: kv_lora 512 + rope 64
#define MLA_L 512
#define MLA_LD (MLA_D + 8) // shared row stride (bf16) of Q and K tiles: rows 16 B apart in banks
#define MLA_THREADS 256
#define MLA_MAX_SPLITS 256  // a multiple of 32 (k_mla_merge); batch 1 can fill every SM
#define MG_THREADS 128     // generic kernel
#define MG_KT 32
#define MG_MAX_HEADS 16
#define HL_WARPS 8
#define HL_NB 8            // tokens per pass of the head_linear kernel
#define HL_MAX_GEMMS 32

// ---- state ---------------------------------------------------------------------------------------

typedef struct kc_hgemm {
    int valid;  // 1: algo usable; 2: cuBLASLt has none (the kernel serves this shape)
    uint64_t last_use;
    int n, in, out, nh;
    int64_t x_tok, x_head, y_tok, y_head;
    unsigned align_x, align_y, align_w;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} kc_hgemm;

struct kc_mla {
    kc_hgemm gemms[HL_MAX_GEMMS];
    uint64_t tick;
    bf16 *wdeq;  // dequantized head matrix (quantized GGUF attn_k_b / attn_v_b)
    size_t wdeq_cap;
    int smem_max;  // the device's opt-in shared memory per block
    int smem_set;  // kernels whose limit was raised (bit per kernel)
};

static kc_mla *mla_state(kc_backend *b) {
    if (b->mla) return b->mla;
    kc_mla *s = (kc_mla *)calloc(1, sizeof *s);
    if (!s) {
        kc_fail(b, "cuda: out of host memory");
        return NULL;
    }
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, b->device) != cudaSuccess) {
        cudaGetLastError();
        v = 48 * 1024;
    }
    s->smem_max = v;
    b->mla = s;
    return s;
}

static void hgemm_destroy(kc_hgemm *g) {
    if (g->valid == 1) {
        cublasLtMatrixLayoutDestroy(g->a);
        cublasLtMatrixLayoutDestroy(g->b);
        cublasLtMatrixLayoutDestroy(g->c);
        cublasLtMatmulDescDestroy(g->op);
    }
    g->valid = 0;
}

void kc_mla_destroy(kc_backend *b) {
    kc_mla *s = b->mla;
    if (!s) return;
    for (int i = 0; i < HL_MAX_GEMMS; i++) hgemm_destroy(&s->gemms[i]);
    if (s->wdeq) cudaFree(s->wdeq);
    free(s);
    b->mla = NULL;
}

// Raises a kernel's dynamic shared memory limit to the device's opt-in maximum (once; outside
// graph recording, as the first call of any shape is eager).
static int smem_optin(kc_backend *b, const void *kernel, int bit, size_t need) {
    kc_mla *s = mla_state(b);
    if (!s) return -1;
    if (need > (size_t)s->smem_max)
        return kc_fail(b, "cuda mla: %zu bytes of shared memory needed, the device allows %d", need, s->smem_max);
    if (need <= 48 * 1024 || (s->smem_set >> bit & 1)) return 0;
    if (kc_check(b, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, s->smem_max),
                 "mla shared memory"))
        return -1;
    s->smem_set |= 1 << bit;
    return 0;
}

static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Bytes of the backend allocation that starts at p (0: not from alloc).
static size_t alloc_bytes(const kc_backend *b, const void *p) {
    for (int i = 0; i < b->n_allocs; i++)
        if (b->allocs[i].p == p) return b->allocs[i].bytes;
    return 0;
}

static __device__ __forceinline__ float bfl(bf16 x) { return __bfloat162float(x); }

// ---- copy_strided --------------------------------------------------------------------------------

// dst[r * ds + i] = bf16(s * src[r * ss + i]); V elements per access (8: 16 B, 2: 4 B, 1).
template <int V>
__global__ void k_copy_strided(const bf16 *__restrict__ src, int64_t ss, bf16 *__restrict__ dst, int64_t ds,
                               int rows, int width, float s) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const int wv = width / V;
    const int64_t total = (int64_t)rows * wv;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / wv;
        const int c = (int)(i - r * wv) * V;
        const bf16 *a = src + r * ss + c;
        bf16 *o = dst + r * ds + c;
        if (V == 8) {
            uint4 v = *(const uint4 *)a;
            if (s != 1.f) {
                __nv_bfloat162 *h = (__nv_bfloat162 *)&v;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(h[e]);
                    h[e] = __floats2bfloat162_rn(f.x * s, f.y * s);
                }
            }
            *(uint4 *)o = v;
        } else if (V == 2) {
            __nv_bfloat162 v = *(const __nv_bfloat162 *)a;
            if (s != 1.f) {
                const float2 f = __bfloat1622float2(v);
                v = __floats2bfloat162_rn(f.x * s, f.y * s);
            }
            *(__nv_bfloat162 *)o = v;
        } else {
            *o = s != 1.f ? __float2bfloat16(bfl(*a) * s) : *a;
        }
    }
}

void kc_op_copy_strided(kaon_backend *be, const void *src_, size_t ss, void *dst_, size_t ds, int rows, int width,
                        float s) {
    kc_backend *b = kc(be);
    if (rows <= 0 || width <= 0) return;
    if (!src_ || !dst_) {
        kc_fail(b, "cuda copy_strided: bad arguments");
        return;
    }
    const bf16 *src = (const bf16 *)src_;
    bf16 *dst = (bf16 *)dst_;
    const bool v8 = ss % 8 == 0 && ds % 8 == 0 && width % 8 == 0 && al16(src) && al16(dst);
    const bool v2 = ss % 2 == 0 && ds % 2 == 0 && width % 2 == 0 && ((uintptr_t)src & 3) == 0 &&
                    ((uintptr_t)dst & 3) == 0;
    const int V = v8 ? 8 : v2 ? 2 : 1;
    const int64_t total = (int64_t)rows * (width / V);
    int64_t blocks = (total + 255) / 256;
    if (blocks > 16 * (int64_t)b->n_sm) blocks = 16 * (int64_t)b->n_sm;
    if (blocks < 1) blocks = 1;
    const dim3 g((unsigned)blocks), t(256);
    if (V == 8) kc_launch(b, k_copy_strided<8>, g, t, 0, src, (int64_t)ss, dst, (int64_t)ds, rows, width, s);
    else if (V == 2) kc_launch(b, k_copy_strided<2>, g, t, 0, src, (int64_t)ss, dst, (int64_t)ds, rows, width, s);
    else kc_launch(b, k_copy_strided<1>, g, t, 0, src, (int64_t)ss, dst, (int64_t)ds, rows, width, s);
    kc_launched(b, "copy_strided");
}

// ---- kv_write without V -----------------------------------------------------------------------------

// Row t of k [n, row] to its slot's row of the cache [slots, row]; slots outside [0, n_slots)
// (padding) are skipped.
template <bool VEC>
__global__ void k_row_write(bf16 *__restrict__ cache, const bf16 *__restrict__ k, const int32_t *__restrict__ slot,
                            int64_t n_slots, int row) {
    const int t = blockIdx.x;
    const int64_t s = slot[t];
    if (s < 0 || s >= n_slots) return;
    if (VEC) {
        const uint4 *ks = (const uint4 *)(k + (size_t)t * row);
        uint4 *kd = (uint4 *)(cache + (size_t)s * row);
        for (int j = threadIdx.x; j < row / 8; j += blockDim.x) kd[j] = ks[j];
    } else {
        const bf16 *ks = k + (size_t)t * row;
        bf16 *kd = cache + (size_t)s * row;
        for (int j = threadIdx.x; j < row; j += blockDim.x) kd[j] = ks[j];
    }
}

void kc_kv_write_k_only(kaon_backend *be, kaon_kv_layer *kv, const void *k, const kaon_attn_meta *m, int nkv,
                        int hd) {
    kc_backend *b = kc(be);
    if (!kv || !kv->k || !k || !m || nkv <= 0 || hd <= 0) {
        kc_fail(b, "cuda kv_write: bad arguments");
        return;
    }
    if (m->n_tokens <= 0) return;
    const int32_t *d = kc_dev_i32(b, m->slot_mapping, (size_t)m->n_tokens);
    if (!d) return;
    const int row = nkv * hd;
    const size_t bytes = alloc_bytes(b, kv->k);
    const int64_t n_slots = bytes ? (int64_t)(bytes / ((size_t)row * sizeof(bf16))) : INT64_MAX;
    if (row % 8 == 0 && al16(kv->k) && al16(k))
        k_row_write<true><<<m->n_tokens, 128, 0, b->stream>>>((bf16 *)kv->k, (const bf16 *)k, d, n_slots, row);
    else
        k_row_write<false><<<m->n_tokens, 128, 0, b->stream>>>((bf16 *)kv->k, (const bf16 *)k, d, n_slots, row);
    kc_launched(b, "kv_write");
}

// ---- head_linear ------------------------------------------------------------------------------------

// Rows r = h * out + o of W [nh * out, in] (head h's matrix: rows [h out, (h+1) out)). VEC: lpr
// lanes per row read it with 16-byte loads (x rows 16-byte aligned); else one warp per row, one
// element per lane. blockIdx.y: tokens [8 y, 8 y + 8).
template <bool VEC>
__global__ void __launch_bounds__(HL_WARPS * 32)
k_head_gemv(const bf16 *__restrict__ x, int n, int64_t x_tok, int64_t x_head, const bf16 *__restrict__ w, int out,
            int in, int rows, int lpr, bf16 *__restrict__ y, int64_t y_tok, int64_t y_head) {
    kc_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int l = VEC ? lpr : 32, rpw = 32 / l, sub = lane % l, grp = lane / l;
    const int row_raw = (blockIdx.x * HL_WARPS + warp) * rpw + grp;
    const bool active = row_raw < rows;
    const int row = active ? row_raw : rows - 1;  // idle lanes still take part in the shuffles
    const int h = row / out, o = row - h * out;
    const int t0 = blockIdx.y * HL_NB, nb = min(HL_NB, n - t0);
    const bf16 *xh = x + (int64_t)t0 * x_tok + (int64_t)h * x_head;
    float acc[HL_NB];
#pragma unroll
    for (int j = 0; j < HL_NB; j++) acc[j] = 0.f;
    kc_pdl_wait();
    if (VEC) {
        const uint4 *wr = (const uint4 *)(w + (size_t)row * in);
        const int nc = in >> 3;
#pragma unroll 4
        for (int c = sub; c < nc; c += l) {
            const uint4 wv = __ldg(wr + c);
#pragma unroll
            for (int j = 0; j < HL_NB; j++)
                if (j < nb) acc[j] = dot8(wv, __ldg((const uint4 *)(xh + (int64_t)j * x_tok) + c), acc[j]);
        }
    } else {
        const bf16 *wr = w + (size_t)row * in;
        for (int i = lane; i < in; i += 32) {
            const float wf = bfl(wr[i]);
#pragma unroll
            for (int j = 0; j < HL_NB; j++)
                if (j < nb) acc[j] = fmaf(wf, bfl(xh[(int64_t)j * x_tok + i]), acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < HL_NB; j++)
        for (int off = l >> 1; off > 0; off >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
    if (active && sub == 0) {
        bf16 *yr = y + (int64_t)t0 * y_tok + (int64_t)h * y_head + o;
#pragma unroll
        for (int j = 0; j < HL_NB; j++)
            if (j < nb) yr[(int64_t)j * y_tok] = __float2bfloat16(acc[j]);
    }
}

static int head_gemv(kc_backend *b, const bf16 *x, int n, int nh, int64_t x_tok, int64_t x_head, const bf16 *w,
                     int out, int in, bf16 *y, int64_t y_tok, int64_t y_head) {
    const int64_t rows = (int64_t)nh * out;
    const bool vec = in % 8 == 0 && x_tok % 8 == 0 && x_head % 8 == 0 && al16(x) && al16(w);
    int lpr = 32;
    if (vec) {
        const int nc = in / 8;
        lpr = 1;
        while (lpr * 2 <= nc && lpr < 32) lpr *= 2;
    }
    const int rows_per_block = HL_WARPS * (32 / lpr);
    const int64_t gx = (rows + rows_per_block - 1) / rows_per_block, gy = (n + HL_NB - 1) / HL_NB;
    if (gx > INT32_MAX || gy > 65535) return kc_fail(b, "cuda head_linear: %d tokens of %lld rows is too large", n,
                                                     (long long)rows);
    const dim3 g((unsigned)gx, (unsigned)gy), t(HL_WARPS * 32);
    if (vec)
        kc_launch(b, k_head_gemv<true>, g, t, 0, x, n, x_tok, x_head, w, out, in, (int)rows, lpr, y, y_tok, y_head);
    else
        kc_launch(b, k_head_gemv<false>, g, t, 0, x, n, x_tok, x_head, w, out, in, (int)rows, lpr, y, y_tok, y_head);
    return kc_launched(b, "head_linear");
}

// The largest power of two (<= 256) that divides the address and the byte strides.
static unsigned alignment(const void *p, int64_t ld, int64_t stride) {
    uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)(ld * 2) | (uint64_t)(stride * 2) | 256u;
    return (unsigned)(v & (~v + 1));
}

// The cached cuBLASLt problem for this shape; NULL when there is none to use (then the kernel).
static kc_hgemm *hgemm_get(kc_backend *b, int n, int nh, int in, int out, const void *x, int64_t x_tok,
                           int64_t x_head, const void *w, void *y, int64_t y_tok, int64_t y_head) {
    kc_mla *s = mla_state(b);
    if (!s) return NULL;
    const unsigned ax = alignment(x, x_tok, x_head), ay = alignment(y, y_tok, y_head),
                   aw = alignment(w, in, (int64_t)out * in);
    for (int i = 0; i < HL_MAX_GEMMS; i++) {
        kc_hgemm *g = &s->gemms[i];
        if (g->valid && g->n == n && g->nh == nh && g->in == in && g->out == out && g->x_tok == x_tok &&
            g->x_head == x_head && g->y_tok == y_tok && g->y_head == y_head && g->align_x == ax &&
            g->align_y == ay && g->align_w == aw) {
            g->last_use = ++s->tick;
            return g->valid == 1 ? g : NULL;
        }
    }
    if (b->capturing) return NULL;  // a new shape while recording: the kernel (no host work)
    kc_hgemm *g = NULL;
    for (int i = 0; i < HL_MAX_GEMMS && !g; i++)
        if (!s->gemms[i].valid) g = &s->gemms[i];
    if (!g) {
        g = &s->gemms[0];
        for (int i = 1; i < HL_MAX_GEMMS; i++)
            if (s->gemms[i].last_use < g->last_use) g = &s->gemms[i];
    }
    hgemm_destroy(g);
    memset(g, 0, sizeof *g);
    g->n = n;
    g->nh = nh;
    g->in = in;
    g->out = out;
    g->x_tok = x_tok;
    g->x_head = x_head;
    g->y_tok = y_tok;
    g->y_head = y_head;
    g->align_x = ax;
    g->align_y = ay;
    g->align_w = aw;
    g->last_use = ++s->tick;
    g->valid = 2;
    // Column-major view of head h: C [out x n] (ld y_tok) = W_h^T' [out x in] * X_h [in x n]
    // (ld x_tok); W_h is a column-major [in x out] matrix read transposed.
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t batch = nh;
    const int64_t sa = (int64_t)out * in, sb = x_head, sc = y_head;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    bool ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, in, out, in) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, in, n, x_tok) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, out, n, y_tok) == CUBLAS_STATUS_SUCCESS;
    const cublasLtMatrixLayout_t lay[3] = {la, lb, lc};
    const int64_t strides[3] = {sa, sb, sc};
    for (int i = 0; ok && i < 3; i++)
        ok = cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch) ==
                 CUBLAS_STATUS_SUCCESS &&
             cublasLtMatrixLayoutSetAttribute(lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                              sizeof strides[i]) == CUBLAS_STATUS_SUCCESS;
    if (ok) ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
        const size_t ws = b->lt_ws_bytes;
        const uint32_t al[4] = {aw, ax, ay, ay};
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], sizeof al[3]);
        ok = cublasLtMatmulAlgoGetHeuristic(b->lt, op, la, lb, lc, lc, pref, 1, &res, &nres) == CUBLAS_STATUS_SUCCESS &&
             nres > 0;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (lc) cublasLtMatrixLayoutDestroy(lc);
        if (op) cublasLtMatmulDescDestroy(op);
        return NULL;  // valid == 2: the kernel from now on
    }
    g->op = op;
    g->a = la;
    g->b = lb;
    g->c = lc;
    g->algo = res.algo;
    g->valid = 1;
    return g;
}

void kc_op_head_linear(kaon_backend *be, const void *x_, int n, int nh, size_t x_tok, size_t x_head,
                       const kaon_linear *l, void *y_, size_t y_tok, size_t y_head) {
    kc_backend *b = kc(be);
    if (n <= 0) return;
    const char *why = l ? kaon_linear_unsupported(l) : NULL;
    if (why || (l && l->bias.data)) {
        kc_fail(b, "cuda head_linear: %s is not supported", why ? why : "a bias");
        return;
    }
    const kaon_tensor *w = l ? &l->w : NULL;
    if (!x_ || !y_ || !w || !w->data || w->ndim != 2 || nh <= 0 || w->shape[0] % nh || w->shape[1] <= 0 ||
        w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX || x_tok > (size_t)INT64_MAX || y_tok > (size_t)INT64_MAX) {
        kc_fail(b, "cuda head_linear: bad arguments (%d heads, weight of %lld rows)", nh,
                w ? (long long)w->shape[0] : -1LL);
        return;
    }
    const int out = (int)(w->shape[0] / nh), in = (int)w->shape[1];
    const bf16 *x = (const bf16 *)x_, *wd = (const bf16 *)w->data;
    bf16 *y = (bf16 *)y_;
    if (w->dtype != KAON_BF16) {  // a quantized GGUF matrix: dequantized into the scratch
        kc_mla *s = mla_state(b);
        if (!s) return;
        const size_t need = (size_t)w->shape[0] * (size_t)in;
        if (kc_grow(b, (void **)&s->wdeq, &s->wdeq_cap, need, sizeof(bf16), "head_linear weights")) return;
        const int rc = kc_quant_dequant(b, w, s->wdeq);
        if (rc == 1) {
            kc_fail(b, "cuda head_linear: the weight must be an uploaded bf16 or quantized matrix (got %s)",
                    kaon_dtype_name(w->dtype));
            return;
        }
        if (rc) return;
        wd = s->wdeq;
    }
    const int64_t xt = (int64_t)x_tok, xh = (int64_t)x_head, yt = (int64_t)y_tok, yh = (int64_t)y_head;
    if (n > HL_NB && xt >= in && yt >= out) {
        kc_hgemm *g = hgemm_get(b, n, nh, in, out, x, xt, xh, wd, y, yt, yh);
        if (b->err) return;
        if (g) {
            const float alpha = 1.f, beta = 0.f;
            const cublasStatus_t st = cublasLtMatmul(b->lt, g->op, &alpha, wd, g->a, x, g->b, &beta, y, g->c, y, g->c,
                                                     &g->algo, b->lt_ws, b->lt_ws_bytes, b->stream);
            if (st != CUBLAS_STATUS_SUCCESS)
                kc_fail(b, "cuBLASLt head_linear %d heads x %d x %d x %d failed (status %d)", nh, out, n, in, (int)st);
            return;
        }
    }
    head_gemv(b, x, n, nh, xt, xh, wd, out, in, y, yt, yh);
}

// ---- mla_attention: shared pieces --------------------------------------------------------------------

// Token t's key range for split z of S (min_keys per range at least): returns the ranges in use
// (n_act >= 1; keys [*k0, *k1)), and whether the token is real (ok; else it gets zeros).
static __device__ __forceinline__ int mla_range(const int32_t *pos, const int32_t *seq, int t, int n_seqs,
                                                int max_blocks, int bs, int S, int min_keys, int z, int *k0, int *k1,
                                                int *sq_out) {
    const int p = ld_meta(pos + t), sq = ld_meta(seq + t);  // (readable before the PDL wait)
    const bool ok = p >= 0 && sq >= 0 && sq < n_seqs && p / bs < max_blocks;
    const int len = ok ? p + 1 : 0;
    int n_act = (len + min_keys - 1) / min_keys;
    n_act = n_act < 1 ? 1 : (n_act > S ? S : n_act);
    const int chunk = (len + n_act - 1) / n_act;
    *k0 = min(len, z * chunk);
    *k1 = min(len, *k0 + chunk);
    *sq_out = ok ? sq : 0;
    return n_act;
}

// Key kk's cache slot in two steps, so a kernel can request the block-table entry early and
// turn it into a slot later: the entry (-1 past the range) ...
static __device__ __forceinline__ int mla_entry(const int32_t *bt, int kk, int k1, int bs) {
    return kk < k1 ? bt[kk / bs] : -1;
}
// ... and the slot it gives (-1: none).
static __device__ __forceinline__ int mla_slot_of(int blk, int kk, int k1, int bs, int64_t n_slots) {
    const int64_t s = (int64_t)blk * bs + kk % bs;
    return kk < k1 && blk >= 0 && s < n_slots ? (int)s : -1;
}
static __device__ __forceinline__ int mla_slot(const int32_t *bt, int kk, int k1, int bs, int64_t n_slots) {
    return mla_slot_of(mla_entry(bt, kk, k1, bs), kk, k1, bs, n_slots);
}

// One CTA per (token, head, 128 output dims): out = sum_z w_z O_z with w_z = exp2(m_z - M) /
// sum_z exp2(m_z - M) l_z over the ranges the token used (tokens that used one range were
// written directly). The ranges are split over MM_ZG thread groups, each loading float4s of its
// share with no dependence between loads (at batch 1 a token has up to MLA_MAX_SPLITS ranges: a
// serial sum over them is L2-latency bound), then summed in shared memory in a fixed order.
#define MM_DIMS 128
#define MM_ZG 8
__global__ void __launch_bounds__(MM_ZG * MM_DIMS / 4)
k_mla_merge(const int32_t *__restrict__ pos, const int32_t *__restrict__ seq, int n_seqs, int max_blocks, int bs,
            int nh, int kvl, int S, int min_keys, const float *__restrict__ part, bf16 *__restrict__ out) {
    __shared__ float w_s[MLA_MAX_SPLITS];
    __shared__ float4 red_s[MM_ZG][MM_DIMS / 4];
    kc_pdl_trigger();
    kc_pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int k0, k1, sq;
    const int n_act = mla_range(pos, seq, t, n_seqs, max_blocks, bs, S, min_keys, 0, &k0, &k1, &sq);
    if (n_act <= 1) return;
    const size_t stride = (size_t)kvl + 2;
    const float *pb = part + ((size_t)t * nh + h) * S * stride;
    if (tid < 32) {  // one warp: the ranges' weights, MLA_MAX_SPLITS / 32 per lane
        const int lane = tid;
        constexpr int PER = MLA_MAX_SPLITS / 32;
        float m[PER], M = -INFINITY;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int z = lane + 32 * i;
            m[i] = z < n_act ? __ldcg(pb + z * stride + kvl) : -INFINITY;
            M = fmaxf(M, m[i]);
        }
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        float L = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int z = lane + 32 * i;
            m[i] = m[i] == -INFINITY ? 0.f : exp2f(m[i] - M);  // now the range's factor
            L += z < n_act ? m[i] * __ldcg(pb + z * stride + kvl + 1) : 0.f;
        }
        for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
        const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) w_s[lane + 32 * i] = m[i] * inv;
    }
    __syncthreads();
    // Thread (zg, c): dims d0 + 4c .. + 3 (float4; kvl % 8 == 0, the row stride kvl + 2 is even
    // but not a multiple of 4 floats: float2 loads), ranges z = zg, zg + MM_ZG, ...
    const int c = tid % (MM_DIMS / 4), zg = tid / (MM_DIMS / 4);
    const int d = blockIdx.z * MM_DIMS + 4 * c;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (d < kvl) {
#pragma unroll 4
        for (int z = zg; z < n_act; z += MM_ZG) {
            const float w = w_s[z];
            const float2 lo = __ldcg((const float2 *)(pb + z * stride + d));
            const float2 hi = __ldcg((const float2 *)(pb + z * stride + d + 2));
            a.x = fmaf(w, lo.x, a.x);
            a.y = fmaf(w, lo.y, a.y);
            a.z = fmaf(w, hi.x, a.z);
            a.w = fmaf(w, hi.y, a.w);
        }
    }
    red_s[zg][c] = a;
    __syncthreads();
    if (zg == 0 && d < kvl) {
#pragma unroll
        for (int g = 1; g < MM_ZG; g++) {
            const float4 v = red_s[g][c];
            a.x += v.x;
            a.y += v.y;
            a.z += v.z;
            a.w += v.w;
        }
        bf16 *o = out + ((size_t)t * nh + h) * kvl + d;
        *(__nv_bfloat162 *)o = __floats2bfloat162_rn(a.x, a.y);
        *(__nv_bfloat162 *)(o + 2) = __floats2bfloat162_rn(a.z, a.w);
    }
}

// ---- mla_attention: tensor-core kernel (kv_lora 512, rope 64) -----------------------------------------

static __device__ __forceinline__ void ldsm4(unsigned r[4], const bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
static __device__ __forceinline__ void ldsm4t(unsigned r[4], const bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// c [16 x 8] f32 += a [16 x 16] bf16 (row) * b [16 x 8] bf16 (col).
static __device__ __forceinline__ void mma16816(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void cp16(void *smem, const void *gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0;  // 0: zero-fill
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
static __device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The geometry of k_mla_tc<MT>: HB = 16 MT heads per CTA, DS = 8 / MT warps per m-tile of 16
// heads, KT keys per tile.
template <int MT>
struct MlaTC {
    static constexpr int HB = 16 * MT, DS = 8 / MT;
    static constexpr int KT = MT == 4 ? 32 : 64;
    static constexpr int KW = KT / DS;   // keys per warp in S (a multiple of 8)
    static constexpr int NQ = KW / 8;    // n-tiles per warp in S
    static constexpr int DW = MLA_L / DS;  // output dims per warp in P V
    static constexpr int NV = DW / 8;    // n-tiles per warp in P V (even)
    static constexpr int PLD = KT + 8;   // P's shared row stride (bf16)
    static constexpr size_t SMEM = sizeof(bf16) * ((size_t)HB * MLA_LD + 2 * (size_t)KT * MLA_LD + (size_t)HB * PLD) +
                                   sizeof(float) * 8 * 16 + sizeof(int) * 2 * KT;
};

// grid (tokens, nh / HB, S); 256 threads; dynamic shared memory MlaTC<MT>::SMEM.
template <int MT>
__global__ void __launch_bounds__(MLA_THREADS, 1)
k_mla_tc(const bf16 *__restrict__ q, const bf16 *__restrict__ cache, const int32_t *__restrict__ pos,
         const int32_t *__restrict__ seq, const int32_t *__restrict__ tables, int n_seqs, int max_blocks, int bs,
         int64_t n_slots, int nh, float qscale, int min_keys, int prefetch, bf16 *__restrict__ out,
         float *__restrict__ part) {
    typedef MlaTC<MT> C;
    constexpr int HB = C::HB, DS = C::DS, KT = C::KT, KW = C::KW, NQ = C::NQ, DW = C::DW, NV = C::NV,
                  PLD = C::PLD;
    static_assert(KW % 8 == 0 && NV % 2 == 0 && KT % 16 == 0, "tile shapes");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *q_s = (bf16 *)smem_raw;            // [HB][MLA_LD]
    bf16 *k_s = q_s + HB * MLA_LD;           // [2][KT][MLA_LD]
    bf16 *p_s = k_s + 2 * KT * MLA_LD;       // [HB][PLD] probabilities of the tile
    float *red = (float *)(p_s + HB * PLD);  // [8 warps][16 rows]
    int *slot_s = (int *)(red + 8 * 16);     // [2][KT]
    kc_pdl_trigger();

    const int t = blockIdx.x, h0 = blockIdx.y * HB, z = blockIdx.z, S = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int mt = warp / DS, ds = warp % DS, g = lane >> 2, tg = lane & 3;
    int k0, k1, sq;
    const int n_act = mla_range(pos, seq, t, n_seqs, max_blocks, bs, S, min_keys, z, &k0, &k1, &sq);
    const int32_t *bt = tables + (size_t)sq * max_blocks;
    // A few tokens (batch-1 decode): the range's latent rows are pulled into L2 while the kernels
    // before finish (the row this step writes may arrive stale; the tiles below read it again
    // after the wait, and L2 is coherent).
    if (prefetch && z < n_act)
        for (int kk = k0 + tid; kk < k1; kk += MLA_THREADS) {
            const int blk = ld_meta(bt + kk / bs);
            const int64_t s64 = (int64_t)blk * bs + kk % bs;
            if (blk < 0 || s64 >= n_slots) continue;
#pragma unroll
            for (int o = 0; o < MLA_D * (int)sizeof(bf16); o += 128)
                prefetch_l2((const char *)(cache + (size_t)s64 * MLA_D) + o);
        }
    kc_pdl_wait();  // every block waits, also an idle range (kc_pdl_wait's rule)
    if (z >= n_act) return;
    const int ntiles = (k1 - k0 + KT - 1) / KT;

    auto load_tile = [&](int buf) {
        bf16 *dst = k_s + buf * KT * MLA_LD;
        const int *sl = slot_s + buf * KT;
        for (int c = tid; c < KT * (MLA_D / 8); c += MLA_THREADS) {
            const int r = c / (MLA_D / 8), ch = c - r * (MLA_D / 8);
            const int s = sl[r];
            cp16(dst + r * MLA_LD + ch * 8, cache + (size_t)(s >= 0 ? s : 0) * MLA_D + ch * 8, s >= 0);
        }
    };
    // Thread tid < KT looks up key tid of each tile; the block-table entry of tile it + 2 is
    // requested during tile it and turned into a slot only when tile it + 1 is loaded, so the
    // lookup's latency stays off the loop's path (it held every tile's loads back: the slots
    // are written, then a barrier, then the copies).
    auto entry = [&](int tile) { return mla_entry(bt, k0 + tile * KT + tid, k1, bs); };
    auto slot_of = [&](int tile, int blk) { return mla_slot_of(blk, k0 + tile * KT + tid, k1, bs, n_slots); };
    int next_blk = -1;
    if (tid < KT) {
        slot_s[tid] = slot_of(0, entry(0));
        if (ntiles > 1) next_blk = entry(1);
    }
    __syncthreads();
    {  // Q of the head block and the first tile: one group
        const bf16 *qt = q + ((size_t)t * nh + h0) * MLA_D;
        for (int c = tid; c < HB * (MLA_D / 8); c += MLA_THREADS) {
            const int r = c / (MLA_D / 8), ch = c - r * (MLA_D / 8);
            cp16(q_s + r * MLA_LD + ch * 8, qt + (size_t)r * MLA_D + ch * 8, true);
        }
        if (ntiles > 0) load_tile(0);
        cp_commit();
    }

    // This thread's rows of its m-tile: g and g + 8 (lo, hi). O [16 x DW] of the warp.
    float o[NV][4];
#pragma unroll
    for (int n = 0; n < NV; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // l: this thread's keys only
    const bf16 *qa = q_s + (mt * 16 + (lane & 15)) * MLA_LD + (lane >> 4) * 8;

    for (int it = 0; it < ntiles; it++) {
        const int cur = it & 1;
        if (it + 1 < ntiles) {
            if (tid < KT) {
                slot_s[(cur ^ 1) * KT + tid] = slot_of(it + 1, next_blk);
                if (it + 2 < ntiles) next_blk = entry(it + 2);
            }
            __syncthreads();
            load_tile(cur ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const bf16 *kt_s = k_s + cur * KT * MLA_LD;
        const int *sl = slot_s + cur * KT;

        // S [16 x KW] = Q_mt K^T over the warp's keys ds * KW ...
        // Four accumulators per n-tile (16-wide k steps round-robin): at 16 heads a warp has
        // one n-tile, and a chain of dependent mma is the tile's critical path (9 in each of
        // four chains; two chains of 18 were 3% slower at 16 heads, batch 64).
        float sc[NQ][4], sc2[NQ][4], sc3[NQ][4], sc4[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[j][e] = sc2[j][e] = sc3[j][e] = sc4[j][e] = 0.f;
        const bf16 *kb = kt_s + (ds * KW + (lane & 7)) * MLA_LD + (lane >> 3) * 8;
        for (int kk = 0; kk < MLA_D; kk += 64) {
            unsigned a0[4], a1[4], a2[4], a3[4];
            ldsm4(a0, qa + kk);
            ldsm4(a1, qa + kk + 16);
            ldsm4(a2, qa + kk + 32);
            ldsm4(a3, qa + kk + 48);
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                unsigned bb[4], bc[4];
                ldsm4(bb, kb + j * 8 * MLA_LD + kk);
                ldsm4(bc, kb + j * 8 * MLA_LD + kk + 32);
                mma16816(sc[j], a0, bb[0], bb[1]);
                mma16816(sc2[j], a1, bb[2], bb[3]);
                mma16816(sc3[j], a2, bc[0], bc[1]);
                mma16816(sc4[j], a3, bc[2], bc[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[j][e] = (sc[j][e] + sc2[j][e]) + (sc3[j][e] + sc4[j][e]);
        // Scale (log2 units), mask keys without a slot, row maxima over the warp's keys.
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int j = 0; j < NQ; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const bool valid = sl[ds * KW + j * 8 + 2 * tg + e] >= 0;
                sc[j][e] = valid ? sc[j][e] * qscale : -INFINITY;
                sc[j][2 + e] = valid ? sc[j][2 + e] * qscale : -INFINITY;
                mx_lo = fmaxf(mx_lo, sc[j][e]);
                mx_hi = fmaxf(mx_hi, sc[j][2 + e]);
            }
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
        if (tg == 0) {
            red[warp * 16 + g] = mx_lo;
            red[warp * 16 + g + 8] = mx_hi;
        }
        __syncthreads();
        // The tile's maxima over the m-tile's warps: every warp of the m-tile computes the same
        // running max, so their partial O and l share one scale.
        float tm_lo = -INFINITY, tm_hi = -INFINITY;
#pragma unroll
        for (int d = 0; d < DS; d++) {
            tm_lo = fmaxf(tm_lo, red[(mt * DS + d) * 16 + g]);
            tm_hi = fmaxf(tm_hi, red[(mt * DS + d) * 16 + g + 8]);
        }
        const float mn_lo = fmaxf(m_lo, tm_lo), mn_hi = fmaxf(m_hi, tm_hi);
        const float al_lo = m_lo == -INFINITY ? 0.f : exp2f(m_lo - mn_lo);
        const float al_hi = m_hi == -INFINITY ? 0.f : exp2f(m_hi - mn_hi);
        m_lo = mn_lo;
        m_hi = mn_hi;
        float ps_lo = 0.f, ps_hi = 0.f;
        bf16 *pr_lo = p_s + (mt * 16 + g) * PLD + ds * KW + 2 * tg, *pr_hi = pr_lo + 8 * PLD;
#pragma unroll
        for (int j = 0; j < NQ; j++) {
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) pv[e] = sc[j][e] == -INFINITY ? 0.f : exp2f(sc[j][e] - (e < 2 ? mn_lo : mn_hi));
            ps_lo += pv[0] + pv[1];
            ps_hi += pv[2] + pv[3];
            *(__nv_bfloat162 *)(pr_lo + j * 8) = __floats2bfloat162_rn(pv[0], pv[1]);
            *(__nv_bfloat162 *)(pr_hi + j * 8) = __floats2bfloat162_rn(pv[2], pv[3]);
        }
        l_lo = l_lo * al_lo + ps_lo;
        l_hi = l_hi * al_hi + ps_hi;
#pragma unroll
        for (int n = 0; n < NV; n++) {
            o[n][0] *= al_lo;
            o[n][1] *= al_lo;
            o[n][2] *= al_hi;
            o[n][3] *= al_hi;
        }
        __syncthreads();  // P complete

        // O [16 x DW] += P [16 x KT] V [KT x DW], V = the tile's columns ds * DW ...
        const bf16 *pa = p_s + (mt * 16 + (lane & 15)) * PLD + (lane >> 4) * 8;
        const bf16 *vb = kt_s + ((lane & 7) + ((lane >> 3) & 1) * 8) * MLA_LD + ds * DW + (lane >> 4) * 8;
#pragma unroll
        for (int kk = 0; kk < KT; kk += 16) {
            unsigned a[4];
            ldsm4(a, pa + kk);
#pragma unroll
            for (int n2 = 0; n2 < NV / 2; n2++) {
                unsigned bb[4];
                ldsm4t(bb, vb + kk * MLA_LD + n2 * 16);
                mma16816(o[2 * n2], a, bb[0], bb[1]);
                mma16816(o[2 * n2 + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads();  // the tile's buffers may be refilled
    }
    cp_wait<0>();  // (no tile: Q's copies still land before the CTA ends)

    // l over the row's 4 lanes, then over the m-tile's warps.
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
    if (tg == 0) {
        red[warp * 16 + g] = l_lo;
        red[warp * 16 + g + 8] = l_hi;
    }
    __syncthreads();
    float L_lo = 0.f, L_hi = 0.f;
#pragma unroll
    for (int d = 0; d < DS; d++) {
        L_lo += red[(mt * DS + d) * 16 + g];
        L_hi += red[(mt * DS + d) * 16 + g + 8];
    }
    const int h_lo = h0 + mt * 16 + g, h_hi = h_lo + 8;
    const int d0 = ds * DW + 2 * tg;
    if (n_act == 1) {
        const float i_lo = L_lo > 0.f ? 1.f / L_lo : 0.f, i_hi = L_hi > 0.f ? 1.f / L_hi : 0.f;
        bf16 *ol = out + ((size_t)t * nh + h_lo) * MLA_L + d0, *oh = out + ((size_t)t * nh + h_hi) * MLA_L + d0;
#pragma unroll
        for (int n = 0; n < NV; n++) {
            *(__nv_bfloat162 *)(ol + n * 8) = __floats2bfloat162_rn(o[n][0] * i_lo, o[n][1] * i_lo);
            *(__nv_bfloat162 *)(oh + n * 8) = __floats2bfloat162_rn(o[n][2] * i_hi, o[n][3] * i_hi);
        }
        return;
    }
    // Range z's partial: [t, head, z, 512 + 2] = O (unnormalised), max, sum.
    const size_t stride = MLA_L + 2;
    float *pl = part + (((size_t)t * nh + h_lo) * S + z) * stride, *ph = part + (((size_t)t * nh + h_hi) * S + z) * stride;
#pragma unroll
    for (int n = 0; n < NV; n++) {
        *(float2 *)(pl + d0 + n * 8) = make_float2(o[n][0], o[n][1]);
        *(float2 *)(ph + d0 + n * 8) = make_float2(o[n][2], o[n][3]);
    }
    if (ds == 0 && tg == 0) {
        pl[MLA_L] = m_lo;
        pl[MLA_L + 1] = L_lo;
        ph[MLA_L] = m_hi;
        ph[MLA_L + 1] = L_hi;
    }
}

// ---- mla_attention: generic kernel (CUDA cores, any widths) -------------------------------------------

// K tile rows in shared memory are kld bf16 apart: kld / 2 odd, so the 32 keys a warp scores
// at once sit in 32 different banks.
static int mg_kld(int D) { return (D / 2) % 2 ? D : D + 2; }

static size_t mg_smem(int gh, int D, int kvl) {
    return sizeof(float) * ((size_t)gh * D + (size_t)gh * kvl + (size_t)gh * MG_KT + 3 * (size_t)gh) +
           sizeof(int) * MG_KT + sizeof(bf16) * (size_t)MG_KT * mg_kld(D) + 16;
}

// grid (tokens, ceil(nh / gh), S); MG_THREADS threads; dynamic shared memory mg_smem.
__global__ void __launch_bounds__(MG_THREADS)
k_mla_generic(const bf16 *__restrict__ q, const bf16 *__restrict__ cache, const int32_t *__restrict__ pos,
              const int32_t *__restrict__ seq, const int32_t *__restrict__ tables, int n_seqs, int max_blocks, int bs,
              int64_t n_slots, int nh, int kvl, int D, int gh, float qscale, int min_keys, bf16 *__restrict__ out,
              float *__restrict__ part) {
    extern __shared__ __align__(16) float smg[];
    const int kld = (D / 2) % 2 ? D : D + 2;
    float *q_s = smg;                    // [gh][D], scaled to log2 units
    float *acc = q_s + gh * D;           // [gh][kvl]
    float *p_s = acc + gh * kvl;         // [gh][KT]
    float *m_s = p_s + gh * MG_KT, *l_s = m_s + gh, *a_s = l_s + gh;
    int *slot_s = (int *)(a_s + gh);     // [KT]
    bf16 *k_s = (bf16 *)(slot_s + MG_KT);  // [KT][kld]
    kc_pdl_trigger();
    kc_pdl_wait();
    const int t = blockIdx.x, h0 = blockIdx.y * gh, z = blockIdx.z, S = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nhb = min(gh, nh - h0);
    int k0, k1, sq;
    const int n_act = mla_range(pos, seq, t, n_seqs, max_blocks, bs, S, min_keys, z, &k0, &k1, &sq);
    if (z >= n_act) return;
    const int32_t *bt = tables + (size_t)sq * max_blocks;
    const bf16 *qt = q + ((size_t)t * nh + h0) * D;
    for (int i = tid; i < nhb * D; i += MG_THREADS) q_s[i] = bfl(qt[i]) * qscale;
    for (int i = tid; i < nhb * kvl; i += MG_THREADS) acc[i] = 0.f;
    if (tid < nhb) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.f;
    }
    for (int base = k0; base < k1; base += MG_KT) {
        if (tid < MG_KT) slot_s[tid] = mla_slot(bt, base + tid, k1, bs, n_slots);
        __syncthreads();
        for (int i = tid; i < MG_KT * D; i += MG_THREADS) {
            const int r = i / D, d = i - r * D;
            const int s = slot_s[r];
            k_s[r * kld + d] = s >= 0 ? cache[(size_t)s * D + d] : __float2bfloat16(0.f);
        }
        __syncthreads();
        for (int i = tid; i < nhb * MG_KT; i += MG_THREADS) {
            const int h = i / MG_KT, j = i - h * MG_KT;
            float s = -INFINITY;
            if (slot_s[j] >= 0) {
                const float *qh = q_s + h * D;
                const bf16 *kr = k_s + j * kld;
                s = 0.f;
                for (int d = 0; d < D; d++) s = fmaf(qh[d], bfl(kr[d]), s);
            }
            p_s[i] = s;
        }
        __syncthreads();
        for (int h = warp; h < nhb; h += MG_THREADS / 32) {  // online softmax: a warp per head
            const float v = p_s[h * MG_KT + lane];
            float mx = v;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mold = m_s[h], mn = fmaxf(mold, mx);
            const float p = v == -INFINITY ? 0.f : exp2f(v - mn);
            float sum = p;
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            p_s[h * MG_KT + lane] = p;
            __syncwarp();
            if (lane == 0) {
                const float al = mold == -INFINITY ? 0.f : exp2f(mold - mn);
                a_s[h] = al;
                l_s[h] = l_s[h] * al + sum;
                m_s[h] = mn;
            }
        }
        __syncthreads();
        for (int i = tid; i < nhb * kvl; i += MG_THREADS) {
            const int h = i / kvl, d = i - h * kvl;
            const float *ph = p_s + h * MG_KT;
            float a = acc[i] * a_s[h];
            for (int j = 0; j < MG_KT; j++) a = fmaf(ph[j], bfl(k_s[j * kld + d]), a);
            acc[i] = a;
        }
        __syncthreads();
    }
    __syncthreads();
    if (n_act == 1) {
        for (int i = tid; i < nhb * kvl; i += MG_THREADS) {
            const int h = i / kvl, d = i - h * kvl;
            const float L = l_s[h];
            out[((size_t)t * nh + h0 + h) * kvl + d] = __float2bfloat16(L > 0.f ? acc[i] / L : 0.f);
        }
        return;
    }
    const size_t stride = (size_t)kvl + 2;
    for (int i = tid; i < nhb * kvl; i += MG_THREADS) {
        const int h = i / kvl, d = i - h * kvl;
        part[(((size_t)t * nh + h0 + h) * S + z) * stride + d] = acc[i];
    }
    if (tid < nhb) {
        float *pp = part + (((size_t)t * nh + h0 + tid) * S + z) * stride;
        pp[kvl] = m_s[tid];
        pp[kvl + 1] = l_s[tid];
    }
}

// ---- mla_attention: the op ---------------------------------------------------------------------------

template <int MT>
static int launch_tc(kc_backend *b, int T, int S, const bf16 *q, const bf16 *cache, const int32_t *pos,
                     const int32_t *seq, const int32_t *tab, const kaon_attn_meta *m, int64_t n_slots, int nh,
                     float qscale, int min_keys, bf16 *out) {
    typedef MlaTC<MT> C;
    if (smem_optin(b, (const void *)k_mla_tc<MT>, MT, C::SMEM)) return -1;
    const dim3 grid((unsigned)T, (unsigned)(nh / C::HB), (unsigned)S);
    // L2 prefetch before the PDL wait for launches of a few tokens (KAON_MLA_PREFETCH=0: off, for A/B).
    static const int pf_env = getenv("KAON_MLA_PREFETCH") ? atoi(getenv("KAON_MLA_PREFETCH")) : 1;
    const int prefetch = T <= 4 && pf_env != 0;
    kc_launch(b, k_mla_tc<MT>, grid, dim3(MLA_THREADS), C::SMEM, q, cache, pos, seq, tab, m->n_seqs, m->max_blocks,
              m->block_size, n_slots, nh, qscale, min_keys, prefetch, out, b->attn_part);
    return kc_launched(b, "mla attention");
}

void kc_op_mla_attention(kaon_backend *be, const void *q_, const kaon_kv_layer *kv, const kaon_attn_meta *m, int nh,
                         int kvl, int rd, float scale, void *out_) {
    kc_backend *b = kc(be);
    if (!q_ || !kv || !kv->k || !m || !out_ || nh <= 0 || kvl <= 0 || kvl % 8 || rd < 0 || rd % 2) {
        kc_fail(b, "cuda mla_attention: bad arguments (heads %d, latent %d, rope %d)", nh, kvl, rd);
        return;
    }
    const int T = m->n_tokens;
    if (T <= 0) return;
    if (m->n_seqs <= 0 || m->max_blocks <= 0 || m->block_size <= 0) {
        kc_fail(b, "cuda mla_attention: bad metadata");
        return;
    }
    const int D = kvl + rd;
    const int32_t *d_pos = kc_dev_i32(b, m->positions, (size_t)T);
    const int32_t *d_seq = kc_dev_i32(b, m->token_seq, (size_t)T);
    const int32_t *d_tab = kc_dev_i32(b, m->block_tables, (size_t)m->n_seqs * m->max_blocks);
    if (!d_pos || !d_seq || !d_tab) return;
    const size_t bytes = alloc_bytes(b, kv->k);
    const int64_t n_slots = bytes ? (int64_t)(bytes / ((size_t)D * sizeof(bf16))) : INT64_MAX;
    const bf16 *q = (const bf16 *)q_, *cache = (const bf16 *)kv->k;
    bf16 *out = (bf16 *)out_;
    const float qscale = scale * 1.4426950408889634f;  // scores in log2 units
    static const char *gen_env = getenv("KAON_MLA_GENERIC");
    const bool fast = !(gen_env && !strcmp(gen_env, "1")) && kvl == MLA_L && rd == MLA_D - MLA_L && nh % 16 == 0 &&
                      al16(q) && al16(cache) && ((uintptr_t)out & 3) == 0;
    int MT = 1, HB = 16, min_keys = 0, gh = 0, n_hb;
    size_t gsmem = 0;
    if (fast) {
        MT = nh % 64 == 0 ? 4 : nh % 32 == 0 ? 2 : 1;
        HB = 16 * MT;
        // Keys per range at least (one tile). KAON_MLA_MIN_KEYS (8..1024) for experiments: 16
        // (short contexts over more CTAs, each loading part of a tile) measured no faster on
        // V2-Lite at batch 1 (375.6 vs 383.3 tok/s; the kernel's 6.5 us there is not the tile's load).
        static const int mk_env = getenv("KAON_MLA_MIN_KEYS") ? atoi(getenv("KAON_MLA_MIN_KEYS")) : 0;
        const int tile = MT == 4 ? MlaTC<4>::KT : MT == 2 ? MlaTC<2>::KT : MlaTC<1>::KT;
        min_keys = mk_env >= 8 && mk_env <= 1024 ? mk_env : tile;
        n_hb = nh / HB;
    } else {
        kc_mla *s = mla_state(b);
        if (!s) return;
        gh = nh < MG_MAX_HEADS ? nh : MG_MAX_HEADS;
        while (gh > 1 && mg_smem(gh, D, kvl) > (size_t)s->smem_max) gh--;
        gsmem = mg_smem(gh, D, kvl);
        min_keys = 64;
        n_hb = (nh + gh - 1) / gh;
    }
    // Ranges per token: about one wave of CTAs (the tensor-core kernel holds one CTA per SM, the
    // generic one several); each token uses as many as its length fills with min_keys.
    // Rounded down, so the CTAs fill whole waves (64 tokens x 16 heads: 2 ranges = 128 CTAs on
    // 132 SMs, where 3 would run 192 in two waves, the second a third full).
    const int64_t per_sm = fast ? 1 : 4;
    int64_t want = per_sm * b->n_sm / ((int64_t)T * n_hb);
    int S = want > MLA_MAX_SPLITS ? MLA_MAX_SPLITS : (int)want;
    if (S < 1) S = 1;
    if (S > 1 && kc_grow(b, (void **)&b->attn_part, &b->attn_part_cap, (size_t)T * nh * S * ((size_t)kvl + 2),
                         sizeof(float), "mla partials"))
        return;
    if (fast) {
        int rc;
        if (MT == 4) rc = launch_tc<4>(b, T, S, q, cache, d_pos, d_seq, d_tab, m, n_slots, nh, qscale, min_keys, out);
        else if (MT == 2) rc = launch_tc<2>(b, T, S, q, cache, d_pos, d_seq, d_tab, m, n_slots, nh, qscale, min_keys, out);
        else rc = launch_tc<1>(b, T, S, q, cache, d_pos, d_seq, d_tab, m, n_slots, nh, qscale, min_keys, out);
        if (rc) return;
    } else {
        if (smem_optin(b, (const void *)k_mla_generic, 8, gsmem)) return;
        const dim3 grid((unsigned)T, (unsigned)n_hb, (unsigned)S);
        kc_launch(b, k_mla_generic, grid, dim3(MG_THREADS), gsmem, q, cache, d_pos, d_seq, d_tab, m->n_seqs,
                  m->max_blocks, m->block_size, n_slots, nh, kvl, D, gh, qscale, min_keys, out, b->attn_part);
        if (kc_launched(b, "mla attention (generic)")) return;
    }
    if (S > 1) {
        kc_launch(b, k_mla_merge, dim3((unsigned)T, (unsigned)nh, (unsigned)((kvl + MM_DIMS - 1) / MM_DIMS)),
                  dim3(MM_ZG * MM_DIMS / 4), 0, d_pos, d_seq, m->n_seqs,
                  m->max_blocks, m->block_size, nh, kvl, S, min_keys, (const float *)b->attn_part, out);
        kc_launched(b, "mla merge");
    }
}
