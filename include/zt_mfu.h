/* zt_mfu.h — the MFU probe: the matmul peak of a backend, the denominator of the
 * model FLOPs utilization the trainer logs when train.peak_tflops is not given. */
#ifndef ZT_MFU_H
#define ZT_MFU_H

#include "zt_backend.h"

/* FLOP/s of this rank's backend on a GPT-2-sized matmul (256 x 768 by 768 x 2304):
 * the best single repetition within about 0.4 s, each timed on the CPU backend by the
 * thread's CPU time where that is shorter than the wall clock, so a busy machine at
 * start-up does not lower the peak (and lift MFU over 100%). Local: the caller combines
 * ranks. */
double zt_mfu_measure_peak(const zt_backend_t *be);

#endif
