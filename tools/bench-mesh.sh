#!/bin/sh
# bench-mesh.sh [BUILDDIR] — tensor and sequence parallelism beside the data-parallel
# strategies, in one run (the tp/sp issue's speed and scale figures).
#
# 1. GPT-2 124M (V = 50257: tp splits it 25129 + 25128), 2 ranks of 1 thread each, B = 4
#    per rank, T = 64, fp32: ddp 2, zero3 2 and tp 2 in turn (ROUNDS rounds, alternating,
#    so machine load hits all three), each STEPS steps after WARMUP. Per strategy: median
#    step time, tokens/s (of the global batch: 8 sequences for ddp/zero3, 4 for tp, whose
#    2 ranks share one replica), collective seconds and bytes per step (rank 0, from
#    metrics.jsonl: all collectives, and those of the tp group).
# 2. Long context: a Llama (L 4, C 512, 8 heads, 4 KV heads, head_dim 64, I 1536, V 4096)
#    at T = LONG_T (8192), B = 1, zero3 (DeepSpeed-Ulysses' pairing: the sp ranks are data
#    ranks), under parallel.memory_limit_gb = LIMIT (1.2): the pre-flight estimate refuses it
#    at sp 1; it trains at sp 2 (2 ranks) and at sp 4 (4 ranks on the 2 cores,
#    oversubscribed), LONG_STEPS steps each, with the step time and peak RSS per rank.
#    A short version (T 512, 6 steps) at sp 2 equals one rank (compare_runs.py, fp32 1e-5).
# 3. Ring attention's overlap: the same Llama at T = 2 x RING_T (1024 per rank), sp 2 ring,
#    RING_STEPS steps, once as built and once with ZT_RING_SERIAL=1 (each transfer waited
#    for at once: the communication to hide). Hidden = 1 - (host time blocked in the ring's
#    waits, overlapped) / (the same, serial), from metrics.jsonl's send_recv wait_s.
#
# Environment: STEPS (6), WARMUP (2), ROUNDS (2), LONG_T (8192), LONG_STEPS (2), LIMIT (1.2),
#   RING_T (1024), RING_STEPS (4),
#   PY (Debian's python3 with h5py and numpy).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-2}
LONG_T=${LONG_T:-8192}
LONG_STEPS=${LONG_STEPS:-2}
LIMIT=${LIMIT:-1.2}
RING_T=${RING_T:-1024}
RING_STEPS=${RING_STEPS:-4}
PY=${PY:-/usr/bin/python3}
[ -x "$B/ztrain" ] || { echo "bench-mesh.sh: $B/ztrain not found: sh tools/build.sh $B" >&2; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ZT_DNNL=off
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
MPI="mpirun --oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"

echo "ztrain mesh benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc --all) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
     "flags:$(for f in avx2 avx512f avx512_bf16; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done)"
echo "load at start: $(uptime | sed 's/.*load average: //')"

# ---- 1. GPT-2 124M: ddp 2, zero3 2, tp 2 -------------------------------------------------
V=50257 T=64
DATA=data/gpt2-rand-50k.h5
"$PY" tools/rand_tokens.py "$DATA" $(( (STEPS + WARMUP) * 8 * T + 1 )) "$V"
GPT2="inputs/gpt2-124m.cfg model.vocab_size=$V data.seq_len=$T train.per_device_train_batch_size=4 data.train_files=$DATA
 data.val_files=[] train.logging_steps=1 train.sample_tokens=0 checkpoint.save_at_end=false checkpoint.save_hf=false
 log.plot=false"
echo "GPT-2 124M: $MPI -np 2 $B/ztrain $(echo $GPT2 | tr '\n' ' ') train.max_steps=$((STEPS + WARMUP)) + one of:"
echo "  parallel.strategy=ddp | parallel.strategy=zero3 | parallel.tensor_parallel_size=2"
# run NAME ARGS...: "step_s tokens/s comm_s comm_MB tp_MB"
run() {
    name=$1
    shift
    # shellcheck disable=SC2086
    $MPI -np 2 "$B/ztrain" $GPT2 "$@" train.max_steps=$((STEPS + WARMUP)) train.output_dir="$out/$name" \
        >"$out/$name.log" 2>&1 || { tail -5 "$out/$name.log" >&2; echo "0 0 0 0 0"; return; }
    "$PY" - "$out/$name/metrics.jsonl" "$WARMUP" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step_s" in r][int(sys.argv[2]):]
med = statistics.median(r["step_s"] for r in steps)
tok = steps[0]["tokens_seen"] / steps[0]["step"]
cs = statistics.median(sum(v["seconds"] for k, v in r["comm"].items() if k != "groups") for r in steps)
cb = statistics.median(sum(v["bytes"] for k, v in r["comm"].items() if k != "groups") for r in steps)
tb = statistics.median(r["comm"]["groups"]["tp"]["bytes"] for r in steps)
print(f"{med:.3f} {tok / med:.1f} {cs:.3f} {cb / 1e6:.1f} {tb / 1e6:.1f}")
PY
}
printf '%-6s %-10s %10s %10s %12s %14s %12s\n' round strategy "step s" "tok/s" "comm s/step" "comm MB/step" "tp MB/step"
i=1
while [ "$i" -le "$ROUNDS" ]; do
    for st in ddp zero3 tp2; do
        case $st in tp2) args="parallel.tensor_parallel_size=2" ;; *) args="parallel.strategy=$st" ;; esac
        # shellcheck disable=SC2086
        set -- $(run "$st-$i" $args)
        printf '%-6s %-10s %10s %10s %12s %14s %12s\n' "$i" "$st" "$1" "$2" "$3" "$4" "$5"
    done
    i=$((i + 1))
