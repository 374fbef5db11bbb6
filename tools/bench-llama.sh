#!/bin/sh
# bench-llama.sh [BUILDDIR] — ztrain's model.arch=llama side by side with Hugging Face
# transformers' LlamaForCausalLM, in one run (the families issue's ~125M Llama-style model).
#
#   L=12, C=768, 12 heads, 4 KV heads (head_dim 64), intermediate 2048, V=32000, untied
#   head, fp32, 1 rank, 1 thread (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1), B=4, T=128,
#   AdamW (betas 0.9/0.95, weight decay 0.1, gradient clipping 1.0 on both sides).
#
# Both sides train on the same token file (uniform random ids in [0, 32000), written with
# h5py as /tokens int32 with vocab_size and eot_token attributes). The two sides alternate
# within the run (ztrain, torch, torch, ztrain, ... for ROUNDS rounds) so that load from
# other users of the machine hits both. Figures per run: tokens/s = B*T / median step time
# over STEPS steps after WARMUP (ztrain: step_s of metrics.jsonl, as tools/bench.sh; torch:
# perf_counter around zero_grad+forward+backward+clip+step, tools/torch_llama.py).
# ztrain's achieved GFLOP/s = tokens/s x its FLOPs/token (zt_model_flops_per_token, read
# back as tflops/tokens_per_s of metrics.jsonl); the sgemm peak is the "MFU denominator"
# each ztrain run measures at start (best single N=256 x 768 x 2304 matmul), and, once per
# run, tools/bench_kernels' best cblas_sgemm over GPT-2 124M's shapes.
#
# FAMILY=gemma3: the same shape as Gemma 3 (ztrain's model.arch=gemma3 against transformers'
# Gemma3ForCausalLM): tied head, sliding window WINDOW (64) on all layers but every 6th.
#
# Environment: STEPS (8), WARMUP (2), ROUNDS (2), PY (the venv's python; tools/make-venv.sh),
#   GPT2=1 also runs ztrain's GPT-2 124M 1-rank row of tools/bench.sh (needs data/train.h5,
#   made by tools/gen-data.sh) as a no-regression check, PROFILE=1 adds a perf profile of
#   ztrain's llama steps (top symbols, self time), TORCH_ARGS adds arguments to torch_llama.py
#   (TORCH_ARGS=--fused-adamw: torch.optim.AdamW(fused=True) instead of the default).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
PY=${PY:-$HOME/.cache/ztrain-venv/bin/python}
[ -x "$PY" ] || sh tools/make-venv.sh
[ -x "$B/ztrain" ] || { echo "bench-llama.sh: $B/ztrain not found: sh tools/build.sh $B" >&2; exit 1; }
make -C "$B" -s tools/bench_kernels >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
Bsz=4 T=128 V=32000
DATA=data/llama-rand-32k.h5
need=$(( (STEPS + WARMUP) * Bsz * T + 1 ))
"$PY" tools/rand_tokens.py "$DATA" "$need" "$V"

LLAMA="inputs/tiny.cfg model.arch=llama model.n_layer=12 model.n_embd=768 model.n_head=12 model.n_kv_head=4
 model.head_dim=64 model.intermediate_size=2048 model.vocab_size=$V model.block_size=$T model.tie_word_embeddings=false
 data.seq_len=$T train.per_device_train_batch_size=$Bsz data.train_files=$DATA"
ZTCOMMON="data.val_files=[] train.logging_steps=1 train.sample_tokens=0 checkpoint.save_at_end=false
 checkpoint.save_hf=false parallel.strategy=ddp"
TORCH="tools/torch_llama.py --threads 1 --layers 12 --dim 768 --heads 12 --kv-heads 4 --head-dim 64
 --intermediate 2048 --vocab $V --seq $T --batch $Bsz --data $DATA ${TORCH_ARGS:-}"
if [ "${FAMILY:-llama}" = gemma3 ]; then
    WINDOW=${WINDOW:-64}
    LLAMA="$(echo "$LLAMA" | sed 's/model.arch=llama/model.arch=gemma3/; s/model.tie_word_embeddings=false/model.tie_word_embeddings=true/')
 model.sliding_window=$WINDOW model.sliding_window_pattern=6"
    TORCH="$TORCH --family gemma3 --window $WINDOW"
fi

echo "ztrain ${FAMILY:-llama} benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
     "flags:$(for f in avx2 avx512f avx512_bf16; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done)"
echo "load at start: $(uptime | sed 's/.*load average: //')"
echo "ztrain: $B/ztrain $(echo $LLAMA $ZTCOMMON | tr '\n' ' ') train.max_steps=$((STEPS + WARMUP))"
echo "torch:  $PY $(echo $TORCH | tr '\n' ' ') --steps $STEPS --warmup $WARMUP  ($("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
sgemm=$("$B/tools/bench_kernels" 3 1000 | awk '{ for (i = 1; i <= NF; i++) if ($i == "(sgemm") { v = $(i + 1) + 0; if (v > m) m = v } } END { print m }')
echo "bench_kernels sgemm peak (best over GPT-2 124M shapes, 1 thread): $sgemm GFLOP/s"
echo

