/* zt_np_random.h — numpy's legacy global random state (np.random.seed, RandomState's
 * MT19937), as far as LLaMA-Factory's num_samples draws from it: permutation(n) and
 * choice(n, k) with replacement. The same seed gives numpy's numbers exactly. */
#ifndef ZT_NP_RANDOM_H
#define ZT_NP_RANDOM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t key[624];
    int pos;
} zt_np_random_t;

/* np.random.seed(seed) for an integer seed (mt19937_seed: Matsumoto and Nishimura's init_genrand). */
void zt_np_seed(zt_np_random_t *r, uint32_t seed);

/* LLaMA-Factory's num_samples of a dataset of n records (data/loader.py):
 * np.random.permutation(n)[:k], then, when k > n, np.random.choice(n, k - n) after it:
 * out[0 .. k) are record indices. */
void zt_np_num_samples(zt_np_random_t *r, size_t n, size_t k, size_t *out);

#endif
