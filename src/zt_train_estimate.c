/* zt_train_estimate.c — a run's memory and traffic before anything large is allocated:
 * the engine's options from the plan (a pipeline rank's stages' units), a rank's estimate
 * as a dry run of the code that allocates (zt_memplan.h), --estimate-memory's tables,
 * parallel.strategy = auto (the strategy, and the mesh where none fits at tp 1 x sp 1) and
 * the start-up check that refuses a run that would not fit. Apart from the loop because
 * --estimate-memory and zt_run.c's auto search call it with no run, no model and no
 * engine: arithmetic on a configuration and a parameter table. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zt_arch.h"
#include "zt_common.h"
#include "zt_log.h"
#include "zt_memplan.h"
#include "zt_pref.h"
#include "zt_qlora.h"
#include "zt_train_internal.h"

#ifdef ZT_HAVE_CUDA
#include "zt_cuda.h"
#endif

static void tp_seq_setup(zt_param_table_t *t);

/* ---- strategy resolution ------------------------------------------------------- */

/* the engine's options: the plan's, with strategy st */
void zt_tr_fill_opts(const zt_config_t *cfg, const zt_parallel_plan_t *p, zt_strategy_t st, zt_shard_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->strategy = st;
    o->layout = p->layout;
    o->reshard_after_forward = cfg->parallel.reshard_after_forward;
    o->bucket_bytes = (size_t)(cfg->parallel.bucket_size_mb * 1024.0 * 1024.0);
    o->param_dtype = p->param_dtype;
    o->reduce_dtype = p->reduce_dtype;
    o->offload_optim = p->offload_optimizer != ZT_OFFLOAD_NONE;
    o->offload_param = p->offload_param != ZT_OFFLOAD_NONE;
    o->offload_nvme = p->offload_optimizer == ZT_OFFLOAD_NVME;
    o->nvme = (zt_nvme_opts_t){.path = p->nvme_path, .buffer_count = p->nvme_buffer_count,
                               .block_size = p->nvme_block_size, .queue_depth = p->nvme_queue_depth};
    o->seed = (uint64_t)cfg->train.seed;
    o->optimizer = p->optimizer;
    o->freeze_step = p->freeze_step;
}

/* pp > 1: the layers pipeline rank pp_rank runs (L + 2 flags, zt_model_create_layers), a
 * malloc'd mask; NULL at pp 1 (every layer) */
unsigned char *zt_tr_stage_layers(const zt_parallel_plan_t *p, int L, int pp_rank)
{
    if (p->pp == 1) return NULL;
    unsigned char *layers = zt_malloc((size_t)L + 2);
    for (int l = 0; l < L + 2; l++) layers[l] = (unsigned char)zt_plan_rank_holds_layer(p, pp_rank, l);
    return layers;
}

/* The engine's options for pipeline rank pp_rank's share of table t: its stages' units,
 * the root shared by the first and the last stage */
void zt_tr_stage_opts(zt_shard_opts_t *o, const zt_parallel_plan_t *p, const zt_param_table_t *t,
                       unsigned char *held)
{
    o->held = held;
    o->pipeline = p->pp > 1;
    /* a tied head is the embedding: the root on both ends (an untied one has its own unit) */
    o->root_shared = p->pp > 1 && held[t->root_unit] && zt_params_head_unit(t) == t->root_unit;
}

/* What the plan's mesh must divide, from the global table */
zt_plan_shape_t zt_tr_shape_of(const zt_param_table_t *g)
{
    return (zt_plan_shape_t){g->dims.L, g->dims.NH, g->dims.NKV, g->dims.I, g->dims.V};
}

size_t zt_tr_mem_total(const zt_shard_mem_t *m)
{
    return m->params + m->grads + m->optim + m->comm_buffers + m->gathered_peak;
}


/* A rank's table as the mesh runs it: its sequence share, ring attention, Megatron's
 * sequence parallelism inside tp (what the model and the engine allocate by) */
void zt_tr_mesh_local(zt_param_table_t *t, const zt_parallel_plan_t *p)
{
    t->dims.sp_size = p->sp;
    t->dims.sp_ring = p->sp_mode == ZT_SP_RING;
    if (p->tp_sequence_parallel) tp_seq_setup(t);
}

