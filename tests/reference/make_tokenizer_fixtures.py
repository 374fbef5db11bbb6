#!/usr/bin/env python3
"""make_tokenizer_fixtures.py [OUTDIR] — tokenizer.json fixtures for tests/unit/test_tokenizer.c.

No real model's tokenizer.json can be downloaded here, so small byte-level BPE
tokenizers are TRAINED with the `tokenizers` library itself, one per
pre-tokenizer style ztrain implements:

  gpt2    ByteLevel(use_regex=True) alone (GPT-2's regex inside ByteLevel); the
          merges are rewritten to the legacy "a b" string form;
  llama3  Split(Llama-3 regex, Isolated) + ByteLevel(use_regex=False),
          BPE ignore_merges=True (extra whole-word vocabulary entries without
          merges make ignore_merges visible in the ids), an added token "世界"
          outside the byte alphabet;
  qwen2   NFC normalizer + Split(Qwen2 regex: single \\p{N}) + ByteLevel(use_regex=False),
          merges in the ["a", "b"] list form; a non-special normalized added token
          "café" (matched after NFC) and a lstrip/rstrip special token "<mask>";

a single_word added token "[w]" and "<|im_start|>system" (longest match) in gpt2; each with added special tokens (<|endoftext|>, <|im_start|>, <|im_end|>,
<|begin_of_text|>, ...).

and two SentencePiece-style BPE tokenizers (symbols are the characters of the
text, "▁" for a space, byte_fallback to <0xXX> tokens, fuse_unk, unk "<unk>",
specials <unk> <s> </s>, the 256 byte tokens in the vocabulary as ids 3..258
but not among the added tokens, as Llama-2's file has them), trained with a
Metaspace pre-tokenizer and then rewritten to the two forms found on the hub:

  llama2   the legacy form: normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")],
           no pre-tokenizer, decoder Sequence[Replace("▁" -> " "), ByteFallback,
           Fuse, Strip(" ", 1, 0)]; "<0xF0>" is renamed "<0xf0>" so that 4-byte
           characters (emoji) take the unk path (fused), while the ByteFallback
           decoder still reads the lowercase name; a normalized non-special added
           token "<pad>" (matched in its normalized form "▁<pad>");
  mistral  the newer form: no normalizer, Metaspace(prepend_scheme "first",
           split false), the same decoder, special added tokens "[INST]" and
           "[/INST]".

and a Gemma-style one (Gemma 1/2/3 as transformers' GemmaTokenizer builds it):

  gemma    normalizer Replace(" " -> "▁"), pre_tokenizer Split(String " ",
           MergedWithPrevious) (which finds no space after the normalizer: the
           text between added tokens is one pre-token, so merges join words as
           SentencePiece's do), no prefix space, decoder Sequence[Replace("▁" ->
           " "), ByteFallback, Fuse] (no Strip), BPE byte_fallback and fuse_unk
           with unk "<unk>", specials <pad>=0 <eos>=1 <bos>=2 <unk>=3 <mask>=4, the
           256 byte tokens after them, and the hub's post_processor
           TemplateProcessing("<bos> $A"), not used by encode(add_special_tokens=
           False); trained with digits apart and "▁" runs as words of their own,
           as Gemma's vocabulary has them (single digits, "▁▁▁▁", "\\n\\n").

CJK and emoji are left out of their training text, so those characters are
not in the vocabulary (byte fallback). Variants of mistral.json (the file with
its pre_tokenizer and decoder replaced, as a "patch" in cases.json, so no
further vocabulary is committed) cover the Metaspace decoder: "metaspace"
(Metaspace in the old add_prefix_space/str_rep form: prepend always, split
true) and "metaspace_never" (prepend_scheme never, split true). Variants of
gemma.json cover the Split pre-tokenizer's behaviors, String and Regex patterns,
empty matches and invert: "gemma_next" (Split "▁" MergedWithNext), "gemma_prev"
(Split \\p{N} Isolated, then \\p{L}+ MergedWithPrevious), "gemma_contiguous"
(Split "\\n" Removed, then ▁|(?=[.,!?]) Contiguous: an empty lookahead match)
and "gemma_invert" (Split "▁" MergedWithPrevious, invert); "behavior_changes"
counts the cases whose ids change when every behavior is Isolated (0 for gemma
itself: its Split finds nothing), "invert_changes" those that change without
invert. These styles also get SP_STRINGS (gemma also GEMMA_STRINGS:
"extra_strings") and "decode_cases": id lists chosen to show byte runs, invalid
UTF-8 and the start-of-text strip. The corpus is the fortunes text of
/usr/share/games/fortunes plus the multilingual test strings below. Then
every test string is encoded with `tokenizers` (add_special_tokens=False:
ztrain writes raw ids) and the ids, the decoded text, the decoding of the first
half of the ids and of every single id (where from_utf8_lossy shows) are stored
in cases.json. The C test needs only
the committed files; rerun this script (with ~/.cache/ztrain-venv/bin/python)
only to regenerate them."""
import glob
import json
import os
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizers")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>"]

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    # accented Latin
    "Café naïve façade Ærøskøbing Ångström élève Zürich São Paulo Łódź",
    # Cyrillic
    "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
    # CJK
    "你好，世界。東京は日本の首都です。한국어 텍스트도 있습니다。",
    # Arabic and Hebrew
    "مرحبا بالعالم، كيف حالك؟ שלום עולם, מה שלומך?",
    # emoji with joiners, skin tones, flags, variation selectors
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs, 🇫🇷🇩🇪, ❤️ and ☕ time",
    # combining marks (NFC composes some for qwen2)
    "e\u0301 vs \u00e9, n\u0303 vs \u00f1, a\u030a\u0301, Z\u0335\u0321a\u0338l\u0334g\u0337o\u0336",
    "cafe\u0301 and caf\u00e9 and CAFE\u0301",
    # digit runs
    "1234567890 3.14159 1,000,000 2024-12-01 007 12345678901234567890 ٣٤٥ ½",
    # contractions in any case
    "I'm you're they've he'll she'd it's don't I'M YOU'RE THEY'VE HE'LL SHE'D IT'S DON'T We'Re tHeY'lL 'S",
    # whitespace runs and trailing spaces
    "a  b   c\t\td\n\n\ne  \n  f   ",
    "   leading spaces",
    "trailing spaces   ",
    "\r\n\r\nwindows\r\nline  \r\n",
    "\u00a0nbsp\u3000ideographic\u2003em\u2009thin x\u0085y x\u180ey \u180e!! b\u180e\u180e. \u180e    \u180e    x",
    " ",
    "\n",
    "",
    "    \n\n    ",
    # special tokens inside the text
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|> end <|endoftext|>",
    "<|begin_of_text|>Hello<|end_of_text|>",
    "almost <|im_start and <|endoftext| and |endoftext|> and <|im_end|x",
    "a <mask> b<mask>c  <mask>  d",
    "Le café est bon. cafécafé",
    "a[w]b [w] x[w] [w]c ([w]) [w]",
    "y_[w] ²[w] z [w]\u200dM é[w] e\u0301[w] ٣[w] Ⓐ[w]",
    "<|im_start|>system\nBe brief.<|im_end|><|im_start|>sys <|im_start|>system",
    # code
    "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
    "Mixed: Привет123мир, 你好abc, αβγ δεζ, ĞğİıŞş, ß ẞ ǅ",
]


