#!/bin/sh
# lora.sh — LoRA as a run does it: from transformers' llama directory and PEFT's adapter
# (tests/reference/hf/lora-llama), through every strategy, out as a PEFT adapter and a
# merged model.
#  1. Learning rate 0: the adapter written is PEFT's, bit for bit; the merged model is
#     PEFT's merge_and_unload (fp32 rounding: 1e-6); PEFT and transformers load them
#     with the same logits (when the venv of tools/make-venv.sh exists); gemma3's adapter
#     (lora-gemma3) round-trips and loads in PEFT the same way.
#  2. Every strategy and layout at 1-4 ranks trains the same adapters as one rank with
#     accumulation (1e-5), and the base stays what the directory holds, bit for bit.
#  3. Gradient and optimizer memory is the adapters': measured against their size.
#  4. A PEFT adapter that does not fit lora.* fails on every rank with its reason.
#  2b. lora.dropout 0.1 trains the same adapters under zero3 at 2 ranks and ddp at 4 as one
#     rank, and differently from dropout 0.
#  5. GPT-2 (tests/reference/hf/gpt2, Conv1D bases, PEFT's lora-gpt2 with fan_in_fan_out):
#     1's round trip, 2's strategies at 2 ranks against one rank, the base frozen; a
#     subset of targets (c_attn, attn.c_proj) is written as PEFT loads it.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
cd "$ZT_TMP" || fail "cd"
lora_setup
base="model.name_or_path=$HF/llama lora.adapter_name_or_path=$HF/lora-llama"

# ---- 1. round trip at learning rate 0 ------------------------------------------------
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $base parallel.strategy=zero3 train.output_dir=rt >/dev/null
assert_contains "$ZT_OUT" "lora: adapters of $HF/lora-llama loaded"
assert_contains "$ZT_OUT" "PEFT export: rt/adapter (LoRA r=4, scale 2"
"$PY" "$HFPY" same rt/adapter "$HF/lora-llama" || fail "the adapter written is not PEFT's"
"$PY" "$HFPY" close rt/hf "$HF/lora-llama/merged" 1e-6 || fail "the merged export is not PEFT's merge"
"$PY" -c "import json,sys; c=json.load(open('rt/adapter/adapter_config.json')); \
sys.exit(not (c['r'] == 4 and c['lora_alpha'] == 8 and c['peft_type'] == 'LORA' and \
sorted(c['target_modules']) == ['down_proj','gate_proj','k_proj','o_proj','q_proj','up_proj','v_proj']))" ||
    fail "adapter_config.json lacks r, lora_alpha or target_modules"
VPY=${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python
if [ -x "$VPY" ]; then
    # queued: run at the end with one import of torch, transformers and peft (venv_check)
    venv_check "PEFT does not load the adapter with PEFT's logits" \
        "$ZT_SRCDIR/tests/reference/check_peft_export.py" rt/adapter "$HF/llama" "$HF/lora-llama"
    venv_check "transformers does not load the merged model with the merged logits" \
        "$ZT_SRCDIR/tests/reference/check_hf_export.py" rt/hf "$HF/lora-llama/merged" --atol 1e-5
else
    echo "note: no venv at $VPY (tools/make-venv.sh): PEFT's own load of the export not checked"
fi
# gemma3 (GeGLU, sandwich norms, a sliding window): its PEFT adapter in and out unchanged, and PEFT
# loads ztrain's with PEFT's logits
run_ztrain 2 lora.cfg model.name_or_path="$HF/gemma3" lora.adapter_name_or_path="$HF/lora-gemma3" \
    parallel.strategy=zero3 train.output_dir=g3rt >/dev/null
"$PY" "$HFPY" same g3rt/adapter "$HF/lora-gemma3" || fail "the gemma3 adapter written is not PEFT's"
if [ -x "$VPY" ]; then
    venv_check "PEFT does not load the gemma3 adapter with PEFT's logits" \
        "$ZT_SRCDIR/tests/reference/check_peft_export.py" g3rt/adapter "$HF/gemma3" "$HF/lora-gemma3"
fi

# ---- 2. every strategy trains the same adapters -----------------------------------------
train="optim.learning_rate=1e-2 train.max_steps=6 checkpoint.save_hf=false"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=ref >/dev/null
runs=""
for cfg in "2 ddp flat 2" "2 zero1 flat 2" "4 zero2 per_param 1" "2 shard_grad_op flat 2" "2 zero3 flat 2" \
    "4 zero3 per_param 1" "2 zero3 flat 2 train.bf16=true"; do
    set -- $cfg
    np=$1 st=$2 layout=$3 A=$4
    shift 4
    # 4 sequences per step: np ranks x (4 / np / A) x A
    out="np$np-$st-$layout$(echo "$*" | tr -cd 'a-z0-9')"
    # shellcheck disable=SC2086
    run_ztrain "$np" lora.cfg $base $train parallel.strategy=$st parallel.shard_layout=$layout \
        train.per_device_train_batch_size=$((4 / np / A)) train.gradient_accumulation_steps=$A \
        train.output_dir="$out" "$@" >/dev/null
    case "$*" in *bf16*) bf="$out" ;; *) runs="$runs $out" ;; esac
