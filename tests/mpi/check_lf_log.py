#!/usr/bin/python3
"""check_lf_log.py — each step of a ztrain run's metrics.jsonl against LLaMA-Factory's
trainer log of the same step (trainer_state.json's log_history, as the fixtures under
tests/reference/lf-trainer and lf-dpo keep it in expected/<run>/log.json).

  check_lf_log.py LOG.json METRICS.jsonl [--metrics TOL [--skip PREFIX[,PREFIX...]]]

Always: the loss (1e-6 relative), the learning rate (transformers' schedule, 1e-8) and the
gradient norm (3e-5: torch's fp32 clip_grad_norm_ reduction against ztrain's double sum).
--metrics TOL: also every other number LLaMA-Factory logged for the step (DPO's rewards/*,
logps/*, logits/*, sft_loss, odds_ratio_loss), each within TOL relative to max(|value|, 0.1),
rewards/* to max(|value|, 0.2) (beta times a difference of two fp32 sums of about a hundred
log-probabilities: 1e-5 of such a sum is 2e-6 of a reward at beta 0.1), logits/* to
max(|value|, 1e-3) (means of about 1e5 logits of about 0.01: relative to themselves), and the
loss within TOL as well (a function of those sums computed in another order). --skip PREFIXES:
not the metrics whose name starts with one of PREFIXES (comma-separated)."""
import json
import sys

OWN = {"step", "loss", "grad_norm", "learning_rate", "epoch"}
FLOOR = {"rewards": 0.2, "logits": 1e-3}  # each metric's error is relative to max(|value|, floor)


def main(argv):
    if len(argv) not in (2, 4, 6) or (len(argv) >= 4 and argv[2] != "--metrics") or \
            (len(argv) == 6 and argv[4] != "--skip"):
        print(__doc__)
        return 2
    tol = float(argv[3]) if len(argv) >= 4 else None
    skip = tuple(argv[5].split(",")) if len(argv) == 6 else None
    want = {h["step"]: h for h in json.load(open(argv[0]))["log"]}
    got = {}
    for line in open(argv[1]):
        r = json.loads(line)
        if "step" in r and "grad_norm" in r:
            got[r["step"]] = r
    bad, worst, where = [], 0.0, "-"
    loss_tol = 1e-6 if tol is None else tol
    for s, w in sorted(want.items()):
        g = got.get(s)
        if g is None:
            bad.append(f"step {s}: not logged")
            continue
        if abs(g["grad_norm"] - w["grad_norm"]) > 3e-5 * abs(w["grad_norm"]):
            bad.append(f"step {s}: grad_norm {g['grad_norm']!r} vs {w['grad_norm']!r}")
        if abs(g["loss"] - w["loss"]) > loss_tol * abs(w["loss"]):
            bad.append(f"step {s}: loss {g['loss']!r} vs {w['loss']!r}")
        if abs(g["lr"] - w["learning_rate"]) > 1e-8 * max(w["learning_rate"], 1e-30) + 1e-18:
            bad.append(f"step {s}: lr {g['lr']!r} vs {w['learning_rate']!r}")
        if tol is None:
            continue
        for k, v in w.items():
            if k in OWN or (skip and k.startswith(skip)):
                continue
            if k not in g:
                bad.append(f"step {s}: {k} not logged")
                continue
            e = abs(g[k] - v) / max(abs(v), FLOOR.get(k.split("/")[0], 0.1))
            if e > worst:
                worst, where = e, f"step {s} {k} {g[k]!r} vs {v!r}"
            if e > tol:
                bad.append(f"step {s}: {k} {g[k]!r} vs {v!r}")
    extra = f"; metrics' worst {worst:.2e} ({where})" if tol is not None else ""
    print(f"{len(want)} steps against LLaMA-Factory's log; {len(bad)} differ{extra}")
    for b in bad[:8]:
        print("  " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
