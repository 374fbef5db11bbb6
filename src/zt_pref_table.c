/* zt_pref_table.c — DPO's table of reference log-probabilities by pair (zt_pref_table.h)
 * and its HDF5 file. */
#include "zt_pref_table.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

zt_pref_table_t *zt_pref_table_create(int64_t n)
{
    zt_pref_table_t *t = zt_calloc(1, sizeof *t);
    t->n = n;
    t->ref = zt_calloc(2 * (size_t)n, sizeof *t->ref);
    t->have = zt_calloc((size_t)n, 1);
    return t;
}

void zt_pref_table_free(zt_pref_table_t *t)
{
    if (!t) return;
    free(t->ref);
    free(t->have);
    free(t);
}

int zt_pref_table_get(const zt_pref_table_t *t, int64_t rec, double *chosen, double *rejected)
{
    if (rec < 0 || rec >= t->n || !t->have[rec]) return 0;
    *chosen = t->ref[2 * rec];
    *rejected = t->ref[2 * rec + 1];
    return 1;
}

int zt_pref_table_put(zt_pref_table_t *t, int64_t rec, double chosen, double rejected)
{
    if (rec < 0 || rec >= t->n || t->have[rec]) return 0;
    t->ref[2 * rec] = chosen;
    t->ref[2 * rec + 1] = rejected;
    t->have[rec] = 1;
    t->filled++;
    return 1;
}

int zt_pref_table_complete(const zt_pref_table_t *t) { return t->filled == t->n; }

/* one 1-d dataset of n elements, written whole */
static int write_1d(hid_t f, const char *name, hid_t ftype, hid_t mtype, hsize_t n, const void *buf)
{
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(f, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const int rc = d < 0 || H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0 ? -1 : 0;
    if (d >= 0) H5Dclose(d);
    H5Sclose(sp);
    return rc;
}

/* one 1-d dataset of exactly n elements, read whole */
static int read_1d(hid_t f, const char *name, hid_t mtype, hsize_t n, void *buf)
{
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    if (d < 0) return -1;
    hid_t sp = H5Dget_space(d);
    hsize_t got = 0;
    int rc = sp < 0 || H5Sget_simple_extent_ndims(sp) != 1 || H5Sget_simple_extent_dims(sp, &got, NULL) < 0 ||
                     got != n
                 ? -1
                 : 0;
    if (sp >= 0) H5Sclose(sp);
    if (!rc && H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) rc = -1;
    H5Dclose(d);
    return rc;
}

int zt_pref_table_save(const zt_pref_table_t *t, const char *path, char *err, size_t errlen)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return zt_err(err, errlen, "%s: path too long", path);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return zt_err(err, errlen, "%s: cannot create", tmp);
    /* chosen and rejected apart: each a column a reader takes as it is */
    double *col = zt_malloc(2 * (size_t)t->n * sizeof *col);
    for (int64_t i = 0; i < t->n; i++) col[i] = t->ref[2 * i], col[t->n + i] = t->ref[2 * i + 1];
    const hsize_t n = (hsize_t)t->n;
    int rc = write_1d(f, "ref_chosen", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, n, col) ||
             write_1d(f, "ref_rejected", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, n, col + t->n) ||
             write_1d(f, "computed", H5T_STD_U8LE, H5T_NATIVE_UCHAR, n, t->have);
    free(col);
    if (!rc) {
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, "records", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        rc = a < 0 || H5Awrite(a, H5T_NATIVE_INT64, &t->n) < 0 ? -1 : 0;
        if (a >= 0) H5Aclose(a);
        H5Sclose(sp);
    }
    if (rc) zt_err(err, errlen, "%s: writing the table failed", tmp);
    if (H5Fclose(f) < 0 && !rc) rc = zt_err(err, errlen, "%s: close failed", tmp);
    if (!rc && zt_fsync_path(tmp) != 0) rc = zt_err(err, errlen, "%s: fsync failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = zt_err(err, errlen, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    if (rc) remove(tmp);
    return rc;
}

int zt_pref_table_load(zt_pref_table_t *t, const char *path, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return zt_err(err, errlen, "%s: cannot open", path);
    int64_t n = -1;
    hid_t a = H5Aopen(f, "records", H5P_DEFAULT);
    int rc = a < 0 || H5Aread(a, H5T_NATIVE_INT64, &n) < 0 ? -1 : 0;
    if (a >= 0) H5Aclose(a);
    if (rc) {
        H5Fclose(f);
        return zt_err(err, errlen, "%s: not a reference log-prob table (no attribute records)", path);
    }
    if (n != t->n) {
        H5Fclose(f);
        return zt_err(err, errlen, "%s: a table of %lld pairs, the training set has %lld: made from another dataset",
                      path, (long long)n, (long long)t->n);
    }
    double *col = zt_malloc(2 * (size_t)n * sizeof *col);
    unsigned char *have = zt_malloc((size_t)n);
    rc = read_1d(f, "ref_chosen", H5T_NATIVE_DOUBLE, (hsize_t)n, col) ||
         read_1d(f, "ref_rejected", H5T_NATIVE_DOUBLE, (hsize_t)n, col + n) ||
         read_1d(f, "computed", H5T_NATIVE_UCHAR, (hsize_t)n, have);
    H5Fclose(f);
    if (rc) {
        free(col);
        free(have);
        return zt_err(err, errlen, "%s: /ref_chosen, /ref_rejected or /computed missing or not of %lld elements",
                      path, (long long)n);
    }
    t->filled = 0;
    for (int64_t i = 0; i < n; i++) {
        t->have[i] = have[i] != 0;
        t->filled += t->have[i];
        t->ref[2 * i] = t->have[i] ? col[i] : 0.0;
        t->ref[2 * i + 1] = t->have[i] ? col[n + i] : 0.0;
    }
    free(col);
    free(have);
    return 0;
}
