#!/bin/sh
# bench-qlora.sh [BUILDDIR] — QLoRA's speed, side by side in one run, on the ~125M Llama-style
# model of tools/bench-llama.sh (L=12, C=768, 12 heads, 4 KV heads, MLP 2048, vocabulary 32000,
# untied; B=4, T=128, one rank, one thread), LoRA rank 8 (alpha 16) on every linear:
#   ztrain LoRA on the float32 base, ztrain QLoRA (model.quantization_bit = 4: nf4, double
#   quantization, dequantized to float32 before each GEMM), and PEFT on transformers'
#   bitsandbytes 4-bit base (BitsAndBytesConfig load_in_4bit, nf4, double quantization, compute
#   dtype float32; torch's eager CPU), in alternating rounds (ROUNDS, default 3): the speed of a
#   shared VM drifts by 10-25% over minutes, so each round's ratios are printed beside the means.
# All three start from one Hugging Face directory of random weights that tools/torch_llama.py
# writes (save_pretrained) and ztrain reads (model.name_or_path), and train on one token file.
# Targets: ztrain QLoRA step <= 1.25x ztrain LoRA's; ztrain QLoRA >= 1.5x PEFT + bitsandbytes'
# tokens/s. Figures: the median step time of the steps after WARMUP of each run (ztrain:
# step_s of metrics.jsonl; PEFT: perf_counter around zero_grad + forward + backward + clip +
# AdamW step, tools/torch_llama.py), and the median CPU seconds of a step (ztrain: its
# process's utime + stime between two step records; PEFT: time.process_time around the step),
# which a loaded machine does not inflate.
# Environment: STEPS (6), WARMUP (2), ROUNDS (3), PY (a python with torch, transformers, peft
#   and bitsandbytes: ~/.cache/bnb-venv, tests/reference/README.md).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
PY=${PY:-$HOME/.cache/bnb-venv/bin/python}
"$PY" -c "import bitsandbytes, peft, transformers, torch" 2>/dev/null ||
    { echo "bench-qlora.sh: $PY lacks torch, transformers, peft or bitsandbytes (tests/reference/README.md)" >&2; exit 1; }
