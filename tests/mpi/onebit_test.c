/* onebit_test.c — the shard engine's 1-bit Adam on given gradients, for a replay.
 *
 * Usage: onebit_test OUTDIR STEPS FREEZE_STEP [RESUME_AT [STRATEGY [LAYOUT [ACCUM]]]]
 * A tiny GPT-2 table under STRATEGY (ddp, zero1 or zero2; default ddp) and LAYOUT (flat or
 * per_param; default flat) on every rank of the world, ACCUM micro-steps a step (1, 2 or 4;
 * default 1), each adding G / (world ACCUM): exact, so the accumulated gradient is G / world
 * whatever the strategy reduces when. Step k's gradient of rank r
 * is G(param, element, r, k) (below, exact in fp32: a small integer over 65536), written
 * into the engine's unit gradients as G / world, the rank's share of the mean the
 * all-reduce forms, as the train loop's loss scaling makes it. Clipped to norm 0.5 as the
 * train loop clips (zt_clip_scale of the norm finish_grads returns: the batch gradient's
 * in the warm-up, each rank's own after the freeze). Rank 0
 * writes OUTDIR/params.txt (name numel decay, one per trainable tensor, in table order),
 * OUTDIR/init.bin and OUTDIR/final.bin (float32 values, tensors concatenated in that
 * order); tests/reference/onebit_replay.py replays DeepSpeed's algorithm on the same
 * gradients from init.bin and compares with final.bin.
 * RESUME_AT (0: none): the run saves a checkpoint after that step, a second engine loads it and
 * runs the remaining steps; OUTDIR/resumed.bin holds its final values, which must equal
 * final.bin bit for bit (error feedback restored). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_optim.h"
#include "zt_shard.h"

/* the test's gradient: an integer in [-1000, 1000] over 65536 (the replay's too) */
static float grad_of(int param, size_t j, int rank, long step)
{
    uint64_t h = (uint64_t)(j + 1) * 2654435761u;
    h ^= (uint64_t)step * 0x9E3779B1u + (uint64_t)rank * 0x85EBCA77u + (uint64_t)param * 0xC2B2AE3Du;
    h = (h ^ (h >> 15)) * 0x2C1B3C6Du;
    h ^= h >> 12;
    return (float)((long)(h % 2001) - 1000) / 65536.0f;
}

static void step(zt_shard_t *s, const zt_param_table_t *t, int rank, int world, int accum, long k)
{
    zt_shard_begin_step(s);
    for (int mi = 0; mi < accum; mi++) {
        zt_shard_begin_micro(s, mi, accum);
        for (int u = t->nunits - 1; u >= 0; u--) {
            float *g = zt_shard_grads(s, u);
            for (int p = t->unit_first[u]; p < t->unit_first[u] + t->unit_count[u]; p++)
                for (size_t j = 0; j < t->params[p].numel; j++)
                    g[t->params[p].offset + j] += grad_of(p, j, rank, k) / (float)(world * accum);
            zt_shard_grads_ready(s, u);
        }
    }
    const double norm = sqrt(zt_shard_finish_grads(s));
    zt_adamw_hp_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .grad_scale = (float)zt_clip_scale(norm, 0.5), .step = k};
    zt_shard_optimizer_step(s, &hp);
}

/* every parameter's values, tensors in table order (ddp, zero1, zero2: every rank holds
 * them all, the units' full parameters) */
static float *values(zt_shard_t *s, const zt_param_table_t *t, size_t total)
{
    float *out = zt_calloc(total, sizeof(float));
    size_t off = 0;
    for (int u = 0; u < t->nunits; u++) {
        const float *full = zt_shard_params(s, u);
        for (int p = t->unit_first[u]; p < t->unit_first[u] + t->unit_count[u]; p++) {
            memcpy(out + off, full + t->params[p].offset, t->params[p].numel * sizeof(float));
            off += t->params[p].numel;
        }
        zt_shard_release(s, u);
    }
    return out;
}

