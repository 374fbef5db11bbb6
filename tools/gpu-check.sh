#!/bin/sh
# gpu-check.sh — checks the GPU path on a machine that has one, in a few minutes: every
# step has a timeout, and all of them together ZT_GPU_BUDGET seconds (default 470, so the
# whole script fits one 10-minute device command with room to spare).
#
#   tools/gpu-check.sh [BUILDDIR]        (default /tmp/ztrain-gpu-build: work files, and
#                                         the build when there is no bundle)
#   env: ZT_GPU_BUNDLE (default <repo>/gpu-bundle, made by tools/gpu-bundle.sh): when it
#        holds env.sh, its prebuilt binaries, libraries and Open MPI are used and nothing is
#        built (the lent GPU machine has no MPI, HDF5, libconfig, OpenBLAS or network);
#        otherwise ztrain is configured --with-cuda and built here.
#        CUDA_HOME (default /usr/local/cuda), NVCCFLAGS (default: configure's sm_80 + sm_90),
#        ZT_GPU_STEPS (default 20), ZT_CUDA_TF32=1 (TF32 GEMMs), ZT_GPU_BUDGET (seconds),
#        ZT_TORCH_COMPILE (1: always run the torch.compile peer row, 0: never; default: when
#        at least 200 s of the budget are left), OUT (when set, as on the lent machine: the
#        log and a summary file are written there so they come back)
#
# Steps: the bundle's libraries (or configure --with-cuda and make), the kernel test (every CUDA kernel against
# the CPU backend), the per-kernel benchmark (tools/bench_gpu.c), the NCCL test on every visible GPU, then the tiny model
# trained for ZT_GPU_STEPS steps with parallel.backend=cpu and =cuda: the two
# loss curves must agree (same data, same initial weights), and the cuda run must
# have used the NCCL comm backend; zero3 with both offloads against it; greedy generation
# of 6 prompts 4 at a time on the GPU against one at a time on the CPU (the batched KV
# cache, generate.batch_size). With two or more GPUs, 2-rank cuda runs (ddp:
# all-reduce; zero3: prefetched all-gather + reduce-scatter; zero2 per_param:
# the v-collectives; ring sp 2; pp 2, the pipeline's messages in stream order) against one
# CPU rank with the same global batch (fewer GPUs: shown skipped). Prints one table;
# exit status 0 only when every step that ran passed (a skipped step is shown).
# Then the benchmark: GPT-2 124M at T=1024 on one GPU, beside the same model in PyTorch
# (tools/torch_gpt2_gpu.py: bf16 autocast, flash attention, fused AdamW).
set -u

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-/tmp/ztrain-gpu-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
STEPS=${ZT_GPU_STEPS:-20}
JOBS=$(nproc 2>/dev/null || echo 4)
BUNDLE=${ZT_GPU_BUNDLE:-$SRC/gpu-bundle}
START=$(date +%s)
BUDGET=${ZT_GPU_BUDGET:-470}
mkdir -p "$BUILD" || exit 1
# on the lent machine only what is under $OUT comes back
if [ -n "${OUT:-}" ] && mkdir -p "$OUT" 2>/dev/null; then
    LOG="$OUT/gpu-check.log"; SUMMARY="$OUT/gpu-check-summary.txt"
else
    LOG="$BUILD/gpu-check.log"; SUMMARY="$BUILD/gpu-check-summary.txt"
fi
: >"$LOG"
RESULTS=""
FAILED=0
MODE="?"

row() {  # step, verdict, detail
    RESULTS="$RESULTS$(printf '%-26s %-6s %s' "$1" "$2" "$3")
"
    [ "$2" = FAIL ] && FAILED=1
    printf '%-26s %-6s %s\n' "$1" "$2" "$3"
}

time_left() { echo $(( START + BUDGET - $(date +%s) )); }

