#!/bin/sh
# bench.sh [BUILDDIR] — ztrain side by side with the PyTorch peer, in one run.
#
# GPT-2 124M (B=4, T=64) and a small model, fp32, one thread per rank:
#   1. OpenBLAS sgemm peak on GPT-2's GEMM shapes (tools/bench_kernels), now;
#   2. ztrain, 1 rank          vs  torch_gpt2.py, 1 process      (same shapes, same threads)
#   3. ztrain ddp and zero3 on 2 ranks  vs  torch DDP (gloo) on 2 ranks
# and each ztrain run's peak RSS against the analytic memory it printed at start.
# Figures: median step time over STEPS steps after WARMUP (tokens/s = B*T*ranks/median).
# Needs python3-torch (installed on demand) and data/train.h5 (tools/gen-data.sh).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
PEER=${ZT_TORCH_PEER:-../shared/bench/torch_gpt2.py}
[ -f "$PEER" ] || { echo "bench.sh: PyTorch peer $PEER not found (set ZT_TORCH_PEER)" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || {
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get install -y -qq python3-torch >/dev/null
}
[ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data
make -C "$B" -s tools/bench_kernels >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
MPIRUN="mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "ztrain benchmark — $(date -u +%Y-%m-%d), $(nproc --all) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
echo
sgemm=$("$B/tools/bench_kernels" 3 1000 | awk '{ for (i = 1; i <= NF; i++) if ($i == "(sgemm") { v = $(i + 1) + 0; if (v > m) m = v } } END { print m }')
echo "OpenBLAS sgemm peak (best over GPT-2 124M shapes, 1 thread): $sgemm GFLOP/s"
echo

# ztrain run: prints "tokens/s GFLOP/s peakRSS_MiB estimate_MiB"
zt() {
    np=$1 name=$2
    shift 2
    total=$((STEPS + WARMUP))
    $MPIRUN -np "$np" "$B/ztrain" "$@" data.train_files=data/train.h5 data.val_files=[] train.max_steps=$total \
        train.logging_steps=1 train.sample_tokens=0 checkpoint.save_at_end=false train.output_dir="$out/$name" \
        train.peak_tflops=$(awk "BEGIN { print $sgemm / 1000 }") >"$out/$name.log" 2>&1 ||
        { tail -5 "$out/$name.log" >&2; echo "0 0 0 0"; return; }
    /usr/bin/python3 - "$out/$name/metrics.jsonl" "$WARMUP" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step_s" in r][int(sys.argv[2]):]
start = next(r for r in recs if r.get("start")); summ = next(r for r in recs if r.get("summary"))
med = statistics.median(r["step_s"] for r in steps)
tok = steps[0]["tokens_seen"] / steps[0]["step"] / med   # tokens per step / median step time
gflops = tok * (steps[0]["tflops"] * 1e12 / steps[0]["tokens_per_s"]) / 1e9
est = sum(v for k, v in start["memory_estimate"].items())
print(f"{tok:.1f} {gflops:.1f} {summ['peak_rss_bytes'] / 2**20:.0f} {est / 2**20:.0f}")
PY
}
# torch run: prints tokens/s
pt() {
    np=$1
    shift
    if [ "$np" = 1 ]; then
        /usr/bin/python3 "$PEER" --threads 1 --steps "$STEPS" --warmup "$WARMUP" "$@" 2>/dev/null
    else
        $MPIRUN -np "$np" /usr/bin/python3 "$PEER" --threads 1 --steps "$STEPS" --warmup "$WARMUP" "$@" 2>/dev/null
    fi | sed -n 's/.*tokens_per_s \([0-9.]*\).*/\1/p'
}

G124="inputs/gpt2-124m.cfg model.vocab_size=50257 train.per_device_train_batch_size=4 data.seq_len=64"
SMALL="inputs/default.cfg model.n_layer=4 model.n_head=4 model.n_embd=256 model.vocab_size=4096 model.block_size=128 data.seq_len=128 train.per_device_train_batch_size=8"
printf '%-38s %12s %12s %8s %18s %16s\n' "run" "ztrain tok/s" "torch tok/s" "ratio" "GF/s (% of sgemm)" "peak RSS/estimate"
echo "(GF/s is over all ranks; the percentage is per rank against the sgemm peak above)"
row() {
    label=$1 z=$2 p=$3 np=$4
    set -- $z
    ratio=$(awk "BEGIN { if ($p > 0) printf \"%.2fx\", $1 / $p; else print \"-\" }")
    printf '%-38s %12s %12s %8s %18s %8s/%s MiB\n' "$label" "$1" "${p:--}" "$ratio" "$2 ($(awk "BEGIN { printf \"%.0f%%\", 100 * $2 / $np / $sgemm }"))" "$3" "$4"
}
z1=$(zt 1 g1 $G124 parallel.strategy=ddp)
p1=$(pt 1 --layers 12 --dim 768 --heads 12 --vocab 50257 --seq 64 --batch 4)
row "GPT-2 124M, 1 rank" "$z1" "$p1" 1
zs=$(zt 1 s1 $SMALL parallel.strategy=ddp)
ps=$(pt 1 --layers 4 --dim 256 --heads 4 --vocab 4096 --seq 128 --batch 8)
row "small (4x256, V 4096, T 128), 1 rank" "$zs" "$ps" 1
z2=$(zt 2 g2 $G124 parallel.strategy=ddp)
p2=$(pt 2 --layers 12 --dim 768 --heads 12 --vocab 50257 --seq 64 --batch 4)
row "GPT-2 124M, 2 ranks ddp" "$z2" "$p2" 2
z3=$(zt 2 g3 $G124 parallel.strategy=zero3)
row "GPT-2 124M, 2 ranks zero3" "$z3" "$p2" 2
echo
awk -v a="$z2" -v b="$z1" -v c="$z3" 'BEGIN { split(a, x, " "); split(b, y, " "); split(c, z, " ");
    printf "ddp 2 ranks / 1 rank: %.2fx (target >= 1.7)   zero3 step time / ddp: %.2fx (target <= 1.15)\n", x[1] / y[1], x[1] / z[1] }'
