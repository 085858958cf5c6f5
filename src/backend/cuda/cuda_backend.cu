// The CUDA backend's op table: device memory, weight upload (and dummy weights), the step's
// index arrays, whole-step CUDA graphs, and thin wrappers that check arguments and call the
// launchers of cuda_kernels.cu, cuda_attention.cu and cuda_linear.cu.
//
// Every op is asynchronous on the backend's own stream; errors of a launch or a copy are
// kept (the first one) and reported by status(), which the runner calls once per step after
// the logits have come back (the one synchronisation of a step).
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_attention_runs.cuh"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "util/log.h"
}

// ---- errors -----------------------------------------------------------------------------

int kc_fail(kc_backend *b, const char *fmt, ...) {
    if (!b->err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->errmsg, sizeof b->errmsg, fmt, ap);
        va_end(ap);
        b->err = 1;
    }
    kaon_set_error("%s", b->errmsg);
    return -1;
}

int kc_check(kc_backend *b, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    return kc_fail(b, "cuda: %s: %s", what, cudaGetErrorString(e));
}

int kc_launched(kc_backend *b, const char *what) { return kc_check(b, cudaGetLastError(), what); }

// ---- graphs -----------------------------------------------------------------------------

static void graphs_reset(kc_backend *b) {
    for (int i = 0; i < KC_MAX_GRAPHS; i++) {
        if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
        memset(&b->graphs[i], 0, sizeof b->graphs[i]);
    }
}

// A step's ops are recorded the second time its key is seen (the first eager run has grown
// every scratch buffer and chosen every cuBLAS algorithm) and replayed from then on.
static int cuda_graph_begin(kaon_backend *be, uint64_t key) {
    kc_backend *b = kc(be);
    b->in_graph_step = 1;
    b->cur_graph = -1;
    b->graph_steps++;
    if (b->graphs_disabled || b->err || b->capturing) return 0;
    int idx = -1;
    for (int i = 0; i < KC_MAX_GRAPHS; i++)
        if (b->graphs[i].seen && b->graphs[i].key == key) idx = i;
    if (idx >= 0 && b->graphs[idx].exec) {
        b->graphs[idx].last_use = ++b->tick;
        if (kc_check(b, cudaGraphLaunch(b->graphs[idx].exec, b->stream), "graph launch")) return -1;
        b->graph_replays++;
        return 1;
    }
    if (idx < 0) {
        for (int i = 0; i < KC_MAX_GRAPHS && idx < 0; i++)
            if (!b->graphs[i].seen) idx = i;
        if (idx < 0) {
            idx = 0;
            for (int i = 1; i < KC_MAX_GRAPHS; i++)
                if (b->graphs[i].last_use < b->graphs[idx].last_use) idx = i;
        }
        kc_graph *g = &b->graphs[idx];
        if (g->exec) cudaGraphExecDestroy(g->exec);
        memset(g, 0, sizeof *g);
        g->key = key;
    }
    kc_graph *g = &b->graphs[idx];
    g->last_use = ++b->tick;
    if (g->seen < 0) return 0;  // recording failed once: stay eager
    if (++g->seen < 2) return 0;
    if (kc_check(b, cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal),
                 "begin graph capture"))
        return -1;
    b->capturing = 1;
    b->cur_graph = idx;
    b->graph_recordings++;
    return 2;
}

static int cuda_graph_end(kaon_backend *be) {
    kc_backend *b = kc(be);
    b->in_graph_step = 0;
    if (!b->capturing) return 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(b->stream, &graph);
    b->capturing = 0;
    kc_graph *g = &b->graphs[b->cur_graph];
    b->cur_graph = -1;
    if (e != cudaSuccess || b->err || !graph) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        g->seen = INT_MIN / 2;
        // The recorded ops did not run: the step has no result.
        return kc_fail(b, "cuda: recording the step's graph failed (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : b->errmsg);
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (kc_check(b, e, "graph instantiate")) {
        g->seen = INT_MIN / 2;
        return -1;
    }
    g->exec = exec;
    return kc_check(b, cudaGraphLaunch(exec, b->stream), "graph launch");
}

// ---- memory -------------------------------------------------------------------------------

static void *cuda_alloc(kaon_backend *be, size_t bytes) {
    kc_backend *b = kc(be);
    if (b->capturing) {
        kc_fail(b, "cuda: alloc while recording a graph");
        return NULL;
    }
    if (b->n_allocs == b->cap_allocs) {
        int cap = b->cap_allocs ? 2 * b->cap_allocs : 64;
        kc_alloc_rec *r = (kc_alloc_rec *)realloc(b->allocs, sizeof *r * (size_t)cap);
        if (!r) {
            kaon_set_error("cuda: out of host memory");
            return NULL;
        }
        b->allocs = r;
        b->cap_allocs = cap;
    }
    void *p = NULL;
    const size_t sz = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    cudaError_t e = cudaMalloc(&p, sz);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        kaon_set_error("cuda: out of device memory for %zu bytes (%.2f of %.2f GiB free)", bytes,
                       fr / 1073741824.0, tot / 1073741824.0);
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, sz, b->stream) != cudaSuccess) {
        cudaFree(p);
        kaon_set_error("cuda: memset failed");
        return NULL;
    }
    b->allocs[b->n_allocs].p = p;
    b->allocs[b->n_allocs].bytes = sz;
    b->n_allocs++;
    b->bytes_alloc += sz;
    return p;
}

static void cuda_free(kaon_backend *be, void *p) {
    kc_backend *b = kc(be);
    if (!p) return;
    cudaStreamSynchronize(b->stream);
    graphs_reset(b);  // recorded graphs may name this buffer
    for (int i = 0; i < b->n_allocs; i++)
        if (b->allocs[i].p == p) {
            b->bytes_alloc -= b->allocs[i].bytes;
            b->allocs[i] = b->allocs[--b->n_allocs];
            break;
        }
    cudaFree(p);
}

static size_t alloc_size(const kc_backend *b, const void *p) {
    for (int i = 0; i < b->n_allocs; i++)
        if (b->allocs[i].p == p) return b->allocs[i].bytes;
    return 0;
}

int kc_grow(kc_backend *b, void **p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return 0;
    if (b->capturing) return kc_fail(b, "cuda: %s must grow while recording a graph", what);
    size_t ncap = need + need / 2 + 64;
    void *np = NULL;
    if (kc_check(b, cudaMalloc(&np, ncap * elem), what)) return -1;
    if (kc_check(b, cudaMemsetAsync(np, 0, ncap * elem, b->stream), what)) {
        cudaFree(np);
        return -1;
    }
    if (*p) {
        cudaStreamSynchronize(b->stream);
        cudaFree(*p);
    }
    graphs_reset(b);
    *p = np;
    *cap = ncap;
    return 0;
}

// ---- index arrays --------------------------------------------------------------------------

static size_t al4(size_t n) { return (n + 3) & ~(size_t)3; }

// An empty kernel at the start of every step, for kernel traces only (KAON_TRACE_MARK=1;
// tests/gpu/trace_decode.sh): tests/gpu/trace_table.py splits steps at it, where counting the
// sampling kernels miscounts batched steps. Its grid is the step's token count (at most 65,535),
// so that the table can pick the steps of one size (a batch's decode-only steps).
__global__ void k_step_mark(void) {}

