/* bench_gpu.c — where a GPT-2 training step's time goes, kernel by kernel.
 *
 * Part 1 times every backend kernel one training step calls (zt_model.c's
 * forward and backward, the shard engine's gradient zeroing, norm and AdamW,
 * and with bf16 training the working copy's conversions) at the step's shapes,
 * multiplies each by its calls per step and sums them: a kernel-only step time,
 * tokens/s and MFU, per matmul precision. What it leaves out is host time
 * between kernels, communication and the data pipeline, so the gap to a real
 * step (gpu-check's bench rows) is that overhead.
 * Part 2 (CUDA only) times the same GEMMs straight on cuBLASLt with fp32
 * operands under the three compute types the backend offers and with native
 * bf16 operands (fp32 or bf16 output), and the backend's to_bf16 of the fp32
 * activation operands: what bf16 activation buffers would save.
 *
 *   bench_gpu [--backend cuda|cpu] [-B 8] [-T 1024] [-C 768] [--NH 12] [-V 50257] [-L 12]
 *             [--warmup 3] [--reps 15] [--precision highest,medium,high] [--no-gemm-table]
 *             [--peak-tflops 989] [--peak-fp32 67]
 *
 * Timing: CUDA events on the backend's stream around each call, back to back
 * (no sync between repetitions, so host launch cost shows only where the host
 * is slower than the device), median of --reps after --warmup calls. On the CPU
 * backend a host clock does the same (small default shapes: a logic check, not
 * a benchmark). Exit 77 when the CUDA backend has no usable GPU. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_backend.h"
#include "zt_common.h"
#include "zt_arch.h"
#include "zt_model.h"
#include "zt_cuda.h"

#define BG_CUDA(call)                                                                         \
    do {                                                                                      \
        cudaError_t bg_rc_ = (call);                                                          \
        if (bg_rc_ != cudaSuccess)                                                            \
            zt_fatal("%s: %s (%s)", #call, cudaGetErrorString(bg_rc_), cudaGetErrorName(bg_rc_)); \
    } while (0)

#define BG_LT(call)                                                                           \
    do {                                                                                      \
        cublasStatus_t bg_st_ = (call);                                                       \
        if (bg_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
            zt_fatal("%s: cuBLASLt %s (%s)", #call, cublasLtGetStatusName(bg_st_),            \
                     cublasLtGetStatusString(bg_st_));                                        \
    } while (0)

#define MAX_REPS 200
#define MAX_ROWS 64

typedef struct {
    const char *backend;
    int B, T, C, NH, V, L;
    int warmup, reps;
    int levels[3], nlevels;
    int gemm_table;
    double peak, peak_fp32; /* TFLOP/s: dense bf16 and fp32 */
} opts_t;

/* One kernel of the step: per-call cost and how often a step calls it. */
typedef struct {
    char name[40], shape[64];
    double ms;          /* median per call */
    double flops;       /* per call, executed (causal attention: the half that is computed) */
    double flops_model; /* per call, as zt_model_flops_per_token counts them */
    double bytes;       /* per call, the least memory traffic it must do (memory-bound kernels) */
    double calls;       /* per training step */
} row_t;

static const zt_backend_t *be;
static opts_t g_o;
static int g_cuda;
static cudaStream_t g_stream;
static cudaEvent_t g_ev[MAX_REPS + 1];
static double g_host_t[MAX_REPS + 1];
static row_t g_rows[MAX_ROWS];
static int g_nrows;

/* ---- timing ----------------------------------------------------------------- */

