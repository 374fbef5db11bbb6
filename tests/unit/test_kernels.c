/* test_kernels.c — the CPU backend against double-precision references.
 *
 * Every layer's forward is compared to a naive double-precision version written
 * here, and every backward to central finite differences of that double
 * reference for the scalar loss L = sum(out * R), R random. Differencing in
 * double (h = 1e-4) gives ~1e-8 truncation error, so the tolerance checks the
 * fp32 kernels at the 1e-4 level instead of the 1e-2 that fp32 differences
 * would allow. Gradient buffers are pre-filled with random values before each
 * backward call and the difference is checked, which tests the += contract of
 * zt_backend.h at the same time. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "zt_backend.h"
#include "zt_fp16.h"
#include "zt_test.h"
#include "fused_gelu_check.h"

static const zt_backend_t *be = &zt_backend_cpu;

/* ------------------------------------------------------------- utilities -- */

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) /* uniform [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static float *frand(size_t n, double amp)
{
    float *p = be->alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)(amp * urand());
    return p;
}

static double *f2d(const float *x, size_t n)
{
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *fcopy(const float *x, size_t n)
{
    float *p = be->alloc(n * sizeof(float));
    memcpy(p, x, n * sizeof(float));
    return p;
}

/* max |a - b| over max(max |b|, floor): an error relative to the vector's scale */
static double vec_err(const float *a, const double *b, size_t n, double floor_)
{
    double dmax = 0, bmax = floor_;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > dmax || d != d) dmax = d != d ? INFINITY : d;
        if (fabs(b[i]) > bmax) bmax = fabs(b[i]);
    }
    return dmax / bmax;
}

/* (grad_after - grad_before) compared to the expected increment */
static double inc_err(const float *after, const float *before, const double *expect, size_t n)
{
    float *d = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) d[i] = after[i] - before[i];
    double e = vec_err(d, expect, n, 1e-6);
    free(d);
    return e;
}

/* Central differences of loss() with respect to x[0..n). */
typedef double (*loss_fn)(void *ctx);
static double *fd_grad(loss_fn loss, void *ctx, double *x, size_t n)
{
    const double h = 1e-4;
    double *g = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

static double dot_r(const double *out, const double *R, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += out[i] * R[i];
    return s;
}

#define TOL 2e-4

/* ------------------------------------------------- embedding, positional -- */

typedef struct { int B, T, C; const int32_t *inp; double *wte, *wpe, *base, *R, *out; const int32_t *pos; } enc_ctx;

/* out = wte[inp] (embedding), then out = base + wpe[t] (positional, += onto base) */
static void emb_ref(enc_ctx *c)
{
    for (int n = 0; n < c->B * c->T; n++)
        for (int k = 0; k < c->C; k++)
            c->out[(size_t)n * c->C + k] = c->wte[(size_t)c->inp[n] * c->C + k];
}

static void pos_ref(enc_ctx *c)
{
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int k = 0; k < c->C; k++) {
                size_t i = ((size_t)b * c->T + t) * c->C + k;
                const int p = c->pos ? c->pos[b * c->T + t] : t;
                c->out[i] = c->base[i] + c->wpe[(size_t)p * c->C + k];
            }
}

static double emb_loss(void *v)
{
    enc_ctx *c = v;
    emb_ref(c);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static double pos_loss(void *v)
{
    enc_ctx *c = v;
    pos_ref(c);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void t_embedding(void)
{
    int B = 2, T = 5, C = 7, V = 6;
    int32_t inp[] = {0, 3, 3, 5, 1, 2, 3, 0, 0, 4}; /* repeats: dwte rows must accumulate */
    size_t no = (size_t)B * T * C;
    float *wte = frand((size_t)V * C, 1), *R = frand(no, 1);
    float *out = frand(no, 1); /* garbage: the forward overwrites */
    be->embedding_forward(out, inp, wte, B * T, C);
    enc_ctx c = {B, T, C, inp, f2d(wte, (size_t)V * C), NULL, NULL, f2d(R, no),
                 malloc(no * sizeof(double)), NULL};
    emb_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) == 0); /* a copy: exact */

    float *dwte = frand((size_t)V * C, 1), *dwte0 = fcopy(dwte, (size_t)V * C);
    be->embedding_backward(dwte, R, inp, B * T, C);
    double *g = fd_grad(emb_loss, &c, c.wte, (size_t)V * C);
    CU_ASSERT(inc_err(dwte, dwte0, g, (size_t)V * C) < TOL);
    free(g), free(c.wte), free(c.R), free(c.out);
    be->free(wte), be->free(R), be->free(out), be->free(dwte), be->free(dwte0);
}

static void t_positional(void)
{
    int B = 3, T = 5, C = 7, maxT = 8; /* wpe has more rows than T: only 0..T-1 are used */
    size_t no = (size_t)B * T * C, nw = (size_t)maxT * C;
    float *wpe = frand(nw, 1), *R = frand(no, 1), *out = frand(no, 1);
    enc_ctx c = {B, T, C, NULL, NULL, f2d(wpe, nw), f2d(out, no), f2d(R, no), malloc(no * 8), NULL};
    be->positional_forward(out, wpe, NULL, B, T, C); /* += onto what out held */
    pos_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) < 1e-6);

    float *dwpe = frand(nw, 1), *dwpe0 = fcopy(dwpe, nw);
    be->positional_backward(dwpe, R, NULL, B, T, C);
    double *g = fd_grad(pos_loss, &c, c.wpe, nw); /* rows >= T: zero gradient, untouched */
    CU_ASSERT(inc_err(dwpe, dwpe0, g, nw) < TOL);
    CU_ASSERT(memcmp(dwpe + (size_t)T * C, dwpe0 + (size_t)T * C, (nw - (size_t)T * C) * 4) == 0);
    free(g), free(c.wpe), free(c.base), free(c.R), free(c.out);
    be->free(wpe), be->free(R), be->free(out), be->free(dwpe), be->free(dwpe0);
}

/* GPT-2's input layer is embedding then positional: the float result must be the
 * former fused wte[inp] + wpe[t] bit for bit, and dwpe the sum over b in order. */
static void t_embedding_gpt2_bits(void)
{
    int B = 3, T = 6, C = 40, V = 9;
    int32_t inp[18];
    for (int i = 0; i < B * T; i++) inp[i] = (i * 5) % V;
    size_t no = (size_t)B * T * C;
    float *wte = frand((size_t)V * C, 1), *wpe = frand((size_t)T * C, 1), *out = frand(no, 1);
    be->embedding_forward(out, inp, wte, B * T, C);
    be->positional_forward(out, wpe, NULL, B, T, C);
    float *ref = malloc(no * 4);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int k = 0; k < C; k++)
                ref[((size_t)b * T + t) * C + k] =
                    wte[(size_t)inp[b * T + t] * C + k] + wpe[(size_t)t * C + k];
    CU_ASSERT(memcmp(out, ref, no * 4) == 0);
    float *dwpe = frand((size_t)T * C, 1), *dref = fcopy(dwpe, (size_t)T * C);
    be->positional_backward(dwpe, out, NULL, B, T, C);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < T * C; k++) dref[k] += out[(size_t)b * T * C + k];
    CU_ASSERT(memcmp(dwpe, dref, (size_t)T * C * 4) == 0);
    free(ref);
    be->free(wte), be->free(wpe), be->free(out), be->free(dwpe), be->free(dref);
}

/* -------------------------------------------------------------- layernorm -- */

typedef struct { int N, C; double eps, *x, *w, *b, *R, *out, *mean, *rstd; } ln_ctx; /* b may be NULL */

static void ln_ref(ln_ctx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->C;
        double m = 0, v = 0;
        for (int k = 0; k < c->C; k++) m += x[k];
        m /= c->C;
        for (int k = 0; k < c->C; k++) v += (x[k] - m) * (x[k] - m);
        double rs = 1.0 / sqrt(v / c->C + c->eps);
        for (int k = 0; k < c->C; k++)
            c->out[(size_t)n * c->C + k] = (x[k] - m) * rs * c->w[k] + (c->b ? c->b[k] : 0);
        c->mean[n] = m;
        c->rstd[n] = rs;
    }
}

static double ln_loss(void *v)
{
    ln_ctx *c = v;
    ln_ref(c);
    return dot_r(c->out, c->R, (size_t)c->N * c->C);
}

/* with_bias 0: bias and dbias NULL (the no-bias layernorm of newer families) */
static void run_layernorm(int N, int C, int threads, int with_bias, float eps)
{
    size_t nx = (size_t)N * C;
    float *x = frand(nx, 2), *w = frand(C, 1), *R = frand(nx, 1);
    float *b = with_bias ? frand(C, 1) : NULL;
    for (size_t i = 0; i < nx; i++) x[i] += 0.5f; /* a non-zero mean */
    float *out = be->alloc(nx * 4), *mean = be->alloc(N * 4), *rstd = be->alloc(N * 4);
    zt_cpu_set_threads(threads);
    be->layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
    ln_ctx c = {N, C, eps, f2d(x, nx), f2d(w, C), b ? f2d(b, C) : NULL, f2d(R, nx), malloc(nx * 8),
                malloc(N * 8), malloc(N * 8)};
    ln_ref(&c);
    CU_ASSERT(vec_err(out, c.out, nx, 1e-6) < 1e-5);
    CU_ASSERT(vec_err(mean, c.mean, N, 1e-6) < 1e-5);
    CU_ASSERT(vec_err(rstd, c.rstd, N, 1e-6) < 1e-5);

    float *dx = frand(nx, 1), *dw = frand(C, 1), *db = frand(C, 1);
    float *dx0 = fcopy(dx, nx), *dw0 = fcopy(dw, C), *db0 = fcopy(db, C);
    be->layernorm_backward(dx, dw, b ? db : NULL, R, x, w, mean, rstd, N, C);
    zt_cpu_set_threads(1);
    double *gw = fd_grad(ln_loss, &c, c.w, C);
    double *gb = NULL;
    CU_ASSERT(inc_err(dw, dw0, gw, C) < TOL);
    if (b) {
        gb = fd_grad(ln_loss, &c, c.b, C);
        CU_ASSERT(inc_err(db, db0, gb, C) < TOL);
    }
    double *gx = NULL;
    if (threads == 1) {
        gx = fd_grad(ln_loss, &c, c.x, nx);
        CU_ASSERT(inc_err(dx, dx0, gx, nx) < TOL);
    } else {
        /* too many inputs to difference; rows are independent, so the threaded
         * dinp must equal the (difference-checked) one-thread result exactly */
        float *dx1 = fcopy(dx0, nx), *dw1 = fcopy(dw0, C), *db1 = fcopy(db0, C);
        be->layernorm_backward(dx1, dw1, b ? db1 : NULL, R, x, w, mean, rstd, N, C);
        CU_ASSERT(memcmp(dx1, dx, nx * 4) == 0);
        be->free(dx1), be->free(dw1), be->free(db1);
    }
    free(gx), free(gw), free(gb);
    free(c.x), free(c.w), free(c.b), free(c.R), free(c.out), free(c.mean), free(c.rstd);
    float *bufs[] = {x, w, b, R, out, mean, rstd, dx, dw, db, dx0, dw0, db0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

static void t_layernorm(void) { run_layernorm(6, 13, 1, 1, 1e-5f); }
/* no bias, and an eps (0.05) large enough to move every output by ~2% */
static void t_layernorm_nobias_eps(void) { run_layernorm(6, 13, 1, 0, 0.05f); }
static void t_layernorm_nobias_threads(void) { run_layernorm(128, 256, 2, 0, 1e-6f); }
/* rows with variance ~1e-5: eps = 1e-5 matters, and must be exactly that */
static void t_layernorm_eps(void)
{
    int N = 4, C = 64;
    size_t nx = (size_t)N * C;
    float *x = frand(nx, 0.005), *w = frand(C, 1), *b = frand(C, 1);
    float *out = be->alloc(nx * 4), *mean = be->alloc(N * 4), *rstd = be->alloc(N * 4);
    be->layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-5f);
    ln_ctx c = {N, C, 1e-5, f2d(x, nx), f2d(w, C), f2d(b, C), NULL, malloc(nx * 8), malloc(N * 8),
                malloc(N * 8)};
    ln_ref(&c);
    CU_ASSERT(vec_err(out, c.out, nx, 1e-6) < 1e-5);
    CU_ASSERT(vec_err(rstd, c.rstd, N, 1e-6) < 1e-5);
    free(c.x), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd);
    be->free(x), be->free(w), be->free(b), be->free(out), be->free(mean), be->free(rstd);
}