static int cuda_begin_step(kaon_backend *be, const int32_t *tokens, const kaon_attn_meta *m,
                           const int32_t *rows, int n_rows) {
    kc_backend *b = kc(be);
    if (b->capturing) return kc_fail(b, "cuda: begin_step while recording a graph");
    const int T = m ? m->n_tokens : 0, S = m ? m->n_seqs : 0, MB = m ? m->max_blocks : 0;
    if (T < 0 || S < 0 || MB < 0 || n_rows < 0) return kc_fail(b, "cuda: bad step sizes");
    static const bool mark = kc_env_on("KAON_TRACE_MARK");
    if (mark) k_step_mark<<<T < 1 ? 1 : T > 65535 ? 65535 : T, 1, 0, b->stream>>>();
    const size_t tab = (size_t)S * (size_t)MB;
    const size_t o_pos = al4((size_t)T), o_seq = o_pos + al4((size_t)T);
    const size_t o_slot = o_seq + al4((size_t)T), o_rows = o_slot + al4((size_t)T);
    const size_t o_tab = o_rows + al4((size_t)n_rows), o_rest = o_tab + al4(tab), total = o_rest + al4((size_t)T);
    if (total > b->meta_cap) {
        size_t cap = total + total / 2 + 1024;
        cudaStreamSynchronize(b->stream);
        if (b->meta_dev) cudaFree(b->meta_dev);
        if (b->meta_host) cudaFreeHost(b->meta_host);
        b->meta_dev = b->meta_host = NULL;
        b->meta_cap = 0;
        graphs_reset(b);
        if (kc_check(b, cudaMalloc(&b->meta_dev, cap * 4), "step metadata") ||
            kc_check(b, cudaMallocHost(&b->meta_host, cap * 4), "step metadata (pinned)"))
            return -1;
        b->meta_cap = cap;
    }
    // The previous step's copy must have left the staging before it is rewritten.
    if (kc_check(b, cudaEventSynchronize(b->meta_done), "step metadata")) return -1;
    int32_t *h = b->meta_host;
    if (tokens && T) memcpy(h, tokens, sizeof(int32_t) * (size_t)T);
    if (m && m->positions && T) memcpy(h + o_pos, m->positions, sizeof(int32_t) * (size_t)T);
    if (m && m->token_seq && T) memcpy(h + o_seq, m->token_seq, sizeof(int32_t) * (size_t)T);
    if (m && m->slot_mapping && T) memcpy(h + o_slot, m->slot_mapping, sizeof(int32_t) * (size_t)T);
    if (rows && n_rows) memcpy(h + o_rows, rows, sizeof(int32_t) * (size_t)n_rows);
    if (m && m->block_tables && tab) memcpy(h + o_tab, m->block_tables, sizeof(int32_t) * tab);
    // The tokens outside prefill runs, for the decode kernel of a step with runs (cuda_attention.cu).
    b->n_rest = -1;
    if (m && m->positions && m->token_seq && m->block_tables && T - S >= FA_MIN_RUN - 1 && MB > 0 &&
        m->block_size > 0) {
        int n = 0;
        for (int t = 0; t < T; t++)
            if (!fa_tok_ok(m->positions, m->token_seq, t, S, MB, m->block_size) ||
                !fa_in_run(m->positions, m->token_seq, T, t, S, MB, m->block_size))
                h[o_rest + n++] = t;
        b->n_rest = n;
    }
    if (kc_check(b, cudaMemcpyAsync(b->meta_dev, h, total * 4, cudaMemcpyHostToDevice, b->stream),
                 "step metadata copy") ||
        kc_check(b, cudaEventRecord(b->meta_done, b->stream), "step metadata"))
        return -1;
    b->h_tokens = tokens;
    b->h_pos = m ? m->positions : NULL;
    b->h_seq = m ? m->token_seq : NULL;
    b->h_slot = m ? m->slot_mapping : NULL;
    b->h_tables = m ? m->block_tables : NULL;
    b->h_rows = rows;
    b->d_tokens = b->meta_dev;
    b->d_pos = b->meta_dev + o_pos;
    b->d_seq = b->meta_dev + o_seq;
    b->d_slot = b->meta_dev + o_slot;
    b->d_rows = b->meta_dev + o_rows;
    b->d_tables = b->meta_dev + o_tab;
    b->d_rest = b->meta_dev + o_rest;
    b->m_tokens = T;
    b->m_seqs = S;
    b->m_max_blocks = MB;
    b->m_rows = n_rows;
    b->loose_used = 0;
    return 0;
}

const int32_t *kc_dev_i32(kc_backend *b, const int32_t *h, size_t n) {
    if (!h) {
        kc_fail(b, "cuda: missing index array");
        return NULL;
    }
    const struct {
        const int32_t *h;
        int32_t *d;
        size_t n;
    } known[6] = {
        {b->h_tokens, b->d_tokens, (size_t)b->m_tokens},
        {b->h_pos, b->d_pos, (size_t)b->m_tokens},
        {b->h_seq, b->d_seq, (size_t)b->m_tokens},
        {b->h_slot, b->d_slot, (size_t)b->m_tokens},
        {b->h_tables, b->d_tables, (size_t)b->m_seqs * (size_t)b->m_max_blocks},
        {b->h_rows, b->d_rows, (size_t)b->m_rows},
    };
    for (int i = 0; i < 6; i++)
        if (known[i].h == h && n <= known[i].n) return known[i].d;
    if (b->capturing) {
        kc_fail(b, "cuda: an index array that begin_step did not see, while recording a graph");
        return NULL;
    }
    // A loose copy; the ring's reuse is ordered after earlier readers by the stream.
    const size_t need = al4(n ? n : 1);
    if (b->loose_used + need > b->loose_cap) {
        if (need > b->loose_cap) {
            size_t cap = need * 4 > 65536 ? need * 4 : 65536;
            cudaStreamSynchronize(b->stream);
            if (b->loose_dev) cudaFree(b->loose_dev);
            b->loose_dev = NULL;
            b->loose_cap = 0;
            if (kc_check(b, cudaMalloc(&b->loose_dev, cap * 4), "index copy")) return NULL;
            b->loose_cap = cap;
        }
        b->loose_used = 0;
    }
    int32_t *d = b->loose_dev + b->loose_used;
    b->loose_used += need;
    if (n && kc_check(b, cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, b->stream), "index copy"))
        return NULL;
    return d;
}

// ---- weights ------------------------------------------------------------------------------

static int weight_dims(kc_backend *b, const kaon_tensor *t, int64_t *rows, int64_t *cols) {
    if (!t || t->ndim < 1 || t->ndim > 2) return kc_fail(b, "cuda upload: weights are vectors or matrices");
    *cols = t->shape[t->ndim - 1];
    *rows = t->ndim == 2 ? t->shape[0] : 1;
    if (*rows <= 0 || *cols <= 0 || *rows > INT32_MAX || *cols > INT32_MAX ||
        (uint64_t)*rows * (uint64_t)*cols > ((uint64_t)1 << 40))
        return kc_fail(b, "cuda upload: bad shape");
    return 0;
}

static int upload(kaon_backend *be, const kaon_tensor *host, kaon_tensor *dev, int keep_quantized) {
    kc_backend *b = kc(be);
    if (keep_quantized) {  // quantized GGUF matrices stay quantized (cuda_quant.cu)
        const int q = kc_quant_upload(b, host, dev);
        if (q != 1) return q;
    }
    int64_t rows = 0, cols = 0;
    if (weight_dims(b, host, &rows, &cols)) return -1;
    if (!host->data) return kc_fail(b, "cuda upload: no data");
    const size_t rb = kaon_dtype_row_bytes(host->dtype, cols);
    if (rb == 0) return kc_fail(b, "cuda upload: %s rows of %lld are not supported",
                                kaon_dtype_name(host->dtype), (long long)cols);
    const size_t src_bytes = rb * (size_t)rows;
    if (host->nbytes && host->nbytes < src_bytes) return kc_fail(b, "cuda upload: tensor data is short");
    const int f32 = host->ndim == 1;  // vectors (norms, biases) are kept in f32
    const size_t n = (size_t)rows * (size_t)cols, dst_bytes = n * (f32 ? 4 : 2);
    void *dst = cuda_alloc(be, dst_bytes);
    if (!dst) return kc_fail(b, "%s", kaon_last_error());
    if (!f32 && host->dtype == KAON_BF16) {
        if (kc_check(b, cudaMemcpyAsync(dst, host->data, src_bytes, cudaMemcpyHostToDevice, b->stream), "upload"))
            goto fail;
    } else {
        void *tmp = NULL;
        if (kc_check(b, cudaMalloc(&tmp, src_bytes), "upload staging")) goto fail;
        int rc = kc_check(b, cudaMemcpyAsync(tmp, host->data, src_bytes, cudaMemcpyHostToDevice, b->stream), "upload");
        if (!rc) rc = kc_convert(b, host->dtype, tmp, rows, cols, dst, f32);
        cudaStreamSynchronize(b->stream);
        cudaFree(tmp);
        if (rc) goto fail;
    }
    if (kc_check(b, cudaStreamSynchronize(b->stream), "upload")) goto fail;
    memset(dev, 0, sizeof *dev);
    dev->dtype = f32 ? KAON_F32 : KAON_BF16;
    dev->ndim = host->ndim;
    memcpy(dev->shape, host->shape, sizeof dev->shape);
    dev->data = dst;
    dev->nbytes = dst_bytes;
    b->bytes_weights += dst_bytes;
    return 0;
fail:
    cuda_free(be, dst);
    return -1;
}

