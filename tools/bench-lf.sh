#!/bin/sh
# bench-lf.sh [BUILDDIR] — ztrain against LLaMA-Factory's own trainer on the same LoRA SFT job,
# given to both as the same LLaMA-Factory YAML: a Qwen3 directory of about 110M parameters
# made by transformers (L12, C768, 12 heads, 4 KV heads, head_dim 64, MLP 2048, 32000
# vocabulary rows, tied), long alpaca records through dataset_info.json, template
# qwen3_nothink, cutoff 512, 8 samples per optimizer step, LoRA r8 on every linear, fp32,
# disable_gradient_checkpointing: true (LLaMA-Factory's fastest setting).
#   1 core:  ztrain 1 rank x 1 thread, LLaMA-Factory 1 process x 1 thread
#   2 cores: ztrain 2 ranks x 1 thread (4 per device), LLaMA-Factory 1 process x 2 threads
# Seconds per optimizer step: the median over the steps after WARMUP (ztrain: metrics.jsonl
# step_s; LLaMA-Factory: the differences of trainer_log.jsonl's elapsed_time, whole seconds).
# The sides alternate within a round, ROUNDS rounds. Target: ztrain >= 1.6x at 1 and 2 cores.
#   LF_PY: a python with llamafactory==0.9.5 (default ~/.cache/lf-trainer-venv/bin/python)
#   STAGE=dpo: the LoRA DPO job instead (tools/bench-dpo.sh): stage dpo, pref_loss sigmoid, the
#     records as pairs (chosen: a record's output, rejected: the next one's), PAIRS pairs per
#     optimizer step (default 2); also pairs per second, and ztrain's time in the reference
#     passes against the policy's forward + backward (its summary line); SHARE_PROMPT (default
#     true): ztrain's pref.share_prompt, the reference pass computing each pair's prompt once;
#     DPO_DATASET=prompt_pairs: pairs with long prompts instead (a record's output as the prompt,
#     "Summarize: " before it; chosen its first 40 words, rejected words 5-44 of the next one's)
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
STEPS=${STEPS:-4}
WARMUP=${WARMUP:-1}
ROUNDS=${ROUNDS:-1}
CORES=${CORES:-"1 2"}
STAGE=${STAGE:-sft}
PAIRS=${PAIRS:-2}
LF_PY=${LF_PY:-$HOME/.cache/lf-trainer-venv/bin/python}
[ -x "$LF_PY" ] || { echo "bench-lf: no $LF_PY (python3 -m venv ~/.cache/lf-trainer-venv && ~/.cache/lf-trainer-venv/bin/pip install llamafactory==0.9.5)"; exit 1; }
work=${WORK:-$(mktemp -d)}
ZT=$(cd "$B" && pwd)/ztrain
SRC=$(pwd)
cd "$work"
N=$((STEPS + WARMUP))
if [ ! -f data/prompt_pairs.json ]; then
    CUDA_VISIBLE_DEVICES= "$LF_PY" - "$SRC/tests/reference/sft/tok/qwen" <<'PY'
import json, os, shutil, sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                  tie_word_embeddings=True, rope_theta=1e6, eos_token_id=0)
m = Qwen3ForCausalLM(cfg)
print("parameters", sum(p.numel() for p in m.parameters()))
m.save_pretrained("qwen3-110m")
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(sys.argv[1], f), "qwen3-110m")
words = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were their one all we can her has there been if more when will would who so no").split()
recs = []
for i in range(64):
    out = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(420))
    recs.append({"instruction": f"Write a long passage number {i}.", "input": "", "output": out})
os.makedirs("data", exist_ok=True)
json.dump(recs, open("data/long_alpaca.json", "w"))
pairs = [{"instruction": r["instruction"], "input": "", "chosen": r["output"], "rejected": recs[(i + 1) % 64]["output"]}
         for i, r in enumerate(recs)]
json.dump(pairs, open("data/long_pairs.json", "w"))
words = [r["output"].split() for r in recs]
json.dump([{"instruction": "Summarize: " + r["output"], "input": "", "chosen": " ".join(words[i][:40]),
            "rejected": " ".join(words[(i + 1) % 64][5:45])} for i, r in enumerate(recs)],
          open("data/prompt_pairs.json", "w"))
cols = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}
json.dump({"long_alpaca": {"file_name": "long_alpaca.json"},
           "long_pairs": {"file_name": "long_pairs.json", "ranking": True, "columns": cols},
           "prompt_pairs": {"file_name": "prompt_pairs.json", "ranking": True, "columns": cols}},
          open("data/dataset_info.json", "w"))
