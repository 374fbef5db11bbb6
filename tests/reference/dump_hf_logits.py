#!/usr/bin/env python3
"""dump_hf_logits.py — prints what a Hugging Face model directory computes for a token list.

  dump_hf_logits.py DIR TOKEN... [--dtype float64|float32|bfloat16] [--full]

Loads DIR with AutoModelForCausalLM.from_pretrained (eager attention), runs one sequence
(batch 1) and prints, per position: the token, argmax, max, mean, std and logsumexp of the
logits; then the whole tensor's stats and, with two or more tokens, ztrain's loss convention:
mean cross-entropy of logits[:-1] against tokens[1:]. --full prints every logit.
Exit 77 when torch/transformers are not importable.
"""
import argparse
import sys

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
except ImportError as e:                      # pragma: no cover
    print(f"dump_hf_logits: SKIP: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("tokens", nargs="+", type=int)
    ap.add_argument("--dtype", choices=["float64", "float32", "bfloat16"], default="float64")
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(args.dir, attn_implementation="eager").eval()
    model = model.to(getattr(torch, args.dtype))
    V = model.config.vocab_size
    bad = [t for t in args.tokens if not 0 <= t < V]
    if bad:
        print(f"dump_hf_logits: tokens out of [0, {V}): {bad}", file=sys.stderr)
        return 2
    idx = torch.tensor([args.tokens], dtype=torch.long)
    with torch.no_grad():
        lg = model(input_ids=idx, use_cache=False).logits[0].double()     # (T, V)
    print(f"{args.dir}: {type(model).__name__} V={V} T={len(args.tokens)} dtype={args.dtype}")
    print(f"{'pos':>3} {'token':>5} {'argmax':>6} {'max':>12} {'mean':>12} {'std':>12} {'lse':>12}")
    for t in range(lg.shape[0]):
        r = lg[t]
        print(f"{t:3d} {args.tokens[t]:5d} {int(r.argmax()):6d} {r.max().item():12.6e} "
              f"{r.mean().item():12.6e} {r.std(unbiased=False).item():12.6e} "
              f"{torch.logsumexp(r, 0).item():12.6e}")
    print(f"all: min {lg.min().item():.6e} max {lg.max().item():.6e} mean {lg.mean().item():.6e} "
          f"std {lg.std(unbiased=False).item():.6e} sum {lg.sum().item():.9e}")
    if len(args.tokens) > 1:
        loss = torch.nn.functional.cross_entropy(lg[:-1], idx[0, 1:])
        print(f"loss (logits[:-1] vs tokens[1:]): {loss.item():.9f}")
    if args.full:
        torch.set_printoptions(precision=8, linewidth=120, threshold=10**9)
        print(lg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
