/* test_gpu_kernels.c — every CUDA backend kernel against the CPU backend.
 *
 * The CPU backend is the reference (it is itself checked against PyTorch and
 * finite differences in tests/unit/). Each kernel runs on the same random
 * inputs on both backends; outputs that the kernel accumulates into start from
 * the same random values, so += versus = is checked too. Shapes are chosen
 * awkward on purpose: C not a multiple of 32, T above one warp, matrices at
 * 4-byte-aligned (not 16) addresses. The table printed is
 *   kernel/output | max |gpu - cpu| / max |cpu| | bound | verdict
 * and the exit status is the verdict (77 = skipped: no usable GPU). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_backend.h"
#include "zt_common.h"
#include "zt_cuda.h"
#include "zt_quant.h"
#include "../unit/zt_test.h"

static const zt_backend_t *G = &zt_backend_cuda, *H = &zt_backend_cpu;
static double gemm_bound = 2e-5;   /* fp32 GEMM; TF32 (ZT_CUDA_TF32=1) needs ~1e-2 */
static int gemm_precision = ZT_MATMUL_HIGHEST;
static int n_rows, n_bad;

/* ---- buffers on both sides ------------------------------------------------- */

typedef struct { float *h, *d, *dbase; size_t n; } pair_t;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(float lo, float hi)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) * (1.0 / 16777216.0));
}

/* off = 1 places the device array at a 4-byte, not 16-byte, aligned address,
 * as parameter views inside flat buffers can be. */
static pair_t pair_make(size_t n, float lo, float hi, int off)
{
    pair_t p = { .n = n };
    p.h = zt_malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p.h[i] = lo == hi ? lo : frand(lo, hi);
    p.dbase = G->alloc((n + 4) * sizeof(float));
    p.d = p.dbase + off;
    G->from_host(p.d, p.h, n * sizeof(float));
    return p;
}
static pair_t pair_rand(size_t n) { return pair_make(n, -1.0f, 1.0f, 0); }

static void pair_free(pair_t *p)
{
    free(p->h);
    G->free(p->dbase);
}

static int32_t *ints_dev(const int32_t *h, size_t n)
{
    int32_t *d = G->alloc(n * sizeof(int32_t));
    G->from_host(d, h, n * sizeof(int32_t));
    return d;
}

/* Normwise relative error of the device result against the host reference
 * (infinite when either side has a non-finite value). */
static double rel_err(const pair_t *p)
{
    float *got = zt_malloc((p->n ? p->n : 1) * sizeof(float));
    G->to_host(got, p->d, p->n * sizeof(float));
    double maxdiff = 0.0, maxref = 0.0;
    int nonfinite = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (!isfinite(got[i]) || !isfinite(p->h[i])) nonfinite++;
        double d = fabs((double)got[i] - p->h[i]);
        if (d > maxdiff) maxdiff = d;
        if (fabs(p->h[i]) > maxref) maxref = fabs(p->h[i]);
    }
    free(got);
    return nonfinite ? INFINITY : maxdiff / (maxref > 0 ? maxref : 1e-30);
}

static void check(const char *what, const pair_t *p, double bound)
{
    double rel = rel_err(p);
    int ok = rel <= bound;
    printf("  %-34s %12.3e %10.1e  %s\n", what, rel, bound, ok ? "ok" : "FAIL");
    n_rows++;
    n_bad += !ok;
    CU_ASSERT(ok);
}

static void check_scalar(const char *what, double got, double ref, double bound)
{
    double rel = fabs(got - ref) / (fabs(ref) > 0 ? fabs(ref) : 1e-30);
    int ok = isfinite(got) && rel <= bound;
    printf("  %-34s %12.3e %10.1e  %s\n", what, rel, bound, ok ? "ok" : "FAIL");
    n_rows++;
    n_bad += !ok;
    CU_ASSERT(ok);
}

/* ---- tests ----------------------------------------------------------------- */

static void test_memory(void)
{
    const size_t n = 1000;
    float *d = G->alloc(n * sizeof(float));
    float *h = zt_malloc(n * sizeof(float));
    G->to_host(h, d, n * sizeof(float));
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= h[i] == 0.0f;
    CU_ASSERT(zero);
    pair_t a = pair_rand(n);
    G->copy(d, a.d, n * sizeof(float));
    G->to_host(h, d, n * sizeof(float));
    CU_ASSERT(memcmp(h, a.h, n * sizeof(float)) == 0);
    G->memzero(d + 10, 20 * sizeof(float));
    G->sync();
    G->to_host(h, d, n * sizeof(float));
    CU_ASSERT(h[9] == a.h[9] && h[10] == 0.0f && h[29] == 0.0f && h[30] == a.h[30]);
    printf("  %-34s %12s %10s  %s\n", "alloc/copy/memzero/to_host", "exact", "-",
           zero ? "ok" : "FAIL");
    n_rows++;
    n_bad += !zero;
    pair_free(&a);
    G->free(d);
    free(h);
}

