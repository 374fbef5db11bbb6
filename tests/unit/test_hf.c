/* test_hf.c — Hugging Face model directories (zt_hf.h): the sharded writer with
 * several "ranks" (writer instances writing disjoint ranges), read back through
 * zt_hf_open/zt_hf_read; the written bytes checked against the format by an
 * independent header parse here and by python3 (json + struct, and the
 * safetensors package when it is installed); and every refused input with a
 * message that names the file and the tensor. */
#define _GNU_SOURCE
#include "zt_test.h"
#include "zt_hf.h"
#include "zt_bf16.h"
#include "zt_common.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static void setup_tmp(void)
{
    if (tmpdir[0]) return;
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmpdir, sizeof tmpdir, "%s/zt_test_hf.XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* A fresh subdirectory of the test directory. */
static const char *mkdir_t(const char *name)
{
    static char buf[8][512];
    static int k;
    setup_tmp();
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    CU_ASSERT_FATAL(mkdir(buf[k], 0755) == 0);
    return buf[k];
}

static const char *pth(const char *dir, const char *name)
{
    static char buf[8][600];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void put_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_FATAL(fwrite(data, 1, n, f) == n);
    CU_ASSERT_FATAL(fclose(f) == 0);
}

static void put_text(const char *path, const char *text) { put_file(path, text, strlen(text)); }

static const char CONFIG[] = "{\n  \"model_type\": \"gpt2\",\n  \"n_embd\": 16,\n  \"n_layer\": 1\n}\n";

/* ---- the model written in these tests ------------------------------------------------ */

#define NT 6
static const zt_hf_out_tensor_t model[NT] = {
    { "transformer.wte.weight", 2, { 37, 16 } },
    { "transformer.ln_f.weight", 1, { 16 } },
    { "transformer.h.0.attn.c_attn.weight", 2, { 16, 48 } },
    { "scale", 0, { 0 } },
    { "empty", 2, { 0, 4 } },
    { "transformer.h.0.mlp.c_fc.bias", 1, { 64 } },
};

static size_t numel_of(const zt_hf_out_tensor_t *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* Deterministic values with the cases rounding cares about: ties, negative zero,
 * subnormals, infinities, a NaN and values that round up into the next binade. */
static float value_of(int t, size_t i)
{
    static const uint32_t special[] = { 0x80000000u, 0x00000001u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                        0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00800000u };
    uint32_t b;
    if (i < sizeof special / sizeof special[0] && t == 0) b = special[i];
    else {
        uint64_t x = (uint64_t)(t + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        b = (uint32_t)(x & 0x807fffffu) | (uint32_t)(((x >> 40) % 40 + 107) << 23);   /* |v| in [2^-20, 2^20) */
    }
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static float expect_of(zt_st_dtype_t dt, int t, size_t i)
{
    float v = value_of(t, i);
    return dt == ZT_ST_BF16 ? zt_bf16_to_f32(zt_bf16_from_f32(v)) : v;
}

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

/* Writes the model into dir with `ranks` writer instances, each planning on
 * its own and writing the r-th slice of every tensor (in two pieces, so that a
 * rank's range is not one call); instance 0 creates the files first. */
static int write_model(const char *dir, zt_st_dtype_t dt, uint64_t max_shard, int ranks)
{
    char err[ZT_ERRLEN] = "";
    zt_hf_writer_t *w[8];
    for (int r = 0; r < ranks; r++) {
        w[r] = zt_hf_writer_plan(dir, model, NT, dt, max_shard, err, sizeof err);
        if (!w[r]) {
            printf("\n    plan: %s", err);
            return -1;
        }
    }
    if (zt_hf_writer_create_files(w[0], err, sizeof err)) {
        printf("\n    create: %s", err);
        return -1;
    }
    int rc = 0;
    for (int r = ranks - 1; r >= 0; r--)   /* the creator writes last: order must not matter */
        for (int t = 0; t < NT && !rc; t++) {
            size_t n = numel_of(&model[t]), lo = n * (size_t)r / (size_t)ranks, hi = n * (size_t)(r + 1) / (size_t)ranks;
            float *x = malloc((hi - lo + 1) * sizeof *x);
            for (size_t i = lo; i < hi; i++) x[i - lo] = value_of(t, i);
            size_t mid = lo + (hi - lo) / 3;
            rc = zt_hf_writer_write(w[r], t, lo, mid - lo, x, err, sizeof err) ||
                 zt_hf_writer_write(w[r], t, mid, hi - mid, x + (mid - lo), err, sizeof err);
            free(x);
        }
    if (rc) printf("\n    write: %s", err);
    for (int r = 0; r < ranks; r++)
        if (zt_hf_writer_close(w[r], err, sizeof err)) {
            printf("\n    close: %s", err);
            rc = -1;
        }
    return rc ? -1 : 0;
}

/* Reads everything back: names, shapes, dtype, full and partial ranges. */
static void check_read(const char *dir, zt_st_dtype_t dt)
{
    char err[ZT_ERRLEN] = "";
    zt_hf_dir_t *d = zt_hf_open(dir, err, sizeof err);
    if (!d) printf("\n    open: %s", err);
    CU_ASSERT_FATAL(d != NULL);
    CU_ASSERT_EQUAL(zt_hf_ntensors(d), NT);
    CU_ASSERT_STRING_EQUAL(zt_hf_path(d), dir);
    CU_ASSERT_STRING_EQUAL(zt_hf_config_path(d), pth(dir, "config.json"));
    const json_t *cfg = zt_hf_config(d);
    CU_ASSERT(json_integer_value(json_object_get(cfg, "n_embd")) == 16);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(cfg, "model_type")), "gpt2");
    for (int t = 0; t < NT; t++) {
        int ndim = -1;
        int64_t shape[ZT_ST_MAX_DIMS];
        zt_st_dtype_t got;
        const char *file = NULL;
        int i = zt_hf_find(d, model[t].name, &ndim, shape, &got, &file);
        CU_ASSERT_FATAL(i >= 0);
        CU_ASSERT_STRING_EQUAL(zt_hf_tensor_name(d, i), model[t].name);
        CU_ASSERT_EQUAL(ndim, model[t].ndim);
        for (int k = 0; k < ndim; k++) CU_ASSERT_EQUAL(shape[k], model[t].shape[k]);
        CU_ASSERT_EQUAL(got, dt);
        CU_ASSERT(file && strncmp(file, dir, strlen(dir)) == 0);
        size_t n = numel_of(&model[t]);
        float *x = malloc((n + 1) * sizeof *x);
        CU_ASSERT_FATAL(zt_hf_read(d, i, 0, n, x, err, sizeof err) == 0);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++) bad += !same_bits(x[k], expect_of(dt, t, k));
        CU_ASSERT_EQUAL(bad, 0);
        if (n > 20) {   /* a range in the middle lands exactly */
            float y[13];
            CU_ASSERT(zt_hf_read(d, i, 7, 13, y, err, sizeof err) == 0);
            for (size_t k = 0; k < 13; k++) CU_ASSERT(same_bits(y[k], expect_of(dt, t, 7 + k)));
            CU_ASSERT(zt_hf_read(d, i, n - 1, 1, y, err, sizeof err) == 0);
            CU_ASSERT(same_bits(y[0], expect_of(dt, t, n - 1)));
        }
        /* past the end: refused, naming file and tensor */
        CU_ASSERT(zt_hf_read(d, i, n, 1, x, err, sizeof err) == -1);
        CU_ASSERT(strstr(err, model[t].name) && strstr(err, file));
        free(x);
    }
    CU_ASSERT(zt_hf_find(d, "nope", NULL, NULL, NULL, NULL) == -1);
    zt_hf_close(d);
}

static unsigned char *slurp(const char *path, size_t *n)
{
    char err[ZT_ERRLEN];
    char *b = zt_read_file(path, n, err, sizeof err);
    if (!b) printf("\n    %s", err);
    return (unsigned char *)b;
}

/* The format by hand: 8-byte LE length, a header that is a multiple of 8
 * bytes, {"__metadata__": {"format": "pt"}}, tensors tiling the data in the
 * order given, and the bytes being the little-endian F32 / BF16 of the values. */
static void check_format(const char *dir, zt_st_dtype_t dt, const char *file, int t0, int t1)
{
    size_t n;
    unsigned char *b = slurp(pth(dir, file), &n);
    CU_ASSERT_FATAL(b != NULL && n >= 8);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | b[k];
    CU_ASSERT_FATAL(hl % 8 == 0 && 8 + hl <= n);
    json_error_t je;
    json_t *h = json_loadb((const char *)b + 8, hl, 0, &je);
    CU_ASSERT_FATAL(h != NULL);
    CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(json_object_get(h, "__metadata__"), "format")), "pt");
    CU_ASSERT_EQUAL(json_object_size(h), (size_t)(t1 - t0 + 1));
    uint64_t pos = 0, es = dt == ZT_ST_F32 ? 4 : 2;
    for (int t = t0; t < t1; t++) {
        json_t *e = json_object_get(h, model[t].name);
        CU_ASSERT_FATAL(e != NULL);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(e, "dtype")), dt == ZT_ST_F32 ? "F32" : "BF16");
        json_t *sh = json_object_get(e, "shape"), *off = json_object_get(e, "data_offsets");
        CU_ASSERT_FATAL(json_array_size(sh) == (size_t)model[t].ndim && json_array_size(off) == 2);
        for (int k = 0; k < model[t].ndim; k++)
            CU_ASSERT(json_integer_value(json_array_get(sh, (size_t)k)) == model[t].shape[k]);
        size_t ne = numel_of(&model[t]);
        CU_ASSERT((uint64_t)json_integer_value(json_array_get(off, 0)) == pos);
        CU_ASSERT((uint64_t)json_integer_value(json_array_get(off, 1)) == pos + ne * es);
        size_t bad = 0;
        for (size_t k = 0; k < ne; k++) {
            const unsigned char *p = b + 8 + hl + pos + k * es;
            float v = value_of(t, k);
            uint32_t want;
            memcpy(&want, &v, 4);
            if (dt == ZT_ST_BF16) want = zt_bf16_from_f32(v);
            uint32_t got = es == 4 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
                                   : (uint32_t)p[0] | (uint32_t)p[1] << 8;
            bad += got != want;
        }
        CU_ASSERT_EQUAL(bad, 0);
        pos += ne * es;
    }
    CU_ASSERT_EQUAL(8 + hl + pos, n);
    json_decref(h);
    free(b);
}

