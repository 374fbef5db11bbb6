/* zt_comm.h — the only module that calls collectives.
 *
 * Groups: world, shard (ranks that split one copy of the model state; default
 * one node via MPI_COMM_TYPE_SHARED, or parallel.shard_group_size consecutive
 * ranks) and replica (ranks with the same position in different shard groups).
 * Every operation counts its bytes (the size of the user buffer, the nccl-tests
 * convention) and time, per collective kind, so the train loop can report bus
 * bandwidth: busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
 * reduce-scatter, 1 for broadcast.
 *
 * Comm backends. MPI is always there and moves host memory. A device comm
 * backend (zt_comm_backend_t: NCCL in builds configured --with-cuda) is chosen
 * once, collectively, with zt_comm_set_backend; from then on every data
 * collective (all-reduce, reduce-scatter, all-gather, their v-variants,
 * broadcast; blocking and not) whose buffers are device memory goes to it, on
 * the same groups, with the same byte accounting. Host buffers keep going to
 * MPI, and so do the collective decisions (zt_any, zt_sum_double, ...), which
 * are host scalars. Non-blocking device collectives complete in stream order:
 * zt_wait makes the compute stream wait for them and returns without blocking
 * the host (see include/zt_nccl.h for the ordering). */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#include "zt_actcoll.h"

typedef enum { ZT_F32 = 0, ZT_BF16 = 1, ZT_I32 = 2, ZT_F64 = 3, ZT_I64 = 4, ZT_U8 = 5, ZT_F16 = 6 } zt_dtype_t;
struct zt_comm;
struct zt_comm_backend;
/* One point-to-point operation of a batch (zt_p2p_batch): send buf (count) to group rank
 * peer, or receive it from peer; tag as zt_isend's */
typedef struct zt_p2p_op {
    int send;
    void *buf;
    int peer, tag;
    size_t count;
    zt_dtype_t t;
} zt_p2p_op_t;
typedef enum { ZT_SUM = 0, ZT_MAX = 1, ZT_MIN = 2 } zt_redop_t;
typedef enum { ZT_COLL_ALLREDUCE = 0, ZT_COLL_REDUCE_SCATTER, ZT_COLL_ALLGATHER, ZT_COLL_BCAST,
               ZT_COLL_ALLTOALL, ZT_COLL_SENDRECV, ZT_COLL_N } zt_coll_kind_t;

size_t zt_dtype_size(zt_dtype_t t);

/* the groups, for the per-group accounting */
enum { ZT_GRP_WORLD = 0, ZT_GRP_SHARD, ZT_GRP_REPLICA, ZT_GRP_TP, ZT_GRP_SP, ZT_GRP_DATA, ZT_GRP_PP, ZT_GRP_N };
/* A ZT_GRP_* id's name, as metrics.jsonl and the logs spell it */
static inline const char *zt_group_id_name(int id)
{
    static const char *const names[ZT_GRP_N] = {"world", "shard", "replica", "tp", "sp", "data", "pp"};
    return id >= 0 && id < ZT_GRP_N ? names[id] : "?";
}

typedef struct zt_group {
    MPI_Comm comm;
    int id;                 /* ZT_GRP_* */
    int rank, size;
    const char *name;       /* "world", "shard", "replica" */
    void *backend_state;    /* e.g. an ncclComm_t */
} zt_group_t;

typedef struct zt_comm_stats {
    double bytes[ZT_COLL_N];    /* user-buffer bytes (nccl-tests "size") */
    double bus_bytes[ZT_COLL_N];/* bytes * bus factor, so busbw = bus_bytes / seconds */
    double seconds[ZT_COLL_N];  /* from issue to completion (waited) */
    double wait_seconds[ZT_COLL_N]; /* of those, the host blocked in zt_wait (MPI): what compute
                                     * between issue and wait did not hide */
    long calls[ZT_COLL_N];
    double group_bytes[ZT_GRP_N]; /* the same bytes by the group they moved in (ZT_GRP_*) */
    long group_calls[ZT_GRP_N];
} zt_comm_stats_t;

typedef struct zt_request {
    MPI_Request req;
    MPI_Request req2;       /* a send-receive's receive (MPI_REQUEST_NULL otherwise) */
    int kind;
    double t0, bus, bytes;
    int gid;                /* the group's ZT_GRP_* */
    /* a reduce-scatter runs as a ring of point-to-point steps inside zt_wait */
    struct zt_group *g;
    void *send, *recv;
    size_t count;
    zt_dtype_t t;
    /* a device collective: completed by dev->wait, which the backend's events track */
    const struct zt_comm_backend *dev;
    void *ev_start, *ev_done;
} zt_request_t;

