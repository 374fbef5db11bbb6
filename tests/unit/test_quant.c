/* test_quant.c — zt_quant against bitsandbytes' own outputs (tests/reference/quant/bnb4.h5, made
 * by tests/reference/make_quant_fixtures.py): every comparison is bitwise, floats included. */
#include "zt_common.h"
#include "zt_backend.h"
#include "zt_bf16.h"
#include "zt_quant.h"
#include "zt_test.h"

#include <hdf5.h>
#include <jansson.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static hid_t fixture(void)
{
    static hid_t f = -1;
    if (f < 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/reference/quant/bnb4.h5", ZT_SRCDIR);
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
        f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f < 0) fprintf(stderr, "cannot open %s\n", path);
    }
    return f;
}

/* Whole dataset `path` as `type` (malloc'd); *n elements. NULL if absent. */
static void *read_ds(hid_t loc, const char *path, hid_t type, int64_t *n)
{
    hid_t d = H5Dopen2(loc, path, H5P_DEFAULT);
    if (d < 0) return NULL;
    hid_t s = H5Dget_space(d);
    int64_t cnt = H5Sget_simple_extent_npoints(s);
    void *buf = zt_malloc((size_t)(cnt > 0 ? cnt : 1) * H5Tget_size(type));
    herr_t rc = H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    H5Sclose(s);
    H5Dclose(d);
    if (rc < 0) {
        free(buf);
        return NULL;
    }
    if (n) *n = cnt;
    return buf;
}

static int read_attr_i(hid_t loc, const char *name)
{
    int v = -1;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_INT, &v);
    H5Aclose(a);
    return v;
}

