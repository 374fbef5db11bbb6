/* zt_plan.h — the parallel plan: the mesh and how training state is spread over it.
 *
 * The configuration's parallel.* keys arrive typed (zt_config.h holds these enums in
 * its fields); zt_plan_build turns them, with the world and the model's shape, into
 * one validated plan. Every rule of the mesh (what must divide what, which options go
 * together) lives in that one function, each refused with a line naming its keys; the
 * comm groups, the shard engine and the train loop read the plan's fields and check
 * nothing again.
 *
 * The mesh, outermost first: pp x dp_replicate x dp_shard x sp x tp = world. tp is
 * innermost (consecutive ranks, inside a node), the strategies span the sp x dp ranks
 * of one tp position of one pipeline rank. The pipeline's stages are contiguous ranges of
 * the model's layers, the embedding and the head counted as a layer each (torchtitan's
 * rule): layer 0 the embedding, 1 .. L the blocks, L + 1 the head; stage s runs on
 * pipeline rank s mod pp (zt_step.h). */
#ifndef ZT_PLAN_H
#define ZT_PLAN_H

#include <stddef.h>

/* parallel.strategy, aliases resolved (zero0 = no_shard = ddp, full_shard = zero3).
 * The engine runs the first ZT_STRATEGY_N; auto is resolved to one of them. */
typedef enum {
    ZT_DDP = 0, ZT_ZERO1, ZT_ZERO2, ZT_SHARD_GRAD_OP, ZT_ZERO3, ZT_HYBRID, ZT_HYBRID_ZERO2,
    ZT_STRATEGY_N, ZT_STRATEGY_AUTO = ZT_STRATEGY_N + 1
} zt_strategy_t;
typedef enum { ZT_LAYOUT_FLAT = 0, ZT_LAYOUT_PER_PARAM = 1 } zt_layout_t;     /* parallel.shard_layout */
typedef enum { ZT_SP_ULYSSES = 0, ZT_SP_RING = 1 } zt_sp_mode_t;              /* parallel.sp_mode */
/* parallel.offload_*: where the state lives (nvme: files under parallel.offload_nvme_path,
 * streamed through host buffers, zt_nvme.h) */
typedef enum { ZT_OFFLOAD_NONE = 0, ZT_OFFLOAD_CPU = 1, ZT_OFFLOAD_NVME = 2 } zt_offload_t;
typedef enum { ZT_PREC_FP32 = 0, ZT_PREC_BF16 = 1, ZT_PREC_FP16 = 2 } zt_precision_t;
typedef enum { ZT_OPTIM_ADAMW = 0, ZT_OPTIM_ONEBIT_ADAM = 1 } zt_optimizer_t;  /* optim.type */
#define ZT_MAX_PP_STAGES 256 /* pipeline stages at most (parallel.pp_layers_per_stage's entries) */
/* parallel.pp_schedule (zt_step.h) */
typedef enum { ZT_PP_GPIPE = 0, ZT_PP_1F1B = 1, ZT_PP_INTERLEAVED_1F1B = 2 } zt_pp_schedule_t;

/* Parameters, gradients, optimizer state sharded between steps? (ZT_STRATEGY_AUTO: no) */
int zt_strategy_shards_params(zt_strategy_t s);
int zt_strategy_shards_grads(zt_strategy_t s);
int zt_strategy_shards_optim(zt_strategy_t s);
int zt_strategy_is_hybrid(zt_strategy_t s);
/* The canonical name ("zero3" for full_shard too). */
const char *zt_strategy_name(zt_strategy_t s);

/* What the mesh must divide: the model's (global) shape. */
typedef struct zt_plan_shape {
    int n_layer, n_head, n_kv_head, intermediate, vocab;
} zt_plan_shape_t;

typedef struct zt_parallel_plan {
    int world, per_node;        /* ranks, ranks of one node */
    int pp, dp_replicate, dp_shard, sp, tp; /* the mesh; their product is world */
    int dp;                     /* dp_replicate x dp_shard: the replicas of a sequence */
    int data;                   /* sp x dp: the ranks a strategy spans (one tp position) */
    int shard_group;            /* hybrids: data ranks per shard group (sp x dp_shard) */
    zt_strategy_t strategy;     /* may be ZT_STRATEGY_AUTO until zt_train resolves it */
    zt_layout_t layout;
    zt_sp_mode_t sp_mode;
    int tp_sequence_parallel;   /* bool, and only with tp > 1 */
    zt_offload_t offload_optimizer, offload_param;
    /* offload = nvme: the directory under which each rank keeps its scratch files, and the
     * I/O settings (parallel.offload_nvme_*; DeepSpeed's buffer_count, aio block_size and
     * queue_depth) */
    const char *nvme_path;
    int nvme_buffer_count, nvme_queue_depth;
    size_t nvme_block_size;
    zt_precision_t param_dtype; /* working copies: train.bf16 / train.fp16, else fp32 */
    zt_precision_t reduce_dtype; /* gradients communicated and reduced */
    int matmul;                 /* ZT_MATMUL_* (zt_backend.h): train.matmul_precision resolved */
    int gen_quantum;            /* generation pads a sequence to a multiple of this */
    zt_optimizer_t optimizer;   /* AdamW, or 1-bit Adam (its momentum exchange spans the dp ranks) */
    long freeze_step;           /* 1-bit Adam: steps of plain Adam before the compressed stage */
    /* the pipeline (pp > 1; at pp 1 one stage of every layer) */
    zt_pp_schedule_t pp_schedule;
    int pp_v;                   /* stages per pipeline rank (interleaved_1f1b), else 1 */
    int stages;                 /* pp x pp_v */
    int micro;                  /* the pipeline's micro-batches: the gradient-accumulation steps */
    int stage_first[ZT_MAX_PP_STAGES + 1]; /* stage s runs layers [stage_first[s], stage_first[s + 1]) of
                                            * 0 .. L + 1 (stage_first[stages] = L + 2) */
} zt_parallel_plan_t;

struct zt_config;

/* Builds the plan of `cfg` on `world` ranks, `per_node` of them a node, for a model of
 * `shape`: the mesh from parallel.tensor_parallel_size, sequence_parallel_size and
 * shard_group_size, every divisibility and compatibility rule checked. Returns 0, or
 * -1 with one line naming the key(s) in err. Pure: the same on every rank. */
int zt_plan_build(zt_parallel_plan_t *p, const struct zt_config *cfg, const zt_plan_shape_t *shape, int world,
                  int per_node, char *err, size_t errlen);

/* zt_plan_build's tp rule alone, for the tp split of a parameter table (zt_params.h):
 * 0, or -1 with the line naming what tp must divide. */
int zt_plan_tp_splits(const zt_plan_shape_t *shape, int tp, char *err, size_t errlen);

/* parallel.strategy = auto, resolved by the train loop (from memory estimates) to one of
 * the engine's strategies ddp .. zero3: the plan takes it and its data-parallel axes. */
void zt_plan_resolve(zt_parallel_plan_t *p, zt_strategy_t st);

/* Whether pipeline rank `pp_rank` runs layer `layer` (0 the embedding, 1 .. L the blocks,
 * L + 1 the head): one of its stages (s with s mod pp = pp_rank) holds it. At pp 1 every
 * layer is rank 0's. */
int zt_plan_rank_holds_layer(const zt_parallel_plan_t *p, int pp_rank, int layer);

#endif
