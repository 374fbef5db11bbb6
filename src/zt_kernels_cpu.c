/* zt_kernels_cpu.c — the CPU compute backend: OpenBLAS GEMMs and OpenMP loops.
 *
 * The GPT-2 step on a CPU is GEMM-bound, so every non-GEMM kernel here is
 * written to be a small fraction of the GEMM time: one pass (or as few as
 * possible) over memory, inner loops that gcc -O3 vectorizes without
 * -ffast-math. Floating-point reductions only vectorize when reassociation is
 * allowed, so they carry `#pragma omp simd reduction(...)`. exp (and GELU's
 * tanh, through it) is a branch-free polynomial (zt_expf below): glibc exposes
 * its vector math library to the compiler only under -ffast-math, and a scalar
 * expf over the (256, 50257) logits costs as much as a small GEMM.
 *
 * Semantics (accumulate vs overwrite, layouts) are those of zt_backend.h; the
 * AdamW update follows PyTorch's single-tensor AdamW operation by operation so
 * that a PyTorch fixture can be matched to rounding. */
#include "config.h" /* ZT_HAVE_DNNL */
#include <cblas.h>
#include <math.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <errno.h>

#include "zt_backend.h"
#include "zt_bf16.h"
#include "zt_common.h"
#include "zt_dnnl.h"
#include "zt_fp16.h"
#include "zt_quant.h"

/* Work below this many elements runs on one thread: a parallel region costs
 * microseconds, more than the loop itself for small vectors. */
#define ZT_PAR_MIN 32768

/* ---------------------------------------------------------------- helpers -- */

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Bitwise select: c ? a : b without a branch. gcc will not if-convert a float
 * ?: whose arms hold arithmetic (it might trap, under the default
 * -ftrapping-math), and a branch in the loop body stops vectorization. */
static inline float zt_sel(int c, float a, float b)
{
    uint32_t m = 0u - (uint32_t)(c != 0);
    return u2f((f2u(a) & m) | (f2u(b) & ~m));
}

/* exp(x) for x <= 88.7 (callers guarantee it: softmax arguments are <= 0),
 * ~2 ulp, branch-free so loops calling it vectorize. exp(x) = 2^n exp(r),
 * n = round(x / ln2), r = x - n ln2 with ln2 split in two constants
 * (Cody-Waite) so r is exact; exp(r) by a degree-6 polynomial on
 * |r| <= ln2/2. Below -87.33 (where 2^n leaves the normal range) the result
 * is masked to 0; there is deliberately no clamp, whose branch gcc would
 * thread into a constant-folded copy of the body and so stop vectorization. */
static inline float zt_expf(float x)
{
    const float lo = -87.33f;
    /* round-to-nearest by the 1.5*2^23 trick: no rintf call to block vectorization */
    const float magic = 12582912.0f;
    float t = x * 1.44269504088896341f + magic;
    float fn = t - magic;
    int32_t n = (int32_t)(f2u(t) - f2u(magic));
    float r = x - fn * 0.693359375f;   /* ln2 high part, exact product */
    r = r - fn * -2.12194440e-4f;      /* ln2 low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    float y = p * u2f((uint32_t)(n + 127) << 23);
    /* !(x < lo) keeps NaN inputs NaN */
    return zt_sel(!(x < lo), y, 0.0f);
}

/* ----------------------------------------------------------------- memory -- */

/* Large buffers come straight from mmap and go back with munmap: the kernel hands
 * out zeroed pages (no memset) and a freed buffer leaves no hole in the malloc
 * heap. Through malloc, the buffers the shard engine allocates and frees every
 * step fragmented the heap and peak RSS grew step after step. Every buffer has a
 * 64-byte header just before it recording how it was made.
 * The shard engine's transient buffers (a unit's gradients, its gathers) are freed and
 * mapped again every step, and each 4 KiB page costs a fault at first touch: about 3 us
 * on the 2-core VM of doc/performance.md, 24-32 ms to fault in a 28 MiB gradient buffer,
 * 2.7 ms in 2 MiB pages. On a pipeline the last stage's first backward of a step paid
 * 60-100 ms of them on the fill's critical path. So those mappings, 2 MiB or more, ask for
 * transparent huge pages (MADV_HUGEPAGE; Debian's THP mode, "madvise", grants them only on
 * request; advice, a no-op where THP is off). Long-lived buffers do not: mapped once,
 * their faults are paid once, and on that VM the first touch of fresh 2 MiB pages made a
 * run's first step 1.2-1.4x slower (design.md, memory behaviour). Peak RSS is unchanged:
 * every page of these buffers is written. */
#define CPU_HDR 64
#define CPU_PAGE ((size_t)4096)
#define CPU_MMAP_MIN ((size_t)1 << 20)
#define CPU_HUGE ((size_t)2 << 20)
typedef struct { size_t bytes; int mapped; } cpu_hdr_t;

static void *cpu_map(size_t bytes, int transient)
{
    if (bytes >= CPU_MMAP_MIN) {
        const size_t total = bytes + CPU_PAGE;
        char *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) zt_fatal("out of memory mapping %zu bytes: %s", bytes, strerror(errno));
        if (transient && total >= CPU_HUGE) (void)madvise(base, total, MADV_HUGEPAGE);
        char *p = base + CPU_PAGE; /* page-aligned user pointer, header in the first page */
        *(cpu_hdr_t *)(p - CPU_HDR) = (cpu_hdr_t){total, 1};
        return p;
    }
    char *base = zt_aligned_alloc(bytes + CPU_HDR);
    memset(base, 0, bytes + CPU_HDR);
    *(cpu_hdr_t *)base = (cpu_hdr_t){bytes + CPU_HDR, 0};
    return base + CPU_HDR;
}

static void *cpu_alloc(size_t bytes) { return cpu_map(bytes, 0); }
static void *cpu_alloc_transient(size_t bytes) { return cpu_map(bytes, 1); }

static void cpu_free(void *p)
{
    if (!p) return;
    cpu_hdr_t h = *(cpu_hdr_t *)((char *)p - CPU_HDR);
    if (h.mapped) {
        if (munmap((char *)p - CPU_PAGE, h.bytes) != 0) zt_fatal("munmap failed: %s", strerror(errno));
    } else {
        free((char *)p - CPU_HDR);
    }
}
static void cpu_memzero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void cpu_sync(void) {}

/* -------------------------------------------------------------- embedding -- */

static void cpu_embedding_forward(float *restrict out, const int32_t *restrict inp,
                                  const float *restrict wte, int N, int C)
{
    // out (N,C), wte (V,C)
#pragma omp parallel for if ((size_t)N * C >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        /* a negative id is another tp rank's vocabulary row: zeros, summed over tp */
        if (inp[n] < 0) memset(out + (size_t)n * C, 0, (size_t)C * sizeof(float));
        else memcpy(out + (size_t)n * C, wte + (size_t)inp[n] * C, (size_t)C * sizeof(float));
    }
}

static void cpu_embedding_backward(float *restrict dwte, const float *restrict dout,
                                   const int32_t *restrict inp, int N, int C)
{
    /* Serial on purpose: a token may repeat in the batch, so rows of dwte are
     * not disjoint; the work (N*C adds) is tiny next to the lm_head GEMM. */
    for (int n = 0; n < N; n++) {
        if (inp[n] < 0) continue;
        const float *restrict d = dout + (size_t)n * C;
        float *restrict dw = dwte + (size_t)inp[n] * C;
        for (int c = 0; c < C; c++) dw[c] += d[c];
    }
}

/* out = wte[inp] then += wpe[t] rounds exactly as the former fused
 * wte[inp] + wpe[t] (one float add either way), so GPT-2 is unchanged. */
static void cpu_positional_forward(float *restrict out, const float *restrict wpe,
                                   const int32_t *restrict positions, int B, int T, int C)
{
    // out (B,T,C) +=, wpe (maxT,C), positions (B,T) or NULL (= t)
#pragma omp parallel for collapse(2) if ((size_t)B * T * C >= ZT_PAR_MIN) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *restrict o = out + ((size_t)b * T + t) * C;
            const int p = positions ? positions[(size_t)b * T + t] : t;
            const float *restrict wp = wpe + (size_t)p * C;
            for (int c = 0; c < C; c++) o[c] += wp[c];
        }
}

/* Columns per thread task of the positional backward with positions */
#define POS_COLS 64

static void cpu_positional_backward(float *restrict dwpe, const float *restrict dout,
                                    const int32_t *restrict positions, int B, int T, int C)
{
    if (positions) {
        /* Packed rows repeat positions (every sample starts at 0), so the rows of
         * dwpe that threads would write are not disjoint by t: threads split the
         * channels instead, and each row of dwpe sums its tokens in (b, t) order,
         * the same order at any thread count. */
#pragma omp parallel for if ((size_t)B * T * C >= ZT_PAR_MIN) schedule(static)
        for (int c0 = 0; c0 < C; c0 += POS_COLS) {
            const int c1 = ZT_MIN(C, c0 + POS_COLS);
            for (size_t n = 0; n < (size_t)B * T; n++) {
                float *restrict dwp = dwpe + (size_t)positions[n] * C;
                const float *restrict d = dout + n * C;
                for (int c = c0; c < c1; c++) dwp[c] += d[c];
            }
        }
        return;
    }
    /* Each dwpe[t] sums its B rows in increasing b, the order of the former fused
     * encoder backward, so GPT-2's gradients keep their bits. Threads split t:
     * disjoint rows of dwpe. */
#pragma omp parallel for if ((size_t)B * T * C >= ZT_PAR_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        float *restrict dwp = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *restrict d = dout + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dwp[c] += d[c];
        }
    }
}

/* -------------------------------------------------------------- layernorm -- */

static void cpu_layernorm_forward(float *restrict out, float *restrict mean, float *restrict rstd,
                                  const float *restrict inp, const float *restrict weight,
                                  const float *restrict bias, int N, int C, float eps)
{
    // out (N,C), mean (N), rstd (N); bias may be NULL
#pragma omp parallel for if ((size_t)N * C >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *restrict x = inp + (size_t)n * C;
        float *restrict o = out + (size_t)n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += x[c];
        float m = s / C;
        float v = 0.0f;
        /* two passes: var from (x - m)^2, not E[x^2] - m^2, to avoid cancellation */
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        float rs = 1.0f / sqrtf(v / C + eps);
        /* two loops rather than a select in one, so each vectorizes */
        if (bias)
            for (int c = 0; c < C; c++) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
        else
            for (int c = 0; c < C; c++) o[c] = (x[c] - m) * rs * weight[c];
        mean[n] = m;
        rstd[n] = rs;
    }
}

