// Decode attention on the tensor cores, for grouped-query heads (the g query heads that share a
// KV head, 2..16, are the rows of one 16-row mma tile).
//
// Why: the CUDA-core kernel (cuda_attention_decode.cu) spends per key g x hd FMAs on the scores
// and as many on the output, plus shuffles to sum each row; at g = 4..8 that is 2-4 FMAs per
// byte of K/V read, and a batched step (64-256 sequences of 1-2K keys) is bound by issuing them,
// not by the memory. Here the same block (one token, one KV head, one range of its keys; W
// warps that merge at the end, dec_finish) computes S = Q K^T and O += P V with mma.m16n8k16.
//
// Each warp walks its own tiles of 32 keys (tile i of the range goes to warp i % W): lane j
// looks up key j's cache slot, the tile's K and V rows are gathered with cp.async into the
// warp's two stages in shared memory (the next tile's copies are in flight while this one is
// computed; no block-wide barrier in the loop), S comes from ldmatrix'd K and the Q fragments
// held in registers, the online softmax runs on the accumulators (exp2, scale x log2 e), and P is
// reused in place as the A fragments of P V (V through ldmatrix.trans). Keys without a slot
// (past the range, or an unmapped block) are zero-filled and masked. head_dim 64 or 128; the rest
// stays with the CUDA-core kernel (dtc_mode says which launches come here).
//
// An FP8 cache (e4m3 codes; the mma runs on f16, where every e4m3 value is exact: q and P rounded
// to f16, k_scale folded into the score scale, v_scale into the output) keeps its codes in shared
// memory, NST stages a warp (NST - 1 tiles in flight, half a bf16 tile's bytes each; 4 at <= 4
// tokens, 2 in batched launches: dtc_dispatch), and forms the
// mma B fragments from them in registers: a 32-bit word of codes widens to two f16 pairs with two
// cvt.rn.f16x2.e4m3x2. S: since a dot product may take the head dims in any order, S step kk pairs
// in lane c's k slots the 4 dims that are bytes 4c..4c+3 of a 16-byte group of the K row, and Q's A
// fragments take the same order. P V: the 16 keys of a step sit in shared memory in the order of P's
// A fragments (lane c's keys 2c, 2c+1, 2c+8, 2c+9 in four rows it reads), a byte permute pairs a
// dim's codes of two keys, and O's columns are dims in an order of their own (column n of n-tile
// nt: dim HD/8 n + nt), undone when the warp stores its output. (It replaced a pass that widened
// each tile to f16 in shared memory for ldmatrix, serial with the mma: 256 x 2K keys on the H200
// 689 -> 318 us, session 44.)
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_attention_decode.cuh"
#include "backend/cuda/cuda_attention_runs.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_fp8_frag.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DTC_BN 32  // keys per warp tile: one per lane
#define DTC_ROWS 16