static void test_encoder(void)
{
    const int B = 3, T = 70, C = 100, V = 53;   // few tokens: many repeats in dwte
    int32_t *tok = zt_malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(frand(0, 1) * V) % V;
    int32_t *dtok = ints_dev(tok, (size_t)B * T);
    pair_t wte = pair_rand((size_t)V * C), wpe = pair_rand((size_t)T * C);
    pair_t out = pair_rand((size_t)B * T * C);
    H->embedding_forward(out.h, tok, wte.h, B * T, C);
    G->embedding_forward(out.d, dtok, wte.d, B * T, C);
    check("embedding_forward out", &out, 0);
    H->positional_forward(out.h, wpe.h, NULL, B, T, C);
    G->positional_forward(out.d, wpe.d, NULL, B, T, C);
    check("positional_forward out (+=)", &out, 0);
    pair_t dwte = pair_rand((size_t)V * C), dwpe = pair_rand((size_t)T * C);
    H->embedding_backward(dwte.h, out.h, tok, B * T, C);
    G->embedding_backward(dwte.d, out.d, dtok, B * T, C);
    H->positional_backward(dwpe.h, out.h, NULL, B, T, C);
    G->positional_backward(dwpe.d, out.d, NULL, B, T, C);
    check("embedding_backward dwte (+=)", &dwte, 1e-5);
    check("positional_backward dwpe (+=)", &dwpe, 1e-5);
    /* packed rows (neat packing): positions restarting every 9 tokens; the backward
     * sums each row of dwpe in the CPU's (b, t) order, so bit-identical */
    int32_t *pos = zt_malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) pos[i] = (i % T) % 9;
    int32_t *dpos = ints_dev(pos, (size_t)B * T);
    H->positional_forward(out.h, wpe.h, pos, B, T, C);
    G->positional_forward(out.d, wpe.d, dpos, B, T, C);
    check("positional_forward positions (+=)", &out, 0);
    H->positional_backward(dwpe.h, out.h, pos, B, T, C);
    G->positional_backward(dwpe.d, out.d, dpos, B, T, C);
    check("positional_backward positions (+=)", &dwpe, 0);
    pair_free(&wte); pair_free(&wpe); pair_free(&out); pair_free(&dwte); pair_free(&dwpe);
    G->free(dtok);
    G->free(dpos);
    free(tok);
    free(pos);
}

/* rmsnorm as Qwen3's per-head q_norm inside a packed row (H heads of D at an
 * offset of a wider stride) and as the plain norm */
static void rmsnorm_case(int N, int Hh, int D, int S, int off)
{
    char what[64];
    const size_t n = (size_t)N * S + off;
    pair_t inp = pair_make(n, -2.0f, 3.0f, 0), w = pair_rand(D), out = pair_rand(n);
    pair_t rstd = pair_rand((size_t)N * Hh);
    H->rmsnorm_forward(out.h + off, rstd.h, inp.h + off, w.h, N, Hh, D, S, 1e-6f);
    G->rmsnorm_forward(out.d + off, rstd.d, inp.d + off, w.d, N, Hh, D, S, 1e-6f);
    snprintf(what, sizeof what, "rmsnorm fwd out H%d D%d", Hh, D);
    check(what, &out, 1e-5);
    snprintf(what, sizeof what, "rmsnorm fwd rstd H%d D%d", Hh, D);
    check(what, &rstd, 1e-5);
    pair_t dout = pair_rand(n), dinp = pair_rand(n), dw = pair_rand(D);
    H->rmsnorm_backward(dinp.h + off, dw.h, dout.h + off, inp.h + off, w.h, rstd.h, N, Hh, D, S);
    G->rmsnorm_backward(dinp.d + off, dw.d, dout.d + off, inp.d + off, w.d, rstd.d, N, Hh, D, S);
    snprintf(what, sizeof what, "rmsnorm bwd dinp (+=) H%d D%d", Hh, D);
    check(what, &dinp, 1e-5);
    snprintf(what, sizeof what, "rmsnorm bwd dweight (+=) H%d D%d", Hh, D);
    check(what, &dw, 1e-5);
    pair_free(&inp); pair_free(&w); pair_free(&out); pair_free(&rstd); pair_free(&dout);
    pair_free(&dinp); pair_free(&dw);
}

static void test_rmsnorm(void)
{
    rmsnorm_case(300, 1, 1000, 1000, 0);
    rmsnorm_case(257, 16, 128, 4096, 2048);
}

static void test_rope(void)
{
    const int B = 2, T = 300, Hh = 4, D = 128, S = 1024;
    const size_t n = (size_t)B * T * S;
    pair_t x = pair_rand(n), inv = pair_rand(D / 2);
    for (int i = 0; i < D / 2; i++) inv.h[i] = powf(1e6f, -2.0f * i / D);
    G->from_host(inv.d, inv.h, (size_t)D / 2 * sizeof(float));
    int32_t *pos = zt_malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) pos[i] = (int32_t)(frand(0, 1) * 32000);
    int32_t *dpos = ints_dev(pos, (size_t)B * T);
    H->rope_forward(x.h, inv.h, NULL, B, T, Hh, D, S);
    G->rope_forward(x.d, inv.d, NULL, B, T, Hh, D, S);
    check("rope_forward positions t", &x, 1e-5);
    H->rope_backward(x.h, inv.h, pos, B, T, Hh, D, S);
    G->rope_backward(x.d, inv.d, dpos, B, T, Hh, D, S);
    check("rope_backward positions array", &x, 1e-5);
    pair_free(&x); pair_free(&inv);
    G->free(dpos);
    free(pos);
}

typedef void (*glu_fwd_fn)(float *out, const float *gu, int N, int NI);
typedef void (*glu_bwd_fn)(float *dgu, const float *dout, const float *gu, int N, int NI);

/* the gated MLPs, gu (N,2I) = [gate | up]: swiglu (silu) or geglu (tanh gelu) */
static void glu_case(const char *name, int geglu)
{
    const int N = 300, I = 1000;
    const glu_fwd_fn hf = geglu ? H->geglu_forward : H->swiglu_forward,
                     gf = geglu ? G->geglu_forward : G->swiglu_forward;
    const glu_bwd_fn hb = geglu ? H->geglu_backward : H->swiglu_backward,
                     gb = geglu ? G->geglu_backward : G->swiglu_backward;
    char what[64];
    pair_t gu = pair_make((size_t)N * 2 * I, -8.0f, 8.0f, 0), out = pair_rand((size_t)N * I);
    pair_t dout = pair_rand((size_t)N * I), dgu = pair_rand((size_t)N * 2 * I);
    hf(out.h, gu.h, N, I);
    gf(out.d, gu.d, N, I);
    snprintf(what, sizeof what, "%s_forward", name);
    check(what, &out, 1e-5);
    hb(dgu.h, dout.h, gu.h, N, I);
    gb(dgu.d, dout.d, gu.d, N, I);
    snprintf(what, sizeof what, "%s_backward", name);
    check(what, &dgu, 1e-5);
    hb(gu.h, dout.h, gu.h, N, I); /* in place */
    gb(gu.d, dout.d, gu.d, N, I);
    snprintf(what, sizeof what, "%s_backward in place", name);
    check(what, &gu, 1e-5);
    pair_free(&gu); pair_free(&out); pair_free(&dout); pair_free(&dgu);
}

