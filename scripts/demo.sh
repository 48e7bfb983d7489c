#!/usr/bin/env bash
# The main job, from a fresh machine: installs the build's Debian packages if missing (scripts/setup.sh
# --no-oracles), builds dflash (if needed) and runs `dflash demo` on the bundled demo target.
# Usage: scripts/demo.sh [dflash demo options, e.g. --device cuda, --overwrite to run again over runs/demo]
#        env: BUILD_DIR (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-oracles
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target dflash
exec "$BUILD_DIR/dflash" demo "$@"