/* 1-bit Adam runs under ddp, zero1 and zero2 (the engine refuses the rest): nothing else to plan */
static int plannable(const zt_parallel_plan_t *p, zt_strategy_t st)
{
    return p->optimizer != ZT_OPTIM_ONEBIT_ADAM || st == ZT_DDP || st == ZT_ZERO1 || st == ZT_ZERO2;
}


/* DPO with full fine-tuning or pref.ref_model: a frozen reference copy (ref_create) */
int zt_tr_has_ref_copy(const zt_config_t *cfg)
{
    return !cfg->mode_generate && cfg->train.stage == ZT_STAGE_DPO && zt_pref_uses_ref(cfg->pref.fn.loss) &&
           (cfg->train.finetuning_type == ZT_FT_FULL || cfg->pref.ref_model[0]);
}

/* The reference's table on tp rank `rank`: the base model's (without LoRA's adapter units),
 * every parameter frozen */
zt_param_table_t *zt_tr_ref_table_of(const zt_param_table_t *g, int tp, int rank, char *err, size_t errlen)
{
    zt_param_table_t *t = zt_params_tp_local(g, tp, rank, err, errlen);
    if (!t) return NULL;
    for (int i = 0; i < t->nparams; i++) t->params[i].frozen = 1;
    if (t->first_adapter_unit >= 0) { /* the adapter units come last: the base's units alone */
        const int nu = t->first_adapter_unit;
        while (t->nparams > 0 && t->params[t->nparams - 1].unit >= nu) t->nparams--;
        t->lora_rank = 0;
        zt_params_finish(t, nu, t->root_unit, t->first_block_unit);
    } else {
        zt_params_finish(t, t->nunits, t->root_unit, t->first_block_unit);
    }
    return t;
}


/* A rank's memory: a dry run of the engine, the reference's engine and the model that the
 * run would create (zt_memplan.h), never a second description of them. g: the global table;
 * t: a rank's (tp-local) share of it; world: the data-parallel ranks the strategy spans;
 * pp_rank: the rank's place on the pipeline (its stages' units, its list's slots) */
void zt_tr_estimate_rank(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *g,
                          const zt_param_table_t *t, zt_strategy_t st, int world, int shard_n, int pp_rank,
                          estimate_t *e)
{
    zt_memplan_req_t q = {.table = t, .data = world, .tp = p->tp, .shard_n = shard_n,
                          .B = zt_config_batch_rows(cfg), .T = cfg->data.seq_len / p->sp, /* sp: T / sp a rank */
                          .recompute = cfg->train.gradient_checkpointing,
                          .nmicro = cfg->train.gradient_accumulation_steps};
    zt_tr_fill_opts(cfg, p, st, &q.opts);
    char err[ZT_ERRLEN];
    zt_param_table_t *ref = zt_tr_has_ref_copy(cfg) ? zt_tr_ref_table_of(g, p->tp, 0, err, sizeof err) : NULL;
    q.ref_table = ref;
    /* generation's KV cache where the run generates (--generate, generate.at_eval) */
    if (cfg->mode_generate || cfg->generate.at_eval)
        q.kv_nseq = zt_tr_kv_sequences(cfg, t->dims.sp_size, t->dims.tp_seq,
                                 zt_tr_gen_batch_of(cfg->generate.batch_size, cfg->data.seq_len));
    zt_schedule_t sc = {0};
    unsigned char *layers = NULL;
    if (p->pp > 1 && zt_tr_build_steps(cfg, p, p->micro, &sc, err, sizeof err) == 0) {
        layers = zt_tr_stage_layers(p, t->dims.L, pp_rank);
        q.sched = &sc, q.stage_first = p->stage_first, q.pp_rank = pp_rank, q.layers = layers;
    }
    zt_memplan_t m;
    zt_memplan_run(&q, &m);
    zt_schedule_free(&sc);
    free(layers);
    /* what the dry step's collectives and messages moved (zt_memplan.h) */
    e->traffic = m.traffic;
    e->traffic_warmup = m.traffic_warmup;
    memcpy(e->group_traffic, m.group_traffic, sizeof e->group_traffic);
    zt_param_table_free(ref);
    e->mem = m.mem;
    e->mem.comm_buffers += m.messages; /* a pipeline rank's message buffers are buffers too (rank_memory) */
    e->ref = m.ref;
    e->activations = m.activations;
    e->kv = m.kv;
    e->total = zt_tr_mem_total(&e->mem) + zt_tr_mem_total(&e->ref) + e->activations;
}

