// FP8 e4m3 layers with f32 scales on the GPU (FORMATS-2.md §4-5): W8A8 on the tensor cores.
//
// Device copy (kc_fp8_upload, one allocation): the e4m3 codes [out, in] as stored, then the
// weight scales. BLOCK mode (DeepSeek, Qwen3-FP8: 128 x 128 blocks) keeps the checkpoint's grid
// [ceil(out/128), ceil(in/128)] row-major (cuBLASLt's BLK128x128 layout); ROWS mode (per-channel
// and per-tensor scales) holds one scale per output row (a tensor's scale repeated).
// Activations are quantized before every product the way the format's reference does
// (cpu_fp8.c has the formulas and their sources): BLOCK per token and group of 128 columns;
// ROWS per token (TOKEN), over the whole input (TENSOR) or by the checkpoint's input_scale
// (STATIC). Their scales: [in/128, n] for groups (cuBLASLt's VEC128 layout), [n] otherwise.
//
// n <= FP8_GEMV_MAX_N: k_fp8_gemv. Tensor cores (mma.sync m16n8k32 e4m3) with the weight rows
// as the M side: a warp tile is 16 rows x 8 tokens, the block's warps split K in chunks of 128
// columns and each chunk's sum is promoted to f32 with its scales (the FP8 MMA accumulator keeps
// fewer bits than f32, so long chains lose precision). K is permuted inside each 64-column
// half-chunk so every lane loads 16 contiguous bytes of a weight row and of a token; A and B
// use the same permutation, so the dot product is unchanged.
// Larger n: cuBLASLt's scaled FP8 matmul (BLK128x128 weights x VEC128 activations, or
// OUTER_VEC x OUTER_VEC), falling back to the GEMV kernel where cuBLASLt has no algorithm.
// Weight-only FP8 (a format without activation quantization): rows dequantized to a bf16
// scratch, then the bf16 GEMM.
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "util/log.h"
}

#define FP8_WARPS 8           // warps per GEMV block: they split K
#define FP8_STAGES 6          // ring slots of 2 KB per warp (cp.async pipeline depth)
#define FP8_RING_BYTES (FP8_WARPS * FP8_STAGES * 2048)
#define FP8_GEMV_MAX_N 64     // 8 tiles of 8 tokens; larger batches go to cuBLASLt
#define FP8_DEQ_CAP (64 << 20)  // elements of the bf16 scratch of weight-only layers
#define FP8_LT_CACHE 128  // a serving run's decode batches change size step by step: 4-5 shapes each

enum { MODE_BLOCK = 0, MODE_ROWS = 1 };

typedef struct fp8_gemm {
    int m, n, k, mode, f32out;
    int valid;  // 1: an algorithm; -1: cuBLASLt has none (remembered, so it is not asked every step)
    uint64_t last_use;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} fp8_gemm;

struct kc_fp8 {
    uint8_t *xq;  // quantized activations [n, in]
    size_t xq_cap;
    float *xs;    // their scales, then one float for the TENSOR mode's amax
    size_t xs_cap;
    bf16 *deq;    // weight-only layers: dequantized rows
    size_t deq_cap;
    bf16 *gu;     // large batches of gate/up: both outputs before SiLU-and-mul
    size_t gu_cap;
    float *xs_pad;  // a padded product's activation scales [in/128, n rounded up to 16]
    size_t xs_pad_cap;
    void *y_pad;    // and its output [n rounded up, out], of which the first n rows are kept
    size_t y_pad_cap;  // bytes (bf16 or f32 rows)
    int pad;        // KAON_FP8_PAD: 0 never pad (the GEMV takes such shapes), 1 where cuBLASLt has
                    // no algorithm for n (default), 2 ("force") every n > 64 not a multiple of 16 (tests)
    fp8_gemm lt[FP8_LT_CACHE];
    uint64_t tick;
    int gemv_max_n;  // KAON_FP8_GEMV_MAX_N
};

static kc_fp8 *fstate(kc_backend *b) {
    if (b->fp8) return b->fp8;
    kc_fp8 *s = (kc_fp8 *)calloc(1, sizeof *s);
    if (!s) {
        kc_fail(b, "cuda: out of host memory");
        return NULL;
    }
    const char *e = getenv("KAON_FP8_GEMV_MAX_N");
    s->gemv_max_n = e && *e ? atoi(e) : FP8_GEMV_MAX_N;
    if (s->gemv_max_n < 0) s->gemv_max_n = 0;
    if (s->gemv_max_n > FP8_GEMV_MAX_N) s->gemv_max_n = FP8_GEMV_MAX_N;
    const char *pe = getenv("KAON_FP8_PAD");
    s->pad = !pe || !*pe ? 1 : !strcmp(pe, "force") ? 2 : atoi(pe) != 0;
    b->fp8 = s;
    return s;
}

static void lt_destroy(fp8_gemm *g) {
    if (g->valid != 1) {
        g->valid = 0;
        return;
    }
    cublasLtMatrixLayoutDestroy(g->a);
    cublasLtMatrixLayoutDestroy(g->b);
    cublasLtMatrixLayoutDestroy(g->c);
    cublasLtMatmulDescDestroy(g->op);
    g->valid = 0;
}

void kc_fp8_destroy(kc_backend *b) {
    kc_fp8 *s = b->fp8;
    if (!s) return;
    for (int i = 0; i < FP8_LT_CACHE; i++) lt_destroy(&s->lt[i]);
    if (s->xq) cudaFree(s->xq);
    if (s->xs) cudaFree(s->xs);
    if (s->deq) cudaFree(s->deq);
    if (s->gu) cudaFree(s->gu);
    if (s->xs_pad) cudaFree(s->xs_pad);
    if (s->y_pad) cudaFree(s->y_pad);
    free(s);
    b->fp8 = NULL;
}

// ---- the layer's device layout ----------------------------------------------------------------

static int mode_of(const kaon_linear *l) {
    const int64_t M = l->w.shape[0], K = l->w.shape[1];
    if (l->scale_block[0] == 128 && l->scale_block[1] == 128) return MODE_BLOCK;
    if (l->scale_block[1] >= K && (l->scale_block[0] == 1 || l->scale_block[0] >= M)) return MODE_ROWS;
    return -1;
}

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

// Floats of the device scales.
static size_t scale_floats(const kaon_tensor *w, int mode) {
    const int64_t M = w->shape[0], K = w->shape[1];
    return mode == MODE_BLOCK ? (size_t)((M + 127) / 128) * (size_t)((K + 127) / 128) : (size_t)M;
}

