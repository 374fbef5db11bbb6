/* zt_backend_cuda.cu — the CUDA compute backend: zt_backend_t on device memory.
 *
 * Same contract as the CPU backend (include/zt_backend.h): pure kernels on
 * buffers, row-major, parameter gradients accumulate (+=), activation gradients
 * overwrite unless the header says otherwise. Everything is queued on one
 * stream, created lazily on the current device (zt_cuda_pick_device first), so
 * kernels are asynchronous to the host; to_host, sumsq and all_finite return
 * host values and therefore synchronise.
 *
 * GEMMs go through cuBLASLt with fp32 operands: CUBLAS_COMPUTE_32F, or tensor
 * cores rounding the operands to TF32 or bf16 (set_matmul_precision, from
 * train.matmul_precision). cuBLASLt is column-major: a row-major C = op(A) op(B)
 * is the column-major C^T = op(B)^T op(A)^T, so gemm_rm() swaps the operands
 * and keeps the transpose flags. Alignment preferences are passed per call
 * because parameter views into flat buffers are only 4-byte aligned in general
 * and the heuristic otherwise assumes 256.
 *
 * Reductions are deterministic (fixed-order partials, no float atomics) except
 * embedding_backward's scatter into dwte, where repeated tokens in a batch add
 * through atomicAdd. The kernels themselves are in zt_kernels_cuda.cuh, with the
 * launch configuration (block shapes, grid rules) both this file and the host
 * emulation test (tests/gpu/emulate_kernels.cpp) use; this file holds the state,
 * memory, cuBLASLt and the launchers. Attention lives in zt_attention_cuda.cu
 * (flash-style, fp32 or bf16 tensor cores by the matmul precision).
 *
 * Every CUDA and cuBLASLt call is checked: file:line, the call, the library's
 * message, then zt_fatal (the whole job aborts; a kernel cannot return an
 * input error). */
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "zt_backend.h"
#include "zt_common.h"
#include "zt_cuda.h"
}
#include "zt_cuda_internal.h"
#include "zt_kernels_cuda.cuh"

/* ---- error checking (ZT_CUDA and ZT_LAUNCHED are in zt_cuda_internal.h) ---- */

#define ZT_CUBLAS(call)                                                                 \
    do {                                                                                \
        cublasStatus_t zt_cublas_rc_ = (call);                                          \
        if (zt_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                     \
            zt_fatal_at(__FILE__, __LINE__, "%s: cuBLASLt status %d (%s)", #call,       \
                        (int)zt_cublas_rc_, cublas_status_name(zt_cublas_rc_));         \
    } while (0)

static const char *cublas_status_name(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown";
    }
}

/* ---- state (one device per process) -------------------------------------- */

static int g_ready;
static cudaStream_t g_stream;
static cublasLtHandle_t g_lt;
static void *g_workspace;                  /* cuBLASLt workspace */
static const size_t g_workspace_bytes = (size_t)32 << 20;
static cublasComputeType_t g_compute = CUBLAS_COMPUTE_32F;
static int g_precision = ZT_MATMUL_HIGHEST;   /* attention picks its kernels by it */
static int g_sms = 1;                      /* multiprocessors, sizes grid-stride grids */
static void *g_scratch;                    /* partial sums of reductions */
static size_t g_scratch_bytes;
static double *g_host_double;              /* pinned slots for values read back */
static int *g_host_int;
static int g_pools;                        /* stream-ordered allocator (cudaMallocAsync) */

static void ensure_init(void)
{
    if (g_ready) return;
    int dev = 0;
    ZT_CUDA(cudaGetDevice(&dev));
    ZT_CUDA(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
    ZT_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    ZT_CUBLAS(cublasLtCreate(&g_lt));
    ZT_CUDA(cudaMalloc(&g_workspace, g_workspace_bytes));
    ZT_CUDA(cudaMallocHost((void **)&g_host_double, sizeof(double)));
    ZT_CUDA(cudaMallocHost((void **)&g_host_int, sizeof(int)));
    /* Buffers come from the device's memory pool in compute-stream order: a free
     * is cheap and does not synchronise the device (cudaFree does, which would
     * stall the comm stream's overlap), and freed memory stays in the pool for
     * the next allocation instead of going back to the driver. */
    int pools = 0;
    ZT_CUDA(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev));
    if (pools) {
        cudaMemPool_t pool;
        uint64_t keep = UINT64_MAX;
        ZT_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
        ZT_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
        g_pools = 1;
    }
    g_ready = 1;
}

static void stream_wait(cudaStream_t s);

/* Grows the reduction scratch; the old buffer may still be read by queued work,
 * so the stream drains before it is freed (rare: sizes settle after step 1). */
static void *scratch(size_t bytes)
{
    if (bytes > g_scratch_bytes) {
        stream_wait(g_stream);
        if (g_scratch) ZT_CUDA(cudaFree(g_scratch));
        g_scratch_bytes = bytes + (bytes >> 1);
        ZT_CUDA(cudaMalloc(&g_scratch, g_scratch_bytes));
    }
    return g_scratch;
}

/* Blocks for a grid-stride loop over n elements: enough to fill the device. */
static unsigned grid_for(size_t n, int threads) { return zt_grid_for(n, threads, g_sms); }

/* <<<...>>> of the grid-stride kernels over n elements */
#define ELEM_LAUNCH(n) grid_for((n), ELEM_THREADS), ELEM_THREADS, 0, g_stream

/* Host waits on the compute stream. The stream may wait on NCCL collectives (the
 * shard engine's zt_wait), and a collective whose peer died never completes: a
 * blocking cudaStreamSynchronize would then hang the rank for good. With a hook
 * installed (the NCCL backend's check of its communicators' asynchronous errors,
 * which aborts the job), the wait polls: it spins for the first 2 ms (most waits,
 * such as a sumsq read-back, end within microseconds), then sleeps 50 us between
 * polls, calling the hook about every millisecond. */
static void (*g_wait_hook)(void);

extern "C" void zt_cuda_set_wait_hook(void (*hook)(void)) { g_wait_hook = hook; }

static void stream_wait(cudaStream_t s)
{
    if (!g_wait_hook) {
        ZT_CUDA(cudaStreamSynchronize(s));
        return;
    }
    const double t0 = zt_now();
    double last_hook = t0;
    const struct timespec pause = {0, 50 * 1000};
    for (;;) {
        cudaError_t rc = cudaStreamQuery(s);
        if (rc == cudaSuccess) return;
        if (rc != cudaErrorNotReady) ZT_CUDA(rc);
        const double now = zt_now();
        if (now - last_hook > 1e-3) {
            g_wait_hook();
            last_hook = now;
        }
        if (now - t0 > 2e-3) nanosleep(&pause, NULL);
    }
}