/* The rank that needs the most: under a pipeline the largest of its ranks' (stages')
 * figures decides whether a run fits; the traffic is the busiest pipeline rank's (the one
 * whose step waits longest on its transfers) */
void zt_tr_estimate(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *g,
                     const zt_param_table_t *t, zt_strategy_t st, int world, int shard_n, estimate_t *e)
{
    zt_tr_estimate_rank(cfg, p, g, t, st, world, shard_n, 0, e);
    estimate_t busiest = *e;
    for (int r = 1; r < p->pp; r++) {
        estimate_t x;
        zt_tr_estimate_rank(cfg, p, g, t, st, world, shard_n, r, &x);
        if (x.traffic > busiest.traffic) busiest = x;
        if (x.total > e->total) *e = x;
    }
    e->traffic = busiest.traffic;
    e->traffic_warmup = busiest.traffic_warmup;
    memcpy(e->group_traffic, busiest.group_traffic, sizeof e->group_traffic);
}

static double host_memory_per_rank(int per_node)
{
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
    return phys / (per_node > 0 ? per_node : 1);
}

/* The memory a rank may fill: parallel.memory_limit_gb, else the free memory of its
 * device (be not host memory) less a reserve, else the node's physical memory over its ranks. `what`
 * says which, for messages. be may be NULL (--estimate-memory: no device chosen). */
static double memory_limit(const zt_config_t *cfg, const zt_backend_t *be, int per_node, char *what,
                           size_t len)
{
    if (cfg->parallel.memory_limit_gb > 0) {
        snprintf(what, len, "parallel.memory_limit_gb");
        return cfg->parallel.memory_limit_gb * 1073741824.0;
    }
#ifdef ZT_HAVE_CUDA
    size_t total = 0, avail = 0;
    char name[128], cerr[ZT_ERRLEN];
    if (be && !be->host_memory && zt_cuda_device_info(name, sizeof name, &total, &avail, cerr, sizeof cerr) == 0) {
        /* what the estimate does not count: NCCL's buffers, made at each communicator's
         * first collectives (up to hundreds of MiB with many channels), the cuBLASLt
         * workspace and reduction scratch, and the memory pool's fragmentation */
        const double reserve = ZT_MIN(0.05 * (double)total, 2.0 * 1073741824.0);
        char rb[32];
        snprintf(what, len, "free memory of this rank's %.80s less %s kept for NCCL and cuBLASLt", name,
                 zt_fmt_bytes(reserve, rb, sizeof rb));
        return ZT_MAX((double)avail - reserve, 0.0);
    }
#else
    (void)be;
#endif
    snprintf(what, len, "physical memory / %d ranks on this node", per_node > 0 ? per_node : 1);
    return host_memory_per_rank(per_node);
}

/* --estimate-memory: what each offload tier moves off the backend's memory, into host
 * memory and onto disk, for the configured strategy (zero3 under auto) */
static void offload_tiers(const zt_config_t *cfg, const zt_parallel_plan_t *plan, const zt_param_table_t *g,
                          const zt_param_table_t *t, int world, int shard_n)
{
    const zt_strategy_t st = plan->strategy == ZT_STRATEGY_AUTO ? ZT_ZERO3 : plan->strategy;
    static const struct { const char *name; zt_offload_t optim, param; } tiers[] = {
        {"none", ZT_OFFLOAD_NONE, ZT_OFFLOAD_NONE}, {"optimizer cpu", ZT_OFFLOAD_CPU, ZT_OFFLOAD_NONE},
        {"optimizer nvme", ZT_OFFLOAD_NVME, ZT_OFFLOAD_NONE}, {"+ param cpu", ZT_OFFLOAD_CPU, ZT_OFFLOAD_CPU},
        {"+ param nvme", ZT_OFFLOAD_NVME, ZT_OFFLOAD_NVME},
    };
    char b[4][32];
    zt_log("offload tiers (%s): backend memory, host memory and disk per rank (nvme: %d buffers)",
           zt_strategy_name(st), plan->nvme_buffer_count);
    zt_log("%-20s %12s %12s %12s", "offload", "backend", "host", "disk");
    for (size_t i = 0; i < sizeof tiers / sizeof *tiers; i++) {
        if (tiers[i].param != ZT_OFFLOAD_NONE && !zt_strategy_shards_params(st)) continue;
        zt_parallel_plan_t p = *plan;
        p.offload_optimizer = tiers[i].optim;
        p.offload_param = tiers[i].param;
        estimate_t e;
        zt_tr_estimate(cfg, &p, g, t, st, world, shard_n, &e);
        zt_log("%-20s %12s %12s %12s", tiers[i].name, zt_fmt_bytes(e.total, b[0], 32),
               zt_fmt_bytes(e.mem.host, b[1], 32), zt_fmt_bytes(e.mem.nvme, b[2], 32));
    }
}

