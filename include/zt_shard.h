/* zt_shard.h — the shard engine: owns parameters, gradients and optimizer state.
 *
 * Per strategy it decides what is resident, what is gathered when, and what is
 * reduced where (see doc/design.md for the residency table). The train loop asks
 * for a unit's full parameters before it runs (zt_shard_params), hands back the
 * unit when done (zt_shard_release), and says when a unit's gradients are
 * complete for this micro-step (zt_shard_grads_ready). The model only ever sees
 * full unit buffers.
 *
 * Layouts, per unit, over a shard group of n ranks:
 *   flat       the unit's flat buffer padded to a multiple of n; rank r owns the
 *              contiguous slice [r*S, (r+1)*S), S = padded/n.
 *   per_param  every parameter split along dim 0 into n near-equal row blocks;
 *              rank r owns the concatenation of its row block of each parameter.
 * Both are described as a list of (unit offset, length) segments per rank, so
 * gathering is an all-gather(v) into rank order followed by an unpack (a no-op
 * for flat), and reduce-scatter is a pack followed by reduce-scatter(v). */
#ifndef ZT_SHARD_H
#define ZT_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "zt_backend.h"
#include "zt_comm.h"
#include "zt_nvme.h"
#include "zt_params.h"
#include "zt_plan.h" /* zt_strategy_t, zt_layout_t and what each strategy shards */

/* A contiguous run of one unit's flat buffer. */
typedef struct zt_segment { size_t off, len; } zt_segment_t;

/* Shard geometry of one unit for a group of n ranks (pure arithmetic, unit-tested). */
typedef struct zt_unit_layout {
    size_t numel;           /* unpadded unit elements */
    int n;                  /* ranks */
    size_t *count;          /* (n) elements rank r owns (flat: S each, padding included) */
    size_t *displ;          /* (n) offset of rank r's part in rank-ordered packed buffer */
    size_t packed;          /* sum of counts (flat: padded size) */
    int *nseg;              /* (n) segments per rank */
    zt_segment_t **seg;     /* seg[r][i]: unit-buffer ranges rank r owns, in packed order */
} zt_unit_layout_t;

void zt_unit_layout_build(zt_unit_layout_t *lay, const zt_param_table_t *t, int unit, int n,
                          zt_layout_t kind);
void zt_unit_layout_free(zt_unit_layout_t *lay);

typedef struct zt_shard_opts {
    zt_strategy_t strategy;
    zt_layout_t layout;
    int reshard_after_forward;
    size_t bucket_bytes;
    zt_precision_t param_dtype;  /* working params (gathered in it): fp32, or bf16 / fp16 beside an
                                  * fp32 master; fp16: the gradients the optimizer sees are
                                  * rounded to fp16 */
    zt_precision_t reduce_dtype; /* gradients communicated and reduced in it */
    int offload_optim;      /* fp32 master, Adam moments and the AdamW step in host memory */
    int offload_param;      /* + parameter shards in host memory (parameter-sharding strategies) */
    int offload_nvme;       /* offload = nvme: what offload_optim (and offload_param) move lives in
                             * scratch files (zt_nvme.h), in host memory only while a unit is
                             * stepped, initialized, gathered or checkpointed */
    zt_nvme_opts_t nvme;    /* its path and I/O settings (rank: set by the engine) */
    uint64_t seed;          /* for initialization */
    zt_optimizer_t optimizer; /* AdamW, or 1-bit Adam (ddp, zero1, zero2; zt_onebit.h): its steps
                               * after freeze_step reduce no gradients and exchange the momentum */
    long freeze_step;
    /* Pipelines (pp > 1): a pipeline rank holds the units of its stages' layers only.
     * held (nunits) or NULL (every unit): a unit not held has no state at all (no
     * parameters, gradients, moments; zt_shard_params / zt_shard_grads on it abort), the
     * step protocol, the I/O views and the norm pass it by. */
    const unsigned char *held;
    int pipeline;           /* pp > 1: the squared gradient norm summed over comm->pp (each
                             * stage's units counted on the rank that holds them) */
    int root_shared;        /* the root unit is held by the first and the last pipeline rank
                             * (pp ranks 0 and pp - 1; a tied head, which is the embedding): the
                             * embedding's gradient arises on one, the head's on the other. Its
                             * gradient (ddp: whole, zero: the rank's shard) is summed between
                             * the two before the norm, so both step it alike; the norm counts
                             * and the I/O views write it on pp rank 0 only */
} zt_shard_opts_t;

