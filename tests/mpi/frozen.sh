#!/bin/sh
# frozen.sh — frozen units (LoRA's base) in the shard engine at 1-4 ranks: no
# gradients, no optimizer state, no reductions for them under every strategy, layout,
# precision and offload setting; values unchanged; the trainable units as in a run
# where nothing is frozen (tests/mpi/frozen_test.c). At 2-4 ranks the engine's
# memory and traffic with frozen units are also checked against
# tests/mpi/check_accounting.py's independent formulas (--frozen).
. "$(dirname "$0")/common.sh"
PY=${PYTHON3:-/usr/bin/python3}
"$PY" -c "import json" 2>/dev/null || PY=""
for np in 1 2 3 4; do
    m="$ZT_TMP/metrics-$np"
    ZT_FROZEN_METRICS=$m sh "$ZT_MPIRUN" "$np" "$ZT_BUILDDIR/tests/mpi/frozen_test" >"$ZT_OUT" 2>&1 ||
        { cat "$ZT_OUT"; fail "frozen_test on $np ranks"; }
    assert_contains "$ZT_OUT" "frozen_test: $np ranks: all checks passed"
    [ "$np" -gt 1 ] && [ -n "$PY" ] || continue
    for d in "$m"/*/; do
        # shellcheck disable=SC2046
        "$PY" "$ZT_SRCDIR/tests/mpi/check_accounting.py" "$d" $(cat "$d/args") ||
            fail "frozen accounting at $np ranks: $(basename "$d") differs from theory"
    done
done
echo "frozen: ok"
