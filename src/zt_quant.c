/* zt_quant.c — bitsandbytes' NF4 / FP4 formats: quantize, double-quantize, dequantize, and the
 * serialised quant_state. The rules and why each is shaped as it is are in zt_quant.h; here every
 * float operation is written in the order and precision bitsandbytes (and torch under it) performs
 * it, because the point is bit-identity, not merely accuracy. */
#include "zt_quant.h"

#include "zt_bf16.h"
#include "zt_common.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

/* bitsandbytes' get_4bit_type("nf4"): quantiles of N(0, 1), index order is value order. */
static const float nf4_code[16] = {
    -0x1p+0f, -0x1.647362p-1f, -0x1.0cd66p-1f, -0x1.94654p-2f,
    -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0.0f,
    0x1.45f5fep-4f, 0x1.4995c6p-3f, 0x1.f809bap-3f, 0x1.5a0674p-2f,
    0x1.c3497p-2f, 0x1.200f56p-1f, 0x1.722766p-1f, 0x1p+0f,
};
/* get_4bit_type("fp4"): 1 sign, 2 exponent, 1 mantissa bit, divided by its max (12). Index 8
 * ("-0" in bitsandbytes' source, a Python int) is +0.0 like index 0. */
static const float fp4_code[16] = {
    0.0f, 0x1.555556p-8f, 0x1.555556p-1f, 0x1p+0f,
    0x1.555556p-2f, 0x1p-1f, 0x1.555556p-3f, 0x1p-2f,
    0.0f, -0x1.555556p-8f, -0x1.555556p-1f, -0x1p+0f,
    -0x1.555556p-2f, -0x1p-1f, -0x1.555556p-3f, -0x1p-2f,
};
/* The indices in ascending value order, as bitsandbytes sorts them (torch.argsort) before taking
 * midpoints. The two zeros keep the order 0 before 8: a value in (0, first positive midpoint]
 * gets index 8, a value in (last negative midpoint, 0] index 0. Both dequantize to +0. */
