#!/usr/bin/env python3
"""check_pairs.py FILE.h5 CASES.json DATASET TEMPLATE CUTOFF_LEN — a pairs file (zt_data_write_pairs_h5)
holds LLaMA-Factory's pairwise samples of that case of tests/reference/sft/pairwise/cases.json: the
attribute pairs = 1, sample 2i = chosen i and 2i + 1 = rejected i (input_ids and labels). Exit 1 if not."""
import json
import sys

import h5py

path, cases, dataset, template, cutoff = sys.argv[1:6]
f = h5py.File(path, "r")
c = next(c for c in json.load(open(cases))["cases"]
         if c["dataset"] == dataset and c["template"] == template and c["cutoff_len"] == int(cutoff))
off, ids, labels = f["sample_offsets"][:], f["input_ids"][:], f["labels"][:]
got = [(ids[a:b].tolist(), labels[a:b].tolist()) for a, b in zip(off[:-1], off[1:])]
want = []
for i in range(len(c["chosen_input_ids"])):
    want += [(c["chosen_input_ids"][i], c["chosen_labels"][i]), (c["rejected_input_ids"][i], c["rejected_labels"][i])]
ok = f.attrs.get("pairs") == 1 and got == want
print(f"{path}: {len(got) // 2} pairs,", "equal to LLaMA-Factory's" if ok else "DIFFERENT from LLaMA-Factory's")
sys.exit(not ok)