/* ---- memory ---------------------------------------------------------------- *
 *
 * Stream order: alloc and free are positions on the compute stream. A buffer
 * freed here may be handed out again to work queued after the free; work
 * queued before it, and collectives the compute stream was made to wait for
 * (zt_wait), finish with it first. The zero-fill of alloc is queued too: the
 * NCCL comm stream waits for the compute stream before each collective, so it
 * sees it. */

static void *cuda_alloc(size_t bytes)
{
    ensure_init();
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t rc = g_pools ? cudaMallocAsync(&p, n, g_stream) : cudaMalloc(&p, n);
    if (rc != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();  /* an allocation failure is not sticky: clear it */
        cudaMemGetInfo(&fr, &tot);
        char b1[32], b2[32], b3[32];
        zt_fatal("cudaMalloc of %s failed: %s (device has %s free of %s)\n---> HINT: lower "
                 "train.per_device_train_batch_size, or use a sharding strategy "
                 "(parallel.strategy = zero2 / zero3)",
                 zt_fmt_bytes((double)n, b1, sizeof b1), cudaGetErrorString(rc),
                 zt_fmt_bytes((double)fr, b2, sizeof b2), zt_fmt_bytes((double)tot, b3, sizeof b3));
    }
    ZT_CUDA(cudaMemsetAsync(p, 0, n, g_stream));
    return p;
}

static void cuda_free(void *p)
{
    if (!p) return;
    if (g_pools) ZT_CUDA(cudaFreeAsync(p, g_stream));
    else ZT_CUDA(cudaFree(p)); /* synchronises the device: waits for every user of p */
}

/* Pinned, so uploads and downloads of offloaded state run at full PCIe/NVLink-C2C
 * speed and can be asynchronous. */
static void *cuda_alloc_host(size_t bytes)
{
    ensure_init();
    void *p = NULL;
    size_t n = bytes ? bytes : 1;
    cudaError_t rc = cudaMallocHost(&p, n);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        char b1[32];
        zt_fatal("cudaMallocHost (pinned host memory for offload) of %s failed: %s\n---> HINT: pinned "
                 "memory is limited by the host's RAM and `ulimit -l`",
                 zt_fmt_bytes((double)n, b1, sizeof b1), cudaGetErrorString(rc));
    }
    memset(p, 0, n);
    return p;
}

static void cuda_free_host(void *p)
{
    if (p) ZT_CUDA(cudaFreeHost(p));
}

static void cuda_memzero(void *p, size_t bytes)
{
    ensure_init();
    if (bytes) ZT_CUDA(cudaMemsetAsync(p, 0, bytes, g_stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
    ensure_init();
    if (bytes) ZT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
}

/* a column block of packed rows: one strided copy on the stream, no kernel */
static void cuda_copy_rows(float *dst, int dst_stride, const float *src, int src_stride, int N, int width)
{
    if (N <= 0 || width <= 0) return;
    ZT_CUDA(cudaMemcpy2DAsync(dst, (size_t)dst_stride * sizeof(float), src, (size_t)src_stride * sizeof(float),
                              (size_t)width * sizeof(float), (size_t)N, cudaMemcpyDeviceToDevice, g_stream));
}

static void cuda_to_host(void *host, const void *src, size_t bytes)
{
    ensure_init();
    if (!bytes) return;
    ZT_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, g_stream));
    stream_wait(g_stream);
}

/* Synchronous on return: the caller may reuse `host` at once, pinned or not. */
static void cuda_from_host(void *dst, const void *host, size_t bytes)
{
    ensure_init();
    if (!bytes) return;
    ZT_CUDA(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, g_stream));
    stream_wait(g_stream);
}

/* Offload's transfers run on their own streams, one per direction, so a download
 * (device -> host), an upload (host -> device) and kernels can all run at once on
 * the copy engines and the SMs. Events order them against the compute stream. */
static cudaStream_t g_d2h, g_h2d;
static cudaEvent_t g_ev_d2h, g_ev_h2d;

static void ensure_copy_streams(void)
{
    ensure_init();
    if (g_d2h) return;
    ZT_CUDA(cudaStreamCreateWithFlags(&g_d2h, cudaStreamNonBlocking));
    ZT_CUDA(cudaStreamCreateWithFlags(&g_h2d, cudaStreamNonBlocking));
    ZT_CUDA(cudaEventCreateWithFlags(&g_ev_d2h, cudaEventDisableTiming));
    ZT_CUDA(cudaEventCreateWithFlags(&g_ev_h2d, cudaEventDisableTiming));
}

static void cuda_to_host_async(void *host, const void *src, size_t bytes)
{
    ensure_copy_streams();
    if (!bytes) return;
    /* after what the compute stream has queued (the gradients' last writers) */
    ZT_CUDA(cudaEventRecord(g_ev_d2h, g_stream));
    ZT_CUDA(cudaStreamWaitEvent(g_d2h, g_ev_d2h, 0));
    ZT_CUDA(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, g_d2h));
}

static void cuda_from_host_async(void *dst, const void *host, size_t bytes)
{
    ensure_copy_streams();
    if (!bytes) return;
    /* the destination may still be read by queued kernels: upload after them */
    ZT_CUDA(cudaEventRecord(g_ev_h2d, g_stream));
    ZT_CUDA(cudaStreamWaitEvent(g_h2d, g_ev_h2d, 0));
    ZT_CUDA(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, g_h2d));
    /* and whatever the compute stream queues next sees the new data */
    ZT_CUDA(cudaEventRecord(g_ev_h2d, g_h2d));
    ZT_CUDA(cudaStreamWaitEvent(g_stream, g_ev_h2d, 0));
}

static void cuda_wait_downloads(void)
{
    if (g_d2h) stream_wait(g_d2h);
}

static void cuda_wait_uploads(void)
{
    if (g_h2d) stream_wait(g_h2d);
}

/* cuBLASLt's fast modes take fp32 operands and round them to TF32 or bf16 inside
 * the tensor-core GEMM (fp32 accumulation): bf16-speed GEMMs without converting
 * buffers. Cached plans carry their compute type, so a change needs no flush. */
static void cuda_set_matmul_precision(int level)
{
    g_precision = level;
    g_compute = level == ZT_MATMUL_MEDIUM ? CUBLAS_COMPUTE_32F_FAST_16BF
              : level == ZT_MATMUL_HIGH   ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
}

int zt_cuda_matmul_precision(void) { return g_precision; }

/* Shared memory above the 48 KiB default must be opted into, per kernel; beyond
 * the device's opt-in limit nothing can run. */
