// Paged causal attention of prefill chunks on the tensor cores (FlashAttention-2 style).
//
// Which tokens: a run of >= FA_MIN_RUN consecutive tokens of the flat batch that belong to one
// sequence (a prefill chunk; the engine lays each sequence's tokens out contiguously). A small
// kernel (k_fa_mark) finds them from each token's +-15 neighbours and writes a copy of the
// positions in which they read FA_MARK: the split-K kernel of cuda_attention.cu runs first on
// that copy (it treats FA_MARK like any invalid position: a cheap block that writes zeros), then
// k_fa_prefill overwrites those rows. Everything is decided on the device from the step's index
// arrays, so a recorded graph stays right for any batch of the same shape.
//
// A CTA takes a window of tpt = 128 / g consecutive tokens of the flat batch and one KV head; its
// 128 rows are (token, query head of the group) pairs, row = token * g + head, so the g heads
// that share a KV head share every K/V tile (hd 64/128: 4 warps of 32 rows, 2 CTAs per SM;
// hd 256: 8 warps of 16 rows). The window's marked tokens fall into segments (one sequence
// each; usually one segment per window), processed one after another. For a segment:
//   - Q [128, hd] goes to shared memory (rows outside the segment are zero), then into
//     registers as mma A fragments (hd 64; hd 128 and 256 re-read them every tile).
//   - K/V tiles of BN keys 0..max position of the segment are gathered through the block table
//     with cp.async (zero-filled past the end or for invalid blocks), two stages each for K and
//     V: V_{j+1} is issued while S_j = Q K_j^T is computed, K_{j+2} while O += P_j V_j is. The
//     keys' cache slots go through shared memory, looked up three tiles ahead.
//   - Each warp owns 16 or 32 rows: S with mma.m16n8k16 (bf16 in, f32 out), the causal mask
//     (key <= the row's own position) only on tiles that reach past the warp's lowest position,
//     the online softmax in registers (exp2 with scale * log2 e), P rounded to bf16 and reused
//     in place as the A fragments of P V. A warp skips tiles past its highest position.
//   - Sliding window (WIN, a separate instance so the full-attention code is untouched): a row
//     at position p keeps the keys p - window < key <= p (HF: kv_idx > q_idx - window). Tiles
//     start at the segment's lowest window start (blocks before it are not even looked up), a
//     warp skips tiles wholly before its own rows' windows, and the mask also runs on tiles
//     that begin before the highest window start of the warp.
// Shared-memory tiles are rows of hd bf16 whose 16-byte chunks are XOR-swizzled by row % 8,
// so ldmatrix (8 rows of one chunk column) and the cp.async stores are free of bank conflicts.
//
// FP8 cache (e4m3 codes, per-tensor k_scale / v_scale; hd 64 and 128, the same tiles, warps and
// shared memory, so 2 CTAs per SM stay): a tile's codes (hd bytes a key, half a bf16 row) are
// copied row-major into the upper half of its stage; once they land, each thread widens the
// chunks it copied itself (no barrier to see them) to f16, exactly (every e4m3 value is an
// f16), into the swizzled layout above: rows of the lower half at once (their f16 does not
// reach the staging), the upper half's from registers after a barrier. The mmas then run on
// f16 (Q saturated to +-65504 once per segment, P packed as f16); k_scale folds into the score
// scale, v_scale into the output. K_j and V_j travel as one group, issued a tile ahead: tile
// j + 1 is in flight while tile j is widened and computed, with two barriers a tile as in the
// bf16 pipeline. KAON_FA_FP8=0 (or KAON_FA=0) leaves an FP8 cache's runs to the decode kernel.
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_attention_prefill.cuh"
#include "backend/cuda/cuda_attention_runs.cuh"
#include "backend/cuda/cuda_mma.cuh"

#include <cuda_fp8.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace {

// mark[t] = FA_MARK for the tokens of runs of >= FA_MIN_RUN, else pos[t].
__global__ void k_fa_mark(const int32_t *__restrict__ pos, const int32_t *__restrict__ seq, int T,
                          int n_seqs, int max_blocks, int bs, int32_t *__restrict__ mark) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int p = pos[t];
    if (!fa_tok_ok(pos, seq, t, n_seqs, max_blocks, bs)) {
        mark[t] = p == FA_MARK ? -1 : p;  // invalid either way; never mistaken for a mark
        return;
    }
    mark[t] = fa_in_run(pos, seq, T, t, n_seqs, max_blocks, bs) ? FA_MARK : p;
}