/* The layers pipeline rank r runs, as "0-3" ranges of 0 .. L + 1 (0 the embedding, L + 1
 * the head) */
static void rank_layers(const zt_parallel_plan_t *p, int r, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int st = r; st < p->stages && at + 1 < len; st += p->pp) {
        const int w = snprintf(buf + at, len - at, "%s%d-%d", at ? "," : "", p->stage_first[st],
                               p->stage_first[st + 1] - 1);
        at = ZT_MIN(at + (size_t)(w > 0 ? w : 0), len - 1);
    }
}

/* --estimate-memory under a pipeline: the configured strategy's figures on each pipeline
 * rank (its stages' state and its schedule's activation slots); the largest decides */
static void stage_table(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *g,
                        const zt_param_table_t *t, int world, int shard_n)
{
    const zt_strategy_t st = p->strategy == ZT_STRATEGY_AUTO ? ZT_ZERO3 : p->strategy;
    char b[6][32], lay[64];
    zt_log("pipeline ranks (%s, %s, %d micro-batches): memory per rank, layers 0 = embedding .. %d = head",
           zt_strategy_name(st), zt_config_enum_name("parallel.pp_schedule", p->pp_schedule), p->micro,
           t->dims.L + 1);
    zt_log("%-8s %-12s %12s %12s %12s %12s %12s %12s", "pp rank", "layers", "params", "grads", "optimizer", "buffers",
           "activations", "total");
    for (int r = 0; r < p->pp; r++) {
        estimate_t e;
        zt_tr_estimate_rank(cfg, p, g, t, st, world, shard_n, r, &e);
        rank_layers(p, r, lay, sizeof lay);
        /* DPO's frozen copy (its stages' share) in params and buffers, as the strategies' rows */
        zt_log("%-8d %-12s %12s %12s %12s %12s %12s %12s (%zu bytes)", r, lay,
               zt_fmt_bytes(e.mem.params + e.ref.params, b[0], 32), zt_fmt_bytes(e.mem.grads, b[1], 32),
               zt_fmt_bytes(e.mem.optim, b[2], 32),
               zt_fmt_bytes(e.mem.comm_buffers + e.mem.gathered_peak + e.ref.comm_buffers + e.ref.gathered_peak,
                            b[3], 32),
               zt_fmt_bytes(e.activations, b[4], 32), zt_fmt_bytes(e.total, b[5], 32), e.total);
    }
}

