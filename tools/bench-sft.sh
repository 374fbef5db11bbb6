#!/bin/sh
# bench-sft.sh — speed of SFT preprocessing (read JSON, template, tokenize, mask) on the
# fortune databases (/usr/share/games/fortunes) rendered as alpaca records: the first line
# of each fortune is the instruction, the rest the output (one-line fortunes: "Say
# something wise." and the line), repeated REPEAT times (default 4, about 10 MB of JSON).
# Prints zt-prep-data's tokens/s, which times one process on one core from reading the
# JSON to the masked samples (the HDF5 write is not counted).
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
for mode in "" "--mask-history" "--packing"; do
    # shellcheck disable=SC2086
    "$B/zt-prep-data" --tokenizer "$TOK" --format alpaca --template "$TPL" --cutoff-len 1024 $mode \
        -o "$d/out.h5" "$d/fortunes.json" | sed "s|$d/||; s|^|${mode:-plain}: |"
done
