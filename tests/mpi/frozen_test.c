/* frozen_test.c — frozen units (LoRA's base) in the shard engine, at any world size.
 *
 * A GPT-2 table with some units frozen ("fz") runs the train loop's step protocol
 * (the root unit held for the micro-step, blocks gathered forward and backward, two
 * micro-steps) with synthetic gradients, beside two references: the same table with
 * nothing frozen whose frozen units get zero gradients ("ref"), and a table of the
 * trainable units alone ("tn"). Under every strategy, layout, precision (fp32, bf16,
 * fp16; 16-bit reductions on per_param) and offload setting, it checks:
 *   - zt_shard_grads is NULL exactly for the frozen units;
 *   - the frozen units start at ref's initial working copy (and the I/O view's values
 *     are their initial values, rounded to the working dtype) and stay bit for bit
 *     unchanged through optimizer steps;
 *   - the trainable units step exactly as ref's (working copies, masters and Adam
 *     moments bit for bit), with the same gradient norm;
 *   - memory: params, grads, optim and host as estimated (rank 0 of the shard group;
 *     at most the estimate elsewhere), transient buffers within the estimate, and
 *     grads and optim exactly tn's: nothing for the frozen units;
 *   - traffic: reduction bytes exactly tn's (none for the frozen units), gathers
 *     ref's where parameters are sharded (tn's otherwise: no re-gather of a frozen
 *     unit), the total as the dry run's step counted (zt_memplan_t.traffic);
 *   - the I/O view: read segments cover the frozen parameters (no moments), write
 *     segments the trainable ones only, write-all segments everything, once over the
 *     world; values loaded through a read view land in the frozen base (rounded).
 * With ZT_FROZEN_METRICS=DIR it also writes, for the tiny model of
 * tests/mpi/check_accounting.py (flat layout), a metrics.jsonl per configuration
 * (rank 0's estimate, measurement and per-step traffic) and the script's arguments
 * beside it, so that frozen.sh checks the script's independent formulas too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_arch.h"
#include "zt_common.h"
#include "zt_memplan.h"
#include "zt_shard.h"

static int failures;

/* The estimate: a dry run of the engine (zt_memplan.h) for rank 0 of sn-rank shard groups
 * replicated rn times (ddp: rn replicas of the whole), two micro-steps as step() runs; returns
 * the bytes its step's collectives counted */
static double dry_estimate(const zt_param_table_t *t, const zt_shard_opts_t *o, int sn, int rn, zt_shard_mem_t *e)
{
    const int hybrid = zt_strategy_is_hybrid(o->strategy);
    zt_memplan_req_t q = {.table = t, .opts = *o, .tp = 1, .nmicro = 2,
                          .data = hybrid ? sn * rn : o->strategy == ZT_DDP ? rn : sn, .shard_n = sn};
    zt_memplan_t m;
    zt_memplan_run(&q, &m);
    if (e) *e = m.mem;
    return m.traffic;
}
static int rank_w;
#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            if (failures++ < 40) {                                                \
                fprintf(stderr, "frozen_test: rank %d: %s: ", rank_w, what);      \
                fprintf(stderr, __VA_ARGS__);                                     \
                fputc('\n', stderr);                                              \
            }                                                                     \
        }                                                                         \
    } while (0)

enum { A = 2, STEPS = 3 };

static int is_frozen(const zt_param_table_t *t, int u) { return t->unit_frozen && t->unit_frozen[u]; }

/* the GPT-2 table with the units of mask frozen (NULL: none) */
static zt_param_table_t *make_table(const int *mask)
{
    zt_param_table_t *t = zt_arch_gpt2_table(2, 2, 16, 37, 8, 0.02f);
    if (mask) {
        for (int p = 0; p < t->nparams; p++) t->params[p].frozen = mask[t->params[p].unit];
        zt_params_finish(t, t->nunits, t->root_unit, t->first_block_unit);
    }
    return t;
}

