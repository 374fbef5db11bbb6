/* model_rig.h — a model with its unit buffers, run as the train loop runs it, and the
 * HDF5 fixture readers: shared by the suites that compare a family with PyTorch
 * (test_model.c: GPT-2, test_families.c: llama, qwen2, qwen3). Static functions, one
 * copy per test program. */
#ifndef ZT_MODEL_RIG_H
#define ZT_MODEL_RIG_H

#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_backend.h"
#include "zt_common.h"
#include "zt_model.h"
#include "zt_optim.h"
#include "zt_test.h"

/* Reads dataset `path` (any shape with n elements) as `type` into out; -1 on mismatch. */
static int read_ds(hid_t file, const char *path, hid_t type, void *out, size_t n)
{
    hid_t d = H5Dopen2(file, path, H5P_DEFAULT);
    if (d < 0) {
        fprintf(stderr, "fixture: no dataset %s\n", path);
        return -1;
    }
    hid_t s = H5Dget_space(d);
    hssize_t np = H5Sget_simple_extent_npoints(s);
    int rc = -1;
    if (np != (hssize_t)n)
        fprintf(stderr, "fixture: %s has %lld elements, expected %zu\n", path, (long long)np, n);
    else
        rc = H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0 ? -1 : 0;
    H5Sclose(s);
    H5Dclose(d);
    return rc;
}

static float *read_f32(hid_t file, const char *path, size_t n)
{
    float *x = zt_malloc(n * sizeof *x);
    CU_ASSERT_FATAL(read_ds(file, path, H5T_NATIVE_FLOAT, x, n) == 0);
    return x;
}

static int32_t *read_i32(hid_t file, const char *path, size_t n)
{
    int32_t *x = zt_malloc(n * sizeof *x);
    CU_ASSERT_FATAL(read_ds(file, path, H5T_NATIVE_INT32, x, n) == 0);
    return x;
}

/* ---- a model with its unit buffers ---------------------------------------- */

typedef struct {
    const zt_backend_t *be;
    zt_param_table_t *tab;
    zt_model_t *m;
    float **w, **g;         /* (nunits) unit parameter / gradient buffers in backend memory */
} rig_t;

/* A rig owning table tab (any family) on the CPU backend. */
static rig_t rig_create_table(zt_param_table_t *tab, int B, int T, int recompute)
{
    rig_t r = {.be = &zt_backend_cpu};
    r.tab = tab;
    CU_ASSERT_PTR_NOT_NULL_FATAL(r.tab);
    r.m = zt_model_create(r.tab, r.be, B, T, recompute);
    CU_ASSERT_PTR_NOT_NULL_FATAL(r.m);
    r.w = zt_calloc(r.tab->nunits, sizeof *r.w);
    r.g = zt_calloc(r.tab->nunits, sizeof *r.g);
    for (int u = 0; u < r.tab->nunits; u++) {
        r.w[u] = r.be->alloc(r.tab->unit_numel[u] * sizeof(float));
        r.g[u] = r.be->alloc(r.tab->unit_numel[u] * sizeof(float));
    }
    return r;
}

static void rig_free(rig_t *r)
{
    for (int u = 0; u < r->tab->nunits; u++) {
        r->be->free(r->w[u]);
        r->be->free(r->g[u]);
    }
    free(r->w);
    free(r->g);
    zt_model_free(r->m);
    zt_param_table_free(r->tab);
}

static float *pw(const rig_t *r, int i) { return r->w[r->tab->params[i].unit] + r->tab->params[i].offset; }
static float *pg(const rig_t *r, int i) { return r->g[r->tab->params[i].unit] + r->tab->params[i].offset; }

/* Copies parameter i's tensor (device) to a fresh host array. */
static float *to_host(const rig_t *r, const float *dev, int i)
{
    size_t n = r->tab->params[i].numel;
    float *h = zt_malloc(n * sizeof *h);
    r->be->to_host(h, dev, n * sizeof *h);
    return h;
}

/* Loads every parameter from group `grp` of the fixture (HF names and shapes). */
static __attribute__((unused)) void rig_load(rig_t *r, hid_t file, const char *grp)
{
    for (int i = 0; i < r->tab->nparams; i++) {
        char path[160];
        snprintf(path, sizeof path, "/%s/%s", grp, r->tab->params[i].name);
        float *h = read_f32(file, path, r->tab->params[i].numel);
        r->be->from_host(pw(r, i), h, r->tab->params[i].numel * sizeof *h);
        free(h);
    }
}

