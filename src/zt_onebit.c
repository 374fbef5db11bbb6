/* zt_onebit.c — 1-bit Adam's update and compressed all-reduce (see zt_onebit.h).
 *
 * Arithmetic in torch's order, one rounding per tensor operation (no contraction),
 * so a float64 replay of DeepSpeed's code (tests/reference/onebit_replay.py) agrees
 * to float rounding. Norms are summed in double. The element-wise loops are vectorized
 * with the vectorizer's full cost model: the default CFLAGS' -O2 (after AM_CFLAGS' -O3)
 * leaves GCC's "very cheap" model, which keeps loops of unknown trip count, such as the
 * update's divide, scalar. Lanes change no result (one rounding per operation, no
 * contraction, the norms' in-order double sums stay scalar). */
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic")
#include "zt_onebit.h"

#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

struct zt_onebit_set {
    int T, n, rank;
    int on;                            /* compresses: a group (n > 1, or one rank alone: zt_onebit.h) */
    int dry;                           /* zt_onebit_set_create_dry: sizes only, no buffers */
    zt_group_t *g;
    size_t *numel, *np, *chunk, *boff; /* (T) tensor sizes, padded sizes, server chunks, byte offsets */
    size_t B;                          /* sign bytes of one rank's chunks of every tensor */
    float **werr, **serr;              /* (T) worker error (np), server error (chunk) */
    float *x;                          /* (max np) compensated values */
    uint8_t *send, *recv, *sbits, *rbits; /* n B, n B, B, n B */
    float *scale, *rscale, *sscale, *rsscale; /* T, n T, T, n T */
    int sharded, has_last;             /* zero1/zero2; rbits and rsscale hold a result */
    uint8_t **keep;                    /* (T) sharded: bit j set where v[j] != 0 (numel bits) */
};

