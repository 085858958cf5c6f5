// Quantized-weight ops and timings of gpu_driver (included by gpu_driver.c after its helpers;
// not a translation unit of its own). The CUDA backend keeps GGUF matrices of every block format
// quantized (src/backend/cuda/cuda_quant.cu). Types in params are GGUF's ggml type ids.
//
//   op qlinear  type out in ns [has_bias f32out]   raw.bin (GGUF blocks), x.bin [max n, in],
//                                                  b.bin -> out_<n>.bin [n, out] for n in ns
//   op qmulti   t0 t1 t2 out0 out1 out2 in ns [has_bias]   raw<k>.bin, b<k>.bin (type 30: raw
//                                                  bf16 rows) -> out<k>_<n>.bin
//   op qsilu    tg tu out in ns                    rawg.bin, rawu.bin -> out_<n>.bin
//   qtimings                                        decode-shaped quantized GEMV timings (JSON)
// ns: a comma list of batch sizes; x.bin holds max(ns) rows, each n uses the first n.

// (KAON_OP_DEVICE=cpu: the CPU backend uses the GGUF blocks in place.)
static kaon_tensor q_upload_raw(const char *dir, const char *name, int type, int64_t rows, int64_t cols) {
    size_t len = 0;
    void *raw = read_all(dir, name, &len);
    if (!raw) die("no %s", name);
    kaon_tensor t = {.dtype = kaon_dtype_from_ggml((uint32_t)type), .ndim = 2, .shape = {rows, cols}, .data = raw,
                     .nbytes = len};
    if (kaon_dtype_row_bytes(t.dtype, cols) * (size_t)rows != len) die("%s: wrong size", name);
    if (on_cpu) return t;
    kaon_tensor d;
    if (be->ops->upload(be, &t, &d)) die("upload %s", name);
    free(raw);
    return d;
}

// An output buffer of n elements poisoned with NaN: bf16 activations, or f32 (as linear_f32 writes).
static void *q_poisoned(size_t n, bool f32) {
    if (!f32 || on_cpu) return dev_bf16(NULL, 1, (int64_t)n);
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    kaon_tensor v = dev_vector(h, (int64_t)n);
    free(h);
    return v.data;
}

static void q_save(const char *dir, const char *name, const void *d, size_t n, bool f32) {
    if (!f32 || on_cpu) {
        save_dev(dir, name, d, n);
        return;
    }
    float *h = malloc(n * sizeof(float));
    be->ops->copy_f32_to_host(be, d, n, h);
    if (be->ops->status(be)) die("op failed%s", "");
    write_f32(dir, name, h, n);
    free(h);
}

// The dequant op for a weight the backend kept quantized: its rows through embed.
static void q_dequant_save(const char *dir, const kaon_tensor *d, int rows, int cols) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)rows);
    for (int i = 0; i < rows; i++) ids[i] = i;
    void *out = dev_bf16(NULL, rows, cols);
    be->ops->embed(be, d, ids, rows, out);
    save_dev(dir, "out.bin", out, (size_t)rows * cols);
    free(ids);
}

