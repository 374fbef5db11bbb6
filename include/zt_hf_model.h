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

#include "zt_config.h"

/* Fills cfg's model.arch and model.* dimensions from config.json (its text, read by
 * the caller; `file` names it in messages). A key the input also gave with another
 * value is an error naming both values. Checks data.seq_len against the positions. */
int zt_hf_model_resolve(zt_config_t *cfg, const char *config_text, const char *file, char *err, size_t errlen);

#endif