static size_t gcd(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

size_t zt_onebit_padded(size_t numel, int n)
{
    const size_t q = (size_t)n * ((size_t)n * 8 / gcd((size_t)n, 8));
    return ZT_CEIL_DIV(numel, q) * q;
}

size_t zt_onebit_state_bytes(const size_t *numel, int ntensors, int n, int sharded)
{
    size_t b = 0;
    for (int i = 0; n > 1 && i < ntensors; i++) {
        const size_t np = zt_onebit_padded(numel[i], n);
        b += (np + np / (size_t)n) * sizeof(float) + (sharded ? ZT_CEIL_DIV(numel[i], 8) : 0);
    }
    return b;
}

/* The set's sizes; with bufs its buffers too */
static zt_onebit_set_t *set_new(const size_t *numel, int ntensors, zt_group_t *g, int sharded, int bufs)
{
    zt_onebit_set_t *s = zt_calloc(1, sizeof *s);
    s->T = ntensors;
    s->g = g;
    s->n = g ? g->size : 1;
    s->rank = g ? g->rank : 0;
    s->sharded = sharded;
    s->on = g != NULL;
    s->dry = !bufs;
    if (!s->on) return s;
    if (sharded && bufs) s->keep = zt_calloc((size_t)ntensors, sizeof(uint8_t *));
    for (int i = 0; sharded && bufs && i < ntensors; i++) s->keep[i] = zt_calloc(ZT_CEIL_DIV(numel[i], 8), 1);
    s->numel = zt_malloc((size_t)ntensors * sizeof(size_t));
    s->np = zt_malloc((size_t)ntensors * sizeof(size_t));
    s->chunk = zt_malloc((size_t)ntensors * sizeof(size_t));
    s->boff = zt_malloc((size_t)ntensors * sizeof(size_t));
    s->werr = zt_calloc((size_t)ntensors, sizeof(float *));
    s->serr = zt_calloc((size_t)ntensors, sizeof(float *));
    size_t maxnp = 0;
    for (int i = 0; i < ntensors; i++) {
        s->numel[i] = numel[i];
        s->np[i] = zt_onebit_padded(numel[i], s->n);
        s->chunk[i] = s->np[i] / (size_t)s->n;
        s->boff[i] = s->B;
        s->B += s->chunk[i] / 8;
        if (bufs) s->werr[i] = zt_calloc(s->np[i], sizeof(float));
        if (bufs) s->serr[i] = zt_calloc(s->chunk[i], sizeof(float));
        maxnp = ZT_MAX(maxnp, s->np[i]);
    }
    if (!bufs) return s;
    const size_t n = (size_t)s->n, T = (size_t)ntensors;
    s->x = zt_malloc(maxnp * sizeof(float));
    s->send = zt_malloc(n * s->B);
    s->recv = zt_malloc(n * s->B);
    s->sbits = zt_malloc(s->B);
    s->rbits = zt_malloc(n * s->B);
    s->scale = zt_malloc(T * sizeof(float));
    s->rscale = zt_malloc(n * T * sizeof(float));
    s->sscale = zt_malloc(T * sizeof(float));
    s->rsscale = zt_malloc(n * T * sizeof(float));
    return s;
}

zt_onebit_set_t *zt_onebit_set_create(const size_t *numel, int ntensors, zt_group_t *g, int sharded)
{
    return set_new(numel, ntensors, g, sharded, 1);
}

zt_onebit_set_t *zt_onebit_set_create_dry(const size_t *numel, int ntensors, zt_group_t *g)
{
    return set_new(numel, ntensors, g, 0, 0);
}

void zt_onebit_set_free(zt_onebit_set_t *s)
{
    if (!s) return;
    for (int i = 0; s->werr && i < s->T; i++) {
        free(s->werr[i]);
        free(s->serr[i]);
        if (s->keep) free(s->keep[i]);
    }
    free(s->keep);
    free(s->werr);
    free(s->serr);
    free(s->numel);
    free(s->np);
    free(s->chunk);
    free(s->boff);
    free(s->x);
    free(s->send);
    free(s->recv);
    free(s->sbits);
    free(s->rbits);
    free(s->scale);
    free(s->rscale);
    free(s->sscale);
    free(s->rsscale);
    free(s);
}

float *zt_onebit_worker_error(zt_onebit_set_t *s, int i, size_t *len)
{
    *len = s->on ? s->np[i] : 0;
    return s->on ? s->werr[i] : NULL;
}

float *zt_onebit_server_error(zt_onebit_set_t *s, int i, size_t *len)
{
    *len = s->on ? s->chunk[i] : 0;
    return s->on ? s->serr[i] : NULL;
}

void zt_onebit_reset(zt_onebit_set_t *s)
{
    for (int i = 0; s->on && i < s->T; i++) {
        memset(s->werr[i], 0, s->np[i] * sizeof(float));
        memset(s->serr[i], 0, s->chunk[i] * sizeof(float));
    }
}

int zt_onebit_has_last(const zt_onebit_set_t *s) { return s->has_last; }

void zt_onebit_forget(zt_onebit_set_t *s) { s->has_last = 0; }

void zt_onebit_set_keep(zt_onebit_set_t *s, int i, const float *v)
{
    if (!s->on) return;
    uint8_t *k = s->keep[i];
    memset(k, 0, ZT_CEIL_DIV(s->numel[i], 8));
    for (size_t j = 0; j < s->numel[i]; j++)
        if (v[j] != 0.0f) k[j >> 3] |= (uint8_t)(1u << (j & 7));
}

/* The passes below keep, element by element, the operations and their order of the
 * tensor operations they stand for (one rounding each), and sum norms in double in
 * element order: they only fuse loops and do in vector lanes what a scalar loop did, so
 * results are bit for bit those of one loop per tensor operation. BLK elements go through
 * every stage of a fused pass while they sit in L1: memory sees one pass; the in-order
 * double sum (a chain of dependent adds) bounds the norm passes. */
enum { BLK = 1024 };

/* a byte's bits in reverse order (bit k to bit 7 - k) */
static inline unsigned rev8(unsigned b)
{
    return (unsigned)((((uint64_t)b * 0x80200802ull) & 0x0884422110ull) * 0x0101010101ull >> 32) & 0xffu;
}

/* sum + x[0]^2 + x[1]^2 + ... in double, in that order (the squares are exact) */
static inline double sumsq_in_order(double sum, const float *x, size_t n)
{
    for (size_t j = 0; j < n; j++) sum += (double)x[j] * (double)x[j];
    return sum;
}

/* Sign bits (DeepSpeed's x.sign().add_(1).bool(): set for x >= 0, -0 and NaN included,
 * clear below zero) of x[0, len), len a multiple of 8, most significant bit first, into
 * bits; x := x - scale sign(x), the error (sign * scale is exactly +-scale). The bits of
 * elements [k c, (k+1) c) go to bits + k stride. */
static void pack_error(float *restrict x, size_t len, float scale, uint8_t *restrict bits, size_t c, size_t stride)
{
#if defined(__AVX__)
    const __m256 sv = _mm256_set1_ps(scale), sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
#endif
    for (size_t k = 0; k < len / c; k++) {
        uint8_t *restrict out = bits + k * stride;
        float *restrict xk = x + k * c;
        for (size_t j = 0; j < c; j += 8) {
#if defined(__AVX__)
            const __m256 v = _mm256_loadu_ps(xk + j);
            const __m256 neg = _mm256_cmp_ps(v, zero, _CMP_LT_OQ);
            /* +-scale: scale with its sign bit set where v < 0 */
            _mm256_storeu_ps(xk + j, _mm256_sub_ps(v, _mm256_xor_ps(sv, _mm256_and_ps(neg, sign))));
            out[j / 8] = (uint8_t)rev8(~(unsigned)_mm256_movemask_ps(neg) & 0xffu);
#else
            unsigned byte = 0;
            for (size_t b = 0; b < 8; b++) {
                const float v = xk[j + b];
                const int bit = !(v < 0.0f);
                byte |= (unsigned)bit << (7 - b);
                xk[j + b] = v - scale * (bit ? 1.0f : -1.0f);
            }
            out[j / 8] = (uint8_t)byte;
#endif
        }
    }
}

#if defined(__AVX2__)
/* the 8 values +-w of a byte's bits, most significant first: w, its sign bit set where
 * the bit is clear */
static inline __m256 pm8(unsigned byte, __m256 wv)
{
    const __m256i sel = _mm256_setr_epi32(128, 64, 32, 16, 8, 4, 2, 1);
    const __m256i clear = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)byte), sel), _mm256_setzero_si256());
    return _mm256_xor_ps(wv, _mm256_and_ps(_mm256_castsi256_ps(clear), _mm256_set1_ps(-0.0f)));
}
#endif

