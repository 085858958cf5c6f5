// Paged attention for decode tokens (and any token outside a prefill run), built to stream the
// KV cache at the memory's rate.
//
// A block of W warps (4; 8 when a launch has at most 4 tokens) serves one token, one KV head
// (all G query heads that share it) and one range of the token's keys. Warps take chunks of 16
// keys in turn and keep their own online softmax, so no block-wide barrier sits inside the loop.
// In a chunk, HD/8 lanes read one key's K row with 16-byte loads (every load instruction
// covers whole rows: coalesced), each lane dots its 8 dims with the G query vectors it holds
// in registers, and shuffles sum the row;
// then each lane reads its HD/32 dims of the 16 V rows (all loads issued before the first use)
// and accumulates with the chunk's probabilities, read back from shared memory. The W warps
// merge at the end; a long context is split over blocks (z) whose partials the last block to
// finish merges. Scores are kept in log2 units (exp2). In a sliding window the keys are the
// last `window` up to the token's own (HF: kv_idx > q_idx - window) and only those are split.
//
// The kernel is a template on the cache element too: bf16, or e4m3 bytes of an FP8 cache
// (half the bytes per load; k_scale is folded into the query scale, v_scale into the output).
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_attention_decode.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEC_WARPS 4       // warps per block (8 for a few tokens: DEC_FEW_TOKENS)
#define DEC_CHUNK 16      // keys per warp per step
#define DEC_MIN_KEYS 64   // keys per range at least (KAON_DEC_MIN_KEYS, 16..4096, for experiments)

static __device__ __forceinline__ float bfv(bf16 x) { return __bfloat162float(x); }

template <int BYTES>
struct DecVec;  // BYTES of one V row, loaded at once
template <>
struct DecVec<2> {
    typedef unsigned short T;
};
template <>
struct DecVec<4> {
    typedef unsigned int T;
};
template <>
struct DecVec<8> {
    typedef uint2 T;
};
template <>
struct DecVec<16> {
    typedef uint4 T;
};

// The cache element: K8 holds 8 elements of a K row (one lane's load), k8 widens them, v widens
// N elements of a V row.
template <typename KT>
struct DecElem;
template <>
struct DecElem<bf16> {
    typedef uint4 K8;
    static __device__ __forceinline__ void k8(const K8 &v, float *f) {
        const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&v;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 x = __bfloat1622float2(k2[e]);
            f[2 * e] = x.x;
            f[2 * e + 1] = x.y;
        }
    }
    template <int N>
    static __device__ __forceinline__ void v(const void *p, float *f) {
        const bf16 *ve = (const bf16 *)p;
#pragma unroll
        for (int d = 0; d < N; d++) f[d] = __bfloat162float(ve[d]);
    }
};
static __device__ __forceinline__ float2 dec_e4m3x2(__nv_fp8x2_storage_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);  // exact: e4m3 fits in f16
    return __half22float2(*(const __half2 *)&h);
}
template <>
struct DecElem<uint8_t> {
    typedef uint2 K8;
    static __device__ __forceinline__ void k8(const K8 &v, float *f) {
        const __nv_fp8x2_storage_t *k2 = (const __nv_fp8x2_storage_t *)&v;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 x = dec_e4m3x2(k2[e]);
            f[2 * e] = x.x;
            f[2 * e + 1] = x.y;
        }
    }
    template <int N>
    static __device__ __forceinline__ void v(const void *p, float *f) {
        const __nv_fp8x2_storage_t *ve = (const __nv_fp8x2_storage_t *)p;
#pragma unroll
        for (int d = 0; d < N / 2; d++) {
            const float2 x = dec_e4m3x2(ve[d]);
            f[2 * d] = x.x;
            f[2 * d + 1] = x.y;
        }
    }
};

