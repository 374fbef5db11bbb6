#!/bin/sh
# quickstart.sh — README's first command: install the Debian packages, build
# ztrain in build/, make the default data set, and train the default model on
# 2 MPI ranks (about two minutes on 2 cores).
set -eu
cd "$(dirname "$0")/.."
sh tools/install-deps.sh
sh tools/build.sh build
sh tools/gen-data.sh build data
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
exec mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np 2 build/ztrain inputs/default.cfg "$@"
