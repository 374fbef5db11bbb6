#!/bin/sh
# checkpoint.sh — checkpoints of the real ztrain binary, end to end.
#
# Stopping and resuming must not change training at all: a run split at step 10
# and resumed with checkpoint.resume=auto logs bitwise the same losses and ends
# with bitwise the same weights and Adam state as the uninterrupted run (ddp,
# zero3 per_param, and the sharded format). Also: the file is plain HDF5 that
# h5dump and h5py read, keep_last prunes, a rank killed with SIGKILL in the
# middle of a save leaves the previous checkpoint valid and resumable, and
# model.init_from takes weights only (fresh optimizer, step and data position),
# also through a zt-ckpt export/import round trip.
. "$(dirname "$0")/common.sh"
need_h5py
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
# A constant learning rate after warm-up: with cosine or linear decay the
# schedule of a max_steps=10 run differs from that of a max_steps=20 one, so the
# split run would rightly differ.
common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 optim.warmup_steps=3 optim.learning_rate=3e-3 optim.lr_scheduler_type=constant_with_warmup"

resume_exact 2 ddp2 parallel.strategy=ddp
"$PY" "$CHECK" exact ddp2-full ddp2-split || fail "ddp on 2 ranks: resumed run differs from the uninterrupted one"

resume_exact 3 zero3pp parallel.strategy=zero3 parallel.shard_layout=per_param
"$PY" "$CHECK" exact zero3pp-full zero3pp-split || fail "zero3 per_param on 3 ranks: resumed run differs"

resume_exact 3 zero3sh parallel.strategy=zero3 checkpoint.format=sharded
[ -d zero3sh-split/ckpt-00000020.shards ] || fail "checkpoint.format=sharded wrote no ckpt-00000020.shards"
"$ZT_CKPT" verify zero3sh-split/ckpt-00000010.shards || fail "zt-ckpt verify rejects a sharded checkpoint"
for d in zero3sh-full zero3sh-split; do
    "$ZT_CKPT" consolidate "$d/ckpt-00000020.shards" "$d/ckpt-00000020.h5" >/dev/null ||
        fail "zt-ckpt consolidate $d/ckpt-00000020.shards failed"
done
"$PY" "$CHECK" exact zero3sh-full zero3sh-split || fail "zero3 with sharded checkpoints: resumed run differs"

# The exact comparison must be able to fail: a slightly different learning rate.
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=20 optim.learning_rate=3.0001e-3 train.output_dir=lr-off >/dev/null
"$PY" "$CHECK" exact ddp2-full lr-off --from 11 >/dev/null 2>&1 && fail "resume_check.py exact accepted a different run"

# --- the file is HDF5 as documented: h5dump and h5py read it ------------------
ck=ddp2-split/ckpt-00000010.h5
H5DUMP=${H5DUMP:-$(command -v h5dump)}
if [ -n "$H5DUMP" ] && [ -x "$H5DUMP" ]; then
    "$H5DUMP" -H -d /model/transformer.wte.weight "$ck" >h5dump.out 2>&1 || { cat h5dump.out; fail "h5dump -H cannot read $ck"; }
    assert_contains h5dump.out "( 257, 32 ) / ( 257, 32 )"
    assert_contains h5dump.out "H5T_IEEE_F32LE"
    "$H5DUMP" -a /format "$ck" >h5dump.out 2>&1 || { cat h5dump.out; fail "h5dump cannot read attribute /format of $ck"; }
    assert_contains h5dump.out '"ztrain-checkpoint"'
    echo "ok: h5dump reads /model/transformer.wte.weight (257, 32) and format = \"ztrain-checkpoint\""
else
    echo "note: no h5dump, its part of the check is left out"
fi
[ "$("$PY" "$CHECK" shape "$ck" transformer.wte.weight)" = "257 32" ] || fail "h5py: /model/transformer.wte.weight of $ck is not (257, 32)"
[ "$("$PY" "$CHECK" attr "$ck" format)" = ztrain-checkpoint ] || fail "h5py: root attribute format of $ck"
[ "$("$PY" "$CHECK" attr "$ck" step)" = 10 ] || fail "h5py: root attribute step of $ck is not 10"
[ "$("$PY" "$CHECK" attr "$ck" world_size)" = 2 ] || fail "h5py: root attribute world_size of $ck is not 2"

