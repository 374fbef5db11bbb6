/* zt_kernels_cuda.cuh — the CUDA backend's element-wise, normalisation, loss,
 * reduction, optimizer and conversion kernels (attention: zt_attention_kernels.cuh).
 *
 * One source, two compilers: src/zt_backend_cuda.cu includes this with nvcc and
 * launches the kernels; tests/gpu/emulate_kernels.cpp includes it with g++ after
 * tests/gpu/cuda_emul.h, which runs every CUDA thread as a host coroutine, so
 * the kernels are checked against the CPU backend on machines without a GPU.
 * Rules for code in this file:
 *   - device code, plus the host-side launch configuration below that both the
 *     launchers and the test use: a kernel whose result depends on its block
 *     shape (block reductions, warp-per-row) reads the constant it is launched
 *     with, so the two cannot drift apart;
 *   - warp-collective calls (shuffles, __syncthreads_or) by every thread that
 *     the hardware requires, full mask;
 *   - only the CUDA intrinsics cuda_emul.h provides (it fails to compile
 *     otherwise, which is the point: extend the shim with the device's
 *     semantics, never silently). */
#ifndef ZT_KERNELS_CUDA_CUH
#define ZT_KERNELS_CUDA_CUH

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "zt_cuda_warp.cuh"
extern "C" {
#include "zt_quant.h"
}

/* ---- launch configuration (host and test) ---------------------------------- */

#define ELEM_THREADS 256      /* grid-stride kernels: any block size works, this one is used */
#define LN_WARPS 8            /* layernorm: warps (rows) per block */
#define COLSUM_COLS 32        /* colsum_partial_k: block (COLSUM_COLS, COLSUM_ROWS) */
#define COLSUM_ROWS 8
#define COLSUM_CHUNKS 64      /* at most this many row chunks (partials per column) */
#define COLSUM_FINAL_THREADS 256
#define CE_THREADS 512        /* crossentropy_fused_k: block per row, sm/ss sized by it */
#define RED_THREADS 256       /* sumsq and all_finite blocks; tree reduction needs a power of 2 */
#define RED_BLOCKS 1024       /* at most this many sumsq partials, summed by one block */

/* Blocks for a grid-stride loop over n elements: enough to fill `sms`
 * multiprocessors (32 blocks each), at least one. */
static inline unsigned zt_grid_for(size_t n, int threads, int sms)
{
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    size_t cap = (size_t)sms * 32;
    if (blocks > cap) blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

/* Row chunks of the column sums: one per 64 rows, 1 to COLSUM_CHUNKS. */
static inline int zt_colsum_chunks(int N)
{
    int c = N / 64;
    return c < 1 ? 1 : c > COLSUM_CHUNKS ? COLSUM_CHUNKS : c;
}

/* sumsq_partial_k's grid: the partials must fit the RED_BLOCKS slots. */
static inline unsigned zt_sumsq_blocks(size_t n, int sms)
{
    unsigned blocks = zt_grid_for(n, RED_THREADS, sms);
    return blocks > RED_BLOCKS ? RED_BLOCKS : blocks;
}

/* adamw_k's step size lr / (1 - b1^t) and sqrt(1 - b2^t), formed in double */
static inline void zt_adamw_bias_corrections(float lr, float b1, float b2, long step,
                                             float *step_size, float *sqrt_bc2)
{
    const double bc1 = 1.0 - pow((double)b1, (double)step);
    const double bc2 = 1.0 - pow((double)b2, (double)step);
    *step_size = (float)(lr / bc1);
    *sqrt_bc2 = (float)sqrt(bc2);
}

/* ---- device helpers -------------------------------------------------------- */

/* Online softmax state (running max m, sum s of exp(x - m)) merged across threads. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    if (s2 == 0.0f || m2 == -INFINITY) return;  /* exp(-inf) contributes nothing */
    if (s == 0.0f) { m = m2; s = s2; return; }
    if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
    else s += s2 * expf(m2 - m);
}

/* ---- embedding, positional ------------------------------------------------ */

