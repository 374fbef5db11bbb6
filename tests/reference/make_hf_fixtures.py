#!/usr/bin/env python3
"""make_hf_fixtures.py — Hugging Face transformers reference fixtures for ztrain's
llama, qwen2, qwen3, mistral, gemma3 and gpt2 families.

For each family it builds a tiny random model with transformers' own class
(LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, GPT2LMHeadModel;
attn_implementation="eager"),
saves it as a real HF model directory, and runs it in float64 (model.double()) to write

  tests/reference/hf/<family>/{config.json,generation_config.json,model.safetensors}
      the fp32 initial weights, by model.save_pretrained(dir, safe_serialization=True)
  tests/reference/hf/<family>/reference.h5
      attrs B T steps warmup lr min_lr_ratio beta1 beta2 eps weight_decay max_grad_norm
            schedule torch_version transformers_version family seed compute_dtype
      /batch/inputs, /batch/targets (B,T) int32   inputs = tokens[:, :T], targets = tokens[:, 1:T+1]
      /logits (B,T,V), /loss                       loss = mean cross-entropy over all B*T positions,
                                                   from the logits (not HF's label shift)
      /grads/<HF name>                             d loss / d param, every trainable parameter
                                                   (named_parameters: a tied embedding appears once,
                                                   as model.embed_tokens.weight, and its gradient is
                                                   the sum of both uses)
      /train/inputs, /train/targets (S,B,T) int32  a different batch per step
      /train/losses, /train/grad_norms (pre-clip), /train/lrs (S)
      /train/final/<HF name>                       parameters after the S AdamW steps
  tests/reference/hf/llama-sharded/   the llama model saved with a tiny max_shard_size
  tests/reference/hf/qwen3-bf16/      the qwen3 model saved in bfloat16

Conventions follow make_fixture.py (the GPT-2 fixture): random non-trivial weights rounded to
fp32 before use (so the stored weights are exactly the ones used), float64 arithmetic stored as
float32, AdamW with two parameter groups (weight decay on dim >= 2 only), clip_grad_norm_, and
the warmup-cosine schedule of include/zt_optim.h. Every number comes from transformers itself.

Run:  ~/.cache/ztrain-venv/bin/python tests/reference/make_hf_fixtures.py [-o tests/reference/hf] [FAMILY...]
      (tools/make-venv.sh makes the venv; FAMILY... limits it to those, e.g. gpt2)
"""
import argparse
import contextlib
import copy
import importlib
import math
import os
import shutil

import h5py
import numpy as np
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)
from transformers.models.gemma3 import modeling_gemma3

V = 67                      # deliberately odd
B, T = 2, 8
STEPS, WARMUP = 10, 3
LR, MIN_LR_RATIO = 1e-2, 0.1
BETAS, EPS, WD, MAX_NORM = (0.9, 0.95), 1e-8, 0.1, 1.0
SHARD_SIZE = "20KB"         # llama-sharded: several shards of a ~80 KB model

# std of the random init: matrices (incl. embeddings) N(0, W_STD), biases N(0, B_STD),
# RMSNorm weights 1 + N(0, 0.1) (Gemma's (1 + w) norms: w = N(0, 0.1))
W_STD, B_STD, G_STD = 0.05, 0.05, 0.1

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

TV_MAJOR = int(transformers.__version__.split(".")[0])

# transformers' modeling code upcasts to float32 in three places, whatever the model's dtype:
# RMSNorm (hidden_states.to(torch.float32)), the eager softmax (dtype=torch.float32) and RoPE
# (inv_freq and cos/sin computed with torch.float). Under model.double() those steps would
# round to fp32. hf_float64() rebinds the name `torch` in these modules to a view of torch whose
# float32/float are float64, so the very same transformers code runs in float64 throughout.
F64_MODULES = ["transformers.models.llama.modeling_llama",
               "transformers.models.qwen2.modeling_qwen2",
               "transformers.models.qwen3.modeling_qwen3",
               "transformers.models.mistral.modeling_mistral",
               "transformers.models.gemma3.modeling_gemma3",
               "transformers.modeling_rope_utils"]


def _gemma3_rmsnorm_f64(self, x):
    # Gemma3RMSNorm.forward with its x.float() / weight.float() (tensor methods, which no
    # module-level rebinding reaches) as float64: the same (1 + weight) arithmetic
    output = self._norm(x.to(torch.float64))
    output = output * (1.0 + self.weight.to(torch.float64))
    return output.type_as(x)


