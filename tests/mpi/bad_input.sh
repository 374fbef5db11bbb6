#!/bin/sh
# bad_input.sh — bad config, data and checkpoint input: one clear line naming the
# file, key or tensor, a non-zero exit on every rank, and no hang (zt_mpirun.sh's
# timeout turns a hang into a failure). Run on 2 ranks so "every rank" matters.
. "$(dirname "$0")/common.sh"
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
TINY="$ZT_SRCDIR/inputs/tiny.cfg"
ok="data.train_files=data/tiny-train.h5 data.val_files=data/tiny-val.h5 train.sample_tokens=0"

# config
printf 'model = { n_layer = 2 \n' >broken.cfg
expect_fail_with 2 "broken.cfg:2: syntax error" broken.cfg
printf 'optim = { learnin_rate = 1e-3; };\n' >unknown.cfg
expect_fail_with 2 "did you mean 'optim.learning_rate'" unknown.cfg
printf 'optim = { learning_rate = "fast"; };\n' >type.cfg
expect_fail_with 2 "type.cfg:1: optim.learning_rate" type.cfg
expect_fail_with 2 "train.per_device_train_batch_size" "$TINY" $ok train.per_device_train_batch_size=0
expect_fail_with 2 "parallel.strategy" "$TINY" $ok parallel.strategy=zero4
expect_fail_with 2 "data.seq_len (64) exceeds model.block_size (32)" "$TINY" $ok data.seq_len=64
expect_fail_with 2 "no-such.cfg: cannot open" no-such.cfg
expect_fail_with 2 "unknown option" --frobnicate
expect_fail_with 4 "parallel.shard_group_size (3) must divide" "$TINY" $ok parallel.strategy=hybrid_shard parallel.shard_group_size=3

# data
expect_fail_with 2 "data/missing.h5: cannot open" "$TINY" data.train_files=data/missing.h5
head -c 1500 "$ZT_SRCDIR/tests/reference/fixture.h5" >truncated.h5 2>/dev/null || fail "no fixture"
expect_fail_with 2 "truncated.h5" "$TINY" data.train_files=truncated.h5
# an llm.c .bin whose header promises more tokens than it holds
{
    printf '\210\330\064\001\001\000\000\000\000\001\000\000'   # magic 20240520, version 1, 256 tokens
    head -c 1012 /dev/zero                                               # rest of the 256 x int32 header
    head -c 200 /dev/zero                                                # only 100 of the 256 tokens
} >short.bin
expect_fail_with 2 "short.bin: truncated" "$TINY" data.train_files=short.bin
# token ids beyond the model's vocabulary: declared by the file, or found in it
expect_fail_with 2 "vocab_size attribute 257 > model.vocab_size (200)" "$TINY" $ok model.vocab_size=200
{
    printf '\210\330\064\001\001\000\000\000\144\000\000\000'   # 100 tokens
    head -c 1012 /dev/zero
    i=0; while [ $i -lt 100 ]; do printf '\054\001'; i=$((i + 1)); done  # token id 300
} >bigid.bin
expect_fail_with 2 "token id 300" "$TINY" data.train_files=bigid.bin data.val_files=[]
# an empty dataset
printf 'hi\n' >empty.txt
"$ZT_PREP_DATA" --val-fraction 0 -o empty.h5 empty.txt >/dev/null 2>&1 || fail "zt-prep-data on a tiny file"
expect_fail_with 2 "no samples" "$TINY" data.train_files=empty.h5

# checkpoint: resume from a file that is not a checkpoint / does not exist
expect_fail_with 2 "truncated.h5" "$TINY" $ok checkpoint.resume=truncated.h5
expect_fail_with 2 "nope.h5" "$TINY" $ok model.init_from=nope.h5

# a rank-local data problem (fault injection on rank 1 only) stops every rank
expect_fail_with 2 "fault injection: data error on rank 1 at step 3" "$TINY" $ok fault.rank=1 fault.step=3 fault.kind=data
# a NaN on one rank: abort by default with exit 3, or skip the step when configured
expect_fail_with 2 "non-finite loss or gradient" "$TINY" $ok fault.rank=1 fault.step=2 fault.kind=nan
[ "$ZT_RC" -eq 3 ] || fail "non-finite abort exited $ZT_RC, expected 3"
run_ztrain 2 "$TINY" $ok fault.rank=0 fault.step=2 fault.kind=nan parallel.nonfinite=skip train.output_dir=skip >/dev/null
assert_contains "$ZT_OUT" "step skipped"
echo "bad_input: every case failed cleanly"
