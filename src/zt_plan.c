/* zt_plan.c — the parallel plan, built and validated in one function (see zt_plan.h).
 *
 * Each rule below is the only copy of itself: the comm groups, the shard engine, the
 * tp split of the parameter table, the train loop and generation rely on the plan and
 * check nothing again. The messages name the keys a user changes. */
#include "zt_plan.h"

#include "zt_backend.h"
#include "zt_common.h"
#include "zt_config.h"

#include <stdint.h>
#include <stdio.h>

int zt_strategy_shards_params(zt_strategy_t s) { return s >= ZT_SHARD_GRAD_OP && s < ZT_STRATEGY_N; }
int zt_strategy_shards_grads(zt_strategy_t s) { return s >= ZT_ZERO2 && s < ZT_STRATEGY_N; }
int zt_strategy_shards_optim(zt_strategy_t s) { return s != ZT_DDP && s < ZT_STRATEGY_N; }
int zt_strategy_is_hybrid(zt_strategy_t s) { return s == ZT_HYBRID || s == ZT_HYBRID_ZERO2; }

const char *zt_strategy_name(zt_strategy_t s)
{
    static const char *n[] = {"ddp", "zero1", "zero2", "shard_grad_op", "zero3", "hybrid_shard", "hybrid_shard_zero2"};
    return (unsigned)s < ZT_STRATEGY_N ? n[s] : s == ZT_STRATEGY_AUTO ? "auto" : "?";
}

/* tensor parallelism splits heads, the MLP and the vocabulary; KV heads fewer than tp
 * are replicated, tp / NKV ranks sharing each */
int zt_plan_tp_splits(const zt_plan_shape_t *shape, int tp, char *err, size_t errlen)
{
    if (tp <= 1) return 0;
    const char *what = NULL;
    int v = 0;
    if (shape->n_head % tp) what = "the attention heads", v = shape->n_head;
    else if (shape->n_kv_head % tp && tp % shape->n_kv_head)
        what = "the key/value heads (or be a multiple of them)", v = shape->n_kv_head;
    else if (shape->intermediate % tp) what = "the intermediate (MLP) size", v = shape->intermediate;
    /* the vocabulary splits in blocks of ceil(V / tp) rows; every rank needs one */
    else if ((int64_t)(tp - 1) * ((shape->vocab + tp - 1) / tp) >= shape->vocab)
        what = "the vocabulary into non-empty blocks", v = shape->vocab;
    return what ? zt_err(err, errlen, "parallel.tensor_parallel_size (%d) must divide %s (%d)", tp, what, v) : 0;
}

static const char *offload_name(zt_offload_t o) { return zt_config_enum_name("parallel.offload_optimizer", (int)o); }

static zt_precision_t working_dtype(const zt_config_t *cfg)
{
    return cfg->train.bf16 ? ZT_PREC_BF16 : cfg->train.fp16 ? ZT_PREC_FP16 : ZT_PREC_FP32;
}

/* train.matmul_precision resolved: auto follows the training precision */
static int matmul_level(const zt_config_t *cfg)
{
    switch (cfg->train.matmul_precision) {
    case ZT_MATMUL_AUTO: return cfg->train.bf16 || cfg->train.fp16 ? ZT_MATMUL_MEDIUM : ZT_MATMUL_HIGHEST;
    default: return cfg->train.matmul_precision;
    }
}

/* The data-parallel axes of the strategy: the hybrids replicate over shard groups,
 * ddp replicates everything, the others shard over every replica (auto: as those). */
static void dp_axes(zt_parallel_plan_t *p)
{
    if (zt_strategy_is_hybrid(p->strategy)) p->dp_shard = p->shard_group / p->sp;
    else p->dp_shard = p->strategy == ZT_DDP ? 1 : p->dp;
    p->dp_replicate = p->dp / p->dp_shard;
}

/* The pipeline: its stages' layers (parallel.pp_layers_per_stage, or as even as possible,
 * the earlier stages one more), the schedule's rules, and what it does not run with yet */
