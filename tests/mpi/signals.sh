#!/bin/sh
# signals.sh — signals and hangs through the real launcher and ztrain.
#
# SIGUSR1 sent to mpirun mid-run (what Slurm's --signal does before the time
# limit) is forwarded to the ranks, which agree at a step boundary, write a
# checkpoint and exit 75 (requeue); running the same command again resumes and
# must end bitwise equal to an uninterrupted run. A rank stalled by fault
# injection must make the watchdog end the whole job within seconds with a
# message naming the step, instead of hanging until the launcher's time limit.
. "$(dirname "$0")/common.sh"
need_h5py
zt_need_ztrain
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
# A model wide and long enough that 60 steps take a few seconds on 2 ranks, so
# there is time to send a signal in the middle of the run.
max=60
cfg="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 model.n_embd=128 model.n_head=4 model.block_size=64 data.seq_len=64
  train.per_device_train_batch_size=4 train.max_steps=$max optim.warmup_steps=5 optim.learning_rate=1e-3"

# shellcheck disable=SC2086
run_ztrain 2 $cfg train.output_dir=full >/dev/null

# pids_of COMM DIR: processes named COMM whose command line names output dir DIR
pids_of() {
    for p in $(pgrep -f "train.output_dir=$2"); do
        [ "$(cat /proc/"$p"/comm 2>/dev/null)" = "$1" ] && echo "$p"
    done
}

sig="$ZT_TMP/sig"    # absolute: identifies this run among all processes
# shellcheck disable=SC2086
ZT_TEST_TIMEOUT=120 sh "$ZT_MPIRUN" 2 "$ZTRAIN" $cfg checkpoint.resume=auto train.output_dir="$sig" >sig1.out 2>&1 &
job=$!
at_exit "kill $job 2>/dev/null"
i=0
until grep -q '"step":5,' "$sig/metrics.jsonl" 2>/dev/null; do
    kill -0 $job 2>/dev/null || { cat sig1.out; fail "the run ended before step 5"; }
    [ $i -lt 600 ] || fail "no step 5 in $sig/metrics.jsonl after 60 s"
    sleep 0.1
    i=$((i + 1))
done
mpirun_pid=$(pids_of mpirun "$sig" | head -n 1)
[ -n "$mpirun_pid" ] || mpirun_pid=$(pids_of orterun "$sig" | head -n 1)
[ -n "$mpirun_pid" ] || fail "cannot find the mpirun of this run"
kill -USR1 "$mpirun_pid" || fail "kill -USR1 $mpirun_pid"
wait $job
rc=$?
grep -v '^step' sig1.out
[ $rc -eq 75 ] || fail "after SIGUSR1 ztrain exited $rc, expected 75 (checkpoint written, requeue)"
[ -s "$sig/latest" ] || fail "no checkpoint after SIGUSR1"
ck="$sig/$(basename "$(cat "$sig/latest")")"
"$ZT_CKPT" verify "$ck" >/dev/null || fail "checkpoint $ck written on SIGUSR1 is invalid"
s=$("$PY" "$CHECK" attr "$ck" step) || fail "cannot read the step of $ck"
[ "$s" -ge 5 ] && [ "$s" -lt $max ] || fail "checkpoint on SIGUSR1 is of step $s, expected 5..$((max - 1))"
echo "ok: SIGUSR1 at step >= 5 -> exit 75 with a checkpoint of step $s"

# The same command again, as a requeued job would run it.
# shellcheck disable=SC2086
run_ztrain 2 $cfg checkpoint.resume=auto train.output_dir="$sig" >/dev/null
assert_contains "$ZT_OUT" "resumed from $ck: step $s,"
"$PY" "$CHECK" steps "$sig" $((s + 1)) $max || fail "the requeued run skipped or repeated steps"
"$PY" "$CHECK" exact full "$sig" || fail "a run stopped by SIGUSR1 and requeued differs from the uninterrupted run"

# --- the watchdog through ztrain: rank 1 stalls at step 3 ---------------------
start=$(date +%s)
# shellcheck disable=SC2086
ZT_TEST_TIMEOUT=60 run_ztrain_rc 2 $ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] \
    train.sample_tokens=0 fault.kind=stall fault.rank=1 fault.step=3 parallel.timeout_s=3 train.output_dir=stall >/dev/null
took=$(($(date +%s) - start))
grep -qF "zt_mpirun.sh: TIMEOUT" "$ZT_OUT" && fail "a stalled rank hung the job until the launcher's timeout"
[ "$ZT_RC" -ne 0 ] || fail "ztrain exited 0 although rank 1 stalled"
[ $took -le 15 ] || fail "the job with a stalled rank took ${took} s to end (parallel.timeout_s=3)"
grep "watchdog" "$ZT_OUT" | grep -F "at step 3" >/dev/null || { cat "$ZT_OUT"; fail "no watchdog message naming step 3"; }
echo "ok: stalled rank 1 at step 3: job ended in ${took} s with $ZT_RC and a watchdog report"
echo "signals: SIGUSR1 checkpoint + exit 75 + bit-exact requeue; watchdog ends a stalled job"
