// x86 SIMD kernels of the CPU backend, written once and compiled twice: cpu_avx2.c builds them
// for AVX2+FMA+F16C (u8 x s8 products with vpmaddubsw + vpmaddwd) and cpu_vnni.c for CPUs that
// also have AVX-512 VNNI (vpdpbusd does both steps in one instruction, 256-bit registers).
// The including file sets KX(name) (name mangling), KX_VNNI (0/1), KX_ROWS (activation rows
// per call: 4 fit AVX2's 16 vector registers, 8 fit AVX-512's 32) and the target pragma.
//
// The quantized kernels work on groups of 8 blocks of 32: each block's integer dot product
// ends as 8 int32 lanes, a horizontal-add tree turns 8 such vectors into one vector of the 8
// block sums, and one float multiply-add per group applies the 8 (weight scale x activation
// scale) products. One weight group is unpacked once and used for up to 4 activation rows.
#ifndef KX_VNNI
#error "include cpu_x86.h from cpu_avx2.c or cpu_vnni.c"
#endif

// ---- small helpers ---------------------------------------------------------------------

static inline float KX(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i KX(load2x128)(const void *lo, const void *hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                   _mm_loadu_si128((const __m128i *)hi), 1);
}

static inline __m256i KX(ld)(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

// 8 int32 lanes, lane i = sum of products of bytes 4i..4i+3 (u unsigned, s signed).
static inline __m256i KX(dot_u8s8)(__m256i u, __m256i s) {
#if KX_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// dot_u8s8(lo, xa) + dot_u8s8(hi, xb) for nibbles (<= 15): the int16 sums cannot overflow.
static inline __m256i KX(dot_pair)(__m256i lo, __m256i xa, __m256i hi, __m256i xb) {
#if KX_VNNI
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xa), hi, xb);
#else
    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa), _mm256_maddubs_epi16(hi, xb));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

// Eight vectors, each holding partial sums of one block, to one vector of the 8 block sums.
static inline __m256i KX(reduce8)(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i v4,
                                  __m256i v5, __m256i v6, __m256i v7) {
    __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v4, v5), _mm256_hadd_epi32(v6, v7));
    // [a_lo + a_hi | b_hi + b_lo]: a blend and one 128-bit insert instead of two vperm2i128
    // (8 micro-ops each on Zen 1); integer sums, so the order of the halves does not matter.
    const __m256i cross = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm256_extracti128_si256(a, 1)),
                                                  _mm256_castsi256_si128(b), 1);
    return _mm256_add_epi32(_mm256_blend_epi32(a, b, 0xF0), cross);
}

// 8 f16 values found in the low 16 bits of the 8 int32 lanes -> 8 floats.
static inline __m256 KX(f16lo_to_ps)(__m256i v) {
    const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i t = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(t));
}

// Both f16 halves of 8 int32 lanes -> (low halves, high halves) as floats.
static inline void KX(f16pair_to_ps)(__m256i v, __m256 *lo, __m256 *hi) {
    const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    __m256i t = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), 0xD8);
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(t));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(t, 1));
}

static inline uint32_t KX(ld32)(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t KX(ld16)(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

// One f16 -> float with the F16C instruction (the portable converter is much longer).
static inline float KX(h2f)(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

// ---- blocks of 32: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL (Q4PAIRS activations) ---------
//
// A group is 8 blocks, taken as 4 pairs (2p, 2p+1). A pair's weights are loaded as two
// vectors, lo = elements 0..15 of both blocks and hi = elements 16..31 (for the nibble formats
// these are the low and high nibbles of the two 16-byte payloads side by side), which is the
// order of the Q4PAIRS activations, so each pair's dot products land as [block 2p: 4 partial
// sums | block 2p+1: 4 partial sums] and one horizontal-add tree gives the 8 block sums of the
// group, in the order 0,2,4,6,1,3,5,7 that the activation scales are stored in. Each block
// contributes
//   dw dx isum + mw sx      (mw: the m of Q4_1 / Q5_1, -8 dw for Q4_0, -16 dw for Q5_0, -128 dw
//                            for Q8_0 with VNNI's unsigned weights, none for IQ4_NL; sx = dx *
//                            the sum of the activation values)
// to lane (block's position) of one float accumulator per activation row, which is summed at
// the end. The weights are unsigned (Q4: 0..15, Q5: 0..31, the top bit from qh) except Q8_0's
// and IQ4_NL's (its levels looked up with a byte shuffle), which are multiplied as |w| times
// x with w's sign (Q8_0 with VNNI: w + 128). The last group of a row may be partial: its
// missing pairs are zero, its missing blocks get zero scales (and their activations are zero
// padding), so every row, whatever the number of activation rows, is computed by exactly the
// same operations.
enum { KX_F_Q4_0, KX_F_Q4_1, KX_F_Q5_0, KX_F_Q5_1, KX_F_Q8_0, KX_F_IQ4_NL };

#define KX_AI static inline __attribute__((always_inline))

KX_AI int KX(fmt_bsize)(const int fmt) {
    switch (fmt) {
    case KX_F_Q4_0: return (int)sizeof(kaon_block_q4_0);
    case KX_F_Q4_1: return (int)sizeof(kaon_block_q4_1);
    case KX_F_Q5_0: return (int)sizeof(kaon_block_q5_0);
    case KX_F_Q5_1: return (int)sizeof(kaon_block_q5_1);
    case KX_F_Q8_0: return (int)sizeof(kaon_block_q8_0);
    default: return (int)sizeof(kaon_block_iq4_nl);
    }
}
// Byte offset of the quants (qs) and of Q5's high bits (qh) in a block.
KX_AI int KX(fmt_qoff)(const int fmt) {
    switch (fmt) {
    case KX_F_Q4_1: return (int)offsetof(kaon_block_q4_1, qs);
    case KX_F_Q5_0: return (int)offsetof(kaon_block_q5_0, qs);
    case KX_F_Q5_1: return (int)offsetof(kaon_block_q5_1, qs);
    default: return (int)offsetof(kaon_block_q4_0, qs);  // = Q8_0's, IQ4_NL's
    }
}
KX_AI int KX(fmt_qhoff)(const int fmt) {
    return fmt == KX_F_Q5_0 ? (int)offsetof(kaon_block_q5_0, qh) : (int)offsetof(kaon_block_q5_1, qh);
}
KX_AI int KX(fmt_q5)(const int fmt) { return fmt == KX_F_Q5_0 || fmt == KX_F_Q5_1; }
KX_AI int KX(fmt_signed)(const int fmt) { return fmt == KX_F_Q8_0 || fmt == KX_F_IQ4_NL; }
// Q8_0 with VNNI: weights stored + 128 (unsigned) for vpdpbusd.
KX_AI int KX(fmt_biased)(const int fmt) { return fmt == KX_F_Q8_0 && KX_VNNI; }
// Whether a format has the mw sx term.
KX_AI int KX(fmt_has_m)(const int fmt) { return !KX(fmt_signed)(fmt) || KX(fmt_biased)(fmt); }

// IQ4_NL's 16 levels for a byte shuffle (both 128-bit lanes).
KX_AI __m256i KX(iq4_table)(void) {
    return _mm256_setr_epi32((int)KAON_IQ4NL_W0, (int)KAON_IQ4NL_W1, (int)KAON_IQ4NL_W2, (int)KAON_IQ4NL_W3,
                             (int)KAON_IQ4NL_W0, (int)KAON_IQ4NL_W1, (int)KAON_IQ4NL_W2, (int)KAON_IQ4NL_W3);
}

// 0x10 in byte i where bit i of a (bytes 0..15) or bit i - 16 of b (bytes 16..31) is set: the
// top bit of Q5 quants.
KX_AI __m256i KX(hbits)(uint32_t a, uint32_t b) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)((a & 0xFFFF) | (b << 16))), pick);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// Pair p's weight vectors; b1 NULL for a lone last block (its half is zero, or IQ4_NL's level
// of 0, which meets zero activations).
KX_AI void KX(pair_load)(const int fmt, const uint8_t *b0, const uint8_t *b1, __m256i *lo, __m256i *hi) {
    const int qo = KX(fmt_qoff)(fmt);
    if (fmt == KX_F_Q8_0) {
        __m256i l = b1 ? KX(load2x128)(b0 + qo, b1 + qo)
                       : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qo)));
        __m256i h = b1 ? KX(load2x128)(b0 + qo + 16, b1 + qo + 16)
                       : _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + qo + 16)));
        if (!b1) {
            l = _mm256_inserti128_si256(l, _mm_setzero_si128(), 1);
            h = _mm256_inserti128_si256(h, _mm_setzero_si128(), 1);
        }
        if (KX(fmt_biased)(fmt)) {
            const __m256i x80 = _mm256_set1_epi8((char)0x80);  // w + 128: unsigned for vpdpbusd
            l = _mm256_xor_si256(l, x80);
            h = _mm256_xor_si256(h, x80);
        }
        *lo = l;
        *hi = h;
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i q = b1 ? KX(load2x128)(b0 + qo, b1 + qo)
                   : _mm256_inserti128_si256(_mm256_setzero_si256(),
                                             _mm_loadu_si128((const __m128i *)(b0 + qo)), 0);
    *lo = _mm256_and_si256(q, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if (KX(fmt_q5)(fmt)) {
        const int ho = KX(fmt_qhoff)(fmt);
        const uint32_t h0 = KX(ld32)(b0 + ho), h1 = b1 ? KX(ld32)(b1 + ho) : 0;
        *lo = _mm256_or_si256(*lo, KX(hbits)(h0, h1));
        *hi = _mm256_or_si256(*hi, KX(hbits)(h0 >> 16, h1 >> 16));
    } else if (fmt == KX_F_IQ4_NL) {
        *lo = _mm256_shuffle_epi8(KX(iq4_table)(), *lo);
        *hi = _mm256_shuffle_epi8(KX(iq4_table)(), *hi);
    }
}

