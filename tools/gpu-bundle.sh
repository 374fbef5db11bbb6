#!/bin/sh
# gpu-bundle.sh — builds ztrain with CUDA here and packs it into one folder that runs on a
# machine with no MPI, HDF5, libconfig, OpenBLAS or CUnit and no network to install them (the
# GPU machine lent to this project): the binaries, every shared library they need except glibc,
# libstdc++/libgcc_s and the CUDA libraries, and a relocatable Open MPI runtime.
#
#   tools/gpu-bundle.sh [BUNDLE]      (default: <repo>/gpu-bundle, ignored by git; carry it)
#   env: ZT_BUNDLE_BUILD (build dir, default /tmp/ztrain-bundle-build; the unpacked tree is
#        left in its bundle/ for local use), CUDA_HOME (default
#        /usr/local/cuda), NVCCFLAGS (default: configure's sm_80 + sm_90), ZT_BUNDLE_MARCH
#        (default x86-64-v3: the Makefile's -march=native names the CPU of *this* machine),
#        ZT_BUNDLE_LIBS_FROM (a folder of libraries that replace those of the same SONAME),
#        ZT_BUNDLE_COMPAT (default 1: on Debian 12, fetch Debian 11's libevent once, see below),
#        ZT_DEBIAN_MIRROR (default http://deb.debian.org/debian)
#
# Not bundled, found on the target by env.sh: libcudart, libcublasLt, libnccl (the pip
# nvidia-* packages or a CUDA toolkit; libcublasLt alone is ~500 MB) and the driver's libcuda.
#
# BUNDLE holds ztrain-bundle.tar.gz (the tree below; ~80 MB unpacked, mostly OpenBLAS's
# 35 MB, so it travels compressed), a copy of its MANIFEST, and env.sh, which unpacks the
# tree once to ZT_BUNDLE_ROOT (default /tmp/ztrain-bundle) and sources the tree's env.sh:
#     ZT_BUNDLE=/path/to/gpu-bundle; . "$ZT_BUNDLE/env.sh"
# The tree:
#   bin/      ztrain zt-prep-data zt-ckpt test_gpu_kernels test_nccl bench_gpu (stripped)
#   lib/      the shared libraries all of them and Open MPI's plugins need (by ldd), by SONAME
#   ompi/     OPAL_PREFIX: Open MPI's files at their paths relative to its configured prefix
#             (Debian: bin/, lib/x86_64-linux-gnu/openmpi/lib/openmpi3/, share/openmpi/)
#   ompi/etc/ OPAL_SYSCONFDIR (Debian's is an absolute /etc/openmpi, which no prefix moves)
#   pmix/     PMIX_PREFIX: PMIx's plugins and help files, likewise
#   env.sh    source it: PATH, LD_LIBRARY_PATH, OPAL_PREFIX..., and the CUDA libraries found
#   MANIFEST  versions, the glibc the bundle needs, the CUDA SONAMEs it expects, sizes
set -eu

SRC=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-$SRC/gpu-bundle}
BUILD=${ZT_BUNDLE_BUILD:-/tmp/ztrain-bundle-build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
MARCH=${ZT_BUNDLE_MARCH:-x86-64-v3}
JOBS=$(nproc 2>/dev/null || echo 2)
BINS="ztrain zt-prep-data zt-ckpt tests/gpu/test_gpu_kernels tests/gpu/test_nccl tools/bench_gpu"

die() { echo "gpu-bundle: $*" >&2; exit 1; }
say() { echo "gpu-bundle: $*"; }

# Libraries the target must provide itself: glibc's, the compiler runtime every Linux has
# (the target's is at least as new as ours: see the GLIBC/GLIBCXX check below), and CUDA's.
is_system_lib() {
    case $1 in
        linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|\
        libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*|libnsl.so.*|\
        libBrokenLocale.so.*|libnss_*|libstdc++.so.*|libgcc_s.so.*) return 0 ;;
        libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libnvidia-*) return 0 ;;
    esac
    return 1
}
is_cuda_lib() {
    case $1 in libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*) return 0 ;; esac
    return 1
}

# ---- build ------------------------------------------------------------------
for t in gcc objdump readelf strip ldd ompi_info mpirun; do
    command -v $t >/dev/null 2>&1 || die "$t not found (needs the build machine's toolchain and Open MPI)"