/* One row of layernorm backward; dweight/dbias are the caller's accumulators
 * (db NULL: no bias). */
static inline void ln_backward_row(float *restrict dx, float *restrict dw, float *restrict db,
                                   const float *restrict dy, const float *restrict x,
                                   const float *restrict w, float m, float rs, int C)
{
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int c = 0; c < C; c++) {
        float norm = (x[c] - m) * rs;
        float dnorm = w[c] * dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    if (db)
        for (int c = 0; c < C; c++) db[c] += dy[c];
    for (int c = 0; c < C; c++) {
        float norm = (x[c] - m) * rs;
        float dnorm = w[c] * dy[c];
        dw[c] += norm * dy[c];
        dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs;
    }
}

static void cpu_layernorm_backward(float *restrict dinp, float *restrict dweight,
                                   float *restrict dbias, const float *restrict dout,
                                   const float *restrict inp, const float *restrict weight,
                                   const float *restrict mean, const float *restrict rstd, int N,
                                   int C)
{
    // dinp (N,C) +=, dweight (C) +=, dbias (C) += (or NULL)
    int par = (size_t)N * C >= ZT_PAR_MIN && omp_get_max_threads() > 1;
    if (!par) {
        for (int n = 0; n < N; n++)
            ln_backward_row(dinp + (size_t)n * C, dweight, dbias, dout + (size_t)n * C,
                            inp + (size_t)n * C, weight, mean[n], rstd[n], C);
        return;
    }
    /* Rows in parallel, each thread summing dweight/dbias privately, then one
     * reduction: a single pass over dout and inp instead of a second column pass. */
#pragma omp parallel
    {
        float *acc = zt_calloc(2 * (size_t)C, sizeof(float));
        float *dw = acc, *db = dbias ? acc + C : NULL;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++)
            ln_backward_row(dinp + (size_t)n * C, dw, db, dout + (size_t)n * C,
                            inp + (size_t)n * C, weight, mean[n], rstd[n], C);
#pragma omp critical(zt_ln_reduce)
        {
            for (int c = 0; c < C; c++) dweight[c] += dw[c];
            if (dbias)
                for (int c = 0; c < C; c++) dbias[c] += db[c];
        }
        free(acc);
    }
}

/* ---------------------------------------------------------------- rmsnorm -- */

/* As HF's LlamaRMSNorm: var = mean(x^2) in fp32 (a vectorized float sum, as
 * torch's float32 mean; D is a hidden size or a head size, so float holds the
 * sum of squares to ~1e-7 relative), out = w * (x * rstd) in that order. */
static void cpu_rmsnorm_forward(float *restrict out, float *restrict rstd,
                                const float *restrict inp, const float *restrict weight, int N,
                                int H, int D, int stride, float eps)
{
    // out, inp: N rows of stride `stride`, H groups of D at h*D ; rstd (N*H) ; weight (D)
#pragma omp parallel for collapse(2) if ((size_t)N * H * D >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            const float *restrict x = inp + (size_t)n * stride + (size_t)h * D;
            float *restrict o = out + (size_t)n * stride + (size_t)h * D;
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int c = 0; c < D; c++) ss += x[c] * x[c];
            float rs = 1.0f / sqrtf(ss / D + eps);
#pragma omp simd
            for (int c = 0; c < D; c++) o[c] = weight[c] * (x[c] * rs);
            rstd[(size_t)n * H + h] = rs;
        }
}

/* One group of rmsnorm backward. y = w x r, r = (mean(x^2) + eps)^-1/2:
 * dx = r (w dy) - x r^3 mean(w dy x) ; dw += dy x r. */
static inline void rms_backward_group(float *restrict dx, float *restrict dw,
                                      const float *restrict dy, const float *restrict x,
                                      const float *restrict w, float rs, int D)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < D; c++) s += w[c] * dy[c] * x[c];
    const float k = s / D * rs * rs * rs;
#pragma omp simd
    for (int c = 0; c < D; c++) {
        dw[c] += dy[c] * (x[c] * rs);
        dx[c] += w[c] * dy[c] * rs - x[c] * k;
    }
}

static void cpu_rmsnorm_backward(float *restrict dinp, float *restrict dweight,
                                 const float *restrict dout, const float *restrict inp,
                                 const float *restrict weight, const float *restrict rstd, int N,
                                 int H, int D, int stride)
{
    // dinp +=, dweight (D) +=, layout as the forward
    const size_t G = (size_t)N * H; /* groups, g = n*H + h */
    int par = G * D >= ZT_PAR_MIN && omp_get_max_threads() > 1;
    if (!par) {
        for (size_t g = 0; g < G; g++) {
            const size_t off = g / H * stride + g % H * D;
            rms_backward_group(dinp + off, dweight, dout + off, inp + off, weight, rstd[g], D);
        }
        return;
    }
    /* groups in parallel, dweight summed per thread then reduced (as layernorm) */
#pragma omp parallel
    {
        float *dw = zt_calloc((size_t)D, sizeof(float));
#pragma omp for schedule(static)
        for (size_t g = 0; g < G; g++) {
            const size_t off = g / H * stride + g % H * D;
            rms_backward_group(dinp + off, dw, dout + off, inp + off, weight, rstd[g], D);
        }
#pragma omp critical(zt_rms_reduce)
        for (int c = 0; c < D; c++) dweight[c] += dw[c];
        free(dw);
    }
}

/* ------------------------------------------------------------------- rope -- */

/* Rotary embedding, rotate_half convention, in place. The angle is the fp32 product
 * pos * inv_freq[i] as in HF (cos and sin of it in fp32, cosf/sinf), the same for a
 * row's H heads and for every row at that position, so each position's cos/sin row is
 * computed once per call into a (positions, D/2) table: rows repeat positions B times
 * (a packed batch's segments restart them), and the libm calls cost more than the
 * rotation itself. sign = +1 rotates by +a (forward), -1 by -a (backward: R(a)^T =
 * R(-a)). */
static void rope_apply(float *restrict x, const float *restrict inv_freq,
                       const int32_t *restrict positions, int B, int T, int H, int D, int stride,
                       float sign)
{
    const int half = D / 2;
    const size_t rows = (size_t)B * T;
    int npos = T; /* positions 0..npos-1 occur */
    if (positions)
        for (size_t r = 0; r < rows; r++) npos = ZT_MAX(npos, positions[r] + 1);
    float *cs = zt_malloc(2 * (size_t)npos * half * sizeof(float)), *sn = cs + (size_t)npos * half; // (npos, half) each
#pragma omp parallel for if ((size_t)npos * half >= ZT_PAR_MIN / 8) schedule(static)
    for (int p = 0; p < npos; p++)
        for (int i = 0; i < half; i++) {
            float a = (float)p * inv_freq[i];
            cs[(size_t)p * half + i] = cosf(a);
            sn[(size_t)p * half + i] = sign * sinf(a);
        }
#pragma omp parallel for if (rows * H * D >= ZT_PAR_MIN) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const size_t p = (size_t)(positions ? positions[r] : (int32_t)(r % T));
        const float *restrict c = cs + p * half, *restrict sr = sn + p * half;
        for (int h = 0; h < H; h++) {
            float *restrict x1 = x + r * stride + (size_t)h * D, *restrict x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float a1 = x1[i], a2 = x2[i];
                x1[i] = a1 * c[i] - a2 * sr[i];
                x2[i] = a2 * c[i] + a1 * sr[i];
            }
        }
    }
    free(cs);
}

static void cpu_rope_forward(float *restrict x, const float *restrict inv_freq,
                             const int32_t *restrict positions, int B, int T, int H, int D,
                             int stride)
{
    // x: B*T rows of stride `stride`, H heads of D at h*D ; inv_freq (D/2) ; positions (B*T) or NULL
    rope_apply(x, inv_freq, positions, B, T, H, D, stride, 1.0f);
}

static void cpu_rope_backward(float *restrict dx, const float *restrict inv_freq,
                              const int32_t *restrict positions, int B, int T, int H, int D,
                              int stride)
{
    rope_apply(dx, inv_freq, positions, B, T, H, D, stride, -1.0f);
}

/* ---------------------------------------------------------------- sigmoid -- */

/* sigmoid(x) from e = exp(-|x|) <= 1 (no overflow, zt_expf's range), as gelu_sig */
static inline float zt_sigmoid(float x)
{
    float e = zt_expf(-fabsf(x));
    float inv = 1.0f / (1.0f + e);
    return zt_sel(x >= 0.0f, inv, e * inv);
}

/* ----------------------------------------------------------------- matmul -- */

/* Where the GEMMs run: OpenBLAS sgemm (fp32), or oneDNN's bf16 matmul
 * (zt_dnnl.c) under ZT_MATMUL_MEDIUM on a processor with bf16 units, or with
 * ZT_DNNL=force. Set by set_matmul_precision; read by every GEMM below. The
 * fp32 calls are exactly those of before (same arguments, so the same bits). */
static int g_bf16_gemm = 0;
static const char *g_gemm_desc = "fp32";

/* C (M,N) = alpha op(A) op(B) + beta C, row-major; beta is 0 or 1 */
static inline void gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc)
{
    if (g_bf16_gemm)
        zt_dnnl_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, NULL, beta != 0.0f, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_matmul_forward(float *restrict out, const float *restrict inp,
                               const float *restrict weight, const float *restrict bias, int N,
                               int C, int OC, int transw)
{
    // out (N,OC) = inp (N,C) @ W ; W (C,OC), or (OC,C) used transposed
    if (g_bf16_gemm) {
        zt_dnnl_gemm(0, transw, N, OC, C, 1.0f, inp, C, weight, transw ? C : OC, bias, 0, out, OC);
        return;
    }
    float beta = 0.0f;
    if (bias) {
        /* The bias rows are written first and the GEMM accumulates onto them:
         * cheaper than a second pass over out after the GEMM. */
#pragma omp parallel for if ((size_t)N * OC >= ZT_PAR_MIN) schedule(static)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    if (N == 1) {
        /* one row (generation's next token): a matrix-vector product streams W once,
         * where sgemm would first copy all of it into its packed panels */
        if (transw) cblas_sgemv(CblasRowMajor, CblasNoTrans, OC, C, 1.0f, weight, C, inp, 1, beta, out, 1);
        else cblas_sgemv(CblasRowMajor, CblasTrans, C, OC, 1.0f, weight, OC, inp, 1, beta, out, 1);
        return;
    }
    if (transw)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                    beta, out, OC);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC,
                    beta, out, OC);
}

