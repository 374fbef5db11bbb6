#!/bin/sh
# accounting.sh — memory and traffic accounting: the bytes each collective moves
# per step, and each rank's model-state bytes, equal the ZeRO formulas
# (computed independently in check_accounting.py from the model shape), and the start
# record's traffic estimate (the dry step's count) equals every step's measured bytes.
. "$(dirname "$0")/common.sh"
PY=${PYTHON3:-/usr/bin/python3}
"$PY" -c "import json" 2>/dev/null || skip "python3 needed"
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=3 checkpoint.save_at_end=false train.gradient_accumulation_steps=2"
check() {
    np=$1 st=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" $common parallel.strategy="$st" train.output_dir="$st-$np" "$@" >/dev/null
    "$PY" "$ZT_SRCDIR/tests/mpi/check_accounting.py" "$st-$np${tag:-}" "$st" "$np" 2 ${group:-} ${flag:-} ||
        fail "$st on $np ranks${tag:-}: accounting differs from theory"
}
for st in ddp zero1 zero2 shard_grad_op zero3; do
    check 2 "$st"
    check 3 "$st"
done
group=2 check 4 hybrid_shard parallel.shard_group_size=2
# the llama family: GQA, SwiGLU, an untied head (the root unit holds two vocabulary matrices)
llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.head_dim=8 model.intermediate_size=48"
for st in ddp zero1 zero2 shard_grad_op zero3; do
    # shellcheck disable=SC2086
    tag=-llama flag=--llama check 2 "$st" $llama train.output_dir="$st-2-llama"
done
# shellcheck disable=SC2086
tag=-llama flag=--llama check 3 zero3 $llama train.output_dir=zero3-3-llama
# tensor parallelism: the engine's formulas on a rank's tp slices over the data ranks,
# and the tp group's activation all-reduces (check_accounting.py --tp)
for st in ddp zero1 zero3; do
    # shellcheck disable=SC2086
    tag=-tp flag="--tp=2 --vocab=258" check 4 "$st" model.vocab_size=258 parallel.tensor_parallel_size=2 \
        train.output_dir="$st-4-tp"
    # shellcheck disable=SC2086
    tag=-tp-llama flag="--tp=2 --vocab=258 --llama" check 2 "$st" $llama model.vocab_size=258 \
        parallel.tensor_parallel_size=2 train.output_dir="$st-2-tp-llama"
done
# the traffic estimate where the formulas above stop: a pipeline rank's messages (1f1b,
# interleaved), its data-parallel and tp/sp collectives beside them, and 1-bit Adam's
# warm-up and compressed steps (check_accounting.py --traffic)
traffic() {
    np=$1 out=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" $common train.output_dir="$out" "$@" >/dev/null
    "$PY" "$ZT_SRCDIR/tests/mpi/check_accounting.py" "$out" --traffic ${freeze:+--freeze=$freeze} ||
        fail "$out: the traffic estimate is not what the steps moved"
}
pp2="parallel.pipeline_parallel_size=2"
traffic 2 pp-1f1b parallel.strategy=ddp $pp2
traffic 2 pp-interleaved parallel.strategy=ddp $pp2 parallel.pp_schedule=interleaved_1f1b parallel.pp_stages_per_rank=2
traffic 4 pp-zero1 parallel.strategy=zero1 $pp2
traffic 4 pp-tps parallel.strategy=ddp $pp2 model.vocab_size=258 parallel.tensor_parallel_size=2 \
    parallel.tp_sequence_parallel=true
freeze=1 traffic 2 onebit-ddp parallel.strategy=ddp optim.type=onebit_adam optim.freeze_step=1
freeze=1 traffic 2 onebit-zero1 parallel.strategy=zero1 optim.type=onebit_adam optim.freeze_step=1
# shellcheck disable=SC2086
run_ztrain 1 --estimate-memory $common $llama >/dev/null
assert_contains "$ZT_OUT" "memory estimate per rank: 31968 parameters"
# Ulysses: the sp ranks are data ranks (ZeRO over them), and the sp group's all-to-alls
for st in ddp zero3; do
    # shellcheck disable=SC2086
    tag=-sp flag="--sp=2" check 4 "$st" parallel.sequence_parallel_size=2 train.output_dir="$st-4-sp"
    # shellcheck disable=SC2086
    tag=-sp-llama flag="--sp=2 --llama" check 2 "$st" $llama parallel.sequence_parallel_size=2 \
        train.output_dir="$st-2-sp-llama"
