/* zt_train.c — the SPMD training loop (see zt_train.h).
 *
 * Sample order (the contract every strategy and world size shares): with G =
 * B * dp * A samples per optimizer step, step s covers global samples
 * [s*G, (s+1)*G) (offset by the resumed sampler position); micro-step m of rank
 * r takes rows g = base + m*(dp*B) + r*B + b, b < B. One rank with A' = A*dp
 * micro-steps therefore sees exactly the same samples per step, and each micro
 * gradient is scaled by 1/(B*T*A*dp) so the reduced sum is the global mean.
 *
 * fp16 loss scaling: the loss scale S multiplies that gradient scale, so every
 * gradient is S times the true one; the norm is divided by S and AdamW's gradient
 * factor becomes clip / S (the unscale costs no pass). S is a power of two in
 * dynamic mode, so scaling and unscaling are exact in fp32. An overflow (a finite
 * loss with a non-finite gradient anywhere, agreed collectively) skips the step on
 * every rank and halves S; loss_scale_window good steps in a row double it. The
 * learning-rate schedule follows optimizer steps (Adam t), so a skipped step does
 * not advance it, as in DeepSpeed and the HF Trainer. */
#include "config.h"
#include "zt_train.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zt_arch.h"
#include "zt_backend.h"
#include "zt_tokenizer.h"
#include "zt_sft.h"
#include "zt_dataset_info.h"
#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_data.h"
#include "zt_generate.h"
#include "zt_hf_model.h"
#include "zt_qlora.h"
#include "zt_log.h"
#include "zt_memplan.h"
#include "zt_metrics.h"
#include "zt_pref.h"
#include "zt_pref_ref.h"
#include "zt_mfu.h"
#include "zt_model.h"
#include "zt_optim.h"
#include "zt_plot.h"
#include "zt_run.h"
#include "zt_sample.h"
#include "zt_shard.h"
#include "zt_step.h"
#include "zt_watchdog.h"
#include "zt_train_internal.h"

#ifdef ZT_HAVE_CUDA
#include "zt_cuda.h"
#endif


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

/* train.threads resolved (see its schema text) */
int zt_tr_cpu_threads(const zt_config_t *cfg, const zt_backend_t *be, int local_size)
{
    if (cfg->train.threads > 0) return cfg->train.threads;
    if (strcmp(be->name, "cpu") != 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        return (int)ZT_MAX(1L, cores / (local_size > 0 ? local_size : 1));
    }
    const char *env = getenv("OMP_NUM_THREADS");
    int n = env ? atoi(env) : 1;
    return n > 0 ? n : 1;
}

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
    if (p->tp_sequence_parallel) zt_tr_tp_seq_setup(t);
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
    /* the data-parallel traffic of the rank's units (a pipeline rank's stages') */
    unsigned char *held = layers ? zt_params_units_of_layers(t, layers) : NULL;
    q.opts.held = held;
    const int sn = zt_strategy_is_hybrid(st) ? shard_n : world;
    const int rn = st == ZT_DDP ? world : zt_strategy_is_hybrid(st) ? world / shard_n : 1;
    e->traffic = zt_shard_traffic_estimate(t, &q.opts, sn, rn, cfg->train.gradient_accumulation_steps);
    free(held);
    free(layers);
    zt_param_table_free(ref);
    e->mem = m.mem;
    e->mem.comm_buffers += m.messages; /* a pipeline rank's message buffers are buffers too (rank_memory) */
    e->ref = m.ref;
    e->activations = m.activations;
    e->kv = m.kv;
    e->total = zt_tr_mem_total(&e->mem) + zt_tr_mem_total(&e->ref) + e->activations;
}

/* The rank that needs the most: under a pipeline the largest of its ranks' (stages')
 * figures decides whether a run fits */
void zt_tr_estimate(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *g,
                     const zt_param_table_t *t, zt_strategy_t st, int world, int shard_n, estimate_t *e)
{
    zt_tr_estimate_rank(cfg, p, g, t, st, world, shard_n, 0, e);
    for (int r = 1; r < p->pp; r++) {
        estimate_t x;
        zt_tr_estimate_rank(cfg, p, g, t, st, world, shard_n, r, &x);
        if (x.total > e->total) *e = x;
    }
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

/* Activation bytes a step on the tp and sp groups (doc/design.md's formulas; t: a rank's
 * table, its NH, NKV tp-local; blocks: the blocks the rank runs, all L without a pipeline) */
static double mesh_traffic(const zt_config_t *cfg, const zt_param_table_t *t, int tp, int sp, int blocks)
{
    const zt_model_dims_t *d = &t->dims;
    const double A = cfg->train.gradient_accumulation_steps, L = blocks, C = d->C;
    const double N = (double)zt_config_batch_rows(cfg) * (cfg->data.seq_len / sp);
    const double S = ((double)d->NH + 2.0 * ZT_MAX(d->NKV, sp)) * d->HD, Q = (double)d->NH * d->HD;
    return (tp > 1 ? 4.0 * A * (N * C * (2 + 4 * L) + 3 * N) : 0.0) + (sp > 1 ? 8.0 * A * L * N * (S + Q) : 0.0);
}

/* The blocks of the pipeline rank that runs the most of them (layers 1 .. L of 0 .. L + 1) */
static int rank_blocks(const zt_parallel_plan_t *p, int L)
{
    int most = 0;
    for (int r = 0; r < p->pp; r++) {
        int n = 0;
        for (int l = 1; l <= L; l++) n += zt_plan_rank_holds_layer(p, r, l);
        most = ZT_MAX(most, n);
    }
    return most;
}

/* A pipeline rank's send/receive bytes a step (doc/design.md, traffic per axis): one B T C
 * activation forward and its gradient back per micro-batch and boundary, on the rank that
 * touches the most boundaries (tp_sequence_parallel: each tp rank its 1/tp of the tokens,
 * else every tp rank the whole stream), and a tied root's reduced gradient between the
 * ends once a step (shards of it under the sharding strategies) */
static double pp_traffic(const zt_config_t *cfg, const zt_parallel_plan_t *p, const zt_param_table_t *t,
                         zt_strategy_t st)
{
    if (p->pp == 1) return 0.0;
    int most = 0;
    for (int r = 0; r < p->pp; r++) {
        int b = 0;
        for (int s = r; s < p->stages; s += p->pp) b += (s > 0) + (s < p->stages - 1);
        most = ZT_MAX(most, b);
    }
    const double N = (double)zt_config_batch_rows(cfg) * (cfg->data.seq_len / p->sp);
    const double msg = N * t->dims.C / (p->tp_sequence_parallel ? p->tp : 1) * 4.0;
    const double root = zt_params_head_unit(t) == t->root_unit ? (double)t->unit_numel[t->root_unit] * 4.0 : 0.0;
    return 2.0 * most * p->micro * msg + 2.0 * root / (st == ZT_DDP ? 1 : p->data);
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
                const double traffic =
                    e.traffic + mesh_traffic(c, t, tp, sp, rank_blocks(&p, t->dims.L)) + pp_traffic(c, &p, t, order[i]);
                if (!best->tp || traffic < best->traffic)
                    *best = (mesh_pick_t){pp, tp, sp, order[i], traffic, (double)e.total};
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

/* Prompts generated at once: at most T = data.seq_len, as their new tokens are one row */
int zt_tr_gen_batch_of(int batch, int T) { return ZT_MAX(1, ZT_MIN(batch, T)); }

/* Sequences generation's KV cache holds for `batch` prompts at once: one each and a spare
 * (batch_logits), or 0 where there is no cache (generate.use_cache off, sequence
 * parallelism, tp_sequence_parallel) */
int zt_tr_kv_sequences(const zt_config_t *cfg, int sp, int tp_seq, int batch)
{
    if (!cfg->generate.use_cache || sp > 1 || tp_seq) return 0;
    return batch > 1 ? batch + 1 : 1;
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

/* ---- passes ---------------------------------------------------------------------- */

/* Megatron sequence parallelism inside tp (the plan checked that every tp rank gets a
 * whole share of the tokens): the replicated parameters its rows feed (norms, learned
 * positions) get partial gradients, summed over tp by the engine. */
void zt_tr_tp_seq_setup(zt_param_table_t *t)
{
    t->dims.tp_seq = 1;
    for (int i = 0; i < t->nparams; i++) {
        zt_param_t *p = &t->params[i];
        if (p->tp_dim < 0 && (p->role == ZT_ROLE_NORM || p->role == ZT_ROLE_POS_EMBED)) p->tp_grad_sum = 1;
    }
}

/* lora.dropout's counters for micro-step m: one key per local token from (seed, step,
 * the sample's slot in the global batch, its position in the sequence), so any strategy,
 * world size and mesh drops the same elements of the same token */
void zt_tr_dropout_keys(run_t *r, int m, uint64_t *keys)
{
    const int B = r->B, Tm = r->Tm, sp = r->comm->mesh_sp, i = r->comm->sp.rank, ring = r->ltable->dims.sp_ring;
    const int64_t g0 = r->samples_seen + (int64_t)m * r->dp * B + (int64_t)r->drank * B;
    const uint64_t base = zt_splitmix64((uint64_t)r->cfg->train.seed ^ zt_splitmix64((uint64_t)r->step + 1));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tm; t++) {
            size_t at = (size_t)b * Tm + t;
            int pos = i * Tm + t;
            if (ring) { /* chunk-major: (B, Tm/2) of chunk i, then of chunk 2 sp - 1 - i */
                const int c = Tm / 2, h = t / c;
                at = ((size_t)h * B + b) * c + t % c;
                pos = zt_model_ring_chunk(sp, i, h) * c + t % c;
            }
            keys[at] = zt_splitmix64(base ^ zt_splitmix64(((uint64_t)(g0 + b) << 24) ^ (uint64_t)pos));
        }
}

/* The columns of an SFT or DPO micro-batch that hold a token with a loss in some row: a row's
 * positions after its sample's last target are padding, which causal attention keeps from
 * every earlier position and which carries no loss, so a micro-batch whose rows all end
 * early trains on the shorter rows to the same result (fp32 rounding: the weight gradients'
 * sums skip the zero rows). LLaMA-Factory pads each batch to its longest sample the same way;
 * without it a cutoff_len of 2048 over 300-token samples would compute 7x the work. The
 * rows (inp, tgt, keys: (B, Tm)) are compacted in place to (B, T) and T returned, rounded up
 * to 8 positions (GEMM rows) and at most Tm. Rows split over ranks (sp, tp_sequence_parallel)
 * or packed (segments) keep their length: their ranks would have to agree on it. */
/* whether this rank may trim its rows (the rule above; pref_lf_rows trims by it too) */
int zt_tr_rows_trimmable(const run_t *r)
{
    return r->comm->mesh_sp <= 1 && !r->ltable->dims.tp_seq && !r->seg;
}

int zt_tr_trim_padding(const run_t *r, int32_t *inp, int32_t *tgt, uint64_t *keys)
{
    const int B = r->B, Tm = r->Tm;
    if (!zt_tr_rows_trimmable(r)) return Tm;
    int T = 0;
    for (int b = 0; b < B; b++)
        for (int t = Tm - 1; t >= T; t--)
            if (tgt[(size_t)b * Tm + t] >= 0) {
                T = t + 1;
                break;
            }
    return zt_tr_trim_rows(r, inp, tgt, keys, ZT_MIN(Tm, ZT_MAX(8, (T + 7) / 8 * 8)));
}

/* The rows (inp, tgt, keys: (B, Tm)) compacted in place to their first T positions; T */
int zt_tr_trim_rows(const run_t *r, int32_t *inp, int32_t *tgt, uint64_t *keys, int T)
{
    const int B = r->B, Tm = r->Tm;
    if (T == Tm) return Tm;
    for (int b = 1; b < B; b++) {
        memmove(inp + (size_t)b * T, inp + (size_t)b * Tm, (size_t)T * sizeof *inp);
        memmove(tgt + (size_t)b * T, tgt + (size_t)b * Tm, (size_t)T * sizeof *tgt);
        if (keys) memmove(keys + (size_t)b * T, keys + (size_t)b * Tm, (size_t)T * sizeof *keys);
    }
    return T;
}

/* A training micro-step's forward through the blocks: seg, pos: the rows' segments and
 * positions (neat packing), or NULL; keys: lora.dropout's per-token counters, or NULL;
 * adapters 0: LoRA's base alone (the DPO reference); T: the rows' length (at most r->Tm). The root unit (embeddings, tied
 * head, ln_f) stays materialized until train_backward, as FSDP does for its root
 * module: it is used at both ends. */
/* Blocks [l0, l1) of model m forward, each unit (and its LoRA adapters' with adapters)
 * gathered just before it runs and released after */
void zt_tr_forward_range(run_t *r, zt_shard_t *s, zt_model_t *m, int l0, int l1, int adapters)
{
    const zt_param_table_t *t = r->table;
    const int b0 = t->first_block_unit, a0 = adapters ? t->first_adapter_unit : -1;
    if (l0 < l1) zt_shard_prefetch(s, b0 + l0);
    for (int l = l0; l < l1; l++) {
        zt_watchdog_mark("forward", b0 + l, r->step + 1);
        const float *w = zt_shard_params(s, b0 + l);
        /* LoRA: the block's adapter unit beside its frozen base */
        const float *lw = a0 >= 0 ? zt_shard_params(s, a0 + l) : NULL;
        if (l + 1 < l1) zt_shard_prefetch(s, b0 + l + 1);
        zt_model_forward_block(m, l, w, lw);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) zt_shard_release(s, a0 + l);
    }
}

/* Blocks [l0, l1) of model m backward, last first, from the gradient in its residual
 * stream; each unit's gradients reported ready as they are complete */
void zt_tr_backward_range(run_t *r, zt_model_t *m, int l0, int l1)
{
    zt_shard_t *s = r->shard;
    const zt_param_table_t *t = r->table;
    const int b0 = t->first_block_unit, a0 = t->first_adapter_unit;
    for (int l = l1 - 1; l >= l0; l--) {
        zt_watchdog_mark("backward", b0 + l, r->step + 1);
        const float *w = zt_shard_params(s, b0 + l);
        const float *lw = a0 >= 0 ? zt_shard_params(s, a0 + l) : NULL;
        if (l > l0) zt_shard_prefetch(s, b0 + l - 1);
        zt_model_backward_block(m, l, w, zt_shard_grads(s, b0 + l), lw, a0 >= 0 ? zt_shard_grads(s, a0 + l) : NULL);
        zt_shard_grads_ready(s, b0 + l);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) {
            zt_shard_grads_ready(s, a0 + l);
            zt_shard_release(s, a0 + l);
        }
    }
}

