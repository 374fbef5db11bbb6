#!/bin/sh
# qlora_tp.sh — tensor parallelism over a 4-bit base (model.quantization_bit = 4): each tp rank
# holds its split's share of every block linear's 4-bit blocks (packed bytes and scales, the
# nested scales its blocks need), cut at block boundaries (zt_qlora.h).
#  1. tests/reference/hf/qlora-llama-tp (hidden 128: every split keeps whole blocks of 64) with its
#     PEFT adapter, 10 steps: tp 2, tp 2 x dp 2 (zero3), tp 2 with tp_sequence_parallel, and tp 2
#     from the same base saved 4-bit by transformers + bitsandbytes (qlora-llama-tp-bnb), and pp 2
#     x tp 2 train the adapters one rank trains (1e-5); so do tp 2 x dp 2 without double
#     quantization and fp4.
#  2. The merged export (hf/) written at tp 2 holds the tensors one rank writes.
#  3. qlora-llama-bnb (hidden 64) at tp 2 would cut o_proj's rows into 32 input columns, half a
#     block: refused on every rank, naming the tensor and the tp sizes that keep blocks whole.
#  4. ztrain --generate on a 4-bit base (a Llama of hidden 128 with the qwen tokenizer, written
#     by ztrain as an HF directory, quantized at load): greedy output under zero3 at 2 ranks, tp 2
#     (with the KV cache), tp 2 with tp_sequence_parallel and pp 2 (through the stages) is one
#     rank's, byte for byte, and not the full-precision base's.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
cd "$ZT_TMP" || fail "cd"
lora_setup
base="lora.adapter_name_or_path=$HF/qlora-llama-tp/adapter model.quantization_bit=4 optim.learning_rate=1e-2 \
train.max_steps=10 train.per_device_train_batch_size=1"
fp="model.name_or_path=$HF/qlora-llama-tp"

# ---- 1. tp meshes against one rank ------------------------------------------------------------
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $fp $base train.gradient_accumulation_steps=4 train.output_dir=ref >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $fp $base train.gradient_accumulation_steps=4 parallel.tensor_parallel_size=2 \
    train.output_dir=tp2 >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $fp $base train.gradient_accumulation_steps=2 parallel.tensor_parallel_size=2 \
    parallel.strategy=zero3 checkpoint.save_hf=false train.output_dir=tp2dp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $fp $base train.gradient_accumulation_steps=4 parallel.tensor_parallel_size=2 \
    parallel.tp_sequence_parallel=true checkpoint.save_hf=false train.output_dir=tpseq >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg model.name_or_path="$HF/qlora-llama-tp-bnb" $base train.gradient_accumulation_steps=4 \
    parallel.tensor_parallel_size=2 checkpoint.save_hf=false train.output_dir=tpbnb >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears read 4-bit from the directory in nf4"
# pp 2 x tp 2: each tp rank of a pipeline rank quantizes its stages' shares (absmax over the
# data, then the tp ranks of that pipeline rank)
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $fp $base train.gradient_accumulation_steps=4 parallel.tensor_parallel_size=2 \
    parallel.pipeline_parallel_size=2 checkpoint.save_hf=false train.output_dir=pptp >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref tp2 tp2dp2 tpseq tpbnb pptp ||
    fail "a tp mesh over the 4-bit base trained other adapters than one rank"
for q in "model.double_quantization=false" "model.quantization_type=fp4"; do
    out=$(echo "$q" | tr -cd 'a-z0-9')
    # shellcheck disable=SC2086
    run_ztrain 1 lora.cfg $fp $base $q train.gradient_accumulation_steps=4 checkpoint.save_hf=false \
        train.output_dir="r1$out" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 lora.cfg $fp $base $q train.gradient_accumulation_steps=2 parallel.tensor_parallel_size=2 \
        checkpoint.save_hf=false train.output_dir="r4$out" >/dev/null
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "r1$out" "r4$out" || fail "tp 2 x dp 2 with $q trained otherwise"
done

# ---- 2. the merged export at tp 2 --------------------------------------------------------------
"$PY" - ref/hf tp2/hf <<'PYEOF' || fail "the merged export at tp 2 differs from one rank's"
import json, struct, sys
import numpy as np
def tensors(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
worst = max(float(np.max(np.abs(a[k] - b[k])) / max(1e-30, float(np.max(np.abs(a[k]))))) for k in a)
print(f"hf/ at tp 2 against one rank: {len(a)} tensors, worst relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
PYEOF

# ---- 3. a split that would cut a block ----------------------------------------------------------
# shellcheck disable=SC2086
every_rank_exits 2 1 "on a tp split that cuts 4-bit blocks" lora.cfg model.name_or_path="$HF/qlora-llama-bnb" \
    model.quantization_bit=4 parallel.tensor_parallel_size=2 train.output_dir=cut
assert_contains "$ZT_OUT" "model.quantization_bit = 4 with parallel.tensor_parallel_size = 2: model.layers.0.self_attn.o_proj.weight (64, 64) is cut into 32 input columns of each row, not whole 4-bit blocks of 64; tensor_parallel_size 1 keeps them whole"

# ---- 4. generation on a 4-bit base -------------------------------------------------------------
cat >prompts.jsonl <<'JSON'
{"messages": [{"role": "user", "content": "What is the rank of a shard?"}]}
{"instruction": "Translate to French", "input": "the model"}
{"instruction": "Name a colour"}
JSON
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens tok3520.h5 3520 20000 || fail "cannot make the token file"
G="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=128
  model.intermediate_size=256 model.vocab_size=3520 model.block_size=64 data.seq_len=48
  data.tokenizer=$ZT_SRCDIR/tests/reference/sft/tok/qwen data.template=qwen generate.prompts_file=prompts.jsonl
  generate.max_new_tokens=12 log.plot=false"
# shellcheck disable=SC2086
run_ztrain 1 $G data.train_files=tok3520.h5 data.val_files= train.max_steps=1 optim.learning_rate=0 \
    checkpoint.save_hf=true checkpoint.hf_dtype=fp32 train.output_dir=gbase >/dev/null
Q="model.name_or_path=gbase/hf model.quantization_bit=4 train.finetuning_type=lora"
# shellcheck disable=SC2086
run_ztrain 1 --generate $G $Q train.output_dir=g1 >/dev/null
assert_contains "$ZT_OUT" "qlora: 14 block linears quantized at load to nf4"
[ "$(wc -l <g1/generations.jsonl)" -eq 3 ] || fail "not one generation per prompt"
for cfg in "2 g2 parallel.strategy=zero3" "2 gt parallel.tensor_parallel_size=2" \
    "2 gs parallel.tensor_parallel_size=2 parallel.tp_sequence_parallel=true" \
    "2 gp parallel.pipeline_parallel_size=2"; do
    # shellcheck disable=SC2086
    set -- $cfg
    np=$1 name=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" --generate $G $Q "$@" train.output_dir="$name" >/dev/null
    cmp g1/generations.jsonl "$name/generations.jsonl" || fail "generation on the 4-bit base with $* differs from one rank's"
done
# shellcheck disable=SC2086
run_ztrain 1 --generate $G model.name_or_path=gbase/hf train.output_dir=gf >/dev/null
cmp -s g1/generations.jsonl gf/generations.jsonl && fail "the 4-bit base generated what the float32 base generates"
echo "qlora_tp.sh: ok"
