#!/bin/sh
# reshard.sh — a checkpoint written by one (world size, strategy, layout) resumes
# under another and training continues as if nothing had changed.
#
# Each writer trains 20 steps (cosine schedule) with a checkpoint at step 10; a
# reader with a different world size, strategy or layout resumes from that
# checkpoint into a fresh output_dir and trains to step 20. Steps 11..20 must be
# logged once each (no batch repeated or skipped), and their losses and the
# final parameters must match the uninterrupted single-rank run within the
# equivalence tolerance (1e-5 relative loss, 1e-5 relative L2 of the
# parameters). The global batch is 12 sequences everywhere.
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup


# shellcheck disable=SC2086,SC2046
run_ztrain 1 $common $(batch_args 1) train.output_dir=ref >/dev/null

# write NAME NP [key=value...]: 20 steps, checkpoints at 10 and 20 kept.
write() {
    name=$1
    np=$2
    shift 2
    # shellcheck disable=SC2086,SC2046
    run_ztrain "$np" $common $(batch_args "$np") checkpoint.save_steps=10 checkpoint.keep_last=0 \
        train.output_dir="$name" "$@" >/dev/null
}

# read NAME CKPT NP [key=value...]: resume from CKPT (step 10) into NAME, to step 20.
read_ckpt() {
    name=$1
    ck=$2
    np=$3
    shift 3
    # shellcheck disable=SC2086,SC2046
    run_ztrain "$np" $common $(batch_args "$np") checkpoint.resume="$ck" train.output_dir="$name" "$@" >/dev/null
    assert_contains "$ZT_OUT" "resumed from $ck: step 10,"
    "$PY" "$CHECK" steps "$name" 11 20 || fail "$name: steps after resuming from $ck are not 11..20 once each"
    "$PY" "$CHECK" close ref "$name" 11 || fail "$name: resumed from $ck, diverged from the single-rank run"
}

write w-zero3-4 4 parallel.strategy=zero3
read_ckpt r-ddp-1 w-zero3-4/ckpt-00000010.h5 1 parallel.strategy=ddp

write w-ddp-2 2 parallel.strategy=ddp
read_ckpt r-zero3-3 w-ddp-2/ckpt-00000010.h5 3 parallel.strategy=zero3

write w-zero2-3 3 parallel.strategy=zero2
read_ckpt r-hybrid-4 w-zero2-3/ckpt-00000010.h5 4 parallel.strategy=hybrid_shard parallel.shard_group_size=2

write w-zero1pp-2 2 parallel.strategy=zero1 parallel.shard_layout=per_param
read_ckpt r-sgo-4 w-zero1pp-2/ckpt-00000010.h5 4 parallel.strategy=shard_grad_op parallel.shard_layout=flat

# The writers themselves, steps 1..20, against the reference.
for w in w-zero3-4 w-ddp-2 w-zero2-3 w-zero1pp-2; do
    "$PY" "$CHECK" close ref $w 1 || fail "writer $w diverged from the single-rank run"
done

# Sharded format written by 2 ranks: read at 3 ranks directly, and after
# zt-ckpt consolidate.
write w-sharded-2 2 parallel.strategy=zero3 checkpoint.format=sharded
[ -d w-sharded-2/ckpt-00000010.shards ] || fail "checkpoint.format=sharded wrote no w-sharded-2/ckpt-00000010.shards"
read_ckpt r-from-shards-3 w-sharded-2/ckpt-00000010.shards 3 parallel.strategy=zero2
"$ZT_CKPT" consolidate w-sharded-2/ckpt-00000010.shards w-sharded-2/consolidated-10.h5 >/dev/null ||
    fail "zt-ckpt consolidate w-sharded-2/ckpt-00000010.shards failed"
read_ckpt r-consolidated-3 w-sharded-2/consolidated-10.h5 3 parallel.strategy=zero3 parallel.shard_layout=per_param

# The comparison must be able to fail: resuming with another global batch
# (16 instead of 12) consumes different samples from step 11 on.
# shellcheck disable=SC2086
run_ztrain 2 $common train.per_device_train_batch_size=2 train.gradient_accumulation_steps=4 \
    checkpoint.resume=w-ddp-2/ckpt-00000010.h5 train.output_dir=r-wrong-batch >/dev/null
"$PY" "$CHECK" close ref r-wrong-batch 11 >/dev/null 2>&1 && fail "resume_check.py close accepted a run with another batch"
echo "reshard: every resharded resume matches the single-rank run"
