/* bench_nvme.c — the NVMe tier's swap traffic alone: the optimizer step's pattern without
 * its arithmetic. NREC records of REC_MIB MiB each (three fields, as a unit's master,
 * exp_avg and exp_avg_sq) live in zt_nvme's file under PATH; a pass takes them in order,
 * reading record k + 1 while record k is held and writing record k back, as
 * zt_shard_optimizer_step does. Prints the bytes read and written over the wall time of
 * PASSES passes (the first only writes: the state's initialization).
 *
 *   tools/bench_nvme PATH [REC_MIB [NREC [PASSES]]]      (ZT_NVME_IO=threads: the thread engine)
 *
 * parallel.offload_nvme_* defaults: 4 buffers, 1 MiB requests, 8 in flight. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_nvme.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH [REC_MIB [NREC [PASSES]]]\n", argv[0]);
        return 2;
    }
    const double rec_mib = argc > 2 ? atof(argv[2]) : 24.0;
    const int nrec = argc > 3 ? atoi(argv[3]) : 16, passes = argc > 4 ? atoi(argv[4]) : 3;
    const size_t field = (size_t)(rec_mib * 1048576.0 / 3.0) / 4096 * 4096;
    zt_nvme_rec_t *recs = zt_calloc((size_t)nrec, sizeof *recs);
    for (int i = 0; i < nrec; i++) {
        recs[i].nfield = 3;
        recs[i].bytes[0] = recs[i].bytes[1] = recs[i].bytes[2] = field;
    }
    const zt_nvme_opts_t o = {.path = argv[1], .rank = 0, .buffer_count = 4, .block_size = 1 << 20, .queue_depth = 8};
    char err[ZT_ERRLEN];
    zt_nvme_t *nv = zt_nvme_open(&o, recs, nrec, err, sizeof err);
    if (!nv) {
        fprintf(stderr, "bench_nvme: %s\n", err);
        return 1;
    }
    double t0 = 0.0;
    zt_nvme_stats_t a, b;
    for (int p = 0; p < passes; p++) {
        if (p == 1) { /* timed from the first full pass: reads and writes */
            zt_nvme_drain(nv);
            zt_nvme_stats(nv, &a);
            t0 = zt_now();
        }
        if (p > 0) zt_nvme_prefetch(nv, 0);
        for (int k = 0; k < nrec; k++) {
            void **f = zt_nvme_get(nv, k, p > 0);
            if (p > 0 && k + 1 < nrec) zt_nvme_prefetch(nv, k + 1);
            if (p == 0) memset(f[0], 1, field); /* the pages exist, as initialized state's */
            zt_nvme_put(nv, k, 1);
        }
    }
    zt_nvme_drain(nv);
    const double t = zt_now() - t0;
    zt_nvme_stats(nv, &b);
    const double rd = b.bytes_read - a.bytes_read, wr = b.bytes_written - a.bytes_written;
    printf("nvme swap: %.1f MB/s (read %.0f MB, written %.0f MB in %.2f s; %d records of %.1f MiB, %s)\n",
           (rd + wr) / t / 1e6, rd / 1e6, wr / 1e6, t, nrec, 3.0 * (double)field / 1048576.0, b.engine);
    zt_nvme_close(nv);
    free(recs);
    return 0;
}
