#!/bin/sh
# qlora_bnb.sh — QLoRA from a pre-quantized directory (transformers + bitsandbytes' 4-bit
# save_pretrained: tests/reference/hf/qlora-<family>-bnb, make_bnb_dir_fixtures.py) as a run does it.
#  1. Its config.json's quantization_config makes the run QLoRA; its bytes are read as they are:
#     training from it equals training from the full-precision directory quantized at load, bit
#     for bit (nf4 with double quantization, and fp4 without).
#  2. Every strategy and layout at 2-4 ranks (zero3 and offload included) trains what one rank
#     trains (1e-5).
#  3. Exports at learning rate 0: <output_dir>/adapter is PEFT's adapter bit for bit;
#     <output_dir>/hf is the adapters merged into the dequantized base (PEFT's delta on
#     bitsandbytes' dequantize_4bit, 1e-6), a full-precision directory without
#     quantization_config, in checkpoint.hf_dtype (bf16 too); zt-ckpt export --merge of a QLoRA
#     checkpoint writes the same.
#  4. Bad input fails on every rank with one line naming the file, tensor or key: a corrupted
#     quant_state JSON, an absmax one short, a quant_map that is not bitsandbytes', 8-bit
#     bitsandbytes, GPTQ, AWQ and fp8 quantization_configs, a NaN or an infinity in a weight
#     quantized at load, keys of the input that disagree with the directory, a 4-bit base without
#     LoRA.
# (tests/mpi/qlora_peft.sh loads these exports in PEFT, bitsandbytes and transformers themselves.)
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
cd "$ZT_TMP" || fail "cd"
lora_setup
train="optim.learning_rate=1e-2 train.max_steps=6 checkpoint.save_hf=false"

# ---- 1. the directory's bytes are those of a quantization at load ---------------------------
for fam in llama qwen3; do
    # shellcheck disable=SC2086
    run_ztrain 1 lora.cfg model.name_or_path="$HF/qlora-$fam-bnb" lora.adapter_name_or_path="$HF/qlora-$fam/adapter" \
        $train train.output_dir="bnb-$fam" >/dev/null
    assert_contains "$ZT_OUT" "qlora: 14 block linears read 4-bit from the directory in"
    # shellcheck disable=SC2086
    run_ztrain 1 lora.cfg model.name_or_path="$HF/qlora-$fam" lora.adapter_name_or_path="$HF/qlora-$fam/adapter" \
        model.quantization_bit=4 model.quantization_type="$([ $fam = llama ] && echo nf4 || echo fp4)" \
        model.double_quantization="$([ $fam = llama ] && echo true || echo false)" $train train.output_dir="q4-$fam" \
        >/dev/null
    assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to"
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "q4-$fam" "bnb-$fam" --loss-tol 0 --param-tol 0 ||
        fail "$fam: training from the 4-bit directory differs from training from its full-precision base"
done
assert_contains "$ZT_OUT" "fp4 (blocks of 64)"

# ---- 2. every strategy trains what one rank trains --------------------------------------------
base="model.name_or_path=$HF/qlora-llama-bnb lora.adapter_name_or_path=$HF/qlora-llama/adapter"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=ref >/dev/null
# shellcheck disable=SC2086
layout_runs "2 ddp flat 2" "2 zero2 flat 2" "2 zero3 flat 2" "4 zero3 per_param 1" \
    "4 hybrid_shard flat 1 parallel.shard_group_size=2" \
    "2 zero3 flat 2 parallel.offload_param=cpu parallel.offload_optimizer=cpu" -- lora.cfg $base $train
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $LAYOUT_RUNS || fail "a layout trained other adapters than one rank"