// Signed weights w times x: |w| (unsigned) times x with w's sign; each product pair fits int16.
KX_AI __m256i KX(dot_signed)(__m256i w, __m256i x) {
    return KX(dot_u8s8)(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

// One pair's 8 int32 lanes: weights (lo, hi) against activations xa = x[0..32), xb = x[32..64).
KX_AI __m256i KX(pair_dot)(const int fmt, __m256i lo, __m256i hi, const int8_t *x) {
    const __m256i xa = KX(ld)(x), xb = KX(ld)(x + 32);
    if (!KX(fmt_signed)(fmt)) return KX(dot_pair)(lo, xa, hi, xb);
#if KX_VNNI
    if (KX(fmt_biased)(fmt))
        return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xa), hi, xb);
#endif
    return _mm256_add_epi32(KX(dot_signed)(lo, xa), KX(dot_signed)(hi, xb));
}

// One group of np pairs (np < 4: the missing ones are zero) for one activation row.
KX_AI __m256 KX(pair_group)(__m256 acc, const int fmt, const int np, const __m256i *lo, const __m256i *hi,
                            const int8_t *x, __m256 dw, __m256 mw, const float *dx, const float *sx) {
    const __m256i z = _mm256_setzero_si256();
    __m256i v0 = KX(pair_dot)(fmt, lo[0], hi[0], x);
    __m256i v1 = np > 1 ? KX(pair_dot)(fmt, lo[1], hi[1], x + 64) : z;
    __m256i v2 = np > 2 ? KX(pair_dot)(fmt, lo[2], hi[2], x + 128) : z;
    __m256i v3 = np > 3 ? KX(pair_dot)(fmt, lo[3], hi[3], x + 192) : z;
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(dw, _mm256_loadu_ps(dx)), acc);
    if (KX(fmt_has_m)(fmt)) acc = _mm256_fmadd_ps(mw, _mm256_loadu_ps(sx), acc);
    return acc;
}

// dw and mw of 8 blocks from the 32 bits at each block's start (d, then m or payload bytes).
KX_AI void KX(scales_of)(const int fmt, __m256i raw, __m256 *dw, __m256 *mw) {
    if (fmt == KX_F_Q4_1 || fmt == KX_F_Q5_1) {
        KX(f16pair_to_ps)(raw, dw, mw);
        return;
    }
    *dw = KX(f16lo_to_ps)(raw);
    const float f = fmt == KX_F_Q4_0 ? -8.0f : fmt == KX_F_Q5_0 ? -16.0f : -128.0f;
    *mw = KX(fmt_has_m)(fmt) ? _mm256_mul_ps(*dw, _mm256_set1_ps(f)) : _mm256_setzero_ps();
}

// The weight scales of a group's blocks 0,2,4,6,1,3,5,7 (zero for blocks >= nblk): dw, mw.
KX_AI void KX(pair_scales)(const int fmt, const uint8_t *b, const int nblk, __m256 *dw, __m256 *mw) {
    const int bs = KX(fmt_bsize)(fmt);
#define KX_LD(i) (int)((i) < nblk ? KX(ld32)(b + (i) * bs) : 0u)
    const __m256i raw = _mm256_setr_epi32(KX_LD(0), KX_LD(2), KX_LD(4), KX_LD(6), KX_LD(1),
                                          KX_LD(3), KX_LD(5), KX_LD(7));
#undef KX_LD
    KX(scales_of)(fmt, raw, dw, mw);
}

// The last, partial group of a row: nblk (1..7) blocks in np = (nblk + 1) / 2 pairs.
static inline __attribute__((always_inline)) void KX(pair_tail)(
    const int fmt, const int np, const uint8_t *b, const int nblk, const int8_t *x0, size_t xs,
    const float *d0, const float *s0, size_t ds, const int nr, __m256 *acc) {
    const int bs = KX(fmt_bsize)(fmt);
    __m256i lo[4], hi[4];
    for (int p = 0; p < np; p++)
        KX(pair_load)(fmt, b + 2 * p * bs, 2 * p + 1 < nblk ? b + (2 * p + 1) * bs : NULL, &lo[p], &hi[p]);
    __m256 dw, mw;
    KX(pair_scales)(fmt, b, nblk, &dw, &mw);
    for (int r = 0; r < nr; r++)
        acc[r] = KX(pair_group)(acc[r], fmt, np, lo, hi, x0 + r * xs, dw, mw, d0 + r * ds, s0 + r * ds);
}

static inline __attribute__((always_inline)) void KX(pair_rows)(const uint8_t *w, const int fmt,
                                                                 const kaon_q8_act *a, int r0,
                                                                 const int nr, float *out) {
    const int nb = a->nb, nbp = a->nbp, bs = KX(fmt_bsize)(fmt);
    const size_t xs = (size_t)nbp * 32, ds = (size_t)nbp;
    const int8_t *x0 = a->qs + (size_t)r0 * xs;
    const float *d0 = a->d + (size_t)r0 * ds, *s0 = a->s + (size_t)r0 * ds;
    __m256 acc[KX_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    int g = 0;
    for (; g + 8 <= nb; g += 8) {
        const uint8_t *b = w + (size_t)g * bs;
        __m256i lo[4], hi[4];
        for (int p = 0; p < 4; p++) KX(pair_load)(fmt, b + 2 * p * bs, b + (2 * p + 1) * bs, &lo[p], &hi[p]);
        __m256 dw, mw;
        KX(pair_scales)(fmt, b, 8, &dw, &mw);
        for (int r = 0; r < nr; r++)
            acc[r] = KX(pair_group)(acc[r], fmt, 4, lo, hi, x0 + r * xs + (size_t)g * 32, dw, mw,
                                    d0 + r * ds + g, s0 + r * ds + g);
    }
    if (g < nb) {
        const uint8_t *b = w + (size_t)g * bs;
        const int nblk = nb - g;
        const int8_t *xg = x0 + (size_t)g * 32;
        switch ((nblk + 1) / 2) {
        case 1: KX(pair_tail)(fmt, 1, b, nblk, xg, xs, d0 + g, s0 + g, ds, nr, acc); break;
        case 2: KX(pair_tail)(fmt, 2, b, nblk, xg, xs, d0 + g, s0 + g, ds, nr, acc); break;
        default: KX(pair_tail)(fmt, 3, b, nblk, xg, xs, d0 + g, s0 + g, ds, nr, acc); break;
        }
    }
    for (int r = 0; r < nr; r++) out[r] = KX(hsum)(acc[r]);
}

// ---- Batched path: 8 weight rows packed for a register-blocked micro-kernel ------------
//
// With many activation rows (a batched decode step, a prefill chunk), each tile of 8 weight
// rows of a format in blocks of 32 is first repacked into a buffer that stays in L1: per
// block, vectors [row 0: 4 bytes | row 1: 4 bytes | ... | row 7] of the block's element quads
// (Q4_0, Q4_1, IQ4_NL: two quads per vector, as nibbles, IQ4_NL's looked up when used; Q5_0,
// Q5_1: one, as bytes 0..31; Q8_0: one, + 128 with VNNI so they are unsigned), then the 8
// weight scales dw and offsets mw as floats. A dot product instruction then yields one
// int32 per weight row against a broadcast quad of one activation row, so no horizontal sums
// are needed, and each packed vector is used by up to KX_TILE_NR activation rows while it is
// in a register.
//
// The activations come regrouped (cpu_linear.c): per row and group of 8 blocks, the 256
// quantized bytes in the Q4PAIRS order, then the 8 d and the 8 s in their Q4PAIRS order
// (KAON_GRP_BYTES per group), so one pointer per row reaches all three.
//
// The numbers are exactly pair_rows' (the path for few rows): pair_rows adds block position j
// of every group (b = 8 g + j) into float lane j, in order of g, and then sums the lanes as
// ((l0 + l1) + (l4 + l5)) + ((l2 + l3) + (l6 + l7)) (KX(hsum) over the lane order
// 0,2,4,6,1,3,5,7). The tile kernel keeps the same 8 partial sums (one vector over the 8
// weight rows each), adds each block into its own with the same two multiply-adds, and sums
// them with the same tree. So a row's result does not depend on the batch it is in.
#define KX_PACK_ROWS 8
#define KX_PK_MAX 320  // bytes per packed block at most (KX(pk_block))
// Activation rows per tile_dot call: their int32 and float accumulators (2 KX_TILE_NR
// vectors) stay in registers, of which AVX-512VL has 32 and AVX2 16.
#if KX_VNNI
#define KX_TILE_NR 8
#else
#define KX_TILE_NR 4
#endif

static size_t KX(pack_bytes)(int nbp) { return (size_t)nbp * KX_PK_MAX; }

// 8 rows of 8 int32 lanes -> lane q of every row, for q = 0..7.
static inline __attribute__((always_inline)) void KX(transpose8)(__m256i *v) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // The 128-bit halves: inserts and extracts rather than vperm2i128 (8 micro-ops on Zen 1).
    for (int q = 0; q < 4; q++) {
        v[q] = _mm256_inserti128_si256(u[q], _mm256_castsi256_si128(u[4 + q]), 1);
        v[q + 4] = _mm256_inserti128_si256(u[4 + q], _mm256_extracti128_si256(u[q], 1), 0);
    }
}

