#!/bin/sh
# pp.sh — pipeline parallelism trains the same model as one rank with accumulation.
#  1. GPT-2 (tied embedding and head: the root unit's gradients summed between the first
#     and the last stage) and a Llama GQA model (untied head): pp 2 on 2 ranks and
#     pp 2 x dp 2 on 4 ranks, under gpipe and 1f1b (ddp), pp 2 x dp 2 under zero1, zero2 and
#     zero3 (1f1b), and interleaved_1f1b with 2 stages per
#     rank and pp 4 on 4 ranks (4 stages of one layer each: the embedding, two blocks, the
#     head), 20 steps with
#     clipping active at every step (the global norm over the stages): losses (the last
#     stage's, logged by rank 0) and final parameters within 1e-5 of one rank.
#     pp 2 x tp 2 (and tp_sequence_parallel), pp 2 x Ulysses / ring sp 2, LoRA (dropout) at
#     pp 2 and pp 2 x zero3.
#     SFT rows (the loss a mean over the global batch's loss-bearing tokens, rows trimmed
#     after their last target alike on every stage) with validation, at pp 2 and pp 2 x dp 2.
#  2. The checkpoint stays mesh-independent: pp 2 -> 1 rank, and 1 rank -> pp 2 x dp 2,
#     each 10 + 10 steps against 20 at once.
#     The same pp 2 (1f1b, interleaved) with its messages issued in the device (NCCL)
#     order (ZT_P2P_IN_ORDER=1): bit-identical to MPI's order.
#  3. Accounting: the pp group's point-to-point bytes per step are exactly the formula
#     (a message of B T C floats per micro-batch per stage boundary a rank's stages touch,
#     each way, and the root unit's gradient between the first and the last stage), and
#     the first line prints the mesh with pp; the activations stage 0 allocates: pp
#     micro-batches' of its layers under 1F1B, all M under GPipe. ZT_PP_TRACE's files
#     and tools/pp-trace.py: each stage's 6 forwards and backwards a step.
#  4. Refusals, on every rank with one line: layers per stage that do not sum to the
#     model, pp larger than the layers, fewer micro-batches than pp under 1f1b, what the
#     pipeline does not run with yet (optimizer offload, 1-bit Adam).
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup
common="$common model.vocab_size=260 optim.max_grad_norm=0.05 checkpoint.save_hf=false"
llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 model.tie_word_embeddings=false"
pp2="parallel.pipeline_parallel_size=2"

# ---- 1. pp 2 and pp 2 x dp 2 under each schedule match one rank ------------------------
for fam in gpt2 llama; do
    case $fam in gpt2) arch="" ;; llama) arch=$llama ;; esac
    # shellcheck disable=SC2086
    run_ztrain 1 $common $arch $(batch_args 1) train.output_dir="$fam-ref" >/dev/null
    runs=""
    for sch in gpipe 1f1b; do
        # GPT-2 under gpipe writes its per-action trace too (checked in 3.)
        ZT_PP_TRACE=""
        [ "$fam-$sch" = gpt2-gpipe ] && ZT_PP_TRACE="$PWD/trace-gpipe"
        export ZT_PP_TRACE
        # shellcheck disable=SC2086
        run_ztrain 2 $common $arch $(batch_args 1) $pp2 parallel.pp_schedule=$sch train.output_dir="$fam-pp2-$sch" \
            >/dev/null
        unset ZT_PP_TRACE
        # shellcheck disable=SC2086
        run_ztrain 4 $common $arch $(batch_args 2) $pp2 parallel.pp_schedule=$sch \
            train.output_dir="$fam-pp2dp2-$sch" >/dev/null
        runs="$runs $fam-pp2-$sch $fam-pp2dp2-$sch"
    done
    assert_contains "$ZT_OUT" "mesh tp 1 x sp 1 x dp 2 x pp 2"
    # the zero strategies shard each pipeline rank's state over its data ranks alike
    for st in zero1 zero2 zero3; do
        # shellcheck disable=SC2086
        run_ztrain 4 $common $arch $(batch_args 2) $pp2 parallel.strategy=$st train.output_dir="$fam-pp2dp2-$st" \
            >/dev/null
        runs="$runs $fam-pp2dp2-$st"
    done
    # shellcheck disable=SC2086
    run_ztrain 2 $common $arch $(batch_args 1) $pp2 parallel.pp_schedule=interleaved_1f1b \
        parallel.pp_stages_per_rank=2 train.output_dir="$fam-pp2-il" >/dev/null
    # pp 4: a stage per layer, two of them blocks between ranks
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 1) parallel.pipeline_parallel_size=4 train.output_dir="$fam-pp4" >/dev/null
    # shellcheck disable=SC2086
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "$fam-ref" $runs "$fam-pp2-il" "$fam-pp4" ||
        fail "$fam: pipeline parallelism diverged from one rank"
