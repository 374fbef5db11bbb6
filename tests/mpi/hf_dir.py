#!/usr/bin/python3
"""hf_dir.py — Hugging Face model directories for tests/mpi/families.sh (numpy, h5py, json).

  hf_dir.py tokens OUT.h5 VOCAB N          a token file (ids < VOCAB, deterministic)
  hf_dir.py sft OUT.h5 VOCAB N [label|offsets]  an SFT file of N samples (prompts masked),
                                           optionally broken one way
  hf_dir.py sft-neat NEAT.h5 APART.h5 VOCAB ROWS K T [plain|negative|short]
                                           ROWS neat-packed rows of T + 1 tokens, K samples each,
                                           and the same samples one per row; plain: NEAT.h5
                                           without /segment_ids; negative, short: a broken one
  hf_dir.py same A B                       A's and B's safetensors hold the same tensors,
                                           bit for bit (single file or index + shards)
  hf_dir.py close A B TOL                  the same names, values within TOL (max abs)
  hf_dir.py rel A B TOL [ROWS.json]        the same names, each tensor of A within TOL of B's
                                           (relative L2); with ROWS.json, a tensor of B with
                                           fewer rows than A's holds A's rows "embed_rows"
  hf_dir.py ckpt CKPT.h5 DIR               the checkpoint's /model tensors of DIR's names equal DIR's
  hf_dir.py llama DIR V C L NH NKV HD I   a LlamaForCausalLM directory of those shapes (untied
                                           head), weights N(0, 0.02) from a fixed seed, float32
  hf_dir.py bad KIND SRC DST               copies SRC to DST and breaks it one way:
       drop-tensor | extra-tensor | bad-shape | f64 | truncate | corrupt-header |
       missing-shard | unknown-arch | bnb-8bit | gptq | awq | fp8 (config.json's
       quantization_config) | qs-json | absmax-len | quant-map (a bitsandbytes 4-bit directory's
       down_proj of layer 0: its quant_state JSON, its absmax one short, its quant_map) |
       nan | inf (one value of that weight in a full-precision directory)
Reads and writes safetensors by hand (8-byte little-endian header length, JSON header,
data) so that it needs nothing beyond Debian's python3-numpy and python3-h5py."""
import json, os, shutil, struct, sys
import numpy as np

DT = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def values(dt, raw):
    """A tensor's values in float64 (BF16: the upper half of a float32)."""
    if dt == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.frombuffer(raw, DT[dt]).astype(np.float64)


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    return hdr, data


def write_st(path, hdr, data):
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def files(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    for single in ("model.safetensors", "adapter_model.safetensors"):
        if os.path.exists(os.path.join(d, single)):
            return [os.path.join(d, single)]
    return sorted(set(os.path.join(d, f) for f in json.load(open(idx))["weight_map"].values()))


def tensors(d):
    out = {}
    for p in files(d):
        hdr, data = read_st(p)
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], tuple(v["shape"]), data[b:e])
    return out


def cmd_same(a, b):
    ta, tb = tensors(a), tensors(b)
    if set(ta) != set(tb):
        print("tensor names differ:", sorted(set(ta) ^ set(tb)))
        return 1
    bad = [k for k in ta if ta[k] != tb[k]]
    for k in bad[:5]:
        print("differs:", k, ta[k][0], tb[k][0], ta[k][1], tb[k][1])
    print(f"{len(ta)} tensors, {len(bad)} differ")
    return 1 if bad else 0


def cmd_close(a, b, tol):
    ta, tb = tensors(a), tensors(b)
    if set(ta) != set(tb):
        print("tensor names differ:", sorted(set(ta) ^ set(tb)))
        return 1
    worst, name = 0.0, "-"
    for k in ta:
        x = values(ta[k][0], ta[k][2])
        y = values(tb[k][0], tb[k][2])
        d = float(np.max(np.abs(x - y))) if x.size else 0.0
        if d > worst:
            worst, name = d, k
    print(f"{len(ta)} tensors, max abs difference {worst:.3e} ({name}), tolerance {tol:g}")
    return 0 if worst <= tol else 1