static int cuda_upload(kaon_backend *be, const kaon_tensor *host, kaon_tensor *dev) {
    return upload(be, host, dev, 1);
}

static int cuda_upload_dense(kaon_backend *be, const kaon_tensor *host, kaon_tensor *dev) {
    return upload(be, host, dev, 0);
}

// What upload / upload_dense will allocate for host: quantized blocks kept as they are, other
// matrices in bf16, vectors in f32.
static size_t cuda_weight_bytes(kaon_backend *be, const kaon_tensor *host, bool dense) {
    if (host->dtype == KAON_FP8_E4M3) return kc_fp8_bytes(host);
    if (host->dtype == KAON_I4) return kc_int4_bytes(host);
    if (host->dtype == KAON_F32 && host->ndim == 2) return (size_t)kaon_tensor_numel(host) * 4;  // scales
    const size_t q = dense ? 0 : kc_quant_bytes(kc(be), host);
    if (q) return q;
    return (size_t)kaon_tensor_numel(host) * (host->ndim == 1 ? 4 : 2);
}

static int cuda_fill_dummy(kaon_backend *be, const kaon_tensor *like, const kaon_dummy_origin *origin,
                           uint64_t seed, float scale, float offset, kaon_tensor *dev) {
    kc_backend *b = kc(be);
    int64_t rows = 0, cols = 0;
    if (weight_dims(b, like, &rows, &cols)) return -1;
    if (origin && (origin->dim < 0 || origin->dim >= like->ndim || origin->lo < 0 ||
                   origin->lo + like->shape[origin->dim] > origin->full))
        return kc_fail(b, "cuda fill: a part [%lld, %lld) of dimension %d outside its whole (%lld)",
                       (long long)origin->lo, (long long)(origin->lo + like->shape[origin->dim]), origin->dim,
                       (long long)origin->full);
    const int f32 = like->ndim == 1;
    const size_t n = (size_t)rows * (size_t)cols, dst_bytes = n * (f32 ? 4 : 2);
    void *dst = cuda_alloc(be, dst_bytes);
    if (!dst) return kc_fail(b, "%s", kaon_last_error());
    kc_fill_uniform(b, dst, f32, n, kc_fill_place(like->ndim, cols, origin), seed, scale, offset);
    if (b->err) {
        cuda_free(be, dst);
        return -1;
    }
    memset(dev, 0, sizeof *dev);
    dev->dtype = f32 ? KAON_F32 : KAON_BF16;
    dev->ndim = like->ndim;
    memcpy(dev->shape, like->shape, sizeof dev->shape);
    dev->data = dst;
    dev->nbytes = dst_bytes;
    b->bytes_weights += dst_bytes;
    return 0;
}

static int cuda_upload_linear(kaon_backend *be, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev) {
    kc_backend *b = kc(be);
    if (kaon_linear_is_fp8_block(host)) return kc_fp8_upload(b, host, dummy, seed, dev);
    if (kaon_linear_is_int4(host)) return kc_int4_upload(b, host, dummy, seed, dev);
    return kc_fail(b, "cuda upload: weight format %s with %s is not supported", kaon_dtype_name(host->w.dtype),
                   kaon_linear_unsupported(host));
}

static void cuda_release(kaon_backend *be, kaon_tensor *dev) {
    kc_backend *b = kc(be);
    if (!dev || !dev->data) return;
    b->bytes_weights -= dev->nbytes < b->bytes_weights ? dev->nbytes : b->bytes_weights;
    cuda_free(be, dev->data);
    dev->data = NULL;
}

// ---- argument checks -------------------------------------------------------------------------

static bool is_matrix(kc_backend *b, const kaon_tensor *w, const char *what) {
    if (!w || !w->data || w->ndim != 2 || w->dtype != KAON_BF16 || w->shape[0] <= 0 ||
        w->shape[1] <= 0 || w->shape[0] > INT32_MAX || w->shape[1] > INT32_MAX) {
        kc_fail(b, "cuda %s: the weight must be an uploaded bf16 matrix (got %s)", what,
                w ? kaon_dtype_name(w->dtype) : "none");
        return false;
    }
    return true;
}

static bool is_vector(kc_backend *b, const kaon_tensor *v, int64_t n, const char *what) {
    if (!v || !v->data || v->dtype != KAON_F32 || kaon_tensor_numel(v) != n) {
        kc_fail(b, "cuda %s: expected an uploaded f32 vector of %lld", what, (long long)n);
        return false;
    }
    return true;
}

// A layer the kernels here compute: its weight and bias alone (no format companions).
static bool is_plain(kc_backend *b, const kaon_linear *l, const char *what) {
    if (!l) {
        kc_fail(b, "cuda %s: missing weight", what);
        return false;
    }
    const char *unsupported = kaon_linear_unsupported(l);
    if (unsupported) {
        kc_fail(b, "cuda %s: weight format %s with %s is not supported", what, kaon_dtype_name(l->w.dtype),
                unsupported);
        return false;
    }
    return true;
}

// Points d_inv_freq at the device copy of r's frequencies, uploading them the first time
// they are seen (outside graph recording). Tables are kept, never rewritten: kernels in
// flight and recorded graphs may still read any of them.
static int rope_sync(kc_backend *b, const kaon_rope *r, int hd) {
    if (!r || !r->inv_freq || r->rot_dim <= 0 || r->rot_dim % 2 || r->rot_dim > hd || r->rot_dim / 2 > 512)
        return kc_fail(b, "cuda rope: bad arguments (rot_dim %d, head_dim %d)", r ? r->rot_dim : -1, hd);
    const int half = r->rot_dim / 2;
    const size_t bytes = sizeof(float) * (size_t)half;
    for (int i = 0; i < b->n_rope; i++)
        if (b->rope_half[i] == half && !memcmp(b->rope_host[i], r->inv_freq, bytes)) {
            b->d_inv_freq = b->rope_dev[i];
            return 0;
        }
    if (b->capturing) return kc_fail(b, "cuda rope: new frequencies while recording a graph");
    if (b->n_rope == KC_ROPE_TABLES)
        return kc_fail(b, "cuda rope: more than %d different frequency tables", KC_ROPE_TABLES);
    const int i = b->n_rope;
    if (kc_check(b, cudaMalloc(&b->rope_dev[i], sizeof(float) * 512), "rope")) return -1;
    memcpy(b->rope_host[i], r->inv_freq, bytes);
    b->rope_half[i] = half;
    b->n_rope++;
    b->d_inv_freq = b->rope_dev[i];
    // Stream-ordered; the source (rope_host[i]) is never written again.
    return kc_check(b, cudaMemcpyAsync(b->rope_dev[i], b->rope_host[i], bytes, cudaMemcpyHostToDevice, b->stream),
                    "rope");
}

// ---- ops --------------------------------------------------------------------------------------

static void cuda_embed(kaon_backend *be, const kaon_tensor *table, const int32_t *ids, int n, void *out) {
    kc_backend *b = kc(be);
    if (kc_quant_embed(b, table, ids, n, out) != 1) return;  // quantized table (cuda_quant.cu)
    if (n <= 0 || !is_matrix(b, table, "embed")) return;
    const int32_t *d = kc_dev_i32(b, ids, (size_t)n);
    if (!d) return;
    kc_embed(b, (const bf16 *)table->data, table->shape[0], (int)table->shape[1], d, n, (bf16 *)out);
}

static void cuda_get_rows(kaon_backend *be, const void *x, const int32_t *idx, int n, int dim, void *out) {
    kc_backend *b = kc(be);
    if (n <= 0 || dim <= 0) return;
    const int32_t *d = kc_dev_i32(b, idx, (size_t)n);
    if (!d) return;
    kc_get_rows(b, (const bf16 *)x, d, n, dim, (bf16 *)out);
}

static void rmsnorm_impl(kaon_backend *be, void *x, const void *add, const kaon_tensor *w, float eps,
                         int n, int dim, void *out, bool once) {
    kc_backend *b = kc(be);
    if (n <= 0 || dim <= 0 || !is_vector(b, w, dim, "rmsnorm")) return;
    kc_rmsnorm(b, (bf16 *)x, (const bf16 *)add, (const float *)w->data, eps, n, dim, (bf16 *)out, once);
}

