#!/bin/sh
# dpo.sh — preference training (train.stage = dpo) of LoRA adapters on transformers' llama
# directory (tests/reference/hf/llama), pairs as rows 2i (chosen) and 2i + 1 (rejected) of
# a token file read in order.
#  1. Fresh adapters (B = 0) leave the policy equal to its reference (the base with the
#     adapters off): sigmoid DPO's first loss is ln 2 and its rewards and margins 0, exactly;
#     metrics.jsonl and the progress line carry LLaMA-Factory's metrics.
#  2. ddp and zero3 at 2 ranks, tp 2, sp 2 (Ulysses) and ring 2, train what one rank trains
#     with accumulation (per-step loss 1e-5, final adapters 3e-5, metrics 1e-5, rewards 2e-6
#     absolute), for sigmoid (with
#     a reference pass) and
#     orpo (without; its sft_loss and odds_ratio_loss logged). The one-rank run's loss.svg
#     draws the loss and the reward margin at the points metrics.jsonl gives.
#  3. PEFT's lora-llama adapter (policy != reference) at learning rate 0, 2 steps of 2
#     pairs: the loss, LLaMA-Factory's metrics and the adapters' gradient norm are LLaMA-
#     Factory 0.9.5's own (tests/reference/pref/llama_lora.json, made by its trainer's
#     get_batch_loss_metrics on the same rows: make_pref_lora_fixture.py) for sigmoid, ipo
#     and orpo, 1e-5 relative (rewards: 2e-6 absolute, beta times fp32 sums of -34), at 1 rank
#     and zero3 at 2.
#  2b. Full fine-tuning, its reference a frozen copy of the directory's weights: step 1 is ln 2;
#     zero3 (the copy sharded) and tp 2 train what one rank trains; the margins move; a run
#     resumed after 2 of 4 steps (its reference from the directory again) is the straight run.
#  2d. zero1, zero2 (per_param), shard_grad_op at 2 ranks, hybrid_shard and hybrid_shard_zero2
#     (shard groups of 2), tp 2 x zero3 dp 2 and Ulysses sp 2 x zero2 dp 2 at 4 ranks, LoRA and
#     full; full also under ddp, Ulysses sp 2 and ring sp 2: each trains what one rank trains.
#  2e. Pipelines (the reference's forwards as actions of the schedule, the loss on the last
#     stage, rank 0 logging its metrics): LoRA sigmoid at pp 2, pp 2 x zero3 dp 2, pp 2 x tp 2
#     and interleaved (v 2: the last stage the head alone), orpo (no reference) at pp 2, full
#     fine-tuning at pp 2 and pp 2 x zero3 dp 2, and tied Qwen3, LoRA and full, at pp 2:
#     per-step loss and every metric 1e-5, final weights 3e-5 of one rank (train.bf16 at
#     pp 2 x zero3 dp 2 against the one-rank bf16 run: loss 5e-6); the frozen copy
#     is owned per stage (each pipeline rank's share adds up to one rank's copy) and each
#     pipeline rank's estimate, the copy's and the reference's message buffers included, is
#     what it allocated; the pipeline summary splits each rank's time between the reference
#     and the policy.
#  2f. pref.precompute_ref_log_probs on 8 pairs, 2 epochs at 2 ranks: the run is the one without
#     it bit for bit (losses, rewards, logps), LoRA and full fine-tuning (zero3, its frozen copy
#     freed once every pair is in the table); epoch 2 runs no reference pass; the table is saved
#     beside each checkpoint (keep_last removes it with its checkpoint), and a run resumed in
#     epoch 2 reads it (no reference pass, the straight run's steps); another dataset's table
#     and a pipeline are refused in one line.
#  2c. pref.ref_model (tp 2): lora-llama's merged model as the reference of the base with that
#     adapter: ln 2 and no margin to rounding; a directory of other shapes fails on every rank.
#  4. What is not wired is refused in one line on every rank (full fine-tuning without a
#     directory to copy, evaluation).
#  5. QLoRA DPO (model.quantization_bit = 4, PEFT's adapter on tests/reference/hf/qlora-llama):
#     zero3 at 2 ranks trains what one rank trains; the reference's log-probabilities (the
#     policy's minus its reward over beta) are the 4-bit base's (a policy of fresh adapters)
#     to 1e-6, not the float32 base's; pref.ref_model beside a 4-bit base is refused.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
CMP="$ZT_SRCDIR/tests/mpi/compare_runs.py"
cd "$ZT_TMP" || fail "cd"
lora_setup
dpo="model.name_or_path=$HF/llama train.stage=dpo data.shuffle=false checkpoint.save_hf=false"

