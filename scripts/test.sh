#!/usr/bin/env bash
# Builds dflash and runs the whole test suite (CPU). The CUDA backend is compiled when nvcc is present.
# Usage: scripts/test.sh [extra cmake args]      env: BUILD_DIR (default build), JOBS (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900
