/* zt_model.c — GPT-2 parameter table, deterministic init, unit-wise forward/backward.
 *
 * The model runs one unit at a time on buffers the caller provides, so the shard
 * engine can gather a unit just before it runs and free it right after. All
 * arithmetic goes through the compute backend (zt_backend_t); this file only
 * decides shapes, the order of operations and which activations are kept.
 *
 * Activations kept per block for backward (N = B*T):
 *   x_in (N,C)  block input (residual stream), kept even with recompute
 *   ln1 (N,C) ln1_mean/rstd (N) qkv (N,3C) lse (B,NH,T) atty (N,C)
 *   res2 (N,C) ln2 (N,C) ln2_mean/rstd (N) fch (N,4C) fch_gelu (N,4C)
 * Attention keeps no (B,NH,T,T) matrix: its backward recomputes the
 * probabilities from qkv, the output atty and the per-row log-sum-exp lse.
 * The head keeps no (N,V) logits either: it runs in chunks of head_rows tokens
 * (logits, fused cross-entropy, then at once both lm_head gradient GEMMs), so one
 * chunk's (head_rows,V) buffer is all the vocabulary costs; GPT-2 at B=8, T=1024
 * would otherwise hold 1.6 GB of fp32 logits.
 * With recompute (gradient checkpointing) only x_in is kept per block and one
 * block's worth of the rest is shared: backward re-runs the block forward first,
 * which gives bit-identical results because the same kernels see the same inputs. */
#define _GNU_SOURCE /* sincos */
#include "zt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

/* ---- parameter table ------------------------------------------------------ */

static void add_param(zt_param_table_t *t, int *cap, const char *name, int ndim, int64_t d0,
                      int64_t d1, int unit, int init, float std)
{
    if (t->nparams == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        zt_param_t *np = realloc(t->params, (size_t)*cap * sizeof *np);
        if (!np) zt_fatal("out of memory growing the parameter table");
        t->params = np;
    }
    zt_param_t *p = &t->params[t->nparams++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    p->unit = unit;
    p->decay = ndim >= 2;
    p->init = init;
    p->init_std = std;
}

zt_param_table_t *zt_param_table_create(zt_model_dims_t d, float init_std)
{
    zt_param_table_t *t = zt_calloc(1, sizeof *t);
    t->dims = d;
    int cap = 0;
    const int64_t C = d.C;
    /* GPT-2 scales the init of the projections that write into the residual stream
     * by 1/sqrt(2L) so the stream's variance does not grow with depth. */
    const float proj_std = init_std / sqrtf(2.0f * (float)d.L);
    add_param(t, &cap, "transformer.wte.weight", 2, d.V, C, 0, ZT_INIT_NORMAL, init_std);
    add_param(t, &cap, "transformer.wpe.weight", 2, d.maxT, C, 0, ZT_INIT_NORMAL, init_std / 2);
    add_param(t, &cap, "transformer.ln_f.weight", 1, C, 1, 0, ZT_INIT_ONES, 0);
    add_param(t, &cap, "transformer.ln_f.bias", 1, C, 1, 0, ZT_INIT_ZEROS, 0);
    for (int l = 0; l < d.L; l++) {
        char n[96];
        const int u = 1 + l;
#define P(suffix, nd, a, b, init, std)                                   \
    do {                                                                 \
        snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix);         \
        add_param(t, &cap, n, nd, a, b, u, init, std);                   \
    } while (0)
        P("ln_1.weight", 1, C, 1, ZT_INIT_ONES, 0);
        P("ln_1.bias", 1, C, 1, ZT_INIT_ZEROS, 0);
        P("attn.c_attn.weight", 2, C, 3 * C, ZT_INIT_NORMAL, init_std);
        P("attn.c_attn.bias", 1, 3 * C, 1, ZT_INIT_ZEROS, 0);
        P("attn.c_proj.weight", 2, C, C, ZT_INIT_NORMAL, proj_std);
        P("attn.c_proj.bias", 1, C, 1, ZT_INIT_ZEROS, 0);
        P("ln_2.weight", 1, C, 1, ZT_INIT_ONES, 0);
        P("ln_2.bias", 1, C, 1, ZT_INIT_ZEROS, 0);
        P("mlp.c_fc.weight", 2, C, 4 * C, ZT_INIT_NORMAL, init_std);
        P("mlp.c_fc.bias", 1, 4 * C, 1, ZT_INIT_ZEROS, 0);
        P("mlp.c_proj.weight", 2, 4 * C, C, ZT_INIT_NORMAL, proj_std);
        P("mlp.c_proj.bias", 1, C, 1, ZT_INIT_ZEROS, 0);
#undef P
    }
    t->nunits = 1 + d.L;
    t->unit_numel = zt_calloc((size_t)t->nunits, sizeof *t->unit_numel);
    t->unit_first = zt_calloc((size_t)t->nunits, sizeof *t->unit_first);
    t->unit_count = zt_calloc((size_t)t->nunits, sizeof *t->unit_count);
    for (int i = 0; i < t->nparams; i++) {
        zt_param_t *p = &t->params[i];
        if (t->unit_count[p->unit]++ == 0) t->unit_first[p->unit] = i;
        p->offset = t->unit_numel[p->unit];
        t->unit_numel[p->unit] += p->numel;
        t->total_numel += p->numel;
    }
    return t;
}