// Whether a format's blocks are packed as bytes (one quad per vector) rather than nibbles.
KX_AI int KX(pk_bytes_fmt)(const int fmt) { return fmt == KX_F_Q8_0 || KX(fmt_q5)(fmt); }
// Bytes of one packed block: the weights (nibbles: 4 vectors, bytes: 8 vectors), then dw[8]
// and mw[8].
KX_AI int KX(pk_wbytes)(const int fmt) { return KX(pk_bytes_fmt)(fmt) ? 256 : 128; }
KX_AI int KX(pk_block)(const int fmt) { return KX(pk_wbytes)(fmt) + 64; }

// A block's 32 weights as bytes in element order: Q8_0's (+ 128 with VNNI), Q5's 0..31.
KX_AI __m256i KX(block_bytes)(const int fmt, const uint8_t *blk) {
    if (fmt == KX_F_Q8_0) {
        const __m256i v = KX(ld)(blk + KX(fmt_qoff)(fmt));
        return KX(fmt_biased)(fmt) ? _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)) : v;
    }
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + KX(fmt_qoff)(fmt))), m4 = _mm_set1_epi8(0x0F);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(q, m4)),
                                              _mm_and_si128(_mm_srli_epi16(q, 4), m4), 1);
    const uint32_t h = KX(ld32)(blk + KX(fmt_qhoff)(fmt));
    return _mm256_or_si256(v, KX(hbits)(h, h >> 16));
}

// Packs rows (<= 8) weight rows of rb bytes into dst; rows beyond `rows` are zero. Blocks go
// in the order (j, g) for b = 8 g + j (blocks past nb are left out). Nibbles: the 16 payload
// bytes of a block hold element e in the low nibble of byte e and element e + 16 in the high
// one, so the payload's 32-bit word k holds quads k (low nibbles) and k + 4 (high nibbles);
// packed vector k is word k of the 8 rows. Bytes: vector q is quad q of the 8 rows.
KX_AI void KX(pack_fmt)(const int fmt, const uint8_t *w, size_t rb, int rows, int nb, int nbp, uint8_t *dst) {
    const int bs = KX(fmt_bsize)(fmt), ng = nbp / 8, pb = KX(pk_block)(fmt), wb = KX(pk_wbytes)(fmt);
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)((b & 7) * ng + (b >> 3)) * pb;
        const uint8_t *blk = w + (size_t)b * bs;
        // The 32 bits at each row's block start: d, then m (Q4_1, Q5_1) or payload bytes (built
        // in registers: a vector load of 8 separate 32-bit stores would stall on forwarding).
#define KX_SC(i) (int)((i) < rows ? KX(ld32)(blk + (size_t)(i) * rb) : 0u)
        const __m256i raw = _mm256_setr_epi32(KX_SC(0), KX_SC(1), KX_SC(2), KX_SC(3), KX_SC(4),
                                              KX_SC(5), KX_SC(6), KX_SC(7));
#undef KX_SC
        if (KX(pk_bytes_fmt)(fmt)) {
            __m256i v[8];
            for (int i = 0; i < 8; i++)
                v[i] = i < rows ? KX(block_bytes)(fmt, blk + (size_t)i * rb) : _mm256_setzero_si256();
            KX(transpose8)(v);
            for (int q = 0; q < 8; q++) _mm256_storeu_si256((__m256i *)(o + 32 * q), v[q]);
        } else {
            const int qo = KX(fmt_qoff)(fmt);
            __m128i q[8];
            for (int i = 0; i < 8; i++)
                q[i] = i < rows ? _mm_loadu_si128((const __m128i *)(blk + (size_t)i * rb + qo))
                                : _mm_setzero_si128();
            __m256i v[4];
            for (int i = 0; i < 4; i++)  // [row i | row i + 4]
                v[i] = _mm256_inserti128_si256(_mm256_castsi128_si256(q[i]), q[i + 4], 1);
            const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
            const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
            _mm256_storeu_si256((__m256i *)(o + 0), _mm256_unpacklo_epi64(t0, t2));
            _mm256_storeu_si256((__m256i *)(o + 32), _mm256_unpackhi_epi64(t0, t2));
            _mm256_storeu_si256((__m256i *)(o + 64), _mm256_unpacklo_epi64(t1, t3));
            _mm256_storeu_si256((__m256i *)(o + 96), _mm256_unpackhi_epi64(t1, t3));
        }
        __m256 dw, mw;
        KX(scales_of)(fmt, raw, &dw, &mw);
        _mm256_storeu_ps((float *)(o + wb), dw);
        _mm256_storeu_ps((float *)(o + wb + 32), mw);
    }
}

static int KX(pack)(int kind, const void *w, size_t rb, int rows, int nb, int nbp, void *dst) {
    // A whole tile (the usual case) with the row count known at compile time.
#define KX_PACK(F) (rows == 8 ? KX(pack_fmt)(F, w, rb, 8, nb, nbp, dst) : KX(pack_fmt)(F, w, rb, rows, nb, nbp, dst))
    switch (kind) {
    case KAON_KI_Q4_0: KX_PACK(KX_F_Q4_0); return 0;
    case KAON_KI_Q4_1: KX_PACK(KX_F_Q4_1); return 0;
    case KAON_KI_Q5_0: KX_PACK(KX_F_Q5_0); return 0;
    case KAON_KI_Q5_1: KX_PACK(KX_F_Q5_1); return 0;
    case KAON_KI_Q8_0: KX_PACK(KX_F_Q8_0); return 0;
    case KAON_KI_IQ4_NL: KX_PACK(KX_F_IQ4_NL); return 0;
    default: return 1;
    }
#undef KX_PACK
}

static inline __attribute__((always_inline)) __m256i KX(bcast32)(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) __m256 KX(bcastf)(const uint8_t *p) {
    float v;
    memcpy(&v, p, 4);
    return _mm256_set1_ps(v);
}

// Block position j of every group for NR activation rows (row r's regrouped data at xr[r]):
// the partial sums part[r] (lane i = weight row i).
static inline __attribute__((always_inline)) void KX(tile_j)(const int fmt, const int j,
                                                              const uint8_t *pk, const int ng,
                                                              const int nb,
                                                              const uint8_t *const *xr,
                                                              const int NR, __m256 *part) {
    // Q4PAIRS: quad q of block b = 8 g + j sits at byte c(j, q) of group g; its d at byte
    // 256 + 4 pos(j), its s 32 bytes further.
    const int dpos = 256 + 4 * ((j & 1) ? 4 + (j >> 1) : (j >> 1));
    __m256 A[KX_TILE_NR];
    for (int r = 0; r < NR; r++) A[r] = _mm256_setzero_ps();
    const int pb = KX(pk_block)(fmt), wb = KX(pk_wbytes)(fmt);
    const uint8_t *p = pk + (size_t)j * ng * pb;
    // Padding blocks (b >= nb) are skipped: in pair_rows they add dw dx 0 + 0 sx = +0 (both
    // scales are zero there), which leaves any sum but -0 unchanged, and these sums start
    // at +0 and, rounding to nearest, never become -0.
    const int ngj = (nb - j + 7) / 8;  // groups whose block j is real
    for (int g = 0; g < ngj; g++, p += pb) {
        const size_t go = (size_t)g * KAON_GRP_BYTES;
        __m256i I[KX_TILE_NR];
        for (int r = 0; r < NR; r++) I[r] = _mm256_setzero_si256();
        for (int k = 0; k < (KX(pk_bytes_fmt)(fmt) ? 8 : 4); k++) {
            __m256i wv[2];
            int nq = 1;
            if (KX(pk_bytes_fmt)(fmt)) {
                wv[0] = KX(ld)(p + 32 * k);
            } else {  // quads k and k + 4 from the low and high nibbles
                const __m256i v = KX(ld)(p + 32 * k), m4 = _mm256_set1_epi8(0x0F);
                wv[0] = _mm256_and_si256(v, m4);
                wv[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (fmt == KX_F_IQ4_NL) {
                    wv[0] = _mm256_shuffle_epi8(KX(iq4_table)(), wv[0]);
                    wv[1] = _mm256_shuffle_epi8(KX(iq4_table)(), wv[1]);
                }
                nq = 2;
            }
            for (int h = 0; h < nq; h++) {
                const int q = k + 4 * h;
                const int c = (j & ~1) * 32 + (q >= 4 ? 32 : 0) + (j & 1) * 16 + ((4 * q) & 15);
                for (int r = 0; r < NR; r++) {
#if KX_VNNI
                    if (!KX(fmt_signed)(fmt) || KX(fmt_biased)(fmt)) {
                        // Unsigned weights: the quad broadcast straight from memory ({1to8}).
                        __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(I[r]) : "v"(wv[h]), "m"(*(const int32_t *)(xr[r] + go + c)));
                        continue;
                    }
#endif
                    const __m256i xv = KX(bcast32)(xr[r] + go + c);
                    if (KX(fmt_signed)(fmt))
                        I[r] = _mm256_add_epi32(I[r], KX(dot_signed)(wv[h], xv));
                    else
                        I[r] = _mm256_add_epi32(I[r], KX(dot_u8s8)(wv[h], xv));
                }
            }
        }
        const __m256 dw = _mm256_loadu_ps((const float *)(p + wb));
        const __m256 mw = _mm256_loadu_ps((const float *)(p + wb + 32));
        for (int r = 0; r < NR; r++) {
            A[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r]),
                                   _mm256_mul_ps(dw, KX(bcastf)(xr[r] + go + dpos)), A[r]);
            if (KX(fmt_has_m)(fmt)) A[r] = _mm256_fmadd_ps(mw, KX(bcastf)(xr[r] + go + dpos + 32), A[r]);
        }
    }
    for (int r = 0; r < NR; r++) part[r] = A[r];
}

