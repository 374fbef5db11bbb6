/* zt_safetensors.c — strict safetensors reader and streaming writer.
 *
 * The JSON header of a downloaded model is untrusted input: jansson parses it
 * (strict RFC 8259, UTF-8 checked, duplicate keys refused, bounded nesting) and
 * this file then accepts exactly the safetensors schema (an object of tensor
 * objects plus an optional string map "__metadata__"); anything else is rejected
 * with a message naming the file and the tensor. All offsets are validated
 * against dtype x shape and the data section before the data is read: the
 * tensors must tile the data section without overlap, gap or tail. */
#include "zt_safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "zt_common.h"
#include "zt_fp16.h"

/* Every dtype the format defines, so that a file holding one ztrain does not
 * read is refused by name rather than as garbage; size 0 = not read. */
static const struct { const char *name; int size; zt_st_dtype_t dtype; } dtypes[] = {
    { "F32", 4, ZT_ST_F32 }, { "F16", 2, ZT_ST_F16 }, { "BF16", 2, ZT_ST_BF16 },
    { "F64", 0, 0 }, { "I64", 0, 0 }, { "I32", 0, 0 }, { "I16", 0, 0 }, { "I8", 0, 0 }, { "U64", 0, 0 },
    { "U32", 0, 0 }, { "U16", 0, 0 }, { "U8", 1, ZT_ST_U8 }, { "BOOL", 0, 0 }, { "F8_E4M3", 0, 0 },
    { "F8_E5M2", 0, 0 }, { "F8_E8M0", 0, 0 }, { "F6_E2M3", 0, 0 }, { "F6_E3M2", 0, 0 }, { "F4", 0, 0 },
    { "C64", 0, 0 },
};

int zt_st_dtype_size(zt_st_dtype_t d) { return d == ZT_ST_F32 ? 4 : d == ZT_ST_U8 ? 1 : 2; }

const char *zt_st_dtype_name(zt_st_dtype_t d)
{
    return d == ZT_ST_F32 ? "F32" : d == ZT_ST_F16 ? "F16" : d == ZT_ST_U8 ? "U8" : "BF16";
}

/* A JSON integer in [0, INT64_MAX]; jansson already refuses values past int64 ("too big integer"). */
static int get_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_metadata(const char *file, const json_t *m, char *err, size_t errlen)
{
    if (!json_is_object(m)) return zt_err(err, errlen, "%s: safetensors header: __metadata__ is not an object", file);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)m, k, v)
        if (!json_is_string(v))
            return zt_err(err, errlen, "%s: safetensors header: __metadata__ value \"%s\" is not a string", file, k);
    return 0;
}

