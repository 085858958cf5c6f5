// gpu_driver: runs kaon's backend ops and models for tests/gpu/test_gpu.py, which computes the
// references (numpy float64, HF transformers, the gguf package) and compares.
//
//   gpu_driver op DIR                     one op on the CUDA backend: DIR/params.txt ("key value"
//                                         lines), inputs DIR/<name>.bin (f32 or i32), outputs
//                                         DIR/out*.bin (f32). Outputs start as NaN (poisoned).
//   gpu_driver logits MODEL DEV CHUNK IDS OUT [dummy]
//                                         logits [n, vocab] f32 of every position of one sequence
//                                         fed CHUNK tokens per step (n = one prefill, 1 = decode)
//   gpu_driver batch MODEL DEV SEQS OUT   several sequences (one comma list per line of SEQS)
//                                         in shared steps: prefill chunks of different lengths and
//                                         decodes mixed, scattered KV blocks; logits of every
//                                         position of every sequence, in file order
//   gpu_driver greedy MODEL DEV IDS N     greedy ids after the prompt: a JSON list of
//                                         [id, top-2 logit margin, runner-up id]
//   gpu_driver timings [mla]              decode-shaped linear and attention timings, then MLA
//                                         attention's (JSON lines); `mla`: MLA's only
//   (op moe: the moe op on stacked experts, DeepSeek routing when asked; with "time N" it also
//   prints us per call. ops copy_strided, head_linear and mla: the MLA model's ops)
//   (op i4linear: one INT4 linear layer, on CUDA or KAON_OP_DEVICE=cpu: gpu_driver_int4.c)
//   gpu_driver qtimings                   quantized GEMV timings per GGUF format (JSON lines; the
//                                         ops qlinear/qmulti/qsilu: gpu_driver_quant.c; the FP8
//                                         ops fp8linear/fp8multi/fp8silu: gpu_driver_fp8.c)
//   gpu_driver attn_bench [NH NKV HD MAXT WINDOW [fp8]]
//                                         prefill attention of one sequence at 1k..16k tokens
//                                         (and a 2k chunk after a 6k prefix) : us and TFLOP/s
//                                         (JSON lines); KAON_FA=0 times the split-K kernel instead;
//                                         WINDOW > 0: sliding-window attention (FLOPs of the
//                                         window's keys only); fp8: an FP8 cache (KAON_FA_FP8=0
//                                         times the decode kernels instead);
//                                         KAON_ATTN_BENCH_T=T runs only the case of T tokens
//   gpu_driver dec_bench [NH NKV HD [fp8]]
//                                         decode attention of batched steps (B sequences x
//                                         context L, scattered blocks): us and GB/s of KV read
// DEV: cpu or cuda. IDS: a comma list.
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/quant_blocks.h"
#include "model/model.h"
#include "util/err.h"
#include "util/half.h"

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "gpu_driver: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (%s)\n", kaon_last_error());
    exit(2);
}

// ---- files ------------------------------------------------------------------------------------

static void *read_all(const char *dir, const char *name, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void *need(const char *dir, const char *name, size_t bytes) {
    size_t len = 0;
    void *p = read_all(dir, name, &len);
    if (!p || len != bytes) {
        fprintf(stderr, "gpu_driver: %s/%s: expected %zu bytes, got %zu\n", dir, name, bytes, len);
        exit(2);
    }
    return p;
}

static void write_f32(const char *dir, const char *name, const float *x, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), n, f) != n || fclose(f)) die("cannot write %s", path);
}

static double param(const char *dir, const char *key, double dflt) {
    size_t len = 0;
    char *t = read_all(dir, "params.txt", &len);
    if (!t) die("no params.txt in %s", dir);
    t = realloc(t, len + 1);
    t[len] = 0;
    double v = dflt;
    size_t kl = strlen(key);
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n"))
        if (!strncmp(line, key, kl) && line[kl] == ' ') v = atof(line + kl + 1);
    free(t);
    return v;
}

static const char *param_str(const char *dir, const char *key, char *buf, size_t cap) {
    size_t len = 0;
    char *t = read_all(dir, "params.txt", &len);
    if (!t) die("no params.txt in %s", dir);
    t = realloc(t, len + 1);
    t[len] = 0;
    buf[0] = 0;
    size_t kl = strlen(key);
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n"))
        if (!strncmp(line, key, kl) && line[kl] == ' ') snprintf(buf, cap, "%s", line + kl + 1);
    free(t);
    return buf;
}

// ---- device buffers through the op table ------------------------------------------------------

static kaon_backend *be;
static bool on_cpu;  // KAON_OP_DEVICE=cpu: the same ops on the CPU backend (checks the harness)

// A bf16 device buffer [rows, cols] holding x (NULL: NaN, to see unwritten outputs).
static void *dev_bf16(const float *x, int64_t rows, int64_t cols) {
    size_t n = (size_t)rows * (size_t)cols;
    if (on_cpu) {  // f32 activations
        float *f = be->ops->alloc(be, n * 4);
        for (size_t i = 0; i < n; i++) f[i] = x ? x[i] : NAN;
        return f;
    }
    uint16_t *h = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) {
        if (!x) {
            h[i] = 0x7FC0;
        } else {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even (inputs are finite)
            h[i] = (uint16_t)(bits >> 16);
        }
    }
    kaon_tensor t = {.dtype = KAON_BF16, .ndim = 2, .shape = {rows, cols}, .data = h, .nbytes = n * 2};
    kaon_tensor d;
    if (be->ops->upload(be, &t, &d)) die("upload failed%s", "");
    free(h);
    return d.data;
}

static kaon_tensor dev_matrix(const float *x, int64_t rows, int64_t cols) {
    if (on_cpu) {
        kaon_tensor t = {.dtype = KAON_F32, .ndim = 2, .shape = {rows, cols}, .data = (void *)x,
                         .nbytes = (size_t)rows * cols * 4};
        return t;
    }
    kaon_tensor t = {.dtype = KAON_BF16, .ndim = 2, .shape = {rows, cols}};
    t.data = dev_bf16(x, rows, cols);
    t.nbytes = (size_t)rows * cols * 2;
    return t;
}

static kaon_tensor dev_vector(const float *x, int64_t n) {
    kaon_tensor t = {.dtype = KAON_F32, .ndim = 1, .shape = {n}, .data = (void *)x, .nbytes = (size_t)n * 4};
    if (on_cpu) return t;
    kaon_tensor d;
    if (be->ops->upload(be, &t, &d)) die("upload failed%s", "");
    return d;
}

static void save_dev(const char *dir, const char *name, const void *d, size_t n) {
    float *h = malloc(n * sizeof(float) + 4);
    be->ops->to_host_f32(be, d, n, h);
    if (be->ops->status && be->ops->status(be)) die("op failed%s", "");
    write_f32(dir, name, h, n);
    free(h);
}

// ---- ops ------------------------------------------------------------------------------------------

static int run_qop(const char *dir, const char *op);  // gpu_driver_quant.c
static int run_fp8op(const char *dir, const char *op);  // gpu_driver_fp8.c
static kaon_linear fp8_layer(const char *dir, const char *wname, const char *sname, int out, int in);
static int run_i4op(const char *dir, const char *op);  // gpu_driver_int4.c
static void q_dequant_save(const char *dir, const kaon_tensor *d, int rows, int cols);
static kaon_tensor q_upload_raw(const char *dir, const char *name, int type, int64_t rows, int64_t cols);

static double now_s(void);

