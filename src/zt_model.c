/* zt_model.c — the family-neutral model (zt_model.h): batch, residual stream, chunked head.
 *
 * The model runs one unit at a time on buffers the caller provides, so the shard
 * engine can gather a unit just before it runs and free it right after. All
 * arithmetic goes through the compute backend (zt_backend_t); the family file
 * (zt_arch_*.c) runs its embedding, blocks and final norm, this file decides the
 * rest: which activations every family keeps, and the head.
 *
 * The head keeps no (N,V) logits: it runs in chunks of head_rows tokens (logits,
 * fused cross-entropy, then at once both lm_head gradient GEMMs), so one chunk's
 * (head_rows,V) buffer is all the vocabulary costs; GPT-2 at B=8, T=1024 would
 * otherwise hold 1.6 GB of fp32 logits. The head weight is (V,C) for every family
 * (a tied embedding or an untied lm_head, nn.Linear's layout), used transposed. */
#include "zt_model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

void *zt_model_alloc(zt_model_t *m, size_t bytes)
{
    m->act_bytes += bytes;
    return m->be->alloc(bytes);
}

/* Rows per head chunk: enough chunks that one holds at most HEAD_CHUNK_BYTES of fp32
 * logits, equal in size. Big enough for an efficient GEMM (on GPT-2's vocabulary about
 * 1300 rows: a (1300,768)x(768,50257) product is 100 GFLOP), small beside the rest. */
#define HEAD_CHUNK_BYTES ((size_t)256 << 20)
static int head_rows_for(size_t N, size_t V)
{
    const size_t chunks = ZT_MAX(ZT_CEIL_DIV(N * V * sizeof(float), HEAD_CHUNK_BYTES), (size_t)1);
    return (int)ZT_MAX(ZT_CEIL_DIV(N, chunks), (size_t)1);
}

int zt_model_head_rows(zt_model_dims_t d, int N) { return head_rows_for((size_t)N, (size_t)d.V); }

/* ---- LoRA ------------------------------------------------------------------------- */

void zt_lora_gemm_init(zt_model_t *m, zt_lora_gemm_t *g, const int *params, int nw, int C)
{
    memset(g, 0, sizeof *g);
    const zt_param_table_t *t = m->table;
    g->C = C;
    int col = 0, first_a = -1;
    for (int i = 0; i < nw; i++) {
        const zt_param_t *p = &t->params[params[i]];
        const int out = (int)(p->wlayout == ZT_W_IN_OUT ? p->shape[1] : p->shape[0]);
        if (p->lora_a >= 0) {
            if (g->n == ZT_LORA_MAX) zt_fatal("lora: more than %d targets in one GEMM", ZT_LORA_MAX);
            const zt_param_t *a = &t->params[p->lora_a];
            /* the A's of one GEMM are the rows of one matrix (zt_lora_apply's order) */
            if (first_a >= 0 && a->offset != g->a_off + (size_t)g->n * a->numel)
                zt_fatal("lora: the A matrices of %s's GEMM are not adjacent", p->name);
            if (first_a < 0) {
                first_a = p->lora_a, g->a_off = a->offset;
                g->c0 = a->tp_dim == 1 ? (int)a->tp_goff[0] : 0;
                for (int q = 0; q < first_a; q++) g->mask_id += t->params[q].unit == a->unit ? t->params[q].gnumel : 0;
            }
            g->b_off[g->n] = t->params[p->lora_b].offset;
            g->out_off[g->n] = col;
            g->out_n[g->n] = out;
            g->n++;
        }
        col += out;
    }
    g->OC = col;
    if (!g->n) return;
    const size_t N = (size_t)m->Bmax * m->Tmax, nr = (size_t)g->n * t->lora_rank;
    g->xa = zt_calloc((size_t)m->d.L, sizeof *g->xa);
    for (int l = 0; l < m->d.L; l++) g->xa[l] = zt_model_alloc(m, N * nr * sizeof(float));
}

void zt_lora_gemm_free(zt_model_t *m, zt_lora_gemm_t *g)
{
    if (!g->n) return;
    for (int l = 0; l < m->d.L; l++) m->be->free(g->xa[l]);
    free(g->xa);
    g->n = 0;
}

/* The adapters' products run on their targets' column blocks in place (be->gemm with
 * leading dimensions): no block-diagonal B of a fused GEMM, no (N, OC) delta and no
 * separate pass adding it, no (N, C) input-gradient part (accumulated by the GEMM)
 * unless dropout masks it first. Scratch: dxa (N, ZT_LORA_MAX r); with dropout one
 * target's masked input and its input-gradient part (N, C) each, and the row keys. */
size_t zt_lora_scratch_floats(size_t N, int r, int c_max, int dropout)
{
    return N * (size_t)ZT_LORA_MAX * r + (dropout ? 2 * N * (size_t)c_max + N * 2 /* the row keys */ : 0);
}

void zt_lora_scratch(zt_model_t *m, int c_max)
{
    const size_t N = (size_t)m->Bmax * m->Tmax, F = sizeof(float);
    m->lora_dxa = zt_model_alloc(m, N * ZT_LORA_MAX * m->table->lora_rank * F);
    if (m->table->lora_dropout > 0) {
        m->lora_xd = zt_model_alloc(m, N * (size_t)c_max * F);
        m->lora_dx = zt_model_alloc(m, N * (size_t)c_max * F);
        m->row_keys = zt_model_alloc(m, N * sizeof(uint64_t));
    }
}

