/* zt_train_report.c — what a run tells its user and its metrics file: the start-up lines
 * (mesh, model, strategy, batch, estimated memory and traffic), the start record tests
 * check, the collectives' totals, the loss history and its plot. Only rank 0 prints and
 * writes; each figure comes from the module that counts it (the estimate, zt_comm's
 * statistics), none is worked out here a second time. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_log.h"
#include "zt_metrics.h"
#include "zt_plot.h"
#include "zt_train_internal.h"

void zt_tr_hist_push(hist_t *h, long step, float v)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 256;
        h->step = realloc(h->step, (size_t)h->cap * sizeof *h->step);
        h->val = realloc(h->val, (size_t)h->cap * sizeof *h->val);
        if (!h->step || !h->val) zt_fatal("out of memory");
    }
    h->step[h->n] = step;
    h->val[h->n++] = v;
}

/* <output_dir>/loss.svg: the training and validation losses (dpo: and the reward margin) */
void zt_tr_write_plot(const run_t *r, const char *path)
{
    char title[ZT_STRLEN + 48];
    const int dpo = r->cfg->train.stage == ZT_STAGE_DPO;
    snprintf(title, sizeof title, "ztrain %s (%s)", dpo ? "loss and reward margin" : "loss", r->cfg->source);
    /* dpo: the margin (chosen minus rejected reward) beside the loss, LLaMA-Factory's
     * rewards/margins: a loss that falls while the margin does not grow is the failure
     * users look for */
    const zt_plot_series_t series[3] = {
        {"train loss", r->train_hist.step, r->train_hist.val, r->train_hist.n},
        {"validation loss", r->val_hist.step, r->val_hist.val, r->val_hist.n},
        {"reward margin", r->margin_hist.step, r->margin_hist.val, r->margin_hist.n},
    };
    zt_plot_svg(path, title, series, dpo ? 3 : 2);
}

