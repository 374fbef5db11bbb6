/* emulate_attention.cpp — the CUDA attention kernels, emulated on the host, against the CPU backend.
 *
 * Runs the kernel source of src/zt_attention_kernels.cuh through the host
 * emulator (cuda_emul.h: every CUDA thread a coroutine, blocks in turn), so
 * that the fp32 and the bf16 tensor-core kernels are checked on every machine,
 * GPU or not. Per shape (odd T, T below one tile, several tiles; head sizes 12
 * to 256; NKV = NH and grouped-query NKV < NH, down to 1):
 *   - out, lse from the forward and dqkv (+=, from random initial values) from
 *     the backward against zt_backend_cpu (the backward gets the CPU's out and
 *     lse on both sides). Bounds: fp32 kernels 2e-5 / 5e-5 as in
 *     tests/gpu/test_gpu_kernels.c; tensor-core kernels TC_BOUND_FP32 below;
 *   - the tensor-core kernels also against a double-precision reference that
 *     rounds q, k, v, dout, p and ds to bf16 where the kernels do (and, for the
 *     forward, takes the running max over the kernels' 64-key tiles, since p is
 *     rounded relative to it): what is left is fp32 accumulation order and the
 *     rare p or ds whose bf16 rounding flips, so the bound is two orders of
 *     magnitude tighter (TC_BOUND_BF16REF);
 *   - sliding windows (window > 0): below one 16-key fragment, across several
 *     tiles of either family, at the edges of the skipped tiles and fragments,
 *     with packed rows and grouped-query heads, against the CPU backend with the
 *     same window; the windowed result must differ from the unwindowed one (the
 *     window masks something), and window >= T must give the bits of window 0;
 *     on ring blocks too, with the queries delta positions after the keys;
 *   - ring attention's block kernels (both families: a block of queries against a
 *     block of keys in rows of their own strides, causal or full, rows that see no
 *     key) and the merge of two blocks' results, against the CPU backend's;
 *   - each launch under three schedules of the emulator (warps in turn, in
 *     ascending and descending order; warps interleaved at random at every
 *     warp barrier): the results must be bit-identical, as a race on shared
 *     memory would make them differ.
 * Normwise relative error: max |got - ref| / max |ref|. Exit 0 when every row
 * is ok. */
#include "cuda_emul.h"
#define EMUL_RNG_SEED 0x9e3779b97f4a7c15ull
#include "emul_check.h"

#include "../../src/zt_attention_kernels.cuh"

#include <chrono>
#include <vector>

extern "C" {
#include "zt_backend.h"
}

/* Error model of the tensor-core path against fp32 (u = 2^-8, the unit
 * roundoff of bf16's 8-bit significand; RNE errors are ~uniform in [-u, u]
 * relative, standard deviation u/sqrt(3)):
 *   s = scale sum_i q_i k_i with q, k rounded: the error is a random walk over
 *   the hs products, sd = scale sqrt(2 hs E[(q k)^2]) u/sqrt(3); for q, k
 *   uniform in [-2, 2] (E[(qk)^2] = 16/9) that is 1.9 u/sqrt(3) = 4.2e-3 in s,
 *   whatever hs, and p = exp(s - m) inherits it as a relative error. out is a
 *   p-weighted mean of rounded v, so its error is a few u of max |v|; the
 *   largest of ~10^4 such errors sits ~4 sd out. Same for dq, dk, dv, which
 *   add the rounding of dout and of ds (relative u each). Hence a normwise
 *   bound of 4u = 1.6e-2; measured: up to ~5e-3 (see the table). Against the
 *   bf16-rounding reference the expected error is that of fp32 sums of bf16
 *   products (the p and ds it rounds are the kernels' own): bound 5e-6. */
#define TC_BOUND_FP32 1.6e-2
#define TC_BOUND_BF16REF 5e-6

static bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

static float kscale(int HD) { return 1.0f / sqrtf((float)HD); }
static unsigned ntiles(int T, int rows) { return (unsigned)((T + rows - 1) / rows); }

/* ---- the kernels through the emulator -------------------------------------- */

/* Both kernel families on an fa_args, with the grids zt_attention_cuda.cu launches:
 * (B*NH, query tiles) for the forward and dq kernels, (B*NKV, key tiles) for the dk/dv
 * kernels. The tensor cores first: */
