// DeepSeek's multi-head latent attention as a block (blocks.h): the latent cache rows, the
// absorbed attention every token can take, and the expanded form for long prefill chunks.
#include <stdlib.h>

#include "model/blocks.h"

size_t kaon_blk_mla_scratch(const kaon_model_config *c) {
    const size_t nh = (size_t)c->n_heads, kvl = (size_t)c->kv_lora_rank, rd = (size_t)c->rope_dim;
    return nh * (kvl + rd) + nh * kvl + (kvl + rd) + kvl + (size_t)c->q_lora_rank;
}

// The latent norms use RMSNorm's default epsilon (HF builds q_a_layernorm and kv_a_layernorm
// without the config's rms_norm_eps).
#define MLA_NORM_EPS 1e-6f
#define MLA_EXPAND_MIN 256

// Tokens a prefill chunk needs before it runs expanded: the expansion costs
// L nh (nope + v) kv_lora per chunk of context L, the absorbed form T L nh (kv_lora + rope
// + kv_lora) against the expanded T L nh (nope + rope + v): about 256 tokens pay for it.
static int expand_min(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KAON_MLA_EXPAND_MIN");
        const int x = e && *e ? atoi(e) : MLA_EXPAND_MIN;
        v = x > 1 ? x : 2;
    }
    return v;
}

// The first token of the batch's expanded part: the longest run of whole sequence chunks at
// the end of the batch (new prompts come last) each of at least expand_min() tokens at
// consecutive positions. T when nothing runs expanded.
static int expanded_from(const kaon_fwd *f, const kaon_batch *b, const kaon_mla_weights *w) {
    const int T = b->n_tokens;
    // (Expanded chunks read the cached latents with get_rows: an FP8 cache stays absorbed.)
    if (!f->op->mla_expanded_prefill || !w->wk_n || !f->op->get_rows || !f->op->attention || !f->xbuf || f->graphed ||
        f->kv[0].dtype != KAON_KV_NATIVE)
        return T;
    const int32_t *seq = b->attn.token_seq, *pos = b->attn.positions;
    int from = T;
    while (from > 0) {
        int t0 = from - 1;
        while (t0 > 0 && seq[t0 - 1] == seq[from - 1]) t0--;
        if (from - t0 < expand_min() || seq[t0] < 0 || pos[t0] < 0) break;
        for (int t = t0 + 1; t < from; t++)
            if (pos[t] != pos[t0] + (t - t0)) return from;
        from = t0;
    }
    return from;
}

// The runner's grow-only buffer, at least bytes; NULL when the backend has no memory for it.
static void *xbuf(kaon_fwd *f, size_t bytes) {
    if (bytes <= *f->xbuf_cap) return *f->xbuf;
    if (*f->xbuf) f->op->free(f->be, *f->xbuf);
    *f->xbuf_cap = 0;
    const size_t cap = bytes + bytes / 4;
    *f->xbuf = f->op->alloc(f->be, cap);
    if (*f->xbuf) *f->xbuf_cap = cap;
    return *f->xbuf;
}

