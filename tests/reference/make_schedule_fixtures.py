#!/usr/bin/env python3
"""make_schedule_fixtures.py — the learning rates of transformers' own schedulers, for
tests/unit/test_optim.c and tests/mpi/schedules.sh.

Every case is get_scheduler(type, optimizer, num_warmup_steps=W, num_training_steps=S,
scheduler_specific_kwargs=kwargs) on a one-parameter torch AdamW at learning rate LR, as the
Trainer builds it (create_scheduler); W comes from TrainingArguments.get_warmup_steps(S)
where the case gives a warm-up ratio. "lrs" holds param_groups[0]["lr"] before each of
S + 2 optimizer steps: the learning rate optimizer step k runs at (k = 0 first), two steps
past the end included. JSON floats are Python's repr, so they read back exactly.

    ~/.cache/ztrain-venv/bin/python tests/reference/make_schedule_fixtures.py tests/reference/schedules.json
"""
import json
import sys

import torch
import transformers
from transformers import TrainingArguments
from transformers.optimization import get_scheduler

LR, S = 3e-3, 12

# (type, warmup steps or None, warmup ratio or None, lr_scheduler_kwargs)
CASES = [
    ("linear", 0, None, {}),
    ("linear", 3, None, {}),
    ("linear", None, 0.21, {}),
    ("cosine", 0, None, {}),
    ("cosine", 3, None, {}),
    ("cosine", 2, None, {"num_cycles": 1.5}),
    ("cosine_with_restarts", 3, None, {}),
    ("cosine_with_restarts", 2, None, {"num_cycles": 3}),
    ("polynomial", 0, None, {}),
    ("polynomial", 3, None, {"power": 2.0, "lr_end": 1e-4}),
    ("constant", 0, None, {}),
    ("constant_with_warmup", 0, None, {}),
    ("constant_with_warmup", 4, None, {}),
    ("inverse_sqrt", 0, None, {}),
    ("inverse_sqrt", 3, None, {}),
    ("inverse_sqrt", 2, None, {"timescale": 5}),
    ("cosine_with_min_lr", 3, None, {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", 0, None, {"min_lr": 1e-4}),
    ("cosine_with_min_lr", 2, None, {"min_lr_rate": 0.05, "num_cycles": 1.0}),
    ("cosine_warmup_with_min_lr", 3, None, {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", 4, None, {"min_lr": 2e-4, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", 3, None, {"num_decay_steps": 4}),
    ("warmup_stable_decay", 2, None, {"num_decay_steps": 5, "num_stable_steps": 3, "warmup_type": "cosine",
                                      "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),
    ("warmup_stable_decay", 4, None, {"num_decay_steps": 6, "warmup_type": "1-sqrt", "decay_type": "linear",
                                      "min_lr_ratio": 0.2, "num_cycles": 0.5}),
    ("warmup_stable_decay", None, 0.21, {"num_decay_steps": 4, "decay_type": "cosine", "num_cycles": 1.0}),
]


def warmup_of(steps, ratio):
    if ratio is None:
        return steps
    # transformers 5 reads a warmup_steps below 1 as the ratio (get_warmup_steps)
    return TrainingArguments(output_dir="/tmp/unused", warmup_steps=ratio).get_warmup_steps(S)


def main(out):
    cases = []
    for kind, steps, ratio, kwargs in CASES:
        W = warmup_of(steps, ratio)
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=LR)
        sched = get_scheduler(kind, opt, num_warmup_steps=W, num_training_steps=S,
                              scheduler_specific_kwargs=dict(kwargs))
        lrs = []
        for _ in range(S + 2):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        cases.append({"type": kind, "warmup_steps": steps if ratio is None else 0,
                      "warmup_ratio": ratio or 0.0, "W": W, "S": S, "lr": LR, "kwargs": kwargs, "lrs": lrs})
    doc = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "cases": cases}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{out}: {len(cases)} cases, transformers {transformers.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "schedules.json")