// V rows are loaded after the scores. (A variant that requested them, and the next chunk's
// slots, together with the K rows measured 8% slower at 256 sequences in flight and no faster
// at batch 1 on the H200, 2026-12-01; it was removed with its KAON_DECODE_PREFETCH switch.)
// vs multiplies the output (1 for a bf16 cache: exact).
template <int HD, int G, typename KT, int W>
__global__ void __launch_bounds__(W * 32)
k_decode_attn(const bf16 *__restrict__ q, const KT *__restrict__ kcache, const KT *__restrict__ vcache,
              const int32_t *__restrict__ pos, const int32_t *__restrict__ seq,
              const int32_t *__restrict__ tables, int n_seqs, int max_blocks, int bs, int64_t n_slots,
              int nh, int nkv, int g, float qscale, float vs, int window, int min_keys, int prefetch,
              bf16 *__restrict__ out, float *__restrict__ part, unsigned *__restrict__ count) {
    constexpr int LPK = HD / 8;       // lanes per K row
    constexpr int KPI = 32 / LPK;     // keys per load instruction
    constexpr int NI = DEC_CHUNK / KPI;
    constexpr int DPL = HD / 32;      // V dims per lane
    typedef typename DecVec<DPL * (int)sizeof(KT)>::T vec_t;
    typedef typename DecElem<KT>::K8 k8_t;
    __shared__ float p_s[W][DEC_CHUNK][G];
    __shared__ float wm[W][G], wl[W][G];
    __shared__ float wacc[W][G][HD];
    __shared__ float w_s[G][DEC_MAX_SPLITS];
    __shared__ int last_flag;
    kc_pdl_trigger();

    // The range's bounds come from the step's metadata, readable before the wait.
    const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const DecRange rg = dec_range(pos, seq, tables, t, z, S, n_seqs, max_blocks, bs, window, min_keys);
    const int n_act = rg.n_act, k0 = rg.k0, k1 = rg.k1;
    const int32_t *bt = rg.bt;
    const size_t row = (size_t)nkv * HD;
    const KT *kbase = kcache + (size_t)kvh * HD, *vbase = vcache + (size_t)kvh * HD;
    // A few tokens (batch-1 decode): the range's K and V rows are pulled into L2 while the
    // kernels before finish, so the loads after the wait are L2 hits. (A row this step writes
    // may be fetched stale; the loads below read it again after the wait, and L2 is coherent.)
    if (prefetch && z < n_act)
        for (int kk = k0 + tid; kk < k1; kk += W * 32) {
            const int blk = ld_meta(bt + kk / bs);
            const int64_t s64 = (int64_t)blk * bs + kk % bs;
            if (blk < 0 || s64 >= n_slots) continue;
#pragma unroll
            for (int o = 0; o < HD * (int)sizeof(KT); o += 128) {
                prefetch_l2((const char *)(kbase + (size_t)s64 * row) + o);
                prefetch_l2((const char *)(vbase + (size_t)s64 * row) + o);
            }
        }
    kc_pdl_wait();  // every block waits, also an idle range (kc_pdl_wait's rule)
    if (z >= n_act) return;
    const int sub = lane % LPK, kin = lane / LPK;

    float qr[G][8];
#pragma unroll
    for (int h = 0; h < G; h++) {
        if (h < g) {
            const uint4 qv = *(const uint4 *)(q + ((size_t)t * nh + (size_t)kvh * g + h) * HD + sub * 8);
            const bf16 *qe = (const bf16 *)&qv;
#pragma unroll
            for (int e = 0; e < 8; e++) qr[h][e] = bfv(qe[e]) * qscale;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) qr[h][e] = 0.f;
        }
    }
    float m[G], l[G], acc[G][DPL];
