/* zt_attention_cuda.cu — the CUDA backend's attention: kernel choice and launches.
 *
 * The kernels are in zt_attention_kernels.cuh (shared with the host emulator
 * of tests/gpu/emulate_attention.cpp). Two families:
 *   - fp32 on CUDA cores, head sizes 1..256: train.matmul_precision = highest
 *     or high (TF32 GEMMs keep fp32 attention: its products are a small part
 *     of the FLOPs there, and the fp32 kernels are the reference);
 *   - bf16 tensor cores (wmma, fp32 accumulation), head sizes that are
 *     multiples of 16 up to 128: precision medium, the bf16 mode that
 *     train.bf16 / fp16 choose; other head sizes fall back to fp32.
 * Both are flash-style (no (B,NH,T,T) buffer; lse (B,NH,T) kept for the
 * backward) and deterministic. Grouped-query attention (NKV key/value heads
 * shared by NH query heads) and any head size HD in range; seg (B,T) in device
 * memory, or NULL, masks packed samples from each other, and window > 0 is a
 * sliding window (zt_backend.h). */
#include <math.h>
#include <stddef.h>

extern "C" {
#include "zt_backend.h"
#include "zt_common.h"
}
#include "zt_cuda_internal.h"
#include "zt_attention_kernels.cuh"

/* 1/sqrt(hs), computed as the CPU backend does */
static float fa_scale(int HD) { return 1.0f / sqrtf((float)HD); }

/* Grid (B*heads, row tiles of `rows`): heads = NH for the forward and dq kernels,
 * NKV for the dk/dv kernels (one block per KV head and key tile). */
static dim3 fa_grid(int B, int T, int heads, int rows)
{
    const int ntiles = ZT_CEIL_DIV(T, rows);
    if (ntiles > 65535) zt_fatal("attention: sequence length %d above the CUDA kernels' limit", T);
    return dim3((unsigned)(B * heads), (unsigned)ntiles);
}

/* ---- fp32 ------------------------------------------------------------------ */

/* self-attention over qkv rows [q | k | v] (and dqkv alike) as an fa_args */
static fa_args fa_self(const float *qkv, float *dqkv, const int32_t *seg, int T, int NH, int NKV, int HD,
                       int window)
{
    const int C3 = (NH + 2 * NKV) * HD;
    const size_t ko = (size_t)NH * HD, vo = (size_t)(NH + NKV) * HD;
    fa_args a = {qkv, qkv + ko, qkv + vo, dqkv, dqkv ? dqkv + ko : NULL, dqkv ? dqkv + vo : NULL,
                 seg, seg, C3, C3, T, T, NH, NKV, HD, 1, window, 0, fa_scale(HD)};
    return a;
}

template <int NI>
static void fa_forward_args(float *out, float *lse, const fa_args &a, int B)
{
    const size_t smem = fa_smem_bytes(a.HD, 3);
    zt_cuda_smem_optin((const void *)flash_forward_k<NI>, smem, "attention (fp32)");
    flash_forward_k<NI><<<fa_grid(B, a.Tq, a.NH, FA_TILE), FA_WARPS * 32, smem, zt_cuda_compute_stream()>>>(out, lse,
                                                                                                            a);
    ZT_LAUNCHED();
}

template <int NI>
static void fa_backward_args(const float *dout, const float *out, const float *lse, const fa_args &a, int B)
{
    const size_t smem = fa_smem_bytes(a.HD, 4);
    cudaStream_t st = zt_cuda_compute_stream();
    zt_cuda_smem_optin((const void *)flash_backward_dq_k<NI>, smem, "attention (fp32)");
    flash_backward_dq_k<NI><<<fa_grid(B, a.Tq, a.NH, FA_TILE), FA_WARPS * 32, smem, st>>>(dout, out, lse, a);
    ZT_LAUNCHED();
    zt_cuda_smem_optin((const void *)flash_backward_dkv_k<NI>, smem, "attention (fp32)");
    flash_backward_dkv_k<NI><<<fa_grid(B, a.Tk, a.NKV, FA_TILE), FA_WARPS * 32, smem, st>>>(dout, out, lse, a);
    ZT_LAUNCHED();
}

