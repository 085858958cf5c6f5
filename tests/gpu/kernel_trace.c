// Kernel timestamps of a real run, CUDA graphs and PDL included, at the clocks the run itself
// keeps (ncu serializes kernels with idle gaps between them, where a small kernel's time
// grows with the SM clock falling back to idle). CUDA loads this library at start-up when
// CUDA_INJECTION64_PATH names it; CUPTI's activity API collects every kernel's start and end,
// and at exit one CSV line per kernel goes to $KAON_TRACE_OUT (default /tmp/kaon_trace.csv):
//   start_ns,end_ns,graph_id,grid_x,grid_y,grid_z,block_x,name
// tests/gpu/trace_table.py turns it into per-step kernel times. Build (on the GPU machine):
//   gcc -O2 -shared -fPIC -I/usr/local/cuda/include tests/gpu/kernel_trace.c
//       -L/usr/local/cuda/lib64 -lcupti -lstdc++ -o /tmp/libkaon_trace.so
// (tests/gpu/trace_decode.sh builds it and runs a decode under it).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

// From the C++ runtime (libstdc++): kernel names come mangled.
char *__cxa_demangle(const char *mangled, char *out, size_t *len, int *status);

#define BUF_BYTES (8u << 20)

static FILE *trace_out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (trace_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        int status = -1;
        char *name = __cxa_demangle(k->name, NULL, NULL, &status);
        const char *shown = status == 0 && name ? name : k->name;
        // Commas in template arguments would split the CSV field: the name goes last, whole.
        fprintf(trace_out, "%llu,%llu,%u,%d,%d,%d,%d,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->graphId, k->gridX, k->gridY, k->gridZ, k->blockX, shown);
        free(name);
    }
    free(buf);
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    if (trace_out) fclose(trace_out);
    trace_out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("KAON_TRACE_OUT");
    trace_out = fopen(path && *path ? path : "/tmp/kaon_trace.csv", "w");
    if (!trace_out) return 0;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
        return 0;
    }
    atexit(at_exit);
    return 1;
}
