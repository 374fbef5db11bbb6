/* zt_comm_nccl.c — the NCCL comm backend (include/zt_nccl.h): one communicator
 * per group, one comm stream ordered against the compute stream by events.
 *
 * v-collectives. NCCL has no all-gatherv or reduce-scatterv. They are built
 * as NCCL documents for aggregated operations: one ncclBroadcast (all-gatherv)
 * or ncclReduce (reduce-scatterv) per root rank, all inside one
 * ncclGroupStart/End, so NCCL launches them together. Against padding every
 * part to the largest and using ncclAllGather/ncclReduceScatter this needs no
 * temporary of group-size x largest part and no packing copies, and moves
 * exactly the bytes of the parts; per_param layouts are where the parts differ,
 * and their parameters are not padded for the comm layer's sake.
 *
 * Events come from a small free list: one pair per collective, recycled once
 * its time has been read. */
#include "zt_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zt_common.h"
#include "zt_cuda.h"

/* Every communicator of this process: the compute backend's host waits poll them
 * for asynchronous errors (live_check). */
#define MAX_LIVE 16
static ncclComm_t live[MAX_LIVE];

/* No ncclCommAbort on the way out: zt_fatal ends every process of the job
 * (MPI_Abort), which frees what the communicators hold, whereas ncclCommAbort
 * itself has been reported to hang (NVIDIA/nccl issues 863 and 1777), and a hang
 * here would keep MPI_Abort from ever running. */
static __attribute__((noreturn)) void fail(const char *file, int line, const zt_group_t *g,
                                           const char *call, const char *what, const char *detail)
{
    zt_fatal_at(file, line, "%s%s%s: %s%s%s%s\n---> HINT: rerun with NCCL_DEBUG=WARN for NCCL's own "
                "diagnosis", g ? "group '" : "", g ? g->name : "", g ? "': " : "", call, what,
                detail && detail[0] ? " - " : "", detail ? detail : "");
}

#define ZT_NCCL(g, call)                                                                      \
    do {                                                                                      \
        ncclResult_t zt_nrc_ = (call);                                                        \
        if (zt_nrc_ != ncclSuccess)                                                           \
            fail(__FILE__, __LINE__, (g), #call, ncclGetErrorString(zt_nrc_),                 \
                 ncclGetLastError(NULL));                                                     \
    } while (0)