static void cpu_gemm(int ta, int tb, int M, int Nn, int K, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || Nn <= 0) return;
    gemm(ta, tb, M, Nn, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ----------------------------------------------------------- rank-r products -- */

/* y (N,O) += p (N,r) B^T at rank 8 (LoRA's B side), backward: dp = dy B and dB += dy^T p.
 * As two sgemm calls each is a product with one side 8 wide, and OpenBLAS packs the whole
 * (N,O) dy for each (twice over dy, plus the packing copies): 9-10 GFLOP/s on this job's
 * shapes, memory-bound. Here one pass over dy feeds both: a block of 8 rows keeps its 8
 * dp rows (8 floats, one AVX register each) in registers while it walks dy's columns j,
 * and each column's dB row takes the block's 8 rank-1 updates in two independent chains
 * before it goes back (an (O,8) dB stays in L2 for the next block). dB sums its rows in
 * another order than sgemm: the figures move at fp32 rounding. The row loops are unrolled by
 * pragma: only then do acc and pr live in registers. The default build's -O2 (configure's
 * CFLAGS come after AM_CFLAGS' -O3) left the rows loop rolled, acc[q] in memory with a load,
 * FMA and store per step and a branch on q's parity: about half the speed at this job's
 * shapes. */
#if defined(__AVX2__) && defined(__FMA__)
static inline __attribute__((always_inline)) void lowrank8_rows(int RB, int O, const float *restrict dy, int ldy,
                                                                const float *restrict B, const float *restrict p,
                                                                int ldp, float *restrict dp, int lddp,
                                                                float *restrict dB)
{
    __m256 acc[8], pr[8];
#pragma GCC unroll 8
    for (int q = 0; q < 8; q++) { /* all 8 set, so that no path reads an unset register */
        acc[q] = _mm256_setzero_ps();
        pr[q] = q < RB ? _mm256_loadu_ps(p + (size_t)q * ldp) : _mm256_setzero_ps();
    }
    for (int j = 0; j < O; j++) {
        const __m256 b = _mm256_loadu_ps(B + (size_t)j * 8);
        __m256 g0 = _mm256_setzero_ps(), g1 = _mm256_setzero_ps();
#pragma GCC unroll 8
        for (int q = 0; q < RB; q++) {
            const __m256 d = _mm256_broadcast_ss(dy + (size_t)q * ldy + j);
            acc[q] = _mm256_fmadd_ps(d, b, acc[q]);
            if (q & 1) g1 = _mm256_fmadd_ps(d, pr[q], g1);
            else g0 = _mm256_fmadd_ps(d, pr[q], g0);
        }
        if (dB) _mm256_storeu_ps(dB + (size_t)j * 8, _mm256_add_ps(_mm256_loadu_ps(dB + (size_t)j * 8),
                                                                   _mm256_add_ps(g0, g1)));
    }
#pragma GCC unroll 8
    for (int q = 0; q < RB; q++) _mm256_storeu_ps(dp + (size_t)q * lddp, acc[q]);
}
#endif

static void cpu_lowrank_backward(int N, int O, int r, const float *dy, int ldy, const float *B, const float *p,
                                 int ldp, float *dp, int lddp, float *dB)
{
#if defined(__AVX2__) && defined(__FMA__)
    /* rank 8, fp32 GEMMs, one thread (with more, sgemm's own threads) */
    if (r == 8 && !g_bf16_gemm && omp_get_max_threads() == 1) {
        int n0 = 0;
        for (; n0 + 8 <= N; n0 += 8)
            lowrank8_rows(8, O, dy + (size_t)n0 * ldy, ldy, B, p + (size_t)n0 * ldp, ldp, dp + (size_t)n0 * lddp,
                          lddp, dB);
        if (n0 < N)
            lowrank8_rows(N - n0, O, dy + (size_t)n0 * ldy, ldy, B, p + (size_t)n0 * ldp, ldp,
                          dp + (size_t)n0 * lddp, lddp, dB);
        return;
    }
#endif
    gemm(0, 0, N, r, O, 1.0f, dy, ldy, B, r, 0.0f, dp, lddp);
    if (dB) gemm(1, 0, O, r, N, 1.0f, dy, ldy, p, ldp, 1.0f, dB, r);
}

/* dinp (N,C) = dout (N,OC) @ W^T, overwritten (beta = 0) */
static void matmul_dinp(float *restrict dinp, const float *restrict dout,
                        const float *restrict weight, int N, int C, int OC, int transw)
{
    if (transw) /* W (OC,C) as stored */
        gemm(0, 0, N, C, OC, 1.0f, dout, OC, weight,
                    C, 0.0f, dinp, C);
    else /* W (C,OC) transposed */
        gemm(0, 1, N, C, OC, 1.0f, dout, OC, weight, OC,
                    0.0f, dinp, C);
}

/* the parameter gradients, accumulated: dW += (inp^T @ dout, or its transpose) ;
 * dbias += colsum(dout) when dbias */
static void matmul_dparams(float *restrict dweight, float *restrict dbias,
                           const float *restrict dout, const float *restrict inp, int N, int C,
                           int OC, int transw)
{
    if (!dweight) /* a frozen weight (LoRA's base), or the bias gradient alone */
        ;
    else if (transw) /* dW (OC,C) += dout^T @ inp */
        gemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C,
                    1.0f, dweight, C);
    else /* dW (C,OC) += inp^T @ dout */
        gemm(1, 0, C, OC, N, 1.0f, inp, C, dout, OC,
                    1.0f, dweight, OC);
    if (dbias) {
        /* column sums: parallel over column blocks so threads never share a dbias element */
        const int blk = 256;
        int nblk = ZT_CEIL_DIV(OC, blk);
#pragma omp parallel for if ((size_t)N * OC >= ZT_PAR_MIN) schedule(static)
        for (int ib = 0; ib < nblk; ib++) {
            int c0 = ib * blk, c1 = ZT_MIN(OC, c0 + blk);
            for (int n = 0; n < N; n++) {
                const float *restrict d = dout + (size_t)n * OC;
                for (int c = c0; c < c1; c++) dbias[c] += d[c];
            }
        }
    }
}

/* The backward under bf16 GEMMs: each operand rounded once for both products
 * (dout feeds dinp and dweight, like the stored weight and input, which are
 * rounded before dinp is written, so dinp may alias inp as in the fused GELU
 * backward); dbias stays fp32 column sums. */
static void matmul_backward_bf16(float *dinp, float *dweight, float *restrict dbias,
                                 const float *restrict dout, const float *inp,
                                 const float *restrict weight, int N, int C, int OC, int transw)
{
    const void *dr = zt_dnnl_round(2, dout, N, OC, OC);
    /* a frozen weight (LoRA's base) needs neither its input rounded nor its GEMM */
    const void *xr = dweight ? zt_dnnl_round(3, inp, N, C, C) : NULL;
    if (dinp) {
        const void *wr = transw ? zt_dnnl_round(4, weight, OC, C, C) : zt_dnnl_round(4, weight, C, OC, OC);
        zt_dnnl_gemm_rounded(0, !transw, N, C, OC, 1.0f, dr, wr, NULL, 0, dinp, C);
    }
    if (!dweight)
        ;
    else if (transw) /* dW (OC,C) += dout^T @ inp */
        zt_dnnl_gemm_rounded(1, 0, OC, C, N, 1.0f, dr, xr, NULL, 1, dweight, C);
    else /* dW (C,OC) += inp^T @ dout */
        zt_dnnl_gemm_rounded(1, 0, C, OC, N, 1.0f, xr, dr, NULL, 1, dweight, OC);
    if (dbias) matmul_dparams(NULL, dbias, dout, NULL, N, C, OC, transw);
}

static void cpu_matmul_backward(float *restrict dinp, float *restrict dweight,
                                float *restrict dbias, const float *restrict dout,
                                const float *restrict inp, const float *restrict weight, int N,
                                int C, int OC, int transw)
{
    // dout (N,OC), inp (N,C); dinp is overwritten, the parameter gradients accumulate
    if (g_bf16_gemm) {
        matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight, N, C, OC, transw);
        return;
    }
    if (dinp) matmul_dinp(dinp, dout, weight, N, C, OC, transw);
    matmul_dparams(dweight, dbias, dout, inp, N, C, OC, transw);
}

/* -------------------------------------------------------------- attention -- */

/* Flash-style on the CPU: queries go in blocks of bq rows, and a block's scores
 * against the keys it can see (0 .. its last row) are one small GEMM into a
 * per-thread (bq, T) scratch. Memory is O(threads * bq * T) instead of
 * (B,NH,T,T), and the masked upper triangle is only computed inside the
 * diagonal block: (1/2 + bq/2T) of the QK^T and PV flops of a full T x T
 * product. A block holds each row's whole masked score row, so the softmax is
 * the exact two-pass one (max, then exp-sum) and needs no online rescaling;
 * backward recomputes the same scores with the same GEMM shapes and turns them
 * into probabilities with the saved log-sum-exp. Small GEMMs beat scalar dot
 * loops by ~10x; OpenBLAS runs each on one thread at these sizes, so (b,h)
 * pairs are spread over OpenMP threads.
 * Packed rows (seg, neat packing): a block's keys start at the first key any of
 * its queries can see (the start of its first row's segment), not at 0, so a
 * row of short samples computes about their own triangles and not the whole
 * row's; inside that range keys of other segments are masked to -inf before
 * the softmax (exp gives exact zeros). Without seg the range starts at 0 and
 * every operation is the one of plain causal attention. */

/* Rows per query block: T/4 in [32, 128]. Smaller blocks compute less of the
 * masked triangle but make more GEMM calls (~1 us each at these sizes); this
 * rule was the fastest of 16/32/64/128 at every T from 64 to 1024 (figures in
 * doc/performance.md). */
static int att_block_rows(int T) { return ZT_MAX(32, ZT_MIN(128, T / 4)); }

