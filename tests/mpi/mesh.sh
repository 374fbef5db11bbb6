#!/bin/sh
# mesh.sh — tensor and sequence parallelism train the same model as one rank with
# accumulation.
#  1. GPT-2 (c_attn split by heads into its q, k, v columns, c_fc by columns, both
#     c_proj by rows, vocabulary-parallel tied embedding and head) and a Llama GQA
#     model (untied head, q/k/v, gate/up, o, down) at tp 2, and tp 2 x dp 2 under ddp,
#     zero1, zero2 per_param and zero3 on 4 ranks: losses and final parameters
#     within 1e-5 of one rank (fp32, clipping active at every step); Qwen3's q/k
#     norms (replicated, gradients summed over tp); each at tp 2 and tp 2 x zero3 with
#     parallel.tp_sequence_parallel (Megatron: the residual stream split by tokens);
#     Gemma 3 (sandwich norms, a sliding and a full layer) through the same runs.
#  2. The checkpoint stays mesh-independent: tp 2 x dp 2 -> ddp on 3 ranks and -> sp 2 x
#     zero3, zero2 on 2 ranks -> tp 2, ring sp 2 -> tp 2 x sp 2, against 20 steps at once.
#  3. bf16 against its own one-rank run: Llama at tp 2 x zero3, tp 2 (tp_sequence_parallel)
#     x ring sp 2 and Ulysses sp 2 x zero2; GPT-2 at tp 2 x zero1, Ulysses sp 2, ring sp 2 x
#     zero3.
#  4. Sizes tp does not divide are refused on every rank, naming the reason.
#  5. Sequence parallelism (Ulysses: all-to-all from sequence- to head-sharded around
#     attention; ring: K|V blocks round the ring, head-tail chunks; rope and GPT-2's
#     positions of the rank's chunks): sp 2 for GPT-2,
#     Llama GQA and Qwen3; sp 2 x zero2 and sp 2 x zero3 (4 ranks); tp 2 x sp 2 (Llama:
#     its one KV head per tp rank replicated over sp, gradients summed back); ring sp 2,
#     sp 2 x zero3, tp 2 x sp 2 and sp 4.
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup
# the vocabulary must split over tp: byte-level data with 260 rows (3 never used);
# max_grad_norm small enough that clipping is active at every step
common="$common model.vocab_size=260 optim.max_grad_norm=0.05 checkpoint.save_hf=false"
llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 model.tie_word_embeddings=false"
qwen3="model.arch=qwen3 model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48"
# Gemma 3: layer 0 slides (a window of 5 over rows of 16), layer 1 is full attention
gemma3="model.arch=gemma3 model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 model.tie_word_embeddings=true model.sliding_window=5 model.sliding_window_pattern=2"
tp2="parallel.tensor_parallel_size=2"

# the one-rank references first, two at a time (one core each)
for fam in gpt2 llama qwen3 gemma3; do
    case $fam in gpt2) arch="" ;; llama) arch=$llama ;; qwen3) arch=$qwen3 ;; gemma3) arch=$gemma3 ;; esac
    # shellcheck disable=SC2086
    run_ztrain_bg 1 $common $arch $(batch_args 1) train.output_dir="$fam-ref"
    case $fam in llama | gemma3) ztrain_wait >/dev/null ;; esac