done

# ---- 2. long context --------------------------------------------------------------------
echo
V=4096
LDATA=data/llama-rand-4k-long.h5
"$PY" tools/rand_tokens.py "$LDATA" $(( (LONG_STEPS + 1) * 4 * LONG_T + 1 )) "$V"
LONG="inputs/tiny.cfg model.arch=llama model.n_layer=4 model.n_embd=512 model.n_head=8 model.n_kv_head=4
 model.head_dim=64 model.intermediate_size=1536 model.vocab_size=$V model.block_size=$LONG_T
 model.tie_word_embeddings=false data.train_files=$LDATA data.val_files=[] train.per_device_train_batch_size=1
 train.logging_steps=1 train.sample_tokens=0 train.eval_steps=0 checkpoint.save_at_end=false checkpoint.save_hf=false
 log.plot=false parallel.memory_limit_gb=$LIMIT parallel.strategy=zero3"
echo "long context: Llama L4 C512 8/4 heads V$V at T=$LONG_T, B=1, zero3, parallel.memory_limit_gb=$LIMIT"
for sp in 1 2 4; do
    # shellcheck disable=SC2086
    "$B/ztrain" --estimate-memory --ranks $sp $LONG data.seq_len=$LONG_T parallel.sequence_parallel_size=$sp \
        >"$out/est$sp.log" 2>&1 || true
    echo "  estimate at sp $sp: $(grep '^zero3 ' "$out/est$sp.log" | awk '{ print "activations " $10 " " $11 ", total " $12 " " $13 }')"
done
# shellcheck disable=SC2086
if $MPI -np 1 "$B/ztrain" $LONG data.seq_len=$LONG_T train.max_steps=1 train.output_dir="$out/long1" \
    >"$out/long1.log" 2>&1; then
    echo "  sp 1: trained (not refused: raise LONG_T or lower LIMIT)"
else
    echo "  sp 1: refused: $(grep -o 'memory: .*per rank, more than the limit of [^ ]* [^ ]*' "$out/long1.log" | head -1)"