static void test_swiglu(void) { glu_case("swiglu", 0); }
static void test_geglu(void) { glu_case("geglu", 1); }

static void test_layernorm(void)
{
    const int N = 300, C = 100;
    pair_t inp = pair_make((size_t)N * C, -2.0f, 3.0f, 0), w = pair_rand(C), b = pair_rand(C);
    pair_t out = pair_rand((size_t)N * C), mean = pair_rand(N), rstd = pair_rand(N);
    H->layernorm_forward(out.h, mean.h, rstd.h, inp.h, w.h, b.h, N, C, 1e-5f);
    G->layernorm_forward(out.d, mean.d, rstd.d, inp.d, w.d, b.d, N, C, 1e-5f);
    check("layernorm_forward out", &out, 1e-5);
    check("layernorm_forward mean", &mean, 1e-5);
    check("layernorm_forward rstd", &rstd, 1e-5);
    pair_t dout = pair_rand((size_t)N * C), dinp = pair_rand((size_t)N * C);
    pair_t dw = pair_rand(C), db = pair_rand(C);
    H->layernorm_backward(dinp.h, dw.h, db.h, dout.h, inp.h, w.h, mean.h, rstd.h, N, C);
    G->layernorm_backward(dinp.d, dw.d, db.d, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    check("layernorm_backward dinp (+=)", &dinp, 1e-5);
    check("layernorm_backward dweight (+=)", &dw, 1e-5);
    check("layernorm_backward dbias (+=)", &db, 1e-5);
    /* no bias, another eps; dbias NULL */
    H->layernorm_forward(out.h, mean.h, rstd.h, inp.h, w.h, NULL, N, C, 1e-2f);
    G->layernorm_forward(out.d, mean.d, rstd.d, inp.d, w.d, NULL, N, C, 1e-2f);
    check("layernorm_forward out, no bias, eps 1e-2", &out, 1e-5);
    H->layernorm_backward(dinp.h, dw.h, NULL, dout.h, inp.h, w.h, mean.h, rstd.h, N, C);
    G->layernorm_backward(dinp.d, dw.d, NULL, dout.d, inp.d, w.d, mean.d, rstd.d, N, C);
    check("layernorm_backward dinp, no dbias", &dinp, 1e-5);
    check("layernorm_backward dweight, no dbias", &dw, 1e-5);
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out); pair_free(&mean);
    pair_free(&rstd); pair_free(&dout); pair_free(&dinp); pair_free(&dw); pair_free(&db);
}

static void matmul_case(int transw, int off)
{
    const int N = 130, C = 72, OC = 203;
    char name[64];
    pair_t inp = pair_make((size_t)N * C, -1, 1, off), W = pair_make((size_t)C * OC, -1, 1, off);
    pair_t bias = pair_make(OC, -1, 1, off), out = pair_make((size_t)N * OC, -1, 1, off);
    H->matmul_forward(out.h, inp.h, W.h, bias.h, N, C, OC, transw);
    G->matmul_forward(out.d, inp.d, W.d, bias.d, N, C, OC, transw);
    snprintf(name, sizeof name, "matmul_forward out tw=%d al=%d", transw, off ? 4 : 16);
    check(name, &out, gemm_bound);
    pair_t dout = pair_make((size_t)N * OC, -1, 1, off), dinp = pair_make((size_t)N * C, -1, 1, off);
    pair_t dW = pair_make((size_t)C * OC, -1, 1, off), db = pair_make(OC, -1, 1, off);
    H->matmul_backward(dinp.h, dW.h, db.h, dout.h, inp.h, W.h, N, C, OC, transw);
    G->matmul_backward(dinp.d, dW.d, db.d, dout.d, inp.d, W.d, N, C, OC, transw);
    snprintf(name, sizeof name, "matmul_backward dinp tw=%d al=%d", transw, off ? 4 : 16);
    check(name, &dinp, gemm_bound);
    snprintf(name, sizeof name, "matmul_backward dW tw=%d al=%d", transw, off ? 4 : 16);
    check(name, &dW, gemm_bound);
    snprintf(name, sizeof name, "matmul_backward dbias tw=%d", transw);
    check(name, &db, 1e-5);
    pair_free(&inp); pair_free(&W); pair_free(&bias); pair_free(&out);
    pair_free(&dout); pair_free(&dinp); pair_free(&dW); pair_free(&db);
}

/* matmul_backward with the optional outputs left out (dinp and dbias NULL), as the
 * first layer and bias-free GEMMs call it: dW alone must still be right. */
static void matmul_partial_case(void)
{
    const int N = 64, C = 48, OC = 80;
    pair_t inp = pair_rand((size_t)N * C), W = pair_rand((size_t)C * OC), dout = pair_rand((size_t)N * OC);
    pair_t dW = pair_rand((size_t)C * OC);
    H->matmul_backward(NULL, dW.h, NULL, dout.h, inp.h, W.h, N, C, OC, 0);
    G->matmul_backward(NULL, dW.d, NULL, dout.d, inp.d, W.d, N, C, OC, 0);
    check("matmul_backward dW only", &dW, gemm_bound);
    pair_free(&inp); pair_free(&W); pair_free(&dout); pair_free(&dW);
}

static void test_matmul(void)
{
    matmul_partial_case();
    matmul_case(0, 0);
    matmul_case(1, 0);
    matmul_case(0, 1);
    matmul_case(1, 1);
}

/* train.matmul_precision = medium: cuBLASLt rounds the fp32 operands to bf16 (8
 * significant bits, relative 2^-9 each) and accumulates in fp32, so a product is
 * off by up to ~2^-8 and a normwise error of a few 2^-9 is expected: bound 1.5e-2.
 * Checked against the fp32 CPU GEMM, so it also shows that the mode is really on
 * (the fp32 bound 2e-5 would fail) only together with the default run's pass. */