/* Bitwise equality of n floats; prints the first difference. */
static int same_bits(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            fprintf(stderr, "%s[%" PRId64 "]: %a != %a (bitsandbytes)\n", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

/* Dequantized values: bitwise, except that a zero may carry either sign. FP4 index 8 is +0 in
 * bitsandbytes' stored code table and in its torch path, -0 in its compiled CPU (and CUDA) kernel;
 * the two are equal as floats and in every product and sum a GEMM forms. */
static int same_values(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) && !(a[i] == 0.0f && b[i] == 0.0f)) {
            fprintf(stderr, "%s[%" PRId64 "]: %a != %a (bitsandbytes)\n", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

static int same_bytes(const char *what, const uint8_t *a, const uint8_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "%s[%" PRId64 "]: %02x != %02x (bitsandbytes)\n", what, i, a[i], b[i]);
            return 0;
        }
    return 1;
}

static void test_tables(void)
{
    hid_t f = fixture();
    CU_ASSERT_FATAL(f >= 0);
    int64_t n;
    float *t = read_ds(f, "tables/nf4", H5T_NATIVE_FLOAT, &n);
    CU_ASSERT(n == 16 && same_bits("nf4", zt_quant_code(ZT_QUANT_NF4), t, 16));
    free(t);
    t = read_ds(f, "tables/fp4", H5T_NATIVE_FLOAT, &n);
    CU_ASSERT(n == 16 && same_bits("fp4", zt_quant_code(ZT_QUANT_FP4), t, 16));
    free(t);
    t = read_ds(f, "tables/dynamic", H5T_NATIVE_FLOAT, &n);
    CU_ASSERT(n == 256 && same_bits("dynamic", zt_quant_dynamic_map(), t, 256));
    free(t);
}

/* ---- every case: quantize bit-identical, dequantize bit-identical ---------------------------- */

typedef struct { char names[64][64]; int n; } namelist_t;

static herr_t collect(hid_t g, const char *name, const H5L_info_t *info, void *data)
{
    namelist_t *l = data;
    if (l->n < 64 && strcmp(name, "input")) snprintf(l->names[l->n++], sizeof l->names[0], "%s", name);
    return 0;
}

static int n_variants, n_bf16;

static void check_variant(hid_t g, const char *label, const float *x, int64_t n)
{
    /* the variant's name is QUANTTYPE_bsBLOCKSIZE[_dq] */
    const zt_quant_type_t type = strstr(label, "/fp4_") ? ZT_QUANT_FP4 : ZT_QUANT_NF4;
    const int64_t bs = read_attr_i(g, "blocksize");
    const int dq = read_attr_i(g, "double_quant");
    const int64_t nb = ZT_CEIL_DIV(n, bs), nbytes = (n + 1) / 2;

    uint8_t *packed = zt_malloc((size_t)nbytes);
    float *absmax = zt_malloc(sizeof(float) * (size_t)nb);
    char err[ZT_ERRLEN] = "";
    CU_ASSERT_FATAL(zt_quant4_quantize(label, type, x, n, bs, packed, absmax, err, sizeof err) == 0);
    int64_t m;
    uint8_t *ref_packed = read_ds(g, "packed", H5T_NATIVE_UINT8, &m);
    CU_ASSERT(m == nbytes && same_bytes(label, packed, ref_packed, nbytes));

    zt_quant4_view_t v = {.type = type, .numel = n, .blocksize = bs, .packed = ref_packed, .nested = dq};
    uint8_t *codes = NULL, *ref_codes = NULL;
    float *nested = NULL, *ref_nested = NULL, *ref_absmax = NULL, *ref_off = NULL;
    if (dq) {
        const int64_t nn = ZT_CEIL_DIV(nb, ZT_QUANT_NESTED_BLOCKSIZE);
        codes = zt_malloc((size_t)nb);
        nested = zt_malloc(sizeof(float) * (size_t)nn);
        float off;
        zt_quant4_double_quant(absmax, nb, 1, codes, nested, &off);
        ref_codes = read_ds(g, "absmax_q", H5T_NATIVE_UINT8, &m);
        CU_ASSERT(m == nb && same_bytes("nested codes", codes, ref_codes, nb));
        ref_nested = read_ds(g, "nested_absmax", H5T_NATIVE_FLOAT, &m);
        CU_ASSERT(m == nn && same_bits("nested_absmax", nested, ref_nested, nn));
        ref_off = read_ds(g, "offset", H5T_NATIVE_FLOAT, &m);
        CU_ASSERT(m == 1 && same_bits("offset", &off, ref_off, 1));
        CU_ASSERT(read_attr_i(g, "nested_blocksize") == ZT_QUANT_NESTED_BLOCKSIZE);
        v.absmax_codes = ref_codes;
        v.nested_absmax = ref_nested;
        v.nested_blocksize = ZT_QUANT_NESTED_BLOCKSIZE;
        v.offset = ref_off[0];
    } else {
        ref_absmax = read_ds(g, "absmax", H5T_NATIVE_FLOAT, &m);
        CU_ASSERT(m == nb && same_bits("absmax", absmax, ref_absmax, nb));
        v.absmax = ref_absmax;
    }

    /* dequantize bitsandbytes' bytes: whole, then in uneven tiles (odd starts included) */
    float *ref_dq = read_ds(g, "dequant", H5T_NATIVE_FLOAT, &m);
    float *out = zt_malloc(sizeof(float) * (size_t)n);
    CU_ASSERT(m == n);
    zt_quant4_dequantize(&v, 0, n, out);
    CU_ASSERT(same_values("dequant", out, ref_dq, n));
    memset(out, 0xff, sizeof(float) * (size_t)n);
    for (int64_t e = 0, step = 37; e < n; e += step, step = step * 3 % 101 + 1)
        zt_quant4_dequantize(&v, e, ZT_MIN(step, n - e), out + e);
    CU_ASSERT(same_values("dequant (tiles)", out, ref_dq, n));
    uint16_t *ref_h = read_ds(g, "dequant_bf16", H5T_NATIVE_UINT16, &m);
    if (ref_h) { /* all cases but the largest */
        uint16_t *h = zt_malloc(sizeof(uint16_t) * (size_t)n);
        for (int64_t e = 0, step = 64; e < n; e += step, step = step * 5 % 97 + 1)
            zt_quant4_dequantize_bf16(&v, e, ZT_MIN(step, n - e), h + e);
        int ok = m == n;
        for (int64_t i = 0; ok && i < n; i++)
            if (h[i] != ref_h[i] && ((h[i] | ref_h[i]) & 0x7fff)) { /* a zero of either sign, as above */
                fprintf(stderr, "%s: dequant bf16[%" PRId64 "]: %04x != %04x (bitsandbytes)\n", label, i, h[i], ref_h[i]);
                ok = 0;
            }
        CU_ASSERT(ok);
        n_bf16++;
        free(h);
        free(ref_h);
    }
    n_variants++;

    free(out);
    free(ref_dq);
    free(packed);
    free(absmax);
    free(ref_packed);
    free(codes);
    free(nested);
    free(ref_codes);
    free(ref_nested);
    free(ref_absmax);
    free(ref_off);
}

static void test_cases(void)
{
    hid_t f = fixture();
    CU_ASSERT_FATAL(f >= 0);
    namelist_t cases = {.n = 0};
    hid_t c = H5Gopen2(f, "cases", H5P_DEFAULT);
    H5Literate(c, H5_INDEX_NAME, H5_ITER_INC, NULL, collect, &cases);
    CU_ASSERT(cases.n >= 8);
    n_variants = n_bf16 = 0;
    for (int i = 0; i < cases.n; i++) {
        hid_t g = H5Gopen2(c, cases.names[i], H5P_DEFAULT);
        int64_t n;
        float *x = read_ds(g, "input", H5T_NATIVE_FLOAT, &n);
        CU_ASSERT_FATAL(x != NULL);
        namelist_t vars = {.n = 0};
        H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, collect, &vars);
        for (int j = 0; j < vars.n; j++) {
            char label[160];
            snprintf(label, sizeof label, "%s/%s", cases.names[i], vars.names[j]);
            hid_t vg = H5Gopen2(g, vars.names[j], H5P_DEFAULT);
            check_variant(vg, label, x, n);
            H5Gclose(vg);
        }
        free(x);
        H5Gclose(g);
    }
    H5Gclose(c);
    fprintf(stderr, "  %d variants compared (%d also to bf16)\n", n_variants, n_bf16);
    CU_ASSERT(n_variants >= 30 && n_bf16 >= 30);
}

