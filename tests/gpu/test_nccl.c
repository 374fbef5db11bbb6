/* test_nccl.c — the NCCL comm backend on device buffers, one rank per GPU.
 *
 *   mpirun -np <GPUs> tests/gpu/test_nccl      (exit 77 when no GPU is usable)
 *
 * Every collective of include/zt_nccl.h, blocking and not, out of place and in
 * place (MPI's in-place meaning), on values whose exact results are known
 * (small integers in fp32 sum exactly), plus the byte accounting and the
 * compute-stream ordering: the input is written by a backend kernel just
 * before each collective, so a missing stream dependency reads stale data.
 * On one GPU the group has one rank: the in-place offsets and ordering are
 * still exercised, the reduction arithmetic only on several GPUs. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_backend.h"
#include "zt_comm.h"
#include "zt_common.h"
#include "zt_cuda.h"
#include "zt_nccl.h"

static int failures, rank_, size_;
static const zt_backend_t *G = &zt_backend_cuda;

static void expect(const char *what, const float *got, const float *want, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != want[i];
    int all_bad = 0, b = bad != 0;
    ZT_MPI(MPI_Allreduce(&b, &all_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (rank_ == 0) printf("  %-40s %s\n", what, all_bad ? "FAIL" : "ok");
    failures += all_bad;
}

/* Fills a device buffer with base + rank*1000 + i through a kernel on the
 * compute stream (from_host then scale by 1 keeps a kernel last in line). */
static void fill(float *d, size_t n, float base)
{
    float *h = zt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = base + rank_ * 1000.0f + (float)i;
    G->from_host(d, h, n * sizeof(float));
    G->scale(d, 1.0f, n);
    free(h);
}

int main(int argc, char **argv)
{
    ZT_MPI(MPI_Init(&argc, &argv));
    ZT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    ZT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    char err[ZT_ERRLEN];
    int avail = zt_cuda_available(err, sizeof err), all_avail = 0;
    ZT_MPI(MPI_Allreduce(&avail, &all_avail, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all_avail) {
        if (rank_ == 0) printf("no GPU: %s (skipped)\n", avail ? "not on every rank" : err);
        MPI_Finalize();
        return 77;
    }
    MPI_Comm node;
    int local = 0;
    ZT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    ZT_MPI(MPI_Comm_rank(node, &local));
    int dev = zt_cuda_pick_device(local);

    zt_comm_t c;
    memset(&c, 0, sizeof c);
    zt_group_t *g = &c.world;
    g->comm = MPI_COMM_WORLD;
    g->rank = rank_;
    g->size = size_;
    g->name = "world";
    if (zt_nccl_init(g, dev, err, sizeof err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank_, err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank_ == 0) printf("NCCL backend on %d rank(s)\n", size_);

    const size_t n = 1003, N = n * (size_t)size_;
    float *d = G->alloc(N * sizeof(float)), *e = G->alloc(N * sizeof(float));
    float *h = zt_malloc(N * sizeof(float)), *want = zt_malloc(N * sizeof(float));
    float rsum = 1000.0f * size_ * (size_ - 1) / 2;   // sum over ranks of rank*1000

    // all-reduce, out of place then in place
    fill(d, n, 1.0f);
    zt_nccl_allreduce(&c, g, d, e, n, ZT_F32, ZT_SUM);
    G->to_host(h, e, n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = size_ * (1.0f + i) + rsum;
    expect("allreduce sum", h, want, n);
    fill(d, n, 1.0f);
    zt_nccl_allreduce(&c, g, ZT_IN_PLACE, d, n, ZT_F32, ZT_SUM);
    G->to_host(h, d, n * sizeof(float));
    expect("allreduce sum in place", h, want, n);
    fill(d, n, 1.0f);
    zt_nccl_allreduce(&c, g, ZT_IN_PLACE, d, n, ZT_F32, ZT_MAX);
    G->to_host(h, d, n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = 1.0f + (size_ - 1) * 1000.0f + i;
    expect("allreduce max in place", h, want, n);

    // reduce-scatter: input (size*n), this rank gets chunk rank
    fill(d, N, 0.0f);
    zt_nccl_reduce_scatter(&c, g, d, e, n, ZT_F32);
    G->to_host(h, e, n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = size_ * (float)(rank_ * n + i) + rsum;
    expect("reduce_scatter", h, want, n);
    fill(d, N, 0.0f);
    zt_nccl_reduce_scatter(&c, g, ZT_IN_PLACE, d, n, ZT_F32);
    G->to_host(h, d, n * sizeof(float));
    expect("reduce_scatter in place (result at 0)", h, want, n);

    // all-gather: every rank's n values, in rank order
    fill(d, n, 0.0f);
    zt_nccl_request_t rq;
    zt_nccl_iallgather(&c, g, d, e, n, ZT_F32, &rq);
    zt_nccl_stream_wait(&rq);
    G->scale(e, 2.0f, N);                       // compute after the gather, ordered by the event
    zt_nccl_wait(&c, &rq);
    G->to_host(h, e, N * sizeof(float));
    for (int r = 0; r < size_; r++)
        for (size_t i = 0; i < n; i++) want[r * n + i] = 2.0f * (r * 1000.0f + i);
    expect("iallgather + stream_wait + kernel", h, want, N);
    fill(e + (size_t)rank_ * n, n, 0.0f);
    zt_nccl_allgather(&c, g, ZT_IN_PLACE, e, n, ZT_F32);
    G->to_host(h, e, N * sizeof(float));
    for (size_t i = 0; i < N; i++) want[i] *= 0.5f;
    expect("allgather in place", h, want, N);

    // broadcast from the last rank
    fill(d, n, 5.0f);
    zt_nccl_bcast(&c, g, d, n, ZT_F32, size_ - 1);
    G->to_host(h, d, n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = 5.0f + (size_ - 1) * 1000.0f + i;
    expect("bcast", h, want, n);

    int acc = c.stats.calls[ZT_COLL_ALLREDUCE] == 3 && c.stats.calls[ZT_COLL_REDUCE_SCATTER] == 2 &&
              c.stats.calls[ZT_COLL_ALLGATHER] == 2 && c.stats.calls[ZT_COLL_BCAST] == 1 &&
              c.stats.bytes[ZT_COLL_ALLREDUCE] == 3.0 * n * 4 &&
              c.stats.bytes[ZT_COLL_ALLGATHER] == 2.0 * N * 4 && c.stats.seconds[ZT_COLL_BCAST] > 0;
    if (rank_ == 0) printf("  %-40s %s\n", "accounting (calls, bytes, seconds)", acc ? "ok" : "FAIL");
    failures += !acc;

    G->free(d);
    G->free(e);
    free(h);
    free(want);
    zt_nccl_destroy(g);
    MPI_Comm_free(&node);
    if (rank_ == 0) printf("%s\n", failures ? "FAILED" : "all passed");
    MPI_Finalize();
    return failures ? 1 : 0;
}