void zt_lora_scratch_free(zt_model_t *m)
{
    void *bufs[] = {m->lora_dxa, m->lora_xd, m->lora_dx, m->row_keys};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) m->be->free(bufs[i]);
    m->lora_dxa = m->lora_xd = m->lora_dx = NULL;
    m->row_keys = NULL;
}

void zt_model_set_row_keys(zt_model_t *m, const uint64_t *keys)
{
    if (!m->row_keys) return;
    m->be->from_host_async(m->row_keys, keys, (size_t)m->B * m->T * sizeof(uint64_t));
    m->keys_set = 1;
}

/* dropout on: a training batch with its keys */
static int lora_drop(const zt_model_t *m) { return m->row_keys && m->keys_set; }

/* a mask per (block, GEMM, target), the same at every tp */
static uint64_t lora_salt(const zt_lora_gemm_t *g, int l, int i)
{
    return zt_splitmix64(((uint64_t)l << 40) ^ (g->mask_id << 4) ^ (uint64_t)i);
}

void zt_lora_gemm_forward(zt_model_t *m, zt_lora_gemm_t *g, int l, const float *lora, const float *x, float *y)
{
    if (!g->n || !lora) return; /* no adapter unit: the base alone (PEFT's disable_adapter, the DPO reference) */
    const zt_backend_t *be = m->be;
    const int N = m->B * m->T, r = m->table->lora_rank, nr = g->n * r, C = g->C;
    const float s = m->table->lora_scale;
    float *xa = g->xa[l]; // (N, n r): target i's s x A_i^T in columns [i r, (i + 1) r)
    if (lora_drop(m)) {
        /* PEFT: each target its own dropout of x, so one GEMM per target */
        for (int i = 0; i < g->n; i++) {
            be->dropout_mask(m->lora_xd, x, m->row_keys, lora_salt(g, l, i), N, C, g->c0, m->table->lora_dropout);
            be->gemm(0, 1, N, r, C, s, m->lora_xd, C, lora + g->a_off + (size_t)i * r * C, C, 0.0f, xa + i * r, nr);
        }
    } else {
        be->gemm(0, 1, N, nr, C, s, x, C, lora + g->a_off, C, 0.0f, xa, nr); // the A's are adjacent rows
    }
    for (int i = 0; i < g->n; i++) // y[:, target i's columns] += xa_i B_i^T
        be->gemm(0, 1, N, g->out_n[i], r, 1.0f, xa + i * r, nr, lora + g->b_off[i], r, 1.0f, y + g->out_off[i], g->OC);
}

void zt_lora_gemm_backward(zt_model_t *m, zt_lora_gemm_t *g, int l, const float *lora, float *dlora,
                           const float *x, const float *dy, float *dx)
{
    if (!g->n) return;
    const zt_backend_t *be = m->be;
    const int N = m->B * m->T, r = m->table->lora_rank, nr = g->n * r, C = g->C, OC = g->OC;
    const float s = m->table->lora_scale;
    const float *xa = g->xa[l];
    float *dxa = m->lora_dxa; // (N, n r)
    /* y_i += xa_i B_i^T: dxa_i = dy_i B_i, dB_i += dy_i^T xa_i (dy_i: target i's columns of dy) */
    for (int i = 0; i < g->n; i++) {
        const float *dyi = dy + g->out_off[i];
        be->gemm(0, 0, N, r, g->out_n[i], 1.0f, dyi, OC, lora + g->b_off[i], r, 0.0f, dxa + i * r, nr);
        if (dlora) be->gemm(1, 0, g->out_n[i], r, N, 1.0f, dyi, OC, xa + i * r, nr, 1.0f, dlora + g->b_off[i], r);
    }
    if (lora_drop(m)) {
        /* xa_i = s drop_i(x) A_i^T: dA_i += s dxa_i^T drop_i(x), dx += drop_i(s dxa_i A_i) */
        for (int i = 0; i < g->n; i++) {
            const size_t ai = g->a_off + (size_t)i * r * C;
            const uint64_t salt = lora_salt(g, l, i);
            if (dlora) {
                be->dropout_mask(m->lora_xd, x, m->row_keys, salt, N, C, g->c0, m->table->lora_dropout);
                be->gemm(1, 0, r, C, N, s, dxa + i * r, nr, m->lora_xd, C, 1.0f, dlora + ai, C);
            }
            if (!dx) continue;
            be->gemm(0, 0, N, C, r, s, dxa + i * r, nr, lora + ai, C, 0.0f, m->lora_dx, C);
            be->dropout_mask(m->lora_dx, m->lora_dx, m->row_keys, salt, N, C, g->c0, m->table->lora_dropout);
            be->accumulate(dx, m->lora_dx, (size_t)N * C);
        }
        return;
    }
    /* xa = s x A^T: dx += s dxa A, dA += s dxa^T x */
    if (dx) be->gemm(0, 0, N, C, nr, s, dxa, nr, lora + g->a_off, C, 1.0f, dx, C);
    if (dlora) be->gemm(1, 0, nr, C, N, s, dxa, nr, x, C, 1.0f, dlora + g->a_off, C);
}