// FP8 cache: two e4m3 codes (low byte first) as two f16, exactly (every e4m3 value is an f16).
__device__ __forceinline__ uint32_t e4m3x2_f16(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
// Eight codes (lo: the first four) as eight f16: one 16-byte chunk of an f16 row.
__device__ __forceinline__ uint4 e4m3x8_f16(uint32_t lo, uint32_t hi) {
    return make_uint4(e4m3x2_f16(lo), e4m3x2_f16(lo >> 16), e4m3x2_f16(hi), e4m3x2_f16(hi >> 16));
}
// Eight bf16 as eight f16, saturated at +-65504 (f16 has bf16's mantissa and more, not its range).
__device__ __forceinline__ uint4 bf16x8_f16(uint4 v) {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        w[i] = pack_f16(fminf(fmaxf(f.x, -65504.f), 65504.f), fminf(fmaxf(f.y, -65504.f), 65504.f));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
// threadIdx.x read anew where it is used (FP8 instances, which sit at the 255-register limit
// at hd 128): the addresses derived from it are then mostly recomputed there rather than kept,
// and spilled, across the tile loop (the front end neither hoists nor merges a volatile asm).
__device__ __forceinline__ int tid_here() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}
// The mma and P's packing for the tiles' element type: bf16, or f16 (FP8 cache).
template <bool F16>
__device__ __forceinline__ void mma_kt(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (F16) mma16816_f16(d, a, b0, b1);
    else mma16816(d, a, b0, b1);
}
template <bool F16>
__device__ __forceinline__ uint32_t pack_kt(float lo, float hi) {
    if constexpr (F16) return pack_f16(lo, hi);
    else return pack_bf16(lo, hi);
}

// grid (windows, n_kv_heads), NW warps; dynamic shared memory: fa_smem_bytes.
// HD: head dim; BN: keys per tile; MT: 16-row m-tiles per warp (each K/V fragment read from
// shared memory feeds MT mmas); NW * 16 * MT = FA_BM; QREG: Q fragments held in registers
// (else re-read from shared memory every tile); MINB: CTAs per SM the registers are sized for.
// KT: the cache element, bf16 or uint8_t (e4m3 codes: sl2 has k_scale folded in, vs multiplies
// the output; unused for bf16).
template <int HD, int BN, int MT, int NW, bool QREG, int MINB, bool WIN, typename KT>
__global__ void __launch_bounds__(NW * 32, MINB)
k_fa_prefill(const bf16 *__restrict__ q, const KT *__restrict__ kcache, const KT *__restrict__ vcache,
             const int32_t *__restrict__ pos, const int32_t *__restrict__ mark,
             const int32_t *__restrict__ seq, const int32_t *__restrict__ tables, int T, int max_blocks,
             int bs, int bs_shift, int64_t n_slots, int nh, int nkv, int g, int tpt, float sl2, int window,
             bf16 *__restrict__ out, float vs) {
    constexpr bool F8 = sizeof(KT) == 1;
    constexpr int NTH = NW * 32;               // threads
    constexpr int RW = 16 * MT;                // rows per warp
    constexpr int NR = 2 * MT;                 // rows per thread: (m-tile, half)
    constexpr int CH = HD / 8;                 // 16-byte chunks per row
    constexpr int ROWB = HD * 2;               // bytes per row
    constexpr int TILEB = BN * ROWB;           // bytes per K or V stage
    // Chunks per thread per K or V tile, and per Q tile (the last pass partial where CH does
    // not divide the threads: head_dim 192).
    constexpr int LDN = (BN * CH + NTH - 1) / NTH;
    constexpr int QLDN = (FA_BM * CH + NTH - 1) / NTH;
    constexpr int NT_S = BN / 8;   // n-tiles of S
    constexpr int KS_Q = HD / 16;  // k-steps of Q K^T
    constexpr int NT_O = HD / 8;   // n-tiles of O
    constexpr int KS_P = BN / 16;  // k-steps of P V
    static_assert(NW * RW == FA_BM && NTH >= FA_BM && NTH >= BN && NW <= 8, "rows");
    static_assert(BN % 16 == 0 && HD % 64 == 0, "tile shapes");
    // FP8: 16-byte chunks of codes per row, and per thread per K or V tile: whole passes, the
    // first half of them rows 0 .. BN / 2 - 1.
    constexpr int CH8 = HD / 16;
    constexpr int LD8 = BN * CH8 / NTH;
    static_assert(!F8 || (LD8 * NTH == BN * CH8 && LD8 % 2 == 0 && NTH / CH8 % 8 == 0), "FP8 staging passes");

    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *sQ = smem;                  // [FA_BM][HD]
    unsigned char *sK = sQ + FA_BM * ROWB;     // [2][BN][HD]
    unsigned char *sV = sK + 2 * TILEB;        // [2][BN][HD]
    int *s_pos = (int *)(sV + 2 * TILEB);      // [FA_BM] position of each window token
    int *s_seq = s_pos + FA_BM;                // [FA_BM] its sequence, -1 when not ours
    int *s_rpos = s_seq + FA_BM;               // [FA_BM] position of each row, -1 outside the segment
    int *s_slot = s_rpos + FA_BM;              // [3][BN] cache slot of each key of tile % 3, -1: none
    int *s_bad = s_slot + 3 * BN;              // [4] tile % 4 has keys <= maxp without a slot
    int *s_wmax = s_bad + 4;                   // [8] highest position of each warp's rows
    int *s_wmin = s_wmax + 8;                  // [8] lowest (WIN only)
    unsigned *s_start = (unsigned *)(s_wmin + 8);  // [4] bit i: token i starts a segment
    unsigned *s_end = s_start + 4;                 // [4] bit i: token i ends one

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int win = gridDim.x - 1 - blockIdx.x;  // the last windows (longest contexts) first
    const int kvh = blockIdx.y;
    const int t_base = win * tpt;
    const int ntok = min(tpt, T - t_base);

    fa_window_tokens(t_base, ntok, pos, mark, seq, s_pos, s_seq, s_start, s_end);

    // This thread's fragment rows: i = 2 * mt + h is row warp * RW + mt * 16 + h * 8 + lane / 4
    // (accumulator elements 2h, 2h + 1 of m-tile mt).
    auto row_of = [&](int i) { return warp * RW + (i >> 1) * 16 + (i & 1) * 8 + (lane >> 2); };
    const int qd = lane & 3;  // column pair within an n-tile
    const size_t kv_row = (size_t)nkv * HD;
    const int mi = lane >> 3, r8 = lane & 7;
    // ldmatrix addresses (bytes, stage 0, first k/n step). Chunk c of a row sits at c ^ (row & 7)
    // and every fragment row here is = r8 (mod 8), so the XOR only touches the chunk's low 3
    // bits: chunk 8a + 2i + half (half: which 8 columns of the 16 this lane's matrix covers)
    // is at byte 128 a + xo(i), xo(i) = ((2i + half) ^ r8) * 16 = xo(0) ^ 32 i.
    const uint32_t xk0 = (uint32_t)(((mi & 1) ^ r8) << 4), xv0 = (uint32_t)(((mi >> 1) ^ r8) << 4);
#define xo_k(i) (xk0 ^ ((uint32_t)(i) << 5))
#define xo_v(i) (xv0 ^ ((uint32_t)(i) << 5))
    const uint32_t aQ = smem_addr(sQ) + (uint32_t)((warp * RW + (mi & 1) * 8 + r8) * ROWB);
    const uint32_t aK = smem_addr(sK) + (uint32_t)(((mi >> 1) * 8 + r8) * ROWB);
    const uint32_t aV = smem_addr(sV) + (uint32_t)(((mi & 1) * 8 + r8) * ROWB);
    const uint32_t sK0 = smem_addr(sK), sV0 = smem_addr(sV);

    for (int cur = 0;;) {
        // Next segment [a, e] of the window's tokens.
        int a = -1;
        for (int w = cur >> 5; w < 4 && a < 0; w++) {
            const unsigned bits = (cur >> 5) == w ? s_start[w] & (0xffffffffu << (cur & 31)) : s_start[w];
            if (bits) a = w * 32 + __ffs(bits) - 1;
        }
        if (a < 0) break;
        int e = -1;
        for (int w = a >> 5; w < 4 && e < 0; w++) {
            const unsigned bits = (a >> 5) == w ? s_end[w] & (0xffffffffu << (a & 31)) : s_end[w];
            if (bits) e = w * 32 + __ffs(bits) - 1;
        }
        cur = e + 1;
        const int sq = s_seq[a];
        const int32_t *bt = tables + (size_t)sq * max_blocks;

        int wmax = -1, wmin = INT_MAX;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int ti = row_of(i) / g;
            const int p = ti >= a && ti <= e ? s_pos[ti] : -1;  // positions are >= 0
            wmax = max(wmax, p);
            if (p >= 0) wmin = min(wmin, p);
        }
        if (tid < FA_BM) {
            const int ti = tid / g;
            s_rpos[tid] = ti >= a && ti <= e ? s_pos[ti] : -1;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));
            wmin = min(wmin, __shfl_xor_sync(0xffffffffu, wmin, o));
        }
        if (lane == 0) {
            s_wmax[warp] = wmax;
            if (WIN) s_wmin[warp] = wmin;
        }
        if (tid < 4) s_bad[tid] = 0;
        // Q rows of the segment (others zero). (FP8: tid read anew, else the chunks' rows and
        // columns are kept from one segment to the next and spilled across the tile loop.)
        const int qtid = F8 ? tid_here() : tid;
