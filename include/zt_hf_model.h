/* zt_hf_model.h — a model and Hugging Face model directories: shape in, weights in and out.
 *
 * model.name_or_path = DIR makes DIR/config.json the source of the family and of every
 * dimension (zt_hf_model_resolve, before anything is built), and DIR's safetensors the
 * source of the initial weights (zt_hf_model_load: each rank reads the element ranges
 * it owns, straight from the files). An export writes DIR/config.json,
 * generation_config.json, the safetensors shards and their index, each rank its own
 * byte ranges, under a temporary name renamed at the end (zt_hf_model_save). */
#ifndef ZT_HF_MODEL_H
#define ZT_HF_MODEL_H

#include <stddef.h>

#include "zt_comm.h"
#include "zt_config.h"
#include "zt_hf.h"
#include "zt_params.h"
#include "zt_shard.h"

/* Fills cfg's model.arch and model.* dimensions from config.json (its text, read by
 * the caller; `file` names it in messages). A key the input also gave with another
 * value is an error naming both values. Checks data.seq_len against the positions. */
int zt_hf_model_resolve(zt_config_t *cfg, const char *config_text, const char *file, char *err, size_t errlen);

/* Collective over comm->world: every rank reads the element ranges it owns of each
 * parameter from DIR's safetensors (weights only: the optimizer starts fresh). Every
 * tensor of the table must be there with its shape; a tensor the table lacks is an
 * error, except those transformers itself ignores (lm_head.weight of a tied model,
 * rotary_emb.inv_freq buffers). Returns 0, or -1 with the same err on every rank. */
int zt_hf_model_load(const char *dir, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm, double *bytes,
                     char *err, size_t errlen);

/* 4-bit parameter p of t (zt_qlora.h) whole into w (zt_qlora_values(p) floats): on return its
 * first numel floats are what the unit stores. A directory that holds the weight 4-bit
 * (bitsandbytes' serialisation, zt_hf_bnb.h) gives its bytes as they are; a full-precision one
 * is read and quantized as bitsandbytes would. -1 with err naming the file and the tensor. */
int zt_hf_model_read_4bit(zt_hf_dir_t *d, const zt_param_table_t *t, int p, float *w, char *err, size_t errlen);
/* An export in progress (zt-ckpt export drives it serially, a run collectively). */
typedef struct zt_hf_export zt_hf_export_t;
/* Starts the export of table t's weights (adapter = 0: the model's, its adapters left
 * out; 1: a PEFT adapter directory of the adapters alone, adapter_config.json +
 * adapter_model.safetensors under PEFT's key names) to OUTDIR (written as OUTDIR.tmp, renamed by
 * zt_hf_export_finish): plans the shards, and on the writing process (rank 0 of comm,
 * or the only one with comm NULL) creates the directory, the shard files with their
 * headers, the index, config.json, generation_config.json and copies the tokenizer
 * files of source_dir ("" = none). dtype "bf16" or "fp32"; max_shard_bytes as
 * transformers' max_shard_size; eos_token_id < 0: none known. Collective with comm. */
zt_hf_export_t *zt_hf_export_begin(const char *outdir, const zt_param_table_t *t, int adapter, const char *dtype,
                                   int64_t max_shard_bytes, const char *source_dir, int eos_token_id,
                                   zt_comm_t *comm, char *err, size_t errlen);
/* Elements [start, start+n) of parameter p (ignored when p is not exported). Any
 * process, any order. */
int zt_hf_export_write(zt_hf_export_t *x, int p, size_t start, size_t n, const float *v, char *err, size_t errlen);
/* Syncs, then (collectively) renames OUTDIR.tmp to OUTDIR, replacing an older OUTDIR
 * only once the new one is complete; frees x. ok = 0 abandons the export (the
 * temporary directory is removed). Returns 0, or -1 with err (the same on every rank). */
int zt_hf_export_finish(zt_hf_export_t *x, int ok, char *err, size_t errlen);

/* A run's export: each rank writes what it owns (zt_shard_io_segments), nobody gathers
 * the model. adapter = 1: the PEFT adapter directory; 0: the model, which for a LoRA run
 * is the merged W + scale B A (the small adapters are summed onto every rank for it). */
int zt_hf_model_save(const char *outdir, const zt_config_t *cfg, zt_shard_t *s, const zt_param_table_t *t,
                     int adapter, int eos_token_id, zt_comm_t *comm, double *seconds, char *err, size_t errlen);

/* A LoRA merge: v[k] (elements [start, start + n) of base weight p) += scale (B A) as
 * PEFT's merge_and_unload (the transpose for Conv1D bases); adapters holds every adapter
 * tensor of t whole, adapter parameter i at adapters + offs[i]. A no-op for a weight
 * without adapters. */
void zt_hf_lora_merge(const zt_param_table_t *t, int p, const float *adapters, const size_t *offs, size_t start,
                      size_t n, float *v);

/* lora.adapter_name_or_path: the adapters from a PEFT directory (its r and alpha must
 * be lora.*'s, its tensors exactly the adapters of lora.target). Collective. */
int zt_hf_model_load_adapter(const char *dir, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm,
                             char *err, size_t errlen);

#endif