/* large enough to take the threaded path with per-thread dweight partials */
static void t_layernorm_threads(void) { run_layernorm(128, 256, 2, 1, 1e-5f); }

/* ---------------------------------------------------------------- rmsnorm -- */

/* N rows of stride S; H groups of D channels at h*D from the base pointer */
typedef struct { int N, H, D, S; double eps, *x, *w, *R, *out, *rstd; } rms_ctx;

static void rms_ref(rms_ctx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++) {
            const size_t o = (size_t)n * c->S + (size_t)h * c->D;
            double ss = 0;
            for (int k = 0; k < c->D; k++) ss += c->x[o + k] * c->x[o + k];
            double rs = 1.0 / sqrt(ss / c->D + c->eps);
            for (int k = 0; k < c->D; k++) c->out[o + k] = c->w[k] * (c->x[o + k] * rs);
            c->rstd[(size_t)n * c->H + h] = rs;
        }
}

static double rms_loss(void *v)
{
    rms_ctx *c = v;
    rms_ref(c);
    double s = 0; /* only the group elements: out outside them is not the kernel's */
    for (int n = 0; n < c->N; n++)
        for (int k = 0; k < c->H * c->D; k++) {
            size_t i = (size_t)n * c->S + k;
            s += c->out[i] * c->R[i];
        }
    return s;
}

/* The buffers hold N*S + off floats and the kernels get base + off, so groups sit
 * inside a wider row (Qwen3's q_norm / k_norm inside qkv): elements outside the
 * groups must be left alone by the forward and get no gradient. */
static void run_rmsnorm(int N, int H, int D, int S, int off, float eps, int threads, int fd)
{
    const size_t nx = (size_t)N * S + off, ng = (size_t)N * H;
    float *x = frand(nx, 2), *w = frand(D, 1), *R = frand(nx, 1);
    float *out = frand(nx, 1), *out0 = fcopy(out, nx), *rstd = frand(ng, 1);
    zt_cpu_set_threads(threads);
    be->rmsnorm_forward(out + off, rstd, x + off, w, N, H, D, S, eps);
    rms_ctx c = {N, H, D, S, eps, f2d(x + off, nx - off), f2d(w, D), f2d(R + off, nx - off),
                 f2d(out0 + off, nx - off), malloc(ng * 8)};
    rms_ref(&c); /* writes the groups only; the rest keeps out0 */
    double *full = malloc(nx * 8);
    for (int i = 0; i < off; i++) full[i] = out0[i];
    memcpy(full + off, c.out, (nx - off) * 8);
    CU_ASSERT(vec_err(out, full, nx, 1e-6) < 1e-5);
    CU_ASSERT(vec_err(rstd, c.rstd, ng, 1e-6) < 1e-5);

    float *dx = frand(nx, 1), *dw = frand(D, 1), *dx0 = fcopy(dx, nx), *dw0 = fcopy(dw, D);
    be->rmsnorm_backward(dx + off, dw, R + off, x + off, w, rstd, N, H, D, S);
    zt_cpu_set_threads(1);
    double *gw = fd_grad(rms_loss, &c, c.w, D);
    CU_ASSERT(inc_err(dw, dw0, gw, D) < TOL);
    if (fd) {
        double *gx = calloc(nx, 8), *g = fd_grad(rms_loss, &c, c.x, nx - off);
        memcpy(gx + off, g, (nx - off) * 8); /* zero before off: untouched */
        CU_ASSERT(inc_err(dx, dx0, gx, nx) < TOL);
        free(gx), free(g);
    } else {
        /* groups are independent: the threaded dinp equals the one-thread one */
        float *dx1 = fcopy(dx0, nx), *dw1 = fcopy(dw0, D);
        be->rmsnorm_backward(dx1 + off, dw1, R + off, x + off, w, rstd, N, H, D, S);
        CU_ASSERT(memcmp(dx1, dx, nx * 4) == 0);
        double *dwd = f2d(dw, D); /* per-thread partial sums: rounding differs */
        CU_ASSERT(vec_err(dw1, dwd, D, 1e-6) < 1e-5);
        free(dwd);
        be->free(dx1), be->free(dw1);
    }
    free(full), free(gw), free(c.x), free(c.w), free(c.R), free(c.out), free(c.rstd);
    float *bufs[] = {x, w, R, out, out0, rstd, dx, dw, dx0, dw0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

/* H = 1, D = stride = C: the plain norm; eps 0.1 is visible in every output */
static void t_rmsnorm(void) { run_rmsnorm(5, 1, 24, 24, 0, 1e-6f, 1, 1), run_rmsnorm(3, 1, 9, 9, 0, 0.1f, 1, 1); }
/* H = 3 heads of D = 8 at offset 4 of 40-float rows: per-head norms inside qkv */
static void t_rmsnorm_heads(void) { run_rmsnorm(4, 3, 8, 40, 4, 1e-6f, 1, 1); }
/* 512*4*16 = 32768 elements: the threaded backward with per-thread dweight */
static void t_rmsnorm_threads(void) { run_rmsnorm(512, 4, 16, 80, 16, 1e-6f, 2, 0); }

/* ------------------------------------------------------------------- rope -- */

/* B*T rows of stride S, H heads of D at h*D; the angle is the fp32 product
 * (float)pos * inv_freq[i], as the header specifies, then cos/sin in double */
typedef struct { int B, T, H, D, S; const int32_t *pos; const float *inv; double *x, *R, *out; } rope_ctx;

static void rope_ref(rope_ctx *c)
{
    const int half = c->D / 2;
    memcpy(c->out, c->x, (size_t)c->B * c->T * c->S * 8);
    for (int r = 0; r < c->B * c->T; r++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < half; i++) {
                float pf = (float)(c->pos ? c->pos[r] : r % c->T);
                double a = (double)(pf * c->inv[i]);
                size_t o = (size_t)r * c->S + (size_t)h * c->D + i;
                double x1 = c->x[o], x2 = c->x[o + half];
                c->out[o] = x1 * cos(a) - x2 * sin(a);
                c->out[o + half] = x2 * cos(a) + x1 * sin(a);
            }
}

static double rope_loss(void *v)
{
    rope_ctx *c = v;
    rope_ref(c);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->S);
}

static void run_rope(int B, int T, int H, int D, int S, const int32_t *pos)
{
    const size_t nx = (size_t)B * T * S;
    float *x = frand(nx, 1), *R = frand(nx, 1), *inv = be->alloc((size_t)D / 2 * 4);
    /* HF's default inv_freq = base^(-2i/D), base 10000, rescaled per channel so no
     * two channels share a frequency pattern */
    for (int i = 0; i < D / 2; i++)
        inv[i] = (float)(pow(10000.0, -2.0 * i / D) * (1.0 + 0.3 * urand()));
    rope_ctx c = {B, T, H, D, S, pos, inv, f2d(x, nx), f2d(R, nx), malloc(nx * 8)};
    rope_ref(&c);
    be->rope_forward(x, inv, pos, B, T, H, D, S); /* in place; outside the heads untouched */
    CU_ASSERT(vec_err(x, c.out, nx, 1e-6) < 2e-6);
    /* backward in place on the gradient: dx = R^T dout */
    float *dx = fcopy(R, nx);
    be->rope_backward(dx, inv, pos, B, T, H, D, S);
    double *g = fd_grad(rope_loss, &c, c.x, nx);
    CU_ASSERT(vec_err(dx, g, nx, 1e-6) < TOL);
    /* forward then backward is the identity (orthogonal rotation) */
    float *y = fcopy(R, nx);
    be->rope_forward(y, inv, pos, B, T, H, D, S);
    be->rope_backward(y, inv, pos, B, T, H, D, S);
    CU_ASSERT(vec_err(y, c.R, nx, 1e-6) < 1e-6);
    free(g), free(c.x), free(c.R), free(c.out);
    be->free(x), be->free(R), be->free(inv), be->free(dx), be->free(y);
}

static void t_rope(void)
{
    run_rope(2, 5, 1, 8, 8, NULL);     /* positions = t */
    run_rope(2, 4, 3, 6, 22, NULL);    /* 3 heads of 6 in 22-float rows: 4 untouched */
}

static void t_rope_positions(void)
{
    /* arbitrary positions (packed sequences restart, large ones test the fp32 angle) */
    const int32_t pos[] = {0, 1, 2, 0, 1, 7, 4093, 30000, 2, 5};
    run_rope(2, 5, 2, 10, 24, pos);
}

/* ----------------------------------------------------------------- swiglu -- */

typedef struct { int N, I; double *gu, *R, *out; } swi_ctx;

static void swi_ref(swi_ctx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < c->I; i++) {
            double g = c->gu[(size_t)n * 2 * c->I + i], u = c->gu[(size_t)n * 2 * c->I + c->I + i];
            c->out[(size_t)n * c->I + i] = g / (1 + exp(-g)) * u;
        }
}

static double swi_loss(void *v)
{
    swi_ctx *c = v;
    swi_ref(c);
    return dot_r(c->out, c->R, (size_t)c->N * c->I);
}

static void t_swiglu(void)
{
    const int N = 5, I = 11;
    const size_t ng = (size_t)N * 2 * I, no = (size_t)N * I;
    float *gu = frand(ng, 4), *R = frand(no, 1), *out = frand(no, 1);
    gu[0] = 40.0f, gu[1] = -40.0f, gu[2] = 0.0f, gu[3] = -90.0f; /* saturated, zero */
    be->swiglu_forward(out, gu, N, I);
    swi_ctx c = {N, I, f2d(gu, ng), f2d(R, no), malloc(no * 8)};
    swi_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) < 1e-6);
    CU_ASSERT(out[2] == 0.0f && isfinite(out[3]));
    float *dgu = frand(ng, 1); /* garbage: overwritten */
    be->swiglu_backward(dgu, R, gu, N, I);
    double *g = fd_grad(swi_loss, &c, c.gu, ng);
    CU_ASSERT(vec_err(dgu, g, ng, 1e-6) < TOL);
    /* in place (dgu == gu), as the model may call it: the same bits */
    float *ip = fcopy(gu, ng);
    be->swiglu_backward(ip, R, ip, N, I);
    CU_ASSERT(memcmp(ip, dgu, ng * 4) == 0);
    free(g), free(c.gu), free(c.R), free(c.out);
    be->free(gu), be->free(R), be->free(out), be->free(dgu), be->free(ip);
}