/* The batch set in the model through the embedding and every block; the root unit stays
 * gathered */
const float *zt_tr_forward_set_batch(run_t *r, zt_shard_t *s, int adapters)
{
    const zt_param_table_t *t = r->table;
    zt_watchdog_mark("forward", 0, r->step + 1);
    const float *root = zt_shard_params(s, t->root_unit);
    zt_shard_prefetch(s, t->first_block_unit); /* the first block's gather overlaps the embedding */
    zt_model_forward_embed(r->model, root);
    zt_tr_forward_range(r, s, r->model, 0, t->dims.L, adapters);
    return root;
}

const float *zt_tr_train_forward(run_t *r, zt_shard_t *s, const int32_t *inp, const int32_t *tgt,
                                  const int32_t *seg, const int32_t *pos, const uint64_t *keys, int adapters, int T)
{
    zt_model_t *m = r->model;
    zt_model_set_batch(m, inp, tgt, r->B, T);
    if (seg) zt_model_set_segments(m, seg, pos);
    if (keys) zt_model_set_row_keys(m, keys);
    return zt_tr_forward_set_batch(r, s, adapters);
}

/* After the head's backward: the blocks' backward, the embedding's (droot: the root unit's
 * gradients, NULL when frozen), and the root unit's gradients ready and released */
void zt_tr_backward_from_head(run_t *r, float *droot)
{
    zt_shard_t *s = r->shard;
    const int root_unit = r->table->root_unit;
    zt_tr_backward_range(r, r->model, 0, r->table->dims.L);
    zt_watchdog_mark("backward", root_unit, r->step + 1);
    zt_model_backward_embed(r->model, droot);
    zt_shard_grads_ready(s, root_unit);
    zt_shard_release(s, root_unit);
}

/* The head's forward and backward (dscale, or the model's token scales) and the blocks'
 * backward after train_forward; releases the root unit; the loss */
float zt_tr_train_backward(run_t *r, const float *root, float dscale)
{
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    const zt_param_table_t *t = r->table;
    const int root_unit = t->root_unit;
    zt_watchdog_mark("forward head", root_unit, r->step + 1);
    float *droot = zt_shard_grads(s, root_unit);
    zt_model_train_head(m, root, droot, dscale);
    zt_tr_backward_from_head(r, droot);
    return zt_model_loss(m);
}

/* ---- preference training (train.stage = dpo) ------------------------------------------
 * A micro-batch of B rows holds B/2 pairs: rows 2i (chosen) and 2i + 1 (rejected), each
 * one sequence whose targets >= 0 are its response tokens. Per micro-step: the reference's
 * log-prob sums (LoRA: the same model with the adapters off, forward only, its
 * activations overwritten by the policy's), the policy's forward and head with its sums
 * and logit sums, the loss (zt_pref.h) and its per-sequence weights, then the head's
 * backward with each token's dlogits scaled by its sequence's weight. As LLaMA-Factory's
 * trainer (HF Trainer, DDP), the step's loss is the mean over micro-steps and data ranks
 * of each micro-batch's mean over its pairs; so are the metrics. */

/* The row of this rank's token i (B rows of T tokens; ring attention: its two chunks of
 * each row chunk-major, (2, B, T/2)) */
int zt_tr_token_row(const run_t *r, size_t i, int T)
{
    if (r->ltable->dims.sp_ring) return (int)((i / (size_t)(T / 2)) % (size_t)r->B);
    return (int)(i / (size_t)T);
}

/* The position in its row of this rank's token i (B rows of T; sp: this rank's chunks of
 * each row, token_row's layout) */
int zt_tr_token_pos(const run_t *r, size_t i, int T)
{
    const int sp = r->comm->mesh_sp, k = r->comm->sp.rank;
    if (sp <= 1) return (int)(i % (size_t)T);
    if (!r->ltable->dims.sp_ring) return k * T + (int)(i % (size_t)T);
    const size_t c = (size_t)T / 2;
    return zt_model_ring_chunk(sp, k, (int)(i / (c * (size_t)r->B))) * (int)c + (int)(i % c);
}

/* LLaMA-Factory's DPO micro-batch, of which logits/chosen and /rejected average every logit
 * (PairwiseDataCollatorWithPadding with pad_to_multiple_of 8): each row its whole sample, the
 * last token too, then the pad token up to the next multiple of 8 past the longest sample of
 * the micro-batch's rows, at positions going on, the attention mask hiding the pad keys from
 * every query (a pad query sees its sample alone, not itself). The rows (inp, tgt: (B, Tm),
 * this rank's tokens, their padding the pad token already) become that: each row's last
 * token (its last target, which the input leaves out: it predicts nothing) at its position,
 * and *seg (B, whole rows: micro-batch mi's of r->pref_seg) 1 on the sample and -1 on its padding (zt_backend.h),
 * NULL where no row has padding (plain causal attention); trimmed in place to the padded
 * length where trim_padding trims. The sample's positions compute what they did (nothing
 * before them changed) and the padding carries no loss, so the loss, the log-probs and the
 * gradients are those of the plain rows. Returns the positions each row runs; *P: LLaMA-
 * Factory's padded length, at most data.seq_len (the positions a row has). */
int zt_tr_pref_lf_rows(run_t *r, int32_t *inp, int32_t *tgt, int mi, int32_t **seg, int *P)
{
    const int B = r->B, Tm = r->Tm, V = r->table->dims.V;
    const size_t N = (size_t)B * Tm;
    /* per row: its last target's position x V + its token, over every sp rank */
    double *last = zt_malloc((size_t)B * sizeof *last);
    for (int b = 0; b < B; b++) last[b] = -1.0;
    for (size_t i = 0; i < N; i++)
        if (tgt[i] >= 0) {
            const int b = zt_tr_token_row(r, i, Tm);
            last[b] = ZT_MAX(last[b], (double)zt_tr_token_pos(r, i, Tm) * V + tgt[i]);
        }
    if (r->comm->mesh_sp > 1) zt_allreduce(r->comm, &r->comm->sp, ZT_IN_PLACE, last, (size_t)B, ZT_F64, ZT_MAX);
    int longest = 0;
    for (int b = 0; b < B; b++) longest = ZT_MAX(longest, last[b] < 0 ? 0 : (int)(last[b] / V) + 2);
    *P = ZT_MIN(r->T, ZT_MAX(8, (longest + 7) / 8 * 8));
    for (size_t i = 0; i < N; i++) {
        const int b = zt_tr_token_row(r, i, Tm);
        if (last[b] >= 0 && zt_tr_token_pos(r, i, Tm) == (int)(last[b] / V) + 1) inp[i] = (int32_t)fmod(last[b], V);
    }
    const int T = zt_tr_rows_trimmable(r) ? zt_tr_trim_rows(r, inp, tgt, NULL, *P) : Tm;
    const int Tw = T * ZT_MAX(r->comm->mesh_sp, 1); /* a whole row's positions */
    if (!r->pref_seg) r->pref_seg = r->be->alloc_host((size_t)r->A * B * r->T * sizeof(int32_t));
    int32_t *sg = r->pref_seg + (size_t)mi * B * r->T;
    *seg = NULL;
    for (int b = 0; b < B; b++) {
        const int n = last[b] < 0 ? Tw : (int)(last[b] / V) + 2; /* a row without a target: no padding */
        for (int t = 0; t < Tw; t++) sg[(size_t)b * Tw + t] = t < n ? 1 : -1;
        if (n < Tw) *seg = sg;
    }
    free(last);
    return T;
}

/* Per row of the micro-batch (B rows of T), over its tokens on every sp rank: into sum (B)
 * minus the sum of x's per-token losses (tl) or plus the sum of x (not tl); into len (B,
 * or NULL) its response tokens. */
void zt_tr_row_sums(run_t *r, const float *x, int tl, const int32_t *tgt, int T, double *sum, double *len)
{
    const size_t N = (size_t)r->B * T;
    const int n = len ? 2 * r->B : r->B;
    double *acc = zt_calloc((size_t)n, sizeof *acc);
    for (size_t i = 0; i < N; i++) {
        const int b = zt_tr_token_row(r, i, T);
        acc[b] += tl ? -(double)x[i] : (double)x[i];
        if (len) acc[r->B + b] += tgt[i] >= 0;
    }
    if (r->comm->mesh_sp > 1) zt_allreduce(r->comm, &r->comm->sp, ZT_IN_PLACE, acc, (size_t)n, ZT_F64, ZT_SUM);
    memcpy(sum, acc, (size_t)r->B * sizeof *acc);
    if (len) memcpy(len, acc + r->B, (size_t)r->B * sizeof *acc);
    free(acc);
}

/* the time since t[0] (wall) and t[1] (the thread's CPU) into the DPO profile's part k;
 * t := now */
void zt_tr_pref_lap(run_t *r, pref_part_t k, double *t)
{
    const double now = zt_now(), cpu = zt_thread_seconds();
    r->pref_seconds[k] += now - t[0];
    r->pref_cpu[k] += cpu - t[1];
    t[0] = now, t[1] = cpu;
}

/* The reference's log-prob sums of the micro-batch's rows (inp, tgt: (B, T)) into ref (B):
 * the frozen copy (full fine-tuning, pref.ref_model), or LoRA's base: this model without
 * its adapters; forward only (its activations are overwritten by the policy's), its head
 * on the loss-bearing rows with the logits of one chunk at a time. With pref.share_prompt
 * each pair's prompt is computed once and no padding (zt_pref_ref.h), the same sums to
 * rounding; not where the model cannot share rows (sequence parallelism splits a row over
 * ranks, tp's sequence-parallel residual splits the compact tokens over tp ranks:
 * zt_model_can_share_rows), nor under a pipeline, which run every row's positions. */
void zt_tr_pref_reference(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg, int T, double *ref,
                           double *now)
{
    const zt_param_table_t *t = r->table;
    const int frozen_head = t->unit_frozen && t->unit_frozen[t->root_unit];
    const int share = r->cfg->pref.share_prompt && r->plan.pp <= 1 && zt_model_can_share_rows(r->model);
    zt_pref_share_t sh = {0};
    zt_shard_t *rs = r->ref_shard ? r->ref_shard : r->shard;
    if (r->ref_shard) zt_shard_begin_inference(rs);
    const float *root;
    r->pref_ref_pos[1] += (double)r->B * T;
    if (share) {
        zt_pref_share_make(&sh, inp, tgt, r->B, T);
        r->pref_ref_pos[0] += sh.n;
        zt_model_set_batch(r->model, sh.inp, sh.tgt, sh.B, sh.T);
        zt_model_set_segments(r->model, NULL, sh.pos);
        zt_model_set_shared_rows(r->model, r->B, T, sh.full, sh.own);
        root = zt_tr_forward_set_batch(r, rs, 0);
    } else {
        root = zt_tr_train_forward(r, rs, inp, tgt, seg, NULL, NULL, 0, T);
        r->pref_ref_pos[0] += (double)r->B * T;
    }
    zt_tr_pref_lap(r, PT_REF_BLOCKS, now);
    if (frozen_head) zt_model_pref_head(r->model, root, 1);
    else zt_model_forward_head(r->model, root);
    zt_shard_release(rs, t->root_unit);
    if (r->ref_shard) zt_shard_end_inference(rs);
    if (share) zt_pref_share_sums(&sh, zt_model_token_losses(r->model), r->B, ref);
    else zt_tr_row_sums(r, zt_model_token_losses(r->model), 1, tgt, T, ref, NULL);
    zt_pref_share_free(&sh);
    zt_tr_pref_lap(r, PT_REF_HEAD, now);
}

/* The policy's head after its forward through the blocks of model m (B rows of T of the
 * micro-batch whose targets are tgt): on the head unit's weights hw (its unit hu of
 * r->shard), its per-sequence sums and logit sums, the loss against the reference's row
 * sums ref (B, NULL without a reference) with metrics += the micro-batch's (Tp: its rows'
 * length as LLaMA-Factory pads them, pref_lf_rows), and the head's
 * backward at each sequence's factor (factor: the gradient's share), which leaves dL/d(the
 * last block's output) for the blocks' backward and, with a trained head, its gradients
 * accumulated; the caller readies and releases the unit. *now: the DPO profile's clock.
 * With a frozen head (LoRA) the head runs once (zt_model_pref_head: dL/dxf kept at factor 1
 * until the loss gives each sequence's factor); a trained head (full fine-tuning) runs
 * forward for the sums, then again with the factors (zt_model_train_head), its weight
 * gradient needing each token's dlogits at its factor. */
