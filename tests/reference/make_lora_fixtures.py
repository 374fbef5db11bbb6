#!/usr/bin/env python3
"""make_lora_fixtures.py — PEFT LoRA reference fixtures for ztrain, on the HF fixtures'
llama, qwen3, gemma3 and gpt2 models (tests/reference/hf/{llama,qwen3,gemma3,gpt2}, made by
make_hf_fixtures.py).

For each base it loads the model with AutoModelForCausalLM.from_pretrained(base,
attn_implementation="eager"), wraps it with peft.get_peft_model and

  LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", use_rslora=False,
             init_lora_weights=True,
             target_modules=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj])

(gpt2: target_modules=[c_attn, c_proj, c_fc], so c_proj takes attn.c_proj and mlp.c_proj; its
Conv1D bases make PEFT set fan_in_fan_out=True, which the script asserts)

then overwrites every lora_A and lora_B with random values (so the forward depends on the
adapters from the start) and writes

  tests/reference/hf/lora-<family>/adapter_config.json, adapter_model.safetensors
      peft_model.save_pretrained(dir): the fp32 initial adapter
  tests/reference/hf/lora-<family>/reference.h5
      attrs B T steps warmup lr min_lr_ratio beta1 beta2 eps weight_decay max_grad_norm
            schedule r lora_alpha scaling versions (+ family seed base compute_dtype ...)
      /batch/inputs, /batch/targets (B,T) int32   = the base fixture's /batch
      /logits (B,T,V), /loss                       base + adapter, loss = mean cross-entropy
                                                   over all B*T positions from the logits
      /grads/<adapter key>                         d loss / d adapter parameter (base frozen)
      /train/inputs, /train/targets (S,B,T) int32  = the base fixture's /train batches
      /train/losses, /train/grad_norms (pre-clip, adapter parameters only), /train/lrs (S)
      /train/final/<adapter key>                   adapter parameters after the S AdamW steps
  tests/reference/hf/lora-{llama,gpt2}/merged/
      merge_and_unload() of the initial adapter, save_pretrained in fp32, plus a small
      reference.h5 (/batch, /logits, /loss of the merged model) for check_hf_export.py

<adapter key> is the tensor's name in adapter_model.safetensors, e.g.
base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.

The float64 method, the schedule, the loss and the optimizer settings are those of
make_hf_fixtures.py, imported from it (hf_float64, refresh_rope, _NoLowPrecision, lr_at,
forward_loss and the constants), so both fixture sets follow one definition.

Run:  ~/.cache/ztrain-venv/bin/python tests/reference/make_lora_fixtures.py [-o tests/reference/hf]
"""
import argparse
import copy
import json
import os
import shutil
import sys

import h5py
import numpy as np
import peft
import safetensors
import torch
import transformers
from peft import LoraConfig, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_fixtures as hf                                   # noqa: E402
from make_hf_fixtures import (B, T, STEPS, WARMUP, LR, MIN_LR_RATIO, BETAS, EPS, WD,  # noqa: E402
                              MAX_NORM, hf_float64, refresh_rope, _NoLowPrecision, lr_at,
                              forward_loss, f32)

R, ALPHA = 4, 8
SCALING = ALPHA / R          # use_rslora=False: lora_alpha / r
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# family: (target_modules, adapted modules per block, fan_in_fan_out)
TARGETS = {"llama": (LLAMA_TARGETS, 7, False), "qwen3": (LLAMA_TARGETS, 7, False),
           "gpt2": (["c_attn", "c_proj", "c_fc"], 4, True), "gemma3": (LLAMA_TARGETS, 7, False)}
A_STD, B_STD = 0.3, 0.05     # lora_A ~ N(0, A_STD), lora_B ~ N(0, B_STD); A_STD 0.1 (PEFT's own
                             # kaiming scale) left llama's grad norms < 1, see the README
# gemma3: 3046, not 3006, whose draw made the 10 steps ill-conditioned (PEFT's own fp32 run
# ended 1.1e-5 from the float64 adapters, its grad norms up to 1.3e-5; 2.5e-6 and 3.3e-6 with 3046)
SEEDS = {"llama": 3001, "qwen3": 3003, "gpt2": 3004, "gemma3": 3046}
MERGED = {"llama", "gpt2"}   # families that also get lora-<family>/merged/