/* large enough for the threaded path, against the one-thread result */
static void t_swiglu_threads(void)
{
    const int N = 64, I = 700;
    const size_t ng = (size_t)N * 2 * I, no = (size_t)N * I;
    float *gu = frand(ng, 6), *R = frand(no, 1), *out = be->alloc(no * 4), *out1 = be->alloc(no * 4);
    float *d = be->alloc(ng * 4), *d1 = fcopy(gu, ng);
    zt_cpu_set_threads(2);
    be->swiglu_forward(out, gu, N, I);
    be->swiglu_backward(d, R, gu, N, I);
    zt_cpu_set_threads(1);
    be->swiglu_forward(out1, gu, N, I);
    be->swiglu_backward(d1, R, d1, N, I);
    CU_ASSERT(memcmp(out, out1, no * 4) == 0);
    CU_ASSERT(memcmp(d, d1, ng * 4) == 0);
    swi_ctx c = {N, I, f2d(gu, ng), NULL, malloc(no * 8)};
    swi_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) < 1e-6);
    free(c.gu), free(c.out);
    be->free(gu), be->free(R), be->free(out), be->free(out1), be->free(d), be->free(d1);
}

/* ----------------------------------------------------------------- matmul -- */

typedef struct { int N, C, OC, transw; double *x, *w, *b, *R, *out; } mm_ctx;

static void mm_ref(mm_ctx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = c->b ? c->b[o] : 0;
            for (int k = 0; k < c->C; k++)
                s += c->x[(size_t)n * c->C + k] *
                     (c->transw ? c->w[(size_t)o * c->C + k] : c->w[(size_t)k * c->OC + o]);
            c->out[(size_t)n * c->OC + o] = s;
        }
}

static double mm_loss(void *v)
{
    mm_ctx *c = v;
    mm_ref(c);
    return dot_r(c->out, c->R, (size_t)c->N * c->OC);
}

static void run_matmul(int transw, int with_bias, int N)
{
    int C = 7, OC = 9;
    size_t nx = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    float *x = frand(nx, 1), *w = frand(nw, 1), *b = with_bias ? frand(OC, 1) : NULL;
    float *R = frand(no, 1), *out = frand(no, 1); /* garbage in out: forward must overwrite */
    be->matmul_forward(out, x, w, b, N, C, OC, transw);
    mm_ctx c = {N, C, OC, transw, f2d(x, nx), f2d(w, nw), b ? f2d(b, OC) : NULL, f2d(R, no),
                malloc(no * 8)};
    mm_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) < 1e-5);

    /* garbage in dx: the input gradient is overwritten; the parameter gradients accumulate */
    float *dx = frand(nx, 1), *dw = frand(nw, 1), *db = frand(OC, 1);
    float *dx0 = fcopy(dx, nx), *dw0 = fcopy(dw, nw), *db0 = fcopy(db, OC);
    be->matmul_backward(dx, dw, with_bias ? db : NULL, R, x, w, N, C, OC, transw);
    double *gx = fd_grad(mm_loss, &c, c.x, nx);
    double *gw = fd_grad(mm_loss, &c, c.w, nw);
    CU_ASSERT(vec_err(dx, gx, nx, 1e-6) < TOL);
    CU_ASSERT(inc_err(dw, dw0, gw, nw) < TOL);
    if (with_bias) {
        double *gb = fd_grad(mm_loss, &c, c.b, OC);
        CU_ASSERT(inc_err(db, db0, gb, OC) < TOL);
        free(gb);
    } else {
        CU_ASSERT(memcmp(db, db0, OC * 4) == 0); /* NULL dbias: nothing written */
    }
    /* dinp == NULL skips the input gradient but still accumulates dweight */
    float *dw1 = fcopy(dw, nw);
    be->matmul_backward(NULL, dw, NULL, R, x, w, N, C, OC, transw);
    CU_ASSERT(inc_err(dw, dw1, gw, nw) < TOL);
    free(gx), free(gw), free(c.x), free(c.w), free(c.b), free(c.R), free(c.out);
    float *bufs[] = {x, w, b, R, out, dx, dw, db, dx0, dw0, db0, dw1};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

/* Positions per token (neat packing: they restart at every packed sample, so rows of
 * dwpe repeat within a row and across rows), threaded, against double + FD; and the
 * positions 0..T-1 given as an array equal NULL bit for bit. */
static void t_positional_positions(void)
{
    int B = 2, T = 9, C = 150, maxT = 12; /* C > 64: the backward's threads split channels */
    const int32_t pos[18] = {0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 0, 1};
    size_t no = (size_t)B * T * C, nw = (size_t)maxT * C;
    float *wpe = frand(nw, 1), *R = frand(no, 1), *out = frand(no, 1), *out0 = fcopy(out, no);
    enc_ctx c = {B, T, C, NULL, NULL, f2d(wpe, nw), f2d(out, no), f2d(R, no), malloc(no * 8), pos};
    zt_cpu_set_threads(2);
    be->positional_forward(out, wpe, pos, B, T, C);
    pos_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) < 1e-6);
    float *dwpe = frand(nw, 1), *dwpe0 = fcopy(dwpe, nw);
    be->positional_backward(dwpe, R, pos, B, T, C);
    zt_cpu_set_threads(1);
    double *g = fd_grad(pos_loss, &c, c.wpe, nw); /* rows 6.. unused: zero gradient, untouched */
    CU_ASSERT(inc_err(dwpe, dwpe0, g, nw) < TOL);
    CU_ASSERT(memcmp(dwpe + (size_t)6 * C, dwpe0 + (size_t)6 * C, (nw - (size_t)6 * C) * 4) == 0);
    int32_t tpos[18];
    for (int i = 0; i < B * T; i++) tpos[i] = i % T;
    float *a = fcopy(out0, no), *d1 = fcopy(dwpe0, nw), *d2 = fcopy(dwpe0, nw);
    be->positional_forward(out0, wpe, NULL, B, T, C);
    be->positional_forward(a, wpe, tpos, B, T, C);
    be->positional_backward(d1, R, NULL, B, T, C);
    be->positional_backward(d2, R, tpos, B, T, C);
    CU_ASSERT(memcmp(out0, a, no * 4) == 0);
    CU_ASSERT(memcmp(d1, d2, nw * 4) == 0); /* the same (b, t) order of the sums */
    free(g), free(c.wpe), free(c.base), free(c.R), free(c.out);
    float *bufs[] = {wpe, R, out, out0, dwpe, dwpe0, a, d1, d2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

static void t_matmul(void) { run_matmul(0, 1, 5); }
static void t_matmul_nobias(void) { run_matmul(0, 0, 5); }
static void t_matmul_transw(void) { run_matmul(1, 0, 5); }
static void t_matmul_transw_bias(void) { run_matmul(1, 1, 5); }
/* one row (generation's next token: the forward is a matrix-vector product) */
static void t_matmul_one_row(void)
{
    for (int k = 0; k < 4; k++) run_matmul(k & 1, k >> 1, 1);
}

/* lowrank_backward (LoRA's B side): dp (N,r) = dy B, dB (O,r) += dy^T p, against double.
 * N not a multiple of the CPU kernel's 8-row blocks, every operand inside wider rows, dB
 * starting nonzero; r = 8 takes the CPU's fused kernel, other ranks its two GEMMs. */
static void run_lowrank(int N, int O, int r, int with_db)
{
    const int ldy = O + 3, ldp = r + 5, lddp = r + 2;
    float *dy = frand((size_t)N * ldy, 1.0), *B = frand((size_t)O * r, 1.0), *p = frand((size_t)N * ldp, 1.0);
    float *dp = frand((size_t)N * lddp, 1.0), *dB = frand((size_t)O * r, 1.0), *dB0 = fcopy(dB, (size_t)O * r);
    double *edp = calloc((size_t)N * r, sizeof(double)), *edB = calloc((size_t)O * r, sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < O; j++)
            for (int k = 0; k < r; k++) {
                edp[(size_t)n * r + k] += (double)dy[(size_t)n * ldy + j] * B[(size_t)j * r + k];
                edB[(size_t)j * r + k] += (double)dy[(size_t)n * ldy + j] * p[(size_t)n * ldp + k];
            }
    be->lowrank_backward(N, O, r, dy, ldy, B, p, ldp, dp, lddp, with_db ? dB : NULL);
    float *got = malloc((size_t)N * r * sizeof(float));
    for (int n = 0; n < N; n++) memcpy(got + (size_t)n * r, dp + (size_t)n * lddp, (size_t)r * sizeof(float));
    CU_ASSERT(vec_err(got, edp, (size_t)N * r, 1e-6) < 1e-5);
    if (with_db) {
        CU_ASSERT(inc_err(dB, dB0, edB, (size_t)O * r) < 1e-5);
    } else {
        CU_ASSERT(memcmp(dB, dB0, (size_t)O * r * sizeof(float)) == 0);
    }
    float *bufs[] = {dy, B, p, dp, dB, dB0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    free(edp), free(edB), free(got);
}

static void t_lowrank(void)
{
    run_lowrank(37, 19, 8, 1); /* four 8-row blocks and 5 rows */
    run_lowrank(64, 300, 8, 1);
    run_lowrank(5, 7, 8, 1);  /* fewer rows than a block */
    run_lowrank(37, 19, 8, 0); /* dp alone */
    run_lowrank(21, 13, 5, 1); /* another rank */
}

/* -------------------------------------------------------------- attention -- */

typedef struct { int B, T, NH, NKV, HD; double *qkv, *R, *out, *lse, *p; const int32_t *seg; int window; } at_ctx;

/* channel offsets in a qkv row of (NH + 2 NKV) HD floats: query head h, and the
 * key and value of the KV head that query head h reads (h / (NH/NKV)) */
#define AT_QS(c) (((c)->NH + 2 * (c)->NKV) * (c)->HD)
#define AT_Q(c, h) ((h) * (c)->HD)
#define AT_K(c, h) (((c)->NH + (h) / ((c)->NH / (c)->NKV)) * (c)->HD)
#define AT_V(c, h) (((c)->NH + (c)->NKV + (h) / ((c)->NH / (c)->NKV)) * (c)->HD)
/* key j visible from query t of row b (j <= t): always, or with segments in t's segment
 * (a padding query's, -s: in s), and with a window when t - j < window */
#define AT_SEES(c, b, t, j)                                                                                  \
    ((!(c)->seg || (c)->seg[(size_t)(b) * (c)->T + (j)] == abs((c)->seg[(size_t)(b) * (c)->T + (t)])) && \
     (!(c)->window || (t) - (j) < (c)->window))

/* Naive causal attention in double: per row the masked scores, their max, the
 * log-sum-exp and the probabilities, then out = P V. With segments a key of another
 * segment is masked like a later one (its score -inf, its probability 0). */
static void at_ref(at_ctx *c)
{
    int B = c->B, T = c->T, NH = c->NH, hs = c->HD, QS = AT_QS(c), OS = NH * hs;
    double sc = 1.0 / sqrt(hs), *a = c->p; /* (T) one row of probabilities */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c->qkv + ((size_t)b * T + t) * QS + AT_Q(c, h);
                double mx = -INFINITY, s = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = c->qkv + ((size_t)b * T + j) * QS + AT_K(c, h);
                    a[j] = 0;
                    if (!AT_SEES(c, b, t, j)) {
                        a[j] = -INFINITY;
                        continue;
                    }
                    for (int i = 0; i < hs; i++) a[j] += q[i] * k[i];
                    a[j] *= sc;
                    if (a[j] > mx) mx = a[j];
                }
                for (int j = 0; j <= t; j++) s += (a[j] = exp(a[j] - mx));
                for (int j = 0; j <= t; j++) a[j] /= s;
                c->lse[((size_t)b * NH + h) * T + t] = mx + log(s);
                double *o = c->out + ((size_t)b * T + t) * OS + h * hs;
                for (int i = 0; i < hs; i++) {
                    o[i] = 0;
                    for (int j = 0; j <= t; j++)
                        o[i] += a[j] * c->qkv[((size_t)b * T + j) * QS + AT_V(c, h) + i];
                }
            }
}

