#!/bin/sh
# bench-nvme.sh [BUILD [PATH [REPEATS]]] — the NVMe offload tier against the disk under PATH
# (default /var/tmp/zt-bench-nvme), side by side in one run, REPEATS times (default 2):
#
#  1. bandwidth: dd (O_DIRECT, 1 MiB blocks) writing a file and, at the same time, reading
#     another of the same size: the disk's combined read + write bandwidth for the pattern
#     the tier makes; then tools/bench_nvme (the optimizer step's swap alone: read unit
#     k + 1, hold k, write k - 1) with io_uring and with the pread/pwrite threads, on the
#     same path. Prints each engine's MB/s and its ratio to dd's.
#  2. a step: ztrain, one rank, zero2, a GPT-2-shaped model of 12 blocks of width 512 (38 M
#     parameters, 456 MB of fp32 master and Adam moments), STEP_ROWS (default 4) sequences
#     of 128 tokens a step, with the optimizer state in host memory (offload_optimizer =
#     cpu: the same code, so only the disk differs) and on disk (nvme), the median step
#     time of steps 3..6 of each. Prints the ratio, the bytes a step moves to and from
#     disk, the time those take at dd's bandwidth, and the share of that time the step
#     hides: 1 - (t_disk - t_memory) / (bytes / dd bandwidth).
# Needs python3 with h5py (the token file, tools/rand_tokens.py).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build} P=${2:-/var/tmp/zt-bench-nvme} R=${3:-2}
[ -x "$B/ztrain" ] && [ -x "$B/tools/bench_nvme" ] || { echo "bench-nvme.sh: build $B first" >&2; exit 2; }
mkdir -p "$P"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
out=$(mktemp -d)
trap 'rm -rf "$out" "$P"/dd-r "$P"/dd-w' EXIT
PY=${PYTHON3:-/usr/bin/python3}
MB=768 # per dd file and of swap per pass (32 records of 24 MiB)

dd_mbps() { # combined MB/s of a concurrent write and read of $MB MiB each
    dd if=/dev/zero of="$P/dd-r" bs=1M count=$MB oflag=direct 2>/dev/null
    t0=$(date +%s.%N)
    dd if=/dev/zero of="$P/dd-w" bs=1M count=$MB oflag=direct 2>/dev/null &
    dd if="$P/dd-r" of=/dev/null bs=1M iflag=direct 2>/dev/null
    wait
    t1=$(date +%s.%N)
    rm -f "$P/dd-r" "$P/dd-w"
    echo "$t0 $t1" | awk -v mb=$MB '{ printf "%.1f", 2 * mb * 1.048576 / ($2 - $1) }'
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(grep -c ^processor /proc/cpuinfo) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "path: $P on $(df --output=source,fstype "$P" | tail -1)"
for i in $(seq "$R"); do
    d=$(dd_mbps)
    u=$("$B/tools/bench_nvme" "$P" 24 32 3 | sed 's/nvme swap: \([0-9.]*\) MB.*/\1/')
    t=$(ZT_NVME_IO=threads "$B/tools/bench_nvme" "$P" 24 32 3 | sed 's/nvme swap: \([0-9.]*\) MB.*/\1/')
    echo "bandwidth $i: dd read+write $d MB/s; swap io_uring $u MB/s ($(echo "$u $d" | awk '{printf "%.2f", $1/$2}')x dd), threads $t MB/s ($(echo "$t $d" | awk '{printf "%.2f", $1/$2}')x dd)"
    echo "$d" >>"$out/dd"
done

# the step: in memory and on disk, back to back
"$PY" tools/rand_tokens.py "$out/tok.h5" 200000 257 >/dev/null
job="inputs/tiny.cfg data.train_files=$out/tok.h5 data.val_files=[] model.n_layer=12 model.n_embd=512 model.n_head=8
  model.block_size=128 data.seq_len=128 train.per_device_train_batch_size=${STEP_ROWS:-4} train.max_steps=6
  train.eval_steps=0 train.sample_tokens=0 checkpoint.save_at_end=false checkpoint.save_hf=false
  parallel.strategy=zero2"
step() { # median step time of steps 3..6
    "$PY" - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l]
print(f"{statistics.median(r['step_s'] for r in recs if r['step'] >= 3):.3f}")
PY
}
for i in $(seq "$R"); do
    # shellcheck disable=SC2086
    "$B/ztrain" $job parallel.offload_optimizer=cpu train.output_dir="$out/mem$i" >"$out/mem$i.log" 2>&1 ||
        { tail -3 "$out/mem$i.log"; exit 1; }
    # shellcheck disable=SC2086
    "$B/ztrain" $job parallel.offload_optimizer=nvme parallel.offload_nvme_path="$P" train.output_dir="$out/nv$i" \
        >"$out/nv$i.log" 2>&1 || { tail -3 "$out/nv$i.log"; exit 1; }
    tm=$(step "$out/mem$i") tn=$(step "$out/nv$i")
    # bytes a step moves: the file, read and written once
    fb=$(grep -o 'offload: nvme, [0-9.]* [KMG]iB' "$out/nv$i.log" | awk '{v=$3; u=$4; m=(u=="GiB")?1073741824:(u=="MiB")?1048576:1024; printf "%.0f", v*m}')
    d=$(tail -1 "$out/dd")
    echo "$tm $tn $fb $d" | awk -v i="$i" '{ io = 2 * $3 / ($4 * 1e6); hid = 1 - ($2 - $1) / io;
        printf "step %s: in host memory %.3f s, optimizer state on disk %.3f s (%.2fx); %.0f MB a step to and from disk = %.3f s at dd'"'"'s %.0f MB/s, %.0f%% of it hidden\n",
        i, $1, $2, $2 / $1, 2 * $3 / 1e6, io, $4, 100 * hid }'
    grep -h "nvme (rank 0)" "$out/nv$i.log"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
