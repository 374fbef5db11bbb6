/* zt_comm_nccl.c — NCCL collectives on device buffers, one communicator and one
 * comm stream per group (include/zt_nccl.h).
 *
 * Why a stream per group and events instead of host syncs: the compute stream
 * keeps running backward kernels while a unit's gradients are reduced, and the
 * comm stream only waits for the work that produced those gradients (an event
 * recorded on the compute stream at issue time). The host blocks only in the
 * blocking calls and zt_nccl_wait.
 *
 * Initialisation is made collective before anything can hang: every rank's
 * cudaSetDevice result is all-reduced, and rank 0 broadcasts the unique id
 * together with a success flag, so a failure on one rank is reported on all
 * ranks instead of leaving the others blocked in MPI_Bcast. A failure inside
 * ncclCommInitRank itself is returned too, though NCCL may keep other ranks
 * waiting there (NCCL's own timeouts apply).
 *
 * Every CUDA and NCCL call is checked; failures after initialisation are fatal
 * (zt_fatal aborts the whole job: a collective cannot be half done). */
#include "zt_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_cuda.h"

#define ZT_NCCL_CUDA(call)                                                             \
    do {                                                                               \
        cudaError_t zt_rc_ = (call);                                                   \
        if (zt_rc_ != cudaSuccess)                                                     \
            zt_fatal_at(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(zt_rc_)); \
    } while (0)

#define ZT_NCCL(comm, call)                                                                \
    do {                                                                                   \
        ncclResult_t zt_nrc_ = (call);                                                     \
        if (zt_nrc_ != ncclSuccess)                                                        \
            zt_fatal_at(__FILE__, __LINE__, "%s: NCCL %s (%s)\n---> HINT: rerun with "     \
                        "NCCL_DEBUG=WARN for NCCL's own diagnosis", #call,                 \
                        ncclGetErrorString(zt_nrc_), ncclGetLastError(comm));              \
    } while (0)

typedef struct zt_nccl_group {
    ncclComm_t comm;
    cudaStream_t stream;    /* high priority, non-blocking */
    cudaEvent_t dep;        /* compute-stream position the next collective waits for */
    int device;
} zt_nccl_group_t;

static zt_nccl_group_t *state(const zt_group_t *g)
{
    zt_nccl_group_t *s = (zt_nccl_group_t *)g->backend_state;
    if (!s) zt_fatal("NCCL collective on group '%s' before zt_nccl_init", g->name ? g->name : "?");
    return s;
}

void *zt_nccl_comm(const zt_group_t *g) { return (void *)state(g)->comm; }
void *zt_nccl_stream(const zt_group_t *g) { return (void *)state(g)->stream; }

int zt_nccl_init(zt_group_t *g, int device, char *err, size_t errlen)
{
    char msg[ZT_ERRLEN] = "";
    cudaError_t crc = cudaSetDevice(device);
    int ok = crc == cudaSuccess, all_ok = 0;
    if (!ok) snprintf(msg, sizeof msg, "cudaSetDevice(%d): %s", device, cudaGetErrorString(crc));
    ZT_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g->comm));
    if (!all_ok)
        return zt_err(err, errlen, "NCCL init for group '%s': %s", g->name ? g->name : "?",
                      ok ? "a CUDA device could not be selected on another rank" : msg);

    struct { int ok; char why[128]; ncclUniqueId id; } hello;
    memset(&hello, 0, sizeof hello);
    if (g->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&hello.id);
        hello.ok = r == ncclSuccess;
        if (!hello.ok) snprintf(hello.why, sizeof hello.why, "ncclGetUniqueId: %s",
                                ncclGetErrorString(r));
    }
    ZT_MPI(MPI_Bcast(&hello, (int)sizeof hello, MPI_BYTE, 0, g->comm));
    if (!hello.ok)
        return zt_err(err, errlen, "NCCL init for group '%s': %s", g->name ? g->name : "?",
                      hello.why);

    zt_nccl_group_t *s = zt_calloc(1, sizeof *s);
    s->device = device;
    ncclResult_t r = ncclCommInitRank(&s->comm, g->size, hello.id, g->rank);
    if (r != ncclSuccess) {
        zt_err(err, errlen, "NCCL init for group '%s' (rank %d of %d, device %d): %s",
               g->name ? g->name : "?", g->rank, g->size, device, ncclGetErrorString(r));
        free(s);
        return -1;
    }
    int least = 0, greatest = 0;
    ZT_NCCL_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ZT_NCCL_CUDA(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, greatest));
    ZT_NCCL_CUDA(cudaEventCreateWithFlags(&s->dep, cudaEventDisableTiming));
    g->backend_state = s;
    return 0;
}