done
for fam in gpt2 llama qwen3 gemma3; do
    case $fam in gpt2) arch="" ;; llama) arch=$llama ;; qwen3) arch=$qwen3 ;; gemma3) arch=$gemma3 ;; esac
    # shellcheck disable=SC2086
    run_ztrain 2 $common $arch $(batch_args 1) $tp2 train.output_dir="$fam-tp2" >/dev/null
    assert_contains "$ZT_OUT" "mesh tp 2 x sp 1 x dp 1"
    runs="$fam-tp2"
    for st in "ddp flat" "zero1 flat" "zero2 per_param" "zero3 flat"; do
        set -- $st
        # shellcheck disable=SC2086
        run_ztrain 4 $common $arch $(batch_args 2) $tp2 parallel.strategy=$1 parallel.shard_layout=$2 \
            train.output_dir="$fam-tp2-$1" >/dev/null
        runs="$runs $fam-tp2-$1"
    done
    # Megatron sequence parallelism inside tp: tp 2, and tp 2 x dp 2 under zero3
    tps="$tp2 parallel.tp_sequence_parallel=true"
    # shellcheck disable=SC2086
    run_ztrain 2 $common $arch $(batch_args 1) $tps train.output_dir="$fam-tps" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 2) $tps parallel.strategy=zero3 train.output_dir="$fam-tps-zero3" >/dev/null
    runs="$runs $fam-tps $fam-tps-zero3"
    # shellcheck disable=SC2086
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "$fam-ref" $runs || fail "$fam: tensor parallelism diverged from one rank"
    # with it the tp group reduce-scatters and all-gathers instead of all-reducing
    "$PY" - "$fam-tps/metrics.jsonl" <<'PYEOF' || fail "$fam: tp_sequence_parallel did not replace the all-reduces"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"step_s"' in l][-1]["comm"]
assert r["reduce_scatter"]["calls"] > 0 and r["all_gather"]["calls"] > r["reduce_scatter"]["calls"], r
PYEOF
done
echo "mesh: gpt2, llama, qwen3 and gemma3 at tp 2 and tp 2 x dp 2 (ddp, zero1, zero2, zero3) match one rank"

# KV heads fewer than tp are replicated: one KV head (multi-query) at tp 2, and 2 KV
# heads at tp 4 (each shared by 2 ranks), with Qwen2's q/k/v biases
mqa="model.arch=qwen2 model.n_head=4 model.n_kv_head=1 model.n_embd=32 model.head_dim=8 model.intermediate_size=48"
# shellcheck disable=SC2086
run_ztrain_bg 1 $common $mqa $(batch_args 1) train.output_dir=mqa-ref
# and the one-rank run of the vocabulary case below
# shellcheck disable=SC2086
run_ztrain_bg 1 $common model.vocab_size=257 $(batch_args 1) train.output_dir=v257-ref
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $mqa $(batch_args 1) $tp2 parallel.strategy=zero2 train.output_dir=mqa-tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $(batch_args 1) parallel.tensor_parallel_size=4 train.output_dir=gqa-tp4 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" mqa-ref mqa-tp2 || fail "tp 2 with one KV head diverged from one rank"
# (the one-rank run of this llama is section 1's llama-ref)
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" llama-ref gqa-tp4 || fail "tp 4 with 2 KV heads diverged from one rank"
echo "mesh: KV heads fewer than tp (1 at tp 2, 2 at tp 4) replicated, as one rank"

# a vocabulary tp does not divide splits in blocks of ceil(V / tp) rows (GPT-2's 50257):
# 257 at tp 2 is 129 + 128 rows (v257-ref: above)
# shellcheck disable=SC2086
run_ztrain 2 $common model.vocab_size=257 $(batch_args 1) $tp2 train.output_dir=v257-tp2 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" v257-ref v257-tp2 || fail "an uneven vocabulary split diverged"

# Hugging Face directories in and out at tp 2: each rank reads and writes its slices'
# byte ranges; learning rate 0 gives the input back bit for bit (V = 67: uneven blocks)
HF="$ZT_SRCDIR/tests/reference/hf"
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
"$PY" "$HFPY" tokens tok67.h5 67 20000 || fail "cannot make the token file"
cat >hf.cfg <<'EOF2'
data = { train_files = "tok67.h5"; val_files = []; seq_len = 8; };
train = { per_device_train_batch_size = 2; max_steps = 2; logging_steps = 1; sample_tokens = 0; };
optim = { learning_rate = 0.0; warmup_steps = 0; };
checkpoint = { save_at_end = false; hf_dtype = "fp32"; };
log = { plot = false; };
EOF2
run_ztrain 2 hf.cfg model.name_or_path="$HF/qwen3" $tp2 train.output_dir=hf-q3 >/dev/null
"$PY" "$HFPY" same hf-q3/hf "$HF/qwen3" || fail "qwen3 through tp 2 differs from transformers' directory"
run_ztrain 4 hf.cfg model.name_or_path="$HF/llama-sharded" $tp2 parallel.strategy=zero3 \
    checkpoint.hf_max_shard_size=20KB train.output_dir=hf-ls >/dev/null
