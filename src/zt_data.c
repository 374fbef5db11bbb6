/* zt_data.c — token files (HDF5 and llm.c .bin) read as one stream, and the sampler.
 *
 * Files stay open for the life of the dataset and every sample is read on demand
 * (an HDF5 hyperslab or one pread), so memory does not grow with the corpus and
 * any rank can read any sample. Each file contributes floor((n - 1) / T) samples
 * of T + 1 tokens; a sample never straddles two files, so a document boundary
 * between files is never hidden inside a training sequence.
 *
 * Shuffle: the epoch order is a bijection on [0, S) computed per index, never
 * stored: a 4-round balanced Feistel network over the smallest power of four
 * >= S (at least 4), with cycle walking (re-apply until the value falls below S,
 * fewer than 4 applications on average since the domain is < 4S). Round keys
 * come from splitmix64 of (seed, epoch), so the order is a pure function of
 * (seed, epoch): identical on every rank and at every world size, O(1) memory,
 * and a resumed run maps its sampler position without replaying anything.
 *
 * Errors are returned as one line naming the file; nothing here is fatal except
 * allocation failure, because a bad file must become a collective decision. */
#include "zt_data.h"

#include "zt_common.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BIN_MAGIC 20240520
#define BIN_VERSION 1
#define BIN_HEADER_INTS 256
#define BIN_HEADER_BYTES (BIN_HEADER_INTS * 4)
#define GPT2_EOT 50256

typedef struct {
    char *path;
    int is_h5;
    int fd;                 /* .bin */
    hid_t file, dset;       /* HDF5 */
    int64_t ntok;
    int64_t nsamples;
    int64_t first;          /* index of this file's first sample in the epoch */
    int vocab_attr, eot_attr; /* -1 when absent */
    char tokenizer[32];
    /* SFT sample files: /input_ids and /labels (the samples concatenated), the
     * samples' boundaries (nsamples + 1 offsets, in memory), and for neat-packed rows
     * /segment_ids (-1: none) */
    int is_sft;
    int pairs;              /* preference pairs: nsamples counts pairs, sample 2i + k of the file is pair i's */
    hid_t labels, segs;
    int64_t *offsets;
} zt_file_t;

struct zt_dataset {
    zt_file_t *files;
    int nfiles;
    int pairs;              /* opened by zt_data_open_pairs: a sample of the epoch is a pair */
    int seq_len, vocab_size;
    int64_t nsamples, ntokens;
    uint16_t *bin_buf;      /* (T + 1) staging for uint16 tokens */
};

/* ---- opening --------------------------------------------------------------- */

static int h5_is_file(const char *path, int fd)
{
    /* Signature at offset 0 covers every file we write; H5Fis_hdf5 also finds
     * signatures at 512, 1024, ... (user block). */
    static const unsigned char magic[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    unsigned char buf[8];
    if (pread(fd, buf, 8, 0) == 8 && memcmp(buf, magic, 8) == 0) return 1;
    htri_t r = H5Fis_hdf5(path);
    return r > 0;
}

static int h5_int_attr(hid_t obj, const char *name, int *out)
{
    *out = -1;
    if (H5Aexists(obj, name) <= 0) return 0;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return -1;
    int rc = H5Aread(a, H5T_NATIVE_INT, out) < 0 ? -1 : 0;
    H5Aclose(a);
    return rc;
}

static void h5_str_attr(hid_t obj, const char *name, char *out, size_t len)
{
    out[0] = 0;
    if (H5Aexists(obj, name) <= 0) return;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) return;
    hid_t ft = H5Aget_type(a);
    if (ft >= 0 && H5Tget_class(ft) == H5T_STRING) {
        if (H5Tis_variable_str(ft) > 0) {
            char *s = NULL;
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, H5T_VARIABLE);
            if (H5Aread(a, mt, &s) >= 0 && s) {
                snprintf(out, len, "%s", s);
                H5free_memory(s);
            }
            H5Tclose(mt);
        } else {
            size_t sz = H5Tget_size(ft);
            char *buf = zt_calloc(sz + 1, 1);
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, sz + 1);
            H5Tset_strpad(mt, H5T_STR_NULLTERM);
            if (H5Aread(a, mt, buf) >= 0) snprintf(out, len, "%s", buf);
            H5Tclose(mt);
            free(buf);
        }
    }
    if (ft >= 0) H5Tclose(ft);
    H5Aclose(a);
}

/* 1-D dataset `name` of exactly n elements (n < 0: any), read into out (n or its size) as
 * native type mt; -1 with err */
