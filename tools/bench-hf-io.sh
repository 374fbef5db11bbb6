#!/bin/sh
# bench-hf-io.sh [BUILDDIR [NP]] — Hugging Face directory I/O against dd, side by side.
#
# Writes a ~125M-parameter Llama-style model (L=12, C=768, 12 heads, 4 KV heads,
# MLP 2048, vocabulary 32000, untied: 500 MB in fp32) as an HF directory with NP ranks
# (checkpoint.save_hf of a 1-step run at learning rate 0), then loads it back with NP
# ranks (model.name_or_path) with the page cache dropped, in fp32 and in bf16, and
# times dd writing (conv=fdatasync) and reading (cache dropped) the same bytes. Prints
# each as MB/s and the ratio. Root is needed to drop the page cache (else the read
# rows say "warm cache").
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
NP=${2:-2}
ZT="$PWD/$B/ztrain"
[ -x "$ZT" ] || { echo "bench-hf-io: build first (sh tools/build.sh $B)"; exit 1; }
W=$(mktemp -d /var/tmp/zt-hfio.XXXXXX)
trap 'rm -rf "$W"' EXIT
drop() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; echo cold; else echo warm; fi; }
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -np $NP"
/usr/bin/python3 tests/mpi/hf_dir.py tokens "$W/tok.h5" 32000 200000
llama="model.arch=llama model.n_layer=12 model.n_embd=768 model.n_head=12 model.n_kv_head=4
  model.intermediate_size=2048 model.vocab_size=32000 model.block_size=128"
run="$W/cfg"
cat >"$run" <<'EOF'
data = { val_files = []; seq_len = 16; };
train = { per_device_train_batch_size = 1; max_steps = 1; sample_tokens = 0; };
optim = { learning_rate = 0.0; warmup_steps = 0; };
checkpoint = { save_at_end = false; };
log = { plot = false; };
EOF
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; disk of $W: $(df -h "$W" | awk 'NR==2 {print $1}'); $(date -u +%FT%TZ); $NP ranks"
for dt in fp32 bf16; do
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 $MPI "$ZT" "$run" data.train_files="$W/tok.h5" $llama checkpoint.hf_dtype=$dt \
        train.output_dir="$W/w-$dt" >"$W/w-$dt.log" 2>&1
    ws=$(sed -n 's/.*HF export: .*, \([0-9.]*\) s).*/\1/p' "$W/w-$dt.log")
    bytes=$(du -sb "$W/w-$dt/hf" | cut -f1)
    cache=$(drop)
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 $MPI "$ZT" "$run" data.train_files="$W/tok.h5" model.name_or_path="$W/w-$dt/hf" \
        parallel.strategy=zero3 checkpoint.save_hf=false train.output_dir="$W/r-$dt" >"$W/r-$dt.log" 2>&1
    rs=$(sed -n 's/.*read by [0-9]* ranks in \([0-9.]*\) s.*/\1/p' "$W/r-$dt.log")
    dd if=/dev/zero of="$W/dd" bs=8M count=$((bytes / 8388608)) conv=fdatasync 2>"$W/ddw" >/dev/null
    ddw=$(sed -n 's/.* s, \([0-9.]*\) \([MG]\)B\/s$/\1 \2/p' "$W/ddw" | awk '{print $2 == "G" ? $1 * 1000 : $1}')
    drop >/dev/null
    dd if="$W/dd" of=/dev/null bs=8M 2>"$W/ddr" >/dev/null
    ddr=$(sed -n 's/.* s, \([0-9.]*\) \([MG]\)B\/s$/\1 \2/p' "$W/ddr" | awk '{print $2 == "G" ? $1 * 1000 : $1}')
    rm -f "$W/dd"
    awk -v dt=$dt -v b="$bytes" -v ws="$ws" -v rs="$rs" -v ddw="$ddw" -v ddr="$ddr" -v c="$cache" 'BEGIN {
        w = b / ws / 1e6; r = b / rs / 1e6;
        printf "%s: %.0f MB: write %.0f MB/s (dd %.0f, %.0f%%) | read (%s cache) %.0f MB/s (dd %.0f, %.0f%%)\n",
               dt, b / 1e6, w, ddw, 100 * w / ddw, c, r, ddr, 100 * r / ddr }'
done
