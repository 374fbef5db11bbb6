/* zt_ckpt.c — parallel HDF5 checkpoints (consolidated and sharded).
 *
 * Why it is shaped this way:
 * - The core works on lists of element ranges (zt_io_seg_t) rather than on the
 *   shard engine, so the same code serves save/load at any world size, the
 *   tests (synthetic ragged splits) and the tools (serial streaming).
 * - Consolidated files are written collectively through MPI-IO: every rank
 *   selects the union of its ranges of a dataset as at most three hyperslabs per
 *   range (partial first row, full rows, partial last row) and all ranks call
 *   H5Dwrite for every dataset, even with an empty selection, because the
 *   transfer is collective.
 * - Every failure is made collective before the next collective call (agree():
 *   the lowest failing rank's message is broadcast), so one bad rank yields the
 *   same error on every rank instead of a hang, and the previous checkpoint is
 *   never touched: files are written under .tmp names, synced, then renamed.
 * - Checksums are sums mod 2^64 of a hash of (index, bits): partial sums from
 *   any split add up to the same value, so they do not depend on world size. */
#define _GNU_SOURCE /* nftw */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "zt_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <hdf5.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zt_common.h"
#include "zt_log.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

static const char *group_path[3] = { "/model", "/optimizer/exp_avg", "/optimizer/exp_avg_sq" };

/* ---- small utilities --------------------------------------------------------- */

static int fault_kill_rank = -1;
static long fault_kill_step = -1;

void zt_ckpt_fault_save_kill(int rank, long step)
{
    fault_kill_rank = rank;
    fault_kill_step = step;
}

/* fault.kind = save_kill: dies here when this rank saves the chosen step. */
static void maybe_fault_kill(MPI_Comm comm, long step, const char *file)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    if (fault_kill_rank < 0 || rank != fault_kill_rank || step != fault_kill_step) return;
    fprintf(stderr, "ztrain: fault injection: killing rank %d during the save of step %ld (%s partly written)\n",
            rank, step, file);
    fflush(stderr);
    raise(SIGKILL);
    _exit(137); /* not reached */
}

uint64_t zt_ckpt_checksum(size_t start, const float *x, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        s += zt_splitmix64(zt_splitmix64((uint64_t)(start + i)) ^ bits);
    }
    return s;
}

/* Makes a local failure collective: returns 0 if every rank passed rc == 0, else
 * -1 on every rank with the lowest failing rank's message in err. */
static int agree(MPI_Comm comm, int rc, char *err, size_t errlen)
{
    int rank, size, mine, low;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    mine = rc ? rank : size;
    ZT_MPI(MPI_Allreduce(&mine, &low, 1, MPI_INT, MPI_MIN, comm));
    if (low == size) return 0;
    char buf[ZT_ERRLEN] = "";
    if (rank == low) snprintf(buf, sizeof buf, "%s", err);
    ZT_MPI(MPI_Bcast(buf, ZT_ERRLEN, MPI_CHAR, low, comm));
    if (errlen) snprintf(err, errlen, "%s", buf);
    return -1;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* "ckpt-<step>.h5" or "ckpt-<step>.shards" (exactly; no .tmp): step, else -1. */
static long ckpt_name_step(const char *name)
{
    long step;
    int n = 0;
    if (sscanf(name, "ckpt-%ld%n", &step, &n) != 1 || step < 0) return -1;
    if (!strcmp(name + n, ".h5") || !strcmp(name + n, ".shards")) return step;
    return -1;
}

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    if (ndim == 1) snprintf(buf, len, "(%" PRId64 ",)", shape[0]);
    else if (ndim == 2) snprintf(buf, len, "(%" PRId64 ", %" PRId64 ")", shape[0], shape[1]);
    else snprintf(buf, len, "(rank %d)", ndim);
}

/* ---- HDF5 attributes ---------------------------------------------------------- */

static int attr_write(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = (a < 0 || H5Awrite(a, mtype, v) < 0) ? -1 : 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

static int attr_i64(hid_t loc, const char *name, int64_t v)
{
    return attr_write(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}
static int attr_f64(hid_t loc, const char *name, double v)
{
    return attr_write(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}
static int attr_u64(hid_t loc, const char *name, uint64_t v)
{
    return attr_write(loc, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v);
}
/* Fixed-length strings: parallel HDF5 cannot write variable-length data collectively. */
static int attr_str(hid_t loc, const char *name, const char *s)
{
    hid_t ty = H5Tcopy(H5T_C_S1);
    H5Tset_size(ty, strlen(s) + 1);
    H5Tset_strpad(ty, H5T_STR_NULLTERM);
    int rc = attr_write(loc, name, ty, ty, s);
    H5Tclose(ty);
    return rc;
}

/* Opens a scalar (one-element) attribute of the given class; -1 if absent or not. */
static hid_t attr_open1(hid_t loc, const char *name, H5T_class_t cls, H5T_class_t cls2)
{
    if (H5Aexists(loc, name) <= 0) return -1;
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0) return -1;
    hid_t sp = H5Aget_space(a), ty = H5Aget_type(a);
    H5T_class_t c = ty >= 0 ? H5Tget_class(ty) : H5T_NO_CLASS;
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    if (sp >= 0) H5Sclose(sp);
    if (ty >= 0) H5Tclose(ty);
    if (np != 1 || (c != cls && c != cls2)) {
        H5Aclose(a);
        return -1;
    }
    return a;
}

/* A scalar attribute of class cls (a float may also be stored as an integer),
 * read as memtype into v. */
static int attr_get_scalar(hid_t loc, const char *name, H5T_class_t cls, hid_t memtype, void *v)
{
    hid_t a = attr_open1(loc, name, cls, H5T_INTEGER);
    if (a < 0) return -1;
    int rc = H5Aread(a, memtype, v) < 0 ? -1 : 0;
    H5Aclose(a);
    return rc;
}

static int attr_get_i64(hid_t loc, const char *name, int64_t *v)
{
    return attr_get_scalar(loc, name, H5T_INTEGER, H5T_NATIVE_INT64, v);
}

static int attr_get_u64(hid_t loc, const char *name, uint64_t *v)
{
    return attr_get_scalar(loc, name, H5T_INTEGER, H5T_NATIVE_UINT64, v);
}

static int attr_get_f64(hid_t loc, const char *name, double *v)
{
    return attr_get_scalar(loc, name, H5T_FLOAT, H5T_NATIVE_DOUBLE, v);
}

/* Reads a string attribute in any form h5py, h5dump users or other tools write:
 * variable- or fixed-length, ASCII or UTF-8, padded NULLTERM, NULLPAD or SPACEPAD.
 * Read in the file's own type (same size, padding and character set), so HDF5
 * converts nothing (its string conversion cuts the last character of an unterminated
 * fixed-length string, and a vlen read needs the stored character set); the padding
 * is removed here. Returns malloc'ed text, or NULL. */
static char *attr_get_str(hid_t loc, const char *name)
{
    hid_t a = attr_open1(loc, name, H5T_STRING, H5T_STRING);
    if (a < 0) return NULL;
    char *out = NULL;
    hid_t ft = H5Aget_type(a);
    hid_t mt = ft >= 0 ? H5Tcopy(ft) : -1;
    htri_t vl = mt >= 0 ? H5Tis_variable_str(mt) : -1;
    if (vl > 0) {
        hid_t sp = H5Aget_space(a);
        char *vs = NULL;
        if (sp >= 0 && H5Aread(a, mt, &vs) >= 0) {
            out = strdup(vs ? vs : "");
            if (!out) zt_fatal("out of memory");
            if (H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, &vs) < 0) {
                free(out);
                out = NULL;
            }
        }
        if (sp >= 0) H5Sclose(sp);
    } else if (vl == 0) {
        size_t sz = H5Tget_size(mt);
        H5T_str_t pad = H5Tget_strpad(mt);
        if (sz > 0 && sz < (64u << 20) && pad >= 0) {
            out = zt_calloc(sz + 1, 1);
            if (H5Aread(a, mt, out) < 0) {
                free(out);
                out = NULL;
            } else {
                size_t n = strnlen(out, sz);    /* NULLTERM and NULLPAD end at the first NUL */
                if (pad == H5T_STR_SPACEPAD)
                    while (n > 0 && out[n - 1] == ' ') n--;
                out[n] = 0;
            }
        }
    }
    if (mt >= 0) H5Tclose(mt);
    if (ft >= 0) H5Tclose(ft);
    H5Aclose(a);
    return out;
}

/* Does an absolute link path like "/optimizer/exp_avg/x" exist (every level)? */
static int path_exists(hid_t f, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (H5Lexists(f, buf, H5P_DEFAULT) <= 0) return 0;
            *p = c;
            if (!c) return 1;
        }
    }
}

/* ---- metadata ------------------------------------------------------------------ */