# ---- 1. policy = reference: ln 2 -------------------------------------------------------
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $dpo train.max_steps=1 train.output_dir=first >/dev/null
assert_contains "$ZT_OUT" "step     1/1 | loss 0.6931 | rewards/chosen 0.0000 | rewards/rejected 0.0000"
"$PY" - <<'PYEOF' || fail "step 1 is not ln 2 with zero rewards and margins"
import json, math, sys
r = [json.loads(l) for l in open("first/metrics.jsonl") if '"loss"' in l][0]
ok = abs(r["loss"] - math.log(2)) < 1e-9 and r["rewards/margins"] == 0 and r["rewards/chosen"] == 0 \
    and r["rewards/rejected"] == 0 and r["rewards/accuracies"] == 0 and r["logps/chosen"] < 0
for k in ("logps/rejected", "logits/chosen", "logits/rejected"):
    ok = ok and k in r
print("step 1:", {k: v for k, v in r.items() if "/" in k or k == "loss"})
sys.exit(not ok)
PYEOF

# ---- 2. every strategy trains what one rank trains -------------------------------------
train="optim.learning_rate=1e-2 train.max_steps=3"
for loss in sigmoid orpo; do
    # shellcheck disable=SC2086
    run_ztrain 1 lora.cfg $dpo $train pref.loss=$loss train.per_device_train_batch_size=1 \
        train.gradient_accumulation_steps=2 log.plot=true train.output_dir=$loss-ref >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $train pref.loss=$loss train.per_device_train_batch_size=1 \
        parallel.strategy=ddp train.output_dir=$loss-ddp >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $train pref.loss=$loss train.per_device_train_batch_size=1 \
        parallel.strategy=zero3 train.output_dir=$loss-zero3 >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $train pref.loss=$loss train.per_device_train_batch_size=1 \
        train.gradient_accumulation_steps=2 parallel.tensor_parallel_size=2 train.output_dir=$loss-tp2 >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $train pref.loss=$loss train.per_device_train_batch_size=1 \
        train.gradient_accumulation_steps=2 parallel.sequence_parallel_size=2 train.output_dir=$loss-sp2 >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $train pref.loss=$loss train.per_device_train_batch_size=1 \
        train.gradient_accumulation_steps=2 parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
        train.output_dir=$loss-ring2 >/dev/null
    # adapters 3e-5: Adam's first steps move an element by about lr whatever its gradient's size,
    # so the rounding of small gradients (ring attention's merges) shows in them
    "$PY" "$CMP" $loss-ref $loss-ddp $loss-zero3 $loss-tp2 $loss-sp2 $loss-ring2 --param-tol 3e-5 ||
        fail "$loss: strategies trained other adapters"
    # loss.svg draws the loss and the reward margin at each step, on one axis over both
    "$PY" - "$loss-ref" <<'PYEOF' || fail "$loss: loss.svg does not draw the loss and the reward margin"
import json, re, sys
d = sys.argv[1]
svg = open(d + "/loss.svg").read()
rec = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
lines = re.findall(r"<polyline[^>]*points='([^']*)'/>\s*<text[^>]*>([^<]*)</text>", svg)
drawn = {label: [tuple(map(float, p.split(","))) for p in pts.split()] for pts, label in lines}
want = {"train loss": [r["loss"] for r in rec], "reward margin": [r["rewards/margins"] for r in rec]}
vals = [v for s in want.values() for v in s]
lo, hi = min(vals), max(vals)
x0, y0, pw, ph, xmax = 70, 30, 700, 390, max(1, rec[-1]["step"])
ok = "loss and reward margin" in svg and set(drawn) == set(want)
for label, vs in want.items():
    exp = [(x0 + pw * r["step"] / xmax, y0 + ph - ph * (v - lo) / (hi - lo)) for r, v in zip(rec, vs)]
    got = drawn.get(label, [])
    ok = ok and len(got) == len(exp) and all(abs(a - c) < 0.06 and abs(b - e) < 0.06 for (a, b), (c, e) in zip(got, exp))
print("loss.svg series:", {k: len(v) for k, v in drawn.items()})
sys.exit(not ok)
PYEOF
    "$PY" - "$loss" <<'PYEOF' || fail "$loss: the metrics differ between strategies or are missing"
import json, sys
loss = sys.argv[1]
def rec(d):
    return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
keys = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
        "logps/rejected", "logits/chosen", "logits/rejected"] + (["sft_loss", "odds_ratio_loss"] if loss == "orpo" else [])
