// The CUDA backend's element-wise and row kernels: embedding, row gather, residual add +
// RMSNorm, RoPE (alone and fused with the KV-cache write), SiLU- and GELU-and-mul, scale, bias,
// random fill, and the conversions of stored weight formats (f16, f32, GGUF blocks) to bf16/f32
// at load.
//
// Rounding follows the HF bf16 reference where it is cheap to: a residual sum is rounded to
// bf16 before it is normed, the normed row is rounded before the weight multiplies it, and
// silu(gate) or gelu(gate) is rounded before it multiplies up.
#include "backend/cuda/cuda_internal.h"
#include "backend/quant_blocks.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

static __device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 tobf(float x) { return __float2bfloat16(x); }
static __device__ __forceinline__ float rbf(float x) { return bf(tobf(x)); }

// ---- embedding and row gather --------------------------------------------------------------

// One block per row; 16-byte copies when the row allows (dim % 8 == 0).
__global__ void k_gather_rows(const bf16 *__restrict__ src, int64_t n_src, int dim,
                              const int32_t *__restrict__ idx, bf16 *__restrict__ out) {
    kc_pdl_trigger();
    kc_pdl_wait();
    const int i = blockIdx.x;
    const int64_t r = idx[i];
    bf16 *o = out + (size_t)i * dim;
    if (r < 0 || r >= n_src) {  // the host checked ids; a bad one leaves a zero row
        for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = tobf(0.f);
        return;
    }
    const bf16 *s = src + (size_t)r * dim;
    if ((dim & 7) == 0) {
        const uint4 *s4 = (const uint4 *)s;
        uint4 *o4 = (uint4 *)o;
        for (int j = threadIdx.x; j < dim / 8; j += blockDim.x) o4[j] = s4[j];
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = s[j];
    }
}

void kc_embed(kc_backend *b, const bf16 *table, int64_t vocab, int dim, const int32_t *d_ids,
              int n, bf16 *out) {
    if (n <= 0) return;
    kc_launch(b, k_gather_rows, dim3(n), dim3(128), 0, table, vocab, dim, d_ids, out);
    kc_launched(b, "embed");
}

void kc_get_rows(kc_backend *b, const bf16 *x, const int32_t *d_idx, int n, int dim, bf16 *out) {
    if (n <= 0) return;
    // x's row count is not known here; the runner checked the rows against the batch.
    kc_launch(b, k_gather_rows, dim3(n), dim3(128), 0, x, (int64_t)INT64_MAX, dim, d_idx, out);
    kc_launched(b, "get_rows");
}

// ---- RMSNorm -------------------------------------------------------------------------------

