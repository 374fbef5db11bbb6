#!/bin/sh
# bench-lora.sh [BUILDDIR] — LoRA's speed, side by side in one run, on the ~125M
# Llama-style model of tools/bench-llama.sh (L=12, C=768, 12 heads, 4 KV heads, MLP 2048,
# vocabulary 32000, untied; B=4, T=128, fp32, one rank, one thread):
#   ztrain full fine-tuning, ztrain LoRA (rank 8, every linear), PEFT + transformers LoRA
#   (the same, torch's eager CPU), in alternating rounds (ROUNDS, default 3): this VM's
#   speed drifts by 10-25% over minutes, so each round's ratios are printed beside the means.
# Targets: ztrain LoRA <= 0.7x ztrain full's step time; ztrain LoRA >= 1.3x PEFT's tokens/s.
# Prints the median step time of the steps after WARMUP of each run, and the memory
# the shard engine measured (gradients, optimizer) beside the estimate.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
PY=${PY:-$HOME/.cache/ztrain-venv/bin/python}
[ -x "$PY" ] || sh tools/make-venv.sh
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
V=32000 T=128
DATA=data/llama-rand-32k.h5
"$PY" tools/rand_tokens.py "$DATA" $(( (STEPS + WARMUP) * 4 * T + 1 )) "$V"
LLAMA="inputs/tiny.cfg model.arch=llama model.n_layer=12 model.n_embd=768 model.n_head=12 model.n_kv_head=4
 model.head_dim=64 model.intermediate_size=2048 model.vocab_size=$V model.block_size=$T model.tie_word_embeddings=false
 data.seq_len=$T train.per_device_train_batch_size=4 data.train_files=$DATA data.val_files=[] train.logging_steps=1
 train.sample_tokens=0 checkpoint.save_at_end=false checkpoint.save_hf=false train.max_steps=$((STEPS + WARMUP))"
echo "LoRA benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
     "flags:$(for f in avx2 avx512f avx512_bf16; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done);" \
     "load $(uptime | sed 's/.*load average: //')"
zt() { # NAME ARGS: median step seconds, grads and optimizer bytes measured and estimated
    name=$1; shift
    # shellcheck disable=SC2086
    "$B/ztrain" $LLAMA "$@" train.output_dir="$out/$name" >"$out/$name.log" 2>&1 || { tail -3 "$out/$name.log" >&2; echo 0; return; }
    "$PY" - "$out/$name/metrics.jsonl" "$WARMUP" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
st = [r["step_s"] for r in recs if "step_s" in r][int(sys.argv[2]):]
m = next(r for r in recs if r.get("summary"))["memory_measured"]
e = next(r for r in recs if r.get("start"))["memory_estimate"]
print(f"{statistics.median(st):.3f} {m['grads']} {m['optimizer']} {e['grads']} {e['optimizer']}")
PY
}
pt() {
    # shellcheck disable=SC2086
    "$PY" tools/torch_llama.py --threads 1 --layers 12 --dim 768 --heads 12 --kv-heads 4 --head-dim 64 \
        --intermediate 2048 --vocab $V --seq $T --batch 4 --data $DATA --lora 8 --steps "$STEPS" --warmup "$WARMUP" \
        >"$out/$1.log" 2>&1 || { tail -3 "$out/$1.log" >&2; echo 0; return; }
    sed -n 's/^tokens_per_s [0-9.]* median_step_s \([0-9.]*\).*/\1/p' "$out/$1.log"
}
printf '%-6s %-22s %10s %10s %14s %14s\n' round side "step s" "tok/s" "grads B (est)" "optim B (est)"
i=1 full="" lora="" peft=""
while [ "$i" -le "$ROUNDS" ]; do
    set -- $(zt full$i); f=$1; printf '%-6s %-22s %10s %10.1f %14s %14s\n' $i "ztrain full" $1 "$(awk "BEGIN{print 512/$1}")" "$2 ($4)" "$3 ($5)"
    set -- $(zt lora$i train.finetuning_type=lora lora.rank=8); l=$1; printf '%-6s %-22s %10s %10.1f %14s %14s\n' $i "ztrain LoRA r8" $1 "$(awk "BEGIN{print 512/$1}")" "$2 ($4)" "$3 ($5)"
    p=$(pt peft$i); printf '%-6s %-22s %10s %10.1f\n' $i "PEFT+transformers r8" "$p" "$(awk "BEGIN{print 512/$p}")"
    full="$full $f" lora="$lora $l" peft="$peft $p"
    i=$((i + 1))
done
awk -v f="$full" -v l="$lora" -v p="$peft" 'BEGIN {
    nf = split(f, a, " "); split(l, b, " "); split(p, c, " ");
    for (k = 1; k <= nf; k++) {
        printf "round %d: LoRA / full %.2f, LoRA / PEFT speed %.2fx\n", k, b[k] / a[k], c[k] / b[k];
        F += a[k]; L += b[k]; P += c[k] }
    F /= nf; L /= nf; P /= nf;
    printf "mean: LoRA / full step time %.2f (target <= 0.70); ztrain LoRA / PEFT speed %.2fx (target >= 1.3x)\n", L / F, P / L }'
echo "load at end: $(uptime | sed 's/.*load average: //')"
