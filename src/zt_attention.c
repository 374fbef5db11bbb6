/* zt_attention.c — a block's self-attention over the model's batch (zt_model_internal.h):
 * the dispatch between local attention (the KV cache's included), Ulysses and ring
 * sequence parallelism, with the sliding window and packed rows' segments, and the
 * scratch each needs. A family hands it qkv rows and gets the attention's output rows
 * (and in the backward dqkv); which of the three runs, and where its activations live,
 * is this file's alone.
 *
 * Ulysses (d.sp_size > 1): the model runs T positions of each sequence; attention needs
 * all sp T of them: x (B,T,W), whose rows hold nblk blocks of heads side by side (q | k |
 * v: heads[k] heads of hd each), goes to y (B, sp T, W') with every position and this
 * rank's share of each block's heads (one all-to-all): heads / sp of them, or, where a
 * block has fewer heads than ranks (KV heads), the one head this rank's query heads read
 * (replicated). gather is the inverse; a replicated head's parts are summed (it carries
 * gradients there). The first position of this rank's T is sp_rank T.
 *
 * Ring (d.sp_ring): the causal attention of the whole sequence from this rank's qkv
 * (N,S), its two chunks' rows chunk-major; K|V blocks go round the sp ring, each block
 * pair's result is merged through the log-sum-exp, the next block's transfer overlapping
 * the current block's compute. out (N, NH HD); lse (2, B, NH, T/2) per chunk. The
 * backward adds dq into dqkv's q columns and the K|V gradients, gone round the ring with
 * their blocks, into its k, v columns. window > 0: a sliding window, the block pairs
 * wholly outside it skipped. */
#include "zt_model_internal.h"

#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

/* ---- Ulysses ---------------------------------------------------------------------------- */

static void sp_scratch(zt_model_t *m, size_t floats)
{
    if (m->d.sp_size <= 1 || floats <= m->sp_floats) return;
    if (m->sp_send) {
        m->be->free(m->sp_send);
        m->be->free(m->sp_recv);
        m->act_bytes -= 2 * m->sp_floats * sizeof(float);
    }
    m->sp_floats = floats;
    m->sp_send = zt_model_alloc(m, floats * sizeof(float));
    m->sp_recv = zt_model_alloc(m, floats * sizeof(float));
}

/* Block k of a row: heads[k] heads of hd. Rank j takes per(k) of them from first(k, j):
 * an even share, or, with fewer heads than ranks, the one its query heads read (GQA's
 * grouping, q head h -> KV head h / (NH / NKV), with the query heads split evenly). */
static int sp_per(int heads, int sp) { return heads >= sp ? heads / sp : 1; }
static int sp_first(int heads, int sp, int j) { return heads >= sp ? j * (heads / sp) : j * heads / sp; }

static void sp_layout(const zt_model_t *m, int nblk, const int *heads, int hd, int *W, int *Wj)
{
    *W = *Wj = 0;
    for (int k = 0; k < nblk; k++) *W += heads[k] * hd, *Wj += sp_per(heads[k], m->d.sp_size) * hd;
    if ((size_t)m->B * m->T * ZT_MAX(*W, *Wj * m->d.sp_size) > m->sp_floats)
        zt_fatal("sequence parallelism: rows of %d floats beyond the scratch", *W);
}

/* Between the all-to-all's blocks, (sp, B, T, Wj): block i is positions [i T, (i + 1) T)
 * of every sequence, and the sequences (B, sp T, Wj): into_sequence copies the first
 * into the second, else the second into the first */
static void sp_chunks(const zt_model_t *m, float *dst, const float *src, int Wj, int into_sequence)
{
    const int sp = m->d.sp_size, B = m->B, T = m->T;
    for (int i = 0; i < sp; i++)
        for (int b = 0; b < B; b++) {
            const size_t seq = ((size_t)b * sp * T + (size_t)i * T) * Wj, blk = ((size_t)i * B * T + (size_t)b * T) * Wj;
            m->be->copy(dst + (into_sequence ? seq : blk), src + (into_sequence ? blk : seq),
                        (size_t)T * Wj * sizeof(float));
        }
}

