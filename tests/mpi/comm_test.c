/* comm_test.c — the comm layer's collectives against exact expectations, at any
 * world size (run by comm.sh at 1-4 ranks). Values are small integers, so fp32
 * sums are exact whatever the summation order; bf16 and fp16 values are multiples
 * of 1/2 below 256, also exact. Also checks group construction and byte accounting,
 * that an fp16 sum past the largest half (65504) becomes Inf, and the comm-backend
 * dispatch: which backend a compute backend gets, the refusal of nccl where it
 * cannot run, and, through a recording device backend, that every data collective
 * on device buffers goes to the device backend while host buffers and the
 * collective decisions stay on MPI.
 * Exit status 0 only if every check passed on every rank. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_comm.h"
#include "zt_common.h"
#include "zt_fp16.h"

static int failures;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            failures++;                                                    \
            fprintf(stderr, "comm_test: rank %d: ", zt_world_rank());      \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static float val(int rank, size_t i) { return (float)((rank + 1) * 3 + (int)(i % 17)); }

static void t_allreduce(zt_comm_t *c, size_t count)
{
    zt_group_t *g = &c->world;
    float *buf = zt_malloc(count * sizeof *buf);
    for (size_t i = 0; i < count; i++) buf[i] = val(g->rank, i);
    zt_comm_stats_reset(c);
    zt_allreduce(c, g, ZT_IN_PLACE, buf, count, ZT_F32, ZT_SUM);
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < g->size; r++) want += val(r, i);
        bad += buf[i] != want;
    }
    CHECK(bad == 0, "all-reduce of %zu: %zu wrong elements", count, bad);
    CHECK(c->stats.bytes[ZT_COLL_ALLREDUCE] == (double)count * 4, "all-reduce bytes %.0f", c->stats.bytes[ZT_COLL_ALLREDUCE]);
    /* non-blocking form, completed by zt_wait */
    for (size_t i = 0; i < count; i++) buf[i] = val(g->rank, i);
    zt_request_t req = {.req = MPI_REQUEST_NULL};
    zt_iallreduce(c, g, ZT_IN_PLACE, buf, count, ZT_F32, ZT_SUM, &req);
    zt_wait(c, &req);
    bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < g->size; r++) want += val(r, i);
        bad += buf[i] != want;
    }
    CHECK(bad == 0, "iallreduce of %zu: %zu wrong elements", count, bad);
    free(buf);
}

/* 16-bit encodings of exactly representable values */
static uint16_t enc16(float f, zt_dtype_t t)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return t == ZT_F16 ? zt_fp16_from_f32(f) : (uint16_t)(u >> 16);
}

static float dec16(uint16_t h, zt_dtype_t t)
{
    if (t == ZT_F16) return zt_fp16_to_f32(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static const char *dtname(zt_dtype_t t) { return t == ZT_BF16 ? "bf16" : t == ZT_F16 ? "fp16" : "fp32"; }

static void t_reduce_scatter(zt_comm_t *c, size_t count, zt_dtype_t t)
{
    zt_group_t *g = &c->world;
    const int n = g->size, half = t != ZT_F32;
    const size_t total = count * (size_t)n;
    float *f = zt_malloc(total * sizeof *f), *out = zt_malloc(count * sizeof *out);
    uint16_t *h = zt_malloc(total * 2), *ho = zt_malloc(count * 2);
    for (size_t i = 0; i < total; i++) f[i] = val(g->rank, i) * (half ? 0.5f : 1.0f);
    if (half)
        for (size_t i = 0; i < total; i++) h[i] = enc16(f[i], t); /* exact: small multiples of 1/2 */
    zt_request_t req = {.req = MPI_REQUEST_NULL};
    zt_ireduce_scatter(c, g, half ? (void *)h : (void *)f, half ? (void *)ho : (void *)out, count, t, &req);
    zt_wait(c, &req);
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        size_t gi = (size_t)g->rank * count + i;
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, gi) * (half ? 0.5f : 1.0f);
        bad += (half ? dec16(ho[i], t) : out[i]) != want;
    }
    CHECK(bad == 0, "reduce-scatter (%s) of %zu per rank: %zu wrong", dtname(t), count, bad);
    free(f);
    free(out);
    free(h);
    free(ho);
}

/* fp16 all-reduce (the ring for large buffers, MPI_Allreduce with the fp16 op for
 * small ones): exact sums, and Inf where the sum passes 65504 */