static const uint8_t nf4_order[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint8_t fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

/* create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), sorted. */
static const float dynamic_map[256] = {
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f, -0x1.d86666p-1f,
    -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f,
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f,
    -0x1.7accccp-1f, -0x1.73999ap-1f, -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f,
    -0x1.4f999ap-1f, -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f,
    -0x1.246668p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f,
    -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f, -0x1.b8ccccp-2f, -0x1.aa6666p-2f,
    -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f,
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f,
    -0x1.de6666p-3f, -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f, -0x1.8851eep-4f,
    -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f,
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f,
    -0x1.e51ebap-5f, -0x1.ce147ap-5f, -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f,
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f, -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f,
    -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f,
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f, -0x1.e978d4p-8f, -0x1.c49ba6p-8f,
    -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
    -0x1.78d5p-11f, -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
    -0x1.27476ep-21f, 0.0f, 0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f, 0x1.19ce0ap-12f, 0x1.8fc506p-12f,
    0x1.02de02p-11f, 0x1.3dd982p-11f, 0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f,
    0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f, 0x1.d1eb86p-7f, 0x1.170a3ep-6f,
    0x1.451ebap-6f, 0x1.733334p-6f, 0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f,
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f,
    0x1.b70a3ep-5f, 0x1.ce147ap-5f, 0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, 0x1.4eb854p-4f, 0x1.5a3d7p-4f,
    0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f, 0x1.6b3334p-3f, 0x1.88p-3f,
    0x1.a4ccccp-3f, 0x1.c1999ap-3f, 0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626666p-2f, 0x1.70ccccp-2f,
    0x1.7f3334p-2f, 0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f,
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f, 0x1.079998p-1f, 0x1.0eccccp-1f,
    0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f,
    0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f, 0x1.5ep-1f, 0x1.653334p-1f,
    0x1.6c6668p-1f, 0x1.73999ap-1f, 0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f, 0x1.bb999ap-1f,
    0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f,
    0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f,
};

const char *zt_quant_type_name(zt_quant_type_t t) { return t == ZT_QUANT_FP4 ? "fp4" : "nf4"; }
const float *zt_quant_code(zt_quant_type_t t) { return t == ZT_QUANT_FP4 ? fp4_code : nf4_code; }
const float *zt_quant_dynamic_map(void) { return dynamic_map; }

int zt_quant_blocksize_ok(int64_t blocksize)
{
    return blocksize >= 32 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0;
}

/* ---- 4-bit quantization -------------------------------------------------------------------- */

/* The 15 float32 midpoints between value-sorted neighbours, (a + b) / 2 as torch computes them. */
typedef struct { float bound[15]; const uint8_t *order; } nibble_rule_t;

static nibble_rule_t nibble_rule(zt_quant_type_t t)
{
    nibble_rule_t r;
    const float *c = zt_quant_code(t);
    r.order = t == ZT_QUANT_FP4 ? fp4_order : nf4_order;
    for (int i = 0; i < 15; i++) r.bound[i] = (c[r.order[i]] + c[r.order[i + 1]]) / 2.0f;
    return r;
}

/* torch.bucketize(v, bounds, right=False): the number of bounds strictly below v, so a value equal
 * to a midpoint takes the lower code. Fifteen compares, no branch: the loop vectorises. */
static inline uint8_t nibble_of(const nibble_rule_t *r, float v)
{
    int q = 0;
    for (int i = 0; i < 15; i++) q += r->bound[i] < v;
    return r->order[q];
}

static inline float clamp1(float v) { return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v; }

int zt_quant4_quantize(const char *name, zt_quant_type_t t, const float *x, int64_t n, int64_t blocksize,
                       uint8_t *packed, float *absmax, char *err, size_t errlen)
{
    if (!zt_quant_blocksize_ok(blocksize))
        return zt_err(err, errlen, "%s: 4-bit block size %" PRId64 " is not one bitsandbytes accepts (32, 64, ..., 4096)",
                      name, blocksize);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return zt_err(err, errlen, "%s: element %" PRId64 " is %s: 4-bit quantization needs finite weights", name,
                          i, isnan(x[i]) ? "nan" : "inf");
    const nibble_rule_t r = nibble_rule(t);
    const int64_t nblocks = ZT_CEIL_DIV(n, blocksize);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) { /* blocks are independent */
        const int64_t start = b * blocksize, len = ZT_MIN(blocksize, n - start);
        const float *xb = x + start;
        uint8_t idx[4096 + 1];
        float m = 0.0f;
        for (int64_t i = 0; i < len; i++) m = fmaxf(m, fabsf(xb[i]));
        if (len == blocksize) {
            /* full block: A * (1.0 / absmax.clamp(min=1e-38)), absmax stored as found */
            absmax[b] = m;
            const float inv = 1.0f / fmaxf(m, 1e-38f);
            for (int64_t i = 0; i < len; i++) idx[i] = nibble_of(&r, clamp1(xb[i] * inv));
        } else {
            /* the tensor's last partial block: A / am, am = absmax.clamp(min=1e-38), stored clamped */
            const float am = fmaxf(m, 1e-38f);
            absmax[b] = am;
            for (int64_t i = 0; i < len; i++) idx[i] = nibble_of(&r, clamp1(xb[i] / am));
        }
        if (len & 1) idx[len] = nibble_of(&r, 0.0f); /* odd total: bitsandbytes pads with a scaled 0 */
        for (int64_t i = 0; i < len; i += 2) packed[(start + i) / 2] = (uint8_t)(idx[i] << 4 | idx[i + 1]);
    }
    return 0;
}

/* ---- torch.mean of float32 ------------------------------------------------------------------ */

/* torch's CPU sum (aten/src/ATen/native/cpu/SumKernel.cpp, cascade_sum) of a contiguous float row,
 * single-threaded: vectors of VL lanes, four vector rows summed side by side (ILP), each through a
 * four-level cascade whose level width grows with the length; then the leftover vectors, the
 * leftover scalars, and the lanes in order. VL = 8: torch's sum kernel runs on 8-lane vectors even on
 * an AVX-512 CPU (found against torch.mean on one, tests/reference/quant/bnb4.h5). */
#define VL 8
#define ILP 4
#define LEVELS 4

static int64_t ceil_log2(int64_t x)
{
    if (x <= 2) return 1;
    int64_t v = x - 1, b = 0;
    while (v >>= 1) b++;
    return b + 1;
}

