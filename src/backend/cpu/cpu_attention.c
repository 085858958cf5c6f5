// Paged KV cache writes and causal attention with GQA on the CPU, and MLA's absorbed form
// (one latent row per token that is both K and, its first kv_lora values, V).
//
// K and V of one layer are [n_blocks, block_size, n_kv_heads, head_dim] f32. A work item is a
// token and the query heads of one KV head (a single head when few tokens must be spread over
// the threads). It walks the token's keys (0..p, or the last `window` of them) through its
// block table in chunks of at most 64 positions (runs inside consecutive blocks), computes the
// chunk's scores for each head, and folds them into a running max / sum / weighted V
// accumulator (online softmax), so nothing grows with the context. Items are handed out
// dynamically: their cost grows with position.
//
// An FP8 cache (KAON_KV_FP8) holds e4m3 codes of x / scale: kv_write quantizes, and attention
// decodes each chunk's rows of the item's KV heads to f32 (times the layer's scale) once, then
// runs the same score and accumulation kernels on them.
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/err.h"
#include "util/fp8.h"
#include "util/pool.h"

#define KAON_ATTN_CHUNK 64
#define KAON_ATTN_MAX_HD 1024
#define KAON_ATTN_HEADS 8  // query heads one work item handles (GQA sharing)

// e4m3 code -> f32, all 256 codes (NaN codes included, as stored).
static float e4m3_table[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;
static void e4m3_table_init(void) {
    for (int i = 0; i < 256; i++) e4m3_table[i] = kaon_e4m3_to_f32((uint8_t)i);
}

static void store_fp8(uint8_t *dst, const float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) dst[i] = kaon_f32_to_e4m3(x[i] / scale);
}

static void decode_fp8(float *dst, const uint8_t *src, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) dst[i] = e4m3_table[src[i]] * scale;
}

void kaon_cpu_kv_write(kaon_backend *be, kaon_kv_layer *kv, const void *k, const void *v,
                       const kaon_attn_meta *m, int n_kv_heads, int head_dim) {
    (void)be;
    if (!kv || !kv->k || !k || (v && !kv->v) || !m || n_kv_heads <= 0 || head_dim <= 0) {
        kaon_set_error("cpu kv_write: bad arguments");
        return;
    }
    if (m->n_tokens <= 0) return;
    if (!m->slot_mapping) {
        kaon_set_error("cpu kv_write: no slot mapping");
        return;
    }
    const size_t row = (size_t)n_kv_heads * (size_t)head_dim;
    float *K = kv->k, *V = kv->v;
    const float *kf = k, *vf = v;
    if (kv->dtype == KAON_KV_FP8) {
        for (int t = 0; t < m->n_tokens; t++) {
            const int32_t slot = m->slot_mapping[t];
            if (slot < 0) continue;
            store_fp8((uint8_t *)kv->k + (size_t)slot * row, kf + (size_t)t * row, row, kv->k_scale);
            if (vf) store_fp8((uint8_t *)kv->v + (size_t)slot * row, vf + (size_t)t * row, row, kv->v_scale);
        }
        return;
    }
    if (kv->dtype != KAON_KV_NATIVE) {
        kaon_set_error("cpu kv_write: unknown KV cache dtype %d", kv->dtype);
        return;
    }
    for (int t = 0; t < m->n_tokens; t++) {
        const int32_t slot = m->slot_mapping[t];
        if (slot < 0) continue;  // a padding token: nothing to store
        memcpy(K + (size_t)slot * row, kf + (size_t)t * row, row * sizeof(float));
        if (vf) memcpy(V + (size_t)slot * row, vf + (size_t)t * row, row * sizeof(float));
    }
}

// hd: query/key width per head; hv: value (and output) width. GQA: hv == hd, and K and V are
// separate caches. MLA: one KV head whose V is the first hv values of the K row itself.
typedef struct attn_job {
    const kaon_cpu_kernels *k;
    const float *q, *K, *V;
    float *out;
    const kaon_attn_meta *m;
    int n_heads, n_kv, hd, hv, group;
    float scale;
    int window;  // 0: all of 0..p
    const float *sinks;  // [n_heads] or NULL: a logit per head in the denominator only (gpt-oss)
    // FP8 cache: K8, V8 (1-byte codes, the same layout as K and V) and their scales; NULL: f32.
    const uint8_t *K8, *V8;
    float ks, vs;
} attn_job;

