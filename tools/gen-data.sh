#!/bin/sh
# gen-data.sh — builds the token files the project's inputs and tests use, from
# English text that any Debian 12 machine can install without internet beyond apt:
# the fortune cookie databases of the `fortunes` (~2.5 MB of text) and
# `fortunes-min` packages (/usr/share/games/fortunes, installed by
# tools/install-deps.sh). With only fortunes-min (~100 KB) it still works, with a
# warning.
#
#   tools/gen-data.sh [BUILDDIR [OUTDIR]]      (BUILDDIR: env ZT_BUILDDIR or ".")
#
# Writes, byte-level (vocab 257, EOT 256 between fortunes):
#   OUTDIR/train.h5, OUTDIR/val.h5            the default job's data (every 10th fortune is validation)
#   OUTDIR/tiny-train.h5, OUTDIR/tiny-val.h5  ~8 KB and ~2 KB for tests
# and, only when ZT_GPT2_DIR holds GPT-2's vocab.json and merges.txt (not
# packaged by Debian: copy them from a Hugging Face gpt2 download),
#   OUTDIR/gpt2-train.h5, OUTDIR/gpt2-val.h5  the same text as GPT-2 BPE (inputs/gpt2-124m.cfg)
# Deterministic and idempotent: the same packages give byte-identical token streams,
# and each file is replaced atomically by zt-prep-data.
set -eu

BUILDDIR=${1:-${ZT_BUILDDIR:-.}}
OUTDIR=${2:-data}
FORTUNES=${ZT_FORTUNES_DIR:-/usr/share/games/fortunes}
PREP="$BUILDDIR/zt-prep-data"

[ -x "$PREP" ] || { echo "gen-data.sh: $PREP not found: build first (make), or pass the build dir" >&2; exit 1; }
[ -d "$FORTUNES" ] || { echo "gen-data.sh: $FORTUNES missing: apt-get install fortunes fortunes-min (tools/install-deps.sh)" >&2; exit 1; }

# The fortune text files: skip the random-access indexes (.dat), the .u8 symlinks and
# ascii-art (pictures, not language). C collation keeps the order fixed.
export LC_ALL=C
files=$(find "$FORTUNES" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name 'ascii-art' | sort)
[ -n "$files" ] || { echo "gen-data.sh: no fortune files in $FORTUNES" >&2; exit 1; }

mkdir -p "$OUTDIR"
work=$(mktemp -d "${TMPDIR:-/tmp}/zt-gen-data.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# Plain text: drop overstriking (char, backspace) used for underlining, carriage
# returns and trailing blanks; "%" lines separate fortunes and stay, for
# zt-prep-data --eot-at-line to turn into EOT. Fortune k goes to validation when
# k % 10 == 9, so both splits sample every database. The tiny files take the first
# fortunes of each split up to 8 KB / 2 KB.
# shellcheck disable=SC2086
cat $files | sed -e ':a' -e 's/[^\x08]\x08//' -e 'ta' -e 's/\x08//g' -e 's/\r$//' -e 's/[ \t]*$//' | awk -v dir="$work" '
    function put(name, text) { printf "%s%%\n", text > (dir "/" name ".txt") }
    function flush() {
        if (buf != "") {
            if (n % 10 == 9) {
                put("val", buf)
                if (vbytes + length(buf) <= 2048) { put("tiny-val", buf); vbytes += length(buf) + 2 }
            } else {
                put("train", buf)
                if (tbytes + length(buf) <= 8192) { put("tiny-train", buf); tbytes += length(buf) + 2 }
            }
            n++
        }
        buf = ""
    }
    /^%$/ { flush(); next }
    { if (buf != "" || $0 != "") buf = buf $0 "\n" }
    END { flush(); printf "gen-data.sh: %d fortunes\n", n }'

bytes=$(cat "$work/train.txt" "$work/val.txt" | wc -c)
echo "gen-data.sh: $bytes bytes of text from $FORTUNES"
[ "$bytes" -ge 1000000 ] || echo "gen-data.sh: warning: only $bytes bytes of text; install the 'fortunes' package for ~2.5 MB" >&2

for name in train val tiny-train tiny-val; do
    "$PREP" --val-fraction 0 --eot-at-line % -o "$OUTDIR/$name.h5" "$work/$name.txt"
done

if [ -n "${ZT_GPT2_DIR:-}" ]; then
    if [ -f "$ZT_GPT2_DIR/vocab.json" ] && [ -f "$ZT_GPT2_DIR/merges.txt" ]; then
        for name in train val; do
            "$PREP" --bpe "$ZT_GPT2_DIR/vocab.json" "$ZT_GPT2_DIR/merges.txt" --val-fraction 0 \
                --eot-at-line % -o "$OUTDIR/gpt2-$name.h5" "$work/$name.txt"
        done
    else
        echo "gen-data.sh: ZT_GPT2_DIR=$ZT_GPT2_DIR lacks vocab.json or merges.txt: no GPT-2 BPE files" >&2
        exit 1
    fi
fi