/* the trainable units of t alone, renumbered in order; orig[new unit] = unit of t */
static zt_param_table_t *trainable_table(const zt_param_table_t *t, int *orig)
{
    zt_param_table_t *r = zt_params_new(t->arch, &t->dims);
    int *map = zt_malloc((size_t)t->nunits * sizeof *map), nu = 0;
    for (int u = 0; u < t->nunits; u++) {
        map[u] = is_frozen(t, u) ? -1 : nu;
        if (map[u] >= 0) orig[nu++] = u;
    }
    for (int i = 0; i < t->nparams; i++) {
        const zt_param_t *p = &t->params[i];
        if (map[p->unit] < 0) continue;
        zt_params_add(r, p->name, p->ndim, p->shape[0], p->shape[1], map[p->unit], p->block, p->init, p->init_std,
                      p->role, p->wlayout);
    }
    const int root = t->root_unit >= 0 ? map[t->root_unit] : -1;
    zt_params_finish(r, nu, root, root == 0 ? 1 : 0);
    free(map);
    return r;
}

static float grad_value(int u, size_t i, int mi, long k, int rank)
{
    return 1e-3f * (float)((i * 7 + (size_t)u * 3 + 5 * (size_t)mi + (size_t)k + 11 * (size_t)rank) % 13) - 6e-3f;
}

/* One optimizer step with the train loop's protocol (train_micro): the root unit
 * held for the micro-step, the others gathered forward and backward. Unit u of t is
 * unit orig[u] (NULL: u) of the gradient pattern; units with zero[orig] get zeros. */
static double step(zt_shard_t *s, const zt_param_table_t *t, const int *orig, const int *zero, long k,
                   const char *what)
{
    const int root = t->root_unit, nu = t->nunits;
    int *other = zt_malloc((size_t)nu * sizeof *other), no = 0;
    for (int u = 0; u < nu; u++)
        if (u != root) other[no++] = u;
    zt_shard_begin_step(s);
    for (int mi = 0; mi < A; mi++) {
        zt_shard_begin_micro(s, mi, A);
        if (root >= 0) zt_shard_params(s, root);
        if (no) zt_shard_prefetch(s, other[0]);
        for (int j = 0; j < no; j++) {
            zt_shard_params(s, other[j]);
            if (j + 1 < no) zt_shard_prefetch(s, other[j + 1]);
            zt_shard_release(s, other[j]);
        }
        for (int j = no; j >= 0; j--) {
            const int u = j == no ? root : other[j];
            if (u < 0) continue;
            if (u != root) {
                zt_shard_params(s, u);
                if (j > 0) zt_shard_prefetch(s, other[j - 1]);
            }
            float *g = zt_shard_grads(s, u);
            CHECK((g == NULL) == is_frozen(t, u), "zt_shard_grads(unit %d) is %p, frozen %d", u, (void *)g,
                  is_frozen(t, u));
            const int ou = orig ? orig[u] : u;
            for (size_t i = 0; g && i < t->unit_numel[u]; i++)
                g[i] = zero && zero[ou] ? 0.0f : grad_value(ou, i, mi, k, rank_w);
            if (u != root) {
                zt_shard_grads_ready(s, u);
                zt_shard_release(s, u);
            }
        }
        if (root >= 0) {
            zt_shard_grads_ready(s, root);
            zt_shard_release(s, root);
        }
    }
    const double norm = zt_shard_finish_grads(s);
    zt_adamw_hp_t hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                        .grad_scale = 1.0f, .step = k};
    zt_shard_optimizer_step(s, &hp);
    free(other);
    return norm;
}

/* every unit's full working copy (fp32 view), one buffer per unit */
static float **snapshot(zt_shard_t *s, const zt_param_table_t *t)
{
    float **v = zt_calloc((size_t)t->nunits, sizeof *v);
    zt_shard_begin_inference(s);
    for (int u = 0; u < t->nunits; u++) {
        v[u] = zt_malloc(t->unit_numel[u] * sizeof(float));
        memcpy(v[u], zt_shard_params(s, u), t->unit_numel[u] * sizeof(float));
        zt_shard_release(s, u);
    }
    zt_shard_end_inference(s);
    return v;
}

static void snapshot_free(float **v, const zt_param_table_t *t)
{
    for (int u = 0; u < t->nunits; u++) free(v[u]);
    free(v);
}

