// The communicator: collectives between the ranks of a tensor/expert/data-parallel group, one
// object per rank. Ranks are threads of one process (DESIGN.md: one worker thread per GPU), so
// a collective is called by every rank's thread with its own buffers; it returns when this
// rank's output is complete and every other rank is done reading this rank's input.
//
// Implementations: comm_cpu.c (host memory, threads over shared buffers; used by the CPU
// backend so every sharding is tested in CI), comm_mpi.c (host memory, one rank per process of
// an MPI job: the CPU across processes and machines), comm_nccl.c (device memory, NCCL) and
// comm_cuda_local.cu (device memory, every rank a thread on the same GPU: a test aid).
//
// Counts are elements of dtype. The CPU one reduces in rank order (rank 0 + rank 1 + ...),
// with f32 accumulation and one rounding for 16-bit types, so results never depend on timing
// and every rank gets bitwise the same sums.
#ifndef KAON_DIST_COMM_H
#define KAON_DIST_COMM_H

#include <stddef.h>

typedef enum kaon_comm_dtype {
    KAON_COMM_F32 = 0,
    KAON_COMM_BF16,
    KAON_COMM_F16,
    KAON_COMM_I32,  // copies only (all_gather, all_to_allv, broadcast); sums as integers
} kaon_comm_dtype;

size_t kaon_comm_dtype_bytes(kaon_comm_dtype t);

typedef struct kaon_comm kaon_comm;

typedef struct kaon_comm_ops {
    const char *name;
    // recv = sum over ranks of send               [count]; recv may be send (in place)
    int (*all_reduce)(kaon_comm *c, const void *send, void *recv, size_t count, kaon_comm_dtype t);
    // recv[r * count ..] = send of rank r         send [count]; recv [size * count]
    // in place when send == recv + rank * count
    int (*all_gather)(kaon_comm *c, const void *send, void *recv, size_t count, kaon_comm_dtype t);
    // recv = sum over ranks of send[rank * count ..]   send [size * count]; recv [count]
    // in place when recv == send + rank * count
    int (*reduce_scatter)(kaon_comm *c, const void *send, void *recv, size_t count, kaon_comm_dtype t);
    // Rank q receives send_counts[q] elements of this rank's send at send_offs[q], into its
    // recv at recv_offs[r] (r: this rank), recv_counts[r] of them (each pair must agree).
    // All arrays [size], in elements; send and recv must not overlap.
    int (*all_to_allv)(kaon_comm *c, const void *send, const size_t *send_counts, const size_t *send_offs,
                       void *recv, const size_t *recv_counts, const size_t *recv_offs, kaon_comm_dtype t);
    // buf of every rank = buf of root             [count]
    int (*broadcast)(kaon_comm *c, void *buf, size_t count, kaon_comm_dtype t, int root);
    int (*barrier)(kaon_comm *c);
    // A rank that fails before a collective never arrives: abort (from any thread) makes the
    // pending and later collectives of the group return -1 ("comm: aborted: why") instead of
    // waiting for it (NCCL: this rank's communicator is aborted; call it for every rank's).
    // recover, once no rank is inside a collective: usable again (0), or -1 + error where an
    // aborted communicator cannot be (NCCL).
    void (*abort)(kaon_comm *c, const char *why);
    int (*recover)(kaon_comm *c);
    void (*destroy)(kaon_comm *c);
} kaon_comm_ops;

struct kaon_comm {
    const kaon_comm_ops *ops;
    int rank, size;
    // Device communicators (NCCL): when set, a collective is only enqueued on the rank's stream
    // and not waited for; later work on that stream sees its result. A forward pass on that
    // stream needs no more, and CUDA graphs can record the collectives. Off: waited for.
    int stream_ordered;
};

// ---- CPU: the ranks are threads of this process --------------------------------------------
// A group holds what the ranks share (published pointers, a barrier, a reduction scratch);
// each rank's thread gets its communicator from it. The group outlives its communicators.
typedef struct kaon_comm_cpu_group kaon_comm_cpu_group;
kaon_comm_cpu_group *kaon_comm_cpu_group_create(int size);
void kaon_comm_cpu_group_free(kaon_comm_cpu_group *g);
kaon_comm *kaon_comm_cpu_create(kaon_comm_cpu_group *g, int rank);

// ---- MPI: one rank per process of an MPI job (comm_mpi.c) -----------------------------------
// Processes started by mpirun or srun (dist/cluster.h starts MPI). Each communicator is a
// duplicate of the job's world (rank: the process's), with host buffers and comm_cpu's sums
// (rank order: the same bits). Waits poll, then sleep, so a rank idle in a collective (a
// follower waiting for its next step) leaves its core free. abort ends this process's waits;
// MPI cannot cancel a collective, so an aborted communicator stays unusable (recover fails).
// Without MPI in the build: NULL + "built without MPI".
kaon_comm *kaon_comm_mpi_create(void);

// ---- NCCL: one GPU per rank, one thread per GPU (comm_nccl.c) --------------------------------
// A unique id made once (kaon_comm_nccl_unique_id) is handed to every rank's thread, which
// calls kaon_comm_nccl_create with its rank and device; buffers are device memory and the
// collectives run on the given CUDA stream (NULL: the default stream) and are waited for.
// Without NCCL in the build: NULL / -1 with the error "built without NCCL".
#define KAON_COMM_NCCL_ID_BYTES 128
int kaon_comm_nccl_unique_id(unsigned char id[KAON_COMM_NCCL_ID_BYTES]);
kaon_comm *kaon_comm_nccl_create(const unsigned char id[KAON_COMM_NCCL_ID_BYTES], int size, int rank,
                                 int device, void *stream);

// ---- CUDA, every rank on the same device (comm_cuda_local.cu) --------------------------------
// A test aid for tensor parallelism on one GPU (KAON_TP_SAME_DEVICE=1; NCCL refuses two ranks
// on one device): each rank publishes its device buffer in the group, synchronizes its stream
// and meets the others at a host barrier; sums are made by each rank in rank order with f32
// accumulation and one rounding (the CPU one's bits), into a scratch that is copied out after
// a second barrier (so in-place sums never overwrite what another rank still reads). Every
// collective waits (host barriers cannot be recorded in a CUDA graph). all_reduce, all_gather,
// broadcast and barrier only. Without CUDA: NULL + "built without CUDA".
typedef struct kaon_comm_cuda_local_group kaon_comm_cuda_local_group;
kaon_comm_cuda_local_group *kaon_comm_cuda_local_group_create(int size);
void kaon_comm_cuda_local_group_free(kaon_comm_cuda_local_group *g);
kaon_comm *kaon_comm_cuda_local_create(kaon_comm_cuda_local_group *g, int rank, int device, void *stream);

#endif
