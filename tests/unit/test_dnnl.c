/* test_dnnl.c — the CPU backend's bf16 GEMMs through oneDNN (src/zt_dnnl.c),
 * forced on with ZT_DNNL=force so that a processor without bf16 units tests the
 * same code (oneDNN runs its bf16 matmul on any ISA, slowly), and the fp32 path
 * bit-identical to plain OpenBLAS sgemm calls.
 *
 * The bound, derived (Higham, ch. 3), not fitted. Each product c = alpha sum_k
 * a_k b_k (+ bias) (+ c0) is computed from the bf16 roundings a' = a(1+e1),
 * b' = b(1+e2), |e| <= u = 2^-8 (bf16 keeps 8 significand bits, round to nearest
 * even), so |a'b' - ab| <= |a||b| (2u + u^2); then summed in fp32 in some order
 * with the scaling, the bias and c0: n = K + 3 terms at most, each carrying a
 * relative error <= gamma_n = n v / (1 - n v), v = 2^-24. Hence against the
 * exact (double) product of the fp32 operands
 *   |c - c_exact| <= S (2u + u^2) + gamma_n (S (1+u)^2 + |bias| + |c0|),
 * S = |alpha| sum_k |a_k||b_k|, and against OpenBLAS's fp32 result (itself
 * within gamma_n (S + |bias| + |c0|) of c_exact) the sum of both. Three checks
 * per output element: (1) that bound against fp32 sgemm, (2) the tight bound
 * gamma_n (S' + |bias| + |c0|) against the exact product of the bf16-rounded
 * operands (S' from a', b'): it holds only if the operands were rounded to
 * nearest as zt_bf16.h does, (3) bf16 is in effect: some element is further
 * from c_exact than any fp32 computation can be (gamma_n (S + ...)). */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/zt_dnnl.h"
#include "zt_backend.h"
#include "zt_bf16.h"
#include "zt_test.h"
#include "fused_gelu_check.h"

static const zt_backend_t *be = &zt_backend_cpu;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) /* uniform [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 4503599627370496.0 - 1.0;
}

static float *frand(size_t n, double amp)
{
    float *x = be->alloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) x[i] = (float)(amp * urand());
    return x;
}

static float *fcopy(const float *x, size_t n)
{
    float *y = be->alloc(n * sizeof(float) + 4);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double bf(float x) { return zt_bf16_to_f32(zt_bf16_from_f32(x)); }

typedef struct {
    long n, bad_fp32, bad_rounded, beyond_fp32;
} verdict_t;

/* checks c (M,N) [ldc] = alpha op(A) op(B) + bias + c0 (c0 NULL: overwrite), from the
 * fp32 operands, against the three bounds above; c32 is OpenBLAS's fp32 result */
static verdict_t check(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, const float *bias, const float *c0, const float *c,
                       const float *c32, int ldc)
{
    const double u = 1.0 / 256, v = 1.0 / 16777216, n = K + 3, gam = n * v / (1 - n * v);
    verdict_t r = {0, 0, 0, 0};
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ex = 0, exr = 0, S = 0, Sr = 0;
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                ex += (double)a * b, exr += bf(a) * bf(b);
                S += fabs((double)a * b), Sr += fabs(bf(a) * bf(b));
            }
            ex *= alpha, exr *= alpha, S *= fabs(alpha), Sr *= fabs(alpha);
            double add = 0, addabs = 0;
            if (bias) add += bias[j], addabs += fabs(bias[j]);
            if (c0) add += c0[(size_t)i * ldc + j], addabs += fabs(c0[(size_t)i * ldc + j]);
            ex += add, exr += add;
            const double got = c[(size_t)i * ldc + j], ref32 = c32[(size_t)i * ldc + j];
            const double b_exact = S * (2 * u + u * u) + gam * (S * (1 + u) * (1 + u) + addabs);
            const double b_fp32 = b_exact + gam * (S + addabs);
            r.n++;
            if (!(fabs(got - ref32) <= b_fp32)) r.bad_fp32++;
            if (!(fabs(got - exr) <= gam * (Sr + addabs))) r.bad_rounded++;
            if (fabs(got - ex) > gam * (S + addabs)) r.beyond_fp32++;
        }
    return r;
}

