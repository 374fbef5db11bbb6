#include "zt_run.h"
int zt_run(int argc, char **argv, MPI_Comm world) { return 0; }