static int read_1d(zt_file_t *f, const char *name, hid_t mt, int64_t n, void **out, int64_t *got, char *err,
                   size_t errlen)
{
    if (H5Lexists(f->file, name, H5P_DEFAULT) <= 0) return zt_err(err, errlen, "%s: no dataset /%s", f->path, name);
    hid_t d = H5Dopen2(f->file, name, H5P_DEFAULT);
    hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
    hsize_t dims[1] = {0};
    int rank = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    if (rank == 1) H5Sget_simple_extent_dims(sp, dims, NULL);
    if (sp >= 0) H5Sclose(sp);
    int rc = 0;
    if (d < 0 || rank != 1) rc = zt_err(err, errlen, "%s: /%s is not a 1-D dataset", f->path, name);
    else if (n >= 0 && (int64_t)dims[0] != n)
        rc = zt_err(err, errlen, "%s: /%s has %lld elements, /input_ids %lld", f->path, name, (long long)dims[0],
                    (long long)n);
    if (!rc && out) {
        *out = zt_malloc((size_t)dims[0] * H5Tget_size(mt) + 1);
        if (H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0)
            rc = zt_err(err, errlen, "%s: reading /%s failed", f->path, name);
    }
    if (got) *got = (int64_t)dims[0];
    if (d >= 0) H5Dclose(d);
    return rc;
}

/* SFT: /labels beside /input_ids, /sample_offsets (n + 1, from 0 to the token count,
 * non-decreasing) in memory */
static int open_sft(zt_file_t *f, char *err, size_t errlen)
{
    if (read_1d(f, "labels", H5T_NATIVE_INT32, f->ntok, NULL, NULL, err, errlen)) return -1;
    f->labels = H5Dopen2(f->file, "labels", H5P_DEFAULT);
    if (f->labels < 0) return zt_err(err, errlen, "%s: cannot open /labels", f->path);
    int64_t n1 = 0;
    if (read_1d(f, "sample_offsets", H5T_NATIVE_INT64, -1, (void **)&f->offsets, &n1, err, errlen)) return -1;
    if (n1 < 1 || f->offsets[0] != 0 || f->offsets[n1 - 1] != f->ntok)
        return zt_err(err, errlen, "%s: /sample_offsets must run from 0 to the %lld tokens of /input_ids", f->path,
                      (long long)f->ntok);
    for (int64_t i = 0; i + 1 < n1; i++)
        if (f->offsets[i + 1] < f->offsets[i])
            return zt_err(err, errlen, "%s: /sample_offsets decreases at sample %lld", f->path, (long long)i);
    f->nsamples = n1 - 1;
    /* preference pairs (zt_data_write_pairs_h5): whole pairs of plain samples */
    int pairs = -1;
    if (h5_int_attr(f->file, "pairs", &pairs) < 0)
        return zt_err(err, errlen, "%s: unreadable attribute pairs", f->path);
    f->pairs = pairs > 0;
    if (f->pairs && (f->nsamples % 2 || H5Lexists(f->file, "segment_ids", H5P_DEFAULT) > 0))
        return zt_err(err, errlen, "%s: a pairs file needs an even number of samples and no /segment_ids", f->path);
    if (f->pairs) f->nsamples /= 2;
    /* neat packing: /segment_ids beside /input_ids; its values are checked as rows are read */
    if (H5Lexists(f->file, "segment_ids", H5P_DEFAULT) > 0) {
        if (read_1d(f, "segment_ids", H5T_NATIVE_INT32, f->ntok, NULL, NULL, err, errlen)) return -1;
        f->segs = H5Dopen2(f->file, "segment_ids", H5P_DEFAULT);
        if (f->segs < 0) return zt_err(err, errlen, "%s: cannot open /segment_ids", f->path);
    }
    return 0;
}