static int write_meta(hid_t f, const zt_ckpt_meta_t *m, const char *config, int has_opt)
{
    int rc = 0;
    rc |= attr_str(f, "format", ZT_CKPT_FORMAT);
    rc |= attr_i64(f, "format_version", ZT_CKPT_VERSION);
    rc |= attr_i64(f, "step", m->step);
    rc |= attr_f64(f, "tokens_seen", m->tokens_seen);
    rc |= attr_i64(f, "samples_seen", m->samples_seen);
    rc |= attr_i64(f, "world_size", m->world_size);
    rc |= attr_str(f, "strategy", m->strategy);
    rc |= attr_str(f, "ztrain_version", PACKAGE_VERSION);
    rc |= attr_str(f, "config", config ? config : "");
    rc |= attr_i64(f, "weights_only", !has_opt);
    rc |= attr_str(f, "checksum_algorithm", "sum64(zt_splitmix64(zt_splitmix64(index) ^ fp32_bits))");
    if (has_opt) {
        hid_t g = H5Gopen2(f, "/optimizer", H5P_DEFAULT);
        if (g < 0) return -1;
        rc |= attr_i64(g, "step", m->adam_step);
        rc |= attr_f64(g, "lr", m->lr);
        rc |= attr_f64(g, "beta1", m->beta1);
        rc |= attr_f64(g, "beta2", m->beta2);
        rc |= attr_f64(g, "eps", m->eps);
        rc |= attr_f64(g, "weight_decay", m->weight_decay);
        if (m->loss_scale > 0) {
            rc |= attr_f64(g, "loss_scale", m->loss_scale);
            rc |= attr_i64(g, "loss_scale_good_steps", m->loss_scale_good_steps);
        }
        H5Gclose(g);
    }
    hid_t d = H5Gcreate2(f, "/data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (d < 0) return -1;
    rc |= attr_i64(d, "samples_seen", m->samples_seen);
    rc |= attr_i64(d, "seed", m->data_seed);
    rc |= attr_i64(d, "shuffle", m->shuffle);
    H5Gclose(d);
    return rc ? -1 : 0;
}

/* Reads and validates the metadata; optimizer and data attributes only when need_opt. */
static int read_meta(hid_t f, const char *fname, zt_ckpt_meta_t *m, char **config, int need_opt,
                     char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    char *fmt = attr_get_str(f, "format");
    if (!fmt) return zt_err(err, errlen, "%s: not a ztrain checkpoint (no root attribute \"format\")", fname);
    int ok = !strcmp(fmt, ZT_CKPT_FORMAT);
    if (!ok) zt_err(err, errlen, "%s: format is \"%.64s\", expected \"%s\"", fname, fmt, ZT_CKPT_FORMAT);
    free(fmt);
    if (!ok) return -1;
    int64_t v = 0, ws = 0;
    if (attr_get_i64(f, "format_version", &v))
        return zt_err(err, errlen, "%s: root attribute format_version is missing", fname);
    if (v != ZT_CKPT_VERSION)
        return zt_err(err, errlen, "%s: format_version %" PRId64 " is not supported (this ztrain reads %d)",
                      fname, v, ZT_CKPT_VERSION);
    int64_t step, samples;
    if (attr_get_i64(f, "step", &step) || attr_get_f64(f, "tokens_seen", &m->tokens_seen) ||
        attr_get_i64(f, "samples_seen", &samples) || attr_get_i64(f, "world_size", &ws))
        return zt_err(err, errlen, "%s: root attributes step, tokens_seen, samples_seen, world_size are required",
                      fname);
    m->step = step;
    m->samples_seen = samples;
    m->world_size = (int)ws;
    char *st = attr_get_str(f, "strategy");
    snprintf(m->strategy, sizeof m->strategy, "%s", st ? st : "");
    free(st);
    if (config) {
        *config = attr_get_str(f, "config");
        if (!*config) *config = strdup("");
    }
    if (!need_opt) return 0;
    hid_t g = H5Lexists(f, "optimizer", H5P_DEFAULT) > 0 ? H5Gopen2(f, "/optimizer", H5P_DEFAULT) : -1;
    double lr, b1, b2, eps, wd;
    if (g < 0 || attr_get_i64(g, "step", &v) || attr_get_f64(g, "lr", &lr) || attr_get_f64(g, "beta1", &b1) ||
        attr_get_f64(g, "beta2", &b2) || attr_get_f64(g, "eps", &eps) || attr_get_f64(g, "weight_decay", &wd)) {
        if (g >= 0) H5Gclose(g);
        if (config) { free(*config); *config = NULL; }
        return zt_err(err, errlen, "%s: no optimizer state (/optimizer attributes step, lr, beta1, beta2, eps, "
                      "weight_decay); a weights-only checkpoint can only be used with model.init_from", fname);
    }
    /* fp16 loss scaling state: optional (only fp16 runs write it) */
    double ls = 0;
    int64_t good = 0;
    int has_ls = attr_get_f64(g, "loss_scale", &ls) == 0;
    if (has_ls && (!(ls > 0) || !isfinite(ls) || attr_get_i64(g, "loss_scale_good_steps", &good) || good < 0)) {
        H5Gclose(g);
        if (config) { free(*config); *config = NULL; }
        return zt_err(err, errlen, "%s: /optimizer attribute loss_scale (%g) must be finite and > 0, with "
                      "loss_scale_good_steps >= 0", fname, ls);
    }
    H5Gclose(g);
    m->loss_scale = has_ls ? ls : 0;
    m->loss_scale_good_steps = (long)good;
    m->adam_step = v;
    m->lr = (float)lr; m->beta1 = (float)b1; m->beta2 = (float)b2; m->eps = (float)eps;
    m->weight_decay = (float)wd;
    hid_t d = H5Lexists(f, "data", H5P_DEFAULT) > 0 ? H5Gopen2(f, "/data", H5P_DEFAULT) : -1;
    int64_t seed = 0, shuf = 0;
    if (d < 0 || attr_get_i64(d, "seed", &seed) || attr_get_i64(d, "shuffle", &shuf)) {
        if (d >= 0) H5Gclose(d);
        if (config) { free(*config); *config = NULL; }
        return zt_err(err, errlen, "%s: /data attributes seed and shuffle are missing", fname);
    }
    H5Gclose(d);
    m->data_seed = seed;
    m->shuffle = (int)shuf;
    return 0;
}

/* ---- range selections ------------------------------------------------------------ */

typedef struct { size_t start, len, pos; } run_t;

/* Adds element range [s, s+len) of a row-major (R, C) or (N) dataset to the selection. */
static int select_range(hid_t space, int ndim, const hsize_t *dims, size_t s, size_t len, int *first)
{
    hsize_t st[2], ct[2];
#define ZT_ADD()                                                                                      \
    do {                                                                                              \
        if (H5Sselect_hyperslab(space, *first ? H5S_SELECT_SET : H5S_SELECT_OR, st, NULL, ct, NULL) < 0) \
            return -1;                                                                                \
        *first = 0;                                                                                   \
    } while (0)
    if (len == 0) return 0;
    if (ndim == 1) {
        st[0] = s; ct[0] = len;
        ZT_ADD();
        return 0;
    }
    size_t C = dims[1];
    if (s % C) {        /* partial first row */
        size_t n = ZT_MIN(len, C - s % C);
        st[0] = s / C; st[1] = s % C; ct[0] = 1; ct[1] = n;
        ZT_ADD();
        s += n; len -= n;
    }
    if (len >= C) {     /* full rows */
        st[0] = s / C; st[1] = 0; ct[0] = len / C; ct[1] = C;
        ZT_ADD();
        s += (len / C) * C; len %= C;
    }
    if (len) {          /* partial last row */
        st[0] = s / C; st[1] = 0; ct[0] = 1; ct[1] = len;
        ZT_ADD();
    }
#undef ZT_ADD
    return 0;
}


static const zt_io_seg_t *sort_base;
static int cmp_seg(const void *a, const void *b)
{
    const zt_io_seg_t *x = &sort_base[*(const int *)a], *y = &sort_base[*(const int *)b];
    if (x->param != y->param) return x->param < y->param ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Indices of segs sorted by (param, start); first[p]..first[p+1] are param p's. */
static int *sort_segs(const zt_io_seg_t *segs, int nsegs, int nparams, int **first_out)
{

    int *ord = zt_malloc((size_t)(nsegs + 1) * sizeof *ord);
    for (int i = 0; i < nsegs; i++) ord[i] = i;
    sort_base = segs;
    qsort(ord, (size_t)nsegs, sizeof *ord, cmp_seg);
    int *first = zt_calloc((size_t)nparams + 1, sizeof *first);
    int k = 0;
    for (int p = 0; p <= nparams; p++) {
        while (k < nsegs && segs[ord[k]].param < p) k++;
        first[p] = k;
    }
    *first_out = first;
    return ord;
}

/* Union of the ranges of segs ord[0..n) (sorted by start) as runs with packed
 * positions; segpos[k] is seg ord[k]'s position in the packed buffer. */
static size_t build_runs(const zt_io_seg_t *segs, const int *ord, int n, run_t *runs, int *nrun,
                         size_t *segpos)
{
    size_t total = 0;
    *nrun = 0;
    for (int k = 0; k < n; k++) {
        const zt_io_seg_t *g = &segs[ord[k]];
        if (g->len == 0) { segpos[k] = total; continue; }
        run_t *r = *nrun ? &runs[*nrun - 1] : NULL;
        if (r && g->start <= r->start + r->len) {
            size_t end = ZT_MAX(r->start + r->len, g->start + g->len);
            total += end - (r->start + r->len);
            r->len = end - r->start;
        } else {
            r = &runs[(*nrun)++];
            r->start = g->start;
            r->len = g->len;
            r->pos = total;
            total += g->len;
        }
        segpos[k] = r->pos + (g->start - r->start);
    }
    return total;
}

static float *seg_ptr(const zt_io_seg_t *g, int group)
{
    return group == 0 ? g->value : group == 1 ? g->exp_avg : g->exp_avg_sq;
}

/* ---- consolidated writer ----------------------------------------------------------- */

static hid_t create_groups(hid_t f, int has_opt)
{
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    /* creation order lets tools list tensors in model order */
    H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    int rc = 0;
    hid_t g = H5Gcreate2(f, "/model", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    rc |= g < 0;
    if (g >= 0) H5Gclose(g);
    if (has_opt) {
        g = H5Gcreate2(f, "/optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        rc |= g < 0;
        if (g >= 0) H5Gclose(g);
        for (int k = 1; k < 3; k++) {
            g = H5Gcreate2(f, group_path[k], H5P_DEFAULT, gcpl, H5P_DEFAULT);
            rc |= g < 0;
            if (g >= 0) H5Gclose(g);
        }
    }
    H5Pclose(gcpl);
    return rc ? -1 : 0;
}

static hid_t create_dataset(hid_t f, int group, const zt_param_t *p)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", group_path[group], p->name);
    hsize_t dims[2] = { (hsize_t)p->shape[0], p->ndim == 2 ? (hsize_t)p->shape[1] : 1 };
    hid_t sp = H5Screate_simple(p->ndim, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(dcpl, H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);     /* every element is written */
    hid_t d = H5Dcreate2(f, path, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    H5Sclose(sp);
    return d;
}

/* Writes (or reads, when reading) the ranges ord[0..n) of one dataset; collective when
 * dxpl says so, so it is called on every rank even with n == 0. */
static int transfer(hid_t d, int reading, int group, const zt_io_seg_t *segs, const int *ord, int n,
                    hid_t dxpl)
{
    run_t *runs = zt_malloc((size_t)(n + 1) * sizeof *runs);
    size_t *segpos = zt_malloc((size_t)(n + 1) * sizeof *segpos);
    int nrun;
    size_t total = build_runs(segs, ord, n, runs, &nrun, segpos);
    hid_t fs = H5Dget_space(d);
    int ndim = H5Sget_simple_extent_ndims(fs);
    hsize_t dims[2] = { 0, 0 };
    H5Sget_simple_extent_dims(fs, dims, NULL);
    int rc = 0, first = 1;
    H5Sselect_none(fs);
    for (int i = 0; i < nrun && !rc; i++) rc = select_range(fs, ndim, dims, runs[i].start, runs[i].len, &first);
    hsize_t mdim = total ? total : 1;
    hid_t ms = H5Screate_simple(1, &mdim, NULL);
    if (!total) H5Sselect_none(ms);
    float *buf = zt_malloc((total ? total : 1) * sizeof(float));
    if (!reading)
        for (int k = 0; k < n; k++) {
            const zt_io_seg_t *g = &segs[ord[k]];
            memcpy(buf + segpos[k], seg_ptr(g, group), g->len * sizeof(float));
        }
    if (!rc) {
        if (reading) rc = H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf) < 0 ? -1 : 0;
        else rc = H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, buf) < 0 ? -1 : 0;
    }
    if (reading && !rc)
        for (int k = 0; k < n; k++) {
            const zt_io_seg_t *g = &segs[ord[k]];
            memcpy(seg_ptr(g, group), buf + segpos[k], g->len * sizeof(float));
        }
    free(buf);
    H5Sclose(ms);
    H5Sclose(fs);
    free(runs);
    free(segpos);
    return rc;
}

static void bcast_inputs(MPI_Comm comm, zt_ckpt_meta_t *m, const char *config_text, char **cfg)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    ZT_MPI(MPI_Bcast(m, (int)sizeof *m, MPI_BYTE, 0, comm));
    long len = rank == 0 ? (long)strlen(config_text ? config_text : "") : 0;
    ZT_MPI(MPI_Bcast(&len, 1, MPI_LONG, 0, comm));
    *cfg = zt_malloc((size_t)len + 1);
    if (rank == 0) memcpy(*cfg, config_text ? config_text : "", (size_t)len);
    (*cfg)[len] = 0;
    ZT_MPI(MPI_Bcast(*cfg, (int)len, MPI_CHAR, 0, comm));
}

/* After a failed write the file is removed anyway: empty it before closing, so that on a
 * full disk the metadata that H5Fclose must still flush fits. A failed H5Fclose is fatal
 * later: HDF5 1.10 then frees the file but keeps its ID, and every rank crashes in
 * H5F__close_cb when the library shuts down at MPI_Finalize or exit. */
static void empty_failed_file(const char *path)
{
    if (truncate(path, 0) != 0 && errno != ENOENT)
        fprintf(stderr, "ztrain: warning: %s: cannot empty the failed file: %s\n", path, strerror(errno));
}

/* Reserves bytes of disk space for a file just created (fallocate), so that a full disk
 * or a file-size limit is found before any data is written, when closing needs almost
 * no space. 0 also where the filesystem cannot reserve (EOPNOTSUPP: nothing is checked
 * there beyond the writes themselves). The file then ends at `bytes`; trim_to_eoa
 * cuts it back to what HDF5 used. */
static int reserve_space(const char *path, double bytes, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0) return zt_err(err, errlen, "%s: cannot open to reserve space: %s", path, strerror(errno));
    int rc = fallocate(fd, 0, 0, (off_t)bytes) != 0 ? errno : 0;
    close(fd);
    if (rc == 0 || rc == EOPNOTSUPP || rc == ENOSYS) return 0;
    char b[32];
    return zt_err(err, errlen, "%s: cannot reserve %s for the checkpoint: %s", path, zt_fmt_bytes(bytes, b, sizeof b),
                  strerror(rc));
}

/* The end of the file's allocated space before it is closed (closing never grows it). */
static haddr_t file_eoa(hid_t f)
{
    haddr_t eoa = HADDR_UNDEF;
    return H5Fget_eoa(f, &eoa) < 0 ? HADDR_UNDEF : eoa;
}

/* After a successful close: drop what reserve_space reserved beyond the HDF5 data. */
static int trim_to_eoa(const char *path, haddr_t eoa, char *err, size_t errlen)
{
    struct stat st;
    if (eoa == HADDR_UNDEF || stat(path, &st) != 0 || (haddr_t)st.st_size <= eoa) return 0;
    if (truncate(path, (off_t)eoa) != 0)
        return zt_err(err, errlen, "%s: cannot trim the reserved space: %s", path, strerror(errno));
    return 0;
}

/* Space for a consolidated file: the data plus a generous bound on its metadata
 * (object headers, the groups' creation-order indexes, the config attribute). */
static double file_bytes_bound(const zt_param_table_t *t, int ngroups, const char *cfg)
{
    double b = 32768.0 + 2.0 * (double)strlen(cfg ? cfg : "") + 8192.0;
    for (int p = 0; p < t->nparams; p++) b += ngroups * ((double)t->params[p].numel * 4.0 + 1024.0);
    return b;
}

static int write_consolidated(const char *tmp, const zt_ckpt_meta_t *m, const char *cfg, int has_opt,
                              const uint64_t *sums, const zt_io_seg_t *segs, const int *ord,
                              const int *first, const zt_param_table_t *t, MPI_Comm comm, char *err,
                              size_t errlen)
{
    int rank;
    MPI_Comm_rank(comm, &rank);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
    /* 1.8 object headers: large attributes (the config text) and creation order */
    if (fapl < 0 || H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0 ||
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18) < 0)
        f = -2;
    else
        f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (fapl >= 0) H5Pclose(fapl);
    int rc = f == -2 ? zt_err(err, errlen, "%s: cannot set up the MPI-IO file access", tmp)
             : f < 0 ? zt_err(err, errlen, "%s: cannot create checkpoint file", tmp) : 0;
    if (agree(comm, rc, err, errlen)) {
        if (f >= 0) H5Fclose(f);
        return -1;
    }
    int ngroups = has_opt ? 3 : 1;
    if (rank == 0) rc = reserve_space(tmp, file_bytes_bound(t, ngroups, cfg), err, errlen);
    if (!agree(comm, rc, err, errlen) && (create_groups(f, has_opt) || write_meta(f, m, cfg, has_opt)))
        rc = zt_err(err, errlen, "%s: writing metadata failed", tmp);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    if ((dxpl < 0 || H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) < 0) && !rc)
        rc = zt_err(err, errlen, "%s: cannot set up collective transfers", tmp);
    rc = agree(comm, rc, err, errlen);
    /* every rank stops at the same tensor after the first failure (disk full: the rest
     * would only fail too) */
    for (int g = 0; g < ngroups && !rc; g++)
        for (int p = 0; p < t->nparams && !rc; p++) {
            hid_t d = create_dataset(f, g, &t->params[p]);
            if (d < 0) {   /* a collective create fails on every rank alike */
                rc = zt_err(err, errlen, "%s: cannot create dataset %s/%s", tmp, group_path[g], t->params[p].name);
            } else {
                if (attr_u64(d, "checksum", sums[g * t->nparams + p]))
                    rc = zt_err(err, errlen, "%s: cannot write checksum of %s/%s", tmp, group_path[g],
                                t->params[p].name);
                if (transfer(d, 0, g, segs, ord + first[p], first[p + 1] - first[p], dxpl) && !rc)
                    rc = zt_err(err, errlen, "%s: writing %s/%s failed", tmp, group_path[g], t->params[p].name);
                if (H5Dclose(d) < 0 && !rc)
                    rc = zt_err(err, errlen, "%s: closing %s/%s failed", tmp, group_path[g], t->params[p].name);
                if (g == 0 && p == 0) maybe_fault_kill(comm, m->step, tmp);
            }
            rc = agree(comm, rc, err, errlen);
        }
    if (dxpl >= 0) H5Pclose(dxpl);
    if (rc) {
        if (rank == 0) empty_failed_file(tmp);
        ZT_MPI(MPI_Barrier(comm));
    }
    haddr_t eoa = file_eoa(f);
    if (H5Fclose(f) < 0 && !rc) rc = zt_err(err, errlen, "%s: closing (flushing) the file failed", tmp);
    if (!rc && rank == 0) rc = trim_to_eoa(tmp, eoa, err, errlen);
    return agree(comm, rc, err, errlen);
}

