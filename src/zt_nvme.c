/* zt_nvme.c — scratch files for offloaded state, streamed through a few host buffers
 * (see zt_nvme.h).
 *
 * Every transfer is a whole record: one contiguous range of the file into one buffer,
 * cut into block_size requests. Requests wait in one FIFO; the io_uring engine submits
 * from it while fewer than queue_depth are in flight and reaps completions when a
 * caller waits; the thread engine's workers take them one by one. A buffer counts its
 * requests not yet completed, and a caller waits for exactly the buffer it needs.
 *
 * Buffer states: free; reading (a prefetch or a get in flight); held (between get and
 * put); writing (a dirty put in flight); clean (the record cached, nobody holding it).
 * A buffer for a new record is, in this order, a free one, the least recently used clean
 * one, the oldest writing one once its write has landed, or an unclaimed prefetch. */
#define _GNU_SOURCE /* O_DIRECT */
#include "zt_nvme.h"

#include "zt_common.h"
#include "zt_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define ALIGN ((size_t)4096)
#define MAX_THREADS 8

enum { B_FREE = 0, B_READING, B_HELD, B_WRITING, B_CLEAN };

typedef struct chunk {
    int buf, write;
    size_t off, len;        /* file offset; the buffer offset is off - rec_off[rec] */
    char *mem;
} chunk_t;

typedef struct buffer {
    char *mem;
    int state, rec;
    int pending;            /* requests not yet completed */
    long stamp;             /* last use (clean: LRU) or write start (writing: oldest first) */
    void *field[ZT_NVME_MAX_FIELDS];
} buffer_t;

struct zt_nvme {
    int fd, direct, uring, slot;
    char dir[PATH_MAX], file[PATH_MAX + 16];
    int nrec;
    zt_nvme_rec_t *recs;
    size_t *rec_off, *rec_len;  /* file offset and (aligned) length of each record */
    int *rec_buf;           /* buffer holding the record, or -1 */
    int nbuf;
    buffer_t *buf;
    size_t buf_bytes, file_bytes, block;
    int qd;
    long clock;
    /* requests not yet submitted (FIFO) */
    chunk_t *q;
    size_t qhead, qtail, qcap;
    /* io_uring */
    struct io_uring ring;
    int inflight;
    /* threads */
    pthread_t th[MAX_THREADS];
    int nth, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the first I/O error: reported by the waiter */
    int err_no, err_write;
    size_t err_off;
    double rd, wr, wait_s;
};

/* ---- removal at exit and abort (async-signal-safe) ------------------------------ */

#define MAX_OPEN 8
static char reg_file[MAX_OPEN][PATH_MAX + 16], reg_dir[PATH_MAX];
static volatile sig_atomic_t reg_used[MAX_OPEN];
static int hooks_installed;

static void remove_scratch(void)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (reg_used[i]) {
            unlink(reg_file[i]);
            reg_used[i] = 0;
        }
    if (reg_dir[0]) rmdir(reg_dir); /* fails while another engine's file is there: fine */
}

static int register_file(const char *dir, const char *file)
{
    if (!hooks_installed) {
        zt_at_abort(remove_scratch);
        atexit(remove_scratch);
        hooks_installed = 1;
    }
    snprintf(reg_dir, sizeof reg_dir, "%s", dir);
    for (int i = 0; i < MAX_OPEN; i++)
        if (!reg_used[i]) {
            snprintf(reg_file[i], sizeof reg_file[i], "%s", file);
            reg_used[i] = 1;
            return i;
        }
    return -1;
}

static void unregister_file(int slot)
{
    if (slot < 0) return;
    unlink(reg_file[slot]);
    reg_used[slot] = 0;
    rmdir(reg_dir);
}

/* ---- sizes ------------------------------------------------------------------------ */

