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

// float -> e4m3fn code: round to nearest, ties to even; saturates at +-448 (the largest
// finite value), NaN -> 0x7F.
static inline uint8_t kaon_f32_to_e4m3(float x) {
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (isnan(x)) return 0x7F;
    if (a >= 448.0f) return sign | 0x7E;
    if (a < 0.015625f) return sign | (uint8_t)rintf(a * 512.0f);  // subnormals (and 0x08 = 2^-6)
    int e;
    const float m = frexpf(a, &e);  // a = m 2^e, m in [0.5, 1)
    int E = e - 1 + 7, q = (int)rintf((2.0f * m - 1.0f) * 8.0f);
    if (q == 8) {
        q = 0;
        E++;
    }
    if (E > 15 || (E == 15 && q == 7)) return sign | 0x7E;
    return sign | (uint8_t)(E << 3 | q);
}

#endif
