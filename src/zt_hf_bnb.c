/* zt_hf_bnb.c — bitsandbytes' 4-bit weights in a Hugging Face directory (zt_hf_bnb.h). */
#include "zt_hf_bnb.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"

/* the suffixes save_pretrained gives a Params4bit's parts */
static const char *const parts[] = {".absmax", ".nested_absmax", ".quant_map", ".nested_quant_map"};
#define QS_SUFFIX ".quant_state.bitsandbytes__"
#define QS_MAX_BYTES 4096 /* a quant_state is a few hundred bytes of JSON */

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int zt_hf_bnb_weight_of(const char *name, char *weight, size_t len)
{
    const char *qs = strstr(name, QS_SUFFIX);
    size_t keep = qs ? (size_t)(qs - name) : 0;
    for (size_t i = 0; !qs && i < sizeof parts / sizeof *parts; i++)
        if (ends_with(name, parts[i])) keep = strlen(name) - strlen(parts[i]);
    if (!keep || keep >= len) return 0;
    snprintf(weight, len, "%.*s", (int)keep, name);
    return 1;
}

/* The quant_state tensor of weight (either quant type's name), -1 if none. */
static int find_state(const zt_hf_dir_t *d, const char *weight, char *name, size_t len)
{
    static const char *const types[] = {"nf4", "fp4"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        snprintf(name, len, "%s" QS_SUFFIX "%s", weight, types[i]);
        const int k = zt_hf_find(d, name, NULL, NULL, NULL, NULL);
        if (k >= 0) return k;
    }
    return -1;
}

int zt_hf_bnb_stored(const zt_hf_dir_t *d, const char *weight)
{
    char name[320];
    return find_state(d, weight, name, sizeof name) >= 0;
}

/* One part of weight: its index, checked to be dtype dt with n elements (ndim 1, or the packed
 * weight's (n, 1)). */
static int find_part(zt_hf_dir_t *d, const char *weight, const char *suffix, zt_st_dtype_t dt, int64_t n, int *idx,
                     char *err, size_t errlen)
{
    char name[320];
    snprintf(name, sizeof name, "%s%s", weight, suffix);
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    zt_st_dtype_t got;
    const char *file = NULL;
    *idx = zt_hf_find(d, name, &ndim, shape, &got, &file);
    if (*idx < 0)
        return zt_err(err, errlen, "%s: tensor %s is missing (the 4-bit weight %s needs it)", zt_hf_path(d), name,
                      weight);
    int64_t numel = 1;
    for (int k = 0; k < ndim; k++) numel *= shape[k];
    if (got != dt)
        return zt_err(err, errlen, "%s: tensor %s is %s, bitsandbytes stores it as %s", file, name,
                      zt_st_dtype_name(got), zt_st_dtype_name(dt));
    if (numel != n)
        return zt_err(err, errlen, "%s: tensor %s has %" PRId64 " elements, the quant_state of %s needs %" PRId64,
                      file, name, numel, weight, n);
    return 0;
}

/* A float table that must be bitsandbytes' own, bit for bit (its code, or the dynamic map). */
static int check_table(zt_hf_dir_t *d, const char *weight, const char *suffix, const float *want, int n,
                       const char *what, char *err, size_t errlen)
{
    float got[256];
    int k;
    if (find_part(d, weight, suffix, ZT_ST_F32, n, &k, err, errlen) ||
        zt_hf_read_bytes(d, k, got, (size_t)n * sizeof *got, err, errlen))
        return -1;
    const char *file = NULL;
    zt_hf_find(d, zt_hf_tensor_name(d, k), NULL, NULL, NULL, &file);
    for (int i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof *got))
            return zt_err(err, errlen, "%s: tensor %s%s: value %d is %.9g, bitsandbytes' %s has %.9g", file, weight,
                          suffix, i, (double)got[i], what, (double)want[i]);
    return 0;
}

static int check_finite(const zt_hf_dir_t *d, const char *weight, const char *suffix, const float *x, int64_t n,
                        char *err, size_t errlen)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return zt_err(err, errlen, "%s: tensor %s%s: element %" PRId64 " is %g", zt_hf_path(d), weight, suffix,
                          i, (double)x[i]);
    return 0;
}

