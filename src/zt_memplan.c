/* zt_memplan.c — dry runs of the allocating code (see zt_memplan.h).
 *
 * The counting backend keeps its state in this file (a backend's functions take no
 * context): one dry run at a time, on the thread that calls zt_memplan_run. Each
 * allocation is its own PROT_NONE, MAP_NORESERVE mapping: it costs address space and no
 * memory, and any read or write of it faults, which is how a dry run that computes by
 * mistake shows itself. */
#include "zt_memplan.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "zt_common.h"
#include "zt_actcoll.h"
#include "zt_comm.h"
#include "zt_model.h"

/* ---- the counting backend ------------------------------------------------------------ */

typedef struct { void *p; size_t bytes; } dry_alloc_t;
static struct {
    dry_alloc_t *a; /* what is handed out, for munmap */
    size_t n, cap;
} dry;

static void *dry_take(size_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) zt_fatal("memory plan: no address space for a dry allocation of %zu bytes", bytes);
    if (dry.n == dry.cap) {
        dry.cap = dry.cap ? 2 * dry.cap : 256;
        dry_alloc_t *a = realloc(dry.a, dry.cap * sizeof *dry.a);
        if (!a) zt_fatal("out of memory");
        dry.a = a;
    }
    dry.a[dry.n++] = (dry_alloc_t){p, bytes};
    return p;
}

static void dry_give(void *p)
{
    if (!p) return;
    /* the latest allocations are freed first most often */
    for (size_t i = dry.n; i-- > 0;)
        if (dry.a[i].p == p) {
            munmap(p, dry.a[i].bytes ? dry.a[i].bytes : 1);
            dry.a[i] = dry.a[--dry.n];
            return;
        }
    zt_fatal("memory plan: free of %p, which the counting backend did not hand out", p);
}

static void dry_memzero(void *p, size_t n) { (void)p, (void)n; }
static void dry_move(void *d, const void *s, size_t n) { (void)d, (void)s, (void)n; }
static void dry_nothing(void) {}
static void dry_level(int level) { (void)level; }
static void dry_accumulate(float *y, const float *x, size_t n) { (void)y, (void)x, (void)n; }
static double dry_sumsq(const float *x, size_t n) { (void)x, (void)n; return 0.0; }
static int dry_all_finite(const float *x, size_t n) { (void)x, (void)n; return 1; }
static void dry_scale(float *x, float s, size_t n) { (void)x, (void)s, (void)n; }
static void dry_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
                      float eps, float wd, float gs, long step)
{
    (void)p, (void)g, (void)m, (void)v, (void)n, (void)lr, (void)b1, (void)b2, (void)eps, (void)wd, (void)gs,
        (void)step;
}
static void dry_to16(uint16_t *o, const float *i, size_t n) { (void)o, (void)i, (void)n; }
static void dry_from16(float *o, const uint16_t *i, size_t n) { (void)o, (void)i, (void)n; }

/* Memory and the shard engine's vector operations; the kernels stay NULL: a dry run never
 * computes (a call is a fault, not a silent wrong figure). */
static const zt_backend_t dry_backend = {
    .name = "dry",
    .alloc = dry_take,
    .free = dry_give,
    .memzero = dry_memzero,
    .copy = dry_move,
    .to_host = dry_move,
    .from_host = dry_move,
    .sync = dry_nothing,
    .alloc_host = dry_take, /* the engine and the model count what they ask for */
    .free_host = dry_give,
    .to_host_async = dry_move,
    .from_host_async = dry_move,
    .wait_downloads = dry_nothing,
    .wait_uploads = dry_nothing,
    .set_matmul_precision = dry_level,
    .accumulate = dry_accumulate,
    .scale = dry_scale,
    .sumsq = dry_sumsq,
    .all_finite = dry_all_finite,
    .adamw = dry_adamw,
    .to_bf16 = dry_to16,
    .from_bf16 = dry_from16,
    .to_fp16 = dry_to16,
    .from_fp16 = dry_from16,
    /* the CPU backend's choices where a model's buffers depend on them (QLoRA's linears) */
    .host_memory = 1,
    .dry = 1,
};

const zt_backend_t *zt_memplan_backend(void) { return &dry_backend; }

/* ---- the model's activation collectives --------------------------------------------- */

