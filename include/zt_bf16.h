/* zt_bf16.h — the one definition of fp32 <-> bf16 conversion on the host.
 *
 * Round to nearest even; a NaN keeps its sign and is forced quiet so that
 * dropping its low payload bits cannot turn it into Inf. Branch-free, so the
 * CPU backend's loops over these still vectorize; the comm layer uses the same
 * functions for its bf16 sums, so a bf16 reduction rounds exactly as the
 * backend does. */
#ifndef ZT_BF16_H
#define ZT_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t zt_bf16_from_bits(uint32_t x)
{
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t qnan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? qnan : r);
}

static inline uint16_t zt_bf16_from_f32(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return zt_bf16_from_bits(x);
}

static inline float zt_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