/* Ranks quantize the blocks they own: any split at block boundaries gives the whole tensor's
 * bytes (the tail block only where the range reaches the tensor's end), and so does the double
 * quantization of the gathered absmax. */
static void test_split(void)
{
    hid_t f = fixture();
    CU_ASSERT_FATAL(f >= 0);
    int64_t n, m;
    float *x = read_ds(f, "cases/odd/input", H5T_NATIVE_FLOAT, &n);
    uint8_t *ref = read_ds(f, "cases/odd/nf4_bs64_dq/packed", H5T_NATIVE_UINT8, &m);
    uint8_t *ref_codes = read_ds(f, "cases/odd/nf4_bs64_dq/absmax_q", H5T_NATIVE_UINT8, NULL);
    CU_ASSERT_FATAL(x && ref && ref_codes && n == 259);
    uint8_t packed[130], codes[5];
    float absmax[5], nested[1], off;
    char err[ZT_ERRLEN];
    const int64_t cut[] = {0, 64, 192, 259}; /* three "ranks": 1, 2 and the last 1 + tail blocks */
    for (int r = 0; r < 3; r++)
        CU_ASSERT(zt_quant4_quantize("w", ZT_QUANT_NF4, x + cut[r], cut[r + 1] - cut[r], 64, packed + cut[r] / 2,
                                     absmax + cut[r] / 64, err, sizeof err) == 0);
    CU_ASSERT(same_bytes("split packed", packed, ref, m));
    zt_quant4_double_quant(absmax, 5, 1, codes, nested, &off);
    CU_ASSERT(same_bytes("split nested codes", codes, ref_codes, 5));
    free(x), free(ref), free(ref_codes);
}

/* A tensor-parallel rank's share (zt_quant4_region_split): rows for a column split, each row's
 * input columns for a row split, at tp 2 and 4, nested scales whose blocks of 256 the splits
 * cut: the share dequantizes to the whole tensor's values at its positions, bit for bit. */
