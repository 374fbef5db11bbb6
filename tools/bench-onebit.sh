#!/bin/sh
# bench-onebit.sh [BUILD [NP]] — 1-bit Adam against AdamW on the default job (inputs/default.cfg,
# 800 steps) at NP ranks (default 2), optim.freeze_step at 20% of the steps (160). Prints each
# run's final validation loss and the gradient bytes a step moves after the freeze, and exits 1
# when 1-bit Adam's final validation loss is more than 2% above AdamW's. About 10 minutes a run
# on 2 cores. Needs data/train.h5 and data/val.h5 (tools/gen-data.sh).
#
# bench-onebit.sh --speed [BUILD [RATE [STEPS]]] — GPT-2 124M (inputs/gpt2-124m.cfg, fp32, B=MICRO
# (default 4), T=SEQ (default 64), random tokens) on two hosts, one rank each: the network namespaces of
# tests/mpi/netns.sh joined by a link limited to RATE (default 1gbit, tc tbf on each host's
# egress), mpirun -hostfile over TCP. Runs STEPS steps (default 6) of each of RUNS (default: ddp
# with AdamW, ddp with 1-bit Adam (optim.freeze_step = 2), zero1 with AdamW and with 1-bit Adam,
# and hybrid_shard, a shard group a host, so its replica all-reduce crosses the link) back to
# back, REPEAT times (default 1) in turn, and prints each one's median step time over the steps
# after the freeze (3 .. STEPS), the bytes it moved and the seconds its collectives took a step
# (ddp's all-reduce overlaps the backward; 1-bit Adam's exchange runs in the optimizer step),
# and the ratio to ddp with AdamW (target for 1-bit Adam: <= 0.5). First it runs one rank alone
# (AdamW, no link) and prints the regime: compute (that rank's step: forward, backward, AdamW)
# against wire (ddp's all-reduce bytes at RATE). GPUs at 1 Gbit/s compute GPT-2 124M's step in
# tens of milliseconds against seconds of wire, so ddp there is comm-bound; one CPU core at
# B=4, T=64 computes for longer than the wire takes. MICRO=1 SEQ=8 brings the CPU job to the
# comm-bound side (compute about a tenth of the wire on an idle core): the setting whose step
# ratio says what 1-bit Adam does where it is meant to run. Needs root (namespaces) and h5py
# (the token file).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = --speed ]; then
    B=${2:-build} RATE=${3:-1gbit} STEPS=${4:-6} MICRO=${MICRO:-4} SEQ=${SEQ:-64}
    [ -x "$B/ztrain" ] || { echo "bench-onebit.sh: no $B/ztrain" >&2; exit 2; }
    PY=/usr/bin/python3
    out=$(mktemp -d)
    ZT_NETNS_SLOTS=1
    . tests/mpi/netns.sh
    netns_up "$out" || { echo "bench-onebit.sh: $ZT_NETNS_WHY" >&2; rm -rf "$out"; exit 2; }
    trap 'netns_down; rm -rf "$out"' EXIT
    netns_rate "$RATE" || { echo "bench-onebit.sh: tc tbf $RATE failed" >&2; exit 2; }
    DATA=${ZT_BENCH_DATA:-data/bench-gpt2-tokens.h5}
    "$PY" tools/rand_tokens.py "$DATA" $(( (STEPS + 2) * 2 * MICRO * SEQ + 1 )) 50257
    ZTRAIN=$B/ztrain
    ZT_OUT=$out/last.out
    ZT_TEST_TIMEOUT=3000
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    echo "bench-onebit.sh: GPT-2 124M, B=$MICRO, T=$SEQ, 2 hosts x 1 rank, link $RATE; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    RUNS=${RUNS:-ddp-adamw ddp-onebit_adam zero1-adamw zero1-onebit_adam hybrid_shard-adamw}
    rep=1
    while [ "$rep" -le "${REPEAT:-1}" ]; do
        # one-adamw: one rank alone, the compute side of the regime
        for run in one-adamw $RUNS; do
            st=${run%-*} opt=${run##*-} np=2
            [ "$st" = one ] && st=ddp np=1
            netns_ztrain $np inputs/gpt2-124m.cfg data.train_files="$DATA" data.val_files=[] train.eval_steps=0 \
                train.sample_tokens=0 train.max_steps="$STEPS" checkpoint.save_at_end=false checkpoint.save_hf=false \
                train.per_device_train_batch_size="$MICRO" data.seq_len="$SEQ" \
                parallel.strategy="$st" optim.type="$opt" optim.freeze_step=2 train.output_dir="$out/$run-$rep" \
                >"$out/$run-$rep.log" 2>&1 || { tail -5 "$out/$run-$rep.log" >&2; exit 1; }
        done
        rep=$((rep + 1))
    done
    echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" - "$out" "$STEPS" "${REPEAT:-1}" "$RATE" $RUNS <<'PY'
import json, re, statistics, sys
d, steps, repeat, rate, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
def run(name):
    after = []
    for k in range(1, repeat + 1):
        recs = [json.loads(l) for l in open(f"{d}/{name}-{k}/metrics.jsonl")]
        after += [r for r in recs if "step_s" in r and r["step"] >= 3]
    med = lambda f: statistics.median(f(r) for r in after)
    return (med(lambda r: r["step_s"]), med(lambda r: sum(c.get("bytes", 0) for c in r["comm"].values() if isinstance(c, dict))),
            med(lambda r: sum(c.get("seconds", 0) for k, c in r["comm"].items() if isinstance(c, dict) and k != "groups")))
base = run("ddp-adamw") if "ddp-adamw" in runs else None
# the regime: one rank's step (forward, backward, AdamW) against ddp's all-reduce bytes at the
# link's rate (tc's units: bits a second)
num, unit = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower()).groups()
bps = float(num) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[unit] / 8
compute = run("one-adamw")[0]
if base:
    wire = base[1] / bps
    print(f"regime: compute {compute:.3f} s a step (one rank alone), wire {wire:.3f} s (ddp's {base[1] / 1e6:.1f} MB "
          f"at {rate}): compute:wire = {compute / wire:.2f} ({'comm' if compute < wire else 'compute'}-bound)")
for name in runs:
    t, moved, cs = run(name)
    ratio = f"{t / base[0]:.3f}x ddp's step, {cs / base[2]:.3f}x its collective time" if base else ""
    print(f"{name:20s} step {t:7.3f} s, collectives {cs:6.2f} s, {moved / 1e6:9.2f} MB a step "
          f"(medians of steps 3..{steps} x {repeat})  {ratio}")
PY
    exit 0
fi
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
