#!/usr/bin/env bash
# tools/tc_check.sh — on the GPU machine: build the CUDA tests and benches, run the attention / drafter rows of the
# op table (tests/cuda), then bench/run_all.sh (ours vs PyTorch). Logs under $OUT. Carry .deps (PCRE2 dev files).
set -u
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
T0=$(date +%s)
. tools/device_env.sh  # PCRE2 development files from .deps when the image lacks them
cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
cmake --build build-cuda -j 16 --target dflash_cuda_tests bench_attention bench_step bench_prefill >"$OUT/build.log" 2>&1 ||
  { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "[+$(( $(date +%s) - T0 ))s] built"
timeout 240 build-cuda/dflash_cuda_tests --gtest_filter="${TC_FILTER:-CudaOps.*Attention*:CudaOps.SharedMemory*:CudaDrafter.*}" \
  >"$OUT/tests.log" 2>&1
echo "[+$(( $(date +%s) - T0 ))s] tests rc=$?"
grep -E " FAIL$|^\[  PASSED|^\[  FAILED" "$OUT/tests.log" | head -40; echo "checks passed: $(grep -c " PASS$" "$OUT/tests.log"), failed: $(grep -c " FAIL$" "$OUT/tests.log")"
if [ "${RUN_BENCH:-1}" = 1 ]; then
  SKIP_TORCH=${SKIP_TORCH:-0} BENCH_DEADLINE_S=${BENCH_DEADLINE_S:-300} OUT=$OUT bash bench/run_all.sh >"$OUT/run_all.log" 2>&1
  cat "$OUT/summary.txt" 2>/dev/null
  sed -n '/^PROFILE mode=normal/,/^total/p' "$OUT/profile.txt" 2>/dev/null | head -14
fi
echo "[+$(( $(date +%s) - T0 ))s] done"