void zt_cuda_smem_optin(const void *kernel, size_t bytes, const char *what)
{
    if (bytes <= (size_t)48 << 10) return;
    int dev = 0, optin = 0;
    ZT_CUDA(cudaGetDevice(&dev));
    ZT_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > (size_t)optin)
        zt_fatal("%s needs %zu bytes of shared memory per block, the device allows %d", what,
                 bytes, optin);
    ZT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

static void cuda_sync(void)
{
    ensure_init();
    stream_wait(g_stream);
}

/* ---- embedding, positional ------------------------------------------------ */

static void cuda_embedding_forward(float *out, const int32_t *inp, const float *wte, int N, int C)
{
    ensure_init();
    size_t n = (size_t)N * C;
    if (n == 0) return; /* a zero-sized grid is a launch error */
    embedding_forward_k<<<ELEM_LAUNCH(n)>>>(out, inp, wte, N, C);
    ZT_LAUNCHED();
}

static void cuda_embedding_backward(float *dwte, const float *dout, const int32_t *inp, int N,
                                    int C)
{
    ensure_init();
    size_t n = (size_t)N * C;
    if (n == 0) return;
    embedding_backward_k<<<ELEM_LAUNCH(n)>>>(dwte, dout, inp, N, C);
    ZT_LAUNCHED();
}

static void cuda_positional_forward(float *out, const float *wpe, const int32_t *positions, int B,
                                    int T, int C)
{
    ensure_init();
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    positional_forward_k<<<ELEM_LAUNCH(n)>>>(out, wpe, positions, B, T, C);
    ZT_LAUNCHED();
}

static void cuda_positional_backward(float *dwpe, const float *dout, const int32_t *positions,
                                     int B, int T, int C)
{
    ensure_init();
    size_t n = (size_t)T * C;
    if (n == 0) return;
    if (positions) positional_backward_pos_k<<<ELEM_LAUNCH((size_t)C)>>>(dwpe, dout, positions, B, T, C);
    else positional_backward_k<<<ELEM_LAUNCH(n)>>>(dwpe, dout, B, T, C);
    ZT_LAUNCHED();
}

/* ---- layernorm ------------------------------------------------------------- */


static void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                   const float *weight, const float *bias, int N, int C, float eps)
{
    ensure_init();
    if (N <= 0 || C <= 0) return; /* a zero-sized grid is a launch error */
    layernorm_forward_k<<<ZT_CEIL_DIV(N, LN_WARPS), LN_WARPS * 32, 0, g_stream>>>(
        out, mean, rstd, inp, weight, bias, N, C, eps);
    ZT_LAUNCHED();
}


/* db (C) += colsum(dout (N,C)); with mean/rstd, dw (C) += colsum(dout * xhat). */
static void colsum_accumulate(float *dw, float *db, const float *dout, const float *inp,
                              const float *mean, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0) return; /* nothing to add; a zero-sized grid is a launch error */
    int chunks = zt_colsum_chunks(N);
    float *part = (float *)scratch((size_t)2 * chunks * C * sizeof(float));
    float *part_w = dw ? part : NULL, *part_b = part + (size_t)chunks * C;
    dim3 grid(ZT_CEIL_DIV(C, COLSUM_COLS), chunks), block(COLSUM_COLS, COLSUM_ROWS);
    colsum_partial_k<<<grid, block, 0, g_stream>>>(part_w, part_b, dout, inp, mean, rstd, N, C);
    ZT_LAUNCHED();
    colsum_final_k<<<ZT_CEIL_DIV(C, COLSUM_FINAL_THREADS), COLSUM_FINAL_THREADS, 0, g_stream>>>(
        dw, db, part_w, part_b, chunks, C);
    ZT_LAUNCHED();
}

static void cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C)
{
    ensure_init();
    if (N <= 0 || C <= 0) return;
    if (dinp) {
        layernorm_backward_dinp_k<<<ZT_CEIL_DIV(N, LN_WARPS), LN_WARPS * 32, 0, g_stream>>>(
            dinp, dout, inp, weight, mean, rstd, N, C);
        ZT_LAUNCHED();
    }
    if (dweight || dbias) colsum_accumulate(dweight, dbias, dout, inp, mean, rstd, N, C);
}

/* ---- rmsnorm, rope, swiglu, geglu ------------------------------------------ */

static void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                                 int N, int H, int D, int stride, float eps)
{
    ensure_init();
    const size_t G = (size_t)N * H;
    if (G == 0 || D <= 0) return;
    rmsnorm_forward_k<<<(unsigned)ZT_CEIL_DIV(G, (size_t)LN_WARPS), LN_WARPS * 32, 0, g_stream>>>(
        out, rstd, inp, weight, N, H, D, stride, eps);
    ZT_LAUNCHED();
}

static void cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int N, int H, int D,
                                  int stride)
{
    ensure_init();
    const size_t G = (size_t)N * H;
    if (G == 0 || D <= 0) return;
    if (dinp) {
        rmsnorm_backward_dinp_k<<<(unsigned)ZT_CEIL_DIV(G, (size_t)LN_WARPS), LN_WARPS * 32, 0,
                                  g_stream>>>(dinp, dout, inp, weight, rstd, N, H, D, stride);
        ZT_LAUNCHED();
    }
    if (dweight) {
        /* the groups are the rows of a column sum: chunked partials, then in order */
        const int chunks = zt_colsum_chunks(G > (size_t)INT32_MAX ? INT32_MAX : (int)G);
        float *part = (float *)scratch((size_t)chunks * D * sizeof(float));
        dim3 grid(ZT_CEIL_DIV(D, COLSUM_COLS), chunks), block(COLSUM_COLS, COLSUM_ROWS);
        rmsnorm_dweight_partial_k<<<grid, block, 0, g_stream>>>(part, dout, inp, rstd, N, H, D,
                                                                stride);
        ZT_LAUNCHED();
        colsum_final_k<<<ZT_CEIL_DIV(D, COLSUM_FINAL_THREADS), COLSUM_FINAL_THREADS, 0, g_stream>>>(
            dweight, NULL, part, part, chunks, D);
        ZT_LAUNCHED();
    }
}

static void rope_launch(float *x, const float *inv_freq, const int32_t *positions, int B, int T,
                        int H, int D, int stride, float sign)
{
    ensure_init();
    const size_t n = (size_t)B * T * (D / 2);
    if (n == 0 || H <= 0) return;
    rope_k<<<ELEM_LAUNCH(n)>>>(x, inv_freq, positions, B, T, H, D, stride, sign);
    ZT_LAUNCHED();
}

static void cuda_rope_forward(float *x, const float *inv_freq, const int32_t *positions, int B,
                              int T, int H, int D, int stride)
{
    rope_launch(x, inv_freq, positions, B, T, H, D, stride, 1.0f);
}