// One block per row. x += add (rounded to bf16, stored back), then
// out = bf16(w * bf16(x / rms(x))). out may be x.
template <bool VEC, bool ONCE>
__global__ void k_rmsnorm(bf16 *__restrict__ x, const bf16 *__restrict__ add,
                          const float *__restrict__ w, float eps, int dim, bf16 *out) {
    __shared__ float red[33];
    kc_pdl_trigger();
    kc_pdl_wait();
    bf16 *xr = x + (size_t)blockIdx.x * dim;
    const bf16 *ar = add ? add + (size_t)blockIdx.x * dim : nullptr;
    bf16 *orow = out + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    if (VEC) {
        for (int j = threadIdx.x; j < dim / 8; j += blockDim.x) {
            uint4 xv = ((const uint4 *)xr)[j];
            bf16 *xe = (bf16 *)&xv;
            if (ar) {
                uint4 av = ((const uint4 *)ar)[j];
                const bf16 *ae = (const bf16 *)&av;
#pragma unroll
                for (int e = 0; e < 8; e++) xe[e] = tobf(bf(xe[e]) + bf(ae[e]));
                ((uint4 *)xr)[j] = xv;
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += bf(xe[e]) * bf(xe[e]);
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float v = bf(xr[j]);
            if (ar) {
                v = rbf(v + bf(ar[j]));
                xr[j] = tobf(v);
            }
            ss += v * v;
        }
    }
    const float r = rsqrtf(kc_block_sum(ss, red) / (float)dim + eps);
    if (VEC) {
        for (int j = threadIdx.x; j < dim / 8; j += blockDim.x) {
            uint4 xv = ((const uint4 *)xr)[j];
            bf16 *xe = (bf16 *)&xv;
#pragma unroll
            for (int e = 0; e < 8; e++) xe[e] = tobf(w[8 * j + e] * (ONCE ? bf(xe[e]) * r : rbf(bf(xe[e]) * r)));
            ((uint4 *)orow)[j] = xv;
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            orow[j] = tobf(w[j] * (ONCE ? bf(xr[j]) * r : rbf(bf(xr[j]) * r)));
    }
}

void kc_rmsnorm(kc_backend *b, bf16 *x, const bf16 *add, const float *w, float eps, int n,
                int dim, bf16 *out, bool once) {
    if (n <= 0 || dim <= 0) return;
    const bool vec = (dim & 7) == 0;
    int work = vec ? dim / 8 : dim;
    int threads = ((work + 31) / 32) * 32;
    if (threads > 1024) threads = 1024;
    if (threads < 32) threads = 32;
    auto k = vec ? (once ? k_rmsnorm<true, true> : k_rmsnorm<true, false>)
                 : (once ? k_rmsnorm<false, true> : k_rmsnorm<false, false>);
    kc_launch(b, k, dim3(n), dim3(threads), 0, x, add, w, eps, dim, out);
    kc_launched(b, "rmsnorm");
}

// ---- RoPE and the KV write -----------------------------------------------------------------

// Rotates pair j of one head vector v in place.
static __device__ __forceinline__ void rope_pair(bf16 *v, int j, int half, int interleaved,
                                                 float pos, const float *inv_freq) {
    const float theta = pos * inv_freq[j];
    float s, c;
    sincosf(theta, &s, &c);
    const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
    const float a = bf(v[i0]), bb = bf(v[i1]);
    v[i0] = tobf(a * c - bb * s);
    v[i1] = tobf(a * s + bb * c);
}

// x [n, nh, hd]: one thread per (token, head, pair).
__global__ void k_rope(bf16 *x, int n, int nh, int hd, const int32_t *__restrict__ pos,
                       const float *__restrict__ inv_freq, int half, int interleaved) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t total = (int64_t)n * nh * half;
    if (i >= total) return;
    const int j = (int)(i % half);
    const int64_t th = i / half;  // token * nh + head
    const int t = (int)(th / nh);
    rope_pair(x + th * hd, j, half, interleaved, (float)pos[t], inv_freq);
}

void kc_rope(kc_backend *b, bf16 *x, int n, int n_heads, int hd, const int32_t *d_pos,
             int rot_dim, int interleaved) {
    const int half = rot_dim / 2;
    const int64_t total = (int64_t)n * n_heads * half;
    if (total <= 0) return;
    k_rope<<<(unsigned)((total + 255) / 256), 256, 0, b->stream>>>(x, n, n_heads, hd, d_pos,
                                                                   b->d_inv_freq, half, interleaved);
    kc_launched(b, "rope");
}

// K and V rows of n tokens to their cache slots (negative slot: padding, skipped).
// row = n_kv_heads * head_dim elements, a multiple of 8.
__global__ void k_kv_write(bf16 *__restrict__ kc_, bf16 *__restrict__ vc, const bf16 *__restrict__ k,
                           const bf16 *__restrict__ v, const int32_t *__restrict__ slot,
                           int64_t n_slots, int row) {
    const int t = blockIdx.x;
    const int64_t s = slot[t];
    if (s < 0 || s >= n_slots) return;
    const uint4 *ks = (const uint4 *)(k + (size_t)t * row), *vs = (const uint4 *)(v + (size_t)t * row);
    uint4 *kd = (uint4 *)(kc_ + (size_t)s * row), *vd = (uint4 *)(vc + (size_t)s * row);
    for (int j = threadIdx.x; j < row / 8; j += blockDim.x) {
        kd[j] = ks[j];
        vd[j] = vs[j];
    }
}

void kc_kv_write(kc_backend *b, bf16 *kc_, bf16 *vc, const bf16 *k, const bf16 *v,
                 const int32_t *d_slot, int64_t n_slots, int n, int row) {
    if (n <= 0) return;
    k_kv_write<<<n, 128, 0, b->stream>>>(kc_, vc, k, v, d_slot, n_slots, row);
    kc_launched(b, "kv_write");
}

// As k_kv_write into an FP8 cache: code = e4m3(x / scale), round to nearest even, saturated
// at +-448 (the CPU's kv_write). vc NULL: a cache without V. row: a multiple of 2.
__global__ void k_kv_write_fp8(uint8_t *__restrict__ kc_, uint8_t *__restrict__ vc, const bf16 *__restrict__ k,
                               const bf16 *__restrict__ v, const int32_t *__restrict__ slot, int64_t n_slots,
                               int row, float ks, float vs) {
    const int t = blockIdx.x;
    const int64_t s = slot[t];
    if (s < 0 || s >= n_slots) return;
    const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)(k + (size_t)t * row);
    __nv_fp8x2_storage_t *kd = (__nv_fp8x2_storage_t *)(kc_ + (size_t)s * row);
    for (int j = threadIdx.x; j < row / 2; j += blockDim.x) {
        const float2 x = __bfloat1622float2(k2[j]);
        kd[j] = __nv_cvt_float2_to_fp8x2(make_float2(x.x / ks, x.y / ks), __NV_SATFINITE, __NV_E4M3);
    }
    if (!vc) return;
    const __nv_bfloat162 *v2 = (const __nv_bfloat162 *)(v + (size_t)t * row);
    __nv_fp8x2_storage_t *vd = (__nv_fp8x2_storage_t *)(vc + (size_t)s * row);
    for (int j = threadIdx.x; j < row / 2; j += blockDim.x) {
        const float2 x = __bfloat1622float2(v2[j]);
        vd[j] = __nv_cvt_float2_to_fp8x2(make_float2(x.x / vs, x.y / vs), __NV_SATFINITE, __NV_E4M3);
    }
}

