// kaon_backend_cuda_create for builds without nvcc: a clear error instead of a link failure.
#include "backend/backend.h"
#include "util/err.h"

#ifndef KAON_HAVE_CUDA
kaon_backend *kaon_backend_cuda_create(int device) {
    (void)device;
    kaon_set_error("cuda: this kaon was built without CUDA (nvcc was not found when it was configured)");
    return NULL;
}

int kaon_backend_cuda_device(kaon_backend *be, void **stream) {
    (void)be;
    if (stream) *stream = NULL;
    return kaon_set_error("cuda: this kaon was built without CUDA");
}

int kaon_backend_cuda_bind(kaon_backend *be) {
    (void)be;
    return kaon_set_error("cuda: this kaon was built without CUDA");
}

int kaon_backend_cuda_sync(kaon_backend *be) {
    (void)be;
    return kaon_set_error("cuda: this kaon was built without CUDA");
}

void kaon_backend_cuda_no_graphs(kaon_backend *be) { (void)be; }
#else
typedef int kaon_cuda_stub_unused;  // the real one is in cuda_backend.cu
#endif