template <int NF>
static void tc_fwd_args(float *out, float *lse, const fa_args &a, int B, unsigned sch)
{
    zt_emu::launch(dim3(B * a.NH, ntiles(a.Tq, TC_ROWS)), dim3(TC_THREADS), tc_smem_forward(a.HD),
                   [=] { tc_forward_k<NF>(out, lse, a); }, sch);
}
template <int NF>
static void tc_bwd_args(const float *dout, const float *out, const float *lse, const fa_args &a, int B, unsigned sch)
{
    zt_emu::launch(dim3(B * a.NH, ntiles(a.Tq, TC_ROWS)), dim3(TC_THREADS), tc_smem_dq(a.HD),
                   [=] { tc_backward_dq_k<NF>(dout, out, lse, a); }, sch);
    zt_emu::launch(dim3(B * a.NKV, ntiles(a.Tk, TC_ROWS)), dim3(TC_THREADS), tc_smem_dkv(a.HD),
                   [=] { tc_backward_dkv_k<NF>(dout, out, lse, a); }, sch);
}
/* the fp32 kernels */
template <int NI>
static void fa_fwd_args(float *out, float *lse, const fa_args &a, int B, unsigned sch)
{
    zt_emu::launch(dim3(B * a.NH, ntiles(a.Tq, FA_TILE)), dim3(FA_WARPS * 32), fa_smem_bytes(a.HD, 3),
                   [=] { flash_forward_k<NI>(out, lse, a); }, sch);
}
template <int NI>
static void fa_bwd_args(const float *dout, const float *out, const float *lse, const fa_args &a, int B, unsigned sch)
{
    const size_t smem = fa_smem_bytes(a.HD, 4);
    zt_emu::launch(dim3(B * a.NH, ntiles(a.Tq, FA_TILE)), dim3(FA_WARPS * 32), smem,
                   [=] { flash_backward_dq_k<NI>(dout, out, lse, a); }, sch);
    zt_emu::launch(dim3(B * a.NKV, ntiles(a.Tk, FA_TILE)), dim3(FA_WARPS * 32), smem,
                   [=] { flash_backward_dkv_k<NI>(dout, out, lse, a); }, sch);
}
/* self-attention over packed qkv rows, as zt_attention_cuda.cu's fa_self */
static fa_args self_args(const float *qkv, float *dqkv, const int32_t *seg, int T, int NH, int NKV, int HD,
                         int window)
{
    const int C3 = (NH + 2 * NKV) * HD;
    const size_t ko = (size_t)NH * HD, vo = (size_t)(NH + NKV) * HD;
    return fa_args{qkv, qkv + ko, qkv + vo, dqkv, dqkv ? dqkv + ko : nullptr, dqkv ? dqkv + vo : nullptr,
                   seg, seg, C3, C3, T, T, NH, NKV, HD, 1, window, 0, kscale(HD)};
}
typedef void (*fwd_args_fn)(float *, float *, const fa_args &, int, unsigned);
typedef void (*bwd_args_fn)(const float *, const float *, const float *, const fa_args &, int, unsigned);
static const fwd_args_fn fa_fwd_args_by_ni[FA_MAX_NI] = {fa_fwd_args<1>, fa_fwd_args<2>, fa_fwd_args<3>,
                                                         fa_fwd_args<4>, fa_fwd_args<5>, fa_fwd_args<6>,
                                                         fa_fwd_args<7>, fa_fwd_args<8>};
static const bwd_args_fn fa_bwd_args_by_ni[FA_MAX_NI] = {fa_bwd_args<1>, fa_bwd_args<2>, fa_bwd_args<3>,
                                                         fa_bwd_args<4>, fa_bwd_args<5>, fa_bwd_args<6>,
                                                         fa_bwd_args<7>, fa_bwd_args<8>};
static const fwd_args_fn tc_fwd_args_by_nf[TC_MAX_NF] = {tc_fwd_args<1>, tc_fwd_args<2>, tc_fwd_args<3>,
                                                         tc_fwd_args<4>, tc_fwd_args<5>, tc_fwd_args<6>,
                                                         tc_fwd_args<7>, tc_fwd_args<8>};
static const bwd_args_fn tc_bwd_args_by_nf[TC_MAX_NF] = {tc_bwd_args<1>, tc_bwd_args<2>, tc_bwd_args<3>,
                                                         tc_bwd_args<4>, tc_bwd_args<5>, tc_bwd_args<6>,
                                                         tc_bwd_args<7>, tc_bwd_args<8>};


/* qkv row layout: row stride, and the channel offsets of query head h and of the
 * key and value of the KV head it reads */
struct layout {
    int NH, NKV, HD;
    int qs() const { return (NH + 2 * NKV) * HD; }
    int os() const { return NH * HD; }
    int q(int h) const { return h * HD; }
    int k(int h) const { return (NH + h / (NH / NKV)) * HD; }
    int v(int h) const { return (NH + NKV + h / (NH / NKV)) * HD; }
};

