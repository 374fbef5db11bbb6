/* zt_hf.c — Hugging Face model directories (config.json + safetensors, single
 * or sharded): reading tensor ranges as fp32 and writing a sharded save from
 * several processes.
 *
 * Every file is opened once and then read or written with pread/pwrite at
 * computed offsets, so ranks never share a file position and nothing is ever
 * buffered whole: F32 goes straight between the caller's array and the file,
 * half types through one bounded staging buffer. The safetensors headers are
 * validated by zt_safetensors.c (offsets tile the data, which lies inside the
 * file), so a read here can only come up short if the file shrinks under us. */
#include "zt_hf.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zt_bf16.h"
#include "zt_common.h"
#include "zt_fp16.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian and is copied as is: a little-endian host is assumed"
#endif

#define STAGE_BYTES ((size_t)8 << 20)
#define IO_MAX ((size_t)1 << 30)   /* per syscall: Linux moves at most 2 GiB - 4 KiB per call */
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* ---- shared helpers ------------------------------------------------------------- */

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = zt_malloc(a + b + 2);
    memcpy(p, dir, a);
    size_t k = a;
    if (k && p[k - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(zt_malloc(n), s, n);
}

/* Full pread: 0, or -1 with errno (0 for end of file). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
    char *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, ZT_MIN(len, IO_MAX), (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
    const char *p = buf;
    while (len) {
        ssize_t r = pwrite(fd, p, ZT_MIN(len, IO_MAX), (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;
            return -1;
        }
        p += r;
        off += (uint64_t)r;
        len -= (size_t)r;
    }
    return 0;
}

static const char *io_reason(void) { return errno ? strerror(errno) : "unexpected end of file"; }

/* A JSON file as an object; messages carry jansson's line:column. */
static json_t *load_json_object(const char *path, char *err, size_t errlen)
{
    size_t n = 0;
    char *text = zt_read_file(path, &n, err, errlen);
    if (!text) return NULL;
    json_error_t je;
    json_t *j = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!j) {
        zt_err(err, errlen, "%s:%d:%d: bad JSON: %s", path, je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        zt_err(err, errlen, "%s: not a JSON object", path);
        return NULL;
    }
    return j;
}

/* 1 if path exists, 0 if not, -1 (message in err) when it cannot be told. */
static int exists(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) == 0) return 1;
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    return zt_err(err, errlen, "%s: %s", path, strerror(errno));
}

/* ---- reader ---------------------------------------------------------------------- */

typedef struct { int shard, idx; } ref_t;

struct zt_hf_dir {
    char *path, *config_path, *index_path;   /* index_path NULL for a single file */
    json_t *config;
    int nshards;
    zt_st_file_t *shards;
    char **shard_names;       /* as the index names them (the file name for a single file) */
    int n;
    ref_t *refs;
    json_t *by_name;          /* tensor name -> index into refs */
    void *stage;
};

