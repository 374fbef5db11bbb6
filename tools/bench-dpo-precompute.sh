#!/bin/sh
# bench-dpo-precompute.sh [BUILDDIR] — the reference's share of a DPO run over EPOCHS epochs
# (default 3) with pref.precompute_ref_log_probs and without, ztrain alone (no LLaMA-Factory
# needed): bench-dpo's model widths as a Llama directory made by tests/mpi/hf_dir.py (L12, C768,
# 12 heads, 4 KV heads, head_dim 64, MLP 2048, 32000 vocabulary rows; untied, no q/k norms:
# bench-dpo's Qwen3 is tied and has them), PAIRS pairs (default 4) of two 448-token rows of a
# token file (every position a response token), 2 pairs a step, LoRA r8 on every linear, fp32,
# 1 rank x 1 thread. Prints each run's summary lines (the reference passes against the
# policy's forward + backward, wall and main-thread CPU time) and seconds per step; the
# runs' losses and rewards must be equal (the table reads what the first epoch computed).
# WORK: the work directory (default a new temporary one); PYTHON3: a python with numpy and h5py
# (tests/mpi/hf_dir.py's needs; default python3).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
EPOCHS=${EPOCHS:-3}
PAIRS=${PAIRS:-4}
ZT=$(cd "$B" && pwd)/ztrain
SRC=$(pwd)
PY=${PYTHON3:-python3}
work=${WORK:-$(mktemp -d)}
cd "$work"
[ -d llama-l12 ] || "$PY" "$SRC/tests/mpi/hf_dir.py" llama llama-l12 32000 768 12 12 4 64 2048
"$PY" "$SRC/tests/mpi/hf_dir.py" tokens pairs.h5 32000 $((PAIRS * 2 * 448 + 1))
cat >dpo.cfg <<CFG
model = { name_or_path = "llama-l12"; };
data = { train_files = "pairs.h5"; val_files = []; seq_len = 448; shuffle = false; };
train = { stage = "dpo"; per_device_train_batch_size = 2; num_train_epochs = $EPOCHS.0; logging_steps = 1;
          sample_tokens = 0; finetuning_type = "lora"; threads = 1; };
lora = { rank = 8; target = ["all"]; };
optim = { learning_rate = 1e-4; warmup_steps = 0; };
checkpoint = { save_at_end = false; save_hf = false; };
log = { plot = false; };
CFG
echo "bench-dpo-precompute — $(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
     "flags:$(for f in avx2 avx512f; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done);" \
     "$PAIRS pairs, $EPOCHS epochs, work dir $work"
for pc in true false; do
    echo "pref.precompute_ref_log_probs=$pc: load $(uptime | sed 's/.*load average: //')"
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$ZT" dpo.cfg pref.precompute_ref_log_probs=$pc train.output_dir=pc-$pc \
        >pc-$pc.log 2>&1 || { tail -3 pc-$pc.log; exit 1; }
    grep "summary: dpo" pc-$pc.log
    python3 -c "import json, sys; print('  s/step', [round(json.loads(l)['step_s'], 2) for l in open(sys.argv[1]) if 'step_s' in l])" \
        pc-$pc/metrics.jsonl
done
echo "load at the end $(uptime | sed 's/.*load average: //')"
python3 - <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f"pc-{x}/metrics.jsonl") if '"step_s"' in l] for x in ("true", "false"))
same = len(a) == len(b) > 0 and all(x[k] == y[k] for x, y in zip(a, b) for k in x if k == "loss" or k.startswith("rewards/"))
print("losses and rewards equal:", same)
sys.exit(not same)
PY
