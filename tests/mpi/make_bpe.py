#!/usr/bin/python3
"""make_bpe.py DIR TEXT — a small GPT-2-format BPE vocabulary for tests.

Writes DIR/vocab.json (the 256 byte tokens in GPT-2's byte-to-unicode alphabet,
learned merges, and <|endoftext|>) and DIR/merges.txt, learning NMERGES = 200
merges from TEXT with plain BPE over GPT-2-style words (a leading space belongs
to the word). Prints the vocabulary size."""
import json, re, sys
from collections import Counter

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return dict(zip(bs, map(chr, cs)))

def main(d, text_path, nmerges=200):
    b2u = bytes_to_unicode()
    text = open(text_path, encoding="utf-8").read()
    words = Counter(tuple(b2u[b] for b in w.encode()) for w in re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", text))
    vocab = {b2u[b]: i for i, b in enumerate(range(256))}
    merges = []
    for _ in range(nmerges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs: break
        (a, b), _ = pairs.most_common(1)[0]
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        nw = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b: out.append(a + b); i += 2
                else: out.append(w[i]); i += 1
            nw[tuple(out)] += c
        words = nw
    vocab["<|endoftext|>"] = len(vocab)
    json.dump(vocab, open(f"{d}/vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
    with open(f"{d}/merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    print(len(vocab))

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
