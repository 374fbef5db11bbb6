#!/bin/sh
# qlora_memory.sh — the estimate of a QLoRA run is what the run holds: a Llama-shaped directory
# (vocabulary 32000, hidden 1024, 2 layers, 8 heads, 4 KV heads, MLP 2816, untied head: 72M
# parameters, 356 MB of float32) trained with model.quantization_bit = 4 (nf4, double
# quantization) and LoRA rank 8 on every block linear, at 1 rank (ddp) and at 2 ranks (zero3):
#  - rank 0's estimate (a dry run of the engine and the model: zt_memplan.h) equals what it
#    allocated, category by category: the 4-bit base and its scales in params, the gathered
#    units, the dequantization scratch in the activations;
#  - --estimate-memory prints the same totals before any run (ddp at 1 rank, zero3 at 2), the
#    4-bit base counted in its 4-bit form;
#  - the process's peak resident memory (VmHWM) above its resident memory before the model
#    existed (libraries, MPI, the token file: no estimate of ztrain's counts them) is within 10%
#    of the estimated total, on every rank (the summary's peak_rss_growth_bytes is the largest).
#  - the load: each rank reads and quantizes only the blocks it needs (the absmax of a 1/world
#    share of a weight's blocks, the packed codes under its own segments), so what the load holds
#    above what the rank keeps (peak RSS growth by the end of the load, logged, less the estimate's
#    params) shrinks from 1 rank (ddp: the whole of each weight in float32, one at a time) to 2
#    (zero3): by about half of the widest 4-bit weight's float32 values, checked as at least a
#    quarter (reading whole weights at every rank count, it did not shrink).
# What the estimate does not count and the margin holds: a share of one weight's float32 values
# read at load to be quantized, malloc's own slack.
. "$(dirname "$0")/common.sh"
need_h5py
cd "$ZT_TMP" || fail "cd"
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" llama base 32000 1024 2 8 4 128 2816 || fail "cannot make the directory"
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens tok.h5 32000 4000 || fail "cannot make the token file"
cat >q.cfg <<'EOF'
model = { name_or_path = "base"; quantization_bit = 4; };
data = { train_files = "tok.h5"; val_files = []; seq_len = 64; };
train = { per_device_train_batch_size = 1; max_steps = 2; logging_steps = 1; sample_tokens = 0;
          finetuning_type = "lora"; };
lora = { rank = 8; alpha = 16.0; target = "all"; };
optim = { learning_rate = 1e-4; warmup_steps = 0; };
checkpoint = { save_hf = false; save_at_end = false; };
log = { plot = false; };
EOF
run_ztrain 1 q.cfg parallel.strategy=ddp train.output_dir=r1 >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4"
cp "$ZT_OUT" r1.out
run_ztrain 2 q.cfg parallel.strategy=zero3 train.output_dir=r2 >/dev/null
cp "$ZT_OUT" r2.out
run_ztrain 1 --estimate-memory --ranks 1 q.cfg >/dev/null
cp "$ZT_OUT" est1.out
run_ztrain 1 --estimate-memory --ranks 2 q.cfg >/dev/null
cp "$ZT_OUT" est2.out
"$PY" - r1 r2 <<'PYEOF' || fail "the estimate of a QLoRA run is not what it allocated, or its peak RSS is more than 10% away"
import json, sys
bad = []
def fmt(x):  # zt_fmt_bytes
    u = 0
    while x >= 1024 and u < 4: x /= 1024; u += 1
    return f"{x:.2f} {['B', 'KiB', 'MiB', 'GiB', 'TiB'][u]}" if u else f"{x:.0f} B"
for d, est_out, strategy in (("r1", "est1.out", "ddp"), ("r2", "est2.out", "zero3")):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    start = next(r for r in recs if r.get("start"))
    summary = next(r for r in recs if r.get("summary"))
    est, meas = start["memory_estimate"], summary["memory_measured"]
    if est != meas:
        bad.append(f"{d}: estimate {est} != measured {meas}")
    total, grown = start["memory_estimate_total"], summary["peak_rss_growth_bytes"]
    row = next((l.split() for l in open(est_out) if l.split()[:1] == [strategy]), [])
    if " ".join(row[11:13]) != fmt(total):
        bad.append(f"--estimate-memory's {strategy} total {' '.join(row[11:13])} is not the run's estimate {fmt(total)}")
    ratio = grown / total
    print(f"{d}: estimate {total / 2**20:.2f} MiB, peak RSS {summary['peak_rss_bytes'] / 2**20:.2f} MiB, "
          f"{grown / 2**20:.2f} MiB above the process before the model: {ratio:.3f} of the estimate")
    if not 0.9 <= ratio <= 1.1:
        bad.append(f"{d}: peak RSS growth {grown} is {ratio:.3f} of the estimate {total}")
load = {}
for d, log in (("r1", "r1.out"), ("r2", "r2.out")):
    start = next(r for r in (json.loads(l) for l in open(d + "/metrics.jsonl")) if r.get("start"))
    line = next(l for l in open(log) if l.startswith("qlora: ") and "peak RSS by the end of the load" in l)
    num, unit = line.split("peak RSS by the end of the load ")[1].split()[:2]
    grown = float(num) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    load[d] = grown - start["memory_estimate"]["params"]
    print(f"{d}: the load's peak {grown / 2**20:.2f} MiB above the process before the model, "
          f"{load[d] / 2**20:.2f} MiB above the estimate's params")
c = json.load(open("base/config.json"))
widest = 4 * max(c["intermediate_size"] * c["hidden_size"], c["hidden_size"] * c["hidden_size"])
# 1 rank stages a whole weight's float32 values, each of 2 ranks half of one (its share of the
# absmax): the transient shrinks by about half the widest weight; the margin of half of that is for
# the allocator's noise (reading weights whole, it grew instead)
if not load["r2"] < load["r1"] - widest / 4:
    bad.append(f"the load's transient at 2 ranks ({load['r2'] / 2**20:.2f} MiB) is not below 1 rank's "
               f"({load['r1'] / 2**20:.2f} MiB) less a quarter of the widest weight's float32 "
               f"({widest / 2**22:.2f} MiB)")
for b in bad: print("  ", b)
sys.exit(1 if bad else 0)
PYEOF
echo "qlora_memory: ok"
