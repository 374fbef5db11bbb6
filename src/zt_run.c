/* zt_run.c — command line, config distribution, groups, and the dispatch to
 * training or one of the informational commands.
 *
 *   ztrain [input.cfg] [section.key=value ...]
 *   ztrain --help | --version | --print-config [input.cfg ...] |
 *          --estimate-memory [--ranks N [--ranks-per-node M]] [input.cfg ...] |
 *          --config-markdown | --import-markdown
 *
 * An input ending in .yaml or .yml is a LLaMA-Factory training YAML (zt_import.h).
 *
 * Rank 0 reads the input file and broadcasts its text; every rank parses the
 * same text, so every rank reaches the same verdict on it and errors need no
 * further agreement. With no input file, inputs/default.cfg is used. */
#include "config.h"
#include "zt_run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_comm.h"
#include "zt_common.h"
#include "zt_config.h"
#include "zt_log.h"
#include "zt_hf_model.h"
#include "zt_import.h"
#include "zt_train.h"
#include "zt_watchdog.h"

#define DEFAULT_INPUT "inputs/default.cfg"


static void usage(FILE *out)
{
    fprintf(out,
            "usage: ztrain [input.cfg] [section.key=value ...]\n"
            "       ztrain --print-config [input.cfg] [section.key=value ...]\n"
            "       ztrain --generate [input.cfg] [section.key=value ...]   (generate.* prompts -> generations.jsonl)\n"
            "       ztrain --estimate-memory [--ranks N [--ranks-per-node M]] [input.cfg] [section.key=value ...]\n"
            "              (planning: N ranks, M per node; default: the ranks it was launched on)\n"
            "       ztrain --help | --version | --config-markdown | --import-markdown\n"
            "An input.yaml is a LLaMA-Factory training YAML (and the DeepSpeed JSON it names);\n"
            "--accelerate-config FILE adds an accelerate config (FSDP) to it.\n"
            "Launch with mpirun -np N, srun --mpi=pmix, or the scripts in jobs/.\n"
            "With no input file, %s is used. Keys (section.key, type, default):\n\n",
            DEFAULT_INPUT);
}

