/* stage_test.c — the paths device backends take, on the CPU.
 * A copy of the CPU backend that declares its memory not host-readable forces the
 * shard engine to stage every segment through host buffers. Checks, at any world
 * size: a staged zero3 engine saves what a direct ddp engine loads; a staged engine
 * restores values and Adam moments (one more identical step gives bit-identical
 * parameters); a weights-only load leaves the moments alone.
 * Offload: a second copy ("late") delays every asynchronous transfer until its
 * wait, as a busy copy engine may. An engine that read a download before waiting
 * for it, or changed an upload's source before it completed, would step with stale
 * numbers; so offloaded engines on "late" must end bit-identical (weights, moments,
 * working copies) to plain engines, and leave no transfer un-waited. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_arch.h"
#include "zt_shard.h"

static int failures;
#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            failures++;                                                           \
            fprintf(stderr, "stage_test: rank %d: ", zt_world_rank());            \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

/* Transfers the "late" backend has accepted but not done yet, per direction
 * (0 downloads, 1 uploads). */
enum { MAXPEND = 1024 };
typedef struct { void *dst; const void *src; size_t n; } xfer_t;
static xfer_t pend[2][MAXPEND];
static int npend[2];

static void defer(int dir, void *dst, const void *src, size_t n)
{
    if (npend[dir] == MAXPEND) zt_fatal("stage_test: more than %d transfers in flight", MAXPEND);
    pend[dir][npend[dir]++] = (xfer_t){dst, src, n};
}
static void late_to_host(void *host, const void *src, size_t n) { defer(0, host, src, n); }
static void late_from_host(void *dst, const void *host, size_t n) { defer(1, dst, host, n); }
static void flush(int dir)
{
    for (int i = 0; i < npend[dir]; i++) memcpy(pend[dir][i].dst, pend[dir][i].src, pend[dir][i].n);
    npend[dir] = 0;
}
static void late_wait_downloads(void) { flush(0); }
static void late_wait_uploads(void) { flush(1); }

/* one optimizer step with deterministic fake gradients */
static void step(zt_shard_t *s, const zt_param_table_t *t, long adam_t)
{
    zt_shard_begin_step(s);
    zt_shard_begin_micro(s, 0, 1);
    /* two micro-steps: offloaded gradients overwrite the host accumulator in the
     * first and are added to it in the second */
    for (int mi = 0; mi < 2; mi++) {
        zt_shard_begin_micro(s, mi, 2);
        for (int u = t->nunits - 1; u >= 0; u--) {
            float *g = zt_shard_grads(s, u);
            for (size_t i = 0; i < t->unit_numel[u]; i++)
                g[i] = 1e-3f * (float)((i * 7 + (size_t)u + 5 * (size_t)mi) % 13) - 6e-3f;
            zt_shard_grads_ready(s, u);
        }
    }
    zt_shard_finish_grads(s);
    zt_adamw_hp_t hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .grad_scale = 1.0f, .step = adam_t};
    zt_shard_optimizer_step(s, &hp);
}

/* An offloaded engine on "late" against a plain one on the CPU: 3 steps, then
 * equal masters, moments and gathered working copies, bit for bit. */