/* The backward formulas of zt_backend.h in double, from the reference forward:
 * D = dout.out, ds = p (dout.v - D), dq += scale ds k, dk += scale ds q, dv += p dout,
 * a KV head summing over the query heads that read it. */
static void at_ref_backward(at_ctx *c, double *dqkv)
{
    int B = c->B, T = c->T, NH = c->NH, hs = c->HD, QS = AT_QS(c), OS = NH * hs;
    double sc = 1.0 / sqrt(hs);
    at_ref(c);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t rq = ((size_t)b * T + t) * QS + AT_Q(c, h);
                const double *q = c->qkv + rq, *dy = c->R + ((size_t)b * T + t) * OS + h * hs;
                const double *y = c->out + ((size_t)b * T + t) * OS + h * hs;
                const double l = c->lse[((size_t)b * NH + h) * T + t];
                double D = 0;
                for (int i = 0; i < hs; i++) D += dy[i] * y[i];
                for (int j = 0; j <= t; j++) {
                    if (!AT_SEES(c, b, t, j)) continue;
                    const size_t rk = ((size_t)b * T + j) * QS + AT_K(c, h);
                    const size_t rv = ((size_t)b * T + j) * QS + AT_V(c, h);
                    const double *k = c->qkv + rk, *v = c->qkv + rv;
                    double s = 0, dp = 0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i], dp += dy[i] * v[i];
                    double p = exp(s * sc - l), ds = p * (dp - D);
                    for (int i = 0; i < hs; i++) {
                        dqkv[rq + i] += sc * ds * k[i];
                        dqkv[rk + i] += sc * ds * q[i];
                        dqkv[rv + i] += p * dy[i];
                    }
                }
            }
}

static double at_loss(void *v)
{
    at_ctx *c = v;
    at_ref(c);
    return dot_r(c->out, c->R, (size_t)c->B * c->T * c->NH * c->HD);
}

/* Forward (out and lse) against the double reference; backward (dqkv +=) by
 * finite differences of L = sum(out * R) when fd is set, and against the
 * double backward formulas always. seg (B,T) or NULL and window, as the kernels take them. */
static void run_gqa_win(int B, int T, int NH, int NKV, int HD, int threads, int fd, const int32_t *seg, int window)
{
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD;
    size_t nl = (size_t)B * NH * T;
    float *qkv = frand(nq, 1.5), *R = frand(no, 1);
    float *out = frand(no, 1), *lse = frand(nl, 1);
    zt_cpu_set_threads(threads);
    be->attention_forward(out, lse, qkv, seg, B, T, NH, NKV, HD, window);
    at_ctx c = {B, T, NH, NKV, HD, f2d(qkv, nq), f2d(R, no), malloc(no * 8), malloc(nl * 8),
                malloc((size_t)T * 8), seg, window};
    at_ref(&c);
    CU_ASSERT(vec_err(out, c.out, no, 1e-6) < 1e-5);
    CU_ASSERT(vec_err(lse, c.lse, nl, 1.0) < 1e-6);

    float *dq = frand(nq, 1), *dq0 = fcopy(dq, nq);
    be->attention_backward(dq, R, qkv, out, lse, seg, B, T, NH, NKV, HD, window);
    zt_cpu_set_threads(1);
    double *g = calloc(nq, sizeof(double));
    at_ref_backward(&c, g);
    CU_ASSERT(inc_err(dq, dq0, g, nq) < 1e-5);
    if (fd) {
        double *gf = fd_grad(at_loss, &c, c.qkv, nq);
        CU_ASSERT(inc_err(dq, dq0, gf, nq) < TOL);
        free(gf);
    }
    free(g), free(c.qkv), free(c.R), free(c.out), free(c.lse), free(c.p);
    float *bufs[] = {qkv, R, out, lse, dq, dq0};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

static void run_gqa_seg(int B, int T, int NH, int NKV, int HD, int threads, int fd, const int32_t *seg)
{
    run_gqa_win(B, T, NH, NKV, HD, threads, fd, seg, 0);
}

static void run_gqa(int B, int T, int NH, int NKV, int HD, int threads, int fd)
{
    run_gqa_seg(B, T, NH, NKV, HD, threads, fd, NULL);
}

/* GPT-2's multi-head attention: NKV = NH, HD = C / NH */
static void run_attention(int B, int T, int C, int NH, int threads, int fd)
{
    run_gqa(B, T, NH, NH, C / NH, threads, fd);
}

static void t_attention(void)
{
    run_attention(2, 5, 8, 2, 1, 1);
    run_attention(2, 1, 8, 2, 1, 1); /* one visible key: out = v, lse = its score */
}
static void t_attention_threads(void) { run_attention(2, 16, 32, 4, 2, 1); }
/* T not a multiple of any block or tile: the CPU backend's query blocks are
 * T/4 rows in [32, 128] (T = 131: four blocks of 32 and one of 3; T = 600: four
 * of 128 and one of 88), the CUDA kernels' tiles 32 rows; hs = 24 and 4. */
static void t_attention_ragged(void) { run_attention(1, 131, 48, 2, 2, 0); }
static void t_attention_long(void) { run_attention(1, 600, 8, 2, 2, 0); }
/* finite differences across block boundaries: T = 70 is 32 + 32 + 6 */
static void t_attention_blocks_fd(void) { run_attention(1, 70, 8, 2, 1, 1); }
/* grouped-query: 4 query heads on 2 KV heads, head size 12 unrelated to any C */
static void t_attention_gqa(void)
{
    run_gqa(2, 5, 4, 2, 12, 1, 1);
    run_gqa(1, 6, 4, 1, 8, 1, 1); /* NKV = 1: multi-query */
    run_gqa(2, 3, 3, 3, 5, 1, 1); /* odd head size, NKV = NH */
}
/* threaded (KV heads in parallel, each summing its group) and across blocks */
static void t_attention_gqa_threads(void)
{
    run_gqa(2, 16, 6, 2, 12, 2, 1);
    run_gqa(1, 70, 8, 2, 20, 2, 0);
    run_gqa(2, 40, 4, 1, 16, 2, 0);
}
/* the fp32 kernels stack a group's query heads (att_group_rows per head): 3 heads a KV
 * head in ragged 16-row blocks (T = 100), 8 heads a stack, and 16 heads a group in two
 * stacks of 8 */
static void t_attention_gqa_stacked(void)
{
    run_gqa(1, 100, 6, 2, 16, 1, 1);
    run_gqa(2, 40, 8, 1, 8, 2, 0);
    run_gqa(1, 37, 16, 1, 4, 1, 0);
}
/* the largest head size the interface allows */
static void t_attention_hd256(void) { run_gqa(1, 9, 2, 1, 256, 1, 0); }

/* Ring attention's pieces: the sequence in two chunks a, b; out_a = block(a, a, causal),
 * out_b = block(b, a, full) merged with block(b, b, causal) equal the causal attention
 * of the whole, and the pairs' backwards (with the merged out and lse) add up to its
 * backward. Both against the fp32 full kernels, which the references above check. With
 * a sliding window the (b, a) block is offset by delta = c: rows of b whose window ends
 * before chunk a see none of its keys (out 0, lse -inf, merged away). */
static void run_ring_blocks_win(int B, int T, int NH, int NKV, int HD, int window)
{
    const int c = T / 2, S = (NH + 2 * NKV) * HD, Q = NH * HD, kw = 2 * NKV * HD;
    const size_t nq = (size_t)B * T * S, no = (size_t)B * T * Q, nl = (size_t)B * NH * T;
    float *qkv = frand(nq, 1.5), *dout = frand(no, 1);
    float *out = frand(no, 1), *lse = frand(nl, 1), *dq = frand(nq, 1);
    be->attention_forward(out, lse, qkv, NULL, B, T, NH, NKV, HD, window);
    /* chunk-major copies: (B, c) rows of chunk h at h B c */
    float *q2 = be->alloc(nq * 4), *kv2 = be->alloc((size_t)B * T * kw * 4), *dy2 = be->alloc(no * 4);
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < B; b++) {
            const size_t src = (size_t)b * T + (size_t)h * c, dst = ((size_t)h * B + b) * c;
            memcpy(q2 + dst * S, qkv + src * S, (size_t)c * S * 4);
            memcpy(dy2 + dst * Q, dout + src * Q, (size_t)c * Q * 4);
            for (int t = 0; t < c; t++) memcpy(kv2 + (dst + t) * kw, qkv + (src + t) * S + Q, (size_t)kw * 4);
        }
    const size_t Nh = (size_t)B * c, L = (size_t)B * NH * c;
    float *o2 = be->alloc(no * 4), *l2 = be->alloc(nl * 4), *ot = be->alloc(Nh * Q * 4), *lt = be->alloc(L * 4);
    const float *ka = kv2, *kb = kv2 + Nh * kw;
    be->attention_block_forward(o2, l2, q2, S, ka, ka + NKV * HD, kw, NULL, NULL, B, c, c, NH, NKV, HD, 1, window, 0);
    be->attention_block_forward(o2 + Nh * Q, l2 + L, q2 + Nh * S, S, kb, kb + NKV * HD, kw, NULL, NULL, B, c, c, NH,
                                NKV, HD, 1, window, 0);
    be->attention_block_forward(ot, lt, q2 + Nh * S, S, ka, ka + NKV * HD, kw, NULL, NULL, B, c, c, NH, NKV, HD, 0,
                                window, c);
    be->attention_merge(o2 + Nh * Q, l2 + L, ot, lt, B, c, NH, HD);
    double eo = 0, el = 0;
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < c; t++) {
                const size_t src = (size_t)b * T + (size_t)h * c + t, dst = ((size_t)h * B + b) * c + t;
                for (int i = 0; i < Q; i++) eo = fmax(eo, fabs(o2[dst * Q + i] - out[src * Q + i]));
                for (int k = 0; k < NH; k++)
                    el = fmax(el, fabs(l2[(size_t)h * L + ((size_t)b * NH + k) * c + t] -
                                       lse[((size_t)b * NH + k) * T + (size_t)h * c + t]));
            }
    CU_ASSERT(eo < 2e-6);
    CU_ASSERT(el < 2e-6);
    /* backward: the full kernel's dqkv (+= into dq) against the pairs' sums */
    float *dq0 = fcopy(dq, nq);
    be->attention_backward(dq, dout, qkv, out, lse, NULL, B, T, NH, NKV, HD, window);
    float *dq2 = be->alloc(nq * 4), *dkv = be->alloc((size_t)B * T * kw * 4);
    float *da = dkv, *db = dkv + Nh * kw;
    be->attention_block_backward(dq2, da, da + NKV * HD, dy2, q2, S, ka, ka + NKV * HD, kw, NULL, NULL, o2, l2, B, c, c, NH,
                                 NKV, HD, 1, window, 0);
    be->attention_block_backward(dq2 + Nh * S, db, db + NKV * HD, dy2 + Nh * Q, q2 + Nh * S, S, kb, kb + NKV * HD,
                                 kw, NULL, NULL, o2 + Nh * Q, l2 + L, B, c, c, NH, NKV, HD, 1, window, 0);
    be->attention_block_backward(dq2 + Nh * S, da, da + NKV * HD, dy2 + Nh * Q, q2 + Nh * S, S, ka, ka + NKV * HD,
                                 kw, NULL, NULL, o2 + Nh * Q, l2 + L, B, c, c, NH, NKV, HD, 0, window, c);
    double eg = 0, mg = 0;
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < c; t++) {
                const size_t src = (size_t)b * T + (size_t)h * c + t, dst = ((size_t)h * B + b) * c + t;
                for (int i = 0; i < S; i++) {
                    const double full = dq[src * S + i] - dq0[src * S + i];
                    const double ring = i < Q ? dq2[dst * S + i] : dkv[dst * kw + i - Q];
                    eg = fmax(eg, fabs(full - ring)), mg = fmax(mg, fabs(full));
                }
            }
    CU_ASSERT(mg > 1e-3);   /* the gradients are not all zero */
    CU_ASSERT(eg < 1e-5 * (1 + mg));
    float *bufs[] = {qkv, dout, out, lse, dq, q2, kv2, dy2, o2, l2, ot, lt, dq0, dq2, dkv};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

