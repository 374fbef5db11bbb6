/* zt_arch_gpt2.c — the GPT-2 family (HF GPT2LMHeadModel).
 *
 * Learned positional embeddings, pre-LayerNorm blocks (eps 1e-5), one Conv1D c_attn
 * for q, k and v, tanh-approximate GELU MLP of width 4C, every linear with a bias,
 * lm_head tied to the token embedding. HF names and shapes; Conv1D weights are
 * (in, out): out = x @ W + b.
 *   root unit 0   transformer.wte.weight (V,C), transformer.wpe.weight (maxT,C),
 *                 transformer.ln_f.weight (C), transformer.ln_f.bias (C)
 *   unit 1+l      transformer.h.l.*: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
 *
 * Activations kept per block for backward (N = B*T):
 *   ln1 (N,C) ln1_mean/rstd (N) qkv (N,3C) atty (N,C)
 *   res2 (N,C) ln2 (N,C) ln2_mean/rstd (N) fch (N,4C) fch_gelu (N,4C)
 * (the block input x_in is zt_model.c's). Attention (zt_attention.c) keeps no (B,NH,T,T)
 * matrix: its backward recomputes the probabilities from qkv, the output atty and the
 * per-row log-sum-exp it keeps. With recompute (gradient checkpointing) one block's worth of these
 * is shared: backward re-runs the block forward first, which gives bit-identical
 * results because the same kernels see the same inputs.
 *
 * LoRA (zt_lora.h) sits on the four Conv1D GEMMs (zt_linear.c, with their tensor-parallel
 * collectives), each one target (c_attn is one
 * module for PEFT: one A (r, C), one B (3C, r)). The adapters are PEFT's nn.Linear
 * shapes whatever the base's layout, so y += s (x A^T) B^T as for Llama; only the
 * merge transposes (fan_in_fan_out). c_fc's delta belongs before the GELU, so with an
 * adapter there the fused matmul_gelu_forward gives way to matmul, LoRA, gelu; and
 * mlp.c_proj's adapter adds to its input gradient before gelu', so with one there
 * gelu_matmul_backward gives way to matmul_backward, LoRA, gelu_backward (the linear's
 * _gelu forms). Without adapters on them both stay fused, so a full fine-tune runs the
 * fused ops. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_hf_config.h"
#include "zt_model_internal.h"

#define GPT2_EPS 1e-5f

typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
} block_acts_t;

typedef struct gpt2 {
    block_acts_t *blk;          /* (L) */
    float *lnf_mean, *lnf_rstd; /* (N) */
    float *dqkv;                /* (N,3C) */
    zt_attention_t att;         /* the attention's own activations (lse, sequence parallelism's) */
    float *dact;                /* (N,4C) mlp.c_proj's input gradient before gelu' (LoRA there) */
    float *dw_frozen;           /* (C) where a frozen LayerNorm's weight gradient goes (LoRA) */
    /* the block's four linears (gemm_name's order): c_attn and c_fc column parallel,
     * attn.c_proj and mlp.c_proj row parallel */
    zt_linear_t lin[4];
    /* offsets of the LayerNorms within a block unit, and of the root's parameters */
    size_t o_ln1w, o_ln1b, o_ln2w, o_ln2b;
    size_t o_wte, o_wpe, o_lnfw, o_lnfb;
} gpt2_t;

/* ---- shape and parameters ------------------------------------------------------- */

static int gpt2_check(const zt_model_dims_t *d, const char *where, char *err, size_t errlen)
{
    if (d->C % d->NH)
        return zt_err(err, errlen, "%s: n_embd (%d) must be divisible by n_head (%d)", where, d->C, d->NH);
    if (d->NKV != d->NH)
        return zt_err(err, errlen, "%s: gpt2 has no grouped-query attention (n_kv_head %d != n_head %d)", where,
                      d->NKV, d->NH);
    if (d->HD != d->C / d->NH)
        return zt_err(err, errlen, "%s: gpt2's head_dim is n_embd / n_head = %d, not %d", where, d->C / d->NH,
                      d->HD);
    if (d->I != 4 * d->C)
        return zt_err(err, errlen, "%s: gpt2's MLP is 4 * n_embd = %d wide, not intermediate_size %d", where,
                      4 * d->C, d->I);
    if (!d->tied) return zt_err(err, errlen, "%s: gpt2's lm_head is tied to the token embedding", where);
    return 0;
}

