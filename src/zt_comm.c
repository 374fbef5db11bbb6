/* zt_comm.c — groups and collectives over MPI, with byte and time accounting.
 *
 * Reduce-scatter is our own ring over MPI_Sendrecv: Open MPI 4.1's
 * MPI_Reduce_scatter_block took 35 ms for 28 MB on 2 ranks here (its all-reduce of
 * the same buffer: 12 ms) and allocates a temporary of the whole message, which for
 * GPT-2's 154 MB embedding unit shows up in peak RSS. The ring moves (n-1)/n of the
 * buffer per rank, accumulates in the caller's send buffer and needs no temporary
 * beyond one chunk. Its summation order is fixed, so results are deterministic.
 *
 * bf16 sums: MPI has no bf16 type, so bf16 buffers travel as MPI_UINT16_T with a
 * user-defined reduction op that adds in fp32 and rounds back to bf16 — the same
 * rounding a bf16 NCCL reduction performs per hop. fp16 (IEEE binary16) likewise,
 * with its own op: a sum past 65504 becomes Inf, which is how a loss-scaled
 * gradient overflow shows itself.
 *
 * Device buffers: with a device comm backend installed (zt_comm_set_backend),
 * each public data collective first asks it whether the buffer is its memory
 * and hands the call over; blocking forms are issue + zt_wait. Deciding per
 * buffer rather than per call site keeps host-memory traffic (the train loop's
 * broadcasts of a step number or a path, checkpoint metadata) on MPI without
 * the callers knowing which backend runs. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "zt_comm.h"

#include <math.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>

#include "zt_bf16.h"
#include "zt_common.h"
#include "zt_fp16.h"
#ifdef ZT_HAVE_CUDA
#include "zt_nccl.h"
#endif

/* Device comm backends by name, each behind its configure define. */
static const zt_comm_backend_t *const device_backends[] = {
#ifdef ZT_HAVE_CUDA
    &zt_comm_nccl,
#endif
    NULL,
};

static MPI_Op bf16_sum_op = MPI_OP_NULL, fp16_sum_op = MPI_OP_NULL;
static void *ring_tmp;       /* landing buffer for in-place rings (grow-only) */
static size_t ring_tmp_bytes;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = zt_bf16_from_f32(zt_bf16_to_f32(a[i]) + zt_bf16_to_f32(b[i]));
}

static void fp16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = zt_fp16_from_f32(zt_fp16_to_f32(a[i]) + zt_fp16_to_f32(b[i]));
}

size_t zt_dtype_size(zt_dtype_t t)
{
    static const size_t sz[] = {4, 2, 4, 8, 8, 1, 2};
    return sz[t];
}

