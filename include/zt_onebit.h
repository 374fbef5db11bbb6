/* zt_onebit.h — DeepSpeed's 1-bit Adam: its update and its compressed momentum all-reduce.
 *
 * The algorithm (deepspeed/runtime/fp16/onebit/adam.py, and compressed_allreduce in
 * deepspeed/runtime/comm/nccl.py), per parameter tensor:
 *   warm-up (steps 1 .. freeze_step): gradients all-reduced (mean) as under ddp, then
 *       m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g g
 *   compressed stage (later steps): g is the rank's own gradient, v is frozen,
 *       m = b1 m + (1-b1) g ;  m = compressed_allreduce(m)
 *   both:  p = p - lr (m / (sqrt(v) + eps) + wd p)        (no bias correction at all)
 * compressed_allreduce on n ranks, a tensor padded with zeros to Np, a multiple of
 * n lcm(n, 8) elements:
 *   worker:  x = m + worker_error ; s = ||x|| / sqrt(Np) ; worker_error = x - s sign(x)
 *            chunk r (Np/n elements) of sign(x), as bits, goes to rank r (all-to-all), s to all
 *   server:  y = sum_r sign_r s_r / n + server_error ; t = ||y|| / sqrt(Np/n) ;
 *            server_error = y - t sign(y) ; its sign bits and t to all (all-gathers)
 *   m = the concatenation of every rank's t sign(y), cut to the tensor's size.
 * sign(x) is +1 for x >= 0 (zero included), -1 below; bits are packed most significant
 * first (numpy's packbits). One rank exchanges nothing (DeepSpeed skips the call).
 *
 * A set is the tensors of one exchange (one unit's trainable parameters): they travel
 * in one all-to-all and two all-gathers, each tensor with its own scales.
 *
 * zero1 / zero2 (beyond DeepSpeed, which refuses ZeRO): the all-to-all and the server's
 * average are a compressed reduce-scatter, the last all-gather a compressed all-gather.
 * A rank keeps m and v of its optimizer shard only, yet the next step's local momentum
 * needs the whole shared momentum: the set keeps the last exchange's sign bits and scales
 * (the all-gather's result, 1 bit an element) and, per tensor, which elements the mask
 * keeps (v != 0, 1 bit an element; v is frozen), so zt_onebit_last rebuilds it exactly.
 * Before its first exchange (the freeze, or a resume) the caller all-gathers m and v once
 * instead (zt_onebit_has_last, zt_onebit_set_keep). The kernels
 * are single-threaded C on host memory (vectorized, fused passes); a device backend would
 * supply the same three steps (compress, server, decompress) over its memory. */
#ifndef ZT_ONEBIT_H
#define ZT_ONEBIT_H

#include <stddef.h>

#include "zt_comm.h"

/* DeepSpeed's corrected_tensor_size: numel padded to a multiple of n lcm(n, 8) */
size_t zt_onebit_padded(size_t numel, int n);

/* Bytes of a set's state on n ranks: worker errors (padded sizes) and server errors
 * (their chunks), and with sharded the masks (1 bit an element); 0 with one rank. The
 * exchange's buffers (sign bits, scales) are not counted. */
size_t zt_onebit_state_bytes(const size_t *numel, int ntensors, int n, int sharded);

typedef struct zt_onebit_set zt_onebit_set_t;

/* A set of ntensors tensors of numel[i] elements exchanged over group g (n = g->size
 * ranks; g NULL: one rank, nothing compressed, as DeepSpeed; a group of one rank compresses
 * alone, worker and server, with their error feedback: the experiment that separates the
 * compression from the averaging, doc/performance.md). Error buffers are zero. sharded: the ranks hold shards of the
 * optimizer state (zero1/zero2), so the set keeps masks for zt_onebit_last. */
zt_onebit_set_t *zt_onebit_set_create(const size_t *numel, int ntensors, zt_group_t *g, int sharded);
/* A dry run's set (zt_memplan.h): the sizes alone, no buffers. zt_onebit_step and
 * zt_onebit_allreduce compute nothing on it and issue the exchange's collectives (the
 * compressed stage's), so a dry communicator counts the bytes a step moves. */
