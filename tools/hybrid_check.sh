#!/usr/bin/env bash
# tools/hybrid_check.sh — issue 37 on the GPU machine (one H200), repo root, $OUT set (carry .deps when the image lacks
# PCRE2's dev files, tools/device_env.sh). Steps, in the order given (default: build test torch bench; each device
# call has 10 minutes, so run `build test` in one call and `torch bench` in the next on the same warm machine):
#   build  the CUDA build of dflash_cuda_tests, bench_hybrid and dflash (build-cuda);
#   test   the CUDA op table's hybrid cases and the hybrid goldens on CUDA (GTEST_FILTER, default
#          CudaOps.Hybrid*:CudaOps.AttentionCausal*:CudaOps.Elementwise:CudaOps.RmsNorm*:CudaTarget.*);
#   moe    the MoE op cases (CudaOps.MoE, MoeGroup, MoeGptOss: the grouped GEMMs; ~90 s on an H100, most of it the fp64
#          CPU reference of the widest cases);
#   all    the whole op table;
#   torch  transformers 5.17's hybrid prefill and gated delta rule (bench/torch_hybrid.py);
#   bench  bench/bench_hybrid (the chunked gated delta rule alone, then the dense and MoE prefills with capture);
# and prints the failed checks and RESULT lines last. Env: TORCH_IMPL (default grouped_mm), BENCH_ARGS, TORCH_ARGS.
set -u
T0=$(date +%s)
: "${OUT:?set OUT}"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
W=$(mktemp -d)
say() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
. tools/device_env.sh
STEPS=${*:-build test torch bench}
for step in $STEPS; do
  case $step in
    build)
      cmake -S . -B build-cuda -DDFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$W/configure.log" 2>&1 ||
        { say "configure FAILED"; tail -20 "$W/configure.log"; exit 1; }
      if ! cmake --build build-cuda -j 16 --target dflash_cuda_tests bench_hybrid dflash >"$W/build.log" 2>&1; then
        say "build FAILED"; grep -E "error" "$W/build.log" | head -30; cp "$W/build.log" "$OUT/"; exit 1
      fi
      say "built" ;;
    test)
      timeout 400 build-cuda/dflash_cuda_tests --gtest_filter="${GTEST_FILTER:-CudaOps.Hybrid*:CudaOps.AttentionCausal*:CudaOps.Elementwise:CudaOps.RmsNorm*:CudaTarget.*}" >"$OUT/cuda_hybrid.log" 2>&1
      say "dflash_cuda_tests (hybrid) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_hybrid.log" | tr '\n' ' ') $(grep -cE ' FAIL$' "$OUT/cuda_hybrid.log") failed checks"
      grep -hE " FAIL$|golden|gated_delta_rule|conv1d|rmsnorm_gated|rope partial|d256| 256" "$OUT/cuda_hybrid.log" | head -80 ;;
    moe)
      timeout 400 build-cuda/dflash_cuda_tests --gtest_filter='CudaOps.MoE:CudaOps.MoeGroup:CudaOps.MoeGptOss' >"$OUT/cuda_moe.log" 2>&1
      say "dflash_cuda_tests (moe) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_moe.log" | tr '\n' ' ') $(grep -cE ' FAIL$' "$OUT/cuda_moe.log") failed checks"
      grep -hE " FAIL$" "$OUT/cuda_moe.log" | head -20 ;;
    all)
      timeout 580 build-cuda/dflash_cuda_tests >"$OUT/cuda_all.log" 2>&1
      say "dflash_cuda_tests (all) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_all.log" | tr '\n' ' ')"
      grep -hE " FAIL$" "$OUT/cuda_all.log" | head -20 ;;
    torch)
      timeout -k 5 330 python3 bench/torch_hybrid.py --impl "${TORCH_IMPL:-grouped_mm}" ${TORCH_ARGS:-} >"$OUT/torch_hybrid.log" 2>&1
      say "torch_hybrid rc=$?"
      grep -hE "^# |^RESULT" "$OUT/torch_hybrid.log" ;;
    bench)
      timeout 260 build-cuda/bench_hybrid ${BENCH_ARGS:-} >"$OUT/bench_hybrid.log" 2>&1
      say "bench_hybrid rc=$?"
      grep -hE "^# |^RESULT" "$OUT/bench_hybrid.log" ;;
    *) say "unknown step $step (build test moe all torch bench)"; exit 2 ;;
  esac
done
say "done"