/* ---- bf16 tensor cores ----------------------------------------------------- */

template <int NF>
static void tc_forward_args(float *out, float *lse, const fa_args &a, int B)
{
    const size_t smem = tc_smem_forward(a.HD);
    zt_cuda_smem_optin((const void *)tc_forward_k<NF>, smem, "attention (bf16)");
    tc_forward_k<NF><<<fa_grid(B, a.Tq, a.NH, TC_ROWS), TC_THREADS, smem, zt_cuda_compute_stream()>>>(out, lse, a);
    ZT_LAUNCHED();
}

template <int NF>
static void tc_backward_args(const float *dout, const float *out, const float *lse, const fa_args &a, int B)
{
    cudaStream_t st = zt_cuda_compute_stream();
    zt_cuda_smem_optin((const void *)tc_backward_dq_k<NF>, tc_smem_dq(a.HD), "attention (bf16)");
    tc_backward_dq_k<NF><<<fa_grid(B, a.Tq, a.NH, TC_ROWS), TC_THREADS, tc_smem_dq(a.HD), st>>>(dout, out, lse, a);
    ZT_LAUNCHED();
    zt_cuda_smem_optin((const void *)tc_backward_dkv_k<NF>, tc_smem_dkv(a.HD), "attention (bf16)");
    tc_backward_dkv_k<NF><<<fa_grid(B, a.Tk, a.NKV, TC_ROWS), TC_THREADS, tc_smem_dkv(a.HD), st>>>(dout, out, lse,
                                                                                                     a);
    ZT_LAUNCHED();
}

/* ---- choice ---------------------------------------------------------------- */

typedef void (*fa_forward_fn)(float *, float *, const fa_args &, int);
typedef void (*fa_backward_fn)(const float *, const float *, const float *, const fa_args &, int);
/* indexed by NI - 1 = (hs - 1) / 32 */
static const fa_forward_fn fa_forward_by_ni[FA_MAX_NI] = {
    fa_forward_args<1>, fa_forward_args<2>, fa_forward_args<3>, fa_forward_args<4>,
    fa_forward_args<5>, fa_forward_args<6>, fa_forward_args<7>, fa_forward_args<8>};
static const fa_backward_fn fa_backward_by_ni[FA_MAX_NI] = {
    fa_backward_args<1>, fa_backward_args<2>, fa_backward_args<3>, fa_backward_args<4>,
    fa_backward_args<5>, fa_backward_args<6>, fa_backward_args<7>, fa_backward_args<8>};
/* indexed by NF - 1 = hs / 16 - 1 */
static const fa_forward_fn tc_forward_by_nf[TC_MAX_NF] = {
    tc_forward_args<1>, tc_forward_args<2>, tc_forward_args<3>, tc_forward_args<4>,
    tc_forward_args<5>, tc_forward_args<6>, tc_forward_args<7>, tc_forward_args<8>};
static const fa_backward_fn tc_backward_by_nf[TC_MAX_NF] = {
    tc_backward_args<1>, tc_backward_args<2>, tc_backward_args<3>, tc_backward_args<4>,
    tc_backward_args<5>, tc_backward_args<6>, tc_backward_args<7>, tc_backward_args<8>};

/* The tensor-core kernels' NF for this head size under the current precision,
 * or 0 for the fp32 kernels. */
static int tc_nf(int HD)
{
    if (zt_cuda_matmul_precision() != ZT_MATMUL_MEDIUM) return 0;
    return HD % 16 == 0 && HD / 16 >= 1 && HD / 16 <= TC_MAX_NF ? HD / 16 : 0;
}

/* The fp32 kernels' NI, after checking the shape: a kernel cannot report an error. */
static int fa_ni(int NH, int NKV, int HD)
{
    if (HD < 1 || HD > 32 * FA_MAX_NI)
        zt_fatal("attention: head size %d outside the CUDA kernels' range 1..%d", HD,
                 32 * FA_MAX_NI);
    if (NKV < 1 || NH < NKV || NH % NKV != 0)
        zt_fatal("attention: %d query heads cannot share %d key/value heads", NH, NKV);
    return (HD + 31) / 32;
}