PY
fi
zt_extra=
if [ "$STAGE" = dpo ]; then
    zt_extra="pref.share_prompt=${SHARE_PROMPT:-true}"
    GLOBAL=$PAIRS
    job="stage: dpo
pref_loss: sigmoid
pref_beta: 0.1
dataset: ${DPO_DATASET:-long_pairs}"
else
    GLOBAL=8
    job="stage: sft
dataset: long_alpaca"
fi
yaml() { # PER_DEVICE OUT: the job's YAML
    cat <<EOF
model_name_or_path: qwen3-110m
$job
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset_dir: data
template: qwen3_nothink
cutoff_len: 512
overwrite_cache: true
preprocessing_num_workers: 1
output_dir: $2
logging_steps: 1
save_steps: 100000
overwrite_output_dir: true
report_to: none
per_device_train_batch_size: $1
gradient_accumulation_steps: 1
learning_rate: 1.0e-4
max_steps: $N
lr_scheduler_type: cosine
warmup_ratio: 0.1
disable_gradient_checkpointing: true
disable_shuffling: true
EOF
}
lf() { # THREADS NAME -> median s/step
    yaml "$GLOBAL" "out/$2" >"$2.yaml"
    OMP_NUM_THREADS=$1 MKL_NUM_THREADS=$1 CUDA_VISIBLE_DEVICES= DISABLE_VERSION_CHECK=1 \
        "$(dirname "$LF_PY")/llamafactory-cli" train "$2.yaml" >"$2.log" 2>&1 || { tail -3 "$2.log" >&2; echo 0; return; }
    python3 - "out/$2/trainer_log.jsonl" "$WARMUP" <<'PY'
import json, statistics, sys
def sec(t):
    h, m, s = (int(x) for x in t.split(":"))
    return 3600 * h + 60 * m + s
# the step records (the trainer's closing record repeats the last step a second later)
e = [sec(r["elapsed_time"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
d = [b - a for a, b in zip(e, e[1:])][int(sys.argv[2]) - 1:]
print(f"{statistics.median(d):.1f}")
PY
}
zt() { # RANKS NAME -> median s/step
    yaml $((GLOBAL / $1)) "out/$2" >"$2.yaml"
    # shellcheck disable=SC2086 # zt_extra: no word or one
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$1" \
        "$ZT" "$2.yaml" train.sample_tokens=0 checkpoint.save_at_end=false checkpoint.save_hf=false $zt_extra \
        >"$2.log" 2>&1 || { tail -3 "$2.log" >&2; echo 0; return; }
    python3 - "out/$2/metrics.jsonl" "$WARMUP" <<'PY'
import json, statistics, sys
st = [json.loads(l)["step_s"] for l in open(sys.argv[1]) if '"step_s"' in l][int(sys.argv[2]):]
print(f"{statistics.median(st):.2f}")
PY
}
echo "bench-lf ($STAGE) — $(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)," \
     "flags:$(for f in avx2 avx512f avx512_bf16; do grep -qw $f /proc/cpuinfo && printf ' %s' $f || printf ' no-%s' $f; done);" \
     "load $(uptime | sed 's/.*load average: //'); $STEPS steps after $WARMUP, work dir $work"
printf '%-6s %-6s %14s %18s %8s' round cores "ztrain s/step" "LLaMA-Factory s/step" ratio
[ "$STAGE" = dpo ] && printf ' %14s %18s %s' "ztrain pairs/s" "LLaMA-Factory pairs/s" "ztrain reference / policy fwd+bwd"
echo
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for c in $CORES; do
        z=$(zt "$c" "zt-r$r-c$c")
        l=$(lf "$c" "lf-r$r-c$c")
        printf '%-6s %-6s %14s %18s %8s' "$r" "$c" "$z" "$l" "$(awk "BEGIN{ if ($z > 0) printf \"%.2fx\", $l / $z }")"
        if [ "$STAGE" = dpo ]; then
            printf ' %14s %18s %s' "$(awk "BEGIN{ if ($z > 0) printf \"%.3f\", $GLOBAL / $z }")" \
                "$(awk "BEGIN{ if ($l > 0) printf \"%.3f\", $GLOBAL / $l }")" \
                "$(sed -n 's/.*summary: dpo reference passes \(.*\)$/\1/p' "zt-r$r-c$c.log")"
        fi
        echo
    done
    r=$((r + 1))
done