void zt_nccl_destroy(zt_group_t *g)
{
    zt_nccl_group_t *s = (zt_nccl_group_t *)g->backend_state;
    if (!s) return;
    ZT_NCCL_CUDA(cudaStreamSynchronize(s->stream));
    ZT_NCCL(s->comm, ncclCommDestroy(s->comm));
    ZT_NCCL_CUDA(cudaEventDestroy(s->dep));
    ZT_NCCL_CUDA(cudaStreamDestroy(s->stream));
    free(s);
    g->backend_state = NULL;
}

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
    zt_fatal("NCCL: unknown dtype %d", (int)t);
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

/* Same element sizes as zt_comm.c's zt_dtype_size, kept local so that this file
 * does not depend on the MPI comm backend being linked. */
static size_t elem_size(zt_dtype_t t)
{
    switch (t) {
    case ZT_F32: case ZT_I32: return 4;
    case ZT_BF16: case ZT_F16: return 2;
    case ZT_F64: case ZT_I64: return 8;
    case ZT_U8: return 1;
    }
    return 1;
}

void zt_nccl_after_compute(zt_group_t *g)
{
    zt_nccl_group_t *s = state(g);
    ZT_NCCL_CUDA(cudaEventRecord(s->dep, (cudaStream_t)zt_cuda_stream()));
    ZT_NCCL_CUDA(cudaStreamWaitEvent(s->stream, s->dep, 0));
}

/* Orders after compute and brackets the collective with timing events. */
static zt_nccl_group_t *begin(zt_group_t *g, zt_nccl_request_t *req, zt_coll_kind_t kind,
                              double bytes, double bus_factor)
{
    zt_nccl_group_t *s = state(g);
    zt_nccl_after_compute(g);
    cudaEvent_t start, done;
    ZT_NCCL_CUDA(cudaEventCreate(&start));
    ZT_NCCL_CUDA(cudaEventCreate(&done));
    ZT_NCCL_CUDA(cudaEventRecord(start, s->stream));
    req->start = start;
    req->done = done;
    req->kind = (int)kind;
    req->bytes = bytes;
    req->bus = bus_factor;
    req->active = 1;
    return s;
}

static void end(zt_nccl_group_t *s, zt_nccl_request_t *req)
{
    ZT_NCCL_CUDA(cudaEventRecord((cudaEvent_t)req->done, s->stream));
}

void zt_nccl_iallreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_redop_t op, zt_nccl_request_t *req)
{
    (void)c;
    int n = g->size;
    double bytes = (double)count * elem_size(t);
    zt_nccl_group_t *s = begin(g, req, ZT_COLL_ALLREDUCE, bytes, n > 1 ? 2.0 * (n - 1) / n : 0.0);
    const void *src = send == ZT_IN_PLACE ? recv : send;
    ZT_NCCL(s->comm, ncclAllReduce(src, recv, count, nccl_type(t), nccl_op(op), s->comm, s->stream));
    end(s, req);
}

void zt_nccl_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                             size_t count, zt_dtype_t t, zt_nccl_request_t *req)
{
    (void)c;
    int n = g->size;
    size_t es = elem_size(t);
    zt_nccl_group_t *s = begin(g, req, ZT_COLL_REDUCE_SCATTER, (double)count * n * es,
                               n > 1 ? (double)(n - 1) / n : 0.0);
    if (send == ZT_IN_PLACE) {
        // recv holds the group's (n*count) input; NCCL's in-place result lands at
        // recv + rank*count, MPI's at recv[0..count): move it (disjoint for rank > 0)
        char *own = (char *)recv + (size_t)g->rank * count * es;
        ZT_NCCL(s->comm, ncclReduceScatter(recv, own, count, nccl_type(t), ncclSum, s->comm,
                                           s->stream));
        if (g->rank != 0 && count)
            ZT_NCCL_CUDA(cudaMemcpyAsync(recv, own, count * es, cudaMemcpyDeviceToDevice, s->stream));
    } else {
        ZT_NCCL(s->comm, ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, s->comm,
                                           s->stream));
    }
    end(s, req);
}

