/* bench_onebit.c — the optimizer step alone, 1-bit Adam against AdamW, on GPT-2 124M's
 * parameter table under ddp: every rank of the world one replica, gradients given (a hash
 * of element, step and rank, as a backward would leave them), no model. Runs STEPS steps
 * (freeze_step 2: steps 3.. are compressed) and prints, per step, rank 0's wall time of
 * zt_shard_optimizer_step, then the median over the compressed steps (4..: step 3 also
 * touches the error buffers' pages for the first time). With OUT, rank 0 writes the final
 * parameters (float32, tensors in table order) there, for byte comparisons between builds.
 *
 *   mpirun -np 2 tools/bench_onebit [adamw|onebit_adam [STEPS [L C V [OUT]]]]
 *
 * (L C V: layers, width, vocabulary; default 12 768 50257) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_common.h"
#include "zt_optim.h"
#include "zt_shard.h"

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the gradient a backward left in unit u at step k on this rank */
static void fill_grads(zt_shard_t *s, const zt_param_table_t *t, int u, long k, int rank)
{
    float *g = zt_shard_grads(s, u);
    for (int p = t->unit_first[u]; p < t->unit_first[u] + t->unit_count[u]; p++) {
        const uint64_t salt = (uint64_t)k * 0x9E3779B1u + (uint64_t)rank * 0x85EBCA77u + (uint64_t)p * 0xC2B2AE3Du;
        for (size_t j = 0; j < t->params[p].numel; j++) {
            const uint64_t h = (((uint64_t)j * 2654435761u) ^ salt) * 0x2C1B3C6Du;
            g[t->params[p].offset + j] = (float)((long)(h % 2001) - 1000) / 65536.0f;
        }
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const int onebit = argc > 1 && !strcmp(argv[1], "onebit_adam");
    const long steps = argc > 2 ? atol(argv[2]) : 6;
    const int L = argc > 5 ? atoi(argv[3]) : 12, C = argc > 5 ? atoi(argv[4]) : 768, V = argc > 5 ? atoi(argv[5]) : 50257;
    if (steps < 4 || L < 1 || C < 12 || C % 12 || V < 2) zt_fatal("usage: bench_onebit [adamw|onebit_adam [STEPS >= 4 [L C V [OUT]]]]");
    zt_comm_t c;
    char err[512];
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0) zt_fatal("%s", err);
    zt_param_table_t *t = zt_arch_gpt2_table(L, 12, C, V, 1024, 0.02f);
    zt_shard_opts_t o = {.strategy = ZT_DDP, .layout = ZT_LAYOUT_FLAT, .bucket_bytes = 25 << 20, .seed = 7,
                         .optimizer = onebit ? ZT_OPTIM_ONEBIT_ADAM : ZT_OPTIM_ADAMW, .freeze_step = 2};
    zt_shard_t *s = zt_shard_create(t, &c, &zt_backend_cpu, &o);
    double *sec = zt_calloc((size_t)steps, sizeof(double));
    for (long k = 1; k <= steps; k++) {
        zt_shard_begin_step(s);
        zt_shard_begin_micro(s, 0, 1);
        for (int u = t->nunits - 1; u >= 0; u--) {
            fill_grads(s, t, u, k, c.world.rank);
            zt_shard_grads_ready(s, u);
        }
        const double norm = sqrt(zt_shard_finish_grads(s));
        zt_adamw_hp_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .grad_scale = (float)zt_clip_scale(norm, 1.0), .step = k};
        (void)zt_sum_double(&c, &c.world, 0.0); /* the ranks start the step together */
        const double t0 = zt_now();
        zt_shard_optimizer_step(s, &hp);
        sec[k - 1] = zt_now() - t0;
        if (c.world.rank == 0) printf("step %ld: optimizer step %.3f s\n", k, sec[k - 1]);
    }
    qsort(sec + 3, (size_t)steps - 3, sizeof(double), cmp_double);
    if (c.world.rank == 0)
        printf("bench_onebit: %s, %d ranks, %zu parameters: optimizer step %.3f s (median of steps 4..%ld)\n",
               onebit ? "onebit_adam" : "adamw", c.world.size, t->total_numel, sec[3 + (steps - 3) / 2], steps);
    if (argc > 6 && c.world.rank == 0) {
        FILE *f = fopen(argv[6], "wb");
        if (!f) zt_fatal("cannot write %s", argv[6]);
        for (int u = 0; u < t->nunits; u++) {
            const float *full = zt_shard_params(s, u);
            for (int p = t->unit_first[u]; p < t->unit_first[u] + t->unit_count[u]; p++)
                if (fwrite(full + t->params[p].offset, sizeof(float), t->params[p].numel, f) != t->params[p].numel)
                    zt_fatal("cannot write %s", argv[6]);
            zt_shard_release(s, u);
        }
        if (fclose(f) != 0) zt_fatal("cannot write %s", argv[6]);
    }
    free(sec);
    zt_shard_free(s);
    zt_comm_destroy(&c);
    MPI_Finalize();
    return 0;
}