double zt_tr_pref_policy_head(run_t *r, zt_model_t *m, const float *hw, int hu, const int32_t *tgt, int T, int Tp,
                               const double *ref, float factor, double *metrics, double *now)
{
    const zt_pref_cfg_t *pc = &r->cfg->pref.fn;
    const zt_param_table_t *t = r->table;
    const int frozen_head = t->unit_frozen && t->unit_frozen[hu];
    const int B = r->B, np = B / 2, N = B * T;
    double *w = zt_calloc(7 * (size_t)B, sizeof *w);
    double *rf = w, *pol = w + B, *len = w + 2 * B, *lg = w + 3 * B, *cnt = w + 4 * B, *d = w + 5 * B;
    double *c6 = w + 6 * B; /* scratch (B) */
    if (ref) memcpy(rf, ref, (size_t)B * sizeof *rf);
    float *lsum = zt_malloc((size_t)N * sizeof *lsum);
    zt_model_set_logit_sums(m, lsum);
    if (frozen_head) zt_model_pref_head(m, hw, 0);
    else zt_model_forward_head(m, hw);
    zt_tr_row_sums(r, zt_model_token_losses(m), 1, tgt, T, pol, len);
    /* LLaMA-Factory's logits/chosen and /rejected: the mean of every logit of its padded
     * batch (pref_lf_rows: Tp positions a row), on every mesh */
    for (int i = 0; i < N; i++)
        if (zt_tr_token_pos(r, (size_t)i, T) >= Tp) lsum[i] = 0.0f;
    zt_tr_row_sums(r, lsum, 0, tgt, T, lg, NULL);
    zt_tr_pref_lap(r, PT_HEAD, now);
    for (int b = 0; b < B; b++) cnt[b] = (double)Tp * t->dims.V;
    /* rows to pairs: [chosen of each pair | rejected of each pair] per quantity */
    double *q[5] = {pol, rf, len, lg, cnt};
    for (int k = 0; k < 5; k++) {
        for (int i = 0; i < np; i++) c6[i] = q[k][2 * i], c6[np + i] = q[k][2 * i + 1];
        memcpy(q[k], c6, (size_t)B * sizeof *c6);
    }
    const int uses_ref = zt_pref_uses_ref(pc->loss);
    const zt_pref_batch_t pb = {np, pol, pol + np, uses_ref ? rf : NULL, uses_ref ? rf + np : NULL, len, len + np,
                                lg, lg + np, cnt, cnt + np};
    double met[ZT_PREF_NMETRICS];
    const double loss = zt_pref_loss(pc, &pb, met, d, d + np);
    for (int k = 0; k < ZT_PREF_NMETRICS; k++) metrics[k] += met[k];
    /* d logp / d logits = -d CE / d logits: each token's factor is minus its sequence's weight */
    float *scale = zt_malloc((size_t)N * sizeof *scale);
    for (int i = 0; i < N; i++) {
        const int b = zt_tr_token_row(r, (size_t)i, T);
        scale[i] = (float)(-d[(b % 2) * np + b / 2] * factor);
    }
    zt_tr_pref_lap(r, PT_LOSS, now);
    if (frozen_head) {
        zt_model_pref_head_backward(m, hw, scale);
        zt_tr_pref_lap(r, PT_HEAD, now);
    } else {
        zt_model_set_token_scales(m, scale);
        zt_model_train_head(m, hw, zt_shard_grads(r->shard, hu), 0.0f);
        zt_tr_pref_lap(r, PT_BWD, now);
    }
    free(scale);
    free(lsum);
    free(w);
    return loss;
}

/* One DPO micro-step on the micro-batch's rows (inp, tgt: (B, Tm), padded and trimmed in
 * place as LLaMA-Factory pads its batch (pref_lf_rows): a pair's two rows are in it, so both
 * keep every position that carries a loss); factor: the gradient's share (loss scale /
 * (micro-steps x data-parallel replicas)); metrics (ZT_PREF_NMETRICS) += this micro-batch's;
 * the micro-batch's loss; *T the positions run. The reference's pass, the policy's forward,
 * its head and loss (pref_policy_head), the blocks' backward. */
double zt_tr_pref_micro(run_t *r, int32_t *inp, int32_t *tgt, float factor, double *metrics, int *Tout)
{
    const zt_pref_cfg_t *pc = &r->cfg->pref.fn;
    const zt_param_table_t *t = r->table;
    const int frozen_head = t->unit_frozen && t->unit_frozen[t->root_unit];
    int32_t *seg; /* LLaMA-Factory's padding (pref_lf_rows) */
    int Tp;       /* its padded length */
    const int T = *Tout = zt_tr_pref_lf_rows(r, inp, tgt, 0, &seg, &Tp);
    double *ref = zt_calloc((size_t)r->B, sizeof *ref);
    double now[2] = {zt_now(), zt_thread_seconds()};
    if (zt_pref_uses_ref(pc->loss)) zt_tr_pref_reference(r, inp, tgt, seg, T, ref, now);
    const float *root = zt_tr_train_forward(r, r->shard, inp, tgt, seg, NULL, NULL, 1, T);
    zt_tr_pref_lap(r, PT_FWD, now);
    const double loss = zt_tr_pref_policy_head(r, r->model, root, t->root_unit, tgt, T, Tp,
                                         zt_pref_uses_ref(pc->loss) ? ref : NULL, factor, metrics, now);
    zt_tr_backward_from_head(r, frozen_head ? NULL : zt_shard_grads(r->shard, t->root_unit));
    zt_tr_pref_lap(r, PT_BWD, now);
    free(ref);
    return loss;
}

/* Inside begin/end_inference: the batch through the embedding and the blocks; the root
 * unit stays gathered for the head (the caller releases it) */
const float *zt_tr_forward_blocks(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg,
                                   const int32_t *pos, int B, int T)
{
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    zt_model_set_batch(m, inp, tgt, B, T);
    if (seg || pos) zt_model_set_segments(m, seg, pos);
    const zt_param_table_t *t = r->table;
    const int b0 = t->first_block_unit, a0 = t->first_adapter_unit;
    const float *root = zt_shard_params(s, t->root_unit);
    zt_model_forward_embed(m, root);
    for (int l = 0; l < t->dims.L; l++) {
        const float *w = zt_shard_params(s, b0 + l);
        const float *lw = a0 >= 0 ? zt_shard_params(s, a0 + l) : NULL;
        if (l + 1 < t->dims.L) zt_shard_prefetch(s, b0 + l + 1);
        zt_model_forward_block(m, l, w, lw);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) zt_shard_release(s, a0 + l);
    }
    return root;
}

/* Forward only, inside begin/end_inference; loss if targets given. */
float zt_tr_forward_only(run_t *r, const int32_t *inp, const int32_t *tgt, const int32_t *seg, const int32_t *pos,
                          int B, int T)
{
    const float *root = zt_tr_forward_blocks(r, inp, tgt, seg, pos, B, T);
    zt_model_forward_head(r->model, root);
    zt_shard_release(r->shard, r->table->root_unit);
    return zt_model_loss(r->model);
}

/* Sequence parallelism: this rank's chunk of a row of T tokens into dst, as row b of B
 * rows of T / sp (ring attention: chunks i and 2 sp - 1 - i of 2 sp, chunk-major over
 * the B rows) */
void zt_tr_sp_chunk(const run_t *r, const int32_t *row, int T, int b, int B, int32_t *dst)
{
    const int sp = r->comm->mesh_sp, i = r->comm->sp.rank, Tm = T / sp;
    if (!r->ltable->dims.sp_ring) {
        memcpy(dst + (size_t)b * Tm, row + (size_t)i * Tm, (size_t)Tm * sizeof(int32_t));
        return;
    }
    const size_t c = (size_t)Tm / 2;
    for (int h = 0; h < 2; h++)
        memcpy(dst + ((size_t)h * B + b) * c, row + (size_t)zt_model_ring_chunk(sp, i, h) * c, c * sizeof(int32_t));
}

/* Reads rows [g0 + ...] of a dataset into inp/tgt (B rows), and their segments and
 * positions into seg/pos when not NULL; 0 or -1 with err. */
int zt_tr_read_rows(run_t *r, zt_dataset_t *ds, int64_t g0, int shuffle, int32_t *inp, int32_t *tgt, int32_t *seg,
                     int32_t *pos, char *err, size_t errlen)
{
    const int T = r->T, Tm = r->Tm;
    int rc = 0;
    if (zt_data_is_pairs(ds)) {
        /* rows b, b + 1 are pair (g0 + b) / 2's chosen and rejected (B and g0 are even) */
        int32_t *buf = Tm == T ? NULL : zt_malloc(4 * (size_t)T * sizeof *buf);
        for (int b = 0; b < r->B && rc == 0; b += 2) {
            if (!buf) {
                rc = zt_data_read_pair_rows(ds, (g0 + b) / 2, (uint64_t)r->cfg->data.seed, shuffle,
                                            inp + (size_t)b * T, tgt + (size_t)b * T, NULL, NULL, err, errlen);
                continue;
            }
            rc = zt_data_read_pair_rows(ds, (g0 + b) / 2, (uint64_t)r->cfg->data.seed, shuffle, buf, buf + 2 * T,
                                        NULL, NULL, err, errlen);
            for (int h = 0; h < 2; h++) {
                zt_tr_sp_chunk(r, buf + (size_t)h * T, T, b + h, r->B, inp);
                zt_tr_sp_chunk(r, buf + 2 * (size_t)T + (size_t)h * T, T, b + h, r->B, tgt);
            }
        }
        free(buf);
        return rc;
    }
    for (int b = 0; b < r->B && rc == 0; b++) {
        /* seg: whole rows, since attention runs over every position of a sequence (under
         * sequence parallelism too); pos: the positions of the tokens this rank runs */
        int32_t *sb = seg ? seg + (size_t)b * T : NULL;
        if (Tm == T) {
            rc = zt_data_read_row(ds, g0 + b, (uint64_t)r->cfg->data.seed, shuffle, inp + (size_t)b * T,
                                  tgt + (size_t)b * T, sb, pos ? pos + (size_t)b * T : NULL, err, errlen);
            continue;
        }
        /* sequence parallelism: the sp ranks of a row read it alike and take their chunk
         * (a packed row's segments stay whole: the model cuts them per chunk) */
        rc = zt_data_read_row(ds, g0 + b, (uint64_t)r->cfg->data.seed, shuffle, r->row_tmp, r->row_tmp + T, sb,
                              pos ? r->row_tmp + 2 * (size_t)T : NULL, err, errlen);
        zt_tr_sp_chunk(r, r->row_tmp, T, b, r->B, inp);
        zt_tr_sp_chunk(r, r->row_tmp + T, T, b, r->B, tgt);
        if (pos) zt_tr_sp_chunk(r, r->row_tmp + 2 * (size_t)T, T, b, r->B, pos);
    }
    return rc;
}

/* Targets that carry a loss among n */
long zt_tr_loss_tokens(const int32_t *tgt, size_t n)
{
    long k = 0;
    for (size_t i = 0; i < n; i++) k += tgt[i] >= 0;
    return k;
}

/* The residual stream of a micro-batch of T positions on this rank, what crosses a stage boundary:
 * (B, T, C), its rows split over tp under tp_sequence_parallel (zt_model_residual) */
size_t zt_tr_residual_floats(const run_t *r, int T) { return zt_model_residual_floats(r->model, r->B, T); }

/* pp > 1, inside begin/end_inference: the batch in r->inp / r->tgt forward through this
 * rank's stages in order, a stage's input received from the previous stage's rank and its
 * output sent on (tagged by the stage it leaves; no step's message is in flight then).
 * The loss (SFT: its sum over tokens) where this rank runs the head, 0 elsewhere. */
static double eval_stages(run_t *r, int sft)
{
    zt_comm_t *c = r->comm;
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    const zt_parallel_plan_t *p = &r->plan;
    const int L = r->table->dims.L, root = r->table->root_unit, head = zt_params_head_unit(r->table);
    const size_t n = zt_tr_residual_floats(r, r->Tm);
    float **out = zt_calloc((size_t)p->pp_v, sizeof *out);
    zt_request_t *req = zt_calloc((size_t)p->pp_v, sizeof *req);
    int nsend = 0;
    double loss = 0.0;
    zt_model_set_batch(m, r->inp, r->tgt, r->B, r->Tm);
    if (r->seg || r->pos) zt_model_set_segments(m, r->seg, r->pos);
    for (int st = c->pp.rank; st < p->stages; st += p->pp) {
        const int first = p->stage_first[st], end = p->stage_first[st + 1];
        if (first > 0) {
            zt_request_t rq = {.req = MPI_REQUEST_NULL};
            zt_irecv(c, &c->pp, zt_model_residual(m, first - 1), (st - 1) % p->pp, st - 1, n, ZT_F32, &rq);
            zt_wait(c, &rq);
        } else {
            zt_model_forward_embed(m, zt_shard_params(s, root));
            zt_shard_release(s, root);
        }
        zt_tr_forward_range(r, s, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1, 1);
        if (end == L + 2) {
            zt_model_forward_head(m, zt_shard_params(s, head));
            zt_shard_release(s, head);
            loss += sft ? zt_model_loss_sum(m) : zt_model_loss(m);
            continue;
        }
        /* from a copy: a later stage of this rank may write the model's buffer meanwhile */
        out[nsend] = r->be->alloc(n * sizeof(float));
        r->be->copy(out[nsend], zt_model_residual(m, end - 1), n * sizeof(float));
        req[nsend].req = MPI_REQUEST_NULL;
        zt_isend(c, &c->pp, out[nsend], (st + 1) % p->pp, st, n, ZT_F32, &req[nsend]);
        nsend++;
    }
    for (int k = 0; k < nsend; k++) {
        zt_wait(c, &req[k]);
        r->be->free(out[k]);
    }
    free(out);
    free(req);
    return loss;
}

float zt_tr_evaluate(run_t *r, int *failed)
{
    char err[ZT_ERRLEN] = "";
    int rc = 0;
    double sum = 0.0, count = 0.0;
    const int nb = r->cfg->train.eval_batches, sft = zt_data_is_sft(r->val);
    zt_shard_begin_inference(r->shard);
    for (int j = 0; j < nb; j++) {
        zt_watchdog_mark("evaluation", -1, r->step);
        int64_t g0 = (int64_t)j * r->dp * r->B + (int64_t)r->drank * r->B;
        if (rc == 0) rc = zt_tr_read_rows(r, r->val, g0, 0, r->inp, r->tgt, r->seg, r->pos, err, sizeof err);
        /* every rank runs the pass (zero3 gathers are collective) even after an error */
        if (r->plan.pp > 1) {
            sum += eval_stages(r, sft);
        } else {
            const float l = zt_tr_forward_only(r, r->inp, r->tgt, r->seg, r->pos, r->B, r->Tm);
            /* SFT: a mean over the tokens that carry a loss, as in training */
            sum += sft ? zt_model_loss_sum(r->model) : l;
        }
        count += (double)zt_tr_loss_tokens(r->tgt, (size_t)r->B * r->Tm);
    }
    zt_shard_end_inference(r->shard);
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        *failed = 1;
        return NAN;
    }
    /* over the data group: each sequence once (tp ranks hold the same losses); under a
     * pipeline the loss is the last stage's (the others add 0) */
    sum = zt_sum_double(r->comm, &r->comm->data, sum);
    if (r->plan.pp > 1) sum = zt_sum_double(r->comm, &r->comm->pp, sum);
    if (sft) {
        count = zt_sum_double(r->comm, &r->comm->data, count);
        return (float)(count > 0 ? sum / count : 0.0);
    }
    return (float)(sum / ((double)nb * r->comm->data.size)); /* each a mean of B Tm tokens */
}

