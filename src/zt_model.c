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

/* ---- LoRA's row keys (its GEMMs: zt_linear.c) ------------------------------------ */

void zt_model_set_row_keys(zt_model_t *m, const uint64_t *keys)
{
    if (!m->row_keys) return;
    m->be->from_host_async(m->row_keys, keys, (size_t)m->B * m->T * sizeof(uint64_t));
    m->keys_set = 1;
}

/* Whether the training head runs on the loss-bearing rows alone (head_chunks): under LoRA,
 * the SFT fine-tuning it is for, and without vocabulary parallelism, whose cross-entropy
 * has kernels of its own */
static int head_compacts(const zt_param_table_t *t) { return t->lora_rank > 0 && t->dims.tp_size <= 1; }

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
    return zt_model_create_layers(table, be, B, T, recompute, NULL);
}

zt_model_t *zt_model_create_layers(const zt_param_table_t *table, const zt_backend_t *be, int B, int T,
                                   int recompute, const unsigned char *layers)
{
    zt_model_t *m = zt_calloc(1, sizeof *m);
    if (layers) {
        m->layers = zt_malloc((size_t)table->dims.L + 2);
        memcpy(m->layers, layers, (size_t)table->dims.L + 2);
    }
    const int head = !layers || layers[table->dims.L + 1];
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
    /* block l's input: written by the embedding or block l - 1, read by block l */
    for (size_t l = 0; l < L; l++)
        if (!layers || layers[l] || layers[l + 1]) m->x_in[l] = zt_model_alloc(m, Nl * C * F);
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
    if (head) m->logits = zt_model_alloc(m, (size_t)m->head_rows * V * F);
    m->losses = zt_model_alloc(m, N * F);
    m->dres = zt_model_alloc(m, N * C * F);
    m->dres2 = zt_model_alloc(m, N * C * F);
    m->inputs = zt_model_alloc(m, N * sizeof(int32_t));
    m->targets = zt_model_alloc(m, N * sizeof(int32_t));
    m->seg_buf = zt_model_alloc(m, N * (size_t)ZT_MAX(m->d.sp_size, 1) * sizeof(int32_t)); /* whole sequences */
    m->pos_buf = zt_model_alloc(m, N * sizeof(int32_t));
    m->host_losses = be->alloc_host(N * F); /* pinned on a GPU: the download stays async */
    if (head_compacts(table)) {
        m->hrows = zt_model_alloc(m, N * sizeof(int32_t));
        m->htgt = zt_model_alloc(m, N * sizeof(int32_t));
        m->hloss = zt_model_alloc(m, N * F);
        m->host_hrows = be->alloc_host(N * sizeof(int32_t));
        m->host_htgt = be->alloc_host(N * sizeof(int32_t));
    }
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
    for (int l = 0; l < m->d.L; l++)
        if (m->x_in[l]) be->free(m->x_in[l]);
    float *bufs[] = {m->x_out, m->xf, m->logits, m->losses, m->dres, m->dres2, m->dlogits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) be->free(bufs[i]);
    be->free(m->inputs);
    be->free(m->targets);
    be->free(m->seg_buf);
    be->free(m->pos_buf);
    zt_model_kv_cache(m, 0);
    be->free_host(m->host_losses);
    if (m->hrows) {
        be->free(m->hrows);
        be->free(m->htgt);
        be->free(m->hloss);
        be->free_host(m->host_hrows);
        be->free_host(m->host_htgt);
    }
    if (m->share_map) be->free(m->share_map);
    if (m->lsum) {
        be->free(m->lsum);
        be->free(m->ones);
        be->free(m->wsum);
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
    free(m->layers);
    free(m);
}

size_t zt_model_activation_bytes(const zt_model_t *m) { return m->act_bytes; }

float *zt_model_residual(zt_model_t *m, int l)
{
    if (l < 0 || l > m->d.L || (l < m->d.L && !m->x_in[l]))
        zt_fatal("zt_model_residual: block %d of %d (not this stage's)", l, m->d.L);
    return l < m->d.L ? m->x_in[l] : m->x_out;
}

float *zt_model_residual_grad(zt_model_t *m) { return m->dres; }

size_t zt_model_residual_floats(const zt_model_t *m, int B, int T)
{
    return (size_t)B * T / (m->d.tp_seq ? (size_t)m->d.tp_size : 1) * (size_t)m->d.C;
}

/* The loss-bearing rows of a batch with targets, uploaded where they are fewer than N
 * and the head compacts (head_compacts) */
static void set_loss_rows(zt_model_t *m, const int32_t *targets, int N)
{
    m->hn = N;
    if (!targets || !m->hrows) return;
    int n = 0;
    for (int i = 0; i < N; i++) n += targets[i] >= 0 && targets[i] < m->d.V;
    if (n == N) return;
    m->be->wait_uploads(); /* the previous batch's copies may still read the host arrays */
    n = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0 && targets[i] < m->d.V) m->host_hrows[n] = i, m->host_htgt[n++] = targets[i];
    m->hn = n;
    m->be->from_host_async(m->hrows, m->host_hrows, (size_t)n * sizeof(int32_t));
    m->be->from_host_async(m->htgt, m->host_htgt, (size_t)n * sizeof(int32_t));
}

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
    set_loss_rows(m, targets, (int)N);
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
    m->share_B = 0;
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
        m->wsum = m->be->alloc((size_t)m->d.C * sizeof(float));
    }
    m->host_lsum = out;
}

