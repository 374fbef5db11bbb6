/* zt_metrics.c — metrics.jsonl: the file and its records (see zt_metrics.h). */
#include "zt_metrics.h"
#include "zt_pref.h"

#include <stdio.h>
#include <string.h>

static FILE *metrics;

int zt_metrics_open(const char *path, int append)
{
    metrics = fopen(path, append ? "a" : "w");
    return metrics ? 0 : -1;
}

void zt_metrics_close(void)
{
    if (metrics) fclose(metrics);
    metrics = NULL;
}

static void write_line(const char *json_line)
{
    if (!metrics) return;
    fputs(json_line, metrics);
    fputc('\n', metrics);
    fflush(metrics);
}

/* ref: DPO's reference copy (params, buffers, gathered, host), or NULL */
static void memory_json(const char *key, const zt_shard_mem_t *m, size_t act, const zt_shard_mem_t *ref, char *buf,
                        size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "\"%s\":{\"params\":%zu,\"grads\":%zu,\"optimizer\":%zu,\"buffers\":%zu,"
                                "\"gathered\":%zu,\"activations\":%zu,\"host\":%zu,\"nvme\":%zu", key, m->params, m->grads,
                                m->optim, m->comm_buffers, m->gathered_peak, act, m->host, m->nvme);
    if (ref && o < len)
        o += (size_t)snprintf(buf + o, len - o, ",\"reference\":{\"params\":%zu,\"buffers\":%zu,\"gathered\":%zu,"
                              "\"host\":%zu}", ref->params, ref->comm_buffers, ref->gathered_peak, ref->host);
    if (o < len) snprintf(buf + o, len - o, "}");
}

static void comm_json(const zt_comm_stats_t *st, char *buf, size_t len)
{
    static const char *names[ZT_COLL_N] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send_recv"};
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "{");
    for (int k = 0; k < ZT_COLL_N; k++) {
        double busbw = st->seconds[k] > 0 ? st->bus_bytes[k] / st->seconds[k] / 1e9 : 0.0;
        o += (size_t)snprintf(buf + o, len - o,
                              "%s\"%s\":{\"calls\":%ld,\"bytes\":%.0f,\"seconds\":%.6f,\"wait_s\":%.6f,\"busbw_GBps\":%.3f}",
                              k ? "," : "", names[k], st->calls[k], st->bytes[k], st->seconds[k], st->wait_seconds[k],
                              busbw);
    }
    /* the same bytes by mesh group */
    o += (size_t)snprintf(buf + o, len - o, ",\"groups\":{");
    for (int k = 0; k < ZT_GRP_N; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s\"%s\":{\"calls\":%ld,\"bytes\":%.0f}", k ? "," : "", zt_group_id_name(k),
                              st->group_calls[k], st->group_bytes[k]);
    snprintf(buf + o, len - o, "}}");
}

void zt_metrics_record_start(const zt_metrics_start_t *r)
{
    char mem[512], line[1024];
    memory_json("memory_estimate", r->mem, r->activations, r->ref, mem, sizeof mem);
    snprintf(line, sizeof line,
             "{\"start\":true,\"world_size\":%d,\"strategy\":\"%s\",\"layout\":\"%s\",\"parameters\":%zu,"
             "\"global_batch\":%ld,\"traffic_estimate_bytes\":%.0f,\"traffic_estimate_warmup_bytes\":%.0f,"
             "\"memory_estimate_total\":%zu,%s}",
             r->world_size, r->strategy, r->layout, r->parameters, r->global_batch, r->traffic_estimate,
             r->traffic_estimate_warmup, r->total, mem);
    write_line(line);
}

void zt_metrics_record_step(const zt_metrics_step_t *r)
{
    char cj[2048], line[4096], pj[1024] = "";
    comm_json(r->comm, cj, sizeof cj);
    /* LLaMA-Factory's names ("rewards/chosen"), after the loss */
    for (int k = 0; k < r->npref; k++) {
        const size_t at = strlen(pj);
        snprintf(pj + at, sizeof pj - at, ",\"%s\":%.17g", zt_pref_metric_name(k), r->pref[k]);
    }
    snprintf(line, sizeof line,
             "{\"step\":%ld,\"loss\":%.9g%s,\"lr\":%.9g,\"grad_norm\":%.9g,\"loss_scale\":%.9g,\"tokens_per_s\":%.3f,"
             "\"tflops\":%.6f,\"mfu\":%.6f,\"elapsed_s\":%.3f,\"step_s\":%.6f,\"tokens_seen\":%.0f,"
             "\"rss_bytes\":%zu,\"comm\":%s}",
             r->step, r->loss, pj, r->lr, r->grad_norm, r->loss_scale, r->tokens_per_s, r->tflops, r->mfu,
             r->elapsed_s, r->step_s, r->tokens_seen, r->rss_bytes, cj);
    write_line(line);
}

void zt_metrics_record_eval(long step, double val_loss, double elapsed_s)
{
    char line[256];
    snprintf(line, sizeof line, "{\"step\":%ld,\"val_loss\":%.9g,\"elapsed_s\":%.3f}", step, val_loss, elapsed_s);
    write_line(line);
}

void zt_metrics_record_skipped(long step, const char *reason, double loss_scale, double elapsed_s)
{
    char line[256];
    snprintf(line, sizeof line, "{\"step\":%ld,\"skipped\":true,\"reason\":\"%s\",\"loss_scale\":%.9g,"
             "\"elapsed_s\":%.3f}", step, reason, loss_scale, elapsed_s);
    write_line(line);
}

void zt_metrics_record_summary(const zt_metrics_summary_t *r)
{
    char line[1024], mem[512];
    memory_json("memory_measured", r->mem, r->activations, r->ref, mem, sizeof mem);
    snprintf(line, sizeof line,
             "{\"summary\":true,\"steps\":%ld,\"tokens\":%.0f,\"wall_s\":%.3f,\"train_s\":%.3f,"
             "\"final_loss\":%.9g,\"final_val_loss\":%.9g,\"peak_rss_bytes\":%.0f,\"peak_rss_growth_bytes\":%.0f,"
             "\"device_peak_bytes\":%.0f,%s}",
             r->steps, r->tokens, r->wall_s, r->train_s, r->final_loss, r->final_val_loss, r->peak_rss_bytes,
             r->peak_rss_growth_bytes,
             r->device_peak_bytes, mem);
    write_line(line);
}

void zt_metrics_record_stage_memory(int pp_rank, const zt_shard_mem_t *est, size_t est_act,
                                    const zt_shard_mem_t *est_ref, const zt_shard_mem_t *meas, size_t meas_act,
                                    const zt_shard_mem_t *meas_ref)
{
    char e[512], m[512], line[1100];
    memory_json("memory_estimate", est, est_act, est_ref, e, sizeof e);
    memory_json("memory_measured", meas, meas_act, meas_ref, m, sizeof m);
    snprintf(line, sizeof line, "{\"pp_rank\":%d,%s,%s}", pp_rank, e, m);
    write_line(line);
}