done
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $runs || fail "a strategy trained other adapters than one rank"
# bf16 against its own one-rank run
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.bf16=true train.output_dir=ref-bf16 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref-bf16 "$bf" --loss-tol 2e-3 --param-tol 2e-3 ||
    fail "bf16 LoRA under zero3 diverged from one rank"
for d in ref np2-zero3-flat; do
    "$PY" "$HFPY" ckpt "$(ls $d/ckpt-*.h5 | tail -1)" "$HF/llama" || fail "$d: the frozen base moved"
done
# lora.dropout 0.1: the masks are a function of (seed, step, sample slot, position, layer,
# target, channel), so zero3 at 2 ranks and ddp at 4 (one sequence each) drop what one rank
# drops; and dropout does change the training (the losses after step 1 differ from ref's)
drop="lora.dropout=0.1"
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $base $train $drop train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=drop-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $base $train $drop parallel.strategy=zero3 train.per_device_train_batch_size=1 \
    train.gradient_accumulation_steps=2 train.output_dir=drop-zero3 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $base $train $drop train.per_device_train_batch_size=1 train.output_dir=drop-ddp4 >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" drop-ref drop-zero3 drop-ddp4 || fail "lora.dropout: a strategy dropped otherwise"
"$PY" - ref/metrics.jsonl drop-ref/metrics.jsonl <<'PYEOF' || fail "lora.dropout 0.1 trained as dropout 0"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:])
# the PEFT adapter's B is not 0: its first forward is already dropped
assert len(a) == len(b) and max(abs(x - y) / abs(x) for x, y in zip(a, b)) > 1e-4, (a, b)
PYEOF
"$PY" -c "import json,sys; sys.exit(abs(json.load(open('drop-ref/adapter/adapter_config.json'))['lora_dropout'] - 0.1) > 1e-9)" 2>/dev/null ||
    [ ! -d drop-ref/adapter ] || fail "adapter_config.json does not record lora_dropout"

# ---- 3. gradient and optimizer memory is the adapters' -----------------------------------
"$PY" - ref/metrics.jsonl <<'EOF' || fail "gradient or optimizer memory is not the adapters'"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
start = next(r for r in recs if r.get("start"))
m = next(r for r in recs if r.get("summary"))["memory_measured"]
# r 4 on C 32, q 32, k and v 16, MLP 48, 2 blocks: per block q 256, k 192, v 192, o 256,
# gate 320, up 320, down 320 elements
adapters = 2 * (256 + 192 + 192 + 256 + 320 + 320 + 320)
est = start["memory_estimate"]
# one rank, fp32: gradients 4 bytes and Adam's m, v 8 bytes per adapter element
print("adapters", adapters, "elements; grads", m["grads"], "optimizer", m["optimizer"], "; estimate", est["grads"],
      est["optimizer"])
sys.exit(not (m["grads"] == 4 * adapters and m["optimizer"] == 8 * adapters and
              est["grads"] == m["grads"] and est["optimizer"] == m["optimizer"]))
EOF

# ---- 4. an adapter that does not fit ------------------------------------------------------
expect_fail_with 2 "r = 4, lora.rank is 8" lora.cfg $base lora.rank=8 train.output_dir=bad-r
expect_fail_with 2 "tensors, the adapters of lora.target are" lora.cfg $base lora.target='["q_proj","v_proj"]' \
    train.output_dir=bad-target
expect_fail_with 2 "lora.target: \"c_fc\" is no linear of llama" lora.cfg $base lora.target=c_fc train.output_dir=bad-name