void kc_kv_write_fp8(kc_backend *b, uint8_t *kc_, uint8_t *vc, const bf16 *k, const bf16 *v,
                     const int32_t *d_slot, int64_t n_slots, int n, int row, float k_scale, float v_scale) {
    if (n <= 0) return;
    k_kv_write_fp8<<<n, 128, 0, b->stream>>>(kc_, vc, k, v, d_slot, n_slots, row, k_scale, v_scale);
    kc_launched(b, "kv_write (fp8)");
}

// Rotates the two pairs a lane holds of a 128-wide head (NeoX order, full rotary): lo holds
// elements 2 lane and 2 lane + 1, hi the elements 64 after them, so the pairs are j = 2 lane and
// 2 lane + 1. The arithmetic is rope_pair's.
static __device__ __forceinline__ void rope128_pairs(__nv_bfloat162 &lo, __nv_bfloat162 &hi, int lane, float pos,
                                                     const float *inv_freq) {
    const float2 a = __bfloat1622float2(lo), c = __bfloat1622float2(hi);
    float s0, c0, s1, c1;
    sincosf(pos * inv_freq[2 * lane], &s0, &c0);
    sincosf(pos * inv_freq[2 * lane + 1], &s1, &c1);
    lo = __halves2bfloat162(tobf(a.x * c0 - c.x * s0), tobf(a.y * c1 - c.y * s1));
    hi = __halves2bfloat162(tobf(a.x * s0 + c.x * c0), tobf(a.y * s1 + c.y * c1));
}

