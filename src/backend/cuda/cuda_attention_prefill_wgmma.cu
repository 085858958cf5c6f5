// Paged causal attention of prefill chunks on Hopper's warpgroup MMA (wgmma; FlashAttention-3's
// ideas), head_dim 128, bf16 cache, full attention: the instance of cuda_attention_prefill.cu
// (mma.sync, FlashAttention-2 style) that it stands in for on Hopper (unless KAON_FA_WGMMA=0), with
// the same rows, marks, masks and results; read that file's header first.
//
// A CTA takes a window of tpt = 128 / g tokens and one KV head (rows = (token, query head of the
// group) pairs, row = token * g + head) and runs as two warpgroups of 64 rows (wgmma's M), one CTA
// per SM (200 registers a thread). Each of the window's segments (one sequence each; FA_MARK
// tokens) goes as in the mma.sync kernel: Q [128, 128] to shared memory (rows outside the segment
// zero), K/V tiles of 64 keys gathered through the block table with cp.async by all 256 threads
// (zero-filled where no slot; each thread's copy offsets computed once per kernel: 11 instructions
// a 16-byte copy, 376 vs 314 TFLOP/s at 8k on an H100 against ~28) into NS = 4 stages each, issued NS - 1 (K) and NS - 2 (V) tiles
// ahead; the keys' slots go through a ring of NS + 1 tiles, and whether a tile has keys without a
// slot is ORed over the CTA by the barrier of each step (__syncthreads_or). Step j:
//   - S_j (64 x 64 per warpgroup, f32, 32 registers a thread) = wgmma m64n64k16, A = Q and B = K_j
//     both from shared memory (K-major), 8 k-steps; issued together with O += P_{j-1} V_{j-1}
//     (wgmma m64n128k16, P from registers, V from shared memory as the transposed (MN-major) B,
//     4 k-steps). The source orders the softmax of S_j before the wait for P V (FA3's intra-
//     warpgroup overlap), but ptxas lifts that wait to the row maxima and the exponentials run
//     after P V retires (SASS); a block-ending branch that keeps them ahead of it measured 3-7%
//     slower (H100, session 46), so the two warpgroups' lockstep is the overlap there is. O is
//     rescaled once P V retires.
//   - The causal mask (key <= the row's position; keys without a slot masked) only on tiles that
//     reach past the warpgroup's lowest position or lack slots; the online softmax in registers
//     (exp2, scale * log2 e); P rounded to bf16 becomes the A fragments (the f32 accumulator of S
//     and the A operand share one thread/element map: m16n8k16's, per warp of 16 rows).
//   - wgmmas are never under a branch (ptxas serializes them when it cannot prove one uniform):
//     a warpgroup whose rows all end before tile j still computes it, wholly masked (P = 0).
// Tiles live in the 128-byte swizzle layout of wgmma: a row of 128 bf16 is two 64-column halves
// in two separate regions [rows][128 B], 16-byte chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4)
// within its half (1024-byte aligned, since the hardware XORs address bits 4-6 with 7-9). K-major
// descriptors (Q, K): SBO 1024 (next 8 rows), a k-step of 16 columns = 32 bytes on the start
// address within the atom, the second half's region for k-steps 4-7. MN-major (V as B: K = keys,
// N = head dims): LBO = the next 64 head dims (the other half's region), SBO 1024 (next 8 keys), a
// k-step of 16 keys = 2048 bytes. Q's st.shared are fenced to the async proxy (fence.proxy.async)
// before the barrier that hands them to wgmma; cp.async data is not.
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_attention_prefill.cuh"
#include "backend/cuda/cuda_mma.cuh"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include <type_traits>