size_t kc_fp8_bytes(const kaon_tensor *host) {
    // The scales are counted with their own tensor (weights.c); here the codes.
    return align256((size_t)kaon_tensor_numel(host));
}

// ---- upload -----------------------------------------------------------------------------------

// Dummy weights: e4m3 codes of uniform(-448, 448) values and scales a * (0.5 + u), a = 1/sqrt(K)/448
// (fp8_weights.c's host fill makes the same distribution).
static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static __device__ __forceinline__ float unit(uint64_t seed, size_t i) {  // [0, 1)
    return (float)((double)(mix64(seed + 0x9e3779b97f4a7c15ull * (i + 1)) >> 11) * 0x1.0p-53);
}

__global__ void k_fp8_dummy(uint8_t *codes, size_t n, float *s, size_t ns, float a, uint64_t seed) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        codes[i] = __nv_cvt_float_to_fp8((2.0f * unit(seed, i) - 1.0f) * 448.0f, __NV_SATFINITE, __NV_E4M3);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < ns; i += stride)
        s[i] = a * (0.5f + unit(seed ^ 0x5ca1e5ull, i));
}

int kc_fp8_upload(kc_backend *b, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev) {
    const kaon_tensor *w = &host->w, *sc = &host->scale;
    if (w->ndim != 2 || w->shape[0] <= 0 || w->shape[1] <= 0 || w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX)
        return kc_fail(b, "cuda upload: bad FP8 weight shape");
    const int64_t M = w->shape[0], K = w->shape[1];
    const int mode = mode_of(host);
    if (mode < 0)
        return kc_fail(b, "cuda upload: FP8 scale blocks of [%d, %d] are not supported (128 x 128, per channel, "
                          "per tensor are)", host->scale_block[0], host->scale_block[1]);
    if (K % 16)
        return kc_fail(b, "cuda upload: FP8 weights need a multiple of 16 columns (got %lld)", (long long)K);
    if (host->act_quant == KAON_ACTQ_GROUP && (mode != MODE_BLOCK || host->scale_block[1] != 128))
        return kc_fail(b, "cuda upload: FP8 activation groups must match 128 x 128 weight blocks");
    const int64_t sr = (M + host->scale_block[0] - 1) / host->scale_block[0];
    const int64_t scols = (K + host->scale_block[1] - 1) / host->scale_block[1];
    if (!dummy && (sc->ndim != 2 || sc->dtype != KAON_F32 || sc->shape[0] != sr || sc->shape[1] != scols ||
                   !w->data || w->nbytes < (size_t)(M * K)))
        return kc_fail(b, "cuda upload: FP8 weight [%lld, %lld] with scales that do not match it", (long long)M,
                       (long long)K);
    const size_t codes = align256((size_t)(M * K)), ns = scale_floats(w, mode);
    const size_t total = codes + align256(ns * sizeof(float));
    uint8_t *p = (uint8_t *)b->base.ops->alloc(&b->base, total);
    if (!p) return kc_fail(b, "%s", kaon_last_error());
    float *ds = (float *)(p + codes);
    if (dummy) {
        k_fp8_dummy<<<1024, 256, 0, b->stream>>>(p, (size_t)(M * K), ds, ns, 1.0f / sqrtf((float)K) / 448.0f, seed);
        if (kc_launched(b, "fp8 dummy")) goto fail;
    } else {
        float *hs = (float *)malloc(ns * sizeof(float));
        if (!hs) {
            kc_fail(b, "cuda upload: out of host memory");
            goto fail;
        }
        if (mode == MODE_BLOCK)
            for (size_t i = 0; i < ns; i++) hs[i] = kaon_tensor_f32_at(sc, (int64_t)i);
        else
            for (int64_t r = 0; r < M; r++) hs[r] = kaon_tensor_f32_at(sc, sr == 1 ? 0 : r);
        int rc = kc_check(b, cudaMemcpyAsync(p, w->data, (size_t)(M * K), cudaMemcpyHostToDevice, b->stream), "upload");
        if (!rc) rc = kc_check(b, cudaMemcpyAsync(ds, hs, ns * sizeof(float), cudaMemcpyHostToDevice, b->stream), "upload");
        if (!rc) rc = kc_check(b, cudaStreamSynchronize(b->stream), "upload");
        free(hs);
        if (rc) goto fail;
    }
    memset(&dev->w, 0, sizeof dev->w);
    dev->w.dtype = KAON_FP8_E4M3;
    dev->w.ndim = 2;
    dev->w.shape[0] = M;
    dev->w.shape[1] = K;
    dev->w.data = p;
    dev->w.nbytes = total;
    memset(&dev->scale, 0, sizeof dev->scale);
    dev->scale.dtype = KAON_F32;
    dev->scale.ndim = 2;
    dev->scale.shape[0] = mode == MODE_BLOCK ? (M + 127) / 128 : M;
    dev->scale.shape[1] = mode == MODE_BLOCK ? (K + 127) / 128 : 1;
    dev->scale.data = ds;
    dev->scale.nbytes = ns * sizeof(float);
    dev->scale_block[0] = mode == MODE_BLOCK ? 128 : 1;
    dev->scale_block[1] = mode == MODE_BLOCK ? 128 : (int32_t)K;
    memset(&dev->zero, 0, sizeof dev->zero);
    memset(&dev->perm, 0, sizeof dev->perm);
    dev->act_quant = host->act_quant;
    dev->act_scale = host->act_scale;
    b->bytes_weights += total;
    return 0;
fail:
    b->base.ops->free(&b->base, p);
    return -1;
}

// ---- activation quantization ------------------------------------------------------------------

static __device__ __forceinline__ uint8_t to_e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// 1 / rms of the row a split-norm residual GEMV left (kc_gemv_fuse: the sum of its parts), in
// every lane of the warp; the same order in every warp and run.
static __device__ __forceinline__ float split_rinv(const float *parts, int n_parts, int K, float eps) {
    float s = 0.0f;
    for (int i0 = threadIdx.x & 31; i0 < n_parts; i0 += 32 * 8) {  // 8 loads in flight per lane
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = i0 + 32 * u < n_parts ? __ldcg(parts + i0 + 32 * u) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; u++) s += v[u];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return rsqrtf(s / (float)K + eps);
}