run_step() {  # name, timeout_s, command...  -> verdict from the exit status (77 = skip)
    # (sh has no locals: _rs_ names keep the callers' name, t... intact)
    _rs_name=$1; _rs_t=$2; shift 2
    _rs_left=$(time_left)
    if [ "$_rs_left" -lt 10 ]; then
        row "$_rs_name" SKIP "no time left (ZT_GPU_BUDGET=${BUDGET}s)"
        return 75
    fi
    [ "$_rs_t" -gt "$_rs_left" ] && _rs_t=$_rs_left
    echo "==== $_rs_name: $*" >>"$LOG"
    _rs_start=$(date +%s)
    timeout -k 5 "$_rs_t" "$@" >>"$LOG" 2>&1
    _rs_rc=$?
    _rs_secs=$(( $(date +%s) - _rs_start ))
    case $_rs_rc in
        0) row "$_rs_name" ok "${_rs_secs}s" ;;
        77) row "$_rs_name" SKIP "$(grep -i 'no gpu\|skip' "$LOG" | tail -n 1)" ;;
        124|137) row "$_rs_name" FAIL "timed out after ${_rs_t}s (log: $LOG)" ;;
        *) row "$_rs_name" FAIL "exit $_rs_rc after ${_rs_secs}s (log: $LOG)" ;;
    esac
    return $_rs_rc
}

summary() {
    {
        echo
        echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname), $(( $(date +%s) - START )) s, $MODE)"
        if command -v nvidia-smi >/dev/null 2>&1; then
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
                sed 's/^/  gpu: /'
        fi
        printf '%-26s %-6s %s\n' step result detail
        printf '%s' "$RESULTS"
        echo "full log: $LOG"
    } | tee "$SUMMARY"
    # what does not fit the 16 MiB a returned file may have is cut from the front
    if [ "$(wc -c <"$LOG")" -gt 15000000 ]; then
        tail -c 15000000 "$LOG" >"$LOG.cut" && mv "$LOG.cut" "$LOG"
    fi
    exit $FAILED
}

{
    echo "gpu-check on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET}s"
    echo "glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}'), $(nproc 2>/dev/null) CPUs, $(uname -m)"
    nvidia-smi 2>&1 | head -n 15
} >>"$LOG" 2>&1

# ---- the binaries: a prebuilt bundle, else a build here ---------------------------------
if [ -f "$BUNDLE/env.sh" ]; then
    MODE="bundle $BUNDLE"
    ORIG_LD=${LD_LIBRARY_PATH-__unset__}
    echo "==== bundle: . $BUNDLE/env.sh" >>"$LOG"
    # shellcheck disable=SC1091
    ZT_BUNDLE=$BUNDLE; . "$BUNDLE/env.sh" >>"$LOG" 2>&1
    sed -n '1,10p' "$ZT_BUNDLE/MANIFEST" >>"$LOG" 2>/dev/null
    BIN=$ZT_BUNDLE/bin
    ZTRAIN=$BIN/ztrain; PREP=$BIN/zt-prep-data
    T_KERNELS=$BIN/test_gpu_kernels; T_NCCL=$BIN/test_nccl; T_BENCH=$BIN/bench_gpu
    found=$(sed -n 's/^env.sh: \(lib[a-zA-Z]*\)\.so\.[0-9]* <- \([^ ]*\).*/\1 \2/p' "$LOG" |
            awk '{ n = split($2, p, "/"); printf "%s%s:%s/%s", sep, $1, p[n-1], p[n]; sep = " " }')
    unresolved=""
    command -v ldd >/dev/null 2>&1 &&
        unresolved=$(for b in "$ZTRAIN" "$PREP" "$T_KERNELS" "$T_NCCL" "$T_BENCH"; do
                         [ -e "$b" ] && ldd -r "$b" 2>&1; done |
                     grep 'not found\|undefined symbol' | sed 's/^[[:space:]]*//; s/ (0x.*//' | sort -u |
                     head -n 5 | tr '\n\t' '; ')
    if [ ! -x "$ZTRAIN" ]; then
        row "bundle" FAIL "no $ZTRAIN (unpacking failed? see $LOG)"; summary
    elif case " $ZT_BUNDLE_MISSING " in *" GLIBC_"*) true ;; *) false ;; esac; then
        row "bundle" FAIL "glibc $(getconf GNU_LIBC_VERSION | awk '{print $2}') here, the bundle needs ${ZT_BUNDLE_GLIBC#GLIBC_} (doc/gpu.md)"; summary
    elif [ -n "$unresolved" ]; then
        row "bundle" FAIL "not found: $unresolved(see env.sh lines in $LOG)"; summary
    elif [ "$ZT_BUNDLE_OK" = 1 ]; then
        row "bundle" ok "$found"
    else
        row "bundle" ok "missing: $ZT_BUNDLE_MISSING; $found"
    fi
