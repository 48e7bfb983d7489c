#!/usr/bin/env bash
# From a fresh machine: installs what the build and the tests need if missing (scripts/setup.sh), builds dflash and
# runs the whole test suite on the CPU (the CUDA backend is compiled when nvcc is present; its tests run on a GPU
# machine with tools/cuda_check.sh). Then the thread-safety case C01 again under ThreadSanitizer.
# Usage: scripts/test.sh        env: BUILD_DIR (default build), JOBS (default nproc), SKIP_TSAN=1 to skip TSan
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
export OPENBLAS_NUM_THREADS=1   # tests use their own thread pools; keeps OpenBLAS from oversubscribing 2 cores
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900)
if [ "${SKIP_TSAN:-0}" != 1 ]; then
  cmake -S . -B "$BUILD_DIR-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDFLASH_CUDA=OFF -DDFLASH_TSAN=ON >/dev/null
  cmake --build "$BUILD_DIR-tsan" -j "$JOBS" --target dflash_tests
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$BUILD_DIR-tsan/dflash_tests" --gtest_filter='Threads.*'
fi
