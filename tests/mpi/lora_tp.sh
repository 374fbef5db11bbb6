#!/bin/sh
# lora_tp.sh — LoRA under tensor parallelism, from transformers' llama and gpt2
# directories and PEFT's adapters (tests/reference/hf): on a column-parallel base (q, k,
# v, gate, up, c_attn, c_fc) B keeps the rank's output rows and A is whole; on a
# row-parallel one (o, down, c_proj) A keeps its input columns and B is whole; the whole
# matrices' gradients are summed over tp.
#  1. Learning rate 0 at tp 2 (tp 2 x zero3 on 4 ranks for GPT-2): PEFT's adapter goes
#     in sliced and comes out whole, bit for bit; the merged model is PEFT's
#     merge_and_unload (1e-6).
#  2. tp 2, tp 4 (Llama's 2 KV heads each shared by 2 ranks: their B's gradients summed
#     over the pair), tp 2 x dp 2 under zero2 and zero3, tp 2 with
#     tp_sequence_parallel, and GPT-2 at tp 2 and tp 2 x zero3, train the same adapters
#     as one rank with accumulation (compare_runs: 1e-5), the base frozen bit for bit;
#     freshly initialised adapters too (tp 2); at tp 2 the memory is the estimate's.
#  3. lora.dropout 0.1 at tp 2 (and tp 2 x zero3) drops what one rank drops: a row-parallel
#     input's slice draws its columns of the one-rank mask.
#  4. A LoRA checkpoint written at tp 2 resumes at 1 rank (and one from 1 rank at tp 2 x
#     dp 2) as the straight run; zt-ckpt export makes it the PEFT adapter the run wrote.
. "$(dirname "$0")/common.sh"
need_h5py
HF="$ZT_SRCDIR/tests/reference/hf"
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
CMP="$ZT_SRCDIR/tests/mpi/compare_runs.py"
cd "$ZT_TMP" || fail "cd"
lora_setup
llama="model.name_or_path=$HF/llama lora.adapter_name_or_path=$HF/lora-llama"
g2="model.name_or_path=$HF/gpt2 lora.adapter_name_or_path=$HF/lora-gpt2"
tp2="parallel.tensor_parallel_size=2"

# ---- 1. round trip at learning rate 0 ------------------------------------------------
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $llama $tp2 train.output_dir=rt >/dev/null
assert_contains "$ZT_OUT" "mesh tp 2 x sp 1 x dp 1"
assert_contains "$ZT_OUT" "lora: adapters of $HF/lora-llama loaded"
"$PY" "$HFPY" same rt/adapter "$HF/lora-llama" || fail "tp 2: the adapter written is not PEFT's"
"$PY" "$HFPY" close rt/hf "$HF/lora-llama/merged" 1e-6 || fail "tp 2: the merged export is not PEFT's merge"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $g2 $tp2 parallel.strategy=zero3 train.output_dir=g2rt >/dev/null
"$PY" "$HFPY" same g2rt/adapter "$HF/lora-gpt2" || fail "gpt2 tp 2 x zero3: the adapter written is not PEFT's"
"$PY" "$HFPY" close g2rt/hf "$HF/lora-gpt2/merged" 1e-6 || fail "gpt2 tp 2 x zero3: the merged export is not PEFT's"
echo "lora_tp: PEFT's adapters in and out at tp 2 (llama) and tp 2 x zero3 (gpt2), merged as PEFT"

# ---- 2. the same adapters as one rank --------------------------------------------------
# 4 sequences per step: dp ranks x per_device x accumulation
# max_grad_norm small enough to clip at every step: the whole matrices' gradients count once
train="optim.learning_rate=1e-2 train.max_steps=6 checkpoint.save_hf=false optim.max_grad_norm=0.05"
one="train.per_device_train_batch_size=1 train.gradient_accumulation_steps=4"
# fresh adapters (no PEFT directory): tp 2 draws each slice of A as one rank draws the whole
fresh="model.name_or_path=$HF/llama"
# the one-rank references two at a time (one core each): this one and the fresh adapters' below
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $llama $train $one train.output_dir=ref
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $fresh $train $one train.output_dir=fresh-ref
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $llama $train $tp2 train.per_device_train_batch_size=2 train.gradient_accumulation_steps=2 \
    train.output_dir=tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $llama $train parallel.tensor_parallel_size=4 train.per_device_train_batch_size=4 \
    train.output_dir=tp4 >/dev/null
assert_contains "$ZT_OUT" "mesh tp 4 x sp 1 x dp 1"
runs="tp2 tp4"
for st in zero2 zero3; do
    # shellcheck disable=SC2086
    run_ztrain 4 lora.cfg $llama $train $tp2 parallel.strategy=$st train.per_device_train_batch_size=1 \
        train.gradient_accumulation_steps=2 train.output_dir=tp2-$st >/dev/null
    runs="$runs tp2-$st"
done
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $llama $train $tp2 parallel.tp_sequence_parallel=true train.per_device_train_batch_size=4 \
    train.output_dir=tps >/dev/null
# shellcheck disable=SC2086
"$PY" "$CMP" ref $runs tps || fail "llama: LoRA under tp trained other adapters than one rank"
# fresh adapters (fresh-ref: above)
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $fresh $train $tp2 train.per_device_train_batch_size=4 train.output_dir=fresh-tp2 >/dev/null
"$PY" "$CMP" fresh-ref fresh-tp2 || fail "llama: fresh LoRA adapters at tp 2 differ from one rank's"
for d in tp2 tp2-zero3; do
    "$PY" "$HFPY" ckpt "$(ls $d/ckpt-*.h5 | tail -1)" "$HF/llama" || fail "$d: the frozen base moved"
