#!/bin/sh
# comm.sh — the collectives (ring all-reduce and reduce-scatter, fp32, bf16 and fp16,
# ragged counts) against exact sums at 1-4 ranks; and checkpoint I/O staged through
# host memory (the device-backend path) at 1-3 ranks.
. "$(dirname "$0")/common.sh"
for np in 1 2 3 4; do
    sh "$ZT_MPIRUN" "$np" "$ZT_BUILDDIR/tests/mpi/comm_test" >"$ZT_OUT" 2>&1 || { cat "$ZT_OUT"; fail "comm_test on $np ranks"; }
    assert_contains "$ZT_OUT" "comm_test: $np ranks: all checks passed"
done
for np in 1 2 3; do
    sh "$ZT_MPIRUN" "$np" "$ZT_BUILDDIR/tests/mpi/stage_test" >"$ZT_OUT" 2>&1 || { cat "$ZT_OUT"; fail "stage_test on $np ranks"; }
    assert_contains "$ZT_OUT" "stage_test: $np ranks: all checks passed"
done
echo "comm: ok"