static int open_h5(zt_file_t *f, char *err, size_t errlen)
{
    f->file = H5Fopen(f->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f->file < 0) return zt_err(err, errlen, "%s: cannot open as HDF5", f->path);
    f->is_sft = H5Lexists(f->file, "input_ids", H5P_DEFAULT) > 0;
    const char *ds_name = f->is_sft ? "input_ids" : "tokens";
    if (!f->is_sft && H5Lexists(f->file, "tokens", H5P_DEFAULT) <= 0)
        return zt_err(err, errlen, "%s: no dataset /tokens (a token file) or /input_ids (an SFT file)", f->path);
    f->dset = H5Dopen2(f->file, ds_name, H5P_DEFAULT);
    if (f->dset < 0) return zt_err(err, errlen, "%s: cannot open dataset /%s", f->path, ds_name);
    hid_t t = H5Dget_type(f->dset);
    H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    if (t >= 0) H5Tclose(t);
    if (cls != H5T_INTEGER)
        return zt_err(err, errlen, "%s: /%s is not an integer dataset", f->path, ds_name);
    hid_t sp = H5Dget_space(f->dset);
    int rank = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[1] = {0};
    if (rank == 1) H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    if (rank != 1) return zt_err(err, errlen, "%s: /%s has rank %d, expected 1", f->path, ds_name, rank);
    f->ntok = (int64_t)dims[0];
    if (f->is_sft && open_sft(f, err, errlen)) return -1;
    if (h5_int_attr(f->dset, "vocab_size", &f->vocab_attr) < 0 ||
        h5_int_attr(f->dset, "eot_token", &f->eot_attr) < 0)
        return zt_err(err, errlen, "%s: unreadable attribute on /tokens", f->path);
    /* Attributes may sit on the dataset or on the root group. */
    if (f->vocab_attr < 0 && h5_int_attr(f->file, "vocab_size", &f->vocab_attr) < 0)
        return zt_err(err, errlen, "%s: unreadable attribute vocab_size", f->path);
    if (f->eot_attr < 0 && h5_int_attr(f->file, "eot_token", &f->eot_attr) < 0)
        return zt_err(err, errlen, "%s: unreadable attribute eot_token", f->path);
    h5_str_attr(f->file, "tokenizer", f->tokenizer, sizeof f->tokenizer);
    if (!f->tokenizer[0]) h5_str_attr(f->dset, "tokenizer", f->tokenizer, sizeof f->tokenizer);
    if (!f->tokenizer[0] && f->vocab_attr == ZT_BYTE_VOCAB) strcpy(f->tokenizer, "byte");
    return 0;
}

static int open_bin(zt_file_t *f, char *err, size_t errlen)
{
    int32_t hdr[BIN_HEADER_INTS];
    struct stat st;
    if (fstat(f->fd, &st) != 0) return zt_err(err, errlen, "%s: stat: %s", f->path, strerror(errno));
    ssize_t got = pread(f->fd, hdr, sizeof hdr, 0);
    if (got < 0) return zt_err(err, errlen, "%s: read: %s", f->path, strerror(errno));
    if (got < (ssize_t)sizeof hdr)
        return zt_err(err, errlen, "%s: not an HDF5 file and too short (%lld bytes) for an llm.c .bin header",
                      f->path, (long long)st.st_size);
    if (hdr[0] != BIN_MAGIC)
        return zt_err(err, errlen, "%s: bad magic %d (expected HDF5 or llm.c .bin magic %d)", f->path,
                      hdr[0], BIN_MAGIC);
    if (hdr[1] != BIN_VERSION)
        return zt_err(err, errlen, "%s: unsupported .bin version %d (expected %d)", f->path, hdr[1],
                      BIN_VERSION);
    if (hdr[2] < 0) return zt_err(err, errlen, "%s: negative token count %d in header", f->path, hdr[2]);
    f->ntok = hdr[2];
    int64_t want = BIN_HEADER_BYTES + 2 * f->ntok;
    if ((int64_t)st.st_size != want) {
        int64_t held = ((int64_t)st.st_size - BIN_HEADER_BYTES) / 2;
        if ((int64_t)st.st_size < want)
            return zt_err(err, errlen, "%s: truncated: header says %lld tokens, file holds %lld", f->path,
                          (long long)f->ntok, (long long)held);
        return zt_err(err, errlen, "%s: size mismatch: header says %lld tokens, file holds %lld", f->path,
                      (long long)f->ntok, (long long)held);
    }
    /* llm.c shards carry no vocabulary or tokenizer: GPT-2 BPE is the convention,
     * reported by zt_data_tokenizer() only when no HDF5 file says otherwise. */
    f->vocab_attr = -1;
    f->eot_attr = -1;
    f->tokenizer[0] = 0;
    return 0;
}