#pragma unroll
    for (int h = 0; h < G; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[h][d] = 0.f;
    }

    // Lane j < 16 holds the cache slot of key c0 + j; the next chunk's slots are looked up
    // while this chunk's K and V rows (all requested at once) are on their way.
    auto slot_of = [&](int c) {
        int sl = -1;
        if (lane < DEC_CHUNK && c + lane < k1) {
            const int kk = c + lane;
            const int blk = bt[kk / bs];
            const int64_t s64 = (int64_t)blk * bs + kk % bs;
            if (blk >= 0 && s64 < n_slots) sl = (int)s64;
        }
        return sl;
    };
    int next_slot = slot_of(k0 + warp * DEC_CHUNK);
    for (int c0 = k0 + warp * DEC_CHUNK; c0 < k1; c0 += W * DEC_CHUNK) {
        const int myslot = next_slot;
        k8_t kv[NI];
        int ks[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            ks[i] = __shfl_sync(0xffffffffu, myslot, i * KPI + kin);
            kv[i] = ks[i] >= 0 ? *(const k8_t *)(kbase + (size_t)ks[i] * row + sub * 8) : k8_t();
        }
        vec_t vv[DEC_CHUNK];
        float s[NI][G];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            float kf[8];
            DecElem<KT>::k8(kv[i], kf);
#pragma unroll
            for (int h = 0; h < G; h++) {
                float a = 0.f;
#pragma unroll
                for (int e = 0; e < 8; e++) a = fmaf(qr[h][e], kf[e], a);
#pragma unroll
                for (int o = LPK / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
                s[i][h] = ks[i] >= 0 ? a : -INFINITY;
            }
        }
        // Online softmax over the chunk, per head (every lane ends with the same m, l).
#pragma unroll
        for (int h = 0; h < G; h++) {
            float mc = -INFINITY;
#pragma unroll
            for (int i = 0; i < NI; i++) mc = fmaxf(mc, s[i][h]);
#pragma unroll
            for (int o = LPK; o < 32; o <<= 1) mc = fmaxf(mc, __shfl_xor_sync(0xffffffffu, mc, o));
            const float mn = fmaxf(m[h], mc);
            const float alpha = m[h] == -INFINITY ? 0.f : exp2f(m[h] - mn);
            float ps = 0.f;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const float e = s[i][h] == -INFINITY ? 0.f : exp2f(s[i][h] - mn);
                s[i][h] = e;
                ps += e;
            }
#pragma unroll
            for (int o = LPK; o < 32; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
            l[h] = l[h] * alpha + ps;
            m[h] = mn;
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[h][d] *= alpha;
        }
        if (sub == 0) {
#pragma unroll
            for (int i = 0; i < NI; i++)
#pragma unroll
                for (int h = 0; h < G; h++) p_s[warp][i * KPI + kin][h] = s[i][h];
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < DEC_CHUNK; j++) {
            const int sl = __shfl_sync(0xffffffffu, myslot, j);
            if (sl >= 0) vv[j] = *(const vec_t *)(vbase + (size_t)sl * row + lane * DPL);
            else vv[j] = vec_t();
        }
        next_slot = slot_of(c0 + W * DEC_CHUNK);
#pragma unroll
        for (int j = 0; j < DEC_CHUNK; j++) {
            float vf[DPL];
            DecElem<KT>::template v<DPL>(&vv[j], vf);
#pragma unroll
            for (int h = 0; h < G; h++) {
                const float pj = p_s[warp][j][h];
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[h][d] = fmaf(pj, vf[d], acc[h][d]);
            }
        }
        __syncwarp();
    }

    // Merge the warps.
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < G; h++) {
            wm[warp][h] = m[h];
            wl[warp][h] = l[h];
        }
    }
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int d = 0; d < DPL; d++) wacc[warp][h][lane * DPL + d] = acc[h][d];
    __syncthreads();
    dec_finish<HD, G, W>(&wm[0][0], &wl[0][0], &wacc[0][0][0], &w_s[0][0], &last_flag, t, t, kvh, z, S, n_act, nh, nkv,
                         g, vs, out, part, count);
}