// GROUP: one warp per (token, group of 128 columns); xs[g * n + token] (VEC128 layout).
// s = max(amax, 1e-4) / 448, q = e4m3(x / s) (DeepSeek's act_quant; cpu_fp8.c). parts (n == 1,
// else NULL): x is a split norm's x * w, scaled by 1 / rms first (kc_gemv_fuse).
__global__ void __launch_bounds__(256) k_fp8_act_group(const bf16 *__restrict__ x, int n, int K,
                                                        uint8_t *__restrict__ xq, float *__restrict__ xs,
                                                        const float *__restrict__ parts, int n_parts, float eps) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const int groups = K / 128, lane = threadIdx.x & 31;
    const int item = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (item >= n * groups) return;
    const int tok = item / groups, g = item % groups;
    const size_t off = (size_t)tok * K + (size_t)g * 128 + lane * 4;
    const uint2 raw = *(const uint2 *)(x + off);
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&raw;
    float2 v0 = __bfloat1622float2(h[0]), v1 = __bfloat1622float2(h[1]);
    if (parts) {
        const float r = split_rinv(parts, n_parts, K, eps);
        v0 = make_float2(v0.x * r, v0.y * r);
        v1 = make_float2(v1.x * r, v1.y * r);
    }
    float amax = fmaxf(fmaxf(fabsf(v0.x), fabsf(v0.y)), fmaxf(fabsf(v1.x), fabsf(v1.y)));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f);
    const uint32_t q = (uint32_t)to_e4m3(__fdiv_rn(v0.x, s)) | (uint32_t)to_e4m3(__fdiv_rn(v0.y, s)) << 8 |
                       (uint32_t)to_e4m3(__fdiv_rn(v1.x, s)) << 16 | (uint32_t)to_e4m3(__fdiv_rn(v1.y, s)) << 24;
    *(uint32_t *)(xq + off) = q;
    if (lane == 0) xs[(size_t)g * n + tok] = s;
}

static __device__ __forceinline__ float block_max(float v, float *red) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
    if (threadIdx.x < 32) {
#pragma unroll
        for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}

// TENSOR, first pass: the amax of everything into *amax (as bits: non-negative floats order like
// their bits), which starts at 0.
__global__ void __launch_bounds__(256) k_fp8_amax(const bf16 *__restrict__ x, size_t total, unsigned *amax) {
    __shared__ float red[32];
    kc_pdl_trigger();
    kc_pdl_wait();
    float m = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        m = fmaxf(m, fabsf(__bfloat162float(x[i])));
    m = block_max(m, red);
    if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(m));
}

// TOKEN / TENSOR / STATIC: one block of 1024 threads per token; xs[token]. TOKEN and TENSOR:
// s = max(amax / 448, 1 / (448 * 512)), q = e4m3(x / s) (vLLM's dynamic quantization); STATIC:
// q = e4m3(x * (1 / s)) with s the input_scale. Rows of up to ROWS_VEC_MAX columns (K % 8 == 0)
// stay in registers between the amax and the quantization (a decode step has one token: one
// block does it all, so its latency is the step's).
#define ROWS_VEC_MAX (1024 * 8 * 2)
template <bool VEC>
__global__ void __launch_bounds__(1024) k_fp8_act_rows(const bf16 *__restrict__ x, int K, int mode, float sstatic,
                                                        const unsigned *__restrict__ amax_all,
                                                        uint8_t *__restrict__ xq, float *__restrict__ xs) {
    __shared__ float red[32];
    kc_pdl_trigger();
    kc_pdl_wait();
    const int tok = blockIdx.x;
    const bf16 *xr = x + (size_t)tok * K;
    uint8_t *qr = xq + (size_t)tok * K;
    uint4 v[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
    float m = 0.0f;
    if (VEC) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int k = (threadIdx.x + i * 1024) * 8;
            if (k < K) v[i] = *(const uint4 *)(xr + k);
        }
    }
    if (mode == KAON_ACTQ_TENSOR) {
        m = __uint_as_float(*amax_all);
    } else if (mode != KAON_ACTQ_STATIC) {
        if (VEC) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[i];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(h[e]);
                    m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
                }
            }
        } else {
            for (int k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(__bfloat162float(xr[k])));
        }
        m = block_max(m, red);
    }
    const bool stat = mode == KAON_ACTQ_STATIC;
    const float s = stat ? sstatic : fmaxf(__fdiv_rn(m, 448.0f), 1.0f / (448.0f * 512.0f));
    const float inv = __fdiv_rn(1.0f, s);
    if (VEC) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int k = (threadIdx.x + i * 1024) * 8;
            if (k >= K) continue;
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v[i];
            uint32_t q[2] = {0, 0};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(h[e]);
                const uint32_t a = to_e4m3(stat ? f.x * inv : __fdiv_rn(f.x, s));
                const uint32_t b2 = to_e4m3(stat ? f.y * inv : __fdiv_rn(f.y, s));
                q[e >> 1] |= (a | b2 << 8) << (16 * (e & 1));
            }
            *(uint2 *)(qr + k) = make_uint2(q[0], q[1]);
        }
    } else {
        for (int k = threadIdx.x; k < K; k += blockDim.x) {
            const float f = __bfloat162float(xr[k]);
            qr[k] = to_e4m3(stat ? f * inv : __fdiv_rn(f, s));
        }
    }
    if (threadIdx.x == 0) xs[tok] = s;
}

// ---- the GEMV ---------------------------------------------------------------------------------

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}

static __device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 128-column chunk of one warp: wv[h][r] = 16 bytes of row r (0: groupID, 1: groupID + 8) at
// column c * 128 + h * 64 + 16 * (lane % 4); xv[h] the same columns of token groupID of the tile.
static __device__ __forceinline__ void chunk_mma(float (&c)[4], const uint4 (&wv)[2][2], const uint4 (&xv)[2]) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mma_e4m3(c, wv[h][0].x, wv[h][1].x, wv[h][0].y, wv[h][1].y, xv[h].x, xv[h].y);
        mma_e4m3(c, wv[h][0].z, wv[h][1].z, wv[h][0].w, wv[h][1].w, xv[h].z, xv[h].w);
    }
}

struct Fp8Args {
    const uint8_t *w[3];  // up to 3 weights sharing x (linear_multi), or gate and up (SILU)
    const float *ws[3];
    const float *bias[3];
    void *y[3];
    int rows[3];
    int begin[3];  // first block of each weight
    int count;
    int ws_cols;  // BLOCK: ceil(K / 128)
    const uint8_t *xq;
    const float *xs;
    int n, tok0, K, f32out;  // tokens [tok0, tok0 + 8 NT) of n
    // RES (one weight, one token, bf16 y the residual stream): y += bf16(product), then the split
    // norm's xg = bf16(y * norm) and the block's sum of y^2 in parts[block] (kc_gemv_fuse).
    const float *norm;
    bf16 *xg;
    float *parts;
};

