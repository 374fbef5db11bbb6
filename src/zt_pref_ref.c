/* zt_pref_ref.c — the compact batch of a DPO reference pass that computes each pair's
 * prompt once (zt_pref_ref.h). */
#include "zt_pref_ref.h"

#include "zt_common.h"

#include <stdlib.h>
#include <string.h>

/* one past row b's last position with a loss; 0 for none */
static int loss_end(const int32_t *tgt, int Tf, int b)
{
    for (int t = Tf; t > 0; t--)
        if (tgt[(size_t)b * Tf + t - 1] >= 0) return t;
    return 0;
}

/* The positions before which rows c and r hold the same ids and neither a loss: the
 * prefix r takes from c (at most c's computed positions, end_c) */
static int shared_prefix(const int32_t *inp, const int32_t *tgt, int Tf, int c, int r, int end_c)
{
    const int32_t *ic = inp + (size_t)c * Tf, *ir = inp + (size_t)r * Tf;
    const int32_t *tc = tgt + (size_t)c * Tf, *tr = tgt + (size_t)r * Tf;
    int s = 0;
    while (s < end_c && ic[s] == ir[s] && tc[s] < 0 && tr[s] < 0) s++;
    return s;
}

void zt_pref_share_make(zt_pref_share_t *s, const int32_t *inp, const int32_t *tgt, int Bf, int Tf)
{
    const size_t Nf = (size_t)Bf * Tf;
    memset(s, 0, sizeof *s);
    s->full = zt_malloc(Nf * sizeof *s->full);
    for (size_t i = 0; i < Nf; i++) s->full[i] = -1;
    /* [lo, hi) of each row computed; lo > 0 only for a rejected row after its prefix */
    int *lo = zt_calloc(2 * (size_t)Bf, sizeof *lo), *hi = lo + Bf;
    for (int b = 0; b < Bf; b++) {
        hi[b] = loss_end(tgt, Tf, b);
        if (b % 2) lo[b] = ZT_MIN(shared_prefix(inp, tgt, Tf, b - 1, b, hi[b - 1]), hi[b]);
        s->n += hi[b] - lo[b];
    }
    s->B = Bf;
    s->T = ZT_MAX(1, (s->n + Bf - 1) / Bf);
    const size_t Nc = (size_t)s->B * s->T;
    int32_t *a = zt_malloc(5 * Nc * sizeof *a);
    s->inp = a, s->tgt = a + Nc, s->pos = a + 2 * Nc, s->own = a + 3 * Nc, s->row = a + 4 * Nc;
    size_t j = 0;
    for (int b = 0; b < Bf; b++) {
        for (int t = lo[b]; t < hi[b]; t++, j++) {
            const size_t i = (size_t)b * Tf + t;
            s->inp[j] = inp[i], s->tgt[j] = tgt[i], s->pos[j] = t;
            s->own[j] = (int32_t)i, s->row[j] = b;
            s->full[i] = (int32_t)j;
        }
        /* the shared prefix: the chosen row's tokens */
        for (int t = 0; t < lo[b]; t++) s->full[(size_t)b * Tf + t] = s->full[(size_t)(b - 1) * Tf + t];
    }
    for (; j < Nc; j++) s->inp[j] = 0, s->tgt[j] = -1, s->pos[j] = 0, s->own[j] = 0, s->row[j] = -1;
    free(lo);
}

void zt_pref_share_free(zt_pref_share_t *s)
{
    free(s->inp);
    free(s->full);
    memset(s, 0, sizeof *s);
}

void zt_pref_share_sums(const zt_pref_share_t *s, const float *losses, int Bf, double *sum)
{
    for (int b = 0; b < Bf; b++) sum[b] = 0.0;
    for (size_t j = 0; j < (size_t)s->n; j++) sum[s->row[j]] += -(double)losses[j];
}
