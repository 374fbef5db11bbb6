/* zt_attention_kernels.cuh — the CUDA backend's attention kernels, fp32 and bf16 tensor-core.
 *
 * One source, two compilers: src/zt_attention_cuda.cu includes this with nvcc
 * and launches the kernels; tests/gpu/emulate_attention.cpp includes it with g++
 * after tests/gpu/cuda_emul.h, which runs every CUDA thread of a block as a
 * host coroutine, so the kernels are checked against the CPU backend on
 * machines without a GPU. Hence the rules for code in this file:
 *   - device code only, plus the inline shared-memory sizes both sides use;
 *     dynamic shared memory is declared with ZT_DYNAMIC_SMEM, not extern
 *     __shared__ (the emulator hands each block its own buffer);
 *   - warp-collective calls (shuffles, __syncwarp, wmma) by all 32 lanes of a
 *     warp, full mask;
 *   - WMMA fragments are opaque: only fill_fragment, load_matrix_sync,
 *     store_matrix_sync and mma_sync touch them. The emulator's fragment holds
 *     the whole 16x16 tile in every lane, which agrees with the hardware for
 *     these whole-fragment operations (and would for element-wise operations
 *     applied uniformly to every x[i]) but not for anything that depends on
 *     which element a lane holds. */
#ifndef ZT_ATTENTION_KERNELS_CUH
#define ZT_ATTENTION_KERNELS_CUH

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <mma.h>
#define ZT_DYNAMIC_SMEM(type, name) extern __shared__ __align__(128) type name[]
#endif
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "zt_cuda_warp.cuh"

/* ==== fp32 on CUDA cores (train.matmul_precision = highest / high) ========= */

/* Flash-style attention: no (B,NH,Tq,Tk) buffer, only lse (B,NH,Tq). One call's
 * operands are an fa_args: queries q (B,Tq) rows of stride qs with query head h at
 * h*HD, keys and values k, v (B,Tk) rows of stride ks with KV head g at g*HD
 * (grouped-query: query head h reads KV head h / (NH/NKV); the dk/dv kernels run
 * per KV head and loop over its query heads). The model's self-attention passes
 * the three parts of its qkv rows [q (NH hs) | k (NKV hs) | v (NKV hs)], Tq = Tk = T,
 * causal; ring attention (sequence parallelism) passes a block of queries against
 * a block of keys: causal when they are the same positions, else every key is seen.
 * A block of FA_WARPS warps owns one head (b,h) and one tile of FA_TILE = 32
 * rows, so a lane maps to one key (or query) of the other tile and warp
 * shuffles broadcast a probability to the lanes that own the head channels
 * (lane + 32c, c < NI = ceil(hs/32), in registers). Tiles sit in shared memory
 * with an odd row stride, so lanes reading 32 different rows hit 32 banks.
 *   forward: Q tile resident, K/V tiles streamed (causal: 0..diagonal), online
 *            softmax (running max m, sum l, rescaled accumulator), writes out
 *            and lse; a row that sees no key gets out 0 and lse -inf.
 *   dq:      Q and dO tiles resident, K/V streamed; p = exp(s - lse) is
 *            recomputed, ds = p (dO.v - D) with D = dO.out per row.
 *   dk, dv:  K/V tile resident, Q/dO/lse/D tiles streamed (causal: from the
 *            diagonal to the end).
 * The backward takes the FINAL out and lse of the query rows (over every key
 * block), so ring attention's block pairs add up to the whole backward.
 * dq and dk/dv are separate kernels so every output element has one writer:
 * no atomics, and results are deterministic. Rows past Tq or Tk are zero-filled
 * in shared memory and masked, so any lengths work.
 * Packed rows (qseg, kseg: neat packing, both kernel families): a key of another
 * segment is masked like a key above the diagonal (fa_sees); tiles are not
 * skipped for it yet, so a packed row costs what one sequence of its length
 * does. qseg NULL takes exactly the unsegmented path.
 * Sliding window (window > 0: HF's sliding_window): query t, delta + t positions
 * after key 0 (self-attention and causal blocks: delta 0; ring attention's earlier
 * key blocks: their distance), sees key j only when delta + t - j < window as
 * well; the key tiles wholly outside every row's window are skipped
 * (fa_first_key_tile, fa_query_tile_end), so a window costs O(T window), and the
 * rest are masked in fa_sees. A row whose window ends before a block's keys gets
 * out 0 and lse -inf, as a row of other segments does. 0: the path above. */
#define FA_TILE 32
#define FA_WARPS 8
#define FA_RPW (FA_TILE / FA_WARPS)  /* rows (or keys) per warp */
#define FA_MAX_NI 8                  /* head size up to 256 */

struct fa_args {
    const float *q, *k, *v;    /* device pointers, the strides below */
    float *dq, *dk, *dv;       /* the backward's outputs (+=), strides qs, ks */
    const int32_t *qseg, *kseg; /* (B,Tq), (B,Tk) segment ids, or NULL */
    int qs, ks, Tq, Tk, NH, NKV, HD, causal;
    int window, delta;         /* > 0: t sees keys delta + t - window + 1 .. ; 0: no window */
    float scale;
};

/* Loads rows r0.. r0+FA_TILE-1 of a (T, hs) view with row stride ld_g into a
 * shared tile with row stride ld; rows at or past T become zeros. */
__device__ __forceinline__ void fa_load_tile(float *dst, const float *src, int r0, int T, int hs,
                                             int ld, size_t ld_g)
{
    for (int e = threadIdx.x; e < FA_TILE * hs; e += blockDim.x) {
        int r = e / hs, i = e - r * hs;
        dst[r * ld + i] = r0 + r < T ? src[(size_t)(r0 + r) * ld_g + i] : 0.0f;
    }
}

/* Key j visible from query t (t < Tq): a key of the block, causal when the call is,
 * inside t's window when there is one, and with segments (qsb, ksb: the batch row's,
 * or NULL) in the query's segment (a padding query of -s: in s; zt_backend.h) */