#define ZT_NCCL_CUDA(call)                                                                    \
    do {                                                                                      \
        cudaError_t zt_crc_ = (call);                                                         \
        if (zt_crc_ != cudaSuccess)                                                           \
            fail(__FILE__, __LINE__, NULL, #call, cudaGetErrorString(zt_crc_), NULL);         \
    } while (0)

typedef struct pending {
    cudaEvent_t start, done;
    int kind;
} pending_t;

typedef struct nccl_state {
    cudaStream_t stream;    /* the comm stream of every group, high priority */
    cudaEvent_t dep;        /* compute-stream position the next collective waits for */
    int device;
    cudaEvent_t *pool;      /* free timing events */
    int npool, cap_pool;
    pending_t *pend;        /* waited, time not read yet */
    int npend, cap_pend;
} nccl_state_t;

static nccl_state_t *state(zt_comm_t *c)
{
    if (!c->dev_state) zt_fatal("NCCL collective before the NCCL backend was initialised");
    return (nccl_state_t *)c->dev_state;
}

static ncclComm_t comm_of(const zt_group_t *g)
{
    if (!g->backend_state) zt_fatal("group '%s' has no NCCL communicator", g->name ? g->name : "?");
    return (ncclComm_t)g->backend_state;
}

static cudaStream_t compute_stream(void) { return (cudaStream_t)zt_cuda_stream(); }

static ncclDataType_t nccl_type(zt_dtype_t t)
{
    switch (t) {
    case ZT_F32: return ncclFloat32;
    case ZT_BF16: return ncclBfloat16;
    case ZT_F16: return ncclFloat16;
    case ZT_I32: return ncclInt32;
    case ZT_F64: return ncclFloat64;
    case ZT_I64: return ncclInt64;
    case ZT_U8: return ncclUint8;
    }
    zt_fatal("NCCL: no NCCL type for dtype %d", (int)t);
}

static ncclRedOp_t nccl_op(zt_redop_t op)
{
    switch (op) {
    case ZT_SUM: return ncclSum;
    case ZT_MAX: return ncclMax;
    case ZT_MIN: return ncclMin;
    }
    zt_fatal("NCCL: unknown reduction %d", (int)op);
}

/* ---- events ------------------------------------------------------------------ */

static cudaEvent_t ev_get(nccl_state_t *st)
{
    if (st->npool) return st->pool[--st->npool];
    cudaEvent_t e;
    ZT_NCCL_CUDA(cudaEventCreate(&e)); /* timing enabled */
    return e;
}

static void ev_put(nccl_state_t *st, cudaEvent_t e)
{
    if (st->npool == st->cap_pool) {
        st->cap_pool = st->cap_pool ? 2 * st->cap_pool : 16;
        st->pool = realloc(st->pool, (size_t)st->cap_pool * sizeof *st->pool);
        if (!st->pool) zt_fatal("out of memory (NCCL event pool)");
    }
    st->pool[st->npool++] = e;
}

/* The compute backend's wait hook: a communicator in error (a dead peer, a network
 * failure) ends the job with NCCL's message instead of leaving the compute stream
 * waiting forever for a collective that will not complete. */
static void live_check(void)
{
    for (int i = 0; i < MAX_LIVE; i++) {
        if (!live[i]) continue;
        ncclResult_t ar = ncclSuccess;
        ZT_NCCL(NULL, ncclCommGetAsyncError(live[i], &ar));
        if (ar != ncclSuccess && ar != ncclInProgress)
            fail(__FILE__, __LINE__, NULL, "asynchronous error", ncclGetErrorString(ar),
                 ncclGetLastError(NULL));
    }
}

/* The host waits for ev, watching the communicators for asynchronous errors (a
 * dead peer) instead of blocking in cudaEventSynchronize forever. */
static void host_wait(cudaEvent_t ev)
{
    const struct timespec pause = {0, 50 * 1000};
    for (;;) {
        cudaError_t rc = cudaEventQuery(ev);
        if (rc == cudaSuccess) return;
        if (rc != cudaErrorNotReady) ZT_NCCL_CUDA(rc);
        live_check();
        nanosleep(&pause, NULL);
    }
}

/* Adds the times of finished collectives to c->stats; with block, of all. */
static void collect(zt_comm_t *c, int block)
{
    nccl_state_t *st = state(c);
    int keep = 0;
    for (int i = 0; i < st->npend; i++) {
        pending_t *p = &st->pend[i];
        cudaError_t rc = cudaEventQuery(p->done);
        if (rc == cudaErrorNotReady && block) {
            host_wait(p->done);
            rc = cudaSuccess;
        }
        if (rc == cudaErrorNotReady) {
            st->pend[keep++] = *p;
            continue;
        }
        ZT_NCCL_CUDA(rc);
        float ms = 0.0f;
        ZT_NCCL_CUDA(cudaEventElapsedTime(&ms, p->start, p->done));
        c->stats.seconds[p->kind] += ms * 1e-3;
        ev_put(st, p->start);
        ev_put(st, p->done);
    }
    st->npend = keep;
}

static void nccl_flush(zt_comm_t *c) { collect(c, 1); }

/* ---- set-up ------------------------------------------------------------------- */

static void register_live(ncclComm_t comm, int on)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (on ? live[i] == NULL : live[i] == comm) {
            live[i] = on ? comm : NULL;
            return;
        }
    if (on) zt_fatal("more than %d NCCL communicators in one process", MAX_LIVE);
}

static void nccl_destroy(zt_comm_t *c)
{
    nccl_state_t *st = (nccl_state_t *)c->dev_state;
    if (!st) return;
    if (st->stream) {
        collect(c, 1);
        ZT_NCCL_CUDA(cudaStreamSynchronize(st->stream));
    }
    zt_cuda_set_wait_hook(NULL);
    zt_group_t *groups[] = {&c->world, &c->shard, &c->replica, &c->tp, &c->sp, &c->data, &c->pp};
    for (int i = 0; i < 7; i++) {
        ncclComm_t comm = (ncclComm_t)groups[i]->backend_state;
        if (!comm) continue;
        register_live(comm, 0);
        ZT_NCCL(groups[i], ncclCommDestroy(comm));
        groups[i]->backend_state = NULL;
    }
    for (int i = 0; i < st->npool; i++) ZT_NCCL_CUDA(cudaEventDestroy(st->pool[i]));
    if (st->dep) ZT_NCCL_CUDA(cudaEventDestroy(st->dep));
    if (st->stream) ZT_NCCL_CUDA(cudaStreamDestroy(st->stream));
    free(st->pool);
    free(st->pend);
    free(st);
    c->dev_state = NULL;
}

