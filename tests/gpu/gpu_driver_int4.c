// The INT4 (W4A16) ops for tests/gpu/test_gpu_int4.py, #included by gpu_driver.c.
//
//   op i4linear | i4multi | i4silu: params n, in, g, count, out0.., has_bias, has_zero, has_perm,
//   f32out, time. Layer i: w<i>.bin (u8 [out_i, in/2], kaon's INT4 layout: low nibble first),
//   s<i>.bin (f32 [out_i, ceil(in/g)]), z<i>.bin (same, when has_zero), perm<i>.bin (i32 [in],
//   when has_perm), b<i>.bin (f32 [out_i], when has_bias); x.bin (f32 [n, in]). i4linear: layer 0
//   through linear (linear_f32 when f32out) -> out0.bin; i4multi: count layers through
//   linear_multi -> out<i>.bin; i4silu: linear_silu_mul(gate 0, up 1) -> out0.bin. A declined
//   fused op runs the unfused ops and prints {"declined": 1}. On CUDA the layers go through
//   upload_linear; KAON_OP_DEVICE=cpu runs the CPU backend's exact INT4 linear on the same host
//   layers. time N > 0: also prints {"us": per call, "GBps": the layers' bytes / time}.

static kaon_linear i4_layer(const char *dir, int i, int M, int K, int g, double *bytes) {
    const int G = (K + g - 1) / g;
    const size_t wb = (size_t)M * (size_t)K / 2, sb = sizeof(float) * (size_t)M * (size_t)G;
    char nm[32];
    kaon_linear h;
    memset(&h, 0, sizeof h);
    snprintf(nm, sizeof nm, "w%d.bin", i);
    h.w = (kaon_tensor){.dtype = KAON_I4, .ndim = 2, .shape = {M, K}, .data = need(dir, nm, wb), .nbytes = wb};
    snprintf(nm, sizeof nm, "s%d.bin", i);
    h.scale = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {M, G}, .data = need(dir, nm, sb), .nbytes = sb};
    *bytes += (double)(wb + sb);
    if (param(dir, "has_zero", 0)) {
        snprintf(nm, sizeof nm, "z%d.bin", i);
        h.zero = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {M, G}, .data = need(dir, nm, sb), .nbytes = sb};
        *bytes += (double)sb;
    }
    if (param(dir, "has_perm", 0)) {
        snprintf(nm, sizeof nm, "perm%d.bin", i);
        h.perm = (kaon_tensor){.dtype = KAON_I32, .ndim = 1, .shape = {K}, .data = need(dir, nm, (size_t)K * 4),
                               .nbytes = (size_t)K * 4};
    }
    h.scale_block[0] = 1;
    h.scale_block[1] = g;
    kaon_linear d = h;
    if (!on_cpu && (!be->ops->upload_linear || be->ops->upload_linear(be, &h, false, 0, &d)))
        die("upload_linear failed%s", "");
    if (param(dir, "has_bias", 0)) {
        snprintf(nm, sizeof nm, "b%d.bin", i);
        d.bias = dev_vector(need(dir, nm, (size_t)M * 4), M);
    }
    return d;
}

static int run_i4op(const char *dir, const char *op) {
    const bool multi = !strcmp(op, "i4multi"), silu = !strcmp(op, "i4silu");
    if (strcmp(op, "i4linear") && !multi && !silu) return 0;
    const kaon_backend_ops *o = be->ops;
    const int n = (int)param(dir, "n", 0), K = (int)param(dir, "in", 0), g = (int)param(dir, "g", 0);
    const int count = silu ? 2 : multi ? (int)param(dir, "count", 1) : 1, f32out = (int)param(dir, "f32out", 0);
    const int reps = (int)param(dir, "time", 0);
    if (count < 1 || count > 4) die("count must be 1..4%s", "");
    kaon_linear l[4];
    const kaon_linear *lp[4];
    void *y[4];
    int M[4];
    double bytes = 0;
    for (int i = 0; i < count; i++) {
        char key[16];
        snprintf(key, sizeof key, "out%d", i);
        M[i] = (int)param(dir, key, 0);
        l[i] = i4_layer(dir, i, M[i], K, g, &bytes);
        lp[i] = &l[i];
        y[i] = dev_bf16(NULL, n, M[i]);
    }
    void *dx = dev_bf16(need(dir, "x.bin", (size_t)n * K * 4), n, K);
    int declined = 0;
    if (f32out) {  // the LM head's path
        float *dy = o->alloc(be, (size_t)n * M[0] * 4), *hy = malloc((size_t)n * M[0] * 4);
        if (o->linear_f32) {
            o->linear_f32(be, dx, n, &l[0], dy);
            o->copy_f32_to_host(be, dy, (size_t)n * M[0], hy);
        } else {  // the CPU's activations are f32 already
            o->linear(be, dx, n, &l[0], dy);
            o->to_host_f32(be, dy, (size_t)n * M[0], hy);
        }
        if (o->status && o->status(be)) die("op failed%s", "");
        write_f32(dir, "out0.bin", hy, (size_t)n * M[0]);
        free(hy);
        return 1;
    }
    if (multi) {
        declined = o->linear_multi ? o->linear_multi(be, dx, n, count, lp, y) == 1 : 1;
        if (declined)
            for (int i = 0; i < count; i++) o->linear(be, dx, n, lp[i], y[i]);
    } else if (silu) {
        declined = o->linear_silu_mul ? o->linear_silu_mul(be, dx, n, lp[0], lp[1], y[0]) == 1 : 1;
        if (declined) {
            void *gy = dev_bf16(NULL, n, M[0]), *uy = dev_bf16(NULL, n, M[1]);
            o->linear(be, dx, n, lp[0], gy);
            o->linear(be, dx, n, lp[1], uy);
            o->silu_and_mul(be, gy, uy, n, M[0], y[0]);
        }
    } else {
        o->linear(be, dx, n, lp[0], y[0]);
    }
    printf("{\"declined\": %d}\n", declined);
    for (int i = 0; i < (silu ? 1 : count); i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "out%d.bin", i);
        save_dev(dir, nm, y[i], (size_t)n * M[i]);
    }
    if (reps > 0) {  // us per call after the calls above warmed up scratch
        float f;
        o->to_host_f32(be, y[0], 1, &f);
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) {
            if (multi && !declined) o->linear_multi(be, dx, n, count, lp, y);
            else if (silu && !declined) o->linear_silu_mul(be, dx, n, lp[0], lp[1], y[0]);
            else
                for (int i = 0; i < count; i++) o->linear(be, dx, n, lp[i], y[i]);
        }
        o->to_host_f32(be, y[0], 1, &f);
        const double dt = (now_s() - t0) / reps;
        printf("{\"us\": %.2f, \"GBps\": %.1f}\n", dt * 1e6, bytes / dt / 1e9);
    }
    return 1;
}