static int run_op(const char *dir) {
    char op[64];
    param_str(dir, "op", op, sizeof op);
    const char *dv = getenv("KAON_OP_DEVICE");
    on_cpu = dv && !strcmp(dv, "cpu");
    be = on_cpu ? kaon_backend_cpu_create(0) : kaon_backend_cuda_create(0);
    if (!be) die("no backend%s", "");
    const kaon_backend_ops *o = be->ops;
#define P(k) ((int)param(dir, k, 0))
    if (!strcmp(op, "rmsnorm")) {
        int n = P("n"), dim = P("dim"), has_add = P("has_add"), inplace = P("inplace");
        float eps = (float)param(dir, "eps", 1e-5);
        float *x = need(dir, "x.bin", (size_t)n * dim * 4), *w = need(dir, "w.bin", (size_t)dim * 4);
        void *dx = dev_bf16(x, n, dim), *dadd = NULL;
        if (has_add) dadd = dev_bf16(need(dir, "add.bin", (size_t)n * dim * 4), n, dim);
        kaon_tensor dw = dev_vector(w, dim);
        void *dout = inplace ? dx : dev_bf16(NULL, n, dim);
        o->rmsnorm(be, dx, dadd, &dw, eps, n, dim, dout);
        save_dev(dir, "out.bin", dout, (size_t)n * dim);
        if (!inplace) save_dev(dir, "out_x.bin", dx, (size_t)n * dim);
    } else if (!strcmp(op, "linear") || !strcmp(op, "multi") || !strcmp(op, "silu")) {
        int n = P("n"), out = P("out"), in = P("in"), has_bias = P("has_bias");
        void *dx = dev_bf16(need(dir, "x.bin", (size_t)n * in * 4), n, in);
        if (!strcmp(op, "linear") && P("f32out")) {  // the LM head's f32 logits
            kaon_tensor w = dev_matrix(need(dir, "w.bin", (size_t)out * in * 4), out, in);
            const kaon_linear lw = kaon_linear_of(&w, NULL);
            float *y = o->alloc(be, (size_t)n * out * 4), *h = malloc((size_t)n * out * 4);
            if (o->linear_f32) {
                o->linear_f32(be, dx, n, &lw, y);
                o->copy_f32_to_host(be, y, (size_t)n * out, h);
            } else {  // the CPU's activations are f32 already
                o->linear(be, dx, n, &lw, y);
                o->to_host_f32(be, y, (size_t)n * out, h);
            }
            write_f32(dir, "out.bin", h, (size_t)n * out);
        } else if (!strcmp(op, "linear")) {
            kaon_tensor w = dev_matrix(need(dir, "w.bin", (size_t)out * in * 4), out, in), b;
            if (has_bias) b = dev_vector(need(dir, "b.bin", (size_t)out * 4), out);
            void *dy = dev_bf16(NULL, n, out);
            const kaon_linear lw = kaon_linear_of(&w, has_bias ? &b : NULL);
            o->linear(be, dx, n, &lw, dy);
            save_dev(dir, "out.bin", dy, (size_t)n * out);
        } else if (!strcmp(op, "multi")) {
            int rows[3] = {P("out0"), P("out1"), P("out2")};
            kaon_linear l[3];
            const kaon_linear *lp[3];
            void *y[3];
            for (int i = 0; i < 3; i++) {
                char nm[32];
                snprintf(nm, sizeof nm, "w%d.bin", i);
                const kaon_tensor w = dev_matrix(need(dir, nm, (size_t)rows[i] * in * 4), rows[i], in);
                l[i] = kaon_linear_of(&w, NULL);
                if (has_bias) {
                    snprintf(nm, sizeof nm, "b%d.bin", i);
                    l[i].bias = dev_vector(need(dir, nm, (size_t)rows[i] * 4), rows[i]);
                }
                lp[i] = &l[i];
                y[i] = dev_bf16(NULL, n, rows[i]);
            }
            int rc = o->linear_multi ? o->linear_multi(be, dx, n, 3, lp, y) : 1;
            if (rc == 1)
                for (int i = 0; i < 3; i++) o->linear(be, dx, n, lp[i], y[i]);
            printf("{\"declined\": %d}\n", on_cpu ? n > 8 : rc == 1);  // the CPU has no fused op
            for (int i = 0; i < 3; i++) {
                char nm[32];
                snprintf(nm, sizeof nm, "out%d.bin", i);
                save_dev(dir, nm, y[i], (size_t)n * rows[i]);
            }
        } else {
            kaon_tensor wg = dev_matrix(need(dir, "wg.bin", (size_t)out * in * 4), out, in);
            kaon_tensor wu = dev_matrix(need(dir, "wu.bin", (size_t)out * in * 4), out, in);
            const kaon_linear lg = kaon_linear_of(&wg, NULL), lu = kaon_linear_of(&wu, NULL);
            void *dy = dev_bf16(NULL, n, out);
            int rc = o->linear_silu_mul ? o->linear_silu_mul(be, dx, n, &lg, &lu, dy) : 1;
            if (rc == 1) {
                void *g = dev_bf16(NULL, n, out), *u = dev_bf16(NULL, n, out);
                o->linear(be, dx, n, &lg, g);
                o->linear(be, dx, n, &lu, u);
                o->silu_and_mul(be, g, u, n, out, dy);
            }
            printf("{\"declined\": %d}\n", on_cpu ? n > 8 : rc == 1);  // the CPU has no fused op
            save_dev(dir, "out.bin", dy, (size_t)n * out);
        }
    } else if (!strcmp(op, "rope")) {
        // n_tables 2: inv.bin holds tables A and B (Gemma 3's local and global layers), applied
        // to copies of x in the order A, B, A, B (out.bin, out1.bin, ...), as layers alternate.
        int n = P("n"), nh = P("nh"), hd = P("hd"), rot = P("rot"), nt = P("n_tables") > 1 ? 2 : 1;
        float *x = need(dir, "x.bin", (size_t)n * nh * hd * 4), *inv = need(dir, "inv.bin", (size_t)nt * rot / 2 * 4);
        int32_t *pos = need(dir, "pos.bin", (size_t)n * 4);
        for (int k = 0; k < (nt == 2 ? 4 : 1); k++) {
            kaon_rope r = {.rot_dim = rot, .interleaved = P("interleaved") != 0, .inv_freq = inv + (k % nt) * (rot / 2)};
            void *dx = dev_bf16(x, n, (int64_t)nh * hd);
            o->rope(be, dx, n, nh, hd, pos, &r);
            char nm[32];
            snprintf(nm, sizeof nm, k ? "out%d.bin" : "out.bin", k);
            save_dev(dir, nm, dx, (size_t)n * nh * hd);
        }
    } else if (!strcmp(op, "attn")) {
        // Context tokens go into the cache first (kv_write, loose index copies); then one step
        // of T query tokens through begin_step: (rope_kv_write | kv_write) + attention.
        int T = P("T"), S = P("n_seqs"), nh = P("nh"), nkv = P("nkv"), hd = P("hd"), bs = P("bs");
        int n_blocks = P("n_blocks"), mb = P("max_blocks"), C = P("n_ctx"), fused = P("fused");
        int window = P("window");
        float scale = (float)param(dir, "scale", 1.0);
        size_t kvrow = (size_t)nkv * hd;
        // kv_fp8 1: an FP8 cache (one byte per element) with k_scale / v_scale; its raw codes
        // are not dumped (out_*cache.bin are the bf16 cache's only).
        const bool f8 = P("kv_fp8") != 0;
        const size_t eb = f8 ? 1 : o->act_elem_bytes;
        kaon_kv_layer kv = {o->alloc(be, (size_t)n_blocks * bs * kvrow * eb), o->alloc(be, (size_t)n_blocks * bs * kvrow * eb),
                            f8 ? KAON_KV_FP8 : KAON_KV_NATIVE, (float)param(dir, "k_scale", 1.0),
                            (float)param(dir, "v_scale", 1.0)};
        int32_t *tables = need(dir, "tables.bin", (size_t)S * mb * 4);
        if (C > 0) {
            int32_t *cslot = need(dir, "ctx_slot.bin", (size_t)C * 4);
            void *ck = dev_bf16(need(dir, "ctx_k.bin", C * kvrow * 4), C, (int64_t)kvrow);
            void *cv = dev_bf16(need(dir, "ctx_v.bin", C * kvrow * 4), C, (int64_t)kvrow);
            kaon_attn_meta cm = {.n_tokens = C, .n_seqs = S, .slot_mapping = cslot,
                                 .block_tables = tables, .max_blocks = mb, .block_size = bs};
            o->kv_write(be, &kv, ck, cv, &cm, nkv, hd);
        }
        int32_t *pos = need(dir, "pos.bin", (size_t)T * 4), *seq = need(dir, "seq.bin", (size_t)T * 4);
        int32_t *slot = need(dir, "slot.bin", (size_t)T * 4);
        void *q = dev_bf16(need(dir, "q.bin", (size_t)T * nh * hd * 4), T, (int64_t)nh * hd);
        void *k = dev_bf16(need(dir, "k.bin", T * kvrow * 4), T, (int64_t)kvrow);
        void *v = dev_bf16(need(dir, "v.bin", T * kvrow * 4), T, (int64_t)kvrow);
        kaon_attn_meta m = {.n_tokens = T, .n_seqs = S, .positions = pos, .token_seq = seq,
                            .slot_mapping = slot, .block_tables = tables, .max_blocks = mb,
                            .block_size = bs};
        if (o->begin_step && o->begin_step(be, NULL, &m, NULL, 0)) die("begin_step%s", "");
        if (fused) {
            int rot = P("rot");
            float *inv = need(dir, "inv.bin", (size_t)rot / 2 * 4);
            kaon_rope r = {.rot_dim = rot, .interleaved = P("interleaved") != 0, .inv_freq = inv};
            const int rc = o->rope_kv_write ? o->rope_kv_write(be, q, k, v, &kv, &m, nh, nkv, hd, &r) : 1;
            if (rc < 0) die("rope_kv_write%s", "");
            if (rc == 1) {  // declined (an FP8 cache) or absent: the unfused ops
                o->rope(be, q, T, nh, hd, pos, &r);
                o->rope(be, k, T, nkv, hd, pos, &r);
                o->kv_write(be, &kv, k, v, &m, nkv, hd);
            }
            save_dev(dir, "out_q.bin", q, (size_t)T * nh * hd);
        } else {
            o->kv_write(be, &kv, k, v, &m, nkv, hd);
        }
        void *out = dev_bf16(NULL, T, (int64_t)nh * hd);
        o->attention(be, q, &kv, &m, nh, nkv, hd, scale, window, out);
        save_dev(dir, "out.bin", out, (size_t)T * nh * hd);
        if (!f8) {
            save_dev(dir, "out_kcache.bin", kv.k, (size_t)n_blocks * bs * kvrow);
            save_dev(dir, "out_vcache.bin", kv.v, (size_t)n_blocks * bs * kvrow);
        }
    } else if (!strcmp(op, "embed")) {
        int V = P("vocab"), dim = P("dim"), n = P("n");
        kaon_tensor t = dev_matrix(need(dir, "table.bin", (size_t)V * dim * 4), V, dim);
        int32_t *ids = need(dir, "ids.bin", (size_t)n * 4);
        void *out = dev_bf16(NULL, n, dim);
        o->embed(be, &t, ids, n, out);
        save_dev(dir, "out.bin", out, (size_t)n * dim);
        int32_t *rows = need(dir, "rows.bin", (size_t)P("n_rows") * 4);
        void *out2 = dev_bf16(NULL, P("n_rows"), dim);
        o->get_rows(be, out, rows, P("n_rows"), dim, out2);
        save_dev(dir, "out_rows.bin", out2, (size_t)P("n_rows") * dim);
    } else if (!strcmp(op, "silu_mul") || !strcmp(op, "gelu_mul")) {
        int n = P("n"), dim = P("dim");
        void *g = dev_bf16(need(dir, "g.bin", (size_t)n * dim * 4), n, dim);
        void *u = dev_bf16(need(dir, "u.bin", (size_t)n * dim * 4), n, dim);
        void *out = dev_bf16(NULL, n, dim);
        if (!strcmp(op, "silu_mul")) o->silu_and_mul(be, g, u, n, dim, out);
        else o->gelu_tanh_and_mul(be, g, u, n, dim, out);
        save_dev(dir, "out.bin", out, (size_t)n * dim);
    } else if (!strcmp(op, "scale")) {  // x *= s in place
        int n = P("n");
        void *x = dev_bf16(need(dir, "x.bin", (size_t)n * 4), 1, n);
        o->scale(be, x, (size_t)n, (float)param(dir, "s", 1.0));
        save_dev(dir, "out.bin", x, (size_t)n);
    } else if (!strcmp(op, "sample")) {  // D draws of one row of logits, each with its own key
        int V = P("vocab"), D = P("draws"), nb = P("n_bias"), ns = P("n_seen"), no = P("n_out");
        float *lg = need(dir, "logits.bin", (size_t)V * 4);
        float *rep = malloc((size_t)D * V * 4);
        for (int d = 0; d < D; d++) memcpy(rep + (size_t)d * V, lg, (size_t)V * 4);
        kaon_tensor dl = dev_vector(rep, (int64_t)D * V);
        int n_ent = nb + ns + no;
        int32_t *et = malloc(sizeof(int32_t) * (size_t)(n_ent + 1));
        float *ev = malloc(sizeof(float) * (size_t)(n_ent + 1));
        if (nb) {
            memcpy(et, need(dir, "bias_tok.bin", (size_t)nb * 4), (size_t)nb * 4);
            memcpy(ev, need(dir, "bias_val.bin", (size_t)nb * 4), (size_t)nb * 4);
        }
        if (ns) memcpy(et + nb, need(dir, "seen.bin", (size_t)ns * 4), (size_t)ns * 4);
        if (no) {
            memcpy(et + nb + ns, need(dir, "out_tok.bin", (size_t)no * 4), (size_t)no * 4);
            memcpy(ev + nb + ns, need(dir, "out_cnt.bin", (size_t)no * 4), (size_t)no * 4);
        }
        kaon_sample_row *rows = calloc((size_t)D, sizeof *rows);
        for (int d = 0; d < D; d++)
            rows[d] = (kaon_sample_row){.logit_row = d, .temperature = (float)param(dir, "temperature", 1),
                                        .top_k = P("top_k"), .top_p = (float)param(dir, "top_p", 1),
                                        .min_p = (float)param(dir, "min_p", 0),
                                        .rng_key = 0x1234567ull + (uint64_t)d * 0x9e3779b97f4a7c15ull,
                                        .repetition = (float)param(dir, "repetition", 1),
                                        .presence = (float)param(dir, "presence", 0),
                                        .frequency = (float)param(dir, "frequency", 0),
                                        .bias_off = 0, .n_bias = nb, .seen_off = nb, .n_seen = ns,
                                        .out_off = nb + ns, .n_out = no, .want_logprob = P("want_logprob")};
        kaon_sample_batch sb = {.n_rows = D, .rows = rows, .n_entries = n_ent, .entry_token = et, .entry_value = ev};
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)D);
        float *lps = malloc(sizeof(float) * (size_t)D), *idf = malloc(sizeof(float) * (size_t)D);
        if (!o->sample || o->sample(be, dl.data, V, &sb, ids, lps)) die("sample failed%s", "");
        for (int d = 0; d < D; d++) idf[d] = (float)ids[d];
        write_f32(dir, "out.bin", idf, (size_t)D);
        write_f32(dir, "out_lp.bin", lps, (size_t)D);
    } else if (!strcmp(op, "moe")) {
        // Stacked experts: gate, up [E*F, dim], down [E*dim, F] (views per expert), router
        // [E, dim]; optional shared expert; optional positions (< 0: padding). Outputs out
        // [n, dim] and the expert counters (as floats). e1 > 0: expert parallel, the op runs
        // experts [e0, e1) only; as a rank's upload (model/moe.c) the device then holds only their
        // rows (bf16; views from expert e0's first row) and the other experts' views are empty.
        int n = P("n"), dim = P("dim"), E = P("E"), K = P("K"), F = P("F"), SF = P("SF");
        float *x = need(dir, "x.bin", (size_t)n * dim * 4);
        void *dx = dev_bf16(x, n, dim);
        const kaon_tensor rt = dev_matrix(need(dir, "router.bin", (size_t)E * dim * 4), E, dim);
        const kaon_linear router = kaon_linear_of(&rt, NULL);
        // fp8 1: e4m3 experts (gate8.bin, up8.bin, down8.bin u8 codes; gate_s.bin ... f32 scales in
        // blocks of [sb0, sb1]; act: their kaon_act_quant), uploaded as model/moe.c uploads them.
        const bool fp8 = P("fp8") != 0;
        const int h0 = P("e1") > 0 && !fp8 ? P("e0") : 0, h1 = P("e1") > 0 && !fp8 ? P("e1") : E;  // experts held
        kaon_linear sl[3];
        if (fp8) {
            sl[0] = fp8_layer(dir, "gate8.bin", "gate_s.bin", E * F, dim);
            sl[1] = fp8_layer(dir, "up8.bin", "up_s.bin", E * F, dim);
            sl[2] = fp8_layer(dir, "down8.bin", "down_s.bin", E * dim, F);
        } else {
            const size_t per = (size_t)F * dim, held = (size_t)(h1 - h0);
            sl[0] = kaon_linear_of((kaon_tensor[]){dev_matrix((const float *)need(dir, "gate.bin", E * per * 4) + h0 * per, (int64_t)held * F, dim)}, NULL);
            sl[1] = kaon_linear_of((kaon_tensor[]){dev_matrix((const float *)need(dir, "up.bin", E * per * 4) + h0 * per, (int64_t)held * F, dim)}, NULL);
            sl[2] = kaon_linear_of((kaon_tensor[]){dev_matrix((const float *)need(dir, "down.bin", E * per * 4) + h0 * per, (int64_t)held * dim, F)}, NULL);
        }
        kaon_linear *views = calloc((size_t)3 * E, sizeof *views);
        for (int k = 0; k < 3; k++)
            for (int e = h0; e < h1; e++) {
                const int64_t rows = k == 2 ? dim : F, cols = k == 2 ? F : dim;
                const size_t eb = fp8 ? 1 : on_cpu ? 4 : 2;
                kaon_linear *v = &views[k * E + e];
                *v = sl[k];
                v->w.shape[0] = rows;
                v->w.data = (char *)sl[k].w.data + (size_t)(e - h0) * rows * cols * eb;
                v->w.nbytes = (size_t)rows * cols * eb;
                if (fp8) {  // expert e's scale rows
                    const int64_t er = rows / sl[k].scale_block[0], ec = sl[k].scale.shape[1];
                    v->scale.shape[0] = er;
                    v->scale.data = (float *)sl[k].scale.data + (size_t)(e * er * ec);
                    v->scale.nbytes = (size_t)(er * ec) * 4;
                }
            }
        kaon_moe_weights w = {.n_experts = E, .top_k = K, .norm_topk = P("norm") != 0, .router = &router,
                              .gate = views, .up = views + E, .down = views + 2 * E, .e0 = P("e0"), .e1 = P("e1")};
        // DeepSeekMoE routing (all zero: softmax top-k as Mixtral / Qwen).
        w.scoring = P("scoring");
        w.n_group = P("n_group");
        w.topk_group = P("topk_group");
        w.group_top2 = P("group_top2") != 0;
        w.routed_scale = (float)param(dir, "routed_scale", 0.0);
        kaon_tensor sbias;
        if (P("has_bias")) {
            sbias = dev_vector(need(dir, "bias.bin", (size_t)E * 4), E);
            w.score_bias = &sbias;
        }
        kaon_linear sh[4];
        if (SF && fp8) {  // an FP8 shared expert beside FP8 experts
            sh[0] = fp8_layer(dir, "sgate8.bin", "sgate_s.bin", SF, dim);
            sh[1] = fp8_layer(dir, "sup8.bin", "sup_s.bin", SF, dim);
            sh[2] = fp8_layer(dir, "sdown8.bin", "sdown_s.bin", dim, SF);
        } else if (SF) {
            const kaon_tensor t[3] = {dev_matrix(need(dir, "sgate.bin", (size_t)SF * dim * 4), SF, dim),
                                      dev_matrix(need(dir, "sup.bin", (size_t)SF * dim * 4), SF, dim),
                                      dev_matrix(need(dir, "sdown.bin", (size_t)dim * SF * 4), dim, SF)};
            for (int i = 0; i < 3; i++) sh[i] = kaon_linear_of(&t[i], NULL);
        }
        if (SF) {
            w.shared_gate = &sh[0];
            w.shared_up = &sh[1];
            w.shared_down = &sh[2];
            if (param(dir, "shared_gated", 1) != 0) {  // 0: no gate (DeepSeek's shared experts)
                const kaon_tensor g = dev_matrix(need(dir, "sgi.bin", (size_t)dim * 4), 1, dim);
                sh[3] = kaon_linear_of(&g, NULL);
                w.shared_gate_inp = &sh[3];
            }
        }
        int32_t *pos = P("has_pos") ? need(dir, "pos.bin", (size_t)n * 4) : NULL;
        uint32_t *cnt = o->alloc(be, (size_t)E * 4);
        void *dout = dev_bf16(NULL, n, dim);
        const int reps = P("reps") > 0 ? P("reps") : 1;  // > 1: the same call again (counts add up)
        for (int r = 0; r < reps; r++)
            if (!o->moe || o->moe(be, dx, n, pos, &w, cnt, dout)) die("moe failed%s", "");
        save_dev(dir, "out.bin", dout, (size_t)n * dim);
        uint32_t *hc = malloc((size_t)E * 4);
        float *fc = malloc((size_t)E * 4);
        if (o->copy_f32_to_host) o->copy_f32_to_host(be, (const float *)(void *)cnt, (size_t)E, (float *)(void *)hc);
        else memcpy(hc, cnt, (size_t)E * 4);
        for (int e = 0; e < E; e++) fc[e] = (float)hc[e];
        write_f32(dir, "out_counts.bin", fc, (size_t)E);
        if (P("time") > 0) {  // us per call, after the above warmed everything up
            float f;
            o->to_host_f32(be, dout, 1, &f);
            double t0 = now_s();
            for (int r = 0; r < P("time"); r++) o->moe(be, dx, n, pos, &w, NULL, dout);
            o->to_host_f32(be, dout, 1, &f);
            printf("{\"us\": %.2f}\n", (now_s() - t0) / P("time") * 1e6);
        }
    } else if (!strcmp(op, "copy_strided")) {
        // dst (poisoned, src_off + rows * dst_stride elements) <- s * src rows; out.bin is all of dst.
        int rows = P("rows"), width = P("width"), so = P("src_off"), dof = P("dst_off");
        size_t ss = (size_t)P("src_stride"), ds = (size_t)P("dst_stride");
        size_t nsrc = (size_t)so + (size_t)rows * ss, ndst = (size_t)dof + (size_t)rows * ds;
        char *src = dev_bf16(need(dir, "x.bin", nsrc * 4), 1, (int64_t)nsrc);
        char *dst = dev_bf16(NULL, 1, (int64_t)ndst);
        o->copy_strided(be, src + (size_t)so * o->act_elem_bytes, ss, dst + (size_t)dof * o->act_elem_bytes, ds, rows,
                        width, (float)param(dir, "s", 1.0));
        save_dev(dir, "out.bin", dst, ndst);
    } else if (!strcmp(op, "head_linear")) {
        // y (poisoned) [y_off + n * y_tok] <- per-head products of x [x_off + n * x_tok]; w [nh * out, in]
        // from w.bin (bf16), or GGUF blocks raw.bin when qtype > 0. reps > 1: the call again.
        int n = P("n"), nh = P("nh"), in = P("in"), out = P("out"), xo = P("x_off"), yo = P("y_off");
        size_t xt = (size_t)P("x_tok"), xh = (size_t)P("x_head"), yt = (size_t)P("y_tok"), yh = (size_t)P("y_head");
        size_t nx = (size_t)xo + (size_t)n * xt, ny = (size_t)yo + (size_t)n * yt;
        char *x = dev_bf16(need(dir, "x.bin", nx * 4), 1, (int64_t)nx);
        kaon_tensor w = P("qtype") > 0 ? q_upload_raw(dir, "raw.bin", P("qtype"), (int64_t)nh * out, in)
                                       : dev_matrix(need(dir, "w.bin", (size_t)nh * out * in * 4), (int64_t)nh * out, in);
        char *y = dev_bf16(NULL, 1, (int64_t)ny);
        const kaon_linear wl = kaon_linear_of(&w, NULL);
        for (int r = 0; r < (P("reps") > 1 ? P("reps") : 1); r++)
            o->head_linear(be, x + (size_t)xo * o->act_elem_bytes, n, nh, xt, xh, &wl, y + (size_t)yo * o->act_elem_bytes,
                           yt, yh);
        save_dev(dir, "out.bin", y, ny);
    } else if (!strcmp(op, "mla")) {
        // MLA's latent cache: context rows go in first (kv_write without V, loose index copies);
        // then one step of T tokens through begin_step: kv_write of their rows + mla_attention.
        int T = P("T"), S = P("n_seqs"), nh = P("nh"), kvl = P("kvl"), rd = P("rd"), bs = P("bs");
        int n_blocks = P("n_blocks"), mb = P("max_blocks"), C = P("n_ctx"), D = kvl + rd;
        float scale = (float)param(dir, "scale", 1.0);
        kaon_kv_layer kv = {o->alloc(be, (size_t)n_blocks * bs * D * o->act_elem_bytes), NULL, KAON_KV_NATIVE, 1.0f, 1.0f};
        if (!kv.k) die("alloc%s", "");
        int32_t *tables = need(dir, "tables.bin", (size_t)S * mb * 4);
        if (C > 0) {
            int32_t *cslot = need(dir, "ctx_slot.bin", (size_t)C * 4);
            void *crow = dev_bf16(need(dir, "ctx_row.bin", (size_t)C * D * 4), C, D);
            kaon_attn_meta cm = {.n_tokens = C, .n_seqs = S, .slot_mapping = cslot,
                                 .block_tables = tables, .max_blocks = mb, .block_size = bs};
            o->kv_write(be, &kv, crow, NULL, &cm, 1, D);
        }
        int32_t *pos = need(dir, "pos.bin", (size_t)T * 4), *seq = need(dir, "seq.bin", (size_t)T * 4);
        int32_t *slot = need(dir, "slot.bin", (size_t)T * 4);
        void *q = dev_bf16(need(dir, "q.bin", (size_t)T * nh * D * 4), T, (int64_t)nh * D);
        void *row = dev_bf16(need(dir, "row.bin", (size_t)T * D * 4), T, D);
        kaon_attn_meta m = {.n_tokens = T, .n_seqs = S, .positions = pos, .token_seq = seq,
                            .slot_mapping = slot, .block_tables = tables, .max_blocks = mb,
                            .block_size = bs};
        if (o->begin_step && o->begin_step(be, NULL, &m, NULL, 0)) die("begin_step%s", "");
        o->kv_write(be, &kv, row, NULL, &m, 1, D);
        void *out = dev_bf16(NULL, T, (int64_t)nh * kvl);
        if (!o->mla_attention) die("no mla_attention%s", "");
        o->mla_attention(be, q, &kv, &m, nh, kvl, rd, scale, out);
        save_dev(dir, "out.bin", out, (size_t)T * nh * kvl);
        if (P("save_cache")) save_dev(dir, "out_cache.bin", kv.k, (size_t)n_blocks * bs * D);
    } else if (!strcmp(op, "dequant")) {
        int type = P("type"), rows = P("rows"), cols = P("cols");
        size_t len = 0;
        void *raw = read_all(dir, "raw.bin", &len);
        if (!raw) die("no raw.bin%s", "");
        kaon_tensor t = {.dtype = kaon_dtype_from_ggml((uint32_t)type), .ndim = 2, .shape = {rows, cols}, .data = raw,
                         .nbytes = len};
        kaon_tensor d;
        if (o->upload(be, &t, &d)) die("upload%s", "");
        if (d.dtype == KAON_BF16) save_dev(dir, "out.bin", d.data, (size_t)rows * cols);
        else q_dequant_save(dir, &d, rows, cols);  // kept quantized: its rows through embed
    } else if (!run_qop(dir, op) && !run_fp8op(dir, op) && !run_i4op(dir, op)) {  // quantized weights (gpu_driver_quant.c, _fp8.c, _int4.c)
        die("unknown op '%s'", op);
    }