/* out[j] := +w where bit j is set, -w where clear, j < len (the last byte of a cut tensor
 * partly used): the products DeepSpeed's decompression forms, sign * w being exactly +-w */
static void unpack_set(float *restrict out, const uint8_t *restrict bits, size_t len, float w)
{
    size_t j = 0;
#if defined(__AVX2__)
    for (const __m256 wv = _mm256_set1_ps(w); j + 8 <= len; j += 8) _mm256_storeu_ps(out + j, pm8(bits[j >> 3], wv));
#endif
    for (; j < len; j++) out[j] = (bits[j >> 3] >> (7 - (j & 7))) & 1 ? w : -w;
}

/* out[j] := out[j] + (+-w), j < len */
static void unpack_add(float *restrict out, const uint8_t *restrict bits, size_t len, float w)
{
    size_t j = 0;
#if defined(__AVX2__)
    for (const __m256 wv = _mm256_set1_ps(w); j + 8 <= len; j += 8)
        _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_loadu_ps(out + j), pm8(bits[j >> 3], wv)));
#endif
    for (; j < len; j++) out[j] += (bits[j >> 3] >> (7 - (j & 7))) & 1 ? w : -w;
}

/* the scale of a compressed buffer of len elements whose squares sum to ss */
static float scale_of(double ss, size_t len) { return (float)(sqrt(ss) / sqrt((double)len)); }

/* Worker pass of tensor i: x = m + worker_error into the worker error, its norm; with g,
 * m is first stepped (m b1 + (1-b1) g gscale, not stored: the exchange replaces it).
 * The padding is 0 + worker_error: unchanged. Returns the sum of squares. */
static double worker_norm(zt_onebit_set_t *s, int i, const float *restrict m, const float *restrict g,
                          const zt_onebit_hp_t *hp)
{
    float *restrict x = s->werr[i];
    const size_t numel = s->numel[i];
    const float b1 = hp ? hp->b1 : 0.0f, w1 = 1.0f - b1, gs = hp ? hp->gscale : 0.0f;
    double ss = 0.0;
    for (size_t b0 = 0; b0 < numel; b0 += BLK) {
        const size_t nb = ZT_MIN((size_t)BLK, numel - b0);
        float *restrict xb = x + b0;
        const float *restrict mb = m + b0;
        if (g) {
            const float *restrict gb = g + b0;
            for (size_t j = 0; j < nb; j++) xb[j] = (mb[j] * b1 + w1 * (gb[j] * gs)) + xb[j];
        } else {
            for (size_t j = 0; j < nb; j++) xb[j] = mb[j] + xb[j];
        }
        ss = sumsq_in_order(ss, xb, nb);
    }
    return sumsq_in_order(ss, x + numel, s->np[i] - numel);
}

