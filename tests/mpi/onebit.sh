#!/bin/sh
# onebit.sh — DeepSpeed's 1-bit Adam (optim.type = onebit_adam).
# 1. The shard engine on given gradients (tests/mpi/onebit_test, clipped to norm 0.5: the
#    batch gradient's norm in the warm-up, each rank's own after) at 1, 2 and 4 ranks,
#    3 warm-up steps then 5 compressed ones, equals a float64 replay of DeepSpeed's
#    algorithm (tests/reference/onebit_replay.py) to float rounding; resumed from a
#    checkpoint taken in the compressed stage it ends bit-identical.
# 2. A training run: after the freeze no gradient all-reduce, and the compressed bytes
#    (all-to-all of sign bits, all-gathers of sign bits and scales, through zt_comm)
#    equal the formula per step, and the optimizer memory (estimated and measured) is m, v
#    and the error buffers; the refusals.
. "$(dirname "$0")/common.sh"
VPY=${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python
"$VPY" -c "import numpy" 2>/dev/null || VPY=${PYTHON3:-/usr/bin/python3}
"$VPY" -c "import numpy" 2>/dev/null || skip "python3 with numpy needed for the replay"
TEST="$ZT_BUILDDIR/tests/mpi/onebit_test"
[ -x "$TEST" ] || skip "$TEST not built"

for np in 1 2 4; do
    d="$ZT_TMP/replay-$np"
    mkdir -p "$d"
    "$ZT_MPIRUN" "$np" "$TEST" "$d" 8 3 6 > "$d.log" 2>&1 || { cat "$d.log"; fail "onebit_test at -np $np"; }
    "$VPY" "$ZT_SRCDIR/tests/reference/onebit_replay.py" "$d" "$np" 8 3 || fail "1-bit Adam at $np ranks differs from DeepSpeed's replay"
    echo "ok: $np ranks: the replay's parameters; resumed at step 6, bit-identical"
done

make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=6 checkpoint.save_at_end=false optim.type=onebit_adam optim.freeze_step=2"
for np in 2 3; do
    # shellcheck disable=SC2086
    run_ztrain "$np" $common train.output_dir="acc-$np" >/dev/null
    assert_contains "$ZT_OUT" "optim.type = onebit_adam: Adam without bias correction for 2 steps"
    "$VPY" - "acc-$np/metrics.jsonl" "$np" 2 <<'PY' || fail "1-bit Adam's bytes at $np ranks differ from the formula"
import json, sys
# tiny.cfg's GPT-2: V 257, C 32, context 32, 2 blocks; every tensor exchanged on its own
V, C, T, L = 257, 32, 32, 2
block = [C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C]
sizes = [V * C, T * C] + block * L + [C, C]
path, n, freeze = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
q = n * (n * 8 // __import__("math").gcd(n, 8))
B = sum((s + q - 1) // q * q // n // 8 for s in sizes)     # sign bytes of one rank's chunks
want = {"all_reduce": 0, "all_to_all": n * B, "all_gather": n * B + 2 * 4 * n * len(sizes)}
fp32 = 4 * sum(sizes)
recs = [json.loads(l) for l in open(path)]
steps = [r for r in recs if "loss" in r and "comm" in r]
bad = []
# optimizer memory: m and v, plus the error feedback (worker: padded size, server: its chunk)
opt = 8 * sum(sizes) + sum(4 * ((s + q - 1) // q * q) * (n + 1) // n for s in sizes)
for key, rec in (("memory_estimate", recs[0]), ("memory_measured", recs[-1])):
    if rec.get(key, {}).get("optimizer") != opt:
        bad.append(f"{key} optimizer {rec.get(key, {}).get('optimizer')} bytes, formula {opt}")
for r in steps:
    for kind, w in want.items():
        got = r["comm"][kind]["bytes"]
        if r["step"] <= freeze:
            w = fp32 if kind == "all_reduce" else 0
        if got != w:
            bad.append(f"step {r['step']}: {kind} {got} bytes, formula {w}")
print("\n".join(bad) or f"{n} ranks: after the freeze all-to-all {n * B} + all-gather {want['all_gather']} bytes a step "
      f"({(2 * n * B + 8 * n * len(sizes)) / fp32:.4f} of the fp32 all-reduce's {fp32}; bus bytes "
      f"{(2 * (n - 1) / n * n * B + (n - 1) / n * 8 * n * len(sizes)) / (2 * (n - 1) / n * fp32):.4f})")
sys.exit(1 if bad or len(steps) != 6 else 0)
PY
done

# the train loop: split at step 10 (compressed since step 6) and resumed, the run logs the
# same losses and ends with the same weights and Adam state as the uninterrupted one
if "$VPY" -c "import h5py" 2>/dev/null; then
    CHECK="$ZT_SRCDIR/tests/mpi/resume_check.py"
    PY=$VPY
    # shellcheck disable=SC2086
    common="$common checkpoint.save_at_end=true optim.freeze_step=5 optim.warmup_steps=3 optim.learning_rate=3e-3 optim.lr_scheduler_type=constant_with_warmup"
    resume_exact 2 ob2
    [ -e ob2-split/onebit-00000010.h5 ] || fail "no error feedback file beside ob2-split/ckpt-00000010.h5"
    "$PY" "$CHECK" exact ob2-full ob2-split || fail "1-bit Adam on 2 ranks: the resumed run differs"
    echo "ok: resumed in the compressed stage, bit-exact"
    # at another world size the errors cannot be restored: they restart from zero, said once
    # shellcheck disable=SC2086
    run_ztrain 3 $common train.max_steps=12 checkpoint.resume=ob2-split/ckpt-00000010.h5 train.output_dir=ob3 >/dev/null
    assert_contains "$ZT_OUT" "1-bit Adam: error feedback not restored (ob2-split/onebit-00000010.h5: saved at 2 ranks, not 3)"
else
    echo "h5py missing: the train loop's resume checks skipped"
fi

# refusals, one line each on every rank
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam runs with parallel.strategy = ddp only, not zero3" $common parallel.strategy=zero3
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam needs parallel.tensor_parallel_size = 1" $common \
    parallel.tensor_parallel_size=2
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam does not run with parallel.offload_optimizer = cpu" $common \
    parallel.offload_optimizer=cpu
echo "PASS: onebit"
