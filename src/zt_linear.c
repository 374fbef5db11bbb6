/* zt_linear.c — one linear layer of a block (zt_model_internal.h): the base GEMM, its LoRA
 * adapters and the tensor-parallel collectives around it.
 *
 * A family describes each of its GEMMs once, at create time (zt_linear_init: which
 * weights, bias, column or row parallel), and its block then reads as the maths:
 * y = linear(x). What a linear does besides the GEMM, in this order (the figures depend
 * on the order of the floating-point operations):
 *   column parallel  x gathered over tp (tp_sequence_parallel: the residual stream's
 *                    rows), y = x W^T + b, y += LoRA(x); backward: dx = dy W + LoRA's
 *                    part, then reduced over tp (a reduce-scatter under tp_seq)
 *   row parallel     y_partial = x W^T + b (one rank's bias) + LoRA(x) (a partial
 *                    delta: A holds this rank's input columns), reduced over tp;
 *                    backward: dy gathered, dx = dy W + LoRA's part, no collective
 * The weight is nn.Linear's (out, in) or GPT-2's Conv1D (in, out), as the table stores it. */
#include "zt_model_internal.h"

#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_qlora.h"

/* ---- LoRA on one GEMM --------------------------------------------------------------- */

/* Describes the GEMM over base weights params[0..nw) (their columns of y side by side,
 * in this order) of input width C; allocates its per-block buffers. */
static void lora_gemm_init(zt_model_t *m, zt_lora_gemm_t *g, const int *params, int nw, int C)
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

static void lora_gemm_free(zt_model_t *m, zt_lora_gemm_t *g)
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
void zt_lora_scratch(zt_model_t *m, int c_max)
{
    const size_t N = (size_t)m->Bmax * m->Tmax, F = sizeof(float);
    const size_t dq = zt_qlora_dequant_floats(m->table);
    if (dq) m->wdq = zt_model_alloc(m, dq * F);
    m->lora_dxa = zt_model_alloc(m, N * ZT_LORA_MAX * m->table->lora_rank * F);
    if (m->table->lora_dropout > 0) {
        m->lora_xd = zt_model_alloc(m, N * (size_t)c_max * F);
        m->lora_dx = zt_model_alloc(m, N * (size_t)c_max * F);
        m->row_keys = zt_model_alloc(m, N * sizeof(uint64_t));
    }
}

void zt_lora_scratch_free(zt_model_t *m)
{
    void *bufs[] = {m->lora_dxa, m->lora_xd, m->lora_dx, m->row_keys, m->wdq};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) m->be->free(bufs[i]);
    m->lora_dxa = m->lora_xd = m->lora_dx = m->wdq = NULL;
    m->row_keys = NULL;
}

/* dropout on: a training batch with its keys */
static int lora_drop(const zt_model_t *m) { return m->row_keys && m->keys_set; }

/* a mask per (block, GEMM, target), the same at every tp */
static uint64_t lora_salt(const zt_lora_gemm_t *g, int l, int i)
{
    return zt_splitmix64(((uint64_t)l << 40) ^ (g->mask_id << 4) ^ (uint64_t)i);
}

/* y (N,OC) += s x A_i^T B_i^T in each target i's columns, block l (no-op without adapters,
 * or with lora NULL: the base alone, as PEFT's disable_adapter, the DPO reference) */