static void expect(const char *what, verdict_t r)
{
    if (r.bad_fp32 || r.bad_rounded || !r.beyond_fp32)
        printf("\n  %s: %ld elements, %ld outside the bf16 bound vs fp32, %ld outside the bound vs "
               "rounded operands, %ld beyond fp32 accuracy\n",
               what, r.n, r.bad_fp32, r.bad_rounded, r.beyond_fp32);
    CU_ASSERT(r.bad_fp32 == 0);
    CU_ASSERT(r.bad_rounded == 0);
    CU_ASSERT(r.beyond_fp32 > 0); /* bf16 really in effect */
}

/* zt_dnnl_gemm directly: every transpose pair, padded leading dimensions, bias,
 * accumulation, alpha; a repeated shape creates no primitive */
static void t_gemm(void)
{
    const int M = 19, N = 23, K = 301, pad = 5;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int mode = 0; mode < 3; mode++) { /* 0: plain, 1: bias + accumulate, 2: alpha */
                int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                float *A = frand((size_t)(ta ? K : M) * lda, 1.0), *B = frand((size_t)(tb ? N : K) * ldb, 2.0);
                float *bias = mode == 1 ? frand(N, 1.0) : NULL;
                float *c = frand((size_t)M * ldc, 3.0), *c0 = mode == 1 ? fcopy(c, (size_t)M * ldc) : NULL;
                float *c32 = fcopy(c, (size_t)M * ldc);
                float alpha = mode == 2 ? 0.125f : 1.0f;
                zt_dnnl_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, mode == 1, c, ldc);
                if (bias)
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) c32[(size_t)i * ldc + j] += bias[j];
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                            K, alpha, A, lda, B, ldb, mode == 1 ? 1.0f : 0.0f, c32, ldc);
                char what[64];
                snprintf(what, sizeof what, "ta %d tb %d mode %d", ta, tb, mode);
                expect(what, check(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, c0, c, c32, ldc));
                /* the same shape again: cached primitive, same bits */
                long before = zt_dnnl_primitives_created();
                float *c2 = c0 ? fcopy(c0, (size_t)M * ldc) : frand((size_t)M * ldc, 1.0);
                zt_dnnl_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, mode == 1, c2, ldc);
                CU_ASSERT(zt_dnnl_primitives_created() == before);
                for (int i = 0; i < M; i++) CU_ASSERT(memcmp(c2 + (size_t)i * ldc, c + (size_t)i * ldc, N * 4) == 0);
                float *bufs[] = {A, B, bias, c, c0, c32, c2};
                for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
            }
}

/* the backend's matmul_forward / matmul_backward under MEDIUM: forward with and
 * without bias, W (C,OC) and W^T (transw), dinp overwritten (garbage before),
 * dweight accumulated onto what it held, dbias as in fp32 */
