#!/bin/sh
# bench-bf16.sh [BUILDDIR] — bf16 CPU GEMMs (oneDNN) against fp32 and PyTorch, in one run.
#
# One rank, one thread (THREADS=n for more), B=4, T=64, on GPT-2 124M and the ~125M
# Llama-style model (L=12, C=768, 12 heads, 4 KV heads, intermediate 2048, vocab 32000):
#   1. the OpenBLAS sgemm peak on GPT-2's GEMM shapes (tools/bench_kernels), now;
#   2. ztrain fp32 and train.bf16 tokens/s; fp32's GFLOP/s as a share of that peak;
#   3. tools/torch_cpu_peer.py fp32 and autocast(bfloat16) at the same shapes and threads;
#   4. the ratios the issue asks for: bf16 / fp32 (target >= 1.6), bf16 / torch
#      autocast (target >= 1.3), fp32 share of the sgemm peak (target >= 90%).
# Where there are bf16 units a row with ZT_DNNL_VIEWS=off shows what reading the weights
# from the bf16 working copy (instead of rounding them per GEMM) gains.
# On a CPU without avx512_bf16 the bf16 rows print "n/a": ztrain's train.bf16 then
# computes its GEMMs in fp32 by design, and torch's CPU autocast emulates bf16 (a 2-layer
# Llama step took 47 s on an AVX2 machine). BENCH_FORCED=1 adds ztrain rows with
# ZT_DNNL=force (oneDNN's path without bf16 units: correctness, not speed).
# Data: data/train.h5 (tools/gen-data.sh; byte-level tokens fit either vocabulary).
# Torch: ZT_TORCH_PYTHON (default ~/.cache/ztrain-venv/bin/python, else /usr/bin/python3).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-1}
PY=${ZT_TORCH_PYTHON:-$HOME/.cache/ztrain-venv/bin/python}
[ -x "$PY" ] || PY=/usr/bin/python3
PEER=tools/torch_cpu_peer.py
[ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data
make -C "$B" -s tools/bench_kernels ztrain >/dev/null
export ZT_DNNL="${ZT_DNNL:-}" ZT_DNNL_VIEWS="${ZT_DNNL_VIEWS:-}"
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
MPIRUN="mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x ZT_DNNL -x ZT_DNNL_VIEWS"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512_bf16|amx_bf16|amx_tile|fma)$' | tr '\n' ' ')
bf16=no
grep -qw avx512_bf16 /proc/cpuinfo && bf16=yes
grep -qw amx_bf16 /proc/cpuinfo && bf16=yes
echo "ztrain bf16 benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
echo "CPU flags (relevant): ${flags:-none}; bf16 units: $bf16; $THREADS thread(s); torch: $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
sgemm=$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$B/tools/bench_kernels" 3 1000 |
    awk '{ for (i = 1; i <= NF; i++) if ($i == "(sgemm") { v = $(i + 1) + 0; if (v > m) m = v } } END { print m }')
sgemm=$(awk "BEGIN { print $sgemm * $THREADS }")
echo "OpenBLAS sgemm peak (best over GPT-2 124M shapes, 1 thread, x $THREADS threads): $sgemm GFLOP/s"
echo

# zt NAME args...: prints "tokens/s GFLOP/s gemm-path" (0 0 on failure)
zt() {
    name=$1
    shift
    total=$((STEPS + WARMUP))
    $MPIRUN -np 1 "$B/ztrain" "$@" data.train_files=data/train.h5 data.val_files=[] train.max_steps=$total \
        train.logging_steps=1 train.sample_tokens=0 train.eval_steps=0 checkpoint.save_at_end=false \
        train.per_device_train_batch_size=4 data.seq_len=64 parallel.strategy=ddp \
        train.output_dir="$out/$name" train.peak_tflops=$(awk "BEGIN { print $sgemm / 1000 }") >"$out/$name.log" 2>&1 ||
        { tail -5 "$out/$name.log" >&2; echo "0 0 failed"; return; }
    path=$(sed -n 's/.*(GEMMs \(.*\)), comm.*/\1/p' "$out/$name.log" | head -1 | tr ' ' '~')
    /usr/bin/python3 - "$out/$name/metrics.jsonl" "$WARMUP" "$path" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step_s" in r][int(sys.argv[2]):]
med = statistics.median(r["step_s"] for r in steps)
tok = steps[0]["tokens_seen"] / steps[0]["step"] / med
gflops = tok * (steps[0]["tflops"] * 1e12 / steps[0]["tokens_per_s"]) / 1e9
print(f"{tok:.1f} {gflops:.1f} {sys.argv[3]}")
PY
}
# pt args...: prints torch tokens/s
pt() {
    "$PY" "$PEER" --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" --batch 4 --seq 64 "$@" 2>/dev/null |
        sed -n 's/.*tokens_per_s \([0-9.]*\).*/\1/p'
}
na() { [ "$bf16" = yes ] || { echo "n/a"; return 1; }; }