// 1 when op is one of these, after running it.
static int run_qop(const char *dir, const char *op) {
    const kaon_backend_ops *o = be->ops;
    if (strcmp(op, "qlinear") && strcmp(op, "qmulti") && strcmp(op, "qsilu")) return 0;
    char nsb[256];
    param_str(dir, "ns", nsb, sizeof nsb);
    int32_t *ns;
    const int n_ns = parse_ids(nsb, &ns);
    int max_n = 1;
    for (int i = 0; i < n_ns; i++) max_n = ns[i] > max_n ? ns[i] : max_n;
    const int in = (int)param(dir, "in", 0), has_bias = (int)param(dir, "has_bias", 0);
    void *dx = dev_bf16(need(dir, "x.bin", (size_t)max_n * in * 4), max_n, in);
    char nm[64];
    if (!strcmp(op, "qlinear")) {
        const int type = (int)param(dir, "type", 0), out = (int)param(dir, "out", 0);
        const bool f32 = param(dir, "f32out", 0) != 0;
        const kaon_tensor w = q_upload_raw(dir, "raw.bin", type, out, in);
        kaon_linear l = kaon_linear_of(&w, NULL);
        if (has_bias) l.bias = dev_vector(need(dir, "b.bin", (size_t)out * 4), out);
        for (int i = 0; i < n_ns; i++) {
            const int n = ns[i];
            void *y = q_poisoned((size_t)n * out, f32);
            if (f32 && o->linear_f32) o->linear_f32(be, dx, n, &l, y);
            else o->linear(be, dx, n, &l, y);
            snprintf(nm, sizeof nm, "out_%d.bin", n);
            q_save(dir, nm, y, (size_t)n * out, f32);
        }
    } else if (!strcmp(op, "qmulti")) {
        kaon_linear l[3];
        const kaon_linear *lp[3];
        int rows[3];
        for (int k = 0; k < 3; k++) {
            char key[16];
            snprintf(key, sizeof key, "out%d", k);
            rows[k] = (int)param(dir, key, 0);
            snprintf(key, sizeof key, "t%d", k);
            const int t = (int)param(dir, key, 0);
            snprintf(nm, sizeof nm, "raw%d.bin", k);
            const kaon_tensor w = q_upload_raw(dir, nm, t, rows[k], in);
            l[k] = kaon_linear_of(&w, NULL);
            if (has_bias) {
                snprintf(nm, sizeof nm, "b%d.bin", k);
                l[k].bias = dev_vector(need(dir, nm, (size_t)rows[k] * 4), rows[k]);
            }
            lp[k] = &l[k];
        }
        printf("[");
        for (int i = 0; i < n_ns; i++) {
            const int n = ns[i];
            void *y[3];
            for (int k = 0; k < 3; k++) y[k] = q_poisoned((size_t)n * rows[k], false);
            const int rc = o->linear_multi(be, dx, n, 3, lp, y);
            if (rc < 0) die("linear_multi failed%s", "");
            if (rc == 1)
                for (int k = 0; k < 3; k++) o->linear(be, dx, n, lp[k], y[k]);
            printf(i ? ", %d" : "%d", rc);
            for (int k = 0; k < 3; k++) {
                snprintf(nm, sizeof nm, "out%d_%d.bin", k, n);
                save_dev(dir, nm, y[k], (size_t)n * rows[k]);
            }
        }
        printf("]\n");
    } else {
        const int out = (int)param(dir, "out", 0);
        const kaon_tensor wgt = q_upload_raw(dir, "rawg.bin", (int)param(dir, "tg", 0), out, in);
        const kaon_tensor wut = q_upload_raw(dir, "rawu.bin", (int)param(dir, "tu", 0), out, in);
        const kaon_linear wg = kaon_linear_of(&wgt, NULL), wu = kaon_linear_of(&wut, NULL);
        printf("[");
        for (int i = 0; i < n_ns; i++) {
            const int n = ns[i];
            void *y = q_poisoned((size_t)n * out, false);
            const int rc = o->linear_silu_mul(be, dx, n, &wg, &wu, y);
            if (rc < 0) die("linear_silu_mul failed%s", "");
            if (rc == 1) {
                void *g = q_poisoned((size_t)n * out, false), *u = q_poisoned((size_t)n * out, false);
                o->linear(be, dx, n, &wg, g);
                o->linear(be, dx, n, &wu, u);
                o->silu_and_mul(be, g, u, n, out, y);
            }
            printf(i ? ", %d" : "%d", rc);
            snprintf(nm, sizeof nm, "out_%d.bin", n);
            save_dev(dir, nm, y, (size_t)n * out);
        }
        printf("]\n");
    }
    free(ns);
    return 1;
}

// ---- timings ---------------------------------------------------------------------------------------

