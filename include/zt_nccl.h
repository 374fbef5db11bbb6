/* zt_nccl.h — NCCL collectives for device buffers, one communicator per group.
 *
 * Mirrors include/zt_comm.h (same groups, dtypes, ops and byte/time accounting
 * into zt_comm_t.stats) for buffers that live in CUDA device memory. Free of
 * CUDA and NCCL headers, so any module may include it; the functions exist only
 * in builds configured --with-cuda (ZT_HAVE_CUDA).
 *
 * Streams. Kernels run on the compute backend's stream (zt_cuda_stream()). Each
 * group has its own high-priority comm stream, so a gradient reduce-scatter can
 * overlap the next unit's backward and the replica all-reduce can overlap the
 * shard one. Every collective first makes its comm stream wait (an event, not a
 * host sync) for the work already queued on the compute stream, so it sees the
 * gradients the kernels before it produced.
 *
 * Completion. Blocking calls return when the result is in place (host waits).
 * Non-blocking calls return a request; zt_nccl_stream_wait() makes later compute
 * kernels wait for it without blocking the host (prefetching the next unit's
 * all-gather), and zt_nccl_wait() blocks the host, accounts the collective and
 * releases the request. Each request is completed by exactly one zt_nccl_wait.
 * Time accounted is the collective's own device time (events around it), not
 * the time it spent queued behind compute.
 *
 * In place: ZT_IN_PLACE as send has MPI's meaning, translated to NCCL's
 * (reduce-scatter: the group's full input in recv, result at recv[0..count);
 * all-gather: this rank's part already at recv + rank*count). */
#ifndef ZT_NCCL_H
#define ZT_NCCL_H

#include <stddef.h>

#include "zt_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates the group's NCCL communicator on `device` (already chosen with
 * zt_cuda_pick_device): rank 0 of g makes the unique id, MPI_Bcast over
 * g->comm, ncclCommInitRank. Collective over g. g->backend_state then points at
 * a zt_nccl_group_t (communicator, comm stream, device). Returns 0, or -1 with
 * NCCL's message (the caller turns it into a collective decision). */
int zt_nccl_init(zt_group_t *g, int device, char *err, size_t errlen);
/* Waits for the group's comm stream, destroys communicator and stream. */
void zt_nccl_destroy(zt_group_t *g);

/* ncclComm_t and cudaStream_t of an initialised group, as opaque pointers. */
void *zt_nccl_comm(const zt_group_t *g);
void *zt_nccl_stream(const zt_group_t *g);

/* Blocking collectives on device buffers (signatures as in zt_comm.h). */
void zt_nccl_allreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t, zt_redop_t op);
void zt_nccl_reduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                            size_t count, zt_dtype_t t);
void zt_nccl_allgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t);
void zt_nccl_bcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root);

/* Non-blocking: issued on the group's comm stream, completed by zt_nccl_wait. */
typedef struct zt_nccl_request {
    void *start, *done;     /* cudaEvent_t around the collective */
    int kind;               /* zt_coll_kind_t */
    double bus, bytes;      /* accounting, as zt_request_t */
    int active;
} zt_nccl_request_t;

void zt_nccl_iallreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_redop_t op, zt_nccl_request_t *req);
void zt_nccl_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                             size_t count, zt_dtype_t t, zt_nccl_request_t *req);
void zt_nccl_iallgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_nccl_request_t *req);
void zt_nccl_ibcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root,
                    zt_nccl_request_t *req);

/* Work queued on the compute stream after this call waits for req (no host block). */
void zt_nccl_stream_wait(const zt_nccl_request_t *req);
/* 1 when req has completed on the device (never blocks). */
int zt_nccl_test(const zt_nccl_request_t *req);
/* Host waits for req, adds it to c->stats and releases it. */
void zt_nccl_wait(zt_comm_t *c, zt_nccl_request_t *req);

/* Ordering helper: g's comm stream waits for everything queued so far on the
 * compute stream (the collectives above already do this themselves). */
void zt_nccl_after_compute(zt_group_t *g);

#ifdef __cplusplus
}
#endif

#endif
