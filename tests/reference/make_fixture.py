#!/usr/bin/python3
"""make_fixture.py — PyTorch reference fixture for ztrain's model and optimizer tests.

Builds a tiny GPT-2 in plain PyTorch that matches ztrain's model exactly (pre-LayerNorm
with eps 1e-5, learned positions, tanh-approximate GELU, causal attention scaled by
1/sqrt(head_dim), lm_head tied to wte, no dropout) and writes, to fixture.h5:

  attrs L, NH, C, V, maxT, B, T
  /weights/<HF name>        initial parameters, HF GPT-2 names and shapes (Conv1D (in, out))
  /batch/inputs, /targets   (B, T) int32
  /logits                   (B, T, V)
  /loss                     scalar (mean cross-entropy)
  /grads/<HF name>          d loss / d param (the tied wte gets the sum of both uses)
  /train/...                10 AdamW steps with clipping and a warmup-cosine schedule:
                            inputs, targets (S, B, T), losses, grad_norms (pre-clip), lrs (S),
                            final/<HF name> (parameters after the S steps)

The reference is computed in float64 and stored as float32: that makes it the exact
answer rather than one more fp32 rounding of it, so the C side's tolerances measure
only its own fp32 error. (It also matters for AdamW: the key part of attn.c_attn.bias
has a gradient that is exactly zero in exact arithmetic — softmax ignores a constant
added to every key — and Adam would turn fp32 noise there into full-size updates.)
Pass --dtype float32 to generate the same fixture with fp32 arithmetic.

Run:  /usr/bin/python3 tests/reference/make_fixture.py [-o tests/reference/fixture.h5]
"""
import argparse
import math

import h5py
import numpy as np
import torch

L, NH, C, V, MAXT = 2, 2, 32, 67, 16    # V deliberately odd
B, T = 2, 8
STEPS, WARMUP = 10, 3
LR, MIN_LR_RATIO = 1e-2, 0.1
BETAS, EPS, WD, MAX_NORM = (0.9, 0.95), 1e-8, 0.1, 1.0
SEED = 1234


def param_specs():
    """(HF name, shape, kind) in ztrain's table order; kind: 'w' matrix, 'b' bias, 'g'/'beta' LN."""
    s = [("transformer.wte.weight", (V, C), "w"),
         ("transformer.wpe.weight", (MAXT, C), "w"),
         ("transformer.ln_f.weight", (C,), "g"),
         ("transformer.ln_f.bias", (C,), "beta")]
    for l in range(L):
        p = f"transformer.h.{l}."
        s += [(p + "ln_1.weight", (C,), "g"), (p + "ln_1.bias", (C,), "beta"),
              (p + "attn.c_attn.weight", (C, 3 * C), "w"), (p + "attn.c_attn.bias", (3 * C,), "b"),
              (p + "attn.c_proj.weight", (C, C), "w"), (p + "attn.c_proj.bias", (C,), "b"),
              (p + "ln_2.weight", (C,), "g"), (p + "ln_2.bias", (C,), "beta"),
              (p + "mlp.c_fc.weight", (C, 4 * C), "w"), (p + "mlp.c_fc.bias", (4 * C,), "b"),
              (p + "mlp.c_proj.weight", (4 * C, C), "w"), (p + "mlp.c_proj.bias", (C,), "b")]
    return s


def init_params(gen, dtype):
    """Random, non-trivial values everywhere so every gradient path is exercised."""
    params = {}
    for name, shape, kind in param_specs():
        r = torch.randn(shape, generator=gen, dtype=torch.float64)
        if kind == "w":
            v = 0.02 * r
        elif kind == "b":
            v = 0.02 * r
        elif kind == "g":
            v = 1.0 + 0.1 * r
        else:
            v = 0.1 * r
        # Round to fp32 first so the stored fp32 weights are exactly what was used.
        params[name] = v.float().to(dtype).requires_grad_(True)
    return params


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)   # biased, as in PyTorch and llm.c
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def forward(P, idx, targets, head=None):
    """Returns logits (B,T,V) and mean cross-entropy loss; head defaults to the tied wte."""
    if head is None:
        head = P["transformer.wte.weight"]
    logits = forward_hidden(P, idx) @ head.t()                                   # (B,T,V)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return logits, loss


def make_batch(gen):
    seq = torch.randint(0, V, (B, T + 1), generator=gen)
    return seq[:, :T].contiguous(), seq[:, 1:].contiguous()