/* pairs: zt_data_open_pairs, which takes pairs files only, as zt_data_open takes none */
static zt_dataset_t *open_dataset(const char *const *files, int nfiles, int seq_len, int vocab_size, int pairs,
                                  char *err, size_t errlen)
{
    if (nfiles <= 0) {
        zt_err(err, errlen, "no data files given");
        return NULL;
    }
    if (seq_len <= 0 || vocab_size <= 0) {
        zt_err(err, errlen, "bad seq_len %d or vocab_size %d", seq_len, vocab_size);
        return NULL;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    zt_dataset_t *ds = zt_calloc(1, sizeof *ds);
    ds->files = zt_calloc((size_t)nfiles, sizeof *ds->files);
    ds->seq_len = seq_len;
    ds->vocab_size = vocab_size;
    ds->pairs = pairs;
    ds->bin_buf = zt_malloc(sizeof(uint16_t) * (size_t)(seq_len + 1));
    for (int i = 0; i < nfiles; i++) {
        zt_file_t *f = &ds->files[i];
        f->fd = -1;
        f->file = f->dset = f->labels = f->segs = -1;
        f->vocab_attr = f->eot_attr = -1;
        ds->nfiles = i + 1;
        f->path = strdup(files[i]);
        if (!f->path) zt_fatal("out of memory");
        f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0) {
            zt_err(err, errlen, "%s: cannot open: %s", f->path, strerror(errno));
            goto fail;
        }
        f->is_h5 = h5_is_file(f->path, f->fd);
        if (f->is_h5) {
            close(f->fd);
            f->fd = -1;
        }
        if ((f->is_h5 ? open_h5(f, err, errlen) : open_bin(f, err, errlen)) != 0) goto fail;
        /* an SFT step must not take a pair's halves as samples of its own (it would train on
         * the rejected answers), nor a preference step plain samples as pairs */
        if (f->pairs != pairs) {
            if (pairs) zt_err(err, errlen, "%s: not a preference pairs file (zt-prep-data --ranking)", f->path);
            else zt_err(err, errlen, "%s: preference pairs need train.stage = dpo", f->path);
            goto fail;
        }
        if (f->vocab_attr > vocab_size) {
            zt_err(err, errlen, "%s: vocab_size attribute %d > model.vocab_size (%d)", f->path,
                   f->vocab_attr, vocab_size);
            goto fail;
        }
        for (int k = 0; k < i && f->tokenizer[0]; k++)
            if (ds->files[k].tokenizer[0]) {
                if (strcmp(f->tokenizer, ds->files[k].tokenizer) != 0) {
                    zt_err(err, errlen, "%s: tokenizer '%s' differs from '%s' of %s", f->path,
                           f->tokenizer, ds->files[k].tokenizer, ds->files[k].path);
                    goto fail;
                }
                break;
            }
        if (i > 0 && f->is_sft != ds->files[0].is_sft) {
            zt_err(err, errlen, "%s: an %s file among %s files (one kind per dataset)", f->path,
                   f->is_sft ? "SFT" : "token", ds->files[0].is_sft ? "SFT" : "token");
            goto fail;
        }
        if (!f->is_sft) f->nsamples = f->ntok > 0 ? (f->ntok - 1) / seq_len : 0;
        f->first = ds->nsamples;
        ds->nsamples += f->nsamples;
        ds->ntokens += f->ntok;
    }
    if (ds->nsamples == 0 && ds->files[0].is_sft) {
        zt_err(err, errlen, "no samples: %s holds none", files[0]);
        goto fail;
    }
    if (ds->nsamples == 0) {
        char names[256];
        if (nfiles == 1) snprintf(names, sizeof names, "%s holds", files[0]);
        else snprintf(names, sizeof names, "%s and %d more files hold", files[0], nfiles - 1);
        zt_err(err, errlen, "no samples: %s %lld tokens, need at least seq_len+1 = %d", names,
               (long long)ds->ntokens, seq_len + 1);
        goto fail;
    }
    return ds;
fail:
    zt_data_close(ds);
    return NULL;
}

void zt_data_close(zt_dataset_t *ds)
{
    if (!ds) return;
    for (int i = 0; i < ds->nfiles; i++) {
        zt_file_t *f = &ds->files[i];
        if (f->dset >= 0) H5Dclose(f->dset);
        if (f->is_sft && f->labels >= 0) H5Dclose(f->labels);
        if (f->segs >= 0) H5Dclose(f->segs);
        if (f->file >= 0) H5Fclose(f->file);
        free(f->offsets);
        if (f->fd >= 0) close(f->fd);
        free(f->path);
    }
    free(ds->files);
    free(ds->bin_buf);
    free(ds);
}

zt_dataset_t *zt_data_open(const char *const *files, int nfiles, int seq_len, int vocab_size, char *err,
                           size_t errlen)
{
    return open_dataset(files, nfiles, seq_len, vocab_size, 0, err, errlen);
}

zt_dataset_t *zt_data_open_pairs(const char *const *files, int nfiles, int seq_len, int vocab_size, char *err,
                                 size_t errlen)
{
    return open_dataset(files, nfiles, seq_len, vocab_size, 1, err, errlen);
}

int zt_data_is_pairs(const zt_dataset_t *ds) { return ds->pairs; }

int64_t zt_data_num_samples(const zt_dataset_t *ds) { return ds->nsamples; }
int64_t zt_data_num_tokens(const zt_dataset_t *ds) { return ds->ntokens; }