ref = rec(loss + "-ref")
worst, where = 0.0, ""
for d in ("ddp", "zero3", "tp2", "sp2", "ring2"):
    for a, b in zip(ref, rec(loss + "-" + d)):
        for k in keys:
            # rewards: 2e-6 absolute (beta 0.1 times fp32 sums of about -34 computed in other orders)
            e = abs(a[k] - b[k]) / (0.2 if k.startswith("rewards/") else max(abs(a[k]), 1e-2))
            if e > worst:
                worst, where = e, d + " " + k + " %.9g %.9g" % (a[k], b[k])
print(loss, "metrics worst relative difference", worst, where, "margins", [r["rewards/margins"] for r in ref])
sys.exit(not (len(ref) == 3 and worst < 1e-5 and ref[-1]["rewards/margins"] != 0))
PYEOF
done

# ---- 3. LLaMA-Factory's DPO step on the same rows -----------------------------------------
for loss in sigmoid ipo orpo; do
    for run in "1 ddp" "2 zero3"; do
        set -- $run
        # shellcheck disable=SC2086
        run_ztrain "$1" lora.cfg $dpo lora.adapter_name_or_path=$HF/lora-llama pref.loss=$loss \
            train.per_device_train_batch_size=$((2 / $1)) train.gradient_accumulation_steps=1 \
            parallel.strategy=$2 train.output_dir=lf-$loss-$2 >/dev/null
        "$PY" - "$ZT_SRCDIR/tests/reference/pref/llama_lora.json" "$loss" "lf-$loss-$2" <<'PYEOF' ||
