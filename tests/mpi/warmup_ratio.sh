#!/bin/sh
# warmup_ratio.sh — optim.warmup_ratio warms up for ceil(total steps x ratio) steps, as
# transformers' get_warmup_steps, of the steps the run derives (here from
# train.num_train_epochs: 10): the learning rates and losses are bitwise those of the
# equivalent optim.warmup_steps (3 for 0.21, where rounding or truncating gives 2), not
# those of one step more; the run says so in its first lines; and a run resumed inside
# the warm-up from a checkpoint, with the config stored in it, continues the same
# schedule. Given beside tiny.cfg's warmup_steps = 2 it is refused.
. "$(dirname "$0")/common.sh"
need_h5py
make_tiny_data "$ZT_TMP/data"
cd "$ZT_TMP" || fail "cd"
common="$ZT_SRCDIR/inputs/tiny.cfg data.train_files=data/tiny-train.h5 data.val_files=[] train.eval_steps=0
  train.sample_tokens=0 train.max_steps=0 train.num_train_epochs=0.01 optim.learning_rate=3e-3
  checkpoint.save_hf=false"

# shellcheck disable=SC2086
expect_fail_with 1 "optim.warmup_ratio (0.21) and optim.warmup_steps (2) are both set" $common \
    optim.warmup_ratio=0.21 train.output_dir=both
# shellcheck disable=SC2086
run_ztrain 1 $common optim.warmup_steps=0 optim.warmup_ratio=0.21 checkpoint.save_steps=2 checkpoint.keep_last=0 \
    train.output_dir=ratio >/dev/null
total=$(sed -n 's/^.*batch: global .*; \([0-9]*\) steps$/\1/p' "$ZT_OUT")
warm=$(sed -n 's/^.*warm-up: \([0-9]*\) steps = ceil(\([0-9]*\) steps x optim.warmup_ratio 0.21)$/\1 \2/p' "$ZT_OUT")
[ -n "$total" ] && [ "$total" -gt 8 ] || fail "no total of more than 8 steps in the start-up lines: '$total'"
want=$("$PY" -c "import math; print(math.ceil($total * 0.21))")
[ "$warm" = "$want $total" ] || fail "warm-up line says '$warm', transformers' get_warmup_steps gives $want of $total"
echo "ok: $want warm-up steps of $total"

# shellcheck disable=SC2086
run_ztrain 1 $common optim.warmup_steps="$want" train.output_dir=steps >/dev/null
grep -q "warm-up:" "$ZT_OUT" && fail "a run with optim.warmup_steps logs a warm-up from the ratio"
# shellcheck disable=SC2086
run_ztrain 1 $common optim.warmup_steps=$((want + 1)) train.output_dir=steps1 >/dev/null

# same KEY of every step FROM.. in both runs' metrics, as logged (%.9g text)
same() {
    "$PY" - "$@" <<'PYEOF'
import json, sys
def steps(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        r = json.loads(line)
        if "step" in r and "lr" in r:
            out[r["step"]] = (r["lr"], r["loss"])
    return out
a, b, first = steps(sys.argv[1]), steps(sys.argv[2]), int(sys.argv[3])
ka = sorted(k for k in a if k >= first)
sys.exit(not (ka and ka == sorted(k for k in b if k >= first) and all(a[k] == b[k] for k in ka)))
PYEOF
}
same ratio steps 1 || fail "optim.warmup_ratio's learning rates or losses differ from optim.warmup_steps=$want's"
same ratio steps1 1 && fail "the comparison cannot fail: warmup_steps=$((want + 1)) logs the same"

# resume from step 2 (inside the warm-up) with the checkpoint's own config
ck=ratio/ckpt-00000002.h5
[ -f "$ck" ] || fail "no $ck"
"$PY" "$CHECK" attr "$ck" config >stored.cfg || fail "cannot read the config stored in $ck"
grep -q "warmup_ratio = 0.21;" stored.cfg || fail "$ck's config has no warmup_ratio = 0.21"
run_ztrain 1 stored.cfg checkpoint.resume="$ck" train.output_dir=resumed >/dev/null
assert_contains "$ZT_OUT" "resumed from $ck"
assert_contains "$ZT_OUT" "warm-up: $want steps = ceil($total steps"
same ratio resumed 3 || fail "the run resumed with its checkpoint's config left the warmup_ratio schedule"
echo "warmup_ratio: ceil(steps x ratio) warm-up steps, the schedule of warmup_steps, kept on resume"