#pragma unroll
        for (int u = 0; u < QLDN; u++) {
            const int c = qtid + u * NTH, row = c / CH, ld_ch = c % CH, ti = row / g;
            if (c >= FA_BM * CH) break;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (ti >= a && ti <= e)
                v = *(const uint4 *)(q + ((size_t)(t_base + ti) * nh + (size_t)kvh * g + row % g) * HD + ld_ch * 8);
            if constexpr (F8) v = bf16x8_f16(v);
            *(uint4 *)(sQ + swz<HD>(row, ld_ch)) = v;
        }
        __syncthreads();
        int maxp = s_wmax[0];
#pragma unroll
        for (int w = 1; w < NW; w++) maxp = max(maxp, s_wmax[w]);
        const int n_tiles = maxp / BN + 1;
        // The first key any row of the segment keeps, and its tile.
        int kmin = 0;
        if (WIN) {
            int minp = s_wmin[0];
#pragma unroll
            for (int w = 1; w < NW; w++) minp = min(minp, s_wmin[w]);
            kmin = max(0, minp - window + 1);
        }
        const int j0 = kmin / BN;

        // Cache slots of tile t's keys, one per thread of the first BN: the block-table entry is
        // loaded (load_blk) a phase before it is stored (put_slots), three tiles ahead of use.
        auto load_blk = [&](int t) {
            const int k = t * BN + tid;
            return tid < BN && t < n_tiles && k <= maxp && (!WIN || k >= kmin)
                       ? bt[bs_shift >= 0 ? k >> bs_shift : k / bs]
                       : -1;
        };
        auto put_slots = [&](int t, int blk) {
            if (tid < BN && t < n_tiles) {
                const int k = t * BN + tid;
                const int64_t sl = (int64_t)blk * bs + (bs_shift >= 0 ? k & (bs - 1) : k % bs);
                const bool need = k <= maxp && (!WIN || k >= kmin);
                const bool ok = need && blk >= 0 && sl < n_slots;
                s_slot[(t % 3) * BN + tid] = ok ? (int)sl : -1;
                if (need && !ok) s_bad[t & 3] = 1;
            }
        };
        // Issues tile t's K or V into stage t & 1; one commit group either way (empty past the
        // last tile).
        auto issue = [&](int t, bool is_v) {
            if (t < n_tiles) {
                const KT *cache = is_v ? vcache : kcache;
                const uint32_t dst = (is_v ? sV0 : sK0) + (uint32_t)((t & 1) * TILEB);
                const int *sl = s_slot + (t % 3) * BN;
#pragma unroll
                for (int u = 0; u < LDN; u++) {
                    const int c = tid + u * NTH, kr = c / CH, ld_ch = c % CH;
                    if (c >= BN * CH) break;
                    const int slot = sl[kr];
                    const KT *src = slot >= 0 ? cache + (size_t)slot * kv_row + (size_t)kvh * HD + ld_ch * 8 : cache;
                    cp_async16(dst + swz<HD>(kr, ld_ch), src, slot >= 0);
                }
            }
            cp_async_commit();
        };
        // FP8: tile t's K and V codes (HD bytes a key, row-major) into the upper half of stage
        // t & 1's K and V buffers, one commit group.
        auto issue_kv = [&](int t) {
            if (t < n_tiles) {
                const unsigned char *kc = (const unsigned char *)kcache, *vc = (const unsigned char *)vcache;
                // (From a fresh tid: kept across the tile loop, these offsets were spilled.)
                const int t0 = tid_here();
                const uint32_t dst = (uint32_t)((t & 1) * TILEB + TILEB / 2 + t0 * 16);
                const int *sl = s_slot + (t % 3) * BN + t0 / CH8;
                const int col = kvh * HD + (t0 % CH8) * 16;
#pragma unroll
                for (int u = 0; u < LD8; u++) {
                    const int slot = sl[u * (NTH / CH8)];
                    const size_t o = (size_t)slot * kv_row + col;
                    cp_async16(sK0 + dst + u * NTH * 16, slot >= 0 ? kc + o : kc, slot >= 0);
                    cp_async16(sV0 + dst + u * NTH * 16, slot >= 0 ? vc + o : vc, slot >= 0);
                }
            }
            cp_async_commit();
        };
        // FP8: staged chunk tid + u NTH (16 codes of row tid / CH8 + u NTH / CH8, whose row % 8
        // is the same for every u) as f16 into its two swizzled chunks of the stage at dst. Which
        // half goes first alternates every 4 chunks of the row, so that the 8 stores of a
        // quarter warp land on 8 distinct bank groups.
        auto put_f16 = [&](unsigned char *dst, int u, uint4 x) {
            const int t = tid_here(), c8 = t % CH8, hb = (c8 >> 2) & 1;
            const uint32_t a0 = hb ? x.z : x.x, a1 = hb ? x.w : x.y, b0 = hb ? x.x : x.z, b1 = hb ? x.y : x.w;
            // Chunk 2 c8 + hb; the other one, 2 c8 + 1 - hb, is at that offset ^ 16.
            const uint32_t o = swz<HD>(t / CH8, 2 * c8 + hb) + (uint32_t)(u * (NTH / CH8) * ROWB);
            *(uint4 *)(dst + o) = e4m3x8_f16(a0, a1);
            *(uint4 *)(dst + (o ^ 16u)) = e4m3x8_f16(b0, b1);
        };
        int blk_next = -1;  // FP8: tile j + 2's block-table entry, loaded a tile ahead
        if constexpr (F8) {
            put_slots(j0, load_blk(j0));
            put_slots(j0 + 1, load_blk(j0 + 1));
            blk_next = load_blk(j0 + 2);
            __syncthreads();
            issue_kv(j0);
        } else {
            put_slots(j0, load_blk(j0));
            put_slots(j0 + 1, load_blk(j0 + 1));
            put_slots(j0 + 2, load_blk(j0 + 2));
            __syncthreads();
            issue(j0, false);
            issue(j0, true);
            issue(j0 + 1, false);
        }

        uint32_t qf[QREG ? MT : 1][QREG ? KS_Q : 1][4];
        if (QREG) {
#pragma unroll
            for (int mt = 0; mt < (QREG ? MT : 0); mt++)
#pragma unroll
                for (int kk = 0; kk < (QREG ? KS_Q : 0); kk++)
                    ldsm_x4(qf[mt][kk], aQ + mt * 16 * ROWB + xo_v(kk & 3) + (kk >> 2) * 128);
        }
        float oacc[MT][NT_O][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NT_O; n++) oacc[mt][n][0] = oacc[mt][n][1] = oacc[mt][n][2] = oacc[mt][n][3] = 0.f;
        float m_run[NR], l_run[NR];