const char *zt_data_tokenizer(const zt_dataset_t *ds)
{
    int any_h5 = 0;
    for (int i = 0; i < ds->nfiles; i++) {
        if (ds->files[i].tokenizer[0]) return ds->files[i].tokenizer;
        any_h5 |= ds->files[i].is_h5;
    }
    return any_h5 ? "" : "gpt2-bpe";
}

int zt_data_eot_token(const zt_dataset_t *ds)
{
    for (int i = 0; i < ds->nfiles; i++)
        if (ds->files[i].eot_attr >= 0) return ds->files[i].eot_attr;
    return strcmp(zt_data_tokenizer(ds), "gpt2-bpe") == 0 ? GPT2_EOT : -1;
}

/* ---- the sampler ---------------------------------------------------------- */

/* One Feistel pass over 2*h bits: a bijection on [0, 4^h). */
static uint64_t feistel(uint64_t x, int h, const uint64_t key[4])
{
    uint64_t mask = (h >= 32) ? 0xffffffffULL : ((1ULL << h) - 1);
    uint64_t l = x >> h, r = x & mask;
    for (int k = 0; k < 4; k++) {
        uint64_t f = zt_splitmix64(r ^ key[k]) & mask;
        uint64_t nl = r;
        r = l ^ f;
        l = nl;
    }
    return (l << h) | r;
}

int64_t zt_data_sample_index(const zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle)
{
    int64_t S = ds->nsamples;
    int64_t epoch = g / S, pos = g % S;
    if (!shuffle) return pos;
    int h = 1;
    while (h < 31 && (1LL << (2 * h)) < S) h++;
    uint64_t key[4];
    uint64_t base = zt_splitmix64(zt_splitmix64(seed) ^ (uint64_t)epoch * 0xd1b54a32d192ed03ULL);
    for (int k = 0; k < 4; k++) key[k] = zt_splitmix64(base + (uint64_t)k);
    uint64_t x = (uint64_t)pos;
    do x = feistel(x, h, key);
    while (x >= (uint64_t)S);
    return (int64_t)x;
}

static const zt_file_t *file_of(const zt_dataset_t *ds, int64_t idx)
{
    int lo = 0, hi = ds->nfiles - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ds->files[mid].first <= idx) lo = mid;
        else hi = mid - 1;
    }
    /* Files with no samples share `first` with the next file: skip past them. */
    while (lo < ds->nfiles - 1 && ds->files[lo].nsamples == 0) lo++;
    return &ds->files[lo];
}

int zt_data_read(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *out,
                 char *err, size_t errlen)
{
    if (g < 0) return zt_err(err, errlen, "negative sample index %lld", (long long)g);
    if (zt_data_is_sft(ds)) return zt_err(err, errlen, "%s: an SFT file has no token rows", ds->files[0].path);
    int64_t idx = zt_data_sample_index(ds, g, seed, shuffle);
    const zt_file_t *f = file_of(ds, idx);
    int n = ds->seq_len + 1;
    int64_t off = (idx - f->first) * ds->seq_len; // first token of the sample within the file
    if (f->is_h5) {
        hsize_t start[1] = {(hsize_t)off}, count[1] = {(hsize_t)n};
        hid_t fs = H5Dget_space(f->dset);
        hid_t ms = H5Screate_simple(1, count, NULL);
        herr_t rc = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        if (rc >= 0) rc = H5Dread(f->dset, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, out);
        H5Sclose(ms);
        H5Sclose(fs);
        if (rc < 0)
            return zt_err(err, errlen, "%s: reading tokens [%lld, %lld) failed", f->path,
                          (long long)off, (long long)off + n);
    } else {
        size_t want = sizeof(uint16_t) * (size_t)n;
        ssize_t got = pread(f->fd, ds->bin_buf, want, BIN_HEADER_BYTES + 2 * off);
        if (got != (ssize_t)want)
            return zt_err(err, errlen, "%s: reading tokens [%lld, %lld): %s", f->path, (long long)off,
                          (long long)off + n, got < 0 ? strerror(errno) : "short read");
        for (int i = 0; i < n; i++) out[i] = ds->bin_buf[i];
    }
    for (int i = 0; i < n; i++) {
        if (out[i] < 0)
            return zt_err(err, errlen, "%s: token id %d at position %lld is negative", f->path, out[i],
                          (long long)off + i);
        if (out[i] >= ds->vocab_size)
            return zt_err(err, errlen, "%s: token id %d at position %lld >= model.vocab_size (%d)",
                          f->path, out[i], (long long)off + i, ds->vocab_size);
    }
    return 0;
}

