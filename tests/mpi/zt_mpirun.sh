#!/bin/sh
# zt_mpirun.sh — the one launcher for multi-rank tests: zt_mpirun.sh NP cmd args...
#
# Everything a test needs to run in a container, on a laptop or in CI is here
# and nowhere else: oversubscription (tests run more ranks than cores), root
# (containers), shared-memory transport only (no network needed; the vader
# single-copy mechanism is off because CMA/ptrace is often forbidden in
# containers), one thread per rank (2 ranks x N threads on 2 cores would make
# timings meaningless), no binding (ranks would pile onto one core when
# oversubscribed), and a timeout so that a hung test fails instead of hanging CI.
#
# Environment: ZT_TEST_TIMEOUT (seconds, default 300), ZT_MPIRUN_ARGS (extra
# mpirun options, e.g. "--mca btl self,tcp"), OMP_NUM_THREADS and
# OPENBLAS_NUM_THREADS (default 1). Exit status: the command's, or 124 after
# printing "zt_mpirun.sh: TIMEOUT" when the time limit was hit.
set -u
if [ $# -lt 2 ]; then
    echo "usage: zt_mpirun.sh NP cmd [args...]" >&2
    exit 2
fi
np=$1
shift
timeout_s=${ZT_TEST_TIMEOUT:-300}
: "${OMP_NUM_THREADS:=1}" "${OPENBLAS_NUM_THREADS:=1}"
export OMP_NUM_THREADS OPENBLAS_NUM_THREADS

root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"

# Open MPI prints a help text about missing InfiniBand/UCX devices otherwise.
OMPI_MCA_btl_base_warn_component_unused=0
export OMPI_MCA_btl_base_warn_component_unused

start=$(date +%s)
# shellcheck disable=SC2086 # ZT_MPIRUN_ARGS is a list of options on purpose
timeout -k 10 "$timeout_s" mpirun $root --oversubscribe --bind-to none \
    --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS ${ZT_MPIRUN_ARGS:-} \
    -np "$np" "$@"
rc=$?
# timeout(1) returns 124 (137 after -k) when it fired, but the command can
# return those codes itself (the watchdog exits 124): the clock tells them apart.
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    if [ $(($(date +%s) - start)) -ge "$timeout_s" ]; then
        echo "zt_mpirun.sh: TIMEOUT: killed after ${timeout_s} s (ZT_TEST_TIMEOUT): $*" >&2
    fi
fi
exit $rc
