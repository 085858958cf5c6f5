// The CUDA backend's dummy-weight placement (kc_fill_place, kc_fill_index in
// src/backend/cuda/cuda_internal.h), run on the host without a GPU: a tensor-parallel shard's
// element must take the flat index, in the whole tensor, of its place there, so that k_fill_uniform
// gives every shard exactly the whole's values and random weights match across TP layouts.
// For vectors and matrices cut along rows or columns into 1, 2, 3 and 4 parts (as tp.c cuts
// them, origins as cut_placeholder records them), every part's element must land on its own
// (row, col) of the whole and the parts together on every element of the whole once.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_internal.h"
#include "test.h"

// shape: the whole's ([rows, cols], or [n] when ndim is 1), cut along dim into parts.
static void check_cut(int ndim, int64_t rows, int64_t cols, int dim, int parts) {
    const int64_t full = ndim == 1 || dim == 1 ? cols : rows, step = full / parts;
    std::vector<int> seen((size_t)(rows * cols), 0);
    for (int p = 0; p < parts; p++) {
        const kaon_dummy_origin o = {dim, p * step, full};
        // The part: its rows and columns (a vector is one row).
        const int64_t pr = ndim == 2 && dim == 0 ? step : rows, pc = ndim == 2 && dim == 0 ? cols : step;
        const kc_fill_at at = kc_fill_place(ndim, pc, &o);
        int bad = 0;
        for (int64_t r = 0; r < pr; r++)
            for (int64_t c = 0; c < pc; c++) {
                const int64_t gr = ndim == 2 && dim == 0 ? r + o.lo : r, gc = ndim == 2 && dim == 0 ? c : c + o.lo;
                const uint64_t g = kc_fill_index(at, (uint64_t)(r * pc + c));
                if (g != (uint64_t)(gr * cols + gc)) bad++;
                else seen[(size_t)g]++;
            }
        if (bad) fprintf(stderr, "ndim %d [%lld, %lld] cut along %d in %d: part %d: %d misplaced elements\n", ndim,
                         (long long)rows, (long long)cols, dim, parts, p, bad);
        CHECK(bad == 0);
    }
    int once = 0;
    for (int s : seen) once += s == 1;
    CHECK(once == (int)(rows * cols));
}

int main() {
    // Whole tensors (no origin): each element keeps its own flat index, the values as before.
    const kc_fill_at whole = kc_fill_place(2, 20, NULL);
    for (uint64_t i = 0; i < 12 * 20; i++) CHECK(kc_fill_index(whole, i) == i);
    CHECK(kc_fill_index(kc_fill_place(1, 24, NULL), 23) == 23);
    const int counts[] = {1, 2, 3, 4};
    for (int parts : counts) {
        check_cut(2, 12, 24, 0, parts);  // column-parallel (q/k/v, gate/up): rows cut
        check_cut(2, 12, 24, 1, parts);  // row-parallel (o_proj, down_proj): columns cut
        check_cut(1, 1, 24, 0, parts);   // a column-parallel bias
    }
    TEST_MAIN_END();
}