static void run_backend(int transw, int with_bias)
{
    const int N = 24, C = 96, OC = 40;
    const size_t nx = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    float *x = frand(nx, 1), *w = frand(nw, 0.5), *b = with_bias ? frand(OC, 1) : NULL, *dy = frand(no, 1);
    float *out = frand(no, 1), *out32 = frand(no, 1);
    const int ldw = transw ? C : OC;
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
    be->matmul_forward(out32, x, w, b, N, C, OC, transw);
    be->set_matmul_precision(ZT_MATMUL_MEDIUM);
    be->matmul_forward(out, x, w, b, N, C, OC, transw);
    expect("forward", check(0, transw, N, OC, C, 1.0f, x, C, w, ldw, b, NULL, out, out32, OC));

    float *dx = frand(nx, 1), *dw = frand(nw, 1), *db = frand(OC, 1);
    float *dx32 = fcopy(dx, nx), *dw32 = fcopy(dw, nw), *db32 = fcopy(db, OC), *dw0 = fcopy(dw, nw);
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
    be->matmul_backward(dx32, dw32, b ? db32 : NULL, dy, x, w, N, C, OC, transw);
    be->set_matmul_precision(ZT_MATMUL_MEDIUM);
    be->matmul_backward(dx, dw, b ? db : NULL, dy, x, w, N, C, OC, transw);
    /* dinp (N,C) = dy (N,OC) @ W^T */
    expect("dinp", check(0, !transw, N, C, OC, 1.0f, dy, OC, w, ldw, NULL, NULL, dx, dx32, C));
    if (transw) /* dW (OC,C) += dy^T @ x */
        expect("dweight (transw)", check(1, 0, OC, C, N, 1.0f, dy, OC, x, C, NULL, dw0, dw, dw32, C));
    else /* dW (C,OC) += x^T @ dy */
        expect("dweight", check(1, 0, C, OC, N, 1.0f, x, C, dy, OC, NULL, dw0, dw, dw32, OC));
    CU_ASSERT(memcmp(db, db32, OC * 4) == 0); /* the bias gradient is fp32 column sums either way */
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
    float *bufs[] = {x, w, b, dy, out, out32, dx, dw, db, dx32, dw32, db32, dw0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

static void t_backend(void) { run_backend(0, 1); }
static void t_backend_nobias(void) { run_backend(0, 0); }
static void t_backend_transw(void) { run_backend(1, 0); }
static void t_backend_transw_bias(void) { run_backend(1, 1); }

/* fp32 (HIGHEST, and HIGH, which the CPU has no units for) is OpenBLAS exactly as
 * before this path existed: the same sgemm calls, so the same bits */
static void t_fp32_bits(void)
{
    const int N = 33, C = 70, OC = 50;
    const size_t nx = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    for (int level = ZT_MATMUL_HIGHEST; level <= ZT_MATMUL_HIGH; level++)
        for (int transw = 0; transw < 2; transw++) {
            be->set_matmul_precision(level);
            CU_ASSERT(strcmp(zt_cpu_gemm_path(), "fp32") == 0);
            float *x = frand(nx, 1), *w = frand(nw, 1), *b = frand(OC, 1), *dy = frand(no, 1);
            float *out = be->alloc(no * 4), *ref = be->alloc(no * 4);
            be->matmul_forward(out, x, w, b, N, C, OC, transw);
            for (int n = 0; n < N; n++) memcpy(ref + (size_t)n * OC, b, OC * 4);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, transw ? CblasTrans : CblasNoTrans, N, OC, C, 1.0f, x, C,
                        w, transw ? C : OC, 1.0f, ref, OC);
            CU_ASSERT(memcmp(out, ref, no * 4) == 0);
            float *dx = frand(nx, 1), *dw = frand(nw, 1), *dxr = be->alloc(nx * 4), *dwr = fcopy(dw, nw);
            be->matmul_backward(dx, dw, NULL, dy, x, w, N, C, OC, transw);
            if (transw) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dy, OC, w, C, 0.0f, dxr, C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dy, OC, x, C, 1.0f, dwr, C);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dy, OC, w, OC, 0.0f, dxr, C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, x, C, dy, OC, 1.0f, dwr, OC);
            }
            CU_ASSERT(memcmp(dx, dxr, nx * 4) == 0);
            CU_ASSERT(memcmp(dw, dwr, nw * 4) == 0);
            float *bufs[] = {x, w, b, dy, out, ref, dx, dw, dxr, dwr};
            for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
        }
}

/* attention under MEDIUM runs its inner GEMMs through oneDNN from several
 * threads at once: the result is the same with 1 and 2 threads (each (b,h) is
 * one thread's, in the same order), and close to fp32 (a loose sanity bound:
 * the softmax between the GEMMs has no simple a-priori bound here; the GEMMs
 * themselves are bounded above). seg: packed rows (the key ranges of query
 * blocks start inside the rounded k and v) */
/* x[0] from fp32 GEMMs, x[1] and x[2] from bf16 ones at 1 and 2 threads: the threads agree
 * bit for bit, bf16 differs from fp32 (oneDNN ran) and stays within 5% of its largest value */
static void check_bf16_runs(float *const x[3], size_t n)
{
    CU_ASSERT(memcmp(x[1], x[2], n * 4) == 0);
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(x[1][i] - x[0][i])), mx = fmax(mx, fabs(x[0][i]));
    CU_ASSERT(e > 0 && e < 0.05 * mx);
}

static void run_attention(const int32_t *seg)
{
    const int B = 2, T = 70, NH = 4, NKV = 2, HD = 16, qs = (NH + 2 * NKV) * HD, os = NH * HD;
    const size_t nq = (size_t)B * T * qs, no = (size_t)B * T * os, nl = (size_t)B * NH * T;
    float *qkv = frand(nq, 1), *dout = frand(no, 1);
    float *o[3], *l[3], *dq[3];
    for (int r = 0; r < 3; r++) { /* 0: fp32, 1: bf16 1 thread, 2: bf16 2 threads */
        o[r] = be->alloc(no * 4), l[r] = be->alloc(nl * 4), dq[r] = be->alloc(nq * 4);
        be->set_matmul_precision(r ? ZT_MATMUL_MEDIUM : ZT_MATMUL_HIGHEST);
        zt_cpu_set_threads(r == 2 ? 2 : 1);
        be->attention_forward(o[r], l[r], qkv, seg, B, T, NH, NKV, HD, 0);
        be->attention_backward(dq[r], dout, qkv, o[r], l[r], seg, B, T, NH, NKV, HD, 0);
    }
    zt_cpu_set_threads(1);
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
    check_bf16_runs(o, no);
    check_bf16_runs(dq, nq);
    for (int r = 0; r < 3; r++) be->free(o[r]), be->free(l[r]), be->free(dq[r]);
    be->free(qkv), be->free(dout);
}

