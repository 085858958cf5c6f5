// INT4 weight-only layers (W4A16: AWQ, GPTQ, compressed-tensors pack-quantized) on the GPU.
// Not written yet: upload refuses them with a clear error.
#include "backend/cuda/cuda_internal.h"

int kc_int4_upload(kc_backend *b, const kaon_linear *host, bool dummy, uint64_t seed, kaon_linear *dev) {
    (void)host, (void)dummy, (void)seed, (void)dev;
    return kc_fail(b, "cuda upload: INT4 weights have no GPU kernels yet (run them with --device cpu)");
}

int kc_int4_linear(kc_backend *b, const void *x, int n, const kaon_linear *l, void *y, int f32out) {
    (void)x, (void)n, (void)l, (void)y, (void)f32out;
    return kc_fail(b, "cuda linear: INT4 weights have no GPU kernels yet");
}

size_t kc_int4_bytes(const kaon_tensor *host) { return host->nbytes; }

void kc_int4_destroy(kc_backend *b) { (void)b; }