// Grid (ceil(n / RKV_TOKENS), ceil((nh + 2 nkv) / RKV_WARPS)): warp w of block y takes head
// y * RKV_WARPS + w of the list [q heads | k heads | v heads] for RKV_TOKENS tokens: a q head is
// rotated in place; a k head is copied into its cache row (the unrotated tail of partial RoPE
// included) and rotated there, the warp's lanes ordered by __syncwarp; a v head is copied. One
// token's heads spread over many blocks: the one-block-per-token version took 5.6 us per
// Llama-3.1-8B layer at batch 1 (CUPTI trace). FAST (head_dim 128, NeoX pairs, full rotary:
// Llama, Qwen, Mistral): each lane loads its two pairs as 4-byte words, rotates them in
// registers and stores them once (the per-pair read-modify-write, and a K head's read back from
// the cache, ran at 1.6 TB/s in an 8k prefill, as did one token per block).
// QKN (FAST only; Qwen3's q_norm / k_norm): each q and k head is RMSNormed with its weights (qn,
// kn [hd]) before the rotation, with k_rmsnorm<true, false>'s numbers (head_norm128), so the
// result is bit for bit that of rmsnorm, rmsnorm and this kernel apart, in one launch instead of three.
// q [n, nh, hd]; k, v [n, nkv, hd]; caches [slots, nkv, hd].
#define RKV_WARPS 4
#define RKV_TOKENS 4

