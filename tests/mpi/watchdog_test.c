/* watchdog_test.c — the hang watchdog under a real launcher (driven by watchdog.sh).
 *
 * Phase 1: both ranks make steady progress for 1.5 timeouts; the watchdog must
 * stay quiet (a false alarm would kill the job here). Phase 2: rank 1 stalls
 * inside a fake "all-reduce" mark while rank 0 waits in MPI_Barrier, which is
 * exactly what a dead peer looks like; rank 1's watchdog must report it and the
 * launcher must end both ranks within a few seconds. Rank 0's watchdog has a 4x
 * timeout so that it is only a backstop and the report names rank 1.
 *
 * usage: watchdog_test TIMEOUT_S */
#include "zt_common.h"
#include "zt_watchdog.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    ZT_MPI(MPI_Init(&argc, &argv));
    double timeout = argc > 1 ? atof(argv[1]) : 2.0;
    int rank, size;
    ZT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    ZT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
    if (size < 2) zt_fatal("watchdog_test needs at least 2 ranks");
    zt_watchdog_start(rank == 1 ? timeout : 4 * timeout, rank, zt_hostname());

    /* Phase 1: many short marks over 1.5 timeouts. */
    struct timespec tick = {0, 50000000L};
    double t0 = zt_now();
    for (long step = 0; zt_now() - t0 < 1.5 * timeout; step++) {
        zt_watchdog_mark("forward", (int)(step % 4), step);
        nanosleep(&tick, NULL);
    }
    zt_watchdog_mark("barrier", -1, 0);
    ZT_MPI(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0) {
        printf("watchdog_test: phase 1 ok (no false alarm in %.1f s of progress)\n", zt_now() - t0);
        fflush(stdout);
    }

    /* Phase 2: rank 1 hangs "in a collective", rank 0 waits for it. */
    if (rank == 1) {
        zt_watchdog_mark("all-reduce", 3, 7);
        for (;;) sleep(1);
    }
    zt_watchdog_mark("barrier", -1, 7);
    ZT_MPI(MPI_Barrier(MPI_COMM_WORLD));
    printf("watchdog_test: rank %d passed the barrier: the watchdog did not end the job\n", rank);
    zt_watchdog_stop();
    MPI_Finalize();
    return 0;
}
