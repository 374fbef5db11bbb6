#!/bin/sh
# qlora.sh — QLoRA (model.quantization_bit = 4) as a run does it: the full-precision directory
# tests/reference/hf/qlora-llama quantized at load (nf4, double quantization), its PEFT adapter
# trained on top.
#  1. Every strategy and layout at 2-4 ranks (the 4-bit form sharded, gathered and offloaded
#     by the engine as any frozen tensor) trains the same adapters as one rank with accumulation
#     (1e-5), and other adapters than LoRA on the float32 base; the units hold the 4-bit form
#     (the parameter count of the log); the adapter is exported as PEFT's directory.
#     Ulysses and ring sequence parallelism and LoRA dropout train what one rank trains.
#  2. A QLoRA checkpoint written by zero3 at 2 ranks, or at sp 2, resumes at 1 rank as one run.
#  3. Traffic and memory per step equal check_accounting.py's formulas for the 4-bit base
#     (--qlora: packed codes plus absmax or its double-quantized form, computed there from the
#     directory's shapes): zero3 gathers those bytes, not floats.
#  4. Refused on every rank with its reason: a 4-bit base without LoRA (tensor parallelism:
#     qlora_tp.sh; bf16 and fp16 compute: qlora_bf16.sh).
#  5. Pipelines: a pipeline rank loads, quantizes and holds only its stages' 4-bit linears. At
#     pp 2 and pp 2 x dp 2 (zero3), from the full-precision directory and from the bitsandbytes
#     one, the losses and the adapters are one rank's (1e-5); the weights read over the ranks at
#     pp 2 are one rank's bytes (no rank reads another stage's weight); each pipeline rank's
#     measured memory equals its row of --estimate-memory and its run-time estimate, and holds
#     half of one rank's 4-bit bytes (the measured parameters less the stage's float32
#     tensors, counted from the directories' headers); adapter/ and the merged hf/ written at pp 2
#     and at pp 2 x dp 2 equal one rank's.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
cd "$ZT_TMP" || fail "cd"
lora_setup
base="model.name_or_path=$HF/qlora-llama lora.adapter_name_or_path=$HF/qlora-llama/adapter checkpoint.save_hf=false"
q4="model.quantization_bit=4"
train="optim.learning_rate=1e-2 train.max_steps=6"

# ---- 1. every strategy trains the same adapters ----------------------------------------------
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $base $q4 $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=ref
ref_out=$ZT_BG_OUT
# beside it (one core each), the one-rank run of the dropout case below
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $base $q4 $train lora.dropout=0.1 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=4 train.output_dir=drop1
ztrain_wait >/dev/null
cp "$ref_out" "$ZT_OUT" || fail "cp"
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4 (double quantization, blocks of 64): 73728 values in 10240 floats (0.56 bytes a value)"
assert_contains "$ZT_OUT" "lora: adapters of $HF/qlora-llama/adapter loaded"
assert_contains "$ZT_OUT" "PEFT export: ref/adapter (LoRA r=4, scale 2"
q4floats=$(sed -n 's/^.*model: llama .*, \([0-9]*\) parameters in .*$/\1/p' "$ZT_OUT" | head -1)
runs=""
for cfg in "2 ddp flat 2" "4 ddp flat 1" "2 zero2 flat 2" "4 zero3 per_param 1" "2 zero3 flat 2" \
    "4 hybrid_shard flat 1 parallel.shard_group_size=2" \
    "2 zero3 flat 2 parallel.offload_param=cpu parallel.offload_optimizer=cpu"; do
    set -- $cfg
    np=$1 st=$2 layout=$3 A=$4
    shift 4
    out="np$np-$st-$layout$(echo "$*" | tr -cd 'a-z0-9')"
    # shellcheck disable=SC2086
    run_ztrain "$np" lora.cfg $base $q4 $train parallel.strategy=$st parallel.shard_layout=$layout \
        train.per_device_train_batch_size=$((4 / np / A)) train.gradient_accumulation_steps=$A \
        train.output_dir="$out" "$@" >/dev/null
    runs="$runs $out"
done
# sequence parallelism with the 4-bit base: Ulysses under ddp, ring under zero3 (2 ranks, one
# sequence's halves), the same micro-steps as one rank
for cfg in "spu parallel.sequence_parallel_size=2" \
    "spr parallel.sequence_parallel_size=2 parallel.sp_mode=ring parallel.strategy=zero3"; do
    set -- $cfg
    out=$1
    shift
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $base $q4 $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
        train.output_dir="$out" "$@" >/dev/null
    runs="$runs $out"
