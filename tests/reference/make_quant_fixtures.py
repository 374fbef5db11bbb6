#!/usr/bin/env python3
"""Fixtures for tests/unit/test_quant.c, made by bitsandbytes itself on CPU.

Writes tests/reference/quant/bnb4.h5 (inputs and bitsandbytes' outputs of quantize_4bit,
dequantize_4bit, quantize_blockwise and torch.mean),
tests/reference/quant/linear4bit_nf4.safetensors (a Linear4bit state dict as bitsandbytes
serialises it, for the quant_state parser) and config_*.json (quantization_config as transformers
writes it). See tests/reference/README.md.

    /root/.cache/bnb-venv/bin/python tests/reference/make_quant_fixtures.py
"""
import copy
import os
import sys

import h5py
import numpy as np
import torch

import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _get_4bit_quantize_bounds
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "quant")
CPU = torch.device("cpu")


def put(grp, name, data):
    """A dataset, compressed only where that saves more than HDF5's chunk index costs."""
    data = np.asarray(data)
    gz = dict(compression="gzip", compression_opts=9, shuffle=True) if data.nbytes > 8192 else {}
    grp.create_dataset(name, data=data, **gz)

torch.set_num_threads(1)  # torch.mean's summation order depends on the thread count above 32768 elements
g = torch.Generator().manual_seed(2024)


def randn(*shape):
    """N(0,1) with a per-row magnitude from 1e-3 to 10, so blocks have very different absmax."""
    x = torch.randn(*shape, generator=g)
    rows = x.reshape(-1, shape[-1]) if len(shape) > 1 else x.reshape(1, -1)
    scale = 10.0 ** (torch.rand(rows.shape[0], 1, generator=g) * 4 - 3)
    return (rows * scale).reshape(shape).contiguous()


def ties(qt):
    """Values exactly at the float32 midpoints bitsandbytes compares against, and one float either side.
    Block 0 has absmax 1 (scale 1/1 = 1), block 1 absmax 4 (exact scaling by 0.25), and the
    remainder block absmax 2 (divided by 2, exact): the tie survives scaling on every path."""
    bounds, _ = _get_4bit_quantize_bounds(qt, CPU)
    vals = []
    for b in bounds.tolist():
        b32 = np.float32(b)
        vals += [np.nextafter(b32, np.float32(-2)), b32, np.nextafter(b32, np.float32(2))]
    vals = np.array(vals, dtype=np.float32)  # 45 values in [-1, 1]
    blk0 = np.zeros(64, np.float32)
    blk0[:45] = vals
    blk0[45] = 1.0
    blk0[46] = -1.0
    blk1 = np.zeros(64, np.float32)
    blk1[:45] = vals * 4
    blk1[45] = -4.0
    rem = np.zeros(48, np.float32)
    rem[:45] = vals * 2
    rem[45] = 2.0
    return torch.from_numpy(np.concatenate([blk0, blk1, rem])).reshape(1, -1)


def scaling(qt):
    """Values whose code depends on how the block is scaled: x * (1/absmax) (full blocks) and
    x / absmax (the tensor's last partial block) land on different sides of a midpoint. Block 0
    (full) and the tail (48 values) both have absmax 3."""
    bounds, _ = _get_4bit_quantize_bounds(qt, CPU)
    picks, am = [], None
    for cand in np.float32(1.0) + np.arange(1, 4000, dtype=np.float32) * np.float32(0.001):
        inv = np.float32(1) / cand
        found = []
        for b in bounds.numpy():
            x = np.float32(b * cand)
            for _ in range(4):
                x = np.nextafter(x, np.float32(-4))
            for _ in range(8):
                if (np.float32(x * inv) <= b) != (np.float32(x / cand) <= b):
                    found.append(x)
                x = np.nextafter(x, np.float32(4))
        if len(found) >= 4:
            picks, am = found, np.float32(cand)
            break
    picks = np.array(picks[:40], np.float32)
    assert am is not None, "no value separates the two scalings"
    blk = np.zeros(64, np.float32)
    blk[: len(picks)] = picks
    blk[63] = am
    tail = np.zeros(48, np.float32)
    tail[: len(picks)] = picks
    tail[47] = -am
    return torch.from_numpy(np.concatenate([blk, tail])).reshape(1, -1)