fi
for sp in 2 4; do
    # shellcheck disable=SC2086
    $MPI -np $sp "$B/ztrain" $LONG data.seq_len=$LONG_T parallel.sequence_parallel_size=$sp \
        train.max_steps=$LONG_STEPS train.output_dir="$out/long$sp" >"$out/long$sp.log" 2>&1 ||
        { echo "  sp $sp: FAILED: $(grep -m1 'error' "$out/long$sp.log")"; continue; }
    "$PY" - "$out/long$sp/metrics.jsonl" "$sp" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "step_s" in r]
s = next(r for r in recs if r.get("summary"))
a2a = steps[-1]["comm"]["all_to_all"]
print(f"  sp {sys.argv[2]}: trained {len(steps)} steps, last step {steps[-1]['step_s']:.1f} s, loss {steps[-1]['loss']:.4f}, "
      f"all-to-all {a2a['bytes'] / 1e6:.0f} MB/step in {a2a['seconds']:.2f} s, peak RSS {s['peak_rss_bytes'] / 2**30:.2f} GiB")
PY
done
# the short version equals one rank's maths
SHORT="$LONG data.seq_len=512 model.block_size=512 train.max_steps=6 parallel.memory_limit_gb=0 optim.warmup_steps=2
 checkpoint.save_at_end=true"
# shellcheck disable=SC2086
$MPI -np 1 "$B/ztrain" $SHORT train.gradient_accumulation_steps=1 train.output_dir="$out/short1" >"$out/short1.log" 2>&1
# shellcheck disable=SC2086
$MPI -np 2 "$B/ztrain" $SHORT parallel.sequence_parallel_size=2 train.output_dir="$out/short2" >"$out/short2.log" 2>&1
# compare_runs.py wants a checkpoint: the short runs save one at the end
"$PY" tests/mpi/compare_runs.py "$out/short1" "$out/short2" 2>&1 | sed 's/^/  short version (T 512) at sp 2 vs 1 rank: /' || true

# ---- 3. ring attention's overlap ---------------------------------------------------------
echo
RT=$((2 * RING_T))
RING="$LONG data.seq_len=$RT model.block_size=$RT train.max_steps=$RING_STEPS parallel.memory_limit_gb=0
 parallel.sequence_parallel_size=2 parallel.sp_mode=ring"
echo "ring attention: Llama L4 C512 at T=$RT (sp 2: $RING_T per rank), $RING_STEPS steps, zero3"
for mode in overlap serial; do
    ser=0
    [ $mode = serial ] && ser=1
    # shellcheck disable=SC2086
    ZT_RING_SERIAL=$ser $MPI -x ZT_RING_SERIAL -np 2 "$B/ztrain" $RING train.output_dir="$out/ring-$mode" \
        >"$out/ring-$mode.log" 2>&1 || { echo "  $mode: FAILED: $(grep -m1 error "$out/ring-$mode.log")"; continue; }
done
"$PY" - "$out/ring-overlap/metrics.jsonl" "$out/ring-serial/metrics.jsonl" <<'PY'
import json, sys, statistics
def get(path):
    steps = [json.loads(l) for l in open(path) if '"step_s"' in l][1:]  # the first step warms up
    sr = [r["comm"]["send_recv"] for r in steps]
    return (statistics.median(r["step_s"] for r in steps), statistics.median(x["wait_s"] for x in sr),
            statistics.median(x["bytes"] for x in sr), statistics.median(x["calls"] for x in sr))
o, s = get(sys.argv[1]), get(sys.argv[2])
print(f"  overlapped: step {o[0]:.3f} s, ring send-recv {o[2] / 1e6:.1f} MB in {o[3]:.0f} transfers/step, blocked in waits {o[1]:.4f} s")
print(f"  serial:     step {s[0]:.3f} s, blocked in waits {s[1]:.4f} s (the communication to hide)")
h = 1 - o[1] / s[1] if s[1] > 0 else float("nan")
print(f"  hidden behind compute: {100 * h:.0f}% (target >= 50%)")
PY
echo "load at end: $(uptime | sed 's/.*load average: //')"
