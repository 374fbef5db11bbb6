#!/bin/sh
# bench-ab.sh BUILD_A BUILD_B [REPS] — two ztrain builds alternately on the same job, to tell a
# regression from this machine's run-to-run noise (10% on a shared VM): GPT-2 124M (B=4, T=64)
# on 2 ranks, ddp and zero3, REPS rounds (default 2) of A then B. Prints tokens/s (median step of
# steps 3-10) and the loss at step 10, which must agree to the last digit when the maths is the
# same. Needs data/train.h5 (tools/gen-data.sh).
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bench-ab.sh BUILD_A BUILD_B [REPS]" >&2; exit 2; }
A=$1 B=$2 REPS=${3:-2}
for b in "$A" "$B"; do [ -x "$b/ztrain" ] || { echo "bench-ab.sh: no $b/ztrain" >&2; exit 2; }; done
[ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rep=1
while [ "$rep" -le "$REPS" ]; do
    for b in "$A" "$B"; do
        for st in ddp zero3; do
            d="$out/run"
            rm -rf "$d"
            mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np 2 \
                "$b/ztrain" inputs/gpt2-124m.cfg model.vocab_size=50257 train.per_device_train_batch_size=4 \
                data.seq_len=64 parallel.strategy=$st data.train_files=data/train.h5 data.val_files=[] \
                train.max_steps=10 train.logging_steps=1 train.sample_tokens=0 checkpoint.save_at_end=false \
                train.output_dir="$d" >"$out/log" 2>&1 || { tail -3 "$out/log" >&2; exit 1; }
            /usr/bin/python3 - "$d/metrics.jsonl" "$b" "$st" "$rep" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step_s" in r][2:]
med = statistics.median(r["step_s"] for r in steps)
print(f"{sys.argv[2]:30s} {sys.argv[3]:6s} round {sys.argv[4]}: "
      f"{steps[0]['tokens_seen'] / steps[0]['step'] / med:7.1f} tok/s, loss {steps[-1]['loss']:.4f}")
PY
        done
    done
    rep=$((rep + 1))
done