// A 128-value head at src normed as k_rmsnorm<true, false> norms a row of 128 with one warp:
// lanes 0-15 sum the squares of 8 consecutive values in order, the warp's butterfly sum as lane 0
// ends it (kc_block_sum's result for one warp), r = rsqrt(sum / 128 + eps), then each value
// bf16(w * bf16(x * r)); lo and hi are the lane's NeoX pairs (values 2 lane, 2 lane + 1 and
// 64 + 2 lane, 65 + 2 lane), as rope128_pairs takes them.
static __device__ __forceinline__ void head_norm128(const bf16 *src, const float *__restrict__ w, float eps, int lane,
                                                    __nv_bfloat162 &lo, __nv_bfloat162 &hi) {
    float ss = 0.f;
    if (lane < 16) {
        const uint4 xv = ((const uint4 *)src)[lane];
        const bf16 *xe = (const bf16 *)&xv;
#pragma unroll
        for (int e = 0; e < 8; e++) ss += bf(xe[e]) * bf(xe[e]);
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    ss = __shfl_sync(0xffffffffu, ss, 0);
    const float r = rsqrtf(ss / 128.f + eps);
    const float2 a = __bfloat1622float2(lo), c = __bfloat1622float2(hi);
    const int i = 2 * lane;
    lo = __halves2bfloat162(tobf(w[i] * rbf(a.x * r)), tobf(w[i + 1] * rbf(a.y * r)));
    hi = __halves2bfloat162(tobf(w[i + 64] * rbf(c.x * r)), tobf(w[i + 65] * rbf(c.y * r)));
}

template <bool FAST, bool QKN = false>
__global__ void __launch_bounds__(RKV_WARPS * 32)
k_rope_kv_write(bf16 *q, const bf16 *__restrict__ k, const bf16 *__restrict__ v, bf16 *__restrict__ kcache,
                bf16 *__restrict__ vcache, const int32_t *__restrict__ pos, const int32_t *__restrict__ slot,
                int64_t n_slots, int n, int nh, int nkv, int hd, int half, int interleaved,
                const float *__restrict__ inv_freq, const float *__restrict__ qn, const float *__restrict__ kn,
                float eps) {
    static_assert(FAST || !QKN, "k_rope_kv_write: the head norm is the 128-wide form's");
    kc_pdl_trigger();
    kc_pdl_wait();
    const int lane = threadIdx.x & 31;
    const int hh = (int)blockIdx.y * RKV_WARPS + (threadIdx.x >> 5);
    if (hh >= nh + 2 * nkv) return;
    const int t_end = min(n, ((int)blockIdx.x + 1) * RKV_TOKENS);
    for (int t = (int)blockIdx.x * RKV_TOKENS; t < t_end; t++) {
        const float p = (float)__ldcg(pos + t);  // ld.cg: an invariant load may be moved above the wait
        if (hh < nh) {
            bf16 *qh = q + ((size_t)t * nh + hh) * hd;
            if (FAST) {
                __nv_bfloat162 *q2 = (__nv_bfloat162 *)qh;
                __nv_bfloat162 lo = q2[lane], hi = q2[lane + 32];
                if (QKN) head_norm128(qh, qn, eps, lane, lo, hi);
                rope128_pairs(lo, hi, lane, p, inv_freq);
                q2[lane] = lo;
                q2[lane + 32] = hi;
            } else {
                for (int j = lane; j < half; j += 32) rope_pair(qh, j, half, interleaved, p, inv_freq);
            }
            continue;
        }
        const int64_t s = __ldcg(slot + t);
        if (s < 0 || s >= n_slots) continue;
        const int kv = hh - nh;
        const size_t row = (size_t)nkv * hd, off = (size_t)(kv < nkv ? kv : kv - nkv) * hd;
        const bf16 *src = (kv < nkv ? k : v) + (size_t)t * row + off;
        bf16 *dst = (kv < nkv ? kcache : vcache) + (size_t)s * row + off;
        if (FAST) {
            const __nv_bfloat162 *s2 = (const __nv_bfloat162 *)src;
            __nv_bfloat162 *d2 = (__nv_bfloat162 *)dst;
            __nv_bfloat162 lo = s2[lane], hi = s2[lane + 32];
            if (kv < nkv) {
                if (QKN) head_norm128(src, kn, eps, lane, lo, hi);
                rope128_pairs(lo, hi, lane, p, inv_freq);
            }
            d2[lane] = lo;
            d2[lane + 32] = hi;
        } else {
            for (int i = lane; i < hd; i += 32) dst[i] = src[i];
            if (kv >= nkv) continue;
            __syncwarp();
            for (int j = lane; j < half; j += 32) rope_pair(dst, j, half, interleaved, p, inv_freq);
        }
    }
}

void kc_rope_kv_write(kc_backend *b, bf16 *q, const bf16 *k, const bf16 *v, bf16 *kcache,
                      bf16 *vcache, const int32_t *d_pos, const int32_t *d_slot, int64_t n_slots,
                      int n, int nh, int nkv, int hd, int rot_dim, int interleaved, const float *qn,
                      const float *kn, float eps) {
    if (n <= 0) return;
    const dim3 grid((unsigned)((n + RKV_TOKENS - 1) / RKV_TOKENS),
                    (unsigned)((nh + 2 * nkv + RKV_WARPS - 1) / RKV_WARPS));
    const bool fast = hd == 128 && rot_dim == 128 && !interleaved;
    const bool qkn = qn && kn;
    if (qkn && !fast) {
        kc_fail(b, "rope_kv_write: the q / k head norm needs 128-wide heads with full NeoX rotary");
        return;
    }
    kc_launch(b, qkn ? k_rope_kv_write<true, true> : fast ? k_rope_kv_write<true> : k_rope_kv_write<false>, grid,
              dim3(RKV_WARPS * 32), 0, q, k, v, kcache, vcache, d_pos, d_slot, n_slots, n, nh, nkv, hd, rot_dim / 2,
              interleaved, (const float *)b->d_inv_freq, qn, kn, eps);
    kc_launched(b, "rope_kv_write");
}

// ---- DeepSeek MLA: the cache row and the query's rope part ------------------------------------

// One block (256 threads) per token. kva [n, kvl + rd] = [latent | k_pe]: the cache row at the
// token's slot is [RMSNorm(latent) * w | rope(k_pe)]; q [n, nh, hd]: each head's last rd dims
// rotated (rounded to bf16, as the rope op leaves them), times pe_scale, into
// qm [n, nh, kvl + rd] at column kvl. The same arithmetic as copy_strided + rmsnorm + rope +
// kv_write + rope + copy_strided (the norm's sum in k_rmsnorm's order: 8 consecutive elements
// per thread, then block_sum), in one launch.
__global__ void __launch_bounds__(256)
k_mla_prep(const bf16 *__restrict__ kva, const float *__restrict__ w, float eps, const bf16 *__restrict__ q,
           int nh, int hd, float pe_scale, bf16 *__restrict__ qm, bf16 *__restrict__ cache,
           const int32_t *__restrict__ pos, const int32_t *__restrict__ slot, int64_t n_slots, int kvl, int rd,
           int interleaved, const float *__restrict__ inv_freq) {
    __shared__ float red[33];
    kc_pdl_trigger();
    kc_pdl_wait();
    const int t = blockIdx.x, tid = threadIdx.x, row = kvl + rd, half = rd / 2;
    const float p = (float)pos[t];
    const bf16 *xr = kva + (size_t)t * row;
    // q's rope part: no dependence on the norm.
    for (int i = tid; i < nh * half; i += blockDim.x) {
        const int h = i / half, j = i - h * half;
        const bf16 *qh = q + ((size_t)t * nh + h) * hd + (hd - rd);
        const float theta = p * inv_freq[j];
        float sn, cs;
        sincosf(theta, &sn, &cs);
        const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
        const float a = bf(qh[i0]), c = bf(qh[i1]);
        bf16 *o = qm + ((size_t)t * nh + h) * row + kvl;
        o[i0] = tobf(rbf(a * cs - c * sn) * pe_scale);
        o[i1] = tobf(rbf(a * sn + c * cs) * pe_scale);
    }
    const int64_t s = slot[t];
    const bool write = s >= 0 && s < n_slots;
    float ss = 0.f;
    for (int j = tid; j < kvl / 8; j += blockDim.x) {
        const uint4 v = ((const uint4 *)xr)[j];
        const bf16 *e = (const bf16 *)&v;
#pragma unroll
        for (int k = 0; k < 8; k++) ss += bf(e[k]) * bf(e[k]);
    }
    const float r = rsqrtf(kc_block_sum(ss, red) / (float)kvl + eps);
    if (!write) return;
    bf16 *dst = cache + (size_t)s * row;
    for (int j = tid; j < kvl / 8; j += blockDim.x) {
        uint4 v = ((const uint4 *)xr)[j];
        bf16 *e = (bf16 *)&v;
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = tobf(w[8 * j + k] * rbf(bf(e[k]) * r));
        ((uint4 *)dst)[j] = v;
    }
    for (int j = tid; j < half; j += blockDim.x) {
        const float theta = p * inv_freq[j];
        float sn, cs;
        sincosf(theta, &sn, &cs);
        const int i0 = interleaved ? 2 * j : j, i1 = interleaved ? 2 * j + 1 : j + half;
        const float a = bf(xr[kvl + i0]), c = bf(xr[kvl + i1]);
        dst[kvl + i0] = tobf(a * cs - c * sn);
        dst[kvl + i1] = tobf(a * sn + c * cs);
    }
}

void kc_mla_prep(kc_backend *b, const bf16 *kva, const float *w, float eps, const bf16 *q, int nh, int hd,
                 float pe_scale, bf16 *qm, bf16 *cache, const int32_t *d_pos, const int32_t *d_slot, int64_t n_slots,
                 int n, int kvl, int rd, int interleaved) {
    if (n <= 0) return;
    kc_launch(b, k_mla_prep, dim3(n), dim3(256), 0, kva, w, eps, q, nh, hd, pe_scale, qm, cache, d_pos, d_slot,
              n_slots, kvl, rd, interleaved, (const float *)b->d_inv_freq);
    kc_launched(b, "mla_prep");
}

// ---- element-wise --------------------------------------------------------------------------

// out = bf16(bf16(act(g)) * u): the activation is rounded before it multiplies up, as HF's bf16
// act_fn(gate_proj(x)) * up_proj(x) does.
enum { KC_ACT_SILU, KC_ACT_GELU_TANH };

template <int ACT>
static __device__ __forceinline__ float gated(float x, float u) {
    float a;
    if (ACT == KC_ACT_SILU) {
        a = x / (1.f + expf(-x));
    } else {  // gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        a = 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
    return rbf(a) * u;
}

// VEC: 8 elements per step with 16-byte loads and stores (n % 8 == 0, pointers 16-byte
// aligned); the scalar loop read 2 bytes per access and ran at 1.5 TB/s in an 8k prefill.
template <int ACT, bool VEC>
__global__ void k_gated_mul(const bf16 *__restrict__ g, const bf16 *__restrict__ u, size_t n, bf16 *out) {
    const size_t step = (size_t)gridDim.x * blockDim.x;
    if (VEC) {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 8; i += step) {
            const uint4 gv = ((const uint4 *)g)[i], uv = ((const uint4 *)u)[i];
            const bf16 *ge = (const bf16 *)&gv, *ue = (const bf16 *)&uv;
            uint4 ov;
            bf16 *oe = (bf16 *)&ov;
#pragma unroll
            for (int e = 0; e < 8; e++) oe[e] = tobf(gated<ACT>(bf(ge[e]), bf(ue[e])));
            ((uint4 *)out)[i] = ov;
        }
    } else {
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
            out[i] = tobf(gated<ACT>(bf(g[i]), bf(u[i])));
    }
}

template <int ACT>
static void gated_mul(kc_backend *b, const bf16 *g, const bf16 *u, size_t n, bf16 *out, const char *what) {
    if (!n) return;
    const bool vec = n % 8 == 0 && (((uintptr_t)g | (uintptr_t)u | (uintptr_t)out) & 15) == 0;
    size_t blocks = ((vec ? n / 8 : n) + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    if (vec) k_gated_mul<ACT, true><<<(unsigned)blocks, 256, 0, b->stream>>>(g, u, n, out);
    else k_gated_mul<ACT, false><<<(unsigned)blocks, 256, 0, b->stream>>>(g, u, n, out);
    kc_launched(b, what);
}

void kc_silu_mul(kc_backend *b, const bf16 *g, const bf16 *u, size_t n, bf16 *out) {
    gated_mul<KC_ACT_SILU>(b, g, u, n, out, "silu_and_mul");
}

void kc_gelu_tanh_mul(kc_backend *b, const bf16 *g, const bf16 *u, size_t n, bf16 *out) {
    gated_mul<KC_ACT_GELU_TANH>(b, g, u, n, out, "gelu_tanh_and_mul");
}

// x = bf16(x * s) in place (Gemma's embeddings times sqrt(hidden)).
__global__ void k_scale(bf16 *x, size_t n, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = tobf(bf(x[i]) * s);
}

void kc_scale(kc_backend *b, bf16 *x, size_t n, float s) {
    if (!n) return;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    k_scale<<<(unsigned)blocks, 256, 0, b->stream>>>(x, n, s);
    kc_launched(b, "scale");
}

// logits = cap * tanh(logits / cap), f32 in place.
__global__ void k_softcap(float *x, size_t n, float cap) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

void kc_softcap(kc_backend *b, float *x, size_t n, float cap) {
    if (!n) return;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    k_softcap<<<(unsigned)blocks, 256, 0, b->stream>>>(x, n, cap);
    kc_launched(b, "softcap");
}

__global__ void k_add_bias(bf16 *y, const float *__restrict__ bias, size_t total, int out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = tobf(bf(y[i]) + bias[i % out]);
}

void kc_add_bias(kc_backend *b, bf16 *y, const float *bias, int n, int out) {
    size_t total = (size_t)n * out;
    if (!total) return;
    size_t blocks = (total + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    k_add_bias<<<(unsigned)blocks, 256, 0, b->stream>>>(y, bias, total, out);
    kc_launched(b, "bias");
}

// ---- random fill (dummy weights) ----------------------------------------------------------

static __device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void k_fill_uniform(void *dst, int is_f32, size_t n, kc_fill_at at, uint64_t seed, float scale,
                               float offset) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t r = splitmix64(seed * 0x632BE59BD9B4E019ull + kc_fill_index(at, i));
        const float u = (float)(r >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;  // [-1, 1)
        const float v = offset + scale * u;
        if (is_f32) ((float *)dst)[i] = v;
        else ((bf16 *)dst)[i] = tobf(v);
    }
}

void kc_fill_uniform(kc_backend *b, void *dst, int is_f32, size_t n, kc_fill_at at, uint64_t seed, float scale,
                     float offset) {
    if (!n) return;
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535 * 8) blocks = 65535 * 8;
    k_fill_uniform<<<(unsigned)blocks, 256, 0, b->stream>>>(dst, is_f32, n, at, seed, scale, offset);
    kc_launched(b, "fill");
}

// ---- weight conversion at load --------------------------------------------------------------

static __device__ __forceinline__ float h2f(uint16_t h) {
    __half x;
    memcpy(&x, &h, 2);
    return __half2float(x);
}

static __device__ __forceinline__ void put(void *dst, int f32, size_t i, float v) {
    if (f32) ((float *)dst)[i] = v;
    else ((bf16 *)dst)[i] = tobf(v);
}

// Plain floats: one thread per element.
__global__ void k_convert_plain(int src_t, const void *src, size_t n, void *dst, int f32) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v;
        if (src_t == KAON_F32) v = ((const float *)src)[i];
        else if (src_t == KAON_F16) v = h2f(((const uint16_t *)src)[i]);
        else v = bf(((const bf16 *)src)[i]);
        put(dst, f32, i, v);
    }
}