namespace {

// Q tile, then per warp SL slots of DTC_BN bf16 rows (bf16: two stages of a K and a V tile, SL 4;
// FP8: SL stages of e4m3 K and V tiles, half the bytes each, SL 4 by default); after the loop the
// merge buffers (wm, wl [W][16], wacc [W][16][HD], w_s [16][DEC_MAX_SPLITS]) take the stages' place;
// the last 16 bytes hold the merge's flag.
template <int HD, int W, int SL = 4>
__host__ __device__ constexpr size_t dtc_smem_bytes() {
    constexpr size_t q = (size_t)DTC_ROWS * HD * 2, st = (size_t)W * SL * DTC_BN * HD * 2;
    constexpr size_t mg = (size_t)W * DTC_ROWS * 2 * 4 + (size_t)W * DTC_ROWS * HD * 4 +
                          (size_t)DTC_ROWS * DEC_MAX_SPLITS * 4;
    return q + (st > mg ? st : mg) + 16;
}

// The FP8 path's: the tile's keys without a slot masked, then the online softmax of rows lane / 4
// and lane / 4 + 8 (accumulator elements 2i, 2i + 1): s becomes P, the running max / sum and oacc
// are rescaled. (The bf16 loop keeps its copy inline: through this function the bf16 instances'
// registers come out otherwise.)
template <int NT_S, int NT_O>
__device__ __forceinline__ void dtc_softmax(float (&s)[NT_S][4], unsigned valid, int qd, float sl2, float (&m_run)[2],
                                            float (&l_run)[2], float (&oacc)[NT_O][4]) {
    if (valid != 0xffffffffu) {
#pragma unroll
        for (int n = 0; n < NT_S; n++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                if (!((valid >> (n * 8 + 2 * qd + (c & 1))) & 1u)) s[n][c] = -INFINITY;
    }
    float mx[2] = {-INFINITY, -INFINITY}, base[2];
#pragma unroll
    for (int n = 0; n < NT_S; n++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mnew = fmaxf(m_run[i], mx[i]);
        base[i] = mnew == -INFINITY ? 0.f : mnew * sl2;
        const float alpha = mnew == m_run[i] ? 1.f : ex2(fmaf(m_run[i], sl2, -base[i]));
        m_run[i] = mnew;
        l_run[i] *= alpha;
#pragma unroll
        for (int n = 0; n < NT_O; n++) {
            oacc[n][2 * i] *= alpha;
            oacc[n][2 * i + 1] *= alpha;
        }
    }
#pragma unroll
    for (int n = 0; n < NT_S; n++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float e = ex2(fmaf(s[n][c], sl2, -base[c >> 1]));
            s[n][c] = e;
            l_run[c >> 1] += e;
        }
}

// KT: bf16 (a bf16 cache, bf16 mma) or uint8_t (e4m3 codes, f16 mma, fragments from the codes).
// NST: the FP8 path's stages a warp (NST - 1 tiles in flight; 2-4); the bf16 path takes 4 slots.
template <int HD, int W, typename KT, int NST = 4>
__global__ void __launch_bounds__(W * 32, 1)
k_decode_tc(const bf16 *__restrict__ q, const KT *__restrict__ kcache, const KT *__restrict__ vcache,
            const int32_t *__restrict__ pos, const int32_t *__restrict__ seq, const int32_t *__restrict__ tables,
            int n_seqs, int max_blocks, int bs, int64_t n_slots, int nh, int nkv, int g, float sl2, float vs,
            int window, int min_keys, const int32_t *__restrict__ tmap, bf16 *__restrict__ out,
            float *__restrict__ part, unsigned *__restrict__ count) {
    constexpr bool F8 = sizeof(KT) == 1;
    constexpr int ROWB = HD * 2, CH = HD / 8, TILEB = DTC_BN * ROWB;
    constexpr int KS_Q = HD / 16, NT_S = DTC_BN / 8, NT_O = HD / 8, KS_P = DTC_BN / 16;
    constexpr int CHG = HD * (int)sizeof(KT) / 16;  // 16-byte chunks per cache row
    constexpr int LDN = DTC_BN * CHG / 32;          // per lane per K (or V) tile
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *sQ = smem, *sW = smem + DTC_ROWS * ROWB;
    static_assert(NST >= 2 && NST <= 4, "k_decode_tc: FP8 stages");
    constexpr int SL = F8 ? NST : 4;  // TILEB slots a warp
    int *last_flag = (int *)(smem + dtc_smem_bytes<HD, W, SL>() - 16);
    kc_pdl_trigger();

    // Block row bx serves token tmap[bx] (a mixed step's decode tokens) or token bx.
    const int bx = blockIdx.x, t = tmap ? ld_meta(tmap + bx) : bx, kvh = blockIdx.y, z = blockIdx.z, S = gridDim.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const DecRange rg = dec_range(pos, seq, tables, t, z, S, n_seqs, max_blocks, bs, window, min_keys);
    const int n_act = rg.n_act, k0 = rg.k0, k1 = rg.k1;
    const int32_t *bt = rg.bt;
    const size_t row = (size_t)nkv * HD;
    const KT *kbase = kcache + (size_t)kvh * HD, *vbase = vcache + (size_t)kvh * HD;
    kc_pdl_wait();  // every block waits, also an idle range
    if (z >= n_act) return;

    // Q: the g heads of this KV head as rows (the rest zero), then into registers as A fragments.
    for (int c = tid; c < DTC_ROWS * CH; c += W * 32) {
        const int r = c / CH, ch = c % CH;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < g) v = *(const uint4 *)(q + ((size_t)t * nh + (size_t)kvh * g + r) * HD + ch * 8);
        if (F8) {  // to f16, saturating (a |q| past 65504 would otherwise become inf)
            uint32_t *w = (uint32_t *)&v;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[e]);
                w[e] = pack_f16(fminf(fmaxf(f.x, -65504.f), 65504.f), fminf(fmaxf(f.y, -65504.f), 65504.f));
            }
        }
        *(uint4 *)(sQ + swz<HD>(r, ch)) = v;
    }
    __syncthreads();
    // ldmatrix addresses as in cuda_attention_prefill.cu: every fragment row is = r8 (mod 8), so
    // chunk 8a + 2i + half sits at byte 128 a + (x0 ^ 32 i).
    const int mi = lane >> 3, r8 = lane & 7, qd = lane & 3;
    const uint32_t xk0 = (uint32_t)(((mi & 1) ^ r8) << 4), xv0 = (uint32_t)(((mi >> 1) ^ r8) << 4);
    uint32_t qf[KS_Q][4];
    if constexpr (F8) {
        // Step kk = 4h + i of S takes dims 64h + 16qd + 4i + {0, 1} (a0, a1) and + {2, 3} (a2, a3): the
        // order in which word i of a lane's 16 bytes of a K row holds them (the loop's K reads).
#pragma unroll
        for (int h = 0; h < HD / 64; h++)
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int r = (lane >> 2) + 8 * hr;
                const uint4 a = *(const uint4 *)(sQ + swz<HD>(r, 8 * h + 2 * qd));
                const uint4 c = *(const uint4 *)(sQ + swz<HD>(r, 8 * h + 2 * qd + 1));
                const uint32_t w8[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
                for (int i = 0; i < 4; i++) qf[4 * h + i][hr] = w8[2 * i], qf[4 * h + i][2 + hr] = w8[2 * i + 1];
            }
    } else {
        const uint32_t aQ = smem_addr(sQ) + (uint32_t)(((mi & 1) * 8 + r8) * ROWB);
#pragma unroll
        for (int kk = 0; kk < KS_Q; kk++) ldsm_x4(qf[kk], aQ + (xv0 ^ ((uint32_t)(kk & 3) << 5)) + (kk >> 2) * 128);
    }
    // bf16: stage s's K tile at 2s, its V tile at 2s + 1 (tiles of TILEB bytes). FP8: stage s at s
    // (the loop below).
    const uint32_t wb = smem_addr(sW) + (uint32_t)(warp * SL * TILEB);
    const uint32_t aK = wb + (uint32_t)(((mi >> 1) * 8 + r8) * ROWB);
    const uint32_t aV = wb + TILEB + (uint32_t)(((mi & 1) * 8 + r8) * ROWB);

    // Lane j's key of the tile at kt: its cache slot, -1 when there is none.
    auto slot_of = [&](int kt) {
        const int kk = kt + lane;
        if (kk >= k1) return -1;
        const int blk = bt[kk / bs];
        const int64_t s64 = (int64_t)blk * bs + kk % bs;
        return blk >= 0 && s64 < n_slots ? (int)s64 : -1;
    };
    float oacc[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; n++) oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};  // rows lane / 4 and lane / 4 + 8
    const int step = W * DTC_BN;
    int kt = k0 + warp * DTC_BN;
    if constexpr (F8) {
        // Stage st of NST (NST - 1 tiles in flight while one is used): the tile's e4m3 K rows at st TILEB,
        // its V rows at st TILEB + TILEB / 2, HD bytes a row. The 16-byte chunks are swizzled so that
        // the fragment reads of a quarter warp (16 bytes a lane; HD 64's V: a half warp, 8 bytes) meet
        // every bank once (checked by an emulation of the lanes' addresses):
        // K: key kr at row kr, chunk ch at ch ^ kx(kr): HD 128's odd rows swap their 64-byte halves
        // (a quarter warp reads 64 bytes of rows 2m and 2m + 1).
        // V: the 16 keys of step kk of P V in the order of P's A fragments: key 8e + 2c + b at row
        // 4(2e + b) + c, so lane c's rows 4r + c hold its keys 2c, 2c + 1, 2c + 8, 2c + 9, and two byte
        // permutes (zip_*) of a word from each row give both registers of its B fragments of 4
        // dims; chunk ch at ch ^ vx(row) (a quarter warp reads the same chunk column of rows 4r .. 4r + 3).
        auto kx = [](int r) { return HD == 128 ? 4 * (r & 1) : 0; };
        auto vx = [](int r) { return HD == 128 ? 2 * (r & 3) : r & 2; };
        auto vrow = [](int k) { return (k & ~15) + 4 * (2 * ((k >> 3) & 1) + (k & 1)) + ((k >> 1) & 3); };
        auto issue8 = [&](int slot, int st) {
            const uint32_t dK = wb + (uint32_t)(st * TILEB), dV = dK + TILEB / 2;
#pragma unroll
            for (int u = 0; u < LDN; u++) {
                // HD 64: a quarter warp copies keys k, k ^ 3 (not k, k + 1): rows of either parity in
                // K and in V, so its 128 bytes land on all the banks.
                const int c = lane + u * 32, kc = c / CHG, ch = c % CHG;
                const int kr = HD == 128 ? kc : kc ^ ((kc & 1) << 1), vr = vrow(kr);
                const int sl = __shfl_sync(0xffffffffu, slot, kr);
                const size_t off = (size_t)(sl >= 0 ? sl : 0) * row + ch * 16;
                cp_async16(dK + (uint32_t)(kr * HD + ((ch ^ kx(kr)) << 4)), kbase + off, sl >= 0);
                cp_async16(dV + (uint32_t)(vr * HD + ((ch ^ vx(vr)) << 4)), vbase + off, sl >= 0);
            }
            cp_async_commit();
        };
        // The lane's reads: K row 8nt + lane / 4, chunk 4h + qd (S steps 4h .. 4h + 3, as qf); V rows
        // 16kk + 4r + qd, the lane's output column's dims (HD 128: 16-byte chunk lane / 4, HD 64:
        // its 8-byte half); n-tile nt of O column n is dim HD / 8 n + nt.
        const int n8 = lane >> 2;
        uint32_t k8[HD / 64];
#pragma unroll
        for (int h = 0; h < HD / 64; h++) k8[h] = (uint32_t)(n8 * HD + (((4 * h + qd) ^ kx(n8)) << 4));
        const uint32_t v8 = TILEB / 2 + (uint32_t)(qd * HD) +
                            (HD == 128 ? (uint32_t)((n8 ^ vx(qd)) << 4)
                                       : (uint32_t)((((n8 >> 1) ^ vx(qd)) << 4) + ((n8 & 1) << 3)));

        unsigned vq[NST - 1];  // the tiles in flight: their lanes with a slot
#pragma unroll
        for (int p = 0; p < NST - 1; p++) {
            const int kp = kt + p * step, sl = kp < k1 ? slot_of(kp) : -1;
            vq[p] = __ballot_sync(0xffffffffu, sl >= 0);
            if (kp < k1) issue8(sl, p);
            else cp_async_commit();  // (empty groups keep the count of wait_group)
        }
        int nslot = kt + (NST - 1) * step < k1 ? slot_of(kt + (NST - 1) * step) : -1;
        for (int j = 0; kt < k1; j++, kt += step) {
            const int kn = kt + (NST - 1) * step;
            if (kn < k1) issue8(nslot, (j + NST - 1) % NST);  // into the stage the last tile freed
            else cp_async_commit();
            const unsigned valid = vq[0];
#pragma unroll
            for (int p = 0; p < NST - 2; p++) vq[p] = vq[p + 1];
            vq[NST - 2] = __ballot_sync(0xffffffffu, nslot >= 0);
            nslot = kn + step < k1 ? slot_of(kn + step) : -1;
            cp_async_wait<NST - 1>();
            __syncwarp();  // every lane's copies of this tile landed
            const uint32_t sb = wb + (uint32_t)((j % NST) * TILEB);

            float s[NT_S][4];
#pragma unroll
            for (int n = 0; n < NT_S; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT_S; nt++)
#pragma unroll
                for (int h = 0; h < HD / 64; h++) {
                    const uint4 kw = lds128(sb + k8[h] + (uint32_t)(nt * 8 * HD));
                    const uint32_t w4[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        uint32_t b0, b1;
                        e4m3x4_f16(w4[i], b0, b1);
                        mma16816_f16(s[nt], qf[4 * h + i], b0, b1);
                    }
                }
            dtc_softmax(s, valid, qd, sl2, m_run, l_run, oacc);
            // O += P V.
#pragma unroll
            for (int kk = 0; kk < KS_P; kk++) {
                uint32_t pa[4];
                pa[0] = pack_f16(s[2 * kk][0], s[2 * kk][1]);
                pa[1] = pack_f16(s[2 * kk][2], s[2 * kk][3]);
                pa[2] = pack_f16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[3] = pack_f16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                constexpr int NWV = HD / 32;  // words of a V row per lane
                uint32_t vw[4][NWV];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const uint32_t at = sb + v8 + (uint32_t)((16 * kk + 4 * r) * HD);
                    if constexpr (NWV == 4) {
                        const uint4 v = lds128(at);
                        vw[r][0] = v.x, vw[r][1] = v.y, vw[r][2] = v.z, vw[r][3] = v.w;
                    } else {
                        const uint2 v = lds64(at);
                        vw[r][0] = v.x, vw[r][1] = v.y;
                    }
                }
#pragma unroll
                for (int w = 0; w < NWV; w++) {
                    // Dims 4w + {0, 1} of the column, then 4w + {2, 3}: keys (2c, 2c + 1) in x, (+8, +9) in y.
                    uint32_t x0, x1, y0, y1;
                    e4m3x4_f16(zip_lo(vw[0][w], vw[1][w]), x0, x1);
                    e4m3x4_f16(zip_lo(vw[2][w], vw[3][w]), y0, y1);
                    mma16816_f16(oacc[4 * w], pa, x0, y0);
                    mma16816_f16(oacc[4 * w + 1], pa, x1, y1);
                    e4m3x4_f16(zip_hi(vw[0][w], vw[1][w]), x0, x1);
                    e4m3x4_f16(zip_hi(vw[2][w], vw[3][w]), y0, y1);
                    mma16816_f16(oacc[4 * w + 2], pa, x0, y0);
                    mma16816_f16(oacc[4 * w + 3], pa, x1, y1);
                }
            }
            __syncwarp();  // the stage is free again
        }
    } else {
        // The tile's K and V rows into stage st, straight into the swizzled tiles (zero-filled where
        // there is no slot); one group.
        auto issue = [&](int slot, int st) {
            const uint32_t dK = wb + (uint32_t)(st * 2 * TILEB), dV = dK + TILEB;
#pragma unroll
            for (int u = 0; u < LDN; u++) {
                const int c = lane + u * 32, kr = c / CHG, ch = c % CHG;
                const int sl = __shfl_sync(0xffffffffu, slot, kr);
                const size_t off = (size_t)(sl >= 0 ? sl : 0) * row + ch * 8;
                cp_async16(dK + swz<HD>(kr, ch), kbase + off, sl >= 0);
                cp_async16(dV + swz<HD>(kr, ch), vbase + off, sl >= 0);
            }
            cp_async_commit();
        };
        int slot = kt < k1 ? slot_of(kt) : -1;
        if (kt < k1) issue(slot, 0);
        int nslot = kt + step < k1 ? slot_of(kt + step) : -1;
        for (int j = 0; kt < k1; j++, kt += step) {
            const int st = j & 1;
            if (kt + step < k1) issue(nslot, st ^ 1);  // the next tile flies while this one is used
            else cp_async_commit();
            const unsigned valid = __ballot_sync(0xffffffffu, slot >= 0);
            slot = nslot;
            nslot = kt + 2 * step < k1 ? slot_of(kt + 2 * step) : -1;
            cp_async_wait<1>();
            __syncwarp();  // every lane's copies of this tile landed
            const uint32_t stg = (uint32_t)(st * 2 * TILEB);

            float s[NT_S][4];
#pragma unroll
            for (int n = 0; n < NT_S; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS_Q; kk++)
#pragma unroll
                for (int np = 0; np < NT_S / 2; np++) {
                    uint32_t kb[4];
                    ldsm_x4(kb, aK + stg + (xk0 ^ ((uint32_t)(kk & 3) << 5)) + (kk >> 2) * 128 + np * 16 * ROWB);
                    mma16816(s[2 * np], qf[kk], kb[0], kb[1]);
                    mma16816(s[2 * np + 1], qf[kk], kb[2], kb[3]);
                }
            if (valid != 0xffffffffu) {
#pragma unroll
                for (int n = 0; n < NT_S; n++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        if (!((valid >> (n * 8 + 2 * qd + (c & 1))) & 1u)) s[n][c] = -INFINITY;
            }
            // Online softmax of rows i = 0, 1 (accumulator elements 2i, 2i + 1).
            float mx[2] = {-INFINITY, -INFINITY}, base[2];
#pragma unroll
            for (int n = 0; n < NT_S; n++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                const float mnew = fmaxf(m_run[i], mx[i]);
                base[i] = mnew == -INFINITY ? 0.f : mnew * sl2;
                const float alpha = mnew == m_run[i] ? 1.f : ex2(fmaf(m_run[i], sl2, -base[i]));
                m_run[i] = mnew;
                l_run[i] *= alpha;
#pragma unroll
                for (int n = 0; n < NT_O; n++) {
                    oacc[n][2 * i] *= alpha;
                    oacc[n][2 * i + 1] *= alpha;
                }
            }
#pragma unroll
            for (int n = 0; n < NT_S; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float e = ex2(fmaf(s[n][c], sl2, -base[c >> 1]));
                    s[n][c] = e;
                    l_run[c >> 1] += e;
                }
            // O += P V.
#pragma unroll
            for (int kk = 0; kk < KS_P; kk++) {
                uint32_t pa[4];
                pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
                pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
                pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int np = 0; np < NT_O / 2; np++) {
                    uint32_t vb[4];
                    ldsm_x4_t(vb, aV + stg + (xv0 ^ ((uint32_t)(np & 3) << 5)) + (np >> 2) * 128 + kk * 16 * ROWB);
                    mma16816(oacc[2 * np], pa, vb[0], vb[1]);
                    mma16816(oacc[2 * np + 1], pa, vb[2], vb[3]);
                }
            }
            __syncwarp();  // the stage is free again
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }
    __syncthreads();  // every warp is done with its stages: the merge buffers take their place
    float *wm = (float *)sW, *wl = wm + W * DTC_ROWS, *wacc = wl + W * DTC_ROWS;
    float *w_s = wacc + W * DTC_ROWS * HD;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = (lane >> 2) + 8 * i;
        if (qd == 0) {
            wm[warp * DTC_ROWS + r] = m_run[i] == -INFINITY ? -INFINITY : m_run[i] * sl2;
            wl[warp * DTC_ROWS + r] = l_run[i];
        }
#pragma unroll
        for (int n = 0; n < NT_O; n++) {
            if constexpr (F8) {  // column c of n-tile n: dim HD / 8 c + n
                float *o = wacc + (size_t)(warp * DTC_ROWS + r) * HD + n + HD / 8 * 2 * qd;
                o[0] = oacc[n][2 * i];
                o[HD / 8] = oacc[n][2 * i + 1];
            } else {
                float *o = wacc + (size_t)(warp * DTC_ROWS + r) * HD + n * 8 + 2 * qd;
                o[0] = oacc[n][2 * i];
                o[1] = oacc[n][2 * i + 1];
            }
        }
    }
    __syncthreads();
    dec_finish<HD, DTC_ROWS, W>(wm, wl, wacc, w_s, last_flag, t, bx, kvh, z, S, n_act, nh, nkv, g, vs, out, part,
                                count);
}

