/* zt_log.c — rank-0 console output, optional per-rank log files. */
#include "zt_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int log_rank;
static FILE *rank_log;

void zt_log_init(int rank, const char *rank_log_path)
{
    log_rank = rank;
    if (rank_log_path && !rank_log) {
        rank_log = fopen(rank_log_path, "a");
        if (rank_log) setvbuf(rank_log, NULL, _IOLBF, 0);
    }
}

void zt_log_close(void)
{
    if (rank_log) fclose(rank_log);
    rank_log = NULL;
}

static void vlog(FILE *console, const char *prefix, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    if (console) {
        /* one write of the whole line, after whatever stdout still holds: an error on
         * unbuffered stderr must not land inside a progress line when both go to one
         * file (a test's log, a batch job's output) */
        char line[4096];
        const int k = snprintf(line, sizeof line, "%s", prefix);
        vsnprintf(line + k, sizeof line - (size_t)k - 1, fmt, ap);
        strcat(line, "\n");
        if (console == stderr) fflush(stdout);
        fputs(line, console);
        fflush(console);
    }
    if (rank_log) {
        fputs(prefix, rank_log);
        vfprintf(rank_log, fmt, ap2);
        fputc('\n', rank_log);
    }
    va_end(ap2);
}

void zt_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(log_rank == 0 ? stdout : NULL, "", fmt, ap);
    va_end(ap);
}

void zt_log_all(const char *fmt, ...)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d] ", log_rank);
    va_list ap;
    va_start(ap, fmt);
    vlog(stderr, prefix, fmt, ap);
    va_end(ap);
}

void zt_log_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(log_rank == 0 ? stderr : NULL, "ztrain: error: ", fmt, ap);
    va_end(ap);
}