// Brings rows [0, len) of a [*, rs] float table into the cache, columns [c0, c1) of each.
// The K and V rows of a sequence are scattered block by block over the pool, and far more of
// them are read per step (every sequence's, every layer's) than the caches hold, so each
// block is asked for ahead of its use instead of waiting on each cache line in turn.
static inline void prefetch_rows(const float *base, size_t rs, int len, size_t c0, size_t c1) {
    if (c1 - c0 == rs) {  // whole rows: one contiguous run
        const char *p = (const char *)(base + c0), *e = (const char *)(base + (size_t)len * rs);
        for (; p < e; p += 64) __builtin_prefetch(p, 0, 2);
        return;
    }
    for (int i = 0; i < len; i++) {
        const char *p = (const char *)(base + (size_t)i * rs + c0), *e = (const char *)(base + (size_t)i * rs + c1);
        for (; p < e; p += 64) __builtin_prefetch(p, 0, 2);
    }
}

// Per-head state of one work item: the weighted V sums, a chunk's scores, the running max
// and softmax denominator.
typedef struct attn_state {
    float *acc;  // [nh, hv]
    float *sc;   // [nh, KAON_ATTN_CHUNK]
    float *mx, *l;
    float *kf, *vf;  // FP8 cache: a chunk's decoded K and V columns [KAON_ATTN_CHUNK, rs]
} attn_state;