SP_SPECIALS = ["<unk>", "<s>", "</s>"]
SP_BYTES = [f"<0x{b:02X}>" for b in range(256)]
SP_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
SP_VARIANTS = {
    "metaspace": {
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True, "str_rep": "\u2581"},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}},
    "metaspace_never": {
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}},
}
SP_STRINGS = [
    "<s>Hello</s> world<s> x</s>",
    "<s>[INST] What is 2+2? [/INST] 4</s><s>[INST]again[/INST]",
    "[INST]",
    " leading space",
    "  two leading spaces",
    "\u2581already \u2581meta\u2581space \u2581\u2581x \u2581",
    "\u2581",
    "a \u2581 b\u2581\u2581",
    "Hi <pad> x<pad> <pad>y",
    "<pad>",
    " <pad>",
    "<0x41> looks like a byte token; <unk> and <s > too",
    "a\U0001F600b\U0001F600\U0001F600c\u2615d\u4f60\u597de\u200d",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467 ok \U0001F600",
    "\u4f60",
    "\U0001F600",
    "\U0001F600\u2615\U0001F600x\U0001F600 \u2615",
    "\t\ttabs\n\nnewlines\r\n  ",
]

GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
GEMMA_DECODER = {"type": "Sequence", "decoders": SP_DECODER["decoders"][:3]}
# training only: words are "▁word", runs of "▁" (less one before a word), other whitespace runs, single digits
GEMMA_TRAIN_SPLIT = r"▁?[^▁\s\p{N}]+|▁+(?![^▁\s\p{N}])|▁|\s+|\p{N}"


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


GEMMA_VARIANTS = {
    "gemma_next": {"pre_tokenizer": split("\u2581", "MergedWithNext", regex=False)},
    "gemma_prev": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split(r"\p{N}", "Isolated"), split(r"\p{L}+", "MergedWithPrevious")]}},
    "gemma_contiguous": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split(r"\n", "Removed"), split(r"\u2581|(?=[.,!?])", "Contiguous")]}},
    "gemma_invert": {"pre_tokenizer": split("\u2581", "MergedWithPrevious", invert=True, regex=False)},
}
GEMMA_STRINGS = [
    "<bos>Hello<eos> <pad><mask><unk>x",
    "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n",
    "a  b   c    d     e        f",
    "x\n\n\ny\n\n\n\n  z\t\tw",
    "Numbers 1234567 and 3.14159, 2024-12-01.",
    "Wait... what?! Yes, no. Maybe.",
    "\u2581\u2581\u2581 already \u2581\u2581",
    "    def f(x):\n        return x  # four spaces\n",
]


