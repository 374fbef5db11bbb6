#!/bin/sh
# bench-pp-dpo.sh [BUILD [BASE]] — DPO under a pipeline: bench-dpo.sh's LoRA sigmoid job
# (tools/bench-lf.sh's Qwen3 directory of about 110M parameters and its long pairs, template
# qwen3_nothink, LoRA r8 on every linear, fp32; cutoff CUTOFF, default 256) at pp 2, 1f1b,
# ACCUM micro-batches (default 4) of one pair a step, on 2 ranks of one thread each. The 14
# layers (embedding, 12 blocks, tied head of 32000 x 768, about 4 blocks' work) split 9 | 5.
# BASE: a second build (another commit's) run alternately with the same arguments, for a
# before/after on the same load. STEPS steps a run (default 3, the first left out as
# warm-up), ROUNDS rounds (default 1). Prints per run the median step time, each pipeline
# rank's bubble (time blocked in receives over its schedule's time, from the run's "summary:
# pipeline" line, over all its steps) and, where the build reports it, each rank's time in
# the reference's forwards and in the policy's forwards and backwards.
#   WORK: bench-lf.sh's work directory holding qwen3-110m/ and data/ (made by
#   `WORK=dir sh tools/bench-dpo.sh`); the runs write out/ and the dataset cache there.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build} BASE=${2:-}
STEPS=${STEPS:-3} ROUNDS=${ROUNDS:-1} ACCUM=${ACCUM:-4} CUTOFF=${CUTOFF:-256}
WORK=${WORK:?WORK: bench-lf.sh work directory (qwen3-110m/, data/)}
if [ ! -d "$WORK/qwen3-110m" ] || [ ! -f "$WORK/data/long_pairs.json" ]; then
    echo "bench-pp-dpo.sh: no qwen3-110m/ or data/long_pairs.json in $WORK (run WORK=$WORK sh tools/bench-dpo.sh)" >&2
    exit 2
fi
builds="$B${BASE:+ $BASE}"
for b in $builds; do [ -x "$b/ztrain" ] || { echo "bench-pp-dpo.sh: no $b/ztrain" >&2; exit 2; }; done
bins=""
for b in $builds; do bins="$bins $(cd "$b" && pwd)/ztrain"; done
cd "$WORK"
cat >pp-dpo.yaml <<EOF
model_name_or_path: qwen3-110m
stage: dpo
pref_loss: sigmoid
pref_beta: 0.1
dataset: long_pairs
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset_dir: data
template: qwen3_nothink
cutoff_len: $CUTOFF
preprocessing_num_workers: 1
logging_steps: 1
save_steps: 100000
overwrite_output_dir: true
report_to: none
per_device_train_batch_size: 1
gradient_accumulation_steps: $ACCUM
learning_rate: 1.0e-4
max_steps: $STEPS
lr_scheduler_type: cosine
warmup_ratio: 0.1
disable_gradient_checkpointing: true
disable_shuffling: true
EOF
echo "bench-pp-dpo: $(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
    "flags:$(for f in avx2 avx512f; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done);" \
    "pp 2 1f1b, $ACCUM micro-batches of 1 pair, cutoff $CUTOFF, $STEPS steps x $ROUNDS rounds"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    k=0
    for z in $bins; do
        k=$((k + 1))
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
            -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$z" pp-dpo.yaml train.output_dir=out/pp-dpo-b$k-r$r \
            train.sample_tokens=0 checkpoint.save_at_end=false checkpoint.save_hf=false \
            parallel.pipeline_parallel_size=2 parallel.pp_schedule=1f1b 'parallel.pp_layers_per_stage=[9,5]' \
            >"pp-dpo-b$k-r$r.log" 2>&1 || { tail -5 "pp-dpo-b$k-r$r.log" >&2; exit 1; }
    done
    r=$((r + 1))
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086 # one word per binary
python3 - "$ROUNDS" $bins <<'PY'
import json, re, statistics, sys
rounds, bins = int(sys.argv[1]), sys.argv[2:]
for k, z in enumerate(bins, 1):
    steps, bub, split = [], [], []
    for r in range(1, rounds + 1):
        recs = [json.loads(l) for l in open(f"out/pp-dpo-b{k}-r{r}/metrics.jsonl")]
        steps += [x["step_s"] for x in recs if "step_s" in x and x["step"] >= 2]
        line = re.search(r"summary: pipeline .*", open(f"pp-dpo-b{k}-r{r}.log").read()).group(0)
        bub.append([float(b) for b in re.findall(r"receive wait [0-9.]+ s/step \(([0-9.]+)\)", line)])
        split.append(re.findall(r"dpo reference ([0-9.]+) s/step, policy ([0-9.]+) s/step", line))
    print(f"{z}: step {statistics.median(steps):.2f} s (median of {len(steps)}), bubble per rank "
          + "; ".join(", ".join(f"{b:.3f}" for b in x) for x in bub)
          + ("; reference / policy s/step per rank " + "; ".join(", ".join(f"{a} / {b}" for a, b in x) for x in split)
             if any(split) else ""))
PY