#pragma unroll
        for (int i = 0; i < NR; i++) {
            m_run[i] = -INFINITY;
            l_run[i] = 0.f;
        }

        for (int j = j0; j < n_tiles; j++) {
            const uint32_t stg = (uint32_t)((j & 1) * TILEB);
            int blk3 = -1;
            if constexpr (F8) {
                // Widen tile j's codes to f16 in place: each thread the chunks it copied itself
                // (visible to it once its group completed, no barrier needed). Rows of the lower
                // half go straight to f16 (their f16 rows do not reach the staging); the upper
                // half's codes wait in registers until every thread has read its staging.
                cp_async_wait<0>();  // K_j, V_j (the only group in flight)
                uint4 hk[LD8 / 2], hv[LD8 / 2];
#pragma unroll
                for (int u = 0; u < LD8; u++) {
                    const int c = tid + u * NTH;
                    const uint4 xk = *(const uint4 *)(sK + stg + TILEB / 2 + c * 16);
                    const uint4 xv = *(const uint4 *)(sV + stg + TILEB / 2 + c * 16);
                    if (u < LD8 / 2) {
                        put_f16(sK + stg, u, xk);
                        put_f16(sV + stg, u, xv);
                    } else {
                        hk[u - LD8 / 2] = xk;
                        hv[u - LD8 / 2] = xv;
                    }
                }
                __syncthreads();  // staging read; every warp done with tile j - 1 (stage (j + 1) & 1)
                if (tid == 0) s_bad[(j + 3) & 3] = 0;  // (tile j - 1's flag, for tile j + 3)
                put_slots(j + 2, blk_next);            // (over tile j - 1's)
                issue_kv(j + 1);                       // in flight while tile j computes
                blk_next = load_blk(j + 3);
#pragma unroll
                for (int u = LD8 / 2; u < LD8; u++) {
                    put_f16(sK + stg, u, hk[u - LD8 / 2]);
                    put_f16(sV + stg, u, hv[u - LD8 / 2]);
                }
                __syncthreads();  // f16 K_j and V_j in place
            } else {
                cp_async_wait<2>();  // K_j landed (V_j and K_{j+1} may be in flight)
                __syncthreads();
                issue(j + 1, true);
                blk3 = load_blk(j + 3);
            }
            // Warp-uniform: the tile holds keys of some row of the warp.
            const bool work = j * BN <= wmax && (!WIN || j * BN + BN > wmin - window + 1);
            float s[MT][NT_S][4];
            if (work) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < NT_S; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
                for (int kk = 0; kk < KS_Q; kk++) {
                    uint32_t af[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        if (QREG) {
#pragma unroll
                            for (int x = 0; x < 4; x++) af[mt][x] = qf[QREG ? mt : 0][QREG ? kk : 0][x];
                        } else {
                            ldsm_x4(af[mt], aQ + mt * 16 * ROWB + xo_v(kk & 3) + (kk >> 2) * 128);
                        }
                    }
#pragma unroll
                    for (int np = 0; np < NT_S / 2; np++) {
                        uint32_t kb[4];
                        ldsm_x4(kb, aK + stg + xo_k(kk & 3) + (kk >> 2) * 128 + np * 16 * ROWB);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_kt<F8>(s[mt][2 * np], af[mt], kb[0], kb[1]);
                            mma_kt<F8>(s[mt][2 * np + 1], af[mt], kb[2], kb[3]);
                        }
                    }
                }
                const bool bad = s_bad[j & 3] != 0;
                if (bad || j * BN + BN - 1 > wmin || (WIN && j * BN <= wmax - window)) {
                    const int *sl = s_slot + (j % 3) * BN;
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int n = 0; n < NT_S; n++)
#pragma unroll
                            for (int c = 0; c < 4; c++) {
                                const int kr = n * 8 + 2 * qd + (c & 1), key = j * BN + kr;
                                const int rp = s_rpos[row_of(2 * mt + (c >> 1))];
                                const bool valid = key <= rp && (!WIN || key > rp - window) && (!bad || sl[kr] >= 0);
                                if (!valid) s[mt][n][c] = -INFINITY;
                            }
                }
                // Online softmax of row i = 2 mt + h: elements 2h, 2h + 1 of m-tile mt.
                float mx[NR], base[NR];
