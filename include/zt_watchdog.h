/* zt_watchdog.h — signals, the per-rank hang watchdog, and fault injection.
 *
 * Signals: SIGTERM, SIGUSR1 and SIGINT set a flag; the train loop polls
 * zt_signal_pending() at each step boundary, agrees collectively, checkpoints
 * and exits with ZT_EXIT_SIGNAL. A second signal exits at once (_exit, code
 * 128+signo): checkpoints are written to a temporary name and renamed, so the
 * last good one is never damaged.
 *
 * Watchdog: a helper thread per rank. The train loop marks what it is doing
 * (zt_watchdog_mark("all-reduce", unit, step)); when the same mark stays for
 * longer than the timeout, the thread prints one line naming rank, host,
 * operation, unit and step, and terminates the process, which makes the
 * launcher (mpirun, srun) end the whole job instead of hanging until the
 * wall-clock limit.
 *
 * Fault injection (config section `fault`, for tests): stall or kill a chosen
 * rank at a chosen step, or make it see a NaN loss or a data error. */
#ifndef ZT_WATCHDOG_H
#define ZT_WATCHDOG_H

void zt_signal_install(void);
int zt_signal_pending(void);        /* signal number received, or 0 */

/* timeout_s <= 0: no watchdog. */
void zt_watchdog_start(double timeout_s, int rank, const char *host);
void zt_watchdog_mark(const char *op, int unit, long step); /* op must be a string literal */
void zt_watchdog_idle(void);        /* nothing in progress (e.g. between runs) */
void zt_watchdog_stop(void);

/* Fault kinds, config `fault.kind` (save_kill is the checkpoint writer's: zt_ckpt.h). */
enum { ZT_FAULT_NONE = 0, ZT_FAULT_STALL, ZT_FAULT_KILL, ZT_FAULT_NAN, ZT_FAULT_DATA, ZT_FAULT_SAVE_KILL };
/* Called by the train loop at the start of every step on every rank: performs a stall or a
 * kill when (rank, step) match; returns the fault kind that the caller must simulate itself
 * (ZT_FAULT_NAN, ZT_FAULT_DATA; ZT_FAULT_SAVE_KILL passes through) or ZT_FAULT_NONE. */
int zt_fault_check(int fault_kind, int fault_rank, long fault_step, int rank, long step);

#endif