static void t_attention(void) { run_attention(NULL); }

static void t_attention_packed(void)
{
    int32_t seg[2 * 70];
    for (int i = 0; i < 2 * 70; i++) seg[i] = 1 + (i % 70) / (23 - i / 70); /* 23- and 22-token samples */
    run_attention(seg);
}

/* ring attention's block kernels under MEDIUM: separate k|v rows (stride ks != qs), keys
 * Tk != queries Tq (non-causal) and a causal diagonal pair; the same checks as the full
 * kernels above: bf16 at 1 and 2 threads agree bit for bit, differ from fp32 (so the
 * bf16 GEMMs ran) and stay near it */
static void t_attention_blocks(void)
{
    const int B = 2, NH = 4, NKV = 2, HD = 16, S = (NH + 2 * NKV) * HD, Q = NH * HD, kw = 2 * NKV * HD;
    for (int causal = 0; causal < 2; causal++) {
        const int Tq = 40, Tk = causal ? Tq : 56;
        const size_t nq = (size_t)B * Tq * S, nkv = (size_t)B * Tk * kw, no = (size_t)B * Tq * Q;
        const size_t nl = (size_t)B * NH * Tq;
        float *q = frand(nq, 1.5), *kv = frand(nkv, 1.5), *dout = frand(no, 1);
        float *o[3], *l[3], *dq[3], *dkv[3];
        for (int r = 0; r < 3; r++) { /* 0: fp32, 1: bf16 1 thread, 2: bf16 2 threads */
            o[r] = be->alloc(no * 4), l[r] = be->alloc(nl * 4), dq[r] = be->alloc(nq * 4);
            dkv[r] = be->alloc(nkv * 4);
            be->set_matmul_precision(r ? ZT_MATMUL_MEDIUM : ZT_MATMUL_HIGHEST);
            zt_cpu_set_threads(r == 2 ? 2 : 1);
            be->attention_block_forward(o[r], l[r], q, S, kv, kv + NKV * HD, kw, NULL, NULL, B, Tq, Tk, NH, NKV, HD,
                                        causal, 0, 0);
            be->attention_block_backward(dq[r], dkv[r], dkv[r] + NKV * HD, dout, q, S, kv, kv + NKV * HD, kw, NULL,
                                         NULL, o[r], l[r], B, Tq, Tk, NH, NKV, HD, causal, 0, 0);
        }
        zt_cpu_set_threads(1);
        be->set_matmul_precision(ZT_MATMUL_HIGHEST);
        check_bf16_runs(o, no);
        check_bf16_runs(dq, nq);
        check_bf16_runs(dkv, nkv);
        for (int r = 0; r < 3; r++) be->free(o[r]), be->free(l[r]), be->free(dq[r]), be->free(dkv[r]);
        be->free(q), be->free(kv), be->free(dout);
    }
}

/* the fused GELU operations under bf16 GEMMs are still the operations they fuse,
 * bit for bit, with dpre written over act (the operands are rounded before dpre
 * is written: matmul_backward_bf16) */
static void run_matmul_gelu(int with_bias)
{
    be->set_matmul_precision(ZT_MATMUL_MEDIUM);
    check_matmul_gelu(be, with_bias, frand);
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
}

static void t_matmul_gelu(void) { run_matmul_gelu(1); }
static void t_matmul_gelu_nobias(void) { run_matmul_gelu(0); }

static void t_path(void)
{
    be->set_matmul_precision(ZT_MATMUL_MEDIUM);
    const char *p = zt_cpu_gemm_path();
    printf("\n  GEMMs under MEDIUM: %s\n", p);
    CU_ASSERT(strncmp(p, "bf16 (oneDNN", 12) == 0);
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
    CU_ASSERT(strcmp(zt_cpu_gemm_path(), "fp32") == 0);
}