/* ---- python3 cross-check -------------------------------------------------------------- */

/* Independent of this code base: json + struct always; the safetensors package
 * (numpy API) too when importable. Prints SKIP lines for what it cannot do. */
static const char PY[] =
    "import json, struct, sys, os\n"
    "d, dt = sys.argv[1], sys.argv[2]\n"
    "files = ['model.safetensors']\n"
    "idx = os.path.join(d, 'model.safetensors.index.json')\n"
    "if os.path.exists(idx):\n"
    "    ix = json.load(open(idx))\n"
    "    files = sorted(set(ix['weight_map'].values()))\n"
    "    tot = 0\n"
    "seen = {}\n"
    "for f in files:\n"
    "    b = open(os.path.join(d, f), 'rb').read()\n"
    "    n = struct.unpack('<Q', b[:8])[0]\n"
    "    assert n % 8 == 0, 'header not 8-aligned'\n"
    "    h = json.loads(b[8:8 + n])\n"
    "    assert h.pop('__metadata__') == {'format': 'pt'}\n"
    "    data = b[8 + n:]\n"
    "    ends = sorted((v['data_offsets'][0], v['data_offsets'][1]) for v in h.values())\n"
    "    p = 0\n"
    "    for s, e in ends:\n"
    "        assert s == p, (f, 'gap/overlap'); p = e\n"
    "    assert p == len(data), (f, 'tail')\n"
    "    for k, v in h.items():\n"
    "        assert v['dtype'] == dt, v\n"
    "        ne = 1\n"
    "        for x in v['shape']: ne *= x\n"
    "        s, e = v['data_offsets']\n"
    "        assert e - s == ne * (4 if dt == 'F32' else 2)\n"
    "        if dt == 'F32': vals = struct.unpack('<%df' % ne, data[s:e])\n"
    "        else: vals = [struct.unpack('<f', struct.pack('<I', u << 16))[0] for u in struct.unpack('<%dH' % ne, data[s:e])]\n"
    "        seen[k] = (v['shape'], vals, f)\n"
    "    if os.path.exists(idx):\n"
    "        tot += len(data)\n"
    "if os.path.exists(idx):\n"
    "    assert ix['metadata']['total_size'] == tot, (ix['metadata'], tot)\n"
    "    assert {k: v[2] for k, v in seen.items()} == ix['weight_map']\n"
    "out = open(sys.argv[3], 'w')\n"
    "for k in sorted(seen):\n"
    "    out.write('%s %s %s\\n' % (k, seen[k][0], ' '.join(struct.pack('<f', x).hex() for x in seen[k][1][:12])))\n"
    "try:\n"
    "    from safetensors.numpy import load_file\n"
    "except ImportError:\n"
    "    print('SKIP: python3 has no safetensors package (numpy API)'); sys.exit(0)\n"
    "for f in files:\n"
    "    for k, a in load_file(os.path.join(d, f)).items():\n"
    "        if dt == 'F32': assert list(a.reshape(-1).view('<u4')) == [struct.unpack('<I', struct.pack('<f', x))[0] for x in seen[k][1]], k\n"
    "        assert list(a.shape) == seen[k][0], k\n"
    "print('safetensors package agrees')\n";

