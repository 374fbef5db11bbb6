#!/bin/sh
# build.sh [BUILDDIR [configure args...]] — configure (once) and build out of tree.
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build}
[ $# -gt 0 ] && shift
[ -x configure ] || autoreconf -fi
mkdir -p "$dir"
if [ ! -f "$dir/Makefile" ]; then
    (cd "$dir" && ../configure "$@")
fi
make -C "$dir" -j"$(nproc)"