// Token t, query heads h0..h0+nh-1 (consecutive, so the heads of one KV head are together):
// each chunk of K and V is loaded into L1 once and used by all the heads that share it
// (GQA), and with all the heads of a token the chunk's K and V rows are read whole. Every
// head goes through exactly the same operations whatever the grouping, so the result does
// not depend on how the work was split.
// Returns -1 when the metadata points outside the tables (the rows are then zeroed).
static int attend_heads(const attn_job *j, int t, int h0, int nh, const attn_state *st,
                        const bool prefetch) {
    const kaon_attn_meta *m = j->m;
    const int hd = j->hd, hv = j->hv, bs = m->block_size;
    float *o0 = j->out + ((size_t)t * j->n_heads + h0) * hv;
    const int s = m->token_seq[t], pos = m->positions[t];
    if (s < 0 || s >= m->n_seqs || pos < 0 || pos / bs >= m->max_blocks) {
        memset(o0, 0, (size_t)nh * hv * sizeof(float));
        return -1;
    }
    const int32_t *bt = m->block_tables + (size_t)s * m->max_blocks;
    // The first key: p - window + 1 for a sliding window (HF: kv_idx > q_idx - window), so the
    // blocks before it are never looked up.
    const int lo = j->window > 0 && pos >= j->window ? pos - j->window + 1 : 0;
    const float *q0 = j->q + ((size_t)t * j->n_heads + h0) * hd;
    const size_t rs = (size_t)j->n_kv * hd;  // floats between consecutive slots
    float *mx = st->mx, *l = st->l;
    for (int h = 0; h < nh; h++) {
        memset(st->acc + (size_t)h * hv, 0, (size_t)hv * sizeof(float));
        mx[h] = -INFINITY;
        l[h] = 0.0f;
    }
    // A chunk: up to KAON_ATTN_CHUNK positions, made of runs inside consecutive blocks (small
    // blocks would otherwise make the per-chunk softmax bookkeeping dominate).
    size_t seg_base[KAON_ATTN_CHUNK];
    int seg_len[KAON_ATTN_CHUNK];
    for (int p0 = lo; p0 <= pos;) {
        int nseg = 0, cnt = 0;
        while (cnt < KAON_ATTN_CHUNK && p0 + cnt <= pos) {
            const int p = p0 + cnt, blk = p / bs, off = p % bs;
            int len = bs - off;
            if (len > pos + 1 - p) len = pos + 1 - p;
            if (len > KAON_ATTN_CHUNK - cnt) len = KAON_ATTN_CHUNK - cnt;
            const int32_t bid = bt[blk];
            if (bid < 0) {
                memset(o0, 0, (size_t)nh * hv * sizeof(float));
                return -1;
            }
            seg_base[nseg] = ((size_t)bid * bs + off) * rs;
            seg_len[nseg++] = len;
            cnt += len;
        }
        // The K and V columns this item reads: its KV heads.
        const size_t c0 = (size_t)(h0 / j->group) * hd, c1 = (size_t)((h0 + nh - 1) / j->group + 1) * hd;
        const size_t cw = c1 - c0;
        if (j->K8) {  // decode the chunk once; the heads then read it as one f32 run of cnt rows
            const bool same = j->V8 == j->K8 && j->vs == j->ks;  // MLA: V is K's row
            for (int g = 0, c = 0; g < nseg; c += seg_len[g++])
                for (int i = 0; i < seg_len[g]; i++) {
                    const size_t src = seg_base[g] + (size_t)i * rs + c0, dst = (size_t)(c + i) * cw;
                    decode_fp8(st->kf + dst, j->K8 + src, cw, j->ks);
                    if (!same) decode_fp8(st->vf + dst, j->V8 + src, cw, j->vs);
                }
            for (int h = 0; h < nh; h++) {
                const size_t hoff = (size_t)((h0 + h) / j->group) * hd - c0;
                j->k->attn_scores(q0 + (size_t)h * hd, st->kf + hoff, cw, cnt, hd, j->scale,
                                  st->sc + (size_t)h * KAON_ATTN_CHUNK);
            }
        }
        if (prefetch && !j->K8 && p0 == lo) prefetch_rows(j->K + seg_base[0], rs, seg_len[0], c0, c1);
        for (int h = 0; h < nh && !j->K8; h++) {
            const size_t hoff = (size_t)((h0 + h) / j->group) * hd;  // the KV head in a slot
            for (int g = 0, c = 0; g < nseg; c += seg_len[g++]) {
                if (prefetch && h == 0) {  // the first pass over the chunk asks for what comes next
                    if (g + 1 < nseg) {
                        prefetch_rows(j->K + seg_base[g + 1], rs, seg_len[g + 1], c0, c1);
                    } else if (p0 + cnt <= pos) {  // the next chunk's first block
                        const int p = p0 + cnt, off = p % bs, bid = bt[p / bs];
                        int len = bs - off;
                        if (len > pos + 1 - p) len = pos + 1 - p;
                        if (bid >= 0) prefetch_rows(j->K + ((size_t)bid * bs + off) * rs, rs, len, c0, c1);
                    }
                    prefetch_rows(j->V + seg_base[g], rs, seg_len[g], c0, c1);
                }
                j->k->attn_scores(q0 + (size_t)h * hd, j->K + seg_base[g] + hoff, rs, seg_len[g], hd,
                                  j->scale, st->sc + (size_t)h * KAON_ATTN_CHUNK + c);
            }
        }
        for (int h = 0; h < nh; h++) {
            float *sc = st->sc + (size_t)h * KAON_ATTN_CHUNK, *acc = st->acc + (size_t)h * hv;
            float cm = sc[0];
            for (int i = 1; i < cnt; i++) cm = sc[i] > cm ? sc[i] : cm;
            if (cm > mx[h]) {  // a new maximum: rescale what was accumulated so far
                const float corr = expf(mx[h] - cm);
                l[h] *= corr;
                for (int i = 0; i < hv; i++) acc[i] *= corr;
                mx[h] = cm;
            }
            l[h] += j->k->exp_sum(sc, cnt, mx[h]);
        }
        if (j->K8) {
            const float *vf = j->V8 == j->K8 && j->vs == j->ks ? st->kf : st->vf;
            for (int h = 0; h < nh; h++) {
                const size_t hoff = (size_t)((h0 + h) / j->group) * hd - c0;
                j->k->attn_accum(st->acc + (size_t)h * hv, vf + hoff, cw, st->sc + (size_t)h * KAON_ATTN_CHUNK,
                                 cnt, hv);
            }
        }
        for (int h = 0; h < nh && !j->K8; h++) {
            const size_t hoff = (size_t)((h0 + h) / j->group) * hd;
            for (int g = 0, c = 0; g < nseg; c += seg_len[g++])
                j->k->attn_accum(st->acc + (size_t)h * hv, j->V + seg_base[g] + hoff, rs,
                                 st->sc + (size_t)h * KAON_ATTN_CHUNK + c, seg_len[g], hv);
        }
        p0 += cnt;
    }
    for (int h = 0; h < nh; h++) {
        if (j->sinks) {  // e^(sink - max) joins the denominator (rescaled when the sink is larger)
            const float sk = j->sinks[h0 + h];
            if (sk > mx[h]) {
                const float corr = expf(mx[h] - sk);
                l[h] *= corr;
                for (int i = 0; i < hv; i++) st->acc[(size_t)h * hv + i] *= corr;
                mx[h] = sk;
            }
            l[h] += expf(sk - mx[h]);
        }
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        const float *acc = st->acc + (size_t)h * hv;
        for (int i = 0; i < hv; i++) o0[(size_t)h * hv + i] = acc[i] * inv;
    }
    return 0;
}