/* ---- end of run: sample and loss plot ------------------------------------------ */

/* Generation's forward of one batch (B, T) under a pipeline: the stages in order, each on
 * its rank, the residual stream passed from stage to stage (the KV cache of a block is
 * on the rank whose stage holds it); at pp 1 forward_blocks. Returns the head's unit
 * (zt_params_head_unit) gathered on the last stage's rank, which runs the head
 * (gen_last_stage) and releases it, NULL elsewhere. */
static const float *gen_forward(run_t *r, const int32_t *inp, const int32_t *pos, int B, int T)
{
    if (r->plan.pp == 1) return zt_tr_forward_blocks(r, inp, NULL, NULL, pos, B, T);
    zt_comm_t *c = r->comm;
    zt_shard_t *s = r->shard;
    zt_model_t *m = r->model;
    const zt_param_table_t *t = r->table;
    const int L = t->dims.L, S = r->steps.stages, me = c->pp.rank;
    const zt_model_dims_t *d = &r->ltable->dims;
    const size_t n = (size_t)B * T / (d->tp_seq ? (size_t)d->tp_size : 1) * (size_t)d->C;
    zt_model_set_batch(m, inp, NULL, B, T);
    if (pos) zt_model_set_segments(m, NULL, pos);
    /* the embedding's unit on the first stage's rank, the head's (the root again when tied)
     * on the last's: each gathered where it runs, the head's kept for the caller */
    const int head = zt_params_head_unit(t), last = zt_schedule_stage_rank(&r->steps, S - 1) == me;
    const float *root = NULL;
    for (int st = me; st < S; st += r->plan.pp) {
        const int first = r->plan.stage_first[st], end = r->plan.stage_first[st + 1];
        zt_request_t q;
        if (first > 0) {
            zt_irecv(c, &c->pp, zt_model_residual(m, first - 1), (st - 1) % r->plan.pp, st, n, ZT_F32, &q);
            zt_wait(c, &q);
        }
        if (first == 0) {
            zt_model_forward_embed(m, zt_shard_params(s, t->root_unit));
            zt_shard_release(s, t->root_unit);
        }
        zt_tr_forward_range(r, s, m, ZT_MAX(first, 1) - 1, ZT_MIN(end, L + 1) - 1, 1);
        if (st < S - 1) {
            zt_isend(c, &c->pp, zt_model_residual(m, end - 1), (st + 1) % r->plan.pp, st + 1, n, ZT_F32, &q);
            zt_wait(c, &q);
        }
    }
    if (last) root = zt_shard_params(s, head);
    return root;
}

/* whether this rank runs the head in generation: the last stage's (every rank at pp 1) */
int zt_tr_gen_last_stage(const run_t *r)
{
    return zt_schedule_stage_rank(&r->steps, r->steps.stages - 1) == r->comm->pp.rank;
}

/* a generated row's logits (V), from the last stage's rank to the pipeline's others */
static void gen_share_logits(run_t *r, float *logits)
{
    if (r->plan.pp > 1)
        zt_bcast(r->comm, &r->comm->pp, logits, (size_t)r->table->dims.V, ZT_F32,
                 zt_schedule_stage_rank(&r->steps, r->steps.stages - 1));
}

/* the KV cache's slot holds tokens[0, n - 1): a forward of the last token alone continues it */
static int extends_cached(const run_t *r, int slot, const int32_t *tokens, int n)
{
    const int k = r->kv_n[slot];
    return n == k + 1 && !memcmp(tokens, r->kv_tok + (size_t)slot * r->T, (size_t)k * sizeof *tokens);
}

/* The logits of the last of n tokens of one sequence (KV cache slot `slot`) into logits
 * (V) over units the shard engine gathers. Every rank of the model's tp x sp group calls
 * it with the same tokens; logits NULL: a rank that needs none. Under sequence
 * parallelism or tp_sequence_parallel the tokens are padded at the end to whole shares
 * (attention is causal: what follows position n - 1 leaves its logits alone), each rank
 * runs its chunk, the ranks that hold position n - 1 run the head on that row alone, and
 * the other sp ranks get its logits by broadcast. With the KV cache (generation_begin) a
 * call that adds one token to the slot's tokens runs that token alone. */
static void seq_logits(run_t *r, int slot, const int32_t *tokens, int n, float *logits)
{
    zt_watchdog_mark("generation", -1, r->step);
    const zt_model_dims_t *d = &r->ltable->dims;
    const int sp = r->comm->mesh_sp, q = r->plan.gen_quantum;
    const int np = (n + q - 1) / q * q, Tl = np / sp;
    const int32_t *mine = tokens;
    int owner = 0, t = n - 1;
    if (q > 1) {
        int32_t *row = r->row_tmp, *chunk = r->row_tmp + r->T; // (T) padded, (T / sp) this rank's
        memcpy(row, tokens, (size_t)n * sizeof *row);
        for (int k = n; k < np; k++) row[k] = tokens[n - 1];
        mine = row;
        if (sp > 1) {
            zt_tr_sp_chunk(r, row, np, 0, 1, chunk);
            mine = chunk;
            if (d->sp_ring) {
                /* chunk k of 2 sp holds position n - 1: rank k's first half, or the second
                 * half of the rank the chunk rule (its own inverse) gives */
                const int c = Tl / 2, k = (n - 1) / c, h = k >= sp;
                owner = zt_model_ring_chunk(sp, k, h);
                t = h * c + (n - 1) % c;
            } else {
                owner = (n - 1) / Tl;
                t = (n - 1) % Tl;
            }
        }
    }
    /* the KV cache (never with q > 1): a sequence that extends the cached one by a token
     * runs that token alone at its position; any other starts the cache again */
    int past = 0;
    if (r->kv_on) {
        int32_t *held = r->kv_tok + (size_t)slot * r->T;
        if (extends_cached(r, slot, tokens, n)) past = r->kv_n[slot];
        memcpy(held + past, tokens + past, (size_t)(n - past) * sizeof *tokens);
        for (int k = past; k < n; k++) r->kv_pos[k - past] = k;
        r->kv_n[slot] = n;
        zt_model_kv_seq(r->model, slot, past);
        mine = tokens + past;
        t = n - past - 1;
    }
    const float *root = gen_forward(r, mine, r->kv_on ? r->kv_pos : NULL, 1, q > 1 ? Tl : n - past);
    /* under tp the row is gathered from every tp rank, under sp and pp broadcast: all take part */
    if (!logits && (r->comm->mesh_tp > 1 || sp > 1 || r->plan.pp > 1)) logits = r->tp_logits;
    if (zt_tr_gen_last_stage(r)) {
        if (r->comm->sp.rank == owner) {
            zt_model_forward_head_row(r->model, root, 0, t);
            if (logits) zt_model_logits_row(r->model, 0, t, logits);
        }
        if (sp > 1) zt_bcast(r->comm, &r->comm->sp, logits, (size_t)r->table->dims.V, ZT_F32, owner);
    }
    if (root) zt_shard_release(r->shard, zt_params_head_unit(r->table));
    gen_share_logits(r, logits);
}

/* zt_sample_logits_fn: one sequence, the cache's first slot */
static void last_logits(void *arg, const int32_t *tokens, int n, float *logits)
{
    seq_logits(arg, 0, tokens, n, logits);
}

/* Batched generation (zt_generate_logits_fn): the logits (G, V) of the last tokens of G
 * sequences; n[b] = 0: row b has nothing to run. Without the cache each row runs as
 * one sequence (a row with nothing runs one token, so that every rank runs as many
 * forwards). With it, a row that is not its slot's cached tokens plus one runs whole
 * into its slot, and then the rows that add a token to theirs run those tokens as one
 * batch (1, rows), each attending to its own cache (zt_model_kv_rows): every weight is
 * read once for all of them. The data-parallel ranks agree how many whole runs and
 * whether a batch follow, so that every forward (and the gathers in it) is the same on
 * all; a rank with fewer runs one token into the spare slot. */
void zt_tr_batch_logits(void *arg, int G, const int32_t *const *tokens, const int *n, float *logits)
{
    run_t *r = arg;
    const size_t V = (size_t)r->table->dims.V;
    const int32_t none = 0;
    if (!r->kv_on || r->kv_nseq < 2) {
        for (int b = 0; b < G; b++) seq_logits(r, 0, n[b] ? tokens[b] : &none, n[b] ? n[b] : 1, logits + b * V);
        return;
    }
    if (G > r->kv_nseq - 1) zt_fatal("generation: %d sequences at once, the KV cache holds %d", G, r->kv_nseq - 1);
    const int spare = r->kv_nseq - 1;
    int whole = 0, add = 0;
    for (int b = 0; b < G; b++) {
        if (!n[b]) continue;
        if (extends_cached(r, b, tokens[b], n[b])) add++;
        else whole++;
    }
    zt_group_t *dg = &r->comm->data;
    const int whole_all = (int)zt_max_double(r->comm, dg, whole), add_any = zt_max_double(r->comm, dg, add) > 0;
    for (int b = 0; b < G; b++)
        if (n[b] && !extends_cached(r, b, tokens[b], n[b])) seq_logits(r, b, tokens[b], n[b], logits + b * V);
    for (int k = whole; k < whole_all; k++) seq_logits(r, spare, &none, 1, NULL);
    if (!add_any) return;
    /* one token per extended row, at its position, into its slot */
    int32_t *inp = r->kv_inp;
    int nd = 0;
    for (int b = 0; b < G; b++) {
        if (!n[b] || r->kv_n[b] != n[b] - 1) continue; /* a whole run just made kv_n[b] = n[b] */
        inp[nd] = tokens[b][n[b] - 1];
        r->kv_pos[nd] = r->kv_past[nd] = n[b] - 1;
        r->kv_slot[nd++] = b;
        r->kv_tok[(size_t)b * r->T + n[b] - 1] = tokens[b][n[b] - 1];
        r->kv_n[b] = n[b];
    }
    if (!nd) inp[nd] = 0, r->kv_pos[nd] = r->kv_past[nd] = 0, r->kv_slot[nd++] = spare;
    zt_watchdog_mark("generation", -1, r->step);
    zt_model_kv_rows(r->model, nd, r->kv_slot, r->kv_past);
    const float *root = gen_forward(r, inp, r->kv_pos, 1, nd);
    const int hr = zt_model_head_rows_kept(r->model);
    for (int i0 = 0; i0 < nd && zt_tr_gen_last_stage(r); i0 += hr) {
        const int rows = ZT_MIN(hr, nd - i0);
        zt_model_forward_head_rows(r->model, root, 0, i0, rows);
        for (int i = i0; i < i0 + rows; i++)
            if (r->kv_slot[i] != spare) zt_model_logits_row(r->model, 0, i, logits + (size_t)r->kv_slot[i] * V);
    }
    if (root) zt_shard_release(r->shard, zt_params_head_unit(r->table));
    for (int i = 0; i < nd; i++)
        if (r->kv_slot[i] != spare) gen_share_logits(r, logits + (size_t)r->kv_slot[i] * V);
}

/* Around generation: the shard engine's inference mode, and the KV cache where it
 * applies (without sequence parallelism or tp_sequence_parallel) for `batch` sequences
 * at once (at most data.seq_len: the batch of their new tokens is one row) */
void zt_tr_generation_begin(run_t *r, int batch)
{
    zt_shard_begin_inference(r->shard);
    r->gen_batch = zt_tr_gen_batch_of(batch, r->T);
    r->kv_nseq = zt_tr_kv_sequences(r->cfg, r->comm->mesh_sp, r->ltable->dims.tp_seq, r->gen_batch);
    r->kv_on = r->kv_nseq > 0;
    if (!r->kv_on) return;
    zt_model_kv_cache(r->model, r->kv_nseq);
    r->kv_tok = zt_malloc((size_t)r->kv_nseq * r->T * sizeof *r->kv_tok);
    r->kv_pos = zt_malloc((size_t)r->T * sizeof *r->kv_pos);
    r->kv_n = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_n);
    r->kv_slot = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_slot);
    r->kv_past = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_past);
    r->kv_inp = zt_calloc((size_t)r->kv_nseq, sizeof *r->kv_inp);
}

void zt_tr_generation_end(run_t *r)
{
    if (r->kv_on) {
        zt_model_kv_cache(r->model, 0);
        free(r->kv_tok);
        free(r->kv_pos);
        free(r->kv_n);
        free(r->kv_slot);
        free(r->kv_past);
        free(r->kv_inp);
        r->kv_tok = r->kv_pos = r->kv_inp = NULL;
        r->kv_n = r->kv_slot = r->kv_past = NULL;
        r->kv_on = 0;
        r->kv_nseq = 0;
    }
    zt_shard_end_inference(r->shard);
}

