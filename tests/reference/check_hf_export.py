#!/usr/bin/env python3
"""check_hf_export.py — checks that a Hugging Face model directory (e.g. one that ztrain
exported) loads in transformers and computes what a reference model computes.

  check_hf_export.py DIR REFDIR [--atol A]
      Loads DIR with AutoModelForCausalLM.from_pretrained(output_loading_info=True) and fails
      on any missing, unexpected or mismatched key. Loads REFDIR (a fixture directory,
      tests/reference/hf/<family>) the same way, runs both on the batch of
      REFDIR/reference.h5 (/batch/inputs) in float64, prints the max abs difference of the
      logits, and exits 1 when it exceeds A (default 1e-5).
  check_hf_export.py DIR REFDIR --expect-weights FILE.h5 GROUP [--atol A]
      Also compares every parameter of DIR (by its HF name) to FILE.h5:GROUP/<name>, e.g.
      REFDIR/reference.h5 /train/final after ztrain ran the fixture's 10 steps and exported;
      exits 1 on a missing name or a max abs difference above A.

Exit status: 0 ok, 1 a check failed, 2 usage or unreadable input, 77 torch/transformers/h5py
not importable (so an automake test can skip). Run with the venv of tools/make-venv.sh:
  ~/.cache/ztrain-venv/bin/python tests/reference/check_hf_export.py OUT/hf tests/reference/hf/llama
"""
import argparse
import os
import sys

try:
    import h5py
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:                      # pragma: no cover
    print(f"check_hf_export: SKIP: {e}", file=sys.stderr)
    sys.exit(77)


def load(path):
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, output_loading_info=True, attn_implementation="eager")
    except Exception as e:                    # noqa: BLE001 - any loading error is a failure
        print(f"check_hf_export: {path}: from_pretrained failed: {type(e).__name__}: {e}",
              file=sys.stderr)
        sys.exit(1)
    return model.eval(), info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="HF model directory to check")
    ap.add_argument("refdir", help="reference fixture directory (with reference.h5)")
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--expect-weights", nargs=2, metavar=("FILE.h5", "GROUP"))
    args = ap.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    ref_h5 = os.path.join(args.refdir, "reference.h5")
    if not os.path.isfile(ref_h5):
        print(f"check_hf_export: no {ref_h5}", file=sys.stderr)
        return 2

    model, info = load(args.dir)
    ok = True
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        v = info.get(k) or []
        if v:
            print(f"check_hf_export: {args.dir}: {k}: {sorted(map(str, v))}", file=sys.stderr)
            ok = False
    src_dtype = next(model.parameters()).dtype
    print(f"{args.dir}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} "
          f"parameters, loaded as {src_dtype}, no missing/unexpected keys: {ok}")
    ref, rinfo = load(args.refdir)
    if type(ref) is not type(model):
        print(f"check_hf_export: class {type(model).__name__} != reference {type(ref).__name__}",
              file=sys.stderr)
        ok = False

    with h5py.File(ref_h5, "r") as f:
        idx = torch.from_numpy(f["batch/inputs"][...].astype(np.int64))
        ref_logits_h5 = torch.from_numpy(f["logits"][...]).double()
        expect = None
        if args.expect_weights:
            fn, grp = args.expect_weights
            with h5py.File(fn, "r") as g:
                expect = {n: torch.from_numpy(g[grp][n][...]) for n in g[grp]} \
                    if grp in g else None
            if expect is None:
                print(f"check_hf_export: no group {grp} in {fn}", file=sys.stderr)
                return 2

    if expect is not None:
        names = [n for n, _ in model.named_parameters()]
        params = dict(model.named_parameters())
        worst = 0.0
        for n in names:
            if n not in expect:
                print(f"check_hf_export: {n} not in {args.expect_weights}", file=sys.stderr)
                ok = False
                continue
            e = expect[n].double()
            if tuple(e.shape) != tuple(params[n].shape):
                print(f"check_hf_export: {n}: shape {tuple(params[n].shape)} != {tuple(e.shape)}",
                      file=sys.stderr)
                ok = False
                continue
            d = (params[n].detach().double() - e).abs().max().item()
            worst = max(worst, d)
            if d > args.atol:
                print(f"check_hf_export: {n}: max abs diff {d:.3e} > {args.atol:g}",
                      file=sys.stderr)
                ok = False
        extra = sorted(set(expect) - set(names))
        if extra:
            print(f"check_hf_export: in {args.expect_weights} but not in the model: {extra}",
                  file=sys.stderr)
            ok = False
        print(f"weights vs {args.expect_weights[0]}:{args.expect_weights[1]}: "
              f"max abs diff {worst:.3e}")

    with torch.no_grad():
        lg = model.double()(input_ids=idx, use_cache=False).logits
        lr = ref.double()(input_ids=idx, use_cache=False).logits
    if lg.shape != lr.shape:
        print(f"check_hf_export: logits shape {tuple(lg.shape)} != {tuple(lr.shape)}",
              file=sys.stderr)
        return 1
    diff = (lg - lr).abs().max().item()
    print(f"logits {tuple(lg.shape)}: max abs diff vs {args.refdir}: {diff:.3e} "
          f"(atol {args.atol:g}); reference model vs reference.h5 /logits: "
          f"{(lr - ref_logits_h5).abs().max().item():.3e}")
    if diff > args.atol:
        print(f"check_hf_export: FAIL: logits differ by {diff:.3e} > {args.atol:g}",
              file=sys.stderr)
        ok = False
    print("check_hf_export: " + ("OK" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
