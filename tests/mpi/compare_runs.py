#!/usr/bin/python3
"""compare_runs.py REF RUN [RUN ...] [--loss-tol X] [--param-tol Y]

Compares training runs against a reference run (output_dir of each): the
per-step losses in metrics.jsonl (max relative difference) and the final
parameters in the newest consolidated checkpoint (relative L2 over all
tensors). Prints one line per run and exits 1 if any exceeds its tolerance."""
import glob, json, os, sys
import h5py, numpy as np

def losses(d):
    return [json.loads(l)["loss"] for l in open(os.path.join(d, "metrics.jsonl")) if '"loss"' in l]

def params(d):
    files = sorted(glob.glob(os.path.join(d, "ckpt-*.h5")))
    if not files:
        raise RuntimeError("no checkpoint in " + d)
    with h5py.File(files[-1], "r") as h:
        return {k: h["model"][k][...].astype(np.float64) for k in h["model"]}

def main(argv):
    loss_tol, param_tol, runs = 1e-5, 1e-5, []
    i = 0
    while i < len(argv):
        if argv[i] == "--loss-tol": loss_tol = float(argv[i + 1]); i += 2
        elif argv[i] == "--param-tol": param_tol = float(argv[i + 1]); i += 2
        else: runs.append(argv[i]); i += 1
    ref, runs = runs[0], runs[1:]
    lr, pr = losses(ref), params(ref)
    bad = 0
    for d in runs:
        try:
            l, p = losses(d), params(d)
        except Exception as e:
            print(f"FAIL {d}: {e}"); bad += 1; continue
        if len(l) != len(lr) or set(p) != set(pr):
            print(f"FAIL {d}: {len(l)} logged steps vs {len(lr)}, or different tensors"); bad += 1; continue
        lrel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(l, lr))
        num = np.sqrt(sum(((p[k] - pr[k]) ** 2).sum() for k in pr))
        den = np.sqrt(sum((pr[k] ** 2).sum() for k in pr))
        ok = lrel <= loss_tol and num / den <= param_tol
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(d):28s} steps {len(l)}  max loss rel {lrel:.2e} (tol {loss_tol:g})  "
              f"param rel L2 {num / den:.2e} (tol {param_tol:g})")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