static void sp_scatter_heads(zt_model_t *m, const float *x, int nblk, const int *heads, int hd, float *y)
{
    const zt_backend_t *be = m->be;
    const int sp = m->d.sp_size, B = m->B, T = m->T, N = B * T;
    int W, Wj;
    sp_layout(m, nblk, heads, hd, &W, &Wj);
    /* send block j (N, Wj): rank j's heads of every block */
    for (int j = 0; j < sp; j++)
        for (int k = 0, o = 0, po = 0; k < nblk; o += heads[k] * hd, po += sp_per(heads[k], sp) * hd, k++)
            be->copy_rows(m->sp_send + (size_t)j * N * Wj + po, Wj, x + o + sp_first(heads[k], sp, j) * hd, W, N,
                          sp_per(heads[k], sp) * hd);
    m->ac.sp_alltoall(m->ac.ctx, m->sp_send, m->sp_recv, (size_t)N * Wj);
    sp_chunks(m, y, m->sp_recv, Wj, 1);
}

static void sp_gather_heads(zt_model_t *m, const float *y, int nblk, const int *heads, int hd, float *x)
{
    const zt_backend_t *be = m->be;
    const int sp = m->d.sp_size, B = m->B, T = m->T, N = B * T;
    int W, Wj;
    sp_layout(m, nblk, heads, hd, &W, &Wj);
    sp_chunks(m, m->sp_send, y, Wj, 0);
    m->ac.sp_alltoall(m->ac.ctx, m->sp_send, m->sp_recv, (size_t)N * Wj);
    /* block j: rank j's heads for this rank's positions; a head several ranks shared
     * (fewer heads than ranks) gets the sum of their parts: the gradient of a copy */
    for (int k = 0, o = 0, po = 0; k < nblk; o += heads[k] * hd, po += sp_per(heads[k], sp) * hd, k++) {
        const int wk = sp_per(heads[k], sp) * hd;
        if (heads[k] >= sp) {
            for (int j = 0; j < sp; j++)
                be->copy_rows(x + o + sp_first(heads[k], sp, j) * hd, W, m->sp_recv + (size_t)j * N * Wj + po, Wj, N,
                              wk);
            continue;
        }
        /* the send buffer is free now: each shared head summed there, (N, hd) */
        for (int h = 0; h < heads[k]; h++) {
            float *acc = m->sp_send, *part = m->sp_send + (size_t)N * hd;
            int first = 1;
            for (int j = 0; j < sp; j++) {
                if (sp_first(heads[k], sp, j) != h) continue;
                be->copy_rows(first ? acc : part, hd, m->sp_recv + (size_t)j * N * Wj + po, Wj, N, hd);
                if (!first) be->accumulate(acc, part, (size_t)N * hd);
                first = 0;
            }
            be->copy_rows(x + o + h * hd, W, acc, hd, N, hd);
        }
    }
}

/* ---- ring attention ---------------------------------------------------------------
 * Rank i holds chunks i and 2sp-1-i of each sequence (a, b below). Against the K|V of
 * rank j's chunks (j, 2sp-1-j): a sees j's first chunk when j < i, b sees j's first
 * always and its second when j > i; j = i gives the two causal diagonals and (b, a).
 * So every step but the first is two full c x c blocks on every rank: the causal load
 * balances. A K|V block is (2, B, c, 2 NKV HD): k | v of each row side by side. */
static void ring_scratch(zt_model_t *m, int NH, int NKV, int HD)
{
    if (m->ring_out) return;
    const size_t N = (size_t)m->Bmax * m->Tmax, kw = 2 * (size_t)NKV * HD, F = sizeof(float);
    m->ring_kw = kw, m->ring_q = (size_t)NH * HD, m->ring_nh = (size_t)NH;
    /* ZT_RING_SERIAL=1 (benchmarks: tools/bench-mesh.sh): each transfer waited for at
     * once, so its time is the communication the overlap has to hide */
    const char *e = getenv("ZT_RING_SERIAL");
    m->ring_serial = e && strcmp(e, "1") == 0;
    for (int k = 0; k < 2; k++) {
        m->ring_kv[k] = zt_model_alloc(m, N * kw * F);
        m->ring_dkv[k] = zt_model_alloc(m, N * kw * F);
    }
    m->ring_dkv_in = zt_model_alloc(m, N * kw * F);
    m->ring_out = zt_model_alloc(m, N / 2 * m->ring_q * F);
    m->ring_lse = zt_model_alloc(m, N / 2 * (size_t)NH * F);
    /* packed rows: every chunk's segment ids, chunk-major (2 sp, B, T/2) */
    const size_t nseg = N * (size_t)m->d.sp_size;
    m->ring_seg = zt_model_alloc(m, nseg * sizeof(int32_t));
    m->host_ring_seg = m->be->alloc_host(nseg * sizeof(int32_t));
}