// out[r * ldo + i] = weight row i of the packed tile . activation row r (at xg + r * xstride)
// for r < NR, i < 8.
static inline __attribute__((always_inline)) void KX(tile_fmt)(const int fmt, const uint8_t *pk,
                                                                const uint8_t *xg, size_t xstride,
                                                                int nb, int ng, const int NR,
                                                                float *out, size_t ldo) {
    const uint8_t *xr[KX_TILE_NR];
    for (int r = 0; r < NR; r++) xr[r] = xg + r * xstride;
    __m256 part[8][KX_TILE_NR];
    KX(tile_j)(fmt, 0, pk, ng, nb, xr, NR, part[0]);
    KX(tile_j)(fmt, 1, pk, ng, nb, xr, NR, part[1]);
    KX(tile_j)(fmt, 2, pk, ng, nb, xr, NR, part[2]);
    KX(tile_j)(fmt, 3, pk, ng, nb, xr, NR, part[3]);
    KX(tile_j)(fmt, 4, pk, ng, nb, xr, NR, part[4]);
    KX(tile_j)(fmt, 5, pk, ng, nb, xr, NR, part[5]);
    KX(tile_j)(fmt, 6, pk, ng, nb, xr, NR, part[6]);
    KX(tile_j)(fmt, 7, pk, ng, nb, xr, NR, part[7]);
    for (int r = 0; r < NR; r++) {
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(part[0][r], part[1][r]),
                                        _mm256_add_ps(part[4][r], part[5][r]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(part[2][r], part[3][r]),
                                        _mm256_add_ps(part[6][r], part[7][r]));
        _mm256_storeu_ps(out + r * ldo, _mm256_add_ps(lo, hi));
    }
}

#if KX_TILE_NR == 8
#define KX_TILE_CASES_8(FMT)                                                       \
    case 4: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 4, out, ldo); break;        \
    case 5: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 5, out, ldo); break;        \
    case 6: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 6, out, ldo); break;        \
    case 7: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 7, out, ldo); break;
#else
#define KX_TILE_CASES_8(FMT)
#endif
#define KX_TILE_DISPATCH(FMT)                                                      \
    switch (nr) {                                                                  \
    case 1: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 1, out, ldo); break;        \
    case 2: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 2, out, ldo); break;        \
    case 3: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, 3, out, ldo); break;        \
    KX_TILE_CASES_8(FMT)                                                           \
    default: KX(tile_fmt)(FMT, pk, xg, xstride, nb, ng, KX_TILE_NR, out, ldo); break; \
    }

static void KX(tile_dot)(int kind, const void *pk_, const void *xg_, size_t xstride, int nb,
                         int nbp, int nr, float *out, size_t ldo) {
    const uint8_t *pk = pk_, *xg = xg_;
    const int ng = nbp / 8;
    switch (kind) {
    case KAON_KI_Q4_0: KX_TILE_DISPATCH(KX_F_Q4_0); break;
    case KAON_KI_Q4_1: KX_TILE_DISPATCH(KX_F_Q4_1); break;
    case KAON_KI_Q5_0: KX_TILE_DISPATCH(KX_F_Q5_0); break;
    case KAON_KI_Q5_1: KX_TILE_DISPATCH(KX_F_Q5_1); break;
    case KAON_KI_IQ4_NL: KX_TILE_DISPATCH(KX_F_IQ4_NL); break;
    default: KX_TILE_DISPATCH(KX_F_Q8_0); break;
    }
}
#undef KX_TILE_DISPATCH
#undef KX_TILE_CASES_8

// ---- super-blocks of 256 (natural layout; one super-block = one group of 8 blocks) -------

// Q4_K / Q5_K: per sub-block of 32 (one activation block), d sc dx isum - dmin m sx. Q5_K's
// top bits: bit j of qh[l] for element 32 j + l.
// One super-block's values q[j] (sub-block j's 32 values 0..15 or 0..31, in element order) and
// sc (lane j: d sc_j), mn (lane j: dmin m_j). Shared by the row kernel and the batched pack, so
// both see the same floats.
KX_AI void KX(q45k_decode)(const int five, const uint8_t *b, __m256i *q, __m256 *scp, __m256 *mnp) {
    const size_t qso = five ? offsetof(kaon_block_q5_k, qs) : offsetof(kaon_block_q4_k, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    uint32_t u[3], scm[4];  // d, dmin, scales[12] lead both formats
    memcpy(u, b + offsetof(kaon_block_q4_k, scales), 12);
    scm[0] = u[0] & 0x3f3f3f3fu;                                        // scales 0..3
    scm[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);  // scales 4..7
    scm[2] = u[1] & 0x3f3f3f3fu;                                        // mins 0..3
    scm[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);  // mins 4..7
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)scm)));
    __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(scm + 2))));
    *scp = _mm256_mul_ps(sc, _mm256_set1_ps(KX(h2f)(KX(ld16)(b))));
    *mnp = _mm256_mul_ps(mn, _mm256_set1_ps(KX(h2f)(KX(ld16)(b + 2))));
    for (int k = 0; k < 4; k++) {
        __m256i v = KX(ld)(b + qso + 32 * k);
        q[2 * k] = _mm256_and_si256(v, m4);
        q[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    if (five) {
        const __m256i qh = KX(ld)(b + offsetof(kaon_block_q5_k, qh));
        for (int j = 0; j < 8; j++)  // (qh >> j) & 1 per byte, to bit 4
            q[j] = _mm256_or_si256(q[j], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), one), 4));
    }
}

