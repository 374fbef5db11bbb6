#!/bin/sh
# gpu-check.sh — builds ztrain with CUDA and checks the GPU path on a machine that
# has one, in a few minutes (every step has a timeout; total well under 8 min).
#
#   tools/gpu-check.sh [BUILDDIR]        (default /tmp/ztrain-gpu-build)
#   env: CUDA_HOME (default /usr/local/cuda), NVCCFLAGS (default: configure's
#        sm_80 + sm_90), ZT_GPU_STEPS (default 20), ZT_CUDA_TF32=1 (TF32 GEMMs)
#
# Steps: configure --with-cuda, make, the kernel test (every CUDA kernel against
# the CPU backend), the NCCL test on every visible GPU, then the tiny model
# trained for ZT_GPU_STEPS steps with parallel.backend=cpu and =cuda: the two
# loss curves must agree (same data, same initial weights), and the cuda run must
# have used the NCCL comm backend. With two or more GPUs, 2-rank cuda runs (ddp:
# all-reduce; zero3: prefetched all-gather + reduce-scatter; zero2 per_param:
# the v-collectives) against one CPU rank with the same global batch. Prints one table;
# exit status 0 only when every step that ran passed (a skipped step is shown).
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-/tmp/ztrain-gpu-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
STEPS=${ZT_GPU_STEPS:-20}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$BUILD" || exit 1
LOG="$BUILD/gpu-check.log"
: >"$LOG"
RESULTS=""
FAILED=0

row() {  # step, verdict, detail
    RESULTS="$RESULTS$(printf '%-26s %-6s %s' "$1" "$2" "$3")
"
    [ "$2" = FAIL ] && FAILED=1
    printf '%-26s %-6s %s\n' "$1" "$2" "$3"
}

run_step() {  # name, timeout_s, command...  -> verdict from the exit status (77 = skip)
    name=$1; t=$2; shift 2
    echo "==== $name: $*" >>"$LOG"
    start=$(date +%s)
    timeout "$t" "$@" >>"$LOG" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    case $rc in
        0) row "$name" ok "${secs}s" ;;
        77) row "$name" SKIP "$(grep -i 'no gpu\|skip' "$LOG" | tail -n 1)" ;;
        124) row "$name" FAIL "timed out after ${t}s (log: $LOG)" ;;
        *) row "$name" FAIL "exit $rc after ${secs}s (log: $LOG)" ;;
    esac
    return $rc
}

summary() {
    echo
    echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
            sed 's/^/  gpu: /'
    fi
    printf '%-26s %-6s %s\n' step result detail
    printf '%s' "$RESULTS"
    echo "full log: $LOG"
    exit $FAILED
}

# ---- build ------------------------------------------------------------------
if [ ! -x "$SRC/configure" ]; then
    run_step autoreconf 120 sh -c "cd '$SRC' && autoreconf -fi" || summary
fi
# NVCCFLAGS, when set, reaches configure through the environment (AC_ARG_VAR)
run_step configure 120 sh -c "cd '$BUILD' && '$SRC/configure' -q --with-cuda='$CUDA_HOME'" || summary
run_step make 240 make -C "$BUILD" -j"$JOBS" ztrain zt-prep-data || summary

# The GPU tests: through the Makefile when it lists them, else built by hand
# against libztrain.a with the libraries configure found.
TESTS_OK=1
for t in test_gpu_kernels test_nccl; do
    [ -f "$SRC/tests/gpu/$t.c" ] || continue
    # (only a Makefile that lists the test may build it: make's implicit rules
    # would otherwise call a stale binary up to date)
    if ! { grep -q "tests/gpu/$t" "$BUILD/Makefile" &&
           make -C "$BUILD" "tests/gpu/$t" >>"$LOG" 2>&1; }; then
        mkdir -p "$BUILD/tests/gpu"
        libs=$(make -C "$BUILD" -s -f Makefile -f - print-libs <<'EOF' 2>/dev/null
print-libs:
	@echo $(HDF5_LIBS) $(LIBCONFIG_LIBS) $(BLAS_LIBS) $(CUNIT_LIBS) $(CUDA_LDFLAGS) $(CUDA_LIBS) $(OPENMP_CFLAGS)
EOF
)
        run_step "build $t" 120 sh -c "mpicc -std=gnu11 -O2 -fopenmp -I'$SRC/include' -I'$CUDA_HOME/include' \
            '$SRC/tests/gpu/$t.c' '$BUILD/libztrain.a' $libs -lm -o '$BUILD/tests/gpu/$t'" || TESTS_OK=0
    fi
done

# ---- device tests -----------------------------------------------------------
HAVE_GPU=1
if [ $TESTS_OK = 1 ]; then
    run_step "kernels vs cpu" 180 "$BUILD/tests/gpu/test_gpu_kernels"
    [ $? = 77 ] && HAVE_GPU=0