typedef struct att_head {
    const float *q, *k, *v;     /* (T,hs) q (row stride qs), (Tk,hs) k and v (row stride ks) */
    const float *out, *dout;    /* (T,hs) views, row stride os */
    float *o;                   /* forward output view, row stride os */
    float *dq, *dk, *dv;        /* dq row stride qs, dk and dv ks */
    const float *lse;           /* (T) backward reads it */
    float *lse_out;             /* (T) forward writes it */
    const int32_t *seg;         /* (T) this row's segment ids, NULL: plain causal */
    const int32_t *kseg;        /* (Tk) the keys' (seg itself but for ring blocks) */
    const int32_t *lo;          /* (T) with seg: the first key of each query's segment */
    int T, qs, os, hs, bq;      /* qs = (NH+2NKV)*HD, os = NH*HD (3C, C for GPT-2); bq: rows per query block */
    int Tk, ks;                 /* keys; their row stride (ks = qs, Tk = T: one packed qkv) */
    int causal;                 /* row t sees keys 0..t (same positions), else every key (ring blocks) */
    int window, wdelta;         /* > 0: row t (wdelta + t positions after key 0) sees keys wdelta + t - window + 1 .. */
    float scale;
} att_head_t;

/* keys k0.. a query block sees: its causal prefix, or the rest of a ring block's keys */
static int att_keys(const att_head_t *a, int t0, int nb, int k0) { return a->causal ? t0 + nb - k0 : a->Tk - k0; }

/* A query block that sees none of a ring block's keys (its window ends before them):
 * out 0 and lse -inf, as a row that sees none in att_softmax_rows */
static void att_empty_rows(const att_head_t *a, int t0, int nb)
{
    for (int r = 0; r < nb; r++) {
        a->lse_out[t0 + r] = -INFINITY;
        memset(a->o + (size_t)(t0 + r) * a->os, 0, (size_t)a->hs * sizeof(float));
    }
}

/* First key query t can see by the window alone (Tk and beyond: none of the block's) */
static int att_window0(const att_head_t *a, int t)
{
    return a->window ? ZT_MIN(a->Tk, ZT_MAX(0, a->wdelta + t - a->window + 1)) : 0;
}

/* First key the queries t0 .. t0+nb-1 can see: 0, or the earliest start of their
 * segments and windows (the first row's window starts first) */
static int att_key0(const att_head_t *a, int t0, int nb)
{
    if (!a->seg || !a->lo) return att_window0(a, t0); /* a ring block: its first key, or its first row's window */
    int k0 = ZT_MAX(a->lo[t0], att_window0(a, t0));
    for (int r = 1; r < nb; r++) k0 = ZT_MIN(k0, ZT_MAX(a->lo[t0 + r], att_window0(a, t0 + r)));
    return k0;
}

/* Scores of keys k0 .. k0+n-1 that row t's window has left behind: -inf (exp gives exact
 * zeros; a ring block's row may lose them all) */
static void att_window_row(const att_head_t *a, int t, int k0, int n, float *restrict row)
{
    const int m = ZT_MIN(att_window0(a, t) - k0, n);
    for (int j = 0; j < m; j++) row[j] = -INFINITY;
}

/* Scores of keys k0 .. k0+n-1 in row (query t) that belong to another segment: -inf. A
 * query of segment -s (padding) sees the keys of segment s, so no query sees a key of a
 * negative segment (zt_backend.h) */
static void att_mask_row(const att_head_t *a, int t, int k0, int n, float *restrict row)
{
    const int32_t st = abs(a->seg[t]), *restrict sk = a->kseg + k0;
#pragma omp simd
    for (int j = 0; j < n; j++) row[j] = sk[j] != st ? -INFINITY : row[j];
}

/* A query block's rows of the forward (fp32 and bf16 GEMMs alike): the scores S (nb, nk)
 * of keys k0 .. k0+nk-1 become the causally masked softmax in place (keys k0..t of row
 * t, less other segments' keys), and each row's log-sum-exp goes to lse_out. */
static void att_softmax_rows(const att_head_t *a, int t0, int nb, int k0, int nk, float *restrict S)
{
    for (int r = 0; r < nb; r++) {
        float *restrict row = S + (size_t)r * nk;
        const int n = a->causal ? t0 + r + 1 - k0 : nk; /* keys k0..t */
        if (a->seg) att_mask_row(a, t0 + r, k0, n, row);
        if (a->window) att_window_row(a, t0 + r, k0, n, row);
        float mx = -INFINITY; /* finite but in a ring block of other segments: key t is seen */
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
        if (mx == -INFINITY) { /* a ring block none of whose keys this query sees */
            a->lse_out[t0 + r] = -INFINITY;
            for (int j = 0; j < nk; j++) row[j] = 0.0f;
            continue;
        }
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < n; j++) {
            float e = zt_expf(row[j] - mx);
            row[j] = e;
            s += e;
        }
        a->lse_out[t0 + r] = mx + logf(s);
        const float inv = 1.0f / s;
#pragma omp simd
        for (int j = 0; j < n; j++) row[j] *= inv;
        for (int j = n; j < nk; j++) row[j] = 0.0f;
    }
}

/* GQA: the NH/NKV query heads of one KV group see the same keys and values, so the
 * fp32 kernels take G of them at once and stack their query blocks: head j's rows
 * t0 .. t0+nb-1 are rows j nb .. (j+1) nb - 1 of one (G nb, hs) operand. One GEMM then
 * computes the group's scores against K (and in backward its dP against V), one its
 * P V, and backward's dK and dV sum the group's heads inside one product of depth G nb
 * instead of G accumulating products of depth nb: a third of the GEMM calls at 3 heads a
 * group, each 3x taller, and (G-1)/G fewer read-modify-write passes over dK, dV. The
 * stacked rows per block stay about those of one head's block (att_group_rows), so the
 * scratch does not grow, and the blocks get shorter: the masked part of the diagonal
 * block, computed and thrown away, shrinks by G. A query row's head sits at its own
 * column offset in the qkv rows, so the stacked operand is a copy (G nb hs floats, next
 * to the block's G nb nk multiply-adds); with G = 1 (GPT-2, MHA) nothing is copied and
 * the GEMMs are those of one head. */

/* The stacked operand of a group's query block: rows t0 .. t0+nb-1 of each head's q
 * (dout: its dout) one under the other in X (G nb, hs); with G = 1 the head's rows
 * themselves. *ldx: the row stride of what is returned. */
static const float *att_stack(const att_head_t *a, int G, int dout, int t0, int nb, float *restrict X, int *ldx)
{
    const int hs = a->hs, ld = dout ? a->os : a->qs;
    if (G == 1) {
        *ldx = ld;
        return (dout ? a->dout : a->q) + (size_t)t0 * ld;
    }
    for (int j = 0; j < G; j++) {
        const float *x = dout ? a[j].dout : a[j].q;
        for (int r = 0; r < nb; r++)
            memcpy(X + ((size_t)j * nb + r) * hs, x + (size_t)(t0 + r) * ld, (size_t)hs * sizeof(float));
    }
    *ldx = hs;
    return X;
}

/* A group's G heads forward: for each query block, S (G nb, nk) = scale Qs K^T, each
 * head's masked softmax (with lse), then Os = P V into each head's output rows. S is
 * the thread's (G bq, Tk) scratch, X its (G bq, hs) one. */
static void att_forward_group(const att_head_t *a, int G, float *restrict S, float *restrict X)
{
    const int T = a->T, KS = a->ks, hs = a->hs, os = a->os;
    for (int t0 = 0; t0 < T; t0 += a->bq) {
        const int nb = ZT_MIN(a->bq, T - t0), k0 = att_key0(a, t0, nb), nk = att_keys(a, t0, nb, k0); /* rows, keys */
        if (nk <= 0) {
            for (int j = 0; j < G; j++) att_empty_rows(&a[j], t0, nb);
            continue;
        }
        int ldq;
        const float *qb = att_stack(a, G, 0, t0, nb, X, &ldq);
        gemm(0, 1, G * nb, nk, hs, a->scale, qb, ldq, a->k + (size_t)k0 * KS, KS, 0.0f, S, nk);
        for (int j = 0; j < G; j++) att_softmax_rows(&a[j], t0, nb, k0, nk, S + (size_t)j * nb * nk);
        if (G == 1) {
            gemm(0, 0, nb, hs, nk, 1.0f, S, nk, a->v + (size_t)k0 * KS, KS, 0.0f, a->o + (size_t)t0 * os, os);
            continue;
        }
        gemm(0, 0, G * nb, hs, nk, 1.0f, S, nk, a->v + (size_t)k0 * KS, KS, 0.0f, X, hs);
        for (int j = 0; j < G; j++)
            for (int r = 0; r < nb; r++)
                memcpy(a[j].o + (size_t)(t0 + r) * os, X + ((size_t)j * nb + r) * hs, (size_t)hs * sizeof(float));
    }
}

/* A query block's rows of the backward (fp32 and bf16 GEMMs alike): S (scores of keys
 * k0 .. k0+nk-1) becomes P = exp(S - lse), dS (dO V^T) becomes P (dP - D) scale with
 * D = dO . O per row, and the masked tail of each row is zeroed for the accumulating
 * GEMMs (other segments' keys: p = exp(-inf) = 0, so ds = 0 too). */
static void att_ds_rows(const att_head_t *a, int t0, int nb, int k0, int nk, float *restrict S,
                        float *restrict dS, const float *restrict dyb)
{
    const int C = a->os, hs = a->hs;
    const float scale = a->scale;
    for (int r = 0; r < nb; r++) {
        float *restrict p = S + (size_t)r * nk, *restrict ds = dS + (size_t)r * nk;
        const float *restrict dy = dyb + (size_t)r * C;
        const float *restrict y = a->out + (size_t)(t0 + r) * C;
        const int n = a->causal ? t0 + r + 1 - k0 : nk;
        const float l = a->lse[t0 + r];
        if (a->seg) att_mask_row(a, t0 + r, k0, n, p);
        if (a->window) att_window_row(a, t0 + r, k0, n, p);
        float D = 0.0f;
#pragma omp simd reduction(+ : D)
        for (int i = 0; i < hs; i++) D += dy[i] * y[i];
        /* s - lse <= 0 up to rounding: within zt_expf's range */
#pragma omp simd
        for (int j = 0; j < n; j++) {
            float pj = zt_expf(p[j] - l);
            p[j] = pj;
            ds[j] = pj * (ds[j] - D) * scale;
        }
        for (int j = n; j < nk; j++) p[j] = ds[j] = 0.0f;
    }
}