static size_t round_up(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static size_t rec_bytes(const zt_nvme_rec_t *r)
{
    size_t b = 0;
    for (int j = 0; j < r->nfield; j++) b += round_up(r->bytes[j]);
    return b;
}

size_t zt_nvme_buffer_bytes(const zt_nvme_rec_t *recs, int nrec)
{
    size_t m = 0;
    for (int i = 0; i < nrec; i++) m = ZT_MAX(m, rec_bytes(&recs[i]));
    return m;
}

size_t zt_nvme_file_bytes(const zt_nvme_rec_t *recs, int nrec)
{
    size_t t = 0;
    for (int i = 0; i < nrec; i++) t += rec_bytes(&recs[i]);
    return t;
}

/* ---- the request FIFO -------------------------------------------------------------- */

static void q_push(zt_nvme_t *nv, chunk_t c)
{
    if (nv->qtail - nv->qhead == nv->qcap) {
        const size_t cap = nv->qcap ? 2 * nv->qcap : 64;
        chunk_t *q = zt_malloc(cap * sizeof *q);
        for (size_t i = 0; i < nv->qtail - nv->qhead; i++) q[i] = nv->q[(nv->qhead + i) % nv->qcap];
        nv->qtail -= nv->qhead;
        nv->qhead = 0;
        free(nv->q);
        nv->q = q;
        nv->qcap = cap;
    }
    nv->q[nv->qtail++ % nv->qcap] = c;
}

static int q_pop(zt_nvme_t *nv, chunk_t *c)
{
    if (nv->qhead == nv->qtail) return 0;
    *c = nv->q[nv->qhead++ % nv->qcap];
    return 1;
}

static void io_failed(zt_nvme_t *nv, const chunk_t *c, int e)
{
    if (nv->err_no) return;
    nv->err_no = e;
    nv->err_write = c->write;
    nv->err_off = c->off;
}

/* ---- io_uring engine --------------------------------------------------------------
 * The caller's thread submits; one completion thread reaps, submits what the queue
 * still holds (so a transfer longer than queue_depth requests goes on while the
 * caller computes) and wakes the waiters. liburing allows one submitter and one
 * reaper at a time; submission is under the mutex, which both threads take. */

static void uring_submit_locked(zt_nvme_t *nv)
{
    int added = 0;
    chunk_t c;
    while (nv->inflight < nv->qd && q_pop(nv, &c)) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&nv->ring);
        if (!sqe) { /* the ring is full until submitted: take it up again then */
            nv->qhead--;
            break;
        }
        chunk_t *h = zt_malloc(sizeof *h);
        *h = c;
        if (c.write) io_uring_prep_write(sqe, nv->fd, c.mem, (unsigned)c.len, (off_t)c.off);
        else io_uring_prep_read(sqe, nv->fd, c.mem, (unsigned)c.len, (off_t)c.off);
        io_uring_sqe_set_data(sqe, h);
        nv->inflight++;
        added = 1;
    }
    if (added) {
        const int rc = io_uring_submit(&nv->ring);
        if (rc < 0) zt_fatal("io_uring_submit on %s: %s", nv->file, strerror(-rc));
    }
}

static void *uring_reaper(void *arg)
{
    zt_nvme_t *nv = arg;
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc;
        do rc = io_uring_wait_cqe(&nv->ring, &cqe);
        while (rc == -EINTR);
        if (rc < 0) zt_fatal("io_uring_wait_cqe on %s: %s", nv->file, strerror(-rc));
        chunk_t *c = io_uring_cqe_get_data(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&nv->ring, cqe);
        if (!c) return NULL; /* close's no-op: every request before it has completed */
        pthread_mutex_lock(&nv->mu);
        nv->inflight--;
        if (res <= 0) {
            io_failed(nv, c, res < 0 ? -res : EIO);
            nv->buf[c->buf].pending--;
        } else if ((size_t)res < c->len) { /* short: the rest is one more request */
            q_push(nv, (chunk_t){c->buf, c->write, c->off + (size_t)res, c->len - (size_t)res, c->mem + res});
        } else {
            nv->buf[c->buf].pending--;
        }
        free(c);
        uring_submit_locked(nv);
        pthread_cond_broadcast(&nv->cv);
        pthread_mutex_unlock(&nv->mu);
    }
}

