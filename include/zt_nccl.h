/* zt_nccl.h — the NCCL comm backend: collectives on device buffers.
 *
 * Installed with zt_comm_set_backend(c, "nccl") (the train loop does it when
 * the compute backend is cuda); from then on zt_comm.c hands every data
 * collective whose buffers are device memory to it. Free of CUDA and NCCL
 * headers, so any module may include it; it exists only in builds configured
 * --with-cuda (ZT_HAVE_CUDA).
 *
 * Communicators: one per group (world, shard, replica). The group's rank 0
 * makes the unique id, MPI_Bcast over the group's MPI communicator carries it,
 * then ncclCommInitRank. The device is chosen first, in one place: the
 * node-local rank modulo the devices the runtime sees (CUDA_VISIBLE_DEVICES
 * already applied), and two ranks of a node on one GPU are refused before NCCL
 * would be.
 *
 * Streams and ordering. All collectives run on one high-priority comm stream
 * per process, in program order, which is the same on every rank: NCCL kernels
 * of different communicators on concurrent streams may deadlock each other
 * (NCCL's documentation), so the groups share the stream. Issue: an event
 * recorded on the compute stream, the comm stream waits for it, so the
 * collective sees everything queued before it (finished gradients) and does
 * not overwrite a recycled buffer the compute stream still reads; then the
 * collective between two timing events. zt_wait: the compute stream waits for
 * the done event (cudaStreamWaitEvent) and the host returns at once, so unit
 * k's reduce-scatter runs while unit k-1's backward computes, and zero3's
 * prefetched all-gather of unit k+1 while unit k computes. Blocking calls are
 * issue + zt_wait: they too return before the data moved, and every later
 * kernel, copy or to_host on the compute stream sees the result.
 *
 * Time: the device time between the two events (the collective itself,
 * including any wait for peers inside NCCL; not the time queued behind
 * compute), read without blocking at zt_wait when already done, otherwise
 * kept and folded in at the next zt_wait that finds it done or at
 * zt_comm_stats (which may block until it is).
 *
 * Errors: a failing NCCL or CUDA call prints the call, NCCL's message and
 * last-error text with rank, host and file:line and aborts the job (MPI_Abort,
 * which ends the other ranks, including those blocked inside NCCL kernels; no
 * ncclCommAbort first: it is reported to hang, NVIDIA/nccl 863 and 1777). Set-up failures before ncclCommInitRank are returned on every
 * rank; a failure inside ncclCommInitRank is fatal, because the other ranks
 * may be inside NCCL's bootstrap where no MPI agreement can reach them. */
#ifndef ZT_NCCL_H
#define ZT_NCCL_H

#include "zt_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const zt_comm_backend_t zt_comm_nccl;

#ifdef __cplusplus
}
#endif

#endif