template <int HD, int W, typename KT, int NST = 4>
int dtc_launch(kc_backend *b, dim3 grid, const bf16 *q, const void *kcache, const void *vcache,
               const int32_t *pos, const int32_t *seq, const int32_t *tab, const int32_t *tmap,
               const kaon_attn_meta *m, int64_t n_slots, int nh, int nkv, float sl2, float vs, int window,
               int min_keys, bf16 *out) {
    constexpr size_t smem = dtc_smem_bytes<HD, W, sizeof(KT) == 1 ? NST : 4>();
    auto kern = k_decode_tc<HD, W, KT, NST>;
    // Set outside graph recording (the step's eager first run sets it before any recording).
    if (!b->capturing &&
        kc_check(b, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "decode attention: shared memory"))
        return -1;
    return kc_check(b,
                    kc_launch(b, kern, grid, dim3(W * 32), smem, q, (const KT *)kcache, (const KT *)vcache, pos, seq,
                              tab, m->n_seqs, m->max_blocks, m->block_size, n_slots, nh, nkv, nh / nkv, sl2, vs,
                              window, min_keys, tmap, out, b->attn_part, b->attn_count),
                    "decode attention (tensor cores)");
}

// Warps per block for head_dim 128: 2 (3 blocks per SM) for batched steps: 256 x 1K 262 us vs 296
// with one block of 4 per SM; 4 for launches of <= 4 tokens (batch 1: 242 tok/s with 4, 228 with 2).
// KAON_DEC_TC_WARPS=2/3/4/6 overrides (A/B).
int dtc_warps(int tokens) {
    static const int w_env = getenv("KAON_DEC_TC_WARPS") ? atoi(getenv("KAON_DEC_TC_WARPS")) : 0;
    return w_env == 2 || w_env == 3 || w_env == 4 || w_env == 6 ? w_env : tokens <= DEC_FEW_TOKENS ? 4 : 2;
}

