// The CPU backend's op table: memory, embedding, norms, RoPE and the element-wise ops. The
// heavy ops live in cpu_linear.c and cpu_attention.c; the SIMD kernels in cpu_x86.h.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "util/err.h"
#include "util/half.h"
#include "util/pool.h"
#include "util/cpus.h"

static const kaon_backend_ops cpu_ops;

int kaon_cpu_fail(kaon_cpu_backend *be, const char *fmt, ...) {
    char msg[sizeof be->errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!be->err) {
        memcpy(be->errmsg, msg, sizeof msg);
        be->err = 1;
    }
    return kaon_set_error("%s", msg);
}

static int cpu_status(kaon_backend *be_) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (!be->err) return 0;
    be->err = 0;
    return kaon_set_error("%s", be->errmsg);
}

void *kaon_cpu_scratch(kaon_cpu_backend *be, size_t bytes) {
    if (bytes <= be->scratch_cap) return be->scratch;
    size_t cap = bytes + bytes / 4 + 4096;
    cap = (cap + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, cap) != 0) {
        kaon_cpu_fail(be, "cpu: out of memory for %zu bytes of scratch", bytes);
        return NULL;
    }
    free(be->scratch);
    be->scratch = p;
    be->scratch_cap = cap;
    return p;
}

// Memory comes straight from anonymous mappings: page-aligned, zero, and only the pages that
// are touched become resident (a KV pool sized for the whole context costs nothing until used).
// A 64-byte header before the returned pointer keeps the mapping's length for cpu_free.
#define CPU_ALLOC_HEADER 64

static void *cpu_alloc(kaon_backend *be, size_t bytes) {
    (void)be;
    if (bytes > SIZE_MAX / 2) {
        kaon_set_error("cpu alloc: %zu bytes is too large", bytes);
        return NULL;
    }
    size_t len = bytes + CPU_ALLOC_HEADER;
    char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        kaon_set_error("cpu alloc: out of memory for %zu bytes", bytes);
        return NULL;
    }
    memcpy(base, &len, sizeof len);
    return base + CPU_ALLOC_HEADER;
}

static void cpu_free(kaon_backend *be, void *p) {
    (void)be;
    if (!p) return;
    char *base = (char *)p - CPU_ALLOC_HEADER;
    size_t len;
    memcpy(&len, base, sizeof len);
    munmap(base, len);
}