// Tokens [t0, t1) of one sequence (consecutive positions), expanded: the context's latent
// rows gathered from the cache, each head's k = [c W_UK^T | k_pe] and v = c W_UV^T, attention
// over them (a private cache of the context, its blocks in order), the output's v-wide part
// into att. q holds [q_nope | the rotated, scaled q_pe] per head. 1: declined (nothing done).
static int expanded_chunk(kaon_fwd *f, const kaon_batch *b, int l, const kaon_mla_weights *w, int t0, int t1,
                          float scale) {
    const kaon_backend_ops *op = f->op;
    const kaon_model_config *c = f->c;
    const int nh = c->n_heads, kvl = c->kv_lora_rank, rd = c->rope_dim, nope = c->qk_nope_head_dim;
    const int hd = c->head_dim, vh = c->v_head_dim, row = kvl + rd, n = t1 - t0;
    const kaon_attn_meta *m = &b->attn;
    const int bs = m->block_size, s = m->token_seq[t0], L = m->positions[t1 - 1] + 1;
    const int nb = (L + bs - 1) / bs, Lp = nb * bs;
    const size_t eb = op->act_elem_bytes;
    const size_t lat_e = (size_t)L * row, kx_e = (size_t)Lp * nh * hd, out_e = (size_t)n * nh * hd;
    char *lat = xbuf(f, eb * (lat_e + 2 * kx_e + out_e));
    int32_t *idx = malloc(sizeof(int32_t) * ((size_t)L + (size_t)nb + (size_t)n));
    if (!lat || !idx || s >= m->n_seqs || nb > m->max_blocks) {
        free(idx);
        return 1;
    }
    char *kx = lat + eb * lat_e, *vx = kx + eb * kx_e, *ox = vx + eb * kx_e;
    int32_t *tab = idx + L, *seq0 = tab + nb;
    const int32_t *bt = m->block_tables + (size_t)s * m->max_blocks;
    for (int p = 0; p < L; p++) {
        const int32_t blk = bt[p / bs];
        if (blk < 0) {
            free(idx);
            return 1;
        }
        idx[p] = blk * bs + p % bs;
    }
    for (int i = 0; i < nb; i++) tab[i] = i;
    for (int i = 0; i < n; i++) seq0[i] = 0;
    op->get_rows(f->be, f->kv[l].k, idx, L, row, lat);
    // Every head reads the same latent row (head stride 0).
    op->head_linear(f->be, lat, L, nh, (size_t)row, 0, w->wk_n, kx, (size_t)nh * hd, (size_t)hd);
    for (int h = 0; h < nh; h++)
        op->copy_strided(f->be, lat + eb * (size_t)kvl, (size_t)row, kx + eb * ((size_t)h * hd + nope),
                         (size_t)nh * hd, L, rd, 1.0f);
    op->head_linear(f->be, lat, L, nh, (size_t)row, 0, w->wv_b, vx, (size_t)nh * hd, (size_t)hd);
    const kaon_attn_meta me = {.n_tokens = n, .n_seqs = 1, .positions = m->positions + t0, .token_seq = seq0,
                               .block_tables = tab, .max_blocks = nb, .block_size = bs};
    const kaon_kv_layer kv = {.k = kx, .v = vx, .dtype = KAON_KV_NATIVE};
    // V is hd wide per head with vh real values: the output's other columns are not read.
    op->attention(f->be, (char *)f->a.q + eb * (size_t)t0 * nh * hd, &kv, &me, nh, nh, hd, scale, 0, ox);
    op->copy_strided(f->be, ox, (size_t)hd, (char *)f->a.att + eb * (size_t)t0 * nh * vh, (size_t)vh, n * nh, vh,
                     1.0f);
    free(idx);
    return 0;
}