#pragma unroll
                for (int i = 0; i < NR; i++) mx[i] = -INFINITY;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < NT_S; n++) {
                        mx[2 * mt] = fmaxf(mx[2 * mt], fmaxf(s[mt][n][0], s[mt][n][1]));
                        mx[2 * mt + 1] = fmaxf(mx[2 * mt + 1], fmaxf(s[mt][n][2], s[mt][n][3]));
                    }
#pragma unroll
                for (int i = 0; i < NR; i++) {
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                    const float mnew = fmaxf(m_run[i], mx[i]);
                    base[i] = mnew == -INFINITY ? 0.f : mnew * sl2;
                    // 0 when m_run = -inf, 1 when the max stays. (Skipping the rescale when no max
                    // moved, behind a warp vote, made ptxas spill: it stays unconditional.)
                    const float alpha = mnew == m_run[i] ? 1.f : ex2(fmaf(m_run[i], sl2, -base[i]));
                    m_run[i] = mnew;
                    l_run[i] *= alpha;
#pragma unroll
                    for (int n = 0; n < NT_O; n++) {
                        oacc[i >> 1][n][2 * (i & 1)] *= alpha;
                        oacc[i >> 1][n][2 * (i & 1) + 1] *= alpha;
                    }
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int n = 0; n < NT_S; n++)
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            const int i = 2 * mt + (c >> 1);
                            const float p = ex2(fmaf(s[mt][n][c], sl2, -base[i]));
                            s[mt][n][c] = p;
                            l_run[i] += p;
                        }
            }
            if constexpr (!F8) {
                cp_async_wait<2>();  // V_j landed
                __syncthreads();     // every warp is done with K stage j & 1
                if (tid == 0) s_bad[j & 3] = 0;  // (tile j + 4's flag)
                put_slots(j + 3, blk3);          // (over tile j's)
                issue(j + 2, false);
            }
            if (work) {
#pragma unroll
                for (int kk = 0; kk < KS_P; kk++) {
                    uint32_t pa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pa[mt][0] = pack_kt<F8>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                        pa[mt][1] = pack_kt<F8>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                        pa[mt][2] = pack_kt<F8>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                        pa[mt][3] = pack_kt<F8>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                    }
#pragma unroll
                    for (int np = 0; np < NT_O / 2; np++) {
                        uint32_t vb[4];
                        ldsm_x4_t(vb, aV + stg + xo_v(np & 3) + (np >> 2) * 128 + kk * 16 * ROWB);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma_kt<F8>(oacc[mt][2 * np], pa[mt], vb[0], vb[1]);
                            mma_kt<F8>(oacc[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
                        }
                    }
                }
            }
        }

        // Normalise and store the segment's rows.