// Element i of a small float vector stored as F32, F16 or BF16.
static inline float load_any(kaon_dtype t, const void *p, int i) {
    switch (t) {
    case KAON_F16: return kaon_f16_to_f32(((const uint16_t *)p)[i]);
    case KAON_BF16: return kaon_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void cpu_embed(kaon_backend *be, const kaon_tensor *table, const int32_t *ids, int n,
                      void *out_) {
    (void)be;
    float *out = out_;
    if (n <= 0) return;
    if (!table || !table->data || table->ndim != 2 || !ids || !out) {
        kaon_set_error("cpu embed: bad arguments");
        return;
    }
    const int64_t vocab = table->shape[0], dim = table->shape[1];
    const size_t rb = kaon_dtype_row_bytes(table->dtype, dim);
    if (vocab <= 0 || dim <= 0 || dim > INT32_MAX || rb == 0 || kaon_cpu_kind(table->dtype) < 0 ||
        (table->nbytes && table->nbytes / rb < (size_t)vocab)) {
        kaon_set_error("cpu embed: unsupported table %s [%lld, %lld]",
                       kaon_dtype_name(table->dtype), (long long)vocab, (long long)dim);
        return;
    }
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * dim;
        if (ids[i] < 0 || ids[i] >= vocab) {
            memset(o, 0, (size_t)dim * sizeof(float));
            kaon_set_error("cpu embed: token id %d outside the vocabulary of %lld", ids[i],
                           (long long)vocab);
            continue;
        }
        kaon_cpu_dequantize_row(table->dtype, table->data, ids[i], dim, o);
    }
}

static void cpu_get_rows(kaon_backend *be, const void *x, const int32_t *idx, int n, int dim,
                         void *out) {
    (void)be;
    if (n <= 0 || dim <= 0) return;
    if (!x || !idx || !out) {
        kaon_set_error("cpu get_rows: bad arguments");
        return;
    }
    const size_t row = (size_t)dim * sizeof(float);
    for (int i = 0; i < n; i++) {
        if (idx[i] < 0) {
            memset((char *)out + i * row, 0, row);
            kaon_set_error("cpu get_rows: negative row %d", idx[i]);
            continue;
        }
        memmove((char *)out + i * row, (const char *)x + (size_t)idx[i] * row, row);
    }
}

typedef struct norm_job {
    const kaon_cpu_kernels *k;
    float *x, *out;
    const float *add;
    const kaon_tensor *w;
    float eps;
    int dim;
} norm_job;

static void norm_rows(const norm_job *j, int t0, int t1) {
    const int dim = j->dim;
    const kaon_dtype wt = j->w->dtype;
    const float *wf = wt == KAON_F32 ? (const float *)j->w->data : NULL;
    for (int t = t0; t < t1; t++) {
        float *xr = j->x + (size_t)t * dim, *o = j->out + (size_t)t * dim;
        if (j->add) {
            const float *ar = j->add + (size_t)t * dim;
            for (int i = 0; i < dim; i++) xr[i] += ar[i];
        }
        const float r = 1.0f / sqrtf(j->k->dot_f32(xr, xr, dim) / (float)dim + j->eps);
        if (wf)
            for (int i = 0; i < dim; i++) o[i] = xr[i] * r * wf[i];
        else
            for (int i = 0; i < dim; i++) o[i] = xr[i] * r * load_any(wt, j->w->data, i);
    }
}

// Items [0, n) (rows, tokens) in a few ranges per thread, fn(ctx, i0, i1) for each.
typedef struct range_par {
    void (*fn)(void *ctx, int i0, int i1);
    void *ctx;
    int n, per;
} range_par;

static void range_task(void *c, int t, int th) {
    const range_par *rp = c;
    (void)th;
    const int a = t * rp->per, b = a + rp->per < rp->n ? a + rp->per : rp->n;
    rp->fn(rp->ctx, a, b);
}

static void par_ranges(kaon_backend *be_, int n, int nt, void (*fn)(void *, int, int), void *ctx) {
    range_par rp = {.fn = fn, .ctx = ctx, .n = n};
    const int tasks = kaon_cpu_tasks(n, nt, 1, &rp.per);
    kaon_pool_run(((kaon_cpu_backend *)be_)->pool, tasks, nt, range_task, &rp);
}

static void norm_range(void *c, int t0, int t1) { norm_rows(c, t0, t1); }

static void cpu_rmsnorm(kaon_backend *be_, void *x_, const void *add_, const kaon_tensor *w,
                        float eps, int n, int dim, void *out_) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (n <= 0 || dim <= 0) return;
    if (!x_ || !out_ || !w || !w->data || kaon_tensor_numel(w) != dim ||
        (w->dtype != KAON_F32 && w->dtype != KAON_F16 && w->dtype != KAON_BF16)) {
        kaon_set_error("cpu rmsnorm: bad arguments (weight must be F32/F16/BF16 [%d])", dim);
        return;
    }
    norm_job j = {.k = be->k, .x = x_, .add = add_, .out = out_, .w = w, .eps = eps, .dim = dim};
    // Three passes over each row (add, sum of squares, scale): worth ~16 int8 MACs an element.
    const int nt = kaon_cpu_threads_for(be_, 16.0 * n * dim);
    if (nt == 1) {
        norm_rows(&j, 0, n);
        return;
    }
    par_ranges(be_, n, nt, norm_range, &j);
}