fi
if [ -x "$BUILD/tests/gpu/test_nccl" ]; then
    # GPU lines only: with MIG on, `nvidia-smi -L` adds an indented line per instance,
    # and ranks beyond the devices CUDA enumerates would share one (test_nccl refuses)
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    [ "$ngpu" -ge 1 ] || ngpu=1
    MPIRUN="mpirun -np $ngpu"
    [ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root --oversubscribe"
    run_step "nccl on $ngpu rank(s)" 120 $MPIRUN "$BUILD/tests/gpu/test_nccl"
fi

# ---- a short training run on each backend ---------------------------------------
WORK="$BUILD/gpu-check-run"
rm -rf "$WORK"
mkdir -p "$WORK"
# text that every checkout has: the project's own sources and docs
cat "$SRC"/src/*.c "$SRC"/include/*.h "$SRC"/doc/*.md >"$WORK/text.txt" 2>/dev/null
run_step "prepare data" 60 "$BUILD/zt-prep-data" -o "$WORK/gpu" "$WORK/text.txt" || summary

MPIRUN1="mpirun -np 1"
[ "$(id -u)" = 0 ] && MPIRUN1="$MPIRUN1 --allow-run-as-root"
last_loss() {  # the last "loss" value in a metrics.jsonl
    [ -f "$1" ] || { echo "?"; return; }
    grep '"loss"' "$1" | tail -n 1 | sed 's/.*"loss"[^0-9-]*\([-0-9.eE+]*\).*/\1/'
}
for be in cpu cuda; do
    if [ $be = cuda ] && [ $HAVE_GPU = 0 ]; then
        row "train $STEPS steps cuda" SKIP "no GPU (see the kernel test)"
        loss_cuda="?"
        continue
    fi
    run_step "train $STEPS steps $be" 120 $MPIRUN1 "$BUILD/ztrain" "$SRC/inputs/tiny.cfg" \
        data.train_files="$WORK/gpu-train.h5" data.val_files="$WORK/gpu-val.h5" \
        train.max_steps="$STEPS" train.sample_tokens=0 train.eval_steps=0 \
        train.output_dir="$WORK/run-$be" checkpoint.save_at_end=false parallel.backend=$be \
        train.matmul_precision="$([ "${ZT_CUDA_TF32:-0}" = 1 ] && echo high || echo highest)"
    eval "loss_$be=\$(last_loss '$WORK/run-$be/metrics.jsonl')"
done
same_loss() {  # name, loss a, loss b: one row
    if [ "$2" = "?" ] || [ "$3" = "?" ]; then
        row "$1" SKIP "no metrics.jsonl to compare ($2 vs $3)"
        return
    fi
    tol=1e-3   # fp32 GEMMs: rounding-order differences only; TF32 rounds inputs to 10 bits
    [ "${ZT_CUDA_TF32:-0}" = 1 ] && tol=2e-2
    if awk -v a="$2" -v b="$3" -v t="$tol" 'BEGIN { d = a - b; if (d < 0) d = -d;
            exit !(d <= t * (a < 0 ? -a : a) + 1e-4) }'; then
        row "$1" ok "$2 vs $3 after $STEPS steps"
    else
        row "$1" FAIL "$2 vs $3 after $STEPS steps"
    fi
}
# shellcheck disable=SC2154
same_loss "loss cpu vs cuda" "$loss_cpu" "$loss_cuda"
if [ $HAVE_GPU = 1 ]; then
    if grep -q "backend cuda (GEMMs [a-z0-9]*), comm nccl" "$LOG"; then row "cuda run uses nccl" ok ""
    else row "cuda run uses nccl" FAIL "no 'backend cuda (GEMMs ...), comm nccl' line in $LOG"; fi
    # offload: the optimizer on the host, parameter shards too; the same numbers as on the device
    # (AdamW on the CPU and on the GPU agree to float rounding)
    run_step "train cuda zero3 offload" 120 $MPIRUN1 "$BUILD/ztrain" "$SRC/inputs/tiny.cfg" \
        data.train_files="$WORK/gpu-train.h5" data.val_files="$WORK/gpu-val.h5" \
        train.max_steps="$STEPS" train.sample_tokens=0 train.eval_steps=0 checkpoint.save_at_end=false \
        parallel.backend=cuda parallel.strategy=zero3 parallel.offload_optimizer=cpu parallel.offload_param=cpu \
        train.output_dir="$WORK/run-offload" \
        train.matmul_precision="$([ "${ZT_CUDA_TF32:-0}" = 1 ] && echo high || echo highest)"
    same_loss "loss cuda vs cuda offload" "$loss_cuda" "$(last_loss "$WORK/run-offload/metrics.jsonl")"
fi