static void estimate_memory(const zt_config_t *cfg, int world, int per_node)
{
    char err[ZT_ERRLEN];
    zt_param_table_t *g = zt_arch_table_from_config(cfg, err, sizeof err), *t = NULL;
    zt_parallel_plan_t p;
    const int tp = cfg->parallel.tensor_parallel_size;
    const zt_plan_shape_t sh = g ? zt_tr_shape_of(g) : (zt_plan_shape_t){0};
    if (g && zt_plan_build(&p, cfg, &sh, world, per_node, err, sizeof err) == 0) {
        if (p.pp > 1) zt_params_split_head(g); /* as the run splits it */
        t = zt_params_tp_local(g, tp, 0, err, sizeof err);
    }
    if (t) zt_tr_mesh_local(t, &p);
    if (!t) {
        zt_log_error("%s", err);
        zt_param_table_free(g);
        return;
    }
    /* the strategies span the data-parallel ranks: world / (pp tp), per_node / tp of them a node */
    const size_t total = g->total_numel;
    world /= tp * p.pp;
    per_node = ZT_MAX(per_node / tp, 1);
    int shard_n = cfg->parallel.shard_group_size > 0 ? cfg->parallel.shard_group_size : per_node;
    char b[7][32];
    zt_log("memory estimate per rank: %zu parameters, %d ranks (%d per node), tp %d, sp %d, pp %d, B=%d T=%d, %s layout",
           total, world * tp * p.pp, per_node * tp, tp, p.sp, p.pp, zt_config_batch_rows(cfg),
           cfg->data.seq_len, zt_config_enum_name("parallel.shard_layout", p.layout));
    if (p.pp > 1)
        zt_log("(pp %d, %s: each strategy's row is the pipeline rank that needs the most; per rank below)", p.pp,
               zt_config_enum_name("parallel.pp_schedule", p.pp_schedule));
    if (zt_qlora_count(t)) {
        char q[256];
        zt_qlora_describe(t, q, sizeof q);
        zt_log("qlora: %s; the 4-bit bytes and their scales are in params (and in buffers where gathered)", q);
    }
    zt_log("%-20s %12s %12s %12s %12s %12s %12s %12s", "strategy", "params", "grads", "optimizer",
           "buffers", "activations", "total", "host");
    for (int st = 0; st < ZT_STRATEGY_N; st++) {
        if ((zt_strategy_is_hybrid(st) && (shard_n <= 0 || world % shard_n)) || !plannable(&p, st)) continue;
        estimate_t e;
        zt_tr_estimate(cfg, &p, g, t, st, world, shard_n, &e);
        zt_log("%-20s %12s %12s %12s %12s %12s %12s %12s", zt_strategy_name(st),
               zt_fmt_bytes(e.mem.params + e.ref.params, b[0], 32), zt_fmt_bytes(e.mem.grads, b[1], 32),
               zt_fmt_bytes(e.mem.optim, b[2], 32),
               zt_fmt_bytes(e.mem.comm_buffers + e.mem.gathered_peak + e.ref.comm_buffers + e.ref.gathered_peak,
                            b[3], 32),
               zt_fmt_bytes(e.activations, b[4], 32), zt_fmt_bytes(e.total, b[5], 32),
               zt_fmt_bytes(e.mem.host + e.ref.host, b[6], 32));
    }
    if (zt_tr_has_ref_copy(cfg))
        zt_log("(train.stage = dpo: params, buffers and host include the frozen reference copy's)");
    if (p.pp > 1) stage_table(cfg, &p, g, t, world, shard_n);
    offload_tiers(cfg, &p, g, t, world, shard_n);
    if (!zt_config_given(cfg, "train.bf16") && !zt_config_given(cfg, "train.fp16"))
        zt_log("(fp32 as given; on the cuda backend a run without train.bf16 / train.fp16 trains in bf16: "
               "add train.bf16=true for those figures)");
    zt_param_table_free(t);
    zt_param_table_free(g);
}

void zt_train_estimate_memory(const zt_config_t *cfg, int world, int per_node)
{
    /* parallel.strategy = auto: the figures of the mesh a run on these ranks would take */
    zt_config_t *c = zt_malloc(sizeof *c);
    *c = *cfg;
    char why[1024] = "";
    const int am = zt_train_auto_mesh(c, world, per_node, why, sizeof why);
    if (am)
        zt_log("parallel auto on %d ranks (%d a node)%s: %s", world, per_node, am < 0 ? ", a run is refused" : "", why);
    estimate_memory(c, world, per_node);
    free(c);
}

int zt_train_plan(const zt_config_t *cfg, int world, int per_node, zt_parallel_plan_t *plan, char *err,
                  size_t errlen)
{
    zt_param_table_t *g = zt_arch_table_from_config(cfg, err, errlen);
    if (!g) return -1;
    const zt_plan_shape_t sh = zt_tr_shape_of(g);
    zt_param_table_free(g);
    return zt_plan_build(plan, cfg, &sh, world, per_node, err, errlen);
}

/* The best mesh of the auto search so far (tp 0: none yet) */
typedef struct mesh_pick {
    int pp, tp, sp;
    zt_strategy_t st;
    double traffic, total;
} mesh_pick_t;

/* The auto search at pipeline size c->parallel.pipeline_parallel_size: tp within a node, sp
 * over what is left, each mesh one the plan accepts; the strategy and mesh that fit `limit`
 * with the least traffic go to *best. g: the global table (its head split under a pipeline,
 * as the run splits it). Returns 1 where tp 1 x sp 1 fits at pp 1 (nothing to choose: the
 * strategy choice as always), else 0. *refused gets the plan's line for a pipeline size
 * refused whatever the tp and sp (a schedule's rule), else stays as it is. */
