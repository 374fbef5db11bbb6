#!/usr/bin/env python3
"""Peer for gpu-check's GPT-2 rows: the GPT-2 of shared/bench/torch_gpt2.py (llm.c / HF layout,
tied embeddings, the same init) trained with PyTorch on one GPU, the way a PyTorch user would
make it fast: bf16 autocast, F.scaled_dot_product_attention (flash kernel on the GPU), fused
AdamW, and with --compile torch.compile. (../shared does not travel to the GPU machine, so the
peer lives here.)

Usage: torch_gpt2_gpu.py [--layers 12 --dim 768 --heads 12 --vocab 50257 --seq 1024 --batch 8
                          --steps 20 --warmup 3] [--dtype bf16|fp32] [--compile] [--device cuda|cpu]
                          [--sdpa auto|flash|efficient|math] [--peak-tflops 989] [--threads N]
Prints one line: "torch_gpt2_gpu: key value ..." with median_step_ms, tokens_per_s and mfu (the
FLOPs per token ztrain reports, 6 (12 L C^2 + V C) + 12 L C T, against --peak-tflops).
Exit status 77 (skip) when torch, or the device asked for, is missing.
On the CPU (a smoke test of the script) it also runs on old torch (1.13): attention falls back
to the explicit product, AdamW is unfused and --compile is refused."""
import argparse
import math
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"torch_gpt2_gpu: SKIP: no torch ({e})")
    sys.exit(77)

HAVE_SDPA = hasattr(F, 'scaled_dot_product_attention')


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.ln_1 = nn.LayerNorm(C); s.c_attn = nn.Linear(C, 3 * C); s.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C); s.c_fc = nn.Linear(C, 4 * C); s.mlp_proj = nn.Linear(4 * C, C); s.H = H

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v)]  # (B, H, T, hs)
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0: the explicit product of torch_gpt2.py
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.H)
            mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
            y = att.masked_fill(mask, float('-inf')).softmax(-1) @ v
        x = x + s.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate='tanh'))


class GPT(nn.Module):
    def __init__(s, V, T, L, C, H):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.h = nn.ModuleList([Block(C, H) for _ in range(L)]); s.ln_f = nn.LayerNorm(C)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.h:
            x = b(x)
        logits = s.ln_f(x) @ s.wte.weight.t()  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt.reshape(-1))


def sdpa_context(name):
    """The attention kernel to insist on; a kernel that cannot run then fails loudly."""
    import contextlib
    if name == 'auto' or not HAVE_SDPA:
        return contextlib.nullcontext()
    try:  # torch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel({'flash': SDPBackend.FLASH_ATTENTION, 'efficient': SDPBackend.EFFICIENT_ATTENTION,
                            'math': SDPBackend.MATH}[name])
    except ImportError:
        return torch.backends.cuda.sdp_kernel(enable_flash=name == 'flash', enable_mem_efficient=name == 'efficient',
                                              enable_math=name == 'math')


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    for k, v in dict(layers=12, dim=768, heads=12, vocab=50257, seq=1024, batch=8, steps=20, warmup=3,
                     threads=0).items():
        p.add_argument('--' + k, type=int, default=v)
    p.add_argument('--dtype', choices=['bf16', 'fp32'], default='bf16')
    p.add_argument('--compile', action='store_true', help='torch.compile the model (first steps compile)')
    p.add_argument('--device', default='cuda')
    p.add_argument('--sdpa', choices=['auto', 'flash', 'efficient', 'math'], default=None,
                   help='attention kernel (default: flash on cuda with bf16, else auto)')
    p.add_argument('--peak-tflops', type=float, default=989.0, help='for the MFU (H100/H200 dense bf16)')
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == 'cuda' and not torch.cuda.is_available():
        print("torch_gpt2_gpu: SKIP: no GPU (torch.cuda.is_available() is False)")
        sys.exit(77)
    if a.compile and not hasattr(torch, 'compile'):
        sys.exit(f"torch_gpt2_gpu: --compile needs torch >= 2.0 (this is {torch.__version__})")
    sdpa = a.sdpa or ('flash' if dev.type == 'cuda' and a.dtype == 'bf16' else 'auto')
    if dev.type == 'cuda':
        torch.set_float32_matmul_precision('high')  # TF32 for fp32 outside autocast: what a user would set

    torch.manual_seed(1337)
    m = GPT(a.vocab, a.seq, a.layers, a.dim, a.heads)
    for n, q in m.named_parameters():  # GPT-2 init: N(0, 0.02) matrices and embeddings, zero biases, unit norms
        if q.dim() >= 2: nn.init.normal_(q, 0.0, 0.02)
        elif 'ln' in n and n.endswith('weight'): nn.init.ones_(q)
        else: nn.init.zeros_(q)
    m = m.to(dev)
    nparam = sum(q.numel() for q in m.parameters())
    fused = dev.type == 'cuda'
    try:
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.0, fused=fused)
    except TypeError:  # torch < 2.0: no fused AdamW
        fused = False
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.0)
    step_fn = torch.compile(m) if a.compile else m
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == 'bf16')
    g = torch.Generator(device=dev).manual_seed(0) if dev.type == 'cuda' else torch.Generator().manual_seed(0)

    def sync():
        if dev.type == 'cuda':
            torch.cuda.synchronize()

    times = []
    for step in range(a.steps + a.warmup):
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g, device=dev)
        sync()
        t0 = time.perf_counter()
        with autocast, sdpa_context(sdpa):
            loss = step_fn(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    times.sort()
    med = times[len(times) // 2]
    tps = a.batch * a.seq / med
    L, C, V, T = a.layers, a.dim, a.vocab, a.seq
    flops_per_token = 6 * (12 * L * C * C + V * C) + 12 * L * C * T
    mfu = tps * flops_per_token / (a.peak_tflops * 1e12)
    name = torch.cuda.get_device_name(dev).replace(' ', '_') if dev.type == 'cuda' else 'cpu'
    mem = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == 'cuda' else 0
    print(f"torch_gpt2_gpu: torch {torch.__version__} device {name} dtype {a.dtype} compile {int(a.compile)} "
          f"sdpa {sdpa if HAVE_SDPA else 'explicit'} fused_adamw {int(fused)} params {nparam} batch {a.batch} "
          f"seq {a.seq} median_step_ms {med * 1e3:.2f} tokens_per_s {tps:.0f} mfu {mfu:.4f} "
          f"peak_mem_mib {mem:.0f} last_loss {loss.item():.4f}", flush=True)


if __name__ == '__main__':
    main()
