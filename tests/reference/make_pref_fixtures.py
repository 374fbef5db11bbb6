#!/usr/bin/env python3
"""make_pref_fixtures.py — LLaMA-Factory 0.9.5's preference losses on fixed tensors, for
tests/unit/test_pref.c.

Runs CustomDPOTrainer.get_batch_loss_metrics itself (LLaMA-Factory's concatenated_forward,
get_batch_logps, compute_preference_loss, odds_ratio_loss, simpo_loss and trl 0.24's
dpo_loss) on stand-in policy and reference models that return fixed float64 logits, so every
sum, average and metric is the library's own, in float64. The trainer object is made without
its __init__ (which wants a real model and an Accelerator); the attributes set are the ones
__init__ sets from FinetuningArguments.

Writes tests/reference/pref/losses.json: per case the configuration (pref_loss, beta, ftx,
label_smoothing, simpo_gamma), per pair the policy's and the reference's log-prob sums over
response tokens and the token counts (get_batch_logps' own outputs), per sequence the sum of
its logits and their count (the logits/* metrics are means over every (position, vocabulary)
element), and the library's mean loss, metrics and d loss / d (policy log-prob sum) of each
sequence (autograd through get_batch_logps' output).

    CUDA_VISIBLE_DEVICES= ~/.cache/lf-trainer-venv/bin/python tests/reference/make_pref_fixtures.py
"""
import json
import os
import types

import torch
import llamafactory.train.dpo.trainer as lf_dpo
from llamafactory.train.dpo.trainer import CustomDPOTrainer

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pref", "losses.json")

B, T, V = 3, 7, 5  # pairs, positions, vocabulary


class Logits:
    """concatenated_forward casts the logits to float32; this keeps them float64."""

    def __init__(self, t):
        self.t = t

    def to(self, dtype):
        return self.t


class FakeModel:
    def __init__(self, logits):
        self.logits = logits

    def __call__(self, **kw):
        return types.SimpleNamespace(logits=Logits(self.logits))


def batch_of(g):
    ids = torch.randint(0, V, (2 * B, T), generator=g)
    labels = ids.clone()
    # prompt of 1..2 tokens masked, right padding of 0..2 masked: varied lengths
    for i in range(2 * B):
        p = 1 + i % 2
        pad = i % 3
        labels[i, :p] = -100
        if pad:
            labels[i, T - pad:] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


captured = []
orig_logps = lf_dpo.get_batch_logps


def logps_hook(**kw):
    logps, length = orig_logps(**kw)
    if logps.requires_grad:
        logps.retain_grad()
    captured.append((logps, length))
    return logps, length


lf_dpo.get_batch_logps = logps_hook


def run(case, seed):
    g = torch.Generator().manual_seed(seed)
    batch = batch_of(g)
    pol = (2.0 * torch.randn(2 * B, T, V, generator=g)).requires_grad_(True)
    ref = pol.detach() + 0.3 * torch.randn(2 * B, T, V, generator=g)
    if case.get("same_ref"):
        ref = pol.detach().clone()
    loss_type = case["pref_loss"]
    use_ref = loss_type not in ("orpo", "simpo")
    tr = object.__new__(CustomDPOTrainer)
    tr.finetuning_args = types.SimpleNamespace(use_ref_model=use_ref)
    tr.f_divergence_type = "reverse_kl"
    tr.reference_free = False
    tr.beta = case["beta"]
    tr.loss_type = loss_type
    tr.ftx_gamma = case["ftx"]
    tr.bco_gemma = 0.0
    tr.label_smoothing = case["label_smoothing"]
    tr.simpo_gamma = case["simpo_gamma"]
    tr.ld_alpha = None
    tr.ref_model = FakeModel(ref) if use_ref else None
    tr.accelerator = types.SimpleNamespace(device=torch.device("cpu"))
    captured.clear()
    loss, metrics = tr.get_batch_loss_metrics(FakeModel(pol), dict(batch))
    loss.backward()
    (plogps, plen) = captured[0]
    grad = plogps.grad
    # get_batch_logps returns sums (concatenated_forward divides after it for ipo, orpo,
    # simpo), so its output's gradient is d loss / d sum whatever the loss averages
    sums, dsum = plogps.detach(), grad
    out = dict(case)
    out.update({
        "pairs": B,
        "policy_chosen": sums[:B].tolist(), "policy_rejected": sums[B:].tolist(),
        "len_chosen": plen[:B].tolist(), "len_rejected": plen[B:].tolist(),
        "logits_sum_chosen": pol.detach()[:B].sum(dim=(1, 2)).tolist(),
        "logits_sum_rejected": pol.detach()[B:].sum(dim=(1, 2)).tolist(),
        "logits_count": T * V,
        "loss": loss.item(), "metrics": metrics,
        "dloss_dchosen": dsum[:B].tolist(), "dloss_drejected": dsum[B:].tolist(),
    })
    if use_ref:
        (rlogps, rlen) = captured[1]
        rs = rlogps.detach()
        out["ref_chosen"] = rs[:B].tolist()
        out["ref_rejected"] = rs[B:].tolist()
    return out


def case(loss, beta=0.1, ftx=0.0, ls=0.0, gamma=0.5, **kw):
    return dict(pref_loss=loss, beta=beta, ftx=ftx, label_smoothing=ls, simpo_gamma=gamma, **kw)


CASES = [
    case("sigmoid"),
    case("sigmoid", beta=0.3, ls=0.2),
    case("sigmoid", beta=0.5, ftx=0.7),
    case("sigmoid", same_ref=True),
    case("ipo", beta=0.2),
    case("hinge", beta=0.4),
    case("orpo", beta=0.1),
    case("orpo", beta=0.3, ftx=0.5),
    case("simpo", beta=2.0, gamma=0.5),
    case("simpo", beta=1.5, gamma=0.8, ftx=0.4),
]

if __name__ == "__main__":
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    import llamafactory
    import trl
    res = {"llamafactory": llamafactory.__version__, "trl": trl.__version__, "torch": torch.__version__,
           "cases": [run(c, 100 + i) for i, c in enumerate(CASES)]}
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", OUT)