static int parse_tensor(const char *file, const json_t *v, zt_st_tensor_t *t, char *err, size_t errlen)
{
    if (!json_is_object(v)) return zt_err(err, errlen, "%s: tensor %s: entry is not an object", file, t->name);
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x)
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return zt_err(err, errlen, "%s: tensor %s: unexpected key \"%s\"", file, t->name, k);
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
                 *off = json_object_get(v, "data_offsets");
    if (!dt || !sh || !off)
        return zt_err(err, errlen, "%s: tensor %s: needs dtype, shape and data_offsets", file, t->name);
    if (!json_is_string(dt)) return zt_err(err, errlen, "%s: tensor %s: dtype is not a string", file, t->name);
    const char *dn = json_string_value(dt);
    size_t di = 0;
    while (di < sizeof dtypes / sizeof dtypes[0] && strcmp(dtypes[di].name, dn)) di++;
    if (di == sizeof dtypes / sizeof dtypes[0])
        return zt_err(err, errlen, "unknown dtype %.32s of tensor %s in %s", dn, t->name, file);
    if (!dtypes[di].size)
        return zt_err(err, errlen, "unsupported dtype %s of tensor %s in %s (F32, F16, BF16 and U8 are read)", dn,
                      t->name, file);
    t->dtype = dtypes[di].dtype;
    if (!json_is_array(sh) || json_array_size(sh) > ZT_ST_MAX_DIMS)
        return zt_err(err, errlen, "%s: tensor %s: shape is not an array of at most %d dimensions", file,
                      t->name, ZT_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (get_uint(json_array_get(sh, (size_t)i), &d))
            return zt_err(err, errlen, "%s: tensor %s: shape entry %d is not a non-negative integer", file,
                          t->name, i);
        /* numel x 8 must stay representable so that byte counts cannot wrap */
        if (d && t->numel > UINT64_MAX / 8 / d)
            return zt_err(err, errlen, "%s: tensor %s: shape too large", file, t->name);
        t->shape[i] = (int64_t)d;
        t->numel *= d;
    }
    if (!json_is_array(off) || json_array_size(off) != 2 || get_uint(json_array_get(off, 0), &t->begin) ||
        get_uint(json_array_get(off, 1), &t->end))
        return zt_err(err, errlen, "%s: tensor %s: data_offsets needs 2 non-negative integers", file, t->name);
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const zt_st_tensor_t *x = *(zt_st_tensor_t *const *)a, *y = *(zt_st_tensor_t *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

void zt_st_close(zt_st_file_t *f)
{
    free(f->tensors);
    f->tensors = NULL;
    f->ntensors = 0;
    if (f->fp) fclose(f->fp);
    f->fp = NULL;
}

int zt_st_parse_header(const char *name, const char *hdr, size_t n, uint64_t data_len,
                       zt_st_file_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", name);
    out->data_start = 8 + (uint64_t)n;
    out->data_len = data_len;
    /* Duplicate keys are refused rather than letting the last one win, which is
     * what the reference implementation (serde) does as well. */
    json_error_t je;
    json_t *root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return zt_err(err, errlen, "%s: safetensors header: %s (line %d, column %d)", name, je.text, je.line,
                      je.column);
    if (!json_is_object(root)) {
        zt_err(err, errlen, "%s: safetensors header is not a JSON object", name);
        goto fail;
    }
    out->tensors = zt_calloc(json_object_size(root) + 1, sizeof *out->tensors);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if (parse_metadata(name, val, err, errlen)) goto fail;
            continue;
        }
        zt_st_tensor_t *t = &out->tensors[out->ntensors];
        if (strlen(key) >= sizeof t->name) {
            zt_err(err, errlen, "%s: tensor name longer than %zu bytes: %.64s...", name, sizeof t->name - 1, key);
            goto fail;
        }
        snprintf(t->name, sizeof t->name, "%s", key);
        if (parse_tensor(name, val, t, err, errlen)) goto fail;
        out->ntensors++;
    }
    json_decref(root);
    root = NULL;

    /* Offsets: consistent with dtype x shape, inside the data, no overlap. */
    for (int i = 0; i < out->ntensors; i++) {
        zt_st_tensor_t *t = &out->tensors[i];
        uint64_t need = t->numel * (uint64_t)zt_st_dtype_size(t->dtype);
        if (t->end < t->begin) {
            zt_err(err, errlen, "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed",
                   name, t->name, t->begin, t->end);
            goto fail;
        }
        if (t->end - t->begin != need) {
            char shp[160] = "";
            size_t k = 0;
            for (int d = 0; d < t->ndim && k < sizeof shp - 24; d++)
                k += (size_t)snprintf(shp + k, sizeof shp - k, "%s%" PRId64, d ? ", " : "", t->shape[d]);
            if (t->ndim == 1 && k < sizeof shp - 2) { shp[k++] = ','; shp[k] = 0; }
            zt_err(err, errlen, "%s: tensor %s: data_offsets span %" PRIu64 " bytes, dtype %s x shape (%s) needs %" PRIu64,
                   name, t->name, t->end - t->begin, zt_st_dtype_name(t->dtype), shp, need);
            goto fail;
        }
        if (t->end > data_len) {
            zt_err(err, errlen, "%s: tensor %s: data_offsets end %" PRIu64 " is past the data section (%" PRIu64 " bytes; a truncated file?)",
                   name, t->name, t->end, data_len);
            goto fail;
        }
    }
    /* Sorted by offset the tensors must tile the data section exactly, as the
     * reference reader demands: a gap or a tail is a sign of a corrupt writer. */
    zt_st_tensor_t **ord = zt_malloc(((size_t)out->ntensors + 1) * sizeof *ord);
    for (int i = 0; i < out->ntensors; i++) ord[i] = &out->tensors[i];
    qsort(ord, (size_t)out->ntensors, sizeof *ord, cmp_begin);
    uint64_t pos = 0;
    const zt_st_tensor_t *last = NULL;   /* the tensor that ends at pos */
    for (int i = 0; i < out->ntensors; i++) {
        if (ord[i]->begin < pos) {
            zt_err(err, errlen, "%s: tensor %s overlaps tensor %s", name, ord[i]->name, last->name);
            free(ord);
            goto fail;
        }
        if (ord[i]->begin > pos) {
            zt_err(err, errlen, "%s: tensor %s: %" PRIu64 " unused bytes before its data (the data must be contiguous)",
                   name, ord[i]->name, ord[i]->begin - pos);
            free(ord);
            goto fail;
        }
        pos = ord[i]->end;
        if (ord[i]->end > ord[i]->begin) last = ord[i];
    }
    free(ord);
    if (pos != data_len) {
        zt_err(err, errlen, "%s: %" PRIu64 " bytes after the last tensor's data (the tensors cover %" PRIu64
               " of %" PRIu64 ")", name, data_len - pos, pos, data_len);
        goto fail;
    }
    return 0;