void zt_param_table_free(zt_param_table_t *t)
{
    if (!t) return;
    free(t->params);
    free(t->unit_numel);
    free(t->unit_first);
    free(t->unit_count);
    free(t);
}

int zt_param_table_find(const zt_param_table_t *t, const char *name)
{
    for (int i = 0; i < t->nparams; i++)
        if (strcmp(t->params[i].name, name) == 0) return i;
    return -1;
}

/* ---- counter-based init ----------------------------------------------------
 * splitmix64 finalizer over (seed, hash(name), index): a pure function, so a
 * rank can produce any slice of any parameter without generating the rest. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

/* Box-Muller on pair j = idx / 2: both outputs are used (cos for even idx, sin for
 * odd), so each pair of elements costs one pair of hashes, one log and one sincos. */
static void normal_pair(uint64_t key, size_t j, double *z0, double *z1)
{
    uint64_t a = mix64(key ^ mix64(2 * (uint64_t)j));
    uint64_t b = mix64(key ^ mix64(2 * (uint64_t)j + 1));
    /* 53-bit uniforms; u1 in (0,1] so log is finite */
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    double r = sqrt(-2.0 * log(u1)), sn, cs;
    sincos(2.0 * M_PI * u2, &sn, &cs);
    *z0 = r * cs;
    *z1 = r * sn;
}

static float normal_at(uint64_t key, size_t idx)
{
    double z0, z1;
    normal_pair(key, idx / 2, &z0, &z1);
    return (float)(idx & 1 ? z1 : z0);
}

float zt_param_init_value(const zt_param_t *p, uint64_t seed, size_t idx)
{
    switch (p->init) {
    case ZT_INIT_ONES: return 1.0f;
    case ZT_INIT_ZEROS: return 0.0f;
    default: return p->init_std * normal_at(mix64(seed) ^ name_hash(p->name), idx);
    }
}

void zt_param_init_range(const zt_param_t *p, uint64_t seed, size_t start, size_t n, float *out)
{
    if (p->init != ZT_INIT_NORMAL) {
        const float v = p->init == ZT_INIT_ONES ? 1.0f : 0.0f;
        for (size_t i = 0; i < n; i++) out[i] = v;
        return;
    }
    const uint64_t key = mix64(seed) ^ name_hash(p->name);
    size_t i = 0;
    if (n && (start & 1)) { /* odd first element: second half of its pair */
        out[i++] = p->init_std * normal_at(key, start);
    }
    for (; i + 1 < n; i += 2) {
        double z0, z1;
        normal_pair(key, (start + i) / 2, &z0, &z1);
        out[i] = p->init_std * (float)z0;
        out[i + 1] = p->init_std * (float)z1;
    }
    if (i < n) out[i] = p->init_std * normal_at(key, start + i);
}