static void cuda_rope_backward(float *dx, const float *inv_freq, const int32_t *positions, int B,
                               int T, int H, int D, int stride)
{
    rope_launch(dx, inv_freq, positions, B, T, H, D, stride, -1.0f);
}

/* swiglu (ACT = GLU_SILU) and geglu (GLU_GELU): one kernel pair on the gate's activation */
template <int ACT> static void cuda_glu_forward(float *out, const float *gu, int N, int NI)
{
    ensure_init();
    const size_t n = (size_t)N * NI;
    if (n == 0) return;
    glu_forward_k<ACT><<<ELEM_LAUNCH(n)>>>(out, gu, N, NI);
    ZT_LAUNCHED();
}

template <int ACT> static void cuda_glu_backward(float *dgu, const float *dout, const float *gu, int N, int NI)
{
    ensure_init();
    const size_t n = (size_t)N * NI;
    if (n == 0) return;
    glu_backward_k<ACT><<<ELEM_LAUNCH(n)>>>(dgu, dout, gu, N, NI);
    ZT_LAUNCHED();
}

/* ---- matmul (cuBLASLt) ----------------------------------------------------- */

/* Largest power of two (<= 256) dividing the address: the alignment we promise. */
static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 4 && (a % al) != 0) al >>= 1;
    return al;
}

/* What a GEMM's epilogue does besides D = op(A) op(B) + beta D. */
enum { EPI_PLAIN, EPI_BIAS, EPI_GELU, EPI_GELU_BIAS, EPI_DGELU };

typedef struct {
    int m, n, k, ta, tb, beta1, epi, lda, ldb, ldd; /* leading dimensions: a column block's view */
    uint32_t al_a, al_b, al_d, al_aux, al_bias;
    cublasComputeType_t compute;
    int found;              /* 0: the heuristic had nothing (an epilogue: the caller composes) */
    cublasLtMatmulAlgo_t algo;
} algo_entry_t;

#define ALGO_CACHE 256
static algo_entry_t g_algos[ALGO_CACHE];
static int g_nalgos;

/* Column-major D (m,n) = op(A) (m,k) op(B) (k,n) + beta D, fp32 everywhere, and the
 * epilogue `epi`: + bias (m) broadcast over the columns (EPI_BIAS), then D = gelu(D)
 * with the pre-activation stored to aux (EPI_GELU[_BIAS]), or D *= gelu'(aux)
 * (EPI_DGELU); aux is (m,n) with leading dimension auxld. Returns 0, or -1 when an
 * epilogue was asked for and cuBLASLt has no algorithm with it here (the caller
 * composes the operation itself). A plain GEMM without a tensor-core algorithm runs
 * in fp32; without any, it is fatal. */
static int lt_gemm_scaled(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                          const float *B, int ldb, float *D, int ldd, float beta, int epi,
                          const float *bias, const float *aux, int64_t auxld)
{
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    ZT_CUBLAS(cublasLtMatmulDescCreate(&op, g_compute, CUDA_R_32F));
    ZT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    ZT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (epi != EPI_PLAIN) {
        static const cublasLtEpilogue_t lt_epi[] = {
            CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
            CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU};
        ZT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epi[epi],
                                                 sizeof lt_epi[epi]));
    }
    if (epi == EPI_BIAS || epi == EPI_GELU_BIAS)
        ZT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (epi == EPI_GELU || epi == EPI_GELU_BIAS || epi == EPI_DGELU) {
        ZT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                 sizeof aux));
        ZT_CUBLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld,
                                                 sizeof auxld));
    }
    /* stored shapes: A is (m,k) or (k,m) when transposed, likewise B */
    ZT_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, ta ? k : m, ta ? m : k, lda));
    ZT_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, tb ? n : k, tb ? k : n, ldb));
    ZT_CUBLAS(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd));

    /* the heuristic reads the aux and bias pointers for their alignment (cublasLt.h,
     * CUBLASLT_MATMUL_DESC_BIAS_POINTER / _EPILOGUE_AUX_POINTER), so both are in the key:
     * an algorithm chosen for a 256-byte aligned bias may fault on a 16-byte one */
    uint32_t al_a = align_of(A), al_b = align_of(B), al_d = align_of(D);
    uint32_t al_aux = aux ? align_of(aux) : 0, al_bias = bias ? align_of(bias) : 0;
    int beta1 = beta != 0.0f;
    const cublasLtMatmulAlgo_t *algo = NULL;
    int known = 0;
    for (int i = 0; i < g_nalgos; i++) {
        algo_entry_t *e = &g_algos[i];
        if (e->m == m && e->n == n && e->k == k && e->ta == ta && e->tb == tb && e->lda == lda &&
            e->ldb == ldb && e->ldd == ldd && e->beta1 == beta1 && e->epi == epi && e->al_a == al_a && e->al_b == al_b &&
            e->al_d == al_d && e->al_aux == al_aux && e->al_bias == al_bias &&
            e->compute == g_compute) {
            algo = e->found ? &e->algo : NULL;
            known = 1;
            break;
        }
    }
    cublasLtMatmulHeuristicResult_t res;
    if (!known) {
        cublasLtMatmulPreference_t pref;
        ZT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
        ZT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &g_workspace_bytes, sizeof g_workspace_bytes));
        ZT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
        ZT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
        ZT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
        ZT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
        int found = 0;
        /* "no algorithm" comes back as NOT_SUPPORTED (or, for an epilogue this
         * cuBLASLt rejects with these types, INVALID_VALUE): reported below */
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g_lt, op, la, lb, ld, ld, pref, 1, &res,
                                                           &found);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (epi != EPI_PLAIN && hs == CUBLAS_STATUS_INVALID_VALUE))
            found = 0;
        else ZT_CUBLAS(hs);
        ZT_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
        if (found < 1 && epi == EPI_PLAIN && g_compute == CUBLAS_COMPUTE_32F)
            zt_fatal("cuBLASLt found no algorithm for m=%d n=%d k=%d ta=%d tb=%d (alignments %u %u "
                     "%u, compute type %d)", m, n, k, ta, tb, al_a, al_b, al_d, (int)g_compute);
        if (g_nalgos < ALGO_CACHE) {
            algo_entry_t *e = &g_algos[g_nalgos++];
            e->m = m; e->n = n; e->k = k; e->ta = ta; e->tb = tb; e->beta1 = beta1;
            e->lda = lda; e->ldb = ldb; e->ldd = ldd;
            e->epi = epi; e->al_a = al_a; e->al_b = al_b; e->al_d = al_d; e->al_aux = al_aux;
            e->al_bias = al_bias; e->compute = g_compute; e->found = found > 0;
            e->algo = res.algo;
            algo = found > 0 ? &e->algo : NULL;
        } else {
            algo = found > 0 ? &res.algo : NULL;
        }
    }
    if (algo) {
        cublasStatus_t ms = cublasLtMatmul(g_lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, algo,
                                           g_workspace, g_workspace_bytes, g_stream);
        /* an epilogue the heuristic offered but the launch rejects (argument checks,
         * nothing ran): remembered as unavailable, the caller composes */
        if (ms != CUBLAS_STATUS_SUCCESS && epi != EPI_PLAIN) {
            for (int i = 0; i < g_nalgos; i++)
                if (&g_algos[i].algo == algo) g_algos[i].found = 0;
            algo = NULL;
            (void)cudaGetLastError(); /* a non-sticky launch error must not blame the next kernel */
        } else {
            ZT_CUBLAS(ms);
        }
    }
    ZT_CUBLAS(cublasLtMatrixLayoutDestroy(la));
    ZT_CUBLAS(cublasLtMatrixLayoutDestroy(lb));
    ZT_CUBLAS(cublasLtMatrixLayoutDestroy(ld));
    ZT_CUBLAS(cublasLtMatmulDescDestroy(op));
    if (!algo && epi == EPI_PLAIN) {
        /* no TF32/bf16 tensor-core algorithm for these operands (4-byte aligned views,
         * odd leading dimensions): the fp32 GEMM, which is exact where the fast one
         * rounds, rather than a dead run; its algorithm is cached like any other */
        const cublasComputeType_t fast = g_compute;
        g_compute = CUBLAS_COMPUTE_32F;
        lt_gemm_scaled(ta, tb, m, n, k, alpha, A, lda, B, ldb, D, ldd, beta, EPI_PLAIN, NULL, NULL, 0);
        g_compute = fast;
        return 0;
    }
    return algo ? 0 : -1;
}

