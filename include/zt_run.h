/* zt_run.h — the whole program as a library call.
 *
 * main() is a shim over zt_run(); tests and tools drive the same code. zt_run
 * never calls exit(): every error becomes a collective decision and a non-zero
 * return on every rank. */
#ifndef ZT_RUN_H
#define ZT_RUN_H

#include <mpi.h>

#define ZT_EXIT_OK 0
#define ZT_EXIT_ERROR 1        /* bad input: config, data, checkpoint */
#define ZT_EXIT_NONFINITE 3    /* NaN/Inf loss or gradient with parallel.nonfinite = abort */
#define ZT_EXIT_SIGNAL 75      /* stopped by SIGTERM/SIGUSR1/SIGINT after a checkpoint (EX_TEMPFAIL: requeue) */

int zt_run(int argc, char **argv, MPI_Comm world);

#endif