/* ---- model ------------------------------------------------------------------ */

typedef struct block_acts {
    float *x_in;                /* (N,C) */
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *lse, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
} block_acts_t;

struct zt_model {
    const zt_param_table_t *table;
    const zt_backend_t *be;
    zt_model_dims_t d;
    int Bmax, Tmax, B, T, recompute, has_targets;
    block_acts_t *blk;          /* (L) */
    float *x_out;               /* (N,C) output of the last block */
    float *lnf, *lnf_mean, *lnf_rstd; /* (N,C) (N) (N) */
    float *logits;              /* (head_rows,V) one chunk's logits, then dlogits in place */
    int head_rows, head_first;  /* chunk rows; first row of the chunk the buffer holds */
    float *losses;              /* (N) */
    float *dres, *dres2;        /* (N,C) residual-stream gradients */
    float *dqkv;                /* (N,3C) */
    int32_t *inputs, *targets;  /* (N) backend memory */
    float *host_losses;         /* (N) */
    size_t act_bytes;
    /* offsets of each block parameter within a block unit */
    size_t o_ln1w, o_ln1b, o_qkvw, o_qkvb, o_projw, o_projb, o_ln2w, o_ln2b, o_fcw, o_fcb, o_fcpw,
        o_fcpb;
    size_t o_wte, o_wpe, o_lnfw, o_lnfb;
};

static void *act_alloc(zt_model_t *m, size_t bytes)
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

size_t zt_model_activation_bytes_estimate(zt_model_dims_t d, int B, int T, int recompute)
{
    const size_t N = (size_t)B * T, C = d.C, lse = (size_t)B * d.NH * T;
    const size_t per_block = N * C /*ln1*/ + 2 * N + 3 * N * C + lse + N * C /*atty*/ +
                             N * C /*res2*/ + N * C /*ln2*/ + 2 * N + 8 * N * C /*fch, gelu*/;
    size_t floats = (size_t)d.L * N * C /* x_in */ + (recompute ? 1 : (size_t)d.L) * per_block;
    floats += N * C /*x_out*/ + N * C + 2 * N /*lnf*/ + (size_t)head_rows_for(N, d.V) * d.V /*logits*/ +
              N /*losses*/;
    floats += 2 * N * C + 3 * N * C; /* dres, dres2, dqkv */
    return floats * sizeof(float) + 2 * N * sizeof(int32_t);
}

