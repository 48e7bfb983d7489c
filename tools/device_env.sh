# tools/device_env.sh — sourced by the GPU-machine scripts (tools/device_check.sh, tools/tc_check.sh,
# tools/gen_check.sh, bench/run_all.sh) from the repository root. The GPU machine's image lacks PCRE2's development
# files: when pkg-config cannot find libpcre2-8, use the Debian ones carried in .deps/pcre2 (run with
# carry: [".deps"]; make them with `apt-get download libpcre2-dev libpcre2-8-0` and `dpkg -x` into .deps/pcre2).
if ! pkg-config --exists libpcre2-8 && [ -d .deps/pcre2 ]; then
  D=$PWD/.deps/pcre2/usr
  sed -i "s|^prefix=.*|prefix=$D|" "$D"/lib/x86_64-linux-gnu/pkgconfig/*.pc
  export PKG_CONFIG_PATH=$D/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$D/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The GPU machine is a Hopper (H100 / H200): its builds need only sm_90a code (docs/gpus.md; both kernel tiers run
# from it, the portable one with DFLASH_KERNELS=portable). Saves the other targets' compile time on device minutes.
export DFLASH_CUDA_ARCHS=${DFLASH_CUDA_ARCHS:-90a-real}