fail:
    json_decref(root);
    zt_st_close(out);
    return -1;
}

static uint64_t le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

int zt_st_parse_buffer(const char *name, const uint8_t *buf, size_t size, zt_st_file_t *out,
                       char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (size < 8) return zt_err(err, errlen, "%s: too short for a safetensors file", name);
    uint64_t n = le64(buf);
    if (n > ZT_ST_MAX_HEADER || n > size - 8)
        return zt_err(err, errlen, "%s: safetensors header length %" PRIu64 " exceeds the file (%zu bytes)",
                      name, n, size);
    return zt_st_parse_header(name, (const char *)buf + 8, (size_t)n, size - 8 - n, out, err, errlen);
}

int zt_st_open(const char *path, zt_st_file_t *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return zt_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    uint8_t lenb[8];
    if (fstat(fileno(fp), &st) != 0 || fread(lenb, 1, 8, fp) != 8) {
        fclose(fp);
        return zt_err(err, errlen, "%s: too short for a safetensors file", path);
    }
    uint64_t size = (uint64_t)st.st_size, n = le64(lenb);
    if (n > ZT_ST_MAX_HEADER || n > size - 8) {
        fclose(fp);
        return zt_err(err, errlen, "%s: safetensors header length %" PRIu64 " exceeds the file (%" PRIu64 " bytes)",
                      path, n, size);
    }
    char *hdr = zt_malloc(n ? n : 1);
    if (fread(hdr, 1, n, fp) != n) {
        free(hdr);
        fclose(fp);
        return zt_err(err, errlen, "%s: short read of the header", path);
    }
    int rc = zt_st_parse_header(path, hdr, n, size - 8 - n, f, err, errlen);
    free(hdr);
    if (rc) { fclose(fp); return -1; }
    f->fp = fp;
    return 0;
}

int zt_st_find(const zt_st_file_t *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return i;
    return -1;
}

int zt_st_read_f32(zt_st_file_t *f, int i, float *out, char *err, size_t errlen)
{
    const zt_st_tensor_t *t = &f->tensors[i];
    if (t->dtype == ZT_ST_U8)
        return zt_err(err, errlen, "%s: tensor %s is U8, not a float tensor", f->path, t->name);
    if (fseeko(f->fp, (off_t)(f->data_start + t->begin), SEEK_SET) != 0)
        return zt_err(err, errlen, "%s: tensor %s: seek failed", f->path, t->name);
    if (t->dtype == ZT_ST_F32) {
        if (fread(out, 4, t->numel, f->fp) != t->numel)
            return zt_err(err, errlen, "%s: tensor %s: short read", f->path, t->name);
        return 0;
    }
    /* Half types are widened in place from the back half of out. */
    uint16_t *h = (uint16_t *)out + t->numel;
    if (fread(h, 2, t->numel, f->fp) != t->numel)
        return zt_err(err, errlen, "%s: tensor %s: short read", f->path, t->name);
    for (uint64_t k = 0; k < t->numel; k++) {
        if (t->dtype == ZT_ST_BF16) {
            uint32_t bits = (uint32_t)h[k] << 16;
            memcpy(&out[k], &bits, 4);
        } else {
            out[k] = zt_fp16_to_f32(h[k]);
        }
    }
    return 0;
}

