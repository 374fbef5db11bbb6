#!/usr/bin/env python3
"""make_lf_dpo_fixtures.py — what LLaMA-Factory 0.9.5's own DPO trainer (stage: dpo) does with
the tiny Qwen3 of tests/reference/lf-trainer, for tests/mpi/lf_dpo.sh.

Reuses make_lf_trainer_fixtures.py's model directory (lf-trainer/qwen3-tiny), its adapter
(lf-trainer/adapter-init, r 8 with non-zero B: the policy starts away from its reference, the
base with the adapter off) and its records, which become preference pairs. Writes
tests/reference/lf-dpo/:
  data/                     dataset_info.json ("tiny_pairs": alpaca form, "ranking": true,
                            system and history mapped) and its 24 pairs;
  <run>.yaml                the YAMLs `llamafactory-cli train` runs from this directory
                            (model and adapter by relative path ../lf-trainer/...): the SFT
                            fixture's YAMLs with stage dpo, pref_beta 0.1 and pref_loss:
                            warm-up 2 + cosine over 6 steps, clipping at 0.1, 2 pairs per
                            device x 2 accumulation, disable_shuffling, fp32 on the CPU; runs lora-<loss>
                            (continuing adapter-init) and full-<loss> (the reference a frozen
                            copy of the directory), loss = sigmoid | ipo | orpo | simpo;
  expected/<run>/log.json   trainer_state.json's per-step records: loss, grad_norm,
                            learning_rate and every metric LLaMA-Factory logs (rewards/*,
                            logps/*, logits/*, orpo's sft_loss and odds_ratio_loss);
  expected/lora-<loss>/adapter_model.safetensors  the final adapter;
  expected/full-<loss>/model.safetensors          the final weights, every tensor whole
                            but the tied embedding (3520 x 32, 85% of the bytes), of which
                            the rows in log.json's "embed_rows" (the tokens of the pairs'
                            fields, the specials and every 8th row) are kept: 4 runs stay under 1 MB.

Run in a venv with llamafactory==0.9.5 (it brings its torch, transformers, peft and trl):
    CUDA_VISIBLE_DEVICES= ~/.cache/lf-trainer-venv/bin/python tests/reference/make_lf_dpo_fixtures.py
"""
import json
import os
import shutil
import sys

import llamafactory
import peft
import torch
import transformers
import trl
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_lf_trainer_fixtures as lft  # noqa: E402  (the SFT fixture's model, adapter, records, YAMLs)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "lf-dpo")
LFT = os.path.join(HERE, "lf-trainer")
LOSSES = ("sigmoid", "ipo", "orpo", "simpo")

# make_lf_trainer_fixtures.py's YAMLs with stage dpo on the pairs, the model and adapter by
# their path from this directory (warm-up 2 + cosine over 6 steps, clipping at 0.1, 2 pairs per
# device x 2 accumulation, disable_shuffling; the full run with weight decay 0.1)
COMMON = (lft.COMMON.replace("model_name_or_path: qwen3-tiny", "model_name_or_path: ../lf-trainer/qwen3-tiny")
          .replace("stage: sft", "stage: dpo").replace("dataset: tiny_alpaca", "dataset: tiny_pairs")
          + "pref_beta: 0.1\n")
KIND = {k: lft.RUNS[k][len(lft.COMMON):].replace(f"output_dir: out/{k}\n", "")
        .replace("adapter_name_or_path: adapter-init", "adapter_name_or_path: ../lf-trainer/adapter-init")
        for k in ("lora", "full")}


def run_yaml(kind, loss):
    return COMMON + KIND[kind] + f"pref_loss: {loss}\noutput_dir: out/{kind}-{loss}\n"


def pairs():
    """the SFT records as pairs: chosen, their output; rejected, another record's output (never
    equal), sometimes longer, sometimes shorter"""
    recs = lft.records()
    out = []
    for i, r in enumerate(recs):
        p = {k: v for k, v in r.items() if k != "output"}
        p["chosen"] = r["output"]
        p["rejected"] = recs[(i * 7 + 5) % len(recs)]["output"]
        if p["rejected"] == p["chosen"]:
            p["rejected"] = "No. " + p["rejected"]
        out.append(p)
    return out


def make_inputs():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "data"))
    with open(os.path.join(OUT, "data", "tiny_pairs.json"), "w") as f:
        json.dump(pairs(), f, indent=1, ensure_ascii=False)
    info = {"tiny_pairs": {"file_name": "tiny_pairs.json", "ranking": True,
                           "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                       "rejected": "rejected", "system": "system", "history": "history"}}}
    with open(os.path.join(OUT, "data", "dataset_info.json"), "w") as f:
        json.dump(info, f, indent=1)


def embed_rows():
    """the embedding rows kept: the ids of each field tokenized alone (most of the tokens the
    rendered pairs use, whose rows the input side moves too), the special tokens, and every
    8th row (moved by the tied head alone)"""
    tok = AutoTokenizer.from_pretrained(os.path.join(LFT, "qwen3-tiny"))
    ids = set(range(0, 3520, 8))
    for p in pairs():
        for v in p.values():
            for s in ([v] if isinstance(v, str) else [x for h in v for x in h]):
                ids.update(tok(s)["input_ids"])
    ids.update(tok.all_special_ids)
    return sorted(i for i in ids if i < 3520)


def run(kind, loss, rows):
    name = f"{kind}-{loss}"
    res, exp, state = lft.train(OUT, name, run_yaml(kind, loss))
    log = [{k: v for k, v in h.items() if k not in ("epoch",)} for h in state["log_history"] if "loss" in h]
    meta = {"versions": f"llamafactory {llamafactory.__version__}, transformers {transformers.__version__}, "
                        f"peft {peft.__version__}, trl {trl.__version__}, torch {torch.__version__}",
            "log": log}
    if kind == "lora":
        shutil.copy(os.path.join(res, "adapter_model.safetensors"), exp)
    else:
        t = load_file(os.path.join(res, "model.safetensors"))
        t.pop("lm_head.weight", None)  # tied: the embedding's
        t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][rows].contiguous()
        save_file(t, os.path.join(exp, "model.safetensors"))
        meta["embed_rows"] = rows
    with open(os.path.join(exp, "log.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(name, json.dumps(log[-1]))


def main():
    make_inputs()
    rows = embed_rows()
    for kind in ("lora", "full"):
        for loss in LOSSES:
            run(kind, loss, rows)
    shutil.rmtree(os.path.join(OUT, "out"))


if __name__ == "__main__":
    main()
