// FP8 e4m3fn (OCP "E4M3", torch.float8_e4m3fn) to float: sign, 4 exponent bits (bias 7),
// 3 mantissa bits; no infinities, S.1111.111 is NaN. Exact in f32. For loaders and tables;
// kernels keep a 256-entry table built from it.
#ifndef KAON_UTIL_FP8_H
#define KAON_UTIL_FP8_H

#include <math.h>
#include <stdint.h>

static inline float kaon_e4m3_to_f32(uint8_t b) {
    const int e = (b >> 3) & 15, f = b & 7;
    float v = e == 0 ? ldexpf((float)f, -9) : ldexpf((float)(8 + f), e - 10);
    if (e == 15 && f == 7) v = NAN;
    return (b & 0x80) ? -v : v;
}

#endif