static void test_tp_share(void)
{
    const int64_t R = 96, C = 1024, n = R * C, bs = 64; /* 1536 blocks: nested blocks of 256 cut */
    char err[ZT_ERRLEN];
    float *w = malloc((size_t)n * sizeof *w), *all = malloc((size_t)n * sizeof *all);
    float *local = malloc((size_t)n * sizeof *local), *region = malloc((size_t)n * sizeof *region);
    uint64_t st = 7;
    int checked = 0;
    for (int nested = 0; nested < 2; nested++) {
        for (int64_t i = 0; i < n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = ((float)(st >> 40) / (float)(1 << 24) - 0.5f) * (float)(1 + i % 7);
        }
        CU_ASSERT_FATAL(zt_quant4_pack_region("w", ZT_QUANT_NF4, nested, bs, w, n, err, sizeof err) == 0);
        zt_quant4_view_t v, lv;
        zt_quant4_region_view(ZT_QUANT_NF4, nested, bs, w, n, NULL, &v);
        zt_quant4_dequantize(&v, 0, n, all);
        for (int tp = 2; tp <= 4; tp += 2)
            for (int row = 0; row < 2; row++)
                for (int r = 0; r < tp; r++) {
                    const int64_t lr = row ? R : R / tp, lc = row ? C / tp : C, ln = lr * lc;
                    zt_quant4_split_t sp = {lr * lc / bs, 0, r * lr * lc / bs};
                    if (row) sp = (zt_quant4_split_t){lc / bs, C / bs, r * lc / bs};
                    CU_ASSERT(zt_quant4_region_bytes(ln, bs, nested, &sp) <= (size_t)ln * 4);
                    zt_quant4_region_split(&v, &sp, ln, region);
                    zt_quant4_region_view(ZT_QUANT_NF4, nested, bs, region, ln, &sp, &lv);
                    zt_quant4_dequantize(&lv, 0, ln, local);
                    int bad = 0;
                    for (int64_t i = 0; i < ln; i++) {
                        const int64_t g = row ? (i / lc) * C + r * lc + i % lc : r * ln + i;
                        bad += memcmp(&local[i], &all[g], sizeof *local) != 0;
                    }
                    if (bad) fprintf(stderr, "  tp %d rank %d %s split%s: %d values differ\n", tp, r,
                                     row ? "row" : "column", nested ? " nested" : "", bad);
                    CU_ASSERT(bad == 0);
                    checked++;
                }
    }
    CU_ASSERT(checked == 24);
    /* the CPU backend's dequant4 under train.bf16: the region a byte a float (a bf16 working
     * copy widened), bf16 output (zt_quant4_dequantize_bf16, bitsandbytes' bf16 dequantization
     * in test_cases) */
    const size_t nb = zt_quant4_region_bytes(n, bs, 1, NULL);
    float *wide = malloc(nb * sizeof *wide);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    zt_quant4_view_t v;
    zt_quant4_region_view(ZT_QUANT_NF4, 1, bs, w, n, NULL, &v);
    for (size_t i = 0; i < nb; i++) wide[i] = (float)((const uint8_t *)w)[i];
    zt_backend_cpu.dequant4(all, wide, n, ZT_QUANT_NF4, 1, bs, NULL, ZT_DQ4_BYTEWISE | ZT_DQ4_BF16);
    zt_quant4_dequantize_bf16(&v, 0, n, h);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += zt_bf16_from_f32(all[i]) != h[i] || zt_bf16_to_f32(h[i]) != all[i];
    CU_ASSERT(bad == 0);
    free(wide), free(h);
    free(w), free(all), free(local), free(region);
}

static void test_blockwise8(void)
{
    hid_t f = fixture();
    CU_ASSERT_FATAL(f >= 0);
    int64_t n, m;
    float *x = read_ds(f, "blockwise8/input", H5T_NATIVE_FLOAT, &n);
    uint8_t *ref = read_ds(f, "blockwise8/codes", H5T_NATIVE_UINT8, &m);
    float *ref_abs = read_ds(f, "blockwise8/absmax", H5T_NATIVE_FLOAT, NULL);
    float *ref_dq = read_ds(f, "blockwise8/dequant", H5T_NATIVE_FLOAT, NULL);
    CU_ASSERT_FATAL(x && ref && ref_abs && ref_dq && m == n);
    const int64_t nb = ZT_CEIL_DIV(n, 256);
    uint8_t *codes = zt_malloc((size_t)n);
    float *absmax = zt_malloc(sizeof(float) * (size_t)nb), *dq = zt_malloc(sizeof(float) * (size_t)n);
    zt_quant8_quantize(x, n, 256, codes, absmax);
    CU_ASSERT(same_bytes("blockwise8 codes", codes, ref, n));
    CU_ASSERT(same_bits("blockwise8 absmax", absmax, ref_abs, nb));
    for (int64_t i = 0; i < n; i++) dq[i] = zt_quant_dynamic_map()[ref[i]] * ref_abs[i / 256];
    CU_ASSERT(same_bits("blockwise8 dequant", dq, ref_dq, n));
    free(x), free(ref), free(ref_abs), free(ref_dq), free(codes), free(absmax), free(dq);
}

