/* zt_memplan.h — memory estimates as dry runs of the code that allocates.
 *
 * An estimate is not a second description of what the engine and the model allocate: it
 * runs the same zt_shard_create, the engine's step protocol for one optimizer step, and
 * zt_model_create (with its KV cache) against a counting backend, as ggml-alloc measures a
 * graph before it allocates it. The counting backend hands out address space that is never
 * touched (PROT_NONE: a data access in a dry run faults instead of passing unnoticed) and does
 * nothing in its data operations; the counting itself is the engine's and the model's own
 * accounting, the counters a run reports as measured. The collectives go to a dry
 * communicator (zt_comm.h) with rank 0's groups of the planned mesh. What comes back: the
 * engine's per-category peaks (zt_shard_memory), the model's activation bytes
 * (zt_model_activation_bytes) and its KV cache's (zt_model_kv_bytes), for rank 0, whose
 * shards are the largest; and the step's traffic, the bytes the dry communicator accounted
 * (the model's tp and sp collectives issued by their sizes beside the engine's walk, since
 * the model's forward does not run dry: zt_memplan.c says why).
 *
 * The step walked is the one-stage schedule the train loop runs (zt_train.c's
 * train_forward / train_backward): per micro-step the root unit, the blocks with their
 * adapter units and the next block prefetched, the head's gradients, the blocks backward,
 * the root's gradients; then the reductions' completion and AdamW. DPO's reference engine
 * (full fine-tuning) runs its inference forward before each micro-step's policy pass.
 * Under a pipeline (sched) it is one pipeline rank's: its stages' engine walked through its
 * action list as run_pipeline runs it, and its slots' models of its stages' layers, so the
 * estimate is per pipeline rank and the train loop takes the largest. */
#ifndef ZT_MEMPLAN_H
#define ZT_MEMPLAN_H

#include <stddef.h>

#include "zt_backend.h"
#include "zt_comm.h"
#include "zt_params.h"
#include "zt_shard.h"
#include "zt_step.h"

typedef struct zt_memplan_req {
    const zt_param_table_t *table;     /* a rank's (tp-local) table, dims.sp_size set */
    const zt_param_table_t *ref_table; /* DPO's frozen reference copy (full fine-tuning), or NULL */
    zt_shard_opts_t opts;
    int data, tp, shard_n;             /* data-parallel ranks, tp ranks, shard group (hybrids) */
    int B, T, recompute, nmicro;       /* the model's rows and positions (T / sp), checkpointing,
                                        * micro-steps per optimizer step */
    int kv_nseq;                       /* generation's KV cache: sequences (0: none) */
    /* A pipeline rank (pp > 1; sched NULL: the one-stage step): the step's schedule, its
     * stages' first layers (zt_parallel_plan_t.stage_first), the rank, and the layers it
     * runs (L + 2 flags, zt_model_create_layers). The engine holds those layers' units
     * (zt_params_units_of_layers), the step walked is the rank's action list as the train
     * loop runs it, and the activations are those of one model per slot of the list
     * (zt_schedule_slots); the reference copy (ref_table) holds the same layers' units. A
     * list with DPO's reference (zt_schedule_add_reference) walks its forwards where the
     * list has them (FR: on the copy, or on the policy's engine without adapters), and its
     * messages count as the policy's. */
    const zt_schedule_t *sched;
    const int *stage_first;
    int pp_rank;
    const unsigned char *layers;
} zt_memplan_req_t;

typedef struct zt_memplan {
    zt_shard_mem_t mem;                /* the engine's peaks per category, over create and a step */
    zt_shard_mem_t ref;                /* the reference engine's (zero without one) */
    size_t activations;                /* the model's buffers (zt_model_activation_bytes; a
                                        * pipeline rank: of each of its slots' models) */
    size_t kv;                         /* the KV cache */
    size_t messages;                   /* a pipeline rank's message buffers: one residual stream (B, T, C
                                        * rows of this rank) per send and receive of its step (the
                                        * reference's too), all held until R */
    /* A step's traffic: the bytes the step's collectives and messages moved through the dry
     * communicator's accounting (the engine's, the model's tp and sp collectives, a pipeline
     * rank's sends and receives), as a run's step reports them measured. 1-bit Adam: traffic
     * is a compressed step's, traffic_warmup one of its warm-up (steps 1 .. freeze_step);
     * otherwise the two are the same step's. group_traffic: traffic by group (zt_group_id). */
    double traffic, traffic_warmup;
    double group_traffic[ZT_GRP_N];
} zt_memplan_t;

/* Runs the dry run q describes (nothing is computed or communicated; B = 0: no model). */
void zt_memplan_run(const zt_memplan_req_t *q, zt_memplan_t *out);
/* The model's part alone: zt_model_activation_bytes of zt_model_create(t, B, T, recompute). */
size_t zt_memplan_activations(const zt_param_table_t *t, int B, int T, int recompute);

/* The counting backend: allocations reserve address space only; data operations do nothing;
 * compute kernels are absent (NULL). */
const zt_backend_t *zt_memplan_backend(void);

#endif