/* ---- thread engine: pread/pwrite, one request per worker at a time ------------------ */

static void *worker(void *arg)
{
    zt_nvme_t *nv = arg;
    pthread_mutex_lock(&nv->mu);
    for (;;) {
        chunk_t c;
        while (!nv->stop && !q_pop(nv, &c)) pthread_cond_wait(&nv->cv, &nv->mu);
        if (nv->stop) break;
        pthread_mutex_unlock(&nv->mu);
        size_t done = 0;
        int e = 0;
        while (done < c.len) {
            const ssize_t n = c.write ? pwrite(nv->fd, c.mem + done, c.len - done, (off_t)(c.off + done))
                                      : pread(nv->fd, c.mem + done, c.len - done, (off_t)(c.off + done));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                e = n < 0 ? errno : EIO;
                break;
            }
            done += (size_t)n;
        }
        pthread_mutex_lock(&nv->mu);
        if (e) io_failed(nv, &c, e);
        nv->buf[c.buf].pending--;
        pthread_cond_broadcast(&nv->cv);
    }
    pthread_mutex_unlock(&nv->mu);
    return NULL;
}

/* ---- transfers ---------------------------------------------------------------------- */

static void check_error(zt_nvme_t *nv)
{
    if (!nv->err_no) return;
    zt_fatal("parallel.offload_nvme_path: %s %s at offset %zu: %s (the scratch files are removed; resume from "
             "the last checkpoint)", nv->err_write ? "writing" : "reading", nv->file, nv->err_off,
             strerror(nv->err_no));
}

/* queues the transfer of record rec between its buffer b and the file */
static void start_io(zt_nvme_t *nv, int b, int rec, int write)
{
    const size_t off = nv->rec_off[rec], len = nv->rec_len[rec];
    pthread_mutex_lock(&nv->mu);
    for (size_t d = 0; d < len; d += nv->block) {
        q_push(nv, (chunk_t){b, write, off + d, ZT_MIN(nv->block, len - d), nv->buf[b].mem + d});
        nv->buf[b].pending++;
    }
    if (nv->uring) uring_submit_locked(nv);
    else pthread_cond_broadcast(&nv->cv);
    pthread_mutex_unlock(&nv->mu);
    if (write) nv->wr += (double)len;
    else nv->rd += (double)len;
}

/* requests of buffer b (b < 0: of every buffer) not yet completed; under mu */
static int busy(const zt_nvme_t *nv, int b)
{
    for (int i = 0; i < nv->nbuf; i++)
        if ((b < 0 || i == b) && nv->buf[i].pending) return 1;
    return 0;
}

/* Blocks until buffer b (b < 0: every buffer) has no request left; a transfer that
 * landed makes its buffer clean. */
static void wait_io(zt_nvme_t *nv, int b)
{
    const double t0 = zt_now();
    pthread_mutex_lock(&nv->mu);
    while (busy(nv, b)) pthread_cond_wait(&nv->cv, &nv->mu);
    pthread_mutex_unlock(&nv->mu);
    nv->wait_s += zt_now() - t0;
    check_error(nv);
    for (int i = 0; i < nv->nbuf; i++) {
        buffer_t *x = &nv->buf[i];
        if ((b < 0 || i == b) && (x->state == B_READING || x->state == B_WRITING)) x->state = B_CLEAN;
    }
}

/* has buffer b's transfer landed (without waiting)? */
static int landed(zt_nvme_t *nv, int b)
{
    pthread_mutex_lock(&nv->mu);
    const int done = !nv->buf[b].pending;
    pthread_mutex_unlock(&nv->mu);
    return done;
}

static void drop(zt_nvme_t *nv, int b)
{
    if (nv->buf[b].rec >= 0) nv->rec_buf[nv->buf[b].rec] = -1;
    nv->buf[b].rec = -1;
    nv->buf[b].state = B_FREE;
}