static MPI_Datatype mpi_type(zt_dtype_t t)
{
    switch (t) {
    case ZT_F32: return MPI_FLOAT;
    case ZT_BF16: case ZT_F16: return MPI_UINT16_T;
    case ZT_I32: return MPI_INT32_T;
    case ZT_F64: return MPI_DOUBLE;
    case ZT_I64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

static MPI_Op mpi_op(zt_redop_t op, zt_dtype_t t)
{
    if (t == ZT_BF16) {
        if (op != ZT_SUM) zt_fatal("bf16 reductions support only sum");
        return bf16_sum_op;
    }
    if (t == ZT_F16) {
        if (op != ZT_SUM) zt_fatal("fp16 reductions support only sum");
        return fp16_sum_op;
    }
    return op == ZT_SUM ? MPI_SUM : op == ZT_MAX ? MPI_MAX : MPI_MIN;
}

static void group_init(zt_group_t *g, MPI_Comm comm, const char *name, int id)
{
    g->id = id;
    g->comm = comm;
    g->name = name;
    g->backend_state = NULL;
    ZT_MPI(MPI_Comm_rank(comm, &g->rank));
    ZT_MPI(MPI_Comm_size(comm, &g->size));
}

int zt_comm_create(zt_comm_t *c, MPI_Comm world, int shard_group_size, char *err, size_t errlen)
{
    return zt_comm_create_mesh(c, world, 1, 1, 1, shard_group_size, err, errlen);
}

int zt_comm_create_mesh(zt_comm_t *c, MPI_Comm world, int pp, int tp, int sp, int shard_group_size, char *err,
                        size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->backend = "mpi";
    const char *order = getenv("ZT_P2P_IN_ORDER");
    c->p2p_in_order_mpi = order && strcmp(order, "1") == 0;
    if (bf16_sum_op == MPI_OP_NULL) ZT_MPI(MPI_Op_create(bf16_sum, 1, &bf16_sum_op));
    if (fp16_sum_op == MPI_OP_NULL) ZT_MPI(MPI_Op_create(fp16_sum, 1, &fp16_sum_op));
    MPI_Comm wdup, node;
    ZT_MPI(MPI_Comm_dup(world, &wdup));
    group_init(&c->world, wdup, "world", ZT_GRP_WORLD);
    ZT_MPI(MPI_Comm_split_type(wdup, MPI_COMM_TYPE_SHARED, c->world.rank, MPI_INFO_NULL, &node));
    ZT_MPI(MPI_Comm_rank(node, &c->local_rank));
    ZT_MPI(MPI_Comm_size(node, &c->local_size));
    int leader = c->local_rank == 0, nodes = 0;
    ZT_MPI(MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, wdup));
    c->node_count = nodes;

    /* the pipeline axis is outermost: W ranks of a pipeline rank (a stage group), the
     * rest of the mesh laid out inside each as without pipelines */
    const int pp_ok = pp >= 1 && c->world.size % pp == 0;
    const int W = pp_ok ? c->world.size / pp : c->world.size, r = c->world.rank % W, ppr = c->world.rank / W;
    int mn = 0, mx = 0;
    ZT_MPI(MPI_Allreduce(&c->local_size, &mn, 1, MPI_INT, MPI_MIN, wdup));
    ZT_MPI(MPI_Allreduce(&c->local_size, &mx, 1, MPI_INT, MPI_MAX, wdup));
    ZT_MPI(MPI_Comm_free(&node));
    /* the data group (ranks with the same tp position: sp x dp of them) is what the
     * strategies shard or replicate over; its shard groups are counted in its ranks */
    const int D = tp >= 1 ? W / tp : 0;
    int sg = shard_group_size;
    /* one node per shard group (a pipeline rank's share of it where a node spans pipeline ranks) */
    if (sg <= 0 && tp >= 1) sg = (mn == mx && mn % tp == 0 && D % (mn / tp) == 0) ? mn / tp : D;
    /* ztrain's meshes come from zt_plan_build, which names the keys; this guards direct callers */
    if (!pp_ok || tp < 1 || sp < 1 || W % (tp * sp) != 0 || sg < 1 || sg > D || D % sg != 0) {
        ZT_MPI(MPI_Comm_free(&wdup));
        return zt_err(err, errlen, "mesh: pp %d x tp %d x sp %d must divide the %d ranks, and shard groups of %d "
                      "their %d data ranks", pp, tp, sp, c->world.size, sg, D);
    }
    /* rank = tp_rank + tp * (sp_rank + sp * dp_rank): tp innermost, so it stays in a node */
    c->mesh_tp = tp, c->mesh_sp = sp, c->mesh_dp = W / (tp * sp), c->mesh_pp = pp;
    const int tpr = r % tp, dpr = r / (tp * sp), dr = r / tp;
    MPI_Comm tpc, spc, data, shard, replica, ppc;
    /* every group but pp within one pipeline rank: its colours offset by ppr W */
    const int o = ppr * W;
    ZT_MPI(MPI_Comm_split(wdup, o + r / tp, r, &tpc));
    ZT_MPI(MPI_Comm_split(wdup, o + tpr + tp * dpr, r, &spc));
    ZT_MPI(MPI_Comm_split(wdup, o + tpr, r, &data));
    /* shard group: consecutive data ranks; replica group: same position in each */
    ZT_MPI(MPI_Comm_split(wdup, o + tpr + tp * (dr / sg), r, &shard));
    ZT_MPI(MPI_Comm_split(wdup, o + tpr + tp * (dr % sg), r, &replica));
    ZT_MPI(MPI_Comm_split(wdup, r, ppr, &ppc));
    group_init(&c->pp, ppc, "pp", ZT_GRP_PP);
    group_init(&c->tp, tpc, "tp", ZT_GRP_TP);
    group_init(&c->sp, spc, "sp", ZT_GRP_SP);
    group_init(&c->data, data, "data", ZT_GRP_DATA);
    group_init(&c->shard, shard, "shard", ZT_GRP_SHARD);
    group_init(&c->replica, replica, "replica", ZT_GRP_REPLICA);
    c->dp_rank = dpr;
    return 0;
}

/* this rank's size and rank in its node (shared-memory domain) */
static void node_place(MPI_Comm world, int *size, int *rank)
{
    MPI_Comm node;
    int me = 0;
    ZT_MPI(MPI_Comm_rank(world, &me));
    ZT_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node));
    ZT_MPI(MPI_Comm_size(node, size));
    ZT_MPI(MPI_Comm_rank(node, rank));
    ZT_MPI(MPI_Comm_free(&node));
}

int zt_comm_node_ranks(MPI_Comm world, int *uniform)
{
    int n = 0, nr = 0, mn = 0, mx = 0;
    node_place(world, &n, &nr);
    ZT_MPI(MPI_Allreduce(&n, &mn, 1, MPI_INT, MPI_MIN, world));
    ZT_MPI(MPI_Allreduce(&n, &mx, 1, MPI_INT, MPI_MAX, world));
    *uniform = mn == mx;
    return mn;
}

int zt_comm_node_count(MPI_Comm world)
{
    int n = 0, nr = 0, first = 0, count = 0;
    node_place(world, &n, &nr);
    first = nr == 0;
    ZT_MPI(MPI_Allreduce(&first, &count, 1, MPI_INT, MPI_SUM, world));
    return count;
}