def cmd_rel(a, b, tol, rows_json=None):
    ta, tb = tensors(a), tensors(b)
    if set(ta) != set(tb):
        print("tensor names differ:", sorted(set(ta) ^ set(tb))[:6])
        return 1
    rows = json.load(open(rows_json))["embed_rows"] if rows_json else None
    worst, name = 0.0, "-"
    for k in ta:
        x = values(ta[k][0], ta[k][2])
        y = values(tb[k][0], tb[k][2])
        if rows is not None and ta[k][1][0] > tb[k][1][0]:
            x = x.reshape(ta[k][1])[rows].reshape(-1)
        if x.shape != y.shape:
            print(f"{k}: {ta[k][1]} against {tb[k][1]}")
            return 1
        d = float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))
        if d > worst:
            worst, name = d, k
    print(f"{len(ta)} tensors, worst relative L2 {worst:.3e} ({name}), tolerance {tol:g}")
    return 0 if worst <= tol else 1


def cmd_ckpt(ckpt, d):
    """the checkpoint's /model tensors of d's names equal d's, bit for bit"""
    import h5py
    t = tensors(d)
    bad = 0
    with h5py.File(ckpt, "r") as h:
        for k, (dt, shape, raw) in t.items():
            if k not in h["model"]:
                continue
            x = h["model"][k][...].astype(np.float32).tobytes()
            bad += x != np.frombuffer(raw, DT[dt]).astype(np.float32).tobytes()
    print(f"{len(t)} tensors of {d} against {ckpt}: {bad} differ")
    return 1 if bad else 0


def cmd_sft(out, vocab, n, bad=""):
    """n samples of 5..30 tokens whose first part (the prompt) carries no loss"""
    import h5py
    rng = np.random.default_rng(7)
    ids, labels, offs = [], [], [0]
    for i in range(n):
        m = int(rng.integers(5, 31))
        x = rng.integers(0, vocab - 1, m)
        y = x.copy()
        y[: int(rng.integers(1, m - 1))] = -100
        ids += list(x)
        labels += list(y)
        offs.append(len(ids))
    if bad == "label":
        labels[3] = vocab + 5
    if bad == "offsets":
        offs[-1] += 1
    with h5py.File(out, "w") as h:
        h["input_ids"] = np.array(ids, np.int32)
        h["labels"] = np.array(labels, np.int32)
        h["sample_offsets"] = np.array(offs, np.int64)
        h.attrs["vocab_size"] = np.int64(vocab)
        h.attrs["eot_token"] = np.int64(vocab - 1)
    return 0


