#!/bin/sh
# families.sh — the llama family under every strategy, and Hugging Face directories in
# and out, as a user runs them.
#  1. A Llama GQA model (untied head, llama3 rope scaling) under every strategy and
#     layout at 1-4 ranks trains the same model as one rank with accumulation (fp32:
#     1e-5); bf16 and fp16 runs match their one-rank references; resume and reshard of
#     a Llama checkpoint across strategies and world sizes.
#  2. HF in and out: transformers' qwen3, mistral, gemma3 and sharded llama directories -> ztrain
#     (learning rate 0) -> save_hf gives the same tensors bit for bit, sharded when asked;
#     ztrain reads its own export back identically; zero3 on 2 ranks from an HF
#     directory equals 1 rank; transformers loads the export with the same logits
#     (when the venv of tools/make-venv.sh exists).
#  3. Every bad model directory fails on every rank with one line naming file and tensor.
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup
HF="$ZT_SRCDIR/tests/reference/hf"
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"

# ---- 1. Llama under every strategy ------------------------------------------------
llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 model.rope_theta=500000 model.rope_type=llama3 model.rope_factor=8
  model.rope_original_max_position_embeddings=8 checkpoint.save_hf=false"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $(batch_args 1) train.output_dir=ref >/dev/null
assert_contains "$ZT_OUT" "model: llama L=2 H=4 KV=2 C=32 head_dim=8 I=48"
runs=""
for cfg in "2 ddp flat" "2 zero1 flat" "3 zero2 per_param" "2 shard_grad_op flat" "2 zero3 flat" \
    "3 zero3 per_param" "4 zero3 flat" "4 zero2 per_param"; do
    set -- $cfg
    out="np$1-$2-$3"
    # shellcheck disable=SC2086
    run_ztrain "$1" $common $llama $(batch_args "$1") parallel.strategy=$2 parallel.shard_layout=$3 \
        train.output_dir="$out" >/dev/null
    runs="$runs $out"
done
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $(batch_args 4) parallel.strategy=hybrid_shard parallel.shard_group_size=2 \
    train.output_dir=np4-hybrid >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $(batch_args 2) parallel.strategy=zero3 train.gradient_checkpointing=true \
    train.output_dir=np2-zero3-recompute >/dev/null
runs="$runs np4-hybrid np2-zero3-recompute"
# shellcheck disable=SC2086
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" ref $runs || fail "a strategy diverged from the one-rank Llama"

# bf16 and fp16: each against its own one-rank run (the dtype's rounding is the same
# whatever the world size: tests/mpi/bf16.sh's tolerances)
for prec in "train.bf16=true" "train.fp16=true"; do
    tag=$(echo "$prec" | cut -c7-10)
    # shellcheck disable=SC2086
    run_ztrain 1 $common $llama $(batch_args 1) $prec train.output_dir="ref-$tag" >/dev/null
    # shellcheck disable=SC2086
    run_ztrain 2 $common $llama $(batch_args 2) $prec parallel.strategy=zero3 train.output_dir="np2-$tag" >/dev/null
    "$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" "ref-$tag" "np2-$tag" --loss-tol 2e-3 --param-tol 2e-3 ||
        fail "$prec zero3 on 2 ranks diverged from one rank"
done

# resume across strategies and world sizes: 10 steps as zero3 on 2 ranks, 10 more as
# ddp on 3 ranks, against 20 at once on one rank (constant schedule after warm-up)
const="optim.lr_scheduler_type=constant_with_warmup"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $const $(batch_args 1) train.output_dir=full >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $const $(batch_args 2) parallel.strategy=zero3 train.max_steps=10 \
    train.output_dir=split >/dev/null
# shellcheck disable=SC2086
run_ztrain 3 $common $llama $const $(batch_args 3) parallel.strategy=ddp checkpoint.resume=auto \
    train.output_dir=split >/dev/null
assert_contains "$ZT_OUT" "resumed from split/ckpt-00000010"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" full split || fail "Llama resumed at another world size diverged"
echo "families: llama matches one rank under every strategy, bf16, fp16 and a resume across meshes"