def zero_blocks():
    x = randn(4, 128)
    x.reshape(-1)[64:128] = 0.0      # a whole block of 64 (and half a block of 128)
    x.reshape(-1)[320:448] = 0.0     # two blocks of 64, one of 128
    return x


def zero_tail():
    x = torch.zeros(130)
    x[:128] = randn(128)
    return x  # last partial block (2 values) all zero


def splitmix_floats(n, seed):
    """x_i = top 24 bits of splitmix64(seed + i) / 2^24: exact in float32, reproducible in C."""
    M = (1 << 64) - 1
    out = np.empty(n, np.float32)
    for i in range(n):
        z = (seed + i + 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        z ^= z >> 31
        out[i] = np.float32((z >> 40) / float(1 << 24))
    return out


def write_case(h, name, x, qt, bs, dq):
    packed, st = F.quantize_4bit(x, blocksize=bs, compress_statistics=dq, quant_type=qt)
    deq = F.dequantize_4bit(packed, st)
    # bitsandbytes' reference semantics (its default backend, and CUDA): flat blocks of bs values,
    # out = code[nibble] * absmax. Its CPU kernel indexes absmax per row, which agrees only when a
    # row is a whole number of blocks or the last dimension is odd; the cases here are such shapes.
    absmax = st.absmax
    if dq:
        absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
    flat = packed.reshape(-1)
    q = torch.stack([flat >> 4, flat & 15], 1).reshape(-1)[: x.numel()].long()
    ref = F.get_4bit_type(qt, device=CPU)[q] * absmax.float().repeat_interleave(bs)[: x.numel()]
    assert torch.equal(deq.reshape(-1), ref), f"{name}: bitsandbytes' CPU kernel and its reference path disagree"
    grp = h.create_group(f"{name}/{qt}_bs{bs}" + ("_dq" if dq else ""))
    grp.attrs["quant_type"] = qt
    grp.attrs["blocksize"] = bs
    grp.attrs["double_quant"] = int(dq)
    put(grp, "packed", packed.reshape(-1).numpy())
    put(grp, "dequant", deq.reshape(-1).numpy())
    # the same into bfloat16, as a bf16 GEMM would take it (not for the largest case: file size)
    st_bf16 = copy.copy(st)
    st_bf16.dtype = torch.bfloat16
    if x.numel() <= 5000:
        put(grp, "dequant_bf16", F.dequantize_4bit(packed, st_bf16).reshape(-1).view(torch.int16).numpy().view(np.uint16))
    if dq:
        put(grp, "absmax_q", st.absmax.numpy())
        put(grp, "nested_absmax", st.state2.absmax.numpy())
        put(grp, "offset", np.array([st.offset.item()], np.float32))
        grp.attrs["nested_blocksize"] = st.state2.blocksize
        assert torch.equal(st.state2.code, F.create_dynamic_map())
    else:
        put(grp, "absmax", st.absmax.numpy())


def main():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "bnb4.h5")
    with h5py.File(path, "w", libver=("earliest", "v110")) as h:
        h.attrs["bitsandbytes_version"] = bnb.__version__
        h.attrs["torch_version"] = str(torch.__version__)
        h.attrs["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        t = h.create_group("tables")
        t["nf4"] = F.get_4bit_type("nf4", device=CPU).numpy()
        t["fp4"] = F.get_4bit_type("fp4", device=CPU).numpy()
        t["dynamic"] = F.create_dynamic_map().numpy()
        for qt in ("nf4", "fp4"):
            bounds, order = _get_4bit_quantize_bounds(qt, CPU)
            t[f"{qt}_bounds"] = bounds.numpy()
            t[f"{qt}_order"] = order.numpy().astype(np.int32)

        cases = {
            "rand": (randn(8, 128), [64, 128], [False, True]),
            "odd": (randn(7, 37), [64, 128], [False, True]),      # 259 values: partial block, odd count
            "flat200": (randn(200), [64], [False, True]),          # 1-D, partial block, even count
            "zeros": (zero_blocks(), [64, 128], [False, True]),
            "zero_tail": (zero_tail(), [64], [False, True]),
            "many": (randn(66, 128), [32], [True]),                # 264 absmax: nested blocks 256 + 8
        }
        c = h.create_group("cases")
        for name, (x, sizes, dqs) in cases.items():
            put(c, f"{name}/input", x.numpy())
            for qt in ("nf4", "fp4"):
                for bs in sizes:
                    for dq in dqs:
                        write_case(c, name, x, qt, bs, dq)
        for qt in ("nf4", "fp4"):
            x = ties(qt)
            put(c, f"ties_{qt}/input", x.numpy())
            write_case(c, f"ties_{qt}", x, qt, 64, False)
            x = scaling(qt)
            put(c, f"scaling_{qt}/input", x.numpy())
            write_case(c, f"scaling_{qt}", x, qt, 64, False)

        # 8-bit blockwise (the double quantization of absmax) on its own: random values and the
        # values at which bitsandbytes' 65536-entry lookup index changes.
        k = np.arange(0, 65536, 97, dtype=np.float32)
        grid = (np.float32(-1) + (np.float32(2) * k) / np.float32(65535)).astype(np.float32)
        x8 = np.concatenate([grid, np.nextafter(grid, np.float32(2)), np.nextafter(grid, np.float32(-2)),
                             randn(700).numpy()]).astype(np.float32)
        x8[:: 300] = 1.0  # every block of 256 holds absmax 1, so the grid values are not rescaled
        q8, st8 = F.quantize_blockwise(torch.from_numpy(x8), blocksize=256)
        b = h.create_group("blockwise8")
        put(b, "input", x8)
        put(b, "codes", q8.numpy())
        put(b, "absmax", st8.absmax.numpy())
        put(b, "dequant", F.dequantize_blockwise(q8, st8).numpy())

        # torch.mean of float32 (the offset of double quantization), single-threaded.
        m = h.create_group("mean")
        ns = [1, 5, 15, 16, 17, 63, 64, 65, 100, 255, 1000, 4097, 20000, 32767, 32768, 40000, 100000, 262147]
        seed = 77
        xs = splitmix_floats(max(ns), seed)
        m.attrs["seed"] = seed
        m["n"] = np.array(ns, np.int64)
        m["mean"] = np.array([torch.from_numpy(xs[:n]).mean().item() for n in ns], np.float32)
        # and with T threads (torch.set_num_threads(T); OpenMP starts T threads whatever the cores)
        threads = [2, 3, 4, 7, 16]
        m["threads"] = np.array(threads, np.int32)
        mt = np.zeros((len(threads), len(ns)), np.float32)
        for i, t in enumerate(threads):
            torch.set_num_threads(t)
            mt[i] = [torch.from_numpy(xs[:n]).mean().item() for n in ns]
        torch.set_num_threads(1)
        m["mean_threads"] = mt

    # A Linear4bit state dict as bitsandbytes (and transformers' save_pretrained) writes it.
    w = randn(64, 128)
    lin = bnb.nn.Linear4bit(128, 64, bias=False, compress_statistics=True, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=True, quant_type="nf4")
    lin = lin.to(CPU)
    sd = {f"model.layers.0.mlp.down_proj.{k}": v.contiguous() for k, v in lin.state_dict().items()}
    save_file(sd, os.path.join(OUT, "linear4bit_nf4.safetensors"))
    with h5py.File(path, "a", libver=("earliest", "v110")) as h:
        lg = h.create_group("linear4bit")
        lg["input"] = w.numpy()
        for k, v in lin.state_dict().items():
            put(lg, k, v.numpy())
    # config.json of quantized models as transformers writes them: the bitsandbytes 4-bit one
    # ztrain reads, and the quantizations it refuses.
    from transformers import AwqConfig, BitsAndBytesConfig, FineGrainedFP8Config, GPTQConfig, LlamaConfig

    qcs = {
        "bnb4": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=["lm_head"]),
        "bnb8": BitsAndBytesConfig(load_in_8bit=True),
        "gptq": GPTQConfig(bits=4),
        "awq": AwqConfig(bits=4),
        "fp8": FineGrainedFP8Config(),
    }
    for name, qc in qcs.items():
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, vocab_size=100)
        cfg.quantization_config = qc
        cfg.to_json_file(os.path.join(OUT, f"config_{name}.json"))
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