done
echo "pp: gpt2 and llama at pp 2 and pp 2 x dp 2 (gpipe, 1f1b; ddp, zero1, zero2, zero3) and interleaved v 2 match one rank"
# the device (NCCL) issue order on MPI: ZT_P2P_IN_ORDER=1 makes the step issue its messages
# as a stream-ordered backend must (zt_schedule_plan_in_order's batches at their places in
# the list, tag 0 so a pair's messages match in issue order, each batch waited for whole
# before the next compute); the same sums in the same order as MPI's own order: bit-identical
for run in "1f1b parallel.pp_schedule=1f1b" \
    "il parallel.pp_schedule=interleaved_1f1b parallel.pp_stages_per_rank=2"; do
    set -- $run
    name=$1
    shift
    # shellcheck disable=SC2086
    ZT_P2P_IN_ORDER=1 run_ztrain 2 $common $(batch_args 1) $pp2 "$@" train.output_dir="gpt2-pp2-$name-ord" >/dev/null
    assert_contains "$ZT_OUT" "pipeline: mpi messages in stream order"
done
# (the interleaved lists deadlock in issue order unless receives move: they did)
grep "pipeline: mpi messages in stream order" "$ZT_OUT" | grep -q ", 0 receives" &&
    fail "interleaved pp 2 in stream order moved no receive"

"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" gpt2-pp2-1f1b gpt2-pp2-1f1b-ord --loss-tol 0 --param-tol 0 &&
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" gpt2-pp2-il gpt2-pp2-il-ord --loss-tol 0 --param-tol 0 ||
    fail "the stream-ordered issue of the pipeline's messages changed the training"
echo "pp: pp 2 (1f1b, interleaved v 2) with its messages in the device's stream order matches MPI's order bit for bit"
# parallel.pp_layers_per_stage: a stage of the embedding alone, and one of the head alone
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 1) $pp2 "parallel.pp_layers_per_stage=[1,3]" train.output_dir=lps13 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 1) $pp2 "parallel.pp_layers_per_stage=[3,1]" train.output_dir=lps31 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" gpt2-ref lps13 lps31 || fail "pp_layers_per_stage diverged from one rank"


# SFT: the loss over the global batch's loss-bearing tokens, counted alike on every stage
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" sft sft.h5 67 200 || fail "cannot make the SFT file"
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" sft val.h5 67 40 || fail "cannot make the SFT file"
sft="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=32
  model.intermediate_size=48 model.vocab_size=67 model.block_size=32 data.train_files=sft.h5 data.val_files=val.h5
  data.seq_len=24 train.max_steps=12 train.eval_steps=6 train.eval_batches=2 train.logging_steps=1
  train.sample_tokens=0 checkpoint.save_hf=false log.plot=false optim.learning_rate=3e-3 optim.max_grad_norm=0.05"
# shellcheck disable=SC2086
run_ztrain 1 $sft train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 train.output_dir=sft-ref \
    >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $sft train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 $pp2 \
    train.output_dir=sft-pp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $sft train.per_device_train_batch_size=1 train.gradient_accumulation_steps=2 $pp2 \
    train.output_dir=sft-pp2dp2 >/dev/null