[ -s hf-ls/hf/model-00002-of-00005.safetensors ] || fail "tp 2 x zero3: the export did not shard as transformers does"
"$PY" "$HFPY" same hf-ls/hf "$HF/llama" || fail "the sharded llama through tp 2 x zero3 differs"
echo "mesh: HF directories in and out at tp 2 and tp 2 x zero3 bit for bit"

# generation at tp 2 x dp 2 (the tp ranks of a prompt gather its logits row and draw
# alike) writes what one rank writes
printf '%s\n' '{"instruction": "Name a colour"}' '{"messages": [{"role": "user", "content": "Hi"}]}' \
    '{"instruction": "Sum", "input": "2 and 3"}' >prompts.jsonl
G="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=48
  model.vocab_size=3520 model.block_size=64 data.seq_len=48 data.tokenizer=$ZT_SRCDIR/tests/reference/sft/tok/qwen
  data.template=qwen generate.prompts_file=prompts.jsonl generate.max_new_tokens=8 log.plot=false"
# shellcheck disable=SC2086
run_ztrain 1 --generate $G train.output_dir=gen1 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 --generate $G $tp2 parallel.strategy=zero3 train.output_dir=gen4 >/dev/null
cmp gen1/generations.jsonl gen4/generations.jsonl || fail "generation at tp 2 x dp 2 differs from one rank"
echo "mesh: generation at tp 2 x dp 2 as one rank"

# ---- 2. resume across meshes ----------------------------------------------------------
const="optim.lr_scheduler_type=constant_with_warmup"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $const $(batch_args 1) train.output_dir=full >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $const $(batch_args 2) $tp2 parallel.strategy=zero3 train.max_steps=10 \
    train.output_dir=split >/dev/null
# shellcheck disable=SC2086
run_ztrain 3 $common $llama $const $(batch_args 3) parallel.strategy=ddp checkpoint.resume=auto \
    train.output_dir=split >/dev/null
assert_contains "$ZT_OUT" "resumed from split/ckpt-00000010"
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $const $(batch_args 2) parallel.strategy=zero2 train.max_steps=10 \
    train.output_dir=split2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $const $(batch_args 1) $tp2 checkpoint.resume=auto train.output_dir=split2 >/dev/null
assert_contains "$ZT_OUT" "resumed from split2/ckpt-00000010"
# and into sequence parallelism: tp 2 x dp 2 -> Ulysses sp 2 x dp 2, ring sp 2 -> tp 2 x sp 2
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $const $(batch_args 2) $tp2 train.max_steps=10 train.output_dir=split3 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $const $(batch_args 2) parallel.sequence_parallel_size=2 parallel.strategy=zero3 \
    checkpoint.resume=auto train.output_dir=split3 >/dev/null
assert_contains "$ZT_OUT" "resumed from split3/ckpt-00000010"
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $const $(batch_args 1) parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
    train.max_steps=10 train.output_dir=split4 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $const $(batch_args 1) $tp2 parallel.sequence_parallel_size=2 checkpoint.resume=auto \
    train.output_dir=split4 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" full split split2 split3 split4 || fail "a resume across meshes diverged"
echo "mesh: tp 2 x dp 2 -> ddp on 3 ranks / -> sp 2 x zero3, zero2 -> tp 2, ring sp 2 -> tp 2 x sp 2 resume as 20 steps at once"