/* Two ranks of a node on one GPU: NCCL refuses the communicator ("duplicate
 * GPU") inside ncclCommInitRank, where it cannot be agreed on; say it here. */
static int check_distinct_gpus(zt_comm_t *c, int device, char *err, size_t errlen)
{
    char mine[32] = "", *all = zt_calloc((size_t)c->local_size, sizeof mine);
    int rc = cudaDeviceGetPCIBusId(mine, sizeof mine, device) == cudaSuccess ? 0 : -1;
    if (rc) zt_err(err, errlen, "cudaDeviceGetPCIBusId(%d) failed on rank %d", device, c->world.rank);
    MPI_Comm node;
    ZT_MPI(MPI_Comm_split_type(c->world.comm, MPI_COMM_TYPE_SHARED, c->world.rank, MPI_INFO_NULL, &node));
    ZT_MPI(MPI_Allgather(mine, sizeof mine, MPI_CHAR, all, sizeof mine, MPI_CHAR, node));
    ZT_MPI(MPI_Comm_free(&node));
    for (int r = 0; r < c->local_rank && rc == 0 && mine[0]; r++)
        if (strcmp(all + (size_t)r * sizeof mine, mine) == 0)
            rc = zt_err(err, errlen, "local ranks %d and %d on %s would share GPU %s (%d visible): start "
                        "at most %d ranks per node, or give each its own GPU with CUDA_VISIBLE_DEVICES",
                        r, c->local_rank, zt_hostname(), mine, zt_cuda_device_count(),
                        zt_cuda_device_count());
    free(all);
    return rc;
}

/* The group's communicator: the unique id from its rank 0, with a success flag,
 * so that a failure there is returned on every rank of the group. */
static int init_group(zt_group_t *g, char *err, size_t errlen)
{
    struct { int ok; char why[128]; ncclUniqueId id; } hello;
    memset(&hello, 0, sizeof hello);
    if (g->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&hello.id);
        hello.ok = r == ncclSuccess;
        if (!hello.ok) snprintf(hello.why, sizeof hello.why, "%s", ncclGetErrorString(r));
    }
    ZT_MPI(MPI_Bcast(&hello, (int)sizeof hello, MPI_BYTE, 0, g->comm));
    if (!hello.ok)
        return zt_err(err, errlen, "NCCL: ncclGetUniqueId for group '%s' failed: %s", g->name, hello.why);
    ncclComm_t comm;
    ZT_NCCL(g, ncclCommInitRank(&comm, g->size, hello.id, g->rank));
    register_live(comm, 1);
    g->backend_state = comm;
    return 0;
}

static int nccl_init(zt_comm_t *c, char *err, size_t errlen)
{
    char why[ZT_ERRLEN] = "";
    int rc = 0;
    if (!zt_cuda_available(why, sizeof why))
        rc = zt_err(err, errlen, "comm backend \"nccl\": no usable GPU on rank %d (%s): %s", c->world.rank,
                    zt_hostname(), why);
    if (zt_agree_error(c, rc, err, errlen)) return -1;
    const int device = zt_cuda_pick_device(c->local_rank);
    rc = check_distinct_gpus(c, device, err, errlen);
    if (zt_agree_error(c, rc, err, errlen)) return -1;

    nccl_state_t *st = zt_calloc(1, sizeof *st);
    st->device = device;
    c->dev_state = st;
    int least = 0, greatest = 0;
    ZT_NCCL_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ZT_NCCL_CUDA(cudaStreamCreateWithPriority(&st->stream, cudaStreamNonBlocking, greatest));
    ZT_NCCL_CUDA(cudaEventCreateWithFlags(&st->dep, cudaEventDisableTiming));
    zt_group_t *groups[] = {&c->world, &c->shard, &c->replica, &c->tp, &c->sp, &c->data, &c->pp};
    for (int i = 0; i < 7; i++) {
        rc = init_group(groups[i], err, errlen);
        /* every rank takes part in all of them, so a world-wide agreement fits here */
        if (zt_agree_error(c, rc, err, errlen)) {
            nccl_destroy(c);
            return -1;
        }
    }
    zt_cuda_set_wait_hook(live_check);
    return 0;
}