/* x rounded to the working dtype */
static void round_work(const zt_shard_opts_t *o, float *x, size_t n)
{
    if (o->param_dtype == ZT_PREC_FP32) return;
    const int fp16 = o->param_dtype == ZT_PREC_FP16;
    uint16_t *b = zt_malloc(n * 2 + 2);
    (fp16 ? zt_backend_cpu.to_fp16 : zt_backend_cpu.to_bf16)(b, x, n);
    (fp16 ? zt_backend_cpu.from_fp16 : zt_backend_cpu.from_bf16)(x, b, n);
    free(b);
}

/* elements of each parameter the view lists, summed over the world */
static void coverage(zt_comm_t *c, const zt_param_table_t *t, const zt_io_seg_t *segs, int n, long *cov)
{
    memset(cov, 0, (size_t)t->nparams * sizeof *cov);
    for (int i = 0; i < n; i++) cov[segs[i].param] += (long)segs[i].len;
    ZT_MPI(MPI_Allreduce(MPI_IN_PLACE, cov, t->nparams, MPI_LONG, MPI_SUM, c->world.comm));
}

static void check_config(zt_comm_t *c, const zt_backend_t *fbe, const zt_param_table_t *t,
                         const zt_param_table_t *tr, const zt_param_table_t *to, const int *orig,
                         const zt_shard_opts_t *o, int sn, int rn, int r0, const char *what)
{
    const int *mask = t->unit_frozen;
    zt_shard_t *ref = zt_shard_create(tr, c, &zt_backend_cpu, o);
    zt_shard_t *fz = zt_shard_create(t, c, fbe, o);
    zt_shard_t *tn = zt_shard_create(to, c, &zt_backend_cpu, o);

    /* initial values: as the unfrozen engine's, and the view's are the init values */
    float **f0 = snapshot(fz, t), **r0v = snapshot(ref, tr);
    for (int u = 0; u < t->nunits; u++)
        CHECK(memcmp(f0[u], r0v[u], t->unit_numel[u] * sizeof(float)) == 0, "unit %d starts elsewhere than ref's", u);
    snapshot_free(r0v, tr);
    zt_io_seg_t *segs;
    int n = zt_shard_io_view(fz, ZT_IO_WRITE_ALL, &segs);
    long *cov = zt_malloc((size_t)t->nparams * sizeof *cov);
    coverage(c, t, segs, n, cov);
    for (int p = 0; p < t->nparams; p++)
        CHECK(cov[p] == (long)t->params[p].numel, "write-all view lists %ld of %zu elements of %s", cov[p],
              t->params[p].numel, t->params[p].name);
    for (int i = 0; i < n; i++) {
        const zt_param_t *p = &t->params[segs[i].param];
        CHECK((segs[i].exp_avg == NULL) == (p->frozen != 0) && (segs[i].exp_avg_sq == NULL) == (p->frozen != 0),
              "write-all segment of %s: moments %p, frozen %d", p->name, (void *)segs[i].exp_avg, p->frozen);
        if (!p->frozen) continue;
        float *want = zt_malloc(segs[i].len * sizeof(float));
        zt_param_init_range(p, o->seed, segs[i].start, segs[i].len, want);
        round_work(o, want, segs[i].len);
        CHECK(memcmp(want, segs[i].value, segs[i].len * sizeof(float)) == 0, "frozen %s [%zu, +%zu) is not its init",
              p->name, segs[i].start, segs[i].len);
        free(want);
    }
    zt_shard_io_done(fz, segs, n, 0);

    /* steps: ref, fz, tn, each with its own traffic counters */
    zt_comm_stats_t sr, sf, st;
    for (long k = 1; k <= STEPS; k++) {
        zt_comm_stats_reset(c);
        const double nr = step(ref, tr, NULL, mask, k, what);
        sr = *zt_comm_stats(c);
        zt_comm_stats_reset(c);
        const double nf = step(fz, t, NULL, NULL, k, what);
        sf = *zt_comm_stats(c);
        zt_comm_stats_reset(c);
        step(tn, to, orig, NULL, k, what);
        st = *zt_comm_stats(c);
        CHECK(nf == nr, "step %ld: gradient norm^2 %.17g, ref's %.17g", k, nf, nr);
        const double red_f = sf.bytes[ZT_COLL_ALLREDUCE] + sf.bytes[ZT_COLL_REDUCE_SCATTER];
        const double red_t = st.bytes[ZT_COLL_ALLREDUCE] + st.bytes[ZT_COLL_REDUCE_SCATTER];
        CHECK(red_f == red_t, "step %ld: reductions moved %.0f bytes, the trainable units' %.0f", k, red_f, red_t);
        const double ag_want =
            zt_strategy_shards_params(o->strategy) ? sr.bytes[ZT_COLL_ALLGATHER] : st.bytes[ZT_COLL_ALLGATHER];
        CHECK(sf.bytes[ZT_COLL_ALLGATHER] == ag_want, "step %ld: all-gathers moved %.0f bytes, want %.0f", k,
              sf.bytes[ZT_COLL_ALLGATHER], ag_want);
        double tot_f = 0, tot_r = 0;
        for (int q = 0; q < ZT_COLL_N; q++) tot_f += sf.bytes[q], tot_r += sr.bytes[q];
        const double ef = dry_estimate(t, o, sn, rn, NULL), er = dry_estimate(tr, o, sn, rn, NULL);
        /* exact at rank 0 of the shard group (the estimate's largest shard) */
        CHECK(r0 ? tot_f == ef : tot_f <= ef, "step %ld: %.0f bytes moved, estimate %.0f", k, tot_f, ef);
        CHECK(r0 ? tot_r == er : tot_r <= er, "step %ld: ref moved %.0f bytes, its estimate %.0f", k, tot_r, er);
    }

    /* frozen units unchanged, trainable ones as ref's */
    float **f1 = snapshot(fz, t), **r1 = snapshot(ref, tr);
    for (int u = 0; u < t->nunits; u++) {
        const size_t bytes = t->unit_numel[u] * sizeof(float);
        if (is_frozen(t, u)) CHECK(memcmp(f1[u], f0[u], bytes) == 0, "frozen unit %d changed", u);
        else CHECK(memcmp(f1[u], r1[u], bytes) == 0, "trainable unit %d differs from ref's", u);
    }
    snapshot_free(f1, t);
    snapshot_free(r1, tr);
    snapshot_free(f0, t);
    zt_io_seg_t *sa, *sb;
    int na = zt_shard_io_view(ref, ZT_IO_WRITE, &sa), nb = zt_shard_io_view(fz, ZT_IO_WRITE, &sb);
    coverage(c, t, sb, nb, cov);
    for (int p = 0; p < t->nparams; p++)
        CHECK(cov[p] == (t->params[p].frozen ? 0 : (long)t->params[p].numel),
              "write view lists %ld of %zu elements of %s (frozen %d)", cov[p], t->params[p].numel,
              t->params[p].name, t->params[p].frozen);
    int j = 0;
    for (int i = 0; i < na; i++) {
        if (is_frozen(t, tr->params[sa[i].param].unit)) continue;
        if (j >= nb) {
            CHECK(0, "write view: fewer trainable segments than ref's");
            break;
        }
        const size_t bytes = sa[i].len * sizeof(float);
        CHECK(sa[i].param == sb[j].param && sa[i].start == sb[j].start && sa[i].len == sb[j].len &&
                  sb[j].exp_avg && memcmp(sa[i].value, sb[j].value, bytes) == 0 &&
                  memcmp(sa[i].exp_avg, sb[j].exp_avg, bytes) == 0 &&
                  memcmp(sa[i].exp_avg_sq, sb[j].exp_avg_sq, bytes) == 0,
              "trainable segment %d (param %d): master or moments differ from ref's", j, sb[j].param);
        j++;
    }
    CHECK(j == nb, "write view: %d segments, ref has %d trainable ones", nb, j);
    zt_shard_io_done(ref, sa, na, 0);
    zt_shard_io_done(fz, sb, nb, 0);

    /* memory: as estimated; grads and optim those of the trainable units alone */
    zt_shard_mem_t mf, mt, mr, ef, er;
    zt_shard_memory(fz, &mf);
    zt_shard_memory(tn, &mt);
    zt_shard_memory(ref, &mr);
    dry_estimate(t, o, sn, rn, &ef);
    dry_estimate(tr, o, sn, rn, &er);
    const zt_shard_mem_t *ms[2] = {&mf, &mr}, *es[2] = {&ef, &er};
    for (int q = 0; q < 2; q++) {
        const zt_shard_mem_t *m = ms[q], *e = es[q];
        const char *who = q ? "ref" : "frozen";
        if (r0)
            CHECK(m->params == e->params && m->grads == e->grads && m->optim == e->optim && m->host == e->host,
                  "%s: measured params %zu grads %zu optim %zu host %zu, estimate %zu %zu %zu %zu", who, m->params,
                  m->grads, m->optim, m->host, e->params, e->grads, e->optim, e->host);
        else
            CHECK(m->params <= e->params && m->grads <= e->grads && m->optim <= e->optim && m->host <= e->host,
                  "%s: measured params %zu grads %zu optim %zu host %zu over the estimate %zu %zu %zu %zu", who,
                  m->params, m->grads, m->optim, m->host, e->params, e->grads, e->optim, e->host);
        /* the dry run walks the same protocol: rank 0's transient peaks are its figures */
        if (r0)
            CHECK(m->comm_buffers == e->comm_buffers && m->gathered_peak == e->gathered_peak,
                  "%s: transient peaks %zu / %zu, the dry run's %zu / %zu", who, m->comm_buffers, m->gathered_peak,
                  e->comm_buffers, e->gathered_peak);
        else
            CHECK(m->comm_buffers <= e->comm_buffers && m->gathered_peak <= e->gathered_peak,
                  "%s: transient peaks %zu / %zu over the estimate %zu / %zu", who, m->comm_buffers,
                  m->gathered_peak, e->comm_buffers, e->gathered_peak);
    }
    CHECK(mf.grads == mt.grads && mf.optim == mt.optim,
          "grads %zu optim %zu, the trainable units alone have %zu and %zu", mf.grads, mf.optim, mt.grads, mt.optim);
    CHECK(mf.params == mr.params, "params %zu, ref's %zu", mf.params, mr.params);

    /* loading: values through a read view (the HF load of the base) */
    n = zt_shard_io_view(fz, ZT_IO_READ, &segs);
    coverage(c, t, segs, n, cov);
    const long reps = o->strategy == ZT_DDP ? c->world.size : zt_strategy_is_hybrid(o->strategy) ? rn : 1;
    for (int p = 0; p < t->nparams; p++)
        CHECK(cov[p] == reps * (long)t->params[p].numel, "read view lists %ld of %zu x %ld elements of %s", cov[p],
              t->params[p].numel, reps, t->params[p].name);
    for (int i = 0; i < n; i++) {
        const zt_param_t *p = &t->params[segs[i].param];
        CHECK((segs[i].exp_avg == NULL) == (p->frozen != 0), "read segment of %s: moments %p, frozen %d", p->name,
              (void *)segs[i].exp_avg, p->frozen);
        zt_param_init_range(p, 99, segs[i].start, segs[i].len, segs[i].value);
    }
    zt_shard_io_done(fz, segs, n, 1);
    zt_shard_after_load(fz);
    float **f2 = snapshot(fz, t);
    for (int u = 0; u < t->nunits; u++) {
        float *want = zt_malloc(t->unit_numel[u] * sizeof(float));
        for (int p = t->unit_first[u]; p < t->unit_first[u] + t->unit_count[u]; p++)
            zt_param_init_range(&t->params[p], 99, 0, t->params[p].numel, want + t->params[p].offset);
        round_work(o, want, t->unit_numel[u]);
        CHECK(memcmp(want, f2[u], t->unit_numel[u] * sizeof(float)) == 0, "unit %d (frozen %d): loaded values lost",
              u, is_frozen(t, u));
        free(want);
    }
    snapshot_free(f2, t);
    free(cov);
    zt_shard_free(ref);
    zt_shard_free(fz);
    zt_shard_free(tn);
}