static void test_mean(void)
{
    hid_t f = fixture();
    CU_ASSERT_FATAL(f >= 0);
    int64_t k;
    int64_t *ns = read_ds(f, "mean/n", H5T_NATIVE_INT64, &k);
    float *means = read_ds(f, "mean/mean", H5T_NATIVE_FLOAT, NULL);
    hid_t g = H5Gopen2(f, "mean", H5P_DEFAULT);
    const uint64_t seed = (uint64_t)read_attr_i(g, "seed");
    H5Gclose(g);
    CU_ASSERT_FATAL(ns && means);
    const int64_t nmax = ns[k - 1];
    float *x = zt_malloc(sizeof(float) * (size_t)nmax);
    for (int64_t i = 0; i < nmax; i++) x[i] = (float)(zt_splitmix64(seed + (uint64_t)i) >> 40) * 0x1p-24f;
    for (int64_t j = 0; j < k; j++) {
        const float m = zt_quant_mean(x, ns[j], 1);
        char what[64];
        snprintf(what, sizeof what, "mean of %" PRId64, ns[j]);
        CU_ASSERT(same_bits(what, &m, &means[j], 1));
    }
    /* torch with T threads sums per-thread chunks above 32768 values */
    int64_t nt, nmt;
    int *threads = read_ds(f, "mean/threads", H5T_NATIVE_INT, &nt);
    float *mt = read_ds(f, "mean/mean_threads", H5T_NATIVE_FLOAT, &nmt);
    CU_ASSERT_FATAL(threads && mt && nmt == nt * k);
    int differs = 0;
    for (int64_t t = 0; t < nt; t++)
        for (int64_t j = 0; j < k; j++) {
            const float m = zt_quant_mean(x, ns[j], threads[t]);
            char what[64];
            snprintf(what, sizeof what, "mean of %" PRId64 " with %d threads", ns[j], threads[t]);
            CU_ASSERT(same_bits(what, &m, &mt[t * k + j], 1));
            differs += memcmp(&m, &means[j], sizeof m) != 0;
        }
    CU_ASSERT(differs > 0); /* the fixture does tell the orders apart */
    free(threads), free(mt);
    free(x), free(ns), free(means);
}

static void test_nonfinite(void)
{
    float x[100];
    for (int i = 0; i < 100; i++) x[i] = (float)i * 0.01f;
    uint8_t packed[50];
    float absmax[2];
    char err[ZT_ERRLEN] = "";
    x[70] = NAN;
    CU_ASSERT(zt_quant4_quantize("model.layers.3.mlp.up_proj.weight", ZT_QUANT_NF4, x, 100, 64, packed, absmax, err,
                                 sizeof err) == -1);
    CU_ASSERT(strstr(err, "model.layers.3.mlp.up_proj.weight: element 70 is nan") != NULL);
    fprintf(stderr, "  %s\n", err);
    x[70] = -INFINITY;
    CU_ASSERT(zt_quant4_quantize("w", ZT_QUANT_FP4, x, 100, 64, packed, absmax, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "w: element 70 is inf") != NULL);
    x[70] = 0.0f;
    CU_ASSERT(zt_quant4_quantize("w", ZT_QUANT_FP4, x, 100, 48, packed, absmax, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "w: 4-bit block size 48") != NULL);
}

/* ---- the serialised state of a real Linear4bit ------------------------------------------------- */

#define QS_NAME "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4"

