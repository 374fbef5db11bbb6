#!/usr/bin/env python3
"""make_qlora_fixtures.py — QLoRA reference fixtures for ztrain: PEFT on a bitsandbytes 4-bit
base, on the CPU, as transformers + PEFT + bitsandbytes train it.

For each family (llama, qwen3) it writes a base of its own, tests/reference/hf/qlora-<family>/
(config.json and model.safetensors: the family fixture's config, tests/reference/hf/<family>,
with hidden_size 64, intermediate_size 128, head_dim 16, random weights as
make_hf_fixtures.py's init_params). Every linear's in_features is then a multiple of the block
size 64, as in every real model: bitsandbytes 0.50.2's CPU dequantize_4bit of a 2-D weight
indexes absmax per row with floor(in_features / blocksize) blocks a row, which is its own
quantize_4bit's (flat) block only when the block size divides in_features (the family
fixtures' 32 and 48 do not: there every value would take the first block's scale).
It then writes PEFT's adapter for it, qlora-<family>/adapter/ (r 4, alpha 8, every linear,
lora_A ~ N(0, 0.3), lora_B ~ N(0, 0.05) as make_lora_fixtures.py), loads the base with

  AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32,
      quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QTYPE,
          bnb_4bit_use_double_quant=NESTED, bnb_4bit_compute_dtype=torch.float32))

(QTYPE, NESTED per family: llama nf4 with double quantization, qwen3 fp4 without), asserts
that exactly the blocks' nn.Linear modules became Linear4bit (embeddings, norms and lm_head
stay float32), puts the adapter on it with PeftModel.from_pretrained(is_trainable=True) in
train mode, and writes qlora-<family>/reference.h5:

  attrs B T steps quant_type double_quant blocksize compute_dtype versions generator ...
  /quant/<weight>/packed, /absmax (float32, or the uint8 codes when nested),
      /nested_absmax, /offset   bitsandbytes' own quantization of each base weight
  /batch/inputs, /batch/targets, /logits, /loss     the family fixture's batch, base + adapter
  /grads/<adapter key>                              d loss / d adapter (base frozen)
  /train/inputs, /train/targets, /train/losses, /train/grad_norms, /train/lrs
  /train/final/<adapter key>                        after 10 AdamW steps of the adapters

in float32, bitsandbytes' compute dtype (its Linear4bit dequantizes to float32 and runs
float32 GEMMs; unlike make_lora_fixtures.py there is no float64 run: the 4-bit path is
float32 by construction). The schedule, the loss and the optimizer settings are
make_hf_fixtures.py's (lr_at, forward_loss and the constants), as make_lora_fixtures.py.

Needs torch, transformers, peft and bitsandbytes (0.50.2 quantizes and runs Linear4bit on the
CPU) in one interpreter, e.g. ~/.cache/ztrain-venv's python with bitsandbytes on PYTHONPATH:
  mkdir -p /tmp/bnbpath && ln -s ~/.cache/bnb-venv/lib/python3.11/site-packages/bitsandbytes /tmp/bnbpath/
  PYTHONPATH=/tmp/bnbpath ~/.cache/ztrain-venv/bin/python tests/reference/make_qlora_fixtures.py
"""
import argparse
import os
import shutil
import sys

import bitsandbytes as bnb
import h5py
import numpy as np
import peft
import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import (B, T, STEPS, WARMUP, LR, MIN_LR_RATIO, BETAS, EPS, WD,  # noqa: E402
                              MAX_NORM, forward_loss, f32, init_params)
from make_lora_fixtures import lora_config, fix_adapter_dir, adapter_steps, A_STD, B_STD  # noqa: E402