__device__ __forceinline__ bool fa_sees(const fa_args &a, const int32_t *qsb, const int32_t *ksb, int t, int j)
{
    return j < a.Tk && (!a.causal || j <= t) && (!a.window || a.delta + t - j < a.window) &&
           (!qsb || ksb[j] == abs(qsb[t]));
}

/* The first key tile (tiles of `rows` keys) that query rows q0.. meet: 0, or the
 * one where the first row's window starts (later rows' windows start later; past
 * the last tile: none). Both kernel families, with their tile sizes. */
__device__ __forceinline__ int fa_first_key_tile(const fa_args &a, int q0, int rows)
{
    return a.window ? max(0, a.delta + q0 - a.window + 1) / rows : 0;
}

/* One past the last query tile (of `rows` rows, nqt in all) that sees a key of
 * k0 .. k0+rows-1: with a window, the tile of the last key's last query
 * t = (k0 + rows - 1) + window - 1 - delta; none when t < 0 */
__device__ __forceinline__ int fa_query_tile_end(const fa_args &a, int k0, int rows, int nqt)
{
    const int t = k0 + rows + a.window - 2 - a.delta;
    return a.window ? (t < 0 ? 0 : min(nqt, t / rows + 1)) : nqt;
}

/* the key tiles query tile `tile` meets: up to the diagonal when causal */
__device__ __forceinline__ int fa_last_key_tile(const fa_args &a, int tile)
{
    return a.causal ? tile : (a.Tk + FA_TILE - 1) / FA_TILE - 1;
}

__device__ __forceinline__ float fa_dot(const float *a, const float *b, int hs)
{
    float d = 0.0f;
#pragma unroll 8
    for (int i = 0; i < hs; i++) d += a[i] * b[i];
    return d;
}

/* dout_t . out_t over one head's channels (lanes split them); warp-uniform result */
__device__ __forceinline__ float fa_row_D(const float *dy, const float *y, int hs)
{
    float d = 0.0f;
    for (int i = threadIdx.x % 32; i < hs; i += 32) d += dy[i] * y[i];
    return warp_sum(d);
}

