/* zt_watchdog.c — stop signals, the per-rank hang watchdog, and fault injection.
 *
 * Signals only set a flag: the train loop polls it at a step boundary, where all
 * ranks can agree, checkpoint and exit with ZT_EXIT_SIGNAL. Doing real work in a
 * handler (or exiting one rank) would leave the other ranks in a collective. A
 * second signal means "now": the handler writes one line with write(2) (the only
 * output that is async-signal-safe) and _exit(128 + signo).
 *
 * The watchdog exists because a rank stuck in a collective (a dead peer, a
 * deadlock, a stalled file system) otherwise burns the whole wall-clock limit.
 * zt_watchdog_mark() is called in the hot path, so it does only relaxed atomic
 * stores and bumps a generation counter; the helper thread owns the clock: it
 * polls every 100 ms and measures how long the generation has not moved.
 *
 * How a stuck rank ends: _exit(124) (the code timeout(1) uses), or SIGKILL to
 * itself with ZT_WATCHDOG_ACTION=kill. Measured here with tests/mpi/watchdog.sh
 * (2 ranks, 2 s timeout, rank 0 in MPI_Barrier): under `mpirun` both end every
 * rank 1.0-1.1 s after the report (mpirun aborts the job on the first non-zero
 * exit or signal); under `srun --mpi=pmix` both end the step about as fast (the
 * PMIx plugin cancels a step whose task dies without MPI_Finalize). Without PMIx,
 * srun ends the step for neither unless --kill-on-bad-exit=1 is given (a SIGKILLed
 * task waited out a 20 s peer), so the job scripts always pass it. Being equally
 * prompt, _exit(124) wins on the exit code: mpirun returns 124, which says
 * "watchdog", where 137 would look like the kernel's OOM killer. */
#define _GNU_SOURCE
#include "zt_watchdog.h"

#include "zt_common.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- signals --------------------------------------------------------------- */

static volatile sig_atomic_t pending_signo;

/* Decimal digits of v into buf (async-signal-safe replacement for snprintf). */
static size_t fmt_uint(char *buf, unsigned v)
{
    char tmp[16];
    size_t n = 0, i = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < sizeof tmp);
    while (n) buf[i++] = tmp[--n];
    return i;
}

static void on_stop_signal(int signo)
{
    if (pending_signo) {
        char msg[128];
        static const char head[] = "ztrain: second signal ";
        static const char tail[] = " received: exiting now without a checkpoint\n";
        size_t n = 0;
        memcpy(msg + n, head, sizeof head - 1);
        n += sizeof head - 1;
        n += fmt_uint(msg + n, (unsigned)signo);
        memcpy(msg + n, tail, sizeof tail - 1);
        n += sizeof tail - 1;
        ssize_t w = write(STDERR_FILENO, msg, n);
        (void)w;
        zt_run_abort_hooks();
        _exit(128 + signo);
    }
    pending_signo = signo;
}

void zt_signal_install(void)
{
    static const int sigs[] = {SIGTERM, SIGUSR1, SIGINT};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* MPI and HDF5 calls must not see EINTR */
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        sigaddset(&sa.sa_mask, sigs[i]); /* handlers never interleave */
    }
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        if (sigaction(sigs[i], &sa, NULL) != 0)
            zt_fatal("sigaction(%d) failed: %s", sigs[i], strerror(errno));
    }
}

int zt_signal_pending(void)
{
    return (int)pending_signo;
}

/* ---- watchdog ------------------------------------------------------------ */

/* The current mark. Fields are written before the generation (release) and the
 * thread re-reads the generation after the fields, so a report never mixes two
 * marks; a torn read is simply retried at the next poll. */
static _Atomic(const char *) mark_op;
static atomic_int mark_unit;
static atomic_long mark_step;
static atomic_ulong mark_gen;

static pthread_t wd_thread;
static atomic_int wd_running;
static double wd_timeout_s;
static int wd_rank;
static char wd_host[256];

#define WD_POLL_NS 100000000L /* 100 ms: the report is at most this late */