static void t_allreduce_fp16(zt_comm_t *c, size_t count)
{
    zt_group_t *g = &c->world;
    uint16_t *h = zt_malloc(count * 2);
    for (size_t i = 0; i < count; i++) h[i] = enc16(val(g->rank, i) * 0.5f, ZT_F16);
    h[0] = enc16(g->size > 1 ? 40000.0f : 70000.0f, ZT_F16); /* 70000 is Inf already */
    zt_allreduce(c, g, ZT_IN_PLACE, h, count, ZT_F16, ZT_SUM);
    size_t bad = 0;
    for (size_t i = 1; i < count; i++) {
        float want = 0;
        for (int r = 0; r < g->size; r++) want += val(r, i) * 0.5f;
        bad += dec16(h[i], ZT_F16) != want;
    }
    CHECK(bad == 0, "fp16 all-reduce of %zu: %zu wrong elements", count, bad);
    CHECK(h[0] == 0x7c00, "fp16 all-reduce: a sum past 65504 gave 0x%04x, not +Inf", h[0]);
    CHECK(c->stats.bytes[ZT_COLL_ALLREDUCE] > 0, "fp16 all-reduce not accounted");
    free(h);
}

static void t_reduce_scatterv(zt_comm_t *c)
{
    zt_group_t *g = &c->world;
    const int n = g->size;
    int *counts = zt_malloc((size_t)n * sizeof *counts);
    size_t total = 0, mine_off = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = 1000 + 37 * r; /* ragged, like per-parameter row blocks */
        if (r < g->rank) mine_off += (size_t)counts[r];
        total += (size_t)counts[r];
    }
    float *f = zt_malloc(total * sizeof *f), *out = zt_malloc((size_t)counts[g->rank] * sizeof *out);
    for (size_t i = 0; i < total; i++) f[i] = val(g->rank, i);
    zt_reduce_scatterv(c, g, f, out, counts, ZT_F32);
    size_t bad = 0;
    for (int i = 0; i < counts[g->rank]; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += val(r, mine_off + (size_t)i);
        bad += out[i] != want;
    }
    CHECK(bad == 0, "reduce-scatterv: %zu wrong", bad);
    free(counts);
    free(f);
    free(out);
}

/* Ragged int32 parts, one empty, gathered on the last rank in rank order; counted with
 * the all-gathers at the whole buffer's bytes on every rank. */
static void t_gatherv(zt_comm_t *c)
{
    zt_group_t *g = &c->world;
    const int n = g->size, root = n - 1;
    int *counts = zt_malloc((size_t)n * sizeof *counts), *displs = zt_malloc((size_t)n * sizeof *displs);
    int total = 0;
    for (int r = 0; r < n; r++) {
        counts[r] = r == 1 ? 0 : 500 + 13 * r;
        displs[r] = total;
        total += counts[r];
    }
    int32_t *mine = zt_malloc((size_t)(counts[g->rank] + 1) * sizeof *mine);
    int32_t *all = zt_malloc((size_t)total * sizeof *all);
    for (int i = 0; i < counts[g->rank]; i++) mine[i] = 1000 * g->rank + i;
    zt_comm_stats_reset(c);
    zt_gatherv(c, g, mine, all, counts, displs, ZT_I32, root);
    size_t bad = 0;
    for (int r = 0; g->rank == root && r < n; r++)
        for (int i = 0; i < counts[r]; i++) bad += all[displs[r] + i] != 1000 * r + i;
    CHECK(bad == 0, "gatherv: %zu wrong on the root", bad);
    CHECK(c->stats.bytes[ZT_COLL_ALLGATHER] == 4.0 * total && c->stats.calls[ZT_COLL_ALLGATHER] == 1,
          "gatherv accounting: %.0f bytes, want %d", c->stats.bytes[ZT_COLL_ALLGATHER], 4 * total);
    free(counts);
    free(displs);
    free(mine);
    free(all);
}

static void t_groups(zt_comm_t *c)
{
    const int W = c->world.size;
    CHECK(c->shard.size * c->replica.size == W, "shard %d x replica %d != world %d", c->shard.size,
          c->replica.size, W);
    if (W % 2 == 0) {
        zt_comm_t h;
        char err[256];
        CHECK(zt_comm_create(&h, MPI_COMM_WORLD, 2, err, sizeof err) == 0, "shard groups of 2: %s", err);
        CHECK(h.shard.size == 2 && h.replica.size == W / 2, "groups of 2: shard %d replica %d", h.shard.size, h.replica.size);
        CHECK(h.shard.rank == c->world.rank % 2, "shard rank %d", h.shard.rank);
        zt_comm_destroy(&h);
    }
    if (W == 3) {
        zt_comm_t h;
        char err[256] = "";
        CHECK(zt_comm_create(&h, MPI_COMM_WORLD, 2, err, sizeof err) != 0, "group of 2 in a world of 3 accepted");
        CHECK(strstr(err, "must divide") != NULL, "error text: %s", err);
    }
}