# ---- 2. HF directories in and out -----------------------------------------------------
"$PY" "$HFPY" tokens tok67.h5 67 20000 || fail "cannot make the token file"
cat >hf.cfg <<'EOF'
data = { train_files = "tok67.h5"; val_files = []; seq_len = 8; };
train = { per_device_train_batch_size = 2; max_steps = 2; logging_steps = 1; sample_tokens = 0; };
optim = { learning_rate = 0.0; warmup_steps = 0; };
checkpoint = { save_at_end = false; hf_dtype = "fp32"; };
log = { plot = false; };
EOF
# learning rate 0: AdamW leaves every weight as it was, so the export is the input
run_ztrain 2 hf.cfg model.name_or_path="$HF/qwen3" parallel.strategy=zero3 train.output_dir=q3 >/dev/null
assert_contains "$ZT_OUT" "model: qwen3 L=2 H=4 KV=2 C=32 head_dim=12 I=48 V=67 block=64 tied"
assert_contains "$ZT_OUT" "weights of $HF/qwen3 loaded"
"$PY" "$HFPY" same q3/hf "$HF/qwen3" || fail "the qwen3 export differs from transformers' directory"
[ ! -e q3/hf.tmp ] || fail "q3/hf.tmp left behind"
run_ztrain 3 hf.cfg model.name_or_path="$HF/llama-sharded" parallel.strategy=zero2 \
    checkpoint.hf_max_shard_size=20KB train.output_dir=ls >/dev/null
