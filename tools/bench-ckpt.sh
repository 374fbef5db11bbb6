#!/bin/sh
# bench-ckpt.sh [BUILDDIR] — checkpoint save/load bandwidth of GPT-2 124M with
# optimizer state (1.49 GB) from 2 ranks, side by side with dd's sequential write
# bandwidth (conv=fdatasync) to the same directory, in one run. Target: consolidated
# save >= 70% of dd. ztrain's figure includes create, collective write, fsync,
# rename and the `latest` pointer.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
DIR=${ZT_BENCH_DIR:-runs/bench-ckpt}
[ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
rm -rf "$DIR" && mkdir -p "$DIR"
trap 'rm -rf "$DIR"' EXIT
echo "checkpoint benchmark — $(date -u +%Y-%m-%d), $(nproc --all) cores, $(df -h "$DIR" | awk 'NR == 2 { print $1 }')"
dd_mbs() {
    # 1.5 GB, like the checkpoint; dd prints bytes and seconds on its last line
    dd if=/dev/zero of="$DIR/dd.bin" bs=16M count=90 conv=fdatasync 2>&1 | tail -1 |
        awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) s = $(i - 1); print $1 / s / 1e6 }'
    rm -f "$DIR/dd.bin"
}
ddw=$(dd_mbs)
for fmt in consolidated sharded; do
    for st in ddp zero3; do
        out="$DIR/$fmt-$st"
        mpirun $root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
            "$B/ztrain" inputs/gpt2-124m.cfg data.train_files=data/train.h5 data.val_files=[] train.max_steps=1 \
            train.sample_tokens=0 parallel.strategy=$st checkpoint.format=$fmt train.output_dir="$out" >"$out.log" 2>&1
        save=$(sed -n 's/.*checkpoint: step 1 saved.*s, \([0-9.]*\) MB\/s).*/\1/p' "$out.log")
        mpirun $root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
            "$B/ztrain" inputs/gpt2-124m.cfg data.train_files=data/train.h5 data.val_files=[] train.max_steps=1 \
            train.sample_tokens=0 parallel.strategy=$st checkpoint.format=$fmt train.output_dir="$out" \
            checkpoint.resume=auto checkpoint.save_at_end=false >"$out.load.log" 2>&1
        load=$(sed -n 's/.*resumed from.*s, \([0-9.]*\) MB\/s).*/\1/p' "$out.load.log")
        dd2=$(dd_mbs)
        printf '%-13s %-6s save %7s MB/s (%3s%% of dd %s / %s MB/s)   load %7s MB/s\n' "$fmt" "$st" "$save" \
            "$(awk "BEGIN { printf \"%.0f\", 100 * $save / (($ddw + $dd2) / 2) }")" "$ddw" "$dd2" "$load"
        ddw=$dd2
    done
done
