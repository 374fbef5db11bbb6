/* zt_common.c — fatal errors that abort the whole job, checked allocation, timers, RSS. */
#define _GNU_SOURCE /* nftw */
#include "zt_common.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>

#include <ctype.h>
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int cached_rank = -1;
static char cached_host[256];

int zt_world_rank(void)
{
    if (cached_rank < 0) {
        int init = 0;
        MPI_Initialized(&init);
        if (!init) return 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &cached_rank);
    }
    return cached_rank;
}

const char *zt_hostname(void)
{
    if (!cached_host[0] && gethostname(cached_host, sizeof cached_host - 1) != 0)
        strcpy(cached_host, "?");
    return cached_host;
}

#define MAX_ABORT_HOOKS 8
static void (*abort_hooks[MAX_ABORT_HOOKS])(void);
static volatile sig_atomic_t nabort_hooks;

void zt_at_abort(void (*fn)(void))
{
    if (nabort_hooks < MAX_ABORT_HOOKS) abort_hooks[nabort_hooks] = fn, nabort_hooks++;
}

void zt_run_abort_hooks(void)
{
    for (int i = 0; i < nabort_hooks; i++) abort_hooks[i]();
}

static __attribute__((noreturn)) void abort_job(void)
{
    zt_run_abort_hooks();
    fflush(stdout);
    fflush(stderr);
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
    abort();
}

void zt_fatal_at(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ztrain: FATAL [rank %d on %s] %s:%d: %s\n", zt_world_rank(), zt_hostname(),
            file, line, msg);
    abort_job();
}

void zt_mpi_fail(int rc, const char *call, const char *file, int line)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    zt_fatal_at(file, line, "%s failed: %s", call, msg);
}

void *zt_malloc_at(size_t bytes, const char *file, int line)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) zt_fatal_at(file, line, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *zt_calloc_at(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) zt_fatal_at(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *zt_aligned_alloc_at(size_t bytes, const char *file, int line)
{
    void *p = NULL;
    int rc = posix_memalign(&p, 64, bytes ? bytes : 64);
    if (rc != 0) zt_fatal_at(file, line, "out of memory allocating %zu aligned bytes: %s", bytes,
                             strerror(rc));
    return p;
}

int zt_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

char *zt_read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        zt_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, got;
    char *buf = zt_malloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) zt_fatal("out of memory reading %s", path);
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        zt_err(err, errlen, "%s: read error", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

double zt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double zt_thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, klen) == 0) {
            kb = strtoull(line + klen, NULL, 10);
            break;
        }
    fclose(f);
    return kb * 1024;
}

size_t zt_peak_rss(void) { return status_kb("VmHWM:"); }
size_t zt_current_rss(void) { return status_kb("VmRSS:"); }

const char *zt_fmt_bytes(double bytes, char *buf, size_t len)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

int zt_mkdir_p(const char *path, char *err, size_t errlen)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", path) >= sizeof tmp)
        return zt_err(err, errlen, "%.200s...: path too long", path);
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p) continue;
        const char c = *p;
        *p = 0;
        struct stat st;
        if (mkdir(tmp, 0755) != 0 && (errno != EEXIST || stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)))
            return zt_err(err, errlen, "%s: cannot create directory: %s", tmp,
                          errno == EEXIST ? "exists and is not a directory" : strerror(errno));
        *p = c;
        if (!c) break;
    }
    return 0;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void zt_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    else unlink(path);
}

int zt_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Case-insensitive Levenshtein distance; names are short, two rows suffice. */
int zt_levenshtein(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 255 || lb > 255) return 1000;
    int prev[256], cur[256];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = ZT_MIN(sub, ZT_MIN(del, ins));
        }
        memcpy(prev, cur, (lb + 1) * sizeof(int));
    }
    return prev[lb];
}