#pragma unroll
        for (int i = 0; i < NR; i++) {
            l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
            l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
        }
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int row = row_of(i);
            if (s_rpos[row] < 0) continue;
            const float inv = l_run[i] > 0.f ? (F8 ? vs : 1.f) / l_run[i] : 0.f;
            bf16 *o = out + ((size_t)(t_base + row / g) * nh + (size_t)kvh * g + row % g) * HD + 2 * qd;
#pragma unroll
            for (int n = 0; n < NT_O; n++)
                *(__nv_bfloat162 *)(o + n * 8) = __floats2bfloat162_rn(oacc[i >> 1][n][2 * (i & 1)] * inv,
                                                                       oacc[i >> 1][n][2 * (i & 1) + 1] * inv);
        }
        cp_async_wait<0>();
        __syncthreads();  // shared memory free for the next segment
    }
#undef xo_k
#undef xo_v
}

template <int HD, int BN>
constexpr size_t fa_smem_bytes() {
    return (size_t)FA_BM * HD * 2 + 4 * (size_t)BN * HD * 2 +
           sizeof(int) * (3 * FA_BM + 3 * BN + 4 + 8 + 8 + 8);
}

template <int HD, int BN, int MT, int NW, bool QREG, int MINB, bool WIN, typename KT>
int fa_launch(kc_backend *b, const bf16 *q, const KT *kcache, const KT *vcache, const int32_t *d_pos,
              const int32_t *d_mark, const int32_t *d_seq, const int32_t *d_tab, int T, int max_blocks,
              int bs, int64_t n_slots, int nh, int nkv, float sl2, int window, bf16 *out, float vs = 1.f) {
    const int g = nh / nkv, tpt = FA_BM / g;
    int bs_shift = -1;
    for (int sh = 0; sh < 31 && bs_shift < 0; sh++)
        if (bs == 1 << sh) bs_shift = sh;
    const size_t smem = fa_smem_bytes<HD, BN>();
    auto kern = k_fa_prefill<HD, BN, MT, NW, QREG, MINB, WIN, KT>;
    // Set outside graph recording (the step's eager first run sets it before any recording).
    if (!b->capturing &&
        kc_check(b, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "prefill attention: shared memory"))
        return -1;
    dim3 grid((unsigned)((T + tpt - 1) / tpt), (unsigned)nkv);
    kern<<<grid, NW * 32, smem, b->stream>>>(q, kcache, vcache, d_pos, d_mark, d_seq, d_tab, T, max_blocks, bs,
                                             bs_shift, n_slots, nh, nkv, g, tpt, sl2, window, out, vs);
    return kc_launched(b, "prefill attention");
}

