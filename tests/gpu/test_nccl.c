/* test_nccl.c — the comm layer with the NCCL backend installed, on device buffers.
 *
 *   tests/gpu/test_nccl                    one rank (exit 77 when no GPU is usable)
 *   mpirun -np <GPUs> tests/gpu/test_nccl  one rank per GPU
 *
 * Every data collective of include/zt_comm.h, blocking and not, out of place
 * and in place, the v-variants with ragged counts, fp32 and bf16, on values
 * whose results are exact (small integers), plus the stream ordering:
 *   - inputs are produced by a chain of kernels on the compute stream right
 *     before each collective, so a collective that does not wait for compute
 *     reads a partial sum;
 *   - results are consumed by a kernel queued after zt_wait, so a missing
 *     compute-waits-for-comm dependency reads stale data;
 *   - zt_wait must return while a long chain of compute is still queued (no
 *     host synchronisation);
 *   - a buffer freed (stream-ordered) after zt_wait and re-allocated at once
 *     does not corrupt the collective's result;
 * and that host buffers and decisions still go to MPI, and the accounting.
 * On one GPU the group has one rank: offsets, ordering and accounting are
 * exercised, the reduction arithmetic only on several GPUs. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_backend.h"
#include "zt_comm.h"
#include "zt_common.h"
#include "zt_cuda.h"

static int failures, rank_, size_;
static const zt_backend_t *G = &zt_backend_cuda;

static void verdict(const char *what, int bad_here)
{
    int bad = 0;
    ZT_MPI(MPI_Allreduce(&bad_here, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (rank_ == 0) printf("  %-52s %s\n", what, bad ? "FAIL" : "ok");
    failures += bad != 0;
}

/* device floats against exact expectations */
static void expect(const char *what, const float *dev, const float *want, size_t n)
{
    float *h = zt_malloc(n * sizeof *h);
    G->to_host(h, dev, n * sizeof *h);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != want[i] && bad++ == 0) first = i;
    if (bad) fprintf(stderr, "rank %d: %s: %zu of %zu wrong (first at %zu: got %g want %g)\n", rank_, what, bad,
                     n, first, h[first], want[first]);
    verdict(what, bad != 0);
    free(h);
}

static float val(int r, size_t i, float base) { return base + r * 1000.0f + (float)i; }

/* d[i] = REPS * val(rank, i, base), built on the compute stream by REPS kernels
 * after the host copy, so the value is complete only when the chain is. */
#define REPS 100
static void produce(float *d, size_t n, float base)
{
    float *h = zt_malloc(n * sizeof *h), *stage = G->alloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = val(rank_, i, base);
    G->from_host(stage, h, n * sizeof *h);
    G->memzero(d, n * sizeof *h);
    for (int k = 0; k < REPS; k++) G->accumulate(d, stage, n);
    G->free(stage);
    free(h);
}