# ---- 3. bf16 ------------------------------------------------------------------------
# shellcheck disable=SC2086
run_ztrain_bg 1 $common $llama train.bf16=true $(batch_args 1) train.output_dir=bf16-ref
# and GPT-2's (below)
# shellcheck disable=SC2086
run_ztrain_bg 1 $common model.n_head=4 train.bf16=true $(batch_args 1) train.output_dir=bf16-g-ref
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama train.bf16=true $(batch_args 2) $tp2 parallel.strategy=zero3 \
    train.output_dir=bf16-tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama train.bf16=true $(batch_args 1) $tp2 parallel.sequence_parallel_size=2 \
    parallel.sp_mode=ring parallel.tp_sequence_parallel=true train.output_dir=bf16-tps-ring >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama train.bf16=true $(batch_args 2) parallel.sequence_parallel_size=2 parallel.strategy=zero2 \
    train.output_dir=bf16-sp2-zero2 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" bf16-ref bf16-tp2 bf16-tps-ring bf16-sp2-zero2 --loss-tol 2e-3 \
    --param-tol 2e-3 || fail "bf16 under a mesh diverged from one rank"
# GPT-2 in bf16 (bf16-g-ref: above): tp 2 x zero1, Ulysses sp 2 (4 heads), ring sp 2 x zero3
# shellcheck disable=SC2086
run_ztrain 4 $common model.n_head=4 train.bf16=true $(batch_args 2) $tp2 parallel.strategy=zero1 \
    train.output_dir=bf16-g-tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common model.n_head=4 train.bf16=true $(batch_args 1) parallel.sequence_parallel_size=2 \
    train.output_dir=bf16-g-sp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common model.n_head=4 train.bf16=true $(batch_args 2) parallel.sequence_parallel_size=2 \
    parallel.sp_mode=ring parallel.strategy=zero3 train.output_dir=bf16-g-ring >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" bf16-g-ref bf16-g-tp2 bf16-g-sp2 bf16-g-ring --loss-tol 2e-3 \
    --param-tol 2e-3 || fail "GPT-2 bf16 under a mesh diverged from one rank"

# ---- 4. refusals ----------------------------------------------------------------------
"$PY" "$HFPY" tokens tok5.h5 5 2000 || fail "cannot make the token file"
# shellcheck disable=SC2086
expect_fail_with 4 "parallel.tensor_parallel_size (4) must divide the vocabulary into non-empty blocks (5)" $common \
    $llama model.n_kv_head=4 model.vocab_size=5 data.train_files=tok5.h5 parallel.tensor_parallel_size=4 \
    train.output_dir=bad
# shellcheck disable=SC2086
expect_fail_with 3 "must divide the number of ranks (3)" $common $tp2 train.output_dir=bad
# shellcheck disable=SC2086
expect_fail_with 4 "must divide the key/value heads (or be a multiple of them) (3)" $common $llama \
    model.n_head=12 model.n_kv_head=3 parallel.tensor_parallel_size=4 train.output_dir=bad
echo "mesh: refusals name the size and what it does not divide"