/* The tp and sp collectives the model issues between its kernels, by their sizes, through
 * the dry communicator's zt_comm_actcoll table (so the same accounting per group and kind
 * counts them). They are issued here rather than by the model because a dry step runs the
 * engine's protocol, not the model's forward and backward: those read their inputs and
 * run kernels, which a dry backend does not have. This is therefore the one description
 * of them beside the code that moves them: zt_model.c's embedding and head
 * (zt_model_tp_reduce, zt_model_tp_gather, head_input, the vocabulary-parallel row
 * statistics), the families' blocks (two tp_gather / tp_reduce pairs forward; backward
 * four gathers and two reductions, and the forward again under recompute) and
 * zt_attention.c (Ulysses' all-to-alls, ring attention's send-receives);
 * tests/mpi/accounting.sh holds it to the bytes a run measures. */
typedef struct mcoll {
    zt_actcoll_t ac;
    const zt_model_dims_t *d;
    size_t N;      /* the model's tokens of a micro-batch (B T, T this sp rank's) */
    int recompute; /* the backward re-runs each block's forward */
} mcoll_t;

static float mc_any[1]; /* never read: the dry communicator moves nothing */

static size_t mc_rows(const mcoll_t *c) { return c->d->tp_seq ? c->N / (size_t)c->d->tp_size : c->N; }

/* zt_model_tp_reduce: a row-parallel output's partial sums */
static void mc_reduce(const mcoll_t *c)
{
    const size_t n = mc_rows(c) * (size_t)c->d->C;
    if (c->d->tp_seq) c->ac.tp_reduce_scatter(c->ac.ctx, mc_any, mc_any, n);
    else if (c->d->tp_size > 1) c->ac.tp_allreduce(c->ac.ctx, mc_any, n, ZT_ACT_SUM);
}

/* zt_model_tp_gather: this rank's rows to every tp rank (tp_seq only) */
static void mc_gather(const mcoll_t *c)
{
    if (c->d->tp_seq) c->ac.tp_allgather(c->ac.ctx, mc_any, mc_any, mc_rows(c) * (size_t)c->d->C);
}

/* zt_attention.c's sp_per: a rank's heads of a block of `heads` (shared below sp) */
static size_t mc_heads(int heads, int sp) { return (size_t)(heads >= sp ? heads / sp : 1); }

/* sequence parallelism inside attention: Ulysses' all-to-alls (q|k|v to heads, the output
 * back; backward the reverse) or ring attention's K|V blocks (backward their gradients too) */
static void mc_attention(const mcoll_t *c, int backward)
{
    const zt_model_dims_t *d = c->d;
    const int sp = d->sp_size;
    if (sp <= 1) return;
    if (d->sp_ring) {
        const size_t n = c->N * 2 * (size_t)d->NKV * (size_t)d->HD; /* both chunks' K|V rows */
        for (int s = 0; s < (backward ? 2 * sp - 1 : sp - 1); s++)
            c->ac.sp_ring_wait(c->ac.ctx, c->ac.sp_ring_start(c->ac.ctx, mc_any, mc_any, n));
        return;
    }
    const size_t qkv = (mc_heads(d->NH, sp) + 2 * mc_heads(d->NKV, sp)) * (size_t)d->HD,
                 out = mc_heads(d->NH, sp) * (size_t)d->HD;
    c->ac.sp_alltoall(c->ac.ctx, mc_any, mc_any, c->N * (backward ? out : qkv));
    c->ac.sp_alltoall(c->ac.ctx, mc_any, mc_any, c->N * (backward ? qkv : out));
}

static void mc_block_forward(const mcoll_t *c)
{
    mc_gather(c); /* the attention's input rows */
    mc_attention(c, 0);
    mc_reduce(c); /* its output projection */
    mc_gather(c); /* the MLP's */
    mc_reduce(c);
}

static void mc_block_backward(const mcoll_t *c)
{
    if (c->recompute) mc_block_forward(c);
    for (int k = 0; k < 2; k++) { /* the MLP, then the attention */
        mc_gather(c); /* the output's gradient rows */
        mc_gather(c); /* the input rows again, for the column-parallel weights' gradients */
        if (k) mc_attention(c, 1);
        mc_reduce(c); /* the input's gradient */
    }
}

static void mc_blocks(const mcoll_t *c, int l0, int l1, int backward)
{
    for (int l = l0; l < l1; l++) backward ? mc_block_backward(c) : mc_block_forward(c);
}

static void mc_embed(const mcoll_t *c, int backward) { backward ? mc_gather(c) : mc_reduce(c); }

