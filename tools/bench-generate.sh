#!/bin/sh
# bench-generate.sh [BUILDDIR] — generation speed: ztrain --generate with and without its
# KV cache (generate.use_cache), one prompt at a time and the 4 at once
# (generate.batch_size=4), against transformers' generate(use_cache=True) on one prompt
# and on a batch of 4, side by side, one rank, one thread, greedy.
#
# The ~125M Llama-style model of the families issue (L=12, C=768, 12 heads, 4 KV heads,
# intermediate 2048, vocab 32000), seeded weights on both sides (speed does not depend on
# them); 4 prompts (ztrain: rendered with the qwen template of tests/reference/sft/tok/qwen,
# PROMPT_TOKENS tokens each; torch: PROMPT_TOKENS random ids), NEW tokens each (no eos
# stops them: ztrain's seeded model rarely picks one; torch's min_new_tokens forbids it).
# Prints new tokens per second of each, and the ratios.
# Torch: ZT_TORCH_PYTHON (default ~/.cache/ztrain-venv/bin/python).
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
NEW=${NEW:-64}
PROMPT_TOKENS=${PROMPT_TOKENS:-64}
PY=${ZT_TORCH_PYTHON:-$HOME/.cache/ztrain-venv/bin/python}
make -C "$B" -s ztrain >/dev/null
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
root=""; [ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# prompts of PROMPT_TOKENS tokens: the qwen template's 42 (its default system turn
# included) and words of 2 tokens each (" rank", " model" in that tokenizer; counted with
# `tokenizers`: 64 for the default)
words=$(awk -v n="$PROMPT_TOKENS" 'BEGIN { for (i = 0; i < (n - 42) / 2; i++) printf "%s ", (i % 2 ? "model" : "rank") }')
for i in 1 2 3 4; do printf '{"messages": [{"role": "user", "content": "%d %s"}]}\n' "$i" "$words"; done >"$out/p.jsonl"
echo "ztrain generation benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), 1 thread"
LLAMA="inputs/gpt2-124m.cfg model.arch=llama model.n_layer=12 model.n_embd=768 model.n_head=12 model.n_kv_head=4
  model.head_dim=64 model.intermediate_size=2048 model.vocab_size=32000 model.tie_word_embeddings=false
  data.seq_len=512 data.tokenizer=tests/reference/sft/tok/qwen data.template=qwen"
zt() {  # name, key=value...: new tokens per second of ztrain --generate
    name=$1
    shift
    # shellcheck disable=SC2086
    mpirun $root -np 1 --bind-to none "$B/ztrain" --generate $LLAMA generate.prompts_file="$out/p.jsonl" \
        generate.max_new_tokens="$NEW" train.output_dir="$out/$name" "$@" >"$out/$name.log" 2>&1 ||
        { tail -3 "$out/$name.log" >&2; echo 0; return; }
    s=$(sed -n 's/^generate: .*(\([0-9.]*\) s)$/\1/p' "$out/$name.log")
    /usr/bin/python3 -c "import json,sys; n=sum(json.loads(l)['new_tokens'] for l in open('$out/$name/generations.jsonl')); print(f'{n / $s:.1f} {n}')"
}
set -- $(zt cache)
zc=$1 nc=$2
set -- $(zt nocache generate.use_cache=false)
zn=$1 nn=$2
set -- $(zt batch generate.batch_size=4)
zb=$1 nb=$2
cmp -s "$out/cache/generations.jsonl" "$out/batch/generations.jsonl" && same=same || same=different
pt="0 0"
if [ -x "$PY" ]; then
    pt=$("$PY" - "$NEW" "$PROMPT_TOKENS" <<'EOF' 2>/dev/null || echo 0 0
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
new, plen = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=512,
                  tie_word_embeddings=False)
m = LlamaForCausalLM(cfg).eval()
g = torch.Generator().manual_seed(1)
rates = []
with torch.inference_mode():
    for batch, runs in ((1, 4), (4, 1)):  # the 4 prompts one by one, then as one batch
        t, n = 0.0, 0
        for i in range(runs + 1):  # the first one warms up, not counted
            ids = torch.randint(0, 32000, (batch, plen), generator=g)
            t0 = time.perf_counter()
            o = m.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                           pad_token_id=0, attention_mask=torch.ones_like(ids))
            if i:
                t += time.perf_counter() - t0
                n += (o.shape[1] - plen) * batch
        rates.append(f"{n / t:.1f}")
print(" ".join(rates))
EOF
)
fi
printf '%-44s %12s\n' "new tokens / s (4 prompts x $NEW, $PROMPT_TOKENS-token prompts)" ""
printf '%-44s %12s  (%s new tokens)\n' "ztrain, KV cache (generate.use_cache=true)" "$zc" "$nc"
printf '%-44s %12s  (%s new tokens)\n' "ztrain, no cache (the whole sequence per token)" "$zn" "$nn"
printf '%-44s %12s  (%s new tokens; output %s as one at a time)\n' "ztrain, KV cache, generate.batch_size=4" "$zb" "$nb" "$same"
set -- $pt
pt=$1 pb=$2
printf '%-44s %12s\n' "transformers generate, use_cache=True" "$pt"
printf '%-44s %12s\n' "transformers generate, batch of 4" "$pb"
awk -v a="$zc" -v b="$zn" -v c="$pt" -v d="$zb" -v e="$pb" 'BEGIN {
    if (b > 0) printf "cache / no cache: %.1fx\n", a / b
    if (c > 0) printf "ztrain (cache) / transformers: %.2fx\n", a / c
    if (a > 0) printf "ztrain batch of 4 / one at a time: %.2fx\n", d / a
    if (e > 0) printf "ztrain batch of 4 / transformers batch of 4: %.2fx\n", d / e }'