static void cuda_rmsnorm(kaon_backend *be, void *x, const void *add, const kaon_tensor *w, float eps,
                         int n, int dim, void *out) {
    rmsnorm_impl(be, x, add, w, eps, n, dim, out, false);
}

static void cuda_rmsnorm_once(kaon_backend *be, void *x, const void *add, const kaon_tensor *w, float eps,
                              int n, int dim, void *out) {
    rmsnorm_impl(be, x, add, w, eps, n, dim, out, true);
}

// A layer of a format with scale companions (FP8, INT4): its own kernels.
static int scaled_linear(kc_backend *b, const void *x, int n, const kaon_linear *l, void *y, int f32out) {
    if (n <= 0) return 0;
    return l->w.dtype == KAON_FP8_E4M3 ? kc_fp8_linear(b, x, n, l, y, f32out) : kc_int4_linear(b, x, n, l, y, f32out);
}

static void cuda_linear(kaon_backend *be, const void *x, int n, const kaon_linear *l, void *y) {
    kc_backend *b = kc(be);
    if (kc_is_scaled_linear(l)) {
        scaled_linear(b, x, n, l, y, 0);
        return;
    }
    if (!is_plain(b, l, "linear")) return;
    const kaon_tensor *w = &l->w, *bias = kaon_linear_bias(l);
    if (kc_quant_linear(b, x, n, w, bias, y, 0) != 1) return;  // quantized weight (cuda_quant.cu)
    if (n <= 0 || !is_matrix(b, w, "linear")) return;
    if (bias && !is_vector(b, bias, w->shape[0], "linear bias")) return;
    kc_gemm_bf16(b, (const bf16 *)x, n, (const bf16 *)w->data, (int)w->shape[0], (int)w->shape[1],
                 bias ? (const float *)bias->data : NULL, y, 0);
}

static void cuda_linear_f32(kaon_backend *be, const void *x, int n, const kaon_linear *l, float *y) {
    kc_backend *b = kc(be);
    if (kaon_linear_bias(l)) {
        kc_fail(b, "cuda linear_f32: a bias is not supported");
        return;
    }
    if (kc_is_scaled_linear(l)) {
        scaled_linear(b, x, n, l, y, 1);
        return;
    }
    if (!is_plain(b, l, "linear_f32")) return;
    const kaon_tensor *w = &l->w;
    if (kc_quant_linear(b, x, n, w, NULL, y, 1) != 1) return;  // quantized weight (cuda_quant.cu)
    if (n <= 0 || !is_matrix(b, w, "linear_f32")) return;
    kc_gemm_bf16(b, (const bf16 *)x, n, (const bf16 *)w->data, (int)w->shape[0], (int)w->shape[1], NULL, y, 1);
}

static void cuda_rope(kaon_backend *be, void *x, int n, int n_heads, int head_dim,
                      const int32_t *positions, const kaon_rope *rope) {
    kc_backend *b = kc(be);
    if (n <= 0 || n_heads <= 0 || head_dim <= 0) return;
    if (rope_sync(b, rope, head_dim)) return;
    const int32_t *d = kc_dev_i32(b, positions, (size_t)n);
    if (!d) return;
    kc_rope(b, (bf16 *)x, n, n_heads, head_dim, d, rope->rot_dim, rope->interleaved);
}

static int64_t cache_slots(const kc_backend *b, const kaon_kv_layer *kv, int nkv, int hd) {
    const size_t bytes = alloc_size(b, kv->k), vbytes = alloc_size(b, kv->v);
    const size_t row = (size_t)nkv * hd * (kv->dtype == KAON_KV_FP8 ? 1 : sizeof(bf16));
    if (!bytes || !vbytes) return INT64_MAX;  // not from alloc: trust the caller
    return (int64_t)((bytes < vbytes ? bytes : vbytes) / row);
}

static void cuda_kv_write(kaon_backend *be, kaon_kv_layer *kv, const void *k, const void *v,
                          const kaon_attn_meta *m, int nkv, int hd) {
    kc_backend *b = kc(be);
    if (kv && kv->dtype == KAON_KV_FP8) {  // K and V (no MLA: kv_fp8_mla is off)
        if (!kv->k || !kv->v || !v || !m || nkv <= 0 || hd <= 0 || ((int64_t)nkv * hd) % 2) {
            kc_fail(b, "cuda kv_write: bad arguments (fp8 cache)");
            return;
        }
        if (m->n_tokens <= 0) return;
        const int32_t *d = kc_dev_i32(b, m->slot_mapping, (size_t)m->n_tokens);
        if (!d) return;
        kc_kv_write_fp8(b, (uint8_t *)kv->k, (uint8_t *)kv->v, (const bf16 *)k, (const bf16 *)v, d,
                        cache_slots(b, kv, nkv, hd), m->n_tokens, nkv * hd, kv->k_scale, kv->v_scale);
        return;
    }
    if (!v) {  // a cache without V (MLA's latent rows): cuda_mla.cu
        kc_kv_write_k_only(be, kv, k, m, nkv, hd);
        return;
    }
    if (!kv || !kv->k || !kv->v || !m || nkv <= 0 || hd <= 0 || ((int64_t)nkv * hd) % 8) {
        kc_fail(b, "cuda kv_write: bad arguments");
        return;
    }
    if (m->n_tokens <= 0) return;
    const int32_t *d = kc_dev_i32(b, m->slot_mapping, (size_t)m->n_tokens);
    if (!d) return;
    kc_kv_write(b, (bf16 *)kv->k, (bf16 *)kv->v, (const bf16 *)k, (const bf16 *)v, d,
                cache_slots(b, kv, nkv, hd), m->n_tokens, nkv * hd);
}

static void cuda_attention(kaon_backend *be, const void *q, const kaon_kv_layer *kv,
                           const kaon_attn_meta *m, int nh, int nkv, int hd, float scale, int window,
                           void *out) {
    kc_backend *b = kc(be);
    if (!kv || !kv->k || !kv->v || !m || window < 0) {
        kc_fail(b, "cuda attention: bad arguments");
        return;
    }
    if (kv->dtype == KAON_KV_FP8) {
        kc_attention_fp8(b, (const bf16 *)q, (const uint8_t *)kv->k, (const uint8_t *)kv->v, m,
                         cache_slots(b, kv, nkv, hd), nh, nkv, hd, scale, kv->k_scale, kv->v_scale, window,
                         (bf16 *)out);
        return;
    }
    kc_attention(b, (const bf16 *)q, (const bf16 *)kv->k, (const bf16 *)kv->v, m,
                 cache_slots(b, kv, nkv, hd), nh, nkv, hd, scale, window, (bf16 *)out);
}

static void cuda_silu_and_mul(kaon_backend *be, const void *gate, const void *up, int n, int dim,
                              void *out) {
    if (n <= 0 || dim <= 0) return;
    kc_silu_mul(kc(be), (const bf16 *)gate, (const bf16 *)up, (size_t)n * dim, (bf16 *)out);
}

static void cuda_gelu_tanh_and_mul(kaon_backend *be, const void *gate, const void *up, int n, int dim,
                                   void *out) {
    if (n <= 0 || dim <= 0) return;
    kc_gelu_tanh_mul(kc(be), (const bf16 *)gate, (const bf16 *)up, (size_t)n * dim, (bf16 *)out);
}

static void cuda_logit_softcap(kaon_backend *be, float *x, size_t n, float cap) { kc_softcap(kc(be), x, n, cap); }

static void cuda_scale(kaon_backend *be, void *x, size_t n, float s) {
    kc_scale(kc(be), (bf16 *)x, n, s);
}

// Pinned staging of at least bytes (outside graph recording).
static int host_staging(kc_backend *b, size_t bytes) {
    if (bytes <= b->host_out_cap * 2) return 0;
    if (b->host_out) cudaFreeHost(b->host_out);
    b->host_out = NULL;
    b->host_out_cap = 0;
    size_t cap = bytes + bytes / 4 + 64;
    if (kc_check(b, cudaMallocHost(&b->host_out, cap), "pinned host buffer")) return -1;
    b->host_out_cap = cap / 2;  // counted in bf16 elements
    return 0;
}

