#!/bin/sh
# qlora_peft.sh — a QLoRA run's exports as the libraries load them: PEFT puts ztrain's adapter on
# the bitsandbytes 4-bit base (tests/reference/hf/qlora-<family>-bnb, loaded by transformers with
# its quantization_config), and transformers loads ztrain's merged export as a plain float model
# (tests/reference/check_qlora_export.py).
#  1. Learning rate 0 at 2 ranks under zero3: PEFT's logits with ztrain's adapter are those of the
#     fixture (PEFT with the reference adapter, which ztrain's own logits equal in test_families),
#     and transformers' logits of the merged export equal PEFT's on the 4-bit base (1e-5).
#  2. Six steps trained under zero3 (nf4, double quantization) and ddp (fp4): transformers on
#     the merged export equals PEFT on the 4-bit base with the trained adapter (1e-5).
# Skips (77) without a python that imports torch, transformers, peft, bitsandbytes and h5py
# (ZT_BNB_PYTHON, ~/.cache/bnb-venv, or ~/.cache/ztrain-venv with bitsandbytes on its path);
# tests/mpi/qlora_bnb.sh checks the same exports against the committed fixtures without them.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
CHECK="$ZT_SRCDIR/tests/reference/check_qlora_export.py"
BPY=""
for p in "${ZT_BNB_PYTHON:-}" "$HOME/.cache/bnb-venv/bin/python" "${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python"; do
    [ -n "$p" ] && [ -x "$p" ] && "$p" -c "import torch, transformers, peft, bitsandbytes, h5py" 2>/dev/null &&
        BPY=$p && break
done
[ -n "$BPY" ] || skip "no python with torch, transformers, peft, bitsandbytes and h5py (ZT_BNB_PYTHON)"
cd "$ZT_TMP" || fail "cd"
lora_setup

# The checks are queued (venv_check) and run at the end with one import of torch, transformers
# and peft.
# ---- 1. round trip at learning rate 0 ------------------------------------------------------------
run_ztrain 2 lora.cfg model.name_or_path="$HF/qlora-llama-bnb" lora.adapter_name_or_path="$HF/qlora-llama/adapter" \
    parallel.strategy=zero3 train.output_dir=rt >/dev/null
venv_check "PEFT on the 4-bit base or transformers on the merged export computes other logits" \
    "$CHECK" rt/adapter "$HF/qlora-llama-bnb" --reference --merged rt/hf

# ---- 2. trained adapters --------------------------------------------------------------------------
for c in "llama zero3" "qwen3 ddp"; do
    set -- $c
    run_ztrain 2 lora.cfg model.name_or_path="$HF/qlora-$1-bnb" lora.adapter_name_or_path="$HF/qlora-$1/adapter" \
        optim.learning_rate=1e-2 train.max_steps=6 parallel.strategy="$2" train.output_dir="tr-$1" >/dev/null
    venv_check "$1: PEFT with ztrain's trained adapter on the 4-bit base disagrees with the merged export" \
        "$CHECK" "tr-$1/adapter" "$HF/qlora-$1-bnb" --merged "tr-$1/hf"
    venv_check_fails "$1: the trained adapter computes what the untrained one does" \
        "$CHECK" "tr-$1/adapter" "$HF/qlora-$1-bnb" --reference
done
venv_checks_run "$BPY"
echo "qlora_peft.sh: ok"