#undef P
    if (o->status && o->status(be)) die("op failed%s", "");
    o->destroy(be);
    return 0;
}

// ---- kernel timings ---------------------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Waits for the stream: a one-element copy to the host.
static void sync_dev(const void *d) {
    float f;
    be->ops->to_host_f32(be, d, 1, &f);
}

// MLA attention on DeepSeek's latent cache (kv_lora 512 + rope 64): T decode tokens, each the
// last of its own sequence of L cached rows (64-token blocks), nh heads: us per call, GB/s of
// latent rows read (T L 576 2 bytes) and TFLOP/s (2 (576 + 512) per head and key).
// KAON_MLA_GENERIC=1 times the generic kernel instead.
static void mla_timings(void) {
    const kaon_backend_ops *o = be->ops;
    const int D = 576, kvl = 512, bs = 64;
    const int Ts[] = {1, 64}, Ls[] = {4096, 32768}, heads[] = {16, 64, 128};
    const char *gen = getenv("KAON_MLA_GENERIC");
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++)
            for (int h = 0; h < 3; h++) {
                const int T = Ts[a], L = Ls[c], nh = heads[h], per = L / bs, nb = T * per;
                kaon_tensor cl = {.dtype = KAON_BF16, .ndim = 2, .shape = {(int64_t)nb * bs, D}};
                kaon_tensor ql = {.dtype = KAON_BF16, .ndim = 2, .shape = {T, (int64_t)nh * D}};
                kaon_tensor ct, qt;
                if (o->fill_dummy(be, &cl, NULL, 41 + c, 1.0f, 0.0f, &ct) || o->fill_dummy(be, &ql, NULL, 51 + h, 1.0f, 0.0f, &qt))
                    die("fill%s", "");
                void *y = o->alloc(be, (size_t)T * nh * kvl * 2);
                int32_t *tab = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * 3 * (size_t)T);
                int32_t *seq = pos + T, *slot = seq + T;
                for (int i = 0; i < nb; i++) tab[i] = i;
                for (int t = 0; t < T; t++) {
                    pos[t] = L - 1;
                    seq[t] = t;
                    slot[t] = t * per * bs + L - 1;
                }
                kaon_attn_meta m = {.n_tokens = T, .n_seqs = T, .positions = pos, .token_seq = seq,
                                    .slot_mapping = slot, .block_tables = tab, .max_blocks = per, .block_size = bs};
                kaon_kv_layer kv = {ct.data, NULL, KAON_KV_NATIVE, 1.0f, 1.0f};
                if (o->begin_step(be, NULL, &m, NULL, 0)) die("begin_step%s", "");
                const float scale = 0.1352f;
                for (int it = 0; it < 3; it++) o->mla_attention(be, qt.data, &kv, &m, nh, kvl, D - kvl, scale, y);
                sync_dev(y);
                double t0 = now_s();
                o->mla_attention(be, qt.data, &kv, &m, nh, kvl, D - kvl, scale, y);
                sync_dev(y);
                const double one = now_s() - t0;
                int reps = one > 0.1 ? 1 : (int)(0.1 / (one > 1e-6 ? one : 1e-6)) + 1;
                if (reps > 100) reps = 100;
                if (getenv("KAON_TIMING_REPS")) reps = atoi(getenv("KAON_TIMING_REPS"));  // fixed (ncu)
                t0 = now_s();
                for (int it = 0; it < reps; it++) o->mla_attention(be, qt.data, &kv, &m, nh, kvl, D - kvl, scale, y);
                sync_dev(y);
                const double dt = (now_s() - t0) / reps;
                printf("{\"timing\": \"mla_attention\", \"kernel\": \"%s\", \"T\": %d, \"ctx\": %d, \"nh\": %d, "
                       "\"reps\": %d, \"us\": %.1f, \"GBps\": %.1f, \"TFLOPs\": %.1f}\n",
                       gen && !strcmp(gen, "1") ? "generic" : "default", T, L, nh, reps, dt * 1e6,
                       (double)T * L * D * 2 / dt / 1e9, (double)T * nh * L * 2.0 * (D + kvl) / dt / 1e12);
                fflush(stdout);
                if (o->status(be)) die("mla_attention failed%s", "");
                o->release(be, &ct);
                o->release(be, &qt);
                o->free(be, y);
                free(tab);
                free(pos);
            }
}

