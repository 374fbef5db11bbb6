#!/usr/bin/env python3
"""rand_tokens.py PATH NEED VOCAB — a token file of uniformly random ids (seed 1337) with at
least max(NEED, 65537) tokens and vocab_size VOCAB, made only when PATH lacks them (the
benchmarks' data: tools/bench-llama.sh, tools/bench-lora.sh)."""
import os
import sys

import h5py
import numpy as np

path, need, V = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
n = max(need, 65537)
if os.path.exists(path):
    with h5py.File(path, "r") as f:
        if f["/tokens"].shape[0] >= n and int(f["/tokens"].attrs["vocab_size"]) == V:
            sys.exit(0)
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
t = np.random.default_rng(1337).integers(0, V, size=n, dtype=np.int32)
with h5py.File(path + ".tmp", "w") as f:
    d = f.create_dataset("tokens", data=t)
    d.attrs["vocab_size"] = np.int32(V)
    d.attrs["eot_token"] = np.int32(V - 1)
os.replace(path + ".tmp", path)