static void test_matmul_bf16(void)
{
    const double saved = gemm_bound;
    zt_backend_cuda.set_matmul_precision(ZT_MATMUL_MEDIUM);
    gemm_bound = 1.5e-2;
    matmul_case(0, 0);
    matmul_case(1, 1);
    zt_backend_cuda.set_matmul_precision(gemm_precision);
    gemm_bound = saved;
}

/* The MLP's fused halves: fc + GELU forward, fcproj's backward into GELU's input
 * gradient (dpre written over act, as the model does). At ZT_MATMUL_HIGHEST they
 * are composed on the GPU too; below it cuBLASLt's GELU epilogues run when the
 * backend's probe accepted them, which the count of fused GEMMs shows. */
static void matmul_gelu_case(int level, double bound)
{
    const int N = 130, C = 72, F = 200; /* F % 8 == 0: the epilogue's aux rows */
    char name[64];
    const char *tag = level == ZT_MATMUL_HIGHEST ? "fp32" : "bf16";
    zt_backend_cuda.set_matmul_precision(level);
    long calls0 = 0, calls1 = 0;
    zt_cuda_gelu_epilogue(NULL, 0, &calls0);
    /* inputs in [-3, 3): pre-activations spread over GELU's bend */
    pair_t inp = pair_make((size_t)N * C, -3.0f, 3.0f, 0), W = pair_rand((size_t)C * F);
    pair_t b = pair_rand(F), pre = pair_rand((size_t)N * F), act = pair_rand((size_t)N * F);
    H->matmul_gelu_forward(act.h, pre.h, inp.h, W.h, b.h, N, C, F);
    G->matmul_gelu_forward(act.d, pre.d, inp.d, W.d, b.d, N, C, F);
    snprintf(name, sizeof name, "matmul_gelu_forward pre %s", tag);
    check(name, &pre, bound);
    snprintf(name, sizeof name, "matmul_gelu_forward out %s", tag);
    check(name, &act, bound);
    /* the backward from the CPU's forward on both sides: identical inputs */
    G->from_host(pre.d, pre.h, pre.n * sizeof(float));
    G->from_host(act.d, act.h, act.n * sizeof(float));
    pair_t W2 = pair_rand((size_t)F * C), dy = pair_rand((size_t)N * C);
    pair_t dW2 = pair_rand((size_t)F * C), db2 = pair_rand(C);
    H->gelu_matmul_backward(act.h, dW2.h, db2.h, dy.h, act.h, pre.h, W2.h, N, F, C);
    G->gelu_matmul_backward(act.d, dW2.d, db2.d, dy.d, act.d, pre.d, W2.d, N, F, C);
    snprintf(name, sizeof name, "gelu_matmul_backward dpre %s", tag);
    check(name, &act, bound);
    snprintf(name, sizeof name, "gelu_matmul_backward dW (+=) %s", tag);
    check(name, &dW2, bound);
    snprintf(name, sizeof name, "gelu_matmul_backward db (+=) %s", tag);
    check(name, &db2, 1e-5);
    char why[160];
    int used = zt_cuda_gelu_epilogue(why, sizeof why, &calls1);
    /* fp32 never fuses; bf16 fuses only when the probe said yes (and then both GEMMs,
     * unless cuBLASLt has no epilogue algorithm for this shape: the count says which) */
    int ok = level == ZT_MATMUL_HIGHEST ? calls1 == calls0
                                        : (used ? calls1 - calls0 <= 2 : calls1 == calls0);
    printf("  %-34s %12ld %10s  %s (gelu: %s)\n", level == ZT_MATMUL_HIGHEST ? "fused GEMMs at fp32"
           : "fused GEMMs at bf16", calls1 - calls0, "-", ok ? "ok" : "FAIL", why);
    n_rows++;
    n_bad += !ok;
    CU_ASSERT(ok);
    zt_backend_cuda.set_matmul_precision(gemm_precision);
    pair_free(&inp); pair_free(&W); pair_free(&b); pair_free(&pre); pair_free(&act);
    pair_free(&W2); pair_free(&dy); pair_free(&dW2); pair_free(&db2);
}

static void test_matmul_gelu(void)
{
    if (gemm_precision == ZT_MATMUL_HIGHEST) matmul_gelu_case(ZT_MATMUL_HIGHEST, gemm_bound);
    matmul_gelu_case(ZT_MATMUL_MEDIUM, 1.5e-2);
}

/* Forward (out, lse) on both backends; the backward then gets the CPU's out and
 * lse on both sides, so it is compared on identical inputs. Returns the
 * forward's out error. seg_len > 0: packed rows, segments of seg_len tokens;
 * window > 0: a sliding window. */
static double attention_case_seg(int B, int T, int NH, int NKV, int HD, double bound_fwd,
                                 double bound_bwd, int seg_len, int window)
{
    char what[80];
    const size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
    pair_t qkv = pair_make(nq, -2, 2, 0), out = pair_rand(no);
    pair_t lse = pair_rand((size_t)B * NH * T);
    int32_t *seg = NULL, *dseg = NULL;
    if (seg_len) {
        seg = zt_malloc((size_t)B * T * sizeof(int32_t));
        for (int i = 0; i < B * T; i++) seg[i] = 1 + (i % T) / seg_len;
        dseg = ints_dev(seg, (size_t)B * T);
    }
    H->attention_forward(out.h, lse.h, qkv.h, seg, B, T, NH, NKV, HD, window);
    G->attention_forward(out.d, lse.d, qkv.d, dseg, B, T, NH, NKV, HD, window);
    const double out_err = rel_err(&out);
    char pk[32];
    snprintf(pk, sizeof pk, "%s", seg_len ? " packed" : "");
    if (window) snprintf(pk + strlen(pk), sizeof pk - strlen(pk), " win%d", window);
    snprintf(what, sizeof what, "attention fwd out T%d NH%d/%d hs%d%s", T, NH, NKV, HD, pk);
    check(what, &out, bound_fwd);
    snprintf(what, sizeof what, "attention fwd lse T%d NH%d/%d hs%d%s", T, NH, NKV, HD, pk);
    check(what, &lse, bound_fwd);
    G->from_host(out.d, out.h, out.n * sizeof(float));
    G->from_host(lse.d, lse.h, lse.n * sizeof(float));
    pair_t dout = pair_rand(no), dqkv = pair_rand(nq);
    H->attention_backward(dqkv.h, dout.h, qkv.h, out.h, lse.h, seg, B, T, NH, NKV, HD, window);
    G->attention_backward(dqkv.d, dout.d, qkv.d, out.d, lse.d, dseg, B, T, NH, NKV, HD, window);
    snprintf(what, sizeof what, "attention bwd dqkv += T%d NH%d/%d hs%d%s", T, NH, NKV, HD, pk);
    check(what, &dqkv, bound_bwd);
    pair_free(&qkv); pair_free(&out); pair_free(&lse); pair_free(&dout); pair_free(&dqkv);
    if (dseg) G->free(dseg);
    free(seg);
    return out_err;
}