// Decode-shaped matrix-vector products of Llama-3.1-8B and its attention at a few contexts:
// GB/s of weights (or KV) read, one JSON line each; then mla_timings. only_mla: that alone.
static int run_timings(bool only_mla) {
    be = kaon_backend_cuda_create(0);
    if (!be) die("no backend%s", "");
    const kaon_backend_ops *o = be->ops;
    if (only_mla) {
        mla_timings();
        o->destroy(be);
        return 0;
    }
    struct { int rows, in, silu, n; } shapes[] = {
        {4096, 4096, 0, 1}, {1024, 4096, 0, 1}, {14336, 4096, 1, 1}, {4096, 14336, 0, 1},
        {128256, 4096, 0, 1}, {6144, 4096, 0, 1}, {4096, 4096, 0, 4}, {4096, 4096, 0, 8},
        {4096, 4096, 0, 16}, {14336, 4096, 0, 64}};
    void *y = o->alloc(be, (size_t)64 * 128256 * 2);
    kaon_tensor xt = {.dtype = KAON_BF16, .ndim = 2, .shape = {64, 14336}}, xd;
    if (o->fill_dummy(be, &xt, NULL, 7, 1.0f, 0.0f, &xd)) die("fill%s", "");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        kaon_tensor like = {.dtype = KAON_BF16, .ndim = 2, .shape = {shapes[i].rows, shapes[i].in}};
        kaon_tensor wt, wt2;
        if (o->fill_dummy(be, &like, NULL, 1 + i, 0.01f, 0.0f, &wt) || o->fill_dummy(be, &like, NULL, 99 + i, 0.01f, 0.0f, &wt2))
            die("fill%s", "");
        const kaon_linear w = kaon_linear_of(&wt, NULL), w2 = kaon_linear_of(&wt2, NULL);
        const int n = shapes[i].n, reps = 50;
        for (int it = 0; it < 5; it++) {  // warm-up (and cuBLAS's algorithm choice)
            if (shapes[i].silu) {
                if (o->linear_silu_mul(be, xd.data, n, &w, &w2, y) != 0) die("silu gemv declined%s", "");
            } else {
                o->linear(be, xd.data, n, &w, y);
            }
        }
        sync_dev(y);
        double t0 = now_s();
        for (int it = 0; it < reps; it++) {
            if (shapes[i].silu) o->linear_silu_mul(be, xd.data, n, &w, &w2, y);
            else o->linear(be, xd.data, n, &w, y);
        }
        sync_dev(y);
        double dt = (now_s() - t0) / reps;
        double bytes = (double)shapes[i].rows * shapes[i].in * 2 * (shapes[i].silu ? 2 : 1);
        printf("{\"timing\": \"linear\", \"rows\": %d, \"in\": %d, \"silu\": %d, \"n\": %d, \"us\": %.2f, "
               "\"GBps\": %.1f}\n", shapes[i].rows, shapes[i].in, shapes[i].silu, n, dt * 1e6, bytes / dt / 1e9);
        o->release(be, &wt);
        o->release(be, &wt2);
    }
    // Attention: one decode token, 32 q heads over 8 KV heads, context L.
    const int nh = 32, nkv = 8, hd = 128, bs = 16;
    int ctxs[] = {512, 4096, 32768};
    for (int c = 0; c < 3; c++) {
        int L = ctxs[c], nb = L / bs + 1;
        kaon_kv_layer kv = {o->alloc(be, (size_t)nb * bs * nkv * hd * 2), o->alloc(be, (size_t)nb * bs * nkv * hd * 2), KAON_KV_NATIVE, 1.0f, 1.0f};
        int32_t *tab = malloc(sizeof(int32_t) * nb), pos = L - 1, seq = 0, slot = L - 1;
        for (int i = 0; i < nb; i++) tab[i] = i;
        kaon_attn_meta m = {.n_tokens = 1, .n_seqs = 1, .positions = &pos, .token_seq = &seq,
                            .slot_mapping = &slot, .block_tables = tab, .max_blocks = nb, .block_size = bs};
        if (o->begin_step(be, NULL, &m, NULL, 0)) die("begin_step%s", "");
        for (int it = 0; it < 5; it++) o->attention(be, xd.data, &kv, &m, nh, nkv, hd, 0.088f, 0, y);
        sync_dev(y);
        double t0 = now_s();
        for (int it = 0; it < 50; it++) o->attention(be, xd.data, &kv, &m, nh, nkv, hd, 0.088f, 0, y);
        sync_dev(y);
        double dt = (now_s() - t0) / 50;
        printf("{\"timing\": \"attention\", \"ctx\": %d, \"us\": %.2f, \"GBps\": %.1f}\n", L, dt * 1e6,
               (double)L * nkv * hd * 4 / dt / 1e9);
        o->free(be, kv.k);
        o->free(be, kv.v);
        free(tab);
    }
    if (o->status(be)) die("timings failed%s", "");
    mla_timings();
    o->destroy(be);
    return 0;
}