static void cuda_to_host_f32(kaon_backend *be, const void *x, size_t n, float *out) {
    kc_backend *b = kc(be);
    if (!n) return;
    if (b->capturing) {
        kc_fail(b, "cuda: to_host_f32 while recording a graph");
        return;
    }
    if (host_staging(b, n * 2)) {
        memset(out, 0, n * sizeof(float));
        return;
    }
    if (kc_check(b, cudaMemcpyAsync(b->host_out, x, n * 2, cudaMemcpyDeviceToHost, b->stream), "logits copy") ||
        kc_check(b, cudaStreamSynchronize(b->stream), "step")) {
        memset(out, 0, n * sizeof(float));
        return;
    }
    const uint16_t *h = b->host_out;
    for (size_t i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)h[i] << 16;
        memcpy(&out[i], &bits, 4);
    }
}

static void cuda_copy_f32_to_host(kaon_backend *be, const float *x, size_t n, float *out) {
    kc_backend *b = kc(be);
    if (!n) return;
    if (b->capturing) {
        kc_fail(b, "cuda: copy_f32_to_host while recording a graph");
        return;
    }
    if (host_staging(b, n * sizeof(float)) ||
        kc_check(b, cudaMemcpyAsync(b->host_out, x, n * sizeof(float), cudaMemcpyDeviceToHost, b->stream), "logits copy") ||
        kc_check(b, cudaStreamSynchronize(b->stream), "step")) {
        memset(out, 0, n * sizeof(float));
        return;
    }
    memcpy(out, b->host_out, n * sizeof(float));
}

static int cuda_copy_rows_f32_to_host(kaon_backend *be, const float *x, int n, const int32_t *rows,
                                      int n_rows, float *out) {
    kc_backend *b = kc(be);
    if (n_rows <= 0) return 0;
    if (b->capturing) return kc_fail(b, "cuda: copy_rows_f32_to_host while recording a graph");
    const size_t row_bytes = (size_t)n * sizeof(float);
    if (host_staging(b, row_bytes * n_rows)) return -1;
    char *h = (char *)b->host_out;
    for (int i = 0; i < n_rows; i++)
        if (kc_check(b, cudaMemcpyAsync(h + row_bytes * i, x + (size_t)rows[i] * n, row_bytes,
                                        cudaMemcpyDeviceToHost, b->stream), "logits copy"))
            return -1;
    if (kc_check(b, cudaStreamSynchronize(b->stream), "step")) return -1;
    for (int i = 0; i < n_rows; i++) memcpy(out + (size_t)rows[i] * n, h + row_bytes * i, row_bytes);
    return 0;
}

static int cuda_sample(kaon_backend *be, const float *logits, int vocab, const kaon_sample_batch *sb,
                       int32_t *ids, float *logprobs) {
    return kc_sample(kc(be), (float *)logits, vocab, sb, ids, logprobs);
}

static int cuda_status(kaon_backend *be) {
    kc_backend *b = kc(be);
    if (!b->err) return 0;
    kaon_set_error("%s", b->errmsg);
    b->err = 0;
    return -1;
}

static int cuda_mem_info(kaon_backend *be, size_t *free_b, size_t *total_b) {
    // Several backends may live on one thread (tensor parallelism's ranks): ask this one's device.
    if (kc_check(kc(be), cudaSetDevice(kc(be)->device), "memory info")) return -1;
    return kc_check(kc(be), cudaMemGetInfo(free_b, total_b), "memory info");
}

static void cuda_copy_f32_strided(kaon_backend *be, const float *src, size_t src_stride, float *dst,
                                  size_t dst_stride, int rows, int width) {
    kc_backend *b = kc(be);
    if (rows <= 0 || width <= 0) return;
    kc_check(b, cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float),
                                  (size_t)width * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice, b->stream),
             "copy_f32_strided");
}

extern "C" int kaon_backend_cuda_device(kaon_backend *be, void **stream) {
    if (stream) *stream = (void *)kc(be)->stream;
    return kc(be)->device;
}

extern "C" int kaon_backend_cuda_bind(kaon_backend *be) {
    if (cudaSetDevice(kc(be)->device) != cudaSuccess) {
        cudaGetLastError();
        return kaon_set_error("cuda: cudaSetDevice(%d) failed", kc(be)->device);
    }
    return 0;
}

extern "C" int kaon_backend_cuda_sync(kaon_backend *be) {
    if (kc_check(kc(be), cudaStreamSynchronize(kc(be)->stream), "step")) return -1;
    return cuda_status(be);
}

extern "C" void kaon_backend_cuda_no_graphs(kaon_backend *be) {
    kc(be)->graphs_disabled = true;
    graphs_reset(kc(be));
}

// ---- fused ops ----------------------------------------------------------------------------------

// The GEMV path of linear_multi over plain bf16 weights, with what it may fuse (kc_gemv_fuse).
static int gemv_multi_plain(kc_backend *b, const void *x, int n, int count, const kaon_linear *const *l,
                            void *const *y, const kc_gemv_fuse *fuse) {
    if (n > KC_GEMV_MAX_N) return 1;
    const bf16 *ws[4];
    const float *bs[4];
    void *ys[4];
    int rows[4];
    for (int i = 0; i < count; i++) {
        const kaon_tensor *w = &l[i]->w, *bias = kaon_linear_bias(l[i]);
        if (!is_matrix(b, w, "linear")) return -1;
        if (w->shape[1] != l[0]->w.shape[1]) return 1;
        if (bias && !is_vector(b, bias, w->shape[0], "linear bias")) return -1;
        ws[i] = (const bf16 *)w->data;
        bs[i] = bias ? (const float *)bias->data : NULL;
        ys[i] = y[i];
        rows[i] = (int)w->shape[0];
    }
    return kc_gemv_multi(b, (const bf16 *)x, n, (int)l[0]->w.shape[1], count, ws, rows, bs, ys, 0, fuse);
}

static int cuda_linear_multi(kaon_backend *be, const void *x, int n, int count,
                             const kaon_linear *const *l, void *const *y) {
    kc_backend *b = kc(be);
    if (count < 1 || count > 4) return 1;
    const kaon_tensor *w[4], *bias[4];
    for (int i = 0; i < count; i++)
        if (kc_is_scaled_linear(l[i]))  // INT4 (cuda_int4.cu) or FP8 (cuda_fp8.cu): fused, or 1: one linear each
            return l[0]->w.dtype == KAON_I4 ? kc_int4_linear_multi(b, x, n, count, l, y, NULL)
                                            : kc_fp8_linear_multi(b, x, n, count, l, y, NULL);
    for (int i = 0; i < count; i++) {
        if (!is_plain(b, l[i], "linear_multi")) return -1;
        w[i] = &l[i]->w;
        bias[i] = kaon_linear_bias(l[i]);
    }
    {  // quantized weights (cuda_quant.cu)
        const int q = kc_quant_linear_multi(b, x, n, count, w, bias, y);
        if (q != 1) return q;
    }
    return gemv_multi_plain(b, x, n, count, l, y, NULL);
}

// The GEMV path of linear_silu_mul over plain bf16 gate and up, with what it may fuse.
static int gemv_silu_plain(kc_backend *b, const void *x, int n, const kaon_linear *gate, const kaon_linear *up,
                           void *out, const kc_gemv_fuse *fuse) {
    if (n > KC_GEMV_MAX_N) return 1;
    const kaon_tensor *wg = &gate->w, *wu = &up->w;
    if (!is_matrix(b, wg, "gate") || !is_matrix(b, wu, "up")) return -1;
    if (wg->shape[0] != wu->shape[0] || wg->shape[1] != wu->shape[1]) return 1;
    return kc_gemv_silu(b, (const bf16 *)x, n, (int)wg->shape[1], (const bf16 *)wg->data,
                        (const bf16 *)wu->data, (int)wg->shape[0], (bf16 *)out, fuse);
}

static int cuda_linear_silu_mul(kaon_backend *be, const void *x, int n, const kaon_linear *gate,
                                const kaon_linear *up, void *out) {
    kc_backend *b = kc(be);
    if (kc_is_scaled_linear(gate) || kc_is_scaled_linear(up))  // INT4 / FP8: fused; or 1: two linears and silu_and_mul
        return gate && gate->w.dtype == KAON_I4 ? kc_int4_linear_silu_mul(b, x, n, gate, up, out, NULL)
                                                : kc_fp8_silu_mul(b, x, n, gate, up, out, NULL);
    if (!is_plain(b, gate, "linear_silu_mul") || !is_plain(b, up, "linear_silu_mul")) return -1;
    if (kaon_linear_bias(gate) || kaon_linear_bias(up)) return 1;  // the fused kernels add no bias
    const kaon_tensor *wg = &gate->w, *wu = &up->w;
    {  // quantized weights (cuda_quant.cu)
        const int q = kc_quant_linear_silu_mul(b, x, n, wg, wu, out);
        if (q != 1) return q;
    }
    return gemv_silu_plain(b, x, n, gate, up, out, NULL);
}