/* one block pair: q rows of chunk qh (0, 1) against K|V chunk kh of block kv; delta: the
 * q chunk's first position less the k chunk's (a sliding window's offset) */
typedef struct ring_pair { int qh, kh, causal, delta; } ring_pair_t;

/* a packed batch's segment ids of rank j's chunk h (B, T/2), or NULL */
static const int32_t *ring_seg(const zt_model_t *m, int j, int h)
{
    if (!m->seg) return NULL;
    return m->ring_seg + (size_t)zt_model_ring_chunk(m->d.sp_size, j, h) * m->B * (m->T / 2);
}

/* The pairs of step `step`; with a sliding window, the non-diagonal pairs none of whose
 * keys any query's window reaches (the nearest pair of positions window or more apart)
 * are left out, so a window shorter than the sequence skips most blocks */
static int ring_pairs(const zt_model_t *m, int step, int window, ring_pair_t *p)
{
    const int sp = m->d.sp_size, i = m->d.sp_rank, j = (i - step + sp) % sp, c = m->T / 2;
    ring_pair_t all[3];
    int n = 0;
    if (step == 0) {
        all[n++] = (ring_pair_t){0, 0, 1, 0};
        all[n++] = (ring_pair_t){1, 1, 1, 0};
        all[n++] = (ring_pair_t){1, 0, 0, 0};
    } else {
        if (j < i) all[n++] = (ring_pair_t){0, 0, 0, 0};
        all[n++] = (ring_pair_t){1, 0, 0, 0};
        if (j > i) all[n++] = (ring_pair_t){1, 1, 0, 0};
    }
    int kept = 0;
    for (int k = 0; k < n; k++) {
        ring_pair_t q = all[k];
        q.delta = (zt_model_ring_chunk(sp, i, q.qh) - zt_model_ring_chunk(sp, j, q.kh)) * c;
        if (!q.causal && window && q.delta - (c - 1) >= window) continue;
        p[kept++] = q;
    }
    return kept;
}

static void ring_forward(zt_model_t *m, const float *qkv, int NH, int NKV, int HD, int window, float *out,
                         float *lse)
{
    const zt_backend_t *be = m->be;
    const int B = m->B, c = m->T / 2, sp = m->d.sp_size, S = (NH + 2 * NKV) * HD, kw = 2 * NKV * HD;
    const size_t Nh = (size_t)B * c, Q = (size_t)NH * HD, L = (size_t)B * NH * c;
    /* this rank's K|V, both chunks */
    be->copy_rows(m->ring_kv[0], kw, qkv + Q, S, 2 * (int)Nh, kw);
    int cur = 0;
    for (int s = 0; s < sp; s++) {
        void *h = s + 1 < sp ? m->ac.sp_ring_start(m->ac.ctx, m->ring_kv[cur], m->ring_kv[!cur], 2 * Nh * kw) : NULL;
        if (h && m->ring_serial) m->ac.sp_ring_wait(m->ac.ctx, h), h = NULL;
        ring_pair_t p[3];
        const int np = ring_pairs(m, s, window, p);
        for (int k = 0; k < np; k++) {
            const float *kv = m->ring_kv[cur] + (size_t)p[k].kh * Nh * kw;
            float *o = out + (size_t)p[k].qh * Nh * Q, *l = lse + (size_t)p[k].qh * L;
            /* the two diagonals start their chunk's result; everything else merges in */
            const int first = s == 0 && p[k].causal;
            const int j = (m->d.sp_rank - s + sp) % sp;
            be->attention_block_forward(first ? o : m->ring_out, first ? l : m->ring_lse,
                                        qkv + (size_t)p[k].qh * Nh * S, S, kv, kv + (size_t)NKV * HD, kw,
                                        ring_seg(m, m->d.sp_rank, p[k].qh), ring_seg(m, j, p[k].kh), B, c, c, NH,
                                        NKV, HD, p[k].causal, window, p[k].delta);
            if (!first) be->attention_merge(o, l, m->ring_out, m->ring_lse, B, c, NH, HD);
            if (h) m->ac.sp_ring_progress(m->ac.ctx, h);
        }
        if (h) m->ac.sp_ring_wait(m->ac.ctx, h);
        cur = !cur;
    }
}

