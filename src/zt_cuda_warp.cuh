/* zt_cuda_warp.cuh — warp-wide reductions shared by the CUDA kernels.
 *
 * Device code only, no CUDA headers of its own: nvcc sees it through
 * zt_backend_cuda.cu and zt_attention_kernels.cuh, and the host emulator
 * (tests/gpu/cuda_emul.h) compiles it with g++. Every lane of a full warp must
 * call these (the shuffles name all 32 lanes). */
#ifndef ZT_CUDA_WARP_CUH
#define ZT_CUDA_WARP_CUH

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

#endif