void zt_comm_destroy(zt_comm_t *c)
{
    if (c->dev) c->dev->destroy(c);
    c->dev = NULL;
    free(ring_tmp);
    ring_tmp = NULL;
    ring_tmp_bytes = 0;
    if (c->pp.comm != MPI_COMM_NULL) MPI_Comm_free(&c->pp.comm);
    MPI_Comm_free(&c->replica.comm);
    MPI_Comm_free(&c->shard.comm);
    MPI_Comm_free(&c->data.comm);
    MPI_Comm_free(&c->sp.comm);
    MPI_Comm_free(&c->tp.comm);
    MPI_Comm_free(&c->world.comm);
}

const zt_comm_stats_t *zt_comm_stats(zt_comm_t *c)
{
    if (c->dev) c->dev->flush(c);
    return &c->stats;
}

/* Deferred times of the window that ends here are folded in first, so that they
 * do not land in the next one. */
void zt_comm_stats_reset(zt_comm_t *c)
{
    zt_comm_stats(c);
    memset(&c->stats, 0, sizeof c->stats);
}

const char *zt_comm_backend_for(const char *compute_backend)
{
    static const struct { const char *compute, *comm; } table[] = {{"cuda", "nccl"}};
    for (size_t i = 0; compute_backend && i < sizeof table / sizeof *table; i++)
        if (strcmp(compute_backend, table[i].compute) == 0) return table[i].comm;
    return "mpi";
}

int zt_comm_use_backend(zt_comm_t *c, const zt_comm_backend_t *be, char *err, size_t errlen)
{
    if (c->dev) c->dev->destroy(c);
    c->dev = NULL;
    c->dev_state = NULL;
    c->backend = "mpi";
    if (!be) return 0;
    /* init agrees on its own failures (they are returned on every rank) */
    if (be->init(c, err, errlen) != 0) return -1;
    c->dev = be;
    c->backend = be->name;
    return 0;
}

int zt_comm_set_backend(zt_comm_t *c, const char *name, char *err, size_t errlen)
{
    /* every rank must want the same thing before anything collective is tried:
     * parallel.backend = auto may find a GPU on some ranks only */
    const int want_dev = strcmp(name, "mpi") != 0;
    int lo = 0, hi = 0;
    ZT_MPI(MPI_Allreduce(&want_dev, &lo, 1, MPI_INT, MPI_MIN, c->world.comm));
    ZT_MPI(MPI_Allreduce(&want_dev, &hi, 1, MPI_INT, MPI_MAX, c->world.comm));
    if (lo != hi)
        return zt_err(err, errlen, "comm backend: ranks disagree (%s here, another rank differs); with "
                      "parallel.backend = auto every rank must see a GPU, or none", name);
    if (!want_dev) return zt_comm_use_backend(c, NULL, err, errlen);
    const zt_comm_backend_t *be = NULL;
    for (const zt_comm_backend_t *const *b = device_backends; *b; b++)
        if (strcmp((*b)->name, name) == 0) be = *b;
    if (!be) {
        if (strcmp(name, "nccl") == 0)
            return zt_err(err, errlen, "comm backend \"nccl\": this ztrain was built without CUDA "
                          "(configure --with-cuda)");
        return zt_err(err, errlen, "comm backend \"%s\": unknown (known: mpi, nccl)", name);
    }
    return zt_comm_use_backend(c, be, err, errlen);
}

/* The device backend that must move these buffers, or NULL for MPI. */
static const zt_comm_backend_t *on_device(zt_comm_t *c, const void *send, const void *recv)
{
    if (!c->dev) return NULL;
    const int dev = c->dev->owns(recv);
    if (send && send != ZT_IN_PLACE && send != recv && c->dev->owns(send) != dev)
        zt_fatal("collective with one buffer in host and one in device memory (send %p, recv %p)",
                 send, recv);
    return dev ? c->dev : NULL;
}

/* nccl-tests bus factors */
static double bus_factor(int kind, int n)
{
    if (kind == ZT_COLL_SENDRECV) return 1.0;
    if (n <= 1) return 0.0;
    if (kind == ZT_COLL_ALLREDUCE) return 2.0 * (n - 1) / n;
    if (kind == ZT_COLL_BCAST) return 1.0;
    return (double)(n - 1) / n;
}

static void account(zt_comm_t *c, const zt_group_t *g, int kind, double bytes, int n, double secs)
{
    c->stats.group_bytes[g->id] += bytes;
    c->stats.group_calls[g->id]++;
    c->stats.bytes[kind] += bytes;
    c->stats.bus_bytes[kind] += bytes * bus_factor(kind, n);
    c->stats.seconds[kind] += secs;
    c->stats.calls[kind]++;
}

/* n: ranks of the group, for the bus factor */
static void req_start(zt_request_t *req, const zt_group_t *grp, int kind, double bytes, int n)
{
    req->gid = grp->id;
    req->req2 = MPI_REQUEST_NULL;
    req->g = NULL;
    req->dev = NULL;
    req->kind = kind;
    req->bytes = bytes;
    req->bus = bus_factor(kind, n);
    req->t0 = zt_now();
}