/* ---- sharded writer -------------------------------------------------------------- */

static int write_1d(hid_t f, const char *name, hid_t ftype, hid_t mtype, size_t n, const void *buf)
{
    hsize_t dim = n;
    hid_t sp = H5Screate_simple(1, &dim, NULL);
    hid_t d = H5Dcreate2(f, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = d < 0 ? -1 : 0;
    if (!rc && n) rc = H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0 ? -1 : 0;
    if (d >= 0) H5Dclose(d);
    H5Sclose(sp);
    return rc;
}

/* rank-<r>.h5: this rank's write segments, in the order given (param, start, len, data). */
static int write_shard_file(const char *path, int rank, int size, int has_opt, const zt_io_seg_t *segs,
                            int nsegs, char *err, size_t errlen)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return zt_err(err, errlen, "%s: cannot create shard file", path);
    size_t total = 0;
    int32_t *param = zt_malloc((size_t)(nsegs + 1) * sizeof *param);
    uint64_t *start = zt_malloc((size_t)(nsegs + 1) * sizeof *start);
    uint64_t *len = zt_malloc((size_t)(nsegs + 1) * sizeof *len);
    for (int i = 0; i < nsegs; i++) {
        param[i] = segs[i].param;
        start[i] = segs[i].start;
        len[i] = segs[i].len;
        total += segs[i].len;
    }
    double bound = 16384.0 + (double)nsegs * 20.0 + (double)total * 4.0 * (has_opt ? 3 : 1);
    if (reserve_space(path, bound, err, errlen)) {
        empty_failed_file(path);
        H5Fclose(f);
        free(param);
        free(start);
        free(len);
        return -1;
    }
    int rc = attr_i64(f, "rank", rank) | attr_i64(f, "world_size", size);
    rc |= write_1d(f, "param", H5T_STD_I32LE, H5T_NATIVE_INT32, (size_t)nsegs, param);
    rc |= write_1d(f, "start", H5T_STD_U64LE, H5T_NATIVE_UINT64, (size_t)nsegs, start);
    rc |= write_1d(f, "len", H5T_STD_U64LE, H5T_NATIVE_UINT64, (size_t)nsegs, len);
    float *buf = zt_malloc((total ? total : 1) * sizeof(float));
    static const char *dnames[3] = { "value", "exp_avg", "exp_avg_sq" };
    for (int g = 0; g < (has_opt ? 3 : 1); g++) {
        size_t k = 0;
        for (int i = 0; i < nsegs; i++) {
            memcpy(buf + k, seg_ptr(&segs[i], g), segs[i].len * sizeof(float));
            k += segs[i].len;
        }
        rc |= write_1d(f, dnames[g], H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, total, buf);
    }
    free(buf);
    free(param);
    free(start);
    free(len);
    if (rc) empty_failed_file(path);    /* see empty_failed_file */
    haddr_t eoa = file_eoa(f);
    if (H5Fclose(f) < 0) rc = -1;
    if (!rc && (trim_to_eoa(path, eoa, err, errlen) || zt_fsync_path(path) != 0)) rc = -1;
    if (rc) return zt_err(err, errlen, "%s: writing shard file failed", path);
    return 0;
}

