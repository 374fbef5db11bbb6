#!/usr/bin/python3
"""onebit-update-stats.py CKPT [EPS] — per tensor of a 1-bit Adam checkpoint taken after the
freeze, the update direction the optimizer applies, u = exp_avg / (sqrt(exp_avg_sq) + eps)
(exp_avg: the last exchange's result, a sign times its chunk's scale; exp_avg_sq: frozen).
Prints its RMS, its largest magnitude, the smallest sqrt(exp_avg_sq) and how many elements
the mask zeroes (exp_avg_sq == 0), for the tensors whose RMS exceeds 1: the elements Adam's
own momentum could not move so far (|m| / sqrt(v) <= ~1.2 with b1 0.9, b2 0.95 where v is
current). Needs h5py."""
import sys

import h5py
import numpy as np


def tensors(g, pre=""):
    for k in g:
        if isinstance(g[k], h5py.Dataset):
            yield pre + k
        else:
            yield from tensors(g[k], pre + k + "/")


def main(path, eps):
    f = h5py.File(path, "r")
    m, v = f["optimizer/exp_avg"], f["optimizer/exp_avg_sq"]
    total = over = 0
    for name in tensors(m):
        mm = np.asarray(m[name], dtype=np.float64).ravel()
        vv = np.asarray(v[name], dtype=np.float64).ravel()
        u = mm / (np.sqrt(vv) + eps)
        total += u.size
        over += int(np.sum(np.abs(u) > 1.2))
        rms = np.sqrt(np.mean(u * u))
        if rms > 1:
            print(f"{name:40s} {u.size:8d} elements: rms |u| {rms:9.3g}, max {np.max(np.abs(u)):9.3g}, "
                  f"min sqrt(v) {np.sqrt(vv.min()):9.3g}, masked {int(np.sum(vv == 0))}")
    print(f"{over} of {total} elements ({100 * over / total:.2f}%) have |u| > 1.2")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1e-8))
