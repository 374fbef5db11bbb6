#!/bin/sh
# bf16_dnnl.sh — train.bf16 with the CPU GEMMs in bf16 through oneDNN (src/zt_dnnl.c),
# forced with ZT_DNNL=force so that a processor without bf16 units runs the same code
# (the forced case of bf16.sh, on its tiny model, global batch 12, 20 steps).
#
# 1. The startup log names the GEMM path ("GEMMs bf16 (oneDNN, ..."), and forced
#    bf16 GEMMs train approximately the fp32 model: within bf16.sh's bf16-vs-fp32
#    tolerances (5e-3 relative loss, 1e-2 relative parameter L2), and they are not the
#    run whose GEMMs are fp32 on bf16 parameters (ZT_DNNL=off, common.sh's default).
# 2. Strategies and world sizes reproduce the forced single-rank run. The GEMM shapes
#    of a rank's micro-batch are the same at every world size and the losses agree to
#    the last printed digit for the first ~8 steps; then the gradient summation order
#    (the only difference, as in bf16.sh) moves some fp32 value across a bf16 rounding
#    boundary of a GEMM operand. Unlike bf16.sh's case, where only the working
#    parameters are rounded, every activation and gradient operand is now rounded, so
#    such flips are many more and each moves its operand by up to u = 2^-8 relative:
#    a discrete jump (measured: loss rel 0 for steps 1-8, then 1e-6 to 6e-6), which
#    Adam turns into updates of a different sign for near-zero gradient elements.
#    Measured on the tiny GPT-2 over 20 steps: at most 7.4e-6 loss and 5e-4 params.
#    This bound is measured, not derived (bf16.sh's fp32 tolerance, 5e-6 / 3e-5,
#    fails): 5e-5 loss, 2e-3 params, which still tells the bf16 GEMMs apart from
#    both fp32 (3.7e-4 / 4.8e-3) and fp32 GEMMs on bf16 parameters (7.9e-5 / 4.0e-3,
#    checked below).
#    GPT-2 (tied head: the transw GEMMs) and Llama (GQA attention, SwiGLU, untied head),
#    also under ring attention at sp 2 (the block kernels' bf16 GEMMs).
#    An fp32 model with train.matmul_precision = medium gets the same bf16 GEMMs.
# 3. fp32 is untouched: with ZT_DNNL=force an fp32 run (train.matmul_precision auto ->
#    highest) is bit-identical to one without it.
# 4. Weights are read from the bf16 working copy instead of being rounded per GEMM
#    (zt_dnnl_view): every weight of every step is (the count ZT_DNNL_VERBOSE prints), each
#    such weight is its bf16 copy's values (ZT_DNNL_VIEWS=check compares them: on AVX2 the
#    GEMM reads the fp32 view, and only the check sees a wrong or stale copy), and the
#    runs are bit for bit those that round them (ZT_DNNL_VIEWS=off), with the working
#    copy replicated (ddp), gathered (zero3, 2 ranks), split (tp 2, llama) and frozen under
#    LoRA adapters (whose own working copies are views as well).
. "$(dirname "$0")/common.sh"
need_h5py
CMP="$ZT_SRCDIR/tests/mpi/compare_runs.py"
tiny_comparison_setup
TOLD="--loss-tol 5e-5 --param-tol 2e-3"
llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 checkpoint.save_hf=false"

# The one-rank runs go two at a time (run_ztrain_bg: one core each); a variable of the
# environment is set for the runs started after it.
run_ztrain_bg 1 $common $(batch_args 1) train.output_dir=ref32
ref32_out=$ZT_BG_OUT
# fp32 GEMMs on bf16 parameters (common.sh's default ZT_DNNL=off, on any CPU)
run_ztrain_bg 1 $common $(batch_args 1) train.bf16=true train.output_dir=plain
ztrain_wait >/dev/null
grep -qF "GEMMs fp32: " "$ZT_OUT" || fail "ZT_DNNL=off: train.bf16 did not keep fp32 GEMMs"
grep -qF "GEMMs fp32: built without oneDNN" "$ZT_OUT" && skip "built without oneDNN"
grep -qF "GEMMs fp32)" "$ref32_out" || fail "an fp32 run does not report fp32 GEMMs"

export ZT_DNNL=force
# --- 1 --- (and 2.'s llama reference beside it)
run_ztrain_bg 1 $common $(batch_args 1) train.bf16=true train.output_dir=ref
ref_out=$ZT_BG_OUT
# shellcheck disable=SC2086
run_ztrain_bg 1 $common $llama $(batch_args 1) train.bf16=true train.output_dir=lref
ztrain_wait >/dev/null
assert_contains "$ZT_OUT" "(GEMMs bf16 (oneDNN"
assert_contains "$ref_out" "(GEMMs bf16 (oneDNN"
"$PY" "$CMP" ref32 ref --loss-tol 5e-3 --param-tol 1e-2 || fail "oneDNN bf16 GEMMs do not train approximately the fp32 model"
"$PY" "$CMP" plain ref $TOLD >/dev/null && fail "ZT_DNNL=force gave the fp32-GEMM result: oneDNN not in effect"

# --- 2 ---
runs=""
for c in "2 zero3 flat" "2 ddp flat" "3 zero2 per_param"; do
    # shellcheck disable=SC2086
    set -- $c
    run_ztrain "$1" $common $(batch_args "$1") train.bf16=true parallel.strategy="$2" \
        parallel.shard_layout="$3" train.output_dir="np$1-$2" >/dev/null
    runs="$runs np$1-$2"
