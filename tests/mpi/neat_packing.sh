#!/bin/sh
# neat_packing.sh — neat-packed SFT rows (/segment_ids: LLaMA-Factory's neat_packing) in
# the trainer. A packed sample attends only to itself and its positions start at 0, so:
#  - every world size and strategy (tensor and sequence parallelism too) trains the same
#    model as one rank with accumulation (1e-5, compare_runs.py, as equivalence.sh);
#  - a run on neat-packed rows trains the same model as a run on the same samples one per
#    row, in the same global batches (rows of K samples against batches of K times the
#    rows), for llama (rope, GQA) and gpt2 (learned positions); the same rows without
#    /segment_ids (plain packing: attention crosses samples) do not, so the check bites;
#  - data.format = alpaca with data.neat_packing = true writes the cache zt-prep-data
#    --neat-packing writes (with /segment_ids), a cache apart from data.packing's, and
#    trains the same at 1 and 2 ranks;
#  - a broken /segment_ids fails on every rank with one line.
. "$(dirname "$0")/common.sh"
need_h5py
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
CMP="$ZT_SRCDIR/tests/mpi/compare_runs.py"
cd "$ZT_TMP" || fail "cd"
# 40 rows of 25 tokens (seq_len 24), 3 samples each; apart.h5: the 120 samples in order
"$PY" "$HFPY" sft-neat neat.h5 apart.h5 67 40 3 24 || fail "cannot make the SFT files"
"$PY" "$HFPY" sft-neat plain.h5 apart2.h5 67 40 3 24 plain || fail "cannot make the SFT files"
common="$ZT_SRCDIR/inputs/tiny.cfg model.vocab_size=67 model.block_size=32 data.seq_len=24 data.shuffle=false
  data.val_files=[] train.max_steps=8 train.logging_steps=1 train.sample_tokens=0 checkpoint.save_hf=false
  log.plot=false optim.learning_rate=3e-3"
llama="$common model.arch=llama model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=32
  model.intermediate_size=48"
gpt2="$common model.arch=gpt2 model.n_layer=2 model.n_head=2 model.n_embd=32"

# ---- every world size = one rank with accumulation (4 rows a step) ----
# shellcheck disable=SC2086
run_ztrain 1 $llama data.train_files=neat.h5 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=4 train.output_dir=ref >/dev/null
assert_contains "$ZT_OUT" "neat-packed rows"
runs=""
for cfg in "2 ddp 1 2" "2 zero3 2 1" "4 zero2 1 1"; do
    set -- $cfg
    # shellcheck disable=SC2086
    run_ztrain "$1" $llama data.train_files=neat.h5 parallel.strategy=$2 train.per_device_train_batch_size=$3 \
        train.gradient_accumulation_steps=$4 train.output_dir="np$1-$2" >/dev/null
    runs="$runs np$1-$2"
done
# shellcheck disable=SC2086
"$PY" "$CMP" ref $runs || fail "a neat-packed run diverged from one rank with accumulation"
# tensor parallelism (the vocabulary must split: 68): each rank's heads see the same segments
# shellcheck disable=SC2086
run_ztrain 1 $llama model.vocab_size=68 data.train_files=neat.h5 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=4 train.output_dir=ref68 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $llama model.vocab_size=68 data.train_files=neat.h5 parallel.tensor_parallel_size=2 \
    train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 train.output_dir=tp2 >/dev/null
"$PY" "$CMP" ref68 tp2 || fail "a neat-packed run at tp 2 diverged from one rank"
# sequence parallelism: each rank runs half of every row; attention needs the whole rows'
# segments, rope and the learned positions this half's positions
# shellcheck disable=SC2086
run_ztrain 2 $llama data.train_files=neat.h5 parallel.sequence_parallel_size=2 \
    train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 train.output_dir=sp2 >/dev/null
# ring attention: the K|V blocks of other ranks' chunks are masked by the whole rows' ids
# shellcheck disable=SC2086
run_ztrain 2 $llama data.train_files=neat.h5 parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
    train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 train.output_dir=ring2 >/dev/null
"$PY" "$CMP" ref sp2 ring2 || fail "a neat-packed run at sp 2 (Ulysses or ring) diverged from one rank"

# ---- neat-packed rows = the same samples one per row: 4 rows of 3 = 12 samples a step ----
# shellcheck disable=SC2086
run_ztrain 1 $llama data.train_files=apart.h5 train.per_device_train_batch_size=3 \
    train.gradient_accumulation_steps=4 train.output_dir=apart >/dev/null