// Random GGUF blocks with sane f16 scales (their values do not matter for the timing).
static void q_random_blocks(uint8_t *raw, size_t n_blocks, kaon_dtype t, uint64_t seed) {
    const int bsz = kaon_dtype_block_bytes(t);
    const size_t n = n_blocks * (size_t)bsz;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        memcpy(raw + i, &s, 8);
    }
    for (; i < n; i++) raw[i] = (uint8_t)(s >> (8 * (i & 7)));
    const uint16_t d = 0x1E00;  // f16 0.0059
    // Where the f16 scales are: d (and m or dmin beside it).
    const size_t d_at = t == KAON_Q6_K ? offsetof(kaon_block_q6_k, d)
                        : t == KAON_Q3_K ? offsetof(kaon_block_q3_k, d)
                        : t == KAON_Q2_K ? offsetof(kaon_block_q2_k, d) : 0;
    const bool two = t == KAON_Q4_1 || t == KAON_Q5_1 || t == KAON_Q2_K || t == KAON_Q4_K || t == KAON_Q5_K;
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *p = raw + b * (size_t)bsz + d_at;
        memcpy(p, &d, 2);
        if (two) memcpy(p + 2, &d, 2);
    }
}

static kaon_tensor q_random_weight(kaon_dtype t, int64_t rows, int64_t cols, uint64_t seed) {
    const size_t rb = kaon_dtype_row_bytes(t, cols), bytes = rb * (size_t)rows;
    uint8_t *raw = malloc(bytes);
    if (!raw) die("out of host memory%s", "");
    q_random_blocks(raw, bytes / (size_t)kaon_dtype_block_bytes(t), t, seed);
    kaon_tensor h = {.dtype = t, .ndim = 2, .shape = {rows, cols}, .data = raw, .nbytes = bytes}, d;
    if (be->ops->upload(be, &h, &d)) die("upload%s", "");
    free(raw);
    return d;
}

typedef struct q_case {
    int kind;  // 0 linear, 1 linear_f32 (LM head), 2 gate+up+SiLU, 3 q/k/v (linear_multi)
    const kaon_linear *w[3];
    int n;
    void *x, *y[3];
} q_case;

static void q_issue(const q_case *c) {
    const kaon_backend_ops *o = be->ops;
    switch (c->kind) {
    case 0: o->linear(be, c->x, c->n, c->w[0], c->y[0]); break;
    case 1: o->linear_f32(be, c->x, c->n, c->w[0], c->y[0]); break;
    case 2:
        if (o->linear_silu_mul(be, c->x, c->n, c->w[0], c->w[1], c->y[0]) != 0) die("silu declined%s", "");
        break;
    default:
        if (o->linear_multi(be, c->x, c->n, 3, c->w, c->y) != 0) die("multi declined%s", "");
    }
}

// Eager: the mean of 50 issues (launch overhead included). Graph: 20 issues recorded as one
// CUDA graph (as decode steps run), the mean over 10 replays.
static void q_time(const q_case *c, uint64_t key, double *us_eager, double *us_graph) {
    const kaon_backend_ops *o = be->ops;
    for (int i = 0; i < 5; i++) q_issue(c);
    sync_dev(c->y[0]);
    double t0 = now_s();
    for (int i = 0; i < 50; i++) q_issue(c);
    sync_dev(c->y[0]);
    *us_eager = (now_s() - t0) / 50 * 1e6;
    const int per = 20, reps = 10;
    double t1 = 0;
    for (int r = 0; r < 3 + reps; r++) {
        if (r == 3) {
            sync_dev(c->y[0]);
            t1 = now_s();
        }
        const int g = o->graph_begin(be, key);
        if (g < 0) die("graph_begin%s", "");
        if (g != 1)  // 0: eager, 2: recorded
            for (int i = 0; i < per; i++) q_issue(c);
        if (o->graph_end(be)) die("graph_end%s", "");
    }
    sync_dev(c->y[0]);
    *us_graph = (now_s() - t1) / (reps * per) * 1e6;
    if (o->status(be)) die("timing failed%s", "");
}

