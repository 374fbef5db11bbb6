/* zt_kernels_cpu.c — being written */