static int gpt2_from_config(const zt_config_t *cfg, zt_model_dims_t *d, char *err, size_t errlen)
{
    zt_model_dims_default(d);
    d->L = cfg->model.n_layer;
    d->NH = cfg->model.n_head;
    d->NKV = cfg->model.n_kv_head ? cfg->model.n_kv_head : d->NH;
    d->C = cfg->model.n_embd;
    d->HD = cfg->model.head_dim ? cfg->model.head_dim : d->C / d->NH;
    d->I = cfg->model.intermediate_size ? cfg->model.intermediate_size : 4 * d->C;
    d->V = cfg->model.vocab_size;
    d->maxT = cfg->model.block_size;
    d->tied = 1; /* always: model.tie_word_embeddings is the llama family's */
    d->qkv_bias = d->o_bias = 1;
    d->norm_eps = GPT2_EPS;
    return gpt2_check(d, "model", err, errlen);
}

static int gpt2_from_hf(const json_t *j, const char *file, zt_model_dims_t *d, char *err, size_t errlen)
{
    zt_model_dims_default(d);
    zt_hf_config_t c = {j, file, err, errlen, 0};
    d->L = zt_hf_int(&c, "n_layer", -1);
    d->NH = zt_hf_int(&c, "n_head", -1);
    d->C = zt_hf_int(&c, "n_embd", -1);
    d->V = zt_hf_int(&c, "vocab_size", -1);
    d->maxT = zt_hf_int(&c, "n_positions", -1);
    d->I = zt_hf_int(&c, "n_inner", 4 * (d->C > 0 ? d->C : 0));
    d->norm_eps = zt_hf_double(&c, "layer_norm_epsilon", GPT2_EPS);
    d->tied = zt_hf_bool(&c, "tie_word_embeddings", 1);
    if (c.failed) return -1;
    if (zt_hf_has(j, "activation_function")) {
        const char *act = json_string_value(json_object_get(j, "activation_function"));
        if (!act || (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")))
            return zt_err(err, errlen, "%s: activation_function \"%s\" is not supported (gpt2: gelu_new)", file,
                          act ? act : "?");
    }
    if (fabs(d->norm_eps - 1e-5) > 1e-12)
        return zt_err(err, errlen, "%s: layer_norm_epsilon %g is not supported (gpt2: 1e-5)", file, d->norm_eps);
    d->norm_eps = GPT2_EPS;
    d->NKV = d->NH;
    d->HD = d->NH > 0 ? d->C / d->NH : 0;
    d->qkv_bias = d->o_bias = 1;
    return gpt2_check(d, file, err, errlen);
}

static json_t *gpt2_to_hf(const zt_model_dims_t *d)
{
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:f, s:f, s:f, s:f, s:b}",
                     "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "n_layer", d->L, "n_head", d->NH,
                     "n_embd", d->C, "vocab_size", d->V, "n_positions", d->maxT, "n_ctx", d->maxT, "n_inner",
                     "activation_function", "gelu_new", "layer_norm_epsilon", (double)GPT2_EPS, "resid_pdrop", 0.0,
                     "embd_pdrop", 0.0, "attn_pdrop", 0.0, "initializer_range", 0.02, "tie_word_embeddings", 1);
}

static void gpt2_to_config(const zt_model_dims_t *d, zt_config_t *cfg)
{
    cfg->model.n_layer = d->L;
    cfg->model.n_head = d->NH;
    cfg->model.n_embd = d->C;
    cfg->model.vocab_size = d->V;
    cfg->model.block_size = d->maxT;
}