/* The same under bf16 GEMMs, each operand rounded once: the head's q, k, v
 * (and dout in backward) per head, a block's P (and dS) per block, instead of
 * once per product (zt_dnnl_round slots: 0 dout, 1 P, 2 q, 3 k, 4 v, 5 dS).
 * The rounded values, the GEMM shapes and so the results are those of the
 * generic path. */
#define ATT_AT(p, i) ((const void *)((const char *)(p) + (size_t)(i) * esz))
static void att_forward_head_bf16(const att_head_t *a, float *restrict S)
{
    const int T = a->T, C3 = a->qs, hs = a->hs;
    const size_t esz = zt_dnnl_native_bf16() ? 2 : 4;
    const void *qr = zt_dnnl_round(2, a->q, T, hs, C3), *kr = zt_dnnl_round(3, a->k, a->Tk, hs, a->ks);
    const void *vr = zt_dnnl_round(4, a->v, a->Tk, hs, a->ks);
    for (int t0 = 0; t0 < T; t0 += a->bq) {
        const int nb = ZT_MIN(a->bq, T - t0), k0 = att_key0(a, t0, nb), nk = att_keys(a, t0, nb, k0);
        if (nk <= 0) {
            att_empty_rows(a, t0, nb);
            continue;
        }
        const void *kb = ATT_AT(kr, (size_t)k0 * hs), *vb = ATT_AT(vr, (size_t)k0 * hs);
        zt_dnnl_gemm_rounded(0, 1, nb, nk, hs, a->scale, ATT_AT(qr, (size_t)t0 * hs), kb, NULL, 0, S, nk);
        att_softmax_rows(a, t0, nb, k0, nk, S);
        const void *pr = zt_dnnl_round(1, S, nb, nk, nk);
        zt_dnnl_gemm_rounded(0, 0, nb, hs, nk, 1.0f, pr, vb, NULL, 0, a->o + (size_t)t0 * a->os, a->os);
    }
}

static void att_backward_head_bf16(const att_head_t *a, float *restrict S, float *restrict dS)
{
    const int T = a->T, C = a->os, C3 = a->qs, hs = a->hs;
    const float scale = a->scale;
    const size_t esz = zt_dnnl_native_bf16() ? 2 : 4;
    const void *qr = zt_dnnl_round(2, a->q, T, hs, C3), *kr = zt_dnnl_round(3, a->k, a->Tk, hs, a->ks);
    const void *vr = zt_dnnl_round(4, a->v, a->Tk, hs, a->ks), *dyr = zt_dnnl_round(0, a->dout, T, hs, C);
    for (int t0 = 0; t0 < T; t0 += a->bq) {
        const int nb = ZT_MIN(a->bq, T - t0), k0 = att_key0(a, t0, nb), nk = att_keys(a, t0, nb, k0);
        if (nk <= 0) continue; /* none of the block's keys: no gradient */
        const float *dyb = a->dout + (size_t)t0 * C;
        const void *qbr = ATT_AT(qr, (size_t)t0 * hs), *dybr = ATT_AT(dyr, (size_t)t0 * hs);
        const void *kb = ATT_AT(kr, (size_t)k0 * hs), *vb = ATT_AT(vr, (size_t)k0 * hs);
        zt_dnnl_gemm_rounded(0, 1, nb, nk, hs, scale, qbr, kb, NULL, 0, S, nk);
        zt_dnnl_gemm_rounded(0, 1, nb, nk, hs, 1.0f, dybr, vb, NULL, 0, dS, nk);
        att_ds_rows(a, t0, nb, k0, nk, S, dS, dyb);
        const void *pr = zt_dnnl_round(1, S, nb, nk, nk), *dsr = zt_dnnl_round(5, dS, nb, nk, nk);
        zt_dnnl_gemm_rounded(0, 0, nb, hs, nk, 1.0f, dsr, kb, NULL, 1, a->dq + (size_t)t0 * C3, C3);
        zt_dnnl_gemm_rounded(1, 0, nk, hs, nb, 1.0f, dsr, qbr, NULL, 1, a->dk + (size_t)k0 * a->ks, a->ks);
        zt_dnnl_gemm_rounded(1, 0, nk, hs, nb, 1.0f, pr, dybr, NULL, 1, a->dv + (size_t)k0 * a->ks, a->ks);
    }
}
#undef ATT_AT

/* A group's G heads backward, per query block: S = scale Qs K^T and dP = dOs V^T for
 * the stacked heads (one GEMM each), P recomputed from S and each head's lse, dS = P
 * (dP - D) scale in place of dP, then dQ += dS K (into each head's rows), dK += dS^T Qs
 * and dV += P^T dOs. S, dS are the thread's two (G bq, Tk) scratches, X three (G bq, hs)
 * ones (stacked Q, dO, dQ). */
static void att_backward_group(const att_head_t *a, int G, float *restrict S, float *restrict dS, float *restrict X)
{
    const int T = a->T, C = a->os, C3 = a->qs, KS = a->ks, hs = a->hs;
    const size_t xs = (size_t)G * a->bq * hs;
    for (int t0 = 0; t0 < T; t0 += a->bq) {
        const int nb = ZT_MIN(a->bq, T - t0), k0 = att_key0(a, t0, nb), nk = att_keys(a, t0, nb, k0);
        if (nk <= 0) continue; /* none of the block's keys: no gradient */
        const float *kb = a->k + (size_t)k0 * KS, *vb = a->v + (size_t)k0 * KS;
        int ldq, ldy;
        const float *qb = att_stack(a, G, 0, t0, nb, X, &ldq);
        const float *dyb = att_stack(a, G, 1, t0, nb, X + xs, &ldy);
        gemm(0, 1, G * nb, nk, hs, a->scale, qb, ldq, kb, KS, 0.0f, S, nk);
        gemm(0, 1, G * nb, nk, hs, 1.0f, dyb, ldy, vb, KS, 0.0f, dS, nk);
        for (int j = 0; j < G; j++)
            att_ds_rows(&a[j], t0, nb, k0, nk, S + (size_t)j * nb * nk, dS + (size_t)j * nb * nk,
                        a[j].dout + (size_t)t0 * C);
        // dq_blk (G nb,hs) += dS @ K ; dK (nk,hs) += dS^T @ Q_blk ; dV (nk,hs) += P^T @ dO_blk
        if (G == 1) {
            gemm(0, 0, nb, hs, nk, 1.0f, dS, nk, kb, KS, 1.0f, a->dq + (size_t)t0 * C3, C3);
        } else {
            float *dqs = X + 2 * xs;
            gemm(0, 0, G * nb, hs, nk, 1.0f, dS, nk, kb, KS, 0.0f, dqs, hs);
            for (int j = 0; j < G; j++)
                for (int r = 0; r < nb; r++) {
                    float *restrict dq = a[j].dq + (size_t)(t0 + r) * C3;
                    const float *restrict src = dqs + ((size_t)j * nb + r) * hs;
#pragma omp simd
                    for (int i = 0; i < hs; i++) dq[i] += src[i];
                }
        }
        gemm(1, 0, nk, hs, G * nb, 1.0f, dS, nk, qb, ldq, 1.0f, a->dk + (size_t)k0 * KS, KS);
        gemm(1, 0, nk, hs, G * nb, 1.0f, S, nk, dyb, ldy, 1.0f, a->dv + (size_t)k0 * KS, KS);
    }
}

/* lo (B,T) for segments seg (B,T): per query the first key of its row with the same
 * segment id (a padding query of -s: of s; none before it: t), where its visible keys
 * start. A packed row's segments are runs, and a run continues its predecessor's value;
 * a new run looks back for an earlier run of the same id (none in packed rows), so any
 * ids work: O(T x runs) per row. */
static int32_t *att_segment_starts(const int32_t *seg, int B, int T)
{
    int32_t *lo = zt_malloc((size_t)B * T * sizeof *lo);
    for (int b = 0; b < B; b++) {
        const int32_t *s = seg + (size_t)b * T;
        int32_t *l = lo + (size_t)b * T;
        for (int t = 0; t < T; t++) {
            if (t > 0 && s[t] == s[t - 1]) {
                l[t] = l[t - 1];
                continue;
            }
            int j = 0;
            while (j < t && s[j] != abs(s[t])) j++;
            l[t] = j;
        }
    }
    return lo;
}

/* Every head forward (dqkv == NULL) or backward, in parallel when the work is
 * worth a parallel region; each thread has its own block scratch. Forward runs
 * the (b,h) query heads in parallel. Backward runs the (b,g) KV heads in
 * parallel, each thread doing the NH/NKV query heads of its group in turn: they
 * all accumulate into the same dk, dv, which threads must therefore not share.
 * With NKV = NH (GPT-2) both are the former (b,h) loop, head for head. */
/* The pointers of one call: q (and dq) rows of stride qs with head h at h HD; k, v (and
 * dk, dv) rows of stride ks with KV head g at g HD; seg (B,T) or NULL. */
typedef struct att_call {
    const float *q, *k, *v, *out, *dout, *lse;
    float *o, *lse_out, *dq, *dk, *dv;
    const int32_t *seg, *kseg; /* kseg NULL: the keys are the queries' rows (seg) */
    int B, T, Tk, NH, NKV, HD, qs, ks, causal, window, wdelta, bf16;
} att_call_t;

/* Heads stacked per group (fp32): the largest divisor of the group's NH/NKV heads up
 * to ATT_STACK_MAX, so a group is whole stacks */
#define ATT_STACK_MAX 8
static int att_stack_heads(int grp)
{
    int G = ZT_MIN(grp, ATT_STACK_MAX);
    while (grp % G) G--;
    return G;
}

/* Rows per head in a stacked block: one head's block rows shared among the G stacked
 * heads (at least 16), so the stacked GEMMs are as tall as one head's were */
static int att_group_rows(int T, int G)
{
    return G == 1 ? att_block_rows(T) : ZT_MAX(16, att_block_rows(T) / G);
}