typedef struct zt_shard zt_shard_t;

/* Creates the engine and initializes the owned state from the seed. */
zt_shard_t *zt_shard_create(const zt_param_table_t *t, zt_comm_t *comm, const zt_backend_t *be,
                            const zt_shard_opts_t *opts);
/* The same, where a failure every rank meets at start (offload_nvme: a missing or
 * read-only nvme path, a full disk) is agreed over the world: NULL with one line in err
 * on every rank, nothing left behind. zt_shard_create aborts on it. */
zt_shard_t *zt_shard_create_err(const zt_param_table_t *t, zt_comm_t *comm, const zt_backend_t *be,
                                const zt_shard_opts_t *opts, char *err, size_t errlen);
void zt_shard_free(zt_shard_t *s);
/* 1 when this rank holds unit (opts.held: its pipeline rank's stages), 0 for another pipeline
 * rank's unit */
int zt_shard_holds(const zt_shard_t *s, int unit);

/* Step protocol (called by the train loop, identical order on every rank). */
void zt_shard_begin_step(zt_shard_t *s);
void zt_shard_begin_micro(zt_shard_t *s, int micro, int nmicro);
const float *zt_shard_params(zt_shard_t *s, int unit);     /* full unit params */
void zt_shard_prefetch(zt_shard_t *s, int unit);            /* may start a gather early */
void zt_shard_release(zt_shard_t *s, int unit);             /* done with params for now */
/* Full unit grad buffer to += into; NULL for a frozen unit (t->unit_frozen[unit]),
 * which has no gradient buffers at all. */
float *zt_shard_grads(zt_shard_t *s, int unit);
/* Unit's grads final for micro; for a frozen unit only marks its backward done (no
 * collective, on every rank alike). */
void zt_shard_grads_ready(zt_shard_t *s, int unit);
/* Frozen units (t->unit_frozen[u] = 1, LoRA's base; unit_frozen NULL: none): the
 * parameters only, in their working dtype: fp32, or the 16-bit working copy without
 * any fp32 master (sharded where the strategy shards parameters, the full copy
 * otherwise; in host memory under offload_param). No gradient buffers, no
 * reductions, no Adam moments; finish_grads, optimizer_step, zero_grads and
 * begin_step pass them by (they never change, so nothing is re-gathered). Gathers,
 * prefetch and release work as for any unit.
 *
 * After the last micro-step: completes every reduction; returns the global
 * gradient L2 norm squared (each element counted once, frozen units have none). With opts.fp16 the owned
 * gradients are first rounded to fp16, so a (loss-scaled) value past 65504 turns
 * into Inf and the norm into Inf, whatever the world size and reduce dtype. */
double zt_shard_finish_grads(zt_shard_t *s);
/* AdamW on the owned shard, then whatever re-gather the strategy needs.
 * 1-bit Adam (opts.optimizer): steps 1 .. freeze_step are its warm-up on the all-reduced
 * gradients; later ones update the momentum with this rank's own gradient (its share of
 * the batch gradient times the replicas, so that their mean is the batch gradient),
 * exchange it compressed and leave v frozen. There finish_grads returns this rank's own
 * squared norm of that gradient, so clipping is per rank, as in DeepSpeed's fp32 engine. */
typedef struct zt_adamw_hp {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    long step;  /* 1-based */
} zt_adamw_hp_t;
void zt_shard_optimizer_step(zt_shard_t *s, const zt_adamw_hp_t *hp);
/* Discards this step's gradients (skip on NaN). */
void zt_shard_zero_grads(zt_shard_t *s);
/* Inference passes (eval, generation): params gathered per unit, no grads. */
void zt_shard_begin_inference(zt_shard_t *s);
void zt_shard_end_inference(zt_shard_t *s);

