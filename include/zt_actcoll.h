/* zt_actcoll.h — the activation collectives the model is handed under tensor (and,
 * later, sequence) parallelism.
 *
 * The model knows no MPI (doc/design.md): when a family's block needs the other tp
 * ranks' partial sums (after a row-parallel GEMM, the embedding, the head), it calls
 * through this table, which the comm module fills (zt_comm_actcoll) with its own
 * collectives on the mesh's groups, so their bytes and time are accounted like every
 * other collective's. Buffers are the compute backend's memory. */
#ifndef ZT_ACTCOLL_H
#define ZT_ACTCOLL_H

#include <stddef.h>

enum { ZT_ACT_SUM = 0, ZT_ACT_MAX = 1 };

typedef struct zt_actcoll {
    void *ctx;
    /* x (n) := the sum (ZT_ACT_SUM) or maximum (ZT_ACT_MAX) over the tp ranks, in place;
     * every rank gets the same bits */
    void (*tp_allreduce)(void *ctx, float *x, size_t n, int op);
    /* recv (tp n) = every tp rank's send (n), in tp rank order */
    void (*tp_allgather)(void *ctx, const float *send, float *recv, size_t n);
    /* recv (n) = the sum over the tp ranks of their send block of this rank (send holds
     * tp blocks of n; clobbered) */
    void (*tp_reduce_scatter)(void *ctx, float *send, float *recv, size_t n);
    /* sequence parallelism (Ulysses): recv block r (n floats) = sp rank r's send block
     * of this rank (send and recv hold sp blocks of n) */
    void (*sp_alltoall)(void *ctx, const float *send, float *recv, size_t n);
    /* ring attention: send (n) to the next sp rank while recv (n) comes from the previous
     * one; returns a handle that sp_ring_wait completes (the model computes between) */
    void *(*sp_ring_start)(void *ctx, const float *send, float *recv, size_t n);
    void (*sp_ring_wait)(void *ctx, void *handle);
    /* lets the transfer move between pieces of compute (MPI moves it only in its calls) */
    void (*sp_ring_progress)(void *ctx, void *handle);
} zt_actcoll_t;

#endif