// y[t, row] = sum over 128-column chunks c of (w[row, c] . xq[t, c]) * sw * sx for the tokens
// t of [tok0, tok0 + 8 NT) below n: NT tiles of 8 tokens; FP8_WARPS warps split the chunks; partial sums meet in shared memory. SILU: weight 0 is
// the gate and weight 1 the up projection of the same rows: out = bf16(bf16(silu(bf16 g)) * bf16 u).
// RES: see Fp8Args (NT 1, not SILU).
template <int NT, int MODE, bool SILU, bool RES = false>
__global__ void __launch_bounds__(FP8_WARPS * 32, NT == 1 ? 2 : 1) k_fp8_gemv(const Fp8Args a) {
    __shared__ float part[SILU ? 2 : 1][FP8_WARPS][NT][32][4];
    extern __shared__ uint4 ring_all[];  // [warp][stage][4 x 16 bytes][lane]
    kc_pdl_trigger();
    int seg = 0;
    if (!SILU)
        while (seg + 1 < a.count && (int)blockIdx.x >= a.begin[seg + 1]) seg++;
    const int M = a.rows[seg], K = a.K, n = a.n, tok0 = a.tok0;
    const int m0 = ((int)blockIdx.x - a.begin[seg]) * 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nch = K / 128;
    const int r0 = min(m0 + g, M - 1), r1 = min(m0 + g + 8, M - 1);  // rows past M: loaded, never stored
    const int lane_off = t * 16;
    float old_y = 0.0f;  // RES: the residual stream's value at the row this thread finishes (NT 1)
    for (int wi = 0; wi < (SILU ? 2 : 1); wi++) {  // SILU: gate's chunks, then up's
        const uint8_t *w = a.w[SILU ? wi : seg];
        const float *wsc = a.ws[SILU ? wi : seg];
        const uint8_t *wr0 = w + (size_t)r0 * K + lane_off, *wr1 = w + (size_t)r1 * K + lane_off;
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        // Each warp streams its chunks through a ring of FP8_STAGES slots in shared memory with
        // cp.async, FP8_STAGES - 1 chunks ahead of the one it multiplies: the bytes in flight do
        // not cost registers. A lane reads back only the 64 bytes it copied, so waiting for its
        // own copies is all the synchronisation a slot needs.
        uint4 *ring = ring_all + (size_t)warp * FP8_STAGES * 128;
        auto issue = [&](int i) {  // stream position i into slot i % FP8_STAGES
            const int c = warp + i * FP8_WARPS;
            if (c < nch) {
                uint4 *slot = ring + (i % FP8_STAGES) * 128 + lane;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    cp_async16(slot + (2 * h) * 32, wr0 + (size_t)c * 128 + h * 64);
                    cp_async16(slot + (2 * h + 1) * 32, wr1 + (size_t)c * 128 + h * 64);
                }
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        };
#pragma unroll
        for (int i = 0; i < FP8_STAGES - 1; i++) issue(i);
        kc_pdl_wait();  // xq and xs come from the kernel before
        if (RES && threadIdx.x < 128) {  // requested now, not after the last chunk (the epilogue's entry e)
            const int e = threadIdx.x, row = m0 + (e >> 4) + ((e & 3) >= 2 ? 8 : 0);
            if (row < M && (e & 13) == 0) old_y = __bfloat162float(((const bf16 *)a.y[0])[row]);
        }
        for (int k = 0;; k++) {
            const int c = warp + k * FP8_WARPS;
            if (c >= nch) break;
            issue(k + FP8_STAGES - 1);
            asm volatile("cp.async.wait_group %0;" ::"n"(FP8_STAGES - 1) : "memory");
            const uint4 *slot = ring + (k % FP8_STAGES) * 128 + lane;
            uint4 wv[2][2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                wv[h][0] = slot[(2 * h) * 32];
                wv[h][1] = slot[(2 * h + 1) * 32];
            }
            const float sw = MODE == MODE_BLOCK ? wsc[(size_t)(m0 >> 7) * a.ws_cols + c] : 1.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (tok0 + j * 8 >= n) break;
                const int tok = tok0 + j * 8 + g;
                uint4 xv[2];
                if (tok < n) {
                    const uint8_t *xp = a.xq + (size_t)tok * K + (size_t)c * 128 + lane_off;
                    xv[0] = *(const uint4 *)xp;
                    xv[1] = *(const uint4 *)(xp + 64);
                } else {
                    xv[0] = xv[1] = make_uint4(0, 0, 0, 0);
                }
                float cc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                chunk_mma(cc, wv, xv);
                if (MODE == MODE_BLOCK) {
                    const int t0 = tok0 + j * 8 + 2 * t, t1 = t0 + 1;
                    const float s0 = t0 < n ? sw * a.xs[(size_t)c * n + t0] : 0.0f;
                    const float s1 = t1 < n ? sw * a.xs[(size_t)c * n + t1] : 0.0f;
                    acc[j][0] = fmaf(cc[0], s0, acc[j][0]);
                    acc[j][1] = fmaf(cc[1], s1, acc[j][1]);
                    acc[j][2] = fmaf(cc[2], s0, acc[j][2]);
                    acc[j][3] = fmaf(cc[3], s1, acc[j][3]);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; q++) acc[j][q] += cc[q];
                }
            }
        }
        asm volatile("cp.async.wait_group 0;" ::: "memory");  // (empty groups past the end)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) part[wi][warp][j][lane][i] = acc[j][i];
    }
    __syncthreads();
    float sq = 0.0f;  // RES: this thread's y^2
    // Each thread finishes entries (j, lane, i) of the tile: the sum over the warps, the scales,
    // the bias, the store.
    for (int e = threadIdx.x; e < NT * 32 * 4; e += FP8_WARPS * 32) {
        const int j = e >> 7, ln = (e >> 2) & 31, i = e & 3;
        const int row = m0 + (ln >> 2) + (i >= 2 ? 8 : 0), tok = tok0 + j * 8 + 2 * (ln & 3) + (i & 1);
        if (row >= M || tok >= n) continue;
        float v[2];
        for (int wi = 0; wi < (SILU ? 2 : 1); wi++) {
            float s = 0.0f;
#pragma unroll
            for (int wp = 0; wp < FP8_WARPS; wp++) s += part[wi][wp][j][ln][i];
            if (MODE == MODE_ROWS) s *= a.ws[SILU ? wi : seg][row] * a.xs[tok];
            v[wi] = s;
        }
        if (SILU) {
            const float gt = __bfloat162float(__float2bfloat16(v[0]));
            const float sg = __bfloat162float(__float2bfloat16(gt / (1.0f + __expf(-gt))));
            ((bf16 *)a.y[0])[(size_t)tok * M + row] =
                __float2bfloat16(sg * __bfloat162float(__float2bfloat16(v[1])));
        } else {
            float r = v[0];
            if (a.bias[seg]) r += a.bias[seg][row];
            if (RES) {  // linear, then rmsnorm's add: each rounded to bf16
                const float y = __bfloat162float(__float2bfloat16(old_y + __bfloat162float(__float2bfloat16(r))));
                ((bf16 *)a.y[0])[row] = __float2bfloat16(y);
                a.xg[row] = __float2bfloat16(y * a.norm[row]);
                sq = y * y;
            } else if (a.f32out) ((float *)a.y[seg])[(size_t)tok * M + row] = r;
            else ((bf16 *)a.y[seg])[(size_t)tok * M + row] = __float2bfloat16(r);
        }
    }
    if (RES) {  // the block's sum of squares, in a fixed order
        __shared__ float red[FP8_WARPS];
#pragma unroll
        for (int o = 16; o; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (lane == 0) red[warp] = sq;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
#pragma unroll
            for (int i = 0; i < FP8_WARPS; i++) t += red[i];
            a.parts[blockIdx.x] = t;
        }
    }
}