class _TorchF64:
    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def hf_float64(enabled=True):
    mods = [importlib.import_module(m) for m in F64_MODULES] if enabled else []
    saved = [m.torch for m in mods]
    norm_fwd = modeling_gemma3.Gemma3RMSNorm.forward
    try:
        for m in mods:
            m.torch = _TorchF64()
        if enabled:
            modeling_gemma3.Gemma3RMSNorm.forward = _gemma3_rmsnorm_f64
        yield
    finally:
        for m, t in zip(mods, saved):
            m.torch = t
        modeling_gemma3.Gemma3RMSNorm.forward = norm_fwd


class _NoLowPrecision(TorchDispatchMode):
    """Records every op (forward and backward) whose result is a float tensor narrower than
    float64, except int -> float conversions (position ids: exact)."""

    def __init__(self):
        super().__init__()
        self.bad = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        from_int = ins and all(not t.is_floating_point() for t in ins)
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                    and not from_int):
                self.bad.add(str(func))
        return out


def refresh_rope(model):
    """Recomputes the rotary inv_freq buffers with transformers' own rope init (in float64
    under hf_float64); GPT-2 has learned positions and no rotary buffers."""
    if not hasattr(model, "model"):
        return
    re = model.model.rotary_emb
    fresh = type(re)(model.config)
    # Gemma 3 keeps one pair per layer kind (sliding_attention_inv_freq, ...)
    kinds = [f"{k}_" for k in getattr(re, "layer_types", [])] or [""]
    for k in kinds:
        setattr(re, f"{k}inv_freq", getattr(fresh, f"{k}inv_freq").to(torch.float64))
        setattr(re, f"{k}original_inv_freq", getattr(fresh, f"{k}original_inv_freq").to(torch.float64))


def rope_kwargs(theta, scaling=None):
    """transformers 4.x: rope_theta + rope_scaling; 5.x: rope_parameters."""
    if TV_MAJOR >= 5:
        p = {"rope_type": "default", "rope_theta": float(theta)}
        if scaling:
            p.update(scaling)
            p["rope_theta"] = float(theta)
        return {"rope_parameters": p}
    kw = {"rope_theta": float(theta)}
    if scaling:
        kw["rope_scaling"] = dict(scaling)
    return kw


COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-6, hidden_act="silu", attention_dropout=0.0,
              bos_token_id=1, eos_token_id=2, initializer_range=0.02, use_cache=True)

FAMILIES = {
    # name: (config class, model class, config kwargs, seed)
    "llama": (LlamaConfig, LlamaForCausalLM,
              dict(COMMON, head_dim=8, tie_word_embeddings=False, attention_bias=False,
                   mlp_bias=False, **rope_kwargs(500000.0, LLAMA3_ROPE)), 2001),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(COMMON, tie_word_embeddings=True, use_sliding_window=False,
                   **rope_kwargs(1e6)), 2002),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM,
              dict(COMMON, head_dim=12, tie_word_embeddings=True, attention_bias=False,
                   use_sliding_window=False, **rope_kwargs(1e6)), 2003),
    # Mistral: no biases, head_dim * heads != hidden (as Mistral-Nemo), untied, and a
    # sliding_window shorter than the rows (T = 8), so that the window masks
    "mistral": (MistralConfig, MistralForCausalLM,
                dict(COMMON, head_dim=12, tie_word_embeddings=False, sliding_window=5,
                     **rope_kwargs(1e6)), 2005),
    # Gemma 3 text: layer 0 sliding_attention (window 3 over rows of 8, rope base 1e4),
    # layer 1 full_attention (rope base 1e6 with linear scaling), head_dim 16 with
    # query_pre_attn_scalar equal to it, tied, GeGLU, (1 + w) norms
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM,
               dict({k: v for k, v in COMMON.items() if k != "hidden_act"}, head_dim=16,
                    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16,
                    sliding_window=3, layer_types=["sliding_attention", "full_attention"],
                    tie_word_embeddings=True, attention_bias=False, final_logit_softcapping=None,
                    attn_logit_softcapping=None, pad_token_id=0,
                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                        "rope_theta": 1e6}}), 2006),
    # GPT-2: Conv1D (in, out) weights, LayerNorm with biases, gelu_new, learned positions,
    # tied head; the base of the lora-gpt2 fixture (make_lora_fixtures.py)
    "gpt2": (GPT2Config, GPT2LMHeadModel,
             dict(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=None,
                  activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0, bos_token_id=1,
                  eos_token_id=2, initializer_range=0.02, tie_word_embeddings=True,
                  use_cache=True), 2004),
}