static __attribute__((unused)) void rig_init(rig_t *r, uint64_t seed)
{
    for (int i = 0; i < r->tab->nparams; i++) {
        size_t n = r->tab->params[i].numel;
        float *h = zt_malloc(n * sizeof *h);
        zt_param_init_range(&r->tab->params[i], seed, 0, n, h);
        r->be->from_host(pw(r, i), h, n * sizeof *h);
        free(h);
    }
}

static void rig_zero_grads(rig_t *r)
{
    for (int u = 0; u < r->tab->nunits; u++)
        r->be->memzero(r->g[u], r->tab->unit_numel[u] * sizeof(float));
}

/* seg, pos: a packed batch's segments and positions (zt_model_set_segments), or NULL */
static void rig_blocks_forward_packed(rig_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg,
                                      const int32_t *pos, int B, int T)
{
    zt_model_set_batch(r->m, inp, tgt, B, T);
    if (seg || pos) zt_model_set_segments(r->m, seg, pos);
    const int b0 = r->tab->first_block_unit;
    zt_model_forward_embed(r->m, r->w[r->tab->root_unit]);
    const int a0 = r->tab->first_adapter_unit;
    for (int l = 0; l < r->tab->dims.L; l++)
        zt_model_forward_block(r->m, l, r->w[b0 + l], a0 >= 0 ? r->w[a0 + l] : NULL);
}

static void rig_blocks_forward(rig_t *r, const int32_t *inp, const int32_t *tgt, int B, int T)
{
    rig_blocks_forward_packed(r, inp, tgt, NULL, NULL, B, T);
}

/* Forward through the blocks and the head (inference); returns the loss. */
static float rig_forward(rig_t *r, const int32_t *inp, const int32_t *tgt, int B, int T)
{
    rig_blocks_forward(r, inp, tgt, B, T);
    zt_model_forward_head(r->m, r->w[r->tab->root_unit]);
    return zt_model_loss(r->m);
}

/* The backward half of a micro-step after the blocks' forward: the head (dscale, or the
 * token scales set) and the blocks back; gradients ACCUMULATE into r->g; the loss. */
static float rig_backward(rig_t *r, float dscale)
{
    const int root = r->tab->root_unit, b0 = r->tab->first_block_unit, a0 = r->tab->first_adapter_unit;
    /* frozen units (LoRA's base) get no gradients, as the shard engine hands them */
#define RIG_G(u) (r->tab->unit_frozen && r->tab->unit_frozen[u] ? NULL : r->g[u])
    zt_model_train_head(r->m, r->w[root], RIG_G(root), dscale);
    float loss = zt_model_loss(r->m);
    for (int l = r->tab->dims.L - 1; l >= 0; l--)
        zt_model_backward_block(r->m, l, r->w[b0 + l], RIG_G(b0 + l), a0 >= 0 ? r->w[a0 + l] : NULL,
                                a0 >= 0 ? RIG_G(a0 + l) : NULL);
    zt_model_backward_embed(r->m, RIG_G(root));
#undef RIG_G
    r->be->sync();
    return loss;
}

/* One micro-step, the train loop's order; gradients ACCUMULATE into r->g. seg, pos as
 * rig_blocks_forward_packed. */
static float rig_micro_step_packed(rig_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg,
                                   const int32_t *pos, int B, int T, float dscale)
{
    rig_blocks_forward_packed(r, inp, tgt, seg, pos, B, T);
    return rig_backward(r, dscale);
}

static float rig_micro_step(rig_t *r, const int32_t *inp, const int32_t *tgt, int B, int T, float dscale)
{
    return rig_micro_step_packed(r, inp, tgt, NULL, NULL, B, T, dscale);
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1e-30);
}

static __attribute__((unused)) int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Worst relative L2 error of the rig's trainable parameters (frozen ones are skipped):
 * their gradients (grads = 1) or values (0) against the fixture's datasets `key` + name
 * ("/grads/", "/train/final/base_model.model." ...); fix, when given, may adjust a tensor
 * before its norm (fix(ctx, p, got, ref, n)). NaN counts as infinite; *name gets the
 * worst tensor's name. */