static void att_all_heads(const att_call_t *c)
{
    const int bwd = c->dq != NULL, NH = c->NH, NKV = c->NKV, HD = c->HD;
    const int grp = NH / NKV, T = c->T, Tk = c->Tk, qs = c->qs, ks = c->ks, os = NH * HD;
    /* fp32: a group's heads G at a time (att_forward_group); bf16: one head at a time */
    const int G = c->bf16 ? 1 : att_stack_heads(grp), bq = att_group_rows(T, G);
    /* segment starts only where keys and queries are the same rows */
    int32_t *lo = c->seg && !c->kseg ? att_segment_starts(c->seg, c->B, T) : NULL;
    const size_t blk = (size_t)G * bq * Tk, xs = G > 1 ? 3 * (size_t)G * bq * HD : 0;
    /* forward under bf16 runs the (b,h) query heads in parallel, everything else the (b,g) KV
     * groups: a group's heads all accumulate into its dk, dv, which threads must not share */
    const int by_group = bwd || !c->bf16, nouter = by_group ? NKV : NH, ninner = by_group ? grp : 1;
#pragma omp parallel if ((size_t)c->B * NH * T * Tk * HD >= ZT_PAR_MIN)
    {
        float *scr = zt_malloc(((bwd ? 2 : 1) * blk + xs) * sizeof(float));
        float *X = scr + (bwd ? 2 : 1) * blk;
        att_head_t a[ATT_STACK_MAX];
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < c->B; b++)
            for (int u = 0; u < nouter; u++)
                for (int w0 = 0; w0 < ninner; w0 += G) {
                    for (int j = 0; j < G; j++) {
                        const int h = u * ninner + w0 + j, g = h / grp;
                        const size_t q0 = (size_t)b * T * qs + (size_t)h * HD, k0 = (size_t)b * Tk * ks + (size_t)g * HD;
                        const size_t ooff = (size_t)b * T * os + (size_t)h * HD, loff = ((size_t)b * NH + h) * T;
                        a[j] = (att_head_t){.T = T, .qs = qs, .os = os, .hs = HD, .bq = bq, .Tk = Tk, .ks = ks,
                                            .causal = c->causal, .window = c->window, .wdelta = c->wdelta,
                                            .scale = 1.0f / sqrtf((float)HD)};
                        if (c->seg) {
                            a[j].seg = c->seg + (size_t)b * T;
                            a[j].kseg = c->kseg ? c->kseg + (size_t)b * Tk : a[j].seg;
                            a[j].lo = lo ? lo + (size_t)b * T : NULL;
                        }
                        a[j].q = c->q + q0;
                        a[j].k = c->k + k0;
                        a[j].v = c->v + k0;
                        if (bwd) {
                            a[j].out = c->out + ooff;
                            a[j].dout = c->dout + ooff;
                            a[j].dq = c->dq + q0;
                            a[j].dk = c->dk + k0;
                            a[j].dv = c->dv + k0;
                            a[j].lse = c->lse + loff;
                        } else {
                            a[j].o = c->o + ooff;
                            a[j].lse_out = c->lse_out + loff;
                        }
                    }
                    if (bwd && c->bf16) att_backward_head_bf16(a, scr, scr + blk);
                    else if (bwd) att_backward_group(a, G, scr, scr + blk, X);
                    else if (c->bf16) att_forward_head_bf16(a, scr);
                    else att_forward_group(a, G, scr, X);
                }
        free(scr);
    }
    free(lo);
}

static void cpu_attention_forward(float *restrict out, float *restrict lse,
                                  const float *restrict qkv, const int32_t *restrict seg, int B,
                                  int T, int NH, int NKV, int HD, int window)
{
    // qkv (B,T,(NH+2NKV)*HD) -> out (B,T,NH*HD), lse (B,NH,T) ; seg (B,T) or NULL
    const int qs = (NH + 2 * NKV) * HD;
    att_call_t c = {.q = qkv, .k = qkv + (size_t)NH * HD, .v = qkv + (size_t)(NH + NKV) * HD, .o = out,
                    .lse_out = lse, .seg = seg, .B = B, .T = T, .Tk = T, .NH = NH, .NKV = NKV, .HD = HD,
                    .qs = qs, .ks = qs, .causal = 1, .window = window, .bf16 = g_bf16_gemm};
    att_all_heads(&c);
}

static void cpu_attention_backward(float *restrict dqkv, const float *restrict dout,
                                   const float *restrict qkv, const float *restrict out,
                                   const float *restrict lse, const int32_t *restrict seg, int B,
                                   int T, int NH, int NKV, int HD, int window)
{
    // dqkv (B,T,(NH+2NKV)*HD) += ; dout, out (B,T,NH*HD) ; lse (B,NH,T) is only read
    const int qs = (NH + 2 * NKV) * HD;
    const size_t ko = (size_t)NH * HD, vo = (size_t)(NH + NKV) * HD;
    att_call_t c = {.q = qkv, .k = qkv + ko, .v = qkv + vo, .out = out, .dout = dout, .lse = lse, .dq = dqkv,
                    .dk = dqkv + ko, .dv = dqkv + vo, .seg = seg, .B = B, .T = T, .Tk = T, .NH = NH, .NKV = NKV,
                    .HD = HD, .qs = qs, .ks = qs, .causal = 1, .window = window, .bf16 = g_bf16_gemm};
    att_all_heads(&c);
}

/* ring attention's blocks (zt_backend.h): under MEDIUM with bf16 GEMMs like the full
 * kernels, each operand rounded once per call */
static void cpu_attention_block_forward(float *out, float *lse, const float *q, int qs, const float *k,
                                        const float *v, int ks, const int32_t *qseg, const int32_t *kseg, int B, int Tq,
                                        int Tk, int NH, int NKV, int HD, int causal, int window, int delta)
{
    att_call_t c = {.q = q, .k = k, .v = v, .o = out, .lse_out = lse, .seg = qseg, .kseg = qseg ? kseg : NULL,
                    .B = B, .T = Tq, .Tk = Tk, .NH = NH, .NKV = NKV, .HD = HD, .qs = qs, .ks = ks, .causal = causal,
                    .window = window, .wdelta = window ? delta : 0, .bf16 = g_bf16_gemm};
    att_all_heads(&c);
}

static void cpu_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, int qs,
                                         const float *k, const float *v, int ks, const int32_t *qseg,
                                         const int32_t *kseg, const float *out, const float *lse, int B, int Tq,
                                         int Tk, int NH, int NKV, int HD, int causal, int window, int delta)
{
    att_call_t c = {.q = q, .k = k, .v = v, .out = out, .dout = dout, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                    .seg = qseg, .kseg = qseg ? kseg : NULL, .B = B, .T = Tq, .Tk = Tk, .NH = NH, .NKV = NKV,
                    .HD = HD, .qs = qs, .ks = ks, .causal = causal, .window = window, .wdelta = window ? delta : 0,
                    .bf16 = g_bf16_gemm};
    att_all_heads(&c);
}

static void cpu_attention_merge(float *restrict out, float *restrict lse, const float *restrict out2,
                                const float *restrict lse2, int B, int T, int NH, int HD)
{
    // out (B,T,NH*HD), lse (B,NH,T): the softmax over both key sets, from each one's
#pragma omp parallel for collapse(2) if ((size_t)B * T * NH * HD >= ZT_PAR_MIN) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                float *l = lse + ((size_t)b * NH + h) * T + t;
                const float l2 = lse2[((size_t)b * NH + h) * T + t], m = fmaxf(*l, l2);
                if (m == -INFINITY) continue; /* neither block saw a key yet */
                const float w1 = zt_expf(*l - m), w2 = zt_expf(l2 - m), s = w1 + w2;
                float *o = out + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                const float *o2 = out2 + ((size_t)b * T + t) * NH * HD + (size_t)h * HD;
                const float a1 = w1 / s, a2 = w2 / s;
                for (int i = 0; i < HD; i++) o[i] = a1 * o[i] + a2 * o2[i];
                *l = m + logf(s);
            }
}

/* ------------------------------------------------------------ elementwise -- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* 0.5 (1 + tanh(u)) is the logistic sigmoid of z = 2u. It is computed from
 * e = exp(-|z|) <= 1 (no overflow, no clamp): sigmoid(z) = 1/(1+e) for z >= 0,
 * e/(1+e) for z < 0. Unlike 1 + tanh(u) this has no cancellation for x << 0,
 * so GELU keeps full relative precision in its negative tail. Also returns
 * sigmoid(z) (1 - sigmoid(z)) = e/(1+e)^2, the same for either sign. */
static inline float gelu_sig(float x, float *sig_1msig)
{
    float z = 2.0f * GELU_K * (x + 0.044715f * x * x * x);
    float e = zt_expf(-fabsf(z));
    float inv = 1.0f / (1.0f + e);
    *sig_1msig = e * inv * inv;
    return zt_sel(z >= 0.0f, inv, e * inv);
}

static void cpu_gelu_forward(float *restrict out, const float *restrict inp, size_t n)
{
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float s1s, x = inp[i];
        out[i] = x * gelu_sig(x, &s1s);
    }
}

/* d/dx [x s(z)] = s + x s (1 - s) dz/dx, dz/dx = 2k (1 + 3 * 0.044715 x^2) */
static inline float gelu_grad(float x)
{
    float s1s;
    float sg = gelu_sig(x, &s1s);
    float dz = 2.0f * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return sg + x * s1s * dz;
}

static void cpu_gelu_backward(float *restrict dinp, const float *restrict inp,
                              const float *restrict dout, size_t n)
{
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = gelu_grad(inp[i]) * dout[i];
}

/* The gated MLPs, SwiGLU and GeGLU: gu (N, 2I) = [gate | up] per row (one GEMM over
 * gate_proj and up_proj), out (N, I) = act(gate) * up with act silu or tanh-GELU
 * (gelu_sig above). */
/* One row of each; gelu a constant at every call (glu_forward/glu_backward branch once,
 * outside the row loop), so the element loop has no control flow and vectorizes. */
static inline __attribute__((always_inline)) void glu_forward_row(float *restrict o, const float *restrict g,
                                                                   const float *restrict u, int NI, int gelu)
{
#pragma omp simd
    for (int i = 0; i < NI; i++) {
        float s1s, x = g[i];
        const float a = gelu ? x * gelu_sig(x, &s1s) : x * zt_sigmoid(x);
        o[i] = a * u[i];
    }
}

static void glu_forward(float *restrict out, const float *restrict gu, int N, int NI, int gelu)
{
    const size_t n = (size_t)N * NI;
#pragma omp parallel for if (n >= ZT_PAR_MIN) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *g = gu + (size_t)r * 2 * NI;
        if (gelu) glu_forward_row(out + (size_t)r * NI, g, g + NI, NI, 1);
        else glu_forward_row(out + (size_t)r * NI, g, g + NI, NI, 0);
    }
}

