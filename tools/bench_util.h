/* bench_util.h — what the C microbenchmarks of tools/ share: seeded buffers in the CPU
 * backend's memory and a best-of-reps timer (the least disturbed run on a shared machine). */
#ifndef ZT_BENCH_UTIL_H
#define ZT_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "zt_backend.h"
#include "zt_common.h"

/* n floats uniform in [-amp/2, amp/2) from a linear congruential stream seeded s */
static inline float *bench_rnd(size_t n, float amp, uint32_t s)
{
    float *p = zt_backend_cpu.alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = amp * ((float)(s >> 8) / 16777216.0f - 0.5f);
    }
    return p;
}

/* best (seconds) of reps runs of stmt */
#define BEST(reps, best, stmt)                                \
    do {                                                      \
        best = 1e30;                                          \
        for (int r_ = 0; r_ < (reps); r_++) {                 \
            double t0_ = zt_now();                            \
            stmt;                                             \
            double dt_ = zt_now() - t0_;                      \
            if (dt_ < best) best = dt_;                       \
        }                                                     \
    } while (0)

#endif