/* multi_row_sum: `size` rows of ILP items of `w` floats each (w = VL for vectors, 1 for scalars). */
static void multi_row_sum(const float *in, int64_t size, int w, float out[ILP][VL])
{
    const int64_t power = ZT_MAX((int64_t)4, ceil_log2(size) / LEVELS);
    const int64_t step = (int64_t)1 << power, mask = step - 1;
    float acc[LEVELS][ILP][VL];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    for (; i + step <= size;) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < w; l++) acc[0][k][l] += in[(i * ILP + k) * w + l];
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < w; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += in[(i * ILP + k) * w + l];
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < w; l++) acc[0][k][l] += acc[j][k][l];
    memcpy(out, acc[0], sizeof(float) * ILP * VL);
}

/* row_sum: `size` items of w floats; the sum lands in out[0..w). */
static void row_sum(const float *in, int64_t size, int w, float out[VL])
{
    float part[ILP][VL];
    const int64_t size_ilp = size / ILP;
    multi_row_sum(in, size_ilp, w, part);
    for (int64_t i = size_ilp * ILP; i < size; i++)
        for (int l = 0; l < w; l++) part[0][l] += in[i * w + l];
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < w; l++) part[0][l] += part[k][l];
    memcpy(out, part[0], sizeof(float) * VL);
}

/* One call of torch's reduction loop over a contiguous range: 0 + its cascade sum (the output
 * starts at 0 and the loop adds into it). */
static float torch_sum(const float *x, int64_t n)
{
    float s[VL], total = 0.0f;
    if (n >= VL) { /* vectorized_inner_sum */
        const int64_t nvec = n / VL;
        row_sum(x, nvec, VL, s);
        for (int64_t k = nvec * VL; k < n; k++) total += x[k];
        for (int l = 0; l < VL; l++) total += s[l];
    } else { /* scalar_inner_sum */
        row_sum(x, n, 1, s);
        total = s[0];
    }
    return 0.0f + total;
}

#define TORCH_GRAIN 32768 /* at::internal::GRAIN_SIZE */
#define TORCH_MAX_THREADS 1024

float zt_quant_mean(const float *x, int64_t n, int torch_threads)
{
    float s;
    if (n < TORCH_GRAIN || torch_threads <= 1) {
        s = torch_sum(x, n);
    } else {
        /* TensorIterator's two-pass reduction: at::parallel_for hands thread t the t-th chunk of
         * ceil(n / threads) values (threads capped at ceil(n / grain)), each sums its chunk into its
         * own slot of a zeroed buffer of torch_threads floats, and the buffer is summed the same way. */
        float buf[TORCH_MAX_THREADS] = {0};
        const int64_t T = ZT_MIN(torch_threads, TORCH_MAX_THREADS);
        const int64_t used = ZT_MIN(T, ZT_CEIL_DIV(n, TORCH_GRAIN)), chunk = ZT_CEIL_DIV(n, used);
        for (int64_t t = 0; t < used && t * chunk < n; t++) buf[t] = torch_sum(x + t * chunk, ZT_MIN(chunk, n - t * chunk));
        s = torch_sum(buf, T);
    }
    return s / (float)n;
}

/* ---- 8-bit blockwise (the nested absmax) ----------------------------------------------------- */

/* bitsandbytes' CPU quantize_blockwise: a normalised value goes to a point of a 65536-step grid
 * over [-1, 1] (its compiled kernel fuses the last multiply-add, hence fmaf), and the grid point
 * to the first dynamic-map entry whose midpoint with the next is not below it. */
static inline uint8_t dynamic_index(const float mid[255], float v)
{
    const float t = (clamp1(v) + 1.0f) * 0.5f;
    const uint16_t g = (uint16_t)(int32_t)fmaf(t, 65535.0f, 0.5f);
    const float gv = -1.0f + (2.0f * (float)g) / 65535.0f;
    int lo = 0, hi = 255; /* count of midpoints < gv, midpoints ascending */
    while (lo < hi) {
        const int m = (lo + hi) / 2;
        if (mid[m] < gv) lo = m + 1;
        else hi = m;
    }
    return (uint8_t)lo;
}

