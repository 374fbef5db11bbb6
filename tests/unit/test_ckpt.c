/* test_ckpt.c — checkpoint writer/reader under MPI (run at -np 1, 2, 3 by tests/mpi/ckpt_unit.sh).
 *
 * The shard engine is not used: segments are synthetic ragged splits over a
 * hand-built GPT-2-shaped table, so the checkpoint code is tested on its own.
 * "Virtual" world sizes (rank r plays every virtual rank v with v % size == r)
 * emulate writing at one world size and reading at another within one run.
 * Every assertion is checked on every rank; messages are also compared across
 * ranks, since an error must read the same everywhere. */
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zt_ckpt.h"
#include "zt_common.h"
#include "zt_safetensors.h"
#include "zt_test.h"

static int rank, size;
static char tmpdir[512];
static zt_param_table_t *table;

/* ---- fixtures -------------------------------------------------------------- */

static void add_param(zt_param_table_t *t, const char *name, int ndim, int64_t d0, int64_t d1)
{
    zt_param_t *p = &t->params[t->nparams++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 1;
    p->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    t->total_numel += p->numel;
}

/* GPT-2 names and HF shapes (Conv1D weights are (in, out)), tiny dims. */
static zt_param_table_t *make_table(int L, int C, int V, int maxT)
{
    zt_param_table_t *t = calloc(1, sizeof *t);
    t->dims = (zt_model_dims_t){ .L = L, .NH = 2, .C = C, .V = V, .maxT = maxT };
    t->params = calloc((size_t)(4 + 12 * L + 1), sizeof *t->params);
    add_param(t, "transformer.wte.weight", 2, V, C);
    add_param(t, "transformer.wpe.weight", 2, maxT, C);
    add_param(t, "transformer.ln_f.weight", 1, C, 0);
    add_param(t, "transformer.ln_f.bias", 1, C, 0);
    for (int l = 0; l < L; l++) {
        char n[96];
#define P(suffix, nd, a, b) snprintf(n, sizeof n, "transformer.h.%d.%s", l, suffix), add_param(t, n, nd, a, b)
        P("ln_1.weight", 1, C, 0);
        P("ln_1.bias", 1, C, 0);
        P("attn.c_attn.weight", 2, C, 3 * C);
        P("attn.c_attn.bias", 1, 3 * C, 0);
        P("attn.c_proj.weight", 2, C, C);
        P("attn.c_proj.bias", 1, C, 0);
        P("ln_2.weight", 1, C, 0);
        P("ln_2.bias", 1, C, 0);
        P("mlp.c_fc.weight", 2, C, 4 * C);
        P("mlp.c_fc.bias", 1, 4 * C, 0);
        P("mlp.c_proj.weight", 2, 4 * C, C);
        P("mlp.c_proj.bias", 1, C, 0);
#undef P
    }
    return t;
}

static void free_table(zt_param_table_t *t)
{
    free(t->params);
    free(t);
}

static float value_of(int g, int p, size_t i)
{
    uint32_t h = (uint32_t)(p * 2654435761u) ^ (uint32_t)(i * 40503u) ^ (uint32_t)(g * 97u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (float)(h % 20001) / 10000.0f - 1.0f;
}

typedef struct {
    int n;
    zt_io_seg_t *segs;
} segset_t;

/* Splits every parameter among `vworld` virtual ranks with ragged boundaries (some
 * virtual ranks own nothing of some tensors) and gives this rank the segments of
 * its virtual ranks, each cut in two pieces. with_data fills them with the
 * reference values; otherwise they are poisoned. */
static segset_t make_segs(const zt_param_table_t *t, int vworld, int salt, int with_opt, int with_data)
{
    segset_t s = { 0, calloc((size_t)t->nparams * (size_t)vworld * 2 + 1, sizeof(zt_io_seg_t)) };
    for (int p = 0; p < t->nparams; p++) {
        size_t numel = t->params[p].numel, bound[65];
        /* weights: (v + p + salt) % 3 makes some zero-size parts */
        size_t wsum = 0, w[64];
        for (int v = 0; v < vworld; v++) wsum += (w[v] = (size_t)((v + p + salt) % 3));
        if (wsum == 0) { w[0] = 1; wsum = 1; }
        bound[0] = 0;
        size_t acc = 0;
        for (int v = 0; v < vworld; v++) {
            acc += w[v];
            bound[v + 1] = numel * acc / wsum;
        }
        for (int v = 0; v < vworld; v++) {
            if (v % size != rank) continue;
            size_t a = bound[v], b = bound[v + 1];
            size_t mid = a + (b - a) / 3;
            size_t cut[3] = { a, mid, b };
            for (int k = 0; k < 2; k++) {
                if (cut[k + 1] == cut[k]) continue;
                zt_io_seg_t *g = &s.segs[s.n++];
                g->param = p;
                g->start = cut[k];
                g->len = cut[k + 1] - cut[k];
                g->value = malloc(g->len * sizeof(float));
                g->exp_avg = with_opt ? malloc(g->len * sizeof(float)) : NULL;
                g->exp_avg_sq = with_opt ? malloc(g->len * sizeof(float)) : NULL;
                for (size_t i = 0; i < g->len; i++) {
                    g->value[i] = with_data ? value_of(0, p, g->start + i) : -777.0f;
                    if (with_opt) {
                        g->exp_avg[i] = with_data ? value_of(1, p, g->start + i) : -777.0f;
                        g->exp_avg_sq[i] = with_data ? value_of(2, p, g->start + i) : -777.0f;
                    }
                }
            }
        }
    }
    return s;
}

static void free_segs(segset_t *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->segs[i].value);
        free(s->segs[i].exp_avg);
        free(s->segs[i].exp_avg_sq);
    }
    free(s->segs);
    s->n = 0;
}

