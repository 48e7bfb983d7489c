#!/usr/bin/env bash
# tools/moe_check.sh — issue 40 on the GPU machine in one call (repo root, $OUT set; carry .deps when the image lacks
# PCRE2's dev files, tools/device_env.sh):
#   1. the Qwen3-MoE goldens (tools/make_goldens.py --only target_qwen3_moe, CPU), packed into $OUT/golden_moe.tgz;
#   2. transformers' Qwen3-MoE prefill at Qwen3-30B-A3B shapes (bench/torch_moe.py) in the background while
#   3. the CUDA build (dflash_cuda_tests, bench_moe, dflash) runs;
#   4. the CUDA op table's MoE cases and the golden MoE target on CUDA (GTEST_FILTER, default CudaOps.MoE:CudaTarget.*);
#   5. bench/bench_moe (ours), once the PyTorch side is done;
# and prints the RESULT lines last. Env: GTEST_FILTER, TORCH_IMPL (default grouped_mm,eager), SKIP_GOLDENS=1,
# SKIP_TORCH=1, BENCH_ARGS.
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
. tools/device_env.sh

if [ "${SKIP_GOLDENS:-0}" != 1 ]; then
  timeout 240 python3 tools/make_goldens.py --only target_qwen3_moe --out tests/golden >"$OUT/goldens.log" 2>&1
  say "goldens rc=$? $(grep -E '^SUMMARY' "$OUT/goldens.log" | tr '\n' ' ' | cut -c1-400)"
  tar czf "$OUT/golden_moe.tgz" tests/golden/target_qwen3_moe tests/golden/target_qwen3_moe_sharded
fi

PY=
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  (timeout -k 5 300 python3 bench/torch_moe.py --impl "${TORCH_IMPL:-grouped_mm,eager}" >"$OUT/torch_moe.log" 2>&1
   echo "[+$(( $(date +%s) - T0 ))s] torch_moe rc=$?" >>"$OUT/summary.txt") &
  PY=$!
fi

cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 ||
  { say "configure FAILED"; tail -20 "$W/configure.log"; exit 1; }
if ! cmake --build build-cuda -j 14 --target dflash_cuda_tests bench_moe dflash >"$W/build.log" 2>&1; then
  say "build FAILED"; grep -E "error" "$W/build.log" | head -30; cp "$W/build.log" "$OUT/"; exit 1
fi
say "built"
[ -n "$PY" ] && wait "$PY"

timeout 200 build-cuda/dflash_cuda_tests --gtest_filter="${GTEST_FILTER:-CudaOps.MoE:CudaTarget.*}" >"$OUT/cuda_tests.log" 2>&1
say "dflash_cuda_tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_tests.log" | tr '\n' ' ')"

timeout 240 build-cuda/bench_moe ${BENCH_ARGS:-} >"$OUT/bench_moe.log" 2>&1
say "bench_moe rc=$?"

echo
sed -n '/^==== CUDA backend checks/,/^==== .* checks failed ====/p' "$OUT/cuda_tests.log" | grep -E "FAIL|====|qwen3_moe" | head -30
grep -hE "^# |^RESULT" "$OUT/torch_moe.log" "$OUT/bench_moe.log" 2>/dev/null
say "done"
