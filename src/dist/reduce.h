// The ranks' sums of the host communicators (comm_cpu.c, comm_mpi.c): in rank order, with f32
// accumulation and one rounding for 16-bit types (int64 for i32), so every rank and every run
// gets the same bits whichever communicator carried the values.
#ifndef KAON_DIST_REDUCE_H
#define KAON_DIST_REDUCE_H

#include <stddef.h>

#include "dist/comm.h"

// out[out_off + i] = in[0][off + i] + in[1][off + i] + ... + in[n - 1][off + i], i in [lo, hi).
void kaon_comm_reduce(const void *const *in, int n, size_t off, void *out, size_t out_off, size_t lo, size_t hi,
                      kaon_comm_dtype t);

// Rank r's chunk [*lo, *hi) of count elements split over size ranks (ceil(count / size) each,
// the last ones shorter or empty): the share of the sums each rank makes.
void kaon_comm_chunk(size_t count, int size, int r, size_t *lo, size_t *hi);

#endif