G124="inputs/gpt2-124m.cfg model.vocab_size=50257"
LLAMA="inputs/gpt2-124m.cfg model.arch=llama model.n_layer=12 model.n_embd=768 model.n_head=12 model.n_kv_head=4
  model.head_dim=64 model.intermediate_size=2048 model.vocab_size=32000 model.tie_word_embeddings=false"
printf '%-26s %14s %14s %14s %14s %10s %10s %16s\n' model "ztrain fp32" "ztrain bf16" "torch fp32" "torch bf16" \
    "bf16/fp32" "bf16/torch" "fp32 % of sgemm"
report() {
    label=$1 zf=$2 zb=$3 pf=$4 pb=$5
    set -- $zf
    f=$1 fg=$2
    b=$(echo "$zb" | cut -d' ' -f1)
    r1=$(awk -v a="$b" -v c="$f" 'BEGIN { if (a + 0 > 0 && c > 0) printf "%.2fx", a / c; else print "n/a" }')
    r2=$(awk -v a="$b" -v c="$pb" 'BEGIN { if (a + 0 > 0 && c + 0 > 0) printf "%.2fx", a / c; else print "n/a" }')
    printf '%-26s %14s %14s %14s %14s %10s %10s %16s\n' "$label" "$f" "$b" "$pf" "$pb" "$r1" "$r2" \
        "$(awk "BEGIN { printf \"%.1f GF/s, %.0f%%\", $fg, 100 * $fg / $sgemm }")"
}
for m in gpt2 llama; do
    if [ $m = gpt2 ]; then cfg=$G124; targs="--arch gpt2 --layers 12 --dim 768 --heads 12 --vocab 50257"
        label="GPT-2 124M"
    else cfg=$LLAMA; targs="--arch llama --layers 12 --dim 768 --heads 12 --kv-heads 4 --inter 2048 --vocab 32000"
        label="Llama-style 125M"
    fi
    # shellcheck disable=SC2086
    zf=$(ZT_DNNL= zt "$m-fp32" $cfg)
    # shellcheck disable=SC2086
    zb=$(na && ZT_DNNL= zt "$m-bf16" $cfg train.bf16=true) || zb="n/a"
    # shellcheck disable=SC2086
    pf=$(pt $targs)
    # shellcheck disable=SC2086
    pb=$(na && pt $targs --bf16) || pb="n/a"
    report "$label, 1 rank" "$zf" "$zb" "${pf:-0}" "$pb"
    if [ "$zb" != n/a ]; then
        echo "    ztrain bf16 GEMM path: $(echo "$zb" | cut -d' ' -f3 | tr '~' ' ')"
        # the weights rounded per GEMM instead of read from the bf16 working copy (zt_dnnl_view)
        # shellcheck disable=SC2086
        zr=$(ZT_DNNL= ZT_DNNL_VIEWS=off zt "$m-bf16-r" $cfg train.bf16=true)
        echo "    ztrain bf16 with ZT_DNNL_VIEWS=off (weights rounded per GEMM): $(echo "$zr" | cut -d' ' -f1) tok/s"
    fi
    if [ "${BENCH_FORCED:-0}" = 1 ]; then
        # shellcheck disable=SC2086
        zx=$(ZT_DNNL=force zt "$m-forced" $cfg train.bf16=true)
        echo "    ZT_DNNL=force train.bf16: $(echo "$zx" | cut -d' ' -f1) tok/s, GEMMs $(echo "$zx" | cut -d' ' -f3- | tr '~' ' ')"
    fi
done
echo
echo "targets: bf16/fp32 >= 1.6x, bf16/torch-autocast >= 1.3x (both need bf16 units: n/a without), fp32 >= 90% of the sgemm peak"