/* out (N,C) = wte[inp] */
__global__ void embedding_forward_k(float *out, const int32_t *inp, const float *wte, int N, int C)
{
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
    {
        const int32_t id = inp[i / C];
        out[i] = id < 0 ? 0.0f : wte[(size_t)id * C + i % C]; /* < 0: another tp rank's row */
    }
}

/* dwte rows are scattered by token id: the same token may appear many times, so
 * atomics (order-dependent in the last bits). */
__global__ void embedding_backward_k(float *dwte, const float *dout, const int32_t *inp, int N,
                                     int C)
{
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (inp[i / C] >= 0) atomicAdd(&dwte[(size_t)inp[i / C] * C + i % C], dout[i]);
}

/* out (B,T,C) += wpe[t], or wpe[positions[b*T+t]]: one add, the CPU's, so bit-identical */
__global__ void positional_forward_k(float *out, const float *wpe, const int32_t *positions, int B,
                                     int T, int C)
{
    size_t n = (size_t)B * T * C, tc = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += positions ? wpe[(size_t)positions[i / C] * C + i % C] : wpe[i % tc];
}

/* With positions (packed rows: rows of dwpe repeat): one thread per channel c walks
 * the tokens in (b, t) order, the CPU's order, so deterministic and bit-identical
 * with it. Few threads (C), but this runs once per micro-step on (N, C). */
__global__ void positional_backward_pos_k(float *dwpe, const float *dout, const int32_t *positions,
                                          int B, int T, int C)
{
    const size_t N = (size_t)B * T;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
        for (size_t i = 0; i < N; i++) dwpe[(size_t)positions[i] * C + c] += dout[i * C + c];
}

/* dwpe[t] += dout[b,t] for b = 0, 1, ... in turn onto the running value, the
 * CPU's order: deterministic and bit-identical with it. */
__global__ void positional_backward_k(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t n = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += dout[(size_t)b * n + i];
        dwpe[i] = acc;
    }
}

/* ---- layernorm ------------------------------------------------------------- */

/* One warp per row; two passes over the row (mean, then centred variance) as the
 * CPU reference does, rather than E[x^2] - E[x]^2, which cancels badly. */
__global__ void layernorm_forward_k(float *out, float *mean, float *rstd, const float *inp,
                                    const float *w, const float *b, int N, int C, float eps)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) { float d = x[c] - m; v += d * d; }
    float r = rsqrtf(warp_sum(v) / C + eps);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float y = (x[c] - m) * r * w[c];
        o[c] = b ? y + b[c] : y;
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w ; warp per row. */
__global__ void layernorm_backward_dinp_k(float *dinp, const float *dout, const float *inp,
                                          const float *w, const float *mean, const float *rstd,
                                          int N, int C)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, bsum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float g = dy[c] * w[c];
        a += g;
        bsum += g * (x[c] - m) * r;
    }
    a = warp_sum(a) / C;
    bsum = warp_sum(bsum) / C;
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float g = dy[c] * w[c], xh = (x[c] - m) * r;
        dx[c] += r * (g - a - xh * bsum);
    }
}

/* ---- rmsnorm --------------------------------------------------------------- */

/* Group g = n*H + h of an rmsnorm: D channels at n*stride + h*D. */
__device__ __forceinline__ size_t rms_offset(size_t g, int H, int D, int stride)
{
    return g / H * (size_t)stride + g % H * (size_t)D;
}

/* One warp per group (LN_WARPS groups per block): the sum of squares in fp32 as
 * the CPU backend (and HF's float32 mean), rstd = 1/sqrt(mean + eps) with a
 * correctly rounded division as the CPU's, out = w * (x * rstd). */
__global__ void rmsnorm_forward_k(float *out, float *rstd, const float *inp, const float *w, int N,
                                  int H, int D, int stride, float eps)
{
    const size_t g = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (g >= (size_t)N * H) return;
    const size_t off = rms_offset(g, H, D, stride);
    const float *x = inp + off;
    float ss = 0.0f;
    for (int c = lane; c < D; c += 32) ss += x[c] * x[c];
    const float r = 1.0f / sqrtf(warp_sum(ss) / D + eps);
    float *o = out + off;
    for (int c = lane; c < D; c += 32) o[c] = w[c] * (x[c] * r);
    if (lane == 0) rstd[g] = r;
}