static int search_pp(zt_config_t *c, const zt_param_table_t *g, const zt_plan_shape_t *sh, int world, int per_node,
                     double limit, mesh_pick_t *best, char *refused, size_t rlen)
{
    static const zt_strategy_t order[] = {ZT_DDP, ZT_ZERO1, ZT_ZERO2, ZT_SHARD_GRAD_OP, ZT_ZERO3};
    const int pp = c->parallel.pipeline_parallel_size;
    char err[ZT_ERRLEN];
    int planned = 0;
    err[0] = '\0';
    /* tp 1 x sp 1 first (a tp that would cut a 4-bit base's blocks has no table) */
    for (int tp = 1; tp <= per_node && tp * pp <= world; tp++) {
        if (per_node % tp || world % (tp * pp)) continue;
        zt_param_table_t *t = zt_params_tp_local(g, tp, 0, err, sizeof err);
        if (!t) continue;
        for (int sp = 1; sp <= world / (tp * pp); sp++) {
            /* a candidate mesh is one the plan accepts */
            zt_parallel_plan_t p;
            c->parallel.tensor_parallel_size = tp, c->parallel.sequence_parallel_size = sp;
            if (zt_plan_build(&p, c, sh, world, per_node, err, sizeof err) != 0) continue;
            planned = 1;
            zt_tr_mesh_local(t, &p);
            for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
                if (!plannable(&p, order[i])) continue;
                estimate_t e;
                zt_plan_resolve(&p, order[i]);
                zt_tr_estimate(c, &p, g, t, order[i], world / (tp * pp), ZT_MAX(per_node / tp, 1), &e);
                if ((double)e.total > limit) continue;
                if (pp == 1 && tp == 1 && sp == 1) {
                    zt_param_table_free(t);
                    return 1;
                }
                /* the dry step's count: data, tp, sp and pp groups alike */
                if (!best->tp || e.traffic < best->traffic)
                    *best = (mesh_pick_t){pp, tp, sp, order[i], e.traffic, (double)e.total};
            }
        }
        zt_param_table_free(t);
    }
    if (!planned && pp > 1 && err[0]) snprintf(refused, rlen, "%s", err);
    return 0;
}