done
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $runs || fail "a layout or mesh trained other adapters than one rank"
# LoRA dropout on the 4-bit base: zero3 at 2 ranks drops what one rank drops (and dropout 0.1
# trains other adapters than none); drop1: above
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $base $q4 $train lora.dropout=0.1 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=2 parallel.strategy=zero3 train.output_dir=drop2 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" drop1 drop2 || fail "lora.dropout on the 4-bit base: zero3 dropped otherwise"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref drop1 >/dev/null && fail "lora.dropout 0.1 trained as dropout 0"
# the 4-bit base is what the adapters were trained on: LoRA on the float32 base trains others
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=f32 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref f32 >/dev/null && fail "the 4-bit base trained what the float32 base trains"
# the units hold the 4-bit form: the 14 linears' 73728 values (2 blocks of q 64x64, k and v 32x64,
# o 64x64, gate, up 128x64, down 64x128) take 10240 floats (about 0.56 bytes a value with the
# double-quantized scales, rounded up to whole rows)
f32floats=$(sed -n 's/^.*model: llama .*, \([0-9]*\) parameters in .*$/\1/p' "$ZT_OUT" | head -1)
[ -n "$q4floats" ] && [ -n "$f32floats" ] || fail "no parameter count in the model line"
[ $((f32floats - q4floats)) -eq $((73728 - 10240)) ] ||
    fail "the 4-bit base takes $((f32floats - q4floats)) floats less than the float32 one, not $((73728 - 10240))"

# ---- 2. a QLoRA checkpoint (the adapters; the base quantized again from the directory) resumes
# across world sizes: 3 steps under zero3 at 2 ranks, then 6 at 1 rank, as 6 at once (a constant
# schedule, so that 3 steps are the first half of 6)
const="optim.lr_scheduler_type=constant_with_warmup train.per_device_train_batch_size=2"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $q4 $train $const train.output_dir=full >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $base $q4 $train $const train.per_device_train_batch_size=1 train.max_steps=3 \
    parallel.strategy=zero3 train.output_dir=split >/dev/null
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $q4 $train $const checkpoint.resume=auto train.output_dir=split >/dev/null
assert_contains "$ZT_OUT" "resumed from split/ckpt-00000003"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" full split || fail "a QLoRA checkpoint resumed otherwise than 6 steps at once"
# and from a mesh with sequence parallelism (Ulysses, sp 2) to one rank
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $base $q4 $train $const train.max_steps=3 parallel.sequence_parallel_size=2 \
    train.output_dir=splitsp >/dev/null
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $q4 $train $const checkpoint.resume=auto train.output_dir=splitsp >/dev/null
assert_contains "$ZT_OUT" "resumed from splitsp/ckpt-00000003"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" full splitsp || fail "a QLoRA checkpoint of sp 2 resumed otherwise at one rank"

