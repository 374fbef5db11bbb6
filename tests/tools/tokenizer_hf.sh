#!/bin/sh
# tokenizer_hf.sh — zt-prep-data against Hugging Face on whole files (needs the venv of
# tools/make-venv.sh; SKIP, exit 77, without it):
#  1. ztrain's byte tokenizer written as tokenizer.json (--write-byte-tokenizer) loads in
#     transformers' AutoTokenizer, encodes a text to exactly the ids of zt-prep-data's
#     byte-level token file and decodes them back to the text;
#  2. for each fixture tokenizer (tests/reference/tokenizers: byte-level gpt2, llama3, qwen2;
#     SentencePiece-style llama2, mistral, gemma), `zt-prep-data --tokenizer`
#     on a ~1 MB file (fortunes + multilingual text + special tokens) and on ~0.5 MB of
#     random strings (letters, marks, spaces, digits, scripts, emoji, added tokens) writes
#     the ids tokenizers' encode() gives for the whole file as one string.
set -eu
B=${ZT_BUILDDIR:-$(pwd)}
S=${ZT_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python
# a venv without transformers, tokenizers or h5py: the last step exits 77 (its imports
# are the only ones, since an import of transformers alone costs seconds)
if [ ! -x "$PY" ]; then
    echo "SKIP: no venv with transformers, tokenizers, h5py ($PY; sh tools/make-venv.sh)"
    exit 77
fi
d=$(mktemp -d /tmp/zt_tok_hf.XXXXXX)
trap 'rm -rf "$d"' EXIT
"$PY" - "$d" "$S" <<'PY'
import glob, json, os, sys
d, src = sys.argv[1], sys.argv[2]
cases = json.load(open(f"{src}/tests/reference/tokenizers/cases.json"))
files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
text = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)[:1000000]
extra = "\n".join(cases["strings"])
plain = text[:200000] + extra.replace("<|endoftext|>", "")  # byte-level check: no literal EOT
with open(f"{d}/plain.txt", "w", encoding="utf-8", newline="") as f: f.write(plain)
with open(f"{d}/big.txt", "w", encoding="utf-8", newline="") as f: f.write(text + extra + "<|im_start|>x<|endoftext|>  ")
import random
random.seed(7)
pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 + list(" " * 30) +
        list("\t\n\r\n\n  ") + list("'''\"!?.,;:-_()[]{}<>|/\\@#$%^&*+=~`") + list("éèêëàâäôöûüçñÉÀÇßøåæœłźżşğıİ") +
        list("абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГД") + list("你好世界東京日本語한국어テスト中文字") +
        list("مرحباالعالم") + list("שלוםעולם") +
        ["\u0301", "\u0303", "\u0308", "\u030a", "\u200d", "\ufe0f", "\u00a0", "\u3000", "\u2003", "\u0085",
         "\u180e", "\u200b", "\u2028", "\u1160", "\u1100", "\u1161", "\u11a8", "½", "²", "٣", "Ⅻ", "ǅ", "ſ", "K",
         "👍", "🏽", "👨", "👩", "🇫", "🇷", "❤", "☕", "\U0001F600", "𝔘"])
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<mask>", "[w]", "café",
            "cafe\u0301", "<|im_start|>system", "世界", "'s", "'LL", "'Re"]
out = []
for _ in range(20000):
    s = "".join(random.choice(pool) for _ in range(random.randint(1, 40)))
    if random.random() < 0.3:
        k = random.randint(0, len(s))
        s = s[:k] + random.choice(specials) + s[k:]
    out.append(s)
with open(f"{d}/random.txt", "w", encoding="utf-8", newline="") as f: f.write("".join(out))
PY
mkdir "$d/byte"
"$B/zt-prep-data" --write-byte-tokenizer "$d/byte/tokenizer.json"
"$B/zt-prep-data" --val-fraction 0 -o "$d/byte.h5" "$d/plain.txt"
"$B/zt-prep-data" --tokenizer "$d/byte" --val-fraction 0 -o "$d/byte2.h5" "$d/plain.txt"
for s in gpt2 llama3 qwen2 llama2 mistral gemma; do
    for f in big random; do
        "$B/zt-prep-data" --tokenizer "$S/tests/reference/tokenizers/$s.json" --val-fraction 0 -o "$d/$s-$f.h5" "$d/$f.txt"
    done
done
"$PY" - "$d" "$S" "$PY" <<'PY'
import sys
try:
    import h5py
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
except ImportError as e:
    print(f"SKIP: no venv with transformers, tokenizers, h5py ({sys.argv[3]}: {e}; sh tools/make-venv.sh)")
    sys.exit(77)
d, src = sys.argv[1], sys.argv[2]
ok = True
def ids(p): return h5py.File(p, "r")["tokens"][:].tolist()
plain = open(f"{d}/plain.txt", encoding="utf-8", newline="").read()
tok = AutoTokenizer.from_pretrained(f"{d}/byte")
hf = tok(plain, add_special_tokens=False)["input_ids"]
for name in ("byte.h5", "byte2.h5"):
    if ids(f"{d}/{name}") != hf:
        print(f"FAIL: {name} differs from AutoTokenizer's ids"); ok = False
if hf != list(plain.encode("utf-8")):
    print("FAIL: AutoTokenizer's ids are not the UTF-8 bytes"); ok = False
if tok.decode(hf) != plain:
    print("FAIL: AutoTokenizer does not decode the byte ids back to the text"); ok = False
if tok("a<|endoftext|>b", add_special_tokens=False)["input_ids"] != [97, 256, 98] or tok.eos_token_id not in (None, 256):
    print("FAIL: <|endoftext|> is not the special token 256"); ok = False
print(f"byte-level tokenizer.json: AutoTokenizer ({type(tok).__name__}) matches, {len(hf)} ids")
for f in ("big", "random"):
    text = open(f"{d}/{f}.txt", encoding="utf-8", newline="").read()
    for s in ("gpt2", "llama3", "qwen2", "llama2", "mistral", "gemma"):
        t = Tokenizer.from_file(f"{src}/tests/reference/tokenizers/{s}.json")
        want, got = t.encode(text, add_special_tokens=False).ids, ids(f"{d}/{s}-{f}.h5")
        if want != got:
            i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            print(f"FAIL: {s} on {f}.txt: {len(got)} ids, tokenizers {len(want)}; first difference at {i}"); ok = False
        else:
            print(f"{s} on {f}.txt: {len(got)} ids over {len(text.encode())} bytes identical to tokenizers")
sys.exit(0 if ok else 1)
PY
