/* zt_mfu.c — the matmul peak probe (see zt_mfu.h). */
#include "zt_mfu.h"

#include <math.h>
#include <time.h>

#include "zt_common.h"

double zt_mfu_measure_peak(const zt_backend_t *be)
{
    const int N = 256, C = 768, OC = 2304;
    float *a = be->alloc((size_t)N * C * 4), *w = be->alloc((size_t)C * OC * 4), *o = be->alloc((size_t)N * OC * 4);
    be->matmul_forward(o, a, w, NULL, N, C, OC, 0);
    be->sync();
    double best = 1e30, t_end = zt_now() + 0.4;
    do {
        const double t0 = zt_now(), c0 = zt_thread_seconds();
        be->matmul_forward(o, a, w, NULL, N, C, OC, 0);
        be->sync();
        const double wall = zt_now() - t0, cpu = zt_thread_seconds() - c0;
        /* on the CPU backend a repetition's CPU time where shorter (preemption stretches
         * the wall clock); a device's time is the wall clock's (the host thread may sleep
         * in sync) */
        best = fmin(best, be == &zt_backend_cpu ? fmin(wall, cpu) : wall);
    } while (zt_now() < t_end);
    be->free(a);
    be->free(w);
    be->free(o);
    return 2.0 * N * C * OC / best;
}