// GGUF blocks: one thread per 32 values (chunk c of the tensor: block c * 32 / be, bytes bb a
// block), dequantized as the gguf package does it (quant_blocks.h). Rows are whole blocks, so
// the flat order is the row-major order.
__global__ void k_convert_blocks(int t, const uint8_t *__restrict__ src, int be, int bb, size_t n_chunks,
                                 void *dst, int f32) {
    for (size_t ci = (size_t)blockIdx.x * blockDim.x + threadIdx.x; ci < n_chunks;
         ci += (size_t)gridDim.x * blockDim.x) {
        float v[32];
        const size_t per = (size_t)(be / 32);
        kaon_qb_dequant32((kaon_dtype)t, src + ci / per * (size_t)bb, (int)(ci % per), v);
        for (int e = 0; e < 32; e++) put(dst, f32, ci * 32 + e, v[e]);
    }
}

int kc_convert(kc_backend *b, kaon_dtype t, const void *src, int64_t rows, int64_t cols, void *dst,
               int dst_f32) {
    const size_t n = (size_t)rows * (size_t)cols;
    if (!n) return 0;
    if (t == KAON_F32 || t == KAON_F16 || t == KAON_BF16) {
        size_t blocks = (n + 255) / 256;
        if (blocks > 65535 * 8) blocks = 65535 * 8;
        k_convert_plain<<<(unsigned)blocks, 256, 0, b->stream>>>((int)t, src, n, dst, dst_f32);
        return kc_launched(b, "convert");
    }
    const int qk = kaon_dtype_block_elems(t), bb = kaon_dtype_block_bytes(t);
    if (!kaon_qb_known(t))
        return kc_fail(b, "cuda: weights of type %s are not supported", kaon_dtype_name(t));
    if (n % (size_t)qk) return kc_fail(b, "cuda: %s tensor is not whole blocks", kaon_dtype_name(t));
    const size_t nc = n / 32;
    size_t blocks = (nc + 127) / 128;
    if (blocks > 65535 * 8) blocks = 65535 * 8;
    k_convert_blocks<<<(unsigned)blocks, 128, 0, b->stream>>>((int)t, (const uint8_t *)src, qk, bb, nc, dst, dst_f32);
    return kc_launched(b, "dequantize");
}