void zt_tr_generate_sample(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    if (cfg->train.sample_tokens <= 0) return;
    const int q = r->plan.gen_quantum;
    if (r->T % q) {
        zt_log("sample: skipped (data.seq_len %d does not split into whole shares of %d tokens for the mesh)", r->T,
               q);
        return;
    }
    zt_tokenizer_t *tok = zt_sample_tokenizer(zt_data_tokenizer(r->train), cfg->data.tokenizer,
                                              cfg->data.vocab_file, cfg->data.merges_file, cfg->model.name_or_path);
    const zt_sample_opts_t o = {
        .tokens = cfg->train.sample_tokens, .context = r->T, .vocab_size = cfg->model.vocab_size,
        .temperature = ZT_SAMPLE_TEMPERATURE, .seed = (uint64_t)cfg->train.seed,
        .prompt = cfg->train.sample_prompt, .eot = zt_data_eot_token(r->train),
    };
    zt_sample_t smp;
    zt_tr_generation_begin(r, 1);
    zt_sample_generate(&o, tok, last_logits, r, r->comm, &smp);
    zt_tr_generation_end(r);
    if (r->rank == 0) zt_sample_print(&o, tok, &smp, stdout);
    zt_sample_free(&smp);
    zt_tokenizer_close(tok);
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

/* ---- checkpoints ---------------------------------------------------------------- */

int zt_tr_save_checkpoint(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    zt_ckpt_meta_t meta;
    memset(&meta, 0, sizeof meta);
    meta.step = r->step;
    meta.tokens_seen = r->tokens_seen;
    meta.samples_seen = r->samples_seen;
    meta.adam_step = zt_shard_adam_step(r->shard);
    meta.world_size = r->comm->world.size;
    snprintf(meta.strategy, sizeof meta.strategy, "%s", zt_strategy_name(r->sopts.strategy));
    meta.data_seed = cfg->data.seed;
    meta.shuffle = cfg->data.shuffle;
    meta.lr = (float)cfg->optim.learning_rate;
    meta.beta1 = (float)cfg->optim.adam_beta1;
    meta.beta2 = (float)cfg->optim.adam_beta2;
    meta.eps = (float)cfg->optim.adam_epsilon;
    meta.weight_decay = (float)cfg->optim.weight_decay;
    if (cfg->train.fp16) {
        meta.loss_scale = r->loss_scale;
        meta.loss_scale_good_steps = r->good_steps;
    }
    char err[ZT_ERRLEN] = "";
    zt_watchdog_mark("checkpoint save", -1, r->step);
    if (zt_ckpt_save(cfg->train.output_dir, &meta, r->config_text, cfg->checkpoint.format == ZT_CKPT_SHARDED,
                     cfg->checkpoint.keep_last, r->shard, r->table, r->comm, err, sizeof err) != 0) {
        zt_log_error("checkpoint at step %ld failed: %s", r->step, err);
        return -1;
    }
    char b[32];
    zt_log("checkpoint: step %ld saved to %s (%s in %.2f s, %.1f MB/s)", r->step,
           cfg->train.output_dir, zt_fmt_bytes(meta.bytes, b, sizeof b), meta.save_seconds,
           meta.save_seconds > 0 ? meta.bytes / meta.save_seconds / 1e6 : 0.0);
    return 0;
}

/* checkpoint.save_hf: <output_dir>/hf (a LoRA run's merged model), every rank writing
 * what it owns; adapter: <output_dir>/adapter, PEFT's directory */
int zt_tr_save_hf(run_t *r, int adapter)
{
    const zt_config_t *cfg = r->cfg;
    char dir[ZT_STRLEN + 8], err[ZT_ERRLEN] = "";
    snprintf(dir, sizeof dir, "%s/%s", cfg->train.output_dir, adapter ? "adapter" : "hf");
    zt_watchdog_mark(adapter ? "PEFT export" : "HF export", -1, r->step);
    double sec = 0;
    if (zt_hf_model_save(dir, cfg, r->shard, r->table, adapter, zt_data_eot_token(r->train), r->comm, &sec, err,
                         sizeof err) != 0) {
        zt_log_error("%s export failed: %s", adapter ? "PEFT" : "HF", err);
        return -1;
    }
    if (adapter)
        zt_log("PEFT export: %s (LoRA r=%d, scale %g, adapters of %s, %.2f s)", dir, r->table->lora_rank,
               (double)r->table->lora_scale, cfg->model.name_or_path[0] ? cfg->model.name_or_path : "this run's base",
               sec);
    else
        zt_log("HF export: %s (%s%s, %.2f s)", dir, r->table->arch->hf_class,
               r->table->first_adapter_unit >= 0 ? ", LoRA merged" : "", sec);
    return 0;
}

int zt_tr_maybe_resume(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    char path[ZT_STRLEN] = "", err[ZT_ERRLEN] = "";
    int weights_only = 0;
    if (strcmp(cfg->checkpoint.resume, "auto") == 0) {
        int found = 0;
        if (r->rank == 0) found = zt_ckpt_find_latest(cfg->train.output_dir, path, sizeof path) == 0;
        zt_bcast(r->comm, &r->comm->world, &found, 1, ZT_I32, 0);
        zt_bcast(r->comm, &r->comm->world, path, sizeof path, ZT_U8, 0);
        if (!found) path[0] = 0;
    } else if (strcmp(cfg->checkpoint.resume, "none") != 0) {
        snprintf(path, sizeof path, "%s", cfg->checkpoint.resume);
    }
    if (!path[0] && cfg->model.init_from[0]) {
        snprintf(path, sizeof path, "%s", cfg->model.init_from);
        weights_only = 1;
    }
    /* a resumed run has its weights in the checkpoint, a fresh one from the directory;
     * a LoRA checkpoint holds only the adapters, so its base comes from the directory */
    const int lora = r->table->first_adapter_unit >= 0;
    if (cfg->model.name_or_path[0] && (!path[0] || lora)) {
        zt_watchdog_mark("model load", -1, 0);
        double t0 = zt_now(), bytes = 0;
        if (zt_hf_model_load(cfg->model.name_or_path, r->shard, r->table, r->comm, &bytes, err, sizeof err)) {
            zt_log_error("%s", err);
            return -1;
        }
        const double dt = zt_max_double(r->comm, &r->comm->world, zt_now() - t0);
        char b[32];
        zt_log("model: weights of %s loaded (%s read by %d ranks in %.2f s, %.1f MB/s); fresh optimizer",
               cfg->model.name_or_path, zt_fmt_bytes(bytes, b, sizeof b), r->comm->world.size, dt,
               dt > 0 ? bytes / dt / 1e6 : 0.0);
        char q[256];
        zt_qlora_describe(r->table, q, sizeof q);
        if (zt_qlora_count(r->table)) {
            /* what the load held at its peak (a 4-bit base: each rank's share of the float32
             * values it quantizes), beside what the rank keeps */
            const double grown = zt_max_double(r->comm, &r->comm->world, (double)zt_peak_rss() - (double)r->rss0);
            zt_log("qlora: %s; peak RSS by the end of the load %s above the process before the model (max over "
                   "ranks)", q, zt_fmt_bytes(grown, b, sizeof b));
        }
    }
    if (!path[0] && cfg->lora.adapter_name_or_path[0]) {
        if (zt_hf_model_load_adapter(cfg->lora.adapter_name_or_path, r->shard, r->table, r->comm, err, sizeof err)) {
            zt_log_error("%s", err);
            return -1;
        }
        zt_log("lora: adapters of %s loaded", cfg->lora.adapter_name_or_path);
    }
    if (!path[0]) return 0;
    zt_ckpt_meta_t meta;
    memset(&meta, 0, sizeof meta);
    zt_watchdog_mark("checkpoint load", -1, 0);
    if (zt_ckpt_load(path, &meta, weights_only, r->shard, r->table, r->comm, err, sizeof err) != 0) {
        zt_log_error("%s", err);
        return -1;
    }
    char b[32];
    if (weights_only) {
        zt_log("init_from: weights of %s loaded (%s in %.2f s); fresh optimizer", path,
               zt_fmt_bytes(meta.bytes, b, sizeof b), meta.load_seconds);
        return 0;
    }
    r->step = meta.step;
    r->samples_seen = meta.samples_seen;
    r->tokens_seen = meta.tokens_seen;
    /* a dynamic loss scale continues where it was (a static one is the config's) */
    if (r->dynamic_scale && meta.loss_scale > 0) {
        r->loss_scale = meta.loss_scale;
        r->good_steps = meta.loss_scale_good_steps;
        zt_log("resumed fp16 loss scale %.9g (%ld steps since the last change)", r->loss_scale, r->good_steps);
    }
    zt_log("resumed from %s: step %ld, %.0f tokens seen, saved by %d ranks with %s (%s in %.2f s, %.1f MB/s)",
           path, meta.step, meta.tokens_seen, meta.world_size, meta.strategy,
           zt_fmt_bytes(meta.bytes, b, sizeof b), meta.load_seconds,
           meta.load_seconds > 0 ? meta.bytes / meta.load_seconds / 1e6 : 0.0);
    return 0;
}

/* ---- start-up report -------------------------------------------------------------- */

void zt_tr_startup_report(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    zt_comm_t *c = r->comm;
    /* rank -> host map */
    char host[64] = "";
    snprintf(host, sizeof host, "%s", zt_hostname());
    char *all = r->rank == 0 ? zt_malloc((size_t)c->world.size * 64) : NULL;
    ZT_MPI(MPI_Gather(host, 64, MPI_CHAR, all, 64, MPI_CHAR, 0, c->world.comm));
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
    zt_log("traffic per step (estimate): %s of collective buffers", zt_fmt_bytes(e.traffic, b[0], 32));
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
        .traffic_estimate = e.traffic, .mem = &e.mem, .activations = e.activations,
        .ref = zt_tr_has_ref_copy(r->cfg) ? &e.ref : NULL, .total = e.total,
    };
    zt_metrics_record_start(&rec);
}

/* ---- the loop ----------------------------------------------------------------------- */

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
    static const char *gnames[ZT_GRP_N] = {"world", "shard", "replica", "tp", "sp", "data", "pp"};
    o = 0;
    for (int k = 0; k < ZT_GRP_N; k++)
        if (t->group_calls[k])
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%s %ld calls %.0f bytes", o ? "; " : "", gnames[k],
                                  t->group_calls[k], t->group_bytes[k]);
    if (o) zt_log("communication by group (rank 0, training steps): %s", line);
}

/* fp16 dynamic loss scaling after an overflow (a collective verdict): halve the
 * scale on every rank, or stop when that would take it below the minimum. */
int zt_tr_loss_scale_overflow(run_t *r)
{
    const double S = r->loss_scale, next = S / 2;
    if (next < r->cfg->train.min_loss_scale) {
        zt_log_error("step %ld: gradient overflow at loss scale %.9g, and halving it would go below "
                     "train.min_loss_scale (%.9g); stopping", r->step + 1, S, r->cfg->train.min_loss_scale);
        return -1;
    }
    zt_log("step %ld: gradient overflow, loss scale %.9g -> %.9g", r->step + 1, S, next);
    r->loss_scale = next;
    return 0;
}

/* A frozen reference model, as LLaMA-Factory loads one (pref.ref_model, or with full
 * fine-tuning a second copy of model_name_or_path): the base model's table on this rank
 * (without LoRA's adapter units) with every unit frozen, an engine of its own (parameters
 * only, sharded as the strategy shards frozen units), the directory's weights, which must
 * have the model's shapes. A resumed run loads them again, as LLaMA-Factory does. */
int zt_tr_ref_create(run_t *r)
{
    const char *dir = r->cfg->pref.ref_model[0] ? r->cfg->pref.ref_model : r->cfg->model.name_or_path;
    char err[ZT_ERRLEN] = "";
    zt_param_table_t *t = zt_tr_ref_table_of(r->table, r->comm->mesh_tp, r->comm->tp.rank, err, sizeof err);
    int rc = t ? 0 : -1;
    if (t) {
        r->ref_table = t;
        r->ref_shard = zt_shard_create(t, r->comm, r->be, &r->sopts);
        double bytes = 0;
        /* the global table: names and whole shapes; the base parameters are its first ones */
        rc = zt_hf_model_load(dir, r->ref_shard, r->table, r->comm, &bytes, err, sizeof err);
    }
    if (zt_agree_error(r->comm, rc, err, sizeof err)) {
        zt_log_error("dpo reference: %s", err);
        return -1;
    }
    zt_shard_mem_t mem;
    zt_shard_memory(r->ref_shard, &mem);
    char b[32];
    zt_log("dpo: the reference is a frozen copy of %s (%s of parameters per rank)", dir,
           zt_fmt_bytes((double)(mem.params + mem.host), b, sizeof b));
    return 0;
}

