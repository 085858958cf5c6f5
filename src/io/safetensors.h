// safetensors reader: one file, or a folder whose model.safetensors.index.json names shards.
// Files are mmapped; the JSON header is validated (offsets inside the file, sizes matching
// dtype x shape, no overlap past the end); tensors are handed out in place.
#ifndef KAON_IO_SAFETENSORS_H
#define KAON_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/tensor.h"

typedef struct kaon_safetensors kaon_safetensors;

typedef struct kaon_st_tensor {
    const char *name;       // NUL-terminated, owned by the reader
    kaon_dtype dtype;       // F32, F16, BF16, FP8_E4M3, I32 or I64 (others are rejected at open with a clear error
                            // unless listed as skipped, see below)
    int ndim;
    int64_t shape[KAON_MAX_DIMS];
    const void *data;
    size_t nbytes;
} kaon_st_tensor;

// path: a .safetensors file, or a folder holding model.safetensors or
// model.safetensors.index.json (+ shards). NULL with kaon_last_error() set on failure.
kaon_safetensors *kaon_safetensors_open(const char *path);
// One in-memory file (fuzzing, tests); the buffer must outlive the reader.
kaon_safetensors *kaon_safetensors_open_memory(const void *data, size_t size);
void kaon_safetensors_close(kaon_safetensors *st);

int64_t kaon_safetensors_count(const kaon_safetensors *st);
const kaon_st_tensor *kaon_safetensors_at(const kaon_safetensors *st, int64_t i);
const kaon_st_tensor *kaon_safetensors_find(const kaon_safetensors *st, const char *name);

#endif
