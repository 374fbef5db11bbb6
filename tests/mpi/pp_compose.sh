#!/bin/sh
# pp_compose.sh — the pipeline with the rest of ztrain: every run trains the same model as
# one rank with accumulation (fp32: within 1e-5, 20 steps of the tiny model, global batch
# 12, clipping active at every step).
#  1. Qwen3 (per-head q/k RMSNorm, GQA, tied embedding and head: the root unit's gradient
#     summed between the first and the last stage) at pp 2 and pp 2 x dp 2.
#  2. train.bf16 at pp 2 x zero3 dp 2 against the one-rank bf16 run, and
#     train.fp16 (dynamic loss scale) at pp 2 against the one-rank fp16 run. The working
#     copy is bf16(master) (fp16(master)) on every rank and the stages pass fp32
#     activations, so what differs from one rank is how the fp32 gradients are summed
#     (over the data ranks and the pipeline ranks), and then the occasional master value
#     that lands on the other side of a 16-bit rounding boundary: bf16.sh's tolerance
#     for reduce_dtype = fp32, 5e-6 loss and 3e-5 parameters.
#  3. The other strategies, as torchtitan orders the mesh (pp, dp_replicate, dp_shard,
#     sp, tp): shard_grad_op (with activation checkpointing) at pp 2 x dp 2, and
#     hybrid_shard and hybrid_shard_zero2 (the per_param layout) at pp 2 x dp_replicate 2
#     x dp_shard 2 on 8 ranks.
#  4. Neat-packed SFT rows (each stage's attention sees the micro-batch's segments, its
#     rope their positions) at pp 2 x dp 2, 8 steps; with LoRA (its head on the
#     loss-bearing rows alone) under gpipe at pp 2, the head split between F and B.
#  5. Generation through the stages (--generate, generate.at_eval, the end-of-run sample):
#     the same bytes as one rank's, with and without the KV cache, under zero3 and with
#     interleaved stages.
. "$(dirname "$0")/common.sh"
need_h5py
CMP="$ZT_SRCDIR/tests/mpi/compare_runs.py"
tiny_comparison_setup
common="$common model.vocab_size=260 optim.max_grad_norm=0.05 checkpoint.save_hf=false"
pp2="parallel.pipeline_parallel_size=2"

# ---- 1. Qwen3 (tied) ----------------------------------------------------------------------
qwen="model.arch=qwen3 model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 model.tie_word_embeddings=true"
# shellcheck disable=SC2086
run_ztrain 1 $common $qwen $(batch_args 1) train.output_dir=qwen-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $qwen $(batch_args 1) $pp2 train.output_dir=qwen-pp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $qwen $(batch_args 2) $pp2 parallel.pp_schedule=gpipe train.output_dir=qwen-pp2dp2 >/dev/null
assert_contains "$ZT_OUT" "mesh tp 1 x sp 1 x dp 2 x pp 2"
"$PY" "$CMP" qwen-ref qwen-pp2 qwen-pp2dp2 || fail "qwen3 under a pipeline diverged from one rank"
echo "pp_compose: qwen3 (tied) at pp 2 and pp 2 x dp 2 matches one rank"

# ---- 2. bf16 and fp16 against their one-rank runs -----------------------------------------
TOL16="--loss-tol 5e-6 --param-tol 3e-5"
# shellcheck disable=SC2086
run_ztrain 1 $common $(batch_args 1) train.output_dir=fp32-ref >/dev/null
for dt in bf16 fp16; do
    # shellcheck disable=SC2086
    run_ztrain 1 $common $(batch_args 1) train.$dt=true train.output_dir="$dt-ref" >/dev/null
done
# shellcheck disable=SC2086
run_ztrain 4 $common $(batch_args 2) $pp2 train.bf16=true parallel.strategy=zero3 train.output_dir=bf16-pp2z3 \
    >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 1) $pp2 train.fp16=true train.output_dir=fp16-pp2 >/dev/null
# shellcheck disable=SC2086
"$PY" "$CMP" bf16-ref bf16-pp2z3 $TOL16 || fail "bf16 under a pipeline diverged from the one-rank bf16 run"
# shellcheck disable=SC2086
"$PY" "$CMP" fp16-ref fp16-pp2 $TOL16 || fail "fp16 under a pipeline diverged from the one-rank fp16 run"
# the 16-bit working copy is in effect: the pipelined runs are not the fp32 one
"$PY" "$CMP" fp32-ref bf16-pp2z3 >/dev/null && fail "train.bf16 at pp 2 gave the fp32 result: bf16 is not in effect"
"$PY" "$CMP" fp32-ref fp16-pp2 >/dev/null && fail "train.fp16 at pp 2 gave the fp32 result: fp16 is not in effect"
echo "pp_compose: bf16 at pp 2 x zero3 dp 2 and fp16 at pp 2 match their one-rank runs"

# ---- 3. the other strategies and layouts; 4. activation checkpointing -------------------
# (GPT-2, tied; fp32-ref is its one-rank run)
# shellcheck disable=SC2086
run_ztrain 4 $common $(batch_args 2) $pp2 parallel.strategy=shard_grad_op train.gradient_checkpointing=true \
    train.output_dir=sgo-pp2dp2 >/dev/null
# 8 ranks: pp 2 x dp_replicate 2 x dp_shard 2 (shard groups of 2 consecutive data ranks)
eight="train.per_device_train_batch_size=1 train.gradient_accumulation_steps=3 parallel.pp_schedule=gpipe $pp2
  parallel.shard_group_size=2"