"$PY" "$CMP" ref apart || fail "llama: neat-packed rows train otherwise than their samples one by one"
# shellcheck disable=SC2086
run_ztrain 2 $llama data.train_files=plain.h5 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=2 train.output_dir=plain >/dev/null
"$PY" "$CMP" ref plain >cmp.out && fail "packing without /segment_ids matched neat packing: the check has no teeth"
cat cmp.out
# gpt2: the learned positions restart per sample too (2 ranks against one by one on 1)
# shellcheck disable=SC2086
run_ztrain 2 $gpt2 data.train_files=neat.h5 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=2 train.output_dir=g-neat >/dev/null
# shellcheck disable=SC2086
run_ztrain 1 $gpt2 data.train_files=apart.h5 train.per_device_train_batch_size=3 \
    train.gradient_accumulation_steps=4 train.output_dir=g-apart >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $gpt2 data.train_files=neat.h5 parallel.sequence_parallel_size=2 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=4 train.output_dir=g-sp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $gpt2 data.train_files=neat.h5 parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
    train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 train.output_dir=g-ring2 >/dev/null
"$PY" "$CMP" g-apart g-neat g-sp2 g-ring2 || fail "gpt2: neat-packed rows train otherwise than their samples one by one"

# ---- data.neat_packing in the trainer: LLaMA-Factory's preprocessing, cached ----
SF="$ZT_SRCDIR/tests/reference/sft"
cp "$SF/packing.jsonl" train.jsonl || fail "cp"
json="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_layer=1 model.n_head=2 model.n_kv_head=1 model.n_embd=16
  model.intermediate_size=32 model.vocab_size=3504 model.block_size=64 data.seq_len=63 data.tokenizer=$SF/tok/qwen
  data.template=qwen3_nothink data.cutoff_len=64 data.format=alpaca data.train_files=train.jsonl data.val_files=train.jsonl
  train.max_steps=4 train.eval_steps=4 train.eval_batches=1 train.logging_steps=1 train.sample_tokens=0
  checkpoint.save_hf=false log.plot=false"
# shellcheck disable=SC2086
run_ztrain 2 $json data.neat_packing=true train.per_device_train_batch_size=2 train.output_dir=j2 >/dev/null
assert_contains "$ZT_OUT" "neat-packed rows"
assert_contains "$ZT_OUT" "validation loss"
set -- train.jsonl.*.sft.h5
[ $# -eq 1 ] && [ -f "$1" ] || fail "no single cache file beside train.jsonl: $*"
cache=$1
"$ZT_PREP_DATA" --tokenizer "$SF/tok/qwen" --format alpaca --template qwen3_nothink --cutoff-len 64 --neat-packing \
    -o prep.h5 train.jsonl >/dev/null || fail "zt-prep-data --neat-packing"
"$PY" - "$cache" prep.h5 <<'PYEOF' || fail "the trainer's neat-packing cache differs from zt-prep-data's file"
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
keys = ("input_ids", "labels", "sample_offsets", "segment_ids")
sys.exit(not all(k in a and k in b and a[k].shape == b[k].shape and (a[k][:] == b[k][:]).all() for k in keys))
PYEOF
# shellcheck disable=SC2086
run_ztrain 1 $json data.neat_packing=true train.per_device_train_batch_size=2 train.gradient_accumulation_steps=2 \
    train.output_dir=j1 >/dev/null
assert_contains "$ZT_OUT" "cached in $cache"
"$PY" "$CMP" j1 j2 || fail "data.neat_packing at 2 ranks diverged from one rank"
# shellcheck disable=SC2086
run_ztrain 1 $json data.packing=true train.per_device_train_batch_size=2 train.output_dir=j3 >/dev/null
[ "$(ls train.jsonl.*.sft.h5 | wc -l)" -eq 2 ] || fail "data.packing and data.neat_packing share a cache"
"$PY" - train.jsonl.*.sft.h5 <<'PYEOF' || fail "the caches do not differ by /segment_ids alone"
import sys, h5py
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
if "segment_ids" in a: a, b = b, a
ok = "segment_ids" not in a and "segment_ids" in b
ok = ok and all((a[k][:] == b[k][:]).all() for k in ("input_ids", "labels", "sample_offsets"))
most = int(b["segment_ids"][:].max())
print("packing and neat packing: the same rows,", most, "samples in the fullest row")
sys.exit(not (ok and most >= 2))
PYEOF

# ---- broken /segment_ids: one line, every rank ----
"$PY" "$HFPY" sft-neat bad-neg.h5 x.h5 67 8 3 24 negative || fail "hf_dir.py"
# shellcheck disable=SC2086
expect_fail_with 2 "segment id -3 at position 2" $llama data.train_files=bad-neg.h5 train.output_dir=bad1
"$PY" "$HFPY" sft-neat bad-len.h5 x.h5 67 8 3 24 short || fail "hf_dir.py"
# shellcheck disable=SC2086
expect_fail_with 2 "/segment_ids has 199 elements, /input_ids 200" $llama data.train_files=bad-len.h5 \
    train.output_dir=bad2
echo "neat_packing: packed samples train as one by one, the same at every world size"
