#!/bin/sh
# nvme.sh — the NVMe offload tier (parallel.offload_optimizer / offload_param = nvme).
#
# The files hold what host offload holds in memory, and the same CPU kernels step it in
# the same order, so on the cpu backend a run with its optimizer state (and parameter
# shards) on disk must be BIT-IDENTICAL to the run without offload: zero1, zero2, zero3,
# zero3 with offload_param, bf16 (its 16-bit parameter record), the smallest buffer count
# with 4 KiB requests, the thread engine, and pipelines (pp 2 x dp 2 under zero1, and zero3
# with offload_param: each pipeline rank's files hold its stages' units). Then: a run refused under
# parallel.memory_limit_gb trains with nvme offload inside it (peak RSS measured); a
# rank killed with SIGKILL leaves scratch that the resumed run removes, and the resumed
# run is bit-exact; the scratch files are gone after every run; a missing path, a
# read-only one and a full disk are refused at start with one line, exit 1 on every
# rank, the checkpoint untouched. The last two need a tmpfs mount (root): without one
# the test skips (77) after the rest passed.
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup
NV="$ZT_TMP/nvme"
mkdir -p "$NV" || fail "mkdir $NV"
nv="parallel.offload_optimizer=nvme parallel.offload_nvme_path=$NV"
nvp="$nv parallel.offload_param=nvme"
common="$common optim.lr_scheduler_type=constant_with_warmup"
# 7 units, more than the 4 buffers: every step evicts records and reads them back from the
# file (with 2 blocks every record would stay cached in a buffer and the file be written
# only)
six="model.n_layer=6 train.max_steps=8"

no_scratch() {
    [ -z "$(ls -A "$NV")" ] || fail "$1: scratch files left in $NV: $(ls "$NV")"
}

# pair NP NAME OFFLOAD_ARGS [key=value...]: the run without offload and with it
pair() {
    np=$1 name=$2 o=$3
    shift 3
    # shellcheck disable=SC2086
    run_ztrain "$np" $common "$@" train.output_dir="$name" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain "$np" $common "$@" $o train.output_dir="$name-nvme" >/dev/null
    assert_contains "$ZT_OUT" "offload: nvme,"
    assert_contains "$ZT_OUT" "on disk (nvme)"
    "$PY" "$CHECK" exact "$name" "$name-nvme" || fail "$name: the run with state on disk differs from the one without"
    no_scratch "$name"
}

# the accounting: the file's bytes and the host buffers as estimated (rank 0 owns the
# largest shard, the estimate's per-rank bound) are what the engine allocated
accounted() {
    "$PY" - "$1" <<'PYEOF' || fail "$1: nvme bytes or host bytes differ from the estimate"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
est = next(r for r in recs if r.get("start"))["memory_estimate"]
meas = next(r for r in recs if r.get("summary"))["memory_measured"]
print(f"{sys.argv[1]}: on disk {meas['nvme']} bytes, host {meas['host']} (estimates {est['nvme']}, {est['host']})")
sys.exit(0 if meas["nvme"] == est["nvme"] > 0 and meas["host"] == est["host"] else 1)
PYEOF
}

pair 2 zero1 "$nv" parallel.strategy=zero1 $six
pair 2 zero2 "$nv" parallel.strategy=zero2 $six
pair 2 zero3 "$nv" parallel.strategy=zero3 $six
pair 2 zero3p "$nvp" parallel.strategy=zero3 $six
pair 2 bf16-zero3p "$nvp" parallel.strategy=zero3 train.bf16=true $six
accounted zero3-nvme
accounted zero3p-nvme
accounted bf16-zero3p-nvme
grep -q "nvme (rank 0): read 0 B" "$ZT_OUT" && fail "bf16-zero3p: nothing was read from the files"
# three buffers, 4 KiB requests, two in flight: every record evicted and read again
pair 2 small "$nvp parallel.offload_nvme_buffer_count=3 parallel.offload_nvme_block_size=4096 \
  parallel.offload_nvme_queue_depth=2" parallel.strategy=zero3 parallel.shard_layout=per_param train.max_steps=8
