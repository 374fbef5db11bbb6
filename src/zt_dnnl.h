/* zt_dnnl.h — bf16 GEMMs on the CPU through oneDNN's matmul primitive (internal).
 *
 * The CPU backend (zt_kernels_cpu.c) sends its GEMMs here under
 * ZT_MATMUL_MEDIUM (train.bf16, or train.matmul_precision = medium) when the
 * processor has bf16 units (AVX512-BF16 or AMX-BF16, found by cpuid), or when
 * the environment says ZT_DNNL=force (tests: oneDNN then runs its bf16 matmul
 * on whatever ISA there is, slowly). The operands are rounded to bf16 (round to
 * nearest even, zt_bf16.h) into per-thread scratch; oneDNN multiplies them with
 * fp32 accumulation and fp32 output. Primitives are cached by shape and
 * created once; every oneDNN call is checked (ZT_DNNL in zt_dnnl.c). ZT_DNNL_VERBOSE=1
 * prints each primitive and the implementation oneDNN chose for it (stderr); a
 * reference implementation is reported once in any case.
 *
 * Built only with oneDNN (configure: ZT_HAVE_DNNL); without it zt_dnnl_mode()
 * is ZT_DNNL_OFF and nothing else may be called. */
#ifndef ZT_DNNL_H
#define ZT_DNNL_H

#include <stdint.h>

enum {
    ZT_DNNL_OFF = 0,    /* no oneDNN, or no bf16 units and not forced: fp32 GEMMs */
    ZT_DNNL_UNITS = 1,  /* bf16 units present: oneDNN bf16 GEMMs under MEDIUM */
    ZT_DNNL_FORCED = 2, /* ZT_DNNL=force without the units (tests) */
};

/* Decided once per process: cpuid, the ZT_DNNL variable (force | off | unset)
 * and whether oneDNN is built in. */
int zt_dnnl_mode(void);
/* The processor's bf16 units: "amx_bf16", "avx512_bf16" or NULL (cpuid and the
 * OS's XSAVE state; AMX also needs the kernel's permission, which oneDNN asks
 * for itself). */
const char *zt_dnnl_units(void);
/* The oneDNN ISA in effect, for logs ("avx2", "avx512_core_bf16", ...) */
const char *zt_dnnl_isa(void);

/* C (M,N) [ldc] = alpha op(A) op(B) + bias + (accumulate ? C : 0), row-major,
 * op(A) (M,K) is A (M,K) [lda] or, with ta, A (K,M) [lda] transposed; op(B)
 * (K,N) likewise with tb. bias (N) broadcast over rows, or NULL; alpha != 1
 * only without bias. Operands rounded to bf16 here, fp32 accumulation and
 * output. Callable from inside OpenMP parallel regions (each thread has its own
 * stream and scratch; oneDNN then runs the product on the calling thread). */
void zt_dnnl_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, const float *bias, int accumulate, float *C, int ldc);
/* 1 when this oneDNN has a bf16 matmul for the processor (avx512_core and
 * up in oneDNN 2.x); 0 when the operands go to oneDNN's fp32 matmul as fp32
 * numbers holding the bf16-rounded values (the same arithmetic: products of
 * bf16 numbers are exact in fp32), which is what ZT_DNNL=force gets on AVX2 */
int zt_dnnl_native_bf16(void);
/* Operands rounded once and used by several GEMMs: src, rows x cols at row
 * stride ld, rounded into this thread's scratch slot `slot` (contiguous, the
 * stored layout), valid until the same slot is rounded into again on this
 * thread. zt_dnnl_gemm uses slots 0 and 1. */
#define ZT_DNNL_SLOTS 6
const void *zt_dnnl_round(int slot, const float *src, int rows, int cols, int ld);
/* zt_dnnl_gemm on operands from zt_dnnl_round: A holds op(A) as stored, (M,K)
 * or with ta (K,M); B (K,N) or with tb (N,K) */
void zt_dnnl_gemm_rounded(int ta, int tb, int M, int N, int K, float alpha, const void *A,
                          const void *B, const float *bias, int accumulate, float *C, int ldc);
/* bf16 working copies (zt_backend.h's bf16_view): view[0, n) holds exactly the
 * bf16 values bf16[0, n). zt_dnnl_round of a contiguous operand lying inside a
 * registered view then rounds nothing: it returns the operand's place in the bf16
 * copy, or, where the operands go to oneDNN's fp32 matmul as bf16-valued fp32
 * (zt_dnnl_native_bf16() == 0), the operand itself, which already holds those
 * values. Either way the GEMM reads what rounding would have produced, bit for
 * bit. bf16 NULL withdraws the slot. Call between kernels, never while a GEMM
 * runs. The environment variable ZT_DNNL_VIEWS=off ignores the views, =check
 * compares each operand taken from one with its rounding and aborts on a
 * difference (tests). */
#define ZT_DNNL_NVIEW 3
void zt_dnnl_view(int slot, const float *view, const uint16_t *bf16, size_t n);
/* Operands zt_dnnl_round took from a registered view, and those it rounded, since the
 * first call of this (or, with ZT_DNNL_VERBOSE=1, which prints both at exit, since the
 * start) */
void zt_dnnl_round_counts(long *from_view, long *rounded);
/* Primitives created so far (tests: a repeated shape creates none) */
long zt_dnnl_primitives_created(void);

#endif