/* dinp += r (w dy) - x r^3 mean(w dy x) ; warp per group */
__global__ void rmsnorm_backward_dinp_k(float *dinp, const float *dout, const float *inp,
                                        const float *w, const float *rstd, int N, int H, int D,
                                        int stride)
{
    const size_t g = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (g >= (size_t)N * H) return;
    const size_t off = rms_offset(g, H, D, stride);
    const float *x = inp + off, *dy = dout + off;
    const float r = rstd[g];
    float s = 0.0f;
    for (int c = lane; c < D; c += 32) s += w[c] * dy[c] * x[c];
    const float k = warp_sum(s) / D * r * r * r;
    float *dx = dinp + off;
    for (int c = lane; c < D; c += 32) dx[c] += w[c] * dy[c] * r - x[c] * k;
}

/* dweight partials: colsum_partial_k's scheme (a block per column tile and row
 * chunk, fixed order) over the N*H groups as rows, summing dy * (x * rstd);
 * colsum_final_k then adds the chunks into dweight. */
__global__ void rmsnorm_dweight_partial_k(float *part, const float *dout, const float *inp,
                                          const float *rstd, int N, int H, int D, int stride)
{
    __shared__ float sw[COLSUM_ROWS][COLSUM_COLS + 1];
    const int c = blockIdx.x * COLSUM_COLS + threadIdx.x;
    const size_t G = (size_t)N * H, per = (G + gridDim.y - 1) / gridDim.y;
    const size_t g0 = blockIdx.y * per, g1 = g0 + per < G ? g0 + per : G;
    float aw = 0.0f;
    if (c < D)
        for (size_t g = g0 + threadIdx.y; g < g1; g += COLSUM_ROWS) {
            const size_t off = rms_offset(g, H, D, stride) + c;
            aw += dout[off] * (inp[off] * rstd[g]);
        }
    sw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && c < D) {
        for (int k = 1; k < COLSUM_ROWS; k++) aw += sw[k][threadIdx.x];
        part[(size_t)blockIdx.y * D + c] = aw;
    }
}

/* ---- rope ------------------------------------------------------------------ */

/* One thread per (row, frequency i < D/2), looping over the H heads, so each
 * angle's cos and sin are computed once per row as on the CPU: the angle is the
 * fp32 product pos * inv_freq[i], then cosf, sinf. sign = +1 rotates by +a
 * (forward), -1 by -a (backward, the transpose). */
__global__ void rope_k(float *x, const float *inv_freq, const int32_t *positions, int B, int T,
                       int H, int D, int stride, float sign)
{
    const int half = D / 2;
    const size_t n = (size_t)B * T * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / half;
        const int i = (int)(e % half);
        const float pos = (float)(positions ? positions[r] : (int32_t)(r % T));
        const float a = pos * inv_freq[i];
        const float cs = cosf(a), sn = sign * sinf(a);
        for (int h = 0; h < H; h++) {
            float *x1 = x + r * stride + (size_t)h * D + i, *x2 = x1 + half;
            const float a1 = *x1, a2 = *x2;
            *x1 = a1 * cs - a2 * sn;
            *x2 = a2 * cs + a1 * sn;
        }
    }
}

/* ---- column sums (layernorm dweight/dbias, matmul dbias) ------------------- */

/* Column sums over N rows in two deterministic stages: a block of COLSUM_COLS
 * columns x COLSUM_ROWS row-lanes per (column tile, row chunk) writes partials,
 * then one thread per column adds the chunks in order. With part_w (and mean,
 * rstd) it also produces sum(dout * xhat) for dweight. */
