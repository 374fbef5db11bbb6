#!/bin/sh
# qlora.sh — QLoRA (model.quantization_bit = 4) as a run does it: the full-precision directory
# tests/reference/hf/qlora-llama quantized at load (nf4, double quantization), its PEFT adapter
# trained on top.
#  1. Every strategy and layout at 2-4 ranks (the 4-bit region sharded, gathered and offloaded
#     by the engine as any frozen tensor) trains the same adapters as one rank with accumulation
#     (1e-5), and other adapters than LoRA on the float32 base; the adapter is exported as
#     PEFT's directory.
#  2. Refused on every rank with its reason: tensor parallelism, a 4-bit base without LoRA,
#     bf16 compute, the merged export.
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
run_ztrain 1 lora.cfg $base $q4 $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=ref >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4 (double quantization, blocks of 64)"
assert_contains "$ZT_OUT" "lora: adapters of $HF/qlora-llama/adapter loaded"
assert_contains "$ZT_OUT" "PEFT export: ref/adapter (LoRA r=4, scale 2"
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
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $runs || fail "a layout trained other adapters than one rank"
# the 4-bit base is what the adapters were trained on: LoRA on the float32 base trains others
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=f32 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref f32 >/dev/null && fail "the 4-bit base trained what the float32 base trains"

# ---- 2. refusals ------------------------------------------------------------------------------
# shellcheck disable=SC2086
expect_fail_with 2 "model.quantization_bit = 4 runs without tensor parallelism (parallel.tensor_parallel_size = 2)" lora.cfg $base $q4 \
    parallel.tensor_parallel_size=2 train.output_dir=tp
# shellcheck disable=SC2086
expect_fail_with 2 "model.quantization_bit = 4 needs train.finetuning_type = lora" lora.cfg $base $q4 \
    train.finetuning_type=full train.output_dir=full
# shellcheck disable=SC2086
expect_fail_with 2 "model.quantization_bit = 4 computes in float32" lora.cfg $base $q4 train.bf16=true train.output_dir=bf
# shellcheck disable=SC2086
expect_fail_with 2 "checkpoint.save_hf (a merged model) is not available" lora.cfg $base $q4 checkpoint.save_hf=true \
    train.output_dir=hf
echo "qlora.sh: ok"
