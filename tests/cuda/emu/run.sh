#!/usr/bin/env bash
# Builds and runs the CUDA backend on the CPU kernel emulator (tests/cuda/emu/cuda_emu.h), for machines without a
# GPU: every src/backend/cuda/*.cu (and context.cpp) is compiled as plain C++ with -DDFLASH_CUDA_EMU.
# Usage: tests/cuda/emu/run.sh kernels [linear|rmsnorm|elementwise|attention|loss|config]
#            kernel-level checks against the CPU ops (emu_tests.cpp)
#        tests/cuda/emu/run.sh gtest [gtest args]
#            tests/cuda/test_ops.cpp (the GPU test suite) with smaller shapes, on the emulated device
#   env: EMU_BUILD (default build-emu: a CPU-only build of dflash_core), JOBS (default 2),
#        DFLASH_EMU_ORDER=fwd|rev|rand (order in which the emulated threads of a block are resumed)
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${EMU_BUILD:-build-emu}
JOBS=${JOBS:-2}
what=${1:-kernels}
shift || true
[ -f "$B/CMakeCache.txt" ] || cmake -S . -B "$B" -DDFLASH_CUDA=OFF >/dev/null
cmake --build "$B" -j "$JOBS" --target dflash_core | grep -vE "^\[|Built target" || true
O="$B/emu"
mkdir -p "$O"
FLAGS="-std=c++20 -O1 -g -ffp-contract=off -DDFLASH_CUDA_EMU -DDFLASH_SOURCE_DIR=\"$PWD\" -Isrc -Itests -Itests/cuda/emu -Wall -Wno-unused-function -Wno-unknown-pragmas"
pids=()
compile() {  # compile SRC OBJ [extra flags]
  local f=$1 o=$2
  if [ ! -f "$o" ] || [ "$f" -nt "$o" ] || [ -n "$(find src/backend/cuda tests/cuda/emu src/backend/context.h -newer "$o" \( -name '*.h' -o -name '*.cuh' \))" ]; then
    g++ $FLAGS -x c++ -c "$f" -o "$o" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$JOBS" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
}
cu_objs=()
for f in src/backend/cuda/*.cu src/backend/cuda/context.cpp; do
  o="$O/$(basename "$f").o"
  cu_objs+=("$o")
  compile "$f" "$o"
done
LIBS="$B/libdflash_core.a -lopenblas -lpcre2-8 -lz -lcrypto -lpthread"
if [ "$what" = gtest ]; then
  compile tests/cuda/test_ops.cpp "$O/test_ops.o"
  for p in "${pids[@]}"; do wait "$p"; done
  g++ -o "$O/emu_test_ops" "${cu_objs[@]}" "$O/test_ops.o" $LIBS -lgtest -lgtest_main
  exec "$O/emu_test_ops" "$@"
else
  compile tests/cuda/emu/emu_tests.cpp "$O/emu_tests.o"
  for p in "${pids[@]}"; do wait "$p"; done
  g++ -o "$O/emu_tests" "${cu_objs[@]}" "$O/emu_tests.o" $LIBS
  exec "$O/emu_tests" "$@"
fi
