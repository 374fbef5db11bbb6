#!/bin/sh
# watchdog.sh — a rank stuck "in a collective" must end the whole mpirun job
# within the watchdog timeout plus a few seconds, with one line naming the rank,
# host, operation, unit and step. Both ways of ending (ZT_WATCHDOG_ACTION=exit,
# the default, and kill) are checked, with the exit code each must produce.
. "$(dirname "$0")/common.sh"

prog="$ZT_BUILDDIR/tests/mpi/watchdog_test"
[ -x "$prog" ] || fail "$prog not built"
timeout_s=2
slack=10          # mpirun start-up and teardown on a busy 2-core machine

for action in exit kill; do
    out="$ZT_TMP/$action.out"
    start=$(date +%s)
    ZT_WATCHDOG_ACTION=$action ZT_TEST_TIMEOUT=60 ZT_MPIRUN_ARGS="-x ZT_WATCHDOG_ACTION" \
        sh "$ZT_MPIRUN" 2 "$prog" $timeout_s >"$out" 2>&1
    rc=$?
    elapsed=$(($(date +%s) - start))
    cat "$out"
    echo "action=$action rc=$rc elapsed=${elapsed}s"
    grep -qF "zt_mpirun.sh: TIMEOUT" "$out" && fail "$action: the watchdog did not end the job"
    assert_contains "$out" "phase 1 ok"
    assert_contains "$out" "ztrain: watchdog [rank 1 on $(hostname)]: no progress for 2."
    assert_contains "$out" "in all-reduce (unit 3) at step 7; aborting the job (parallel.timeout_s = 2)"
    grep -qF "passed the barrier" "$out" && fail "$action: a rank passed the barrier"
    [ "$(grep -c 'ztrain: watchdog' "$out")" -eq 1 ] || fail "$action: expected exactly one watchdog report"
    case $action in
    exit) [ "$rc" -eq 124 ] || fail "exit: mpirun returned $rc, expected 124" ;;
    kill) [ "$rc" -ne 0 ] || fail "kill: mpirun returned 0" ;;
    esac
    # 1.5 timeouts of progress + 1 timeout of stall + slack.
    limit=$((3 * timeout_s / 2 + timeout_s + slack))
    [ "$elapsed" -le "$limit" ] || fail "$action: job took ${elapsed}s, more than ${limit}s"
done
echo "watchdog: ok"
