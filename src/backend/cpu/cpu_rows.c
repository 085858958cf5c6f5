// The row runner of the CPU's exact quantized linears (FP8, INT4, MXFP4): each thread
// dequantizes one weight row at a time into its own f32 row and dots it with every x row in
// f32, so results equal the dequantized float model's within f32 rounding.
#include "backend/cpu/cpu_internal.h"
#include "util/pool.h"

static float dot_f32(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int k = 0;
    for (; k + 8 <= n; k += 8)
        for (int i = 0; i < 8; i++) acc[i] += a[k + i] * b[k + i];
    float s = 0.0f;
    for (; k < n; k++) s += a[k] * b[k];
    for (int i = 0; i < 8; i++) s += acc[i];
    return s;
}

typedef struct rows_job {
    kaon_cpu_row_fn row;
    const void *ctx;
    const float *bias, *x;
    float *y, *rows;  // rows: one dequantized weight row per thread
    int64_t M, K;
    int n, per;
} rows_job;

// Weight rows [task * per, ...): dequantized into the executing thread's row, dotted with x.
static void rows_task(void *c, int task, int th) {
    const rows_job *j = c;
    float *row = j->rows + (size_t)th * (size_t)j->K;
    const int64_t m0 = (int64_t)task * j->per, m1 = m0 + j->per < j->M ? m0 + j->per : j->M;
    for (int64_t m = m0; m < m1; m++) {
        j->row(j->ctx, m, row);
        const float b = j->bias ? j->bias[m] : 0.0f;
        for (int r = 0; r < j->n; r++)
            j->y[(size_t)r * (size_t)j->M + (size_t)m] = dot_f32(row, j->x + (size_t)r * (size_t)j->K, (int)j->K) + b;
    }
}

void kaon_cpu_rows_linear(kaon_cpu_backend *be, const float *x, int n, int64_t M, int64_t K, const float *bias,
                          float *y, float *rows, int nt, kaon_cpu_row_fn row, const void *ctx) {
    rows_job j = {.row = row, .ctx = ctx, .bias = bias, .x = x, .y = y, .rows = rows, .M = M, .K = K, .n = n};
    const int tasks = kaon_cpu_tasks((int)M, nt, 1, &j.per);
    kaon_pool_run(be->pool, tasks, nt, rows_task, &j);
}
