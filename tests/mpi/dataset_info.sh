#!/bin/sh
# dataset_info.sh — data.dataset: LLaMA-Factory's dataset_info.json entries in the trainer.
# On 2 ranks an entry that maps alpaca's columns (system and history included) trains,
# evaluates on a directory entry (data.eval_dataset), and its SFT file holds the samples
# data.format = alpaca makes of the same file (whose fixed names are that mapping): the
# two runs train alike (1e-5). A directory is one dataset: data.max_samples counts over
# its files together, and num_samples draws from them, the evaluation's after the training's
# as in LLaMA-Factory (its fixture's samples). A rerun reuses the caches; what
# ztrain cannot serve fails on every rank with the file, the entry and the field;
# data.dataset and data.train_files are exclusive. A "ranking": true entry becomes, on 2 ranks,
# LLaMA-Factory's pairwise samples, which the trainer refuses (no preference loss yet), as it
# refuses data.ranking. tests/unit/test_sft.c checks every mapping's samples against LLaMA-Factory.
. "$(dirname "$0")/common.sh"
need_h5py
cd "$ZT_TMP" || fail "cd"
SF="$ZT_SRCDIR/tests/reference/sft"
cp -r "$SF/dataset_info" data || fail "cp"
rm -f data/cases.json
json="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=[] data.val_files=[] model.arch=llama model.n_layer=1
  model.n_head=2 model.n_kv_head=1 model.n_embd=16 model.intermediate_size=32 model.vocab_size=3504 model.block_size=128 data.seq_len=127 data.tokenizer=$SF/tok/qwen
  data.template=qwen data.cutoff_len=128 train.max_steps=3 train.eval_steps=3 train.eval_batches=1
  train.per_device_train_batch_size=1 train.logging_steps=1 train.sample_tokens=0 checkpoint.save_hf=false
  log.plot=false"
