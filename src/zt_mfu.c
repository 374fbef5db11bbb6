/* zt_mfu.c — the matmul peak probe (see zt_mfu.h). */
#include "zt_mfu.h"

#include <math.h>
#include <time.h>

#include "zt_common.h"

/* the calling thread's CPU seconds: on the CPU backend a repetition's own time, which a
 * busy machine's preemption does not stretch as it stretches the wall clock */
static double thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double zt_mfu_measure_peak(const zt_backend_t *be)
{
    const int N = 256, C = 768, OC = 2304;
    float *a = be->alloc((size_t)N * C * 4), *w = be->alloc((size_t)C * OC * 4), *o = be->alloc((size_t)N * OC * 4);
    be->matmul_forward(o, a, w, NULL, N, C, OC, 0);
    be->sync();
    double best = 1e30, t_end = zt_now() + 0.4;
    do {
        const double t0 = zt_now(), c0 = thread_seconds();
        be->matmul_forward(o, a, w, NULL, N, C, OC, 0);
        be->sync();
        const double wall = zt_now() - t0, cpu = thread_seconds() - c0;
        /* a device's time is the wall clock's (the host thread may sleep in sync) */
        best = fmin(best, be == &zt_backend_cpu ? fmin(wall, cpu) : wall);
    } while (zt_now() < t_end);
    be->free(a);
    be->free(w);
    be->free(o);
    return 2.0 * N * C * OC / best;
}
