#!/usr/bin/env bash
# tools/gptoss_check.sh — issue 36 (gpt-oss) on the GPU machine in one call (repo root, $OUT set; carry .deps when the
# image lacks PCRE2's dev files, tools/device_env.sh):
#   1. transformers' gpt-oss-20b prefill (bench/torch_moe.py --family gpt_oss) in the background while
#   2. the CUDA build (dflash_cuda_tests, bench_moe, dflash) runs;
#   3. the CUDA op table's gpt-oss cases (and the MoE / attention ones they touch) per grouped-GEMM variant in VARIANTS
#      (GTEST_FILTER overrides the filter);
#   4. bench_moe --experts at gpt-oss-20b's expert shapes per variant (bf16 against MXFP4 weights);
#   5. with PREFILL=1, bench_moe --config bench/configs/gpt-oss-20b.json (the prefill with capture) and, with
#      BIG=1, the 120b config's weights on the device and co-located training (tools: dflash train --target ... );
# and prints the RESULT lines last. Env: VARIANTS (default "1 0"), SKIP_TORCH=1, TORCH_IMPL (default grouped_mm).
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
. tools/device_env.sh

PY=
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  (timeout -k 5 300 python3 bench/torch_moe.py --family gpt_oss --impl "${TORCH_IMPL:-grouped_mm}" --budget-s 15 \
     >"$OUT/torch_gptoss.log" 2>&1
   echo "[+$(( $(date +%s) - T0 ))s] torch_gptoss rc=$?" >>"$OUT/summary.txt") &
  PY=$!
fi

cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 ||
  { say "configure FAILED"; tail -20 "$W/configure.log"; exit 1; }
if ! cmake --build build-cuda -j 14 --target dflash_cuda_tests bench_moe dflash >"$W/build.log" 2>&1; then
  say "build FAILED"; grep -E "error" "$W/build.log" | head -30; cp "$W/build.log" "$OUT/"; exit 1
fi
say "built"
[ -n "$PY" ] && wait "$PY"

FILTER=${GTEST_FILTER:-CudaOps.MoeGptOss:CudaOps.AttentionCausalSinksWindow:CudaOps.MoE:CudaOps.AttentionCausal*:CudaTarget.*}
: >"$OUT/cuda_tests.log"
for v in ${VARIANTS:-1 0}; do
  DFLASH_MOE_GEMM_VARIANT=$v timeout 200 build-cuda/dflash_cuda_tests --gtest_filter="$FILTER" >"$W/t$v.log" 2>&1
  say "variant $v: dflash_cuda_tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$W/t$v.log" | tr '\n' ' ') $(grep -cE ' FAIL$' "$W/t$v.log") failed checks"
  grep -E " FAIL$|Failure|FAILED" "$W/t$v.log" | head -20 | tee -a "$OUT/summary.txt"
  { echo "==== variant $v"; cat "$W/t$v.log"; } >>"$OUT/cuda_tests.log"
  DFLASH_MOE_GEMM_VARIANT=$v timeout 90 build-cuda/bench_moe --experts 2880,2880,32,4 --budget-s 3 >"$W/g$v.log" 2>&1
  grep -E "^RESULT" "$W/g$v.log" | sed "s/^RESULT /RESULT variant=$v /" | tee -a "$OUT/gemm_variants.txt"
done

if [ "${PREFILL:-0}" = 1 ]; then
  timeout 240 build-cuda/bench_moe --config bench/configs/gpt-oss-20b.json --budget-s 10 >"$OUT/bench_prefill.log" 2>&1
  say "bench_moe gpt-oss-20b rc=$?"
fi

echo "==== summary"
cat "$OUT/summary.txt"
grep -hE "^RESULT" "$OUT"/torch_gptoss.log "$OUT"/bench_prefill.log 2>/dev/null
cat "$OUT/gemm_variants.txt" 2>/dev/null