def fortune_text():
    files = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    parts = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            parts.append(fh.read())
    return "".join(parts)


def long_text(fortunes):
    """A multi-KB text: a slice of fortunes interleaved with the test strings."""
    start = fortunes.find("\n%\n", len(fortunes) // 3) + 3
    chunk = fortunes[start:start + 6000]
    lines = chunk.split("\n")
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i % 20 == 10:
            out.append(STRINGS[(i // 20) % len(STRINGS)])
    return "\n".join(out) + "<|endoftext|>" + "   \n"


def train(corpus, style):
    tok = Tokenizer(models.BPE())
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        rx = LLAMA3_RE if style == "llama3" else QWEN2_RE
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size={"gpt2": 3000, "llama3": 4000, "qwen2": 3500}[style],
                                  min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    j = json.loads(tok.to_str())
    if style == "llama3":
        j["model"]["ignore_merges"] = True
        # whole words in the vocabulary with no merge that builds them: only
        # ignore_merges makes them one token
        b2u = {b: c for b, c in zip(range(256), bytes_to_unicode())}
        nxt = max(j["model"]["vocab"].values()) + 1
        nxt = max(nxt, max(t["id"] for t in j["added_tokens"]) + 1)
        for w in [" Привет", " французских", "你好", " quick"]:
            s = "".join(b2u[b] for b in w.encode())
            if s not in j["model"]["vocab"]:
                j["model"]["vocab"][s] = nxt
                nxt += 1
    tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    if style == "llama3":  # a token outside the byte alphabet: decoded as its own UTF-8
        tok.add_tokens([AddedToken("世界", normalized=False, special=False)])
    if style == "gpt2":
        tok.add_tokens([AddedToken("[w]", single_word=True, normalized=False, special=False)])
        # a special token that starts with another: the longest match wins
        tok.add_special_tokens([AddedToken("<|im_start|>system", special=True, normalized=False)])
    if style == "qwen2":
        tok.add_tokens([AddedToken("café", normalized=True, special=False)])
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
    j = json.loads(tok.to_str())
    if style == "gpt2":
        j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False)), j


def train_sp(corpus, style):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # mistral: trained unsplit, so some tokens span words ("▁of▁the") and split=true changes ids
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=style == "llama2")
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, special_tokens=SP_SPECIALS + SP_BYTES,
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in SP_SPECIALS]
    if style == "llama2":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        j["pre_tokenizer"] = None
        v = j["model"]["vocab"]
        v["<0xf0>"] = v.pop("<0xF0>")
    else:
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    j["decoder"] = SP_DECODER
    tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    if style == "llama2":
        tok.add_tokens([AddedToken("<pad>", normalized=True, special=False)])
    else:
        tok.add_special_tokens([AddedToken("[INST]", normalized=False, special=True),
                                AddedToken("[/INST]", normalized=False, special=True)])
    j = json.loads(tok.to_str())
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False)), j


def train_gemma(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(GEMMA_TRAIN_SPLIT), behavior="isolated", invert=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, special_tokens=GEMMA_SPECIALS + SP_BYTES,
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    # the form transformers' GemmaTokenizer (and the hub's tokenizer.json) has
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in GEMMA_SPECIALS]
    assert [a["content"] for a in j["added_tokens"]] == GEMMA_SPECIALS and j["decoder"] == GEMMA_DECODER
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False)), j


def splits_as(p, **kw):
    """A pre_tokenizer with every Split's keys set to kw."""
    if p and p["type"] == "Sequence":
        return dict(p, pretokenizers=[splits_as(q, **kw) for q in p["pretokenizers"]])
    return dict(p, **kw) if p and p["type"] == "Split" else p