/* the head: xf's rows gathered, the vocabulary-parallel row maxima and (sum, target
 * logit), and for training dL/dxf reduced */
static void mc_head(const mcoll_t *c, int train)
{
    mc_gather(c);
    if (c->d->tp_size > 1) {
        c->ac.tp_allreduce(c->ac.ctx, mc_any, c->N, ZT_ACT_MAX);
        c->ac.tp_allreduce(c->ac.ctx, mc_any, 2 * c->N, ZT_ACT_SUM);
    }
    if (train) mc_reduce(c);
}

/* ---- the dry runs --------------------------------------------------------------------- */

/* Blocks [l0, l1) forward as the train loop's forward_range runs them (adapters: the
 * block's adapter unit beside it) */
static void blocks_forward(zt_shard_t *s, const zt_param_table_t *t, int l0, int l1, int adapters)
{
    const int b0 = t->first_block_unit, a0 = adapters ? t->first_adapter_unit : -1;
    if (l0 < l1) zt_shard_prefetch(s, b0 + l0);
    for (int l = l0; l < l1; l++) {
        zt_shard_params(s, b0 + l);
        if (a0 >= 0) zt_shard_params(s, a0 + l);
        if (l + 1 < l1) zt_shard_prefetch(s, b0 + l + 1);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) zt_shard_release(s, a0 + l);
    }
}

/* Blocks [l0, l1) backward, last first, as the train loop's backward_range runs them */
static void blocks_backward(zt_shard_t *s, const zt_param_table_t *t, int l0, int l1)
{
    const int b0 = t->first_block_unit, a0 = t->first_adapter_unit;
    for (int l = l1 - 1; l >= l0; l--) {
        zt_shard_params(s, b0 + l);
        if (a0 >= 0) zt_shard_params(s, a0 + l);
        if (l > l0) zt_shard_prefetch(s, b0 + l - 1);
        zt_shard_grads(s, b0 + l);
        if (a0 >= 0) zt_shard_grads(s, a0 + l);
        zt_shard_grads_ready(s, b0 + l);
        zt_shard_release(s, b0 + l);
        if (a0 >= 0) {
            zt_shard_grads_ready(s, a0 + l);
            zt_shard_release(s, a0 + l);
        }
    }
}

/* The blocks forward as train_forward runs them; the root unit stays materialized for the
 * head */
static void engine_forward(zt_shard_t *s, const zt_param_table_t *t, int adapters)
{
    zt_shard_params(s, t->root_unit);
    blocks_forward(s, t, 0, t->dims.L, adapters);
}

/* A pipeline rank's step up to its R, as the train loop's run_pipeline runs its list: a
 * forward on the first stage runs the embedding (the root released after it), a backward
 * on the last the head (its part of the root's gradients ready there unless the rank runs
 * the embedding too; under head_split the forward reads the head first), and a first
 * stage's backward ends with the embedding's. DPO's
 * reference forwards (FR, in a list with a reference) run on ref (the frozen copy, inside
 * its inference mode) or, without one (LoRA's base), on s without the adapter units, as
 * the train loop's ref_forward runs them. Returns the bytes of the step's message buffers. */
