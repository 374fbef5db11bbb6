/* zt_import.h — users' own training files as ztrain input.
 *
 * A LLaMA-Factory training YAML (what `llamafactory-cli train X.yaml` reads), with the
 * DeepSpeed JSON its `deepspeed:` key names, becomes the libconfig text of the ztrain keys
 * it means. Every key of the YAML takes one of three paths: it maps to a ztrain key (with
 * LLaMA-Factory's meaning: a YAML without disable_gradient_checkpointing trains with
 * recomputation, as LLaMA-Factory does), it is accepted with a printed line where it
 * cannot change the result (dataloader_num_workers, trust_remote_code, ...), or it is
 * refused in one line naming the file, the line and why. An accelerate config file
 * (`--accelerate-config`, as `accelerate launch --config_file`) gives the engine the same way. DeepSpeed's "auto" values
 * resolve as transformers' integration resolves them; a stated value that disagrees with
 * the YAML is refused, as DeepSpeed refuses it. The table of both lives in zt_import.c
 * and `ztrain --import-markdown` prints it (doc/migrating.md).
 *
 * Rank 0 imports and broadcasts the text, as it does an input.cfg: every rank parses the
 * same text, so `section.key=value` overrides apply on top and `--print-config X.yaml`
 * prints the resolved input to keep as a .cfg. */
#ifndef ZT_IMPORT_H
#define ZT_IMPORT_H

#include <stddef.h>
#include <stdio.h>

/* 1 when `path` names a YAML file (.yaml, .yml) */
int zt_import_is_yaml(const char *path);

/* The libconfig text (malloc'd) of the LLaMA-Factory YAML `text`, read from `path`, with
 * the accelerate config `accel_text` of `accel_path` (NULL: none) on top; `world` ranks on
 * `nodes` nodes check DeepSpeed's train_batch_size and accelerate's num_processes and
 * num_machines. Lines for the keys accepted without effect go to `notes` (NULL: none).
 * NULL with a one-line error in err. */
char *zt_import_yaml(const char *text, const char *path, const char *accel_text, const char *accel_path, int world,
                     int nodes, FILE *notes, char *err, size_t errlen);

/* The import table as Markdown (doc/migrating.md is generated from it). */
void zt_import_markdown(FILE *out);

#endif
