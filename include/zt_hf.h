/* zt_hf.h — Hugging Face model directories: config.json plus safetensors
 * weights, in one file (model.safetensors) or sharded (model.safetensors.index.json
 * naming model-0000K-of-0000N.safetensors), as transformers' save_pretrained
 * writes them and from_pretrained reads them.
 *
 * Model-agnostic: this layer knows tensor names, shapes and dtypes, not what a
 * model does with them; the caller maps names onto its parameters and reads its
 * own element ranges. No MPI here: the writer's plan is pure arithmetic so that
 * every rank computes the same one, one process creates the files, and each
 * rank then pwrites its own ranges (the caller synchronizes in between).
 *
 * Errors are returned as one line naming the file (and the tensor), since a bad
 * download is bad input, not a bug. A zt_hf_dir_t / zt_hf_writer_t is not
 * thread-safe (each has one staging buffer). */
#ifndef ZT_HF_H
#define ZT_HF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "zt_safetensors.h"

typedef struct zt_hf_dir zt_hf_dir_t;

/* Opens DIR: parses DIR/config.json (kept), then DIR/model.safetensors, or
 * DIR/model.safetensors.index.json ("weight_map": name -> shard file) and every
 * shard it names (headers only, files kept open for pread). model.safetensors
 * wins when both exist, as in transformers. Refused, with a message naming the
 * file (and tensor): a missing config.json, bad JSON (line:column from jansson),
 * no weights file, a corrupt safetensors header, an index naming a missing
 * shard, a tensor the index maps to a shard that does not hold it (or a shard
 * tensor the index does not list), a tensor in two shards, a truncated shard
 * (data beyond the file's end), an unsupported dtype (F64, I64, ...). */
zt_hf_dir_t *zt_hf_open(const char *dir, char *err, size_t errlen);
void zt_hf_close(zt_hf_dir_t *d);
const json_t *zt_hf_config(const zt_hf_dir_t *d);      /* borrowed */
const char *zt_hf_config_path(const zt_hf_dir_t *d);   /* "DIR/config.json" for messages */
const char *zt_hf_path(const zt_hf_dir_t *d);          /* DIR */
/* Tensors: shards in file-name order, each in its header's order. */
int zt_hf_ntensors(const zt_hf_dir_t *d);
const char *zt_hf_tensor_name(const zt_hf_dir_t *d, int i);
/* Index of tensor `name` or -1; fills ndim, shape (up to ZT_ST_MAX_DIMS), dtype
 * and the file it is in (any output pointer may be NULL). */
int zt_hf_find(const zt_hf_dir_t *d, const char *name, int *ndim, int64_t *shape, zt_st_dtype_t *dtype,
               const char **file);
/* Elements [start, start+n) of tensor i (row-major flat index) as fp32: pread of
 * just those bytes in large pieces (F32 straight into out, BF16/F16 through an
 * 8 MiB staging buffer), converted exactly; a U8 tensor is refused. Error names file and tensor. */
int zt_hf_read(zt_hf_dir_t *d, int i, size_t start, size_t n, float *out, char *err, size_t errlen);
/* Tensor i's bytes as stored (any dtype), all `bytes` of them: bitsandbytes' packed 4-bit
 * weights and quant_state JSON (U8). Refused unless the tensor holds exactly `bytes`. */
int zt_hf_read_bytes(zt_hf_dir_t *d, int i, void *out, size_t bytes, char *err, size_t errlen);
/* "5GB" -> 5e9, "500MB", "10KB", "2GiB" (2^30), "5Gb" (bits: /8), a plain
 * integer = bytes: transformers' convert_file_size_to_int. -1 if malformed. */
int64_t zt_hf_parse_size(const char *s);

/* ---- writer ---------------------------------------------------------------------- */

typedef struct zt_hf_out_tensor { char name[256]; int ndim; int64_t shape[2]; } zt_hf_out_tensor_t;
typedef struct zt_hf_writer zt_hf_writer_t;
/* Tensors in the given order; a new shard starts when adding the next tensor
 * would pass max_shard_bytes (transformers' rule; a tensor larger than the limit
 * gets a shard of its own); everything in one shard -> "model.safetensors", else
 * "model-00001-of-0000N.safetensors" ... plus "model.safetensors.index.json"
 * ({"metadata": {"total_size": bytes}, "weight_map": {...}}). dtype ZT_ST_F32 or
 * ZT_ST_BF16; ndim 0 (a scalar), 1 or 2. Headers carry {"__metadata__":
 * {"format": "pt"}} as transformers writes. Pure arithmetic: no file touched. */
zt_hf_writer_t *zt_hf_writer_plan(const char *dir, const zt_hf_out_tensor_t *t, int n, zt_st_dtype_t dtype,
                                  uint64_t max_shard_bytes, char *err, size_t errlen);
int zt_hf_writer_nshards(const zt_hf_writer_t *w);
/* The file tensor i goes to (a name inside dir). */
const char *zt_hf_writer_file(const zt_hf_writer_t *w, int i);
/* Called by ONE process: creates every shard file at its full size (header
 * written, data region sized with ftruncate) and the index; dir must exist.
 * Weight files of an earlier save in dir that this plan does not produce
 * (model.safetensors, model-*-of-*.safetensors, the index) are removed first, as
 * save_pretrained does, so that a stale file cannot shadow the new ones. */
int zt_hf_writer_create_files(zt_hf_writer_t *w, char *err, size_t errlen);
/* Any process, after create_files completed somewhere (the caller
 * synchronizes): converts x[0..n) to the dtype (bf16 round-to-nearest-even,
 * zt_bf16.h) and pwrites elements [start, start+n) of tensor i. */
int zt_hf_writer_write(zt_hf_writer_t *w, int i, size_t start, size_t n, const float *x, char *err, size_t errlen);
/* fsync and close what this process opened; frees w (also on error). */
int zt_hf_writer_close(zt_hf_writer_t *w, char *err, size_t errlen);

#endif