// The batch-1 RMSNorm split around the GEMVs (kc_gemv_fuse; backend.h's linear_residual and
// norm_linear_*): plain bf16 weights (cuda_linear.cu), FP8 ones with per-group activations
// (cuda_fp8.cu) or INT4 ones (cuda_int4.cu), else 1. On by default; KAON_NORM_SPLIT=0 turns it off.
static bool norm_split_on(void) {
    static const bool on = !kc_env_off("KAON_NORM_SPLIT");
    return on;
}

// The FP8 and INT4 forms (KAON_NORM_SPLIT_QUANT=0 off; KAON_NORM_SPLIT=0 turns them off too).
static bool norm_split_quant_on(void) {
    static const bool on = !kc_env_off("KAON_NORM_SPLIT_QUANT");
    return on;
}

static bool plain_bf16(const kaon_linear *l) {
    return l && !kc_is_scaled_linear(l) && l->w.dtype == KAON_BF16 && !kaon_linear_unsupported(l);
}

static bool fp8_layer(const kaon_linear *l) {
    return l && kc_is_scaled_linear(l) && l->w.dtype == KAON_FP8_E4M3 && norm_split_quant_on();
}
static bool int4_layer(const kaon_linear *l) {
    return l && kc_is_scaled_linear(l) && l->w.dtype == KAON_I4 && norm_split_quant_on();
}

// The split norm the last residual GEMV left for x and this norm, if it is still valid.
static const kc_gemv_fuse *split_for(kc_backend *b, const void *x, const kaon_tensor *norm, float eps, int n, int dim,
                                     kc_gemv_fuse *f) {
    if (!norm_split_on() || n != 1 || b->split.res != x || b->split.launch != b->n_launch || !norm ||
        b->split.norm != (const float *)norm->data || b->split.eps != eps || b->split.dim != dim)
        return NULL;
    memset(f, 0, sizeof *f);
    f->normed = 1;
    f->parts = b->split_parts;
    f->n_parts = b->split.n_parts;
    f->eps = eps;
    return f;
}

// GGUF-quantized weights (cuda_quant.cu): the norm in the activations' quantization, else 1.
static bool quant_layer(const kaon_linear *l) {
    return l && !kc_is_scaled_linear(l) && !kaon_linear_unsupported(l);
}

static int quant_norm_linear_multi(kc_backend *b, const void *x, const kaon_tensor *norm, float eps, int n, int count,
                                   const kaon_linear *const *l, void *const *y) {
    const kaon_tensor *w[4], *bias[4];
    for (int i = 0; i < count; i++) {
        if (!quant_layer(l[i])) return 1;
        w[i] = &l[i]->w;
        bias[i] = kaon_linear_bias(l[i]);
    }
    return kc_quant_norm_linear_multi(b, x, norm, eps, n, count, w, bias, y);
}

static int cuda_norm_linear_multi(kaon_backend *be, const void *x, const kaon_tensor *norm, float eps, int n,
                                  int count, const kaon_linear *const *l, void *const *y) {
    kc_backend *b = kc(be);
    kc_gemv_fuse f;
    if (count < 1 || count > 4) return 1;
    if (!split_for(b, x, norm, eps, n, (int)l[0]->w.shape[1], &f))
        return quant_norm_linear_multi(b, x, norm, eps, n, count, l, y);
    if (fp8_layer(l[0])) return kc_fp8_linear_multi(b, b->split_xg, n, count, l, y, &f);
    if (int4_layer(l[0])) return kc_int4_linear_multi(b, b->split_xg, n, count, l, y, &f);
    for (int i = 0; i < count; i++)
        if (!plain_bf16(l[i])) return 1;
    return gemv_multi_plain(b, b->split_xg, n, count, l, y, &f);
}

static int cuda_norm_linear_silu_mul(kaon_backend *be, const void *x, const kaon_tensor *norm, float eps, int n,
                                     const kaon_linear *gate, const kaon_linear *up, void *out) {
    kc_backend *b = kc(be);
    kc_gemv_fuse f;
    if (!split_for(b, x, norm, eps, n, (int)gate->w.shape[1], &f))
        return quant_layer(gate) && quant_layer(up) && !kaon_linear_bias(gate) && !kaon_linear_bias(up)
                   ? kc_quant_norm_linear_silu_mul(b, x, norm, eps, n, &gate->w, &up->w, out)
                   : 1;
    if (fp8_layer(gate)) return kc_fp8_silu_mul(b, b->split_xg, n, gate, up, out, &f);
    if (int4_layer(gate)) return kc_int4_linear_silu_mul(b, b->split_xg, n, gate, up, out, &f);
    if (!plain_bf16(gate) || !plain_bf16(up) || kaon_linear_bias(gate) || kaon_linear_bias(up)) return 1;
    return gemv_silu_plain(b, b->split_xg, n, gate, up, out, &f);
}

// The rotation and KV write of a one-token q / k / v GEMV (norm_qkv_rope_kv_write's): 0, or -1.
static int qkv_rope_args(kc_backend *b, kaon_kv_layer *kv, const kaon_attn_meta *m, int nh, int nkv, int hd,
                         const kaon_rope *rope, QkvRope *r) {
    if (rope_sync(b, rope, hd)) return -1;
    r->pos = kc_dev_i32(b, m->positions, 1);
    r->slot = kc_dev_i32(b, m->slot_mapping, 1);
    if (!r->pos || !r->slot) return -1;
    r->kcache = (bf16 *)kv->k;
    r->vcache = (bf16 *)kv->v;
    r->n_slots = cache_slots(b, kv, nkv, hd);
    r->inv_freq = b->d_inv_freq;
    r->nh = nh;
    r->nkv = nkv;
    return 0;
}

// The GGUF-quantized form of norm_qkv_rope_kv_write (cuda_quant.cu), or 1 (also for weights that
// are not GGUF-quantized: kc_quant_norm_qkv_rope declines them).
static int quant_qkv_rope(kc_backend *b, bool on, const void *x, const kaon_tensor *norm, float eps, int n,
                          const kaon_linear *const *w, void *q, kaon_kv_layer *kv, const kaon_attn_meta *m, int nh,
                          int nkv, int hd, const kaon_rope *rope) {
    if (!on || n != 1 || !kv || !kv->k || !kv->v || kv->dtype == KAON_KV_FP8 || !m || m->n_tokens != 1 || !rope ||
        rope->rot_dim != hd)
        return 1;
    const kaon_tensor *ws[3], *bs[3];
    for (int i = 0; i < 3; i++) {
        ws[i] = &w[i]->w;
        bs[i] = kaon_linear_bias(w[i]);
    }
    QkvRope r;
    if (qkv_rope_args(b, kv, m, nh, nkv, hd, rope, &r)) return -1;
    return kc_quant_norm_qkv_rope(b, x, norm, eps, ws, bs, (bf16 *)q, &r, hd, rope->interleaved);
}

static int cuda_norm_qkv_rope_kv_write(kaon_backend *be, const void *x, const kaon_tensor *norm, float eps, int n,
                                       const kaon_linear *const *w, void *q, void *k, void *v, kaon_kv_layer *kv,
                                       const kaon_attn_meta *m, int nh, int nkv, int hd, const kaon_rope *rope) {
    (void)k, (void)v;
    static const bool on = !kc_env_off("KAON_QKV_ROPE");  // 0: the qkv GEMV and rope_kv_write apart (A/B)
    kc_backend *b = kc(be);
    if (quant_layer(w[0]) && quant_layer(w[1]) && quant_layer(w[2])) {  // GGUF-quantized: there, or on
        const int rc = quant_qkv_rope(b, on, x, norm, eps, n, w, q, kv, m, nh, nkv, hd, rope);
        if (rc != 1) return rc;
    }
    kc_gemv_fuse f;
    if (!on || !kv || !kv->k || !kv->v || kv->dtype == KAON_KV_FP8 || !m || m->n_tokens != 1 || hd != 128 || !rope ||
        rope->rot_dim != 128 || rope->interleaved || !split_for(b, x, norm, eps, n, (int)w[0]->w.shape[1], &f))
        return 1;
    const bf16 *ws[3];
    const float *bs[3];
    const int64_t rows[3] = {(int64_t)nh * hd, (int64_t)nkv * hd, (int64_t)nkv * hd};
    for (int i = 0; i < 3; i++) {
        if (!plain_bf16(w[i]) || w[i]->w.shape[0] != rows[i] || w[i]->w.shape[1] != w[0]->w.shape[1]) return 1;
        const kaon_tensor *bias = kaon_linear_bias(w[i]);
        if (!is_matrix(b, &w[i]->w, "linear") || (bias && !is_vector(b, bias, rows[i], "linear bias"))) return -1;
        ws[i] = (const bf16 *)w[i]->w.data;
        bs[i] = bias ? (const float *)bias->data : NULL;
    }
    QkvRope r;
    if (qkv_rope_args(b, kv, m, nh, nkv, hd, rope, &r)) return -1;
    return kc_gemv_qkv_rope(b, b->split_xg, (int)w[0]->w.shape[1], ws, bs, (bf16 *)q, &f, &r);
}

