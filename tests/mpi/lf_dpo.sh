#!/bin/sh
# lf_dpo.sh — ztrain runs LLaMA-Factory's own DPO YAMLs (tests/reference/lf-dpo, made by
# make_lf_dpo_fixtures.py with llamafactory-cli train, stage dpo) unchanged and ends where
# LLaMA-Factory 0.9.5's trainer ended: LoRA continuing an adapter (its reference the base with
# the adapter off) and full fine-tuning with weight decay (its reference a frozen copy of the
# directory), for pref_loss sigmoid, ipo, orpo and simpo, 6 steps of warm-up + cosine with
# clipping at 0.1, 2 pairs per device x 2 accumulation. Every run at one rank (ddp) and under
# zero3 at 2; the sigmoid runs also under ddp at 2, zero3 at 1 and tp 2. Per step: the loss and
# every metric LLaMA-Factory logs (rewards/*, logps/*, logits/*, orpo's sft_loss and odds_ratio_loss) within 1e-5, the
# learning rate and the gradient norm (check_lf_log.py); at the end the adapter, or every weight
# (the embedding: the rows the fixture keeps), within 1e-5 relative L2. logits/chosen and
# /rejected are the mean over LLaMA-Factory's batch padded to a multiple of 8 past its longest
# sample, the pad positions included (the pad token seeing its row's sample alone). Rows
# trimmed to the micro-batch's longest pair (one rank) train and log what untrimmed rows (sp 2,
# Ulysses and ring) do; on a 4-bit base, zero3 at 2 ranks what one rank does.
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

# KIND LOSS NP STRATEGY [TP]: trains KIND-LOSS.yaml as it is on NP ranks, TP of them a tensor-
# parallel group (2 data ranks: 2 pairs per device without accumulation, the same 4 pairs a
# step) and checks it against LLaMA-Factory's run
lf_dpo() {
    tp=${5:-1}
    run="$1-$2" out="out/$1-$2-$3-$4-tp$tp"
    run_ztrain "$3" "$run.yaml" train.sample_tokens=0 parallel.strategy="$4" parallel.tensor_parallel_size="$tp" \
        train.gradient_accumulation_steps=$((2 * tp / $3)) train.output_dir="$out" >/dev/null
    "$PY" "$CHK" "$FIX/expected/$run/log.json" "$out/metrics.jsonl" --metrics 1e-5 ||
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
    lf_dpo $kind sigmoid 2 ddp 2
done
# A B LABEL: runs A and B (out/A, out/B) trained the same adapter and logged the same 6 steps
same_runs() {
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "out/$1" "out/$2" || fail "$3: not the same adapter"
    "$PY" - "out/$1" "out/$2" <<'PYEOF' || fail "$3: not the same metrics"
import json, sys
a, b = ([json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"step"' in l] for d in sys.argv[1:])
worst = max(abs(x[k] - y[k]) / (0.2 if k.startswith("rewards/") else max(abs(x[k]), 1e-3))
            for x, y in zip(a, b) for k in x if "/" in k and k != "rewards/accuracies")
print(sys.argv[2], "against", sys.argv[1] + ": metrics' worst", worst)
sys.exit(not (len(a) == len(b) == 6 and worst < 1e-5))
PYEOF
}
# rows trimmed to the micro-batch's longest pair: at cutoff 200 every row is padding past its
# pair, which one rank trims and sp 2 (a row's chunks on two ranks) does not; both log the same
# steps, logits/* too (over LLaMA-Factory's padded positions on both)
run_ztrain 1 lora-sigmoid.yaml train.sample_tokens=0 data.cutoff_len=200 train.output_dir=out/trim-1 >/dev/null
for mode in ulysses ring; do
    run_ztrain 2 lora-sigmoid.yaml train.sample_tokens=0 data.cutoff_len=200 parallel.sequence_parallel_size=2 \
        parallel.sp_mode=$mode train.output_dir=out/trim-$mode >/dev/null
    same_runs trim-1 trim-$mode "trimmed rows against sp 2 ($mode)"
done
# a 4-bit base (QLoRA) under zero3 at 2 ranks: one rank's steps, its padded logits/* too
run_ztrain 1 lora-sigmoid.yaml train.sample_tokens=0 model.quantization_bit=4 train.output_dir=out/q4-1 >/dev/null
run_ztrain 2 lora-sigmoid.yaml train.sample_tokens=0 model.quantization_bit=4 parallel.strategy=zero3 \
    train.gradient_accumulation_steps=1 train.output_dir=out/q4-zero3 >/dev/null
same_runs q4-1 q4-zero3 "QLoRA under zero3 at 2"
# the comparisons can fail: sigmoid's adapter is not ipo's, and the log of one loss is not another's
"$PY" "$HFD" rel out/lora-sigmoid-1-ddp-tp1/adapter "$FIX/expected/lora-ipo" 1e-5 >/dev/null &&
    fail "the adapter check cannot fail"
"$PY" "$CHK" "$FIX/expected/full-ipo/log.json" out/full-sigmoid-1-ddp-tp1/metrics.jsonl --metrics 1e-5 >/dev/null &&
    fail "the log check cannot fail"
echo "lf_dpo: LLaMA-Factory's DPO YAMLs train to LLaMA-Factory's trainer's result under ddp and zero3"