namespace {

constexpr int WG_HD = 128;                   // head dim
constexpr int WG_BN = 64;                    // keys per tile
constexpr int WG_NS = 4;                     // stages of K and of V
constexpr int WG_NTH = 256;                  // two warpgroups
constexpr int WG_KVHALF = WG_BN * 128;       // ... of a K or V tile
constexpr int WG_TILEB = 2 * WG_KVHALF;      // bytes per K or V stage
constexpr int WG_TILES = FA_BM * WG_HD * 2 + 2 * WG_NS * WG_TILEB;  // Q, K and V stages
constexpr int WG_INTS = 3 * FA_BM + (WG_NS + 1) * WG_BN + 8 + 8 + 4 + 4;
// Dynamic shared memory: the tiles (aligned up to 1024 bytes at run time) and the ints.
constexpr size_t WG_SMEM = 1024 + (size_t)WG_TILES + sizeof(int) * WG_INTS;

#ifdef KC_HAVE_WGMMA  // (what only the sm_90a kernel body uses)
constexpr int WG_CH = WG_HD / 8;             // 16-byte chunks per row
constexpr int WG_QHALF = FA_BM * 128;        // bytes of one 64-column half of Q
// cp.async data is read by wgmma without a proxy fence once cp.async.wait_group and a barrier saw
// it land (as FlashAttention-3's cp.async paths do): fence.proxy.async compiles to MEMBAR.ALL.CTA,
// which may wait for the later stages' copies still in flight (a fenced build passed the same tests
// on an H100 and ran 2% slower: 320 vs 326 TFLOP/s at 16k, session 44).

// Byte offset of 16-byte chunk c (0..15) of row r of a tile whose halves are half_b bytes apart.
__device__ __forceinline__ uint32_t swz128(int r, int c, int half_b) {
    return (uint32_t)((c >> 3) * half_b + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
#endif

// grid (windows, n_kv_heads), 256 threads, dynamic shared memory WG_SMEM.
__global__ void __launch_bounds__(WG_NTH, 1)
k_fa_prefill_wgmma(const bf16 *__restrict__ q, const bf16 *__restrict__ kcache, const bf16 *__restrict__ vcache,
                   const int32_t *__restrict__ pos, const int32_t *__restrict__ mark,
                   const int32_t *__restrict__ seq, const int32_t *__restrict__ tables, int T, int max_blocks,
                   int bs, int bs_shift, int64_t n_slots, int nh, int nkv, int g, int tpt, float sl2,
                   bf16 *__restrict__ out) {
#ifdef KC_HAVE_WGMMA
    constexpr int HD = WG_HD, BN = WG_BN, NS = WG_NS, NTH = WG_NTH, CH = WG_CH;
    constexpr int R = NS + 1;               // slot ring: tiles j .. j + NS
    constexpr int LDN = BN * CH / NTH;     // chunks per thread per K or V tile
    constexpr int QLDN = FA_BM * CH / NTH;  // ... per Q tile
    static_assert(LDN * NTH == BN * CH && QLDN * NTH == FA_BM * CH && NTH >= FA_BM && NTH >= BN, "copies");
    static_assert(NS >= 2 && NS <= 8, "stages");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *sQ = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);  // [2 halves][128][128 B]
    unsigned char *sK = sQ + FA_BM * HD * 2;   // [NS stages][2 halves][BN][128 B]
    unsigned char *sV = sK + NS * WG_TILEB;    // the same
    int *s_pos = (int *)(sV + NS * WG_TILEB);  // [FA_BM] position of each window token
    int *s_seq = s_pos + FA_BM;                // [FA_BM] its sequence, -1 when not ours
    int *s_rpos = s_seq + FA_BM;               // [FA_BM] position of each row, -1 outside the segment
    int *s_slot = s_rpos + FA_BM;              // [R][BN] cache slot of each key of tile % R, -1: none
    int *s_wmax = s_slot + R * BN;             // [8] highest position of each warp's rows
    int *s_wmin = s_wmax + 8;                  // [8] lowest
    unsigned *s_start = (unsigned *)(s_wmin + 8);  // [4] bit i: token i starts a segment
    unsigned *s_end = s_start + 4;                 // [4] bit i: token i ends one

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int win = gridDim.x - 1 - blockIdx.x;  // the last windows (longest contexts) first
    const int kvh = blockIdx.y;
    const int t_base = win * tpt;
    const int ntok = min(tpt, T - t_base);

    fa_window_tokens(t_base, ntok, pos, mark, seq, s_pos, s_seq, s_start, s_end);

    // This thread's accumulator rows (wgmma's D layout: warp w of the warpgroup holds rows
    // 16 w .. 16 w + 15; element 4 n + 2 h + c is row lane / 4 + 8 h, column 8 n + 2 (lane % 4) + c).
    auto row_of = [&](int h) { return wg * 64 + (warp & 3) * 16 + h * 8 + (lane >> 2); };
    const int qd = lane & 3;
    // Descriptors of this warpgroup's Q rows, K stage 0 and V stage 0 (k-step and stage offsets
    // are added to the start address field: addresses stay below 2^18, no carry out of it).
    const uint64_t dQ = wgmma_desc(smem_addr(sQ) + (uint32_t)(wg * 64 * 128), 16, 1024);
    const uint64_t dK = wgmma_desc(smem_addr(sK), 16, 1024);
    const uint64_t dV = wgmma_desc(smem_addr(sV), WG_KVHALF, 1024);
    const uint32_t sK0 = smem_addr(sK), sV0 = smem_addr(sV);
    // This thread's part of every K/V tile copy: 16-byte chunk ld_ch of rows ld_kr + 16 u (rows 16
    // apart share r & 7, so their swizzled offsets differ by 16 rows of 128 bytes).
    static_assert((NTH / CH) % 8 == 0, "copy rows");
    const int ld_kr = tid / CH, ld_ch = tid % CH;
    const unsigned kv_row32 = (unsigned)(nkv * HD);  // (a 32 x 32 -> 64-bit multiply per copy)
    const uint32_t ld_dst = swz128(ld_kr, ld_ch, WG_KVHALF);
    const bf16 *kbase = kcache + (size_t)kvh * HD + ld_ch * 8, *vbase = vcache + (size_t)kvh * HD + ld_ch * 8;
    auto load_tile = [&](const bf16 *base, uint32_t dst, const int *sl) {
#pragma unroll
        for (int u = 0; u < LDN; u++) {
            const int slot = sl[ld_kr + u * (NTH / CH)];
            cp_async16_or_zero(dst + ld_dst + (uint32_t)(u * (NTH / CH) * 128),
                               base + (size_t)((unsigned)max(slot, 0) * (uint64_t)kv_row32), slot < 0);
        }
    };

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
        for (int h = 0; h < 2; h++) {
            const int ti = row_of(h) / g;
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
            s_wmin[warp] = wmin;
        }
        // Q rows of the segment (others zero), fenced for wgmma.
#pragma unroll
        for (int u = 0; u < QLDN; u++) {
            const int c = tid + u * NTH, row = c / CH, ld_ch = c % CH, ti = row / g;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (ti >= a && ti <= e)
                v = *(const uint4 *)(q + ((size_t)(t_base + ti) * nh + (size_t)kvh * g + row % g) * HD + ld_ch * 8);
            *(uint4 *)(sQ + swz128(row, ld_ch, WG_QHALF)) = v;
        }
        fence_proxy_async();
        __syncthreads();
        int maxp = s_wmax[0];
#pragma unroll
        for (int w = 1; w < 8; w++) maxp = max(maxp, s_wmax[w]);
        const int n_tiles = maxp / BN + 1;
        // This warpgroup's highest and lowest row positions (warpgroup-uniform: wgmma is issued
        // by all its warps or none).
        int gmax = s_wmax[wg * 4], gmin = s_wmin[wg * 4];
#pragma unroll
        for (int w = 1; w < 4; w++) {
            gmax = max(gmax, s_wmax[wg * 4 + w]);
            gmin = min(gmin, s_wmin[wg * 4 + w]);
        }

        // Cache slots of tile t's keys, one per thread of the first BN, into ring entry t % R: the
        // block-table entry is loaded (load_blk) an iteration before it is stored (put_slots),
        // NS tiles ahead of use. put_slots returns whether this thread's key needs a slot it
        // lacks (the tile's flag is the OR over the CTA, taken at the next barrier).
        auto load_blk = [&](int t) {
            const int k = t * BN + tid;
            return tid < BN && t < n_tiles && k <= maxp ? bt[bs_shift >= 0 ? k >> bs_shift : k / bs] : -1;
        };
        auto put_slots = [&](int t, int blk) {
            bool bad = false;
            if (tid < BN && t < n_tiles) {
                const int k = t * BN + tid;
                const int64_t sl = (int64_t)blk * bs + (bs_shift >= 0 ? k & (bs - 1) : k % bs);
                const bool need = k <= maxp;
                const bool ok = need && blk >= 0 && sl < n_slots;
                s_slot[(t % R) * BN + tid] = ok ? (int)sl : -1;
                bad = need && !ok;
            }
            return bad;
        };
        // Group t: K_{t+NS-1} into stage (t + NS - 1) % NS and V_{t+NS-2} into its stage (each
        // when it exists); one commit group either way. Iteration j issues group j.
        auto issue = [&](int t) {
            const int tk = t + NS - 1, tv = t + NS - 2;
            if (tk < n_tiles) load_tile(kbase, sK0 + (uint32_t)((tk % NS) * WG_TILEB), s_slot + (tk % R) * BN);
            if (tv >= 0 && tv < n_tiles) load_tile(vbase, sV0 + (uint32_t)((tv % NS) * WG_TILEB), s_slot + (tv % R) * BN);
            cp_async_commit();
        };
        // Prologue: slots of tiles 0 .. NS - 2 (bit t of badq: tile j + t lacks a slot somewhere),
        // tile NS - 1's flag is taken at iteration 0's barrier; groups -(NS - 1) .. -1.
        int blk0[NS];  // (all loads first: one wait for them)
#pragma unroll
        for (int t = 0; t < NS; t++) blk0[t] = load_blk(t);
        int blk_next = load_blk(NS);
        unsigned badq = 0;
#pragma unroll
        for (int t = 0; t < NS - 1; t++) badq |= (unsigned)(__syncthreads_or(put_slots(t, blk0[t])) != 0) << t;
        bool flag = put_slots(NS - 1, blk0[NS - 1]);
        for (int t = -(NS - 1); t < 0; t++) issue(t);

        float oacc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) oacc[i] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
        uint32_t pa[BN / 16][4];  // P of the previous tile as bf16 A fragments
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int x = 0; x < 4; x++) pa[kk][x] = 0u;