// cos/sin of every (token, frequency) pair, cached while positions and frequencies repeat.
static const float *rope_table(kaon_cpu_backend *be, int n, const int32_t *pos, int half,
                               const float *inv_freq) {
    if (be->rope_valid && be->rope_n == n && be->rope_half == half &&
        memcmp(be->rope_pos, pos, (size_t)n * sizeof *pos) == 0 &&
        memcmp(be->rope_freq, inv_freq, (size_t)half * sizeof *inv_freq) == 0)
        return be->rope_cs;
    be->rope_valid = 0;
    const size_t need_cs = (size_t)n * half * 2;
    if ((size_t)n > be->rope_cap_tok || need_cs > be->rope_cap_cs || (size_t)half > be->rope_cap_half) {
        const size_t cap_t = (size_t)n > be->rope_cap_tok ? (size_t)n : be->rope_cap_tok;
        const size_t cap_cs = need_cs > be->rope_cap_cs ? need_cs : be->rope_cap_cs;
        const size_t cap_h = (size_t)half > be->rope_cap_half ? (size_t)half : be->rope_cap_half;
        float *cs = malloc(cap_cs * sizeof(float)), *f = malloc(cap_h * sizeof(float));
        int32_t *p = malloc(cap_t * sizeof(int32_t));
        if (!cs || !p || !f) {
            free(cs);
            free(p);
            free(f);
            kaon_set_error("cpu rope: out of memory");
            return NULL;
        }
        free(be->rope_cs);
        free(be->rope_pos);
        free(be->rope_freq);
        be->rope_cs = cs;
        be->rope_pos = p;
        be->rope_freq = f;
        be->rope_cap_tok = cap_t;
        be->rope_cap_cs = cap_cs;
        be->rope_cap_half = cap_h;
    }
    for (int t = 0; t < n; t++) {
        float *cs = be->rope_cs + (size_t)t * half * 2;
        for (int j = 0; j < half; j++) {
            // The angle is a float product, as in the reference implementations; its cosine
            // and sine are then computed accurately.
            const float theta = (float)pos[t] * inv_freq[j];
            cs[2 * j] = (float)cos((double)theta);
            cs[2 * j + 1] = (float)sin((double)theta);
        }
    }
    memcpy(be->rope_pos, pos, (size_t)n * sizeof *pos);
    memcpy(be->rope_freq, inv_freq, (size_t)half * sizeof *inv_freq);
    be->rope_n = n;
    be->rope_half = half;
    be->rope_valid = 1;
    return be->rope_cs;
}

typedef struct rope_job {
    float *x;
    const float *tab;
    int n_heads, head_dim, half, inter;
} rope_job;

static void rope_rows(const rope_job *j, int t0, int t1) {
    const int half = j->half;
    for (int t = t0; t < t1; t++) {
        const float *cs = j->tab + (size_t)t * half * 2;
        for (int h = 0; h < j->n_heads; h++) {
            float *v = j->x + ((size_t)t * j->n_heads + h) * j->head_dim;
            if (j->inter) {
                for (int i = 0; i < half; i++) {
                    const float a = v[2 * i], b = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
                    v[2 * i] = a * c - b * s;
                    v[2 * i + 1] = a * s + b * c;
                }
            } else {
                for (int i = 0; i < half; i++) {
                    const float a = v[i], b = v[i + half], c = cs[2 * i], s = cs[2 * i + 1];
                    v[i] = a * c - b * s;
                    v[i + half] = a * s + b * c;
                }
            }
        }
    }
}

static void rope_range(void *c, int t0, int t1) { rope_rows(c, t0, t1); }

static void cpu_rope(kaon_backend *be_, void *x_, int n, int n_heads, int head_dim,
                     const int32_t *positions, const kaon_rope *rope) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (n <= 0) return;
    if (!x_ || !positions || !rope || !rope->inv_freq || n_heads <= 0 || head_dim <= 0 ||
        rope->rot_dim <= 0 || rope->rot_dim > head_dim || rope->rot_dim % 2) {
        kaon_set_error("cpu rope: bad arguments (rot_dim %d, head_dim %d)", rope ? rope->rot_dim : -1,
                       head_dim);
        return;
    }
    const int half = rope->rot_dim / 2;
    const float *tab = rope_table(be, n, positions, half, rope->inv_freq);
    if (!tab) return;
    rope_job j = {.x = x_, .tab = tab, .n_heads = n_heads, .head_dim = head_dim, .half = half,
                  .inter = rope->interleaved};
    const int nt = kaon_cpu_threads_for(be_, 4.0 * n * n_heads * half);
    if (nt == 1) {
        rope_rows(&j, 0, n);
        return;
    }
    par_ranges(be_, n, nt, rope_range, &j);
}

