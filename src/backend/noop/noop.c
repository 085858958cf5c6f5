// A backend that computes nothing: every op returns at once and logits come back as a fixed
// pattern. It exists to measure what the engine itself costs per step (scheduling, batch
// building, postprocessing) with the model's math taken away.
#include <stdlib.h>

#include "backend/backend.h"

static void *noop_alloc(kaon_backend *be, size_t bytes) {
    (void)be;
    return calloc(1, bytes ? bytes : 1);
}
static void noop_free(kaon_backend *be, void *p) { (void)be; free(p); }
static void noop_embed(kaon_backend *be, const kaon_tensor *t, const int32_t *ids, int n, void *out) {
    (void)be; (void)t; (void)ids; (void)n; (void)out;
}
static void noop_get_rows(kaon_backend *be, const void *x, const int32_t *idx, int n, int dim, void *out) {
    (void)be; (void)x; (void)idx; (void)n; (void)dim; (void)out;
}
static void noop_rmsnorm(kaon_backend *be, void *x, const void *add, const kaon_tensor *w, float eps,
                         int n, int dim, void *out) {
    (void)be; (void)x; (void)add; (void)w; (void)eps; (void)n; (void)dim; (void)out;
}
// Reads no weights, so a layer of any format (companions included) is accepted.
static void noop_linear(kaon_backend *be, const void *x, int n, const kaon_linear *w, void *y) {
    (void)be; (void)x; (void)n; (void)w; (void)y;
}
static void noop_rope(kaon_backend *be, void *x, int n, int nh, int hd, const int32_t *pos,
                      const kaon_rope *r) {
    (void)be; (void)x; (void)n; (void)nh; (void)hd; (void)pos; (void)r;
}
static void noop_kv_write(kaon_backend *be, kaon_kv_layer *kv, const void *k, const void *v,
                          const kaon_attn_meta *m, int nkv, int hd) {
    (void)be; (void)kv; (void)k; (void)v; (void)m; (void)nkv; (void)hd;
}
static void noop_mla_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                               const kaon_attn_meta *m, int nh, int kvl, int rd, float scale, void *out) {
    (void)be; (void)q; (void)kv; (void)m; (void)nh; (void)kvl; (void)rd; (void)scale; (void)out;
}
static void noop_head_linear(kaon_backend *be, const void *x, int n, int nh, size_t xt, size_t xh,
                             const kaon_linear *w, void *y, size_t yt, size_t yh) {
    (void)be; (void)x; (void)n; (void)nh; (void)xt; (void)xh; (void)w; (void)y; (void)yt; (void)yh;
}
static void noop_copy_strided(kaon_backend *be, const void *src, size_t ss, void *dst, size_t ds, int rows,
                              int width, float s) {
    (void)be; (void)src; (void)ss; (void)dst; (void)ds; (void)rows; (void)width; (void)s;
}
static void noop_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                           const kaon_attn_meta *m, int nh, int nkv, int hd, float scale, int window,
                           void *out) {
    (void)be; (void)q; (void)kv; (void)m; (void)nh; (void)nkv; (void)hd; (void)scale; (void)window;
    (void)out;
}
// silu_and_mul and gelu_tanh_and_mul.
static void noop_gated(kaon_backend *be, const void *g, const void *u, int n, int dim, void *out) {
    (void)be; (void)g; (void)u; (void)n; (void)dim; (void)out;
}
static void noop_scale(kaon_backend *be, void *x, size_t n, float s) {
    (void)be; (void)x; (void)n; (void)s;
}
static void noop_softcap(kaon_backend *be, float *x, size_t n, float cap) {
    (void)be; (void)x; (void)n; (void)cap;
}
// Logits: left as they are (zeros from the start), so greedy picks token 0 every step.
static void noop_to_host(kaon_backend *be, const void *x, size_t n, float *out) {
    (void)be; (void)x; (void)n; (void)out;
}
static int noop_moe(kaon_backend *be, const void *x, int n, const int32_t *pos,
                    const kaon_moe_weights *w, uint32_t *counts, void *out) {
    (void)be; (void)x; (void)n; (void)pos; (void)w; (void)counts; (void)out;
    return 0;
}
static void noop_destroy(kaon_backend *be) { free(be); }

static const kaon_backend_ops noop_ops = {
    .name = "noop", .alloc = noop_alloc, .free = noop_free, .act_elem_bytes = 4,
    .embed = noop_embed, .get_rows = noop_get_rows, .rmsnorm = noop_rmsnorm, .linear = noop_linear,
    .rope = noop_rope, .kv_write = noop_kv_write, .attention = noop_attention,
    .mla_attention = noop_mla_attention, .head_linear = noop_head_linear, .copy_strided = noop_copy_strided,
    .silu_and_mul = noop_gated, .gelu_tanh_and_mul = noop_gated, .scale = noop_scale, .logit_softcap = noop_softcap,
    .to_host_f32 = noop_to_host, .destroy = noop_destroy, .moe = noop_moe,
};

kaon_backend *kaon_backend_noop_create(void) {
    kaon_backend *be = calloc(1, sizeof *be);
    if (be) {
        be->ops = &noop_ops;
        be->n_threads = 1;
    }
    return be;
}