import json, sys
want = json.load(open(sys.argv[1]))["runs"][sys.argv[2]]["steps"]
got = [json.loads(l) for l in open(sys.argv[3] + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
worst, where = 0.0, ""
for w, g in zip(want, got):
    pairs = [("loss", w["loss"], g["loss"]), ("grad_norm", w["grad_norm"], g["grad_norm"])]
    pairs += [(k, v, g[k]) for k, v in w["metrics"].items() if not k.startswith("logits/")]
    for k, a, b in pairs:
        # a reward is beta times a difference of log-prob sums (about -34 here) of two fp32
        # computations: its error is absolute (2e-6 = 500 ulps of such a sum, times beta)
        e = abs(a - b) / 0.2 if k.startswith("rewards/") else abs(a - b) / max(abs(a), 1e-3)
        if e > worst:
            worst, where = e, k
print(sys.argv[2], sys.argv[3], "worst difference from LLaMA-Factory", worst, "(" + where + ")")
sys.exit(not (len(got) == len(want) == 2 and worst < 1e-5))
PYEOF
            fail "$loss ($2): not LLaMA-Factory's loss, metrics or gradient norm"
    done
done

# ---- 2b. full fine-tuning: the reference a frozen copy of the directory's weights ------------
full="train.finetuning_type=full optim.learning_rate=1e-3 train.max_steps=3"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $dpo $full train.per_device_train_batch_size=1 train.gradient_accumulation_steps=2 \
    train.output_dir=full-ref >/dev/null
assert_contains "$ZT_OUT" "dpo: the reference is a frozen copy of $HF/llama"
assert_contains "$ZT_OUT" "step     1/3 | loss 0.6931 | rewards/chosen 0.0000 | rewards/rejected 0.0000"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo $full train.per_device_train_batch_size=1 parallel.strategy=zero3 \
    train.output_dir=full-zero3 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo $full train.per_device_train_batch_size=1 train.gradient_accumulation_steps=2 \
    parallel.tensor_parallel_size=2 train.output_dir=full-tp2 >/dev/null
"$PY" "$CMP" full-ref full-zero3 full-tp2 --param-tol 3e-5 || fail "full fine-tuning: strategies trained other weights"
# the frozen copy is counted in the estimate (a dry run of its engine beside the policy's): rank 0's
# estimate is what it allocated, category by category, the reference's too; zero3 holds half of it
"$PY" - <<'PYEOF' || fail "full fine-tuning: the estimate is not what was allocated, or zero3 holds more than 1/2 of the reference"
import json, sys
def rec(d):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    return next(r for r in recs if r.get("start")), next(r for r in recs if r.get("summary"))
bad, refs = [], {}
for d in ("full-ref", "full-zero3", "full-tp2"):
    start, summary = rec(d)
    est, meas = start["memory_estimate"], summary["memory_measured"]
    if "reference" not in est or est != meas:
        bad.append(f"{d}: estimate {est} != measured {meas}")
    total = sum(est[k] for k in ("params", "grads", "optimizer", "buffers", "gathered", "activations")) + \
        sum(est["reference"][k] for k in ("params", "buffers", "gathered"))
    if start["memory_estimate_total"] != total:
        bad.append(f"{d}: estimated total {start['memory_estimate_total']} leaves out part of {total}")
    refs[d] = est["reference"]["params"]
    print(d, "reference params per rank", refs[d], "estimate = measured" if est == meas else "DIFFERS")
# zero3 at 2 ranks: each rank holds half of the (flat, padded to 2) copy
if not refs["full-ref"] // 2 <= refs["full-zero3"] <= refs["full-ref"] // 2 + 4 * 16:
    bad.append(f"zero3 holds {refs['full-zero3']} bytes of the reference, not half of {refs['full-ref']}")
for b in bad: print("  ", b)
sys.exit(1 if bad else 0)
PYEOF
"$PY" - <<'PYEOF' || fail "full fine-tuning: the policy did not move away from its frozen reference"
import json, math, sys
r = [json.loads(l) for l in open("full-ref/metrics.jsonl") if '"loss"' in l and '"step"' in l]
print("full fine-tuning margins", [x["rewards/margins"] for x in r])
sys.exit(not (abs(r[0]["loss"] - math.log(2)) < 1e-9 and r[0]["rewards/margins"] == 0 and r[2]["rewards/margins"] != 0))
PYEOF

# a resumed run takes its reference from the directory again (not the checkpoint): 2 + 2 steps are 4
res="$dpo train.finetuning_type=full optim.learning_rate=1e-3 optim.lr_scheduler_type=constant parallel.strategy=zero3
train.per_device_train_batch_size=1"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $res train.max_steps=4 train.output_dir=res-full >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $res train.max_steps=2 train.output_dir=res-split >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $res train.max_steps=4 checkpoint.resume=auto train.output_dir=res-split >/dev/null
assert_contains "$ZT_OUT" "resumed from res-split/ckpt-00000002.h5"
"$PY" - <<'PYEOF' || fail "full fine-tuning: a resumed run does not continue as the straight one"
import json, sys
def rec(d):
    return {r["step"]: r for r in (json.loads(l) for l in open(d + "/metrics.jsonl")) if "loss" in r and "step" in r}
a, b = rec("res-full"), rec("res-split")
same = all(a[s][k] == b[s][k] for s in (3, 4) for k in ("loss", "rewards/margins", "logps/chosen"))
print("resume: steps 3, 4", [(a[s]["loss"], b[s]["loss"]) for s in (3, 4)])
sys.exit(not same)
PYEOF

# ---- 2f. pref.precompute_ref_log_probs: each pair's reference computed once -------------------
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens pairs8.h5 67 129 || fail "cannot make the token file" # 16 rows
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens pairs10.h5 67 161 || fail "cannot make the token file"
pc="$dpo data.train_files=pairs8.h5 train.max_steps=0 train.num_train_epochs=2 train.per_device_train_batch_size=1"
pc="$pc optim.learning_rate=1e-2 parallel.strategy=zero3"
for ft in lora full; do
    lr=1e-2
    [ $ft = full ] && lr=1e-3
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $pc optim.learning_rate=$lr train.finetuning_type=$ft train.output_dir=pc-$ft-off >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $pc optim.learning_rate=$lr train.finetuning_type=$ft pref.precompute_ref_log_probs=true \
        checkpoint.save_steps=3 checkpoint.keep_last=2 train.output_dir=pc-$ft-on >/dev/null
    assert_contains "$ZT_OUT" "dpo reference table: 8 of 8 pairs; 4 of 8 micro-batches read it instead of a reference pass"
done
assert_contains "$ZT_OUT" "dpo: the reference table holds every pair: the frozen reference copy is freed"
[ -f pc-lora-on/prefref-00000006.h5 ] && [ -f pc-lora-on/prefref-00000008.h5 ] && [ ! -e pc-lora-on/prefref-00000003.h5 ] ||
    fail "precompute: the tables beside the checkpoints are not those keep_last keeps"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $pc pref.precompute_ref_log_probs=true checkpoint.resume=pc-lora-on/ckpt-00000006.h5 \
    train.output_dir=pc-lora-res >/dev/null
assert_contains "$ZT_OUT" "dpo: reference table pc-lora-on/prefref-00000006.h5: 8 of 8 pairs"
assert_contains "$ZT_OUT" "2 of 2 micro-batches read it instead of a reference pass"
"$PY" - <<'PYEOF' || fail "precompute: the run differs from the one without it"
import json, sys
def rec(d):
    return {r["step"]: r for r in (json.loads(l) for l in open(d + "/metrics.jsonl")) if "loss" in r and "step" in r}
keys = ["loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
        "logps/chosen", "logps/rejected"]
ok = True
for a, b, steps in (("pc-lora-off", "pc-lora-on", range(1, 9)), ("pc-full-off", "pc-full-on", range(1, 9)),
                    ("pc-lora-off", "pc-lora-res", (7, 8))):
    x, y = rec(a), rec(b)
    bad = [(s, k, x[s][k], y[s][k]) for s in steps for k in keys if s not in y or x[s][k] != y[s][k]]
    print(f"{b} against {a}, steps {list(steps)}: {'equal' if not bad else bad[:3]}")
    ok = ok and not bad and sorted(y) == list(steps) and x[8]["rewards/margins"] != 0
sys.exit(not ok)
PYEOF
# shellcheck disable=SC2086
expect_fail_with 2 "pc-lora-on/prefref-00000006.h5: a table of 8 pairs, the training set has 10" lora.cfg $pc \
    data.train_files=pairs10.h5 pref.precompute_ref_log_probs=true checkpoint.resume=pc-lora-on/ckpt-00000006.h5 \
    train.output_dir=pc-other
# shellcheck disable=SC2086
expect_fail_with 2 "pref.precompute_ref_log_probs with parallel.pipeline_parallel_size 2" lora.cfg $pc \
    pref.precompute_ref_log_probs=true parallel.pipeline_parallel_size=2 train.gradient_accumulation_steps=2 \
    train.output_dir=pc-pp

# ---- 2d. the other strategies and meshes, LoRA and full (sigmoid: a reference pass) ---------
# against the 1-rank runs above (2 pairs a step): 2 ranks, and tp 2 x zero3 dp 2 and Ulysses
# sp 2 x zero2 dp 2 on 4; the hybrids (4 ranks, shard groups of 2: 4 pairs a step) against one
# rank accumulating 4
mesh_runs() { # KIND ARGS...: every mesh of KIND (lora | full) with ARGS, into KIND-<mesh>
    kind=$1
    shift
    one="train.per_device_train_batch_size=1"
    for st in "zero1 flat" "zero2 per_param" "shard_grad_op flat"; do
        # shellcheck disable=SC2086
        run_ztrain 2 lora.cfg "$@" $one parallel.strategy=${st% *} parallel.shard_layout=${st#* } \
            train.output_dir=$kind-${st% *} >/dev/null
    done
    # shellcheck disable=SC2086
    run_ztrain 1 lora.cfg "$@" $one train.gradient_accumulation_steps=4 train.output_dir=$kind-ref4 >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 lora.cfg "$@" $one parallel.strategy=hybrid_shard parallel.shard_group_size=2 \
        train.output_dir=$kind-hybrid >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 lora.cfg "$@" $one parallel.strategy=hybrid_shard_zero2 parallel.shard_group_size=2 \
        train.output_dir=$kind-hybrid2 >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 lora.cfg "$@" $one parallel.strategy=zero3 parallel.tensor_parallel_size=2 \
        train.output_dir=$kind-tp2dp2 >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 lora.cfg "$@" $one parallel.strategy=zero2 parallel.sequence_parallel_size=2 \
        train.output_dir=$kind-sp2dp2 >/dev/null
}
# shellcheck disable=SC2086
mesh_runs lora $dpo $train pref.loss=sigmoid
"$PY" "$CMP" sigmoid-ref lora-zero1 lora-zero2 lora-shard_grad_op lora-tp2dp2 lora-sp2dp2 --param-tol 3e-5 ||
    fail "LoRA: zero1, zero2, shard_grad_op, tp 2 x dp 2 or sp 2 x dp 2 trained other adapters"
"$PY" "$CMP" lora-ref4 lora-hybrid lora-hybrid2 --param-tol 3e-5 || fail "LoRA: a hybrid trained other adapters"
# shellcheck disable=SC2086
mesh_runs full $dpo $full
for d in ddp sp2 ring2; do
    case $d in
        ddp) extra="parallel.strategy=ddp" ;;
        sp2) extra="train.gradient_accumulation_steps=2 parallel.sequence_parallel_size=2" ;;
        ring2) extra="train.gradient_accumulation_steps=2 parallel.sequence_parallel_size=2 parallel.sp_mode=ring" ;;
    esac
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $full train.per_device_train_batch_size=1 $extra train.output_dir=full-$d >/dev/null
done
"$PY" "$CMP" full-ref full-ddp full-zero1 full-zero2 full-shard_grad_op full-sp2 full-ring2 full-tp2dp2 full-sp2dp2 \
    --param-tol 3e-5 || fail "full fine-tuning: ddp, zero1, zero2, shard_grad_op, sp 2, ring 2, tp 2 x dp 2 or sp 2 x dp 2 trained other weights"
