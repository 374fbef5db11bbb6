/* fused_gelu_check.h — matmul_gelu_forward and gelu_matmul_backward against the
 * operations they fuse, bit for bit, with dpre written over act as the model does (the
 * parameter gradients must read act before it is overwritten): test_kernels checks it
 * with fp32 GEMMs, test_dnnl with bf16 ones. rnd(n, amp) allocates n random floats of
 * the backend. */
#ifndef ZT_FUSED_GELU_CHECK_H
#define ZT_FUSED_GELU_CHECK_H

#include <string.h>

#include "zt_backend.h"
#include "zt_test.h"

static void check_matmul_gelu(const zt_backend_t *be, int with_bias, float *(*rnd)(size_t, double))
{
    const int N = 37, C = 24, OC = 40; /* fc: C -> OC ; fcproj backward: OC -> C */
    const size_t nx = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    float *x = rnd(nx, 2), *w = rnd(nw, 1), *b = with_bias ? rnd(OC, 1) : NULL;
    float *pre = rnd(no, 1), *act = rnd(no, 1), *pre1 = be->alloc(no * 4), *act1 = be->alloc(no * 4);
    be->matmul_gelu_forward(act, pre, x, w, b, N, C, OC);
    be->matmul_forward(pre1, x, w, b, N, C, OC, 0);
    be->gelu_forward(act1, pre1, no);
    CU_ASSERT(memcmp(pre, pre1, no * 4) == 0);
    CU_ASSERT(memcmp(act, act1, no * 4) == 0);

    /* backward of y (N,C) = act (N,OC) @ W2 (OC,C) + b2 */
    float *w2 = rnd(nw, 1), *dy = rnd(nx, 1), *dw = rnd(nw, 1), *db = rnd(C, 1);
    float *dw1 = be->alloc(nw * 4), *db1 = be->alloc(C * 4);
    memcpy(dw1, dw, nw * 4);
    memcpy(db1, db, C * 4);
    float *dact = be->alloc(no * 4), *dpre1 = be->alloc(no * 4);
    be->matmul_backward(dact, dw1, with_bias ? db1 : NULL, dy, act1, w2, N, OC, C, 0);
    be->gelu_backward(dpre1, pre1, dact, no);
    be->gelu_matmul_backward(act, dw, with_bias ? db : NULL, dy, act, pre, w2, N, OC, C);
    CU_ASSERT(memcmp(dw, dw1, nw * 4) == 0);
    CU_ASSERT(memcmp(db, db1, C * 4) == 0);
    CU_ASSERT(memcmp(act, dpre1, no * 4) == 0);
    float *bufs[] = {x, w, b, pre, act, pre1, act1, w2, dy, dw, db, dw1, db1, dact, dpre1};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
}

#endif