static void python_check(const char *dir, zt_st_dtype_t dt)
{
    const char *py = getenv("PYTHON3") && strcmp(getenv("PYTHON3"), "none") ? getenv("PYTHON3") : "python3";
    char script[600], out[600], cmd[2400];
    snprintf(script, sizeof script, "%s/check.py", tmpdir);
    snprintf(out, sizeof out, "%s/py_out.txt", dir);
    put_text(script, PY);
    snprintf(cmd, sizeof cmd, "command -v '%s' >/dev/null 2>&1", py);
    if (system(cmd) != 0) {
        printf("\n    SKIP: no python3 for the cross-check");
        return;
    }
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' %s '%s'", py, script, dir, dt == ZT_ST_F32 ? "F32" : "BF16", out);
    int rc = system(cmd);
    CU_ASSERT_FATAL(rc != -1 && WIFEXITED(rc));
    CU_ASSERT_EQUAL(WEXITSTATUS(rc), 0);
    /* and python's reading of the values is ours: the first 12 values of each tensor */
    FILE *f = fopen(out, "r");
    CU_ASSERT_FATAL(f != NULL);
    char line[4096];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        char name[256];
        CU_ASSERT_FATAL(sscanf(line, "%255s", name) == 1);
        int t = 0;
        while (t < NT && strcmp(model[t].name, name)) t++;
        CU_ASSERT_FATAL(t < NT);
        const char *p = strchr(line, ']');
        CU_ASSERT_FATAL(p != NULL);
        p++;
        for (size_t k = 0; k < 12 && k < numel_of(&model[t]); k++) {
            unsigned u[4];
            CU_ASSERT_FATAL(sscanf(p, " %2x%2x%2x%2x", &u[0], &u[1], &u[2], &u[3]) == 4);
            p += 9;
            uint32_t bits = u[0] | u[1] << 8 | u[2] << 16 | (uint32_t)u[3] << 24;
            float v = expect_of(dt, t, k);
            uint32_t want;
            memcpy(&want, &v, 4);
            /* python's struct.pack('<f') keeps NaN payloads on x86 but may quiet them */
            if ((want & 0x7fffffffu) > 0x7f800000u) {
                CU_ASSERT((bits & 0x7fffffffu) > 0x7f800000u);
            } else {
                CU_ASSERT_EQUAL(bits, want);
            }
        }
        lines++;
    }
    fclose(f);
    CU_ASSERT_EQUAL(lines, NT);
}