// What a residual kernel just launched left for the next norm of res (split_for reads it).
static void split_record(kc_backend *b, const void *res, const float *norm, float eps, int dim, int n_parts) {
    b->split.res = res;
    b->split.norm = norm;
    b->split.eps = eps;
    b->split.dim = dim;
    b->split.n_parts = n_parts;
    b->split.launch = b->n_launch;
}

static int cuda_linear_residual(kaon_backend *be, const void *x, int n, const kaon_linear *l, void *res,
                                const kaon_tensor *next_norm, float eps) {
    kc_backend *b = kc(be);
    b->split.res = NULL;
    if (quant_layer(l)) {  // GGUF-quantized (cuda_quant.cu): the add in the GEMV's epilogue, or 1
        const int q = kc_quant_linear_residual(b, x, n, &l->w, kaon_linear_bias(l), res);
        if (q != 1) return q;
    }
    if (!norm_split_on() || n != 1 || !next_norm || !(plain_bf16(l) || fp8_layer(l) || int4_layer(l))) return 1;
    const int dim = (int)l->w.shape[0];
    if (dim > KC_GEMV_NORM_MAX_IN) return 1;
    if (!is_vector(b, next_norm, dim, "rmsnorm")) return -1;
    const int blocks = (dim + KC_GEMV_ROWS - 1) / KC_GEMV_ROWS;  // a sum of squares per GEMV block at most
    // parts: room for dim (the MoE small path's combine leaves one per 2 rows: norm_moe_residual).
    if (kc_grow(b, (void **)&b->split_xg, &b->split_xg_cap, (size_t)dim, sizeof(bf16), "split norm") ||
        kc_grow(b, (void **)&b->split_parts, &b->split_parts_cap, (size_t)dim, sizeof(float), "split norm"))
        return -1;
    kc_gemv_fuse f;
    memset(&f, 0, sizeof f);
    f.residual = 1;
    f.norm = (const float *)next_norm->data;
    f.xg = b->split_xg;
    f.parts = b->split_parts;
    f.n_parts = blocks;
    const int rc = fp8_layer(l)    ? kc_fp8_linear_residual(b, x, n, l, res, &f)
                   : int4_layer(l) ? kc_int4_linear_residual(b, x, n, l, res, &f)
                                   : gemv_multi_plain(b, x, n, 1, &l, &res, &f);
    if (rc == 0) split_record(b, res, f.norm, eps, dim, f.n_parts);
    return rc;
}

// The MoE layer between two split norms (backend.h's norm_moe_residual; cuda_moe.cu's small
// path at batch 1). Off: it passes its tests but measured slower (session 61, docs/PERF.md);
// KAON_MOE_NORM_FUSE=1 puts it in the op table (make_ops); without it the layer runs as before.
static int cuda_norm_moe_residual(kaon_backend *be, void *x, const kaon_tensor *norm, float eps, int n,
                                  const int32_t *positions, const kaon_moe_weights *w, uint32_t *counts,
                                  const kaon_tensor *next_norm) {
    kc_backend *b = kc(be);
    kc_gemv_fuse in, out;
    if (!w || !w->router || w->router->w.ndim != 2) return 1;
    const int dim = (int)w->router->w.shape[1];
    if (!split_for(b, x, norm, eps, n, dim, &in) || b->split_parts_cap < (size_t)dim) return 1;
    if (next_norm && !is_vector(b, next_norm, dim, "rmsnorm")) return -1;
    memset(&out, 0, sizeof out);
    out.norm = next_norm ? (const float *)next_norm->data : NULL;
    out.xg = b->split_xg;
    out.parts = b->split_parts;
    const int rc = kc_moe_norm_residual(b, w, positions, counts, x, &in, next_norm ? &out : NULL);
    if (rc == 1) return 1;
    b->split.res = NULL;
    if (rc == 0 && next_norm) split_record(b, x, out.norm, eps, dim, out.n_parts);
    return rc;
}

// rope_kv_write, and qk_norm_rope_kv_write where qn and kn are given.
static int rope_kv_write_any(kaon_backend *be, void *q, void *k, const void *v, const kaon_tensor *qn,
                             const kaon_tensor *kn, float eps, kaon_kv_layer *kv, const kaon_attn_meta *m, int nh,
                             int nkv, int hd, const kaon_rope *rope) {
    kc_backend *b = kc(be);
    if (!kv || !kv->k || !kv->v || !m || nh <= 0 || nkv <= 0 || hd <= 0)
        return kc_fail(b, "cuda rope_kv_write: bad arguments");
    // An FP8 cache: rope, rope and kv_write (the rotation in bf16, then one rounding to e4m3).
    if (kv->dtype == KAON_KV_FP8) return 1;
    // The head norm: 128-wide heads, full NeoX rotary (Qwen3); KAON_QK_NORM_FUSE=0: the ops apart (A/B).
    static const bool qkn_on = !kc_env_off("KAON_QK_NORM_FUSE");
    if (qn && (!qkn_on || hd != 128 || !rope || rope->rot_dim != 128 || rope->interleaved)) return 1;
    if (m->n_tokens <= 0) return 0;
    if (qn && (!is_vector(b, qn, hd, "qk_norm q") || !is_vector(b, kn, hd, "qk_norm k"))) return -1;
    if (rope_sync(b, rope, hd)) return -1;
    const int32_t *dp = kc_dev_i32(b, m->positions, (size_t)m->n_tokens);
    const int32_t *ds = kc_dev_i32(b, m->slot_mapping, (size_t)m->n_tokens);
    if (!dp || !ds) return -1;
    kc_rope_kv_write(b, (bf16 *)q, (const bf16 *)k, (const bf16 *)v, (bf16 *)kv->k, (bf16 *)kv->v, dp, ds,
                     cache_slots(b, kv, nkv, hd), m->n_tokens, nh, nkv, hd, rope->rot_dim, rope->interleaved,
                     qn ? (const float *)qn->data : NULL, kn ? (const float *)kn->data : NULL, eps);
    return b->err ? -1 : 0;
}

static int cuda_rope_kv_write(kaon_backend *be, void *q, void *k, const void *v, kaon_kv_layer *kv,
                              const kaon_attn_meta *m, int nh, int nkv, int hd, const kaon_rope *rope) {
    return rope_kv_write_any(be, q, k, v, NULL, NULL, 0.f, kv, m, nh, nkv, hd, rope);
}

static int cuda_qk_norm_rope_kv_write(kaon_backend *be, void *q, void *k, const void *v, const kaon_tensor *qn,
                                      const kaon_tensor *kn, float eps, kaon_kv_layer *kv, const kaon_attn_meta *m,
                                      int nh, int nkv, int hd, const kaon_rope *rope) {
    if (!qn || !kn) return kc_fail(kc(be), "cuda qk_norm_rope_kv_write: no norm weights");
    return rope_kv_write_any(be, q, k, v, qn, kn, eps, kv, m, nh, nkv, hd, rope);
}