typedef struct zt_comm {
    zt_group_t world, shard, replica;
    /* The mesh (zt_comm_create_mesh): world rank = tp_rank + tp (sp_rank + sp (dp_rank + dp pp_rank)).
     * tp: the tensor-parallel ranks of one model replica (consecutive, inside a node);
     * sp: the sequence-parallel ranks at one (tp, dp) position; data: the ranks at one
     * tp position (sp x dp of them), over which the strategies shard and replicate, and
     * within which shard and replica are built. tp = sp = 1: data is the world. */
    zt_group_t tp, sp, data;
    /* pp: the pipeline ranks at one (tp, sp, dp) position, one per stage group (outermost).
     * Every other group lies within one pipeline rank. */
    zt_group_t pp;
    int mesh_tp, mesh_sp, mesh_dp, mesh_pp, dp_rank;
    int local_rank, local_size;     /* within the node */
    int node_count;
    zt_comm_stats_t stats;          /* since the last zt_comm_stats_reset; read with zt_comm_stats */
    const char *backend;            /* "mpi" | the device comm backend's name ("nccl") */
    const struct zt_comm_backend *dev;  /* device comm backend, NULL = MPI only */
    int p2p_in_order_mpi;           /* ZT_P2P_IN_ORDER=1: MPI's messages issued as a stream-ordered
                                     * backend's (zt_p2p_in_order), so tests run that order on CPUs */
    void *dev_state;                /* the device backend's own state (streams, events) */
} zt_comm_t;

/* A device comm backend: moves the collectives whose buffers are device memory.
 * Each i-function issues one collective into req (zt_comm.c has already set
 * req's kind, bytes and bus factor) and returns at once; wait completes it in
 * the backend's terms (NCCL: later compute waits for it, the host does not) and
 * adds its time to c->stats.seconds now or at the next flush. */
typedef struct zt_comm_backend {
    const char *name;
    /* collective over c->world: communicators for world, shard and replica */
    int (*init)(struct zt_comm *c, char *err, size_t errlen);
    void (*destroy)(struct zt_comm *c);
    int (*owns)(const void *p);     /* 1 when p is memory this backend moves */
    void (*iallreduce)(struct zt_comm *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t, zt_redop_t op, zt_request_t *req);
    void (*ireduce_scatter)(struct zt_comm *c, zt_group_t *g, const void *send, void *recv,
                            size_t count, zt_dtype_t t, zt_request_t *req);
    void (*iallgather)(struct zt_comm *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t, zt_request_t *req);
    void (*ireduce_scatterv)(struct zt_comm *c, zt_group_t *g, const void *send, void *recv,
                             const int *counts, zt_dtype_t t, zt_request_t *req);
    void (*iallgatherv)(struct zt_comm *c, zt_group_t *g, const void *send, void *recv,
                        const int *counts, const int *displs, zt_dtype_t t, zt_request_t *req);
    void (*ibcast)(struct zt_comm *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root,
                   zt_request_t *req);
    /* recv[r count ..) = rank r's send[rank count ..) (count elements each way) */
    void (*ialltoall)(struct zt_comm *c, zt_group_t *g, const void *send, void *recv, size_t count, zt_dtype_t t,
                      zt_request_t *req);
    /* send (count) to group rank `to` and recv (count) from `from` */
    void (*isendrecv)(struct zt_comm *c, zt_group_t *g, const void *send, int to, void *recv, int from, size_t count,
                      zt_dtype_t t, zt_request_t *req);
    /* one direction of a point-to-point message (the pipeline's); tag unused by NCCL,
     * whose messages between two ranks match in issue order */
    void (*isend)(struct zt_comm *c, zt_group_t *g, const void *send, int to, size_t count, zt_dtype_t t,
                  zt_request_t *req);
    void (*irecv)(struct zt_comm *c, zt_group_t *g, void *recv, int from, size_t count, zt_dtype_t t,
                  zt_request_t *req);
    /* n of them issued together (NCCL: one group), req[k] completing ops[k]; NULL: each
     * on its own through isend/irecv */
    void (*p2p_batch)(struct zt_comm *c, zt_group_t *g, const zt_p2p_op_t *ops, int n, zt_request_t *req);
    /* 1: its point-to-point messages are stream-ordered (zt_p2p_in_order) */
    int p2p_in_order;
    void (*wait)(struct zt_comm *c, zt_request_t *req);
    /* adds every deferred collective time to c->stats (may block until they finish) */
    void (*flush)(struct zt_comm *c);
} zt_comm_backend_t;