/* zt_dnnl_view: a contiguous operand inside a registered view is not rounded again
 * (its bf16 copy, or on fp32-matmul oneDNN the view itself, goes to the GEMM) and the
 * product is bit for bit the one that rounds; strided, overhanging and withdrawn
 * operands are rounded as before. */
static void t_views(void)
{
    const int C = 24, OC = 40, N = 8;
    const size_t n = (size_t)3 * C * OC; /* three weights in one unit */
    uint16_t *h = malloc(n * sizeof *h);
    float *view = malloc(n * sizeof *view), *x = malloc((size_t)N * C * sizeof *x);
    float *y0 = malloc((size_t)N * OC * sizeof *y0), *y1 = malloc((size_t)N * OC * sizeof *y1);
    for (size_t i = 0; i < n; i++) h[i] = zt_bf16_from_f32((float)urand());
    be->from_bf16(view, h, n);
    for (int i = 0; i < N * C; i++) x[i] = (float)urand();
    const float *w = view + (size_t)C * OC; /* the second weight, (C, OC) */
    const int native = zt_dnnl_native_bf16();
    be->set_matmul_precision(ZT_MATMUL_MEDIUM);
    be->matmul_forward(y0, x, w, NULL, N, C, OC, 0); /* rounds w */
    long v0, r0, v1, r1;
    zt_dnnl_round_counts(&v0, &r0);
    be->bf16_view(1, view, h, n);
    const void *got = zt_dnnl_round(0, w, C, OC, OC);
    CU_ASSERT(got == (native ? (const void *)(h + (size_t)C * OC) : (const void *)w));
    be->matmul_forward(y1, x, w, NULL, N, C, OC, 0);
    CU_ASSERT(memcmp(y0, y1, (size_t)N * OC * sizeof *y0) == 0);
    zt_dnnl_round_counts(&v1, &r1);
    CU_ASSERT(v1 - v0 == 2); /* the round above and the forward's weight; its input rounded */
    CU_ASSERT(r1 - r0 == 1);
    /* rounded as before: a strided block (ld != cols), an operand running past the
     * view's end, and anything after the view is withdrawn */
    CU_ASSERT(zt_dnnl_round(0, w, C, OC / 2, OC) != (const void *)w);
    CU_ASSERT(zt_dnnl_round(0, view + n - 10, 1, 20, 20) != (const void *)(view + n - 10));
    be->bf16_view(1, NULL, NULL, 0);
    CU_ASSERT(zt_dnnl_round(0, w, C, OC, OC) != (const void *)w);
    zt_dnnl_round_counts(&v0, &r0);
    CU_ASSERT(v0 == v1 && r0 - r1 == 3);
    be->set_matmul_precision(ZT_MATMUL_HIGHEST);
    free(h), free(view), free(x), free(y0), free(y1);
}

static const zt_test_t tests[] = {
    {"GEMM path reported", t_path},
    {"oneDNN bf16 GEMM: transposes, ld, bias, accumulate, alpha within the derived bound", t_gemm},
    {"backend matmul W (C,OC) + bias, bf16", t_backend},
    {"backend matmul W (C,OC) no bias, bf16", t_backend_nobias},
    {"backend matmul W^T, bf16", t_backend_transw},
    {"backend matmul W^T + bias, bf16", t_backend_transw_bias},
    {"fp32 levels are OpenBLAS bit for bit", t_fp32_bits},
    {"attention bf16: threads agree, near fp32", t_attention},
    {"attention bf16 on packed rows: threads agree, near fp32", t_attention_packed},
    {"ring attention blocks bf16 (k|v apart, Tk != Tq): threads agree, near fp32", t_attention_blocks},
    {"matmul + gelu fused = composed, bf16, dpre over act", t_matmul_gelu},
    {"matmul + gelu fused = composed, bf16, no bias", t_matmul_gelu_nobias},
    {"bf16 views: weights read from their bf16 copy, bit for bit the rounding", t_views},
    {NULL, NULL},
};

int main(void)
{
    setenv("ZT_DNNL", "force", 1); /* before the first zt_dnnl_mode(): test the path on any CPU */
    zt_cpu_set_threads(1);
    if (zt_dnnl_mode() == ZT_DNNL_OFF) {
        printf("test_dnnl: built without oneDNN: skipped\n");
        return 77;
    }
    return zt_test_run("test_dnnl", tests);
}
