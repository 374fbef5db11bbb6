#!/bin/sh
# tools/bench_gpu's logic on the CPU backend (CUDA builds only, where it is built): the rows'
# FLOPs match zt_model_flops_per_token (the tool aborts otherwise), the summary lines that
# tools/gpu-check.sh parses are complete, bf16 conversions count only under medium, bad input
# gives one line and exit 2, and the cuda backend exits 77 without a GPU (0 with one).
set -u
BIN=${ZT_BUILDDIR:-.}/tools/bench_gpu
fail() { echo "FAIL: $*"; exit 1; }
small="-B 1 -T 16 -C 32 --NH 2 -V 64 -L 2 --reps 1 --warmup 0"

# shellcheck disable=SC2086
out=$("$BIN" --backend cpu $small --precision highest,medium) || fail "cpu run: exit $?"
echo "$out"
[ "$(echo "$out" | grep -c 'zt_model_flops_per_token: match')" = 2 ] || fail "no FLOP match line per precision"
for p in highest medium; do
    line=$(echo "$out" | grep "^bench_gpu: precision=$p ") || fail "no summary line for $p"
    for k in step_ms tokens_per_s mfu top; do   # as gpu-check.sh's kv()
        v=$(echo "$line" | sed -n "s/.* $k=\([^ ]*\).*/\1/p")
        [ -n "$v" ] || fail "$p: no $k in '$line'"
    done
done
echo "$out" | awk '/matmul precision highest/ { p = "h" } /matmul precision medium/ { p = "m" }
    $1 == "to_bf16" && $5 == "GB/s" { c[p] = $6 } END { exit !(c["h"] == 0 && c["m"] == 1) }' ||
    fail "to_bf16 calls per step: want 0 under highest, 1 under medium"

err=$("$BIN" --backend cpu -C 30 --NH 4 2>&1 >/dev/null)
rc=$?
if [ $rc != 2 ] || [ "$(echo "$err" | wc -l)" != 1 ]; then fail "bad input: exit $rc, '$err'"; fi

# shellcheck disable=SC2086
"$BIN" $small --no-gemm-table >/dev/null 2>&1
rc=$?
[ $rc = 77 ] || [ $rc = 0 ] || fail "cuda backend: exit $rc (77 without a GPU, 0 with one)"
echo "bench_gpu on the cpu backend: ok (cuda backend exit $rc)"