int fa_disabled(void) {
    static const bool off = kc_env_off("KAON_FA");
    return off;
}

// KAON_FA_FP8=0: an FP8 cache's prefill runs go back to the decode kernel (A/B).
int fa_fp8_disabled(void) {
    static const bool off = kc_env_off("KAON_FA_FP8");
    return off;
}

// The instance for head_dim hd: <HD, BN, MT, NW, QREG, MINB, WIN>. 4 warps of 32 rows, two CTAs
// per SM (hd 64, 128); hd 256 keeps 16 rows per warp (its O alone is 128 registers) and one CTA
// of 8 warps. Measured on the H200 (hd 128, 8k tokens): 32-row warps 246-251 TFLOP/s against
// 158 for 8 warps of 16 rows (each K/V fragment feeds two mmas); 32-key tiles 214.
template <bool WIN>
int fa_dispatch(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache, const kaon_attn_meta *m,
                int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq, const int32_t *d_tab, int nh, int nkv,
                int hd, float sl2, int window, bf16 *out) {
    const int T = m->n_tokens, mb = m->max_blocks, bs = m->block_size;
    const int32_t *mk = b->fa_mark;
    switch (hd) {
    case 64:
        return fa_launch<64, 64, 2, 4, true, 2, WIN>(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs,
                                                     n_slots, nh, nkv, sl2, window, out);
    case 128:
        // On Hopper the wgmma kernel (cuda_attention_prefill_wgmma.cu), full attention only.
        if (!WIN && kc_fa_wgmma_on())
            return kc_fa_prefill_wgmma(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs, n_slots, nh, nkv,
                                       sl2, out);
        return fa_launch<128, 64, 2, 4, false, 2, WIN>(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs,
                                                       n_slots, nh, nkv, sl2, window, out);
    case 192:  // DeepSeek's expanded MLA prefill (qk_nope 128 + rope 64; V padded to 192)
        return fa_launch<192, 32, 1, 8, false, 1, WIN>(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs,
                                                       n_slots, nh, nkv, sl2, window, out);
    case 256:
        return fa_launch<256, 32, 1, 8, false, 1, WIN>(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs,
                                                       n_slots, nh, nkv, sl2, window, out);
    default:
        return kc_fail(b, "prefill attention: head_dim %d", hd);
    }
}