/* a buffer for a new record; -1 when only held ones are left (or, with may_wait = 0,
 * when the only candidates are still in flight) */
static int grab(zt_nvme_t *nv, int may_wait)
{
    int best = -1;
    for (int i = 0; i < nv->nbuf; i++)
        if (nv->buf[i].state == B_FREE) return i;
    for (int i = 0; i < nv->nbuf; i++)
        if (nv->buf[i].state == B_CLEAN && (best < 0 || nv->buf[i].stamp < nv->buf[best].stamp)) best = i;
    if (best < 0)
        for (int i = 0; i < nv->nbuf; i++)
            if (nv->buf[i].state == B_WRITING && (best < 0 || nv->buf[i].stamp < nv->buf[best].stamp)) best = i;
    if (best < 0 && may_wait)
        for (int i = 0; i < nv->nbuf && best < 0; i++)
            if (nv->buf[i].state == B_READING) best = i;
    if (best < 0) return -1;
    if (nv->buf[best].state != B_CLEAN) {
        if (!may_wait && !landed(nv, best)) return -1;
        wait_io(nv, best);
    }
    drop(nv, best);
    return best;
}

static void set_fields(zt_nvme_t *nv, int b, int rec)
{
    size_t o = 0;
    for (int j = 0; j < nv->recs[rec].nfield; j++) {
        nv->buf[b].field[j] = nv->buf[b].mem + o;
        o += round_up(nv->recs[rec].bytes[j]);
    }
}

void zt_nvme_prefetch(zt_nvme_t *nv, int rec)
{
    if (rec < 0 || rec >= nv->nrec || nv->rec_buf[rec] >= 0 || !nv->rec_len[rec]) return;
    const int b = grab(nv, 0);
    if (b < 0) return;
    nv->buf[b].rec = rec;
    nv->buf[b].state = B_READING;
    nv->rec_buf[rec] = b;
    start_io(nv, b, rec, 0);
}

void **zt_nvme_get(zt_nvme_t *nv, int rec, int read)
{
    int b = nv->rec_buf[rec];
    if (b >= 0) {
        if (nv->buf[b].state == B_HELD) zt_fatal("zt_nvme_get: record %d is held already", rec);
        if (nv->buf[b].state != B_CLEAN) wait_io(nv, b);
    } else {
        b = grab(nv, 1);
        if (b < 0) zt_fatal("zt_nvme_get: all %d buffers are held (a caller holds too many records)", nv->nbuf);
        nv->buf[b].rec = rec;
        nv->rec_buf[rec] = b;
        if (read && nv->rec_len[rec]) {
            nv->buf[b].state = B_READING;
            start_io(nv, b, rec, 0);
            wait_io(nv, b);
        }
    }
    nv->buf[b].state = B_HELD;
    set_fields(nv, b, rec);
    return nv->buf[b].field;
}

void zt_nvme_put(zt_nvme_t *nv, int rec, int dirty)
{
    const int b = nv->rec_buf[rec];
    if (b < 0 || nv->buf[b].state != B_HELD) zt_fatal("zt_nvme_put: record %d is not held", rec);
    nv->buf[b].stamp = ++nv->clock;
    if (dirty && nv->rec_len[rec]) {
        nv->buf[b].state = B_WRITING;
        start_io(nv, b, rec, 1);
    } else {
        nv->buf[b].state = B_CLEAN;
    }
}

void zt_nvme_drain(zt_nvme_t *nv) { wait_io(nv, -1); }

/* ---- open and close ---------------------------------------------------------------- */