/* A request for the device backend, accounted like the MPI ones at zt_wait. */
static void dev_req(zt_request_t *req, const zt_group_t *g, const zt_comm_backend_t *be, int kind, double bytes,
                    int n)
{
    req_start(req, g, kind, bytes, n);
    req->dev = be;
    req->req = MPI_REQUEST_NULL;
}

/* A ring collective that runs inside zt_wait (send NULL: in place). */
static void req_defer(zt_request_t *req, zt_group_t *g, const void *send, void *recv, size_t count,
                      zt_dtype_t t)
{
    req->g = g;
    req->send = (void *)send;
    req->recv = recv;
    req->count = count;
    req->t = t;
    req->req = MPI_REQUEST_NULL;
}

/* MPI counts are int: split large operations into chunks (all-reduce only needs
 * it in practice; the others stay far below 2^31 elements per rank). */
#define ZT_CHUNK ((size_t)1 << 30)

static void ring_allreduce(zt_group_t *g, void *buf, size_t count, zt_dtype_t t);
static int use_ring(zt_group_t *g, const void *send, size_t count, zt_dtype_t t, zt_redop_t op);

void zt_allreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                  zt_dtype_t t, zt_redop_t op)
{
    if (on_device(c, send, recv)) {
        zt_request_t r;
        zt_iallreduce(c, g, send, recv, count, t, op, &r);
        zt_wait(c, &r);
        return;
    }
    double t0 = zt_now();
    const size_t es = zt_dtype_size(t);
    if (use_ring(g, send, count, t, op)) {
        ring_allreduce(g, recv, count, t);
        account(c, g, ZT_COLL_ALLREDUCE, (double)count * es, g->size, zt_now() - t0);
        return;
    }
    for (size_t off = 0; off < count; off += ZT_CHUNK) {
        size_t n = ZT_MIN(ZT_CHUNK, count - off);
        const void *s = send == ZT_IN_PLACE ? ZT_IN_PLACE : (const char *)send + off * es;
        ZT_MPI(MPI_Allreduce(s, (char *)recv + off * es, (int)n, mpi_type(t), mpi_op(op, t),
                             g->comm));
    }
    account(c, g, ZT_COLL_ALLREDUCE, (double)count * es, g->size, zt_now() - t0);
}

/* dst[i] += src[i] in the buffer's dtype (bf16 and fp16 add in fp32 and round, like the ops) */
static void add_into(void *dst, const void *src, size_t n, zt_dtype_t t)
{
    if (t == ZT_F32) {
        float *d = dst;
        const float *a = src;
        for (size_t i = 0; i < n; i++) d[i] += a[i];
    } else if (t == ZT_BF16) {
        uint16_t *d = dst;
        const uint16_t *a = src;
        for (size_t i = 0; i < n; i++) d[i] = zt_bf16_from_f32(zt_bf16_to_f32(d[i]) + zt_bf16_to_f32(a[i]));
    } else if (t == ZT_F16) {
        uint16_t *d = dst;
        const uint16_t *a = src;
        for (size_t i = 0; i < n; i++) d[i] = zt_fp16_from_f32(zt_fp16_to_f32(d[i]) + zt_fp16_to_f32(a[i]));
    } else {
        zt_fatal("reduce-scatter supports fp32, bf16 and fp16 only");
    }
}

/* Ring reduce-scatter with per-rank chunk sizes: chunk k is buf[displ[k] .. +counts[k]).
 * At step j rank r sends its partial chunk (r-j-1) to r+1 and adds the partial chunk
 * (r-j-2) received from r-1; after n-1 steps chunk r is complete and lands in recv. */
static void ring_reduce_scatter(zt_group_t *g, void *buf, void *recv, const size_t *counts,
                                const size_t *displ, zt_dtype_t t)
{
    const int n = g->size, r = g->rank;
    const size_t es = zt_dtype_size(t);
    const MPI_Datatype dt = mpi_type(t);
    if (n == 1) {
        if (recv) memcpy(recv, buf, counts[0] * es);
        return;
    }
    size_t maxc = 0;
    for (int k = 0; k < n; k++) maxc = ZT_MAX(maxc, counts[k]);
    /* recv doubles as the landing buffer when every chunk fits in it */
    void *tmp = recv && maxc <= counts[r] ? recv : NULL;
    if (!tmp) {
        if (ring_tmp_bytes < maxc * es) {
            free(ring_tmp);
            ring_tmp_bytes = maxc * es;
            ring_tmp = zt_malloc(ring_tmp_bytes);
        }
        tmp = ring_tmp;
    }
    const int right = (r + 1) % n, left = (r + n - 1) % n;
    for (int j = 0; j < n - 1; j++) {
        const int sc = ((r - j - 1) % n + n) % n, rc = ((r - j - 2) % n + n) % n;
        if (counts[sc] > (size_t)INT32_MAX || counts[rc] > (size_t)INT32_MAX)
            zt_fatal("reduce-scatter chunk of more than 2^31 elements");
        ZT_MPI(MPI_Sendrecv((char *)buf + displ[sc] * es, (int)counts[sc], dt, right, 917,
                            tmp, (int)counts[rc], dt, left, 917, g->comm, MPI_STATUS_IGNORE));
        add_into((char *)buf + displ[rc] * es, tmp, counts[rc], t);
    }
    /* the last chunk added was (r - n) mod n = r; recv NULL leaves it in place */
    if (recv) memcpy(recv, (char *)buf + displ[r] * es, counts[r] * es);
}