# ---- two ranks on two GPUs: the collectives of the shard engine through NCCL ----
if [ $HAVE_GPU = 1 ] && [ "${ngpu:-1}" -ge 2 ]; then
    MPIRUN2="mpirun -np 2"
    [ "$(id -u)" = 0 ] && MPIRUN2="$MPIRUN2 --allow-run-as-root"
    base="$SRC/inputs/tiny.cfg data.train_files=$WORK/gpu-train.h5 data.val_files=$WORK/gpu-val.h5
          train.max_steps=$STEPS train.sample_tokens=0 train.eval_steps=0 checkpoint.save_at_end=false"
    # the same global batch (4 sequences): one CPU rank accumulating 2 micro-steps
    # shellcheck disable=SC2086
    run_step "train ref cpu, 1 rank" 120 $MPIRUN1 "$BUILD/ztrain" $base train.gradient_accumulation_steps=2 \
        train.output_dir="$WORK/run-ref2" parallel.backend=cpu
    ref=$(last_loss "$WORK/run-ref2/metrics.jsonl")
    for st in "ddp flat" "zero3 flat" "zero2 per_param"; do
        # shellcheck disable=SC2086
        set -- $st
        # shellcheck disable=SC2086
        run_step "train cuda 2 ranks $1 $2" 120 $MPIRUN2 "$BUILD/ztrain" $base parallel.backend=cuda \
            parallel.strategy=$1 parallel.shard_layout=$2 train.output_dir="$WORK/run-2-$1-$2"
        same_loss "loss cpu vs 2 gpus $1 $2" "$ref" "$(last_loss "$WORK/run-2-$1-$2/metrics.jsonl")"
    done
fi

# ---- benchmark: GPT-2 124M, T=1024, one GPU --------------------------------------
# Figures of the last logging window (steps 11..BENCH_STEPS, after warm-up and plan
# caching). MFU against ZT_PEAK_TFLOPS (default 989: H100/H200 SXM dense bf16), the
# convention of llm.c's reports. A speed row below its target says MISS, not FAIL.
BENCH_STEPS=${ZT_BENCH_STEPS:-20}
PEAK=${ZT_PEAK_TFLOPS:-989}
field() {  # metrics.jsonl, key: the key's value in the last step record
    [ -f "$1" ] || { echo "?"; return; }
    grep '"tokens_per_s"' "$1" | tail -n 1 | sed "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/"
}
bench() {  # name, key=value...: one training run of GPT-2 124M, one row of figures
    name=$1; shift
    dir="$WORK/bench-$(echo "$name" | tr ' ' '-')"
    # shellcheck disable=SC2086
    if run_step "bench $name" 75 $MPIRUN1 "$BUILD/ztrain" "$SRC/inputs/gpt2-124m.cfg" \
        data.train_files="$WORK/gpu-train.h5" data.val_files=[] data.seq_len=1024 \
        train.per_device_train_batch_size="${ZT_BENCH_B:-8}" train.max_steps="$BENCH_STEPS" \
        train.logging_steps=10 train.eval_steps=0 train.sample_tokens=0 checkpoint.save_at_end=false \
        parallel.backend=cuda train.peak_tflops="$PEAK" train.output_dir="$dir" "$@"; then
        tps=$(field "$dir/metrics.jsonl" tokens_per_s); mfu=$(field "$dir/metrics.jsonl" mfu)
        st=$(field "$dir/metrics.jsonl" step_s)
        row "  $name" info "$(awk -v t="$tps" -v m="$mfu" -v s="$st" 'BEGIN {
            printf "%.0f tok/s, MFU %.1f%%, step %.1f ms", t, 100 * m, 1000 * s }')"
        eval "step_$(echo "$name" | tr -c 'a-z0-9\n' '_')=$st"
    fi
}
if [ $HAVE_GPU = 1 ]; then
    bench "bf16 ddp" train.bf16=true parallel.strategy=ddp
    bench "bf16 zero3" train.bf16=true parallel.strategy=zero3
    bench "bf16 zero3 offload" train.bf16=true parallel.strategy=zero3 parallel.offload_optimizer=cpu
    bench "fp32 ddp" parallel.strategy=ddp train.matmul_precision=highest
    bench "tf32 ddp" parallel.strategy=ddp train.matmul_precision=high
    # shellcheck disable=SC2154
    if [ -n "${step_bf16_ddp:-}" ] && [ -n "${step_bf16_zero3:-}" ]; then
        r=$(awk -v a="$step_bf16_zero3" -v b="$step_bf16_ddp" 'BEGIN { printf "%.3f", a / b }')
        if awk -v r="$r" 'BEGIN { exit !(r <= 1.10) }'; then row "zero3 / ddp step time" ok "$r (target <= 1.10)"
        else row "zero3 / ddp step time" MISS "$r (target <= 1.10)"; fi
    fi
else
    row "bench gpt2-124m" SKIP "no GPU"
fi
summary