/* does process pid run (a zombie has ended: only its exit status is left)? */
static int running(long pid)
{
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
    return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* Directories ztrain.<this host>.<pid>.rank<r> of processes that no longer run (a kill
 * -9 leaves them): removed, with their files. Other hosts' are left alone. */
static void remove_stale(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return;
    char pre[300];
    snprintf(pre, sizeof pre, "ztrain.%s.", zt_hostname());
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, pre, strlen(pre)) != 0) continue;
        const long pid = strtol(e->d_name + strlen(pre), NULL, 10);
        if (pid <= 0 || pid == (long)getpid() || running(pid)) continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        zt_rm_rf(sub);
        if (access(sub, F_OK) != 0) zt_log("nvme: removed %s, left by process %ld of this host that no longer runs", sub, pid);
    }
    closedir(d);
}

/* closes the file, removes it and frees what open made (buffers included) */
static void free_nvme(zt_nvme_t *nv)
{
    if (nv->fd >= 0) close(nv->fd);
    unregister_file(nv->slot);
    for (int i = 0; nv->buf && i < nv->nbuf; i++) free(nv->buf[i].mem);
    free(nv->buf);
    free(nv->q);
    free(nv->recs);
    free(nv->rec_off);
    free(nv->rec_len);
    free(nv->rec_buf);
    free(nv);
}

