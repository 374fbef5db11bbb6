#!/bin/sh
# generate.sh — ztrain --generate: prompts (OpenAI messages and alpaca records, a system
# turn, history, non-ASCII) rendered with a template and completed; greedy output is the
# same bytes under every strategy and world size, sampled output too (its generator is
# seeded per prompt), and a bad prompts file fails on every rank naming file and line.
. "$(dirname "$0")/common.sh"
PY=${PYTHON3:-/usr/bin/python3}
cd "$ZT_TMP" || fail "cd"
cat >prompts.jsonl <<'JSON'
{"messages": [{"role": "user", "content": "What is the rank of a shard?"}]}
{"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Sum 2 and 3"}]}
{"instruction": "Translate to French", "input": "the model"}
{"instruction": "Name a colour"}
{"messages": [{"role": "user", "content": "\u00dcn\u00efcode \u2713 \u6f22\u5b57"}]}
JSON
G="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=48
  model.vocab_size=3520 model.block_size=64 data.seq_len=48 data.tokenizer=$ZT_SRCDIR/tests/reference/sft/tok/qwen
  data.template=qwen generate.prompts_file=prompts.jsonl generate.max_new_tokens=12 log.plot=false"
for cfg in "1 ddp flat" "2 zero3 flat" "3 zero2 per_param" "4 hybrid_shard flat"; do
    set -- $cfg
    # shellcheck disable=SC2086
    run_ztrain "$1" --generate $G parallel.strategy=$2 parallel.shard_layout=$3 parallel.shard_group_size=2 \
        train.output_dir="g$1" >/dev/null
    [ "$(wc -l <"g$1/generations.jsonl")" -eq 5 ] || fail "$2 on $1 ranks: not one line per prompt"
    ls g$1/*.part >/dev/null 2>&1 && fail "$2 on $1 ranks left part files"
done
for n in 2 3 4; do
    cmp g1/generations.jsonl "g$n/generations.jsonl" || fail "greedy output on $n ranks differs from one rank's"
done
# sequence parallelism (Ulysses, ring) and tp_sequence_parallel: each sequence padded to
# whole shares of the mesh, each rank its chunk, the head on the last position's row alone
# (on the sp rank that holds it, broadcast to the others): the same greedy output
sp2="parallel.sequence_parallel_size=2"
tps="parallel.tensor_parallel_size=2 parallel.tp_sequence_parallel=true"
# (and tp 2 with the KV cache: each rank caches its heads' keys and values)
# same_generations REF BASE "NP NAME key=value ..." ...: each run writes REF's generations.jsonl
same_generations() {
    ref=$1 base=$2
    shift 2
    for cfg in "$@"; do
        # shellcheck disable=SC2086
        set -- $cfg
        np=$1 name=$2
        shift 2
        # shellcheck disable=SC2086
        run_ztrain "$np" --generate $base "$@" train.output_dir="$name" >/dev/null
        cmp "$ref/generations.jsonl" "$name/generations.jsonl" || fail "generations with $* differ from $ref's"
    done
}
same_generations g1 "$G" "2 u $sp2" "2 r $sp2 parallel.sp_mode=ring generate.batch_size=2" "2 t $tps" \
    "4 tr $tps $sp2 parallel.sp_mode=ring" "2 tc parallel.tensor_parallel_size=2"
"$PY" - g1/generations.jsonl <<'PYEOF' || fail "generations.jsonl is not one record per prompt in order"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["index"] for r in recs] == list(range(5)), recs
assert recs[1]["prompt"] == "Sum 2 and 3" and recs[2]["prompt"] == "Translate to French\nthe model"
assert all(0 < r["new_tokens"] <= 12 and isinstance(r["output"], str) for r in recs)
PYEOF
# the KV cache (generate.use_cache, on unless sp or tp_sequence_parallel) against the whole
# sequence run again for every token: the same greedy output at 1 rank, zero3 on 2, tp 2
# (prompts longer than data.seq_len slide their window and start the cache again)
for cfg in "1 nc1" "2 nc2 parallel.strategy=zero3" "2 nct parallel.tensor_parallel_size=2"; do
    set -- $cfg
    np=$1 name=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" --generate $G generate.use_cache=false "$@" train.output_dir="$name" >/dev/null
    cmp g1/generations.jsonl "$name/generations.jsonl" || fail "greedy output without the KV cache ($*) differs"
done
samp="generate.temperature=0.8 generate.top_k=50 generate.top_p=0.9"
# shellcheck disable=SC2086
run_ztrain 1 --generate $G $samp train.output_dir=s1 >/dev/null
# shellcheck disable=SC2086
run_ztrain 2 --generate $G $samp parallel.strategy=zero3 train.output_dir=s2 >/dev/null
cmp s1/generations.jsonl s2/generations.jsonl || fail "sampled output depends on the world size"
# shellcheck disable=SC2086
run_ztrain 1 --generate $G $samp generate.use_cache=false train.output_dir=s1nc >/dev/null
cmp s1/generations.jsonl s1nc/generations.jsonl || fail "sampled output without the KV cache differs"
cmp -s s1/generations.jsonl g1/generations.jsonl && fail "sampling at temperature 0.8 gave the greedy output"
# several prompts at once (generate.batch_size): each its own cache, a step's new tokens one
# batch, a row taking the rank's next prompt when its last one ends; the same greedy bytes
# as one at a time: 5 prompts 3 at a time, zero3 on 2 ranks 2 at a time (the ranks' rows
# slide their windows at different steps: the spare sequence keeps their forwards in
# step), tp 2 x zero3 on 4, the cache off; and the same sampled output
for cfg in "1 b3 generate.batch_size=3" "2 b2z parallel.strategy=zero3 generate.batch_size=2" \
    "4 b4tz parallel.tensor_parallel_size=2 parallel.strategy=zero3 generate.batch_size=4" \
    "1 b3nc generate.batch_size=3 generate.use_cache=false"; do
    set -- $cfg
    np=$1 name=$2
    shift 2
    # shellcheck disable=SC2086
    run_ztrain "$np" --generate $G "$@" train.output_dir="$name" >/dev/null
    assert_contains "$ZT_OUT" "generate: $(echo "$*" | sed 's/.*batch_size=\([0-9]*\).*/\1/') prompts at once per rank"
    cmp g1/generations.jsonl "$name/generations.jsonl" || fail "greedy output with $* differs from one at a time"