static void test_quant_state_real(void)
{
    hid_t f = fixture();
    CU_ASSERT_FATAL(f >= 0);
    int64_t len, n, nw, na, nn, nq, nm;
    uint8_t *js = read_ds(f, "linear4bit/weight.quant_state.bitsandbytes__nf4", H5T_NATIVE_UINT8, &len);
    CU_ASSERT_FATAL(js != NULL);
    zt_quant_state_t st;
    char err[ZT_ERRLEN] = "";
    CU_ASSERT_FATAL(zt_quant_state_parse(QS_NAME, (const char *)js, (size_t)len, &st, err, sizeof err) == 0);
    CU_ASSERT(st.type == ZT_QUANT_NF4 && st.blocksize == 64 && st.dtype == ZT_QUANT_DT_F32);
    CU_ASSERT(st.ndim == 2 && st.shape[0] == 64 && st.shape[1] == 128 && st.numel == 64 * 128);
    CU_ASSERT(st.nested && st.nested_blocksize == 256 && st.nested_dtype == ZT_QUANT_DT_F32);

    float *x = read_ds(f, "linear4bit/input", H5T_NATIVE_FLOAT, &n);
    uint8_t *w = read_ds(f, "linear4bit/weight", H5T_NATIVE_UINT8, &nw);
    uint8_t *aq = read_ds(f, "linear4bit/weight.absmax", H5T_NATIVE_UINT8, &na);
    float *nabs = read_ds(f, "linear4bit/weight.nested_absmax", H5T_NATIVE_FLOAT, &nn);
    float *qmap = read_ds(f, "linear4bit/weight.quant_map", H5T_NATIVE_FLOAT, &nq);
    float *nmap = read_ds(f, "linear4bit/weight.nested_quant_map", H5T_NATIVE_FLOAT, &nm);
    CU_ASSERT_FATAL(x && w && aq && nabs && qmap && nmap && n == st.numel);
    CU_ASSERT(zt_quant4_check_sizes("model.layers.0.mlp.down_proj.weight", &st, nw, na, nn, err, sizeof err) == 0);
    CU_ASSERT(nq == 16 && same_bits("quant_map", zt_quant_code(ZT_QUANT_NF4), qmap, 16));
    CU_ASSERT(nm == 256 && same_bits("nested_quant_map", zt_quant_dynamic_map(), nmap, 256));

    /* what ztrain would write for the same weight is what bitsandbytes wrote */
    const int64_t nb = ZT_CEIL_DIV(n, 64);
    uint8_t *packed = zt_malloc((size_t)n / 2), *codes = zt_malloc((size_t)nb);
    float *absmax = zt_malloc(sizeof(float) * (size_t)nb), nested[1], off;
    CU_ASSERT(zt_quant4_quantize("w", ZT_QUANT_NF4, x, n, 64, packed, absmax, err, sizeof err) == 0);
    zt_quant4_double_quant(absmax, nb, 1, codes, nested, &off);
    CU_ASSERT(same_bytes("weight", packed, w, nw));
    CU_ASSERT(same_bytes("weight.absmax", codes, aq, na));
    CU_ASSERT(same_bits("weight.nested_absmax", nested, nabs, 1));
    CU_ASSERT(same_bits("nested_offset", &off, &st.nested_offset, 1));

    /* wrong lengths, each named */
    CU_ASSERT(zt_quant4_check_sizes("model.layers.0.mlp.down_proj.weight", &st, nw, na - 1, nn, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "model.layers.0.mlp.down_proj.weight.absmax: 127 values") != NULL);
    fprintf(stderr, "  %s\n", err);
    CU_ASSERT(zt_quant4_check_sizes("w", &st, nw + 1, na, nn, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "w: 4097 bytes of 4-bit data") != NULL);
    CU_ASSERT(zt_quant4_check_sizes("w", &st, nw, na, 2, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "w.nested_absmax: 2 values") != NULL);
    free(js), free(x), free(w), free(aq), free(nabs), free(qmap), free(nmap), free(packed), free(codes), free(absmax);
}

/* Bad JSON bytes: one line naming the tensor and the field. */
static void refuse(const char *name, const char *json, const char *expect)
{
    zt_quant_state_t st;
    char err[ZT_ERRLEN] = "";
    CU_ASSERT(zt_quant_state_parse(name, json, strlen(json), &st, err, sizeof err) == -1);
    if (!strstr(err, expect)) fprintf(stderr, "expected '%s' in: %s\n", expect, err);
    CU_ASSERT(strstr(err, expect) != NULL);
    CU_ASSERT(strchr(err, '\n') == NULL);
}

