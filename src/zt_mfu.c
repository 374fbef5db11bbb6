/* zt_mfu.c — the matmul peak probe (see zt_mfu.h). */
#include "zt_mfu.h"

#include <math.h>

#include "zt_common.h"

double zt_mfu_measure_peak(const zt_backend_t *be)
{
    const int N = 256, C = 768, OC = 2304;
    float *a = be->alloc((size_t)N * C * 4), *w = be->alloc((size_t)C * OC * 4), *o = be->alloc((size_t)N * OC * 4);
    be->matmul_forward(o, a, w, NULL, N, C, OC, 0);
    be->sync();
    double best = 1e30, t_end = zt_now() + 0.4;
    do {
        double t0 = zt_now();
        be->matmul_forward(o, a, w, NULL, N, C, OC, 0);
        be->sync();
        best = fmin(best, zt_now() - t0);
    } while (zt_now() < t_end);
    be->free(a);
    be->free(w);
    be->free(o);
    return 2.0 * N * C * OC / best;
}