size_t zt_model_activation_bytes_estimate(const zt_param_table_t *t, int B, int T, int recompute)
{
    const zt_model_dims_t *d = &t->dims;
    const size_t N = (size_t)B * T, C = d->C;
    const size_t Nl = d->tp_seq ? N / (size_t)d->tp_size : N; /* the residual stream's rows */
    size_t floats = (size_t)d->L * Nl * C /* x_in */ + Nl * C /* x_out */ + N * C /* xf */ +
                    (d->tp_seq ? 2 * N * C + Nl * C + Nl : 0) /* tp scratches, rows, positions */ +
                    (size_t)head_rows_for(N, d->V) * d->V /* logits */ + N /* losses */ +
                    2 * N * C /* dres, dres2 */;
    /* tensor parallelism: local ids, the cross-entropy's row statistics, a gathered row */
    if (d->tp_size > 1) floats += 3 * (size_t)head_rows_for(N, d->V) + (size_t)d->vocab_block * (d->tp_size + 1) + N;
    /* inputs, targets, positions, and the segments of whole sequences (sp T per row) */
    return floats * sizeof(float) + (3 + (size_t)ZT_MAX(d->sp_size, 1)) * N * sizeof(int32_t) +
           t->arch->activation_bytes(t, B, T, recompute);
}

/* Model FLOPs of the step the table trains (the convention of doc/performance.md): the family
 * counts 6 per GEMM weight element per token (2 forward, 2 for the input gradient, 2 for the
 * weight gradient) and attention; a frozen weight (LoRA's base, a frozen unit) has no weight
 * gradient, so 2 of its 6 go, and each LoRA matrix, trained, costs its 6. Recomputation
 * (gradient checkpointing) is not counted: it is extra work, not the model's. */
static int gemm_weight(const zt_param_table_t *t, const zt_param_t *p)
{
    if (p->ndim != 2 || p->adapter) return 0;
    if (p->role == ZT_ROLE_EMBED) return t->dims.tied; /* a GEMM only as the tied head */
    return p->role >= ZT_ROLE_QKV && p->role <= ZT_ROLE_HEAD;
}

double zt_model_flops_per_token(const zt_param_table_t *t, int T)
{
    double f = t->arch->flops_per_token(&t->dims, T);
    for (int i = 0; i < t->nparams; i++) {
        const zt_param_t *p = &t->params[i];
        if (p->adapter) f += 6.0 * (double)p->gnumel;
        else if (p->frozen && gemm_weight(t, p)) f -= 2.0 * (double)p->gnumel;
    }
    return f;
}

zt_model_t *zt_model_create(const zt_param_table_t *table, const zt_backend_t *be, int B, int T,
                            int recompute)
{
    zt_model_t *m = zt_calloc(1, sizeof *m);
    m->table = table;
    m->arch = table->arch;
    m->be = be;
    m->d = table->dims;
    m->Bmax = B;
    m->Tmax = T;
    m->recompute = recompute;
    const size_t N = (size_t)B * T, C = m->d.C, L = m->d.L, V = m->d.V, F = sizeof(float);
    /* the residual stream: 1/tp of the rows under tp_seq */
    const size_t Nl = m->d.tp_seq ? N / (size_t)m->d.tp_size : N;
    m->x_in = zt_calloc(L ? L : 1, sizeof *m->x_in);
    for (size_t l = 0; l < L; l++) m->x_in[l] = zt_model_alloc(m, Nl * C * F);
    m->x_out = zt_model_alloc(m, Nl * C * F);
    m->xf = zt_model_alloc(m, N * C * F); /* gathered for the head */
    if (m->d.tp_seq) {
        m->tp_full = zt_model_alloc(m, N * C * F);
        m->tp_full2 = zt_model_alloc(m, N * C * F);
        m->tp_rows = zt_model_alloc(m, Nl * C * F);
        m->tp_pos = zt_model_alloc(m, Nl * sizeof(int32_t));
        m->host_tp_pos = be->alloc_host(Nl * sizeof(int32_t));
    }
    m->head_rows = head_rows_for(N, V);
    m->logits = zt_model_alloc(m, (size_t)m->head_rows * V * F);
    m->losses = zt_model_alloc(m, N * F);
    m->dres = zt_model_alloc(m, N * C * F);
    m->dres2 = zt_model_alloc(m, N * C * F);
    m->inputs = zt_model_alloc(m, N * sizeof(int32_t));
    m->targets = zt_model_alloc(m, N * sizeof(int32_t));
    m->seg_buf = zt_model_alloc(m, N * (size_t)ZT_MAX(m->d.sp_size, 1) * sizeof(int32_t)); /* whole sequences */
    m->pos_buf = zt_model_alloc(m, N * sizeof(int32_t));
    m->host_losses = be->alloc_host(N * F); /* pinned on a GPU: the download stays async */
    if (m->d.tp_size > 1) {
        m->inputs_tp = zt_model_alloc(m, N * sizeof(int32_t));
        m->host_inputs_tp = be->alloc_host(N * sizeof(int32_t));
        m->ce_max = zt_model_alloc(m, (size_t)m->head_rows * F);
        m->ce_sz = zt_model_alloc(m, (size_t)m->head_rows * 2 * F);
        m->logits_row_tp = zt_model_alloc(m, (size_t)m->d.vocab_block * (m->d.tp_size + 1) * F);
    }
    if (m->d.sp_size > 1) {
        m->sp_positions = zt_model_alloc(m, N * sizeof(int32_t));
        m->host_sp_positions = be->alloc_host(N * sizeof(int32_t));
    }
    m->arch->ops->create(m);
    return m;
}