        // Step j: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued together; the softmax of S_j
        // (see the header on where ptxas puts the wait); O is rescaled once P V retires. Step 0 has
        // no P V, step n_tiles no S. Every wgmma of a step is issued unconditionally (ptxas
        // serializes wgmmas under a branch it cannot prove uniform): a warpgroup whose rows all
        // end before tile j computes it anyway, wholly masked (P = 0, O unchanged).
        auto step = [&](int j, auto with_s, auto with_pv) {
            constexpr bool DS = decltype(with_s)::value, DP = decltype(with_pv)::value;
            cp_async_wait<NS - 2>();  // group j - 1: K_j and V_{j-1} landed
            // Every warpgroup is done with K_{j-1} and V_{j-2} (their stages are refilled below);
            // tile j + NS - 1's slots are visible, its flag ORed over the CTA.
            badq |= (unsigned)(__syncthreads_or(flag) != 0) << (NS - 1);
            flag = put_slots(j + NS, blk_next);  // (over tile j - 1's)
            blk_next = load_blk(j + NS + 1);
            issue(j);
            float s[32];
            if constexpr (DS) {
                wgmma_fence();  // s was read by the last softmax
                const uint32_t stg = (uint32_t)((j % NS) * (WG_TILEB >> 4));  // 16-byte units
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    // Columns 16 kk .. 16 kk + 15: half kk / 4, 32 bytes a k-step within the atom.
                    const uint32_t offq = (uint32_t)(((kk >> 2) * WG_QHALF + (kk & 3) * 32) >> 4);
                    const uint32_t offk = (uint32_t)(((kk >> 2) * WG_KVHALF + (kk & 3) * 32) >> 4) + stg;
                    wgmma_m64n64k16_ss(s, dQ + offq, dK + offk, kk);
                }
                wgmma_commit();
            }
            if constexpr (DP) {
                wgmma_fence();  // pa and O written by this thread
                const uint32_t stg = (uint32_t)(((j - 1) % NS) * (WG_TILEB >> 4));
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)  // keys 16 kk .. 16 kk + 15: two 8-key groups of 1024 B
                    wgmma_m64n128k16_rs_tb(oacc, pa[kk], dV + stg + (uint32_t)((kk * 16 * 128) >> 4));
                wgmma_commit();
            }
            float alpha[2] = {1.f, 1.f};
            if constexpr (DS) {
                wgmma_wait<DP ? 1 : 0>();  // S_j retired; P V may still run
#pragma unroll
                for (int i = 0; i < 32; i++) reg_fence(s[i]);
                const bool bad = badq & 1u;
                if (bad || j * BN + BN - 1 > gmin) {
                    const int *sl = s_slot + (j % R) * BN + 2 * qd;
                    const int rp0 = s_rpos[row_of(0)], rp1 = s_rpos[row_of(1)];
#pragma unroll
                    for (int n = 0; n < BN / 8; n++) {
                        const int2 sv = bad ? *(const int2 *)(sl + 8 * n) : make_int2(0, 0);
#pragma unroll
                        for (int c = 0; c < 4; c++) {
                            const int key = j * BN + n * 8 + 2 * qd + (c & 1);
                            const bool ok = key <= (c >> 1 ? rp1 : rp0) && (c & 1 ? sv.y : sv.x) >= 0;
                            s[4 * n + c] = ok ? s[4 * n + c] : -INFINITY;
                        }
                    }
                }
                // Online softmax of row h: elements 4 n + 2 h, 4 n + 2 h + 1.
                float mx[2] = {-INFINITY, -INFINITY}, base[2];
#pragma unroll
                for (int n = 0; n < BN / 8; n++) {
                    mx[0] = fmaxf(mx[0], fmaxf(s[4 * n], s[4 * n + 1]));
                    mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                    const float mnew = fmaxf(m_run[h], mx[h]);
                    base[h] = mnew == -INFINITY ? 0.f : mnew * sl2;
                    // 0 when m_run = -inf, 1 when the max stays.
                    alpha[h] = mnew == m_run[h] ? 1.f : ex2(fmaf(m_run[h], sl2, -base[h]));
                    m_run[h] = mnew;
                    l_run[h] *= alpha[h];
                }
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int h = (i >> 1) & 1;
                    const float p = ex2(fmaf(s[i], sl2, -base[h]));
                    s[i] = p;
                    l_run[h] += p;
                }
            }
            if constexpr (DP) {
                wgmma_wait<0>();  // P_{j-1} V_{j-1} retired: O and pa free
#pragma unroll
                for (int i = 0; i < 64; i++) reg_fence(oacc[i]);
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                    for (int x = 0; x < 4; x++) reg_fence(pa[kk][x]);
            }
            if constexpr (DS) {
                // (O is still zero at step 0. Skipping this when no row of the warp has a new max,
                // behind a warp vote, ran 4% slower on an H100: 361 vs 376 TFLOP/s at 8k.)
                if constexpr (DP) {
#pragma unroll
                    for (int n = 0; n < HD / 8; n++) {
                        oacc[4 * n] *= alpha[0];
                        oacc[4 * n + 1] *= alpha[0];
                        oacc[4 * n + 2] *= alpha[1];
                        oacc[4 * n + 3] *= alpha[1];
                    }
                }
                // P_j as bf16 A fragments: k-step kk (keys 16 kk .. 16 kk + 15) = S's n-tiles 2 kk
                // (registers 0, 1: rows r, r + 8) and 2 kk + 1 (registers 2, 3).
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                    for (int x = 0; x < 4; x++) pa[kk][x] = pack_bf16(s[8 * kk + 2 * x], s[8 * kk + 2 * x + 1]);
            }
            badq >>= 1;
        };
        step(0, std::true_type{}, std::false_type{});
        for (int j = 1; j < n_tiles; j++) step(j, std::true_type{}, std::true_type{});
        step(n_tiles, std::false_type{}, std::true_type{});

        // Normalise and store the segment's rows.
