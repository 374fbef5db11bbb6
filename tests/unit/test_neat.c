/* test_neat.c — neat packing in the model (zt_model_set_segments): a batch of packed
 * rows gives every packed sample the logits, the loss and the gradients it gets as a
 * row of its own, for each family's way of placing tokens: GPT-2's learned positions,
 * llama's rotary positions with grouped-query attention, qwen3's q/k norms before the
 * rotation. fp32 on the CPU backend, random weights (init_std 0.3, so that attention
 * is far from uniform and a sample that saw another would show it).
 *
 * The packed and the one-by-one runs compute the same sums; they differ only in how
 * the kernels block them: the packed row's attention query blocks start at other rows
 * (the softmax and P V sums of a query add the same nonzero terms in another order,
 * the other segments' keys being exact zeros), and a weight gradient sums the tokens
 * of all samples in one GEMM instead of sample by sample. Everything else (norms, MLP,
 * head, cross-entropy) is row by row and bit-identical. So the bounds are rounding
 * bounds: a reordered sum of n terms in fp32 moves by at most (n - 1) u times the sum
 * of its terms' magnitudes (u = 2^-24); with n <= the tokens of the batch N and
 * magnitudes of the order of the result at this scale, and L blocks each passing on
 * their inputs' differences amplified by at most a modest factor, 4 L N u bounds the
 * relative errors of the logits, the losses and the gradients (values in the table).
 * A negative control runs the packed batch without segments: its errors are orders of
 * magnitude above the bounds, so the comparison has teeth. */
#include "model_rig.h"
#include "zt_arch.h"

/* The batch: 2 rows of T = 32 tokens; row 0 packs samples of 9, 1 and 13 tokens and 9
 * tokens of padding (segment 0, position 0, as LLaMA-Factory pads), row 1 samples of
 * 20 and 12 tokens (full). Targets are random, some -1 (prompts), and the last token of
 * every sample has none (the trainer drops the target that would cross into the next
 * sample). */
enum { B = 2, T = 32, NS = 5 };
static const int lens[NS] = {9, 1, 13, 20, 12};
static const int rows[NS] = {0, 0, 0, 1, 1};

typedef struct {
    int32_t inp[B * T], tgt[B * T], seg[B * T], pos[B * T];
    int start[NS]; /* first token of sample i in its row */
} batch_t;

static batch_t make_batch(int V, uint64_t seed)
{
    batch_t b;
    uint64_t s = seed;
    for (int i = 0; i < B * T; i++) {
        b.inp[i] = (int32_t)(lcg(&s) % (uint64_t)V);
        b.tgt[i] = -1;
        b.seg[i] = 0;
        b.pos[i] = 0;
    }
    int fill[B] = {0, 0};
    for (int i = 0; i < NS; i++) {
        const int r = rows[i];
        b.start[i] = fill[r];
        for (int k = 0; k < lens[i]; k++) {
            const int t = r * T + fill[r] + k;
            b.seg[t] = i + 1;
            b.pos[t] = k;
            const int prompt = k < lens[i] / 3; /* the first third carries no loss */
            b.tgt[t] = k + 1 < lens[i] && !prompt ? (int32_t)(lcg(&s) % (uint64_t)V) : -1;
        }
        fill[r] += lens[i];
    }
    return b;
}

static long loss_tokens(const batch_t *b)
{
    long n = 0;
    for (int i = 0; i < B * T; i++) n += b->tgt[i] >= 0;
    return n;
}

/* Host copies of every gradient tensor */
static float **grads(const rig_t *r)
{
    float **g = zt_calloc((size_t)r->tab->nparams, sizeof *g);
    for (int i = 0; i < r->tab->nparams; i++) g[i] = to_host(r, pg(r, i), i);
    return g;
}

static void free_grads(const rig_t *r, float **g)
{
    for (int i = 0; i < r->tab->nparams; i++) free(g[i]);
    free(g);
}

