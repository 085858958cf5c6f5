// The same-device CUDA communicator (comm.h) in builds without CUDA: a clear error.
#include "dist/comm.h"
#include "util/err.h"

#ifndef KAON_HAVE_CUDA
kaon_comm_cuda_local_group *kaon_comm_cuda_local_group_create(int size) {
    (void)size;
    kaon_set_error("comm: this kaon was built without CUDA");
    return NULL;
}

void kaon_comm_cuda_local_group_free(kaon_comm_cuda_local_group *g) { (void)g; }

kaon_comm *kaon_comm_cuda_local_create(kaon_comm_cuda_local_group *g, int rank, int device, void *stream) {
    (void)g, (void)rank, (void)device, (void)stream;
    kaon_set_error("comm: this kaon was built without CUDA");
    return NULL;
}
#else
typedef int kaon_comm_cuda_local_stub_unused;  // the real one is in comm_cuda_local.cu
#endif