/* dgu (N, 2I) = d/d[gate | up] from dout (N, I): d silu(g)/dg = s + g s (1 - s) with
 * s = sigmoid(g), d gelu(g)/dg = gelu_grad. dgu may be gu: iteration i reads gate i and
 * up i before writing the same two elements and touches no other, so the loop is a
 * valid simd loop with or without the alias (hence no restrict on dgu and gu, and the
 * explicit simd pragma). */
static inline __attribute__((always_inline)) void glu_backward_row(float *dg, const float *restrict dy,
                                                                    const float *g, int NI, int gelu)
{
    const float *u = g + NI;
    float *du = dg + NI;
#pragma omp simd
    for (int i = 0; i < NI; i++) {
        float s1s, gi = g[i], ui = u[i], act, dact;
        if (gelu) {
            act = gi * gelu_sig(gi, &s1s);
            dact = gelu_grad(gi);
        } else {
            const float s = zt_sigmoid(gi);
            act = gi * s;
            dact = s + gi * s * (1.0f - s);
        }
        dg[i] = dy[i] * ui * dact;
        du[i] = dy[i] * act;
    }
}

static void glu_backward(float *dgu, const float *restrict dout, const float *gu, int N, int NI, int gelu)
{
    const size_t n = (size_t)N * NI;
#pragma omp parallel for if (n >= ZT_PAR_MIN) schedule(static)
    for (int r = 0; r < N; r++) {
        float *dg = dgu + (size_t)r * 2 * NI;
        const float *g = gu + (size_t)r * 2 * NI, *dy = dout + (size_t)r * NI;
        if (gelu) glu_backward_row(dg, dy, g, NI, 1);
        else glu_backward_row(dg, dy, g, NI, 0);
    }
}

static void cpu_swiglu_forward(float *out, const float *gu, int N, int NI) { glu_forward(out, gu, N, NI, 0); }
static void cpu_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int NI)
{
    glu_backward(dgu, dout, gu, N, NI, 0);
}
static void cpu_geglu_forward(float *out, const float *gu, int N, int NI) { glu_forward(out, gu, N, NI, 1); }
static void cpu_geglu_backward(float *dgu, const float *dout, const float *gu, int N, int NI)
{
    glu_backward(dgu, dout, gu, N, NI, 1);
}

/* OpenBLAS's sgemm has no epilogue: on the CPU the fused operations are composed. */
static void cpu_matmul_gelu_forward(float *restrict out, float *restrict pre,
                                    const float *restrict inp, const float *restrict weight,
                                    const float *restrict bias, int N, int C, int OC)
{
    cpu_matmul_forward(pre, inp, weight, bias, N, C, OC, 0);
    cpu_gelu_forward(out, pre, (size_t)N * OC);
}

/* dpre may be act: the parameter gradients read act before dpre is written */
static void cpu_gelu_matmul_backward(float *dpre, float *restrict dweight, float *restrict dbias,
                                     const float *restrict dy, const float *act,
                                     const float *restrict pre, const float *restrict weight, int N,
                                     int C, int OC)
{
    if (g_bf16_gemm) {
        matmul_backward_bf16(dpre, dweight, dbias, dy, act, weight, N, C, OC, 0);
    } else {
        matmul_dparams(dweight, dbias, dy, act, N, C, OC, 0);
        matmul_dinp(dpre, dy, weight, N, C, OC, 0);
    }
    const size_t n = (size_t)N * C;
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) dpre[i] = gelu_grad(pre[i]) * dpre[i];
}

static void cpu_copy_rows(float *restrict dst, int dst_stride, const float *restrict src, int src_stride, int N,
                          int width)
{
    for (int n = 0; n < N; n++)
        memcpy(dst + (size_t)n * dst_stride, src + (size_t)n * src_stride, (size_t)width * sizeof(float));
}

static void cpu_residual_forward(float *restrict out, const float *restrict a,
                                 const float *restrict b, size_t n)
{
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_accumulate(float *restrict y, const float *restrict x, size_t n)
{
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* in chunks of whole blocks over the threads: each chunk's values are what one call
 * over the whole tensor writes there */
static void cpu_dequant4(float *out, const float *region, int64_t n, int quant_type, int nested, int64_t blocksize,
                         const zt_quant4_split_t *split, int flags)
{
    float *bytes = NULL;
    if (flags & ZT_DQ4_BYTEWISE) {
        /* the region's bytes from their values (a bf16 working copy holds one a element) */
        const size_t nb = zt_quant4_region_bytes(n, blocksize, nested, split);
        bytes = zt_malloc(ZT_CEIL_DIV(nb, sizeof(float)) * sizeof(float));
        uint8_t *b = (uint8_t *)bytes;
        for (size_t i = 0; i < nb; i++) b[i] = (uint8_t)region[i];
        region = bytes;
    }
    zt_quant4_view_t v;
    zt_quant4_region_view((zt_quant_type_t)quant_type, nested, blocksize, region, n, split, &v);
    const int64_t chunk = 1024 * blocksize, nchunks = ZT_CEIL_DIV(n, chunk);
#pragma omp parallel for if (nchunks > 1) schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        float *o = out + c * chunk;
        const int64_t len = ZT_MIN(chunk, n - c * chunk);
        zt_quant4_dequantize(&v, c * chunk, len, o);
        if (flags & ZT_DQ4_BF16) /* code * absmax in float32, then rounded: bitsandbytes' bf16 output */
            for (int64_t i = 0; i < len; i++) o[i] = zt_bf16_to_f32(zt_bf16_from_f32(o[i]));
    }
    free(bytes);
}

static void cpu_scale(float *restrict x, float s, size_t n)
{
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ----------------------------------------------------------- crossentropy -- */

static void cpu_crossentropy_fused(float *restrict logits, float *restrict losses,
                                   const int32_t *restrict targets, int N, int V, float dscale)
{
    // logits (N,V) -> dlogits in place; losses (N)
    /* Three passes per row (max, exp-sum, gradient), each vectorized; a
     * 50257-wide row (200 KB) stays in L2 between them. */
#pragma omp parallel for if ((size_t)N * V >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        float *restrict x = logits + (size_t)n * V;
        int tg = targets[n];
        if (tg < 0 || tg >= V) {
            /* ignored position (also any out-of-range id: never index past the row) */
            losses[n] = 0.0f;
            if (dscale != 0.0f) memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        float xt = x[tg];
        /* the exp-sum is accumulated in double: one term near 1 among 50k tiny
         * ones loses ~1e-5 relative in a float sum, visible in small losses */
        double s = 0.0;
        if (dscale != 0.0f) {
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < V; i++) {
                float e = zt_expf(x[i] - mx);
                x[i] = e;
                s += e;
            }
            float f = (float)(dscale / s);
#pragma omp simd
            for (int i = 0; i < V; i++) x[i] *= f;
            x[tg] -= dscale;
        } else {
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < V; i++) s += zt_expf(x[i] - mx);
        }
        losses[n] = (float)(log(s) - ((double)xt - mx));
    }
}

/* -------------------------------------------------------------- reductions -- */

static double cpu_sumsq(const float *restrict x, size_t n)
{
    double s = 0.0;
#pragma omp parallel for simd reduction(+ : s) if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static int cpu_all_finite(const float *restrict x, size_t n)
{
    /* exponent all ones <=> Inf or NaN; an integer test vectorizes and does not
     * depend on the compiler honouring isfinite under any math flags */
    const uint32_t *restrict u = (const uint32_t *)x;
    uint32_t bad = 0;
#pragma omp parallel for simd reduction(| : bad) if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
    return !bad;
}

/* ------------------------------------------------------------------ AdamW -- */

/* x = sqrt(x) over n floats. The one use of intrinsics in this file: gcc
 * vectorizes sqrtf only under -fno-math-errno (its errno branch is control
 * flow in the loop), and neither the optimize attribute nor pragma reaches
 * it; a scalar sqrt would make AdamW compute-bound instead of memory-bound. */
static inline void sqrt_inplace(float *restrict x, int n)
{
    int j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, _mm512_sqrt_ps(_mm512_loadu_ps(x + j)));
#endif
#if defined(__AVX__)
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_sqrt_ps(_mm256_loadu_ps(x + j)));
#elif defined(__SSE2__)
    for (; j + 4 <= n; j += 4) _mm_storeu_ps(x + j, _mm_sqrt_ps(_mm_loadu_ps(x + j)));
#endif
    for (; j < n; j++) x[j] = sqrtf(x[j]);
}

/* One thread's contiguous range of the AdamW update, in L1-sized blocks:
 * moments first (storing v aside), vector sqrt, then the parameter; the
 * block is still in cache for the second loop, so memory sees one pass.
 * No FMA contraction here: PyTorch rounds after each tensor op, and with
 * separate roundings ~98% of parameters match torch bitwise after 10 steps
 * (the rest by 1 ulp) instead of ~25%. Memory-bound, so FMAs gain nothing. */
__attribute__((optimize("fp-contract=off"))) static void
adamw_range(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
            size_t i0, size_t i1, float step_size, float bc2_sqrt, float decay, float b1, float b2,
            float w1, float w2, float eps, float grad_scale)
{
    enum { BLK = 512 };
    float sq[BLK];
    for (size_t b0 = i0; b0 < i1; b0 += BLK) {
        int nb = (int)ZT_MIN((size_t)BLK, i1 - b0);
        float *restrict pb = p + b0, *restrict mb = m + b0, *restrict vb = v + b0;
        const float *restrict gb = g + b0;
#pragma omp simd
        for (int j = 0; j < nb; j++) {
            float gi = gb[j] * grad_scale;
            float mi = mb[j] * b1 + w1 * gi;
            float vi = vb[j] * b2 + w2 * gi * gi;
            mb[j] = mi;
            vb[j] = vi;
            sq[j] = vi;
        }
        sqrt_inplace(sq, nb);
#pragma omp simd
        for (int j = 0; j < nb; j++) {
            float denom = sq[j] / bc2_sqrt + eps;
            pb[j] = pb[j] * decay - step_size * (mb[j] / denom);
        }
    }
}

