#!/bin/sh
# lf_dpo.sh — ztrain runs LLaMA-Factory's own DPO YAMLs (tests/reference/lf-dpo, made by
# make_lf_dpo_fixtures.py with llamafactory-cli train, stage dpo) unchanged and ends where
# LLaMA-Factory 0.9.5's trainer ended: LoRA continuing an adapter (its reference the base with
# the adapter off) and full fine-tuning with weight decay (its reference a frozen copy of the
# directory), for pref_loss sigmoid, ipo, orpo and simpo, 6 steps of warm-up + cosine with
# clipping at 0.1, 2 pairs per device x 2 accumulation. Every run at one rank (ddp) and under
# zero3 at 2; the sigmoid runs also under ddp at 2 and zero3 at 1. Per step: the loss and every metric LLaMA-Factory
# logs (rewards/*, logps/*, orpo's sft_loss and odds_ratio_loss) within 1e-5, the learning
# rate and the gradient norm (check_lf_log.py); at the end the adapter, or every weight (the
# embedding: the rows the fixture keeps), within 1e-5 relative L2. Rows trimmed to the
# micro-batch's longest pair (one rank) train and log what untrimmed rows (sp 2) do.
# Not logits/chosen and logits/rejected: LLaMA-Factory's are the mean over a batch padded to a
# multiple of 8 past its longest pair, pad positions included (their logits: the pad token
# attending to the row's tokens alone); ztrain's over the positions up to the last that carries
# a loss, rounded up to 8, its padding attending causally. They agree where no row is padded;
# here they differ by ~10%.
. "$(dirname "$0")/common.sh"
need_h5py
FIX="$ZT_SRCDIR/tests/reference/lf-dpo"
LFT="$ZT_SRCDIR/tests/reference/lf-trainer"
HFD="$ZT_SRCDIR/tests/mpi/hf_dir.py"
CHK="$ZT_SRCDIR/tests/mpi/check_lf_log.py"
cd "$ZT_TMP" || fail "cd"
# the YAMLs name the model and adapter as ../lf-trainer/..., as in the source tree
mkdir -p lf-trainer lf-dpo && cp -r "$LFT/qwen3-tiny" "$LFT/adapter-init" lf-trainer/ &&
    cp -r "$FIX/data" "$FIX"/*.yaml lf-dpo/ || fail "copy the fixture"
cd lf-dpo || fail "cd"

# KIND LOSS NP STRATEGY: trains KIND-LOSS.yaml as it is on NP ranks (2 ranks: 2 pairs per device
# without accumulation, the same 4 pairs a step) and checks it against LLaMA-Factory's run
lf_dpo() {
    run="$1-$2" out="out/$1-$2-$3-$4"
    run_ztrain "$3" "$run.yaml" train.sample_tokens=0 parallel.strategy="$4" \
        train.gradient_accumulation_steps=$((3 - $3)) train.output_dir="$out" >/dev/null
    "$PY" "$CHK" "$FIX/expected/$run/log.json" "$out/metrics.jsonl" --metrics 1e-5 --skip logits/ ||
        fail "$run under $4 on $3 ranks: not LLaMA-Factory's steps"
    if [ "$1" = lora ]; then
        "$PY" "$HFD" rel "$out/adapter" "$FIX/expected/$run" 1e-5 || fail "$run under $4 on $3: the adapter differs"
    else
        "$PY" "$HFD" rel "$out/hf" "$FIX/expected/$run" 1e-5 "$FIX/expected/$run/log.json" ||
            fail "$run under $4 on $3: the weights differ"
    fi
}
for kind in lora full; do
    for loss in sigmoid ipo orpo simpo; do
        lf_dpo $kind $loss 1 ddp
        lf_dpo $kind $loss 2 zero3
    done
    lf_dpo $kind sigmoid 2 ddp
    lf_dpo $kind sigmoid 1 zero3
done
# rows trimmed to the micro-batch's longest pair: at cutoff 200 every row is padding past its
# pair, which one rank trims and sp 2 (a row's chunks on two ranks) does not; both log the same
# steps, logits/* too (over the positions up to the longest pair's, rounded up to 8, on both)
run_ztrain 1 lora-sigmoid.yaml train.sample_tokens=0 data.cutoff_len=200 train.output_dir=out/trim-1 >/dev/null
run_ztrain 2 lora-sigmoid.yaml train.sample_tokens=0 data.cutoff_len=200 parallel.sequence_parallel_size=2 \
    train.output_dir=out/trim-sp2 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" out/trim-1 out/trim-sp2 || fail "trimmed rows: not sp 2's adapter"
"$PY" - out/trim-1 out/trim-sp2 <<'PYEOF' || fail "trimmed rows: not sp 2's metrics"
import json, sys
a, b = ([json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"step"' in l] for d in sys.argv[1:])
worst = max(abs(x[k] - y[k]) / (0.2 if k.startswith("rewards/") else max(abs(x[k]), 1e-2))
            for x, y in zip(a, b) for k in x if "/" in k and k != "rewards/accuracies")
print("trimmed rows against sp 2: metrics' worst", worst)
sys.exit(not (len(a) == len(b) == 6 and worst < 1e-5))
PYEOF
# the comparisons can fail: sigmoid's adapter is not ipo's, and the log of one loss is not another's
"$PY" "$HFD" rel out/lora-sigmoid-1-ddp/adapter "$FIX/expected/lora-ipo" 1e-5 >/dev/null &&
    fail "the adapter check cannot fail"
"$PY" "$CHK" "$FIX/expected/full-ipo/log.json" out/full-sigmoid-1-ddp/metrics.jsonl --metrics 1e-5 --skip logits/ >/dev/null &&
    fail "the log check cannot fail"
echo "lf_dpo: LLaMA-Factory's DPO YAMLs train to LLaMA-Factory's trainer's result under ddp and zero3"
