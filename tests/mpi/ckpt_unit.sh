#!/bin/sh
# ckpt_unit.sh — the checkpoint unit tests (tests/unit/test_ckpt) at 1, 2 and 3
# ranks, then the zt-ckpt tool on a checkpoint they leave behind: info, verify
# (good and corrupted), consolidate, export -> import round trip checked with
# h5py and a pure-python safetensors reader.
. "$(dirname "$0")/common.sh"

TEST_CKPT="$ZT_BUILDDIR/tests/unit/test_ckpt"
ZT_CKPT="$ZT_BUILDDIR/zt-ckpt"
[ -x "$TEST_CKPT" ] || skip "$TEST_CKPT not built"
: "${PYTHON3:=python3}"

for np in 1 2 3; do
    TMPDIR="$ZT_TMP" "$ZT_MPIRUN" "$np" "$TEST_CKPT" > "$ZT_TMP/unit-$np.log" 2>&1 ||
        { cat "$ZT_TMP/unit-$np.log"; fail "test_ckpt at -np $np"; }
    echo "test_ckpt -np $np: passed"
done

[ -x "$ZT_CKPT" ] || { echo "zt-ckpt not built: tool checks skipped"; exit 0; }
# keep the fixtures of a 3-rank run for the tool
rm -rf "$ZT_TMP"/zt_ckpt_test.*
ZT_KEEP_TMP=1 TMPDIR="$ZT_TMP" "$ZT_MPIRUN" 3 "$TEST_CKPT" > "$ZT_TMP/unit-keep.log" 2>&1 || fail "test_ckpt (keep)"
D=$(ls -d "$ZT_TMP"/zt_ckpt_test.*)
SH=$(ls -d "$D"/consolidate/ckpt-*.shards)

"$ZT_CKPT" info "$D/consolidate/merged.h5" > "$ZT_TMP/info.txt" || fail "zt-ckpt info"
assert_contains "$ZT_TMP/info.txt" "transformer.h.1.attn.c_attn.weight           (8, 24)"
assert_contains "$ZT_TMP/info.txt" "step         3"
assert_contains "$ZT_TMP/info.txt" "n_layer = 2"
"$ZT_CKPT" verify "$D/consolidate/merged.h5" || fail "verify of a good consolidated checkpoint"
"$ZT_CKPT" verify "$SH" || fail "verify of a good sharded checkpoint"
"$ZT_CKPT" verify "$D/nan" > "$ZT_TMP/v.txt" && fail "verify accepted NaN"
assert_contains "$ZT_TMP/v.txt" "transformer.h.0.attn.c_attn.weight holds NaN or Inf"
# String attributes as other tools write them: h5py rewrites every root string
# attribute (format, strategy, config, ...) of a good checkpoint in one form at a
# time, and zt-ckpt must verify it and report exactly what it reports for the
# original (so every string, the config text included, is read back in full).
# "str" is what h5py writes for a Python str (variable-length UTF-8), "bytes_" for
# np.bytes_ (fixed length, NULLPAD, no terminator).
"$ZT_CKPT" info "$D/consolidate/merged.h5" | sed 1d > "$ZT_TMP/info-orig.txt" || fail "zt-ckpt info"
for kind in str bytes_ vlen-ascii fixed-ascii-nullterm fixed-ascii-nullpad fixed-ascii-spacepad \
            fixed-utf8-nullterm fixed-utf8-nullpad fixed-utf8-spacepad; do
    s="$ZT_TMP/str-$kind.h5"
    cp "$D/consolidate/merged.h5" "$s" || fail "cp"
    "$PYTHON3" - "$s" "$kind" <<'PY' || fail "h5py could not rewrite the string attributes of $s as $kind"
import sys, h5py, numpy as np
path, kind = sys.argv[1], sys.argv[2]
f = h5py.File(path, "r+")
names = [k for k in f.attrs if isinstance(f.attrs[k], (bytes, str, np.bytes_))]
assert "format" in names and "config" in names, names
for k in names:
    s = f.attrs[k]
    s = s.decode() if isinstance(s, bytes) else str(s)
    del f.attrs[k]
    if kind == "str":
        f.attrs[k] = s
    elif kind == "bytes_":
        f.attrs[k] = np.bytes_(s.encode())
    elif kind == "vlen-ascii":
        f.attrs.create(k, s.encode(), dtype=h5py.string_dtype("ascii"))
    else:                       # fixed-<cset>-<pad>, padded beyond the text
        _, cset, pad = kind.split("-")
        b = s.encode()
        size = len(b) + (1 if pad == "nullterm" else 4)
        t = h5py.h5t.C_S1.copy()
        t.set_size(size)
        t.set_strpad({"nullterm": h5py.h5t.STR_NULLTERM, "nullpad": h5py.h5t.STR_NULLPAD,
                      "spacepad": h5py.h5t.STR_SPACEPAD}[pad])
        t.set_cset(h5py.h5t.CSET_UTF8 if cset == "utf8" else h5py.h5t.CSET_ASCII)
        a = h5py.h5a.create(f.id, k.encode(), t, h5py.h5s.create(h5py.h5s.SCALAR))
        a.write(np.array(b.ljust(size, b" " if pad == "spacepad" else b"\0"), dtype="S%d" % size), mtype=t)
f.close()
PY
    "$ZT_CKPT" verify "$s" > "$ZT_TMP/str-$kind.txt" 2>&1 || { cat "$ZT_TMP/str-$kind.txt"; fail "zt-ckpt verify rejects string attributes written as $kind"; }
    "$ZT_CKPT" info "$s" 2>&1 | sed 1d > "$ZT_TMP/info-$kind.txt"
    cmp -s "$ZT_TMP/info-orig.txt" "$ZT_TMP/info-$kind.txt" ||
        { diff "$ZT_TMP/info-orig.txt" "$ZT_TMP/info-$kind.txt" | head -20; fail "zt-ckpt info reads string attributes written as $kind differently"; }
    echo "ok: string attributes as $kind: verify and info as for the original"