static int run_loop(run_t *r)
{
    const zt_config_t *cfg = r->cfg;
    zt_comm_t *c = r->comm;
    const int fault = cfg->fault.kind;
    if (fault == ZT_FAULT_SAVE_KILL) zt_ckpt_fault_save_kill(cfg->fault.rank, cfg->fault.step);
    const size_t BT = (size_t)r->B * r->Tm, BTs = (size_t)r->B * r->T; /* BTs: a micro-step's segments */
    char err[ZT_ERRLEN];
    /* a token stream: every position carries a loss */
    const int sft = zt_data_is_sft(r->train);
    float dscale = 1.0f / (float)((double)BT * r->A * r->comm->data.size);
    double t_start = zt_now(), t_window = t_start;
    long window_steps = 0;
    double window_computed = 0; /* positions the window's steps computed, over the data ranks (MFU) */
    /* train.stage = dpo: the preference metrics summed over the logging window's
     * micro-steps (LLaMA-Factory averages what it stored since its last log) */
    const int dpo = cfg->train.stage == ZT_STAGE_DPO;
    double pref_window[ZT_PREF_NMETRICS] = {0};
    long pref_micros = 0;
    zt_comm_stats_reset(c);

    while (r->step < r->total_steps) {
        /* step boundary: signals are agreed before anyone acts */
        zt_watchdog_mark("step boundary", -1, r->step + 1);
        if (zt_any(c, zt_signal_pending())) {
            zt_log("signal received: checkpointing at step %ld and stopping (exit %d)", r->step, ZT_EXIT_SIGNAL);
            if (zt_tr_save_checkpoint(r) != 0) return ZT_EXIT_ERROR;
            return ZT_EXIT_SIGNAL;
        }
        int injected = zt_fault_check(fault, cfg->fault.rank, cfg->fault.step, r->rank, r->step + 1);

        /* read this rank's rows of every micro-step, then agree on errors */
        int rc = 0;
        err[0] = 0;
        for (int m = 0; m < r->A && rc == 0; m++) {
            int64_t g0 = r->samples_seen + (int64_t)m * r->dp * r->B + (int64_t)r->drank * r->B;
            rc = zt_tr_read_rows(r, r->train, g0, cfg->data.shuffle, r->inp + m * BT, r->tgt + m * BT,
                           r->seg ? r->seg + m * BTs : NULL, r->pos ? r->pos + m * BT : NULL, err, sizeof err);
        }
        if (injected == ZT_FAULT_DATA)
            rc = zt_err(err, sizeof err, "fault injection: data error on rank %d at step %ld", r->rank, r->step + 1);
        if (zt_agree_error(c, rc, err, sizeof err)) {
            zt_log_error("%s", err);
            return ZT_EXIT_ERROR;
        }

        /* SFT: the loss is the mean over the tokens that carry one in the whole global
         * batch, counted across ranks and micro-steps (transformers' num_items_in_batch),
         * so world size and accumulation do not change it */
        double count = (double)BT * r->A * c->data.size;
        if (sft && !dpo) {
            count = zt_sum_double(c, &c->data, (double)zt_tr_loss_tokens(r->tgt, BT * (size_t)r->A));
            dscale = count > 0 ? (float)(1.0 / count) : 0.0f;
        }
        double t0 = zt_now();
        zt_shard_begin_step(r->shard);
        long computed = 0; /* this rank's row positions, padding trimmed (trim_padding) */
        /* the injected NaN enters through the gradient scale, so only the gradients
         * (not the loss) carry it: the path a real overflow takes */
        const float ds = injected == ZT_FAULT_NAN ? NAN : (float)(dscale * r->loss_scale);
        /* dpo: each micro-batch's mean over its pairs, averaged over micro-steps and data-parallel
         * replicas (the sp ranks of a replica each add their tokens' part of one gradient) */
        const float pf = injected == ZT_FAULT_NAN ? NAN : (float)(r->loss_scale / ((double)r->A * r->dp));
        zt_watchdog_mark("pipeline", -1, r->step + 1);
        double loss_sum = r->plan.pp > 1 ? zt_tr_run_pipeline(r, sft, ds, pf, pref_window, &pref_micros, &computed)
                                         : zt_tr_run_schedule(r, sft, ds, pf, pref_window, &pref_micros, &computed);
        /* MFU counts the work done: the trimmed rows of every data rank (sp ranks hold parts
         * of the same rows, tp ranks the same rows) */
        window_computed += sft ? zt_tr_step_sum(r, (double)computed) * r->comm->mesh_sp
                               : (double)r->G * r->T;
        zt_watchdog_mark("gradient reduction", -1, r->step + 1);
        double norm2 = zt_shard_finish_grads(r->shard);
        double loss = sft && !dpo ? zt_tr_step_sum(r, loss_sum) / (count > 0 ? count : 1.0)
                                  : zt_tr_step_sum(r, loss_sum) / ((double)r->A * c->data.size);
        /* a NaN or Inf in any gradient reaches norm2: it is a sum of squares over every
         * owned element, reduced over the shard group, after the gradient reduction has
         * spread it to every replica */
        int bad = !isfinite(loss_sum) || !isfinite(norm2);
        if (zt_any(c, bad)) {
            /* a finite loss (the world's sum: the same verdict everywhere) with a
             * non-finite gradient is an fp16 overflow */
            const int overflow = r->dynamic_scale && isfinite(loss);
            if (overflow || cfg->parallel.nonfinite == ZT_NONFINITE_SKIP) {
                zt_metrics_record_skipped(r->step + 1, overflow ? "overflow" : "nonfinite", r->loss_scale, zt_now() - t_start);
                if (overflow && zt_tr_loss_scale_overflow(r) != 0) return ZT_EXIT_NONFINITE;
                if (!overflow)
                    zt_log("step %ld: non-finite loss or gradient; step skipped (parallel.nonfinite = skip)", r->step + 1);
                r->good_steps = 0;
                zt_shard_zero_grads(r->shard);
                r->samples_seen += r->G;
                r->step++;
                window_steps++; /* its time is in the window: so are its tokens (processed, not learnt) */
                goto step_end; /* a skipped step still evaluates and checkpoints on schedule */
            }
            zt_log_error("step %ld: non-finite loss or gradient (loss %g); stopping (parallel.nonfinite = abort)",
                         r->step + 1, loss);
            return ZT_EXIT_NONFINITE;
        }
        const long adam_t = zt_shard_adam_step(r->shard); /* optimizer steps so far */
        const double S = r->loss_scale, norm = sqrt(norm2) / S;
        double lr = zt_lr_at(&r->sched, adam_t);
        zt_adamw_hp_t hp = {
            .lr = (float)lr, .beta1 = (float)cfg->optim.adam_beta1, .beta2 = (float)cfg->optim.adam_beta2,
            .eps = (float)cfg->optim.adam_epsilon, .weight_decay = (float)cfg->optim.weight_decay,
            .grad_scale = (float)(zt_clip_scale(norm, cfg->optim.max_grad_norm) / S),
            .step = adam_t + 1,
        };
        zt_watchdog_mark("optimizer", -1, r->step + 1);
        zt_shard_optimizer_step(r->shard, &hp);
        double dt = zt_now() - t0;
        r->train_seconds += dt;
        r->samples_seen += r->G;
        r->tokens_seen += (double)r->G * r->T;
        r->step++;
        window_steps++;
        r->last_loss = (float)loss;
        if (r->dynamic_scale && ++r->good_steps == cfg->train.loss_scale_window) {
            zt_log("step %ld: %d steps without overflow, loss scale %.9g -> %.9g", r->step,
                   cfg->train.loss_scale_window, S, 2 * S);
            r->loss_scale = 2 * S;
            r->good_steps = 0;
        }

        if (r->step % cfg->train.logging_steps == 0 || r->step == r->total_steps || r->step == 1) {
            double now = zt_now(), wdt = now - t_window;
            double tps = (double)window_steps * r->G * r->T / wdt;
            double flops = window_computed / wdt * r->flops_per_token;
            double eta = (double)(r->total_steps - r->step) * wdt / (double)window_steps;
            char etab[32], memb[32];
            zt_tr_format_eta(eta, etab, sizeof etab);
            zt_fmt_bytes((double)zt_current_rss(), memb, sizeof memb);
            char scaleb[48] = "";
            if (cfg->train.fp16) snprintf(scaleb, sizeof scaleb, " | scale %.9g", S);
            /* the preference metrics: means over the window's micro-steps and the data ranks */
            double pref[ZT_PREF_NMETRICS];
            char prefb[768] = "";
            const int npref = dpo ? zt_pref_nmetrics(cfg->pref.fn.loss) : 0;
            /* under a pipeline the last stage's ranks hold them: step_sum adds the others' 0 */
            const double nmicro = zt_tr_step_sum(r, (double)pref_micros);
            for (int k = 0; k < npref; k++) {
                pref[k] = zt_tr_step_sum(r, pref_window[k]) / (nmicro > 0 ? nmicro : 1.0);
                const size_t at = strlen(prefb);
                snprintf(prefb + at, sizeof prefb - at, " | %s %.4f", zt_pref_metric_name(k), pref[k]);
            }
            memset(pref_window, 0, sizeof pref_window);
            pref_micros = 0;
            zt_log("step %5ld/%ld | loss %.4f%s | lr %.2e | norm %.4f%s | %.0f tok/s | %.3f TFLOP/s | MFU %.1f%% | mem %s | ETA %s",
                   r->step, r->total_steps, loss, prefb, lr, norm, scaleb, tps, flops / 1e12,
                   100.0 * flops / r->peak_flops, memb, etab);
            const zt_metrics_step_t rec = {
                .step = r->step, .loss = loss, .lr = lr, .grad_norm = norm, .loss_scale = S,
                .tokens_per_s = tps, .tflops = flops / 1e12, .mfu = flops / r->peak_flops,
                .elapsed_s = now - t_start, .step_s = wdt / window_steps, .tokens_seen = r->tokens_seen,
                .rss_bytes = zt_current_rss(), .comm = zt_comm_stats(c), .npref = npref, .pref = pref,
            };
            zt_metrics_record_step(&rec);
            zt_tr_hist_push(&r->train_hist, r->step, (float)loss);
            if (dpo) zt_tr_hist_push(&r->margin_hist, r->step, (float)pref[ZT_PREF_REWARDS_MARGINS]);
            zt_tr_fold_comm(r);
            t_window = zt_now();
            window_steps = 0;
            window_computed = 0;
        }
    step_end:;
        int last = r->step == r->total_steps;
        if (r->val && ((cfg->train.eval_steps > 0 && r->step % cfg->train.eval_steps == 0) || last)) {
            zt_tr_fold_comm(r); /* keep the training traffic, then discard the evaluation's */
            int failed = 0;
            float vl = zt_tr_evaluate(r, &failed);
            if (failed) return ZT_EXIT_ERROR;
            r->last_val = vl;
            zt_log("step %5ld/%ld | validation loss %.4f", r->step, r->total_steps, vl);
            zt_metrics_record_eval(r->step, vl, zt_now() - t_start);
            zt_tr_hist_push(&r->val_hist, r->step, vl);
            t_window = zt_now();
            window_steps = 0;
            window_computed = 0;
            zt_comm_stats_reset(c);
        }
        if (cfg->generate.at_eval && ((cfg->train.eval_steps > 0 && r->step % cfg->train.eval_steps == 0) || last)) {
            /* the evaluation prompts, completed with the model as it is now */
            zt_tr_fold_comm(r);
            char name[64];
            snprintf(name, sizeof name, "generations-%ld.jsonl", r->step);
            zt_tr_generation_begin(r, cfg->generate.batch_size);
            const int grc = zt_generate_run(cfg, name, r->T, r->gen_batch, r->table->dims.V, zt_tr_batch_logits, r, c, err,
                                            sizeof err);
            zt_tr_generation_end(r);
            if (grc) {
                zt_log_error("%s", err);
                return ZT_EXIT_ERROR;
            }
            zt_log("step %5ld/%ld | generations: %s/%s", r->step, r->total_steps, cfg->train.output_dir, name);
            t_window = zt_now();
            window_steps = 0;
            window_computed = 0;
            zt_comm_stats_reset(c);
        }
        if ((cfg->checkpoint.save_steps > 0 && r->step % cfg->checkpoint.save_steps == 0 && !last) ||
            (last && cfg->checkpoint.save_at_end)) {
            zt_tr_fold_comm(r);
            if (zt_tr_save_checkpoint(r) != 0) return ZT_EXIT_ERROR;
            t_window = zt_now();
            window_steps = 0;
            window_computed = 0;
            zt_comm_stats_reset(c);
        }
    }
    zt_tr_fold_comm(r);
    return ZT_EXIT_OK;
}

/* One SFT sample file of the trainer, from files (a data.train_files file, or the files of
 * a dataset_info.json entry), unless the cache (zt_sft_cache_path) already holds it: made
 * by every rank (each tokenizes a share, rank 0 writes); every rank then opens it. */
static int sft_cache(run_t *r, const zt_sft_prep_t *p, const char *const *files, int nfiles, const char *base,
                     const char *what, char *out, size_t outlen, char *err, size_t errlen)
{
    if (zt_agree_error(r->comm, zt_sft_cache_path(p, files, nfiles, base, out, outlen, err, errlen), err, errlen))
        return -1;
    /* rank 0's view of the cache decides for all: the preprocessing is collective */
    if (zt_any(r->comm, r->rank == 0 && access(out, F_OK) != 0)) {
        zt_sft_prep_stats_t st;
        if (zt_sft_prep_ranks(p, files, nfiles, out, r->comm, &st, err, errlen)) return -1;
        zt_log("data: %s -> %s: %zu records, %zu samples, %zu tokens (%zu with loss), %.2f s on %d ranks "
               "(%.2f s with the write; rank 0's share %.2f s of CPU)", what, out, st.records, st.samples,
               st.tokens, st.loss_tokens, st.seconds, r->comm->world.size, st.total_seconds, st.share_cpu);
        if (st.unread)
            zt_log("data: %s: the first %zu records (data.max_samples = %ld); %zu more not read", what, st.records,
                   p->max_samples, st.unread);
    } else {
        zt_log("data: %s: cached in %s", what, out);
    }
    return 0;
}

static zt_sft_prep_t sft_options(const zt_config_t *cfg)
{
    const char *tok = cfg->data.tokenizer[0] ? cfg->data.tokenizer : cfg->model.name_or_path;
    return (zt_sft_prep_t){.tokenizer = tok, .format = cfg->data.format, .template_name = cfg->data.template_name,
                           .cutoff_len = cfg->data.cutoff_len, .train_on_prompt = cfg->data.train_on_prompt,
                           .mask_history = cfg->data.mask_history, .packing = cfg->data.packing,
                           .neat_packing = cfg->data.neat_packing, .max_samples = cfg->data.max_samples,
                           .ranking = cfg->data.ranking};
}

/* data.format != tokens: each input becomes its SFT sample file. */
static int sft_inputs(run_t *r, const char (*in)[ZT_STRLEN], int n, char (*out)[ZT_STRLEN + 64], char *err,
                      size_t errlen)
{
    const zt_sft_prep_t p = sft_options(r->cfg);
    if (!p.tokenizer[0]) /* the same on every rank: the configuration is */
        return zt_err(err, errlen, "data.format = %s needs data.tokenizer (or model.name_or_path)", p.format);
    for (int i = 0; i < n; i++) {
        const char *one[1] = {in[i]};
        if (sft_cache(r, &p, one, 1, in[i], in[i], out[i], sizeof out[i], err, errlen)) return -1;
    }
    return 0;
}

/* LLaMA-Factory's num_samples draws, in the order it loads the datasets (data.dataset's,
 * then data.eval_dataset's), all from numpy's one global state: (records, num_samples) of
 * each, and before[l][i], how many come before entry i of list l. */
typedef struct {
    size_t pairs[2 * 2 * ZT_MAX_FILES];
    int before[2][ZT_MAX_FILES];
} draws_t;

/* data.dataset / data.eval_dataset: each dataset_info.json entry becomes one SFT sample
 * file (a directory's files together, as LLaMA-Factory loads them as one dataset). */
static int sft_datasets(run_t *r, const zt_datasets_t *ds, const draws_t *dr, const int *before,
                        char (*out)[ZT_STRLEN + 64], char *err, size_t errlen)
{
    zt_sft_prep_t p = sft_options(r->cfg);
    for (int i = 0; i < ds->n; i++) {
        const zt_dataset_entry_t *e = &ds->v[i];
        char what[ZT_STRLEN + 64];
        snprintf(what, sizeof what, "dataset %s (%s)", e->name, e->base);
        p.format = e->columns.format == ZT_SFT_ALPACA ? "alpaca" : "sharegpt";
        p.columns = &e->columns;
        p.one_dataset = 1;
        /* LLaMA-Factory's set_seed(seed) seeds numpy before the datasets load */
        p.num_samples = e->num_samples;
        p.num_samples_seed = r->cfg->train.seed;
        p.prior_draws = dr->pairs;
        p.nprior = before[i];
        if (sft_cache(r, &p, (const char *const *)e->files, e->nfiles, e->base, what, out[i], sizeof out[i], err,
                      errlen))
            return -1;
    }
    return 0;
}