static int lt_gemm_cm(int ta, int tb, int m, int n, int k, const float *A, int lda, const float *B,
                      int ldb, float *D, int ldd, float beta, int epi, const float *bias,
                      const float *aux, int64_t auxld)
{
    return lt_gemm_scaled(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, D, ldd, beta, epi, bias, aux, auxld);
}

/* Row-major C (M,Nn) = op(A) (M,K) op(B) (K,Nn) + beta C. A is stored (M,K), or
 * (K,M) when ta; B is stored (K,Nn), or (Nn,K) when tb. The row-major buffers
 * read column-major are the transposes, hence the swap. */
static void gemm_rm(int ta, int tb, int M, int Nn, int K, const float *A, const float *B, float *C,
                    float beta)
{
    if (M <= 0 || Nn <= 0) return;
    if (K <= 0) {  // empty sum: C = beta C, and cuBLASLt rejects k = 0
        if (beta == 0.0f) ZT_CUDA(cudaMemsetAsync(C, 0, (size_t)M * Nn * sizeof(float), g_stream));
        return;
    }
    int lda = ta ? M : K, ldb = tb ? K : Nn;
    lt_gemm_cm(tb, ta, Nn, M, K, B, ldb, A, lda, C, Nn, beta, EPI_PLAIN, NULL, NULL, 0);
}


static void cuda_gemm(int ta, int tb, int M, int Nn, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
    ensure_init();
    if (M <= 0 || Nn <= 0) return;
    if (K <= 0) { // C = beta C
        if (beta == 0.0f) ZT_CUDA(cudaMemset2DAsync(C, (size_t)ldc * sizeof(float), 0, (size_t)Nn * sizeof(float),
                                                    (size_t)M, g_stream));
        return;
    }
    lt_gemm_scaled(tb, ta, Nn, M, K, alpha, B, ldb, A, lda, C, ldc, beta, EPI_PLAIN, NULL, NULL, 0);
}

static void cuda_matmul_forward(float *out, const float *inp, const float *weight,
                                const float *bias, int N, int C, int OC, int transw)
{
    ensure_init();
    // out (N,OC) = inp (N,C) @ W (C,OC), or @ W^T with W (OC,C) (+ bias (OC))
    /* The bias in the GEMM's epilogue saves a pass over out (N,OC): with GPT-2's
     * biases (N,9C) per layer, about 7% of a step's time at T=1024 on an H100-class
     * GPU. Column-major the GEMM is out^T (OC,N), whose rows the bias runs along.
     * cuBLASLt wants the bias 16-byte aligned in practice (parameter views in flat
     * unit buffers need not be), and may have no epilogue algorithm: then a kernel. */
    if (bias && N > 0 && OC > 0 && C > 0 && align_of(bias) >= 16 &&
        lt_gemm_cm(transw, 0, OC, N, C, weight, transw ? C : OC, inp, C, out, OC, 0.0f, EPI_BIAS, bias,
                   NULL, 0) == 0)
        return;
    gemm_rm(0, transw, N, OC, C, inp, weight, out, 0.0f);
    if (bias) {
        size_t n = (size_t)N * OC;
        add_bias_k<<<ELEM_LAUNCH(n)>>>(out, bias, n, OC);
        ZT_LAUNCHED();
    }
}

static void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, int N, int C, int OC,
                                 int transw)
{
    ensure_init();
    if (dinp) {
        // dinp (N,C) = dout (N,OC) @ W^T ; W^T is (OC,C): W (C,OC) transposed, or W (OC,C) as is
        gemm_rm(0, !transw, N, C, OC, dout, weight, dinp, 0.0f);
    }
    if (dweight) {
        if (!transw) // dW (C,OC) += inp^T (C,N) @ dout (N,OC)
            gemm_rm(1, 0, C, OC, N, inp, dout, dweight, 1.0f);
        else         // dW (OC,C) += dout^T (OC,N) @ inp (N,C)
            gemm_rm(1, 0, OC, C, N, dout, inp, dweight, 1.0f);
    }
    if (dbias) colsum_accumulate(NULL, dbias, dout, NULL, NULL, NULL, N, OC);
}

/* ---- elementwise ----------------------------------------------------------- */


static void cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    ensure_init();
    if (!n) return;
    gelu_forward_k<<<ELEM_LAUNCH(n)>>>(out, inp, n);
    ZT_LAUNCHED();
}

static void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    ensure_init();
    if (!n) return;
    gelu_backward_k<<<ELEM_LAUNCH(n)>>>(dinp, inp, dout, n);
    ZT_LAUNCHED();
}

static void cuda_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    ensure_init();
    if (!n) return;
    residual_forward_k<<<ELEM_LAUNCH(n)>>>(out, a, b, n);
    ZT_LAUNCHED();
}

static void cuda_accumulate(float *y, const float *x, size_t n)
{
    ensure_init();
    if (!n) return;
    accumulate_k<<<ELEM_LAUNCH(n)>>>(y, x, n);
    ZT_LAUNCHED();
}