int zt_model_can_share_rows(const zt_model_t *m)
{
    return m->share_qkv && m->share_out && !m->d.tp_seq && m->d.sp_size <= 1 && !m->kv;
}

void zt_model_set_shared_rows(zt_model_t *m, int Bf, int Tf, const int32_t *full, const int32_t *own)
{
    if (!zt_model_can_share_rows(m)) zt_fatal("zt_model_set_shared_rows: this model's attention cannot share rows");
    if (Bf < 1 || Tf < 1 || Bf > m->Bmax || Tf > m->Tmax)
        zt_fatal("shared rows: a full batch (%d, %d) outside the model's buffers (%d, %d)", Bf, Tf, m->Bmax, m->Tmax);
    const size_t N = (size_t)m->Bmax * m->Tmax;
    if (!m->share_map) m->share_map = m->be->alloc(2 * N * sizeof(int32_t));
    m->be->from_host_async(m->share_map, full, (size_t)Bf * Tf * sizeof(int32_t));
    m->be->from_host_async(m->share_map + N, own, (size_t)m->B * m->T * sizeof(int32_t));
    m->share_B = Bf;
    m->share_T = Tf;
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

void zt_model_set_collectives(zt_model_t *m, const zt_actcoll_t *ac) { m->ac = *ac; }

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
static void ce_rows(zt_model_t *m, float *chunk, const int32_t *targets, float *losses, int r0, int i, int n,
                    float scale)
{
    const int V = m->d.V;
    float *logits = chunk + (size_t)i * V;
    if (m->inputs_tp)
        m->be->vocab_ce_grad(logits, losses + r0 + i, m->ce_max + i, m->ce_sz + 2 * (size_t)i, targets + r0 + i,
                             m->d.vocab_start, n, V, scale);
    else
        m->be->crossentropy_fused(logits, losses + r0 + i, targets + r0 + i, n, V, scale);
}

/* What a pass of the head computes (head_chunks): HEAD_EVAL the losses (inference,
 * evaluation); HEAD_TRAIN also the dlogits and from them dxf and the head's gradient;
 * HEAD_PREF (preference training, a frozen head) the losses and dxf of dlogits at factor 1,
 * kept unscaled for zt_model_pref_head_backward, whose per-sequence factors are known only
 * once every chunk's losses are: the head's one pass; HEAD_PREF_REF (the reference model)
 * the losses alone, through the same kernels on the same rows as HEAD_PREF so that a
 * policy equal to its reference gets bit for bit its log-probabilities. */
typedef enum { HEAD_EVAL, HEAD_TRAIN, HEAD_PREF, HEAD_PREF_REF, HEAD_TRAIN_HOLD } head_mode_t;

/* The head over rows [0, N) in chunks: final norm, logits (head_rows,V), and with
 * targets the fused cross-entropy (losses, and with droot dlogits in place); with
 * droot each chunk's lm_head gradients follow at once: dxf rows into dres2 (N,C) and
 * the head weight's gradient, so the chunk buffer is free for the next. The dlogits
 * factor is dscale, or with token scales set each token's own: the kernels take one
 * factor per call, so a chunk runs as its runs of equal factors (one per sequence of a
 * preference pair), and a batch without token scales exactly as before.
 * Training without token scales runs on the loss-bearing rows alone (m->hn of them:
 * an SFT prompt's logits are never needed): their xf rows gathered into dres (free
 * until the final norm's backward), their dxf into xf (read no more), then scattered
 * into dres2 and their losses into theirs, the other rows' zero, as the cross-entropy
 * makes them. Each row's logits, loss and dxf are the same numbers either way; with a
 * trained head its weight gradient sums the same nonzero rows (the ignored rows added
 * zeros). HEAD_PREF keeps its compacted dxf in xf for zt_model_pref_head_backward, and
 * makes each row's logit sum (every row's, prompt and padding too) as xf . wsum, wsum the
 * head weight's column sums: a logit sum is linear in the row, so no row needs its logits
 * for it. HEAD_TRAIN_HOLD is HEAD_TRAIN up to the dlogits: each chunk's logits go to its
 * own rows of m->dlogits (n,V), not the chunk buffer, and stay there, dlogits, for the
 * GEMMs of zt_model_train_head_backward. */
static void head_chunks(zt_model_t *m, const float *root, head_mode_t mode, float *droot, float dscale)
{
    const zt_backend_t *be = m->be;
    const int N = m->B * m->T, C = m->d.C, V = m->d.V;
    const int train = mode != HEAD_EVAL, pref = mode == HEAD_PREF || mode == HEAD_PREF_REF;
    const int hold = mode == HEAD_TRAIN_HOLD;
    const size_t ho = m->arch->ops->head_offset(m);
    const float *ts = mode == HEAD_TRAIN || hold ? m->tok_scale : NULL;
    const int compact = train && !ts && m->has_targets && m->hn < N;
    const int n = compact ? m->hn : N;
    const float *x = compact ? m->dres : m->xf;       // (n,C) the head's input rows
    float *dx = compact ? m->xf : m->dres2;           // (n,C) their dxf
    const int32_t *tgt = compact ? m->htgt : m->targets;
    float *loss = compact ? m->hloss : m->losses;
    const int lsum_chunks = m->has_targets && m->host_lsum && mode == HEAD_EVAL;
    const int lsum_rows = m->has_targets && m->host_lsum && mode == HEAD_PREF;
    head_input(m, root);
    if (lsum_rows) {
        be->gemm(0, 0, 1, C, V, 1.0f, m->ones, V, root + ho, C, 0.0f, m->wsum, C); // (1,C) column sums of (V,C)
        be->gemm(0, 0, N, 1, C, 1.0f, m->xf, C, m->wsum, 1, 0.0f, m->lsum, 1);   // (N,1)
    }
    if (compact) be->embedding_forward(m->dres, m->hrows, m->xf, n, C); // gather
    m->pref_compact = compact;
    for (int r0 = 0; r0 < n; r0 += m->head_rows) {
        const int rows = ZT_MIN(m->head_rows, n - r0);
        const float *xf = x + (size_t)r0 * C;
        float *lg = hold ? m->dlogits + (size_t)r0 * V : m->logits; // (rows,V)
        be->matmul_forward(lg, xf, root + ho, NULL, rows, C, V, 1);
        m->head_first = compact || hold ? N : r0; /* compact: no batch row's logits are kept */
        if (!m->has_targets) continue;
        if (lsum_chunks) /* before the cross-entropy, which may write the chunk */
            be->gemm(0, 0, rows, 1, V, 1.0f, lg, V, m->ones, 1, 0.0f, m->lsum + r0, 1); // (rows,1)
        if (m->inputs_tp) {
            /* vocabulary-parallel: the row statistics over every rank's columns */
            be->vocab_ce_max(m->ce_max, lg, rows, V);
            m->ac.tp_allreduce(m->ac.ctx, m->ce_max, (size_t)rows, ZT_ACT_MAX);
            be->vocab_ce_sum(m->ce_sz, lg, m->ce_max, tgt + r0, m->d.vocab_start, rows, V);
            m->ac.tp_allreduce(m->ac.ctx, m->ce_sz, 2 * (size_t)rows, ZT_ACT_SUM);
        }
        if (!ts) {
            ce_rows(m, lg, tgt, loss, r0, 0, rows, pref ? 1.0f : train ? dscale : 0.0f);
        } else {
            for (int i = 0, j; i < rows; i = j) {
                for (j = i + 1; j < rows && ts[r0 + j] == ts[r0 + i]; j++) {}
                ce_rows(m, lg, tgt, loss, r0, i, j - i, ts[r0 + i]);
            }
        }
        if (mode == HEAD_TRAIN || mode == HEAD_PREF) /* droot NULL: a frozen head (LoRA) needs only dL/dxf */
            be->matmul_backward(dx + (size_t)r0 * C, droot ? droot + ho : NULL, NULL, m->logits, xf, root + ho, rows,
                                C, V, 1);
    }
    if (compact) { /* scatter: each row of dres2 and losses gets its own value or stays zero */
        if (mode == HEAD_TRAIN) {
            be->memzero(m->dres2, (size_t)N * C * sizeof(float));
            be->embedding_backward(m->dres2, dx, m->hrows, n, C);
        }
        be->memzero(m->losses, (size_t)N * sizeof(float));
        be->embedding_backward(m->losses, m->hloss, m->hrows, n, 1);
    }
    /* read after backward: the device goes on with it meanwhile */
    if (m->has_targets) be->to_host_async(m->host_losses, m->losses, (size_t)N * sizeof(float));
    if (lsum_chunks || lsum_rows) {
        if (m->inputs_tp) m->ac.tp_allreduce(m->ac.ctx, m->lsum, (size_t)N, ZT_ACT_SUM); /* every rank's columns */
        be->to_host_async(m->host_lsum, m->lsum, (size_t)N * sizeof(float));
    }
}

void zt_model_forward_head(zt_model_t *m, const float *root) { head_chunks(m, root, HEAD_EVAL, NULL, 0.0f); }


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

size_t zt_model_kv_bytes(const zt_model_t *m)
{
    return (size_t)m->kv_nseq * m->d.L * m->Tmax * kv_width(m) * sizeof(float);
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
    if (m->share_B) {
        /* the compact rows' qkv to the full batch's positions, its causal attention there
         * (each query sees what it sees in the full batch: the same numbers), and each
         * compact token's output back from its own position */
        const int S = (NH + 2 * NKV) * HD, Nf = m->share_B * m->share_T;
        be->embedding_forward(m->share_qkv, m->share_map, qkv, Nf, S); // (Nf,S)
        be->attention_forward(m->share_out, lse, m->share_qkv, NULL, m->share_B, m->share_T, NH, NKV, HD, window);
        be->embedding_forward(out, m->share_map + (size_t)m->Bmax * m->Tmax, m->share_out, m->B * m->T, NH * HD);
        return;
    }
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

/* After the head's chunks, dxf (N,C) in dres2 (every chunk wrote its rows): the tp ranks'
 * parts reduced and the final norm's backward, which gives dL/d x_out, the last block's
 * output */
static void head_backward_tail(zt_model_t *m, const float *root, float *droot)
{
    /* each tp rank's dxf is its vocabulary rows' part (tp_seq: of its rows, reduced) */
    float *dxf = m->d.tp_seq ? m->tp_rows : m->dres2;
    zt_model_tp_reduce(m, m->dres2, dxf);
    m->arch->ops->final_norm_backward(m, root, droot, m->x_out, dxf, m->dres);
}

void zt_model_train_head(zt_model_t *m, const float *root, float *droot, float dscale)
{
    if (!m->has_targets) zt_fatal("zt_model_train_head: the batch has no targets");
    head_chunks(m, root, HEAD_TRAIN, droot, dscale);
    head_backward_tail(m, root, droot);
}

void zt_model_hold_dlogits(zt_model_t *m)
{
    if (m->logits && !m->dlogits) m->dlogits = zt_model_alloc(m, (size_t)m->Bmax * m->Tmax * m->d.V * sizeof(float));
}

void zt_model_train_head_forward(zt_model_t *m, const float *root, float dscale)
{
    if (!m->has_targets) zt_fatal("zt_model_train_head_forward: the batch has no targets");
    if (!m->dlogits) zt_fatal("zt_model_train_head_forward: no dlogits held (zt_model_hold_dlogits)");
    head_chunks(m, root, HEAD_TRAIN_HOLD, NULL, dscale);
    m->dlogits_ready = 1;
}

/* The GEMMs HEAD_TRAIN runs after each chunk's cross-entropy, over the same chunks in the
 * same order (the head weight's gradient sums them as train_head does), from the held
 * dlogits; the compacted rows (head_chunks) gathered again from xf, which nothing writes
 * between the halves */
void zt_model_train_head_backward(zt_model_t *m, const float *root, float *droot)
{
    if (!m->dlogits_ready) zt_fatal("zt_model_train_head_backward: no zt_model_train_head_forward before it");
    m->dlogits_ready = 0;
    const zt_backend_t *be = m->be;
    const int N = m->B * m->T, C = m->d.C, V = m->d.V, compact = m->pref_compact, n = compact ? m->hn : N;
    const size_t ho = m->arch->ops->head_offset(m);
    const float *x = compact ? m->dres : m->xf; // (n,C)
    float *dx = compact ? m->xf : m->dres2;     // (n,C)
    if (compact) be->embedding_forward(m->dres, m->hrows, m->xf, n, C);
    for (int r0 = 0; r0 < n; r0 += m->head_rows) {
        const int rows = ZT_MIN(m->head_rows, n - r0);
        be->matmul_backward(dx + (size_t)r0 * C, droot ? droot + ho : NULL, NULL, m->dlogits + (size_t)r0 * V,
                            x + (size_t)r0 * C, root + ho, rows, C, V, 1);
    }
    if (compact) {
        be->memzero(m->dres2, (size_t)N * C * sizeof(float));
        be->embedding_backward(m->dres2, dx, m->hrows, n, C);
    }
    head_backward_tail(m, root, droot);
}

void zt_model_pref_head(zt_model_t *m, const float *root, int reference)
{
    if (!m->has_targets) zt_fatal("zt_model_pref_head: the batch has no targets");
    head_chunks(m, root, reference ? HEAD_PREF_REF : HEAD_PREF, NULL, 0.0f);
}

void zt_model_pref_head_backward(zt_model_t *m, const float *root, const float *scales)
{
    const int N = m->B * m->T, C = m->d.C, n = m->pref_compact ? m->hn : N;
    float *dx = m->pref_compact ? m->xf : m->dres2; // (n,C) dxf at factor 1
    /* row i of dx is batch row rows[i]; its runs of equal factors, one call each */
    const int32_t *rows = m->pref_compact ? m->host_hrows : NULL;
    for (int i = 0, j; i < n; i = j) {
        const float f = scales[rows ? rows[i] : i];
        for (j = i + 1; j < n && scales[rows ? rows[j] : j] == f; j++) {}
        m->be->scale(dx + (size_t)i * C, f, (size_t)(j - i) * C);
    }
    if (m->pref_compact) {
        m->be->memzero(m->dres2, (size_t)N * C * sizeof(float));
        m->be->embedding_backward(m->dres2, dx, m->hrows, n, C);
    }
    head_backward_tail(m, root, NULL);
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