static int pipeline(zt_parallel_plan_t *p, const zt_config_t *cfg, const zt_plan_shape_t *shape, char *err,
                    size_t errlen)
{
    const int pp = p->pp, v = cfg->parallel.pp_stages_per_rank, L = shape->n_layer, layers = L + 2;
    int A = cfg->train.gradient_accumulation_steps;
    const int n = cfg->parallel.n_pp_layers_per_stage;
    p->pp_schedule = cfg->parallel.pp_schedule;
    p->pp_v = pp > 1 ? v : 1;
    p->stages = pp * p->pp_v;
    p->micro = A;
    if (pp > 1 && p->pp_schedule == ZT_PP_INTERLEAVED_1F1B && v < 2)
        return zt_err(err, errlen, "parallel.pp_schedule = interleaved_1f1b needs parallel.pp_stages_per_rank >= 2 "
                      "(with one stage per rank it is 1f1b)");
    if (pp > 1 && p->pp_schedule != ZT_PP_INTERLEAVED_1F1B && v > 1)
        return zt_err(err, errlen, "parallel.pp_stages_per_rank (%d) > 1 needs parallel.pp_schedule = "
                      "interleaved_1f1b", v);
    if (p->stages > ZT_MAX_PP_STAGES)
        return zt_err(err, errlen, "parallel.pipeline_parallel_size (%d) x parallel.pp_stages_per_rank (%d): more "
                      "than %d stages", pp, p->pp_v, ZT_MAX_PP_STAGES);
    if (p->stages > layers)
        return zt_err(err, errlen, "parallel.pipeline_parallel_size (%d) x parallel.pp_stages_per_rank (%d) = %d "
                      "stages: more than the model's %d layers (%d blocks, the embedding and the head)", pp, p->pp_v,
                      p->stages, layers, L);
    if (pp > 1 && n > 0) {
        if (n != p->stages)
            return zt_err(err, errlen, "parallel.pp_layers_per_stage has %d entries; the pipeline has %d stages "
                          "(parallel.pipeline_parallel_size %d x parallel.pp_stages_per_rank %d)", n, p->stages, pp,
                          p->pp_v);
        long sum = 0;
        for (int i = 0; i < n; i++) sum += cfg->parallel.pp_layers_per_stage[i];
        if (sum != layers)
            return zt_err(err, errlen, "parallel.pp_layers_per_stage sums to %ld layers; the model has %d (%d "
                          "blocks, the embedding and the head)", sum, layers, L);
    }
    p->stage_first[0] = 0;
    for (int s = 0; s < p->stages; s++)
        p->stage_first[s + 1] = p->stage_first[s] + (pp > 1 && n > 0 ? cfg->parallel.pp_layers_per_stage[s]
                                                     : layers / p->stages + (s < layers % p->stages));
    if (pp == 1) return 0;
    /* --generate runs no step: only the stages matter (zt_train builds a schedule of pp micro-batches) */
    if (cfg->mode_generate) A = pp;
    if (p->pp_schedule == ZT_PP_1F1B && A < pp)
        return zt_err(err, errlen, "parallel.pp_schedule = 1f1b: train.gradient_accumulation_steps (%d) must be at "
                      "least parallel.pipeline_parallel_size (%d) (the pipeline's micro-batches are the accumulation "
                      "steps)", A, pp);
    if (p->pp_schedule == ZT_PP_INTERLEAVED_1F1B && A % pp)
        return zt_err(err, errlen, "parallel.pp_schedule = interleaved_1f1b: train.gradient_accumulation_steps (%d) "
                      "must be a multiple of parallel.pipeline_parallel_size (%d)", A, pp);
    return 0;
}

