#!/bin/sh
# sft_prep.sh — zt-prep-data --format on the committed LLaMA-Factory fixtures
# (tests/reference/sft): the SFT sample file it writes (/input_ids, /labels, /sample_offsets,
# read back with h5py) holds exactly LLaMA-Factory's input_ids and labels for cases that
# cover each data format and option (truncation, train_on_prompt, mask_history, packing;
# with --neat-packing also /segment_ids = LLaMA-Factory's neat attention_mask),
# its padding id is the template's pad, --max-samples keeps the first records of each
# input, and bad data fails with one line naming the file, the record and the key. With --ranking
# the pairs file holds LLaMA-Factory's pairwise samples (tests/reference/sft/pairwise), chosen then
# rejected, and the attribute pairs = 1. Needs python3 with h5py (SKIP, exit 77, without it).
set -eu
B=${ZT_BUILDDIR:-$(pwd)}
S=${ZT_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${PYTHON3:-/usr/bin/python3}
if ! "$PY" -c "import h5py" 2>/dev/null; then
    echo "SKIP: python3 with h5py is needed (tools/install-deps.sh installs it)"
    exit 77
fi
F="$S/tests/reference/sft"
d=$(mktemp -d /tmp/zt_sft_prep.XXXXXX)
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: sft_prep: $*" >&2; exit 1; }

for name in qwen3-alpaca llama2-sharegpt-cut40 mistral-sharegpt llama3-sharegpt-mask-history \
        llama3-alpaca-train-on-prompt qwen-messages qwen-alpaca-packing default-sharegpt-packing \
        qwen3_nothink-1100-neat-packing llama3-alpaca-train-on-prompt-neat-packing; do
    # the case's options as zt-prep-data flags, from cases.json
    args=$("$PY" - "$F/cases.json" "$name" <<'PYEOF'
import json, sys
c = next(c for c in json.load(open(sys.argv[1]))["cases"] if c["name"] == sys.argv[2])
a = ["--tokenizer", c["tokenizer"], "--format", c["format"], "--template", c["template"],
     "--cutoff-len", str(c["cutoff_len"]), c["data"]]
a += [f for f, k in (("--train-on-prompt", "train_on_prompt"), ("--mask-history", "mask_history"),
                     ("--packing", "packing"), ("--neat-packing", "neat_packing")) if c.get(k)]
print(" ".join(a))
PYEOF
)
    # shellcheck disable=SC2086
    (cd "$F" && "$B/zt-prep-data" $args -o "$d/$name.h5") >"$d/log" 2>&1 || { cat "$d/log"; fail "$name: zt-prep-data failed"; }
    "$PY" - "$F/cases.json" "$name" "$d/$name.h5" <<'PYEOF' || fail "$name: the SFT file differs from LLaMA-Factory"
import json, sys
import h5py
c = next(c for c in json.load(open(sys.argv[1]))["cases"] if c["name"] == sys.argv[2])
f = h5py.File(sys.argv[3], "r")
ids, labels, off = f["input_ids"][:].tolist(), f["labels"][:].tolist(), f["sample_offsets"][:].tolist()
want_off = [0]
for s in c["input_ids"]:
    want_off.append(want_off[-1] + len(s))
ok = off == want_off
ok = ok and ids == [t for s in c["input_ids"] for t in s] and labels == [t for s in c["labels"] for t in s]
ok = ok and int(f.attrs["eot_token"]) == c["special"]["pad"]
if c.get("neat_packing"):
    ok = ok and f["segment_ids"][:].tolist() == [t for s in c["attention_mask"] for t in s]
else:
    ok = ok and "segment_ids" not in f
print(sys.argv[2], "samples", len(off) - 1, "tokens", len(ids), "ok" if ok else "DIFFERENT")
sys.exit(0 if ok else 1)
PYEOF
done

# --max-samples N: the first N records of each input, as LLaMA-Factory's max_samples takes
# range(N) of each dataset before merging them: of alpaca.json (7 records) twice, samples
# 0-2 and 0-2 of the whole file's
(cd "$F" && "$B/zt-prep-data" --tokenizer tok/qwen --format alpaca --template qwen -o "$d/all.h5" alpaca.json &&
    "$B/zt-prep-data" --tokenizer tok/qwen --format alpaca --template qwen --max-samples 3 -o "$d/ms.h5" \
        alpaca.json alpaca.json) >"$d/log" 2>&1 || { cat "$d/log"; fail "zt-prep-data --max-samples failed"; }
grep -q "8 records past --max-samples 3 not read" "$d/log" || { cat "$d/log"; fail "--max-samples: no count of the records left"; }
"$PY" - "$d/all.h5" "$d/ms.h5" <<'PYEOF' || fail "--max-samples 3: not the first 3 samples of each input"
import sys
import h5py
a, m = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def samples(f, key):
    o, v = f["sample_offsets"][:].tolist(), f[key][:].tolist()
    return [v[o[i]:o[i + 1]] for i in range(len(o) - 1)]
ok = all(samples(m, k) == 2 * samples(a, k)[:3] for k in ("input_ids", "labels"))
sys.exit(not ok)
PYEOF
if "$B/zt-prep-data" --max-samples 3 -o "$d/t.h5" --val-fraction 0 "$F/alpaca.json" 2>"$d/err"; then
    fail "--max-samples was accepted for plain text"
fi
grep -q "max-samples need --format" "$d/err" || { cat "$d/err"; fail "--max-samples without --format: no error"; }
if "$B/zt-prep-data" --tokenizer "$F/tok/qwen" --format alpaca --template qwen --max-samples 0 -o "$d/x.h5" \
        "$F/alpaca.json" 2>"$d/err"; then
    fail "--max-samples 0 was accepted"
fi
grep -q "max-samples '0' is not a positive integer" "$d/err" || { cat "$d/err"; fail "--max-samples 0: no error"; }

# bad data: exit 1, one line naming file, record and key
printf '[{"instruction": "a", "output": "b"}, {"instruction": "c"}]\n' >"$d/bad.json"
if "$B/zt-prep-data" --tokenizer "$F/tok/qwen" --format alpaca --template qwen -o "$d/x.h5" "$d/bad.json" 2>"$d/err"; then
    fail "a record without output was accepted"
fi
grep -q "bad.json: record 1: output: missing" "$d/err" || { cat "$d/err"; fail "no file/record/key in the error"; }
[ "$(wc -l <"$d/err")" -eq 1 ] || fail "the error is not one line"
printf '{"conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q"}]}\n' >"$d/bad.jsonl"
if "$B/zt-prep-data" --tokenizer "$F/tok/qwen" --format sharegpt --template qwen -o "$d/x.h5" "$d/bad.jsonl" 2>"$d/err"; then
    fail "turns out of order were accepted"
fi
grep -q "record 0 (line 1): conversations\[1\].from: 'human' where 'gpt' is expected" "$d/err" || { cat "$d/err"; fail "turn order error"; }
if "$B/zt-prep-data" --tokenizer "$F/tok/gpt2" --format alpaca --template llama3 -o "$d/x.h5" "$F/alpaca.json" 2>"$d/err"; then
    fail "llama3 accepted a tokenizer without <|eot_id|>"
fi
grep -q "<|eot_id|>" "$d/err" || fail "missing token not named"
[ ! -e "$d/x.h5" ] && [ ! -e "$d/x.h5.tmp" ] || fail "a failed run left a file behind"
# --ranking: preference pairs (messages' fixed names), LLaMA-Factory's pairwise samples in a pairs file
"$B/zt-prep-data" --tokenizer "$F/tok/llama3" --format messages --ranking --template llama3 --cutoff-len 24 \
    -o "$d/pairs.h5" "$F/pairwise/messages_pairs.json" >"$d/out" || fail "--ranking failed"
grep -q "2 records -> $d/pairs.h5: 4 samples, .*, preference pairs" "$d/out" || { cat "$d/out"; fail "--ranking output"; }
"$PY" "$S/tests/mpi/check_pairs.py" "$d/pairs.h5" "$F/pairwise/cases.json" messages_pairs llama3 24 ||
    fail "--ranking's pairs are not LLaMA-Factory's"
if "$B/zt-prep-data" --tokenizer "$F/tok/qwen" --format alpaca --ranking --packing --template qwen -o "$d/y.h5" \
    "$F/pairwise/alpaca_pairs.json" 2>"$d/err"; then
    fail "--ranking --packing was accepted"
fi
grep -q "packing: not for preference pairs" "$d/err" || { cat "$d/err"; fail "--ranking --packing error"; }
echo "sft_prep: zt-prep-data writes LLaMA-Factory's samples and pairs"
