/* zt_comm_dry.c — a communicator that moves nothing, for the counting runs of zt_memplan.c.
 *
 * A memory estimate runs the shard engine's own step against a counting backend (memory that
 * is address space only). Its collectives must then run without peers: this communicator
 * gives the engine rank 0's groups of the mesh being planned, with their sizes and ranks, and
 * a device comm backend that owns every buffer, issues nothing and completes at once, so each
 * collective goes through zt_comm.c's usual path (and byte accounting) and returns. The MPI
 * handles are MPI_COMM_SELF: the host-scalar agreements (zt_sum_double, zt_any) reduce over
 * this one process. */
#include <string.h>

#include "zt_comm.h"

static int dry_init(zt_comm_t *c, char *err, size_t errlen) { (void)c, (void)err, (void)errlen; return 0; }
static void dry_destroy(zt_comm_t *c) { (void)c; }
static int dry_owns(const void *p) { (void)p; return 1; }
static void dry_iallreduce(zt_comm_t *c, zt_group_t *g, const void *s, void *r, size_t n, zt_dtype_t t,
                           zt_redop_t op, zt_request_t *q)
{
    (void)c, (void)g, (void)s, (void)r, (void)n, (void)t, (void)op, (void)q;
}
static void dry_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *s, void *r, size_t n, zt_dtype_t t,
                                zt_request_t *q)
{
    (void)c, (void)g, (void)s, (void)r, (void)n, (void)t, (void)q;
}
static void dry_ireduce_scatterv(zt_comm_t *c, zt_group_t *g, const void *s, void *r, const int *n, zt_dtype_t t,
                                 zt_request_t *q)
{
    (void)c, (void)g, (void)s, (void)r, (void)n, (void)t, (void)q;
}
static void dry_iallgatherv(zt_comm_t *c, zt_group_t *g, const void *s, void *r, const int *n, const int *d,
                            zt_dtype_t t, zt_request_t *q)
{
    (void)c, (void)g, (void)s, (void)r, (void)n, (void)d, (void)t, (void)q;
}
static void dry_ibcast(zt_comm_t *c, zt_group_t *g, void *b, size_t n, zt_dtype_t t, int root, zt_request_t *q)
{
    (void)c, (void)g, (void)b, (void)n, (void)t, (void)root, (void)q;
}
static void dry_isendrecv(zt_comm_t *c, zt_group_t *g, const void *s, int to, void *r, int from, size_t n,
                          zt_dtype_t t, zt_request_t *q)
{
    (void)c, (void)g, (void)s, (void)to, (void)r, (void)from, (void)n, (void)t, (void)q;
}
static void dry_isend(zt_comm_t *c, zt_group_t *g, const void *s, int to, size_t n, zt_dtype_t t, zt_request_t *q)
{
    (void)c, (void)g, (void)s, (void)to, (void)n, (void)t, (void)q;
}
static void dry_irecv(zt_comm_t *c, zt_group_t *g, void *r, int from, size_t n, zt_dtype_t t, zt_request_t *q)
{
    (void)c, (void)g, (void)r, (void)from, (void)n, (void)t, (void)q;
}
static void dry_wait(zt_comm_t *c, zt_request_t *q) { (void)c, (void)q; }
static void dry_flush(zt_comm_t *c) { (void)c; }

static const zt_comm_backend_t dry_backend = {
    .name = "dry",
    .init = dry_init,
    .destroy = dry_destroy,
    .owns = dry_owns,
    .iallreduce = dry_iallreduce,
    .ireduce_scatter = dry_ireduce_scatter,
    .iallgather = dry_ireduce_scatter, /* the same signature: nothing moves either way */
    .ireduce_scatterv = dry_ireduce_scatterv,
    .iallgatherv = dry_iallgatherv,
    .ibcast = dry_ibcast,
    .ialltoall = dry_ireduce_scatter,
    .isendrecv = dry_isendrecv,
    .isend = dry_isend,
    .irecv = dry_irecv,
    .wait = dry_wait,
    .flush = dry_flush,
};

static void group(zt_group_t *g, const char *name, int id, int size)
{
    g->comm = MPI_COMM_SELF;
    g->id = id;
    g->rank = 0;
    g->size = size;
    g->name = name;
    g->backend_state = NULL;
}

void zt_comm_create_dry(zt_comm_t *c, int data, int tp, int sp, int shard_n, int pp, int pp_rank)
{
    memset(c, 0, sizeof *c);
    group(&c->world, "world", ZT_GRP_WORLD, pp * data * tp);  /* data counts the sp ranks */
    group(&c->pp, "pp", ZT_GRP_PP, pp);
    c->pp.rank = pp_rank;
    group(&c->tp, "tp", ZT_GRP_TP, tp);
    group(&c->sp, "sp", ZT_GRP_SP, sp);
    group(&c->data, "data", ZT_GRP_DATA, data);
    group(&c->shard, "shard", ZT_GRP_SHARD, shard_n);
    group(&c->replica, "replica", ZT_GRP_REPLICA, shard_n > 0 ? data / shard_n : 1);
    c->mesh_tp = tp, c->mesh_sp = sp, c->mesh_dp = data / sp, c->mesh_pp = pp;
    c->local_size = 1;
    c->node_count = 1;
    c->backend = dry_backend.name;
    c->dev = &dry_backend;
}

void zt_comm_destroy_dry(zt_comm_t *c) { memset(c, 0, sizeof *c); }
