#!/bin/sh
# test.sh — README's second command, and exactly what CI runs: installs what is
# missing, builds in build/, and runs the whole test suite (unit tests, MPI tests
# at 1-4 ranks, checkpoint and resharding tests, a real Slurm on localhost).
set -eu
cd "$(dirname "$0")/.."
sh tools/install-deps.sh
sh tools/build.sh build
rc=0
make -C build check PYTHON3=/usr/bin/python3 || rc=$?
# automake keeps each test's output in build/tests/**/*.log; show failures
if [ $rc -ne 0 ]; then
    for f in $(grep -l "^FAIL\|^ERROR" build/tests/*/*.log 2>/dev/null); do
        echo "==== $f"; tail -40 "$f"
    done
fi
pass=$(sed -n 's/^# PASS: *//p' build/test-suite.log 2>/dev/null)
skipped=$(sed -n 's/^# SKIP: *//p' build/test-suite.log 2>/dev/null)
failed=$(( $(sed -n 's/^# FAIL: *//p' build/test-suite.log 2>/dev/null || echo 0) + $(sed -n 's/^# ERROR: *//p' build/test-suite.log 2>/dev/null || echo 0) ))
[ $rc -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "tests: ${pass:-0} passed, $failed failed, ${skipped:-0} skipped"
exit $rc
