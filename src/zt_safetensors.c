/* zt_safetensors.c — strict safetensors reader and streaming writer.
 *
 * The JSON header of a downloaded model is untrusted input, so instead of a
 * general JSON library this is a recursive-descent reader for exactly the
 * safetensors schema (an object of tensor objects plus an optional string map
 * "__metadata__"); anything else is rejected with a message naming the file and
 * the tensor. All offsets are validated against dtype x shape and the data
 * section before the data is read, and tensors may not overlap. */
#include "zt_safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zt_common.h"

typedef struct {
    const char *s;
    size_t n, i;
    const char *file;
    char *err;
    size_t errlen;
} jp_t;

static int jp_fail(jp_t *p, const char *what)
{
    return zt_err(p->err, p->errlen, "%s: safetensors header: %s at byte %zu", p->file, what, p->i);
}

static void jp_ws(jp_t *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int jp_expect(jp_t *p, char c)
{
    jp_ws(p);
    if (p->i >= p->n || p->s[p->i] != c) {
        char msg[32];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        return jp_fail(p, msg);
    }
    p->i++;
    return 0;
}

/* Peeks the next non-space character (0 at end). */
static char jp_peek(jp_t *p)
{
    jp_ws(p);
    return p->i < p->n ? p->s[p->i] : 0;
}

static void put_utf8(char *out, size_t cap, size_t *k, unsigned cp)
{
    unsigned char b[4];
    int nb;
    if (cp < 0x80) { b[0] = (unsigned char)cp; nb = 1; }
    else if (cp < 0x800) { b[0] = 0xC0 | (cp >> 6); b[1] = 0x80 | (cp & 0x3F); nb = 2; }
    else if (cp < 0x10000) {
        b[0] = 0xE0 | (cp >> 12); b[1] = 0x80 | ((cp >> 6) & 0x3F); b[2] = 0x80 | (cp & 0x3F); nb = 3;
    } else {
        b[0] = 0xF0 | (cp >> 18); b[1] = 0x80 | ((cp >> 12) & 0x3F);
        b[2] = 0x80 | ((cp >> 6) & 0x3F); b[3] = 0x80 | (cp & 0x3F); nb = 4;
    }
    for (int j = 0; j < nb; j++)
        if (*k + 1 < cap) out[(*k)++] = (char)b[j];
}

static int hex4(jp_t *p, unsigned *v)
{
    if (p->i + 4 > p->n) return jp_fail(p, "truncated \\u escape");
    *v = 0;
    for (int j = 0; j < 4; j++) {
        char c = p->s[p->i++];
        unsigned d;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else return jp_fail(p, "bad \\u escape");
        *v = *v * 16 + d;
    }
    return 0;
}

/* Reads a JSON string into out (NUL-terminated); longer than cap is an error. */
static int jp_string(jp_t *p, char *out, size_t cap)
{
    if (jp_expect(p, '"')) return -1;
    size_t k = 0;
    for (;;) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i++];
        if (c == '"') break;
        if (c < 0x20) return jp_fail(p, "control character in string");
        if (c != '\\') {
            if (k + 1 >= cap) return jp_fail(p, "string too long");
            out[k++] = (char)c;
            continue;
        }
        if (p->i >= p->n) return jp_fail(p, "unterminated escape");
        char e = p->s[p->i++];
        char r;
        switch (e) {
        case '"': r = '"'; break;
        case '\\': r = '\\'; break;
        case '/': r = '/'; break;
        case 'b': r = '\b'; break;
        case 'f': r = '\f'; break;
        case 'n': r = '\n'; break;
        case 'r': r = '\r'; break;
        case 't': r = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(p, &cp)) return -1;
            if (cp >= 0xD800 && cp < 0xDC00) {   /* surrogate pair */
                unsigned lo;
                if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
                    return jp_fail(p, "lone surrogate");
                p->i += 2;
                if (hex4(p, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return jp_fail(p, "bad surrogate pair");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return jp_fail(p, "lone surrogate");
            }
            if (cp == 0) return jp_fail(p, "NUL in string");
            size_t before = k;
            put_utf8(out, cap, &k, cp);
            if (k + 1 >= cap && before == k) return jp_fail(p, "string too long");
            continue;
        }
        default: return jp_fail(p, "bad escape");
        }
        if (k + 1 >= cap) return jp_fail(p, "string too long");
        out[k++] = r;
    }
    out[k] = 0;
    return 0;
}

/* Non-negative integer (no sign, fraction or exponent: offsets and dims only). */
static int jp_uint(jp_t *p, uint64_t *v)
{
    jp_ws(p);
    size_t start = p->i;
    *v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = (unsigned)(p->s[p->i] - '0');
        if (*v > (UINT64_MAX - d) / 10) return jp_fail(p, "integer overflow");
        *v = *v * 10 + d;
        p->i++;
    }
    if (p->i == start) return jp_fail(p, "expected a non-negative integer");
    if (p->i - start > 1 && p->s[start] == '0') return jp_fail(p, "leading zero");
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return jp_fail(p, "expected an integer");
    return 0;
}

