#!/bin/sh
# fp16.sh — train.fp16 (IEEE fp16 working parameters, fp16 gradients, fp32 master
# weights and Adam moments) with loss scaling; parallel.reduce_dtype = fp16. Tiny
# model, global batch 12, 20 steps.
#
# Tolerances, derived from fp16's precision: 11 significant bits, unit roundoff
# u = 2^-11 = 4.9e-4 (bf16's 8 bits give 2^-8; bf16.sh's tolerances scaled by 2^-3
# land in the same place). The loss scale is a power of two, so scaling and
# unscaling are exact and add nothing; what differs between runs is rounding:
# 1. fp16 vs fp32 (one rank): every working weight and every gradient is rounded
#    to fp16 (relative error <= u/2 each). Adam divides each gradient by its own
#    running RMS, so a relative gradient error of ~u becomes ~u of each update,
#    independently per element and step, adding up like a random walk over the
#    20 steps, and early updates are a sizeable part of the small weights: the
#    parameters may differ by ~u relative, the loss by less. Bound: 5e-4 (~u) on
#    the loss, 1.2e-3 (~2.5u) on the parameters (measured 3.5e-5 and 2.4e-4). It
#    must not be the fp32 run (the default 1e-5 fails).
# 2. Strategies, layouts and world sizes 1-3 with accumulation vs the fp16 single-rank run:
#    - reduce_dtype = fp32: fp32 summation order (equivalence.sh) plus the rare value
#      that lands on the other side of an fp16 rounding boundary (the gradients the
#      optimizer sees, the working copy): tolerance 5e-6 / 3e-5, as for bf16
#      (measured at most 4.4e-7 loss, 3.6e-6 params).
#    - reduce_dtype = fp16: every communicated gradient is rounded to fp16 per
#      summation hop: the same random walk of ~u per update as in 1., but only for
#      the differences between the hops' roundings. Tolerance 0.5u = 2.5e-4 on the
#      loss and 2.5u = 1.2e-3 on the parameters (bf16.sh's 1e-3 / 5e-3 at 2^-9,
#      times 2^-2); measured at most 9.6e-6 and 2.0e-4. A 1% larger learning rate
#      must fail it, and the fp16-reduced runs must fail the fp32-reduction
#      tolerance (the fp16 reduction is really in effect).
# 3. Overflow: train.initial_scale_power = 22 on data whose every step is the same
#    batch (12 samples, no shuffle): the first steps overflow and are skipped on
#    every rank, the scale halving each time, until it fits. Exact property: the
#    final state equals, bit for bit, a run that starts at the scale that first fit
#    and has that many fewer steps (the schedule follows optimizer steps, so the
#    learning rates line up too). The skip sequence is the same at 1 and 2 ranks.
# 4. Growth: with train.loss_scale_window = 2 the scale doubles after every second
#    good step; every record's scale is replayed against the rules.
# 5. fault.kind = nan on rank 1 at step 4: every rank (per-rank logs) skips step 4
#    and halves the scale, still checkpoints at step 4, continues and exits 0.
# 6. Resume of an fp16 run with scale changes on both sides of the checkpoint is
#    bit-identical to the uninterrupted run (scale and good-step counter restored).
# 7. Bad config: one-line errors; an overflow below train.min_loss_scale stops
#    every rank with exit 3.
# 8. Accounting: bytes per element as bf16 (check_accounting.py --fp16).
. "$(dirname "$0")/common.sh"
need_h5py
CMP="$ZT_SRCDIR/tests/mpi/compare_runs.py"
tiny_comparison_setup
TOL32="--loss-tol 5e-6 --param-tol 3e-5"
TOL16="--loss-tol 2.5e-4 --param-tol 1.2e-3"

# fp16run NP OUT key=value... : an fp16 run with the global batch of 12
fp16run() {
    np=$1 out=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" $common $(batch_args "$np") train.fp16=true train.output_dir="$out" "$@" >/dev/null
}

# scales RUN: "step scale skipped" per metrics record of a step
scales() {
    "$PY" -c '
import json, sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    if "step" in r and "loss_scale" in r:
        print(r["step"], r["loss_scale"], r.get("reason", "-"))' "$1"
}

# --- 1. fp16 vs fp32 ---------------------------------------------------------
# shellcheck disable=SC2086
run_ztrain 1 $common $(batch_args 1) train.output_dir=ref32 >/dev/null
fp16run 1 ref
"$PY" "$CMP" ref32 ref --loss-tol 5e-4 --param-tol 1.2e-3 || fail "fp16 does not train approximately the fp32 model"
"$PY" "$CMP" ref32 ref >/dev/null && fail "train.fp16=true gave the fp32 result: fp16 is not in effect"
[ "$(scales ref | grep -vc ' 65536 -$')" = 0 ] || fail "fp16 with the defaults did not run every step at loss scale 2^16"

# --- 2. strategies, layouts, world sizes vs the fp16 single-rank reference ---
runs=""
for c in "2 zero3 per_param" "3 ddp flat" "3 zero2 flat"; do
    # shellcheck disable=SC2086
    set -- $c
    fp16run "$1" "r32-np$1-$2-$3" parallel.strategy="$2" parallel.shard_layout="$3"
    runs="$runs r32-np$1-$2-$3"