done
[ -x "$SRC/configure" ] || (cd "$SRC" && autoreconf -fi) || die "autoreconf failed"
mkdir -p "$BUILD"
CFG="--with-cuda=$CUDA_HOME CFLAGS=-O3 -march=$MARCH -mtune=generic NVCCFLAGS=${NVCCFLAGS:-}"
if [ ! -f "$BUILD/Makefile" ] || [ "$(cat "$BUILD/.bundle-configure" 2>/dev/null)" != "$CFG" ]; then
    say "configure in $BUILD ($CFG)"
    # CFLAGS comes after the Makefile's AM_CFLAGS (-march=native), so this -march wins
    (cd "$BUILD" && "$SRC/configure" -q --with-cuda="$CUDA_HOME" \
        CFLAGS="-O3 -march=$MARCH -mtune=generic" ${NVCCFLAGS:+NVCCFLAGS="$NVCCFLAGS"}) ||
        die "configure --with-cuda failed (see $BUILD/config.log)"
    echo "$CFG" >"$BUILD/.bundle-configure"
fi
say "make $BINS"
make -C "$BUILD" -s -j"$JOBS" $BINS || die "make failed"

# ---- assemble in a scratch folder: a failed run leaves no half bundle behind -------
TREE="$BUILD/bundle"
TMP="$TREE.tmp"
rm -rf "$TMP"
mkdir -p "$TMP/bin" "$TMP/lib"
for b in $BINS; do
    cp "$BUILD/$b" "$TMP/bin/"
    strip "$TMP/bin/$(basename "$b")"
done