# run_family's llama/qwen3 models use these modules; so does hf_float64
assert "transformers.models.llama.modeling_llama" in hf.F64_MODULES
assert "transformers.models.qwen3.modeling_qwen3" in hf.F64_MODULES


def lora_config(family):
    return LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(TARGETS[family][0]),
                      bias="none", use_rslora=False, init_lora_weights=True,
                      task_type="CAUSAL_LM")


def adapter_names(pm):
    """named_parameters name (…lora_A.default.weight) -> adapter file key (…lora_A.weight),
    matched through peft's own get_peft_model_state_dict by tensor identity."""
    sd = get_peft_model_state_dict(pm)
    by_ptr = {t.data_ptr(): k for k, t in sd.items()}
    out = {}
    for n, p in pm.named_parameters():
        if p.requires_grad:
            out[n] = by_ptr[p.data_ptr()]
    assert sorted(out.values()) == sorted(sd), "trainable parameters != adapter state dict"
    return out


def fix_adapter_dir(d, family):
    """Makes save_pretrained's output reproducible: peft writes target_modules, a set, as a
    list in hash order (which varies with PYTHONHASHSEED), so it is rewritten sorted, with
    peft's own json.dumps(indent=2, sort_keys=True); nothing else changes. The model card
    README.md peft adds (an empty template) is removed."""
    fn = os.path.join(d, "adapter_config.json")
    with open(fn) as f:
        cfg = json.load(f)
    assert sorted(cfg["target_modules"]) == sorted(TARGETS[family][0]), cfg["target_modules"]
    assert cfg["fan_in_fan_out"] == TARGETS[family][2], cfg["fan_in_fan_out"]
    cfg["target_modules"] = sorted(cfg["target_modules"])
    with open(fn, "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True))
    card = os.path.join(d, "README.md")
    if os.path.exists(card):
        os.remove(card)
    assert sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors"], \
        os.listdir(d)


def run_family(family, outdir):
    base_dir = os.path.join(outdir, family)
    with h5py.File(os.path.join(base_dir, "reference.h5"), "r") as f:
        idx = torch.from_numpy(f["batch/inputs"][...].astype(np.int64))
        tgt = torch.from_numpy(f["batch/targets"][...].astype(np.int64))
        base_logits = torch.from_numpy(f["logits"][...]).double()
        tr_in = torch.from_numpy(f["train/inputs"][...].astype(np.int64))
        tr_tg = torch.from_numpy(f["train/targets"][...].astype(np.int64))
        base_attrs = {k: f.attrs[k] for k in ("B", "T", "steps", "warmup")}
    assert tuple(idx.shape) == (B, T) and tuple(tr_in.shape) == (STEPS, B, T), "base fixture"
    assert [int(base_attrs[k]) for k in ("B", "T", "steps", "warmup")] == [B, T, STEPS, WARMUP]

    model = AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="eager",
                                                 dtype=torch.float32)
    model.config._attn_implementation = "eager"
    model = model.float().eval()
    pm = get_peft_model(model, lora_config(family))
    pm.peft_config["default"].base_model_name_or_path = f"tests/reference/hf/{family}"
    pm.eval()
    names = adapter_names(pm)                  # trainable name -> file key
    params = dict(pm.named_parameters())
    assert all(("lora_A" in n or "lora_B" in n) for n in names), names
    assert len(names) == 2 * TARGETS[family][1] * model.config.num_hidden_layers
    for n, p in pm.named_parameters():
        assert p.requires_grad == (n in names), f"{n} trainable={p.requires_grad}"

    # with init_lora_weights=True lora_B is 0: the model is the base one
    with torch.no_grad(), hf_float64():
        m64 = copy.deepcopy(pm).double()
        refresh_rope(m64.get_base_model())
        lg0, _ = forward_loss(m64, idx, tgt)
        del m64
    d0 = (lg0 - base_logits).abs().max().item()
    assert d0 < 1e-6, f"B=0 adapter changes the logits by {d0}"

    gen = torch.Generator().manual_seed(SEEDS[family])
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if n not in names:
                continue
            std = A_STD if ".lora_A." in n else B_STD
            p.copy_((std * torch.randn(tuple(p.shape), generator=gen, dtype=torch.float64)).float())

    d = os.path.join(outdir, f"lora-{family}")
    shutil.rmtree(d, ignore_errors=True)
    pm.save_pretrained(d, safe_serialization=True)
    fix_adapter_dir(d, family)
    with safe_open(os.path.join(d, "adapter_model.safetensors"), "pt") as sf:
        keys = sorted(sf.keys())
        for n, k in names.items():
            t = sf.get_tensor(k)
            assert t.dtype == torch.float32 and torch.equal(t, params[n].detach()), k
    assert keys == sorted(names.values()), keys

    if family in MERGED:
        # merged in float64, rounded to fp32 once (the exact merge of the fp32 initial adapter)
        merged = copy.deepcopy(pm).double().merge_and_unload()
        merged = merged.float()
        merged.config.dtype = torch.float32
        dm = os.path.join(d, "merged")
        merged.save_pretrained(dm, safe_serialization=True)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if n in names and ".lora_A." in n:
                    pre = n[:-len(".lora_A.default.weight")]
                    W = params[pre + ".base_layer.weight"].double()
                    Bm = params[pre + ".lora_B.default.weight"].double()
                    delta = Bm @ p.double()                     # (out, in)
                    if TARGETS[family][2]:                       # Conv1D weight (in, out)
                        delta = delta.T
                    want = (W + SCALING * delta).float()
                    hfname = pre[len("base_model.model."):] + ".weight"
                    got = dict(merged.named_parameters())[hfname]
                    assert torch.equal(got, want), hfname
        del merged

    pm = pm.double()
    with hf_float64():
        refresh_rope(pm.get_base_model())
        train(pm, family, names, params, idx, tgt, base_logits, tr_in, tr_tg, d)
    if family in MERGED:
        check_merged(pm, family, d, idx, tgt, outdir)