done
# shellcheck disable=SC2086
"$PY" "$CMP" ref $runs $TOL32 || fail "fp16 with reduce_dtype=fp32: a strategy diverged from the single-rank reference"
runs=""
for c in "2 ddp flat" "3 zero2 per_param" "2 zero3 flat" "3 zero3 per_param"; do
    # shellcheck disable=SC2086
    set -- $c
    fp16run "$1" "r16-np$1-$2-$3" parallel.reduce_dtype=fp16 parallel.strategy="$2" parallel.shard_layout="$3"
    runs="$runs r16-np$1-$2-$3"
done
# shellcheck disable=SC2086
"$PY" "$CMP" ref $runs $TOL16 || fail "fp16 with reduce_dtype=fp16: a strategy diverged from the single-rank reference"
# the runs together: a single run's fp16-reduction error can fall inside the fp32 tolerance
# shellcheck disable=SC2086
"$PY" "$CMP" ref $runs $TOL32 >/dev/null &&
    fail "reduce_dtype=fp16 matched to the fp32-reduction tolerance: gradients are not reduced in fp16"
fp16run 2 wrong parallel.reduce_dtype=fp16 parallel.strategy=zero3 optim.learning_rate=3.03e-3
# shellcheck disable=SC2086
"$PY" "$CMP" ref wrong $TOL16 >/dev/null && fail "the fp16 tolerance accepted a 1% different learning rate"

# --- 3. overflow: skipped steps, halving, then the run that started where it fit ---
head -c 193 data/tiny.txt >one.txt
"$ZT_PREP_DATA" --val-fraction 0 -o data/one.h5 one.txt >/dev/null 2>&1 || fail "zt-prep-data on one.txt"
same="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/one.h5 data.shuffle=false data.val_files=[]
  train.eval_steps=0 train.sample_tokens=0 optim.warmup_steps=3 optim.learning_rate=3e-3
  optim.lr_scheduler_type=constant_with_warmup train.fp16=true parallel.reduce_dtype=fp16 parallel.strategy=zero2"
# shellcheck disable=SC2086
run_ztrain 2 $same $(batch_args 2) train.initial_scale_power=22 train.max_steps=20 train.output_dir=ovf >/dev/null
scales ovf >ovf.scales
k=$(awk '$3 != "overflow" { exit } { k = NR } END { print k + 0 }' ovf.scales)
[ "$k" -ge 2 ] || fail "initial_scale_power=22 overflowed on $k leading steps, expected several"
[ "$(grep -c overflow ovf.scales)" = "$k" ] || fail "overflows after the scale fitted: $(cat ovf.scales)"
i=1
while [ $i -le "$k" ]; do
    want=$((1 << (22 - i + 1)))
    sed -n "${i}p" ovf.scales | grep -qx "$i $want overflow" || fail "step $i: expected a skip at scale $want: $(sed -n "${i}p" ovf.scales)"
    assert_contains "$ZT_OUT" "step $i: gradient overflow, loss scale $want -> $((want / 2))"
    i=$((i + 1))
done
fit=$((22 - k))
sed -n "$((k + 1)),\$p" ovf.scales | grep -vqx "[0-9]* $((1 << fit)) -" && fail "scale after the overflows is not 2^$fit"
# shellcheck disable=SC2086
run_ztrain 2 $same $(batch_args 2) train.initial_scale_power=$fit train.max_steps=$((20 - k)) train.output_dir=fit >/dev/null
grep -q overflow fit/metrics.jsonl && fail "the run started at 2^$fit overflowed"
"$PY" - ovf fit <<'EOF' || fail "the overflowing run is not the run started at the scale that fitted, shifted"
import glob, sys, h5py, numpy as np
def state(d):
    h = h5py.File(sorted(glob.glob(d + "/ckpt-*.h5"))[-1], "r")
    t = {g + "/" + k: h[g][k][...] for g in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq") for k in h[g]}
    return t, int(h["optimizer"].attrs["step"]), float(h["optimizer"].attrs["loss_scale"])
(a, ta, sa), (b, tb, sb) = state(sys.argv[1]), state(sys.argv[2])
same = set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)
print(f"overflow run vs shifted run: Adam t {ta} / {tb}, scale {sa:g} / {sb:g}, tensors bitwise equal: {same}")
sys.exit(0 if same and ta == tb and sa == sb else 1)
EOF
# shellcheck disable=SC2086
run_ztrain 1 $same $(batch_args 1) train.initial_scale_power=22 train.max_steps=$((k + 1)) train.output_dir=ovf1 >/dev/null
head -n $((k + 1)) ovf.scales >ovf.head
scales ovf1 | cmp -s - ovf.head || fail "the skip sequence at 1 rank differs from 2 ranks"