template <int HD, int G, typename KT>
static void launch(kc_backend *b, dim3 grid, const bf16 *q, const KT *kc_, const KT *vc,
                   const int32_t *pos, const int32_t *seq, const int32_t *tab, const kaon_attn_meta *m,
                   int64_t n_slots, int nh, int nkv, int g, float qscale, float vs, int window, bf16 *out) {
    // A few tokens (batch-1 decode): 8 warps over 128-key ranges, one pass over short contexts
    // with no partial merge (Llama-8B b1 +1.9%); many tokens: 4 warps (8 at 64 sequences in
    // flight cost 23%: fewer blocks resident). KAON_DEC_WARPS / KAON_DEC_MIN_KEYS override.
    const bool few = grid.x <= DEC_FEW_TOKENS;
    static const int mk_env = getenv("KAON_DEC_MIN_KEYS") ? atoi(getenv("KAON_DEC_MIN_KEYS")) : 0;
    const int min_keys = mk_env >= 16 && mk_env <= 4096 ? mk_env : few ? 2 * DEC_MIN_KEYS : DEC_MIN_KEYS;
    static const int w_env = getenv("KAON_DEC_WARPS") ? atoi(getenv("KAON_DEC_WARPS")) : 0;
    // L2 prefetch before the wait for a few tokens only (KAON_DEC_PREFETCH=0: off, for A/B).
    static const int pf_env = getenv("KAON_DEC_PREFETCH") ? atoi(getenv("KAON_DEC_PREFETCH")) : 1;
    const int prefetch = few && pf_env != 0;
    if (w_env == 8 || (w_env != 4 && few))
        kc_launch(b, k_decode_attn<HD, G, KT, 8>, grid, dim3(8 * 32), 0, q, kc_, vc, pos, seq, tab, m->n_seqs,
                  m->max_blocks, m->block_size, n_slots, nh, nkv, g, qscale, vs, window, min_keys, prefetch, out,
                  b->attn_part, b->attn_count);
    else
        kc_launch(b, k_decode_attn<HD, G, KT, DEC_WARPS>, grid, dim3(DEC_WARPS * 32), 0, q, kc_, vc, pos, seq, tab,
                  m->n_seqs, m->max_blocks, m->block_size, n_slots, nh, nkv, g, qscale, vs, window, min_keys, prefetch,
                  out, b->attn_part, b->attn_count);
}

template <int HD, typename KT>
static int launch_g(kc_backend *b, dim3 grid, int g, const bf16 *q, const KT *kc_, const KT *vc,
                    const int32_t *pos, const int32_t *seq, const int32_t *tab, const kaon_attn_meta *m,
                    int64_t n_slots, int nh, int nkv, float qscale, float vs, int window, bf16 *out) {
#define DEC_CASE(GG) \
    launch<HD, GG, KT>(b, grid, q, kc_, vc, pos, seq, tab, m, n_slots, nh, nkv, g, qscale, vs, window, out)
    if (g == 1) DEC_CASE(1);
    else if (g == 2) DEC_CASE(2);
    else if (g <= 4) DEC_CASE(4);
    else if (g <= 8 && HD <= 128) DEC_CASE(HD <= 128 ? 8 : 4);
    else return 1;
#undef DEC_CASE
    return 0;
}

// The step's tokens outside prefill runs, when this launch may take just them: d_pos is the
// marked copy of the positions (a step with runs), the step is not graphed (the list is the host's
// choice, made in begin_step), and m is the step's own metadata. NULL when not.
static const int32_t *rest_tokens(const kc_backend *b, const kaon_attn_meta *m, const int32_t *d_pos) {
    if (!b->fa_mark || d_pos != b->fa_mark || b->in_graph_step || b->n_rest < 0) return NULL;
    if (m->positions != b->h_pos || m->token_seq != b->h_seq || m->n_tokens != b->m_tokens) return NULL;
    return b->d_rest;
}

