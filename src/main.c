/* main.c — a shim: MPI up, zt_run, MPI down. Everything else is in libztrain. */
#include <mpi.h>

#include "zt_common.h"
#include "zt_run.h"

int main(int argc, char **argv)
{
    int provided = 0;
    ZT_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided));
    int rc = zt_run(argc, argv, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