done
# shellcheck disable=SC2086
run_ztrain 1 --generate $G $samp generate.batch_size=4 train.output_dir=s1b >/dev/null
cmp s1/generations.jsonl s1b/generations.jsonl || fail "sampled output with generate.batch_size=4 differs"
# answers that end at different steps (the byte tokenizer's end-of-text, sampled at
# temperature 1.5 from the seeded model): their rows take the next prompts at once, and
# the 24 outputs are still one at a time's, in prompt order
"$PY" -c "
import json
for i in range(24): print(json.dumps({'instruction': 'q%d %s' % (i, 'x' * (i % 5))}))" >many.jsonl
M="$ZT_SRCDIR/inputs/tiny.cfg model.arch=llama model.n_head=4 model.n_kv_head=2 model.intermediate_size=48
  model.block_size=64 data.seq_len=48 data.template=default generate.prompts_file=many.jsonl
  generate.max_new_tokens=40 generate.temperature=1.5 log.plot=false"
# shellcheck disable=SC2086
run_ztrain 1 --generate $M train.output_dir=m1 >/dev/null
"$PY" - m1/generations.jsonl <<'PYEOF' || fail "no sampled answer ended before generate.max_new_tokens"
import json, sys
n = [json.loads(l)["new_tokens"] for l in open(sys.argv[1])]
assert len(n) == 24 and sum(k < 40 for k in n) >= 3, n
PYEOF
same_generations m1 "$M" "1 m3 generate.batch_size=3" "2 m4z generate.batch_size=4 parallel.strategy=zero3"
printf '{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": [{"role": "assistant"' >bad.jsonl
# shellcheck disable=SC2086
expect_fail_with 2 "bad.jsonl:2:" --generate $G generate.prompts_file=bad.jsonl train.output_dir=bad
printf '{"messages": [{"role": "assistant", "content": "x"}]}\n' >bad2.jsonl
# shellcheck disable=SC2086
expect_fail_with 2 "bad2.jsonl:1: messages[0] is assistant, expected user" --generate $G \
    generate.prompts_file=bad2.jsonl train.output_dir=bad2
# a batch whose KV cache would not fit beside the model is refused before anything is
# allocated (the tiny model's estimate is 5.33 MiB, the cache of 48 + 1 sequences 588 KiB);
# one sequence's fits the same limit
# shellcheck disable=SC2086
expect_fail_with 2 "generation's KV cache for generate.batch_size=48 needs 588.00 KiB per rank" --generate $G \
    generate.batch_size=48 parallel.memory_limit_gb=0.00547 train.output_dir=kvbig
# shellcheck disable=SC2086
run_ztrain 1 --generate $G parallel.memory_limit_gb=0.00547 train.output_dir=kvsmall >/dev/null
# while training: the prompts completed at each evaluation (generate.at_eval), two at once
"$PY" "$ZT_SRCDIR/tests/mpi/hf_dir.py" tokens tok.h5 3520 20000 || fail "cannot make the token file"
# shellcheck disable=SC2086
run_ztrain 2 $G parallel.strategy=zero3 data.train_files=tok.h5 data.val_files=[] train.max_steps=4 \
    train.eval_steps=2 generate.at_eval=true generate.batch_size=2 optim.learning_rate=1e-2 train.output_dir=t >/dev/null
for s in 2 4; do
    [ "$(wc -l <"t/generations-$s.jsonl")" -eq 5 ] || fail "no generations of step $s while training"
done
assert_contains "$ZT_OUT" "step     4/4 | generations: t/generations-4.jsonl"
ls t/*.part >/dev/null 2>&1 && fail "the training run left part files"
# the end-of-run sample (learning rate 0: the seeded model) under ring sp 2 x tp 2 with
# tp_sequence_parallel is one rank's, token for token
sample() { sed -n '/^---- sample/,/^---- end of sample/p' "$1"; }
# shellcheck disable=SC2086
run_ztrain 1 $G data.train_files=tok.h5 data.val_files=[] train.max_steps=1 optim.learning_rate=0 \
    train.output_dir=smp1 >smp1.out
# shellcheck disable=SC2086
run_ztrain 4 $G data.train_files=tok.h5 data.val_files=[] train.max_steps=1 optim.learning_rate=0 $tps $sp2 \
    parallel.sp_mode=ring train.output_dir=smp4 >smp4.out
[ -n "$(sample smp1.out)" ] || fail "no end-of-run sample on one rank"
[ "$(sample smp1.out)" = "$(sample smp4.out)" ] || fail "the end-of-run sample under ring sp 2 x tp 2 is not one rank's"
# a sequence length the mesh does not split for generation is refused, naming why
# shellcheck disable=SC2086
expect_fail_with 4 "data.seq_len (42) must divide by 4" --generate $G $tps $sp2 parallel.sp_mode=ulysses \
    data.seq_len=42 train.output_dir=bad-len
echo "generate: greedy and sampled outputs are the same at every world size, strategy, mesh and batch"