static void mem_json(FILE *f, const char *key, const zt_shard_mem_t *m)
{
    fprintf(f, "\"%s\":{\"params\":%zu,\"grads\":%zu,\"optimizer\":%zu,\"buffers\":%zu,\"gathered\":%zu,"
               "\"activations\":0,\"host\":%zu}",
            key, m->params, m->grads, m->optim, m->comm_buffers, m->gathered_peak, m->host);
}

/* one metrics.jsonl as a run of the tiny model would write it, and the arguments of
 * check_accounting.py for it */
static void write_metrics(const char *root, zt_comm_t *c, const zt_param_table_t *t, const zt_shard_opts_t *o,
                          int sn, int rn, int group, const char *frozen_arg, const char *tag)
{
    const char *what = tag;
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/%s", root, tag);
    char err[300];
    if (c->world.rank == 0 && zt_mkdir_p(dir, err, sizeof err) != 0) zt_fatal("%s", err);
    zt_shard_t *s = zt_shard_create(t, c, &zt_backend_cpu, o);
    zt_comm_stats_t st[STEPS];
    for (long k = 1; k <= STEPS; k++) {
        zt_comm_stats_reset(c);
        step(s, t, NULL, NULL, k, what);
        st[k - 1] = *zt_comm_stats(c);
    }
    zt_shard_mem_t m, e;
    zt_shard_memory(s, &m);
    const double traffic = dry_estimate(t, o, sn, rn, &e);
    zt_shard_free(s);
    if (c->world.rank != 0) return;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) zt_fatal("cannot write %s", path);
    fprintf(f, "{\"start\":true,\"world_size\":%d,\"strategy\":\"%s\",\"parameters\":%zu,"
            "\"traffic_estimate_bytes\":%.0f,\"traffic_estimate_warmup_bytes\":%.0f,", c->world.size,
            zt_strategy_name(o->strategy), t->total_numel, traffic, traffic);
    mem_json(f, "memory_estimate", &e);
    fprintf(f, "}\n");
    static const char *names[ZT_COLL_N] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all",
                                           "send_recv"};
    for (int k = 0; k < STEPS; k++) {
        fprintf(f, "{\"step\":%d,\"loss\":0,\"comm\":{", k + 1);
        for (int q = 0; q < ZT_COLL_N; q++)
            fprintf(f, "%s\"%s\":{\"calls\":%ld,\"bytes\":%.0f,\"busbw_GBps\":0}", q ? "," : "", names[q],
                    st[k].calls[q], st[k].bytes[q]);
        fprintf(f, "}}\n");
    }
    fprintf(f, "{\"summary\":true,");
    mem_json(f, "memory_measured", &m);
    fprintf(f, "}\n");
    fclose(f);
    snprintf(path, sizeof path, "%s/args", dir);
    f = fopen(path, "w");
    if (!f) zt_fatal("cannot write %s", path);
    fprintf(f, "%s %d %d", zt_strategy_name(o->strategy), c->world.size, A);
    if (zt_strategy_is_hybrid(o->strategy)) fprintf(f, " %d", group);
    fprintf(f, " --frozen=%s%s%s%s\n", frozen_arg, o->param_dtype == ZT_PREC_BF16 ? " --bf16" : "", o->offload_optim ? " --offload" : "",
            o->offload_param ? " --offload-param" : "");
    fclose(f);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    zt_comm_t c, ch;
    char err[512];
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0) zt_fatal("%s", err);
    const int world = c.world.size;
    rank_w = c.world.rank;
    /* hybrids: shard groups of 2 where the world splits so, else of 1 (replicas only) */
    const int g = world % 2 == 0 && world > 2 ? 2 : 1;
    if (zt_comm_create(&ch, MPI_COMM_WORLD, g, err, sizeof err) != 0) zt_fatal("%s", err);
    zt_backend_t staged = zt_backend_cpu;
    staged.host_memory = 0;
    zt_param_table_t *tr = make_table(NULL);
    /* the blocks frozen (the root trainable), and the root with block 1 */
    const int masks[2][3] = {{0, 1, 1}, {1, 0, 1}};
    long configs = 0;
    for (int mk = 0; mk < 2; mk++) {
        zt_param_table_t *t = make_table(masks[mk]);
        int orig[3];
        zt_param_table_t *to = trainable_table(t, orig);
        for (int st = 0; st < ZT_STRATEGY_N; st++) {
            const int hyb = zt_strategy_is_hybrid(st);
            zt_comm_t *cc = hyb ? &ch : &c;
            const int sn = hyb ? g : world, rn = st == ZT_DDP ? world : hyb ? world / g : 1;
            /* rank 0 of its shard group owns the largest shard: the estimate's */
            const int r0 = st == ZT_DDP || (hyb ? ch.shard.rank == 0 : c.world.rank == 0);
            for (int lay = 0; lay < 2; lay++)
                for (int prec = 0; prec < 3; prec++)
                    for (int off = 0; off < 3; off++) {
                        if (off == 2 && !zt_strategy_shards_params(st)) continue;
                        zt_shard_opts_t o = {.strategy = st, .layout = lay, .reshard_after_forward = prec != 1,
                                             .bucket_bytes = 1 << 20, .param_dtype = (zt_precision_t)prec,
                                             .reduce_dtype = lay == 1 ? (zt_precision_t)prec : ZT_PREC_FP32,
                                             .offload_optim = off > 0, .offload_param = off == 2, .seed = 7};
                        char what[160];
                        snprintf(what, sizeof what, "mask %d%d%d %s %s %s%s%s", masks[mk][0], masks[mk][1],
                                 masks[mk][2], zt_strategy_name(st), lay ? "per_param" : "flat",
                                 prec == 0 ? "fp32" : prec == 1 ? "bf16" : "fp16",
                                 off ? " offload" : "", off == 2 ? "+param" : "");
                        /* per_param engines on the staged backend: the device I/O paths */
                        check_config(cc, lay ? &staged : &zt_backend_cpu, t, tr, to, orig, &o, sn, rn, r0, what);
                        configs++;
                    }
        }
        zt_param_table_free(to);
        zt_param_table_free(t);
    }
    zt_param_table_free(tr);
    const char *mdir = getenv("ZT_FROZEN_METRICS");
    for (int mk = 0; mdir && mk < 2; mk++) {
        /* check_accounting.py's tiny model: GPT-2, 2 layers, C 32, V 257, T 32 */
        zt_param_table_t *t = zt_arch_gpt2_table(2, 2, 32, 257, 32, 0.02f);
        for (int p = 0; p < t->nparams; p++) t->params[p].frozen = masks[mk][t->params[p].unit];
        zt_params_finish(t, t->nunits, t->root_unit, t->first_block_unit);
        const zt_strategy_t sts[] = {ZT_DDP, ZT_ZERO1, ZT_ZERO2, ZT_SHARD_GRAD_OP, ZT_ZERO3, ZT_HYBRID};
        for (int i = 0; i < 6; i++)
            for (int prec = 0; prec < 2; prec++)
                for (int off = 0; off < 3; off++) {
                    const zt_strategy_t st = sts[i];
                    const int hyb = zt_strategy_is_hybrid(st);
                    if (off == 2 && !zt_strategy_shards_params(st)) continue;
                    if (hyb && g == 1) continue; /* the script's hybrid has shard groups of 2 or more */
                    zt_shard_opts_t o = {.strategy = st, .layout = ZT_LAYOUT_FLAT, .reshard_after_forward = 1,
                                         .bucket_bytes = 1 << 20, .param_dtype = prec ? ZT_PREC_BF16 : ZT_PREC_FP32,
                                         .offload_optim = off > 0,
                                         .offload_param = off == 2, .seed = 7};
                    char tag[128], fz[16] = "";
                    for (int u = 0; u < 3; u++)
                        if (masks[mk][u]) snprintf(fz + strlen(fz), sizeof fz - strlen(fz), "%s%d", *fz ? "," : "", u);
                    snprintf(tag, sizeof tag, "%s-m%d%d%d-%s%s", zt_strategy_name(st), masks[mk][0], masks[mk][1],
                             masks[mk][2], prec ? "bf16" : "fp32", off == 2 ? "-offp" : off ? "-off" : "");
                    write_metrics(mdir, hyb ? &ch : &c, t, &o, hyb ? g : world,
                                  st == ZT_DDP ? world : hyb ? world / g : 1, g, fz, tag);
                }
        zt_param_table_free(t);
    }
    int any = zt_any(&c, failures != 0);
    if (c.world.rank == 0)
        printf("frozen_test: %d ranks: %s (%ld configurations)\n", world, any ? "FAILED" : "all checks passed", configs);
    zt_comm_destroy(&ch);
    zt_comm_destroy(&c);
    MPI_Finalize();
    return any ? 1 : 0;
}