def cmd_sft_neat(neat, apart, vocab, rows, k, T, how=""):
    """rows packed rows of T + 1 tokens holding k samples each (lengths 2..T/k, prompts
    masked, trained in full otherwise: every sample's first label is a real id, so the
    target the trainer drops at each boundary would count), padded with vocab - 1 and
    segment 0 as LLaMA-Factory pads; apart: those samples in order, one per row"""
    import h5py
    rng = np.random.default_rng(11)
    pad = vocab - 1
    ids, labels, segs, offs = [], [], [], [0]
    a_ids, a_labels, a_offs = [], [], [0]
    for r in range(rows):
        row_ids, row_lab, row_seg = [], [], []
        for i in range(k):
            m = int(rng.integers(2, T // k + 1))
            x = rng.integers(0, vocab - 1, m)
            y = x.copy()
            y[1 : 1 + int(rng.integers(0, m - 1))] = -100  # the prompt after a first token
            row_ids += list(x)
            row_lab += list(y)
            row_seg += [i + 1] * m
            a_ids += list(x)
            a_labels += list(y)
            a_offs.append(len(a_ids))
        fill = T + 1 - len(row_ids)
        ids += row_ids + [pad] * fill
        labels += row_lab + [-100] * fill
        segs += row_seg + [0] * fill
        offs.append(len(ids))
    if how == "negative":
        segs[2] = -3
    for path, i, l, o, s in ((neat, ids, labels, offs, segs), (apart, a_ids, a_labels, a_offs, None)):
        with h5py.File(path, "w") as h:
            h["input_ids"] = np.array(i, np.int32)
            h["labels"] = np.array(l, np.int32)
            h["sample_offsets"] = np.array(o, np.int64)
            if s is not None and how != "plain":
                h["segment_ids"] = np.array(s[:-1] if how == "short" else s, np.int32)
            h.attrs["vocab_size"] = np.int64(vocab)
            h.attrs["eot_token"] = np.int64(pad)
    return 0


def cmd_tokens(out, vocab, n):
    import h5py
    ids = (np.arange(n, dtype=np.int64) * 2654435761 % 4294967296 >> 7) % vocab
    with h5py.File(out, "w") as h:
        h["tokens"] = ids.astype(np.int32)
        h.attrs["vocab_size"] = np.int64(vocab)
        h.attrs["eot_token"] = np.int64(vocab - 1)
    return 0


def cmd_bad(kind, src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    st = files(dst)[0]
    hdr, data = read_st(st)
    names = [k for k in hdr if k != "__metadata__"]
    if kind == "drop-tensor":      # the last tensor of the file goes
        victim = max(names, key=lambda k: hdr[k]["data_offsets"][0])
        b, e = hdr.pop(victim)["data_offsets"]
        data = data[:b]
        print(victim)
    elif kind == "extra-tensor":
        hdr["model.layers.0.mlp.extra.weight"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
        data += b"\0" * 8
    elif kind == "f64":
        k = names[0]
        v = hdr[k]
        x = np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], DT[v["dtype"]]).astype(np.float64)
        # rebuild the file with k as F64 at the end
        parts, off, newhdr = [], 0, {"__metadata__": hdr.get("__metadata__", {})}
        for n in sorted(names, key=lambda n: hdr[n]["data_offsets"][0]):
            if n == k:
                continue
            b, e = hdr[n]["data_offsets"]
            parts.append(data[b:e])
            newhdr[n] = dict(hdr[n], data_offsets=[off, off + e - b])
            off += e - b
        raw = x.tobytes()
        newhdr[k] = {"dtype": "F64", "shape": v["shape"], "data_offsets": [off, off + len(raw)]}
        hdr, data = newhdr, b"".join(parts) + raw
        print(k)
    elif kind == "truncate":
        write_st(st, hdr, data)
        size = os.path.getsize(st)
        with open(st, "r+b") as f:
            f.truncate(size - 100)
        return 0
    elif kind == "corrupt-header":
        with open(st, "r+b") as f:
            f.seek(12)
            f.write(b"}{garbage")
        return 0
    elif kind == "missing-shard":
        os.remove(st)
        return 0
    elif kind == "bad-shape":
        cfgp = os.path.join(dst, "config.json")
        c = json.load(open(cfgp))
        c["intermediate_size"] += 8
        json.dump(c, open(cfgp, "w"), indent=2)
        return 0
    elif kind == "unknown-arch":
        cfgp = os.path.join(dst, "config.json")
        c = json.load(open(cfgp))
        c["architectures"], c["model_type"] = ["FooForCausalLM"], "foo"
        json.dump(c, open(cfgp, "w"), indent=2)
        return 0
    elif kind in QUANT_CONFIGS:
        cfgp = os.path.join(dst, "config.json")
        c = json.load(open(cfgp))
        c["quantization_config"] = QUANT_CONFIGS[kind]
        json.dump(c, open(cfgp, "w"), indent=2)
        return 0
    elif kind in ("qs-json", "absmax-len", "quant-map", "nan", "inf"):
        t = {n: (hdr[n]["dtype"], hdr[n]["shape"], data[hdr[n]["data_offsets"][0]:hdr[n]["data_offsets"][1]])
             for n in names}
        w = "model.layers.0.mlp.down_proj.weight"
        if kind == "qs-json":      # the JSON bytes of its quant_state broken, their length kept
            k = next(n for n in names if n.startswith(w + ".quant_state."))
            dt, sh, raw = t[k]
            t[k] = (dt, sh, b"}{garbage" + raw[9:])
        elif kind == "absmax-len":  # one absmax value short
            dt, sh, raw = t[w + ".absmax"]
            t[w + ".absmax"] = (dt, [sh[0] - 1], raw[:-(1 if dt == "U8" else 4)])
        elif kind == "quant-map":  # a code value that is not bitsandbytes'
            dt, sh, raw = t[w + ".quant_map"]
            x = np.frombuffer(raw, np.float32).copy()
            x[3] += 0.25
            t[w + ".quant_map"] = (dt, sh, x.tobytes())
        else:                      # a full-precision weight with a NaN or an infinity
            dt, sh, raw = t[w]
            x = np.frombuffer(raw, DT[dt]).copy()
            x[77] = np.nan if kind == "nan" else np.inf
            t[w] = (dt, sh, x.tobytes())
        hdr, data, off = {"__metadata__": hdr.get("__metadata__", {})}, b"", 0
        for n in names:
            dt, sh, raw = t[n]
            hdr[n] = {"dtype": dt, "shape": sh, "data_offsets": [off, off + len(raw)]}
            data += raw
            off += len(raw)
    else:
        print("unknown kind", kind)
        return 2
    write_st(st, hdr, data)
    return 0


# config.json quantization_configs of the quantizations ztrain does not read, as their libraries write them
QUANT_CONFIGS = {
    "bnb-8bit": {"quant_method": "bitsandbytes", "load_in_8bit": True, "load_in_4bit": False},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
}
def cmd_llama(d, V, C, L, NH, NKV, HD, I):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 1, "eos_token_id": 2, "head_dim": HD, "hidden_act": "silu", "hidden_size": C,
           "initializer_range": 0.02, "intermediate_size": I, "max_position_embeddings": 2048, "mlp_bias": False,
           "model_type": "llama", "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": NKV,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
           "vocab_size": V}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    shapes = [("model.embed_tokens.weight", (V, C))]
    for l in range(L):
        p = f"model.layers.{l}."
        shapes += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (NH * HD, C)),
                   (p + "self_attn.k_proj.weight", (NKV * HD, C)), (p + "self_attn.v_proj.weight", (NKV * HD, C)),
                   (p + "self_attn.o_proj.weight", (C, NH * HD)), (p + "post_attention_layernorm.weight", (C,)),
                   (p + "mlp.gate_proj.weight", (I, C)), (p + "mlp.up_proj.weight", (I, C)),
                   (p + "mlp.down_proj.weight", (C, I))]
    shapes += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
    rng = np.random.default_rng(1234)
    hdr, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape)) * 4
        hdr[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in shapes:  # a tensor at a time: the directory may be larger than memory
            x = np.ones(shape, np.float32) if len(shape) == 1 else \
                (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02))
            f.write(x.tobytes())
    return 0


def main(a):
    if a[:1] == ["same"] and len(a) == 3:
        return cmd_same(a[1], a[2])
    if a[:1] == ["close"] and len(a) == 4:
        return cmd_close(a[1], a[2], float(a[3]))
    if a[:1] == ["rel"] and len(a) in (4, 5):
        return cmd_rel(a[1], a[2], float(a[3]), a[4] if len(a) == 5 else None)
    if a[:1] == ["ckpt"] and len(a) == 3:
        return cmd_ckpt(a[1], a[2])
    if a[:1] == ["sft"] and len(a) in (4, 5):
        return cmd_sft(a[1], int(a[2]), int(a[3]), a[4] if len(a) == 5 else "")
    if a[:1] == ["sft-neat"] and len(a) in (7, 8):
        return cmd_sft_neat(a[1], a[2], *map(int, a[3:7]), a[7] if len(a) == 8 else "")
    if a[:1] == ["tokens"] and len(a) == 4:
        return cmd_tokens(a[1], int(a[2]), int(a[3]))
    if a[:1] == ["llama"] and len(a) == 9:
        return cmd_llama(a[1], *map(int, a[2:9]))
    if a[:1] == ["bad"] and len(a) == 4:
        return cmd_bad(a[1], a[2], a[3])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