/* index.h5: metadata plus the tensor table and checksums (written by rank 0). */
static int write_index(const char *path, const zt_ckpt_meta_t *m, const char *cfg, int has_opt,
                       int size, const uint64_t *sums, const zt_param_table_t *t, char *err, size_t errlen)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) return zt_err(err, errlen, "%s: cannot create index", path);
    int n = t->nparams, rc = 0;
    if (has_opt) {
        hid_t g = H5Gcreate2(f, "/optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        rc |= g < 0;
        if (g >= 0) H5Gclose(g);
    }
    rc |= write_meta(f, m, cfg, has_opt);
    rc |= attr_i64(f, "shard_count", size);
    rc |= attr_str(f, "layout", "sharded");
    char *names = zt_calloc((size_t)n ? (size_t)n : 1, 96);
    int32_t *ndim = zt_malloc(((size_t)n + 1) * sizeof *ndim);
    int64_t *shape = zt_malloc(((size_t)n + 1) * 2 * sizeof *shape);
    for (int p = 0; p < n; p++) {
        snprintf(names + 96 * p, 96, "%s", t->params[p].name);
        ndim[p] = t->params[p].ndim;
        shape[2 * p] = t->params[p].shape[0];
        shape[2 * p + 1] = t->params[p].ndim == 2 ? t->params[p].shape[1] : 1;
    }
    hid_t sty = H5Tcopy(H5T_C_S1);
    H5Tset_size(sty, 96);
    rc |= write_1d(f, "names", sty, sty, (size_t)n, names);
    H5Tclose(sty);
    rc |= write_1d(f, "ndim", H5T_STD_I32LE, H5T_NATIVE_INT32, (size_t)n, ndim);
    rc |= write_1d(f, "shape", H5T_STD_I64LE, H5T_NATIVE_INT64, 2 * (size_t)n, shape);
    rc |= write_1d(f, "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, (size_t)n * (has_opt ? 3 : 1), sums);
    free(names);
    free(ndim);
    free(shape);
    if (rc) empty_failed_file(path);    /* see empty_failed_file */
    if (H5Fclose(f) < 0) rc = -1;
    if (!rc && zt_fsync_path(path) != 0) rc = -1;
    return rc ? zt_err(err, errlen, "%s: writing the index failed", path) : 0;
}

/* ---- publishing ------------------------------------------------------------------- */

/* A file saved beside checkpoint <step>, which goes with it: "onebit-<step>.h5", 1-bit
 * Adam's error feedback (see below);
 * "prefref-<step>.h5": DPO's reference table saved with it (zt_pref_table.h) */
static long side_file_step(const char *name)
{
    long step;
    int n = 0;
    if ((sscanf(name, "onebit-%ld%n", &step, &n) != 1 && sscanf(name, "prefref-%ld%n", &step, &n) != 1) || step < 0)
        return -1;
    return strcmp(name + n, ".h5") ? -1 : step;
}

static int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void apply_keep_last(const char *dir, int keep_last, const char *keep_name)
{
    DIR *dp = opendir(dir);
    if (!dp) return;
    long steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)) && n < 4096) {
        long s = ckpt_name_step(e->d_name);
        if (s >= 0) steps[n++] = s;
    }
    qsort(steps, (size_t)n, sizeof *steps, cmp_long_desc);
    rewinddir(dp);
    while ((e = readdir(dp))) {
        long s = ckpt_name_step(e->d_name);
        if (s < 0) s = side_file_step(e->d_name); /* goes with its checkpoint */
        if (s < 0 || !strcmp(e->d_name, keep_name)) continue;
        int rank = 0;   /* how many checkpoints are newer */
        while (rank < n && steps[rank] > s) rank++;
        if (rank >= keep_last) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            zt_rm_rf(p);
        }
    }
    closedir(dp);
}

/* tmp -> final, then latest -> final (each step synced). Rank 0 only. */
static int publish(const char *dir, const char *tmp, const char *final, const char *name, int keep_last,
                   char *err, size_t errlen)
{
    if (zt_fsync_path(tmp) != 0) return zt_err(err, errlen, "%s: fsync failed: %s", tmp, strerror(errno));
    if (exists(final)) zt_rm_rf(final);
    if (rename(tmp, final) != 0)
        return zt_err(err, errlen, "%s: rename to %s failed: %s", tmp, final, strerror(errno));
    zt_fsync_path(dir);
    char lt[PATH_MAX], l[PATH_MAX];
    snprintf(lt, sizeof lt, "%s/latest.tmp", dir);
    snprintf(l, sizeof l, "%s/latest", dir);
    FILE *fp = fopen(lt, "w");
    if (!fp) return zt_err(err, errlen, "%s: cannot write: %s", lt, strerror(errno));
    int ok = fprintf(fp, "%s\n", name) > 0;
    ok &= fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    ok &= fclose(fp) == 0;
    if (!ok || rename(lt, l) != 0) return zt_err(err, errlen, "%s: cannot update: %s", l, strerror(errno));
    zt_fsync_path(dir);
    if (keep_last > 0) apply_keep_last(dir, keep_last, name);
    return 0;
}

int zt_ckpt_write_segments(const char *dir, zt_ckpt_meta_t *meta, const char *config_text,
                           int sharded, int keep_last, const zt_io_seg_t *segs, int nsegs,
                           const zt_param_table_t *t, MPI_Comm comm, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    ZT_MPI(MPI_Barrier(comm));
    double t0 = zt_now();
    zt_ckpt_meta_t m = *meta;
    char *cfg;
    bcast_inputs(comm, &m, config_text, &cfg);
    m.world_size = size;
    int rc = 0;
    for (int i = 0; i < nsegs && !rc; i++)
        if (segs[i].param < 0 || segs[i].param >= t->nparams ||
            segs[i].start + segs[i].len > t->params[segs[i].param].numel)
            rc = zt_err(err, errlen, "checkpoint: segment %d (param %d, [%zu, +%zu)) is outside the table", i,
                        segs[i].param, segs[i].start, segs[i].len);
    if (rank == 0 && !rc) rc = zt_mkdir_p(dir, err, errlen);
    if (agree(comm, rc, err, errlen)) { free(cfg); return -1; }

    int has_opt = 1, all_opt;
    for (int i = 0; i < nsegs; i++)
        if (!segs[i].exp_avg || !segs[i].exp_avg_sq) has_opt = 0;
    ZT_MPI(MPI_Allreduce(&has_opt, &all_opt, 1, MPI_INT, MPI_MIN, comm));
    has_opt = all_opt;
    int ngroups = has_opt ? 3 : 1, np = t->nparams;
    uint64_t *sums = zt_calloc((size_t)ngroups * np + 1, sizeof *sums);
    for (int i = 0; i < nsegs; i++)
        for (int g = 0; g < ngroups; g++)
            sums[g * np + segs[i].param] += zt_ckpt_checksum(segs[i].start, seg_ptr(&segs[i], g), segs[i].len);
    ZT_MPI(MPI_Allreduce(MPI_IN_PLACE, sums, ngroups * np, MPI_UINT64_T, MPI_SUM, comm));

    char name[64], tmp[PATH_MAX + 8], final[PATH_MAX];
    snprintf(name, sizeof name, sharded ? "ckpt-%08ld.shards" : "ckpt-%08ld.h5", m.step);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    if (!sharded) {
        int *first;
        int *ord = sort_segs(segs, nsegs, np, &first);
        rc = write_consolidated(tmp, &m, cfg, has_opt, sums, segs, ord, first, t, comm, err, errlen);
        free(ord);
        free(first);
    } else {
        if (rank == 0) {
            zt_rm_rf(tmp);
            if (mkdir(tmp, 0755) != 0) rc = zt_err(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        }
        if (!agree(comm, rc, err, errlen)) {
            char p[PATH_MAX + 32];
            snprintf(p, sizeof p, "%s/rank-%d.h5", tmp, rank);
            rc = write_shard_file(p, rank, size, has_opt, segs, nsegs, err, errlen);
            maybe_fault_kill(comm, m.step, p);
            if (rank == 0 && !rc) {
                snprintf(p, sizeof p, "%s/index.h5", tmp);
                rc = write_index(p, &m, cfg, has_opt, size, sums, t, err, errlen);
            }
            rc = agree(comm, rc, err, errlen);
        } else {
            rc = -1;
        }
    }
    if (!rc) {
        if (rank == 0) rc = publish(dir, tmp, final, name, keep_last, err, errlen);
        rc = agree(comm, rc, err, errlen);
    }
    ZT_MPI(MPI_Barrier(comm));
    if (rc && rank == 0) zt_rm_rf(tmp);
    free(sums);
    free(cfg);
    if (rc) return -1;
    double bytes = 0;
    for (int p = 0; p < np; p++) bytes += (double)t->params[p].numel * 4.0 * ngroups;
    meta->bytes = bytes;
    meta->world_size = size;
    meta->save_seconds = zt_now() - t0;
    return 0;
}

/* ---- sharded reader ------------------------------------------------------------------ */

typedef struct {
    hid_t f;
    int nseg;
    int32_t *param;
    uint64_t *start, *len, *off;   /* off: position of the segment in the data arrays */
    hid_t data[3];
} shard_file_t;

struct zt_ckpt_reader {
    char path[PATH_MAX];
    int sharded;
    hid_t f;                    /* consolidated file, or the shard index */
    zt_ckpt_meta_t meta;
    char *config;
    int has_opt;
    zt_param_table_t table;
    uint64_t *sums;             /* (3, n) from the index (sharded) */
    int nshards;
    shard_file_t *shards;
    hid_t open_d;               /* consolidated: cached dataset of (open_g, open_p) */
    int open_g, open_p;
};

static int read_1d(hid_t f, const char *name, hid_t mtype, size_t n, void *buf)
{
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return -1;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t sp = H5Dget_space(d);
    int rc = (H5Sget_simple_extent_ndims(sp) == 1 && H5Sget_simple_extent_npoints(sp) == (hssize_t)n) ? 0 : -1;
    H5Sclose(sp);
    if (!rc && n) rc = H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0 ? -1 : 0;
    H5Dclose(d);
    return rc;
}

static hssize_t len_1d(hid_t f, const char *name)
{
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) return -1;
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t sp = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_ndims(sp) == 1 ? H5Sget_simple_extent_npoints(sp) : -1;
    H5Sclose(sp);
    H5Dclose(d);
    return n;
}