"$PY" "$CMP" full-ref4 full-hybrid full-hybrid2 --param-tol 3e-5 || fail "full fine-tuning: a hybrid trained other weights"

# ---- 2e. pipelines -----------------------------------------------------------------------------
pp2="parallel.pipeline_parallel_size=2"
one="train.per_device_train_batch_size=1"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo $train pref.loss=sigmoid $one train.gradient_accumulation_steps=2 $pp2 \
    train.output_dir=sigmoid-pp2 >/dev/null
# the pipeline's summary splits each rank's compute between the reference's forwards and the
# policy's, and the DPO summary gives the stages' parts together
grep -qE "summary: pipeline 1f1b, .* rank 0: [^;]*, dpo reference [0-9.]+ s/step, policy [0-9.]+ s/step; rank 1: [^;]*, dpo reference" \
    "$ZT_OUT" || fail "pp 2 DPO: the pipeline summary has no reference/policy split"
assert_contains "$ZT_OUT" "summary: dpo reference passes"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $dpo $train pref.loss=sigmoid $one parallel.strategy=zero3 $pp2 parallel.pp_schedule=gpipe \
    train.output_dir=sigmoid-pp2dp2 >/dev/null
assert_contains "$ZT_OUT" "mesh tp 1 x sp 1 x dp 2 x pp 2"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $dpo $train pref.loss=sigmoid $one train.gradient_accumulation_steps=2 $pp2 \
    parallel.tensor_parallel_size=2 train.output_dir=sigmoid-pp2tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo $train pref.loss=sigmoid $one train.gradient_accumulation_steps=2 $pp2 \
    parallel.pp_schedule=interleaved_1f1b parallel.pp_stages_per_rank=2 train.output_dir=sigmoid-il >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo $train pref.loss=orpo $one train.gradient_accumulation_steps=2 $pp2 \
    train.output_dir=orpo-pp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo $full $one train.gradient_accumulation_steps=2 $pp2 train.output_dir=full-pp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $dpo $full $one parallel.strategy=zero3 $pp2 parallel.pp_schedule=gpipe \
    train.output_dir=full-pp2dp2 >/dev/null
