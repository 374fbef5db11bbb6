/* zt_np_random.c — numpy's legacy MT19937 and the two draws LLaMA-Factory's num_samples
 * makes with it (numpy/random/src/mt19937, distributions.c random_interval,
 * RandomState.shuffle's _shuffle_raw, RandomState.randint's masked rejection). */
#include "zt_np_random.h"

#include "zt_common.h"

#include <stdlib.h>

#define MT_N 624
#define MT_M 397

void zt_np_seed(zt_np_random_t *r, uint32_t seed)
{
    for (int i = 0; i < MT_N; i++) {
        r->key[i] = seed;
        seed = 1812433253U * (seed ^ (seed >> 30)) + (uint32_t)i + 1;
    }
    r->pos = MT_N;
}

static void generate(zt_np_random_t *r)
{
    static const uint32_t mag[2] = {0, 0x9908b0dfU};
    for (int i = 0; i < MT_N; i++) {
        const uint32_t y = (r->key[i] & 0x80000000U) | (r->key[(i + 1) % MT_N] & 0x7fffffffU);
        r->key[i] = r->key[(i + MT_M) % MT_N] ^ (y >> 1) ^ mag[y & 1];
    }
    r->pos = 0;
}

static uint32_t next32(zt_np_random_t *r)
{
    if (r->pos == MT_N) generate(r);
    uint32_t y = r->key[r->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    return y ^ (y >> 18);
}

/* A uniform integer in [0, max]: the smallest all-ones mask >= max, draws rejected above
 * max (random_interval; randint's masked path draws alike). */
static uint64_t interval(zt_np_random_t *r, uint64_t max)
{
    if (max == 0) return 0;
    uint64_t mask = max, v;
    for (int s = 1; s < 64; s *= 2) mask |= mask >> s;
    if (max <= 0xffffffffU) {
        while ((v = next32(r) & mask) > max) {}
    } else {
        do {
            const uint64_t hi = next32(r);
            v = ((hi << 32) | next32(r)) & mask;
        } while (v > max);
    }
    return v;
}

void zt_np_num_samples(zt_np_random_t *r, size_t n, size_t k, size_t *out)
{
    size_t *perm = zt_malloc((n ? n : 1) * sizeof *perm);
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n - 1; n > 1 && i >= 1; i--) { /* permutation: shuffle arange(n) from the end */
        const size_t j = (size_t)interval(r, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    const size_t m = k < n ? k : n;
    for (size_t i = 0; i < m; i++) out[i] = perm[i];
    for (size_t i = m; i < k; i++) out[i] = (size_t)interval(r, n - 1); /* choice(n, k - n) */
    free(perm);
}