# shellcheck disable=SC2086
run_ztrain 8 $common $eight parallel.strategy=hybrid_shard train.output_dir=hs-pp2r2s2 >/dev/null
assert_contains "$ZT_OUT" "mesh tp 1 x sp 1 x dp 4 x pp 2"
# shellcheck disable=SC2086
run_ztrain 8 $common $eight parallel.strategy=hybrid_shard_zero2 parallel.shard_layout=per_param \
    train.output_dir=hs2pp-pp2r2s2 >/dev/null
"$PY" "$CMP" fp32-ref sgo-pp2dp2 hs-pp2r2s2 hs2pp-pp2r2s2 ||
    fail "a strategy or layout under a pipeline diverged from one rank"
echo "pp_compose: shard_grad_op (checkpointed activations) at pp 2 x dp 2, hybrid_shard and hybrid_shard_zero2 (per_param) at pp 2 x 2 x 2 match one rank"

# ---- 4. neat-packed SFT rows ----------------------------------------------------------------
# 40 rows of 25 tokens (seq_len 24), 3 samples each
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" sft-neat neat.h5 apart.h5 67 40 3 24 || fail "cannot make the SFT files"
neat="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_layer=2 model.n_head=4 model.n_kv_head=2 model.n_embd=32
  model.intermediate_size=48 model.vocab_size=67 model.block_size=32 data.seq_len=24 data.shuffle=false
  data.train_files=neat.h5 data.val_files=[] train.max_steps=8 train.logging_steps=1 train.sample_tokens=0
  checkpoint.save_hf=false log.plot=false optim.learning_rate=3e-3 optim.max_grad_norm=0.05
  train.per_device_train_batch_size=1"
# shellcheck disable=SC2086
run_ztrain 1 $neat train.gradient_accumulation_steps=4 train.output_dir=neat-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $neat train.gradient_accumulation_steps=2 $pp2 train.output_dir=neat-pp2dp2 >/dev/null
assert_contains "$ZT_OUT" "neat-packed rows"
"$PY" "$CMP" neat-ref neat-pp2dp2 || fail "neat-packed rows under a pipeline diverged from one rank"
# LoRA's head runs on the loss-bearing rows alone (the prompts' are left out), here split
# between gpipe's forward and backward on the last stage (parallel.pp_head_split)
lora="train.finetuning_type=lora lora.rank=4 lora.alpha=8 train.gradient_accumulation_steps=4"
# shellcheck disable=SC2086
run_ztrain 1 $neat $lora train.output_dir=neat-lora-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $neat $lora $pp2 parallel.pp_schedule=gpipe train.output_dir=neat-lora-pp2 >/dev/null
"$PY" "$CMP" neat-lora-ref neat-lora-pp2 || fail "LoRA on neat-packed SFT rows under gpipe diverged from one rank"
echo "pp_compose: neat-packed SFT rows at pp 2 x dp 2, and with LoRA under gpipe at pp 2, match one rank"

# ---- 5. generation: the stages pass each forward's residual stream on, the KV cache of a
# block on its stage's rank, the last stage's logits broadcast over the pipeline -----------
cat >prompts.jsonl <<'JSON'
{"messages": [{"role": "user", "content": "What is the rank of a shard?"}]}
{"instruction": "Translate to French", "input": "the model"}
{"instruction": "Name a colour"}
JSON
G="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=48
  model.vocab_size=3520 model.block_size=64 data.seq_len=48 data.tokenizer=$ZT_SRCDIR/tests/reference/sft/tok/qwen
  data.template=qwen generate.prompts_file=prompts.jsonl generate.max_new_tokens=12 log.plot=false"
# shellcheck disable=SC2086
run_ztrain 1 --generate $G train.output_dir=gen1 >/dev/null
# greedy bytes as one rank's: pp 2 with and without the KV cache, pp 2 x zero3 dp 2 two prompts
# at once, interleaved (rank 0 holds stages 0 and 2: the stream goes 0 -> 1 -> 0 -> 1)
for cfg in "2 gen-pp2 $pp2" "2 gen-pp2nc $pp2 generate.use_cache=false" \
    "4 gen-pp2z3 $pp2 parallel.strategy=zero3 generate.batch_size=2" \
    "2 gen-il $pp2 parallel.pp_schedule=interleaved_1f1b parallel.pp_stages_per_rank=2"; do
    # shellcheck disable=SC2086
    set -- $cfg
    np=$1 name=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" --generate $G "$@" train.output_dir="$name" >/dev/null
    cmp gen1/generations.jsonl "$name/generations.jsonl" || fail "generation with $* differs from one rank's"
    ls "$name"/*.part >/dev/null 2>&1 && fail "generation with $* left part files"
done
# while training: generate.at_eval's prompts and the end-of-run sample at pp 2 are one rank's
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens tok.h5 3520 4000 || fail "cannot make the token file"
gtrain="data.train_files=tok.h5 data.val_files=[] train.max_steps=2 train.eval_steps=2 generate.at_eval=true
  train.sample_tokens=8 train.per_device_train_batch_size=1 train.gradient_accumulation_steps=2"
sample() { sed -n '/^---- sample/,/^---- end of sample/p' "$1"; }
# shellcheck disable=SC2086
run_ztrain 1 $G $gtrain train.output_dir=gt1 >gt1.out
# shellcheck disable=SC2086
run_ztrain 2 $G $gtrain $pp2 train.output_dir=gt-pp2 >gt-pp2.out
cmp gt1/generations-2.jsonl gt-pp2/generations-2.jsonl || fail "generate.at_eval at pp 2 differs from one rank's"
[ -n "$(sample gt1.out)" ] || fail "no end-of-run sample on one rank"
[ "$(sample gt1.out)" = "$(sample gt-pp2.out)" ] || fail "the end-of-run sample at pp 2 differs from one rank's"
echo "pp_compose: --generate (KV cache on and off, zero3, interleaved), generate.at_eval and the sample at pp 2 match one rank"