# Qwen3: the tied root on the first stage (embedding) and the last (head), the reference's too
qwen="model.name_or_path=$HF/qwen3"
for ft in lora full; do
    case $ft in lora) args="$train" ;; full) args="$full" ;; esac
    # shellcheck disable=SC2086
    run_ztrain 1 lora.cfg $dpo $qwen $args $one train.gradient_accumulation_steps=2 train.output_dir=qwen-$ft-ref \
        >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $dpo $qwen $args $one train.gradient_accumulation_steps=2 $pp2 \
        train.output_dir=qwen-$ft-pp2 >/dev/null
done
# train.bf16: the pipeline against the one-rank bf16 run (pp_compose.sh's 16-bit tolerance), and
# bf16 in effect (not the fp32 result)
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $dpo $train pref.loss=sigmoid $one train.gradient_accumulation_steps=2 train.bf16=true \
    train.output_dir=bf16-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $dpo $train pref.loss=sigmoid $one parallel.strategy=zero3 $pp2 parallel.pp_schedule=gpipe \
    train.bf16=true train.output_dir=bf16-pp2dp2 >/dev/null
"$PY" "$CMP" bf16-ref bf16-pp2dp2 --loss-tol 5e-6 --param-tol 3e-5 || fail "bf16 DPO at pp 2 x dp 2 diverged from one rank"
"$PY" "$CMP" sigmoid-ref bf16-pp2dp2 >/dev/null && fail "train.bf16 DPO at pp 2 x dp 2 gave the fp32 result"
"$PY" "$CMP" sigmoid-ref sigmoid-pp2 sigmoid-pp2dp2 sigmoid-pp2tp2 sigmoid-il --param-tol 3e-5 ||
    fail "LoRA sigmoid: a pipeline trained other adapters"
