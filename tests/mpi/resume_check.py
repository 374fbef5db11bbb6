#!/usr/bin/python3
"""resume_check.py — checks for resumed, resharded and re-initialised runs.

compare_runs.py compares whole runs of equal length; a resumed run has two
segments in one metrics.jsonl (or only the second one, when it resumed into a
fresh output_dir), and bit-exact resume needs exact comparisons of the
optimizer state too. Subcommands (exit 1 with one line on failure):

  steps RUN FIRST LAST     the records after the last {"start":true} in
                           RUN/metrics.jsonl are exactly steps FIRST..LAST,
                           once each, in order (no sample batch repeated or
                           skipped on resume)
  exact REF RUN [--from N] losses of steps >= N (last record of each step) are
                           bitwise equal in both runs, over the same steps, and
                           the newest consolidated checkpoints hold bitwise
                           equal model and optimizer tensors and step
  close REF RUN FROM [--loss-tol X] [--param-tol Y]
                           steps FROM.. of RUN within X relative of REF's, and
                           final parameters within Y relative L2 (as
                           compare_runs.py; defaults 1e-5)
  loss RUN STEP            prints the loss logged for STEP (the last record)
  lr RUN STEP              prints the learning rate logged for STEP
  attr CKPT NAME           prints a root attribute of a consolidated checkpoint
  shape CKPT TENSOR        prints the shape of /model/TENSOR, read with h5py"""
import glob, json, os, sys

import h5py
import numpy as np


def records(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def by_step(d, key="loss"):
    # a crashed segment may have logged a step that the resumed one logs again:
    # the last record of a step is the one the finished run stands on
    return {r["step"]: r[key] for r in records(d) if "step" in r and key in r}


def newest_ckpt(d):
    if d.endswith(".h5"):
        return d
    files = sorted(glob.glob(os.path.join(d, "ckpt-*.h5")))
    if not files:
        raise SystemExit(f"FAIL: no consolidated checkpoint in {d}")
    return files[-1]


def tensors(path):
    out = {}
    with h5py.File(path, "r") as h:
        # the step and, when stored, Adam's t (a resumed optimizer must continue t)
        step = (int(h.attrs["step"]), int(h["optimizer"].attrs["step"]) if "optimizer" in h else None)
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[...]
        h.visititems(visit)
    return step, out


def cmd_steps(run, first, last):
    recs = records(run)
    starts = [i for i, r in enumerate(recs) if r.get("start")]
    if not starts:
        raise SystemExit(f"FAIL: no start record in {run}/metrics.jsonl")
    got = [r["step"] for r in recs[starts[-1]:] if "step" in r and "loss" in r]
    want = list(range(first, last + 1))
    if got != want:
        raise SystemExit(f"FAIL: {run}: steps after the last start are {got}, expected {first}..{last} once each")
    print(f"ok   {run}: steps {first}..{last} once each after resume")


def cmd_exact(ref, run, frm):
    lr, l = by_step(ref), by_step(run)
    sr = sorted(s for s in lr if s >= frm)
    s = sorted(s for s in l if s >= frm)
    if sr != s or not s:
        raise SystemExit(f"FAIL: {run}: logged steps {s} differ from {ref}'s {sr}")
    for k in s:
        if lr[k] != l[k]:
            raise SystemExit(f"FAIL: {run}: loss at step {k} is {l[k]!r}, {ref} logged {lr[k]!r}")
    pr, pp = newest_ckpt(ref), newest_ckpt(run)
    stepr, tr = tensors(pr)
    stepp, tp = tensors(pp)
    if stepr != stepp:
        raise SystemExit(f"FAIL: {pp} is at step {stepp}, {pr} at step {stepr}")
    if set(tr) != set(tp):
        raise SystemExit(f"FAIL: {pp} and {pr} hold different tensors: {sorted(set(tr) ^ set(tp))}")
    for k in sorted(tr):
        a, b = tr[k], tp[k]
        if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
            n = np.count_nonzero(a != b) if a.shape == b.shape else -1
            raise SystemExit(f"FAIL: {pp}: /{k} differs from {pr} ({n} elements)")
    print(f"ok   {run}: losses of steps {s[0]}..{s[-1]} and {len(tr)} checkpoint tensors bitwise equal to {ref}")


def cmd_close(ref, run, frm, loss_tol, param_tol):
    lr, l = by_step(ref), by_step(run)
    s = sorted(k for k in l if k >= frm)
    want = sorted(k for k in lr if k >= frm)
    if s != want or not s:
        raise SystemExit(f"FAIL: {run}: logged steps {s} differ from {ref}'s {want}")
    lrel = max(abs(l[k] - lr[k]) / max(abs(lr[k]), 1e-12) for k in s)
    with h5py.File(newest_ckpt(ref), "r") as h:
        pr = {k: h["model"][k][...].astype(np.float64) for k in h["model"]}
    with h5py.File(newest_ckpt(run), "r") as h:
        pp = {k: h["model"][k][...].astype(np.float64) for k in h["model"]}
    if set(pr) != set(pp):
        raise SystemExit(f"FAIL: {run}: different tensors than {ref}")
    num = np.sqrt(sum(((pp[k] - pr[k]) ** 2).sum() for k in pr))
    den = np.sqrt(sum((pr[k] ** 2).sum() for k in pr))
    ok = lrel <= loss_tol and num / den <= param_tol
    print(f"{'ok  ' if ok else 'FAIL'} {run:34s} steps {s[0]}..{s[-1]}  max loss rel {lrel:.2e} (tol {loss_tol:g})  "
          f"param rel L2 {num / den:.2e} (tol {param_tol:g})")
    if not ok:
        sys.exit(1)


def main(a):
    if len(a) >= 4 and a[0] == "steps":
        cmd_steps(a[1], int(a[2]), int(a[3]))
    elif len(a) >= 3 and a[0] == "exact":
        cmd_exact(a[1], a[2], int(a[4]) if len(a) >= 5 and a[3] == "--from" else 1)
    elif len(a) >= 4 and a[0] == "close":
        opts = dict(zip(a[4::2], a[5::2]))
        cmd_close(a[1], a[2], int(a[3]), float(opts.get("--loss-tol", 1e-5)), float(opts.get("--param-tol", 1e-5)))
    elif len(a) == 3 and a[0] in ("loss", "lr"):
        v = by_step(a[1], a[0]).get(int(a[2]))
        if v is None:
            raise SystemExit(f"FAIL: {a[1]}: no {a[0]} logged for step {a[2]}")
        print(repr(v))
    elif len(a) == 3 and a[0] == "attr":
        with h5py.File(a[1], "r") as h:
            v = h.attrs[a[2]]
        print(v.decode() if isinstance(v, bytes) else v)
    elif len(a) == 3 and a[0] == "shape":
        with h5py.File(a[1], "r") as h:
            x = h["model"][a[2]][...]
        if not np.all(np.isfinite(x)):
            raise SystemExit(f"FAIL: {a[1]}: /model/{a[2]} has non-finite values")
        print(" ".join(str(n) for n in x.shape))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
