#!/usr/bin/env python3
"""make_pref_lora_fixture.py — LLaMA-Factory 0.9.5's DPO step on a real model, for
tests/mpi/dpo.sh: transformers' tiny llama (tests/reference/hf/llama) with PEFT's LoRA
adapter (tests/reference/hf/lora-llama, non-zero B, so the policy differs from its
reference), run through CustomDPOTrainer.get_batch_loss_metrics itself: the policy forward,
compute_reference_log_probs with the adapters disabled (LLaMA-Factory's LoRA reference),
the loss and metrics, and the gradient of the adapters (autograd) for its norm.

The pairs are ztrain's rows of tests/mpi/hf_dir.py's token file (`tokens OUT 67 N`: token
i is (i * 2654435761 mod 2^32 >> 7) mod 67) at seq_len 8, read in order: row k is tokens
[8k, 8k + 9), its 9 tokens LLaMA-Factory's input_ids and labels (every position after the
first carries a loss, as a token file's), row 2i chosen and 2i + 1 rejected. Two steps of 2
pairs (rows 0-3, then 4-7) at learning rate 0: per step and loss (sigmoid, ipo, orpo) the
loss, the metrics and the adapters' gradient norm (clipping does not change the norm logged).
LLaMA-Factory's logits/* are means over the 9 positions' logits; ztrain runs the 8 that
predict a target, so the test leaves those two out.

Writes tests/reference/pref/llama_lora.json.
    CUDA_VISIBLE_DEVICES= ~/.cache/lf-trainer-venv/bin/python tests/reference/make_pref_lora_fixture.py
"""
import json
import os
import types

import numpy as np
import torch
from llamafactory.train.dpo.trainer import CustomDPOTrainer  # first: it imports trl as LLaMA-Factory does
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from trl.trainer import disable_dropout_in_model

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(HERE, "hf")
OUT = os.path.join(HERE, "pref", "llama_lora.json")
T, PAIRS, STEPS = 8, 2, 2


def token_rows(n_rows):
    i = np.arange(n_rows * T + 1, dtype=np.int64)
    ids = (i * 2654435761 % 4294967296 >> 7) % 67
    return [ids[k * T: k * T + T + 1] for k in range(n_rows)]


def model_with_adapter():
    base = AutoModelForCausalLM.from_pretrained(os.path.join(HF, "llama"), torch_dtype=torch.float32)
    cfg = json.load(open(os.path.join(HF, "lora-llama", "adapter_config.json")))
    # the adapter was saved by a newer PEFT: its config is rebuilt from the fields that matter
    lc = LoraConfig(r=cfg["r"], lora_alpha=cfg["lora_alpha"], lora_dropout=0.0,
                    target_modules=sorted(cfg["target_modules"]), bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, lc)
    sd = load_file(os.path.join(HF, "lora-llama", "adapter_model.safetensors"))
    res = set_peft_model_state_dict(model, sd)
    assert not [k for k in res.unexpected_keys if "lora" in k], res.unexpected_keys
    disable_dropout_in_model(model)
    return model


def trainer(loss_type, beta):
    tr = object.__new__(CustomDPOTrainer)
    use_ref = loss_type not in ("orpo", "simpo")
    tr.finetuning_args = types.SimpleNamespace(use_ref_model=use_ref)
    tr.f_divergence_type = "reverse_kl"
    tr.reference_free = False
    tr.beta, tr.loss_type, tr.ftx_gamma, tr.bco_gemma = beta, loss_type, 0.0, 0.0
    tr.label_smoothing, tr.simpo_gamma, tr.ld_alpha = 0.0, 0.5, None
    tr.ref_model = None  # LoRA: the reference is the model with its adapters disabled
    tr.accelerator = types.SimpleNamespace(device=torch.device("cpu"), unwrap_model=lambda m: m)
    return tr


def step(model, tr, rows):
    chosen, rejected = rows[0::2], rows[1::2]
    ids = torch.tensor(np.stack(chosen + rejected), dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    model.zero_grad()
    loss, metrics = tr.get_batch_loss_metrics(model, batch)
    loss.backward()
    g2 = sum(float((p.grad.double() ** 2).sum()) for n, p in model.named_parameters() if p.grad is not None)
    return {"loss": loss.item(), "metrics": metrics, "grad_norm": g2 ** 0.5}


if __name__ == "__main__":
    torch.manual_seed(0)
    rows = token_rows(2 * PAIRS * STEPS)
    out = {"seq_len": T, "pairs_per_step": PAIRS, "runs": {}}
    for loss_type, beta in (("sigmoid", 0.1), ("ipo", 0.1), ("orpo", 0.1)):
        model = model_with_adapter()
        tr = trainer(loss_type, beta)
        out["runs"][loss_type] = {"beta": beta, "steps": [
            step(model, tr, rows[s * 2 * PAIRS:(s + 1) * 2 * PAIRS]) for s in range(STEPS)]}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1)[:1500])
