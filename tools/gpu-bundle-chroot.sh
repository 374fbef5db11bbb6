#!/bin/sh
# gpu-bundle-chroot.sh — proves a GPU bundle (tools/gpu-bundle.sh) self-contained before a GPU
# session is spent on it: in a minimal Debian root (debootstrap minbase: no MPI, HDF5,
# libconfig, OpenBLAS, CUnit, ssh or Python) with CUDA's runtime libraries laid out the way
# the pip nvidia-* packages lay them out, it runs tools/gpu-check.sh from a copy of the
# checkout (the GPU rows must SKIP: no driver here), then 2-rank CPU training with a
# checkpoint saved, read back by zt-ckpt, and resumed. Needs root (chroot, mounts in a
# private mount namespace, so nothing is left mounted).
#
#   tools/gpu-bundle-chroot.sh [ROOT]     (default /tmp/chroot-bundle; made if missing)
#   env: ZT_GPU_BUNDLE (default <repo>/gpu-bundle), CUDA_HOME (default /usr/local/cuda),
#        ZT_DEBIAN_MIRROR (default http://deb.debian.org/debian)
set -eu

SRC=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${1:-/tmp/chroot-bundle}
BUNDLE=${ZT_GPU_BUNDLE:-$SRC/gpu-bundle}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ "$(id -u)" = 0 ] || { echo "gpu-bundle-chroot: needs root" >&2; exit 1; }
[ -f "$BUNDLE/env.sh" ] || { echo "gpu-bundle-chroot: no bundle in $BUNDLE (run tools/gpu-bundle.sh)" >&2; exit 1; }

if [ ! -x "$ROOT/bin/sh" ]; then
    command -v debootstrap >/dev/null || { echo "gpu-bundle-chroot: apt-get install debootstrap" >&2; exit 1; }
    debootstrap --variant=minbase bookworm "$ROOT" "${ZT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
fi

# the checkout as the device tool copies it: tracked files, plus the carried bundle
rm -rf "$ROOT/work" "$ROOT/tmp/ztrain-bundle" "$ROOT/tmp/gc" "$ROOT/tmp/out" "$ROOT/tmp/run2"
mkdir -p "$ROOT/work/repo" "$ROOT/tmp/out"
(cd "$SRC" && git ls-files -z | xargs -0 tar cf -) | tar xf - -C "$ROOT/work/repo"
cp -r "$BUNDLE" "$ROOT/work/repo/gpu-bundle"

# CUDA's runtime libraries where pip puts them (CUDA 13: nvidia/cu13/lib, NCCL: nvidia/nccl/lib),
# hard links where the file system allows (libcublasLt is ~500 MB)
SP="$ROOT/opt/torch/.venv/lib/python3.12/site-packages/nvidia"
rm -rf "$SP"
mkdir -p "$SP/cu13/lib" "$SP/nccl/lib"
for l in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
    case $l in libnccl*) d=$SP/nccl/lib ;; *) d=$SP/cu13/lib ;; esac
    f=$(readlink -f "$CUDA_HOME/lib64/$l")
    ln "$f" "$d/$l" 2>/dev/null || cp "$f" "$d/$l"
done

cat >"$ROOT/work/inside.sh" <<'EOF'
set -u
cd /work/repo
echo "== inside: $(. /etc/os-release; echo "$PRETTY_NAME"), $(getconf GNU_LIBC_VERSION)"
for t in mpirun mpicc h5dump python3 ssh nvidia-smi; do printf '%s: %s\n' "$t" "$(command -v $t || echo none)"; done
ls /usr/lib/x86_64-linux-gnu | grep -E 'libmpi|libhdf5|libconfig|libopenblas|libcunit|libgomp' || echo "no MPI/HDF5/libconfig/OpenBLAS/CUnit/libgomp libraries"
echo "== tools/gpu-check.sh (the GPU rows must SKIP here)"
OUT=/tmp/out sh tools/gpu-check.sh /tmp/gc
echo "gpu-check exit: $?"
ls -l /tmp/out
echo "== by hand: 2 ranks on the CPU, checkpoint saved, read back, resumed"
ZT_BUNDLE=/work/repo/gpu-bundle; . /work/repo/gpu-bundle/env.sh
echo "mpirun is $(command -v mpirun), ztrain is $(command -v ztrain)"
ldd "$(command -v ztrain)" | grep -v '/tmp/ztrain-bundle/lib' | sed 's/ (0x.*//'
set -e
mkdir -p /tmp/run2
cat doc/*.md > /tmp/run2/text.txt
zt-prep-data -o /tmp/run2/d /tmp/run2/text.txt
mpirun -np 2 --bind-to none ztrain inputs/tiny.cfg data.train_files=/tmp/run2/d-train.h5 \
    data.val_files=/tmp/run2/d-val.h5 train.max_steps=10 train.sample_tokens=0 parallel.backend=cpu \
    parallel.strategy=zero3 train.output_dir=/tmp/run2/out checkpoint.save_at_end=true
ls -R /tmp/run2/out | head -20
ck=$(find /tmp/run2/out -name '*.h5' | sort | tail -n 1)
echo "checkpoint: $ck"
zt-ckpt info "$ck" 2>&1 | head -n 8
zt-ckpt verify "$ck"; echo "zt-ckpt verify exit: $?"
mpirun -np 2 --bind-to none ztrain inputs/tiny.cfg data.train_files=/tmp/run2/d-train.h5 \
    data.val_files=/tmp/run2/d-val.h5 train.max_steps=14 train.sample_tokens=0 parallel.backend=cpu \
    parallel.strategy=zero3 train.output_dir=/tmp/run2/out checkpoint.save_at_end=false checkpoint.resume=auto 2>&1 |
    grep "resumed from\|^step  *1[14]/\|summary:"
echo "== GPU tests on 2 ranks (SKIP expected)"
set +e
mpirun -np 2 --bind-to none test_nccl; echo "test_nccl exit: $?"
test_gpu_kernels; echo "test_gpu_kernels exit: $?"
EOF

unshare -m --propagation private sh -c "
    mount -t proc proc '$ROOT/proc' && mount -t sysfs sys '$ROOT/sys' &&
    mount --bind /dev '$ROOT/dev' && mount -t tmpfs shm '$ROOT/dev/shm' &&
    chroot '$ROOT' /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root /bin/sh /work/inside.sh"
