#!/usr/bin/env python3
"""make_bnb_tp_fixtures.py — a QLoRA base whose block linears tensor parallelism can split at
4-bit block boundaries, full precision and as transformers + bitsandbytes save it 4-bit.

The QLoRA fixtures (make_qlora_fixtures.py) have hidden_size 64: a row-parallel o_proj (64, 64)
at tensor_parallel_size 2 keeps 32 input columns of each row, half a block of 64, which ztrain
refuses. This base is the llama family fixture's config (tests/reference/hf/llama) with
hidden_size 128, intermediate_size 256 and head_dim 32 (4 heads, 2 KV heads, 2 layers), so that
at tp 2 every split keeps whole blocks: a column split rows of 128 or 256 values, a row split 64
or 128 input columns of each row (and the nested scales' blocks of 256 blocks are cut: q_proj's
256 blocks are one of them, gate_proj's 512 two).

It writes, with make_hf_fixtures.py's init_params and make_lora_fixtures.py's adapter settings:
  tests/reference/hf/qlora-llama-tp/            config.json, model.safetensors (float32)
  tests/reference/hf/qlora-llama-tp/adapter/    PEFT's adapter (r 4, alpha 8, every linear,
                                                lora_A ~ N(0, 0.3), lora_B ~ N(0, 0.05))
  tests/reference/hf/qlora-llama-tp-bnb/        the base loaded with
      BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                         bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
      and written by save_pretrained (bitsandbytes' Params4bit serialisation)

Needs torch, transformers, peft and bitsandbytes (0.50.2 quantizes on the CPU), e.g.
  ~/.cache/bnb-venv/bin/python tests/reference/make_bnb_tp_fixtures.py
"""
import argparse
import os
import shutil
import sys

import bitsandbytes as bnb
import peft
import torch
import transformers
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixtures import init_params  # noqa: E402
from make_lora_fixtures import lora_config, fix_adapter_dir, A_STD, B_STD  # noqa: E402

SEED = 4011
WIDER = {"hidden_size": 128, "intermediate_size": 256, "head_dim": 32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default="tests/reference/hf", help="holds llama/; the two directories go there")
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
          f"bitsandbytes {bnb.__version__}")
    base = os.path.join(args.output, "qlora-llama-tp")
    four = os.path.join(args.output, "qlora-llama-tp-bnb")
    adapter = os.path.join(base, "adapter")
    for d in (base, four):
        shutil.rmtree(d, ignore_errors=True)
    gen = torch.Generator().manual_seed(SEED)
    config = transformers.AutoConfig.from_pretrained(os.path.join(args.output, "llama"))
    for k, v in WIDER.items():
        setattr(config, k, v)
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    init_params(m, gen)
    m.save_pretrained(base, safe_serialization=True)
    pm = peft.get_peft_model(m, lora_config("llama"))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad:
                std = A_STD if ".lora_A." in n else B_STD
                p.copy_((std * torch.randn(tuple(p.shape), generator=gen, dtype=torch.float64)).float())
    pm.peft_config["default"].base_model_name_or_path = "tests/reference/hf/qlora-llama-tp"
    pm.save_pretrained(adapter, safe_serialization=True)
    fix_adapter_dir(adapter, "llama")
    del pm, m
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=torch.float32)
    q = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32,
                                             quantization_config=qc, device_map="cpu")
    n4 = sum(isinstance(mod, bnb.nn.Linear4bit) for mod in q.modules())
    assert n4 == 7 * config.num_hidden_layers, n4
    q.save_pretrained(four, safe_serialization=True)
    print(f"  wrote {base} (+ adapter) and {four}: {n4} 4-bit linears")


if __name__ == "__main__":
    main()