void zt_nccl_iallgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                        zt_dtype_t t, zt_nccl_request_t *req)
{
    (void)c;
    int n = g->size;
    size_t es = elem_size(t);
    zt_nccl_group_t *s = begin(g, req, ZT_COLL_ALLGATHER, (double)count * n * es,
                               n > 1 ? (double)(n - 1) / n : 0.0);
    const void *src = send == ZT_IN_PLACE ? (const char *)recv + (size_t)g->rank * count * es : send;
    ZT_NCCL(s->comm, ncclAllGather(src, recv, count, nccl_type(t), s->comm, s->stream));
    end(s, req);
}

void zt_nccl_ibcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root,
                    zt_nccl_request_t *req)
{
    (void)c;
    zt_nccl_group_t *s = begin(g, req, ZT_COLL_BCAST, (double)count * elem_size(t), 1.0);
    ZT_NCCL(s->comm, ncclBroadcast(buf, buf, count, nccl_type(t), root, s->comm, s->stream));
    end(s, req);
}

void zt_nccl_stream_wait(const zt_nccl_request_t *req)
{
    if (!req->active) zt_fatal("zt_nccl_stream_wait on a completed or unissued request");
    ZT_NCCL_CUDA(cudaStreamWaitEvent((cudaStream_t)zt_cuda_stream(), (cudaEvent_t)req->done, 0));
}

int zt_nccl_test(const zt_nccl_request_t *req)
{
    if (!req->active) return 1;
    cudaError_t rc = cudaEventQuery((cudaEvent_t)req->done);
    if (rc == cudaErrorNotReady) return 0;
    ZT_NCCL_CUDA(rc);
    return 1;
}

void zt_nccl_wait(zt_comm_t *c, zt_nccl_request_t *req)
{
    if (!req->active) zt_fatal("zt_nccl_wait on a completed or unissued request");
    cudaEvent_t start = (cudaEvent_t)req->start, done = (cudaEvent_t)req->done;
    ZT_NCCL_CUDA(cudaEventSynchronize(done));
    float ms = 0.0f;
    ZT_NCCL_CUDA(cudaEventElapsedTime(&ms, start, done));
    if (c) {
        c->stats.bytes[req->kind] += req->bytes;
        c->stats.bus_bytes[req->kind] += req->bytes * req->bus;
        c->stats.seconds[req->kind] += ms * 1e-3;
        c->stats.calls[req->kind]++;
    }
    ZT_NCCL_CUDA(cudaEventDestroy(start));
    ZT_NCCL_CUDA(cudaEventDestroy(done));
    req->start = req->done = NULL;
    req->active = 0;
}

void zt_nccl_allreduce(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t, zt_redop_t op)
{
    zt_nccl_request_t r;
    zt_nccl_iallreduce(c, g, send, recv, count, t, op, &r);
    zt_nccl_wait(c, &r);
}

void zt_nccl_reduce_scatter(zt_comm_t *c, zt_group_t *g, const void *send, void *recv,
                            size_t count, zt_dtype_t t)
{
    zt_nccl_request_t r;
    zt_nccl_ireduce_scatter(c, g, send, recv, count, t, &r);
    zt_nccl_wait(c, &r);
}

void zt_nccl_allgather(zt_comm_t *c, zt_group_t *g, const void *send, void *recv, size_t count,
                       zt_dtype_t t)
{
    zt_nccl_request_t r;
    zt_nccl_iallgather(c, g, send, recv, count, t, &r);
    zt_nccl_wait(c, &r);
}

void zt_nccl_bcast(zt_comm_t *c, zt_group_t *g, void *buf, size_t count, zt_dtype_t t, int root)
{
    zt_nccl_request_t r;
    zt_nccl_ibcast(c, g, buf, count, t, root, &r);
    zt_nccl_wait(c, &r);
}