# ---- 3. exports --------------------------------------------------------------------------------
for c in "llama 2 zero3 flat" "qwen3 4 zero3 per_param" "qwen3 2 ddp flat"; do
    set -- $c
    run_ztrain "$2" lora.cfg model.name_or_path="$HF/qlora-$1-bnb" lora.adapter_name_or_path="$HF/qlora-$1/adapter" \
        parallel.strategy="$3" parallel.shard_layout="$4" train.output_dir="rt-$1-$2" >/dev/null
    assert_contains "$ZT_OUT" "HF export: rt-$1-$2/hf ("
    "$PY" "$HFPY" same "rt-$1-$2/adapter" "$HF/qlora-$1/adapter" || fail "$1: the adapter written is not PEFT's"
    "$PY" "$HFPY" close "rt-$1-$2/hf" "$HF/qlora-$1-bnb/merged" 1e-6 ||
        fail "$1: the merged export is not bitsandbytes' dequantization plus PEFT's delta"
    "$PY" -c "import json,sys; c=json.load(open('rt-$1-$2/hf/config.json')); sys.exit('quantization_config' in c)" ||
        fail "$1: the merged export's config.json has a quantization_config"
    "$PY" -c "import json,sys; c=json.load(open('rt-$1-$2/adapter/adapter_config.json')); \
sys.exit(c['base_model_name_or_path'] != '$HF/qlora-$1-bnb')" || fail "$1: the adapter does not name its 4-bit base"
done
# zt-ckpt's merged export of a QLoRA checkpoint: the same merge, the base read from the directory again
"$ZT_CKPT" export rt-llama-2/ckpt-00000002.h5 ck-merged --merge >/dev/null || fail "zt-ckpt export --merge failed"
"$PY" "$HFPY" close ck-merged "$HF/qlora-llama-bnb/merged" 1e-6 || fail "zt-ckpt's merged QLoRA export is not the merge"
run_ztrain 2 lora.cfg $base parallel.strategy=zero3 checkpoint.hf_dtype=bf16 train.output_dir=rt-bf16 >/dev/null
"$PY" -c "import json,struct,sys; f=open('rt-bf16/hf/model.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; \
h=json.loads(f.read(n)); sys.exit(h['model.layers.0.mlp.down_proj.weight']['dtype'] != 'BF16')" ||
    fail "checkpoint.hf_dtype = bf16: the merged 4-bit weights are not written in bf16"
"$PY" "$HFPY" close rt-bf16/hf "$HF/qlora-llama-bnb/merged" 1e-2 || fail "the bf16 merged export is not the merge"

# ---- 4. bad input --------------------------------------------------------------------------------
bad() { # KIND SOURCE: a broken copy bad-KIND of tests/reference/hf/SOURCE
    "$PY" "$HFPY" bad "$1" "$HF/$2" "bad-$1" >/dev/null || fail "cannot make bad-$1"
}
bad qs-json qlora-llama-bnb
expect_fail_with 2 "bad-qs-json/model.safetensors: model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4: quant_state is not valid JSON" \
    lora.cfg model.name_or_path=bad-qs-json parallel.strategy=zero3 train.output_dir=b
bad absmax-len qlora-llama-bnb
expect_fail_with 2 "bad-absmax-len/model.safetensors: tensor model.layers.0.mlp.down_proj.weight.absmax has 127 elements, the quant_state of model.layers.0.mlp.down_proj.weight needs 128" \
    lora.cfg model.name_or_path=bad-absmax-len train.output_dir=b
bad absmax-len qlora-qwen3-bnb
expect_fail_with 2 "tensor model.layers.0.mlp.down_proj.weight.absmax has 127 elements" \
    lora.cfg model.name_or_path=bad-absmax-len train.output_dir=b
bad quant-map qlora-llama-bnb
expect_fail_with 2 "bad-quant-map/model.safetensors: tensor model.layers.0.mlp.down_proj.weight.quant_map: value 3 is" \
    lora.cfg model.name_or_path=bad-quant-map train.output_dir=b
bad bnb-8bit qlora-llama-bnb
expect_fail_with 2 "bad-bnb-8bit/config.json: quantization_config.load_in_8bit: 8-bit (LLM.int8) models are not supported" \
    lora.cfg model.name_or_path=bad-bnb-8bit train.output_dir=b
for q in gptq awq fp8; do
    bad $q qlora-llama-bnb
    expect_fail_with 2 "bad-$q/config.json: quantization_config.quant_method = '$q' is not supported" \
        lora.cfg model.name_or_path=bad-$q train.output_dir=b
done
for v in nan inf; do
    bad $v qlora-llama
    expect_fail_with 2 "bad-$v/model.safetensors: model.layers.0.mlp.down_proj.weight: element 77 is $v" \
        lora.cfg model.name_or_path=bad-$v model.quantization_bit=4 parallel.strategy=zero3 train.output_dir=b
done
expect_fail_with 2 "model.quantization_type = \"fp4\" in the input disagrees with $HF/qlora-llama-bnb/config.json, which gives \"nf4\"" \
    lora.cfg $base model.quantization_type=fp4 train.output_dir=b
expect_fail_with 2 "model.quantization_bit = 0 in the input disagrees with $HF/qlora-llama-bnb/config.json, which gives 4" \
    lora.cfg $base model.quantization_bit=0 train.output_dir=b
expect_fail_with 2 "$HF/qlora-llama-bnb/config.json: its quantization_config makes the base 4-bit: model.quantization_bit = 4 needs train.finetuning_type = lora" \
    lora.cfg model.name_or_path="$HF/qlora-llama-bnb" train.finetuning_type=full train.output_dir=b
echo "qlora_bnb.sh: ok"