static void gpt2_build(zt_param_table_t *t, float init_std)
{
    const zt_model_dims_t *d = &t->dims;
    const int64_t C = d->C;
    /* GPT-2 scales the init of the projections that write into the residual stream
     * by 1/sqrt(2L) so the stream's variance does not grow with depth. */
    const float proj_std = init_std / sqrtf(2.0f * (float)d->L);
    zt_params_add(t, "transformer.wte.weight", 2, d->V, C, 0, -1, ZT_INIT_NORMAL, init_std, ZT_ROLE_EMBED,
                  ZT_W_OUT_IN);
    zt_params_add(t, "transformer.wpe.weight", 2, d->maxT, C, 0, -1, ZT_INIT_NORMAL, init_std / 2,
                  ZT_ROLE_POS_EMBED, ZT_W_OUT_IN);
    zt_params_add(t, "transformer.ln_f.weight", 1, C, 1, 0, -1, ZT_INIT_ONES, 0, ZT_ROLE_NORM, ZT_W_NONE);
    zt_params_add(t, "transformer.ln_f.bias", 1, C, 1, 0, -1, ZT_INIT_ZEROS, 0, ZT_ROLE_NORM, ZT_W_NONE);
    for (int l = 0; l < d->L; l++) {
        char n[96];
        const int u = 1 + l;
#define P(suffix, nd, a, b, init, std, role)                                          \
    do {                                                                              \
        snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix);                      \
        zt_params_add(t, n, nd, a, b, u, l, init, std, role, ZT_W_IN_OUT);            \
    } while (0)
        P("ln_1.weight", 1, C, 1, ZT_INIT_ONES, 0, ZT_ROLE_NORM);
        P("ln_1.bias", 1, C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_NORM);
        P("attn.c_attn.weight", 2, C, 3 * C, ZT_INIT_NORMAL, init_std, ZT_ROLE_QKV);
        P("attn.c_attn.bias", 1, 3 * C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_QKV);
        P("attn.c_proj.weight", 2, C, C, ZT_INIT_NORMAL, proj_std, ZT_ROLE_O);
        P("attn.c_proj.bias", 1, C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_O);
        P("ln_2.weight", 1, C, 1, ZT_INIT_ONES, 0, ZT_ROLE_NORM);
        P("ln_2.bias", 1, C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_NORM);
        P("mlp.c_fc.weight", 2, C, 4 * C, ZT_INIT_NORMAL, init_std, ZT_ROLE_FC);
        P("mlp.c_fc.bias", 1, 4 * C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_FC);
        P("mlp.c_proj.weight", 2, 4 * C, C, ZT_INIT_NORMAL, proj_std, ZT_ROLE_DOWN);
        P("mlp.c_proj.bias", 1, C, 1, ZT_INIT_ZEROS, 0, ZT_ROLE_DOWN);
#undef P
    }
    zt_params_finish(t, 1 + d->L, 0, 1);
}

