#!/usr/bin/env bash
# The main job, from a fresh machine: installs the build's Debian packages if missing (scripts/setup.sh
# --no-oracles), builds dflash (if needed) and runs `dflash demo` on the bundled demo target.
# The CPU demo builds without the CUDA backend (in build-cpu/: compiling the CUDA kernels takes longer on 2 cores
# than the whole demo); with `--device cuda...` it builds the full tree in build/.
# Usage: scripts/demo.sh [dflash demo options, e.g. --device cuda, --overwrite to run again over runs/demo]
#        env: BUILD_DIR (default build-cpu, or build with --device cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-oracles
cuda=OFF prev=
for a in "$@"; do
  case "$prev:$a" in --device:cuda* | *:--device=cuda*) cuda=AUTO ;; esac
  prev=$a
done
if [ "$cuda" = OFF ]; then BUILD_DIR=${BUILD_DIR:-build-cpu}; else BUILD_DIR=${BUILD_DIR:-build}; fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDFLASH_CUDA=$cuda >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target dflash
exec "$BUILD_DIR/dflash" demo "$@"