/* Worst relative L2 difference of two gradient sets over the tensors; *name: its tensor */
static double worst_grads(const rig_t *r, float **a, float **b, const char **name)
{
    double w = 0;
    *name = "?";
    for (int i = 0; i < r->tab->nparams; i++) {
        const double e = rel_l2(a[i], b[i], r->tab->params[i].numel);
        if (!(e <= w)) w = isnan(e) ? INFINITY : e, *name = r->tab->params[i].name;
    }
    return w;
}

/* max |a - b| / max |b| */
static double rel_max(const float *a, const float *b, size_t n)
{
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        const double x = fabs((double)a[i] - b[i]);
        d = x > d || x != x ? (x != x ? INFINITY : x) : d;
        m = fmax(m, fabs((double)b[i]));
    }
    return d / m;
}

typedef struct { double logits, loss, grads; } errs_t;

/* Runs the packed batch (with seg and pos, or plain when packed = 0) against the
 * samples one by one; returns the worst relative errors of logits, per-sample losses
 * and gradients. */
static errs_t compare(rig_t *r, const batch_t *bt, int packed, const char **gname)
{
    const int V = r->tab->dims.V;
    const int32_t *seg = packed ? bt->seg : NULL, *pos = packed ? bt->pos : NULL;
    const float dscale = 1.0f / (float)loss_tokens(bt);
    errs_t e = {0, 0, 0};
    float *lp = zt_malloc((size_t)V * sizeof *lp), *la = zt_malloc((size_t)V * sizeof *la);
    /* logits and per-sample losses: the packed forward with one sample's targets at a time */
    for (int i = 0; i < NS; i++) {
        int32_t tgt[B * T];
        for (int k = 0; k < B * T; k++) tgt[k] = bt->seg[k] == i + 1 ? bt->tgt[k] : -1;
        rig_blocks_forward_packed(r, bt->inp, tgt, seg, pos, B, T);
        zt_model_forward_head(r->m, r->w[r->tab->root_unit]);
        const double lsum_p = zt_model_loss_sum(r->m);
        float *lpk = zt_malloc((size_t)lens[i] * V * sizeof *lpk);
        for (int k = 0; k < lens[i]; k++) zt_model_logits_row(r->m, rows[i], bt->start[i] + k, lpk + (size_t)k * V);
        const int32_t *in1 = bt->inp + rows[i] * T + bt->start[i], *tg1 = bt->tgt + rows[i] * T + bt->start[i];
        rig_blocks_forward(r, in1, tg1, 1, lens[i]);
        zt_model_forward_head(r->m, r->w[r->tab->root_unit]);
        const double lsum_a = zt_model_loss_sum(r->m);
        for (int k = 0; k < lens[i]; k++) {
            zt_model_logits_row(r->m, 0, k, la);
            memcpy(lp, lpk + (size_t)k * V, (size_t)V * sizeof *lp);
            e.logits = fmax(e.logits, rel_max(lp, la, (size_t)V));
        }
        free(lpk);
        if (lsum_a != 0) e.loss = fmax(e.loss, fabs(lsum_p - lsum_a) / fabs(lsum_a));
    }
    /* gradients: one packed micro-step against the samples' micro-steps accumulated */
    rig_zero_grads(r);
    rig_micro_step_packed(r, bt->inp, bt->tgt, seg, pos, B, T, dscale);
    float **gp = grads(r);
    rig_zero_grads(r);
    for (int i = 0; i < NS; i++)
        rig_micro_step(r, bt->inp + rows[i] * T + bt->start[i], bt->tgt + rows[i] * T + bt->start[i], 1, lens[i],
                       dscale);
    float **ga = grads(r);
    e.grads = worst_grads(r, gp, ga, gname);
    free_grads(r, gp);
    free_grads(r, ga);
    free(lp);
    free(la);
    return e;
}

/* recompute: train.gradient_checkpointing (the backward re-runs each block's forward
 * with the batch's segments) */