__global__ void colsum_partial_k(float *part_w, float *part_b, const float *dout,
                                 const float *inp, const float *mean, const float *rstd, int N,
                                 int C)
{
    __shared__ float sw[COLSUM_ROWS][COLSUM_COLS + 1], sb[COLSUM_ROWS][COLSUM_COLS + 1];
    int c = blockIdx.x * COLSUM_COLS + threadIdx.x;
    int rows_per = (N + gridDim.y - 1) / gridDim.y;
    int r0 = blockIdx.y * rows_per, r1 = min(N, r0 + rows_per);
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int n = r0 + threadIdx.y; n < r1; n += COLSUM_ROWS) {
            float d = dout[(size_t)n * C + c];
            ab += d;
            if (part_w) aw += d * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int k = 1; k < COLSUM_ROWS; k++) {
            aw += sw[k][threadIdx.x];
            ab += sb[k][threadIdx.x];
        }
        if (part_w) part_w[(size_t)blockIdx.y * C + c] = aw;
        part_b[(size_t)blockIdx.y * C + c] = ab;
    }
}

__global__ void colsum_final_k(float *dw, float *db, const float *part_w, const float *part_b,
                               int chunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float aw = 0.0f, ab = 0.0f;
    for (int k = 0; k < chunks; k++) {
        if (dw) aw += part_w[(size_t)k * C + c];
        ab += part_b[(size_t)k * C + c];
    }
    if (dw) dw[c] += aw;
    if (db) db[c] += ab;
}

/* ---- matmul bias (when cuBLASLt's epilogue cannot) ------------------------- */

__global__ void add_bias_k(float *out, const float *bias, size_t n, int OC)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % OC];
}

/* ---- elementwise ----------------------------------------------------------- */

#define GELU_S 0.7978845608028654f  /* sqrt(2/pi) */

/* 0.5 (1 + tanh(u)) computed as the sigmoid 1 / (1 + exp(-2u)), as the CPU
 * backend does: no cancellation of 1 + tanh(u) in the negative tail. */
__device__ __forceinline__ float gelu_sig(float x, float *e_out)
{
    float a = -2.0f * GELU_S * (x + 0.044715f * x * x * x);
    float e = expf(fminf(a, 88.0f));
    *e_out = e;
    return 1.0f / (1.0f + e);
}

__global__ void gelu_forward_k(float *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float e, x = inp[i];
        out[i] = x * gelu_sig(x, &e);
    }
}

/* gelu'(x) from sg = gelu_sig(x, &e): d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx,
 * with 1 - s = e s */
__device__ __forceinline__ float gelu_grad(float x, float sg, float e)
{
    float du = GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    return sg + 2.0f * x * sg * (e * sg) * du;
}

__global__ void gelu_backward_k(float *dinp, const float *inp, const float *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float e, x = inp[i];
        float sg = gelu_sig(x, &e);
        dinp[i] = gelu_grad(x, sg, e) * dout[i];
    }
}

/* ---- gated MLPs: swiglu, geglu ---------------------------------------------- */

/* sigmoid from e = exp(-|x|) <= 1: no overflow for any x, as the CPU's */
__device__ __forceinline__ float zt_sigmoidf(float x)
{
    const float e = expf(-fabsf(x)), inv = 1.0f / (1.0f + e);
    return x >= 0.0f ? inv : e * inv;
}

/* The gate's activation: GLU_SILU (swiglu, Llama's MLP) or GLU_GELU, the tanh gelu
 * of gelu_forward_k (geglu, Gemma's MLP). Returns act(g), and act'(g) in *dact
 * unless NULL (the forward, which then never computes it). */
enum { GLU_SILU, GLU_GELU };
template <int ACT> __device__ __forceinline__ float glu_act(float g, float *dact)
{
    if (ACT == GLU_GELU) {
        float e;
        const float sg = gelu_sig(g, &e);
        if (dact) *dact = gelu_grad(g, sg, e);
        return g * sg;
    }
    const float s = zt_sigmoidf(g);
    if (dact) *dact = s + g * s * (1.0f - s);
    return g * s;
}

