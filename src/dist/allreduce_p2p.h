// The one-shot all-reduce over peer-to-peer device memory (NVLink), for the small sums of a
// decode step (8 KB per all-reduce at batch 1 for Llama-3.1-8B: NCCL's ring protocol costs
// more in latency than the bytes do). Ranks are threads of one process on distinct GPUs (one
// address space, UVA), so a device pointer of one rank is valid on another once peer access
// is enabled.
//
// Each rank owns a staging area [2 parities][size sources][slot bytes] and a flag per (source
// rank, block). One kernel per call: block b pushes its slice of this rank's input into every
// peer's staging (remote stores), raises its flag there (release, system scope), waits for
// every peer's flag for that block (acquire), then sums the slice in rank order with f32
// accumulation and one rounding: every rank gets bitwise the same result, whatever the
// timing. Flags hold a per-block call count kept in device memory (not a kernel argument),
// so a CUDA graph can replay the kernel. The staging alternates between two parities: when a
// rank starts call k+2 every peer has finished call k (it raised a flag of call k+1, which
// runs after its call k on its stream), so nothing still being read is overwritten.
//
// Set up once per communicator: comm_nccl.c makes it (kaon_p2p_ar_create), all-gathers the
// pointers kaon_p2p_ar_local gives, and connects it (kaon_p2p_ar_connect).
#ifndef KAON_DIST_ALLREDUCE_P2P_H
#define KAON_DIST_ALLREDUCE_P2P_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KAON_P2P_AR_MAX_RANKS 8

typedef struct kaon_p2p_ar kaon_p2p_ar;

// This rank's buffers on `device` (current device of the calling thread), able to take
// all-reduces of up to max_bytes; NULL + error when device memory runs out.
kaon_p2p_ar *kaon_p2p_ar_create(int rank, int size, int device, size_t max_bytes);
// What the peers need: this rank's staging and flag addresses and its device.
void kaon_p2p_ar_local(const kaon_p2p_ar *p, uint64_t out[3]);
// Every rank's three values from kaon_p2p_ar_local (rank order): enables peer access to every
// other rank's device. -1 when this device cannot reach one (cudaDeviceCanAccessPeer); the
// ranks must then agree (comm_nccl.c reduces the outcome) and all use their other path.
int kaon_p2p_ar_connect(kaon_p2p_ar *p, const uint64_t *all);
// Whether this call can go one-shot: bytes within the staging and 16-byte aligned buffers.
int kaon_p2p_ar_fits(const kaon_p2p_ar *p, const void *send, const void *recv, size_t bytes);
// recv = sum over ranks of send, enqueued on stream (not waited for). dtype: 0 f32, 1 bf16,
// 2 f16 (kaon_comm_dtype's values). recv may be send.
int kaon_p2p_ar_run(kaon_p2p_ar *p, const void *send, void *recv, size_t count, int dtype, void *stream);
void kaon_p2p_ar_free(kaon_p2p_ar *p);

#ifdef __cplusplus
}
#endif

#endif