KX_AI void KX(q45k_rows)(const int five, const uint8_t *w, const kaon_q8_act *a, int r0, const int nr,
                         float *out) {
    const int nsb = a->nb / 8, nbp = a->nbp;
    const size_t bs = five ? sizeof(kaon_block_q5_k) : sizeof(kaon_block_q4_k);
    const size_t xs = (size_t)nbp * 32;
    const int8_t *x0 = a->qs + (size_t)r0 * xs;
    const float *d0 = a->d + (size_t)r0 * nbp, *s0 = a->s + (size_t)r0 * nbp;
    __m256 acc[KX_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        __m256i q[8];
        __m256 sc, mn;
        KX(q45k_decode)(five, w + (size_t)i * bs, q, &sc, &mn);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = x0 + r * xs + (size_t)i * 256;
            __m256i v[8];
            for (int j = 0; j < 8; j++) v[j] = KX(dot_u8s8)(q[j], KX(ld)(x + 32 * j));
            __m256i h = KX(reduce8)(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            const float *dx = d0 + (size_t)r * nbp + 8 * i, *sx = s0 + (size_t)r * nbp + 8 * i;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(sc, _mm256_loadu_ps(dx)),
                                     acc[r]);
            acc[r] = _mm256_fnmadd_ps(mn, _mm256_loadu_ps(sx), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = KX(hsum)(acc[r]);
}

// Q2_K / Q3_K / Q6_K: sub-blocks of 16, so each activation block's two halves have their own
// integer scales. The unsigned quants c (Q2_K 0..3, Q3_K 0..7 = level + 4, Q6_K 0..63 = level
// + 32) times x as int16 pairs, times [s_2j x 8 | s_2j+1 x 8] as int32 lanes: the block's
// scaled sum. The level offsets come back from the activations' per-16 sums s16 (an int16
// multiply-add of those 16 sums with the 16 scales gives each block's sum of scale x half-sum):
// subtracted as integers (Q3_K 4x, Q6_K 32x), or, for Q2_K's mins, as dmin dx (sum m x half-sum).
enum { KX_K_Q2, KX_K_Q3, KX_K_Q6 };

// One super-block's values c[j] (chunk j's 32 values, unsigned: Q2_K 0..3, Q3_K 0..7, Q6_K
// 0..63, in element order), its 16 scales s8 and (Q2_K) 16 mins m8 of the halves, d and dmin.
KX_AI void KX(k16_decode)(const int fmt, const uint8_t *b, __m256i *c, int8_t *s8, int8_t *m8, float *dwp,
                          float *dminp) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), m3 = _mm256_set1_epi8(3);
    float dw, dmin = 0.0f;
    memset(m8, 0, 16);
    if (fmt == KX_K_Q6) {
        const kaon_block_q6_k *k = (const kaon_block_q6_k *)b;
        for (int hf = 0; hf < 2; hf++) {  // raw values 0..63 of the 8 chunks of 32
            __m256i l0 = KX(ld)(k->ql + 64 * hf), l1 = KX(ld)(k->ql + 64 * hf + 32);
            __m256i hb = KX(ld)(k->qh + 32 * hf);
            c[4 * hf + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                            _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
            c[4 * hf + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                            _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
            c[4 * hf + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                            _mm256_and_si256(hb, m30));
            c[4 * hf + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        }
        memcpy(s8, k->scales, 16);
        dw = KX(h2f)(k->d);
    } else {
        // Chunk j = 4 hf + s: bits 2s, 2s + 1 of qs[32 hf + l]; Q3_K adds bit j of hmask[l] as 4.
        const uint8_t *qs = fmt == KX_K_Q2 ? ((const kaon_block_q2_k *)b)->qs : ((const kaon_block_q3_k *)b)->qs;
        const __m256i hm = fmt == KX_K_Q3 ? KX(ld)(((const kaon_block_q3_k *)b)->hmask) : _mm256_setzero_si256();
        for (int hf = 0; hf < 2; hf++) {
            const __m256i qv = KX(ld)(qs + 32 * hf);
            for (int sh = 0; sh < 4; sh++) {
                const int j = 4 * hf + sh;
                c[j] = _mm256_and_si256(_mm256_srli_epi16(qv, 2 * sh), m3);
                if (fmt == KX_K_Q3)
                    c[j] = _mm256_or_si256(c[j], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, j),
                                                                                    _mm256_set1_epi8(1)), 2));
            }
        }
        if (fmt == KX_K_Q2) {
            const kaon_block_q2_k *k = (const kaon_block_q2_k *)b;
            for (int t = 0; t < 16; t++) {
                s8[t] = (int8_t)(k->scales[t] & 0xF);
                m8[t] = (int8_t)(k->scales[t] >> 4);
            }
            dw = KX(h2f)(k->d);
            dmin = KX(h2f)(k->dmin);
        } else {
            const kaon_block_q3_k *k = (const kaon_block_q3_k *)b;
            const uint32_t w0 = KX(ld32)(k->scales), w1 = KX(ld32)(k->scales + 4), w2 = KX(ld32)(k->scales + 8);
            // kaon_q3k_scale for all 16 at once: 4 low bits from the nibbles of w0 / w1, 2 high
            // bits from w2, minus 32.
            const uint32_t n4 = 0x0f0f0f0fu, n2 = 0x03030303u;
            const __m128i v = _mm_setr_epi32((int)((w0 & n4) | ((w2 & n2) << 4)),
                                             (int)((w1 & n4) | (((w2 >> 2) & n2) << 4)),
                                             (int)(((w0 >> 4) & n4) | (((w2 >> 4) & n2) << 4)),
                                             (int)(((w1 >> 4) & n4) | (((w2 >> 6) & n2) << 4)));
            _mm_storeu_si128((__m128i *)s8, _mm_sub_epi8(v, _mm_set1_epi8(32)));
            dw = KX(h2f)(k->d);
        }
    }
    *dwp = dw;
    *dminp = dmin;
}

KX_AI void KX(k16_rows)(const int fmt, const uint8_t *w, const kaon_q8_act *a, int r0, const int nr,
                        float *out) {
    const int nsb = a->nb / 8, nbp = a->nbp;
    const size_t bs = fmt == KX_K_Q2 ? sizeof(kaon_block_q2_k)
                      : fmt == KX_K_Q3 ? sizeof(kaon_block_q3_k) : sizeof(kaon_block_q6_k);
    const size_t xs = (size_t)nbp * 32;
    const int8_t *x0 = a->qs + (size_t)r0 * xs;
    const float *d0 = a->d + (size_t)r0 * nbp;
    const int16_t *h0 = a->s16 + (size_t)r0 * nbp * 2;
    __m256 acc[KX_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const uint8_t *b = w + (size_t)i * bs;
        __m256i c[8];
        int8_t s8[16], m8[16];
        float dw, dmin;
        KX(k16_decode)(fmt, b, c, s8, m8, &dw, &dmin);
        // Chunk j's halves use scales 2j and 2j+1: [s_2j x 8 | s_2j+1 x 8] as int16.
        // (one byte shuffle each from the 8 scales of chunks 0..3 or 4..7 in both lanes)
        const __m128i slo = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)s8));
        const __m128i shi = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(s8 + 8)));
        const __m256i s_lo = _mm256_inserti128_si256(_mm256_castsi128_si256(slo), slo, 1);
        const __m256i s_hi = _mm256_inserti128_si256(_mm256_castsi128_si256(shi), shi, 1);
        __m256i scv[8];
        for (int j = 0; j < 8; j++) {
            const char a = (char)(4 * (j & 3)), b = (char)(4 * (j & 3) + 2);
            const __m256i ctl = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1,
                                                 a, a + 1, a, a + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1,
                                                 b, b + 1, b, b + 1, b, b + 1, b, b + 1);
            scv[j] = _mm256_shuffle_epi8(j < 4 ? s_lo : s_hi, ctl);
        }
        const __m256i sc16 = _mm256_inserti128_si256(_mm256_castsi128_si256(slo), shi, 1);
        const __m256i mn16 = fmt == KX_K_Q2 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)m8))
                                            : _mm256_setzero_si256();
        const __m256 vdw = _mm256_set1_ps(dw), vdmin = _mm256_set1_ps(dmin);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = x0 + r * xs + (size_t)i * 256;
            __m256i v[8];
            for (int j = 0; j < 8; j++)
                v[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(c[j], KX(ld)(x + 32 * j)), scv[j]);
            __m256i h = KX(reduce8)(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            const __m256i hs = KX(ld)(h0 + (size_t)r * nbp * 2 + 16 * i);  // the 16 half-sums
            if (fmt != KX_K_Q2)  // the level offset: 4 or 32 x (s_2j sum of half 0 + s_2j+1 sum of half 1)
                h = _mm256_sub_epi32(h, _mm256_slli_epi32(_mm256_madd_epi16(hs, sc16), fmt == KX_K_Q6 ? 5 : 2));
            const __m256 dx = _mm256_loadu_ps(d0 + (size_t)r * nbp + 8 * i);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(vdw, dx), acc[r]);
            if (fmt == KX_K_Q2)
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(hs, mn16)), _mm256_mul_ps(vdmin, dx),
                                          acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = KX(hsum)(acc[r]);
}

// ---- Batched path for the K-quants: 8 weight rows decoded once, then every activation row --
//
// As the blocks-of-32 batched path above, with the super-block formats' own pack: for each
// 8-row tile, every super-block i of every row is decoded once (q45k_decode / k16_decode, the
// row kernels' own helpers) and stored per sub-block position j and super-block i as 8 vectors
// [row 0: 4 values | ... | row 7] of the sub-block's element quads (unsigned bytes), followed by
// the per-row scales the sub-block needs (KX_KP_* offsets). The tile kernel then multiplies a
// packed vector by a broadcast quad of one activation row, so lane i of every sum belongs to
// weight row i and no horizontal sums are needed; the decode costs once per 8 rows and step
// instead of once per 8 rows and 4 activation rows.
//
// Same numbers as q45k_rows / k16_rows, bit for bit: the integer part of each sub-block is an
// exact sum (the int16 partial sums are bounded below 2^15: |x| <= 127, so a maddubs lane is at
// most 2 x 63 x 127; Q4_K / Q2_K / Q3_K sum up to 8 of them before widening, Q5_K 4, Q6_K 2),
// the float part is the same two multiply-adds per sub-block in the same order of super-blocks,
// kept in one accumulator per sub-block position j (the row kernels' lane j), and the eight
// are summed in KX(hsum)'s order ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
// Activation rows per ktile_dot call (both builds: the register budget of AVX2).
#define KX_KT_NR 4
enum { KX_KQ_Q2, KX_KQ_Q3, KX_KQ_Q4, KX_KQ_Q5, KX_KQ_Q6 };
// Offsets inside one packed (j, i) entry: the 256 bytes of values, then
//  Q4_K/Q5_K: float d sc_j [8 rows], float dmin m_j [8 rows]
//  Q2_K/Q3_K/Q6_K: int16 pairs (s_2j, s_2j+1) [8 rows], int16 (s_2j, s_2j) [8], (s_2j+1, s_2j+1)
//  [8], float d [8], Q2_K: int16 pairs (m_2j, m_2j+1) [8], float dmin [8].
#define KX_KP_SC 256
#define KX_KP_MN 288
#define KX_KP_SPAIR 256
#define KX_KP_H0 288
#define KX_KP_H1 320
#define KX_KP_DW 352
#define KX_KP_MPAIR 384
#define KX_KP_DMIN 416
#define KX_KP_BYTES 448

static size_t KX(kpack_bytes)(int nsb) { return (size_t)nsb * 8 * KX_KP_BYTES; }

