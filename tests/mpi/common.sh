# common.sh — sourced by every tests/mpi/*.sh script (POSIX sh).
#
# Gives each test: ZT_SRCDIR / ZT_BUILDDIR (set by `make check`, guessed from the
# script's location otherwise), $ZTRAIN, a private temp dir $ZT_TMP removed at
# exit (kept when ZT_KEEP_TMP=1 or the test failed, so a failure can be
# inspected), and helpers:
#   fail "msg"                         print FAIL and exit 1
#   skip "why"                         print SKIP and exit 77 (automake's skip)
#   at_exit "cmd"                      run cmd when the test ends (daemons, ...)
#   run_ztrain NP args...              run ztrain on NP ranks; output in $ZT_OUT,
#                                      exit status in $ZT_RC; fails the test
#                                      unless it exits 0
#   run_ztrain_rc NP args...           same, but returns the exit status instead
#   run_ztrain_bg NP args...           run_ztrain in the background (two one-rank runs
#                                      use both cores); its output file in $ZT_BG_OUT
#   ztrain_wait                        waits for those runs, prints their outputs in
#                                      start order ($ZT_OUT: a copy of the last's),
#                                      fails unless each exited 0
#   expect_fail_with NP "text" args... ztrain must exit non-zero (and not time
#                                      out) with "text" (fixed string) in its output
#   make_tiny_data DIR                 DIR/tiny-train.h5 and DIR/tiny-val.h5
#                                      from a generated text via zt-prep-data
#   assert_contains FILE "text"        fixed-string grep or fail
#   venv_check LABEL SCRIPT ARGS...    queue a Python check (torch, transformers, peft)
#   venv_check_fails LABEL SCRIPT ARGS... queue a check that must fail (LABEL if it passes)
#   venv_checks_run PYTHON             run the queued checks in one interpreter
#                                      (pybatch.py); fails naming each that failed
#   layout_runs "NP STRATEGY LAYOUT ACCUM [k=v]"... -- ARGS
#                                      one run per strategy/layout, 4 sequences a step;
#                                      their output_dirs in $LAYOUT_RUNS
# Every run goes through zt_mpirun.sh, so timeouts and container settings are
# the same everywhere. Every run is given the MFU denominator (train.peak_tflops=0.1)
# instead of measuring it (src/zt_mfu.c: 0.4 s a run, hundreds of runs a suite): no
# test checks an MFU figure; a test that wants the probe sets ZT_MEASURE_PEAK=1.

ZT_TEST_NAME=$(basename "$0" .sh)
: "${ZT_SRCDIR:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${ZT_BUILDDIR:=$ZT_SRCDIR}"
: "${OMP_NUM_THREADS:=1}" "${OPENBLAS_NUM_THREADS:=1}"
# The CPU GEMMs stay fp32 in every test unless it says otherwise: the tolerances of
# bf16.sh, fp16.sh and families.sh were derived for fp32 GEMMs on 16-bit parameters, and
# a CPU with bf16 units would otherwise run train.bf16's GEMMs in bf16 (oneDNN).
# bf16_dnnl.sh tests that path (ZT_DNNL=force) with its own tolerances.
: "${ZT_DNNL:=off}"
export ZT_SRCDIR ZT_BUILDDIR OMP_NUM_THREADS OPENBLAS_NUM_THREADS ZT_DNNL
ZTRAIN="$ZT_BUILDDIR/ztrain"
ZT_PREP_DATA="$ZT_BUILDDIR/zt-prep-data"
ZT_MPIRUN="$ZT_SRCDIR/tests/mpi/zt_mpirun.sh"

ZT_TMP=$(mktemp -d "${TMPDIR:-/tmp}/zt-$ZT_TEST_NAME.XXXXXX") || { echo "FAIL: mktemp" >&2; exit 1; }
ZT_OUT="$ZT_TMP/last.out"
ZT_RC=0
ZT_AT_EXIT=""
ZT_FAILED=0

at_exit() {
    ZT_AT_EXIT="$1
$ZT_AT_EXIT"
}

zt_cleanup() {
    rc=$?
    trap - EXIT
    # Commands run newest first, like destructors.
    [ -n "$ZT_AT_EXIT" ] && eval "$ZT_AT_EXIT"
    if [ "${ZT_KEEP_TMP:-0}" = 1 ] || [ "$ZT_FAILED" = 1 ]; then
        echo "$ZT_TEST_NAME: files kept in $ZT_TMP" >&2
    else
        rm -rf "$ZT_TMP"
    fi
    exit $rc
}
trap zt_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    ZT_FAILED=1
    echo "FAIL: $ZT_TEST_NAME: $*" >&2
    exit 1
}

skip() {
    echo "SKIP: $ZT_TEST_NAME: $*" >&2
    exit 77
}