[ -s ls/hf/model.safetensors.index.json ] || fail "no index for a sharded export"
[ -s ls/hf/model-00002-of-00005.safetensors ] || fail "the export did not split as transformers does (5 shards of 20KB)"
"$PY" "$HFPY" same ls/hf "$HF/llama" || fail "the sharded llama round trip differs"
# mistral: its class, model_type and sliding_window (5, shorter than the rows of 8) go out again
run_ztrain 2 hf.cfg model.name_or_path="$HF/mistral" parallel.strategy=zero3 train.output_dir=mi >/dev/null
assert_contains "$ZT_OUT" "model: mistral L=2 H=4 KV=2 C=32 head_dim=12 I=48 V=67 block=64"
"$PY" "$HFPY" same mi/hf "$HF/mistral" || fail "the mistral export differs from transformers' directory"
"$PY" - mi/hf/config.json <<'PY' || fail "the mistral export's config.json"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["MistralForCausalLM"] and c["model_type"] == "mistral", c
assert c["sliding_window"] == 5 and c["head_dim"] == 12 and not c["tie_word_embeddings"], c
PY
# gemma3: every key Gemma3TextConfig reads goes out in both spellings (4.x and 5.x)
run_ztrain 2 hf.cfg model.name_or_path="$HF/gemma3" parallel.strategy=zero3 train.output_dir=g3 >/dev/null
assert_contains "$ZT_OUT" "model: gemma3 L=2 H=4 KV=2 C=32 head_dim=16 I=48 V=67 block=64 tied"
"$PY" "$HFPY" same g3/hf "$HF/gemma3" || fail "the gemma3 export differs from transformers' directory"
"$PY" - g3/hf/config.json <<'PY' || fail "the gemma3 export's config.json"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["Gemma3ForCausalLM"] and c["model_type"] == "gemma3_text", c
assert c["sliding_window"] == 3 and c["layer_types"] == ["sliding_attention", "full_attention"], c
assert c["sliding_window_pattern"] == 2 and c["query_pre_attn_scalar"] == 16, c
assert c["hidden_activation"] == "gelu_pytorch_tanh" and "hidden_act" not in c and c["tie_word_embeddings"], c
assert c["rope_local_base_freq"] == 1e4 and c["rope_theta"] == 1e6, c
assert c["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}, c
p = c["rope_parameters"]
assert p["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}, p
assert p["full_attention"] == {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0}, p
assert c["final_logit_softcapping"] is None and c["attn_logit_softcapping"] is None, c
PY
# ztrain reads its own export back
run_ztrain 1 hf.cfg model.name_or_path="$PWD/q3/hf" train.output_dir=q3b >/dev/null
"$PY" "$HFPY" same q3b/hf q3/hf || fail "ztrain's own export did not read back identically"
# training from an HF directory: zero3 on 2 ranks equals 1 rank with accumulation
for np in 1 2; do
    A=$((2 / np))
    run_ztrain "$np" hf.cfg model.name_or_path="$HF/qwen2" parallel.strategy=zero3 train.max_steps=6 \
        optim.learning_rate=1e-2 train.per_device_train_batch_size=2 train.gradient_accumulation_steps=$A \
        checkpoint.save_at_end=true train.output_dir="q2-np$np" >/dev/null
done
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" q2-np1 q2-np2 || fail "qwen2 from HF: zero3 on 2 ranks diverged"
# ztrain's own byte-level tokenizer goes out as tokenizer.json: a complete directory
# shellcheck disable=SC2086
run_ztrain 1 $common train.max_steps=1 train.output_dir=bytes >/dev/null
[ -s bytes/hf/tokenizer.json ] && [ -s bytes/hf/tokenizer_config.json ] ||
    fail "the byte-level model's export has no tokenizer.json"
# the exports are what transformers loads, with transformers' logits; AutoTokenizer and
# the text-generation pipeline run on the byte-level export (one import of torch and
# transformers for the five checks: venv_check)
VPY=${ZT_VENV:-$HOME/.cache/ztrain-venv}/bin/python
if [ -x "$VPY" ]; then
    cat >bytes_check.py <<'PY'
from transformers import AutoTokenizer, pipeline
t = AutoTokenizer.from_pretrained('bytes/hf')
ids = t('the model \u00e9')['input_ids']
assert ids == list('the model \u00e9'.encode()), ids
assert t.eos_token == '<|endoftext|>' and t.eos_token_id == 256
print(repr(pipeline('text-generation', model='bytes/hf', tokenizer='bytes/hf')('the', max_new_tokens=3, do_sample=False)[0]['generated_text']))
PY
    CHK="$ZT_SRCDIR/tests/reference/check_hf_export.py"
    venv_check "transformers does not load the qwen3 export with the same logits" "$CHK" q3/hf "$HF/qwen3" --atol 1e-5
    venv_check "transformers does not load the sharded llama export with the same logits" "$CHK" ls/hf "$HF/llama" \
        --atol 1e-5
    venv_check "transformers does not load the mistral export with the same logits" "$CHK" mi/hf "$HF/mistral" \
        --atol 1e-5
    venv_check "transformers does not load the gemma3 export with the same logits" "$CHK" g3/hf "$HF/gemma3" --atol 1e-5
    venv_check "AutoTokenizer or the text-generation pipeline does not run on the byte-level export" bytes_check.py
    venv_checks_run "$VPY"
else
    echo "note: no venv at $VPY (tools/make-venv.sh): transformers' own load of the export not checked"
fi
echo "families: HF directories round-trip bit for bit"

# ---- 3. bad model directories ----------------------------------------------------------
bad() {
    kind=$1 src=$2 text=$3
    "$PY" "$HFPY" bad "$kind" "$src" "bad-$kind" >/dev/null || fail "hf_dir.py bad $kind"
    expect_fail_with 2 "$text" hf.cfg model.name_or_path="$PWD/bad-$kind" train.output_dir="out-$kind"
    [ "$(grep -c "error" "$ZT_OUT")" -ge 1 ] || fail "$kind: no error line"
}
bad drop-tensor "$HF/qwen3" "missing tensor"
bad extra-tensor "$HF/qwen3" "unexpected tensor model.layers.0.mlp.extra.weight"
bad bad-shape "$HF/qwen3" "config.json implies"
bad f64 "$HF/qwen3" "unsupported dtype F64"
bad truncate "$HF/qwen3" "model.safetensors"
bad corrupt-header "$HF/qwen3" "model.safetensors"
bad missing-shard "$HF/llama-sharded" "model-00001-of-00005.safetensors"
bad unknown-arch "$HF/qwen3" "unknown architecture FooForCausalLM"
expect_fail_with 2 "model.n_layer = 3 in the input disagrees with" hf.cfg model.name_or_path="$HF/qwen3" \
    model.n_layer=3 train.output_dir=out-disagree
expect_fail_with 2 "model.sliding_window applies to mistral and gemma3, not llama" hf.cfg model.arch=llama \
    model.sliding_window=32 train.output_dir=out-window3
expect_fail_with 2 "model.sliding_window_pattern and model.rope_local_base_freq apply to gemma3, not mistral" hf.cfg \
    model.arch=mistral model.sliding_window_pattern=2 train.output_dir=out-window4
# what Gemma 3 configs may hold that ztrain does not compute: one line naming file and key
g3bad() {
    key=$1 val=$2 text=$3
    rm -rf "g3-$key" && cp -r "$HF/gemma3" "g3-$key"
    "$PY" - "g3-$key/config.json" "$key" "$val" <<'PY' || fail "cannot edit the gemma3 config.json"
import json, sys
c = json.load(open(sys.argv[1]))
c[sys.argv[2]] = json.loads(sys.argv[3])
json.dump(c, open(sys.argv[1], "w"))
PY
    expect_fail_with 2 "$PWD/g3-$key/config.json: $text" hf.cfg model.name_or_path="$PWD/g3-$key" \
        train.output_dir="out-g3-$key"
}
g3bad query_pre_attn_scalar 12 "query_pre_attn_scalar (12) other than head_dim (16) is not supported"
g3bad final_logit_softcapping 30.0 "final_logit_softcapping is not supported (null)"
g3bad attn_logit_softcapping 50.0 "attn_logit_softcapping is not supported (null)"
g3bad layer_types '["full_attention", "sliding_attention"]' "layer_types: layer 1 breaks the pattern of a full_attention layer every 1 layers"
g3bad hidden_activation '"silu"' "hidden_activation \"silu\" is not supported (gelu_pytorch_tanh)"
expect_fail_with 2 "config.json: cannot open" hf.cfg model.name_or_path="$PWD/nowhere" train.output_dir=out-none
echo "families: every bad model directory fails on every rank with its reason"