// One attention op's work items for the pool, and whether any failed.
typedef struct attn_par {
    const attn_job *j;
    float *stbuf;
    size_t st_floats;
    int hg, nsub, per_tok;
    atomic_int bad;
} attn_par;

// Work item `it` on thread th (whose state lives in its own slice of stbuf).
static void attn_task(void *c, int it, int th) {
    attn_par *ap = c;
    const attn_job *j = ap->j;
    const int hg = ap->hg, n_heads = j->n_heads, group = j->group;
    float *b = ap->stbuf + ap->st_floats * (size_t)th;
    float *kf = b + (size_t)hg * (j->hv + KAON_ATTN_CHUNK + 2) + 16;  // after acc, sc, mx, l
    const size_t dec = (size_t)KAON_ATTN_CHUNK * j->n_kv * j->hd;  // a decoded chunk, whole rows
    const attn_state st = {.acc = b, .sc = b + (size_t)hg * j->hv,
                           .mx = b + (size_t)hg * (j->hv + KAON_ATTN_CHUNK),
                           .l = b + (size_t)hg * (j->hv + KAON_ATTN_CHUNK + 1),
                           .kf = j->K8 ? kf : NULL, .vf = j->K8 ? kf + dec : NULL};
    const int t = it / ap->per_tok;
    int bad;
    if (hg == n_heads) {
        bad = attend_heads(j, t, 0, n_heads, &st, true);
    } else {
        const int r = it % ap->per_tok, g = r / ap->nsub, sb = r % ap->nsub;
        const int nh = group - sb * hg < hg ? group - sb * hg : hg;
        bad = attend_heads(j, t, g * group + sb * hg, nh, &st, false);
    }
    if (bad) atomic_fetch_or_explicit(&ap->bad, 1, memory_order_relaxed);
}

// Runs job j over its tokens (the threads and the grouping of heads into work items).
static void run_attention(kaon_cpu_backend *be, const attn_job *jp, const char *what) {
    const attn_job j = *jp;
    const kaon_attn_meta *m = j.m;
    const int T = m->n_tokens, n_heads = j.n_heads, n_kv_heads = j.n_kv, head_dim = j.hd;
    const int window = j.window;
    double work = 0.0;
    for (int t = 0; t < T; t++) {
        const int keys = m->positions[t] > 0 ? m->positions[t] + 1 : 1;
        work += (double)(window > 0 && keys > window ? window : keys);
    }
    work *= 4.0 * n_heads * (head_dim + j.hv);  // 2 float FMAs per (position, dim), ~4x an int8 MAC
    const int nt = kaon_cpu_threads_for(&be->base, work);
    // Work items: a token and some of its query heads. Many tokens (a batched decode step, a
    // prefill chunk): all of a token's heads, so its K and V rows are read whole, block by
    // block. Otherwise the query heads of one KV head (at most KAON_ATTN_HEADS), or, with few
    // tokens and short contexts (decode of one sequence), one head per item, which spreads
    // the work more evenly over the threads.
    const int group = n_heads / n_kv_heads;
    int hg = group < KAON_ATTN_HEADS ? group : KAON_ATTN_HEADS;
    if (nt > 1 && T * n_kv_heads < 4 * nt && work < 8.0 * n_heads * head_dim * 512.0 * T) hg = 1;
    if (T >= 8 * nt) hg = n_heads;
    const int nsub = hg == n_heads ? 1 : (group + hg - 1) / hg;
    const int per_tok = hg == n_heads ? 1 : n_kv_heads * nsub, items = T * per_tok;
    // Per-thread state for hg heads.
    size_t st_floats = (size_t)hg * ((size_t)j.hv + KAON_ATTN_CHUNK + 2) + 16;
    if (j.K8) st_floats += 2 * (size_t)KAON_ATTN_CHUNK * n_kv_heads * head_dim + 16;  // kf, vf
    float *stbuf = kaon_cpu_scratch(be, sizeof(float) * st_floats * (size_t)nt);
    if (!stbuf) return;
    attn_par ap = {.j = &j, .stbuf = stbuf, .st_floats = st_floats, .hg = hg, .nsub = nsub,
                   .per_tok = per_tok};
    kaon_pool_run(be->pool, items, nt, attn_task, &ap);
    const int bad = atomic_load_explicit(&ap.bad, memory_order_relaxed);
    if (bad) kaon_set_error("cpu %s: a token's sequence, position or block is out of range", what);
}