assert_contains() {
    grep -qF -- "$2" "$1" || fail "expected '$2' in $1"
}

zt_need_ztrain() {
    [ -x "$ZTRAIN" ] || fail "$ZTRAIN not built (ZT_BUILDDIR=$ZT_BUILDDIR)"
}

# zt_peak_arg ARGS...: the override put before a run's own ARGS (so theirs wins); none for
# the modes that never probe (their output, --print-config's above all, stays the input's);
# --generate sets up as a training run does, probe included
zt_peak_arg() {
    [ "${ZT_MEASURE_PEAK:-0}" = 1 ] && return 0
    for zt_a in "$@"; do
        case $zt_a in --print-config | --estimate-memory | --help | -h | --version | --*-markdown) return 0 ;; esac
    done
    echo "train.peak_tflops=0.1"
}

run_ztrain_rc() {
    zt_need_ztrain
    np=$1
    shift
    echo "+ zt_mpirun.sh $np ztrain $*"
    # shellcheck disable=SC2046
    sh "$ZT_MPIRUN" "$np" "$ZTRAIN" $(zt_peak_arg "$@") "$@" >"$ZT_OUT" 2>&1
    ZT_RC=$?
    cat "$ZT_OUT"
    return $ZT_RC
}

run_ztrain() {
    run_ztrain_rc "$@"
    [ "$ZT_RC" -eq 0 ] || fail "ztrain on $1 ranks exited with $ZT_RC"
}

# run_ztrain_bg / ztrain_wait: independent runs side by side. The one-rank runs of a test
# (references) each use one core of two; a test starts two, then waits for both.
ZT_BG=""
run_ztrain_bg() {
    zt_need_ztrain
    np=$1
    shift
    ZT_BG_OUT=$(mktemp "$ZT_TMP/bg.XXXXXX") || fail "mktemp"
    # an Open MPI temporary directory of its own (orte_tmpdir_base): two mpiruns started
    # together race to create the shared one (/tmp/ompi.HOST.UID), and the loser fails in
    # orte_init ("File exists")
    zt_sd=$(mktemp -d "$ZT_TMP/ompi.XXXXXX") || fail "mktemp"
    echo "+ zt_mpirun.sh $np ztrain $* (in the background)"
    # shellcheck disable=SC2046
    ZT_MPIRUN_ARGS="${ZT_MPIRUN_ARGS:-} --mca orte_tmpdir_base $zt_sd" \
        sh "$ZT_MPIRUN" "$np" "$ZTRAIN" $(zt_peak_arg "$@") "$@" >"$ZT_BG_OUT" 2>&1 &
    [ -n "${ZT_BG_REAP:-}" ] || { at_exit zt_bg_reap; ZT_BG_REAP=1; }
    ZT_BG="$ZT_BG $!:$ZT_BG_OUT"
}
# at exit (a failure between a start and ztrain_wait): waits for the runs still going, which
# end within zt_mpirun.sh's time limit, before $ZT_TMP is removed under them (killing the
# shell would leave its mpirun running)
zt_bg_reap() {
    for zt_job in $ZT_BG; do wait "${zt_job%%:*}"; done
    return 0
}
ztrain_wait() {
    zt_bad=""
    for zt_job in $ZT_BG; do
        wait "${zt_job%%:*}"
        ZT_RC=$?
        cat "${zt_job#*:}"
        # $ZT_OUT stays the file the next run writes: the last run's output is copied there
        cp "${zt_job#*:}" "$ZT_OUT" || fail "cp"
        [ $ZT_RC -eq 0 ] || zt_bad="$zt_bad ${zt_job#*:}:$ZT_RC"
    done
    ZT_BG=""
    [ -z "$zt_bad" ] || fail "a background ztrain run exited non-zero (output:status):$zt_bad"
}

# every_rank_exits NP CODE WHAT args...: ztrain on NP ranks with Open MPI told not to kill the
# job at the first non-zero exit, so that each rank's own exit status is seen; fails the test
# unless every rank exits CODE without a timeout or a crash (WHAT names the case in messages)
every_rank_exits() {
    np=$1 code=$2 what=$3
    shift 3
    rcdir=$(mktemp -d "$ZT_TMP/rc.XXXXXX") || fail "mktemp"
    # shellcheck disable=SC2016
    # shellcheck disable=SC2046
    ZT_MPIRUN_ARGS="--mca orte_abort_on_non_zero_status 0" sh "$ZT_MPIRUN" "$np" sh -c \
        '"$@"; rc=$?; echo $rc >"'"$rcdir"'/rank-$OMPI_COMM_WORLD_RANK"; exit $rc' sh \
        "$ZTRAIN" $(zt_peak_arg "$@") "$@" >"$ZT_OUT" 2>&1
    grep -qF "zt_mpirun.sh: TIMEOUT" "$ZT_OUT" && fail "the job hung $what"
    r=0
    while [ $r -lt "$np" ]; do
        [ "$(cat "$rcdir/rank-$r" 2>/dev/null)" = "$code" ] ||
            { cat "$ZT_OUT"; fail "rank $r exited $(cat "$rcdir/rank-$r" 2>/dev/null) $what, expected $code"; }
        r=$((r + 1))
    done
    grep -qiE "segmentation fault|signal 11|FATAL" "$ZT_OUT" && { cat "$ZT_OUT"; fail "a rank crashed $what"; }
    return 0
}