done
# memory at tp 2: the estimate is what was allocated, and a rank holds less than at tp 1
"$PY" - ref/metrics.jsonl tp2/metrics.jsonl <<'EOF' || fail "LoRA at tp 2: memory estimate or split wrong"
import json, sys
def mem(f):
    recs = [json.loads(l) for l in open(f)]
    return (next(r for r in recs if r.get("start"))["memory_estimate"],
            next(r for r in recs if r.get("summary"))["memory_measured"])
(e1, m1), (e2, m2) = mem(sys.argv[1]), mem(sys.argv[2])
keys = ("params", "grads", "optimizer", "activations")
print("tp 1:", {k: m1[k] for k in keys}, "tp 2:", {k: m2[k] for k in keys})
assert all(e2[k] == m2[k] for k in keys), (e2, m2)
# the base and B of column-parallel / A of row-parallel weights split; the other halves whole
assert m2["params"] < 0.6 * m1["params"] and m1["grads"] / 2 < m2["grads"] < m1["grads"], (m1, m2)
EOF
drop="lora.dropout=0.1"
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $g2 $train $one train.output_dir=g2ref
# and section 3's
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $llama $train $drop $one train.output_dir=drop-ref
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $g2 $train $tp2 train.per_device_train_batch_size=4 train.output_dir=g2tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $g2 $train $tp2 parallel.strategy=zero3 train.per_device_train_batch_size=2 \
    train.output_dir=g2tp2-zero3 >/dev/null
"$PY" "$CMP" g2ref g2tp2 g2tp2-zero3 || fail "gpt2: LoRA under tp trained other adapters than one rank"
"$PY" "$HFPY" ckpt "$(ls g2tp2-zero3/ckpt-*.h5 | tail -1)" "$HF/gpt2" || fail "gpt2 tp 2 x zero3: the frozen base moved"
echo "lora_tp: llama at tp 2, tp 4, tp 2 x zero2/zero3, tp_sequence_parallel and gpt2 at tp 2, tp 2 x zero3 = one rank"

# ---- 3. dropout ---------------------------------------------------------------------------
# (drop-ref: above)
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $llama $train $drop $tp2 train.per_device_train_batch_size=4 train.output_dir=drop-tp2 >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $llama $train $drop $tp2 parallel.strategy=zero3 train.per_device_train_batch_size=2 \
    train.output_dir=drop-tp2-zero3 >/dev/null
"$PY" "$CMP" drop-ref drop-tp2 drop-tp2-zero3 || fail "lora.dropout: tp dropped otherwise than one rank"
"$PY" - ref/metrics.jsonl drop-ref/metrics.jsonl <<'PYEOF' || fail "lora.dropout 0.1 trained as dropout 0"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f) if '"loss"' in l] for f in sys.argv[1:])
assert len(a) == len(b) and max(abs(x - y) / abs(x) for x, y in zip(a, b)) > 1e-4, (a, b)
PYEOF
echo "lora_tp: lora.dropout at tp 2 and tp 2 x zero3 = one rank's masks"

# ---- 4. checkpoints across meshes ---------------------------------------------------------
# 3 steps at tp 2 resumed to 6 at 1 rank; 3 at 1 rank resumed at tp 2 x dp 2 (zero3); a
# constant schedule, so that 3 steps are the first half of 6
const="optim.lr_scheduler_type=constant_with_warmup"
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $llama $train $const $one train.output_dir=full
# and the first half of split2 (below)
# shellcheck disable=SC2086
run_ztrain_bg 1 lora.cfg $llama $train $const $one train.max_steps=3 train.output_dir=split2
ztrain_wait >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 lora.cfg $llama $train $const $tp2 train.per_device_train_batch_size=4 train.max_steps=3 \
    train.output_dir=split >/dev/null
# shellcheck disable=SC2086
run_ztrain 1 lora.cfg $llama $train $const $one checkpoint.resume=auto train.output_dir=split >/dev/null
assert_contains "$ZT_OUT" "resumed from split/ckpt-00000003"
# shellcheck disable=SC2086
run_ztrain 4 lora.cfg $llama $train $const $tp2 parallel.strategy=zero3 train.per_device_train_batch_size=2 \
    checkpoint.resume=auto train.output_dir=split2 >/dev/null
assert_contains "$ZT_OUT" "resumed from split2/ckpt-00000003"
"$PY" "$CMP" full split split2 || fail "a LoRA checkpoint resumed across tp diverged"
# zt-ckpt export of a LoRA checkpoint written at tp 2 is the PEFT adapter its run wrote
"$ZT_CKPT" export "$(ls tp2/ckpt-*.h5 | tail -1)" tp2-export >/dev/null || fail "zt-ckpt export of a LoRA checkpoint"
"$PY" "$HFPY" same tp2-export tp2/adapter || fail "zt-ckpt export of the tp 2 LoRA checkpoint is not its run's adapter"
cmp tp2-export/adapter_config.json tp2/adapter/adapter_config.json || fail "zt-ckpt export: another adapter_config.json"
echo "lora_tp: LoRA checkpoints tp 2 -> 1 rank and 1 rank -> tp 2 x zero3 resume as 6 steps at once"