else
    MODE="built in $BUILD"
    ORIG_LD=${LD_LIBRARY_PATH-__unset__}
    if [ ! -x "$SRC/configure" ]; then
        run_step autoreconf 120 sh -c "cd '$SRC' && autoreconf -fi" || summary
    fi
    # NVCCFLAGS, when set, reaches configure through the environment (AC_ARG_VAR)
    run_step configure 120 sh -c "cd '$BUILD' && '$SRC/configure' -q --with-cuda='$CUDA_HOME'" || summary
    run_step make 240 make -C "$BUILD" -j"$JOBS" ztrain zt-prep-data || summary
    # (a Makefile configured without CUDA has the line commented out: no implicit-rule build)
    T_BENCH=$BUILD/tools/bench_gpu
    { grep -q '^tools_bench_gpu_SOURCES' "$BUILD/Makefile" && make -C "$BUILD" tools/bench_gpu >>"$LOG" 2>&1; } ||
        T_BENCH=""

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
    ZTRAIN=$BUILD/ztrain; PREP=$BUILD/zt-prep-data
    T_KERNELS=$BUILD/tests/gpu/test_gpu_kernels; T_NCCL=$BUILD/tests/gpu/test_nccl
    [ $TESTS_OK = 1 ] || T_KERNELS=""   # a failed build may have left a stale one
fi
command -v mpirun >/dev/null 2>&1 || { row "mpirun" FAIL "no mpirun on PATH"; summary; }

# ---- device tests -----------------------------------------------------------
HAVE_GPU=1
if [ -n "$T_KERNELS" ] && [ -x "$T_KERNELS" ]; then
    run_step "kernels vs cpu" 180 "$T_KERNELS"
    [ $? = 77 ] && HAVE_GPU=0
fi

# ---- where a GPT-2 124M step's time goes, kernel by kernel (tools/bench_gpu.c) ----------
# Here, not with the end-to-end rows at the end: it needs only the device and the kernels
# (no MPI, no data), and it is what the next session fixes kernels by, so an earlier step
# that hangs to its timeout must not starve it. Budget: ~15 s expected on an H200 (three
# matmul precisions and the cuBLASLt table, medians of 15 calls; it says so at its end),
# capped at 75 s; of the 470 s that leaves ~380 s for the rest, whose expected ~250 s (most
# of it the five 124M bench rows and the torch peer) still fit; what gives way first is
# the optional torch.compile row (it wants 200 s left). It prints as it goes: a timeout
# keeps the rows measured so far, and the summary rows below read whatever got printed.
kv() {  # line, key: the value of key=value in a bench_gpu: line
    echo "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p"
}
if [ -n "${T_BENCH:-}" ] && [ -x "$T_BENCH" ]; then
    run_step "kernel benchmark" 75 "$T_BENCH"
    for p in highest medium high; do
        line=$(grep "^bench_gpu: precision=$p " "$LOG" | tail -n 1)
        [ -n "$line" ] || continue
        row "  kernels $p" info "$(awk -v s="$(kv "$line" step_ms)" -v t="$(kv "$line" tokens_per_s)" \
            -v m="$(kv "$line" mfu)" 'BEGIN { printf "kernel-only step %.1f ms, %.0f tok/s, MFU %.1f%%", s, t, 100 * m }'); top $(kv "$line" top)"
    done
    line=$(grep '^bench_gpu: gemm_step_ms ' "$LOG" | tail -n 1)
    [ -n "$line" ] && row "  gemms per step (ms)" info "f32 $(kv "$line" f32), tf32 $(kv "$line" tf32), f32>bf16 $(kv "$line" f32_fast16bf), bf16>f32 $(kv "$line" bf16_f32out) (+cvt $(kv "$line" cvt)), bf16>bf16 $(kv "$line" bf16_bf16out)"