// (SILU keeps two sets of partial sums in shared memory: at most 4 tiles.)
#define FP8_SILU_MAX_N 32

template <int NT, int MODE, bool SILU, bool RES = false>
static void launch_nt(kc_backend *b, unsigned blocks, const Fp8Args &a) {
    static bool sized;  // the ring is more dynamic shared memory than a kernel gets by default
    if (!sized) {
        cudaFuncSetAttribute(k_fp8_gemv<NT, MODE, SILU, RES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             FP8_RING_BYTES);
        sized = true;
    }
    kc_launch(b, k_fp8_gemv<NT, MODE, SILU, RES>, dim3(blocks), dim3(FP8_WARPS * 32), FP8_RING_BYTES, a);
}

template <int MODE, bool SILU>
static void launch_gemv(kc_backend *b, int tiles, unsigned blocks, const Fp8Args &a) {
    switch (tiles) {
    case 1: launch_nt<1, MODE, SILU>(b, blocks, a); break;
    case 2: launch_nt<2, MODE, SILU>(b, blocks, a); break;
    case 3:
    case 4: launch_nt<4, MODE, SILU>(b, blocks, a); break;
    default:
        if (!SILU) launch_nt<8, MODE, false>(b, blocks, a);
        break;
    }
}

// ---- host side --------------------------------------------------------------------------------

static bool quantizes_acts(const kaon_linear *l) { return l->act_quant != KAON_ACTQ_NONE; }

static int dev_mode(const kaon_linear *l) { return l->scale_block[0] == 128 ? MODE_BLOCK : MODE_ROWS; }

// A layer this file uploaded: checks.
static bool fp8_ok(kc_backend *b, const kaon_linear *l, const char *what) {
    const kaon_tensor *w = &l->w;
    if (w->dtype != KAON_FP8_E4M3 || w->ndim != 2 || !w->data || !l->scale.data || w->shape[1] % 16 ||
        !(l->scale_block[0] == 128 || (l->scale_block[0] == 1 && l->scale_block[1] == w->shape[1]))) {
        kc_fail(b, "cuda %s: the FP8 weight was not uploaded by the CUDA backend", what);
        return false;
    }
    if (l->act_quant == KAON_ACTQ_STATIC && !(l->act_scale > 0.0f)) {
        kc_fail(b, "cuda %s: FP8 static activations without an input_scale", what);
        return false;
    }
    if (l->bias.data && l->bias.dtype != KAON_F32) {
        kc_fail(b, "cuda %s: bias must be f32", what);
        return false;
    }
    return true;
}

// Whether the batch-1 split norm (kc_gemv_fuse) can serve layer l at n tokens: its activations
// quantized per group (the 1 / rms goes into their quantization), on the GEMV.
static bool split_ok(const kc_fp8 *s, const kaon_linear *l, int n) {
    return n == 1 && n <= s->gemv_max_n && l->w.shape[1] % 128 == 0 && l->w.shape[1] <= KC_GEMV_NORM_MAX_IN &&
           l->act_quant == KAON_ACTQ_GROUP;
}

// x [n, K] -> the state's xq / xs for layer l's activation quantization. split (NULL: none; else
// split_ok): x is a split norm's x * w, scaled by its 1 / rms before it is quantized.
static int quantize(kc_backend *b, kc_fp8 *s, const bf16 *x, int n, int K, const kaon_linear *l,
                    const kc_gemv_fuse *split) {
    const float *parts = split ? split->parts : NULL;
    const int n_parts = split ? split->n_parts : 0;
    const float eps = split ? split->eps : 0.0f;
    const size_t groups = (size_t)(K + 127) / 128;
    // Rows up to a multiple of 16: a padded cuBLASLt product (lt_matmul) reads them.
    if (kc_grow(b, (void **)&s->xq, &s->xq_cap, (size_t)((n + 15) & ~15) * K, 1, "fp8 activations") ||
        kc_grow(b, (void **)&s->xs, &s->xs_cap, (size_t)n * groups + 1, sizeof(float), "fp8 activation scales"))
        return -1;
    if (l->act_quant == KAON_ACTQ_GROUP) {
        if (K % 128) return kc_fail(b, "cuda linear: FP8 activation groups need a multiple of 128 columns");
        const size_t warps = (size_t)n * (size_t)(K / 128);
        kc_launch(b, k_fp8_act_group, dim3((unsigned)((warps + 7) / 8)), dim3(256), 0, x, n, K, s->xq, s->xs, parts,
                  n_parts, eps);
        return kc_launched(b, "fp8 activation groups");
    }
    unsigned *amax = (unsigned *)(s->xs + (size_t)n * groups);
    if (l->act_quant == KAON_ACTQ_TENSOR) {
        if (kc_check(b, cudaMemsetAsync(amax, 0, sizeof(unsigned), b->stream), "fp8 amax")) return -1;
        const size_t total = (size_t)n * K;
        const unsigned blocks = (unsigned)(total / 256 + 1 < 1024 ? total / 256 + 1 : 1024);
        kc_launch(b, k_fp8_amax, dim3(blocks), dim3(256), 0, x, total, amax);
        if (kc_launched(b, "fp8 amax")) return -1;
    }
    const bool vec = K % 8 == 0 && K <= ROWS_VEC_MAX && ((uintptr_t)x & 15) == 0;
    kc_launch(b, vec ? k_fp8_act_rows<true> : k_fp8_act_rows<false>, dim3((unsigned)n), dim3(1024), 0, x, K,
              (int)l->act_quant, l->act_scale, (const unsigned *)amax, s->xq, s->xs);
    return kc_launched(b, "fp8 activation rows");
}