static void run_ring_blocks(int B, int T, int NH, int NKV, int HD) { run_ring_blocks_win(B, T, NH, NKV, HD, 0); }

/* windows reaching into the other chunk for some rows (5 over chunks of 8; 37 over
 * chunks of 70, query blocks of 32 whose every row sees none), for none (1: the (b, a)
 * block all empty), and beyond it (9 > c) */
static void t_ring_blocks_window(void)
{
    run_ring_blocks_win(2, 16, 4, 2, 8, 5);
    run_ring_blocks_win(1, 140, 2, 1, 12, 37);
    run_ring_blocks_win(2, 16, 4, 2, 8, 1);
    run_ring_blocks_win(2, 16, 2, 2, 5, 9);
}

/* LoRA dropout's counter-based mask: p of the elements dropped (within 5 sigma of a
 * binomial), the kept ones scaled by 1/(1-p) exactly, the same keys and salt the same
 * mask (in place too), another salt another mask */
static void t_dropout_mask(void)
{
    enum { N = 64, C = 96 };
    const float p = 0.25f;
    uint64_t *keys = be->alloc(N * sizeof(uint64_t));
    for (int n = 0; n < N; n++) keys[n] = 1000003ull * (uint64_t)n + 7;
    float *x = frand((size_t)N * C, 1), *y = be->alloc((size_t)N * C * 4), *z = fcopy(x, (size_t)N * C);
    float *w = be->alloc((size_t)N * C * 4);
    be->dropout_mask(y, x, keys, 42, N, C, 0, p);
    be->dropout_mask(z, z, keys, 42, N, C, 0, p);
    be->dropout_mask(w, x, keys, 43, N, C, 0, p);
    int dropped = 0, same = 1, scaled = 1, differ = 0;
    for (int i = 0; i < N * C; i++) {
        dropped += y[i] == 0.0f;
        same &= y[i] == z[i];
        scaled &= y[i] == 0.0f || y[i] == x[i] * (1.0f / (1.0f - p));
        differ += (y[i] == 0.0f) != (w[i] == 0.0f);
    }
    const double mean = p * N * C, sd = sqrt(mean * (1 - p));
    CU_ASSERT(fabs(dropped - mean) < 5 * sd);
    CU_ASSERT(same);
    CU_ASSERT(scaled);
    CU_ASSERT(differ > N * C / 10);
    /* a tp rank's column slice [h, C) of x, told its first column, draws that slice of
     * the whole mask (and not the mask of columns [0, C - h)) */
    enum { H = 40 };
    float *xs = be->alloc((size_t)N * (C - H) * 4), *ys = be->alloc((size_t)N * (C - H) * 4);
    for (int n = 0; n < N; n++)
        for (int c = H; c < C; c++) xs[n * (C - H) + c - H] = x[n * C + c];
    be->dropout_mask(ys, xs, keys, 42, N, C - H, H, p);
    int slice = 1, shifted = 0;
    for (int n = 0; n < N; n++)
        for (int c = H; c < C; c++) {
            slice &= ys[n * (C - H) + c - H] == y[n * C + c];
            shifted += (ys[n * (C - H) + c - H] == 0.0f) != (y[n * C + c - H] == 0.0f);
        }
    CU_ASSERT(slice);
    CU_ASSERT(shifted > N * (C - H) / 10);
    be->free(xs), be->free(ys);
    be->free(keys), be->free(x), be->free(y), be->free(z), be->free(w);
}

static void t_attention_ring_blocks(void)
{
    run_ring_blocks(2, 16, 4, 2, 8);
    run_ring_blocks(1, 140, 2, 1, 12); /* chunks of 70: query blocks across the chunk */
    run_ring_blocks(2, 6, 3, 3, 5);
}

/* ---- packed rows (neat packing) ---- */

/* Segments against the masked double reference + FD: packed runs of 3, 2, 4 tokens
 * (row 0), a 6-token run after a 3-token one and padding 0s (row 1), and, since the
 * contract is equality of ids and not runs, an id that comes back (row 2: the first
 * and third run see each other) */
static void t_attention_segments_fd(void)
{
    const int32_t seg[27] = {1, 1, 1, 2, 2, 3, 3, 3, 3,  5, 5, 5, 6, 6, 6, 6, 6, 6,  1, 1, 2, 2, 1, 1, 1, 0, 0};
    run_gqa_seg(3, 9, 4, 2, 6, 1, 1, seg);
    run_gqa_seg(3, 9, 2, 2, 5, 2, 1, seg);
}

/* Long segments against the double reference, threaded: blocks of 32 query rows
 * cut by segments of 29 tokens and of 7 (row 1: whole blocks whose first rows' segment
 * starts in an earlier block), GQA */
static void t_attention_segments_blocks(void)
{
    enum { B = 2, T = 131 };
    static int32_t seg[B * T];
    for (int t = 0; t < T; t++) seg[t] = 1 + t / 29, seg[T + t] = 1 + t / 7;
    run_gqa_seg(B, T, 4, 2, 16, 2, 0, seg);
}

/* Sliding windows against the masked double reference: + FD on short rows (window 1:
 * each query sees itself alone; 3; 8 = T: no key left out), threaded on long rows whose
 * query blocks (32 and 75 rows) start inside and outside the window of their first
 * row, with packed segments shorter and longer than the window, GQA. A window of T or
 * more is the plain kernel bit for bit. */
static void t_attention_window(void)
{
    enum { B = 2, T = 300 };
    run_gqa_win(2, 8, 4, 2, 6, 1, 1, NULL, 1);
    run_gqa_win(2, 8, 4, 2, 6, 1, 1, NULL, 3);
    run_gqa_win(2, 8, 2, 1, 5, 2, 1, NULL, 8);
    const int32_t seg9[18] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 5, 5, 6, 6, 6, 6, 6, 6, 6};
    run_gqa_win(2, 9, 4, 2, 6, 1, 1, seg9, 3);
    run_gqa_win(B, 131, 4, 2, 16, 2, 0, NULL, 37);
    run_gqa_win(B, T, 4, 2, 16, 2, 0, NULL, 100);
    static int32_t seg[B * T];
    for (int t = 0; t < T; t++) seg[t] = 1 + t / 29, seg[T + t] = 1 + t / 140;
    run_gqa_win(B, T, 4, 2, 16, 2, 0, seg, 50);

    const int NH = 2, NKV = 1, HD = 8, t2 = 70;
    const size_t nq = (size_t)t2 * (NH + 2 * NKV) * HD, no = (size_t)t2 * NH * HD, nl = (size_t)NH * t2;
    float *qkv = frand(nq, 1.5), *dout = frand(no, 1);
    float *o[2], *l[2], *d[2];
    for (int r = 0; r < 2; r++) {
        o[r] = be->alloc(no * 4), l[r] = be->alloc(nl * 4), d[r] = be->alloc(nq * 4);
        be->attention_forward(o[r], l[r], qkv, NULL, 1, t2, NH, NKV, HD, r ? t2 : 0);
        be->attention_backward(d[r], dout, qkv, o[r], l[r], NULL, 1, t2, NH, NKV, HD, r ? t2 : 0);
    }
    CU_ASSERT(memcmp(o[0], o[1], no * 4) == 0 && memcmp(l[0], l[1], nl * 4) == 0 && memcmp(d[0], d[1], nq * 4) == 0);
    for (int r = 0; r < 2; r++) be->free(o[r]), be->free(l[r]), be->free(d[r]);
    be->free(qkv), be->free(dout);
}

/* Packed = apart: each segment of a packed row gives the out, lse and dqkv it gives
 * as a row of its own (B = 1, T = its length). The two differ only in blocking: the
 * packed row's query blocks start at other rows, so the score rows are cut
 * elsewhere and the softmax sum and the P V, dS K, dS^T Q, P^T dO products add the
 * same terms (the masked ones are exact zeros) in another order. A sum of n terms
 * in fp32 is off by at most (n-1) u sum |term| (u = 2^-24), and the terms of these
 * sums are at most their largest input (p <= 1, sum p = 1), so two orders differ
 * by at most 2 n u relative to the scale of the inputs (n <= the longest segment,
 * 37); the score dot products over HD add HD u. Bound: 2 (37 + HD) u with the
 * inputs' amplitude as the floor. Also:
 * segment ids all equal = NULL, bit for bit (one segment is plain causal). */
/* Padding as HF's attention_mask hides it (segment -s: a query that sees segment s and a
 * key no query sees, its own included; LLaMA-Factory's right-padded DPO rows): against the
 * masked double reference + FD on short rows (padding after one sample, and after the
 * second of two packed ones), threaded on long rows across query blocks; the sample's
 * own rows are plain causal attention's bit for bit. */