void zt_quant8_quantize(const float *x, int64_t n, int64_t blocksize, uint8_t *codes, float *absmax)
{
    float mid[255];
    for (int i = 0; i < 255; i++) mid[i] = 0.5f * (dynamic_map[i] + dynamic_map[i + 1]);
    for (int64_t start = 0; start < n; start += blocksize) {
        const int64_t len = ZT_MIN(blocksize, n - start);
        float m = 0.0f;
        for (int64_t i = 0; i < len; i++) m = fmaxf(m, fabsf(x[start + i]));
        absmax[start / blocksize] = m;
        if (m == 0.0f) {
            memset(codes + start, 0, (size_t)len);
            continue;
        }
        const float inv = 1.0f / m;
        for (int64_t i = 0; i < len; i++) codes[start + i] = dynamic_index(mid, x[start + i] * inv);
    }
}

void zt_quant4_double_quant(const float *absmax, int64_t nblocks, int torch_threads, uint8_t *codes,
                            float *nested_absmax, float *offset)
{
    const float off = zt_quant_mean(absmax, nblocks, torch_threads);
    float centred[ZT_QUANT_NESTED_BLOCKSIZE];
    for (int64_t b0 = 0; b0 < nblocks; b0 += ZT_QUANT_NESTED_BLOCKSIZE) {
        const int64_t len = ZT_MIN((int64_t)ZT_QUANT_NESTED_BLOCKSIZE, nblocks - b0);
        for (int64_t i = 0; i < len; i++) centred[i] = absmax[b0 + i] - off;
        zt_quant8_quantize(centred, len, ZT_QUANT_NESTED_BLOCKSIZE, codes + b0,
                           nested_absmax + b0 / ZT_QUANT_NESTED_BLOCKSIZE);
    }
    *offset = off;
}

/* ---- dequantize ------------------------------------------------------------------------------ */

float zt_quant4_block_scale(const zt_quant4_view_t *q, int64_t b)
{
    if (!q->nested) return q->absmax[b];
    /* dequantize_blockwise, then `absmax += offset` as a second torch op: two roundings, so the
     * product goes through memory and cannot be fused into an fma with the sum. */
    const int64_t g = zt_quant4_global_block(&q->split, b) / q->nested_blocksize - q->split.first_block / q->nested_blocksize;
    volatile float p = dynamic_map[q->absmax_codes[b]] * q->nested_absmax[g];
    return p + q->offset;
}

/* One walk over the blocks of [e0, e0 + n) for both output types: per block the 16 scaled code
 * values (the very product code * absmax bitsandbytes forms, then rounded to bf16 as its bf16
 * path does), then two table loads per byte. Exactly one of f32 / bf16 is non-NULL. */
static void dequant_range(const zt_quant4_view_t *q, int64_t e0, int64_t n, float *f32, uint16_t *bf16)
{
    const float *code = zt_quant_code(q->type);
    const int64_t bs = q->blocksize, end = e0 + n;
    for (int64_t e = e0; e < end;) {
        const int64_t b = e / bs, bend = ZT_MIN((b + 1) * bs, end);
        const float s = zt_quant4_block_scale(q, b);
        float tf[16];
        uint16_t th[16];
        for (int k = 0; k < 16; k++) tf[k] = code[k] * s;
        if (bf16)
            for (int k = 0; k < 16; k++) th[k] = zt_bf16_from_f32(tf[k]);
        int64_t i = e;
        if (i & 1) { /* a range starting on a low nibble */
            const int c = q->packed[i >> 1] & 15;
            if (f32) f32[i - e0] = tf[c];
            else bf16[i - e0] = th[c];
            i++;
        }
        const uint8_t *p = q->packed + (i >> 1);
        const int64_t npairs = (bend - i) / 2, o = i - e0;
        if (f32)
            for (int64_t j = 0; j < npairs; j++) {
                f32[o + 2 * j] = tf[p[j] >> 4];
                f32[o + 2 * j + 1] = tf[p[j] & 15];
            }
        else
            for (int64_t j = 0; j < npairs; j++) {
                bf16[o + 2 * j] = th[p[j] >> 4];
                bf16[o + 2 * j + 1] = th[p[j] & 15];
            }
        i += 2 * npairs;
        if (i < bend) {
            const int c = q->packed[i >> 1] >> 4;
            if (f32) f32[i - e0] = tf[c];
            else bf16[i - e0] = th[c];
        }
        e = bend;
    }
}

