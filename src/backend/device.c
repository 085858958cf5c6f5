#include "backend/device.h"

#include <stdio.h>
#include <string.h>

#include "util/err.h"

// GPU indices beyond this are surely a typo; the CUDA backend checks the real count.
#define MAX_GPU_INDEX 1023

int kaon_device_parse(const char *s, kaon_device *out) {
    *out = (kaon_device){KAON_DEVICE_CPU, 0};
    if (!s || !*s || !strcmp(s, "cpu")) return 0;
    if (!strcmp(s, "noop")) {
        out->kind = KAON_DEVICE_NOOP;
        return 0;
    }
    if (!strncmp(s, "cuda", 4) && (s[4] == 0 || s[4] == ':')) {
        out->kind = KAON_DEVICE_CUDA;
        if (s[4] == 0) return 0;
        // Digits only: no sign, no spaces, no trailing text.
        const char *p = s + 5;
        long v = 0;
        for (; *p >= '0' && *p <= '9' && v <= MAX_GPU_INDEX; p++) v = v * 10 + (*p - '0');
        if (p > s + 5 && !*p && v <= MAX_GPU_INDEX) {
            out->index = (int)v;
            return 0;
        }
    }
    *out = (kaon_device){KAON_DEVICE_CPU, 0};
    return kaon_set_error("unknown device '%s' (accepted: " KAON_DEVICE_FORMS ", noop)", s);
}

const char *kaon_device_name(const kaon_device *d, char *buf, size_t n) {
    switch (d->kind) {
    case KAON_DEVICE_CUDA: snprintf(buf, n, "cuda:%d", d->index); break;
    case KAON_DEVICE_NOOP: snprintf(buf, n, "noop"); break;
    default: snprintf(buf, n, "cpu"); break;
    }
    return buf;
}

kaon_backend *kaon_backend_create(const kaon_device *d, int n_threads) {
    switch (d->kind) {
    case KAON_DEVICE_CUDA: return kaon_backend_cuda_create(d->index);
    case KAON_DEVICE_NOOP: return kaon_backend_noop_create();
    default: return kaon_backend_cpu_create(n_threads);
    }
}