int zt_train_auto_mesh(zt_config_t *cfg, int world, int per_node, char *why, size_t len)
{
    if (cfg->parallel.strategy != ZT_STRATEGY_AUTO || zt_config_given(cfg, "parallel.tensor_parallel_size") ||
        zt_config_given(cfg, "parallel.sequence_parallel_size") ||
        zt_config_given(cfg, "parallel.pipeline_parallel_size"))
        return 0;
    char err[ZT_ERRLEN], what[160], b1[32], b2[32], b3[32];
    zt_param_table_t *g = zt_arch_table_from_config(cfg, err, sizeof err);
    if (!g) return 0;
    const zt_plan_shape_t sh = zt_tr_shape_of(g);
    const double limit = memory_limit(cfg, NULL, per_node, what, sizeof what);
    zt_config_t c = *cfg;
    mesh_pick_t best = {0};
    char refused[ZT_ERRLEN] = "";
    /* pp 1: the meshes within a node; it fits as it is where tp 1 x sp 1 does */
    c.parallel.pipeline_parallel_size = 1;
    if (search_pp(&c, g, &sh, world, per_node, limit, &best, refused, sizeof refused)) {
        zt_param_table_free(g);
        return 0;
    }
    if (best.tp) {
        zt_param_table_free(g);
        snprintf(why, len, "no strategy fits the limit of %s (%s) at tp 1 x sp 1; tp %d x sp %d with %s fits (%s per "
                 "rank) and moves the least of the meshes that fit (%s a step)", zt_fmt_bytes(limit, b1, 32), what,
                 best.tp, best.sp, zt_strategy_name(best.st), zt_fmt_bytes(best.total, b2, 32),
                 zt_fmt_bytes(best.traffic, b3, 32));
        cfg->parallel.tensor_parallel_size = best.tp;
        cfg->parallel.sequence_parallel_size = best.sp;
        return 1;
    }
    /* no tp within a node (nor sp) fits: the smallest pipeline that does (its stages the
     * plan's even split, the mesh within it searched as above). Its schedule: 1f1b (at
     * most pp - r micro-batches in flight on rank r); where the accumulation steps are
     * fewer than pp, which 1f1b refuses, gpipe, the one schedule that keeps the user's
     * global batch (with M < pp 1f1b would start every micro-batch before its first
     * backward on rank 0 too, and the bubble is (pp - 1) / (M + pp - 1) under both). A
     * parallel.pp_schedule given is kept: a pipeline it refuses is reported, with the
     * gpipe mesh that would fit. */
    const int A = cfg->train.gradient_accumulation_steps;
    const int given = zt_config_given(cfg, "parallel.pp_schedule");
    zt_params_split_head(g); /* as a pipeline's run splits it */
    for (int pp = 2; pp <= world && !best.tp; pp++) {
        if (world % pp) continue;
        c.parallel.pipeline_parallel_size = pp;
        c.parallel.pp_schedule = given ? cfg->parallel.pp_schedule : A >= pp ? ZT_PP_1F1B : ZT_PP_GPIPE;
        refused[0] = '\0';
        search_pp(&c, g, &sh, world, per_node, limit, &best, refused, sizeof refused);
        if (best.tp || !given || !refused[0]) continue;
        zt_config_t alt = c;
        alt.parallel.pp_schedule = ZT_PP_GPIPE, alt.parallel.pp_stages_per_rank = 1;
        mesh_pick_t gp = {0};
        char dummy[ZT_ERRLEN];
        search_pp(&alt, g, &sh, world, per_node, limit, &gp, dummy, sizeof dummy);
        if (!gp.tp) continue;
        zt_param_table_free(g);
        snprintf(why, len, "parallel.strategy = auto: no mesh fits the limit of %s (%s) without a pipeline; pp %d x "
                 "tp %d x sp %d with %s fits under parallel.pp_schedule = gpipe (%s per rank), but the schedule given "
                 "is refused there: %s", zt_fmt_bytes(limit, b1, 32), what, pp, gp.tp, gp.sp, zt_strategy_name(gp.st),
                 zt_fmt_bytes(gp.total, b2, 32), refused);
        return -1;
    }
    zt_param_table_free(g);
    if (!best.tp) return 0; /* nothing fits: the run's own check says so */
    cfg->parallel.pipeline_parallel_size = best.pp;
    cfg->parallel.tensor_parallel_size = best.tp;
    cfg->parallel.sequence_parallel_size = best.sp;
    cfg->parallel.pp_schedule = given ? cfg->parallel.pp_schedule : A >= best.pp ? ZT_PP_1F1B : ZT_PP_GPIPE;
    const int n = snprintf(why, len, "no mesh fits the limit of %s (%s) without a pipeline (tp within a node's %d "
                           "ranks, sp over the rest); pp %d, the smallest that fits, x tp %d x sp %d with %s and %s "
                           "fits (%s per rank) and moves the least of the meshes that fit at pp %d (%s a step)",
                           zt_fmt_bytes(limit, b1, 32), what, per_node, best.pp, best.tp, best.sp,
                           zt_strategy_name(best.st),
                           zt_config_enum_name("parallel.pp_schedule", cfg->parallel.pp_schedule),
                           zt_fmt_bytes(best.total, b2, 32), best.pp, zt_fmt_bytes(best.traffic, b3, 32));
    if (!given && A < best.pp && n > 0 && (size_t)n < len)
        snprintf(why + n, len - (size_t)n, "; gpipe as 1f1b needs train.gradient_accumulation_steps (%d) >= pp: the "
                 "bubble is (pp - 1) / (M + pp - 1) = %.0f%% of a step, more accumulation steps shrink it", A,
                 100.0 * (best.pp - 1) / (A + best.pp - 1));
    return 1;
}

