#!/bin/sh
# sft.sh — SFT sample files (/input_ids, /labels, /sample_offsets) in the trainer: the
# loss is the mean over the tokens that carry one in the whole global batch, so every
# world size and accumulation trains the same model (1e-5), and the samples of a step
# are exactly the ones one rank would take; bad SFT files fail on every rank.
# Instruction JSON in the trainer (data.format = alpaca): the ranks write the SFT file
# zt-prep-data writes, as a cache beside the input that a rerun reuses and a change of
# options replaces; bad JSON fails on every rank with the file, record and key. Each rank
# tokenizes a share of the records: 1, 2 and 3 ranks write the same content (h5dump), with
# packing (groups of 1000 records), neat packing (/segment_ids) and without, and report the
# error one rank meets.
# data.max_samples keeps each file's first records: the first samples of the whole file,
# the same on 1 and 2 ranks and from zt-prep-data --max-samples, a cache of its own per
# value (0 names the cache of a run without it); refused for token files.
. "$(dirname "$0")/common.sh"
need_h5py
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
cd "$ZT_TMP" || fail "cd"
"$PY" "$HFPY" sft sft.h5 67 200 || fail "cannot make the SFT file"
"$PY" "$HFPY" sft val.h5 67 40 || fail "cannot make the SFT file"
llama="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.intermediate_size=48
  model.vocab_size=67 model.block_size=32 data.train_files=sft.h5 data.val_files=val.h5 data.seq_len=24
  train.max_steps=12 train.eval_steps=6 train.eval_batches=2 train.logging_steps=1 train.sample_tokens=0
  checkpoint.save_hf=false log.plot=false optim.learning_rate=3e-3"
# shellcheck disable=SC2086
run_ztrain 1 $llama train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 train.output_dir=ref >/dev/null
runs=""
for cfg in "2 ddp 2 1" "2 zero3 1 2" "4 zero2 1 1" "4 zero3 1 1"; do
    set -- $cfg
    # shellcheck disable=SC2086
    run_ztrain "$1" $llama parallel.strategy=$2 train.per_device_train_batch_size=$3 \
        train.gradient_accumulation_steps=$4 train.output_dir="np$1-$2-$3" >/dev/null
    runs="$runs np$1-$2-$3"
done
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $runs || fail "an SFT run diverged from one rank with accumulation"
# the mean is over loss-bearing tokens: a mean over all positions would weigh the
# padding and the prompts, and differ
"$PY" - ref/metrics.jsonl <<'PYEOF' || fail "the SFT loss is not a mean over the loss-bearing tokens"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
first = next(r for r in recs if r.get("step") == 1 and "loss" in r)
# 67 classes, a fresh model: about ln 67 per loss-bearing token; a mean over every
# position (most are prompt or padding, which add 0) would be far below it
print("step-1 loss", first["loss"], "ln 67 =", math.log(67))
sys.exit(not (abs(first["loss"] - math.log(67)) < 0.3))
PYEOF
assert_contains "$ZT_OUT" "validation loss"
"$PY" "$HFPY" sft bad-label.h5 67 50 label || fail "hf_dir.py"
expect_fail_with 2 "is neither -100 nor in [0, 67)" $llama data.train_files=bad-label.h5 data.val_files=[] \
    train.per_device_train_batch_size=2 train.output_dir=bad1
"$PY" "$HFPY" sft bad-off.h5 67 50 offsets || fail "hf_dir.py"
expect_fail_with 2 "/sample_offsets must run from 0 to the" $llama data.train_files=bad-off.h5 data.val_files=[] \
    train.output_dir=bad2

# ---- data.format = alpaca: the trainer preprocesses the JSON itself ----
SF="$ZT_SRCDIR/tests/reference/sft"
cp "$SF/alpaca.json" train.json && cp "$SF/sharegpt.jsonl" val.jsonl || fail "cp"
json="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_layer=1 model.n_head=2 model.n_kv_head=1 model.n_embd=16
  model.intermediate_size=32 model.vocab_size=3504 model.block_size=128 data.seq_len=127 data.tokenizer=$SF/tok/qwen
  data.template=qwen data.cutoff_len=128 data.train_files=train.json train.max_steps=2 train.eval_steps=2
  train.eval_batches=1 train.sample_tokens=0 checkpoint.save_hf=false log.plot=false"
