#!/bin/sh
# Installs what ztrain needs to build, test and benchmark on Debian 12. Idempotent.
set -eu
# libpmix-dev: Slurm's PMIx plugin dlopens the unversioned libpmix.so that only the -dev
# package ships; without it `srun --mpi=pmix` fails on a fresh machine.
PKGS="build-essential autoconf automake libtool pkg-config
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools libconfig-dev libcunit1-dev
  libopenblas-dev python3-numpy python3-h5py libjansson-dev python3-venv libpcre2-dev libutf8proc-dev libdnnl-dev libyaml-dev liburing-dev
  slurm-wlm slurmctld slurmd slurm-client munge libpmix-dev fortunes-min fortunes"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
echo "install-deps: all packages present"