template <typename KT>
static int decode_any(kc_backend *b, const bf16 *q, const KT *kcache, const KT *vcache, const kaon_attn_meta *m,
                      int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq, const int32_t *d_tab, int nh,
                      int nkv, int hd, float scale, float vs, int window, bf16 *out) {
    const int g = nh / nkv;
    if (m->n_tokens <= 0) return 0;
    if ((hd != 64 && hd != 128 && hd != 256) || g > (hd == 256 ? 4 : 8) || nh % nkv) return 1;
    // A mixed step's decode tokens alone on the tensor-core kernel (its prefill runs go to the
    // prefill kernel, which writes every row of theirs); else a block row per token.
    const int32_t *tmap = kc_attention_decode_tc_takes(nh, nkv, hd) ? rest_tokens(b, m, d_pos) : NULL;
    const int T = tmap ? b->n_rest : m->n_tokens;
    if (T == 0) return 0;
    // Enough (token, kv head, range) blocks for four waves of 4-warp blocks; the ranges in use
    // shrink with the context inside the kernel.
    int64_t want = (4LL * b->n_sm + (int64_t)T * nkv - 1) / ((int64_t)T * nkv);
    // A few tokens on the tensor-core kernel (one block of 132 KB per SM): the grid in one wave.
    // Most of a batch-1 grid's ranges are empty at short contexts, yet each later wave's blocks
    // start only as the earlier ones end, read the step's metadata and wait; at long contexts one
    // wave streams as many keys per SM. KAON_DEC_ONE_WAVE=0: four waves (A/B).
    static const bool one_wave = !kc_env_off("KAON_DEC_ONE_WAVE");
    if (one_wave && T <= DEC_FEW_TOKENS && kc_attention_decode_tc_takes(nh, nkv, hd)) {
        const int per_sm = kc_attention_decode_tc_per_sm(b, T, hd);
        const int64_t fit = per_sm > 0 ? (int64_t)per_sm * b->n_sm / ((int64_t)T * nkv) : want;
        if (fit < want) want = fit;
    }
    int S = want > DEC_MAX_SPLITS ? DEC_MAX_SPLITS : (int)want;
    if (S < 1) S = 1;
    if (S > 1 &&
        (kc_grow(b, (void **)&b->attn_part, &b->attn_part_cap, (size_t)T * nh * S * ((size_t)hd + 2), sizeof(float),
                 "attention partials") ||
         kc_grow(b, (void **)&b->attn_count, &b->attn_count_cap, (size_t)T * nkv, sizeof(unsigned),
                 "attention counters")))
        return -1;
    const dim3 grid((unsigned)T, (unsigned)nkv, (unsigned)S);
    // The tensor-core kernel where it is chosen (cuda_attention_decode_tc.cu).
    const int tc = kc_attention_decode_tc(b, grid, q, kcache, vcache, sizeof(KT) == 1, m, n_slots, d_pos, d_seq,
                                          d_tab, tmap, nh, nkv, hd, scale, vs, window, out);
    if (tc <= 0) return tc;
    const float qscale = scale * 1.4426950408889634f;  // scores in log2 units
    int rc;
    if (hd == 64)
        rc = launch_g<64, KT>(b, grid, g, q, kcache, vcache, d_pos, d_seq, d_tab, m, n_slots, nh, nkv, qscale, vs,
                              window, out);
    else if (hd == 128)
        rc = launch_g<128, KT>(b, grid, g, q, kcache, vcache, d_pos, d_seq, d_tab, m, n_slots, nh, nkv, qscale, vs,
                               window, out);
    else
        rc = launch_g<256, KT>(b, grid, g, q, kcache, vcache, d_pos, d_seq, d_tab, m, n_slots, nh, nkv, qscale, vs,
                               window, out);
    if (rc) return 1;
    return kc_launched(b, "decode attention");
}

int kc_attention_decode(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache,
                        const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                        const int32_t *d_tab, int nh, int nkv, int hd, float scale, int window, bf16 *out) {
    return decode_any<bf16>(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, scale, 1.0f,
                            window, out);
}

int kc_attention_decode_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                            const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                            const int32_t *d_tab, int nh, int nkv, int hd, float scale, float k_scale, float v_scale,
                            int window, bf16 *out) {
    return decode_any<uint8_t>(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd,
                               scale * k_scale, v_scale, window, out);
}
