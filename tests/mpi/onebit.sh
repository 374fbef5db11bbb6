#!/bin/sh
# onebit.sh — DeepSpeed's 1-bit Adam (optim.type = onebit_adam).
# 1. The shard engine on given gradients (tests/mpi/onebit_test, clipped to norm 0.5: the
#    batch gradient's norm in the warm-up, each rank's own after) at 1, 2 and 4 ranks under
#    ddp, zero1 and zero2 (flat and per_param layouts; zero2 with 2 and 4 micro-steps, whose
#    full local gradients it keeps after the freeze), 3 warm-up steps then 5 compressed
#    ones, equals a float64 replay of DeepSpeed's algorithm (tests/reference/onebit_replay.py)
#    to float rounding; resumed from a checkpoint taken in the compressed stage it ends
#    bit-identical.
# 2. A training run: after the freeze no gradient all-reduce or reduce-scatter, and the
#    compressed bytes (all-to-all of sign bits, all-gathers of sign bits and scales, through
#    zt_comm) equal the formula per step, plus zero1/zero2's parameter all-gather (and, at
#    the first compressed step, the one-time all-gathers of m and v); the optimizer memory
#    (estimated and measured) is m, v (shards under zero1/zero2), the error buffers and
#    zero1/zero2's masks; the refusals.
# 3. Pipelines: untied Llama at pp 2 x dp 2 (each pipeline rank steps its stages' units, the
#    exchange over its stage's data ranks) bit-identical to dp 2 under ddp and zero1; GPT-2
#    (tied root on both end ranks) at pp 2 x dp 2 zero1 resumed in the compressed stage
#    bit-exact, and a resume on another mesh restarts the errors with one line.
. "$(dirname "$0")/common.sh"
VPY=${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python
"$VPY" -c "import numpy" 2>/dev/null || VPY=${PYTHON3:-/usr/bin/python3}
"$VPY" -c "import numpy" 2>/dev/null || skip "python3 with numpy needed for the replay"
TEST="$ZT_BUILDDIR/tests/mpi/onebit_test"
[ -x "$TEST" ] || skip "$TEST not built"

for run in "1 ddp flat 1" "2 ddp flat 1" "4 ddp flat 1" "2 zero1 flat 1" "4 zero1 per_param 1" \
    "2 zero2 per_param 2" "4 zero2 flat 4"; do
    # shellcheck disable=SC2086
    set -- $run
    d="$ZT_TMP/replay-$1-$2-$3-$4"
    mkdir -p "$d"
    "$ZT_MPIRUN" "$1" "$TEST" "$d" 8 3 6 "$2" "$3" "$4" > "$d.log" 2>&1 || { cat "$d.log"; fail "onebit_test: $run"; }
    "$VPY" "$ZT_SRCDIR/tests/reference/onebit_replay.py" "$d" "$1" 8 3 || fail "1-bit Adam ($run) differs from DeepSpeed's replay"
    echo "ok: $1 ranks, $2, $3, $4 micro-steps: the replay's parameters; resumed at step 6, bit-identical"
done

make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=6 checkpoint.save_at_end=false optim.type=onebit_adam optim.freeze_step=2"
for run in "2 ddp" "3 ddp" "2 zero1" "3 zero2"; do
    # shellcheck disable=SC2086
    set -- $run
    # shellcheck disable=SC2086
    run_ztrain "$1" $common parallel.strategy="$2" train.output_dir="acc-$1-$2" >/dev/null
    assert_contains "$ZT_OUT" "optim.type = onebit_adam: Adam without bias correction for 2 steps"
    "$VPY" - "acc-$1-$2/metrics.jsonl" "$1" 2 "$2" <<'PY' || fail "1-bit Adam's bytes ($run) differ from the formula"
import json, math, sys
# tiny.cfg's GPT-2: V 257, C 32, context 32, 2 blocks; every tensor exchanged on its own
V, C, T, L = 257, 32, 32, 2
block = [C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C]
sizes = [V * C, T * C] + block * L + [C, C]
units = [V * C + T * C + 2 * C] + [sum(block)] * L      # the root unit holds wte, wpe, ln_f
path, n, freeze, zero = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] != "ddp"
q = n * (n * 8 // math.gcd(n, 8))
B = sum((s + q - 1) // q * q // n // 8 for s in sizes)     # sign bytes of one rank's chunks
fp32 = 4 * sum(sizes)
# zero1/zero2 (flat layout): a unit is padded to a multiple of n; rank 0 owns P / n of it,
# and the parameters are all-gathered (fp32) after every optimizer step
P = [(u + n - 1) // n * n for u in units]
gather = 4 * sum(P) if zero else 0
onebit = {"all_reduce": 0, "reduce_scatter": 0, "all_to_all": n * B,
          "all_gather": n * B + 2 * 4 * n * len(sizes) + gather}
warm = {"all_reduce": 0 if zero else fp32, "reduce_scatter": gather, "all_to_all": 0, "all_gather": gather}
recs = [json.loads(l) for l in open(path)]
steps = [r for r in recs if "loss" in r and "comm" in r]
bad = []
# optimizer memory: m and v (rank 0's shards under zero), the error feedback (worker: padded
# size, server: its chunk) and under zero the masks (a bit an element)
mv = 8 * sum(p // n for p in P) if zero else 8 * sum(sizes)
opt = mv + sum(4 * ((s + q - 1) // q * q) * (n + 1) // n + (-(-s // 8) if zero else 0) for s in sizes)
for key, rec in (("memory_estimate", recs[0]), ("memory_measured", recs[-1])):
    if rec.get(key, {}).get("optimizer") != opt:
        bad.append(f"{key} optimizer {rec.get(key, {}).get('optimizer')} bytes, formula {opt}")
for r in steps:
    k = r["step"]
    for kind in onebit:
        w = warm[kind] if k <= freeze else onebit[kind]
        if kind == "all_gather" and k == freeze + 1:
            w += 2 * gather     # zero: m and v gathered whole once, at the first exchange
        got = r["comm"][kind]["bytes"]
        if got != w:
            bad.append(f"step {k}: {kind} {got} bytes, formula {w}")
print("\n".join(bad) or f"{n} ranks, {sys.argv[4]}: after the freeze all-to-all {n * B} + all-gather "
      f"{onebit['all_gather']} bytes a step ({(2 * n * B + 8 * n * len(sizes)) / fp32:.4f} of the fp32 gradients' "
      f"{fp32}" + (f", beside the parameter all-gather's {gather})" if zero else ")"))
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
    # the train loop under zero1 with gradient accumulation trains as ddp does (both sum a
    # rank's micro-steps before one reduction; zero2 reduces each micro-step in the warm-up,
    # another fp32 rounding that the signs of the compressed stage need not keep: the
    # replay above checks it with exact gradients)
    for st in ddp zero1; do
        # shellcheck disable=SC2086
        run_ztrain 2 $common train.gradient_accumulation_steps=2 train.max_steps=12 parallel.strategy=$st \
            train.output_dir="acc2-$st" >/dev/null
    done
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" acc2-ddp acc2-zero1 || fail "1-bit Adam under zero1 differs from ddp"
    echo "ok: zero1 as ddp with gradient accumulation"
    # pipelines: a pipeline rank steps its stages' units only, and their compressed exchange
    # runs over its stage's data ranks, the same ranks and the same gradients as at dp 2
    # without a pipeline: untied Llama (no unit on two stages) at pp 2 x dp 2 is bit-identical
    # to dp 2 with the same accumulation, under ddp and zero1. (A tied root's gradient is the
    # sum of the two ends' parts, another fp32 rounding of it, and rounding-level differences
    # do not stay small in the compressed stage: an element of near-zero variance, such as
    # GPT-2's key bias, moves by lr x scale / sqrt(v) in the sign of its rounding noise.)
    llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
      model.intermediate_size=48 model.tie_word_embeddings=false model.vocab_size=260"
    for st in ddp zero1; do
        # shellcheck disable=SC2086
        run_ztrain 2 $common $llama train.gradient_accumulation_steps=2 train.max_steps=12 parallel.strategy=$st \
            train.output_dir="l-dp2-$st" >/dev/null
        # shellcheck disable=SC2086
        run_ztrain 4 $common $llama train.gradient_accumulation_steps=2 train.max_steps=12 parallel.strategy=$st \
            parallel.pipeline_parallel_size=2 train.output_dir="l-pp2dp2-$st" >/dev/null
        assert_contains "$ZT_OUT" "mesh tp 1 x sp 1 x dp 2 x pp 2"
        "$PY" "$CHECK" exact "l-dp2-$st" "l-pp2dp2-$st" || fail "1-bit Adam ($st) at pp 2 x dp 2 differs from dp 2"
    done
    echo "ok: pp 2 x dp 2 (ddp, zero1) bit-identical to dp 2"
    # each rank saves its stages' error feedback (GPT-2's tied root on both end ranks) and a
    # resume in the compressed stage is bit-exact
    resume_exact 4 obpp parallel.pipeline_parallel_size=2 parallel.strategy=zero1 train.gradient_accumulation_steps=2
    "$PY" "$CHECK" exact obpp-full obpp-split || fail "1-bit Adam at pp 2 x dp 2: the resumed run differs"
    # on another mesh of the same world size the errors restart from zero, said once
    # shellcheck disable=SC2086
    run_ztrain 4 $common train.max_steps=12 parallel.strategy=zero1 checkpoint.resume=obpp-split/ckpt-00000010.h5 \
        train.output_dir=obpp-dp4 >/dev/null
    assert_contains "$ZT_OUT" "1-bit Adam: error feedback not restored (obpp-split/onebit-00000010.h5: saved at pipeline_parallel_size 2, not 1)"
    echo "ok: pp 2 x dp 2 resumed in the compressed stage, bit-exact"
    # at another world size the errors cannot be restored: they restart from zero, said once
    # shellcheck disable=SC2086
    run_ztrain 3 $common train.max_steps=12 checkpoint.resume=ob2-split/ckpt-00000010.h5 train.output_dir=ob3 >/dev/null
    assert_contains "$ZT_OUT" "1-bit Adam: error feedback not restored (ob2-split/onebit-00000010.h5: saved at 2 ranks, not 3)"
else
    echo "h5py missing: the train loop's resume checks skipped"
fi

# refusals, one line each on every rank
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam runs with parallel.strategy = ddp, zero1 or zero2, not zero3" $common \
    parallel.strategy=zero3
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam runs with parallel.strategy = ddp, zero1 or zero2, not hybrid_shard_zero2" \
    $common parallel.strategy=hybrid_shard_zero2
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam needs parallel.tensor_parallel_size = 1" $common \
    parallel.tensor_parallel_size=2
# shellcheck disable=SC2086
expect_fail_with 2 "optim.type = onebit_adam does not run with parallel.offload_optimizer = cpu" $common \
    parallel.offload_optimizer=cpu
echo "PASS: onebit"