typedef void (*rig_fix_fn)(void *ctx, const zt_param_t *p, float *got, const float *ref, size_t n);
static __attribute__((unused)) double rig_worst(const rig_t *r, hid_t file, const char *key, int grads, rig_fix_fn fix,
                                                void *ctx, const char **name)
{
    double worst = 0;
    *name = "?";
    for (int i = 0; i < r->tab->nparams; i++) {
        const zt_param_t *p = &r->tab->params[i];
        if (p->frozen) continue;
        char path[256];
        snprintf(path, sizeof path, "%s%s", key, p->name);
        float *ref = read_f32(file, path, p->numel);
        float *got = to_host(r, grads ? pg(r, i) : pw(r, i), i);
        if (fix) fix(ctx, p, got, ref, p->numel);
        const double e = rel_l2(got, ref, p->numel);
        if (!(e <= worst)) {
            worst = isnan(e) ? INFINITY : e;
            *name = p->name;
        }
        free(ref);
        free(got);
    }
    return worst;
}

/* The fixtures' ten AdamW steps (tests/reference/README.md): the learning rates of
 * /train/lrs, clipping at norm 1, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
 * matrices, one batch of /train/inputs per step; asserts each step's loss and pre-clip
 * norm (1e-5 relative) against /train. Returns the number of
 * clipped steps; *worst_loss is the worst loss error. */
static __attribute__((unused)) int rig_train_fixture(rig_t *r, hid_t file, int B, int T, int verbose,
                                                     double *worst_loss)
{
    const int S = 10;
    const double max_norm = 1.0;
    const zt_backend_t *be = r->be;
    float **m = zt_calloc(r->tab->nunits, sizeof *m), **v = zt_calloc(r->tab->nunits, sizeof *v);
    for (int u = 0; u < r->tab->nunits; u++) {
        m[u] = be->alloc(r->tab->unit_numel[u] * sizeof(float));
        v[u] = be->alloc(r->tab->unit_numel[u] * sizeof(float));
    }
    int32_t *inp = read_i32(file, "/train/inputs", (size_t)S * B * T);
    int32_t *tgt = read_i32(file, "/train/targets", (size_t)S * B * T);
    float *ref_loss = read_f32(file, "/train/losses", S);
    float *ref_norm = read_f32(file, "/train/grad_norms", S);
    float *ref_lr = read_f32(file, "/train/lrs", S);
    int clipped = 0;
    *worst_loss = 0;
    for (int s = 0; s < S; s++) {
        rig_zero_grads(r);
        float loss = rig_micro_step(r, inp + (size_t)s * B * T, tgt + (size_t)s * B * T, B, T, 1.0f / (B * T));
        double ss = 0;
        for (int i = 0; i < r->tab->nparams; i++)
            if (!r->tab->params[i].frozen) ss += be->sumsq(pg(r, i), r->tab->params[i].numel);
        const double norm = sqrt(ss), scale = zt_clip_scale(norm, max_norm);
        /* the fixture's own learning rates (a warm-up cosine of its script's): what is checked
         * here is the model and AdamW; the schedules are checked against transformers'
         * get_scheduler in test_optim */
        const double lr_s = ref_lr[s];
        clipped += scale < 1.0;
        for (int i = 0; i < r->tab->nparams; i++) {
            const zt_param_t *p = &r->tab->params[i];
            if (p->frozen) continue; /* LoRA's base: no optimizer state */
            be->adamw(pw(r, i), pg(r, i), m[p->unit] + p->offset, v[p->unit] + p->offset, p->numel, (float)lr_s,
                      0.9f, 0.95f, 1e-8f, p->decay ? 0.1f : 0.0f, (float)scale, s + 1);
        }
        be->sync();
        const double el = zt_relerr(loss, ref_loss[s], 1e-30), en = zt_relerr(norm, ref_norm[s], 1e-30);
        if (verbose)
            printf("%s    step %d loss %.6f (rel %.1e) norm %.5f (rel %.1e) lr %.3e\n", s ? "" : "\n", s, loss, el,
                   norm, en, lr_s);
        *worst_loss = fmax(*worst_loss, el);
        CU_ASSERT(el < 1e-5);
        CU_ASSERT(en < 1e-5);
    }
    for (int u = 0; u < r->tab->nunits; u++) {
        be->free(m[u]);
        be->free(v[u]);
    }
    free(m);
    free(v);
    free(inp);
    free(tgt);
    free(ref_loss);
    free(ref_norm);
    free(ref_lr);
    return clipped;
}

