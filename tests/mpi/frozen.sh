#!/bin/sh
# frozen.sh — frozen units (LoRA's base) in the shard engine at 1-4 ranks: no
# gradients, no optimizer state, no reductions for them under every strategy, layout,
# precision and offload setting; values unchanged; the trainable units as in a run
# where nothing is frozen (tests/mpi/frozen_test.c).
. "$(dirname "$0")/common.sh"
for np in 1 2 3 4; do
    sh "$ZT_MPIRUN" "$np" "$ZT_BUILDDIR/tests/mpi/frozen_test" >"$ZT_OUT" 2>&1 || { cat "$ZT_OUT"; fail "frozen_test on $np ranks"; }
    assert_contains "$ZT_OUT" "frozen_test: $np ranks: all checks passed"
done
echo "frozen: ok"
