/* zt_log.h — the one logging module.
 *
 * Rank 0 prints to stdout (flushed per line); with log.all_ranks every rank also
 * writes <output_dir>/rank-<r>.log. Metrics (metrics.jsonl) are zt_metrics.h's. */
#ifndef ZT_LOG_H
#define ZT_LOG_H

#include <stdio.h>

/* Sets up: rank, whether this rank prints, per-rank log file (may be NULL). */
void zt_log_init(int rank, const char *rank_log_path);
void zt_log_close(void);
/* Rank 0 only (others: to their rank log, if any). */
void zt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Every rank (prefixed "[rank r] "), to stderr and its rank log. */
void zt_log_all(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Rank 0: error line to stderr, "ztrain: error: ..." */
void zt_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