static void table_add(zt_param_table_t *t, const char *name, int ndim, const hsize_t *dims)
{
    t->params = realloc(t->params, (size_t)(t->nparams + 1) * sizeof *t->params);
    if (!t->params) zt_fatal("out of memory");
    zt_param_t *p = &t->params[t->nparams++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = (int64_t)dims[0];
    p->shape[1] = ndim == 2 ? (int64_t)dims[1] : 1;
    p->numel = (size_t)dims[0] * (ndim == 2 ? (size_t)dims[1] : 1);
    t->total_numel += p->numel;
}

typedef struct { zt_param_table_t *t; hid_t g; int bad; } iter_t;

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *op)
{
    (void)info;
    iter_t *it = op;
    H5O_info_t oi;
    if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET) return 0;
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    if (d < 0) return 0;
    hid_t sp = H5Dget_space(d);
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[H5S_MAX_RANK];
    if (nd == 1 || nd == 2) {
        H5Sget_simple_extent_dims(sp, dims, NULL);
        if (strlen(name) < 96) table_add(it->t, name, nd, dims);
        else it->bad = 1;
    } else {
        it->bad = 1;
    }
    H5Sclose(sp);
    H5Dclose(d);
    return it->t->nparams > 100000 ? 1 : 0;
}

static void shards_close(zt_ckpt_reader_t *r)
{
    for (int i = 0; i < r->nshards; i++) {
        shard_file_t *s = &r->shards[i];
        for (int g = 0; g < 3; g++)
            if (s->data[g] >= 0) H5Dclose(s->data[g]);
        if (s->f >= 0) H5Fclose(s->f);
        free(s->param);
        free(s->start);
        free(s->len);
        free(s->off);
    }
    free(r->shards);
    r->shards = NULL;
    r->nshards = 0;
}

void zt_ckpt_reader_close(zt_ckpt_reader_t *r)
{
    if (!r) return;
    if (r->open_d >= 0) H5Dclose(r->open_d);
    shards_close(r);
    if (r->f >= 0) H5Fclose(r->f);
    free(r->config);
    free(r->table.params);
    free(r->sums);
    free(r);
}

/* Reads the tensor table of a sharded index. */
static int index_tensors(zt_ckpt_reader_t *r, char *err, size_t errlen)
{
    hssize_t n = len_1d(r->f, "names");
    if (n < 0 || n > 1000000) return zt_err(err, errlen, "%s: index has no tensor table", r->path);
    char *names = zt_calloc((size_t)n + 1, 96);
    int32_t *ndim = zt_malloc(((size_t)n + 1) * sizeof *ndim);
    int64_t *shape = zt_malloc(((size_t)n + 1) * 2 * sizeof *shape);
    size_t nsum = (size_t)n * (r->has_opt ? 3 : 1);
    r->sums = zt_calloc(nsum + 1, sizeof *r->sums);
    hid_t sty = H5Tcopy(H5T_C_S1);
    H5Tset_size(sty, 96);
    int rc = read_1d(r->f, "names", sty, (size_t)n, names) | read_1d(r->f, "ndim", H5T_NATIVE_INT32, (size_t)n, ndim) |
             read_1d(r->f, "shape", H5T_NATIVE_INT64, 2 * (size_t)n, shape) |
             read_1d(r->f, "checksum", H5T_NATIVE_UINT64, nsum, r->sums);
    H5Tclose(sty);
    for (hssize_t p = 0; p < n && !rc; p++) {
        hsize_t dims[2] = { (hsize_t)shape[2 * p], (hsize_t)shape[2 * p + 1] };
        if ((ndim[p] != 1 && ndim[p] != 2) || shape[2 * p] < 0 || shape[2 * p + 1] < 0) rc = -1;
        else {
            names[96 * p + 95] = 0;
            table_add(&r->table, names + 96 * p, ndim[p], dims);
        }
    }
    free(names);
    free(ndim);
    free(shape);
    return rc ? zt_err(err, errlen, "%s: the index tensor table is malformed", r->path) : 0;
}

static int shards_open(zt_ckpt_reader_t *r, const char *dir, char *err, size_t errlen)
{
    int64_t n = 0;
    if (attr_get_i64(r->f, "shard_count", &n) || n < 1 || n > 1000000)
        return zt_err(err, errlen, "%s: index attribute shard_count is missing", dir);
    r->shards = zt_calloc((size_t)n, sizeof *r->shards);
    r->nshards = (int)n;
    for (int i = 0; i < n; i++) {
        shard_file_t *s = &r->shards[i];
        s->f = -1;
        for (int g = 0; g < 3; g++) s->data[g] = -1;
    }
    for (int i = 0; i < n; i++) {
        shard_file_t *s = &r->shards[i];
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/rank-%d.h5", dir, i);
        s->f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (s->f < 0) return zt_err(err, errlen, "%s: missing or unreadable shard file", p);
        hssize_t k = len_1d(s->f, "param");
        if (k < 0 || k > 100000000) return zt_err(err, errlen, "%s: malformed shard file (param)", p);
        s->nseg = (int)k;
        s->param = zt_malloc((size_t)(k + 1) * sizeof *s->param);
        s->start = zt_malloc((size_t)(k + 1) * sizeof *s->start);
        s->len = zt_malloc((size_t)(k + 1) * sizeof *s->len);
        s->off = zt_malloc((size_t)(k + 1) * sizeof *s->off);
        if (read_1d(s->f, "param", H5T_NATIVE_INT32, (size_t)k, s->param) ||
            read_1d(s->f, "start", H5T_NATIVE_UINT64, (size_t)k, s->start) ||
            read_1d(s->f, "len", H5T_NATIVE_UINT64, (size_t)k, s->len))
            return zt_err(err, errlen, "%s: malformed shard file (segment table)", p);
        uint64_t total = 0;
        for (int j = 0; j < k; j++) {
            if (s->param[j] < 0 || s->param[j] >= r->table.nparams ||
                s->start[j] + s->len[j] > r->table.params[s->param[j]].numel || s->start[j] + s->len[j] < s->start[j])
                return zt_err(err, errlen, "%s: segment %d is outside its tensor", p, j);
            s->off[j] = total;
            total += s->len[j];
        }
        static const char *dnames[3] = { "value", "exp_avg", "exp_avg_sq" };
        for (int g = 0; g < (r->has_opt ? 3 : 1); g++) {
            if (len_1d(s->f, dnames[g]) != (hssize_t)total)
                return zt_err(err, errlen, "%s: dataset %s has the wrong length", p, dnames[g]);
            s->data[g] = H5Dopen2(s->f, dnames[g], H5P_DEFAULT);
        }
    }
    return 0;
}

zt_ckpt_reader_t *zt_ckpt_reader_open(const char *path, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    zt_ckpt_reader_t *r = zt_calloc(1, sizeof *r);
    r->f = -1;
    r->open_d = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    char ip[PATH_MAX + 16];
    r->sharded = is_dir(path);
    if (r->sharded) snprintf(ip, sizeof ip, "%s/index.h5", path);
    else snprintf(ip, sizeof ip, "%s", path);
    if (!exists(ip)) {
        zt_err(err, errlen, "%s: no such checkpoint", path);
        goto fail;
    }
    r->f = H5Fopen(ip, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r->f < 0) {
        zt_err(err, errlen, "%s: not a readable HDF5 file (truncated or corrupt?)", ip);
        goto fail;
    }
    r->has_opt = path_exists(r->f, "/optimizer");
    if (read_meta(r->f, path, &r->meta, &r->config, 0, err, errlen)) goto fail;
    if (r->has_opt) {
        zt_ckpt_meta_t m2;
        char e2[8];
        if (!read_meta(r->f, path, &m2, NULL, 1, e2, sizeof e2)) {
            r->meta.adam_step = m2.adam_step;
            r->meta.lr = m2.lr; r->meta.beta1 = m2.beta1; r->meta.beta2 = m2.beta2; r->meta.eps = m2.eps;
            r->meta.weight_decay = m2.weight_decay;
            r->meta.loss_scale = m2.loss_scale;
            r->meta.loss_scale_good_steps = m2.loss_scale_good_steps;
            r->meta.data_seed = m2.data_seed;
            r->meta.shuffle = m2.shuffle;
        }
    }
    if (r->sharded) {
        if (index_tensors(r, err, errlen) || shards_open(r, path, err, errlen)) goto fail;
    } else {
        if (!path_exists(r->f, "/model")) {
            zt_err(err, errlen, "%s: no /model group", path);
            goto fail;
        }
        hid_t g = H5Gopen2(r->f, "/model", H5P_DEFAULT);
        iter_t it = { &r->table, g, 0 };
        hsize_t idx = 0;
        if (g < 0 || (H5Literate(g, H5_INDEX_CRT_ORDER, H5_ITER_INC, &idx, list_cb, &it) < 0 &&
                      (r->table.nparams = 0, idx = 0,
                       H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_cb, &it) < 0))) {
            if (g >= 0) H5Gclose(g);
            zt_err(err, errlen, "%s: cannot list /model", path);
            goto fail;
        }
        H5Gclose(g);
        if (it.bad) {
            zt_err(err, errlen, "%s: /model holds a tensor that is not 1-D or 2-D", path);
            goto fail;
        }
        if (r->has_opt && !path_exists(r->f, "/optimizer/exp_avg")) r->has_opt = 0;
    }
    return r;
