// Per-head matrices and strided copies on the CPU (MLA's absorbed projections: each head's
// slice of a wider activation row goes through that head's own matrix).
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/err.h"

// A grow-only buffer of the backend (64-byte aligned); NULL + error when out of memory.
static float *grow(void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return *buf;
    size_t c = (bytes + bytes / 4 + 4096 + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, c) != 0) {
        kaon_set_error("cpu: out of memory for %zu bytes of scratch", bytes);
        return NULL;
    }
    free(*buf);
    *buf = p;
    *cap = c;
    return p;
}

// Head by head: gather the head's slices of x into [n, in] rows, run the linear kernels on
// the head's [out, in] rows of w (any format they read), scatter [n, out] into y.
void kaon_cpu_head_linear(kaon_backend *be_, const void *x_, int n, int n_heads, size_t x_tok,
                          size_t x_head, const kaon_linear *l, void *y_, size_t y_tok, size_t y_head) {
    kaon_cpu_backend *be = (kaon_cpu_backend *)be_;
    if (n <= 0) return;
    const kaon_tensor *w = &l->w;
    const char *why = kaon_linear_unsupported(l);
    if (why || l->bias.data) {
        kaon_set_error("cpu head_linear: %s is not supported", why ? why : "a bias");
        return;
    }
    if (!x_ || !y_ || !w || !w->data || w->ndim != 2 || n_heads <= 0 || w->shape[0] % n_heads) {
        kaon_set_error("cpu head_linear: bad arguments (%d heads, weight of %lld rows)", n_heads,
                       w ? (long long)w->shape[0] : -1LL);
        return;
    }
    const int64_t out = w->shape[0] / n_heads, in = w->shape[1];
    const size_t rb = kaon_dtype_row_bytes(w->dtype, in);
    float *xs = grow(&be->head_scratch, &be->head_scratch_cap, sizeof(float) * (size_t)n * (size_t)(in + out));
    if (!xs || !rb) {
        if (!rb) kaon_set_error("cpu head_linear: rows of %lld are not whole %s blocks", (long long)in,
                                kaon_dtype_name(w->dtype));
        return;
    }
    float *ys = xs + (size_t)n * in;
    const float *x = x_;
    float *y = y_;
    for (int h = 0; h < n_heads; h++) {
        for (int t = 0; t < n; t++)
            memcpy(xs + (size_t)t * in, x + t * x_tok + h * x_head, sizeof(float) * (size_t)in);
        kaon_linear wh = *l;
        wh.w.shape[0] = out;
        wh.w.data = (char *)w->data + (size_t)h * (size_t)out * rb;
        wh.w.nbytes = (size_t)out * rb;
        kaon_cpu_linear(be_, xs, n, &wh, ys);
        for (int t = 0; t < n; t++)
            memcpy(y + t * y_tok + h * y_head, ys + (size_t)t * out, sizeof(float) * (size_t)out);
    }
}

void kaon_cpu_copy_strided(kaon_backend *be, const void *src_, size_t src_stride, void *dst_,
                           size_t dst_stride, int rows, int width, float s) {
    (void)be;
    if (rows <= 0 || width <= 0) return;
    if (!src_ || !dst_) {
        kaon_set_error("cpu copy_strided: bad arguments");
        return;
    }
    const float *src = src_;
    float *dst = dst_;
    for (int r = 0; r < rows; r++) {
        const float *a = src + (size_t)r * src_stride;
        float *b = dst + (size_t)r * dst_stride;
        if (s == 1.0f) memmove(b, a, sizeof(float) * (size_t)width);
        else
            for (int i = 0; i < width; i++) b[i] = s * a[i];
    }
}
