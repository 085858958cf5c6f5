// The INT4 (W4A16) linear op for tests/gpu/test_gpu_int4.py, #included by gpu_driver.c.
//
//   op i4linear: params n, out, in, g, has_bias, has_zero, has_perm, f32out, time; inputs x.bin
//   (f32 [n, in]), w.bin (u8 [out, in/2], kaon's INT4 layout: low nibble first), s.bin (f32
//   [out, ceil(in/g)]), z.bin (same, when has_zero), perm.bin (i32 [in], when has_perm), b.bin
//   (f32 [out], when has_bias); output out.bin (f32 [n, out]). On CUDA the layer goes through
//   upload_linear; KAON_OP_DEVICE=cpu runs the CPU backend's exact INT4 linear on the same
//   host layer. time N > 0: also prints {"us": per call, "GBps": weight bytes / time}.

static int run_i4op(const char *dir, const char *op) {
    if (strcmp(op, "i4linear")) return 0;
    const kaon_backend_ops *o = be->ops;
    const int n = (int)param(dir, "n", 0), M = (int)param(dir, "out", 0), K = (int)param(dir, "in", 0);
    const int g = (int)param(dir, "g", 0), G = (K + g - 1) / g, f32out = (int)param(dir, "f32out", 0);
    const int reps = (int)param(dir, "time", 0);
    const size_t wb = (size_t)M * (size_t)K / 2, sb = sizeof(float) * (size_t)M * (size_t)G;
    kaon_linear h;
    memset(&h, 0, sizeof h);
    h.w = (kaon_tensor){.dtype = KAON_I4, .ndim = 2, .shape = {M, K}, .data = need(dir, "w.bin", wb), .nbytes = wb};
    h.scale = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {M, G}, .data = need(dir, "s.bin", sb), .nbytes = sb};
    if (param(dir, "has_zero", 0))
        h.zero = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {M, G}, .data = need(dir, "z.bin", sb), .nbytes = sb};
    if (param(dir, "has_perm", 0))
        h.perm = (kaon_tensor){.dtype = KAON_I32, .ndim = 1, .shape = {K}, .data = need(dir, "perm.bin", (size_t)K * 4),
                               .nbytes = (size_t)K * 4};
    h.scale_block[0] = 1;
    h.scale_block[1] = g;
    kaon_linear d = h;
    if (!on_cpu && (!o->upload_linear || o->upload_linear(be, &h, false, 0, &d))) die("upload_linear failed%s", "");
    if (param(dir, "has_bias", 0)) d.bias = dev_vector(need(dir, "b.bin", (size_t)M * 4), M);
    void *dx = dev_bf16(need(dir, "x.bin", (size_t)n * K * 4), n, K);
    void *dy;
    if (f32out) {  // the LM head's path
        dy = o->alloc(be, (size_t)n * M * 4);
        float *hy = malloc((size_t)n * M * 4);
        if (o->linear_f32) {
            o->linear_f32(be, dx, n, &d, dy);
            o->copy_f32_to_host(be, dy, (size_t)n * M, hy);
        } else {  // the CPU's activations are f32 already
            o->linear(be, dx, n, &d, dy);
            o->to_host_f32(be, dy, (size_t)n * M, hy);
        }
        if (o->status && o->status(be)) die("op failed%s", "");
        write_f32(dir, "out.bin", hy, (size_t)n * M);
        free(hy);
    } else {
        dy = dev_bf16(NULL, n, M);
        o->linear(be, dx, n, &d, dy);
        save_dev(dir, "out.bin", dy, (size_t)n * M);
    }
    if (reps > 0 && !f32out) {  // us per call after the calls above warmed up scratch
        float f;
        o->to_host_f32(be, dy, 1, &f);
        const double t0 = now_s();
        for (int r = 0; r < reps; r++) o->linear(be, dx, n, &d, dy);
        o->to_host_f32(be, dy, 1, &f);
        const double dt = (now_s() - t0) / reps;
        const double bytes = (double)wb + (double)sb * (param(dir, "has_zero", 0) ? 2 : 1);
        printf("{\"us\": %.2f, \"GBps\": %.1f}\n", dt * 1e6, bytes / dt / 1e9);
    }
    return 1;
}