static int run_qtimings(void) {
    be = kaon_backend_cuda_create(0);
    if (!be) die("no backend%s", "");
    const kaon_backend_ops *o = be->ops;
    const kaon_dtype types[] = {KAON_Q4_0, KAON_Q4_1, KAON_Q5_0, KAON_Q5_1, KAON_Q8_0, KAON_IQ4_NL,
                                KAON_Q2_K, KAON_Q3_K, KAON_Q4_K, KAON_Q5_K, KAON_Q6_K, KAON_IQ4_XS};
    struct { int rows, in; } shapes[] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}, {64, 4096}};
    const int ns[] = {1, 4, 8};
    kaon_tensor xt = {.dtype = KAON_BF16, .ndim = 2, .shape = {8, 14336}}, xd;
    if (o->fill_dummy(be, &xt, NULL, 7, 1.0f, 0.0f, &xd)) die("fill%s", "");
    void *y = o->alloc(be, (size_t)8 * 128256 * 4), *y2 = o->alloc(be, (size_t)8 * 4096 * 2),
         *y3 = o->alloc(be, (size_t)8 * 4096 * 2);
    if (!y || !y2 || !y3) die("alloc%s", "");
    uint64_t key = 0x7100000000ull;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const kaon_dtype t = types[ti];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int rows = shapes[si].rows, in = shapes[si].in;
            kaon_tensor wt = q_random_weight(t, rows, in, 100 + si);
            const kaon_linear w = kaon_linear_of(&wt, NULL);
            const double bytes = (double)kaon_dtype_row_bytes(t, in) * rows;
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                if (rows == 64 && ns[ni] != 1) continue;
                q_case c = {.kind = rows == 128256 ? 1 : 0, .w = {&w}, .n = ns[ni], .x = xd.data, .y = {y}};
                double ue, ug;
                q_time(&c, ++key, &ue, &ug);
                printf("{\"timing\": \"qlinear\", \"type\": \"%s\", \"rows\": %d, \"in\": %d, \"n\": %d, "
                       "\"MB\": %.2f, \"us\": %.2f, \"TBps\": %.3f, \"us_graph\": %.2f, \"TBps_graph\": %.3f, "
                       "\"of_4.3TBps\": %.3f}\n",
                       kaon_dtype_name(t), rows, in, ns[ni], bytes / 1e6, ue, bytes / ue / 1e6, ug,
                       bytes / ug / 1e6, bytes / ug / 1e6 / 4.3);
                fflush(stdout);
            }
            o->release(be, &wt);
        }
        // Llama-3.1-8B's fused decode ops: gate + up + SiLU (2 x 14336 x 4096), q/k/v (6144 x 4096).
        kaon_tensor gt = q_random_weight(t, 14336, 4096, 7), ut = q_random_weight(t, 14336, 4096, 8);
        kaon_tensor qt = q_random_weight(t, 4096, 4096, 9), kt = q_random_weight(t, 1024, 4096, 10),
                    vt = q_random_weight(t, 1024, 4096, 11);
        const kaon_linear g = kaon_linear_of(&gt, NULL), u = kaon_linear_of(&ut, NULL);
        const kaon_linear q = kaon_linear_of(&qt, NULL), k = kaon_linear_of(&kt, NULL), v = kaon_linear_of(&vt, NULL);
        const double rb = (double)kaon_dtype_row_bytes(t, 4096);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            q_case cs = {.kind = 2, .w = {&g, &u}, .n = ns[ni], .x = xd.data, .y = {y}};
            q_case cm = {.kind = 3, .w = {&q, &k, &v}, .n = ns[ni], .x = xd.data, .y = {y, y2, y3}};
            double ue, ug;
            q_time(&cs, ++key, &ue, &ug);
            printf("{\"timing\": \"qsilu\", \"type\": \"%s\", \"rows\": 14336, \"in\": 4096, \"n\": %d, \"MB\": %.2f, "
                   "\"us\": %.2f, \"us_graph\": %.2f, \"TBps_graph\": %.3f}\n",
                   kaon_dtype_name(t), ns[ni], 2 * 14336 * rb / 1e6, ue, ug, 2 * 14336 * rb / ug / 1e6);
            q_time(&cm, ++key, &ue, &ug);
            printf("{\"timing\": \"qmulti_qkv\", \"type\": \"%s\", \"rows\": 6144, \"in\": 4096, \"n\": %d, \"MB\": %.2f, "
                   "\"us\": %.2f, \"us_graph\": %.2f, \"TBps_graph\": %.3f}\n",
                   kaon_dtype_name(t), ns[ni], 6144 * rb / 1e6, ue, ug, 6144 * rb / ug / 1e6);
            fflush(stdout);
        }
        o->release(be, &gt);
        o->release(be, &ut);
        o->release(be, &qt);
        o->release(be, &kt);
        o->release(be, &vt);
    }
    if (o->status(be)) die("qtimings failed%s", "");
    o->destroy(be);
    return 0;
}