/* ---- dispatch, through a device backend that records its calls -------------- */

enum { F_AR, F_RS, F_AG, F_RSV, F_AGV, F_BC, F_WAIT, F_FLUSH, F_P2P, F_N };
static int fake_batch_n; /* the operations of the last p2p batch */
static int fake_calls[F_N];
static float fake_memory[256]; /* what the recording backend calls device memory */

static int fake_init(zt_comm_t *c, char *err, size_t errlen) { return 0; }
static void fake_destroy(zt_comm_t *c) {}
static int fake_owns(const void *p)
{
    return (const char *)p >= (const char *)fake_memory && (const char *)p < (const char *)(fake_memory + 256);
}
static void fake_iallreduce(zt_comm_t *c, zt_group_t *g, const void *s, void *r, size_t n, zt_dtype_t t,
                            zt_redop_t op, zt_request_t *q) { fake_calls[F_AR]++; }
static void fake_ireduce_scatter(zt_comm_t *c, zt_group_t *g, const void *s, void *r, size_t n, zt_dtype_t t,
                                 zt_request_t *q) { fake_calls[F_RS]++; }
static void fake_iallgather(zt_comm_t *c, zt_group_t *g, const void *s, void *r, size_t n, zt_dtype_t t,
                            zt_request_t *q) { fake_calls[F_AG]++; }
static void fake_ireduce_scatterv(zt_comm_t *c, zt_group_t *g, const void *s, void *r, const int *counts,
                                  zt_dtype_t t, zt_request_t *q) { fake_calls[F_RSV]++; }
static void fake_iallgatherv(zt_comm_t *c, zt_group_t *g, const void *s, void *r, const int *counts,
                             const int *displs, zt_dtype_t t, zt_request_t *q) { fake_calls[F_AGV]++; }
static void fake_ibcast(zt_comm_t *c, zt_group_t *g, void *b, size_t n, zt_dtype_t t, int root,
                        zt_request_t *q) { fake_calls[F_BC]++; }
/* one second per collective, so the test can see the backend's time arrive */
static void fake_wait(zt_comm_t *c, zt_request_t *q)
{
    fake_calls[F_WAIT]++;
    c->stats.seconds[q->kind] += 1.0;
}
static void fake_flush(zt_comm_t *c) { fake_calls[F_FLUSH]++; }
static void fake_p2p_batch(zt_comm_t *c, zt_group_t *g, const zt_p2p_op_t *ops, int n, zt_request_t *q)
{
    fake_calls[F_P2P]++;
    fake_batch_n = n;
}

static const zt_comm_backend_t fake = {
    .name = "recording", .init = fake_init, .destroy = fake_destroy, .owns = fake_owns,
    .iallreduce = fake_iallreduce, .ireduce_scatter = fake_ireduce_scatter, .iallgather = fake_iallgather,
    .ireduce_scatterv = fake_ireduce_scatterv, .iallgatherv = fake_iallgatherv, .ibcast = fake_ibcast,
    .wait = fake_wait, .flush = fake_flush, .p2p_batch = fake_p2p_batch, .p2p_in_order = 1,
};

static void t_backend_choice(zt_comm_t *c)
{
    char err[ZT_ERRLEN] = "";
    CHECK(strcmp(zt_comm_backend_for("cpu"), "mpi") == 0, "cpu -> %s", zt_comm_backend_for("cpu"));
    CHECK(strcmp(zt_comm_backend_for("cuda"), "nccl") == 0, "cuda -> %s", zt_comm_backend_for("cuda"));
    CHECK(strcmp(c->backend, "mpi") == 0 && !c->dev, "a new comm is not MPI-only: %s", c->backend);
    CHECK(zt_comm_set_backend(c, "gloo", err, sizeof err) != 0 && strstr(err, "unknown"),
          "unknown comm backend accepted (%s)", err);
    err[0] = 0;
    int rc = zt_comm_set_backend(c, "nccl", err, sizeof err);
#ifdef ZT_HAVE_CUDA
    /* a CUDA build: nccl works on a GPU machine, and is refused with the reason on others */
    CHECK(rc == 0 || strstr(err, "no usable GPU"), "nccl refused for another reason: %s", err);
    if (rc == 0) CHECK(strcmp(c->backend, "nccl") == 0, "backend after nccl: %s", c->backend);
#else
    CHECK(rc != 0 && strstr(err, "built without CUDA"), "nccl without CUDA: rc %d, '%s'", rc, err);
#endif
    if (rc != 0) CHECK(strcmp(c->backend, "mpi") == 0 && !c->dev, "refused nccl left backend %s", c->backend);
    CHECK(zt_comm_set_backend(c, "mpi", err, sizeof err) == 0 && !c->dev, "back to mpi: %s", err);
}

