#!/usr/bin/env python3
"""pp-trace.py FILE [FIRST_STEP] — a pipeline's per-action timeline, summed.

Reads FILE.<rank> for every rank that a run with ZT_PP_TRACE=FILE wrote (a line per action:
step, the action as zt_action_format writes it — F3.1 is micro-batch 3's forward on stage 1,
RA3.1<0 its input received from rank 0, R the sends' completion at the step's end — the
action's start and end in seconds from the step's start, and the CPU seconds the rank's
main thread spent in it). Steps before FIRST_STEP (default 2: the first is warm-up) are
left out. Prints per rank its schedule's time a step, the time blocked in receives and in
the sends' completion (both are time the rank waits for its peer: over shared memory a
large send completes only when the receiver reaches its receive) and their share of the
schedule, the bubble; then per stage the mean time a step spends in its forwards (F) and
backwards (B), wall and CPU (the CPU figure is what the stage costs, whatever else loads
the machine), and each stage's phases against stage 0's: unequal forwards or backwards
are what GPipe pays m times over."""
import collections
import glob
import re
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: pp-trace.py FILE [FIRST_STEP]")
    base, first = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    files = sorted(glob.glob(base + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    if not files:
        sys.exit(f"pp-trace.py: no {base}.<rank> files")
    act = re.compile(r"(FR|F|B|SA|RA|SG|RG|SR|RR)(\d+)\.(\d+)")
    per_stage = {}  # (stage, kind) -> (wall, cpu) a step
    for f in files:
        rank = int(f.rsplit(".", 1)[1])
        steps, recv, send = set(), 0.0, 0.0
        sums = collections.defaultdict(lambda: [0.0, 0.0, 0])  # wall, cpu, count
        end = {}
        for line in open(f):
            step, name, t0, t1, cpu = line.split()
            step, t0, t1, cpu = int(step), float(t0), float(t1), float(cpu)
            if step < first:
                continue
            steps.add(step)
            end[step] = max(end.get(step, 0.0), t1)
            if name == "R":
                send += t1 - t0
                continue
            m = act.match(name)
            if not m:
                continue
            kind, stage = m.group(1), int(m.group(3))
            if kind in ("RA", "RG", "RR"):
                recv += t1 - t0
            elif kind in ("F", "B", "FR"):
                s = sums[(stage, kind)]
                s[0] += t1 - t0
                s[1] += cpu
                s[2] += 1
        n = len(steps)
        if n == 0:
            print(f"rank {rank}: no steps from {first} on")
            continue
        span = sum(end.values())
        print(f"rank {rank}: {n} steps, schedule {span / n:.3f} s/step, blocked in receives {recv / n:.3f} "
              f"and sends {send / n:.3f} s/step: bubble {(recv + send) / span:.3f} "
              f"(receives alone {recv / span:.3f})")
        for stage in sorted({s for s, _ in sums}):
            cells = []
            for kind in ("F", "B", "FR"):
                if (stage, kind) not in sums:
                    continue
                wall, cpu, cnt = sums[(stage, kind)]
                per_stage[(stage, kind)] = (wall / n, cpu / n)
                cells.append(f"{kind} {wall / n:.3f} s/step ({cnt // n} x {wall / cnt * 1e3:.1f} ms; "
                             f"CPU {cpu / cnt * 1e3:.1f} ms)")
            print(f"  stage {stage}: " + ", ".join(cells))
    if (0, "F") in per_stage and (0, "B") in per_stage:
        print("per stage against stage 0, wall (CPU):")
        base_f, base_b = per_stage[(0, "F")], per_stage[(0, "B")]
        for stage in sorted({s for s, _ in per_stage}):
            f_ = per_stage.get((stage, "F"), (0.0, 0.0))
            b_ = per_stage.get((stage, "B"), (0.0, 0.0))
            cols = []
            for label, x, y in (("forward", f_, base_f), ("backward", b_, base_b)):
                cols.append(f"{label} {x[0] / y[0]:.2f}x ({x[1] / y[1] if y[1] else 0.0:.2f}x)")
            both = [(f_[k] + b_[k]) / (base_f[k] + base_b[k]) if base_f[k] + base_b[k] else 0.0 for k in (0, 1)]
            print(f"  stage {stage}: " + ", ".join(cols) + f", both {both[0]:.2f}x ({both[1]:.2f}x)")


if __name__ == "__main__":
    main()