static int read_range(const zt_file_t *f, hid_t d, const char *name, int64_t off, int64_t n, int32_t *out,
                      char *err, size_t errlen)
{
    if (n <= 0) return 0;
    hsize_t start[1] = {(hsize_t)off}, count[1] = {(hsize_t)n};
    hid_t fs = H5Dget_space(d), ms = H5Screate_simple(1, count, NULL);
    herr_t rc = H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
    if (rc >= 0) rc = H5Dread(d, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, out);
    H5Sclose(ms);
    H5Sclose(fs);
    return rc < 0 ? zt_err(err, errlen, "%s: reading /%s [%lld, %lld) failed", f->path, name, (long long)off,
                           (long long)(off + n))
                  : 0;
}

int zt_data_is_sft(const zt_dataset_t *ds) { return ds->nfiles > 0 && ds->files[0].is_sft; }

int zt_data_has_segments(const zt_dataset_t *ds)
{
    for (int i = 0; i < ds->nfiles; i++)
        if (ds->files[i].segs >= 0) return 1;
    return 0;
}

int zt_data_read_pair(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *inp, int32_t *tgt,
                      char *err, size_t errlen)
{
    return zt_data_read_row(ds, g, seed, shuffle, inp, tgt, NULL, NULL, err, errlen);
}

/* One sequence per row: segment 1 everywhere, positions t */
static void plain_row(int T, int32_t *seg, int32_t *pos)
{
    for (int t = 0; t < T; t++) {
        if (seg) seg[t] = 1;
        if (pos) pos[t] = t;
    }
}

/* SFT sample s of file f as a training row (zt_data_read_row) */
static int read_sample(const zt_dataset_t *ds, const zt_file_t *f, int64_t s, int32_t *inp, int32_t *tgt,
                       int32_t *seg, int32_t *pos, char *err, size_t errlen)
{
    const int T = ds->seq_len;
    const int64_t off = f->offsets[s], len = f->offsets[s + 1] - off;
    /* input_ids[0 .. n-1) predict labels[1 .. n): at most T positions (a longer sample's
     * tail is cut), the rest padding that carries no loss */
    const int64_t n = ZT_MIN(len, (int64_t)T + 1);
    /* n may be T + 1 while inp holds T: read into a T + 1 buffer (reading straight into inp
     * wrote one id past its end for every sample longer than T) */
    int32_t *lab = zt_malloc((size_t)(T + 1) * sizeof *lab), *ids = zt_malloc((size_t)(T + 1) * sizeof *ids);
    /* (T + 1) segment ids of the row: the file's, or one sequence (1) without /segment_ids */
    int32_t *sid = zt_malloc((size_t)(T + 1) * sizeof *sid);
    int rc = read_range(f, f->dset, "input_ids", off, n, ids, err, errlen);
    if (!rc) rc = read_range(f, f->labels, "labels", off, n, lab, err, errlen);
    if (f->segs < 0)
        for (int64_t t = 0; t < n; t++) sid[t] = 1;
    else if (!rc)
        rc = read_range(f, f->segs, "segment_ids", off, n, sid, err, errlen);
    if (!rc) memcpy(inp, ids, (size_t)ZT_MIN(n, (int64_t)T) * sizeof *ids);
    free(ids);
    const int pad = f->eot_attr >= 0 ? f->eot_attr : 0;
    for (int64_t t = 0; t < T && !rc; t++) {
        if (t < n - 1) {
            const int32_t id = inp[t], y = lab[t + 1];
            if (id < 0 || id >= ds->vocab_size)
                rc = zt_err(err, errlen, "%s: sample %lld: input id %d at position %lld outside [0, %d)", f->path,
                            (long long)s, id, (long long)t, ds->vocab_size);
            else if (y != -100 && (y < 0 || y >= ds->vocab_size))
                rc = zt_err(err, errlen, "%s: sample %lld: label %d at position %lld is neither -100 nor in [0, %d)",
                            f->path, (long long)s, y, (long long)t + 1, ds->vocab_size);
            else if (sid[t] < 0)
                rc = zt_err(err, errlen, "%s: sample %lld: segment id %d at position %lld is negative", f->path,
                            (long long)s, sid[t], (long long)t);
            /* no target across a segment boundary: the last token of a packed sample
             * would predict the next sample's first token, which it cannot see */
            tgt[t] = y == -100 || sid[t + 1] != sid[t] ? -1 : y;
        } else {
            inp[t] = pad;
            tgt[t] = -1;
            sid[t] = f->segs >= 0 ? 0 : 1; /* the trainer's padding is the file's padding */
        }
    }
    if (!rc && f->segs < 0) plain_row(T, seg, pos);
    else if (!rc) {
        /* positions restart with every segment; the padding (0) is at 0, as LLaMA-Factory's
         * position_ids */
        for (int t = 0; t < T; t++) {
            if (seg) seg[t] = sid[t];
            if (pos) pos[t] = sid[t] == 0 || t == 0 || sid[t - 1] != sid[t] ? 0 : pos[t - 1] + 1;
        }
    }
    free(lab);
    free(sid);
    return rc;
}

