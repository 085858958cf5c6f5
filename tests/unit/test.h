// A minimal unit-test harness for ctest: each test_*.c is one executable; a failed CHECK
// prints file:line and the test exits non-zero at the end.
#ifndef KAON_TEST_H
#define KAON_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int kaon_test_failures = 0;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
            kaon_test_failures++;                                                      \
        }                                                                              \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                          \
    do {                                                                               \
        double _a = (a), _b = (b);                                                     \
        if (!(fabs(_a - _b) <= (tol))) {                                               \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s=%g %s=%g tol=%g\n", __FILE__,  \
                    __LINE__, #a, _a, #b, _b, (double)(tol));                          \
            kaon_test_failures++;                                                      \
        }                                                                              \
    } while (0)

// A whole file, NUL-terminated, its length in *len; NULL when it cannot be opened.
static inline char *kaon_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = (char *)malloc((size_t)(n < 0 ? 0 : n) + 1);
    if (!p) {
        fclose(f);
        return NULL;
    }
    if (n < 0 || fread(p, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    p[n] = 0;
    *len = (size_t)n;
    return p;
}

#define TEST_MAIN_END()                                                                \
    do {                                                                               \
        if (kaon_test_failures) fprintf(stderr, "%d check(s) failed\n", kaon_test_failures); \
        return kaon_test_failures ? 1 : 0;                                             \
    } while (0)

#endif
