#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root:   bash tools/cuda_check.sh
# Configures build-cuda with the CUDA backend, builds dflash_cuda_tests (-j$JOBS), runs it, then a short subset under
# compute-sanitizer memcheck (when installed), and prints the comparison table last.
# Logs in $OUT (default build-cuda/cuda_check): configure.log, build.log, tests.log, memcheck.log, summary.txt.
# Env: OUT, JOBS (default 16), SANITIZER (1 = run the memcheck subset, default; 0 = skip),
#      GTEST_FILTER (restricts the main run), TEST_TIMEOUT_S (default 300).
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build-cuda/cuda_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-16}
SUM="$OUT/summary.txt"
: >"$SUM"
say() { echo "[cuda_check +$(( $(date +%s) - T0 ))s] $*" | tee -a "$SUM"; }

say "start $(date -u '+%F %T') UTC"
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4) | tee -a "$SUM"

if ! cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1; then
  say "configure FAILED (tail of configure.log):"
  tail -30 "$OUT/configure.log"
  exit 1
fi
if ! cmake --build build-cuda -j "$JOBS" --target dflash_cuda_tests >"$OUT/build.log" 2>&1; then
  say "build FAILED (errors from build.log):"
  grep -E "error|Error" "$OUT/build.log" | head -40
  exit 1
fi
say "built dflash_cuda_tests"

BIN=build-cuda/dflash_cuda_tests
FILTER_ARGS=()
[ -n "${GTEST_FILTER:-}" ] && FILTER_ARGS=(--gtest_filter="$GTEST_FILTER")
timeout "${TEST_TIMEOUT_S:-300}" "$BIN" ${FILTER_ARGS[@]+"${FILTER_ARGS[@]}"} >"$OUT/tests.log" 2>&1
RC=$?
say "dflash_cuda_tests rc=$RC"

RCS=skipped
SAN=$(command -v compute-sanitizer || true)
[ -z "$SAN" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && SAN=/usr/local/cuda/bin/compute-sanitizer
if [ "${SANITIZER:-1}" = 1 ] && [ -n "$SAN" ]; then
  timeout 150 "$SAN" --tool memcheck --error-exitcode 3 "$BIN" \
    --gtest_filter='CudaOps.Linear:CudaOps.DFlashAttentionSmall:CudaErrors.*' >"$OUT/memcheck.log" 2>&1
  RCS=$?
  say "compute-sanitizer memcheck (Linear, DFlashAttentionSmall, CudaErrors) rc=$RCS: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
elif [ "${SANITIZER:-1}" = 1 ]; then
  say "compute-sanitizer not found: memcheck skipped"
fi

echo
grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|exception" "$OUT/tests.log" | tail -30
echo
sed -n '/^==== CUDA backend checks/,/^==== .* checks failed ====/p' "$OUT/tests.log"
say "done: tests rc=$RC, memcheck rc=$RCS (logs in $OUT)"
[ "$RC" = 0 ] && { [ "$RCS" = 0 ] || [ "$RCS" = skipped ]; }
