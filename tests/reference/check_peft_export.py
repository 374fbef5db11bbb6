#!/usr/bin/env python3
"""check_peft_export.py — checks that a PEFT LoRA adapter directory (e.g. one that ztrain
exported) loads in peft and computes what a reference adapter computes.

  check_peft_export.py ADAPTER_DIR BASE_DIR REF_ADAPTER_DIR [--atol A]
      Loads PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE_DIR),
      ADAPTER_DIR), and REF_ADAPTER_DIR (a fixture, tests/reference/hf/lora-<family>) on a
      fresh copy of the same base, runs both on the batch of REF_ADAPTER_DIR/reference.h5
      (/batch/inputs) in float64 (plain .double()), prints the max abs difference of the
      logits and exits 1 when it exceeds A (default 1e-5). It also fails when the two
      adapter_model.safetensors files hold different tensor names or shapes, or when the
      adapter_config.json values that change the computation (r, lora_alpha, use_rslora,
      use_dora, target_modules, fan_in_fan_out, bias) differ.
  check_peft_export.py ADAPTER_DIR BASE_DIR REF_ADAPTER_DIR --expect-weights FILE.h5 GROUP
      Also compares every tensor of ADAPTER_DIR/adapter_model.safetensors (by its key) to
      FILE.h5:GROUP/<key>, e.g. REF_ADAPTER_DIR/reference.h5 /train/final after ztrain ran the
      fixture's 10 LoRA steps and exported; exits 1 on a missing key or a max abs difference
      above A.

Exit status: 0 ok, 1 a check failed, 2 usage or unreadable input, 77 torch/transformers/peft/
h5py/safetensors not importable (so an automake test can skip). Run with the venv of
tools/make-venv.sh:
  ~/.cache/ztrain-venv/bin/python tests/reference/check_peft_export.py OUT/lora \\
      tests/reference/hf/llama tests/reference/hf/lora-llama
"""
import argparse
import json
import os
import sys

try:
    import h5py
    import numpy as np
    import torch
    import transformers
    import peft
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
except ImportError as e:                      # pragma: no cover
    print(f"check_peft_export: SKIP: {e}", file=sys.stderr)
    sys.exit(77)

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
SEMANTIC = ("r", "lora_alpha", "use_rslora", "use_dora", "target_modules", "fan_in_fan_out",
            "bias")


def fail(msg):
    print(f"check_peft_export: {msg}", file=sys.stderr)


def load(adapter_dir, base_dir):
    try:
        base = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager")
        model = PeftModel.from_pretrained(base, adapter_dir)
    except Exception as e:                    # noqa: BLE001 - any loading error is a failure
        fail(f"{adapter_dir} on {base_dir}: loading failed: {type(e).__name__}: {e}")
        sys.exit(1)
    return model.eval()


