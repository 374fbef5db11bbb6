#!/bin/sh
# bench-sft.sh — speed of SFT preprocessing (read JSON, template, tokenize, mask) on the
# fortune databases (/usr/share/games/fortunes) rendered as alpaca records: the first line
# of each fortune is the instruction, the rest the output (one-line fortunes: "Say
# something wise." and the line), repeated REPEAT times (default 4, about 10 MB of JSON).
# Prints zt-prep-data's tokens/s, which times one process on one core from reading the
# JSON to the masked samples (the HDF5 write is not counted).
# With RANKS (e.g. RANKS="1 2"), the trainer's preprocessing (data.format = alpaca, every
# rank tokenizing a share, rank 0 writing) at each world size instead, without and with
# packing, ROUNDS times (default 2), alternating: the seconds ztrain logs up to the
# gathered samples and with the HDF5 write.
#   tools/bench-sft.sh [BUILDDIR [TOKENIZER [TEMPLATE [REPEAT]]]]
set -eu
B=${1:-${ZT_BUILDDIR:-build}}
S=$(cd "$(dirname "$0")/.." && pwd)
TOK=${2:-$S/tests/reference/sft/tok/qwen}
TPL=${3:-qwen}
REP=${4:-4}
d=$(mktemp -d /tmp/zt_bench_sft.XXXXXX)
trap 'rm -rf "$d"' EXIT
python3 - "$d/fortunes.json" "$REP" <<'PY'
import glob, json, os, sys
recs = []
for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if not os.path.isfile(f) or f.endswith((".dat", ".u8")) or "ascii-art" in f:
        continue
    for fortune in open(f, encoding="utf-8", errors="replace").read().split("\n%\n"):
        lines = [l.rstrip() for l in fortune.strip("\n").split("\n")]
        if not lines or not lines[0]:
            continue
        if len(lines) == 1:
            recs.append({"instruction": "Say something wise.", "input": "", "output": lines[0]})
        else:
            recs.append({"instruction": lines[0], "input": "", "output": "\n".join(lines[1:])})
with open(sys.argv[1], "w") as out:
    json.dump(recs * int(sys.argv[2]), out)
print(f"{len(recs)} fortunes x {sys.argv[2]} = {len(recs) * int(sys.argv[2])} alpaca records, "
      f"{os.path.getsize(sys.argv[1]) / 1e6:.1f} MB of JSON")
PY
if [ -n "${RANKS:-}" ]; then
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
         "$(nproc) cores, load $(uptime | sed 's/.*load average: //')"
    V=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['model']['vocab']) + 64)" "$TOK/tokenizer.json")
    for round in $(seq "${ROUNDS:-2}"); do
        for pk in false true; do
            for np in $RANKS; do
                rm -f "$d"/fortunes.json.*.sft.h5
                # shellcheck disable=SC2086
                OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to none \
                    -np "$np" "$B/ztrain" "$S/inputs/tiny.cfg" model.arch=llama model.n_layer=1 model.n_head=2 \
                    model.n_kv_head=1 model.n_embd=16 model.intermediate_size=32 model.vocab_size="$V" \
                    model.block_size=1024 data.seq_len=1023 data.format=alpaca data.template="$TPL" \
                    data.tokenizer="$TOK" data.cutoff_len=1024 data.packing=$pk data.train_files="$d/fortunes.json" \
                    data.val_files=[] train.max_steps=1 train.eval_steps=0 train.sample_tokens=0 \
                    checkpoint.save_at_end=false checkpoint.save_hf=false log.plot=false train.output_dir="$d/run" \
                    2>&1 | sed -n "s|.*data: .* -> [^:]*: |round $round packing=$pk: |p"
            done
        done
    done
    exit 0
fi
for mode in "" "--mask-history" "--packing"; do
    # shellcheck disable=SC2086
    "$B/zt-prep-data" --tokenizer "$TOK" --format alpaca --template "$TPL" --cutoff-len 1024 $mode \
        -o "$d/out.h5" "$d/fortunes.json" | sed "s|$d/||; s|^|${mode:-plain}: |"
done