void zt_hf_close(zt_hf_dir_t *d)
{
    if (!d) return;
    for (int s = 0; s < d->nshards; s++) {
        zt_st_close(&d->shards[s]);
        free(d->shard_names[s]);
    }
    free(d->shards);
    free(d->shard_names);
    free(d->refs);
    json_decref(d->by_name);
    json_decref(d->config);
    free(d->stage);
    free(d->path);
    free(d->config_path);
    free(d->index_path);
    free(d);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Opens shard d->shard_names[s] into d->shards[s]; a missing shard is reported against the index. */
static int open_shard(zt_hf_dir_t *d, int s, const char *for_tensor, char *err, size_t errlen)
{
    char *p = join(d->path, d->shard_names[s]);
    int rc = 0;
    int e = d->index_path ? exists(p, err, errlen) : 1;
    if (e < 0) rc = -1;
    else if (e == 0)
        rc = zt_err(err, errlen, "%s: shard %s (of tensor %s) does not exist: %s", d->index_path,
                    d->shard_names[s], for_tensor, p);
    else if (zt_st_open(p, &d->shards[s], err, errlen))
        rc = -1;
    if (!rc) (void)posix_fadvise(fileno(d->shards[s].fp), 0, 0, POSIX_FADV_SEQUENTIAL);   /* a hint only */
    free(p);
    return rc;
}

/* The index: distinct shard names, sorted (model-00001-... first). */
static int read_index(zt_hf_dir_t *d, json_t **wm_out, char *err, size_t errlen)
{
    json_t *idx = load_json_object(d->index_path, err, errlen);
    if (!idx) return -1;
    json_t *wm = json_object_get(idx, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(idx);
        return zt_err(err, errlen, "%s: no \"weight_map\" object (tensor name -> shard file)", d->index_path);
    }
    json_incref(wm);
    json_decref(idx);
    json_t *files = json_object();
    if (!files) zt_fatal("out of memory");
    const char *name;
    json_t *v;
    int rc = 0;
    json_object_foreach(wm, name, v) {
        const char *f = json_string_value(v);
        /* shard names are plain file names: nothing may escape the directory */
        if (!f || !f[0] || strchr(f, '/') || !strcmp(f, ".") || !strcmp(f, "..")) {
            rc = zt_err(err, errlen, "%s: weight_map entry of tensor %s is not a file name in the directory",
                        d->index_path, name);
            break;
        }
        if (!json_object_get(files, f) && json_object_set_new(files, f, json_string(name))) zt_fatal("out of memory");
    }
    if (!rc) {
        int ns = (int)json_object_size(files);
        d->shards = zt_calloc((size_t)ns, sizeof *d->shards);
        d->shard_names = zt_calloc((size_t)ns, sizeof *d->shard_names);
        int k = 0;
        json_object_foreach(files, name, v) d->shard_names[k++] = dupstr(name);
        qsort(d->shard_names, (size_t)ns, sizeof *d->shard_names, cmp_str);
        d->nshards = ns;   /* zt_hf_close copes with shards not opened yet */
        for (int s = 0; s < ns && !rc; s++)
            rc = open_shard(d, s, json_string_value(json_object_get(files, d->shard_names[s])), err, errlen);
    }
    json_decref(files);
    if (rc) {
        json_decref(wm);
        return -1;
    }
    *wm_out = wm;
    return 0;
}

/* Every shard tensor in one table; a name in two shards, or one the index maps
 * elsewhere or not at all, is refused. */
static int build_table(zt_hf_dir_t *d, json_t *wm, char *err, size_t errlen)
{
    int total = 0;
    for (int s = 0; s < d->nshards; s++) total += d->shards[s].ntensors;
    d->refs = zt_calloc((size_t)total + 1, sizeof *d->refs);
    d->by_name = json_object();
    if (!d->by_name) zt_fatal("out of memory");
    for (int s = 0; s < d->nshards; s++)
        for (int k = 0; k < d->shards[s].ntensors; k++) {
            const char *name = d->shards[s].tensors[k].name;
            json_t *prev = json_object_get(d->by_name, name);
            if (prev) {
                const ref_t *r = &d->refs[json_integer_value(prev)];
                return zt_err(err, errlen, "tensor %s is in two shards: %s and %s", name,
                              d->shards[r->shard].path, d->shards[s].path);
            }
            if (wm) {
                const char *mapped = json_string_value(json_object_get(wm, name));
                if (!mapped)
                    return zt_err(err, errlen, "%s: tensor %s of %s is missing from weight_map", d->index_path,
                                  name, d->shards[s].path);
                if (strcmp(mapped, d->shard_names[s]))
                    return zt_err(err, errlen, "%s: maps tensor %s to %s, which does not hold it (%s does)",
                                  d->index_path, name, mapped, d->shard_names[s]);
            }
            if (json_object_set_new(d->by_name, name, json_integer(d->n))) zt_fatal("out of memory");
            d->refs[d->n++] = (ref_t){ s, k };
        }
    if (wm) {
        const char *name;
        json_t *v;
        json_object_foreach(wm, name, v)
            if (!json_object_get(d->by_name, name))
                return zt_err(err, errlen, "%s: maps tensor %s to %s, which does not hold it", d->index_path, name,
                              json_string_value(v));
    }
    return 0;
}

zt_hf_dir_t *zt_hf_open(const char *dir, char *err, size_t errlen)
{
    zt_hf_dir_t *d = zt_calloc(1, sizeof *d);
    d->path = dupstr(dir);
    d->config_path = join(dir, "config.json");
    json_t *wm = NULL;
    char *single = join(dir, SINGLE_NAME);
    int e;
    if (!(d->config = load_json_object(d->config_path, err, errlen))) goto fail;
    if ((e = exists(single, err, errlen)) < 0) goto fail;
    if (e) {
        d->shards = zt_calloc(1, sizeof *d->shards);
        d->shard_names = zt_calloc(1, sizeof *d->shard_names);
        d->shard_names[0] = dupstr(SINGLE_NAME);
        d->nshards = 1;
        if (open_shard(d, 0, NULL, err, errlen)) goto fail;
    } else {
        d->index_path = join(dir, INDEX_NAME);
        if ((e = exists(d->index_path, err, errlen)) < 0) goto fail;
        if (!e) {
            char *bin = join(dir, "pytorch_model.bin");
            int hasbin = exists(bin, err, errlen) == 1;
            free(bin);
            zt_err(err, errlen, "%s: no weights file (%s or %s)%s", dir, SINGLE_NAME, INDEX_NAME,
                   hasbin ? "; pytorch_model.bin is not read: convert it to safetensors" : "");
            goto fail;
        }
        if (read_index(d, &wm, err, errlen)) goto fail;
    }
    if (build_table(d, wm, err, errlen)) goto fail;
    json_decref(wm);
    free(single);
    return d;
fail:
    json_decref(wm);
    free(single);
    zt_hf_close(d);
    return NULL;
}

const json_t *zt_hf_config(const zt_hf_dir_t *d) { return d->config; }
const char *zt_hf_config_path(const zt_hf_dir_t *d) { return d->config_path; }
const char *zt_hf_path(const zt_hf_dir_t *d) { return d->path; }
int zt_hf_ntensors(const zt_hf_dir_t *d) { return d->n; }

static const zt_st_tensor_t *tensor_of(const zt_hf_dir_t *d, int i)
{
    return &d->shards[d->refs[i].shard].tensors[d->refs[i].idx];
}

const char *zt_hf_tensor_name(const zt_hf_dir_t *d, int i)
{
    return i >= 0 && i < d->n ? tensor_of(d, i)->name : NULL;
}

int zt_hf_find(const zt_hf_dir_t *d, const char *name, int *ndim, int64_t *shape, zt_st_dtype_t *dtype,
               const char **file)
{
    const json_t *v = json_object_get(d->by_name, name);
    if (!v) return -1;
    int i = (int)json_integer_value(v);
    const zt_st_tensor_t *t = tensor_of(d, i);
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
    if (dtype) *dtype = t->dtype;
    if (file) *file = d->shards[d->refs[i].shard].path;
    return i;
}

/* Separate restrict-qualified loops so that the conversions vectorize. */
static void widen_bf16(const uint16_t *restrict h, float *restrict out, size_t n)
{
    for (size_t k = 0; k < n; k++) out[k] = zt_bf16_to_f32(h[k]);
}

static void widen_f16(const uint16_t *restrict h, float *restrict out, size_t n)
{
    for (size_t k = 0; k < n; k++) out[k] = zt_fp16_to_f32(h[k]);
}

/* One piece of a 16-bit read, for the reader thread. */
typedef struct {
    int fd;
    void *buf;
    size_t bytes;
    uint64_t off;
    int failed; /* errno */
} piece_t;

static void *read_piece(void *arg)
{
    piece_t *p = arg;
    if (pread_full(p->fd, p->buf, p->bytes, p->off)) p->failed = errno ? errno : EIO;
    return NULL;
}

int zt_hf_read(zt_hf_dir_t *d, int i, size_t start, size_t n, float *out, char *err, size_t errlen)
{
    if (i < 0 || i >= d->n) return zt_err(err, errlen, "%s: no tensor number %d (%d tensors)", d->path, i, d->n);
    const zt_st_file_t *f = &d->shards[d->refs[i].shard];
    const zt_st_tensor_t *t = tensor_of(d, i);
    if (start > t->numel || n > t->numel - start)
        return zt_err(err, errlen, "%s: tensor %s: elements [%zu, %zu + %zu) are outside its %" PRIu64 " elements", f->path,
                      t->name, start, start, n, t->numel);
    if (t->dtype == ZT_ST_U8)
        return zt_err(err, errlen, "%s: tensor %s is U8 (bytes, as bitsandbytes stores a 4-bit weight), not a float "
                                   "tensor", f->path, t->name);
    int fd = fileno(f->fp);
    size_t es = (size_t)zt_st_dtype_size(t->dtype);
    uint64_t off = f->data_start + t->begin + (uint64_t)start * es;
    if (t->dtype == ZT_ST_F32) {
        /* in pieces, each asking the kernel for the next ones first: one huge pread of a
         * cold file is served by synchronous readahead, one window at a time, at a
         * fraction of the disk's speed (measured: 310 MB/s against cat's 1.4 GB/s) */
        const size_t per = STAGE_BYTES / 4;
        for (size_t k = 0; k < n; k += per) {
            const size_t m = ZT_MIN(per, n - k);
            if (k + per < n)
                (void)posix_fadvise(fd, (off_t)(off + (uint64_t)(k + per) * 4),
                                    (off_t)(ZT_MIN(4 * per, n - k - per) * 4), POSIX_FADV_WILLNEED);
            if (pread_full(fd, out + k, m * 4, off + (uint64_t)k * 4))
                return zt_err(err, errlen, "%s: tensor %s: read failed: %s", f->path, t->name, io_reason());
        }
        return 0;
    }
    /* 16-bit: the read of piece k+1 (a thread) overlaps the widening of piece k, or disk
     * and conversion take turns (measured: about half of dd's rate) */
    if (!d->stage) d->stage = zt_malloc(2 * STAGE_BYTES);
    const size_t per = STAGE_BYTES / es;
    piece_t cur = {fd, d->stage, ZT_MIN(per, n) * es, off, 0}, next;
    if (pread_full(fd, cur.buf, cur.bytes, cur.off))
        return zt_err(err, errlen, "%s: tensor %s: read failed: %s", f->path, t->name, io_reason());
    for (size_t k = 0; k < n; k += per) {
        const size_t m = ZT_MIN(per, n - k);
        pthread_t th;
        int started = 0;
        if (k + per < n) {
            next = (piece_t){fd, (char *)d->stage + ((k / per + 1) % 2) * STAGE_BYTES,
                             ZT_MIN(per, n - k - per) * es, off + (uint64_t)(k + per) * es, 0};
            started = pthread_create(&th, NULL, read_piece, &next) == 0;
            if (!started) read_piece(&next); /* no thread: read it here, in turn */
        }
        if (t->dtype == ZT_ST_BF16) widen_bf16(cur.buf, out + k, m);
        else widen_f16(cur.buf, out + k, m);
        if (started) pthread_join(th, NULL);
        if (k + per < n) {
            if (next.failed)
                return zt_err(err, errlen, "%s: tensor %s: read failed: %s", f->path, t->name, strerror(next.failed));
            cur = next;
        }
    }
    return 0;
}

int zt_hf_read_bytes(zt_hf_dir_t *d, int i, void *out, size_t bytes, char *err, size_t errlen)
{
    if (i < 0 || i >= d->n) return zt_err(err, errlen, "%s: no tensor number %d (%d tensors)", d->path, i, d->n);
    const zt_st_file_t *f = &d->shards[d->refs[i].shard];
    const zt_st_tensor_t *t = tensor_of(d, i);
    if (t->end - t->begin != bytes)
        return zt_err(err, errlen, "%s: tensor %s holds %" PRIu64 " bytes, %zu expected", f->path, t->name,
                      t->end - t->begin, bytes);
    if (pread_full(fileno(f->fp), out, bytes, f->data_start + t->begin))
        return zt_err(err, errlen, "%s: tensor %s: read failed: %s", f->path, t->name, io_reason());
    return 0;
}

int64_t zt_hf_parse_size(const char *s)
{
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    uint64_t v = 0;
    for (; isdigit((unsigned char)*s); s++) {
        if (v > (uint64_t)(INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    while (isspace((unsigned char)*s)) s++;
    size_t k = strlen(s);
    while (k && isspace((unsigned char)s[k - 1])) k--;
    static const struct { const char *unit; uint64_t mult; int bits_if_b; } units[] = {
        { "", 1, 0 }, { "GIB", 1ull << 30, 0 }, { "MIB", 1ull << 20, 0 }, { "KIB", 1ull << 10, 0 },
        { "GB", 1000000000ull, 1 }, { "MB", 1000000ull, 1 }, { "KB", 1000ull, 1 },
    };
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        if (strlen(units[u].unit) != k || strncasecmp(s, units[u].unit, k)) continue;
        if (v > (uint64_t)INT64_MAX / units[u].mult) return -1;
        v *= units[u].mult;
        /* transformers: "5Gb" is gigabits */
        if (units[u].bits_if_b && s[k - 1] == 'b') v /= 8;
        return (int64_t)v;
    }
    return -1;
}

/* ---- writer ---------------------------------------------------------------------- */

typedef struct {
    char *name;          /* file name inside dir */
    char *header;        /* padded JSON */
    size_t hlen;
    uint64_t data_len;
    int fd;              /* this process's, -1 until first write */
} wshard_t;

typedef struct {
    int shard;
    uint64_t begin, numel;
} wtensor_t;

struct zt_hf_writer {
    char *dir;
    zt_st_dtype_t dtype;
    int n, nshards;
    zt_hf_out_tensor_t *t;
    wtensor_t *wt;
    wshard_t *sh;
    uint64_t total;
    uint16_t *stage;
};

static void writer_free(zt_hf_writer_t *w)
{
    for (int s = 0; s < w->nshards; s++) {
        free(w->sh[s].name);
        free(w->sh[s].header);
    }
    free(w->sh);
    free(w->wt);
    free(w->t);
    free(w->stage);
    free(w->dir);
    free(w);
}

zt_hf_writer_t *zt_hf_writer_plan(const char *dir, const zt_hf_out_tensor_t *t, int n, zt_st_dtype_t dtype,
                                  uint64_t max_shard_bytes, char *err, size_t errlen)
{
    if (dtype != ZT_ST_F32 && dtype != ZT_ST_BF16) {
        zt_err(err, errlen, "%s: the writer stores F32 or BF16, not %s", dir, zt_st_dtype_name(dtype));
        return NULL;
    }
    if (n <= 0) {
        zt_err(err, errlen, "%s: no tensors to write", dir);
        return NULL;
    }
    zt_hf_writer_t *w = zt_calloc(1, sizeof *w);
    w->dir = dupstr(dir);
    w->dtype = dtype;
    w->n = n;
    w->t = zt_malloc((size_t)n * sizeof *w->t);
    memcpy(w->t, t, (size_t)n * sizeof *w->t);
    w->wt = zt_calloc((size_t)n, sizeof *w->wt);
    json_t *seen = json_object();
    if (!seen) zt_fatal("out of memory");
    uint64_t es = (uint64_t)zt_st_dtype_size(dtype), cur = 0;
    int shard = 0, in_shard = 0;
    for (int i = 0; i < n; i++) {
        const zt_hf_out_tensor_t *x = &w->t[i];
        if (!memchr(x->name, 0, sizeof x->name) || !x->name[0] || !strcmp(x->name, "__metadata__") ||
            x->ndim < 0 || x->ndim > 2) {
            zt_err(err, errlen, "%s: tensor %d (%.64s): needs a name (not __metadata__) and 0 to 2 dimensions", dir,
                   i, x->name);
            goto fail;
        }
        if (json_object_get(seen, x->name)) {
            zt_err(err, errlen, "%s: tensor %s is listed twice", dir, x->name);
            goto fail;
        }
        if (json_object_set_new(seen, x->name, json_true())) {
            zt_err(err, errlen, "%s: tensor name \"%s\" is not valid UTF-8", dir, x->name);
            goto fail;
        }
        uint64_t numel = 1;
        for (int k = 0; k < x->ndim; k++) {
            if (x->shape[k] < 0 || (x->shape[k] && numel > (UINT64_MAX >> 4) / (uint64_t)x->shape[k])) {
                zt_err(err, errlen, "%s: tensor %s: bad shape", dir, x->name);
                goto fail;
            }
            numel *= (uint64_t)x->shape[k];
        }
        uint64_t bytes = numel * es;
        /* transformers' shard_checkpoint: split before a tensor that would tip the
         * shard over, unless the shard is still empty */
        if (in_shard && cur + bytes > max_shard_bytes) {
            shard++;
            cur = 0;
            in_shard = 0;
        }
        w->wt[i] = (wtensor_t){ shard, cur, numel };
        cur += bytes;
        in_shard++;
        w->total += bytes;
    }
    json_decref(seen);
    seen = NULL;
    w->nshards = shard + 1;
    w->sh = zt_calloc((size_t)w->nshards, sizeof *w->sh);
    zt_st_tensor_t *desc = zt_calloc((size_t)n, sizeof *desc);
    for (int s = 0, i = 0; s < w->nshards; s++) {
        wshard_t *sh = &w->sh[s];
        sh->fd = -1;
        char nm[64];
        if (w->nshards == 1) snprintf(nm, sizeof nm, "%s", SINGLE_NAME);
        else snprintf(nm, sizeof nm, "model-%05d-of-%05d.safetensors", s + 1, w->nshards);
        sh->name = dupstr(nm);
        int k = 0;
        for (; i < n && w->wt[i].shard == s; i++, k++) {
            zt_st_tensor_t *e = &desc[k];
            memset(e, 0, sizeof *e);
            snprintf(e->name, sizeof e->name, "%s", w->t[i].name);
            e->dtype = dtype;
            e->ndim = w->t[i].ndim;
            for (int q = 0; q < e->ndim; q++) e->shape[q] = w->t[i].shape[q];
            e->numel = w->wt[i].numel;
            e->begin = w->wt[i].begin;
            e->end = e->begin + e->numel * es;
            sh->data_len = e->end;
        }
        sh->header = zt_st_header_json(desc, k, &sh->hlen, err, errlen);
        if (!sh->header) {
            free(desc);
            goto fail;
        }
    }
    free(desc);
    return w;
fail:
    json_decref(seen);
    writer_free(w);
    return NULL;
}

int zt_hf_writer_nshards(const zt_hf_writer_t *w) { return w->nshards; }

const char *zt_hf_writer_file(const zt_hf_writer_t *w, int i)
{
    return i >= 0 && i < w->n ? w->sh[w->wt[i].shard].name : NULL;
}

/* 1 if `name` is a weights file name of save_pretrained's (ours or an older save's). */
static int is_weights_name(const char *name)
{
    int a, b, len = 0;
    if (!strcmp(name, SINGLE_NAME) || !strcmp(name, INDEX_NAME)) return 1;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &len) == 2 && len == (int)strlen(name) &&
           strlen(name) == strlen("model-00001-of-00001.safetensors");
}

static int remove_stale(zt_hf_writer_t *w, char *err, size_t errlen)
{
    DIR *dp = opendir(w->dir);
    if (!dp) return zt_err(err, errlen, "%s: cannot open the directory: %s", w->dir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (!rc && (errno = 0, de = readdir(dp))) {
        if (!is_weights_name(de->d_name)) continue;
        int ours = w->nshards > 1 && !strcmp(de->d_name, INDEX_NAME);
        for (int s = 0; s < w->nshards && !ours; s++) ours = !strcmp(de->d_name, w->sh[s].name);
        if (ours) continue;
        char *p = join(w->dir, de->d_name);
        if (unlink(p) != 0) rc = zt_err(err, errlen, "%s: cannot remove this stale weights file: %s", p, strerror(errno));
        free(p);
    }
    if (!rc && errno) rc = zt_err(err, errlen, "%s: cannot list the directory: %s", w->dir, strerror(errno));
    closedir(dp);
    return rc;
}

/* Creates `name` in dir holding buf (and, when size > len, zeros up to size), synced. */
static int create_file(const char *dir, const char *name, const void *buf, size_t len, uint64_t size,
                       const void *prefix, size_t plen, char *err, size_t errlen)
{
    char *p = join(dir, name);
    int rc = 0;
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = zt_err(err, errlen, "%s: cannot create: %s", p, strerror(errno));
    } else {
        if ((plen && pwrite_full(fd, prefix, plen, 0)) || pwrite_full(fd, buf, len, plen))
            rc = zt_err(err, errlen, "%s: write failed: %s", p, strerror(errno));
        else if (size > plen + len && ftruncate(fd, (off_t)size) != 0)
            rc = zt_err(err, errlen, "%s: cannot size to %" PRIu64 " bytes: %s", p, size, strerror(errno));
        else if (fsync(fd) != 0)
            rc = zt_err(err, errlen, "%s: fsync failed: %s", p, strerror(errno));
        if (close(fd) != 0 && !rc) rc = zt_err(err, errlen, "%s: close failed: %s", p, strerror(errno));
    }
    free(p);
    return rc;
}

int zt_hf_writer_create_files(zt_hf_writer_t *w, char *err, size_t errlen)
{
    if (remove_stale(w, err, errlen)) return -1;
    for (int s = 0; s < w->nshards; s++) {
        const wshard_t *sh = &w->sh[s];
        uint8_t lenb[8];
        for (int b = 0; b < 8; b++) lenb[b] = (uint8_t)((uint64_t)sh->hlen >> (8 * b));
        if (create_file(w->dir, sh->name, sh->header, sh->hlen, 8 + sh->hlen + sh->data_len, lenb, 8, err, errlen))
            return -1;
    }
    if (w->nshards == 1) return 0;
    /* the index last: a reader that finds it finds every shard it names */
    json_t *wm = json_object(), *idx;
    if (!wm) zt_fatal("out of memory");
    for (int i = 0; i < w->n; i++)
        if (json_object_set_new(wm, w->t[i].name, json_string(w->sh[w->wt[i].shard].name))) zt_fatal("out of memory");
    idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)w->total, "weight_map", wm);
    if (!idx) zt_fatal("out of memory");
    /* as transformers writes it: indent 2, sorted keys, a final newline */
    char *js = json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(idx);
    if (!js) zt_fatal("out of memory");
    size_t k = strlen(js);
    char *text = zt_malloc(k + 2);
    memcpy(text, js, k);
    text[k] = '\n';
    free(js);
    int rc = create_file(w->dir, INDEX_NAME, text, k + 1, 0, NULL, 0, err, errlen);
    free(text);
    return rc;
}