static int nccl_owns(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* ---- issue and completion --------------------------------------------------------- */

/* The comm stream waits for the compute stream's work queued so far: the
 * gradients the collective reads, and the last reads of a buffer that the
 * shard engine recycled as this collective's output. */
static cudaStream_t issue(zt_comm_t *c, zt_request_t *req)
{
    nccl_state_t *st = state(c);
    ZT_NCCL_CUDA(cudaEventRecord(st->dep, compute_stream()));
    ZT_NCCL_CUDA(cudaStreamWaitEvent(st->stream, st->dep, 0));
    cudaEvent_t start = ev_get(st), done = ev_get(st);
    ZT_NCCL_CUDA(cudaEventRecord(start, st->stream));
    req->ev_start = start;
    req->ev_done = done;
    return st->stream;
}

static void issued(zt_comm_t *c, zt_request_t *req)
{
    ZT_NCCL_CUDA(cudaEventRecord((cudaEvent_t)req->ev_done, state(c)->stream));
}

static void nccl_wait(zt_comm_t *c, zt_request_t *req)
{
    nccl_state_t *st = state(c);
    ZT_NCCL_CUDA(cudaStreamWaitEvent(compute_stream(), (cudaEvent_t)req->ev_done, 0));
    if (st->npend == st->cap_pend) {
        st->cap_pend = st->cap_pend ? 2 * st->cap_pend : 16;
        st->pend = realloc(st->pend, (size_t)st->cap_pend * sizeof *st->pend);
        if (!st->pend) zt_fatal("out of memory (NCCL pending timings)");
    }
    st->pend[st->npend++] = (pending_t){(cudaEvent_t)req->ev_start, (cudaEvent_t)req->ev_done, req->kind};
    req->ev_start = req->ev_done = NULL;
    collect(c, 0);
}

/* ---- collectives ------------------------------------------------------------------ */

static void nccl_iallreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                            zt_dtype_t t, zt_redop_t op, zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    const void *src = send == ZT_IN_PLACE ? recv : send;
    ZT_NCCL(g, ncclAllReduce(src, recv, count, nccl_type(t), nccl_op(op), comm_of(g), s));
    issued(c, req);
}

static void nccl_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                                 size_t count, zt_dtype_t t, zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    const size_t es = zt_dtype_size(t);
    if (send == ZT_IN_PLACE) {
        // recv holds the group's (n*count) input; NCCL's in-place result lands at
        // recv + rank*count, MPI's at recv[0..count): move it (disjoint for rank > 0)
        char *own = (char *)recv + (size_t)g->rank * count * es;
        ZT_NCCL(g, ncclReduceScatter(recv, own, count, nccl_type(t), ncclSum, comm_of(g), s));
        if (g->rank != 0 && count)
            ZT_NCCL_CUDA(cudaMemcpyAsync(recv, own, count * es, cudaMemcpyDeviceToDevice, s));
    } else {
        ZT_NCCL(g, ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, comm_of(g), s));
    }
    issued(c, req);
}

static void nccl_iallgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                            zt_dtype_t t, zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    // in place (MPI's meaning): this rank's part is already at recv + rank*count
    const void *src =
        send == ZT_IN_PLACE ? (const char *)recv + (size_t)g->rank * count * zt_dtype_size(t) : send;
    ZT_NCCL(g, ncclAllGather(src, recv, count, nccl_type(t), comm_of(g), s));
    issued(c, req);
}

/* Part r of send (counts[r] elements, packed in rank order) is summed into
 * rank r's recv: one ncclReduce per root, launched as one group. */
static void nccl_ireduce_scatterv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                                  const int *counts, zt_dtype_t t, zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    const size_t es = zt_dtype_size(t);
    size_t off = 0;
    ZT_NCCL(g, ncclGroupStart());
    for (int r = 0; r < g->size; r++) {
        ZT_NCCL(g, ncclReduce((const char *)send + off * es, r == g->rank ? recv : NULL,
                              (size_t)counts[r], nccl_type(t), ncclSum, r, comm_of(g), s));
        off += (size_t)counts[r];
    }
    ZT_NCCL(g, ncclGroupEnd());
    issued(c, req);
}

/* Rank r's part lands at recv + displs[r] everywhere: one ncclBroadcast per root,
 * launched as one group; in place, the root's part is already there. */