/* Server pass of tensor i: y = sum over ranks r of +-scale_r / n (this rank's chunk of
 * every rank's signs, r in order, from 0) + server_error into the server error, its norm */
static double server_norm(zt_onebit_set_t *s, int i)
{
    const size_t n = (size_t)s->n, T = (size_t)s->T, B = s->B, C = s->chunk[i];
    float *restrict e = s->serr[i], *restrict y = s->x;
    double ss = 0.0;
    for (size_t b0 = 0; b0 < C; b0 += BLK) {
        const size_t nb = ZT_MIN((size_t)BLK, C - b0); /* a multiple of 8: C and BLK are */
        for (size_t j = 0; j < nb; j++) y[j] = 0.0f;
        for (size_t r = 0; r < n; r++)
            unpack_add(y, s->recv + r * B + s->boff[i] + b0 / 8, nb, s->rscale[r * T + (size_t)i] * (1.0f / (float)n));
        float *restrict eb = e + b0;
        for (size_t j = 0; j < nb; j++) eb[j] = y[j] + eb[j];
        ss = sumsq_in_order(ss, eb, nb);
    }
    return ss;
}

/* bits of the all-gathered result of tensor i for elements [at, at + len) (within one
 * server's chunk: r = at / chunk) unpacked to m */
static void result_range(const zt_onebit_set_t *s, int i, size_t at, size_t len, float *m)
{
    const size_t C = s->chunk[i], r = at / C, T = (size_t)s->T;
    const uint8_t *bits = s->rbits + r * s->B + s->boff[i];
    unpack_set(m, bits + (at - r * C) / 8, len, s->rsscale[r * T + (size_t)i]);
}

/* m (numel[i] floats) := the all-gathered result of tensor i: chunk r is server r's signs
 * times its scale */
static void decompress(const zt_onebit_set_t *s, int i, float *m)
{
    const size_t C = s->chunk[i];
    for (size_t at = 0; at < s->numel[i]; at += C) result_range(s, i, at, ZT_MIN(C, s->numel[i] - at), m + at);
}

/* the exchange, between the worker passes (scale[], send filled) and the results (rbits,
 * rsscale): all-to-all of sign bits, server passes, all-gathers */
static void exchange(zt_onebit_set_t *s, zt_comm_t *c)
{
    const size_t T = (size_t)s->T, B = s->B;
    zt_alltoall(c, s->g, s->send, s->recv, B, ZT_U8);
    zt_allgather(c, s->g, s->scale, s->rscale, T, ZT_F32);
    /* server: this rank's chunk of every tensor, averaged from the n compressed copies */
    for (size_t i = 0; i < T && !s->dry; i++) {
        const size_t C = s->chunk[i];
        s->sscale[i] = scale_of(server_norm(s, (int)i), C);
        pack_error(s->serr[i], C, s->sscale[i], s->sbits + s->boff[i], C, 0); /* now the server error */
    }
    zt_allgather(c, s->g, s->sbits, s->rbits, B, ZT_U8);
    zt_allgather(c, s->g, s->sscale, s->rsscale, T, ZT_F32);
    s->has_last = 1;
}

/* worker: compensate, compress; chunk r of tensor i goes to rank r */
static void worker(zt_onebit_set_t *s, int i, const float *m, const float *g, const zt_onebit_hp_t *hp)
{
    s->scale[i] = scale_of(worker_norm(s, i, m, g, hp), s->np[i]);
    pack_error(s->werr[i], s->np[i], s->scale[i], s->send + s->boff[i], s->chunk[i], s->B); /* now the worker error */
}

void zt_onebit_allreduce(zt_onebit_set_t *s, zt_comm_t *c, float *const *m)
{
    if (!s->on) return;
    if (s->dry) { /* the exchange's collectives alone, counted */
        exchange(s, c);
        return;
    }
    for (int i = 0; i < s->T; i++) worker(s, i, m[i], NULL, NULL);
    exchange(s, c);
    for (int i = 0; i < s->T; i++) decompress(s, i, m[i]);
}

/* p[j], j < n <= BLK: p = p - lr (m / (sqrt(v) + eps) + wd p), the square roots taken
 * in vector lanes first (sqrtf in the loop would keep it scalar: it may set errno) */
