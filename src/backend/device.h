// Where a model runs, named as on the command line and in kaon_engine_options.device:
// "cpu", "cuda" (GPU 0), "cuda:N" (GPU N), or "noop" (no math: measures the engine itself).
// One parser, so every front end accepts the same forms and names them in its errors.
#ifndef KAON_BACKEND_DEVICE_H
#define KAON_BACKEND_DEVICE_H

#include <stddef.h>

#include "backend/backend.h"

typedef enum kaon_device_kind { KAON_DEVICE_CPU = 0, KAON_DEVICE_CUDA, KAON_DEVICE_NOOP } kaon_device_kind;

typedef struct kaon_device {
    kaon_device_kind kind;
    int index;  // the GPU (CUDA); 0 otherwise
} kaon_device;

// The forms a user gives to run a model (help texts, errors); noop is only for benchmarks.
#define KAON_DEVICE_FORMS "cpu, cuda, cuda:N"

// Parses s (NULL or "": cpu). -1 + an error listing the accepted forms on anything else.
int kaon_device_parse(const char *s, kaon_device *out);
// The canonical name ("cpu", "cuda:1", ...) in buf[n]; returns buf.
const char *kaon_device_name(const kaon_device *d, char *buf, size_t n);
// The backend of d (CPU: n_threads threads). NULL + kaon_last_error() on failure.
kaon_backend *kaon_backend_create(const kaon_device *d, int n_threads);

#endif