/* ---- writer ---------------------------------------------------------------- */

int zt_st_writer_open(zt_st_writer_t *w, const char *path, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
    w->fp = fopen(path, "wb");
    if (!w->fp) return zt_err(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    return 0;
}

void zt_st_writer_add(zt_st_writer_t *w, const char *name, int ndim, const int64_t *shape)
{
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 32;
        w->tensors = realloc(w->tensors, (size_t)w->cap * sizeof *w->tensors);
        if (!w->tensors) zt_fatal("out of memory");
    }
    zt_st_tensor_t *t = &w->tensors[w->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = ZT_ST_F32;
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) { t->shape[d] = shape[d]; t->numel *= (uint64_t)shape[d]; }
    t->begin = w->n ? w->tensors[w->n - 1].end : 0;
    t->end = t->begin + 4 * t->numel;
    w->n++;
}

char *zt_st_header_json(const zt_st_tensor_t *t, int n, size_t *len, char *err, size_t errlen)
{
    json_t *root = json_object(), *meta = json_object();
    if (!root || !meta || json_object_set_new(meta, "format", json_string("pt")) ||
        json_object_set_new(root, "__metadata__", meta))
        zt_fatal("out of memory building a safetensors header");
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array(), *e;
        if (!shape) zt_fatal("out of memory building a safetensors header");
        for (int d = 0; d < t[i].ndim; d++)
            if (json_array_append_new(shape, json_integer(t[i].shape[d])))
                zt_fatal("out of memory building a safetensors header");
        e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", zt_st_dtype_name(t[i].dtype), "shape", shape,
                      "data_offsets", (json_int_t)t[i].begin, (json_int_t)t[i].end);
        /* json_object_set_new refuses a key that is not UTF-8, which the reader would refuse too */
        if (!e || json_object_set_new(root, t[i].name, e)) {
            json_decref(root);
            zt_err(err, errlen, "tensor name \"%s\" is not valid UTF-8", t[i].name);
            return NULL;
        }
    }
    char *js = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!js) zt_fatal("out of memory building a safetensors header");
    size_t k = strlen(js), padded = (k + 7) / 8 * 8;
    char *h = zt_malloc(padded + 1);
    memcpy(h, js, k);
    free(js);
    memset(h + k, ' ', padded - k);   /* keeps the data 8-byte aligned, as the reference writer does */
    h[padded] = 0;
    *len = padded;
    return h;
}

int zt_st_writer_begin(zt_st_writer_t *w, char *err, size_t errlen)
{
    size_t k;
    char *h = zt_st_header_json(w->tensors, w->n, &k, err, errlen);
    if (!h) return -1;
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)k >> (8 * i));
    int ok = fwrite(lenb, 1, 8, w->fp) == 8 && fwrite(h, 1, k, w->fp) == k;
    free(h);
    if (!ok) return zt_err(err, errlen, "%s: write failed: %s", w->path, strerror(errno));
    w->next = 0;
    w->written = 0;
    while (w->next < w->n && w->tensors[w->next].end == w->tensors[w->next].begin) w->next++;
    return 0;
}

int zt_st_writer_data(zt_st_writer_t *w, const float *x, size_t n, char *err, size_t errlen)
{
    if (w->next >= w->n || w->written + 4 * (uint64_t)n > w->tensors[w->next].end - w->tensors[w->next].begin)
        zt_fatal("safetensors writer: more data than declared for %s", w->path);
    if (fwrite(x, 4, n, w->fp) != n)
        return zt_err(err, errlen, "%s: write failed: %s", w->path, strerror(errno));
    w->written += 4 * (uint64_t)n;
    while (w->next < w->n && w->written == w->tensors[w->next].end - w->tensors[w->next].begin) {
        w->next++;
        w->written = 0;
    }
    return 0;
}

int zt_st_writer_close(zt_st_writer_t *w, char *err, size_t errlen)
{
    int rc = 0;
    if (w->next != w->n)
        rc = zt_err(err, errlen, "%s: tensor %s was not fully written", w->path, w->tensors[w->next].name);
    if (fclose(w->fp) != 0 && !rc) rc = zt_err(err, errlen, "%s: close failed: %s", w->path, strerror(errno));
    w->fp = NULL;
    free(w->tensors);
    w->tensors = NULL;
    return rc;
}