assert_contains "$ZT_OUT" "validation loss"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" sft-ref sft-pp2 sft-pp2dp2 || fail "SFT under a pipeline diverged"
# evaluation runs through the stages (each rank holds its own): the validation losses too
# (at pp 2: train.eval_batches are per data rank, so dp 2 evaluates other rows)
"$PY" - sft-ref sft-pp2 <<'PYEOF' || fail "validation under a pipeline differs from one rank's"
import json, sys
val = [[json.loads(l)["val_loss"] for l in open(d + "/metrics.jsonl") if '"val_loss"' in l] for d in sys.argv[1:]]
assert len(val[0]) == 2 and len(val[1]) == 2, val
assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(val[1], val[0])), val
print("validation losses at pp 2:", val[1], "one rank:", val[0])
PYEOF
echo "pp: SFT rows at pp 2 and pp 2 x dp 2 match one rank"

# with the other axes and LoRA: pp 2 x tp 2 (tp_sequence_parallel too: each tp rank sends its
# rows), pp 2 x Ulysses and ring sp 2 (each sp rank its chunk), LoRA with dropout at pp 2 and
# pp 2 x zero3 (each stage rank holds and steps its blocks' adapters, the frozen base untouched)
tiny="$common"
# shellcheck disable=SC2086
run_ztrain 4 $tiny $(batch_args 1) $pp2 parallel.tensor_parallel_size=2 train.output_dir=pp2tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $tiny $(batch_args 1) $pp2 parallel.tensor_parallel_size=2 parallel.tp_sequence_parallel=true \
    train.output_dir=pp2tps >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $tiny $(batch_args 1) $pp2 parallel.sequence_parallel_size=2 train.output_dir=pp2sp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $tiny $(batch_args 1) $pp2 parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
    train.output_dir=pp2ring >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" gpt2-ref pp2tp2 pp2tps pp2sp2 pp2ring ||
    fail "pp with tp or sp diverged from one rank"
lora="$common train.finetuning_type=lora lora.rank=4 lora.alpha=8 lora.dropout=0.1"
# shellcheck disable=SC2086
run_ztrain 1 $lora $(batch_args 1) train.output_dir=lora-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $lora $(batch_args 1) $pp2 train.output_dir=lora-pp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $lora $(batch_args 2) $pp2 parallel.strategy=zero3 train.output_dir=lora-pp2z3 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" lora-ref lora-pp2 lora-pp2z3 || fail "LoRA under a pipeline diverged"
echo "pp: pp 2 x tp 2 (tp_sequence_parallel), x Ulysses and ring sp 2, and LoRA at pp 2 and pp 2 x zero3 match one rank"

# ---- 2. resume across meshes -------------------------------------------------------------
const="optim.lr_scheduler_type=constant_with_warmup"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $const $(batch_args 1) train.output_dir=full >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $const $(batch_args 1) $pp2 train.max_steps=10 train.output_dir=split >/dev/null
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $const $(batch_args 1) checkpoint.resume=auto train.output_dir=split >/dev/null
assert_contains "$ZT_OUT" "resumed from split/ckpt-00000010"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $const $(batch_args 1) train.max_steps=10 train.output_dir=split2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $const $(batch_args 2) $pp2 parallel.pp_schedule=gpipe checkpoint.resume=auto \
    train.output_dir=split2 >/dev/null
assert_contains "$ZT_OUT" "resumed from split2/ckpt-00000010"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" full split split2 || fail "a resume across pipeline meshes diverged"
echo "pp: pp 2 -> 1 rank and 1 rank -> pp 2 x dp 2 resume as 20 steps at once"

# ---- 3. accounting: the pipeline's messages per step -------------------------------------
# rank 0's record of every step (logging_steps 1): B = 2 rows of T = 16 positions of C = 32
# floats per message, M = 6 micro-batches (batch_args 1); rank 0 holds stage 0 (1f1b: one
# boundary) or stages 0 and 2 (interleaved: three boundaries), each crossed by an
# activation and a gradient per micro-batch
# Beside them the first and the last stage sum the root unit's gradient once a step (one
# message each way of its elements: GPT-2's wte, wpe and ln_f, the tied head being the
# embedding, read from the checkpoint); no other gradient crosses the pp group
for run in "gpt2-pp2-1f1b 1" "gpt2-pp2-gpipe 1" "gpt2-pp2-il 3" "gpt2-pp2-1f1b-ord 1" "gpt2-pp2-il-ord 3"; do
    set -- $run
    "$PY" - "$1" "$2" <<'PYEOF' || fail "$1: pp bytes per step differ from the formula"
