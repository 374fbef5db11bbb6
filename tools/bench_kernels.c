/* bench_kernels.c — microbenchmark of the CPU backend at GPT-2 124M shapes.
 *
 * Times the matmul kernels against bare cblas_sgemm calls of the same shapes
 * (the difference is the wrapper's cost: bias broadcast, column sums) and the
 * kernels that are not GEMMs but touch much memory (crossentropy over the
 * vocabulary, AdamW over every parameter), so a regression in either shows
 * up as a number. Run it on an otherwise idle machine with
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./bench_kernels [reps] [adamw_elems]
 * GFLOP/s counts 2*M*N*K per GEMM; the backward does two GEMMs. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "zt_backend.h"
#include "zt_common.h"

static const zt_backend_t *be = &zt_backend_cpu;

static float *rnd(size_t n, float amp) { return bench_rnd(n, amp, 12345u); }

static void bench_matmul(const char *label, int N, int C, int OC, int transw, int bias, int reps)
{
    float *x = rnd((size_t)N * C, 1), *w = rnd((size_t)C * OC, 0.04f);
    float *b = bias ? rnd(OC, 0.1f) : NULL, *out = be->alloc((size_t)N * OC * 4);
    float *dout = rnd((size_t)N * OC, 1), *dx = be->alloc((size_t)N * C * 4);
    float *dw = be->alloc((size_t)C * OC * 4), *db = bias ? be->alloc(OC * 4) : NULL;
    double fl = 2.0 * N * C * OC, tf, tr, tb, trb;
    CBLAS_TRANSPOSE tw = transw ? CblasTrans : CblasNoTrans;
    int ldw = transw ? C : OC;
    BEST(reps, tf, be->matmul_forward(out, x, w, b, N, C, OC, transw));
    BEST(reps, tr, cblas_sgemm(CblasRowMajor, CblasNoTrans, tw, N, OC, C, 1.0f, x, C, w, ldw,
                               0.0f, out, OC));
    BEST(reps, tb, be->matmul_backward(dx, dw, db, dout, x, w, N, C, OC, transw));
    BEST(reps, trb, {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, transw ? CblasNoTrans : CblasTrans, N, C, OC,
                    1.0f, dout, OC, w, ldw, 1.0f, dx, C);
        if (transw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, x, C,
                        1.0f, dw, C);
        else
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, x, C, dout, OC,
                        1.0f, dw, OC);
    });
    printf("%-28s fwd %7.2f ms %6.1f GF/s (sgemm %6.1f) | bwd %7.2f ms %6.1f GF/s (sgemm %6.1f)\n",
           label, tf * 1e3, fl / tf * 1e-9, fl / tr * 1e-9, tb * 1e3, 2 * fl / tb * 1e-9,
           2 * fl / trb * 1e-9);
    float *bufs[] = {x, w, b, out, dout, dx, dw, db};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

/* Attention at GPT-2 124M heads over a range of T: the flash-style kernels keep
 * only lse (B,NH,T), so the longer sequences are where they must not lose. With
 * nseg > 0 each row packs nseg samples of T/nseg tokens (neat packing): a query
 * block's keys start at its segment, so packed rows should cost about nseg times
 * less than one causal sequence of T. With window > 0 a sliding window (mistral,
 * gemma3): each query block's keys start at its first row's window, so the cost
 * should grow with T * window, not T^2. */
