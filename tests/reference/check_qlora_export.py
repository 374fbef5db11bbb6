#!/usr/bin/env python3
"""check_qlora_export.py — checks a QLoRA run's exports with the libraries themselves: PEFT loads
ztrain's adapter on the bitsandbytes 4-bit base, and transformers loads ztrain's merged model.

  check_qlora_export.py ADAPTER_DIR BNB_DIR [--reference] [--merged HF_DIR] [--atol A]

Loads BNB_DIR (a pre-quantized directory, tests/reference/hf/qlora-<family>-bnb) with
AutoModelForCausalLM.from_pretrained (its quantization_config makes the block linears
bitsandbytes' Linear4bit, compute dtype float32), puts ADAPTER_DIR on it with
PeftModel.from_pretrained, and runs the batch of BNB_DIR/reference.h5 (/batch/inputs) in
float32. Then:
  --reference       compares those logits with BNB_DIR/reference.h5 /adapter_logits (PEFT with the
                    fixture's adapter, which ztrain's own logits equal in test_families): for an
                    adapter ztrain wrote at learning rate 0;
  --merged HF_DIR   loads HF_DIR (ztrain's <output_dir>/hf of the same run) with from_pretrained,
                    requires a full-precision model (no quantization_config, no Linear4bit), and
                    compares its logits with PEFT's: the adapter ztrain trained, on bitsandbytes'
                    base, against ztrain's dequantized base with those adapters merged.
Prints the max abs difference of each and exits 1 when one exceeds A (default 1e-5).

Exit status: 0 ok, 1 a check failed, 2 usage or unreadable input, 77 torch, transformers, peft,
bitsandbytes or h5py not importable (so an automake test can skip). Run with a python that has
all of them, e.g. ~/.cache/ztrain-venv's with bitsandbytes on PYTHONPATH
(tests/reference/make_bnb_dir_fixtures.py says how).
"""
import argparse
import json
import os
import sys

try:
    import bitsandbytes as bnb
    import h5py
    import numpy as np
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
except ImportError as e:                      # pragma: no cover
    print(f"check_qlora_export: SKIP: {e}", file=sys.stderr)
    sys.exit(77)


def logits_of(model, idx):
    with torch.no_grad():
        return model(input_ids=idx, use_cache=False).logits.float().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("adapter_dir")
    ap.add_argument("bnb_dir")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--merged")
    ap.add_argument("--atol", type=float, default=1e-5)
    args = ap.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    ref_path = os.path.join(args.bnb_dir, "reference.h5")
    try:
        with h5py.File(ref_path, "r") as f:
            idx = torch.from_numpy(f["batch/inputs"][...].astype(np.int64))
            want = f["adapter_logits"][...]
    except (OSError, KeyError) as e:
        print(f"check_qlora_export: {ref_path}: {e}", file=sys.stderr)
        return 2
    base = AutoModelForCausalLM.from_pretrained(args.bnb_dir, attn_implementation="eager", device_map="cpu")
    four = sum(isinstance(m, bnb.nn.Linear4bit) for m in base.modules())
    if not four:
        print(f"check_qlora_export: {args.bnb_dir} loads without a 4-bit linear", file=sys.stderr)
        return 2
    pm = PeftModel.from_pretrained(base, args.adapter_dir).eval()
    got = logits_of(pm, idx)
    bad = 0
    print(f"{args.adapter_dir} on {args.bnb_dir} ({four} Linear4bit, bitsandbytes {bnb.__version__})")
    if args.reference:
        d = float(np.abs(got - want).max())
        print(f"  PEFT logits vs the fixture's (PEFT with the reference adapter): max abs difference {d:.3e}")
        bad |= not d <= args.atol
    if args.merged:
        cfg = json.load(open(os.path.join(args.merged, "config.json")))
        if "quantization_config" in cfg:
            print(f"  {args.merged}/config.json has a quantization_config", file=sys.stderr)
            return 1
        m = AutoModelForCausalLM.from_pretrained(args.merged, attn_implementation="eager").float().eval()
        if any(isinstance(x, bnb.nn.Linear4bit) for x in m.modules()):
            print(f"  {args.merged} loads with 4-bit linears", file=sys.stderr)
            return 1
        d = float(np.abs(logits_of(m, idx) - got).max())
        print(f"  transformers on the merged export vs PEFT on the 4-bit base: max abs difference {d:.3e}")
        bad |= not d <= args.atol
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