// The GEMV over count weights sharing the quantized x (SILU: gate and up into y[0]), in passes
// of at most FP8_GEMV_MAX_N tokens. res (one weight, one token; else NULL): y[0] is the residual
// stream, added into, and the split norm's xg and parts are written (Fp8Args' RES).
static int gemv(kc_backend *b, kc_fp8 *s, int n, int K, int count, const kaon_linear *const *l, void *const *y,
                int f32out, bool silu, const kc_gemv_fuse *res = NULL) {
    if (silu && n > FP8_SILU_MAX_N) return kc_fail(b, "cuda fp8: fused SiLU of %d tokens", n);
    Fp8Args a;
    memset(&a, 0, sizeof a);
    a.count = count;
    a.xq = s->xq;
    a.xs = s->xs;
    a.n = n;
    a.K = K;
    a.f32out = f32out;
    a.ws_cols = (K + 127) / 128;
    int blocks = 0;
    for (int i = 0; i < count; i++) {
        a.w[i] = (const uint8_t *)l[i]->w.data;
        a.ws[i] = (const float *)l[i]->scale.data;
        a.bias[i] = l[i]->bias.data ? (const float *)l[i]->bias.data : NULL;
        a.y[i] = y[silu ? 0 : i];
        a.rows[i] = (int)l[i]->w.shape[0];
        a.begin[i] = blocks;
        if (!silu || i == 0) blocks += (a.rows[i] + 15) / 16;
    }
    const int mode = dev_mode(l[0]);
    if (res) {
        if (n != 1 || count != 1 || silu || f32out) return kc_fail(b, "cuda fp8: residual GEMV of %d tokens", n);
        a.norm = res->norm;
        a.xg = res->xg;
        a.parts = res->parts;
        if (mode == MODE_BLOCK) launch_nt<1, MODE_BLOCK, false, true>(b, (unsigned)blocks, a);
        else launch_nt<1, MODE_ROWS, false, true>(b, (unsigned)blocks, a);
        return kc_launched(b, "fp8 gemv (residual)");
    }
    for (int t0 = 0; t0 < n; t0 += FP8_GEMV_MAX_N) {
        a.tok0 = t0;
        const int tiles = (n - t0 < FP8_GEMV_MAX_N ? n - t0 + 7 : FP8_GEMV_MAX_N) / 8;
        if (mode == MODE_BLOCK) {
            if (silu) launch_gemv<MODE_BLOCK, true>(b, tiles, (unsigned)blocks, a);
            else launch_gemv<MODE_BLOCK, false>(b, tiles, (unsigned)blocks, a);
        } else {
            if (silu) launch_gemv<MODE_ROWS, true>(b, tiles, (unsigned)blocks, a);
            else launch_gemv<MODE_ROWS, false>(b, tiles, (unsigned)blocks, a);
        }
        if (kc_launched(b, "fp8 gemv")) return -1;
    }
    return 0;
}

// ---- cuBLASLt ---------------------------------------------------------------------------------

static fp8_gemm *lt_get(kc_backend *b, kc_fp8 *s, int m, int n, int k, int mode, int f32out) {
    for (int i = 0; i < FP8_LT_CACHE; i++) {
        fp8_gemm *g = &s->lt[i];
        if (g->valid && g->m == m && g->n == n && g->k == k && g->mode == mode && g->f32out == f32out) {
            g->last_use = ++s->tick;
            return g->valid == 1 ? g : NULL;
        }
    }
    if (b->capturing) return NULL;  // the GEMV takes shapes first seen while recording
    fp8_gemm *g = &s->lt[0];
    for (int i = 1; i < FP8_LT_CACHE; i++)
        if (!s->lt[i].valid || s->lt[i].last_use < g->last_use) g = &s->lt[i];
    lt_destroy(g);
    memset(g, 0, sizeof *g);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    // A = the weight (op T: [m = out, k]), B = the activations ([k, n]); D col-major [m, n] is
    // y row-major [n, out].
    const int32_t am = mode == MODE_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                          : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const int32_t bm = mode == MODE_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                          : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto fail;
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am) ||
        cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm))
        goto fail;
    if (cublasLtMatrixLayoutCreate(&g->a, CUDA_R_8F_E4M3, k, m, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&g->b, CUDA_R_8F_E4M3, k, n, k) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&g->c, f32out ? CUDA_R_32F : CUDA_R_16BF, m, n, m) != CUBLAS_STATUS_SUCCESS)
        goto fail;
    {
        // The heuristic reads the scale pointers' presence: any non-null device address will do.
        const void *dummy = s->xs;
        cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy);
        cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy);
    }
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) goto fail;
    {
        size_t wsb = b->lt_ws_bytes;
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    }
    if (cublasLtMatmulAlgoGetHeuristic(b->lt, g->op, g->a, g->b, g->c, g->c, pref, 1, &res, &nres) !=
            CUBLAS_STATUS_SUCCESS ||
        nres < 1)
        goto fail;
    cublasLtMatmulPreferenceDestroy(pref);
    g->algo = res.algo;
    g->m = m, g->n = n, g->k = k, g->mode = mode, g->f32out = f32out;
    g->valid = 1;
    g->last_use = ++s->tick;
    return g;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (g->a) cublasLtMatrixLayoutDestroy(g->a);
    if (g->b) cublasLtMatrixLayoutDestroy(g->b);
    if (g->c) cublasLtMatrixLayoutDestroy(g->c);
    if (g->op) cublasLtMatmulDescDestroy(g->op);
    memset(g, 0, sizeof *g);
    g->m = m, g->n = n, g->k = k, g->mode = mode, g->f32out = f32out;
    g->valid = -1;
    g->last_use = ++s->tick;
    return NULL;
}