zt_onebit_set_t *zt_onebit_set_create_dry(const size_t *numel, int ntensors, zt_group_t *g);
void zt_onebit_set_free(zt_onebit_set_t *s);

/* m[i] (numel[i] floats, host memory) := compressed_allreduce(m[i]) for every tensor of
 * the set, updating its error feedback. Collective over the set's group. */
void zt_onebit_allreduce(zt_onebit_set_t *s, zt_comm_t *c, float *const *m);

/* Error feedback of tensor i, for checkpoints: the worker error (Np floats) and the
 * server error (Np / n floats: this rank's chunk); NULL and 0 with one rank. */
float *zt_onebit_worker_error(zt_onebit_set_t *s, int i, size_t *len);
float *zt_onebit_server_error(zt_onebit_set_t *s, int i, size_t *len);
/* Zeroes every error buffer of the set (a resume that cannot restore them). */
void zt_onebit_reset(zt_onebit_set_t *s);

/* sharded sets: whether the set holds an exchange's result for zt_onebit_last (not before
 * its first exchange, nor after zt_onebit_forget: the optimizer state was loaded) */
int zt_onebit_has_last(const zt_onebit_set_t *s);
void zt_onebit_forget(zt_onebit_set_t *s);
/* sharded sets: tensor i's mask from its whole frozen variance v (numel[i] floats):
 * elements with v == 0 get momentum 0 (zt_onebit_mask) */
void zt_onebit_set_keep(zt_onebit_set_t *s, int i, const float *v);
/* sharded sets: m (numel[i] floats) := the last exchange's result for tensor i, masked:
 * the momentum every rank held after the last step, as zt_onebit_mask left it */
void zt_onebit_last(const zt_onebit_set_t *s, int i, float *m);

/* One tensor of a 1-bit Adam step (host memory, n elements each) */
typedef struct {
    float *p, *m, *v; /* (n) parameters, momentum, variance */
    const float *g;   /* (n) this rank's gradient (times gscale below) */
    size_t n;
    float wd;         /* weight decay (0: none for this tensor) */
} zt_onebit_tensor_t;

typedef struct {
    float lr, b1, b2, eps, gscale;
    int frozen; /* the compressed stage: v frozen, m exchanged (n > 1) and masked */
} zt_onebit_hp_t;

/* 1-bit Adam on tensors t[0 .. nt): the
 * moments (zt_onebit_moments), after the freeze the exchange (zt_onebit_allreduce, over
 * the set's group) and the mask (zt_onebit_mask), then the update (zt_onebit_update).
 * Those steps' results bit for bit, in fewer passes over memory. Collective after the
 * freeze, where the tensors are the set's (nt its count; ddp: every rank holds them
 * whole); before, any pieces of them (zero1/zero2's owned ones). */
void zt_onebit_step(zt_onebit_set_t *s, zt_comm_t *c, const zt_onebit_tensor_t *t, int nt, const zt_onebit_hp_t *hp);

/* The moments on n elements, g scaled by gscale first:
 * m = b1 m + (1-b1) g, and unless frozen v = b2 v + (1-b2) g g */
void zt_onebit_moments(float *m, float *v, const float *g, size_t n, float b1, float b2, float gscale, int frozen);
/* DeepSpeed's exp_avg_mask, derived: m = 0 where the frozen v is 0. Such an element had
 * a zero gradient through the whole warm-up (an embedding row of a token never seen);
 * 1 bit cannot say 0, so its exchanged momentum is +-scale and m / (sqrt(v) + eps)
 * would move it by lr scale / eps. DeepSpeed asks the user for this mask. */
void zt_onebit_mask(float *m, const float *v, size_t n);
/* p = p - lr (m / (sqrt(v) + eps) + wd p) */
void zt_onebit_update(float *p, const float *m, const float *v, size_t n, float lr, float eps, float wd);

#endif