done
# shellcheck disable=SC2086
"$PY" "$CMP" ref $runs $TOLD || fail "oneDNN bf16: a strategy diverged from the single-rank reference"

# llama (lref, above): GQA attention, SwiGLU, untied head
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $(batch_args 2) train.bf16=true parallel.strategy=zero3 train.output_dir=lnp2 >/dev/null
"$PY" "$CMP" lref lnp2 $TOLD || fail "oneDNN bf16 llama: 2-rank zero3 diverged from one rank"

# ring attention (sp 2): its block kernels take the bf16 GEMMs too (k|v rows apart, non-causal
# pairs). Not the same products as one rank's attention: each pair's P is rounded to bf16 on its
# own and the pairs are merged after, so the strategies' bound does not hold (measured 5.2e-5 /
# 7.3e-4). Bound: 1.5e-4 loss, 2e-3 params, which the fp32 llama run (the same ring run with fp32
# GEMMs would be within 1e-5 of it, mesh.sh) does not meet: checked below.
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $(batch_args 1) train.bf16=true parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
    train.output_dir=lring >/dev/null
TOLR="--loss-tol 1.5e-4 --param-tol 2e-3"
# shellcheck disable=SC2086
"$PY" "$CMP" lref lring $TOLR || fail "oneDNN bf16 llama: ring attention sp 2 diverged from one rank"
# shellcheck disable=SC2086
run_ztrain_bg 1 $common $llama $(batch_args 1) train.output_dir=lref32
# an fp32 model with train.matmul_precision = medium: bf16 GEMMs, fp32 parameters (as on GPUs)
run_ztrain_bg 1 $common $(batch_args 1) train.matmul_precision=medium train.output_dir=med
ztrain_wait >/dev/null
# shellcheck disable=SC2086
"$PY" "$CMP" lref32 lring $TOLR >/dev/null && fail "oneDNN bf16 llama ring: the bound does not tell it from fp32"

assert_contains "$ZT_OUT" "(GEMMs bf16 (oneDNN"
"$PY" "$CMP" ref32 med --loss-tol 5e-3 --param-tol 1e-2 || fail "matmul_precision=medium does not train approximately the fp32 model"
"$PY" "$CMP" ref32 med $TOLD >/dev/null && fail "matmul_precision=medium gave the fp32 result"

# --- 3 --- (and 4.'s count beside it)
run_ztrain_bg 1 $common $(batch_args 1) train.output_dir=f32
f32_out=$ZT_BG_OUT
export ZT_DNNL_VERBOSE=1
run_ztrain_bg 1 $common $(batch_args 1) train.bf16=true train.max_steps=2 train.output_dir=count
unset ZT_DNNL_VERBOSE
ztrain_wait >/dev/null
grep -qF "GEMMs fp32)" "$f32_out" || fail "ZT_DNNL=force changed an fp32 run's GEMM path"
"$PY" "$CMP" ref32 f32 --loss-tol 0 --param-tol 0 || fail "ZT_DNNL=force changed an fp32 run's bits"

# --- 4 ---
# per micro-batch the tiny GPT-2 (2 layers) reads 4 weights per layer in the forward and
# again in the backward and the tied head twice: 18; 6 micro-batches x 2 steps
viewed=$(sed -n 's/^zt_dnnl: \([0-9]*\) GEMM operands read from bf16 working copies.*/\1/p' "$ZT_OUT")
[ "${viewed:-0}" -eq 216 ] || fail "zt_dnnl views: ${viewed:-no} weights read from the bf16 copy, expected 216"
lora_setup
lora="model.name_or_path=$ZT_SRCDIR/tests/reference/hf/llama train.bf16=true optim.learning_rate=1e-2 train.max_steps=4
  checkpoint.save_hf=false"
export ZT_DNNL_VIEWS=check
run_ztrain_bg 1 $common $(batch_args 1) train.bf16=true train.output_dir=ref-v
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $lora train.output_dir=lora-v
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 2) train.bf16=true parallel.strategy=zero3 train.output_dir=np2-zero3-v >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $(batch_args 1) train.bf16=true parallel.tensor_parallel_size=2 train.output_dir=ltp2-v >/dev/null
export ZT_DNNL_VIEWS=off
run_ztrain_bg 1 $common $(batch_args 1) train.bf16=true train.output_dir=ref-r
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $lora train.output_dir=lora-r
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 2) train.bf16=true parallel.strategy=zero3 train.output_dir=np2-zero3-r >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $(batch_args 1) train.bf16=true parallel.tensor_parallel_size=2 train.output_dir=ltp2-r >/dev/null
unset ZT_DNNL_VIEWS
for r in ref np2-zero3 ltp2 lora; do
    "$PY" "$CMP" "$r-r" "$r-v" --loss-tol 0 --param-tol 0 || fail "zt_dnnl views: $r is not the run that rounds every weight"
done
"$PY" "$CMP" ref ref-v --loss-tol 0 --param-tol 0 || fail "zt_dnnl views: ZT_DNNL_VIEWS=check changed the run"
echo "bf16_dnnl: oneDNN bf16 GEMMs (forced) track fp32, match across strategies and world sizes; fp32 untouched;"
echo "  weights read from the bf16 working copy, bit for bit the rounding"
