/* sgemm_profile.c — where a run's GEMM time goes: an LD_PRELOAD wrapper of cblas_sgemm that
 * sums each call's thread CPU time (not wall time, so a shared machine's other jobs do not
 * count) by shape (transposes, M, N, K) and writes one line per shape at exit:
 *   ta tb M N K calls seconds GFLOP/s
 * Build and run (doc/performance.md, bench-lf's step breakdown):
 *   gcc -O2 -shared -fPIC -o sgemm_profile.so tools/sgemm_profile.c -ldl
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 LD_PRELOAD=$PWD/sgemm_profile.so \
 *     SGEMM_PROFILE=shapes.txt build/ztrain job.yaml ...
 * A shape's part of the model (frozen base, head, attention, LoRA) follows from its sizes. */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                         float, const float *, blasint, const float *, blasint, float, float *, blasint);

#define MAX_SHAPES 4096
static struct {
    int ta, tb, M, N, K;
    long calls;
    double s;
} shapes[MAX_SHAPES];
static int nshapes;

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

void cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N,
                 blasint K, float alpha, const float *A, blasint lda, const float *B, blasint ldb, float beta, float *C,
                 blasint ldc)
{
    static sgemm_fn real;
    if (!real) real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    const double t0 = thread_cpu();
    real(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const double dt = thread_cpu() - t0;
    const int a = ta == CblasTrans, b = tb == CblasTrans;
    int i = 0;
    while (i < nshapes && !(shapes[i].ta == a && shapes[i].tb == b && shapes[i].M == M && shapes[i].N == N &&
                            shapes[i].K == K))
        i++;
    if (i == MAX_SHAPES) return; /* table full: later new shapes go uncounted */
    if (i == nshapes) {
        shapes[i].ta = a, shapes[i].tb = b, shapes[i].M = M, shapes[i].N = N, shapes[i].K = K;
        nshapes++;
    }
    shapes[i].calls++;
    shapes[i].s += dt;
}

/* only a process that made GEMM calls writes (a wrapper such as perf or time makes none) */
__attribute__((destructor)) static void write_shapes(void)
{
    if (!nshapes) return;
    const char *path = getenv("SGEMM_PROFILE");
    FILE *f = fopen(path ? path : "sgemm_profile.txt", "w");
    if (!f) return;
    for (int i = 0; i < nshapes; i++)
        fprintf(f, "%d %d %d %d %d %ld %.4f %.2f\n", shapes[i].ta, shapes[i].tb, shapes[i].M, shapes[i].N, shapes[i].K,
                shapes[i].calls, shapes[i].s,
                shapes[i].s > 0 ? 2.0 * shapes[i].M * shapes[i].N * shapes[i].K * shapes[i].calls / shapes[i].s / 1e9
                                : 0.0);
    fclose(f);
}