static void update_blk(float *restrict p, const float *restrict m, const float *restrict v, size_t n, float lr,
                       float eps, float wd)
{
    float sq[BLK];
    size_t j = 0;
#if defined(__AVX__)
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(sq + j, _mm256_sqrt_ps(_mm256_loadu_ps(v + j)));
#endif
    for (; j < n; j++) sq[j] = sqrtf(v[j]);
    for (j = 0; j < n; j++) {
        float u = m[j] / (sq[j] + eps);
        u = u + wd * p[j];
        p[j] = p[j] + -lr * u;
    }
}

/* m masked where asked, then the update, on n <= BLK elements */
static inline void mask_update(float *restrict p, float *restrict m, const float *restrict v, size_t n,
                               const zt_onebit_hp_t *hp, float wd, int mask)
{
    if (mask) zt_onebit_mask(m, v, n);
    update_blk(p, m, v, n, hp->lr, hp->eps, wd);
}

/* one tensor without an exchange (warm-up, or one rank): moments, mask after the freeze,
 * update, a block at a time */
static void step_local(const zt_onebit_tensor_t *t, const zt_onebit_hp_t *hp)
{
    for (size_t b0 = 0; b0 < t->n; b0 += BLK) {
        const size_t nb = ZT_MIN((size_t)BLK, t->n - b0);
        zt_onebit_moments(t->m + b0, t->v + b0, t->g + b0, nb, hp->b1, hp->b2, hp->gscale, hp->frozen);
        mask_update(t->p + b0, t->m + b0, t->v + b0, nb, hp, t->wd, hp->frozen);
    }
}

void zt_onebit_step(zt_onebit_set_t *s, zt_comm_t *c, const zt_onebit_tensor_t *t, int nt, const zt_onebit_hp_t *hp)
{
    if (s->dry) { /* nothing computed; the compressed stage's exchange counted */
        if (hp->frozen && s->on) exchange(s, c);
        return;
    }
    if (!hp->frozen || !s->on) {
        for (int i = 0; i < nt; i++) step_local(&t[i], hp);
        return;
    }
    if (nt != s->T) zt_fatal("1-bit Adam: %d tensors exchanged in a set of %d", nt, s->T);
    for (int i = 0; i < s->T; i++) worker(s, i, t[i].m, t[i].g, hp);
    exchange(s, c);
    /* the result into m, masked, and the update, a block at a time (a block lies within
     * one server's chunk: chunks are multiples of 8 n lcm(n, 8) / n elements, BLK a
     * multiple of 8, so blocks are cut at chunk ends) */
    for (int i = 0; i < s->T; i++) {
        const size_t C = s->chunk[i], numel = s->numel[i];
        for (size_t b0 = 0; b0 < numel;) {
            const size_t nb = ZT_MIN(ZT_MIN((size_t)BLK, numel - b0), (b0 / C + 1) * C - b0);
            result_range(s, i, b0, nb, t[i].m + b0);
            mask_update(t[i].p + b0, t[i].m + b0, t[i].v + b0, nb, hp, t[i].wd, 1);
            b0 += nb;
        }
    }
}

void zt_onebit_last(const zt_onebit_set_t *s, int i, float *m)
{
    decompress(s, i, m);
    const uint8_t *k = s->keep[i];
    for (size_t j = 0; j < s->numel[i]; j++)
        if (!((k[j >> 3] >> (j & 7)) & 1)) m[j] = 0.0f;
}

void zt_onebit_moments(float *restrict m, float *restrict v, const float *restrict g, size_t n, float b1, float b2,
                       float gscale, int frozen)
{
    const float w1 = 1.0f - b1, w2 = 1.0f - b2;
    if (frozen) {
        for (size_t j = 0; j < n; j++) m[j] = m[j] * b1 + w1 * (g[j] * gscale);
        return;
    }
    for (size_t j = 0; j < n; j++) {
        const float gi = g[j] * gscale;
        m[j] = m[j] * b1 + w1 * gi;
        v[j] = v[j] * b2 + w2 * gi * gi;
    }
}

void zt_onebit_mask(float *restrict m, const float *restrict v, size_t n)
{
    for (size_t j = 0; j < n; j++) m[j] = v[j] == 0.0f ? 0.0f : m[j];
}

void zt_onebit_update(float *restrict p, const float *restrict m, const float *restrict v, size_t n, float lr,
                      float eps, float wd)
{
    for (size_t b0 = 0; b0 < n; b0 += BLK) update_blk(p + b0, m + b0, v + b0, ZT_MIN((size_t)BLK, n - b0), lr, eps, wd);
}