// cuBLASLt's product with plan g: the layer's weight and scales against the quantized activations
// (xq and their scales sb), into out.
static int lt_run(kc_backend *b, fp8_gemm *g, const kaon_linear *l, const float *sb, void *out) {
    const void *sa = l->scale.data;
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasLtMatmul(b->lt, g->op, &alpha, l->w.data, g->a, b->fp8->xq, g->b, &beta, out,
                                             g->c, out, g->c, &g->algo, b->lt_ws, b->lt_ws_bytes, b->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        return kc_fail(b, "cuBLASLt FP8 matmul %d x %d x %d failed (status %d)", g->m, g->n, g->k, (int)st);
    return 0;
}

// The padded product: cuBLASLt over n rounded up to 16 tokens (rows past n of xq hold finite
// codes from earlier steps; their outputs are dropped), the VEC128 scales copied to the padded
// stride. y_rows: the rows y has room for; where that is the padded count the product writes y
// itself, else a scratch whose first n rows are copied to y. 1 when even that shape has no
// algorithm.
static int lt_matmul_padded(kc_backend *b, kc_fp8 *s, int n, const kaon_linear *l, void *y, int y_rows,
                            int f32out) {
    const int M = (int)l->w.shape[0], K = (int)l->w.shape[1], mode = dev_mode(l), np = (n + 15) & ~15;
    // The activation scales: [in/128, n] (BLOCK, VEC128) or one per token (ROWS, OUTER_VEC).
    const size_t groups = mode == MODE_BLOCK ? (size_t)(K + 127) / 128 : 1;
    const size_t esz = f32out ? sizeof(float) : sizeof(bf16);
    if (!s->pad || np == n || b->capturing) return 1;
    fp8_gemm *g = lt_get(b, s, M, np, K, mode, f32out);
    if (!g) return 1;
    const bool in_place = y_rows >= np;
    if (kc_grow(b, (void **)&s->xs_pad, &s->xs_pad_cap, groups * np, sizeof(float), "fp8 padded scales") ||
        (!in_place && kc_grow(b, &s->y_pad, &s->y_pad_cap, (size_t)np * M * esz, 1, "fp8 padded output")) ||
        kc_check(b, cudaMemcpy2DAsync(s->xs_pad, (size_t)np * sizeof(float), s->xs, (size_t)n * sizeof(float),
                                      (size_t)n * sizeof(float), groups, cudaMemcpyDeviceToDevice, b->stream),
                 "fp8 padded scales"))
        return -1;
    static int said;
    if (!said && s->pad == 1) {
        said = 1;
        KAON_INFO("cuda fp8: cuBLASLt has no algorithm for %d x %d x %d; such products run padded to %d tokens",
                  M, n, K, np);
    }
    if (lt_run(b, g, l, s->xs_pad, in_place ? y : s->y_pad)) return -1;
    if (!in_place && kc_check(b, cudaMemcpyAsync(y, s->y_pad, (size_t)n * M * esz, cudaMemcpyDeviceToDevice, b->stream),
                              "fp8 padded output"))
        return -1;
    if (l->bias.data) kc_add_bias(b, (bf16 *)y, (const float *)l->bias.data, n, M);
    return 0;
}

// 1 when cuBLASLt has no algorithm for the shape, padded or not (the GEMV then runs it). y_rows:
// the rows y has room for (>= n).
static int lt_matmul(kc_backend *b, kc_fp8 *s, int n, const kaon_linear *l, void *y, int y_rows, int f32out) {
    const int M = (int)l->w.shape[0], K = (int)l->w.shape[1], mode = dev_mode(l);
    if (M % 8 || (f32out && l->bias.data)) return 1;
    // Forced padding (KAON_FP8_PAD=force) skips the plan for n itself where n is not a multiple of 16.
    fp8_gemm *g = s->pad == 2 && n > FP8_GEMV_MAX_N && n % 16 ? NULL : lt_get(b, s, M, n, K, mode, f32out);
    if (!g && n > FP8_GEMV_MAX_N) {
        const int rc = lt_matmul_padded(b, s, n, l, y, y_rows, f32out);
        if (rc <= 0) return rc;
    }
    if (!g) {
        // The GEMV re-reads the whole weight for every 64 tokens: fine for a few, ruinous for a
        // prefill chunk. Said (a few times) so a slow large batch has a visible cause.
        static int warned;
        if (n > FP8_GEMV_MAX_N && warned < 8) {
            warned++;
            KAON_WARN("cuda fp8: %d x %d x %d %s: the GEMV runs it in %d passes", M, n, K,
                      b->capturing ? "first seen while recording a graph" : "has no cuBLASLt algorithm",
                      (n + FP8_GEMV_MAX_N - 1) / FP8_GEMV_MAX_N);
        }
        return 1;
    }
    if (lt_run(b, g, l, s->xs, y)) return -1;
    if (l->bias.data) kc_add_bias(b, (bf16 *)y, (const float *)l->bias.data, n, M);
    return 0;
}

// ---- weight-only layers -----------------------------------------------------------------------

__global__ void k_fp8_dequant(const uint8_t *__restrict__ w, const float *__restrict__ ws, int mode, int ws_cols,
                              int64_t row0, int64_t rows, int K, bf16 *__restrict__ out) {
    const size_t total = (size_t)rows * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const int64_t r = row0 + (int64_t)(i / K);
        const int k = (int)(i % K);
        const float s = mode == MODE_BLOCK ? ws[(size_t)(r >> 7) * ws_cols + (k >> 7)] : ws[r];
        const __half_raw h = __nv_cvt_fp8_to_halfraw(w[(size_t)r * K + k], __NV_E4M3);
        out[i] = __float2bfloat16(__half2float(__half(h)) * s);
    }
}

static int weight_only(kc_backend *b, kc_fp8 *s, const void *x, int n, const kaon_linear *l, void *y, int f32out) {
    const int64_t M = l->w.shape[0];
    const int K = (int)l->w.shape[1];
    int64_t chunk = FP8_DEQ_CAP / K;
    if (chunk > M) chunk = M;
    if (chunk < 1) chunk = 1;
    if (kc_grow(b, (void **)&s->deq, &s->deq_cap, (size_t)chunk * K, sizeof(bf16), "fp8 dequantized rows")) return -1;
    if (chunk < M && n > 1) return kc_fail(b, "cuda linear: weight-only FP8 layer of %lld rows is too large", (long long)M);
    const int mode = dev_mode(l);
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
        const int64_t rows = M - r0 < chunk ? M - r0 : chunk;
        k_fp8_dequant<<<1024, 256, 0, b->stream>>>((const uint8_t *)l->w.data, (const float *)l->scale.data, mode,
                                                  (K + 127) / 128, r0, rows, K, s->deq);
        if (kc_launched(b, "fp8 dequant")) return -1;
        // n == 1 (or one chunk): each chunk's rows are a slice of y's only row.
        void *yc = f32out ? (void *)((float *)y + r0) : (void *)((bf16 *)y + r0);
        if (kc_gemm_bf16(b, (const bf16 *)x, n, s->deq, (int)rows, K,
                         l->bias.data ? (const float *)l->bias.data + r0 : NULL, yc, f32out))
            return -1;
    }
    return 0;
}