/* In-place all-reduce as ring reduce-scatter + all-gather: the same bytes as a ring
 * all-reduce, and Open MPI's all-gather is its fastest large collective here. */
static void ring_allreduce(zt_group_t *g, void *buf, size_t count, zt_dtype_t t)
{
    const int n = g->size;
    size_t *cn = zt_malloc((size_t)n * sizeof *cn), *dp = zt_malloc((size_t)n * sizeof *dp);
    int *ic = zt_malloc((size_t)n * sizeof *ic), *id = zt_malloc((size_t)n * sizeof *id);
    for (int k = 0, off = 0; k < n; k++) {
        cn[k] = count / (size_t)n + ((size_t)k < count % (size_t)n ? 1 : 0);
        dp[k] = (size_t)off;
        ic[k] = (int)cn[k];
        id[k] = off;
        off += ic[k];
    }
    ring_reduce_scatter(g, buf, NULL, cn, dp, t);
    ZT_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, ic, id, mpi_type(t), g->comm));
    free(cn);
    free(dp);
    free(ic);
    free(id);
}

/* Large in-place sums take the ring; everything else (norms, flags) MPI_Allreduce. */
static int use_ring(zt_group_t *g, const void *send, size_t count, zt_dtype_t t, zt_redop_t op)
{
    return g->size > 1 && send == ZT_IN_PLACE && op == ZT_SUM && (t == ZT_F32 || t == ZT_BF16 || t == ZT_F16) &&
           count >= ((size_t)1 << 16) && count <= ZT_CHUNK;
}

static void block_reduce_scatter(zt_group_t *g, void *send, void *recv, size_t count, zt_dtype_t t)
{
    size_t *counts = zt_malloc((size_t)g->size * sizeof *counts), *displ = zt_malloc((size_t)g->size * sizeof *displ);
    for (int k = 0; k < g->size; k++) counts[k] = count, displ[k] = (size_t)k * count;
    ring_reduce_scatter(g, send, recv, counts, displ, t);
    free(counts);
    free(displ);
}

void zt_reduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t)
{
    if (on_device(c, send, recv)) {
        zt_request_t r;
        zt_ireduce_scatter(c, g, send, recv, count, t, &r);
        zt_wait(c, &r);
        return;
    }
    double t0 = zt_now();
    block_reduce_scatter(g, (void *)send, recv, count, t);
    account(c, g, ZT_COLL_REDUCE_SCATTER, (double)count * g->size * zt_dtype_size(t), g->size,
            zt_now() - t0);
}

void zt_allgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                  zt_dtype_t t)
{
    if (on_device(c, send, recv)) {
        zt_request_t r;
        zt_iallgather(c, g, send, recv, count, t, &r);
        zt_wait(c, &r);
        return;
    }
    double t0 = zt_now();
    ZT_MPI(MPI_Allgather(send, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), g->comm));
    account(c, g, ZT_COLL_ALLGATHER, (double)count * g->size * zt_dtype_size(t), g->size,
            zt_now() - t0);
}

/* bytes of a v-collective: the sum of every rank's part */
static double total_bytes(const zt_group_t *g, const int *counts, zt_dtype_t t)
{
    double total = 0;
    for (int r = 0; r < g->size; r++) total += counts[r];
    return total * zt_dtype_size(t);
}

void zt_reduce_scatterv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                        const int *counts, zt_dtype_t t)
{
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        if (send == ZT_IN_PLACE) zt_fatal("zt_reduce_scatterv: ZT_IN_PLACE is not supported");
        zt_request_t r;
        dev_req(&r, g, be, ZT_COLL_REDUCE_SCATTER, total_bytes(g, counts, t), g->size);
        be->ireduce_scatterv(c, g, send, recv, counts, t, &r);
        zt_wait(c, &r);
        return;
    }
    double t0 = zt_now(), total = 0;
    size_t *cn = zt_malloc((size_t)g->size * sizeof *cn), *dp = zt_malloc((size_t)g->size * sizeof *dp);
    for (int r = 0; r < g->size; r++) {
        cn[r] = (size_t)counts[r];
        dp[r] = (size_t)total;
        total += counts[r];
    }
    ring_reduce_scatter(g, (void *)send, recv, cn, dp, t);
    free(cn);
    free(dp);
    account(c, g, ZT_COLL_REDUCE_SCATTER, total * zt_dtype_size(t), g->size, zt_now() - t0);
}