fail:
    zt_ckpt_reader_close(r);
    return NULL;
}

const zt_ckpt_meta_t *zt_ckpt_reader_meta(const zt_ckpt_reader_t *r) { return &r->meta; }
const char *zt_ckpt_reader_config(const zt_ckpt_reader_t *r) { return r->config; }
const zt_param_table_t *zt_ckpt_reader_tensors(const zt_ckpt_reader_t *r) { return &r->table; }
int zt_ckpt_reader_has_optimizer(const zt_ckpt_reader_t *r) { return r->has_opt; }
int zt_ckpt_reader_is_sharded(const zt_ckpt_reader_t *r) { return r->sharded; }

/* Reads elements [start, start+n) of a 1-D dataset into out. */
static int read_elems(hid_t d, size_t start, size_t n, float *out)
{
    hid_t fs = H5Dget_space(d);
    int nd = H5Sget_simple_extent_ndims(fs);
    hsize_t dims[2] = { 0, 0 };
    if (nd < 1 || nd > 2) { H5Sclose(fs); return -1; }
    H5Sget_simple_extent_dims(fs, dims, NULL);
    int first = 1, rc = select_range(fs, nd, dims, start, n, &first);
    hsize_t md = n;
    hid_t ms = H5Screate_simple(1, &md, NULL);
    if (!rc) rc = H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, out) < 0 ? -1 : 0;
    H5Sclose(ms);
    H5Sclose(fs);
    return rc;
}

int zt_ckpt_reader_read(zt_ckpt_reader_t *r, int group, int p, size_t start, size_t n, float *out,
                        char *err, size_t errlen)
{
    const zt_param_t *pp = &r->table.params[p];
    if (p < 0 || p >= r->table.nparams || start + n > pp->numel || (group > 0 && !r->has_opt))
        return zt_err(err, errlen, "%s: bad read request for tensor %d", r->path, p);
    if (n == 0) return 0;
    if (!r->sharded) {
        if (r->open_d < 0 || r->open_g != group || r->open_p != p) {
            if (r->open_d >= 0) H5Dclose(r->open_d);
            char dp[256];
            snprintf(dp, sizeof dp, "%s/%s", group_path[group], pp->name);
            r->open_d = path_exists(r->f, dp) ? H5Dopen2(r->f, dp, H5P_DEFAULT) : -1;
            r->open_g = group;
            r->open_p = p;
            if (r->open_d < 0) return zt_err(err, errlen, "%s: missing tensor %s", r->path, dp);
        }
        if (read_elems(r->open_d, start, n, out))
            return zt_err(err, errlen, "%s: reading tensor %s/%s failed", r->path, group_path[group], pp->name);
        return 0;
    }
    size_t covered = 0;
    for (int i = 0; i < r->nshards; i++) {
        shard_file_t *s = &r->shards[i];
        for (int j = 0; j < s->nseg; j++) {
            if (s->param[j] != p) continue;
            size_t a = ZT_MAX(start, s->start[j]), b = ZT_MIN(start + n, s->start[j] + s->len[j]);
            if (a >= b) continue;
            if (read_elems(s->data[group], s->off[j] + (a - s->start[j]), b - a, out + (a - start)))
                return zt_err(err, errlen, "%s: reading shard rank-%d.h5 (tensor %s) failed", r->path, i, pp->name);
            covered += b - a;
        }
    }
    if (covered != n)
        return zt_err(err, errlen, "%s: tensor %s%s/%s: the shards cover %zu of elements [%zu, %zu)", r->path,
                      "", group_path[group], pp->name, covered, start, start + n);
    return 0;
}

int zt_ckpt_reader_checksum(zt_ckpt_reader_t *r, int group, int p, uint64_t *sum)
{
    if (p < 0 || p >= r->table.nparams || (group > 0 && !r->has_opt)) return -1;
    if (r->sharded) {
        *sum = r->sums[group * r->table.nparams + p];
        return 0;
    }
    char dp[256];
    snprintf(dp, sizeof dp, "%s/%s", group_path[group], r->table.params[p].name);
    if (!path_exists(r->f, dp)) return -1;
    hid_t d = H5Dopen2(r->f, dp, H5P_DEFAULT);
    if (d < 0) return -1;
    int rc = attr_get_u64(d, "checksum", sum);
    H5Dclose(d);
    return rc;
}

/* ---- loading ------------------------------------------------------------------------ */

/* Presence and shapes of every tensor of t among the stored ones (same message formats
 * for both layouts). */
static int check_tensors(const char *fname, const zt_param_table_t *stored, int ngroups,
                         const zt_param_table_t *t, hid_t f, char *err, size_t errlen)
{
    for (int g = 0; g < ngroups; g++)
        for (int p = 0; p < t->nparams; p++) {
            const zt_param_t *want = &t->params[p];
            int nd = 0;
            int64_t shape[2] = { 0, 0 };
            int found = 0;
            if (f >= 0) {   /* consolidated: look at the dataset itself */
                char dp[256];
                snprintf(dp, sizeof dp, "%s/%s", group_path[g], want->name);
                if (path_exists(f, dp)) {
                    hid_t d = H5Dopen2(f, dp, H5P_DEFAULT);
                    if (d >= 0) {
                        hid_t sp = H5Dget_space(d), ty = H5Dget_type(d);
                        nd = H5Sget_simple_extent_ndims(sp);
                        hsize_t dims[H5S_MAX_RANK] = { 0 };
                        if (nd > 0 && nd <= H5S_MAX_RANK) H5Sget_simple_extent_dims(sp, dims, NULL);
                        shape[0] = nd >= 1 ? (int64_t)dims[0] : 0;
                        shape[1] = nd >= 2 ? (int64_t)dims[1] : 0;
                        found = H5Tget_class(ty) == H5T_FLOAT ? 1 : -1;
                        H5Tclose(ty);
                        H5Sclose(sp);
                        H5Dclose(d);
                    }
                }
            } else {
                for (int q = 0; q < stored->nparams; q++)
                    if (!strcmp(stored->params[q].name, want->name)) {
                        nd = stored->params[q].ndim;
                        shape[0] = stored->params[q].shape[0];
                        shape[1] = stored->params[q].shape[1];
                        found = 1;
                        break;
                    }
            }
            if (!found) return zt_err(err, errlen, "%s: missing tensor %s/%s", fname, group_path[g], want->name);
            if (found < 0)
                return zt_err(err, errlen, "%s: tensor %s/%s is not floating point", fname, group_path[g], want->name);
            if (nd != want->ndim || shape[0] != want->shape[0] || (nd == 2 && shape[1] != want->shape[1])) {
                char a[64], b[64];
                if (nd == 1 || nd == 2) shape_str(a, sizeof a, nd, shape);
                else snprintf(a, sizeof a, "rank %d", nd);
                shape_str(b, sizeof b, want->ndim, want->shape);
                return zt_err(err, errlen, "%s: tensor %s/%s has shape %s, the model needs %s", fname, group_path[g],
                              want->name, a, b);
            }
        }
    return 0;
}

static int find_nonfinite(const zt_io_seg_t *segs, int nsegs, int ngroups, int np)
{
    int bad = INT_MAX;
    for (int i = 0; i < nsegs; i++)
        for (int g = 0; g < ngroups; g++) {
            const float *x = seg_ptr(&segs[i], g);
            if (!x) continue;
            for (size_t k = 0; k < segs[i].len; k++)
                if (!isfinite(x[k])) {
                    bad = ZT_MIN(bad, g * np + segs[i].param);
                    break;
                }
        }
    return bad;
}

static int read_consolidated(const char *path, zt_ckpt_meta_t *m, int weights_only, const zt_io_seg_t *segs,
                             int nsegs, const zt_param_table_t *t, MPI_Comm comm, char *err, size_t errlen)
{
    int rc = 0;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    hid_t f = exists(path) ? H5Fopen(path, H5F_ACC_RDONLY, fapl) : -1;
    H5Pclose(fapl);
    if (f < 0)
        rc = exists(path) ? zt_err(err, errlen, "%s: not a readable HDF5 file (truncated or corrupt?)", path)
                          : zt_err(err, errlen, "%s: no such checkpoint", path);
    if (agree(comm, rc, err, errlen)) {
        if (f >= 0) H5Fclose(f);
        return -1;
    }
    rc = read_meta(f, path, m, NULL, !weights_only, err, errlen);
    int ngroups = weights_only ? 1 : 3;
    if (!rc) rc = check_tensors(path, NULL, ngroups, t, f, err, errlen);
    if (agree(comm, rc, err, errlen)) {
        H5Fclose(f);
        return -1;
    }
    int *first;
    int *ord = sort_segs(segs, nsegs, t->nparams, &first);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
    for (int g = 0; g < ngroups; g++)
        for (int p = 0; p < t->nparams; p++) {
            char dp[256];
            snprintf(dp, sizeof dp, "%s/%s", group_path[g], t->params[p].name);
            hid_t d = H5Dopen2(f, dp, H5P_DEFAULT);
            if (d < 0) {
                if (!rc) rc = zt_err(err, errlen, "%s: cannot open tensor %s", path, dp);
                continue;
            }
            if (transfer(d, 1, g, segs, ord + first[p], first[p + 1] - first[p], dxpl) && !rc)
                rc = zt_err(err, errlen, "%s: reading tensor %s failed (truncated or corrupt file?)", path, dp);
            H5Dclose(d);
        }
    H5Pclose(dxpl);
    free(ord);
    free(first);
    if (H5Fclose(f) < 0 && !rc) rc = zt_err(err, errlen, "%s: close failed", path);
    return agree(comm, rc, err, errlen);
}