/* ---- round trips ------------------------------------------------------------------------ */

static void t_single_f32(void)
{
    const char *dir = mkdir_t("single_f32");
    put_text(pth(dir, "config.json"), CONFIG);
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_F32, (uint64_t)5 << 30, 3) == 0);
    CU_ASSERT(access(pth(dir, "model.safetensors"), F_OK) == 0);
    CU_ASSERT(access(pth(dir, "model.safetensors.index.json"), F_OK) != 0);
    check_read(dir, ZT_ST_F32);
    check_format(dir, ZT_ST_F32, "model.safetensors", 0, NT);
    python_check(dir, ZT_ST_F32);
}

static void t_single_bf16(void)
{
    const char *dir = mkdir_t("single_bf16");
    put_text(pth(dir, "config.json"), CONFIG);
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_BF16, (uint64_t)5 << 30, 2) == 0);
    check_read(dir, ZT_ST_BF16);
    check_format(dir, ZT_ST_BF16, "model.safetensors", 0, NT);
    python_check(dir, ZT_ST_BF16);
}

/* 1000-byte shards for F32: wte (2368 B) is larger than the limit and gets a
 * shard of its own; ln_f (64) + c_attn (3072) cannot share; c_attn alone; then
 * scale (4) + empty (0) + c_fc.bias (256) fit in one. */