void zt_model_free(zt_model_t *m)
{
    if (!m) return;
    const zt_backend_t *be = m->be;
    m->arch->ops->destroy(m);
    for (int l = 0; l < m->d.L; l++) be->free(m->x_in[l]);
    float *bufs[] = {m->x_out, m->xf, m->logits, m->losses, m->dres, m->dres2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    be->free(m->inputs);
    be->free(m->targets);
    be->free(m->seg_buf);
    be->free(m->pos_buf);
    zt_model_kv_cache(m, 0);
    be->free_host(m->host_losses);
    if (m->lsum) {
        be->free(m->lsum);
        be->free(m->ones);
    }
    zt_lora_scratch_free(m);
    if (m->sp_positions) {
        be->free(m->sp_positions);
        be->free_host(m->host_sp_positions);
    }
    if (m->tp_full) {
        be->free(m->tp_full), be->free(m->tp_full2), be->free(m->tp_rows), be->free(m->tp_pos);
        be->free_host(m->host_tp_pos);
    }
    if (m->sp_send) {
        be->free(m->sp_send);
        be->free(m->sp_recv);
    }
    if (m->ring_out) {
        float *r[] = {m->ring_kv[0], m->ring_kv[1], m->ring_dkv_in, m->ring_dkv[0], m->ring_dkv[1], m->ring_out,
                      m->ring_lse};
        for (size_t i = 0; i < sizeof r / sizeof *r; i++) be->free(r[i]);
        be->free(m->ring_seg);
        be->free_host(m->host_ring_seg);
    }
    if (m->inputs_tp) {
        be->free(m->inputs_tp);
        be->free_host(m->host_inputs_tp);
        be->free(m->ce_max);
        be->free(m->ce_sz);
        be->free(m->logits_row_tp);
    }
    free(m->x_in);
    free(m);
}

size_t zt_model_activation_bytes(const zt_model_t *m) { return m->act_bytes; }

void zt_model_set_batch(zt_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T)
{
    const int sp = m->d.sp_size > 1 ? m->d.sp_size : 1;
    if (B > m->Bmax || T > m->Tmax || T * sp > m->d.maxT)
        zt_fatal("batch (%d, %d) exceeds the model's buffers (%d, %d)", B, T, m->Bmax, m->Tmax);
    m->B = B;
    m->T = T;
    const size_t N = (size_t)B * T;
    m->be->from_host_async(m->inputs, inputs, N * sizeof(int32_t));
    m->has_targets = targets != NULL;
    if (targets) m->be->from_host_async(m->targets, targets, N * sizeof(int32_t));
    if (m->inputs_tp) {
        /* this rank's vocabulary rows [v0, v0 + V) as local ids; -1 elsewhere */
        const int v0 = m->d.vocab_start;
        m->be->wait_uploads(); /* the previous batch's copy may still read the buffer */
        for (size_t i = 0; i < N; i++) {
            const int id = inputs[i] - v0;
            m->host_inputs_tp[i] = id >= 0 && id < m->d.V ? id : -1;
        }
        m->be->from_host_async(m->inputs_tp, m->host_inputs_tp, N * sizeof(int32_t));
    }
    if (m->sp_positions) {
        /* this rank's chunk of every sequence */
        m->be->wait_uploads();
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) m->host_sp_positions[(size_t)b * T + t] = m->d.sp_rank * T + t;
        if (m->d.sp_ring) {
            /* chunk-major: (B, c) of chunk sp_rank, then (B, c) of chunk 2 sp - 1 - sp_rank */
            const int c = T / 2, i = m->d.sp_rank, sp = m->d.sp_size;
            for (int h = 0; h < 2; h++)
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < c; t++)
                        m->host_sp_positions[((size_t)h * B + b) * c + t] = zt_model_ring_chunk(sp, i, h) * c + t;
        }
        m->be->from_host_async(m->sp_positions, m->host_sp_positions, N * sizeof(int32_t));
    }
    if (m->tp_pos) {
        /* the residual stream's rows of this rank: rows [r N/tp, (r + 1) N/tp) of (B,T),
         * at their positions (the sp chunk's; a packed batch sets its own in
         * zt_model_set_segments) */
        const size_t Nl = N / (size_t)m->d.tp_size, r0 = (size_t)m->d.tp_rank * Nl;
        m->be->wait_uploads();
        for (size_t i = 0; i < Nl; i++)
            m->host_tp_pos[i] = m->sp_positions ? m->host_sp_positions[r0 + i] : (int32_t)((r0 + i) % (size_t)T);
        m->be->from_host_async(m->tp_pos, m->host_tp_pos, Nl * sizeof(int32_t));
    }
    m->seg = m->pos = NULL;
    m->tok_scale = NULL;
    m->host_lsum = NULL;
    m->keys_set = 0;
}

void zt_model_set_token_scales(zt_model_t *m, const float *scales) { m->tok_scale = scales; }

void zt_model_set_logit_sums(zt_model_t *m, float *out)
{
    if (out && !m->lsum) {
        const int V = m->d.V;
        float *h = zt_malloc((size_t)V * sizeof *h);
        for (int v = 0; v < V; v++) h[v] = 1.0f;
        m->ones = m->be->alloc((size_t)V * sizeof(float));
        m->be->from_host(m->ones, h, (size_t)V * sizeof(float));
        free(h);
        m->lsum = m->be->alloc((size_t)m->Bmax * m->Tmax * sizeof(float));
    }
    m->host_lsum = out;
}

