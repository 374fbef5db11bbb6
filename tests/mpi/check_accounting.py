#!/usr/bin/python3
"""check_accounting.py RUN_DIR STRATEGY WORLD ACCUM [SHARD_GROUP] [--bf16|--fp16] [--reduce-bf16|--reduce-fp16]
                      [--offload] [--offload-param] [--llama] [--frozen=U,...] [--qlora=DIR [--no-double-quant]]
check_accounting.py RUN_DIR --traffic [--freeze=K]

Checks a run's metrics.jsonl against the ZeRO memory formulas and the
collective volumes theory predicts, computed here independently from the model
shape (flat layout, fp32):
  P_u = unit u's parameter count padded to a multiple of the shard group size n,
  S_u = P_u / n (what one rank owns).
  ddp            all-reduce 4*Psi per step
  zero1          reduce-scatter 4*sum(P) + all-gather 4*sum(P)
  zero2          reduce-scatter A*4*sum(P) + all-gather 4*sum(P)
  shard_grad_op  all-gather A*4*sum(P), reduce-scatter A*4*sum(P)
  zero3          all-gather A*4*(P_root + 2*sum(P_blocks)), reduce-scatter A*4*sum(P)
  hybrid_shard   as zero3 inside the shard group, plus all-reduce 4*sum(S) across replicas
Memory (bytes per rank): ddp 4/4/8 x Psi; zero1 params 4*sum(P), grads 4*sum(P)+4*sum(S),
optimizer 8*sum(S); zero2 params 4*sum(P), grads 4*sum(S); zero3 and hybrid 4/4/8 x sum(S),
i.e. 16*Psi/n plus padding. Transient buffers (reduction buffers, gathered units):
the measured peak must not exceed the estimate. Every figure of the estimate (a dry run of the
engine and the model, zt_memplan.h) equals rank 0's measurement.

Dtype bytes (both optional; without them everything is fp32 as above):
  --bf16         train.bf16 = true: working parameters are bf16, so params and
                 every parameter all-gather take 2 bytes per element, and the
                 fp32 master weights join the Adam moments: optimizer 12 bytes per
                 owned element (ZeRO's mixed-precision 2 + 2 + 12). Gradients stay
                 4 bytes: the accumulators across micro-steps are fp32, so the
                 total is 2 + 4 + 12 = 18 bytes per parameter (/n when sharded).
  --reduce-bf16  parallel.reduce_dtype = bf16: every gradient reduction
                 (all-reduce, reduce-scatter) moves 2 bytes per element.
  --fp16, --reduce-fp16  the same byte counts for train.fp16 and reduce_dtype = fp16.
Offload (ZeRO-Offload; both optional):
  --offload        parallel.offload_optimizer = cpu: the backend's optimizer memory
                   is 0; host memory holds the fp32 master, m and v (12 bytes per
                   owned element) plus two landings of the largest unit's owned
                   gradients (2 * 4 * max S: the next unit's download overlaps
                   this unit's AdamW) and, 16-bit, one rounding buffer (2 * max S).
                   Where gradients are sharded (zero2, shard_grad_op, zero3) the
                   owned gradient accumulators move to the host as well (ZeRO-Offload):
                   backend grads 0, host + 4 * sum(S).
  --offload-param  parallel.offload_param = cpu too: the backend holds no
                   parameter shard; a 16-bit working shard (2 * sum S) joins the host
                   (fp32: the master is the working shard), no rounding buffer.
Frozen units (LoRA's base; optional):
  --frozen=U,...   the units given (0 the root, 1.. the blocks; default: the start
                   record's "frozen_units", if any) are frozen: they hold their
                   parameters only (Fp bytes per element, the host's under
                   --offload-param), no gradients, no optimizer state (no fp32
                   master either), and move no reduction bytes; where parameters
                   are sharded they are gathered as any unit, and zero1/zero2 do not
                   re-gather them after the step. Every gradient and optimizer term
                   above (and the offload landings) counts the trainable units only.
QLoRA (optional):
  --qlora=DIR      model.quantization_bit = 4 on the HF Llama directory DIR (its config.json) with
                   the LoRA adapter of DIR/adapter (adapter_config.json: r, target_modules): units
                   are the root (embedding, norm, lm_head; float32), the L blocks (norms float32,
                   every block linear 4-bit) and the L adapter units (lora_A (r, in), lora_B
                   (out, r) of each target); the root and the blocks are frozen. A 4-bit weight of
                   n values (R rows) in blocks of 64 takes, with double quantization (the default),
                   4 (offset) + 4 ceil(nb / 256) (nested absmax) + nb (absmax codes) + ceil(n / 2)
                   (packed codes) bytes, nb = ceil(n / 64); without it (--no-double-quant)
                   4 nb (absmax) + ceil(n / 2) bytes; held as whole floats rounded up to whole rows
                   (ceil(ceil(bytes / 4) / R) R), so zero3's gathers move those bytes: about 0.53 of
                   a float's 4 per value plus the row padding.
Tensor parallelism (optional):
  --tp=K --vocab=V  parallel.tensor_parallel_size = K (vocabulary V): every formula
                   above holds for a rank's tp slices (q/k/v, c_attn, gate/up, c_fc by
                   output, o, down, c_proj by input, the embedding and head by
                   vocabulary; norms, positions and row-parallel biases whole) over the
                   world / K data ranks; the tp group moves, per micro-step of N = B T
                   tokens (fp32, all-reduces): the embedding N C, two per block forward
                   (attention and MLP outputs) and two backward (their inputs' gradients),
                   the head's row maxima N and (sum, target logit) 2N, and its dL/dxf N C:
                   4 (N C (1 + 4 L + 1) + 3 N) bytes.
  --sp=K           parallel.sequence_parallel_size = K, Ulysses: a rank runs N = B T / K
                   tokens; the sp ranks are data ranks (the formulas above over world / tp
                   of them); the sp group moves, per micro-step, two all-to-alls a block
                   forward (qkv to heads, the output back) and two backward: 8 L N (S + Q)
                   bytes, S = (NH + 2 NKV) HD, Q = NH HD (KV heads at least K).
  --ring           with --sp: ring attention instead; the sp group's send-receives move
                   L (3 K - 2) N 2 NKV HD floats a micro-step (K - 1 K|V blocks forward,
                   K - 1 backward, K of their gradients).
  --tp-seq         with --tp: parallel.tp_sequence_parallel; the tp group reduce-scatters
                   4 N C (2 + 4 L) and all-gathers 4 N C (2 + 6 L) bytes a micro-step,
                   all-reduces the head's 12 N, and sums the norms' and positions'
                   gradients over tp once a step (ddp, zero1) or once a micro-step (zero2,
                   zero3: gradients reduced each micro-step).

Every run: the start record's traffic_estimate_bytes (the dry step's count, zt_memplan.h)
equals each step's measured bytes (rank 0's, every collective and message).
--traffic        that check alone (a pipeline, 1-bit Adam: meshes the formulas above do not
                 describe).
--freeze=K       with --traffic, optim.type = onebit_adam with freeze_step K: steps 1 .. K
                 measure traffic_estimate_warmup_bytes, the steps after traffic_estimate_bytes
                 except step K + 1 under zero1/zero2 (the first exchange also gathers m and v
                 whole, once: more than a steady step); without 1-bit Adam the two are equal."""
