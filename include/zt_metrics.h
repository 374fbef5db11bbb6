/* zt_metrics.h — <output_dir>/metrics.jsonl: the file and the records in it.
 *
 * One JSON object per line, flushed per record; the one place that knows the
 * records' fields (tests/mpi/check_accounting.py, compare_runs.py and the docs read
 * them). Rank 0 opens the file; a record is a no-op where it is not open, so every
 * rank may call them. The records take plain values: this module knows the shard
 * engine's memory figures and the comm counters as types, and nothing of a run. */
#ifndef ZT_METRICS_H
#define ZT_METRICS_H

#include <stddef.h>

#include "zt_comm.h"
#include "zt_shard.h"

/* append: a resumed run adds to the records it had. Returns 0 or -1. */
int zt_metrics_open(const char *path, int append);
void zt_metrics_close(void);

/* {"start":true,...}: what the run is, and the per-rank estimates tests check */
typedef struct zt_metrics_start {
    int world_size;
    const char *strategy, *layout;
    size_t parameters;
    long global_batch;
    double traffic_estimate;      /* bytes of collectives and messages per step (1-bit Adam: compressed) */
    double traffic_estimate_warmup; /* the same in 1-bit Adam's warm-up (equal without it) */
    const zt_shard_mem_t *mem;    /* estimate */
    size_t activations;           /* estimate */
    const zt_shard_mem_t *ref;    /* estimate of DPO's frozen reference copy, or NULL */
    size_t total;                 /* estimate: all of the above a rank holds in backend memory */
} zt_metrics_start_t;
void zt_metrics_record_start(const zt_metrics_start_t *r);

/* a logged step: the window's throughput and the collectives counted in it */
typedef struct zt_metrics_step {
    long step;
    double loss, lr, grad_norm, loss_scale;
    double tokens_per_s, tflops, mfu;
    double elapsed_s, step_s, tokens_seen;
    size_t rss_bytes;
    const zt_comm_stats_t *comm;
    int npref;                  /* train.stage = dpo: the first npref preference metrics (zt_pref.h) */
    const double *pref;
} zt_metrics_step_t;
void zt_metrics_record_step(const zt_metrics_step_t *r);

/* an evaluation: {"step":..,"val_loss":..,"elapsed_s":..} */
void zt_metrics_record_eval(long step, double val_loss, double elapsed_s);

/* a step whose optimizer update was skipped (reason "overflow" | "nonfinite"), with
 * the loss scale it ran with */
void zt_metrics_record_skipped(long step, const char *reason, double loss_scale, double elapsed_s);

/* {"summary":true,...}: the end of a run that completed */
typedef struct zt_metrics_summary {
    long steps;
    double tokens, wall_s, train_s;
    double final_loss, final_val_loss;   /* final_val_loss -1 without a validation set */
    double peak_rss_bytes, device_peak_bytes;
    double peak_rss_growth_bytes;        /* max over ranks of VmHWM less the RSS before the model */
    const zt_shard_mem_t *mem;           /* measured (rank 0) */
    size_t activations;
    const zt_shard_mem_t *ref;           /* measured: DPO's frozen reference copy, or NULL */
} zt_metrics_summary_t;
void zt_metrics_record_summary(const zt_metrics_summary_t *r);

/* A pipeline (pp > 1), after the summary: pipeline rank pp_rank's estimate and measurement
 * (those of the rank at data and tp position 0), as the start and summary records give
 * rank 0's: {"pp_rank":r,"memory_estimate":{...},"memory_measured":{...}}; est_ref,
 * meas_ref: DPO's frozen reference copy (its stages' units), or NULL */
void zt_metrics_record_stage_memory(int pp_rank, const zt_shard_mem_t *est, size_t est_act,
                                    const zt_shard_mem_t *est_ref, const zt_shard_mem_t *meas, size_t meas_act,
                                    const zt_shard_mem_t *meas_ref);

#endif
