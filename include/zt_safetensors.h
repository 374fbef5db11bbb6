/* zt_safetensors.h — reading and writing the safetensors format (Hugging Face).
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 * optional "__metadata__": {string: string}}), then the raw little-endian data;
 * offsets are relative to the end of the header. The header comes from outside
 * (downloaded models), so it is parsed by jansson and then held to exactly this
 * schema, and every offset is checked against the file before any data is
 * touched: the tensors must tile the data section. Used by `zt-ckpt export` /
 * `zt-ckpt import` and by zt_hf.h (Hugging Face model directories). */
#ifndef ZT_SAFETENSORS_H
#define ZT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ZT_ST_MAX_DIMS 8
#define ZT_ST_MAX_HEADER (100u << 20)   /* the reference implementation's limit */

/* The dtypes ztrain reads; the others the format defines (F64, I64, F8_E4M3, ...)
 * are recognized by name and refused: "unsupported dtype F64 of tensor NAME in FILE".
 * U8 holds bytes, not values (bitsandbytes' packed 4-bit weights and its quant_state JSON):
 * it is read as bytes (zt_hf_read_bytes), never converted to floats. */
typedef enum { ZT_ST_F32 = 0, ZT_ST_F16 = 1, ZT_ST_BF16 = 2, ZT_ST_U8 = 3 } zt_st_dtype_t;

int zt_st_dtype_size(zt_st_dtype_t d);          /* bytes per element */
const char *zt_st_dtype_name(zt_st_dtype_t d);  /* "F32", "F16", "BF16", "U8" */

typedef struct zt_st_tensor {
    char name[256];
    zt_st_dtype_t dtype;
    int ndim;
    int64_t shape[ZT_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;        /* byte offsets relative to the data section */
} zt_st_tensor_t;

typedef struct zt_st_file {
    char path[1024];
    int ntensors;
    zt_st_tensor_t *tensors;
    uint64_t data_start;        /* absolute file offset of the data section (8 + N) */
    uint64_t data_len;
    FILE *fp;                   /* open for reading after zt_st_open */
} zt_st_file_t;

/* Parses and validates a header. `hdr` holds the N JSON bytes, `data_len` the
 * number of bytes after the header. `name` is used in messages. On success
 * fills out->tensors/ntensors (caller frees with zt_st_close). */
int zt_st_parse_header(const char *name, const char *hdr, size_t n, uint64_t data_len,
                       zt_st_file_t *out, char *err, size_t errlen);

/* Parses a whole in-memory file (length prefix + header + data); used by the fuzzer. */
int zt_st_parse_buffer(const char *name, const uint8_t *buf, size_t size, zt_st_file_t *out,
                       char *err, size_t errlen);

int zt_st_open(const char *path, zt_st_file_t *f, char *err, size_t errlen);
void zt_st_close(zt_st_file_t *f);
int zt_st_find(const zt_st_file_t *f, const char *name);   /* -1 if absent */
/* Reads tensor i converted to fp32 into out (numel floats); a U8 tensor is refused. */
int zt_st_read_f32(zt_st_file_t *f, int i, float *out, char *err, size_t errlen);

/* Streaming writer: declare every tensor (fp32) first, then write the data in
 * declaration order. */
typedef struct zt_st_writer {
    FILE *fp;
    char path[1024];
    int n, cap, next;
    zt_st_tensor_t *tensors;
    uint64_t written;           /* bytes of the current tensor written so far */
} zt_st_writer_t;

/* The JSON header for tensors t[0..n) (their dtype, shape, begin/end), with
 * {"__metadata__": {"format": "pt"}} first and padded with spaces to a multiple
 * of 8 bytes; *len is its length. NULL (message in err) for a name that is not
 * UTF-8. Shared with zt_hf's sharded writer. */
char *zt_st_header_json(const zt_st_tensor_t *t, int n, size_t *len, char *err, size_t errlen);

int zt_st_writer_open(zt_st_writer_t *w, const char *path, char *err, size_t errlen);
void zt_st_writer_add(zt_st_writer_t *w, const char *name, int ndim, const int64_t *shape);
/* Writes the header (after all adds). */
int zt_st_writer_begin(zt_st_writer_t *w, char *err, size_t errlen);
/* Appends n floats to the current tensor (may be called repeatedly per tensor). */
int zt_st_writer_data(zt_st_writer_t *w, const float *x, size_t n, char *err, size_t errlen);
int zt_st_writer_close(zt_st_writer_t *w, char *err, size_t errlen);

#endif