void zt_quant4_dequantize(const zt_quant4_view_t *q, int64_t e0, int64_t n, float *out)
{
    dequant_range(q, e0, n, out, NULL);
}

void zt_quant4_dequantize_bf16(const zt_quant4_view_t *q, int64_t e0, int64_t n, uint16_t *out)
{
    dequant_range(q, e0, n, NULL, out);
}

/* ---- a 4-bit tensor in the space of its float32 values ---------------------------------------- */

int64_t zt_quant4_nested_count(const zt_quant4_split_t *s, int64_t nblocks)
{
    const int64_t B = ZT_QUANT_NESTED_BLOCKSIZE;
    if (!s || !s->run_blocks) return ZT_CEIL_DIV(nblocks, B);
    if (nblocks <= 0) return 0;
    return zt_quant4_global_block(s, nblocks - 1) / B - s->first_block / B + 1;
}

int64_t zt_quant4_region_floats(int64_t nblocks, int nested, const zt_quant4_split_t *s)
{
    return nested ? 1 + zt_quant4_nested_count(s, nblocks) : nblocks;
}

size_t zt_quant4_region_bytes(int64_t n, int64_t blocksize, int nested, const zt_quant4_split_t *s)
{
    const int64_t nb = ZT_CEIL_DIV(n, blocksize);
    return (size_t)(4 * zt_quant4_region_floats(nb, nested, s) + (nested ? nb : 0) + (n + 1) / 2);
}

void zt_quant4_region_view(zt_quant_type_t t, int nested, int64_t blocksize, const float *region, int64_t n,
                           const zt_quant4_split_t *s, zt_quant4_view_t *v)
{
    const int64_t nb = ZT_CEIL_DIV(n, blocksize);
    const uint8_t *bytes = (const uint8_t *)(region + zt_quant4_region_floats(nb, nested, s));
    memset(v, 0, sizeof *v);
    if (s) v->split = *s;
    v->type = t;
    v->numel = n;
    v->blocksize = blocksize;
    v->nested = nested;
    if (nested) {
        v->offset = region[0];
        v->nested_absmax = region + 1;
        v->nested_blocksize = ZT_QUANT_NESTED_BLOCKSIZE;
        v->absmax_codes = bytes;
        v->packed = bytes + nb;
    } else {
        v->absmax = region;
        v->packed = bytes;
    }
}

int zt_quant4_pack_region(const char *name, zt_quant_type_t t, int nested, int64_t blocksize, float *x, int64_t n,
                          char *err, size_t errlen)
{
    if (!zt_quant_blocksize_ok(blocksize))
        return zt_err(err, errlen, "%s: 4-bit block size %" PRId64 " is not one bitsandbytes accepts (32, 64, ..., 4096)",
                      name, blocksize);
    const int64_t nb = ZT_CEIL_DIV(n, blocksize);
    uint8_t *packed = zt_malloc((size_t)(n + 1) / 2);
    float *absmax = zt_malloc((size_t)nb * sizeof *absmax);
    uint8_t *codes = nested ? zt_malloc((size_t)nb) : NULL;
    float *nested_absmax = nested ? zt_malloc((size_t)zt_quant4_region_floats(nb, 1, NULL) * sizeof(float)) : NULL;
    int rc = zt_quant4_quantize(name, t, x, n, blocksize, packed, absmax, err, errlen);
    if (!rc) {
        zt_quant4_view_t v = {.type = t, .numel = n, .blocksize = blocksize, .packed = packed, .nested = nested,
                              .absmax = absmax, .nested_blocksize = ZT_QUANT_NESTED_BLOCKSIZE};
        if (nested) {
            zt_quant4_double_quant(absmax, nb, 1, codes, nested_absmax, &v.offset);
            v.absmax = NULL, v.absmax_codes = codes, v.nested_absmax = nested_absmax;
        }
        zt_quant4_region_write(&v, x);
    }
    free(packed);
    free(absmax);
    free(codes);
    free(nested_absmax);
    return rc;
}