/* The quant_state of weight, parsed and held to what the model and the run expect. */
static int read_state(zt_hf_dir_t *d, const char *weight, int64_t rows, int64_t cols, zt_quant_type_t type,
                      int nested, int64_t blocksize, zt_quant_state_t *st, char *err, size_t errlen)
{
    char name[320], e[ZT_ERRLEN];
    const int k = find_state(d, weight, name, sizeof name);
    if (k < 0)
        return zt_err(err, errlen, "%s: tensor %s" QS_SUFFIX "nf4 (or fp4) is missing: %s is not stored 4-bit",
                      zt_hf_path(d), weight, weight);
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    zt_st_dtype_t dt;
    const char *file = NULL;
    zt_hf_find(d, name, &ndim, shape, &dt, &file);
    if (dt != ZT_ST_U8 || ndim != 1 || shape[0] < 2 || shape[0] > QS_MAX_BYTES)
        return zt_err(err, errlen, "%s: tensor %s is not the JSON bytes of a quant_state (U8, at most %d bytes)",
                      file, name, QS_MAX_BYTES);
    char *json = zt_malloc((size_t)shape[0]);
    int rc = zt_hf_read_bytes(d, k, json, (size_t)shape[0], err, errlen);
    if (!rc && zt_quant_state_parse(name, json, (size_t)shape[0], st, e, sizeof e))
        rc = zt_err(err, errlen, "%s: %s", file, e);
    free(json);
    if (rc) return -1;
    if (st->ndim != 2 || st->shape[0] != rows || st->shape[1] != cols)
        return zt_err(err, errlen, "%s: tensor %s: quant_state shape is not (%" PRId64 ", %" PRId64 "), the "
                                   "shape config.json implies", file, name, rows, cols);
    if (st->type != type)
        return zt_err(err, errlen, "%s: tensor %s: quant_type %s, config.json's quantization_config says %s", file,
                      name, zt_quant_type_name(st->type), zt_quant_type_name(type));
    if (st->nested != nested)
        return zt_err(err, errlen, "%s: tensor %s: %s double quantization, config.json's quantization_config says "
                                   "bnb_4bit_use_double_quant = %s", file, name, st->nested ? "with" : "without",
                      nested ? "true" : "false");
    if (st->blocksize != blocksize)
        return zt_err(err, errlen, "%s: tensor %s: blocksize %" PRId64 ": ztrain's 4-bit base uses Linear4bit's "
                                   "%" PRId64, file, name, st->blocksize, blocksize);
    if (nested && (st->nested_blocksize != ZT_QUANT_NESTED_BLOCKSIZE || st->nested_dtype != ZT_QUANT_DT_F32))
        return zt_err(err, errlen, "%s: tensor %s: nested_blocksize %" PRId64 " (%s): bitsandbytes' double "
                                   "quantization is blocks of %d in float32", file, name, st->nested_blocksize,
                      st->nested_dtype == ZT_QUANT_DT_F32 ? "float32" : "not float32", ZT_QUANT_NESTED_BLOCKSIZE);
    return 0;
}

int zt_hf_bnb_read(zt_hf_dir_t *d, const char *weight, int64_t rows, int64_t cols, zt_quant_type_t type,
                   int nested, int64_t blocksize, float *region, char *err, size_t errlen)
{
    zt_quant_state_t st;
    if (read_state(d, weight, rows, cols, type, nested, blocksize, &st, err, errlen)) return -1;
    const int64_t n = st.numel, nb = ZT_CEIL_DIV(n, blocksize), nn = ZT_CEIL_DIV(nb, ZT_QUANT_NESTED_BLOCKSIZE);
    /* every part's dtype and length before any is read */
    int k[3];
    if (find_part(d, weight, "", ZT_ST_U8, (n + 1) / 2, &k[0], err, errlen) ||
        find_part(d, weight, ".absmax", nested ? ZT_ST_U8 : ZT_ST_F32, nb, &k[1], err, errlen) ||
        (nested && find_part(d, weight, ".nested_absmax", ZT_ST_F32, nn, &k[2], err, errlen)))
        return -1;
    if (check_table(d, weight, ".quant_map", zt_quant_code(type), 16, zt_quant_type_name(type), err, errlen))
        return -1;
    if (nested && check_table(d, weight, ".nested_quant_map", zt_quant_dynamic_map(), 256, "dynamic map", err, errlen))
        return -1;
    uint8_t *packed = zt_malloc((size_t)(n + 1) / 2), *codes = nested ? zt_malloc((size_t)nb) : NULL;
    float *absmax = zt_malloc((size_t)(nested ? nn : nb) * sizeof *absmax);
    zt_quant4_view_t v = {.type = type, .numel = n, .blocksize = blocksize, .packed = packed, .nested = nested,
                          .nested_blocksize = ZT_QUANT_NESTED_BLOCKSIZE, .offset = st.nested_offset};
    int rc = zt_hf_read_bytes(d, k[0], packed, (size_t)(n + 1) / 2, err, errlen);
    if (!rc && nested) {
        rc = zt_hf_read_bytes(d, k[1], codes, (size_t)nb, err, errlen);
        if (!rc) rc = zt_hf_read_bytes(d, k[2], absmax, (size_t)nn * sizeof *absmax, err, errlen);
        if (!rc) rc = check_finite(d, weight, ".nested_absmax", absmax, nn, err, errlen);
        v.absmax_codes = codes, v.nested_absmax = absmax;
    } else if (!rc) {
        rc = zt_hf_read_bytes(d, k[1], absmax, (size_t)nb * sizeof *absmax, err, errlen);
        if (!rc) rc = check_finite(d, weight, ".absmax", absmax, nb, err, errlen);
        v.absmax = absmax;
    }
    if (!rc) zt_quant4_region_write(&v, region);
    free(packed);
    free(codes);
    free(absmax);
    return rc;
}
