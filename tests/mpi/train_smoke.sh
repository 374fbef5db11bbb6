#!/bin/sh
# train_smoke.sh — what a user sees: progress lines from rank 0 only, metrics.jsonl
# with the documented fields, the resolved config (valid input again), a loss plot,
# a generated sample, a summary, a falling loss; and the informational commands.
. "$(dirname "$0")/common.sh"
PY=${PYTHON3:-/usr/bin/python3}
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
TINY="$ZT_SRCDIR/inputs/tiny.cfg"
# this run measures the MFU denominator, as a user's run does (common.sh gives the others one)
ZT_MEASURE_PEAK=1
run_ztrain 2 "$TINY" train.max_steps=40 train.eval_steps=20 log.plot=true train.output_dir=out \
    optim.learning_rate=3e-3
ZT_MEASURE_PEAK=0
assert_contains "$ZT_OUT" "(measured matmul peak of this backend)"
n=$(grep -c "^step     1/40 | loss" "$ZT_OUT")
[ "$n" = 1 ] || fail "expected one progress line for step 1 (rank 0 speaks), got $n"
assert_contains "$ZT_OUT" "global 4 sequences = 2 per device x 2 ranks x 1 accumulation"
assert_contains "$ZT_OUT" "validation loss"
assert_contains "$ZT_OUT" "---- sample (20 tokens"
assert_contains "$ZT_OUT" "summary: 40 steps"
assert_contains "$ZT_OUT" "communication (rank 0, training steps): all-reduce 120 calls"
assert_contains "$ZT_OUT" "rank 1 -> "
for f in out/metrics.jsonl out/config.cfg out/loss.svg out/latest; do
    [ -s "$f" ] || fail "$f missing"
done
grep -q "<svg" out/loss.svg || fail "loss.svg is not SVG"
"$PY" - out/metrics.jsonl <<'PYEOF' || fail "metrics.jsonl content"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "loss" in r]
need = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "tflops", "mfu", "comm"}
assert all(need <= set(r) for r in steps), "fields missing"
assert [r["step"] for r in steps] == list(range(1, 41)), "one record per step"
vals = [r for r in recs if "val_loss" in r]
assert [r["step"] for r in vals] == [20, 40], vals
first = sum(r["loss"] for r in steps[:5]) / 5; last = sum(r["loss"] for r in steps[-5:]) / 5
assert last < first - 0.3, f"loss did not fall: {first:.3f} -> {last:.3f}"
assert any(r.get("summary") for r in recs) and any(r.get("start") for r in recs)
print(f"metrics ok: loss {first:.3f} -> {last:.3f}")
PYEOF
# validation and the sample work under zero3 too, and see the same model
cp "$ZT_OUT" ddp.out
run_ztrain 2 "$TINY" train.max_steps=40 train.eval_steps=20 train.output_dir=z3 optim.learning_rate=3e-3 \
    parallel.strategy=zero3 parallel.shard_layout=per_param >/dev/null
assert_contains "$ZT_OUT" "---- sample (20 tokens"
v1=$(sed -n 's/^step    40\/40 | validation loss //p' ddp.out)
v2=$(sed -n 's/^step    40\/40 | validation loss //p' "$ZT_OUT")
[ -n "$v1" ] && [ "$v1" = "$v2" ] || fail "validation loss under zero3 ($v2) differs from ddp ($v1)"

# GPT-2 BPE data (a small vocabulary learned here): with data.vocab_file and
# data.merges_file the prompt is encoded and the sample printed as text
awk 'BEGIN { for (i = 0; i < 600; i++) print "the model trains on the data and the loss falls." }' >bpe.txt
V=$("$PY" "$ZT_SRCDIR/tests/mpi/make_bpe.py" . bpe.txt) || fail "make_bpe.py"
"$ZT_PREP_DATA" --bpe vocab.json merges.txt --val-fraction 0.1 -o bpe bpe.txt >/dev/null || fail "zt-prep-data --bpe"
run_ztrain 1 "$TINY" data.train_files=bpe-train.h5 data.val_files=bpe-val.h5 model.vocab_size="$V" \
    data.vocab_file=vocab.json data.merges_file=merges.txt train.max_steps=60 optim.learning_rate=1e-2 \
    train.output_dir=bpe train.sample_prompt="the model" >/dev/null
sed -n '/^---- sample/,/^---- end of sample/p' "$ZT_OUT" >bpe-sample.txt
grep -q "^the model trains on the" bpe-sample.txt || { cat bpe-sample.txt; fail "BPE sample not decoded to text"; }
# the same through a tokenizer directory (vocab.json + merges.txt here; test_tokenizer
# checks the ids): zt-prep-data --tokenizer . and data.tokenizer=. decode the sample
"$ZT_PREP_DATA" --tokenizer . --val-fraction 0.1 -o tokdir bpe.txt >/dev/null || fail "zt-prep-data --tokenizer"
run_ztrain 1 "$TINY" data.train_files=tokdir-train.h5 data.val_files=tokdir-val.h5 model.vocab_size="$V" \
    data.tokenizer=. train.max_steps=60 optim.learning_rate=1e-2 \
    train.output_dir=tokdir train.sample_prompt="the model" >/dev/null
sed -n '/^---- sample/,/^---- end of sample/p' "$ZT_OUT" >tok-sample.txt
grep -q "^the model trains on the" tok-sample.txt || { cat tok-sample.txt; fail "data.tokenizer sample not decoded to text"; }

# log.all_ranks: one log file per rank, each with the progress lines
run_ztrain 2 "$TINY" train.max_steps=3 log.all_ranks=true train.output_dir=logs >/dev/null
for r in 0 1; do
    grep -q "^step     3/3 | loss" "logs/rank-$r.log" 2>/dev/null || fail "logs/rank-$r.log lacks the progress lines"
done

# the resolved config is valid input that resolves to itself
run_ztrain 1 --print-config out/config.cfg >/dev/null
grep -v -e "^+ " -e "^#" "$ZT_OUT" >printed.cfg
grep -v "^#" out/config.cfg >resolved.cfg
diff -u resolved.cfg printed.cfg >/dev/null || fail "--print-config of config.cfg differs from config.cfg"
# informational commands
run_ztrain 1 --help >/dev/null
assert_contains "$ZT_OUT" "optim.learning_rate"
assert_contains "$ZT_OUT" "parallel.shard_layout"
run_ztrain 1 --version >/dev/null
assert_contains "$ZT_OUT" "ztrain "
run_ztrain 2 --estimate-memory "$TINY" >/dev/null
assert_contains "$ZT_OUT" "zero3"
run_ztrain 1 --estimate-memory --ranks 8 --ranks-per-node 4 "$TINY" >/dev/null
assert_contains "$ZT_OUT" "8 ranks (4 per node)"
assert_contains "$ZT_OUT" "hybrid_shard"
# no input file: the default input is looked up relative to the working directory
expect_fail_with 1 "inputs/default.cfg: cannot open"
echo "train_smoke: ok"