[ -x "$B/ztrain" ] || { echo "bench-qlora.sh: $B/ztrain not found: sh tools/build.sh $B" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
V=32000 T=128
DATA=data/llama-rand-32k.h5
HFDIR="$out/llama-125m"
"$PY" tools/rand_tokens.py "$DATA" $(( (STEPS + WARMUP) * 4 * T + 1 )) "$V"
TORCH="tools/torch_llama.py --threads 1 --layers 12 --dim 768 --heads 12 --kv-heads 4 --head-dim 64
 --intermediate 2048 --vocab $V --seq $T --batch 4 --data $DATA --lora 8 --hf-dir $HFDIR"
# the directory, written once (random weights, seed 1337) before the first timed run
# shellcheck disable=SC2086
"$PY" $TORCH --steps 0 --warmup 0 >"$out/write.log" 2>&1 || { tail -3 "$out/write.log" >&2; exit 1; }
# the model's shape is the directory's: the input file names none
cat >"$out/qlora.cfg" <<'EOF'
data = { val_files = []; };
train = { logging_steps = 1; sample_tokens = 0; finetuning_type = "lora"; };
lora = { rank = 8; alpha = 16.0; };
checkpoint = { save_at_end = false; save_hf = false; };
parallel = { strategy = "ddp"; };
log = { plot = false; };
EOF
ZT="$out/qlora.cfg model.name_or_path=$HFDIR data.seq_len=$T train.per_device_train_batch_size=4
 data.train_files=$DATA train.max_steps=$((STEPS + WARMUP))"
echo "QLoRA benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
     "flags:$(for f in avx2 avx512f avx512_bf16; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done);" \
     "load $(uptime | sed 's/.*load average: //')"
echo "peer: $("$PY" -c 'import torch, transformers, peft, bitsandbytes as b; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__, "bitsandbytes", b.__version__)')"
zt() { # NAME ARGS: median wall and CPU seconds of a step
    name=$1; shift
    # shellcheck disable=SC2086
    "$PY" - "$out/$name" "$WARMUP" "$B/ztrain" $ZT "$@" train.output_dir="$out/$name" <<'PY' || { tail -3 "$out/$name.log" >&2; echo "0 0"; }
# the process's CPU seconds (/proc/PID/stat utime + stime) each time metrics.jsonl gains a step
import os, statistics, subprocess, sys, time
d, warm, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
p = subprocess.Popen(cmd, stdout=open(d + ".log", "w"), stderr=subprocess.STDOUT)
tick, marks, seen = os.sysconf("SC_CLK_TCK"), {}, 0
while p.poll() is None:
    try:
        n = sum('"step_s"' in l for l in open(d + "/metrics.jsonl"))
    except OSError:
        n = 0
    if n > seen:
        try:
            f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
            marks[n] = (int(f[11]) + int(f[12])) / tick
        except OSError:
            pass
        seen = n
    time.sleep(0.05)
if p.returncode:
    sys.exit(1)
import json
wall = [json.loads(l)["step_s"] for l in open(d + "/metrics.jsonl") if '"step_s"' in l][warm:]
cpu = [marks[k] - marks[k - 1] for k in sorted(marks) if k > warm and k - 1 in marks]
print(f"{statistics.median(wall):.3f} {statistics.median(cpu) if cpu else 0:.3f}")
PY
}
pt() {
    # shellcheck disable=SC2086
    "$PY" $TORCH --qlora nf4 --steps "$STEPS" --warmup "$WARMUP" >"$out/$1.log" 2>&1 || { tail -3 "$out/$1.log" >&2; echo "0 0"; return; }
    grep -q "Linear4bit" "$out/$1.log" || { echo "bench-qlora.sh: PEFT's base is not 4-bit" >&2; echo "0 0"; return; }
    sed -n 's/^tokens_per_s [0-9.]* median_step_s \([0-9.]*\) median_cpu_s \([0-9.]*\).*/\1 \2/p' "$out/$1.log"
}
row() { printf '%-6s %-28s %10s %10s %10.1f %10.1f\n' "$1" "$2" "$3" "$4" "$(awk "BEGIN{print 4 * $T / $3}")" "$(awk "BEGIN{print 4 * $T / $4}")"; }
printf '%-6s %-28s %10s %10s %10s %10s\n' round side "step s" "CPU s" "tok/s" "tok/CPU s"
i=1 lora="" qlora="" peft=""
while [ "$i" -le "$ROUNDS" ]; do
    set -- $(zt lora$i); row $i "ztrain LoRA r8" "$1" "$2"; l="$1:$2"
    set -- $(zt qlora$i model.quantization_bit=4); row $i "ztrain QLoRA r8 (nf4)" "$1" "$2"; q="$1:$2"
    set -- $(pt peft$i); row $i "PEFT+bitsandbytes r8 (nf4)" "$1" "$2"; p="$1:$2"
    lora="$lora $l" qlora="$qlora $q" peft="$peft $p"
    i=$((i + 1))
done
grep -h "^qlora:" "$out/qlora1.log" || true
# the ratios by wall time and by CPU time: on a machine shared with other jobs the wall time of
# a one-thread process is its CPU time plus however long it waited, and only the first is its own
awk -v l="$lora" -v q="$qlora" -v p="$peft" 'BEGIN {
    n = split(l, a, " "); split(q, b, " "); split(p, c, " ");
    for (k = 1; k <= n; k++) {
        split(a[k], A, ":"); split(b[k], Q, ":"); split(c[k], P, ":");
        printf "round %d: QLoRA / LoRA step %.2f (CPU %.2f), ztrain QLoRA / PEFT+bitsandbytes speed %.2fx (CPU %.2fx)\n",
            k, Q[1] / A[1], Q[2] / A[2], P[1] / Q[1], P[2] / Q[2];
        LW += A[1]; LC += A[2]; QW += Q[1]; QC += Q[2]; PW += P[1]; PC += P[2] }
    printf "mean: QLoRA / LoRA step %.2f, CPU %.2f (target <= 1.25); ztrain QLoRA / PEFT+bitsandbytes speed %.2fx, CPU %.2fx (target >= 1.5x)\n",
        QW / LW, QC / LC, PW / QW, PC / QC }'
echo "load at end: $(uptime | sed 's/.*load average: //')"