double zt_model_flops_per_token(zt_model_dims_t d, int T)
{
    /* 6 flops per parameter per token (2 forward + 4 backward) over the matmul
     * parameters incl. the tied lm_head, plus attention: QK^T and att@V are each
     * 2*T*C per token forward (causal half ignored, as PaLM's MFU convention). */
    const double C = d.C, L = d.L, V = d.V;
    const double matmul_params = L * 12.0 * C * C + V * C;
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

zt_model_t *zt_model_create(const zt_param_table_t *table, const zt_backend_t *be, int B, int T,
                            int recompute)
{
    zt_model_t *m = zt_calloc(1, sizeof *m);
    m->table = table;
    m->be = be;
    m->d = table->dims;
    m->Bmax = B;
    m->Tmax = T;
    m->recompute = recompute;
    const size_t N = (size_t)B * T, C = m->d.C, L = m->d.L, NH = m->d.NH, V = m->d.V;
    const size_t lse = (size_t)B * NH * T, F = sizeof(float);

    const int b0 = table->unit_first[1 < table->nunits ? 1 : 0];
    if (table->nunits > 1) {
        const zt_param_t *p = &table->params[b0];
        m->o_ln1w = p[0].offset; m->o_ln1b = p[1].offset; m->o_qkvw = p[2].offset;
        m->o_qkvb = p[3].offset; m->o_projw = p[4].offset; m->o_projb = p[5].offset;
        m->o_ln2w = p[6].offset; m->o_ln2b = p[7].offset; m->o_fcw = p[8].offset;
        m->o_fcb = p[9].offset; m->o_fcpw = p[10].offset; m->o_fcpb = p[11].offset;
    }
    const zt_param_t *r = &table->params[table->unit_first[0]];
    m->o_wte = r[0].offset; m->o_wpe = r[1].offset; m->o_lnfw = r[2].offset; m->o_lnfb = r[3].offset;

    m->blk = zt_calloc(L ? L : 1, sizeof *m->blk);
    block_acts_t shared = {0};
    for (size_t l = 0; l < L; l++) {
        block_acts_t *a = &m->blk[l];
        a->x_in = act_alloc(m, N * C * F);
        if (recompute && l > 0) {
            float *x_in = a->x_in;
            *a = shared;
            a->x_in = x_in;
            continue;
        }
        a->ln1 = act_alloc(m, N * C * F);
        a->ln1_mean = act_alloc(m, N * F);
        a->ln1_rstd = act_alloc(m, N * F);
        a->qkv = act_alloc(m, 3 * N * C * F);
        a->lse = act_alloc(m, lse * F);
        a->atty = act_alloc(m, N * C * F);
        a->res2 = act_alloc(m, N * C * F);
        a->ln2 = act_alloc(m, N * C * F);
        a->ln2_mean = act_alloc(m, N * F);
        a->ln2_rstd = act_alloc(m, N * F);
        a->fch = act_alloc(m, 4 * N * C * F);
        a->fch_gelu = act_alloc(m, 4 * N * C * F);
        if (recompute) shared = *a;
    }
    m->x_out = act_alloc(m, N * C * F);
    m->lnf = act_alloc(m, N * C * F);
    m->lnf_mean = act_alloc(m, N * F);
    m->lnf_rstd = act_alloc(m, N * F);
    m->head_rows = head_rows_for(N, V);
    m->logits = act_alloc(m, (size_t)m->head_rows * V * F);
    m->losses = act_alloc(m, N * F);
    m->dres = act_alloc(m, N * C * F);
    m->dres2 = act_alloc(m, N * C * F);
    m->dqkv = act_alloc(m, 3 * N * C * F);
    m->inputs = act_alloc(m, N * sizeof(int32_t));
    m->targets = act_alloc(m, N * sizeof(int32_t));
    m->host_losses = be->alloc_host(N * F); /* pinned on a GPU: the download stays async */
    return m;
}

void zt_model_free(zt_model_t *m)
{
    if (!m) return;
    const zt_backend_t *be = m->be;
    for (int l = 0; l < m->d.L; l++) {
        block_acts_t *a = &m->blk[l];
        be->free(a->x_in);
        if (m->recompute && l > 0) continue;
        float *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->lse, a->atty,
                         a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    }
    float *bufs[] = {m->x_out, m->lnf, m->lnf_mean, m->lnf_rstd, m->logits, m->losses,
                     m->dres, m->dres2, m->dqkv};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    be->free(m->inputs);
    be->free(m->targets);
    be->free_host(m->host_losses);
    free(m->blk);
    free(m);
}

size_t zt_model_activation_bytes(const zt_model_t *m) { return m->act_bytes; }

void zt_model_set_batch(zt_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T)
{
    if (B > m->Bmax || T > m->Tmax || T > m->d.maxT)
        zt_fatal("batch (%d, %d) exceeds the model's buffers (%d, %d)", B, T, m->Bmax, m->Tmax);
    m->B = B;
    m->T = T;
    const size_t N = (size_t)B * T;
    m->be->from_host_async(m->inputs, inputs, N * sizeof(int32_t));
    m->has_targets = targets != NULL;
    if (targets) m->be->from_host_async(m->targets, targets, N * sizeof(int32_t));
}

void zt_model_forward_embed(zt_model_t *m, const float *root)
{
    float *x0 = m->d.L > 0 ? m->blk[0].x_in : m->x_out;
    m->be->embedding_forward(x0, m->inputs, root + m->o_wte, m->B * m->T, m->d.C);
    m->be->positional_forward(x0, root + m->o_wpe, m->B, m->T, m->d.C);
}

/* Block forward from a->x_in; writes the block output to `out`. */
static void block_forward(zt_model_t *m, block_acts_t *a, const float *w, float *out)
{
    const zt_backend_t *be = m->be;
    const int B = m->B, T = m->T, C = m->d.C, NH = m->d.NH, N = B * T;
    be->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, a->x_in, w + m->o_ln1w, w + m->o_ln1b,
                          N, C, 1e-5f);
    be->matmul_forward(a->qkv, a->ln1, w + m->o_qkvw, w + m->o_qkvb, N, C, 3 * C, 0); // (N,3C)
    be->attention_forward(a->atty, a->lse, a->qkv, B, T, NH, NH, C / NH);                     // (N,C)
    /* attention projection into a scratch, then the residual add */
    be->matmul_forward(a->res2, a->atty, w + m->o_projw, w + m->o_projb, N, C, C, 0);
    be->residual_forward(a->res2, a->res2, a->x_in, (size_t)N * C);
    be->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w + m->o_ln2w, w + m->o_ln2b,
                          N, C, 1e-5f);
    be->matmul_gelu_forward(a->fch_gelu, a->fch, a->ln2, w + m->o_fcw, w + m->o_fcb, N, C,
                            4 * C); // (N,4C) each
    be->matmul_forward(out, a->fch_gelu, w + m->o_fcpw, w + m->o_fcpb, N, 4 * C, C, 0);
    be->residual_forward(out, out, a->res2, (size_t)N * C);
}