// Decode attention as a batched step runs it: B sequences, one new token each at context L, their
// KV blocks scattered over the cache (Llama-3.1-8B's heads by default; fp8: an e4m3 cache).
// GB/s counts the K and V bytes the step must read (B x L x nkv x hd x 2 x element size).
static int run_dec_bench(int nh, int nkv, int hd, bool fp8) {
    be = kaon_backend_cuda_create(0);
    if (!be) die("no backend%s", "");
    const kaon_backend_ops *o = be->ops;
    const int bs = 16, esz = fp8 ? 1 : 2;
    struct { int B, L; } cases[] = {{1, 1024}, {1, 4096}, {1, 32768}, {64, 1024}, {64, 2048}, {64, 4096},
                                    {256, 1024}, {256, 1536}, {256, 2048}, {1, 64}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int B = cases[c].B, L = cases[c].L, nbs = (L + bs - 1) / bs, nb = B * nbs;
        const size_t kv_bytes = (size_t)nb * bs * nkv * hd * esz;
        kaon_kv_layer kv = {o->alloc(be, kv_bytes), o->alloc(be, kv_bytes), fp8 ? KAON_KV_FP8 : KAON_KV_NATIVE, 1.0f, 1.0f};
        if (!kv.k || !kv.v) die("alloc%s", "");
        int32_t *tab = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)B * 3);
        int32_t *seq = pos + B, *slot = seq + B;
        // Block i of sequence s sits at a pseudo-random place (a permutation of all blocks).
        for (int i = 0; i < nb; i++) tab[i] = (int)(((int64_t)i * 7919) % nb);
        for (int s = 0; s < B; s++) {
            pos[s] = L - 1;
            seq[s] = s;
            slot[s] = tab[s * nbs + (L - 1) / bs] * bs + (L - 1) % bs;
        }
        kaon_attn_meta m = {.n_tokens = B, .n_seqs = B, .positions = pos, .token_seq = seq,
                            .slot_mapping = slot, .block_tables = tab, .max_blocks = nbs, .block_size = bs};
        kaon_tensor ql = {.dtype = KAON_BF16, .ndim = 2, .shape = {B, (int64_t)nh * hd}}, qt;
        if (o->fill_dummy(be, &ql, NULL, 41 + c, 1.0f, 0.0f, &qt)) die("fill%s", "");
        void *y = o->alloc(be, (size_t)B * nh * hd * 2);
        if (o->begin_step(be, NULL, &m, NULL, 0)) die("begin_step%s", "");
        const float scale = 1.0f / sqrtf((float)hd);
        for (int it = 0; it < 5; it++) o->attention(be, qt.data, &kv, &m, nh, nkv, hd, scale, 0, y);
        sync_dev(y);
        const int reps = 50;
        double t0 = now_s();
        for (int it = 0; it < reps; it++) o->attention(be, qt.data, &kv, &m, nh, nkv, hd, scale, 0, y);
        sync_dev(y);
        double dt = (now_s() - t0) / reps;
        printf("{\"timing\": \"attn_decode\", \"kv\": \"%s\", \"B\": %d, \"ctx\": %d, \"nh\": %d, \"nkv\": %d, "
               "\"hd\": %d, \"us\": %.2f, \"GBps\": %.1f}\n", fp8 ? "fp8" : "bf16", B, L, nh, nkv, hd, dt * 1e6,
               (double)B * L * nkv * hd * 2 * esz / dt / 1e9);
        fflush(stdout);
        if (o->status(be)) die("attention failed%s", "");
        o->release(be, &qt);
        o->free(be, y);
        o->free(be, kv.k);
        o->free(be, kv.v);
        free(tab);
        free(pos);
    }
    o->destroy(be);
    return 0;
}