import json, sys

def quant4_floats(rows, cols, nested, B=64):
    """the floats a 4-bit (rows, cols) weight takes in its unit (see --qlora)"""
    n = rows * cols
    nb = -(-n // B)
    nbytes = (4 + 4 * -(-nb // 256) + nb if nested else 4 * nb) + -(-n // 2)
    return -(-(-(-nbytes // 4)) // rows) * rows


def qlora_units(d, nested):
    """units, frozen units and parameter count of the QLoRA model of directory d"""
    c = json.load(open(d + "/config.json"))
    a = json.load(open(d + "/adapter/adapter_config.json"))
    C, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    HD = c.get("head_dim") or C // c["num_attention_heads"]
    Q, KV, r = c["num_attention_heads"] * HD, c["num_key_value_heads"] * HD, a["r"]
    lin = {"q_proj": (Q, C), "k_proj": (KV, C), "v_proj": (KV, C), "o_proj": (C, Q), "gate_proj": (I, C),
           "up_proj": (I, C), "down_proj": (C, I)}  # nn.Linear (out, in)
    root = V * C + C + (0 if c.get("tie_word_embeddings") else V * C)
    block = 2 * C + sum(quant4_floats(o, i, nested) for o, i in lin.values())
    adapter = sum(r * i + o * r for m, (o, i) in lin.items() if m in a["target_modules"])
    units = [root] + [block] * L + [adapter] * L
    return units, set(range(L + 1)), sum(units)


def check_traffic(recs, freeze=None):
    """the start record's estimate against each step's measured bytes; returns the failures"""
    start = next(r for r in recs if r.get("start"))
    est, warm = start["traffic_estimate_bytes"], start["traffic_estimate_warmup_bytes"]
    bad = []
    if freeze is None and est != warm:
        bad.append(f"traffic estimate {est} != its warm-up's {warm} without 1-bit Adam")
    steps = [r for r in recs if "loss" in r and "comm" in r]
    for r in steps:
        got = sum(v["bytes"] for k, v in r["comm"].items() if k != "groups")
        k = r["step"]
        want = warm if freeze is not None and k <= freeze else est
        if freeze is not None and k == freeze + 1 and start["strategy"] != "ddp":
            if got <= want:
                bad.append(f"step {k}: the first compressed step moved {got:.0f} bytes, not more than a steady one's {want}")
            continue
        if got != want:
            groups = {g: v["bytes"] for g, v in r["comm"].get("groups", {}).items() if v["bytes"]}
            bad.append(f"step {k}: measured {got:.0f} bytes {groups}, the start record estimates {want}")
    if not steps:
        bad.append("no step records")
    return bad


def main(d, strategy, world, A, group=None, bf16=False, reduce_bf16=False, name16="bf16", offload=False,
         offload_param=False, llama=False, frozen=None, tp=1, vocab=257, B=2, T_seq=16, sp=1, ring=False,
         tp_seq=False, qlora=None, nested=True):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    start = next(r for r in recs if r.get("start"))
    summary = next(r for r in recs if r.get("summary"))
    steps = [r for r in recs if "loss" in r and "comm" in r]
    # model shape from the tiny config: read back the parameter count and recompute units
    L, C, V, T = 2, 32, vocab, 32
    k = tp  # a rank's share of every split dimension
    root = V // k * C + T * C + 2 * C
    block = 2 * C + (C * 3 * C + 3 * C) // k + (C * C // k + C) + 2 * C + (C * 4 * C + 4 * C) // k + (4 * C * C // k + C)
    psi_all = V * C + T * C + 2 * C + L * (2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) +
                                          (4 * C * C + C))
    if llama:
        # --llama: the tiny Llama of accounting.sh: 4 heads, 2 KV heads, head_dim 8,
        # MLP 48, untied head: embed + norm + lm_head; input norm, q/k/v, o, post norm,
        # gate + up, down
        Q, KV, I = 4 * 8, 2 * 8, 48
        root = V // k * C + C + V // k * C
        block = C + C * (Q + 2 * KV) // k + Q * C // k + C + 2 * I * C // k + I * C // k
        psi_all = 2 * V * C + C + L * (C + C * (Q + 2 * KV) + Q * C + C + 2 * I * C + I * C)
    units = [root] + [block] * L
    if qlora:
        units, frozen, psi_all = qlora_units(qlora, nested)
    psi = sum(units)
    assert start["parameters"] == psi_all, (start["parameters"], psi_all)
    world //= tp  # the strategies span the data ranks
    if frozen is None:
        frozen = set(start.get("frozen_units", []))
    tr = [u not in frozen for u in range(len(units))]
    psi_t = sum(u for u, t in zip(units, tr) if t)
    n = {"ddp": 1, "hybrid_shard": group, "hybrid_shard_zero2": group}.get(strategy, world)
    P = [-(-u // n) * n for u in units]
    S = [p // n for p in P]
    Pt = [p for p, t in zip(P, tr) if t]  # the trainable units'
    St = [x for x, t in zip(S, tr) if t]
    Sf = [x for x, t in zip(S, tr) if not t]
    F = 4                           # fp32 bytes: gradient accumulators
    Fp = 2 if bf16 else 4           # working parameters and their all-gathers
    Fg = 2 if reduce_bf16 else 4    # gradient reductions
    Fo = 12 if bf16 else 8          # (fp32 master +) Adam m, v
    exp = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0}
    if strategy == "ddp":
        exp["all_reduce"] = Fg * psi_t if world > 1 else 0
        mem = (Fp * psi, F * psi_t, Fo * psi_t)
    elif strategy == "zero1":
        exp["reduce_scatter"] = Fg * sum(Pt); exp["all_gather"] = Fp * sum(Pt)
        mem = (Fp * sum(P), F * sum(Pt) + F * sum(St), Fo * sum(St))
    elif strategy == "zero2":
        exp["reduce_scatter"] = A * Fg * sum(Pt); exp["all_gather"] = Fp * sum(Pt)
        mem = (Fp * sum(P), F * sum(St), Fo * sum(St))
    elif strategy == "shard_grad_op":
        exp["all_gather"] = A * Fp * sum(P); exp["reduce_scatter"] = A * Fg * sum(Pt)
        mem = (Fp * sum(S), F * sum(St), Fo * sum(St))
    else:  # zero3, hybrid_shard
        exp["all_gather"] = A * Fp * (P[0] + 2 * sum(P[1:]))
        exp["reduce_scatter"] = A * Fg * sum(Pt)
        if strategy.startswith("hybrid"):
            exp["all_reduce"] = Fg * sum(St)
        mem = (Fp * sum(S), F * sum(St), Fo * sum(St))
    if world == 1:  # one rank communicates nothing
        exp = {k: 0 for k in exp}
    host = 0
    if offload:
        mS = max(St, default=0)
        host = 12 * sum(St) + 8 * mS + (2 * mS if bf16 and not offload_param else 0)
        if strategy in ("zero2", "shard_grad_op", "zero3"):
            host += 4 * sum(St)
            mem = (mem[0], 0, mem[2])
        if offload_param:
            # a frozen shard is its parameters only, fp32 too (no master beside it)
            host += (2 * sum(St) if bf16 else 0) + Fp * sum(Sf)
            mem = (0, mem[1], 0)
        else:
            mem = (mem[0], mem[1], 0)
    bad = []
    N = B * T_seq // sp
    tp_bytes = 4 * A * (N * C * (1 + 4 * L + 1) + 3 * N) if tp > 1 else 0
    Sq, Qw = (4 * 8 + 2 * 2 * 8, 4 * 8) if llama else (3 * C, C)
    sp_bytes = 8 * A * L * N * (Sq // tp + Qw // tp) if sp > 1 else 0
    kw = 2 * 2 * 8 if llama else 2 * C  # 2 NKV HD of a K|V row
    if ring: sp_bytes = 4 * A * L * (3 * sp - 2) * N * kw // tp
    extra = {"all_reduce": tp_bytes, "reduce_scatter": 0, "all_gather": 0}
    if tp_seq:
        norms = (L * 2 * C + C) if llama else (L * 4 * C + 2 * C + T * C)  # and GPT-2's positions
        nsum = A if strategy in ("zero2", "zero3", "shard_grad_op") else 1
        extra = {"all_reduce": 4 * A * 3 * N + 4 * nsum * norms,
                 "reduce_scatter": 4 * A * N * C * (2 + 4 * L), "all_gather": 4 * A * N * C * (2 + 6 * L)}
        tp_bytes = sum(extra.values())
    for r in steps:
        for kind, v in exp.items():
            got = r["comm"][kind]["bytes"]
            # the tp group's activation collectives are counted with their kinds too
            want = v + extra[kind]
            if got != want:
                bad.append(f"step {r['step']}: {kind} moved {got:.0f} bytes, theory says {want}")
        if tp > 1:
            got = r["comm"]["groups"]["tp"]["bytes"]
            if got != tp_bytes:
                bad.append(f"step {r['step']}: the tp group moved {got:.0f} bytes, theory says {tp_bytes}")
        if sp > 1:
            got = r["comm"]["groups"]["sp"]["bytes"]
            kind = "send_recv" if ring else "all_to_all"
            if got != sp_bytes or r["comm"][kind]["bytes"] != sp_bytes:
                bad.append(f"step {r['step']}: the sp group moved {got:.0f} bytes, theory says {sp_bytes}")
    est, meas = start["memory_estimate"], summary["memory_measured"]
    for name, want in zip(("params", "grads", "optimizer"), mem):
        if est[name] != want: bad.append(f"estimate {name} {est[name]} != formula {want}")
        if meas[name] != want: bad.append(f"measured {name} {meas[name]} != formula {want}")
    # transient buffers: the estimate is the bound the pre-flight memory check trusts,
    # so the allocator's peak must not exceed it
    for name in ("buffers", "gathered"):
        if meas[name] > est[name]:
            bad.append(f"measured {name} peak {meas[name]} exceeds the estimate {est[name]}")
    # and it is a dry run of the same code (zt_memplan.h): rank 0's figures are what rank 0
    # allocated, transient peaks and activations included
    for name in est:
        if est[name] != meas.get(name):
            bad.append(f"estimate {name} {est[name]} != measured {meas.get(name)} (the dry run and the run disagree)")
    for src, m in (("estimate", est), ("measured", meas)):
        if m.get("host", 0) != host: bad.append(f"{src} host {m.get('host')} != formula {host}")
    if strategy in ("zero3", "hybrid_shard") and n > 1 and not offload:
        total, per = sum(mem), Fp + F + Fo  # 16 fp32, 18 bf16
        want = (Fp * psi + (F + Fo) * psi_t) / n  # frozen: Fp bytes per parameter only
        if abs(total - want) > per * len(units) * n:
            bad.append(f"zero3 model state {total} is not {Fp}*Psi/n + {F + Fo}*Psi_trainable/n = {want:.0f} up to padding")
    bad += check_traffic(recs)
    busbw_ok = all(r["comm"][k]["busbw_GBps"] >= 0 for r in steps for k in exp)
    if not busbw_ok: bad.append("negative busbw")
    dt = (" " + name16 if bf16 else "") + (" reduce-" + name16 if reduce_bf16 else "") + \
        (" offload" if offload else "") + (" offload-param" if offload_param else "") + \
        (" frozen " + ",".join(map(str, sorted(frozen))) if frozen else "")
    if tp > 1: dt += f" tp {tp} (tp group {tp_bytes} bytes)"
    if sp > 1: dt += f" sp {sp}{' ring' if ring else ''} (sp group {sp_bytes} bytes)"
    if tp_seq: dt += " tp_seq"
    if qlora: dt += " qlora" + ("" if nested else " (no double quantization)")
    print(f"{strategy:14s}{dt} world {world} A {A}: {len(steps)} steps checked, traffic {exp}, memory {mem}"
          f" host {host}: "
          + ("ok" if not bad else "FAIL"))
    for b in bad[:10]: print("   ", b)
    return 1 if bad else 0

if __name__ == "__main__":
    if "--traffic" in sys.argv[1:]:
        fz = [int(x[len("--freeze="):]) for x in sys.argv[1:] if x.startswith("--freeze=")]
        recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
        bad = check_traffic(recs, fz[0] if fz else None)
        n = sum(1 for r in recs if "loss" in r and "comm" in r)
        print(f"{sys.argv[1]}: traffic estimate against {n} steps: " + ("ok" if not bad else "FAIL"))
        for b in bad[:10]: print("   ", b)
        sys.exit(1 if bad else 0)
    frozen, tp, vocab, sp, qlora = None, 1, 257, 1, None
    for x in sys.argv[1:]:
        if x.startswith("--frozen="):
            frozen = {int(u) for u in x[len("--frozen="):].split(",") if u}
        if x.startswith("--tp="): tp = int(x[5:])
        if x.startswith("--vocab="): vocab = int(x[8:])
        if x.startswith("--sp="): sp = int(x[5:])
        if x.startswith("--qlora="): qlora = x[len("--qlora="):]
    flags = {x for x in sys.argv[1:]
             if x.startswith("--") and not x.startswith(("--frozen=", "--tp=", "--vocab=", "--sp=", "--qlora="))}
    unknown = flags - {"--bf16", "--reduce-bf16", "--fp16", "--reduce-fp16", "--offload", "--offload-param", "--llama",
                       "--ring", "--tp-seq", "--no-double-quant"}
    if unknown: sys.exit(f"check_accounting.py: unknown option {sorted(unknown)[0]}")
    a = [x for x in sys.argv[1:] if not x.startswith("--")]
    sys.exit(main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]) if len(a) > 4 else None,
                  bool(flags & {"--bf16", "--fp16"}), bool(flags & {"--reduce-bf16", "--reduce-fp16"}),
                  "fp16" if flags & {"--fp16", "--reduce-fp16"} else "bf16",
                  "--offload" in flags, "--offload-param" in flags, "--llama" in flags, frozen, tp, vocab, sp=sp,
                  ring="--ring" in flags, tp_seq="--tp-seq" in flags, qlora=qlora,
                  nested="--no-double-quant" not in flags))