# the pread/pwrite engine
ZT_NVME_IO=threads pair 2 threads "$nv" parallel.strategy=zero2 $six
assert_contains "$ZT_OUT" "(threads"
echo "ok: zero1, zero2, zero3, zero3 + offload_param (fp32, bf16), 3 buffers, threads: bit-identical to no offload"
# pipelines: a pipeline rank's files hold its stages' units only (the accounting: the files'
# bytes are the estimate of its own units), bit-identical to the same mesh in memory
pp2="parallel.pipeline_parallel_size=2 train.gradient_accumulation_steps=2"
pair 4 pp2-zero1 "$nv" parallel.strategy=zero1 $pp2 $six
pair 4 pp2-zero3p "$nvp" parallel.strategy=zero3 $pp2 $six
accounted pp2-zero3p-nvme
echo "ok: pp 2 x dp 2 (zero1; zero3 + offload_param): bit-identical to the same mesh in memory"

# --- memory: refused without offload, trains inside the limit with it ----------------
# 12 blocks of width 512 (38 M parameters): zero3 needs ~290 MiB a rank (16 bytes per
# owned parameter); with parameters and optimizer state on disk ~4 bytes per owned
# parameter (the gradient accumulators) and the buffers remain.
big="model.n_layer=12 model.n_embd=512 model.n_head=8 train.per_device_train_batch_size=1 train.max_steps=2
  checkpoint.save_at_end=false checkpoint.save_hf=false parallel.memory_limit_gb=0.25 parallel.strategy=zero3"
# shellcheck disable=SC2086
expect_fail_with 2 "more than the limit of 256.00 MiB" $common $big train.output_dir=big-ram
# shellcheck disable=SC2086
run_ztrain 2 $common $big $nvp train.output_dir=big-nvme >/dev/null
"$PY" - big-nvme <<'PYEOF' || fail "the nvme run did not train inside parallel.memory_limit_gb"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
start = next(r for r in recs if r.get("start"))
summ = next(r for r in recs if r.get("summary"))
limit = 0.25 * 2**30
rss, disk = summ["peak_rss_bytes"], start["memory_estimate"]["nvme"]
print(f"memory: {start['parameters']} parameters, peak RSS {rss / 2**20:.1f} MiB under the limit of "
      f"{limit / 2**20:.0f} MiB, {disk / 2**20:.1f} MiB a rank on disk")
sys.exit(0 if rss < limit and disk > 0 and summ["steps"] == 2 and math.isfinite(summ["final_loss"]) else 1)
PYEOF
no_scratch big-nvme

# --- a rank killed: its scratch stays, the resumed run removes it and is bit-exact ---
# shellcheck disable=SC2086
run_ztrain 2 $common $nvp parallel.strategy=zero3 train.max_steps=20 train.output_dir=ref20 >/dev/null
# shellcheck disable=SC2086
ZT_TEST_TIMEOUT=60 run_ztrain_rc 2 $common $nvp parallel.strategy=zero3 train.max_steps=20 checkpoint.save_steps=5 \
    fault.kind=kill fault.rank=1 fault.step=8 train.output_dir=crash >/dev/null
[ "$ZT_RC" -ne 0 ] || fail "ztrain exited 0 although rank 1 was killed"
grep -qF "zt_mpirun.sh: TIMEOUT" "$ZT_OUT" && fail "the job hung after rank 1 was killed"
[ -n "$(ls -A "$NV")" ] || echo "note: no scratch survived the kill (the survivor removed its own)"
left=$(ls "$NV" | grep -c '\.rank1$')
[ "$left" = 1 ] || fail "the killed rank's scratch directory is not there ($(ls "$NV"))"
# mpirun may return while the survivor is still being ended: a run starting then leaves
# the scratch of a process that still runs alone (as it must); wait for them to end
for d in "$NV"/ztrain.*; do
    pid=$(echo "$d" | sed 's/.*\.\([0-9]*\)\.rank[0-9]*$/\1/')
    n=0
    while kill -0 "$pid" 2>/dev/null && ! grep -q '^[^)]*) Z' "/proc/$pid/stat" 2>/dev/null && [ $n -lt 100 ]; do
        sleep 0.2
        n=$((n + 1))
    done