# shellcheck disable=SC2086
run_ztrain 2 $json data.format=alpaca data.val_files=[] train.output_dir=json1 >/dev/null
assert_contains "$ZT_OUT" "7 records, 7 samples"
set -- train.json.*.sft.h5
[ $# -eq 1 ] && [ -f "$1" ] || fail "no single cache file beside train.json: $*"
cache=$1
"$ZT_PREP_DATA" --tokenizer "$SF/tok/qwen" --format alpaca --template qwen --cutoff-len 128 -o prep.h5 train.json \
    >/dev/null || fail "zt-prep-data"
"$PY" - "$cache" prep.h5 <<'PYEOF' || fail "the trainer's SFT cache differs from zt-prep-data's file"
import sys, h5py
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
sys.exit(not all((a[k][:] == b[k][:]).all() and a[k].shape == b[k].shape for k in ("input_ids", "labels", "sample_offsets")))
PYEOF
# shellcheck disable=SC2086
run_ztrain 1 $json data.format=alpaca data.val_files=[] train.output_dir=json2 >/dev/null
assert_contains "$ZT_OUT" "cached in $cache"
# shellcheck disable=SC2086
run_ztrain 1 $json data.format=alpaca data.val_files=[] data.mask_history=true train.output_dir=json3 >/dev/null
[ "$(ls train.json.*.sft.h5 | wc -l)" -eq 2 ] || fail "data.mask_history did not make a new cache"
# shellcheck disable=SC2086
run_ztrain 2 $json data.format=sharegpt data.train_files=val.jsonl data.val_files=val.jsonl train.output_dir=json4 >/dev/null
assert_contains "$ZT_OUT" "validation loss"
printf '[{"instruction": "q", "output": "a"}, {"instruction": "q", "history": [["x"]], "output": "a"}]\n' >bad.json
# shellcheck disable=SC2086
expect_fail_with 2 "bad.json: record 1: history[0]: not an [instruction, response] pair" $json data.format=alpaca \
    data.train_files=bad.json data.val_files=[] train.output_dir=bad3
# shellcheck disable=SC2086
expect_fail_with 1 "data.format = alpaca needs data.template" $json data.format=alpaca data.template=chatml \
    data.val_files=[] train.output_dir=bad4
# ---- the ranks share the preprocessing: the file one rank writes, the error one rank meets ----
"$PY" - <<'PYEOF' || fail "cannot make the JSON files"
import json, random
random.seed(7)
w = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
def s(n): return " ".join(random.choice(w) for _ in range(n))
# 2600 records: three packing groups of 1000, the last short, so 2 and 3 ranks split unevenly
recs = [{"instruction": s(random.randint(1, 12)), "input": s(random.randint(0, 8)), "output": s(random.randint(1, 40))}
        for _ in range(2600)]
json.dump(recs, open("many.json", "w"), indent=1)
with open("many.jsonl", "w") as f:
    for r in recs: f.write(json.dumps(r) + "\n")
bad = [dict(r) for r in recs]
del bad[1900]["output"]                       # in the second rank's share
json.dump(bad, open("bad-late.json", "w"), indent=1)
del bad[100]["output"]                        # in the first rank's share, with a syntax error
text = json.dumps(bad, indent=1)              # in the second's: the syntax error is what one rank reports
cut = text.rindex('"output"')
open("bad-syntax.json", "w").write(text[:cut] + '"output": }' + text[text.index("}", cut) + 1:])
with open("bad-late.jsonl", "w") as f:
    for i, r in enumerate(recs): f.write(("{" if i == 2222 else json.dumps(r)) + "\n")
PYEOF
for np in 1 2 3; do
    for c in "many.json true false" "many.jsonl false false" "many.json false true"; do
        set -- $c
        d=prep-$np-$1-$2-$3
        mkdir -p "$d" && cp "$1" "$d/" || fail "cp"
        # shellcheck disable=SC2086
        run_ztrain $np $json data.format=alpaca data.train_files="$d/$1" data.val_files=[] data.cutoff_len=64 \
            data.seq_len=63 data.packing=$2 data.neat_packing=$3 train.max_steps=1 train.eval_steps=0 \
            train.output_dir="$d/run" >/dev/null
        assert_contains "$ZT_OUT" "2600 records"
        assert_contains "$ZT_OUT" "on $np ranks"
        set -- "$d/$1".*.sft.h5
        [ -f "$1" ] || fail "$d: no cache file"
        # the content: every dataset, attribute and type (h5dump's header line names the file)
        h5dump "$1" | tail -n +2 >"$d.dump" || fail "h5dump $1"
        [ $np -eq 1 ] || cmp -s "prep-1-${d#prep-$np-}.dump" "$d.dump" ||
            fail "$d: the cache made on $np ranks differs from one rank's"
    done
done
grep -q "sample_offsets" prep-1-many.json-true-false.dump || fail "h5dump shows no /sample_offsets"
grep -q "segment_ids" prep-1-many.json-false-true.dump || fail "h5dump shows no /segment_ids of neat packing"
# ---- data.max_samples: each file's first records, as LLaMA-Factory selects them ----
set -- prep-1-many.jsonl-false-false/many.jsonl.*.sft.h5
full=$1
for np in 1 2; do
    mkdir -p "ms$np" && cp many.jsonl "ms$np/" || fail "cp"
    # shellcheck disable=SC2086
    run_ztrain $np $json data.format=alpaca data.train_files="ms$np/many.jsonl" data.val_files=[] data.cutoff_len=64 \
        data.seq_len=63 data.max_samples=1500 train.max_steps=1 train.eval_steps=0 train.output_dir="ms$np/run" >/dev/null
    assert_contains "$ZT_OUT" "1500 records"
    assert_contains "$ZT_OUT" "the first 1500 records (data.max_samples = 1500); 1100 more not read"
    set -- "ms$np"/many.jsonl.*.sft.h5
    [ $# -eq 1 ] && [ -f "$1" ] || fail "ms$np: not one cache file: $*"
    [ "${1##*/}" != "${full##*/}" ] || fail "data.max_samples did not change the cache's name"
    h5dump "$1" | tail -n +2 >"ms$np.dump" || fail "h5dump $1"
done
cmp -s ms1.dump ms2.dump || fail "data.max_samples: the cache made on 2 ranks differs from one rank's"
set -- ms1/many.jsonl.*.sft.h5
ms=$1
"$PY" - "$ms" "$full" 1500 <<'PYEOF' || fail "data.max_samples=1500: not the first 1500 samples of the whole file"
import sys, h5py
a, b, k = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), int(sys.argv[3])
off, full = a["sample_offsets"][:], b["sample_offsets"][:]
n = int(full[k])
ok = len(off) == k + 1 and (off == full[:k + 1]).all() and len(full) > k + 1
ok = ok and all((a[d][:] == b[d][:n]).all() and a[d].shape == (n,) for d in ("input_ids", "labels"))
print("max_samples", k, "of", len(full) - 1, "samples:", len(off) - 1, "tokens", n, "ok" if ok else "DIFFERENT")
sys.exit(not ok)
PYEOF
"$ZT_PREP_DATA" --tokenizer "$SF/tok/qwen" --format alpaca --template qwen --cutoff-len 64 --max-samples 1500 \
    -o ms-prep.h5 many.jsonl >ms-prep.log || fail "zt-prep-data --max-samples"
assert_contains ms-prep.log "1100 records past --max-samples 1500 not read"
h5dump ms-prep.h5 | tail -n +2 | cmp -s ms1.dump - || fail "zt-prep-data --max-samples 1500 differs from the trainer's cache"
# shellcheck disable=SC2086
run_ztrain 1 $json data.format=alpaca data.train_files=ms1/many.jsonl data.val_files=[] data.cutoff_len=64 \
    data.seq_len=63 data.max_samples=1500 train.max_steps=1 train.eval_steps=0 train.output_dir=ms1/run2 >/dev/null
assert_contains "$ZT_OUT" "cached in $ms"
# shellcheck disable=SC2086
run_ztrain 1 $json data.format=alpaca data.train_files=ms1/many.jsonl data.val_files=[] data.cutoff_len=64 \
    data.seq_len=63 data.max_samples=1200 train.max_steps=1 train.eval_steps=0 train.output_dir=ms1/run3 >/dev/null
assert_contains "$ZT_OUT" "1200 records"
[ "$(ls ms1/many.jsonl.*.sft.h5 | wc -l)" -eq 2 ] || fail "a new data.max_samples did not make a new cache"
# shellcheck disable=SC2086
run_ztrain 1 $json data.format=alpaca data.train_files=ms1/many.jsonl data.val_files=[] data.cutoff_len=64 \
    data.seq_len=63 data.max_samples=0 train.max_steps=1 train.eval_steps=0 train.output_dir=ms1/run4 >/dev/null
[ -f "ms1/${full##*/}" ] || fail "data.max_samples = 0 did not keep the cache name of a run without it"
# shellcheck disable=SC2086
expect_fail_with 1 "data.max_samples (5) applies to instruction data" $llama data.max_samples=5 train.output_dir=bad5
for np in 1 2; do
    # shellcheck disable=SC2086
    expect_fail_with $np "bad-late.json: record 1900: output: missing" $json data.format=alpaca \
        data.train_files=bad-late.json data.val_files=[] data.packing=true train.output_dir=bad-late$np
    # shellcheck disable=SC2086
    expect_fail_with $np "bad-syntax.json:$("$PY" -c "
import json
try: json.load(open('bad-syntax.json'))
except json.JSONDecodeError as e: print(e.lineno)")" $json data.format=alpaca data.train_files=bad-syntax.json \
        data.val_files=[] data.packing=true train.output_dir=bad-syn$np
    assert_contains "$ZT_OUT" "not JSON"
    # shellcheck disable=SC2086
    expect_fail_with $np "bad-late.jsonl:2223:" $json data.format=alpaca data.train_files=bad-late.jsonl \
        data.val_files=[] train.output_dir=bad-jsonl$np
done
echo "sft: the loss is per loss-bearing token of the global batch, the same at every world size"