// ---- entry ------------------------------------------------------------------------------------

int kc_fp8_linear(kc_backend *b, const void *x, int n, const kaon_linear *l, void *y, int f32out) {
    kc_fp8 *s = fstate(b);
    if (!s || !fp8_ok(b, l, "linear")) return -1;
    const int K = (int)l->w.shape[1];
    if (!quantizes_acts(l)) return weight_only(b, s, x, n, l, y, f32out);
    if (quantize(b, s, (const bf16 *)x, n, K, l, NULL)) return -1;
    if (n > s->gemv_max_n || K % 128) {
        const int rc = lt_matmul(b, s, n, l, y, n, f32out);
        if (rc <= 0) return rc;
    }
    if (K % 128) return kc_fail(b, "cuda linear: FP8 layer of %d columns has no kernel (a multiple of 128 has)", K);
    return gemv(b, s, n, K, 1, &l, &y, f32out, false);
}

// Whether layers a and b quantize x the same way and share the GEMV's mode and width.
static bool same_x(const kaon_linear *a, const kaon_linear *b) {
    return a->act_quant == b->act_quant && a->act_scale == b->act_scale && dev_mode(a) == dev_mode(b) &&
           a->w.shape[1] == b->w.shape[1];
}

// The product of one layer with the activations quantized already: cuBLASLt for large batches,
// else (or where it has no algorithm) the GEMV. y_rows: the rows y has room for (>= n).
static int product(kc_backend *b, kc_fp8 *s, int n, const kaon_linear *l, void *y, int y_rows) {
    const int K = (int)l->w.shape[1];
    if (n > s->gemv_max_n || K % 128) {
        const int rc = lt_matmul(b, s, n, l, y, y_rows, 0);
        if (rc <= 0) return rc;
    }
    if (K % 128) return kc_fail(b, "cuda linear: FP8 layer of %d columns has no kernel (a multiple of 128 has)", K);
    return gemv(b, s, n, K, 1, &l, &y, 0, false);
}

int kc_fp8_linear_multi(kc_backend *b, const void *x, int n, int count, const kaon_linear *const *l, void *const *y,
                        const kc_gemv_fuse *split) {
    kc_fp8 *s = fstate(b);
    if (!s) return -1;
    if (count < 1 || count > 3) return 1;
    for (int i = 0; i < count; i++) {
        if (l[i]->w.dtype != KAON_FP8_E4M3) return 1;
        if (!fp8_ok(b, l[i], "linear_multi")) return -1;
        if (!quantizes_acts(l[i]) || !same_x(l[0], l[i])) return 1;
    }
    if (split && !split_ok(s, l[0], n)) return 1;
    const int K = (int)l[0]->w.shape[1];
    if (quantize(b, s, (const bf16 *)x, n, K, l[0], split)) return -1;  // once for all of them
    if (n <= s->gemv_max_n && K % 128 == 0) return gemv(b, s, n, K, count, l, y, 0, false);
    for (int i = 0; i < count; i++)
        if (product(b, s, n, l[i], y[i], n)) return -1;
    return 0;
}

int kc_fp8_silu_mul(kc_backend *b, const void *x, int n, const kaon_linear *gate, const kaon_linear *up, void *out,
                    const kc_gemv_fuse *split) {
    kc_fp8 *s = fstate(b);
    if (!s) return -1;
    if (gate->w.dtype != KAON_FP8_E4M3 || up->w.dtype != KAON_FP8_E4M3) return 1;
    if (!fp8_ok(b, gate, "linear_silu_mul") || !fp8_ok(b, up, "linear_silu_mul")) return -1;
    if (!quantizes_acts(gate) || !same_x(gate, up) || gate->w.shape[0] != up->w.shape[0] || gate->bias.data ||
        up->bias.data)
        return 1;
    if (split && !split_ok(s, gate, n)) return 1;
    const int K = (int)gate->w.shape[1], F = (int)gate->w.shape[0];
    if (quantize(b, s, (const bf16 *)x, n, K, gate, split)) return -1;  // once for both
    if (n <= FP8_SILU_MAX_N && n <= s->gemv_max_n && K % 128 == 0) {
        const kaon_linear *l[2] = {gate, up};
        void *y[2] = {out, out};
        return gemv(b, s, n, K, 2, l, y, 0, true);
    }
    // Larger batches: both products, then SiLU-and-mul (the unfused ops' roundings). Each half of
    // the scratch holds n rounded up to 16 rows, so a padded product writes it in place.
    const int np = (n + 15) & ~15;
    if (kc_grow(b, (void **)&s->gu, &s->gu_cap, 2 * (size_t)np * F, sizeof(bf16), "fp8 gate/up")) return -1;
    bf16 *g = s->gu, *u = s->gu + (size_t)np * F;
    if (product(b, s, n, gate, g, np) || product(b, s, n, up, u, np)) return -1;
    kc_silu_mul(b, g, u, (size_t)n * F, (bf16 *)out);
    return b->err ? -1 : 0;
}

// res += x @ l^T as one GEMV that also leaves the split norm's xg and parts (f: norm, xg, parts in;
// n_parts out), at batch 1 where split_ok; else 1.
int kc_fp8_linear_residual(kc_backend *b, const void *x, int n, const kaon_linear *l, void *res, kc_gemv_fuse *f) {
    kc_fp8 *s = fstate(b);
    if (!s) return -1;
    if (l->w.dtype != KAON_FP8_E4M3) return 1;
    if (!fp8_ok(b, l, "linear_residual")) return -1;
    if (!quantizes_acts(l) || !split_ok(s, l, n)) return 1;
    const int K = (int)l->w.shape[1];
    if (quantize(b, s, (const bf16 *)x, n, K, l, NULL)) return -1;
    if (gemv(b, s, n, K, 1, &l, &res, 0, false, f)) return -1;
    f->n_parts = (int)((l->w.shape[0] + 15) / 16);
    return 0;
}
