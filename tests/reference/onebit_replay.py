#!/usr/bin/python3
"""onebit_replay.py DIR WORLD STEPS FREEZE_STEP — DeepSpeed's 1-bit Adam in float64, on the
gradients tests/mpi/onebit_test.c feeds ztrain's shard engine, compared with its result.

Written from deepspeed/runtime/fp16/onebit/adam.py (OnebitAdam.step) and
deepspeed/runtime/comm/nccl.py (NcclBackend.compressed_allreduce); only numpy:

  warm-up (step <= freeze_step): the engine all-reduces (averages) the gradients;
      exp_avg = b1 exp_avg + (1-b1) g ; exp_avg_sq = b2 exp_avg_sq + (1-b2) g g
  after:  each rank: exp_avg = b1 exp_avg + (1-b1) g_rank (backward all-reduce off);
      exp_avg = compressed_allreduce(exp_avg) when world > 1; exp_avg *= exp_avg_mask
  update = exp_avg / (sqrt(exp_avg_sq) + eps) ; update += wd p ; p += -lr update
  (no bias correction in either stage).
Gradient clipping to MAX_NORM as DeepSpeed's fp32 engine does it (clip_fp32_gradients before
step()): the averaged gradient's norm in the warm-up, each rank's own gradient's norm after
the freeze (the backward all-reduce is off), scale min(1, max / (norm + 1e-6)).

Two choices, the same in ztrain: exp_avg_mask is (exp_avg_sq != 0) (DeepSpeed takes it from
the user); DeepSpeed's very first step() call only allocates its buffers and updates
nothing, which ztrain does not copy: its step 1 is an Adam step. Both compress from training
step freeze_step + 1, so ztrain (and this replay) take freeze_step warm-up updates where
DeepSpeed takes freeze_step - 1.

The replay knows no strategy: onebit_test under zero1 and zero2 (sharded m and v, the exchange
as a compressed reduce-scatter and all-gather) must give the same parameters as under ddp.

DIR holds params.txt (name numel decay), init.bin and final.bin (float32, tensors in that
order). Exit 1 when any parameter differs from the replay by more than float rounding."""
import os
import sys

import numpy as np

M64 = (1 << 64) - 1
LR, B1, B2, EPS, WD, MAX_NORM = 1e-3, 0.9, 0.95, 1e-8, 0.1, 0.5


def grad_of(param, n, rank, step):
    """onebit_test.c's grad_of for elements 0 .. n-1, exactly (integers over 65536)."""
    out = np.empty(n)
    x = (step * 0x9E3779B1 + rank * 0x85EBCA77 + param * 0xC2B2AE3D) & M64
    for j in range(n):
        h = ((j + 1) * 2654435761) & M64
        h ^= x
        h = ((h ^ (h >> 15)) * 0x2C1B3C6D) & M64
        h ^= h >> 12
        out[j] = ((h % 2001) - 1000) / 65536.0
    return out


def f32(x):
    """the float32 values ztrain's engine holds (its scales and arguments are float32)"""
    return np.float32(x).astype(np.float64)


def padded(numel, size):
    divider = size * 8 // np.gcd(size, 8)
    q = size * divider
    return numel + (q - numel % q) % q


def compressed_allreduce(bufs, worker_error, server_error, size):
    """nccl.py's compressed_allreduce run by every rank: bufs[r] is rank r's exp_avg; returns
    the common result. worker_error[r] (padded size) and server_error[r] (chunk) update."""
    numel = bufs[0].size
    npad = worker_error[0].size
    chunk = npad // size
    signs, scales = [], []
    for r in range(size):
        b = np.concatenate([bufs[r], np.zeros(npad - numel)]) + worker_error[r]
        scale = np.linalg.norm(b) / np.sqrt(b.size)
        sign = (np.sign(b) + 1).astype(bool).astype(np.float64) * 2.0 - 1.0  # sign(0) -> +1
        worker_error[r] = b - scale * sign
        signs.append(sign)
        scales.append(scale)
    server_signs, server_scales = [], []
    for r in range(size):  # rank r is the server of chunk r
        comp = sum(signs[s][r * chunk:(r + 1) * chunk] * (scales[s] / size) for s in range(size))
        comp = comp + server_error[r]
        sscale = np.linalg.norm(comp) / np.sqrt(comp.size)
        ssign = (np.sign(comp) + 1).astype(bool).astype(np.float64) * 2.0 - 1.0
        server_error[r] = comp - sscale * ssign
        server_signs.append(ssign)
        server_scales.append(sscale)
    full = np.concatenate([server_signs[r] * server_scales[r] for r in range(size)])
    return full[:numel]


def main(d, world, steps, freeze):
    params = [l.split() for l in open(os.path.join(d, "params.txt"))]
    sizes = [int(p[1]) for p in params]
    init = np.fromfile(os.path.join(d, "init.bin"), dtype="<f4").astype(np.float64)
    final = np.fromfile(os.path.join(d, "final.bin"), dtype="<f4").astype(np.float64)
    assert init.size == sum(sizes) == final.size, (init.size, sum(sizes), final.size)
    lr, b1, b2, eps, wd = f32(LR), f32(B1), f32(B2), f32(EPS), f32(WD)
    off = np.cumsum([0] + sizes)
    grads = {(i, r, k): grad_of(i, sizes[i], r, k) for i in range(len(sizes)) for r in range(world)
             for k in range(1, steps + 1)}
    clip = {}   # (rank, step) -> the factor the rank's gradient is scaled by
    for k in range(1, steps + 1):
        for r in range(world):
            if k <= freeze:
                sq = sum(np.sum((sum(grads[(i, q, k)] for q in range(world)) / world) ** 2) for i in range(len(sizes)))
            else:
                sq = sum(np.sum(grads[(i, r, k)] ** 2) for i in range(len(sizes)))
            clip[(r, k)] = min(1.0, MAX_NORM / (np.sqrt(sq) + 1e-6))
    worst, worst_name = 0.0, ""
    for i, (name, numel, decay) in enumerate(params):
        n = int(numel)
        w = wd if int(decay) else 0.0
        p = init[off[i]:off[i + 1]].copy()
        m = [np.zeros(n) for _ in range(world)]
        v = np.zeros(n)
        we = [np.zeros(padded(n, world)) for _ in range(world)]
        se = [np.zeros(padded(n, world) // world) for _ in range(world)]
        for k in range(1, steps + 1):
            g = [grads[(i, r, k)] * clip[(r, k)] for r in range(world)]
            if k <= freeze:
                gm = sum(g) / world
                m = [b1 * m[0] + (1 - b1) * gm] * world
                v = b2 * v + (1 - b2) * gm * gm
            else:
                m = [b1 * m[r] + (1 - b1) * g[r] for r in range(world)]
                if world > 1:
                    m = [compressed_allreduce(m, we, se, world)] * world
                m = [m[0] * (v != 0)] * world
            update = m[0] / (np.sqrt(v) + eps) + w * p
            p = p + -lr * update
        got = final[off[i]:off[i + 1]]
        err = np.max(np.abs(got - p) / (np.abs(p) + 1e-3))
        if err > worst:
            worst, worst_name = err, name
    print(f"onebit_replay: world {world}, {steps} steps, freeze_step {freeze}: {len(params)} tensors, "
          f"largest difference {worst:.3g} (relative, floor 1e-3) at {worst_name}")
    return 0 if worst < 2e-5 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