static void cuda_scale(float *x, float s, size_t n)
{
    ensure_init();
    if (!n) return;
    scale_k<<<ELEM_LAUNCH(n)>>>(x, s, n);
    ZT_LAUNCHED();
}

/* ---- 4-bit weights ----------------------------------------------------------- */

/* QLoRA's base: the 4-bit bytes in the unit dequantized on the device, then the GEMM
 * (cuBLASLt, matmul_forward / matmul_backward) reads the float32 scratch */
static void cuda_dequant4(float *out, const float *region, int64_t n, int quant_type, int nested,
                          int64_t blocksize, const zt_quant4_split_t *split, int flags)
{
    ensure_init();
    if (n <= 0) return;
    if (flags & ZT_DQ4_BYTEWISE) { /* the bytes first, into the scratch (stream order keeps it) */
        const size_t nb = zt_quant4_region_bytes(n, blocksize, nested, split);
        float *bytes = (float *)scratch(ZT_CEIL_DIV(nb, sizeof(float)) * sizeof(float));
        region_bytes_k<<<ELEM_LAUNCH(nb)>>>((uint8_t *)bytes, region, nb);
        ZT_LAUNCHED();
        region = bytes;
    }
    zt_q4_args_t a;
    zt_q4_tables_t tb;
    zt_q4_prepare(region, n, quant_type, nested, blocksize, split, &a, &tb);
    a.bf16 = (flags & ZT_DQ4_BF16) != 0;
    dequant4_k<<<ELEM_LAUNCH((size_t)(n + 1) / 2)>>>(out, a, tb);
    ZT_LAUNCHED();
}

/* ---- fused cross-entropy --------------------------------------------------- */


static void cuda_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int N,
                                    int V, float dscale)
{
    ensure_init();
    if (N <= 0) return;
    crossentropy_fused_k<<<N, CE_THREADS, 0, g_stream>>>(logits, losses, targets, N, V, dscale);
    ZT_LAUNCHED();
}

static void cuda_dropout_mask(float *out, const float *x, const uint64_t *row_keys, uint64_t salt, int N, int C,
                              int c0, float p)
{
    ensure_init();
    const size_t n = (size_t)N * C;
    if (n == 0) return;
    dropout_mask_k<<<ELEM_LAUNCH(n)>>>(out, x, row_keys, salt, N, C, c0, p);
    ZT_LAUNCHED();
}

static void cuda_vocab_ce_max(float *rowmax, const float *logits, int N, int V)
{
    ensure_init();
    if (N <= 0) return;
    vocab_ce_max_k<<<N, CE_THREADS, 0, g_stream>>>(rowmax, logits, N, V);
    ZT_LAUNCHED();
}

static void cuda_vocab_ce_sum(float *sz, const float *logits, const float *rowmax, const int32_t *targets, int v0,
                              int N, int V)
{
    ensure_init();
    if (N <= 0) return;
    vocab_ce_sum_k<<<N, CE_THREADS, 0, g_stream>>>(sz, logits, rowmax, targets, v0, N, V);
    ZT_LAUNCHED();
}

static void cuda_vocab_ce_grad(float *logits, float *losses, const float *rowmax, const float *sz,
                               const int32_t *targets, int v0, int N, int V, float dscale)
{
    ensure_init();
    if (N <= 0) return;
    vocab_ce_grad_k<<<N, CE_THREADS, 0, g_stream>>>(logits, losses, rowmax, sz, targets, v0, N, V, dscale);
    ZT_LAUNCHED();
}

/* ---- reductions ------------------------------------------------------------ */


static double cuda_sumsq(const float *x, size_t n)
{
    ensure_init();
    if (!n) return 0.0;
    unsigned blocks = zt_sumsq_blocks(n, g_sms);
    double *part = (double *)scratch((RED_BLOCKS + 1) * sizeof(double));
    double *res = part + RED_BLOCKS;
    sumsq_partial_k<<<blocks, RED_THREADS, 0, g_stream>>>(part, x, n);
    ZT_LAUNCHED();
    sum_doubles_k<<<1, RED_THREADS, 0, g_stream>>>(res, part, (int)blocks);
    ZT_LAUNCHED();
    ZT_CUDA(cudaMemcpyAsync(g_host_double, res, sizeof(double), cudaMemcpyDeviceToHost, g_stream));
    stream_wait(g_stream);
    return *g_host_double;
}


static int cuda_all_finite(const float *x, size_t n)
{
    ensure_init();
    if (!n) return 1;
    int *bad = (int *)scratch(sizeof(int));
    ZT_CUDA(cudaMemsetAsync(bad, 0, sizeof(int), g_stream));
    all_finite_k<<<grid_for(n, RED_THREADS), RED_THREADS, 0, g_stream>>>(bad, x, n);
    ZT_LAUNCHED();
    ZT_CUDA(cudaMemcpyAsync(g_host_int, bad, sizeof(int), cudaMemcpyDeviceToHost, g_stream));
    stream_wait(g_stream);
    return *g_host_int == 0;
}

/* ---- AdamW ----------------------------------------------------------------- */


static void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                       float b2, float eps, float wd, float grad_scale, long step)
{
    ensure_init();
    if (!n) return;
    float step_size, sqrt_bc2;
    zt_adamw_bias_corrections(lr, b1, b2, step, &step_size, &sqrt_bc2);
    adamw_k<<<ELEM_LAUNCH(n)>>>(p, g, m, v, n, lr, b1, b2, eps, wd, grad_scale, step_size,
                                sqrt_bc2);
    ZT_LAUNCHED();
}

/* ---- bf16 ------------------------------------------------------------------ */


static void cuda_to_bf16(uint16_t *out, const float *in, size_t n)
{
    ensure_init();
    if (!n) return;
    to_bf16_k<<<ELEM_LAUNCH(n)>>>(out, in, n);
    ZT_LAUNCHED();
}

static void cuda_from_bf16(float *out, const uint16_t *in, size_t n)
{
    ensure_init();
    if (!n) return;
    from_bf16_k<<<ELEM_LAUNCH(n)>>>(out, in, n);
    ZT_LAUNCHED();
}

/* ---- fp16 ------------------------------------------------------------------ */


static void cuda_to_fp16(uint16_t *out, const float *in, size_t n)
{
    ensure_init();
    if (!n) return;
    to_fp16_k<<<ELEM_LAUNCH(n)>>>(out, in, n);
    ZT_LAUNCHED();
}

static void cuda_from_fp16(float *out, const uint16_t *in, size_t n)
{
    ensure_init();
    if (!n) return;
    from_fp16_k<<<ELEM_LAUNCH(n)>>>(out, in, n);
    ZT_LAUNCHED();
}

