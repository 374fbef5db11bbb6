/* zt_fp16.h — the one portable definition of fp32 <-> IEEE binary16 on the host.
 *
 * Round to nearest even; |f| >= 65520 (half of the way past 65504, the largest
 * half) becomes +-Inf; halves below 2^-14 are subnormal and rounded in units of
 * 2^-24; a NaN keeps its sign and its top mantissa bits and is forced quiet.
 * These are exactly the results of the x86 F16C instructions (vcvtps2ph with
 * round-to-nearest, vcvtph2ps), which the CPU backend uses when the processor
 * has them: test_kernels checks the two against each other on every half and on
 * random and edge floats. Written as selects over integer arithmetic, so loops
 * over them vectorize; the comm layer uses the same functions for its fp16 sums. */
#ifndef ZT_FP16_H
#define ZT_FP16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t zt_fp16_from_bits(uint32_t x)
{
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    /* normal half (|f| >= 2^-14): round at bit 13, then rebias the exponent from
     * 127 to 15; a mantissa carry moves into the exponent as it should */
    const uint32_t normal = (a + 0x0fffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    /* subnormal half: the significand shifted to units of 2^-24; exponents below
     * 102 (|f| < 2^-25) shift everything out and round to zero */
    const uint32_t e = a >> 23, ec = e < 101u ? 101u : e > 112u ? 112u : e, sh = 126u - ec;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u, q = m >> sh, rem = m & ((1u << sh) - 1u),
                   half = 1u << (sh - 1u);
    const uint32_t sub = q + (rem > half || (rem == half && (q & 1u)));
    const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    const uint32_t r = a > 0x7f800000u ? nan : a >= 0x477ff000u ? 0x7c00u : a >= 0x38800000u ? normal : sub;
    return (uint16_t)(sign | r);
}

static inline uint16_t zt_fp16_from_f32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return zt_fp16_from_bits(x);
}

static inline uint32_t zt_fp16_to_bits(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const uint32_t normal = ((e + 112u) << 23) | (m << 13);
    const uint32_t infnan = 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u);
    /* subnormal: m * 2^-24 is exact in fp32 (and normal there) */
    const float sf = (float)m * 0x1p-24f;
    uint32_t sub;
    memcpy(&sub, &sf, 4);
    return sign | (e == 0x1fu ? infnan : e ? normal : sub);
}

static inline float zt_fp16_to_f32(uint16_t h)
{
    const uint32_t u = zt_fp16_to_bits(h);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