void zt_tr_startup_report(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    zt_comm_t *c = r->comm;
    /* rank -> host map */
    char host[64] = "";
    snprintf(host, sizeof host, "%s", zt_hostname());
    char *all = r->rank == 0 ? zt_malloc((size_t)c->world.size * 64) : NULL;
    int *counts = zt_malloc(2 * (size_t)c->world.size * sizeof *counts), *displs = counts + c->world.size;
    for (int i = 0; i < c->world.size; i++) counts[i] = 64, displs[i] = 64 * i;
    /* through the comm module, as every collective (its count is reset before the first step) */
    zt_gatherv(c, &c->world, host, all, counts, displs, ZT_U8, 0);
    free(counts);
    static const char *const matmul[] = {"fp32", "tf32", "bf16"};
    zt_log("ztrain %s: %d ranks on %d nodes, mesh tp %d x sp %d x dp %d x pp %d, backend %s (GEMMs %s), comm %s, %d "
           "thread(s) per rank", PACKAGE_VERSION, c->world.size, c->node_count, c->mesh_tp, c->mesh_sp, c->mesh_dp,
           c->mesh_pp, r->be->name, strcmp(r->be->name, "cpu") ? matmul[r->plan.matmul] : zt_cpu_gemm_path(),
           c->backend, r->threads);
    if (r->rank == 0) {
        for (int i = 0; i < c->world.size; i++)
            printf("  rank %d -> %s%s\n", i, all + (size_t)i * 64, strcmp(r->be->name, "cpu") ? " (device)" : " (cpu)");
        free(all);
    }
    const zt_param_table_t *t = r->table;
    const zt_model_dims_t *d = &t->dims;
    char window[64] = "";
    if (d->sliding_window && d->sliding_pattern)
        snprintf(window, sizeof window, " window=%d (every %d layers one full)", d->sliding_window, d->sliding_pattern);
    else if (d->sliding_window)
        snprintf(window, sizeof window, " window=%d", d->sliding_window);
    zt_log("model: %s L=%d H=%d KV=%d C=%d head_dim=%d I=%d V=%d block=%d%s%s, %zu parameters in %d units%s%s",
           t->arch->name, d->L, d->NH, d->NKV, d->C, d->HD, d->I, d->V, d->maxT, d->tied ? " tied" : "", window,
           t->total_numel, t->nunits, cfg->model.name_or_path[0] ? " from " : "", cfg->model.name_or_path);
    int sn = zt_strategy_is_hybrid(r->sopts.strategy) ? c->shard.size : c->data.size;
    zt_log("strategy: %s, layout %s, shard group %d, replica group %d, reshard_after_forward %s",
           zt_strategy_name(r->sopts.strategy), zt_config_enum_name("parallel.shard_layout", r->plan.layout),
           r->sopts.strategy == ZT_DDP ? 1 : sn,
           r->sopts.strategy == ZT_DDP ? c->data.size : zt_strategy_is_hybrid(r->sopts.strategy) ? c->replica.size : 1,
           cfg->parallel.reshard_after_forward ? "true" : "false");
    zt_log("batch: global %ld sequences = %d per device x %d ranks x %d accumulation, T=%d (%ld tokens/step); %ld steps",
           r->G, r->B, r->dp, r->A, r->T, r->G * r->T, r->total_steps);
    if (cfg->optim.warmup_steps == 0 && cfg->optim.warmup_ratio > 0)
        zt_log("warm-up: %ld steps = ceil(%ld steps x optim.warmup_ratio %g)", r->sched.warmup, r->total_steps,
               cfg->optim.warmup_ratio);
    estimate_t e;
    zt_tr_estimate(cfg, &r->plan, r->table, r->ltable, r->sopts.strategy, c->data.size, c->shard.size, &e);
    char b[8][32];
    char nb[32];
    zt_log("memory per rank (estimate): params %s, grads %s, optimizer %s, buffers %s, gathered %s, activations %s, total %s%s%s%s%s",
           zt_fmt_bytes(e.mem.params, b[0], 32), zt_fmt_bytes(e.mem.grads, b[1], 32),
           zt_fmt_bytes(e.mem.optim, b[2], 32), zt_fmt_bytes(e.mem.comm_buffers, b[3], 32),
           zt_fmt_bytes(e.mem.gathered_peak, b[4], 32), zt_fmt_bytes(e.activations, b[5], 32),
           zt_fmt_bytes(e.total, b[6], 32), e.mem.host ? "; offloaded to host " : "",
           e.mem.host ? zt_fmt_bytes(e.mem.host, b[7], 32) : "", e.mem.nvme ? "; on disk (nvme) " : "",
           e.mem.nvme ? zt_fmt_bytes(e.mem.nvme, nb, 32) : "");
    if (zt_tr_has_ref_copy(cfg))
        zt_log("memory per rank (estimate): the dpo reference copy %s (params %s, gathered %s, host %s), in the total",
               zt_fmt_bytes((double)(e.ref.params + e.ref.comm_buffers + e.ref.gathered_peak + e.ref.host), b[0], 32),
               zt_fmt_bytes(e.ref.params, b[1], 32), zt_fmt_bytes(e.ref.gathered_peak, b[2], 32),
               zt_fmt_bytes(e.ref.host, b[3], 32));
    /* by group: what each axis of the mesh moves, as the summary's measured line */
    char by[256];
    size_t o = 0;
    by[0] = '\0';
    for (int k = 0; k < ZT_GRP_N && o < sizeof by; k++)
        if (e.group_traffic[k] > 0)
            o += (size_t)snprintf(by + o, sizeof by - o, "%s%s %s", o ? ", " : " (", zt_group_id_name(k),
                                  zt_fmt_bytes(e.group_traffic[k], b[1], 32));
    if (o && o + 1 < sizeof by) strcat(by, ")");
    zt_log("traffic per step (estimate%s): %s of collectives and messages%s",
           r->plan.pp > 1 ? ", the busiest pipeline rank" : "", zt_fmt_bytes(e.traffic, b[0], 32), by);
    if (e.traffic_warmup != e.traffic)
        zt_log("traffic per step (estimate): %s in 1-bit Adam's warm-up (steps 1 .. %ld, uncompressed)",
               zt_fmt_bytes(e.traffic_warmup, b[0], 32), r->plan.freeze_step);
}