// Blocks of k_decode_tc<HD, W, bf16> resident per SM (shared memory is what limits them; the FP8
// instance takes the same), or 0 when unknown: the query fails, or it would run during graph
// recording (the step's eager first run asks first).
template <int HD, int W>
int dtc_per_sm(bool capturing) {
    static int n = -1;
    if (n < 0) {
        if (capturing) return 0;
        const auto kern = k_decode_tc<HD, W, bf16>;
        int v = 0;
        if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dtc_smem_bytes<HD, W>()) ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kern, W * 32, dtc_smem_bytes<HD, W>()))
            v = 0;
        n = v;
    }
    return n;
}

// The FP8 path's stage count n where KT is e4m3 codes, else 4 (the bf16 kernels take no other).
#define F8_ST(n) (sizeof(KT) == 1 ? (n) : 4)

template <typename KT>
int dtc_dispatch(kc_backend *b, dim3 grid, const bf16 *q, const void *kcache, const void *vcache,
                 const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos, const int32_t *d_seq,
                 const int32_t *d_tab, const int32_t *tmap, int nh, int nkv, int hd, float sl2, float vs,
                 int window, int min_keys, bf16 *out) {
    if (hd == 64)
        return dtc_launch<64, 4, KT>(b, grid, q, kcache, vcache, d_pos, d_seq, d_tab, tmap, m, n_slots, nh, nkv,
                              sl2, vs, window, min_keys, out);
    const int w = dtc_warps((int)grid.x);
    // Stages a warp on an FP8 cache (head_dim 128): 2 for batched launches (less shared memory a
    // block: 6 blocks of 2 warps a SM instead of 3; H100 dec_bench 64 x 1-4K 9-12% faster, 256 x
    // 1-2K 4-5%), 4 for launches of <= 4 tokens (one block a SM either way; batch 1 12% slower at 2).
    // KAON_DEC_TC_FP8_STAGES=2/3/4 sets it for every launch (A/B).
    static const int st_env = getenv("KAON_DEC_TC_FP8_STAGES") ? atoi(getenv("KAON_DEC_TC_FP8_STAGES")) : 0;
    const int nst = sizeof(KT) != 1 ? 4 : st_env >= 2 && st_env <= 4 ? st_env : (int)grid.x <= DEC_FEW_TOKENS ? 4 : 2;
#define DTC_WN(W, N)                                                                                               \
    dtc_launch<128, W, KT, N>(b, grid, q, kcache, vcache, d_pos, d_seq, d_tab, tmap, m, n_slots, nh, nkv, sl2, vs, \
                              window, min_keys, out)
#define DTC_W(W) (nst == 2 ? DTC_WN(W, F8_ST(2)) : nst == 3 ? DTC_WN(W, F8_ST(3)) : DTC_WN(W, 4))
    return w == 2 ? DTC_W(2) : w == 3 ? DTC_W(3) : w == 6 ? DTC_W(6) : DTC_W(4);
#undef DTC_W
#undef DTC_WN
}
#undef F8_ST

}  // namespace