/* [u, u, ...] with at most max entries. */
static int jp_uint_array(jp_t *p, uint64_t *v, int max, int *count)
{
    if (jp_expect(p, '[')) return -1;
    *count = 0;
    if (jp_peek(p) == ']') { p->i++; return 0; }
    for (;;) {
        if (*count >= max) return jp_fail(p, "too many array entries");
        if (jp_uint(p, &v[*count])) return -1;
        (*count)++;
        char c = jp_peek(p);
        if (c == ',') { p->i++; continue; }
        if (c == ']') { p->i++; return 0; }
        return jp_fail(p, "expected ',' or ']'");
    }
}

static int dtype_size(zt_st_dtype_t d) { return d == ZT_ST_F32 ? 4 : 2; }

static const char *dtype_name(zt_st_dtype_t d)
{
    return d == ZT_ST_F32 ? "F32" : d == ZT_ST_F16 ? "F16" : "BF16";
}

static int parse_metadata(jp_t *p)
{
    char k[256], v[1024];
    if (jp_expect(p, '{')) return -1;
    if (jp_peek(p) == '}') { p->i++; return 0; }
    for (;;) {
        if (jp_string(p, k, sizeof k) || jp_expect(p, ':') || jp_string(p, v, sizeof v)) return -1;
        char c = jp_peek(p);
        if (c == ',') { p->i++; continue; }
        if (c == '}') { p->i++; return 0; }
        return jp_fail(p, "expected ',' or '}' in __metadata__");
    }
}

static int parse_tensor(jp_t *p, zt_st_tensor_t *t)
{
    int have_dtype = 0, have_shape = 0, have_off = 0;
    char key[64], val[32];
    if (jp_expect(p, '{')) return -1;
    for (;;) {
        if (jp_string(p, key, sizeof key) || jp_expect(p, ':')) return -1;
        if (!strcmp(key, "dtype") && !have_dtype) {
            if (jp_string(p, val, sizeof val)) return -1;
            if (!strcmp(val, "F32")) t->dtype = ZT_ST_F32;
            else if (!strcmp(val, "F16")) t->dtype = ZT_ST_F16;
            else if (!strcmp(val, "BF16")) t->dtype = ZT_ST_BF16;
            else
                return zt_err(p->err, p->errlen, "%s: tensor %s: dtype %s is not supported (F32, F16, BF16)",
                              p->file, t->name, val);
            have_dtype = 1;
        } else if (!strcmp(key, "shape") && !have_shape) {
            uint64_t d[ZT_ST_MAX_DIMS];
            if (jp_uint_array(p, d, ZT_ST_MAX_DIMS, &t->ndim)) return -1;
            t->numel = 1;
            for (int i = 0; i < t->ndim; i++) {
                if (d[i] > (uint64_t)INT64_MAX || (d[i] && t->numel > UINT64_MAX / 8 / d[i]))
                    return zt_err(p->err, p->errlen, "%s: tensor %s: shape too large", p->file, t->name);
                t->shape[i] = (int64_t)d[i];
                t->numel *= d[i];
            }
            have_shape = 1;
        } else if (!strcmp(key, "data_offsets") && !have_off) {
            uint64_t o[2];
            int n;
            if (jp_uint_array(p, o, 2, &n)) return -1;
            if (n != 2)
                return zt_err(p->err, p->errlen, "%s: tensor %s: data_offsets needs 2 entries",
                              p->file, t->name);
            t->begin = o[0];
            t->end = o[1];
            have_off = 1;
        } else {
            return zt_err(p->err, p->errlen, "%s: tensor %s: unexpected or repeated key \"%s\"",
                          p->file, t->name, key);
        }
        char c = jp_peek(p);
        if (c == ',') { p->i++; continue; }
        if (c == '}') { p->i++; break; }
        return jp_fail(p, "expected ',' or '}'");
    }
    if (!have_dtype || !have_shape || !have_off)
        return zt_err(p->err, p->errlen, "%s: tensor %s: needs dtype, shape and data_offsets",
                      p->file, t->name);
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const zt_st_tensor_t *x = *(zt_st_tensor_t *const *)a, *y = *(zt_st_tensor_t *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
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
    jp_t p = { hdr, n, 0, name, err, errlen };
    int cap = 0;
    int have_meta = 0;
    if (jp_expect(&p, '{')) goto fail;
    if (jp_peek(&p) == '}') {
        p.i++;
    } else {
        for (;;) {
            char key[256];
            if (jp_string(&p, key, sizeof key) || jp_expect(&p, ':')) goto fail;
            if (!strcmp(key, "__metadata__")) {
                if (have_meta) { jp_fail(&p, "repeated __metadata__"); goto fail; }
                have_meta = 1;
                if (parse_metadata(&p)) goto fail;
            } else {
                if (zt_st_find(out, key) >= 0) {
                    zt_err(err, errlen, "%s: tensor %s appears twice", name, key);
                    goto fail;
                }
                if (out->ntensors == cap) {
                    cap = cap ? 2 * cap : 16;
                    zt_st_tensor_t *nt = realloc(out->tensors, (size_t)cap * sizeof *nt);
                    if (!nt) zt_fatal("out of memory parsing %s", name);
                    out->tensors = nt;
                }
                zt_st_tensor_t *t = &out->tensors[out->ntensors];
                memset(t, 0, sizeof *t);
                snprintf(t->name, sizeof t->name, "%s", key);
                if (parse_tensor(&p, t)) goto fail;
                out->ntensors++;
            }
            char c = jp_peek(&p);
            if (c == ',') { p.i++; continue; }
            if (c == '}') { p.i++; break; }
            jp_fail(&p, "expected ',' or '}'");
            goto fail;
        }
    }
    jp_ws(&p);
    if (p.i != n) { jp_fail(&p, "trailing bytes after the header object"); goto fail; }

    /* Offsets: consistent with dtype x shape, inside the data, no overlap. */
    for (int i = 0; i < out->ntensors; i++) {
        zt_st_tensor_t *t = &out->tensors[i];
        uint64_t need = t->numel * (uint64_t)dtype_size(t->dtype);
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
                   name, t->name, t->end - t->begin, dtype_name(t->dtype), shp, need);
            goto fail;
        }
        if (t->end > data_len) {
            zt_err(err, errlen, "%s: tensor %s: data_offsets end %" PRIu64 " is past the data section (%" PRIu64 " bytes)",
                   name, t->name, t->end, data_len);
            goto fail;
        }
    }
    if (out->ntensors > 1) {
        zt_st_tensor_t **ord = malloc((size_t)out->ntensors * sizeof *ord);
        if (!ord) zt_fatal("out of memory parsing %s", name);
        for (int i = 0; i < out->ntensors; i++) ord[i] = &out->tensors[i];
        qsort(ord, (size_t)out->ntensors, sizeof *ord, cmp_begin);
        const zt_st_tensor_t *far = NULL;   /* non-empty tensor reaching furthest so far */
        for (int i = 0; i < out->ntensors; i++) {
            if (ord[i]->end == ord[i]->begin) continue;
            if (far && ord[i]->begin < far->end) {
                zt_err(err, errlen, "%s: tensor %s overlaps tensor %s", name, ord[i]->name, far->name);
                free(ord);
                goto fail;
            }
            if (!far || ord[i]->end > far->end) far = ord[i];
        }
        free(ord);
    }
    return 0;
