#!/bin/sh
# slurm.sh — the jobs/ scripts under a REAL Slurm: a private single-node cluster
# (munged, slurmctld, slurmd on localhost, state in a temp dir, free ports) runs
# jobs/single-node.sbatch, jobs/multi-node.sbatch and jobs/requeue.sbatch with
# the real ztrain on tiny data, 2 tasks each, and checks their logs and exit
# codes. The requeue case stops a running job the way the time limit does
# (SIGUSR1 to the batch shell), expects ztrain to checkpoint and exit 75, the
# script to requeue the job, and the rerun to resume from the checkpoint.
#
# Needs root (slurmd) and the Debian packages slurmctld, slurmd, slurm-client,
# munge; skipped otherwise. Never hangs: ZT_SLURM_TIMEOUT (default 300 s) bounds
# the whole test, and every daemon and job is stopped at exit.
. "$(dirname "$0")/common.sh"

for tool in munged mungekey slurmctld slurmd sbatch srun scontrol scancel sinfo; do
    command -v "$tool" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin
    command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed (apt-get install slurmctld slurmd slurm-client munge)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root to start jobs"
zt_need_ztrain

# ---- global time limit --------------------------------------------------------
limit=${ZT_SLURM_TIMEOUT:-300}
test_pid=$$
( sleep "$limit" && echo "FAIL: slurm: global time limit of $limit s hit" >&2 && kill -TERM "$test_pid" ) &
guard_pid=$!
at_exit "kill $guard_pid 2>/dev/null"

S="$ZT_TMP/slurm"
mkdir -p "$S/state" "$S/spool" "$S/log" "$S/munge" || fail "cannot create $S"
chmod 700 "$S/munge"
log() { echo "slurm.sh: $*"; }