int zt_run(int argc, char **argv, MPI_Comm world)
{
    int rank = 0, size = 1;
    ZT_MPI(MPI_Comm_rank(world, &rank));
    ZT_MPI(MPI_Comm_size(world, &size));
    zt_log_init(rank, NULL);

    enum { TRAIN, PRINT, ESTIMATE, GENERATE } mode = TRAIN;
    long plan_ranks = 0, plan_per_node = 0;
    const char *input = NULL, *accel = NULL;
    char **overrides = zt_calloc((size_t)argc + 1, sizeof *overrides);
    int nover = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            if (rank == 0) {
                usage(stdout);
                zt_config_help(stdout);
            }
            free(overrides);
            return ZT_EXIT_OK;
        } else if (strcmp(a, "--version") == 0) {
            if (rank == 0) printf("ztrain %s\n", PACKAGE_VERSION);
            free(overrides);
            return ZT_EXIT_OK;
        } else if (strcmp(a, "--config-markdown") == 0) {
            if (rank == 0) zt_config_markdown(stdout);
            free(overrides);
            return ZT_EXIT_OK;
        } else if (strcmp(a, "--import-markdown") == 0) {
            if (rank == 0) zt_import_markdown(stdout);
            free(overrides);
            return ZT_EXIT_OK;
        } else if (strcmp(a, "--print-config") == 0) {
            mode = PRINT;
        } else if (strcmp(a, "--estimate-memory") == 0) {
            mode = ESTIMATE;
        } else if (strcmp(a, "--generate") == 0) {
            mode = GENERATE;
        } else if (strcmp(a, "--accelerate-config") == 0 && i + 1 < argc) {
            accel = argv[++i];
        } else if ((strcmp(a, "--ranks") == 0 || strcmp(a, "--ranks-per-node") == 0) && i + 1 < argc) {
            char *end = NULL;
            long v = strtol(argv[i + 1], &end, 10);
            if (!end || *end || v < 1 || v > (1L << 24)) {
                if (rank == 0) fprintf(stderr, "ztrain: error: %s needs a positive rank count, got '%s'\n", a, argv[i + 1]);
                free(overrides);
                return ZT_EXIT_ERROR;
            }
            if (a[7] == 0) plan_ranks = v;
            else plan_per_node = v;
            i++;
        } else if (a[0] == '-') {
            if (rank == 0) {
                fprintf(stderr, "ztrain: error: unknown option '%s'\n", a);
                usage(stderr);
            }
            free(overrides);
            return ZT_EXIT_ERROR;
        } else if (strchr(a, '=')) {
            overrides[nover++] = argv[i];
        } else if (!input) {
            input = a;
        } else {
            if (rank == 0) fprintf(stderr, "ztrain: error: more than one input file ('%s' and '%s')\n", input, a);
            free(overrides);
            return ZT_EXIT_ERROR;
        }
    }
    if (!input) input = DEFAULT_INPUT;

    char err[ZT_ERRLEN] = "";
    if (accel && !zt_import_is_yaml(input)) {
        if (rank == 0) fprintf(stderr, "ztrain: error: --accelerate-config goes with a LLaMA-Factory training YAML, "
                                       "not with %s\n", input);
        free(overrides);
        return ZT_EXIT_ERROR;
    }
    const int nodes = zt_comm_node_count(world); /* collective: before rank 0 reads alone */
    char *text = rank == 0 ? zt_read_file(input, NULL, err, sizeof err) : NULL;
    if (text && zt_import_is_yaml(input)) {
        /* a LLaMA-Factory YAML (and accelerate's config): rank 0 turns them into the input they
         * mean, its notes on stdout */
        char *atext = accel ? zt_read_file(accel, NULL, err, sizeof err) : NULL;
        char *imported = !accel || atext ? zt_import_yaml(text, input, atext, accel, size, nodes, stdout, err,
                                                          sizeof err)
                                         : NULL;
        free(atext);
        free(text);
        text = imported;
    }
    text = zt_bcast_text(world, text);
    if (!text) {
        if (rank == 0) fprintf(stderr, "ztrain: error: %s\n", err);
        free(overrides);
        return ZT_EXIT_ERROR;
    }
    zt_config_t *cfg = zt_calloc(1, sizeof *cfg);
    int rc = zt_config_parse(cfg, text, input, nover, overrides, err, sizeof err);
    free(text);
    free(overrides);
    if (rc != 0) {
        if (rank == 0) fprintf(stderr, "ztrain: error: %s\n", err);
        free(cfg);
        return ZT_EXIT_ERROR;
    }
    snprintf(cfg->source, sizeof cfg->source, "%s", input);
    cfg->mode_generate = mode == GENERATE;
    if (cfg->model.name_or_path[0]) {
        /* the family and every dimension come from config.json: rank 0 reads it */
        char path[ZT_STRLEN + 16];
        snprintf(path, sizeof path, "%s/config.json", cfg->model.name_or_path);
        char *js = rank == 0 ? zt_read_file(path, NULL, err, sizeof err) : NULL;
        js = zt_bcast_text(world, js);
        rc = js ? zt_hf_model_resolve(cfg, js, path, err, sizeof err) : -1;
        free(js);
        if (rc != 0) {
            if (rank == 0) fprintf(stderr, "ztrain: error: %s\n", err);
            free(cfg);
            return ZT_EXIT_ERROR;
        }
    }

    if (mode == PRINT) {
        if (rank == 0) zt_config_print(cfg, stdout);
        free(cfg);
        return ZT_EXIT_OK;
    }
    /* parallel.strategy = auto may choose the mesh too, before the groups are made */
    char why[1024] = "";
    int uniform = 0;
    const int node_ranks = zt_comm_node_ranks(world, &uniform);
    int am = mode != ESTIMATE && mode != GENERATE ? zt_train_auto_mesh(cfg, size, node_ranks, why, sizeof why) : 0;
    if (mode != ESTIMATE && mode != GENERATE && cfg->parallel.strategy == ZT_STRATEGY_AUTO) {
        /* rank 0's choice on every rank: without parallel.memory_limit_gb the limit is each
         * node's own memory, which may differ between nodes */
        char *pick = NULL;
        if (rank == 0) {
            pick = zt_malloc(64);
            snprintf(pick, 64, "%d %d %d %d %d", am, cfg->parallel.pipeline_parallel_size,
                     cfg->parallel.tensor_parallel_size, cfg->parallel.sequence_parallel_size,
                     (int)cfg->parallel.pp_schedule);
        }
        pick = zt_bcast_text(world, pick);
        int sched = 0;
        if (sscanf(pick, "%d %d %d %d %d", &am, &cfg->parallel.pipeline_parallel_size,
                   &cfg->parallel.tensor_parallel_size, &cfg->parallel.sequence_parallel_size, &sched) != 5)
            zt_fatal("parallel auto: rank 0's choice unreadable (%s)", pick);
        cfg->parallel.pp_schedule = (zt_pp_schedule_t)sched;
        free(pick);
    }
    if (am < 0) { /* every rank, rank 0's line */
        if (rank == 0) fprintf(stderr, "ztrain: error: %s\n", why);
        free(cfg);
        return ZT_EXIT_ERROR;
    }
    if (am && rank == 0) printf("parallel auto: %s\n", why);
    /* --estimate-memory plans for --ranks: the plan is made and checked there, not on these ranks */
    const int est = mode == ESTIMATE;
    zt_parallel_plan_t plan = {0};
    if (!est && zt_train_plan(cfg, size, uniform ? node_ranks : 0, &plan, err, sizeof err) != 0) {
        if (rank == 0) fprintf(stderr, "ztrain: error: %s\n", err);
        free(cfg);
        return ZT_EXIT_ERROR;
    }
    zt_comm_t comm;
    /* shard groups only shape hybrid strategies; the others shard over the world */
    if (zt_comm_create_mesh(&comm, world, est ? 1 : plan.pp, est ? 1 : plan.tp, est ? 1 : plan.sp,
                            zt_strategy_is_hybrid(plan.strategy) ? plan.shard_group : 0, err, sizeof err) != 0) {
        if (rank == 0) fprintf(stderr, "ztrain: error: %s\n", err);
        free(cfg);
        return ZT_EXIT_ERROR;
    }
    if (mode == ESTIMATE) {
        const int ranks = plan_ranks ? (int)plan_ranks : size;
        int per_node = plan_per_node ? (int)plan_per_node : plan_ranks ? ranks : comm.local_size;
        if (per_node > ranks) per_node = ranks;
        zt_train_estimate_memory(cfg, ranks, per_node);
        zt_comm_destroy(&comm);
        free(cfg);
        return ZT_EXIT_OK;
    }
    zt_signal_install();
    int code = zt_train(cfg, &plan, &comm);
    zt_comm_destroy(&comm);
    free(cfg);
    return code;
}