/* ---- the bf16-rounding reference ----------------------------------------- *
 *
 * Everything the kernels round to bf16 (q, k, v, dout, p, ds) is rounded here
 * too, and p and ds are first computed in fp32 exactly as the emulated kernels
 * compute them (dot products of bf16 values summed in index order, as the wmma
 * shim does; D summed as two interleaved halves, as the lane pairs do; the same
 * expf), so they round to the same bf16 values: a difference of one p's
 * rounding would otherwise be worth up to u |v| on its own. The sums over keys
 * and queries that the kernels accumulate in fp32 are taken in double. */

static float b16(float x) { return zt_bf16_to_f32(zt_bf16_from_f32(x)); }

/* key j visible from query t of row b: causal, inside t's window when there is one,
 * and in its segment when seg is given (a padding query's, -s: in s) */
static bool sees(const int32_t *seg, int window, int b, int T, int t, int j)
{
    return j <= t && (!window || t - j < window) &&
           (!seg || seg[(size_t)b * T + j] == std::abs(seg[(size_t)b * T + t]));
}

/* sum_i bf16(a_i) bf16(b_i) in fp32, index order (the products are exact) */
static float dot16(const float *a, const float *b, int n)
{
    float d = 0.0f;
    for (int i = 0; i < n; i++) d += b16(a[i]) * b16(b[i]);
    return d;
}

/* out, lse with p rounded relative to the running max of each 64-key tile, as
 * the tensor-core forward does */
static void ref_forward_bf16(std::vector<double> &out, std::vector<double> &lse,
                             const std::vector<float> &qkv, const int32_t *seg, int window, int B, int T,
                             const layout &L)
{
    const int NH = L.NH, hs = L.HD, C3 = L.qs(), C = L.os();
    const float sc = kscale(hs);
    out.assign((size_t)B * T * C, 0.0);
    lse.assign((size_t)B * NH * T, 0.0);
    std::vector<double> acc(hs);
    std::vector<float> s(TC_ROWS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = &qkv[((size_t)b * T + t) * C3 + L.q(h)];
                float m = -INFINITY;
                double l = 0.0;
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int k0 = 0; k0 <= t; k0 += TC_ROWS) {
                    const int n = std::min(TC_ROWS, t + 1 - k0);
                    float mx = -INFINITY;
                    for (int jj = 0; jj < n; jj++) {
                        s[jj] = dot16(q, &qkv[((size_t)b * T + k0 + jj) * C3 + L.k(h)], hs) * sc;
                        if (!sees(seg, window, b, T, t, k0 + jj)) s[jj] = -INFINITY;
                        mx = std::max(mx, s[jj]);
                    }
                    const float mnew = std::max(m, mx), corr = m == -INFINITY ? 0.0f : expf(m - mnew);
                    double sum = 0.0;
                    for (int i = 0; i < hs; i++) acc[i] *= corr;
                    for (int jj = 0; jj < n; jj++) {
                        if (s[jj] == -INFINITY) continue; /* another segment's key, or out of the window */
                        const float p = expf(s[jj] - mnew);
                        const float *v = &qkv[((size_t)b * T + k0 + jj) * C3 + L.v(h)];
                        sum += p;
                        for (int i = 0; i < hs; i++) acc[i] += (double)b16(p) * b16(v[i]);
                    }
                    l = l * corr + sum;
                    m = mnew;
                }
                for (int i = 0; i < hs; i++) out[((size_t)b * T + t) * C + h * hs + i] = acc[i] / l;
                lse[((size_t)b * NH + h) * T + t] = m + log(l);
            }
}

/* dqkv += with p = exp(s - lse) and ds = p (dp - D) rounded as the tensor-core
 * backward rounds them */
static void ref_backward_bf16(std::vector<double> &dqkv, const std::vector<float> &dout,
                              const std::vector<float> &qkv, const std::vector<float> &out,
                              const std::vector<float> &lse, const int32_t *seg, int window, int B, int T,
                              const layout &lay)
{
    const int NH = lay.NH, hs = lay.HD, C3 = lay.qs(), C = lay.os();
    const float sc = kscale(hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const size_t qt = ((size_t)b * T + t) * C3 + lay.q(h), ot = ((size_t)b * T + t) * C + h * hs;
                float De = 0.0f, Do = 0.0f;
                for (int i = 0; i < hs; i += 2) De += dout[ot + i] * out[ot + i];
                for (int i = 1; i < hs; i += 2) Do += dout[ot + i] * out[ot + i];
                const float D = De + Do, L = lse[((size_t)b * NH + h) * T + t];
                for (int j = 0; j <= t; j++) {
                    if (!sees(seg, window, b, T, t, j)) continue;
                    const size_t kj = ((size_t)b * T + j) * C3 + lay.k(h), vj = ((size_t)b * T + j) * C3 + lay.v(h);
                    const float p = expf(dot16(&qkv[qt], &qkv[kj], hs) * sc - L);
                    const float ds = p * (dot16(&dout[ot], &qkv[vj], hs) - D);
                    const double pb = b16(p), dsb = b16(ds);
                    for (int i = 0; i < hs; i++) {
                        dqkv[qt + i] += sc * dsb * b16(qkv[kj + i]);
                        dqkv[kj + i] += sc * dsb * b16(qkv[qt + i]);
                        dqkv[vj + i] += pb * b16(dout[ot + i]);
                    }
                }
            }
}

