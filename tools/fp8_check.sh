#!/usr/bin/env bash
# tools/fp8_check.sh — FP8 targets on the GPU machine, from the repo root, in steps that fit one device call each:
#   STEP=build   configure build-cuda (no MPI), build dflash, dflash_cuda_tests, bench_fp8, bench_prefill (-j$JOBS)
#   STEP=ops     the CUDA op table's FP8 cases and Linear (GTEST_FILTER overrides)
#   STEP=bench   bench_fp8: FP8 against bf16 GEMMs at Qwen3-8B linear shapes; bench_prefill (4 x 3072 tokens) with
#                bf16, FP8 block and FP8 per-channel projections: all in the same call
# Logs in $OUT (default build-cuda/fp8_check); the last lines printed are the table.
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build-cuda/fp8_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-16}
say() { echo "[fp8_check +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
source tools/device_env.sh
B=build-cuda
case "${STEP:-build}" in
  build)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
    cmake -S . -B $B -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
      >"$OUT/configure.log" 2>&1 || { say "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
    if ! cmake --build $B -j "$JOBS" --target dflash dflash_cuda_tests bench_fp8 bench_prefill bench_step bench_select \
        >"$OUT/build.log" 2>&1; then
      say "build FAILED"
      grep -E "error|Error" "$OUT/build.log" | head -40
      exit 1
    fi
    say "built"
    ;;
  ops)
    timeout "${TEST_TIMEOUT_S:-300}" $B/dflash_cuda_tests --gtest_filter="${GTEST_FILTER:-CudaOps.LinearFp8*:CudaOps.Linear}" \
      >"$OUT/tests.log" 2>&1
    say "dflash_cuda_tests rc=$?"
    grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|exception" "$OUT/tests.log" | tail -30
    sed -n '/^==== CUDA backend checks/,/^==== .* checks failed ====/p' "$OUT/tests.log" | tail -40
    ;;
  bench)
    $B/bench_fp8 ${BENCH_ARGS:-} >"$OUT/bench_fp8.log" 2>&1
    say "bench_fp8 rc=$?"
    for f in none block channel; do
      $B/bench_prefill --T-batch 3072 --batch 4 --budget-s 3 --max-reps 3 --fp8 $f >"$OUT/bench_prefill_$f.log" 2>&1
      say "bench_prefill --fp8 $f rc=$?"
    done
    grep -v '^RESULT' "$OUT/bench_fp8.log" | tail -12
    grep -h '^RESULT' "$OUT"/bench_prefill_*.log
    ;;
esac
say "done"