static void dump(const char *dir, const char *name, const float *x, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), n, f) != n || fclose(f) != 0) zt_fatal("cannot write %s", path);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc < 4) zt_fatal("usage: onebit_test OUTDIR STEPS FREEZE_STEP [RESUME_AT [STRATEGY [LAYOUT]]]");
    const char *dir = argv[1];
    const long steps = atol(argv[2]), freeze = atol(argv[3]), resume_at = argc > 4 ? atol(argv[4]) : 0;
    const char *sname = argc > 5 ? argv[5] : "ddp";
    const zt_strategy_t strategy = !strcmp(sname, "zero1") ? ZT_ZERO1 : !strcmp(sname, "zero2") ? ZT_ZERO2 : ZT_DDP;
    const zt_layout_t layout = argc > 6 && !strcmp(argv[6], "per_param") ? ZT_LAYOUT_PER_PARAM : ZT_LAYOUT_FLAT;
    const int accum = argc > 7 ? atoi(argv[7]) : 1;
    if (accum != 1 && accum != 2 && accum != 4) zt_fatal("ACCUM must be 1, 2 or 4 (exact fractions), not %d", accum);
    zt_comm_t c;
    char err[512];
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0) zt_fatal("%s", err);
    const int rank = c.world.rank, world = c.world.size;
    zt_param_table_t *t = zt_arch_gpt2_table(2, 2, 16, 37, 8, 0.02f);
    zt_shard_opts_t o = {.strategy = strategy, .layout = layout, .bucket_bytes = 1 << 20, .seed = 7,
                         .optimizer = ZT_OPTIM_ONEBIT_ADAM, .freeze_step = freeze};
    size_t total = 0;
    for (int p = 0; p < t->nparams; p++) total += t->params[p].numel;

    zt_shard_t *s = zt_shard_create(t, &c, &zt_backend_cpu, &o);
    float *init = values(s, t, total);
    char ck[512] = "";
    for (long k = 1; k <= steps; k++) {
        step(s, t, rank, world, accum, k);
        if (k == resume_at) {
            snprintf(ck, sizeof ck, "%s/ckpt", dir);
            zt_ckpt_meta_t meta = {.step = k, .world_size = world};
            snprintf(meta.strategy, sizeof meta.strategy, "%s", sname);
            if (zt_ckpt_save(ck, &meta, "", 0, 0, s, t, &c, err, sizeof err) != 0) zt_fatal("save: %s", err);
        }
    }
    float *fin = values(s, t, total);
    if (rank == 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/params.txt", dir);
        FILE *f = fopen(path, "w");
        if (!f) zt_fatal("cannot write %s", path);
        for (int p = 0; p < t->nparams; p++)
            fprintf(f, "%s %zu %d\n", t->params[p].name, t->params[p].numel, t->params[p].decay);
        fclose(f);
        dump(dir, "init.bin", init, total);
        dump(dir, "final.bin", fin, total);
    }
    int rc = 0;
    if (resume_at > 0) {
        zt_shard_t *r = zt_shard_create(t, &c, &zt_backend_cpu, &o);
        char path[512];
        if (zt_ckpt_find_latest(ck, path, sizeof path) != 0 && rank == 0) zt_fatal("no checkpoint in %s", ck);
        ZT_MPI(MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD));
        zt_ckpt_meta_t m;
        if (zt_ckpt_load(path, &m, 0, r, t, &c, err, sizeof err) != 0) zt_fatal("load: %s", err);
        for (long k = resume_at + 1; k <= steps; k++) step(r, t, rank, world, accum, k);
        float *res = values(r, t, total);
        if (rank == 0) dump(dir, "resumed.bin", res, total);
        if (memcmp(res, fin, total * sizeof(float)) != 0) {
            fprintf(stderr, "onebit_test: rank %d: resumed at step %ld, the final parameters differ\n", rank,
                    resume_at);
            rc = 1;
        }
        free(res);
        zt_shard_free(r);
    }
    free(init);
    free(fin);
    zt_shard_free(s);
    zt_comm_destroy(&c);
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