# ---- 3. accounting: the bytes each collective moves per step and each rank's model state -----
acc() { # NP STRATEGY [FLAGS] [key=value...]
    np=$1 st=$2 fl=${3:-}
    shift 2
    [ $# -gt 0 ] && shift
    out="acc-$np-$st$(echo "$fl" | tr -cd 'a-z')"
    # shellcheck disable=SC2086
    run_ztrain "$np" lora.cfg $base $q4 parallel.strategy=$st train.gradient_accumulation_steps=2 \
        train.per_device_train_batch_size=1 train.max_steps=2 checkpoint.save_at_end=false train.output_dir="$out" \
        "$@" >/dev/null
    # shellcheck disable=SC2086
    "$PY" "$ZT_SRCDIR/tests/mpi/check_accounting.py" "$out" "$st" "$np" 2 $fl --qlora="$HF/qlora-llama" ||
        fail "$st at $np ranks with a 4-bit base: traffic or memory differs from the 4-bit formula"
}
for st in ddp zero1 zero2 shard_grad_op zero3; do acc 2 "$st"; done
acc 3 zero3
acc 2 zero3 --no-double-quant model.double_quantization=false
# the formula is exact: the double-quantized run is not the one with float32 absmax
"$PY" "$ZT_SRCDIR/tests/mpi/check_accounting.py" acc-2-zero3 zero3 2 2 --no-double-quant --qlora="$HF/qlora-llama" \
    >/dev/null && fail "check_accounting.py took double-quantized scales for float32 absmax"

# ---- 4. refusals ------------------------------------------------------------------------------
# shellcheck disable=SC2086
expect_fail_with 2 "model.quantization_bit = 4 needs train.finetuning_type = lora" lora.cfg $base $q4 \
    train.finetuning_type=full train.output_dir=full

# ---- 5. pipelines -----------------------------------------------------------------------------
pp2="parallel.pipeline_parallel_size=2"
read_bytes() { sed -n 's/^model: weights of .* loaded (\(.*\) read by .*$/\1/p' "$ZT_OUT"; }
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $q4 $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.max_steps=1 train.output_dir=read1 >/dev/null
one=$(read_bytes)
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $base $q4 $train $pp2 train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=pp2 >/dev/null
[ -n "$one" ] && [ "$(read_bytes)" = "$one" ] ||
    fail "pp 2 read $(read_bytes) of the directory over its ranks, one rank $one: a rank read another stage's weights"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $base $q4 $train $pp2 parallel.strategy=zero3 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=2 train.output_dir=pp2z3 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref pp2 pp2z3 || fail "QLoRA under a pipeline trained other adapters"
# the bitsandbytes directory, with the exports
bnb="model.name_or_path=$HF/qlora-llama-bnb lora.adapter_name_or_path=$HF/qlora-llama/adapter checkpoint.save_hf=true"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $bnb $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=bnb-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $bnb $train $pp2 train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=bnb-pp2 >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears read 4-bit from the directory"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $bnb $train $pp2 parallel.strategy=zero3 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=2 train.output_dir=bnb-pp2z3 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" bnb-ref bnb-pp2 bnb-pp2z3 ||
    fail "QLoRA from the bitsandbytes directory under a pipeline trained other adapters"
for d in bnb-pp2 bnb-pp2z3; do
    for x in adapter hf; do
        "$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" close "$d/$x" "bnb-ref/$x" 1e-5 || fail "$d/$x is not one rank's"
    done
done
# each pipeline rank's memory: --estimate-memory's row, the run's estimate, and half the 4-bit bytes
for d in pp2 bnb-pp2z3; do
    st=ddp np=2
    [ "$d" = bnb-pp2z3 ] && st=zero3 np=4
    # shellcheck disable=SC2086
    "$ZTRAIN" --estimate-memory --ranks $np lora.cfg $base $q4 $pp2 parallel.strategy=$st \
        train.per_device_train_batch_size=1 train.gradient_accumulation_steps=$((8 / np)) >"$d.est" 2>&1 ||
        fail "--estimate-memory at pp 2 ($st) failed"
done
"$PY" - "$HF/qlora-llama" <<'PYEOF' || fail "a pipeline rank's memory is not its estimate, or not its stages' 4-bit base"
import json, re, struct, sys
def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
def size(v):
    n = 1
    for d in v["shape"]:
        n *= d
    return n
def records(d):
    return sorted((json.loads(l) for l in open(d + "/metrics.jsonl") if '"pp_rank"' in l), key=lambda r: r["pp_rank"])
def total(m):
    return m["params"] + m["grads"] + m["optimizer"] + m["buffers"] + m["gathered"] + m["activations"]
for d in ("pp2", "bnb-pp2z3"):
    rows = [int(m.group(1)) for m in re.finditer(r"^\d+ +\d+-\d+ .*\((\d+) bytes\)$", open(d + ".est").read(), re.M)]
    recs = records(d)
    assert len(recs) == 2 and rows == [total(r["memory_measured"]) for r in recs], (d, rows, recs)
    assert all(r["memory_estimate"] == r["memory_measured"] for r in recs), (d, recs)
    print(d, "each pipeline rank's --estimate-memory row = its estimate = its measurement:", rows)
# the float32 tensors of each stage (pp 2 of 2 blocks: the embedding and block 0 | block 1 and
# the head): the directory's and the adapters' tensors that are not a block's linear
floats = [0, 0]
tensors = list(header(sys.argv[1] + "/model.safetensors").items())
tensors += list(header(sys.argv[1] + "/adapter/adapter_model.safetensors").items())
for k, v in tensors:
    m = re.search(r"layers\.(\d+)\.", k)
    if m and "lora_" not in k and re.search(r"_proj\.weight$", k):
        continue  # a 4-bit linear
    floats[0 if "embed_tokens" in k else (1 + int(m.group(1))) // 2 if m else 1] += size(v)
one = [json.loads(l) for l in open("ref/metrics.jsonl") if '"summary"' in l][0]["memory_measured"]["params"]
q4 = one - 4 * sum(floats)
per = [r["memory_measured"]["params"] - 4 * f for r, f in zip(records("pp2"), floats)]
print("4-bit bytes: one rank", q4, "pipeline ranks", per)
assert q4 > 0 and sum(per) == q4 and all(abs(b - q4 / 2) <= 0.05 * q4 for b in per), (q4, per)
PYEOF
echo "qlora.sh: pipelines hold their stages' 4-bit base and train what one rank trains"
echo "qlora.sh: ok"