# --- string attributes as h5py writes them: ztrain resumes from them -----------
# A Python str becomes a variable-length UTF-8 attribute, np.bytes_ a fixed-length
# NULLPAD one without terminator; both must resume (the first one bit-exactly).
for kind in str bytes_; do
    rm -rf "h5py-$kind"
    mkdir "h5py-$kind" && cp ddp2-split/ckpt-00000010.h5 "h5py-$kind/" && echo ckpt-00000010.h5 >"h5py-$kind/latest" ||
        fail "cannot copy ddp2-split/ckpt-00000010.h5"
    "$PY" - "h5py-$kind/ckpt-00000010.h5" "$kind" <<'PY' || fail "h5py could not rewrite the root string attributes as $kind"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r+")
for k in [k for k in f.attrs if isinstance(f.attrs[k], (bytes, str, np.bytes_))]:
    s = f.attrs[k]
    s = s.decode() if isinstance(s, bytes) else str(s)
    del f.attrs[k]
    f.attrs[k] = s if sys.argv[2] == "str" else np.bytes_(s.encode())
PY
done
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=20 checkpoint.resume=auto train.output_dir=h5py-str >/dev/null
assert_contains "$ZT_OUT" "resumed from h5py-str/ckpt-00000010.h5"
"$PY" "$CHECK" exact ddp2-full h5py-str --from 11 || fail "run resumed from h5py-written string attributes differs"
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=11 checkpoint.resume=auto train.output_dir=h5py-bytes_ >/dev/null
assert_contains "$ZT_OUT" "resumed from h5py-bytes_/ckpt-00000010.h5"
echo "ok: ztrain resumes from checkpoints whose string attributes h5py rewrote (str, np.bytes_)"

# --- keep_last ---------------------------------------------------------------
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=20 checkpoint.save_steps=5 checkpoint.keep_last=2 train.output_dir=keep >/dev/null
left=$(cd keep && echo ckpt-*)
[ "$left" = "ckpt-00000015.h5 ckpt-00000020.h5" ] || fail "keep_last=2 left '$left', expected ckpt-00000015.h5 ckpt-00000020.h5"
[ "$(cat keep/latest)" = ckpt-00000020.h5 ] || [ "$(cat keep/latest)" = keep/ckpt-00000020.h5 ] ||
    fail "keep/latest names '$(cat keep/latest)', expected ckpt-00000020.h5"
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=20 checkpoint.save_steps=5 checkpoint.keep_last=0 train.output_dir=keepall >/dev/null
left=$(cd keepall && echo ckpt-*)
[ "$left" = "ckpt-00000005.h5 ckpt-00000010.h5 ckpt-00000015.h5 ckpt-00000020.h5" ] || fail "keep_last=0 left '$left'"
echo "ok: keep_last=2 keeps the newest two, latest names the newest, keep_last=0 keeps all"

# --- a rank dies: fault injection after a checkpoint --------------------------
# The crashed segment logged steps 11..13; after resuming from step 10 the run
# must still end bitwise equal to the uninterrupted one.
# shellcheck disable=SC2086
ZT_TEST_TIMEOUT=60 run_ztrain_rc 2 $common train.max_steps=20 checkpoint.save_steps=5 fault.kind=kill fault.rank=1 \
    fault.step=13 train.output_dir=crash >/dev/null
[ "$ZT_RC" -ne 0 ] || fail "ztrain exited 0 although rank 1 was killed"
grep -qF "zt_mpirun.sh: TIMEOUT" "$ZT_OUT" && fail "the job hung after rank 1 was killed"
"$ZT_CKPT" verify crash/ckpt-00000010.h5 || fail "checkpoint of step 10 invalid after the crash"
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=20 checkpoint.save_steps=5 checkpoint.resume=auto train.output_dir=crash >/dev/null
assert_contains "$ZT_OUT" "resumed from crash/ckpt-00000010.h5"
"$PY" "$CHECK" steps crash 11 20 || fail "run resumed after the crash did not log steps 11..20"
"$PY" "$CHECK" exact ddp2-full crash || fail "run resumed after a crash differs from the uninterrupted one"