void zt_allgatherv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, const int *counts,
                   const int *displs, zt_dtype_t t)
{
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        zt_request_t r;
        dev_req(&r, g, be, ZT_COLL_ALLGATHER, total_bytes(g, counts, t), g->size);
        be->iallgatherv(c, g, send, recv, counts, displs, t, &r);
        zt_wait(c, &r);
        return;
    }
    double t0 = zt_now();
    ZT_MPI(MPI_Allgatherv(send, counts[g->rank], mpi_type(t), recv, counts, displs, mpi_type(t),
                          g->comm));
    account(c, g, ZT_COLL_ALLGATHER, total_bytes(g, counts, t), g->size, zt_now() - t0);
}

void zt_gatherv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, const int *counts,
                const int *displs, zt_dtype_t t, int root)
{
    if (on_device(c, send, g->rank == root ? recv : NULL)) zt_fatal("zt_gatherv: host buffers only");
    double t0 = zt_now();
    ZT_MPI(MPI_Gatherv(send, counts[g->rank], mpi_type(t), recv, counts, displs, mpi_type(t), root, g->comm));
    account(c, g, ZT_COLL_ALLGATHER, total_bytes(g, counts, t), g->size, zt_now() - t0);
}

void zt_bcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root)
{
    const zt_comm_backend_t *be = on_device(c, NULL, buf);
    if (be) {
        zt_request_t r;
        dev_req(&r, g, be, ZT_COLL_BCAST, (double)count * zt_dtype_size(t), g->size);
        be->ibcast(c, g, buf, count, t, root, &r);
        zt_wait(c, &r);
        return;
    }
    double t0 = zt_now();
    ZT_MPI(MPI_Bcast(buf, (int)count, mpi_type(t), root, g->comm));
    account(c, g, ZT_COLL_BCAST, (double)count * zt_dtype_size(t), g->size, zt_now() - t0);
}

void zt_alltoall(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count, zt_dtype_t t)
{
    const double bytes = (double)count * g->size * zt_dtype_size(t);
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        zt_request_t r;
        dev_req(&r, g, be, ZT_COLL_ALLTOALL, bytes, g->size);
        be->ialltoall(c, g, send, recv, count, t, &r);
        zt_wait(c, &r);
        return;
    }
    if (count > (size_t)INT_MAX) zt_fatal("zt_alltoall: %zu elements per rank exceed MPI's int count", count);
    double t0 = zt_now();
    ZT_MPI(MPI_Alltoall(send, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), g->comm));
    account(c, g, ZT_COLL_ALLTOALL, bytes, g->size, zt_now() - t0);
}

void zt_progress(zt_comm_t *c, zt_request_t *req)
{
    (void)c;
    if (req->dev || req->t0 == 0) return;
    int done = 0;
    if (req->req != MPI_REQUEST_NULL) ZT_MPI(MPI_Test(&req->req, &done, MPI_STATUS_IGNORE));
    if (req->kind == ZT_COLL_SENDRECV && req->req2 != MPI_REQUEST_NULL)
        ZT_MPI(MPI_Test(&req->req2, &done, MPI_STATUS_IGNORE));
}

void zt_isendrecv(zt_comm_t *c, zt_group_t *g, const void *send, int to, void *recv, int from, size_t count,
                  zt_dtype_t t, zt_request_t *req)
{
    const double bytes = (double)count * zt_dtype_size(t);
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        dev_req(req, g, be, ZT_COLL_SENDRECV, bytes, g->size);
        be->isendrecv(c, g, send, to, recv, from, count, t, req);
        return;
    }
    if (count > (size_t)INT_MAX) zt_fatal("zt_isendrecv: %zu elements exceed MPI's int count", count);
    req_start(req, g, ZT_COLL_SENDRECV, bytes, g->size);
    ZT_MPI(MPI_Irecv(recv, (int)count, mpi_type(t), from, 77, g->comm, &req->req2));
    ZT_MPI(MPI_Isend(send, (int)count, mpi_type(t), to, 77, g->comm, &req->req));
}

/* A point-to-point message (a pipeline's activation or gradient), counted under its group
 * as a send/receive of one peer: the device backend's where the buffer is on the device,
 * MPI's otherwise. send: this rank sends buf to peer, else receives it from peer. */
static void p2p(zt_comm_t *c, zt_group_t *g, void *buf, int peer, int tag, size_t count, zt_dtype_t t,
                zt_request_t *req, int send)
{
    const double bytes = (double)count * zt_dtype_size(t);
    const zt_comm_backend_t *be = on_device(c, buf, buf);
    if (be) {
        dev_req(req, g, be, ZT_COLL_SENDRECV, bytes, 2);
        if (send) be->isend(c, g, buf, peer, count, t, req);
        else be->irecv(c, g, buf, peer, count, t, req);
        return;
    }
    if (count > (size_t)INT_MAX) zt_fatal("zt_%s: %zu elements exceed MPI's int count", send ? "isend" : "irecv", count);
    req_start(req, g, ZT_COLL_SENDRECV, bytes, 2);
    if (send) ZT_MPI(MPI_Isend(buf, (int)count, mpi_type(t), peer, tag, g->comm, &req->req));
    else ZT_MPI(MPI_Irecv(buf, (int)count, mpi_type(t), peer, tag, g->comm, &req->req));
}