/* Memory accounting in bytes per rank (what is allocated now, and the peak). The
 * first five are the backend's memory (the device's, on a GPU); `host` is the
 * offloaded state in (pinned) host memory; `nvme` what is on disk instead (host then
 * counts the buffers it streams through). A frozen unit counts in params (or host,
 * under offload_param) only: grads and optim are those of the trainable units. */
typedef struct zt_shard_mem {
    size_t params, grads, optim, comm_buffers, gathered_peak;
    size_t host;
    size_t nvme;    /* offload_nvme: the scratch file's bytes (host then holds its buffers) */
} zt_shard_mem_t;
void zt_shard_memory(const zt_shard_t *s, zt_shard_mem_t *out);
/* An estimate of the same without memory is a dry run of this engine (zt_memplan.h): create
 * and one step against a counting backend. With such a backend (be->dry) create allocates
 * only (no initial values), and host-side arithmetic goes to it as well. */
/* offload_nvme: the files' traffic and waits so far (0 without the nvme tier) */
int zt_shard_nvme_stats(const zt_shard_t *s, zt_nvme_stats_t *st);

/* Checkpoint I/O view: what this rank owns of each parameter, as element ranges
 * of the parameter (row-major), with HOST pointers to its fp32 master value and Adam
 * moments (staged through host memory when the backend's memory is a device's). `write` lists are disjoint across the world
 * (replicated state is split between replicas so every element is written once);
 * `read` lists cover everything this rank must hold (replicas read the same).
 * Frozen parameters have no moments: exp_avg = exp_avg_sq = NULL. Their value is the
 * fp32 parameter itself, or, where the only copy is 16-bit, an fp32 host staging:
 * widened from the working copy for a write, rounded into it by io_done for a read. */
typedef struct zt_io_seg {
    int param;          /* index into the param table */
    size_t start, len;  /* element range of the parameter */
    float *value, *exp_avg, *exp_avg_sq;  /* host pointers, len elements each (moments
                                           * NULL for frozen parameters) */
} zt_io_seg_t;
typedef enum {
    ZT_IO_READ = 0,         /* every parameter, frozen ones included (checkpoint, HF load) */
    ZT_IO_WRITE = 1,        /* the trainable parameters with their optimizer state (a
                             * LoRA checkpoint: the adapters; the base is referred to) */
    ZT_IO_WRITE_ALL = 2     /* every parameter's value, the frozen base too (HF export);
                             * trainable ones still carry their moments */
} zt_io_mode_t;
int zt_shard_io_view(zt_shard_t *s, zt_io_mode_t mode, zt_io_seg_t **segs); /* returns count */
/* = zt_shard_io_view(s, for_write ? ZT_IO_WRITE : ZT_IO_READ, segs): without frozen
 * units both write modes list the same. */
int zt_shard_io_segments(zt_shard_t *s, int for_write, zt_io_seg_t **segs);
/* Ends an I/O view: copies what was loaded to where it lives (a device backend's
 * memory; a frozen 16-bit working copy, rounded) (loaded: 0 nothing, 1 values only
 * (weights-only load), 2 values and moments) and frees the host staging; frees the
 * array in every case. */
void zt_shard_io_done(zt_shard_t *s, zt_io_seg_t *segs, int n, int loaded);
/* Optimizer step count (Adam t) owned by the engine; set on resume. */
long zt_shard_adam_step(const zt_shard_t *s);
void zt_shard_set_adam_step(zt_shard_t *s, long t);
/* After the checkpoint reader filled the read segments: re-derive working copies
 * (a frozen unit's replicated copy is re-gathered from the owned parts). */
void zt_shard_after_load(zt_shard_t *s);

/* 1-bit Adam's error feedback for checkpoints: unit ui's parameter i (i-th trainable
 * tensor of the unit): worker error (padded size) and server error (this rank's chunk);
 * NULL with len 0 without 1-bit Adam or with one replica. */
float *zt_shard_onebit_error(zt_shard_t *s, int ui, int i, int server, size_t *len);
/* zeroes every error buffer (a resume that cannot restore them) */
void zt_shard_onebit_reset(zt_shard_t *s);

/* Parameter L2 norm over the world, for tests and logs. */
double zt_shard_param_sumsq(zt_shard_t *s);

#endif