int zt_data_read_row(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *inp, int32_t *tgt,
                     int32_t *seg, int32_t *pos, char *err, size_t errlen)
{
    if (ds->pairs) return zt_err(err, errlen, "%s: a pair is two rows (zt_data_read_pair_rows)", ds->files[0].path);
    const int T = ds->seq_len;
    if (!zt_data_is_sft(ds)) {
        int32_t *row = zt_malloc((size_t)(T + 1) * sizeof *row);
        const int rc = zt_data_read(ds, g, seed, shuffle, row, err, errlen);
        if (!rc) {
            memcpy(inp, row, (size_t)T * sizeof *row);
            memcpy(tgt, row + 1, (size_t)T * sizeof *row);
            plain_row(T, seg, pos);
        }
        free(row);
        return rc;
    }
    if (g < 0) return zt_err(err, errlen, "negative sample index %lld", (long long)g);
    const int64_t idx = zt_data_sample_index(ds, g, seed, shuffle);
    const zt_file_t *f = file_of(ds, idx);
    return read_sample(ds, f, idx - f->first, inp, tgt, seg, pos, err, errlen);
}

int zt_data_read_pair_rows(zt_dataset_t *ds, int64_t g, uint64_t seed, int shuffle, int32_t *inp, int32_t *tgt,
                           int32_t *seg, int32_t *pos, char *err, size_t errlen)
{
    if (!ds->pairs) return zt_err(err, errlen, "%s: not opened as preference pairs", ds->files[0].path);
    if (g < 0) return zt_err(err, errlen, "negative sample index %lld", (long long)g);
    const int64_t idx = zt_data_sample_index(ds, g, seed, shuffle), T = ds->seq_len;
    const zt_file_t *f = file_of(ds, idx);
    for (int k = 0; k < 2; k++) /* chosen, then rejected */
        if (read_sample(ds, f, 2 * (idx - f->first) + k, inp + k * T, tgt + k * T, seg ? seg + k * T : NULL,
                        pos ? pos + k * T : NULL, err, errlen))
            return -1;
    return 0;
}

static int h5_put_int_attr(hid_t obj, const char *name, int v);
static int h5_put_str_attr(hid_t obj, const char *name, const char *v);

static int write_sft(const char *path, const int32_t *input_ids, const int32_t *labels, const int32_t *segment_ids,
                     size_t ntokens, const int64_t *sample_offsets, size_t nsamples, int vocab_size, int eot_token,
                     const char *tokenizer, int pairs, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return zt_err(err, errlen, "%s: cannot create", path);
    int rc = 0;
    const struct { const char *name; hid_t type; const void *data; hsize_t n; } ds[4] = {
        {"input_ids", H5T_NATIVE_INT32, input_ids, ntokens},
        {"labels", H5T_NATIVE_INT32, labels, ntokens},
        {"sample_offsets", H5T_NATIVE_INT64, sample_offsets, nsamples + 1},
        {"segment_ids", H5T_NATIVE_INT32, segment_ids, ntokens},
    };
    for (int i = 0; i < (segment_ids ? 4 : 3) && !rc; i++) {
        hid_t sp = H5Screate_simple(1, &ds[i].n, NULL);
        hid_t d = H5Dcreate2(f, ds[i].name, ds[i].type == H5T_NATIVE_INT64 ? H5T_STD_I64LE : H5T_STD_I32LE, sp,
                             H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d < 0 || (ds[i].n && H5Dwrite(d, ds[i].type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ds[i].data) < 0))
            rc = zt_err(err, errlen, "%s: writing /%s failed", path, ds[i].name);
        if (d >= 0) H5Dclose(d);
        H5Sclose(sp);
    }
    if (!rc && (h5_put_int_attr(f, "vocab_size", vocab_size) || h5_put_int_attr(f, "eot_token", eot_token) ||
                (tokenizer && h5_put_str_attr(f, "tokenizer", tokenizer)) || (pairs && h5_put_int_attr(f, "pairs", 1))))
        rc = zt_err(err, errlen, "%s: writing attributes failed", path);
    if (H5Fclose(f) < 0 && !rc) rc = zt_err(err, errlen, "%s: close failed", path);
    return rc;
}

int zt_data_write_sft_h5(const char *path, const int32_t *input_ids, const int32_t *labels,
                         const int32_t *segment_ids, size_t ntokens, const int64_t *sample_offsets, size_t nsamples,
                         int vocab_size, int eot_token, const char *tokenizer, char *err, size_t errlen)
{
    return write_sft(path, input_ids, labels, segment_ids, ntokens, sample_offsets, nsamples, vocab_size, eot_token,
                     tokenizer, 0, err, errlen);
}