/* Both lists of dataset_info.json entries, read by every rank before any is made, and the
 * sizes of those with num_samples. */
static int load_datasets(run_t *r, zt_datasets_t ds[2], draws_t *dr, char *err, size_t errlen)
{
    const zt_config_t *cfg = r->cfg;
    const char *names[2] = {cfg->data.dataset, cfg->data.eval_dataset};
    int rc = sft_options(cfg).tokenizer[0] ? 0 : zt_err(err, errlen, "data.dataset needs data.tokenizer (or "
                                                                     "model.name_or_path)");
    memset(ds, 0, 2 * sizeof *ds);
    for (int l = 0; rc == 0 && l < 2; l++)
        rc = zt_datasets_load(cfg->data.dataset_dir, names[l], &ds[l], err, errlen);
    int nd = 0;
    for (int l = 0; rc == 0 && l < 2; l++) {
        if (ds[l].n > ZT_MAX_FILES) rc = zt_err(err, errlen, "%s: more than %d datasets", names[l], ZT_MAX_FILES);
        for (int i = 0; rc == 0 && i < ds[l].n; i++) {
            const zt_dataset_entry_t *e = &ds[l].v[i];
            dr->before[l][i] = nd;
            if (!e->num_samples) continue;
            rc = zt_sft_count_records((const char *const *)e->files, e->nfiles, &dr->pairs[2 * nd], err, errlen);
            dr->pairs[2 * nd++ + 1] = (size_t)e->num_samples;
        }
    }
    return zt_agree_error(r->comm, rc, err, errlen);
}

int zt_tr_open_data(run_t *r, char *err, size_t errlen)
{
    const zt_config_t *cfg = r->cfg;
    const char *files[ZT_MAX_FILES];
    static char sft[2][ZT_MAX_FILES][ZT_STRLEN + 64];
    const int from_info = cfg->data.dataset[0] != 0, is_sft = from_info || strcmp(cfg->data.format, "tokens") != 0;
    int ntrain = cfg->data.n_train_files, nval = cfg->data.n_val_files;
    if (from_info) {
        zt_datasets_t ds[2];
        static draws_t dr;
        int rc = load_datasets(r, ds, &dr, err, errlen);
        if (rc == 0)
            rc = sft_datasets(r, &ds[0], &dr, dr.before[0], sft[0], err, errlen) ||
                 sft_datasets(r, &ds[1], &dr, dr.before[1], sft[1], err, errlen);
        ntrain = ds[0].n, nval = ds[1].n;
        zt_datasets_free(&ds[0]);
        zt_datasets_free(&ds[1]);
        if (rc) return -1;
    } else if (is_sft && (sft_inputs(r, cfg->data.train_files, cfg->data.n_train_files, sft[0], err, errlen) != 0 ||
                          sft_inputs(r, cfg->data.val_files, cfg->data.n_val_files, sft[1], err, errlen) != 0)) {
        return -1;
    }
    for (int i = 0; i < ntrain; i++) files[i] = is_sft ? sft[0][i] : cfg->data.train_files[i];
    /* train.stage = dpo: instruction data must be preference pairs (a pair's halves read
     * together: zt_data_open_pairs refuses any other file); token files give consecutive
     * rows 2i, 2i + 1 as chosen and rejected, every token with a loss */
    if (is_sft && cfg->train.stage == ZT_STAGE_DPO)
        r->train = zt_data_open_pairs(files, ntrain, cfg->data.seq_len, cfg->model.vocab_size, err, errlen);
    else
        r->train = zt_data_open(files, ntrain, cfg->data.seq_len, cfg->model.vocab_size, err, errlen);
    if (!r->train) return -1;
    if (nval > 0) {
        for (int i = 0; i < nval; i++) files[i] = is_sft ? sft[1][i] : cfg->data.val_files[i];
        r->val = zt_data_open(files, nval, cfg->data.seq_len, cfg->model.vocab_size, err, errlen);
        if (!r->val) return -1;
    }
    return 0;
}

static const zt_backend_t *pick_backend(const zt_config_t *cfg, char *err, size_t errlen)
{
    const zt_backend_choice_t want = cfg->parallel.backend;
    if (want == ZT_BACKEND_CPU) return &zt_backend_cpu;
#ifdef ZT_HAVE_CUDA
    char cerr[ZT_ERRLEN] = "";
    if (zt_cuda_available(cerr, sizeof cerr)) return zt_backend_get("cuda");
    if (want == ZT_BACKEND_CUDA) {
        zt_err(err, errlen, "parallel.backend = \"cuda\": no usable GPU: %s", cerr);
        return NULL;
    }
    zt_log("parallel.backend = auto: no usable GPU (%s); using the CPU backend", cerr);
    return &zt_backend_cpu;
#else
    if (want == ZT_BACKEND_CUDA) {
        zt_err(err, errlen, "parallel.backend = \"cuda\": this ztrain was built without CUDA (configure --with-cuda)");
        return NULL;
    }
    return &zt_backend_cpu;
#endif
}