static size_t stage_walk(zt_shard_t *s, const zt_param_table_t *t, zt_shard_t *ref, const zt_param_table_t *rt,
                         const zt_memplan_req_t *q, const zt_model_t *m, zt_comm_t *c, const mcoll_t *mc)
{
    const zt_schedule_t *sc = q->sched;
    const int L = t->dims.L, root = t->root_unit, head = zt_params_head_unit(t), r = q->pp_rank;
    size_t messages = 0;
    for (int i = 0; i < sc->n[r]; i++) {
        const zt_action_t *a = &sc->a[r][i];
        /* each send and receive has a buffer of its own, held until R (run_pipeline), and
         * moves one residual stream through the pp group as run_pipeline's zt_isend/zt_irecv */
        if (zt_schedule_tag(sc, a) >= 0 && m) {
            const size_t n = zt_model_residual_floats(m, q->B, q->T);
            zt_request_t rq;
            if (zt_action_is_send(a)) zt_isend(c, &c->pp, mc_any, a->peer, zt_schedule_tag(sc, a), n, ZT_F32, &rq);
            else zt_irecv(c, &c->pp, mc_any, a->peer, zt_schedule_tag(sc, a), n, ZT_F32, &rq);
            zt_wait(c, &rq);
            messages += n * sizeof(float);
        }
        if (a->kind != ZT_ACT_FWD && a->kind != ZT_ACT_BWD && a->kind != ZT_ACT_REF_FWD) continue;
        const int first = q->stage_first[a->stage], end = q->stage_first[a->stage + 1];
        const int l0 = ZT_MAX(first, 1) - 1, l1 = ZT_MIN(end, L + 1) - 1;
        if (mc && a->kind != ZT_ACT_BWD) { /* the model's forward of the stage (the head's: in B) */
            if (first == 0) mc_embed(mc, 0);
            mc_blocks(mc, l0, l1, 0);
            if (a->kind == ZT_ACT_REF_FWD && end == L + 2) mc_head(mc, 0);
        }
        if (mc && a->kind == ZT_ACT_BWD) {
            if (end == L + 2) mc_head(mc, 1);
            mc_blocks(mc, l0, l1, 1);
            if (first == 0) mc_embed(mc, 1);
        }
        if (a->kind == ZT_ACT_REF_FWD) {
            zt_shard_t *e = ref ? ref : s;
            const zt_param_table_t *et = ref ? rt : t;
            if (ref) zt_shard_begin_inference(ref);
            if (first == 0) {
                zt_shard_params(e, et->root_unit);
                zt_shard_release(e, et->root_unit);
            }
            blocks_forward(e, et, l0, l1, 0);
            if (end == L + 2) {
                zt_shard_params(e, zt_params_head_unit(et));
                zt_shard_release(e, zt_params_head_unit(et));
            }
            if (ref) zt_shard_end_inference(ref);
            continue;
        }
        if (a->kind == ZT_ACT_FWD) {
            if (first == 0) {
                zt_shard_params(s, root);
                zt_shard_release(s, root);
            }
            blocks_forward(s, t, l0, l1, 1);
            if (end == L + 2 && sc->head_split) {
                zt_shard_params(s, head);
                zt_shard_release(s, head);
            }
            continue;
        }
        zt_shard_begin_micro(s, a->micro, sc->micro);
        if (end == L + 2) {
            zt_shard_params(s, head);
            zt_shard_grads(s, head);
            if (first > 0) zt_shard_grads_ready(s, head);
            zt_shard_release(s, head);
        }
        blocks_backward(s, t, l0, l1);
        if (first == 0) {
            zt_shard_grads(s, root);
            zt_shard_grads_ready(s, root);
        }
    }
    return messages;
}

/* The head and the blocks backward as train_backward runs them */
static void engine_backward(zt_shard_t *s, const zt_param_table_t *t)
{
    zt_shard_grads(s, t->root_unit);
    blocks_backward(s, t, 0, t->dims.L);
    zt_shard_grads_ready(s, t->root_unit);
    zt_shard_release(s, t->root_unit);
}

size_t zt_memplan_activations(const zt_param_table_t *t, int B, int T, int recompute)
{
    zt_model_t *m = zt_model_create(t, &dry_backend, B, T, recompute);
    const size_t bytes = zt_model_activation_bytes(m);
    zt_model_free(m);
    return bytes;
}

/* The bytes the dry communicator accounted since its last reset, by group, into by[]; their
 * sum is returned, and the counters reset */
static double take_traffic(zt_comm_t *c, double *by)
{
    const zt_comm_stats_t *st = zt_comm_stats(c);
    double sum = 0.0;
    for (int k = 0; k < ZT_GRP_N; k++) {
        if (by) by[k] = st->group_bytes[k];
        sum += st->group_bytes[k];
    }
    zt_comm_stats_reset(c);
    return sum;
}

/* One optimizer step as the train loop runs it, optimizer step number `step`: a pipeline
 * rank's list (returns its message buffers' bytes), else nmicro micro-steps of the
 * one-stage schedule, each with the model's collectives (mc, NULL without a model) */