static double attention_case(int B, int T, int NH, int NKV, int HD, double bound_fwd,
                             double bound_bwd)
{
    return attention_case_seg(B, T, NH, NKV, HD, bound_fwd, bound_bwd, 0, 0);
}

/* T = 70 and 131 are not multiples of the 32-row tiles (nor of the CPU's
 * blocks); hs = 32, 64 (GPT-2), 20 (lanes idle), 128 (above 48 KiB of shared
 * memory: the opt-in path); T = 1 is a single visible key. */
static void test_attention(void)
{
    attention_case(2, 70, 3, 3, 32, 2e-5, 5e-5);
    attention_case(1, 131, 2, 2, 64, 2e-5, 5e-5);
    attention_case(2, 45, 3, 3, 20, 2e-5, 5e-5);
    attention_case(1, 100, 2, 2, 128, 2e-5, 5e-5);
    attention_case(3, 1, 1, 1, 64, 2e-5, 5e-5);
    /* grouped-query attention, head sizes unrelated to any C */
    attention_case(2, 70, 4, 2, 12, 2e-5, 5e-5);
    attention_case(1, 131, 6, 1, 40, 2e-5, 5e-5);
    attention_case(2, 45, 8, 2, 128, 2e-5, 5e-5);
    /* packed rows: segments of 23 tokens cut the tiles */
    attention_case_seg(2, 100, 4, 2, 32, 2e-5, 5e-5, 23, 0);
    /* sliding windows: across several tiles (grouped-query), inside one with packed rows */
    attention_case_seg(2, 131, 4, 2, 32, 2e-5, 5e-5, 0, 40);
    attention_case_seg(2, 100, 4, 2, 64, 2e-5, 5e-5, 23, 10);
}

/* Ring attention's pieces: a block of Tq queries (rows of stride qs) against Tk keys
 * (k|v rows of stride ks), causal (Tq = Tk) or full, forward and backward (with the
 * CPU's out and lse on both sides), and the merge of two blocks' results; bound b: the
 * fp32 kernels' (2e-5 forward, 5e-5 backward) or the tensor cores' 1.6e-2. window > 0:
 * a sliding window, the queries delta positions after the keys (every row must see a
 * key: an lse of -inf would compare as non-finite). */
static void attention_block_case(int Tq, int Tk, int NH, int NKV, int HD, int causal, int window, int delta, double b)
{
    const double bf = b > 0 ? b : 2e-5, bb = b > 0 ? b : 5e-5;
    char what[80];
    const int B = 2, qs = NH * HD + 3, ks = 2 * NKV * HD + 1;
    const size_t no = (size_t)B * Tq * NH * HD, nl = (size_t)B * NH * Tq;
    pair_t q = pair_make((size_t)B * Tq * qs, -2, 2, 0), kv = pair_make((size_t)B * Tk * ks, -2, 2, 0);
    pair_t out = pair_rand(no), lse = pair_rand(nl);
    const size_t vo = (size_t)NKV * HD;
    H->attention_block_forward(out.h, lse.h, q.h, qs, kv.h, kv.h + vo, ks, NULL, NULL, B, Tq, Tk, NH, NKV, HD, causal,
                               window, delta);
    G->attention_block_forward(out.d, lse.d, q.d, qs, kv.d, kv.d + vo, ks, NULL, NULL, B, Tq, Tk, NH, NKV, HD, causal,
                               window, delta);
    char kind[40];
    snprintf(kind, sizeof kind, "%s", causal ? "causal" : "full");
    if (window) snprintf(kind + strlen(kind), sizeof kind - strlen(kind), " win%d+%d", window, delta);
    snprintf(what, sizeof what, "ring block %s fwd out %dx%d hs%d", kind, Tq, Tk, HD);
    check(what, &out, bf);
    snprintf(what, sizeof what, "ring block %s fwd lse %dx%d hs%d", kind, Tq, Tk, HD);
    check(what, &lse, bf);
    G->from_host(out.d, out.h, out.n * sizeof(float));
    G->from_host(lse.d, lse.h, lse.n * sizeof(float));
    pair_t dout = pair_rand(no), dq = pair_rand(q.n), dkv = pair_rand(kv.n);
    H->attention_block_backward(dq.h, dkv.h, dkv.h + vo, dout.h, q.h, qs, kv.h, kv.h + vo, ks, NULL, NULL, out.h,
                                lse.h, B, Tq, Tk, NH, NKV, HD, causal, window, delta);
    G->attention_block_backward(dq.d, dkv.d, dkv.d + vo, dout.d, q.d, qs, kv.d, kv.d + vo, ks, NULL, NULL, out.d,
                                lse.d, B, Tq, Tk, NH, NKV, HD, causal, window, delta);
    snprintf(what, sizeof what, "ring block %s bwd dq += %dx%d", kind, Tq, Tk);
    check(what, &dq, bb);
    snprintf(what, sizeof what, "ring block %s bwd dk|dv += %dx%d", kind, Tq, Tk);
    check(what, &dkv, bb);
    /* merge this block's result into another's */
    pair_t o2 = pair_rand(no), l2 = pair_make(nl, -3, 3, 0);
    H->attention_merge(o2.h, l2.h, out.h, lse.h, B, Tq, NH, HD);
    G->attention_merge(o2.d, l2.d, out.d, lse.d, B, Tq, NH, HD);
    snprintf(what, sizeof what, "ring merge out T%d hs%d", Tq, HD);
    check(what, &o2, 1e-6);
    snprintf(what, sizeof what, "ring merge lse T%d hs%d", Tq, HD);
    check(what, &l2, 1e-6);
    pair_free(&q); pair_free(&kv); pair_free(&out); pair_free(&lse); pair_free(&dout); pair_free(&dq);
    pair_free(&dkv); pair_free(&o2); pair_free(&l2);
}