static void t_sharded(zt_st_dtype_t dt, const char *name, int ranks)
{
    const char *dir = mkdir_t(name);
    put_text(pth(dir, "config.json"), CONFIG);
    char err[ZT_ERRLEN];
    zt_hf_writer_t *w = zt_hf_writer_plan(dir, model, NT, dt, 1000, err, sizeof err);
    CU_ASSERT_FATAL(w != NULL);
    static const int want_f32[NT] = { 1, 2, 3, 4, 4, 4 }, want_bf16[NT] = { 1, 2, 3, 4, 4, 4 };
    const int *want = dt == ZT_ST_F32 ? want_f32 : want_bf16;
    CU_ASSERT_EQUAL(zt_hf_writer_nshards(w), 4);
    for (int t = 0; t < NT; t++) {
        char nm[64];
        snprintf(nm, sizeof nm, "model-%05d-of-00004.safetensors", want[t]);
        CU_ASSERT_STRING_EQUAL(zt_hf_writer_file(w, t), nm);
    }
    zt_hf_writer_close(w, err, sizeof err);
    CU_ASSERT_FATAL(write_model(dir, dt, 1000, ranks) == 0);
    CU_ASSERT(access(pth(dir, "model.safetensors"), F_OK) != 0);
    check_read(dir, dt);
    check_format(dir, dt, "model-00001-of-00004.safetensors", 0, 1);
    check_format(dir, dt, "model-00003-of-00004.safetensors", 2, 3);
    check_format(dir, dt, "model-00004-of-00004.safetensors", 3, NT);
    /* the index as transformers writes it */
    json_error_t je;
    json_t *ix = json_load_file(pth(dir, "model.safetensors.index.json"), 0, &je);
    CU_ASSERT_FATAL(ix != NULL);
    size_t total = 0;
    for (int t = 0; t < NT; t++) total += numel_of(&model[t]) * (dt == ZT_ST_F32 ? 4 : 2);
    CU_ASSERT((size_t)json_integer_value(json_object_get(json_object_get(ix, "metadata"), "total_size")) == total);
    json_t *wm = json_object_get(ix, "weight_map");
    CU_ASSERT_EQUAL(json_object_size(wm), NT);
    for (int t = 0; t < NT; t++) {
        char nm[64];
        snprintf(nm, sizeof nm, "model-%05d-of-00004.safetensors", want[t]);
        CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(wm, model[t].name)), nm);
    }
    json_decref(ix);
    python_check(dir, dt);
}

static void t_sharded_f32(void) { t_sharded(ZT_ST_F32, "sharded_f32", 4); }
static void t_sharded_bf16(void) { t_sharded(ZT_ST_BF16, "sharded_bf16", 3); }

/* transformers' rule at the boundary: a tensor that exactly fills the shard stays in it. */
static void t_plan_rule(void)
{
    zt_hf_out_tensor_t t[5] = {
        { "a", 1, { 25 } }, { "b", 1, { 25 } }, { "c", 1, { 30 } }, { "d", 1, { 300 } }, { "e", 1, { 1 } },
    };
    char err[ZT_ERRLEN];
    zt_hf_writer_t *w = zt_hf_writer_plan("/nonexistent", t, 5, ZT_ST_F32, 200, err, sizeof err);
    CU_ASSERT_FATAL(w != NULL);   /* pure arithmetic: the directory is not touched */
    CU_ASSERT_EQUAL(zt_hf_writer_nshards(w), 4);   /* a+b = 200 | c | d (1200 > 200, alone) | e */
    CU_ASSERT_STRING_EQUAL(zt_hf_writer_file(w, 1), "model-00001-of-00004.safetensors");
    CU_ASSERT_STRING_EQUAL(zt_hf_writer_file(w, 2), "model-00002-of-00004.safetensors");
    CU_ASSERT_STRING_EQUAL(zt_hf_writer_file(w, 3), "model-00003-of-00004.safetensors");
    CU_ASSERT_STRING_EQUAL(zt_hf_writer_file(w, 4), "model-00004-of-00004.safetensors");
    /* writing before create_files: refused with the file and tensor */
    float x[25] = { 0 };
    CU_ASSERT(zt_hf_writer_write(w, 0, 0, 25, x, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "model-00001-of-00004.safetensors") && strstr(err, "tensor a"));
    CU_ASSERT(zt_hf_writer_write(w, 0, 20, 6, x, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "tensor a") && strstr(err, "outside"));
    zt_hf_writer_close(w, err, sizeof err);
    /* refused plans */
    CU_ASSERT(zt_hf_writer_plan("/x", t, 5, ZT_ST_F16, 200, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "F32 or BF16") != NULL);
    zt_hf_out_tensor_t dup[2] = { { "a", 1, { 2 } }, { "a", 1, { 2 } } };
    CU_ASSERT(zt_hf_writer_plan("/x", dup, 2, ZT_ST_F32, 200, err, sizeof err) == NULL);
    CU_ASSERT(strstr(err, "tensor a is listed twice") != NULL);
}