static size_t dry_step(const zt_memplan_req_t *q, zt_shard_t *s, zt_shard_t *ref, const zt_model_t *m, zt_comm_t *c,
                       const mcoll_t *mc, long step)
{
    const int pipe = q->sched && q->sched->pp > 1, nmicro = q->nmicro > 0 ? q->nmicro : 1, L = q->table->dims.L;
    size_t messages = 0;
    zt_shard_begin_step(s);
    if (pipe) messages = stage_walk(s, q->table, ref, q->ref_table, q, m, c, mc);
    for (int mi = 0; mi < nmicro && !pipe; mi++) {
        zt_shard_begin_micro(s, mi, nmicro);
        if (ref) { /* DPO: the reference's log-probabilities first, forward only */
            zt_shard_begin_inference(ref);
            engine_forward(ref, q->ref_table, 0);
            zt_shard_release(ref, q->ref_table->root_unit);
            zt_shard_end_inference(ref);
            if (mc) mc_embed(mc, 0), mc_blocks(mc, 0, L, 0), mc_head(mc, 0);
        }
        engine_forward(s, q->table, 1);
        if (mc) mc_embed(mc, 0), mc_blocks(mc, 0, L, 0), mc_head(mc, 1);
        engine_backward(s, q->table);
        if (mc) mc_blocks(mc, 0, L, 1), mc_embed(mc, 1);
    }
    zt_shard_finish_grads(s);
    const zt_adamw_hp_t hp = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1.0f, .step = step};
    zt_shard_optimizer_step(s, &hp);
    return messages;
}

void zt_memplan_run(const zt_memplan_req_t *q, zt_memplan_t *out)
{
    memset(out, 0, sizeof *out);
    const zt_backend_t *be = &dry_backend;
    zt_comm_t comm;
    const int pipe = q->sched && q->sched->pp > 1, sp = ZT_MAX(q->table->dims.sp_size, 1);
    zt_comm_create_dry(&comm, q->data, q->tp, sp, q->shard_n, pipe ? q->sched->pp : 1, pipe ? q->pp_rank : 0);

    /* a pipeline rank: its stages' units, the root's two ends summed (the train loop's
     * options, zt_shard.h) */
    zt_shard_opts_t o = q->opts;
    unsigned char *held = pipe ? zt_params_units_of_layers(q->table, q->layers) : NULL;
    if (pipe)
        o.held = held, o.pipeline = 1,
        o.root_shared = held[q->table->root_unit] && zt_params_head_unit(q->table) == q->table->root_unit;
    zt_shard_t *s = zt_shard_create(q->table, &comm, be, &o);
    /* DPO's frozen reference: a pipeline rank holds its stages' units of it too */
    zt_shard_t *ref = q->ref_table ? zt_shard_create(q->ref_table, &comm, be, pipe ? &o : &q->opts) : NULL;
    zt_model_t *m = q->B > 0 ? zt_model_create_layers(q->table, be, q->B, q->T, q->recompute, pipe ? q->layers : NULL)
                             : NULL;
    if (m && pipe && q->sched->head_split) zt_model_hold_dlogits(m); /* each slot's, as the train loop's */
    size_t slots = 1;
    if (pipe) {
        int *slot = zt_malloc((size_t)q->sched->micro * sizeof *slot);
        slots = (size_t)zt_schedule_slots(q->sched, q->pp_rank, slot);
        free(slot);
    }
    out->activations = m ? slots * zt_model_activation_bytes(m) : 0;
    mcoll_t mc = {.d = &q->table->dims, .N = (size_t)q->B * (size_t)q->T, .recompute = q->recompute};
    zt_comm_actcoll(&comm, &mc.ac);

    /* one optimizer step: the memory's peaks, and its traffic. 1-bit Adam: a step of its
     * warm-up (steps 1 .. freeze_step, numbered freeze_step so that the next is the
     * first compressed one), then a compressed step for the traffic alone */
    take_traffic(&comm, NULL); /* creation's (none at present) is not a step's */
    const int onebit = q->opts.optimizer == ZT_OPTIM_ONEBIT_ADAM && q->opts.freeze_step >= 1;
    out->messages = dry_step(q, s, ref, m, &comm, m ? &mc : NULL, onebit ? q->opts.freeze_step : 1);
    zt_shard_memory(s, &out->mem);
    if (ref) zt_shard_memory(ref, &out->ref);
    out->traffic_warmup = take_traffic(&comm, out->group_traffic);
    out->traffic = out->traffic_warmup;
    if (onebit) {
        dry_step(q, s, ref, m, &comm, m ? &mc : NULL, q->opts.freeze_step + 1);
        out->traffic = take_traffic(&comm, out->group_traffic);
    }

    /* generation's KV cache on top of the model */
    if (m && q->kv_nseq > 0) {
        zt_model_kv_cache(m, q->kv_nseq);
        out->kv = zt_model_kv_bytes(m);
        zt_model_kv_cache(m, 0);
    }
    zt_model_free(m);
    zt_shard_free(ref);
    zt_shard_free(s);
    free(held);
    zt_comm_destroy_dry(&comm);
}
