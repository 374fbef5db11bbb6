#!/usr/bin/env python3
"""make_bnb_dir_fixtures.py — pre-quantized bitsandbytes 4-bit model directories for ztrain, as
transformers + bitsandbytes save them, and what transformers + PEFT compute with them.

For each family (llama: nf4 with double quantization; qwen3: fp4 without) it loads the
full-precision base of the QLoRA fixture, tests/reference/hf/qlora-<family> (make_qlora_fixtures.py),
with

  AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager", dtype=torch.float32,
      quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=QTYPE,
          bnb_4bit_use_double_quant=NESTED, bnb_4bit_compute_dtype=torch.float32))

and writes it with save_pretrained to tests/reference/hf/qlora-<family>-bnb/: config.json with its
quantization_config, model.safetensors holding each block linear as bitsandbytes serialises a
Params4bit (WEIGHT: packed uint8 (n/2, 1); WEIGHT.absmax; WEIGHT.nested_absmax; WEIGHT.quant_map;
WEIGHT.nested_quant_map; WEIGHT.quant_state.bitsandbytes__<qtype>: its JSON as uint8 bytes),
everything else float32. It then loads that directory again as a user would (from_pretrained
with no quantization arguments: the config's quantization_config decides), asserts that the
packed bytes and scales are the ones qlora-<family>/reference.h5 records for a quantization at
load (/quant: the same bytes either way), and writes qlora-<family>-bnb/reference.h5:

  attrs B T family quant_type double_quant versions generator
  /batch/inputs                    the family fixture's batch (qlora-<family>/reference.h5)
  /logits                          the pre-quantized base alone, float32 compute
  /adapter_logits                  the same with PEFT's adapter qlora-<family>/adapter on it
  /dequant/<weight>                bitsandbytes' dequantize_4bit of each 4-bit weight (float32)

and qlora-<family>-bnb/merged/: what a merged export of that base and adapter holds, a
full-precision transformers directory (float32, no quantization_config) whose block linears are
dequantize_4bit(W) + PEFT's get_delta_weight (scale B A), every other tensor the base's.

Needs torch, transformers, peft and bitsandbytes (0.50.2 quantizes on the CPU) in one
interpreter, e.g. ~/.cache/ztrain-venv's python with bitsandbytes on PYTHONPATH:
  pip install --no-deps --target /tmp/bnbpath bitsandbytes==0.50.2
  PYTHONPATH=/tmp/bnbpath ~/.cache/ztrain-venv/bin/python tests/reference/make_bnb_dir_fixtures.py
"""
import argparse
import json
import os
import shutil

import bitsandbytes as bnb
import bitsandbytes.functional as bnbf
import h5py
import numpy as np
import peft
import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

FORMATS = {"llama": ("nf4", True), "qwen3": ("fp4", False)}


def versions_line():
    return (f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
            f"bitsandbytes {bnb.__version__}, h5py {h5py.__version__}, numpy {np.__version__}")


def logits_of(model, idx):
    with torch.no_grad():
        return model(input_ids=idx, use_cache=False).logits.float().numpy()


def run_family(family, outdir):
    qtype, nested = FORMATS[family]
    src = os.path.join(outdir, f"qlora-{family}")
    d = os.path.join(outdir, f"qlora-{family}-bnb")
    shutil.rmtree(d, ignore_errors=True)
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qtype, bnb_4bit_use_double_quant=nested,
                            bnb_4bit_compute_dtype=torch.float32)
    m = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", dtype=torch.float32,
                                             quantization_config=qc, device_map="cpu")
    m.save_pretrained(d, safe_serialization=True)
    del m
    # the directory as a user loads it: its quantization_config decides
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", device_map="cpu")
    model.config._attn_implementation = "eager"
    model.eval()
    cfg = json.load(open(os.path.join(d, "config.json")))
    q = cfg["quantization_config"]
    assert q["quant_method"] == "bitsandbytes" and q["load_in_4bit"] and q["bnb_4bit_quant_type"] == qtype
    assert bool(q["bnb_4bit_use_double_quant"]) == nested
    four = {n: mod for n, mod in model.named_modules() if isinstance(mod, bnb.nn.Linear4bit)}
    assert len(four) == 7 * model.config.num_hidden_layers, sorted(four)
    with h5py.File(os.path.join(src, "reference.h5"), "r") as f:
        idx = torch.from_numpy(f["batch/inputs"][...].astype(np.int64))
        B, T = (int(f.attrs["B"]), int(f.attrs["T"]))
        dequant = {}
        for n, mod in sorted(four.items()):
            w = mod.weight
            qs = w.quant_state
            g = f[f"quant/{n}.weight"]
            assert np.array_equal(w.detach().reshape(-1).numpy().view(np.uint8), g["packed"][...]), n
            if nested:
                assert np.array_equal(qs.absmax.numpy().astype(np.uint8), g["absmax"][...]), n
                assert np.array_equal(qs.state2.absmax.float().numpy(), g["nested_absmax"][...]), n
                assert np.float32(qs.offset.item()) == np.float32(g["offset"][()]), n
            else:
                assert np.array_equal(qs.absmax.float().numpy(), g["absmax"][...]), n
            dequant[n + ".weight"] = bnbf.dequantize_4bit(w.data, qs).float()
    logits = logits_of(model, idx)
    pm = PeftModel.from_pretrained(model, os.path.join(src, "adapter"))
    pm.eval()
    adapter_logits = logits_of(pm, idx)
    # the merged export: bitsandbytes' dequantization plus PEFT's delta, in a float32 model
    merged = {}
    for n, mod in pm.base_model.model.named_modules():
        if isinstance(mod, peft.tuners.lora.Linear4bit):
            key = n + ".weight"
            merged[key] = dequant[key] + mod.get_delta_weight("default").float()
    assert len(merged) == len(dequant), (len(merged), len(dequant))
    full = AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for n, p in full.named_parameters():
            if n in merged:
                p.copy_(merged[n])
    full.save_pretrained(os.path.join(d, "merged"), safe_serialization=True)
    with h5py.File(os.path.join(d, "reference.h5"), "w") as f:
        f.attrs["B"] = np.int32(B)
        f.attrs["T"] = np.int32(T)
        f.attrs["family"] = family
        f.attrs["quant_type"] = qtype
        f.attrs["double_quant"] = np.int32(nested)
        f.attrs["base"] = f"tests/reference/hf/qlora-{family} saved 4-bit by transformers + bitsandbytes"
        f.attrs["adapter"] = f"tests/reference/hf/qlora-{family}/adapter"
        f.attrs["versions"] = versions_line()
        f.attrs["generator"] = "tests/reference/make_bnb_dir_fixtures.py"
        f["batch/inputs"] = idx.numpy().astype(np.int32)
        f["logits"] = logits.astype(np.float32)
        f["adapter_logits"] = adapter_logits.astype(np.float32)
        for k, v in dequant.items():
            f[f"dequant/{k}"] = v.numpy()
    print(f"  wrote {d}: {qtype}{' double quant' if nested else ''}, {len(four)} 4-bit weights, merged/, "
          f"logits |max| {np.abs(logits).max():.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default="tests/reference/hf",
                    help="directory holding qlora-<family>/; qlora-<family>-bnb/ go there")
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


if __name__ == "__main__":
    main()