def check_merged(pm, family, d, idx, tgt, outdir):
    """The merged directory loads without missing/unexpected keys and, in float64, gives the
    initial adapter's logits (reference.h5 /logits) up to the fp32 rounding of the merge."""
    m, info = AutoModelForCausalLM.from_pretrained(os.path.join(d, "merged"),
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), (k, info[k])
    with h5py.File(os.path.join(d, "reference.h5"), "r") as f:
        ref = torch.from_numpy(f["logits"][...]).double()
    m = m.double().eval()
    with torch.no_grad(), hf_float64():
        refresh_rope(m)
        lg = m(input_ids=idx, use_cache=False).logits
    diff = (lg - ref).abs().max().item()
    print(f"  merged/: logits vs reference.h5 /logits (adapter) max abs diff {diff:.3e}")
    assert diff < 1e-5, diff
    with open(os.path.join(outdir, family, "config.json")) as f:
        base_cfg = json.load(f)
    with open(os.path.join(d, "merged", "config.json")) as f:
        mcfg = json.load(f)
    assert mcfg == base_cfg, "merged config.json differs from the base's"
    # merged/reference.h5: just what check_hf_export.py reads, so that
    # check_hf_export.py OUT/merged tests/reference/hf/lora-llama/merged compares an export
    loss = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1))
    with h5py.File(os.path.join(d, "merged", "reference.h5"), "w") as f:
        f.attrs["B"] = np.int32(B)
        f.attrs["T"] = np.int32(T)
        f.attrs["family"] = family
        f.attrs["compute_dtype"] = "float64"
        f.attrs["generator"] = "tests/reference/make_lora_fixtures.py"
        f.attrs["note"] = ("merge_and_unload() of ../adapter_model.safetensors (the initial "
                           "adapter) on tests/reference/hf/" + family + "; logits of this "
                           "directory's model")
        f["batch/inputs"] = idx.numpy().astype(np.int32)
        f["batch/targets"] = tgt.numpy().astype(np.int32)
        f["logits"] = f32(lg)
        f["loss"] = np.float32(loss.item())