void zt_cuda_attention_forward(float *out, float *lse, const float *qkv, const int32_t *seg, int B,
                               int T, int NH, int NKV, int HD, int window)
{
    const int ni = fa_ni(NH, NKV, HD), nf = tc_nf(HD);
    const fa_args a = fa_self(qkv, NULL, seg, T, NH, NKV, HD, window);
    if (nf) tc_forward_by_nf[nf - 1](out, lse, a, B);
    else fa_forward_by_ni[ni - 1](out, lse, a, B);
}

void zt_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                const float *out, const float *lse, const int32_t *seg, int B,
                                int T, int NH, int NKV, int HD, int window)
{
    const int ni = fa_ni(NH, NKV, HD), nf = tc_nf(HD);
    const fa_args a = fa_self(qkv, dqkv, seg, T, NH, NKV, HD, window);
    if (nf) tc_backward_by_nf[nf - 1](dout, out, lse, a, B);
    else fa_backward_by_ni[ni - 1](dout, out, lse, a, B);
}

/* ---- ring attention's blocks (zt_backend.h) ----------------------------------
 * The same two kernel families on a block pair's fa_args, chosen as for the
 * self-attention (tensor cores under precision medium for head sizes they take). */

static fa_args fa_block(const float *q, int qs, const float *k, const float *v, int ks, float *dq, float *dk,
                        float *dv, const int32_t *qseg, const int32_t *kseg, int Tq, int Tk, int NH, int NKV, int HD,
                        int causal, int window, int delta)
{
    if (causal && Tq != Tk) zt_fatal("attention: a causal block needs as many queries as keys (%d, %d)", Tq, Tk);
    fa_args a = {q, k, v, dq, dk, dv, qseg, qseg ? kseg : NULL, qs, ks, Tq, Tk, NH, NKV, HD, causal,
                 window, delta, fa_scale(HD)};
    return a;
}

void zt_cuda_attention_block_forward(float *out, float *lse, const float *q, int qs, const float *k, const float *v,
                                     int ks, const int32_t *qseg, const int32_t *kseg, int B, int Tq, int Tk, int NH,
                                     int NKV, int HD, int causal, int window, int delta)
{
    const int ni = fa_ni(NH, NKV, HD), nf = tc_nf(HD);
    const fa_args a = fa_block(q, qs, k, v, ks, NULL, NULL, NULL, qseg, kseg, Tq, Tk, NH, NKV, HD, causal, window,
                               delta);
    if (nf) tc_forward_by_nf[nf - 1](out, lse, a, B);
    else fa_forward_by_ni[ni - 1](out, lse, a, B);
}

void zt_cuda_attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, int qs,
                                      const float *k, const float *v, int ks, const int32_t *qseg,
                                      const int32_t *kseg, const float *out, const float *lse, int B, int Tq, int Tk,
                                      int NH, int NKV, int HD, int causal, int window, int delta)
{
    const int ni = fa_ni(NH, NKV, HD), nf = tc_nf(HD);
    const fa_args a = fa_block(q, qs, k, v, ks, dq, dk, dv, qseg, kseg, Tq, Tk, NH, NKV, HD, causal, window, delta);
    if (nf) tc_backward_by_nf[nf - 1](dout, out, lse, a, B);
    else fa_backward_by_ni[ni - 1](dout, out, lse, a, B);
}

void zt_cuda_attention_merge(float *out, float *lse, const float *out2, const float *lse2, int B, int T, int NH,
                             int HD)
{
    const size_t rows = (size_t)B * NH * T;
    if (!rows) return;
    const unsigned blocks = (unsigned)ZT_MIN(ZT_CEIL_DIV(rows, (size_t)256), (size_t)65535);
    attention_merge_k<<<blocks, 256, 0, zt_cuda_compute_stream()>>>(out, lse, out2, lse2, B, T, NH, HD);
    ZT_LAUNCHED();
}