static void ring_backward(zt_model_t *m, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, int NH, int NKV, int HD, int window)
{
    const zt_backend_t *be = m->be;
    const int B = m->B, c = m->T / 2, sp = m->d.sp_size, S = (NH + 2 * NKV) * HD, kw = 2 * NKV * HD;
    const size_t Nh = (size_t)B * c, Q = (size_t)NH * HD, L = (size_t)B * NH * c, n = 2 * Nh * kw;
    be->copy_rows(m->ring_kv[0], kw, qkv + Q, S, 2 * (int)Nh, kw);
    int cur = 0;
    void *dh = NULL;
    for (int s = 0; s < sp; s++) {
        /* the next K|V block comes while this one's gradients are computed */
        void *h = s + 1 < sp ? m->ac.sp_ring_start(m->ac.ctx, m->ring_kv[cur], m->ring_kv[!cur], n) : NULL;
        if (h && m->ring_serial) m->ac.sp_ring_wait(m->ac.ctx, h), h = NULL;
        float *dkv = m->ring_dkv[s & 1]; /* free: its send (two steps ago) has completed */
        be->memzero(dkv, n * sizeof(float));
        ring_pair_t p[3];
        const int np = ring_pairs(m, s, window, p);
        for (int k = 0; k < np; k++) {
            const size_t ko = (size_t)p[k].kh * Nh * kw, qo = (size_t)p[k].qh * Nh;
            const float *kv = m->ring_kv[cur] + ko;
            const int j = (m->d.sp_rank - s + sp) % sp;
            be->attention_block_backward(dqkv + qo * S, dkv + ko, dkv + ko + (size_t)NKV * HD, dout + qo * Q,
                                         qkv + qo * S, S, kv, kv + (size_t)NKV * HD, kw,
                                         ring_seg(m, m->d.sp_rank, p[k].qh), ring_seg(m, j, p[k].kh), out + qo * Q,
                                         lse + (size_t)p[k].qh * L, B, c, c, NH, NKV, HD, p[k].causal, window,
                                         p[k].delta);
            if (h) m->ac.sp_ring_progress(m->ac.ctx, h);
            if (dh) m->ac.sp_ring_progress(m->ac.ctx, dh);
        }
        /* the previous ranks' part of this block's gradients arrived meanwhile: add it,
         * and pass the sum on (after the last step it goes home: rank i + 1 has block i + 1) */
        if (dh || m->ring_have_in) {
            if (dh) m->ac.sp_ring_wait(m->ac.ctx, dh);
            be->accumulate(dkv, m->ring_dkv_in, n);
            m->ring_have_in = 0;
        }
        dh = m->ac.sp_ring_start(m->ac.ctx, dkv, m->ring_dkv_in, n);
        if (m->ring_serial && s + 1 < sp) {
            m->ac.sp_ring_wait(m->ac.ctx, dh);
            dh = NULL;
            /* the partial is in ring_dkv_in already: the next step adds it */
            m->ring_have_in = 1;
        }
        if (h) m->ac.sp_ring_wait(m->ac.ctx, h);
        cur = !cur;
    }
    if (dh) m->ac.sp_ring_wait(m->ac.ctx, dh);
    /* this rank's own K|V gradients, whole */
    be->copy_rows(dqkv + Q, S, m->ring_dkv_in, kw, 2 * (int)Nh, kw);
}

/* ---- the helper ----------------------------------------------------------------------- */

/* Ulysses: (B, sp T) rows of this rank's q, k and v heads, KV heads replicated where fewer
 * than sp: N (NH + 2 max(NKV, sp)) HD floats */
static size_t sp_row_floats(const zt_model_dims_t *d, size_t N)
{
    return N * ((size_t)d->NH + 2 * (size_t)ZT_MAX(d->NKV, d->sp_size)) * d->HD;
}

static int ulysses(const zt_model_dims_t *d) { return d->sp_size > 1 && !d->sp_ring; }
static int ring(const zt_model_dims_t *d) { return d->sp_size > 1 && d->sp_ring; }