# --- a full disk: the save fails cleanly ----------------------------------------
# A 700 KiB tmpfs holds the checkpoint of step 5 (450 KiB) but not a second one. The
# save of step 10 must fail with one error line naming the file, keep ckpt 5 as
# latest, leave no .tmp, and every rank must exit 1 (HDF5 crashed at MPI_Finalize
# with 139 once). Every rank writes its exit status to a file, and mpirun waits
# for all of them. A file-size limit (ulimit -f) cannot stand in: it breaks Open
# MPI's own shared-memory files, so without mount (not root, a container) this skips.
full="$ZT_TMP/fulldisk"
mkdir -p "$full" || fail "mkdir $full"
if mount -t tmpfs -o size=700k tmpfs "$full" 2>/dev/null; then
    at_exit "umount '$full' 2>/dev/null"
    # shellcheck disable=SC2086
    every_rank_exits 2 1 "after a save on a full disk" $common train.max_steps=10 checkpoint.save_steps=5 \
        train.output_dir="$full/out"
    assert_contains "$ZT_OUT" "ztrain: error: checkpoint at step 10 failed: $full/out/ckpt-00000010.h5.tmp: "
    [ "$(grep -c "error" "$ZT_OUT")" -eq 1 ] || { cat "$ZT_OUT"; fail "a save on a full disk gave more than one error line"; }
    [ "$(cat "$full/out/latest")" = ckpt-00000005.h5 ] || fail "latest names '$(cat "$full/out/latest")' after the failed save"
    "$ZT_CKPT" verify "$full/out/ckpt-00000005.h5" >/dev/null || fail "ckpt 5 is invalid after the failed save"
    left=$(cd "$full/out" && echo ckpt-*)
    [ "$left" = ckpt-00000005.h5 ] || fail "after the failed save the directory holds '$left'"
    echo "ok: a save on a full disk: exit 1 on both ranks, $(grep error "$ZT_OUT" | cut -c1-60)..., ckpt 5 intact and latest"
    umount "$full" || fail "umount $full"
else
    echo "SKIP part: full-disk save (cannot mount a tmpfs here: needs root outside a restricted container)"
fi

# --- kill -9 of one rank while a checkpoint is being written -------------------
# fault.kind=save_kill kills rank 1 with SIGKILL from inside the save of step 4,
# after the first tensor of ckpt-00000004.h5.tmp was written (a save of the tiny
# model takes ~0.02 s: catching one from outside was a race). The checkpoint of
# step 3 must stay valid, latest and resumable, and the job must end non-zero.
ks="$ZT_TMP/killsave"
# shellcheck disable=SC2086
ZT_TEST_TIMEOUT=90 sh "$ZT_MPIRUN" 2 "$ZTRAIN" $common train.max_steps=8 checkpoint.save_steps=1 \
    checkpoint.keep_last=2 fault.kind=save_kill fault.rank=1 fault.step=4 train.output_dir="$ks" >killsave.out 2>&1
