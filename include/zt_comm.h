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
 * A comm backend is a struct of function pointers (MPI always; NCCL with CUDA). */
#ifndef ZT_COMM_H
#define ZT_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

typedef enum { ZT_F32 = 0, ZT_BF16 = 1, ZT_I32 = 2, ZT_F64 = 3, ZT_I64 = 4, ZT_U8 = 5, ZT_F16 = 6 } zt_dtype_t;
typedef enum { ZT_SUM = 0, ZT_MAX = 1, ZT_MIN = 2 } zt_redop_t;
typedef enum { ZT_COLL_ALLREDUCE = 0, ZT_COLL_REDUCE_SCATTER, ZT_COLL_ALLGATHER, ZT_COLL_BCAST,
               ZT_COLL_N } zt_coll_kind_t;

size_t zt_dtype_size(zt_dtype_t t);

typedef struct zt_group {
    MPI_Comm comm;
    int rank, size;
    const char *name;       /* "world", "shard", "replica" */
    void *backend_state;    /* e.g. an ncclComm_t */
} zt_group_t;

typedef struct zt_comm_stats {
    double bytes[ZT_COLL_N];    /* user-buffer bytes (nccl-tests "size") */
    double bus_bytes[ZT_COLL_N];/* bytes * bus factor, so busbw = bus_bytes / seconds */
    double seconds[ZT_COLL_N];  /* from issue to completion (waited) */
    long calls[ZT_COLL_N];
} zt_comm_stats_t;

typedef struct zt_request {
    MPI_Request req;
    int kind;
    double t0, bus, bytes;
    /* a reduce-scatter runs as a ring of point-to-point steps inside zt_wait */
    struct zt_group *g;
    void *send, *recv;
    size_t count;
    zt_dtype_t t;
} zt_request_t;

typedef struct zt_comm {
    zt_group_t world, shard, replica;
    int local_rank, local_size;     /* within the node */
    int node_count;
    zt_comm_stats_t stats;          /* since the last zt_comm_stats_reset */
    const char *backend;            /* "mpi" | "nccl" */
} zt_comm_t;

/* Builds world/shard/replica groups from `world`. shard_group_size 0 = one node.
 * Returns -1 with err when the size does not divide the world. */
int zt_comm_create(zt_comm_t *c, MPI_Comm world, int shard_group_size, char *err, size_t errlen);
void zt_comm_destroy(zt_comm_t *c);
void zt_comm_stats_reset(zt_comm_t *c);

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
void zt_bcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root);

/* Non-blocking versions; zt_wait completes and accounts them. */
void zt_iallreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                   zt_dtype_t t, zt_redop_t op, zt_request_t *req);
void zt_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_request_t *req);
void zt_iallgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                   zt_dtype_t t, zt_request_t *req);
void zt_wait(zt_comm_t *c, zt_request_t *req);

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