def build(family):
    cfg_cls, model_cls, kw, seed = FAMILIES[family]
    config = cfg_cls(**kw)
    config._attn_implementation = "eager"
    torch.manual_seed(0)    # HF's own init runs first; every parameter is overwritten below
    model = model_cls(config)
    model.config._attn_implementation = "eager"
    return model.float().eval(), seed


def init_params(model, gen):
    """Random, non-trivial values in named_parameters order, rounded to fp32. Gemma's norms
    scale by (1 + weight): theirs are N(0, G_STD), the same 1 + N(0, G_STD) scales."""
    unit = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(tuple(p.shape), generator=gen, dtype=torch.float64)
            if p.dim() >= 2:
                v = W_STD * r
            elif "norm" in name or (".ln_" in name and name.endswith(".weight")):
                v = unit + G_STD * r
            elif name.endswith(".bias"):
                v = B_STD * r
            else:
                raise ValueError(f"unexpected 1-d parameter {name}")
            p.copy_(v.float())


def make_batch(gen):
    seq = torch.randint(0, V, (B, T + 1), generator=gen)
    return seq[:, :T].contiguous(), seq[:, 1:T + 1].contiguous()


def lr_at(s):
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    floor = MIN_LR_RATIO * LR
    p = (s - WARMUP) / max(1, STEPS - WARMUP)
    return floor + (LR - floor) * 0.5 * (1.0 + math.cos(math.pi * p))


def forward_loss(model, idx, tgt, inputs_embeds=None):
    if inputs_embeds is None:
        out = model(input_ids=idx, use_cache=False)
    else:
        out = model(inputs_embeds=inputs_embeds, use_cache=False)
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tgt.reshape(-1))
    return logits, loss


def check_rope(model, family):
    """The llama3 scaling must change the frequencies for this head_dim."""
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = (cfg.rope_parameters["rope_theta"] if TV_MAJOR >= 5 else cfg.rope_theta)
    base = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    got = model.model.rotary_emb.inv_freq.double()
    if family == "llama":
        assert not torch.allclose(got, base.to(got.dtype), rtol=1e-6), "llama3 scaling had no effect"
    else:
        assert torch.allclose(got, base, rtol=1e-6), "unexpected rope frequencies"
    return base, got


def check_tied_grad(model, idx, tgt, combined):
    """The tied embedding's gradient equals the sum of its two uses, taken separately:
    the embedding lookup through inputs_embeds (a separate leaf) and the lm_head (the model's
    own, tied parameter)."""
    E = model.get_input_embeddings().weight
    a = E.detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    emb = a[idx]
    scale = getattr(model.get_input_embeddings(), "embed_scale", None)  # Gemma's, inside embed_tokens
    if scale is not None:
        emb = emb * scale.to(emb.dtype)
    _, loss = forward_loss(model, idx, tgt, inputs_embeds=emb)
    loss.backward()
    g_head, g_emb = E.grad.detach().clone(), a.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    assert g_head.abs().sum() > 0 and g_emb.abs().sum() > 0
    assert torch.allclose(g_head + g_emb, combined, rtol=1e-9, atol=1e-14), "tied grad"


def f32(t):
    return t.detach().to(torch.float32).cpu().numpy()


def run_family(family, outdir):
    model, seed = build(family)
    gen = torch.Generator().manual_seed(seed)
    init_params(model, gen)
    tied = bool(model.config.tie_word_embeddings)
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied

    d = os.path.join(outdir, family)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    if family == "llama":
        ds = os.path.join(outdir, "llama-sharded")
        shutil.rmtree(ds, ignore_errors=True)
        model.save_pretrained(ds, safe_serialization=True, max_shard_size=SHARD_SIZE)
        n = len([f for f in os.listdir(ds) if f.endswith(".safetensors")])
        assert n > 1 and os.path.exists(os.path.join(ds, "model.safetensors.index.json")), n
    if family == "qwen3":
        db = os.path.join(outdir, "qwen3-bf16")
        shutil.rmtree(db, ignore_errors=True)
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(db, safe_serialization=True)

    if family not in ("gpt2", "gemma3"):        # learned positions / two rotary bases
        base, got = check_rope(model, family)
    if family == "llama":
        print(f"  llama3 rope: inv_freq default {base.tolist()}\n"
              f"               inv_freq llama3  {got.tolist()}")

    # fp32 and float64 without the patch, for the record (how far HF's own fp32 steps are)
    g0 = torch.Generator()
    g0.set_state(gen.get_state())
    idx0, tgt0 = make_batch(g0)                 # a copy of the stream: the same batch as below
    with torch.no_grad():
        lg32, _ = forward_loss(model, idx0, tgt0)
        m64 = copy.deepcopy(model).double()
        lg64u, _ = forward_loss(m64, idx0, tgt0)
        with hf_float64():
            refresh_rope(m64)
            lg64, _ = forward_loss(m64, idx0, tgt0)
        del m64
    print(f"  max |logits| diff vs pure float64: fp32 model {(lg32.double() - lg64).abs().max():.3e},"
          f" model.double() without hf_float64 {(lg64u - lg64).abs().max():.3e}")

    model = model.double()
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    with hf_float64():
        refresh_rope(model)
        train(model, family, names, params, gen, tied, d, seed)