void zt_model_set_segments(zt_model_t *m, const int32_t *segments, const int32_t *positions)
{
    const size_t N = (size_t)m->B * m->T, sp = (size_t)ZT_MAX(m->d.sp_size, 1);
    if (positions)
        for (size_t i = 0; i < N; i++) /* a kernel cannot report a row of wpe out of range */
            if (positions[i] < 0 || positions[i] >= m->d.maxT)
                zt_fatal("position %d of token %zu outside [0, %d)", positions[i], i, m->d.maxT);
    if (segments) m->be->from_host_async(m->seg_buf, segments, N * sp * sizeof(int32_t));
    if (positions) m->be->from_host_async(m->pos_buf, positions, N * sizeof(int32_t));
    m->seg = segments ? m->seg_buf : NULL;
    m->pos = positions ? m->pos_buf : NULL;
    if (segments && m->d.sp_ring && m->ring_seg) {
        /* ring blocks: each chunk's rows of the whole sequences' ids, chunk-major */
        const size_t Tf = (size_t)m->T * sp, c = (size_t)m->T / 2, B = (size_t)m->B;
        m->be->wait_uploads();
        for (size_t ch = 0; ch < 2 * sp; ch++)
            for (size_t b = 0; b < B; b++)
                memcpy(m->host_ring_seg + (ch * B + b) * c, segments + b * Tf + ch * c, c * sizeof(int32_t));
        m->be->from_host_async(m->ring_seg, m->host_ring_seg, N * sp * sizeof(int32_t));
    }
    if (m->tp_pos && positions) {
        const size_t Nl = N / (size_t)m->d.tp_size;
        m->be->from_host_async(m->tp_pos, positions + (size_t)m->d.tp_rank * Nl, Nl * sizeof(int32_t));
    }
}

/* a packed batch's own positions come first: they are absolute in their sequence */
const int32_t *zt_model_positions(const zt_model_t *m) { return m->pos ? m->pos : m->sp_positions; }

void zt_model_sp_scratch(zt_model_t *m, size_t floats)
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

void zt_model_sp_scatter_heads(zt_model_t *m, const float *x, int nblk, const int *heads, int hd, float *y)
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

void zt_model_sp_gather_heads(zt_model_t *m, const float *y, int nblk, const int *heads, int hd, float *x)
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

void zt_model_set_collectives(zt_model_t *m, const zt_actcoll_t *ac) { m->ac = *ac; }

/* ---- ring attention ---------------------------------------------------------------
 * Rank i holds chunks i and 2sp-1-i of each sequence (a, b below). Against the K|V of
 * rank j's chunks (j, 2sp-1-j): a sees j's first chunk when j < i, b sees j's first
 * always and its second when j > i; j = i gives the two causal diagonals and (b, a).
 * So every step but the first is two full c x c blocks on every rank: the causal load
 * balances. A K|V block is (2, B, c, 2 NKV HD): k | v of each row side by side. */
void zt_model_ring_scratch(zt_model_t *m, int NH, int NKV, int HD)
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