static bool meta_ok(const kaon_attn_meta *m) {
    return m->positions && m->token_seq && m->block_tables && m->block_size > 0 && m->max_blocks > 0 &&
           m->n_seqs > 0;
}

void kaon_cpu_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                        const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                        float scale, int window, void *out) {
    kaon_cpu_attention_sinks(be, q, kv, m, n_heads, n_kv_heads, head_dim, scale, window, NULL, out);
}

void kaon_cpu_attention_sinks(kaon_backend *be_, const void *q, const kaon_kv_layer *kv,
                              const kaon_attn_meta *m, int n_heads, int n_kv_heads, int head_dim,
                              float scale, int window, const float *sinks, void *out) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (!q || !kv || !kv->k || !kv->v || !m || !out || n_heads <= 0 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads != 0 || head_dim <= 0 || head_dim > KAON_ATTN_MAX_HD || window < 0) {
        kaon_set_error("cpu attention: bad arguments (heads %d, kv heads %d, head_dim %d, window %d)",
                       n_heads, n_kv_heads, head_dim, window);
        return;
    }
    if (m->n_tokens <= 0) return;
    if (!meta_ok(m)) {
        kaon_set_error("cpu attention: incomplete metadata");
        return;
    }
    if (kv->dtype != KAON_KV_NATIVE && kv->dtype != KAON_KV_FP8) {
        kaon_set_error("cpu attention: unknown KV cache dtype %d", kv->dtype);
        return;
    }
    const bool f8 = kv->dtype == KAON_KV_FP8;
    if (f8) pthread_once(&e4m3_once, e4m3_table_init);
    const attn_job j = {.k = be->k, .q = q, .K = kv->k, .V = kv->v, .out = out, .m = m,
                        .n_heads = n_heads, .n_kv = n_kv_heads, .hd = head_dim, .hv = head_dim,
                        .group = n_heads / n_kv_heads, .scale = scale, .window = window, .sinks = sinks,
                        .K8 = f8 ? kv->k : NULL, .V8 = f8 ? kv->v : NULL, .ks = kv->k_scale, .vs = kv->v_scale};
    run_attention(be, &j, "attention");
}

void kaon_cpu_mla_attention(kaon_backend *be_, const void *q, const kaon_kv_layer *kv,
                            const kaon_attn_meta *m, int n_heads, int kv_lora, int rope_dim,
                            float scale, void *out) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (!q || !kv || !kv->k || !m || !out || n_heads <= 0 || kv_lora <= 0 || rope_dim < 0 ||
        kv_lora + rope_dim > KAON_ATTN_MAX_HD) {
        kaon_set_error("cpu mla_attention: bad arguments (heads %d, latent %d, rope %d)", n_heads, kv_lora,
                       rope_dim);
        return;
    }
    if (m->n_tokens <= 0) return;
    if (!meta_ok(m)) {
        kaon_set_error("cpu mla_attention: incomplete metadata");
        return;
    }
    if (kv->dtype != KAON_KV_NATIVE && kv->dtype != KAON_KV_FP8) {
        kaon_set_error("cpu mla_attention: unknown KV cache dtype %d", kv->dtype);
        return;
    }
    const bool f8 = kv->dtype == KAON_KV_FP8;  // the latent row: K and V with k_scale
    if (f8) pthread_once(&e4m3_once, e4m3_table_init);
    const attn_job j = {.k = be->k, .q = q, .K = kv->k, .V = kv->k, .out = out, .m = m,
                        .n_heads = n_heads, .n_kv = 1, .hd = kv_lora + rope_dim, .hv = kv_lora,
                        .group = n_heads, .scale = scale, .window = 0,
                        .K8 = f8 ? kv->k : NULL, .V8 = f8 ? kv->k : NULL, .ks = kv->k_scale, .vs = kv->k_scale};
    run_attention(be, &j, "mla_attention");
}