# Open MPI: its own idea of where things are, relative to its prefix
opath() { ompi_info --path "$1" --parsable 2>/dev/null | sed -n "s/^path:$1:\(.*\)/\1/p"; }
O_PREFIX=$(opath prefix); O_BINDIR=$(opath bindir); O_PKGLIB=$(opath pkglibdir)
O_PKGDATA=$(opath pkgdatadir); O_SYSCONF=$(opath sysconfdir)
[ -n "$O_PREFIX" ] && [ -d "$O_PKGLIB" ] || die "cannot read Open MPI's paths from ompi_info"
rel() {  # path below the prefix, else die: a path outside it would not move with OPAL_PREFIX
    case $1 in "$O_PREFIX"/*) echo "${1#"$O_PREFIX"/}" ;; *) die "Open MPI's $1 is not under $O_PREFIX" ;; esac
}
R_BIN=$(rel "$O_BINDIR"); R_PKGLIB=$(rel "$O_PKGLIB"); R_PKGDATA=$(rel "$O_PKGDATA")
mkdir -p "$TMP/ompi/$R_BIN" "$TMP/ompi/$R_PKGLIB" "$TMP/ompi/$R_PKGDATA" "$TMP/ompi/etc/openmpi"
orterun=$(readlink -f "$(command -v mpirun)")
case $(basename "$orterun") in orterun|mpirun*) ;; *) die "mpirun is $orterun, not Open MPI's orterun" ;; esac
# copies, not links: a link need not survive the transfer to the target
for n in orterun mpirun mpiexec; do cp "$orterun" "$TMP/ompi/$R_BIN/$n"; done
for n in orted ompi_info; do cp "$(readlink -f "$O_BINDIR/$n")" "$TMP/ompi/$R_BIN/$n"; done
cp -r "$O_PKGDATA/." "$TMP/ompi/$R_PKGDATA/"
[ -f "$O_SYSCONF/openmpi-mca-params.conf" ] && cp "$O_SYSCONF/openmpi-mca-params.conf" "$TMP/ompi/etc/openmpi/"
cat >>"$TMP/ompi/etc/openmpi/openmpi-mca-params.conf" <<'EOF'
# gpu-bundle: one node, no fabric plugins bundled (ucx, ofi, openib, psm are left out)
btl = self,vader,tcp
pml = ob1
# no ssh on the target; only used to reach other nodes, which a one-node run never does
plm_rsh_agent = false
# cross-memory attach (process_vm_readv) can be refused in containers and sandboxes
btl_vader_single_copy_mechanism = none
EOF

# The MCA plugins, less fabrics (one node: shared memory and TCP do) and OpenSHMEM
SKIPPED=""
for p in "$O_PKGLIB"/mca_*.so; do
    n=$(basename "$p")
    case $n in
        *_ucx.so|*_ofi.so|*_openib.so|*_psm.so|*_psm2.so|mca_atomic_*|mca_memheap_*|mca_scoll_*|mca_spml_*|mca_sshmem_*)
            SKIPPED="$SKIPPED ${n%.so}"; continue ;;
    esac
    if ldd "$p" | grep -q 'not found'; then SKIPPED="$SKIPPED ${n%.so}(unresolved)"; continue; fi
    cp "$p" "$TMP/ompi/$R_PKGLIB/"
done

# PMIx (Open MPI's external PMIx on Debian): plugins and help files under its own prefix
PMIX_LIB=$(ldd "$O_PKGLIB/mca_pmix_ext3x.so" 2>/dev/null | awk '$1 ~ /^libpmix\.so/ {print $3}')
P_PREFIX=""
if [ -n "$PMIX_LIB" ]; then
    P_LIBDIR=$(dirname "$(readlink -f "$PMIX_LIB")")          # .../pmix2/lib
    P_PREFIX=$(dirname "$P_LIBDIR")
    mkdir -p "$TMP/pmix/lib"
    [ -d "$P_LIBDIR/pmix" ] && cp -r "$P_LIBDIR/pmix" "$TMP/pmix/lib/"
    [ -d "$P_PREFIX/share" ] && cp -r "$P_PREFIX/share" "$TMP/pmix/"
    # its component path is an absolute one in this file: env.sh sets it instead
    [ -f "$TMP/pmix/share/pmix-mca-params.conf" ] &&
        sed -i '/^mca_base_component_path/d' "$TMP/pmix/share/pmix-mca-params.conf"
fi

# ---- every library they need, by ldd (already transitive), by SONAME -------------------
ELFS=$(find "$TMP/bin" "$TMP/ompi" "$TMP/pmix" -type f \( -name '*.so' -o -perm -u+x \) 2>/dev/null |
       while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
CUDA_NEEDED=""
for f in $ELFS; do
    # unresolved libraries: only CUDA's may be missing here (and must be present there)
    ldd "$f" | awk '/=>/ {print $1, $3}' | while read -r so path; do
        if is_system_lib "$so"; then continue; fi
        [ "$path" = "not" ] && die "$f needs $so, which is not found here"
        [ -f "$TMP/lib/$so" ] || cp -L "$path" "$TMP/lib/$so"
    done
    for so in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        if is_cuda_lib "$so"; then
            case " $CUDA_NEEDED " in *" $so "*) ;; *) CUDA_NEEDED="$CUDA_NEEDED $so" ;; esac
        fi
    done
done
CUDA_NEEDED=${CUDA_NEEDED# }

# Debian 12's libevent (Open MPI's event loop) is the one library that needs glibc 2.36
# (arc4random); everything else needs 2.34. Debian 11's build of the same release (2.1.12,
# the same exports) needs 2.25, so with it the bundle also runs on glibc 2.34/2.35 (Ubuntu
# 22.04, RHEL 9). Fetched once into $BUILD/compat; without network the bundle needs 2.36.
COMPAT=${ZT_BUNDLE_LIBS_FROM:-}
if [ -z "$COMPAT" ] && [ "${ZT_BUNDLE_COMPAT:-1}" = 1 ] && [ -f "$TMP/lib/libevent_core-2.1.so.7" ] &&
   objdump -T "$TMP/lib/libevent_core-2.1.so.7" | grep -q 'GLIBC_2\.36' &&
   [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
    COMPAT="$BUILD/compat"
    if [ ! -f "$COMPAT/.done" ]; then
        rm -rf "$COMPAT" && mkdir -p "$COMPAT/root"
        ok=1
        for p in libevent-core-2.1-7 libevent-pthreads-2.1-7; do
            deb="${p}_2.1.12-stable-1_amd64.deb"
            url="${ZT_DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/libe/libevent/$deb"
            { curl -sSfL -m 60 -o "$COMPAT/$deb" "$url" 2>/dev/null || wget -q -T 60 -O "$COMPAT/$deb" "$url"; } &&
                dpkg-deb -x "$COMPAT/$deb" "$COMPAT/root" || ok=0
        done
        if [ $ok = 1 ]; then
            find "$COMPAT/root" -type f -name '*.so.*' | while read -r l; do
                so=$(readelf -d "$l" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
                [ -n "$so" ] && cp "$l" "$COMPAT/$so"
            done
            touch "$COMPAT/.done"
        else
            say "could not fetch Debian 11's libevent: the bundle will need glibc 2.36"
            COMPAT=""
        fi
    fi
fi
REPLACED=""
if [ -n "$COMPAT" ]; then
    for l in "$COMPAT"/*.so*; do
        n=$(basename "$l")
        [ -f "$l" ] && [ -f "$TMP/lib/$n" ] || continue
        cp "$l" "$TMP/lib/$n"
        REPLACED="$REPLACED $n"
    done
fi
chmod u+w "$TMP"/lib/*
strip --strip-unneeded "$TMP"/lib/* "$TMP/ompi/$R_PKGLIB"/*.so 2>/dev/null || true
strip "$TMP/ompi/$R_BIN"/* 2>/dev/null || true

# Each library's SONAME must be the name it is stored under (that is what the loader looks for)
for l in "$TMP"/lib/*; do
    s=$(readelf -d "$l" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ -z "$s" ] || [ "$s" = "$(basename "$l")" ] || die "$(basename "$l") has SONAME $s"
done

# ---- the glibc (and libstdc++) the bundle needs from the target ----------------------
ALL_ELFS=$(find "$TMP" -type f | while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
maxver() {  # prefix (GLIBC_ or GLIBCXX_): the highest version any bundled file asks for, and who
    for f in $ALL_ELFS; do
        objdump -T "$f" 2>/dev/null | grep -o "[( ]$1[0-9][0-9.]*" | tr -d '( ' | sort -uV |
            tail -n 1 | sed "s|\$| ${f#"$TMP"/}|"
    done | sort -V -k1,1 | tail -n 1
}
GLIBC_MAX=$(maxver GLIBC_)
GLIBCXX_MAX=$(maxver GLIBCXX_)

# ---- env.sh ------------------------------------------------------------------------
{
    echo "# env.sh — generated by tools/gpu-bundle.sh on $(date -u +%Y-%m-%d) from $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')."
    echo "ZT_BUNDLE_CUDA_SONAMES=\"$CUDA_NEEDED\""
    echo "ZT_BUNDLE_GLIBC=\"${GLIBC_MAX%% *}\""
    echo "ZT_BUNDLE_PKGLIB=\"$R_PKGLIB\""
    cat <<'EOF'
# Source it from sh or bash; from sh, set ZT_BUNDLE to the bundle's folder first:
#     ZT_BUNDLE=/path/to/gpu-bundle; . "$ZT_BUNDLE/env.sh"
# Sets PATH (the bundle's mpirun and ztrain first), LD_LIBRARY_PATH, OPAL_PREFIX and
# friends, and finds the CUDA libraries the bundle does not carry. It says what it found;
# ZT_BUNDLE_OK=1 when every library is there, else 0 (ZT_BUNDLE_MISSING lists them).
# ZT_CUDA_LIBDIR (colon-separated) is searched first; ZT_BUNDLE_QUIET=1 silences it.
if [ -z "${ZT_BUNDLE:-}" ]; then
    if [ -n "${BASH_SOURCE:-}" ]; then ZT_BUNDLE=$(dirname "$BASH_SOURCE")
    elif [ -f ./env.sh ] && [ -d ./ompi ]; then ZT_BUNDLE=.
    else ZT_BUNDLE=./gpu-bundle
    fi
fi
ZT_BUNDLE=$(cd "$ZT_BUNDLE" && pwd)
_zt_say() { [ "${ZT_BUNDLE_QUIET:-0}" = 1 ] || echo "env.sh: $*"; }

# Where CUDA's libraries may be: the pip packages (CUDA 13 wheels put cudart and cuBLAS in
# nvidia/cu13/lib, nvidia-nccl-cu13 in nvidia/nccl/lib), then a toolkit, then the driver's.
_zt_cuda_dirs() {
    echo "${ZT_CUDA_LIBDIR:-}" | tr ':' '\n'
    for py in python3 /opt/torch/.venv/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" - <<'PY' 2>/dev/null
import glob, os, site
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
try:
    roots += [os.path.join(p, 'nvidia') for p in site.getsitepackages() + [site.getusersitepackages()]]
except Exception:
    pass
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, '*', 'lib'))):
        print(d)
PY
    done
    for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
             /usr/lib/python3/dist-packages/nvidia/*/lib; do
        [ -d "$d" ] && echo "$d"
    done
    echo "${CUDA_HOME:-/usr/local/cuda}/lib64"
    echo /usr/local/cuda/lib64
    echo /usr/local/cuda/targets/x86_64-linux/lib
    echo /usr/local/nvidia/lib64
    echo /usr/local/nvidia/lib
    echo /usr/lib/x86_64-linux-gnu
    echo /usr/lib64
}
_zt_find() {  # SONAME -> the first directory holding it, else ldconfig's
    for _d in $(_zt_cuda_dirs); do
        [ -n "$_d" ] && [ -e "$_d/$1" ] && { echo "$_d"; return 0; }
    done
    _p=$(ldconfig -p 2>/dev/null | awk -v s="$1" '$1 == s {print $NF; exit}')
    [ -n "$_p" ] && { dirname "$_p"; return 0; }
    return 1
}
_zt_ld=""
ZT_BUNDLE_MISSING=""
for _so in $ZT_BUNDLE_CUDA_SONAMES libcuda.so.1; do
    if _dir=$(_zt_find "$_so"); then
        _s=$(readelf -d "$_dir/$_so" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
        _zt_say "$_so <- $_dir${_s:+ (SONAME $_s)}"
        case ":$_zt_ld:" in *":$_dir:"*) ;; *) _zt_ld="$_zt_ld:$_dir" ;; esac
    else
        _zt_say "$_so: NOT FOUND (set ZT_CUDA_LIBDIR to its folder)"
        ZT_BUNDLE_MISSING="$ZT_BUNDLE_MISSING $_so"
    fi
