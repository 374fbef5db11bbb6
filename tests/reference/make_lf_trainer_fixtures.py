#!/usr/bin/env python3
"""make_lf_trainer_fixtures.py — what LLaMA-Factory 0.9.5's own trainer does with a tiny
Qwen3, for tests/mpi/lf_trainer.sh.

Writes tests/reference/lf-trainer/:
  qwen3-tiny/           a Qwen3ForCausalLM made by transformers (2 layers, hidden 32, GQA 4/2,
                        head_dim 8, tied, vocab 3520) with the fixture tokenizer
                        sft/tok/qwen (its chat tokens included);
  adapter-init/         a PEFT LoRA adapter (r 8, alpha 16, every linear) with non-zero B, the
                        adapter the LoRA run continues;
  data/                 dataset_info.json ("tiny_alpaca": alpaca, system and history mapped)
                        and its 24 records;
  lora.yaml, full.yaml  the training YAMLs, as `llamafactory-cli train` runs them from this
                        directory: warm-up 2 + cosine over 6 steps, clipping at 0.1 (active
                        every step), 2 per device x 2 accumulation, disable_shuffling, fp32;
                        the full run with weight decay 0.1;
  expected/<run>/       trainer_state.json's per-step loss, grad_norm and learning_rate
                        (log.json) and the final adapter_model.safetensors (lora) or
                        model.safetensors (full).

Run in a venv with llamafactory==0.9.5 (it brings its torch and transformers), on the CPU:
    python3 -m venv ~/.cache/lf-trainer-venv && ~/.cache/lf-trainer-venv/bin/pip install llamafactory==0.9.5
    CUDA_VISIBLE_DEVICES= ~/.cache/lf-trainer-venv/bin/python tests/reference/make_lf_trainer_fixtures.py
"""
import json
import os
import shutil
import subprocess
import sys

import llamafactory
import peft
import torch
import transformers
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "lf-trainer")
TOK = os.path.join(HERE, "sft", "tok", "qwen")

COMMON = """model_name_or_path: qwen3-tiny
trust_remote_code: true
stage: sft
do_train: true
dataset: tiny_alpaca
dataset_dir: data
template: qwen3_nothink
cutoff_len: 48
overwrite_cache: true
preprocessing_num_workers: 1
logging_steps: 1
save_steps: 1000
overwrite_output_dir: true
report_to: none
per_device_train_batch_size: 2
gradient_accumulation_steps: 2
max_steps: 6
lr_scheduler_type: cosine
warmup_steps: 2
max_grad_norm: 0.1
disable_shuffling: true
seed: 42
"""
RUNS = {
    "lora": COMMON + """finetuning_type: lora
adapter_name_or_path: adapter-init
lora_rank: 8
lora_alpha: 16
lora_target: all
learning_rate: 5.0e-3
output_dir: out/lora
""",
    "full": COMMON + """finetuning_type: full
learning_rate: 1.0e-3
weight_decay: 0.1
output_dir: out/full
""",
}


def records():
    words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
             "upsilon phi chi psi omega").split()
    out = []
    for i in range(24):
        n = 3 + (i * 7) % 11
        r = {"instruction": f"Task {i}: " + " ".join(words[(i + k) % 24] for k in range(n)),
             "input": "" if i % 3 else "with input " + words[i % 24],
             "output": " ".join(words[(i * 5 + k) % 24] for k in range(2 + (i * 3) % 9)) + "."}
        if i % 4 == 1:
            r["system"] = "Be brief."
        if i % 5 == 2:
            r["history"] = [["What came before?", "Something short."]]
        out.append(r)
    return out


def make_inputs():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "data"))
    torch.manual_seed(1234)
    tok = AutoTokenizer.from_pretrained(TOK)
    cfg = Qwen3Config(vocab_size=3520, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      tie_word_embeddings=True, rope_theta=1e6, initializer_range=0.2, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=None)
    model = Qwen3ForCausalLM(cfg).float()
    mdir = os.path.join(OUT, "qwen3-tiny")
    model.save_pretrained(mdir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, f), mdir)
    lcfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = peft.get_peft_model(model, lcfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.05)
    pm.save_pretrained(os.path.join(OUT, "adapter-init"))
    with open(os.path.join(OUT, "data", "tiny_alpaca.json"), "w") as f:
        json.dump(records(), f, indent=1, ensure_ascii=False)
    info = {"tiny_alpaca": {"file_name": "tiny_alpaca.json",
                            "columns": {"prompt": "instruction", "query": "input", "response": "output",
                                        "system": "system", "history": "history"}}}
    with open(os.path.join(OUT, "data", "dataset_info.json"), "w") as f:
        json.dump(info, f, indent=1)


def train(out, name, text):
    """writes out/NAME.yaml (TEXT) and runs llamafactory-cli train on it in out; its output
    directory (out/out/NAME), a fresh out/expected/NAME, trainer_state.json"""
    with open(os.path.join(out, name + ".yaml"), "w") as f:
        f.write(text)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", DISABLE_VERSION_CHECK="1", WANDB_DISABLED="true")
    cli = os.path.join(os.path.dirname(sys.executable), "llamafactory-cli")
    subprocess.run([cli, "train", name + ".yaml"], cwd=out, env=env, check=True)
    res = os.path.join(out, "out", name)
    exp = os.path.join(out, "expected", name)
    os.makedirs(exp)
    return res, exp, json.load(open(os.path.join(res, "trainer_state.json")))


def run(name):
    res, exp, state = train(OUT, name, RUNS[name])
    log = [{"step": h["step"], "loss": h["loss"], "grad_norm": h["grad_norm"], "learning_rate": h["learning_rate"]}
           for h in state["log_history"] if "loss" in h]
    with open(os.path.join(exp, "log.json"), "w") as f:
        json.dump({"versions": f"llamafactory {llamafactory.__version__}, transformers {transformers.__version__}, "
                               f"peft {peft.__version__}, torch {torch.__version__}", "log": log}, f, indent=1)
    weights = "adapter_model.safetensors" if name == "lora" else "model.safetensors"
    shutil.copy(os.path.join(res, weights), exp)
    print(name, json.dumps(log))


def main():
    make_inputs()
    for name in RUNS:
        run(name)
    shutil.rmtree(os.path.join(OUT, "out"))


if __name__ == "__main__":
    main()