/* The block's GEMMs: their weights' places in a block unit */
static const char *const gemm_name[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
static const int gemm_param[4] = {2, 4, 8, 10};
enum { ATTN, PROJ, FC, FCP }; /* their indices */

/* 1 when block 0's GEMM k has an adapter (every block has the same targets) */
static int has_lora(const zt_param_table_t *t, int k)
{
    char n[96];
    snprintf(n, sizeof n, "transformer.h.0.%s.lora_A.weight", gemm_name[k]);
    return t->lora_rank && zt_param_table_find(t, n) >= 0;
}

/* 1 when LoRA adapts any of the block's GEMMs */
static int any_lora(const zt_param_table_t *t)
{
    for (int k = 0; k < 4; k++)
        if (has_lora(t, k)) return 1;
    return 0;
}

static double gpt2_flops_per_token(const zt_model_dims_t *d, int T)
{
    /* 6 flops per parameter per token (2 forward + 4 backward) over the matmul
     * parameters incl. the tied lm_head, plus attention: QK^T and att@V are each
     * 2*T*C per token forward (causal half ignored, as PaLM's MFU convention). */
    const double C = d->C, L = d->L, V = d->V;
    const double matmul_params = L * 12.0 * C * C + V * C;
    return 6.0 * matmul_params + 12.0 * L * C * (double)T;
}

/* ---- runtime ---------------------------------------------------------------------- */

static void gpt2_create(zt_model_t *m)
{
    gpt2_t *g = zt_calloc(1, sizeof *g);
    m->fam = g;
    const zt_param_table_t *table = m->table;
    const size_t N = (size_t)m->Bmax * m->Tmax, C = m->d.C, L = m->d.L, NH = m->d.NH;
    const size_t A = NH * m->d.HD, I = m->d.I, F = sizeof(float);
    const size_t Nl = m->d.tp_seq ? N / (size_t)m->d.tp_size : N; /* the residual stream's rows */
    if (table->nunits > 1) {
        const zt_param_t *p = &table->params[table->unit_first[1]];
        g->o_ln1w = p[0].offset; g->o_ln1b = p[1].offset; g->o_ln2w = p[6].offset; g->o_ln2b = p[7].offset;
        for (int k = 0; k < 4; k++) { /* each weight's bias follows it */
            const int w = table->unit_first[1] + gemm_param[k];
            zt_linear_init(m, &g->lin[k], k % 2 ? ZT_LINEAR_ROW : ZT_LINEAR_COLUMN, &w, 1, w + 1);
        }
    }
    const zt_param_t *r = &table->params[table->unit_first[0]];
    g->o_wte = r[0].offset; g->o_wpe = r[1].offset; g->o_lnfw = r[2].offset; g->o_lnfb = r[3].offset;

    g->blk = zt_calloc(L ? L : 1, sizeof *g->blk);
    for (size_t l = 0; l < L; l++) {
        block_acts_t *a = &g->blk[l];
        if (!zt_model_holds_block(m, (int)l)) continue; /* another pipeline stage's */
        if (m->recompute && (int)l > zt_model_first_block(m)) {
            *a = g->blk[zt_model_first_block(m)];
            continue;
        }
        a->ln1 = zt_model_alloc(m, Nl * C * F);
        a->ln1_mean = zt_model_alloc(m, Nl * F);
        a->ln1_rstd = zt_model_alloc(m, Nl * F);
        a->qkv = zt_model_alloc(m, 3 * N * A * F);
        a->atty = zt_model_alloc(m, N * A * F);
        a->res2 = zt_model_alloc(m, Nl * C * F);
        a->ln2 = zt_model_alloc(m, Nl * C * F);
        a->ln2_mean = zt_model_alloc(m, Nl * F);
        a->ln2_rstd = zt_model_alloc(m, Nl * F);
        a->fch = zt_model_alloc(m, N * I * F);
        a->fch_gelu = zt_model_alloc(m, N * I * F);
    }
    zt_attention_init(m, &g->att);
    g->lnf_mean = zt_model_alloc(m, N * F);
    g->lnf_rstd = zt_model_alloc(m, N * F);
    g->dqkv = zt_model_alloc(m, 3 * N * A * F);
    m->share_qkv = g->dqkv, m->share_out = m->dres2; /* zt_model_set_shared_rows' (N,3A), (N,A <= C) */
    if (any_lora(table)) {
        int in = 0;
        for (int k = 0; k < 4; k++)
            if (g->lin[k].lora.n) in = ZT_MAX(in, g->lin[k].in);
        zt_lora_scratch(m, in);
        if (g->lin[FCP].lora.n) g->dact = zt_model_alloc(m, N * I * F);
        g->dw_frozen = zt_model_alloc(m, C * F);
    }
}

static void gpt2_destroy(zt_model_t *m)
{
    gpt2_t *g = m->fam;
    const zt_backend_t *be = m->be;
    for (int l = 0; l < m->d.L; l++) {
        if (!zt_model_holds_block(m, l)) continue;
        if (m->recompute && l > zt_model_first_block(m)) break;
        block_acts_t *a = &g->blk[l];
        float *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv,      a->atty,   a->res2,
                         a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) be->free(bufs[i]);
    }
    be->free(g->lnf_mean);
    be->free(g->lnf_rstd);
    be->free(g->dqkv);
    zt_attention_free(m, &g->att);
    for (int k = 0; k < 4; k++) zt_linear_free(m, &g->lin[k]);
    float *sc[] = {g->dact, g->dw_frozen};
    for (size_t i = 0; i < sizeof sc / sizeof *sc; i++)
        if (sc[i]) be->free(sc[i]);
    free(g->blk);
    free(g);
}