static void bench_attention(int B, int T, int C, int NH, int NKV, int reps, int nseg, int window)
{
    const size_t N = (size_t)B * T, S = (size_t)(NH + 2 * NKV) * (C / NH); /* qkv row */
    float *qkv = rnd(N * S, 2), *out = be->alloc(N * C * 4), *lse = be->alloc(N * NH * 4);
    float *dqkv = be->alloc(N * S * 4), *dout = rnd(N * C, 1);
    int32_t *seg = nseg ? zt_malloc(N * sizeof *seg) : NULL;
    for (size_t i = 0; seg && i < N; i++) seg[i] = (int32_t)((i % (size_t)T) / (size_t)ZT_MAX(T / nseg, 1));
    double tf, tb;
    BEST(reps, tf, be->attention_forward(out, lse, qkv, seg, B, T, NH, NKV, C / NH, window));
    BEST(reps, tb, be->attention_backward(dqkv, dout, qkv, out, lse, seg, B, T, NH, NKV, C / NH, window));
    char packed[32] = "";
    if (nseg) snprintf(packed, sizeof packed, " packed %dx%d", nseg, T / nseg);
    if (window) snprintf(packed, sizeof packed, " window %d", window);
    if (NKV != NH) snprintf(packed + strlen(packed), sizeof packed - strlen(packed), " NKV%d", NKV);
    printf("attention B%d T%-4d C%d NH%d%s    fwd %8.3f ms | bwd %8.3f ms\n", B, T, C, NH, packed, tf * 1e3,
           tb * 1e3);
    float *bufs[] = {qkv, out, lse, dqkv, dout};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    free(seg);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    size_t nadam = argc > 2 ? (size_t)atoll(argv[2]) : 124475904; /* GPT-2 124M (padded V) */
    const int B = 4, T = 64, N = B * T, C = 768, NH = 12, V = 50257;
    printf("bench_kernels: N=%d C=%d V=%d, best of %d\n", N, C, V, reps);
    bench_matmul("qkv   256x768 @ 768x2304", N, C, 3 * C, 0, 1, reps);
    bench_matmul("fc    256x768 @ 768x3072", N, C, 4 * C, 0, 1, reps);
    bench_matmul("proj  256x3072 @ 3072x768", N, 4 * C, C, 0, 1, reps);
    bench_matmul("lm    256x768 @ (50257x768)^T", N, C, V, 1, 0, reps);

    double t;
    float *lg = rnd((size_t)N * V, 8), *lg2 = be->alloc((size_t)N * V * 4), *loss = be->alloc(N * 4);
    int32_t *tg = zt_malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
    BEST(reps, t, {
        memcpy(lg2, lg, (size_t)N * V * 4); /* outside the kernel, subtracted below */
    });
    double tcopy = t;
    BEST(reps, t, {
        memcpy(lg2, lg, (size_t)N * V * 4);
        be->crossentropy_fused(lg2, loss, tg, N, V, 1.0f / N);
    });
    printf("crossentropy_fused %dx%d      %7.2f ms (+ %.2f ms copy not counted)\n", N, V,
           (t - tcopy) * 1e3, tcopy * 1e3);
    be->free(lg), be->free(lg2), be->free(loss), free(tg);

    float *qkv = rnd((size_t)N * 3 * C, 2), *ao = be->alloc((size_t)N * C * 4);
    float *dqkv = be->alloc((size_t)N * 3 * C * 4), *dao = rnd((size_t)N * C, 1);
    for (int Ta = 64; Ta <= 1024; Ta *= 2) bench_attention(B, Ta, C, NH, NH, reps, 0, 0);
    for (int Ta = 256; Ta <= 1024; Ta *= 2) bench_attention(B, Ta, C, NH, NH, reps, 8, 0);
    bench_attention(B, 2048, C, NH, NH, reps, 0, 0);
    for (int Ta = 512; Ta <= 2048; Ta *= 2) bench_attention(B, Ta, C, NH, NH, reps, 0, 128);
    /* GQA, 3 query heads a KV head: tools/bench-lf.sh's Qwen3 (12 heads, 4 KV heads) */
    bench_attention(8, 448, C, NH, 4, reps, 0, 0);
    size_t ng = (size_t)N * 4 * C;
    float *gi = rnd(ng, 6), *go = be->alloc(ng * 4), *gd = rnd(ng, 1), *gdi = be->alloc(ng * 4);
    BEST(reps, t, be->gelu_forward(go, gi, ng));
    printf("gelu_forward  256x3072         %7.3f ms\n", t * 1e3);
    BEST(reps, t, be->gelu_backward(gdi, gi, gd, ng));
    printf("gelu_backward 256x3072         %7.3f ms\n", t * 1e3);
    float *lw = rnd(C, 1), *lb = rnd(C, 1), *mean = be->alloc(N * 4), *rstd = be->alloc(N * 4);
    float *ldw = be->alloc(C * 4), *ldb = be->alloc(C * 4);
    BEST(reps, t, be->layernorm_forward(ao, mean, rstd, qkv, lw, lb, N, C, 1e-5f));
    printf("layernorm_forward  256x768     %7.3f ms\n", t * 1e3);
    BEST(reps, t, be->layernorm_backward(dqkv, ldw, ldb, dao, qkv, lw, mean, rstd, N, C));
    printf("layernorm_backward 256x768     %7.3f ms\n", t * 1e3);
    float *bufs[] = {qkv, ao, dqkv, dao, gi, go, gd, gdi, lw, lb, mean, rstd, ldw, ldb};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);

    if (nadam > 0) {
        float *p = rnd(nadam, 1), *g = rnd(nadam, 1), *m = be->alloc(nadam * 4),
              *v = be->alloc(nadam * 4);
        long step = 1;
        BEST(reps, t, be->adamw(p, g, m, v, nadam, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step++));
        printf("adamw %zu elems          %7.1f ms (%.1f GB/s over p,g,m,v r + p,m,v w)\n", nadam,
               t * 1e3, 7.0 * 4 * nadam / t * 1e-9);
        BEST(reps, t, (void)be->sumsq(g, nadam));
        printf("sumsq %zu elems          %7.1f ms\n", nadam, t * 1e3);
        be->free(p), be->free(g), be->free(m), be->free(v);
    }
    return 0;
}