/* gu (N,2I) = [gate | up] -> out (N,I) = act(gate) * up */
template <int ACT> __global__ void glu_forward_k(float *out, const float *gu, int N, int NI)
{
    const size_t n = (size_t)N * NI;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / NI, i = e % NI;
        const float g = gu[r * 2 * NI + i], u = gu[r * 2 * NI + NI + i];
        out[e] = glu_act<ACT>(g, NULL) * u;
    }
}

/* dgu = [dout up act'(gate) | dout act(gate)], overwritten; each thread reads
 * its gate and up before writing the same two elements, so dgu may be gu. */
template <int ACT>
__global__ void glu_backward_k(float *dgu, const float *dout, const float *gu, int N, int NI)
{
    const size_t n = (size_t)N * NI;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / NI, i = e % NI, o = r * 2 * NI + i;
        const float g = gu[o], u = gu[o + NI], dy = dout[e];
        float da;
        const float act = glu_act<ACT>(g, &da);
        dgu[o] = dy * u * da;
        dgu[o + NI] = dy * act;
    }
}

__global__ void residual_forward_k(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void accumulate_k(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void scale_k(float *x, float s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

/* ---- fused cross-entropy --------------------------------------------------- */

/* Block per row: one pass for the online (max, sum exp) of the row, merged
 * across the block; a second pass overwrites logits with the gradient. The
 * target logit is read before any thread writes. A target outside [0, V) is
 * ignored (loss 0, gradient 0), as in the CPU backend: never index past the row. */
__global__ void crossentropy_fused_k(float *logits, float *losses, const int32_t *targets, int N,
                                     int V, float dscale)
{
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    __shared__ float s_lse;
    int row = blockIdx.x;
    float *x = logits + (size_t)row * V;
    int tgt = targets[row];
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) lse_merge(m, s, x[v], 1.0f);
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sm[0], S = ss[0];
        for (int w = 1; w < (int)(blockDim.x / 32); w++) lse_merge(M, S, sm[w], ss[w]);
        float lse = M + logf(S);
        s_lse = lse;
        losses[row] = (tgt < 0 || tgt >= V) ? 0.0f : lse - x[tgt];
    }
    __syncthreads();  // x[tgt] has been read: the row may be overwritten now
    if (dscale == 0.0f) return;
    float lse = s_lse;
    int ignore = tgt < 0 || tgt >= V;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float g = ignore ? 0.0f : (expf(x[v] - lse) - (v == tgt ? 1.0f : 0.0f)) * dscale;
        x[v] = g;
    }
}

/* ---- LoRA dropout: the CPU's counter-based mask (zt_backend.h), bit for bit ------- */
__device__ __forceinline__ uint64_t dropout_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void dropout_mask_k(float *out, const float *x, const uint64_t *row_keys, uint64_t salt, int N, int C,
                               int c0, float p)
{
    const size_t n = (size_t)N * C;
    const float keep = 1.0f / (1.0f - p);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t k = row_keys[i / C] ^ salt;
        const double u = (double)(dropout_mix(k ^ dropout_mix((uint64_t)(c0 + i % C) + 1)) >> 11) * (1.0 / 9007199254740992.0);
        out[i] = u < p ? 0.0f : x[i] * keep;
    }
}

/* ---- vocabulary-parallel cross-entropy (zt_backend.h) -------------------------
 * Block per row, as crossentropy_fused_k; the tp all-reduces run between them. */
__global__ void vocab_ce_max_k(float *rowmax, const float *logits, int N, int V)
{
    __shared__ float sm[CE_THREADS / 32];
    const float *x = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) sm[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / 32); w++) m = fmaxf(m, sm[w]);
        rowmax[blockIdx.x] = fmaxf(m, sm[0]);
    }
}

__global__ void vocab_ce_sum_k(float *sz, const float *logits, const float *rowmax, const int32_t *targets, int v0,
                               int N, int V)
{
    __shared__ float ss[CE_THREADS / 32];
    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * V;
    const float mx = rowmax[row];
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - mx);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) ss[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float S = ss[0];
        for (int w = 1; w < (int)(blockDim.x / 32); w++) S += ss[w];
        const int tg = targets[row] - v0;
        sz[2 * row] = S;
        sz[2 * row + 1] = targets[row] >= 0 && tg >= 0 && tg < V ? x[tg] : 0.0f;
    }
}