static void test_quant_state_refusals(void)
{
    const char *good = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [8, 16]}";
    zt_quant_state_t st;
    char err[ZT_ERRLEN] = "";
    CU_ASSERT(zt_quant_state_parse("w.quant_state.bitsandbytes__nf4", good, strlen(good), &st, err, sizeof err) == 0);
    CU_ASSERT(!st.nested && st.dtype == ZT_QUANT_DT_BF16 && st.numel == 128);

    refuse(QS_NAME, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"sha",
           QS_NAME ": quant_state is not valid JSON");
    refuse(QS_NAME, "{\"quant_type\": \"int4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4]}",
           QS_NAME ": quant_state: field 'quant_type': 'int4' is not supported");
    refuse(QS_NAME, "{\"quant_type\": \"fp4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4]}",
           "field 'quant_type' is 'fp4' but the tensor name says nf4");
    refuse(QS_NAME, "{\"quant_type\": \"nf4\", \"blocksize\": 60, \"dtype\": \"float32\", \"shape\": [4]}",
           "field 'blocksize'");
    refuse(QS_NAME, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float8\", \"shape\": [4]}",
           "field 'dtype'");
    refuse(QS_NAME, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4, 0]}",
           "field 'shape': dimension 1");
    refuse(QS_NAME, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": null}",
           "field 'shape'");
    refuse(QS_NAME,
           "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4], "
           "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\"}",
           "field 'nested_offset'");
    refuse(QS_NAME, "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4], \"bits\": 4}",
           "unknown field 'bits'");
    refuse(QS_NAME, "[1, 2]", "expected a JSON object");
}

/* config.json's quantization_config as transformers writes it (tests/reference/quant/config_*.json). */
static int hf_config(const char *name, zt_quant_hf_t *out, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/reference/quant/config_%s.json", ZT_SRCDIR, name);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    CU_ASSERT_FATAL(o != NULL);
    int rc = zt_quant_hf_config(o, "config.json", out, err, errlen);
    json_decref(o);
    return rc;
}

static void test_hf_config(void)
{
    zt_quant_hf_t q;
    char err[ZT_ERRLEN] = "";
    CU_ASSERT(hf_config("bnb4", &q, err, sizeof err) == 0);
    CU_ASSERT(q.quantized && q.type == ZT_QUANT_NF4 && q.double_quant && q.compute_dtype == ZT_QUANT_DT_BF16);
    CU_ASSERT(q.n_skip == 1 && !strcmp(q.skip[0], "lm_head"));
    static const struct { const char *name, *expect; } refused[] = {
        {"bnb8", "config.json: quantization_config.load_in_8bit: 8-bit (LLM.int8) models are not supported"},
        {"gptq", "config.json: quantization_config.quant_method = 'gptq' is not supported"},
        {"awq", "config.json: quantization_config.quant_method = 'awq' is not supported"},
        {"fp8", "config.json: quantization_config.quant_method = 'fp8' is not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        CU_ASSERT(hf_config(refused[i].name, &q, err, sizeof err) == -1);
        if (!strstr(err, refused[i].expect)) fprintf(stderr, "expected '%s' in: %s\n", refused[i].expect, err);
        CU_ASSERT(strstr(err, refused[i].expect) != NULL && !strchr(err, '\n'));
    }
    /* no quantization_config: not quantized; a bad field named */
    json_t *o = json_pack("{s:i}", "hidden_size", 64);
    CU_ASSERT(zt_quant_hf_config(o, "config.json", &q, err, sizeof err) == 0 && !q.quantized);
    json_object_set_new(o, "quantization_config",
                        json_pack("{s:s,s:b,s:s}", "quant_method", "bitsandbytes", "load_in_4bit", 1,
                                  "bnb_4bit_quant_storage", "bfloat16"));
    CU_ASSERT(zt_quant_hf_config(o, "config.json", &q, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "config.json: quantization_config.bnb_4bit_quant_storage = 'bfloat16'") != NULL);
    json_decref(o);
}

static const zt_test_t tests[] = {
    {"code tables equal bitsandbytes'", test_tables},
    {"quantize and dequantize: every case bit-identical", test_cases},
    {"quantizing owned blocks separately equals the whole", test_split},
    {"a tp rank's share of the blocks dequantizes to the whole's values", test_tp_share},
    {"8-bit blockwise (nested absmax) bit-identical", test_blockwise8},
    {"torch.mean of float32 bit-identical", test_mean},
    {"NaN / inf weights and bad block sizes refused", test_nonfinite},
    {"quant_state of a real Linear4bit", test_quant_state_real},
    {"quant_state refusals name tensor and field", test_quant_state_refusals},
    {"config.json quantization_config: bitsandbytes 4-bit read, 8-bit/GPTQ/AWQ/fp8 refused", test_hf_config},
    {NULL, NULL},
};

ZT_TEST_MAIN("quant", tests)