/* Builds world/shard/replica groups from `world`. shard_group_size 0 = one node.
 * Returns -1 with err when the size does not divide the world. */
int zt_comm_create(zt_comm_t *c, MPI_Comm world, int shard_group_size, char *err, size_t errlen);
/* The same on a pp x dp x sp x tp mesh (tp innermost, pp outermost); shard_group_size
 * counts data-group ranks (0 = one node's share). -1 with err when a size does not divide. */
int zt_comm_create_mesh(zt_comm_t *c, MPI_Comm world, int pp, int tp, int sp, int shard_group_size, char *err,
                        size_t errlen);
void zt_comm_destroy(zt_comm_t *c);
/* Folds deferred collective times in (device backends time collectives with
 * events read after the fact) and returns the counters. */
const zt_comm_stats_t *zt_comm_stats(zt_comm_t *c);
void zt_comm_stats_reset(zt_comm_t *c);

/* The comm backend that moves a compute backend's buffers: "nccl" for "cuda",
 * "mpi" for everything else (host memory). */
const char *zt_comm_backend_for(const char *compute_backend);
/* Collective over c->world: every rank must ask for the same name. "mpi" drops
 * a device backend; "nccl" selects this rank's GPU (zt_cuda_pick_device with
 * the node-local rank, within CUDA_VISIBLE_DEVICES) and creates one NCCL
 * communicator per group. Returns 0, or -1 on every rank with err (unknown
 * name, built without CUDA, no usable GPU, ranks disagreeing, two ranks of a
 * node on one GPU). */
int zt_comm_set_backend(zt_comm_t *c, const char *name, char *err, size_t errlen);
/* The same with a backend given directly (NULL = MPI only); tests use it to
 * install a recording backend. */
int zt_comm_use_backend(zt_comm_t *c, const zt_comm_backend_t *be, char *err, size_t errlen);

/* A dry communicator for counting runs (zt_memplan.h): the groups of a rank at data and tp
 * position 0 of a mesh of pp x data x tp ranks (data ranks, sp of them a sequence group,
 * split into shard groups of shard_n, replicated over data / shard_n; pp_rank its place on
 * the pipeline), every collective and message on them moved by a backend that moves nothing
 * and counts its bytes as any collective. Host scalars (zt_sum_double, zt_any) are this
 * process's own, so nothing here needs MPI initialized. Free with zt_comm_destroy_dry. */
void zt_comm_create_dry(zt_comm_t *c, int data, int tp, int sp, int shard_n, int pp, int pp_rank);
void zt_comm_destroy_dry(zt_comm_t *c);

/* Blocking collectives (in place where recv == send is allowed via ZT_IN_PLACE). */
#define ZT_IN_PLACE MPI_IN_PLACE
void zt_allreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                  zt_dtype_t t, zt_redop_t op);
/* recv (count) = sum over ranks of send[rank*count .. ) ; send holds size*count.
 * Reduce-scatters are rings of point-to-point exchanges (see zt_comm.c): the send
 * buffer is used as the accumulator and is CLOBBERED. */
void zt_reduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t);
/* recv (size*count) = concat of every rank's send (count) */
void zt_allgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                  zt_dtype_t t);
/* Variable-count versions (per-param layouts): counts/displs in elements, per rank */
void zt_reduce_scatterv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                        const int *counts, zt_dtype_t t);
void zt_allgatherv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, const int *counts,
                   const int *displs, zt_dtype_t t);
/* recv on root = every rank's send (counts[r] elements from rank r) at displs[r]; counts
 * and displs are given on every rank (the bytes are accounted alike everywhere), recv is
 * read on root only. Host buffers only (MPI): a file assembled on one rank, not training
 * traffic. Counted with the all-gathers: the same (n-1)/n of the buffer crosses into root. */
void zt_gatherv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, const int *counts,
                const int *displs, zt_dtype_t t, int root);
/* On device buffers: ZT_IN_PLACE is taken by zt_allgather(v), zt_allreduce and
 * zt_reduce_scatter (as MPI defines it), not by zt_reduce_scatterv; send and
 * recv must both be device memory or both host memory. */