/* auto: the least traffic that fits; ordered by collective volume per step */
zt_strategy_t zt_tr_pick_auto(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_backend_t *be,
                               const zt_param_table_t *g, const zt_param_table_t *t, int world, int per_node, char *why, size_t len)
{
    static const zt_strategy_t order[] = {ZT_DDP, ZT_ZERO1, ZT_ZERO2, ZT_SHARD_GRAD_OP, ZT_ZERO3};
    char what[160];
    const double limit = memory_limit(cfg, be, per_node, what, sizeof what);
    char b1[32], b2[32];
    zt_strategy_t smallest = ZT_ZERO3;
    size_t smallest_total = SIZE_MAX;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        if (!plannable(p, order[i])) continue;
        estimate_t e;
        zt_tr_estimate(cfg, p, g, t, order[i], world, per_node, &e);
        if ((double)e.total <= limit) {
            snprintf(why, len, "estimated %s per rank fits the limit of %s; it moves the least data of those that fit",
                     zt_fmt_bytes((double)e.total, b1, 32), zt_fmt_bytes(limit, b2, 32));
            return order[i];
        }
        if (e.total < smallest_total) smallest_total = e.total, smallest = order[i];
    }
    snprintf(why, len, "nothing fits the limit of %s; %s needs the least memory (%s per rank)",
             zt_fmt_bytes(limit, b2, 32), zt_strategy_name(smallest), zt_fmt_bytes((double)smallest_total, b1, 32));
    return smallest;
}

/* A run whose estimate exceeds the memory it may fill is refused before anything
 * large is allocated: an out-of-memory kill of one rank minutes later says less. The
 * estimate is a dry run of the code that allocates (zt_memplan.h), so it is what the
 * engine, the reference copy and the model will hold; what it leaves out (libraries, a
 * CUDA context, allocator slack) is small beside a limit this estimate exceeds. */
int zt_tr_check_fits(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_backend_t *be,
                      const zt_param_table_t *g, const zt_param_table_t *t, zt_strategy_t st, const zt_comm_t *c, char *err, size_t errlen)
{
    estimate_t e;
    zt_tr_estimate(cfg, p, g, t, st, c->data.size, c->shard.size, &e);
    char what[160], b[3][32];
    const double limit = memory_limit(cfg, be, c->local_size, what, sizeof what);
    /* on a host-memory backend the offloaded state is in the same memory */
    const double state = (double)e.total + (be->host_memory ? (double)(e.mem.host + e.ref.host) : 0.0);
    const double kv = (double)e.kv;
    if (state <= limit && state + kv > limit)
        return zt_err(err, errlen,
                      "memory: generation's KV cache for generate.batch_size=%d needs %s per rank beside the "
                      "model's estimated %s, more than the limit of %s (%s); lower generate.batch_size or "
                      "data.seq_len, or set generate.use_cache=false",
                      cfg->generate.batch_size, zt_fmt_bytes(kv, b[0], 32), zt_fmt_bytes(state, b[1], 32),
                      zt_fmt_bytes(limit, b[2], 32), what);
    if (state > limit)
        return zt_err(err, errlen,
                      "memory: %s needs an estimated %s per rank, more than the limit of %s (%s); compare "
                      "strategies with --estimate-memory, then shard more (zero3), offload "
                      "(parallel.offload_optimizer), recompute activations (train.gradient_checkpointing) "
                      "or lower train.per_device_train_batch_size (parallel.memory_limit_gb sets the limit)",
                      zt_strategy_name(st), zt_fmt_bytes(state, b[0], 32), zt_fmt_bytes(limit, b[1], 32), what);
    const double host = host_memory_per_rank(c->local_size);
    if (!be->host_memory && (double)(e.mem.host + e.ref.host) > host)
        return zt_err(err, errlen,
                      "memory: offload needs an estimated %s of host memory per rank, more than the %s "
                      "(physical memory / %d ranks on this node)",
                      zt_fmt_bytes((double)(e.mem.host + e.ref.host), b[0], 32), zt_fmt_bytes(host, b[1], 32), c->local_size);
    return 0;
}

/* Megatron sequence parallelism inside tp (the plan checked that every tp rank gets a
 * whole share of the tokens): the replicated parameters its rows feed (norms, learned
 * positions) get partial gradients, summed over tp by the engine. */
static void tp_seq_setup(zt_param_table_t *t)
{
    t->dims.tp_seq = 1;
    for (int i = 0; i < t->nparams; i++) {
        zt_param_t *p = &t->params[i];
        if (p->tp_dim < 0 && (p->role == ZT_ROLE_NORM || p->role == ZT_ROLE_POS_EMBED)) p->tp_grad_sum = 1;
    }
}
