/* emul_check.h — what the kernel emulation tests share: a seeded xorshift
 * generator, the result rows and the normwise relative error.
 * Define EMUL_RNG_SEED before including it (each test keeps its own stream). */
#ifndef ZT_EMUL_CHECK_H
#define ZT_EMUL_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

static int n_rows, n_bad;

static uint64_t rng = EMUL_RNG_SEED;
static uint32_t urand(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)((urand() >> 8) * (1.0 / 16777216.0));
}
static std::vector<float> rand_vec(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v) x = frand(lo, hi);
    return v;
}

/* one line of the result table; a non-finite error fails */
static void row(double err, double bound, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void row(double err, double bound, const char *fmt, ...)
{
    char what[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const bool ok = std::isfinite(err) && err <= bound;
    printf("  %-52s %10.3e %8.1e  %s\n", what, err, bound, ok ? "ok" : "FAIL");
    n_rows++;
    n_bad += !ok;
}

/* normwise relative error max |got - ref| / max |ref|; any non-finite value fails */
template <class R> static double rel_err(const std::vector<float> &got, const std::vector<R> &ref)
{
    double maxdiff = 0.0, maxref = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        maxdiff = std::max(maxdiff, fabs((double)got[i] - (double)ref[i]));
        maxref = std::max(maxref, fabs((double)ref[i]));
    }
    return maxdiff / (maxref > 0 ? maxref : 1e-30);
}

#endif
