#!/usr/bin/python3
"""check_accounting.py RUN_DIR STRATEGY WORLD ACCUM [SHARD_GROUP]

Checks a run's metrics.jsonl against the ZeRO memory formulas and the
collective volumes theory predicts, computed here independently from the model
shape (flat layout, fp32):
  P_u = unit u's parameter count padded to a multiple of the shard group size n,
  S_u = P_u / n (what one rank owns).
  ddp            all-reduce 4*Psi per step
  zero1          reduce-scatter 4*sum(P) + all-gather 4*sum(P)
  zero2          reduce-scatter A*4*sum(P) + all-gather 4*sum(P)
  shard_grad_op  all-gather A*4*sum(P), reduce-scatter A*4*sum(P)
  zero3          all-gather A*4*(P_root + 2*sum(P_blocks)), reduce-scatter A*4*sum(P)
  hybrid_shard   as zero3 inside the shard group, plus all-reduce 4*sum(S) across replicas
Memory (bytes per rank): ddp 4/4/8 x Psi; zero1 params 4*sum(P), grads 4*sum(P)+4*sum(S),
optimizer 8*sum(S); zero2 params 4*sum(P), grads 4*sum(S); zero3 and hybrid 4/4/8 x sum(S),
i.e. 16*Psi/n plus padding."""
import json, sys

def main(d, strategy, world, A, group=None):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    start = next(r for r in recs if r.get("start"))
    summary = next(r for r in recs if r.get("summary"))
    steps = [r for r in recs if "loss" in r and "comm" in r]
    # model shape from the tiny config: read back the parameter count and recompute units
    L, C, V, T = 2, 32, 257, 32
    root = V * C + T * C + 2 * C
    block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C)
    units = [root] + [block] * L
    psi = sum(units)
    assert start["parameters"] == psi, (start["parameters"], psi)
    n = {"ddp": 1, "hybrid_shard": group, "hybrid_shard_zero2": group}.get(strategy, world)
    P = [-(-u // n) * n for u in units]
    S = [p // n for p in P]
    F = 4
    exp = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    if strategy == "ddp":
        exp["all_reduce"] = F * psi if world > 1 else 0
        mem = (F * psi, F * psi, 2 * F * psi)
    elif strategy == "zero1":
        exp["reduce_scatter"] = exp["all_gather"] = F * sum(P)
        mem = (F * sum(P), F * sum(P) + F * sum(S), 2 * F * sum(S))
    elif strategy == "zero2":
        exp["reduce_scatter"] = A * F * sum(P); exp["all_gather"] = F * sum(P)
        mem = (F * sum(P), F * sum(S), 2 * F * sum(S))
    elif strategy == "shard_grad_op":
        exp["all_gather"] = exp["reduce_scatter"] = A * F * sum(P)
        mem = (F * sum(S), F * sum(S), 2 * F * sum(S))
    else:  # zero3, hybrid_shard
        exp["all_gather"] = A * F * (P[0] + 2 * sum(P[1:]))
        exp["reduce_scatter"] = A * F * sum(P)
        if strategy.startswith("hybrid"):
            exp["all_reduce"] = F * sum(S)
        mem = (F * sum(S), F * sum(S), 2 * F * sum(S))
    bad = []
    for r in steps:
        for k, v in exp.items():
            got = r["comm"][k]["bytes"]
            if got != v:
                bad.append(f"step {r['step']}: {k} moved {got:.0f} bytes, theory says {v}")
    est, meas = start["memory_estimate"], summary["memory_measured"]
    for name, want in zip(("params", "grads", "optimizer"), mem):
        if est[name] != want: bad.append(f"estimate {name} {est[name]} != formula {want}")
        if meas[name] != want: bad.append(f"measured {name} {meas[name]} != formula {want}")
    if strategy in ("zero3", "hybrid_shard") and n > 1:
        total = sum(mem)
        if abs(total - 16 * psi / n) > 16 * len(units) * n:
            bad.append(f"zero3 model state {total} is not 16*Psi/n = {16 * psi / n:.0f} up to padding")
    busbw_ok = all(r["comm"][k]["busbw_GBps"] >= 0 for r in steps for k in exp)
    if not busbw_ok: bad.append("negative busbw")
    print(f"{strategy:14s} world {world} A {A}: {len(steps)} steps checked, traffic {exp}, memory {mem}: "
          + ("ok" if not bad else "FAIL"))
    for b in bad[:10]: print("   ", b)
    return 1 if bad else 0

if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]) if len(a) > 4 else None))
