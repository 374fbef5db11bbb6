#!/bin/sh
# bench-pp.sh [BUILD [STEPS [REPEAT]]] — pipeline parallelism side by side with the other ways
# of running GPT-2 124M (inputs/gpt2-124m.cfg, fp32, B=4, T=64, gradient accumulation 8, random
# tokens) on 2 ranks of this machine: pp 2 under gpipe, 1f1b and interleaved_1f1b (v = 2)
# beside ddp 2, zero3 2 and tp 2, back to back, REPEAT times (default 1) in turn, STEPS steps
# each (default 3; the first is left out as warm-up). Prints per run the median step time,
# the tokens a step trains (a pipeline and tp have one data rank: half of ddp's batch), tokens
# per second, and the bytes a step moves (rank 0's, all groups); for the pipelines the bubble
# each rank measured (the share of the slowest rank's schedule time it does not compute:
# blocked in receives, in the sends' completion at the step's end, or done early; from the
# run's "summary: pipeline" line, from each run's second step) beside
# (pp - 1) / (m + pp - 1) / v, and the sends' wait alone; then each rank's compute a step and
# the formula stretched by their imbalance (a schedule that adds no wait of its own measures
# 1 - (1 - formula) mean / max of the ranks' compute), and the measured bubble against it. The stages are balanced by
# parallel.pp_layers_per_stage: the head (768 x 50257) costs about 5.5 blocks, so pp 2 splits
# the 14 layers (embedding, 12 blocks, head) 10 | 4 and the interleaved run 6 | 3 | 4 | 1
# (rank 0: stages 0 and 2, rank 1: 1 and 3). gpipe runs the head's forward in the last
# stage's forwards (parallel.pp_head_split's default); PP_ARGS (e.g.
# parallel.pp_head_split=false) is added to every pipeline run.
# BALANCED=1 measures the schedules' bubble where the stages can be equal: the formula
# assumes stages of equal work, and GPT-2 124M's head (5.5 blocks) leaves a block's
# difference between the ranks at any split. The model is GPT-2 124M's width with 15 blocks
# and a vocabulary of 9216 tokens (a head of 768 x 9216 costs one block), split 9 | 8 at pp 2
# (the embedding and 8 blocks; 7 blocks and the head) and 5 | 4 | 4 | 4 interleaved (four
# stages of four blocks' work, each rank eight); BAL_V sets another vocabulary (a lighter
# or heavier head) for the same split.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build} STEPS=${2:-3} REPEAT=${3:-1}
[ -x "$B/ztrain" ] || { echo "bench-pp.sh: no $B/ztrain" >&2; exit 2; }
PY=/usr/bin/python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
V=50257 model="" split2="[10,4]" split4="[6,3,4,1]" DATA=${ZT_BENCH_DATA:-data/bench-gpt2-tokens.h5}
if [ "${BALANCED:-0}" = 1 ]; then
    V=${BAL_V:-9216} model="model.n_layer=15 model.vocab_size=${BAL_V:-9216}" split2="[9,8]" split4="[5,4,4,4]"
    DATA=${ZT_BENCH_DATA:-data/bench-gpt2-v${BAL_V:-9216}-tokens.h5}
fi
"$PY" tools/rand_tokens.py "$DATA" $(( (STEPS + 2) * 2 * 8 * 4 * 64 + 1 )) "$V"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
pp="parallel.pipeline_parallel_size=2 ${PP_ARGS:-}"
RUNS=${RUNS:-ddp zero3 tp pp-gpipe pp-1f1b pp-interleaved}
echo "bench-pp.sh: GPT-2 124M${model:+ ($model)}, 2 ranks, B=4 T=64 accumulation 8, $STEPS steps x $REPEAT; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
rep=1
while [ "$rep" -le "$REPEAT" ]; do
    for run in $RUNS; do
        case $run in
            ddp) args="parallel.strategy=ddp" ;;
            zero3) args="parallel.strategy=zero3" ;;
            tp) args="parallel.tensor_parallel_size=2" ;;
            pp-gpipe) args="$pp parallel.pp_schedule=gpipe parallel.pp_layers_per_stage=$split2" ;;
            pp-1f1b) args="$pp parallel.pp_schedule=1f1b parallel.pp_layers_per_stage=$split2" ;;
            pp-interleaved) args="$pp parallel.pp_schedule=interleaved_1f1b parallel.pp_stages_per_rank=2
                parallel.pp_layers_per_stage=$split4" ;;
            *) echo "bench-pp.sh: unknown run $run" >&2; exit 2 ;;
        esac
        # shellcheck disable=SC2086
        mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np 2 \
            "$B/ztrain" inputs/gpt2-124m.cfg $model data.train_files="$DATA" data.val_files=[] train.eval_steps=0 \
            train.sample_tokens=0 train.max_steps="$STEPS" train.gradient_accumulation_steps=8 \
            checkpoint.save_at_end=false checkpoint.save_hf=false $args train.output_dir="$out/$run-$rep" \
            >"$out/$run-$rep.log" 2>&1 || { tail -5 "$out/$run-$rep.log" >&2; exit 1; }
    done
    rep=$((rep + 1))
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$out" "$REPEAT" $RUNS <<'PY'
import json, re, statistics, sys
d, repeat, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for name in runs:
    after, pipe = [], []
    for k in range(1, repeat + 1):
        recs = [json.loads(l) for l in open(f"{d}/{name}-{k}/metrics.jsonl")]
        after += [r for r in recs if "step_s" in r and r["step"] >= 2]
        log = open(f"{d}/{name}-{k}.log").read()
        m = re.search(r"summary: pipeline .*", log)
        if m: pipe.append(m.group(0))
    med = lambda f: statistics.median(f(r) for r in after)
    t = med(lambda r: r["step_s"])
    moved = med(lambda r: sum(c["bytes"] for k, c in r["comm"].items() if k != "groups"))
    tps = med(lambda r: r["tokens_per_s"])
    print(f"{name:15s} step {t:7.2f} s  {tps:7.0f} tok/s  {moved / 1e6:8.2f} MB a step (rank 0)")
    for p in pipe:
        ideal = float(re.search(r"ideal bubble ([0-9.]+)", p).group(1))
        waits = re.findall(r"rank (\d+): schedule ([0-9.]+) s/step, receive wait ([0-9.]+) s/step \(([0-9.]+)\), "
                           r"send wait ([0-9.]+) s/step, bubble ([0-9.]+)", p)
        mean = float(re.search(r"measured bubble \(mean\) ([0-9.]+)", p).group(1))
        per = ", ".join(f"rank {w[0]} {float(w[5]):.3f} (send wait {float(w[4]) * 1e3:.1f} ms of {float(w[1]):.2f} s)"
                        for w in waits)
        print(f"{'':15s} bubble measured {mean:.3f} (ideal {ideal:.3f}, ratio {mean / ideal:.2f}): {per}")
        # The formula assumes ranks of equal work. The slowest rank paces the step, so ranks
        # that compute C_k a step leave a bubble of 1 - (1 - ideal) mean(C) / max(C) with a
        # schedule that adds nothing; the ratio against that is the schedule's own cost.
        comp = [float(w[1]) - float(w[2]) - float(w[4]) for w in waits]
        at = 1 - (1 - ideal) * statistics.mean(comp) / max(comp)
        print(f"{'':15s} ranks' compute {', '.join(f'{x:.2f}' for x in comp)} s a step "
              f"(the largest {max(comp) / statistics.mean(comp) - 1:.1%} above their mean): "
              f"formula at that imbalance {at:.3f}, measured {mean / at:.2f}x it")
PY