static void t_parse_size(void)
{
    CU_ASSERT_EQUAL(zt_hf_parse_size("5GB"), 5000000000LL);
    CU_ASSERT_EQUAL(zt_hf_parse_size("500MB"), 500000000LL);
    CU_ASSERT_EQUAL(zt_hf_parse_size("10KB"), 10000LL);
    CU_ASSERT_EQUAL(zt_hf_parse_size("2GiB"), 2LL << 30);
    CU_ASSERT_EQUAL(zt_hf_parse_size("3mib"), 3LL << 20);
    CU_ASSERT_EQUAL(zt_hf_parse_size("7KiB"), 7LL << 10);
    CU_ASSERT_EQUAL(zt_hf_parse_size("8Gb"), 1000000000LL);   /* bits, as transformers reads it */
    CU_ASSERT_EQUAL(zt_hf_parse_size("5gb"), 625000000LL);
    CU_ASSERT_EQUAL(zt_hf_parse_size("12345"), 12345LL);
    CU_ASSERT_EQUAL(zt_hf_parse_size(" 4 GB "), 4000000000LL);
    CU_ASSERT_EQUAL(zt_hf_parse_size("GB"), -1);
    CU_ASSERT_EQUAL(zt_hf_parse_size("5TB"), -1);
    CU_ASSERT_EQUAL(zt_hf_parse_size("-5GB"), -1);
    CU_ASSERT_EQUAL(zt_hf_parse_size("5.5GB"), -1);
    CU_ASSERT_EQUAL(zt_hf_parse_size(""), -1);
    CU_ASSERT_EQUAL(zt_hf_parse_size("99999999999999999999"), -1);
    CU_ASSERT_EQUAL(zt_hf_parse_size("9999999999999GiB"), -1);
}

/* A re-save with another shard count leaves no stale weights behind (a stale
 * model.safetensors would shadow a new index in transformers). */
static void t_stale_files(void)
{
    const char *dir = mkdir_t("resave");
    put_text(pth(dir, "config.json"), CONFIG);
    put_text(pth(dir, "tokenizer.json"), "{}");
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_F32, 1000, 1) == 0);
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_F32, 1u << 30, 1) == 0);
    CU_ASSERT(access(pth(dir, "model.safetensors.index.json"), F_OK) != 0);
    CU_ASSERT(access(pth(dir, "model-00001-of-00004.safetensors"), F_OK) != 0);
    CU_ASSERT(access(pth(dir, "tokenizer.json"), F_OK) == 0);
    check_read(dir, ZT_ST_F32);
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_BF16, 1000, 2) == 0);
    CU_ASSERT(access(pth(dir, "model.safetensors"), F_OK) != 0);
    check_read(dir, ZT_ST_BF16);
}

/* ---- refused inputs ------------------------------------------------------------------------ */

static char last_err[ZT_ERRLEN];

/* zt_hf_open(dir) must fail with every needle in its message. */
static void expect_open_fails(const char *dir, const char *n1, const char *n2, const char *n3)
{
    zt_hf_dir_t *d = zt_hf_open(dir, last_err, sizeof last_err);
    CU_ASSERT(d == NULL);
    zt_hf_close(d);
    const char *nd[3] = { n1, n2, n3 };
    for (int k = 0; k < 3; k++)
        if (nd[k] && !strstr(last_err, nd[k])) {
            printf("\n    \"%s\" lacks \"%s\"", last_err, nd[k]);
            CU_FAIL("message lacks a needle");
        }
    CU_ASSERT(strchr(last_err, '\n') == NULL);
    if (getenv("ZT_TEST_VERBOSE")) printf("\n    refused: %s", last_err);
}

static const char *sharded_dir(const char *name)
{
    const char *dir = mkdir_t(name);
    put_text(pth(dir, "config.json"), CONFIG);
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_F32, 1000, 1) == 0);
    return dir;
}

static void t_err_config(void)
{
    const char *dir = mkdir_t("noconfig");
    CU_ASSERT_FATAL(write_model(dir, ZT_ST_F32, 1u << 30, 1) == 0);
    expect_open_fails(dir, pth(dir, "config.json"), "cannot open", NULL);
    put_text(pth(dir, "config.json"), "{\n  \"n_embd\": 16,\n  \"n_layer\" 1\n}\n");
    expect_open_fails(dir, pth(dir, "config.json:3:"), "bad JSON", NULL);
    put_text(pth(dir, "config.json"), "{\"a\": 1, \"a\": 2}");
    expect_open_fails(dir, pth(dir, "config.json:1:"), "duplicate", NULL);
    put_text(pth(dir, "config.json"), "[1]");
    expect_open_fails(dir, pth(dir, "config.json"), "not a JSON object", NULL);
}

static void t_err_no_weights(void)
{
    const char *dir = mkdir_t("noweights");
    put_text(pth(dir, "config.json"), CONFIG);
    expect_open_fails(dir, dir, "no weights file", "model.safetensors.index.json");
    put_text(pth(dir, "pytorch_model.bin"), "x");
    expect_open_fails(dir, dir, "pytorch_model.bin is not read", NULL);
}

static void t_err_corrupt_header(void)
{
    const char *dir = mkdir_t("corrupt");
    put_text(pth(dir, "config.json"), CONFIG);
    put_text(pth(dir, "model.safetensors"), "garbage!");
    expect_open_fails(dir, pth(dir, "model.safetensors"), "exceeds the file", NULL);
    /* a header that is not JSON: jansson's position comes through */
    static const char h[] = "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},}   ";
    unsigned char buf[128] = { sizeof h - 1 };
    memcpy(buf + 8, h, sizeof h - 1);
    put_file(pth(dir, "model.safetensors"), buf, 8 + sizeof h - 1 + 4);
    expect_open_fails(dir, pth(dir, "model.safetensors"), "safetensors header", "column");
}

