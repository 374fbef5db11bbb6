/* zt_ckpt.h — parallel HDF5 checkpoints.
 *
 * Consolidated format (default): one HDF5 file, world-size independent, written
 * collectively through MPI-IO; every rank writes only the element ranges it owns
 * (zt_shard_io_segments), so no rank ever gathers the model. Layout:
 *   /  attrs: format="ztrain-checkpoint", format_version, step, tokens_seen,
 *             samples_seen, world_size, strategy, ztrain_version, config
 *   /model/<HF name>                    fp32, full HF shape
 *   /optimizer/exp_avg/<HF name>, /optimizer/exp_avg_sq/<HF name>
 *   /optimizer attrs: step (Adam t), lr, beta1, beta2, eps, weight_decay, and for
 *                     fp16 runs loss_scale, loss_scale_good_steps
 *   /data attrs: samples_seen, epoch, seed, shuffle
 * Files are written to "<dir>/ckpt-<step>.h5.tmp", synced, renamed to
 * "<dir>/ckpt-<step>.h5"; then "<dir>/latest" (a text file naming it) is
 * replaced atomically. Sharded format: "<dir>/ckpt-<step>.shards/rank-<r>.h5"
 * plus an index; `zt-ckpt consolidate` turns it into the consolidated form.
 * See doc/checkpoint-format.md. */
#ifndef ZT_CKPT_H
#define ZT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "zt_comm.h"
#include "zt_params.h"
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
    double loss_scale;      /* fp16 loss scale; 0 = none stored */
    long loss_scale_good_steps; /* steps since the last overflow or doubling */
    double save_seconds, load_seconds, bytes;   /* filled by save/load for reporting */
} zt_ckpt_meta_t;

/* Collective over comm->world. sharded: 0 = the consolidated format, 1 = sharded.
 * keep_last > 0 removes older checkpoints after the new one is complete.
 * Returns 0, or -1 with err on every rank (nothing replaced on failure). */
int zt_ckpt_save(const char *dir, zt_ckpt_meta_t *meta, const char *config_text, int sharded,
                 int keep_last, zt_shard_t *s, const zt_param_table_t *t, zt_comm_t *comm,
                 char *err, size_t errlen);

/* Collective. Reads the segments this rank needs from a consolidated checkpoint
 * (or a sharded one saved at the same world size and strategy). weights_only
 * skips optimizer state and data position (model.init_from).
 * Validates format, version, presence and shapes of every tensor, and finiteness.
 * Returns 0, or -1 with err (same on every rank). */
int zt_ckpt_load(const char *path, zt_ckpt_meta_t *meta, int weights_only, zt_shard_t *s,
                 const zt_param_table_t *t, zt_comm_t *comm, char *err, size_t errlen);

/* Fault injection (fault.kind = save_kill, tests only): the save of the checkpoint of
 * step `step` kills rank `rank` with SIGKILL from inside the save, after the first
 * tensor of the temporary file (consolidated) or the rank's shard file was written.
 * rank < 0: off. */
void zt_ckpt_fault_save_kill(int rank, long step);

/* Newest complete checkpoint in dir (via "latest", falling back to a scan);
 * 0 and path filled, or -1 if none. Not collective. */
int zt_ckpt_find_latest(const char *dir, char *path, size_t len);

/* ---- the core, usable without a shard engine (tests, tools) -------------- */

/* Collective over comm. Writes the element ranges in segs (disjoint across
 * ranks, covering every parameter of t) as checkpoint "<dir>/ckpt-<step>.h5"
 * (consolidated, sharded 0) or "<dir>/ckpt-<step>.shards" (sharded 1), moves
 * "latest", applies keep_last. Optimizer groups are written when every segment
 * has exp_avg/exp_avg_sq (else a weights-only checkpoint). meta is taken from
 * rank 0; meta->bytes and meta->save_seconds are filled on every rank. */
int zt_ckpt_write_segments(const char *dir, zt_ckpt_meta_t *meta, const char *config_text,
                           int sharded, int keep_last, const zt_io_seg_t *segs, int nsegs,
                           const zt_param_table_t *t, MPI_Comm comm, char *err, size_t errlen);
/* Collective over comm. Fills segs (which may overlap across ranks) from the
 * checkpoint at path (a .h5 file, a .shards directory, or a directory with
 * "latest"), with the validation described for zt_ckpt_load. */
int zt_ckpt_read_segments(const char *path, zt_ckpt_meta_t *meta, int weights_only,
                          const zt_io_seg_t *segs, int nsegs, const zt_param_table_t *t,
                          MPI_Comm comm, char *err, size_t errlen);

/* World-size independent tensor checksum: the sum mod 2^64 of a hash of
 * (element index, fp32 bits); partial sums over element ranges add up. */
uint64_t zt_ckpt_checksum(size_t start, const float *x, size_t n);

/* Serial (non-collective) reader of either format, for tools. */
enum { ZT_CKPT_MODEL = 0, ZT_CKPT_EXP_AVG = 1, ZT_CKPT_EXP_AVG_SQ = 2 };
typedef struct zt_ckpt_reader zt_ckpt_reader_t;
zt_ckpt_reader_t *zt_ckpt_reader_open(const char *path, char *err, size_t errlen);
void zt_ckpt_reader_close(zt_ckpt_reader_t *r);
const zt_ckpt_meta_t *zt_ckpt_reader_meta(const zt_ckpt_reader_t *r);
const char *zt_ckpt_reader_config(const zt_ckpt_reader_t *r);
/* The tensors stored (names, ndim, shape, numel filled; in stored order). */
const zt_param_table_t *zt_ckpt_reader_tensors(const zt_ckpt_reader_t *r);
int zt_ckpt_reader_has_optimizer(const zt_ckpt_reader_t *r);
int zt_ckpt_reader_is_sharded(const zt_ckpt_reader_t *r);
/* Elements [start, start+n) of tensor p of a group (ZT_CKPT_MODEL, ...). */
int zt_ckpt_reader_read(zt_ckpt_reader_t *r, int group, int p, size_t start, size_t n, float *out,
                        char *err, size_t errlen);
/* Checksum stored at save time; 0 and *sum filled, or -1 if none stored. */
int zt_ckpt_reader_checksum(zt_ckpt_reader_t *r, int group, int p, uint64_t *sum);

/* Sharded -> consolidated, streaming through a buffer of buf_elems floats;
 * checks every tensor's checksum against the index. Not collective. */
int zt_ckpt_consolidate(const char *shards_dir, const char *out_path, size_t buf_elems, char *err,
                        size_t errlen);

/* Opens an in-memory HDF5 image and runs the metadata and tensor-table checks of
 * the reader on it (the fuzzing entry point for untrusted checkpoint files). */
int zt_ckpt_check_image(const void *buf, size_t len, char *err, size_t errlen);

#endif