void zt_quant4_region_write(const zt_quant4_view_t *q, float *region)
{
    const int64_t nb = ZT_CEIL_DIV(q->numel, q->blocksize);
    uint8_t *bytes = (uint8_t *)(region + zt_quant4_region_floats(nb, q->nested, &q->split));
    if (q->nested) {
        region[0] = q->offset;
        memcpy(region + 1, q->nested_absmax, (size_t)zt_quant4_nested_count(&q->split, nb) * sizeof(float));
        memcpy(bytes, q->absmax_codes, (size_t)nb);
        bytes += nb;
    } else {
        memcpy(region, q->absmax, (size_t)nb * sizeof(float));
    }
    memcpy(bytes, q->packed, (size_t)(q->numel + 1) / 2);
}

void zt_quant4_region_split(const zt_quant4_view_t *q, const zt_quant4_split_t *s, int64_t n, float *region)
{
    const int64_t bs = q->blocksize, nb = ZT_CEIL_DIV(n, bs), B = ZT_QUANT_NESTED_BLOCKSIZE;
    uint8_t *bytes = (uint8_t *)(region + zt_quant4_region_floats(nb, q->nested, s));
    if (q->nested) {
        region[0] = q->offset;
        memcpy(region + 1, q->nested_absmax + s->first_block / B, (size_t)zt_quant4_nested_count(s, nb) * sizeof(float));
    }
    uint8_t *packed = bytes + (q->nested ? nb : 0);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t g = zt_quant4_global_block(s, b), len = ZT_MIN(bs, n - b * bs);
        if (q->nested) bytes[b] = q->absmax_codes[g];
        else region[b] = q->absmax[g];
        /* a block's values are whole bytes (an even block size), its packed bytes one run */
        if (q->packed) memcpy(packed + b * bs / 2, q->packed + g * bs / 2, (size_t)(len + 1) / 2);
    }
}

/* ---- quant_state JSON ------------------------------------------------------------------------- */

static int parse_dtype(const char *s, zt_quant_dtype_t *out)
{
    if (!strcmp(s, "float32")) *out = ZT_QUANT_DT_F32;
    else if (!strcmp(s, "float16")) *out = ZT_QUANT_DT_F16;
    else if (!strcmp(s, "bfloat16")) *out = ZT_QUANT_DT_BF16;
    else return -1;
    return 0;
}

#define QS_ERR(...) zt_err(err, errlen, __VA_ARGS__)