void zt_bcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root);
/* recv (size count) = block r of it from rank r: that rank's send[rank count .. +count)
 * (send and recv distinct). Accounted as size count elements, bus factor (n-1)/n. */
void zt_alltoall(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count, zt_dtype_t t);

/* Non-blocking versions; zt_wait completes and accounts them. */
void zt_iallreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                   zt_dtype_t t, zt_redop_t op, zt_request_t *req);
void zt_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_request_t *req);
void zt_iallgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                   zt_dtype_t t, zt_request_t *req);
/* send (count) to group rank `to` while recv (count) arrives from `from` (a ring shift:
 * to = rank + 1, from = rank - 1); accounted as count elements, bus factor 1. */
void zt_isendrecv(zt_comm_t *c, zt_group_t *g, const void *send, int to, void *recv, int from, size_t count,
                  zt_dtype_t t, zt_request_t *req);
/* The pipeline's point-to-point messages: send (count) to group rank `to`, receive (count)
 * from `from`, matched by tag (MPI; NCCL ignores the tag and matches a pair of ranks'
 * messages in issue order). Each side accounts its own bytes, kind send-recv (bus factor 1). */
void zt_isend(zt_comm_t *c, zt_group_t *g, const void *send, int to, int tag, size_t count, zt_dtype_t t,
              zt_request_t *req);
void zt_irecv(zt_comm_t *c, zt_group_t *g, void *recv, int from, int tag, size_t count, zt_dtype_t t,
              zt_request_t *req);
/* A batch of the pipeline's messages, issued together so that none holds back another:
 * ops[k] into req[k], each accounted as zt_isend/zt_irecv's (kind send-recv, each side its
 * own bytes). Device buffers (all of the batch's or none): the device backend's batch (NCCL:
 * one ncclGroupStart/End); host buffers: an MPI_Isend/Irecv each. */
void zt_p2p_batch(zt_comm_t *c, zt_group_t *g, const zt_p2p_op_t *ops, int n, zt_request_t *req);
/* 1 when the pipeline's messages are stream-ordered: they run in issue order on one stream,
 * a pair of ranks' messages match in issue order whatever their tags, and one completes
 * only once its partner is posted (NCCL), so a step issues them as zt_schedule_plan_in_order
 * plans (zt_step.h) rather than every receive at its start. Also 1 under MPI with
 * ZT_P2P_IN_ORDER=1 in the environment (read once, at zt_comm_create): the same order with
 * tag 0, which tests compare with MPI's own. */
int zt_p2p_in_order(const zt_comm_t *c);
/* Lets a non-blocking MPI operation progress (MPI_Test) without waiting: called between
 * pieces of compute, so a transfer that MPI moves only inside its calls (shared-memory
 * rendezvous) moves during the compute. No-op for device requests. */
void zt_progress(zt_comm_t *c, zt_request_t *req);
/* MPI: the host waits. Device: later work on the compute stream waits (no host
 * block); the buffers may be reused or freed (stream-ordered) after it. */
void zt_wait(zt_comm_t *c, zt_request_t *req);

/* Before any group exists (collective over world): the fewest ranks any node has;
 * *uniform = 1 when every node has that many. */
int zt_comm_node_ranks(MPI_Comm world, int *uniform);
/* The nodes (shared-memory domains) the ranks of world are on (collective). */
int zt_comm_node_count(MPI_Comm world);
/* The model's activation collectives on c's mesh groups (zt_actcoll.h). */
void zt_comm_actcoll(zt_comm_t *c, zt_actcoll_t *out);

/* Collective decisions: every rank passes its local flag/value, all get the result. */
int zt_any(zt_comm_t *c, int local_flag);          /* logical OR over world */
double zt_sum_double(zt_comm_t *c, zt_group_t *g, double x);
double zt_max_double(zt_comm_t *c, zt_group_t *g, double x);

/* Every rank passes its local status (0 = fine) and message; returns non-zero on
 * every rank when any failed, with err holding the lowest failing rank's message. */
int zt_agree_error(zt_comm_t *c, int local_rc, char *err, size_t errlen);
/* Before groups exist: rank 0 of `comm` broadcasts a malloc'd string (NULL = a
 * read failure, returned as NULL everywhere). */
char *zt_bcast_text(MPI_Comm comm, char *text_on_root);

#endif