/* every launch under these (cuda_emul.h): warps in turn both ways, and interleaved */
static const unsigned schedules[] = {zt_emu::ASCENDING, zt_emu::DESCENDING, zt_emu::RANDOM + 1};
#define NSCHED 3

/* ---- one shape --------------------------------------------------------------- */

/* a key that the segments alone would let some query see is outside its window */
static bool window_masks(const int32_t *seg, int window, int B, int T)
{
    for (int b = 0; b < B; b++)
        for (int t = window; t < T; t++)
            if (window && sees(seg, 0, b, T, t, t - window)) return true;
    return false;
}

/* seg_len > 0: packed rows, segments of seg_len - b tokens (row b), so they start
 * inside tiles and some tiles hold keys of no query's segment; 0: plain causal;
 * seg_len < 0: padded rows (segment -1 after a sample of T + seg_len - 7 b tokens).
 * window > 0: a sliding window (key tiles before it skipped, fragments masked);
 * window >= T must also give the kernels' bits of window 0. */
static void attention_case(bool tc, int B, int T, int NH, int NKV, int hs, int seg_len = 0, int window = 0)
{
    const layout L = {NH, NKV, hs};
    const int C = L.os();
    char kind[48], win[16] = "";
    if (window) snprintf(win, sizeof win, " win%d", window);
    snprintf(kind, sizeof kind, "%s NH%d/%d%s%s", tc ? "bf16 tc" : "fp32", NH, NKV,
             seg_len > 0 ? " packed" : seg_len ? " padded" : "", win);
    std::vector<int32_t> segv((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            segv[(size_t)b * T + t] = seg_len > 0 ? 1 + t / std::max(1, seg_len - b) : t < T + seg_len - 7 * b ? 1 : -1;
    const int32_t *seg = seg_len ? segv.data() : nullptr;
    const double bo = tc ? TC_BOUND_FP32 : 2e-5, bb = tc ? TC_BOUND_FP32 : 5e-5;
    const fwd_args_fn fwd = tc ? tc_fwd_args_by_nf[hs / 16 - 1] : fa_fwd_args_by_ni[(hs - 1) / 32];
    const bwd_args_fn bwd = tc ? tc_bwd_args_by_nf[hs / 16 - 1] : fa_bwd_args_by_ni[(hs - 1) / 32];

    std::vector<float> qkv = rand_vec((size_t)B * T * L.qs(), -2, 2);
    std::vector<float> out((size_t)B * T * C), lse((size_t)B * NH * T);
    zt_backend_cpu.attention_forward(out.data(), lse.data(), qkv.data(), seg, B, T, NH, NKV, hs, window);
    std::vector<float> eout[NSCHED], else_[NSCHED];
    for (int k = 0; k < NSCHED; k++) {
        eout[k].assign(out.size(), NAN);
        else_[k].assign(lse.size(), NAN);
        fwd(eout[k].data(), else_[k].data(), self_args(qkv.data(), nullptr, seg, T, NH, NKV, hs, window), B,
            schedules[k]);
    }
    row(rel_err(eout[0], out), bo, "%s fwd out T%d hs%d", kind, T, hs);
    row(rel_err(else_[0], lse), bo, "%s fwd lse T%d hs%d", kind, T, hs);
    if (window_masks(seg, window, B, T)) {
        /* the comparisons above are of a window: the unwindowed attention is far off */
        std::vector<float> out0(out.size()), lse0(lse.size());
        zt_backend_cpu.attention_forward(out0.data(), lse0.data(), qkv.data(), seg, B, T, NH, NKV, hs, 0);
        const double e0 = rel_err(eout[0], out0);
        row(e0 > 1e-3 ? 0.0 : INFINITY, 0.0, "%s fwd T%d differs from no window (%.1e)", kind, T, e0);
    }
    if (tc) {
        std::vector<double> rout, rlse;
        ref_forward_bf16(rout, rlse, qkv, seg, window, B, T, L);
        row(rel_err(eout[0], rout), TC_BOUND_BF16REF, "%s fwd out T%d hs%d vs bf16 ref", kind, T,
            hs);
        row(rel_err(else_[0], rlse), TC_BOUND_BF16REF, "%s fwd lse T%d hs%d vs bf16 ref", kind, T, hs);
    }
    bool same = true;
    for (int k = 1; k < NSCHED; k++) same &= same_bits(eout[0], eout[k]) && same_bits(else_[0], else_[k]);
    row(same ? 0.0 : INFINITY, 0.0, "%s fwd T%d hs%d schedules bitwise", kind, T, hs);

    std::vector<float> dout = rand_vec((size_t)B * T * C, -1, 1);
    std::vector<float> dqkv0 = rand_vec(qkv.size(), -1, 1), dqkv = dqkv0, edq[NSCHED];
    zt_backend_cpu.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                      seg, B, T, NH, NKV, hs, window);
    for (int k = 0; k < NSCHED; k++) {
        edq[k] = dqkv0;
        bwd(dout.data(), out.data(), lse.data(), self_args(qkv.data(), edq[k].data(), seg, T, NH, NKV, hs, window),
            B, schedules[k]);
    }
    row(rel_err(edq[0], dqkv), bb, "%s bwd dqkv += T%d hs%d", kind, T, hs);
    if (tc) {
        std::vector<double> rdq(dqkv0.begin(), dqkv0.end());
        ref_backward_bf16(rdq, dout, qkv, out, lse, seg, window, B, T, L);
        row(rel_err(edq[0], rdq), TC_BOUND_BF16REF, "%s bwd dqkv += T%d hs%d vs bf16 ref", kind, T, hs);
    }
    same = true;
    for (int k = 1; k < NSCHED; k++) same &= same_bits(edq[0], edq[k]);
    row(same ? 0.0 : INFINITY, 0.0, "%s bwd T%d hs%d schedules bitwise", kind, T, hs);
    if (window >= T) {
        /* a window over the whole sequence is none: the same tiles, the same bits */
        std::vector<float> nout(out.size(), NAN), nlse(lse.size(), NAN), ndq = dqkv0;
        fwd(nout.data(), nlse.data(), self_args(qkv.data(), nullptr, seg, T, NH, NKV, hs, 0), B, schedules[0]);
        bwd(dout.data(), out.data(), lse.data(), self_args(qkv.data(), ndq.data(), seg, T, NH, NKV, hs, 0), B,
            schedules[0]);
        same = same_bits(nout, eout[0]) && same_bits(nlse, else_[0]) && same_bits(ndq, edq[0]);
        row(same ? 0.0 : INFINITY, 0.0, "%s T%d fwd, bwd bits of window 0", kind, T);
    }
}

/* log-sum-exps: the rows that saw no key (-inf) the same, and the rest's normwise error */
static double lse_err(const std::vector<float> &got, const std::vector<float> &ref)
{
    std::vector<float> g = got, r = ref;
    for (size_t i = 0; i < g.size(); i++) {
        if ((g[i] == -INFINITY) != (r[i] == -INFINITY)) return INFINITY;
        if (r[i] == -INFINITY) g[i] = r[i] = 0.0f;
    }
    return rel_err(g, r);
}

/* Ring attention's pieces (sequence parallelism): a block of Tq queries against a
 * block of Tk keys, q and k|v in rows of their own (odd) strides, as zt_model.c's ring
 * passes them; causal (the diagonal pair, Tq = Tk) or every key seen. seg_len > 0:
 * the queries' segments are the keys' shifted by `shift` positions, so some query rows
 * see no key of the block (out 0, lse -inf). window > 0: a sliding window, the queries
 * delta positions after the keys (an earlier key block: rows whose window ends before
 * the block's keys see none of them). The backward gets the CPU's out and lse on both
 * sides (the FINAL ones, in a ring run). */
static void block_case(bool tc, int B, int Tq, int Tk, int NH, int NKV, int hs, int causal, int seg_len = 0,
                       int shift = 0, int window = 0, int delta = 0)
{
    /* odd strides for fp32; the tensor cores' rows keep 32-byte multiples (their 16-byte
     * loads in the kernel are elementwise, but keep it as the model's rows are) */
    const int qs = NH * hs + (tc ? 8 : 7), ks = 2 * NKV * hs + (tc ? 8 : 3), C = NH * hs;
    const double bo = tc ? TC_BOUND_FP32 : 2e-5, bb = tc ? TC_BOUND_FP32 : 5e-5;
    const fwd_args_fn fwd = tc ? tc_fwd_args_by_nf[hs / 16 - 1] : fa_fwd_args_by_ni[(hs - 1) / 32];
    const bwd_args_fn bwd = tc ? tc_bwd_args_by_nf[hs / 16 - 1] : fa_bwd_args_by_ni[(hs - 1) / 32];
    char kind[64], win[24] = "";
    if (window) snprintf(win, sizeof win, " win%d+%d", window, delta);
    snprintf(kind, sizeof kind, "%s block %s NH%d/%d%s%s", tc ? "bf16 tc" : "fp32", causal ? "causal" : "full", NH,
             NKV, seg_len ? " packed" : "", win);
    std::vector<int32_t> qsegv((size_t)B * Tq), ksegv((size_t)B * Tk);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Tq; t++) qsegv[(size_t)b * Tq + t] = seg_len ? 1 + (t + shift) / seg_len : 0;
        for (int j = 0; j < Tk; j++) ksegv[(size_t)b * Tk + j] = seg_len ? 1 + j / seg_len : 0;
    }
    const int32_t *qseg = seg_len ? qsegv.data() : nullptr, *kseg = seg_len ? ksegv.data() : nullptr;
    std::vector<float> q = rand_vec((size_t)B * Tq * qs, -2, 2), kv = rand_vec((size_t)B * Tk * ks, -2, 2);
    const float *k = kv.data(), *v = kv.data() + (size_t)NKV * hs;
    std::vector<float> out((size_t)B * Tq * C), lse((size_t)B * NH * Tq);
    zt_backend_cpu.attention_block_forward(out.data(), lse.data(), q.data(), qs, k, v, ks, qseg, kseg, B, Tq, Tk, NH,
                                           NKV, hs, causal, window, delta);
    int none = 0;
    for (float x : lse) none += x == -INFINITY;
    const fa_args a0 = {q.data(), k, v, nullptr, nullptr, nullptr, qseg, kseg, qs, ks, Tq, Tk, NH, NKV, hs, causal,
                        window, delta, kscale(hs)};
    std::vector<float> eout[NSCHED], elses[NSCHED];
    for (int s = 0; s < NSCHED; s++) {
        eout[s].assign(out.size(), NAN);
        elses[s].assign(lse.size(), NAN);
        fwd(eout[s].data(), elses[s].data(), a0, B, schedules[s]);
    }
    const double eo = rel_err(eout[0], out);
    row(eo, bo, "%s fwd out %dx%d hs%d", kind, Tq, Tk, hs);
    row(lse_err(elses[0], lse), bo, "%s fwd lse %dx%d hs%d (%d rows no key)", kind, Tq, Tk, hs, none);
    /* the bf16 products really ran (their rounding shows), or the fp32 kernels did */
    if (tc && none < (int)lse.size())
        row(eo > 1e-4 ? 0.0 : INFINITY, 0.0, "%s fwd %dx%d bf16 rounding seen (%.1e > 1e-4)", kind, Tq, Tk, eo);
    bool same = true;
    for (int s = 1; s < NSCHED; s++) same &= same_bits(eout[0], eout[s]) && same_bits(elses[0], elses[s]);
    row(same ? 0.0 : INFINITY, 0.0, "%s fwd %dx%d schedules bitwise", kind, Tq, Tk);

    std::vector<float> dout = rand_vec(out.size(), -1, 1);
    const std::vector<float> dq0 = rand_vec(q.size(), -1, 1), dkv0 = rand_vec(kv.size(), -1, 1);
    std::vector<float> dq = dq0, dkv = dkv0, edq[NSCHED], edkv[NSCHED];
    zt_backend_cpu.attention_block_backward(dq.data(), dkv.data(), dkv.data() + (size_t)NKV * hs, dout.data(),
                                            q.data(), qs, k, v, ks, qseg, kseg, out.data(), lse.data(), B, Tq, Tk,
                                            NH, NKV, hs, causal, window, delta);
    for (int s = 0; s < NSCHED; s++) {
        edq[s] = dq0;
        edkv[s] = dkv0;
        fa_args a = a0;
        a.dq = edq[s].data(), a.dk = edkv[s].data(), a.dv = edkv[s].data() + (size_t)NKV * hs;
        bwd(dout.data(), out.data(), lse.data(), a, B, schedules[s]);
    }
    row(rel_err(edq[0], dq), bb, "%s bwd dq += %dx%d hs%d", kind, Tq, Tk, hs);
    row(rel_err(edkv[0], dkv), bb, "%s bwd dk|dv += %dx%d hs%d", kind, Tq, Tk, hs);
    /* the comparisons above are of something: the backward moved both (the initial
     * values alone would compare equal), or nothing where no row sees a key */
    if (none < (int)lse.size())
        row(rel_err(dq, dq0) > 1e-3 && rel_err(dkv, dkv0) > 1e-3 ? 0.0 : INFINITY, 0.0,
            "%s bwd %dx%d changes dq, dk|dv", kind, Tq, Tk);
    else
        row(same_bits(edq[0], dq0) && same_bits(edkv[0], dkv0) ? 0.0 : INFINITY, 0.0, "%s bwd %dx%d leaves dq, dk|dv",
            kind, Tq, Tk);
    same = true;
    for (int s = 1; s < NSCHED; s++) same &= same_bits(edq[0], edq[s]) && same_bits(edkv[0], edkv[s]);
    row(same ? 0.0 : INFINITY, 0.0, "%s bwd %dx%d schedules bitwise", kind, Tq, Tk);
}