# shellcheck disable=SC2086
run_ztrain 2 $json data.dataset=plain_mapped data.eval_dataset=shards train.output_dir=info >/dev/null
assert_contains "$ZT_OUT" "dataset plain_mapped (data/plain.jsonl) -> data/plain.jsonl."
assert_contains "$ZT_OUT" "3 records, 3 samples"
assert_contains "$ZT_OUT" "dataset shards (data/shards) -> data/shards."
assert_contains "$ZT_OUT" "6 records, 6 samples"
assert_contains "$ZT_OUT" "validation loss"
set -- data/plain.jsonl.*.sft.h5
[ $# -eq 1 ] && [ -f "$1" ] || fail "not one cache beside data/plain.jsonl: $*"
info=$1
# the same file through data.format = alpaca, whose fixed names are plain_mapped's columns
mkdir -p files && cp data/plain.jsonl data/shards/*.json* files/ || fail "cp"
# shellcheck disable=SC2086
run_ztrain 2 $json data.format=alpaca data.train_files=files/plain.jsonl \
    data.val_files=files/a.json,files/b.jsonl,files/c.jsonl train.output_dir=files-run >/dev/null
set -- files/plain.jsonl.*.sft.h5
"$PY" - "$info" "$1" <<'PYEOF' || fail "data.dataset's samples differ from data.train_files' for the same mapping"
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
ok = all(a[k].shape == b[k].shape and (a[k][:] == b[k][:]).all() for k in ("input_ids", "labels", "sample_offsets"))
print("dataset_info vs train_files:", a["sample_offsets"].shape[0] - 1, "samples", "equal" if ok else "DIFFERENT")
sys.exit(not ok)
PYEOF
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" files-run info || fail "data.dataset trained otherwise than data.train_files"
# shellcheck disable=SC2086
run_ztrain 1 $json data.dataset=plain_mapped data.eval_dataset=shards train.output_dir=info2 >/dev/null
assert_contains "$ZT_OUT" "dataset plain_mapped (data/plain.jsonl): cached in $info"
# the mapping names the cache: plain (no system, no history column) is another one
# shellcheck disable=SC2086
run_ztrain 2 $json data.dataset=plain train.output_dir=plain >/dev/null
[ "$(ls data/plain.jsonl.*.sft.h5 | wc -l)" -eq 2 ] || fail "another mapping of the same file did not make a new cache"
# a directory is one dataset: its first 4 records over a.json (2) and b.jsonl (3), on 2 ranks
# shellcheck disable=SC2086
run_ztrain 2 $json data.dataset=shards data.max_samples=4 train.output_dir=ms >/dev/null
assert_contains "$ZT_OUT" "dataset shards (data/shards): the first 4 records (data.max_samples = 4); 2 more not read"
# num_samples: numpy's draws from train.seed over the directory's 6 records (the samples: test_sft)
# shellcheck disable=SC2086
run_ztrain 2 $json data.dataset=sampled_shards train.seed=42 train.output_dir=ns >/dev/null
assert_contains "$ZT_OUT" "dataset sampled_shards (data/shards) -> data/shards."
assert_contains "$ZT_OUT" "5 records, 5 samples"
# the evaluation's draws follow the training's, from one numpy state: its samples are those
# of the training datasets drawn in turn ("sampled, oversampled" in test_sft's fixture)
# shellcheck disable=SC2086
run_ztrain 2 $json data.dataset=sampled data.eval_dataset=oversampled train.seed=42 train.output_dir=ns2 >/dev/null
assert_contains "$ZT_OUT" "dataset oversampled (data/custom.json) -> data/custom.json."
assert_contains "$ZT_OUT" "7 records, 7 samples"
assert_contains "$ZT_OUT" "validation loss"
evalcache=$(sed -n 's/.*dataset oversampled (data\/custom.json) -> \([^:]*\):.*/\1/p' "$ZT_OUT" | head -1)
"$PY" - "$evalcache" "$SF/dataset_info/cases.json" <<'PYEOF' || fail "the evaluation's num_samples draws are not LLaMA-Factory's"
import json, sys, h5py
f = h5py.File(sys.argv[1], "r")
case = next(c for c in json.load(open(sys.argv[2]))["cases"] if c["dataset"] == "sampled, plain, oversampled")
off, ids, labels = f["sample_offsets"][:], f["input_ids"][:], f["labels"][:]
got = [(ids[a:b].tolist(), labels[a:b].tolist()) for a, b in zip(off[:-1], off[1:])]
want = list(zip(case["input_ids"], case["labels"]))[-7:]  # oversampled's, after sampled's draws
print("evaluation samples:", len(got), "equal" if got == want else "DIFFERENT")
sys.exit(got != want)
PYEOF
# shellcheck disable=SC2086
run_ztrain 1 $json data.dataset=oversampled train.seed=42 train.output_dir=ns3 >/dev/null
[ "$(ls data/custom.json.*.sft.h5 | wc -l)" -eq 2 ] || fail "the draws before a dataset's did not name its cache"
for np in 1 2; do
    # shellcheck disable=SC2086
    expect_fail_with $np "data/dataset_info.json: ranked: columns.chosen: not mapped: a ranking dataset's pairs" \
        $json data.dataset="plain, ranked" train.output_dir=bad-rank$np
    # shellcheck disable=SC2086
    expect_fail_with $np "data/dataset_info.json: plian: no such dataset (did you mean 'plain'?)" $json \
        data.dataset=plain data.eval_dataset=plian train.output_dir=bad-name$np
done
# shellcheck disable=SC2086
expect_fail_with 2 "data/dataset_info.json: hub: hf_hub_url: ztrain reads local files only" $json data.dataset=hub \
    train.output_dir=bad-hub
# shellcheck disable=SC2086
expect_fail_with 2 "data.dataset and data.train_files are exclusive" $json data.dataset=plain \
    data.train_files=files/plain.jsonl train.output_dir=bad-both
# preference pairs ("ranking": true): made by the ranks into a pairs file (LLaMA-Factory's pairwise
# samples, sample 2i chosen and 2i + 1 rejected: each rank's share is whole records), which the
# trainer then refuses on every rank, as it refuses data.ranking: no preference loss yet
cp -r "$SF/pairwise" pairs && rm -f pairs/cases.json || fail "cp"
# shellcheck disable=SC2086
expect_fail_with 2 "preference pairs need train.stage = dpo" $json data.dataset_dir=pairs \
    data.dataset=sharegpt_pairs data.template=qwen3_nothink data.cutoff_len=40 train.output_dir=bad-pairs
set -- pairs/sharegpt_pairs.jsonl.*.sft.h5
[ $# -eq 1 ] && [ -f "$1" ] || fail "no pairs file beside pairs/sharegpt_pairs.jsonl: $*"
"$PY" "$ZT_SRCDIR/tests/mpi/check_pairs.py" "$1" "$SF/pairwise/cases.json" sharegpt_pairs qwen3_nothink 40 ||
    fail "the ranks' pairs file is not LLaMA-Factory's pairs"
# shellcheck disable=SC2086
expect_fail_with 2 "data.ranking: preference pairs need train.stage = dpo" $json \
    data.format=sharegpt data.train_files=pairs/sharegpt_pairs.jsonl data.ranking=true train.output_dir=bad-ranking
# ... and train.stage = dpo trains on it, pair by pair and shuffled whole: LoRA's policy starts as
# its reference (B = 0), so sigmoid DPO's first loss is ln 2
# shellcheck disable=SC2086
run_ztrain 2 $json data.dataset_dir=pairs data.dataset=sharegpt_pairs data.template=qwen3_nothink data.cutoff_len=40 \
    data.seq_len=40 train.stage=dpo train.finetuning_type=lora train.eval_steps=0 train.output_dir=dpo-pairs >/dev/null
"$PY" - dpo-pairs/metrics.jsonl <<'PYEOF' || fail "dpo on the pairs file: the first loss is not ln 2"
import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and '"step"' in l]
sys.exit(not (r and abs(r[0]["loss"] - math.log(2)) < 1e-6 and len(r) == 3))
PYEOF
echo "dataset_info: data.dataset trains on 2 ranks as data.train_files does with the same mapping"