done
_zt_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$_zt_glibc" ] && [ "$(printf '%s\n%s\n' "${ZT_BUNDLE_GLIBC#GLIBC_}" "$_zt_glibc" | sort -V | head -n 1)" != "${ZT_BUNDLE_GLIBC#GLIBC_}" ]; then
    _zt_say "glibc $_zt_glibc here, the bundle needs ${ZT_BUNDLE_GLIBC#GLIBC_}: rebuild it on an older system"
    ZT_BUNDLE_MISSING="$ZT_BUNDLE_MISSING $ZT_BUNDLE_GLIBC"
else
    _zt_say "glibc ${_zt_glibc:-?} (bundle needs ${ZT_BUNDLE_GLIBC#GLIBC_})"
fi
# system folders stay where the loader already looks, after the bundle's own libraries
_zt_ld=$(echo "$_zt_ld" | tr ':' '\n' | grep -v '^$\|^/usr/lib/x86_64-linux-gnu$\|^/usr/lib64$\|^/lib' | paste -sd: -)
export LD_LIBRARY_PATH="$ZT_BUNDLE/lib${_zt_ld:+:$_zt_ld}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$ZT_BUNDLE/ompi/bin:$ZT_BUNDLE/bin${PATH:+:$PATH}"
export OPAL_PREFIX="$ZT_BUNDLE/ompi"
export OPAL_SYSCONFDIR="$ZT_BUNDLE/ompi/etc/openmpi"
export OPAL_PKGLIBDIR="$ZT_BUNDLE/ompi/$ZT_BUNDLE_PKGLIB"
if [ -d "$ZT_BUNDLE/pmix" ]; then
    export PMIX_PREFIX="$ZT_BUNDLE/pmix"
    export PMIX_MCA_mca_base_component_path="$ZT_BUNDLE/pmix/lib/pmix"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ZT_BUNDLE_MISSING=${ZT_BUNDLE_MISSING# }
if [ -z "$ZT_BUNDLE_MISSING" ]; then ZT_BUNDLE_OK=1; else ZT_BUNDLE_OK=0; fi
export ZT_BUNDLE ZT_BUNDLE_OK ZT_BUNDLE_MISSING
unset _so _dir _s _d _p _zt_ld _zt_glibc
EOF
} >"$TMP/env.sh"

# ---- MANIFEST, then the bundle replaces the old one ------------------------------------
{
    echo "ztrain GPU bundle, built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") $(uname -m)"
    echo "source:        $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$SRC" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
    echo "compiler:      $(gcc --version | head -n 1), -O3 -march=$MARCH -mtune=generic"
    echo "CUDA:          $("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'), NVCCFLAGS $(sed -n 's/^NVCCFLAGS = //p' "$BUILD/Makefile")"
    echo "Open MPI:      $(ompi_info --parsable 2>/dev/null | sed -n 's/^ompi:version:full://p') (prefix $O_PREFIX, relocated by OPAL_PREFIX)"
    echo "needs glibc:   ${GLIBC_MAX%% *} (highest symbol version; asked by, e.g., ${GLIBC_MAX#* })"
    echo "needs libstdc++: ${GLIBCXX_MAX:-no GLIBCXX_ symbol version (CXXABI_1.3 only)}"
    echo "CUDA expected on the target (not bundled): $CUDA_NEEDED, libcuda.so.1"
    echo "Open MPI plugins left out:$SKIPPED"
    echo "replaced from $COMPAT:${REPLACED:- none}"
    echo
    (cd "$TMP" && find . -type f | sort | xargs du -k | awk '{printf "%8d KiB  %s\n", $1, $2}')
} >"$TMP/MANIFEST"
rm -rf "$TREE"
mv "$TMP" "$TREE"