static void test_attention_blocks(void)
{
    attention_block_case(70, 70, 4, 2, 64, 1, 0, 0, 0);
    attention_block_case(37, 45, 4, 2, 12, 0, 0, 0, 0);
    attention_block_case(131, 64, 6, 1, 128, 0, 0, 0, 0);
    /* sliding windows: the diagonal pair, and an earlier key block the window cuts */
    attention_block_case(70, 70, 4, 2, 64, 1, 34, 0, 0);
    attention_block_case(70, 70, 4, 2, 64, 0, 100, 70, 0);
    /* precision medium: the tensor-core kernels (hs 64, 32), 12 falls back to fp32 */
    zt_backend_cuda.set_matmul_precision(ZT_MATMUL_MEDIUM);
    attention_block_case(70, 100, 4, 2, 64, 0, 0, 0, 1.6e-2);
    attention_block_case(80, 80, 2, 2, 32, 1, 0, 0, 1.6e-2);
    attention_block_case(37, 45, 4, 2, 12, 0, 0, 0, 0);
    attention_block_case(80, 80, 2, 2, 32, 1, 34, 0, 1.6e-2);
    attention_block_case(100, 100, 4, 2, 64, 0, 130, 100, 1.6e-2);
    zt_backend_cuda.set_matmul_precision(gemm_precision);
}

/* train.matmul_precision = medium: the bf16 tensor-core kernels for head sizes
 * that are multiples of 16 up to 128. q, k, v, dout, p and ds are rounded to
 * bf16 (unit roundoff u = 2^-8); the error analysis in
 * tests/gpu/emulate_attention.cpp gives a normwise bound of 4u = 1.6e-2 for
 * these inputs (the emulated kernels measure up to ~5e-3). The out error of
 * hs = 64 must also exceed 1e-4, or the fp32 kernels ran instead. Head size 20
 * falls back to fp32 and keeps the fp32 bounds. T = 64 is one 64-row tile
 * exactly, 131 cuts the third, 17 and 1 sit inside the first. */
static void test_attention_bf16(void)
{
    const double b = 1.6e-2;
    zt_backend_cuda.set_matmul_precision(ZT_MATMUL_MEDIUM);
    const double e64 = attention_case(2, 100, 2, 2, 64, b, b);
    attention_case(1, 131, 2, 2, 128, b, b);
    attention_case(2, 64, 3, 3, 32, b, b);
    attention_case(2, 17, 2, 2, 16, b, b);
    attention_case(3, 1, 1, 1, 64, b, b);
    attention_case(1, 70, 3, 3, 48, b, b);
    attention_case(2, 100, 4, 2, 64, b, b);  /* grouped-query */
    attention_case(1, 70, 8, 1, 32, b, b);
    attention_case(2, 45, 3, 3, 20, 2e-5, 5e-5);
    attention_case_seg(2, 131, 4, 2, 64, b, b, 23, 0); /* packed rows */
    attention_case_seg(2, 200, 4, 2, 64, b, b, 0, 70);  /* sliding windows */
    attention_case_seg(1, 131, 2, 1, 32, b, b, 23, 17);
    const int on = e64 > 1e-4;
    printf("  %-34s %12.3e %10s  %s\n", "attention bf16 kernels in use", e64, "> 1e-4",
           on ? "ok" : "FAIL");
    n_rows++;
    n_bad += !on;
    CU_ASSERT(on);
    zt_backend_cuda.set_matmul_precision(gemm_precision);
}

static void test_elementwise(void)
{
    const size_t n = 100003;
    pair_t x = pair_make(n, -6, 6, 0), y = pair_rand(n), o = pair_rand(n), d = pair_rand(n);
    H->gelu_forward(o.h, x.h, n);
    G->gelu_forward(o.d, x.d, n);
    check("gelu_forward", &o, 1e-5);
    H->gelu_backward(d.h, x.h, y.h, n);
    G->gelu_backward(d.d, x.d, y.d, n);
    check("gelu_backward", &d, 1e-5);
    H->residual_forward(o.h, x.h, y.h, n);
    G->residual_forward(o.d, x.d, y.d, n);
    check("residual_forward", &o, 1e-7);
    H->accumulate(y.h, x.h, n);
    G->accumulate(y.d, x.d, n);
    check("accumulate", &y, 1e-7);
    H->scale(y.h, 0.37f, n);
    G->scale(y.d, 0.37f, n);
    check("scale", &y, 1e-7);
    pair_free(&x); pair_free(&y); pair_free(&o); pair_free(&d);
}

/* QLoRA's base on the device: a 4-bit region (bitsandbytes' format, quantized on the host)
 * uploaded, dequantized by the kernel (bit for bit the host's), then the GEMM the linear runs
 * on it (cuBLASLt): y = x W^T against the host's on its own dequantized W */
static void test_dequant4(void)
{
    const int OC = 96, C = 320, N = 37; /* 30720 values: 480 blocks, 2 nested blocks */
    const int64_t n = (int64_t)OC * C;
    char what[64], err[256];
    for (int qt = 0; qt < 2; qt++)
        for (int nested = 0; nested < 2; nested++) {
            pair_t w = pair_make((size_t)n, -0.1f, 0.1f, 0), wd = pair_rand((size_t)n);
            pair_t x = pair_rand((size_t)N * C), y = pair_rand((size_t)N * OC);
            CU_ASSERT_FATAL(zt_quant4_pack_region("w", (zt_quant_type_t)qt, nested, 64, w.h, n, err, sizeof err) == 0);
            G->from_host(w.d, w.h, (size_t)n * sizeof(float));
            H->dequant4(wd.h, w.h, n, qt, nested, 64, NULL, 0);
            G->dequant4(wd.d, w.d, n, qt, nested, 64, NULL, 0);
            snprintf(what, sizeof what, "dequant4 %s%s", zt_quant_type_name((zt_quant_type_t)qt), nested ? " nested" : "");
            check(what, &wd, 0.0);
            H->matmul_forward(y.h, x.h, wd.h, NULL, N, C, OC, 1);
            G->matmul_forward(y.d, x.d, wd.d, NULL, N, C, OC, 1);
            snprintf(what, sizeof what, "  then y = x W^T (%s)", nested ? "nested" : "plain");
            check(what, &y, gemm_bound);
            pair_free(&w); pair_free(&wd); pair_free(&x); pair_free(&y);
        }
}

