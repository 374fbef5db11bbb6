#!/bin/sh
# qlora_bf16.sh — QLoRA with train.bf16 (bitsandbytes' compute dtype bfloat16, LLaMA-Factory's
# default on GPUs): the frozen units are a bf16 working copy holding the 4-bit form a byte an
# element (its value 0..255, exact in bf16), each weight is dequantized to bf16 values
# (bitsandbytes' dequantize_4bit to bfloat16) and runs the GEMM path of a bf16 run.
#  1. On tests/reference/hf/qlora-llama-tp with its adapter, 10 steps: zero3 at 2 ranks trains
#     what one rank trains (1e-5), from the full-precision directory and from the same base saved
#     4-bit by bitsandbytes; tp 2 within bf16.sh's mesh tolerance (5e-5 loss, 3e-5 adapters: a
#     bf16 adapter whose master crosses a rounding boundary under another summation order; LoRA
#     in bf16 on the float32 base shows the same at tp 2); with ZT_DNNL=force (oneDNN's bf16
#     GEMMs, operands rounded to bf16, as on a CPU with bf16 units) zero3 at 2 ranks is one rank.
#  2. bf16 is not fp32: the same run with train.bf16 = false trains other adapters, and the
#     first step's loss agrees to 1e-3.
#  3. fp16 compute is refused on every rank.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
cd "$ZT_TMP" || fail "cd"
lora_setup
base="lora.adapter_name_or_path=$HF/qlora-llama-tp/adapter model.quantization_bit=4 optim.learning_rate=1e-2 \
train.max_steps=10 train.per_device_train_batch_size=1 checkpoint.save_hf=false"
fp="model.name_or_path=$HF/qlora-llama-tp"
bf="train.bf16=true"

# ---- 1. meshes against one rank ----------------------------------------------------------------
# section 2's fp32 run beside the bf16 one (one core each); $ZT_OUT is then b1's output
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $fp $base train.gradient_accumulation_steps=4 train.output_dir=f1
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $fp $base $bf train.gradient_accumulation_steps=4 train.output_dir=b1
ztrain_wait >/dev/null
assert_contains "$ZT_OUT" "294912 values in 154112 bf16 elements, a byte each (1.05 bytes a value), dequantized to bf16 before each GEMM"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $fp $base $bf train.gradient_accumulation_steps=2 parallel.strategy=zero3 \
    train.output_dir=b2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg model.name_or_path="$HF/qlora-llama-tp-bnb" $base $bf train.gradient_accumulation_steps=2 \
    parallel.strategy=zero3 train.output_dir=b2bnb >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" b1 b2 b2bnb || fail "bf16 QLoRA under zero3 trained otherwise than one rank"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $fp $base $bf train.gradient_accumulation_steps=4 parallel.tensor_parallel_size=2 \
    train.output_dir=btp >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" b1 btp --loss-tol 5e-5 --param-tol 3e-5 ||
    fail "bf16 QLoRA at tp 2 trained otherwise than one rank"
export ZT_DNNL=force ZT_MPIRUN_ARGS="-x ZT_DNNL"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $fp $base $bf train.gradient_accumulation_steps=4 train.output_dir=d1 >/dev/null
# forced where the processor has no bf16 units; where it has them, they run (either way oneDNN)
assert_contains "$ZT_OUT" "GEMMs bf16 (oneDNN"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $fp $base $bf train.gradient_accumulation_steps=2 parallel.strategy=zero3 \
    train.output_dir=d2 >/dev/null
unset ZT_DNNL ZT_MPIRUN_ARGS
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" d1 d2 || fail "bf16 QLoRA on oneDNN's bf16 GEMMs: zero3 trained otherwise"

# ---- 2. bf16 against fp32 (f1: above) -----------------------------------------------------------
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" f1 b1 >/dev/null && fail "bf16 QLoRA trained what fp32 QLoRA trains"
"$PY" - f1 b1 <<'PYEOF' || fail "bf16 QLoRA's first loss is not within 1e-3 of fp32's"
import json, sys
f, b = ([json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"loss"' in l] for d in sys.argv[1:])
rel = abs(f[0] - b[0]) / abs(f[0])
print(f"first loss: fp32 {f[0]:.6f}, bf16 {b[0]:.6f} (rel {rel:.2e}); after 10 steps {f[-1]:.5f} / {b[-1]:.5f}")
sys.exit(0 if rel < 1e-3 else 1)
PYEOF

# ---- 3. fp16 --------------------------------------------------------------------------------------
# shellcheck disable=SC2086
every_rank_exits 2 1 "on fp16 compute with a 4-bit base" lora.cfg $fp $base train.fp16=true train.output_dir=h
assert_contains "$ZT_OUT" "model.quantization_bit = 4 computes in float32 or bf16"
echo "qlora_bf16.sh: ok"
