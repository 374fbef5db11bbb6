/* zt_cuda.h — the CUDA device: availability, selection, and the backend's stream.
 *
 * Deliberately free of CUDA headers (streams are passed as void *), so that the
 * run code and the backend registry can include it in every build and call it
 * only where configure defined ZT_HAVE_CUDA. The compute backend itself is
 * zt_backend_cuda (src/zt_backend_cuda.cu), a zt_backend_t like the CPU one.
 *
 * Order of use on a GPU run: zt_cuda_available() -> zt_cuda_pick_device(local
 * rank) -> anything else. The backend creates its stream, cuBLASLt handle and
 * workspace lazily on the current device at its first call, so the device must
 * be chosen before the first alloc. */
#ifndef ZT_CUDA_H
#define ZT_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "zt_backend.h"   /* C declarations: keep C linkage when included from .cu */

extern const zt_backend_t zt_backend_cuda;

/* 1 when at least one CUDA device is usable; otherwise 0 with the CUDA runtime's
 * own message in err ("no CUDA-capable device is detected", a driver/runtime
 * version mismatch, ...). Never aborts: parallel.backend = "auto" falls back to
 * the CPU on 0, "cuda" turns it into a clear error. */
int zt_cuda_available(char *err, size_t errlen);

/* Selects (cudaSetDevice) and returns device local_rank % (visible devices).
 * The runtime already honours CUDA_VISIBLE_DEVICES, so indices are relative to
 * it. Aborts the job when no device is visible (call zt_cuda_available first). */
int zt_cuda_pick_device(int local_rank);

/* Number of visible devices (0 when none or on error). */
int zt_cuda_device_count(void);

/* The backend's compute stream (a cudaStream_t), created on first use. Every
 * backend kernel and copy runs on it; NCCL's comm streams order against it. */
void *zt_cuda_stream(void);

/* Device name and memory (for the run summary); returns 0, or -1 with err. */
int zt_cuda_device_info(char *name, size_t namelen, size_t *total_bytes, size_t *free_bytes,
                        char *err, size_t errlen);

/* The most memory the backend's allocations held at once (the device memory pool's
 * high-water mark: what torch.cuda.max_memory_allocated reports); 0 before the
 * first allocation or without memory pools. Checks the shard engine's accounting
 * against the allocator's. */
size_t zt_cuda_memory_peak(void);

/* A function the backend calls (about every millisecond) while the host waits for
 * one of its streams, instead of blocking in the driver: the NCCL backend installs
 * its check of the communicators' asynchronous errors, so that a collective whose
 * peer died aborts the job instead of hanging the compute stream that waits for it.
 * NULL restores plain blocking waits. */
void zt_cuda_set_wait_hook(void (*hook)(void));

/* Whether the MLP's GELU has run in cuBLASLt's epilogue (matmul_gelu_forward,
 * gelu_matmul_backward): 1 once the probe accepted it at some precision, else 0;
 * `why` gets one phrase on where GELU runs (and why not the epilogue), `calls` the
 * number of fused GEMMs so far. Either may be NULL. */
int zt_cuda_gelu_epilogue(char *why, size_t len, long *calls);

#ifdef __cplusplus
}
#endif

#endif
