#!/bin/sh
# multihost.sh — two hosts on one machine: two network namespaces joined by a bridge (in a
# third), each with its own hostname (a UTS namespace), and mpirun -hostfile over TCP between
# them. Open MPI reaches the second host through a launcher (plm_rsh_agent) that runs the
# daemon's command in that host's namespaces, as ssh would on a cluster; the ranks of one
# host share memory (vader), the two hosts talk TCP over the veth pair only.
# 1. hybrid_shard with its default shard group, one node: 4 ranks on 2 hosts make 2 shard
#    groups of 2 (one per host) and 2 replica groups across the link; it equals one rank
#    with gradient accumulation (losses and final parameters within 1e-5, as equivalence.sh).
# 2. 1-bit Adam (ddp, 4 ranks on 2 hosts): its warm-up equals one rank (losses of steps
#    1 .. freeze_step + 1 within 1e-5); after the freeze the compressed exchange crosses
#    the link and the run ends bit-identical to the same 4 ranks on one host; the shard
#    engine on given gradients at 2 ranks, one a host, equals the float64 replay of
#    DeepSpeed's algorithm (tests/reference/onebit_replay.py).
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), ip(8) and unshare(1); skips (77)
# where namespaces cannot be made. tools/bench-onebit.sh uses the same recipe
# (tests/mpi/netns.sh) with a rate-limited link.
. "$(dirname "$0")/common.sh"
. "$ZT_SRCDIR/tests/mpi/netns.sh"
need_h5py
netns_up "$ZT_TMP" || skip "$ZT_NETNS_WHY"
at_exit netns_down
tiny_comparison_setup

# one rank: the reference of both checks
# shellcheck disable=SC2086
run_ztrain 1 $common $(batch_args 1) train.output_dir=ref >/dev/null

# 1. hybrid_shard by node
# shellcheck disable=SC2086
netns_ztrain 4 $common $(batch_args 4) parallel.strategy=hybrid_shard train.output_dir=hyb || fail "hybrid_shard on 2 hosts"
assert_contains "$ZT_OUT" "4 ranks on 2 nodes"
assert_contains "$ZT_OUT" "strategy: hybrid_shard, layout flat, shard group 2, replica group 2"
grep -q "rank 0 -> $ZT_HOST_A" "$ZT_OUT" && grep -q "rank 1 -> $ZT_HOST_A" "$ZT_OUT" &&
    grep -q "rank 2 -> $ZT_HOST_B" "$ZT_OUT" && grep -q "rank 3 -> $ZT_HOST_B" "$ZT_OUT" ||
    fail "ranks 0, 1 not on $ZT_HOST_A and 2, 3 not on $ZT_HOST_B"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref hyb || fail "hybrid_shard on 2 hosts differs from one rank"
echo "ok: hybrid_shard, a shard group a host, equals one rank"

# 2. 1-bit Adam: the warm-up equals one rank, the compressed stage the same run on one host
ob="optim.type=onebit_adam optim.freeze_step=6"
# shellcheck disable=SC2086
run_ztrain 1 $common $(batch_args 1) $ob train.output_dir=ob1 >/dev/null
# shellcheck disable=SC2086
netns_ztrain 4 $common $(batch_args 4) $ob train.output_dir=ob-2hosts || fail "1-bit Adam on 2 hosts"
assert_contains "$ZT_OUT" "4 ranks on 2 nodes"
# shellcheck disable=SC2086
run_ztrain 4 $common $(batch_args 4) $ob train.output_dir=ob-1host >/dev/null
"$PY" - ob1 ob-2hosts 7 <<'PY' || fail "1-bit Adam's warm-up on 2 hosts differs from one rank"
import json, sys
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
a, b, last = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
worst = max(abs(a[k] - b[k]) / abs(a[k]) for k in range(1, last + 1))
print(f"steps 1..{last}: largest relative loss difference {worst:.2e} (tol 1e-5)")
sys.exit(0 if worst <= 1e-5 else 1)
PY
"$PY" "$CHECK" exact ob-1host ob-2hosts || fail "1-bit Adam on 2 hosts differs from 4 ranks on one host"
echo "ok: 1-bit Adam on 2 hosts: warm-up as one rank, compressed stage bit-identical to one host"

TEST="$ZT_BUILDDIR/tests/mpi/onebit_test"
[ -x "$TEST" ] || fail "$TEST not built"
mkdir -p replay
ZT_NETNS_SLOTS=1 netns_run 2 "$TEST" "$ZT_TMP/replay" 8 3 >replay.log 2>&1 || { cat replay.log; fail "onebit_test on 2 hosts"; }
"$PY" "$ZT_SRCDIR/tests/reference/onebit_replay.py" replay 2 8 3 ||
    fail "1-bit Adam on 2 hosts differs from DeepSpeed's replay"
echo "PASS: multihost"