static void t_err_dtype(void)
{
    const char *dir = mkdir_t("dtype");
    put_text(pth(dir, "config.json"), CONFIG);
    static const char h[] = "{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}      ";
    unsigned char buf[128] = { sizeof h - 1 };
    memcpy(buf + 8, h, sizeof h - 1);
    put_file(pth(dir, "model.safetensors"), buf, 8 + sizeof h - 1 + 16);
    char want[700];
    snprintf(want, sizeof want, "unsupported dtype F64 of tensor w in %s", pth(dir, "model.safetensors"));
    expect_open_fails(dir, want, NULL, NULL);
}

static void t_err_missing_shard(void)
{
    const char *dir = sharded_dir("missing_shard");
    CU_ASSERT_FATAL(unlink(pth(dir, "model-00003-of-00004.safetensors")) == 0);
    expect_open_fails(dir, pth(dir, "model.safetensors.index.json"), "model-00003-of-00004.safetensors",
                      "transformer.h.0.attn.c_attn.weight");
    CU_ASSERT(strstr(last_err, "does not exist") != NULL);
}

/* Rewrites the index's weight_map entry of `tensor` (NULL value: deletes it). */
static void edit_index(const char *dir, const char *tensor, const char *file)
{
    json_error_t je;
    const char *ip = pth(dir, "model.safetensors.index.json");
    json_t *ix = json_load_file(ip, 0, &je);
    CU_ASSERT_FATAL(ix != NULL);
    json_t *wm = json_object_get(ix, "weight_map");
    if (file) json_object_set_new(wm, tensor, json_string(file));
    else json_object_del(wm, tensor);
    CU_ASSERT_FATAL(json_dump_file(ix, ip, JSON_INDENT(2)) == 0);
    json_decref(ix);
}

static void t_err_index_maps_wrong_shard(void)
{
    const char *dir = sharded_dir("wrong_shard");
    edit_index(dir, "transformer.ln_f.weight", "model-00004-of-00004.safetensors");
    expect_open_fails(dir, pth(dir, "model.safetensors.index.json"), "tensor transformer.ln_f.weight",
                      "model-00004-of-00004.safetensors, which does not hold it");
    /* both shards named elsewhere in the index: the tensor is found, but not where the index says */
    const char *d1 = sharded_dir("wrong_shard_both_open");
    edit_index(d1, "scale", "model-00003-of-00004.safetensors");
    expect_open_fails(d1, pth(d1, "model.safetensors.index.json"), "tensor scale",
                      "model-00003-of-00004.safetensors, which does not hold it (model-00004-of-00004.safetensors does)");
    /* a name the index lists that no shard holds */
    const char *d2 = sharded_dir("ghost_tensor");
    edit_index(d2, "lm_head.weight", "model-00001-of-00004.safetensors");
    expect_open_fails(d2, pth(d2, "model.safetensors.index.json"), "tensor lm_head.weight", "does not hold it");
    /* and a shard tensor the index does not list */
    const char *d3 = sharded_dir("unlisted_tensor");
    edit_index(d3, "scale", NULL);
    expect_open_fails(d3, pth(d3, "model.safetensors.index.json"), "tensor scale", "missing from weight_map");
    /* the index itself: bad JSON, no weight_map, a path instead of a file name */
    const char *d4 = sharded_dir("bad_index");
    put_text(pth(d4, "model.safetensors.index.json"), "{\"weight_map\": {\"a\": }}");
    expect_open_fails(d4, pth(d4, "model.safetensors.index.json:1:"), "bad JSON", NULL);
    put_text(pth(d4, "model.safetensors.index.json"), "{\"metadata\": {}}");
    expect_open_fails(d4, pth(d4, "model.safetensors.index.json"), "weight_map", NULL);
    put_text(pth(d4, "model.safetensors.index.json"), "{\"weight_map\": {\"scale\": \"../x.safetensors\"}}");
    expect_open_fails(d4, pth(d4, "model.safetensors.index.json"), "tensor scale", "not a file name");
}

