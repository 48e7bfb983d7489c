#!/usr/bin/env bash
# tools/carry_build.sh — build the CUDA `dflash` here (no GPU needed: nvcc compiles sm_90a code) and pack it for a
# device call, so that the call spends its minutes running instead of building (the GPU machine's build of the
# dflash target takes ~76 s of device time; here, on 2 cores, ~6 min at no device time).
#
# Output: build-cudacarry/dflash.xz (stripped, xz -9: ~3 MB; the unpacked binary is ~22 MB, too big to carry beside
# the working tree's ~44 MB under the 64 MiB limit). Carry it with the call: carry [".deps", "build-cudacarry/dflash.xz"]
# and pass it as BIN to a script that takes one (bench/dpace_demo.sh unpacks it, checks that it starts there, and
# builds instead when it does not).
# Open MPI is left out of this build (-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON): one process per call needs none, and
# libmpi is not known to be on the GPU machine. The other shared libraries it needs: PCRE2 (carried in .deps, found
# through tools/device_env.sh), zlib, libcrypto 3, OpenBLAS, CUDA 13's cudart, cuBLASLt and NCCL; glibc >= 2.34.
#
# The GPU machine is a Hopper: the build has its code only (ARCHS=90a-real; both kernel tiers run from it, the portable
# one with DFLASH_KERNELS=portable); ARCHS="80-real;86-real;89-real;90a-real;89-virtual" builds CMake's default.
# Usage: bash tools/carry_build.sh        (here; env JOBS, default 2; ARCHS)
set -eu
cd "$(dirname "$0")/.."
B=build-cudacarry
cmake -S . -B "$B" -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
  -DDFLASH_CUDA_ARCHS="${ARCHS:-90a-real}" >/dev/null
cmake --build "$B" -j "${JOBS:-2}" --target dflash
strip -o "$B/dflash.stripped" "$B/dflash"
xz -9 -T "${JOBS:-2}" -c "$B/dflash.stripped" >"$B/dflash.xz.part"
mv "$B/dflash.xz.part" "$B/dflash.xz"
rm -f "$B/dflash.stripped"
echo "carry_build: $B/dflash.xz ($(du -h "$B/dflash.xz" | cut -f1)), built from $(git rev-parse --short HEAD)$(
  git diff --quiet HEAD -- src CMakeLists.txt || echo ' with uncommitted changes')"
echo "needs glibc $(objdump -T "$B/dflash" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | cut -d_ -f2) or newer"