static void mark(int i)
{
    if (g_cuda) {
        BG_CUDA(cudaEventRecord(g_ev[i], g_stream));
    } else {
        be->sync();
        g_host_t[i] = zt_now();
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the intervals between marks 0..n, in ms. */
static double median_ms(int n)
{
    double d[MAX_REPS];
    if (g_cuda) BG_CUDA(cudaEventSynchronize(g_ev[n]));
    for (int i = 0; i < n; i++) {
        if (g_cuda) {
            float ms = 0.0f;
            BG_CUDA(cudaEventElapsedTime(&ms, g_ev[i], g_ev[i + 1]));
            d[i] = ms;
        } else {
            d[i] = 1e3 * (g_host_t[i + 1] - g_host_t[i]);
        }
    }
    qsort(d, n, sizeof *d, cmp_double);
    return n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
}

/* warm-up calls, then one mark before each repetition and one after the last */
#define TIME_MS(out, stmt)                                          \
    do {                                                            \
        for (int w_ = 0; w_ < g_o.warmup; w_++) { stmt; }           \
        for (int r_ = 0; r_ < g_o.reps; r_++) { mark(r_); stmt; }   \
        mark(g_o.reps);                                             \
        (out) = median_ms(g_o.reps);                                \
    } while (0)

/* ---- buffers ---------------------------------------------------------------- */

static uint32_t g_rng = 12345u;

/* Backend buffer of n floats in [-amp/2, amp/2): one random block uploaded, then
 * doubled by device copies (random-looking data without a host array of n). */
static float *rnd(size_t n, float amp)
{
    float *p = be->alloc(n * sizeof(float));
    size_t blk = n < ((size_t)1 << 20) ? n : ((size_t)1 << 20);
    float *h = zt_malloc(blk * sizeof(float));
    for (size_t i = 0; i < blk; i++) {
        g_rng = g_rng * 1664525u + 1013904223u;
        h[i] = amp * ((float)(g_rng >> 8) / 16777216.0f - 0.5f);
    }
    be->from_host(p, h, blk * sizeof(float));
    free(h);
    for (size_t k = blk; k < n; k *= 2) be->copy(p + k, p, (n - k < k ? n - k : k) * sizeof(float));
    return p;
}

static int32_t *tokens(size_t n, int V)
{
    int32_t *h = zt_malloc(n * sizeof(int32_t)), *d = be->alloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        g_rng = g_rng * 1664525u + 1013904223u;
        h[i] = (int32_t)((g_rng >> 8) % (uint32_t)V);
    }
    be->from_host(d, h, n * sizeof(int32_t));
    free(h);
    return d;
}

/* ---- part 1: the kernels of a step ---------------------------------------------- */

static const char *level_name(int l)
{
    return l == ZT_MATMUL_MEDIUM ? "medium" : l == ZT_MATMUL_HIGH ? "high" : "highest";
}

static row_t *add_row(const char *name, const char *shape, double ms, double flops,
                      double flops_model, double bytes, double calls)
{
    if (g_nrows == MAX_ROWS) zt_fatal("bench_gpu: more than %d kernel rows", MAX_ROWS);
    row_t *r = &g_rows[g_nrows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    r->ms = ms, r->flops = flops, r->flops_model = flops_model, r->bytes = bytes, r->calls = calls;
    if (flops > 0)
        printf("%-24s %-24s %9.4f %8.3g TFLOP/s %8.0f %10.3f\n", name, shape, ms,
               flops / (ms * 1e9), calls, ms * calls);
    else
        printf("%-24s %-24s %9.4f %8.1f GB/s    %8.0f %10.3f\n", name, shape, ms,
               bytes / (ms * 1e6), calls, ms * calls);
    fflush(stdout);
    return r;
}

static int by_step_ms(const void *a, const void *b)
{
    const row_t *x = a, *y = b;
    return cmp_double(&(double){y->ms * y->calls}, &(double){x->ms * x->calls});
}

typedef struct {
    const char *name;
    int K, OC, transw, bias; /* inp (M,K) @ W -> (M,OC) */
    double calls;            /* per step */
    int M;                   /* rows: N = B*T, or the head's chunk for lm_head */
} gemm_shape_t;

static int gemm_shapes(const opts_t *o, gemm_shape_t *s)
{
    const int C = o->C, N = o->B * o->T;
    /* the model runs the head in chunks of head_rows tokens (zt_model.c): N / head_rows
     * calls of that size (the last chunk may be smaller: same FLOPs in all) */
    zt_model_dims_t d;
    zt_model_dims_default(&d);
    d.V = o->V;
    const int hr = zt_model_head_rows(d, N);
    s[0] = (gemm_shape_t){"qkv", C, 3 * C, 0, 1, o->L, N};
    s[1] = (gemm_shape_t){"attproj", C, C, 0, 1, o->L, N};
    s[2] = (gemm_shape_t){"fc", C, 4 * C, 0, 1, o->L, N};
    s[3] = (gemm_shape_t){"fcproj", 4 * C, C, 0, 1, o->L, N};
    s[4] = (gemm_shape_t){"lm_head", C, o->V, 1, 0, (double)N / hr, hr};
    return 5;
}

/* Times every kernel at matmul precision `level`; returns the kernel-only step in ms. */
static double bench_step(int level)
{
    const opts_t *o = &g_o;
    const int B = o->B, T = o->T, C = o->C, NH = o->NH, V = o->V, L = o->L, N = B * T;
    const size_t NC = (size_t)N * C;
    const size_t F = sizeof(float);
    const int bf16 = level == ZT_MATMUL_MEDIUM; /* train.bf16 = true picks medium ("auto") */
    char sh[64];
    zt_param_table_t *pt = zt_arch_gpt2_table(L, NH, C, V, T, 0.02f);
    const size_t P = pt->total_numel, Proot = pt->unit_numel[0];
    const size_t Pblk = pt->nunits > 1 ? pt->unit_numel[1] : 0;

    be->set_matmul_precision(level);
    g_nrows = 0;
    printf("\n== kernels at matmul precision %s%s: B=%d T=%d C=%d NH=%d V=%d L=%d, %zu params, "
           "median of %d after %d warm-up\n", level_name(level),
           bf16 ? " (bf16 training: + the bf16 working copy's conversions)" : "", B, T, C, NH, V,
           L, P, o->reps, o->warmup);
    printf("%-24s %-24s %9s %16s %8s %10s\n", "kernel", "shape", "ms/call", "rate", "calls",
           "ms/step");

    int32_t *inp = tokens(N, V), *tgt = tokens(N, V);
    float *wte = rnd((size_t)V * C, 0.04f), *wpe = rnd((size_t)T * C, 0.04f);
    float *dwte = be->alloc((size_t)V * C * F), *dwpe = be->alloc((size_t)T * C * F);
    float *x = rnd(NC, 2.0f), *y = be->alloc(NC * F), *dy = rnd(NC, 1.0f), *dx = be->alloc(NC * F);
    float *lnw = rnd(C, 1.0f), *lnb = rnd(C, 0.2f), *dlnw = be->alloc(C * F), *dlnb = be->alloc(C * F);
    float *mean = be->alloc(N * F), *rstd = be->alloc(N * F);
    double ms;

    /* embedding: reads wte rows, writes (N,C); backward scatters dout into dwte rows.
     * positional: out += wpe[t] (read-modify-write of (N,C)); backward sums over b */
    snprintf(sh, sizeof sh, "(%d,%d,%d)", B, T, C);
    TIME_MS(ms, be->embedding_forward(x, inp, wte, N, C));
    add_row("embedding_fwd", sh, ms, 0, 0, F * 2.0 * NC + 4.0 * N, 1);
    TIME_MS(ms, be->positional_forward(x, wpe, NULL, B, T, C));
    add_row("positional_fwd", sh, ms, 0, 0, F * (2.0 * NC + (double)T * C), 1);
    TIME_MS(ms, be->embedding_backward(dwte, dy, inp, N, C));
    add_row("embedding_bwd", sh, ms, 0, 0, F * 3.0 * NC + 4.0 * N, 1);
    TIME_MS(ms, be->positional_backward(dwpe, dy, NULL, B, T, C));
    add_row("positional_bwd", sh, ms, 0, 0, F * (NC + 2.0 * T * C), 1);

    /* layernorm: ln1, ln2 per block and lnf */
    snprintf(sh, sizeof sh, "(%d,%d)", N, C);
    TIME_MS(ms, be->layernorm_forward(y, mean, rstd, x, lnw, lnb, N, C, 1e-5f));
    add_row("layernorm_fwd", sh, ms, 0, 0, F * (2.0 * NC + 2.0 * N + 2.0 * C), 2.0 * L + 1);
    TIME_MS(ms, be->layernorm_backward(dx, dlnw, dlnb, dy, x, lnw, mean, rstd, N, C));
    add_row("layernorm_bwd", sh, ms, 0, 0, F * (4.0 * NC + 2.0 * N + 5.0 * C), 2.0 * L + 1);

    /* residual (two per block) */
    TIME_MS(ms, be->residual_forward(y, x, dy, NC));
    add_row("residual", sh, ms, 0, 0, F * 3.0 * NC, 2.0 * L);
    be->free(y), be->free(dx), be->free(dy), be->free(x);

    /* matmuls: bias added in forward, column-summed in backward, both inside the kernel */
    gemm_shape_t gs[5];
    int ngs = gemm_shapes(o, gs);
    float *logits = NULL;
    for (int i = 0; i < ngs; i++) {
        const gemm_shape_t *g = &gs[i];
        const size_t wn = (size_t)g->K * g->OC;
        const int M = g->M;
        float *a = rnd((size_t)M * g->K, 2.0f), *out = rnd((size_t)M * g->OC, 1.0f);
        float *w = g->transw ? wte : rnd(wn, 0.04f), *bias = g->bias ? rnd(g->OC, 0.2f) : NULL;
        float *da = be->alloc((size_t)M * g->K * F), *dw = g->transw ? dwte : be->alloc(wn * F);
        float *db = g->bias ? be->alloc(g->OC * F) : NULL;
        const double fl = 2.0 * M * g->K * g->OC;
        char nm[40];
        if (g->transw) snprintf(sh, sizeof sh, "%dx%d @ (%dx%d)^T", M, g->K, g->OC, g->K);
        else snprintf(sh, sizeof sh, "%dx%d @ %dx%d", M, g->K, g->K, g->OC);
        /* the model runs fc's forward with GELU and fcproj's backward with GELU's
         * backward as one operation each (the GEMM's epilogue on the GPU below fp32):
         * those rows count in the step, the plain GEMM is printed beside them */
        const int fc = strcmp(g->name, "fc") == 0, fcproj = strcmp(g->name, "fcproj") == 0;
        snprintf(nm, sizeof nm, "matmul_fwd %s", g->name);
        TIME_MS(ms, be->matmul_forward(out, a, w, bias, M, g->K, g->OC, g->transw));
        add_row(nm, sh, ms, fl, fl, 0, fc ? 0 : g->calls);
        if (fc) {
            float *pre = be->alloc((size_t)M * g->OC * F);
            TIME_MS(ms, be->matmul_gelu_forward(out, pre, a, w, bias, M, g->K, g->OC));
            add_row("matmul_gelu_fwd fc", sh, ms, fl, fl, 0, g->calls);
            be->free(pre);
        }
        if (g->transw) { /* the head's logits feed the cross-entropy next */
            logits = out;
            be->free(a), be->free(da);
            break;
        }
        snprintf(nm, sizeof nm, "matmul_bwd %s", g->name);
        TIME_MS(ms, be->matmul_backward(da, dw, db, out, a, w, M, g->K, g->OC, g->transw));
        add_row(nm, sh, ms, 2 * fl, 2 * fl, 0, fcproj ? 0 : g->calls);
        if (fcproj) {
            float *pre = rnd((size_t)M * g->K, 6.0f);
            TIME_MS(ms, be->gelu_matmul_backward(da, dw, db, out, a, pre, w, M, g->K, g->OC));
            add_row("gelu_matmul_bwd fcproj", sh, ms, 2 * fl, 2 * fl, 0, g->calls);
            be->free(pre);
        }
        float *bufs[] = {a, out, w, bias, da, dw, db};
        for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) be->free(bufs[k]);
    }

    /* per head chunk: cross-entropy over its logits, in place into dlogits, then the
     * head's backward */
    const gemm_shape_t *hg = &gs[ngs - 1];
    const int HM = hg->M;
    float *losses = be->alloc(HM * F);
    snprintf(sh, sizeof sh, "(%d,%d)", HM, V);
    TIME_MS(ms, be->crossentropy_fused(logits, losses, tgt, HM, V, 1.0f / N));
    add_row("crossentropy_fused", sh, ms, 0, 0, F * (2.0 * HM * V + 2.0 * HM), hg->calls);
    {
        const gemm_shape_t *g = hg;
        float *a = rnd((size_t)HM * g->K, 2.0f), *da = be->alloc((size_t)HM * g->K * F);
        const double fl = 2.0 * HM * g->K * g->OC;
        snprintf(sh, sizeof sh, "%dx%d @ (%dx%d)^T", HM, g->K, g->OC, g->K);
        TIME_MS(ms, be->matmul_backward(da, dwte, NULL, logits, a, wte, HM, g->K, g->OC, 1));
        add_row("matmul_bwd lm_head", sh, ms, 2 * fl, 2 * fl, 0, g->calls);
        be->free(a), be->free(da);
    }
    be->free(logits), be->free(losses);

    /* attention: FLOPs of QK^T and PV (forward), twice that (backward); the model counts
     * the full T x T (zt_model_flops_per_token), the causal kernels compute the
     * T (T+1) / 2 visible pairs; the backward's recomputation of the scores is not counted */
    {
        float *qkv = rnd(3 * NC, 2.0f), *ao = be->alloc(NC * F), *lse = be->alloc((size_t)B * NH * T * F);
        float *dqkv = be->alloc(3 * NC * F), *dao = rnd(NC, 1.0f);
        const double full = 4.0 * B * (double)T * T * C, causal = full * (T + 1.0) / (2.0 * T);
        snprintf(sh, sizeof sh, "B%d T%d NH%d hs%d", B, T, NH, C / NH);
        TIME_MS(ms, be->attention_forward(ao, lse, qkv, NULL, B, T, NH, NH, C / NH, 0));
        add_row("attention_fwd", sh, ms, causal, full, 0, L);
        TIME_MS(ms, be->attention_backward(dqkv, dao, qkv, ao, lse, NULL, B, T, NH, NH, C / NH, 0));
        add_row("attention_bwd", sh, ms, 2 * causal, 2 * full, 0, L);
        be->free(qkv), be->free(ao), be->free(lse), be->free(dqkv), be->free(dao);
    }

    /* gelu over (N,4C), backward overwriting dinp: what the fused rows save or
     * contain (no calls of their own in the step) */
    {
        const size_t n = 4 * NC;
        float *gi = rnd(n, 6.0f), *go = be->alloc(n * F), *gd = rnd(n, 1.0f);
        snprintf(sh, sizeof sh, "(%d,%d)", N, 4 * C);
        TIME_MS(ms, be->gelu_forward(go, gi, n));
        add_row("gelu_fwd", sh, ms, 0, 0, F * 2.0 * n, 0);
        TIME_MS(ms, be->gelu_backward(go, gi, gd, n));
        add_row("gelu_bwd", sh, ms, 0, 0, F * 3.0 * n, 0);

        /* the backward's scratch zeroing (zt_model_backward_block: dqkv (N,3C) per block,
         * for attention's accumulating backward; dres (N,C) in the head) */
        snprintf(sh, sizeof sh, "(%d,%d)", N, 3 * C);
        TIME_MS(ms, be->memzero(go, 3 * NC * F));
        add_row("memzero", sh, ms, 0, 0, F * 3.0 * NC, L);
        snprintf(sh, sizeof sh, "(%d,%d)", N, C);
        TIME_MS(ms, be->memzero(go, NC * F));
        add_row("memzero", sh, ms, 0, 0, F * NC, 1);
        be->free(gi), be->free(go), be->free(gd);
    }
    be->free(inp), be->free(tgt), be->free(wpe), be->free(dwpe), be->free(lnw), be->free(lnb);
    be->free(dlnw), be->free(dlnb), be->free(mean), be->free(rstd), be->free(wte), be->free(dwte);

    /* the optimizer side (zt_shard.c): gradients zeroed, their norm per unit (each sumsq
     * reads its result back: a sync), AdamW over every parameter */
    {
        float *p = rnd(P, 0.04f), *g = rnd(P, 0.01f), *m = be->alloc(P * F), *v = be->alloc(P * F);
        uint16_t *p16 = be->alloc(P * 2);
        long step = 1;
        snprintf(sh, sizeof sh, "%zu", P);
        TIME_MS(ms, be->memzero(g, P * F));
        add_row("memzero grads", sh, ms, 0, 0, F * P, 1);
        be->copy(g, p, P * F);
        TIME_MS(ms, be->adamw(p, g, m, v, P, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step++));
        add_row("adamw", sh, ms, 0, 0, F * 7.0 * P, 1);
        if (Pblk > 0) {
            snprintf(sh, sizeof sh, "%zu (block)", Pblk);
            TIME_MS(ms, (void)be->sumsq(g, Pblk));
            add_row("sumsq", sh, ms, 0, 0, F * Pblk, L);
        }
        snprintf(sh, sizeof sh, "%zu (root)", Proot);
        TIME_MS(ms, (void)be->sumsq(g, Proot));
        add_row("sumsq", sh, ms, 0, 0, F * Proot, 1);
        /* bf16 training: AdamW re-rounds the working copy, and each unit is widened to
         * fp32 where the model needs it (every block twice but the last, the root once) */
        snprintf(sh, sizeof sh, "%zu", P);
        TIME_MS(ms, be->to_bf16(p16, p, P));
        add_row("to_bf16", sh, ms, 0, 0, 6.0 * P, bf16 ? 1 : 0);
        if (Pblk > 0) {
            snprintf(sh, sizeof sh, "%zu (block)", Pblk);
            TIME_MS(ms, be->from_bf16(p, p16, Pblk));
            add_row("from_bf16", sh, ms, 0, 0, 6.0 * Pblk, bf16 ? 2.0 * L - 1 : 0);
        }
        snprintf(sh, sizeof sh, "%zu (root)", Proot);
        TIME_MS(ms, be->from_bf16(p, p16, Proot));
        add_row("from_bf16", sh, ms, 0, 0, 6.0 * Proot, bf16 ? 1 : 0);
        be->free(p), be->free(g), be->free(m), be->free(v), be->free(p16);
    }
    be->sync();

    /* the step: every row times its calls */
    double step = 0, fl_model = 0, fl_exec = 0;
    for (int i = 0; i < g_nrows; i++) {
        step += g_rows[i].ms * g_rows[i].calls;
        fl_model += g_rows[i].flops_model * g_rows[i].calls;
        fl_exec += g_rows[i].flops * g_rows[i].calls;
    }
    qsort(g_rows, g_nrows, sizeof *g_rows, by_step_ms);
    printf("-- share of the kernel-only step (%s), largest first\n", level_name(level));
    double cum = 0;
    for (int i = 0; i < g_nrows; i++) {
        const row_t *r = &g_rows[i];
        if (r->calls == 0) continue;
        cum += r->ms * r->calls;
        printf("  %-24s %-24s %10.3f ms %5.1f%%  (cum. %5.1f%%)\n", r->name, r->shape,
               r->ms * r->calls, 100 * r->ms * r->calls / step, 100 * cum / step);
    }
    const double tok = (double)N, fpt = zt_model_flops_per_token(pt, T);
    const double tps = tok / (step * 1e-3), mine = fl_model / tok;
    const double rel = fabs(mine - fpt) / fpt;
    printf("FLOPs per token: %.6g from the rows (GEMMs + attention at full T x T) vs %.6g "
           "zt_model_flops_per_token: %s (rel. %.1e); causal, as executed: %.6g (%.3f of it)\n",
           mine, fpt, rel <= 1e-9 ? "match" : "MISMATCH", rel, fl_exec / tok, fl_exec / fl_model);
    printf("kernel-only step (%s): %.3f ms, %.0f tokens/s, %.3g TFLOP/s (model FLOPs)", level_name(level),
           step, tps, fl_model / (step * 1e9));
    if (o->peak > 0) printf(", MFU %.1f%% of %.0f (bf16 peak)", 100 * tps * fpt / (o->peak * 1e12), o->peak);
    if (o->peak_fp32 > 0 && level == ZT_MATMUL_HIGHEST)
        printf(", %.1f%% of %.0f (fp32 peak)", 100 * tps * fpt / (o->peak_fp32 * 1e12), o->peak_fp32);
    printf("\n");
    /* one line for scripts (gpu-check.sh's summary) */
    printf("bench_gpu: precision=%s step_ms=%.3f tokens_per_s=%.0f mfu=%.4f top=", level_name(level),
           step, tps, o->peak > 0 ? tps * fpt / (o->peak * 1e12) : 0.0);
    for (int i = 0; i < 3 && i < g_nrows; i++) {
        char nm[40];
        memcpy(nm, g_rows[i].name, sizeof nm); /* same size, NUL-terminated by add_row */
        for (char *c = nm; *c; c++)
            if (*c == ' ') *c = '_';
        printf("%s%s:%.0f%%", i ? "," : "", nm, 100 * g_rows[i].ms * g_rows[i].calls / step);
    }
    printf("\n");
    fflush(stdout);
    zt_param_table_free(pt);
    if (rel > 1e-9) zt_fatal("bench_gpu: the rows' FLOPs disagree with zt_model_flops_per_token");
    return step;
}

/* ---- part 2: the GEMMs on cuBLASLt, by operand type -------------------------------- */

typedef struct {
    const char *name;
    cudaDataType_t ab, d;
    cublasComputeType_t compute;
} variant_t;

static const variant_t g_variants[] = {
    {"f32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
    {"tf32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32},
    {"f32>bf16", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF},
    {"bf16>f32", CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
    {"bf16>bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
};
#define NVAR ((int)(sizeof g_variants / sizeof *g_variants))

static cublasLtHandle_t g_lt;
static void *g_ws;
static const size_t g_ws_bytes = (size_t)32 << 20;

/* Row-major C (M,Nn) = op(A) (M,K) op(B) (K,Nn) + beta C as the backend's gemm_rm:
 * column-major C^T = op(B)^T op(A)^T, operands swapped, transposes kept. Returns
 * the median ms, or -1 when cuBLASLt has no algorithm for the combination. */
static double lt_time(const variant_t *v, int ta, int tb, int M, int Nn, int K, const void *A,
                      const void *Bm, void *Cm, float beta)
{
    const int m = Nn, n = M, k = K, lda = ta ? M : K, ldb = tb ? K : Nn; /* column-major view */
    const int cta = tb, ctb = ta;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasOperation_t opa = cta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ctb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BG_LT(cublasLtMatmulDescCreate(&op, v->compute, CUDA_R_32F));
    BG_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    BG_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    BG_LT(cublasLtMatrixLayoutCreate(&la, v->ab, cta ? k : m, cta ? m : k, ldb));
    BG_LT(cublasLtMatrixLayoutCreate(&lb, v->ab, ctb ? n : k, ctb ? k : n, lda));
    BG_LT(cublasLtMatrixLayoutCreate(&lc, v->d, m, n, m));
    cublasLtMatmulPreference_t pref;
    BG_LT(cublasLtMatmulPreferenceCreate(&pref));
    BG_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &g_ws_bytes, sizeof g_ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g_lt, op, la, lb, lc, lc, pref, 1, &res, &found);
    /* NOT_SUPPORTED, or INVALID_VALUE for a type combination this cuBLASLt rejects
     * (bf16 operands with an odd leading dimension): a "no algorithm" cell, not an abort */
    if (hs != CUBLAS_STATUS_NOT_SUPPORTED && hs != CUBLAS_STATUS_INVALID_VALUE) BG_LT(hs);
    double ms = -1;
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
        const float alpha = 1.0f;
        /* swapped: the column-major A is the row-major B */
        TIME_MS(ms, BG_LT(cublasLtMatmul(g_lt, op, &alpha, Bm, la, A, lb, &beta, Cm, lc, Cm, lc,
                                          &res.algo, g_ws, g_ws_bytes, g_stream)));
    }
    BG_LT(cublasLtMatmulPreferenceDestroy(pref));
    BG_LT(cublasLtMatrixLayoutDestroy(la));
    BG_LT(cublasLtMatrixLayoutDestroy(lb));
    BG_LT(cublasLtMatrixLayoutDestroy(lc));
    BG_LT(cublasLtMatmulDescDestroy(op));
    return ms;
}

/* fp32 buffer and its bf16 copy */
typedef struct {
    float *f;
    uint16_t *h;
    size_t n;
} opnd_t;

static opnd_t opnd(size_t n, float amp)
{
    opnd_t o = {rnd(n, amp), be->alloc(n * 2), n};
    be->to_bf16(o.h, o.f, n);
    return o;
}

static void opnd_free(opnd_t *o)
{
    be->free(o->f), be->free(o->h);
}

static const void *as(const opnd_t *o, cudaDataType_t t)
{
    return t == CUDA_R_16BF ? (const void *)o->h : (const void *)o->f;
}

static void gemm_table(void)
{
    const opts_t *o = &g_o;
    gemm_shape_t gs[5];
    const int ngs = gemm_shapes(o, gs);
    double tot[NVAR] = {0}, tot_cvt = 0, ms;
    BG_LT(cublasLtCreate(&g_lt));
    BG_CUDA(cudaMalloc(&g_ws, g_ws_bytes));
    printf("\n== GEMMs on cuBLASLt, TFLOP/s (ms), by operands>output: f32 = COMPUTE_32F, tf32 = "
           "FAST_TF32, f32>bf16 = FAST_16BF (the backend's three), bf16>f32 and bf16>bf16 = bf16 "
           "operands, COMPUTE_32F; cvt = the backend's to_bf16 of the fp32 activation operands\n");
    printf("%-18s %-22s", "gemm", "M x N x K");
    for (int v = 0; v < NVAR; v++) printf(" %17s", g_variants[v].name);
    printf(" %9s %6s\n", "cvt ms", "calls");
    for (int i = 0; i < ngs; i++) {
        const gemm_shape_t *g = &gs[i];
        const size_t wn = (size_t)g->K * g->OC;
        const int N = g->M;
        opnd_t in = opnd((size_t)N * g->K, 2.0f), w = opnd(wn, 0.04f);
        opnd_t out = opnd((size_t)N * g->OC, 1.0f), din = opnd((size_t)N * g->K, 0);
        opnd_t dw = opnd(wn, 0);
        /* the backend's three: forward, dinp, dweight (matmul_forward / matmul_backward) */
        struct {
            const char *what;
            int ta, tb, M, Nn, K;
            opnd_t *A, *B, *D;
            float beta;
        } gm[3] = {
            {"fwd", 0, g->transw, N, g->OC, g->K, &in, &w, &out, 0.0f},
            {"dinp", 0, !g->transw, N, g->K, g->OC, &out, &w, &din, 0.0f},
            {"dweight", 1, 0, g->transw ? g->OC : g->K, g->transw ? g->K : g->OC, N,
             g->transw ? &out : &in, g->transw ? &in : &out, &dw, 1.0f},
        };
        for (int j = 0; j < 3; j++) {
            char nm[40], sh[64];
            snprintf(nm, sizeof nm, "%s %s", g->name, gm[j].what);
            snprintf(sh, sizeof sh, "%d x %d x %d", gm[j].M, gm[j].Nn, gm[j].K);
            printf("%-18s %-22s", nm, sh);
            fflush(stdout);
            const double fl = 2.0 * gm[j].M * gm[j].Nn * gm[j].K;
            for (int v = 0; v < NVAR; v++) {
                const variant_t *var = &g_variants[v];
                void *D = var->d == CUDA_R_16BF ? (void *)gm[j].D->h : (void *)gm[j].D->f;
                ms = lt_time(var, gm[j].ta, gm[j].tb, gm[j].M, gm[j].Nn, gm[j].K,
                             as(gm[j].A, var->ab), as(gm[j].B, var->ab), D, gm[j].beta);
                if (ms < 0) printf(" %17s", "no algorithm");
                else printf(" %7.1f (%7.3f)", fl / (ms * 1e9), ms);
                fflush(stdout);
                tot[v] += (ms < 0 ? NAN : ms) * g->calls;
            }
            /* the activation operands' rounding: in (N,K) and/or dout (N,OC); the weights
             * have a bf16 working copy already under bf16 training */
            double c1, c2 = 0;
            const opnd_t *act1 = j == 1 ? &out : &in;
            TIME_MS(c1, be->to_bf16(act1->h, act1->f, act1->n));
            if (j == 2) TIME_MS(c2, be->to_bf16(out.h, out.f, out.n));
            printf(" %9.3f %6.0f\n", c1 + c2, g->calls);
            tot_cvt += (c1 + c2) * g->calls;
        }
        opnd_free(&in), opnd_free(&w), opnd_free(&out), opnd_free(&din), opnd_free(&dw);
    }
    printf("%-41s", "per step (ms, x calls)");
    for (int v = 0; v < NVAR; v++) printf(" %17.3f", tot[v]);
    printf(" %9.3f\n", tot_cvt);
    printf("bench_gpu: gemm_step_ms f32=%.3f tf32=%.3f f32_fast16bf=%.3f bf16_f32out=%.3f "
           "bf16_bf16out=%.3f cvt=%.3f bf16_f32out+cvt=%.3f\n", tot[0], tot[1], tot[2], tot[3],
           tot[4], tot_cvt, tot[3] + tot_cvt);
    fflush(stdout);
    BG_CUDA(cudaFree(g_ws));
    BG_LT(cublasLtDestroy(g_lt));
}

/* ---- options ------------------------------------------------------------------ */

static void usage_fail(const char *msg, const char *arg)
{
    fprintf(stderr, "bench_gpu: %s%s%s (--help for usage)\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static int pos_int(const char *s, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 1 || v > 1000000000L) usage_fail(what, s);
    return (int)v;
}

static void parse(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        {"backend", 1, 0, 'b'}, {"NH", 1, 0, 'H'}, {"warmup", 1, 0, 'w'}, {"reps", 1, 0, 'r'},
        {"precision", 1, 0, 'p'}, {"no-gemm-table", 0, 0, 'n'}, {"peak-tflops", 1, 0, 'P'},
        {"peak-fp32", 1, 0, 'F'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int B = 0, T = 0, C = 0, NH = 0, V = 0, L = 0, warm = -1, reps = 0, c;
    const char *prec = NULL;
    double peak = -1, peak32 = -1;
    o->backend = "cuda";
    o->gemm_table = 1;
    opterr = 0; /* one line of ours instead of getopt's */
    while ((c = getopt_long(argc, argv, ":B:T:C:V:L:h", lo, NULL)) != -1) {
        switch (c) {
        case 'b': o->backend = optarg; break;
        case 'B': B = pos_int(optarg, "bad -B"); break;
        case 'T': T = pos_int(optarg, "bad -T"); break;
        case 'C': C = pos_int(optarg, "bad -C"); break;
        case 'H': NH = pos_int(optarg, "bad --NH"); break;
        case 'V': V = pos_int(optarg, "bad -V"); break;
        case 'L': L = pos_int(optarg, "bad -L"); break;
        case 'w': warm = strcmp(optarg, "0") ? pos_int(optarg, "bad --warmup") : 0; break;
        case 'r': reps = pos_int(optarg, "bad --reps"); break;
        case 'p': prec = optarg; break;
        case 'n': o->gemm_table = 0; break;
        case 'P': case 'F': {
            char *end;
            double v = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(v >= 0)) usage_fail("bad peak", optarg);
            *(c == 'P' ? &peak : &peak32) = v;
            break;
        }
        case 'h':
            printf("usage: bench_gpu [--backend cuda|cpu] [-B n] [-T n] [-C n] [--NH n] [-V n] [-L n]\n"
                   "                 [--warmup n] [--reps n] [--precision highest,medium,high]\n"
                   "                 [--no-gemm-table] [--peak-tflops 989] [--peak-fp32 67]\n"
                   "defaults: cuda GPT-2 124M (B 8, T 1024, C 768, NH 12, V 50257, L 12), warm-up 3,\n"
                   "reps 15; cpu B 2, T 64, C 128, NH 4, V 512, L 2, warm-up 1, reps 3, no peak\n");
            exit(0);
        case ':': usage_fail("missing value for", argv[optind - 1]); break;
        default: usage_fail("bad option", argv[optind - 1]);
        }
    }
    if (optind < argc) usage_fail("unexpected argument", argv[optind]);
    const int cpu = strcmp(o->backend, "cpu") == 0;
    if (!cpu && strcmp(o->backend, "cuda") != 0) usage_fail("unknown backend (cuda or cpu)", o->backend);
    o->B = B ? B : cpu ? 2 : 8;
    o->T = T ? T : cpu ? 64 : 1024;
    o->C = C ? C : cpu ? 128 : 768;
    o->NH = NH ? NH : cpu ? 4 : 12;
    o->V = V ? V : cpu ? 512 : 50257;
    o->L = L ? L : cpu ? 2 : 12;
    o->warmup = warm >= 0 ? warm : cpu ? 1 : 3;
    o->reps = reps ? reps : cpu ? 3 : 15;
    o->peak = peak >= 0 ? peak : cpu ? 0 : 989;
    o->peak_fp32 = peak32 >= 0 ? peak32 : cpu ? 0 : 67;
    if (o->reps > MAX_REPS) usage_fail("--reps above 200", NULL);
    if (o->C % o->NH) usage_fail("C must be a multiple of NH", NULL);
    if (o->C / o->NH > 256) usage_fail("head size C/NH above 256 (the attention kernels' limit)", NULL);
    if ((double)o->B * o->T * (4.0 * o->C > o->V ? 4.0 * o->C : o->V) > 2147483647.0)
        usage_fail("B*T*max(4C,V) above 2^31 (the kernels' int sizes)", NULL);
    o->nlevels = 0;
    for (const char *s = prec ? prec : cpu ? "highest" : "highest,medium,high"; *s;) {
        size_t n = strcspn(s, ",");
        int l = !strncmp(s, "highest", n) && n == 7 ? ZT_MATMUL_HIGHEST
              : !strncmp(s, "high", n) && n == 4    ? ZT_MATMUL_HIGH
              : !strncmp(s, "medium", n) && n == 6  ? ZT_MATMUL_MEDIUM
                                                    : -1;
        if (l < 0 || o->nlevels == 3) usage_fail("bad --precision (highest, high, medium)", prec);
        o->levels[o->nlevels++] = l;
        s += n + (s[n] == ',');
    }
}

int main(int argc, char **argv)
{
    parse(argc, argv, &g_o);
    const double t0 = zt_now();
    char err[ZT_ERRLEN], name[256] = "?";
    if (strcmp(g_o.backend, "cuda") == 0) {
        if (!zt_cuda_available(err, sizeof err)) {
            printf("bench_gpu: no GPU: %s (skipped)\n", err);
            return 77;
        }
        zt_cuda_pick_device(0);
        size_t total = 0;
        if (zt_cuda_device_info(name, sizeof name, &total, NULL, err, sizeof err) != 0)
            zt_fatal("bench_gpu: %s", err);
        be = zt_backend_get("cuda");
        if (!be) zt_fatal("bench_gpu: the cuda backend is not usable");
        g_cuda = 1;
        g_stream = (cudaStream_t)zt_cuda_stream();
        for (int i = 0; i <= MAX_REPS; i++) BG_CUDA(cudaEventCreate(&g_ev[i]));
        printf("bench_gpu: device %s, %.1f GiB; peak %.0f TFLOP/s bf16, %.0f fp32\n", name,
               total / 1073741824.0, g_o.peak, g_o.peak_fp32);
    } else {
        be = zt_backend_get("cpu");
        printf("bench_gpu: CPU backend, host clock: figures check the tool's logic, they are not "
               "GPU figures\n");
    }
    fflush(stdout);

    /* highest and medium first, the GEMM table, then the rest: a timeout keeps the most */
    double step[3] = {0};
    const int first = g_o.nlevels < 2 ? g_o.nlevels : 2;
    for (int i = 0; i < first; i++) step[i] = bench_step(g_o.levels[i]);
    if (g_cuda && g_o.gemm_table) gemm_table();
    else if (g_o.gemm_table) printf("\n(no cuBLASLt GEMM table on the %s backend)\n", be->name);
    for (int i = first; i < g_o.nlevels; i++) step[i] = bench_step(g_o.levels[i]);

    printf("\nbench_gpu: done in %.2f s;", zt_now() - t0);
    for (int i = 0; i < g_o.nlevels; i++) printf(" %s %.3f ms", level_name(g_o.levels[i]), step[i]);
    printf(" (kernel-only step)\n");
    if (g_cuda)
        for (int i = 0; i <= MAX_REPS; i++) BG_CUDA(cudaEventDestroy(g_ev[i]));
    return 0;
}
