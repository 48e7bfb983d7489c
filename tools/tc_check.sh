#!/usr/bin/env bash
# tools/tc_check.sh — on the GPU machine: build the CUDA tests and benches, run the attention / drafter rows of the
# op table (tests/cuda), then bench/run_all.sh (ours vs PyTorch). Under $OUT: summary.txt, results.txt, profile.txt,
# tests.log and logs_tc.tgz (every other log: the device returns at most 8 files). Carry .deps (PCRE2 dev files).
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
rc=$?
echo "[+$(( $(date +%s) - T0 ))s] tests rc=$rc"
grep -E " FAIL$|^\[  PASSED|^\[  FAILED" "$OUT/tests.log" | head -40; echo "checks passed: $(grep -c " PASS$" "$OUT/tests.log"), failed: $(grep -c " FAIL$" "$OUT/tests.log")"
if [ "${RUN_BENCH:-1}" = 1 ]; then
  SKIP_TORCH=${SKIP_TORCH:-0} BENCH_DEADLINE_S=${BENCH_DEADLINE_S:-300} OUT=$OUT bash bench/run_all.sh >"$OUT/run_all.log" 2>&1
  cat "$OUT/summary.txt" 2>/dev/null
  sed -n '/^PROFILE mode=normal/,/^total/p' "$OUT/profile.txt" 2>/dev/null | head -14
fi
echo "[+$(( $(date +%s) - T0 ))s] done"
# The device returns at most 8 files from $OUT: keep the table, the RESULT lines, the profile and the test log as
# they are, and every other file of $OUT in logs_tc.tgz (a caller's own files too; folders are left alone).
( cd "$OUT" && rest=$(find . -maxdepth 1 -type f ! -name summary.txt ! -name results.txt ! -name profile.txt \
    ! -name tests.log ! -name logs_tc.tgz -printf '%f\n') &&
  if [ -n "$rest" ]; then echo "$rest" | tar czf logs_tc.tgz -T - && echo "$rest" | xargs rm -f; fi )