// out = act(gate) * up with one of the kernel table's gated activations (silu_mul,
// gelu_tanh_mul).                               gate, up, out [n, dim]
typedef void (*gated_fn)(const float *g, const float *u, float *out, int n);

typedef struct gated_job {
    gated_fn fn;
    const float *gate, *up;
    float *out;
    int dim;
} gated_job;

static void gated_range(void *c, int t0, int t1) {
    const gated_job *g = c;
    for (int t = t0; t < t1; t++) {
        const size_t o = (size_t)t * g->dim;
        g->fn(g->gate + o, g->up + o, g->out + o, g->dim);
    }
}

static void gated_and_mul(kaon_backend *be_, gated_fn fn, const char *what, const void *gate,
                          const void *up, int n, int dim, void *out) {
    if (n <= 0 || dim <= 0) return;
    if (!gate || !up || !out) {
        kaon_set_error("cpu %s: bad arguments", what);
        return;
    }
    const size_t total = (size_t)n * dim;
    const int nt = kaon_cpu_threads_for(be_, 16.0 * (double)total);
    if (nt == 1) {
        // One call over the whole contiguous [n, dim] array.
        size_t done = 0;
        while (done < total) {
            size_t c = total - done > (size_t)1 << 30 ? (size_t)1 << 30 : total - done;
            fn((const float *)gate + done, (const float *)up + done, (float *)out + done, (int)c);
            done += c;
        }
        return;
    }
    gated_job g = {.fn = fn, .gate = gate, .up = up, .out = out, .dim = dim};
    par_ranges(be_, n, nt, gated_range, &g);
}

static void cpu_silu_and_mul(kaon_backend *be, const void *gate, const void *up, int n, int dim,
                             void *out) {
    gated_and_mul(be, ((kaon_cpu_backend *)be)->k->silu_mul, "silu_and_mul", gate, up, n, dim, out);
}

static void cpu_gelu_tanh_and_mul(kaon_backend *be, const void *gate, const void *up, int n,
                                  int dim, void *out) {
    gated_and_mul(be, ((kaon_cpu_backend *)be)->k->gelu_tanh_mul, "gelu_tanh_and_mul", gate, up, n,
                  dim, out);
}

static void cpu_logit_softcap(kaon_backend *be, float *x, size_t n, float cap) {
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

// An elementwise op over n floats, in spans of `per`.
typedef struct span_job {
    float *x;
    const float *src;
    size_t n, per;
    float s;
} span_job;

static void scale_task(void *c, int t, int th) {
    const span_job *j = c;
    (void)th;
    const size_t a = (size_t)t * j->per, e = a + j->per < j->n ? a + j->per : j->n;
    for (size_t i = a; i < e; i++) j->x[i] *= j->s;
}

static void copy_task(void *c, int t, int th) {
    const span_job *j = c;
    (void)th;
    const size_t a = (size_t)t * j->per, e = a + j->per < j->n ? a + j->per : j->n;
    if (e > a) memcpy(j->x + a, j->src + a, (e - a) * sizeof(float));
}

static void cpu_scale(kaon_backend *be, void *x_, size_t n, float s) {
    if (!n) return;
    if (!x_) {
        kaon_set_error("cpu scale: bad arguments");
        return;
    }
    float *x = x_;
    const int nt = kaon_cpu_threads_for(be, 4.0 * (double)n);
    if (nt == 1) {
        for (size_t i = 0; i < n; i++) x[i] *= s;
        return;
    }
    span_job sj = {.x = x, .n = n, .s = s, .per = ((n + 4 * (size_t)nt - 1) / (4 * (size_t)nt) + 15) & ~(size_t)15};
    kaon_pool_run(((kaon_cpu_backend *)be)->pool, (int)((n + sj.per - 1) / sj.per), nt, scale_task, &sj);
}

static void cpu_to_host_f32(kaon_backend *be, const void *x, size_t n, float *out) {
    if (!n || !x || !out || x == out) return;
    // Many logit rows (a batched step): the copy is memory-bound, two cores move more.
    const int nt = n >= ((size_t)1 << 20) && be->n_threads > 1 ? 2 : 1;
    if (nt == 1) {
        memcpy(out, x, n * sizeof(float));
        return;
    }
    span_job sj = {.x = out, .src = x, .n = n, .per = (n / 2 + 15) & ~(size_t)15};
    kaon_pool_run(((kaon_cpu_backend *)be)->pool, 2, nt, copy_task, &sj);
}

static void cpu_destroy(kaon_backend *be_) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (!be) return;
    kaon_pool_destroy(be->pool);
    free(be->scratch);
    free(be->moe_scratch);
    free(be->head_scratch);
    free(be->rope_cs);
    free(be->rope_pos);
    free(be->rope_freq);
    free(be);
}