#pragma unroll
        for (int h = 0; h < 2; h++) {
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
            l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row_of(h);
            if (s_rpos[row] < 0) continue;
            const float inv = l_run[h] > 0.f ? 1.f / l_run[h] : 0.f;
            bf16 *o = out + ((size_t)(t_base + row / g) * nh + (size_t)kvh * g + row % g) * HD + 2 * qd;
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                *(__nv_bfloat162 *)(o + n * 8) =
                    __floats2bfloat162_rn(oacc[4 * n + 2 * h] * inv, oacc[4 * n + 2 * h + 1] * inv);
        }
        cp_async_wait<0>();
        __syncthreads();  // shared memory free for the next segment
    }
#else
    __trap();  // built for sm_90a only; kc_fa_wgmma_on() keeps other devices off this kernel
#endif
}

}  // namespace

bool kc_fa_wgmma_on(void) {
    static const bool on = [] {
        if (kc_env_off("KAON_FA_WGMMA")) return false;
        int dev = 0, major = 0, minor = 0;
        return cudaGetDevice(&dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
               cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
               major == 9 && minor == 0;
    }();
    return on;
}

int kc_fa_prefill_wgmma(kc_backend *b, const bf16 *q, const bf16 *kcache, const bf16 *vcache, const int32_t *d_pos,
                        const int32_t *d_mark, const int32_t *d_seq, const int32_t *d_tab, int T, int max_blocks,
                        int bs, int64_t n_slots, int nh, int nkv, float sl2, bf16 *out) {
    const int g = nh / nkv, tpt = FA_BM / g;
    int bs_shift = -1;
    for (int sh = 0; sh < 31 && bs_shift < 0; sh++)
        if (bs == 1 << sh) bs_shift = sh;
    auto kern = k_fa_prefill_wgmma;
    // Set outside graph recording (the step's eager first run sets it before any recording).
    if (!b->capturing &&
        kc_check(b, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WG_SMEM),
                 "prefill attention (wgmma): shared memory"))
        return -1;
    dim3 grid((unsigned)((T + tpt - 1) / tpt), (unsigned)nkv);
    kern<<<grid, WG_NTH, WG_SMEM, b->stream>>>(q, kcache, vcache, d_pos, d_mark, d_seq, d_tab, T, max_blocks, bs,
                                               bs_shift, n_slots, nh, nkv, g, tpt, sl2, out);
    return kc_launched(b, "prefill attention (wgmma)");
}