int zt_quant_state_parse(const char *tensor, const char *json, size_t len, zt_quant_state_t *out, char *err,
                         size_t errlen)
{
    static const char *known[] = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype",
                                  "nested_offset", NULL};
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_loadb(json, len, 0, &je);
    if (!o) return QS_ERR("%s: quant_state is not valid JSON: %s (line %d, column %d)", tensor, je.text, je.line,
                          je.column);
    int rc = -1;
    if (!json_is_object(o)) {
        QS_ERR("%s: quant_state: expected a JSON object", tensor);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int k = 0;
        while (known[k] && strcmp(known[k], key)) k++;
        if (!known[k]) {
            QS_ERR("%s: quant_state: unknown field '%s'", tensor, key);
            goto out;
        }
    }
    /* quant_type, and the tensor name's suffix bitsandbytes__<quant_type> must agree with it */
    v = json_object_get(o, "quant_type");
    const char *qt = json_is_string(v) ? json_string_value(v) : NULL;
    if (!qt) {
        QS_ERR("%s: quant_state: field 'quant_type': expected a string (nf4 or fp4)", tensor);
        goto out;
    }
    if (!strcmp(qt, "nf4")) out->type = ZT_QUANT_NF4;
    else if (!strcmp(qt, "fp4")) out->type = ZT_QUANT_FP4;
    else {
        QS_ERR("%s: quant_state: field 'quant_type': '%s' is not supported (nf4 or fp4)", tensor, qt);
        goto out;
    }
    const char *suffix = strstr(tensor, "bitsandbytes__");
    if (suffix && strcmp(suffix + strlen("bitsandbytes__"), qt)) {
        QS_ERR("%s: quant_state: field 'quant_type' is '%s' but the tensor name says %s", tensor, qt,
               suffix + strlen("bitsandbytes__"));
        goto out;
    }
    v = json_object_get(o, "blocksize");
    if (!json_is_integer(v) || !zt_quant_blocksize_ok(json_integer_value(v))) {
        QS_ERR("%s: quant_state: field 'blocksize': expected one of 32, 64, ..., 4096", tensor);
        goto out;
    }
    out->blocksize = json_integer_value(v);
    v = json_object_get(o, "dtype");
    if (!json_is_string(v) || parse_dtype(json_string_value(v), &out->dtype)) {
        QS_ERR("%s: quant_state: field 'dtype': expected \"float32\", \"float16\" or \"bfloat16\"", tensor);
        goto out;
    }
    v = json_object_get(o, "shape");
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > ZT_QUANT_MAX_DIMS) {
        QS_ERR("%s: quant_state: field 'shape': expected an array of 1 to %d sizes", tensor, ZT_QUANT_MAX_DIMS);
        goto out;
    }
    out->ndim = (int)json_array_size(v);
    out->numel = 1;
    for (int d = 0; d < out->ndim; d++) {
        json_t *s = json_array_get(v, (size_t)d);
        if (!json_is_integer(s) || json_integer_value(s) < 1 || json_integer_value(s) > ((int64_t)1 << 40)) {
            QS_ERR("%s: quant_state: field 'shape': dimension %d is not a positive size", tensor, d);
            goto out;
        }
        out->shape[d] = json_integer_value(s);
        out->numel *= out->shape[d];
        if (out->numel > ((int64_t)1 << 48)) {
            QS_ERR("%s: quant_state: field 'shape': too many elements", tensor);
            goto out;
        }
    }
    /* nested_*: all three or none */
    json_t *nb = json_object_get(o, "nested_blocksize"), *nd = json_object_get(o, "nested_dtype"),
           *no = json_object_get(o, "nested_offset");
    out->nested = nb || nd || no;
    if (out->nested) {
        if (!json_is_integer(nb) || json_integer_value(nb) < 1 || json_integer_value(nb) > 4096) {
            QS_ERR("%s: quant_state: field 'nested_blocksize': expected a block size (256)", tensor);
            goto out;
        }
        out->nested_blocksize = json_integer_value(nb);
        if (!json_is_string(nd) || parse_dtype(json_string_value(nd), &out->nested_dtype)) {
            QS_ERR("%s: quant_state: field 'nested_dtype': expected \"float32\", \"float16\" or \"bfloat16\"", tensor);
            goto out;
        }
        if (!json_is_number(no) || !isfinite(json_number_value(no))) {
            QS_ERR("%s: quant_state: field 'nested_offset': expected a finite number", tensor);
            goto out;
        }
        out->nested_offset = (float)json_number_value(no); /* torch.tensor(float(...)): round to float32 */
    }
    rc = 0;
out:
    json_decref(o);
    return rc;
}

int zt_quant4_check_sizes(const char *weight, const zt_quant_state_t *st, int64_t packed_bytes, int64_t absmax_len,
                          int64_t nested_absmax_len, char *err, size_t errlen)
{
    const int64_t nblocks = ZT_CEIL_DIV(st->numel, st->blocksize);
    if (packed_bytes != (st->numel + 1) / 2)
        return QS_ERR("%s: %" PRId64 " bytes of 4-bit data, the quant_state's %" PRId64 " values need %" PRId64, weight,
                      packed_bytes, st->numel, (st->numel + 1) / 2);
    if (absmax_len != nblocks)
        return QS_ERR("%s.absmax: %" PRId64 " values, the quant_state's %" PRId64 " values in blocks of %" PRId64
                      " need %" PRId64, weight, absmax_len, st->numel, st->blocksize, nblocks);
    if (st->nested && nested_absmax_len != ZT_CEIL_DIV(nblocks, st->nested_blocksize))
        return QS_ERR("%s.nested_absmax: %" PRId64 " values, %" PRId64 " absmax in blocks of %" PRId64 " need %" PRId64,
                      weight, nested_absmax_len, nblocks, st->nested_blocksize,
                      ZT_CEIL_DIV(nblocks, st->nested_blocksize));
    return 0;
}

