#!/usr/bin/env bash
# tools/dflash2_check.sh — DFlash2 on the GPU machine, from the repo root, in steps that fit one device call each:
#   STEP=build   configure build-cuda (no MPI), build dflash, dflash_cuda_tests, bench_step, bench_select (-j$JOBS)
#   STEP=ops     the CUDA op table (GTEST_FILTER, default: all of it) and a memcheck of the DFlash2 ops
#   STEP=bench   the drafter step at Qwen3-8B shapes, DFlash against DFlash2, blocks 16 and 8, in the same call
#                (bench/bench_step.cpp --arch), and the selector's cost per block against a drafter forward
#                (bench/bench_select.cpp)
#   STEP=demo    one GPU demo run of DFlash2 (dflash demo --device cuda --arch dflash2 --seed $SEED)
# Logs and RESULT lines in $OUT (default build-cuda/dflash2_check); the last lines printed are the table.
# Env: OUT, JOBS (16), GTEST_FILTER, SEED (0), ARCH (the demo's, dflash2).
set -u
T0=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-build-cuda/dflash2_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
JOBS=${JOBS:-16}
say() { echo "[dflash2_check +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
source tools/device_env.sh
B=build-cuda
case "${STEP:-build}" in
  build)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
    cmake -S . -B $B -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
      >"$OUT/configure.log" 2>&1 || { say "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
    if ! cmake --build $B -j "$JOBS" --target dflash dflash_cuda_tests bench_step bench_select >"$OUT/build.log" 2>&1; then
      say "build FAILED"
      grep -E "error|Error" "$OUT/build.log" | head -40
      exit 1
    fi
    say "built dflash, dflash_cuda_tests, bench_step, bench_select"
    ;;
  ops)
    F=()
    [ -n "${GTEST_FILTER:-}" ] && F=(--gtest_filter="$GTEST_FILTER")
    timeout "${TEST_TIMEOUT_S:-420}" $B/dflash_cuda_tests ${F[@]+"${F[@]}"} >"$OUT/tests.log" 2>&1
    say "dflash_cuda_tests rc=$?"
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$SAN" ] && [ "${SANITIZER:-1}" = 1 ]; then
      timeout 120 "$SAN" --tool memcheck --error-exitcode 3 $B/dflash_cuda_tests \
        --gtest_filter='CudaOps.DynamicConv*:CudaOps.CandidateSelector*' >"$OUT/memcheck.log" 2>&1
      say "memcheck (DynamicConv, CandidateSelector) rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
    fi
    grep -E "^\[  (FAILED|PASSED) |^\[==========\]|Failure|exception" "$OUT/tests.log" | tail -30
    sed -n '/^==== CUDA backend checks/,/^==== .* checks failed ====/p' "$OUT/tests.log" | tail -60
    ;;
  bench)
    for blk in 16 8; do
      for arch in dflash dflash2; do
        $B/bench_step --arch $arch --B $blk --modes normal --c02-steps 0 --budget-s 8 --max-reps 3 \
          >"$OUT/bench_step_${arch}_B$blk.log" 2>&1
        say "bench_step $arch B $blk: $(grep '^RESULT name=step ' "$OUT/bench_step_${arch}_B$blk.log")"
      done
    done
    $B/bench_select --B 16 >"$OUT/bench_select_B16.log" 2>&1
    $B/bench_select --B 8 >"$OUT/bench_select_B8.log" 2>&1
    say "$(grep -h '^RESULT' "$OUT"/bench_select_*.log)"
    grep -h '^RESULT' "$OUT"/bench_*.log >"$OUT/results.txt"
    ;;
  demo)
    SEED=${SEED:-0}
    ARCH=${ARCH:-dflash2}
    $B/dflash demo --device cuda --arch "$ARCH" --seed "$SEED" --out "$OUT/demo_${ARCH}_s$SEED" \
      >"$OUT/demo_${ARCH}_s$SEED.log" 2>&1
    say "demo $ARCH seed $SEED rc=$?"
    tail -25 "$OUT/demo_${ARCH}_s$SEED.log"
    cp "$OUT/demo_${ARCH}_s$SEED/summary.json" "$OUT/summary_${ARCH}_s$SEED.json" 2>/dev/null
    cp "$OUT/demo_${ARCH}_s$SEED/run/metrics.jsonl" "$OUT/metrics_${ARCH}_s$SEED.jsonl" 2>/dev/null
    rm -rf "$OUT/demo_${ARCH}_s$SEED/data" "$OUT/demo_${ARCH}_s$SEED/run/checkpoints" "$OUT/demo_${ARCH}_s$SEED/run/export"
    ;;
esac
say "done"