def read_adapter(d):
    """{key: tensor} of d/adapter_model.safetensors and d/adapter_config.json, or exit 2."""
    fn, cn = os.path.join(d, ADAPTER_FILE), os.path.join(d, CONFIG_FILE)
    for p in (fn, cn):
        if not os.path.isfile(p):
            fail(f"no {p}")
            sys.exit(2)
    try:
        with safe_open(fn, "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        with open(cn) as f:
            cfg = json.load(f)
    except Exception as e:                    # noqa: BLE001
        fail(f"{d}: unreadable: {type(e).__name__}: {e}")
        sys.exit(2)
    return tensors, cfg


def semantic(cfg):
    out = {k: cfg.get(k) for k in SEMANTIC}
    tm = out["target_modules"]
    if isinstance(tm, list):
        out["target_modules"] = sorted(tm)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("adapter_dir", help="PEFT adapter directory to check")
    ap.add_argument("base_dir", help="HF base model directory (e.g. tests/reference/hf/llama)")
    ap.add_argument("ref_adapter_dir", help="reference adapter fixture (with reference.h5)")
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--expect-weights", nargs=2, metavar=("FILE.h5", "GROUP"))
    args = ap.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    ref_h5 = os.path.join(args.ref_adapter_dir, "reference.h5")
    if not os.path.isfile(ref_h5):
        fail(f"no {ref_h5}")
        return 2
    ok = True

    # ---- files: same tensor names and shapes, same LoRA hyperparameters ----
    got_t, got_cfg = read_adapter(args.adapter_dir)
    ref_t, ref_cfg = read_adapter(args.ref_adapter_dir)
    missing, extra = sorted(set(ref_t) - set(got_t)), sorted(set(got_t) - set(ref_t))
    if missing:
        fail(f"{args.adapter_dir}: missing tensors: {missing}")
        ok = False
    if extra:
        fail(f"{args.adapter_dir}: unexpected tensors: {extra}")
        ok = False
    for k in sorted(set(got_t) & set(ref_t)):
        if tuple(got_t[k].shape) != tuple(ref_t[k].shape):
            fail(f"{k}: shape {tuple(got_t[k].shape)} != reference {tuple(ref_t[k].shape)}")
            ok = False
    sg, sr = semantic(got_cfg), semantic(ref_cfg)
    for k in SEMANTIC:
        if sg[k] != sr[k]:
            fail(f"{CONFIG_FILE}: {k} = {sg[k]!r}, reference {sr[k]!r}")
            ok = False
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in got_t.values()})
    print(f"{args.adapter_dir}: {len(got_t)} tensors ({', '.join(dtypes)}), "
          f"{sum(t.numel() for t in got_t.values())} numbers; names, shapes and "
          f"{'/'.join(SEMANTIC)} as the reference: {ok}")

    with h5py.File(ref_h5, "r") as f:
        idx = torch.from_numpy(f["batch/inputs"][...].astype(np.int64))
        ref_logits_h5 = torch.from_numpy(f["logits"][...]).double()
    if args.expect_weights:
        fn, grp = args.expect_weights
        try:
            with h5py.File(fn, "r") as g:
                expect = {n: torch.from_numpy(g[grp][n][...]) for n in g[grp]} \
                    if grp in g else None
        except OSError as e:
            fail(f"{fn}: {e}")
            return 2
        if expect is None:
            fail(f"no group {grp} in {fn}")
            return 2
        worst = 0.0
        for k in sorted(got_t):
            if k not in expect:
                fail(f"{k} not in {fn}:{grp}")
                ok = False
                continue
            e = expect[k].double()
            if tuple(e.shape) != tuple(got_t[k].shape):
                fail(f"{k}: shape {tuple(got_t[k].shape)} != {tuple(e.shape)} in {fn}:{grp}")
                ok = False
                continue
            d = (got_t[k].double() - e).abs().max().item()
            worst = max(worst, d)
            if d > args.atol:
                fail(f"{k}: max abs diff {d:.3e} > {args.atol:g}")
                ok = False
        left = sorted(set(expect) - set(got_t))
        if left:
            fail(f"in {fn}:{grp} but not in the adapter: {left}")
            ok = False
        print(f"adapter weights vs {fn}:{grp}: max abs diff {worst:.3e}")

    # ---- logits, both adapters on the same base, float64 ----
    model = load(args.adapter_dir, args.base_dir)
    ref = load(args.ref_adapter_dir, args.base_dir)
    with torch.no_grad():
        lg = model.double()(input_ids=idx, use_cache=False).logits
        lr = ref.double()(input_ids=idx, use_cache=False).logits
    if lg.shape != lr.shape:
        fail(f"logits shape {tuple(lg.shape)} != {tuple(lr.shape)}")
        return 1
    diff = (lg - lr).abs().max().item()
    print(f"logits {tuple(lg.shape)}: max abs diff vs {args.ref_adapter_dir}: {diff:.3e} "
          f"(atol {args.atol:g}); reference adapter vs reference.h5 /logits: "
          f"{(lr - ref_logits_h5).abs().max().item():.3e}")
    if diff > args.atol:
        fail(f"FAIL: logits differ by {diff:.3e} > {args.atol:g}")
        ok = False
    print("check_peft_export: " + ("OK" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