# Every daemon's log is printed when the test fails: that is where Slurm says why.
dump_logs() {
    [ "$ZT_FAILED" = 1 ] || return 0
    for f in "$S"/log/*; do
        [ -f "$f" ] && { echo "==== $f (last 40 lines)"; tail -n 40 "$f"; }
    done
}
at_exit dump_logs

# ---- munge ---------------------------------------------------------------------
mungekey -c -k "$S/munge/munge.key" >/dev/null 2>&1 || fail "mungekey could not create a key"
# -f: munged refuses root and group-writable /tmp otherwise.
munged -f --key-file="$S/munge/munge.key" --socket="$S/munge/socket" --pid-file="$S/munge/munged.pid" \
    --log-file="$S/log/munged.log" --seed-file="$S/munge/seed" || fail "munged did not start"
at_exit "munged -s -S '$S/munge/socket' >/dev/null 2>&1 || kill \$(cat '$S/munge/munged.pid' 2>/dev/null) 2>/dev/null"

# ---- slurm.conf ----------------------------------------------------------------
free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    else
        echo $((20000 + ($$ + $1) % 20000))
    fi
}
ctld_port=$(free_port 0)
slurmd_port=$(free_port 1)
[ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$((ctld_port + 1))
node=$(hostname -s)
export SLURM_CONF="$S/slurm.conf"
cat >"$SLURM_CONF" <<EOF
# Written by tests/mpi/slurm.sh: one node on localhost, everything in $S.
ClusterName=zttest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/socket
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
# No cgroups in containers: track processes by parent pid, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Trust the CPU count below even on a 1-core machine: jobs ask for 2 tasks.
SlurmdParameters=config_overrides
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=600
JobRequeue=1
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

# ---- daemons -------------------------------------------------------------------
stop_cluster() {
    # Jobs first, so that no slurmstepd outlives the daemons.
    scancel --quiet --full --partition=debug 2>/dev/null
    i=0
    while [ $i -lt 15 ] && [ -n "$(squeue -h -t R,CG 2>/dev/null)" ]; do sleep 1; i=$((i + 1)); done
    [ -n "${slurmd_pid:-}" ] && kill "$slurmd_pid" 2>/dev/null
    [ -n "${ctld_pid:-}" ] && kill "$ctld_pid" 2>/dev/null
    sleep 1
    [ -n "${slurmd_pid:-}" ] && kill -9 "$slurmd_pid" 2>/dev/null
    [ -n "${ctld_pid:-}" ] && kill -9 "$ctld_pid" 2>/dev/null
}
slurmctld -D -i -f "$SLURM_CONF" >"$S/log/slurmctld.out" 2>&1 &
ctld_pid=$!
slurmd -D -f "$SLURM_CONF" >"$S/log/slurmd.out" 2>&1 &
slurmd_pid=$!
at_exit stop_cluster

i=0
until sinfo -h -n "$node" -o %t 2>/dev/null | grep -qx idle; do
    i=$((i + 1))
    [ $i -le 30 ] || fail "node $node not idle after 30 s: $(sinfo -h -o '%n %t %E' 2>&1)"
    kill -0 "$ctld_pid" 2>/dev/null || fail "slurmctld died"
    kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd died"
    sleep 1
done
log "cluster up: node $node idle (slurmctld port $ctld_port, slurmd port $slurmd_port)"

out=$(srun -n 2 hostname 2>&1) || fail "srun -n 2 hostname failed: $out"
[ "$(echo "$out" | grep -c .)" -eq 2 ] || fail "srun -n 2 hostname printed: $out"
srun --mpi=list 2>&1 | grep -q pmix || skip "this Slurm has no PMIx plugin (srun --mpi=list)"

# ---- helpers -------------------------------------------------------------------
job_field() { # job_field ID Field -> value from scontrol show job
    scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# wait_state ID SECONDS STATE... : until the job is in one of STATEs.
wait_state() {
    id=$1 secs=$2
    shift 2
    i=0
    while :; do
        st=$(job_field "$id" JobState)
        for want in "$@"; do [ "$st" = "$want" ] && return 0; done
        i=$((i + 1))
        [ $i -le "$secs" ] || fail "job $id is $st after $secs s, expected $*"
        sleep 1
    done
}

# wait_done ID SECONDS: until the job ended; its log is printed.
wait_done() {
    wait_state "$1" "$2" COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL OUT_OF_MEMORY BOOT_FAIL DEADLINE
    log "job $1: $(job_field "$1" JobState), exit code $(job_field "$1" ExitCode)"
}

# The jobs run the real ztrain from a temp submit directory, with the site block
# set through sbatch's exported environment and #SBATCH lines overridden on its
# command line: the scripts themselves are the ones users get.
make_tiny_data "$ZT_TMP/data"
sed -e 's/max_steps = [0-9]*;/max_steps = 8;/' "$ZT_SRCDIR/inputs/tiny.cfg" >"$ZT_TMP/tiny.cfg"
grep -q "max_steps = 8;" "$ZT_TMP/tiny.cfg" || fail "inputs/tiny.cfg has no max_steps line to edit"
export ZTRAIN CONFIG="$ZT_TMP/tiny.cfg" SRUN_MPI=pmix
SB="sbatch --parsable --chdir=$ZT_TMP --time=10 --partition=debug"

# check_training LOGFILE STEPS: the log of a successful 2-rank run.
check_training() {
    assert_contains "$1" "2 ranks"
    assert_contains "$1" "step     $2/$2 |"
    [ "$(grep -c '^step .* | loss ' "$1")" -ge "$2" ] || fail "$1: fewer than $2 progress lines"
    assert_contains "$1" "summary: $2 steps"
    assert_contains "$1" "ztrain exited with 0"
}

# ---- 1. single node ------------------------------------------------------------
id=$(ZT_ARGS="train.output_dir=runs/single" $SB -n 2 --output="$ZT_TMP/single-%j.out" \
    "$ZT_SRCDIR/jobs/single-node.sbatch") || fail "sbatch single-node.sbatch failed"
wait_done "$id" 120
cat "$ZT_TMP/single-$id.out"
[ "$(job_field "$id" JobState)" = COMPLETED ] || fail "single-node job $id did not complete"
[ "$(job_field "$id" ExitCode)" = 0:0 ] || fail "single-node job $id exit code $(job_field "$id" ExitCode)"
check_training "$ZT_TMP/single-$id.out" 8
log "single-node.sbatch: ok"

# ---- 2. "multi-node" shape on one node -----------------------------------------
id=$(ZT_ARGS="train.output_dir=runs/multi" $SB --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
    --output="$ZT_TMP/multi-%j.out" "$ZT_SRCDIR/jobs/multi-node.sbatch") || fail "sbatch multi-node.sbatch failed"
wait_done "$id" 120
cat "$ZT_TMP/multi-$id.out"
[ "$(job_field "$id" ExitCode)" = 0:0 ] || fail "multi-node job $id exit code $(job_field "$id" ExitCode)"
check_training "$ZT_TMP/multi-$id.out" 8
assert_contains "$ZT_TMP/multi-$id.out" "1 nodes"
log "multi-node.sbatch: ok"

# ---- 3. signal, checkpoint, requeue, resume ------------------------------------
# A run far too long to finish; it is stopped by SIGUSR1 to the batch shell, as
# --signal=B:USR1@120 does before the time limit. max_steps lives in the config
# file (not in ZT_ARGS, which sbatch froze at submission) so that the rerun can
# be given an end.
sed -e 's/max_steps = [0-9]*;/max_steps = 1000000;/' "$ZT_SRCDIR/inputs/tiny.cfg" >"$ZT_TMP/long.cfg"
rq_out="$ZT_TMP/requeue.out"
id=$(CONFIG="$ZT_TMP/long.cfg" ZT_ARGS="train.output_dir=runs/requeue train.eval_steps=0" \
    $SB -n 2 --output="$rq_out" "$ZT_SRCDIR/jobs/requeue.sbatch") || fail "sbatch requeue.sbatch failed"
wait_state "$id" 60 RUNNING
i=0
until grep -q '^step .* | loss ' "$rq_out" 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 60 ] || { cat "$rq_out"; fail "requeue job $id printed no step line in 60 s"; }
    [ "$(job_field "$id" JobState)" = RUNNING ] || { cat "$rq_out"; fail "requeue job $id ended early"; }
    sleep 1
done
scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 $id failed"
# The script requeues: the job comes back PENDING (Slurm holds requeued jobs ~2 min).
i=0
until [ "$(job_field "$id" Restarts)" = 1 ] && [ "$(job_field "$id" JobState)" = PENDING ]; do
    i=$((i + 1))
    [ $i -le 60 ] || { cat "$rq_out"; fail "job $id not requeued 60 s after SIGUSR1 ($(job_field "$id" JobState))"; }
    sleep 1
done
cat "$rq_out"
assert_contains "$rq_out" "requeue.sbatch: SIGUSR1"
assert_contains "$rq_out" "requeue.sbatch: ztrain exited with 75"
assert_contains "$rq_out" "requeueing job $id"
ls "$ZT_TMP"/runs/requeue/*.h5 >/dev/null 2>&1 || fail "no checkpoint in $ZT_TMP/runs/requeue after the signal"
# Every step up to the signal was logged, and the checkpoint is at the last one.
last=$(sed -n 's/^step *\([0-9]*\)\/.* | loss .*/\1/p' "$rq_out" | tail -n 1)
[ -n "$last" ] || fail "no step number in $rq_out"
end=$((last + 5))
log "stopped at step $last; the rerun must resume and finish at step $end"
sed -i -e "s/max_steps = [0-9]*;/max_steps = $end;/" "$ZT_TMP/long.cfg"
# Release the rerun only when the old steps' slurmstepd are gone: the rerun reuses
# the step ids, and its PMIx server fails to bind the socket (spool/
# stepd.slurm.pmix.ID.0) the old one has not removed yet ("Address already in
# use"; found here). Slurm's own 2-minute hold of requeued jobs hides this.
i=0
while ls "$S/spool" | grep -q "[._]$id\."; do
    i=$((i + 1))
    [ $i -le 30 ] || fail "the steps of job $id still have sockets in $S/spool after 30 s"
    sleep 1
done
scontrol update JobId="$id" StartTime=now || fail "scontrol update StartTime=now failed"
wait_done "$id" 120
cat "$rq_out"
[ "$(job_field "$id" ExitCode)" = 0:0 ] || fail "requeued job $id exit code $(job_field "$id" ExitCode)"
assert_contains "$rq_out" "start 1 on"
assert_contains "$rq_out" "resumed from"
# The first step of the rerun is the one after the checkpoint, not step 1.
first=$(sed -n '/requeue.sbatch: job .* start 1 on/,$p' "$rq_out" |
    sed -n 's/^step *\([0-9]*\)\/.* | loss .*/\1/p' | head -n 1)
[ "$first" = $((last + 1)) ] || fail "rerun started at step '$first', expected $((last + 1))"
assert_contains "$rq_out" "step $(printf '%5d' "$end")/$end |"
log "requeue.sbatch: ok (signal at step $last, resumed at $first, finished at $end)"
echo "slurm: ok"