# ---- 5. sequence parallelism (Ulysses) ---------------------------------------------------
sp2="parallel.sequence_parallel_size=2"
# (GPT-2 with 4 heads: tp 2 x sp 2 splits them twice)
for fam in gpt2 llama qwen3; do
    # the one-rank reference: llama's and qwen3's are section 1's (the same arguments, so
    # the same bits); GPT-2 with 4 heads is a model of its own
    case $fam in gpt2) arch="model.n_head=4" ref=gpt2-spref ;; llama) arch=$llama ref=llama-ref ;;
        qwen3) arch=$qwen3 ref=qwen3-ref ;; esac
    # shellcheck disable=SC2086
    [ "$fam" != gpt2 ] || run_ztrain 1 $common $arch $(batch_args 1) train.output_dir="$ref" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 $common $arch $(batch_args 1) $sp2 train.output_dir="$fam-sp2" >/dev/null
    assert_contains "$ZT_OUT" "mesh tp 1 x sp 2 x dp 1"
    runs="$fam-sp2"
    for st in zero2 zero3; do
        # shellcheck disable=SC2086
        run_ztrain 4 $common $arch $(batch_args 2) $sp2 parallel.strategy=$st train.output_dir="$fam-sp2-$st" >/dev/null
        runs="$runs $fam-sp2-$st"
    done
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 1) $sp2 $tp2 train.output_dir="$fam-tp2-sp2" >/dev/null
    assert_contains "$ZT_OUT" "mesh tp 2 x sp 2 x dp 1"
    # ring attention: sp 2, sp 2 x zero3 (4 ranks), tp 2 x sp 2, sp 4 (chunks of 2 positions)
    ring="parallel.sp_mode=ring"
    # shellcheck disable=SC2086
    run_ztrain 2 $common $arch $(batch_args 1) $sp2 $ring train.output_dir="$fam-ring2" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 2) $sp2 $ring parallel.strategy=zero3 train.output_dir="$fam-ring2-zero3" \
        >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 1) $sp2 $ring $tp2 train.output_dir="$fam-tp2-ring2" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 1) parallel.sequence_parallel_size=4 $ring train.output_dir="$fam-ring4" \
        >/dev/null
    # all three: tp 2 with tp_sequence_parallel x Ulysses sp 2
    # shellcheck disable=SC2086
    run_ztrain 4 $common $arch $(batch_args 1) $sp2 $tp2 parallel.tp_sequence_parallel=true \
        train.output_dir="$fam-tps-sp2" >/dev/null
    runs="$runs $fam-ring2 $fam-ring2-zero3 $fam-tp2-ring2 $fam-ring4 $fam-tps-sp2"
    # shellcheck disable=SC2086
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "$ref" $runs "$fam-tp2-sp2" ||
        fail "$fam: sequence parallelism diverged from one rank"
done
# shellcheck disable=SC2086
expect_fail_with 2 "parallel.sequence_parallel_size (2) must divide data.seq_len (15)" $common $sp2 data.seq_len=15 \
    train.output_dir=bad
# shellcheck disable=SC2086
expect_fail_with 4 "must divide the attention heads (2) and divide or be a multiple of the key/value heads (2)" \
    $common parallel.sequence_parallel_size=4 train.output_dir=bad
# shellcheck disable=SC2086
expect_fail_with 2 "into 2 sp chunks (ring attention's causal balance)" $common $sp2 parallel.sp_mode=ring \
    data.seq_len=14 train.output_dir=bad
echo "mesh: Ulysses and ring sp 2, with zero2/zero3 and tp 2, ring sp 4 match one rank for gpt2, llama and qwen3"
# Gemma 3's sliding window (5 over rows of 16) under Ulysses (each rank's heads over the
# whole sequence): sp 2, sp 2 x zero3, tp 2 (tp_sequence_parallel) x sp 2; and ring
# attention, whose block pairs beyond the window are skipped: sp 2, tp 2 x sp 2 and sp 4
# (chunks of 2 positions: most pairs skipped, the others offset)
# shellcheck disable=SC2086
run_ztrain 2 $common $gemma3 $(batch_args 1) $sp2 train.output_dir=gemma3-sp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $gemma3 $(batch_args 2) $sp2 parallel.strategy=zero3 train.output_dir=gemma3-sp2-zero3 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $gemma3 $(batch_args 1) $sp2 $tp2 parallel.tp_sequence_parallel=true \
    train.output_dir=gemma3-tps-sp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $gemma3 $(batch_args 1) $sp2 parallel.sp_mode=ring train.output_dir=gemma3-ring2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $gemma3 $(batch_args 1) $sp2 $tp2 parallel.sp_mode=ring train.output_dir=gemma3-tp2-ring2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $gemma3 $(batch_args 1) parallel.sequence_parallel_size=4 parallel.sp_mode=ring \
    train.output_dir=gemma3-ring4 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" gemma3-ref gemma3-sp2 gemma3-sp2-zero3 gemma3-tps-sp2 gemma3-ring2 \
    gemma3-tp2-ring2 gemma3-ring4 || fail "gemma3: sequence parallelism diverged from one rank"
echo "mesh: gemma3's sliding window under Ulysses sp 2, sp 2 x zero3, tp 2 x sp 2 and ring sp 2, tp 2 x ring sp 2, ring sp 4 matches one rank"