static zt_nvme_t *open_fail(zt_nvme_t *nv, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static zt_nvme_t *open_fail(zt_nvme_t *nv, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    free_nvme(nv);
    return NULL;
}

zt_nvme_t *zt_nvme_open(const zt_nvme_opts_t *o, const zt_nvme_rec_t *recs, int nrec, char *err, size_t errlen)
{
    static int nopen;
    zt_nvme_t *nv = zt_calloc(1, sizeof *nv);
    nv->fd = -1;
    nv->slot = -1;
    struct stat stt;
    if (stat(o->path, &stt) != 0)
        return open_fail(nv, err, errlen, "parallel.offload_nvme_path: %s: %s", o->path, strerror(errno));
    if (!S_ISDIR(stt.st_mode))
        return open_fail(nv, err, errlen, "parallel.offload_nvme_path: %s is not a directory", o->path);
    if (o->buffer_count < 3)
        return open_fail(nv, err, errlen, "parallel.offload_nvme_buffer_count (%d) must be at least 3 (one unit "
                         "read, one updated, one written)", o->buffer_count);
    remove_stale(o->path);
    snprintf(nv->dir, sizeof nv->dir, "%s/ztrain.%s.%ld.rank%d", o->path, zt_hostname(), (long)getpid(), o->rank);
    if (mkdir(nv->dir, 0700) != 0 && errno != EEXIST)
        return open_fail(nv, err, errlen, "parallel.offload_nvme_path: cannot create %s: %s", nv->dir,
                         strerror(errno));
    snprintf(nv->file, sizeof nv->file, "%s/state.%d", nv->dir, nopen++);
    nv->slot = register_file(nv->dir, nv->file);
    nv->fd = open(nv->file, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
    nv->direct = nv->fd >= 0;
    if (nv->fd < 0 && errno == EINVAL) nv->fd = open(nv->file, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (nv->fd < 0)
        return open_fail(nv, err, errlen, "parallel.offload_nvme_path: cannot create %s: %s", nv->file,
                         strerror(errno));
    nv->nrec = nrec;
    nv->recs = zt_malloc((size_t)ZT_MAX(nrec, 1) * sizeof *recs);
    memcpy(nv->recs, recs, (size_t)nrec * sizeof *recs);
    nv->rec_off = zt_malloc((size_t)ZT_MAX(nrec, 1) * sizeof *nv->rec_off);
    nv->rec_len = zt_malloc((size_t)ZT_MAX(nrec, 1) * sizeof *nv->rec_len);
    nv->rec_buf = zt_malloc((size_t)ZT_MAX(nrec, 1) * sizeof *nv->rec_buf);
    for (int i = 0; i < nrec; i++) {
        nv->rec_off[i] = nv->file_bytes;
        nv->rec_len[i] = rec_bytes(&recs[i]);
        nv->file_bytes += nv->rec_len[i];
        nv->rec_buf[i] = -1;
    }
    /* every byte now: a full disk is met here, on every rank at start, not mid-step */
    const int rc = nv->file_bytes ? posix_fallocate(nv->fd, 0, (off_t)nv->file_bytes) : 0;
    if (rc) {
        struct statvfs fs;
        char need[32], have[32] = "?";
        zt_fmt_bytes((double)nv->file_bytes, need, sizeof need);
        if (statvfs(o->path, &fs) == 0) zt_fmt_bytes((double)fs.f_bavail * (double)fs.f_frsize, have, sizeof have);
        return open_fail(nv, err, errlen, "parallel.offload_nvme_path: %s: %s allocating rank %d's %s of offloaded "
                         "state (%s free)", o->path, strerror(rc), o->rank, need, have);
    }
    nv->buf_bytes = zt_nvme_buffer_bytes(recs, nrec);
    nv->block = o->block_size;
    nv->qd = o->queue_depth;
    nv->nbuf = o->buffer_count;
    nv->buf = zt_calloc((size_t)nv->nbuf, sizeof *nv->buf);
    for (int i = 0; i < nv->nbuf; i++) {
        /* O_DIRECT: requests start and end on 4 KiB boundaries, in memory as on disk */
        void *m = NULL;
        if (posix_memalign(&m, ALIGN, ZT_MAX(nv->buf_bytes, ALIGN)) != 0)
            zt_fatal("out of memory allocating the %d nvme buffers of %zu bytes", nv->nbuf, nv->buf_bytes);
        nv->buf[i].mem = m;
        nv->buf[i].rec = -1;
    }
    pthread_mutex_init(&nv->mu, NULL);
    pthread_cond_init(&nv->cv, NULL);
    const char *want = getenv("ZT_NVME_IO");
    if (!(want && !strcmp(want, "threads")) && io_uring_queue_init((unsigned)nv->qd, &nv->ring, 0) == 0) {
        nv->uring = 1;
        nv->nth = 1;
        const int e = pthread_create(&nv->th[0], NULL, uring_reaper, nv);
        if (e) zt_fatal("pthread_create (nvme I/O): %s", strerror(e));
    } else {
        nv->nth = ZT_MIN(nv->qd, MAX_THREADS);
        for (int i = 0; i < nv->nth; i++) {
            const int e = pthread_create(&nv->th[i], NULL, worker, nv);
            if (e) zt_fatal("pthread_create (nvme I/O): %s", strerror(e));
        }
    }
    return nv;
}

void zt_nvme_close(zt_nvme_t *nv)
{
    if (!nv) return;
    wait_io(nv, -1);
    pthread_mutex_lock(&nv->mu);
    if (nv->uring) { /* a no-op without data tells the reaper to end */
        struct io_uring_sqe *sqe = io_uring_get_sqe(&nv->ring);
        if (!sqe) zt_fatal("io_uring: no submission entry to stop the reaper of %s", nv->file);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, NULL);
        io_uring_submit(&nv->ring);
    }
    nv->stop = 1;
    pthread_cond_broadcast(&nv->cv);
    pthread_mutex_unlock(&nv->mu);
    for (int i = 0; i < nv->nth; i++) pthread_join(nv->th[i], NULL);
    if (nv->uring) io_uring_queue_exit(&nv->ring);
    pthread_mutex_destroy(&nv->mu);
    pthread_cond_destroy(&nv->cv);
    free_nvme(nv);
}

void zt_nvme_stats(const zt_nvme_t *nv, zt_nvme_stats_t *st)
{
    st->bytes_read = nv->rd;
    st->bytes_written = nv->wr;
    st->io_wait_s = nv->wait_s;
    st->buffer_bytes = nv->buf_bytes;
    st->file_bytes = nv->file_bytes;
    st->buffers = nv->nbuf;
    st->engine = nv->uring ? (nv->direct ? "io_uring" : "io_uring (page cache)")
                           : (nv->direct ? "threads" : "threads (page cache)");
    st->dir = nv->dir;
}