done
# ring attention's send-receives, and tp_sequence_parallel's reduce-scatter / all-gather pairs
for st in ddp zero3; do
    # shellcheck disable=SC2086
    tag=-ring flag="--sp=2 --ring" check 2 "$st" parallel.sequence_parallel_size=2 parallel.sp_mode=ring \
        train.output_dir="$st-2-ring"
    # shellcheck disable=SC2086
    tag=-tps-llama flag="--tp=2 --vocab=258 --tp-seq --llama" check 2 "$st" $llama model.vocab_size=258 \
        parallel.tensor_parallel_size=2 parallel.tp_sequence_parallel=true train.output_dir="$st-2-tps-llama"
done
# shellcheck disable=SC2086
tag=-tps flag="--tp=2 --vocab=258 --tp-seq" check 4 zero1 model.vocab_size=258 parallel.tensor_parallel_size=2 \
    parallel.tp_sequence_parallel=true train.output_dir=zero1-4-tps
# --estimate-memory plans a tp mesh: a rank's slices (the 72448 bytes the tp 2 x dp 2
# ddp run above measured), over world / tp data ranks
# shellcheck disable=SC2086
run_ztrain 1 --estimate-memory --ranks 4 $common model.vocab_size=258 parallel.tensor_parallel_size=2 >/dev/null
assert_contains "$ZT_OUT" "34752 parameters, 4 ranks (4 per node), tp 2, sp 1"
grep -q "^ddp  *70.75 KiB  *70.75 KiB  *141.50 KiB" "$ZT_OUT" || fail "--estimate-memory at tp 2: not a rank's slices"
# --estimate-memory prints every strategy
run_ztrain 1 --estimate-memory $common >/dev/null
for st in ddp zero1 zero2 shard_grad_op zero3; do
    grep -q "^$st " "$ZT_OUT" || fail "--estimate-memory does not list $st"
done
# auto: the least traffic that fits. Plenty of memory -> ddp; a limit below ddp's
# estimate but above zero3's -> a sharded strategy, and the reason is printed.
# shellcheck disable=SC2086
run_ztrain 2 $common parallel.strategy=auto parallel.memory_limit_gb=8 train.output_dir=auto-big >/dev/null
assert_contains "$ZT_OUT" "strategy auto -> ddp"
# tiny model on 2 ranks (estimates per rank): ddp 733 KiB, zero1 and zero2 690 (zero1 moves less;
# activations include the batch's segment and position buffers, 8 bytes a token)
# shellcheck disable=SC2086
run_ztrain 2 $common parallel.strategy=auto parallel.memory_limit_gb=0.00066 train.output_dir=auto-small >/dev/null
assert_contains "$ZT_OUT" "strategy auto -> zero1: estimated 690.00 KiB per rank fits the limit"
# nothing fits: auto names the strategy that needs the least, and the run is refused
# before it allocates, on every rank, with the estimate and the limit
# shellcheck disable=SC2086
expect_fail_with 2 "strategy auto -> zero1: nothing fits the limit of 314.57 KiB; zero1 needs the least memory" \
    $common parallel.strategy=auto parallel.memory_limit_gb=0.0003 train.output_dir=auto-none
assert_contains "$ZT_OUT" "memory: zero1 needs an estimated 690.00 KiB per rank, more than the limit of 314.57 KiB (parallel.memory_limit_gb)"
# auto considers the mesh: where no strategy fits at tp 1 x sp 1 (524.29 KiB against
# zero1's 690), tensor parallelism over the 2 ranks does (ddp at tp 2: 405.26 KiB, a
# rank's slices), and it moves the least of what fits; the run trains so
# shellcheck disable=SC2086
run_ztrain 2 $common parallel.strategy=auto parallel.memory_limit_gb=0.0005 train.output_dir=auto-mesh >/dev/null
assert_contains "$ZT_OUT" "parallel auto: no strategy fits the limit of 524.29 KiB (parallel.memory_limit_gb) at tp 1 x sp 1; tp 2 x sp 1 with ddp fits (405.26 KiB per rank)"
assert_contains "$ZT_OUT" "mesh tp 2 x sp 1 x dp 1"
# a mesh given is kept: auto then chooses only the strategy
# shellcheck disable=SC2086
expect_fail_with 2 "nothing fits the limit of 524.29 KiB" $common parallel.strategy=auto parallel.memory_limit_gb=0.0005 \
    parallel.tensor_parallel_size=1 train.output_dir=auto-kept
# an explicit strategy is checked the same way; the limit given is the one that counts
# shellcheck disable=SC2086
expect_fail_with 2 "memory: ddp needs an estimated 733.00 KiB" $common parallel.strategy=ddp parallel.memory_limit_gb=0.00069 \
    train.output_dir=ddp-none
# shellcheck disable=SC2086
run_ztrain 2 $common parallel.strategy=ddp parallel.memory_limit_gb=0.00075 train.max_steps=1 train.output_dir=ddp-fits >/dev/null
echo "accounting: traffic and memory match theory"
