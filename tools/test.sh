#!/bin/sh
# test.sh — README's second command, and exactly what CI runs: installs what is
# missing, builds in build/, and runs the whole test suite (unit tests, MPI tests
# at 1-4 ranks, checkpoint and resharding tests, a real Slurm on localhost).
#
# The same tests as `make -C build check`, in two phases: the tests of one process
# each (Makefile.am's SOLO_TESTS) two at a time, then the MPI tests one after
# another, since each of those runs its ranks on both cores. The check programs
# are built two compilers at once first (make check alone builds them one by one).
set -eu
cd "$(dirname "$0")/.."
sh tools/install-deps.sh
sh tools/build.sh build
jobs=$(nproc)
make -C build -j"$jobs" check TESTS= PYTHON3=/usr/bin/python3
solo=$(make -s -C build print-solo-tests)
mpi=""
for t in $(make -s -C build print-tests); do
    case " $solo " in *" $t "*) ;; *) mpi="$mpi $t" ;; esac
done
rc=0
make -C build -j"$jobs" check TESTS="$solo" TEST_SUITE_LOG=test-suite-solo.log PYTHON3=/usr/bin/python3 || rc=$?
make -C build check TESTS="$mpi" TEST_SUITE_LOG=test-suite-mpi.log PYTHON3=/usr/bin/python3 || rc=$?
# automake keeps each test's output in build/tests/**/*.log; show failures
if [ $rc -ne 0 ]; then
    for f in $(grep -l "^FAIL\|^ERROR" build/tests/*/*.log 2>/dev/null); do
        echo "==== $f"; tail -40 "$f"
    done
fi
# the ten slowest tests, from the wall times tests/test-driver-timed writes into each .trs
echo "slowest tests (wall seconds):"
for f in $(find build/tests -name '*.trs'); do
    printf '%8s  %s\n' "$(sed -n 's/^:wall-seconds: //p' "$f")" "${f#build/}"
done | sed 's/\.trs$//' | sort -rn | head -10
# the two phases' counts, summed
count() {
    n=0
    for log in build/test-suite-solo.log build/test-suite-mpi.log; do
        n=$((n + $(sed -n "s/^# $1: *//p" "$log" 2>/dev/null | head -1 | grep . || echo 0)))
    done
    echo $n
}
pass=$(count PASS)
skipped=$(count SKIP)
failed=$(($(count FAIL) + $(count ERROR)))
[ $rc -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
echo "tests: $pass passed, $failed failed, $skipped skipped"
exit $rc