static void gpt2_embed_forward(zt_model_t *m, const float *root, float *x0)
{
    const gpt2_t *g = m->fam;
    zt_model_embed_tokens(m, root + g->o_wte, x0);
    /* each token's position: a packed batch's, or this rank's chunks under sequence
     * parallelism (zt_model_positions), else 0..T-1 */
    if (m->d.tp_seq) /* this rank's rows of the residual stream */
        m->be->positional_forward(x0, root + g->o_wpe, zt_model_row_positions(m), 1, zt_model_rows(m), m->d.C);
    else
        m->be->positional_forward(x0, root + g->o_wpe, zt_model_positions(m), m->B, m->T, m->d.C);
}

static void gpt2_embed_backward(zt_model_t *m, float *droot, float *dx0)
{
    const gpt2_t *g = m->fam;
    zt_model_embed_tokens_backward(m, droot + g->o_wte, dx0);
    if (m->d.tp_seq) /* this rank's rows: a partial gradient, summed over tp (tp_grad_sum) */
        m->be->positional_backward(droot + g->o_wpe, dx0, zt_model_row_positions(m), 1, zt_model_rows(m), m->d.C);
    else
        m->be->positional_backward(droot + g->o_wpe, dx0, zt_model_positions(m), m->B, m->T, m->d.C);
}

static void gpt2_block_forward(zt_model_t *m, int l, const float *w, const float *lora, const float *x_in,
                               float *out)
{
    gpt2_t *g = m->fam;
    block_acts_t *a = &g->blk[l];
    const zt_backend_t *be = m->be;
    /* Nl: the residual stream's rows (N / tp under tp_sequence_parallel); A, I: this rank's
     * attention and MLP widths (C and 4C without tensor parallelism) */
    const int C = m->d.C, Nl = zt_model_rows(m);
    be->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x_in, w + g->o_ln1w, w + g->o_ln1b, Nl, C,
                          GPT2_EPS);
    zt_linear_forward(m, &g->lin[ATTN], l, w, lora, a->ln1, a->qkv); // (N,3A)
    zt_attention_forward(m, &g->att, l, 0, a->qkv, a->atty); // (N,A)
    zt_linear_forward(m, &g->lin[PROJ], l, w, lora, a->atty, a->res2); // (Nl,C)
    be->residual_forward(a->res2, a->res2, x_in, (size_t)Nl * C);
    be->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w + g->o_ln2w, w + g->o_ln2b, Nl, C,
                          GPT2_EPS);
    zt_linear_forward_gelu(m, &g->lin[FC], l, w, lora, a->ln2, a->fch, a->fch_gelu); // (N,I) each
    zt_linear_forward(m, &g->lin[FCP], l, w, lora, a->fch_gelu, out); // (Nl,C)
    be->residual_forward(out, out, a->res2, (size_t)Nl * C);
}

static void gpt2_block_backward(zt_model_t *m, int l, const float *w, float *dw, const float *lora,
                                float *dlora, const float *x_in, float *dres)
{
    gpt2_t *g = m->fam;
    const zt_backend_t *be = m->be;
    const int C = m->d.C, Nl = zt_model_rows(m);
    block_acts_t *a = &g->blk[l];
    /* dw NULL: the base is frozen (LoRA): no weight or bias gradients (the linears run no
     * weight GEMM); the LayerNorms' weight gradients, which the kernel always writes, land
     * in a scratch */
#define DW(off) (dw ? dw + (off) : NULL)
#define DN(off) (dw ? dw + (off) : g->dw_frozen)
    if (m->recompute) {
        /* re-run the forward to refill the shared buffers; the output goes to a
         * scratch (dres2, free until dln2 below) because the next block's x_in must
         * stay intact */
        gpt2_block_forward(m, l, w, lora, x_in, m->dres2);
    }
    /* dres holds dL/d(block output) (Nl,C). Output = res2 + fcproj(gelu(fc(ln2(res2)))).
     * dfch = gelu'(fch) * (dres @ Wfcp^T) goes into fch_gelu, which fcproj's weight
     * gradient reads first and nothing needs after: no (N,4C) scratch (but dact, where an
     * adapter on mlp.c_proj reads fch_gelu after the base). Input gradients are
     * overwritten, so no buffer here is zeroed first (but dqkv: attention accumulates). */
    float *dfch = zt_linear_backward_gelu(m, &g->lin[FCP], l, w, dw, lora, dlora, a->fch_gelu, a->fch, dres, g->dact,
                                          a->fch_gelu); // (N,I)
    /* dres2 = dres + ln2 backward(dfch @ Wfc^T) */
    const float *dn = zt_linear_backward(m, &g->lin[FC], l, w, dw, lora, dlora, a->ln2, dfch, m->dres2); // (Nl,C)
    /* dres (which is d res2 from the skip path) += layernorm backward */
    be->layernorm_backward(dres, DN(g->o_ln2w), DW(g->o_ln2b), dn, a->res2, w + g->o_ln2w, a->ln2_mean,
                           a->ln2_rstd, Nl, C);
    /* now dres = d res2 ; res2 = x_in + proj(atty) */
    float *datty = zt_linear_backward(m, &g->lin[PROJ], l, w, dw, lora, dlora, a->atty, dres, m->dres2); // (N,A)
    zt_attention_backward(m, &g->att, l, 0, a->qkv, a->atty, datty, g->dqkv); // (N,3A)
    dn = zt_linear_backward(m, &g->lin[ATTN], l, w, dw, lora, dlora, a->ln1, g->dqkv,
                            zt_model_needs_dx_in(m, l, dw) ? m->dres2 : NULL);
    if (!dn) return;
    /* dx_in = d res2 (skip) + ln1 backward */
    be->layernorm_backward(dres, DN(g->o_ln1w), DW(g->o_ln1b), dn, x_in, w + g->o_ln1w, a->ln1_mean,
                           a->ln1_rstd, Nl, C);
#undef DW
#undef DN
}