/* ---- device queries (zt_cuda.h) -------------------------------------------- */

extern "C" int zt_cuda_available(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        zt_err(err, errlen, "CUDA unusable: %s", cudaGetErrorString(rc));
        return 0;
    }
    if (n < 1) {
        zt_err(err, errlen, "CUDA unusable: no CUDA device visible (CUDA_VISIBLE_DEVICES=%s)",
               getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
        return 0;
    }
    return 1;
}

extern "C" int zt_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int zt_cuda_pick_device(int local_rank)
{
    int n = 0;
    ZT_CUDA(cudaGetDeviceCount(&n));
    if (n < 1) zt_fatal("no CUDA device visible to local rank %d", local_rank);
    int dev = (local_rank < 0 ? 0 : local_rank) % n;
    ZT_CUDA(cudaSetDevice(dev));
    return dev;
}

extern "C" void *zt_cuda_stream(void)
{
    ensure_init();
    return (void *)g_stream;
}

extern "C" int zt_cuda_device_info(char *name, size_t namelen, size_t *total_bytes,
                                   size_t *free_bytes, char *err, size_t errlen)
{
    int dev = 0;
    cudaDeviceProp prop;
    cudaError_t rc = cudaGetDevice(&dev);
    if (rc == cudaSuccess) rc = cudaGetDeviceProperties(&prop, dev);
    size_t fr = 0, tot = 0;
    if (rc == cudaSuccess) rc = cudaMemGetInfo(&fr, &tot);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return zt_err(err, errlen, "CUDA device query failed: %s", cudaGetErrorString(rc));
    }
    if (name && namelen) snprintf(name, namelen, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
    if (total_bytes) *total_bytes = tot;
    if (free_bytes) *free_bytes = fr;
    return 0;
}

extern "C" size_t zt_cuda_memory_peak(void)
{
    if (!g_ready || !g_pools) return 0;
    int dev = 0;
    cudaMemPool_t pool;
    uint64_t high = 0; /* the attribute is a cuuint64_t, i.e. uint64_t */
    ZT_CUDA(cudaGetDevice(&dev));
    ZT_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
    ZT_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    return (size_t)high;
}

/* ---- the MLP's GEMMs with GELU in cuBLASLt's epilogue ------------------------ *
 *
 * cuBLASLt's GELU is the tanh approximation (as ours and GPT-2's), but how it is
 * evaluated is not documented: before the first fused call at a precision the
 * epilogues are probed on a small GEMM whose products are exact (an identity weight
 * and operands on the bf16 grid) and compared with this backend's own GELU kernels.
 * The probe checks the semantics (bias before GELU, the pre-activation stored as
 * aux in D's layout, gelu' multiplied in), to bf16 accuracy: a hardware tanh
 * (relative error 2^-11) or even an erf GELU would pass, a wrong operation (errors
 * of 0.05 and more) would not; the largest differences go into the run log. The
 * epilogues are used only below ZT_MATMUL_HIGHEST: fp32 runs match the CPU backend
 * to fp32 rounding, which a library's approximation need not. The saving: two
 * (N,4C) passes per block forward (gelu's read and write) and three backward. */

static int g_gelu_epi[3] = {-1, -1, -1}; /* by precision: -1 not probed, 0 no, 1 yes */
static long g_gelu_epi_calls;
static char g_gelu_epi_why[200];

/* max |got - want| / (4e-3 + 4e-3 |want|) over n device floats (NaN: infinite);
 * the largest |got - want| in *maxdiff */
static double probe_excess(const float *got_d, const float *want_d, size_t n, double *maxdiff)
{
    float *got = (float *)malloc(2 * n * sizeof(float)), *want = got + n;
    if (!got) zt_fatal("out of host memory (%zu bytes) probing cuBLASLt's GELU", 2 * n * sizeof(float));
    ZT_CUDA(cudaMemcpyAsync(got, got_d, n * sizeof(float), cudaMemcpyDeviceToHost, g_stream));
    ZT_CUDA(cudaMemcpyAsync(want, want_d, n * sizeof(float), cudaMemcpyDeviceToHost, g_stream));
    stream_wait(g_stream);
    double worst = 0.0;
    *maxdiff = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double e = d / (4e-3 + 4e-3 * fabs((double)want[i]));
        if (!(e <= worst)) worst = e == e ? e : INFINITY;
        if (!(d <= *maxdiff)) *maxdiff = d == d ? d : INFINITY;
    }
    free(got);
    return worst;
}

/* 1 when cuBLASLt's GELU epilogues agree with gelu_forward_k / gelu_backward_k at the
 * current precision. y (N,F) = x (N,F) @ I + b, x on a 1/8 grid in [-6, 6) and b on
 * a 1/64 grid: every product is exact even when the operands are rounded to bf16,
 * so any difference is the epilogue's. */