void zt_model_ring_forward(zt_model_t *m, const float *qkv, int NH, int NKV, int HD, int window, float *out,
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

void zt_model_ring_backward(zt_model_t *m, float *dqkv, const float *dout, const float *qkv, const float *out,
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

/* x := its sum over the tp ranks (no-op at tp 1) */
static void zt_model_tp_sum(zt_model_t *m, float *x, size_t n)
{
    if (m->d.tp_size <= 1) return;
    if (!m->ac.tp_allreduce) zt_fatal("tensor parallelism without activation collectives (zt_model_set_collectives)");
    m->ac.tp_allreduce(m->ac.ctx, x, n, ZT_ACT_SUM);
}

int zt_model_rows(const zt_model_t *m)
{
    return m->d.tp_seq ? m->B * m->T / m->d.tp_size : m->B * m->T;
}

const float *zt_model_tp_gather(zt_model_t *m, const float *x, float *scratch)
{
    if (!m->d.tp_seq) return x;
    m->ac.tp_allgather(m->ac.ctx, x, scratch, (size_t)zt_model_rows(m) * m->d.C);
    return scratch;
}

float *zt_model_tp_partial(zt_model_t *m, float *out) { return m->d.tp_seq ? m->tp_full2 : out; }

void zt_model_tp_reduce(zt_model_t *m, float *y, float *out)
{
    const size_t n = (size_t)zt_model_rows(m) * m->d.C;
    if (m->d.tp_seq) {
        m->ac.tp_reduce_scatter(m->ac.ctx, y, out, n);
        return;
    }
    zt_model_tp_sum(m, y, n);
    if (out != y) m->be->copy(out, y, n * sizeof(float));
}

float *zt_model_tp_scratch(zt_model_t *m, int k) { return k ? m->tp_full2 : m->tp_full; }

const int32_t *zt_model_row_positions(const zt_model_t *m) { return m->d.tp_seq ? m->tp_pos : zt_model_positions(m); }

const float *zt_model_tp_bias(const zt_model_t *m, const float *bias)
{
    return m->d.tp_size > 1 && m->d.tp_rank != 0 ? NULL : bias;
}

void zt_model_embed_tokens(zt_model_t *m, const float *wte, float *x0)
{
    const int N = m->B * m->T;
    float *y = zt_model_tp_partial(m, x0); // (N,C) this rank's vocabulary rows' part
    m->be->embedding_forward(y, m->inputs_tp ? m->inputs_tp : m->inputs, wte, N, m->d.C);
    zt_model_tp_reduce(m, y, x0);
}

void zt_model_embed_tokens_backward(zt_model_t *m, float *dwte, const float *dx0)
{
    /* every token may be one of this rank's vocabulary rows: the whole (N,C) gradient */
    const float *d = zt_model_tp_gather(m, dx0, m->tp_full);
    m->be->embedding_backward(dwte, d, m->inputs_tp ? m->inputs_tp : m->inputs, m->B * m->T, m->d.C);
}

void zt_model_forward_embed(zt_model_t *m, const float *root)
{
    m->arch->ops->embed_forward(m, root, m->d.L > 0 ? m->x_in[0] : m->x_out);
}

void zt_model_forward_block(zt_model_t *m, int l, const float *unit, const float *lora)
{
    float *out = l + 1 < m->d.L ? m->x_in[l + 1] : m->x_out;
    m->arch->ops->block_forward(m, l, unit, lora, m->x_in[l], out);
}

void zt_model_set_head_rows(zt_model_t *m, int rows)
{
    if (rows < 1 || rows > m->head_rows)
        zt_fatal("head chunk of %d rows outside 1..%d (the rows its buffer holds)", rows, m->head_rows);
    m->head_rows = rows;
}

/* xf (N,C): the final norm's output over every row (tp_seq: on this rank's rows, gathered) */
static void head_input(zt_model_t *m, const float *root)
{
    m->arch->ops->final_norm_forward(m, root, m->x_out, m->d.tp_seq ? m->tp_rows : m->xf);
    if (m->d.tp_seq) m->ac.tp_allgather(m->ac.ctx, m->tp_rows, m->xf, (size_t)zt_model_rows(m) * m->d.C);
}

/* The cross-entropy of rows [i, i + n) of the chunk that starts at batch row r0: their
 * losses and, for scale != 0, their dlogits (scale times dCE/dlogits) in place; under
 * vocabulary parallelism after the chunk's row statistics. */
static void ce_rows(zt_model_t *m, int r0, int i, int n, float scale)
{
    const int V = m->d.V;
    float *logits = m->logits + (size_t)i * V;
    if (m->inputs_tp)
        m->be->vocab_ce_grad(logits, m->losses + r0 + i, m->ce_max + i, m->ce_sz + 2 * (size_t)i,
                             m->targets + r0 + i, m->d.vocab_start, n, V, scale);
    else
        m->be->crossentropy_fused(logits, m->losses + r0 + i, m->targets + r0 + i, n, V, scale);
}

/* The head over rows [0, N) in chunks: final norm, logits (head_rows,V), and with
 * targets the fused cross-entropy (losses, and with droot dlogits in place); with
 * droot each chunk's lm_head gradients follow at once: dxf rows into dres2 (N,C) and
 * the head weight's gradient, so the chunk buffer is free for the next. The dlogits
 * factor is dscale, or with token scales set each token's own: the kernels take one
 * factor per call, so a chunk runs as its runs of equal factors (one per sequence of a
 * preference pair), and a batch without token scales exactly as before. */
static void head_chunks(zt_model_t *m, const float *root, int train, float *droot, float dscale)
{
    const zt_backend_t *be = m->be;
    const int N = m->B * m->T, C = m->d.C, V = m->d.V;
    const size_t ho = m->arch->ops->head_offset(m);
    const float *ts = train ? m->tok_scale : NULL;
    head_input(m, root);
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        const int rows = ZT_MIN(m->head_rows, N - r0);
        const float *xf = m->xf + (size_t)r0 * C;
        be->matmul_forward(m->logits, xf, root + ho, NULL, rows, C, V, 1); // (rows,V)
        m->head_first = r0;
        if (!m->has_targets) continue;
        if (m->host_lsum && !train) /* before the cross-entropy, which may write the chunk */
            be->gemm(0, 0, rows, 1, V, 1.0f, m->logits, V, m->ones, 1, 0.0f, m->lsum + r0, 1); // (rows,1)
        if (m->inputs_tp) {
            /* vocabulary-parallel: the row statistics over every rank's columns */
            be->vocab_ce_max(m->ce_max, m->logits, rows, V);
            m->ac.tp_allreduce(m->ac.ctx, m->ce_max, (size_t)rows, ZT_ACT_MAX);
            be->vocab_ce_sum(m->ce_sz, m->logits, m->ce_max, m->targets + r0, m->d.vocab_start, rows, V);
            m->ac.tp_allreduce(m->ac.ctx, m->ce_sz, 2 * (size_t)rows, ZT_ACT_SUM);
        }
        if (!ts) {
            ce_rows(m, r0, 0, rows, train ? dscale : 0.0f);
        } else {
            for (int i = 0, j; i < rows; i = j) {
                for (j = i + 1; j < rows && ts[r0 + j] == ts[r0 + i]; j++) {}
                ce_rows(m, r0, i, j - i, ts[r0 + i]);
            }
        }
        if (train) /* droot NULL: a frozen head (LoRA) needs only dL/dxf */
            be->matmul_backward(m->dres2 + (size_t)r0 * C, droot ? droot + ho : NULL, NULL, m->logits, xf,
                                root + ho, rows, C, V, 1);
    }
    /* read after backward: the device goes on with it meanwhile */
    if (m->has_targets) be->to_host_async(m->host_losses, m->losses, (size_t)N * sizeof(float));
    if (m->has_targets && m->host_lsum && !train) {
        if (m->inputs_tp) m->ac.tp_allreduce(m->ac.ctx, m->lsum, (size_t)N, ZT_ACT_SUM); /* every rank's columns */
        be->to_host_async(m->host_lsum, m->lsum, (size_t)N * sizeof(float));
    }
}

void zt_model_forward_head(zt_model_t *m, const float *root) { head_chunks(m, root, 0, NULL, 0.0f); }

void zt_model_forward_head_rows(zt_model_t *m, const float *root, int b, int t, int n)
{
    const int row = b * m->T + t, C = m->d.C;
    if (b < 0 || b >= m->B || t < 0 || t >= m->T || n < 1 || n > m->head_rows || row + n > m->B * m->T)
        zt_fatal("zt_model_forward_head_rows: no rows [%d, %d) from (%d, %d) (%d kept at most)", row, row + n, b, t,
                 m->head_rows);
    head_input(m, root);
    m->be->matmul_forward(m->logits, m->xf + (size_t)row * C, root + m->arch->ops->head_offset(m), NULL, n, C, m->d.V,
                          1); // (n,V)
    m->head_first = row;
}

int zt_model_head_rows_kept(const zt_model_t *m) { return m->head_rows; }

/* ---- generation's KV cache ------------------------------------------------------------ */

static size_t kv_width(const zt_model_t *m) { return 2 * (size_t)m->d.NKV * m->d.HD; }

void zt_model_kv_cache(zt_model_t *m, int nseq)
{
    if (nseq && (m->d.sp_size > 1 || m->d.tp_seq)) zt_fatal("zt_model_kv_cache: not under sp or tp_sequence_parallel");
    if (m->kv && nseq != m->kv_nseq) {
        for (int l = 0; l < m->d.L; l++) m->be->free(m->kv[l]);
        free(m->kv);
        free(m->kv_slot);
        free(m->kv_pastv);
        m->kv = NULL;
        m->kv_slot = m->kv_pastv = NULL;
        m->kv_nseq = 0;
    }
    if (nseq && !m->kv) {
        m->kv = zt_calloc((size_t)m->d.L, sizeof *m->kv);
        for (int l = 0; l < m->d.L; l++)
            m->kv[l] = m->be->alloc((size_t)nseq * m->Tmax * kv_width(m) * sizeof(float));
        m->kv_slot = zt_calloc((size_t)nseq, sizeof *m->kv_slot);
        m->kv_pastv = zt_calloc((size_t)nseq, sizeof *m->kv_pastv);
        m->kv_nseq = nseq;
    }
    m->kv_nrows = 1;
    if (m->kv) m->kv_slot[0] = m->kv_pastv[0] = 0;
}

void zt_model_kv_seq(zt_model_t *m, int slot, int past)
{
    if (!m->kv) zt_fatal("zt_model_kv_seq: no KV cache");
    if (slot < 0 || slot >= m->kv_nseq || past < 0 || past >= m->Tmax)
        zt_fatal("zt_model_kv_seq: sequence %d after %d positions (the cache holds %d of %d)", slot, past, m->kv_nseq,
                 m->Tmax);
    m->kv_nrows = 1;
    m->kv_slot[0] = slot;
    m->kv_pastv[0] = past;
}

void zt_model_kv_rows(zt_model_t *m, int n, const int *slot, const int *past)
{
    if (!m->kv) zt_fatal("zt_model_kv_rows: no KV cache");
    if (n < 1 || n > m->kv_nseq) zt_fatal("zt_model_kv_rows: %d sequences (the cache holds %d)", n, m->kv_nseq);
    for (int i = 0; i < n; i++) {
        if (slot[i] < 0 || slot[i] >= m->kv_nseq || past[i] < 0 || past[i] >= m->Tmax)
            zt_fatal("zt_model_kv_rows: sequence %d after %d positions (the cache holds %d of %d)", slot[i], past[i],
                     m->kv_nseq, m->Tmax);
        for (int j = 0; j < i; j++)
            if (slot[j] == slot[i]) zt_fatal("zt_model_kv_rows: sequence %d twice", slot[i]);
        m->kv_slot[i] = slot[i];
        m->kv_pastv[i] = past[i];
    }
    m->kv_nrows = n;
}

/* the first cached position a token at position `past` sees (window 0: all) */
static int window_start(int past, int window) { return window && past + 1 > window ? past + 1 - window : 0; }

void zt_model_self_attention(zt_model_t *m, int l, const float *qkv, float *out, float *lse, int NH, int NKV, int HD,
                             int window)
{
    const zt_backend_t *be = m->be;
    if (!m->kv) {
        be->attention_forward(out, lse, qkv, m->seg, m->B, m->T, NH, NKV, HD, window);
        return;
    }
    const int S = (NH + 2 * NKV) * HD, W = (int)kv_width(m), T = m->T;
    const size_t seq = (size_t)m->Tmax * W; /* one sequence's cache */
    if (m->kv_nrows > 1) {
        if (m->B != 1 || T != m->kv_nrows)
            zt_fatal("KV cache: a batch (%d, %d) for %d sequences' next tokens", m->B, T, m->kv_nrows);
        for (int i = 0; i < T; i++) {
            float *cache = m->kv[l] + (size_t)m->kv_slot[i] * seq;
            const int past = m->kv_pastv[i];
            const float *row = qkv + (size_t)i * S;
            be->copy_rows(cache + (size_t)past * W, W, row + (size_t)NH * HD, S, 1, W); // k | v of token i
            const int k0 = window_start(past, window);
            be->attention_block_forward(out + (size_t)i * NH * HD, lse + (size_t)i * NH, row, S, cache + (size_t)k0 * W,
                                        cache + (size_t)k0 * W + W / 2, W, NULL, NULL, 1, 1, past + 1 - k0, NH, NKV,
                                        HD, 0, 0, 0);
        }
        return;
    }
    const int past = m->kv_pastv[0];
    if (m->B != 1 || past + T > m->Tmax || (past > 0 && T != 1))
        zt_fatal("KV cache: a batch (%d, %d) after %d positions (one sequence; then one token at a time, up to %d)",
                 m->B, T, past, m->Tmax);
    float *cache = m->kv[l] + (size_t)m->kv_slot[0] * seq;
    be->copy_rows(cache + (size_t)past * W, W, qkv + (size_t)NH * HD, S, T, W); // k | v of this call
    if (past == 0) be->attention_forward(out, lse, qkv, NULL, 1, T, NH, NKV, HD, window);
    else { /* the new token sees every cached position in its window, itself the last */
        const int k0 = window_start(past, window);
        be->attention_block_forward(out, lse, qkv, S, cache + (size_t)k0 * W, cache + (size_t)k0 * W + W / 2, W, NULL,
                                    NULL, 1, 1, past + 1 - k0, NH, NKV, HD, 0, 0, 0);
    }
}

void zt_model_train_head(zt_model_t *m, const float *root, float *droot, float dscale)
{
    if (!m->has_targets) zt_fatal("zt_model_train_head: the batch has no targets");
    head_chunks(m, root, 1, droot, dscale);
    /* each tp rank's dxf is its vocabulary rows' part (tp_seq: of its rows, reduced) */
    float *dxf = m->d.tp_seq ? m->tp_rows : m->dres2;
    zt_model_tp_reduce(m, m->dres2, dxf);
    /* dxf (N,C) is in dres2 (every chunk wrote its rows); the final norm's backward
     * gives dL/d x_out, the last block's output */
    m->arch->ops->final_norm_backward(m, root, droot, m->x_out, dxf, m->dres);
}

float zt_model_loss(zt_model_t *m)
{
    if (!m->has_targets) return 0.0f;
    m->be->wait_uploads();
    m->be->wait_downloads();
    const int N = m->B * m->T;
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->host_losses[i];
    return (float)(sum / N);
}

const float *zt_model_token_losses(zt_model_t *m)
{
    if (!m->has_targets) zt_fatal("zt_model_token_losses: the batch has no targets");
    m->be->wait_uploads();
    m->be->wait_downloads();
    return m->host_losses;
}

double zt_model_loss_sum(zt_model_t *m)
{
    if (!m->has_targets) return 0.0;
    m->be->wait_uploads();
    m->be->wait_downloads();
    const int N = m->B * m->T;
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += m->host_losses[i];
    return sum;
}

void zt_model_logits_row(zt_model_t *m, int b, int t, float *out)
{
    const size_t V = m->d.V;
    const int row = b * m->T + t;
    if (row < m->head_first || row >= m->head_first + m->head_rows || row >= m->B * m->T)
        zt_fatal("logits of row %d are not kept (the head keeps rows %d..%d of its last chunk)", row,
                 m->head_first, ZT_MIN(m->head_first + m->head_rows, m->B * m->T) - 1);
    m->be->wait_uploads(); /* the batch's host arrays are the caller's again after this */
    const float *x = m->logits + (size_t)(row - m->head_first) * V;
    if (m->inputs_tp) {
        /* every tp rank's block of columns (the last one's padded), in vocabulary order:
         * the first vocab_total of them are the full row */
        const size_t vb = (size_t)m->d.vocab_block;
        float *pad = m->logits_row_tp + vb * m->d.tp_size;
        m->be->memzero(pad, vb * sizeof(float));
        m->be->copy(pad, x, V * sizeof(float));
        m->ac.tp_allgather(m->ac.ctx, pad, m->logits_row_tp, vb);
        m->be->to_host(out, m->logits_row_tp, (size_t)m->d.vocab_total * sizeof(float));
        return;
    }
    m->be->to_host(out, x, V * sizeof(float));
}

int zt_model_needs_dx_in(const zt_model_t *m, int l, const float *dw)
{
    /* block 0 under a frozen root (LoRA): dL/dx_in would only feed the embedding's gradient */
    return l > 0 || dw || !m->table->unit_frozen[m->table->root_unit];
}

void zt_model_backward_block(zt_model_t *m, int l, const float *w, float *dw, const float *lora, float *dlora)
{
    m->arch->ops->block_backward(m, l, w, dw, lora, dlora, m->x_in[l], m->dres);
}

void zt_model_backward_embed(zt_model_t *m, float *droot)
{
    if (droot) m->arch->ops->embed_backward(m, droot, m->dres); /* NULL: a frozen root (LoRA) */
}
