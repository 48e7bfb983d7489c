#!/usr/bin/env bash
# tools/hybrid_check.sh — issue 37 on the GPU machine (one H200) in one call (repo root, $OUT set; carry .deps when the
# image lacks PCRE2's dev files, tools/device_env.sh):
#   1. transformers' hybrid prefill and gated delta rule (bench/torch_hybrid.py) in the background while
#   2. the CUDA build (dflash_cuda_tests, bench_hybrid, dflash) runs;
#   3. the CUDA op table's hybrid cases and the hybrid goldens on CUDA (GTEST_FILTER, default
#      CudaOps.Hybrid*:CudaOps.Elementwise:CudaOps.RmsNorm*:CudaTarget.*), then the whole op table unless SKIP_ALL=1;
#   4. bench/bench_hybrid (the chunked gated delta rule alone, then the dense and MoE prefills with capture);
# and prints the RESULT lines last. Env: TORCH_IMPL (default grouped_mm), SKIP_TORCH=1, SKIP_ALL=1, BENCH_ARGS.
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
  (timeout -k 5 420 python3 bench/torch_hybrid.py --impl "${TORCH_IMPL:-grouped_mm}" >"$OUT/torch_hybrid.log" 2>&1
   echo "[+$(( $(date +%s) - T0 ))s] torch_hybrid rc=$?" >>"$OUT/summary.txt") &
  PY=$!
fi

cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 ||
  { say "configure FAILED"; tail -20 "$W/configure.log"; exit 1; }
if ! cmake --build build-cuda -j 14 --target dflash_cuda_tests bench_hybrid dflash >"$W/build.log" 2>&1; then
  say "build FAILED"; grep -E "error" "$W/build.log" | head -30; cp "$W/build.log" "$OUT/"; exit 1
fi
say "built"
[ -n "$PY" ] && wait "$PY"

timeout 300 build-cuda/dflash_cuda_tests \
  --gtest_filter="${GTEST_FILTER:-CudaOps.Hybrid*:CudaOps.Elementwise:CudaOps.RmsNorm*:CudaTarget.*}" >"$OUT/cuda_hybrid.log" 2>&1
say "dflash_cuda_tests (hybrid) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_hybrid.log" | tr '\n' ' ') $(grep -cE ' FAIL$' "$OUT/cuda_hybrid.log") failed checks"
if [ "${SKIP_ALL:-0}" != 1 ]; then
  timeout 600 build-cuda/dflash_cuda_tests >"$OUT/cuda_all.log" 2>&1
  say "dflash_cuda_tests (all) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_all.log" | tr '\n' ' ')"
fi
timeout 420 build-cuda/bench_hybrid ${BENCH_ARGS:-} >"$OUT/bench_hybrid.log" 2>&1
say "bench_hybrid rc=$?"

echo
grep -hE " FAIL$|golden|gated_delta_rule|conv1d|rmsnorm_gated" "$OUT/cuda_hybrid.log" | head -60
grep -hE "^# |^RESULT" "$OUT/torch_hybrid.log" "$OUT/bench_hybrid.log" 2>/dev/null
say "done"