static int read_sharded(const char *path, zt_ckpt_meta_t *m, int weights_only, const zt_io_seg_t *segs,
                        int nsegs, const zt_param_table_t *t, MPI_Comm comm, char *err, size_t errlen)
{
    int rc = 0;
    zt_ckpt_reader_t *r = zt_ckpt_reader_open(path, err, errlen);
    if (!r) rc = -1;
    if (!rc) {
        char ip[PATH_MAX + 16];
        snprintf(ip, sizeof ip, "%s/index.h5", path);
        rc = read_meta(r->f, path, m, NULL, !weights_only, err, errlen);
    }
    int ngroups = weights_only ? 1 : 3;
    if (!rc) rc = check_tensors(path, &r->table, ngroups, t, -1, err, errlen);
    if (agree(comm, rc, err, errlen)) {
        zt_ckpt_reader_close(r);
        return -1;
    }
    for (int i = 0; i < nsegs && !rc; i++) {
        int q = -1;
        for (int k = 0; k < r->table.nparams; k++)
            if (!strcmp(r->table.params[k].name, t->params[segs[i].param].name)) { q = k; break; }
        for (int g = 0; g < ngroups && !rc; g++)
            if (seg_ptr(&segs[i], g))
                rc = zt_ckpt_reader_read(r, g, q, segs[i].start, segs[i].len, seg_ptr(&segs[i], g), err, errlen);
    }
    zt_ckpt_reader_close(r);
    return agree(comm, rc, err, errlen);
}

int zt_ckpt_read_segments(const char *path, zt_ckpt_meta_t *meta, int weights_only, const zt_io_seg_t *segs,
                          int nsegs, const zt_param_table_t *t, MPI_Comm comm, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    double t0 = zt_now();
    char resolved[PATH_MAX];
    snprintf(resolved, sizeof resolved, "%s", path);
    char ip[PATH_MAX + 16];
    snprintf(ip, sizeof ip, "%s/index.h5", path);
    if (is_dir(path) && !exists(ip)) {
        /* a checkpoint directory: follow "latest" (decided by rank 0 so all ranks agree) */
        int rank, rc = 0;
        MPI_Comm_rank(comm, &rank);
        if (rank == 0 && zt_ckpt_find_latest(path, resolved, sizeof resolved) != 0)
            rc = zt_err(err, errlen, "%s: no checkpoint found in this directory", path);
        if (agree(comm, rc, err, errlen)) return -1;
        ZT_MPI(MPI_Bcast(resolved, sizeof resolved, MPI_CHAR, 0, comm));
    }
    zt_ckpt_meta_t m;
    memset(&m, 0, sizeof m);
    int rc;
    if (is_dir(resolved)) rc = read_sharded(resolved, &m, weights_only, segs, nsegs, t, comm, err, errlen);
    else rc = read_consolidated(resolved, &m, weights_only, segs, nsegs, t, comm, err, errlen);
    if (rc) return -1;
    int ngroups = weights_only ? 1 : 3, bad = find_nonfinite(segs, nsegs, ngroups, t->nparams), gbad;
    ZT_MPI(MPI_Allreduce(&bad, &gbad, 1, MPI_INT, MPI_MIN, comm));
    if (gbad != INT_MAX)
        return zt_err(err, errlen, "%s: tensor %s/%s holds NaN or Inf", resolved, group_path[gbad / t->nparams],
                      t->params[gbad % t->nparams].name);
    double bytes = 0;
    for (int i = 0; i < nsegs; i++) bytes += (double)segs[i].len * 4.0 * ngroups;
    ZT_MPI(MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_DOUBLE, MPI_SUM, comm));
    m.bytes = bytes;
    m.load_seconds = zt_now() - t0;
    if (weights_only) {     /* keep the caller's optimizer and data fields */
        meta->step = m.step;
        meta->tokens_seen = m.tokens_seen;
        meta->world_size = m.world_size;
        snprintf(meta->strategy, sizeof meta->strategy, "%s", m.strategy);
        meta->bytes = m.bytes;
        meta->load_seconds = m.load_seconds;
    } else {
        *meta = m;
    }
    return 0;
}

/* ---- shard-engine wrappers ------------------------------------------------------------- */

/* A table with frozen units (LoRA): the checkpoint holds the trainable parameters alone,
 * the adapters and their optimizer state; the base is the run's own (model.name_or_path
 * or the seed) and is loaded again on resume. *view gets that table (NULL: t as it is)
 * and the returned copy of segs its indices, frozen segments left out. */
static zt_io_seg_t *trainable_segments(const zt_param_table_t *t, const zt_io_seg_t *segs, int n, int *kept,
                                       zt_param_table_t **view)
{
    *view = NULL;
    *kept = n;
    int frozen = 0;
    for (int u = 0; t->unit_frozen && u < t->nunits; u++) frozen |= t->unit_frozen[u];
    if (!frozen) return NULL;
    int *map = zt_calloc((size_t)t->nparams, sizeof *map);
    *view = zt_params_trainable(t, map);
    zt_io_seg_t *out = zt_calloc((size_t)(n ? n : 1), sizeof *out);
    *kept = 0;
    for (int i = 0; i < n; i++)
        if (map[segs[i].param] >= 0) {
            out[*kept] = segs[i];
            out[(*kept)++].param = map[segs[i].param];
        }
    free(map);
    return out;
}

/* ---- 1-bit Adam's error feedback ----------------------------------------------------
 * Each rank's worker and server errors (zt_onebit.h) are its own and mean something only
 * at the world size that made them: "<dir>/onebit-<step>.h5" holds, per trainable
 * tensor, /worker_error/<name> (world, padded size) and /server_error/<name> (world,
 * chunk), row r rank r's, written collectively before the checkpoint is published (a
 * published checkpoint has its errors) and removed with it by keep_last. A resume at the
 * same world size restores them (bit-exact continuation); otherwise they restart from
 * zero with a line in the log, which DeepSpeed does on every resume.
 * Pipelines: a rank holds the errors of its stages' units only (the tied root's on both
 * end ranks); the other rows of a tensor's dataset stay unwritten, and the file records
 * the pipeline size, so a resume restores the errors only on the same mesh's stages. */

/* whether any rank holds error feedback (a pipeline rank's stages may hold none). Collective. */
static int onebit_has_state(zt_shard_t *s, const zt_param_table_t *t, MPI_Comm comm)
{
    size_t len;
    int mine = 0, any = 0;
    for (int u = 0; u < t->nunits && !mine; u++)
        if (zt_shard_onebit_error(s, u, 0, 0, &len)) mine = 1;
    ZT_MPI(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm));
    return any;
}

/* writing: every error buffer into the file's rows; reading: from them. Returns 0, or -1
 * with err (a missing file, another world size or shape, an I/O failure). Collective. */
static int onebit_io(const char *path, int writing, zt_shard_t *s, const zt_param_table_t *t, MPI_Comm comm,
                     int pp, char *err, size_t errlen)
{
    int rank, size, rc = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (!writing && !exists(path)) return zt_err(err, errlen, "%s: not found", path);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    hid_t f = writing ? H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl) : H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) return agree(comm, zt_err(err, errlen, "%s: cannot %s", path, writing ? "create" : "open"), err, errlen);
    int64_t w = size, wpp = 1;
    if (writing) {
        rc = attr_i64(f, "world_size", size);
        if (!rc) rc = attr_i64(f, "pipeline_parallel_size", pp);
        static const char *groups[2] = {"worker_error", "server_error"};
        for (int k = 0; k < 2 && !rc; k++) {
            hid_t g = H5Gcreate2(f, groups[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            rc = g < 0 ? -1 : 0;
            if (g >= 0) H5Gclose(g);
        }
        if (rc) zt_err(err, errlen, "%s: writing metadata failed", path);
    } else if (attr_get_i64(f, "world_size", &w) || w != size) {
        rc = zt_err(err, errlen, "%s: saved at %lld ranks, not %d", path, (long long)w, size);
    } else {
        /* a file without the attribute was written without a pipeline */
        if (attr_get_i64(f, "pipeline_parallel_size", &wpp)) wpp = 1;
        if (wpp != pp)
            rc = zt_err(err, errlen, "%s: saved at pipeline_parallel_size %lld, not %d", path, (long long)wpp, pp);
    }
    rc = agree(comm, rc, err, errlen);
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
    for (int u = 0; u < t->nunits && !rc; u++)
        for (int i = 0; i < t->unit_count[u] && !rc; i++)
            for (int server = 0; server < 2 && !rc; server++) {
                size_t len;
                float *buf = zt_shard_onebit_error(s, u, i, server, &len);
                /* the holders' length (pipelines: ranks of other stages hold none and
                 * write or read no row; a tensor no rank holds has no dataset) */
                unsigned long long mine = buf ? len : 0, most = 0;
                ZT_MPI(MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm));
                if (!most) continue;
                if (buf && len != most)
                    rc = zt_err(err, errlen, "%s: %s error of %s: %zu floats here, %llu on another rank", path,
                                server ? "server" : "worker", t->params[t->unit_first[u] + i].name, len, most);
                rc = agree(comm, rc, err, errlen);
                if (rc) break;
                len = most;
                char dp[256];
                snprintf(dp, sizeof dp, "%s/%s", server ? "server_error" : "worker_error",
                         t->params[t->unit_first[u] + i].name);
                hsize_t dims[2] = {(hsize_t)size, len}, st[2] = {(hsize_t)rank, 0}, cnt[2] = {1, len};
                hid_t fs = H5Screate_simple(2, dims, NULL), d;
                if (writing) {
                    d = H5Dcreate2(f, dp, H5T_IEEE_F32LE, fs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
                } else {
                    d = H5Dopen2(f, dp, H5P_DEFAULT);
                    hid_t ds = d >= 0 ? H5Dget_space(d) : -1;
                    hsize_t got[2] = {0, 0};
                    if (ds < 0 || H5Sget_simple_extent_ndims(ds) != 2 || H5Sget_simple_extent_dims(ds, got, NULL) < 0 ||
                        got[0] != dims[0] || got[1] != dims[1])
                        rc = zt_err(err, errlen, "%s: %s missing or not (%d, %zu)", path, dp, size, len);
                    if (ds >= 0) H5Sclose(ds);
                }
                if (d < 0 && !rc) rc = zt_err(err, errlen, "%s: cannot %s %s", path, writing ? "create" : "open", dp);
                rc = agree(comm, rc, err, errlen);
                if (!rc) {
                    hid_t ms = H5Screate_simple(2, cnt, NULL);
                    H5Sselect_hyperslab(fs, H5S_SELECT_SET, st, NULL, cnt, NULL);
                    if (!buf) { /* still part of the collective call, with nothing selected */
                        H5Sselect_none(fs);
                        H5Sselect_none(ms);
                    }
                    float none = 0.0f, *io = buf ? buf : &none;
                    herr_t e = writing ? H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, io)
                                       : H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, dxpl, io);
                    if (e < 0) rc = zt_err(err, errlen, "%s: %s %s failed", path, writing ? "writing" : "reading", dp);
                    H5Sclose(ms);
                }
                if (d >= 0) H5Dclose(d);
                H5Sclose(fs);
                rc = agree(comm, rc, err, errlen);
            }
    H5Pclose(dxpl);
    if (H5Fclose(f) < 0 && !rc) rc = zt_err(err, errlen, "%s: close failed", path);
    rc = agree(comm, rc, err, errlen);
    if (writing && !rc && rank == 0 && zt_fsync_path(path) != 0)
        rc = zt_err(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
    return agree(comm, rc, err, errlen);
}