void kaon_blk_mla(kaon_fwd *f, const kaon_batch *b, int l, const kaon_mla_weights *w,
                  const kaon_rope *rope, float scale, float pe_scale) {
    const kaon_backend_ops *op = f->op;
    const kaon_model_config *c = f->c;
    const int T = b->n_tokens, nh = c->n_heads, kvl = c->kv_lora_rank, rd = c->rope_dim;
    const int nope = c->qk_nope_head_dim, hd = c->head_dim, vh = c->v_head_dim, row = kvl + rd;
    const size_t eb = op->act_elem_bytes;
#define AT(p, elems) ((char *)(p) + (size_t)(elems) * eb)
    char *qm = f->a.scratch;                              // [T, nh, kvl + rd] absorbed q
    char *ol = AT(qm, (size_t)T * nh * row);              // [T, nh, kvl] attention output (latent)
    char *kva = AT(ol, (size_t)T * nh * kvl);             // [T, kvl + rd] latent | k_pe
    char *lat = AT(kva, (size_t)T * row);                 // [T, kvl] latent, normed
    char *qa = AT(lat, (size_t)T * kvl);                  // [T, q_lora]
    // q [T, nh, nope + rd] and [c | k_pe] from xn (one pass over xn where the backend can).
    const kaon_linear *first = w->wq ? w->wq : w->wq_a;
    const kaon_linear *ws[2] = {first, w->wkv_a};
    void *ys[2] = {w->wq ? f->a.q : (void *)qa, kva};
    // w->norm: this layer's norm of x here, split around the GEMVs where a residual GEMV prepared it.
    const bool split = w->norm && !f->pending && !f->norm_once && !f->tp && op->norm_linear_multi &&
                       op->norm_linear_multi(f->be, f->a.x, w->norm, c->rms_norm_eps, T, 2, ws, ys) != 1;
    if (!split) {
        if (w->norm) kaon_blk_norm(f, b, w->norm);
        if (!op->linear_multi || op->linear_multi(f->be, f->a.xn, T, 2, ws, ys) == 1)
            for (int i = 0; i < 2; i++) op->linear(f->be, f->a.xn, T, ws[i], ys[i]);
    }
    if (!w->wq) {
        op->rmsnorm(f->be, qa, NULL, w->q_a_norm, MLA_NORM_EPS, T, c->q_lora_rank, qa);
        op->linear(f->be, qa, T, w->wq_b, f->a.q);
    }
    // The cache row: normed latent, then the rotated shared key; qm's tail: pe_scale rope(q_pe).
    const bool fused = op->mla_prep && op->mla_prep(f->be, kva, w->kv_a_norm, MLA_NORM_EPS, f->a.q, nh, hd, pe_scale,
                                                    qm, &f->kv[l], &b->attn, kvl, rd, rope) != 1;
    if (!fused) {
        op->copy_strided(f->be, kva, (size_t)row, lat, (size_t)kvl, T, kvl, 1.0f);
        op->rmsnorm(f->be, lat, NULL, w->kv_a_norm, MLA_NORM_EPS, T, kvl, lat);
        op->copy_strided(f->be, lat, (size_t)kvl, kva, (size_t)row, T, kvl, 1.0f);
        op->rope(f->be, AT(kva, kvl), T, 1, row, b->attn.positions, rope);  // rotates [kvl, kvl + rd)
        op->kv_write(f->be, &f->kv[l], kva, NULL, &b->attn, 1, row);
        op->rope(f->be, AT(f->a.q, nope), T, nh, hd, b->attn.positions, rope);  // q_pe, in place
        op->copy_strided(f->be, AT(f->a.q, nope), (size_t)hd, AT(qm, kvl), (size_t)row, T * nh, rd, pe_scale);
    }
    // Tokens [0, ta) absorbed, [ta, T) expanded (long prefill chunks at the batch's end).
    int ta = expanded_from(f, b, w);
    // q_nope absorbed into the latent: qm = [q_nope W_UK | pe_scale q_pe].
    if (ta > 0)
        op->head_linear(f->be, f->a.q, ta, nh, (size_t)nh * hd, (size_t)hd, w->wk_b, qm, (size_t)nh * row, (size_t)row);
    if (ta < T) {
        // q for the expanded tokens: [q_nope | pe_scale rope(q_pe)] (the tail qm already holds).
        op->copy_strided(f->be, AT(qm, (size_t)ta * nh * row + kvl), (size_t)row, AT(f->a.q, (size_t)ta * nh * hd + nope),
                         (size_t)hd, (T - ta) * nh, rd, 1.0f);
        for (int t0 = ta, t1; t0 < T; t0 = t1) {
            for (t1 = t0 + 1; t1 < T && b->attn.token_seq[t1] == b->attn.token_seq[t0];) t1++;
            if (expanded_chunk(f, b, l, w, t0, t1, scale) == 1) {  // no memory for it: absorbed
                op->head_linear(f->be, AT(f->a.q, (size_t)ta * nh * hd), T - ta, nh, (size_t)nh * hd, (size_t)hd,
                                w->wk_b, AT(qm, (size_t)ta * nh * row), (size_t)nh * row, (size_t)row);
                ta = T;
                break;
            }
        }
    }
    if (ta > 0) {
        kaon_attn_meta ma = b->attn;
        ma.n_tokens = ta;
        op->mla_attention(f->be, qm, &f->kv[l], &ma, nh, kvl, rd, scale, ol);
        // Each head's latent output through its W_UV.
        op->head_linear(f->be, ol, ta, nh, (size_t)nh * kvl, (size_t)kvl, w->wv_b, f->a.att, (size_t)nh * vh,
                        (size_t)vh);
    }
#undef AT
    if (w->next_norm) kaon_blk_out_residual(f, b, w->wo, f->a.att, 1.0f, w->next_norm);
    else kaon_blk_out(f, b, w->wo, f->a.att);
}