static void lora_gemm_forward(zt_model_t *m, zt_lora_gemm_t *g, int l, const float *lora, const float *x, float *y)
{
    if (!g->n || !lora) return;
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

/* dx (N,C) += the adapters' part of dL/dx; their gradients += into dlora (may be NULL:
 * dx only; dx may be NULL: the gradients only) */
static void lora_gemm_backward(zt_model_t *m, zt_lora_gemm_t *g, int l, const float *lora, float *dlora,
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
        if (be->lowrank_backward) { /* both from one pass over dy_i */
            be->lowrank_backward(N, g->out_n[i], r, dyi, OC, lora + g->b_off[i], xa + i * r, nr, dxa + i * r, nr,
                                 dlora ? dlora + g->b_off[i] : NULL);
            continue;
        }
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

/* ---- the linear ----------------------------------------------------------------------- */

void zt_linear_init(zt_model_t *m, zt_linear_t *lin, zt_linear_placement_t placement, const int *params, int nw,
                    int bias)
{
    memset(lin, 0, sizeof *lin);
    const zt_param_table_t *t = m->table;
    const zt_param_t *p = &t->params[params[0]];
    lin->placement = placement;
    lin->transw = p->wlayout != ZT_W_IN_OUT;
    lin->in = (int)(lin->transw ? p->shape[1] : p->shape[0]);
    lin->w_off = p->offset;
    lin->b_off = bias >= 0 ? t->params[bias].offset : SIZE_MAX;
    if (nw > ZT_LINEAR_MAXW) zt_fatal("linear: %s's GEMM has more than %d weights", p->name, ZT_LINEAR_MAXW);
    lin->wt.type = !p->quant ? ZT_WT_F32 : t->quant_type == ZT_QUANT_FP4 ? ZT_WT_FP4 : ZT_WT_NF4;
    lin->wt.n = nw;
    size_t next = p->offset; /* where the next weight must start: its predecessors' numel on */
    for (int i = 0; i < nw; i++) {
        const zt_param_t *q = &t->params[params[i]];
        lin->wt.param[i] = params[i];
        if (q->quant != p->quant) zt_fatal("linear: %s and %s, one GEMM, are stored differently", p->name, q->name);
        if (q->offset != next) zt_fatal("linear: %s does not follow the weights before it in its unit", q->name);
        next += q->numel;
        lin->out += (int)(lin->transw ? q->shape[0] : q->shape[1]);
    }
    lora_gemm_init(m, &lin->lora, params, nw, lin->in);
}

void zt_linear_free(zt_model_t *m, zt_linear_t *lin) { lora_gemm_free(m, &lin->lora); }

/* The base weight (out, in) as the GEMM reads it: the unit's fp32 itself, or its 4-bit
 * tensors dequantized side by side into the shared scratch by the backend (bitsandbytes'
 * dequantize_4bit to float32, as Linear4bit computes in float32: then the same GEMM on those
 * values). The whole GEMM's weights at once, not a tile at a time: tools/bench_dequant
 * measured the two (doc/performance.md), and tiles bought nothing at a step's shapes. */
static const float *weight_of(zt_model_t *m, const zt_linear_t *lin, const float *w)
{
    if (lin->wt.type == ZT_WT_F32) return w + lin->w_off;
    const zt_param_table_t *t = m->table;
    float *dst = m->wdq;
    for (int i = 0; i < lin->wt.n; i++) {
        const zt_param_t *p = &t->params[lin->wt.param[i]];
        const int64_t n = (int64_t)zt_qlora_values(p);
        zt_quant4_split_t split; /* a tp rank's share of the tensor's blocks */
        zt_qlora_split(t, p, &split);
        /* under bf16 (bitsandbytes' compute dtype bfloat16) the unit is a bf16 working copy, a byte
         * of the 4-bit form an element, and the weight is dequantized to bf16 values */
        m->be->dequant4(dst, w + p->offset, n, t->quant_type, t->quant_nested, t->quant_blocksize, &split,
                        t->quant_bytewise ? ZT_DQ4_BYTEWISE | ZT_DQ4_BF16 : 0);
        dst += n;
    }
    return m->wdq;
}

static const float *bias_of(const zt_linear_t *lin, const float *w)
{
    return lin->b_off == SIZE_MAX ? NULL : w + lin->b_off;
}

/* where the base's gradients go: nowhere for a frozen base (dw NULL) */
static float *dweight_of(const zt_linear_t *lin, float *dw) { return dw ? dw + lin->w_off : NULL; }
static float *dbias_of(const zt_linear_t *lin, float *dw) { return dw && lin->b_off != SIZE_MAX ? dw + lin->b_off : NULL; }

/* The backend's fused GEMM + GELU ops take a whole Conv1D (in, out) weight and no
 * collective between the two: a column-parallel GEMM's output (forward) or a
 * row-parallel one's input (backward); and no adapter, whose part must join first */
static int fuses_gelu(const zt_linear_t *lin, zt_linear_placement_t placement)
{
    return !lin->lora.n && lin->placement == placement && !lin->transw && lin->wt.type == ZT_WT_F32;
}

void zt_linear_forward(zt_model_t *m, zt_linear_t *lin, int l, const float *w, const float *lora, const float *x,
                       float *y)
{
    const int N = m->B * m->T;
    if (lin->placement == ZT_LINEAR_COLUMN) {
        const float *xf = zt_model_tp_gather(m, x, zt_model_tp_scratch(m, 0)); // (N, in)
        m->be->matmul_forward(y, xf, weight_of(m, lin, w), bias_of(lin, w), N, lin->in, lin->out, lin->transw);
        lora_gemm_forward(m, &lin->lora, l, lora, xf, y);
        return;
    }
    float *yp = zt_model_tp_partial(m, y); // (N, out) partial sums under tp
    m->be->matmul_forward(yp, x, weight_of(m, lin, w), zt_model_tp_bias(m, bias_of(lin, w)), N, lin->in, lin->out,
                          lin->transw);
    lora_gemm_forward(m, &lin->lora, l, lora, x, yp);
    zt_model_tp_reduce(m, yp, y);
}

void zt_linear_forward_gelu(zt_model_t *m, zt_linear_t *lin, int l, const float *w, const float *lora,
                            const float *x, float *pre, float *y)
{
    const int N = m->B * m->T;
    if (!fuses_gelu(lin, ZT_LINEAR_COLUMN)) {
        /* an adapter's delta belongs to the pre-activation: GEMM, LoRA, then the GELU */
        zt_linear_forward(m, lin, l, w, lora, x, pre);
        m->be->gelu_forward(y, pre, (size_t)N * lin->out);
        return;
    }
    const float *xf = zt_model_tp_gather(m, x, zt_model_tp_scratch(m, 0));
    m->be->matmul_gelu_forward(y, pre, xf, w + lin->w_off, bias_of(lin, w), N, lin->in, lin->out);
}

/* dw NULL: a frozen base, no weight or bias gradient (a 4-bit base is always frozen: its
 * input gradient runs through the dequantized weight); dx NULL with it: nothing to do */
static void base_backward(zt_model_t *m, const zt_linear_t *lin, const float *w, float *dw, const float *x,
                          const float *dy, float *dx)
{
    if (lin->wt.type != ZT_WT_F32 && dw)
        zt_fatal("linear: %s is 4-bit and has no gradient", m->table->params[lin->wt.param[0]].name);
    if (!dx && !dw) return;
    m->be->matmul_backward(dx, dweight_of(lin, dw), dbias_of(lin, dw), dy, x, weight_of(m, lin, w), m->B * m->T,
                           lin->in, lin->out, lin->transw);
}

float *zt_linear_backward(zt_model_t *m, zt_linear_t *lin, int l, const float *w, float *dw, const float *lora,
                          float *dlora, const float *x, const float *dy, float *dx)
{
    if (lin->placement == ZT_LINEAR_COLUMN) {
        const float *xf = zt_model_tp_gather(m, x, zt_model_tp_scratch(m, 0)); // (N, in)
        base_backward(m, lin, w, dw, xf, dy, dx);
        lora_gemm_backward(m, &lin->lora, l, lora, dlora, xf, dy, dx);
        if (!dx) return NULL;
        /* each rank's columns' part of dL/dx: summed (tp_seq: this rank's rows of it) */
        float *dn = m->d.tp_seq ? m->tp_rows : dx;
        zt_model_tp_reduce(m, dx, dn);
        return dn;
    }
    const float *dyf = zt_model_tp_gather(m, dy, zt_model_tp_scratch(m, 0)); // (N, out)
    base_backward(m, lin, w, dw, x, dyf, dx);
    lora_gemm_backward(m, &lin->lora, l, lora, dlora, x, dyf, dx);
    return dx;
}

float *zt_linear_backward_gelu(zt_model_t *m, zt_linear_t *lin, int l, const float *w, float *dw,
                               const float *lora, float *dlora, const float *x, const float *pre, const float *dy,
                               float *dact, float *dpre)
{
    const int N = m->B * m->T;
    if (!fuses_gelu(lin, ZT_LINEAR_ROW)) {
        /* an adapter's part of dL/d x joins the base's before gelu' */
        zt_linear_backward(m, lin, l, w, dw, lora, dlora, x, dy, dact);
        m->be->gelu_backward(dpre, pre, dact, (size_t)N * lin->in);
        return dpre;
    }
    const float *dyf = zt_model_tp_gather(m, dy, zt_model_tp_scratch(m, 0));
    m->be->gelu_matmul_backward(dpre, dweight_of(lin, dw), dbias_of(lin, dw), dyf, x, pre, w + lin->w_off, N,
                                lin->in, lin->out);
    return dpre;
}