static int gelu_epilogue_ok(void)
{
    int *state = &g_gelu_epi[g_precision];
    if (*state >= 0) return *state;
    enum { N = 96, F = 64 };
    const size_t n = (size_t)N * F;
    float *h = (float *)calloc(n + (size_t)F * F + F, sizeof(float));
    if (!h) zt_fatal("out of host memory probing cuBLASLt's GELU");
    float *hx = h, *hw = h + n, *hb = hw + (size_t)F * F;
    for (size_t i = 0; i < n; i++) hx[i] = (float)((long)((i * 37) % 96) - 48) / 8.0f;
    for (int j = 0; j < F; j++) hw[(size_t)j * F + j] = 1.0f, hb[j] = (float)(j - 32) / 64.0f;
    /* x | w | b as on the host, then pre, out, want (offsets keep 256-byte alignment) */
    float *d = (float *)cuda_alloc((4 * n + (size_t)F * F + F) * sizeof(float));
    float *x = d, *w = x + n, *b = w + (size_t)F * F, *pre = b + F, *out = pre + n, *want = out + n;
    ZT_CUDA(cudaMemcpyAsync(x, hx, (n + (size_t)F * F + F) * sizeof(float), cudaMemcpyHostToDevice,
                            g_stream));
    enum { PRE, GELU, DGELU };
    static const char *const what[] = {"pre-activation", "gelu", "gelu'"};
    double e[3] = {INFINITY, INFINITY, INFINITY}, diff[3] = {0, 0, 0};
    int stage = PRE; /* the first check that did not pass, or 3 */
    /* forward: pre = x + b exactly, out = gelu(pre) */
    if (lt_gemm_cm(0, 0, F, N, F, w, F, x, F, out, F, 0.0f, EPI_GELU_BIAS, b, pre, F) == 0) {
        ZT_CUDA(cudaMemcpyAsync(want, x, n * sizeof(float), cudaMemcpyDeviceToDevice, g_stream));
        add_bias_k<<<ELEM_LAUNCH(n)>>>(want, b, n, F);
        ZT_LAUNCHED();
        e[PRE] = probe_excess(pre, want, n, &diff[PRE]);
        gelu_forward_k<<<ELEM_LAUNCH(n)>>>(want, pre, n);
        ZT_LAUNCHED();
        e[GELU] = probe_excess(out, want, n, &diff[GELU]);
        stage = e[PRE] > 1.0 ? PRE : e[GELU] > 1.0 ? GELU : DGELU;
        /* backward, transposed weight as gelu_matmul_backward has it: out = (x @ I^T) *
         * gelu'(pre), x standing in for dy */
        if (stage == DGELU &&
            lt_gemm_cm(1, 0, F, N, F, w, F, x, F, out, F, 0.0f, EPI_DGELU, NULL, pre, F) == 0) {
            gelu_backward_k<<<ELEM_LAUNCH(n)>>>(want, pre, x, n);
            ZT_LAUNCHED();
            e[DGELU] = probe_excess(out, want, n, &diff[DGELU]);
            if (e[DGELU] <= 1.0) stage = 3;
        }
    }
    cuda_free(d);
    free(h);
    *state = stage == 3;
    if (*state)
        snprintf(g_gelu_epi_why, sizeof g_gelu_epi_why,
                 "in cuBLASLt's epilogue (probe: largest difference from ztrain's kernels %.2g in "
                 "gelu, %.2g in gelu')", diff[GELU], diff[DGELU]);
    else if (isinf(e[stage]) && diff[stage] == 0.0)
        snprintf(g_gelu_epi_why, sizeof g_gelu_epi_why,
                 "a kernel: this cuBLASLt has no %s epilogue for fp32 here", stage == DGELU ? "DGELU" : "GELU_AUX_BIAS");
    else
        snprintf(g_gelu_epi_why, sizeof g_gelu_epi_why,
                 "a kernel: cuBLASLt's GELU epilogue differs from ztrain's in %s by up to %.3g",
                 what[stage], diff[stage]);
    return *state;
}

extern "C" int zt_cuda_gelu_epilogue(char *why, size_t len, long *calls)
{
    if (why && len) snprintf(why, len, "%s", g_gelu_epi_why[0] ? g_gelu_epi_why : "a kernel");
    if (calls) *calls = g_gelu_epi_calls;
    int used = 0;
    for (int i = 0; i < 3; i++) used |= g_gelu_epi[i] == 1;
    return used;
}

static void cuda_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight,
                                     const float *bias, int N, int C, int OC)
{
    ensure_init();
    // pre (N,OC) = inp (N,C) @ W (C,OC) + bias ; out = gelu(pre). Column-major: pre^T (OC,N).
    if (g_precision != ZT_MATMUL_HIGHEST && N > 0 && OC > 0 && C > 0 && OC % 8 == 0 &&
        (!bias || align_of(bias) >= 16) && gelu_epilogue_ok() &&
        lt_gemm_cm(0, 0, OC, N, C, weight, OC, inp, C, out, OC, 0.0f, bias ? EPI_GELU_BIAS : EPI_GELU,
                   bias, pre, OC) == 0) {
        g_gelu_epi_calls++;
        return;
    }
    cuda_matmul_forward(pre, inp, weight, bias, N, C, OC, 0);
    cuda_gelu_forward(out, pre, (size_t)N * OC);
}

static void cuda_gelu_matmul_backward(float *dpre, float *dweight, float *dbias, const float *dy,
                                      const float *act, const float *pre, const float *weight, int N,
                                      int C, int OC)
{
    ensure_init();
    // W's gradients first: dpre may be act (stream order keeps the GEMMs apart)
    cuda_matmul_backward(NULL, dweight, dbias, dy, act, weight, N, C, OC, 0);
    if (N <= 0 || C <= 0) return;
    // dpre (N,C) = (dy (N,OC) @ W^T) * gelu'(pre) ; column-major dpre^T (C,N) = W (C,OC) dy^T
    if (g_precision != ZT_MATMUL_HIGHEST && OC > 0 && C % 8 == 0 && gelu_epilogue_ok() &&
        lt_gemm_cm(1, 0, C, N, OC, weight, OC, dy, OC, dpre, C, 0.0f, EPI_DGELU, NULL, pre, C) == 0) {
        g_gelu_epi_calls++;
        return;
    }
    gemm_rm(0, 1, N, C, OC, dy, weight, dpre, 0.0f);
    cuda_gelu_backward(dpre, pre, dpre, (size_t)N * C);
}

/* ---- the backend ----------------------------------------------------------- */

extern "C" const zt_backend_t zt_backend_cuda = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memzero = cuda_memzero,
    .copy = cuda_copy,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .sync = cuda_sync,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .to_host_async = cuda_to_host_async,
    .from_host_async = cuda_from_host_async,
    .wait_downloads = cuda_wait_downloads,
    .wait_uploads = cuda_wait_uploads,
    .set_matmul_precision = cuda_set_matmul_precision,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .positional_forward = cuda_positional_forward,
    .positional_backward = cuda_positional_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .swiglu_forward = cuda_glu_forward<GLU_SILU>,
    .swiglu_backward = cuda_glu_backward<GLU_SILU>,
    .geglu_forward = cuda_glu_forward<GLU_GELU>,
    .geglu_backward = cuda_glu_backward<GLU_GELU>,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .gemm = cuda_gemm,
    .matmul_gelu_forward = cuda_matmul_gelu_forward,
    .gelu_matmul_backward = cuda_gelu_matmul_backward,
    .attention_forward = zt_cuda_attention_forward,
    .attention_backward = zt_cuda_attention_backward,
    .attention_block_forward = zt_cuda_attention_block_forward,
    .attention_block_backward = zt_cuda_attention_block_backward,
    .attention_merge = zt_cuda_attention_merge,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .copy_rows = cuda_copy_rows,
    .residual_forward = cuda_residual_forward,
    .accumulate = cuda_accumulate,
    .crossentropy_fused = cuda_crossentropy_fused,
    .vocab_ce_max = cuda_vocab_ce_max,
    .vocab_ce_sum = cuda_vocab_ce_sum,
    .vocab_ce_grad = cuda_vocab_ce_grad,
    .dropout_mask = cuda_dropout_mask,
    .scale = cuda_scale,
    .sumsq = cuda_sumsq,
    .all_finite = cuda_all_finite,
    .adamw = cuda_adamw,
    .to_bf16 = cuda_to_bf16,
    .from_bf16 = cuda_from_bf16,
    .to_fp16 = cuda_to_fp16,
    .from_fp16 = cuda_from_fp16,
    .dequant4 = cuda_dequant4,
};
