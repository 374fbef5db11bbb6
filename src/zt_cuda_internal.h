/* zt_cuda_internal.h — what the CUDA backend's translation units share (nvcc only).
 *
 * zt_backend_cuda.cu owns the device state (stream, cuBLASLt, the matmul
 * precision); zt_attention_cuda.cu implements the attention entries of the
 * backend table against it. Not a public header: include/ knows only
 * zt_backend_t and zt_cuda.h. */
#ifndef ZT_CUDA_INTERNAL_H
#define ZT_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stddef.h>

extern "C" {
#include "zt_common.h"
#include "zt_cuda.h"
}

/* Every CUDA call: file:line, the call, the runtime's message, then zt_fatal. */
#define ZT_CUDA(call)                                                                      \
    do {                                                                                   \
        cudaError_t zt_cuda_rc_ = (call);                                                  \
        if (zt_cuda_rc_ != cudaSuccess)                                                    \
            zt_fatal_at(__FILE__, __LINE__, "%s: %s (%s)\n---> HINT: check the device " \
                        "with nvidia-smi and CUDA_VISIBLE_DEVICES; rerun with "            \
                        "CUDA_LAUNCH_BLOCKING=1 to locate an asynchronous fault", #call,   \
                        cudaGetErrorString(zt_cuda_rc_), cudaGetErrorName(zt_cuda_rc_));   \
    } while (0)

/* After every launch: catches bad launch configurations at the launch site. */
#define ZT_LAUNCHED() ZT_CUDA(cudaGetLastError())

/* The compute stream, the device initialised on first use (zt_cuda_stream). */
static inline cudaStream_t zt_cuda_compute_stream(void) { return (cudaStream_t)zt_cuda_stream(); }

/* ZT_MATMUL_* as last set by the backend's set_matmul_precision. */
int zt_cuda_matmul_precision(void);

/* Opts a kernel into `bytes` of dynamic shared memory when above the 48 KiB
 * default; a one-line fatal error when the device allows less. `what` names the
 * caller in that message. */
void zt_cuda_smem_optin(const void *kernel, size_t bytes, const char *what);

/* The backend's attention entries (zt_attention_cuda.cu). */
void zt_cuda_attention_forward(float *out, float *lse, const float *qkv, const int32_t *seg, int B,
                               int T, int NH, int NKV, int HD, int window);
void zt_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                const float *out, const float *lse, const int32_t *seg, int B,
                                int T, int NH, int NKV, int HD, int window);
/* ring attention's blocks and merge (zt_backend.h), fp32 kernels under every precision */
void zt_cuda_attention_block_forward(float *out, float *lse, const float *q, int qs, const float *k, const float *v,
                                     int ks, const int32_t *qseg, const int32_t *kseg, int B, int Tq, int Tk, int NH,
                                     int NKV, int HD, int causal, int window, int delta);
void zt_cuda_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, int qs,
                                      const float *k, const float *v, int ks, const int32_t *qseg,
                                      const int32_t *kseg, const float *out, const float *lse, int B, int Tq, int Tk,
                                      int NH, int NKV, int HD, int causal, int window, int delta);
void zt_cuda_attention_merge(float *out, float *lse, const float *out2, const float *lse2, int B, int T, int NH,
                             int HD);

#endif