static const kaon_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .act_elem_bytes = sizeof(float),
    .embed = cpu_embed,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .linear = kaon_cpu_linear,
    .rope = cpu_rope,
    .kv_write = kaon_cpu_kv_write,
    .attention = kaon_cpu_attention,
    .attention_sinks = kaon_cpu_attention_sinks,
    .mla_attention = kaon_cpu_mla_attention,
    .mla_expanded_prefill = true,
    .kv_fp8 = true,
    .kv_fp8_mla = true,
    .head_linear = kaon_cpu_head_linear,
    .copy_strided = kaon_cpu_copy_strided,
    .silu_and_mul = cpu_silu_and_mul,
    .gelu_tanh_and_mul = cpu_gelu_tanh_and_mul,
    .scale = cpu_scale,
    .logit_softcap = cpu_logit_softcap,
    .to_host_f32 = cpu_to_host_f32,
    .destroy = cpu_destroy,
    .linear_multi = kaon_cpu_linear_multi,
    .linear_silu_mul = kaon_cpu_linear_silu_mul,
    .moe = kaon_cpu_moe,
    .status = cpu_status,
};

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

// CPU features from cpuid, and whether the OS saves the wider registers (xgetbv).
// (__builtin_cpu_supports cannot ask for f16c on every compiler we support.)
static void x86_features(int *avx2, int *vnni) {
    unsigned a, b, c, d;
    *avx2 = *vnni = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1,
              f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    if ((xlo & 0x6) != 0x6) return;  // XMM and YMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    *avx2 = ((b >> 5) & 1) && fma && f16c;
    const int avx512 = ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);  // F, BW, VL
    *vnni = *avx2 && avx512 && ((c >> 11) & 1) && (xlo & 0xE6) == 0xE6;       // + opmask/ZMM
}
#endif

static const kaon_cpu_kernels *pick_kernels(void) {
    if (env_on("KAON_CPU_NO_SIMD")) return kaon_cpu_kernels_scalar();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    int avx2, vnni;
    x86_features(&avx2, &vnni);
    if (vnni && !env_on("KAON_CPU_NO_AVX512") && kaon_cpu_kernels_vnni()) return kaon_cpu_kernels_vnni();
    if (avx2 && kaon_cpu_kernels_avx2()) return kaon_cpu_kernels_avx2();
#endif
    return kaon_cpu_kernels_scalar();
}

kaon_backend *kaon_backend_cpu_create(int n_threads) {
    kaon_cpu_backend *be = calloc(1, sizeof *be);
    if (!be) {
        kaon_set_error("cpu backend: out of memory");
        return NULL;
    }
    // More threads than usable processors would only take turns on them.
    const int nproc = kaon_usable_cpus();
    if (n_threads <= 0 || n_threads > nproc) n_threads = nproc;
    if (n_threads > KAON_POOL_MAX_THREADS) n_threads = KAON_POOL_MAX_THREADS;
    be->pool = kaon_pool_create(n_threads);
    if (!be->pool) {
        free(be);
        return NULL;
    }
    be->base.ops = &cpu_ops;
    be->base.n_threads = n_threads;
    be->k = pick_kernels();
    return &be->base;
}

const char *kaon_cpu_kernel_name(const kaon_backend *be) {
    if (!be || be->ops != &cpu_ops) return NULL;
    return ((const kaon_cpu_backend *)be)->k->name;
}

struct kaon_pool *kaon_cpu_pool(const kaon_backend *be) {
    if (!be || be->ops != &cpu_ops) return NULL;
    return ((const kaon_cpu_backend *)be)->pool;
}