expect_fail_with() {
    np=$1
    text=$2
    shift 2
    run_ztrain_rc "$np" "$@"
    grep -qF "zt_mpirun.sh: TIMEOUT" "$ZT_OUT" && fail "ztrain hung instead of failing with '$text'"
    [ "$ZT_RC" -ne 0 ] || fail "ztrain exited 0, expected a failure with '$text'"
    grep -qF -- "$text" "$ZT_OUT" || fail "ztrain exited $ZT_RC without the expected message '$text'"
    echo "ok: failed with $ZT_RC and '$text'"
}

# venv_check LABEL SCRIPT ARGS...: queues SCRIPT ARGS (run in the directory current at
# venv_checks_run) under LABEL, the failure it reports. venv_checks_run PYTHON: runs the
# queued checks with one import of torch, transformers and peft (each still in a process of
# its own: tests/mpi/pybatch.py), every one whatever the others do, and fails the test
# naming each that failed. An import of torch and transformers costs seconds of CPU, once
# a test instead of once a check.
venv_check() {
    [ -s "$ZT_TMP/venv-checks" ] && echo ":::" >>"$ZT_TMP/venv-checks"
    printf '%s\n' "$@" >>"$ZT_TMP/venv-checks"
}
# venv_check_fails LABEL SCRIPT ARGS...: queues a check that must exit non-zero (its output
# discarded); LABEL is the failure reported when it exits 0.
venv_check_fails() {
    zt_label=$1
    shift
    venv_check "!$zt_label" "$@"
}
venv_checks_run() {
    [ -s "$ZT_TMP/venv-checks" ] || return 0
    "$1" "$ZT_SRCDIR/tests/mpi/pybatch.py" "@$ZT_TMP/venv-checks" ||
        { rm -f "$ZT_TMP/venv-checks"; fail "the Python checks named FAILED above"; }
    rm -f "$ZT_TMP/venv-checks"
}

# A deterministic English-like text (about 40 KB) made of pseudo-random words,
# so every run and every machine gets the same tokens.
make_tiny_text() {
    awk 'BEGIN {
        split("the a model rank shard step loss token gradient of to and in is with for " \
              "train data parallel sum reduce gather scatter memory batch layer head", w, " ");
        n = 26; s = 12345;
        for (line = 0; line < 800; line++) {
            out = "";
            len = 5 + line % 7;
            for (i = 0; i < len; i++) {
                s = (s * 69069 + 1) % 4294967296;  # exact in double precision
                out = out (i ? " " : "") w[1 + int(s / 65536) % n];
            }
            print toupper(substr(out, 1, 1)) substr(out, 2) ".";
        }
    }'
}

make_tiny_data() {
    dir=$1
    mkdir -p "$dir" || fail "cannot create $dir"
    [ -x "$ZT_PREP_DATA" ] || fail "$ZT_PREP_DATA not built"
    make_tiny_text >"$dir/tiny.txt"
    "$ZT_PREP_DATA" --val-fraction 0.1 -o "$dir/tiny" "$dir/tiny.txt" >"$dir/prep.log" 2>&1 ||
        { cat "$dir/prep.log"; fail "zt-prep-data failed on $dir/tiny.txt"; }
    [ -s "$dir/tiny-train.h5" ] && [ -s "$dir/tiny-val.h5" ] ||
        fail "zt-prep-data did not write $dir/tiny-train.h5 and $dir/tiny-val.h5"
}

# need_h5py: the tests that compare checkpoints need Debian's python3 with h5py.
# Sets PY (that python), CHECK (resume_check.py) and ZT_CKPT (the zt-ckpt tool).
need_h5py() {
    PY=${PYTHON3:-/usr/bin/python3}
    [ -x "$PY" ] && "$PY" -c "import h5py" 2>/dev/null ||
        skip "python3 with h5py is needed to compare checkpoints (tools/install-deps.sh installs it)"
    CHECK="$ZT_SRCDIR/tests/mpi/resume_check.py"
    ZT_CKPT="$ZT_BUILDDIR/zt-ckpt"
    [ -x "$ZT_CKPT" ] || fail "$ZT_CKPT not built"
}