static void check_offload(zt_comm_t *c, const zt_backend_t *late, const zt_param_table_t *t,
                          zt_shard_opts_t o, int offload_param, const char *what)
{
    zt_shard_t *ref = zt_shard_create(t, c, &zt_backend_cpu, &o);
    o.offload_optim = 1;
    o.offload_param = offload_param;
    zt_shard_t *off = zt_shard_create(t, c, late, &o);
    for (long k = 1; k <= 3; k++) {
        step(ref, t, k);
        step(off, t, k);
        CHECK(npend[0] == 0 && npend[1] == 0, "%s: step %ld left %d downloads and %d uploads un-waited", what, k,
              npend[0], npend[1]);
    }
    zt_io_seg_t *sa, *sb;
    int na = zt_shard_io_segments(ref, 0, &sa), nb = zt_shard_io_segments(off, 0, &sb);
    CHECK(na == nb, "%s: %d vs %d owned segments", what, na, nb);
    for (int i = 0; i < na && i < nb; i++) {
        size_t bytes = sa[i].len * sizeof(float);
        CHECK(sa[i].len == sb[i].len && memcmp(sa[i].value, sb[i].value, bytes) == 0 &&
                  memcmp(sa[i].exp_avg, sb[i].exp_avg, bytes) == 0 &&
                  memcmp(sa[i].exp_avg_sq, sb[i].exp_avg_sq, bytes) == 0,
              "%s: segment %d (param %d) differs from the plain engine's", what, i, sa[i].param);
    }
    zt_shard_io_done(ref, sa, na, 0);
    zt_shard_io_done(off, sb, nb, 0);
    zt_shard_begin_inference(ref);
    zt_shard_begin_inference(off);
    for (int u = 0; u < t->nunits; u++) {
        const float *pa = zt_shard_params(ref, u), *pb = zt_shard_params(off, u);
        CHECK(memcmp(pa, pb, t->unit_numel[u] * sizeof(float)) == 0, "%s: working copy of unit %d differs", what, u);
        zt_shard_release(ref, u);
        zt_shard_release(off, u);
    }
    zt_shard_end_inference(ref);
    zt_shard_end_inference(off);
    zt_shard_free(ref);
    zt_shard_free(off);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    zt_comm_t c;
    char err[512];
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0) zt_fatal("%s", err);
    zt_backend_t staged = zt_backend_cpu;
    staged.host_memory = 0;
    zt_param_table_t *t = zt_arch_gpt2_table(2, 2, 16, 37, 8, 0.02f);
    zt_shard_opts_t o3 = {.strategy = ZT_ZERO3, .layout = ZT_LAYOUT_PER_PARAM, .reshard_after_forward = 1,
                          .bucket_bytes = 1 << 20, .seed = 7};
    zt_shard_opts_t od = o3;
    od.strategy = ZT_DDP;
    od.layout = ZT_LAYOUT_FLAT;

    char dir[256] = "/tmp/zt-stage-XXXXXX";
    if (c.world.rank == 0 && !mkdtemp(dir)) zt_fatal("mkdtemp failed");
    ZT_MPI(MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD));

    zt_shard_t *a = zt_shard_create(t, &c, &staged, &o3);
    step(a, t, 1);
    step(a, t, 2);
    zt_ckpt_meta_t meta = {.step = 2, .world_size = c.world.size};
    snprintf(meta.strategy, sizeof meta.strategy, "zero3");
    CHECK(zt_ckpt_save(dir, &meta, "", 0, 0, a, t, &c, err, sizeof err) == 0, "save: %s", err);
    char path[512];
    CHECK(zt_ckpt_find_latest(dir, path, sizeof path) == 0 || c.world.rank != 0, "no checkpoint in %s", dir);
    ZT_MPI(MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD));
    const double sa = zt_shard_param_sumsq(a);

    /* direct (host) ddp engine reads what the staged engine wrote */
    zt_shard_t *b = zt_shard_create(t, &c, &zt_backend_cpu, &od);
    zt_ckpt_meta_t mb;
    CHECK(zt_ckpt_load(path, &mb, 0, b, t, &c, err, sizeof err) == 0, "load into ddp: %s", err);
    /* same values, summed in another order (other ownership): equal to double rounding */
    CHECK(fabs(zt_shard_param_sumsq(b) - sa) <= 1e-12 * sa, "ddp after load %.17g != saved %.17g",
          zt_shard_param_sumsq(b), sa);

    /* staged engine restores values and moments: the next step matches bit for bit */
    zt_shard_t *s2 = zt_shard_create(t, &c, &staged, &o3);
    zt_ckpt_meta_t m2;
    CHECK(zt_ckpt_load(path, &m2, 0, s2, t, &c, err, sizeof err) == 0, "staged load: %s", err);
    CHECK(zt_shard_adam_step(s2) == 2, "adam step %ld after load", zt_shard_adam_step(s2));
    step(a, t, 3);
    step(s2, t, 3);
    CHECK(zt_shard_param_sumsq(s2) == zt_shard_param_sumsq(a), "after one more step: %.17g != %.17g",
          zt_shard_param_sumsq(s2), zt_shard_param_sumsq(a));

    /* weights only: values restored, moments stay zero, so the next step differs */
    zt_shard_t *w = zt_shard_create(t, &c, &staged, &o3);
    zt_ckpt_meta_t mw;
    CHECK(zt_ckpt_load(path, &mw, 1, w, t, &c, err, sizeof err) == 0, "weights-only load: %s", err);
    CHECK(zt_shard_param_sumsq(w) == sa, "weights-only values differ");
    step(w, t, 3);
    CHECK(zt_shard_param_sumsq(w) != zt_shard_param_sumsq(a), "weights-only load restored the moments too");

    zt_shard_free(a);
    zt_shard_free(b);
    zt_shard_free(s2);
    zt_shard_free(w);

    zt_backend_t late = staged;
    late.to_host_async = late_to_host;
    late.from_host_async = late_from_host;
    late.wait_downloads = late_wait_downloads;
    late.wait_uploads = late_wait_uploads;
    check_offload(&c, &late, t, o3, 1, "zero3 per_param + offload_param");
    check_offload(&c, &late, t, o3, 0, "zero3 per_param");
    zt_shard_opts_t o = od;
    check_offload(&c, &late, t, o, 0, "ddp");
    o.strategy = ZT_ZERO2;
    o.param_dtype = ZT_PREC_BF16;
    check_offload(&c, &late, t, o, 0, "zero2 bf16");
    o.reduce_dtype = ZT_PREC_BF16;
    check_offload(&c, &late, t, o, 0, "zero2 bf16 reduce_bf16");
    o.reduce_dtype = ZT_PREC_FP32;
    o.strategy = ZT_ZERO1;
    o.layout = ZT_LAYOUT_PER_PARAM;
    check_offload(&c, &late, t, o, 0, "zero1 per_param bf16");
    o.strategy = ZT_SHARD_GRAD_OP;
    check_offload(&c, &late, t, o, 1, "shard_grad_op per_param bf16 + offload_param");
    check_offload(&c, &late, t, o, 0, "shard_grad_op per_param bf16");
    zt_param_table_free(t);
    int any = zt_any(&c, failures != 0);
    if (c.world.rank == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "stage_test: could not remove %s\n", dir);
        printf("stage_test: %d ranks: %s\n", c.world.size, any ? "FAILED" : "all checks passed");
    }
    zt_comm_destroy(&c);
    MPI_Finalize();
    return any ? 1 : 0;
}