void zt_attention_init(zt_model_t *m, zt_attention_t *at)
{
    const zt_model_dims_t *d = &m->d;
    const size_t N = (size_t)m->Bmax * m->Tmax, Q = (size_t)d->NH * d->HD, F = sizeof(float), L = (size_t)d->L;
    memset(at, 0, sizeof *at);
    at->lse = zt_calloc(L ? L : 1, sizeof *at->lse);
    at->qkv_sp = zt_calloc(L ? L : 1, sizeof *at->qkv_sp);
    at->out_sp = zt_calloc(L ? L : 1, sizeof *at->out_sp);
    for (size_t l = 0; l < L; l++) {
        if (m->recompute && l > 0) { /* one block's worth, shared */
            at->lse[l] = at->lse[0], at->qkv_sp[l] = at->qkv_sp[0], at->out_sp[l] = at->out_sp[0];
            continue;
        }
        at->lse[l] = zt_model_alloc(m, (size_t)m->Bmax * d->NH * m->Tmax * F);
        if (ulysses(d)) {
            at->qkv_sp[l] = zt_model_alloc(m, sp_row_floats(d, N) * F);
            at->out_sp[l] = zt_model_alloc(m, N * Q * F);
        }
    }
    if (ring(d)) ring_scratch(m, d->NH, d->NKV, d->HD);
    if (ulysses(d)) {
        at->dqkv_sp = zt_model_alloc(m, sp_row_floats(d, N) * F);
        at->dout_sp = zt_model_alloc(m, N * Q * F);
        sp_scratch(m, sp_row_floats(d, N));
    }
}

void zt_attention_free(zt_model_t *m, zt_attention_t *at)
{
    const zt_backend_t *be = m->be;
    for (int l = 0; l < m->d.L; l++) {
        if (m->recompute && l > 0) break;
        be->free(at->lse[l]);
        if (at->qkv_sp[l]) be->free(at->qkv_sp[l]), be->free(at->out_sp[l]);
    }
    if (at->dqkv_sp) be->free(at->dqkv_sp), be->free(at->dout_sp);
    free(at->lse);
    free(at->qkv_sp);
    free(at->out_sp);
}

void zt_attention_forward(zt_model_t *m, zt_attention_t *at, int l, int window, const float *qkv, float *out)
{
    const zt_model_dims_t *d = &m->d;
    if (ring(d)) {
        ring_forward(m, qkv, d->NH, d->NKV, d->HD, window, out, at->lse[l]);
    } else if (ulysses(d)) {
        /* every position for this rank's share of the heads, and back; m->seg (packed
         * rows, or NULL) covers whole sequences */
        const int sp = d->sp_size, h[3] = {d->NH, d->NKV, d->NKV}, nkv = ZT_MAX(d->NKV / sp, 1);
        sp_scatter_heads(m, qkv, 3, h, d->HD, at->qkv_sp[l]); // (B, sp T, (NH + 2 nkv) HD / sp)
        m->be->attention_forward(at->out_sp[l], at->lse[l], at->qkv_sp[l], m->seg, m->B, sp * m->T, d->NH / sp, nkv,
                                 d->HD, window);
        sp_gather_heads(m, at->out_sp[l], 1, h, d->HD, out); // (N, NH HD)
    } else {
        zt_model_self_attention(m, l, qkv, out, at->lse[l], d->NH, d->NKV, d->HD, window);
    }
}

void zt_attention_backward(zt_model_t *m, zt_attention_t *at, int l, int window, const float *qkv,
                           const float *out, const float *dout, float *dqkv)
{
    const zt_model_dims_t *d = &m->d;
    const zt_backend_t *be = m->be;
    const size_t N = (size_t)m->B * m->T, F = sizeof(float);
    if (ring(d)) {
        be->memzero(dqkv, N * ((size_t)d->NH + 2 * (size_t)d->NKV) * d->HD * F);
        ring_backward(m, dqkv, dout, qkv, out, at->lse[l], d->NH, d->NKV, d->HD, window);
    } else if (ulysses(d)) {
        const int sp = d->sp_size, h[3] = {d->NH, d->NKV, d->NKV}, nkv = ZT_MAX(d->NKV / sp, 1);
        sp_scatter_heads(m, dout, 1, h, d->HD, at->dout_sp);
        be->memzero(at->dqkv_sp, sp_row_floats(d, N) * F);
        be->attention_backward(at->dqkv_sp, at->dout_sp, at->qkv_sp[l], at->out_sp[l], at->lse[l], m->seg, m->B,
                               sp * m->T, d->NH / sp, nkv, d->HD, window);
        sp_gather_heads(m, at->dqkv_sp, 3, h, d->HD, dqkv); // (N,S), overwritten
    } else {
        be->memzero(dqkv, N * ((size_t)d->NH + 2 * (size_t)d->NKV) * d->HD * F);
        be->attention_backward(dqkv, dout, qkv, out, at->lse[l], m->seg, m->B, m->T, d->NH, d->NKV, d->HD, window);
    }
}