KX_AI size_t KX(kq_bsize)(const int fmt) {
    switch (fmt) {
    case KX_KQ_Q2: return sizeof(kaon_block_q2_k);
    case KX_KQ_Q3: return sizeof(kaon_block_q3_k);
    case KX_KQ_Q4: return sizeof(kaon_block_q4_k);
    case KX_KQ_Q5: return sizeof(kaon_block_q5_k);
    default: return sizeof(kaon_block_q6_k);
    }
}

KX_AI void KX(kpack_fmt)(const int fmt, const uint8_t *w, size_t rb, int rows, int nsb, uint8_t *dst) {
    const size_t bs = KX(kq_bsize)(fmt);
    const int q45 = fmt == KX_KQ_Q4 || fmt == KX_KQ_Q5;
    for (int i = 0; i < nsb; i++) {
        __m256i c[8][8];  // [row][sub-block]
        float sc[8][8], mn[8][8], dw[8], dmin[8];
        int8_t s8[8][16], m8[8][16];
        for (int r = 0; r < 8; r++) {
            if (r >= rows) {  // missing rows: zero values and scales
                for (int j = 0; j < 8; j++) c[r][j] = _mm256_setzero_si256();
                memset(sc[r], 0, sizeof sc[r]);
                memset(mn[r], 0, sizeof mn[r]);
                memset(s8[r], 0, 16);
                memset(m8[r], 0, 16);
                dw[r] = dmin[r] = 0.0f;
                continue;
            }
            const uint8_t *b = w + (size_t)r * rb + (size_t)i * bs;
            if (q45) {
                __m256 vs, vm;
                KX(q45k_decode)(fmt == KX_KQ_Q5, b, c[r], &vs, &vm);
                _mm256_storeu_ps(sc[r], vs);
                _mm256_storeu_ps(mn[r], vm);
            } else {
                KX(k16_decode)(fmt == KX_KQ_Q2 ? KX_K_Q2 : fmt == KX_KQ_Q3 ? KX_K_Q3 : KX_K_Q6, b, c[r], s8[r],
                               m8[r], &dw[r], &dmin[r]);
            }
        }
        for (int j = 0; j < 8; j++) {
            uint8_t *o = dst + (size_t)(j * nsb + i) * KX_KP_BYTES;
            __m256i v[8];
            for (int r = 0; r < 8; r++) v[r] = c[r][j];
            KX(transpose8)(v);  // v[q] lane r = quad q of row r
            for (int q = 0; q < 8; q++) _mm256_storeu_si256((__m256i *)(o + 32 * q), v[q]);
            if (q45) {
                for (int r = 0; r < 8; r++) {
                    memcpy(o + KX_KP_SC + 4 * r, &sc[r][j], 4);
                    memcpy(o + KX_KP_MN + 4 * r, &mn[r][j], 4);
                }
                continue;
            }
            for (int r = 0; r < 8; r++) {
                const uint16_t a = (uint16_t)s8[r][2 * j], b = (uint16_t)s8[r][2 * j + 1];
                const uint16_t ma = (uint16_t)m8[r][2 * j], mb = (uint16_t)m8[r][2 * j + 1];
                const uint32_t pr = a | (uint32_t)b << 16, h0 = a | (uint32_t)a << 16, h1 = b | (uint32_t)b << 16;
                const uint32_t mp = ma | (uint32_t)mb << 16;
                memcpy(o + KX_KP_SPAIR + 4 * r, &pr, 4);
                memcpy(o + KX_KP_H0 + 4 * r, &h0, 4);
                memcpy(o + KX_KP_H1 + 4 * r, &h1, 4);
                memcpy(o + KX_KP_DW + 4 * r, &dw[r], 4);
                memcpy(o + KX_KP_MPAIR + 4 * r, &mp, 4);
                memcpy(o + KX_KP_DMIN + 4 * r, &dmin[r], 4);
            }
        }
    }
}

static int KX(kpack)(int kind, const void *w, size_t rb, int rows, int nsb, void *dst) {
    switch (kind) {
    case KAON_KI_Q2_K: KX(kpack_fmt)(KX_KQ_Q2, w, rb, rows, nsb, dst); return 0;
    case KAON_KI_Q3_K: KX(kpack_fmt)(KX_KQ_Q3, w, rb, rows, nsb, dst); return 0;
    case KAON_KI_Q4_K: KX(kpack_fmt)(KX_KQ_Q4, w, rb, rows, nsb, dst); return 0;
    case KAON_KI_Q5_K: KX(kpack_fmt)(KX_KQ_Q5, w, rb, rows, nsb, dst); return 0;
    case KAON_KI_Q6_K: KX(kpack_fmt)(KX_KQ_Q6, w, rb, rows, nsb, dst); return 0;
    default: return 1;
    }
}

// Sum of maddubs(packed quad vectors q0..q1-1, the activation's broadcast quads) as int16.
KX_AI __m256i KX(kq_sum16)(const uint8_t *p, const int8_t *x, const int q0, const int q1) {
    __m256i s = _mm256_maddubs_epi16(KX(ld)(p + 32 * q0), KX(bcast32)((const uint8_t *)(x + 4 * q0)));
    for (int q = q0 + 1; q < q1; q++)
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(KX(ld)(p + 32 * q), KX(bcast32)((const uint8_t *)(x + 4 * q))));
    return s;
}

// Sub-block position j of every super-block for NR activation rows (from row r0 of a): the
// partial sums part[r] (lane i = weight row i).
KX_AI void KX(ktile_j)(const int fmt, const int j, const uint8_t *pk, const int nsb, const kaon_q8_act *a,
                       const int r0, const int NR, __m256 *part) {
    const int nbp = a->nbp;
    const size_t xs = (size_t)nbp * 32;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 A[KX_KT_NR];
    for (int r = 0; r < NR; r++) A[r] = _mm256_setzero_ps();
    const uint8_t *p = pk + (size_t)j * nsb * KX_KP_BYTES;
    for (int i = 0; i < nsb; i++, p += KX_KP_BYTES) {
        const int blk = 8 * i + j;
        for (int r = 0; r < NR; r++) {
            const size_t row = (size_t)(r0 + r);
            const int8_t *x = a->qs + row * xs + (size_t)blk * 32;
            const __m256 dx = _mm256_set1_ps(a->d[row * nbp + blk]);
            __m256i I;
            if (fmt == KX_KQ_Q4) {
                I = _mm256_madd_epi16(KX(kq_sum16)(p, x, 0, 8), ones);
            } else if (fmt == KX_KQ_Q5) {
                I = _mm256_add_epi32(_mm256_madd_epi16(KX(kq_sum16)(p, x, 0, 4), ones),
                                     _mm256_madd_epi16(KX(kq_sum16)(p, x, 4, 8), ones));
            } else {
                const __m256i h0 = KX(ld)(p + KX_KP_H0), h1 = KX(ld)(p + KX_KP_H1);
                if (fmt == KX_KQ_Q6) {
                    I = _mm256_add_epi32(
                        _mm256_add_epi32(_mm256_madd_epi16(KX(kq_sum16)(p, x, 0, 2), h0),
                                         _mm256_madd_epi16(KX(kq_sum16)(p, x, 2, 4), h0)),
                        _mm256_add_epi32(_mm256_madd_epi16(KX(kq_sum16)(p, x, 4, 6), h1),
                                         _mm256_madd_epi16(KX(kq_sum16)(p, x, 6, 8), h1)));
                } else {
                    I = _mm256_add_epi32(_mm256_madd_epi16(KX(kq_sum16)(p, x, 0, 4), h0),
                                         _mm256_madd_epi16(KX(kq_sum16)(p, x, 4, 8), h1));
                }
                // The block's two half-sums, one int32 (s16 is [row, block, 2]).
                const __m256i hs = KX(bcast32)((const uint8_t *)(a->s16 + (row * nbp + blk) * 2));
                if (fmt != KX_KQ_Q2)
                    I = _mm256_sub_epi32(I, _mm256_slli_epi32(_mm256_madd_epi16(hs, KX(ld)(p + KX_KP_SPAIR)),
                                                              fmt == KX_KQ_Q6 ? 5 : 2));
                A[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(_mm256_loadu_ps((const float *)(p + KX_KP_DW)), dx),
                                       A[r]);
                if (fmt == KX_KQ_Q2)
                    A[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(hs, KX(ld)(p + KX_KP_MPAIR))),
                                            _mm256_mul_ps(_mm256_loadu_ps((const float *)(p + KX_KP_DMIN)), dx), A[r]);
                continue;
            }
            A[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(_mm256_loadu_ps((const float *)(p + KX_KP_SC)), dx),
                                   A[r]);
            A[r] = _mm256_fnmadd_ps(_mm256_loadu_ps((const float *)(p + KX_KP_MN)),
                                    _mm256_set1_ps(a->s[row * nbp + blk]), A[r]);
        }
    }
    for (int r = 0; r < NR; r++) part[r] = A[r];
}

