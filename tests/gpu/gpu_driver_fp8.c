// FP8 linear ops of gpu_driver (included by gpu_driver.c after its helpers; not a translation unit
// of its own). Weights are e4m3 codes with f32 scales in blocks of [sb0, sb1] (src/backend/linear.h);
// the CUDA backend copies them with upload_linear, the CPU backend (KAON_OP_DEVICE=cpu, the
// reference; KAON_FP8_ACT=1 for DeepSeek's activation groups) reads them in place.
//
//   op fp8linear out in ns sb0 sb1 act act_scale [has_bias f32out]
//                  w.bin (u8 codes [out, in]), s.bin (f32 scales), x.bin [max n, in], b.bin
//                  -> out_<n>.bin [n, out]
//   op fp8multi  out0 out1 out2 in ns sb0 sb1 act act_scale   w<k>.bin, s<k>.bin -> out<k>_<n>.bin;
//                  prints the linear_multi return codes (1: declined, run as three linears)
//   op fp8silu   out in ns sb0 sb1 act act_scale   wg.bin sg.bin wu.bin su.bin -> out_<n>.bin
//                  (silu(x gate^T) * (x up^T)); prints linear_silu_mul's return codes
// act: kaon_act_quant (0 none, 1 group, 2 token, 3 tensor, 4 static).

static kaon_linear fp8_layer(const char *dir, const char *wname, const char *sname, int out, int in) {
    const int sb0 = (int)param(dir, "sb0", 128), sb1 = (int)param(dir, "sb1", 128);
    const int64_t sr = (out + sb0 - 1) / sb0, sc = (in + sb1 - 1) / sb1;
    kaon_linear h;
    memset(&h, 0, sizeof h);
    h.w = (kaon_tensor){.dtype = KAON_FP8_E4M3, .ndim = 2, .shape = {out, in}};
    h.w.data = need(dir, wname, (size_t)out * in);
    h.w.nbytes = (size_t)out * in;
    h.scale = (kaon_tensor){.dtype = KAON_F32, .ndim = 2, .shape = {sr, sc}};
    h.scale.data = need(dir, sname, (size_t)(sr * sc) * 4);
    h.scale.nbytes = (size_t)(sr * sc) * 4;
    h.scale_block[0] = sb0;
    h.scale_block[1] = sb1;
    h.act_quant = (int)param(dir, "act", 1);
    h.act_scale = (float)param(dir, "act_scale", 0);
    if (on_cpu) return h;
    kaon_linear d = h;
    if (!be->ops->upload_linear || be->ops->upload_linear(be, &h, false, 0, &d)) die("upload_linear %s", wname);
    return d;
}

static int run_fp8op(const char *dir, const char *op) {
    const kaon_backend_ops *o = be->ops;
    if (strcmp(op, "fp8linear") && strcmp(op, "fp8multi") && strcmp(op, "fp8silu")) return 0;
    char nsb[256], nm[64];
    param_str(dir, "ns", nsb, sizeof nsb);
    int32_t *ns;
    const int n_ns = parse_ids(nsb, &ns);
    int max_n = 1;
    for (int i = 0; i < n_ns; i++) max_n = ns[i] > max_n ? ns[i] : max_n;
    const int in = (int)param(dir, "in", 0);
    void *dx = dev_bf16(need(dir, "x.bin", (size_t)max_n * in * 4), max_n, in);
    if (!strcmp(op, "fp8linear")) {
        const int out = (int)param(dir, "out", 0);
        const bool f32 = param(dir, "f32out", 0) != 0;
        kaon_linear l = fp8_layer(dir, "w.bin", "s.bin", out, in);
        if (param(dir, "has_bias", 0)) l.bias = dev_vector(need(dir, "b.bin", (size_t)out * 4), out);
        for (int i = 0; i < n_ns; i++) {
            const int n = ns[i];
            void *y = q_poisoned((size_t)n * out, f32);
            if (f32 && o->linear_f32) o->linear_f32(be, dx, n, &l, y);  // (the CPU's activations are f32)
            else o->linear(be, dx, n, &l, y);
            snprintf(nm, sizeof nm, "out_%d.bin", n);
            q_save(dir, nm, y, (size_t)n * out, f32);
        }
    } else if (!strcmp(op, "fp8multi")) {
        kaon_linear l[3];
        const kaon_linear *lp[3];
        int rows[3];
        for (int k = 0; k < 3; k++) {
            char key[16], sn[16];
            snprintf(key, sizeof key, "out%d", k);
            rows[k] = (int)param(dir, key, 0);
            snprintf(nm, sizeof nm, "w%d.bin", k);
            snprintf(sn, sizeof sn, "s%d.bin", k);
            l[k] = fp8_layer(dir, nm, sn, rows[k], in);
            lp[k] = &l[k];
        }
        printf("[");
        for (int i = 0; i < n_ns; i++) {
            const int n = ns[i];
            void *y[3];
            for (int k = 0; k < 3; k++) y[k] = q_poisoned((size_t)n * rows[k], false);
            const int rc = o->linear_multi ? o->linear_multi(be, dx, n, 3, lp, y) : 1;
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
        const kaon_linear wg = fp8_layer(dir, "wg.bin", "sg.bin", out, in), wu = fp8_layer(dir, "wu.bin", "su.bin", out, in);
        printf("[");
        for (int i = 0; i < n_ns; i++) {
            const int n = ns[i];
            void *y = q_poisoned((size_t)n * out, false);
            const int rc = o->linear_silu_mul ? o->linear_silu_mul(be, dx, n, &wg, &wu, y) : 1;
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