__global__ void vocab_ce_grad_k(float *logits, float *losses, const float *rowmax, const float *sz,
                                const int32_t *targets, int v0, int N, int V, float dscale)
{
    const int row = blockIdx.x;
    float *x = logits + (size_t)row * V;
    const int ignore = targets[row] < 0, tg = targets[row] - v0;
    const float mx = rowmax[row], S = sz[2 * row];
    if (threadIdx.x == 0) losses[row] = ignore ? 0.0f : logf(S) - (sz[2 * row + 1] - mx);
    if (dscale == 0.0f) return;
    const float lse = mx + logf(S);
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        x[v] = ignore ? 0.0f : (expf(x[v] - lse) - (v == tg ? 1.0f : 0.0f)) * dscale;
}

/* ---- reductions ------------------------------------------------------------ */

/* Partials in double per block, summed in block order by one block: the same
 * result for the same input, every time. */
__global__ void sumsq_partial_k(double *part, const float *x, size_t n)
{
    __shared__ double sh[RED_THREADS];
    double acc = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = x[i];
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

__global__ void sum_doubles_k(double *out, const double *part, int n)
{
    __shared__ double sh[RED_THREADS];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

/* Any thread that sees a NaN/Inf raises the flag; all write the same value. */
__global__ void all_finite_k(int *bad, const float *x, size_t n)
{
    int found = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        if (!isfinite(x[i])) found = 1;
    if (__syncthreads_or(found) && threadIdx.x == 0) *bad = 1;
}

/* ---- AdamW ----------------------------------------------------------------- */

/* PyTorch's single-tensor AdamW, operation by operation as the CPU backend:
 * p *= 1 - lr wd ; m.lerp_(g, 1 - b1) ; v = v b2 + (1 - b2) g g ;
 * p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps). */
__global__ void adamw_k(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                        float b2, float eps, float wd, float grad_scale, float step_size,
                        float sqrt_bc2)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] * grad_scale;
        float mi = m[i], w1 = 1.0f - b1;
        /* torch.lerp: a + w (b - a) for w < 0.5, else b - (b - a)(1 - w) */
        mi = w1 < 0.5f ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1.0f - w1);
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * (1.0f - lr * wd) - step_size * (mi / (sqrtf(vi) / sqrt_bc2 + eps));
    }
}

/* ---- 4-bit weights (bitsandbytes NF4 / FP4, include/zt_quant.h) ------------------ */

/* The 16 code values of the quant type and, for double quantization, the 256-value dynamic
 * map: passed by value (1088 bytes of kernel parameters), so no device table to keep. */
typedef struct zt_q4_tables {
    float code[16];
    float dyn[256];
} zt_q4_tables_t;

/* A 4-bit tensor's parts in a region of zt_quant4_pack_region's layout: pointers only, so
 * the host computes them without reading device memory (the offset is read by the kernel). */
typedef struct zt_q4_args {
    const uint8_t *packed;      /* (n + 1) / 2: the first value in the high nibble */
    const float *absmax;        /* !nested: one per block; nested: nested_absmax, one per 256 */
    const uint8_t *codes;       /* nested: one dynamic-map index per block */
    const float *offset;        /* nested: the mean the codes are relative to */
    int64_t n, blocksize;
    int nested;
    zt_quant4_split_t split;    /* nested: which of the tensor's blocks these are */
    int bf16;                   /* each value rounded to bf16 (to nearest even), kept as float */
} zt_q4_args_t;