def sp_decode_cases(tok, bos="<s>", eos="</s>"):
    """Id lists for the decoder: byte runs valid and not, spaces at the start, ids outside the vocabulary."""
    i = tok.token_to_id
    b = lambda x: i(f"<0x{x:02X}>") if i(f"<0x{x:02X}>") is not None else i(f"<0x{x:02x}>")
    hello = tok.encode("Hello", add_special_tokens=False).ids
    lists = [[], [i("\u2581")], [i("\u2581"), i("\u2581")], [b(0xE4), b(0xBD)], [b(0xE4), b(0xBD), b(0xA0)],
             [b(0xE4), i("a"), b(0xBD)], [b(0x20), i("a")], [b(0x20)], [b(0x20), b(0x20)], [i(bos)] + hello,
             hello + [i(eos), i("\u2581"), i("x")], [b(0xF0), b(0x9F), b(0x98), b(0x80)],
             [b(0xC3), b(0xA9), b(0xFF)], [i("<unk>")], [10 ** 6] + hello, [b(0x41), b(0x42)] + hello,
             [i("\u2581\u2581")] if i("\u2581\u2581") is not None else [i("\u2581"), b(0x20)]]
    return [{"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)} for ids in lists]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def main():
    os.makedirs(OUT, exist_ok=True)
    fortunes = fortune_text()
    corpus = [p for p in fortunes.split("\n%\n")] + STRINGS * 20
    texts = STRINGS + [long_text(fortunes)]
    cases = {"tokenizers_version": tokenizers.__version__, "strings": texts, "tokenizers": {}}
    # SentencePiece-style training text: no CJK or emoji, so those take byte fallback (or unk)
    sp_corpus = [p for p in corpus if not any(ord(ch) >= 0x2E80 for ch in p)]
    sp_files = {}
    variants = dict({k: ("mistral", v) for k, v in SP_VARIANTS.items()},
                    **{k: ("gemma", v) for k, v in GEMMA_VARIANTS.items()})
    styles = ["gpt2", "llama3", "qwen2", "llama2", "mistral"] + list(SP_VARIANTS) + ["gemma"] + list(GEMMA_VARIANTS)
    for style in styles:
        sp = style not in ("gpt2", "llama3", "qwen2")
        gemma = style.startswith("gemma")
        if style in variants:
            base, patch = variants[style]
            j = dict(sp_files[base], **patch)
            tok = Tokenizer.from_str(json.dumps(j))
            path = os.path.join(OUT, f"{base}.json")
        else:
            tok, j = train_gemma(sp_corpus) if gemma else train_sp(sp_corpus, style) if sp else train(corpus, style)
            path = os.path.join(OUT, f"{style}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, indent=1)
            tok = Tokenizer.from_file(path)
            sp_files[style] = j
        for a in j["added_tokens"]:  # the file's ids are the ones the library uses
            assert tok.token_to_id(a["content"]) == a["id"], a
        extra = SP_STRINGS + (GEMMA_STRINGS if gemma else []) if sp else []
        res = []
        for t in texts + extra:
            ids = tok.encode(t, add_special_tokens=False).ids
            half = ids[: len(ids) // 2]
            res.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                        "decoded_half": tok.decode(half, skip_special_tokens=False),
                        "decoded_each": [tok.decode([i], skip_special_tokens=False) for i in ids[:64 if not sp else 24]]})
        entry = {"file": os.path.basename(path), "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                 "cases": res}
        if sp:
            entry["extra_strings"] = extra
            entry["decode_cases"] = sp_decode_cases(tok, *(["<bos>", "<eos>"] if gemma else []))
            if style in variants:
                entry["patch"] = variants[style][1]
            # how many cases byte fallback and unk change: the test must be able to see them
            fb = tok.token_to_id("<0xE4>")
            entry["byte_fallback_ids"] = sum(fb in r["ids"] for r in res)
            entry["unk_ids"] = sum(r["ids"].count(tok.token_to_id("<unk>")) for r in res)
        if gemma:
            entry["eot"] = "<eos>"
            # how many cases the Split behaviors and invert change (the test must be able to see them)
            for key, kw in (("behavior_changes", {"behavior": "Isolated", "invert": False}),
                            ("invert_changes", {"invert": False})):
                t2 = Tokenizer.from_str(json.dumps(dict(j, pre_tokenizer=splits_as(j["pre_tokenizer"], **kw))))
                entry[key] = sum(t2.encode(t, add_special_tokens=False).ids != r["ids"]
                                 for t, r in zip(texts + extra, res))
        if style == "llama3":
            # how many cases ignore_merges changes (the test must be able to see it)
            j2 = dict(j, model=dict(j["model"], ignore_merges=False))
            t2 = Tokenizer.from_str(json.dumps(j2))
            entry["ignore_merges_changes"] = sum(t2.encode(t, add_special_tokens=False).ids != r["ids"]
                                                 for t, r in zip(texts, res))
        if style == "qwen2":
            j2 = dict(j, normalizer=None)
            t2 = Tokenizer.from_str(json.dumps(j2))
            entry["nfc_changes"] = sum(t2.encode(t, add_special_tokens=False).ids != r["ids"]
                                       for t, r in zip(texts, res))
        cases["tokenizers"][style] = entry
        print(f"{path}: {os.path.getsize(path)} bytes, vocab {entry['vocab_size']}, "
              f"{sum(len(r['ids']) for r in res)} fixture ids",
              {k: v for k, v in entry.items() if k.endswith(("changes", "_ids"))})
    path = os.path.join(OUT, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=True, separators=(",", ":"))
    print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