# --- 4. growth: the scale doubles after every loss_scale_window good steps --------
fp16run 2 grow train.initial_scale_power=12 train.loss_scale_window=2 parallel.strategy=zero3 parallel.reduce_dtype=fp16
assert_contains "$ZT_OUT" "step 2: 2 steps without overflow, loss scale 4096 -> 8192"
scales grow | "$PY" -c '
import sys
S, good, grown, over = 4096.0, 0, 0, 0
for line in sys.stdin:
    step, scale, reason = line.split()
    if float(scale) != S: sys.exit(f"step {step}: loss scale {scale}, the rules say {S:g}")
    if reason == "overflow": S, good, over = S / 2, 0, over + 1
    else:
        good += 1
        if good == 2: S, good, grown = S * 2, 0, grown + 1
if grown < 5: sys.exit(f"only {grown} doublings in 20 steps with a window of 2")
print(f"growth: {grown} doublings, {over} overflows, every scale as the rules say")' ||
    fail "loss scale growth does not follow train.loss_scale_window"

# --- 5. a NaN on one rank is an overflow for every rank ----------------------------
fp16run 2 nan parallel.strategy=zero3 fault.rank=1 fault.step=4 fault.kind=nan log.all_ranks=true \
    checkpoint.save_steps=4 checkpoint.keep_last=0
[ -f nan/ckpt-00000004.h5 ] || fail "no checkpoint at step 4: a skipped step must still checkpoint on schedule"
for r in 0 1; do
    assert_contains nan/rank-$r.log "step 4: gradient overflow, loss scale 65536 -> 32768"
done
scales nan | sed -n 4,5p | tr '\n' ' ' | grep -qx "4 65536 overflow 5 32768 - " ||
    fail "step 4 was not skipped at 2^16 with 2^15 after it: $(scales nan | sed -n 3,6p | tr '\n' ' ')"

# --- 6. exact resume with the scale moving on both sides of the checkpoint --------
rcommon="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 optim.warmup_steps=3 optim.learning_rate=3e-3 optim.lr_scheduler_type=constant_with_warmup
  train.fp16=true parallel.reduce_dtype=fp16 train.initial_scale_power=19 train.loss_scale_window=4
  parallel.strategy=zero3 parallel.shard_layout=per_param"
# shellcheck disable=SC2086
run_ztrain 2 $rcommon train.max_steps=20 train.output_dir=full >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $rcommon train.max_steps=10 train.output_dir=split >/dev/null
[ "$("$PY" -c 'import h5py; print(h5py.File("split/ckpt-00000010.h5", "r")["optimizer"].attrs["loss_scale_good_steps"])')" -gt 0 ] ||
    fail "the checkpoint at step 10 does not sit mid-window: choose other scale settings"
# shellcheck disable=SC2086
run_ztrain 2 $rcommon train.max_steps=20 checkpoint.resume=auto train.output_dir=split >/dev/null
assert_contains "$ZT_OUT" "resumed fp16 loss scale"
"$PY" "$CHECK" exact full split || fail "fp16: the resumed run differs from the uninterrupted one"
scales full >full.scales
scales split | cmp -s full.scales - || fail "fp16: loss scales or skipped steps differ after resume"
grep -q overflow full.scales || fail "the resume case has no overflow"

# --- 7. bad input ------------------------------------------------------------------
expect_fail_with 2 "train.fp16 and train.bf16 are both true" $common train.fp16=true train.bf16=true
expect_fail_with 2 "parallel.reduce_dtype = fp16 needs train.fp16" $common parallel.reduce_dtype=fp16
expect_fail_with 2 "train.min_loss_scale (1e+06) exceeds the initial loss scale 2^16" $common train.fp16=true \
    train.min_loss_scale=1e6
expect_fail_with 2 "train.loss_scale_window" $common train.fp16=true train.loss_scale_window=0
# shellcheck disable=SC2086
expect_fail_with 2 "halving it would go below train.min_loss_scale (1048576)" $same $(batch_args 2) \
    train.initial_scale_power=22 train.min_loss_scale=1048576 train.output_dir=minscale
[ "$ZT_RC" -eq 3 ] || fail "an overflow at the minimum loss scale exited $ZT_RC, expected 3"
[ "$(grep -c "ztrain: error" "$ZT_OUT")" = 1 ] || fail "the minimum-scale abort did not print exactly one error line"

# --- 8. accounting: fp16 moves and stores what bf16 does ------------------------------
acc="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=3 checkpoint.save_at_end=false train.gradient_accumulation_steps=2
  train.fp16=true parallel.reduce_dtype=fp16"
for c in "2 ddp" "3 zero3"; do
    # shellcheck disable=SC2086
    set -- $c
    # shellcheck disable=SC2086
    run_ztrain "$1" $acc parallel.strategy="$2" train.output_dir="acc-$2" >/dev/null
    "$PY" "$ZT_SRCDIR/tests/mpi/check_accounting.py" "acc-$2" "$2" "$1" 2 --fp16 --reduce-fp16 ||
        fail "fp16 $2 on $1 ranks: accounting differs from theory"
done
echo "fp16: tracks fp32; strategies within the fp16 tolerances; overflow, growth, NaN, resume and limits ok"