static void t_attention_padding(void)
{
    const int32_t pad8[16] = {1, 1, 1, 1, 1, -1, -1, -1, 1, 1, 2, 2, 2, 2, -2, -2};
    run_gqa_seg(2, 8, 4, 2, 6, 1, 1, pad8);
    enum { B = 2, T = 300, NH = 4, NKV = 2, HD = 16 };
    const int n[B] = {200, 257};
    static int32_t seg[B * T];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) seg[b * T + t] = t < n[b] ? 1 : -1;
    run_gqa_seg(B, T, NH, NKV, HD, 2, 0, seg);
    const size_t nq = (size_t)B * T * (NH + 2 * NKV) * HD, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
    float *qkv = frand(nq, 1.5), *o[2], *l[2];
    zt_cpu_set_threads(2);
    for (int r = 0; r < 2; r++) {
        o[r] = be->alloc(no * 4), l[r] = be->alloc(nl * 4);
        be->attention_forward(o[r], l[r], qkv, r ? seg : NULL, B, T, NH, NKV, HD, 0);
    }
    zt_cpu_set_threads(1);
    int same = 1;
    for (int b = 0; b < B; b++) {
        const size_t r0 = (size_t)b * T * NH * HD;
        same = same && memcmp(o[0] + r0, o[1] + r0, (size_t)n[b] * NH * HD * 4) == 0;
        for (int h = 0; h < NH; h++) {
            const size_t l0 = ((size_t)b * NH + h) * T;
            same = same && memcmp(l[0] + l0, l[1] + l0, (size_t)n[b] * 4) == 0;
        }
    }
    CU_ASSERT(same);
    for (int r = 0; r < 2; r++) be->free(o[r]), be->free(l[r]);
    be->free(qkv);
}

static void t_attention_segments_apart(void)
{
    enum { T = 100, NH = 4, NKV = 2, HD = 16 };
    const int len[] = {37, 1, 30, 32}; /* 37 + 1 + 30 + 32 = T: a 1-token sample too */
    const int QS = (NH + 2 * NKV) * HD, OS = NH * HD;
    int32_t seg[T];
    for (int i = 0, t = 0; i < 4; i++)
        for (int k = 0; k < len[i]; k++) seg[t++] = i + 1;
    const size_t nq = (size_t)T * QS, no = (size_t)T * OS, nl = (size_t)NH * T;
    float *qkv = frand(nq, 1.5), *dout = frand(no, 1), *out = frand(no, 1), *lse = frand(nl, 1);
    float *dq = be->alloc(nq * 4);
    zt_cpu_set_threads(2);
    be->attention_forward(out, lse, qkv, seg, 1, T, NH, NKV, HD, 0);
    be->attention_backward(dq, dout, qkv, out, lse, seg, 1, T, NH, NKV, HD, 0);
    const double bound = 2.0 * (37 + HD) * 0x1p-24;
    double worst[3] = {0, 0, 0};
    for (int i = 0, s0 = 0; i < 4; s0 += len[i++]) {
        const int n = len[i];
        float *q1 = fcopy(qkv + (size_t)s0 * QS, (size_t)n * QS), *dy1 = fcopy(dout + (size_t)s0 * OS, (size_t)n * OS);
        float *o1 = be->alloc((size_t)n * OS * 4), *l1 = be->alloc((size_t)NH * n * 4), *dq1 = be->alloc((size_t)n * QS * 4);
        be->attention_forward(o1, l1, q1, NULL, 1, n, NH, NKV, HD, 0);
        be->attention_backward(dq1, dy1, q1, o1, l1, NULL, 1, n, NH, NKV, HD, 0);
        double *ro = f2d(o1, (size_t)n * OS), *rd = f2d(dq1, (size_t)n * QS), *rl = malloc((size_t)NH * n * 8);
        float *pl = malloc((size_t)NH * n * 4);
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < n; t++) {
                rl[h * n + t] = l1[h * n + t];
                pl[h * n + t] = lse[(size_t)h * T + s0 + t];
            }
        const double e[3] = {vec_err(out + (size_t)s0 * OS, ro, (size_t)n * OS, 1.5),
                             vec_err(pl, rl, (size_t)NH * n, 1.5),
                             vec_err(dq + (size_t)s0 * QS, rd, (size_t)n * QS, 1.5)};
        for (int k = 0; k < 3; k++) worst[k] = fmax(worst[k], e[k]);
        free(ro), free(rd), free(rl), free(pl);
        float *bufs[] = {q1, dy1, o1, l1, dq1};
        for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) be->free(bufs[k]);
    }
    printf("\n    packed vs apart: out %.1e lse %.1e dqkv %.1e (bound %.1e)\n", worst[0], worst[1], worst[2], bound);
    for (int k = 0; k < 3; k++) CU_ASSERT(worst[k] <= bound);
    /* the check has teeth: without the segments the later samples see the earlier ones */
    float *o2 = be->alloc(no * 4), *l2 = be->alloc(nl * 4);
    be->attention_forward(o2, l2, qkv, NULL, 1, T, NH, NKV, HD, 0);
    double *ref = f2d(out, no);
    CU_ASSERT(vec_err(o2, ref, no, 1.5) > 1e3 * bound);
    free(ref);
    /* one segment = NULL, bitwise, forward and backward */
    int32_t one[T];
    for (int t = 0; t < T; t++) one[t] = 7;
    float *o3 = be->alloc(no * 4), *l3 = be->alloc(nl * 4), *d2 = be->alloc(nq * 4), *d3 = be->alloc(nq * 4);
    be->attention_forward(o3, l3, qkv, one, 1, T, NH, NKV, HD, 0);
    be->attention_backward(d2, dout, qkv, o2, l2, NULL, 1, T, NH, NKV, HD, 0);
    be->attention_backward(d3, dout, qkv, o3, l3, one, 1, T, NH, NKV, HD, 0);
    CU_ASSERT(memcmp(o2, o3, no * 4) == 0 && memcmp(l2, l3, nl * 4) == 0 && memcmp(d2, d3, nq * 4) == 0);
    zt_cpu_set_threads(1);
    float *bufs[] = {qkv, dout, out, lse, dq, o2, l2, o3, l3, d2, d3};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) be->free(bufs[k]);
}

/* ------------------------------------------------------------------- gelu -- */