rc=$?
grep -qF "zt_mpirun.sh: TIMEOUT" killsave.out && { cat killsave.out; fail "the job hung after a rank was killed during a save"; }
[ $rc -ne 0 ] || fail "ztrain exited 0 although a rank was killed with SIGKILL"
assert_contains killsave.out "fault injection: killing rank 1 during the save of step 4 ($ks/ckpt-00000004.h5.tmp partly written)"
[ -s "$ks/ckpt-00000004.h5.tmp" ] || fail "no partly written $ks/ckpt-00000004.h5.tmp: the kill did not happen during the save"
[ ! -e "$ks/ckpt-00000004.h5" ] || fail "the partial save of step 4 became $ks/ckpt-00000004.h5"
[ "$(cat "$ks/latest")" = ckpt-00000003.h5 ] || fail "latest names '$(cat "$ks/latest")' after the kill, expected ckpt-00000003.h5"
echo "ok: rank 1 killed inside the save of step 4 (tmp file of $(wc -c <"$ks/ckpt-00000004.h5.tmp") bytes); job ended with $rc"
[ -s "$ks/latest" ] || fail "no $ks/latest after the crash"
good=$(cat "$ks/latest")
case $good in /*) ;; *) good="$ks/$(basename "$good")" ;; esac
"$ZT_CKPT" verify "$good" || fail "the last complete checkpoint $good is invalid after kill -9 during a save"
s=$("$PY" "$CHECK" attr "$good" step) || fail "cannot read step of $good"
# shellcheck disable=SC2086
ZT_TEST_TIMEOUT=120 run_ztrain 2 $common train.max_steps=$((s + 3)) checkpoint.resume=auto train.output_dir="$ks" >/dev/null
assert_contains "$ZT_OUT" "resumed from $good: step $s,"
"$PY" "$CHECK" steps "$ks" $((s + 1)) $((s + 3)) || fail "run resumed after kill -9 during a save"
echo "ok: resumed from $good (step $s) after kill -9 during a save and finished"

# --- model.init_from: weights only --------------------------------------------
# Initial weights saved unchanged (learning rate 0 for one step, Adam moments
# nonzero) and loaded with init_from must give exactly the fresh 20-step run:
# the optimizer state, step counter, schedule and data position start anew.
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=1 optim.learning_rate=0 train.output_dir=init0 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=20 model.init_from=init0/ckpt-00000001.h5 train.output_dir=from-init0 >/dev/null
"$PY" "$CHECK" steps from-init0 1 20 || fail "init_from run did not start at step 1"
"$PY" "$CHECK" exact ddp2-full from-init0 || fail "init_from of the initial weights differs from a fresh run"

# From trained weights: step 1 again (warm-up lr), and a loss on the first batch
# below a fresh model's.
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=3 model.init_from=ddp2-full/ckpt-00000020.h5 train.output_dir=ft >/dev/null
"$PY" "$CHECK" steps ft 1 3 || fail "init_from run did not start at step 1"
[ "$("$PY" "$CHECK" lr ft 1)" = "$("$PY" "$CHECK" lr ddp2-full 1)" ] || fail "init_from run does not start the lr warm-up anew"
l_ft=$("$PY" "$CHECK" loss ft 1) || fail "no step-1 loss in ft"
l_fresh=$("$PY" "$CHECK" loss ddp2-full 1) || fail "no step-1 loss in ddp2-full"
l_20=$("$PY" "$CHECK" loss ddp2-full 20) || fail "no step-20 loss in ddp2-full"
awk -v a="$l_ft" -v b="$l_fresh" -v c="$l_20" 'BEGIN { exit !(a < b - 0.5 && a < c + 0.5) }' ||
    fail "init_from trained weights: step-1 loss $l_ft, fresh $l_fresh, source at step 20 $l_20"
echo "ok: init_from trained weights: step-1 loss $l_ft (fresh model $l_fresh)"

# zt-ckpt export -> import -> init_from: the same run bit for bit.
mkdir -p hf
"$ZT_CKPT" export ddp2-full/ckpt-00000020.h5 hf/model.safetensors >/dev/null || fail "zt-ckpt export failed"
"$ZT_CKPT" import hf/model.safetensors hf/config.json hf/imported.h5 >/dev/null || fail "zt-ckpt import failed"
"$ZT_CKPT" verify hf/imported.h5 >/dev/null || fail "zt-ckpt verify rejects the imported checkpoint"
# shellcheck disable=SC2086
run_ztrain 2 $common train.max_steps=3 model.init_from=hf/imported.h5 train.output_dir=ft-hf >/dev/null
"$PY" "$CHECK" exact ft ft-hf || fail "init_from after export/import differs from init_from the original checkpoint"
echo "checkpoint: bit-exact resume (ddp, zero3 per_param, sharded), h5dump/h5py, keep_last, kill during save, init_from"
