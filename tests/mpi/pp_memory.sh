#!/bin/sh
# pp_memory.sh — a pipeline rank holds its stages' share of the model, and what it writes
# is the whole model's layout.
#  1. Ownership and the estimate: GPT-2 (tied: the root unit on the first and the last
#     stage) at pp 2 under 1f1b and gpipe (its last stage holding each micro-batch's
#     dlogits: parallel.pp_head_split), at pp 4, and at pp 2 x dp 2 under zero3, and an
#     untied Llama at pp 2 under zero1: each pipeline rank's estimate (a dry run of its
#     stages' engine, its schedule's slots of its stages' activations) equals what that rank
#     measured, figure by figure (buffers: the engine's and the step's message buffers, one
#     residual stream per send and receive); the ranks' parameters add up to the model's once, plus
#     GPT-2's root a second time (the untied Llama's embedding is on the first rank only,
#     its final norm and head on the last); the activations are slots of one stage model's: 1F1B
#     holds min(pp - r, M) micro-batches on rank r, GPipe all M.
#  2. The fit check knows the pipeline: a parallel.memory_limit_gb that refuses ddp on 2
#     ranks lets pp 2 train, and pp 2 x tp 2 on 4 (oversubscribed) ranks: each pipeline
#     rank's estimate fits the limit and equals its measurement, and both runs equal one
#     rank's within 1e-5. parallel.strategy = auto, for a model neither tp nor Ulysses sp
#     can split (1 head) at a limit zero3 does not meet on 2 ranks, picks pp 2 (1f1b, the
#     choice on the log's first line; --estimate-memory shows the same choice and its
#     figures), and the run equals one rank's; with one accumulation
#     step and 1f1b given it refuses the run in one line naming the gpipe pipeline that fits.
#  3. Checkpoints stay mesh-independent: pp 2 x dp 2 resumes as ddp on 3 ranks (10 + 10
#     steps against 20 at once); the HF export (hf/) and a LoRA adapter export (adapter/,
#     and the merged hf/) written at pp 2 x dp 2, each rank its stages' part, equal one
#     rank's.
. "$(dirname "$0")/common.sh"
need_h5py
tiny_comparison_setup
HFPY="$ZT_SRCDIR/tests/mpi/hf_dir.py"
common="$common model.vocab_size=260 optim.max_grad_norm=0.05 checkpoint.save_hf=false"
llama="model.arch=llama model.n_head=4 model.n_kv_head=2 model.n_embd=32 model.head_dim=8
  model.intermediate_size=48 model.tie_word_embeddings=false"
pp2="parallel.pipeline_parallel_size=2"

# ---- 1. each pipeline rank's estimate is its measurement ---------------------------------
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 1) $pp2 train.max_steps=2 train.output_dir=g-1f1b >/dev/null
assert_contains "$ZT_OUT" "memory (pp rank 1): estimated"
# shellcheck disable=SC2086
run_ztrain 2 $common $(batch_args 1) $pp2 parallel.pp_schedule=gpipe train.max_steps=2 train.output_dir=g-gpipe \
    >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $(batch_args 1) parallel.pipeline_parallel_size=4 train.max_steps=2 train.output_dir=g-pp4 \
    >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $(batch_args 2) $pp2 parallel.strategy=zero3 train.max_steps=2 train.output_dir=g-z3 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 $common $llama $(batch_args 1) $pp2 parallel.strategy=zero1 train.max_steps=2 train.output_dir=l-z1 \
    >/dev/null
"$PY" - g-1f1b g-gpipe g-pp4 g-z3 l-z1 <<'PYEOF' || fail "a pipeline rank's estimate is not its measurement"
import glob, json, sys
import h5py
M = 6
def stages(d):
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"pp_rank"' in l]
    return [r for r in sorted(recs, key=lambda r: r["pp_rank"])]
for d in sys.argv[1:]:
    st = stages(d)
    assert st, d + ": no per-rank memory records"
    for r in st:
        est, meas = r["memory_estimate"], r["memory_measured"]
        assert est == meas, (d, r["pp_rank"], est, meas)
    print(d, "estimate = measured on each of", len(st), "pipeline ranks:",
          [r["memory_measured"]["params"] + r["memory_measured"]["activations"] for r in st])