def adapter_steps(pm, params, order, tr_in, tr_tg):
    """STEPS AdamW steps of the adapter parameters `order` (params: name -> tensor) over the
    batches tr_in, tr_tg, clipped and scheduled as make_hf_fixtures.py; returns the losses,
    the pre-clip gradient norms and the learning rates."""
    pm.zero_grad(set_to_none=True)
    decay = [params[n] for n in order if params[n].dim() >= 2]
    no_decay = [params[n] for n in order if params[n].dim() < 2]
    assert len(decay) == len(order) and not no_decay      # every LoRA parameter is a matrix
    groups = [{"params": decay, "weight_decay": WD}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    losses, norms, lrs = [], [], []
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l_s = forward_loss(pm, tr_in[s], tr_tg[s])
        l_s.backward()
        norm = torch.nn.utils.clip_grad_norm_([params[n] for n in order], max_norm=MAX_NORM)
        lr = lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(l_s.item())
        norms.append(norm.item())
        lrs.append(lr)
        print(f"  step {s}: loss {l_s.item():.6f} grad_norm {norm.item():.6f} lr {lr:.6e}")
    return losses, norms, lrs


def train(pm, family, names, params, idx, tgt, base_logits, tr_in, tr_tg, d):
    order = list(names)                                   # named_parameters order
    # ---- single forward/backward on the fixture batch ----
    with _NoLowPrecision() as mode:
        logits, loss = forward_loss(pm, idx, tgt)
        loss.backward()
    assert not mode.bad, f"ops below float64: {sorted(mode.bad)}"
    for n, p in pm.named_parameters():
        assert (p.grad is not None) == (n in names), n
    grads = {n: params[n].grad.detach().clone() for n in order}
    for n, g in grads.items():
        assert g.abs().max() > 0, f"zero gradient {n}"
    dl = (logits - base_logits).abs().max().item()
    print(f"  adapter moves the logits by {dl:.3e} (max abs vs the base fixture)")
    assert dl > 1e-3, "the adapter barely changes the forward"

    # ---- STEPS AdamW steps over the adapter parameters, base frozen ----
    frozen = {n: p.detach().clone() for n, p in pm.named_parameters() if n not in names}
    losses, norms, lrs = adapter_steps(pm, params, order, tr_in, tr_tg)
    assert min(norms) > MAX_NORM, f"clipping inactive: {norms}"
    for n, p in pm.named_parameters():
        if n not in names:
            assert torch.equal(p, frozen[n]), f"frozen {n} moved"

    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, "
                f"peft {peft.__version__}, safetensors {safetensors.__version__}, "
                f"h5py {h5py.__version__}, numpy {np.__version__}")
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
        f.attrs["r"] = np.int32(R)
        f.attrs["lora_alpha"] = np.float64(ALPHA)
        f.attrs["scaling"] = np.float64(SCALING)
        f.attrs["versions"] = versions
        f.attrs["family"] = family
        f.attrs["base"] = f"tests/reference/hf/{family}"
        f.attrs["hf_class"] = type(pm.get_base_model()).__name__
        f.attrs["seed"] = np.int32(SEEDS[family])
        f.attrs["compute_dtype"] = "float64"
        f.attrs["generator"] = "tests/reference/make_lora_fixtures.py"
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["transformers_version"] = str(transformers.__version__)
        f.attrs["peft_version"] = str(peft.__version__)
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
        t = f["train"]
        for k, v in train_attrs.items():
            t.attrs[k] = v
        t.attrs["schedule"] = "cosine"
    print(f"  wrote {d}: loss {loss.item():.6f}, {len(order)} adapter tensors, "
          f"{sum(params[n].numel() for n in order)} numbers")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default="tests/reference/hf",
                    help="directory holding the base fixtures; lora-<family>/ go there")
    ap.add_argument("families", nargs="*", default=list(SEEDS))
    args = ap.parse_args()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}")
    for fam in args.families:
        print(fam)
        run_family(fam, args.output)


if __name__ == "__main__":
    main()