// Prefill attention: one sequence whose T new tokens sit at positions p0..p0+T-1 (the cache
// holds 0..p0+T-1: random values), Llama-3.1-8B's heads by default. Causal FLOPs: 4 hd nh per
// (query, key) pair, keys 0..p for the query at p (the last `window` of them when window > 0).
static int run_attn_bench(int nh, int nkv, int hd, int max_t, int window, bool fp8) {
    be = kaon_backend_cuda_create(0);
    if (!be) die("no backend%s", "");
    const kaon_backend_ops *o = be->ops;
    const int bs = 16;
    const char *only_env = getenv("KAON_ATTN_BENCH_T");  // one case (profilers: its first launch)
    const int only = only_env ? atoi(only_env) : 0;
    struct { int T, p0; } cases[] = {{1024, 0}, {4096, 0}, {8192, 0}, {16384, 0}, {2048, 6144}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int T = cases[c].T, p0 = cases[c].p0, L = p0 + T, nb = (L + bs - 1) / bs;
        if (T > max_t || (only > 0 && T != only)) continue;
        kaon_tensor kl = {.dtype = KAON_BF16, .ndim = 2, .shape = {(int64_t)nb * bs, (int64_t)nkv * hd}};
        kaon_tensor ql = {.dtype = KAON_BF16, .ndim = 2, .shape = {T, (int64_t)nh * hd}};
        kaon_tensor kt, vt, qt;
        if (o->fill_dummy(be, &kl, NULL, 11 + c, 1.0f, 0.0f, &kt) || o->fill_dummy(be, &kl, NULL, 21 + c, 1.0f, 0.0f, &vt) ||
            o->fill_dummy(be, &ql, NULL, 31 + c, 1.0f, 0.0f, &qt))
            die("fill%s", "");
        void *y = o->alloc(be, (size_t)T * nh * hd * 2);
        if (!y) die("alloc%s", "");
        kaon_kv_layer kv = {kt.data, vt.data, KAON_KV_NATIVE, 1.0f, 1.0f};
        if (fp8) {  // the same values as e4m3 codes: kv_write of every slot into a cache of bytes
            const size_t n8 = (size_t)nb * bs * nkv * hd;
            kv = (kaon_kv_layer){o->alloc(be, n8), o->alloc(be, n8), KAON_KV_FP8, 1.0f, 1.0f};
            int32_t *all = malloc(sizeof(int32_t) * (size_t)nb * bs);
            if (!kv.k || !kv.v || !all) die("alloc%s", "");
            for (int i = 0; i < nb * bs; i++) all[i] = i;
            kaon_attn_meta wm = {.n_tokens = nb * bs, .n_seqs = 1, .slot_mapping = all};
            o->kv_write(be, &kv, kt.data, vt.data, &wm, nkv, hd);
            sync_dev(kt.data);  // (before the slot list is freed)
            free(all);
        }
        int32_t *tab = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)T * 3);
        int32_t *seq = pos + T, *slot = seq + T;
        for (int i = 0; i < nb; i++) tab[i] = nb - 1 - i;  // scattered blocks
        for (int i = 0; i < T; i++) {
            pos[i] = p0 + i;
            seq[i] = 0;
            slot[i] = tab[(p0 + i) / bs] * bs + (p0 + i) % bs;
        }
        kaon_attn_meta m = {.n_tokens = T, .n_seqs = 1, .positions = pos, .token_seq = seq,
                            .slot_mapping = slot, .block_tables = tab, .max_blocks = nb, .block_size = bs};
        if (o->begin_step(be, NULL, &m, NULL, 0)) die("begin_step%s", "");
        const float scale = 1.0f / sqrtf((float)hd);
        o->attention(be, qt.data, &kv, &m, nh, nkv, hd, scale, window, y);  // warm-up
        sync_dev(y);
        double t0 = now_s();
        o->attention(be, qt.data, &kv, &m, nh, nkv, hd, scale, window, y);
        sync_dev(y);
        double one = now_s() - t0;
        int reps = one > 0.2 ? 1 : (int)(0.2 / (one > 1e-6 ? one : 1e-6)) + 1;
        if (reps > 200) reps = 200;
        t0 = now_s();
        for (int it = 0; it < reps; it++) o->attention(be, qt.data, &kv, &m, nh, nkv, hd, scale, window, y);
        sync_dev(y);
        double dt = (now_s() - t0) / reps;
        double pairs = 0.0;
        for (int i = 0; i < T; i++) pairs += window > 0 && p0 + i + 1 > window ? window : p0 + i + 1;
        double flops = 4.0 * hd * nh * pairs;
        const char *fa = getenv("KAON_FA"), *fa8 = getenv("KAON_FA_FP8");
        const bool off = (fa && !strcmp(fa, "0")) || (fp8 && fa8 && !strcmp(fa8, "0"));
        printf("{\"timing\": \"attn_prefill\", \"kernel\": \"%s\", \"kv\": \"%s\", \"T\": %d, \"p0\": %d, "
               "\"nh\": %d, \"nkv\": %d, \"hd\": %d, \"window\": %d, \"reps\": %d, \"us\": %.1f, "
               "\"TFLOPs\": %.1f}\n",
               off ? (fp8 ? "decode" : "split-k") : "fa", fp8 ? "fp8" : "bf16", T, p0, nh, nkv, hd, window, reps,
               dt * 1e6, flops / dt / 1e12);
        fflush(stdout);
        if (o->status(be)) die("attention failed%s", "");
        if (fp8) {
            o->free(be, kv.k);
            o->free(be, kv.v);
        }
        o->release(be, &kt);
        o->release(be, &vt);
        o->release(be, &qt);
        o->free(be, y);
        free(tab);
        free(pos);
    }
    if (o->status(be)) die("attn_bench failed%s", "");
    o->destroy(be);
    return 0;
}