int zt_ckpt_save(const char *dir, zt_ckpt_meta_t *meta, const char *config_text, int sharded,
                 int keep_last, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm, char *err,
                 size_t errlen)
{
    zt_io_seg_t *segs = NULL;
    meta->adam_step = zt_shard_adam_step(s);
    if (onebit_has_state(s, t, comm->world.comm)) {
        int rank = 0, rc = 0;
        MPI_Comm_rank(comm->world.comm, &rank);
        if (rank == 0) rc = zt_mkdir_p(dir, err, errlen);
        if (agree(comm->world.comm, rc, err, errlen)) return -1;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/onebit-%08ld.h5", dir, meta->step);
        if (onebit_io(p, 1, s, t, comm->world.comm, comm->pp.size, err, errlen)) return -1;
    }
    int n = zt_shard_io_segments(s, 1, &segs), kept;
    zt_param_table_t *view;
    zt_io_seg_t *tsegs = trainable_segments(t, segs, n, &kept, &view);
    int rc = zt_ckpt_write_segments(dir, meta, config_text, sharded, keep_last, tsegs ? tsegs : segs, kept,
                                    view ? view : t, comm->world.comm, err, errlen);
    free(tsegs);
    zt_param_table_free(view);
    zt_shard_io_done(s, segs, n, 0);
    return rc;
}

int zt_ckpt_load(const char *path, zt_ckpt_meta_t *meta, int weights_only, zt_shard_t *s,
                 const zt_param_table_t *t, zt_comm_t *comm, char *err, size_t errlen)
{
    zt_io_seg_t *segs = NULL;
    int n = zt_shard_io_segments(s, 0, &segs), kept;
    zt_param_table_t *view;
    zt_io_seg_t *tsegs = trainable_segments(t, segs, n, &kept, &view);
    int rc = zt_ckpt_read_segments(path, meta, weights_only, tsegs ? tsegs : segs, kept, view ? view : t,
                                   comm->world.comm, err, errlen);
    free(tsegs);
    zt_param_table_free(view);
    /* a frozen base read nothing here: what it holds (loaded before) stays */
    zt_shard_io_done(s, segs, n, rc != 0 ? 0 : weights_only ? 1 : 2);
    if (rc) return -1;
    if (!weights_only) zt_shard_set_adam_step(s, meta->adam_step);
    zt_shard_after_load(s);
    if (!weights_only && onebit_has_state(s, t, comm->world.comm)) {
        /* the side file lies beside the checkpoint (path: it, or the directory holding it) */
        char dir[PATH_MAX], ip[PATH_MAX + 16], p[PATH_MAX + 64], why[ZT_ERRLEN];
        snprintf(ip, sizeof ip, "%s/index.h5", path);
        snprintf(dir, sizeof dir, "%s", path);
        if (!is_dir(path) || exists(ip)) {
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
            else snprintf(dir, sizeof dir, ".");
        }
        snprintf(p, sizeof p, "%s/onebit-%08ld.h5", dir, meta->step);
        if (onebit_io(p, 0, s, t, comm->world.comm, comm->pp.size, why, sizeof why) != 0) {
            zt_shard_onebit_reset(s);
            zt_log("1-bit Adam: error feedback not restored (%s): worker and server errors restart from zero", why);
        }
    }
    return 0;
}

/* ---- latest, consolidate, fuzz entry ------------------------------------------------------ */

int zt_ckpt_find_latest(const char *dir, char *path, size_t len)
{
    char lp[PATH_MAX], name[PATH_MAX] = "";
    snprintf(lp, sizeof lp, "%s/latest", dir);
    FILE *fp = fopen(lp, "r");
    if (fp) {
        if (fgets(name, sizeof name, fp)) name[strcspn(name, "\r\n")] = 0;
        fclose(fp);
        char full[2 * PATH_MAX];
        snprintf(full, sizeof full, "%s/%s", dir, name);
        if (name[0] && !strchr(name, '/') && ckpt_name_step(name) >= 0 && exists(full)) {
            snprintf(path, len, "%s", full);
            return 0;
        }
    }
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    long best = -1;
    struct dirent *e;
    while ((e = readdir(dp))) {
        long s = ckpt_name_step(e->d_name);
        if (s > best) {
            best = s;
            snprintf(name, sizeof name, "%s", e->d_name);
        }
    }
    closedir(dp);
    if (best < 0) return -1;
    snprintf(path, len, "%s/%s", dir, name);
    return 0;
}

int zt_ckpt_consolidate(const char *shards_dir, const char *out_path, size_t buf_elems, char *err, size_t errlen)
{
    zt_ckpt_reader_t *r = zt_ckpt_reader_open(shards_dir, err, errlen);
    if (!r) return -1;
    if (!r->sharded) {
        zt_ckpt_reader_close(r);
        return zt_err(err, errlen, "%s: not a sharded checkpoint directory", shards_dir);
    }
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) {
        zt_ckpt_reader_close(r);
        return zt_err(err, errlen, "%s: cannot create", tmp);
    }
    zt_ckpt_meta_t m = r->meta;
    int rc = 0;
    if (create_groups(f, r->has_opt) || write_meta(f, &m, r->config, r->has_opt))
        rc = zt_err(err, errlen, "%s: writing metadata failed", tmp);
    if (buf_elems == 0) buf_elems = 1 << 20;
    float *buf = zt_malloc(buf_elems * sizeof(float));
    const zt_param_table_t *t = &r->table;
    for (int g = 0; g < (r->has_opt ? 3 : 1) && !rc; g++)
        for (int p = 0; p < t->nparams && !rc; p++) {
            hid_t d = create_dataset(f, g, &t->params[p]);
            if (d < 0) {
                rc = zt_err(err, errlen, "%s: cannot create %s/%s", tmp, group_path[g], t->params[p].name);
                break;
            }
            uint64_t sum = 0;
            hid_t fs = H5Dget_space(d);
            hsize_t dims[2] = { (hsize_t)t->params[p].shape[0], (hsize_t)t->params[p].shape[1] };
            for (size_t s = 0; s < t->params[p].numel && !rc; s += buf_elems) {
                size_t n = ZT_MIN(buf_elems, t->params[p].numel - s);
                rc = zt_ckpt_reader_read(r, g, p, s, n, buf, err, errlen);
                if (rc) break;
                sum += zt_ckpt_checksum(s, buf, n);
                int first = 1;
                hsize_t md = n;
                hid_t ms = H5Screate_simple(1, &md, NULL);
                if (select_range(fs, t->params[p].ndim, dims, s, n, &first) ||
                    H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0)
                    rc = zt_err(err, errlen, "%s: writing %s/%s failed", tmp, group_path[g], t->params[p].name);
                H5Sclose(ms);
            }
            H5Sclose(fs);
            if (!rc && sum != r->sums[g * t->nparams + p])
                rc = zt_err(err, errlen, "%s: tensor %s/%s: checksum mismatch (shards %016" PRIx64
                            ", index %016" PRIx64 ")", shards_dir, group_path[g], t->params[p].name, sum,
                            r->sums[g * t->nparams + p]);
            if (!rc && attr_u64(d, "checksum", sum))
                rc = zt_err(err, errlen, "%s: writing checksum failed", tmp);
            H5Dclose(d);
        }
    free(buf);
    if (rc) empty_failed_file(tmp);     /* see empty_failed_file */
    if (H5Fclose(f) < 0 && !rc) rc = zt_err(err, errlen, "%s: close failed", tmp);
    zt_ckpt_reader_close(r);
    if (!rc && (zt_fsync_path(tmp) != 0 || rename(tmp, out_path) != 0))
        rc = zt_err(err, errlen, "%s: cannot sync/rename to %s: %s", tmp, out_path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}

int zt_ckpt_check_image(const void *buf, size_t len, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 1 << 16, 0);
    H5Pset_file_image(fapl, (void *)buf, len);
    hid_t f = H5Fopen("image.h5", H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) return zt_err(err, errlen, "image.h5: not a readable HDF5 file");
    zt_ckpt_reader_t *r = zt_calloc(1, sizeof *r);
    r->f = f;
    r->open_d = -1;
    snprintf(r->path, sizeof r->path, "image.h5");
    int rc = read_meta(f, "image.h5", &r->meta, &r->config, 1, err, errlen);
    if (!rc) {
        hid_t g = path_exists(f, "/model") ? H5Gopen2(f, "/model", H5P_DEFAULT) : -1;
        iter_t it = { &r->table, g, 0 };
        hsize_t idx = 0;
        if (g < 0 || H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_cb, &it) < 0)
            rc = zt_err(err, errlen, "image.h5: cannot list /model");
        if (g >= 0) H5Gclose(g);
        r->has_opt = 1;
        /* the stored table against itself exercises the shape/dtype checks and reads */
        if (!rc) rc = check_tensors("image.h5", NULL, 3, &r->table, f, err, errlen);
        float small[64];
        for (int p = 0; p < r->table.nparams && !rc; p++) {
            uint64_t sum;
            zt_ckpt_reader_checksum(r, 0, p, &sum);
            rc = zt_ckpt_reader_read(r, 0, p, 0, ZT_MIN(r->table.params[p].numel, 64), small, err, errlen);
        }
    }
    zt_ckpt_reader_close(r);
    return rc;
}