# ownership under ddp: the ranks' parameters are the model once, and the root (wte, wpe,
# ln_f: the tied head is the embedding) on both ends
for d in ("g-1f1b", "g-pp4"):
    with h5py.File(sorted(glob.glob(d + "/ckpt-*.h5"))[-1], "r") as h:
        psi = sum(h["model"][k].size for k in h["model"])
        root = sum(h["model"][k].size for k in h["model"] if ".h." not in k)
    got = sum(r["memory_measured"]["params"] for r in stages(d))
    assert got == 4 * (psi + root), (d, got, psi, root)
    assert all(r["memory_measured"]["grads"] == r["memory_measured"]["params"] for r in stages(d))
    print(d, "parameters over the pipeline ranks:", got, "bytes = 4 (Psi + root)")
# an untied head has a unit of its own on the last stage: nothing is held twice (zero1 over
# one data rank keeps each rank's units whole)
with h5py.File(sorted(glob.glob("l-z1/ckpt-*.h5"))[-1], "r") as h:
    psi = sum(h["model"][k].size for k in h["model"])
got = sum(r["memory_measured"]["params"] for r in stages("l-z1"))
assert got == 4 * psi, ("l-z1", got, psi)
print("l-z1 parameters over the pipeline ranks:", got, "bytes = 4 Psi (the embedding first, the head last)")
# slots: 1F1B holds min(pp - r, M) micro-batches on rank r, GPipe all M; GPipe's last stage
# each with its dlogits (parallel.pp_head_split: B x T x V floats, B 2, T 16, V 260)
f, g = stages("g-1f1b"), stages("g-gpipe")
for r in range(2):
    a1, ag = f[r]["memory_measured"]["activations"], g[r]["memory_measured"]["activations"]
    held = (2 * 16 * 260 * 4 if r == 1 else 0)
    assert ag % M == 0 and a1 == min(2 - r, M) * (ag // M - held), (r, a1, ag)
print("activations: 1f1b holds 2 and 1 slots on ranks 0 and 1, gpipe", M, "and the last stage's dlogits")
PYEOF
echo "pp_memory: each pipeline rank's estimate equals its measurement; the ranks hold the model once, a tied root twice"

# ---- 2. the fit check: refused under ddp on 2 ranks, trains at pp 2 -----------------------
big="model.n_layer=6 model.n_embd=64 train.max_steps=2 train.per_device_train_batch_size=2
  train.gradient_accumulation_steps=4 parallel.memory_limit_gb=0.0045"
# shellcheck disable=SC2086
expect_fail_with 2 "memory: ddp needs an estimated" $common $big parallel.strategy=ddp train.output_dir=fit-ddp
# shellcheck disable=SC2086
run_ztrain 2 $common $big parallel.strategy=ddp $pp2 train.output_dir=fit-pp2 >/dev/null
assert_contains "$ZT_OUT" "summary: 2 steps"
# shellcheck disable=SC2086
run_ztrain 4 $common $big parallel.strategy=ddp $pp2 parallel.tensor_parallel_size=2 train.output_dir=fit-pptp \
    >/dev/null
assert_contains "$ZT_OUT" "mesh tp 2 x sp 1 x dp 1 x pp 2"
# shellcheck disable=SC2086
run_ztrain 1 $common $big parallel.memory_limit_gb=0 train.output_dir=fit-one >/dev/null
"$PY" - fit-pp2 fit-pptp <<'PYEOF' || fail "a pipeline run under parallel.memory_limit_gb: its estimate is not its measurement, or over the limit"
import json, sys
limit = 0.0045 * 2**30
for d in sys.argv[1:]:
    recs = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"pp_rank"' in l]
    assert len(recs) == 2, (d, len(recs))
    for r in recs:
        est, meas = r["memory_estimate"], r["memory_measured"]
        assert est == meas, (d, r["pp_rank"], est, meas)
        total = sum(v for k, v in est.items() if k not in ("host", "nvme"))
        assert total <= limit, (d, r["pp_rank"], total, limit)
        print(d, "pp rank", r["pp_rank"], "estimate = measured,", total, "bytes <=", int(limit))
PYEOF
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" fit-one fit-pp2 fit-pptp || fail "pp 2 or pp 2 x tp 2 is not one rank's run"
echo "pp_memory: memory_limit_gb refuses ddp on 2 ranks; pp 2 and pp 2 x tp 2 on 4 ranks fit, train and equal one rank"

# auto: 1 head (no tp, no Ulysses sp); 4 MiB refuses zero3 on 2 ranks, pp 2 fits under ddp
one="model.n_head=1 parallel.memory_limit_gb=0.004"
# shellcheck disable=SC2086
expect_fail_with 2 "memory: zero3 needs an estimated" $common $big $one parallel.strategy=zero3 \
    train.output_dir=auto-z3
# shellcheck disable=SC2086
run_ztrain 2 $common $big $one parallel.strategy=auto train.output_dir=auto-pp >/dev/null
head -n 1 "$ZT_OUT" | grep -qF "parallel auto: no mesh fits the limit of 4.10 MiB (parallel.memory_limit_gb) without a pipeline (tp within a node's 2 ranks, sp over the rest); pp 2, the smallest that fits, x tp 1 x sp 1 with ddp and 1f1b fits" ||
    fail "auto on 2 ranks: the first line does not give pp 2"
assert_contains "$ZT_OUT" "mesh tp 1 x sp 1 x dp 1 x pp 2"
assert_contains "$ZT_OUT" "strategy auto -> ddp"
# shellcheck disable=SC2086
run_ztrain 1 $common $big $one parallel.memory_limit_gb=0 train.output_dir=auto-one >/dev/null
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" auto-one auto-pp || fail "auto's pp 2 is not one rank's run"
# --estimate-memory plans the same: auto's line, then the figures of pp 2
# shellcheck disable=SC2086
run_ztrain 1 --estimate-memory --ranks 2 $common $big $one parallel.strategy=auto >/dev/null
assert_contains "$ZT_OUT" "parallel auto on 2 ranks (2 a node): no mesh fits the limit of 4.10 MiB"
assert_contains "$ZT_OUT" "2 ranks (2 per node), tp 1, sp 1, pp 2,"
# one accumulation step with parallel.pp_schedule = 1f1b given: refused on every rank, naming
# the gpipe pipeline that would fit and 1f1b's rule
# shellcheck disable=SC2086
expect_fail_with 2 "pp 2 x tp 1 x sp 1 with ddp fits under parallel.pp_schedule = gpipe" $common $big $one \
    parallel.strategy=auto train.gradient_accumulation_steps=1 parallel.pp_schedule=1f1b train.output_dir=auto-1f1b
assert_contains "$ZT_OUT" "the schedule given is refused there: parallel.pp_schedule = 1f1b"
echo "pp_memory: auto picks pp 2 where zero3 does not fit and no tp or sp can split the model; it equals one rank"

# ---- 3. checkpoints and exports ----------------------------------------------------------
const="optim.lr_scheduler_type=constant_with_warmup"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $const $(batch_args 1) train.output_dir=full >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $const $(batch_args 2) $pp2 parallel.strategy=zero1 train.max_steps=10 \
    train.output_dir=split3 >/dev/null
# shellcheck disable=SC2086
run_ztrain 3 $common $llama $const $(batch_args 3) parallel.strategy=ddp checkpoint.resume=auto \
    train.output_dir=split3 >/dev/null
assert_contains "$ZT_OUT" "resumed from split3/ckpt-00000010"
"$PY" "$ZT_SRCDIR/tests/mpi/compare_runs.py" full split3 || fail "pp 2 x dp 2 -> ddp on 3 ranks diverged"
echo "pp_memory: pp 2 x dp 2 (zero1) resumes as ddp on 3 ranks as 20 steps at once"

hf="checkpoint.save_hf=true checkpoint.hf_dtype=fp32 train.max_steps=4"
# shellcheck disable=SC2086
run_ztrain 1 $common $hf $(batch_args 1) train.output_dir=hf-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $hf $(batch_args 2) $pp2 parallel.strategy=zero3 train.output_dir=hf-pp >/dev/null
"$PY" "$HFPY" close hf-pp/hf hf-ref/hf 1e-5 || fail "the HF export at pp 2 x dp 2 is not one rank's"
lora="train.finetuning_type=lora lora.rank=4 lora.alpha=8 checkpoint.save_hf=true checkpoint.hf_dtype=fp32
  train.max_steps=4"
# shellcheck disable=SC2086
run_ztrain 1 $common $llama $lora $(batch_args 1) train.output_dir=lo-ref >/dev/null
# shellcheck disable=SC2086
run_ztrain 4 $common $llama $lora $(batch_args 2) $pp2 train.output_dir=lo-pp >/dev/null
"$PY" "$HFPY" close lo-pp/adapter lo-ref/adapter 1e-5 || fail "the adapter export at pp 2 x dp 2 is not one rank's"
"$PY" "$HFPY" close lo-pp/hf lo-ref/hf 1e-5 || fail "the merged LoRA export at pp 2 x dp 2 is not one rank's"
echo "pp_memory: hf/, a LoRA adapter and its merged hf/ written at pp 2 x dp 2 equal one rank's"