KX_AI void KX(ktile_fmt)(const int fmt, const uint8_t *pk, const kaon_q8_act *a, int r0, const int NR,
                         float *out, size_t ldo) {
    const int nsb = a->nb / 8;
    __m256 part[8][KX_KT_NR];
    for (int j = 0; j < 8; j++) KX(ktile_j)(fmt, j, pk, nsb, a, r0, NR, part[j]);
    for (int r = 0; r < NR; r++) {
        const __m256 lo = _mm256_add_ps(_mm256_add_ps(part[0][r], part[4][r]), _mm256_add_ps(part[2][r], part[6][r]));
        const __m256 hi = _mm256_add_ps(_mm256_add_ps(part[1][r], part[5][r]), _mm256_add_ps(part[3][r], part[7][r]));
        _mm256_storeu_ps(out + r * ldo, _mm256_add_ps(lo, hi));
    }
}

#define KX_KT_DISPATCH(FMT)                                              \
    switch (nr) {                                                        \
    case 1: KX(ktile_fmt)(FMT, pk, a, r0, 1, out, ldo); break;           \
    case 2: KX(ktile_fmt)(FMT, pk, a, r0, 2, out, ldo); break;           \
    case 3: KX(ktile_fmt)(FMT, pk, a, r0, 3, out, ldo); break;           \
    default: KX(ktile_fmt)(FMT, pk, a, r0, KX_KT_NR, out, ldo); break;   \
    }

// out[r * ldo + i] = packed weight row i . activation row r0 + r of a, r < nr (<= KX_KT_NR).
static void KX(ktile_dot)(int kind, const void *pk_, const kaon_q8_act *a, int r0, int nr, float *out,
                          size_t ldo) {
    const uint8_t *pk = pk_;
    switch (kind) {
    case KAON_KI_Q2_K: KX_KT_DISPATCH(KX_KQ_Q2); break;
    case KAON_KI_Q3_K: KX_KT_DISPATCH(KX_KQ_Q3); break;
    case KAON_KI_Q4_K: KX_KT_DISPATCH(KX_KQ_Q4); break;
    case KAON_KI_Q5_K: KX_KT_DISPATCH(KX_KQ_Q5); break;
    default: KX_KT_DISPATCH(KX_KQ_Q6); break;
    }
}
#undef KX_KT_DISPATCH

// IQ4_XS: per sub-block j of 32, the levels of the 16 bytes' low then high nibbles (the
// activation block's order), signed, times (d (ls_j - 32)) dx.
KX_AI void KX(iq4xs_rows)(const kaon_block_iq4_xs *w, const kaon_q8_act *a, int r0, const int nr, float *out) {
    const int nsb = a->nb / 8, nbp = a->nbp;
    const size_t xs = (size_t)nbp * 32;
    const int8_t *x0 = a->qs + (size_t)r0 * xs;
    const float *d0 = a->d + (size_t)r0 * nbp;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc[KX_ROWS];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    for (int i = 0; i < nsb; i++) {
        const kaon_block_iq4_xs *b = w + i;
        int ls[8];
        const uint32_t sl = KX(ld32)(b->scales_l);
        for (int j = 0; j < 8; j++) ls[j] = kaon_iq4xs_scale(b->scales_h, sl, j);
        const __m256 sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)ls)),
                                        _mm256_set1_ps(KX(h2f)(b->d)));
        __m256i q[8];
        for (int j = 0; j < 8; j++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(b->qs + 16 * j));
            const __m256i n = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, m4)),
                                                      _mm_and_si128(_mm_srli_epi16(v, 4), m4), 1);
            q[j] = _mm256_shuffle_epi8(KX(iq4_table)(), n);
        }
        for (int r = 0; r < nr; r++) {
            const int8_t *x = x0 + r * xs + (size_t)i * 256;
            __m256i v[8];
            for (int j = 0; j < 8; j++) v[j] = KX(dot_signed)(q[j], KX(ld)(x + 32 * j));
            __m256i h = KX(reduce8)(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            const float *dx = d0 + (size_t)r * nbp + 8 * i;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_mul_ps(sc, _mm256_loadu_ps(dx)), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = KX(hsum)(acc[r]);
}

// Instantiate each kernel for a compile-time row count, so accumulators stay in registers.
#if KX_ROWS == 8
#define KX_DISPATCH_ROWS(CALL) \
    switch (nr) {              \
    case 1: CALL(1); break;    \
    case 2: CALL(2); break;    \
    case 3: CALL(3); break;    \
    case 4: CALL(4); break;    \
    case 5: CALL(5); break;    \
    case 6: CALL(6); break;    \
    case 7: CALL(7); break;    \
    default: CALL(8); break;   \
    }
#else
#define KX_DISPATCH_ROWS(CALL) \
    switch (nr) {              \
    case 1: CALL(1); break;    \
    case 2: CALL(2); break;    \
    case 3: CALL(3); break;    \
    default: CALL(4); break;   \
    }
#endif

#define KX_QDOT(name, CALL)                                                                 \
    static void KX(name)(const void *w, const kaon_q8_act *a, int r0, int nr, float *out) { \
        KX_DISPATCH_ROWS(CALL)                                                              \
    }
#define C(N) KX(pair_rows)((const uint8_t *)w, KX_F_Q4_0, a, r0, N, out)
KX_QDOT(qdot_q4_0, C)
#undef C
#define C(N) KX(pair_rows)((const uint8_t *)w, KX_F_Q4_1, a, r0, N, out)
KX_QDOT(qdot_q4_1, C)
#undef C
#define C(N) KX(pair_rows)((const uint8_t *)w, KX_F_Q5_0, a, r0, N, out)
KX_QDOT(qdot_q5_0, C)
#undef C
#define C(N) KX(pair_rows)((const uint8_t *)w, KX_F_Q5_1, a, r0, N, out)
KX_QDOT(qdot_q5_1, C)
#undef C
#define C(N) KX(pair_rows)((const uint8_t *)w, KX_F_Q8_0, a, r0, N, out)
KX_QDOT(qdot_q8_0, C)
#undef C
#define C(N) KX(pair_rows)((const uint8_t *)w, KX_F_IQ4_NL, a, r0, N, out)
KX_QDOT(qdot_iq4_nl, C)
#undef C
#define C(N) KX(k16_rows)(KX_K_Q2, (const uint8_t *)w, a, r0, N, out)
KX_QDOT(qdot_q2_k, C)
#undef C
#define C(N) KX(k16_rows)(KX_K_Q3, (const uint8_t *)w, a, r0, N, out)
KX_QDOT(qdot_q3_k, C)
#undef C
#define C(N) KX(q45k_rows)(0, (const uint8_t *)w, a, r0, N, out)
KX_QDOT(qdot_q4_k, C)
#undef C
#define C(N) KX(q45k_rows)(1, (const uint8_t *)w, a, r0, N, out)
KX_QDOT(qdot_q5_k, C)
#undef C
#define C(N) KX(k16_rows)(KX_K_Q6, (const uint8_t *)w, a, r0, N, out)
KX_QDOT(qdot_q6_k, C)
#undef C
#define C(N) KX(iq4xs_rows)((const kaon_block_iq4_xs *)w, a, r0, N, out)
KX_QDOT(qdot_iq4_xs, C)
#undef C
#undef KX_QDOT

// ---- float weights ---------------------------------------------------------------------

enum { KX_W_F32, KX_W_F16, KX_W_BF16 };

static inline __attribute__((always_inline)) __m256 KX(load_w8)(const void *w, const int kind,
                                                                 int k) {
    if (kind == KX_W_F32) return _mm256_loadu_ps((const float *)w + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    if (kind == KX_W_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) float KX(load_w1)(const void *w, const int kind, int k) {
    if (kind == KX_W_F32) return ((const float *)w)[k];
    uint16_t h = ((const uint16_t *)w)[k];
    return kind == KX_W_F16 ? KX(h2f)(h) : kaon_bf16_to_f32(h);
}

static inline __attribute__((always_inline)) void KX(fdot_rows)(const void *w, const int kind,
                                                                 int K, const float *x, size_t ldx,
                                                                 const int nr, float *out) {
    __m256 a0[KX_ROWS], a1[KX_ROWS];
    for (int r = 0; r < nr; r++) a0[r] = a1[r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = KX(load_w8)(w, kind, k), w1 = KX(load_w8)(w, kind, k + 8);
        for (int r = 0; r < nr; r++) {
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), a0[r]);
            a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + k + 8), a1[r]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w0 = KX(load_w8)(w, kind, k);
        for (int r = 0; r < nr; r++)
            a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), a0[r]);
    }
    for (int r = 0; r < nr; r++) {
        float s = KX(hsum)(_mm256_add_ps(a0[r], a1[r]));
        for (int kk = k; kk < K; kk++) s += KX(load_w1)(w, kind, kk) * x[r * ldx + kk];
        out[r] = s;
    }
}

static void KX(fdot_f32)(const void *w, int K, const float *x, size_t ldx, int nr, float *out) {
#define C(N) KX(fdot_rows)(w, KX_W_F32, K, x, ldx, N, out)
    KX_DISPATCH_ROWS(C)
#undef C
}
static void KX(fdot_f16)(const void *w, int K, const float *x, size_t ldx, int nr, float *out) {
#define C(N) KX(fdot_rows)(w, KX_W_F16, K, x, ldx, N, out)
    KX_DISPATCH_ROWS(C)
#undef C
}
static void KX(fdot_bf16)(const void *w, int K, const float *x, size_t ldx, int nr, float *out) {
#define C(N) KX(fdot_rows)(w, KX_W_BF16, K, x, ldx, N, out)
    KX_DISPATCH_ROWS(C)
#undef C
}

