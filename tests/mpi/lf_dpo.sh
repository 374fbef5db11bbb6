#!/bin/sh
# lf_dpo.sh — ztrain runs LLaMA-Factory's own DPO YAMLs (tests/reference/lf-dpo, made by
# make_lf_dpo_fixtures.py with llamafactory-cli train, stage dpo) unchanged and ends where
# LLaMA-Factory 0.9.5's trainer ended: LoRA continuing an adapter (its reference the base with
# the adapter off) and full fine-tuning with weight decay (its reference a frozen copy of the
# directory), for pref_loss sigmoid, ipo, orpo and simpo, 6 steps of warm-up + cosine with
# clipping at 0.1, 2 pairs per device x 2 accumulation. Every run at one rank (ddp) and under
# zero3 at 2; the sigmoid runs also under ddp at 2, zero3 at 1 and tp 2. Per step: the loss and
# every metric LLaMA-Factory logs (rewards/*, logps/*, logits/*, orpo's sft_loss and
# odds_ratio_loss) within 1e-5, the learning rate and the gradient norm (check_lf_log.py); at the
# end the adapter, or every weight (the embedding: the rows the fixture keeps), within 1e-5
# relative L2. logits/chosen and /rejected are the mean over LLaMA-Factory's batch padded to a
# multiple of 8 past its longest sample, the pad positions included (the pad token seeing its
# row's sample alone). Rows trimmed to the micro-batch's longest pair (one rank) train and log
# what untrimmed rows (sp 2, Ulysses and ring) do; on a 4-bit base, zero3 at 2 ranks what one
# rank does. pref.share_prompt (the reference computing each pair's prompt once):
# LLaMA-Factory's steps, LoRA at one rank and tp 2 x zero3, full at one rank and zero3 at 2,
# with fewer positions computed; fresh adapters' step 1 exactly ln 2 without it, the reference
# sums to 1e-6 with it.
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
# (more arguments: given to ztrain too, the run's directory named -x; $SKIP: metrics not checked)
lf_dpo() {
    what=$1 run="$1-$2" out="out/$1-$2-$3-$4" np=$3 st=$4
    shift 4
    [ $# -eq 0 ] || out="$out-x"
    run_ztrain "$np" "$run.yaml" train.sample_tokens=0 parallel.strategy="$st" \
        train.gradient_accumulation_steps=$((3 - np)) train.output_dir="$out" "$@" >/dev/null
    "$PY" "$CHK" "$FIX/expected/$run/log.json" "$out/metrics.jsonl" --metrics 1e-5 ${SKIP:+--skip "$SKIP"} ||
        fail "$run under $st on $np ranks $*: not LLaMA-Factory's steps"
    if [ "$what" = lora ]; then
        "$PY" "$HFD" rel "$out/adapter" "$FIX/expected/$run" 1e-5 || fail "$run under $st on $np $*: the adapter differs"
    else
        "$PY" "$HFD" rel "$out/hf" "$FIX/expected/$run" 1e-5 "$FIX/expected/$run/log.json" ||
            fail "$run under $st on $np $*: the weights differ"
    fi
}
for kind in lora full; do
    for loss in sigmoid ipo orpo simpo; do
        lf_dpo $kind $loss 1 ddp
        lf_dpo $kind $loss 2 zero3
    done
    lf_dpo $kind sigmoid 2 ddp
    lf_dpo $kind sigmoid 1 zero3
    lf_dpo $kind sigmoid 2 ddp parallel.tensor_parallel_size=2 train.gradient_accumulation_steps=2
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
# the reference pass with each pair's prompt computed once and no padding (pref.share_prompt):
# LLaMA-Factory's steps for LoRA at one rank and under tp 2 x zero3, full fine-tuning (its frozen
# copy sharded) under zero3 at 2 and ddp at 1; fewer positions computed than the rows hold. Not
# full fine-tuning's rewards/accuracies: its steps 1 and 2 (learning rate 0 at step 1) have the
# policy equal to its reference, whose rewards are then 0 to rounding, and their signs count.
lf_dpo lora sigmoid 1 ddp pref.share_prompt=true
lf_dpo lora sigmoid 2 zero3 pref.share_prompt=true parallel.tensor_parallel_size=2 train.gradient_accumulation_steps=2
SKIP=rewards/accuracies
lf_dpo full sigmoid 2 zero3 pref.share_prompt=true
lf_dpo full sigmoid 1 ddp pref.share_prompt=true
SKIP=
assert_contains "$ZT_OUT" "pref.share_prompt true)"
"$PY" - "$ZT_OUT" <<'PYEOF' || fail "pref.share_prompt: no position saved"
import re, sys
m = re.search(r"reference positions computed (\d+) of the rows' (\d+)", open(sys.argv[1]).read())
print("shared prompt: reference positions", m and m.groups())
sys.exit(not (m and 0 < int(m.group(1)) < int(m.group(2))))
PYEOF
# fresh adapters (policy = reference): every position of every row, step 1 is ln 2 and the
# rewards 0 exactly; the prompt shared, the reference's log-prob sums are the same to fp32
# rounding (2e-8 relative: one GEMM's rows round by how many it runs), not bit for bit
for sh in false true; do
    run_ztrain 1 lora-sigmoid.yaml train.sample_tokens=0 lora.adapter_name_or_path= train.max_steps=1 \
        pref.share_prompt=$sh train.output_dir=out/fresh-$sh >/dev/null
done
"$PY" - <<'PYEOF' || fail "fresh adapters: not ln 2, or the shared prompt's reference is not the rows' to rounding"
import json, math, sys
a, b = ([json.loads(l) for l in open(f"out/fresh-{s}/metrics.jsonl") if '"loss"' in l][0] for s in ("false", "true"))
exact = a["loss"] == float(f"{math.log(2):.9g}") and all(a[k] == 0 for k in ("rewards/chosen", "rewards/rejected",
                                                                           "rewards/margins", "rewards/accuracies"))
# the reference's sums: the policy's minus reward / beta (beta 0.1); the policy's pass is the same in both
ref = [{k: r[f"logps/{k}"] - r[f"rewards/{k}"] / 0.1 for k in ("chosen", "rejected")} for r in (a, b)]
rel = max(abs(ref[0][k] - ref[1][k]) / abs(ref[0][k]) for k in ref[0])
print("fresh adapters: unshared", a["loss"], "shared", b["loss"], "reference sums' relative difference", rel)
sys.exit(not (exact and a["logps/chosen"] == b["logps/chosen"] and rel < 1e-6 and abs(b["loss"] - math.log(2)) < 1e-6))
PYEOF
# the comparisons can fail: sigmoid's adapter is not ipo's, and the log of one loss is not another's
"$PY" "$HFD" rel out/lora-sigmoid-1-ddp/adapter "$FIX/expected/lora-ipo" 1e-5 >/dev/null &&
    fail "the adapter check cannot fail"
"$PY" "$CHK" "$FIX/expected/full-ipo/log.json" out/full-sigmoid-1-ddp/metrics.jsonl --metrics 1e-5 >/dev/null &&
    fail "the log check cannot fail"
echo "lf_dpo: LLaMA-Factory's DPO YAMLs train to LLaMA-Factory's trainer's result under ddp and zero3"
