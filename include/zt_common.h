/* zt_common.h — error handling and small utilities shared by every module.
 *
 * Fatal errors are reported with rank, host, file:line and the failing library's
 * own message, then the whole job is aborted with MPI_Abort: one rank must never
 * exit() while the others wait in a collective. Recoverable, input-dependent
 * errors (bad config, bad data, bad checkpoint) are instead returned as an error
 * string up to zt_run(), which turns them into a collective decision. */
#ifndef ZT_COMMON_H
#define ZT_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ZT_ERRLEN 512

/* Prints "ztrain: FATAL [rank r on host] file:line: message" and aborts every rank. */
void zt_fatal_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
#define zt_fatal(...) zt_fatal_at(__FILE__, __LINE__, __VA_ARGS__)

/* Functions every abnormal end runs before the process goes (zt_fatal, a second stop
 * signal, the watchdog): async-signal-safe and idempotent (scratch files removed). */
void zt_at_abort(void (*fn)(void));
void zt_run_abort_hooks(void);

/* Checked libc allocation; aborts the job with the size requested on failure. */
void *zt_malloc_at(size_t bytes, const char *file, int line);
void *zt_calloc_at(size_t n, size_t size, const char *file, int line);
#define zt_malloc(b) zt_malloc_at((b), __FILE__, __LINE__)
#define zt_calloc(n, s) zt_calloc_at((n), (s), __FILE__, __LINE__)
/* 64-byte aligned allocation for SIMD and GEMM buffers. */
void *zt_aligned_alloc_at(size_t bytes, const char *file, int line);
#define zt_aligned_alloc(b) zt_aligned_alloc_at((b), __FILE__, __LINE__)

/* MPI: every call through this macro; the MPI error string is printed. */
#define ZT_MPI(call)                                                          \
    do {                                                                      \
        int zt_mpi_rc_ = (call);                                              \
        if (zt_mpi_rc_ != 0) zt_mpi_fail(zt_mpi_rc_, #call, __FILE__, __LINE__); \
    } while (0)
void zt_mpi_fail(int rc, const char *call, const char *file, int line) __attribute__((noreturn));

/* Formats into an error buffer (bounded); returns -1 so callers can `return zt_err(...)`. */
int zt_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Whole file into a malloc'd, NUL-terminated buffer (*len bytes, NUL not counted;
 * len may be NULL). NULL with "PATH: cannot open: ..." or "PATH: read error" in err. */
char *zt_read_file(const char *path, size_t *len, char *err, size_t errlen);

/* mkdir -p: 0, or -1 with "PATH: cannot create directory: reason" in err. */
int zt_mkdir_p(const char *path, char *err, size_t errlen);
/* rm -rf (no error if absent). */
void zt_rm_rf(const char *path);
/* fsync of a file or directory by path; 0 or -1 (errno set). */
int zt_fsync_path(const char *path);
/* The splitmix64 finalizer (Steele et al.): a 64-bit mix for counter-based hashing. */
static inline uint64_t zt_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Wall-clock seconds (monotonic). */
double zt_now(void);
/* The calling thread's CPU seconds: a computation's own time, which a busy machine's
 * preemption does not stretch as it stretches the wall clock. */
double zt_thread_seconds(void);

/* Rank and host of this process in MPI_COMM_WORLD, cached after MPI_Init. */
int zt_world_rank(void);
const char *zt_hostname(void);

/* Peak resident set size of this process in bytes (VmHWM). */
size_t zt_peak_rss(void);
size_t zt_current_rss(void);

/* Human-readable byte count into buf ("1.23 GiB"). */
const char *zt_fmt_bytes(double bytes, char *buf, size_t len);

/* Case-insensitive edit distance of two names (1000 when either is over 255 bytes): what
 * a "did you mean" picks its suggestion by. */
int zt_levenshtein(const char *a, const char *b);

#define ZT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ZT_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

#endif