static void cpu_adamw(float *restrict p, const float *restrict g, float *restrict m,
                      float *restrict v, size_t n, float lr, float b1, float b2, float eps,
                      float wd, float grad_scale, long step)
{
    /* PyTorch's single-tensor AdamW (torch 1.13, Debian's), in its order of
     * operations: p *= 1 - lr*wd ; m = m*b1 + (1-b1) g ; v = v*b2 + (1-b2) g g ;
     * p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps), which is the header's
     * formula. Bias corrections in double, once. (torch >= 2.0 writes the m
     * update as lerp_, equal up to rounding.) Python forms 1 - lr*wd and 1 - b1
     * in double from decimal literals; here they come from floats, so results
     * agree with torch to a few float ulps, not bitwise. */
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    double bc1 = 1.0 - pow((double)b1, (double)step);
    double bc2 = 1.0 - pow((double)b2, (double)step);
    const float step_size = (float)((double)lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
#pragma omp parallel if (n >= ZT_PAR_MIN)
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        /* chunks rounded to 16 floats so threads do not share cache lines */
        size_t chunk = ZT_CEIL_DIV(ZT_CEIL_DIV(n, (size_t)nt), 16) * 16;
        size_t i0 = ZT_MIN(n, (size_t)id * chunk), i1 = ZT_MIN(n, i0 + chunk);
        adamw_range(p, g, m, v, i0, i1, step_size, bc2_sqrt, decay, b1, b2, 1.0f - b1, 1.0f - b2,
                    eps, grad_scale);
    }
}

/* ------------------------------------------------------------------- bf16 -- */

static void cpu_to_bf16(uint16_t *restrict out, const float *restrict in, size_t n)
{
    const uint32_t *restrict u = (const uint32_t *)in;
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = zt_bf16_from_bits(u[i]);
}

static void cpu_from_bf16(float *restrict out, const uint16_t *restrict in, size_t n)
{
    uint32_t *restrict u = (uint32_t *)out;
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) u[i] = (uint32_t)in[i] << 16;
}

/* ------------------------------------------------------------------- fp16 -- */

/* F16C converts 8 elements per instruction with exactly zt_fp16.h's rounding; it is
 * chosen at run time so one binary runs on processors without it. */
#if defined(__x86_64__) && defined(__SSE2__)
#define ZT_F16C_POSSIBLE 1
__attribute__((target("avx,f16c"))) static void f16c_to_fp16(uint16_t *out, const float *in, size_t n)
{
#pragma omp parallel for if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n / 8; i++)
        _mm_storeu_si128((__m128i *)(out + 8 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + 8 * i), _MM_FROUND_TO_NEAREST_INT));
    for (size_t i = n / 8 * 8; i < n; i++) out[i] = zt_fp16_from_f32(in[i]);
}

__attribute__((target("avx,f16c"))) static void f16c_from_fp16(float *out, const uint16_t *in, size_t n)
{
#pragma omp parallel for if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n / 8; i++)
        _mm256_storeu_ps(out + 8 * i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + 8 * i))));
    for (size_t i = n / 8 * 8; i < n; i++) out[i] = zt_fp16_to_f32(in[i]);
}
#endif

static int use_f16c = -1; /* -1: not decided yet */

int zt_cpu_use_f16c(int want)
{
#ifdef ZT_F16C_POSSIBLE
    __builtin_cpu_init();
    use_f16c = want && __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#else
    use_f16c = 0;
#endif
    return use_f16c;
}

static void cpu_to_fp16(uint16_t *restrict out, const float *restrict in, size_t n)
{
    if (use_f16c < 0) zt_cpu_use_f16c(1);
#ifdef ZT_F16C_POSSIBLE
    if (use_f16c) {
        f16c_to_fp16(out, in, n);
        return;
    }
#endif
    const uint32_t *restrict u = (const uint32_t *)in;
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = zt_fp16_from_bits(u[i]);
}

static void cpu_from_fp16(float *restrict out, const uint16_t *restrict in, size_t n)
{
    if (use_f16c < 0) zt_cpu_use_f16c(1);
#ifdef ZT_F16C_POSSIBLE
    if (use_f16c) {
        f16c_from_fp16(out, in, n);
        return;
    }
#endif
    uint32_t *restrict u = (uint32_t *)out;
#pragma omp parallel for simd if (n >= ZT_PAR_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) u[i] = zt_fp16_to_bits(in[i]);
}

/* ---------------------------------------------------------------- backend -- */

/* OpenBLAS has no reduced-precision sgemm; ZT_MATMUL_MEDIUM sends the GEMMs
 * (matmul, the fused GELU operations and attention's inner products) to
 * oneDNN's bf16 matmul where the processor has bf16 units (or ZT_DNNL=force).
 * HIGH (TF32) has no CPU counterpart and stays fp32. */
static void cpu_set_matmul_precision(int level)
{
    static char desc[160];
    int mode = zt_dnnl_mode();
    g_bf16_gemm = level == ZT_MATMUL_MEDIUM && mode != ZT_DNNL_OFF;
    if (level != ZT_MATMUL_MEDIUM)
        g_gemm_desc = "fp32";
    else if (mode == ZT_DNNL_UNITS)
        snprintf(desc, sizeof desc, "bf16 (oneDNN, %s)", zt_dnnl_units()), g_gemm_desc = desc;
    else if (mode == ZT_DNNL_FORCED)
        snprintf(desc, sizeof desc, "bf16 (oneDNN forced by ZT_DNNL=force without bf16 units, ISA %s: %s)",
                 zt_dnnl_isa(), zt_dnnl_native_bf16() ? "oneDNN's bf16 matmul, slow"
                                                      : "bf16-rounded operands in oneDNN's fp32 matmul"),
            g_gemm_desc = desc;
#ifndef ZT_HAVE_DNNL
    else
        g_gemm_desc = zt_dnnl_units() ? "fp32: built without oneDNN (train.bf16 computes in fp32)"
                                      : "fp32: no bf16 units (train.bf16 computes in fp32)";
#else
    else if (zt_dnnl_units())
        g_gemm_desc = "fp32: ZT_DNNL=off (train.bf16 computes in fp32)";
    else
        g_gemm_desc = "fp32: no bf16 units (train.bf16 computes in fp32)";
#endif
}

const char *zt_cpu_gemm_path(void) { return g_gemm_desc; }

/* ---- vocabulary-parallel cross-entropy ---------------------------------------
 * The three passes of cpu_crossentropy_fused, split where the tp all-reduces go. */
static void cpu_vocab_ce_max(float *restrict rowmax, const float *restrict logits, int N, int V)
{
#pragma omp parallel for if ((size_t)N * V >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * V;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        rowmax[n] = mx;
    }
}

static void cpu_vocab_ce_sum(float *restrict sz, const float *restrict logits, const float *restrict rowmax,
                             const int32_t *restrict targets, int v0, int N, int V)
{
#pragma omp parallel for if ((size_t)N * V >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *restrict x = logits + (size_t)n * V;
        const float mx = rowmax[n];
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < V; i++) s += zt_expf(x[i] - mx);
        const int tg = targets[n] - v0;
        sz[2 * n] = (float)s;
        sz[2 * n + 1] = targets[n] >= 0 && tg >= 0 && tg < V ? x[tg] : 0.0f;
    }
}

static void cpu_vocab_ce_grad(float *restrict logits, float *restrict losses, const float *restrict rowmax,
                              const float *restrict sz, const int32_t *restrict targets, int v0, int N, int V,
                              float dscale)
{
#pragma omp parallel for if ((size_t)N * V >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        float *restrict x = logits + (size_t)n * V;
        const int ignore = targets[n] < 0;
        const double s = sz[2 * n];
        const float mx = rowmax[n];
        losses[n] = ignore ? 0.0f : (float)(log(s) - ((double)sz[2 * n + 1] - mx));
        if (dscale == 0.0f) continue;
        if (ignore) {
            memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float f = (float)(dscale / s);
        for (int i = 0; i < V; i++) x[i] = zt_expf(x[i] - mx) * f;
        const int tg = targets[n] - v0;
        if (tg >= 0 && tg < V) x[tg] -= dscale;
    }
}

static void cpu_dropout_mask(float *out, const float *x, const uint64_t *row_keys, uint64_t salt, int N, int C,
                             int c0, float p)
{
    const float keep = 1.0f / (1.0f - p);
#pragma omp parallel for if ((size_t)N * C >= ZT_PAR_MIN) schedule(static)
    for (int n = 0; n < N; n++) {
        const uint64_t k = row_keys[n] ^ salt;
        for (int c = 0; c < C; c++) {
            const double u = (double)(zt_splitmix64(k ^ zt_splitmix64((uint64_t)(c0 + c) + 1)) >> 11) * (1.0 / 9007199254740992.0);
            const size_t i = (size_t)n * C + c;
            out[i] = u < p ? 0.0f : x[i] * keep;
        }
    }
}

const zt_backend_t zt_backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .alloc = cpu_alloc,
    .alloc_transient = cpu_alloc_transient,
    .free = cpu_free,
    .memzero = cpu_memzero,
    .copy = cpu_copy,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .sync = cpu_sync,
    .alloc_host = cpu_alloc,
    .free_host = cpu_free,
    .to_host_async = cpu_copy,
    .from_host_async = cpu_copy,
    .wait_downloads = cpu_sync,
    .wait_uploads = cpu_sync,
    .set_matmul_precision = cpu_set_matmul_precision,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .positional_forward = cpu_positional_forward,
    .positional_backward = cpu_positional_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .geglu_forward = cpu_geglu_forward,
    .geglu_backward = cpu_geglu_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .gemm = cpu_gemm,
    .lowrank_backward = cpu_lowrank_backward,
    .matmul_gelu_forward = cpu_matmul_gelu_forward,
    .gelu_matmul_backward = cpu_gelu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_block_backward = cpu_attention_block_backward,
    .attention_merge = cpu_attention_merge,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .copy_rows = cpu_copy_rows,
    .residual_forward = cpu_residual_forward,
    .accumulate = cpu_accumulate,
    .crossentropy_fused = cpu_crossentropy_fused,
    .vocab_ce_max = cpu_vocab_ce_max,
    .vocab_ce_sum = cpu_vocab_ce_sum,
    .vocab_ce_grad = cpu_vocab_ce_grad,
    .scale = cpu_scale,
    .dropout_mask = cpu_dropout_mask,
    .sumsq = cpu_sumsq,
    .all_finite = cpu_all_finite,
    .adamw = cpu_adamw,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .to_fp16 = cpu_to_fp16,
    .from_fp16 = cpu_from_fp16,
    .bf16_view = zt_dnnl_view,
    .dequant4 = cpu_dequant4,
};