void zt_isend(zt_comm_t *c, zt_group_t *g, const void *send, int to, int tag, size_t count, zt_dtype_t t,
              zt_request_t *req)
{
    p2p(c, g, (void *)send, to, tag, count, t, req, 1); /* only read: MPI_Isend's buffer is const */
}

void zt_irecv(zt_comm_t *c, zt_group_t *g, void *recv, int from, int tag, size_t count, zt_dtype_t t,
              zt_request_t *req)
{
    p2p(c, g, recv, from, tag, count, t, req, 0);
}

void zt_p2p_batch(zt_comm_t *c, zt_group_t *g, const zt_p2p_op_t *ops, int n, zt_request_t *req)
{
    if (n <= 0) return;
    const zt_comm_backend_t *be = on_device(c, ops[0].buf, ops[0].buf);
    for (int k = 1; k < n; k++)
        if (on_device(c, ops[k].buf, ops[k].buf) != be)
            zt_fatal("zt_p2p_batch: device and host buffers in one batch (group '%s')", g->name);
    if (!be || !be->p2p_batch) {
        for (int k = 0; k < n; k++)
            p2p(c, g, ops[k].buf, ops[k].peer, ops[k].tag, ops[k].count, ops[k].t, &req[k], ops[k].send);
        return;
    }
    for (int k = 0; k < n; k++)
        dev_req(&req[k], g, be, ZT_COLL_SENDRECV, (double)ops[k].count * zt_dtype_size(ops[k].t), 2);
    be->p2p_batch(c, g, ops, n, req);
}

int zt_p2p_in_order(const zt_comm_t *c) { return (c->dev && c->dev->p2p_in_order) || (!c->dev && c->p2p_in_order_mpi); }

void zt_iallreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                   zt_dtype_t t, zt_redop_t op, zt_request_t *req)
{
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        dev_req(req, g, be, ZT_COLL_ALLREDUCE, (double)count * zt_dtype_size(t), g->size);
        be->iallreduce(c, g, send, recv, count, t, op, req);
        return;
    }
    if (count > ZT_CHUNK) zt_fatal("non-blocking all-reduce of %zu elements: use buckets", count);
    req_start(req, g, ZT_COLL_ALLREDUCE, (double)count * zt_dtype_size(t), g->size);
    if (use_ring(g, send, count, t, op)) { /* deferred to zt_wait, like the reduce-scatter */
        req_defer(req, g, NULL, recv, count, t);
        return;
    }
    ZT_MPI(MPI_Iallreduce(send, recv, (int)count, mpi_type(t), mpi_op(op, t), g->comm, &req->req));
}

void zt_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_request_t *req)
{
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        dev_req(req, g, be, ZT_COLL_REDUCE_SCATTER, (double)count * g->size * zt_dtype_size(t), g->size);
        be->ireduce_scatter(c, g, send, recv, count, t, req);
        return;
    }
    /* deferred to zt_wait: with one thread per rank MPI progresses only inside MPI
     * calls, so starting the ring early would not overlap anything */
    req_start(req, g, ZT_COLL_REDUCE_SCATTER, (double)count * g->size * zt_dtype_size(t), g->size);
    req_defer(req, g, send, recv, count, t);
}

void zt_iallgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                   zt_dtype_t t, zt_request_t *req)
{
    const zt_comm_backend_t *be = on_device(c, send, recv);
    if (be) {
        dev_req(req, g, be, ZT_COLL_ALLGATHER, (double)count * g->size * zt_dtype_size(t), g->size);
        be->iallgather(c, g, send, recv, count, t, req);
        return;
    }
    req_start(req, g, ZT_COLL_ALLGATHER, (double)count * g->size * zt_dtype_size(t), g->size);
    ZT_MPI(MPI_Iallgather(send, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), g->comm,
                          &req->req));
}

void zt_wait(zt_comm_t *c, zt_request_t *req)
{
    /* t0 == 0 marks a request never started or already accounted */
    if (req->dev) {
        if (req->t0 == 0) return;
        req->dev->wait(c, req); /* adds the seconds, now or at the next flush */
        c->stats.group_bytes[req->gid] += req->bytes;
        c->stats.group_calls[req->gid]++;
        c->stats.bytes[req->kind] += req->bytes;
        c->stats.bus_bytes[req->kind] += req->bytes * req->bus;
        c->stats.calls[req->kind]++;
        req->dev = NULL;
        req->t0 = 0;
        return;
    }
    const double tw = zt_now();
    if (req->req != MPI_REQUEST_NULL) ZT_MPI(MPI_Wait(&req->req, MPI_STATUS_IGNORE));
    /* req2 is only ever set by a send-receive (other requests may not initialize it) */
    if (req->kind == ZT_COLL_SENDRECV && req->req2 != MPI_REQUEST_NULL)
        ZT_MPI(MPI_Wait(&req->req2, MPI_STATUS_IGNORE));
    if (req->t0 == 0) return;
    c->stats.wait_seconds[req->kind] += zt_now() - tw;
    if (req->g) {
        const double t0 = zt_now();
        if (req->kind == ZT_COLL_ALLREDUCE) ring_allreduce(req->g, req->recv, req->count, req->t);
        else block_reduce_scatter(req->g, req->send, req->recv, req->count, req->t);
        req->g = NULL;
        req->t0 = t0; /* time the ring itself, not the wait for our turn */
    }
    c->stats.group_bytes[req->gid] += req->bytes;
    c->stats.group_calls[req->gid]++;
    c->stats.bytes[req->kind] += req->bytes;
    c->stats.bus_bytes[req->kind] += req->bytes * req->bus;
    c->stats.seconds[req->kind] += zt_now() - req->t0;
    c->stats.calls[req->kind]++;
    req->t0 = 0;
}