static void nccl_iallgatherv(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                             const int *counts, const int *displs, zt_dtype_t t, zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    const size_t es = zt_dtype_size(t);
    ZT_NCCL(g, ncclGroupStart());
    for (int r = 0; r < g->size; r++) {
        char *dst = (char *)recv + (size_t)displs[r] * es;
        const void *src = r == g->rank && send != ZT_IN_PLACE ? send : dst;
        ZT_NCCL(g, ncclBroadcast(src, dst, (size_t)counts[r], nccl_type(t), r, comm_of(g), s));
    }
    ZT_NCCL(g, ncclGroupEnd());
    issued(c, req);
}

/* point-to-point pairs in one NCCL group: NCCL has no all-to-all collective */
static void nccl_ialltoall(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count, zt_dtype_t t,
                           zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    const size_t b = count * zt_dtype_size(t);
    ZT_NCCL(g, ncclGroupStart());
    for (int p = 0; p < g->size; p++) {
        ZT_NCCL(g, ncclSend((const char *)send + (size_t)p * b, count, nccl_type(t), p, comm_of(g), s));
        ZT_NCCL(g, ncclRecv((char *)recv + (size_t)p * b, count, nccl_type(t), p, comm_of(g), s));
    }
    ZT_NCCL(g, ncclGroupEnd());
    issued(c, req);
}

static void nccl_isendrecv(zt_comm_t *c, zt_group_t *g, const void *send, int to, void *recv, int from,
                           size_t count, zt_dtype_t t, zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    ZT_NCCL(g, ncclGroupStart());
    ZT_NCCL(g, ncclSend(send, count, nccl_type(t), to, comm_of(g), s));
    ZT_NCCL(g, ncclRecv(recv, count, nccl_type(t), from, comm_of(g), s));
    ZT_NCCL(g, ncclGroupEnd());
    issued(c, req);
}

static void nccl_isend(zt_comm_t *c, zt_group_t *g, const void *send, int to, size_t count, zt_dtype_t t,
                       zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    ZT_NCCL(g, ncclSend(send, count, nccl_type(t), to, comm_of(g), s));
    issued(c, req);
}

static void nccl_irecv(zt_comm_t *c, zt_group_t *g, void *recv, int from, size_t count, zt_dtype_t t,
                       zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    ZT_NCCL(g, ncclRecv(recv, count, nccl_type(t), from, comm_of(g), s));
    issued(c, req);
}

/* The pipeline's batch of messages as one NCCL group: its sends and receives progress
 * together, so a receive in it cannot hold back a send in it (between two ranks, NCCL
 * matches them in issue order). Every request shares the group's completion: each gets
 * events of its own, recorded around the one group, as the free list recycles them per
 * request at its wait. */
static void nccl_p2p_batch(zt_comm_t *c, zt_group_t *g, const zt_p2p_op_t *ops, int n, zt_request_t *req)
{
    nccl_state_t *st = state(c);
    cudaStream_t s = issue(c, &req[0]);
    for (int k = 1; k < n; k++) {
        req[k].ev_start = ev_get(st);
        req[k].ev_done = ev_get(st);
        ZT_NCCL_CUDA(cudaEventRecord((cudaEvent_t)req[k].ev_start, s));
    }
    ZT_NCCL(g, ncclGroupStart());
    for (int k = 0; k < n; k++)
        if (ops[k].send) ZT_NCCL(g, ncclSend(ops[k].buf, ops[k].count, nccl_type(ops[k].t), ops[k].peer, comm_of(g), s));
        else ZT_NCCL(g, ncclRecv(ops[k].buf, ops[k].count, nccl_type(ops[k].t), ops[k].peer, comm_of(g), s));
    ZT_NCCL(g, ncclGroupEnd());
    for (int k = 0; k < n; k++) issued(c, &req[k]);
}

static void nccl_ibcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root,
                        zt_request_t *req)
{
    cudaStream_t s = issue(c, req);
    ZT_NCCL(g, ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_of(g), s));
    issued(c, req);
}

const zt_comm_backend_t zt_comm_nccl = {
    .name = "nccl",
    .init = nccl_init,
    .destroy = nccl_destroy,
    .owns = nccl_owns,
    .iallreduce = nccl_iallreduce,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iallgather = nccl_iallgather,
    .ireduce_scatterv = nccl_ireduce_scatterv,
    .iallgatherv = nccl_iallgatherv,
    .ibcast = nccl_ibcast,
    .ialltoall = nccl_ialltoall,
    .isendrecv = nccl_isendrecv,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .p2p_batch = nccl_p2p_batch,
    .p2p_in_order = 1,
    .wait = nccl_wait,
    .flush = nccl_flush,
};