static void gpt2_final_norm_forward(zt_model_t *m, const float *root, const float *x, float *xf)
{
    const gpt2_t *g = m->fam;
    m->be->layernorm_forward(xf, g->lnf_mean, g->lnf_rstd, x, root + g->o_lnfw, root + g->o_lnfb, zt_model_rows(m),
                             m->d.C, GPT2_EPS);
}

static void gpt2_final_norm_backward(zt_model_t *m, const float *root, float *droot, const float *x,
                                     const float *dxf, float *dx)
{
    const gpt2_t *g = m->fam;
    const int N = zt_model_rows(m), C = m->d.C;
    m->be->memzero(dx, (size_t)N * C * sizeof(float));
    /* droot NULL: a frozen root (LoRA) */
    m->be->layernorm_backward(dx, droot ? droot + g->o_lnfw : g->dw_frozen, droot ? droot + g->o_lnfb : NULL, dxf,
                              x, root + g->o_lnfw, g->lnf_mean, g->lnf_rstd, N, C);
}

static size_t gpt2_head_offset(const zt_model_t *m) { return ((const gpt2_t *)m->fam)->o_wte; }

static const zt_arch_ops_t gpt2_ops = {
    .create = gpt2_create,
    .destroy = gpt2_destroy,
    .embed_forward = gpt2_embed_forward,
    .embed_backward = gpt2_embed_backward,
    .block_forward = gpt2_block_forward,
    .block_backward = gpt2_block_backward,
    .final_norm_forward = gpt2_final_norm_forward,
    .final_norm_backward = gpt2_final_norm_backward,
    .head_offset = gpt2_head_offset,
};

const zt_arch_t zt_arch_gpt2 = {
    .name = "gpt2",
    .hf_class = "GPT2LMHeadModel",
    .hf_model_type = "gpt2",
    .dims_from_config = gpt2_from_config,
    .dims_from_hf = gpt2_from_hf,
    .dims_to_hf = gpt2_to_hf,
    .dims_to_config = gpt2_to_config,
    .build_params = gpt2_build,
    .flops_per_token = gpt2_flops_per_token,
    .ops = &gpt2_ops,
};

zt_param_table_t *zt_arch_gpt2_table(int L, int NH, int C, int V, int maxT, float init_std)
{
    zt_model_dims_t d;
    zt_model_dims_default(&d);
    d.L = L, d.NH = d.NKV = NH, d.C = C, d.HD = C / NH, d.I = 4 * C, d.V = V, d.maxT = maxT;
    d.tied = d.qkv_bias = d.o_bias = 1;
    return zt_arch_build_table(&zt_arch_gpt2, &d, init_std);
}
