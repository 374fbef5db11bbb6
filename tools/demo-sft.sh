#!/bin/sh
# demo-sft.sh [BUILDDIR [OUTDIR]] — supervised fine-tuning with LoRA, end to end, on 2 ranks
# (about five minutes on 2 cores):
#  1. pretrain a small Llama-style model from scratch on the fortunes text (byte-level,
#     the default job's data); its run writes OUTDIR/pre/hf, a Hugging Face directory with
#     ztrain's byte-level tokenizer.json;
#  2. make an instruction set with one right answer per record (two-digit additions as
#     alpaca records) and hold out 8 prompts;
#  3. fine-tune with LoRA (rank 8, every linear) on it, template "default"
#     ("Human: ...\nAssistant:"), the base frozen, under zero3;
#  4. ask the 8 held-out questions before and after (ztrain --generate, greedy) and print
#     both, with the share of right answers.
# The model is tiny and trained for minutes: what it learns is to answer in the template,
# with digits, and often the right sum.
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${2:-runs/demo-sft}
ZT="$PWD/$B/ztrain"
[ -x "$ZT" ] || sh tools/build.sh "$B"
[ -f data/train.h5 ] || sh tools/gen-data.sh "$B" data
mkdir -p "$OUT"
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
MPI="mpirun $root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np 2"
MODEL="model.arch=llama model.n_layer=4 model.n_embd=192 model.n_head=6 model.n_kv_head=2
 model.intermediate_size=512 model.vocab_size=257 model.block_size=128"
echo "== 1. pretraining a $(echo $MODEL | tr '\n' ' ') on the fortunes"
# shellcheck disable=SC2086
$MPI "$ZT" inputs/default.cfg $MODEL data.seq_len=128 train.max_steps=${PRE_STEPS:-400} optim.learning_rate=3e-3 \
    train.per_device_train_batch_size=8 train.eval_steps=0 train.sample_tokens=0 log.plot=false \
    checkpoint.save_steps=0 train.output_dir="$OUT/pre" | grep -E "^step .*(/| 1/)|summary|HF export"
echo "== 2. the instruction set: two-digit additions"
python3 - "$OUT" <<'EOF'
import json, random, sys
out = sys.argv[1]
rng = random.Random(7)
held = {(12, 30), (41, 17), (25, 25), (63, 14), (8, 51), (70, 22), (36, 19), (44, 44)}
with open(f"{out}/add.json", "w") as f:
    n = 0
    while n < 3000:
        a, b = rng.randrange(1, 80), rng.randrange(1, 80)
        if (a, b) in held: continue
        f.write(json.dumps({"instruction": f"What is {a} + {b}?", "output": f"{a + b}"}) + "\n")
        n += 1
with open(f"{out}/questions.jsonl", "w") as f:
    for a, b in sorted(held):
        f.write(json.dumps({"instruction": f"What is {a} + {b}?"}) + "\n")
EOF
# the model comes from its directory: an input without a model section
cat >"$OUT/sft.cfg" <<'EOF2'
data = { val_files = []; };
train = { sample_tokens = 0; eval_steps = 0; };
log = { plot = false; };
EOF2
SFT="model.name_or_path=$OUT/pre/hf data.tokenizer=$OUT/pre/hf data.template=default data.cutoff_len=64 data.seq_len=64"
ask() { # NAME ARGS: the held-out questions, greedy
    name=$1
    shift
    # shellcheck disable=SC2086
    $MPI "$ZT" --generate "$OUT/sft.cfg" $SFT generate.prompts_file="$OUT/questions.jsonl" \
        generate.max_new_tokens=8 train.output_dir="$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 ||
        { cat "$OUT/$name.log"; exit 1; }
}
shift $#
ask before
echo "== 3. LoRA fine-tuning (rank 8, every linear, base frozen, zero3)"
# shellcheck disable=SC2086
$MPI "$ZT" "$OUT/sft.cfg" $SFT data.format=alpaca data.train_files="$OUT/add.json" data.val_files=[] \
    train.finetuning_type=lora lora.rank=8 parallel.strategy=zero3 train.max_steps=${SFT_STEPS:-300} \
    optim.learning_rate=3e-3 train.per_device_train_batch_size=8 train.eval_steps=0 train.sample_tokens=0 \
    log.plot=false train.output_dir="$OUT/sft" | grep -E "^step .*(/| 1/)|summary|PEFT export|HF export"
ask after train.finetuning_type=lora lora.rank=8 lora.adapter_name_or_path="$OUT/sft/adapter"
echo "== 4. the held-out questions, before and after"
python3 - "$OUT" <<'EOF'
import json, re, sys
out = sys.argv[1]
b = [json.loads(l) for l in open(f"{out}/before/generations.jsonl")]
a = [json.loads(l) for l in open(f"{out}/after/generations.jsonl")]
right = lambda r: re.match(r"\s*(\d+)", r["output"]) is not None and \
    int(re.match(r"\s*(\d+)", r["output"]).group(1)) == sum(map(int, re.findall(r"\d+", r["prompt"])))
for x, y in zip(b, a):
    print(f"{x['prompt']:<22} before: {x['output']!r:<26} after: {y['output']!r}")
print(f"right answers: before {sum(map(right, b))}/{len(b)}, after {sum(map(right, a))}/{len(a)}")
EOF
