#!/bin/sh
# equivalence.sh — the property everything rests on: every strategy and layout at
# world sizes 1..4 trains the same model as one rank with gradient accumulation.
# Same config, same global batch (12 sequences), 20 steps, fp32: per-step loss within
# 1e-5 relative and final parameters within 1e-5 relative L2 of the reference.
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup


# shellcheck disable=SC2086
run_ztrain 1 $common $(batch_args 1) train.output_dir=ref >/dev/null
runs=""
for np in 1 2 3 4; do
    for st in ddp zero1 zero2 shard_grad_op zero3; do
        for layout in flat per_param; do
            [ "$st" = ddp ] && [ "$layout" = per_param ] && continue
            [ "$np" = 1 ] && [ "$st" != zero3 ] && continue
            out="np${np}-${st}-${layout}"
            # shellcheck disable=SC2086
            run_ztrain "$np" $common $(batch_args "$np") parallel.strategy=$st \
                parallel.shard_layout=$layout train.output_dir="$out" >/dev/null
            runs="$runs $out"
        done
    done
done
# hybrid: 4 ranks = 2 shard groups x 2 replicas
for st in hybrid_shard hybrid_shard_zero2; do
    for layout in flat per_param; do
        out="np4-${st}-${layout}"
        # shellcheck disable=SC2086
        run_ztrain 4 $common $(batch_args 4) parallel.strategy=$st parallel.shard_group_size=2 \
            parallel.shard_layout=$layout train.output_dir="$out" >/dev/null
        runs="$runs $out"
    done
done
# zero3 without resharding after forward, and with gradient checkpointing
# shellcheck disable=SC2086
run_ztrain 3 $common $(batch_args 3) parallel.strategy=zero3 parallel.reshard_after_forward=false \
    train.output_dir=np3-zero3-keep >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 2) parallel.strategy=zero3 train.gradient_checkpointing=true \
    train.output_dir=np2-zero3-recompute >/dev/null
runs="$runs np3-zero3-keep np2-zero3-recompute"

# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $runs || fail "a strategy diverged from the single-rank reference"

# The comparison itself must be able to fail: a different learning rate is caught.
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 2) optim.learning_rate=3.1e-3 train.output_dir=wrong >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref wrong >/dev/null && fail "compare_runs.py accepted a different run"
echo "equivalence: all strategies match the single-rank reference"
