/* zt_onebit.c — 1-bit Adam's update and compressed all-reduce (see zt_onebit.h).
 *
 * Arithmetic in torch's order, one rounding per tensor operation (no contraction),
 * so a float64 replay of DeepSpeed's code (tests/reference/onebit_replay.py) agrees
 * to float rounding. Norms are summed in double. */
#pragma GCC optimize("fp-contract=off")
#include "zt_onebit.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

struct zt_onebit_set {
    int T, n, rank;
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

double zt_onebit_traffic(const size_t *numel, int ntensors, int n)
{
    if (n < 2) return 0.0;
    double B = 0.0;
    for (int i = 0; i < ntensors; i++) B += (double)(zt_onebit_padded(numel[i], n) / (size_t)n / 8);
    return 2.0 * n * B + 2.0 * 4.0 * n * ntensors;
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

zt_onebit_set_t *zt_onebit_set_create(const size_t *numel, int ntensors, zt_group_t *g, int sharded)
{
    zt_onebit_set_t *s = zt_calloc(1, sizeof *s);
    s->T = ntensors;
    s->g = g;
    s->n = g ? g->size : 1;
    s->rank = g ? g->rank : 0;
    s->sharded = sharded;
    if (s->n < 2) return s;
    if (sharded) s->keep = zt_calloc((size_t)ntensors, sizeof(uint8_t *));
    for (int i = 0; sharded && i < ntensors; i++) s->keep[i] = zt_calloc(ZT_CEIL_DIV(numel[i], 8), 1);
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
        s->werr[i] = zt_calloc(s->np[i], sizeof(float));
        s->serr[i] = zt_calloc(s->chunk[i], sizeof(float));
        maxnp = ZT_MAX(maxnp, s->np[i]);
    }
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
    *len = s->n > 1 ? s->np[i] : 0;
    return s->n > 1 ? s->werr[i] : NULL;
}

float *zt_onebit_server_error(zt_onebit_set_t *s, int i, size_t *len)
{
    *len = s->n > 1 ? s->chunk[i] : 0;
    return s->n > 1 ? s->serr[i] : NULL;
}

void zt_onebit_reset(zt_onebit_set_t *s)
{
    for (int i = 0; s->n > 1 && i < s->T; i++) {
        memset(s->werr[i], 0, s->np[i] * sizeof(float));
        memset(s->serr[i], 0, s->chunk[i] * sizeof(float));
    }
}

int zt_onebit_has_last(const zt_onebit_set_t *s) { return s->has_last; }

void zt_onebit_forget(zt_onebit_set_t *s) { s->has_last = 0; }

void zt_onebit_set_keep(zt_onebit_set_t *s, int i, const float *v)
{
    if (s->n < 2) return;
    uint8_t *k = s->keep[i];
    memset(k, 0, ZT_CEIL_DIV(s->numel[i], 8));
    for (size_t j = 0; j < s->numel[i]; j++)
        if (v[j] != 0.0f) k[j >> 3] |= (uint8_t)(1u << (j & 7));
}

/* DeepSpeed's x.sign().add_(1).bool(): set for x >= 0 (and NaN), clear below zero */
static inline int sign_bit(float x) { return !(x < 0.0f); }

/* out[j] (op) +-w for the len bits at bits (len a multiple of 8 but for the last byte of a
 * cut tensor): +w where the bit is set. sign * w is exactly +-w, so these are the
 * products DeepSpeed's decompression forms, without a multiply or a division an element. */
static void unpack_set(float *out, const uint8_t *bits, size_t len, float w)
{
    for (size_t j = 0; j < len; j++) out[j] = (bits[j >> 3] >> (7 - (j & 7))) & 1 ? w : -w;
}

static void unpack_add(float *out, const uint8_t *bits, size_t len, float w)
{
    for (size_t b = 0; b < len / 8; b++) {
        const unsigned byte = bits[b];
        float *o = out + 8 * b;
        for (int k = 0; k < 8; k++) o[k] += (byte >> (7 - k)) & 1 ? w : -w;
    }
}

/* Compresses x[0, len): returns the scale ||x|| / sqrt(len), replaces x by its error
 * x - scale sign(x), and packs the sign bits of x into bits (len / 8 bytes, len a
 * multiple of 8), the bits of elements [k c, (k+1) c) at bits + k stride (k < len/c). */
static float compress(float *x, size_t len, uint8_t *bits, size_t c, size_t stride)
{
    double ss = 0.0;
    for (size_t j = 0; j < len; j++) ss += (double)x[j] * (double)x[j];
    const float scale = (float)(sqrt(ss) / sqrt((double)len));
    for (size_t k = 0; k < len / c; k++) {
        uint8_t *out = bits + k * stride;
        for (size_t j = 0; j < c; j += 8) {
            unsigned byte = 0;
            for (size_t b = 0; b < 8; b++) {
                const float v = x[k * c + j + b];
                const int bit = sign_bit(v);
                byte |= (unsigned)bit << (7 - b);
                x[k * c + j + b] = v - scale * (bit ? 1.0f : -1.0f);
            }
            out[j / 8] = (uint8_t)byte;
        }
    }
    return scale;
}

/* m (numel[i] floats) := the all-gathered result of tensor i: chunk r is server r's signs
 * times its scale */
static void decompress(const zt_onebit_set_t *s, int i, float *m)
{
    const size_t C = s->chunk[i], T = (size_t)s->T;
    for (size_t r = 0, at = 0; at < s->numel[i]; r++, at += C)
        unpack_set(m + at, s->rbits + r * s->B + s->boff[i], ZT_MIN(C, s->numel[i] - at), s->rsscale[r * T + (size_t)i]);
}

void zt_onebit_allreduce(zt_onebit_set_t *s, zt_comm_t *c, float *const *m)
{
    if (s->n < 2) return;
    const size_t n = (size_t)s->n, T = (size_t)s->T, B = s->B;
    /* worker: compensate, compress; chunk r of tensor i goes to rank r */
    for (size_t i = 0; i < T; i++) {
        float *x = s->werr[i];
        const size_t N = s->np[i], C = s->chunk[i];
        for (size_t j = 0; j < s->numel[i]; j++) x[j] = m[i][j] + x[j];
        /* the padding is 0 + worker_error: unchanged */
        s->scale[i] = compress(x, N, s->send + s->boff[i], C, B); /* x is now the worker error */
    }
    zt_alltoall(c, s->g, s->send, s->recv, B, ZT_U8);
    zt_allgather(c, s->g, s->scale, s->rscale, T, ZT_F32);
    /* server: this rank's chunk of every tensor, averaged from the n compressed copies */
    for (size_t i = 0; i < T; i++) {
        const size_t C = s->chunk[i];
        float *y = s->x;
        for (size_t j = 0; j < C; j++) y[j] = 0.0f;
        for (size_t r = 0; r < n; r++)
            unpack_add(y, s->recv + r * B + s->boff[i], C, s->rscale[r * T + i] * (1.0f / (float)n));
        float *e = s->serr[i];
        for (size_t j = 0; j < C; j++) e[j] = y[j] + e[j];
        s->sscale[i] = compress(e, C, s->sbits + s->boff[i], C, 0); /* e is now the server error */
    }
    zt_allgather(c, s->g, s->sbits, s->rbits, B, ZT_U8);
    zt_allgather(c, s->g, s->sscale, s->rsscale, T, ZT_F32);
    s->has_last = 1;
    for (size_t i = 0; i < T; i++) decompress(s, (int)i, m[i]);
}

void zt_onebit_last(const zt_onebit_set_t *s, int i, float *m)
{
    decompress(s, i, m);
    const uint8_t *k = s->keep[i];
    for (size_t j = 0; j < s->numel[i]; j++)
        if (!((k[j >> 3] >> (j & 7)) & 1)) m[j] = 0.0f;
}

void zt_onebit_moments(float *m, float *v, const float *g, size_t n, float b1, float b2, float gscale, int frozen)
{
    const float w1 = 1.0f - b1, w2 = 1.0f - b2;
    for (size_t j = 0; j < n; j++) {
        const float gi = g[j] * gscale;
        m[j] = m[j] * b1 + w1 * gi;
        if (!frozen) v[j] = v[j] * b2 + w2 * gi * gi;
    }
}

void zt_onebit_mask(float *m, const float *v, size_t n)
{
    for (size_t j = 0; j < n; j++)
        if (v[j] == 0.0f) m[j] = 0.0f;
}

void zt_onebit_update(float *p, const float *m, const float *v, size_t n, float lr, float eps, float wd)
{
    for (size_t j = 0; j < n; j++) {
        float u = m[j] / (sqrtf(v[j]) + eps);
        u = u + wd * p[j];
        p[j] = p[j] + -lr * u;
    }
}