static void t_err_two_shards(void)
{
    const char *dir = sharded_dir("two_shards");
    /* a new shard 4 holding scale, empty and a second copy of ln_f (shard 2 has it) */
    char err[ZT_ERRLEN];
    zt_hf_out_tensor_t t[3] = { { "scale", 0, { 0 } }, { "empty", 2, { 0, 4 } }, { "transformer.ln_f.weight", 1, { 16 } } };
    zt_hf_writer_t *w;
    /* written as a single file elsewhere, then moved in as shard 4 */
    const char *tmp = mkdir_t("two_shards_src");
    w = zt_hf_writer_plan(tmp, t, 3, ZT_ST_F32, 1u << 30, err, sizeof err);
    CU_ASSERT_FATAL(w && zt_hf_writer_create_files(w, err, sizeof err) == 0);
    zt_hf_writer_close(w, err, sizeof err);
    CU_ASSERT_FATAL(rename(pth(tmp, "model.safetensors"), pth(dir, "model-00004-of-00004.safetensors")) == 0);
    edit_index(dir, "transformer.h.0.mlp.c_fc.bias", NULL);
    expect_open_fails(dir, "tensor transformer.ln_f.weight is in two shards", pth(dir, "model-00002-of-00004.safetensors"),
                      pth(dir, "model-00004-of-00004.safetensors"));
}

static void t_err_truncated_shard(void)
{
    const char *dir = sharded_dir("truncated");
    const char *p = pth(dir, "model-00004-of-00004.safetensors");
    struct stat st;
    CU_ASSERT_FATAL(stat(p, &st) == 0);
    CU_ASSERT_FATAL(truncate(p, st.st_size - 10) == 0);
    expect_open_fails(dir, p, "tensor transformer.h.0.mlp.c_fc.bias", "past the data section");
}

/* U8 tensors (bitsandbytes' 4-bit weights, transformers' save_pretrained): read as bytes, whole;
 * never as floats. */
static void t_u8_bytes(void)
{
    const char *src = getenv("ZT_SRCDIR") ? getenv("ZT_SRCDIR") : ZT_SRCDIR;
    char dir[1100], err[ZT_ERRLEN];
    snprintf(dir, sizeof dir, "%s/tests/reference/hf/qlora-llama-bnb", src);
    zt_hf_dir_t *d = zt_hf_open(dir, err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    zt_st_dtype_t dt;
    const int k = zt_hf_find(d, "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4", &ndim, shape,
                             &dt, NULL);
    CU_ASSERT_FATAL(k >= 0 && dt == ZT_ST_U8 && ndim == 1);
    char json[512] = "";
    CU_ASSERT_FATAL(shape[0] < (int64_t)sizeof json);
    CU_ASSERT(zt_hf_read_bytes(d, k, json, (size_t)shape[0], err, sizeof err) == 0);
    CU_ASSERT(strncmp(json, "{\"quant_type\": \"nf4\",", 21) == 0);
    CU_ASSERT(zt_hf_read_bytes(d, k, json, (size_t)shape[0] - 1, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, " expected") != NULL && strstr(err, "quant_state.bitsandbytes__nf4 holds") != NULL);
    float f[4];
    CU_ASSERT(zt_hf_read(d, k, 0, 4, f, err, sizeof err) == -1);
    CU_ASSERT(strstr(err, "is U8") != NULL);
    CU_ASSERT_STRING_EQUAL(zt_st_dtype_name(ZT_ST_U8), "U8");
    CU_ASSERT_EQUAL(zt_st_dtype_size(ZT_ST_U8), 1);
    zt_hf_close(d);
}

static const zt_test_t tests[] = {
    { "single file F32, 3 writers: read back bit-identical, format, python", t_single_f32 },
    { "single file BF16, 2 writers: read back = bf16(x)", t_single_bf16 },
    { "sharded F32 (1000-byte shards), 4 writers: index, read back, format", t_sharded_f32 },
    { "sharded BF16, 3 writers", t_sharded_bf16 },
    { "shard plan: transformers' rule; write before create refused", t_plan_rule },
    { "parse_size: transformers' convert_file_size_to_int", t_parse_size },
    { "re-save removes stale weights files", t_stale_files },
    { "error: config.json missing / bad JSON / not an object", t_err_config },
    { "error: no weights file", t_err_no_weights },
    { "error: corrupt safetensors header", t_err_corrupt_header },
    { "error: unsupported dtype", t_err_dtype },
    { "error: index names a missing shard", t_err_missing_shard },
    { "error: index maps a tensor to a shard that does not hold it", t_err_index_maps_wrong_shard },
    { "error: a tensor in two shards", t_err_two_shards },
    { "error: truncated shard", t_err_truncated_shard },
    { "U8 tensors: bytes whole, never floats", t_u8_bytes },
    { NULL, NULL },
};

int main(void)
{
    setup_tmp();
    int rc = zt_test_run("hf", tests);
    if (rc == 0 && !getenv("ZT_KEEP_TMP")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return rc;
}