def train(model, family, names, params, gen, tied, d, seed):

    # ---- single forward/backward ----
    idx, tgt = make_batch(gen)
    with _NoLowPrecision() as mode:
        logits, loss = forward_loss(model, idx, tgt)
        loss.backward()
    assert not mode.bad, f"ops below float64: {sorted(mode.bad)}"
    grads = {n: params[n].grad.detach().clone() for n in names}
    for n, g in grads.items():
        assert g.abs().max() > 0, f"zero gradient {n}"
    if tied:
        E = model.get_input_embeddings().weight
        check_tied_grad(model, idx, tgt, grads[next(n for n in names if params[n] is E)])

    # ---- STEPS AdamW steps ----
    model.zero_grad(set_to_none=True)
    decay = [params[n] for n in names if params[n].dim() >= 2]
    no_decay = [params[n] for n in names if params[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    tr_in, tr_tg, losses, norms, lrs = [], [], [], [], []
    for s in range(STEPS):
        bi, bt = make_batch(gen)
        tr_in.append(bi)
        tr_tg.append(bt)
        opt.zero_grad(set_to_none=True)
        _, l_s = forward_loss(model, bi, bt)
        l_s.backward()
        norm = torch.nn.utils.clip_grad_norm_([params[n] for n in names], max_norm=MAX_NORM)
        lr = lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(l_s.item())
        norms.append(norm.item())
        lrs.append(lr)
        print(f"  step {s}: loss {l_s.item():.6f} grad_norm {norm.item():.6f} lr {lr:.6e}")
    assert min(norms) > MAX_NORM, f"clipping inactive: {norms}"

    train_attrs = dict(steps=STEPS, warmup=WARMUP, lr=LR, min_lr_ratio=MIN_LR_RATIO,
                       beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=WD,
                       max_grad_norm=MAX_NORM)
    with h5py.File(os.path.join(d, "reference.h5"), "w") as f:
        f.attrs["B"] = np.int32(B)
        f.attrs["T"] = np.int32(T)
        f.attrs["steps"] = np.int32(STEPS)
        f.attrs["warmup"] = np.int32(WARMUP)
        for k in ("lr", "min_lr_ratio", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm"):
            f.attrs[k] = np.float64(train_attrs[k])
        f.attrs["schedule"] = "cosine"
        f.attrs["family"] = family
        f.attrs["hf_class"] = type(model).__name__
        f.attrs["seed"] = np.int32(seed)
        f.attrs["compute_dtype"] = "float64"
        f.attrs["generator"] = "tests/reference/make_hf_fixtures.py"
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["transformers_version"] = str(transformers.__version__)
        f["batch/inputs"] = idx.numpy().astype(np.int32)
        f["batch/targets"] = tgt.numpy().astype(np.int32)
        f["logits"] = f32(logits)
        f["loss"] = np.float32(loss.item())
        for n in names:
            f[f"grads/{n}"] = f32(grads[n])
        f["train/inputs"] = torch.stack(tr_in).numpy().astype(np.int32)
        f["train/targets"] = torch.stack(tr_tg).numpy().astype(np.int32)
        f["train/losses"] = np.array(losses, dtype=np.float32)
        f["train/grad_norms"] = np.array(norms, dtype=np.float32)
        f["train/lrs"] = np.array(lrs, dtype=np.float32)
        for n in names:
            f[f"train/final/{n}"] = f32(params[n])
        t = f["train"]                       # as in fixture.h5
        for k, v in train_attrs.items():
            t.attrs[k] = v
        t.attrs["schedule"] = "cosine"
    print(f"  wrote {d}: loss {loss.item():.6f}, {len(names)} parameters, tied={tied}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default="tests/reference/hf")
    ap.add_argument("families", nargs="*", default=list(FAMILIES))
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.output, exist_ok=True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for fam in args.families:
        print(fam)
        run_family(fam, args.output)


if __name__ == "__main__":
    main()
