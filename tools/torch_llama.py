#!/usr/bin/env python3
"""torch_llama.py — the PyTorch / Hugging Face transformers peer of tools/bench-llama.sh.

Trains transformers' LlamaForCausalLM, or with --family gemma3 Gemma3ForCausalLM (tied,
--window sliding window, every 6th layer full attention) (fp32, SDPA attention, torch.optim.AdamW,
gradient clipping at 1.0 as ztrain's default optim.max_grad_norm) on consecutive
windows of the same token file ztrain reads (/tokens of an HDF5 file), or on
uniformly random tokens without --data, and prints, like ztrain's metrics:
  step N step_s S loss L            one line per step
  tokens_per_s X median_step_s S    B*T / median step time over the steps after --warmup
A step is zero_grad + forward + loss + backward + clip + optimizer step, timed
with perf_counter around all of it (no data loading inside the window beyond
slicing a preloaded tensor).
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="steady-state steps counted")
    ap.add_argument("--warmup", type=int, default=2, help="steps run first and not counted")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="", help="HDF5 token file (/tokens); random tokens without it")
    ap.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True)")
    ap.add_argument("--family", default="llama", choices=["llama", "gemma3"])
    ap.add_argument("--window", type=int, default=4096, help="gemma3: sliding_window")
    ap.add_argument("--lora", type=int, default=0,
                    help="PEFT LoRA of this rank (alpha 2r, every linear of the blocks), the base frozen")
    ap.add_argument("--hf-dir", default="",
                    help="the model's Hugging Face directory: written there (save_pretrained) when it holds no "
                         "config.json, then loaded from it, so that ztrain (model.name_or_path) starts from the same "
                         "weights")
    ap.add_argument("--qlora", default="", choices=["", "nf4", "fp4"],
                    help="with --lora and --hf-dir: the base loaded 4-bit by bitsandbytes (BitsAndBytesConfig "
                         "load_in_4bit, this quant type, double quantization, compute dtype float32), as QLoRA")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM
    import transformers

    if a.family == "gemma3":
        cfg = Gemma3TextConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.intermediate,
                               num_hidden_layers=a.layers, num_attention_heads=a.heads,
                               num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                               query_pre_attn_scalar=a.head_dim, sliding_window=a.window,
                               max_position_embeddings=a.seq, rms_norm_eps=1e-6, tie_word_embeddings=True,
                               attn_implementation="sdpa")
        model = Gemma3ForCausalLM(cfg).float().train()
    else:
        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.intermediate,
                          num_hidden_layers=a.layers, num_attention_heads=a.heads,
                          num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
                          max_position_embeddings=a.seq, rms_norm_eps=1e-6, rope_theta=10000.0,
                          tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                          attn_implementation="sdpa")
        model = LlamaForCausalLM(cfg).float().train()
    if a.hf_dir:
        import os
        if not os.path.exists(os.path.join(a.hf_dir, "config.json")):
            model.save_pretrained(a.hf_dir)
        kw = {}
        if a.qlora:
            from transformers import BitsAndBytesConfig
            kw = {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=a.qlora,
                                                            bnb_4bit_use_double_quant=True,
                                                            bnb_4bit_compute_dtype=torch.float32),
                  "device_map": "cpu"}
        cls = Gemma3ForCausalLM if a.family == "gemma3" else LlamaForCausalLM
        model = cls.from_pretrained(a.hf_dir, dtype=torch.float32, attn_implementation="sdpa", **kw).train()
        if a.qlora:
            import bitsandbytes
            print(f"bitsandbytes {bitsandbytes.__version__}: "
                  f"{sum(isinstance(m, bitsandbytes.nn.Linear4bit) for m in model.modules())} Linear4bit", flush=True)
    if a.hf_dir and a.steps + a.warmup == 0:
        return  # the directory written (or found) and loaded: nothing to time
    nparam = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} transformers {transformers.__version__} threads {torch.get_num_threads()} "
          f"attn {model.config._attn_implementation} params {nparam}", flush=True)

    B, T, total = a.batch, a.seq, a.warmup + a.steps
    if a.data:
        import h5py
        with h5py.File(a.data, "r") as f:
            need = total * B * T + 1
            tok = torch.from_numpy(f["/tokens"][:need].astype("int64"))
        if tok.numel() < need:
            sys.exit(f"torch_llama.py: {a.data} holds {tok.numel()} tokens, {need} needed")
    else:
        tok = torch.randint(0, a.vocab, (total * B * T + 1,), dtype=torch.int64)

    if a.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=a.lora, lora_alpha=2 * a.lora, lora_dropout=0.0, bias="none",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                 "up_proj", "down_proj"]))
        print(f"peft LoRA r {a.lora}: {sum(p.numel() for p in model.parameters() if p.requires_grad)} trainable",
              flush=True)
    params = [p for p in model.parameters() if p.requires_grad]
    kw = {"fused": True} if a.fused_adamw else {}
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
    times, cpus = [], []  # wall and process CPU seconds (the CPU time holds on a loaded machine)
    for step in range(total):
        chunk = tok[step * B * T: (step + 1) * B * T + 1]
        x = chunk[:-1].view(B, T)
        y = chunk[1:].view(B, T)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, a.vocab), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        times.append(dt)
        cpus.append(dc)
        print(f"step {step + 1} step_s {dt:.4f} cpu_s {dc:.4f} loss {loss.item():.4f}", flush=True)
    med = statistics.median(times[a.warmup:])
    print(f"tokens_per_s {B * T / med:.1f} median_step_s {med:.4f} median_cpu_s {statistics.median(cpus[a.warmup:]):.4f}",
          flush=True)


if __name__ == "__main__":
    main()
