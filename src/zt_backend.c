/* zt_backend.c — the compute backend registry and CPU thread control.
 *
 * One NULL-terminated table of every backend compiled in, each entry behind the
 * configure define of its dependency; the CPU backend is always present so the
 * program and its tests run on any machine. Callers pick a backend by the name
 * the config gives (`backend = "cpu"`). */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "zt_backend.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef ZT_HAVE_CUDA
extern const zt_backend_t zt_backend_cuda;
#endif

const zt_backend_t *const zt_backends[] = {
    &zt_backend_cpu,
#ifdef ZT_HAVE_CUDA
    &zt_backend_cuda,
#endif
    NULL,
};

const zt_backend_t *zt_backend_get(const char *name)
{
    if (!name) return NULL;
    for (const zt_backend_t *const *b = zt_backends; *b; b++)
        if (strcmp((*b)->name, name) == 0) return *b;
    return NULL;
}

void zt_cpu_set_threads(int n)
{
    if (n < 1) n = 1;
    /* both pools: our OpenMP loops and OpenBLAS's own threads (Debian's
     * OpenBLAS is the pthreads build, which ignores OMP_NUM_THREADS changes
     * made after start-up) */
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}