// ---- models -----------------------------------------------------------------------------------

static int parse_ids(const char *s, int32_t **out) {
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        if (n == cap) ids = realloc(ids, sizeof *ids * (size_t)(cap *= 2));
        ids[n++] = (int32_t)v;
        s = end;
        while (*s == ',' || *s == ' ' || *s == '\n') s++;
    }
    *out = ids;
    return n;
}

static kaon_model *load(const char *path, bool dummy) {
    kaon_model *m = dummy ? kaon_model_load_dummy(path) : kaon_model_load(path);
    if (!m) die("cannot load %s", path);
    return m;
}

static kaon_backend *make_backend(const char *dev) {
    kaon_backend *b = !strcmp(dev, "cuda") ? kaon_backend_cuda_create(0) : kaon_backend_cpu_create(0);
    if (!b) die("no backend %s", dev);
    return b;
}

// One sequence fed `chunk` tokens per step; logits of every position.
static int run_logits(const char *path, const char *dev, int chunk, const char *ids_s, const char *out,
                      bool dummy) {
    kaon_model *m = load(path, dummy);
    be = make_backend(dev);
    int32_t *ids;
    int n = parse_ids(ids_s, &ids);
    const int bs = 16, nb = (n + bs - 1) / bs + 1, V = m->cfg.vocab_size;
    if (chunk < 1 || chunk > n) chunk = n;
    kaon_runner *r = kaon_runner_create(m, be, chunk, chunk, nb, bs);
    if (!r) die("runner%s", "");
    int32_t *table = malloc(sizeof *table * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;  // scattered blocks
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)chunk * 4), *slot = pos + chunk, *seq = slot + chunk,
            *rows = seq + chunk;
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    for (int done = 0; done < n;) {
        int k = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < k; i++) {
            int p = done + i;
            pos[i] = p;
            slot[i] = table[p / bs] * bs + p % bs;
            seq[i] = 0;
            rows[i] = i;
        }
        kaon_batch b = {.n_tokens = k, .tokens = ids + done,
                        .attn = {.n_tokens = k, .n_seqs = 1, .positions = pos, .token_seq = seq,
                                 .slot_mapping = slot, .block_tables = table, .max_blocks = nb,
                                 .block_size = bs},
                        .n_logits = k, .logit_rows = rows};
        if (kaon_runner_forward(r, &b, logits + (size_t)done * V)) die("forward%s", "");
        done += k;
    }
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(logits, sizeof(float) * V, (size_t)n, f) != (size_t)n || fclose(f)) die("write %s", out);
    kaon_runner_free(r);
    be->ops->destroy(be);
    kaon_model_free(m);
    return 0;
}