int zt_hf_writer_write(zt_hf_writer_t *w, int i, size_t start, size_t n, const float *x, char *err, size_t errlen)
{
    if (i < 0 || i >= w->n) return zt_err(err, errlen, "%s: no tensor number %d (%d planned)", w->dir, i, w->n);
    const wtensor_t *t = &w->wt[i];
    wshard_t *sh = &w->sh[t->shard];
    if (start > t->numel || n > t->numel - start)
        return zt_err(err, errlen, "%s/%s: tensor %s: elements [%zu, %zu + %zu) are outside its %" PRIu64 " elements", w->dir,
                      sh->name, w->t[i].name, start, start, n, t->numel);
    if (sh->fd < 0) {
        char *p = join(w->dir, sh->name);
        /* no O_CREAT: a missing file means create_files has not run */
        sh->fd = open(p, O_WRONLY | O_CLOEXEC);
        int e = errno;
        free(p);
        if (sh->fd < 0)
            return zt_err(err, errlen, "%s/%s: cannot open for writing tensor %s: %s", w->dir, sh->name,
                          w->t[i].name, strerror(e));
    }
    size_t es = (size_t)zt_st_dtype_size(w->dtype);
    uint64_t off = 8 + sh->hlen + t->begin + (uint64_t)start * es;
    if (w->dtype == ZT_ST_F32) {
        if (pwrite_full(sh->fd, x, n * 4, off))
            return zt_err(err, errlen, "%s/%s: tensor %s: write failed: %s", w->dir, sh->name, w->t[i].name,
                          strerror(errno));
        return 0;
    }
    if (!w->stage) w->stage = zt_malloc(STAGE_BYTES);
    size_t per = STAGE_BYTES / es;
    for (size_t k = 0; k < n; k += per) {
        size_t m = ZT_MIN(per, n - k);
        uint16_t *restrict h = w->stage;
        const float *restrict src = x + k;
        for (size_t q = 0; q < m; q++) h[q] = zt_bf16_from_f32(src[q]);
        if (pwrite_full(sh->fd, h, m * es, off + (uint64_t)k * es))
            return zt_err(err, errlen, "%s/%s: tensor %s: write failed: %s", w->dir, sh->name, w->t[i].name,
                          strerror(errno));
    }
    return 0;
}

int zt_hf_writer_close(zt_hf_writer_t *w, char *err, size_t errlen)
{
    if (!w) return 0;
    int rc = 0;
    for (int s = 0; s < w->nshards; s++) {
        wshard_t *sh = &w->sh[s];
        if (sh->fd < 0) continue;
        if (fsync(sh->fd) != 0 && !rc)
            rc = zt_err(err, errlen, "%s/%s: fsync failed: %s", w->dir, sh->name, strerror(errno));
        if (close(sh->fd) != 0 && !rc)
            rc = zt_err(err, errlen, "%s/%s: close failed: %s", w->dir, sh->name, strerror(errno));
        sh->fd = -1;
    }
    writer_free(w);
    return rc;
}
