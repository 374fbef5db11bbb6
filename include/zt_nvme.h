/* zt_nvme.h — scratch files for offloaded state: ZeRO-Infinity's NVMe tier.
 *
 * A rank's offloaded state is a list of records (the shard engine's: one per unit for
 * the optimizer state, one per unit for the parameter shard), each a few fields (fp32
 * master, exp_avg, exp_avg_sq; a 16-bit working shard). They live in one file per rank,
 * in the rank's own directory under parallel.offload_nvme_path, every field at a 4 KiB
 * aligned offset, the whole file allocated at open (so a full disk is met at start,
 * where every rank can agree on it, never in the middle of a step).
 *
 * A record is used through a few host buffers as large as the largest record (sized
 * here from the records: nothing for a user to get wrong): zt_nvme_get hands out a
 * record's fields in a buffer (reading the file unless the caller will overwrite them),
 * zt_nvme_put hands it back (written back asynchronously when dirty). zt_nvme_prefetch
 * starts a read ahead, so that while one record is updated the next is read and the
 * previous written. A record stays cached in its buffer until the buffer is needed.
 *
 * I/O: io_uring (liburing) with O_DIRECT, requests of block_size bytes, queue_depth of
 * them in flight; or, where io_uring cannot be set up (or ZT_NVME_IO=threads),
 * pread/pwrite on queue_depth threads (at most 8). A file system without O_DIRECT
 * (tmpfs before Linux 6.6) is read and written through the page cache.
 *
 * The files are scratch: zt_nvme_close removes them, and so do the abort paths
 * (zt_fatal, a second stop signal, the watchdog: zt_at_abort) and exit(). A directory
 * left by a process of this host that no longer runs (kill -9) is removed by the next
 * zt_nvme_open under the same path. */
#ifndef ZT_NVME_H
#define ZT_NVME_H

#include <stddef.h>

#define ZT_NVME_MAX_FIELDS 4

typedef struct zt_nvme_rec {
    int nfield;
    size_t bytes[ZT_NVME_MAX_FIELDS]; /* each field's size (0-field records hold nothing) */
} zt_nvme_rec_t;

typedef struct zt_nvme_opts {
    const char *path;       /* parallel.offload_nvme_path: an existing writable directory */
    int rank;               /* names the rank's subdirectory */
    int buffer_count;       /* host buffers, at least 3 */
    size_t block_size;      /* bytes per request, a multiple of 4096 */
    int queue_depth;        /* requests in flight */
} zt_nvme_opts_t;

typedef struct zt_nvme zt_nvme_t;

/* Host buffer bytes (each) and file bytes for these records: what zt_nvme_open
 * allocates, for the memory estimate. */
size_t zt_nvme_buffer_bytes(const zt_nvme_rec_t *recs, int nrec);
size_t zt_nvme_file_bytes(const zt_nvme_rec_t *recs, int nrec);

/* Creates the rank's directory and file (every byte allocated) and the buffers. NULL
 * with one line in err (a missing or read-only path, no space) and nothing left behind. */
zt_nvme_t *zt_nvme_open(const zt_nvme_opts_t *o, const zt_nvme_rec_t *recs, int nrec, char *err, size_t errlen);
/* Waits for outstanding I/O, removes the files, frees the buffers. */
void zt_nvme_close(zt_nvme_t *nv);

/* Record rec's fields in a buffer, valid until zt_nvme_put; read = 0: the caller
 * writes every byte it will put back, nothing is read. */
void **zt_nvme_get(zt_nvme_t *nv, int rec, int read);
/* Hands a record back: dirty = 1 writes it to the file (asynchronously). */
void zt_nvme_put(zt_nvme_t *nv, int rec, int dirty);
/* Starts reading rec into a buffer if one is free (or frees after a write); no-op when
 * it is resident already or every buffer is taken. */
void zt_nvme_prefetch(zt_nvme_t *nv, int rec);
/* Every write has landed in the file. */
void zt_nvme_drain(zt_nvme_t *nv);

typedef struct zt_nvme_stats {
    double bytes_read, bytes_written; /* file traffic */
    double io_wait_s;       /* time a get or a buffer hand-over waited for I/O */
    size_t buffer_bytes, file_bytes;
    int buffers;
    const char *engine;     /* "io_uring" | "threads" (+ " (page cache)" without O_DIRECT) */
    const char *dir;        /* the rank's directory */
} zt_nvme_stats_t;
void zt_nvme_stats(const zt_nvme_t *nv, zt_nvme_stats_t *st);

#endif