int zt_train(const zt_config_t *cfg, const zt_parallel_plan_t *plan, zt_comm_t *comm)
{
    run_t run, *r = &run;
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->comm = comm;
    r->rank = comm->world.rank;
    r->dp = comm->mesh_dp;
    r->drank = comm->dp_rank;
    r->B = zt_config_batch_rows(cfg);
    r->T = cfg->data.seq_len;
    r->Tm = r->T / comm->mesh_sp;
    r->A = cfg->train.gradient_accumulation_steps;
    r->G = (long)r->B * r->dp * r->A;
    char err[ZT_ERRLEN] = "";
    int rc = 0;

    r->be = pick_backend(cfg, err, sizeof err);
    rc = r->be ? 0 : -1;
    /* bf16 is the default on a GPU (fp32 GEMMs would leave its tensor cores idle): the
     * run, its saved config.cfg and its checkpoints' metadata say so */
    zt_config_t *gpu_cfg = NULL;
    if (rc == 0 && !r->be->host_memory && !zt_config_given(cfg, "train.bf16") &&
        !zt_config_given(cfg, "train.fp16") && cfg->model.quantization_bit != 4 /* QLoRA computes in fp32 */) {
        gpu_cfg = zt_malloc(sizeof *gpu_cfg);
        *gpu_cfg = *cfg;
        gpu_cfg->train.bf16 = 1;
        cfg = r->cfg = gpu_cfg;
        zt_log("train.bf16 = true: the default on a GPU (train.bf16 = false trains in fp32)");
    }
    if (rc == 0) {
        r->threads = zt_tr_cpu_threads(cfg, r->be, comm->local_size);
        zt_cpu_set_threads(r->threads);
    }
    if (rc == 0) rc = r->rank == 0 ? zt_mkdir_p(cfg->train.output_dir, err, sizeof err) : 0;
    if (zt_agree_error(comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }
    /* device buffers need a comm backend that moves them (and the GPU chosen) before the first alloc */
    if (zt_comm_set_backend(comm, zt_comm_backend_for(r->be->name), err, sizeof err) != 0) {
        zt_log_error("%s", err);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }
    char path[ZT_STRLEN + 64];
    if (cfg->log.all_ranks) {
        snprintf(path, sizeof path, "%s/rank-%d.log", cfg->train.output_dir, r->rank);
        zt_log_init(r->rank, path);
    }
    /* the data decides the number of steps, so it is opened first (generation needs none); the
     * schedule comes from the steps of this run, as transformers does: a resumed run that
     * derives the same total_steps (its checkpoint's config) warms up the same */
    rc = cfg->mode_generate ? 0 : zt_tr_open_data(r, err, sizeof err);
    if (rc == 0 && r->val && cfg->train.stage == ZT_STAGE_DPO) /* it would report an SFT loss */
        rc = zt_err(err, sizeof err, "train.stage = dpo: evaluation on pairs is not wired yet; give no validation "
                                     "data (data.val_files = [], no eval_dataset)");
    if (rc == 0) {
        /* a pairs file counts pairs; the batch (r->G) counts rows, two a pair */
        const int64_t S = r->train ? zt_data_num_samples(r->train) * (zt_data_is_pairs(r->train) ? 2 : 1) : 1;
        r->total_steps = cfg->train.max_steps > 0
                             ? cfg->train.max_steps
                             : (long)ceil(cfg->train.num_train_epochs * (double)S / (double)r->G);
        if (r->total_steps < 1) r->total_steps = 1;
        rc = zt_config_lr_schedule(cfg, r->total_steps, &r->sched, err, sizeof err);
    }
    if (zt_agree_error(comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        zt_data_close(r->train);
        zt_data_close(r->val);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }

    r->table = zt_arch_table_from_config(cfg, err, sizeof err);
    /* the plan of the mesh, again from this config: on a GPU train.bf16 may have
     * become the default above, which sets the working and GEMM precisions */
    const zt_plan_shape_t sh = r->table ? zt_tr_shape_of(r->table) : (zt_plan_shape_t){0};
    rc = r->table ? zt_plan_build(&r->plan, cfg, &sh, plan->world, plan->per_node, err, sizeof err) : -1;
    /* a pipeline: an untied head in a unit of its own, held by the last stage alone */
    if (rc == 0 && r->plan.pp > 1) zt_params_split_head(r->table);
    if (rc == 0 && r->plan.sp > 1 && r->plan.sp_mode == ZT_SP_RING && !r->be->attention_block_forward)
        rc = zt_err(err, sizeof err, "parallel.sp_mode = ring: the %s backend has no ring attention kernels yet "
                    "(parallel.sp_mode = ulysses works there)", r->be->name);
    /* NCCL runs a communicator's operations in issue order on one stream: the receives a
     * step posts at its start would hold back its sends */
    if (rc == 0 && r->plan.pp > 1 && !r->be->host_memory)
        rc = zt_err(err, sizeof err, "parallel.pipeline_parallel_size %d: the %s backend's pipeline messages are not "
                    "wired yet (parallel.backend = cpu runs pipelines)", r->plan.pp, r->be->name);
    if (rc == 0 && r->plan.optimizer == ZT_OPTIM_ONEBIT_ADAM && !r->be->host_memory)
        rc = zt_err(err, sizeof err, "optim.type = onebit_adam: the %s backend has no 1-bit compression kernels "
                    "(they run on host memory: parallel.backend = cpu)", r->be->name);
    /* the plan checked the schedule's rules; this cannot fail where it passed */
    if (rc == 0) /* --generate runs only the stages: a schedule of pp micro-batches is valid for every kind */
        rc = zt_tr_build_steps(cfg, &r->plan, cfg->mode_generate ? r->plan.pp : r->A, &r->steps, err, sizeof err);
    if (rc == 0) r->micro_T = zt_calloc((size_t)r->A, sizeof *r->micro_T);
    if (rc == 0) r->micro_Tp = zt_calloc((size_t)r->A, sizeof *r->micro_Tp);
    if (rc == 0) r->micro_seg = zt_calloc((size_t)r->A, sizeof *r->micro_seg);
    if (rc == 0) r->be->set_matmul_precision(r->plan.matmul);
    if (rc == 0 && (comm->mesh_tp > 1 || comm->mesh_sp > 1)) {
        r->ltable = zt_params_tp_local(r->table, comm->mesh_tp, comm->tp.rank, err, sizeof err);
        if (r->ltable) {
            zt_tr_mesh_local(r->ltable, &r->plan);
            r->ltable->dims.sp_rank = comm->sp.rank;
        }
    } else if (rc == 0) {
        r->ltable = r->table;
    }
    if (zt_agree_error(comm, r->table && r->ltable ? 0 : -1, err, sizeof err)) {
        zt_log_error("%s", err);
        zt_data_close(r->train);
        zt_data_close(r->val);
        free(gpu_cfg);
        return ZT_EXIT_ERROR;
    }
    char why[256] = "";
    if (r->plan.strategy == ZT_STRATEGY_AUTO)
        zt_plan_resolve(&r->plan, zt_tr_pick_auto(cfg, &r->plan, r->be, r->table, r->ltable, comm->data.size, comm->local_size, why,
                                            sizeof why));
    const zt_strategy_t st = r->plan.strategy;
    zt_tr_fill_opts(cfg, &r->plan, st, &r->sopts);
    r->loss_scale = 1.0;
    if (cfg->train.fp16) {
        r->dynamic_scale = cfg->train.loss_scale == 0;
        r->loss_scale = r->dynamic_scale ? ldexp(1.0, cfg->train.initial_scale_power) : cfg->train.loss_scale;
    }
    r->config_text = zt_config_to_string(cfg);
    zt_tr_startup_report(r);
    if (why[0]) zt_log("strategy auto -> %s: %s", zt_strategy_name(st), why);
    if (r->plan.optimizer == ZT_OPTIM_ONEBIT_ADAM)
        zt_log("optim.type = onebit_adam: Adam without bias correction for %ld steps, then the variance frozen and "
               "the momentum exchanged as sign bits and scales (DeepSpeed's 1-bit Adam)", r->plan.freeze_step);
    if (r->plan.offload_param != ZT_OFFLOAD_NONE && !zt_strategy_shards_params(st))
        zt_log("parallel.offload_param = cpu has no effect: %s keeps parameters whole on every rank",
               zt_strategy_name(st));
    if (cfg->train.fp16 && r->dynamic_scale)
        zt_log("fp16: dynamic loss scale from %.9g, doubled after %d steps without overflow, at least %.9g",
               r->loss_scale, cfg->train.loss_scale_window, cfg->train.min_loss_scale);
    else if (cfg->train.fp16)
        zt_log("fp16: static loss scale %.9g", r->loss_scale);
    int exit_code = ZT_EXIT_OK;
    rc = zt_tr_check_fits(cfg, &r->plan, r->be, r->table, r->ltable, st, comm, err, sizeof err);
    if (zt_agree_error(comm, rc, err, sizeof err)) {
        zt_log_error("%s", err);
        exit_code = ZT_EXIT_ERROR;
        goto done;
    }

    r->rss0 = zt_current_rss();
    /* under a pipeline each model holds the activations of this rank's stages' layers only */
    unsigned char *layers = zt_tr_stage_layers(&r->plan, r->ltable->dims.L, comm->pp.rank);
    r->model = zt_model_create_layers(r->ltable, r->be, r->B, r->Tm, cfg->train.gradient_checkpointing, layers);
    if (comm->mesh_tp > 1 || comm->mesh_sp > 1) {
        zt_actcoll_t ac;
        zt_comm_actcoll(comm, &ac);
        zt_model_set_collectives(r->model, &ac);
        r->tp_logits = zt_malloc((size_t)r->table->dims.V * sizeof(float));
        r->row_tmp = zt_malloc(3 * (size_t)r->T * sizeof(int32_t)); /* inputs, targets, positions */
    }
    /* the pipeline: a model per slot of this rank's schedule (one at pp 1) */
    r->slot = zt_calloc((size_t)r->A, sizeof *r->slot);
    r->nslots = zt_schedule_slots(&r->steps, comm->pp.rank, r->slot);
    r->models = zt_calloc((size_t)r->nslots, sizeof *r->models);
    r->models[0] = r->model;
    if (comm->mesh_pp > 1 && !r->tp_logits) /* generation: the last stage's logits reach every rank */
        r->tp_logits = zt_malloc((size_t)r->table->dims.V * sizeof(float));
    for (int k = 1; k < r->nslots; k++) {
        r->models[k] =
            zt_model_create_layers(r->ltable, r->be, r->B, r->Tm, cfg->train.gradient_checkpointing, layers);
        if (comm->mesh_tp > 1 || comm->mesh_sp > 1) {
            zt_actcoll_t ac;
            zt_comm_actcoll(comm, &ac);
            zt_model_set_collectives(r->models[k], &ac);
        }
    }
    free(layers);
    const int nmsg = zt_schedule_messages(&r->steps, comm->pp.rank) + 1; /* each send and receive of the list */
    r->pp_req = zt_calloc((size_t)nmsg, sizeof *r->pp_req);
    r->pp_buf = zt_calloc((size_t)nmsg, sizeof *r->pp_buf);
    unsigned char *lay = zt_tr_stage_layers(&r->plan, r->ltable->dims.L, comm->pp.rank);
    r->held = lay ? zt_params_units_of_layers(r->ltable, lay) : NULL;
    free(lay);
    if (r->held) zt_tr_stage_opts(&r->sopts, &r->plan, r->ltable, r->held);
    r->shard = zt_shard_create_err(r->ltable, comm, r->be, &r->sopts, err, sizeof err);
    if (!r->shard) { /* the nvme tier's path or space, agreed on every rank */
        zt_log_error("%s", err);
        exit_code = ZT_EXIT_ERROR;
        goto done;
    }
    zt_nvme_stats_t nvs;
    if (zt_shard_nvme_stats(r->shard, &nvs)) {
        char fb[32], bb[32];
        zt_log("offload: nvme, %s of state per rank in %s (%s), %d buffers of %s", zt_fmt_bytes(nvs.file_bytes, fb, 32),
               nvs.dir, nvs.engine, nvs.buffers, zt_fmt_bytes(nvs.buffer_bytes, bb, 32));
    }
    if (zt_tr_has_ref_copy(cfg) && zt_tr_ref_create(r) != 0)
        exit_code = ZT_EXIT_ERROR;
    /* the backend's host memory (pinned on a GPU): an upload from pageable memory
     * would wait for the compute stream, once per micro-step */
    r->inp = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(int32_t));
    if (r->table->lora_dropout > 0) r->keys = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(uint64_t));
    r->tgt = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(int32_t));
    if ((r->train && zt_data_has_segments(r->train)) || (r->val && zt_data_has_segments(r->val))) {
        /* neat-packed rows: their segments (whole rows: attention sees every position of a
         * sequence) and positions (this rank's tokens) go to the model beside the tokens */
        r->seg = r->be->alloc_host((size_t)r->A * r->B * r->T * sizeof(int32_t));
        r->pos = r->be->alloc_host((size_t)r->A * r->B * r->Tm * sizeof(int32_t));
        zt_log("data: neat-packed rows: packed samples attend within themselves, positions from 0");
    }
    r->flops_per_token = zt_model_flops_per_token(r->table, r->T);
    r->peak_flops = cfg->train.peak_tflops > 0 ? cfg->train.peak_tflops * 1e12
                                              : zt_max_double(comm, &comm->world, zt_mfu_measure_peak(r->be));
    r->peak_flops *= comm->world.size;
    zt_log("MFU denominator: %.1f GFLOP/s over all ranks (%s)", r->peak_flops / 1e9,
           cfg->train.peak_tflops > 0 ? "train.peak_tflops" : "measured matmul peak of this backend");

    if (zt_tr_maybe_resume(r) != 0) exit_code = ZT_EXIT_ERROR;
    /* a generation leaves the run's config.cfg and metrics.jsonl alone */
    if (exit_code == ZT_EXIT_OK && r->rank == 0 && !cfg->mode_generate) {
        snprintf(path, sizeof path, "%s/config.cfg", cfg->train.output_dir);
        FILE *f = fopen(path, "w");
        if (f) {
            fputs(r->config_text, f);
            fclose(f);
        }
        snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->train.output_dir);
        zt_metrics_open(path, r->step > 0);
        zt_tr_start_record(r);
    }
    zt_watchdog_start(cfg->parallel.timeout_s, r->rank, zt_hostname());
    double t0 = zt_now();
    if (exit_code == ZT_EXIT_OK && cfg->mode_generate) {
        /* --generate: the loaded model completes the prompts, nothing trains or is saved */
        zt_tr_generation_begin(r, cfg->generate.batch_size);
        char kvb[32];
        zt_fmt_bytes((double)zt_model_kv_bytes(r->model), kvb, sizeof kvb);
        const char *why = cfg->generate.use_cache ? "off (sequence parallelism or tp_sequence_parallel)" : "off";
        zt_log("generate: %d prompts at once per rank, KV cache %s%s%s", r->gen_batch, r->kv_on ? "on (" : why,
               r->kv_on ? kvb : "", r->kv_on ? " per rank)" : "");
        const double tg = zt_now();
        rc = zt_generate_run(cfg, "generations.jsonl", r->T, r->gen_batch, r->table->dims.V, zt_tr_batch_logits, r, comm,
                             err, sizeof err);
        zt_tr_generation_end(r);
        if (rc) zt_log_error("%s", err);
        else zt_log("generate: %s/generations.jsonl (%.1f s)", cfg->train.output_dir, zt_now() - tg);
        exit_code = rc ? ZT_EXIT_ERROR : ZT_EXIT_OK;
        zt_watchdog_stop();
        goto done;
    }
    if (exit_code == ZT_EXIT_OK) exit_code = run_loop(r);
    double wall = zt_now() - t0;

    if (exit_code == ZT_EXIT_OK && r->table->first_adapter_unit >= 0 && zt_tr_save_hf(r, 1) != 0) exit_code = ZT_EXIT_ERROR;
    if (exit_code == ZT_EXIT_OK && cfg->checkpoint.save_hf && zt_tr_save_hf(r, 0) != 0) exit_code = ZT_EXIT_ERROR;
    if (exit_code == ZT_EXIT_OK) {
        zt_tr_generate_sample(r);
        zt_watchdog_idle();
        const size_t hwm = zt_peak_rss();
        double peak = zt_max_double(comm, &comm->world, (double)hwm);
        /* what ztrain itself added on top of its start: the figure an estimate predicts */
        const double growth = zt_max_double(comm, &comm->world, (double)hwm - (double)r->rss0);
        double dev_peak = 0.0;
#ifdef ZT_HAVE_CUDA
        if (!r->be->host_memory) dev_peak = (double)zt_cuda_memory_peak();
#endif
        dev_peak = zt_max_double(comm, &comm->world, dev_peak);
        zt_shard_mem_t mm, mref = {0};
        zt_tr_rank_memory(r, &mm);
        if (r->ref_shard) zt_shard_memory(r->ref_shard, &mref);
        char b[9][32];
        zt_log("memory (rank 0, measured): params %s, grads %s, optimizer %s, buffers %s, gathered peak %s, "
               "activations %s, offloaded to host %s; peak RSS over ranks %s (%s above the process before the model)",
               zt_fmt_bytes(mm.params, b[0], 32), zt_fmt_bytes(mm.grads, b[1], 32),
               zt_fmt_bytes(mm.optim, b[2], 32), zt_fmt_bytes(mm.comm_buffers, b[3], 32),
               zt_fmt_bytes(mm.gathered_peak, b[4], 32),
               zt_fmt_bytes((double)zt_tr_activation_bytes(r), b[5], 32), zt_fmt_bytes(mm.host, b[6], 32),
               zt_fmt_bytes(peak, b[7], 32), zt_fmt_bytes(growth, b[8], 32));
        zt_nvme_stats_t nvs;
        if (zt_shard_nvme_stats(r->shard, &nvs))
            zt_log("nvme (rank 0): read %s, written %s, %.3f s waiting for I/O in %.1f s", zt_fmt_bytes(nvs.bytes_read, b[0], 32),
                   zt_fmt_bytes(nvs.bytes_written, b[1], 32), nvs.io_wait_s, wall);
        if (dev_peak > 0)
            zt_log("memory: device peak over ranks %s (the CUDA memory pool's high-water mark)",
                   zt_fmt_bytes(dev_peak, b[0], 32));
#ifdef ZT_HAVE_CUDA
        if (!r->be->host_memory) {
            char where[256];
            long fused = 0;
            zt_cuda_gelu_epilogue(where, sizeof where, &fused);
            zt_log("gelu: %s (rank 0: %ld fused GEMMs)", where, fused);
        }
#endif
        if (r->rank == 0 && cfg->log.plot && r->train_hist.n > 0) {
            snprintf(path, sizeof path, "%s/loss.svg", cfg->train.output_dir);
            zt_tr_write_plot(r, path);
            zt_log("loss plot: %s", path);
        }
        zt_log("summary: %ld steps, %.0f tokens in %.1f s (%.1f s training, %.0f tokens/s), final loss %.4f%s",
               r->step, r->tokens_seen, wall, r->train_seconds,
               r->train_seconds > 0 ? r->tokens_seen / r->train_seconds : 0.0, r->last_loss,
               r->val ? "" : ", no validation set");
        if (r->val) zt_log("summary: final validation loss %.4f", r->last_val);
        zt_tr_comm_summary(r);
        zt_tr_pp_summary(r);
        if (r->plan.pp > 1) zt_tr_stage_memory(r);
        if (cfg->train.stage == ZT_STAGE_DPO && r->pref_seconds[PT_FWD] > 0) {
            const double *p = r->pref_seconds, ref = p[PT_REF_BLOCKS] + p[PT_REF_HEAD],
                         pol = p[PT_FWD] + p[PT_HEAD] + p[PT_LOSS] + p[PT_BWD];
            const double *c = r->pref_cpu, cref = c[PT_REF_BLOCKS] + c[PT_REF_HEAD],
                         cpol = c[PT_FWD] + c[PT_HEAD] + c[PT_LOSS] + c[PT_BWD];
            zt_log("summary: dpo reference passes %.2f s, policy forward + backward %.2f s (reference %.3fx); "
                   "reference blocks %.2f s, head %.2f s; policy blocks %.2f s, head %.2f s, loss %.2f s, "
                   "backward %.2f s; main thread's CPU time: reference %.2f s, policy %.2f s (%.3fx)",
                   ref, pol, ref / pol, p[PT_REF_BLOCKS], p[PT_REF_HEAD], p[PT_FWD], p[PT_HEAD], p[PT_LOSS],
                   p[PT_BWD], cref, cpol, cpol > 0 ? cref / cpol : 0.0);
            if (r->pref_ref_pos[1] > 0)
                zt_log("summary: dpo reference positions computed %.0f of the rows' %.0f (%.1f%%; pref.share_prompt %s)",
                       r->pref_ref_pos[0], r->pref_ref_pos[1], 100.0 * r->pref_ref_pos[0] / r->pref_ref_pos[1],
                       cfg->pref.share_prompt ? "true" : "false");
        }
        if (r->rank == 0) {
            const zt_metrics_summary_t rec = {
                .steps = r->step, .tokens = r->tokens_seen, .wall_s = wall, .train_s = r->train_seconds,
                .final_loss = r->last_loss, .final_val_loss = r->val ? r->last_val : -1.0,
                .peak_rss_bytes = peak, .peak_rss_growth_bytes = growth, .device_peak_bytes = dev_peak, .mem = &mm,
                .activations = zt_tr_activation_bytes(r), .ref = r->ref_shard ? &mref : NULL,
            };
            zt_metrics_record_summary(&rec);
        }
    }
    zt_watchdog_stop();
done:
    zt_metrics_close();
    zt_shard_free(r->shard);
    zt_shard_free(r->ref_shard);
    zt_param_table_free(r->ref_table);
    for (int k = 1; k < r->nslots; k++) zt_model_free(r->models[k]);
    free(r->models);
    free(r->slot);
    free(r->pp_req);
    free(r->pp_buf);
    free(r->held);
    zt_model_free(r->model);
    zt_schedule_free(&r->steps);
    free(r->micro_T);
    free(r->micro_Tp);
    free(r->micro_seg);
    if (r->ltable != r->table) zt_param_table_free(r->ltable);
    free(r->tp_logits);
    free(r->row_tmp);
    zt_param_table_free(r->table);
    zt_data_close(r->train);
    zt_data_close(r->val);
    if (r->inp) r->be->free_host(r->inp);
    if (r->keys) r->be->free_host(r->keys);
    if (r->tgt) r->be->free_host(r->tgt);
    if (r->seg) r->be->free_host(r->seg);
    if (r->pos) r->be->free_host(r->pos);
    if (r->pref_seg) r->be->free_host(r->pref_seg);
    free(r->config_text);
    free(gpu_cfg);
    free(r->train_hist.step);
    free(r->train_hist.val);
    free(r->margin_hist.step);
    free(r->margin_hist.val);
    free(r->val_hist.step);
    free(r->val_hist.val);
    zt_log_close();
    return exit_code;
}