static int cuda_mla_prep(kaon_backend *be, const void *kva, const kaon_tensor *norm, float eps, const void *q,
                         int nh, int hd, float pe_scale, void *qm, kaon_kv_layer *kv, const kaon_attn_meta *m,
                         int kvl, int rd, const kaon_rope *rope) {
    kc_backend *b = kc(be);
    if (!kva || !q || !qm || !kv || !kv->k || !m || nh <= 0 || kvl <= 0 || rd <= 0 || hd < rd)
        return kc_fail(b, "cuda mla_prep: bad arguments");
    if (!rope || kvl % 8 || (kvl + rd) % 8 || ((uintptr_t)kva & 15) || rope->rot_dim != rd)
        return 1;  // the unfused ops take it
    if (m->n_tokens <= 0) return 0;
    if (!is_vector(b, norm, kvl, "mla_prep norm") || rope_sync(b, rope, rd)) return -1;
    const int32_t *dp = kc_dev_i32(b, m->positions, (size_t)m->n_tokens);
    const int32_t *ds = kc_dev_i32(b, m->slot_mapping, (size_t)m->n_tokens);
    if (!dp || !ds) return -1;
    const size_t bytes = alloc_size(b, kv->k);
    const int64_t n_slots = bytes ? (int64_t)(bytes / ((size_t)(kvl + rd) * sizeof(bf16))) : INT64_MAX;
    kc_mla_prep(b, (const bf16 *)kva, (const float *)norm->data, eps, (const bf16 *)q, nh, hd, pe_scale, (bf16 *)qm,
                (bf16 *)kv->k, dp, ds, n_slots, m->n_tokens, kvl, rd, rope->interleaved);
    return b->err ? -1 : 0;
}

// ---- lifetime -----------------------------------------------------------------------------------

static void cuda_destroy(kaon_backend *be) {
    kc_backend *b = kc(be);
    if (!b) return;
    // Whether a run's steps came from graphs (a step shape that cannot be recorded stays eager).
    if (kc_env_on("KAON_GRAPH_STATS"))
        fprintf(stderr, "kaon: cuda graphs: %llu steps replayed, %llu recorded, %llu eager\n",
                (unsigned long long)b->graph_replays, (unsigned long long)b->graph_recordings,
                (unsigned long long)(b->graph_steps - b->graph_replays - b->graph_recordings));
    if (b->capturing) {
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(b->stream, &g);
        if (g) cudaGraphDestroy(g);
    }
    if (b->stream) cudaStreamSynchronize(b->stream);
    graphs_reset(b);
    kc_gemm_cache_free(b);
    if (b->lt) cublasLtDestroy(b->lt);
    if (b->lt_ws) cudaFree(b->lt_ws);
    for (int i = 0; i < b->n_allocs; i++) cudaFree(b->allocs[i].p);
    free(b->allocs);
    if (b->meta_dev) cudaFree(b->meta_dev);
    if (b->meta_host) cudaFreeHost(b->meta_host);
    if (b->loose_dev) cudaFree(b->loose_dev);
    for (int i = 0; i < b->n_rope; i++) cudaFree(b->rope_dev[i]);
    if (b->attn_part) cudaFree(b->attn_part);
    if (b->attn_count) cudaFree(b->attn_count);
    if (b->fuse_tmp) cudaFree(b->fuse_tmp);
    if (b->split_xg) cudaFree(b->split_xg);
    if (b->split_parts) cudaFree(b->split_parts);
    if (b->host_out) cudaFreeHost(b->host_out);
    kc_sampler_free(b);
    if (b->fa_mark) cudaFree(b->fa_mark);
    kc_quant_destroy(b);
    kc_mla_destroy(b);
    kc_fp8_destroy(b);
    kc_int4_destroy(b);
    if (b->meta_done) cudaEventDestroy(b->meta_done);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b);
}

static kaon_backend_ops make_ops(void) {
    kaon_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.alloc = cuda_alloc;
    o.free = cuda_free;
    o.act_elem_bytes = sizeof(bf16);
    o.embed = cuda_embed;
    o.get_rows = cuda_get_rows;
    o.rmsnorm = cuda_rmsnorm;
    o.rmsnorm_once = cuda_rmsnorm_once;
    o.linear = cuda_linear;
    o.rope = cuda_rope;
    o.kv_write = cuda_kv_write;
    o.attention = cuda_attention;
    o.mla_attention = kc_op_mla_attention;
    o.head_linear = kc_op_head_linear;
    o.copy_strided = kc_op_copy_strided;
    o.silu_and_mul = cuda_silu_and_mul;
    o.gelu_tanh_and_mul = cuda_gelu_tanh_and_mul;
    o.scale = cuda_scale;
    o.logit_softcap = cuda_logit_softcap;
    o.to_host_f32 = cuda_to_host_f32;
    o.destroy = cuda_destroy;
    o.upload = cuda_upload;
    o.upload_dense = cuda_upload_dense;
    o.fill_dummy = cuda_fill_dummy;
    o.weight_bytes = cuda_weight_bytes;
    o.upload_linear = cuda_upload_linear;
    o.release = cuda_release;
    o.begin_step = cuda_begin_step;
    o.graph_begin = cuda_graph_begin;
    o.graph_end = cuda_graph_end;
    o.status = cuda_status;
    o.mem_info = cuda_mem_info;
    o.copy_f32_strided = cuda_copy_f32_strided;
    o.linear_multi = cuda_linear_multi;
    o.linear_silu_mul = cuda_linear_silu_mul;
    o.norm_linear_multi = cuda_norm_linear_multi;
    o.norm_linear_silu_mul = cuda_norm_linear_silu_mul;
    o.linear_residual = cuda_linear_residual;
    o.norm_qkv_rope_kv_write = cuda_norm_qkv_rope_kv_write;
    o.rope_kv_write = cuda_rope_kv_write;
    o.qk_norm_rope_kv_write = cuda_qk_norm_rope_kv_write;
    o.mla_prep = cuda_mla_prep;
    o.mla_expanded_prefill = true;
    o.kv_fp8 = true;       // kv_write + the split-K attention kernel (cuda_attention.cu)
    o.kv_fp8_mla = false;  // the MLA kernels read bf16 latents only  // head_dim 192: the tensor-core prefill kernel's instance
    o.linear_f32 = cuda_linear_f32;
    o.copy_f32_to_host = cuda_copy_f32_to_host;
    o.sample = cuda_sample;
    o.copy_rows_f32_to_host = cuda_copy_rows_f32_to_host;
    o.moe = kc_moe_op;
    o.norm_moe_residual = kc_env_on("KAON_MOE_NORM_FUSE") ? cuda_norm_moe_residual : NULL;
    return o;
}

static const kaon_backend_ops cuda_ops = make_ops();

extern "C" kaon_backend *kaon_backend_cuda_create(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        kaon_set_error("cuda: no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        return NULL;
    }
    if (device < 0 || device >= n) {
        kaon_set_error("cuda: device %d does not exist (%d found)", device, n);
        return NULL;
    }
    cudaDeviceProp prop;
    if (cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        kaon_set_error("cuda: cannot open device %d", device);
        return NULL;
    }
    if (prop.major < 9) {
        kaon_set_error("cuda: %s is compute capability %d.%d; kaon's kernels are built for 9.0 (Hopper)",
                       prop.name, prop.major, prop.minor);
        return NULL;
    }
    kc_backend *b = (kc_backend *)calloc(1, sizeof *b);
    if (!b) {
        kaon_set_error("cuda: out of host memory");
        return NULL;
    }
    b->base.ops = &cuda_ops;
    b->base.n_threads = 1;
    b->device = device;
    b->n_sm = prop.multiProcessorCount;
    b->cur_graph = -1;
    const char *g = getenv("KAON_CUDA_GRAPHS");
    b->graphs_disabled = g && !strcmp(g, "0");
    const char *pdl = getenv("KAON_PDL");
    b->pdl = !(pdl && !strcmp(pdl, "0"));
    b->lt_ws_bytes = (size_t)32 << 20;
    if (cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&b->meta_done, cudaEventDisableTiming) != cudaSuccess ||
        cublasLtCreate(&b->lt) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&b->lt_ws, b->lt_ws_bytes) != cudaSuccess || kc_attention_init(b)) {
        cudaGetLastError();
        kaon_set_error("cuda: cannot set up device %d (stream, cuBLASLt, workspace)", device);
        cuda_destroy(&b->base);
        return NULL;
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    KAON_INFO("cuda: device %d: %s, %d SMs, %.1f GiB (%.1f free)%s", device, prop.name, b->n_sm,
              tot / 1073741824.0, fr / 1073741824.0, b->graphs_disabled ? ", graphs off" : "");
    return &b->base;
}