import glob, json, sys
import h5py
B, T, C, M, bounds = 2, 16, 32, 6, int(sys.argv[2])
want = 2 * bounds * M * B * T * C * 4
with h5py.File(sorted(glob.glob(sys.argv[1] + "/ckpt-*.h5"))[-1], "r") as h:
    root = sum(h["model"][k].size for k in h["model"] if ".h." not in k)
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"step_s"' in l]
assert len(recs) == 20, len(recs)
for r in recs:
    got = r["comm"]["send_recv"]["bytes"]
    assert got == want + 4 * root, (r["step"], got, want, root)
    assert r["comm"]["groups"]["pp"]["bytes"] == want + 4 * root, (r["comm"]["groups"]["pp"], want, root)
print("pp bytes per step", want, "messages +", 4 * root, "root gradient sum, as the formula, 20 steps")
PYEOF
done

# ZT_PP_TRACE: a line per action on each rank, which tools/pp-trace.py sums per stage: the
# M = 6 forwards and backwards of each stage in every step, steps 2 to 20
"$PY" "$ZT_SRCDIR/tools/pp-trace.py" trace-gpipe >trace.txt || fail "tools/pp-trace.py cannot read ZT_PP_TRACE's files"
for st in 0 1; do
    grep -qE "^  stage $st: F [0-9.]+ s/step \(6 x .*\), B [0-9.]+ s/step \(6 x " trace.txt ||
        { cat trace.txt; fail "ZT_PP_TRACE: stage $st has not 6 forwards and backwards a step"; }
done
grep -q "^rank 1: 19 steps" trace.txt || { cat trace.txt; fail "ZT_PP_TRACE: rank 1 did not trace steps 2 to 20"; }
echo "pp: ZT_PP_TRACE writes each rank's actions, and tools/pp-trace.py sums them per stage"

# the activations rank 0 allocated (stage 0, its model slots, from the summary): 1F1B holds
# at most pp micro-batches at once (2 at pp 2, 4 at pp 4), GPipe every one of the M = 6,
# each slot the activations of stage 0's layers alone (fewer at pp 4 than at pp 2, and
# fewer than the whole model's); tests/mpi/pp_memory.sh checks each stage's bytes against
# the estimate
"$PY" - gpt2-ref gpt2-pp2-1f1b gpt2-pp2-gpipe gpt2-pp4 <<'PYEOF' || fail "activations held differ from the schedule's"
import json, sys
# the summary record (a pipeline's per-rank records follow it)
act = [[json.loads(l) for l in open(d + "/metrics.jsonl") if '"final_loss"' in l][-1]["memory_measured"]["activations"]
       for d in sys.argv[1:]]
one, slot2, slot4 = act[0], act[1] // 2, act[3] // 4
assert act[1] == 2 * slot2 and act[2] == 6 * slot2 and act[3] == 4 * slot4, act
assert slot4 < slot2 < one, act
print("activations on stage 0: 1f1b pp 2 = 2, gpipe = 6 slots of", slot2, "bytes, 1f1b pp 4 = 4 of", slot4,
      "(the whole model's:", one, ")")
PYEOF

# ---- 4. refusals -------------------------------------------------------------------------
# shellcheck disable=SC2086
expect_fail_with 2 "parallel.pp_layers_per_stage sums to 3 layers; the model has 4 (2 blocks, the embedding and the head)" \
    $common $(batch_args 1) $pp2 "parallel.pp_layers_per_stage=[1,2]" train.output_dir=bad1
# shellcheck disable=SC2086
expect_fail_with 4 "parallel.pipeline_parallel_size (4) x parallel.pp_stages_per_rank (2) = 8 stages: more than the model's 4 layers" \
    $common $(batch_args 1) parallel.pipeline_parallel_size=4 parallel.pp_schedule=interleaved_1f1b \
    parallel.pp_stages_per_rank=2 train.gradient_accumulation_steps=8 train.output_dir=bad2
# shellcheck disable=SC2086
expect_fail_with 2 "parallel.pp_schedule = 1f1b: train.gradient_accumulation_steps (1) must be at least parallel.pipeline_parallel_size (2)" \
    $common $pp2 train.gradient_accumulation_steps=1 train.output_dir=bad3
echo "pp: refusals name their keys on every rank"