void zt_model_forward_block(zt_model_t *m, int l, const float *unit)
{
    float *out = l + 1 < m->d.L ? m->blk[l + 1].x_in : m->x_out;
    block_forward(m, &m->blk[l], unit, out);
}

void zt_model_set_head_rows(zt_model_t *m, int rows)
{
    if (rows < 1 || rows > m->head_rows)
        zt_fatal("head chunk of %d rows outside 1..%d (the rows its buffer holds)", rows, m->head_rows);
    m->head_rows = rows;
}

/* The head over rows [0, N) in chunks: ln_f, logits (head_rows,V), and with targets
 * the fused cross-entropy (losses, and with droot dlogits in place); with droot each
 * chunk's lm_head gradients follow at once: dlnf rows into dres2 (N,C) and the tied
 * wte gradient, so the chunk buffer is free for the next. */
static void head_chunks(zt_model_t *m, const float *root, float *droot, float dscale)
{
    const zt_backend_t *be = m->be;
    const int N = m->B * m->T, C = m->d.C, V = m->d.V;
    be->layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, m->x_out, root + m->o_lnfw,
                          root + m->o_lnfb, N, C, 1e-5f);
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        const int rows = ZT_MIN(m->head_rows, N - r0);
        const float *lnf = m->lnf + (size_t)r0 * C;
        be->matmul_forward(m->logits, lnf, root + m->o_wte, NULL, rows, C, V, 1); // (rows,V)
        m->head_first = r0;
        if (!m->has_targets) continue;
        be->crossentropy_fused(m->logits, m->losses + r0, m->targets + r0, rows, V, droot ? dscale : 0.0f);
        if (droot)
            be->matmul_backward(m->dres2 + (size_t)r0 * C, droot + m->o_wte, NULL, m->logits, lnf,
                                root + m->o_wte, rows, C, V, 1);
    }
    /* read after backward: the device goes on with it meanwhile */
    if (m->has_targets) be->to_host_async(m->host_losses, m->losses, (size_t)N * sizeof(float));
}

void zt_model_forward_head(zt_model_t *m, const float *root) { head_chunks(m, root, NULL, 0.0f); }