# batch_args NP: per-device batch and accumulation that make a global batch of 12
# sequences on NP = 1..4 ranks, so runs at different world sizes see the same samples.
batch_args() {
    case $1 in
        1) echo "train.per_device_train_batch_size=2 train.gradient_accumulation_steps=6" ;;
        2) echo "train.per_device_train_batch_size=2 train.gradient_accumulation_steps=3" ;;
        3) echo "train.per_device_train_batch_size=2 train.gradient_accumulation_steps=2" ;;
        4) echo "train.per_device_train_batch_size=3 train.gradient_accumulation_steps=1" ;;
        *) fail "batch_args: no split of 12 for $1 ranks" ;;
    esac
}

# tiny_comparison_setup: tiny data in $ZT_TMP/data, cd $ZT_TMP, and $common, the
# base arguments of the runs that are compared with each other (20 steps of the tiny
# model, no evaluation or sample, warm-up 3, lr 3e-3): equivalence, bf16, reshard.
tiny_comparison_setup() {
    make_tiny_data "$ZT_TMP/data"
    cd "$ZT_TMP" || fail "cd"
    common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=20 optim.warmup_steps=3 optim.learning_rate=3e-3"
}

# lora_setup: in the current directory, tok67.h5 (random tokens of the 67-word vocabulary
# of tests/reference/hf's llama and gpt2) and lora.cfg, the base of the LoRA runs: 2 steps
# of 2 sequences of 8 tokens at learning rate 0, rank 4 and alpha 8 as PEFT's adapters
# there (lora.sh, lora_tp.sh). Needs need_h5py.
# layout_runs "NP STRATEGY LAYOUT ACCUM [key=value ...]" ... -- ARGS: one run of ztrain ARGS per
# spec, 4 sequences a step (NP ranks x 4/NP/ACCUM per device x ACCUM), each into output_dir
# npNP-STRATEGY-LAYOUT<its keys>; their names in $LAYOUT_RUNS (for compare_runs.py).
layout_runs() {
    LAYOUT_RUNS=""
    specs=""
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        specs="$specs$1
"
        shift
    done
    shift
    args="$*" # ARGS are split again below: no spaces inside one
    old_ifs=$IFS
    IFS='
'
    for spec in $specs; do
        IFS=$old_ifs
        # shellcheck disable=SC2086
        set -- $spec
        np=$1 st=$2 layout=$3 A=$4
        shift 4
        out="np$np-$st-$layout$(echo "$*" | tr -cd 'a-z0-9')"
        # shellcheck disable=SC2086
        run_ztrain "$np" $args parallel.strategy="$st" parallel.shard_layout="$layout" \
            train.per_device_train_batch_size=$((4 / np / A)) train.gradient_accumulation_steps="$A" \
            train.output_dir="$out" "$@" >/dev/null
        LAYOUT_RUNS="$LAYOUT_RUNS $out"
    done
    IFS=$old_ifs
}

lora_setup() {
    "$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens tok67.h5 67 20000 || fail "cannot make the token file"
    cat >lora.cfg <<'EOF'
data = { train_files = "tok67.h5"; val_files = []; seq_len = 8; };
train = { per_device_train_batch_size = 2; max_steps = 2; logging_steps = 1; sample_tokens = 0;
          finetuning_type = "lora"; };
lora = { rank = 4; alpha = 8.0; };
optim = { learning_rate = 0.0; warmup_steps = 0; };
checkpoint = { hf_dtype = "fp32"; };
log = { plot = false; };
EOF
}

# resume_exact NP NAME [key=value...]: 20 steps at once (NAME-full) vs 10 + 10 in one
# output_dir (NAME-split), with $common as the base arguments; the caller compares
# them (resume_check.py exact). $common needs a learning-rate schedule that does not
# depend on max_steps (constant after warm-up). Needs need_h5py.
resume_exact() {
    np=$1
    name=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" $common "$@" train.max_steps=20 train.output_dir="$name-full" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain "$np" $common "$@" train.max_steps=10 train.output_dir="$name-split" >/dev/null
    [ -e "$name-split/ckpt-00000010.h5" ] || [ -d "$name-split/ckpt-00000010.shards" ] ||
        fail "$name: no checkpoint of step 10 in $name-split"
    # shellcheck disable=SC2086
    run_ztrain "$np" $common "$@" train.max_steps=20 checkpoint.resume=auto train.output_dir="$name-split" >/dev/null
    assert_contains "$ZT_OUT" "resumed from $name-split/ckpt-00000010"
    assert_contains "$ZT_OUT" ": step 10,"
    "$PY" "$CHECK" steps "$name-split" 11 20 || fail "$name: resumed run did not log steps 11..20 once each"
}
