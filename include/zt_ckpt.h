/* zt_ckpt.h — parallel HDF5 checkpoints.
 *
 * Consolidated format (default): one HDF5 file, world-size independent, written
 * collectively through MPI-IO; every rank writes only the element ranges it owns
 * (zt_shard_io_segments), so no rank ever gathers the model. Layout:
 *   /  attrs: format="ztrain-checkpoint", format_version, step, tokens_seen,
 *             samples_seen, world_size, strategy, ztrain_version, config
 *   /model/<HF name>                    fp32, full HF shape
 *   /optimizer/exp_avg/<HF name>, /optimizer/exp_avg_sq/<HF name>
 *   /optimizer attrs: step (Adam t), lr, beta1, beta2, eps, weight_decay
 *   /data attrs: samples_seen, epoch, seed, shuffle
 * Files are written to "<dir>/ckpt-<step>.h5.tmp", synced, renamed to
 * "<dir>/ckpt-<step>.h5"; then "<dir>/latest" (a text file naming it) is
 * replaced atomically. Sharded format: "<dir>/ckpt-<step>.shards/rank-<r>.h5"
 * plus an index; `zt-ckpt consolidate` turns it into the consolidated form.
 * See doc/checkpoint-format.md. */
#ifndef ZT_CKPT_H
#define ZT_CKPT_H

#include <stddef.h>

#include "zt_comm.h"
#include "zt_model.h"
#include "zt_shard.h"

#define ZT_CKPT_FORMAT "ztrain-checkpoint"
#define ZT_CKPT_VERSION 1

typedef struct zt_ckpt_meta {
    long step;              /* optimizer steps completed */
    double tokens_seen;
    long samples_seen;      /* global samples consumed (the sampler position) */
    long adam_step;
    int world_size;
    char strategy[32];
    long data_seed;
    int shuffle;
    float lr, beta1, beta2, eps, weight_decay;
    double save_seconds, load_seconds, bytes;   /* filled by save/load for reporting */
} zt_ckpt_meta_t;

/* Collective over comm->world. format: "consolidated" or "sharded".
 * keep_last > 0 removes older checkpoints after the new one is complete.
 * Returns 0, or -1 with err on every rank (nothing replaced on failure). */
int zt_ckpt_save(const char *dir, zt_ckpt_meta_t *meta, const char *config_text, const char *format,
                 int keep_last, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm,
                 char *err, size_t errlen);

/* Collective. Reads the segments this rank needs from a consolidated checkpoint
 * (or a sharded one saved at the same world size and strategy). weights_only
 * skips optimizer state and data position (model.init_from).
 * Validates format, version, presence and shapes of every tensor, and finiteness.
 * Returns 0, or -1 with err (same on every rank). */
int zt_ckpt_load(const char *path, zt_ckpt_meta_t *meta, int weights_only, zt_shard_t *s,
                 const zt_param_table_t *t, zt_comm_t *comm, char *err, size_t errlen);

/* Newest complete checkpoint in dir (via "latest", falling back to a scan);
 * 0 and path filled, or -1 if none. Not collective. */
int zt_ckpt_find_latest(const char *dir, char *path, size_t len);

#endif