static void t_dispatch(zt_comm_t *c)
{
    char err[ZT_ERRLEN] = "";
    zt_group_t *g = &c->world;
    const int n = g->size, cnt = 4;
    CHECK(zt_comm_use_backend(c, &fake, err, sizeof err) == 0 && strcmp(c->backend, "recording") == 0,
          "installing a device backend: %s", err);
    zt_comm_stats_reset(c);
    memset(fake_calls, 0, sizeof fake_calls);
    float *d = fake_memory, *d2 = fake_memory + 128;
    int counts[4], displs[4], total = 0;
    for (int r = 0; r < n; r++) counts[r] = 1 + r, displs[r] = total, total += counts[r];
    zt_allreduce(c, g, ZT_IN_PLACE, d, cnt, ZT_F32, ZT_SUM);
    zt_reduce_scatter(c, g, d, d2, cnt, ZT_F32);
    zt_allgather(c, g, d, d2, cnt, ZT_F32);
    zt_reduce_scatterv(c, g, d, d2, counts, ZT_F32);
    zt_allgatherv(c, g, ZT_IN_PLACE, d, counts, displs, ZT_F32);
    zt_bcast(c, g, d, cnt, ZT_F32, 0);
    zt_request_t q[3];
    zt_iallreduce(c, g, d, d2, cnt, ZT_BF16, ZT_SUM, &q[0]);
    zt_ireduce_scatter(c, g, d, d2, cnt, ZT_F32, &q[1]);
    zt_iallgather(c, g, d, d2, cnt, ZT_F32, &q[2]);
    CHECK(fake_calls[F_WAIT] == 6, "blocking collectives waited %d times, not 6", fake_calls[F_WAIT]);
    for (int k = 0; k < 3; k++) zt_wait(c, &q[k]);
    zt_wait(c, &q[0]); /* a completed request: nothing more */
    const int want[F_FLUSH] = {2, 2, 2, 1, 1, 1, 9};
    for (int k = 0; k < F_FLUSH; k++)
        CHECK(fake_calls[k] == want[k], "device backend op %d called %d times, not %d", k, fake_calls[k], want[k]);

    /* host memory and decisions stay on MPI with a device backend installed */
    float h[4] = {1, 2, 3, 4};
    zt_allreduce(c, g, ZT_IN_PLACE, h, 4, ZT_F32, ZT_SUM);
    CHECK(h[0] == n && h[3] == 4 * n, "host all-reduce with a device backend: %g %g", h[0], h[3]);
    int bc = c->world.rank == 0 ? 42 : 0;
    zt_bcast(c, g, &bc, 1, ZT_I32, 0);
    CHECK(bc == 42, "host broadcast with a device backend: %d", bc);
    CHECK(zt_sum_double(c, g, 1.0) == n && !zt_any(c, 0), "decisions with a device backend");
    CHECK(fake_calls[F_AR] == 2 && fake_calls[F_BC] == 1, "host buffers reached the device backend");

    /* accounting: the bytes of the MPI rules, the device backend's seconds, flushed on read */
    const zt_comm_stats_t *st = zt_comm_stats(c);
    CHECK(fake_calls[F_FLUSH] >= 1, "zt_comm_stats did not flush the device backend");
    const double ar = cnt * 4.0 + cnt * 2.0 + 16.0, rs = 2.0 * cnt * n * 4 + total * 4.0;
    CHECK(st->calls[ZT_COLL_ALLREDUCE] == 3 && st->bytes[ZT_COLL_ALLREDUCE] == ar,
          "all-reduce accounting: %ld calls, %.0f bytes (want 3, %.0f)", st->calls[ZT_COLL_ALLREDUCE],
          st->bytes[ZT_COLL_ALLREDUCE], ar);
    CHECK(st->calls[ZT_COLL_REDUCE_SCATTER] == 3 && st->bytes[ZT_COLL_REDUCE_SCATTER] == rs,
          "reduce-scatter accounting: %ld calls, %.0f bytes (want 3, %.0f)",
          st->calls[ZT_COLL_REDUCE_SCATTER], st->bytes[ZT_COLL_REDUCE_SCATTER], rs);
    CHECK(st->calls[ZT_COLL_ALLGATHER] == 3 && st->calls[ZT_COLL_BCAST] == 2 &&
          st->seconds[ZT_COLL_ALLGATHER] == 3.0 && st->seconds[ZT_COLL_REDUCE_SCATTER] == 3.0,
          "all-gather/broadcast calls or device seconds wrong");

    /* the pipeline's batch: device buffers as one call of the backend, each operation its own
     * request and bytes (kind send-recv); host buffers through MPI, matched in issue order at
     * tag 0; the stream-ordered property is the backend's */
    CHECK(zt_p2p_in_order(c), "a backend with p2p_in_order: zt_p2p_in_order is 0");
    zt_comm_stats_reset(c);
    const int next = (g->rank + 1) % n, prev = (g->rank + n - 1) % n;
    zt_p2p_op_t ops[2] = {{.send = 1, .buf = d, .peer = next, .count = 3, .t = ZT_F32},
                          {.send = 0, .buf = d2, .peer = prev, .count = 5, .t = ZT_F32}};
    zt_request_t pq[2];
    zt_p2p_batch(c, g, ops, 2, pq);
    zt_wait(c, &pq[0]), zt_wait(c, &pq[1]);
    CHECK(fake_calls[F_P2P] == 1 && fake_batch_n == 2, "p2p batch: %d calls of %d ops, want 1 of 2",
          fake_calls[F_P2P], fake_batch_n);
    st = zt_comm_stats(c);
    CHECK(st->calls[ZT_COLL_SENDRECV] == 2 && st->bytes[ZT_COLL_SENDRECV] == 32.0 &&
          st->group_bytes[ZT_GRP_WORLD] == 32.0, "p2p batch accounting: %ld calls, %.0f bytes (want 2, 32)",
          st->calls[ZT_COLL_SENDRECV], st->bytes[ZT_COLL_SENDRECV]);
    CHECK(zt_comm_use_backend(c, NULL, err, sizeof err) == 0 && !c->dev && strcmp(c->backend, "mpi") == 0,
          "removing the device backend");
    CHECK(!zt_p2p_in_order(c) || getenv("ZT_P2P_IN_ORDER"), "MPI alone is stream-ordered");
    float hs[2][2], hr[2][2];
    for (int k = 0; k < 2; k++) hs[k][0] = (float)(10 * g->rank + k), hs[k][1] = -1.0f;
    zt_p2p_op_t hops[4] = {{.send = 0, .buf = hr[0], .peer = prev, .count = 2, .t = ZT_F32},
                           {.send = 1, .buf = hs[0], .peer = next, .count = 2, .t = ZT_F32},
                           {.send = 1, .buf = hs[1], .peer = next, .count = 2, .t = ZT_F32},
                           {.send = 0, .buf = hr[1], .peer = prev, .count = 2, .t = ZT_F32}};
    zt_request_t hq[4];
    zt_p2p_batch(c, g, hops, 4, hq);
    for (int k = 0; k < 4; k++) zt_wait(c, &hq[k]);
    CHECK(hr[0][0] == 10 * prev && hr[1][0] == 10 * prev + 1 && hr[1][1] == -1.0f,
          "host p2p batch: got %g %g from rank %d", hr[0][0], hr[1][0], prev);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    zt_comm_t c;
    char err[256];
    if (zt_comm_create(&c, MPI_COMM_WORLD, 0, err, sizeof err) != 0) zt_fatal("%s", err);
    t_groups(&c);
    const size_t sizes[] = {1, 7, 1000, 65536, 65537, 200003};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        t_allreduce(&c, sizes[i]);
        t_reduce_scatter(&c, sizes[i], ZT_F32);
        t_reduce_scatter(&c, sizes[i], ZT_BF16);
        t_reduce_scatter(&c, sizes[i], ZT_F16);
        t_allreduce_fp16(&c, sizes[i]);
    }
    t_reduce_scatterv(&c);
    t_gatherv(&c);
    t_backend_choice(&c);
    t_dispatch(&c);
    int any = zt_any(&c, failures != 0);
    if (c.world.rank == 0) printf("comm_test: %d ranks: %s\n", c.world.size, any ? "FAILED" : "all checks passed");
    zt_comm_destroy(&c);
    MPI_Finalize();
    return any ? 1 : 0;
}
