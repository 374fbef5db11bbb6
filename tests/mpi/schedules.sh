#!/bin/sh
# schedules.sh — the learning rate a run logs at every optimizer step is transformers'
# get_scheduler's (tests/reference/schedules.json, made by transformers itself), for
# each schedule type with and without warm-up, through the keys a user sets: step 1 of a
# warm-up runs at 0, the peak comes at step warmup_steps + 1. A run resumed in the middle
# of a warmup_stable_decay schedule from its checkpoint (the config stored there) logs the
# rest of the same schedule; on 2 ranks under zero3 the schedule is the same.
. "$(dirname "$0")/common.sh"
need_h5py
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
FIX="$ZT_SRCDIR/tests/reference/schedules.json"
common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=12 checkpoint.save_hf=false optim.weight_decay=0"

# the overrides of fixture case I (its type, lr, warm-up and kwargs)
case_args() {
    "$PY" - "$FIX" "$1" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]
a = [f"optim.lr_scheduler_type={c['type']}", f"optim.learning_rate={c['lr']!r}",
     f"optim.warmup_steps={c['warmup_steps']}", f"optim.warmup_ratio={c['warmup_ratio']!r}"]
for k, v in c["kwargs"].items():
    a.append(f'optim.{k}="{v}"' if isinstance(v, str) else f"optim.{k}={v!r}")
print(" ".join(a))
PYEOF
}

# every step FROM.. that DIR's metrics.jsonl logs has case I's learning rate (%.9g as logged)
check_lrs() {
    "$PY" - "$FIX" "$1" "$2" "$3" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))["cases"][int(sys.argv[2])]
got = {}
for line in open(sys.argv[3] + "/metrics.jsonl"):
    r = json.loads(line)
    if "step" in r and "lr" in r:
        got[r["step"]] = r["lr"]
first = int(sys.argv[4])
steps = [s for s in sorted(got) if s >= first]
bad = [(s, got[s], c["lrs"][s - 1]) for s in steps if float("%.9g" % c["lrs"][s - 1]) != got[s]]
if not steps or steps[-1] != c["S"] or bad:
    print(f"case {sys.argv[2]} ({c['type']} W={c['W']} {c['kwargs']}): steps {steps}; differing (step, ztrain, "
          f"transformers): {bad[:4]}")
    sys.exit(1)
PYEOF
}

n=$("$PY" -c "import json; print(len(json.load(open('$FIX'))['cases']))")
[ "$n" -ge 20 ] || fail "$FIX has $n cases"
i=0
while [ "$i" -lt "$n" ]; do
    # shellcheck disable=SC2046,SC2086
    run_ztrain 1 $common $(case_args $i) train.output_dir=case$i >/dev/null
    check_lrs $i case$i 1 || fail "the learning rates of case $i are not transformers'"
    i=$((i + 1))
done
echo "ok: $n schedules equal transformers' at every step"
# the comparison can fail: case 1 (linear, warm-up 3) against case 0's rates
check_lrs 0 case1 1 && fail "the comparison cannot fail: a warm-up of 3 logs the rates of none"

# resume in the middle of warmup_stable_decay (case 22: cosine warm-up, 1-sqrt decay,
# min_lr_ratio), from step 7 with the checkpoint's stored config, and on 2 ranks
wsd=22
"$PY" -c "import json,sys; c=json.load(open('$FIX'))['cases'][$wsd]; sys.exit(c['type'] != 'warmup_stable_decay')" ||
    fail "case $wsd is not warmup_stable_decay"
# shellcheck disable=SC2046,SC2086
run_ztrain 1 $common $(case_args $wsd) checkpoint.save_steps=7 checkpoint.keep_last=0 train.output_dir=wsd >/dev/null
ck=wsd/ckpt-00000007.h5
[ -f "$ck" ] || fail "no $ck"
"$PY" "$CHECK" attr "$ck" config >stored.cfg || fail "cannot read the config stored in $ck"
run_ztrain 1 stored.cfg checkpoint.resume="$ck" train.output_dir=wsd_resumed >/dev/null
assert_contains "$ZT_OUT" "resumed from $ck"
check_lrs $wsd wsd_resumed 8 || fail "the resumed run left transformers' schedule"
# shellcheck disable=SC2046,SC2086
run_ztrain 2 $common $(case_args $wsd) parallel.strategy=zero3 train.output_dir=wsd_zero3 >/dev/null
check_lrs $wsd wsd_zero3 1 || fail "zero3 on 2 ranks logs another schedule"
echo "schedules: transformers' get_scheduler at every step, kept on resume and across ranks"
