#!/usr/bin/env python3
"""torch_cpu_peer.py — PyTorch peer for tools/bench-bf16.sh: GPT-2 or a Llama-style model
trained on the CPU, fp32 or under torch.autocast('cpu', dtype=torch.bfloat16).

  torch_cpu_peer.py --arch gpt2  --layers 12 --dim 768 --heads 12 --vocab 50257 --seq 64 --batch 4
  torch_cpu_peer.py --arch llama --layers 12 --dim 768 --heads 12 --kv-heads 4 --inter 2048 --vocab 32000
  add --bf16 for autocast(bfloat16), --threads N, --steps, --warmup

Same model shapes as ztrain's gpt2 (tied head, learned positions, LayerNorm, tanh GELU) and
llama (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied head, no biases); attention is
F.scaled_dot_product_attention (causal); AdamW in fp32 (autocast covers forward and the
autograd backward of autocast ops, as in a usual torch bf16 CPU recipe). Prints one line:
"... median_step_ms X tokens_per_s Y last_loss Z" (median over --steps after --warmup)."""
import argparse, math, time
import torch, torch.nn as nn, torch.nn.functional as F


class GPT2Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.ln_1 = nn.LayerNorm(C); s.c_attn = nn.Linear(C, 3 * C); s.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C); s.c_fc = nn.Linear(C, 4 * C); s.mlp_proj = nn.Linear(4 * C, C); s.H = H

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate='tanh'))


class GPT2(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.wte = nn.Embedding(a.vocab, a.dim); s.wpe = nn.Embedding(a.seq, a.dim)
        s.h = nn.ModuleList([GPT2Block(a.dim, a.heads) for _ in range(a.layers)]); s.ln_f = nn.LayerNorm(a.dim)

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.h: x = b(x)
        return s.ln_f(x) @ s.wte.weight.t()


def rope(x, cos, sin):  # HF rotate_half
    d = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., d:], x[..., :d]), -1) * sin


class LlamaBlock(nn.Module):
    def __init__(s, a):
        super().__init__()
        C, s.H, s.KV, s.D = a.dim, a.heads, a.kv_heads, a.dim // a.heads
        s.n1 = nn.RMSNorm(C, eps=1e-6); s.n2 = nn.RMSNorm(C, eps=1e-6)
        s.q = nn.Linear(C, s.H * s.D, bias=False); s.k = nn.Linear(C, s.KV * s.D, bias=False)
        s.v = nn.Linear(C, s.KV * s.D, bias=False); s.o = nn.Linear(s.H * s.D, C, bias=False)
        s.gate = nn.Linear(C, a.inter, bias=False); s.up = nn.Linear(C, a.inter, bias=False)
        s.down = nn.Linear(a.inter, C, bias=False)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        h = s.n1(x)
        q = rope(s.q(h).view(B, T, s.H, s.D).transpose(1, 2), cos, sin)
        k = rope(s.k(h).view(B, T, s.KV, s.D).transpose(1, 2), cos, sin)
        v = s.v(h).view(B, T, s.KV, s.D).transpose(1, 2)
        k = k.repeat_interleave(s.H // s.KV, 1); v = v.repeat_interleave(s.H // s.KV, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(y.transpose(1, 2).reshape(B, T, C))
        h = s.n2(x)
        return x + s.down(F.silu(s.gate(h)) * s.up(h))


class Llama(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.emb = nn.Embedding(a.vocab, a.dim)
        s.h = nn.ModuleList([LlamaBlock(a) for _ in range(a.layers)])
        s.norm = nn.RMSNorm(a.dim, eps=1e-6); s.head = nn.Linear(a.dim, a.vocab, bias=False)
        D = a.dim // a.heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.outer(torch.arange(a.seq).float(), inv)
        ang = torch.cat((ang, ang), -1)
        s.register_buffer('cos', ang.cos(), persistent=False); s.register_buffer('sin', ang.sin(), persistent=False)

    def forward(s, idx):
        x = s.emb(idx)
        T = idx.shape[1]
        for b in s.h: x = b(x, s.cos[:T], s.sin[:T])
        return s.head(s.norm(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--arch', default='gpt2', choices=['gpt2', 'llama'])
    for k, v in dict(layers=12, dim=768, heads=12, kv_heads=4, inter=2048, vocab=50257, seq=64, batch=4,
                     steps=8, threads=0, warmup=2).items():
        p.add_argument('--' + k.replace('_', '-'), dest=k, type=int, default=v)
    p.add_argument('--bf16', action='store_true', help='torch.autocast("cpu", dtype=torch.bfloat16)')
    a = p.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    m = GPT2(a) if a.arch == 'gpt2' else Llama(a)
    for n, q in m.named_parameters():
        if q.dim() >= 2: nn.init.normal_(q, 0.0, 0.02)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    times = []
    for step in range(a.steps + a.warmup):
        x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        t0 = time.perf_counter()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=a.bf16):
            logits = m(x[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup: times.append(dt)
    times.sort(); med = times[len(times) // 2]
    nparam = sum(q.numel() for q in m.parameters())
    print(f"arch {a.arch} bf16 {int(a.bf16)} params {nparam} threads {torch.get_num_threads()} "
          f"median_step_ms {med * 1e3:.1f} tokens_per_s {a.batch * a.seq / med:.1f} last_loss {loss.item():.4f}")


if __name__ == '__main__':
    main()