"$PY" "$CMP" orpo-ref orpo-pp2 --param-tol 3e-5 || fail "orpo: a pipeline trained other adapters"
"$PY" "$CMP" full-ref full-pp2 full-pp2dp2 --param-tol 3e-5 || fail "full fine-tuning: a pipeline trained other weights"
"$PY" "$CMP" qwen-lora-ref qwen-lora-pp2 --param-tol 3e-5 || fail "qwen3 LoRA: a pipeline trained other adapters"
"$PY" "$CMP" qwen-full-ref qwen-full-pp2 --param-tol 3e-5 || fail "qwen3 full: a pipeline trained other weights"
"$PY" - <<'PYEOF' || fail "a pipeline logged other DPO metrics, or its reference copy is not owned per stage"
import json, sys
def rec(d):
    return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
def stages(d):
    return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"pp_rank"' in l]
worst, where, bad = 0.0, "", []
for ref, runs in (("sigmoid-ref", ["sigmoid-pp2", "sigmoid-pp2dp2", "sigmoid-pp2tp2", "sigmoid-il"]), ("orpo-ref", ["orpo-pp2"]),
                  ("bf16-ref", ["bf16-pp2dp2"]),
                  ("full-ref", ["full-pp2", "full-pp2dp2"]), ("qwen-lora-ref", ["qwen-lora-pp2"]),
                  ("qwen-full-ref", ["qwen-full-pp2"])):
    a_all = rec(ref)
    keys = [k for k in a_all[0] if "/" in k or k in ("sft_loss", "odds_ratio_loss")]
    if len(keys) < 8 or (ref == "orpo-ref") != ("odds_ratio_loss" in keys):
        bad.append(f"{ref}: metrics {keys}")
    for d in runs:
        b_all = rec(d)
        if len(b_all) != len(a_all) or len(a_all) != 3:
            bad.append(f"{d}: {len(b_all)} steps logged")
        for a, b in zip(a_all, b_all):
            for k in keys:
                e = abs(a[k] - b[k]) / (0.2 if k.startswith("rewards/") else max(abs(a[k]), 1e-2))
                if e > worst:
                    worst, where = e, f"{d} step {a['step']} {k} {a[k]:.9g} {b[k]:.9g}"
print("pipelines: DPO metrics' worst relative difference", worst, where)
if worst > 1e-5:
    bad.append("metrics differ")
# the frozen copy per stage: estimate = measured on each pipeline rank, its shares add up to
# one rank's (untied llama: no unit on two stages); zero3 halves each stage's share
whole = next(json.loads(l) for l in open("full-ref/metrics.jsonl") if '"start"' in l)["memory_estimate"]
whole = whole["reference"]["params"]
# the reference's messages (LoRA: the base's forward through the stages) are buffers of the
# step in the estimate and the measurement alike: each pipeline rank's beyond orpo's (the same
# run without a reference) is one residual stream per micro-batch, A 2 x rows 2 x T 8 x C 32 x 4 bytes
for d in ("sigmoid-pp2", "sigmoid-il", "orpo-pp2"):
    for s in stages(d):
        if s["memory_estimate"] != s["memory_measured"]:
            bad.append(f"{d} pp rank {s['pp_rank']}: estimate {s['memory_estimate']} != {s['memory_measured']}")
extra = [a["memory_measured"]["buffers"] - b["memory_measured"]["buffers"] for a, b in zip(stages("sigmoid-pp2"), stages("orpo-pp2"))]
print("the reference's message buffers per pipeline rank", extra)
if len(extra) != 2 or extra != [2 * 2 * 8 * 32 * 4] * 2:
    bad.append(f"the reference's messages hold {extra} bytes per pipeline rank")