# ztrain run NAME ARGS...: prints "tokens/s GFLOP/s FLOPs/token mfu_denominator_GFLOPs peakRSS_MiB"
zt() {
    name=$1
    shift
    "$B/ztrain" "$@" train.max_steps=$((STEPS + WARMUP)) train.output_dir="$out/$name" >"$out/$name.log" 2>&1 ||
        { tail -5 "$out/$name.log" >&2; echo "0 0 0 0 0"; return; }
    den=$(sed -n 's/.*MFU denominator: \([0-9.]*\) GFLOP.*/\1/p' "$out/$name.log")
    "$PY" - "$out/$name/metrics.jsonl" "$WARMUP" "$den" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step_s" in r][int(sys.argv[2]):]
summ = next(r for r in recs if r.get("summary"))
med = statistics.median(r["step_s"] for r in steps)
tok = steps[0]["tokens_seen"] / steps[0]["step"] / med   # tokens per step / median step time
fpt = steps[0]["tflops"] * 1e12 / steps[0]["tokens_per_s"]
print(f"{tok:.1f} {tok * fpt / 1e9:.1f} {fpt / 1e6:.1f} {sys.argv[3]} {summ['peak_rss_bytes'] / 2**20:.0f}")
PY
}
pt() {
    "$PY" $TORCH --steps "$STEPS" --warmup "$WARMUP" >"$out/$1.log" 2>&1 || { tail -5 "$out/$1.log" >&2; echo 0; return; }
    sed -n 's/^tokens_per_s \([0-9.]*\).*/\1/p' "$out/$1.log"
}

printf '%-8s %-8s %10s %12s %14s %16s %10s\n' "order" "side" "tok/s" "GFLOP/s" "MFLOP/token" "peak GFLOP/s" "% of peak"
zall="" pall="" i=1
row_z() { set -- $2; printf '%-8s %-8s %10s %12s %14s %16s %9s%%\n' "$ord" ztrain "$1" "$2" "$3" "$4" \
    "$(awk "BEGIN { printf \"%.1f\", 100 * $2 / $4 }")"; }
row_p() { printf '%-8s %-8s %10s\n' "$ord" torch "$2"; }
ord=0
while [ "$i" -le "$ROUNDS" ]; do
    if [ $((i % 2)) = 1 ]; then
        ord=$((ord + 1)); z=$(zt z$i $LLAMA $ZTCOMMON); row_z $ord "$z"
        ord=$((ord + 1)); p=$(pt p$i); row_p $ord "$p"
    else
        ord=$((ord + 1)); p=$(pt p$i); row_p $ord "$p"
        ord=$((ord + 1)); z=$(zt z$i $LLAMA $ZTCOMMON); row_z $ord "$z"
    fi
    zall="$zall$z
" pall="$pall$p
"
    i=$((i + 1))
done
echo
printf '%s' "$zall" | awk -v p="$(printf '%s' "$pall" | tr '\n' ' ')" -v sg="$sgemm" '
    { z += $1; g += $2; d += $4; n++; if ($1 / $4 > 0) f += $2 / $4 }
    END { np = split(p, a, " "); for (k = 1; k <= np; k++) t += a[k]; t /= np;
          printf "mean over %d rounds: ztrain %.1f tok/s, torch %.1f tok/s: ratio %.2fx (target >= 1.15x)\n", n, z / n, t, (z / n) / t
          printf "ztrain %.1f GFLOP/s = %.1f%% of its own measured peak (mean %.1f GFLOP/s), %.1f%% of bench_kernels sgemm %.1f (target >= 85%%)\n", g / n, 100 * f / n, d / n, 100 * g / n / sg, sg }'
echo "load at end: $(uptime | sed 's/.*load average: //')"

if [ "${GPT2:-0}" = 1 ]; then
    [ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data >/dev/null
    echo
    echo "GPT-2 124M, 1 rank (tools/bench.sh's row; ztrain only):"
    g=$(zt g1 inputs/gpt2-124m.cfg model.vocab_size=50257 train.per_device_train_batch_size=4 data.seq_len=64 \
        parallel.strategy=ddp data.train_files=data/train.h5 data.val_files=[] train.logging_steps=1 train.sample_tokens=0 \
        checkpoint.save_at_end=false checkpoint.save_hf=false)
    set -- $g
    echo "  ztrain $1 tok/s, $2 GFLOP/s, $(awk "BEGIN { printf \"%.1f\", 100 * $2 / $4 }")% of its measured peak $4, peak RSS $5 MiB"
fi

if [ "${PROFILE:-0}" = 1 ]; then
    # attach after the warm-up steps, so start-up (parameter init, first-touch page faults) is left out
    echo
    echo "perf profile of ztrain llama, steady-state steps $((WARMUP + 1))-$((STEPS + WARMUP)) (self time):"
    "$B/ztrain" $LLAMA $ZTCOMMON train.max_steps=$((STEPS + WARMUP)) train.output_dir="$out/prof" >"$out/prof.log" 2>&1 &
    zpid=$!
    while :; do
        n=$(grep -c '"step_s"' "$out/prof/metrics.jsonl" 2>/dev/null) || n=0
        [ "$n" -ge "$WARMUP" ] && break
        kill -0 "$zpid" 2>/dev/null || break
        sleep 0.2
    done
    perf record -q -o "$out/perf.data" -F 499 -p "$zpid" >/dev/null 2>&1 || true
    wait "$zpid" || true
    perf report -i "$out/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | sed 's/ *- *- *$//' >"$out/prof.txt"
    head -20 "$out/prof.txt"
    awk '{ p = $1 + 0 } /sgemm|openblas/ { b += p; next } /\[k\]/ { k += p; next } { o += p }
         END { printf "grouped: OpenBLAS %.1f%%, kernel %.1f%%, everything else %.1f%%\n", b, k, o }' "$out/prof.txt"
fi