int main(int argc, char **argv)
{
    ZT_MPI(MPI_Init(&argc, &argv));
    ZT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    ZT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    char err[ZT_ERRLEN] = "";
    int avail = zt_cuda_available(err, sizeof err), all_avail = 0;
    ZT_MPI(MPI_Allreduce(&avail, &all_avail, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (!all_avail) {
        if (rank_ == 0) printf("SKIP: no GPU: %s\n", avail ? "not on every rank" : err);
        MPI_Finalize();
        return 77;
    }
    zt_comm_t c;
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0 ||
        zt_comm_set_backend(&c, "nccl", err, sizeof err) != 0) {
        if (rank_ == 0) fprintf(stderr, "test_nccl: %s\n", err);
        MPI_Finalize();
        return 1;
    }
    zt_group_t *g = &c.world;
    const int n = size_;
    if (rank_ == 0) printf("NCCL comm backend on %d rank(s), comm backend '%s'\n", n, c.backend);
    verdict("comm backend is nccl", strcmp(c.backend, "nccl") != 0);

    const size_t m = 1003, N = m * (size_t)n;
    float *d = G->alloc(N * sizeof(float)), *e = G->alloc(N * sizeof(float));
    float *want = zt_malloc(N * sizeof(float));
    const float rsum = 1000.0f * n * (n - 1) / 2; /* sum over ranks of rank*1000 */
    zt_comm_stats_reset(&c);

    /* ---- all-reduce ---- */
    for (size_t i = 0; i < m; i++) want[i] = REPS * (n * (1.0f + i) + rsum);
    produce(d, m, 1.0f);
    zt_allreduce(&c, g, d, e, m, ZT_F32, ZT_SUM);
    expect("allreduce sum", e, want, m);
    produce(d, m, 1.0f);
    zt_allreduce(&c, g, ZT_IN_PLACE, d, m, ZT_F32, ZT_SUM);
    expect("allreduce sum in place", d, want, m);
    produce(d, m, 1.0f);
    zt_allreduce(&c, g, ZT_IN_PLACE, d, m, ZT_F32, ZT_MAX);
    for (size_t i = 0; i < m; i++) want[i] = REPS * val(n - 1, i, 1.0f);
    expect("allreduce max in place", d, want, m);

    /* ---- reduce-scatter: input (n*m), this rank gets chunk rank ---- */
    for (size_t i = 0; i < m; i++) want[i] = REPS * (n * (float)(rank_ * m + i) + rsum);
    produce(d, N, 0.0f);
    zt_reduce_scatter(&c, g, d, e, m, ZT_F32);
    expect("reduce_scatter", e, want, m);
    produce(d, N, 0.0f);
    zt_reduce_scatter(&c, g, ZT_IN_PLACE, d, m, ZT_F32);
    expect("reduce_scatter in place (result at 0)", d, want, m);

    /* ---- all-gather: every rank's m values in rank order ---- */
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < m; i++) want[r * m + i] = REPS * val(r, i, 0.0f);
    produce(d, m, 0.0f);
    zt_allgather(&c, g, d, e, m, ZT_F32);
    expect("allgather", e, want, N);
    G->memzero(e, N * sizeof(float));
    produce(e + (size_t)rank_ * m, m, 0.0f);
    zt_allgather(&c, g, ZT_IN_PLACE, e, m, ZT_F32);
    expect("allgather in place", e, want, N);

    /* ---- v-variants, ragged counts (rank r owns m - 5r elements) ---- */
    int *counts = zt_malloc((size_t)n * sizeof(int)), *displs = zt_malloc((size_t)n * sizeof(int));
    size_t total = 0;
    for (int r = 0; r < n; r++) counts[r] = (int)m - 5 * r, displs[r] = (int)total, total += (size_t)counts[r];
    for (int r = 0; r < n; r++)
        for (int i = 0; i < counts[r]; i++) want[displs[r] + i] = REPS * val(r, (size_t)i, 2.0f);
    produce(d, (size_t)counts[rank_], 2.0f);
    G->memzero(e, N * sizeof(float));
    zt_allgatherv(&c, g, d, e, counts, displs, ZT_F32);
    expect("allgatherv (grouped broadcasts)", e, want, total);
    G->memzero(e, N * sizeof(float));
    produce(e + displs[rank_], (size_t)counts[rank_], 2.0f);
    zt_allgatherv(&c, g, ZT_IN_PLACE, e, counts, displs, ZT_F32);
    expect("allgatherv in place", e, want, total);
    produce(d, total, 0.0f);
    zt_reduce_scatterv(&c, g, d, e, counts, ZT_F32);
    for (int i = 0; i < counts[rank_]; i++) want[i] = REPS * (n * (float)(displs[rank_] + i) + rsum);
    expect("reduce_scatterv (grouped reduces)", e, want, (size_t)counts[rank_]);

    /* ---- broadcast from the last rank ---- */
    produce(d, m, 5.0f);
    zt_bcast(&c, g, d, m, ZT_F32, n - 1);
    for (size_t i = 0; i < m; i++) want[i] = REPS * val(n - 1, i, 5.0f);
    expect("bcast from the last rank", d, want, m);

    /* ---- bf16: values (rank+1) + i%8 and their sums are exact in bf16 ---- */
    {
        float *h = zt_malloc(N * sizeof *h);
        uint16_t *b = G->alloc(N * 2), *b2 = G->alloc(N * 2);
        for (size_t i = 0; i < N; i++) h[i] = (float)(rank_ + 1 + (int)(i % 8));
        G->from_host(d, h, N * sizeof *h);
        G->to_bf16(b, d, N);
        zt_allreduce(&c, g, ZT_IN_PLACE, b, N, ZT_BF16, ZT_SUM);
        G->from_bf16(e, b, N);
        for (size_t i = 0; i < N; i++) want[i] = (float)(n * (n + 1) / 2 + n * (int)(i % 8));
        expect("allreduce bf16", e, want, N);
        G->to_bf16(b, d, N);
        zt_reduce_scatter(&c, g, b, b2, m, ZT_BF16);
        G->from_bf16(e, b2, m);
        for (size_t i = 0; i < m; i++) want[i] = (float)(n * (n + 1) / 2 + n * (int)((rank_ * m + i) % 8));
        expect("reduce_scatter bf16", e, want, m);
        G->free(b);
        G->free(b2);
        free(h);
    }

    /* ---- non-blocking, ordered by events: consumed by kernels after zt_wait ---- */
    {
        zt_request_t q[3];
        float *f = G->alloc(N * sizeof(float));
        produce(d, m, 1.0f);
        zt_iallreduce(&c, g, ZT_IN_PLACE, d, m, ZT_F32, ZT_SUM, &q[0]);
        produce(e, N, 0.0f);
        zt_ireduce_scatter(&c, g, e, f, m, ZT_F32, &q[1]);
        zt_wait(&c, &q[0]);
        G->scale(d, 2.0f, m); /* after the all-reduce, by the event */
        zt_wait(&c, &q[1]);
        G->scale(f, 0.5f, m);
        for (size_t i = 0; i < m; i++) want[i] = 2.0f * REPS * (n * (1.0f + i) + rsum);
        expect("iallreduce + zt_wait + kernel", d, want, m);
        for (size_t i = 0; i < m; i++) want[i] = 0.5f * REPS * (n * (float)(rank_ * m + i) + rsum);
        expect("ireduce_scatter + zt_wait + kernel", f, want, m);
        /* zero3's pattern: gather k+1 while computing, then use it */
        produce(d, m, 0.0f);
        zt_iallgather(&c, g, d, e, m, ZT_F32, &q[2]);
        produce(f, m, 3.0f); /* unrelated compute while the gather runs */
        zt_wait(&c, &q[2]);
        G->scale(e, 2.0f, N);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < m; i++) want[r * m + i] = 2.0f * REPS * val(r, i, 0.0f);
        expect("iallgather + compute + zt_wait + kernel", e, want, N);
        G->free(f);
    }

    /* ---- zt_wait does not block the host; stream-ordered free after it ---- */
    {
        const size_t big = (size_t)1 << 27; /* 512 MiB of fp32 */
        float *x = G->alloc(big * sizeof(float)), *y = G->alloc(big * sizeof(float));
        float *out = G->alloc(N * sizeof(float)), *keep = G->alloc(N * sizeof(float));
        zt_request_t q;
        produce(d, m, 0.0f);
        G->sync();
        double t0 = zt_now();
        for (int k = 0; k < 200; k++) G->accumulate(x, y, big); /* ~0.1 s of queued compute */
        double t1 = zt_now();
        zt_iallgather(&c, g, d, out, m, ZT_F32, &q);
        zt_wait(&c, &q);
        double t2 = zt_now();
        G->copy(keep, out, N * sizeof(float));
        G->free(out);                            /* stream-ordered, after the wait */
        float *reuse = G->alloc(N * sizeof(float)); /* likely the same memory */
        produce(reuse, N, 7.0f);
        G->sync();
        double t3 = zt_now();
        const double queued = t3 - t1, issue_wait = t2 - t1;
        if (rank_ == 0)
            printf("  (enqueue %.1f ms, issue+zt_wait %.3f ms, compute drained after %.1f ms)\n",
                   (t1 - t0) * 1e3, issue_wait * 1e3, queued * 1e3);
        if (queued > 0.02)
            verdict("zt_wait returns before queued compute drains", issue_wait > 0.5 * queued);
        else if (rank_ == 0)
            printf("  %-52s %s\n", "zt_wait returns before queued compute drains", "SKIP (compute too fast)");
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < m; i++) want[r * m + i] = REPS * val(r, i, 0.0f);
        expect("result intact after free + re-alloc", keep, want, N);
        G->free(reuse);
        G->free(keep);
        G->free(x);
        G->free(y);
    }

    /* ---- host buffers and decisions stay on MPI ---- */
    {
        float h[3] = {1.0f, 2.0f, (float)rank_};
        zt_allreduce(&c, g, ZT_IN_PLACE, h, 3, ZT_F32, ZT_SUM);
        int step = rank_ == 0 ? 1234 : -1;
        zt_bcast(&c, g, &step, 1, ZT_I32, 0);
        verdict("host buffers through MPI with nccl installed",
                h[0] != n || h[1] != 2.0f * n || h[2] != rsum / 1000.0f || step != 1234);
        verdict("decisions through MPI", zt_sum_double(&c, g, 2.0) != 2.0 * n || zt_any(&c, 0));
    }

    /* ---- accounting: calls and bytes as the MPI rules, seconds from events ---- */
    {
        const zt_comm_stats_t *st = zt_comm_stats(&c);
        /* all-reduce: 3 fp32 (m) + 1 bf16 (N) + 1 non-blocking (m) + 1 host (3 floats) */
        const double ar = 4.0 * m * 4 + N * 2.0 + 12.0;
        /* reduce-scatter: 2 fp32 (N) + v (total) + bf16 (N) + non-blocking (N) */
        const double rs = 2.0 * N * 4 + total * 4.0 + N * 2.0 + N * 4.0;
        /* all-gather: 2 (N) + 2 v (total) + 2 non-blocking (N) */
        const double ag = 4.0 * N * 4 + 2.0 * total * 4;
        int bad = st->calls[ZT_COLL_ALLREDUCE] != 6 || st->bytes[ZT_COLL_ALLREDUCE] != ar ||
                  st->calls[ZT_COLL_REDUCE_SCATTER] != 5 || st->bytes[ZT_COLL_REDUCE_SCATTER] != rs ||
                  st->calls[ZT_COLL_ALLGATHER] != 6 || st->bytes[ZT_COLL_ALLGATHER] != ag ||
                  st->calls[ZT_COLL_BCAST] != 2;
        for (int k = 0; k < ZT_COLL_N; k++) bad |= !(st->seconds[k] > 0);
        if (bad && rank_ == 0)
            for (int k = 0; k < ZT_COLL_N; k++)
                fprintf(stderr, "kind %d: %ld calls, %.0f bytes, %.6f s\n", k, st->calls[k], st->bytes[k],
                        st->seconds[k]);
        verdict("accounting (calls, bytes, event seconds)", bad);
    }

    G->free(d);
    G->free(e);
    free(want);
    free(counts);
    free(displs);
    zt_comm_destroy(&c);
    if (rank_ == 0) printf("%s\n", failures ? "FAILED" : "all passed");
    MPI_Finalize();
    return failures ? 1 : 0;
}