static double gelu_ref(double x)
{
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void t_gelu(void)
{
    /* a sweep over [-12, 12] (tanh saturates both ways) plus random points */
    size_t n = 2401;
    float *x = be->alloc(n * 4), *y = be->alloc(n * 4), *dy = frand(n, 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)(-12.0 + 0.01 * i);
    x[7] = 1e-4f, x[8] = -3e-3f, x[9] = 0.0f;
    be->gelu_forward(y, x, n);
    double *ref = malloc(n * 8), *gref = malloc(n * 8);
    double maxrel = 0;
    for (size_t i = 0; i < n; i++) {
        ref[i] = gelu_ref(x[i]);
        /* relative to max(|y|, 1e-4 |x|): tiny outputs near zero are still judged */
        double e = fabs(y[i] - ref[i]) / fmax(fmax(fabs(ref[i]), 1e-4 * fabs(x[i])), 1e-12);
        if (e > maxrel) maxrel = e;
        double h = 1e-5;
        gref[i] = dy[i] * (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
    }
    CU_ASSERT(maxrel < 1e-4);
    CU_ASSERT(y[9] == 0.0f);
    float *dx = frand(n, 1); /* garbage: gelu_backward overwrites */
    be->gelu_backward(dx, x, dy, n);
    CU_ASSERT(vec_err(dx, gref, n, 1e-6) < TOL);
    free(ref), free(gref);
    be->free(x), be->free(y), be->free(dy), be->free(dx);
}

/* ------------------------------------------------------ fused MLP halves -- */

/* matmul_gelu_forward and gelu_matmul_backward are, on every backend, the two
 * operations they fuse: bit for bit here, with dpre written over act as the model
 * does (the parameter gradients must read act before it is overwritten). */
static void run_matmul_gelu(int with_bias) { check_matmul_gelu(be, with_bias, frand); }

static void t_matmul_gelu(void) { run_matmul_gelu(1); }
static void t_matmul_gelu_nobias(void) { run_matmul_gelu(0); }

/* --------------------------------------------------- residual, accumulate -- */

static void t_residual(void)
{
    size_t n = 100003; /* large enough for the threaded path, odd for the tails */
    zt_cpu_set_threads(2);
    float *a = frand(n, 1), *b = frand(n, 1), *out = frand(n, 1), *R = frand(n, 1);
    be->residual_forward(out, a, b, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= out[i] == a[i] + b[i];
    CU_ASSERT(ok);
    /* backward of out = a + b is dout flowing into both: accumulate() adds it */
    float *da = fcopy(a, n);
    be->accumulate(da, R, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= da[i] == a[i] + R[i];
    CU_ASSERT(ok);
    be->scale(da, 0.5f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= da[i] == (a[i] + R[i]) * 0.5f;
    CU_ASSERT(ok);
    zt_cpu_set_threads(1);
    be->free(a), be->free(b), be->free(out), be->free(R), be->free(da);
}

/* ----------------------------------------------------------- crossentropy -- */

typedef struct { int N, V; const int32_t *tg; double *x, *loss; double dscale; } ce_ctx;

static double ce_loss(void *v)
{
    ce_ctx *c = v;
    double L = 0;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->V;
        c->loss[n] = 0;
        if (c->tg[n] < 0) continue;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < c->V; i++) mx = fmax(mx, x[i]);
        for (int i = 0; i < c->V; i++) s += exp(x[i] - mx);
        c->loss[n] = log(s) + mx - x[c->tg[n]];
        L += c->loss[n];
    }
    return L * c->dscale;
}

static void t_crossentropy(void)
{
    int N = 4, V = 11;
    int32_t tg[] = {3, -1, 10, 0}; /* row 1 is ignored */
    size_t nl = (size_t)N * V;
    float *lg = frand(nl, 4), *loss = frand(N, 1);
    ce_ctx c = {N, V, tg, f2d(lg, nl), malloc(N * 8), 0.25};
    double *g = fd_grad(ce_loss, &c, c.x, nl);
    ce_loss(&c);
    float *lg2 = fcopy(lg, nl);
    be->crossentropy_fused(lg, loss, tg, N, V, 0.25f);
    CU_ASSERT(vec_err(loss, c.loss, N, 1e-6) < 1e-5);
    CU_ASSERT(loss[1] == 0.0f);
    CU_ASSERT(vec_err(lg, g, nl, 1e-6) < TOL);
    int zero = 1;
    for (int i = 0; i < V; i++) zero &= lg[V + i] == 0.0f;
    CU_ASSERT(zero);
    /* dscale == 0: losses only */
    float *loss2 = frand(N, 1);
    be->crossentropy_fused(lg2, loss2, tg, N, V, 0.0f);
    CU_ASSERT(vec_err(loss2, c.loss, N, 1e-6) < 1e-5);
    free(g), free(c.x), free(c.loss);
    be->free(lg), be->free(lg2), be->free(loss), be->free(loss2);
}

/* GPT-2's vocabulary width, logits spread over +-30: exercises the vector exp
 * over its whole useful range (and underflow to 0) against double exp. */
static void t_crossentropy_wide(void)
{
    int N = 3, V = 50257;
    int32_t tg[] = {17, 50256, 20000};
    size_t nl = (size_t)N * V;
    float *lg = frand(nl, 30), *loss = be->alloc(N * 4);
    lg[20000 + 2 * (size_t)V] = 40.0f; /* one dominant logit: loss ~ 0 */
    ce_ctx c = {N, V, tg, f2d(lg, nl), malloc(N * 8), 1.0};
    ce_loss(&c);
    zt_cpu_set_threads(2);
    be->crossentropy_fused(lg, loss, tg, N, V, 1.0f);
    zt_cpu_set_threads(1);
    for (int n = 0; n < N; n++) {
        CU_ASSERT(fabs(loss[n] - c.loss[n]) < 1e-5 * fmax(1, c.loss[n]));
    }
    /* dlogits = softmax - onehot, compared elementwise in double */
    double maxerr = 0, rowsum = 0;
    for (int n = 0; n < N; n++) {
        const double *x = c.x + (size_t)n * V;
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, x[i]);
        for (int i = 0; i < V; i++) s += exp(x[i] - mx);
        for (int i = 0; i < V; i++) {
            double p = exp(x[i] - mx) / s - (i == tg[n]);
            double e = fabs(lg[(size_t)n * V + i] - p) / fmax(fabs(p), 1e-30);
            if (fabs(p) > 1e-30 && e > maxerr) maxerr = e;
            rowsum += lg[(size_t)n * V + i];
        }
    }
    CU_ASSERT(maxerr < 1e-5);
    CU_ASSERT(fabs(rowsum) < 1e-5); /* each row of dlogits sums to 0 */
    free(c.x), free(c.loss);
    be->free(lg), be->free(loss);
}

/* ------------------------------------------------------------------ adamw -- */

static void t_adamw(void)
{
    size_t n = 1001;
    float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = frand(n, 1), *m = be->alloc(n * 4), *v = be->alloc(n * 4), *g = be->alloc(n * 4);
    double *pr = f2d(p, n), *mr = calloc(n, 8), *vr = calloc(n, 8);
    float gs[] = {1.0f, 0.5f, 2.0f, 0.25f, 1.0f};
    for (long step = 1; step <= 5; step++) {
        for (size_t i = 0; i < n; i++) g[i] = (float)(urand() * (i % 7 == 0 ? 1e-3 : 1.0));
        be->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, gs[step - 1], step);
        /* the header's formula, in double */
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs[step - 1];
            mr[i] = b1 * mr[i] + (1 - (double)b1) * gi;
            vr[i] = b2 * vr[i] + (1 - (double)b2) * gi * gi;
            pr[i] -= lr * ((mr[i] / bc1) / (sqrt(vr[i] / bc2) + eps) + wd * pr[i]);
        }
    }
    /* the update itself is ~lr per step; its error must be a small part of it */
    double maxerr = 0;
    for (size_t i = 0; i < n; i++) maxerr = fmax(maxerr, fabs(p[i] - pr[i]));
    CU_ASSERT(maxerr < 1e-6);
    CU_ASSERT(vec_err(m, mr, n, 1e-8) < 1e-5);
    CU_ASSERT(vec_err(v, vr, n, 1e-12) < 1e-5);

    /* step 1 by hand, one element: m = 0.1 g, v = 0.05 g^2, mhat/sqrt(vhat) = sign(g) */
    float p1 = 1.0f, g1 = 2.0f, m1 = 0, v1 = 0;
    be->adamw(&p1, &g1, &m1, &v1, 1, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 1);
    CU_ASSERT(fabs(m1 - 0.1f) < 1e-7);
    CU_ASSERT(fabs(v1 - 0.05f) < 1e-7);
    CU_ASSERT(fabs(p1 - (1.0 - 0.01 * (1.0 + 0.1))) < 1e-6);

    /* a small beta1 and a later step, no weight decay, one element with g = 0 */
    float p2[3] = {0.5f, -0.5f, 2.0f}, g2[3] = {1.0f, -2.0f, 0.0f}, m2[3] = {0.2f, 0.4f, -1.0f};
    float v2[3] = {0.01f, 0.02f, 0.5f};
    be->adamw(p2, g2, m2, v2, 3, 0.1f, 0.4f, 0.9f, 1e-8f, 0.0f, 1.0f, 3);
    for (int i = 0; i < 3; i++) {
        double gi = (double)g2[i] * 1.0;
        double mm[3] = {0.2, 0.4, -1.0}, vv[3] = {0.01f, 0.02f, 0.5f}, pp[3] = {0.5, -0.5, 2.0};
        double mi = 0.4 * mm[i] + 0.6 * gi, vi = 0.9 * vv[i] + 0.1 * gi * gi;
        double pi = pp[i] - 0.1 * (mi / (1 - pow(0.4, 3))) / (sqrt(vi / (1 - pow(0.9, 3))) + 1e-8);
        CU_ASSERT(fabs(m2[i] - mi) < 1e-6 && fabs(v2[i] - vi) < 1e-6 && fabs(p2[i] - pi) < 1e-5);
    }
    be->free(p), be->free(m), be->free(v), be->free(g);
    free(pr), free(mr), free(vr);
}

/* Three steps against numbers PyTorch 1.13 produced (torch.optim.AdamW, lr 1e-3,
 * betas (0.9, 0.95), eps 1e-8, weight_decay 0.1; printed with float.hex()).
 * Not bitwise: the hyperparameters reach us as floats, Python's are doubles. */
static void t_adamw_torch(void)
{
    float p[6] = {1.0f, -0.5f, 0.25f, 3.0f, -2.0f, 0.0078125f}, m[6] = {0}, v[6] = {0};
    const float g[3][6] = {{0.5f, -1.0f, 2.0f, 0.001f, -0.25f, 4.0f},
                           {0.25f, 0.5f, -3.0f, 0.002f, 0.5f, -4.0f},
                           {-1.0f, 0.125f, 1.0f, -0.001f, 0.75f, 2.0f}};
    const double tp[6] = {0x1.fef532p-1, -0x1.fe688ap-2, 0x1.fe54ecp-3,
                          0x1.7f949ap+1, -0x1.ffdafcp+0, 0x1.b6393cp-8};
    const double tm[6] = {-0x1.2f1aap-5, -0x1.81062p-6, -0x1.0624fp-7,
                          0x1.51a438p-13, 0x1.989376p-4, 0x1.4fdf3ap-3};
    const double tv[6] = {0x1.072b02p-4, 0x1.d9580ep-5, 0x1.50e56p-1,
                          0x1.322692p-22, 0x1.5ec8b4p-5, 0x1.ae978cp+0};
    for (int s = 0; s < 3; s++) be->adamw(p, g[s], m, v, 6, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, s + 1);
    /* m and v sum terms of both signs, so their error is judged against the
     * gradient scale (1 ulp of max|g| and max|g|^2), not their own size */
    for (int i = 0; i < 6; i++) {
        double gmax = 0;
        for (int s = 0; s < 3; s++) gmax = fmax(gmax, fabs(g[s][i]));
        CU_ASSERT(fabs(p[i] - tp[i]) <= 2 * 0x1p-23 * fabs(tp[i]));
        CU_ASSERT(fabs(m[i] - tm[i]) <= 0x1p-23 * gmax);
        CU_ASSERT(fabs(v[i] - tv[i]) <= 0x1p-23 * gmax * gmax);
    }
}

/* ------------------------------------------------------------------- bf16 -- */

static float bits2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void t_bf16(void)
{
    struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 exact */
        {0x3f808000u, 0x3f80}, /* tie, even below: stays */
        {0x3f818000u, 0x3f82}, /* tie, odd below: rounds up to even */
        {0x3f808001u, 0x3f81}, /* just above a tie */
        {0x3f807fffu, 0x3f80}, /* just below a tie */
        {0xbf818000u, 0xbf82}, /* negative tie */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to +Inf */
        {0x7f800000u, 0x7f80}, /* +Inf */
        {0xff800000u, 0xff80}, /* -Inf */
        {0x80000000u, 0x8000}, /* -0 */
        {0x00000001u, 0x0000}, /* smallest denormal rounds to 0 */
    };
    size_t nc = sizeof cases / sizeof *cases;
    float in[16];
    uint16_t out[16];
    for (size_t i = 0; i < nc; i++) in[i] = bits2f(cases[i].in);
    be->to_bf16(out, in, nc);
    for (size_t i = 0; i < nc; i++) {
        if (out[i] != cases[i].out)
            printf("\n  bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].in, out[i], cases[i].out);
        CU_ASSERT(out[i] == cases[i].out);
    }
    /* NaNs stay NaN, with their sign, including payloads only in the low bits */
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < 4; i++) in[i] = bits2f(nans[i]);
    be->to_bf16(out, in, 4);
    for (size_t i = 0; i < 4; i++) {
        CU_ASSERT((out[i] & 0x7f80) == 0x7f80 && (out[i] & 0x7f) != 0);
        CU_ASSERT((out[i] >> 15) == (nans[i] >> 31));
    }
    /* from_bf16 is exact, and round-trips representable values */
    uint16_t h[] = {0x3f80, 0xc049, 0x7f80, 0x0001};
    float f[4];
    be->from_bf16(f, h, 4);
    CU_ASSERT(f[0] == 1.0f && f[1] == -3.140625f && isinf(f[2]) && f[3] == bits2f(0x00010000u));
    uint16_t back[4];
    be->to_bf16(back, f, 4);
    CU_ASSERT(memcmp(back, h, sizeof h) == 0);
}

/* ------------------------------------------------------------------- fp16 -- */

static uint32_t f2bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Known roundings of IEEE binary16 (11 significant bits, max 65504, min normal
 * 2^-14, min subnormal 2^-24). */