static void test_crossentropy(void)
{
    const int N = 67, V = 1029;
    int32_t tg[67];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(frand(0, 1) * V) % V;
    tg[5] = -1;                                 // ignored position
    int32_t *dtg = ints_dev(tg, N);
    pair_t lg = pair_make((size_t)N * V, -8, 8, 0), loss = pair_rand(N);
    pair_t lg2 = pair_make((size_t)N * V, 0, 0, 0), loss2 = pair_rand(N);
    memcpy(lg2.h, lg.h, (size_t)N * V * sizeof(float));
    G->copy(lg2.d, lg.d, (size_t)N * V * sizeof(float));
    H->crossentropy_fused(lg.h, loss.h, tg, N, V, 1.0f / N);
    G->crossentropy_fused(lg.d, loss.d, dtg, N, V, 1.0f / N);
    check("crossentropy losses", &loss, 1e-5);
    check("crossentropy dlogits (in place)", &lg, 1e-5);
    H->crossentropy_fused(lg2.h, loss2.h, tg, N, V, 0.0f);
    G->crossentropy_fused(lg2.d, loss2.d, dtg, N, V, 0.0f);
    check("crossentropy losses (dscale=0)", &loss2, 1e-5);
    pair_free(&lg); pair_free(&loss); pair_free(&lg2); pair_free(&loss2);
    G->free(dtg);
}

static void test_reductions(void)
{
    const size_t n = 3000017;
    pair_t x = pair_make(n, -3, 3, 0);
    check_scalar("sumsq", G->sumsq(x.d, n), H->sumsq(x.h, n), 1e-10);
    int fin = G->all_finite(x.d, n);
    float bad[2] = { NAN, INFINITY };
    G->from_host(x.d + n - 1, &bad[0], sizeof(float));
    int nan_seen = !G->all_finite(x.d, n);
    G->from_host(x.d + n - 1, &bad[1], sizeof(float));
    int inf_seen = !G->all_finite(x.d, n);
    int ok = fin && nan_seen && inf_seen;
    printf("  %-34s %12s %10s  %s\n", "all_finite (clean, NaN, Inf)", "exact", "-", ok ? "ok" : "FAIL");
    n_rows++;
    n_bad += !ok;
    CU_ASSERT(ok);
    pair_free(&x);
}