/* Number of elements differing from the reference values (all groups present). */
static long count_wrong(const segset_t *s)
{
    long bad = 0;
    for (int i = 0; i < s->n; i++) {
        const zt_io_seg_t *g = &s->segs[i];
        for (size_t k = 0; k < g->len; k++) {
            bad += g->value[k] != value_of(0, g->param, g->start + k);
            if (g->exp_avg) bad += g->exp_avg[k] != value_of(1, g->param, g->start + k);
            if (g->exp_avg_sq) bad += g->exp_avg_sq[k] != value_of(2, g->param, g->start + k);
        }
    }
    return bad;
}

static zt_ckpt_meta_t make_meta(long step)
{
    zt_ckpt_meta_t m;
    memset(&m, 0, sizeof m);
    m.step = step;
    m.tokens_seen = 1000.0 * step;
    m.samples_seen = 10 * step;
    m.adam_step = step;
    snprintf(m.strategy, sizeof m.strategy, "zero3");
    m.data_seed = 42;
    m.shuffle = 1;
    m.lr = 3e-4f; m.beta1 = 0.9f; m.beta2 = 0.95f; m.eps = 1e-8f; m.weight_decay = 0.1f;
    return m;
}

static const char *CONFIG = "model = { n_layer = 2; n_head = 2; n_embd = 8; vocab_size = 11; block_size = 5; };\n";

/* A fresh directory per test, shared by all ranks. */
static void fresh_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", tmpdir, name);
    if (rank == 0) mkdir(out, 0755);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* 1 on every rank iff the condition holds on every rank. */