/* the merge of two blocks' results, rows of either or both without keys (-inf) among them */
static void merge_case(int B, int T, int NH, int hs)
{
    const size_t no = (size_t)B * T * NH * hs, nl = (size_t)B * NH * T;
    std::vector<float> out = rand_vec(no, -1, 1), out2 = rand_vec(no, -1, 1);
    std::vector<float> lse = rand_vec(nl, -3, 3), lse2 = rand_vec(nl, -3, 3);
    for (size_t i = 0; i < nl; i += 5) lse[i] = -INFINITY;
    for (size_t i = 0; i < nl; i += 7) lse2[i] = -INFINITY;
    std::vector<float> ref = out, rlse = lse, got = out, glse = lse;
    zt_backend_cpu.attention_merge(ref.data(), rlse.data(), out2.data(), lse2.data(), B, T, NH, hs);
    const float *o2 = out2.data(), *l2 = lse2.data();
    float *go = got.data(), *gl = glse.data();
    zt_emu::launch(dim3(ntiles((int)nl, 64)), dim3(64), 0, [=] { attention_merge_k(go, gl, o2, l2, B, T, NH, hs); },
                   zt_emu::ASCENDING);
    row(rel_err(got, ref), 1e-6, "merge out T%d NH%d hs%d", T, NH, hs);
    row(lse_err(glse, rlse), 1e-6, "merge lse T%d NH%d hs%d", T, NH, hs);
}