# ---- 5. GPT-2 --------------------------------------------------------------------------
g2="model.name_or_path=$HF/gpt2 lora.adapter_name_or_path=$HF/lora-gpt2"
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $g2 parallel.strategy=zero3 train.output_dir=g2rt >/dev/null
assert_contains "$ZT_OUT" "lora: adapters of $HF/lora-gpt2 loaded"
"$PY" "$HFPY" same g2rt/adapter "$HF/lora-gpt2" || fail "gpt2: the adapter written is not PEFT's"
# zt-ckpt export of a LoRA checkpoint: its PEFT adapter directory (Conv1D: fan_in_fan_out)
"$ZT_CKPT" export g2rt/ckpt-00000002.h5 g2rt-export >/dev/null || fail "gpt2: zt-ckpt export of a LoRA checkpoint"
"$PY" "$HFPY" same g2rt-export "$HF/lora-gpt2" || fail "gpt2: zt-ckpt export of the LoRA checkpoint is not the adapter"
cmp g2rt-export/adapter_config.json g2rt/adapter/adapter_config.json || fail "gpt2: zt-ckpt export: another adapter_config.json"
# --merge: the base (model.name_or_path) with the adapters merged, as the run's hf/ export
for d in rt g2rt; do
    "$ZT_CKPT" export "$d/ckpt-00000002.h5" "$d-merged" --merge >/dev/null || fail "$d: zt-ckpt export --merge"
    "$PY" "$HFPY" same "$d-merged" "$d/hf" || fail "$d: zt-ckpt export --merge is not the run's merged model"
done
"$PY" "$HFPY" close g2rt/hf "$HF/lora-gpt2/merged" 1e-6 || fail "gpt2: the merged export is not PEFT's (B A)^T merge"
"$PY" -c "import json,sys; c=json.load(open('g2rt/adapter/adapter_config.json')); \
sys.exit(not (c['fan_in_fan_out'] is True and sorted(c['target_modules']) == ['c_attn','c_fc','c_proj']))" ||
    fail "gpt2: adapter_config.json is not PEFT's for Conv1D (fan_in_fan_out, target_modules)"
if [ -x "$VPY" ]; then
    venv_check "gpt2: PEFT does not load the adapter with PEFT's logits" \
        "$ZT_SRCDIR/tests/reference/check_peft_export.py" g2rt/adapter "$HF/gpt2" "$HF/lora-gpt2"
    venv_check "gpt2: transformers does not load the merged model with the merged logits" \
        "$ZT_SRCDIR/tests/reference/check_hf_export.py" g2rt/hf "$HF/lora-gpt2/merged" --atol 1e-5
fi
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $g2 $train train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4 \
    train.output_dir=g2ref >/dev/null
g2runs=""
for cfg in "ddp flat 2" "zero2 per_param 1" "zero3 flat 2" "zero3 per_param 1 train.gradient_checkpointing=true"; do
    set -- $cfg
    st=$1 layout=$2 A=$3
    shift 3
    out="g2-$st-$layout$(echo "$*" | tr -cd 'a-z0-9')"
    # 4 sequences per step: 2 ranks x (2 / A) x A
    # shellcheck disable=SC2086
    run_ztrain 2 lora.cfg $g2 $train parallel.strategy=$st parallel.shard_layout=$layout \
        train.per_device_train_batch_size=$((2 / A)) train.gradient_accumulation_steps=$A train.output_dir="$out" \
        "$@" >/dev/null
    g2runs="$g2runs $out"
done
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" g2ref $g2runs || fail "gpt2: a strategy trained other adapters than one rank"
"$PY" "$HFPY" ckpt "$(ls g2-zero3-flat/ckpt-*.h5 | tail -1)" "$HF/gpt2" || fail "gpt2: the frozen base moved"
# a subset: the file names what PEFT must adapt, attn.c_proj and not mlp.c_proj
run_ztrain 1 lora.cfg "model.name_or_path=$HF/gpt2" 'lora.target=["c_attn","attn.c_proj"]' \
    train.output_dir=g2sub >/dev/null
"$PY" -c "import json,sys; c=json.load(open('g2sub/adapter/adapter_config.json')); \
sys.exit(not sorted(c['target_modules']) == ['attn.c_proj','c_attn'])" ||
    fail "gpt2: the target_modules of an attn.c_proj adapter would take mlp.c_proj too"
if [ -x "$VPY" ]; then
    cat >gpt2_subset.py <<'EOF'
import sys
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM
m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(sys.argv[2]), sys.argv[1])
have = sorted(n.replace(".default", "") for n, _ in m.named_parameters() if ".lora_" in n)
with safe_open(sys.argv[1] + "/adapter_model.safetensors", "pt") as f:
    want = sorted(f.keys())
print("gpt2 subset:", len(have), "adapter tensors in PEFT,", len(want), "in the file")
sys.exit(not (have == want and len(want) == 2 * 2 * 2))
EOF
    venv_check "gpt2: PEFT adapts other modules than the file holds" gpt2_subset.py g2sub/adapter "$HF/gpt2"
    venv_checks_run "$VPY"
fi
echo "lora: PEFT's adapter in and out, every strategy trains the same adapters (llama, gpt2), the base frozen"
