// Paged causal attention with GQA on the GPU, one kernel for decode and prefill.
//
// A block serves one query token t and one KV head: the g = n_heads / n_kv_heads query heads
// that share it. It walks t's keys 0..positions[t] (or the last `window` of them) through the
// block table in tiles of 128 (one key per thread: its K row read with 16-byte loads, its g
// scores against the q vectors held in shared memory), folds each tile into a running max /
// sum per head (online softmax), and accumulates P V with each thread owning a pair of output
// dims for some heads.
//
// Short batches (decode) do not fill the GPU with (token, kv head) blocks, so the context is
// split: blockIdx.z takes one of S contiguous ranges of keys and writes an unnormalised
// partial (acc, max, sum); the last block of a (token, kv head) to arrive (an atomic counter)
// merges the S partials and resets the counter. The number of ranges in use is derived from
// each token's own length inside the kernel, so one launch shape (and one CUDA graph) serves
// every context length.
//
// The kernel is a template on the cache element: bf16, or FP8 e4m3 bytes (an FP8 cache; the
// layer's k_scale is folded into the score scale, v_scale into the output, so the loads only
// widen e4m3 to float). An FP8 cache takes the same path as bf16: prefill runs on the tensor-core
// prefill kernel's FP8 instances (hd 64/128; KAON_FA_FP8=0 turns them off), the other tokens on
// the decode kernels (templated the same way), this one where they have no instance.
#include "backend/cuda/cuda_internal.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ATT_THREADS 128
#define ATT_TILE 128  // keys per tile: one per thread
#define ATT_MAXG 16   // query heads per KV head
#define ATT_MAXJ 8    // heads one thread accumulates in P V
#define ATT_MIN_CHUNK 32  // keys per context range at least (short ranges: short load chains)
#define ATT_MAX_SPLITS 64

static __device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }

// Cache elements d8*8 .. d8*8+7 of a row as floats (16-byte loads for bf16, 8-byte for e4m3).
static __device__ __forceinline__ void load8(const bf16 *r, int d8, float *f) {
    const uint4 kv = ((const uint4 *)r)[d8];
    const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&kv;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 x = __bfloat1622float2(k2[e]);
        f[2 * e] = x.x;
        f[2 * e + 1] = x.y;
    }
}
static __device__ __forceinline__ float2 e4m3x2(__nv_fp8x2_storage_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);  // exact: e4m3 fits in f16
    return __half22float2(*(const __half2 *)&h);
}
static __device__ __forceinline__ void load8(const uint8_t *r, int d8, float *f) {
    const uint2 kv = ((const uint2 *)r)[d8];
    const __nv_fp8x2_storage_t *k2 = (const __nv_fp8x2_storage_t *)&kv;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float2 x = e4m3x2(k2[e]);
        f[2 * e] = x.x;
        f[2 * e + 1] = x.y;
    }
}
// Elements 2i, 2i+1 of a row.
static __device__ __forceinline__ float2 load2(const bf16 *r, size_t i) {
    return __bfloat1622float2(((const __nv_bfloat162 *)r)[i]);
}
static __device__ __forceinline__ float2 load2(const uint8_t *r, size_t i) {
    return e4m3x2(((const __nv_fp8x2_storage_t *)r)[i]);
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// grid (n_tokens, n_kv_heads, S); dynamic shared memory: see att_smem_bytes. KT: the cache
// element (bf16, or uint8_t e4m3 codes); vs multiplies the output (1 for bf16: exact).
template <typename KT>
__global__ void __launch_bounds__(ATT_THREADS)
k_attention(const bf16 *__restrict__ q, const KT *__restrict__ kcache,
            const KT *__restrict__ vcache, const int32_t *__restrict__ pos,
            const int32_t *__restrict__ seq, const int32_t *__restrict__ tables, int n_seqs,
            int max_blocks, int bs, int64_t n_slots, int nh, int nkv, int hd, float scale, float vs, int window,
            bf16 *__restrict__ out, float *__restrict__ part, unsigned *__restrict__ count) {
    extern __shared__ float sm[];
    __shared__ int last_flag;
    kc_pdl_trigger();  // the o projection may start loading its weights
    const int g = nh / nkv;
    float *q_s = sm;                       // [g, hd]
    float *p_s = q_s + g * hd;             // [g, TILE] scores, then probabilities
    float *m_s = p_s + g * ATT_TILE;       // [g] running max
    float *l_s = m_s + g;                  // [g] running sum
    float *a_s = l_s + g;                  // [g] this tile's rescale factor
    int *slot_s = (int *)(a_s + g);        // [TILE] cache slot of each key of the tile

    const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int p = pos[t], sq = seq[t];
    const bool ok = p >= 0 && sq >= 0 && sq < n_seqs && p / bs < max_blocks;
    // Keys lo..p: lo = p - window + 1 in a sliding window (HF: kv_idx > q_idx - window). The
    // ranges split only those.
    const int lo = ok && window > 0 && p >= window ? p - window + 1 : 0;
    const int len = ok ? p + 1 - lo : 1;
    const int n_act = min(S, (len + ATT_MIN_CHUNK - 1) / ATT_MIN_CHUNK);
    if (z >= n_act) return;
    const int chunk = (len + n_act - 1) / n_act;
    const int r0 = min(len, z * chunk);
    const int k0 = lo + r0, k1 = ok ? lo + min(len, r0 + chunk) : 0;
    const int32_t *bt = tables + (size_t)(ok ? sq : 0) * max_blocks;
    const size_t row = (size_t)nkv * hd;

    const bf16 *qt = q + ((size_t)t * nh + (size_t)kvh * g) * hd;
    for (int i = tid; i < g * hd; i += ATT_THREADS) q_s[i] = bf(qt[i]);
    if (tid < g) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.f;
    }
    // P V work split: thread -> (pair of dims dp, heads hg, hg + hsplit, ...).
    const int npairs = hd / 2, hsplit = ATT_THREADS / npairs;
    const int dp = tid % npairs, hg = tid / npairs;
    const bool pv = hg < hsplit;
    float2 acc[ATT_MAXJ];
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) acc[j] = make_float2(0.f, 0.f);
    __syncthreads();

    for (int base = k0; base < k1; base += ATT_TILE) {
        // Scores of this thread's key against the g heads.
        const int kk = base + tid;
        int slot = -1;
        if (kk < k1) {
            const int blk = bt[kk / bs];
            const int64_t s64 = (int64_t)blk * bs + kk % bs;
            if (blk >= 0 && s64 < n_slots) slot = (int)s64;
        }
        slot_s[tid] = slot;
        if (slot >= 0) {
            float s[ATT_MAXG];
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++) s[h] = 0.f;
            const KT *kr = kcache + (size_t)slot * row + (size_t)kvh * hd;
            // Unrolled so that several of the row's loads are in flight at once.
#pragma unroll 8
            for (int d8 = 0; d8 < hd / 8; d8++) {
                float kf[8];
                load8(kr, d8, kf);
#pragma unroll
                for (int h = 0; h < ATT_MAXG; h++) {
                    if (h < g) {
                        const float4 a = *(const float4 *)(q_s + h * hd + d8 * 8);
                        const float4 c = *(const float4 *)(q_s + h * hd + d8 * 8 + 4);
                        s[h] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] +
                                c.x * kf[4] + c.y * kf[5] + c.z * kf[6] + c.w * kf[7];
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < ATT_MAXG; h++)
                if (h < g) p_s[h * ATT_TILE + tid] = s[h] * scale;
        } else {
            for (int h = 0; h < g; h++) p_s[h * ATT_TILE + tid] = -INFINITY;
        }
        __syncthreads();
        // Online softmax per head: one warp per head.
        for (int h = warp; h < g; h += ATT_THREADS / 32) {
            float v[ATT_TILE / 32];
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < ATT_TILE / 32; i++) {
                v[i] = p_s[h * ATT_TILE + lane + 32 * i];
                mx = fmaxf(mx, v[i]);
            }
            mx = warp_max(mx);
            const float mold = m_s[h], mnew = fmaxf(mold, mx);
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < ATT_TILE / 32; i++) {
                const float e = v[i] == -INFINITY ? 0.f : __expf(v[i] - mnew);
                p_s[h * ATT_TILE + lane + 32 * i] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float alpha = mold == -INFINITY ? 0.f : __expf(mold - mnew);
                a_s[h] = alpha;
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = mnew;
            }
        }
        __syncthreads();
        if (pv) {
            const int nk = min(ATT_TILE, k1 - base);
#pragma unroll
            for (int j = 0; j < ATT_MAXJ; j++) {
                const int h = hg + j * hsplit;
                if (h < g) {
                    acc[j].x *= a_s[h];
                    acc[j].y *= a_s[h];
                }
            }
            // V rows in groups of 16 keys, all loads of a group issued before the first use
            // (one load at a time would make every key a round trip to memory).
            const KT *vbase = vcache + (size_t)kvh * hd;
            for (int k0 = 0; k0 < nk; k0 += 16) {
                float2 vv[16];
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    const int sl = k0 + u < nk ? slot_s[k0 + u] : -1;
                    vv[u] = sl >= 0 ? load2(vbase + (size_t)sl * row, (size_t)dp) : make_float2(0.f, 0.f);
                }
                // Keys past nk have probability 0 (and vv 0): no bound check needed (TILE % 16 == 0).
#pragma unroll
                for (int u = 0; u < 16; u++) {
#pragma unroll
                    for (int j = 0; j < ATT_MAXJ; j++) {
                        const int h = hg + j * hsplit;
                        if (h < g) {
                            const float pk = p_s[h * ATT_TILE + k0 + u];
                            acc[j].x += pk * vv[u].x;
                            acc[j].y += pk * vv[u].y;
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

    if (S == 1) {
        if (pv) {
#pragma unroll
            for (int j = 0; j < ATT_MAXJ; j++) {
                const int h = hg + j * hsplit;
                if (h < g) {
                    const float inv = l_s[h] > 0.f ? vs / l_s[h] : 0.f;
                    ((__nv_bfloat162 *)(out + ((size_t)t * nh + (size_t)kvh * g + h) * hd))[dp] =
                        __floats2bfloat162_rn(acc[j].x * inv, acc[j].y * inv);
                }
            }
        }
        return;
    }
    // Partial of range z: [t, head, z, hd + 2] = acc (unnormalised), max, sum.
    const size_t stride = (size_t)hd + 2;
    if (pv) {
#pragma unroll
        for (int j = 0; j < ATT_MAXJ; j++) {
            const int h = hg + j * hsplit;
            if (h < g) {
                float *pp = part + (((size_t)t * nh + (size_t)kvh * g + h) * S + z) * stride;
                pp[2 * dp] = acc[j].x * vs;
                pp[2 * dp + 1] = acc[j].y * vs;
            }
        }
    }
    if (tid < g) {
        float *pp = part + (((size_t)t * nh + (size_t)kvh * g + tid) * S + z) * stride;
        pp[hd] = m_s[tid];
        pp[hd + 1] = l_s[tid];
    }
    __threadfence();
    __syncthreads();
    unsigned *cnt = count + (size_t)t * nkv + kvh;
    if (tid == 0) last_flag = atomicAdd(cnt, 1u) == (unsigned)(n_act - 1);
    __syncthreads();
    if (!last_flag) return;
    __threadfence();
    // Merge: one warp per head turns the ranges' (max, sum) into weights exp(m_z - M) / L
    // (p_s is free now), then every thread sums a pair of output dims over the ranges with
    // independent loads (a chain of dependent L2 loads here cost ~25 us per layer).
    float *w_s = p_s;  // [g, ATT_MAX_SPLITS]
    for (int h = warp; h < g; h += ATT_THREADS / 32) {
        const float *pb = part + ((size_t)t * nh + (size_t)kvh * g + h) * S * stride;
        const float m0 = lane < n_act ? __ldcg(pb + lane * stride + hd) : -INFINITY;
        const float m1 = lane + 32 < n_act ? __ldcg(pb + (lane + 32) * stride + hd) : -INFINITY;
        const float M = warp_max(fmaxf(m0, m1));
        const float e0 = m0 == -INFINITY ? 0.f : __expf(m0 - M);
        const float e1 = m1 == -INFINITY ? 0.f : __expf(m1 - M);
        const float l0 = lane < n_act ? __ldcg(pb + lane * stride + hd + 1) : 0.f;
        const float l1 = lane + 32 < n_act ? __ldcg(pb + (lane + 32) * stride + hd + 1) : 0.f;
        const float L = warp_sum(e0 * l0 + e1 * l1);
        const float inv = L > 0.f ? 1.f / L : 0.f;
        if (lane < n_act) w_s[h * ATT_MAX_SPLITS + lane] = e0 * inv;
        if (lane + 32 < n_act) w_s[h * ATT_MAX_SPLITS + lane + 32] = e1 * inv;
    }
    __syncthreads();
    for (int i = tid; i < g * (hd / 2); i += ATT_THREADS) {
        const int h = i / (hd / 2), d2 = i % (hd / 2);
        const float *pb = part + ((size_t)t * nh + (size_t)kvh * g + h) * S * stride;
        const float *wh = w_s + h * ATT_MAX_SPLITS;
        float2 o = make_float2(0.f, 0.f);
#pragma unroll 8
        for (int zz = 0; zz < n_act; zz++) {
            const float2 v = __ldcg((const float2 *)(pb + zz * stride) + d2);
            o.x = fmaf(wh[zz], v.x, o.x);
            o.y = fmaf(wh[zz], v.y, o.y);
        }
        ((__nv_bfloat162 *)(out + ((size_t)t * nh + (size_t)kvh * g + h) * hd))[d2] = __floats2bfloat162_rn(o.x, o.y);
    }
    if (tid == 0) *cnt = 0u;
}

static size_t att_smem_bytes(int g, int hd) {
    return sizeof(float) * ((size_t)g * hd + (size_t)g * ATT_TILE + 3 * (size_t)g) +
           sizeof(int) * ATT_TILE;
}

// KAON_DECODE_ATTN=0: the split-K kernel for every token outside prefill runs (tests, A/B).
static bool decode_off(void) {
    static const bool off = kc_env_off("KAON_DECODE_ATTN");
    return off;
}

int kc_attention_init(kc_backend *b) {
    (void)b;
    return 0;
}

// The split-K kernel for the tokens of d_pos (those at a negative position get zeros).
template <typename KT>
static int launch_split(kc_backend *b, const bf16 *q, const KT *kcache, const KT *vcache, const kaon_attn_meta *m,
                        int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq, const int32_t *d_tab, int nh,
                        int nkv, int hd, float scale, float vs, int window, bf16 *out) {
    const int T = m->n_tokens, g = nh / nkv;
    // Enough (token, kv head, range) blocks for two waves of the GPU; the ranges in use
    // shrink with the context inside the kernel.
    int64_t want = (2LL * b->n_sm + (int64_t)T * nkv - 1) / ((int64_t)T * nkv);
    int S = want > ATT_MAX_SPLITS ? ATT_MAX_SPLITS : (int)want;
    if (S < 1) S = 1;
    if (S > 1) {
        const size_t need_part = (size_t)T * nh * S * ((size_t)hd + 2);
        if (kc_grow(b, (void **)&b->attn_part, &b->attn_part_cap, need_part, sizeof(float), "attention partials") ||
            kc_grow(b, (void **)&b->attn_count, &b->attn_count_cap, (size_t)T * nkv, sizeof(unsigned), "attention counters"))
            return -1;
    }
    const size_t smem = att_smem_bytes(g, hd);
    dim3 grid((unsigned)T, (unsigned)nkv, (unsigned)S);
    k_attention<KT><<<grid, ATT_THREADS, smem, b->stream>>>(q, kcache, vcache, d_pos, d_seq, d_tab, m->n_seqs,
                                                            m->max_blocks, m->block_size, n_slots, nh, nkv, hd,
                                                            scale, vs, window, out, b->attn_part, b->attn_count);
    return kc_launched(b, "attention") ? -1 : 0;
}

// Shapes the split-K kernel takes, and the step's index arrays on the device.
static int att_check(kc_backend *b, const kaon_attn_meta *m, int nh, int nkv, int hd, const int32_t **d_pos,
                     const int32_t **d_seq, const int32_t **d_tab) {
    const int T = m->n_tokens;
    if (nkv <= 0 || nh % nkv || hd % 8 || hd > 256 || hd < 8)
        return kc_fail(b, "cuda attention: unsupported heads %d/%d, head_dim %d", nh, nkv, hd);
    const int g = nh / nkv, hsplit = ATT_THREADS / (hd / 2);
    if (g > ATT_MAXG || (g + hsplit - 1) / hsplit > ATT_MAXJ)
        return kc_fail(b, "cuda attention: %d query heads per KV head with head_dim %d is not supported", g, hd);
    if (m->n_seqs <= 0 || m->max_blocks <= 0 || m->block_size <= 0)
        return kc_fail(b, "cuda attention: bad metadata");
    *d_pos = kc_dev_i32(b, m->positions, (size_t)T);
    *d_seq = kc_dev_i32(b, m->token_seq, (size_t)T);
    *d_tab = kc_dev_i32(b, m->block_tables, (size_t)m->n_seqs * m->max_blocks);
    return *d_pos && *d_seq && *d_tab ? 0 : -1;
}

int kc_attention(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache,
                 const kaon_attn_meta *m, int64_t n_slots, int nh, int nkv, int hd, float scale,
                 int window, bf16 *out) {
    const int T = m->n_tokens;
    if (T <= 0) return 0;
    const int32_t *d_pos, *d_seq, *d_tab;
    if (att_check(b, m, nh, nkv, hd, &d_pos, &d_seq, &d_tab)) return -1;
    // Runs of prefill tokens go to the tensor-core kernel (cuda_attention_prefill.cu), launched
    // after this one: this one sees their positions marked invalid and writes zeros there.
    const int32_t *d_pos_rest = d_pos;
    const int fa = kc_attention_prefill_plan(b, m, nh, nkv, hd, scale, d_pos, d_seq, &d_pos_rest);
    if (fa < 0) return -1;
    // The streaming kernel (cuda_attention_decode.cu) where it has an instance; else this one.
    const int dec = decode_off()
                        ? 1
                        : kc_attention_decode(b, q, kcache, vcache, m, n_slots, d_pos_rest, d_seq, d_tab, nh, nkv,
                                              hd, scale, window, out);
    if (dec < 0) return -1;
    if (dec == 0)
        return fa ? kc_attention_prefill(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, scale,
                                         window, out)
                  : 0;
    if (launch_split<bf16>(b, q, kcache, vcache, m, n_slots, d_pos_rest, d_seq, d_tab, nh, nkv, hd, scale, 1.0f,
                           window, out))
        return -1;
    return fa ? kc_attention_prefill(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, scale,
                                     window, out)
              : 0;
}

int kc_attention_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                     const kaon_attn_meta *m, int64_t n_slots, int nh, int nkv, int hd, float scale, float k_scale,
                     float v_scale, int window, bf16 *out) {
    if (m->n_tokens <= 0) return 0;
    const int32_t *d_pos, *d_seq, *d_tab;
    if (att_check(b, m, nh, nkv, hd, &d_pos, &d_seq, &d_tab)) return -1;
    // As kc_attention: prefill runs on the tensor-core kernel over the codes (hd 64 / 128; else,
    // or KAON_FA_FP8=0, the plan leaves every token to the kernels below), launched last.
    const int32_t *d_pos_rest = d_pos;
    const int fa = kc_attention_prefill_plan_fp8(b, m, nh, nkv, hd, scale, d_pos, d_seq, &d_pos_rest);
    if (fa < 0) return -1;
    const int dec = decode_off()
                        ? 1
                        : kc_attention_decode_fp8(b, q, kcache, vcache, m, n_slots, d_pos_rest, d_seq, d_tab, nh,
                                                  nkv, hd, scale, k_scale, v_scale, window, out);
    if (dec < 0) return -1;
    if (dec == 1 && launch_split<uint8_t>(b, q, kcache, vcache, m, n_slots, d_pos_rest, d_seq, d_tab, nh, nkv, hd,
                                          scale * k_scale, v_scale, window, out))
        return -1;
    return fa ? kc_attention_prefill_fp8(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, scale,
                                         k_scale, v_scale, window, out)
              : 0;
}