static int all(int cond)
{
    int r;
    MPI_Allreduce(&cond, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return r;
}

/* 1 iff err is identical on every rank. */
static int same_everywhere(const char *err)
{
    char buf[ZT_ERRLEN] = "";
    if (rank == 0) snprintf(buf, sizeof buf, "%s", err);
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    return all(strcmp(buf, err) == 0);
}

static int count_entries(const char *dir, const char *substr)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c -- '%s'", dir, substr);
    FILE *fp = popen(cmd, "r");
    int n = 0;
    if (fp) {
        if (fscanf(fp, "%d", &n) != 1) n = -1;
        pclose(fp);
    }
    return n;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_checksum_split_independent(void)
{
    float x[100];
    for (int i = 0; i < 100; i++) x[i] = value_of(0, 3, (size_t)i);
    uint64_t whole = zt_ckpt_checksum(0, x, 100);
    uint64_t parts = zt_ckpt_checksum(0, x, 37) + zt_ckpt_checksum(37, x + 37, 1) +
                     zt_ckpt_checksum(38, x + 38, 62);
    CU_ASSERT_EQUAL(whole, parts);
    x[50] = -x[50];
    CU_ASSERT_NOT_EQUAL(whole, zt_ckpt_checksum(0, x, 100));
}

static void roundtrip(const char *format, int wv, int rv)
{
    char dir[600], err[ZT_ERRLEN] = "", path[1024];
    fresh_dir(dir, sizeof dir, format);
    zt_ckpt_meta_t m = make_meta(7);
    /* fp16 loss-scale state round-trips; runs without fp16 store none and read 0 */
    const double scale = wv == rv ? 0 : 32768;
    m.loss_scale = scale;
    m.loss_scale_good_steps = 3;
    segset_t w = make_segs(table, wv, 0, 1, 1);
    int rc = zt_ckpt_write_segments(dir, &m, CONFIG, !strcmp(format, "sharded"), 0, w.segs, w.n, table, MPI_COMM_WORLD, err, sizeof err);
    if (rc) fprintf(stderr, "write: %s\n", err);
    CU_ASSERT_FATAL(all(rc == 0));
    CU_ASSERT(m.bytes == 3.0 * 4.0 * (double)table->total_numel);
    CU_ASSERT(m.save_seconds > 0);
    CU_ASSERT_EQUAL(zt_ckpt_find_latest(dir, path, sizeof path), 0);
    CU_ASSERT(strstr(path, strcmp(format, "sharded") ? "ckpt-00000007.h5" : "ckpt-00000007.shards") != NULL);
    CU_ASSERT_EQUAL(count_entries(dir, "tmp"), 0);

    segset_t r = make_segs(table, rv, 1, 1, 0);
    zt_ckpt_meta_t lm;
    memset(&lm, 0, sizeof lm);
    rc = zt_ckpt_read_segments(path, &lm, 0, r.segs, r.n, table, MPI_COMM_WORLD, err, sizeof err);
    if (rc) fprintf(stderr, "read: %s\n", err);
    CU_ASSERT_FATAL(all(rc == 0));
    CU_ASSERT(all(count_wrong(&r) == 0));
    CU_ASSERT_EQUAL(lm.step, 7);
    CU_ASSERT_EQUAL(lm.samples_seen, 70);
    CU_ASSERT_EQUAL(lm.adam_step, 7);
    CU_ASSERT_EQUAL(lm.world_size, size);
    CU_ASSERT_STRING_EQUAL(lm.strategy, "zero3");
    CU_ASSERT_EQUAL(lm.data_seed, 42);
    CU_ASSERT_EQUAL(lm.shuffle, 1);
    CU_ASSERT(lm.beta2 == 0.95f && lm.lr == 3e-4f);
    CU_ASSERT(lm.loss_scale == scale && lm.loss_scale_good_steps == (scale > 0 ? 3 : 0));
    free_segs(&r);

    /* Every rank reading everything: the replicated (DDP) read pattern. */
    r = make_segs(table, 1, 0, 1, 0);
    if (size > 1 && rank != 0) {   /* make_segs gives virtual rank 0 to rank 0 only */
        free_segs(&r);
        int save = rank;
        rank = 0;
        r = make_segs(table, 1, 0, 1, 0);
        rank = save;
    }
    rc = zt_ckpt_read_segments(dir, &lm, 0, r.segs, r.n, table, MPI_COMM_WORLD, err, sizeof err);
    CU_ASSERT(all(rc == 0));
    CU_ASSERT(all(count_wrong(&r) == 0));
    free_segs(&r);
    free_segs(&w);
}

static void test_roundtrip_consolidated(void) { roundtrip("consolidated", 5, 3); }
static void test_roundtrip_consolidated_same_split(void) { roundtrip("consolidated", size, size); }
static void test_roundtrip_sharded(void) { roundtrip("sharded", 4, 7); }

static void test_sharded_consolidate(void)
{
    char dir[600], err[ZT_ERRLEN] = "", path[1024], out[1200];
    fresh_dir(dir, sizeof dir, "consolidate");
    zt_ckpt_meta_t m = make_meta(3);
    m.loss_scale = 0.5;
    m.loss_scale_good_steps = 999;
    segset_t w = make_segs(table, 3, 2, 1, 1);
    int rc = zt_ckpt_write_segments(dir, &m, CONFIG, 1, 0, w.segs, w.n, table, MPI_COMM_WORLD, err, sizeof err);
    CU_ASSERT_FATAL(all(rc == 0));
    zt_ckpt_find_latest(dir, path, sizeof path);
    snprintf(out, sizeof out, "%s/merged.h5", dir);
    if (rank == 0) {
        /* a buffer smaller than most tensors exercises the streaming */
        rc = zt_ckpt_consolidate(path, out, 13, err, sizeof err);
        if (rc) fprintf(stderr, "consolidate: %s\n", err);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    CU_ASSERT_FATAL(rc == 0);
    segset_t r = make_segs(table, 2, 5, 1, 0);
    zt_ckpt_meta_t lm;
    rc = zt_ckpt_read_segments(out, &lm, 0, r.segs, r.n, table, MPI_COMM_WORLD, err, sizeof err);
    CU_ASSERT(all(rc == 0));
    CU_ASSERT(all(count_wrong(&r) == 0));
    CU_ASSERT_EQUAL(lm.step, 3);
    CU_ASSERT(lm.loss_scale == 0.5 && lm.loss_scale_good_steps == 999); /* kept by consolidation */
    /* stored checksums of both forms agree */
    if (rank == 0) {
        zt_ckpt_reader_t *a = zt_ckpt_reader_open(path, err, sizeof err), *b = zt_ckpt_reader_open(out, err, sizeof err);
        CU_ASSERT_FATAL(a && b);
        CU_ASSERT(zt_ckpt_reader_is_sharded(a) && !zt_ckpt_reader_is_sharded(b));
        CU_ASSERT_EQUAL(zt_ckpt_reader_tensors(b)->nparams, table->nparams);
        for (int p = 0; p < table->nparams; p++)
            for (int g = 0; g < 3; g++) {
                uint64_t x = 1, y = 2;
                CU_ASSERT(zt_ckpt_reader_checksum(a, g, p, &x) == 0 && zt_ckpt_reader_checksum(b, g, p, &y) == 0);
                CU_ASSERT_EQUAL(x, y);
            }
        CU_ASSERT_STRING_EQUAL(zt_ckpt_reader_config(b), CONFIG);
        zt_ckpt_reader_close(a);
        zt_ckpt_reader_close(b);
    }
    free_segs(&r);
    free_segs(&w);
}

static void test_latest_and_keep_last(void)
{
    char dir[600], err[ZT_ERRLEN] = "", path[1024], p2[1200];
    fresh_dir(dir, sizeof dir, "keep");
    segset_t w = make_segs(table, size, 0, 1, 1);
    for (long step = 1; step <= 4; step++) {
        zt_ckpt_meta_t m = make_meta(step);
        int rc = zt_ckpt_write_segments(dir, &m, CONFIG, step == 2, 2, w.segs, w.n,
                                        table, MPI_COMM_WORLD, err, sizeof err);
        CU_ASSERT(all(rc == 0));
    }
    CU_ASSERT_EQUAL(count_entries(dir, "^ckpt-"), 2);
    CU_ASSERT_EQUAL(count_entries(dir, "ckpt-00000003.h5"), 1);
    CU_ASSERT_EQUAL(count_entries(dir, "ckpt-00000004.h5"), 1);
    CU_ASSERT_EQUAL(zt_ckpt_find_latest(dir, path, sizeof path), 0);
    CU_ASSERT(strstr(path, "ckpt-00000004.h5") != NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        /* an unfinished newer save is ignored; a dangling pointer falls back to the scan */
        snprintf(p2, sizeof p2, "%s/ckpt-00000009.h5.tmp", dir);
        FILE *fp = fopen(p2, "w");
        fclose(fp);
        snprintf(p2, sizeof p2, "%s/latest", dir);
        fp = fopen(p2, "w");
        fprintf(fp, "ckpt-00000008.h5\n");
        fclose(fp);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_EQUAL(zt_ckpt_find_latest(dir, path, sizeof path), 0);
    CU_ASSERT(strstr(path, "ckpt-00000004.h5") != NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) unlink(p2);
    MPI_Barrier(MPI_COMM_WORLD);
    CU_ASSERT_EQUAL(zt_ckpt_find_latest(dir, path, sizeof path), 0);
    CU_ASSERT(strstr(path, "ckpt-00000004.h5") != NULL);
    char empty[600];
    fresh_dir(empty, sizeof empty, "empty");
    CU_ASSERT_EQUAL(zt_ckpt_find_latest(empty, path, sizeof path), -1);
    free_segs(&w);
}

static void test_weights_only(void)
{
    char dir[600], err[ZT_ERRLEN] = "";
    fresh_dir(dir, sizeof dir, "wonly");
    zt_ckpt_meta_t m = make_meta(5);
    segset_t w = make_segs(table, 2, 0, 0, 1);
    int rc = zt_ckpt_write_segments(dir, &m, CONFIG, 0, 0, w.segs, w.n, table, MPI_COMM_WORLD, err,
                                    sizeof err);
    CU_ASSERT_FATAL(all(rc == 0));
    CU_ASSERT(m.bytes == 4.0 * (double)table->total_numel);
    segset_t r = make_segs(table, 3, 1, 0, 0);
    zt_ckpt_meta_t lm = make_meta(0);
    rc = zt_ckpt_read_segments(dir, &lm, 1, r.segs, r.n, table, MPI_COMM_WORLD, err, sizeof err);
    CU_ASSERT(all(rc == 0));
    CU_ASSERT(all(count_wrong(&r) == 0));
    CU_ASSERT_EQUAL(lm.step, 5);
    CU_ASSERT_EQUAL(lm.data_seed, 42);  /* untouched by a weights-only load */
    free_segs(&r);
    r = make_segs(table, 3, 1, 1, 0);
    rc = zt_ckpt_read_segments(dir, &lm, 0, r.segs, r.n, table, MPI_COMM_WORLD, err, sizeof err);
    CU_ASSERT(all(rc == -1));
    CU_ASSERT(strstr(err, "no optimizer state") != NULL);
    CU_ASSERT(same_everywhere(err));
    free_segs(&r);
    free_segs(&w);
}

/* Writes a good checkpoint at step 1, returns its path. */
static void good_ckpt(const char *name, char *path, size_t len, int nan_param)
{
    char dir[600], err[ZT_ERRLEN] = "";
    fresh_dir(dir, sizeof dir, name);
    zt_ckpt_meta_t m = make_meta(1);
    segset_t w = make_segs(table, size, 0, 1, 1);
    if (nan_param >= 0)
        for (int i = 0; i < w.n; i++)
            if (w.segs[i].param == nan_param) w.segs[i].value[w.segs[i].len / 2] = 0.0f / 0.0f;
    int rc = zt_ckpt_write_segments(dir, &m, CONFIG, 0, 0, w.segs, w.n, table, MPI_COMM_WORLD, err,
                                    sizeof err);
    CU_ASSERT_FATAL(all(rc == 0));
    zt_ckpt_find_latest(dir, path, len);
    free_segs(&w);
}

/* Loads path with table t; expects failure whose message contains every needle. */
static void expect_load_error(const char *path, const zt_param_table_t *t, const char *n1, const char *n2)
{
    char err[ZT_ERRLEN] = "";
    segset_t r = make_segs(t, size + 1, 0, 1, 0);
    zt_ckpt_meta_t lm;
    int rc = zt_ckpt_read_segments(path, &lm, 0, r.segs, r.n, t, MPI_COMM_WORLD, err, sizeof err);
    CU_ASSERT(all(rc == -1));
    if (rank == 0) printf("\n    error: %s", err);
    CU_ASSERT(strstr(err, path) != NULL);
    CU_ASSERT(strstr(err, n1) != NULL);
    if (n2) CU_ASSERT(strstr(err, n2) != NULL);
    CU_ASSERT(same_everywhere(err));
    free_segs(&r);
}

static void test_error_format_version(void)
{
    char path[1024];
    good_ckpt("badver", path, sizeof path, -1);
    if (rank == 0) {
        hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
        int64_t v = 7;
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
        H5Fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_load_error(path, table, "format_version 7 is not supported (this ztrain reads 1)", NULL);
}

static void test_error_missing_tensor(void)
{
    char path[1024];
    good_ckpt("missing", path, sizeof path, -1);
    zt_param_table_t *big = make_table(3, 8, 11, 5);   /* one more layer than stored */
    expect_load_error(path, big, "missing tensor /model/transformer.h.2.ln_1.weight", NULL);
    free_table(big);
}

static void test_error_wrong_shape(void)
{
    char path[1024];
    good_ckpt("shape", path, sizeof path, -1);
    zt_param_table_t *wide = make_table(2, 8, 13, 5);  /* vocab 13 instead of 11 */
    expect_load_error(path, wide, "tensor /model/transformer.wte.weight has shape (11, 8), the model needs (13, 8)",
                      NULL);
    free_table(wide);
}

static void test_error_nan(void)
{
    char path[1024];
    int p = 6;  /* transformer.h.0.attn.c_attn.weight */
    good_ckpt("nan", path, sizeof path, p);
    expect_load_error(path, table, "tensor /model/transformer.h.0.attn.c_attn.weight holds NaN or Inf", NULL);
}

static void test_error_truncated(void)
{
    char path[1024];
    good_ckpt("trunc", path, sizeof path, -1);
    if (rank == 0) {
        struct stat st;
        stat(path, &st);
        CU_ASSERT(truncate(path, st.st_size / 2) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_load_error(path, table, "truncated or corrupt", NULL);
    /* and a file that is not HDF5 at all */
    if (rank == 0) {
        FILE *fp = fopen(path, "w");
        fprintf(fp, "garbage");
        fclose(fp);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_load_error(path, table, "not a readable HDF5 file", NULL);
}

static void test_error_write_fails_cleanly(void)
{
    /* the checkpoint directory cannot be created (a file is in the way): every rank
     * gets the same error and nothing is left behind */
    char block[600], dir[700], err[ZT_ERRLEN] = "";
    snprintf(block, sizeof block, "%s/blocker", tmpdir);
    if (rank == 0) {
        FILE *fp = fopen(block, "w");
        fclose(fp);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(dir, sizeof dir, "%s/sub", block);
    zt_ckpt_meta_t m = make_meta(1);
    segset_t w = make_segs(table, size, 0, 1, 1);
    int rc = zt_ckpt_write_segments(dir, &m, CONFIG, 0, 0, w.segs, w.n, table, MPI_COMM_WORLD, err,
                                    sizeof err);
    CU_ASSERT(all(rc == -1));
    CU_ASSERT(strstr(err, "blocker") != NULL);
    CU_ASSERT(same_everywhere(err));
    free_segs(&w);
}

/* ---- safetensors ------------------------------------------------------------------ */

static void test_safetensors_roundtrip(void)
{
    if (rank != 0) return;
    char path[600], err[ZT_ERRLEN] = "";
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    zt_st_writer_t w;
    CU_ASSERT_FATAL(zt_st_writer_open(&w, path, err, sizeof err) == 0);
    int64_t s1[2] = { 3, 5 }, s2[1] = { 7 };
    zt_st_writer_add(&w, "a.weight", 2, s1);
    zt_st_writer_add(&w, "b \"quoted\"", 1, s2);
    CU_ASSERT(zt_st_writer_begin(&w, err, sizeof err) == 0);
    float a[15], b[7];
    for (int i = 0; i < 15; i++) a[i] = value_of(0, 1, (size_t)i);
    for (int i = 0; i < 7; i++) b[i] = value_of(0, 2, (size_t)i);
    zt_st_writer_data(&w, a, 4, err, sizeof err);   /* in pieces */
    zt_st_writer_data(&w, a + 4, 11, err, sizeof err);
    zt_st_writer_data(&w, b, 7, err, sizeof err);
    CU_ASSERT(zt_st_writer_close(&w, err, sizeof err) == 0);

    zt_st_file_t f;
    int rc = zt_st_open(path, &f, err, sizeof err);
    if (rc) printf("%s\n", err);
    CU_ASSERT_FATAL(rc == 0);
    CU_ASSERT_EQUAL(f.ntensors, 2);
    CU_ASSERT_EQUAL(f.data_start % 8, 0);
    int ia = zt_st_find(&f, "a.weight"), ib = zt_st_find(&f, "b \"quoted\"");
    CU_ASSERT_FATAL(ia >= 0 && ib >= 0);
    CU_ASSERT(f.tensors[ia].ndim == 2 && f.tensors[ia].shape[0] == 3 && f.tensors[ia].shape[1] == 5);
    float ra[15], rb[7];
    CU_ASSERT(zt_st_read_f32(&f, ia, ra, err, sizeof err) == 0);
    CU_ASSERT(zt_st_read_f32(&f, ib, rb, err, sizeof err) == 0);
    CU_ASSERT(memcmp(a, ra, sizeof a) == 0);
    CU_ASSERT(memcmp(b, rb, sizeof b) == 0);
    zt_st_close(&f);
}

static size_t make_st(uint8_t *buf, const char *hdr, const void *data, size_t dlen)
{
    size_t n = strlen(hdr);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, hdr, n);
    memcpy(buf + 8 + n, data, dlen);
    return 8 + n + dlen;
}

static void test_safetensors_half_types(void)
{
    if (rank != 0) return;
    char path[600], err[ZT_ERRLEN] = "";
    snprintf(path, sizeof path, "%s/half.safetensors", tmpdir);
    /* 1.0, -2.0, 0.5 in bf16 and in f16 (plus an f16 subnormal 2^-24) */
    uint16_t data[7] = { 0x3F80, 0xC000, 0x3F00, 0x3C00, 0xC000, 0x3800, 0x0001 };
    uint8_t buf[512];
    size_t n = make_st(buf, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                            "\"y\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[6,14]}}",
                       data, sizeof data);
    FILE *fp = fopen(path, "wb");
    fwrite(buf, 1, n, fp);
    fclose(fp);
    zt_st_file_t f;
    int rc = zt_st_open(path, &f, err, sizeof err);
    if (rc) printf("%s\n", err);
    CU_ASSERT_FATAL(rc == 0);
    float x[3], y[4];
    CU_ASSERT(zt_st_read_f32(&f, zt_st_find(&f, "x"), x, err, sizeof err) == 0);
    CU_ASSERT(zt_st_read_f32(&f, zt_st_find(&f, "y"), y, err, sizeof err) == 0);
    CU_ASSERT(x[0] == 1.0f && x[1] == -2.0f && x[2] == 0.5f);
    CU_ASSERT(y[0] == 1.0f && y[1] == -2.0f && y[2] == 0.5f && y[3] == ldexpf(1.0f, -24));
    zt_st_close(&f);
}

static void test_safetensors_malformed(void)
{
    if (rank != 0) return;
    static const struct { const char *hdr; size_t dlen; const char *needle; } cases[] = {
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[5,6],\"data_offsets\":[0,100]}}", 200,
          "tensor x: data_offsets span 100 bytes, dtype F32 x shape (5, 6) needs 120" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "past the data section" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16, "overlaps" },
        { "{\"x\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, "unsupported dtype I64 of tensor x in bad.safetensors" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, "reversed" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16, "shape entry 0 is not a non-negative integer" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 16, "tensor x: shape entry 0 is not a non-negative integer" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2]}}", 16, "needs dtype, shape and data_offsets" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 16, "unexpected" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 16, "end of file expected" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 16, "expected" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "duplicate object key" },
        { "{\"x\\q\":{}}", 0, "invalid escape" },
        { "{\"__metadata__\":{\"a\":1}}", 0, "__metadata__ value \"a\" is not a string" },
        { "[1,2]", 0, "header is not a JSON object" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 16, "too big integer" },
        /* the data must be tiled exactly: no gap, no tail (the reference reader refuses both) */
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20, "tensor y: 4 unused bytes before" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "8 bytes after the last tensor" },
        { "{\"w\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, "unsupported dtype F64 of tensor w in bad.safetensors" },
        { "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, "unknown dtype Q4 of tensor w" },
        { "{\"x\\u0000\":{}}", 0, "NUL" },
        { "{\"\xff\":{}}", 0, "unable to decode byte 0xff" },
        { "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 16, "data_offsets needs 2" },
    };
    uint8_t buf[1024], zeros[256] = { 0 };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[ZT_ERRLEN] = "";
        size_t n = make_st(buf, cases[i].hdr, zeros, cases[i].dlen);
        zt_st_file_t f;
        int rc = zt_st_parse_buffer("bad.safetensors", buf, n, &f, err, sizeof err);
        CU_ASSERT_EQUAL(rc, -1);
        CU_ASSERT(strstr(err, "bad.safetensors") != NULL);
        if (!strstr(err, cases[i].needle)) printf("\n    case %zu: got \"%s\"", i, err);
        CU_ASSERT(strstr(err, cases[i].needle) != NULL);
    }
    /* header length beyond the file */
    char err[ZT_ERRLEN] = "";
    zt_st_file_t f;
    uint8_t big[16] = { 0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}' };
    CU_ASSERT_EQUAL(zt_st_parse_buffer("bad.safetensors", big, 10, &f, err, sizeof err), -1);
    CU_ASSERT(strstr(err, "exceeds the file") != NULL);
    /* and a valid one with metadata, escapes, empty tensor */
    size_t n = make_st(buf, "{\"__metadata__\":{\"format\":\"pt\\u00e9\"},"
                            "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                            "\"s\\/t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}  ",
                       zeros, 4);
    CU_ASSERT_EQUAL(zt_st_parse_buffer("ok.safetensors", buf, n, &f, err, sizeof err), 0);
    CU_ASSERT_EQUAL(f.ntensors, 2);
    CU_ASSERT(zt_st_find(&f, "s/t") == 1);
    zt_st_close(&f);
}

static const zt_test_t tests[] = {
    { "checksum is split independent", test_checksum_split_independent },
    { "consolidated round trip, 5-way write / 3-way read", test_roundtrip_consolidated },
    { "consolidated round trip, same split", test_roundtrip_consolidated_same_split },
    { "sharded round trip, 4-way write / 7-way read", test_roundtrip_sharded },
    { "sharded -> consolidate -> load", test_sharded_consolidate },
    { "latest pointer and keep_last", test_latest_and_keep_last },
    { "weights-only checkpoint", test_weights_only },
    { "error: format_version", test_error_format_version },
    { "error: missing tensor", test_error_missing_tensor },
    { "error: wrong shape", test_error_wrong_shape },
    { "error: NaN in weights", test_error_nan },
    { "error: truncated / not HDF5", test_error_truncated },
    { "error: save fails on every rank", test_error_write_fails_cleanly },
    { "safetensors round trip", test_safetensors_roundtrip },
    { "safetensors BF16/F16 import", test_safetensors_half_types },
    { "safetensors malformed headers", test_safetensors_malformed },
    { NULL, NULL },
};

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) {
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmpdir, sizeof tmpdir, "%s/zt_ckpt_test.XXXXXX", base);
        if (!mkdtemp(tmpdir)) zt_fatal("mkdtemp %s failed", tmpdir);
    }
    MPI_Bcast(tmpdir, sizeof tmpdir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) zt_fatal("freopen");
    table = make_table(2, 8, 11, 5);
    int rc = zt_test_run("ckpt", tests), worst;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free_table(table);
    if (rank == 0 && worst == 0 && !getenv("ZT_KEEP_TMP")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    MPI_Finalize();
    return worst;
}