# ---- the carried folder: the tree packed, and the env.sh that unpacks it ---------------
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
tar -C "$TREE" -czf "$DEST.tmp/ztrain-bundle.tar.gz" --owner=0 --group=0 .
cp "$TREE/MANIFEST" "$DEST.tmp/MANIFEST"
cat >"$DEST.tmp/env.sh" <<'EOF'
# gpu-bundle/env.sh — generated by tools/gpu-bundle.sh. Source it from sh or bash:
#     ZT_BUNDLE=/path/to/gpu-bundle; . "$ZT_BUNDLE/env.sh"
# Unpacks ztrain-bundle.tar.gz into ZT_BUNDLE_ROOT (default /tmp/ztrain-bundle) unless the
# same bundle is already there, then sources the env.sh inside it (which sets ZT_BUNDLE to
# the unpacked tree, PATH, LD_LIBRARY_PATH, OPAL_PREFIX... and finds the CUDA libraries).
if [ -z "${ZT_BUNDLE:-}" ]; then
    if [ -n "${BASH_SOURCE:-}" ]; then ZT_BUNDLE=$(dirname "$BASH_SOURCE"); else ZT_BUNDLE=./gpu-bundle; fi
fi
ZT_BUNDLE_ROOT=${ZT_BUNDLE_ROOT:-/tmp/ztrain-bundle}
if ! cmp -s "$ZT_BUNDLE/MANIFEST" "$ZT_BUNDLE_ROOT/MANIFEST"; then
    rm -rf "$ZT_BUNDLE_ROOT" && mkdir -p "$ZT_BUNDLE_ROOT" &&
    { tar -C "$ZT_BUNDLE_ROOT" -xzf "$ZT_BUNDLE/ztrain-bundle.tar.gz" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
          "$ZT_BUNDLE/ztrain-bundle.tar.gz" "$ZT_BUNDLE_ROOT"; } ||
    echo "env.sh: could not unpack $ZT_BUNDLE/ztrain-bundle.tar.gz into $ZT_BUNDLE_ROOT"
fi
ZT_BUNDLE=$ZT_BUNDLE_ROOT
. "$ZT_BUNDLE_ROOT/env.sh"
EOF
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"

say "tree in $TREE: $(du -sh "$TREE" | cut -f1) ($(find "$TREE" -type f | wc -l) files)"
say "carried folder $DEST: $(du -sh "$DEST" | cut -f1)"
say "needs glibc >= ${GLIBC_MAX%% *} (${GLIBC_MAX#* }), libstdc++ ${GLIBCXX_MAX:-(no GLIBCXX_ version)}"
say "expects on the target: $CUDA_NEEDED libcuda.so.1"
say "left out of Open MPI:$SKIPPED"
[ -z "$REPLACED" ] || say "replaced from $COMPAT:$REPLACED"