done
# shellcheck disable=SC2086
run_ztrain 2 $common $nvp parallel.strategy=zero3 train.max_steps=20 checkpoint.save_steps=5 checkpoint.resume=auto \
    train.output_dir=crash >/dev/null
assert_contains "$ZT_OUT" "resumed from crash/ckpt-00000005.h5"
assert_contains "$ZT_OUT" "that no longer runs"
"$PY" "$CHECK" exact ref20 crash --from 6 || fail "the run resumed after a kill differs from the uninterrupted one"
no_scratch "resume after kill"
echo "ok: SIGKILL of rank 1: its scratch removed by the resumed run, which is bit-exact"

# --- a missing path and settings that cannot work: one line, every rank --------------
# shellcheck disable=SC2086
expect_fail_with 2 "parallel.offload_nvme_path: $ZT_TMP/missing: No such file or directory" $common \
    parallel.strategy=zero3 parallel.offload_optimizer=nvme parallel.offload_nvme_path="$ZT_TMP/missing"
expect_fail_with 2 "needs parallel.offload_nvme_path" $common parallel.strategy=zero3 parallel.offload_optimizer=nvme
expect_fail_with 2 "must name the same tier" $common parallel.strategy=zero3 parallel.offload_optimizer=cpu \
    parallel.offload_param=nvme parallel.offload_nvme_path="$NV"
expect_fail_with 2 "must be a multiple of 4096" $common parallel.strategy=zero3 $nv parallel.offload_nvme_block_size=6000
expect_fail_with 2 "parallel.offload_nvme_buffer_count" $common parallel.strategy=zero3 $nv \
    parallel.offload_nvme_buffer_count=2

# --- read-only and full: tmpfs mounts (root) ------------------------------------------
ro="$ZT_TMP/ro" full="$ZT_TMP/full"
mkdir -p "$ro" "$full" || fail "mkdir"
mount -t tmpfs -o ro,size=1m tmpfs "$ro" 2>/dev/null || skip "cannot mount a tmpfs (needs root): read-only and full nvme_path untested"
at_exit "umount '$ro' 2>/dev/null"
# shellcheck disable=SC2086
expect_fail_with 2 "parallel.offload_nvme_path: cannot create $ro/ztrain." $common parallel.strategy=zero3 \
    parallel.offload_optimizer=nvme parallel.offload_nvme_path="$ro"
assert_contains "$ZT_OUT" "Read-only file system"
mount -t tmpfs -o size=64k tmpfs "$full" 2>/dev/null || skip "cannot mount a tmpfs: full nvme_path untested"
at_exit "umount '$full' 2>/dev/null"
# resuming from step 15 of the resumed run onto a disk too small for the state: refused
# at start, exit 1 on every rank, one error line, the checkpoint not touched
ck=crash/ckpt-00000015.h5
[ -e "$ck" ] || fail "no $ck"
sum0=$(md5sum "$ck")
# shellcheck disable=SC2086
every_rank_exits 2 1 "on a full nvme_path" $common parallel.strategy=zero3 $nvp parallel.offload_nvme_path="$full" \
    train.max_steps=20 checkpoint.resume="$ck" train.output_dir=fullrun
assert_contains "$ZT_OUT" "ztrain: error: parallel.offload_nvme_path: $full: No space left on device allocating rank"
[ "$(grep -c "error" "$ZT_OUT")" -eq 1 ] || { cat "$ZT_OUT"; fail "a full nvme_path gave more than one error line"; }
[ "$(md5sum "$ck")" = "$sum0" ] || fail "the checkpoint changed"
[ -z "$(ls -A "$full")" ] || fail "scratch left on the full disk: $(ls -A "$full")"
echo "ok: missing, read-only and full nvme_path refused at start with one line; checkpoint intact"