// The FP8-cache instances: the bf16 shapes of hd 64 and 128 (the same shared memory and rows per
// warp; tiles widened to f16 in place). hd 192 / 256 have none: the FP8 plan refuses them.
template <bool WIN>
int fa_dispatch_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                    const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                    const int32_t *d_tab, int nh, int nkv, int hd, float sl2, float vs, int window, bf16 *out) {
    const int T = m->n_tokens, mb = m->max_blocks, bs = m->block_size;
    const int32_t *mk = b->fa_mark;
    switch (hd) {
    case 64:
        return fa_launch<64, 64, 2, 4, true, 2, WIN>(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs,
                                                     n_slots, nh, nkv, sl2, window, out, vs);
    case 128:
        return fa_launch<128, 64, 2, 4, false, 2, WIN>(b, q, kcache, vcache, d_pos, mk, d_seq, d_tab, T, mb, bs,
                                                       n_slots, nh, nkv, sl2, window, out, vs);
    default:
        return kc_fail(b, "prefill attention: head_dim %d over an FP8 cache", hd);
    }
}

// Both plans: fp8 takes only the head dims with an FP8 instance.
int fa_plan(kc_backend *b, const kaon_attn_meta *m, int nh, int nkv, int hd, float scale, const int32_t *d_pos,
            const int32_t *d_seq, const int32_t **d_pos_rest, bool fp8) {
    *d_pos_rest = d_pos;
    const int T = m->n_tokens;
    // Decided by the step's shape alone (graphs key on it): a run of FA_MIN_RUN tokens of one
    // sequence needs T >= n_seqs + FA_MIN_RUN - 1.
    if (fa_disabled() || (fp8 && fa_fp8_disabled()) || T - m->n_seqs < FA_MIN_RUN - 1) return 0;
    const bool hd_ok = hd == 64 || hd == 128 || (!fp8 && (hd == 192 || hd == 256));
    if (nkv <= 0 || nh % nkv || nh / nkv > FA_BM || !hd_ok || !(scale > 0.f) || !isfinite(scale))
        return 0;
    if (kc_grow(b, (void **)&b->fa_mark, &b->fa_mark_cap, (size_t)T, sizeof(int32_t), "prefill attention marks"))
        return -1;
    k_fa_mark<<<(T + 255) / 256, 256, 0, b->stream>>>(d_pos, d_seq, T, m->n_seqs, m->max_blocks, m->block_size,
                                                      b->fa_mark);
    if (kc_launched(b, "prefill attention marks")) return -1;
    *d_pos_rest = b->fa_mark;
    return 1;
}

}  // namespace

int kc_attention_prefill_plan(kc_backend *b, const kaon_attn_meta *m, int nh, int nkv, int hd, float scale,
                              const int32_t *d_pos, const int32_t *d_seq, const int32_t **d_pos_rest) {
    return fa_plan(b, m, nh, nkv, hd, scale, d_pos, d_seq, d_pos_rest, false);
}

int kc_attention_prefill_plan_fp8(kc_backend *b, const kaon_attn_meta *m, int nh, int nkv, int hd, float scale,
                                  const int32_t *d_pos, const int32_t *d_seq, const int32_t **d_pos_rest) {
    return fa_plan(b, m, nh, nkv, hd, scale, d_pos, d_seq, d_pos_rest, true);
}

int kc_attention_prefill(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache,
                         const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                         const int32_t *d_tab, int nh, int nkv, int hd, float scale, int window, bf16 *out) {
    const float sl2 = scale * 1.4426950408889634f;
    if (window > 0)
        return fa_dispatch<true>(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, sl2, window, out);
    return fa_dispatch<false>(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, sl2, 0, out);
}

int kc_attention_prefill_fp8(kc_backend *b, const bf16 *q, const uint8_t *kcache, const uint8_t *vcache,
                             const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                             const int32_t *d_tab, int nh, int nkv, int hd, float scale, float k_scale, float v_scale,
                             int window, bf16 *out) {
    const float sl2 = scale * k_scale * 1.4426950408889634f;  // scores of the codes, in log2 units
    if (window > 0)
        return fa_dispatch_fp8<true>(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, sl2,
                                     v_scale, window, out);
    return fa_dispatch_fp8<false>(b, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, nh, nkv, hd, sl2, v_scale,
                                  0, out);
}