done

# flip one stored value: the checksum must catch it
"$PYTHON3" -c "
import h5py, sys
f = h5py.File(sys.argv[1], 'r+'); d = f['optimizer/exp_avg/transformer.wpe.weight']; d[1, 2] = d[1, 2] + 1.0
" "$D/consolidate/merged.h5" || fail "h5py edit"
"$ZT_CKPT" verify "$D/consolidate/merged.h5" > "$ZT_TMP/v2.txt" && fail "verify missed a changed value"
assert_contains "$ZT_TMP/v2.txt" "/optimizer/exp_avg/transformer.wpe.weight checksum"

"$ZT_CKPT" consolidate "$SH" "$ZT_TMP/c.h5" || fail "consolidate"
"$ZT_CKPT" verify "$ZT_TMP/c.h5" || fail "verify consolidated output"
# export creates the directories it writes into (mkdir -p): hf/ does not exist yet
[ ! -e "$ZT_TMP/hf" ] || fail "$ZT_TMP/hf exists before the export"
"$ZT_CKPT" export "$ZT_TMP/c.h5" "$ZT_TMP/hf/model.safetensors" || fail "export into a new directory"
# OUTDIR form (not ending in .safetensors), two levels missing
"$ZT_CKPT" export "$ZT_TMP/c.h5" "$ZT_TMP/out/a/b" > "$ZT_TMP/export-dir.txt" || fail "export into a new OUTDIR"
[ -s "$ZT_TMP/out/a/b/model.safetensors" ] && [ -s "$ZT_TMP/out/a/b/config.json" ] ||
    fail "export CKPT OUTDIR wrote no OUTDIR/model.safetensors and OUTDIR/config.json"
cmp -s "$ZT_TMP/out/a/b/model.safetensors" "$ZT_TMP/hf/model.safetensors" || fail "export into OUTDIR wrote other weights"
# a directory that cannot be created: the error names it
: > "$ZT_TMP/plainfile"
"$ZT_CKPT" export "$ZT_TMP/c.h5" "$ZT_TMP/plainfile/sub" > "$ZT_TMP/export-bad.txt" 2>&1 &&
    fail "export under a regular file succeeded"
assert_contains "$ZT_TMP/export-bad.txt" "$ZT_TMP/plainfile: cannot create directory"
echo "ok: export creates missing output directories and names one it cannot create"
# --merge is for LoRA checkpoints
"$ZT_CKPT" export "$ZT_TMP/c.h5" "$ZT_TMP/merged" --merge > "$ZT_TMP/export-merge.txt" 2>&1 &&
    fail "export --merge of a checkpoint without adapters succeeded"
assert_contains "$ZT_TMP/export-merge.txt" "--merge: not a LoRA checkpoint"
[ ! -e "$ZT_TMP/merged" ] || fail "a refused export --merge left $ZT_TMP/merged"
assert_contains "$ZT_TMP/hf/config.json" '"model_type": "gpt2"'
"$ZT_CKPT" import "$ZT_TMP/hf/model.safetensors" "$ZT_TMP/hf/config.json" "$ZT_TMP/imported.h5" || fail "import"
"$ZT_CKPT" verify "$ZT_TMP/imported.h5" || fail "verify imported"
"$PYTHON3" - "$ZT_TMP/hf/model.safetensors" "$ZT_TMP/imported.h5" "$ZT_TMP/c.h5" <<'PY' || fail "safetensors/h5 comparison"
import json, struct, sys
import h5py, numpy as np
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n]); data = b[8 + n:]
t = {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
     for k, v in hdr.items() if k != "__metadata__"}
for h5 in sys.argv[2:]:
    f = h5py.File(h5, "r")
    assert f.attrs["format"] == b"ztrain-checkpoint" or f.attrs["format"] == "ztrain-checkpoint"
    assert sorted(t) == sorted(f["model"]), h5
    for k, v in t.items():
        assert np.array_equal(v, f["model"][k][()]), (h5, k)
print("export/import: %d tensors equal" % len(t))
PY
# import accepts HF names without the "transformer." prefix and ignores attn.bias buffers
"$PYTHON3" - "$ZT_TMP/hf/model.safetensors" "$ZT_TMP/hf/bare.safetensors" <<'PY' || fail "rename"
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n]); data = b[8 + n:]
new = {}
for k, v in hdr.items():
    new[k.replace("transformer.", "", 1) if k != "__metadata__" else k] = v
end = max(v["data_offsets"][1] for k, v in hdr.items() if k != "__metadata__")
new["h.0.attn.bias"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
h = json.dumps(new).encode(); h += b" " * (-len(h) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + data + b"\0\0\0\0")
PY
"$ZT_CKPT" import "$ZT_TMP/hf/bare.safetensors" "$ZT_TMP/hf/config.json" "$ZT_TMP/bare.h5" || fail "import bare names"
"$ZT_CKPT" verify "$ZT_TMP/bare.h5" || fail "verify bare import"
# a malformed file is rejected with its name
printf 'garbage!' > "$ZT_TMP/bad.safetensors"
"$ZT_CKPT" import "$ZT_TMP/bad.safetensors" "$ZT_TMP/hf/config.json" "$ZT_TMP/x.h5" > "$ZT_TMP/bad.txt" 2>&1 &&
    fail "import accepted garbage"
assert_contains "$ZT_TMP/bad.txt" "bad.safetensors"
echo "PASS: ckpt_unit"
