// kaon_backend_cuda_create for builds without nvcc: a clear error instead of a link failure.
#include "backend/backend.h"
#include "util/err.h"

#ifndef KAON_HAVE_CUDA
kaon_backend *kaon_backend_cuda_create(int device) {
    (void)device;
    kaon_set_error("cuda: this kaon was built without CUDA (nvcc was not found when it was configured)");
    return NULL;
}
#else
typedef int kaon_cuda_stub_unused;  // the real one is in cuda_backend.cu
#endif