/* The arguments of dequant4_k for the region at region (host arithmetic on the pointer) */
static inline void zt_q4_prepare(const float *region, int64_t n, int quant_type, int nested, int64_t blocksize,
                                 const zt_quant4_split_t *split, zt_q4_args_t *a, zt_q4_tables_t *tb)
{
    const int64_t nb = (n + blocksize - 1) / blocksize;
    const uint8_t *bytes = (const uint8_t *)(region + zt_quant4_region_floats(nb, nested, split));
    a->n = n, a->blocksize = blocksize, a->nested = nested, a->bf16 = 0;
    memset(&a->split, 0, sizeof a->split);
    if (split) a->split = *split;
    a->offset = nested ? region : NULL;
    a->absmax = nested ? region + 1 : region;
    a->codes = nested ? bytes : NULL;
    a->packed = nested ? bytes + nb : bytes;
    memcpy(tb->code, zt_quant_code((zt_quant_type_t)quant_type), sizeof tb->code);
    memcpy(tb->dyn, zt_quant_dynamic_map(), sizeof tb->dyn);
}

/* out[2i], out[2i + 1] from byte i: code * scale with the scale (dyn[code8] * nested_absmax)
 * + offset as two roundings, each product and sum its own IEEE operation (__fmul_rn,
 * __fadd_rn: nvcc would otherwise fuse them into an fma), as bitsandbytes and the CPU
 * backend round them. One thread a byte: a block's 32 bytes are one warp's, coalesced. */
__global__ void dequant4_k(float *out, zt_q4_args_t a, zt_q4_tables_t tb)
{
    const size_t nbytes = (size_t)(a.n + 1) / 2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nbytes;
         i += (size_t)gridDim.x * blockDim.x) {
        const int64_t e = 2 * (int64_t)i, b = e / a.blocksize;
        const int64_t g = zt_quant4_global_block(&a.split, b) / ZT_QUANT_NESTED_BLOCKSIZE -
                          a.split.first_block / ZT_QUANT_NESTED_BLOCKSIZE;
        const float s = a.nested ? __fadd_rn(__fmul_rn(tb.dyn[a.codes[b]], a.absmax[g]), *a.offset) : a.absmax[b];
        const unsigned byte = a.packed[i];
        float v0 = __fmul_rn(tb.code[byte >> 4], s), v1 = __fmul_rn(tb.code[byte & 15], s);
        if (a.bf16) { /* finite values: round to nearest even on the bit pattern */
            const uint32_t u0 = __float_as_uint(v0), u1 = __float_as_uint(v1);
            v0 = __uint_as_float(((u0 + 0x7fffu + ((u0 >> 16) & 1u)) >> 16) << 16);
            v1 = __uint_as_float(((u1 + 0x7fffu + ((u1 >> 16) & 1u)) >> 16) << 16);
        }
        out[e] = v0;
        if (e + 1 < a.n) out[e + 1] = v1;
    }
}

/* A region stored a byte per float (its value 0..255) back to its bytes */
__global__ void region_bytes_k(uint8_t *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = (uint8_t)in[i];
}

/* ---- bf16 ------------------------------------------------------------------ */

/* Round to nearest even on the bit pattern; NaN stays a (quiet) NaN. */
__global__ void to_bf16_k(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t u = __float_as_uint(in[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u) out[i] = (uint16_t)((u >> 16) | 0x40u);
        else out[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

__global__ void from_bf16_k(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

/* ---- fp16 ------------------------------------------------------------------ */

/* IEEE round to nearest even, overflow to Inf, subnormals kept: the host's zt_fp16.h.
 * cvt.f16.f32 and cvt.f32.f16 turn every NaN into the canonical positive one
 * (cuda_fp16.hpp's host path, written to match them, says so), so NaNs are done
 * here on the bits as zt_fp16.h does them: sign and top payload bits kept, quiet. */
__global__ void to_fp16_k(uint16_t *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t x = __float_as_uint(in[i]), a = x & 0x7fffffffu;
        out[i] = a > 0x7f800000u ? (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu))
                                 : __half_as_ushort(__float2half_rn(in[i]));
    }
}

__global__ void from_fp16_k(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = in[i];
        out[i] = (h & 0x7fffu) > 0x7c00u
                     ? __uint_as_float(((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13))
                     : __half2float(__ushort_as_half((unsigned short)h));
    }
}

#endif
