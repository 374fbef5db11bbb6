#!/bin/sh
# mpirun-hostfile.sh — ztrain on a set of machines without a batch system.
#
#   jobs/mpirun-hostfile.sh [section.key=value ...]
#
# The hostfile lists one machine per line with its slot count (see
# jobs/hosts.example); every machine must see the same ZTRAIN path, input and
# data (a shared file system), and reach the others over ssh without a password.
# Site settings can be set in the environment; nothing is built here.

# ==== site settings ===========================================================
ZTRAIN=${ZTRAIN:-$HOME/ztrain/build/ztrain}
CONFIG=${CONFIG:-inputs/gpt2-124m.cfg}
HOSTFILE=${HOSTFILE:-jobs/hosts}          # copy jobs/hosts.example
RANKS_PER_NODE=${RANKS_PER_NODE:-4}
THREADS=${THREADS:-1}                     # OpenMP threads per rank
NODES=${NODES:-$(grep -cv '^[[:space:]]*\(#\|$\)' "$HOSTFILE" 2>/dev/null)}
MPIRUN_ARGS=${MPIRUN_ARGS:-}              # e.g. "--mca btl_tcp_if_include eth0"
# ==============================================================================

set -eu
[ -x "$ZTRAIN" ] || { echo "mpirun-hostfile.sh: ZTRAIN=$ZTRAIN is not an executable" >&2; exit 1; }
[ -r "$HOSTFILE" ] || { echo "mpirun-hostfile.sh: no hostfile $HOSTFILE (see jobs/hosts.example)" >&2; exit 1; }
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
ldpath=""
[ -n "${LD_LIBRARY_PATH:-}" ] && ldpath="-x LD_LIBRARY_PATH"
np=$((NODES * RANKS_PER_NODE))
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
echo "mpirun-hostfile.sh: $NODES nodes x $RANKS_PER_NODE ranks x $THREADS threads from $HOSTFILE"
# ppr = processes per resource: the same number of ranks on every node, each
# bound to THREADS cores (PE = processing elements per rank).
# shellcheck disable=SC2086
exec mpirun $root -hostfile "$HOSTFILE" -np "$np" \
    --map-by "ppr:$RANKS_PER_NODE:node:PE=$THREADS" --bind-to core \
    -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -x PATH $ldpath $MPIRUN_ARGS \
    "$ZTRAIN" "$CONFIG" "$@"
