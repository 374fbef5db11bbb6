/* stage_test.c — checkpoint I/O through host staging, the path device backends take.
 * A copy of the CPU backend that declares its memory not host-readable forces the
 * shard engine to stage every segment through host buffers. Checks, at any world
 * size: a staged zero3 engine saves what a direct ddp engine loads; a staged engine
 * restores values and Adam moments (one more identical step gives bit-identical
 * parameters); a weights-only load leaves the moments alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_ckpt.h"
#include "zt_common.h"
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

/* one optimizer step with a deterministic fake gradient */
static void step(zt_shard_t *s, const zt_param_table_t *t, long adam_t)
{
    zt_shard_begin_step(s);
    zt_shard_begin_micro(s, 0, 1);
    for (int u = t->nunits - 1; u >= 0; u--) {
        float *g = zt_shard_grads(s, u);
        for (size_t i = 0; i < t->unit_numel[u]; i++) g[i] = 1e-3f * (float)((i * 7 + (size_t)u) % 13) - 6e-3f;
        zt_shard_grads_ready(s, u);
    }
    zt_shard_finish_grads(s);
    zt_adamw_hp_t hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .grad_scale = 1.0f, .step = adam_t};
    zt_shard_optimizer_step(s, &hp);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    zt_comm_t c;
    char err[512];
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0) zt_fatal("%s", err);
    zt_backend_t staged = zt_backend_cpu;
    staged.host_memory = 0;
    zt_model_dims_t d = {.L = 2, .NH = 2, .C = 16, .V = 37, .maxT = 8};
    zt_param_table_t *t = zt_param_table_create(d, 0.02f);
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
    CHECK(zt_ckpt_save(dir, &meta, "", "consolidated", 0, a, t, &c, err, sizeof err) == 0, "save: %s", err);
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