static void watchdog_fire(const char *op, int unit, long step, double stalled_s)
{
    /* write(2), not stdio: the stuck main thread may hold the stderr or stdout
     * lock (a blocked pipe), and the report must not wait for it. */
    char msg[768];
    int n = snprintf(msg, sizeof msg,
                     "ztrain: watchdog [rank %d on %s]: no progress for %.1f s in %s (unit %d) at "
                     "step %ld; aborting the job (parallel.timeout_s = %g)\n",
                     wd_rank, wd_host, stalled_s, op, unit, step, wd_timeout_s);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, ZT_MIN((size_t)n, sizeof msg - 1));
        (void)w;
    }
    if (ftrylockfile(stdout) == 0) { /* keep rank 0's last progress lines if we can */
        fflush_unlocked(stdout);
        funlockfile(stdout);
    }
    const char *action = getenv("ZT_WATCHDOG_ACTION");
    zt_run_abort_hooks();
    if (action && strcmp(action, "kill") == 0) kill(getpid(), SIGKILL);
    _exit(124);
}

static void *watchdog_main(void *arg)
{
    (void)arg;
    unsigned long seen_gen = atomic_load(&mark_gen);
    double seen_at = zt_now();
    struct timespec poll = {0, WD_POLL_NS};
    while (atomic_load(&wd_running)) {
        nanosleep(&poll, NULL);
        unsigned long g = atomic_load_explicit(&mark_gen, memory_order_acquire);
        const char *op = atomic_load_explicit(&mark_op, memory_order_relaxed);
        int unit = atomic_load_explicit(&mark_unit, memory_order_relaxed);
        long step = atomic_load_explicit(&mark_step, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&mark_gen, memory_order_relaxed) != g) continue; /* changing now */
        double now = zt_now();
        if (g != seen_gen) {
            seen_gen = g;
            seen_at = now;
            continue;
        }
        if (op && now - seen_at > wd_timeout_s) watchdog_fire(op, unit, step, now - seen_at);
    }
    return NULL;
}

void zt_watchdog_start(double timeout_s, int rank, const char *host)
{
    if (timeout_s <= 0 || atomic_load(&wd_running)) return;
    wd_timeout_s = timeout_s;
    wd_rank = rank;
    snprintf(wd_host, sizeof wd_host, "%s", host ? host : "?");
    atomic_store(&wd_running, 1);
    /* The thread must not take the stop signals: they belong to the main thread's
     * handler, and a signal delivered to a thread sleeping in nanosleep is fine but
     * keeping them masked here makes delivery predictable. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(&wd_thread, NULL, watchdog_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) zt_fatal("pthread_create(watchdog) failed: %s", strerror(rc));
}

void zt_watchdog_mark(const char *op, int unit, long step)
{
    atomic_store_explicit(&mark_op, op, memory_order_relaxed);
    atomic_store_explicit(&mark_unit, unit, memory_order_relaxed);
    atomic_store_explicit(&mark_step, step, memory_order_relaxed);
    atomic_fetch_add_explicit(&mark_gen, 1, memory_order_release);
}

void zt_watchdog_idle(void)
{
    zt_watchdog_mark(NULL, -1, -1);
}

void zt_watchdog_stop(void)
{
    if (!atomic_load(&wd_running)) return;
    atomic_store(&wd_running, 0);
    int rc = pthread_join(wd_thread, NULL);
    if (rc != 0) zt_fatal("pthread_join(watchdog) failed: %s", strerror(rc));
    zt_watchdog_idle();
}

/* ---- fault injection ------------------------------------------------------ */

int zt_fault_check(int fault_kind, int fault_rank, long fault_step, int rank, long step)
{
    if (fault_kind == ZT_FAULT_NONE || rank != fault_rank || step != fault_step) return ZT_FAULT_NONE;
    switch (fault_kind) {
    case ZT_FAULT_STALL:
        fprintf(stderr, "ztrain: fault injection: rank %d stalls at step %ld\n", rank, step);
        fflush(stderr);
        /* A fresh mark so the watchdog report names the injected stall; its peers
         * report whatever collective they wait in. */
        zt_watchdog_mark("injected stall", -1, step);
        for (;;) sleep(1);
    case ZT_FAULT_KILL:
        fprintf(stderr, "ztrain: fault injection: killing rank %d at step %ld\n", rank, step);
        fflush(stderr);
        raise(SIGKILL);
        _exit(137); /* not reached */
    default:
        return fault_kind; /* nan, data: the train loop simulates them */
    }
}
