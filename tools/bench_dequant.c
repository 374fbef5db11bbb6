/* bench_dequant.c — where a 4-bit weight is dequantized before its GEMM: a whole unit's
 * GEMM at once, or a tile at a time.
 *
 * QLoRA's linear (src/zt_linear.c) runs each GEMM of a 4-bit base on float32 values
 * dequantized from the unit's bytes (bitsandbytes' dequantize_4bit, then the float32 GEMM).
 * Two ways to schedule it, timed here on the GEMMs of the ~125M Llama-style model of
 * tools/bench-qlora.sh (C 768, q|k|v 1280 rows, o 768, gate|up 4096, down 768 x 2048;
 * N = B T = 512 tokens), forward (y = x W^T) and the backward's input gradient (dx = dy W,
 * the only backward GEMM of a frozen base):
 *   unit   dequantize the whole (out, in) weight into one scratch, then one GEMM each way;
 *   tile   forward: TR rows of W at a time into a (TR, in) scratch, y's TR columns from
 *          them; backward: TC columns of W at a time ((out, TC), dequantized row segment by
 *          row segment), dx's TC columns from them. Each element of y and dx is then the
 *          same dot product in the same order as with the unit, and the scratch is a
 *          tile's, not the GEMM's (at Llama-3-8B's gate|up, 470 MB against a few MB).
 * Prints the best of REPS (a shared machine) per shape and the totals per block, with the
 * dequantization alone beside them. Run with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1:
 *   tools/bench_dequant [reps] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "zt_backend.h"
#include "zt_common.h"
#include "zt_quant.h"

static const zt_backend_t *be = &zt_backend_cpu;

static float *rnd(size_t n, float amp, uint32_t seed) { return bench_rnd(n, amp, seed); }

/* forward by row tiles: y (N, OC) = x (N, C) W^T, W's rows [r0, r0 + tr) at a time */
static void fwd_tiles(const zt_quant4_view_t *v, float *tile, int tr, const float *x, float *y, int N, int C, int OC)
{
    for (int r0 = 0; r0 < OC; r0 += tr) {
        const int n = ZT_MIN(tr, OC - r0);
        zt_quant4_dequantize(v, (int64_t)r0 * C, (int64_t)n * C, tile);
        be->gemm(0, 1, N, n, C, 1.0f, x, C, tile, C, 0.0f, y + r0, OC);
    }
}

/* backward by column tiles: dx (N, C) = dy (N, OC) W, W's columns [c0, c0 + tc) at a time */
static void bwd_tiles(const zt_quant4_view_t *v, float *tile, int tc, const float *dy, float *dx, int N, int C, int OC)
{
    for (int c0 = 0; c0 < C; c0 += tc) {
        const int n = ZT_MIN(tc, C - c0);
        for (int r = 0; r < OC; r++) zt_quant4_dequantize(v, (int64_t)r * C + c0, n, tile + (size_t)r * n);
        be->gemm(0, 0, N, n, OC, 1.0f, dy, OC, tile, n, 0.0f, dx + c0, C);
    }
}

typedef struct { double deq, unit, tile[3]; } times_t;

static const int TILES[3] = {64, 256, 1024};

static times_t bench(const char *label, int N, int C, int OC, int reps)
{
    char err[256];
    const size_t n = (size_t)OC * C;
    float *w = rnd(n, 0.04f, 7u), *x = rnd((size_t)N * C, 1, 11u), *dy = rnd((size_t)N * OC, 1, 13u);
    float *y = be->alloc((size_t)N * OC * 4), *dx = be->alloc((size_t)N * C * 4), *full = be->alloc(n * 4);
    float *tile = be->alloc((size_t)ZT_MAX(TILES[2] * C, TILES[2] * OC) * 4);
    float *y2 = be->alloc((size_t)N * OC * 4), *dx2 = be->alloc((size_t)N * C * 4);
    if (zt_quant4_pack_region("w", ZT_QUANT_NF4, 1, 64, w, (int64_t)n, err, sizeof err)) zt_fatal("%s", err);
    zt_quant4_view_t v;
    zt_quant4_region_view(ZT_QUANT_NF4, 1, 64, w, (int64_t)n, NULL, &v);
    times_t t;
    BEST(reps, t.deq, zt_quant4_dequantize(&v, 0, (int64_t)n, full));
    BEST(reps, t.unit, {
        zt_quant4_dequantize(&v, 0, (int64_t)n, full);
        be->gemm(0, 1, N, OC, C, 1.0f, x, C, full, C, 0.0f, y, OC);
        zt_quant4_dequantize(&v, 0, (int64_t)n, full);
        be->gemm(0, 0, N, C, OC, 1.0f, dy, OC, full, C, 0.0f, dx, C);
    });
    printf("%-26s dequantize %6.2f ms   unit %7.2f ms", label, t.deq * 1e3, t.unit * 1e3);
    for (int k = 0; k < 3; k++) {
        BEST(reps, t.tile[k], {
            fwd_tiles(&v, tile, TILES[k], x, y2, N, C, OC);
            bwd_tiles(&v, tile, TILES[k], dy, dx2, N, C, OC);
        });
        /* the same dot products: a tile schedule that changed a value would not be kept */
        const int same = !memcmp(y, y2, (size_t)N * OC * 4) && !memcmp(dx, dx2, (size_t)N * C * 4);
        printf("   tile %4d %7.2f ms%s", TILES[k], t.tile[k] * 1e3, same ? "" : " (values differ)");
    }
    printf("\n");
    float *bufs[] = {w, x, dy, y, dx, full, tile, y2, dx2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    return t;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const int N = 512, C = 768, Q = 768, KV = 256, I = 2048;
    printf("bench_dequant: nf4 with double quantization, blocks of 64, N = %d, forward + input gradient, best of %d\n",
           N, reps);
    const times_t g[4] = {bench("q|k|v  (1280, 768)", N, C, Q + 2 * KV, reps), bench("o      (768, 768)", N, Q, C, reps),
                          bench("gate|up (4096, 768)", N, C, 2 * I, reps), bench("down   (768, 2048)", N, I, C, reps)};
    double deq = 0, unit = 0, tile[3] = {0, 0, 0};
    for (int i = 0; i < 4; i++) {
        deq += 2 * g[i].deq, unit += g[i].unit;
        for (int k = 0; k < 3; k++) tile[k] += g[i].tile[k];
    }
    printf("a block: unit %.2f ms (of which dequantization %.2f ms)", unit * 1e3, deq * 1e3);
    for (int k = 0; k < 3; k++) printf(", tile %d %.2f ms (%.3fx unit)", TILES[k], tile[k] * 1e3, tile[k] / unit);
    printf("\n");
    return 0;
}