/* ---- config.json's quantization_config ----------------------------------------------------- */

/* A boolean key, absent or null = def; -1 (and the error) when it is something else. */
static int qc_bool(const json_t *qc, const char *file, const char *key, int def, char *err, size_t errlen)
{
    const json_t *v = json_object_get(qc, key);
    if (!v || json_is_null(v)) return def;
    if (!json_is_boolean(v)) return QS_ERR("%s: quantization_config.%s: expected true or false", file, key);
    return json_is_true(v);
}

/* A string key, absent or null = def. */
static const char *qc_string(const json_t *qc, const char *key, const char *def)
{
    const json_t *v = json_object_get(qc, key);
    if (!v || json_is_null(v)) return def;
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int zt_quant_hf_config(const json_t *config, const char *file, zt_quant_hf_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const json_t *qc = json_object_get(config, "quantization_config");
    if (!qc || json_is_null(qc)) return 0;
    if (!json_is_object(qc)) return QS_ERR("%s: quantization_config: expected an object", file);
    const char *method = qc_string(qc, "quant_method", NULL);
    if (!method) return QS_ERR("%s: quantization_config.quant_method: expected a string (bitsandbytes)", file);
    if (strcmp(method, "bitsandbytes"))
        return QS_ERR("%s: quantization_config.quant_method = '%s' is not supported: ztrain reads bitsandbytes 4-bit "
                      "(nf4, fp4) models only", file, method);
    const int in8 = qc_bool(qc, file, "load_in_8bit", 0, err, errlen);
    const int in4 = qc_bool(qc, file, "load_in_4bit", 0, err, errlen);
    const int dq = qc_bool(qc, file, "bnb_4bit_use_double_quant", 0, err, errlen);
    if (in8 < 0 || in4 < 0 || dq < 0) return -1;
    if (in8)
        return QS_ERR("%s: quantization_config.load_in_8bit: 8-bit (LLM.int8) models are not supported; ztrain "
                      "reads bitsandbytes 4-bit", file);
    if (!in4) return QS_ERR("%s: quantization_config.load_in_4bit is not true: no quantization ztrain reads", file);
    const char *qt = qc_string(qc, "bnb_4bit_quant_type", "fp4");
    if (!qt || (strcmp(qt, "nf4") && strcmp(qt, "fp4")))
        return QS_ERR("%s: quantization_config.bnb_4bit_quant_type: expected \"nf4\" or \"fp4\"", file);
    const char *storage = qc_string(qc, "bnb_4bit_quant_storage", "uint8");
    if (!storage || strcmp(storage, "uint8"))
        return QS_ERR("%s: quantization_config.bnb_4bit_quant_storage = '%s' is not supported (uint8 only)", file,
                      storage ? storage : "?");
    const char *cd = qc_string(qc, "bnb_4bit_compute_dtype", "float32");
    if (!cd || parse_dtype(cd, &out->compute_dtype))
        return QS_ERR("%s: quantization_config.bnb_4bit_compute_dtype: expected float32, float16 or bfloat16", file);
    const json_t *skip = json_object_get(qc, "llm_int8_skip_modules");
    if (skip && !json_is_null(skip)) {
        if (!json_is_array(skip) || json_array_size(skip) > ZT_QUANT_MAX_SKIP)
            return QS_ERR("%s: quantization_config.llm_int8_skip_modules: expected a list of at most %d names", file,
                          ZT_QUANT_MAX_SKIP);
        for (size_t i = 0; i < json_array_size(skip); i++) {
            const json_t *m = json_array_get(skip, i);
            if (!json_is_string(m) || strlen(json_string_value(m)) >= sizeof out->skip[0])
                return QS_ERR("%s: quantization_config.llm_int8_skip_modules: element %zu is not a module name", file,
                              i);
            snprintf(out->skip[out->n_skip++], sizeof out->skip[0], "%s", json_string_value(m));
        }
    }
    out->quantized = 1;
    out->type = strcmp(qt, "fp4") ? ZT_QUANT_NF4 : ZT_QUANT_FP4;
    out->double_quant = dq;
    return 0;
}
