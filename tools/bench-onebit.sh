#!/bin/sh
# bench-onebit.sh [BUILD [NP]] — 1-bit Adam against AdamW on the default job (inputs/default.cfg,
# 800 steps) at NP ranks (default 2), optim.freeze_step at 20% of the steps (160). Prints each
# run's final validation loss and the gradient bytes a step moves after the freeze, and exits 1
# when 1-bit Adam's final validation loss is more than 2% above AdamW's. About 10 minutes a run
# on 2 cores. Needs data/train.h5 and data/val.h5 (tools/gen-data.sh).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build} NP=${2:-2}
[ -x "$B/ztrain" ] || { echo "bench-onebit.sh: no $B/ztrain" >&2; exit 2; }
[ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for opt in adamw onebit_adam; do
    mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np "$NP" \
        "$B/ztrain" inputs/default.cfg optim.type=$opt optim.freeze_step=160 train.sample_tokens=0 \
        checkpoint.save_at_end=false train.output_dir="$out/$opt" >"$out/$opt.log" 2>&1 ||
        { tail -3 "$out/$opt.log" >&2; exit 1; }
done
PY=/usr/bin/python3
"$PY" - "$out/adamw/metrics.jsonl" "$out/onebit_adam/metrics.jsonl" <<'PY'
import json, sys
def run(path):
    recs = [json.loads(l) for l in open(path)]
    val = [r["val_loss"] for r in recs if "val_loss" in r][-1]
    logged = [r for r in recs if "comm" in r]     # counters of a logging window
    last, steps = logged[-1]["comm"], logged[-1]["step"] - logged[-2]["step"]
    return val, sum(last[k]["bytes"] for k in ("all_reduce", "all_to_all", "all_gather")) / steps
(va, ba), (vo, bo) = run(sys.argv[1]), run(sys.argv[2])
print(f"AdamW       final validation loss {va:.4f}, {ba:.0f} gradient bytes a step")
print(f"1-bit Adam  final validation loss {vo:.4f}, {bo:.0f} bytes a step after the freeze "
      f"({bo / ba:.4f} of AdamW's); {100 * (vo / va - 1):+.2f}%")
sys.exit(0 if vo <= 1.02 * va else 1)
PY