// ---- activation quantization (same numbers as kaon_cpu_quantize_row_ref) ----------------

static int KX(hsum_epi32)(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static void KX(quantize_row)(const float *x, kaon_q8_act *a, int row) {
    const int nb = a->nb, nbp = a->nbp, layout = a->layout;
    int8_t *qs = a->qs + (size_t)row * nbp * 32;
    float *d = a->d + (size_t)row * nbp, *s = a->s + (size_t)row * nbp;
    int16_t *s16 = a->s16 ? a->s16 + (size_t)row * nbp * 2 : NULL;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < nbp; b++) {
        __m256i q = _mm256_setzero_si256();
        float db = 0.0f;
        int slo = 0, shi = 0;
        if (b < nb) {
            const float *xb = x + (size_t)b * 32;
            __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
            __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                      _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_movehdup_ps(m));
            float amax = _mm_cvtss_f32(m);
            db = amax / 127.0f;
            float id = db != 0.0f ? 1.0f / db : 0.0f;
            __m256 vid = _mm256_set1_ps(id);
            // cvtps rounds to nearest even (the default MXCSR mode), like nearbyintf.
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vid));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vid));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, vid));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, vid));
            slo = KX(hsum_epi32)(_mm256_add_epi32(i0, i1));
            shi = KX(hsum_epi32)(_mm256_add_epi32(i2, i3));
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            q = _mm256_permutevar8x32_epi32(p, perm);
        }
        if (layout == KAON_ACT_Q4PAIRS) {
            _mm_storeu_si128((__m128i *)(qs + kaon_act_qpos(layout, b, 0)), _mm256_castsi256_si128(q));
            _mm_storeu_si128((__m128i *)(qs + kaon_act_qpos(layout, b, 16)), _mm256_extracti128_si256(q, 1));
        } else {
            _mm256_storeu_si256((__m256i *)(qs + (size_t)b * 32), q);
        }
        int dp = kaon_act_dpos(layout, b);
        d[dp] = db;
        s[dp] = db * (float)((int64_t)slo + shi);  // NaN/Inf inputs convert to INT_MIN: no int overflow
        if (s16) {
            s16[2 * b] = (int16_t)slo;
            s16[2 * b + 1] = (int16_t)shi;
        }
    }
}

// ---- attention and element-wise helpers ------------------------------------------------

static float KX(dot_f32)(const float *a, const float *b, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float s = KX(hsum)(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

// Sum of each of 8 vectors, as one vector [sum c0, ..., sum c7].
static inline __m256 KX(hsum8_ps)(__m256 c0, __m256 c1, __m256 c2, __m256 c3, __m256 c4,
                                  __m256 c5, __m256 c6, __m256 c7) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(c4, c5), _mm256_hadd_ps(c6, c7));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// 8 positions at a time: 8 independent FMA chains keep both FMA units busy.
static void KX(attn_scores)(const float *q, const float *k, size_t kstride, int n, int hd,
                            float scale, float *scores) {
    int j = 0;
    const int hd8 = hd & ~7;
    const __m256 vs = _mm256_set1_ps(scale);
    for (; j + 8 <= n; j += 8) {
        const float *kj = k + (size_t)j * kstride;
        __m256 c[8];
        for (int u = 0; u < 8; u++) c[u] = _mm256_setzero_ps();
        for (int i = 0; i < hd8; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int u = 0; u < 8; u++)
                c[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kj + (size_t)u * kstride + i), c[u]);
        }
        __m256 sum = KX(hsum8_ps)(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);
        if (hd8 < hd) {
            float tail[8] = {0};
            for (int u = 0; u < 8; u++)
                for (int i = hd8; i < hd; i++) tail[u] += q[i] * kj[(size_t)u * kstride + i];
            sum = _mm256_add_ps(sum, _mm256_loadu_ps(tail));
        }
        _mm256_storeu_ps(scores + j, _mm256_mul_ps(sum, vs));
    }
    for (; j < n; j++) scores[j] = scale * KX(dot_f32)(q, k + (size_t)j * kstride, hd);
}

// acc += sum_j p[j] v_j, 64 dims at a time in 8 registers (8 independent FMA chains).
static void KX(attn_accum)(float *acc, const float *v, size_t vstride, const float *p, int n,
                           int hd) {
    int i = 0;
    for (; i + 64 <= hd; i += 64) {
        __m256 a[8];
        for (int u = 0; u < 8; u++) a[u] = _mm256_loadu_ps(acc + i + 8 * u);
        for (int j = 0; j < n; j++) {
            const float *vj = v + (size_t)j * vstride + i;
            const __m256 pj = _mm256_set1_ps(p[j]);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * u), a[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + i + 8 * u, a[u]);
    }
    for (; i + 8 <= hd; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 2 <= n; j += 2) {
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * vstride + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 1]),
                                 _mm256_loadu_ps(v + (size_t)(j + 1) * vstride + i), a1);
        }
        if (j < n)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * vstride + i), a0);
        _mm256_storeu_ps(acc + i, _mm256_add_ps(a0, a1));
    }
    for (; i < hd; i++)
        for (int j = 0; j < n; j++) acc[i] += p[j] * v[(size_t)j * vstride + i];
}

// exp(x) for 8 floats: 2^n * p(r) with x = n ln2 + r, |r| <= ln2/2 (Cephes' expf polynomial,
// about 2 ulp). Inputs are clamped to +-88.376; below about -87.3 the result is 0.
static inline __m256 KX(exp_ps)(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static float KX(exp_sum)(float *s, int n, float mx) {
    __m256 sum = _mm256_setzero_ps(), m = _mm256_set1_ps(mx);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = KX(exp_ps)(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = KX(hsum)(sum);
    for (; j < n; j++) {
        s[j] = expf(s[j] - mx);
        t += s[j];
    }
    return t;
}

static void KX(silu_mul)(const float *g, const float *u, float *out, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = KX(exp_ps)(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// As the scalar gelu_tanh_mul: x / (1 + exp(-2y)), 2y = 2 sqrt(2/pi) (x + 0.044715 x^3).
static void KX(gelu_tanh_mul)(const float *g, const float *u, float *out, int n) {
    int i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), c2 = _mm256_set1_ps(-1.5957691216057308f),
                 c3 = _mm256_set1_ps(-1.5957691216057308f * 0.044715f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), x2 = _mm256_mul_ps(x, x);
        const __m256 ny2 = _mm256_mul_ps(x, _mm256_fmadd_ps(c3, x2, c2));  // -2y
        const __m256 gl = _mm256_div_ps(x, _mm256_add_ps(one, KX(exp_ps)(ny2)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(gl, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        const float x = g[i], y2 = 1.5957691216057308f * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + expf(-y2)) * u[i];
    }
}

static const kaon_cpu_kernels KX(kernels) = {
    .name = KX_NAME,
    .max_rows = KX_ROWS,
    .qdot = {[KAON_KI_Q4_0] = KX(qdot_q4_0), [KAON_KI_Q4_1] = KX(qdot_q4_1),
             [KAON_KI_Q5_0] = KX(qdot_q5_0), [KAON_KI_Q5_1] = KX(qdot_q5_1),
             [KAON_KI_Q8_0] = KX(qdot_q8_0), [KAON_KI_IQ4_NL] = KX(qdot_iq4_nl),
             [KAON_KI_Q2_K] = KX(qdot_q2_k), [KAON_KI_Q3_K] = KX(qdot_q3_k),
             [KAON_KI_Q4_K] = KX(qdot_q4_k), [KAON_KI_Q5_K] = KX(qdot_q5_k),
             [KAON_KI_Q6_K] = KX(qdot_q6_k), [KAON_KI_IQ4_XS] = KX(qdot_iq4_xs)},
    .fdot = {[KAON_KI_F32] = KX(fdot_f32), [KAON_KI_F16] = KX(fdot_f16),
             [KAON_KI_BF16] = KX(fdot_bf16)},
    .layout = {[KAON_KI_Q4_0] = KAON_ACT_Q4PAIRS, [KAON_KI_Q4_1] = KAON_ACT_Q4PAIRS,
               [KAON_KI_Q5_0] = KAON_ACT_Q4PAIRS, [KAON_KI_Q5_1] = KAON_ACT_Q4PAIRS,
               [KAON_KI_Q8_0] = KAON_ACT_Q4PAIRS, [KAON_KI_IQ4_NL] = KAON_ACT_Q4PAIRS},
    .quantize_row = KX(quantize_row),
    .pack_rows = KX_PACK_ROWS,
    .tile_rows = KX_TILE_NR,
    .pack_bytes = KX(pack_bytes),
    .pack = KX(pack),
    .tile_dot = KX(tile_dot),
    .kpack_bytes = KX(kpack_bytes),
    .kpack = KX(kpack),
    .ktile_dot = KX(ktile_dot),
    .ktile_rows = KX_KT_NR,
    .dot_f32 = KX(dot_f32),
    .attn_scores = KX(attn_scores),
    .attn_accum = KX(attn_accum),
    .exp_sum = KX(exp_sum),
    .silu_mul = KX(silu_mul),
    .gelu_tanh_mul = KX(gelu_tanh_mul),
};