/* ---- the model's activation collectives ---------------------------------- */

static void act_tp_allreduce(void *ctx, float *x, size_t n, int op)
{
    zt_comm_t *c = ctx;
    zt_allreduce(c, &c->tp, ZT_IN_PLACE, x, n, ZT_F32, op == ZT_ACT_MAX ? ZT_MAX : ZT_SUM);
}

static void act_tp_allgather(void *ctx, const float *send, float *recv, size_t n)
{
    zt_comm_t *c = ctx;
    zt_allgather(c, &c->tp, send, recv, n, ZT_F32);
}

static void act_tp_reduce_scatter(void *ctx, float *send, float *recv, size_t n)
{
    zt_comm_t *c = ctx;
    zt_reduce_scatter(c, &c->tp, send, recv, n, ZT_F32);
}

static void act_sp_alltoall(void *ctx, const float *send, float *recv, size_t n)
{
    zt_comm_t *c = ctx;
    zt_alltoall(c, &c->sp, send, recv, n, ZT_F32);
}

static void *act_sp_ring_start(void *ctx, const float *send, float *recv, size_t n)
{
    zt_comm_t *c = ctx;
    zt_request_t *r = zt_calloc(1, sizeof *r);
    const int sp = c->sp.size, me = c->sp.rank;
    zt_isendrecv(c, &c->sp, send, (me + 1) % sp, recv, (me + sp - 1) % sp, n, ZT_F32, r);
    return r;
}

static void act_sp_ring_progress(void *ctx, void *h) { zt_progress(ctx, h); }

static void act_sp_ring_wait(void *ctx, void *h)
{
    zt_wait(ctx, h);
    free(h);
}

void zt_comm_actcoll(zt_comm_t *c, zt_actcoll_t *out)
{
    memset(out, 0, sizeof *out);
    out->ctx = c;
    out->tp_allreduce = act_tp_allreduce;
    out->tp_allgather = act_tp_allgather;
    out->tp_reduce_scatter = act_tp_reduce_scatter;
    out->sp_alltoall = act_sp_alltoall;
    out->sp_ring_start = act_sp_ring_start;
    out->sp_ring_wait = act_sp_ring_wait;
    out->sp_ring_progress = act_sp_ring_progress;
}

int zt_any(zt_comm_t *c, int local_flag)
{
    /* a dry communicator's groups (zt_comm_create_dry) are this process alone */
    if (c->world.comm == MPI_COMM_SELF) return local_flag != 0;
    int in = local_flag != 0, out = 0;
    ZT_MPI(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LOR, c->world.comm));
    return out;
}

double zt_sum_double(zt_comm_t *c, zt_group_t *g, double x)
{
    if (g->comm == MPI_COMM_SELF) return x; /* a dry communicator's group: this process alone */
    double y = 0;
    ZT_MPI(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, g->comm));
    return y;
}

double zt_max_double(zt_comm_t *c, zt_group_t *g, double x)
{
    if (g->comm == MPI_COMM_SELF) return x;
    double y = 0;
    ZT_MPI(MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, g->comm));
    return y;
}

int zt_agree_error(zt_comm_t *c, int local_rc, char *err, size_t errlen)
{
    int mine = local_rc ? c->world.rank : c->world.size, first = 0;
    ZT_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->world.comm));
    if (first == c->world.size) return 0;
    ZT_MPI(MPI_Bcast(err, (int)errlen, MPI_CHAR, first, c->world.comm));
    err[errlen - 1] = 0;
    return -1;
}

char *zt_bcast_text(MPI_Comm comm, char *text_on_root)
{
    int rank;
    ZT_MPI(MPI_Comm_rank(comm, &rank));
    long len = rank == 0 ? (text_on_root ? (long)strlen(text_on_root) : -1) : 0;
    ZT_MPI(MPI_Bcast(&len, 1, MPI_LONG, 0, comm));
    if (len < 0) return NULL;
    char *buf = rank == 0 ? text_on_root : zt_malloc((size_t)len + 1);
    ZT_MPI(MPI_Bcast(buf, (int)len + 1, MPI_CHAR, 0, comm));
    return buf;
}
