#!/bin/sh
# bench-dpo.sh [BUILDDIR] — ztrain against LLaMA-Factory 0.9.5's own DPO trainer on the same LoRA
# DPO job, one LLaMA-Factory YAML given to both: tools/bench-lf.sh's Qwen3 directory (about 100M
# parameters, Llama-shaped with Qwen3's q/k norms) and its long records as pairs, stage dpo,
# pref_loss sigmoid (a reference pass: the base with the adapters off), LoRA r8 on every linear,
# cutoff 512, PAIRS pairs a step (default 2), fp32, 1 thread each (CORES=1; CORES="1 2" adds two).
# Prints seconds per step, pairs per second and their ratio (target: ztrain >= 1.3x), and
# ztrain's time in the reference passes against the policy's forward + backward (its summary
# line, wall clock and the main thread's CPU time; target <= 0.4x), the reference computing
# each pair's prompt once (SHARE_PROMPT=false: every row's positions). STEPS, WARMUP, ROUNDS,
# LF_PY, WORK as bench-lf.sh.
exec env STAGE=dpo CORES="${CORES:-1}" sh "$(dirname "$0")/bench-lf.sh" "$@"