for d in ("full-pp2", "full-pp2dp2", "qwen-full-pp2"):
    st = stages(d)
    for s in st:
        if "reference" not in s["memory_estimate"] or s["memory_estimate"] != s["memory_measured"]:
            bad.append(f"{d} pp rank {s['pp_rank']}: estimate {s['memory_estimate']} != {s['memory_measured']}")
    got = [s["memory_measured"].get("reference", {}).get("params", 0) for s in st]
    print(d, "reference params per pipeline rank", got, "one rank", whole if d.startswith("full") else "")
    if d == "full-pp2" and (len(got) != 2 or sum(got) != whole or min(got) == 0):
        bad.append(f"{d}: the stages' reference shares {got} do not add up to {whole}")
    if d == "full-pp2dp2" and not (whole // 2 <= sum(got) <= whole // 2 + 4 * 16 * 2):
        bad.append(f"{d}: zero3 holds {got}, not half of each stage's share of {whole}")
for b in bad: print("  ", b)
sys.exit(1 if bad else 0)
PYEOF

# ---- 2c. pref.ref_model: a reference of its own ------------------------------------------------
# the merged model of lora-llama is the policy (base + that adapter) to rounding: ln 2 and no margin
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $dpo lora.adapter_name_or_path=$HF/lora-llama pref.ref_model=$HF/lora-llama/merged \
    train.max_steps=1 parallel.tensor_parallel_size=2 train.output_dir=refdir >/dev/null
assert_contains "$ZT_OUT" "dpo: the reference is a frozen copy of $HF/lora-llama/merged"
"$PY" - <<'PYEOF' || fail "pref.ref_model: the merged model is not the policy's reference"
import json, math, sys
r = [json.loads(l) for l in open("refdir/metrics.jsonl") if '"loss"' in l and '"step"' in l][0]
print("ref_model = merged:", r["loss"] - math.log(2), r["rewards/margins"])
sys.exit(not (abs(r["loss"] - math.log(2)) < 1e-6 and abs(r["rewards/margins"]) < 1e-6 and r["logps/chosen"] < -1))
PYEOF
# shellcheck disable=SC2086
expect_fail_with 2 "dpo reference: " lora.cfg $dpo pref.ref_model=$HF/gpt2

# ---- 4. refusals -----------------------------------------------------------------------
# shellcheck disable=SC2086
expect_fail_with 2 "train.stage = dpo with full fine-tuning copies its reference from model.name_or_path" \
    lora.cfg train.stage=dpo data.shuffle=false train.finetuning_type=full
# shellcheck disable=SC2086
expect_fail_with 2 "train.stage = dpo: evaluation on pairs is not wired yet" lora.cfg $dpo data.val_files=tok67.h5

# ---- 5. QLoRA DPO: a 4-bit base, its reference the 4-bit base with the adapters off -----------
q4="train.stage=dpo data.shuffle=false checkpoint.save_hf=false model.name_or_path=$HF/qlora-llama"
q4="$q4 model.quantization_bit=4 optim.learning_rate=1e-2 train.max_steps=3 train.per_device_train_batch_size=1"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $q4 lora.adapter_name_or_path=$HF/qlora-llama/adapter train.gradient_accumulation_steps=2 \
    train.output_dir=q4-ref >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $q4 lora.adapter_name_or_path=$HF/qlora-llama/adapter parallel.strategy=zero3 \
    train.output_dir=q4-zero3 >/dev/null
"$PY" "$CMP" q4-ref q4-zero3 --param-tol 3e-5 || fail "QLoRA DPO: zero3 at 2 ranks trained other adapters"
# the reference's log-probs (the policy's minus its reward over beta) are the 4-bit base's (the
# policy of fresh adapters: its base exactly), not the float32 base's
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $q4 train.gradient_accumulation_steps=2 train.output_dir=q4-base >/dev/null
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $q4 model.quantization_bit=0 train.gradient_accumulation_steps=2 train.output_dir=f32-base \
    >/dev/null
"$PY" - <<'PYEOF' || fail "QLoRA DPO: zero3's metrics differ, or the reference is not the 4-bit base"
import json, sys
def rec(d):
    return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l and '"step"' in l]
ref, z3, q4, f32 = rec("q4-ref"), rec("q4-zero3"), rec("q4-base"), rec("f32-base")
worst = max(abs(a[k] - b[k]) / (0.2 if k.startswith("rewards/") else max(abs(a[k]), 1e-2))
            for a, b in zip(ref, z3) for k in a if "/" in k)
ok = len(ref) == len(z3) == 3 and worst < 1e-5
for k in ("chosen", "rejected"):
    r = ref[0]["logps/" + k] - ref[0]["rewards/" + k] / 0.1
    e4, e32 = q4[0]["logps/" + k], f32[0]["logps/" + k]
    print(f"reference logps/{k} {r:.9g}: 4-bit base {e4:.9g}, float32 base {e32:.9g}")
    ok = ok and abs(r - e4) <= 1e-6 * abs(e4) and abs(r - e32) > 1e-3 * abs(e32)
print("QLoRA DPO: zero3 against one rank, metrics' worst", worst, "margins", [x["rewards/margins"] for x in ref])
sys.exit(not (ok and ref[0]["rewards/margins"] != 0))
PYEOF
# shellcheck disable=SC2086
expect_fail_with 2 "model.quantization_bit = 4 with pref.ref_model is not available yet" lora.cfg $q4 \
    pref.ref_model=$HF/qlora-llama