FORMATS = {"llama": ("nf4", True), "qwen3": ("fp4", False)}
SEEDS = {"llama": 4001, "qwen3": 4003}
WIDER = {"hidden_size": 64, "intermediate_size": 128, "head_dim": 16}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def run_family(family, outdir):
    qtype, nested = FORMATS[family]
    d = os.path.join(outdir, f"qlora-{family}")
    base_dir, adapter_dir = d, os.path.join(d, "adapter")
    shutil.rmtree(d, ignore_errors=True)
    gen = torch.Generator().manual_seed(SEEDS[family])
    config = transformers.AutoConfig.from_pretrained(os.path.join(outdir, family))
    for k, v in WIDER.items():
        setattr(config, k, v)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    init_params(m, gen)
    m.save_pretrained(base_dir, safe_serialization=True)
    pm = peft.get_peft_model(m, lora_config(family))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad:
                std = A_STD if ".lora_A." in n else B_STD
                p.copy_((std * torch.randn(tuple(p.shape), generator=gen, dtype=torch.float64)).float())
    pm.peft_config["default"].base_model_name_or_path = f"tests/reference/hf/qlora-{family}"
    pm.save_pretrained(adapter_dir, safe_serialization=True)
    fix_adapter_dir(adapter_dir, family)
    del pm, m
    with h5py.File(os.path.join(outdir, family, "reference.h5"), "r") as f:
        idx = torch.from_numpy(f["batch/inputs"][...].astype(np.int64))
        tgt = torch.from_numpy(f["batch/targets"][...].astype(np.int64))
        tr_in = torch.from_numpy(f["train/inputs"][...].astype(np.int64))
        tr_tg = torch.from_numpy(f["train/targets"][...].astype(np.int64))
    assert tuple(idx.shape) == (B, T) and tuple(tr_in.shape) == (STEPS, B, T), "base fixture"

    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qtype, bnb_4bit_use_double_quant=nested,
                            bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager", dtype=torch.float32,
                                                 quantization_config=qc, device_map="cpu")
    model.config._attn_implementation = "eager"
    L = model.config.num_hidden_layers
    four = {n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    want = {f"model.layers.{l}.{'self_attn' if p in LINEARS[:4] else 'mlp'}.{p}" for l in range(L) for p in LINEARS}
    assert four == want, sorted(four ^ want)
    for n, p in model.named_parameters():
        if not any(n.startswith(w + ".") for w in want):
            assert p.dtype == torch.float32, (n, p.dtype)

    # bitsandbytes' own quantization of each base weight, for ztrain's load to match bit for bit
    quant = {}
    for n in sorted(want):
        w = model.get_submodule(n).weight
        qs = w.quant_state
        assert qs.blocksize == 64 and qs.quant_type == qtype and bool(qs.nested) == nested
        qd = {"packed": w.detach().reshape(-1).numpy().astype(np.uint8)}
        if nested:
            qd["absmax"] = qs.absmax.numpy().astype(np.uint8)
            qd["nested_absmax"] = qs.state2.absmax.float().numpy()
            qd["offset"] = np.float32(qs.offset.item())
            assert qs.state2.blocksize == 256
        else:
            qd["absmax"] = qs.absmax.float().numpy()
        quant[n + ".weight"] = qd

    pm = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    names = {n: n.replace(".default", "") for n, p in pm.named_parameters() if p.requires_grad}
    assert len(names) == 2 * len(LINEARS) * L, len(names)
    assert all("lora_A" in n or "lora_B" in n for n in names)
    params = dict(pm.named_parameters())
    order = list(names)
    pm.train()

    logits, loss = forward_loss(pm, idx, tgt)
    loss.backward()
    grads = {n: params[n].grad.detach().clone() for n in order}

    losses, norms, lrs = adapter_steps(pm, params, order, tr_in, tr_tg)
    assert min(norms) > MAX_NORM, f"clipping inactive: {norms}"

    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
                f"bitsandbytes {bnb.__version__}, h5py {h5py.__version__}, numpy {np.__version__}")
    with h5py.File(os.path.join(d, "reference.h5"), "w") as f:
        f.attrs["B"] = np.int32(B)
        f.attrs["T"] = np.int32(T)
        f.attrs["steps"] = np.int32(STEPS)
        f.attrs["warmup"] = np.int32(WARMUP)
        for k, v in dict(lr=LR, min_lr_ratio=MIN_LR_RATIO, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                         weight_decay=WD, max_grad_norm=MAX_NORM).items():
            f.attrs[k] = np.float64(v)
        f.attrs["schedule"] = "cosine"
        f.attrs["quant_type"] = qtype
        f.attrs["double_quant"] = np.int32(nested)
        f.attrs["blocksize"] = np.int32(64)
        f.attrs["compute_dtype"] = "float32"
        f.attrs["family"] = family
        f.attrs["base"] = f"tests/reference/hf/qlora-{family} (config of tests/reference/hf/{family}, {WIDER})"
        f.attrs["adapter"] = f"tests/reference/hf/qlora-{family}/adapter"
        f.attrs["seed"] = np.int32(SEEDS[family])
        f.attrs["versions"] = versions
        f.attrs["generator"] = "tests/reference/make_qlora_fixtures.py"
        for n, q in quant.items():
            for k, v in q.items():
                f[f"quant/{n}/{k}"] = v
        f["batch/inputs"] = idx.numpy().astype(np.int32)
        f["batch/targets"] = tgt.numpy().astype(np.int32)
        f["logits"] = f32(logits)
        f["loss"] = np.float32(loss.item())
        for n in order:
            f[f"grads/{names[n]}"] = f32(grads[n])
        f["train/inputs"] = tr_in.numpy().astype(np.int32)
        f["train/targets"] = tr_tg.numpy().astype(np.int32)
        f["train/losses"] = np.array(losses, dtype=np.float32)
        f["train/grad_norms"] = np.array(norms, dtype=np.float32)
        f["train/lrs"] = np.array(lrs, dtype=np.float32)
        for n in order:
            f[f"train/final/{names[n]}"] = f32(params[n])
    print(f"  wrote {d}: {qtype}{' double quant' if nested else ''}, {len(quant)} 4-bit weights, "
          f"loss {loss.item():.6f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default="tests/reference/hf",
                    help="directory holding the family fixtures; qlora-<family>/ go there")
    ap.add_argument("families", nargs="*", default=list(FORMATS))
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(versions_line())
    for fam in args.families:
        print(fam)
        run_family(fam, args.output)


def versions_line():
    return (f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
            f"bitsandbytes {bnb.__version__}")


if __name__ == "__main__":
    main()