static void test_adamw(void)
{
    const size_t n = 10007;
    pair_t p = pair_rand(n), m = pair_make(n, 0, 0, 0), v = pair_make(n, 0, 0, 0);
    for (long step = 1; step <= 3; step++) {
        pair_t g = pair_rand(n);
        H->adamw(p.h, g.h, m.h, v.h, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
        G->adamw(p.d, g.d, m.d, v.d, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step);
        pair_free(&g);
    }
    check("adamw p (3 steps)", &p, 1e-6);
    check("adamw m", &m, 1e-6);
    check("adamw v", &v, 1e-6);
    pair_free(&p); pair_free(&m); pair_free(&v);
}

static void test_bf16(void)
{
    const size_t n = 70001;
    pair_t x = pair_make(n, -1000, 1000, 0);
    x.h[0] = NAN; x.h[1] = -INFINITY; x.h[2] = 1.00390625f; /* a tie: rounds to even */
    x.h[3] = -0.0f; x.h[4] = 3.0e38f;
    G->from_host(x.d, x.h, 5 * sizeof(float));
    uint16_t *bh = zt_malloc(n * 2), *bg = zt_malloc(n * 2);
    uint16_t *bd = G->alloc(n * 2);
    H->to_bf16(bh, x.h, n);
    G->to_bf16(bd, x.d, n);
    G->to_host(bg, bd, n * 2);
    int same = memcmp(bh, bg, n * 2) == 0;
    printf("  %-34s %12s %10s  %s\n", "to_bf16 (bitwise)", "exact", "-", same ? "ok" : "FAIL");
    CU_ASSERT(same);
    pair_t y = pair_rand(n);
    H->from_bf16(y.h, bh, n);
    G->from_bf16(y.d, bd, n);
    float *yg = zt_malloc(n * sizeof(float));
    G->to_host(yg, y.d, n * sizeof(float));
    int same2 = memcmp(yg, y.h, n * sizeof(float)) == 0;
    printf("  %-34s %12s %10s  %s\n", "from_bf16 (bitwise)", "exact", "-", same2 ? "ok" : "FAIL");
    CU_ASSERT(same2);
    n_rows += 2;
    n_bad += !same + !same2;
    pair_free(&x); pair_free(&y);
    G->free(bd);
    free(bh); free(bg); free(yg);
}

/* fp16: every half converted up, and random plus edge floats converted down, bitwise
 * against the CPU backend, NaNs included (their sign and payload: the kernels do NaNs
 * on the bits, since cvt would make them all the canonical positive NaN) */
static void test_fp16(void)
{
    const size_t nh = 65536, n = 70001;
    uint16_t *hh = zt_malloc(nh * 2), *hd = G->alloc(nh * 2);
    for (size_t i = 0; i < nh; i++) hh[i] = (uint16_t)i;
    G->from_host(hd, hh, nh * 2);
    pair_t y = pair_rand(nh);
    H->from_fp16(y.h, hh, nh);
    G->from_fp16(y.d, hd, nh);
    uint32_t *yg = zt_malloc(nh * 4), *yh = (uint32_t *)y.h;
    G->to_host(yg, y.d, nh * 4);
    size_t bad = 0;
    for (size_t i = 0; i < nh; i++) bad += yg[i] != yh[i];
    printf("  %-34s %12s %10s  %s\n", "from_fp16 (bitwise, all halfs)", "exact", "-", bad ? "FAIL" : "ok");
    CU_ASSERT(bad == 0);
    pair_t x = pair_make(n, -70000, 70000, 0);
    const float edge[] = {NAN, -INFINITY, 65504.0f, 65520.0f, 65519.99f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f,
                          -0.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 3.0e38f, 1e-30f};
    const uint32_t nan_bits[] = {0xffc00000u, 0x7f800001u, 0xff802000u, 0x7fffffffu};
    const size_t ne = sizeof edge / sizeof *edge + 4;
    memcpy(x.h, edge, sizeof edge);
    memcpy(x.h + ne - 4, nan_bits, sizeof nan_bits);
    for (size_t i = ne; i < n; i += 3) x.h[i] *= 1e-5f; /* small values, near and below fp16's normals */
    G->from_host(x.d, x.h, n * sizeof(float));
    uint16_t *bh = zt_malloc(n * 2), *bg = zt_malloc(n * 2), *bd = G->alloc(n * 2);
    H->to_fp16(bh, x.h, n);
    G->to_fp16(bd, x.d, n);
    G->to_host(bg, bd, n * 2);
    size_t bad2 = 0;
    for (size_t i = 0; i < n; i++) bad2 += bg[i] != bh[i];
    printf("  %-34s %12s %10s  %s\n", "to_fp16 (bitwise)", "exact", "-", bad2 ? "FAIL" : "ok");
    CU_ASSERT(bad2 == 0);
    n_rows += 2;
    n_bad += (bad != 0) + (bad2 != 0);
    pair_free(&x); pair_free(&y);
    G->free(hd); G->free(bd);
    free(hh); free(yg); free(bh); free(bg);
}

/* Offload's transfers: pinned host memory, a download queued behind a kernel, an
 * upload that a kernel queued after it must see, all without host waits between
 * them except the two the contract names (wait_downloads, wait_uploads). */
static void test_async_transfers(void)
{
    const size_t n = (size_t)3 << 20; /* 12 MB: long enough to overlap */
    float *hin = G->alloc_host(n * sizeof(float)), *hout = G->alloc_host(n * sizeof(float));
    float *ref = zt_malloc(n * sizeof(float));
    pair_t x = pair_rand(n);
    for (size_t i = 0; i < n; i++) hin[i] = frand(-1, 1);
    /* the download must wait for the kernel queued before it: x *= 3 */
    G->scale(x.d, 3.0f, n);
    G->to_host_async(hout, x.d, n * sizeof(float));
    G->wait_downloads();
    for (size_t i = 0; i < n; i++) ref[i] = x.h[i] * 3.0f;
    int bad = memcmp(hout, ref, n * sizeof(float)) != 0;
    printf("  %-34s %12s %10s  %s\n", "to_host_async after a kernel", "", "exact", bad ? "FAIL" : "ok");
    n_rows++; n_bad += bad; CU_ASSERT(!bad);
    /* a kernel queued after an upload reads the uploaded data: x = hin, then x += x */
    G->from_host_async(x.d, hin, n * sizeof(float));
    G->accumulate(x.d, x.d, n);       /* x = 2 hin, on the compute stream */
    G->wait_uploads();
    G->to_host(hout, x.d, n * sizeof(float));
    for (size_t i = 0; i < n; i++) ref[i] = hin[i] + hin[i];
    bad = memcmp(hout, ref, n * sizeof(float)) != 0;
    printf("  %-34s %12s %10s  %s\n", "kernel after from_host_async", "", "exact", bad ? "FAIL" : "ok");
    n_rows++; n_bad += bad; CU_ASSERT(!bad);
    pair_free(&x);
    free(ref);
    G->free_host(hin);
    G->free_host(hout);
}

static const zt_test_t tests[] = {
    { "memory", test_memory },
    { "embedding, positional", test_encoder },
    { "layernorm", test_layernorm },
    { "rmsnorm", test_rmsnorm },
    { "rope", test_rope },
    { "swiglu", test_swiglu },
    { "geglu", test_geglu },
    { "matmul", test_matmul },
    { "matmul bf16 tensor cores", test_matmul_bf16 },
    { "matmul + gelu fused", test_matmul_gelu },
    { "attention", test_attention },
    { "attention bf16 tensor cores", test_attention_bf16 },
    { "ring attention blocks", test_attention_blocks },
    { "elementwise", test_elementwise },
    { "4-bit dequantization", test_dequant4 },
    { "crossentropy", test_crossentropy },
    { "reductions", test_reductions },
    { "adamw", test_adamw },
    { "bf16", test_bf16 },
    { "async transfers", test_async_transfers },
    { "fp16", test_fp16 },
    { NULL, NULL },
};

int main(void)
{
    char err[ZT_ERRLEN];
    if (!zt_cuda_available(err, sizeof err)) {
        printf("no GPU: %s (skipped)\n", err);
        return 77;
    }
    /* ZT_CUDA_TF32=1: the GEMMs on TF32 tensor cores (train.matmul_precision = high) */
    const char *tf32 = getenv("ZT_CUDA_TF32");
    if (tf32 && tf32[0] == '1') {
        gemm_precision = ZT_MATMUL_HIGH;
        zt_backend_cuda.set_matmul_precision(gemm_precision);
        gemm_bound = 1e-2;
    }
    int dev = zt_cuda_pick_device(0);
    char name[256] = "?";
    size_t tot = 0, fr = 0;
    zt_cuda_device_info(name, sizeof name, &tot, &fr, err, sizeof err);
    zt_cpu_set_threads(4);
    printf("CUDA backend vs CPU backend on device %d: %s\n", dev, name);
    printf("  %-34s %12s %10s  %s\n", "kernel / output", "rel.err", "bound", "verdict");
    int rc = zt_test_run("gpu_kernels", tests);
    printf("%d comparisons, %d failed\n", n_rows, n_bad);
    return rc;
}