int zt_plan_build(zt_parallel_plan_t *p, const zt_config_t *cfg, const zt_plan_shape_t *shape, int world,
                  int per_node, char *err, size_t errlen)
{
    const int tp = cfg->parallel.tensor_parallel_size, sp = cfg->parallel.sequence_parallel_size;
    const int pp = cfg->parallel.pipeline_parallel_size;
    *p = (zt_parallel_plan_t){
        .world = world, .per_node = per_node, .pp = pp, .tp = tp, .sp = sp,
        .strategy = cfg->parallel.strategy, .layout = cfg->parallel.shard_layout, .sp_mode = cfg->parallel.sp_mode,
        .tp_sequence_parallel = cfg->parallel.tp_sequence_parallel && tp > 1,
        .offload_optimizer = cfg->parallel.offload_optimizer, .offload_param = cfg->parallel.offload_param,
        .nvme_path = cfg->parallel.offload_nvme_path, .nvme_buffer_count = cfg->parallel.offload_nvme_buffer_count,
        .nvme_queue_depth = cfg->parallel.offload_nvme_queue_depth,
        .nvme_block_size = (size_t)cfg->parallel.offload_nvme_block_size,
        .param_dtype = working_dtype(cfg), .reduce_dtype = cfg->parallel.reduce_dtype, .matmul = matmul_level(cfg),
        .optimizer = cfg->optim.type, .freeze_step = cfg->optim.freeze_step,
    };
    const int ring = p->sp_mode == ZT_SP_RING;

    /* the mesh */
    if (pp > 1 && (world < 1 || world % (pp * tp * sp) != 0))
        return zt_err(err, errlen, "parallel.pipeline_parallel_size (%d) x parallel.tensor_parallel_size (%d) x "
                      "parallel.sequence_parallel_size (%d) must divide the number of ranks (%d)", pp, tp, sp, world);
    if (tp < 1 || sp < 1 || world < 1 || world % (tp * sp) != 0)
        return zt_err(err, errlen, "parallel.tensor_parallel_size (%d) x parallel.sequence_parallel_size (%d) must "
                      "divide the number of ranks (%d)", tp, sp, world);
    p->dp = world / (pp * tp * sp);
    p->data = sp * p->dp;

    if (zt_plan_tp_splits(shape, tp, err, errlen)) return -1;

    /* sequence parallelism: every rank a whole chunk of each sequence (ring: two, for
     * causal balance), and under Ulysses a share of every kind of head of its tp rank */
    if (sp > 1) {
        if (cfg->data.seq_len % (ring ? 2 * sp : sp))
            return zt_err(err, errlen, "parallel.sequence_parallel_size (%d) must divide data.seq_len (%d)%s", sp,
                          cfg->data.seq_len, ring ? " into 2 sp chunks (ring attention's causal balance)" : "");
        const int nh = shape->n_head / tp, nkv = shape->n_kv_head < tp ? 1 : shape->n_kv_head / tp;
        if (!ring && (nh % sp || (nkv % sp && sp % nkv)))
            return zt_err(err, errlen, "parallel.sequence_parallel_size (%d) must divide the attention heads (%d) "
                          "and divide or be a multiple of the key/value heads (%d) of a tensor-parallel rank "
                          "(Ulysses splits heads)", sp, nh, nkv);
    }

    /* Megatron's sequence parallelism: every tp rank a whole share of a micro-batch's tokens */
    if (p->tp_sequence_parallel) {
        const long N = (long)zt_config_batch_rows(cfg) * (cfg->data.seq_len / sp);
        if (N % tp)
            return zt_err(err, errlen, "parallel.tp_sequence_parallel: the %ld tokens of a micro-batch (per rank) "
                          "must divide by parallel.tensor_parallel_size (%d)", N, tp);
    }
    /* generation pads a sequence to whole shares of the mesh, up to data.seq_len */
    p->gen_quantum = (sp > 1 && ring ? 2 * sp : sp) * (p->tp_sequence_parallel ? tp : 1);
    if (p->tp_sequence_parallel && (cfg->mode_generate || cfg->generate.at_eval) &&
        cfg->data.seq_len % p->gen_quantum)
        return zt_err(err, errlen, "generation with parallel.tp_sequence_parallel: data.seq_len (%d) must divide by "
                      "%d (tensor_parallel_size x the sequence parallel chunks)", cfg->data.seq_len, p->gen_quantum);

    /* shard groups: consecutive data ranks, by default those of one node */
    const int sg = cfg->parallel.shard_group_size > 0 ? cfg->parallel.shard_group_size
                   : per_node > 0 && per_node % tp == 0 && (per_node / tp) <= p->data && p->data % (per_node / tp) == 0
                       ? per_node / tp
                       : p->data;
    if (zt_strategy_is_hybrid(p->strategy)) {
        if (sg < 1 || sg > p->data || p->data % sg != 0)
            return zt_err(err, errlen, "parallel.shard_group_size (%d) must divide the number of data-parallel "
                          "ranks (%d = %d ranks / tensor_parallel_size %d)", sg, p->data, world, tp);
        /* dp_shard x sp: a shard group holds whole sequence-parallel groups */
        if (sg % sp)
            return zt_err(err, errlen, "parallel.shard_group_size (%d) must be a multiple of "
                          "parallel.sequence_parallel_size (%d)", sg, sp);
    }
    p->shard_group = sg;

    /* dtypes */
    if (p->reduce_dtype == ZT_PREC_FP16 && !cfg->train.fp16)
        return zt_err(err, errlen, "parallel.reduce_dtype = fp16 needs train.fp16 = true (fp16 gradients need "
                      "loss scaling against underflow and overflow)");

    /* offload: parameters stay on the host only where a rank owns a shard of them, and
     * the optimizer steps the master where that shard lives */
    if (p->offload_param != ZT_OFFLOAD_NONE && p->strategy != ZT_STRATEGY_AUTO &&
        !zt_strategy_shards_params(p->strategy))
        return zt_err(err, errlen, "parallel.offload_param = %s needs a strategy that shards parameters "
                      "(shard_grad_op, zero3, hybrid_shard, hybrid_shard_zero2, or auto), not %s",
                      offload_name(p->offload_param), zt_strategy_name(p->strategy));
    if (p->offload_param != ZT_OFFLOAD_NONE && p->offload_optimizer == ZT_OFFLOAD_NONE)
        return zt_err(err, errlen, "parallel.offload_param = %s needs parallel.offload_optimizer = \"%s\" too "
                      "(the optimizer steps the parameter shard where it lives)", offload_name(p->offload_param),
                      offload_name(p->offload_param));
    /* fp32: the master is the parameter shard, so both live in one tier */
    if (p->offload_param != ZT_OFFLOAD_NONE && p->offload_param != p->offload_optimizer)
        return zt_err(err, errlen, "parallel.offload_param = %s with parallel.offload_optimizer = %s: the fp32 "
                      "master is the parameter shard, so both must name the same tier (cpu or nvme)",
                      offload_name(p->offload_param), offload_name(p->offload_optimizer));
    if (p->offload_optimizer == ZT_OFFLOAD_NVME) {
        if (!p->nvme_path || !p->nvme_path[0])
            return zt_err(err, errlen, "parallel.offload_optimizer = nvme needs parallel.offload_nvme_path (a "
                          "directory on a local disk for the scratch files)");
        if (p->nvme_block_size % 4096)
            return zt_err(err, errlen, "parallel.offload_nvme_block_size (%zu) must be a multiple of 4096 "
                          "(O_DIRECT requests are whole blocks)", p->nvme_block_size);
    }
    /* 1-bit Adam: each rank steps the whole momentum with its own full gradient and keeps a
     * full-size worker error, so parameters stay replicated (ddp, zero1, zero2); tp and sp
     * ranks hold parts of one replica's gradient, not replicas */
    if (p->optimizer == ZT_OPTIM_ONEBIT_ADAM) {
        if (p->strategy != ZT_DDP && p->strategy != ZT_ZERO1 && p->strategy != ZT_ZERO2)
            return zt_err(err, errlen, "optim.type = onebit_adam runs with parallel.strategy = ddp, zero1 or zero2, "
                          "not %s (every rank steps the whole momentum with its own full gradient: a strategy that "
                          "shards parameters or has replica groups is refused; see doc/user-guide.md, 1-bit Adam)",
                          p->strategy == ZT_STRATEGY_AUTO ? "auto" : zt_strategy_name(p->strategy));
        if (tp > 1 || sp > 1)
            return zt_err(err, errlen, "optim.type = onebit_adam needs parallel.tensor_parallel_size = 1 and "
                          "parallel.sequence_parallel_size = 1 (tp and sp ranks hold parts of one gradient, "
                          "not data-parallel replicas of it)");
        if (p->offload_optimizer != ZT_OFFLOAD_NONE)
            return zt_err(err, errlen, "optim.type = onebit_adam does not run with parallel.offload_optimizer = %s",
                          offload_name(p->offload_optimizer));
    }
    dp_axes(p);
    return pipeline(p, cfg, shape, err, errlen);
}

void zt_plan_resolve(zt_parallel_plan_t *p, zt_strategy_t st)
{
    p->strategy = st;
    dp_axes(p);
}

int zt_plan_rank_holds_layer(const zt_parallel_plan_t *p, int pp_rank, int layer)
{
    for (int st = pp_rank; st < p->stages; st += p->pp)
        if (layer >= p->stage_first[st] && layer < p->stage_first[st + 1]) return 1;
    return 0;
}
