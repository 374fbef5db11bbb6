#!/bin/sh
# lf_trainer.sh — ztrain runs LLaMA-Factory's own training YAMLs (tests/reference/lf-trainer,
# made by make_lf_trainer_fixtures.py with llamafactory-cli train) unchanged and ends where
# LLaMA-Factory 0.9.5's trainer ended: LoRA continuing an adapter and full fine-tuning with
# weight decay, each with warm-up + cosine and clipping active every step, under ddp and
# zero3 at 1 and 2 ranks. Per step: the loss (1e-6 relative), the learning rate (transformers'
# schedule) and the gradient norm; at the end the adapter or every weight within 1e-5
# relative L2 of LLaMA-Factory's. The norm's bound is 3e-5: torch's fp32 reduction
# (clip_grad_norm_) reports the full model's 1.1e-5 below the norm of torch's own gradients
# (their per-tensor norms in float64 equal ztrain's, which sums in double, to 1e-7); AdamW
# does not see the difference (m / sqrt(v) is scale-free), and the weights agree to 3e-8.
. "$(dirname "$0")/common.sh"
need_h5py
FIX="$ZT_SRCDIR/tests/reference/lf-trainer"
HFD="$ZT_SRCDIR/tests/mpi/hf_dir.py"
cd "$ZT_TMP" || fail "cd"
for d in qwen3-tiny adapter-init data lora.yaml full.yaml; do cp -r "$FIX/$d" . || fail "copy $d"; done

# each step of RUN's metrics.jsonl against LLaMA-Factory's log of the same step
check_log() {
    "$PY" "$ZT_SRCDIR/tests/mpi/check_lf_log.py" "$FIX/expected/$1/log.json" "$2/metrics.jsonl"
}

# NAME NP ARGS...: trains YAML NAME as it is, with the mesh's overrides
lf_run() {
    name=$1 np=$2
    shift 2
    run_ztrain "$np" "$name.yaml" train.sample_tokens=0 "$@" >/dev/null
}

# ddp and zero3 at 1 and 2 ranks; 2 ranks keep the global batch of 4 (2 per device, no accumulation)
for mesh in "1 ddp" "2 ddp" "1 zero3" "2 zero3"; do
    # shellcheck disable=SC2086
    set -- $mesh
    acc=$((3 - $1))
    lf_run lora "$1" parallel.strategy="$2" train.gradient_accumulation_steps=$acc train.output_dir="out/lora-$1-$2"
    check_log lora "out/lora-$1-$2" || fail "LoRA under $2 on $1 ranks left LLaMA-Factory's steps"
    "$PY" "$HFD" rel "out/lora-$1-$2/adapter" "$FIX/expected/lora" 1e-5 || fail "LoRA under $2 on $1: the adapter differs"
    lf_run full "$1" parallel.strategy="$2" train.gradient_accumulation_steps=$acc train.output_dir="out/full-$1-$2"
    check_log full "out/full-$1-$2" || fail "full fine-tuning under $2 on $1 ranks left LLaMA-Factory's steps"
    "$PY" "$HFD" rel "out/full-$1-$2/hf" "$FIX/expected/full" 1e-5 || fail "full under $2 on $1: the weights differ"
done
# the comparison can fail: LoRA's adapter is not the full run's, nor the initial one
"$PY" "$HFD" rel adapter-init "$FIX/expected/lora" 1e-5 >/dev/null && fail "the adapter check cannot fail"
echo "lf_trainer: LLaMA-Factory's YAMLs train to LLaMA-Factory's trainer's result under ddp and zero3"
