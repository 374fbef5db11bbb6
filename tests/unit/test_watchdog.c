/* test_watchdog.c — signals, the hang watchdog and fault injection, each in a
 * forked child so that a handler, an _exit or a SIGKILL is observed from outside
 * exactly as a launcher would see it (exit status and stderr). */
#define _GNU_SOURCE
#include "zt_test.h"
#include "zt_watchdog.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int status;      /* from waitpid */
    double seconds;  /* child's lifetime */
    char err[4096];  /* child's stderr */
} child_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Runs fn in a child with stderr captured; the child exits 0 if fn returns. */
static child_t run_child(void (*fn)(void))
{
    child_t c;
    memset(&c, 0, sizeof c);
    int fd[2];
    CU_ASSERT_FATAL(pipe(fd) == 0);
    double t0 = now_s();
    pid_t pid = fork();
    CU_ASSERT_FATAL(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], STDERR_FILENO);
        alarm(20); /* a broken watchdog must not hang the test */
        fn();
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd[0], c.err + n, sizeof c.err - 1 - n)) > 0) n += (size_t)r;
    close(fd[0]);
    waitpid(pid, &c.status, 0);
    c.seconds = now_s() - t0;
    return c;
}

static void test_fault_check_passive(void)
{
    /* Wrong rank or step, or no fault: nothing happens. */
    CU_ASSERT_EQUAL(zt_fault_check(ZT_FAULT_KILL, 1, 5, 0, 5), ZT_FAULT_NONE);
    CU_ASSERT_EQUAL(zt_fault_check(ZT_FAULT_KILL, 1, 5, 1, 4), ZT_FAULT_NONE);
    CU_ASSERT_EQUAL(zt_fault_check(ZT_FAULT_NONE, 1, 5, 1, 5), ZT_FAULT_NONE);
    /* Faults the train loop simulates are handed back. */
    CU_ASSERT_EQUAL(zt_fault_check(ZT_FAULT_NAN, 1, 5, 1, 5), ZT_FAULT_NAN);
    CU_ASSERT_EQUAL(zt_fault_check(ZT_FAULT_DATA, 0, 0, 0, 0), ZT_FAULT_DATA);
}

static void child_one_signal(void)
{
    zt_signal_install();
    if (zt_signal_pending() != 0) _exit(10);
    raise(SIGUSR1);
    if (zt_signal_pending() != SIGUSR1) _exit(11);
}

static void test_signal_sets_flag(void)
{
    child_t c = run_child(child_one_signal);
    CU_ASSERT(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
}

static void child_two_signals(void)
{
    zt_signal_install();
    raise(SIGTERM);
    raise(SIGTERM);
    _exit(12); /* the second signal must have ended us */
}

static void test_second_signal_exits(void)
{
    child_t c = run_child(child_two_signals);
    CU_ASSERT(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 128 + SIGTERM);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "ztrain: second signal 15 received"));
}

static void child_stuck(void)
{
    zt_watchdog_start(0.3, 5, "hostx");
    zt_watchdog_mark("all-gather", 2, 9);
    for (;;) sleep(1);
}

static void test_watchdog_fires(void)
{
    unsetenv("ZT_WATCHDOG_ACTION");
    child_t c = run_child(child_stuck);
    CU_ASSERT(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 124);
    CU_ASSERT(c.seconds >= 0.3 && c.seconds < 2.0);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "ztrain: watchdog [rank 5 on hostx]: no progress for 0."));
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "s in all-gather (unit 2) at step 9; aborting the job "
                                         "(parallel.timeout_s = 0.3)\n"));
}

static void test_watchdog_kill_action(void)
{
    setenv("ZT_WATCHDOG_ACTION", "kill", 1);
    child_t c = run_child(child_stuck);
    unsetenv("ZT_WATCHDOG_ACTION");
    CU_ASSERT(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "in all-gather (unit 2) at step 9"));
}

static void child_progress(void)
{
    zt_watchdog_start(0.3, 0, "h");
    struct timespec tick = {0, 20000000L};
    /* Many marks, even the same op again and again, are progress... */
    for (int i = 0; i < 50; i++) {
        zt_watchdog_mark("forward", 0, 1);
        nanosleep(&tick, NULL);
    }
    /* ...and idle time is never a hang. */
    zt_watchdog_idle();
    sleep(1);
    zt_watchdog_stop();
}

static void test_watchdog_quiet_on_progress(void)
{
    child_t c = run_child(child_progress);
    CU_ASSERT(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
    CU_ASSERT_PTR_NULL(strstr(c.err, "watchdog"));
}

static void child_stop_then_stuck(void)
{
    zt_watchdog_start(0.2, 0, "h");
    zt_watchdog_stop();
    zt_watchdog_mark("all-reduce", 0, 0);
    sleep(1); /* no watchdog any more: must survive */
}

static void test_watchdog_stop(void)
{
    child_t c = run_child(child_stop_then_stuck);
    CU_ASSERT(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0);
}

static void child_fault_kill(void)
{
    zt_fault_check(ZT_FAULT_KILL, 1, 3, 1, 3);
    _exit(13);
}

static void test_fault_kill(void)
{
    child_t c = run_child(child_fault_kill);
    CU_ASSERT(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "killing rank 1 at step 3"));
}

static void child_fault_stall(void)
{
    zt_watchdog_start(0.3, 1, "h");
    zt_watchdog_mark("forward", 0, 3);
    zt_fault_check(ZT_FAULT_STALL, 1, 3, 1, 3);
    _exit(14);
}

static void test_fault_stall_caught(void)
{
    child_t c = run_child(child_fault_stall);
    CU_ASSERT(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 124);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "rank 1 stalls at step 3"));
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "in injected stall (unit -1) at step 3"));
}

static const zt_test_t tests[] = {
    {"fault_check_passive", test_fault_check_passive},
    {"signal_sets_flag", test_signal_sets_flag},
    {"second_signal_exits", test_second_signal_exits},
    {"watchdog_fires", test_watchdog_fires},
    {"watchdog_kill_action", test_watchdog_kill_action},
    {"watchdog_quiet_on_progress", test_watchdog_quiet_on_progress},
    {"watchdog_stop", test_watchdog_stop},
    {"fault_kill", test_fault_kill},
    {"fault_stall_caught", test_fault_stall_caught},
    {NULL, NULL},
};

ZT_TEST_MAIN("watchdog", tests)