/* First metrics record: what the run is, and the per-rank estimates tests check. */
void zt_tr_start_record(const run_t *r)
{
    estimate_t e; /* rank 0's: under a pipeline the first stage's */
    zt_tr_estimate_rank(r->cfg, &r->plan, r->table, r->ltable, r->sopts.strategy, r->comm->data.size, r->comm->shard.size, 0,
                  &e);
    const zt_metrics_start_t rec = {
        .world_size = r->comm->world.size, .strategy = zt_strategy_name(r->sopts.strategy),
        .layout = zt_config_enum_name("parallel.shard_layout", r->plan.layout), .parameters = r->table->total_numel, .global_batch = r->G,
        .traffic_estimate = e.traffic, .traffic_estimate_warmup = e.traffic_warmup, .mem = &e.mem, .activations = e.activations,
        .ref = zt_tr_has_ref_copy(r->cfg) ? &e.ref : NULL, .total = e.total,
    };
    zt_metrics_record_start(&rec);
}

void zt_tr_format_eta(double s, char *buf, size_t len)
{
    long x = (long)s;
    if (x >= 3600) snprintf(buf, len, "%ldh%02ldm", x / 3600, (x % 3600) / 60);
    else snprintf(buf, len, "%ldm%02lds", x / 60, x % 60);
}

/* Adds the collectives counted since the last reset to the run's total, and resets. */
void zt_tr_fold_comm(run_t *r)
{
    zt_comm_stats_t *t = &r->comm_total;
    const zt_comm_stats_t *st = zt_comm_stats(r->comm);
    for (int k = 0; k < ZT_COLL_N; k++) {
        t->bytes[k] += st->bytes[k];
        t->bus_bytes[k] += st->bus_bytes[k];
        t->seconds[k] += st->seconds[k];
        t->wait_seconds[k] += st->wait_seconds[k];
        t->calls[k] += st->calls[k];
    }
    for (int k = 0; k < ZT_GRP_N; k++) {
        t->group_bytes[k] += st->group_bytes[k];
        t->group_calls[k] += st->group_calls[k];
    }
    zt_comm_stats_reset(r->comm);
}

void zt_tr_comm_summary(const run_t *r)
{
    static const char *names[ZT_COLL_N] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast", "all-to-all", "send-recv"};
    const zt_comm_stats_t *t = &r->comm_total;
    char line[1024], b[32];
    size_t o = 0;
    for (int k = 0; k < ZT_COLL_N; k++) {
        if (!t->calls[k]) continue;
        o += (size_t)snprintf(line + o, sizeof line - o, "%s%s %ld calls, %s, %.2f s, busbw %.2f GB/s",
                              o ? "; " : "", names[k], t->calls[k], zt_fmt_bytes(t->bytes[k], b, sizeof b),
                              t->seconds[k], t->seconds[k] > 0 ? t->bus_bytes[k] / t->seconds[k] / 1e9 : 0.0);
    }
    if (o) zt_log("communication (rank 0, training steps): %s", line);
    /* by group: what each axis of the mesh moves (tests/mpi/accounting.sh) */
    o = 0;
    for (int k = 0; k < ZT_GRP_N; k++)
        if (t->group_calls[k])
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%s %ld calls %.0f bytes", o ? "; " : "", zt_group_id_name(k),
                                  t->group_calls[k], t->group_bytes[k]);
    if (o) zt_log("communication by group (rank 0, training steps): %s", line);
}