// Which launches take this kernel: every launch whose KV heads serve 2-16 query heads (measured
// faster than the CUDA-core kernel at batch 1 too, PERF.md 2026-12-05); KAON_DEC_TC=0 never.
static int dtc_mode(void) {
    static const bool off = kc_env_off("KAON_DEC_TC");
    return off ? 0 : 1;
}

int kc_attention_decode_tc_per_sm(const kc_backend *b, int tokens, int hd) {
    const bool c = b->capturing;
    if (hd == 64) return dtc_per_sm<64, 4>(c);
    switch (dtc_warps(tokens)) {
    case 2: return dtc_per_sm<128, 2>(c);
    case 3: return dtc_per_sm<128, 3>(c);
    case 6: return dtc_per_sm<128, 6>(c);
    default: return dtc_per_sm<128, 4>(c);
    }
}

bool kc_attention_decode_tc_takes(int nh, int nkv, int hd) {
    const int g = nkv > 0 ? nh / nkv : 0;
    return dtc_mode() != 0 && g >= 2 && g <= DTC_ROWS && (hd == 64 || hd == 128);
}

int kc_attention_decode_tc(kc_backend *b, dim3 grid, const bf16 *q, const void *kcache, const void *vcache,
                           bool fp8, const kaon_attn_meta *m, int64_t n_slots, const int32_t *d_pos,
                           const int32_t *d_seq, const int32_t *d_tab, const int32_t *tmap, int nh, int nkv, int hd,
                           float scale, float vs, int window, bf16 *out) {
    if (!kc_attention_decode_tc_takes(nh, nkv, hd)) return 1;
    // Steps that may hold prefill runs, without the list of their other tokens (graphed steps),
    // stay with the CUDA-core kernel: a block here holds 32 KB of shared memory per warp even to
    // write the zeros of a marked token.
    if (!tmap && m->n_tokens - m->n_seqs >= FA_MIN_RUN - 1) return 1;
    // Ranges of 256 keys at least (KAON_DEC_MIN_KEYS overrides, as for the other kernel).
    static const int mk_env = getenv("KAON_DEC_MIN_KEYS") ? atoi(getenv("KAON_DEC_MIN_KEYS")) : 0;
    const int min_keys = mk_env >= 16 && mk_env <= 4096 ? mk_env : 8 * DTC_BN;
    const float sl2 = scale * 1.4426950408889634f;
    return fp8 ? dtc_dispatch<uint8_t>(b, grid, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, tmap, nh, nkv,
                                       hd, sl2, vs, window, min_keys, out)
               : dtc_dispatch<bf16>(b, grid, q, kcache, vcache, m, n_slots, d_pos, d_seq, d_tab, tmap, nh, nkv, hd,
                                    sl2, vs, window, min_keys, out);
}