fail:
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

static float f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    if (e == 0) {
        if (m == 0) bits = s;
        else {  /* subnormal: normalise */
            int sh = 0;
            while (!(m & 0x400)) { m <<= 1; sh++; }
            m &= 0x3FF;
            bits = s | ((uint32_t)(127 - 15 + 1 - sh) << 23) | (m << 13);
        }
    } else if (e == 31) {
        bits = s | 0x7F800000u | (m << 13);
    } else {
        bits = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int zt_st_read_f32(zt_st_file_t *f, int i, float *out, char *err, size_t errlen)
{
    const zt_st_tensor_t *t = &f->tensors[i];
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
            out[k] = f16_to_f32(h[k]);
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

int zt_st_writer_begin(zt_st_writer_t *w, char *err, size_t errlen)
{
    size_t cap = 256 + (size_t)w->n * (6 * sizeof w->tensors[0].name + 200), k = 0;
    char *h = zt_malloc(cap);
    k += (size_t)snprintf(h + k, cap - k, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < w->n; i++) {
        const zt_st_tensor_t *t = &w->tensors[i];
        k += (size_t)snprintf(h + k, cap - k, ",\"");
        for (const unsigned char *c = (const unsigned char *)t->name; *c; c++) {  /* JSON escape */
            if (*c == '"' || *c == '\\') { h[k++] = '\\'; h[k++] = (char)*c; }
            else if (*c < 0x20) k += (size_t)snprintf(h + k, cap - k, "\\u%04x", *c);
            else h[k++] = (char)*c;
        }
        k += (size_t)snprintf(h + k, cap - k, "\":{\"dtype\":\"F32\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++)
            k += (size_t)snprintf(h + k, cap - k, "%s%" PRId64, d ? "," : "", t->shape[d]);
        k += (size_t)snprintf(h + k, cap - k, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              t->begin, t->end);
    }
    k += (size_t)snprintf(h + k, cap - k, "}");
    while (k % 8) h[k++] = ' ';     /* keeps the data 8-byte aligned, as the reference writer does */
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