// Several sequences sharing steps. Step s gives sequence i a chunk of 1 + (i + s) % 5 tokens
// (so prefill chunks and single-token decodes of different sequences meet in one batch).
static int run_batch(const char *path, const char *dev, const char *seqs_file, const char *out) {
    kaon_model *m = load(path, false);
    be = make_backend(dev);
    FILE *f = fopen(seqs_file, "r");
    if (!f) die("cannot read %s", seqs_file);
    int32_t *ids[64];
    int len[64], S = 0, total = 0, maxlen = 0;
    char line[1 << 16];
    while (S < 64 && fgets(line, sizeof line, f)) {
        len[S] = parse_ids(line, &ids[S]);
        if (len[S] == 0) continue;
        total += len[S];
        if (len[S] > maxlen) maxlen = len[S];
        S++;
    }
    fclose(f);
    const int bs = 8, mb = (maxlen + bs - 1) / bs, nb = S * mb, V = m->cfg.vocab_size;
    const int max_t = 5 * S;
    kaon_runner *r = kaon_runner_create(m, be, max_t, max_t, nb, bs);
    if (!r) die("runner%s", "");
    // Blocks dealt out in a scrambled order.
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)S * mb);
    for (int i = 0; i < S * mb; i++) tables[i] = (int32_t)((i * 7919L + 13) % nb);
    int32_t *tok = malloc(sizeof(int32_t) * max_t * 5), *pos = tok + max_t, *seq = pos + max_t,
            *slot = seq + max_t, *rows = slot + max_t;
    int *done = calloc((size_t)S, sizeof(int)), *row_seq = malloc(sizeof(int) * max_t),
        *row_pos = malloc(sizeof(int) * max_t);
    size_t *offset = malloc(sizeof(size_t) * (size_t)S);
    for (int i = 0, o = 0; i < S; o += len[i], i++) offset[i] = (size_t)o;
    float *logits = malloc(sizeof(float) * (size_t)max_t * V), *all = malloc(sizeof(float) * (size_t)total * V);
    for (int step = 0;; step++) {
        int T = 0;
        for (int i = 0; i < S; i++) {
            int k = 1 + (i + step) % 5;
            if (k > len[i] - done[i]) k = len[i] - done[i];
            for (int j = 0; j < k; j++, T++) {
                int p = done[i] + j;
                tok[T] = ids[i][p];
                pos[T] = p;
                seq[T] = i;
                slot[T] = tables[i * mb + p / bs] * bs + p % bs;
                rows[T] = T;
                row_seq[T] = i;
                row_pos[T] = p;
            }
            done[i] += k;
        }
        if (T == 0) break;
        kaon_batch b = {.n_tokens = T, .tokens = tok,
                        .attn = {.n_tokens = T, .n_seqs = S, .positions = pos, .token_seq = seq,
                                 .slot_mapping = slot, .block_tables = tables, .max_blocks = mb,
                                 .block_size = bs},
                        .n_logits = T, .logit_rows = rows};
        if (kaon_runner_forward(r, &b, logits)) die("forward%s", "");
        for (int t = 0; t < T; t++)
            memcpy(all + (offset[row_seq[t]] + (size_t)row_pos[t]) * V, logits + (size_t)t * V,
                   sizeof(float) * V);
    }
    FILE *o = fopen(out, "wb");
    if (!o || fwrite(all, sizeof(float) * V, (size_t)total, o) != (size_t)total || fclose(o)) die("write %s", out);
    kaon_runner_free(r);
    be->ops->destroy(be);
    kaon_model_free(m);
    return 0;
}

static int run_greedy(const char *path, const char *dev, const char *ids_s, int n_new) {
    kaon_model *m = load(path, false);
    be = make_backend(dev);
    int32_t *ids;
    int n = parse_ids(ids_s, &ids);
    ids = realloc(ids, sizeof(int32_t) * (size_t)(n + n_new + 1));
    const int bs = 16, nb = (n + n_new + bs) / bs + 1, V = m->cfg.vocab_size;
    kaon_runner *r = kaon_runner_create(m, be, n, 1, nb, bs);
    if (!r) die("runner%s", "");
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) table[i] = i;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n * 3), *slot = pos + n, *seq = slot + n;
    float *logits = malloc(sizeof(float) * V);
    printf("[");
    int fed = 0;
    for (int g = 0; g < n_new; g++) {
        int k = fed == 0 ? n : 1;
        for (int i = 0; i < k; i++) {
            pos[i] = slot[i] = fed + i;
            seq[i] = 0;
        }
        int32_t row = k - 1;
        kaon_batch b = {.n_tokens = k, .tokens = ids + fed,
                        .attn = {.n_tokens = k, .n_seqs = 1, .positions = pos, .token_seq = seq,
                                 .slot_mapping = slot, .block_tables = table, .max_blocks = nb,
                                 .block_size = bs},
                        .n_logits = 1, .logit_rows = &row};
        if (kaon_runner_forward(r, &b, logits)) die("forward%s", "");
        fed += k;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        // The top-2 margin, so the test can tell near-ties from real divergences.
        int second = best ? 0 : 1;
        for (int v = 0; v < V; v++)
            if (v != best && logits[v] > logits[second]) second = v;
        printf(g ? ", [%d, %.5f, %d]" : "[%d, %.5f, %d]", best, logits[best] - logits[second], second);
        ids[fed] = best;
    }
    printf("]\n");
    kaon_runner_free(r);
    be->ops->destroy(be);
    kaon_model_free(m);
    return 0;
}

#include "gpu_driver_quant.c"  // the quantized-weight ops and qtimings
#include "gpu_driver_fp8.c"    // the FP8 linear ops
#include "gpu_driver_int4.c"   // op i4linear

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "op")) return run_op(argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "qtimings")) return run_qtimings();
    if (argc >= 2 && !strcmp(argv[1], "timings")) return run_timings(argc > 2 && !strcmp(argv[2], "mla"));
    if (argc >= 2 && !strcmp(argv[1], "attn_bench"))
        return run_attn_bench(argc > 2 ? atoi(argv[2]) : 32, argc > 3 ? atoi(argv[3]) : 8,
                              argc > 4 ? atoi(argv[4]) : 128, argc > 5 ? atoi(argv[5]) : 16384,
                              argc > 6 ? atoi(argv[6]) : 0, argc > 7 && !strcmp(argv[7], "fp8"));
    if (argc >= 2 && !strcmp(argv[1], "dec_bench"))
        return run_dec_bench(argc > 2 ? atoi(argv[2]) : 32, argc > 3 ? atoi(argv[3]) : 8,
                             argc > 4 ? atoi(argv[4]) : 128, argc > 5 && !strcmp(argv[5], "fp8"));
    if (argc >= 7 && !strcmp(argv[1], "logits"))
        return run_logits(argv[2], argv[3], atoi(argv[4]), argv[5], argv[6], argc > 7 && !strcmp(argv[7], "dummy"));
    if (argc >= 6 && !strcmp(argv[1], "batch")) return run_batch(argv[2], argv[3], argv[4], argv[5]);
    if (argc >= 6 && !strcmp(argv[1], "greedy")) return run_greedy(argv[2], argv[3], argv[4], atoi(argv[5]));
    fprintf(stderr, "usage: see the comment at the top of tests/gpu/gpu_driver.c\n");
    return 2;
}