static void t_fp16_cases(void)
{
    struct { float in; uint16_t out; } cases[] = {
        {1.0f, 0x3c00},
        {1.0f + 0x1p-11f, 0x3c00},          /* tie, even below: stays */
        {1.0f + 3 * 0x1p-11f, 0x3c02},      /* tie, odd below: up to even */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01}, /* just above a tie */
        {-2.5f, 0xc100},
        {65504.0f, 0x7bff},                 /* largest half */
        {65519.99f, 0x7bff},                /* below the overflow threshold */
        {65520.0f, 0x7c00},                 /* the tie above 65504 rounds to Inf */
        {-1e6f, 0xfc00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {-0.0f, 0x8000},
        {0x1p-14f, 0x0400},                 /* min normal */
        {0x1p-14f - 0x1p-25f, 0x0400},      /* rounds up into the normals */
        {0x1p-24f, 0x0001},                 /* min subnormal */
        {0x1p-25f, 0x0000},                 /* tie with 0: even is 0 */
        {0x1.8p-25f, 0x0001},               /* above the tie */
        {3 * 0x1p-25f, 0x0002},             /* 1.5 units: tie, up to even 2 */
        {-5 * 0x1p-25f, 0x8002},            /* 2.5 units: tie, down to even 2 */
        {1e-10f, 0x0000},
        {0x1p-149f, 0x0000},                /* fp32 denormal */
    };
    const size_t nc = sizeof cases / sizeof *cases;
    float in[32], back[32];
    uint16_t out[32];
    for (size_t i = 0; i < nc; i++) in[i] = cases[i].in;
    for (int hw = 0; hw <= 1; hw++) {
        zt_cpu_use_f16c(hw);
        be->to_fp16(out, in, nc);
        for (size_t i = 0; i < nc; i++) {
            if (out[i] != cases[i].out)
                printf("\n  fp16(%a) = 0x%04x, want 0x%04x (f16c %d)", (double)in[i], out[i], cases[i].out, hw);
            CU_ASSERT(out[i] == cases[i].out);
            CU_ASSERT(zt_fp16_from_f32(in[i]) == cases[i].out);
        }
        /* from_fp16 is exact: finite results convert back to the same half */
        be->from_fp16(back, out, nc);
        CU_ASSERT(back[0] == 1.0f && back[4] == -2.5f && back[5] == 65504.0f && isinf(back[7]));
        CU_ASSERT(back[14] == 0x1p-24f && f2bits(back[11]) == 0x80000000u);
    }
    /* NaNs stay NaN with their sign, including payloads only in the low bits */
    uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < 4; i++) in[i] = bits2f(nans[i]);
    be->to_fp16(out, in, 4);
    for (size_t i = 0; i < 4; i++) {
        CU_ASSERT((out[i] & 0x7c00) == 0x7c00 && (out[i] & 0x3ff) != 0);
        CU_ASSERT((out[i] >> 15) == (nans[i] >> 31));
    }
    zt_cpu_use_f16c(1);
}

/* The F16C path, the portable path of the backend (threaded loops) and the
 * header's scalar functions give identical bits: all 65536 halfs one way, random
 * bit patterns and values around every rounding boundary the other way. */
static void t_fp16_paths(void)
{
    const int hw = zt_cpu_use_f16c(1);
    printf(" [F16C %s]", hw ? "in use: compared with the portable code" : "not available: portable code only");
    zt_cpu_set_threads(2);
    const size_t nh = 65536;
    uint16_t *h = be->alloc(nh * 2), *h2 = be->alloc(nh * 2);
    float *f[2] = {be->alloc(nh * 4), be->alloc(nh * 4)};
    for (size_t i = 0; i < nh; i++) h[i] = (uint16_t)i;
    for (int k = 0; k < 2; k++) {
        zt_cpu_use_f16c(k);
        be->from_fp16(f[k], h, nh);
    }
    size_t bad = 0, rt = 0;
    for (size_t i = 0; i < nh; i++) bad += f2bits(f[0][i]) != f2bits(f[1][i]) || f2bits(f[0][i]) != zt_fp16_to_bits(h[i]);
    CU_ASSERT(bad == 0);
    /* every half round-trips (NaNs come back quiet: their quiet bit was already set or is set now) */
    for (int k = 0; k < 2; k++) {
        zt_cpu_use_f16c(k);
        be->to_fp16(h2, f[0], nh);
        for (size_t i = 0; i < nh; i++) rt += h2[i] != ((h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x3ff) ? h[i] | 0x200 : h[i]);
    }
    CU_ASSERT(rt == 0);
    /* floats: random bit patterns (every exponent, NaNs included) and, for every
     * half, the float exactly halfway to the next one and its two neighbours */
    const size_t nr = 1 << 20, nb = 3 * 65536, n = nr + nb;
    float *x = be->alloc(n * 4);
    uint32_t *xu = (uint32_t *)x, s = 12345;
    for (size_t i = 0; i < nr; i++) s = s * 1664525u + 1013904223u, xu[i] = s ^ (s >> 16) * 0x9e3779b9u;
    for (size_t i = 0; i < 65536; i++) {
        uint32_t mid = (f2bits(zt_fp16_to_f32((uint16_t)i)) + f2bits(zt_fp16_to_f32((uint16_t)(i + 1)))) / 2;
        xu[nr + 3 * i] = mid - 1, xu[nr + 3 * i + 1] = mid, xu[nr + 3 * i + 2] = mid + 1;
    }
    uint16_t *o[2] = {be->alloc(n * 2), be->alloc(n * 2)};
    for (int k = 0; k < 2; k++) {
        zt_cpu_use_f16c(k);
        be->to_fp16(o[k], x, n);
    }
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += o[0][i] != o[1][i] || o[0][i] != zt_fp16_from_bits(xu[i]);
    if (bad) printf("\n  %zu of %zu floats convert differently", bad, n);
    CU_ASSERT(bad == 0);
    zt_cpu_use_f16c(1);
    zt_cpu_set_threads(1);
    be->free(h), be->free(h2), be->free(f[0]), be->free(f[1]), be->free(x), be->free(o[0]), be->free(o[1]);
}

/* ------------------------------------------------------ reductions, memory -- */

static void t_reductions(void)
{
    size_t n = 200001;
    zt_cpu_set_threads(2);
    float *x = frand(n, 1);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    CU_ASSERT(fabs(be->sumsq(x, n) - ref) < 1e-9 * ref);
    /* double accumulation: 2^24 + many ones is still exact, unlike float */
    float big[3] = {4096.0f, 1.0f, 1.0f};
    CU_ASSERT(be->sumsq(big, 3) == 16777218.0);
    CU_ASSERT(be->all_finite(x, n) == 1);
    x[n - 1] = INFINITY;
    CU_ASSERT(be->all_finite(x, n) == 0);
    x[n - 1] = 0.0f, x[12345] = NAN;
    CU_ASSERT(be->all_finite(x, n) == 0);
    x[12345] = -3.0e38f; /* large but finite */
    CU_ASSERT(be->all_finite(x, n) == 1);
    zt_cpu_set_threads(1);
    be->free(x);
}

static void t_memory(void)
{
    size_t n = 1000;
    unsigned char *a = be->alloc(n), *b = be->alloc(n);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= a[i] == 0;
    CU_ASSERT(zero);
    CU_ASSERT(((uintptr_t)a & 63) == 0);
    memset(a, 7, n);
    be->copy(b, a, n);
    CU_ASSERT(memcmp(a, b, n) == 0);
    unsigned char host[1000];
    be->to_host(host, a, n);
    CU_ASSERT(memcmp(host, a, n) == 0);
    be->memzero(a, n);
    be->from_host(b, a, n);
    be->sync();
    CU_ASSERT(b[0] == 0 && b[n - 1] == 0);
    be->free(a), be->free(b);
}

static void t_registry(void)
{
    CU_ASSERT(zt_backends[0] == &zt_backend_cpu);
    CU_ASSERT(zt_backend_get("cpu") == &zt_backend_cpu);
    CU_ASSERT(zt_backend_get("no-such-backend") == NULL);
    CU_ASSERT(zt_backend_get(NULL) == NULL);
    size_t k = 0;
    while (zt_backends[k]) k++;
    CU_ASSERT(k >= 1 && k <= 2);
}

static const zt_test_t tests[] = {
    {"embedding forward/backward vs double + FD", t_embedding},
    {"positional forward (+=)/backward vs double + FD", t_positional},
    {"embedding + positional = GPT-2's fused encoder, bitwise", t_embedding_gpt2_bits},
    {"ring attention blocks + merge = causal attention, forward and backward", t_attention_ring_blocks},
    {"ring attention blocks with a sliding window (offset blocks, empty rows) = windowed attention", t_ring_blocks_window},
    {"LoRA dropout mask: rate, scale, determinism, a column slice", t_dropout_mask},
    {"positional with positions (packed) + FD; 0..T-1 = NULL bitwise", t_positional_positions},
    {"layernorm forward/backward vs double + FD", t_layernorm},
    {"layernorm threaded backward", t_layernorm_threads},
    {"layernorm eps with tiny variance", t_layernorm_eps},
    {"layernorm without bias, eps 0.05, vs double + FD", t_layernorm_nobias_eps},
    {"layernorm without bias, threaded backward", t_layernorm_nobias_threads},
    {"rmsnorm H=1 forward/backward vs double + FD", t_rmsnorm},
    {"rmsnorm 3 heads inside wider rows + FD", t_rmsnorm_heads},
    {"rmsnorm threaded backward", t_rmsnorm_threads},
    {"rope positions = t, strided heads, + FD", t_rope},
    {"rope positions array, inv_freq, + FD", t_rope_positions},
    {"swiglu forward/backward + FD, in place", t_swiglu},
    {"swiglu threaded", t_swiglu_threads},
    {"matmul W (C,OC) + bias", t_matmul},
    {"matmul W (C,OC) no bias", t_matmul_nobias},
    {"matmul W^T (tied lm_head)", t_matmul_transw},
    {"matmul W^T + bias", t_matmul_transw_bias},
    {"matmul forward one row (gemv), backward", t_matmul_one_row},
    {"lowrank backward (LoRA's B side) vs double: ragged rows, strides, other rank", t_lowrank},
    {"attention forward/backward vs double + FD", t_attention},
    {"attention threaded", t_attention_threads},
    {"attention T=131: ragged query blocks vs double", t_attention_ragged},
    {"attention T=600: 128-row blocks, ragged, vs double", t_attention_long},
    {"attention T=70 across a block boundary + FD", t_attention_blocks_fd},
    {"attention GQA NH4/NKV2 HD12, NKV1, odd HD + FD", t_attention_gqa},
    {"attention GQA threaded, across blocks", t_attention_gqa_threads},
    {"attention GQA heads stacked per group, ragged blocks, two stacks a group + FD", t_attention_gqa_stacked},
    {"attention HD=256 vs double", t_attention_hd256},
    {"attention segments vs masked double + FD, reused ids", t_attention_segments_fd},
    {"attention segments across query blocks, threaded", t_attention_segments_blocks},
    {"attention padding (negative segments) vs masked double + FD; samples plain causal bitwise", t_attention_padding},
    {"attention packed = each segment apart; one segment = NULL bitwise", t_attention_segments_apart},
    {"attention sliding window vs masked double + FD; window T = none bitwise", t_attention_window},
    {"gelu forward/backward", t_gelu},
    {"matmul + gelu fused = composed", t_matmul_gelu},
    {"matmul + gelu fused = composed, no bias", t_matmul_gelu_nobias},
    {"residual, accumulate, scale", t_residual},
    {"crossentropy fused, ignored target, dscale 0", t_crossentropy},
    {"crossentropy V=50257 wide logits", t_crossentropy_wide},
    {"adamw vs the header formula in double", t_adamw},
    {"adamw vs PyTorch 1.13 numbers", t_adamw_torch},
    {"bf16 rounding, ties, NaN, Inf", t_bf16},
    {"fp16 rounding, ties, subnormals, overflow", t_fp16_cases},
    {"fp16 F16C vs portable: all halfs, random floats", t_fp16_paths},
    {"sumsq, all_finite", t_reductions},
    {"memory ops", t_memory},
    {"registry", t_registry},
    {NULL, NULL},
};

ZT_TEST_MAIN("test_kernels", tests)