void zt_model_train_head(zt_model_t *m, const float *root, float *droot, float dscale)
{
    if (!m->has_targets) zt_fatal("zt_model_train_head: the batch has no targets");
    head_chunks(m, root, droot, dscale);
    /* dlnf (N,C) is in dres2 (every chunk wrote its rows); ln_f backward gives dL/d x_out,
     * the last block's output */
    const int N = m->B * m->T, C = m->d.C;
    m->be->memzero(m->dres, (size_t)N * C * sizeof(float));
    m->be->layernorm_backward(m->dres, droot + m->o_lnfw, droot + m->o_lnfb, m->dres2, m->x_out,
                              root + m->o_lnfw, m->lnf_mean, m->lnf_rstd, N, C);
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

void zt_model_logits_row(zt_model_t *m, int b, int t, float *out)
{
    const size_t V = m->d.V;
    const int row = b * m->T + t;
    if (row < m->head_first || row >= m->head_first + m->head_rows || row >= m->B * m->T)
        zt_fatal("logits of row %d are not kept (the head keeps rows %d..%d of its last chunk)", row,
                 m->head_first, ZT_MIN(m->head_first + m->head_rows, m->B * m->T) - 1);
    m->be->wait_uploads(); /* the batch's host arrays are the caller's again after this */
    m->be->to_host(out, m->logits + (size_t)(row - m->head_first) * V, V * sizeof(float));
}

void zt_model_backward_block(zt_model_t *m, int l, const float *w, float *dw)
{
    const zt_backend_t *be = m->be;
    const int B = m->B, T = m->T, C = m->d.C, NH = m->d.NH, N = B * T;
    const size_t NC = (size_t)N * C, F = sizeof(float);
    block_acts_t *a = &m->blk[l];
    if (m->recompute) {
        /* re-run the forward to refill the shared buffers; the output goes to a
         * scratch (dres2, free until dln2 below) because the next block's x_in must
         * stay intact */
        block_forward(m, a, w, m->dres2);
    }
    /* m->dres holds dL/d(block output) (N,C). Output = res2 + fcproj(gelu(fc(ln2(res2)))).
     * dfch = gelu'(fch) * (dres @ Wfcp^T) goes into fch_gelu, which fcproj's weight
     * gradient reads first and nothing needs after: no (N,4C) scratch. Input gradients
     * are overwritten, so no buffer here is zeroed first (but dqkv: attention accumulates). */
    float *dfch = a->fch_gelu;
    be->gelu_matmul_backward(dfch, dw + m->o_fcpw, dw + m->o_fcpb, m->dres, a->fch_gelu, a->fch,
                             w + m->o_fcpw, N, 4 * C, C);
    /* dres2 = dres + ln2 backward(dfch @ Wfc^T) */
    float *dln2 = m->dres2;
    be->matmul_backward(dln2, dw + m->o_fcw, dw + m->o_fcb, dfch, a->ln2, w + m->o_fcw, N, C,
                        4 * C, 0);
    /* dres (which is d res2 from the skip path) += layernorm backward */
    be->layernorm_backward(m->dres, dw + m->o_ln2w, dw + m->o_ln2b, dln2, a->res2, w + m->o_ln2w,
                           a->ln2_mean, a->ln2_rstd, N, C);
    /* now m->dres = d res2 ; res2 = x_in + proj(atty) */
    float *datty = m->dres2;
    be->matmul_backward(datty, dw + m->o_projw, dw + m->o_projb, m->dres, a->atty, w + m->o_projw,
                        N, C, C, 0);
    be->memzero(m->dqkv, 3 * NC * F);
    be->attention_backward(m->dqkv, datty, a->qkv, a->atty, a->lse, B, T, NH, NH, C / NH);
    float *dln1 = m->dres2;
    be->matmul_backward(dln1, dw + m->o_qkvw, dw + m->o_qkvb, m->dqkv, a->ln1, w + m->o_qkvw, N, C,
                        3 * C, 0);
    /* dx_in = d res2 (skip) + ln1 backward */
    be->layernorm_backward(m->dres, dw + m->o_ln1w, dw + m->o_ln1b, dln1, a->x_in, w + m->o_ln1w,
                           a->ln1_mean, a->ln1_rstd, N, C);
}

void zt_model_backward_embed(zt_model_t *m, float *droot)
{
    m->be->embedding_backward(droot + m->o_wte, m->dres, m->inputs, m->B * m->T, m->d.C);
    m->be->positional_backward(droot + m->o_wpe, m->dres, m->B, m->T, m->d.C);
}