template <int NI>
__global__ void __launch_bounds__(FA_WARPS * 32)
flash_forward_k(float *out, float *lse, const fa_args a)
{
    ZT_DYNAMIC_SMEM(float, fa_sm);
    const int hs = a.HD, ld = hs | 1, NH = a.NH, Tq = a.Tq, C = NH * hs;  /* out's row stride */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / (NH / a.NKV);
    const int32_t *qsb = a.qseg ? a.qseg + (size_t)b * Tq : NULL, *ksb = a.qseg ? a.kseg + (size_t)b * a.Tk : NULL;
    const int tile = (int)(gridDim.y - 1 - blockIdx.y);  /* tiles with the most keys first */
    const int q0 = tile * FA_TILE, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sq = fa_sm, *sk = sq + FA_TILE * ld, *sv = sk + FA_TILE * ld;
    const float *qb = a.q + (size_t)b * Tq * a.qs + h * hs;  // (Tq, hs) view, row stride qs
    const float *kb = a.k + (size_t)b * a.Tk * a.ks + g * hs, *vb = a.v + (size_t)b * a.Tk * a.ks + g * hs;
    fa_load_tile(sq, qb, q0, Tq, hs, ld, a.qs);

    float m[FA_RPW], l[FA_RPW], acc[FA_RPW][NI];
#pragma unroll
    for (int rr = 0; rr < FA_RPW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int c = 0; c < NI; c++) acc[rr][c] = 0.0f;
    }
    for (int kt = fa_first_key_tile(a, q0, FA_TILE); kt <= fa_last_key_tile(a, tile); kt++) {
        const int k0 = kt * FA_TILE;
        __syncthreads();  /* the previous K/V tile is no longer read */
        fa_load_tile(sk, kb, k0, a.Tk, hs, ld, a.ks);
        fa_load_tile(sv, vb, k0, a.Tk, hs, ld, a.ks);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < FA_RPW; rr++) {
            const int r = warp * FA_RPW + rr, t = q0 + r, j = k0 + lane;
            float s = -INFINITY;
            if (t < Tq && fa_sees(a, qsb, ksb, t, j)) s = fa_dot(sq + r * ld, sk + lane * ld, hs) * a.scale;
            const float mnew = fmaxf(m[rr], warp_max(s));
            /* -inf guards: masked keys give 0, and a row with nothing yet (or a
             * row past Tq) keeps m = -inf without computing exp(-inf - -inf) */
            const float p = s == -INFINITY ? 0.0f : expf(s - mnew);
            const float corr = m[rr] == -INFINITY ? 0.0f : expf(m[rr] - mnew);
            l[rr] = l[rr] * corr + warp_sum(p);
            m[rr] = mnew;
#pragma unroll
            for (int c = 0; c < NI; c++) acc[rr][c] *= corr;
#pragma unroll 4
            for (int jj = 0; jj < FA_TILE; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                const float *vj = sv + jj * ld;
#pragma unroll
                for (int c = 0; c < NI; c++) {
                    const int i = lane + 32 * c;
                    if (i < hs) acc[rr][c] += pj * vj[i];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < FA_RPW; rr++) {
        const int t = q0 + warp * FA_RPW + rr;
        if (t >= Tq) continue;
        float *o = out + ((size_t)b * Tq + t) * C + h * hs;
        /* l = 0: the row saw no key of this block (self-attention always sees key t) */
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
        for (int c = 0; c < NI; c++) {
            const int i = lane + 32 * c;
            if (i < hs) o[i] = acc[rr][c] * inv;
        }
        if (lane == 0) lse[(size_t)bh * Tq + t] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    }
}

/* dq for one query tile; D per row is computed here from dout and out. */
template <int NI>
__global__ void __launch_bounds__(FA_WARPS * 32)
flash_backward_dq_k(const float *dout, const float *out, const float *lse, const fa_args a)
{
    ZT_DYNAMIC_SMEM(float, fa_sm);
    const int hs = a.HD, ld = hs | 1, NH = a.NH, Tq = a.Tq, C = NH * hs;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / (NH / a.NKV);
    const int32_t *qsb = a.qseg ? a.qseg + (size_t)b * Tq : NULL, *ksb = a.qseg ? a.kseg + (size_t)b * a.Tk : NULL;
    const int tile = (int)(gridDim.y - 1 - blockIdx.y);
    const int q0 = tile * FA_TILE, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *sq = fa_sm, *sdo = sq + FA_TILE * ld, *sk = sdo + FA_TILE * ld, *sv = sk + FA_TILE * ld;
    const float *qb = a.q + (size_t)b * Tq * a.qs + h * hs;
    const float *kb = a.k + (size_t)b * a.Tk * a.ks + g * hs, *vb = a.v + (size_t)b * a.Tk * a.ks + g * hs;
    const float *dyb = dout + (size_t)b * Tq * C + h * hs, *yb = out + (size_t)b * Tq * C + h * hs;
    fa_load_tile(sq, qb, q0, Tq, hs, ld, a.qs);
    fa_load_tile(sdo, dyb, q0, Tq, hs, ld, C);

    float L[FA_RPW], D[FA_RPW], acc[FA_RPW][NI];
#pragma unroll
    for (int rr = 0; rr < FA_RPW; rr++) {
        const int t = q0 + warp * FA_RPW + rr;
        L[rr] = t < Tq ? lse[(size_t)bh * Tq + t] : -INFINITY;
        D[rr] = t < Tq ? fa_row_D(dyb + (size_t)t * C, yb + (size_t)t * C, hs) : 0.0f;
#pragma unroll
        for (int c = 0; c < NI; c++) acc[rr][c] = 0.0f;
    }
    for (int kt = fa_first_key_tile(a, q0, FA_TILE); kt <= fa_last_key_tile(a, tile); kt++) {
        const int k0 = kt * FA_TILE;
        __syncthreads();
        fa_load_tile(sk, kb, k0, a.Tk, hs, ld, a.ks);
        fa_load_tile(sv, vb, k0, a.Tk, hs, ld, a.ks);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < FA_RPW; rr++) {
            const int r = warp * FA_RPW + rr, t = q0 + r, j = k0 + lane;
            float ds = 0.0f;
            /* L = -inf: a row with no key anywhere has no gradient */
            if (t < Tq && L[rr] != -INFINITY && fa_sees(a, qsb, ksb, t, j)) {
                const float p = expf(fa_dot(sq + r * ld, sk + lane * ld, hs) * a.scale - L[rr]);
                ds = p * (fa_dot(sdo + r * ld, sv + lane * ld, hs) - D[rr]);
            }
#pragma unroll 4
            for (int jj = 0; jj < FA_TILE; jj++) {
                const float dsj = __shfl_sync(0xffffffffu, ds, jj);
                const float *kj = sk + jj * ld;
#pragma unroll
                for (int c = 0; c < NI; c++) {
                    const int i = lane + 32 * c;
                    if (i < hs) acc[rr][c] += dsj * kj[i];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < FA_RPW; rr++) {
        const int t = q0 + warp * FA_RPW + rr;
        if (t >= Tq) continue;
        float *dq = a.dq + ((size_t)b * Tq + t) * a.qs + h * hs;
#pragma unroll
        for (int c = 0; c < NI; c++) {
            const int i = lane + 32 * c;
            if (i < hs) dq[i] += acc[rr][c] * a.scale;
        }
    }
}

/* dk, dv for one key tile of one KV head (grid (B*NKV, key tiles)), streaming the
 * query tiles that can see it for each of the NH/NKV query heads that read the
 * KV head in turn: one writer per dk, dv element still, no atomics. */
template <int NI>
__global__ void __launch_bounds__(FA_WARPS * 32)
flash_backward_dkv_k(const float *dout, const float *out, const float *lse, const fa_args a)
{
    ZT_DYNAMIC_SMEM(float, fa_sm);
    const int hs = a.HD, ld = hs | 1, NH = a.NH, NKV = a.NKV, Tq = a.Tq, C = NH * hs, grp = NH / NKV;
    const int b = blockIdx.x / NKV, g = blockIdx.x % NKV;
    const int32_t *qsb = a.qseg ? a.qseg + (size_t)b * Tq : NULL, *ksb = a.qseg ? a.kseg + (size_t)b * a.Tk : NULL;
    const int kt = (int)blockIdx.y;  /* tile 0 sees every query tile: the most work first */
    const int k0 = kt * FA_TILE, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nqt = fa_query_tile_end(a, k0, FA_TILE, (Tq + FA_TILE - 1) / FA_TILE);
    float *sk = fa_sm, *sv = sk + FA_TILE * ld, *sq = sv + FA_TILE * ld, *sdo = sq + FA_TILE * ld;
    float *sL = sdo + FA_TILE * ld, *sD = sL + FA_TILE;
    const float *kb = a.k + (size_t)b * a.Tk * a.ks + g * hs, *vb = a.v + (size_t)b * a.Tk * a.ks + g * hs;
    fa_load_tile(sk, kb, k0, a.Tk, hs, ld, a.ks);
    fa_load_tile(sv, vb, k0, a.Tk, hs, ld, a.ks);

    float dk[FA_RPW][NI], dv[FA_RPW][NI];
#pragma unroll
    for (int rr = 0; rr < FA_RPW; rr++)
#pragma unroll
        for (int c = 0; c < NI; c++) dk[rr][c] = dv[rr][c] = 0.0f;
    for (int h = g * grp; h < (g + 1) * grp; h++) {  /* the query heads of this KV head */
    const int bh = b * NH + h;
    const float *qb = a.q + (size_t)b * Tq * a.qs + h * hs;
    const float *dyb = dout + (size_t)b * Tq * C + h * hs, *yb = out + (size_t)b * Tq * C + h * hs;
    for (int qt = a.causal ? kt : 0; qt < nqt; qt++) {  /* causal: query tiles from the diagonal */
        const int q0 = qt * FA_TILE;
        __syncthreads();
        fa_load_tile(sq, qb, q0, Tq, hs, ld, a.qs);
        fa_load_tile(sdo, dyb, q0, Tq, hs, ld, C);
#pragma unroll
        for (int rr = 0; rr < FA_RPW; rr++) {
            const int r = warp * FA_RPW + rr, t = q0 + r;
            const float d = t < Tq ? fa_row_D(dyb + (size_t)t * C, yb + (size_t)t * C, hs) : 0.0f;
            if (lane == 0) {
                sD[r] = d;
                sL[r] = t < Tq ? lse[(size_t)bh * Tq + t] : -INFINITY;
            }
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < FA_RPW; rr++) {
            const int r = warp * FA_RPW + rr, j = k0 + r, t = q0 + lane;  /* lane = query row */
            float p = 0.0f, ds = 0.0f;
            if (t < Tq && sL[lane] != -INFINITY && fa_sees(a, qsb, ksb, t, j)) {
                p = expf(fa_dot(sq + lane * ld, sk + r * ld, hs) * a.scale - sL[lane]);
                ds = p * (fa_dot(sdo + lane * ld, sv + r * ld, hs) - sD[lane]);
            }
#pragma unroll 4
            for (int tt = 0; tt < FA_TILE; tt++) {
                const float pt = __shfl_sync(0xffffffffu, p, tt);
                const float dst = __shfl_sync(0xffffffffu, ds, tt);
                const float *qrow = sq + tt * ld, *dyt = sdo + tt * ld;
#pragma unroll
                for (int c = 0; c < NI; c++) {
                    const int i = lane + 32 * c;
                    if (i < hs) {
                        dv[rr][c] += pt * dyt[i];
                        dk[rr][c] += dst * qrow[i];
                    }
                }
            }
        }
    }
    }
#pragma unroll
    for (int rr = 0; rr < FA_RPW; rr++) {
        const int j = k0 + warp * FA_RPW + rr;
        if (j >= a.Tk) continue;
        float *dkj = a.dk + ((size_t)b * a.Tk + j) * a.ks + g * hs, *dvj = a.dv + ((size_t)b * a.Tk + j) * a.ks + g * hs;
#pragma unroll
        for (int c = 0; c < NI; c++) {
            const int i = lane + 32 * c;
            if (i < hs) {
                dkj[i] += dk[rr][c] * a.scale;
                dvj[i] += dv[rr][c];
            }
        }
    }
}

/* Ring attention's merge (zt_backend.h attention_merge): out, lse (B,T,NH*HD),
 * (B,NH,T) := the softmax over both key sets; one thread per (b, h, t) row */
__global__ void attention_merge_k(float *out, float *lse, const float *out2, const float *lse2, int B, int T, int NH,
                                  int HD)
{
    const size_t n = (size_t)B * NH * T;
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < n; r += (size_t)gridDim.x * blockDim.x) {
        const size_t b = r / ((size_t)NH * T), h = r / T % NH, t = r % T;
        const float l1 = lse[r], l2 = lse2[r], m = fmaxf(l1, l2);
        if (m == -INFINITY) continue; /* neither block saw a key yet */
        const float w1 = expf(l1 - m), w2 = expf(l2 - m), s = w1 + w2, a1 = w1 / s, a2 = w2 / s;
        float *o = out + (b * T + t) * NH * HD + h * HD;
        const float *o2 = out2 + (b * T + t) * NH * HD + h * HD;
        for (int i = 0; i < HD; i++) o[i] = a1 * o[i] + a2 * o2[i];
        lse[r] = m + logf(s);
    }
}

/* Dynamic shared memory of the fp32 kernels: `tiles` (FA_TILE, hs) tiles with
 * an odd row stride, plus the lse and D rows of the dk/dv kernel. */
static inline size_t fa_smem_bytes(int hs, int tiles)
{
    return ((size_t)tiles * FA_TILE * (size_t)(hs | 1) + 2 * FA_TILE) * sizeof(float);
}

/* ==== bf16 tensor cores (train.matmul_precision = medium) ================= *
 *
 * The same three kernels with the products on tensor cores: nvcuda::wmma
 * 16x16x16 fragments, bf16 operands, fp32 accumulators (sm_80 and later). The
 * buffers stay fp32; q, k, v and dout are rounded to bf16 (nearest even) as
 * their tiles are staged in shared memory, and so are p and ds before they
 * multiply v, dout, k or q. Scores, the softmax statistics, lse, D = dout.out
 * and every accumulation are fp32.
 *
 * A block of TC_WARPS = 4 warps owns one head and one tile of TC_ROWS = 64 rows
 * (query rows; key rows in the dk/dv kernel); each warp owns 16 of them, so
 * its fragments are one row of 16x16 tiles and it needs only __syncwarp
 * between its own steps; __syncthreads guards the streamed tiles. Element-wise
 * work (masking, exp, rescaling) runs on a lane pair per row, each lane taking
 * every other column, the pair combining through one shuffle.
 *   forward: S = Q K^T into shared fp32, online softmax per row (running max m
 *            and sum l in the lane pair's registers), P in bf16, and O += P V
 *            with O in shared fp32: the accumulator is loaded into a fragment,
 *            multiplied into, stored back, so rows can be rescaled by ordinary
 *            threads whatever the fragment layout.
 *   dq:      S = Q K^T and dP = dO V^T, ds = p (dP - D) with p = exp(s - lse),
 *            dq += dS K; dq needs no rescaling, so its fragments stay in
 *            registers for the whole key loop.
 *   dk, dv:  the transposed products S^T = K Q^T and dP^T = V dO^T for the
 *            block's keys, then dv += P^T dO and dk += dS^T Q in registers.
 * Causality, windows and T are handled per 16-wide fragment: fragments wholly
 * above the diagonal, before the rows' windows or past T are skipped, the rest
 * masked element-wise. Every output element has one writer: no atomics,
 * deterministic. */
#define TC_ROWS 64
#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_MAX_NF 8                 /* head size up to 128 (NF = hs / 16 fragments) */
#define TC_LDS (TC_ROWS + 4)        /* fp32 score tiles (64, 64) */
#define TC_LDP (TC_ROWS + 8)        /* bf16 probability tiles (64, 64) */
/* Row strides keep every fragment pointer 32-byte aligned and the leading
 * dimensions multiples of 8 (bf16) and 4 (fp32), as wmma requires. */
#define TC_LDH(hs) ((hs) + 8)       /* bf16 operand tiles (64, hs) */
#define TC_LDO(hs) ((hs) + 4)       /* fp32 accumulator tiles (64, hs) */

typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                               nvcuda::wmma::row_major> tc_a_t;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                               nvcuda::wmma::row_major> tc_b_t;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                               nvcuda::wmma::col_major> tc_bt_t;  /* B^T of a row-major tile */
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> tc_acc_t;

/* Rows r0.. r0+TC_ROWS-1 of a (T, hs) fp32 view with row stride ld_g, rounded to
 * bf16 into a shared tile with row stride ld; rows at or past T become zeros. */
__device__ __forceinline__ void tc_load_tile(__nv_bfloat16 *dst, const float *src, int r0, int T,
                                             int hs, int ld, size_t ld_g)
{
    for (int e = threadIdx.x; e < TC_ROWS * hs; e += blockDim.x) {
        const int r = e / hs, i = e - r * hs;
        dst[r * ld + i] = __float2bfloat16(r0 + r < T ? src[(size_t)(r0 + r) * ld_g + i] : 0.0f);
    }
}

/* lse and D = dout.out (fp32, unrounded) of rows r0.. r0+TC_ROWS-1, a thread
 * pair per row; rows past T get 0 (they are masked). */
__device__ __forceinline__ void tc_load_row_stats(float *sL, float *sD, const float *lse_bh,
                                                  const float *dyb, const float *yb, int r0,
                                                  int T, int hs, int C)
{
    const int r = threadIdx.x / 2, half = threadIdx.x % 2, t = r0 + r;
    float d = 0.0f;
    if (t < T) {
        const float *dy = dyb + (size_t)t * C, *y = yb + (size_t)t * C;
        for (int i = half; i < hs; i += 2) d += dy[i] * y[i];
    }
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    if (half == 0) {
        sD[r] = d;
        sL[r] = t < T ? lse_bh[t] : 0.0f;
    }
}

/* C (16, 16) = A (16, 16 nk) B (16 nk, 16), A row-major in shared with stride
 * lda, B^T given as a row-major (16, 16 nk) tile with stride ldb (so B is
 * read col-major): the Q K^T shape. Stored fp32 row-major at c, stride ldc. */
__device__ __forceinline__ void tc_gemm_abt(float *c, int ldc, const __nv_bfloat16 *a, int lda,
                                            const __nv_bfloat16 *bt, int ldb, int nk)
{
    tc_acc_t acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    for (int kf = 0; kf < nk; kf++) {
        tc_a_t fa;
        tc_bt_t fb;
        nvcuda::wmma::load_matrix_sync(fa, a + kf * 16, lda);
        nvcuda::wmma::load_matrix_sync(fb, bt + kf * 16, ldb);
        nvcuda::wmma::mma_sync(acc, fa, fb, acc);
    }
    nvcuda::wmma::store_matrix_sync(c, acc, ldc, nvcuda::wmma::mem_row_major);
}

/* acc (16, 16) += A (16, 16 kf) B (16 kf, 16) over the key (or query) fragments
 * kf in [k_lo, k_hi): A row-major with stride lda, B row-major with stride ldb. */
__device__ __forceinline__ void tc_gemm_ab(tc_acc_t &acc, const __nv_bfloat16 *a, int lda,
                                           const __nv_bfloat16 *b, int ldb, int k_lo, int k_hi)
{
    for (int kf = k_lo; kf < k_hi; kf++) {
        tc_a_t fa;
        tc_b_t fb;
        nvcuda::wmma::load_matrix_sync(fa, a + kf * 16, lda);
        nvcuda::wmma::load_matrix_sync(fb, b + (size_t)kf * 16 * ldb, ldb);
        nvcuda::wmma::mma_sync(acc, fa, fb, acc);
    }
}

/* Key fragments of a key tile at k0 that the warp's query rows q..q+15 can see
 * (causal: up to the last real row; else every key below Tk; only rows below Tq): 0..4. */
__device__ __forceinline__ int tc_visible_frags(const fa_args &a, int q, int k0)
{
    if (q >= a.Tq) return 0;
    const int last = a.causal ? min(q + 15, a.Tq - 1) : a.Tk - 1;  /* the last key seen */
    if (last < k0) return 0;
    return min(TC_ROWS / 16, (last - k0) / 16 + 1);
}

/* The first of those fragments: 0, or with a window the one holding the first key
 * of row q's window (rows q+1.. start later); TC_ROWS / 16 or more: none */
__device__ __forceinline__ int tc_first_frag(const fa_args &a, int q, int k0)
{
    return a.window ? max(0, a.delta + q - a.window + 1 - k0) / 16 : 0;
}

/* the key tiles of a (64-row) query tile: up to the diagonal when causal */
__device__ __forceinline__ int tc_last_key_tile(const fa_args &a, int tile)
{
    return a.causal ? tile : (a.Tk + TC_ROWS - 1) / TC_ROWS - 1;
}

template <int NF>
__global__ void __launch_bounds__(TC_THREADS)
tc_forward_k(float *out, float *lse, const fa_args a)
{
    ZT_DYNAMIC_SMEM(unsigned char, tc_sm);
    const int hs = NF * 16, ldh = TC_LDH(hs), ldo = TC_LDO(hs), NH = a.NH, Tq = a.Tq;
    const int C = NH * hs;  /* out's row stride */
    const float scale = a.scale;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / (NH / a.NKV);
    const int32_t *qsb = a.qseg ? a.qseg + (size_t)b * Tq : NULL, *ksb = a.qseg ? a.kseg + (size_t)b * a.Tk : NULL;
    const int tile = (int)(gridDim.y - 1 - blockIdx.y);  /* tiles with the most keys first */
    const int q0 = tile * TC_ROWS, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __nv_bfloat16 *sq = (__nv_bfloat16 *)tc_sm, *sk = sq + TC_ROWS * ldh, *sv = sk + TC_ROWS * ldh;
    float *ss = (float *)(sv + TC_ROWS * ldh);                         // (64, 64) scores
    __nv_bfloat16 *sp = (__nv_bfloat16 *)(ss + TC_ROWS * TC_LDS);      // (64, 64) probabilities
    float *so = (float *)(sp + TC_ROWS * TC_LDP);                      // (64, hs) output
    const float *qb = a.q + (size_t)b * Tq * a.qs + h * hs;  // (Tq, hs) view, row stride qs
    const float *kb = a.k + (size_t)b * a.Tk * a.ks + g * hs, *vb = a.v + (size_t)b * a.Tk * a.ks + g * hs;
    tc_load_tile(sq, qb, q0, Tq, hs, ldh, a.qs);
    for (int e = threadIdx.x; e < TC_ROWS * hs; e += blockDim.x) so[(e / hs) * ldo + e % hs] = 0.0f;

    const int w0 = warp * 16;                                     /* the warp's rows */
    const int r = w0 + lane / 2, half = lane % 2, t = q0 + r;     /* the lane pair's row */
    float m = -INFINITY, l = 0.0f;
    for (int kt = fa_first_key_tile(a, q0, TC_ROWS); kt <= tc_last_key_tile(a, tile); kt++) {
        const int k0 = kt * TC_ROWS;
        __syncthreads();  /* the previous K/V tile is no longer read */
        tc_load_tile(sk, kb, k0, a.Tk, hs, ldh, a.ks);
        tc_load_tile(sv, vb, k0, a.Tk, hs, ldh, a.ks);
        __syncthreads();
        const int nkf = tc_visible_frags(a, q0 + w0, k0), kf0 = tc_first_frag(a, q0 + w0, k0);
        if (kf0 >= nkf) continue;  /* warp-uniform: rows past Tq, or keys before their windows */
        for (int nf = kf0; nf < nkf; nf++)  // S (16, 16 nkf) = Q_w K^T (fragments kf0..)
            tc_gemm_abt(ss + w0 * TC_LDS + nf * 16, TC_LDS, sq + w0 * ldh, ldh,
                        sk + nf * 16 * ldh, ldh, NF);
        __syncwarp();
        /* online softmax over this tile's visible keys; -inf guards as in the
         * fp32 kernel (masked keys give 0, rows past Tq keep m = -inf) */
        float mx = -INFINITY;
        for (int j = kf0 * 16 + half; j < nkf * 16; j += 2)
            if (t < Tq && fa_sees(a, qsb, ksb, t, k0 + j)) mx = fmaxf(mx, ss[r * TC_LDS + j] * scale);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mnew = fmaxf(m, mx);
        float sum = 0.0f;
        for (int j = kf0 * 16 + half; j < nkf * 16; j += 2) {
            const float p = t < Tq && fa_sees(a, qsb, ksb, t, k0 + j) ? expf(ss[r * TC_LDS + j] * scale - mnew) : 0.0f;
            sp[r * TC_LDP + j] = __float2bfloat16(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        const float corr = m == -INFINITY ? 0.0f : expf(m - mnew);
        l = l * corr + sum;
        m = mnew;
        if (corr != 1.0f)
            for (int i = half; i < hs; i += 2) so[r * ldo + i] *= corr;
        __syncwarp();
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {  // O_w (16, hs) += P_w (16, 16 nkf) V (16 nkf, hs)
            tc_acc_t acc;
            nvcuda::wmma::load_matrix_sync(acc, so + w0 * ldo + nf * 16, ldo,
                                           nvcuda::wmma::mem_row_major);
            tc_gemm_ab(acc, sp + w0 * TC_LDP, TC_LDP, sv + nf * 16, ldh, kf0, nkf);
            nvcuda::wmma::store_matrix_sync(so + w0 * ldo + nf * 16, acc, ldo,
                                            nvcuda::wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (t < Tq) {
        float *o = out + ((size_t)b * Tq + t) * C + h * hs;
        /* l = 0: the row saw no key of this block (self-attention always sees key t).
         * so is not read then: when the window skips every key tile, no barrier
         * separates its zeroing by other threads from this read. */
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int i = half; i < hs; i += 2) o[i] = l > 0.0f ? so[r * ldo + i] * inv : 0.0f;
        if (half == 0) lse[(size_t)bh * Tq + t] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

/* Stores a warp's 16 rows of accumulator fragments (16, hs) to shared fp32
 * scratch, then its lane pairs add scale * them to the fp32 rows of dst (row
 * stride ld_g) for the rows below T. */
template <int NF>
__device__ __forceinline__ void tc_add_rows(float *dst, size_t ld_g, const tc_acc_t *acc,
                                            float *scr, int ldo, int w0, int row0, int T,
                                            float scale)
{
    const int lane = threadIdx.x % 32, r = w0 + lane / 2, half = lane % 2, t = row0 + r;
#pragma unroll
    for (int nf = 0; nf < NF; nf++)
        nvcuda::wmma::store_matrix_sync(scr + w0 * ldo + nf * 16, acc[nf], ldo,
                                        nvcuda::wmma::mem_row_major);
    __syncwarp();
    if (t < T)
        for (int i = half; i < NF * 16; i += 2) dst[(size_t)t * ld_g + i] += scr[r * ldo + i] * scale;
    __syncwarp();  /* the scratch rows are free again */
}

/* dq for one query tile; lse and D per row are staged in shared memory. */
template <int NF>
__global__ void __launch_bounds__(TC_THREADS)
tc_backward_dq_k(const float *dout, const float *out, const float *lse, const fa_args a)
{
    ZT_DYNAMIC_SMEM(unsigned char, tc_sm);
    const int hs = NF * 16, ldh = TC_LDH(hs), NH = a.NH, Tq = a.Tq, C = NH * hs;
    const float scale = a.scale;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, g = h / (NH / a.NKV);
    const int32_t *qsb = a.qseg ? a.qseg + (size_t)b * Tq : NULL, *ksb = a.qseg ? a.kseg + (size_t)b * a.Tk : NULL;
    const int tile = (int)(gridDim.y - 1 - blockIdx.y);
    const int q0 = tile * TC_ROWS, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __nv_bfloat16 *sq = (__nv_bfloat16 *)tc_sm, *sdo = sq + TC_ROWS * ldh;
    __nv_bfloat16 *sk = sdo + TC_ROWS * ldh, *sv = sk + TC_ROWS * ldh;
    float *ss = (float *)(sv + TC_ROWS * ldh), *sdp = ss + TC_ROWS * TC_LDS;  // (64, 64) each
    __nv_bfloat16 *sds = (__nv_bfloat16 *)(sdp + TC_ROWS * TC_LDS);           // (64, 64)
    float *sL = (float *)(sds + TC_ROWS * TC_LDP), *sD = sL + TC_ROWS;
    const float *qb = a.q + (size_t)b * Tq * a.qs + h * hs;
    const float *kb = a.k + (size_t)b * a.Tk * a.ks + g * hs, *vb = a.v + (size_t)b * a.Tk * a.ks + g * hs;
    const float *dyb = dout + (size_t)b * Tq * C + h * hs, *yb = out + (size_t)b * Tq * C + h * hs;
    tc_load_tile(sq, qb, q0, Tq, hs, ldh, a.qs);
    tc_load_tile(sdo, dyb, q0, Tq, hs, ldh, C);
    tc_load_row_stats(sL, sD, lse + (size_t)bh * Tq, dyb, yb, q0, Tq, hs, C);

    const int w0 = warp * 16, r = w0 + lane / 2, half = lane % 2, t = q0 + r;
    tc_acc_t dq[NF];
#pragma unroll
    for (int nf = 0; nf < NF; nf++) nvcuda::wmma::fill_fragment(dq[nf], 0.0f);
    for (int kt = fa_first_key_tile(a, q0, TC_ROWS); kt <= tc_last_key_tile(a, tile); kt++) {
        const int k0 = kt * TC_ROWS;
        __syncthreads();
        tc_load_tile(sk, kb, k0, a.Tk, hs, ldh, a.ks);
        tc_load_tile(sv, vb, k0, a.Tk, hs, ldh, a.ks);
        __syncthreads();
        const int nkf = tc_visible_frags(a, q0 + w0, k0), kf0 = tc_first_frag(a, q0 + w0, k0);
        if (kf0 >= nkf) continue;
        for (int nf = kf0; nf < nkf; nf++) {
            // S (16, 16 nkf) = Q_w K^T ; dP = dO_w V^T
            tc_gemm_abt(ss + w0 * TC_LDS + nf * 16, TC_LDS, sq + w0 * ldh, ldh,
                        sk + nf * 16 * ldh, ldh, NF);
            tc_gemm_abt(sdp + w0 * TC_LDS + nf * 16, TC_LDS, sdo + w0 * ldh, ldh,
                        sv + nf * 16 * ldh, ldh, NF);
        }
        __syncwarp();
        const float L = sL[r], D = sD[r];
        for (int j = kf0 * 16 + half; j < nkf * 16; j += 2) {
            float ds = 0.0f;
            /* L = -inf: a row with no key anywhere has no gradient */
            if (t < Tq && L != -INFINITY && fa_sees(a, qsb, ksb, t, k0 + j)) {
                const float p = expf(ss[r * TC_LDS + j] * scale - L);
                ds = p * (sdp[r * TC_LDS + j] - D);
            }
            sds[r * TC_LDP + j] = __float2bfloat16(ds);
        }
        __syncwarp();
#pragma unroll
        for (int nf = 0; nf < NF; nf++)  // dq_w (16, hs) += dS_w (16, 16 nkf) K (16 nkf, hs)
            tc_gemm_ab(dq[nf], sds + w0 * TC_LDP, TC_LDP, sk + nf * 16, ldh, kf0, nkf);
    }
    __syncthreads();  /* every warp is done with the score tiles: reuse them as scratch */
    tc_add_rows<NF>(a.dq + (size_t)b * Tq * a.qs + h * hs, a.qs, dq, ss, TC_LDO(hs), w0, q0, Tq, scale);
}

/* dk, dv for one key tile of one KV head (grid (B*NKV, tiles)), streaming the
 * query tiles that can see it for each query head of the KV head's group in turn. */
template <int NF>
__global__ void __launch_bounds__(TC_THREADS)
tc_backward_dkv_k(const float *dout, const float *out, const float *lse, const fa_args a)
{
    ZT_DYNAMIC_SMEM(unsigned char, tc_sm);
    const int hs = NF * 16, ldh = TC_LDH(hs), NH = a.NH, NKV = a.NKV, Tq = a.Tq, Tk = a.Tk, C = NH * hs;
    const float scale = a.scale;
    const int b = blockIdx.x / NKV, g = blockIdx.x % NKV, grp = NH / NKV;
    const int32_t *qsb = a.qseg ? a.qseg + (size_t)b * Tq : NULL, *ksb = a.qseg ? a.kseg + (size_t)b * Tk : NULL;
    const int kt = (int)blockIdx.y;  /* tile 0 sees every query tile: the most work first */
    const int k0 = kt * TC_ROWS, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nqt = fa_query_tile_end(a, k0, TC_ROWS, (Tq + TC_ROWS - 1) / TC_ROWS);
    __nv_bfloat16 *sk = (__nv_bfloat16 *)tc_sm, *sv = sk + TC_ROWS * ldh;
    __nv_bfloat16 *sq = sv + TC_ROWS * ldh, *sdo = sq + TC_ROWS * ldh;
    float *ss = (float *)(sdo + TC_ROWS * ldh), *sdp = ss + TC_ROWS * TC_LDS;  // (64 keys, 64 queries)
    __nv_bfloat16 *sp = (__nv_bfloat16 *)(sdp + TC_ROWS * TC_LDS), *sds = sp + TC_ROWS * TC_LDP;
    float *sL = (float *)(sds + TC_ROWS * TC_LDP), *sD = sL + TC_ROWS;
    const float *kb = a.k + (size_t)b * Tk * a.ks + g * hs, *vb = a.v + (size_t)b * Tk * a.ks + g * hs;
    tc_load_tile(sk, kb, k0, Tk, hs, ldh, a.ks);
    tc_load_tile(sv, vb, k0, Tk, hs, ldh, a.ks);

    const int w0 = warp * 16, r = w0 + lane / 2, half = lane % 2, j = k0 + r;  /* j: the pair's key */
    const int jw = k0 + w0;  /* the warp's first key */
    tc_acc_t dk[NF], dv[NF];
#pragma unroll
    for (int nf = 0; nf < NF; nf++) {
        nvcuda::wmma::fill_fragment(dk[nf], 0.0f);
        nvcuda::wmma::fill_fragment(dv[nf], 0.0f);
    }
    for (int h = g * grp; h < (g + 1) * grp; h++) {  /* the query heads of this KV head */
    const int bh = b * NH + h;
    const float *qb = a.q + (size_t)b * Tq * a.qs + h * hs;
    const float *dyb = dout + (size_t)b * Tq * C + h * hs, *yb = out + (size_t)b * Tq * C + h * hs;
    for (int qt = a.causal ? kt : 0; qt < nqt; qt++) {  /* causal: query tiles from the diagonal */
        const int q0 = qt * TC_ROWS;
        __syncthreads();
        tc_load_tile(sq, qb, q0, Tq, hs, ldh, a.qs);
        tc_load_tile(sdo, dyb, q0, Tq, hs, ldh, C);
        tc_load_row_stats(sL, sD, lse + (size_t)bh * Tq, dyb, yb, q0, Tq, hs, C);
        __syncthreads();
        /* query fragments [f_lo, f_hi) that can see one of the warp's keys (causal:
         * from the diagonal; with a window, up to the one holding jw + 14 + window -
         * delta, the last query of the warp's last key) and hold a row below Tq; none
         * when the warp's keys are all past Tk */
        const int f_lo = a.causal && jw > q0 ? (jw - q0) / 16 : 0;
        int f_hi = jw >= Tk ? f_lo : min(TC_ROWS / 16, (Tq - q0 + 15) / 16);
        if (a.window) f_hi = min(f_hi, max(0, jw + 14 + a.window - a.delta - q0 + 16) / 16);
        if (f_lo >= f_hi) continue;
        for (int f = f_lo; f < f_hi; f++) {
            // S^T (16 keys, 16) = K_w Q_f^T ; dP^T = V_w dO_f^T
            tc_gemm_abt(ss + w0 * TC_LDS + f * 16, TC_LDS, sk + w0 * ldh, ldh,
                        sq + f * 16 * ldh, ldh, NF);
            tc_gemm_abt(sdp + w0 * TC_LDS + f * 16, TC_LDS, sv + w0 * ldh, ldh,
                        sdo + f * 16 * ldh, ldh, NF);
        }
        __syncwarp();
        for (int c = f_lo * 16 + half; c < f_hi * 16; c += 2) {
            const int t = q0 + c;
            float p = 0.0f, ds = 0.0f;
            if (t < Tq && sL[c] != -INFINITY && fa_sees(a, qsb, ksb, t, j)) {
                p = expf(ss[r * TC_LDS + c] * scale - sL[c]);
                ds = p * (sdp[r * TC_LDS + c] - sD[c]);
            }
            sp[r * TC_LDP + c] = __float2bfloat16(p);
            sds[r * TC_LDP + c] = __float2bfloat16(ds);
        }
        __syncwarp();
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {
            // dv_w (16, hs) += P^T_w (16, 16 f) dO (16 f, hs) ; dk_w += dS^T_w Q
            tc_gemm_ab(dv[nf], sp + w0 * TC_LDP, TC_LDP, sdo + nf * 16, ldh, f_lo, f_hi);
            tc_gemm_ab(dk[nf], sds + w0 * TC_LDP, TC_LDP, sq + nf * 16, ldh, f_lo, f_hi);
        }
    }
    }
    __syncthreads();  /* every warp is done with the score tiles: reuse them as scratch */
    tc_add_rows<NF>(a.dk + (size_t)b * Tk * a.ks + g * hs, a.ks, dk, ss, TC_LDO(hs), w0, k0, Tk, scale);
    tc_add_rows<NF>(a.dv + (size_t)b * Tk * a.ks + g * hs, a.ks, dv, ss, TC_LDO(hs), w0, k0, Tk, 1.0f);
}

/* Dynamic shared memory of the tensor-core kernels, in the order they carve
 * it: bf16 operand tiles (64, hs), fp32 tiles (64, 64) for scores, bf16 tiles
 * (64, 64) for probabilities, the forward's fp32 output tile (64, hs), the lse
 * and D rows. The backward kernels' final stores reuse their two score tiles as
 * a (64, hs + 4) fp32 scratch, which fits up to hs = TC_MAX_NF * 16. */
static_assert(2 * TC_LDS >= TC_LDO(TC_MAX_NF * 16), "score tiles too small for the scratch");
static_assert(TC_THREADS == 2 * TC_ROWS, "a thread pair per row");
static inline size_t tc_smem_bytes(int hs, int operand_tiles, int score_tiles, int prob_tiles,
                                   int out_tiles, int row_stats)
{
    return ((size_t)operand_tiles * TC_LDH(hs) * 2 + (size_t)score_tiles * TC_LDS * 4 +
            (size_t)prob_tiles * TC_LDP * 2 + (size_t)out_tiles * TC_LDO(hs) * 4 +
            (size_t)row_stats * 2 * 4) * TC_ROWS;
}
static inline size_t tc_smem_forward(int hs) { return tc_smem_bytes(hs, 3, 1, 1, 1, 0); }
static inline size_t tc_smem_dq(int hs) { return tc_smem_bytes(hs, 4, 2, 1, 0, 1); }
static inline size_t tc_smem_dkv(int hs) { return tc_smem_bytes(hs, 4, 2, 2, 0, 1); }

#endif