else
    row "kernel benchmark" SKIP "no bench_gpu binary (bundle or build without tools/bench_gpu)"
fi
if [ -x "$T_NCCL" ]; then
    # GPU lines only: with MIG on, `nvidia-smi -L` adds an indented line per instance,
    # and ranks beyond the devices CUDA enumerates would share one (test_nccl refuses)
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    [ "$ngpu" -ge 1 ] || ngpu=1
    MPIRUN="mpirun -np $ngpu --bind-to none"
    [ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root --oversubscribe"
    run_step "nccl on $ngpu rank(s)" 120 $MPIRUN "$T_NCCL"
fi

# ---- a short training run on each backend ---------------------------------------
WORK="$BUILD/gpu-check-run"
rm -rf "$WORK"
mkdir -p "$WORK"
# text that every checkout has: the project's own sources and docs
cat "$SRC"/src/*.c "$SRC"/include/*.h "$SRC"/doc/*.md >"$WORK/text.txt" 2>/dev/null
run_step "prepare data" 60 "$PREP" -o "$WORK/gpu" "$WORK/text.txt" || summary

# (mpirun binds 1 or 2 ranks to one core each by default: the offload optimizer and the CPU
# runs would get one core)
MPIRUN1="mpirun -np 1 --bind-to none"
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
    run_step "train $STEPS steps $be" 120 $MPIRUN1 "$ZTRAIN" "$SRC/inputs/tiny.cfg" \
        data.train_files="$WORK/gpu-train.h5" data.val_files="$WORK/gpu-val.h5" \
        train.max_steps="$STEPS" train.sample_tokens=0 train.eval_steps=0 \
        train.output_dir="$WORK/run-$be" checkpoint.save_at_end=false parallel.backend=$be train.bf16=false \
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
    run_step "train cuda zero3 offload" 120 $MPIRUN1 "$ZTRAIN" "$SRC/inputs/tiny.cfg" \
        data.train_files="$WORK/gpu-train.h5" data.val_files="$WORK/gpu-val.h5" \
        train.max_steps="$STEPS" train.sample_tokens=0 train.eval_steps=0 checkpoint.save_at_end=false \
        parallel.backend=cuda parallel.strategy=zero3 parallel.offload_optimizer=cpu parallel.offload_param=cpu \
        train.output_dir="$WORK/run-offload" train.bf16=false \
        train.matmul_precision="$([ "${ZT_CUDA_TF32:-0}" = 1 ] && echo high || echo highest)"
    same_loss "loss cuda vs cuda offload" "$loss_cuda" "$(last_loss "$WORK/run-offload/metrics.jsonl")"
    # generation with the KV cache, 4 prompts at once on the GPU (per-sequence cache slots,
    # the one-query block kernel per row, the batched head) against one at a time on the
    # CPU, greedy, generate.sh's seeded tiny Llama and qwen tokenizer (answers that differ
    # by prompt): a wrong slot or row garbles every answer, while the GPU's other rounding
    # may flip a near tie in one or two of the 6
    for i in 1 2 3 4 5 6; do printf '{"instruction": "prompt %d: %s"}\n' "$i" "$(printf 'rank model %.0s' $(seq $i))"; done \
        >"$WORK/prompts.jsonl"
    for be in cpu cuda; do
        b=1
        [ $be = cuda ] && b=4
        run_step "generate $be, batch $b" 60 $MPIRUN1 "$ZTRAIN" --generate "$SRC/inputs/tiny.cfg" model.arch=llama \
            model.n_head=4 model.n_kv_head=2 model.intermediate_size=48 model.vocab_size=3520 model.block_size=64 \
            data.seq_len=48 data.tokenizer="$SRC/tests/reference/sft/tok/qwen" data.template=qwen \
            generate.prompts_file="$WORK/prompts.jsonl" generate.max_new_tokens=16 generate.batch_size=$b \
            parallel.backend=$be train.bf16=false train.matmul_precision=highest train.output_dir="$WORK/gen-$be"
    done
    if [ -f "$WORK/gen-cpu/generations.jsonl" ] && [ -f "$WORK/gen-cuda/generations.jsonl" ]; then
        same=$(paste -d '\n' "$WORK/gen-cpu/generations.jsonl" "$WORK/gen-cuda/generations.jsonl" |
            awk 'NR % 2 { a = $0; next } { n += (a == $0) } END { print n + 0 }')
        if [ "$same" -ge 4 ]; then row "generate cuda batch = cpu" ok "$same/6 answers identical"
        else row "generate cuda batch = cpu" FAIL "$same/6 answers identical"; fi
    else
        row "generate cuda batch = cpu" SKIP "a generation run failed (see above)"
    fi
fi

# ---- two ranks on two GPUs: the collectives of the shard engine through NCCL ----
if [ $HAVE_GPU = 1 ] && [ "${ngpu:-1}" -ge 2 ]; then
    MPIRUN2="mpirun -np 2 --bind-to none"
    [ "$(id -u)" = 0 ] && MPIRUN2="$MPIRUN2 --allow-run-as-root"
    base="$SRC/inputs/tiny.cfg data.train_files=$WORK/gpu-train.h5 data.val_files=$WORK/gpu-val.h5
          train.max_steps=$STEPS train.sample_tokens=0 train.eval_steps=0 checkpoint.save_at_end=false
          train.bf16=false"
    # the same global batch (4 sequences): one CPU rank accumulating 2 micro-steps
    # shellcheck disable=SC2086
    run_step "train ref cpu, 1 rank" 120 $MPIRUN1 "$ZTRAIN" $base train.gradient_accumulation_steps=2 \
        train.output_dir="$WORK/run-ref2" parallel.backend=cpu
    ref=$(last_loss "$WORK/run-ref2/metrics.jsonl")
    for st in "ddp flat" "zero3 flat" "zero2 per_param"; do
        # shellcheck disable=SC2086
        set -- $st
        # shellcheck disable=SC2086
        run_step "train cuda 2 ranks $1 $2" 120 $MPIRUN2 "$ZTRAIN" $base parallel.backend=cuda \
            parallel.strategy=$1 parallel.shard_layout=$2 train.output_dir="$WORK/run-2-$1-$2"
        same_loss "loss cpu vs 2 gpus $1 $2" "$ref" "$(last_loss "$WORK/run-2-$1-$2/metrics.jsonl")"
    done
    # ring attention (sp 2 x dp 1: the same 4 sequences in 2 micro-steps): its block
    # kernels and the K|V ring over NCCL
    # shellcheck disable=SC2086
    run_step "train cuda 2 ranks ring sp 2" 120 $MPIRUN2 "$ZTRAIN" $base parallel.backend=cuda \
        parallel.sequence_parallel_size=2 parallel.sp_mode=ring train.gradient_accumulation_steps=2 \
        train.output_dir="$WORK/run-2-ring"
    same_loss "loss cpu vs 2 gpus ring sp 2" "$ref" "$(last_loss "$WORK/run-2-ring/metrics.jsonl")"
    # a pipeline (pp 2, 1f1b over the same 4 sequences in 2 micro-batches): its activations
    # and gradients through NCCL in the planned stream order (zt_schedule_plan_in_order)
    # shellcheck disable=SC2086
    run_step "train cuda 2 ranks pp 2" 120 $MPIRUN2 "$ZTRAIN" $base parallel.backend=cuda \
        parallel.pipeline_parallel_size=2 train.gradient_accumulation_steps=2 train.output_dir="$WORK/run-2-pp"
    if grep -q "pipeline: nccl messages in stream order" "$LOG"; then
        same_loss "loss cpu vs 2 gpus pp 2" "$ref" "$(last_loss "$WORK/run-2-pp/metrics.jsonl")"
    else
        row "loss cpu vs 2 gpus pp 2" FAIL "no 'pipeline: nccl messages in stream order' line in $LOG"
    fi
elif [ $HAVE_GPU = 1 ]; then
    row "train cuda 2 ranks (pp 2...)" SKIP "${ngpu:-1} GPU(s) visible: the 2-rank runs need 2"
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
    if run_step "bench $name" 75 $MPIRUN1 "$ZTRAIN" "$SRC/inputs/gpt2-124m.cfg" \
        data.train_files="$WORK/gpu-train.h5" data.val_files=[] data.seq_len=1024 \
        train.per_device_train_batch_size="${ZT_BENCH_B:-8}" train.max_steps="$BENCH_STEPS" \
        train.logging_steps=10 train.eval_steps=0 train.sample_tokens=0 checkpoint.save_at_end=false \
        parallel.backend=cuda train.peak_tflops="$PEAK" train.output_dir="$dir" "$@"; then
        tps=$(field "$dir/metrics.jsonl" tokens_per_s); mfu=$(field "$dir/metrics.jsonl" mfu)
        st=$(field "$dir/metrics.jsonl" step_s)
        # where GELU ran (cuBLASLt's epilogue below fp32 when its probe accepted it)
        gelu=$(grep -o 'gelu: .*' "$LOG" | tail -n 1)
        row "  $name" info "$(awk -v t="$tps" -v m="$mfu" -v s="$st" 'BEGIN {
            printf "%.0f tok/s, MFU %.1f%%, step %.1f ms", t, 100 * m, 1000 * s }'); ${gelu:-gelu: ?}"
        eval "step_$(echo "$name" | tr -c 'a-z0-9\n' '_')=$st"
    fi
}
# The PyTorch peer at the same B and T (tools/torch_gpt2_gpu.py: bf16 autocast, flash
# attention, fused AdamW; median step after warm-up), under the environment it came with:
# the bundle's libraries (OpenSSL, zlib, libffi...) are not for the target's Python.
if [ "$ORIG_LD" = __unset__ ]; then TORCH_ENV="-u LD_LIBRARY_PATH"; else TORCH_ENV="LD_LIBRARY_PATH=$ORIG_LD"; fi
torch_bench() {  # name, timeout_s, extra arguments: one row of figures
    name=$1; t=$2; shift 2
    if ! command -v python3 >/dev/null 2>&1; then row "bench torch $name" SKIP "no python3"; return 1; fi
    # shellcheck disable=SC2086
    if run_step "bench torch $name" "$t" env $TORCH_ENV python3 "$SRC/tools/torch_gpt2_gpu.py" \
        --batch "${ZT_BENCH_B:-8}" --seq 1024 --warmup 5 --steps 15 --peak-tflops "$PEAK" "$@"; then
        line=$(grep '^torch_gpt2_gpu: ' "$LOG" | tail -n 1)
        get() { echo "$line" | sed -n "s/.* $1 \([^ ]*\).*/\1/p"; }
        row "  torch $name" info "$(awk -v t="$(get tokens_per_s)" -v m="$(get mfu)" -v s="$(get median_step_ms)" \
            'BEGIN { printf "%.0f tok/s, MFU %.1f%%, step %.1f ms", t, 100 * m, s }') (torch $(get torch), sdpa $(get sdpa))"
        eval "torch_step_$(echo "$name" | tr -c 'a-z0-9\n' '_')=$(get median_step_ms)"
    fi
}
if [ $HAVE_GPU = 1 ]; then
    bench "bf16 ddp" train.bf16=true parallel.strategy=ddp
    bench "bf16 zero3" train.bf16=true parallel.strategy=zero3
    torch_bench "bf16" 90
    # shellcheck disable=SC2154
    if [ -n "${step_bf16_ddp:-}" ] && [ -n "${torch_step_bf16:-}" ]; then
        row "ztrain / torch step time" info "$(awk -v a="$step_bf16_ddp" -v b="$torch_step_bf16" \
            'BEGIN { printf "%.2f (bf16 ddp against torch eager; < 1 is faster)", 1000 * a / b }')"
    fi
    bench "bf16 zero3 offload" train.bf16=true parallel.strategy=zero3 parallel.offload_optimizer=cpu
    bench "fp32 ddp" parallel.strategy=ddp train.bf16=false train.matmul_precision=highest
    bench "tf32 ddp" parallel.strategy=ddp train.bf16=false train.matmul_precision=high
    # ZeRO-Offload's promise on the device: GPT-2 124M trains without offload (bf16 zero2),
    # a 4x larger one (66 layers, 506M parameters) with offload_optimizer in LESS device
    # memory, by the CUDA pool's high-water mark (device_peak_bytes); a few steps each
    fit_run() {  # name, key=value...
        _fit=$1; shift
        run_step "fit $_fit" 120 $MPIRUN1 "$ZTRAIN" "$SRC/inputs/gpt2-124m.cfg" \
            data.train_files="$WORK/gpu-train.h5" data.val_files=[] data.seq_len=128 \
            train.per_device_train_batch_size=1 train.max_steps=3 train.eval_steps=0 train.sample_tokens=0 \
            checkpoint.save_at_end=false parallel.backend=cuda train.bf16=true parallel.strategy=zero2 \
            train.output_dir="$WORK/fit-$_fit" "$@"
    }
    jnum() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1" 2>/dev/null | tail -n 1; }
    if fit_run small && fit_run 4x-offload model.n_layer=66 parallel.offload_optimizer=cpu; then
        ps=$(jnum "$WORK/fit-small/metrics.jsonl" parameters); ds=$(jnum "$WORK/fit-small/metrics.jsonl" device_peak_bytes)
        pl=$(jnum "$WORK/fit-4x-offload/metrics.jsonl" parameters); dl=$(jnum "$WORK/fit-4x-offload/metrics.jsonl" device_peak_bytes)
        verdict=$(awk -v ps="${ps:-0}" -v ds="${ds:-0}" -v pl="${pl:-0}" -v dl="${dl:-0}" 'BEGIN {
            ok = ps > 0 && ds > 0 && pl >= 4 * ps && dl < ds
            printf "%s %.2fx the parameters in %.2fx the device memory (%.2f vs %.2f GiB peak)", ok ? "ok" : "FAIL",
                   ps ? pl / ps : 0, ds ? dl / ds : 0, dl / 2^30, ds / 2^30 }')
        row "offload: 4x model fits" "${verdict%% *}" "${verdict#* }"
    fi
    # torch.compile spends a minute or more compiling: only with time to spare
    if [ "${ZT_TORCH_COMPILE:-}" = 1 ] || { [ "${ZT_TORCH_COMPILE:-}" != 0 ] && [ "$(time_left)" -ge 200 ]; }; then
        torch_bench "bf16 compiled" 180 --compile
    else
        row "bench torch bf16 compiled" SKIP "$(time_left) s left of the budget (ZT_TORCH_COMPILE=1 forces it)"
    fi
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