static void run(const char *what, const zt_arch_t *a, zt_model_dims_t d, int recompute)
{
    rig_t r = rig_create_table(zt_arch_build_table(a, &d, 0.3f), B, T, recompute);
    rig_init(&r, 11);
    const batch_t bt = make_batch(d.V, 5);
    const char *gname, *gname0;
    const errs_t e = compare(&r, &bt, 1, &gname);
    const errs_t c = compare(&r, &bt, 0, &gname0); /* negative control: no segments */
    const double bound = 4.0 * d.L * B * T * 0x1p-24;
    printf("\n    %-15s packed vs one by one: logits %.1e loss %.1e grads %.1e (%s); bound %.1e; "
           "without segments %.1e %.1e %.1e",
           what, e.logits, e.loss, e.grads, gname, bound, c.logits, c.loss, c.grads);
    CU_ASSERT(e.logits <= bound);
    CU_ASSERT(e.loss <= bound);
    CU_ASSERT(e.grads <= bound);
    CU_ASSERT(c.logits > 100 * bound && c.loss > 100 * bound && c.grads > 100 * bound);
    rig_free(&r);
}

static zt_model_dims_t dims(int NH, int NKV, int C, int HD)
{
    zt_model_dims_t d;
    zt_model_dims_default(&d);
    d.L = 2, d.NH = NH, d.NKV = NKV, d.C = C, d.HD = HD, d.I = 3 * C / 2, d.V = 29, d.maxT = T;
    return d;
}

static void t_gpt2(void)
{
    zt_model_dims_t d = dims(2, 2, 16, 8);
    d.I = 4 * d.C;
    d.tied = d.qkv_bias = d.o_bias = 1;
    run("gpt2", zt_arch_get("gpt2"), d, 0);
}

static void t_llama(void)
{
    zt_model_dims_t d = dims(4, 2, 16, 6); /* GQA, head_dim free of C / NH */
    run("llama", zt_arch_get("llama"), d, 0);
    run("llama+recompute", zt_arch_get("llama"), d, 1);
}

static void t_qwen3(void)
{
    zt_model_dims_t d = dims(4, 1, 16, 8);
    d.qk_norm = 1;
    run("qwen3", zt_arch_get("qwen3"), d, 0);
}

/* Without zt_model_set_segments after zt_model_set_batch a batch is plain: segments
 * set for one batch do not leak into the next (bitwise the same as a fresh model). */
static void t_reset(void)
{
    zt_model_dims_t d = dims(4, 2, 16, 6);
    rig_t r = rig_create_table(zt_arch_build_table(zt_arch_get("llama"), &d, 0.3f), B, T, 0);
    rig_init(&r, 3);
    const batch_t bt = make_batch(d.V, 9);
    float *x = zt_malloc((size_t)d.V * sizeof *x), *y = zt_malloc((size_t)d.V * sizeof *y);
    const float l0 = rig_forward(&r, bt.inp, bt.tgt, B, T);
    zt_model_logits_row(r.m, 1, T - 1, x);
    rig_blocks_forward_packed(&r, bt.inp, bt.tgt, bt.seg, bt.pos, B, T);
    zt_model_forward_head(r.m, r.w[r.tab->root_unit]);
    const float lp = zt_model_loss(r.m);
    const float l1 = rig_forward(&r, bt.inp, bt.tgt, B, T);
    zt_model_logits_row(r.m, 1, T - 1, y);
    CU_ASSERT(l0 == l1 && memcmp(x, y, (size_t)d.V * sizeof *x) == 0);
    CU_ASSERT(lp != l0); /* the packed pass did differ */
    free(x);
    free(y);
    rig_free(&r);
}

static const zt_test_t tests[] = {
    {"gpt2: packed samples = one by one (learned positions)", t_gpt2},
    {"llama: packed samples = one by one (rope, GQA; and with recompute)", t_llama},
    {"qwen3: packed samples = one by one (q/k norm, MQA)", t_qwen3},
    {"set_batch resets the segments", t_reset},
    {NULL, NULL},
};

ZT_TEST_MAIN("test_neat", tests)