int zt_data_write_pairs_h5(const char *path, const int32_t *input_ids, const int32_t *labels, size_t ntokens,
                           const int64_t *sample_offsets, size_t nsamples, int vocab_size, int eot_token,
                           const char *tokenizer, char *err, size_t errlen)
{
    if (nsamples % 2) return zt_err(err, errlen, "%s: %zu samples: not whole preference pairs", path, nsamples);
    return write_sft(path, input_ids, labels, NULL, ntokens, sample_offsets, nsamples, vocab_size, eot_token,
                     tokenizer, 1, err, errlen);
}

/* ---- writers ---------------------------------------------------------------- */

static int h5_put_int_attr(hid_t obj, const char *name, int v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = (a < 0 || H5Awrite(a, H5T_NATIVE_INT, &v) < 0) ? -1 : 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

static int h5_put_str_attr(hid_t obj, const char *name, const char *v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    H5Tset_strpad(t, H5T_STR_NULLTERM);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = (a < 0 || H5Awrite(a, t, v) < 0) ? -1 : 0;
    if (a >= 0) H5Aclose(a);
    H5Tclose(t);
    H5Sclose(sp);
    return rc;
}

int zt_data_write_h5_tok(const char *path, const int32_t *tokens, size_t n, int vocab_size,
                         int eot_token, const char *tokenizer, char *err, size_t errlen)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return zt_err(err, errlen, "%s: cannot create HDF5 file", path);
    /* uint16 on disk when it fits (half the size, like llm.c), read back as int32. */
    hid_t ftype = vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_I32LE;
    hsize_t dims[1] = {(hsize_t)n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(dcpl, 0); /* byte-identical files from identical input */
    if (n > 0) {
        hsize_t chunk[1] = {n < 65536 ? (hsize_t)n : 65536};
        H5Pset_chunk(dcpl, 1, chunk);
    }
    hid_t d = H5Dcreate2(f, "tokens", ftype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    int rc = 0;
    if (d < 0 || (n > 0 && H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens) < 0))
        rc = zt_err(err, errlen, "%s: writing /tokens failed", path);
    if (rc == 0 && (h5_put_int_attr(d, "vocab_size", vocab_size) < 0 ||
                    h5_put_int_attr(d, "eot_token", eot_token) < 0 ||
                    h5_put_int_attr(f, "vocab_size", vocab_size) < 0 ||
                    h5_put_int_attr(f, "eot_token", eot_token) < 0 ||
                    (tokenizer && h5_put_str_attr(f, "tokenizer", tokenizer) < 0)))
        rc = zt_err(err, errlen, "%s: writing attributes failed", path);
    if (d >= 0) H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
    if (H5Fclose(f) < 0 && rc == 0) rc = zt_err(err, errlen, "%s: closing failed", path);
    return rc;
}

int zt_data_write_h5(const char *path, const int32_t *tokens, size_t n, int vocab_size,
                     int eot_token, char *err, size_t errlen)
{
    return zt_data_write_h5_tok(path, tokens, n, vocab_size, eot_token,
                                vocab_size == ZT_BYTE_VOCAB ? "byte" : NULL, err, errlen);
}

int zt_data_write_bin(const char *path, const int32_t *tokens, size_t n, char *err, size_t errlen)
{
    if (n > INT32_MAX) return zt_err(err, errlen, "%s: %zu tokens do not fit a .bin header", path, n);
    int32_t hdr[BIN_HEADER_INTS] = {BIN_MAGIC, BIN_VERSION, (int32_t)n};
    FILE *fp = fopen(path, "wb");
    if (!fp) return zt_err(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    int rc = fwrite(hdr, sizeof hdr, 1, fp) == 1 ? 0 : -1;
    uint16_t buf[4096];
    for (size_t i = 0; rc == 0 && i < n; i += 4096) {
        size_t m = ZT_MIN(n - i, (size_t)4096);
        for (size_t j = 0; j < m; j++) {
            if (tokens[i + j] < 0 || tokens[i + j] > 65535) {
                fclose(fp);
                return zt_err(err, errlen, "%s: token id %d at position %zu does not fit uint16", path,
                              tokens[i + j], i + j);
            }
            buf[j] = (uint16_t)tokens[i + j];
        }
        if (fwrite(buf, sizeof *buf, m, fp) != m) rc = -1;
    }
    if (fclose(fp) != 0) rc = -1;
    if (rc != 0) return zt_err(err, errlen, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