static __attribute__((unused)) uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Analytic gradient against central differences for sampled elements: for each
 * tensor its largest-gradient element (where a wrong term shows most) and one
 * random element. The loss is the double mean of the fp32 per-token losses: the fp32
 * mean (ulp 4.8e-7 at a loss of 4) over 2*eps = 2e-3 gave FD noise of up to 2.4e-4,
 * above the absolute floor (GPT-2's LoRA met it once); the fp32 forward itself (its GEMMs'
 * rounding, which differs between AVX2 and AVX-512 kernels) leaves noise of the same size
 * (gemma3's LoRA: 2.15e-4 at a gradient of 5.7e-3 on an AVX-512 CPU), hence the floor of
 * 3e-4. init_std 0.3 keeps most gradients well above it so the 2e-2 relative bound carries
 * the test. A negative control checks that a 10% error at the largest elements (above 1e-2,
 * where 10% exceeds 2% plus the floor) would be rejected. */
static int fd_ok(double a, double n) { return fabs(a - n) <= 2e-2 * fmax(fabs(a), fabs(n)) + 3e-4; }

/* The loss the analytic gradients are of, from a forward of the current weights */
typedef double (*rig_loss_fn)(rig_t *r, const int32_t *inp, const int32_t *tgt, int B, int T, void *ctx);

/* the train loop's SFT loss of a micro-batch whose dscale was 1/(B T) */
static double rig_mean_loss(rig_t *r, const int32_t *inp, const int32_t *tgt, int B, int T, void *ctx)
{
    (void)ctx;
    rig_forward(r, inp, tgt, B, T);
    return zt_model_loss_sum(r->m) / (B * T);
}

/* Checks the tensors `want` accepts (NULL: all) against loss(ctx); counts into the four
 * totals (see above: elements, mismatches, large gradients, large ones a 10% error would
 * break). */
static __attribute__((unused)) void rig_fd_check_loss(rig_t *r, const int32_t *inp, const int32_t *tgt, int B,
                                                      int T, int (*want)(const zt_param_t *), rig_loss_fn loss,
                                                      void *ctx, uint64_t *rs, int *checked, int *bad, int *big,
                                                      int *caught)
{
    const double eps = 1e-3;
    for (int i = 0; i < r->tab->nparams; i++) {
        const zt_param_t *p = &r->tab->params[i];
        if (want && !want(p)) continue;
        float *g = to_host(r, pg(r, i), i);
        size_t imax = 0;
        for (size_t k = 1; k < p->numel; k++)
            if (fabsf(g[k]) > fabsf(g[imax])) imax = k;
        size_t pick[2] = {imax, (size_t)(lcg(rs) % p->numel)};
        for (int j = 0; j < 2; j++) {
            size_t k = pick[j];
            float *e = pw(r, i) + k, orig, val;
            r->be->to_host(&orig, e, sizeof orig);
            val = (float)(orig + eps);
            r->be->from_host(e, &val, sizeof val);
            const double lp = loss(r, inp, tgt, B, T, ctx);
            val = (float)(orig - eps);
            r->be->from_host(e, &val, sizeof val);
            const double lm = loss(r, inp, tgt, B, T, ctx);
            r->be->from_host(e, &orig, sizeof orig);
            /* Divide by the step actually taken after fp32 rounding of orig +- eps. */
            double num = (lp - lm) / ((double)(float)(orig + eps) - (double)(float)(orig - eps));
            double a = g[k];
            (*checked)++;
            if (!fd_ok(a, num)) {
                (*bad)++;
                fprintf(stderr, "FD mismatch %s[%zu]: analytic %.6e numeric %.6e\n", p->name, k, a, num);
            }
            if (j == 0 && fabs(num) > 1e-2) {
                (*big)++;
                *caught += !fd_ok(1.1 * a, num);
            }
        }
        free(g);
    }
}

/* rig_fd_check_loss of the SFT mean loss */
static __attribute__((unused)) void rig_fd_check(rig_t *r, const int32_t *inp, const int32_t *tgt, int B, int T,
                                                 int (*want)(const zt_param_t *), uint64_t *rs, int *checked,
                                                 int *bad, int *big, int *caught)
{
    rig_fd_check_loss(r, inp, tgt, B, T, want, rig_mean_loss, NULL, rs, checked, bad, big, caught);
}

#endif