int main(void)
{
    const auto t0 = std::chrono::steady_clock::now();
    zt_cpu_set_threads(1);
    printf("CUDA attention kernels (host emulation) vs CPU backend\n");
    printf("  %-44s %12s %10s  %s\n", "kernel / output", "rel.err", "bound", "verdict");
    /* tensor cores: T = 1 (one key), 17 (inside one tile), 64 (exactly one),
     * 100, 131 and 257 (tiles cut by T), 70 with hs = 48 (NF = 3); hs 16..128 */
    attention_case(true, 2, 1, 2, 2, 64);
    attention_case(true, 2, 17, 2, 2, 16);
    attention_case(true, 1, 64, 2, 2, 32);
    attention_case(true, 2, 100, 2, 2, 64);
    attention_case(true, 1, 131, 2, 2, 128);
    attention_case(true, 1, 70, 3, 3, 48);
    attention_case(true, 1, 257, 1, 1, 64);  /* five tiles, the last with one row */
    /* grouped-query: 4 query heads on 2 KV heads, on 1 (multi-query) */
    attention_case(true, 2, 70, 4, 2, 32);
    attention_case(true, 1, 100, 4, 1, 16);
    /* fp32 (the kernels of precision highest/high): hs 20 (idle lanes), 64, 128 */
    attention_case(false, 1, 17, 2, 2, 20);
    attention_case(false, 1, 45, 2, 2, 64);
    attention_case(false, 1, 40, 2, 2, 128);
    /* fp32 grouped-query, head sizes unrelated to 32: 12 (NKV 2), 40 (NKV 1), 256 */
    attention_case(false, 2, 37, 4, 2, 12);
    attention_case(false, 1, 70, 6, 1, 40);
    attention_case(false, 1, 33, 4, 2, 256);
    /* packed rows (neat packing): segments of 23 and 22 tokens cut the 64-row tc
     * tiles and the 32-row fp32 tiles; 5-token segments leave whole tiles of keys
     * no query of a tile can see; grouped-query with both */
    attention_case(true, 2, 100, 2, 2, 64, 23);
    attention_case(true, 1, 131, 4, 2, 32, 5);
    attention_case(false, 2, 70, 4, 2, 12, 23);
    attention_case(false, 1, 45, 2, 2, 64, 5);
    /* padded rows (LLaMA-Factory's DPO batches: the padding sees the sample, no query the
     * padding), the padding starting inside a tile */
    attention_case(true, 2, 100, 2, 2, 64, -27);
    attention_case(false, 2, 70, 4, 2, 12, -23);
    /* sliding windows (Mistral, Gemma's local layers). Windows 2 mod 16 (the
     * fragment) and mod 64 (the tile) put the first row's first key at the end of
     * the previous fragment or tile, and the last query of a key tile's last key at
     * the start of the next tile: the edges of the skipped ranges. Tensor cores: 2
     * (inside one 16-key fragment: whole fragments and tiles skipped), 40 (fragments
     * cut inside a 64-key tile), 66 over several tiles with grouped-query heads,
     * packed rows whose segments the window cuts; window T and above: no window */
    attention_case(true, 1, 131, 2, 2, 32, 0, 2);
    attention_case(true, 1, 131, 2, 1, 16, 0, 40);
    attention_case(true, 1, 200, 4, 2, 16, 0, 66);
    attention_case(true, 2, 100, 2, 1, 32, 23, 17);
    attention_case(true, 1, 100, 2, 2, 64, 0, 100);
    attention_case(true, 1, 70, 4, 2, 48, 9, 1000);
    /* fp32 (32-row tiles): window 1 (only the key itself), 2, 34 across tiles
     * (grouped-query), packed rows, window T */
    attention_case(false, 1, 37, 2, 2, 20, 0, 1);
    attention_case(false, 1, 70, 2, 2, 20, 0, 2);
    attention_case(false, 1, 100, 2, 1, 12, 0, 34);
    attention_case(false, 1, 70, 4, 2, 12, 23, 10);
    attention_case(false, 1, 100, 2, 1, 40, 50, 33);
    attention_case(false, 1, 45, 2, 2, 64, 0, 45);
    /* ring attention's blocks (fp32 under every precision): a causal diagonal pair; full
     * pairs with Tq != Tk (tiles cut differently on each side), grouped-query, hs 12 / 64 /
     * 20; packed rows whose query segments are shifted against the keys', so some rows
     * see no key of the block */
    block_case(false, 1, 40, 40, 2, 2, 64, 1);
    block_case(false, 1, 37, 45, 4, 2, 12, 0);
    block_case(false, 1, 70, 33, 3, 1, 20, 0);
    block_case(false, 1, 40, 40, 4, 2, 12, 1, 9);
    block_case(false, 1, 45, 38, 2, 1, 64, 0, 10, 25);
    /* the same with the tensor cores (precision medium): 64-row tiles cut by Tq and Tk on
     * both sides (70 x 100, 100 x 70), a causal pair over two tiles, packed rows with
     * rows that see no key */
    block_case(true, 1, 70, 100, 4, 2, 32, 0);
    block_case(true, 1, 100, 70, 2, 1, 64, 0);
    block_case(true, 1, 80, 80, 2, 2, 16, 1, 23);
    block_case(true, 1, 100, 45, 2, 1, 32, 0, 10, 25);
    /* sliding windows on ring blocks: a causal diagonal pair (delta 0, windows 2 mod 16
     * and 64 at the skipped ranges' edges), earlier key blocks (delta > 0) whose window
     * ends inside the block, so the later rows see no key of it, packed rows, and a
     * block whose window ends before all its keys (every row empty, the backward a no-op) */
    block_case(false, 1, 40, 40, 2, 2, 64, 1, 0, 0, 2);
    block_case(false, 1, 70, 45, 4, 2, 12, 0, 0, 0, 50, 40);
    block_case(false, 1, 40, 40, 2, 1, 20, 0, 9, 3, 60, 40);
    block_case(false, 1, 37, 45, 2, 1, 12, 0, 0, 0, 10, 60);
    block_case(true, 1, 80, 80, 2, 2, 16, 1, 0, 0, 34);
    block_case(true, 1, 100, 70, 2, 1, 64, 0, 0, 0, 90, 70);
    block_case(true, 1, 100, 80, 2, 1, 32, 0, 10, 25, 66, 80);
    block_case(true, 1, 70, 64, 2, 1, 16, 0, 0, 0, 40, 130);
    /* generation's KV cache: one query against every cached key */
    block_case(false, 1, 1, 45, 4, 2, 12, 0);
    block_case(true, 1, 1, 70, 2, 1, 64, 0);
    merge_case(2, 13, 3, 20);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%d comparisons, %d failed (%.1f s, %lu coroutine switches)\n", n_rows, n_bad, secs,
           zt_emu::g.switches);
    return n_bad ? 1 : 0;
}