def lr_at(s):
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    floor = MIN_LR_RATIO * LR
    p = (s - WARMUP) / max(1, STEPS - WARMUP)
    return floor + (LR - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


def check_tied_grad(P, idx, targets):
    """Gradients of wte's two uses taken separately (embedding, lm_head)."""
    a = P["transformer.wte.weight"].detach().clone().requires_grad_(True)
    b = P["transformer.wte.weight"].detach().clone().requires_grad_(True)
    Q = {k: v.detach() for k, v in P.items()}
    Q["transformer.wte.weight"] = a
    _, loss = forward(Q, idx, targets, head=b)
    loss.backward()
    return a.grad + b.grad, a.grad, b.grad


def forward_hidden(P, idx):
    """Embedding, blocks and ln_f: (B,T) tokens -> (B,T,C)."""
    Bq, Tq = idx.shape
    hd = C // NH
    x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:Tq]     # (B,T,C)
    mask = torch.tril(torch.ones(Tq, Tq, dtype=torch.bool))
    for l in range(L):
        p = f"transformer.h.{l}."
        h = layernorm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"])
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]      # (B,T,3C)
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(Bq, Tq, NH, hd).transpose(1, 2)                              # (B,NH,T,hd)
        k = k.view(Bq, Tq, NH, hd).transpose(1, 2)
        v = v.view(Bq, Tq, NH, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)                          # (B,NH,T,T)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(Bq, Tq, C)                         # (B,T,C)
        x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
        h = layernorm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"])
        h = gelu_tanh(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])    # (B,T,4C)
        x = x + h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
    return layernorm(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"])


def f32(t):
    return t.detach().to(torch.float32).numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default="tests/reference/fixture.h5")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_default_dtype(dtype)

    gen = torch.Generator().manual_seed(SEED)
    P = init_params(gen, dtype)
    names = [n for n, _, _ in param_specs()]
    init = {n: P[n].detach().clone() for n in names}

    # ---- single forward/backward ----
    idx, tgt = make_batch(gen)
    logits, loss = forward(P, idx, tgt)
    loss.backward()
    grads = {n: P[n].grad.detach().clone() for n in names}

    # Cross-checks: the hand-written layers against torch.nn.functional, and the tied sum.
    F = torch.nn.functional
    xs = torch.linspace(-4, 4, 101)
    assert torch.allclose(F.gelu(xs, approximate="tanh"), gelu_tanh(xs), atol=1e-6)
    g2 = torch.Generator().manual_seed(0)     # not `gen`: keep the fixture's stream unchanged
    xs, ws, bs = (torch.randn(5, C, generator=g2), torch.randn(C, generator=g2),
                  torch.randn(C, generator=g2))
    assert torch.allclose(F.layer_norm(xs, (C,), ws, bs, 1e-5), layernorm(xs, ws, bs), atol=1e-5)
    tied, g_emb, g_head = check_tied_grad(P, idx, tgt)
    assert torch.allclose(tied, grads["transformer.wte.weight"], rtol=1e-5, atol=1e-9), "tied grad"
    assert g_emb.abs().sum() > 0 and g_head.abs().sum() > 0

    # ---- 10 AdamW steps ----
    for n in names:
        P[n].grad = None
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    tr_in, tr_tg, losses, norms, lrs = [], [], [], [], []
    for s in range(STEPS):
        bi, bt = make_batch(gen)
        tr_in.append(bi)
        tr_tg.append(bt)
        opt.zero_grad(set_to_none=True)
        _, l_s = forward(P, bi, bt)
        l_s.backward()
        norm = torch.nn.utils.clip_grad_norm_([P[n] for n in names], max_norm=MAX_NORM)
        lr = lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(l_s.item())
        norms.append(norm.item())
        lrs.append(lr)
        print(f"step {s}: loss {l_s.item():.6f} grad_norm {norm.item():.6f} lr {lr:.6e}")

    with h5py.File(args.output, "w") as f:
        for k, v in dict(L=L, NH=NH, C=C, V=V, maxT=MAXT, B=B, T=T).items():
            f.attrs[k] = np.int32(v)
        f.attrs["generator"] = "tests/reference/make_fixture.py"
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["compute_dtype"] = args.dtype
        for n in names:
            f[f"weights/{n}"] = f32(init[n])
            f[f"grads/{n}"] = f32(grads[n])
            f[f"train/final/{n}"] = f32(P[n])
        f["batch/inputs"] = idx.numpy().astype(np.int32)
        f["batch/targets"] = tgt.numpy().astype(np.int32)
        f["logits"] = f32(logits)
        f["loss"] = np.float32(loss.item())
        f["train/inputs"] = torch.stack(tr_in).numpy().astype(np.int32)
        f["train/targets"] = torch.stack(tr_tg).numpy().astype(np.int32)
        f["train/losses"] = np.array(losses, dtype=np.float32)
        f["train/grad_norms"] = np.array(norms, dtype=np.float32)
        f["train/lrs"] = np.array(lrs, dtype=np.float32)
        t = f["train"]
        for k, v in dict(steps=STEPS, warmup=WARMUP, lr=LR, min_lr_ratio=MIN_LR_RATIO,
                         beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=WD,
                         max_grad_norm=MAX_NORM).items():
            t.attrs[k] = v
        t.attrs["schedule"] = "cosine"
    print(f"wrote {args.output}: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
